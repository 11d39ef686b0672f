//! Who monitors whom, and the state of the side that sends heartbeats.
//!
//! Each node sends a heartbeat request every `interval` to its `monitored_by` successors on a
//! ring of the members ordered by a stable hash, and feeds the responses into one
//! [`PhiAccrualFailureDetector`] per receiver. Every node computes the same ring, so every
//! member is watched by the same few neighbours wherever the computation runs (Akka's
//! `ClusterHeartbeatSender` and `HeartbeatNodeRing`).

use crate::address::UniqueAddress;
use crate::failure_detector::{
    FailureDetectorConfig, FailureDetectorConfigError, PhiAccrualFailureDetector,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::time::{Duration, Instant};

/// Position of a node on the ring: blake3 of its `Display` form (`host:port#uid`), then the
/// address itself to break (practically impossible) ties. Never Rust's randomized hasher:
/// every node must derive the same order.
fn ring_key(node: &UniqueAddress) -> ([u8; 32], UniqueAddress) {
    let hash = blake3::hash(node.to_string().as_bytes());
    (*hash.as_bytes(), node.clone())
}

/// The members ordered on a ring by a stable hash; decides which nodes monitor which.
///
/// Hash order rather than address order spreads a node's monitors across hosts and racks,
/// while staying identical on every node, which guarantees full coverage.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeartbeatNodeRing {
    ring: BTreeSet<([u8; 32], UniqueAddress)>,
}

impl HeartbeatNodeRing {
    /// A ring of the given nodes (duplicates collapse).
    pub fn new(nodes: impl IntoIterator<Item = UniqueAddress>) -> Self {
        Self {
            ring: nodes.into_iter().map(|n| ring_key(&n)).collect(),
        }
    }

    /// Number of nodes on the ring.
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    /// True when the ring has no node.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// True when `node` (this incarnation) is on the ring.
    pub fn contains(&self, node: &UniqueAddress) -> bool {
        self.ring.contains(&ring_key(node))
    }

    /// The nodes in ring order.
    pub fn nodes(&self) -> impl Iterator<Item = &UniqueAddress> {
        self.ring.iter().map(|(_, node)| node)
    }

    /// The nodes `of` sends heartbeats to: the next `monitored_by` reachable nodes after it
    /// in ring order (wrapping around, never `of` itself).
    ///
    /// Unreachable nodes met on the way are included as well, as long as fewer than
    /// `monitored_by` nodes have been picked, but do not count: an unreachable node stays
    /// watched (so it can be seen coming back) and the reachable coverage does not drop. This
    /// is Akka's rule; it also lets the leader keep its duties when many nodes stop at once.
    /// `of` need not be on the ring.
    pub fn receivers(
        &self,
        of: &UniqueAddress,
        monitored_by: usize,
        unreachable: &BTreeSet<UniqueAddress>,
    ) -> BTreeSet<UniqueAddress> {
        let start = ring_key(of);
        let after = self
            .ring
            .range((Bound::Excluded(start.clone()), Bound::Unbounded));
        let before = self.ring.range(..start);
        let mut picked = BTreeSet::new();
        let mut reachable_still_wanted = monitored_by;
        for (_, node) in after.chain(before) {
            if reachable_still_wanted == 0 {
                break;
            }
            if node == of {
                continue;
            }
            if unreachable.contains(node) {
                if picked.len() < monitored_by {
                    picked.insert(node.clone());
                }
            } else {
                picked.insert(node.clone());
                reachable_still_wanted -= 1;
            }
        }
        picked
    }
}

/// A heartbeat, sent every `interval` to each receiver; answered with a [`HeartbeatResponse`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatRequest {
    /// The sender's incarnation.
    pub from: UniqueAddress,
    /// Increases with every round of requests from this sender.
    pub sequence_nr: u64,
}

/// The answer to a [`HeartbeatRequest`]; its arrival is what the failure detector measures.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatResponse {
    /// The responder's incarnation; a response from another uid than the monitored one is
    /// ignored.
    pub from: UniqueAddress,
    /// Echo of the request's sequence number.
    pub sequence_nr: u64,
}

