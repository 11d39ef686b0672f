//! Shared by the entity tests: an in-memory journal and snapshot store with gates (to hold a
//! write or a save in flight) and injected failures, and a small test entity, `tally`.
#![allow(dead_code)]

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tessera_entities::{Effect, EntityConfig, EntityHost, EntityLifecycle, EntityType};
use tessera_journal::{
    AtomicWrite, EventEnvelope, Journal, JournalError, JournalStream, PersistentRepr, QueryMode,
};
use tessera_snapshot::{
    Manifest, Snapshot, SnapshotError, SnapshotMetadata, SnapshotSelectionCriteria, SnapshotStore,
};
use tokio::sync::watch;

/// A gate that futures wait at while it is closed.
#[derive(Clone)]
pub struct Gate(Arc<watch::Sender<bool>>);

impl Gate {
    pub fn open() -> Self {
        Gate(Arc::new(watch::channel(true).0))
    }
    pub fn close(&self) {
        self.0.send_replace(false);
    }
    pub fn release(&self) {
        self.0.send_replace(true);
    }
    pub fn wait(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.0.subscribe();
        async move {
            let _ = rx.wait_for(|open| *open).await;
        }
    }
}

#[derive(Default)]
struct Log {
    events: BTreeMap<u64, PersistentRepr>,
    highest: u64,
}

/// One append as the journal saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendRecord {
    pub persistence_id: String,
    pub writer_id: String,
    pub first: u64,
    pub count: usize,
}

/// An in-memory [`Journal`] with the RocksDB journal's append rules, plus a gate on appends
/// and switches that make appends or replays fail.
pub struct MemoryJournal {
    logs: Mutex<HashMap<String, Log>>,
    appends: Mutex<Vec<AppendRecord>>,
    replays: Mutex<Vec<(String, u64)>>,
    pub append_gate: Gate,
    pub fail_appends: AtomicBool,
    /// Whether the journal asks entities to confirm reads (as the replicated one does).
    pub confirm_reads: AtomicBool,
    /// Confirmations fail (the entity lost its log to another writer).
    pub fail_confirms: AtomicBool,
    /// Fails this many appends more, then none.
    pub fail_next_appends: std::sync::atomic::AtomicU32,
    pub fail_replays: AtomicBool,
    /// Appends fail with `QueueFull` (nothing written).
    pub queue_full: AtomicBool,
}

impl Default for MemoryJournal {
    fn default() -> Self {
        MemoryJournal {
            logs: Mutex::default(),
            appends: Mutex::default(),
            replays: Mutex::default(),
            append_gate: Gate::open(),
            fail_appends: AtomicBool::new(false),
            fail_next_appends: std::sync::atomic::AtomicU32::new(0),
            confirm_reads: AtomicBool::new(false),
            fail_confirms: AtomicBool::new(false),
            fail_replays: AtomicBool::new(false),
            queue_full: AtomicBool::new(false),
        }
    }
}

impl MemoryJournal {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Every append so far, in commit order.
    pub fn appends(&self) -> Vec<AppendRecord> {
        self.appends.lock().unwrap().clone()
    }

    /// (persistence id, from sequence nr) of every replay so far.
    pub fn replays(&self) -> Vec<(String, u64)> {
        self.replays.lock().unwrap().clone()
    }

