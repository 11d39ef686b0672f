//! The writer of one log, as a plain state machine (docs/src/design.md §2, §5): it finds the log,
//! fences it, recovers and repairs its tail, seals it, then appends with W acknowledgements,
//! copies to replicas that fell behind, and moves the log off members that left.
//!
//! Inputs are method calls with `now`; outputs ([`Output`]) are requests to send, completed
//! operations and the writer's end. It reads no clock and does no IO: the tokio layer sends
//! the requests and feeds back answers and failures ([`LogWriter::on_response`],
//! [`LogWriter::on_failure`]), and the simulation does the same over a simulated network.
//!
//! Phases: `Locating` (which configuration holds the log, or prove it is new) →
//! `Recovering` (prepare a new epoch on the configuration, adopt the best tail, copy it to the
//! members that lack it, seal it on W of them) → `Serving` (one operation at a time) →
//! `Stopped`. A configuration change is a recovery on the old and the new configuration at
//! once (promises and seals from a quorum of each), so that any later recovery, whichever of
//! the two it starts from, finds the new one; a recovery that finds a later configuration
//! than the one it started on adds it to the ones it recovers on.
//!
//! Outcomes are exact: an operation is `Acknowledged` once W replicas hold it; `NotApplied`
//! when nothing of it was sent (it can never appear); `Unknown` when it was sent but the
//! writer was fenced or timed out (it may appear later). After an unknown outcome or a fence
//! the writer stops; the next writer recovers the truth.

mod follower;
mod locate;
mod recovery;
mod serving;

use crate::configuration::{Configuration, Quorums, ReplicaId};
use crate::epoch::Epoch;
use crate::message::{ConfigAt, Payload, Request, Response};
use locate::Locating;
use recovery::Recovery;
use serving::Serving;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};
use tessera_cluster::Address;

/// Identifies a request the writer sent, to match its answer.
pub type RequestId = u64;
/// Identifies an operation (append or delete) a caller submitted.
pub type OpId = u64;

/// Limits and timeouts of a writer.
#[derive(Clone, Debug)]
pub struct WriterSettings {
    pub quorums: Quorums,
    /// A request unanswered this long counts as failed. The node's transport gives up on it
    /// after as long, counted from when it leaves, which may be a little later than the
    /// writer made it (calls to a busy node gather for a few milliseconds): an answer that
    /// comes in between is late, and ignored like any other.
    pub request_timeout: Duration,
    /// Wait before asking a replica again after a failure.
    pub retry_interval: Duration,
    /// Locating and recovering must be done within this, or the writer gives up.
    pub recovery_timeout: Duration,
    /// An append or delete not acknowledged within this has an unknown outcome.
    pub operation_timeout: Duration,
    /// Most entries in one append or read.
    pub max_entries_per_request: usize,
    /// Most payload bytes in one append or read (a single larger entry still goes alone).
    pub max_bytes_per_request: usize,
    /// Recent entries kept in memory for replicas that fall behind; older ones are read
    /// from a replica that has them.
    pub max_buffered_entries: usize,
    /// Operations waiting behind the one in flight.
    pub max_queued_operations: usize,
    /// Recoveries restarted (a higher epoch seen, the configuration moved) before giving up.
    pub max_recovery_attempts: u32,
    /// The read lease a confirmation round asks the replicas for (capped at
    /// [`crate::replica::MAX_READ_LEASE`]; zero: none). While one runs, confirmations are
    /// answered without a round; a new writer's recovery may wait up to this long for it.
    pub read_lease: Duration,
    /// How long after an append is acknowledged its replicas may go without hearing so
    /// when no later write tells them: then an empty append carries the acknowledged mark.
    /// Readers of the replicas (the queries by slice) serve only what a replica knows to be
    /// acknowledged, so this bounds how late an acknowledged event becomes readable.
    pub mark_delay: Duration,
}

