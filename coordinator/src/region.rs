//! The shard region: a plain state machine, one per entity type on each node. It routes each
//! message to the region that hosts its shard, asks the coordinator for homes it does not
//! know, buffers meanwhile, and hosts the shards the coordinator gives it.
//!
//! # Rules
//!
//! - **Per-sender order.** Messages from one sender for one entity reach it in the order sent,
//!   also across a handoff: on `BeginHandOff` a region stops sending to the shard, buffers,
//!   and sends a marker to the owner on the same ordered link as its messages; the owner
//!   delivers everything that came before the marker to the still running shard, and stops
//!   it only after every region's marker is in. The buffered messages then go, in order, to
//!   the new home.
//! - **Nothing is dropped silently.** A message is delivered, forwarded, or buffered; a full
//!   buffer refuses it with [`RegionError::BufferFull`] (the caller learns it was not
//!   delivered).
//! - **Answers only from the coordinator it registered with.** Coordinator messages from any
//!   other node are ignored, so a stale coordinator cannot move shards.
//! - **A proxy hosts nothing**; it routes like any region.

use crate::messages::{BetweenRegions, HandoffId, ToCoordinator, ToRegion};
use crate::settings::ShardingSettings;
use crate::shard_id::ShardId;
use crate::state::RegionId;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// Longest wait before an unacknowledged registration is sent again.
pub const REGISTER_RETRY_INTERVAL: Duration = Duration::from_millis(250);

/// Why a message was not taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegionError {
    #[error(
        "the region's buffer for shards with unknown homes is full ({capacity} messages); \
         the message was not delivered"
    )]
    BufferFull { capacity: usize },
    #[error("shard {shard} is out of range (number_of_shards = {number_of_shards})")]
    UnknownShard {
        shard: ShardId,
        number_of_shards: u32,
    },
}

/// Where a message came from: this node's callers, or another region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    Local,
    Region(RegionId),
}

/// What the driver must do for the region.
#[derive(Debug, PartialEq)]
pub enum RegionOutput<M> {
    /// Send to the coordinator this region registered with (or is registering with).
    ToCoordinator(ToCoordinator),
    /// Send to another region, on the one ordered link to it.
    ToRegion {
        to: RegionId,
        message: BetweenRegions<M>,
    },
    /// Hand the message to the shard's entity on this node.
    DeliverLocal { shard: ShardId, message: M },
    /// Start hosting `shard` (with remember-entities: start its remembered entities).
    StartShard(ShardId),
    /// Stop the entities of `shard` after their writes; then call
    /// [`ShardRegion::shard_stopped`].
    StopShard(ShardId),
    /// The message was refused; tell its caller.
    Refused { message: M, error: RegionError },
    /// Graceful shutdown finished: this region hosts and holds nothing, the coordinator gives
    /// it nothing new. The node may leave.
    ShutdownComplete,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hosted {
    Active,
    /// Stopping for `handoff` (`None`: stopping because the coordinator said the shard lives
    /// elsewhere).
    Stopping(Option<HandoffId>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shutdown {
    Running,
    Requested { last_sent: Instant },
    Complete,
}

/// What the region knows of membership, from its node's view.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegionView {
    /// Members not removed, any status: homes at other incarnations are forgotten.
    pub members: BTreeSet<RegionId>,
    /// Where the coordinator runs (the singleton's node), if any member qualifies.
    pub coordinator: Option<RegionId>,
    /// This node does not see itself Up yet (Joining or WeaklyUp): its region registers to
    /// host shards only once it does. The coordinator may see it Up a gossip round earlier,
    /// and a shard allocated then would run where the journal refuses to write.
    pub self_joining: bool,
}

/// Counters for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegionStats {
    pub delivered_local: u64,
    pub forwarded: u64,
    pub refused: u64,
    pub handoffs: u64,
}

/// See the module documentation.
#[derive(Debug)]
pub struct ShardRegion<M> {
    settings: ShardingSettings,
    self_id: RegionId,
    hosts_shards: bool,
    view: RegionView,
    registered: bool,
    last_register: Option<Instant>,
    homes: BTreeMap<ShardId, RegionId>,
    local: BTreeMap<ShardId, Hosted>,
    /// `BeginHandOff` seen: messages wait here until the shard's next home is known.
    handing_off: BTreeSet<ShardId>,
    buffers: BTreeMap<ShardId, VecDeque<M>>,
    /// Of those, how many came from other regions: at a stopping owner only these must reach
    /// the old incarnation (this node's own callers' later messages go to the next home).
    remote_buffered: BTreeMap<ShardId, usize>,
    buffered: usize,
    asked: BTreeMap<ShardId, Instant>,
    /// The last handoff each shard was stopped for: a repeated `HandOff` is answered again
    /// and never restarts the shard.
    answered: BTreeMap<ShardId, HandoffId>,
    shutdown: Shutdown,
    stats: RegionStats,
}

impl<M> ShardRegion<M> {
    /// A region of the node `self_id`; `hosts_shards: false` makes it a proxy.
    pub fn new(settings: ShardingSettings, self_id: RegionId, hosts_shards: bool) -> Self {
        ShardRegion {
            settings,
            self_id,
            hosts_shards,
            view: RegionView::default(),
            registered: false,
            last_register: None,
            homes: BTreeMap::new(),
            local: BTreeMap::new(),
            handing_off: BTreeSet::new(),
            buffers: BTreeMap::new(),
            remote_buffered: BTreeMap::new(),
            buffered: 0,
            asked: BTreeMap::new(),
            answered: BTreeMap::new(),
            shutdown: Shutdown::Running,
            stats: RegionStats::default(),
        }
    }

