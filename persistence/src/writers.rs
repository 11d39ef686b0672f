//! The writers of the logs this node writes: one [`LogWriter`] per log, all owned by one
//! task, fed by a bounded command queue and by the answers of the calls they make.
//!
//! The task turns the writers' outputs into calls (each awaited on a task of its own, its
//! answer sent back here), replies to the callers, and keeps every writer's placement up to
//! date with the cluster's membership. Idle writers are dropped after a while (the next use
//! of the log recovers it again, under a new epoch), and at most `max_writers` are kept.

use crate::caller::{CallResult, ReplicaCaller, small_answer};
use crate::known_stores::KnownStores;
use crate::metrics::PersistenceMetrics;
use crate::wire::call_size_estimate;
use crate::wire::{ReplicaCall, ReplicaRequest};
use futures::FutureExt;
use smol_str::SmolStr;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tessera_cluster::node::ClusterSnapshot;
use tessera_cluster::{Address, MemberStatus};
use tessera_journal::StoredEvent;
use tessera_journal::{AtomicWrite, JournalError};
use tessera_replication::placement::Ring;
use tessera_replication::{
    LogWriter, NotApplied, OpId, Outcome, Output, Placement, ReplicaId, RequestId, StopReason,
    Target, WriterSettings, WriterStatus,
};
use tokio::sync::{mpsc, oneshot, watch};

/// Settings of the replicated journal's writers.
#[derive(Clone, Debug)]
pub struct WritersSettings {
    pub writer: WriterSettings,
    /// Commands waiting for the writers' task; a full queue refuses at once.
    pub command_queue_capacity: usize,
    /// Writers kept at most; beyond, the least recently used idle ones are dropped.
    pub max_writers: usize,
    /// An idle writer is dropped after this long.
    pub writer_idle_timeout: Duration,
    /// How often writers with work under way are driven by time.
    pub tick_interval: Duration,
}

impl Default for WritersSettings {
    fn default() -> Self {
        WritersSettings {
            writer: WriterSettings {
                // Every writer keeps a window of recent entries for replicas that fall
                // behind: small, since there may be tens of thousands of writers.
                max_buffered_entries: 64,
                ..WriterSettings::default()
            },
            command_queue_capacity: 4_096,
            max_writers: 100_000,
            writer_idle_timeout: Duration::from_secs(120),
            tick_interval: Duration::from_millis(20),
        }
    }
}

/// Writers started for re-replication at once, at most.
const MAX_MAINTENANCE_WRITERS: usize = 64;

/// Commands and answers the task handles before it sends the calls they produced: under
/// load, the calls of many logs to one node then leave in one message (as a journal's group
/// commit gathers many writes into one sync); a lone call leaves at once.
const MAX_HANDLED_PER_FLUSH: usize = 256;
/// A turn that handled fewer commands and answers than this, with calls to send, lets the
/// other tasks ready to run go first, once, before it sends them: under load the commands
/// they make then join its messages (two nodes made a message per five events without it),
/// and a lone call on an idle node still leaves at once.
const YIELD_BELOW_HANDLED: usize = 8;
/// Calls in one message to a node, at most (well below a replica service's in-flight
/// limit, which a batch must fit).
const MAX_BATCH_CALLS: usize = 512;
/// Room a turn's message to a node starts with: under load a turn makes a few dozen calls
/// to each node, and growing one call at a time would copy them again and again.
const OUTBOX_INITIAL_CALLS: usize = 32;
/// Estimated bytes of the calls in one message, at most (a quarter of the transport's
/// default frame limit); a larger call travels alone.
const MAX_BATCH_BYTES: usize = 1024 * 1024;
/// Messages of calls with small answers to one node whose answers are awaited, beyond which
/// further calls to that node wait for an answer (or until they fill a message, or for at
/// most [`MAX_CALL_HOLD`]): while one message is being written by the node's store and
/// another waits for the next sync, later calls gather into one message rather than leaving
/// turn by turn, each of which would cost a message, a request to the store and a task on
/// both sides.
const MAX_MESSAGES_IN_FLIGHT_PER_NODE: usize = 2;
/// Longest a message is held back for an answer from its node: a lost or slow message (whose
/// answer comes only with the request's timeout) then delays later calls to the node by this
/// much rather than by that timeout. Several times a store's sync, so that under load an
/// answer releases it first.
const MAX_CALL_HOLD: Duration = Duration::from_millis(10);

/// A log ready to be read: where it ends and who holds it.
#[derive(Clone, Debug)]
pub struct ReadyLog {
    pub highest: u64,
    /// The epoch the writer served with when it first became ready (what a fenced append
    /// names).
    pub opened: Option<tessera_replication::Epoch>,
    pub deleted_to: u64,
    /// Replicas holding the whole log, this node's first.
    pub sources: Vec<ReplicaId>,
}

type Reply<T> = oneshot::Sender<Result<T, JournalError>>;