impl Default for WriterSettings {
    fn default() -> Self {
        WriterSettings {
            quorums: Quorums::default(),
            request_timeout: Duration::from_secs(2),
            retry_interval: Duration::from_millis(200),
            recovery_timeout: Duration::from_secs(10),
            operation_timeout: Duration::from_secs(5),
            max_entries_per_request: 1_000,
            max_bytes_per_request: 1024 * 1024,
            max_buffered_entries: 4_096,
            max_queued_operations: 1_024,
            max_recovery_attempts: 8,
            read_lease: crate::replica::MAX_READ_LEASE,
            mark_delay: Duration::from_millis(50),
        }
    }
}

/// Where the writer's node sees the cluster: the input for finding, creating and moving a
/// log.
#[derive(Clone, Debug, Default)]
pub struct Placement {
    /// Up members in the log's ring order ([`crate::placement::Ring::preference`]); the
    /// first N are where the log should live.
    pub preference: Vec<Address>,
    /// Every member that may hold replicas (not down, not removed): a log is new only when
    /// every one of them says it does not know it.
    pub members: Vec<Address>,
    /// Every store this node has seen among the cluster's members, remembered across
    /// restarts and forgotten only once known gone (a wiped disk, a graceful leave). A log no
    /// member knows may still live on stores that are not members now (after a restart of
    /// the whole cluster, the first node is Up alone), so it is created only when fewer than
    /// W of these did not answer: a log serves once W stores hold it, and W unheard stores
    /// could be all that know it.
    pub known_stores: Vec<ReplicaId>,
    /// Whether membership has converged; a log is created only then, so that two nodes with
    /// different views do not create it in two places.
    pub converged: bool,
    /// This node, whose replica is read first when it has what is needed.
    pub local: Option<Address>,
}

/// Where a request goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A node whose replica store is not known yet (locating).
    Address(Address),
    /// A replica: the node must still have this store.
    Replica(ReplicaId),
}

impl Target {
    pub fn address(&self) -> &Address {
        match self {
            Target::Address(a) => a,
            Target::Replica(r) => &r.address,
        }
    }
}

/// Why an operation was not applied: nothing of it was sent, it can never appear.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotApplied {
    #[error("the write must continue the log at sequence number {expected}, got {got}")]
    SequenceMismatch { expected: u64, got: u64 },
    #[error("{capacity} operations are already waiting for this log")]
    QueueFull { capacity: usize },
    #[error("the log's writer stopped: {0}")]
    Stopped(StopReason),
    #[error("the log did not become ready within {waited:?}; nothing was written")]
    Waited { waited: Duration },
    /// A fenced append ([`LogWriter::append_fenced`]) named another opening of the log, or
    /// another writer took the log over after this one opened it.
    #[error(
        "the log was opened with epoch {opened}, and another writer (epoch {by}) took it over \
         since, or it was never opened so: open it again"
    )]
    TakenOver { opened: Epoch, by: Epoch },
}

/// The outcome of an operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// W replicas hold it.
    Acknowledged,
    /// Not applied, and it never will be.
    NotApplied(NotApplied),
    /// Sent, but not known to be held by W replicas: it may or may not appear.
    Unknown(String),
}

/// Why a writer stopped. It never writes again; the next one recovers the log afresh.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StopReason {
    /// Another writer fenced this one.
    #[error("fenced by a later writer (epoch {by})")]
    Fenced { by: Epoch },
    /// Not enough replicas answered in time.
    #[error("{0}")]
    Unavailable(String),
    /// An operation's outcome is unknown; only a new recovery can tell what the log holds.
    #[error("an operation's outcome is unknown: {0}")]
    OutcomeUnknown(String),
    /// A replica broke the protocol or the logs disagree in a way they cannot.
    #[error("inconsistent replicas: {0}")]
    Inconsistent(String),
}

