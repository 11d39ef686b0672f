//! A deterministic simulation of log writers and replicas over a faulty network, with the
//! safety checks of docs/src/design.md §5 "Checks".
//!
//! Nodes each hold an in-memory replica (applying [`crate::replica::Rules`] exactly as the
//! RocksDB store does) and run a client that appends unique values to one log through its own
//! [`LogWriter`], starting a new writer instance whenever the last one stopped, and reading
//! the whole log back (a replay) after every recovery. Everything — latency, loss,
//! duplication, which node acts when, and the faults of a [`Scenario`] — comes from one seed.
//!
//! After the faults end and the cluster heals, a fresh writer recovers the log and reads it;
//! then [`Simulation::check`] compares every observation with every outcome:
//! no two values at one sequence number; no value at two; no gaps; every acknowledged value
//! in the final log; any two replays prefixes of one another; a replay that began after an
//! acknowledgement contains it; no value whose write was refused (not applied) anywhere; and
//! no replica's promise ever going down.
//!
//! A scenario may also run a reader of the acknowledged log ([`committed_reader`]), checked
//! for what the queries by slice promise.

mod committed_reader;

pub use committed_reader::Delivery;

use crate::committed_reader::ReaderSabotage;
use crate::configuration::{Quorums, ReplicaId};
use crate::epoch::Epoch;
use crate::memory::{MemoryLog, ReadLimits};
use crate::message::{Request, Response};
use crate::placement::Ring;
use crate::replica::{Leases, Rules, Sabotage};
use crate::writer::{
    LogWriter, NotApplied, Outcome, Output, Placement, RequestId, Target, WriterSettings,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::{Duration, Instant};
use tessera_cluster::Address;

/// The simulated log's id (placement hashes it).
pub const LOG_ID: &str = "account|sim";

/// The read lease writers ask for (and so the wait of a restarted replica): long beside the
/// network's latency, so that a writer cut off or paused confirms reads from it while others
/// try to take the log over.
pub const READ_LEASE: Duration = Duration::from_millis(400);

/// The faults of one simulated run. Times are offsets from the start.
#[derive(Clone, Debug, Default)]
pub struct Scenario {
    pub name: &'static str,
    /// Nodes in the cluster at the start (each holds a replica and runs a client).
    pub nodes: usize,
    /// Extra nodes that join the cluster during the run (at `joins`).
    pub spare_nodes: usize,
    /// Which nodes run clients (writers); empty: all cluster nodes.
    pub writers: Vec<usize>,
    pub quorums: Option<Quorums>,
    /// One-way latency range in ms.
    pub latency_ms: (u64, u64),
    pub drop_probability: f64,
    pub duplicate_probability: f64,
    /// Probability that a request is held up past its writer's request timeout (a slow
    /// disk, a long queue) and applied after the writer gave up on it.
    pub slow_probability: f64,
    /// Faults at random times in the fault window, drawn per seed.
    pub faults: Vec<FaultKind>,
    /// How long the faulty part of the run lasts.
    pub duration: Duration,
    /// Mean time between a client's appends.
    pub append_interval: Duration,
    /// Probability that a client's operation is a delete of the acknowledged prefix.
    pub delete_probability: f64,
    /// Clients mostly read (confirm) rather than append: a writer cut off keeps reading
    /// from its lease instead of stalling behind an append no quorum takes.
    pub mostly_reads: bool,
    /// Deliberately broken replica rules (to show the checks catch it).
    pub sabotage: Sabotage,
    /// After healing, every serving writer must have brought every member up to its log
    /// (for scenarios with one writer, whose writer lives through the faults).
    pub check_caught_up: bool,
    /// Deliberately broken placement: writers are told of no store beyond the members they
    /// see (to show the checks catch a log created again after a full restart).
    pub forget_known_stores: bool,
    /// Runs a reader of the acknowledged log beside the writers (with these rules broken, to
    /// show the checks catch it), and checks what it delivered.
    pub committed_reader: Option<ReaderSabotage>,
    /// Clients append only through their writer's opening of the log, as a projection
    /// instance saves its offsets ([`LogWriter::append_fenced`]), and start a new writer when
    /// one is refused; the checks then require that no value of a writer lands after the end
    /// of the log as a later writer opened it.
    pub fenced_appends: Option<FencedAppends>,
}

/// How clients of a fenced scenario append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FencedAppends {
    /// Through [`LogWriter::append_fenced`] with the epoch the writer opened the log with.
    Fenced,
    /// Sabotaged: plain appends, checked as if fenced (to show the check catches a writer
    /// that took its log back and wrote after a later opening).
    Unfenced,
}

/// A fault the scenario injects, at a random moment, for a random time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// A node's writer process dies: its writer and in-flight operations vanish; a new
    /// instance starts later.
    CrashWriter,
    /// A node's replica stops answering for a while, then comes back with its data.
    CrashReplica,
    /// A node's replica loses its disk: it comes back empty, under a new storage id.
    WipeReplica,
    /// The cluster splits into two sides (one node against the rest) for a while.
    PartitionOneFromRest,
    /// Every node is cut from every other for a while.
    PartitionAll,
    /// A node's whole process pauses (SIGSTOP), long enough for another writer to take over,
    /// then resumes with its stale state.
    Pause,
    /// A node leaves the cluster for good (its replica keeps running and answering) and a
    /// spare node joins: writers move the log off it.
    ReplaceMember,
    /// A node restarts at another address with its store: the same replica, found by its
    /// store id.
    MoveNode,
    /// One node is cut off and, at once, every other node's replica restarts (a deployment
    /// on the far side of a partition): they forget the read leases they granted, and the
    /// node cut off may still be reading from one.
    CutOffAndRestartOthers,
    /// The whole cluster restarts (every writer and replica process, each with its store)
    /// and forms again from one node, preferably one that holds no replica of the log: it
    /// is Up alone for a while, and the others join one at a time.
    FullRestart,
}

/// One observation of the log: a replay after a recovery.
#[derive(Clone, Debug)]
pub struct Replay {
    pub node: usize,
    /// When the recovery that produced it started.
    pub started: Instant,
    /// `(seq, value)` in order.
    pub entries: Vec<(u64, u64)>,
    /// Entries up to here were deleted when it was read.
    pub base: u64,
}

/// What became of one append.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fate {
    Pending,
    Acknowledged(Instant),
    NotApplied,
    Unknown,
}

/// A writer instance that opened the log: it became ready with `epoch`, the log ending at
/// `highest`. Openings are ordered by epoch: a successor's is above every earlier one's (the
/// order in which they became ready says nothing of a writer paused before it could tell).
#[derive(Clone, Copy, Debug)]
pub struct Opening {
    pub epoch: Epoch,
    pub highest: u64,
}

/// A confirmed read: the writer on `node` confirmed, after `started`, that the log ends at
/// `highest`.
#[derive(Clone, Debug)]
pub struct Read {
    pub node: usize,
    pub started: Instant,
    pub highest: u64,
}

#[derive(Clone, Debug)]
pub struct Write {
    pub node: usize,
    /// The client's writer instance that appended it (its incarnation on `node`).
    pub incarnation: u64,
    pub seq: u64,
    pub fate: Fate,
}