pub(crate) enum Command {
    Append {
        write: AtomicWrite,
        /// Only by this node's writer of the log while it serves with this epoch (see
        /// [`crate::ReplicatedJournal::open_fenced`]): refused when the writer is another
        /// one, none, or recovered the log again since (a higher epoch).
        writer: Option<tessera_replication::Epoch>,
        reply: Reply<()>,
    },
    DeleteTo {
        persistence_id: String,
        to: u64,
        reply: Reply<()>,
    },
    Ready {
        persistence_id: String,
        reply: Reply<ReadyLog>,
    },
    /// As `Ready`, with a new writer that recovers the log afresh (a higher epoch than any
    /// before, this node's included) in place of an idle one this node has; refused while
    /// the one it has is busy.
    Reopen {
        persistence_id: String,
        reply: Reply<ReadyLog>,
    },
    Confirm {
        persistence_id: String,
        highest: u64,
        reply: Reply<()>,
    },
    Status {
        persistence_id: String,
        reply: oneshot::Sender<Option<WriterStatus>>,
    },
    /// Start a writer for a log whose configuration lost a member (re-replication), unless
    /// one runs; it is dropped again once it is idle.
    Maintain { persistence_id: String },
    /// The epoch and configuration of this node's serving writer of a log, if any.
    Serving {
        persistence_id: String,
        reply: oneshot::Sender<Option<ServingLog>>,
    },
    /// Stores found by the maintenance scan: `answered`, the members' answers to its probe
    /// (where each store is now); `named`, stores the configurations of this node's logs
    /// name.
    StoresSeen {
        answered: Vec<(Address, u64)>,
        named: Vec<(Address, u64)>,
    },
    /// The stores this node knows.
    KnownStores {
        reply: oneshot::Sender<Vec<ReplicaId>>,
    },
    /// Forget a store gone for good; answers whether it was known.
    ForgetStore {
        storage_id: u64,
        reply: oneshot::Sender<bool>,
    },
}

/// A log this node serves: what its snapshot calls need.
#[derive(Clone, Debug)]
pub struct ServingLog {
    pub epoch: tessera_replication::Epoch,
    pub config: tessera_replication::Configuration,
    pub highest: u64,
    pub deleted_to: u64,
}

struct Answer {
    persistence_id: Arc<str>,
    instance: u64,
    id: RequestId,
    result: CallResult,
}

/// A call a writer made, waiting to be sent (at the end of the task's turn, or once its
/// node answers; see [`Actor::flush`]).
struct Outgoing {
    persistence_id: Arc<str>,
    instance: u64,
    id: RequestId,
    call: ReplicaCall,
}

/// Calls to one node, in the order they were made, to be sent as one message.
struct Outbox {
    to: Address,
    calls: Vec<Outgoing>,
    size_bytes: usize,
    /// A later message to the same node was started: nothing more joins this one.
    closed: bool,
    /// When its first call was made.
    opened: Instant,
}

impl Outbox {
    /// Whether nothing more joins it: it leaves whatever is in flight to its node.
    fn is_closed(&self) -> bool {
        self.closed || self.calls.len() >= MAX_BATCH_CALLS || self.size_bytes >= MAX_BATCH_BYTES
    }

    /// A call whose answer may be large: it travels alone and is not counted in flight.
    fn has_large_answer(&self) -> bool {
        self.size_bytes > MAX_BATCH_BYTES
    }
}

/// The answers to one message, from the node it went to.
struct AnswerBatch {
    from: Address,
    /// Whether the message counted as in flight to its node.
    counted: bool,
    answers: Vec<Answer>,
}

enum Pending {
    Write { reply: Reply<()>, started: Instant },
    Confirm(Reply<()>),
}

struct Slot {
    /// Started only to move the log off a lost member: dropped as soon as it is idle and
    /// its configuration is whole.
    maintenance: bool,
    instance: u64,
    writer: LogWriter<StoredEvent>,
    waiting: Vec<Reply<ReadyLog>>,
    ops: HashMap<OpId, Pending>,
    last_used: Instant,
    counted: tessera_replication::WriterCounters,
}

/// The handle callers use; cheap to clone.
#[derive(Clone)]
pub(crate) struct Writers {
    commands: mpsc::Sender<Command>,
    capacity: usize,
}

impl Writers {
    /// Sends a command; a full queue is refused at once with `QueueFull`.
    pub fn send(&self, command: Command) -> Result<(), JournalError> {
        self.commands.try_send(command).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => JournalError::QueueFull {
                capacity: self.capacity,
            },
            mpsc::error::TrySendError::Closed(_) => JournalError::Closed,
        })
    }

    /// Sends a command built around a reply channel and awaits the reply.
    pub async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, JournalError> {
        let (reply, answer) = oneshot::channel();
        self.send(make(reply))?;
        answer.await.map_err(|_| JournalError::Closed)?
    }

    pub async fn serving(&self, persistence_id: &str) -> Option<ServingLog> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Serving {
            persistence_id: persistence_id.to_string(),
            reply,
        })
        .ok()?;
        answer.await.ok().flatten()
    }

    pub async fn status(&self, persistence_id: &str) -> Option<WriterStatus> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Status {
            persistence_id: persistence_id.to_string(),
            reply,
        })
        .ok()?;
        answer.await.ok().flatten()
    }
}

/// Where the list of stores this node has seen lives, and its saving: each save runs on a
/// blocking thread, and one that finds a later list tried already does nothing.
struct KnownStoresFile {
    path: PathBuf,
    /// The version of the last list handed to a save.
    handed: u64,
    /// What the saves share with the task.
    saves: Arc<KnownStoresSaves>,
}