    pub fn self_id(&self) -> &RegionId {
        &self.self_id
    }

    /// Where this region believes the coordinator runs.
    pub fn coordinator(&self) -> Option<&RegionId> {
        self.view.coordinator.as_ref()
    }

    pub fn is_registered(&self) -> bool {
        self.registered
    }

    pub fn stats(&self) -> RegionStats {
        self.stats
    }

    /// Shards hosted here (running or stopping).
    pub fn local_shards(&self) -> impl Iterator<Item = &ShardId> {
        self.local.keys()
    }

    /// Whether a message of this node's callers for `shard` would be delivered here at once,
    /// with nothing before it: the shard runs here, is not handing off, and buffers nothing.
    /// Only handling the coordinator's messages, markers, stopped shards, shutdown, ticks and
    /// membership changes this; delivering messages never does.
    pub fn takes_local_callers(&self, shard: ShardId) -> bool {
        self.local.get(&shard) == Some(&Hosted::Active)
            && !self.handing_off.contains(&shard)
            && self.buffers.get(&shard).is_none_or(VecDeque::is_empty)
    }

    /// Where a message of this node's callers for `shard` would be forwarded at once, with
    /// nothing before it: another region is its known home, this node does not run it, it
    /// is not handing off, and nothing is buffered for it. The same inputs as for
    /// [`ShardRegion::takes_local_callers`] change this.
    pub fn forwards_local_callers(&self, shard: ShardId) -> Option<&RegionId> {
        let home = self.homes.get(&shard)?;
        (*home != self.self_id
            && !self.local.contains_key(&shard)
            && !self.handing_off.contains(&shard)
            && self.buffers.get(&shard).is_none_or(VecDeque::is_empty))
        .then_some(home)
    }

    /// Shards whose home is known.
    pub fn known_homes(&self) -> impl Iterator<Item = &ShardId> {
        self.homes.keys()
    }

    /// How many shards are hosted here (running or stopping).
    pub fn local_shard_count(&self) -> usize {
        self.local.len()
    }

    /// Whether `shard` is hosted here and takes messages.
    pub fn is_active(&self, shard: ShardId) -> bool {
        self.local.get(&shard) == Some(&Hosted::Active)
    }

    /// Messages held for shards whose home is not known.
    pub fn buffered(&self) -> usize {
        self.buffered
    }

    /// The known home of `shard`.
    pub fn home(&self, shard: ShardId) -> Option<&RegionId> {
        self.homes.get(&shard)
    }

    /// A message for an entity of `shard`.
    pub fn deliver(
        &mut self,
        origin: Origin,
        shard: ShardId,
        message: M,
        now: Instant,
    ) -> Vec<RegionOutput<M>> {
        let mut out = Vec::new();
        if shard.0 >= self.settings.number_of_shards {
            self.stats.refused += 1;
            out.push(RegionOutput::Refused {
                message,
                error: RegionError::UnknownShard {
                    shard,
                    number_of_shards: self.settings.number_of_shards,
                },
            });
            return out;
        }
        self.route(origin, shard, message, now, &mut out);
        out
    }