/// Settings of the heartbeat sender; the defaults are Akka's.
#[derive(Clone, Debug, PartialEq)]
pub struct HeartbeatConfig {
    /// Time between two rounds of heartbeat requests.
    pub interval: Duration,
    /// How many nodes monitor each node.
    pub monitored_by: usize,
    /// How long a new receiver may take to answer its first request before its failure
    /// detector is started anyway, so a node that never answers is still detected.
    pub expected_response_after: Duration,
    /// Failure detector used for each receiver.
    pub fd: FailureDetectorConfig,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            monitored_by: 5,
            expected_response_after: Duration::from_secs(1),
            fd: FailureDetectorConfig::default(),
        }
    }
}

/// A heartbeat setting outside its allowed range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeartbeatConfigError {
    /// A setting of the sender itself.
    #[error("invalid heartbeat setting {field} = {value}: {allowed}")]
    Invalid {
        /// Name of the offending field.
        field: &'static str,
        /// The value that was given, as text.
        value: String,
        /// What the field accepts.
        allowed: &'static str,
    },
    /// A setting of the failure detector (`fd.*`).
    #[error("invalid heartbeat setting fd.{} = {}: {}", .0.field, .0.value, .0.allowed)]
    FailureDetector(#[from] FailureDetectorConfigError),
}

impl HeartbeatConfig {
    /// Checks every field; the first offending one is named in the error.
    pub fn validate(&self) -> Result<(), HeartbeatConfigError> {
        let invalid = |field, value: String, allowed| {
            Err(HeartbeatConfigError::Invalid {
                field,
                value,
                allowed,
            })
        };
        if self.interval.is_zero() {
            return invalid(
                "interval",
                format!("{:?}", self.interval),
                "a duration > 0 (default 1s)",
            );
        }
        if self.monitored_by == 0 {
            return invalid(
                "monitored_by",
                self.monitored_by.to_string(),
                "an integer >= 1 (default 5)",
            );
        }
        if self.expected_response_after.is_zero() {
            return invalid(
                "expected_response_after",
                format!("{:?}", self.expected_response_after),
                "a duration > 0 (default 1s)",
            );
        }
        self.fd.validate()?;
        Ok(())
    }
}

/// What this node knows about one node it monitors.
#[derive(Clone, Debug)]
struct Watched {
    fd: PhiAccrualFailureDetector,
    /// When the first response is due; once passed without one, the detector starts anyway.
    first_response_due_at: Option<Instant>,
    /// The detector was started from a synthetic first heartbeat (no answer in time). A real
    /// answer then restarts it, so that the gap between the synthetic and the real first
    /// heartbeat never enters the interval history (it would inflate the deviation and delay
    /// detection for minutes).
    synthetic_start: bool,
    /// A new receiver is asked at the next tick rather than at the next round.
    first_request_pending: bool,
    /// Availability last handed out by `reachability_changes` (new receivers start available).
    reported_available: bool,
}

/// The sending side of heartbeating: whom to ask, when, and what the answers say.
///
/// Drive it with [`set_members`](Self::set_members) on membership or reachability changes,
/// [`tick`](Self::tick) for requests to send, [`on_response`](Self::on_response) for answers,
/// and [`reachability_changes`](Self::reachability_changes) for what to record in the
/// reachability table (this node as observer).
#[derive(Clone, Debug)]
pub struct HeartbeatSender {
    self_node: UniqueAddress,
    config: HeartbeatConfig,
    ring: HeartbeatNodeRing,
    /// This node's receivers on the current ring.
    ring_receivers: BTreeSet<UniqueAddress>,
    /// Every node heartbeated: the ring receivers plus former receivers that were unavailable
    /// when they left the receiver set (kept until seen available again, as Akka does, so
    /// their reachability can be restored).
    watched: BTreeMap<UniqueAddress, Watched>,
    sequence_nr: u64,
    next_round_at: Option<Instant>,
}

