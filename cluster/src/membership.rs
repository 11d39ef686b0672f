//! The membership state machine: joining, gossip, convergence and the leader's actions.
//!
//! It reads no clock and opens no socket: every input carries `now`, and what must be sent is
//! collected in an outbox the caller drains ([`Membership::take_outbox`]). Events for
//! subscribers are collected the same way ([`Membership::take_events`]).

use crate::address::{Address, UniqueAddress};
use crate::events::{self, ClusterEvent};
use crate::gossip::Gossip;
use crate::member::{Member, MemberStatus};
use crate::reachability::ReachabilityStatus;
use crate::vclock::{VectorClock, VersionOrdering};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Settings of the membership protocol (cluster specification; Akka's defaults).
#[derive(Clone, Debug)]
pub struct MembershipConfig {
    pub roles: BTreeSet<String>,
    pub app_version: String,
    /// Seed nodes to join through; empty means "wait for a manual join".
    pub seed_nodes: Vec<Address>,
    /// How long the first seed waits for another seed to answer before joining itself.
    pub seed_node_timeout: Duration,
    /// How often InitJoin is re-sent to the seeds while nobody has answered.
    pub init_join_retry_interval: Duration,
    /// A Join not answered by a Welcome within this time is started over.
    pub retry_unsuccessful_join_after: Duration,
    pub gossip_interval: Duration,
    /// Joining members become WeaklyUp after this long without convergence; None disables.
    pub allow_weakly_up_after: Option<Duration>,
    /// Probability of preferring a peer that has not seen the current version.
    pub gossip_different_view_probability: f64,
    /// Above this many members the preference above is reduced, to spread load.
    pub reduce_gossip_different_view_probability: usize,
    /// How long removed incarnations are remembered.
    pub tombstone_retention: Duration,
}

impl Default for MembershipConfig {
    fn default() -> Self {
        Self {
            roles: BTreeSet::new(),
            app_version: env!("CARGO_PKG_VERSION").to_string(),
            seed_nodes: Vec::new(),
            seed_node_timeout: Duration::from_secs(5),
            init_join_retry_interval: Duration::from_secs(1),
            retry_unsuccessful_join_after: Duration::from_secs(5),
            gossip_interval: Duration::from_secs(1),
            allow_weakly_up_after: Some(Duration::from_secs(7)),
            gossip_different_view_probability: 0.8,
            reduce_gossip_different_view_probability: 400,
            tombstone_retention: Duration::from_secs(24 * 3600),
        }
    }
}

/// Messages of the membership service. The sender's identity comes from the transport.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum MembershipMessage {
    /// "Is there a cluster at this seed?"
    InitJoin,
    /// "Yes: join me at this address."
    InitJoinAck { address: Address },
    /// "Not (yet) a member myself."
    InitJoinNack { address: Address },
    Join {
        node: UniqueAddress,
        roles: BTreeSet<String>,
        app_version: String,
    },
    /// The answer to a Join: the current gossip, which contains the joiner.
    Welcome { gossip: Gossip },
    /// Full state, addressed to one incarnation so that an older one ignores it.
    Gossip { to: UniqueAddress, gossip: Gossip },
    /// Version only, sent instead of the full state when the receiver has seen it.
    GossipStatus {
        version: VectorClock,
        seen: BTreeSet<UniqueAddress>,
    },
    /// The sender has seen itself Exiting and may be removed.
    ExitingConfirmed,
}

/// A message the caller must send.
#[derive(Clone, Debug, PartialEq)]
pub struct Outgoing {
    pub to: Address,
    pub message: MembershipMessage,
}

/// Why an operator command was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    #[error("no member at address {0}")]
    UnknownMember(Address),
    #[error("this node is not a member of a cluster yet")]
    NotAMember,
    #[error("this node is already a member of a cluster; leave it before joining another")]
    AlreadyMember,
}

/// Counters for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MembershipStats {
    pub gossip_sent: u64,
    pub gossip_status_sent: u64,
    pub gossip_received: u64,
    pub gossip_status_received: u64,
    pub gossip_merges: u64,
}

