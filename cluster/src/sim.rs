//! A deterministic simulation of a cluster: many [`ClusterCore`]s, simulated time, and the
//! in-memory transport's link-fault model ([`LinkFaults`]) deciding the fate of every message.
//!
//! Everything — latency, drops, gossip peer choice, node uids — comes from one seed, so a
//! failing schedule is reproduced by its seed. Used by the multi-node protocol tests.

use crate::address::{Address, UniqueAddress};
use crate::core::{ClusterCore, ClusterCoreConfig, CoreMessage, StopReason};
use crate::events::ClusterEvent;
use crate::member::MemberStatus;
use crate::transport::link_faults::{LinkDecision, LinkFaults};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::{Duration, Instant};

/// How often each simulated node's timers are driven (the real node uses the same period).
pub const TICK_INTERVAL: Duration = Duration::from_millis(100);

/// One simulated node.
pub struct SimNode {
    pub core: ClusterCore,
    /// None while running; why it stopped otherwise (None with `crashed` for a crash).
    pub stopped: Option<StopReason>,
    pub crashed: bool,
    pub events: Vec<(Instant, ClusterEvent)>,
}

impl SimNode {
    pub fn is_running(&self) -> bool {
        self.stopped.is_none() && !self.crashed
    }
}

enum Scheduled {
    /// The node process starts: joining begins, then it ticks.
    Start(Address),
    Tick(Address),
    Deliver {
        from: UniqueAddress,
        to: Address,
        message: CoreMessage,
    },
}

/// A simulated cluster.
pub struct Simulation {
    start: Instant,
    now: Instant,
    rng: SmallRng,
    pub faults: LinkFaults,
    nodes: BTreeMap<Address, SimNode>,
    queue: BinaryHeap<Reverse<(Instant, u64)>>,
    scheduled: BTreeMap<u64, Scheduled>,
    next_seq: u64,
    /// One-way network latency is drawn uniformly from this range (ms).
    latency_ms: (u64, u64),
    pub messages_delivered: u64,
    pub messages_dropped: u64,
    /// Nodes whose process is stopped (SIGSTOP), with their timers and deliveries held
    /// until they resume.
    paused: BTreeMap<Address, Vec<Scheduled>>,
}

impl Simulation {
    pub fn new(seed: u64) -> Self {
        let start = Instant::now();
        Self {
            start,
            now: start,
            rng: SmallRng::seed_from_u64(seed),
            faults: LinkFaults::new(seed ^ 0x9e37_79b9_7f4a_7c15),
            nodes: BTreeMap::new(),
            queue: BinaryHeap::new(),
            scheduled: BTreeMap::new(),
            next_seq: 0,
            latency_ms: (1, 10),
            messages_delivered: 0,
            messages_dropped: 0,
            paused: BTreeMap::new(),
        }
    }

    /// The simulated address of node `i`.
    pub fn address(i: usize) -> Address {
        Address::new(format!("10.0.0.{}", 100 + i), 25520)
    }

    pub fn now(&self) -> Instant {
        self.now
    }

    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// Starts a node (a new incarnation when one ran at this address before) that joins
    /// through its configured seed nodes after `start_delay`.
    pub fn start_node(
        &mut self,
        address: Address,
        config: ClusterCoreConfig,
        start_delay: Duration,
    ) -> UniqueAddress {
        let uid = self.rng.random::<u64>();
        let node = UniqueAddress::new(address.clone(), uid);
        let seed = self.rng.random::<u64>();
        let at = self.now + start_delay;
        let core = match ClusterCore::new(node.clone(), config, seed, at, 1_700_000_000_000) {
            Ok(core) => core,
            Err(e) => panic!("invalid simulation config: {e}"),
        };
        self.nodes.insert(
            address.clone(),
            SimNode {
                core,
                stopped: None,
                crashed: false,
                events: Vec::new(),
            },
        );
        self.schedule(at, Scheduled::Start(address));
        node
    }

    pub fn node(&self, address: &Address) -> &SimNode {
        &self.nodes[address]
    }

    pub fn node_mut(&mut self, address: &Address) -> &mut SimNode {
        self.nodes.get_mut(address).expect("unknown simulated node")
    }

    pub fn nodes(&self) -> impl Iterator<Item = (&Address, &SimNode)> {
        self.nodes.iter()
    }