impl HeartbeatSender {
    /// A sender for `self_node` that monitors nobody until [`set_members`](Self::set_members).
    pub fn new(
        self_node: UniqueAddress,
        config: HeartbeatConfig,
    ) -> Result<Self, HeartbeatConfigError> {
        config.validate()?;
        Ok(Self {
            ring: HeartbeatNodeRing::new([self_node.clone()]),
            self_node,
            config,
            ring_receivers: BTreeSet::new(),
            watched: BTreeMap::new(),
            sequence_nr: 0,
            next_round_at: None,
        })
    }

    /// This node's incarnation.
    pub fn self_node(&self) -> &UniqueAddress {
        &self.self_node
    }

    /// The current ring (always contains this node).
    pub fn ring(&self) -> &HeartbeatNodeRing {
        &self.ring
    }

    /// Every node currently heartbeated.
    pub fn active_receivers(&self) -> impl Iterator<Item = &UniqueAddress> {
        self.watched.keys()
    }

    /// Replaces the members eligible for monitoring (the caller passes the non-removed
    /// members; this node is added if missing) and the nodes unreachable in the cluster's view.
    ///
    /// New receivers start as available; a receiver that is no longer one is forgotten if it
    /// is available, and kept watched until it is otherwise. A node no longer on the ring is
    /// forgotten without a reachability change.
    pub fn set_members(
        &mut self,
        nodes: BTreeSet<UniqueAddress>,
        unreachable: &BTreeSet<UniqueAddress>,
        now: Instant,
    ) {
        self.advance(now);
        let mut ring_nodes = nodes;
        ring_nodes.insert(self.self_node.clone());
        self.ring = HeartbeatNodeRing::new(ring_nodes);
        self.ring_receivers =
            self.ring
                .receivers(&self.self_node, self.config.monitored_by, unreachable);
        let ring = &self.ring;
        self.watched.retain(|node, _| ring.contains(node));
        for node in &self.ring_receivers {
            if !self.watched.contains_key(node) {
                // Validated in `new`; a fresh detector cannot fail.
                let Ok(fd) = PhiAccrualFailureDetector::new(self.config.fd.clone()) else {
                    continue;
                };
                // The deadline for a first answer counts from now, not from the next round,
                // so a node that dies right after joining is detected as fast as any other.
                self.watched.insert(
                    node.clone(),
                    Watched {
                        fd,
                        first_response_due_at: Some(
                            now.checked_add(self.config.expected_response_after)
                                .unwrap_or(now),
                        ),
                        first_request_pending: true,
                        synthetic_start: false,
                        reported_available: true,
                    },
                );
            }
        }
        self.retire_former_receivers(now);
    }

    /// The heartbeat requests due at `now`: one per active receiver every `interval`, nothing
    /// in between. Calling it more often than `interval` is fine; a late call sends one round,
    /// not a burst.
    pub fn tick(&mut self, now: Instant) -> Vec<(UniqueAddress, HeartbeatRequest)> {
        self.advance(now);
        let round_due = self.next_round_at.is_none_or(|due| now >= due);
        if !round_due && !self.watched.values().any(|w| w.first_request_pending) {
            return Vec::new();
        }
        if round_due {
            let interval = self.config.interval;
            // `None` only if `now + interval` overflows `Instant`; then every call sends a round.
            self.next_round_at = self
                .next_round_at
                .and_then(|due| due.checked_add(interval))
                .filter(|next| *next > now)
                .or_else(|| now.checked_add(interval));
        }
        self.sequence_nr = self.sequence_nr.wrapping_add(1);
        let request = HeartbeatRequest {
            from: self.self_node.clone(),
            sequence_nr: self.sequence_nr,
        };
        self.watched
            .iter_mut()
            .filter(|(_, watched)| round_due || watched.first_request_pending)
            .map(|(node, watched)| {
                watched.first_request_pending = false;
                (node.clone(), request.clone())
            })
            .collect()
    }

