//! One node's cluster protocols composed: membership, heartbeats with failure detection, and
//! the split-brain resolver — still a pure state machine with time passed in.
//!
//! The tokio node ([`crate::node`]) and the deterministic simulator ([`crate::sim`]) both drive
//! exactly this type, so what the simulator proves is what runs.

use crate::address::{Address, UniqueAddress};
use crate::events::ClusterEvent;
use crate::heartbeat::{
    HeartbeatConfig, HeartbeatConfigError, HeartbeatRequest, HeartbeatResponse, HeartbeatSender,
};
use crate::member::{Member, MemberStatus};
use crate::membership::{Membership, MembershipConfig, MembershipError, MembershipMessage};
use crate::sbr::{DowningStrategy, SbrConfigError, SbrView, SplitBrainResolver};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Messages of the heartbeat service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HeartbeatMessage {
    Request(HeartbeatRequest),
    Response(HeartbeatResponse),
}

/// Anything the core asks its driver to send.
#[derive(Clone, Debug, PartialEq)]
pub enum CoreMessage {
    Membership(MembershipMessage),
    Heartbeat(HeartbeatMessage),
}

/// Why a node's cluster life is over and its process should stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum StopReason {
    /// It left gracefully: seen Exiting long enough for the leader to remove it, or Removed.
    Left,
    /// It was downed (by an operator, or by the split-brain resolver on a minority side).
    Downed,
}

/// A message to send to the node at `to`.
#[derive(Clone, Debug, PartialEq)]
pub struct CoreOutgoing {
    pub to: Address,
    pub message: CoreMessage,
}

/// How unreachable members are downed.
#[derive(Clone, Debug)]
pub struct DowningConfig {
    pub strategy: DowningStrategy,
    pub stable_after: Duration,
}

impl Default for DowningConfig {
    fn default() -> Self {
        Self {
            strategy: DowningStrategy::KeepMajority { role: None },
            stable_after: Duration::from_secs(20),
        }
    }
}

/// Settings of all cluster protocols of a node.
#[derive(Clone, Debug, Default)]
pub struct ClusterCoreConfig {
    pub membership: MembershipConfig,
    pub heartbeat: HeartbeatConfig,
    /// None disables automatic downing: unreachable members then wait for an operator.
    pub downing: Option<DowningConfig>,
}

