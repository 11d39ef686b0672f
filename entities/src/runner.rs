//! The tokio task of one live entity: a thin driver around [`EntityMachine`] that owns the
//! mailbox, the idle timer and the store calls.
//!
//! One write and one snapshot job are in flight at most; while either runs, the task keeps
//! reading its mailbox, so commands reach the machine's bounded stash (and a full stash is an
//! immediate error, not a hang). The task ends when the machine stops, when the entity has
//! been idle for `passivate_after`, or when the host drops the mailbox's sender (an eviction,
//! a stop request, shutdown); either way it first handles what its mailbox holds and finishes
//! the write and snapshot job in flight, so that the next incarnation never recovers while
//! this one still writes. It returns the commands it did not handle, which the host gives to
//! the next incarnation, and why it stopped when it stopped on its own.

use crate::codec::Codec;
use crate::config::EntityConfig;
use crate::entity::EntityType;
use crate::id::EntityId;
use crate::lifecycle::StopReason;
use crate::machine::{Action, AskResult, EntityMachine, MachineSettings, SnapshotJob};
use futures::StreamExt;
use futures::future::BoxFuture;
use std::future::Future;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tessera_journal::{Journal, JournalError};
use tessera_snapshot::{SnapshotSelectionCriteria, SnapshotStore};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// A command on its way to an entity, with the channel its answer goes back on.
pub(crate) struct Envelope<E: EntityType> {
    pub command: E::Command,
    pub reply: oneshot::Sender<AskResult<E>>,
}

/// What every entity of a host shares.
pub(crate) struct HostContext<E: EntityType> {
    pub entity: Arc<E>,
    pub codec: Arc<Codec<E>>,
    pub journal: Arc<dyn Journal>,
    pub snapshots: Arc<dyn SnapshotStore>,
    pub config: EntityConfig,
}

impl<E: EntityType> HostContext<E> {
    fn machine_settings(&self) -> MachineSettings {
        MachineSettings {
            snapshot_every: self.config.snapshot_every,
            keep_snapshots: self.config.keep_snapshots,
            delete_events_on_snapshot: self.config.delete_events_on_snapshot,
            stash_capacity: self.config.stash_capacity,
            confirm_reads: self.journal.confirms_reads(),
        }
    }
}

type Machine<E> = EntityMachine<E, oneshot::Sender<AskResult<E>>>;
type Actions<E> = Vec<Action<E, oneshot::Sender<AskResult<E>>>>;

/// Milliseconds since the Unix epoch, for event and snapshot timestamps.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The mailbox and whether its senders are still there.
///
/// Owned by the incarnation's task outside [`run_entity`], so that a handler's panic, which
/// unwinds `run_entity`, does not drop the commands queued behind the panicking one: the task
/// closes and drains the mailbox and hands them to the next incarnation.
pub(crate) struct Mailbox<E: EntityType> {
    receiver: mpsc::Receiver<Envelope<E>>,
    /// False once every sender is gone (the host is shutting down) or we closed it.
    open: bool,
}

impl<E: EntityType> Mailbox<E> {
    pub(crate) fn new(receiver: mpsc::Receiver<Envelope<E>>) -> Self {
        Mailbox {
            receiver,
            open: true,
        }
    }

    /// Stops taking commands; the ones already queued stay for [`Mailbox::drain`].
    pub(crate) fn close(&mut self) {
        self.receiver.close();
        self.open = false;
    }

    pub(crate) fn drain(&mut self) -> Vec<Envelope<E>> {
        let mut left = Vec::new();
        while let Ok(envelope) = self.receiver.try_recv() {
            left.push(envelope);
        }
        left
    }
}

/// How an incarnation ended: the commands it leaves for the next incarnation, and why it
/// stopped when it stopped on its own (None: the host closed its mailbox).
pub(crate) struct Ending<E: EntityType> {
    pub leftovers: Vec<Envelope<E>>,
    pub reason: Option<StopReason>,
}

