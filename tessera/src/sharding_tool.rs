//! `tessera sharding remove-internal-data` (Akka's RemoveInternalClusterShardingData): removes
//! what cluster sharding stored about entity types in a stopped node's data directory, so
//! that the cluster starts those types afresh (their shard homes and remembered entities
//! gone).
//!
//! Remember-entities data is removed in both of its stores: the journal logs
//! `sharding-shard|<type>|<shard>` (`remember_entities = eventsourced`, emptied like the
//! coordinator's log below, with no snapshot needed: the remember store replays a log from
//! its first event, skipping deleted ones) and the durable Distributed Data keys
//! `shard-<type>-<shard>` and `shard-<type>-all` in `<data_dir>/ddata` (the registry of
//! shards with remembered entities, written in both modes). A durable key is forgotten
//! outright, without a tombstone: every node's copy must go, so the command runs on every
//! node's data directory of the stopped cluster.
//!
//! With `state_store_mode = persistence` the coordinator of a type keeps its state as the
//! events and snapshots of the log `sharding-coordinator|<type>` in the node's journal
//! (`<data_dir>/journal`) and snapshot store (`<data_dir>/snapshots`).
//! Both are RocksDB stores that a running node holds locked; opening them while the node runs
//! fails on the lock, and the command refuses.
//!
//! The journal is a node's replica store of the replicated journal: a log written through
//! replication has a replica state (promise, acknowledged mark, deleted prefix,
//! configuration) beside its entries. Deleting the entries with the plain journal delete would
//! leave that state pointing at entries that are gone, so such a log is emptied through the
//! replica rules instead: its tail is marked acknowledged and everything up to its last entry
//! is deleted. The log keeps its highest sequence number (a journal's never goes down), which
//! is what every replica of an emptied log agrees on. The replicated journal recovers a log
//! whose first events are deleted only from a snapshot that covers them, so the removal
//! leaves one snapshot of the empty coordinator state at that highest sequence number: a
//! coordinator started later reads an empty state and writes after it.

use bytes::Bytes;
use futures::StreamExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};
use tessera_coordinator::remember::{
    REMEMBERED_LOG_PREFIX, is_remember_key_of, remembered_log_shard,
};
use tessera_coordinator::store::persistence_id;
use tessera_ddata::durable::DurableStore;
use tessera_journal::{
    FsyncPolicy, Journal, JournalConfig, Manifest, QueryMode, RocksJournal, StoredEvent,
};
use tessera_replication::{LogSummary, Request, Response};
use tessera_snapshot::{
    RocksSnapshotStore, SnapshotConfig, SnapshotMetadata, SnapshotSelectionCriteria, SnapshotStore,
};

/// Snapshots of one log counted before they are deleted, at most (the coordinator keeps one
/// per 1,000 events; the count is only reported).
const MAX_SNAPSHOTS_COUNTED: usize = 100_000;

/// Why the removal did not happen, or stopped part-way: what was reported before stays
/// removed, and so may part of the type that failed (its coordinator log, some of its shard
/// logs). Every step is idempotent: running the command again finishes the removal.
#[derive(Debug, thiserror::Error)]
pub enum RemoveError {
    #[error("the node using {dir} is running; stop it first ({detail})")]
    NodeRunning { dir: PathBuf, detail: String },
    #[error("{dir} is not a directory")]
    NoDirectory { dir: PathBuf },
    #[error(
        "{dir} holds no journal, snapshot store or Distributed Data store (no journal/, \
         snapshots/ or ddata/ in it); is it a tessera node's data directory?"
    )]
    NoStores { dir: PathBuf },
    #[error("cannot open the {what} in {path}: {detail}")]
    Open {
        what: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error("removing the events of {persistence_id}: {detail}")]
    Journal {
        persistence_id: String,
        detail: String,
    },
    #[error("removing the snapshots of {persistence_id}: {detail}")]
    Snapshots {
        persistence_id: String,
        detail: String,
    },
    #[error("listing the logs of the journal in {path}: {detail}")]
    ListLogs { path: PathBuf, detail: String },
    #[error("removing the durable Distributed Data keys of {type_name}: {detail}")]
    DurableKeys { type_name: String, detail: String },
}

