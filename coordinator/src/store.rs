//! Where the coordinator keeps its state (`state_store_mode`):
//!
//! - [`DdataStore`]: the whole state in one Distributed Data register per entity type, written
//!   with a majority plus three and read with a majority plus five (Akka's
//!   WriteMajorityPlus/ReadMajorityPlus), so a read after a membership change still overlaps
//!   the last write (akka #28856). Not durable: a full cluster stop forgets it, as in Akka.
//! - [`JournalStore`]: the state's events in the replicated journal, with a snapshot every
//!   1,000 events. The journal fences its writer, so a coordinator that another one took over
//!   from can never write again: its next write fails and it stops.
//!
//! The coordinator writes one change at a time and acts on it only after the store answered.

use crate::state::{CoordinatorState, RegionId, StateEvent};
use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tessera_ddata::consistency::{ReadConsistency, WriteConsistency};
use tessera_ddata::lww_register::LWWRegister;
use tessera_ddata::node::ReplicatorHandle;
use tessera_ddata::replicator::{GetResult, UpdateResult};
use tessera_ddata::value::ReplicatedValue;
use tessera_journal::{AtomicWrite, Journal, JournalError, Manifest, NewEvent};
use tessera_snapshot::{SnapshotMetadata, SnapshotSelectionCriteria, SnapshotStore};

/// Why a load or a write did not succeed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Not now (no quorum, a timeout): try again.
    #[error("the coordinator's state store is unavailable: {0}")]
    Unavailable(String),
    /// Never: another coordinator owns the state, or the stored state cannot be read.
    #[error("the coordinator's state store refuses this coordinator: {0}")]
    Fatal(String),
}

/// A coordinator's state store, for one entity type.
pub trait CoordinatorStore: Send + Sync + 'static {
    /// Reads the state (an empty one when nothing is stored).
    fn load(&self) -> BoxFuture<'static, Result<CoordinatorState, StoreError>>;

    /// Stores `events` (atomically, in order), whose application turned the state into
    /// `after`.
    fn write(
        &self,
        events: Vec<StateEvent>,
        after: CoordinatorState,
    ) -> BoxFuture<'static, Result<(), StoreError>>;
}

/// Makes the store of each entity type.
pub trait CoordinatorStoreFactory: Send + Sync + 'static {
    fn store(&self, type_name: &str, remember_entities: bool) -> Arc<dyn CoordinatorStore>;
}

/// The stored form of the state: plain lists, readable as JSON in `GET /ddata`.
#[derive(Serialize, Deserialize)]
pub(crate) struct StoredState {
    version: u32,
    remember_entities: bool,
    regions: Vec<(RegionId, Vec<u32>)>,
    proxies: Vec<RegionId>,
    unallocated: Vec<u32>,
}

const STORED_STATE_VERSION: u32 = 1;

pub(crate) fn to_stored(state: &CoordinatorState) -> StoredState {
    StoredState {
        version: STORED_STATE_VERSION,
        remember_entities: state.remember_entities(),
        regions: state
            .regions()
            .iter()
            .map(|(r, shards)| (r.clone(), shards.iter().map(|s| s.0).collect()))
            .collect(),
        proxies: state.proxies().iter().cloned().collect(),
        unallocated: state.unallocated().iter().map(|s| s.0).collect(),
    }
}

pub(crate) fn from_stored(stored: StoredState) -> Result<CoordinatorState, StoreError> {
    if stored.version != STORED_STATE_VERSION {
        return Err(StoreError::Fatal(format!(
            "stored coordinator state has version {} (expected {STORED_STATE_VERSION})",
            stored.version
        )));
    }
    let mut state = CoordinatorState::new(stored.remember_entities);
    let invalid = |e: crate::state::StateError| StoreError::Fatal(format!("stored state: {e}"));
    for (region, shards) in stored.regions {
        state
            .apply(&StateEvent::RegionRegistered {
                region: region.clone(),
            })
            .map_err(invalid)?;
        for shard in shards {
            state
                .apply(&StateEvent::ShardHomeAllocated {
                    shard: crate::ShardId(shard),
                    region: region.clone(),
                })
                .map_err(invalid)?;
        }
    }
    for proxy in stored.proxies {
        state
            .apply(&StateEvent::ProxyRegistered { proxy })
            .map_err(invalid)?;
    }
    state.set_unallocated(stored.unallocated.into_iter().map(crate::ShardId));
    Ok(state)
}