/// A cluster setting that is out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClusterConfigError {
    #[error(transparent)]
    Heartbeat(#[from] HeartbeatConfigError),
    #[error(transparent)]
    Downing(#[from] SbrConfigError),
    #[error("gossip_interval = {0:?}: must be at least 10ms")]
    GossipInterval(Duration),
}

/// The composed cluster protocols of one node.
pub struct ClusterCore {
    membership: Membership,
    heartbeat: HeartbeatSender,
    sbr: Option<SplitBrainResolver>,
    /// Members and unreachable set the heartbeat ring was last built from.
    ring_source: (BTreeSet<UniqueAddress>, BTreeSet<UniqueAddress>),
    outbox: Vec<CoreOutgoing>,
    /// When this node first saw itself Exiting.
    exiting_since: Option<Instant>,
    /// Whether this node was ever Leaving or Exiting (so a removal is the end of a leave).
    was_leaving: bool,
    heartbeats_sent: u64,
    heartbeat_responses_received: u64,
}

impl ClusterCore {
    pub fn new(
        self_node: UniqueAddress,
        config: ClusterCoreConfig,
        rng_seed: u64,
        now: Instant,
        start_wall_ms: u64,
    ) -> Result<Self, ClusterConfigError> {
        if config.membership.gossip_interval < Duration::from_millis(10) {
            return Err(ClusterConfigError::GossipInterval(
                config.membership.gossip_interval,
            ));
        }
        let heartbeat = HeartbeatSender::new(self_node.clone(), config.heartbeat)?;
        let sbr = match config.downing {
            Some(d) => Some(SplitBrainResolver::new(d.strategy, d.stable_after)?),
            None => None,
        };
        Ok(Self {
            membership: Membership::new(self_node, config.membership, rng_seed, now, start_wall_ms),
            heartbeat,
            sbr,
            ring_source: Default::default(),
            outbox: Vec::new(),
            exiting_since: None,
            was_leaving: false,
            heartbeats_sent: 0,
            heartbeat_responses_received: 0,
        })
    }

    pub fn membership(&self) -> &Membership {
        &self.membership
    }

    pub fn self_node(&self) -> &UniqueAddress {
        self.membership.self_node()
    }

    pub fn heartbeats_sent(&self) -> u64 {
        self.heartbeats_sent
    }

    pub fn heartbeat_responses_received(&self) -> u64 {
        self.heartbeat_responses_received
    }

    pub fn start(&mut self, now: Instant) {
        self.membership.start(now);
        self.after_input(now);
    }

    pub fn join(&mut self, now: Instant, address: Address) -> Result<(), MembershipError> {
        let result = self.membership.join(now, address);
        self.after_input(now);
        result
    }

    pub fn leave(&mut self, now: Instant, address: &Address) -> Result<(), MembershipError> {
        let result = self.membership.leave(now, address);
        self.after_input(now);
        result
    }

    pub fn down(&mut self, now: Instant, address: &Address) -> Result<(), MembershipError> {
        let result = self.membership.down(now, address);
        self.after_input(now);
        result
    }

    /// Spreads the current state to every reachable member (before shutting down).
    pub fn gossip_to_all_reachable(&mut self) {
        self.membership.gossip_to_all_reachable();
        self.collect_membership_outbox();
    }

    pub fn handle_membership(
        &mut self,
        now: Instant,
        from: &UniqueAddress,
        message: MembershipMessage,
    ) {
        self.membership.handle(now, from, message);
        self.after_input(now);
    }

    pub fn handle_heartbeat(
        &mut self,
        now: Instant,
        from: &UniqueAddress,
        message: HeartbeatMessage,
    ) {
        match message {
            HeartbeatMessage::Request(request) => {
                // Answered even before the Welcome arrives: the cluster monitors a node from
                // the moment it is Joining. Responses carry our uid, so a requester watching
                // another incarnation of this address ignores them.
                let response = self.heartbeat.heartbeat_request_received(&request);
                self.outbox.push(CoreOutgoing {
                    to: from.address.clone(),
                    message: CoreMessage::Heartbeat(HeartbeatMessage::Response(response)),
                });
            }
            HeartbeatMessage::Response(response) => {
                self.heartbeat_responses_received += 1;
                self.heartbeat.on_response(from, response, now);
            }
        }
    }

    /// Drives every timer: gossip, leader actions, heartbeats, failure detection, downing.
    pub fn tick(&mut self, now: Instant) {
        self.membership.tick(now);
        self.after_input(now);
        if !self.membership.is_member() {
            return;
        }
        for (to, request) in self.heartbeat.tick(now) {
            self.heartbeats_sent += 1;
            self.outbox.push(CoreOutgoing {
                to: to.address,
                message: CoreMessage::Heartbeat(HeartbeatMessage::Request(request)),
            });
        }
        for (subject, available) in self.heartbeat.reachability_changes(now) {
            self.membership.set_reachability(now, &subject, available);
        }
        self.after_input(now);
        self.run_downing(now);
    }

    /// Whether this node's cluster life is over. An Exiting node waits a few gossip rounds
    /// so that its confirmation reaches the leader before it goes.
    pub fn stop_reason(&self, now: Instant) -> Option<StopReason> {
        match self.membership.self_status() {
            Some(MemberStatus::Down) if !self.was_leaving => Some(StopReason::Downed),
            Some(MemberStatus::Down) => Some(StopReason::Left),
            // Removed without having left: others downed and removed it before it heard.
            Some(MemberStatus::Removed) if !self.was_leaving => Some(StopReason::Downed),
            Some(MemberStatus::Removed) => Some(StopReason::Left),
            Some(MemberStatus::Exiting) => self
                .exiting_since
                .filter(|since| {
                    now.saturating_duration_since(*since)
                        >= self.membership.config().gossip_interval * 3
                })
                .map(|_| StopReason::Left),
            _ => None,
        }
    }

    pub fn take_outbox(&mut self) -> Vec<CoreOutgoing> {
        std::mem::take(&mut self.outbox)
    }

    pub fn take_events(&mut self) -> Vec<ClusterEvent> {
        self.membership.take_events()
    }

    fn run_downing(&mut self, now: Instant) {
        let Some(sbr) = self.sbr.as_mut() else {
            return;
        };
        // Only a full member decides: a node on its way out (or not yet Up) has no business
        // downing others, and would down itself once its peers had already gone.
        if !matches!(
            self.membership.self_status(),
            Some(MemberStatus::Up | MemberStatus::Leaving)
        ) {
            return;
        }
        let gossip = self.membership.gossip();
        let members: Vec<Member> = gossip.members.values().cloned().collect();
        let unreachable = gossip.unreachable_excluding_downed_observers();
        let indirectly_connected = gossip.indirectly_connected_excluding_downed_observers();
        let view = SbrView {
            self_node: self.membership.self_node(),
            members: &members,
            unreachable: &unreachable,
            indirectly_connected: &indirectly_connected,
            is_leader: self.membership.is_leader(),
        };
        if let Some(decision) = sbr.tick(now, view) {
            tracing::warn!(
                node = %self.membership.self_node(),
                down = ?decision.down.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
                reason = ?decision.reason,
                "split brain resolver downs members"
            );
            self.membership.down_nodes(now, &decision.down);
            self.after_input(now);
        }
    }

    /// Keeps the heartbeat ring in step with membership and moves membership's messages to
    /// the outbox.
    fn after_input(&mut self, now: Instant) {
        if matches!(
            self.membership.self_status(),
            Some(MemberStatus::Leaving | MemberStatus::Exiting)
        ) {
            self.was_leaving = true;
        }
        if self.exiting_since.is_none()
            && self.membership.self_status() == Some(MemberStatus::Exiting)
        {
            self.exiting_since = Some(now);
        }
        let gossip = self.membership.gossip();
        let nodes: BTreeSet<UniqueAddress> = gossip
            .members
            .values()
            .filter(|m| m.status != MemberStatus::Removed)
            .map(|m| m.unique_address.clone())
            .collect();
        // As for gossip: a Down or Exiting observer's verdicts do not make us watch extra
        // nodes.
        let unreachable = gossip.unreachable_excluding_downed_observers();
        if self.ring_source.0 != nodes || self.ring_source.1 != unreachable {
            self.heartbeat.set_members(nodes.clone(), &unreachable, now);
            self.ring_source = (nodes, unreachable);
        }
        self.collect_membership_outbox();
    }

    fn collect_membership_outbox(&mut self) {
        for out in self.membership.take_outbox() {
            self.outbox.push(CoreOutgoing {
                to: out.to,
                message: CoreMessage::Membership(out.message),
            });
        }
    }
}