/// What the checks found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation(pub String);

#[derive(Debug)]
enum Event {
    /// A request reaches a replica.
    Request {
        from: usize,
        incarnation: u64,
        id: RequestId,
        to: usize,
        target: Target,
        request: Request<u64>,
    },
    /// An answer reaches a writer (or a reader, for ids at or above `READ_IDS`).
    Answer {
        from: usize,
        to: usize,
        incarnation: u64,
        id: RequestId,
        answer: Answer,
    },
    Tick,
    ClientWants(usize),
    FaultStart(FaultKind),
    Heal(Heal),
    Resume(usize),
    /// A node that restarted with the whole cluster joins it again.
    Rejoin(usize),
}

#[derive(Debug, Clone)]
enum Answer {
    Response(Response<u64>),
    WrongStorage,
}

#[derive(Debug)]
enum Heal {
    Replica(usize),
    Partition,
    Writer(usize),
}

/// Reader request ids start here, so they never meet a writer's.
const READ_IDS: u64 = 1 << 62;
const TICK: Duration = Duration::from_millis(10);

struct Reader {
    id: RequestId,
    source: ReplicaId,
    highest: u64,
    next: u64,
    entries: Vec<(u64, u64)>,
    base: u64,
    started: Instant,
    /// When it sent its last read.
    asked: Instant,
}

struct Client {
    writer: Option<LogWriter<u64>>,
    incarnation: u64,
    /// The next sequence number this client appends at (known once its writer serves).
    next_seq: Option<u64>,
    /// op id → value of its outstanding operations.
    outstanding: BTreeMap<u64, u64>,
    reader: Option<Reader>,
    writer_started: Instant,
    crashed: bool,
    /// The epoch its writer opened the log with (fenced scenarios).
    opened: Option<Epoch>,
    /// Its writer refused a fenced append: it is replaced.
    taken_over: bool,
    restart_after: Option<Instant>,
}

struct Node {
    address: Address,
    storage_id: u64,
    log: MemoryLog<u64>,
    /// The read leases its replica granted (in its process's memory: a restart forgets them).
    leases: Leases,
    down: bool,
    paused_until: Option<Instant>,
    client: Client,
    highest_promise: Epoch,
    /// Restarted at another address: a member that moved and then left the cluster could be
    /// found by no one.
    moved: bool,
    /// The stores this node has seen among the members (its durable list, which outlives
    /// its restarts): storage id → address.
    known_stores: BTreeMap<u64, Address>,
}

/// A simulated run.
pub struct Simulation {
    scenario: Scenario,
    seed: u64,
    rng: SmallRng,
    start: Instant,
    now: Instant,
    rules: Rules,
    settings: WriterSettings,
    nodes: Vec<Node>,
    /// Nodes in the cluster (their order is the membership).
    members: BTreeSet<usize>,
    /// Replicas lost so far (disks wiped, members removed).
    losses: usize,
    /// Nodes that may still join.
    spares: Vec<usize>,
    /// Stores gone for good (a wiped disk's, a replaced member's): the operator forgets them
    /// on each node once that is allowed ([`Simulation::operator_forgets`]).
    gone: BTreeSet<u64>,
    /// The placement each node sees, rebuilt when membership changes.
    placements: Vec<Placement>,
    cut: BTreeSet<(usize, usize)>,
    queue: BinaryHeap<Reverse<(Instant, u64)>>,
    events: BTreeMap<u64, Event>,
    next_event: u64,
    next_value: u64,
    next_op: u64,
    pub writes: BTreeMap<u64, Write>,
    pub replays: Vec<Replay>,
    pub reads: Vec<Read>,
    /// Confirmations in flight: op → (node, started, highest).
    confirming: BTreeMap<u64, Read>,
    pub violations: Vec<Violation>,
    /// The final log read after healing.
    pub final_log: Option<Vec<(u64, u64)>>,
    pub final_base: u64,
    pub stats: Stats,
    /// A line per message and fault when tracing is on (for reading a failing seed).
    pub trace: Option<Vec<String>>,
    /// The highest sequence number a client asked to delete up to.
    deleted_up_to: u64,
    /// The reader of the acknowledged log, if the scenario runs one.
    projection: Option<committed_reader::ReaderProc>,
    /// Every writer instance that opened the log: (node, incarnation) → its opening.
    pub openings: BTreeMap<(usize, u64), Opening>,
}

/// Counters of a run, to see that a scenario exercised what it says.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub acknowledged: u64,
    pub not_applied: u64,
    pub unknown: u64,
    pub recoveries: u64,
    pub fenced: u64,
    pub messages: u64,
    pub dropped: u64,
    pub reconfigurations: u64,
    /// The configuration version the log ended with (summed over seeds in the tests).
    pub final_config_version: u64,
    /// Confirmed reads answered within a read lease, without a round to the replicas.
    pub reads_from_lease: u64,
    /// Prepares a replica held off for a read lease (or its restart wait).
    pub prepares_held_off: u64,
    /// Times a writer did not create the log because too many known stores were unheard
    /// (counted when the writer ends).
    pub creations_held: u64,
    /// Stores the operator forgot on a node.
    pub stores_forgotten: u64,
    /// Fenced appends refused because another writer took the log over after the opening.
    pub taken_over: u64,
    /// Configuration changes writers completed (counted when each ends).
    pub writer_reconfigurations: u64,
    /// Fenced appends acknowledged by a writer that had changed the log's configuration
    /// since it opened it.
    pub fenced_after_reconfiguration: u64,
}

impl Simulation {
    pub fn new(scenario: Scenario, seed: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        let start = Instant::now();
        let total = scenario.nodes + scenario.spare_nodes;
        let nodes = (0..total)
            .map(|i| Node {
                address: Address::new("10.0.0.1", 7000 + i as u16),
                storage_id: rng.random(),
                log: MemoryLog::default(),
                leases: Leases::new(start, Duration::ZERO),
                down: false,
                paused_until: None,
                client: Client {
                    writer: None,
                    incarnation: 0,
                    next_seq: None,
                    outstanding: BTreeMap::new(),
                    reader: None,
                    writer_started: start,
                    opened: None,
                    taken_over: false,
                    crashed: false,
                    restart_after: None,
                },
                highest_promise: Epoch::ZERO,
                moved: false,
                known_stores: BTreeMap::new(),
            })
            .collect();
        let settings = WriterSettings {
            quorums: scenario.quorums.unwrap_or_default(),
            request_timeout: Duration::from_millis(300),
            retry_interval: Duration::from_millis(50),
            recovery_timeout: Duration::from_secs(3),
            operation_timeout: Duration::from_secs(1),
            max_entries_per_request: 7,
            max_bytes_per_request: 40,
            max_buffered_entries: 16,
            max_queued_operations: 8,
            max_recovery_attempts: 6,
            read_lease: READ_LEASE,
            mark_delay: Duration::from_millis(30),
        };
        let rules = Rules {
            sabotage: scenario.sabotage,
        };
        let mut sim = Simulation {
            members: (0..scenario.nodes).collect(),
            losses: 0,
            spares: (scenario.nodes..total).collect(),
            gone: BTreeSet::new(),
            placements: Vec::new(),
            scenario,
            seed,
            rng,
            start,
            now: start,
            rules,
            settings,
            nodes,
            cut: BTreeSet::new(),
            queue: BinaryHeap::new(),
            events: BTreeMap::new(),
            next_event: 0,
            next_value: 1,
            next_op: 1,
            writes: BTreeMap::new(),
            replays: Vec::new(),
            reads: Vec::new(),
            confirming: BTreeMap::new(),
            violations: Vec::new(),
            final_log: None,
            final_base: 0,
            stats: Stats::default(),
            trace: None,
            deleted_up_to: 0,
            projection: None,
            openings: BTreeMap::new(),
        };
        sim.place_projection();
        sim.rebuild_placements();
        sim.schedule(TICK, Event::Tick);
        for node in sim.writer_nodes() {
            let delay = Duration::from_millis(sim.rng.random_range(0..50));
            sim.schedule(delay, Event::ClientWants(node));
        }
        let faults = sim.scenario.faults.clone();
        for fault in faults {
            let window = sim.scenario.duration.as_millis() as u64;
            let at = Duration::from_millis(sim.rng.random_range(window / 10..window * 7 / 10));
            sim.schedule(at, Event::FaultStart(fault));
        }
        sim
    }