/// The coordinator's state in Distributed Data.
pub struct DdataStore {
    replicator: ReplicatorHandle,
    key: String,
    remember_entities: bool,
    timeout: Duration,
}

/// Additional members a state write reaches beyond a majority (Akka's default).
pub const WRITE_MAJORITY_PLUS: usize = 3;
/// Additional members a state read asks beyond a majority (Akka's default).
pub const READ_MAJORITY_PLUS: usize = 5;
/// Below this many members, reads and writes reach every member (Akka's majority-min-cap).
pub const MAJORITY_MIN_CAP: usize = 5;

impl DdataStore {
    pub fn new(replicator: ReplicatorHandle, type_name: &str, remember_entities: bool) -> Self {
        DdataStore {
            replicator,
            key: ddata_key(type_name),
            remember_entities,
            timeout: Duration::from_secs(5),
        }
    }
}

/// The Distributed Data key holding a type's coordinator state.
pub fn ddata_key(type_name: &str) -> String {
    format!("sharding-{type_name}-coordinator-state")
}

impl CoordinatorStore for DdataStore {
    fn load(&self) -> BoxFuture<'static, Result<CoordinatorState, StoreError>> {
        let replicator = self.replicator.clone();
        let key = self.key.clone();
        let remember = self.remember_entities;
        let timeout = self.timeout;
        Box::pin(async move {
            let consistency = ReadConsistency::MajorityPlus {
                additional: READ_MAJORITY_PLUS,
                min_cap: MAJORITY_MIN_CAP,
            };
            let result = replicator
                .get(&key, consistency, timeout)
                .await
                .map_err(|e| StoreError::Unavailable(e.to_string()))?;
            match result {
                GetResult::Found(ReplicatedValue::LWWRegister(register)) => {
                    let stored: StoredState = serde_json::from_str(register.value())
                        .map_err(|e| StoreError::Fatal(format!("key {key}: {e}")))?;
                    let mut state = from_stored(stored)?;
                    state.set_remember_entities(remember);
                    Ok(state)
                }
                GetResult::Found(other) => Err(StoreError::Fatal(format!(
                    "key {key} holds a {:?}, not a register",
                    other.kind()
                ))),
                GetResult::NotFound | GetResult::Deleted => Ok(CoordinatorState::new(remember)),
                GetResult::Timeout => Err(StoreError::Unavailable(format!(
                    "reading {key}: too few replicas answered in {timeout:?}"
                ))),
                GetResult::Failed(reason) => Err(StoreError::Unavailable(reason)),
            }
        })
    }

    fn write(
        &self,
        _events: Vec<StateEvent>,
        after: CoordinatorState,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let replicator = self.replicator.clone();
        let key = self.key.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            let json = serde_json::to_string(&to_stored(&after))
                .map_err(|e| StoreError::Fatal(e.to_string()))?;
            let consistency = WriteConsistency::MajorityPlus {
                additional: WRITE_MAJORITY_PLUS,
                min_cap: MAJORITY_MIN_CAP,
            };
            let result = replicator
                .update(&key, consistency, timeout, move |current, context| {
                    let mut register = match current {
                        Some(ReplicatedValue::LWWRegister(register)) => register,
                        None => LWWRegister::new(context.self_node.clone(), String::new(), 0),
                        Some(other) => {
                            return Err(format!("holds a {:?}, not a register", other.kind()));
                        }
                    };
                    // Later than whatever is there, whoever wrote it.
                    let timestamp = context
                        .now_wall_ms
                        .max(register.timestamp_ms().saturating_add(1));
                    register.set(context.self_node, json, timestamp);
                    Ok(ReplicatedValue::LWWRegister(register))
                })
                .await
                .map_err(|e| StoreError::Unavailable(e.to_string()))?;
            match result {
                UpdateResult::Success => Ok(()),
                // Written here, maybe not on enough replicas: writing the same state again
                // is harmless, so the coordinator retries.
                UpdateResult::Timeout => Err(StoreError::Unavailable(format!(
                    "writing {key}: too few replicas acknowledged in {timeout:?}"
                ))),
                UpdateResult::Deleted => Err(StoreError::Fatal(format!("key {key} was deleted"))),
                UpdateResult::Invalid(reason) => {
                    Err(StoreError::Fatal(format!("key {key}: {reason}")))
                }
                // The replica is full: retried, it may pass once an operator raised the limit.
                UpdateResult::LimitReached(refused) => {
                    Err(StoreError::Unavailable(format!("writing {key}: {refused}")))
                }
                UpdateResult::Failed(reason) => Err(StoreError::Unavailable(reason)),
            }
        })
    }
}

