//! Deterministic simulation of several Replicators: simulated time, a network with random
//! latency and optional loss, two-way partitions, crashes and restarts, all from one seed.
//! Messages go through the wire encoding, as they would over TCP.
//!
//! Membership is given, not run: every node sees the same view (all Up, the lowest address
//! leading), and a test can change it — the Replicator's behaviour under partitions is what
//! is tested here; the cluster's own membership has its own simulation.

use crate::envelope::DataEnvelope;
use crate::replicator::{
    Command, Input, MembershipView, Output, Replicator, ReplicatorConfig, ReplicatorMessage,
    RequestId, Response, SubscriberId, Time,
};
use crate::value::ReplicatedValue;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::{Duration, Instant};
use tessera_cluster::{Address, MemberStatus, UniqueAddress};

/// A message on its way.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct InFlight {
    deliver_at: Duration,
    seq: u64,
    from: usize,
    to: usize,
    bytes: Vec<u8>,
}

struct SimNode {
    address: UniqueAddress,
    replicator: Option<Replicator>,
}

/// Settings of the simulated network.
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    pub latency_min: Duration,
    pub latency_max: Duration,
    /// Probability that a message is lost.
    pub drop_probability: f64,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            latency_min: Duration::from_millis(1),
            latency_max: Duration::from_millis(10),
            drop_probability: 0.0,
        }
    }
}

/// Several Replicators on a simulated network.
pub struct ReplicatorSim {
    nodes: Vec<SimNode>,
    config: ReplicatorConfig,
    network: NetworkConfig,
    in_flight: BinaryHeap<Reverse<InFlight>>,
    blocked: BTreeSet<(usize, usize)>,
    rng: SmallRng,
    base: Instant,
    elapsed: Duration,
    seq: u64,
    next_request: RequestId,
    replies: BTreeMap<(usize, RequestId), Response>,
    notifications: Vec<(usize, SubscriberId, String, Option<ReplicatedValue>)>,
    stored: BTreeMap<(usize, String), DataEnvelope>,
    view: MembershipView,
    messages_sent: u64,
}

/// Wall-clock milliseconds at the start of every simulation.
const WALL_START_MS: u64 = 1_700_000_000_000;

impl ReplicatorSim {
    /// `n` Replicators, all members Up, node 0 leading.
    pub fn new(n: usize, config: ReplicatorConfig, network: NetworkConfig, seed: u64) -> Self {
        let base = Instant::now();
        let mut rng = SmallRng::seed_from_u64(seed);
        let addresses: Vec<UniqueAddress> = (0..n)
            .map(|i| UniqueAddress::new(Address::new("10.0.0.1", 2000 + i as u16), i as u64 + 1))
            .collect();
        let nodes = addresses
            .iter()
            .map(|address| SimNode {
                address: address.clone(),
                replicator: Some(Replicator::new(
                    address.clone(),
                    config.clone(),
                    rng.random(),
                    base,
                )),
            })
            .collect();
        let view = MembershipView {
            members: addresses
                .iter()
                .map(|a| (a.clone(), MemberStatus::Up))
                .collect(),
            unreachable: BTreeSet::new(),
            leader: addresses.first().cloned(),
        };
        let mut sim = ReplicatorSim {
            nodes,
            config,
            network,
            in_flight: BinaryHeap::new(),
            blocked: BTreeSet::new(),
            rng,
            base,
            elapsed: Duration::ZERO,
            seq: 0,
            next_request: 1,
            replies: BTreeMap::new(),
            notifications: Vec::new(),
            stored: BTreeMap::new(),
            view: MembershipView::default(),
            messages_sent: 0,
        };
        sim.set_membership(view);
        sim
    }

    fn time(&self) -> Time {
        Time {
            now: self.base + self.elapsed,
            wall_ms: WALL_START_MS + self.elapsed.as_millis() as u64,
        }
    }

    /// Time since the start.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// The node's unique address.
    pub fn address(&self, node: usize) -> &UniqueAddress {
        &self.nodes[node].address
    }

    /// Messages sent so far.
    pub fn messages_sent(&self) -> u64 {
        self.messages_sent
    }

    /// Gives every live node a new membership view.
    pub fn set_membership(&mut self, view: MembershipView) {
        self.view = view.clone();
        for node in 0..self.nodes.len() {
            self.input(node, Input::Membership(view.clone()));
        }
    }

    /// The current membership view.
    pub fn membership(&self) -> &MembershipView {
        &self.view
    }

    /// Submits a local command to `node`; its reply appears in [`reply`](Self::reply).
    pub fn submit(&mut self, node: usize, command: Command) -> RequestId {
        let id = self.next_request;
        self.next_request += 1;
        self.input(node, Input::Command { id, command });
        id
    }

    /// The reply to a request, once there is one.
    pub fn reply(&self, node: usize, id: RequestId) -> Option<&Response> {
        self.replies.get(&(node, id))
    }

    /// Change notifications so far: (node, subscriber, key, value).
    pub fn notifications(&self) -> &[(usize, SubscriberId, String, Option<ReplicatedValue>)] {
        &self.notifications
    }

    /// What `node` wrote to its durable store for `key` last.
    pub fn stored(&self, node: usize, key: &str) -> Option<&DataEnvelope> {
        self.stored.get(&(node, key.to_string()))
    }

