//! Serving: one operation at a time, acknowledged once W members of the configuration hold
//! it; members that fall behind are copied to in the background; a configuration that lost
//! a member (its node left the cluster, or came back with another store) gains the next
//! member of the placement, one member per change.

use super::follower::{Follower, FollowerState, Heard, LogView};
use super::{
    Ctx, Next, NotApplied, OpId, Operation, Outcome, Output, Queued, RecoverFrom, RequestId,
    StopReason, Target, WriterStatus,
};
use crate::configuration::{Configuration, ReplicaId};
use crate::epoch::{Epoch, Position};
use crate::message::{Entry, Payload, Request, Response};
use crate::replica::{MAX_READ_LEASE, writer_lease};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};
use tessera_cluster::Address;

#[derive(Debug)]
enum InFlight {
    Append {
        op: OpId,
        last_seq: u64,
        started: Instant,
    },
    /// A delete, or a confirmation (`to: None`): empty writes to the members, counted.
    /// `started` is when they were sent, before any replica took them: a lease counts from
    /// there.
    Quorum {
        op: OpId,
        to: Option<u64>,
        started: Instant,
        requests: BTreeMap<RequestId, ReplicaId>,
        acks: BTreeSet<ReplicaId>,
        /// Members that granted the whole lease asked for (a confirmation's).
        leased: BTreeSet<ReplicaId>,
    },
}

impl InFlight {
    fn op(&self) -> OpId {
        match self {
            InFlight::Append { op, .. } | InFlight::Quorum { op, .. } => *op,
        }
    }

    fn started(&self) -> Instant {
        match self {
            InFlight::Append { started, .. } | InFlight::Quorum { started, .. } => *started,
        }
    }
}

/// The lease a confirmation round asks for, in whole milliseconds as it travels (rounded
/// down, capped at what replicas grant): the writer counts on no more than that.
fn requested_lease_ms(read_lease: Duration) -> u64 {
    u64::try_from(read_lease.min(MAX_READ_LEASE).as_millis()).unwrap_or(0)
}

pub(crate) struct Serving<P> {
    epoch: Epoch,
    config: Configuration,
    last: Position,
    lac: u64,
    deleted_to: u64,
    followers: BTreeMap<ReplicaId, Follower>,
    window: BTreeMap<u64, Entry<P>>,
    in_flight: Option<InFlight>,
    /// A configuration change waiting for the storage id of the member it adds.
    probing: Option<(RequestId, Address)>,
    /// Until then a read lease from W members runs (by this writer's clock, with the drift
    /// margin taken off): no other writer can recover the log, so confirmations need no
    /// round.
    lease_until: Option<Instant>,
    /// When the members that hold the log but not yet its acknowledged mark are told it,
    /// should no write carry it before (see [`crate::WriterSettings::mark_delay`]).
    mark_due: Option<Instant>,
    /// Times the mark was told since the last acknowledgement without every member that
    /// holds the log learning it (bounded by [`MARK_ATTEMPTS`]).
    mark_attempts: u32,
}

/// Times a writer tells its members the acknowledged mark, each after twice the wait
/// before (from `mark_delay`, at most [`MARK_RETRY_MAX`]), before it leaves the members that
/// did not learn it to the next write or to a recovery: a member it cannot reach must not
/// keep the writer busy forever.
pub const MARK_ATTEMPTS: u32 = 8;

/// The longest wait between two tellings of the mark.
pub const MARK_RETRY_MAX: Duration = Duration::from_secs(1);

impl<P: Payload> Serving<P> {
    pub fn new(
        epoch: Epoch,
        config: Configuration,
        last: Position,
        deleted_to: u64,
        followers: BTreeMap<ReplicaId, Follower>,
        window: BTreeMap<u64, Entry<P>>,
        sealed: &BTreeSet<ReplicaId>,
    ) -> Self {
        let mut followers = followers;
        for (id, follower) in followers.iter_mut() {
            if sealed.contains(id) {
                follower.matched = last.seq;
                follower.has_config = true;
            }
        }
        Serving {
            epoch,
            config,
            last,
            lac: last.seq,
            deleted_to,
            followers,
            window,
            in_flight: None,
            probing: None,
            lease_until: None,
            mark_due: None,
            mark_attempts: 0,
        }
    }