/// Runs one incarnation of entity `id` until it stops. `initial` are commands that arrived
/// before the task started.
pub(crate) async fn run_entity<E: EntityType>(
    context: Arc<HostContext<E>>,
    id: EntityId,
    writer_id: String,
    mailbox: &mut Mailbox<E>,
    initial: Vec<Envelope<E>>,
) -> Ending<E> {
    let mut machine = Machine::<E>::new(
        context.entity.clone(),
        context.codec.clone(),
        &id,
        writer_id,
        context.machine_settings(),
    );
    let mut out = Vec::new();
    for envelope in initial {
        machine.command(envelope.command, envelope.reply, now_ms(), &mut out);
    }
    send_replies(&mut out);

    recover(&context, &mut machine, mailbox, &mut out).await;
    let mut driver = Driver {
        context: &context,
        pid: machine.persistence_id().to_string(),
        persist: None,
        confirm: None,
        snapshot: None,
    };
    driver.perform(&mut out);
    // A failed recovery, or a stop effect of a command stashed during recovery.
    let mut reason = machine.is_stopped().then(|| machine_stop_reason(&machine));
    // Also after a failed recovery: `serve` returns at once for a stopped machine.
    driver
        .serve(&mut machine, mailbox, &mut out, &mut reason)
        .await;

    // Stopped, passivated or shut down: nothing is in flight any more.
    mailbox.close();
    let mut left: Vec<Envelope<E>> = machine
        .take_stash()
        .into_iter()
        .map(|(command, reply)| Envelope { command, reply })
        .collect();
    left.extend(mailbox.drain());
    Ending {
        leftovers: left,
        reason,
    }
}

/// Why a stopped machine stopped.
fn machine_stop_reason<E: EntityType>(machine: &Machine<E>) -> StopReason {
    if machine.stopped_by_failure() {
        StopReason::Failed
    } else {
        StopReason::StopEffect
    }
}

/// Answers the callers among `out`'s actions. Only replies can come out of the machine while
/// it recovers.
fn send_replies<E: EntityType>(out: &mut Actions<E>) {
    for action in out.drain(..) {
        if let Action::Reply { to, result } = action {
            let _ = to.send(result);
        }
    }
}

/// Awaits `work` while stashing whatever arrives in the mailbox meanwhile.
async fn stashing<E: EntityType, T>(
    work: impl Future<Output = T>,
    machine: &mut Machine<E>,
    mailbox: &mut Mailbox<E>,
    out: &mut Actions<E>,
) -> T {
    tokio::pin!(work);
    loop {
        tokio::select! {
            biased;
            envelope = mailbox.receiver.recv(), if mailbox.open => match envelope {
                Some(envelope) => {
                    machine.command(envelope.command, envelope.reply, now_ms(), out);
                    send_replies(out);
                }
                None => mailbox.open = false,
            },
            done = &mut work => return done,
        }
    }
}

/// Recovery: the latest snapshot, the events after it, then the highest sequence number check.
/// Leaves the machine ready (with its stash handled) or stopped with the failure answered.
async fn recover<E: EntityType>(
    context: &HostContext<E>,
    machine: &mut Machine<E>,
    mailbox: &mut Mailbox<E>,
    out: &mut Actions<E>,
) {
    let pid = machine.persistence_id().to_string();
    let load = context
        .snapshots
        .load(&pid, SnapshotSelectionCriteria::latest());
    let loaded = stashing(load, machine, mailbox, out).await;
    let Some(from) = machine.snapshot_loaded(loaded, out) else {
        return;
    };
    let mut replay = context.journal.replay(&pid, from, u64::MAX, u64::MAX);
    loop {
        match stashing(replay.next(), machine, mailbox, out).await {
            Some(Ok(event)) => {
                if !machine.event_replayed(&event, out) {
                    return;
                }
            }
            Some(Err(e)) => return machine.replay_failed(&e, out),
            None => break,
        }
    }
    drop(replay);
    let highest = stashing(
        context.journal.highest_sequence_nr(&pid),
        machine,
        mailbox,
        out,
    )
    .await;
    machine.recovery_completed(highest, now_ms(), out);
}

/// The store calls in flight of a recovered entity.
struct Driver<'a, E: EntityType> {
    context: &'a HostContext<E>,
    /// The entity's persistence id.
    pid: String,
    persist: Option<BoxFuture<'static, Result<(), JournalError>>>,
    confirm: Option<BoxFuture<'static, Result<(), JournalError>>>,
    snapshot: Option<BoxFuture<'static, Result<(), String>>>,
}