#[derive(Clone, Debug)]
enum JoinProgress {
    /// No seeds configured and no manual join yet.
    Idle,
    /// Asking the seeds; the first seed joins itself at `self_join_at`.
    Seeding {
        next_init_join: Instant,
        self_join_at: Option<Instant>,
    },
    /// Sent Join to `target`, waiting for Welcome.
    Joining {
        target: Address,
        since: Instant,
    },
    Member,
}

/// The membership protocol of one node.
pub struct Membership {
    self_node: UniqueAddress,
    config: MembershipConfig,
    latest: Gossip,
    join: JoinProgress,
    rng: SmallRng,
    next_gossip_at: Instant,
    leader: Option<UniqueAddress>,
    /// When this node first saw each currently Joining member (for WeaklyUp).
    joining_since: BTreeMap<UniqueAddress, Instant>,
    exiting_confirmed: BTreeSet<UniqueAddress>,
    /// Set once this node has learnt it was removed (its own tombstone).
    self_removed: bool,
    start: Instant,
    start_wall_ms: u64,
    outbox: Vec<Outgoing>,
    events: Vec<ClusterEvent>,
    stats: MembershipStats,
}

impl Membership {
    /// A node that is not yet a member. `start_wall_ms` is the wall-clock time at `now`
    /// (tombstones carry wall time so that their retention survives restarts of others).
    pub fn new(
        self_node: UniqueAddress,
        config: MembershipConfig,
        rng_seed: u64,
        now: Instant,
        start_wall_ms: u64,
    ) -> Self {
        Self {
            self_node,
            config,
            latest: Gossip::default(),
            join: JoinProgress::Idle,
            rng: SmallRng::seed_from_u64(rng_seed),
            next_gossip_at: now,
            leader: None,
            joining_since: BTreeMap::new(),
            exiting_confirmed: BTreeSet::new(),
            self_removed: false,
            start: now,
            start_wall_ms,
            outbox: Vec::new(),
            events: Vec::new(),
            stats: MembershipStats::default(),
        }
    }

    pub fn self_node(&self) -> &UniqueAddress {
        &self.self_node
    }

    pub fn gossip(&self) -> &Gossip {
        &self.latest
    }

    pub fn leader(&self) -> Option<&UniqueAddress> {
        self.leader.as_ref()
    }

    pub fn is_leader(&self) -> bool {
        self.leader.as_ref() == Some(&self.self_node)
    }

    pub fn stats(&self) -> MembershipStats {
        self.stats
    }

    pub fn config(&self) -> &MembershipConfig {
        &self.config
    }

    /// This node's own status; `Removed` once it learnt of its removal, None before joining.
    pub fn self_status(&self) -> Option<MemberStatus> {
        if self.self_removed {
            return Some(MemberStatus::Removed);
        }
        self.latest.member(&self.self_node).map(|m| m.status)
    }

    pub fn is_member(&self) -> bool {
        matches!(self.join, JoinProgress::Member) && !self.self_removed
    }

    pub fn take_outbox(&mut self) -> Vec<Outgoing> {
        std::mem::take(&mut self.outbox)
    }

    pub fn take_events(&mut self) -> Vec<ClusterEvent> {
        std::mem::take(&mut self.events)
    }

    /// Starts joining through the configured seed nodes (no-op without seeds).
    pub fn start(&mut self, now: Instant) {
        if self.config.seed_nodes.is_empty() || !matches!(self.join, JoinProgress::Idle) {
            return;
        }
        let is_first_seed = self.config.seed_nodes.first() == Some(&self.self_node.address);
        let other_seeds = self.other_seeds().count();
        if is_first_seed && other_seeds == 0 {
            self.join_self(now);
            return;
        }
        self.join = JoinProgress::Seeding {
            next_init_join: now,
            self_join_at: is_first_seed.then(|| now + self.config.seed_node_timeout),
        };
        self.tick(now);
    }

    /// Joins the node at `address` (or forms a new cluster when it is this node's address).
    pub fn join(&mut self, now: Instant, address: Address) -> Result<(), MembershipError> {
        if self.is_member() {
            return Err(MembershipError::AlreadyMember);
        }
        if address == self.self_node.address {
            self.join_self(now);
        } else {
            self.send_join(now, address);
        }
        Ok(())
    }