/// Makes [`DdataStore`]s.
pub struct DdataStoreFactory(pub ReplicatorHandle);

impl CoordinatorStoreFactory for DdataStoreFactory {
    fn store(&self, type_name: &str, remember_entities: bool) -> Arc<dyn CoordinatorStore> {
        Arc::new(DdataStore::new(
            self.0.clone(),
            type_name,
            remember_entities,
        ))
    }
}

/// Events between two snapshots of the coordinator's state (a snapshot is saved by the write
/// that crosses a multiple of it).
pub const SNAPSHOT_EVERY_EVENTS: u64 = 1_000;

const EVENT_MANIFEST: &str = "sharding.CoordinatorEvent";
const STATE_MANIFEST: &str = "sharding.CoordinatorState";

/// The coordinator's state as events in the (replicated, fenced) journal.
pub struct JournalStore {
    journal: Arc<dyn Journal>,
    snapshots: Arc<dyn SnapshotStore>,
    persistence_id: String,
    remember_entities: bool,
    /// The sequence number of the last stored event.
    highest: Arc<AtomicU64>,
}

/// The persistence id of a type's coordinator log.
pub fn persistence_id(type_name: &str) -> String {
    format!("sharding-coordinator|{type_name}")
}

impl JournalStore {
    pub fn new(
        journal: Arc<dyn Journal>,
        snapshots: Arc<dyn SnapshotStore>,
        type_name: &str,
        remember_entities: bool,
    ) -> Self {
        JournalStore {
            journal,
            snapshots,
            persistence_id: persistence_id(type_name),
            remember_entities,
            highest: Arc::new(AtomicU64::new(0)),
        }
    }
}