    /// The stored (not deleted) sequence numbers of a log.
    pub fn sequence_nrs(&self, pid: &str) -> Vec<u64> {
        let logs = self.logs.lock().unwrap();
        logs.get(pid)
            .map(|log| log.events.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Stores events directly (e.g. written by an older release).
    pub fn insert(&self, pid: &str, sequence_nr: u64, manifest: Manifest, payload: Vec<u8>) {
        let mut logs = self.logs.lock().unwrap();
        let log = logs.entry(pid.to_string()).or_default();
        log.highest = log.highest.max(sequence_nr);
        log.events.insert(
            sequence_nr,
            PersistentRepr {
                persistence_id: pid.into(),
                sequence_nr,
                writer_id: "test".into(),
                timestamp_ms: 0,
                manifest,
                payload: payload.into(),
            },
        );
    }

    /// Asserts that the writers of each log never interleave: once a newer incarnation wrote,
    /// an older one never writes again (at most one live instance per entity).
    pub fn assert_one_writer_at_a_time(&self) {
        let mut retired: HashMap<String, Vec<String>> = HashMap::new();
        let mut current: HashMap<String, String> = HashMap::new();
        for append in self.appends() {
            let seen = retired.entry(append.persistence_id.clone()).or_default();
            assert!(
                !seen.contains(&append.writer_id),
                "writer {} of {} wrote again after a newer incarnation: {:?}",
                append.writer_id,
                append.persistence_id,
                self.appends()
            );
            if let Some(previous) =
                current.insert(append.persistence_id.clone(), append.writer_id.clone())
                && previous != append.writer_id
            {
                seen.push(previous);
            }
        }
    }

    fn apply(&self, write: AtomicWrite) -> Result<(), JournalError> {
        let mut logs = self.logs.lock().unwrap();
        let log = logs.entry(write.persistence_id.clone()).or_default();
        let first = write.events.first().map(|e| e.sequence_nr).unwrap_or(0);
        if first != log.highest + 1 {
            return Err(JournalError::SequenceMismatch {
                persistence_id: write.persistence_id,
                expected: log.highest + 1,
                got: first,
            });
        }
        for event in &write.events {
            log.events.insert(
                event.sequence_nr,
                PersistentRepr {
                    persistence_id: write.persistence_id.as_str().into(),
                    sequence_nr: event.sequence_nr,
                    writer_id: write.writer_id.as_str().into(),
                    timestamp_ms: event.timestamp_ms,
                    manifest: event.manifest.clone(),
                    payload: event.payload.clone(),
                },
            );
            log.highest = event.sequence_nr;
        }
        self.appends.lock().unwrap().push(AppendRecord {
            persistence_id: write.persistence_id.clone(),
            writer_id: write.writer_id.clone(),
            first,
            count: write.events.len(),
        });
        Ok(())
    }
}

/// Lets a test keep an `Arc<MemoryJournal>` and hand the host an `Arc<dyn Journal>`.
pub struct SharedJournal(pub Arc<MemoryJournal>);

impl Journal for SharedJournal {
    fn confirms_reads(&self) -> bool {
        self.0.confirm_reads.load(Ordering::SeqCst)
    }

    fn confirm_writer(
        &self,
        persistence_id: &str,
        _highest: u64,
    ) -> BoxFuture<'static, Result<(), JournalError>> {
        let fail = self.0.fail_confirms.load(Ordering::SeqCst);
        let persistence_id = persistence_id.to_string();
        Box::pin(async move {
            if fail {
                Err(JournalError::Fenced {
                    persistence_id,
                    reason: "injected: another node took the log over".into(),
                })
            } else {
                Ok(())
            }
        })
    }

    fn append(&self, write: AtomicWrite) -> BoxFuture<'static, Result<(), JournalError>> {
        let journal = self.0.clone();
        async move {
            journal.append_gate.wait().await;
            if journal.queue_full.load(Ordering::SeqCst) {
                return Err(JournalError::QueueFull { capacity: 1 });
            }
            let fail_next = journal
                .fail_next_appends
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if fail_next || journal.fail_appends.load(Ordering::SeqCst) {
                return Err(JournalError::Storage("injected append failure".into()));
            }
            journal.apply(write)
        }
        .boxed()
    }