    fn writer_nodes(&self) -> Vec<usize> {
        if self.scenario.writers.is_empty() {
            (0..self.scenario.nodes).collect()
        } else {
            self.scenario.writers.clone()
        }
    }

    fn schedule(&mut self, after: Duration, event: Event) {
        let id = self.next_event;
        self.next_event += 1;
        self.queue.push(Reverse((self.now + after, id)));
        self.events.insert(id, event);
    }

    /// Records every message and fault from now on, in `trace`.
    pub fn enable_trace(&mut self) {
        self.trace = Some(Vec::new());
    }

    fn note(&mut self, line: impl FnOnce() -> String) {
        if let Some(trace) = self.trace.as_mut() {
            let ms = self.now.duration_since(self.start).as_millis();
            trace.push(format!("{ms:>6} {}", line()));
        }
    }

    fn violation(&mut self, text: String) {
        self.violations
            .push(Violation(format!("seed {}: {text}", self.seed)));
    }

    fn rebuild_placements(&mut self) {
        self.learn_stores();
        let members: Vec<Address> = self
            .members
            .iter()
            .map(|&i| self.nodes[i].address.clone())
            .collect();
        let preference = Ring::new(members.clone()).preference(LOG_ID);
        let forget = self.scenario.forget_known_stores;
        self.placements = self
            .nodes
            .iter()
            .map(|node| Placement {
                preference: preference.clone(),
                members: members.clone(),
                known_stores: if forget {
                    Vec::new()
                } else {
                    node.known_stores
                        .iter()
                        .map(|(id, address)| ReplicaId::new(address.clone(), *id))
                        .collect()
                },
                converged: true,
                local: Some(node.address.clone()),
            })
            .collect();
    }

    /// Every member learns the stores the members run now, as a node's probe of its members
    /// does (a store seen at another address moved there). None is forgotten: a wiped
    /// store's old id stays known, as a node keeps it until an operator forgets it.
    fn learn_stores(&mut self) {
        let running: Vec<(u64, Address)> = self
            .members
            .iter()
            .map(|&i| (self.nodes[i].storage_id, self.nodes[i].address.clone()))
            .collect();
        for &member in &self.members {
            let known = &mut self.nodes[member].known_stores;
            for (id, address) in &running {
                known.insert(*id, address.clone());
            }
        }
    }

    /// The operator forgets the stores gone for good on each member, as `DELETE
    /// /known-stores/{id}?gone=...` (naming the other gone stores) allows it: no member runs
    /// the store, and every other store the node knows, but those gone too, answers from
    /// the address the node knows it at and holds no configuration naming it, unless the
    /// log's latest configuration among the members does not name it.
    fn operator_forgets(&mut self) {
        if self.gone.is_empty() {
            return;
        }
        let names = |node: &Node, store: u64| {
            node.log
                .meta
                .as_ref()
                .and_then(|m| m.config.as_ref())
                .is_some_and(|c| c.config.all_members().iter().any(|r| r.storage_id == store))
        };
        let latest = self
            .members
            .iter()
            .filter(|&&m| !self.nodes[m].down)
            .filter_map(|&m| self.nodes[m].log.meta.as_ref()?.config.clone())
            .max_by_key(|c| c.rank());
        let latest_names = |store: u64| {
            latest
                .as_ref()
                .is_none_or(|c| c.config.all_members().iter().any(|r| r.storage_id == store))
        };
        let members: Vec<usize> = self.members.iter().copied().collect();
        let mut changed = false;
        for &i in &members {
            if self.nodes[i].down || self.paused(i).is_some() {
                continue;
            }
            let candidates: Vec<u64> = self.nodes[i]
                .known_stores
                .keys()
                .filter(|id| self.gone.contains(id))
                .copied()
                .collect();
            for store in candidates {
                if members.iter().any(|&m| self.nodes[m].storage_id == store) {
                    continue;
                }
                let clear = self.nodes[i]
                    .known_stores
                    .iter()
                    .filter(|(other, _)| **other != store && !self.gone.contains(*other))
                    .all(|(other, address)| {
                        self.nodes.iter().enumerate().any(|(j, node)| {
                            node.storage_id == *other
                                && node.address == *address
                                && !node.down
                                && self.paused(j).is_none()
                                && !self.cut.contains(&(i, j))
                                && !self.cut.contains(&(j, i))
                                && !(names(node, store) && latest_names(store))
                        })
                    });
                if clear {
                    self.nodes[i].known_stores.remove(&store);
                    self.stats.stores_forgotten += 1;
                    changed = true;
                }
            }
        }
        if changed {
            self.placements_changed();
        }
    }

    /// Tells every node's writer the placement it sees now.
    fn placements_changed(&mut self) {
        self.rebuild_placements();
        for node in 0..self.nodes.len() {
            let placement = self.placement_for(node);
            if let Some(writer) = self.nodes[node].client.writer.as_mut() {
                writer.placement_changed(placement, self.now);
            }
            self.flush(node);
        }
    }

    fn placement_for(&self, node: usize) -> Placement {
        self.placements[node].clone()
    }

    fn node_at(&self, address: &Address) -> Option<usize> {
        self.nodes.iter().position(|n| &n.address == address)
    }

    fn latency(&mut self) -> Duration {
        let (lo, hi) = self.scenario.latency_ms;
        Duration::from_millis(self.rng.random_range(lo..=hi.max(lo)))
    }

    /// Runs the faulty part, heals, settles, and reads the final log.
    pub fn run(&mut self) {
        let end = self.start + self.scenario.duration;
        self.run_until(end, true);
        // Heal everything.
        self.cut.clear();
        for i in 0..self.nodes.len() {
            self.nodes[i].down = false;
            self.nodes[i].paused_until = None;
        }
        for i in 0..self.nodes.len() {
            if self.nodes[i].client.crashed {
                self.nodes[i].client.crashed = false;
            }
        }
        self.scenario.drop_probability = 0.0;
        self.scenario.duplicate_probability = 0.0;
        self.scenario.slow_probability = 0.0;
        let settle = self.now + Duration::from_secs(6);
        self.run_until(settle, false);
        if self.scenario.check_caught_up {
            self.check_caught_up();
        }
        self.audit();
        self.finish_projection();
    }