    /// Marks the member at `address` Leaving; the leader moves it on to Exiting and Removed.
    pub fn leave(&mut self, now: Instant, address: &Address) -> Result<(), MembershipError> {
        let node = self.member_at(address)?;
        self.change_status(now, &BTreeSet::from([node]), MemberStatus::Leaving);
        Ok(())
    }

    /// Marks the member at `address` Down (operator decision).
    pub fn down(&mut self, now: Instant, address: &Address) -> Result<(), MembershipError> {
        let node = self.member_at(address)?;
        self.change_status(now, &BTreeSet::from([node]), MemberStatus::Down);
        Ok(())
    }

    /// Downs the given incarnations (a split-brain resolver decision).
    pub fn down_nodes(&mut self, now: Instant, nodes: &BTreeSet<UniqueAddress>) {
        self.change_status(now, nodes, MemberStatus::Down);
    }

    /// Records this node's failure-detector verdict on `subject`.
    pub fn set_reachability(&mut self, now: Instant, subject: &UniqueAddress, reachable: bool) {
        if !self.is_member() || subject == &self.self_node || !self.latest.has_member(subject) {
            return;
        }
        let status = if reachable {
            ReachabilityStatus::Reachable
        } else {
            ReachabilityStatus::Unreachable
        };
        let mut next = self.latest.clone();
        if next.reachability.set(&self.self_node, subject, status) {
            self.commit_change(now, next);
        }
    }

    /// Sends the full state to every reachable member: used before shutting down so that a
    /// decision this node just made (a leave, a self-down) is not lost with it.
    pub fn gossip_to_all_reachable(&mut self) {
        for target in self.gossip_candidates() {
            self.send_gossip(&target);
        }
    }

    pub fn handle(&mut self, now: Instant, from: &UniqueAddress, message: MembershipMessage) {
        match message {
            MembershipMessage::InitJoin => self.on_init_join(from),
            MembershipMessage::InitJoinAck { address } => {
                if matches!(self.join, JoinProgress::Seeding { .. }) {
                    self.send_join(now, address);
                }
            }
            MembershipMessage::InitJoinNack { .. } => {
                // The seed runs but is not Up yet (typically it is forming the cluster right
                // now): ask again soon rather than a full retry interval later.
                if let JoinProgress::Seeding {
                    next_init_join,
                    self_join_at,
                } = self.join
                {
                    let soon = now + self.config.init_join_retry_interval / 5;
                    self.join = JoinProgress::Seeding {
                        next_init_join: next_init_join.min(soon),
                        self_join_at,
                    };
                }
            }
            MembershipMessage::Join {
                node,
                roles,
                app_version,
            } => self.on_join(now, node, roles, app_version),
            MembershipMessage::Welcome { gossip } => self.on_welcome(now, from, gossip),
            MembershipMessage::Gossip { to, gossip } => self.on_gossip(now, from, &to, gossip),
            MembershipMessage::GossipStatus { version, seen } => {
                self.on_gossip_status(from, &version, &seen)
            }
            MembershipMessage::ExitingConfirmed => {
                if self.latest.has_member(from) {
                    self.exiting_confirmed.insert(from.clone());
                }
            }
        }
    }

