//! A deterministic simulation of sharding: the coordinator and a region per node over a
//! simulated network, with joins, graceful leaves, crashes, partitions and failing state
//! writes, driven by one seed. Time is simulated; nothing sleeps.
//!
//! The network keeps each link's order (as the transport does per peer and lane) and loses
//! messages only on a cut link or to a crashed node. The coordinator runs as a singleton on
//! the oldest member, starting on the next one only after its node was removed or left, and
//! keeps its state in one shared store whose writes land or not when their node crashes.
//!
//! Checks on every step ([`SimOutcome::violations`]):
//! - no shard is hosted by two live regions at once;
//! - a message is delivered only by a region running its shard, at most once, and the
//!   messages of one caller to one entity arrive in the order sent;
//! - at the end, after a quiet period: every message of a caller that survived was delivered
//!   unless it was on a node that crashed or crossed a cut link, nothing is lost to a
//!   graceful leave or a handoff, and no buffer holds anything.

use crate::coordinator::{CoordinatorOutput, MembershipView, ShardCoordinator};
use crate::messages::{BetweenRegions, ToCoordinator, ToRegion};
use crate::region::{Origin, RegionOutput, RegionView, ShardRegion};
use crate::settings::ShardingSettings;
use crate::shard_id::ShardId;
use crate::state::{CoordinatorState, RegionId};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};
use tessera_cluster::{Address, UniqueAddress};

/// What a simulated run does.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub initial_nodes: usize,
    pub joins: usize,
    pub leaves: usize,
    pub crashes: usize,
    pub partitions: usize,
    /// A node that routes but hosts nothing.
    pub proxy: bool,
    pub number_of_shards: u32,
    pub entities: u32,
    pub callers_per_node: usize,
    /// Probability that a coordinator state write fails (and is retried).
    pub write_failure_probability: f64,
    /// Faults and messages happen in the first `active_ms`; then a quiet period.
    pub active_ms: u64,
    pub quiet_ms: u64,
    pub sabotage: Sabotage,
    /// Print every event and output to stderr (for reading one failing seed).
    pub trace: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            initial_nodes: 3,
            joins: 1,
            leaves: 1,
            crashes: 1,
            partitions: 0,
            proxy: false,
            number_of_shards: 12,
            entities: 40,
            callers_per_node: 2,
            write_failure_probability: 0.0,
            active_ms: 12_000,
            quiet_ms: 30_000,
            sabotage: Sabotage::default(),
            trace: false,
        }
    }
}

/// Broken variants of the protocol, to show the checks catch them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sabotage {
    /// Regions acknowledge a handoff to the coordinator directly instead of through a marker
    /// behind their messages to the owner.
    pub acks_bypass_markers: bool,
    /// The owner reports a shard stopped as soon as it is told to stop, before its entities
    /// have stopped.
    pub stopped_before_stopping: bool,
}

/// A caller's message: the key checks order and loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SimMessage {
    pub caller: (usize, usize),
    pub entity: u32,
    pub seq: u64,
}

/// What a run found.
#[derive(Debug, Default)]
pub struct SimOutcome {
    pub violations: Vec<String>,
    pub sent: u64,
    pub delivered: u64,
    pub lost_to_crashes: u64,
    pub lost_to_cuts: u64,
    pub refused: u64,
    pub handoffs_completed: u64,
    pub coordinator_starts: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Joining,
    Up,
    Leaving,
    Removed,
}

#[derive(Clone, Debug)]
enum Net {
    ToCoordinator(ToCoordinator),
    ToRegion(ToRegion),
    Between(BetweenRegions<SimMessage>),
}

#[derive(Debug)]
enum Event {
    Deliver {
        from: usize,
        to: usize,
        message: Net,
    },
    Tick(usize),
    CallerSend {
        node: usize,
        caller: usize,
    },
    ShardStopped {
        node: usize,
        incarnation: u64,
        shard: ShardId,
    },
    WriteDone {
        node: usize,
        incarnation: u64,
        fails: bool,
    },
    StateLoaded {
        node: usize,
        incarnation: u64,
    },
    View {
        node: usize,
        members: Vec<(Status, i32, bool)>,
    },
    Join(usize),
    BecomeUp(usize),
    Leave(usize),
    Crash(usize),
    Remove(usize),
    Cut {
        a: usize,
        b: usize,
        until_ms: u64,
    },
}