/// What the writer asks its driver to do or tells it.
#[derive(Clone, Debug, PartialEq)]
pub enum Output<P> {
    /// Send `request` and report the answer or the failure under `id`.
    Send {
        id: RequestId,
        to: Target,
        request: Request<P>,
    },
    /// The log is recovered and serves: its highest sequence number. Emitted once.
    Ready { highest: u64 },
    /// An operation finished.
    Completed { op: OpId, outcome: Outcome },
    /// The writer stopped for good (every operation it had was completed first).
    Stopped(StopReason),
}

/// An operation waiting for its turn or in flight.
#[derive(Clone, Debug)]
pub(crate) enum Operation<P> {
    Append { first_seq: u64, payloads: Vec<P> },
    DeleteTo { to: u64 },
    Confirm { highest: u64 },
}

#[derive(Clone, Debug)]
pub(crate) struct Queued<P> {
    pub op: OpId,
    pub operation: Operation<P>,
    pub submitted: Instant,
    /// Taken only while the writer still holds the log as it opened it with this epoch.
    pub fence: Option<Epoch>,
}

/// What a request was sent for; its answer goes back to the phase that sent it.
#[derive(Clone, Debug)]
pub(crate) struct Sent {
    pub to: Target,
    pub deadline: Instant,
}

/// What a writer counts, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterCounters {
    /// Entries sent to replicas that lacked them (repairs and catch-ups).
    pub entries_copied: u64,
    /// Configuration changes completed.
    pub reconfigurations: u64,
    /// Confirmations answered within a read lease, without a round to the replicas.
    pub confirms_from_lease: u64,
    /// Times a log no member knew was not created because too many of the stores this node
    /// has seen did not answer.
    pub creations_held: u64,
}

/// Everything phases share: settings, the clock of this step, outputs, open requests.
pub(crate) struct Ctx<'a, P> {
    pub settings: &'a WriterSettings,
    pub writer_id: u64,
    pub now: Instant,
    pub out: &'a mut Vec<Output<P>>,
    pub sent: &'a mut BTreeMap<RequestId, Sent>,
    pub next_request: &'a mut RequestId,
    pub placement: &'a Placement,
    pub counters: &'a mut WriterCounters,
}

impl<P> Ctx<'_, P> {
    pub fn send(&mut self, to: Target, request: Request<P>) -> RequestId {
        let id = *self.next_request;
        *self.next_request += 1;
        self.sent.insert(
            id,
            Sent {
                to: to.clone(),
                deadline: self.now + self.settings.request_timeout,
            },
        );
        self.out.push(Output::Send { id, to, request });
        id
    }
}

/// What a phase decided after a step.
pub(crate) enum Next<P> {
    Stay,
    Recover(RecoverFrom),
    Serve(Box<Serving<P>>),
    Stop(StopReason),
}

/// The start of a recovery.
pub(crate) struct RecoverFrom {
    /// The configurations to recover on: promises and seals from a quorum of each.
    pub configs: Vec<Configuration>,
    /// The configuration to end with (a change); `None`: the recovered log's.
    pub target: Option<Configuration>,
    pub creating: bool,
    /// The highest epoch seen so far; the recovery's epoch is above it.
    pub seen: Epoch,
    /// Where stores were last seen (storage id → address), to reach members that moved.
    pub seen_at: BTreeMap<u64, Address>,
}

enum Phase<P> {
    Locating(Locating),
    Recovering(Box<Recovery<P>>),
    Serving(Box<Serving<P>>),
    Stopped(StopReason),
}

/// A snapshot of a writer for operators and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriterStatus {
    pub phase: &'static str,
    pub epoch: Option<Epoch>,
    pub config: Option<Configuration>,
    /// Highest sequence number of the log (serving only).
    pub highest: Option<u64>,
    /// Acknowledged up to (serving only).
    pub lac: Option<u64>,
    /// Per member, the highest sequence number known to match (serving only).
    pub matched: Vec<(ReplicaId, u64)>,
}