    /// The members are told the acknowledged mark at the next tick from `now` (a recovered
    /// log is acknowledged up to its end once the barrier is).
    pub fn owe_mark(mut self, now: Instant) -> Self {
        self.mark_due = Some(now);
        self
    }

    /// Whether members wait to learn the acknowledged mark.
    pub fn owes_mark(&self) -> bool {
        self.mark_due.is_some()
    }

    /// Whether a follower waits to be asked again after a failed request.
    pub fn waits_out_a_backoff(&self) -> bool {
        self.followers
            .values()
            .any(|f| matches!(f.state, FollowerState::Backoff(_)))
    }

    pub fn last(&self) -> Position {
        self.last
    }

    pub fn deleted_to(&self) -> u64 {
        self.deleted_to
    }

    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    pub fn status(&self) -> WriterStatus {
        WriterStatus {
            phase: "serving",
            epoch: Some(self.epoch),
            config: Some(self.config.clone()),
            highest: Some(self.last.seq),
            lac: Some(self.lac),
            matched: self
                .followers
                .values()
                .map(|f| (f.id.clone(), f.matched))
                .collect(),
        }
    }

    /// Members holding the log up to its last entry, `local` first.
    pub fn read_sources(&self, local: Option<&Address>) -> Vec<ReplicaId> {
        let mut sources: Vec<ReplicaId> = self
            .followers
            .values()
            .filter(|f| self.holds_all(f))
            .map(|f| f.id.clone())
            .collect();
        sources.sort_by_key(|r| Some(&r.address) != local);
        sources
    }

    /// Whether `follower` holds the log up to its last entry.
    fn holds_all(&self, follower: &Follower) -> bool {
        follower.matched >= self.last.seq && follower.state != FollowerState::Lost
    }

    fn in_sync(&self) -> Vec<ReplicaId> {
        self.read_sources(None)
    }

    /// Called when the phase begins: carry on copying to the members that need it.
    pub fn start(&mut self, ctx: &mut Ctx<'_, P>, queue: &mut VecDeque<Queued<P>>) -> Next<P> {
        let members: Vec<ReplicaId> = self.followers.keys().cloned().collect();
        for member in members {
            self.drive(ctx, &member);
        }
        self.pump(ctx, queue)
    }

    /// Copies to a follower that is behind, or probes one not heard from.
    fn drive(&mut self, ctx: &mut Ctx<'_, P>, member: &ReplicaId) {
        // A busy member (the usual case, just after a write went out) costs no more than
        // this, and one that is up to date (the usual case when it answered) no list of the
        // members to read from.
        let target = self.last.seq;
        let Some(needs_sources) = self
            .followers
            .get(member)
            .filter(|f| f.is_idle())
            .map(|f| f.known && f.is_behind(target))
        else {
            return;
        };
        let sources = if needs_sources {
            self.in_sync()
        } else {
            Vec::new()
        };
        let view = LogView {
            epoch: self.epoch,
            lac: self.lac,
            target: self.last,
            window: &self.window,
            sources: &sources,
            config: &self.config,
        };
        let Some(follower) = self.followers.get_mut(member) else {
            return;
        };
        if !follower.is_idle() {
            return;
        }
        if !follower.known && view.target.seq > 0 {
            follower.probe(ctx, &view);
        } else {
            follower.copy(ctx, &view);
        }
    }

    /// Starts the next queued operation when none is in flight.
    pub fn pump(&mut self, ctx: &mut Ctx<'_, P>, queue: &mut VecDeque<Queued<P>>) -> Next<P> {
        while self.in_flight.is_none() && self.probing.is_none() {
            let Some(queued) = queue.pop_front() else {
                break;
            };
            match queued.operation {
                Operation::Append {
                    first_seq,
                    payloads,
                } => self.start_append(ctx, queued.op, first_seq, payloads),
                Operation::DeleteTo { to } => self.start_delete(ctx, queued.op, to),
                Operation::Confirm { highest } => self.start_confirm(ctx, queued.op, highest),
            }
        }
        if self.in_flight.is_none() && self.probing.is_none() {
            return self.maybe_reconfigure(ctx);
        }
        Next::Stay
    }