struct Node {
    id: UniqueAddress,
    alive: bool,
    /// Incremented on every start, so events for an earlier life are ignored.
    incarnation: u64,
    hosts_shards: bool,
    region: ShardRegion<SimMessage>,
    coordinator: Option<ShardCoordinator>,
    coordinator_incarnation: u64,
    /// This node's view: per node (status, up number, crashed-as-seen).
    view: Vec<(Status, i32, bool)>,
    callers_stopped: bool,
    next_seq: HashMap<(usize, u32), u64>,
    /// Shards this node's entity host runs, as the region's outputs told it (`true`: told
    /// to stop, not stopped yet): deliveries are checked against it in output order.
    running: BTreeMap<ShardId, bool>,
}

struct Sim {
    config: SimConfig,
    settings: ShardingSettings,
    rng: SmallRng,
    start: Instant,
    now_ms: u64,
    events: BTreeMap<(u64, u64), Event>,
    next_event: u64,
    nodes: Vec<Node>,
    /// The global truth: status, up number, crashed.
    status: Vec<(Status, i32, bool)>,
    next_up_number: i32,
    link_clock: HashMap<(usize, usize), u64>,
    cuts: HashMap<(usize, usize), u64>,
    store: CoordinatorState,
    /// Write in flight: (node, incarnation, events, lands even if its node crashes).
    write_in_flight: Option<(usize, u64, Vec<crate::state::StateEvent>, bool)>,
    coordinator_host: Option<usize>,
    /// Where each undelivered message is: the node it is at or travelling to.
    whereabouts: HashMap<SimMessage, usize>,
    delivered: HashMap<(usize, usize, u32), u64>,
    delivered_set: BTreeSet<(usize, usize, u32, u64)>,
    lost: BTreeSet<SimMessage>,
    outcome: SimOutcome,
}

fn node_id(index: usize) -> UniqueAddress {
    UniqueAddress {
        address: Address::new("10.0.0.1", 20_000 + index as u16),
        uid: index as u64 + 1,
    }
}

/// Runs one seed.
pub fn run(config: SimConfig, seed: u64) -> SimOutcome {
    let settings = ShardingSettings {
        number_of_shards: config.number_of_shards,
        shard_ids: crate::shard_id::ShardIds::Hashed,
        rebalance_interval: Duration::from_millis(1_000),
        rebalance_absolute_limit: 3,
        rebalance_relative_limit: 0.5,
        handoff_timeout: Duration::from_millis(3_000),
        retry_interval: Duration::from_millis(200),
        shard_start_timeout: Duration::from_millis(500),
        buffer_size: 100_000,
        coordinator_stash_capacity: 100_000,
        update_retry_interval: Duration::from_millis(100),
    };
    let mut sim = Sim {
        config: config.clone(),
        settings,
        rng: SmallRng::seed_from_u64(seed),
        start: Instant::now(),
        now_ms: 0,
        events: BTreeMap::new(),
        next_event: 0,
        nodes: Vec::new(),
        status: Vec::new(),
        next_up_number: 1,
        link_clock: HashMap::new(),
        cuts: HashMap::new(),
        store: CoordinatorState::new(false),
        write_in_flight: None,
        coordinator_host: None,
        whereabouts: HashMap::new(),
        delivered: HashMap::new(),
        delivered_set: BTreeSet::new(),
        lost: BTreeSet::new(),
        outcome: SimOutcome::default(),
    };
    sim.plan();
    sim.run_to_end();
    sim.final_checks();
    sim.outcome
}

impl Sim {
    fn at(&mut self, delay_ms: u64, event: Event) {
        self.next_event += 1;
        self.events
            .insert((self.now_ms + delay_ms, self.next_event), event);
    }

    fn now(&self) -> Instant {
        self.start + Duration::from_millis(self.now_ms)
    }

    fn violation(&mut self, text: String) {
        if self.outcome.violations.len() < 20 {
            self.outcome
                .violations
                .push(format!("t={}ms: {text}", self.now_ms));
        }
    }