    fn run_until(&mut self, end: Instant, clients_act: bool) {
        while let Some(Reverse((at, id))) = self.queue.peek().copied() {
            if at > end {
                break;
            }
            self.queue.pop();
            self.now = at;
            let Some(event) = self.events.remove(&id) else {
                continue;
            };
            self.step(event, clients_act);
        }
        self.now = end;
    }

    fn paused(&self, node: usize) -> Option<Instant> {
        self.nodes[node]
            .paused_until
            .filter(|until| *until > self.now)
    }

    fn step(&mut self, event: Event, clients_act: bool) {
        match event {
            Event::Tick => {
                for node in 0..self.nodes.len() {
                    if self.paused(node).is_some() {
                        continue;
                    }
                    self.tick_client(node, clients_act);
                }
                self.operator_forgets();
                self.tick_projection(clients_act);
                self.schedule(TICK, Event::Tick);
            }
            Event::ClientWants(node) => {
                if clients_act {
                    if let Some(until) = self.paused(node) {
                        let after = until - self.now + Duration::from_millis(1);
                        self.schedule(after, Event::ClientWants(node));
                        return;
                    }
                    self.client_acts(node);
                    let mean = self.scenario.append_interval.as_millis() as u64;
                    let after =
                        Duration::from_millis(self.rng.random_range(mean / 2..=mean * 3 / 2));
                    self.schedule(after, Event::ClientWants(node));
                }
            }
            Event::Request {
                from,
                incarnation,
                id,
                to,
                target,
                request,
            } => self.deliver_request(from, incarnation, id, to, target, request),
            Event::Answer {
                from,
                to,
                incarnation,
                id,
                answer,
            } => {
                if let Some(until) = self.paused(to) {
                    // A paused process reads its socket when it resumes.
                    let after =
                        until - self.now + Duration::from_millis(self.rng.random_range(0..5));
                    self.schedule(
                        after,
                        Event::Answer {
                            from,
                            to,
                            incarnation,
                            id,
                            answer,
                        },
                    );
                    return;
                }
                if self.cut.contains(&(from, to)) {
                    self.stats.dropped += 1;
                    return;
                }
                self.deliver_answer(from, to, incarnation, id, answer);
            }
            Event::FaultStart(kind) => self.start_fault(kind),
            Event::Heal(heal) => {
                self.note(|| format!("HEAL {heal:?}"));
                match heal {
                    Heal::Replica(node) => {
                        // The replica's process restarted: it knows no lease it granted, so
                        // it waits as long as any lease could run.
                        self.nodes[node].down = false;
                        self.nodes[node].leases = Leases::new(self.now, READ_LEASE);
                        // The members' probes find the store it runs now (new after a wipe).
                        self.rebuild_placements();
                    }
                    Heal::Partition => self.cut.clear(),
                    Heal::Writer(node) => self.nodes[node].client.crashed = false,
                }
            }
            Event::Resume(node) => {
                self.nodes[node].paused_until = None;
            }
            Event::Rejoin(node) => {
                self.note(|| format!("REJOIN {node}"));
                self.members.insert(node);
                self.placements_changed();
            }
        }
    }

