//! The tokio driver around a [`Replicator`]: one task owns it and feeds it local commands
//! (from a bounded queue), messages from other nodes' Replicators (the transport's
//! `replicator` service), membership views (the cluster's published snapshot), ticks and the
//! completions of durable writes; it carries out the outputs — sends, replies, notifications,
//! and durable writes, which it hands to the [`DurableWriter`] task and never waits for. The
//! Replicator holds back the acknowledgements that depend on a durable write until its
//! completion comes back.

use crate::consistency::{ReadConsistency, WriteConsistency};
use crate::durable::{DurableStore, DurableStoreError};
use crate::durable_writer::{DurableCompletion, DurableWrite, DurableWriteError, DurableWriter};
use crate::replicator::{
    Command, DeleteResult, DurableWriteId, GetResult, Input, KeysPage, Limit, LimitCounts,
    MembershipView, Output, Refusals, Replicator, ReplicatorConfig, ReplicatorMessage, RequestId,
    Response, SubscriberId, Time, UpdateContext, UpdateResult,
};
use crate::value::ReplicatedValue;
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tessera_cluster::UniqueAddress;
use tessera_cluster::node::ClusterSnapshot;
use tessera_cluster::transport::{Inbound, Lane, Transport, TransportError, services};
use tessera_metrics::LatencyFamily;
use tessera_storage::FsyncPolicy;
use tokio::sync::{mpsc, oneshot, watch};

/// Settings of a running Replicator.
#[derive(Debug, Clone)]
pub struct ReplicatorSettings {
    pub config: ReplicatorConfig,
    /// Local requests waiting for the Replicator; a request arriving at a full queue is
    /// refused with [`ReplicatorError::Overloaded`].
    pub command_queue_capacity: usize,
    /// Messages from other nodes waiting for the Replicator (full: the transport drops and
    /// counts them; anti-entropy repairs what was lost).
    pub service_queue_capacity: usize,
    /// Directory of the durable store; required when `config.durable_keys` is not empty.
    pub durable_dir: Option<PathBuf>,
    /// Steps' durable writes waiting for the durable writer, which commits all that wait in
    /// one synced batch. Full: the step's writes fail at once with
    /// [`DurableWriteError::QueueFull`] (counted in `durable_failures`), their
    /// acknowledgements are withheld, and the Replicator goes on serving everything else.
    pub durable_queue_capacity: usize,
    /// Durability of the durable store's writes: `Always` on every node (an update of a
    /// durable key is acknowledged after the fsync); `Never` only for tests that show what a
    /// power cut does without it.
    pub durable_fsync: FsyncPolicy,
}

impl Default for ReplicatorSettings {
    fn default() -> Self {
        ReplicatorSettings {
            config: ReplicatorConfig::default(),
            command_queue_capacity: 4096,
            service_queue_capacity: 8192,
            durable_dir: None,
            durable_queue_capacity: 1024,
            durable_fsync: FsyncPolicy::Always,
        }
    }
}

/// A change of a subscribed key (`value` is `None` once the key is deleted).
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub key: String,
    pub value: Option<ReplicatedValue>,
}

/// Why a request did not reach the Replicator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplicatorError {
    #[error("the replicator's request queue is full ({capacity} requests waiting); retry later")]
    Overloaded { capacity: usize },
    #[error("the replicator is stopped")]
    Stopped,
}

/// Failure to start a Replicator.
#[derive(Debug, thiserror::Error)]
pub enum ReplicatorStartError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error(transparent)]
    Durable(#[from] DurableStoreError),
    #[error("durable keys are configured but no directory for the durable store is")]
    NoDurableDir,
    #[error("durable_queue_capacity is 0 (expected at least 1)")]
    ZeroDurableQueueCapacity,
}