/// Resolves with the future's output, or never when there is none.
async fn in_flight<T>(future: &mut Option<BoxFuture<'static, T>>) -> T {
    match future {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

impl<E: EntityType> Driver<'_, E> {
    /// Carries out the machine's actions.
    fn perform(&mut self, out: &mut Actions<E>) -> bool {
        let mut stop = false;
        for action in out.drain(..) {
            match action {
                Action::Reply { to, result } => {
                    let _ = to.send(result);
                }
                Action::Persist(write) => self.persist = Some(self.context.journal.append(write)),
                Action::Confirm { highest } => {
                    self.confirm = Some(self.context.journal.confirm_writer(&self.pid, highest))
                }
                Action::Snapshot(job) => self.snapshot = Some(self.snapshot_job(job)),
                Action::Stop => stop = true,
            }
        }
        stop
    }

    fn snapshot_job(&self, job: SnapshotJob) -> BoxFuture<'static, Result<(), String>> {
        let snapshots = self.context.snapshots.clone();
        let journal = self.context.journal.clone();
        Box::pin(async move {
            let pid = job.metadata.persistence_id.clone();
            let sequence_nr = job.metadata.sequence_nr;
            snapshots
                .save(job.metadata, job.manifest, job.payload)
                .await
                .map_err(|e| format!("saving the snapshot at {sequence_nr}: {e}"))?;
            let Some(retention) = job.retention else {
                return Ok(());
            };
            snapshots
                .delete_matching(
                    &pid,
                    SnapshotSelectionCriteria::up_to(retention.delete_snapshots_up_to),
                )
                .await
                .map_err(|e| {
                    format!(
                        "deleting snapshots up to {}: {e}",
                        retention.delete_snapshots_up_to
                    )
                })?;
            if job.delete_events {
                journal
                    .delete_to(&pid, retention.delete_events_up_to)
                    .await
                    .map_err(|e| {
                        format!(
                            "deleting events up to {}: {e}",
                            retention.delete_events_up_to
                        )
                    })?;
            }
            Ok(())
        })
    }

    /// Handles commands until the entity stops, passivates or is shut down, and nothing is in
    /// flight any more. Sets `reason` when the entity stops on its own (first reason wins).
    async fn serve(
        &mut self,
        machine: &mut Machine<E>,
        mailbox: &mut Mailbox<E>,
        out: &mut Actions<E>,
        reason: &mut Option<StopReason>,
    ) {
        let passivate_after = self.context.config.passivate_after;
        let mut last_command = Instant::now();
        // Reset only when it fires: a busy entity does not touch the timer per command.
        let idle = tokio::time::sleep(passivate_after.unwrap_or_default());
        tokio::pin!(idle);
        let mut stopping = machine.is_stopped();
        loop {
            if (stopping || !mailbox.open)
                && self.persist.is_none()
                && self.confirm.is_none()
                && self.snapshot.is_none()
                && (stopping || machine.is_idle())
            {
                return;
            }
            let idle_enabled =
                passivate_after.is_some() && mailbox.open && !stopping && machine.is_idle();
            tokio::select! {
                biased;
                result = in_flight(&mut self.persist) => {
                    self.persist = None;
                    machine.persisted(result, now_ms(), out);
                }
                result = in_flight(&mut self.confirm) => {
                    self.confirm = None;
                    machine.confirmed(result, now_ms(), out);
                }
                result = in_flight(&mut self.snapshot) => {
                    self.snapshot = None;
                    machine.snapshot_finished(result, now_ms(), out);
                }
                envelope = mailbox.receiver.recv(), if mailbox.open && !stopping => match envelope {
                    Some(envelope) => {
                        last_command = Instant::now();
                        machine.command(envelope.command, envelope.reply, now_ms(), out);
                    }
                    None => mailbox.open = false,
                },
                () = &mut idle, if idle_enabled => {
                    let deadline = last_command + passivate_after.unwrap_or_default();
                    if Instant::now() >= deadline {
                        tracing::debug!(entity = %machine.persistence_id(), "passivating an idle entity");
                        mailbox.close();
                        stopping = true;
                        reason.get_or_insert(StopReason::IdleTimeout);
                    } else {
                        idle.as_mut().reset(deadline);
                    }
                }
            }
            if self.perform(out) {
                mailbox.close();
                stopping = true;
                reason.get_or_insert(machine_stop_reason(machine));
            }
        }
    }
}