/// The writer of one log. See the module documentation.
pub struct LogWriter<P> {
    settings: WriterSettings,
    writer_id: u64,
    placement: Placement,
    phase: Phase<P>,
    queue: VecDeque<Queued<P>>,
    sent: BTreeMap<RequestId, Sent>,
    next_request: RequestId,
    out: Vec<Output<P>>,
    recoveries: u32,
    started: Instant,
    ready: bool,
    counters: WriterCounters,
    /// The configuration served last, to count changes.
    served_config: Option<Configuration>,
    /// The epoch it served with when it first became ready: what a fenced append names.
    opened: Option<Epoch>,
    /// The highest epoch of another writer instance seen in any answer (a promise, an
    /// entry, a configuration). Above `opened`, another writer took the log over after it
    /// was opened here, even if this one took it back since (see [`LogWriter::append_fenced`]).
    foreign: Epoch,
}

impl<P: Payload> LogWriter<P> {
    /// A writer instance with the random id `writer_id` (never reused: it is part of every
    /// epoch it chooses). `known` is the configuration this node's own replica holds for
    /// the log, if any: the writer then starts recovering there instead of locating.
    pub fn new(
        settings: WriterSettings,
        writer_id: u64,
        placement: Placement,
        known: Option<ConfigAt>,
        now: Instant,
    ) -> Self {
        let mut writer = LogWriter {
            settings,
            writer_id,
            placement,
            phase: Phase::Stopped(StopReason::Unavailable("starting".into())),
            queue: VecDeque::new(),
            sent: BTreeMap::new(),
            next_request: 1,
            out: Vec::new(),
            recoveries: 0,
            started: now,
            ready: false,
            counters: WriterCounters::default(),
            served_config: None,
            opened: None,
            foreign: Epoch::ZERO,
        };
        let next = match known {
            Some(known) => Next::Recover(RecoverFrom {
                configs: vec![known.config],
                target: None,
                creating: false,
                seen: known.epoch,
                seen_at: BTreeMap::new(),
            }),
            None => {
                let (locating, next) = {
                    let mut ctx = writer.ctx(now);
                    Locating::start(&mut ctx)
                };
                writer.phase = Phase::Locating(locating);
                next
            }
        };
        writer.advance(next, now);
        writer
    }