    /// Whether the log is on every member of its latest configuration, each holding all that
    /// any replica acknowledged: losing one of them now loses no acknowledged entry.
    fn log_is_whole(&self) -> bool {
        let metas: Vec<(usize, &crate::replica::LogMeta)> = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.log.meta.as_ref().map(|m| (i, m)))
            .collect();
        let Some(config) = metas
            .iter()
            .filter_map(|(_, m)| m.config.as_ref())
            .max_by_key(|c| c.rank())
        else {
            return true;
        };
        let committed = metas.iter().map(|(_, m)| m.committed()).max().unwrap_or(0);
        config.config.all_members().iter().all(|member| {
            metas.iter().any(|(i, m)| {
                self.nodes[*i].storage_id == member.storage_id
                    && self.members.contains(i)
                    && m.last.seq >= committed
            })
        })
    }

    fn start_fault(&mut self, kind: FaultKind) {
        // The fault model: one replica lost at a time. A second loss (a disk, a member
        // removed) comes only once the log is whole again, as an operator replaces one node
        // at a time and waits for the data to move.
        if matches!(kind, FaultKind::WipeReplica | FaultKind::ReplaceMember)
            && self.losses > 0
            && !self.log_is_whole()
        {
            self.note(|| format!("FAULT {kind:?} skipped: the log is not whole after a loss"));
            return;
        }
        if matches!(kind, FaultKind::WipeReplica | FaultKind::ReplaceMember) {
            self.losses += 1;
        }
        self.note(|| format!("FAULT {kind:?}"));
        let members: Vec<usize> = self.members.iter().copied().collect();
        let pick = |rng: &mut SmallRng| members[rng.random_range(0..members.len())];
        let how_long = Duration::from_millis(self.rng.random_range(300..1_500));
        match kind {
            FaultKind::CrashWriter => {
                let node = pick(&mut self.rng);
                self.crash_client(node);
                if self.projection.as_ref().is_some_and(|p| p.node == node) {
                    self.crash_projection();
                }
                self.schedule(how_long, Event::Heal(Heal::Writer(node)));
            }
            FaultKind::CrashReplica => {
                let node = pick(&mut self.rng);
                self.nodes[node].down = true;
                self.schedule(how_long, Event::Heal(Heal::Replica(node)));
            }
            FaultKind::WipeReplica => {
                let node = pick(&mut self.rng);
                self.nodes[node].down = true;
                self.nodes[node].log = MemoryLog::default();
                self.gone.insert(self.nodes[node].storage_id);
                self.nodes[node].storage_id = self.rng.random();
                self.nodes[node].highest_promise = Epoch::ZERO;
                self.schedule(how_long, Event::Heal(Heal::Replica(node)));
            }
            FaultKind::PartitionOneFromRest => {
                let alone = pick(&mut self.rng);
                self.cut_off(alone);
                self.schedule(how_long * 2, Event::Heal(Heal::Partition));
            }
            FaultKind::CutOffAndRestartOthers => {
                let alone = pick(&mut self.rng);
                self.cut_off(alone);
                for other in 0..self.nodes.len() {
                    if other != alone {
                        self.nodes[other].down = true;
                        let restart = Duration::from_millis(self.rng.random_range(10..60));
                        self.schedule(restart, Event::Heal(Heal::Replica(other)));
                    }
                }
                self.schedule(how_long * 2, Event::Heal(Heal::Partition));
            }
            FaultKind::PartitionAll => {
                for a in 0..self.nodes.len() {
                    for b in 0..self.nodes.len() {
                        if a != b {
                            self.cut.insert((a, b));
                        }
                    }
                }
                self.schedule(how_long, Event::Heal(Heal::Partition));
            }
            FaultKind::Pause => {
                let node = pick(&mut self.rng);
                let until = self.now + how_long * 2;
                self.nodes[node].paused_until = Some(until);
                self.schedule(how_long * 2, Event::Resume(node));
            }
            FaultKind::MoveNode => {
                let node = pick(&mut self.rng);
                let old = self.nodes[node].address.clone();
                self.nodes[node].address = Address::new(old.host.clone(), old.port + 1_000);
                self.nodes[node].moved = true;
                self.nodes[node].leases = Leases::new(self.now, READ_LEASE);
                self.crash_client(node);
                self.nodes[node].client.crashed = false;
                self.placements_changed();
            }
            FaultKind::ReplaceMember => {
                // The leaving replica keeps answering at the address the log's configuration
                // names; one that moved would answer nowhere anyone looks, and that loss
                // together with a wiped disk is two of three replicas, beyond what the log
                // tolerates. Such a node is not picked.
                let stayed: Vec<usize> = members
                    .iter()
                    .copied()
                    .filter(|&node| !self.nodes[node].moved)
                    .collect();
                if stayed.is_empty() {
                    return;
                }
                let Some(spare) = self.spares.pop() else {
                    return;
                };
                let leaving = stayed[self.rng.random_range(0..stayed.len())];
                self.gone.insert(self.nodes[leaving].storage_id);
                self.members.remove(&leaving);
                self.members.insert(spare);
                self.stats.reconfigurations += 1;
                // Its client stops too (a removed node hosts nothing); its replica keeps
                // answering, as a downed node that still runs would.
                self.crash_client(leaving);
                self.nodes[leaving].client.restart_after =
                    Some(self.now + Duration::from_secs(3600));
                self.placements_changed();
            }
            FaultKind::FullRestart => {
                self.crash_projection();
                let all: Vec<usize> = self.members.iter().copied().collect();
                for &node in &all {
                    self.crash_client(node);
                    self.nodes[node].client.crashed = false;
                    // Its replica's process restarted too: it knows no lease it granted.
                    self.nodes[node].leases = Leases::new(self.now, READ_LEASE);
                }
                let strangers: Vec<usize> = all
                    .iter()
                    .copied()
                    .filter(|&node| self.nodes[node].log.meta.is_none())
                    .collect();
                let from = if strangers.is_empty() {
                    &all
                } else {
                    &strangers
                };
                let first = from[self.rng.random_range(0..from.len())];
                self.members = BTreeSet::from([first]);
                self.placements_changed();
                for &node in &all {
                    if node != first {
                        let after = Duration::from_millis(self.rng.random_range(200..1_500));
                        self.schedule(after, Event::Rejoin(node));
                    }
                }
            }
        }
    }

    /// Cuts `alone` off from every other node, both ways.
    fn cut_off(&mut self, alone: usize) {
        for other in 0..self.nodes.len() {
            if other != alone {
                self.cut.insert((alone, other));
                self.cut.insert((other, alone));
            }
        }
    }

    /// Starts a new writer on `node` if its last one stopped, as a client would: a promise
    /// left above the log by a recovery that gave up fences a writer whose recovery went
    /// without it, and its successor recovers above that promise.
    fn replace_stopped_writer(&mut self, node: usize) {
        if self.nodes[node]
            .client
            .writer
            .as_ref()
            .is_none_or(|w| w.is_stopped())
        {
            self.start_writer(node);
        }
    }

    /// Drops the node's writer, counting what it did.
    fn retire_writer(&mut self, node: usize) {
        if let Some(writer) = self.nodes[node].client.writer.take() {
            self.stats.creations_held += writer.counters().creations_held;
            self.stats.writer_reconfigurations += writer.counters().reconfigurations;
        }
    }

    fn crash_client(&mut self, node: usize) {
        self.retire_writer(node);
        let client = &mut self.nodes[node].client;
        client.reader = None;
        client.crashed = true;
        client.next_seq = None;
        self.settle_outstanding(node);
    }

    /// The client's operations still out, once its writer is gone: they may or may not
    /// appear.
    fn settle_outstanding(&mut self, node: usize) {
        let lost: Vec<u64> = std::mem::take(&mut self.nodes[node].client.outstanding)
            .into_values()
            .collect();
        for value in lost {
            if let Some(write) = self.writes.get_mut(&value)
                && write.fate == Fate::Pending
            {
                write.fate = Fate::Unknown;
                self.stats.unknown += 1;
            }
        }
    }

    fn tick_client(&mut self, node: usize, clients_act: bool) {
        if self.nodes[node].client.crashed {
            return;
        }
        let now = self.now;
        if let Some(writer) = self.nodes[node].client.writer.as_mut() {
            writer.tick(now);
        }
        self.flush(node);
        let stopped = self.nodes[node]
            .client
            .writer
            .as_ref()
            .is_some_and(|w| w.is_stopped());
        if stopped {
            self.retire_writer(node);
            self.nodes[node].client.next_seq = None;
            self.nodes[node].client.reader = None;
            let backoff = Duration::from_millis(self.rng.random_range(20..200));
            self.nodes[node].client.restart_after = Some(self.now + backoff);
        }
        let _ = clients_act;
    }

    /// The client's turn: start a writer if it has none, or append the next value.
    fn client_acts(&mut self, node: usize) {
        if !self.members.contains(&node) || self.nodes[node].client.crashed {
            return;
        }
        if self.nodes[node].client.writer.is_none() {
            if self.nodes[node]
                .client
                .restart_after
                .is_some_and(|at| at > self.now)
            {
                return;
            }
            self.start_writer(node);
            return;
        }
        // Like an entity, a client acts only once its replay is done.
        if self.nodes[node].client.reader.is_some() {
            return;
        }
        let Some(seq) = self.nodes[node].client.next_seq else {
            return;
        };
        if self.nodes[node].client.outstanding.len() >= 2 {
            return;
        }
        let op = self.next_op;
        self.next_op += 1;
        let delete = self.rng.random_bool(self.scenario.delete_probability);
        let read_probability = if self.scenario.mostly_reads { 0.8 } else { 0.1 };
        let confirm = !delete && self.rng.random_bool(read_probability);
        let now = self.now;
        if confirm {
            // A read: the client's state is the log up to seq - 1.
            self.confirming.insert(
                op,
                Read {
                    node,
                    started: now,
                    highest: seq - 1,
                },
            );
            self.nodes[node].client.outstanding.insert(op, 0);
            if let Some(writer) = self.nodes[node].client.writer.as_mut() {
                writer.confirm(op, seq - 1, now);
            }
        } else if delete {
            let to = seq.saturating_sub(self.rng.random_range(1..5));
            self.deleted_up_to = self.deleted_up_to.max(to);
            if let Some(writer) = self.nodes[node].client.writer.as_mut() {
                writer.delete_to(op, to, now);
            }
        } else {
            let value = self.next_value;
            self.next_value += 1;
            self.writes.insert(
                value,
                Write {
                    node,
                    incarnation: self.nodes[node].client.incarnation,
                    seq,
                    fate: Fate::Pending,
                },
            );
            self.note(|| format!("n{node} op {op}: append value {value} at {seq}"));
            let fenced = self.scenario.fenced_appends;
            let client = &mut self.nodes[node].client;
            client.outstanding.insert(op, value);
            client.next_seq = Some(seq + 1);
            if let Some(writer) = client.writer.as_mut() {
                match (fenced, client.opened) {
                    (Some(FencedAppends::Fenced), Some(opened)) => {
                        writer.append_fenced(op, seq, vec![value], opened, now)
                    }
                    _ => writer.append(op, seq, vec![value], now),
                }
            }
        }
        self.flush(node);
    }

    fn start_writer(&mut self, node: usize) {
        self.retire_writer(node);
        let placement = self.placement_for(node);
        let known = self.nodes[node]
            .log
            .meta
            .as_ref()
            .and_then(|m| m.config.as_deref().cloned());
        // Half the writers start from their own replica's configuration, half locate.
        let known = if self.rng.random_bool(0.5) {
            known
        } else {
            None
        };
        let writer_id: u64 = self.rng.random();
        let client = &mut self.nodes[node].client;
        client.incarnation += 1;
        client.writer_started = self.now;
        client.opened = None;
        client.taken_over = false;
        client.writer = Some(LogWriter::new(
            self.settings.clone(),
            writer_id,
            placement,
            known,
            self.now,
        ));
        self.stats.recoveries += 1;
        self.flush(node);
    }

    /// Sends what the node's writer produced and records its outcomes.
    fn flush(&mut self, node: usize) {
        let outputs = match self.nodes[node].client.writer.as_mut() {
            Some(writer) => writer.take_outputs(),
            None => return,
        };
        let incarnation = self.nodes[node].client.incarnation;
        for output in outputs {
            match output {
                Output::Send { id, to, request } => {
                    self.send_request(node, incarnation, id, to, request);
                }
                Output::Ready { highest } => {
                    self.note(|| format!("n{node}#{incarnation} READY highest {highest}"));
                    let client = &mut self.nodes[node].client;
                    client.opened = client.writer.as_ref().and_then(|w| w.opened_epoch());
                    if let Some(epoch) = client.opened {
                        self.openings
                            .insert((node, incarnation), Opening { epoch, highest });
                    }
                    self.nodes[node].client.next_seq = Some(highest + 1);
                    self.start_reader(node, highest);
                }
                Output::Completed { op, outcome } => {
                    self.note(|| format!("n{node}#{incarnation} op {op}: {outcome:?}"));
                    self.completed(node, op, outcome)
                }
                Output::Stopped(reason) => {
                    self.note(|| format!("n{node}#{incarnation} STOPPED {reason}"));
                    if matches!(reason, crate::writer::StopReason::Fenced { .. }) {
                        self.stats.fenced += 1;
                    }
                    if matches!(reason, crate::writer::StopReason::Inconsistent(_)) {
                        self.violation(format!("writer on node {node} stopped: {reason}"));
                    }
                }
            }
        }
        if std::mem::take(&mut self.nodes[node].client.taken_over) {
            // As a projection instance whose offset save was refused: its run ends, and the
            // next one opens the log again with a new writer.
            self.note(|| format!("n{node}#{incarnation} TAKEN OVER: replaced"));
            self.retire_writer(node);
            self.settle_outstanding(node);
            self.nodes[node].client.next_seq = None;
            self.nodes[node].client.reader = None;
            let backoff = Duration::from_millis(self.rng.random_range(20..200));
            self.nodes[node].client.restart_after = Some(self.now + backoff);
        }
    }

    fn completed(&mut self, node: usize, op: u64, outcome: Outcome) {
        let Some(value) = self.nodes[node].client.outstanding.remove(&op) else {
            return;
        };
        if let Outcome::NotApplied(NotApplied::TakenOver { .. }) = outcome {
            self.stats.taken_over += 1;
            self.nodes[node].client.taken_over = true;
        }
        if let Some(read) = self.confirming.remove(&op) {
            if outcome == Outcome::Acknowledged {
                if read.started == self.now {
                    // No round to the replicas takes no time: a read lease answered it.
                    self.stats.reads_from_lease += 1;
                }
                self.reads.push(read);
            }
            return;
        }
        let Some(write) = self.writes.get_mut(&value) else {
            return;
        };
        let reconfigured = self.nodes[node]
            .client
            .writer
            .as_ref()
            .is_some_and(|w| w.counters().reconfigurations > 0);
        write.fate = match outcome {
            Outcome::Acknowledged => {
                self.stats.acknowledged += 1;
                if reconfigured && self.scenario.fenced_appends == Some(FencedAppends::Fenced) {
                    self.stats.fenced_after_reconfiguration += 1;
                }
                Fate::Acknowledged(self.now)
            }
            Outcome::NotApplied(_) => {
                self.stats.not_applied += 1;
                Fate::NotApplied
            }
            Outcome::Unknown(_) => {
                self.stats.unknown += 1;
                Fate::Unknown
            }
        };
        if !matches!(write.fate, Fate::Acknowledged(_)) {
            // The client's view of the next sequence number is no longer reliable.
            self.nodes[node].client.next_seq = None;
        }
    }

    fn send_request(
        &mut self,
        from: usize,
        incarnation: u64,
        id: RequestId,
        target: Target,
        request: Request<u64>,
    ) {
        self.stats.messages += 1;
        let Some(to) = self.node_at(target.address()) else {
            return;
        };
        if self.rng.random_bool(self.scenario.drop_probability) {
            self.stats.dropped += 1;
            return;
        }
        let copies = if self.rng.random_bool(self.scenario.duplicate_probability) {
            2
        } else {
            1
        };
        for copy in 0..copies {
            let mut delay = self.latency();
            if self.rng.random_bool(self.scenario.slow_probability) {
                let timeout = self.settings.request_timeout.as_millis() as u64;
                delay += Duration::from_millis(self.rng.random_range(timeout..=timeout * 4));
            }
            if copy == 1 {
                // A repeat is a request sent again after a timeout whose first copy was
                // only late: it may arrive long after the first, past what followed it.
                let (_, hi) = self.scenario.latency_ms;
                delay += Duration::from_millis(self.rng.random_range(0..=hi * 4));
            }
            self.schedule(
                delay,
                Event::Request {
                    from,
                    incarnation,
                    id,
                    to,
                    target: target.clone(),
                    request: request.clone(),
                },
            );
        }
    }

    fn deliver_request(
        &mut self,
        from: usize,
        incarnation: u64,
        id: RequestId,
        to: usize,
        target: Target,
        request: Request<u64>,
    ) {
        if self.cut.contains(&(from, to)) || self.nodes[to].down {
            self.stats.dropped += 1;
            return;
        }
        if let Some(until) = self.paused(to) {
            let after = until - self.now + Duration::from_millis(self.rng.random_range(0..5));
            self.schedule(
                after,
                Event::Request {
                    from,
                    incarnation,
                    id,
                    to,
                    target,
                    request,
                },
            );
            return;
        }
        let storage_id = self.nodes[to].storage_id;
        let shown = if self.trace.is_some() {
            format!("{request:?}")
        } else {
            String::new()
        };
        let answer = match &target {
            Target::Replica(replica) if replica.storage_id != storage_id => Answer::WrongStorage,
            _ => {
                let rules = self.rules;
                let limits = ReadLimits {
                    max_tail_entries: 5,
                    max_bytes: 1 << 20,
                };
                let now = self.now;
                let replica = &mut self.nodes[to];
                let mut response = replica.log.handle_leased(
                    &rules,
                    request,
                    limits,
                    &mut replica.leases,
                    LOG_ID,
                    now,
                );
                if let Response::Located { storage_id: s, .. } = &mut response {
                    *s = storage_id;
                }
                if matches!(response, Response::Leased { .. }) {
                    self.stats.prepares_held_off += 1;
                }
                self.check_promise(to);
                Answer::Response(response)
            }
        };
        self.note(|| {
            format!("n{from}#{incarnation} -> n{to} [{id}] {shown}\n         => {answer:?}")
        });
        if self.rng.random_bool(self.scenario.drop_probability) {
            self.stats.dropped += 1;
            return;
        }
        let mut delay = self.latency();
        if self.rng.random_bool(self.scenario.slow_probability) {
            let timeout = self.settings.request_timeout.as_millis() as u64;
            delay += Duration::from_millis(self.rng.random_range(timeout..=timeout * 4));
        }
        self.schedule(
            delay,
            Event::Answer {
                from: to,
                to: from,
                incarnation,
                id,
                answer,
            },
        );
    }

    fn check_promise(&mut self, node: usize) {
        let promise = self.nodes[node]
            .log
            .meta
            .as_ref()
            .map_or(Epoch::ZERO, |m| m.promise);
        if promise < self.nodes[node].highest_promise && !self.rules.sabotage.no_fence {
            self.violation(format!(
                "the promise of node {node} went down from {} to {promise}",
                self.nodes[node].highest_promise
            ));
        }
        self.nodes[node].highest_promise = self.nodes[node].highest_promise.max(promise);
    }

    fn deliver_answer(
        &mut self,
        from: usize,
        node: usize,
        incarnation: u64,
        id: RequestId,
        answer: Answer,
    ) {
        if Self::is_projection_request(id) {
            if self.projection.as_ref().is_some_and(|p| p.node == node) {
                self.projection_answer(from, incarnation, id, answer);
            }
            return;
        }
        let client = &self.nodes[node].client;
        if client.incarnation != incarnation || client.crashed {
            return;
        }
        if id >= READ_IDS {
            self.reader_answer(node, id, answer);
            return;
        }
        let now = self.now;
        let Some(writer) = self.nodes[node].client.writer.as_mut() else {
            return;
        };
        match answer {
            Answer::Response(response) => writer.on_response(id, response, now),
            Answer::WrongStorage => writer.on_wrong_storage(id, now),
        }
        self.flush(node);
    }

    fn start_reader(&mut self, node: usize, highest: u64) {
        let sources = self.nodes[node]
            .client
            .writer
            .as_ref()
            .map(|w| w.read_sources())
            .unwrap_or_default();
        let Some(source) = sources.first().cloned() else {
            return;
        };
        let started = self.nodes[node].client.writer_started;
        self.nodes[node].client.reader = Some(Reader {
            id: READ_IDS,
            source,
            highest,
            next: 1,
            entries: Vec::new(),
            base: 0,
            started,
            asked: self.now,
        });
        self.read_next(node);
    }

    fn read_next(&mut self, node: usize) {
        let incarnation = self.nodes[node].client.incarnation;
        let Some(reader) = self.nodes[node].client.reader.as_mut() else {
            return;
        };
        if reader.next > reader.highest {
            let reader = self.nodes[node]
                .client
                .reader
                .take()
                .expect("reader present");
            self.replays.push(Replay {
                node,
                started: reader.started,
                entries: reader.entries,
                base: reader.base,
            });
            return;
        }
        reader.id += 1;
        reader.asked = self.now;
        let (id, source) = (reader.id, reader.source.clone());
        let request = Request::Read {
            from: reader.next,
            to: reader.highest,
            max_entries: 5,
            max_bytes: 1 << 20,
        };
        self.send_request(node, incarnation, id, Target::Replica(source), request);
    }

    fn reader_answer(&mut self, node: usize, id: RequestId, answer: Answer) {
        let Some(reader) = self.nodes[node].client.reader.as_mut() else {
            return;
        };
        if reader.id != id {
            return;
        }
        match answer {
            Answer::Response(Response::Entries { entries, summary }) => {
                if reader.next <= summary.base.seq {
                    if !reader.entries.is_empty() {
                        // A later writer deleted what this replay was about to read: it
                        // fails, as an entity's recovery would (an event is missing).
                        self.nodes[node].client.reader = None;
                        return;
                    }
                    // Deleted at the source: the replay starts after the deleted prefix.
                    reader.next = summary.base.seq + 1;
                    reader.base = summary.base.seq;
                }
                for entry in entries {
                    if entry.seq == reader.next && entry.seq <= reader.highest {
                        reader.entries.push((entry.seq, entry.payload));
                        reader.next += 1;
                    }
                }
                self.read_next(node);
            }
            _ => {
                // The source failed; this replay is given up (a later one will be made).
                self.nodes[node].client.reader = None;
            }
        }
    }

    /// After healing: a fresh writer on a member recovers the log and reads all of it.
    fn audit(&mut self) {
        let Some(&node) = self.members.iter().next() else {
            return;
        };
        // Make sure nothing is paused or pending, and drive the auditor alone.
        for i in 0..self.nodes.len() {
            self.crash_client(i);
            self.nodes[i].client.crashed = false;
            self.nodes[i].client.restart_after = Some(self.now + Duration::from_secs(3600));
        }
        self.start_writer(node);
        let deadline = self.now + Duration::from_secs(10);
        let replays_before = self.replays.len();
        while self.now < deadline {
            let next = self.now + TICK;
            self.run_until(next, false);
            if self.replays.len() > replays_before {
                break;
            }
            // A read sent where no replica answers any more (a member that moved, then left)
            // gets no answer: given up, and made again from the writer's sources now.
            if self.nodes[node].client.reader.as_ref().is_some_and(|r| {
                self.now.saturating_duration_since(r.asked) >= Duration::from_secs(1)
            }) {
                self.nodes[node].client.reader = None;
            }
            if self.nodes[node].client.reader.is_none() {
                self.replace_stopped_writer(node);
            }
            // A read that failed (its source answered late or not at all) is tried again.
            let client = &self.nodes[node].client;
            let highest = client.writer.as_ref().and_then(|w| w.highest());
            if let (None, Some(highest)) = (&client.reader, highest) {
                self.start_reader(node, highest);
            }
        }
        match self.replays.get(replays_before) {
            Some(replay) => {
                self.final_base = replay.base;
                self.final_log = Some(replay.entries.clone());
                self.check_placement(node);
            }
            None => {
                let status = self.nodes[node]
                    .client
                    .writer
                    .as_ref()
                    .map(|w| format!("{:?}", w.status()));
                self.violation(format!(
                    "after healing, a fresh writer could not recover and read the log \
                     (writer: {status:?})"
                ));
            }
        }
    }

    fn check_caught_up(&mut self) {
        for node in 0..self.nodes.len() {
            let Some(status) = self.nodes[node].client.writer.as_ref().map(|w| w.status()) else {
                continue;
            };
            if status.phase != "serving" {
                continue;
            }
            let behind: Vec<String> = status
                .matched
                .iter()
                .filter(|(_, matched)| Some(*matched) != status.highest)
                .map(|(replica, matched)| format!("{} at {matched}", replica.address))
                .collect();
            if !behind.is_empty() {
                self.violation(format!(
                    "6 s after healing, the writer on node {node} (log at {:?}) still has \
                     members behind: {}",
                    status.highest,
                    behind.join(", ")
                ));
            }
        }
    }

    /// After healing, a serving writer moves the log onto live replicas within bounded time:
    /// its configuration must end up with N members, each a current member with its current
    /// store.
    fn check_placement(&mut self, node: usize) {
        let deadline = self.now + Duration::from_secs(5);
        let wanted = self
            .settings
            .quorums
            .replication_factor()
            .min(self.members.len());
        let live: BTreeSet<ReplicaId> = self
            .members
            .iter()
            .map(|&i| ReplicaId::new(self.nodes[i].address.clone(), self.nodes[i].storage_id))
            .collect();
        let mut config = None;
        while self.now < deadline {
            let next = self.now + TICK;
            self.run_until(next, false);
            self.replace_stopped_writer(node);
            let status = self.nodes[node].client.writer.as_ref().map(|w| w.status());
            config = status.as_ref().and_then(|s| s.config.clone());
            // Every member caught up with the writer, too.
            let caught_up = status.as_ref().is_some_and(|s| {
                s.matched
                    .iter()
                    .all(|(_, matched)| Some(*matched) == s.highest)
            });
            if let Some(c) = &config
                && caught_up
                && !c.is_joint()
                && c.members.len() == wanted
                && c.members.iter().all(|m| live.contains(m))
            {
                self.stats.final_config_version = c.version;
                return;
            }
        }
        self.violation(format!(
            "5 s after healing the log is still not on {wanted} live, caught-up replicas: \
             {config:?}"
        ));
    }

    /// Fenced scenarios: no value of a writer instance is in the final log beyond the end
    /// of the log as a later instance opened it (that writer wrote after its successor
    /// started).
    fn check_openings(&self) -> Vec<String> {
        let (Some(_), Some(final_log)) = (self.scenario.fenced_appends, &self.final_log) else {
            return Vec::new();
        };
        // For each opening, the lowest end among the openings after it.
        let mut by_order: Vec<(&(usize, u64), &Opening)> = self.openings.iter().collect();
        by_order.sort_by_key(|(_, o)| o.epoch);
        let mut lowest_after: BTreeMap<(usize, u64), (u64, (usize, u64))> = BTreeMap::new();
        let mut lowest: Option<(u64, (usize, u64))> = None;
        for (key, opening) in by_order.iter().rev() {
            if let Some(l) = lowest {
                lowest_after.insert(**key, l);
            }
            if lowest.is_none_or(|(h, _)| opening.highest < h) {
                lowest = Some((opening.highest, **key));
            }
        }
        let mut found = Vec::new();
        for &(seq, value) in final_log {
            let Some(write) = self.writes.get(&value) else {
                continue;
            };
            let by = (write.node, write.incarnation);
            if let Some(&(highest, later)) = lowest_after.get(&by)
                && seq > highest
            {
                found.push(format!(
                    "value {value} at seq {seq}, written by writer n{}#{}, is beyond the end {} \
                     of the log as the later writer n{}#{} opened it: a writer wrote after its \
                     successor started",
                    by.0, by.1, highest, later.0, later.1
                ));
            }
        }
        found
    }

    /// Compares all observations with all outcomes; returns every violation found.
    pub fn check(&mut self) -> Vec<Violation> {
        let mut found = Vec::new();
        let mut value_at: BTreeMap<u64, u64> = BTreeMap::new();
        let mut seq_of: BTreeMap<u64, u64> = BTreeMap::new();
        let mut observations: Vec<&Vec<(u64, u64)>> =
            self.replays.iter().map(|r| &r.entries).collect();
        if let Some(final_log) = &self.final_log {
            observations.push(final_log);
        }
        for entries in &observations {
            // No gaps, in order.
            for pair in entries.windows(2) {
                if pair[1].0 != pair[0].0 + 1 {
                    found.push(format!(
                        "a replay jumps from {} to {}",
                        pair[0].0, pair[1].0
                    ));
                }
            }
            for &(seq, value) in entries.iter() {
                if let Some(other) = value_at.insert(seq, value)
                    && other != value
                {
                    found.push(format!("two values at seq {seq}: {other} and {value}"));
                }
                if let Some(other) = seq_of.insert(value, seq)
                    && other != seq
                {
                    found.push(format!("value {value} at two seqs: {other} and {seq}"));
                }
                match self.writes.get(&value).map(|w| &w.fate) {
                    Some(Fate::NotApplied) => found.push(format!(
                        "value {value} was not applied but appears at {seq}"
                    )),
                    None => found.push(format!("value {value} was never written")),
                    _ => {}
                }
            }
        }
        // Any two replays: one a prefix of the other (beyond deleted prefixes).
        for (i, a) in observations.iter().enumerate() {
            for b in observations.iter().skip(i + 1) {
                let (short, long) = if a.last().map(|e| e.0) <= b.last().map(|e| e.0) {
                    (a, b)
                } else {
                    (b, a)
                };
                let long: BTreeMap<u64, u64> = long.iter().copied().collect();
                let long_first = long.keys().next().copied().unwrap_or(1);
                for &(seq, value) in short.iter() {
                    if seq >= long_first && long.get(&seq) != Some(&value) {
                        found.push(format!("replays differ at seq {seq}"));
                        break;
                    }
                }
            }
        }
        if let Some(final_log) = &self.final_log {
            let present: BTreeSet<u64> = final_log.iter().map(|e| e.1).collect();
            for (value, write) in &self.writes {
                if let Fate::Acknowledged(_) = write.fate
                    && write.seq > self.final_base
                    && !present.contains(value)
                {
                    found.push(format!(
                        "acknowledged value {value} (seq {}, node {}) is missing from the final log",
                        write.seq, write.node
                    ));
                }
            }
        }
        // A replay that began after an acknowledgement contains it.
        for replay in &self.replays {
            let present: BTreeSet<u64> = replay.entries.iter().map(|e| e.1).collect();
            let first = replay.base + 1;
            for (value, write) in &self.writes {
                if let Fate::Acknowledged(at) = write.fate
                    && at < replay.started
                    && write.seq >= first
                    && !present.contains(value)
                {
                    found.push(format!(
                        "value {value} acknowledged before a replay on node {} began is not \
                         in it",
                        replay.node
                    ));
                }
            }
        }
        // A confirmed read saw every value acknowledged before it began.
        for read in &self.reads {
            for (value, write) in &self.writes {
                if let Fate::Acknowledged(at) = write.fate
                    && at < read.started
                    && write.seq > read.highest
                {
                    found.push(format!(
                        "a read on node {} confirmed the log ends at {} after value {value} was \
                         acknowledged at {}",
                        read.node, read.highest, write.seq
                    ));
                }
            }
        }
        found.extend(self.check_projection());
        found.extend(self.check_openings());
        found.sort();
        found.dedup();
        let mut violations = std::mem::take(&mut self.violations);
        violations.extend(
            found
                .into_iter()
                .map(|f| Violation(format!("seed {}: {f}", self.seed))),
        );
        violations
    }
}