    fn start_append(&mut self, ctx: &mut Ctx<'_, P>, op: OpId, first_seq: u64, payloads: Vec<P>) {
        let expected = self.last.seq + 1;
        if first_seq != expected || payloads.is_empty() {
            ctx.out.push(Output::Completed {
                op,
                outcome: Outcome::NotApplied(NotApplied::SequenceMismatch {
                    expected,
                    got: first_seq,
                }),
            });
            return;
        }
        let prev = self.last;
        let mut entries: Vec<Entry<P>> = payloads
            .into_iter()
            .enumerate()
            .map(|(i, payload)| Entry {
                seq: first_seq + i as u64,
                epoch: self.epoch,
                payload,
            })
            .collect();
        let last_seq = first_seq + entries.len() as u64 - 1;
        // The idle members in sync get the entries at once; the others catch up from the
        // window as they become idle.
        let idle: Vec<ReplicaId> = self
            .followers
            .values()
            .filter(|f| f.is_idle() && self.holds_all(f))
            .map(|f| f.id.clone())
            .collect();
        self.last = Position::new(last_seq, self.epoch);
        for entry in &entries {
            self.window.insert(entry.seq, entry.clone());
        }
        while self.window.len() > ctx.settings.max_buffered_entries {
            self.window.pop_first();
        }
        // The window keeps a copy; the last member takes the writer's own.
        let members = idle.len();
        for (i, member) in idle.into_iter().enumerate() {
            let Some(follower) = self.followers.get_mut(&member) else {
                continue;
            };
            let entries = if i + 1 == members {
                std::mem::take(&mut entries)
            } else {
                entries.clone()
            };
            let request = ctx.send(
                Target::Replica(member.clone()),
                Request::Append {
                    epoch: self.epoch,
                    prev,
                    entries,
                    lac: self.lac,
                    config: (!follower.has_config).then(|| self.config.clone()),
                },
            );
            follower.state = FollowerState::Appending {
                request,
                to_seq: last_seq,
            };
        }
        self.in_flight = Some(InFlight::Append {
            op,
            last_seq,
            started: ctx.now,
        });
        let idle: Vec<ReplicaId> = self
            .followers
            .values()
            .filter(|f| f.is_idle())
            .map(|f| f.id.clone())
            .collect();
        for member in idle {
            self.drive(ctx, &member);
        }
    }

    /// An empty write of the writer's epoch and mark to an in-sync member.
    fn send_mark(&self, ctx: &mut Ctx<'_, P>, member: &ReplicaId) -> RequestId {
        let has_config = self.followers.get(member).is_some_and(|f| f.has_config);
        ctx.send(
            Target::Replica(member.clone()),
            Request::Append {
                epoch: self.epoch,
                prev: self.last,
                entries: Vec::new(),
                lac: self.lac,
                config: (!has_config).then(|| self.config.clone()),
            },
        )
    }

    fn start_delete(&mut self, ctx: &mut Ctx<'_, P>, op: OpId, to: u64) {
        let to = to.min(self.lac);
        if to <= self.deleted_to {
            ctx.out.push(Output::Completed {
                op,
                outcome: Outcome::Acknowledged,
            });
            return;
        }
        let mut requests = BTreeMap::new();
        for member in self.in_sync() {
            // The mark first, so the replica knows `to` is acknowledged; the connection keeps
            // the two in order.
            self.send_mark(ctx, &member);
            let id = ctx.send(
                Target::Replica(member.clone()),
                Request::DeleteTo {
                    epoch: self.epoch,
                    to,
                },
            );
            requests.insert(id, member);
        }
        self.in_flight = Some(InFlight::Quorum {
            op,
            to: Some(to),
            started: ctx.now,
            requests,
            acks: BTreeSet::new(),
            leased: BTreeSet::new(),
        });
    }