/// Counters of a running Replicator, for metrics.
#[derive(Debug, Default)]
pub struct ReplicatorCounters {
    /// Messages from peers that could not be decoded.
    pub decode_errors: AtomicU64,
    /// Messages the transport refused to queue (full queue, oversize).
    pub send_failures: AtomicU64,
    /// Notifications dropped because a subscriber's queue was full.
    pub dropped_notifications: AtomicU64,
    /// Durable writes that failed, refused by a full queue included (their acknowledgements
    /// were withheld); each failure is also logged.
    pub durable_failures: AtomicU64,
    /// Steps whose durable writes the full durable-writer queue refused.
    pub durable_queue_full: AtomicU64,
    /// Synced batches the durable writer committed (each holds every write that waited).
    pub durable_commits: AtomicU64,
    /// Durable writes stored.
    pub durable_writes: AtomicU64,
    /// Keys held, deleted ones included (updated after every step).
    pub keys: AtomicU64,
    /// Bytes held: keys and encoded states, what `max_total_bytes` bounds (updated after
    /// every step).
    pub bytes: AtomicU64,
    /// States refused at a limit, local updates and deletes ([`Refusals::local`]), in the
    /// order of [`Limit::ALL`] (updated after every step); read with
    /// [`ReplicatorCounters::refusals`].
    refused_local: [AtomicU64; 3],
    /// The same for states from peers ([`Refusals::remote`]).
    refused_remote: [AtomicU64; 3],
}

impl ReplicatorCounters {
    /// States refused at a limit since start.
    pub fn refusals(&self) -> Refusals {
        let read = |counters: &[AtomicU64; 3]| LimitCounts {
            keys: counters[0].load(Ordering::Relaxed),
            value_bytes: counters[1].load(Ordering::Relaxed),
            total_bytes: counters[2].load(Ordering::Relaxed),
        };
        Refusals {
            local: read(&self.refused_local),
            remote: read(&self.refused_remote),
        }
    }

    fn set_refusals(&self, refusals: &Refusals) {
        for (index, limit) in Limit::ALL.into_iter().enumerate() {
            self.refused_local[index].store(refusals.local.of(limit), Ordering::Relaxed);
            self.refused_remote[index].store(refusals.remote.of(limit), Ordering::Relaxed);
        }
    }
}

/// How long the Replicator's callers wait for its answer, by consistency level (label
/// `consistency`): from the call on a [`ReplicatorHandle`] to the reply, whatever it says
/// (a timed-out quorum included); requests refused before reaching the Replicator (a full
/// queue, a stopped Replicator) are not counted. Clones share their counts.
#[derive(Clone, Debug)]
pub struct ReplicatorLatencies {
    /// `get`, by [`ReadConsistency::label`].
    pub reads: LatencyFamily,
    /// `update` and `delete`, by [`WriteConsistency::label`].
    pub writes: LatencyFamily,
}

impl Default for ReplicatorLatencies {
    fn default() -> Self {
        Self {
            reads: LatencyFamily::new("consistency", ReadConsistency::LABELS),
            writes: LatencyFamily::new("consistency", WriteConsistency::LABELS),
        }
    }
}

impl ReplicatorLatencies {
    fn read(&self, consistency: ReadConsistency, started: Instant) {
        if let Some(histogram) = self.reads.get(consistency.label()) {
            histogram.observe_since(started);
        }
    }

    fn write(&self, consistency: WriteConsistency, started: Instant) {
        if let Some(histogram) = self.writes.get(consistency.label()) {
            histogram.observe_since(started);
        }
    }
}

enum DriverCommand {
    Request(Command, oneshot::Sender<Response>),
    Subscribe {
        key: String,
        changes: mpsc::Sender<Change>,
        reply: oneshot::Sender<Response>,
    },
    Stop(oneshot::Sender<()>),
}

/// The way to a running Replicator. Cheap to clone.
#[derive(Clone)]
pub struct ReplicatorHandle {
    commands: mpsc::Sender<DriverCommand>,
    capacity: usize,
    counters: Arc<ReplicatorCounters>,
    latencies: ReplicatorLatencies,
}

impl ReplicatorHandle {
    async fn submit(
        &self,
        make: impl FnOnce(oneshot::Sender<Response>) -> DriverCommand,
    ) -> Result<Response, ReplicatorError> {
        let (reply, answer) = oneshot::channel();
        match self.commands.try_send(make(reply)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                return Err(ReplicatorError::Overloaded {
                    capacity: self.capacity,
                });
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(ReplicatorError::Stopped),
        }
        answer.await.map_err(|_| ReplicatorError::Stopped)
    }