    fn route(
        &mut self,
        origin: Origin,
        shard: ShardId,
        message: M,
        now: Instant,
        out: &mut Vec<RegionOutput<M>>,
    ) {
        let from_other_region = matches!(origin, Origin::Region(_));
        match self.local.get(&shard) {
            // A message from another region reached the owner before that region's marker:
            // the running shard takes it even during a handoff. This node's own callers
            // stop at `handing_off` like every other sender.
            Some(Hosted::Active) if from_other_region || !self.handing_off.contains(&shard) => {
                self.stats.delivered_local += 1;
                out.push(RegionOutput::DeliverLocal { shard, message });
                return;
            }
            Some(_) => {
                // Stopping, or running but in handoff for this node's callers. Asking lets a
                // handoff that was given up end here too: the answer is this region.
                self.buffer(shard, message, from_other_region, out);
                self.ask_home(shard, now, out);
                return;
            }
            None => {}
        }
        if self.handing_off.contains(&shard) {
            self.buffer(shard, message, from_other_region, out);
            self.ask_home(shard, now, out);
            return;
        }
        match self.homes.get(&shard) {
            Some(home) if *home != self.self_id => {
                self.stats.forwarded += 1;
                out.push(RegionOutput::ToRegion {
                    to: home.clone(),
                    message: BetweenRegions::Forward { shard, message },
                });
            }
            _ => {
                self.buffer(shard, message, from_other_region, out);
                self.ask_home(shard, now, out);
            }
        }
    }

    fn buffer(
        &mut self,
        shard: ShardId,
        message: M,
        from_other_region: bool,
        out: &mut Vec<RegionOutput<M>>,
    ) {
        if self.buffered >= self.settings.buffer_size {
            self.stats.refused += 1;
            out.push(RegionOutput::Refused {
                message,
                error: RegionError::BufferFull {
                    capacity: self.settings.buffer_size,
                },
            });
            return;
        }
        self.buffered += 1;
        self.buffers.entry(shard).or_default().push_back(message);
        if from_other_region {
            *self.remote_buffered.entry(shard).or_default() += 1;
        }
    }

    /// Whether messages from other regions wait here for `shard`.
    fn holds_remote(&self, shard: ShardId) -> bool {
        self.remote_buffered.get(&shard).is_some_and(|n| *n > 0)
    }

    fn ask_home(&mut self, shard: ShardId, now: Instant, out: &mut Vec<RegionOutput<M>>) {
        if !self.registered {
            return;
        }
        let due = self
            .asked
            .get(&shard)
            .is_none_or(|at| now.duration_since(*at) >= self.settings.retry_interval);
        if due {
            self.asked.insert(shard, now);
            out.push(RegionOutput::ToCoordinator(ToCoordinator::GetShardHome {
                shard,
            }));
        }
    }

    /// Sends what is buffered for `shard` to where it now goes, in order.
    fn flush(&mut self, shard: ShardId, now: Instant, out: &mut Vec<RegionOutput<M>>) {
        let Some(mut queue) = self.buffers.remove(&shard) else {
            return;
        };
        self.remote_buffered.remove(&shard);
        self.buffered -= queue.len();
        while let Some(message) = queue.pop_front() {
            // Re-routed as if from another region: the buffer holds this node's own messages
            // and messages that reached it for a shard it did not run; both go on in order.
            let origin = Origin::Region(self.self_id.clone());
            self.route(origin, shard, message, now, out);
            if self.buffers.contains_key(&shard) {
                // It went back into a buffer: the rest must stay behind it.
                let rest = self.buffers.entry(shard).or_default();
                self.buffered += queue.len();
                rest.extend(queue);
                return;
            }
        }
    }