fn journal_error(error: JournalError) -> StoreError {
    match error {
        JournalError::Fenced { .. } => StoreError::Fatal(error.to_string()),
        other => StoreError::Unavailable(other.to_string()),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl CoordinatorStore for JournalStore {
    fn load(&self) -> BoxFuture<'static, Result<CoordinatorState, StoreError>> {
        let journal = self.journal.clone();
        let snapshots = self.snapshots.clone();
        let pid = self.persistence_id.clone();
        let remember = self.remember_entities;
        let highest_seen = self.highest.clone();
        Box::pin(async move {
            // The first use of the log by this node fences any earlier writer.
            let highest = journal
                .highest_sequence_nr(&pid)
                .await
                .map_err(journal_error)?;
            let snapshot = snapshots
                .load(&pid, SnapshotSelectionCriteria::latest())
                .await
                .map_err(|e| StoreError::Unavailable(e.to_string()))?;
            let (mut state, from) = match snapshot {
                Some(snapshot) if snapshot.metadata.sequence_nr <= highest => {
                    let stored: StoredState = postcard::from_bytes(&snapshot.payload)
                        .map_err(|e| StoreError::Fatal(format!("snapshot of {pid}: {e}")))?;
                    (from_stored(stored)?, snapshot.metadata.sequence_nr + 1)
                }
                _ => (CoordinatorState::new(remember), 1),
            };
            let mut events = journal.replay(&pid, from, highest, u64::MAX);
            while let Some(event) = events.next().await {
                let event = event.map_err(journal_error)?;
                let change: StateEvent = postcard::from_bytes(&event.payload).map_err(|e| {
                    StoreError::Fatal(format!("event {pid}#{}: {e}", event.sequence_nr))
                })?;
                // An event that does not fit (e.g. a region terminated twice) changed nothing
                // when it was first applied either.
                let _ = state.apply(&change);
            }
            state.set_remember_entities(remember);
            highest_seen.store(highest, Ordering::SeqCst);
            Ok(state)
        })
    }

    fn write(
        &self,
        events: Vec<StateEvent>,
        after: CoordinatorState,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let journal = self.journal.clone();
        let snapshots = self.snapshots.clone();
        let pid = self.persistence_id.clone();
        let highest = self.highest.clone();
        Box::pin(async move {
            let first = highest.load(Ordering::SeqCst) + 1;
            let mut new_events = Vec::with_capacity(events.len());
            for (offset, event) in events.iter().enumerate() {
                let payload =
                    postcard::to_allocvec(event).map_err(|e| StoreError::Fatal(e.to_string()))?;
                new_events.push(NewEvent {
                    sequence_nr: first + offset as u64,
                    timestamp_ms: now_ms(),
                    manifest: Manifest::new(EVENT_MANIFEST, 1),
                    payload: Bytes::from(payload),
                    tags: Vec::new(),
                });
            }
            let Some(last) = new_events.last().map(|e| e.sequence_nr) else {
                return Ok(());
            };
            let write = AtomicWrite {
                persistence_id: pid.clone(),
                writer_id: "sharding-coordinator".to_string(),
                events: new_events,
            };
            match journal.append(write).await {
                Ok(()) => {}
                Err(error @ JournalError::Fenced { .. }) => return Err(journal_error(error)),
                Err(error) => {
                    // The write may have landed (it is atomic): the log's highest sequence
                    // number tells (asking recovers the log if its writer gave it up).
                    let now = journal
                        .highest_sequence_nr(&pid)
                        .await
                        .map_err(journal_error)?;
                    if now == first - 1 {
                        return Err(journal_error(error));
                    }
                    if now != last {
                        return Err(StoreError::Fatal(format!(
                            "{pid} is at {now}, expected {last} after this write"
                        )));
                    }
                }
            }
            let sequence_nr = last;
            highest.store(sequence_nr, Ordering::SeqCst);
            if sequence_nr / SNAPSHOT_EVERY_EVENTS != (first - 1) / SNAPSHOT_EVERY_EVENTS
                && let Ok(bytes) = postcard::to_allocvec(&to_stored(&after))
            {
                // Best effort: without it recovery replays more events.
                let metadata = SnapshotMetadata {
                    persistence_id: pid.clone(),
                    sequence_nr,
                    timestamp_ms: now_ms(),
                };
                if let Err(e) = snapshots
                    .save(
                        metadata,
                        Manifest::new(STATE_MANIFEST, 1),
                        Bytes::from(bytes),
                    )
                    .await
                {
                    tracing::warn!(persistence_id = %pid, error = %e, "coordinator snapshot failed");
                }
            }
            Ok(())
        })
    }
}

/// Makes [`JournalStore`]s.
pub struct JournalStoreFactory {
    pub journal: Arc<dyn Journal>,
    pub snapshots: Arc<dyn SnapshotStore>,
}

impl CoordinatorStoreFactory for JournalStoreFactory {
    fn store(&self, type_name: &str, remember_entities: bool) -> Arc<dyn CoordinatorStore> {
        Arc::new(JournalStore::new(
            self.journal.clone(),
            self.snapshots.clone(),
            type_name,
            remember_entities,
        ))
    }
}

/// An in-memory store, for tests and single-process use.
#[derive(Default)]
pub struct MemoryStore {
    state: std::sync::Mutex<Option<CoordinatorState>>,
    remember_entities: bool,
}

impl MemoryStore {
    /// An empty store whose state has remember-entities on or off.
    pub fn new(remember_entities: bool) -> Self {
        MemoryStore {
            state: std::sync::Mutex::new(None),
            remember_entities,
        }
    }
}

impl CoordinatorStore for MemoryStore {
    fn load(&self) -> BoxFuture<'static, Result<CoordinatorState, StoreError>> {
        let state = self
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| CoordinatorState::new(self.remember_entities));
        Box::pin(futures::future::ready(Ok(state)))
    }

    fn write(
        &self,
        _events: Vec<StateEvent>,
        after: CoordinatorState,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = Some(after);
        Box::pin(futures::future::ready(Ok(())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ShardId;
    use tessera_cluster::{Address, UniqueAddress};

    #[test]
    fn the_stored_form_round_trips() {
        let region = UniqueAddress {
            address: Address::new("127.0.0.1", 1),
            uid: 5,
        };
        let mut state = CoordinatorState::new(true);
        for event in [
            StateEvent::RegionRegistered {
                region: region.clone(),
            },
            StateEvent::ShardHomeAllocated {
                shard: ShardId(3),
                region: region.clone(),
            },
            StateEvent::ProxyRegistered {
                proxy: region.clone(),
            },
        ] {
            state.apply(&event).unwrap();
        }
        state.set_unallocated([ShardId(9)]);
        let json = serde_json::to_string(&to_stored(&state)).unwrap();
        let back = from_stored(serde_json::from_str(&json).unwrap()).unwrap();
        assert_eq!(back, state);
    }
}