    async fn request(&self, command: Command) -> Result<Response, ReplicatorError> {
        self.submit(|reply| DriverCommand::Request(command, reply))
            .await
    }

    /// Reads `key` at `consistency`.
    pub async fn get(
        &self,
        key: &str,
        consistency: ReadConsistency,
        timeout: Duration,
    ) -> Result<GetResult, ReplicatorError> {
        let started = Instant::now();
        let response = self
            .request(Command::Get {
                key: key.to_string(),
                consistency,
                timeout,
            })
            .await?;
        self.latencies.read(consistency, started);
        match response {
            Response::Get(result) => Ok(result),
            other => Ok(GetResult::Failed(format!("unexpected reply {other:?}"))),
        }
    }

    /// Updates `key` with `modify` (given the current value, `None` for a new key) and
    /// replicates it at `consistency`.
    pub async fn update(
        &self,
        key: &str,
        consistency: WriteConsistency,
        timeout: Duration,
        modify: impl FnOnce(
            Option<ReplicatedValue>,
            &UpdateContext<'_>,
        ) -> Result<ReplicatedValue, String>
        + Send
        + 'static,
    ) -> Result<UpdateResult, ReplicatorError> {
        let started = Instant::now();
        let response = self
            .request(Command::Update {
                key: key.to_string(),
                consistency,
                timeout,
                modify: Box::new(modify),
            })
            .await?;
        self.latencies.write(consistency, started);
        match response {
            Response::Update(result) => Ok(result),
            other => Ok(UpdateResult::Failed(format!("unexpected reply {other:?}"))),
        }
    }

    /// Deletes `key` for good.
    pub async fn delete(
        &self,
        key: &str,
        consistency: WriteConsistency,
        timeout: Duration,
    ) -> Result<DeleteResult, ReplicatorError> {
        let started = Instant::now();
        let response = self
            .request(Command::Delete {
                key: key.to_string(),
                consistency,
                timeout,
            })
            .await?;
        self.latencies.write(consistency, started);
        match response {
            Response::Delete(result) => Ok(result),
            other => Ok(DeleteResult::Failed(format!("unexpected reply {other:?}"))),
        }
    }

    /// The keys that hold a value on this node, in order: at most `limit` after `after`.
    pub async fn keys(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<KeysPage, ReplicatorError> {
        let command = Command::Keys {
            after: after.map(str::to_string),
            limit,
        };
        match self.request(command).await? {
            Response::Keys(page) => Ok(page),
            _ => Ok(KeysPage::default()),
        }
    }

    /// Changes of `key`, batched, starting with its current value; at most `capacity` wait
    /// (further ones are dropped and counted; the next change carries the whole value).
    pub async fn subscribe(
        &self,
        key: &str,
        capacity: usize,
    ) -> Result<mpsc::Receiver<Change>, ReplicatorError> {
        let (changes, receiver) = mpsc::channel(capacity.max(1));
        let key = key.to_string();
        self.submit(|reply| DriverCommand::Subscribe {
            key,
            changes,
            reply,
        })
        .await?;
        Ok(receiver)
    }

    /// Stops the Replicator (after the step it is in).
    pub async fn stop(&self) {
        let (done, stopped) = oneshot::channel();
        if self.commands.send(DriverCommand::Stop(done)).await.is_ok() {
            let _ = stopped.await;
        }
    }

    /// The Replicator's counters.
    pub fn counters(&self) -> &ReplicatorCounters {
        &self.counters
    }

    /// How long its callers waited for gets, updates and deletes. Shared by every clone of
    /// this handle: the node renders it in `/metrics`.
    pub fn latencies(&self) -> &ReplicatorLatencies {
        &self.latencies
    }
}

/// The transport lane of a message: quorum reads and writes, their answers and read repairs
/// travel on [`Lane::Quorum`], so a caller waiting for a quorum never waits behind
/// anti-entropy or deltas (up to `max_message_bytes` each), which stay on [`Lane::Bulk`].
/// Messages of different lanes may overtake each other; the Replicator relies on no order
/// between them (states merge in any order, deltas carry their own sequence numbers).
fn lane_of(message: &ReplicatorMessage) -> Lane {
    match message {
        ReplicatorMessage::Read { .. }
        | ReplicatorMessage::ReadResult { .. }
        | ReplicatorMessage::Write { .. }
        | ReplicatorMessage::WriteAck { .. }
        | ReplicatorMessage::WriteNack { .. } => Lane::Quorum,
        ReplicatorMessage::Deltas { .. }
        | ReplicatorMessage::DeltaGap { .. }
        | ReplicatorMessage::Status { .. }
        | ReplicatorMessage::ChunkKeys { .. }
        | ReplicatorMessage::Gossip { .. } => Lane::Bulk,
    }
}

/// Bulk messages (anti-entropy, deltas: up to `max_message_bytes` each) taken off the
/// transport's queue and held behind the quorum messages taken with them, at most.
const MAX_HELD_BULK: usize = 256;
/// Quorum messages held at most.
const MAX_HELD_QUORUM: usize = 256;

/// The Replicator's inbound messages in the order they are stepped: quorum reads, writes and
/// their answers before the bulk messages taken off the queue with them. The transport keeps
/// the lanes apart on the wire but delivers a service's messages in one queue; without this,
/// a quorum message would still wait on the receiver for every bulk message ahead of it to be
/// decoded and merged. Messages are held as they arrived (their bytes were in the transport's
/// queue already) and decoded when stepped; a message's kind is read from its first bytes.
/// Bulk messages keep their order among themselves, quorum ones too; the Replicator relies on
/// no order between the two (see [`lane_of`]). Both holds are bounded: once one is full, the
/// rest waits in the transport's bounded queue.
#[derive(Default)]
struct InboundOrder {
    quorum: VecDeque<Inbound>,
    bulk: VecDeque<Inbound>,
}

impl InboundOrder {
    fn has_room(&self) -> bool {
        self.quorum.len() < MAX_HELD_QUORUM && self.bulk.len() < MAX_HELD_BULK
    }