/// What was removed of one log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogRemoval {
    /// Events deleted from the journal.
    pub events: u64,
    /// The log's highest sequence number, which it keeps (0: no log).
    pub highest_sequence_nr: u64,
    /// Snapshots deleted.
    pub snapshots: usize,
}

impl LogRemoval {
    fn is_empty(&self) -> bool {
        self.events == 0 && self.snapshots == 0
    }
}

/// What was removed of one type's remembered entities.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RememberRemoval {
    /// Shard logs (`eventsourced`) that held events.
    pub logs: usize,
    /// Events deleted from them.
    pub events: u64,
    /// Durable Distributed Data keys removed (shards' sets and the registry of shards).
    pub durable_keys: usize,
}

/// What was removed for one entity type: its coordinator's log and its remembered entities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeRemoval {
    pub type_name: String,
    pub coordinator: LogRemoval,
    pub remembered: RememberRemoval,
}

impl TypeRemoval {
    /// One line for the operator.
    pub fn describe(&self) -> String {
        let pid = persistence_id(&self.type_name);
        let removed = &self.coordinator;
        let coordinator = if removed.is_empty() {
            format!("no events or snapshots of {pid}")
        } else {
            format!(
                "removed {} event(s) and {} snapshot(s) of {pid}; it now reads as empty \
                 (an empty-state snapshot at its highest sequence number {})",
                removed.events, removed.snapshots, removed.highest_sequence_nr
            )
        };
        let remembered = &self.remembered;
        let remembered = if *remembered == RememberRemoval::default() {
            "no remembered entities".to_string()
        } else {
            format!(
                "remembered entities: {} event(s) of {} shard log(s) and {} durable \
                 Distributed Data key(s) removed",
                remembered.events, remembered.logs, remembered.durable_keys
            )
        };
        if removed.is_empty() && self.remembered == RememberRemoval::default() {
            return format!(
                "{}: nothing stored ({coordinator}, {remembered})",
                self.type_name
            );
        }
        format!("{}: {coordinator}; {remembered}", self.type_name)
    }
}

/// Whether a RocksDB open failed because another process (or this one) holds the database's
/// LOCK file: the sign of a running node.
fn is_lock_error(detail: &str) -> bool {
    detail.contains("/LOCK") || detail.contains("lock file") || detail.contains("lock hold")
}

fn open_error(dir: &Path, what: &'static str, path: PathBuf, detail: String) -> RemoveError {
    if is_lock_error(&detail) {
        RemoveError::NodeRunning {
            dir: dir.to_path_buf(),
            detail,
        }
    } else {
        RemoveError::Open { what, path, detail }
    }
}