    fn start_confirm(&mut self, ctx: &mut Ctx<'_, P>, op: OpId, highest: u64) {
        if highest != self.last.seq {
            ctx.out.push(Output::Completed {
                op,
                outcome: Outcome::NotApplied(NotApplied::SequenceMismatch {
                    expected: self.last.seq + 1,
                    got: highest + 1,
                }),
            });
            return;
        }
        if self.lease_until.is_some_and(|until| ctx.now < until) {
            ctx.counters.confirms_from_lease += 1;
            ctx.out.push(Output::Completed {
                op,
                outcome: Outcome::Acknowledged,
            });
            return;
        }
        let lease_ms = requested_lease_ms(ctx.settings.read_lease);
        let mut requests = BTreeMap::new();
        for member in self.in_sync() {
            let has_config = self.followers.get(&member).is_some_and(|f| f.has_config);
            let id = ctx.send(
                Target::Replica(member.clone()),
                Request::Confirm {
                    epoch: self.epoch,
                    prev: self.last,
                    lac: self.lac,
                    config: (!has_config).then(|| self.config.clone()),
                    lease_ms,
                },
            );
            requests.insert(id, member);
        }
        self.in_flight = Some(InFlight::Quorum {
            op,
            to: None,
            started: ctx.now,
            requests,
            acks: BTreeSet::new(),
            leased: BTreeSet::new(),
        });
    }

    /// Completes the append in flight once W members hold it.
    fn check_commit(&mut self, ctx: &mut Ctx<'_, P>) {
        let Some(InFlight::Append { op, last_seq, .. }) = &self.in_flight else {
            return;
        };
        let (op, last_seq) = (*op, *last_seq);
        let quorums = ctx.settings.quorums;
        let holding: Vec<&ReplicaId> = self
            .followers
            .values()
            .filter(|f| f.matched >= last_seq)
            .map(|f| &f.id)
            .collect();
        if self
            .config
            .has_quorum(holding.iter().copied(), |n| quorums.acks(n))
        {
            self.lac = self.lac.max(last_seq);
            self.mark_attempts = 0;
            self.mark_due
                .get_or_insert(ctx.now + ctx.settings.mark_delay);
            self.in_flight = None;
            ctx.out.push(Output::Completed {
                op,
                outcome: Outcome::Acknowledged,
            });
        }
    }

    pub fn on_response(
        &mut self,
        ctx: &mut Ctx<'_, P>,
        id: RequestId,
        _to: &Target,
        response: Response<P>,
    ) -> Next<P> {
        if let Some((probe, address)) = &self.probing
            && *probe == id
        {
            let address = address.clone();
            self.probing = None;
            return match response {
                Response::Located { storage_id, .. } => {
                    self.reconfigure_with(ctx, ReplicaId::new(address, storage_id))
                }
                _ => Next::Stay,
            };
        }
        if let Some(InFlight::Quorum {
            op,
            to,
            started,
            requests,
            acks,
            leased,
        }) = &mut self.in_flight
            && let Some(member) = requests.remove(&id)
        {
            match response {
                Response::Deleted { .. }
                | Response::Appended { .. }
                | Response::Confirmed { .. } => {
                    let requested = requested_lease_ms(ctx.settings.read_lease);
                    if let Response::Confirmed { lease_ms, .. } = response
                        && requested > 0
                        && lease_ms >= requested
                    {
                        leased.insert(member.clone());
                    }
                    acks.insert(member);
                    let quorums = ctx.settings.quorums;
                    if self.config.has_quorum(acks.iter(), |n| quorums.acks(n)) {
                        let (op, to, started) = (*op, *to, *started);
                        match to {
                            Some(to) => self.deleted_to = self.deleted_to.max(to),
                            None => {
                                // W members granted the lease, each after `started`.
                                let lease = writer_lease(Duration::from_millis(
                                    requested_lease_ms(ctx.settings.read_lease),
                                ));
                                if !lease.is_zero()
                                    && self.config.has_quorum(leased.iter(), |n| quorums.acks(n))
                                {
                                    self.lease_until = Some(started + lease);
                                }
                            }
                        }
                        self.in_flight = None;
                        ctx.out.push(Output::Completed {
                            op,
                            outcome: Outcome::Acknowledged,
                        });
                    }
                }
                Response::Fenced { promise } => {
                    return Next::Stop(StopReason::Fenced { by: promise });
                }
                _ => {}
            }
            return Next::Stay;
        }
        let Some(member) = self
            .followers
            .values()
            .find(|f| f.waits_for(id))
            .map(|f| f.id.clone())
        else {
            // An answer to a request the phase no longer tracks (a mark sent with a delete,
            // or one sent before a recovery); a fence still counts.
            if let Response::Fenced { promise } = response {
                return Next::Stop(StopReason::Fenced { by: promise });
            }
            return Next::Stay;
        };
        let sources = self.in_sync();
        let view = LogView {
            epoch: self.epoch,
            lac: self.lac,
            target: self.last,
            window: &self.window,
            sources: &sources,
            config: &self.config,
        };
        let heard = match self.followers.get_mut(&member) {
            Some(f) => f.on_response(ctx, &view, response),
            None => Heard::Nothing,
        };
        match heard {
            Heard::Fenced(by) => return Next::Stop(StopReason::Fenced { by }),
            Heard::Invalid(reason) => return Next::Stop(StopReason::Inconsistent(reason)),
            Heard::Sealed | Heard::Progress | Heard::Nothing => {}
        }
        self.check_commit(ctx);
        self.drive(ctx, &member);
        Next::Stay
    }

