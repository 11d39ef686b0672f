//! The shard coordinator: a plain state machine, one per entity type, run as a cluster
//! singleton. It decides where shards live and moves them; the driver around it carries its
//! messages and writes its [`StateEvent`]s to the state store.
//!
//! # Rules
//!
//! - **A shard home is told only after its allocation is stored.** Every state change is a
//!   [`CoordinatorOutput::Write`]; the coordinator applies it, and sends what depends on it,
//!   only when the driver reports [`ShardCoordinator::write_done`]. One write is in flight at
//!   a time; region messages that arrive meanwhile wait in a bounded stash, in order. So a
//!   coordinator that takes over after a crash reads every home anyone was ever told.
//! - **Only regions of members that are exactly Up register and get new shards**; a region
//!   that asked for a graceful shutdown gets none either.
//! - **A handoff moves a shard without losing or reordering messages.** `BeginHandOff` goes to
//!   every region and proxy; each stops sending to the shard, buffers, and sends a marker to
//!   the owner behind everything it sent before; the owner relays each marker to the
//!   coordinator. Once all are in, the owner gets `HandOff`, stops the shard's entities after
//!   their writes and answers `ShardStopped`; the shard is deallocated (stored) and only then
//!   allocated anew. Questions about a shard in handoff wait until it is done. A handoff not
//!   done within `handoff_timeout` is given up and the shard stays with its owner.
//! - **Rebalancing** runs one round at a time, every `rebalance_interval`, and only while every
//!   member is Up and reachable (see [`crate::allocation`]).
//! - **A region whose member is gone** (removed, or replaced by a new incarnation) is
//!   terminated in the state and its shards are free for allocation.

use crate::allocation::{self, RebalanceLimits};
use crate::messages::{HandoffId, ToCoordinator, ToRegion};
use crate::settings::ShardingSettings;
use crate::shard_id::ShardId;
use crate::state::{CoordinatorState, RegionId, StateEvent};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

/// What the coordinator knows of the cluster's membership, from its node's view.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MembershipView {
    /// Members not removed, in any status (a region of any other incarnation is gone).
    pub members: BTreeSet<RegionId>,
    /// Members whose status is exactly Up: only they register regions and get shards.
    pub up: BTreeSet<RegionId>,
    /// Every member is Up and reachable: rebalancing may run.
    pub stable: bool,
}

/// What the driver must do for the coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoordinatorOutput {
    /// Send a message to a region (one ordered link per region).
    Send { to: RegionId, message: ToRegion },
    /// Store this state change, then call [`ShardCoordinator::write_done`] or
    /// [`ShardCoordinator::write_failed`].
    Write(StateEvent),
    /// The coordinator cannot go on (its store refused it for good, e.g. another coordinator
    /// took over the state); the driver stops it.
    Stop { reason: String },
}

/// What happens once a write is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
enum After {
    AckRegister(RegionId),
    Allocated {
        shard: ShardId,
        region: RegionId,
        requester: Option<RegionId>,
    },
    Deallocated {
        shard: ShardId,
    },
    Nothing,
}

#[derive(Clone, Debug)]
struct Handoff {
    id: HandoffId,
    owner: RegionId,
    /// Regions and proxies whose marker has not reached the owner yet.
    waiting: BTreeSet<RegionId>,
    started: Instant,
    last_sent: Instant,
    handoff_sent: bool,
}

/// Counters for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoordinatorStats {
    pub writes: u64,
    pub handoffs_started: u64,
    pub handoffs_completed: u64,
    pub handoffs_given_up: u64,
    pub rebalance_rounds: u64,
    pub stash_dropped: u64,
}