/// Opens the stores of the stopped node's `data_dir` (only those that exist: nothing is
/// created), removes the sharding data of each of `type_names` in the order given, passing
/// what was removed to `report` as soon as a type is done (an error later leaves the earlier
/// types removed), closes the stores and returns every type's removal.
pub async fn remove_internal_data(
    data_dir: &Path,
    type_names: &[String],
    mut report: impl FnMut(&TypeRemoval),
) -> Result<Vec<TypeRemoval>, RemoveError> {
    if !data_dir.is_dir() {
        return Err(RemoveError::NoDirectory {
            dir: data_dir.to_path_buf(),
        });
    }
    let journal_path = data_dir.join("journal");
    let snapshots_path = data_dir.join("snapshots");
    let ddata_path = data_dir.join("ddata");
    if !journal_path.is_dir() && !snapshots_path.is_dir() && !ddata_path.is_dir() {
        return Err(RemoveError::NoStores {
            dir: data_dir.to_path_buf(),
        });
    }
    let journal = if journal_path.is_dir() {
        let mut config = JournalConfig::new(&journal_path);
        config.fsync = FsyncPolicy::Always;
        let journal = RocksJournal::open(config)
            .await
            .map_err(|e| open_error(data_dir, "journal", journal_path.clone(), e.to_string()))?;
        Some(journal)
    } else {
        None
    };
    let opened = open_other_stores(data_dir, &snapshots_path, &ddata_path).await;
    let (snapshots, durable) = match opened {
        Ok(stores) => stores,
        Err(e) => {
            if let Some(journal) = journal {
                journal.close().await;
            }
            return Err(e);
        }
    };
    let stores = Stores {
        journal: journal.as_ref(),
        snapshots: snapshots.as_ref(),
        durable: durable.as_ref(),
    };
    let mut removals = Vec::with_capacity(type_names.len());
    let mut result = match stores.journal {
        Some(journal) => list_logs(journal, &journal_path).await,
        None => Ok(Vec::new()),
    };
    if let Ok(logs) = &result {
        for type_name in type_names {
            match remove_type(&stores, logs, type_name).await {
                Ok(removal) => {
                    report(&removal);
                    removals.push(removal);
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
    }
    drop(durable);
    if let Some(journal) = journal {
        journal.close().await;
    }
    drop(snapshots);
    result.map(|_| removals)
}

/// Opens the snapshot store and the Distributed Data store of `data_dir`, those that exist.
async fn open_other_stores(
    data_dir: &Path,
    snapshots_path: &Path,
    ddata_path: &Path,
) -> Result<(Option<RocksSnapshotStore>, Option<DurableStore>), RemoveError> {
    let snapshots = if snapshots_path.is_dir() {
        let opened = RocksSnapshotStore::open(SnapshotConfig::new(snapshots_path)).await;
        let store = opened.map_err(|e| {
            open_error(
                data_dir,
                "snapshot store",
                snapshots_path.to_path_buf(),
                e.to_string(),
            )
        })?;
        Some(store)
    } else {
        None
    };
    let durable = if ddata_path.is_dir() {
        let store = DurableStore::open(ddata_path).map_err(|e| {
            open_error(
                data_dir,
                "Distributed Data store",
                ddata_path.to_path_buf(),
                e.to_string(),
            )
        })?;
        Some(store)
    } else {
        None
    };
    Ok((snapshots, durable))
}

/// The open stores of a stopped node (each may be absent).
#[derive(Clone, Copy)]
pub struct Stores<'a> {
    pub journal: Option<&'a RocksJournal>,
    pub snapshots: Option<&'a RocksSnapshotStore>,
    pub durable: Option<&'a DurableStore>,
}

/// The remember-entities logs the journal holds (of any type; the entities' own logs, which
/// may be many more, are not kept).
async fn list_logs(journal: &RocksJournal, path: &Path) -> Result<Vec<String>, RemoveError> {
    let mut ids = journal.persistence_ids(QueryMode::Current);
    let mut logs = Vec::new();
    while let Some(id) = ids.next().await {
        let id = id.map_err(|e| RemoveError::ListLogs {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        if id.starts_with(REMEMBERED_LOG_PREFIX) {
            logs.push(id);
        }
    }
    Ok(logs)
}

/// Removes the coordinator log and the remembered entities of `type_name` from open stores;
/// `logs`: the journal's remember-entities logs (others are ignored).
pub async fn remove_type(
    stores: &Stores<'_>,
    logs: &[String],
    type_name: &str,
) -> Result<TypeRemoval, RemoveError> {
    let coordinator =
        remove_log(stores.journal, stores.snapshots, &persistence_id(type_name)).await?;
    let mut remembered = RememberRemoval::default();
    if let Some(journal) = stores.journal {
        for pid in logs
            .iter()
            .filter(|pid| remembered_log_shard(type_name, pid).is_some())
        {
            let (events, _) = remove_events(journal, pid).await?;
            if events > 0 {
                remembered.logs += 1;
                remembered.events += events;
            }
        }
    }
    if let Some(durable) = stores.durable {
        let failed = |e: tessera_ddata::durable::DurableStoreError| RemoveError::DurableKeys {
            type_name: type_name.to_string(),
            detail: e.to_string(),
        };
        let keys: Vec<String> = durable
            .keys()
            .map_err(failed)?
            .into_iter()
            .filter(|key| is_remember_key_of(type_name, key))
            .collect();
        if !keys.is_empty() {
            durable.remove(&keys).map_err(failed)?;
        }
        remembered.durable_keys = keys.len();
    }
    Ok(TypeRemoval {
        type_name: type_name.to_string(),
        coordinator,
        remembered,
    })
}

/// Removes the events and snapshots of one log.
async fn remove_log(
    journal: Option<&RocksJournal>,
    snapshots: Option<&RocksSnapshotStore>,
    pid: &str,
) -> Result<LogRemoval, RemoveError> {
    let (events, highest_sequence_nr) = match journal {
        Some(journal) => remove_events(journal, pid).await?,
        None => (0, 0),
    };
    let snapshots = match snapshots {
        Some(snapshots) => {
            let removed = remove_snapshots(snapshots, pid).await?;
            if highest_sequence_nr > 0 {
                save_empty_state(snapshots, pid, highest_sequence_nr).await?;
            }
            removed
        }
        None => 0,
    };
    Ok(LogRemoval {
        events,
        highest_sequence_nr,
        snapshots,
    })
}

/// What this store holds of a log (its replica state; a log written only by the local
/// journal reads as one of epoch-zero entries without a configuration).
async fn locate(journal: &RocksJournal, pid: &str) -> Result<Option<LogSummary>, RemoveError> {
    match journal
        .replica_apply(pid, Request::Locate)
        .await
        .map_err(|e| journal_error(pid, e.to_string()))?
    {
        Response::Located { summary, .. } => Ok(summary),
        other => Err(journal_error(
            pid,
            format!("unexpected answer {} to Locate", other.kind()),
        )),
    }
}

fn journal_error(pid: &str, detail: String) -> RemoveError {
    RemoveError::Journal {
        persistence_id: pid.to_string(),
        detail,
    }
}

/// Deletes every event of a log; returns how many were stored and the log's highest
/// sequence number.
async fn remove_events(journal: &RocksJournal, pid: &str) -> Result<(u64, u64), RemoveError> {
    let Some(before) = locate(journal, pid).await? else {
        return Ok((0, 0));
    };
    let last = before.last.seq;
    let stored = last.saturating_sub(before.base.seq);
    if stored == 0 {
        return Ok((0, last));
    }
    match &before.config {
        // Written by this journal alone: its own delete keeps it consistent.
        None => journal
            .delete_to(pid, last)
            .await
            .map_err(|e| journal_error(pid, e.to_string()))?,
        Some(config) => {
            if before.lac < last {
                // The tail above the acknowledged mark would otherwise outlive the delete
                // (a replica never deletes what it does not know acknowledged). The log is
                // being emptied everywhere, so its tail is declared acknowledged here, under
                // the promised epoch so that the replica rules take it.
                let mark = Request::Append {
                    epoch: before.promise,
                    prev: before.last,
                    entries: Vec::new(),
                    lac: last,
                    config: Some(config.config.clone()),
                };
                expect(journal, pid, mark, "Appended").await?;
            }
            let delete = Request::DeleteTo {
                epoch: before.promise,
                to: last,
            };
            expect(journal, pid, delete, "Deleted").await?;
        }
    }
    let after = locate(journal, pid).await?;
    match after {
        Some(after) if after.base.seq >= last => Ok((stored, last)),
        other => Err(journal_error(
            pid,
            format!(
                "after the delete the log still holds entries: {:?}",
                other.map(|s| (s.base, s.last))
            ),
        )),
    }
}

async fn expect(
    journal: &RocksJournal,
    pid: &str,
    request: Request<StoredEvent>,
    wanted: &str,
) -> Result<(), RemoveError> {
    let response = journal
        .replica_apply(pid, request)
        .await
        .map_err(|e| journal_error(pid, e.to_string()))?;
    if response.kind() == wanted {
        Ok(())
    } else {
        Err(journal_error(
            pid,
            format!("the replica answered {response:?}, expected {wanted}"),
        ))
    }
}

/// Deletes every snapshot of a log; returns how many there were, not counting empty-state
/// snapshots (those an earlier removal left hold nothing).
async fn remove_snapshots(snapshots: &RocksSnapshotStore, pid: &str) -> Result<usize, RemoveError> {
    let mut count = 0;
    let mut criteria = SnapshotSelectionCriteria::latest();
    for _ in 0..MAX_SNAPSHOTS_COUNTED {
        let Some(snapshot) = snapshots
            .load(pid, criteria)
            .await
            .map_err(|e| snapshot_error(pid, e))?
        else {
            break;
        };
        let sequence_nr = snapshot.metadata.sequence_nr;
        if snapshot.payload.as_ref() != EMPTY_STATE {
            count += 1;
        }
        let Some(below) = sequence_nr.checked_sub(1) else {
            break;
        };
        criteria = SnapshotSelectionCriteria::up_to(below);
    }
    snapshots
        .delete_matching(pid, SnapshotSelectionCriteria::latest())
        .await
        .map_err(|e| snapshot_error(pid, e))?;
    Ok(count)
}

fn snapshot_error(pid: &str, e: tessera_snapshot::SnapshotError) -> RemoveError {
    RemoveError::Snapshots {
        persistence_id: pid.to_string(),
        detail: e.to_string(),
    }
}

/// The coordinator's snapshot manifest (`tessera_coordinator::store`'s).
const STATE_MANIFEST: &str = "sharding.CoordinatorState";
/// The empty coordinator state as `tessera_coordinator::store` stores it (postcard of its
/// `StoredState`): version 1, remember_entities false (a coordinator sets its own on load),
/// no regions, no proxies, no unallocated shards. The coordinator keeps the encoding private;
/// a test loads this through `JournalStore` so that a change of format fails there.
const EMPTY_STATE: &[u8] = &[1, 0, 0, 0, 0];

/// Saves the empty state as the log's snapshot at `sequence_nr`: the replicated journal
/// recovers a log whose events are deleted only from a snapshot covering them.
async fn save_empty_state(
    snapshots: &RocksSnapshotStore,
    pid: &str,
    sequence_nr: u64,
) -> Result<(), RemoveError> {
    let timestamp_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let metadata = SnapshotMetadata {
        persistence_id: pid.to_string(),
        sequence_nr,
        timestamp_ms,
    };
    snapshots
        .save(
            metadata,
            Manifest::new(STATE_MANIFEST, 1),
            Bytes::from_static(EMPTY_STATE),
        )
        .await
        .map_err(|e| snapshot_error(pid, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::sync::Arc;
    use tessera_cluster::{Address, UniqueAddress};
    use tessera_coordinator::ShardId;
    use tessera_coordinator::remember::{registry_key, shard_key, shard_persistence_id};
    use tessera_coordinator::state::{CoordinatorState, StateEvent};
    use tessera_coordinator::store::{CoordinatorStore, JournalStore, SNAPSHOT_EVERY_EVENTS};
    use tessera_journal::{AtomicWrite, Manifest, NewEvent};
    use tessera_replication::{Configuration, Entry, Epoch, Position, ReplicaId};

    async fn open(dir: &Path) -> (Arc<RocksJournal>, Arc<RocksSnapshotStore>) {
        let journal = RocksJournal::open(JournalConfig::new(dir.join("journal")))
            .await
            .expect("journal opens");
        let snapshots = RocksSnapshotStore::open(SnapshotConfig::new(dir.join("snapshots")))
            .await
            .expect("snapshot store opens");
        (Arc::new(journal), Arc::new(snapshots))
    }

    async fn close(journal: Arc<RocksJournal>, snapshots: Arc<RocksSnapshotStore>) {
        Arc::into_inner(journal)
            .expect("no other owner of the journal")
            .close()
            .await;
        drop(snapshots);
    }

    fn coordinator_store(
        journal: &Arc<RocksJournal>,
        snapshots: &Arc<RocksSnapshotStore>,
    ) -> JournalStore {
        JournalStore::new(journal.clone(), snapshots.clone(), "account", false)
    }

    fn region() -> UniqueAddress {
        UniqueAddress::new(Address::new("127.0.0.1", 25520), 7)
    }

    /// Writes a registration and enough allocations that the store saves a snapshot.
    async fn write_coordinator_state(store: &JournalStore) -> u64 {
        let mut state = store.load().await.expect("load");
        let mut events = vec![StateEvent::RegionRegistered { region: region() }];
        for shard in 0..SNAPSHOT_EVERY_EVENTS as u32 {
            events.push(StateEvent::ShardHomeAllocated {
                shard: ShardId(shard),
                region: region(),
            });
        }
        for event in &events {
            state.apply(event).expect("event fits");
        }
        let written = events.len() as u64;
        store.write(events, state).await.expect("write");
        written
    }

    async fn append(journal: &RocksJournal, pid: &str, sequence_nr: u64) {
        let write = AtomicWrite {
            persistence_id: pid.to_string(),
            writer_id: "test".to_string(),
            events: vec![NewEvent {
                sequence_nr,
                timestamp_ms: 1,
                manifest: Manifest::new("test", 1),
                payload: Bytes::from_static(b"event"),
                tags: Vec::new(),
            }],
        };
        journal.append(write).await.expect("append");
    }

    async fn replayed(journal: &RocksJournal, pid: &str) -> usize {
        journal.replay(pid, 1, u64::MAX, u64::MAX).count().await
    }

    fn types(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[tokio::test]
    async fn removal_leaves_the_coordinator_log_empty_and_other_logs_untouched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (journal, snapshots) = open(dir.path()).await;
        let written = write_coordinator_state(&coordinator_store(&journal, &snapshots)).await;
        let pid = persistence_id("account");
        assert!(
            snapshots
                .load(&pid, SnapshotSelectionCriteria::latest())
                .await
                .expect("load")
                .is_some(),
            "the write crossing {SNAPSHOT_EVERY_EVENTS} events saved a snapshot"
        );
        append(&journal, "sharding-shard|account|17", 1).await;
        append(&journal, "account|alice", 1).await;
        close(journal, snapshots).await;

        let removed = remove_internal_data(dir.path(), &types(&["account", "cart"]), |_| {})
            .await
            .expect("removal");
        assert_eq!(
            removed[0].coordinator,
            LogRemoval {
                events: written,
                highest_sequence_nr: written,
                snapshots: 1
            }
        );
        assert!(
            removed[0]
                .describe()
                .contains("removed 1001 event(s) and 1 snapshot(s)")
        );
        assert!(removed[1].describe().contains("cart: nothing stored"));

        let (journal, snapshots) = open(dir.path()).await;
        assert_eq!(replayed(&journal, &pid).await, 0);
        assert_eq!(
            replayed(&journal, "sharding-shard|account|17").await,
            0,
            "remembered entities go too"
        );
        assert_eq!(replayed(&journal, "account|alice").await, 1, "untouched");
        let left = snapshots
            .load(&pid, SnapshotSelectionCriteria::latest())
            .await
            .expect("load")
            .expect("the empty-state snapshot");
        assert_eq!(left.metadata.sequence_nr, written);
        assert_eq!(left.payload.as_ref(), EMPTY_STATE);
        let store = coordinator_store(&journal, &snapshots);
        let state = store.load().await.expect("load after the removal");
        assert!(state.shards().is_empty() && state.regions().is_empty());
        // The log continues after its highest sequence number: a new coordinator can write.
        let event = StateEvent::RegionRegistered { region: region() };
        let mut after = CoordinatorState::new(false);
        after.apply(&event).expect("fits");
        store.write(vec![event], after).await.expect("write again");
        assert_eq!(
            journal.highest_sequence_nr(&pid).await.expect("highest"),
            written + 1
        );
        assert_eq!(store.load().await.expect("load").regions().len(), 1);
        drop(store);
        close(journal, snapshots).await;

        let again = remove_internal_data(dir.path(), &types(&["account"]), |_| {})
            .await
            .expect("second removal");
        assert_eq!(again[0].coordinator.events, 1);
        assert_eq!(
            again[0].coordinator.snapshots, 0,
            "the empty state is not counted"
        );
    }

    #[tokio::test]
    async fn removal_empties_a_replicated_log_including_its_unacknowledged_tail() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (journal, snapshots) = open(dir.path()).await;
        let pid = persistence_id("account");
        let epoch = Epoch {
            counter: 2,
            writer: 9,
        };
        let config = Configuration::new(
            1,
            vec![ReplicaId::new(
                Address::new("127.0.0.1", 25520),
                journal.storage_id(),
            )],
        );
        let entry = |seq| Entry {
            seq,
            epoch,
            payload: StoredEvent {
                timestamp_ms: 1,
                writer_id: "sharding-coordinator".into(),
                manifest: "test".into(),
                manifest_version: 1,
                payload: Bytes::from_static(b"event"),
                tags: Vec::new(),
            },
        };
        let prepare = Request::Prepare { epoch };
        journal.replica_apply(&pid, prepare).await.expect("prepare");
        let write = Request::Append {
            epoch,
            prev: Position::START,
            entries: (1..=3).map(entry).collect(),
            lac: 1,
            config: Some(config.clone()),
        };
        let answer = journal.replica_apply(&pid, write).await.expect("append");
        assert_eq!(answer.kind(), "Appended");
        let stores = Stores {
            journal: Some(&*journal),
            snapshots: Some(&*snapshots),
            durable: None,
        };
        let removal = remove_type(&stores, std::slice::from_ref(&pid), "account")
            .await
            .expect("removal");
        assert_eq!(removal.coordinator.events, 3);
        close(journal, snapshots).await;

        let (journal, snapshots) = open(dir.path()).await;
        let summary = locate(&journal, &pid).await.expect("locate").expect("log");
        assert_eq!((summary.base.seq, summary.last.seq, summary.lac), (3, 3, 3));
        let read = Request::Read {
            from: 1,
            to: u64::MAX,
            max_entries: 100,
            max_bytes: 1 << 20,
        };
        match journal.replica_apply(&pid, read).await.expect("read") {
            Response::Entries { entries, .. } => assert!(entries.is_empty()),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(replayed(&journal, &pid).await, 0);
        // The replica takes its writer's next entry after the emptied log.
        let next = Request::Append {
            epoch,
            prev: summary.last,
            entries: vec![entry(4)],
            lac: 4,
            config: None,
        };
        let answer = journal.replica_apply(&pid, next).await.expect("append");
        assert_eq!(answer.kind(), "Appended");
        close(journal, snapshots).await;
    }

    /// Remembered entities go in both stores: the type's shard logs (written by this journal
    /// alone or through replication) are emptied (a replay from the first event reads nothing,
    /// as the remember store's does), its durable Distributed Data keys are forgotten; another
    /// type's stay.
    #[tokio::test]
    async fn removal_forgets_the_types_remembered_entities_in_both_stores() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (journal, snapshots) = open(dir.path()).await;
        let local_log = shard_persistence_id("account", ShardId(17));
        append(&journal, &local_log, 1).await;
        append(&journal, &local_log, 2).await;
        let other_type_log = shard_persistence_id("account-v2", ShardId(17));
        append(&journal, &other_type_log, 1).await;
        let replicated_log = shard_persistence_id("account", ShardId(3));
        let epoch = Epoch {
            counter: 1,
            writer: 4,
        };
        let config = Configuration::new(
            1,
            vec![ReplicaId::new(
                Address::new("127.0.0.1", 25520),
                journal.storage_id(),
            )],
        );
        let prepare = Request::Prepare { epoch };
        journal
            .replica_apply(&replicated_log, prepare)
            .await
            .expect("prepare");
        let write = Request::Append {
            epoch,
            prev: Position::START,
            entries: (1..=3)
                .map(|seq| Entry {
                    seq,
                    epoch,
                    payload: StoredEvent {
                        timestamp_ms: 1,
                        writer_id: "sharding-shard".into(),
                        manifest: "test".into(),
                        manifest_version: 1,
                        payload: Bytes::from_static(b"event"),
                        tags: Vec::new(),
                    },
                })
                .collect(),
            lac: 2,
            config: Some(config),
        };
        let answer = journal
            .replica_apply(&replicated_log, write)
            .await
            .expect("append");
        assert_eq!(answer.kind(), "Appended");
        close(journal, snapshots).await;
        let durable = DurableStore::open(&dir.path().join("ddata")).expect("ddata store");
        let set = |n| {
            let mut set = tessera_ddata::GSet::new();
            set.add(format!("e{n}"));
            tessera_ddata::DataEnvelope::new(set.into())
        };
        let keys = [
            registry_key("account"),
            shard_key("account", ShardId(17)),
            shard_key("account", ShardId(3)),
            registry_key("account-v2"),
            shard_key("account-v2", ShardId(17)),
            "counter".to_string(),
        ];
        let entries: Vec<_> = keys.iter().map(|k| (k.clone(), set(1))).collect();
        durable.store(&entries).expect("store");
        drop(durable);

        let mut reported = Vec::new();
        let removed = remove_internal_data(dir.path(), &types(&["account"]), |r| {
            reported.push(r.describe())
        })
        .await
        .expect("removal");
        assert_eq!(
            removed[0].remembered,
            RememberRemoval {
                logs: 2,
                events: 5,
                durable_keys: 3
            }
        );
        assert!(
            reported[0].contains(
                "remembered entities: 5 event(s) of 2 shard log(s) and 3 durable Distributed \
                 Data key(s) removed"
            ),
            "{}",
            reported[0]
        );

        let durable = DurableStore::open(&dir.path().join("ddata")).expect("ddata store");
        assert_eq!(
            durable.keys().expect("keys"),
            ["counter", "shard-account-v2-17", "shard-account-v2-all"]
        );
        drop(durable);
        let (journal, snapshots) = open(dir.path()).await;
        assert_eq!(replayed(&journal, &local_log).await, 0);
        assert_eq!(replayed(&journal, &replicated_log).await, 0);
        assert_eq!(replayed(&journal, &other_type_log).await, 1, "untouched");
        // Each log keeps its highest sequence number: the shard's next owner writes after it.
        assert_eq!(journal.highest_sequence_nr(&local_log).await.unwrap(), 2);
        append(&journal, &local_log, 3).await;
        assert_eq!(replayed(&journal, &local_log).await, 1);
        close(journal, snapshots).await;

        let again = remove_internal_data(dir.path(), &types(&["account"]), |_| {})
            .await
            .expect("second removal");
        assert_eq!(again[0].remembered.logs, 1, "the event written since");
        assert_eq!(again[0].remembered.durable_keys, 0);
    }

    #[tokio::test]
    async fn removal_refuses_while_the_node_holds_the_store() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (journal, snapshots) = open(dir.path()).await;
        let error = remove_internal_data(dir.path(), &types(&["account"]), |_| {})
            .await
            .expect_err("the store is held");
        assert!(matches!(error, RemoveError::NodeRunning { .. }), "{error}");
        let message = error.to_string();
        assert!(
            message.starts_with(&format!(
                "the node using {} is running; stop it first",
                dir.path().display()
            )),
            "{message}"
        );
        close(journal, snapshots).await;
    }

    #[tokio::test]
    async fn removal_names_a_directory_that_is_not_a_nodes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let error = remove_internal_data(dir.path(), &types(&["account"]), |_| {})
            .await
            .expect_err("no stores");
        assert!(matches!(error, RemoveError::NoStores { .. }), "{error}");
        let missing = dir.path().join("missing");
        let error = remove_internal_data(&missing, &types(&["account"]), |_| {})
            .await
            .expect_err("no directory");
        assert!(matches!(error, RemoveError::NoDirectory { .. }), "{error}");
        assert!(!missing.exists(), "nothing is created");
    }
}
