//! The shard coordinator: a plain state machine, one per entity type, run as a cluster
//! singleton. It decides where shards live and moves them; the driver around it carries its
//! messages and writes its [`StateEvent`]s to the state store.
//!
//! # Rules
//!
//! - **A shard home is told only after its allocation is stored.** State changes are written
//!   in batches ([`CoordinatorOutput::Write`]); the coordinator applies a batch, and sends
//!   what depends on it, only when the driver reports [`ShardCoordinator::write_done`]. One
//!   batch is in flight at a time; region messages that arrive meanwhile wait in a bounded
//!   stash, in order, and are all handled before the next batch is written, so the 200 shards
//!   of a crashed node are allocated in one write. Decisions see the state with the batch
//!   being built applied (the *projected* state), answers wait for the stored one. So a
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
    /// Store these state changes, atomically and in order, then call
    /// [`ShardCoordinator::write_done`] or [`ShardCoordinator::write_failed`].
    Write(Vec<StateEvent>),
    /// The coordinator cannot go on (its store refused it for good, e.g. another coordinator
    /// took over the state); the driver stops it.
    Stop { reason: String },
}

/// What happens once a write is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
enum After {
    Allocated { shard: ShardId, region: RegionId },
    Deallocated { shard: ShardId },
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
    /// State writes that failed (each is retried, or stops the coordinator when fatal).
    pub write_failures: u64,
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
    /// `state` with the batch in flight and the batch being built applied: what decisions see.
    projected: Option<CoordinatorState>,
    view: MembershipView,
    /// The batch in flight.
    writing: Option<Vec<(StateEvent, After)>>,
    /// When the batch in flight failed and should be tried again.
    retry_write_at: Option<Instant>,
    /// The next batch, being built.
    queued_writes: Vec<(StateEvent, After)>,
    stash: VecDeque<(RegionId, ToCoordinator)>,
    /// Regions asking for a shard whose allocation is queued or in flight: answered once it
    /// is stored.
    awaiting_allocation: BTreeMap<ShardId, BTreeSet<RegionId>>,
    /// Regions whose registration is queued or in flight: acknowledged once it is stored.
    awaiting_registration: BTreeSet<RegionId>,
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
            projected: None,
            view: MembershipView::default(),
            writing: None,
            retry_write_at: None,
            queued_writes: Vec::new(),
            stash: VecDeque::new(),
            awaiting_allocation: BTreeMap::new(),
            awaiting_registration: BTreeSet::new(),
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
        self.projected = Some(state.clone());
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