/// See the module documentation.
#[derive(Debug)]
pub struct ShardCoordinator {
    settings: ShardingSettings,
    nonce: u64,
    /// `None` until the driver loaded the stored state.
    state: Option<CoordinatorState>,
    view: MembershipView,
    writing: Option<(StateEvent, After)>,
    /// When the write in flight failed and should be tried again.
    retry_write_at: Option<Instant>,
    queued_writes: VecDeque<(StateEvent, After)>,
    stash: VecDeque<(RegionId, ToCoordinator)>,
    rebalancing: BTreeMap<ShardId, Handoff>,
    /// Regions waiting for the home of a shard in handoff.
    deferred: BTreeMap<ShardId, BTreeSet<RegionId>>,
    /// `HostShard` sent, `ShardStarted` not yet received: shard → (owner, last sent).
    unstarted: BTreeMap<ShardId, (RegionId, Instant)>,
    shutting_down: BTreeSet<RegionId>,
    next_rebalance_at: Option<Instant>,
    handoff_numbers: u64,
    stopped: bool,
    stats: CoordinatorStats,
}

impl ShardCoordinator {
    /// A coordinator incarnation; `nonce` must differ between incarnations (draw it at random).
    /// It handles nothing until [`ShardCoordinator::state_loaded`].
    pub fn new(settings: ShardingSettings, nonce: u64) -> Self {
        ShardCoordinator {
            settings,
            nonce,
            state: None,
            view: MembershipView::default(),
            writing: None,
            retry_write_at: None,
            queued_writes: VecDeque::new(),
            stash: VecDeque::new(),
            rebalancing: BTreeMap::new(),
            deferred: BTreeMap::new(),
            unstarted: BTreeMap::new(),
            shutting_down: BTreeSet::new(),
            next_rebalance_at: None,
            handoff_numbers: 0,
            stopped: false,
            stats: CoordinatorStats::default(),
        }
    }

    pub fn state(&self) -> Option<&CoordinatorState> {
        self.state.as_ref()
    }

    pub fn stats(&self) -> CoordinatorStats {
        self.stats
    }