    fn ctx(&mut self, now: Instant) -> Ctx<'_, P> {
        Ctx {
            settings: &self.settings,
            writer_id: self.writer_id,
            now,
            out: &mut self.out,
            sent: &mut self.sent,
            next_request: &mut self.next_request,
            placement: &self.placement,
            counters: &mut self.counters,
        }
    }

    /// Takes the outputs produced so far, in order.
    pub fn take_outputs(&mut self) -> Vec<Output<P>> {
        std::mem::take(&mut self.out)
    }

    /// Moves what it produced onto the end of `into`, as [`LogWriter::take_outputs`] does,
    /// keeping both buffers' room: a caller that drains every writer after each event
    /// allocates nothing for it.
    pub fn move_outputs_into(&mut self, into: &mut Vec<Output<P>>) {
        into.append(&mut self.out);
    }

    /// What it counted so far.
    pub fn counters(&self) -> WriterCounters {
        self.counters
    }

    /// Whether time-driven work is pending (a request out, an operation waiting, a recovery
    /// under way, a follower to ask again after a failure); an idle serving writer needs
    /// only an occasional tick.
    pub fn needs_tick(&self) -> bool {
        !self.sent.is_empty()
            || !self.queue.is_empty()
            || match &self.phase {
                Phase::Serving(s) => s.owes_mark() || s.waits_out_a_backoff(),
                _ => true,
            }
    }

    /// True once the writer stopped.
    pub fn is_stopped(&self) -> bool {
        matches!(self.phase, Phase::Stopped(_))
    }

    /// True while the log serves.
    pub fn is_serving(&self) -> bool {
        matches!(self.phase, Phase::Serving(_))
    }

    /// The log's highest sequence number while serving.
    pub fn highest(&self) -> Option<u64> {
        match &self.phase {
            Phase::Serving(s) => Some(s.last().seq),
            _ => None,
        }
    }

    /// Replicas that hold the whole log as served (the writer's node first), to read from.
    pub fn read_sources(&self) -> Vec<ReplicaId> {
        match &self.phase {
            Phase::Serving(s) => s.read_sources(self.placement.local.as_ref()),
            _ => Vec::new(),
        }
    }

    /// Entries up to here are deleted (as far as this writer deleted them).
    pub fn deleted_to(&self) -> u64 {
        match &self.phase {
            Phase::Serving(s) => s.deleted_to(),
            _ => 0,
        }
    }

    pub fn status(&self) -> WriterStatus {
        match &self.phase {
            Phase::Locating(_) => WriterStatus {
                phase: "locating",
                epoch: None,
                config: None,
                highest: None,
                lac: None,
                matched: Vec::new(),
            },
            Phase::Recovering(r) => WriterStatus {
                phase: "recovering",
                epoch: Some(r.epoch()),
                config: r.final_config().cloned(),
                highest: None,
                lac: None,
                matched: Vec::new(),
            },
            Phase::Serving(s) => s.status(),
            Phase::Stopped(_) => WriterStatus {
                phase: "stopped",
                epoch: None,
                config: None,
                highest: None,
                lac: None,
                matched: Vec::new(),
            },
        }
    }

    /// Appends `payloads` at `first_seq..`. The outcome comes as [`Output::Completed`].
    pub fn append(&mut self, op: OpId, first_seq: u64, payloads: Vec<P>, now: Instant) {
        self.submit_append(op, first_seq, payloads, None, now);
    }

    /// As [`LogWriter::append`], but only while this writer holds the log as it opened it
    /// with `opened` ([`LogWriter::opened_epoch`]): refused (not applied, `TakenOver`) once
    /// an answer showed that another writer took the log over after that — even when this
    /// writer took it back since, as a configuration change's recovery does when it meets a
    /// later writer's promise. A recovery of this writer that met none keeps the opening:
    /// such a writer moves its log between members without losing its fenced callers.
    ///
    /// Why nothing is missed: a writer that took the log over finished its recovery by
    /// sealing its epoch on W members of a quorum of every configuration it recovered on,
    /// so any later recovery here (on the same configuration or a change from it) hears that
    /// epoch, in a promise it is refused with or in the tail it adopts; and while this writer
    /// serves without recovering, the taker's promises refuse its writes.
    pub fn append_fenced(
        &mut self,
        op: OpId,
        first_seq: u64,
        payloads: Vec<P>,
        opened: Epoch,
        now: Instant,
    ) {
        self.submit_append(op, first_seq, payloads, Some(opened), now);
    }

    fn submit_append(
        &mut self,
        op: OpId,
        first_seq: u64,
        payloads: Vec<P>,
        fence: Option<Epoch>,
        now: Instant,
    ) {
        self.submit(
            Queued {
                op,
                operation: Operation::Append {
                    first_seq,
                    payloads,
                },
                submitted: now,
                fence,
            },
            now,
        );
    }

    /// The epoch it served with when it first became ready, once it did.
    pub fn opened_epoch(&self) -> Option<Epoch> {
        self.opened
    }

    /// Whether an answer showed another writer taking the log over after it was opened here.
    pub fn taken_over(&self) -> bool {
        self.opened.is_some_and(|opened| self.foreign > opened)
    }

    /// Whether a fenced operation naming `opened` may still be taken.
    fn holds_opening(&self, opened: Epoch) -> bool {
        self.opened == Some(opened) && !self.taken_over()
    }

    fn taken_over_outcome(&self, opened: Epoch) -> Outcome {
        Outcome::NotApplied(NotApplied::TakenOver {
            opened,
            by: self.foreign,
        })
    }

    /// Records the epochs of other writers an answer carries; once one is above the
    /// opening, fenced operations still waiting are refused.
    fn note_foreign(&mut self, response: &Response<P>) {
        let mut note = |epoch: Epoch| {
            if epoch.writer != self.writer_id && epoch > self.foreign {
                self.foreign = epoch;
            }
        };
        let summary = match response {
            Response::Fenced { promise } => {
                note(*promise);
                None
            }
            Response::Located { summary, .. } => summary.as_ref(),
            Response::Promised { summary, .. }
            | Response::Appended { summary }
            | Response::Sealed { summary }
            | Response::Entries { summary, .. }
            | Response::Installed { summary }
            | Response::Deleted { summary }
            | Response::Mismatch { summary }
            | Response::Confirmed { summary, .. } => Some(summary),
            Response::Invalid { .. } | Response::Leased { .. } => None,
        };
        if let Some(summary) = summary {
            note(summary.promise);
            note(summary.last.epoch);
            note(summary.base.epoch);
            if let Some(at) = &summary.config {
                note(at.epoch);
            }
        }
        if self.taken_over() {
            let queue = std::mem::take(&mut self.queue);
            for queued in queue {
                match queued.fence {
                    Some(opened) => {
                        let outcome = self.taken_over_outcome(opened);
                        self.out.push(Output::Completed {
                            op: queued.op,
                            outcome,
                        });
                    }
                    None => self.queue.push_back(queued),
                }
            }
        }
    }

    /// Deletes the entries up to `to` (never past what is acknowledged).
    pub fn delete_to(&mut self, op: OpId, to: u64, now: Instant) {
        self.submit(
            Queued {
                op,
                operation: Operation::DeleteTo { to },
                submitted: now,
                fence: None,
            },
            now,
        );
    }

    /// Confirms that this writer still holds the log and that it ends at `highest`: W members
    /// of the configuration take an empty write of its epoch after this call, or a read lease
    /// that W of them granted to an earlier such round still runs at `now` (no other writer
    /// can have recovered the log before it ends). Once confirmed, no other writer had taken
    /// the log over when the call was made, so a read of state up to `highest` is current
    /// (linearizable). Acknowledged, or not applied when the log has another end. `now` must
    /// be read after the caller's read began.
    pub fn confirm(&mut self, op: OpId, highest: u64, now: Instant) {
        self.submit(
            Queued {
                op,
                operation: Operation::Confirm { highest },
                submitted: now,
                fence: None,
            },
            now,
        );
    }

    fn submit(&mut self, queued: Queued<P>, now: Instant) {
        if let Phase::Stopped(reason) = &self.phase {
            let outcome = Outcome::NotApplied(NotApplied::Stopped(reason.clone()));
            self.out.push(Output::Completed {
                op: queued.op,
                outcome,
            });
            return;
        }
        if let Some(opened) = queued.fence
            && !self.holds_opening(opened)
        {
            let outcome = self.taken_over_outcome(opened);
            self.out.push(Output::Completed {
                op: queued.op,
                outcome,
            });
            return;
        }
        if self.queue.len() >= self.settings.max_queued_operations {
            self.out.push(Output::Completed {
                op: queued.op,
                outcome: Outcome::NotApplied(NotApplied::QueueFull {
                    capacity: self.settings.max_queued_operations,
                }),
            });
            return;
        }
        self.queue.push_back(queued);
        self.pump(now);
    }

    /// Starts queued operations while serving and idle.
    fn pump(&mut self, now: Instant) {
        let next = match &mut self.phase {
            Phase::Serving(serving) => {
                let mut ctx = Ctx {
                    settings: &self.settings,
                    writer_id: self.writer_id,
                    now,
                    out: &mut self.out,
                    sent: &mut self.sent,
                    next_request: &mut self.next_request,
                    placement: &self.placement,
                    counters: &mut self.counters,
                };
                serving.pump(&mut ctx, &mut self.queue)
            }
            _ => Next::Stay,
        };
        self.advance(next, now);
    }

    /// The answer to request `id`.
    pub fn on_response(&mut self, id: RequestId, response: Response<P>, now: Instant) {
        let Some(sent) = self.sent.remove(&id) else {
            // Answered after it timed out, or not ours: the phase moved on.
            return;
        };
        self.note_foreign(&response);
        let next = self.dispatch(now, |phase, ctx| match phase {
            Phase::Locating(l) => l.on_response(ctx, id, &sent.to, response),
            Phase::Recovering(r) => r.on_response(ctx, id, &sent.to, response),
            Phase::Serving(s) => s.on_response(ctx, id, &sent.to, response),
            Phase::Stopped(_) => Next::Stay,
        });
        self.advance(next, now);
    }

    /// Request `id` got no answer (timed out, unreachable, or the node has another store).
    pub fn on_failure(&mut self, id: RequestId, now: Instant) {
        let Some(sent) = self.sent.remove(&id) else {
            return;
        };
        self.fail_request(id, sent, now);
    }

    /// Request `id` reached a node whose store is not the replica in the configuration: that
    /// member lost its data (or was replaced) and counts as gone.
    pub fn on_wrong_storage(&mut self, id: RequestId, now: Instant) {
        let Some(sent) = self.sent.remove(&id) else {
            return;
        };
        let next = self.dispatch(now, |phase, ctx| match phase {
            Phase::Recovering(r) => r.on_lost(ctx, id, &sent.to),
            Phase::Serving(s) => s.on_lost(ctx, id, &sent.to),
            Phase::Locating(l) => l.on_failure(ctx, id, &sent.to),
            Phase::Stopped(_) => Next::Stay,
        });
        self.advance(next, now);
    }

    fn fail_request(&mut self, id: RequestId, sent: Sent, now: Instant) {
        let next = self.dispatch(now, |phase, ctx| match phase {
            Phase::Locating(l) => l.on_failure(ctx, id, &sent.to),
            Phase::Recovering(r) => r.on_failure(ctx, id, &sent.to),
            Phase::Serving(s) => s.on_failure(ctx, id, &sent.to),
            Phase::Stopped(_) => Next::Stay,
        });
        self.advance(next, now);
    }

    /// The cluster changed: a member may have left (the log moves off it) or joined.
    pub fn placement_changed(&mut self, placement: Placement, now: Instant) {
        self.placement = placement;
        self.tick(now);
    }

    /// Time passed: timeouts, retries, and moving the log off members that left.
    pub fn tick(&mut self, now: Instant) {
        // Operations that waited too long for their turn were never sent: not applied.
        let timeout = self.settings.operation_timeout;
        while let Some(queued) = self.queue.front() {
            if now.saturating_duration_since(queued.submitted) < timeout {
                break;
            }
            let op = queued.op;
            self.queue.pop_front();
            self.out.push(Output::Completed {
                op,
                outcome: Outcome::NotApplied(NotApplied::Waited { waited: timeout }),
            });
        }
        let expired: Vec<RequestId> = self
            .sent
            .iter()
            .filter(|(_, s)| s.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some(sent) = self.sent.remove(&id) {
                self.fail_request(id, sent, now);
            }
        }
        let recovering = matches!(self.phase, Phase::Locating(_) | Phase::Recovering(_));
        if recovering
            && now.saturating_duration_since(self.started) >= self.settings.recovery_timeout
        {
            let detail = match &self.phase {
                Phase::Recovering(r) => r.describe_missing(),
                Phase::Locating(l) => l.describe(),
                _ => "locating the log".to_string(),
            };
            let reason = format!(
                "the log could not be recovered within {:?}: {detail}",
                self.settings.recovery_timeout
            );
            self.advance(Next::Stop(StopReason::Unavailable(reason)), now);
            return;
        }
        let next = self.dispatch(now, |phase, ctx| match phase {
            Phase::Stopped(_) => Next::Stay,
            Phase::Locating(l) => l.tick(ctx),
            Phase::Recovering(r) => r.tick(ctx),
            Phase::Serving(s) => s.tick(ctx),
        });
        self.advance(next, now);
        self.pump(now);
    }

    fn dispatch(
        &mut self,
        now: Instant,
        step: impl FnOnce(&mut Phase<P>, &mut Ctx<'_, P>) -> Next<P>,
    ) -> Next<P> {
        let mut ctx = Ctx {
            settings: &self.settings,
            writer_id: self.writer_id,
            now,
            out: &mut self.out,
            sent: &mut self.sent,
            next_request: &mut self.next_request,
            placement: &self.placement,
            counters: &mut self.counters,
        };
        step(&mut self.phase, &mut ctx)
    }

    fn advance(&mut self, mut next: Next<P>, now: Instant) {
        loop {
            next = match next {
                Next::Stay => return,
                Next::Stop(reason) => {
                    self.stop(reason);
                    return;
                }
                Next::Recover(from) => {
                    if let Phase::Serving(serving) = &mut self.phase {
                        // Anything in flight is settled before a serving writer moves on.
                        serving.abandon_in_flight(&mut self.out);
                    }
                    self.recoveries += 1;
                    if self.recoveries > self.settings.max_recovery_attempts {
                        Next::Stop(StopReason::Unavailable(format!(
                            "the log could not be recovered in {} attempts (other writers \
                             keep taking it over, or its configuration keeps moving)",
                            self.settings.max_recovery_attempts
                        )))
                    } else {
                        if self.ready {
                            // A configuration change gets the whole recovery timeout.
                            self.started = now;
                        }
                        let mut ctx = Ctx {
                            settings: &self.settings,
                            writer_id: self.writer_id,
                            now,
                            out: &mut self.out,
                            sent: &mut self.sent,
                            next_request: &mut self.next_request,
                            placement: &self.placement,
                            counters: &mut self.counters,
                        };
                        let (recovery, next) = Recovery::start(&mut ctx, from);
                        self.phase = Phase::Recovering(Box::new(recovery));
                        next
                    }
                }
                Next::Serve(serving) => {
                    let config = serving.status().config;
                    if self.served_config.is_some() && self.served_config != config {
                        self.counters.reconfigurations += 1;
                    }
                    self.served_config = config;
                    if !self.ready {
                        self.ready = true;
                        self.opened = Some(serving.epoch());
                        self.out.push(Output::Ready {
                            highest: serving.last().seq,
                        });
                    }
                    self.recoveries = 0;
                    self.phase = Phase::Serving(serving);
                    let mut ctx = Ctx {
                        settings: &self.settings,
                        writer_id: self.writer_id,
                        now,
                        out: &mut self.out,
                        sent: &mut self.sent,
                        next_request: &mut self.next_request,
                        placement: &self.placement,
                        counters: &mut self.counters,
                    };
                    match &mut self.phase {
                        Phase::Serving(s) => s.start(&mut ctx, &mut self.queue),
                        _ => Next::Stay,
                    }
                }
            };
        }
    }

    fn stop(&mut self, reason: StopReason) {
        if let Phase::Serving(serving) = &mut self.phase {
            serving.fail_in_flight(&reason, &mut self.out);
        }
        for queued in self.queue.drain(..) {
            self.out.push(Output::Completed {
                op: queued.op,
                outcome: Outcome::NotApplied(NotApplied::Stopped(reason.clone())),
            });
        }
        self.sent.clear();
        self.out.push(Output::Stopped(reason.clone()));
        self.phase = Phase::Stopped(reason);
    }
}