    fn replay(
        &self,
        persistence_id: &str,
        from_sequence_nr: u64,
        to_sequence_nr: u64,
        max: u64,
    ) -> JournalStream<PersistentRepr> {
        self.0
            .replays
            .lock()
            .unwrap()
            .push((persistence_id.to_string(), from_sequence_nr));
        if self.0.fail_replays.load(Ordering::SeqCst) {
            return futures::stream::iter(vec![Err(JournalError::Corrupt {
                persistence_id: persistence_id.to_string(),
                sequence_nr: from_sequence_nr,
                detail: "injected replay failure".into(),
            })])
            .boxed();
        }
        let logs = self.0.logs.lock().unwrap();
        let events: Vec<Result<PersistentRepr, JournalError>> = logs
            .get(persistence_id)
            .map(|log| {
                log.events
                    .range(from_sequence_nr..=to_sequence_nr)
                    .take(max.min(usize::MAX as u64) as usize)
                    .map(|(_, e)| Ok(e.clone()))
                    .collect()
            })
            .unwrap_or_default();
        futures::stream::iter(events).boxed()
    }

    fn highest_sequence_nr(
        &self,
        persistence_id: &str,
    ) -> BoxFuture<'static, Result<u64, JournalError>> {
        let logs = self.0.logs.lock().unwrap();
        let highest = logs.get(persistence_id).map(|l| l.highest).unwrap_or(0);
        futures::future::ready(Ok(highest)).boxed()
    }

    fn delete_to(
        &self,
        persistence_id: &str,
        to_sequence_nr: u64,
    ) -> BoxFuture<'static, Result<(), JournalError>> {
        let mut logs = self.0.logs.lock().unwrap();
        if let Some(log) = logs.get_mut(persistence_id) {
            log.events.retain(|seq, _| *seq > to_sequence_nr);
        }
        futures::future::ready(Ok(())).boxed()
    }

    fn events_by_persistence_id(
        &self,
        persistence_id: &str,
        from_sequence_nr: u64,
        _mode: QueryMode,
    ) -> JournalStream<PersistentRepr> {
        self.replay(persistence_id, from_sequence_nr, u64::MAX, u64::MAX)
    }

    fn events_by_tag(
        &self,
        _tag: &str,
        _after_offset: u64,
        _mode: QueryMode,
    ) -> JournalStream<EventEnvelope> {
        futures::stream::empty().boxed()
    }

    fn persistence_ids(&self, _mode: QueryMode) -> JournalStream<String> {
        let ids: Vec<_> = self
            .0
            .logs
            .lock()
            .unwrap()
            .keys()
            .cloned()
            .map(Ok)
            .collect();
        futures::stream::iter(ids).boxed()
    }
}

/// An in-memory [`SnapshotStore`] with a gate on saves and a switch that corrupts loads.
pub struct MemorySnapshots {
    snapshots: Mutex<BTreeMap<(String, u64), Snapshot>>,
    pub save_gate: Gate,
    pub fail_loads: AtomicBool,
}

impl MemorySnapshots {
    pub fn new() -> Arc<Self> {
        Arc::new(MemorySnapshots {
            snapshots: Mutex::default(),
            save_gate: Gate::open(),
            fail_loads: AtomicBool::new(false),
        })
    }

    /// The sequence numbers of a log's snapshots.
    pub fn sequence_nrs(&self, pid: &str) -> Vec<u64> {
        self.snapshots
            .lock()
            .unwrap()
            .keys()
            .filter(|(p, _)| p == pid)
            .map(|(_, s)| *s)
            .collect()
    }

    /// Stores a snapshot directly.
    pub fn insert(&self, pid: &str, sequence_nr: u64, manifest: Manifest, payload: Vec<u8>) {
        self.snapshots.lock().unwrap().insert(
            (pid.to_string(), sequence_nr),
            Snapshot {
                metadata: SnapshotMetadata {
                    persistence_id: pid.to_string(),
                    sequence_nr,
                    timestamp_ms: 0,
                },
                manifest,
                payload: payload.into(),
            },
        );
    }
}

pub struct SharedSnapshots(pub Arc<MemorySnapshots>);

