//! Deterministic simulation of several Replicators: simulated time, a network with random
//! latency and optional loss, two-way partitions, crashes and restarts, and a disk per node
//! whose durable writes take time and may fail, all from one seed. Messages go through the
//! wire encoding, as they would over TCP.
//!
//! The disk commits as the driver does: writes that arrive while a commit syncs go together in
//! the next one, and each commit is reported back to its Replicator when it ends. The
//! simulation checks every acknowledgement of a durable key when it is released — a replica's
//! `WriteAck` and a local update's or delete's success — against what the disk holds: an
//! acknowledgement whose state is not on disk is recorded as a violation
//! ([`ReplicatorSim::acknowledgement_violations`]).
//!
//! Membership is given, not run: every node sees the same view (all Up, the lowest address
//! leading), and a test can change it — the Replicator's behaviour under partitions is what
//! is tested here; the cluster's own membership has its own simulation.

use crate::envelope::DataEnvelope;
use crate::replicator::{
    Command, DeleteResult, DurableWriteId, Input, MembershipView, Output, Replicator,
    ReplicatorConfig, ReplicatorMessage, RequestId, Response, SubscriberId, Time, UpdateResult,
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
    disk: SimDisk,
}

/// How a node's disk behaves: each commit takes a latency from the range and fails with a
/// probability (then none of its writes is stored).
#[derive(Debug, Clone)]
pub struct DiskConfig {
    pub latency_min: Duration,
    pub latency_max: Duration,
    pub failure_probability: f64,
}

impl Default for DiskConfig {
    fn default() -> Self {
        DiskConfig {
            latency_min: Duration::from_millis(1),
            latency_max: Duration::from_millis(5),
            failure_probability: 0.0,
        }
    }
}

/// One durable write on its way to a simulated disk.
struct DiskWrite {
    write: DurableWriteId,
    key: String,
    envelope: DataEnvelope,
}