/// The state of a node's known-stores saves, shared by the blocking threads that run them.
#[derive(Default)]
struct KnownStoresSaves {
    /// Taken by each save in turn.
    progress: Mutex<SaveProgress>,
    /// A save failed and none has been tried since: the next full tick saves again, so that
    /// a passing write error does not leave the list on disk short of a store until the
    /// list next changes (a node that restarts with a short list may create a log again).
    failed: AtomicBool,
}

#[derive(Default)]
struct SaveProgress {
    /// The version of the last list a save tried to write, whether or not it succeeded: a
    /// failed save may have replaced the file before failing (its directory's sync), and an
    /// earlier list must not replace it then; the retry writes the latest list under a later
    /// version.
    tried: u64,
    /// A failure was logged as an error and no save succeeded since: a disk that keeps
    /// failing is reported once at that level, then at debug level every second.
    reported: bool,
}

/// Starts the writers' task. `known_stores` is the list read from `known_stores_path` (saved
/// there again whenever it changes; kept in memory only without a path).
pub(crate) fn start(
    caller: Arc<dyn ReplicaCaller>,
    membership: watch::Receiver<ClusterSnapshot>,
    settings: WritersSettings,
    metrics: Arc<PersistenceMetrics>,
    known_stores: KnownStores,
    known_stores_path: Option<PathBuf>,
) -> Writers {
    let (commands, command_queue) = mpsc::channel(settings.command_queue_capacity);
    // Answers come from call tasks, one batch per message sent; the bound only makes a
    // burst of answers wait for the task.
    let (answers, answer_queue) = mpsc::channel(settings.command_queue_capacity);
    let capacity = settings.command_queue_capacity;
    let (local_address, storage_id) = {
        let (address, storage_id) = caller.local();
        (address.clone(), storage_id)
    };
    let mut actor = Actor {
        caller,
        settings,
        metrics,
        slots: HashMap::new(),
        ticking: HashSet::new(),
        local: ReplicaId::new(local_address, storage_id),
        ring: Ring::default(),
        members: Vec::new(),
        converged: false,
        serving_member: false,
        answers,
        outboxes: Vec::new(),
        in_flight: HashMap::new(),
        outputs: Vec::new(),
        next_op: 1,
        last_full_tick: Instant::now(),
        known_stores,
        known_stores_file: known_stores_path.map(|path| KnownStoresFile {
            path,
            handed: 0,
            saves: Arc::default(),
        }),
    };
    let local = actor.local.clone();
    if actor.known_stores.saw(&local.address, local.storage_id) {
        actor.save_known_stores();
    }
    actor.on_membership(&membership.borrow().clone());
    tokio::spawn(actor.run(command_queue, answer_queue, membership));
    Writers { commands, capacity }
}

struct Actor {
    caller: Arc<dyn ReplicaCaller>,
    settings: WritersSettings,
    metrics: Arc<PersistenceMetrics>,
    slots: HashMap<Arc<str>, Slot>,
    /// The writers that asked for ticks when last drained (a node holds thousands of idle
    /// writers after a load, and a tick every 20 ms must not walk them all); every writer
    /// is ticked once a second besides. It may name writers gone since.
    ticking: HashSet<Arc<str>>,
    local: ReplicaId,
    ring: Ring,
    /// Members whose replicas may hold logs.
    members: Vec<Address>,
    converged: bool,
    /// Whether this node may write logs (it is an Up member, or leaving).
    serving_member: bool,
    answers: mpsc::Sender<AnswerBatch>,
    /// Calls waiting to be sent, in the order they were made: those of this turn, and those
    /// held back for nodes with [`MAX_MESSAGES_IN_FLIGHT_PER_NODE`] messages in flight.
    outboxes: Vec<Outbox>,
    /// Messages of calls with small answers sent to each node whose answers have not come
    /// back.
    in_flight: HashMap<Address, usize>,
    /// The buffer a writer's outputs are taken into (kept, so taking them allocates nothing).
    outputs: Vec<Output<StoredEvent>>,
    next_op: OpId,
    last_full_tick: Instant,
    /// Every store this node has seen among the members (see [`crate::known_stores`]).
    known_stores: KnownStores,
    known_stores_file: Option<KnownStoresFile>,
}