    /// A message from the coordinator node `from`.
    pub fn from_coordinator(
        &mut self,
        from: &RegionId,
        message: ToRegion,
        now: Instant,
    ) -> Vec<RegionOutput<M>> {
        let mut out = Vec::new();
        if self.view.coordinator.as_ref() != Some(from) {
            return out;
        }
        match message {
            ToRegion::RegisterAck => {
                if !self.registered {
                    self.registered = true;
                    self.asked.clear();
                    let waiting: Vec<ShardId> = self.buffers.keys().copied().collect();
                    for shard in waiting {
                        self.ask_home(shard, now, &mut out);
                    }
                }
                self.continue_shutdown(now, &mut out);
            }
            ToRegion::ShardHome { shard, region } => self.learn_home(shard, region, now, &mut out),
            ToRegion::HostShard { shard } => {
                if self.hosts_shards {
                    let me = self.self_id.clone();
                    self.learn_home(shard, me, now, &mut out);
                    out.push(RegionOutput::ToCoordinator(ToCoordinator::ShardStarted {
                        shard,
                    }));
                }
            }
            ToRegion::BeginHandOff {
                shard,
                owner,
                handoff,
            } => {
                self.handing_off.insert(shard);
                self.asked.remove(&shard);
                if owner == self.self_id {
                    // This node's callers stopped at `handing_off` from now on; all they sent
                    // before was delivered already.
                    out.push(RegionOutput::ToCoordinator(
                        ToCoordinator::BeginHandOffAck {
                            shard,
                            region: owner,
                            handoff,
                        },
                    ));
                } else {
                    self.homes.remove(&shard);
                    out.push(RegionOutput::ToRegion {
                        to: owner,
                        message: BetweenRegions::HandOffMarker { shard, handoff },
                    });
                }
            }
            ToRegion::HandOff { shard, handoff } => {
                self.homes.remove(&shard);
                match self.local.get(&shard).copied() {
                    Some(Hosted::Stopping(_)) => {
                        // Answered once it has stopped; remember which handoff to answer.
                        self.local.insert(shard, Hosted::Stopping(Some(handoff)));
                    }
                    Some(Hosted::Active) => {
                        self.stats.handoffs += 1;
                        self.stop_for_handoff(shard, handoff, now, &mut out);
                    }
                    None if self.answered.get(&shard) == Some(&handoff) => {
                        // A repeat: this region stopped the shard for this handoff already and
                        // must not run it again.
                        out.push(RegionOutput::ToCoordinator(ToCoordinator::ShardStopped {
                            shard,
                            handoff,
                        }));
                    }
                    // Messages of other regions that came before their markers reach the old
                    // incarnation; this node's own callers' wait for the next home.
                    None if self.hosts_shards && self.holds_remote(shard) => {
                        self.stats.handoffs += 1;
                        self.local.insert(shard, Hosted::Active);
                        out.push(RegionOutput::StartShard(shard));
                        self.stop_for_handoff(shard, handoff, now, &mut out);
                    }
                    None => {
                        self.answered.insert(shard, handoff);
                        out.push(RegionOutput::ToCoordinator(ToCoordinator::ShardStopped {
                            shard,
                            handoff,
                        }));
                    }
                }
            }
            ToRegion::GracefulShutdownAck { done } => {
                // Complete only when the coordinator holds nothing for this region any more
                // (a handoff given up leaves a shard here), and nothing is held here.
                if done
                    && matches!(self.shutdown, Shutdown::Requested { .. })
                    && self.local.is_empty()
                    && self.buffered == 0
                {
                    self.shutdown = Shutdown::Complete;
                    out.push(RegionOutput::ShutdownComplete);
                }
            }
        }
        out
    }

    fn learn_home(
        &mut self,
        shard: ShardId,
        region: RegionId,
        now: Instant,
        out: &mut Vec<RegionOutput<M>>,
    ) {
        self.handing_off.remove(&shard);
        self.asked.remove(&shard);
        self.homes.insert(shard, region.clone());
        if region == self.self_id {
            if !self.hosts_shards {
                return;
            }
            match self.local.get(&shard) {
                None => {
                    self.local.insert(shard, Hosted::Active);
                    out.push(RegionOutput::StartShard(shard));
                }
                Some(Hosted::Stopping(Some(_))) => {
                    // Sent after the handoff's `HandOff` (one ordered link): that handoff
                    // was given up, so the shard stays here.
                    self.local.insert(shard, Hosted::Stopping(None));
                }
                Some(_) => {}
            }
            // A shard still stopping restarts once stopped (see `shard_stopped`).
            if self.is_active(shard) {
                self.flush(shard, now, out);
            }
        } else {
            if self.local.get(&shard) == Some(&Hosted::Active) {
                // The coordinator says it lives elsewhere: stop our copy first; what arrives
                // meanwhile is buffered and follows it.
                self.local.insert(shard, Hosted::Stopping(None));
                out.push(RegionOutput::StopShard(shard));
                return;
            }
            if !self.local.contains_key(&shard) {
                self.flush(shard, now, out);
            }
        }
    }