    pub fn running(&self) -> Vec<Address> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.is_running())
            .map(|(a, _)| a.clone())
            .collect()
    }

    /// Kills a node without any goodbye (SIGKILL).
    pub fn crash(&mut self, address: &Address) {
        if let Some(node) = self.nodes.get_mut(address) {
            node.crashed = true;
        }
    }

    /// Stops a node's process (SIGSTOP): its timers stop and what is sent to it waits, as in
    /// its socket buffers, until [`Simulation::resume`].
    pub fn pause(&mut self, address: &Address) {
        self.paused.entry(address.clone()).or_default();
    }

    /// Resumes a paused node (SIGCONT): its overdue timer fires first, then what reached it
    /// while it was stopped, in order.
    pub fn resume(&mut self, address: &Address) {
        let Some(mut held) = self.paused.remove(address) else {
            return;
        };
        // Stable: deliveries keep their order.
        held.sort_by_key(|item| !matches!(item, Scheduled::Tick(_)));
        for item in held {
            self.schedule(self.now, item);
        }
    }

    /// Runs until `until` returns true (checked after every step) or `max` simulated time
    /// passes; `check` is called after every step for invariants. Returns whether `until` held.
    pub fn run_until(
        &mut self,
        max: Duration,
        mut check: impl FnMut(&Simulation),
        mut until: impl FnMut(&Simulation) -> bool,
    ) -> bool {
        let deadline = self.now + max;
        while let Some(Reverse((at, seq))) = self.queue.pop() {
            if at > deadline {
                self.queue.push(Reverse((at, seq)));
                self.now = deadline;
                return until(self);
            }
            self.now = at;
            let Some(item) = self.scheduled.remove(&seq) else {
                continue;
            };
            let touched = self.step(item);
            if touched {
                check(self);
                if until(self) {
                    return true;
                }
            }
        }
        until(self)
    }

    /// Runs for `duration` of simulated time.
    pub fn run_for(&mut self, duration: Duration, check: impl FnMut(&Simulation)) {
        self.run_until(duration, check, |_| false);
    }

    fn schedule(&mut self, at: Instant, item: Scheduled) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.queue.push(Reverse((at, seq)));
        self.scheduled.insert(seq, item);
    }

    /// Processes one scheduled item; returns whether any node's state may have changed.
    fn step(&mut self, item: Scheduled) -> bool {
        let now = self.now;
        let target = match &item {
            Scheduled::Start(address) | Scheduled::Tick(address) => address,
            Scheduled::Deliver { to, .. } => to,
        };
        if let Some(held) = self.paused.get_mut(target) {
            held.push(item);
            return false;
        }
        let address = match item {
            Scheduled::Start(address) => {
                let Some(node) = self.nodes.get_mut(&address) else {
                    return false;
                };
                node.core.start(now);
                self.schedule(now + TICK_INTERVAL, Scheduled::Tick(address.clone()));
                address
            }
            Scheduled::Tick(address) => {
                let Some(node) = self.nodes.get_mut(&address) else {
                    return false;
                };
                if !node.is_running() {
                    return false;
                }
                node.core.tick(now);
                self.schedule(now + TICK_INTERVAL, Scheduled::Tick(address.clone()));
                address
            }
            Scheduled::Deliver { from, to, message } => {
                let Some(node) = self.nodes.get_mut(&to) else {
                    self.messages_dropped += 1;
                    return false;
                };
                if !node.is_running() {
                    self.messages_dropped += 1;
                    return false;
                }
                self.messages_delivered += 1;
                match message {
                    CoreMessage::Membership(m) => node.core.handle_membership(now, &from, m),
                    CoreMessage::Heartbeat(h) => node.core.handle_heartbeat(now, &from, h),
                }
                to
            }
        };
        self.flush(&address);
        true
    }

    /// Routes a node's outbox through the link faults and records its events; a node whose
    /// cluster life is over sends its last gossip and stops, as the real node does.
    fn flush(&mut self, address: &Address) {
        let now = self.now;
        let Some(node) = self.nodes.get_mut(address) else {
            return;
        };
        let from = node.core.self_node().clone();
        for event in node.core.take_events() {
            node.events.push((now, event));
        }
        if let Some(reason) = node.core.stop_reason(now) {
            node.core.gossip_to_all_reachable();
            node.stopped = Some(reason);
        }
        let outgoing = node.core.take_outbox();
        for out in outgoing {
            match self.faults.decide(address, &out.to) {
                LinkDecision::Drop => self.messages_dropped += 1,
                LinkDecision::Deliver { delay } => {
                    let latency = Duration::from_millis(
                        self.rng.random_range(self.latency_ms.0..=self.latency_ms.1),
                    );
                    self.schedule(
                        now + latency + delay,
                        Scheduled::Deliver {
                            from: from.clone(),
                            to: out.to,
                            message: out.message,
                        },
                    );
                }
            }
        }
    }

    // --- observations used by tests ------------------------------------------------------

    /// The statuses `observer` sees, by address.
    pub fn view(&self, observer: &Address) -> BTreeMap<Address, MemberStatus> {
        self.nodes[observer]
            .core
            .membership()
            .gossip()
            .members
            .values()
            .map(|m| (m.address().clone(), m.status))
            .collect()
    }

    /// True when every running node sees exactly `expected` members, all Up and reachable,
    /// with convergence and the same leader.
    pub fn all_up_and_converged(&self, expected: &BTreeSet<Address>) -> bool {
        let running = self.running();
        if running.iter().cloned().collect::<BTreeSet<_>>() != *expected {
            return false;
        }
        let mut leaders = BTreeSet::new();
        for address in &running {
            let membership = self.nodes[address].core.membership();
            let gossip = membership.gossip();
            let members: BTreeSet<Address> = gossip
                .members
                .values()
                .map(|m| m.address().clone())
                .collect();
            if &members != expected
                || gossip
                    .members
                    .values()
                    .any(|m| m.status != MemberStatus::Up)
                || !gossip.reachability.all_unreachable().is_empty()
                || !gossip.is_converged()
            {
                return false;
            }
            leaders.insert(membership.leader().cloned());
        }
        leaders.len() == 1
    }

    /// Running nodes among `side` that consider themselves the leader.
    pub fn self_proclaimed_leaders(&self, side: &BTreeSet<Address>) -> Vec<Address> {
        side.iter()
            .filter(|a| {
                self.nodes
                    .get(*a)
                    .is_some_and(|n| n.is_running() && n.core.membership().is_leader())
            })
            .cloned()
            .collect()
    }
}