    pub fn on_failure(&mut self, ctx: &mut Ctx<'_, P>, id: RequestId, _to: &Target) -> Next<P> {
        if self.probing.as_ref().is_some_and(|(p, _)| *p == id) {
            self.probing = None;
            return Next::Stay;
        }
        if let Some(f) = self.followers.values_mut().find(|f| f.waits_for(id)) {
            f.on_failure(ctx.now, ctx.settings.retry_interval);
        }
        Next::Stay
    }

    pub fn on_lost(&mut self, ctx: &mut Ctx<'_, P>, id: RequestId, to: &Target) -> Next<P> {
        if let Target::Replica(member) = to
            && let Some(f) = self.followers.get_mut(member)
            && f.waits_for(id)
        {
            f.state = FollowerState::Lost;
            return Next::Stay;
        }
        self.on_failure(ctx, id, to)
    }

    pub fn tick(&mut self, ctx: &mut Ctx<'_, P>) -> Next<P> {
        if let Some(in_flight) = &self.in_flight
            && ctx.now.saturating_duration_since(in_flight.started())
                >= ctx.settings.operation_timeout
        {
            let reason = format!(
                "too few replicas of {} acknowledged it within {:?}",
                self.config, ctx.settings.operation_timeout
            );
            return Next::Stop(StopReason::OutcomeUnknown(reason));
        }
        let woken: Vec<ReplicaId> = self
            .followers
            .values_mut()
            .filter_map(|f| f.wake(ctx.now).then(|| f.id.clone()))
            .collect();
        for member in woken {
            self.drive(ctx, &member);
        }
        self.tell_mark(ctx);
        Next::Stay
    }

    /// Once the mark is due and nothing in flight carries it: an empty append to each idle
    /// member that holds the whole log but does not know how much of it is acknowledged;
    /// told again, later each time, while one of them has not learnt it (a lost message).
    fn tell_mark(&mut self, ctx: &mut Ctx<'_, P>) {
        let Some(due) = self.mark_due else {
            return;
        };
        if due > ctx.now || self.in_flight.is_some() {
            return;
        }
        self.mark_due = None;
        let behind = self
            .followers
            .values()
            .any(|f| f.committed < self.lac && f.matched >= self.last.seq);
        if behind && self.mark_attempts < MARK_ATTEMPTS {
            let wait = ctx
                .settings
                .mark_delay
                .saturating_mul(2u32.saturating_pow(self.mark_attempts + 1))
                .min(MARK_RETRY_MAX);
            self.mark_attempts += 1;
            self.mark_due = Some(ctx.now + wait);
        } else {
            self.mark_attempts = 0;
        }
        let view = LogView {
            epoch: self.epoch,
            lac: self.lac,
            target: self.last,
            window: &self.window,
            sources: &[],
            config: &self.config,
        };
        for follower in self.followers.values_mut() {
            if follower.is_idle()
                && follower.committed < self.lac
                && follower.matched >= self.last.seq
            {
                follower.probe(ctx, &view);
            }
        }
    }