    fn add_node(&mut self, hosts_shards: bool) -> usize {
        let index = self.nodes.len();
        let id = node_id(index);
        self.nodes.push(Node {
            region: ShardRegion::new(self.settings.clone(), id.clone(), hosts_shards),
            id,
            alive: true,
            incarnation: 1,
            hosts_shards,
            coordinator: None,
            coordinator_incarnation: 0,
            view: Vec::new(),
            callers_stopped: false,
            next_seq: HashMap::new(),
            running: BTreeMap::new(),
        });
        self.status.push((Status::Joining, i32::MAX, false));
        index
    }

    fn plan(&mut self) {
        for _ in 0..self.config.initial_nodes {
            let node = self.add_node(true);
            self.status[node] = (Status::Up, self.next_up_number, false);
            self.next_up_number += 1;
        }
        if self.config.proxy {
            let node = self.add_node(false);
            self.status[node] = (Status::Up, self.next_up_number, false);
            self.next_up_number += 1;
        }
        for node in 0..self.nodes.len() {
            self.start_node_timers(node);
        }
        self.publish_membership();
        let active = self.config.active_ms;
        let window =
            |rng: &mut SmallRng| rng.random_range(1_000..active.saturating_sub(2_000).max(1_001));
        for _ in 0..self.config.joins {
            let at = window(&mut self.rng);
            let node = self.add_node(true);
            self.nodes[node].alive = false;
            self.status[node] = (Status::Removed, i32::MAX, false);
            self.at(at, Event::Join(node));
        }
        for _ in 0..self.config.leaves {
            let at = window(&mut self.rng);
            let node = self.rng.random_range(0..self.config.initial_nodes);
            self.at(at, Event::Leave(node));
        }
        for _ in 0..self.config.crashes {
            let at = window(&mut self.rng);
            let node = self.rng.random_range(0..self.config.initial_nodes);
            self.at(at, Event::Crash(node));
        }
        for _ in 0..self.config.partitions {
            let at = window(&mut self.rng);
            let total = self.nodes.len();
            let a = self.rng.random_range(0..total);
            let b = (a + self.rng.random_range(1..total)) % total;
            let until_ms = at + self.rng.random_range(300..3_000);
            self.at(at, Event::Cut { a, b, until_ms });
        }
    }

    fn start_node_timers(&mut self, node: usize) {
        let first = self.rng.random_range(0..50);
        self.at(first, Event::Tick(node));
        for caller in 0..self.config.callers_per_node {
            let first = self.rng.random_range(0..100);
            self.at(first, Event::CallerSend { node, caller });
        }
    }