    /// Delivers whatever waits here for the running `shard`, then stops it. The owner answers
    /// `ShardStopped` only with nothing held for the shard: every message that reached it
    /// before the markers goes to the old incarnation, so none can arrive at the new home
    /// after a later message of the same sender.
    fn stop_for_handoff(
        &mut self,
        shard: ShardId,
        handoff: HandoffId,
        now: Instant,
        out: &mut Vec<RegionOutput<M>>,
    ) {
        self.flush(shard, now, out);
        self.local.insert(shard, Hosted::Stopping(Some(handoff)));
        out.push(RegionOutput::StopShard(shard));
    }

    /// A region's marker for `shard` reached this node (the owner): relay it.
    pub fn marker(
        &mut self,
        from: RegionId,
        shard: ShardId,
        handoff: HandoffId,
    ) -> Vec<RegionOutput<M>> {
        vec![RegionOutput::ToCoordinator(
            ToCoordinator::BeginHandOffAck {
                shard,
                region: from,
                handoff,
            },
        )]
    }

    /// The entities of `shard` have stopped (after [`RegionOutput::StopShard`]).
    pub fn shard_stopped(&mut self, shard: ShardId, now: Instant) -> Vec<RegionOutput<M>> {
        let mut out = Vec::new();
        let Some(Hosted::Stopping(handoff)) = self.local.get(&shard).copied() else {
            return out;
        };
        self.local.remove(&shard);
        if let Some(handoff) = handoff {
            if self.holds_remote(shard) {
                // Other regions' messages reached it while it stopped: a fresh incarnation
                // takes them (and whatever else waits) first.
                self.local.insert(shard, Hosted::Active);
                out.push(RegionOutput::StartShard(shard));
                self.stop_for_handoff(shard, handoff, now, &mut out);
                return out;
            }
            self.answered.insert(shard, handoff);
            out.push(RegionOutput::ToCoordinator(ToCoordinator::ShardStopped {
                shard,
                handoff,
            }));
        }
        match self.homes.get(&shard).cloned() {
            Some(home) if home == self.self_id => {
                // Told to host it again while it stopped (a handoff given up).
                self.local.insert(shard, Hosted::Active);
                out.push(RegionOutput::StartShard(shard));
                self.flush(shard, now, &mut out);
            }
            Some(_) => self.flush(shard, now, &mut out),
            None => {
                if self.buffers.contains_key(&shard) {
                    self.ask_home(shard, now, &mut out);
                }
            }
        }
        self.continue_shutdown(now, &mut out);
        out
    }

    /// The node's membership view changed.
    pub fn membership(&mut self, view: RegionView, now: Instant) -> Vec<RegionOutput<M>> {
        let mut out = Vec::new();
        let coordinator_changed = view.coordinator != self.view.coordinator;
        let now_up = self.view.self_joining && !view.self_joining;
        self.view = view;
        let members = &self.view.members;
        let me = &self.self_id;
        // Homes at nodes that are gone: their shards will be allocated anew.
        self.homes
            .retain(|_, home| home == me || members.contains(home));
        if coordinator_changed {
            self.registered = false;
            self.last_register = None;
            self.asked.clear();
            self.register(now, &mut out);
        } else if now_up && !self.registered {
            self.register(now, &mut out);
        }
        out
    }

    fn register(&mut self, now: Instant, out: &mut Vec<RegionOutput<M>>) {
        if self.view.coordinator.is_none() || (self.hosts_shards && self.view.self_joining) {
            return;
        }
        self.last_register = Some(now);
        out.push(RegionOutput::ToCoordinator(if self.hosts_shards {
            ToCoordinator::Register
        } else {
            ToCoordinator::RegisterProxy
        }));
    }