    /// Members of the configuration whose replica is gone: their node left the cluster, or
    /// it has another store now.
    fn lost_members(&self, ctx: &Ctx<'_, P>) -> Vec<ReplicaId> {
        self.config
            .members
            .iter()
            .filter(|m| {
                !ctx.placement.members.contains(&m.address)
                    || self
                        .followers
                        .get(*m)
                        .is_some_and(|f| f.state == FollowerState::Lost)
            })
            .cloned()
            .collect()
    }

    /// When idle: finish a change (a joint configuration settles on its new members), or, if
    /// a member is gone or the configuration is smaller than N, ask the next member of the
    /// placement for its store id; the change follows its answer.
    fn maybe_reconfigure(&mut self, ctx: &mut Ctx<'_, P>) -> Next<P> {
        if self.config.is_joint() {
            let settled = self.config.settled();
            return Next::Recover(RecoverFrom {
                configs: vec![self.config.clone(), settled.clone()],
                target: Some(settled),
                creating: false,
                seen: self.epoch,
                seen_at: BTreeMap::new(),
            });
        }
        let lost = self.lost_members(ctx);
        let n = ctx.settings.quorums.replication_factor();
        if lost.is_empty() && self.config.members.len() >= n {
            return Next::Stay;
        }
        let keep: BTreeSet<&Address> = self
            .config
            .members
            .iter()
            .filter(|m| !lost.contains(m))
            .map(|m| &m.address)
            .collect();
        let Some(candidate) = ctx
            .placement
            .preference
            .iter()
            .find(|a| !keep.contains(a))
            .cloned()
        else {
            return Next::Stay;
        };
        let id = ctx.send(Target::Address(candidate.clone()), Request::Locate);
        self.probing = Some((id, candidate));
        Next::Stay
    }

    fn reconfigure_with(&mut self, ctx: &mut Ctx<'_, P>, added: ReplicaId) -> Next<P> {
        if let Some(member) = self.config.all_members().into_iter().find(|m| *m == added) {
            if member.address == added.address {
                return Next::Stay;
            }
            // Not a new replica: a member whose node came back at another address with its
            // store. The configuration records the new address (same replicas, same quorums).
            let seen_at = [(added.storage_id, added.address.clone())].into();
            let mut moved = self.config.relocated(&seen_at);
            moved.version += 1;
            return Next::Recover(RecoverFrom {
                configs: vec![self.config.clone(), moved.clone()],
                target: Some(moved),
                creating: false,
                seen: self.epoch,
                seen_at,
            });
        }
        let lost = self.lost_members(ctx);
        let mut members = self.config.members.clone();
        match lost.first() {
            Some(gone) => {
                if let Some(slot) = members.iter_mut().find(|m| *m == gone) {
                    *slot = added;
                }
            }
            None if members.len() < ctx.settings.quorums.replication_factor() => {
                members.push(added)
            }
            None => return Next::Stay,
        }
        let new = self.config.joint(members);
        Next::Recover(RecoverFrom {
            configs: vec![self.config.clone(), new.clone()],
            target: Some(new),
            creating: false,
            seen: self.epoch,
            seen_at: BTreeMap::new(),
        })
    }

    /// The writer stops: the operation in flight was sent, so its outcome is unknown.
    pub fn fail_in_flight(&mut self, reason: &StopReason, out: &mut Vec<Output<P>>) {
        if let Some(in_flight) = self.in_flight.take() {
            out.push(Output::Completed {
                op: in_flight.op(),
                outcome: Outcome::Unknown(reason.to_string()),
            });
        }
    }

    /// A configuration change begins only when nothing is in flight; should one be, its
    /// outcome is unknown.
    pub fn abandon_in_flight(&mut self, out: &mut Vec<Output<P>>) {
        let reason = StopReason::OutcomeUnknown("the log's configuration changed".into());
        self.fail_in_flight(&reason, out);
    }
}