impl Actor {
    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut answers: mpsc::Receiver<AnswerBatch>,
        mut membership: watch::Receiver<ClusterSnapshot>,
    ) {
        let mut tick = tokio::time::interval(self.settings.tick_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut membership_open = true;
        loop {
            tokio::select! {
                // A change of membership first: a command sent once the node was seen Up
                // must find it Up here too.
                biased;
                changed = membership.changed(), if membership_open => match changed {
                    Ok(()) => {
                        let snapshot = membership.borrow_and_update().clone();
                        self.on_membership(&snapshot);
                    }
                    Err(_) => membership_open = false,
                },
                Some(batch) = answers.recv() => self.on_answers(batch),
                command = commands.recv() => match command {
                    Some(command) => self.on_command(command),
                    None => break,
                },
                _ = tick.tick() => self.on_tick(),
            }
            // Whatever else is ready joins this turn, so that its calls share messages.
            let mut handled = 1;
            let mut yielded = false;
            while handled < MAX_HANDLED_PER_FLUSH {
                if membership_open && membership.has_changed().unwrap_or(false) {
                    break;
                }
                if let Ok(batch) = answers.try_recv() {
                    self.on_answers(batch);
                } else if let Ok(command) = commands.try_recv() {
                    self.on_command(command);
                } else if !yielded && handled < YIELD_BELOW_HANDLED && !self.outboxes.is_empty() {
                    // The tasks ready to run (entities whose commands are on their way, say)
                    // go first, once: their commands join this turn's messages rather than
                    // leaving in messages of their own. Without other work it costs nothing.
                    yielded = true;
                    tokio::task::yield_now().await;
                    continue;
                } else {
                    break;
                }
                handled += 1;
            }
            self.flush();
        }
        // Every caller still waiting hears that the journal closed.
        for (_, slot) in self.slots.drain() {
            drop(slot);
        }
    }

    /// Sends the calls waiting: those with small answers to one node in one message, the
    /// others alone. Each message's answers come back to the task as one batch. While a node
    /// has [`MAX_MESSAGES_IN_FLIGHT_PER_NODE`] messages in flight, its last message (the one
    /// calls still join) waits for an answer, for at most [`MAX_CALL_HOLD`]. The messages
    /// are queued on the transport in the order of the calls (the first poll of one task puts
    /// them all on their way, in order; only a node's last message can be held, every earlier
    /// one being closed): a writer's mark before its delete reaches a replica in that order.
    fn flush(&mut self) {
        if self.outboxes.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut held: Vec<Outbox> = Vec::new();
        let mut leaving: Vec<(Outbox, bool)> = Vec::new();
        for outbox in std::mem::take(&mut self.outboxes) {
            let in_flight = self.in_flight.get(&outbox.to).copied().unwrap_or(0);
            let may_wait =
                !outbox.is_closed() && now.saturating_duration_since(outbox.opened) < MAX_CALL_HOLD;
            if in_flight >= MAX_MESSAGES_IN_FLIGHT_PER_NODE && may_wait {
                held.push(outbox);
            } else {
                let counted = !outbox.has_large_answer();
                if counted {
                    *self.in_flight.entry(outbox.to.clone()).or_insert(0) += 1;
                }
                leaving.push((outbox, counted));
            }
        }
        self.outboxes = held;
        if leaving.is_empty() {
            return;
        }
        let sends: Vec<_> = leaving
            .into_iter()
            .map(|(Outbox { to, calls, .. }, counted)| {
                let (keys, calls): (Vec<_>, Vec<_>) = calls
                    .into_iter()
                    .map(|o| ((o.persistence_id, o.instance, o.id), o.call))
                    .unzip();
                let replies = match <[ReplicaCall; 1]>::try_from(calls) {
                    Ok([call]) => {
                        let reply = self.caller.call_any(&to, call);
                        async move { vec![reply.await] }.boxed()
                    }
                    Err(calls) => self.caller.call_batch(&to, calls),
                };
                let answers = self.answers.clone();
                async move {
                    let batch = keys
                        .into_iter()
                        .zip(replies.await)
                        .map(|((persistence_id, instance, id), reply)| Answer {
                            persistence_id,
                            instance,
                            id,
                            result: CallResult::from_reply(reply),
                        })
                        .collect();
                    let _ = answers
                        .send(AnswerBatch {
                            from: to,
                            counted,
                            answers: batch,
                        })
                        .await;
                }
            })
            .collect();
        tokio::spawn(futures::future::join_all(sends));
    }

    /// Queues a writer's call for [`Actor::flush`]. It joins the last message waiting for its
    /// node when both carry only calls with small answers and there is room: calls to a node
    /// leave in the order they were made.
    fn enqueue(&mut self, to: Address, outgoing: Outgoing) {
        // A call whose answer may be large fills its message alone.
        let size_bytes = if small_answer_call(&outgoing.call) {
            call_size_estimate(&outgoing.call)
        } else {
            MAX_BATCH_BYTES + 1
        };
        if let Some(outbox) = self.outboxes.iter_mut().rev().find(|o| o.to == to) {
            if !outbox.is_closed() && outbox.size_bytes + size_bytes <= MAX_BATCH_BYTES {
                outbox.size_bytes += size_bytes;
                outbox.calls.push(outgoing);
                return;
            }
            outbox.closed = true;
        }
        let mut calls = Vec::with_capacity(OUTBOX_INITIAL_CALLS);
        calls.push(outgoing);
        self.outboxes.push(Outbox {
            to,
            calls,
            size_bytes,
            closed: false,
            opened: Instant::now(),
        });
    }

    /// Saves the list of known stores on a blocking thread: the task goes on meanwhile, and
    /// a save that finds a later list tried already leaves it.
    fn save_known_stores(&mut self) {
        self.metrics
            .known_stores
            .store(self.known_stores.len() as u64, Ordering::Relaxed);
        let Some(file) = self.known_stores_file.as_mut() else {
            return;
        };
        file.handed += 1;
        let version = file.handed;
        let path = file.path.clone();
        let saves = file.saves.clone();
        let metrics = self.metrics.clone();
        let list = self.known_stores.clone();
        tokio::task::spawn_blocking(move || {
            let mut progress = saves
                .progress
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if progress.tried >= version {
                return;
            }
            progress.tried = version;
            match list.save(&path) {
                Ok(()) => progress.reported = false,
                Err(e) => {
                    PersistenceMetrics::incr(&metrics.known_stores_save_failures);
                    if progress.reported {
                        tracing::debug!(error = %e, "saving the known stores failed again");
                    } else {
                        progress.reported = true;
                        tracing::error!(error = %e, "saving the known stores failed; trying again every second");
                    }
                    saves.failed.store(true, Ordering::Relaxed);
                }
            }
        });
    }

    /// The known stores changed: saved, and every writer told (one waiting to create a log
    /// may now).
    fn known_stores_changed(&mut self) {
        self.save_known_stores();
        self.place_writers();
    }

    /// Gives every writer the placement it has now.
    fn place_writers(&mut self) {
        let now = Instant::now();
        let ids: Vec<Arc<str>> = self.slots.keys().cloned().collect();
        for id in ids {
            let placement = self.placement(&id);
            if let Some(slot) = self.slots.get_mut(&id) {
                slot.writer.placement_changed(placement, now);
            }
            self.drain(&id);
        }
    }

    fn on_membership(&mut self, snapshot: &ClusterSnapshot) {
        let holds_replicas = |status: MemberStatus| {
            matches!(
                status,
                MemberStatus::Up | MemberStatus::Leaving | MemberStatus::Exiting
            )
        };
        let ring = Ring::new(
            snapshot
                .members
                .iter()
                .filter(|m| m.status == MemberStatus::Up)
                .map(|m| m.address().clone()),
        );
        let members: Vec<Address> = snapshot
            .members
            .iter()
            .filter(|m| holds_replicas(m.status))
            .map(|m| m.address().clone())
            .collect();
        self.serving_member = snapshot
            .self_status
            .is_some_and(|s| matches!(s, MemberStatus::Up | MemberStatus::Leaving));
        // The snapshot changes with every heartbeat, several times a second; the writers'
        // placement only with these (and every writer is visited to place it).
        if ring.members() == self.ring.members()
            && members == self.members
            && snapshot.converged == self.converged
        {
            return;
        }
        self.ring = ring;
        self.members = members;
        self.converged = snapshot.converged;
        self.place_writers();
    }

    fn placement(&self, persistence_id: &str) -> Placement {
        Placement {
            preference: self.ring.preference(persistence_id),
            members: self.members.clone(),
            known_stores: self.known_stores.replicas(),
            converged: self.converged,
            local: Some(self.local.address.clone()),
        }
    }

    fn unavailable(persistence_id: &str, reason: impl Into<String>) -> JournalError {
        JournalError::Unavailable {
            persistence_id: persistence_id.to_string(),
            reason: reason.into(),
        }
    }

    /// The slot of a log, starting a writer (which locates and recovers it) if there is none.
    fn slot(&mut self, persistence_id: &str) -> Result<Arc<str>, JournalError> {
        if let Some((id, _)) = self.slots.get_key_value(persistence_id) {
            return Ok(id.clone());
        }
        if !self.serving_member {
            return Err(Self::unavailable(
                persistence_id,
                "this node is not an Up member of a cluster",
            ));
        }
        if self.slots.len() >= self.settings.max_writers {
            self.evict(Instant::now(), true);
            if self.slots.len() >= self.settings.max_writers {
                return Err(JournalError::QueueFull {
                    capacity: self.settings.max_writers,
                });
            }
        }
        let id: Arc<str> = Arc::from(persistence_id);
        let now = Instant::now();
        let instance: u64 = rand::random();
        let writer = LogWriter::new(
            self.settings.writer.clone(),
            instance,
            self.placement(persistence_id),
            None,
            now,
        );
        PersistenceMetrics::incr(&self.metrics.recoveries);
        self.ticking.insert(id.clone());
        self.slots.insert(
            id.clone(),
            Slot {
                maintenance: false,
                instance,
                writer,
                waiting: Vec::new(),
                ops: HashMap::new(),
                last_used: now,
                counted: Default::default(),
            },
        );
        PersistenceMetrics::add(&self.metrics.writers, 1);
        Ok(id)
    }

    fn on_command(&mut self, command: Command) {
        let now = Instant::now();
        match command {
            Command::Append {
                write,
                writer,
                reply,
            } => {
                // A fenced write goes only to the very writer that opened the log; whether
                // that writer still holds it as opened, it decides (it may be recovering).
                if let Some(epoch) = writer
                    && self
                        .slots
                        .get(write.persistence_id.as_str())
                        .is_none_or(|slot| slot.instance != epoch.writer)
                {
                    PersistenceMetrics::incr(&self.metrics.appends_not_applied);
                    let _ = reply.send(Err(Self::unavailable(
                        &write.persistence_id,
                        "the writer of the log on this node is no longer the one it was opened \
                         with (it was dropped, or the log was taken over): open it again",
                    )));
                    return;
                }
                let id = match self.slot(&write.persistence_id) {
                    Ok(id) => id,
                    Err(e) => {
                        PersistenceMetrics::incr(&self.metrics.appends_not_applied);
                        let _ = reply.send(Err(e));
                        return;
                    }
                };
                let op = self.next_op();
                let first_seq = write.events.first().map_or(0, |e| e.sequence_nr);
                // One copy of the name, shared by the write's events.
                let writer_id = smol_str::SmolStr::new(&write.writer_id);
                let payloads = write
                    .events
                    .iter()
                    .map(|e| StoredEvent::from_new(&writer_id, e))
                    .collect();
                if let Some(slot) = self.slots.get_mut(&id) {
                    slot.last_used = now;
                    slot.ops.insert(
                        op,
                        Pending::Write {
                            reply,
                            started: now,
                        },
                    );
                    match writer {
                        Some(opened) => slot
                            .writer
                            .append_fenced(op, first_seq, payloads, opened, now),
                        None => slot.writer.append(op, first_seq, payloads, now),
                    }
                }
                self.drain(&id);
            }
            Command::DeleteTo {
                persistence_id,
                to,
                reply,
            } => {
                let id = match self.slot(&persistence_id) {
                    Ok(id) => id,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return;
                    }
                };
                let op = self.next_op();
                if let Some(slot) = self.slots.get_mut(&id) {
                    slot.last_used = now;
                    slot.ops.insert(
                        op,
                        Pending::Write {
                            reply,
                            started: now,
                        },
                    );
                    slot.writer.delete_to(op, to, now);
                }
                self.drain(&id);
            }
            Command::Ready {
                persistence_id,
                reply,
            } => {
                let id = match self.slot(&persistence_id) {
                    Ok(id) => id,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return;
                    }
                };
                if let Some(slot) = self.slots.get_mut(&id) {
                    slot.last_used = now;
                    if slot.writer.is_serving() {
                        let _ = reply.send(Ok(ready_log(&slot.writer)));
                    } else {
                        slot.waiting.push(reply);
                    }
                }
                self.drain(&id);
            }
            Command::Reopen {
                persistence_id,
                reply,
            } => {
                if let Some(slot) = self.slots.get(persistence_id.as_str()) {
                    if !slot.ops.is_empty() || !slot.waiting.is_empty() {
                        let _ = reply.send(Err(Self::unavailable(
                            &persistence_id,
                            "this node's writer of the log is busy; open it again later",
                        )));
                        return;
                    }
                    self.slots.remove(persistence_id.as_str());
                    self.metrics.writers.fetch_sub(1, Ordering::Relaxed);
                }
                let id = match self.slot(&persistence_id) {
                    Ok(id) => id,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return;
                    }
                };
                if let Some(slot) = self.slots.get_mut(&id) {
                    slot.waiting.push(reply);
                }
                self.drain(&id);
            }
            Command::Confirm {
                persistence_id,
                highest,
                reply,
            } => {
                let op = self.next_op();
                let Some((id, slot)) = self.slots.get_key_value(persistence_id.as_str()) else {
                    let _ = reply.send(Err(JournalError::Fenced {
                        persistence_id,
                        reason: "this node no longer writes the log".to_string(),
                    }));
                    return;
                };
                let id = id.clone();
                if !slot.writer.is_serving() {
                    let _ = reply.send(Err(JournalError::Fenced {
                        persistence_id,
                        reason: "this node's writer of the log is not serving".to_string(),
                    }));
                    return;
                }
                if let Some(slot) = self.slots.get_mut(&id) {
                    slot.last_used = now;
                    slot.ops.insert(op, Pending::Confirm(reply));
                    slot.writer.confirm(op, highest, now);
                }
                self.drain(&id);
            }
            Command::Maintain { persistence_id } => {
                if self.slots.contains_key(persistence_id.as_str()) {
                    return;
                }
                let maintaining = self.slots.values().filter(|s| s.maintenance).count();
                if maintaining >= MAX_MAINTENANCE_WRITERS {
                    return;
                }
                if let Ok(id) = self.slot(&persistence_id)
                    && let Some(slot) = self.slots.get_mut(&id)
                {
                    slot.maintenance = true;
                    self.drain(&id);
                }
            }
            Command::StoresSeen { answered, named } => {
                let mut changed = false;
                for (address, storage_id) in &answered {
                    changed |= self.known_stores.saw(address, *storage_id);
                }
                for (address, storage_id) in &named {
                    changed |= self.known_stores.named(address, *storage_id);
                }
                if changed {
                    self.known_stores_changed();
                }
            }
            Command::KnownStores { reply } => {
                let _ = reply.send(self.known_stores.replicas());
            }
            Command::ForgetStore { storage_id, reply } => {
                let known = self.known_stores.forget(storage_id);
                if known {
                    self.known_stores_changed();
                }
                let _ = reply.send(known);
            }
            Command::Serving {
                persistence_id,
                reply,
            } => {
                let serving = self
                    .slots
                    .get_mut(persistence_id.as_str())
                    .and_then(|slot| {
                        slot.last_used = now;
                        let status = slot.writer.status();
                        Some(ServingLog {
                            epoch: status.epoch.filter(|_| slot.writer.is_serving())?,
                            config: status.config?,
                            highest: status.highest?,
                            deleted_to: slot.writer.deleted_to(),
                        })
                    });
                let _ = reply.send(serving);
            }
            Command::Status {
                persistence_id,
                reply,
            } => {
                let status = self
                    .slots
                    .get(persistence_id.as_str())
                    .map(|s| s.writer.status());
                let _ = reply.send(status);
            }
        }
    }

    fn next_op(&mut self) -> OpId {
        let op = self.next_op;
        self.next_op += 1;
        op
    }

    fn on_answers(&mut self, batch: AnswerBatch) {
        if batch.counted
            && let Some(in_flight) = self.in_flight.get_mut(&batch.from)
        {
            *in_flight = in_flight.saturating_sub(1);
            if *in_flight == 0 {
                self.in_flight.remove(&batch.from);
            }
        }
        for answer in batch.answers {
            self.on_answer(answer);
        }
    }

    fn on_answer(&mut self, answer: Answer) {
        let now = Instant::now();
        let Some(slot) = self.slots.get_mut(&answer.persistence_id) else {
            return;
        };
        if slot.instance != answer.instance {
            return;
        }
        match answer.result {
            CallResult::Response(response) => slot.writer.on_response(answer.id, response, now),
            CallResult::WrongStorage => slot.writer.on_wrong_storage(answer.id, now),
            CallResult::Failed(reason) => {
                tracing::debug!(log = %answer.persistence_id, %reason, "replica call failed");
                slot.writer.on_failure(answer.id, now)
            }
        }
        self.drain(&answer.persistence_id);
    }

    fn on_tick(&mut self) {
        let now = Instant::now();
        let full = now.duration_since(self.last_full_tick) >= Duration::from_secs(1);
        if full {
            self.last_full_tick = now;
        }
        let busy: Vec<Arc<str>> = if full {
            self.slots.keys().cloned().collect()
        } else {
            self.ticking.iter().cloned().collect()
        };
        for id in busy {
            if let Some(slot) = self.slots.get_mut(&id) {
                slot.writer.tick(now);
            }
            self.drain(&id);
        }
        if full {
            self.evict(now, false);
            if self
                .known_stores_file
                .as_ref()
                .is_some_and(|file| file.saves.failed.swap(false, Ordering::Relaxed))
            {
                self.save_known_stores();
            }
        }
    }

    /// Drops idle writers: those unused for the idle timeout, maintenance writers whose log
    /// is whole again, and, when `make_room`, the least recently used idle one.
    fn evict(&mut self, now: Instant, make_room: bool) {
        let timeout = self.settings.writer_idle_timeout;
        let idle = |s: &Slot| s.ops.is_empty() && s.waiting.is_empty() && !s.writer.needs_tick();
        let members = &self.members;
        let replication_factor = self.settings.writer.quorums.replication_factor();
        let whole = |s: &Slot| {
            s.writer.is_serving()
                && s.writer.status().config.is_some_and(|c| {
                    !c.is_joint()
                        && c.members.len() >= replication_factor.min(members.len())
                        && c.members.iter().all(|m| members.contains(&m.address))
                })
        };
        let before = self.slots.len();
        self.slots.retain(|_, s| {
            let expired = now.duration_since(s.last_used) >= timeout;
            !(idle(s) && (expired || (s.maintenance && whole(s))))
        });
        if make_room
            && let Some(id) = self
                .slots
                .iter()
                .filter(|(_, s)| idle(s))
                .min_by_key(|(_, s)| s.last_used)
                .map(|(id, _)| id.clone())
        {
            self.slots.remove(&id);
        }
        let removed = before - self.slots.len();
        self.metrics
            .writers
            .fetch_sub(removed as u64, Ordering::Relaxed);
    }

    /// Carries out what a writer produced.
    fn drain(&mut self, id: &Arc<str>) {
        let Some(slot) = self.slots.get_mut(id) else {
            self.ticking.remove(id);
            return;
        };
        let mut outputs = std::mem::take(&mut self.outputs);
        slot.writer.move_outputs_into(&mut outputs);
        let counters = slot.writer.counters();
        let copied = counters.entries_copied - slot.counted.entries_copied;
        let moved = counters.reconfigurations - slot.counted.reconfigurations;
        let held = counters.creations_held - slot.counted.creations_held;
        slot.counted = counters;
        let instance = slot.instance;
        PersistenceMetrics::add(&self.metrics.entries_copied, copied);
        PersistenceMetrics::add(&self.metrics.reconfigurations, moved);
        PersistenceMetrics::add(&self.metrics.creations_held, held);
        let mut stopped = false;
        for output in outputs.drain(..) {
            match output {
                Output::Send {
                    id: request,
                    to,
                    request: body,
                } => {
                    let call = ReplicaCall {
                        log: SmolStr::new(&**id),
                        storage_id: match &to {
                            Target::Replica(r) => Some(r.storage_id),
                            Target::Address(_) => None,
                        },
                        request: ReplicaRequest::Log(body),
                    };
                    self.enqueue(
                        to.address().clone(),
                        Outgoing {
                            persistence_id: id.clone(),
                            instance,
                            id: request,
                            call,
                        },
                    );
                }
                // The waiters are answered below, whenever the writer serves.
                Output::Ready { .. } => {}
                Output::Completed { op, outcome } => {
                    let pending = self.slots.get_mut(id).and_then(|s| s.ops.remove(&op));
                    if let Some(pending) = pending {
                        self.complete(id, pending, outcome);
                    }
                }
                Output::Stopped(reason) => {
                    stopped = true;
                    if matches!(reason, StopReason::Fenced { .. }) {
                        PersistenceMetrics::incr(&self.metrics.fenced);
                    }
                    if let StopReason::Inconsistent(detail) = &reason {
                        tracing::error!(log = %id, %detail, "replicated log inconsistent");
                    }
                    if let Some(slot) = self.slots.get_mut(id) {
                        for waiter in slot.waiting.drain(..) {
                            let _ = waiter.send(Err(stopped_error(id, &reason)));
                        }
                    }
                }
            }
        }
        self.outputs = outputs;
        // A writer announces `Ready` once, when it first serves; one that moves its log to
        // other members recovers again and then serves without a second `Ready`. Callers
        // that asked while it was moving wait in `waiting` and are answered here, or they
        // would wait for ever (an entity recovering on this node would never start).
        if let Some(slot) = self.slots.get_mut(id)
            && slot.writer.is_serving()
            && !slot.waiting.is_empty()
        {
            let ready = ready_log(&slot.writer);
            for waiter in slot.waiting.drain(..) {
                let _ = waiter.send(Ok(ready.clone()));
            }
        }
        match self.slots.get(id) {
            Some(slot) if !stopped && slot.writer.needs_tick() => {
                if !self.ticking.contains(id) {
                    self.ticking.insert(id.clone());
                }
            }
            _ => {
                self.ticking.remove(id);
            }
        }
        if stopped && let Some(slot) = self.slots.remove(id) {
            // The writer completed every operation before it stopped; any left hear why.
            for (_, pending) in slot.ops {
                let reason = StopReason::Unavailable("the log's writer stopped".into());
                self.complete(
                    id,
                    pending,
                    Outcome::NotApplied(NotApplied::Stopped(reason)),
                );
            }
            self.metrics.writers.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn complete(&self, id: &str, pending: Pending, outcome: Outcome) {
        let metrics = &self.metrics;
        match pending {
            Pending::Write { reply, started } => {
                match &outcome {
                    Outcome::Acknowledged => {
                        PersistenceMetrics::incr(&metrics.appends_acknowledged);
                        metrics.append_durations.observe_since(started);
                    }
                    Outcome::NotApplied(
                        NotApplied::Stopped(StopReason::Fenced { .. })
                        | NotApplied::TakenOver { .. },
                    ) => {
                        PersistenceMetrics::incr(&metrics.appends_not_applied);
                        PersistenceMetrics::incr(&metrics.refused_fenced);
                    }
                    Outcome::NotApplied(_) => {
                        PersistenceMetrics::incr(&metrics.appends_not_applied)
                    }
                    Outcome::Unknown(_) => PersistenceMetrics::incr(&metrics.appends_unknown),
                }
                let _ = reply.send(outcome_result(id, outcome));
            }
            Pending::Confirm(reply) => {
                let result = match outcome {
                    Outcome::Acknowledged => Ok(()),
                    Outcome::NotApplied(_) | Outcome::Unknown(_) => Err(JournalError::Fenced {
                        persistence_id: id.to_string(),
                        reason: "this node could not confirm it still writes the log".into(),
                    }),
                };
                let _ = reply.send(result);
            }
        }
    }
}

fn small_answer_call(call: &ReplicaCall) -> bool {
    match &call.request {
        ReplicaRequest::Log(request) => small_answer(request),
        _ => false,
    }
}

fn ready_log(writer: &LogWriter<StoredEvent>) -> ReadyLog {
    ReadyLog {
        highest: writer.highest().unwrap_or(0),
        opened: writer.opened_epoch(),
        deleted_to: writer.deleted_to(),
        sources: writer.read_sources(),
    }
}

fn stopped_error(id: &str, reason: &StopReason) -> JournalError {
    match reason {
        StopReason::Fenced { .. } => JournalError::Fenced {
            persistence_id: id.to_string(),
            reason: reason.to_string(),
        },
        other => JournalError::Unavailable {
            persistence_id: id.to_string(),
            reason: other.to_string(),
        },
    }
}

fn outcome_result(id: &str, outcome: Outcome) -> Result<(), JournalError> {
    match outcome {
        Outcome::Acknowledged => Ok(()),
        Outcome::Unknown(reason) => Err(JournalError::OutcomeUnknown {
            persistence_id: id.to_string(),
            reason,
        }),
        Outcome::NotApplied(NotApplied::SequenceMismatch { expected, got }) => {
            Err(JournalError::SequenceMismatch {
                persistence_id: id.to_string(),
                expected,
                got,
            })
        }
        Outcome::NotApplied(NotApplied::QueueFull { capacity }) => {
            Err(JournalError::QueueFull { capacity })
        }
        Outcome::NotApplied(NotApplied::Stopped(reason)) => Err(stopped_error(id, &reason)),
        Outcome::NotApplied(taken @ NotApplied::TakenOver { .. }) => Err(JournalError::Fenced {
            persistence_id: id.to_string(),
            reason: taken.to_string(),
        }),
        Outcome::NotApplied(not_applied @ NotApplied::Waited { .. }) => {
            Err(JournalError::Unavailable {
                persistence_id: id.to_string(),
                reason: not_applied.to_string(),
            })
        }
    }
}