    /// The batch in flight is stored.
    pub fn write_done(&mut self, now: Instant) -> Vec<CoordinatorOutput> {
        let mut out = Vec::new();
        let Some(batch) = self.writing.take() else {
            return out;
        };
        self.retry_write_at = None;
        self.stats.writes += 1;
        for (event, after) in batch {
            let applied = match self.state.as_mut() {
                Some(state) => state.apply(&event).is_ok(),
                None => false,
            };
            if applied {
                self.after_write(after, now, &mut out);
            }
        }
        let registered: Vec<RegionId> = self
            .awaiting_registration
            .iter()
            .filter(|r| self.state.as_ref().is_some_and(|s| s.is_registered(r)))
            .cloned()
            .collect();
        for region in registered {
            self.awaiting_registration.remove(&region);
            out.push(CoordinatorOutput::Send {
                to: region,
                message: ToRegion::RegisterAck,
            });
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
        self.stats.write_failures += 1;
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
        if let (Some(at), Some(batch)) = (self.retry_write_at, &self.writing)
            && now >= at
        {
            self.retry_write_at = None;
            out.push(CoordinatorOutput::Write(
                batch.iter().map(|(event, _)| event.clone()).collect(),
            ));
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

    /// Whether region messages must wait in the stash: until the state is loaded, and while
    /// a batch is in flight.
    fn is_busy(&self) -> bool {
        self.state.is_none() || self.writing.is_some()
    }

    fn stash_message(&mut self, from: RegionId, message: ToCoordinator) {
        if self.stash.len() >= self.settings.coordinator_stash_capacity {
            // The regions repeat what matters (registration, shard homes, acknowledgements).
            self.stats.stash_dropped += 1;
            return;
        }
        self.stash.push_back((from, message));
    }

    /// When no batch is in flight: handles every stashed message (in order) and the work that
    /// waits for an idle coordinator, then writes what they decided as one batch.
    fn continue_work(&mut self, now: Instant, out: &mut Vec<CoordinatorOutput>) {
        if self.stopped || self.state.is_none() || self.writing.is_some() {
            return;
        }
        while let Some((from, message)) = self.stash.pop_front() {
            self.handle(from, message, now, out);
        }
        while self.allocate_unallocated() {}
        self.hand_off_shutting_down(now, out);
        if !self.queued_writes.is_empty() {
            let batch = std::mem::take(&mut self.queued_writes);
            out.push(CoordinatorOutput::Write(
                batch.iter().map(|(event, _)| event.clone()).collect(),
            ));
            self.writing = Some(batch);
        }
    }

    /// Queues a change for the next batch; one that does not fit the projected state (say, a
    /// region terminated twice) changes nothing and is dropped.
    fn write(&mut self, event: StateEvent, after: After) {
        let Some(projected) = self.projected.as_mut() else {
            return;
        };
        if projected.apply(&event).is_ok() {
            self.queued_writes.push((event, after));
        }
    }

    fn terminate_gone_regions(&mut self) {
        let Some(projected) = self.projected.as_ref() else {
            return;
        };
        let gone_regions: Vec<RegionId> = projected
            .regions()
            .keys()
            .filter(|r| !self.view.members.contains(*r))
            .cloned()
            .collect();
        let gone_proxies: Vec<RegionId> = projected
            .proxies()
            .iter()
            .filter(|r| !self.view.members.contains(*r))
            .cloned()
            .collect();
        for region in gone_regions {
            self.write(StateEvent::RegionTerminated { region }, After::Nothing);
        }
        for proxy in gone_proxies {
            self.write(StateEvent::ProxyTerminated { proxy }, After::Nothing);
        }
    }

    fn handle(
        &mut self,
        from: RegionId,
        message: ToCoordinator,
        now: Instant,
        out: &mut Vec<CoordinatorOutput>,
    ) {
        let (Some(state), Some(projected)) = (self.state.as_ref(), self.projected.as_ref()) else {
            return;
        };
        match message {
            ToCoordinator::Register | ToCoordinator::RegisterProxy => {
                let proxy = message == ToCoordinator::RegisterProxy;
                // Joining, weakly up, leaving or unknown members host nothing; the region
                // repeats its registration.
                let allowed = if proxy {
                    self.view.members.contains(&from)
                } else {
                    self.view.up.contains(&from)
                };
                if !allowed {
                    return;
                }
                let (stored, queued) = if proxy {
                    (
                        state.proxies().contains(&from),
                        projected.proxies().contains(&from),
                    )
                } else {
                    (
                        state.regions().contains_key(&from),
                        projected.regions().contains_key(&from),
                    )
                };
                if stored && queued {
                    out.push(CoordinatorOutput::Send {
                        to: from,
                        message: ToRegion::RegisterAck,
                    });
                    return;
                }
                if !queued {
                    let event = if proxy {
                        StateEvent::ProxyRegistered {
                            proxy: from.clone(),
                        }
                    } else {
                        StateEvent::RegionRegistered {
                            region: from.clone(),
                        }
                    };
                    self.write(event, After::Nothing);
                }
                self.awaiting_registration.insert(from);
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
                if matches && projected.home(shard) == Some(&from) {
                    self.write(
                        StateEvent::ShardHomeDeallocated { shard },
                        After::Deallocated { shard },
                    );
                }
            }
            ToCoordinator::GracefulShutdownRequest => {
                let holds = state.regions().get(&from).is_some_and(|s| !s.is_empty())
                    || projected
                        .regions()
                        .get(&from)
                        .is_some_and(|s| !s.is_empty())
                    || self.rebalancing.values().any(|h| h.owner == from);
                if projected.regions().contains_key(&from) {
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
        let (Some(state), Some(projected)) = (self.state.as_ref(), self.projected.as_ref()) else {
            return;
        };
        let stored = state.home(shard);
        match projected.home(shard) {
            Some(home) if stored == Some(home) => {
                out.push(CoordinatorOutput::Send {
                    to: requester,
                    message: ToRegion::ShardHome {
                        shard,
                        region: home.clone(),
                    },
                });
            }
            // Allocated in a batch not stored yet: answered once it is.
            Some(_) => {
                self.awaiting_allocation
                    .entry(shard)
                    .or_default()
                    .insert(requester);
            }
            None => {
                let Some(region) = allocation::allocate(projected.regions(), &self.candidates())
                else {
                    // No region may take it now; the requester asks again.
                    return;
                };
                self.write(
                    StateEvent::ShardHomeAllocated {
                        shard,
                        region: region.clone(),
                    },
                    After::Allocated { shard, region },
                );
                self.awaiting_allocation
                    .entry(shard)
                    .or_default()
                    .insert(requester);
            }
        }
    }

    /// Regions that may take shards: registered, of an Up member, not shutting down.
    fn candidates(&self) -> BTreeSet<RegionId> {
        let Some(projected) = self.projected.as_ref() else {
            return BTreeSet::new();
        };
        projected
            .regions()
            .keys()
            .filter(|r| self.view.up.contains(*r) && !self.shutting_down.contains(*r))
            .cloned()
            .collect()
    }

    fn after_write(&mut self, after: After, now: Instant, out: &mut Vec<CoordinatorOutput>) {
        match after {
            After::Allocated { shard, region } => {
                out.push(CoordinatorOutput::Send {
                    to: region.clone(),
                    message: ToRegion::HostShard { shard },
                });
                self.unstarted.insert(shard, (region.clone(), now));
                for requester in self.awaiting_allocation.remove(&shard).unwrap_or_default() {
                    if requester != region {
                        out.push(CoordinatorOutput::Send {
                            to: requester,
                            message: ToRegion::ShardHome {
                                shard,
                                region: region.clone(),
                            },
                        });
                    }
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
        let (Some(state), Some(projected)) = (self.state.as_ref(), self.projected.as_ref()) else {
            return;
        };
        // Only a stored home that no queued change touches is moved.
        let Some(owner) = state.home(shard).cloned() else {
            return;
        };
        if projected.home(shard) != Some(&owner) {
            return;
        }
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
    /// waiting for a message. Returns whether a change was queued.
    fn allocate_unallocated(&mut self) -> bool {
        let Some(projected) = self.projected.as_ref() else {
            return false;
        };
        let Some(shard) = projected
            .unallocated()
            .iter()
            .find(|s| !self.rebalancing.contains_key(*s) && projected.home(**s).is_none())
            .copied()
        else {
            return false;
        };
        let Some(region) = allocation::allocate(projected.regions(), &self.candidates()) else {
            return false;
        };
        self.write(
            StateEvent::ShardHomeAllocated {
                shard,
                region: region.clone(),
            },
            After::Allocated { shard, region },
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