    /// Feeds a response that arrived at `now` from `from` (the transport's authenticated
    /// peer). Ignored unless `from` is an active receiver and the response names the same
    /// incarnation.
    pub fn on_response(&mut self, from: &UniqueAddress, rsp: HeartbeatResponse, now: Instant) {
        self.advance(now);
        if rsp.from != *from {
            return;
        }
        if let Some(watched) = self.watched.get_mut(from) {
            if watched.synthetic_start {
                watched.synthetic_start = false;
                if let Ok(fresh) = PhiAccrualFailureDetector::new(self.config.fd.clone()) {
                    watched.fd = fresh;
                }
            }
            watched.fd.heartbeat(now);
        }
    }

    /// The answer this node sends for a heartbeat request it received.
    pub fn heartbeat_request_received(&self, req: &HeartbeatRequest) -> HeartbeatResponse {
        HeartbeatResponse {
            from: self.self_node.clone(),
            sequence_nr: req.sequence_nr,
        }
    }

    /// Availability changes of watched nodes since the previous call, as
    /// `(node, available)`, each reported once; the caller records them in the reachability
    /// table with this node as observer.
    pub fn reachability_changes(&mut self, now: Instant) -> Vec<(UniqueAddress, bool)> {
        self.advance(now);
        let mut changes = Vec::new();
        for (node, watched) in &mut self.watched {
            let available = watched.fd.is_available(now);
            if available != watched.reported_available {
                watched.reported_available = available;
                changes.push((node.clone(), available));
            }
        }
        self.retire_former_receivers(now);
        changes
    }

    /// Whether `node` is watched and its detector says available at `now` (`None` when not
    /// watched).
    pub fn is_available(&self, node: &UniqueAddress, now: Instant) -> Option<bool> {
        self.watched.get(node).map(|w| w.fd.is_available(now))
    }

    /// Starts the detector of every receiver whose first response is overdue, as if that
    /// response had arrived when it was due (Akka's `ExpectedFirstHeartbeat`), so that a node
    /// that never answers still becomes unavailable after the acceptable pause. Using the due
    /// time, not `now`, keeps detection independent of how often the caller polls.
    fn advance(&mut self, now: Instant) {
        for watched in self.watched.values_mut() {
            if let Some(due) = watched.first_response_due_at
                && now >= due
            {
                watched.first_response_due_at = None;
                if !watched.fd.is_monitoring() {
                    watched.fd.heartbeat(due);
                    watched.synthetic_start = true;
                }
            }
        }
    }

