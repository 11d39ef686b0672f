//! Shared by the entity tests: the public in-memory journal and snapshot store behind gates
//! (to hold a write or a save in flight) and injected failures, and a small test entity,
//! `tally`.
#![allow(dead_code)]

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tessera_entities::{Effect, EntityConfig, EntityHost, EntityLifecycle, EntityType};
use tessera_journal::{
    AtomicWrite, EventEnvelope, Journal, JournalError, JournalStream, NewEvent, PersistentRepr,
    QueryMode,
};
use tessera_snapshot::{
    Manifest, MemorySnapshotStore, Snapshot, SnapshotError, SnapshotMetadata,
    SnapshotSelectionCriteria, SnapshotStore,
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

/// One append as the journal saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendRecord {
    pub persistence_id: String,
    pub writer_id: String,
    pub first: u64,
    pub count: usize,
}

/// The public in-memory journal (which keeps the RocksDB journal's append rules), with a
/// record of appends and replays, a gate on appends and switches that make appends, replays
/// or confirmations fail.
pub struct MemoryJournal {
    events: tessera_journal::MemoryJournal,
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
            events: tessera_journal::MemoryJournal::new(),
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
        self.events
            .events(pid)
            .iter()
            .map(|event| event.sequence_nr)
            .collect()
    }

    /// Stores an event directly (e.g. written by an older release), continuing its log.
    pub fn insert(&self, pid: &str, sequence_nr: u64, manifest: Manifest, payload: Vec<u8>) {
        let write = AtomicWrite {
            persistence_id: pid.into(),
            writer_id: "test".into(),
            events: vec![NewEvent {
                sequence_nr,
                timestamp_ms: 0,
                manifest,
                payload: payload.into(),
                tags: Vec::new(),
            }],
        };
        self.events
            .append(write)
            .now_or_never()
            .expect("the in-memory journal answers at once")
            .expect("an inserted event continues its log");
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
        let record = AppendRecord {
            persistence_id: write.persistence_id.clone(),
            writer_id: write.writer_id.clone(),
            first: write.events.first().map_or(0, |e| e.sequence_nr),
            count: write.events.len(),
        };
        self.events
            .append(write)
            .now_or_never()
            .expect("the in-memory journal answers at once")?;
        self.appends.lock().unwrap().push(record);
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
        self.0
            .events
            .replay(persistence_id, from_sequence_nr, to_sequence_nr, max)
    }

    fn highest_sequence_nr(
        &self,
        persistence_id: &str,
    ) -> BoxFuture<'static, Result<u64, JournalError>> {
        self.0.events.highest_sequence_nr(persistence_id)
    }

    fn delete_to(
        &self,
        persistence_id: &str,
        to_sequence_nr: u64,
    ) -> BoxFuture<'static, Result<(), JournalError>> {
        self.0.events.delete_to(persistence_id, to_sequence_nr)
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
        tag: &str,
        after_offset: u64,
        mode: QueryMode,
    ) -> JournalStream<EventEnvelope> {
        self.0.events.events_by_tag(tag, after_offset, mode)
    }

    fn persistence_ids(&self, mode: QueryMode) -> JournalStream<String> {
        self.0.events.persistence_ids(mode)
    }
}

/// The public in-memory snapshot store with a gate on saves and a switch that corrupts loads.
pub struct MemorySnapshots {
    snapshots: MemorySnapshotStore,
    pub save_gate: Gate,
    pub fail_loads: AtomicBool,
}

impl MemorySnapshots {
    pub fn new() -> Arc<Self> {
        Arc::new(MemorySnapshots {
            snapshots: MemorySnapshotStore::new(),
            save_gate: Gate::open(),
            fail_loads: AtomicBool::new(false),
        })
    }

    /// The sequence numbers of a log's snapshots.
    pub fn sequence_nrs(&self, pid: &str) -> Vec<u64> {
        self.snapshots.sequence_nrs(pid)
    }

    /// Stores a snapshot directly.
    pub fn insert(&self, pid: &str, sequence_nr: u64, manifest: Manifest, payload: Vec<u8>) {
        let metadata = SnapshotMetadata {
            persistence_id: pid.to_string(),
            sequence_nr,
            timestamp_ms: 0,
        };
        self.snapshots
            .save(metadata, manifest, payload.into())
            .now_or_never()
            .expect("the in-memory snapshot store answers at once")
            .expect("the in-memory snapshot store takes every snapshot");
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
            store.snapshots.save(metadata, manifest, payload).await
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
        self.0.snapshots.load(persistence_id, criteria)
    }

    fn delete(
        &self,
        persistence_id: &str,
        sequence_nr: u64,
    ) -> BoxFuture<'static, Result<(), SnapshotError>> {
        self.0.snapshots.delete(persistence_id, sequence_nr)
    }

    fn delete_matching(
        &self,
        persistence_id: &str,
        criteria: SnapshotSelectionCriteria,
    ) -> BoxFuture<'static, Result<(), SnapshotError>> {
        self.0.snapshots.delete_matching(persistence_id, criteria)
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