    /// Timers: registration, questions for buffered shards, the shutdown request.
    pub fn tick(&mut self, now: Instant) -> Vec<RegionOutput<M>> {
        let mut out = Vec::new();
        // Registration is repeated sooner than other questions: until it is acknowledged the
        // region cannot ask for any shard's home, and a new coordinator starts without notice.
        let register_every = self.settings.retry_interval.min(REGISTER_RETRY_INTERVAL);
        if !self.registered
            && self
                .last_register
                .is_none_or(|at| now.duration_since(at) >= register_every)
        {
            self.register(now, &mut out);
        }
        let waiting: Vec<ShardId> = self.buffers.keys().copied().collect();
        for shard in waiting {
            self.ask_home(shard, now, &mut out);
        }
        if let Shutdown::Requested { last_sent } = self.shutdown
            && self.hosts_shards
            && now.duration_since(last_sent) >= self.settings.retry_interval
        {
            self.shutdown = Shutdown::Requested { last_sent: now };
            out.push(RegionOutput::ToCoordinator(
                ToCoordinator::GracefulShutdownRequest,
            ));
        }
        self.continue_shutdown(now, &mut out);
        out
    }

    /// Starts a graceful shutdown: the coordinator moves every shard away; once it says none
    /// is left for this region, none runs here and nothing is buffered,
    /// [`RegionOutput::ShutdownComplete`] follows. The request is repeated every
    /// `retry_interval` until then.
    pub fn begin_shutdown(&mut self, now: Instant) -> Vec<RegionOutput<M>> {
        let mut out = Vec::new();
        if self.shutdown != Shutdown::Running {
            return out;
        }
        self.shutdown = Shutdown::Requested { last_sent: now };
        if self.hosts_shards {
            out.push(RegionOutput::ToCoordinator(
                ToCoordinator::GracefulShutdownRequest,
            ));
        }
        self.continue_shutdown(now, &mut out);
        out
    }

    pub fn is_shutdown_complete(&self) -> bool {
        self.shutdown == Shutdown::Complete
    }