    /// Shards in handoff now.
    pub fn rebalancing(&self) -> impl Iterator<Item = &ShardId> {
        self.rebalancing.keys()
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// The stored state was read; the coordinator starts serving.
    pub fn state_loaded(
        &mut self,
        state: CoordinatorState,
        now: Instant,
    ) -> Vec<CoordinatorOutput> {
        self.state = Some(state);
        self.next_rebalance_at = Some(now + self.settings.rebalance_interval);
        let mut out = Vec::new();
        self.terminate_gone_regions();
        self.continue_work(now, &mut out);
        out
    }

    /// The node's membership view changed.
    pub fn membership(&mut self, view: MembershipView, now: Instant) -> Vec<CoordinatorOutput> {
        self.view = view;
        let mut out = Vec::new();
        if self.stopped {
            return out;
        }
        let members = self.view.members.clone();
        self.shutting_down.retain(|r| members.contains(r));
        self.unstarted
            .retain(|_, (owner, _)| members.contains(owner));
        let mut given_up = Vec::new();
        for (shard, handoff) in &mut self.rebalancing {
            if !members.contains(&handoff.owner) {
                given_up.push(*shard);
                continue;
            }
            handoff.waiting.retain(|r| members.contains(r));
        }
        for shard in given_up {
            self.give_up_handoff(shard);
        }
        let ready: Vec<ShardId> = self
            .rebalancing
            .iter()
            .filter(|(_, h)| h.waiting.is_empty() && !h.handoff_sent)
            .map(|(s, _)| *s)
            .collect();
        for shard in ready {
            self.send_handoff(shard, now, &mut out);
        }
        self.terminate_gone_regions();
        self.continue_work(now, &mut out);
        out
    }

    /// A message from region `from` (as authenticated by the transport).
    pub fn receive(
        &mut self,
        from: RegionId,
        message: ToCoordinator,
        now: Instant,
    ) -> Vec<CoordinatorOutput> {
        let mut out = Vec::new();
        if self.stopped {
            return out;
        }
        if self.is_busy() {
            self.stash_message(from, message);
        } else {
            self.handle(from, message, now, &mut out);
        }
        self.continue_work(now, &mut out);
        out
    }

    /// The write in flight is stored.
    pub fn write_done(&mut self, now: Instant) -> Vec<CoordinatorOutput> {
        let mut out = Vec::new();
        let Some((event, after)) = self.writing.take() else {
            return out;
        };
        self.retry_write_at = None;
        self.stats.writes += 1;
        let applied = match self.state.as_mut() {
            Some(state) => state.apply(&event).is_ok(),
            None => false,
        };
        if applied {
            self.after_write(after, now, &mut out);
        }
        self.continue_work(now, &mut out);
        out
    }

    /// The write in flight failed. `fatal`: the store will never take it (another coordinator
    /// owns the state); otherwise it is tried again after `update_retry_interval`.
    pub fn write_failed(
        &mut self,
        fatal: bool,
        reason: &str,
        now: Instant,
    ) -> Vec<CoordinatorOutput> {
        if self.writing.is_none() || self.stopped {
            return Vec::new();
        }
        if fatal {
            self.stopped = true;
            return vec![CoordinatorOutput::Stop {
                reason: format!("the coordinator's state store refused a write: {reason}"),
            }];
        }
        self.retry_write_at = Some(now + self.settings.update_retry_interval);
        Vec::new()
    }

    /// Timers: write retries, message repeats, handoff timeouts, rebalance rounds.
    pub fn tick(&mut self, now: Instant) -> Vec<CoordinatorOutput> {
        let mut out = Vec::new();
        if self.stopped || self.state.is_none() {
            return out;
        }
        if let (Some(at), Some((event, _))) = (self.retry_write_at, &self.writing)
            && now >= at
        {
            self.retry_write_at = None;
            out.push(CoordinatorOutput::Write(event.clone()));
        }
        for (shard, (owner, last)) in &mut self.unstarted {
            if now.duration_since(*last) >= self.settings.shard_start_timeout {
                *last = now;
                out.push(CoordinatorOutput::Send {
                    to: owner.clone(),
                    message: ToRegion::HostShard { shard: *shard },
                });
            }
        }
        let timed_out: Vec<ShardId> = self
            .rebalancing
            .iter()
            .filter(|(_, h)| now.duration_since(h.started) >= self.settings.handoff_timeout)
            .map(|(s, _)| *s)
            .collect();
        for shard in timed_out {
            self.give_up_handoff(shard);
        }
        for (shard, handoff) in &mut self.rebalancing {
            if now.duration_since(handoff.last_sent) < self.settings.retry_interval {
                continue;
            }
            handoff.last_sent = now;
            if handoff.handoff_sent {
                out.push(CoordinatorOutput::Send {
                    to: handoff.owner.clone(),
                    message: ToRegion::HandOff {
                        shard: *shard,
                        handoff: handoff.id,
                    },
                });
            } else {
                for region in &handoff.waiting {
                    out.push(CoordinatorOutput::Send {
                        to: region.clone(),
                        message: ToRegion::BeginHandOff {
                            shard: *shard,
                            owner: handoff.owner.clone(),
                            handoff: handoff.id,
                        },
                    });
                }
            }
        }
        self.continue_work(now, &mut out);
        if !self.is_busy() && self.next_rebalance_at.is_some_and(|at| now >= at) {
            self.next_rebalance_at = Some(now + self.settings.rebalance_interval);
            self.rebalance_round(now, &mut out);
        }
        out
    }

    fn is_busy(&self) -> bool {
        self.state.is_none() || self.writing.is_some() || !self.queued_writes.is_empty()
    }

    fn stash_message(&mut self, from: RegionId, message: ToCoordinator) {
        if self.stash.len() >= self.settings.coordinator_stash_capacity {
            // The regions repeat what matters (registration, shard homes, acknowledgements).
            self.stats.stash_dropped += 1;
            return;
        }
        self.stash.push_back((from, message));
    }

    /// Starts the next queued write, or, when none is left, handles stashed messages (in
    /// order) and the work that waits for an idle coordinator.
    fn continue_work(&mut self, now: Instant, out: &mut Vec<CoordinatorOutput>) {
        loop {
            if self.stopped || self.state.is_none() || self.writing.is_some() {
                return;
            }
            if let Some((event, after)) = self.queued_writes.pop_front() {
                let fits = self.state.as_ref().is_some_and(|s| s.check(&event).is_ok());
                if fits {
                    out.push(CoordinatorOutput::Write(event.clone()));
                    self.writing = Some((event, after));
                }
                continue;
            }
            if let Some((from, message)) = self.stash.pop_front() {
                self.handle(from, message, now, out);
                continue;
            }
            if self.allocate_unallocated(out) {
                continue;
            }
            self.hand_off_shutting_down(now, out);
            return;
        }
    }

    fn write(&mut self, event: StateEvent, after: After) {
        self.queued_writes.push_back((event, after));
    }

    fn terminate_gone_regions(&mut self) {
        let Some(state) = self.state.as_ref() else {
            return;
        };
        let gone_regions: Vec<RegionId> = state
            .regions()
            .keys()
            .filter(|r| !self.view.members.contains(*r))
            .cloned()
            .collect();
        let gone_proxies: Vec<RegionId> = state
            .proxies()
            .iter()
            .filter(|r| !self.view.members.contains(*r))
            .cloned()
            .collect();
        for region in gone_regions {
            let event = StateEvent::RegionTerminated { region };
            if !self.write_pending(&event) {
                self.write(event, After::Nothing);
            }
        }
        for proxy in gone_proxies {
            let event = StateEvent::ProxyTerminated { proxy };
            if !self.write_pending(&event) {
                self.write(event, After::Nothing);
            }
        }
    }

    fn write_pending(&self, event: &StateEvent) -> bool {
        self.writing.as_ref().is_some_and(|(e, _)| e == event)
            || self.queued_writes.iter().any(|(e, _)| e == event)
    }

    fn handle(
        &mut self,
        from: RegionId,
        message: ToCoordinator,
        now: Instant,
        out: &mut Vec<CoordinatorOutput>,
    ) {
        let Some(state) = self.state.as_ref() else {
            return;
        };
        match message {
            ToCoordinator::Register => {
                if !self.view.up.contains(&from) {
                    // Joining, weakly up, leaving or unknown members host nothing; the region
                    // repeats its registration.
                    return;
                }
                if state.regions().contains_key(&from) {
                    out.push(CoordinatorOutput::Send {
                        to: from,
                        message: ToRegion::RegisterAck,
                    });
                } else {
                    self.write(
                        StateEvent::RegionRegistered {
                            region: from.clone(),
                        },
                        After::AckRegister(from),
                    );
                }
            }
            ToCoordinator::RegisterProxy => {
                if !self.view.members.contains(&from) {
                    return;
                }
                if state.proxies().contains(&from) {
                    out.push(CoordinatorOutput::Send {
                        to: from,
                        message: ToRegion::RegisterAck,
                    });
                } else {
                    self.write(
                        StateEvent::ProxyRegistered {
                            proxy: from.clone(),
                        },
                        After::AckRegister(from),
                    );
                }
            }
            ToCoordinator::GetShardHome { shard } => self.shard_home(from, shard, out),
            ToCoordinator::ShardStarted { shard } => {
                if self
                    .unstarted
                    .get(&shard)
                    .is_some_and(|(owner, _)| *owner == from)
                {
                    self.unstarted.remove(&shard);
                }
            }
            ToCoordinator::BeginHandOffAck {
                shard,
                region,
                handoff: id,
            } => {
                let Some(handoff) = self.rebalancing.get_mut(&shard) else {
                    return;
                };
                // Only the owner relays acknowledgements (it is where the markers must arrive),
                // and only those of this handoff count.
                if handoff.owner != from || handoff.id != id {
                    return;
                }
                handoff.waiting.remove(&region);
                if handoff.waiting.is_empty() && !handoff.handoff_sent {
                    self.send_handoff(shard, now, out);
                }
            }
            ToCoordinator::ShardStopped { shard, handoff } => {
                let matches = self
                    .rebalancing
                    .get(&shard)
                    .is_some_and(|h| h.owner == from && h.id == handoff && h.handoff_sent);
                if matches && state.home(shard) == Some(&from) {
                    self.write(
                        StateEvent::ShardHomeDeallocated { shard },
                        After::Deallocated { shard },
                    );
                }
            }
            ToCoordinator::GracefulShutdownRequest => {
                let holds = state.regions().get(&from).is_some_and(|s| !s.is_empty())
                    || self.rebalancing.values().any(|h| h.owner == from);
                if state.regions().contains_key(&from) {
                    self.shutting_down.insert(from.clone());
                }
                out.push(CoordinatorOutput::Send {
                    to: from,
                    message: ToRegion::GracefulShutdownAck { done: !holds },
                });
                self.hand_off_shutting_down(now, out);
            }
        }
    }

    fn shard_home(
        &mut self,
        requester: RegionId,
        shard: ShardId,
        out: &mut Vec<CoordinatorOutput>,
    ) {
        if shard.0 >= self.settings.number_of_shards {
            return;
        }
        if self.rebalancing.contains_key(&shard) {
            self.deferred.entry(shard).or_default().insert(requester);
            return;
        }
        let Some(state) = self.state.as_ref() else {
            return;
        };
        if let Some(home) = state.home(shard) {
            out.push(CoordinatorOutput::Send {
                to: requester,
                message: ToRegion::ShardHome {
                    shard,
                    region: home.clone(),
                },
            });
            return;
        }
        let Some(region) = allocation::allocate(state.regions(), &self.candidates()) else {
            // No region may take it now; the requester asks again.
            return;
        };
        self.write(
            StateEvent::ShardHomeAllocated {
                shard,
                region: region.clone(),
            },
            After::Allocated {
                shard,
                region,
                requester: Some(requester),
            },
        );
    }

    /// Regions that may take shards: registered, of an Up member, not shutting down.
    fn candidates(&self) -> BTreeSet<RegionId> {
        let Some(state) = self.state.as_ref() else {
            return BTreeSet::new();
        };
        state
            .regions()
            .keys()
            .filter(|r| self.view.up.contains(*r) && !self.shutting_down.contains(*r))
            .cloned()
            .collect()
    }

    fn after_write(&mut self, after: After, now: Instant, out: &mut Vec<CoordinatorOutput>) {
        match after {
            After::AckRegister(region) => out.push(CoordinatorOutput::Send {
                to: region,
                message: ToRegion::RegisterAck,
            }),
            After::Allocated {
                shard,
                region,
                requester,
            } => {
                out.push(CoordinatorOutput::Send {
                    to: region.clone(),
                    message: ToRegion::HostShard { shard },
                });
                self.unstarted.insert(shard, (region.clone(), now));
                if let Some(requester) = requester
                    && requester != region
                {
                    out.push(CoordinatorOutput::Send {
                        to: requester,
                        message: ToRegion::ShardHome { shard, region },
                    });
                }
            }
            After::Deallocated { shard } => {
                if self.rebalancing.remove(&shard).is_some() {
                    self.stats.handoffs_completed += 1;
                }
                self.unstarted.remove(&shard);
                self.requeue_deferred(shard);
            }
            After::Nothing => {}
        }
    }

    /// The questions that waited for `shard`'s handoff are asked again, before anything
    /// stashed later.
    fn requeue_deferred(&mut self, shard: ShardId) {
        if let Some(requesters) = self.deferred.remove(&shard) {
            for requester in requesters.into_iter().rev() {
                self.stash
                    .push_front((requester, ToCoordinator::GetShardHome { shard }));
            }
        }
    }

    fn give_up_handoff(&mut self, shard: ShardId) {
        if self.rebalancing.remove(&shard).is_some() {
            self.stats.handoffs_given_up += 1;
            self.requeue_deferred(shard);
        }
    }

    fn start_handoff(&mut self, shard: ShardId, now: Instant, out: &mut Vec<CoordinatorOutput>) {
        let Some(state) = self.state.as_ref() else {
            return;
        };
        let Some(owner) = state.home(shard).cloned() else {
            return;
        };
        if self.rebalancing.contains_key(&shard) {
            return;
        }
        let waiting: BTreeSet<RegionId> = state
            .regions()
            .keys()
            .chain(state.proxies().iter())
            .filter(|r| self.view.members.contains(*r))
            .cloned()
            .collect();
        // No more `HostShard` repeats: one arriving after the owner stopped the shard would
        // start it again beside its next home.
        self.unstarted.remove(&shard);
        self.handoff_numbers += 1;
        let id = HandoffId {
            coordinator_nonce: self.nonce,
            number: self.handoff_numbers,
        };
        for region in &waiting {
            out.push(CoordinatorOutput::Send {
                to: region.clone(),
                message: ToRegion::BeginHandOff {
                    shard,
                    owner: owner.clone(),
                    handoff: id,
                },
            });
        }
        self.stats.handoffs_started += 1;
        self.rebalancing.insert(
            shard,
            Handoff {
                id,
                owner,
                waiting,
                started: now,
                last_sent: now,
                handoff_sent: false,
            },
        );
        if self.rebalancing[&shard].waiting.is_empty() {
            self.send_handoff(shard, now, out);
        }
    }

    fn send_handoff(&mut self, shard: ShardId, now: Instant, out: &mut Vec<CoordinatorOutput>) {
        if let Some(handoff) = self.rebalancing.get_mut(&shard) {
            handoff.handoff_sent = true;
            handoff.last_sent = now;
            out.push(CoordinatorOutput::Send {
                to: handoff.owner.clone(),
                message: ToRegion::HandOff {
                    shard,
                    handoff: handoff.id,
                },
            });
        }
    }

    /// With remember-entities, shards whose region terminated are allocated again without
    /// waiting for a message. Returns whether a write was queued.
    fn allocate_unallocated(&mut self, _out: &mut [CoordinatorOutput]) -> bool {
        let Some(state) = self.state.as_ref() else {
            return false;
        };
        let Some(shard) = state
            .unallocated()
            .iter()
            .find(|s| !self.rebalancing.contains_key(*s) && state.home(**s).is_none())
            .copied()
        else {
            return false;
        };
        let Some(region) = allocation::allocate(state.regions(), &self.candidates()) else {
            return false;
        };
        self.write(
            StateEvent::ShardHomeAllocated {
                shard,
                region: region.clone(),
            },
            After::Allocated {
                shard,
                region,
                requester: None,
            },
        );
        true
    }

    /// Every shard of a region that is shutting down is handed off, without the round limit.
    fn hand_off_shutting_down(&mut self, now: Instant, out: &mut Vec<CoordinatorOutput>) {
        let Some(state) = self.state.as_ref() else {
            return;
        };
        let shards: Vec<ShardId> = self
            .shutting_down
            .iter()
            .filter_map(|r| state.regions().get(r))
            .flatten()
            .filter(|s| !self.rebalancing.contains_key(*s))
            .copied()
            .collect();
        for shard in shards {
            self.start_handoff(shard, now, out);
        }
    }

    fn rebalance_round(&mut self, now: Instant, out: &mut Vec<CoordinatorOutput>) {
        if !self.view.stable || !self.rebalancing.is_empty() {
            return;
        }
        let Some(state) = self.state.as_ref() else {
            return;
        };
        let limits = RebalanceLimits {
            absolute_limit: self.settings.rebalance_absolute_limit,
            relative_limit: self.settings.rebalance_relative_limit,
        };
        let shards = allocation::rebalance(state.regions(), &self.candidates(), limits);
        if shards.is_empty() {
            return;
        }
        self.stats.rebalance_rounds += 1;
        for shard in shards {
            self.start_handoff(shard, now, out);
        }
    }
}