    fn is_empty(&self) -> bool {
        self.quorum.is_empty() && self.bulk.is_empty()
    }

    /// Holds a message by its kind; one that is not a quorum message by its first bytes (a
    /// malformed one too) waits with the bulk ones.
    fn hold(&mut self, message: Inbound) {
        if is_quorum_message(&message.payload) {
            self.quorum.push_back(message);
        } else {
            self.bulk.push_back(message);
        }
    }

    /// Holds what the transport has queued, while there is room.
    fn take_queued(&mut self, queue: &mut mpsc::Receiver<Inbound>) {
        while self.has_room() {
            match queue.try_recv() {
                Ok(message) => self.hold(message),
                Err(_) => return,
            }
        }
    }

    /// The next message to step, decoded: the oldest quorum message, else the oldest bulk
    /// one. One that does not decode is counted and dropped.
    fn next(
        &mut self,
        counters: &ReplicatorCounters,
    ) -> Option<(UniqueAddress, ReplicatorMessage)> {
        while let Some(message) = self.quorum.pop_front().or_else(|| self.bulk.pop_front()) {
            match ReplicatorMessage::decode(&message.payload) {
                Ok(decoded) => return Some((message.from, decoded)),
                Err(e) => {
                    counters.decode_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(from = %message.from.address, error = %e,
                        "undecodable replicator message");
                }
            }
        }
        None
    }
}

/// Whether an encoded [`ReplicatorMessage`] is one of the quorum lane's, from its first two
/// bytes: the format version, then the variant's index (postcard: one byte below 128). The
/// quorum variants are the first five ([`lane_of`]; a test keeps the two in step).
fn is_quorum_message(payload: &[u8]) -> bool {
    matches!(payload, [version, variant, ..]
        if *version == crate::codec::DATA_FORMAT_VERSION && *variant < QUORUM_VARIANTS)
}

/// `Read`, `ReadResult`, `Write`, `WriteAck`, `WriteNack`: variants 0 to 4.
const QUORUM_VARIANTS: u8 = 5;

/// Now, on tokio's clock (which tests can pause and advance).
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The membership view a cluster snapshot gives.
pub fn view_of(snapshot: &ClusterSnapshot) -> MembershipView {
    MembershipView {
        members: snapshot
            .members
            .iter()
            .map(|m| (m.unique_address.clone(), m.status))
            .collect(),
        unreachable: snapshot.unreachable.clone(),
        leader: snapshot.leader.clone(),
    }
}

/// Starts a Replicator on `transport`, following the membership published on `membership`.
/// Durable keys are loaded from the durable store before the first request is served.
pub async fn start<T: Transport>(
    transport: Arc<T>,
    membership: watch::Receiver<ClusterSnapshot>,
    settings: ReplicatorSettings,
) -> Result<ReplicatorHandle, ReplicatorStartError> {
    if settings.durable_queue_capacity == 0 {
        return Err(ReplicatorStartError::ZeroDurableQueueCapacity);
    }
    let durable = match (
        &settings.durable_dir,
        settings.config.durable_keys.is_empty(),
    ) {
        (_, true) => None,
        (None, false) => return Err(ReplicatorStartError::NoDurableDir),
        (Some(dir), false) => {
            let dir = dir.clone();
            let fsync = settings.durable_fsync;
            let opened = tokio::task::spawn_blocking(move || DurableStore::open_with(&dir, fsync))
                .await
                .map_err(|e| DurableStoreError::Storage {
                    path: PathBuf::new(),
                    detail: e.to_string(),
                })??;
            Some(Arc::new(opened))
        }
    };
    let mut replicator = Replicator::new(
        transport.local().clone(),
        settings.config.clone(),
        rand::random(),
        now(),
    );
    if let Some(store) = &durable {
        let store = store.clone();
        let entries = tokio::task::spawn_blocking(move || store.load_all())
            .await
            .map_err(|e| DurableStoreError::Storage {
                path: PathBuf::new(),
                detail: e.to_string(),
            })??;
        for (key, envelope) in entries {
            replicator.load(&key, envelope);
        }
    }
    let inbound = transport.register(services::REPLICATOR, settings.service_queue_capacity)?;
    let (commands, queue) = mpsc::channel(settings.command_queue_capacity);
    let counters = Arc::new(ReplicatorCounters::default());
    let (writer, completions) = match durable {
        Some(store) => {
            let (writer, completions) =
                DurableWriter::start(store, settings.durable_queue_capacity);
            (Some(writer), Some(completions))
        }
        None => (None, None),
    };
    let driver = Driver {
        replicator,
        transport,
        writer,
        counters: counters.clone(),
        pending: HashMap::new(),
        subscribers: HashMap::new(),
        next_request: 1,
        next_subscriber: 1,
    };
    tokio::spawn(driver.run(queue, inbound, membership, completions));
    Ok(ReplicatorHandle {
        commands,
        capacity: settings.command_queue_capacity,
        counters,
        latencies: ReplicatorLatencies::default(),
    })
}

struct Driver<T: Transport> {
    replicator: Replicator,
    transport: Arc<T>,
    /// The durable writer, when durable keys are configured.
    writer: Option<DurableWriter>,
    counters: Arc<ReplicatorCounters>,
    /// Waiting requests.
    pending: HashMap<RequestId, oneshot::Sender<Response>>,
    subscribers: HashMap<SubscriberId, (String, mpsc::Sender<Change>)>,
    next_request: RequestId,
    next_subscriber: SubscriberId,
}

/// What the driver's loop does next. Made and consumed once per loop turn, never stored, so
/// the size of `Input` costs nothing worth a box (as for `Input` itself).
#[allow(clippy::large_enum_variant)]
enum Next {
    Step(Input),
    /// Nothing for the Replicator (a dropped message, a closed watch).
    Wait,
    /// Stop, then tell whoever asked.
    Stop(Option<oneshot::Sender<()>>),
}

/// The next completion of the durable writer, or never without one.
async fn completion(
    completions: &mut Option<mpsc::Receiver<DurableCompletion>>,
) -> Option<DurableCompletion> {
    match completions {
        Some(completions) => completions.recv().await,
        None => std::future::pending().await,
    }
}

impl<T: Transport> Driver<T> {
    async fn run(
        mut self,
        mut commands: mpsc::Receiver<DriverCommand>,
        mut inbound: mpsc::Receiver<tessera_cluster::transport::Inbound>,
        mut membership: watch::Receiver<ClusterSnapshot>,
        mut completions: Option<mpsc::Receiver<DurableCompletion>>,
    ) {
        let view = view_of(&membership.borrow_and_update());
        self.step(Input::Membership(view));
        // Once the cluster node stops, nothing changes any more: keep serving what is held.
        let mut membership_open = true;
        let mut held = InboundOrder::default();
        let stopped = loop {
            // Timers first: a busy command stream must not starve timeouts and gossip.
            if now() >= self.replicator.next_timer() {
                self.step(Input::Tick);
                continue;
            }
            let deadline = tokio::time::Instant::from_std(self.replicator.next_timer());
            held.take_queued(&mut inbound);
            let next = tokio::select! {
                command = commands.recv() => match command {
                    Some(DriverCommand::Request(command, reply)) => {
                        let id = self.next_request;
                        self.next_request += 1;
                        self.pending.insert(id, reply);
                        Next::Step(Input::Command { id, command })
                    }
                    Some(DriverCommand::Subscribe { key, changes, reply }) => {
                        let subscriber = self.next_subscriber;
                        self.next_subscriber += 1;
                        self.subscribers.insert(subscriber, (key.clone(), changes));
                        let id = self.next_request;
                        self.next_request += 1;
                        self.pending.insert(id, reply);
                        Next::Step(Input::Command { id, command: Command::Subscribe { key, subscriber } })
                    }
                    Some(DriverCommand::Stop(done)) => Next::Stop(Some(done)),
                    None => Next::Stop(None),
                },
                // Taking held messages uses the task's budget as receiving them would, so that
                // a steady stream of them still lets the worker run other tasks.
                _ = tokio::task::coop::consume_budget(), if !held.is_empty() => {
                    match held.next(&self.counters) {
                        Some((from, message)) => Next::Step(Input::Message { from, message }),
                        None => Next::Wait,
                    }
                }
                message = inbound.recv(), if held.has_room() => match message {
                    Some(message) => {
                        held.hold(message);
                        Next::Wait
                    }
                    // Whatever is held is not stepped any more: the transport has shut down.
                    None => Next::Stop(None),
                },
                done = completion(&mut completions) => match done {
                    Some(DurableCompletion { writes, result }) => {
                        Next::Step(self.stored(writes, result))
                    }
                    // The writer ended on its own (it only does when its queue closes).
                    None => {
                        completions = None;
                        Next::Wait
                    }
                },
                changed = membership.changed(), if membership_open => match changed {
                    Ok(()) => Next::Step(Input::Membership(view_of(&membership.borrow_and_update()))),
                    Err(_) => {
                        membership_open = false;
                        Next::Wait
                    }
                },
                _ = tokio::time::sleep_until(deadline) => Next::Step(Input::Tick),
            };
            match next {
                Next::Step(input) => self.step(input),
                Next::Wait => {}
                Next::Stop(done) => break done,
            }
        };
        // Let the writer finish what it took, so the store is closed when `stop` returns;
        // completions nobody will read are dropped first, so the writer never waits for them.
        drop(completions);
        if let Some(writer) = self.writer.take() {
            writer.stop().await;
        }
        drop(self);
        if let Some(done) = stopped {
            let _ = done.send(());
        }
    }