    /// A proxy completes once nothing is held; a region completes on the coordinator's word.
    fn continue_shutdown(&mut self, _now: Instant, out: &mut Vec<RegionOutput<M>>) {
        if let Shutdown::Requested { .. } = self.shutdown
            && !self.hosts_shards
            && self.buffered == 0
        {
            self.shutdown = Shutdown::Complete;
            out.push(RegionOutput::ShutdownComplete);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_cluster::{Address, UniqueAddress};

    fn id(port: u16) -> RegionId {
        UniqueAddress {
            address: Address::new("10.9.0.1", port),
            uid: u64::from(port),
        }
    }

    fn settings() -> ShardingSettings {
        ShardingSettings {
            number_of_shards: 10,
            ..ShardingSettings::default()
        }
    }

    /// The owner stops a shard for a handoff while its own callers keep sending: their
    /// messages wait for the next home (they came after the owner's own acknowledgement) and
    /// the stop is answered; only messages of other regions would restart the old incarnation.
    /// Found by `tests/sharding_process.rs` (a node joining under load): the coordinator
    /// saw the new node Up a gossip round before the node did, gave it shards, and their
    /// entities could not recover there ("not an Up member"). A hosting region registers
    /// only once its own node sees itself Up.
    #[test]
    fn a_region_registers_to_host_only_once_its_node_sees_itself_up() {
        let me = id(1);
        let coordinator = id(9);
        let t0 = Instant::now();
        let view = |self_joining| RegionView {
            members: [me.clone(), coordinator.clone()].into_iter().collect(),
            coordinator: Some(coordinator.clone()),
            self_joining,
        };
        let registers = |out: &[RegionOutput<u64>]| {
            out.iter()
                .any(|o| matches!(o, RegionOutput::ToCoordinator(ToCoordinator::Register)))
        };
        let mut region: ShardRegion<u64> = ShardRegion::new(settings(), me.clone(), true);
        assert!(!registers(&region.membership(view(true), t0)));
        assert!(!registers(&region.tick(t0 + Duration::from_secs(5))));
        assert!(registers(
            &region.membership(view(false), t0 + Duration::from_secs(6))
        ));
        // A proxy hosts nothing: it registers at once.
        let mut proxy: ShardRegion<u64> = ShardRegion::new(settings(), me.clone(), false);
        assert!(
            proxy
                .membership(view(true), t0)
                .iter()
                .any(|o| matches!(o, RegionOutput::ToCoordinator(ToCoordinator::RegisterProxy)))
        );
    }

    /// Messages for shards whose home is not known wait in one bounded buffer: past
    /// `buffer_size` each is refused with a typed error (not delivered), and those that waited
    /// are delivered in order once the home is known.
    #[test]
    fn a_full_buffer_refuses_with_a_typed_error_and_keeps_what_it_holds() {
        let me = id(1);
        let coordinator = id(9);
        let shard = ShardId(4);
        let t0 = Instant::now();
        let settings = ShardingSettings {
            buffer_size: 3,
            ..settings()
        };
        let mut region: ShardRegion<u64> = ShardRegion::new(settings, me.clone(), true);
        region.membership(
            RegionView {
                members: [me.clone(), coordinator.clone()].into_iter().collect(),
                coordinator: Some(coordinator.clone()),
                self_joining: false,
            },
            t0,
        );
        region.from_coordinator(&coordinator, ToRegion::RegisterAck, t0);
        let mut refused = Vec::new();
        for seq in 0..5 {
            for output in region.deliver(Origin::Local, shard, seq, t0) {
                if let RegionOutput::Refused { message, error } = output {
                    refused.push((message, error));
                }
            }
        }
        let full = RegionError::BufferFull { capacity: 3 };
        assert_eq!(refused, [(3, full.clone()), (4, full)]);
        assert_eq!(region.buffered(), 3);
        assert!(
            refused[0].1.to_string().contains("buffer") && refused[0].1.to_string().contains("3")
        );
        let out = region.from_coordinator(&coordinator, ToRegion::HostShard { shard }, t0);
        let delivered: Vec<u64> = out
            .iter()
            .filter_map(|o| match o {
                RegionOutput::DeliverLocal { message, .. } => Some(*message),
                _ => None,
            })
            .collect();
        assert_eq!(delivered, [0, 1, 2], "{out:?}");
        assert_eq!(region.buffered(), 0);
    }

    #[test]
    fn local_traffic_during_a_stop_waits_for_the_next_home() {
        let owner = id(1);
        let other = id(2);
        let coordinator = id(9);
        let shard = ShardId(3);
        let t0 = Instant::now();
        let mut region: ShardRegion<u64> = ShardRegion::new(settings(), owner.clone(), true);
        region.membership(
            RegionView {
                members: [owner.clone(), other.clone(), coordinator.clone()]
                    .into_iter()
                    .collect(),
                coordinator: Some(coordinator.clone()),
                self_joining: false,
            },
            t0,
        );
        region.from_coordinator(&coordinator, ToRegion::RegisterAck, t0);
        region.from_coordinator(&coordinator, ToRegion::HostShard { shard }, t0);
        let handoff = HandoffId {
            coordinator_nonce: 7,
            number: 1,
        };
        region.from_coordinator(
            &coordinator,
            ToRegion::BeginHandOff {
                shard,
                owner: owner.clone(),
                handoff,
            },
            t0,
        );
        let out = region.from_coordinator(&coordinator, ToRegion::HandOff { shard, handoff }, t0);
        assert!(out.contains(&RegionOutput::StopShard(shard)));
        for seq in 0..5 {
            region.deliver(Origin::Local, shard, seq, t0);
        }
        let out = region.shard_stopped(shard, t0);
        assert!(
            out.contains(&RegionOutput::ToCoordinator(ToCoordinator::ShardStopped {
                shard,
                handoff
            })),
            "{out:?}"
        );
        assert!(!out.contains(&RegionOutput::StartShard(shard)));
        assert_eq!(region.buffered(), 5, "kept for the next home");

        // A message from another region that reached the stopping owner restarts it first.
        let second = HandoffId {
            coordinator_nonce: 7,
            number: 2,
        };
        region.from_coordinator(
            &coordinator,
            ToRegion::ShardHome {
                shard,
                region: owner.clone(),
            },
            t0,
        );
        region.from_coordinator(
            &coordinator,
            ToRegion::BeginHandOff {
                shard,
                owner: owner.clone(),
                handoff: second,
            },
            t0,
        );
        region.from_coordinator(
            &coordinator,
            ToRegion::HandOff {
                shard,
                handoff: second,
            },
            t0,
        );
        region.deliver(Origin::Region(other.clone()), shard, 99, t0);
        let out = region.shard_stopped(shard, t0);
        assert!(out.contains(&RegionOutput::StartShard(shard)), "{out:?}");
        assert!(out.contains(&RegionOutput::DeliverLocal { shard, message: 99 }));
        assert!(out.contains(&RegionOutput::StopShard(shard)));
    }
}