    /// Drives timers: the seed process, join retries, gossip rounds and leader actions.
    pub fn tick(&mut self, now: Instant) {
        match self.join.clone() {
            JoinProgress::Idle | JoinProgress::Member => {}
            JoinProgress::Seeding {
                next_init_join,
                self_join_at,
            } => {
                if self_join_at.is_some_and(|at| now >= at) {
                    self.join_self(now);
                } else if now >= next_init_join {
                    let seeds: Vec<Address> = self.other_seeds().cloned().collect();
                    for seed in seeds {
                        self.send(seed, MembershipMessage::InitJoin);
                    }
                    self.join = JoinProgress::Seeding {
                        next_init_join: now + self.config.init_join_retry_interval,
                        self_join_at,
                    };
                }
            }
            JoinProgress::Joining { target, since } => {
                if now.saturating_duration_since(since) >= self.config.retry_unsuccessful_join_after
                {
                    if self.config.seed_nodes.is_empty() {
                        self.send_join(now, target);
                    } else {
                        self.join = JoinProgress::Idle;
                        self.start(now);
                    }
                }
            }
        }
        if !self.is_member() {
            return;
        }
        if now >= self.next_gossip_at {
            self.gossip_round();
            let interval = if self.is_gossip_speedup_needed() {
                self.config.gossip_interval / 3
            } else {
                self.config.gossip_interval
            };
            self.next_gossip_at = now + interval;
        }
        if self.is_leader() {
            if self.latest.is_converged() {
                self.leader_actions_on_convergence(now);
            } else {
                self.move_joining_to_weakly_up(now);
            }
        }
        let retention_ms =
            u64::try_from(self.config.tombstone_retention.as_millis()).unwrap_or(u64::MAX);
        let wall = self.wall_ms(now);
        if self
            .latest
            .tombstones
            .values()
            .any(|&at| wall.saturating_sub(at) >= retention_ms)
        {
            self.latest.prune_tombstones(wall, retention_ms);
        }
    }

    // --- joining -----------------------------------------------------------------------

    fn other_seeds(&self) -> impl Iterator<Item = &Address> {
        self.config
            .seed_nodes
            .iter()
            .filter(|a| **a != self.self_node.address)
    }

    fn join_self(&mut self, now: Instant) {
        let mut gossip = Gossip::default();
        gossip.members.insert(
            self.self_node.clone(),
            Member::joining(
                self.self_node.clone(),
                self.config.roles.clone(),
                self.config.app_version.clone(),
            ),
        );
        self.join = JoinProgress::Member;
        self.commit_change(now, gossip);
    }

    fn send_join(&mut self, now: Instant, target: Address) {
        self.join = JoinProgress::Joining {
            target: target.clone(),
            since: now,
        };
        self.send(
            target,
            MembershipMessage::Join {
                node: self.self_node.clone(),
                roles: self.config.roles.clone(),
                app_version: self.config.app_version.clone(),
            },
        );
    }

    fn on_init_join(&mut self, from: &UniqueAddress) {
        let address = self.self_node.address.clone();
        let reply = match self.self_status() {
            Some(MemberStatus::Up | MemberStatus::WeaklyUp) => {
                MembershipMessage::InitJoinAck { address }
            }
            _ => MembershipMessage::InitJoinNack { address },
        };
        self.send(from.address.clone(), reply);
    }

    fn on_join(
        &mut self,
        now: Instant,
        node: UniqueAddress,
        roles: BTreeSet<String>,
        app_version: String,
    ) {
        if !matches!(
            self.self_status(),
            Some(MemberStatus::Up | MemberStatus::WeaklyUp)
        ) || node.address == self.self_node.address
            || self.latest.tombstones.contains_key(&node)
        {
            return;
        }
        if self.latest.has_member(&node) {
            // A retried Join whose Welcome was lost.
            self.send_welcome(&node);
            return;
        }
        if let Some(old) = self.latest.member_by_address(&node.address).cloned() {
            // A restarted node: its old incarnation is downed, and the new one is let in once
            // the old is removed (the joiner retries), so one address never holds two members.
            if old.status != MemberStatus::Down {
                self.change_status(
                    now,
                    &BTreeSet::from([old.unique_address.clone()]),
                    MemberStatus::Down,
                );
            }
            return;
        }
        let mut next = self.latest.clone();
        next.members.insert(
            node.clone(),
            Member::joining(node.clone(), roles, app_version),
        );
        self.commit_change(now, next);
        self.send_welcome(&node);
    }

    fn send_welcome(&mut self, node: &UniqueAddress) {
        let gossip = self.latest.clone();
        self.send(node.address.clone(), MembershipMessage::Welcome { gossip });
    }

    fn on_welcome(&mut self, now: Instant, from: &UniqueAddress, gossip: Gossip) {
        if self.is_member() || self.self_removed || !gossip.has_member(&self.self_node) {
            return;
        }
        self.join = JoinProgress::Member;
        let mut next = gossip;
        next.seen.insert(self.self_node.clone());
        self.replace_latest(now, next);
        self.send_status(from);
    }

    // --- gossip ------------------------------------------------------------------------