    /// Runs one input through the Replicator and carries out its outputs, and so on while
    /// carrying them out yields another input (durable writes refused at once).
    fn step(&mut self, input: Input) {
        let mut next = Some(input);
        while let Some(input) = next.take() {
            if matches!(input, Input::Tick) {
                self.drop_closed_subscriptions();
            }
            let time = Time {
                now: now(),
                wall_ms: wall_ms(),
            };
            let outputs = self.replicator.handle(time, input);
            self.counters
                .keys
                .store(self.replicator.key_count() as u64, Ordering::Relaxed);
            self.counters
                .bytes
                .store(self.replicator.held_bytes() as u64, Ordering::Relaxed);
            self.counters.set_refusals(&self.replicator.refusals());
            next = self.carry_out(outputs);
        }
    }

    /// Sends, replies and notifies at once, and hands the step's durable writes to the writer
    /// without waiting for them: what depends on them the Replicator holds until they are
    /// reported. Returns the report of writes refused at once, for the next step.
    fn carry_out(&mut self, outputs: Vec<Output>) -> Option<Input> {
        let mut writes = Vec::new();
        for output in outputs {
            match output {
                Output::Store {
                    write,
                    key,
                    envelope,
                } => writes.push(DurableWrite {
                    write,
                    key,
                    envelope,
                }),
                Output::Send { to, message } => {
                    let bytes = match message.encode() {
                        Ok(bytes) => Bytes::from(bytes),
                        Err(_) => {
                            self.counters.send_failures.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    };
                    if self
                        .transport
                        .send(&to, services::REPLICATOR, lane_of(&message), bytes)
                        .is_err()
                    {
                        self.counters.send_failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Output::Reply { id, response } => {
                    if let Some(reply) = self.pending.remove(&id) {
                        let _ = reply.send(response);
                    }
                }
                Output::Changed {
                    subscriber,
                    key,
                    value,
                } => self.notify(subscriber, key, value),
            }
        }
        if writes.is_empty() {
            return None;
        }
        let refused = match &self.writer {
            Some(writer) => writer.submit(writes).err(),
            // Unreachable: durable keys without a store are refused at start.
            None => Some((DurableWriteError::Stopped, writes)),
        };
        let (error, writes) = refused?;
        if matches!(error, DurableWriteError::QueueFull { .. }) {
            self.counters
                .durable_queue_full
                .fetch_add(1, Ordering::Relaxed);
        }
        let writes = writes.into_iter().map(|w| w.write).collect();
        Some(self.stored(writes, Err(error)))
    }

    /// Counts and logs the outcome of durable writes, and makes it the Replicator's input.
    fn stored(
        &mut self,
        writes: Vec<DurableWriteId>,
        result: Result<(), DurableWriteError>,
    ) -> Input {
        let count = writes.len() as u64;
        match &result {
            Ok(()) => {
                self.counters
                    .durable_commits
                    .fetch_add(1, Ordering::Relaxed);
                self.counters
                    .durable_writes
                    .fetch_add(count, Ordering::Relaxed);
            }
            Err(e) => {
                self.counters
                    .durable_failures
                    .fetch_add(count, Ordering::Relaxed);
                tracing::error!(writes = count, error = %e,
                    "durable store write failed; its acknowledgements are withheld");
            }
        }
        Input::Stored {
            writes,
            result: result.map_err(|e| e.to_string()),
        }
    }

    fn notify(&mut self, subscriber: SubscriberId, key: String, value: Option<ReplicatedValue>) {
        let Some((_, changes)) = self.subscribers.get(&subscriber) else {
            return;
        };
        match changes.try_send(Change { key, value }) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.counters
                    .dropped_notifications
                    .fetch_add(1, Ordering::Relaxed);
            }
            // Dropped subscriptions are swept on the next tick.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// Unsubscribes the subscriptions whose receivers were dropped, so that quiet keys do not
    /// keep them forever.
    fn drop_closed_subscriptions(&mut self) {
        let closed: Vec<(SubscriberId, String)> = self
            .subscribers
            .iter()
            .filter(|(_, (_, changes))| changes.is_closed())
            .map(|(id, (key, _))| (*id, key.clone()))
            .collect();
        for (subscriber, key) in closed {
            self.subscribers.remove(&subscriber);
            let time = Time {
                now: now(),
                wall_ms: wall_ms(),
            };
            // Unsubscribing emits only a reply to a request id nobody waits for.
            let _ = self.replicator.handle(
                time,
                Input::Command {
                    id: 0,
                    command: Command::Unsubscribe { key, subscriber },
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::DataEnvelope;
    use crate::replicator::ChunkKeyList;

    fn inbound(from: u64, message: &ReplicatorMessage) -> Inbound {
        Inbound {
            from: UniqueAddress::new(tessera_cluster::Address::new("127.0.0.1", 25520), from),
            service: services::REPLICATOR,
            payload: Bytes::from(message.encode().expect("encodes")),
            reply: None,
        }
    }

    fn status(n: u16) -> ReplicatorMessage {
        ReplicatorMessage::Status {
            chunks: vec![(n, 0)],
        }
    }

    fn read(op: u64) -> ReplicatorMessage {
        ReplicatorMessage::Read {
            op,
            incarnation: 1,
            key: "k".into(),
        }
    }

    /// A quorum message queued behind bulk ones is stepped first; each kind keeps its order,
    /// the bulk held is bounded (the rest stays in the transport's queue), and a message that
    /// does not decode is counted and skipped.
    #[test]
    fn quorum_messages_are_stepped_before_the_bulk_ones_queued_ahead_of_them() {
        let counters = ReplicatorCounters::default();
        let (tx, mut rx) = mpsc::channel(MAX_HELD_BULK + 16);
        let beyond = MAX_HELD_BULK as u16 + 4;
        for n in 0..beyond {
            tx.try_send(inbound(1, &status(n))).unwrap();
            if n == 2 || n == 5 {
                tx.try_send(inbound(2, &read(u64::from(n)))).unwrap();
            }
            if n == 7 {
                tx.try_send(Inbound {
                    payload: Bytes::from_static(b"\xff"),
                    ..inbound(4, &read(0))
                })
                .unwrap();
            }
        }
        tx.try_send(inbound(3, &read(99))).unwrap();
        let mut held = InboundOrder::default();
        held.take_queued(&mut rx);
        assert!(!held.has_room(), "bulk held up to its bound");
        let first: Vec<ReplicatorMessage> =
            (0..2).map(|_| held.next(&counters).unwrap().1).collect();
        assert_eq!(first, [read(2), read(5)]);
        let mut bulk = Vec::new();
        while let Some((_, message)) = held.next(&counters) {
            bulk.push(message);
        }
        let expected: Vec<ReplicatorMessage> = (0..MAX_HELD_BULK as u16 - 1).map(status).collect();
        assert_eq!(
            bulk, expected,
            "the malformed one took a place and was skipped"
        );
        assert_eq!(counters.decode_errors.load(Ordering::Relaxed), 1);
        // The rest, quorum first again.
        held.take_queued(&mut rx);
        assert_eq!(held.next(&counters).unwrap().1, read(99));
        for n in MAX_HELD_BULK as u16 - 1..beyond {
            assert_eq!(held.next(&counters).unwrap().1, status(n));
        }
        assert!(held.next(&counters).is_none());
    }

    #[test]
    fn quorum_traffic_takes_the_quorum_lane_and_anti_entropy_the_bulk_lane() {
        let (op, incarnation, key) = (1, 2, "k".to_string());
        let quorum = [
            ReplicatorMessage::Read {
                op,
                incarnation,
                key: key.clone(),
            },
            ReplicatorMessage::ReadResult {
                op,
                incarnation,
                key: key.clone(),
                envelope: None,
            },
            ReplicatorMessage::Write {
                op,
                incarnation,
                key: key.clone(),
                envelope: DataEnvelope::deleted(),
            },
            ReplicatorMessage::WriteAck { op, incarnation },
            ReplicatorMessage::WriteNack {
                op,
                incarnation,
                reason: String::new(),
            },
        ];
        let bulk = [
            ReplicatorMessage::Deltas {
                incarnation,
                deltas: Vec::new(),
            },
            ReplicatorMessage::DeltaGap {
                keys: vec![key.clone()],
            },
            ReplicatorMessage::Status { chunks: Vec::new() },
            ReplicatorMessage::ChunkKeys {
                chunks: vec![ChunkKeyList {
                    chunk: 0,
                    keys: Vec::new(),
                }],
                more: false,
            },
            ReplicatorMessage::Gossip {
                entries: vec![(key, DataEnvelope::deleted())],
                send_back: Vec::new(),
                reply_expected: false,
                more: false,
            },
        ];
        // The receiver tells the two apart from a message's first bytes, undecoded.
        for message in &quorum {
            assert_eq!(lane_of(message), Lane::Quorum, "{message:?}");
            assert!(is_quorum_message(&message.encode().unwrap()), "{message:?}");
        }
        for message in &bulk {
            assert_eq!(lane_of(message), Lane::Bulk, "{message:?}");
            assert!(
                !is_quorum_message(&message.encode().unwrap()),
                "{message:?}"
            );
        }
        assert!(!is_quorum_message(&[]));
        assert!(!is_quorum_message(&[crate::codec::DATA_FORMAT_VERSION]));
        assert!(!is_quorum_message(&[0xff, 0]));
    }
}