/// A node's disk: the commit syncing now and the writes waiting for the next one.
#[derive(Default)]
struct SimDisk {
    config: DiskConfig,
    queued: Vec<DiskWrite>,
    /// The commit in progress and when it ends.
    committing: Option<(Duration, Vec<DiskWrite>)>,
    /// The number of writes of every commit that ended, in order.
    commit_sizes: Vec<usize>,
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
    /// `Write`s of durable keys delivered to a replica and not yet acknowledged by it:
    /// (replica, requester, op, incarnation) → the state the acknowledgement claims stored.
    durable_write_requests: BTreeMap<(usize, usize, u64, u64), (String, DataEnvelope)>,
    /// Local updates and deletes of durable keys without a reply yet: (node, request) → the
    /// state their success claims stored.
    durable_updates: BTreeMap<(usize, RequestId), (String, DataEnvelope)>,
    acknowledgements_checked: u64,
    acknowledgement_violations: Vec<String>,
    failed_durable_writes: u64,
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
                disk: SimDisk::default(),
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
            durable_write_requests: BTreeMap::new(),
            durable_updates: BTreeMap::new(),
            acknowledgements_checked: 0,
            acknowledgement_violations: Vec::new(),
            failed_durable_writes: 0,
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
        let durable_key = match &command {
            Command::Update { key, .. } | Command::Delete { key, .. }
                if self.config.is_durable(key) =>
            {
                Some(key.clone())
            }
            _ => None,
        };
        let time = self.time();
        let Some(replicator) = self.nodes[node].replicator.as_mut() else {
            return id;
        };
        let outputs = replicator.handle(time, Input::Command { id, command });
        // What a success of this request will claim is on disk: the state the step wrote.
        if let Some(key) = durable_key {
            let written = outputs.iter().find_map(|output| match output {
                Output::Store {
                    key: stored,
                    envelope,
                    ..
                } if *stored == key => Some(envelope.clone()),
                _ => None,
            });
            if let Some(envelope) = written.or_else(|| replicator.envelope(&key).cloned()) {
                self.durable_updates.insert((node, id), (key, envelope));
            }
        }
        self.apply(node, outputs);
        id
    }

    /// Sets how `node`'s disk behaves from now on (commits already started keep their end).
    pub fn set_disk(&mut self, node: usize, disk: DiskConfig) {
        self.nodes[node].disk.config = disk;
    }

    /// The number of writes of each commit of `node`'s disk that ended, in order.
    pub fn commit_sizes(&self, node: usize) -> &[usize] {
        &self.nodes[node].disk.commit_sizes
    }

    /// Durable writes lost to a failed commit, on every node.
    pub fn failed_durable_writes(&self) -> u64 {
        self.failed_durable_writes
    }

    /// Acknowledgements of durable keys released so far (each checked against the disk).
    pub fn acknowledgements_checked(&self) -> u64 {
        self.acknowledgements_checked
    }

    /// Every acknowledgement of a durable key released before its state was on disk.
    pub fn acknowledgement_violations(&self) -> &[String] {
        &self.acknowledgement_violations
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

    /// Stops a node: its state is lost, messages to it vanish, and so do the durable writes
    /// its disk had not finished.
    pub fn crash(&mut self, node: usize) {
        let crashed = &mut self.nodes[node];
        crashed.replicator = None;
        crashed.disk.queued.clear();
        crashed.disk.committing = None;
        // Its pending acknowledgements died with it.
        self.durable_write_requests
            .retain(|(replica, ..), _| *replica != node);
        self.durable_updates.retain(|(at, _), _| *at != node);
    }

    /// Starts a crashed node again with a new incarnation (uid), loading `durable` state.
    pub fn restart(&mut self, node: usize, durable: Vec<(String, DataEnvelope)>) {
        self.restart_with(node, self.config.clone(), durable);
    }

    /// [`ReplicatorSim::restart`] with another configuration for that node (say lower
    /// limits than the others').
    pub fn restart_with(
        &mut self,
        node: usize,
        config: ReplicatorConfig,
        durable: Vec<(String, DataEnvelope)>,
    ) {
        let old = self.nodes[node].address.clone();
        let address = UniqueAddress::new(old.address.clone(), old.uid + 1000);
        let mut replicator = Replicator::new(
            address.clone(),
            config,
            self.rng.random(),
            self.base + self.elapsed,
        );
        for (key, envelope) in durable {
            replicator.load(&key, envelope);
        }
        let restarted = &mut self.nodes[node];
        restarted.address = address.clone();
        restarted.replicator = Some(replicator);
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
                Output::Send { to, message } => {
                    if let ReplicatorMessage::WriteAck { op, incarnation } = &message {
                        self.check_write_ack(node, &to, *op, *incarnation);
                    }
                    self.transmit(node, &to, &message)
                }
                Output::Reply { id, response } => {
                    if let Some((key, claimed)) = self.durable_updates.remove(&(node, id))
                        && matches!(
                            response,
                            Response::Update(UpdateResult::Success)
                                | Response::Delete(DeleteResult::Success)
                        )
                    {
                        let what = format!("node {node}: success of request {id}");
                        self.check_acknowledgement(node, &key, &claimed, what);
                    }
                    self.replies.insert((node, id), response);
                }
                Output::Changed {
                    subscriber,
                    key,
                    value,
                } => self.notifications.push((node, subscriber, key, value)),
                Output::Store {
                    write,
                    key,
                    envelope,
                } => {
                    let disk = &mut self.nodes[node].disk;
                    disk.queued.push(DiskWrite {
                        write,
                        key,
                        envelope,
                    });
                    if disk.committing.is_none() {
                        self.start_commit(node);
                    }
                }
            }
        }
    }

    /// `replica` acknowledges the `Write` of `op`: checked if it wrote a durable key.
    fn check_write_ack(&mut self, replica: usize, to: &Address, op: u64, incarnation: u64) {
        let Some(requester) = self.nodes.iter().position(|n| &n.address.address == to) else {
            return;
        };
        let request = (replica, requester, op, incarnation);
        if let Some((key, claimed)) = self.durable_write_requests.remove(&request) {
            let what = format!("node {replica}: WriteAck of op {op} to node {requester}");
            self.check_acknowledgement(replica, &key, &claimed, what);
        }
    }

    /// Records a violation unless `node`'s disk holds `claimed` (or a later state of it).
    fn check_acknowledgement(
        &mut self,
        node: usize,
        key: &str,
        claimed: &DataEnvelope,
        what: String,
    ) {
        self.acknowledgements_checked += 1;
        let on_disk = self.stored.get(&(node, key.to_string()));
        if !on_disk.is_some_and(|stored| &stored.merge(claimed) == stored) {
            self.acknowledgement_violations.push(format!(
                "{what} of key {key} released before its state was on disk"
            ));
        }
    }

    /// Starts a commit of everything queued on `node`'s disk, if anything is.
    fn start_commit(&mut self, node: usize) {
        let disk = &mut self.nodes[node].disk;
        if disk.queued.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut disk.queued);
        let latency = if disk.config.latency_max > disk.config.latency_min {
            self.rng
                .random_range(disk.config.latency_min..=disk.config.latency_max)
        } else {
            disk.config.latency_min
        };
        disk.committing = Some((self.elapsed + latency, batch));
    }

    /// Ends the commit in progress on `node`'s disk: stores its writes or loses them all,
    /// reports them to the Replicator, and starts the next commit.
    fn end_commit(&mut self, node: usize) {
        let Some((_, batch)) = self.nodes[node].disk.committing.take() else {
            return;
        };
        let failure_probability = self.nodes[node].disk.config.failure_probability;
        let failed = failure_probability > 0.0 && self.rng.random_bool(failure_probability);
        self.nodes[node].disk.commit_sizes.push(batch.len());
        let writes = batch.iter().map(|w| w.write).collect();
        let result = if failed {
            self.failed_durable_writes += batch.len() as u64;
            Err("simulated disk failure".to_string())
        } else {
            for DiskWrite { key, envelope, .. } in batch {
                self.stored.insert((node, key), envelope);
            }
            Ok(())
        };
        self.input(node, Input::Stored { writes, result });
        if self.nodes[node].disk.committing.is_none() {
            self.start_commit(node);
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
            let next_commit = self
                .nodes
                .iter()
                .enumerate()
                .filter_map(|(i, n)| n.disk.committing.as_ref().map(|(at, _)| (*at, i)))
                .min();
            let next = [
                next_message,
                next_timer.map(|(t, _)| t),
                next_commit.map(|(t, _)| t),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(end);
            if next > end {
                self.elapsed = end;
                return;
            }
            self.elapsed = self.elapsed.max(next);
            if let Some((at, node)) = next_commit
                && at == next
            {
                self.end_commit(node);
            } else if next_message == Some(next) {
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
        if let ReplicatorMessage::Write {
            op,
            incarnation,
            key,
            envelope,
        } = &decoded
            && self.config.is_durable(key)
            && self.nodes[message.to].replicator.is_some()
        {
            let request = (message.to, message.from, *op, *incarnation);
            self.durable_write_requests
                .insert(request, (key.clone(), envelope.clone()));
        }
        self.input(
            message.to,
            Input::Message {
                from,
                message: decoded,
            },
        );
    }
}