    fn on_gossip(
        &mut self,
        now: Instant,
        from: &UniqueAddress,
        to: &UniqueAddress,
        remote: Gossip,
    ) {
        self.stats.gossip_received += 1;
        if to != &self.self_node {
            return;
        }
        if self.latest.tombstones.contains_key(from) {
            // A removed incarnation that missed its removal (e.g. it was downed behind a
            // one-way partition): our state carries its tombstone, which tells it to stop.
            if self.is_member() {
                self.send_gossip(from);
            }
            return;
        }
        if !self.is_member() {
            // The Welcome was lost but gossip that contains us arrived: that is as good.
            if remote.has_member(&self.self_node) && !self.self_removed {
                self.on_welcome(now, from, remote);
            }
            return;
        }
        if remote.tombstones.contains_key(&self.self_node) {
            self.learn_self_removed(now, remote);
            return;
        }
        if !remote.has_member(&self.self_node) {
            return;
        }
        let next = match remote.version.compare(&self.latest.version) {
            VersionOrdering::Same => {
                let mut next = self.latest.clone();
                next.seen.extend(remote.seen.iter().cloned());
                next
            }
            VersionOrdering::Before => self.latest.clone(),
            VersionOrdering::After => remote.clone(),
            VersionOrdering::Concurrent => {
                self.stats.gossip_merges += 1;
                self.latest.merge(&remote)
            }
        };
        let mut next = next;
        next.seen.insert(self.self_node.clone());
        next.seen.retain(|n| next.members.contains_key(n));
        if remote
            .member(from)
            .is_some_and(|m| m.status == MemberStatus::Exiting)
        {
            self.exiting_confirmed.insert(from.clone());
        }
        if next != self.latest {
            self.replace_latest(now, next);
        }
        if !self.latest.has_member(from) {
            return;
        }
        if !self.latest.seen_by(from) {
            // The sender is behind (or we merged): it needs our state.
            self.send_gossip(from);
        } else if !self.latest.seen.is_subset(&remote.seen) {
            // The sender has our version but not our seen set (at least we have now seen it):
            // a version-only status lets it reach convergence without another round.
            self.send_status(from);
        }
    }

    fn on_gossip_status(
        &mut self,
        from: &UniqueAddress,
        version: &VectorClock,
        seen: &BTreeSet<UniqueAddress>,
    ) {
        self.stats.gossip_status_received += 1;
        if !self.is_member() {
            return;
        }
        if self.latest.tombstones.contains_key(from) {
            self.send_gossip(from);
            return;
        }
        if !self.latest.has_member(from) {
            return;
        }
        match version.compare(&self.latest.version) {
            VersionOrdering::Same => {
                let members = &self.latest.members;
                let learnt: Vec<UniqueAddress> = seen
                    .iter()
                    .chain(std::iter::once(from))
                    .filter(|n| members.contains_key(*n))
                    .cloned()
                    .collect();
                self.latest.seen.extend(learnt);
                // Seen sets only grow within a version: a peer that knows less than we do
                // learns it from our status, and the exchange ends once both sets are equal.
                let mut theirs = seen.clone();
                theirs.insert(from.clone());
                if !self.latest.seen.is_subset(&theirs) {
                    self.send_status(from);
                }
            }
            VersionOrdering::Before | VersionOrdering::Concurrent => self.send_gossip(from),
            VersionOrdering::After => self.send_status(from),
        }
    }

    /// Members to gossip with: every other member not reported unreachable by an observer
    /// that counts. Verdicts of Down or Exiting observers are left out, as for convergence:
    /// a node downed while paused reports everyone unreachable when it resumes, and its rows
    /// stay until the leader removes it, which needs convergence, which needs gossip between
    /// the members left; honouring those rows here stopped that gossip for good (found by
    /// `tessera soak`: two Up members that never removed three Down ones nor let their new
    /// incarnations join).
    fn gossip_candidates(&self) -> Vec<UniqueAddress> {
        let unreachable = self.latest.unreachable_excluding_downed_observers();
        self.latest
            .members
            .keys()
            .filter(|n| **n != self.self_node && !unreachable.contains(*n))
            .cloned()
            .collect()
    }