impl SnapshotStore for SharedSnapshots {
    fn save(
        &self,
        metadata: SnapshotMetadata,
        manifest: Manifest,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<(), SnapshotError>> {
        let store = self.0.clone();
        async move {
            store.save_gate.wait().await;
            store.snapshots.lock().unwrap().insert(
                (metadata.persistence_id.clone(), metadata.sequence_nr),
                Snapshot {
                    metadata,
                    manifest,
                    payload,
                },
            );
            Ok(())
        }
        .boxed()
    }

    fn load(
        &self,
        persistence_id: &str,
        criteria: SnapshotSelectionCriteria,
    ) -> BoxFuture<'static, Result<Option<Snapshot>, SnapshotError>> {
        if self.0.fail_loads.load(Ordering::SeqCst) {
            return futures::future::ready(Err(SnapshotError::Corrupt {
                persistence_id: persistence_id.to_string(),
                sequence_nr: 0,
                detail: "injected load failure".into(),
            }))
            .boxed();
        }
        let found = self
            .0
            .snapshots
            .lock()
            .unwrap()
            .values()
            .filter(|s| {
                s.metadata.persistence_id == persistence_id
                    && criteria.matches(s.metadata.sequence_nr, s.metadata.timestamp_ms)
            })
            .max_by_key(|s| s.metadata.sequence_nr)
            .cloned();
        futures::future::ready(Ok(found)).boxed()
    }

    fn delete(
        &self,
        persistence_id: &str,
        sequence_nr: u64,
    ) -> BoxFuture<'static, Result<(), SnapshotError>> {
        self.0
            .snapshots
            .lock()
            .unwrap()
            .remove(&(persistence_id.to_string(), sequence_nr));
        futures::future::ready(Ok(())).boxed()
    }

    fn delete_matching(
        &self,
        persistence_id: &str,
        criteria: SnapshotSelectionCriteria,
    ) -> BoxFuture<'static, Result<(), SnapshotError>> {
        self.0.snapshots.lock().unwrap().retain(|(pid, _), s| {
            !(pid == persistence_id
                && criteria.matches(s.metadata.sequence_nr, s.metadata.timestamp_ms))
        });
        futures::future::ready(Ok(())).boxed()
    }
}

// ---- the test entity ------------------------------------------------------------------------

/// `tally`: a non-negative running total.
pub struct Tally;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TallyCommand {
    /// Persists `Added(n)`, replies the new total.
    Add(u64),
    /// Persists one event per amount, atomically.
    AddAll(Vec<u64>),
    /// Persists `Subtracted(n)`, or is rejected when the total is lower.
    Sub(u64),
    /// Replies the total.
    Get,
    /// Replies the total and stops the entity.
    Stop,
    /// Persists `Added(n)`, replies and stops.
    AddAndStop(u64),
    /// Panics in the handler, after blocking its thread for `blocking_ms` (so that commands
    /// sent meanwhile queue behind it).
    Panic { blocking_ms: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TallyEvent {
    Added(u64),
    Subtracted(u64),
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TallyState {
    pub total: u64,
    pub events: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TooLow {
    pub total: u64,
    pub requested: u64,
}

impl std::fmt::Display for TooLow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "total {} is lower than {}", self.total, self.requested)
    }
}

impl EntityType for Tally {
    type Command = TallyCommand;
    type Event = TallyEvent;
    type State = TallyState;
    type Reply = u64;
    type Rejection = TooLow;

    const TYPE_NAME: &'static str = "tally";
    const EVENT_MANIFEST: &'static str = "tally.Event";
    const STATE_MANIFEST: &'static str = "tally.State";

    fn initial_state(&self, _entity_id: &str) -> TallyState {
        TallyState::default()
    }