    fn run_to_end(&mut self) {
        let end = self.config.active_ms + self.config.quiet_ms;
        while let Some(((time, _), event)) = self.events.pop_first() {
            if time > end {
                break;
            }
            self.now_ms = time;
            if self.config.trace && !matches!(event, Event::Tick(_)) {
                eprintln!("{time:>6} {event:?}");
            }
            self.handle(event);
            self.check_single_hosting();
        }
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Tick(node) => {
                if !self.nodes[node].alive {
                    return;
                }
                let now = self.now();
                let out = self.nodes[node].region.tick(now);
                self.region_outputs(node, out);
                if let Some(coordinator) = self.nodes[node].coordinator.as_mut() {
                    let out = coordinator.tick(now);
                    self.coordinator_outputs(node, out);
                }
                self.at(50, Event::Tick(node));
            }
            Event::CallerSend { node, caller } => {
                if !self.nodes[node].alive
                    || self.nodes[node].callers_stopped
                    || self.now_ms > self.config.active_ms
                {
                    return;
                }
                let entity = self.rng.random_range(0..self.config.entities);
                let seq = {
                    let next = self.nodes[node]
                        .next_seq
                        .entry((caller, entity))
                        .or_insert(0);
                    *next += 1;
                    *next
                };
                let message = SimMessage {
                    caller: (node, caller),
                    entity,
                    seq,
                };
                self.outcome.sent += 1;
                self.whereabouts.insert(message, node);
                let shard = ShardId(entity % self.config.number_of_shards);
                let now = self.now();
                let out = self.nodes[node]
                    .region
                    .deliver(Origin::Local, shard, message, now);
                self.region_outputs(node, out);
                let next = self.rng.random_range(20..100);
                self.at(next, Event::CallerSend { node, caller });
            }
            Event::Deliver { from, to, message } => self.deliver(from, to, message),
            Event::ShardStopped {
                node,
                incarnation,
                shard,
            } => {
                if !self.nodes[node].alive || self.nodes[node].incarnation != incarnation {
                    return;
                }
                self.nodes[node].running.remove(&shard);
                let now = self.now();
                let out = self.nodes[node].region.shard_stopped(shard, now);
                self.region_outputs(node, out);
            }
            Event::WriteDone {
                node,
                incarnation,
                fails,
            } => self.write_done(node, incarnation, fails),
            Event::StateLoaded { node, incarnation } => {
                if self.nodes[node].coordinator_incarnation != incarnation {
                    return;
                }
                let state = self.store.clone();
                let now = self.now();
                let view = self.coordinator_view(node);
                if let Some(coordinator) = self.nodes[node].coordinator.as_mut() {
                    let mut out = coordinator.membership(view, now);
                    out.extend(coordinator.state_loaded(state, now));
                    self.coordinator_outputs(node, out);
                }
            }
            Event::View { node, members } => {
                if !self.nodes[node].alive {
                    return;
                }
                self.nodes[node].view = members;
                self.place_coordinator(node);
                let now = self.now();
                let view = self.region_view(node);
                let out = self.nodes[node].region.membership(view, now);
                self.region_outputs(node, out);
                let coordinator_view = self.coordinator_view(node);
                if let Some(coordinator) = self.nodes[node].coordinator.as_mut() {
                    let out = coordinator.membership(coordinator_view, now);
                    self.coordinator_outputs(node, out);
                }
            }
            Event::Join(node) => {
                self.nodes[node].alive = true;
                self.status[node] = (Status::Joining, i32::MAX, false);
                self.start_node_timers(node);
                self.publish_membership();
                let delay = self.rng.random_range(200..800);
                self.at(delay, Event::BecomeUp(node));
            }
            Event::BecomeUp(node) => {
                if self.status[node].0 == Status::Joining {
                    self.status[node] = (Status::Up, self.next_up_number, self.status[node].2);
                    self.next_up_number += 1;
                    self.publish_membership();
                }
            }
            Event::Leave(node) => {
                if !self.can_lose_a_node(node) {
                    return;
                }
                self.nodes[node].callers_stopped = true;
                let now = self.now();
                let out = self.nodes[node].region.begin_shutdown(now);
                self.region_outputs(node, out);
            }
            Event::Crash(node) => {
                if !self.can_lose_a_node(node) {
                    return;
                }
                self.crash(node);
            }
            Event::Remove(node) => {
                self.status[node].0 = Status::Removed;
                self.nodes[node].alive = false;
                self.nodes[node].coordinator = None;
                self.publish_membership();
            }
            Event::Cut { a, b, until_ms } => {
                self.cuts.insert((a, b), until_ms);
                self.cuts.insert((b, a), until_ms);
            }
        }
    }

    /// Losing `node` leaves at least two Up members that host shards and it is not going
    /// already.
    fn can_lose_a_node(&self, node: usize) -> bool {
        if !self.nodes[node].alive
            || self.status[node].0 != Status::Up
            || self.nodes[node].callers_stopped
        {
            return false;
        }
        let others = (0..self.nodes.len())
            .filter(|n| {
                *n != node
                    && self.nodes[*n].alive
                    && self.nodes[*n].hosts_shards
                    && self.status[*n].0 == Status::Up
                    && !self.nodes[*n].callers_stopped
            })
            .count();
        others >= 2
    }

    fn crash(&mut self, node: usize) {
        self.nodes[node].alive = false;
        self.nodes[node].coordinator = None;
        self.nodes[node].running.clear();
        self.status[node].2 = true;
        if let Some((writer, _, _, lands)) = &self.write_in_flight
            && *writer == node
            && !*lands
        {
            self.write_in_flight = None;
        }
        let here: Vec<SimMessage> = self
            .whereabouts
            .iter()
            .filter(|(_, at)| **at == node)
            .map(|(m, _)| *m)
            .collect();
        for message in here {
            self.whereabouts.remove(&message);
            self.lost.insert(message);
            self.outcome.lost_to_crashes += 1;
        }
        self.publish_membership();
        let delay = self.rng.random_range(1_000..3_000);
        self.at(delay, Event::Remove(node));
    }

    /// Sends every live node its next view, each after its own delay (in order per node),
    /// and moves the coordinator if the singleton's rule says so.
    fn publish_membership(&mut self) {
        for node in 0..self.nodes.len() {
            if !self.nodes[node].alive {
                continue;
            }
            let delay = self.rng.random_range(0..300);
            let at = self.link_time(usize::MAX, node, delay);
            self.next_event += 1;
            self.events.insert(
                (at, self.next_event),
                Event::View {
                    node,
                    members: self.status.clone(),
                },
            );
        }
    }

    /// The singleton, as node `node` sees it after a view change: it starts the coordinator
    /// when its view makes it the oldest member (Up or Leaving, hosting shards) and shows the
    /// previous host removed.
    fn place_coordinator(&mut self, node: usize) {
        if self.coordinator_host == Some(node) || !self.nodes[node].alive {
            return;
        }
        let view = &self.nodes[node].view;
        if let Some(previous) = self.coordinator_host
            && view
                .get(previous)
                .is_none_or(|(status, _, _)| *status != Status::Removed)
        {
            return;
        }
        let oldest = view
            .iter()
            .enumerate()
            .filter(|(n, (status, _, _))| {
                self.nodes[*n].hosts_shards && matches!(status, Status::Up | Status::Leaving)
            })
            .min_by_key(|(_, (_, up, _))| *up)
            .map(|(n, _)| n);
        if oldest != Some(node) {
            return;
        }
        self.coordinator_host = Some(node);
        self.outcome.coordinator_starts += 1;
        let incarnation = self.nodes[node].coordinator_incarnation + 1;
        self.nodes[node].coordinator_incarnation = incarnation;
        let nonce = self.rng.random();
        self.nodes[node].coordinator = Some(ShardCoordinator::new(self.settings.clone(), nonce));
        let delay = self.rng.random_range(5..50);
        self.at(delay, Event::StateLoaded { node, incarnation });
    }

    fn region_view(&self, node: usize) -> RegionView {
        let view = &self.nodes[node].view;
        let members = view
            .iter()
            .enumerate()
            .filter(|(_, (status, _, _))| *status != Status::Removed)
            .map(|(n, _)| node_id(n))
            .collect();
        let coordinator = view
            .iter()
            .enumerate()
            .filter(|(n, (status, _, _))| {
                self.nodes[*n].hosts_shards && matches!(status, Status::Up | Status::Leaving)
            })
            .min_by_key(|(_, (_, up, _))| *up)
            .map(|(n, _)| node_id(n));
        RegionView {
            members,
            coordinator,
            // The simulated membership gives a region its shards only once its own node
            // is Up in the coordinator's view; the gossip lag behind that is not modelled.
            self_joining: false,
        }
    }

    fn coordinator_view(&self, node: usize) -> MembershipView {
        let view = &self.nodes[node].view;
        let live = |s: &Status| *s != Status::Removed;
        MembershipView {
            members: view
                .iter()
                .enumerate()
                .filter(|(_, (s, _, _))| live(s))
                .map(|(n, _)| node_id(n))
                .collect(),
            up: view
                .iter()
                .enumerate()
                .filter(|(_, (s, _, _))| *s == Status::Up)
                .map(|(n, _)| node_id(n))
                .collect(),
            stable: view
                .iter()
                .all(|(s, _, crashed)| !live(s) || (*s == Status::Up && !crashed)),
        }
    }

    /// Delivery time on the link `from → to`, never before an earlier message of that link.
    fn link_time(&mut self, from: usize, to: usize, delay_ms: u64) -> u64 {
        let clock = self.link_clock.entry((from, to)).or_insert(0);
        let at = (self.now_ms + delay_ms).max(*clock);
        *clock = at;
        at
    }

    fn send(&mut self, from: usize, to: usize, message: Net) {
        if let Net::Between(BetweenRegions::Forward { message: m, .. }) = &message {
            self.whereabouts.insert(*m, to);
        }
        // Now and then a link stalls (a retransmission), holding back what follows on it.
        let delay = if self.rng.random_bool(0.05) {
            self.rng.random_range(50..400)
        } else {
            self.rng.random_range(1..20)
        };
        let at = self.link_time(from, to, delay);
        self.next_event += 1;
        self.events
            .insert((at, self.next_event), Event::Deliver { from, to, message });
    }

    fn index_of(&self, id: &RegionId) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == *id)
    }

    fn deliver(&mut self, from: usize, to: usize, message: Net) {
        let cut = self
            .cuts
            .get(&(from, to))
            .is_some_and(|until| self.now_ms < *until);
        if cut || !self.nodes[to].alive {
            if let Net::Between(BetweenRegions::Forward { message: m, .. }) = &message
                && self.whereabouts.remove(m).is_some()
            {
                self.lost.insert(*m);
                if cut {
                    self.outcome.lost_to_cuts += 1;
                } else {
                    self.outcome.lost_to_crashes += 1;
                }
            }
            return;
        }
        let now = self.now();
        let from_id = self.nodes[from].id.clone();
        match message {
            Net::ToCoordinator(message) => {
                if let Some(coordinator) = self.nodes[to].coordinator.as_mut() {
                    let out = coordinator.receive(from_id, message, now);
                    self.coordinator_outputs(to, out);
                }
            }
            Net::ToRegion(message) => {
                let out = self.nodes[to]
                    .region
                    .from_coordinator(&from_id, message, now);
                self.region_outputs(to, out);
            }
            Net::Between(BetweenRegions::Forward { shard, message }) => {
                let out =
                    self.nodes[to]
                        .region
                        .deliver(Origin::Region(from_id), shard, message, now);
                self.region_outputs(to, out);
            }
            Net::Between(BetweenRegions::HandOffMarker { shard, handoff }) => {
                let out = self.nodes[to].region.marker(from_id, shard, handoff);
                self.region_outputs(to, out);
            }
        }
    }

    fn coordinator_node_for(&self, node: usize) -> Option<usize> {
        self.region_view(node)
            .coordinator
            .and_then(|id| self.index_of(&id))
    }

    fn region_outputs(&mut self, node: usize, outputs: Vec<RegionOutput<SimMessage>>) {
        for output in outputs {
            if self.config.trace {
                eprintln!("{:>6}   region {node} -> {output:?}", self.now_ms);
            }
            match output {
                RegionOutput::ToCoordinator(message) => {
                    if let Some(to) = self.coordinator_node_for(node) {
                        self.send(node, to, Net::ToCoordinator(message));
                    }
                }
                RegionOutput::ToRegion { to, message } => {
                    let Some(to) = self.index_of(&to) else {
                        continue;
                    };
                    if self.config.sabotage.acks_bypass_markers
                        && let BetweenRegions::HandOffMarker { shard, handoff } = &message
                    {
                        // Broken: the acknowledgement overtakes the messages on the link.
                        let ack = ToCoordinator::BeginHandOffAck {
                            shard: *shard,
                            region: self.nodes[node].id.clone(),
                            handoff: *handoff,
                        };
                        if let Some(coordinator) = self.coordinator_node_for(to) {
                            let now = self.now();
                            let owner = self.nodes[to].id.clone();
                            if let Some(c) = self.nodes[coordinator].coordinator.as_mut() {
                                let out = c.receive(owner, ack, now);
                                self.coordinator_outputs(coordinator, out);
                            }
                        }
                        continue;
                    }
                    self.send(node, to, Net::Between(message));
                }
                RegionOutput::DeliverLocal { shard, message } => {
                    self.record_delivery(node, shard, message);
                }
                RegionOutput::StartShard(shard) => {
                    if self.nodes[node].running.insert(shard, false).is_some() {
                        self.violation(format!(
                            "node {node} starts shard {shard}, which runs or stops there"
                        ));
                    }
                }
                RegionOutput::StopShard(shard) => {
                    let incarnation = self.nodes[node].incarnation;
                    if self.nodes[node].running.insert(shard, true) != Some(false) {
                        self.violation(format!(
                            "node {node} stops shard {shard}, which does not run there"
                        ));
                    }
                    let delay = self.rng.random_range(0..60);
                    self.at(
                        delay,
                        Event::ShardStopped {
                            node,
                            incarnation,
                            shard,
                        },
                    );
                }
                RegionOutput::Refused { message, .. } => {
                    self.whereabouts.remove(&message);
                    self.outcome.refused += 1;
                }
                RegionOutput::ShutdownComplete => {
                    self.status[node].0 = Status::Leaving;
                    self.publish_membership();
                    let delay = self.rng.random_range(200..600);
                    self.at(delay, Event::Remove(node));
                }
            }
        }
    }

    fn coordinator_outputs(&mut self, node: usize, outputs: Vec<CoordinatorOutput>) {
        for output in outputs {
            if self.config.trace {
                eprintln!("{:>6}   coordinator {node} -> {output:?}", self.now_ms);
            }
            match output {
                CoordinatorOutput::Send { to, message } => {
                    let Some(to) = self.index_of(&to) else {
                        continue;
                    };
                    if self.config.sabotage.stopped_before_stopping
                        && let ToRegion::HandOff { shard, handoff } = &message
                    {
                        // Broken: the owner's answer comes before its entities stopped.
                        let stopped = ToCoordinator::ShardStopped {
                            shard: *shard,
                            handoff: *handoff,
                        };
                        self.send(to, node, Net::ToCoordinator(stopped));
                    }
                    self.send(node, to, Net::ToRegion(message));
                }
                CoordinatorOutput::Write(events) => {
                    let incarnation = self.nodes[node].coordinator_incarnation;
                    let fails = self.rng.random_bool(self.config.write_failure_probability);
                    let lands = self.rng.random_bool(0.5);
                    self.write_in_flight = Some((node, incarnation, events, lands));
                    let delay = self.rng.random_range(1..30);
                    self.at(
                        delay,
                        Event::WriteDone {
                            node,
                            incarnation,
                            fails,
                        },
                    );
                }
                CoordinatorOutput::Stop { .. } => {
                    self.nodes[node].coordinator = None;
                }
            }
        }
    }

    fn write_done(&mut self, node: usize, incarnation: u64, fails: bool) {
        let Some((writer, writer_incarnation, events, _)) = self.write_in_flight.take() else {
            return;
        };
        if writer != node || writer_incarnation != incarnation {
            self.write_in_flight = Some((writer, writer_incarnation, events, false));
            return;
        }
        let now = self.now();
        if fails {
            if let Some(coordinator) = self.nodes[node].coordinator.as_mut() {
                let failures = coordinator.stats().write_failures;
                let out = coordinator.write_failed(false, "simulated failure", now);
                // The failure the driver reports for the write in flight is counted (metrics).
                let counted = coordinator.stats().write_failures == failures + 1;
                self.coordinator_outputs(node, out);
                if !counted {
                    self.violation("a failed state write was not counted".to_string());
                }
            }
            return;
        }
        // A batch is atomic: check it whole before storing any of it.
        let mut stored = self.store.clone();
        for event in &events {
            if stored.apply(event).is_err() {
                self.violation(format!("the store refused {event:?}"));
                return;
            }
        }
        self.store = stored;
        if self.nodes[node].alive
            && self.nodes[node].coordinator_incarnation == incarnation
            && let Some(coordinator) = self.nodes[node].coordinator.as_mut()
        {
            let out = coordinator.write_done(now);
            self.coordinator_outputs(node, out);
        }
    }

    fn record_delivery(&mut self, node: usize, shard: ShardId, message: SimMessage) {
        if self.nodes[node].running.get(&shard) != Some(&false) {
            self.violation(format!(
                "node {node} delivered {message:?} for shard {shard} it does not run"
            ));
        }
        self.whereabouts.remove(&message);
        self.outcome.delivered += 1;
        let key = (message.caller.0, message.caller.1, message.entity);
        if !self
            .delivered_set
            .insert((key.0, key.1, key.2, message.seq))
        {
            self.violation(format!("{message:?} delivered twice"));
        }
        let last = self.delivered.entry(key).or_insert(0);
        if message.seq <= *last {
            let last = *last;
            self.violation(format!(
                "{message:?} delivered on node {node} after seq {last}: out of order"
            ));
        } else {
            *last = message.seq;
        }
    }

    fn check_single_hosting(&mut self) {
        let mut hosts: BTreeMap<ShardId, Vec<usize>> = BTreeMap::new();
        for (index, node) in self.nodes.iter().enumerate() {
            if !node.alive {
                continue;
            }
            let shards: BTreeSet<&ShardId> = node
                .region
                .local_shards()
                .chain(node.running.keys())
                .collect();
            for shard in shards {
                hosts.entry(*shard).or_default().push(index);
            }
        }
        let doubles: Vec<String> = hosts
            .iter()
            .filter(|(_, nodes)| nodes.len() > 1)
            .map(|(shard, nodes)| format!("shard {shard} hosted by live nodes {nodes:?}"))
            .collect();
        for double in doubles {
            self.violation(double);
        }
    }

    fn final_checks(&mut self) {
        for index in 0..self.nodes.len() {
            let node = &self.nodes[index];
            if node.alive && node.region.buffered() > 0 {
                let buffered = node.region.buffered();
                self.violation(format!(
                    "node {index} still buffers {buffered} messages after the quiet period"
                ));
            }
        }
        let crashed: BTreeSet<usize> = (0..self.nodes.len())
            .filter(|n| self.status[*n].2)
            .collect();
        let mut missing = Vec::new();
        for (index, node) in self.nodes.iter().enumerate() {
            if crashed.contains(&index) {
                continue;
            }
            for (&(caller, entity), &last) in &node.next_seq {
                for seq in 1..=last {
                    let message = SimMessage {
                        caller: (index, caller),
                        entity,
                        seq,
                    };
                    if !self.delivered_set.contains(&(index, caller, entity, seq))
                        && !self.lost.contains(&message)
                    {
                        missing.push(message);
                    }
                }
            }
        }
        if !missing.is_empty() {
            let count = missing.len();
            let first = missing[0];
            self.violation(format!(
                "{count} messages of surviving callers neither delivered nor lost with a \
                 crashed node or a cut link, e.g. {first:?}"
            ));
        }
        // The cluster is stable now: a coordinator runs with its state, every shard in it has
        // a live home, and each shard a live region hosts is allocated to that region there.
        let state = self
            .coordinator_host
            .and_then(|host| self.nodes[host].coordinator.as_ref())
            .and_then(ShardCoordinator::state)
            .cloned();
        match state {
            None => self.violation(
                "no running coordinator with its state once the cluster is stable".into(),
            ),
            Some(state) => {
                let live: BTreeSet<&UniqueAddress> = self
                    .nodes
                    .iter()
                    .filter(|node| node.alive)
                    .map(|node| &node.id)
                    .collect();
                let homeless: Vec<ShardId> = state
                    .shards()
                    .iter()
                    .filter(|(_, home)| !live.contains(home))
                    .map(|(shard, _)| *shard)
                    .collect();
                let mut misplaced = Vec::new();
                for node in self.nodes.iter().filter(|node| node.alive) {
                    for shard in node.region.local_shards() {
                        if state.shards().get(shard) != Some(&node.id) {
                            misplaced.push((*shard, node.id.address.port));
                        }
                    }
                }
                if !homeless.is_empty() || !misplaced.is_empty() {
                    self.violation(format!(
                        "once the cluster is stable, shards allocated to a region that is gone: \
                         {homeless:?}; shards a live region hosts that the coordinator's state \
                         does not give it (shard, port): {misplaced:?}"
                    ));
                }
            }
        }
        if let Some(host) = self.coordinator_host
            && let Some(coordinator) = self.nodes[host].coordinator.as_ref()
        {
            self.outcome.handoffs_completed = coordinator.stats().handoffs_completed;
        }
    }
}