    fn is_gossip_speedup_needed(&self) -> bool {
        self.latest.seen.len() < self.latest.members.len() / 2
    }

    /// Akka's reduction of the different-view preference in large clusters, so that the
    /// nodes that have not seen the latest version are not all hammered at once.
    fn different_view_probability(&self) -> f64 {
        let size = self.latest.members.len();
        let p = self.config.gossip_different_view_probability;
        let low = self.config.reduce_gossip_different_view_probability;
        let high = low.saturating_mul(3);
        if size <= low {
            return p;
        }
        let min_p = p / 10.0;
        if size >= high {
            return min_p;
        }
        let k = (min_p - p) / (high - low) as f64;
        p + (size - low) as f64 * k
    }

    fn gossip_round(&mut self) {
        let candidates = self.gossip_candidates();
        if candidates.is_empty() {
            return;
        }
        let preferred: Vec<&UniqueAddress> = candidates
            .iter()
            .filter(|n| !self.latest.seen_by(n))
            .collect();
        let p = self.different_view_probability();
        let target = if !preferred.is_empty() && self.rng.random::<f64>() < p {
            preferred[self.rng.random_range(0..preferred.len())].clone()
        } else {
            candidates[self.rng.random_range(0..candidates.len())].clone()
        };
        if self.latest.seen_by(&target) {
            self.send_status(&target);
        } else {
            self.send_gossip(&target);
        }
    }

    fn send_gossip(&mut self, to: &UniqueAddress) {
        self.stats.gossip_sent += 1;
        let message = MembershipMessage::Gossip {
            to: to.clone(),
            gossip: self.latest.clone(),
        };
        self.send(to.address.clone(), message);
    }

    fn send_status(&mut self, to: &UniqueAddress) {
        self.stats.gossip_status_sent += 1;
        let message = MembershipMessage::GossipStatus {
            version: self.latest.version.clone(),
            seen: self.latest.seen.clone(),
        };
        self.send(to.address.clone(), message);
    }

    fn send(&mut self, to: Address, message: MembershipMessage) {
        self.outbox.push(Outgoing { to, message });
    }

    // --- leader actions ----------------------------------------------------------------

    fn leader_actions_on_convergence(&mut self, now: Instant) {
        // An Exiting member is removed early only if an observer that counts lost it.
        let unreachable = self.latest.unreachable_excluding_downed_observers();
        let to_remove: BTreeSet<UniqueAddress> = self
            .latest
            .members
            .values()
            .filter(|m| match m.status {
                MemberStatus::Down => true,
                // Removed once it has confirmed seeing Exiting (so it can shut down knowing
                // it left), or cannot confirm because it is already gone.
                MemberStatus::Exiting => {
                    self.exiting_confirmed.contains(&m.unique_address)
                        || unreachable.contains(&m.unique_address)
                        || m.unique_address == self.self_node
                }
                _ => false,
            })
            .map(|m| m.unique_address.clone())
            .collect();

        let mut next = self.latest.clone();
        let mut changed = !to_remove.is_empty();
        let mut up_number = next
            .members
            .values()
            .filter(|m| m.up_number != i32::MAX)
            .map(|m| m.up_number)
            .max()
            .unwrap_or(0);
        for member in next.members.values_mut() {
            match member.status {
                MemberStatus::Joining | MemberStatus::WeaklyUp => {
                    up_number = up_number.saturating_add(1);
                    member.status = MemberStatus::Up;
                    member.up_number = up_number;
                    changed = true;
                }
                MemberStatus::Leaving => {
                    member.status = MemberStatus::Exiting;
                    changed = true;
                }
                _ => {}
            }
        }
        if !changed {
            return;
        }
        let wall = self.wall_ms(now);
        next.remove_members(&to_remove, wall);
        self.exiting_confirmed.retain(|n| !to_remove.contains(n));
        if to_remove.contains(&self.self_node) {
            // The last member removed itself: tell nobody (there is nobody), just stop.
            self.learn_self_removed(now, next);
            return;
        }
        self.commit_change(now, next);
    }