    fn handle_command(&self, state: &TallyState, command: TallyCommand) -> Effect<Self> {
        match command {
            TallyCommand::Add(n) => {
                Effect::persist(TallyEvent::Added(n)).then_reply(|s: &TallyState| s.total)
            }
            TallyCommand::AddAll(ns) => {
                Effect::persist_all(ns.into_iter().map(TallyEvent::Added).collect())
                    .then_reply(|s: &TallyState| s.total)
            }
            TallyCommand::Sub(n) if n > state.total => Effect::reject(TooLow {
                total: state.total,
                requested: n,
            }),
            TallyCommand::Sub(n) => {
                Effect::persist(TallyEvent::Subtracted(n)).then_reply(|s: &TallyState| s.total)
            }
            TallyCommand::Get => Effect::reply(state.total),
            TallyCommand::Stop => Effect::stop(state.total),
            TallyCommand::AddAndStop(n) => {
                Effect::persist(TallyEvent::Added(n)).then_reply_and_stop(|s: &TallyState| s.total)
            }
            TallyCommand::Panic { blocking_ms } => {
                std::thread::sleep(std::time::Duration::from_millis(blocking_ms));
                panic!("tally handler asked to panic")
            }
        }
    }

    fn apply_event(&self, state: &mut TallyState, event: &TallyEvent) {
        match event {
            TallyEvent::Added(n) => state.total += n,
            TallyEvent::Subtracted(n) => state.total -= n,
        }
        state.events += 1;
    }
}

/// The persistence id of tally `id`.
pub fn pid(id: &str) -> String {
    format!("tally|{id}")
}

/// Stores and a host on them.
pub struct Fixture {
    pub journal: Arc<MemoryJournal>,
    pub snapshots: Arc<MemorySnapshots>,
    hosts: std::sync::atomic::AtomicU64,
}

impl Fixture {
    pub fn new() -> Self {
        Fixture {
            journal: MemoryJournal::new(),
            snapshots: MemorySnapshots::new(),
            hosts: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A host of `tally` on the fixture's stores (a restart is a new host on the same stores).
    /// Each host gets its own node id, as each node incarnation does.
    pub fn host(&self, config: EntityConfig) -> EntityHost<Tally> {
        let n = self.hosts.fetch_add(1, Ordering::SeqCst);
        let config = EntityConfig {
            node_id: format!("host{n}"),
            ..config
        };
        EntityHost::start(
            Tally,
            Arc::new(SharedJournal(self.journal.clone())),
            Arc::new(SharedSnapshots(self.snapshots.clone())),
            config,
        )
        .expect("valid config")
    }

    /// [`Fixture::host`] whose lifecycle events go to `recorder`.
    pub fn host_recorded(&self, config: EntityConfig, recorder: &Recorder) -> EntityHost<Tally> {
        let n = self.hosts.fetch_add(1, Ordering::SeqCst);
        let config = EntityConfig {
            node_id: format!("host{n}"),
            ..config
        };
        let events = recorder.0.clone();
        EntityHost::start_with_listener(
            Tally,
            Arc::new(SharedJournal(self.journal.clone())),
            Arc::new(SharedSnapshots(self.snapshots.clone())),
            config,
            move |event| events.lock().unwrap().push(event),
        )
        .expect("valid config")
    }
}

/// Keeps every lifecycle event a host reports, in order.
#[derive(Clone, Default)]
pub struct Recorder(Arc<Mutex<Vec<EntityLifecycle>>>);

impl Recorder {
    pub fn events(&self) -> Vec<EntityLifecycle> {
        self.0.lock().unwrap().clone()
    }

    /// The events of entity `id`, in order.
    pub fn events_of(&self, id: &str) -> Vec<EntityLifecycle> {
        self.events()
            .into_iter()
            .filter(|event| match event {
                EntityLifecycle::Started { id: of } | EntityLifecycle::Stopped { id: of, .. } => {
                    of.as_str() == id
                }
            })
            .collect()
    }
}

/// Long enough for anything in these tests to happen; only reached when something hangs.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// Waits until `check` holds, failing the test after [`PATIENCE`].
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Test defaults: no passivation, snapshots off, a short ask timeout.
pub fn config() -> EntityConfig {
    EntityConfig {
        snapshot_every: 0,
        passivate_after: None,
        ask_timeout: Duration::from_secs(10),
        host_partitions: 4,
        ..EntityConfig::default()
    }
}