    /// The node's replica of `key`.
    pub fn envelope(&self, node: usize, key: &str) -> Option<&DataEnvelope> {
        self.nodes[node].replicator.as_ref()?.envelope(key)
    }

    /// The node's Replicator (`None` while crashed).
    pub fn replicator(&self, node: usize) -> Option<&Replicator> {
        self.nodes[node].replicator.as_ref()
    }

    /// Cuts every link between the two sides, both ways.
    pub fn partition(&mut self, side_a: &[usize], side_b: &[usize]) {
        for a in side_a {
            for b in side_b {
                self.blocked.insert((*a, *b));
                self.blocked.insert((*b, *a));
            }
        }
    }

    /// Restores every link.
    pub fn heal(&mut self) {
        self.blocked.clear();
    }

    /// Stops a node: its state is lost, messages to it vanish.
    pub fn crash(&mut self, node: usize) {
        self.nodes[node].replicator = None;
    }

    /// Starts a crashed node again with a new incarnation (uid), loading `durable` state.
    pub fn restart(&mut self, node: usize, durable: Vec<(String, DataEnvelope)>) {
        let old = self.nodes[node].address.clone();
        let address = UniqueAddress::new(old.address.clone(), old.uid + 1000);
        let mut replicator = Replicator::new(
            address.clone(),
            self.config.clone(),
            self.rng.random(),
            self.base + self.elapsed,
        );
        for (key, envelope) in durable {
            replicator.load(&key, envelope);
        }
        self.nodes[node] = SimNode {
            address: address.clone(),
            replicator: Some(replicator),
        };
        for (member, _) in &mut self.view.members {
            if member == &old {
                *member = address.clone();
            }
        }
        let view = self.view.clone();
        self.set_membership(view);
    }

    fn input(&mut self, node: usize, input: Input) {
        let time = self.time();
        let Some(replicator) = self.nodes[node].replicator.as_mut() else {
            return;
        };
        let outputs = replicator.handle(time, input);
        self.apply(node, outputs);
    }

    fn apply(&mut self, node: usize, outputs: Vec<Output>) {
        for output in outputs {
            match output {
                Output::Send { to, message } => self.transmit(node, &to, &message),
                Output::Reply { id, response } => {
                    self.replies.insert((node, id), response);
                }
                Output::Changed {
                    subscriber,
                    key,
                    value,
                } => self.notifications.push((node, subscriber, key, value)),
                Output::Store { key, envelope } => {
                    self.stored.insert((node, key), envelope);
                }
            }
        }
    }

    fn transmit(&mut self, from: usize, to: &Address, message: &ReplicatorMessage) {
        self.messages_sent += 1;
        let Some(to) = self.nodes.iter().position(|n| &n.address.address == to) else {
            return;
        };
        if self.blocked.contains(&(from, to)) {
            return;
        }
        if self.network.drop_probability > 0.0
            && self.rng.random_bool(self.network.drop_probability)
        {
            return;
        }
        let Ok(bytes) = message.encode() else {
            return;
        };
        let latency = self
            .rng
            .random_range(self.network.latency_min..=self.network.latency_max);
        self.seq += 1;
        self.in_flight.push(Reverse(InFlight {
            deliver_at: self.elapsed + latency,
            seq: self.seq,
            from,
            to,
            bytes,
        }));
    }

    /// Advances simulated time by `duration`, delivering messages and firing timers in order.
    pub fn run_for(&mut self, duration: Duration) {
        let end = self.elapsed + duration;
        self.run_until_time(end);
    }

    /// Runs until `done` holds (checked after every event) or `limit` passes; returns whether
    /// `done` held.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&Self) -> bool) -> bool {
        let end = self.elapsed + limit;
        while self.elapsed < end {
            if done(self) {
                return true;
            }
            let step_end = (self.elapsed + Duration::from_millis(10)).min(end);
            self.run_until_time(step_end);
        }
        done(self)
    }

    fn run_until_time(&mut self, end: Duration) {
        loop {
            let next_message = self.in_flight.peek().map(|Reverse(m)| m.deliver_at);
            let next_timer = self
                .nodes
                .iter()
                .enumerate()
                .filter_map(|(i, n)| {
                    n.replicator
                        .as_ref()
                        .map(|r| (r.next_timer() - self.base, i))
                })
                .min();
            let next = match (next_message, next_timer) {
                (Some(m), Some((t, _))) => m.min(t),
                (Some(m), None) => m,
                (None, Some((t, _))) => t,
                (None, None) => end,
            };
            if next > end {
                self.elapsed = end;
                return;
            }
            self.elapsed = self.elapsed.max(next);
            if next_message == Some(next) {
                if let Some(Reverse(message)) = self.in_flight.pop() {
                    self.deliver(message);
                }
            } else if let Some((_, node)) = next_timer {
                self.input(node, Input::Tick);
            }
        }
    }

    fn deliver(&mut self, message: InFlight) {
        if self.blocked.contains(&(message.from, message.to)) {
            return;
        }
        let from = self.nodes[message.from].address.clone();
        let Ok(decoded) = ReplicatorMessage::decode(&message.bytes) else {
            return;
        };
        self.input(
            message.to,
            Input::Message {
                from,
                message: decoded,
            },
        );
    }
}