    fn move_joining_to_weakly_up(&mut self, now: Instant) {
        let Some(after) = self.config.allow_weakly_up_after else {
            return;
        };
        let ready: BTreeSet<UniqueAddress> = self
            .latest
            .members
            .values()
            .filter(|m| m.status == MemberStatus::Joining)
            .filter(|m| {
                self.joining_since
                    .get(&m.unique_address)
                    .is_some_and(|since| now.saturating_duration_since(*since) >= after)
            })
            .map(|m| m.unique_address.clone())
            .collect();
        if !ready.is_empty() {
            self.change_status(now, &ready, MemberStatus::WeaklyUp);
        }
    }

    // --- state changes -----------------------------------------------------------------

    fn member_at(&self, address: &Address) -> Result<UniqueAddress, MembershipError> {
        if !self.is_member() {
            return Err(MembershipError::NotAMember);
        }
        self.latest
            .member_by_address(address)
            .map(|m| m.unique_address.clone())
            .ok_or_else(|| MembershipError::UnknownMember(address.clone()))
    }

    /// Moves members forward to `status`; a move backwards in the lifecycle is ignored.
    fn change_status(
        &mut self,
        now: Instant,
        nodes: &BTreeSet<UniqueAddress>,
        status: MemberStatus,
    ) {
        if !self.is_member() {
            return;
        }
        let mut next = self.latest.clone();
        let mut changed = false;
        for node in nodes {
            if let Some(member) = next.members.get_mut(node) {
                let allowed = match status {
                    MemberStatus::Leaving => matches!(
                        member.status,
                        MemberStatus::Joining | MemberStatus::WeaklyUp | MemberStatus::Up
                    ),
                    MemberStatus::WeaklyUp => member.status == MemberStatus::Joining,
                    MemberStatus::Down => {
                        !matches!(member.status, MemberStatus::Down | MemberStatus::Removed)
                    }
                    _ => false,
                };
                if allowed {
                    member.status = status;
                    changed = true;
                }
            }
        }
        if changed {
            self.commit_change(now, next);
        }
    }

    /// A change made by this node: a new version that only this node has seen.
    fn commit_change(&mut self, now: Instant, mut next: Gossip) {
        next.version.increment(&self.self_node);
        next.seen = BTreeSet::from([self.self_node.clone()]);
        self.replace_latest(now, next);
    }

    fn learn_self_removed(&mut self, now: Instant, mut next: Gossip) {
        next.members.remove(&self.self_node);
        self.replace_latest(now, next);
        self.self_removed = true;
    }

    fn replace_latest(&mut self, now: Instant, next: Gossip) {
        if next.version != self.latest.version {
            // A new version spreads faster when pushed right away instead of waiting for the
            // next round; at most once per gossip_interval/10, so a burst of changes is not a
            // burst of messages.
            let soon = now + self.config.gossip_interval / 10;
            self.next_gossip_at = self.next_gossip_at.min(soon);
        }
        let new_leader = next.leader(&self.self_node);
        let events = events::diff(&self.latest, &next, &self.leader, &new_leader);
        let previous_self_status = self.latest.member(&self.self_node).map(|m| m.status);
        self.latest = next;
        self.leader = new_leader;
        self.events.extend(events);

        self.joining_since.retain(|n, _| {
            self.latest
                .member(n)
                .is_some_and(|m| m.status == MemberStatus::Joining)
        });
        for member in self.latest.members.values() {
            if member.status == MemberStatus::Joining {
                self.joining_since
                    .entry(member.unique_address.clone())
                    .or_insert(now);
            }
        }
        let self_status = self.latest.member(&self.self_node).map(|m| m.status);
        if self_status == Some(MemberStatus::Exiting)
            && previous_self_status != Some(MemberStatus::Exiting)
        {
            // Confirm to everyone still around that we saw it, so the leader can remove us.
            let targets = self.gossip_candidates();
            for target in targets {
                self.send(target.address, MembershipMessage::ExitingConfirmed);
            }
        }
    }

    fn wall_ms(&self, now: Instant) -> u64 {
        let elapsed = u64::try_from(now.saturating_duration_since(self.start).as_millis())
            .unwrap_or(u64::MAX);
        self.start_wall_ms.saturating_add(elapsed)
    }
}