    /// Stops watching former receivers once they are available and reported as such.
    fn retire_former_receivers(&mut self, now: Instant) {
        let ring_receivers = &self.ring_receivers;
        self.watched.retain(|node, watched| {
            ring_receivers.contains(node)
                || !(watched.reported_available && watched.fd.is_available(now))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::Address;

    fn node(i: u16) -> UniqueAddress {
        UniqueAddress::new(Address::new("10.0.0.1", 25520 + i), 1000 + u64::from(i))
    }

    fn nodes(n: u16) -> BTreeSet<UniqueAddress> {
        (0..n).map(node).collect()
    }

    #[test]
    fn ring_receivers_are_identical_whatever_order_the_ring_was_built_in() {
        let members: Vec<_> = nodes(12).into_iter().collect();
        let reversed: Vec<_> = members.iter().rev().cloned().collect();
        let ring_a = HeartbeatNodeRing::new(members.clone());
        let ring_b = HeartbeatNodeRing::new(reversed);
        assert_eq!(ring_a, ring_b);
        let unreachable = BTreeSet::from([node(3), node(7)]);
        for m in &members {
            assert_eq!(
                ring_a.receivers(m, 5, &unreachable),
                ring_b.receivers(m, 5, &unreachable)
            );
        }
    }

    #[test]
    fn ring_order_is_blake3_of_display_form_and_pinned() {
        // Pinned: if this changes, nodes of different versions disagree on who monitors whom.
        let ring = HeartbeatNodeRing::new(nodes(4));
        let order: Vec<u16> = ring.nodes().map(|n| n.address.port - 25520).collect();
        assert_eq!(order, vec![1, 2, 0, 3]);
        let key = blake3::hash(b"10.0.0.1:25520#1000");
        assert_eq!(ring_key(&node(0)).0, *key.as_bytes());
    }

    #[test]
    fn every_node_is_monitored_by_min_of_monitored_by_and_n_minus_1() {
        for n in 1..=12u16 {
            for monitored_by in 1..=6usize {
                let ring = HeartbeatNodeRing::new(nodes(n));
                let mut monitors: BTreeMap<UniqueAddress, usize> = BTreeMap::new();
                for m in ring.nodes() {
                    let receivers = ring.receivers(m, monitored_by, &BTreeSet::new());
                    assert!(!receivers.contains(m));
                    assert_eq!(receivers.len(), monitored_by.min(n as usize - 1));
                    for r in receivers {
                        *monitors.entry(r).or_default() += 1;
                    }
                }
                for m in ring.nodes() {
                    let count = monitors.get(m).copied().unwrap_or(0);
                    assert_eq!(count, monitored_by.min(n as usize - 1), "n={n} {m}");
                }
            }
        }
    }

    #[test]
    fn unreachable_receivers_stay_watched_and_reachable_coverage_holds() {
        let ring = HeartbeatNodeRing::new(nodes(10));
        let me = node(0);
        let normal = ring.receivers(&me, 3, &BTreeSet::new());
        let first_unreachable = normal.iter().next().unwrap().clone();
        let unreachable = BTreeSet::from([first_unreachable.clone()]);
        let with_unreachable = ring.receivers(&me, 3, &unreachable);
        assert!(with_unreachable.contains(&first_unreachable));
        assert_eq!(
            with_unreachable
                .iter()
                .filter(|r| !unreachable.contains(*r))
                .count(),
            3
        );
        assert_eq!(with_unreachable.len(), 4);
    }

    #[test]
    fn receivers_when_everyone_else_is_unreachable() {
        let ring = HeartbeatNodeRing::new(nodes(8));
        let me = node(0);
        let unreachable: BTreeSet<_> = nodes(8).into_iter().filter(|n| *n != me).collect();
        let receivers = ring.receivers(&me, 3, &unreachable);
        assert_eq!(receivers.len(), 3);
        assert!(!receivers.contains(&me));
    }

    struct Harness {
        t: Instant,
        sender: HeartbeatSender,
        silent: BTreeSet<UniqueAddress>,
        changes: Vec<(UniqueAddress, bool)>,
    }

    impl Harness {
        fn new(n: u16) -> Self {
            let t = Instant::now();
            let mut sender = HeartbeatSender::new(node(0), HeartbeatConfig::default()).unwrap();
            sender.set_members(nodes(n), &BTreeSet::new(), t);
            Self {
                t,
                sender,
                silent: BTreeSet::new(),
                changes: Vec::new(),
            }
        }

        /// Runs in 100 ms steps: ticks, answers from non-silent receivers after 10 ms.
        fn run_for(&mut self, duration: Duration) {
            let end = self.t + duration;
            while self.t < end {
                let requests = self.sender.tick(self.t);
                let answer_at = self.t + Duration::from_millis(10);
                for (to, req) in requests {
                    if self.silent.contains(&to) {
                        continue;
                    }
                    let rsp = HeartbeatResponse {
                        from: to.clone(),
                        sequence_nr: req.sequence_nr,
                    };
                    self.sender.on_response(&to, rsp, answer_at);
                }
                self.t += Duration::from_millis(100);
                self.changes
                    .extend(self.sender.reachability_changes(self.t));
            }
        }
    }

    #[test]
    fn sends_one_request_per_receiver_each_interval() {
        let t = Instant::now();
        let mut sender = HeartbeatSender::new(node(0), HeartbeatConfig::default()).unwrap();
        sender.set_members(nodes(10), &BTreeSet::new(), t);
        let receivers: BTreeSet<_> = sender.active_receivers().cloned().collect();
        assert_eq!(receivers.len(), 5);
        let mut sent = 0;
        for ms in (0..10_000).step_by(250) {
            let requests = sender.tick(t + Duration::from_millis(ms));
            for (to, req) in &requests {
                assert!(receivers.contains(to));
                assert_eq!(req.from, node(0));
            }
            sent += requests.len();
        }
        assert_eq!(sent, 10 * 5);
    }

    #[test]
    fn new_receiver_is_asked_at_the_next_tick_not_the_next_round() {
        let t = Instant::now();
        let mut sender = HeartbeatSender::new(node(0), HeartbeatConfig::default()).unwrap();
        sender.set_members(nodes(3), &BTreeSet::new(), t);
        assert_eq!(sender.tick(t).len(), 2);
        let later = t + Duration::from_millis(300);
        sender.set_members(nodes(4), &BTreeSet::new(), later);
        let requests = sender.tick(later + Duration::from_millis(100));
        let to: Vec<_> = requests.into_iter().map(|(to, _)| to).collect();
        assert_eq!(
            to,
            vec![node(3)],
            "only the new receiver, before the round is due"
        );
        assert!(sender.tick(later + Duration::from_millis(200)).is_empty());
        assert_eq!(sender.tick(t + Duration::from_secs(1)).len(), 3);
    }

    #[test]
    fn answering_receivers_stay_available() {
        let mut h = Harness::new(8);
        h.run_for(Duration::from_secs(60));
        assert!(h.changes.is_empty(), "{:?}", h.changes);
    }

    #[test]
    fn silent_receiver_becomes_unavailable_then_available_once_each_way() {
        let mut h = Harness::new(8);
        h.run_for(Duration::from_secs(10));
        let victim = h.sender.active_receivers().next().unwrap().clone();
        h.silent.insert(victim.clone());
        h.run_for(Duration::from_secs(7));
        assert_eq!(h.changes, vec![(victim.clone(), false)]);
        h.run_for(Duration::from_secs(20));
        assert_eq!(
            h.changes,
            vec![(victim.clone(), false)],
            "no duplicate report"
        );
        h.silent.clear();
        h.run_for(Duration::from_secs(3));
        assert_eq!(h.changes, vec![(victim.clone(), false), (victim, true)]);
        h.run_for(Duration::from_secs(30));
        assert_eq!(h.changes.len(), 2);
    }

    #[test]
    fn receiver_that_never_answers_is_detected() {
        let mut h = Harness::new(8);
        let victim = h.sender.active_receivers().next().unwrap().clone();
        h.silent.insert(victim.clone());
        // First request at 0, detector started at 1 s, acceptable pause 3 s, detected ~6.3 s.
        h.run_for(Duration::from_secs(8));
        assert_eq!(h.changes, vec![(victim, false)]);
    }

    /// When `victim` was reported unavailable, in ms from the harness start: the victim
    /// stays silent for its first `first_silence_ms`, answers until 4.5 s, then goes silent.
    fn detection_ms(first_silence_ms: u64) -> u128 {
        let mut h = Harness::new(4);
        let start = h.t;
        let victim = h.sender.active_receivers().next().unwrap().clone();
        h.silent.insert(victim.clone());
        h.run_for(Duration::from_millis(first_silence_ms));
        h.silent.clear();
        h.run_for(Duration::from_millis(4500 - first_silence_ms));
        h.silent.insert(victim.clone());
        while h.changes.is_empty() && h.t < start + Duration::from_secs(20) {
            h.run_for(Duration::from_millis(100));
        }
        assert_eq!(h.changes, vec![(victim, false)]);
        (h.t - start).as_millis()
    }

    #[test]
    fn late_first_answer_does_not_delay_detection() {
        // Without restarting the detector on the first real answer, the synthetic start at
        // 1 s and the real answer 10 ms later record a 10 ms interval, which inflates the
        // deviation and delays detection by well over a second.
        let prompt = detection_ms(0);
        let late = detection_ms(500);
        assert!(
            late <= prompt + 200,
            "late first answer detected at {late} ms, prompt one at {prompt} ms"
        );
    }

    #[test]
    fn response_from_another_incarnation_is_ignored() {
        let mut h = Harness::new(4);
        let victim = h.sender.active_receivers().next().unwrap().clone();
        h.silent.insert(victim.clone());
        let impostor = UniqueAddress::new(victim.address.clone(), victim.uid + 1);
        for s in 0..20u64 {
            h.run_for(Duration::from_millis(500));
            let rsp = HeartbeatResponse {
                from: impostor.clone(),
                sequence_nr: s,
            };
            h.sender.on_response(&impostor, rsp.clone(), h.t);
            // A response claiming another uid than the authenticated peer is ignored too.
            h.sender.on_response(&victim, rsp, h.t);
        }
        assert_eq!(h.changes, vec![(victim, false)]);
    }

    #[test]
    fn node_removed_from_ring_is_forgotten_without_report() {
        let mut h = Harness::new(8);
        h.run_for(Duration::from_secs(5));
        let victim = h.sender.active_receivers().next().unwrap().clone();
        h.silent.insert(victim.clone());
        h.run_for(Duration::from_secs(2));
        let remaining: BTreeSet<_> = nodes(8).into_iter().filter(|n| *n != victim).collect();
        h.sender.set_members(remaining, &BTreeSet::new(), h.t);
        h.run_for(Duration::from_secs(20));
        assert!(h.changes.is_empty(), "{:?}", h.changes);
        assert!(h.sender.active_receivers().all(|r| *r != victim));
        assert_eq!(h.sender.active_receivers().count(), 5);
    }

    #[test]
    fn unreachable_former_receiver_is_watched_until_it_comes_back() {
        let mut h = Harness::new(8);
        h.run_for(Duration::from_secs(5));
        let victim = h.sender.active_receivers().next().unwrap().clone();
        h.silent.insert(victim.clone());
        h.run_for(Duration::from_secs(10));
        assert_eq!(h.changes, vec![(victim.clone(), false)]);
        // New members join so that the victim is no longer one of this node's receivers.
        let unreachable = BTreeSet::from([victim.clone()]);
        let (members, ring_receivers) = (9..200)
            .map(|n| {
                let ring = HeartbeatNodeRing::new(nodes(n));
                (nodes(n), ring.receivers(&node(0), 5, &unreachable))
            })
            .find(|(_, receivers)| !receivers.contains(&victim))
            .unwrap();
        h.sender.set_members(members, &unreachable, h.t);
        assert!(h.sender.active_receivers().any(|r| *r == victim));
        h.run_for(Duration::from_secs(10));
        assert!(h.sender.active_receivers().any(|r| *r == victim));
        h.silent.clear();
        h.run_for(Duration::from_secs(3));
        assert_eq!(h.changes, vec![(victim.clone(), false), (victim, true)]);
        let active: BTreeSet<_> = h.sender.active_receivers().cloned().collect();
        assert_eq!(active, ring_receivers);
    }

    #[test]
    fn invalid_settings_are_named_in_the_error() {
        let bad = HeartbeatConfig {
            monitored_by: 0,
            ..HeartbeatConfig::default()
        };
        let err = HeartbeatSender::new(node(0), bad).unwrap_err();
        assert!(err.to_string().contains("monitored_by"), "{err}");
        let bad = HeartbeatConfig {
            fd: FailureDetectorConfig {
                threshold: -1.0,
                ..FailureDetectorConfig::default()
            },
            ..HeartbeatConfig::default()
        };
        let err = HeartbeatSender::new(node(0), bad).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid heartbeat setting fd.threshold = -1: a finite number > 0 (default 8.0)"
        );
    }

    #[test]
    fn messages_round_trip_through_postcard() {
        let req = HeartbeatRequest {
            from: node(1),
            sequence_nr: 42,
        };
        let bytes = postcard::to_allocvec(&req).unwrap();
        assert_eq!(
            postcard::from_bytes::<HeartbeatRequest>(&bytes).unwrap(),
            req
        );
        let sender = HeartbeatSender::new(node(2), HeartbeatConfig::default()).unwrap();
        let rsp = sender.heartbeat_request_received(&req);
        assert_eq!(rsp.from, node(2));
        assert_eq!(rsp.sequence_nr, 42);
        let bytes = postcard::to_allocvec(&rsp).unwrap();
        assert_eq!(
            postcard::from_bytes::<HeartbeatResponse>(&bytes).unwrap(),
            rsp
        );
    }
}
