//! The RocksDB snapshot store.
//!
//! Column families: `snapshots` with keys `len(persistence id) (u16 BE) ++ persistence id ++
//! sequence_nr (u64 BE)` (a log's snapshots are adjacent, in sequence order, so the latest is
//! one reverse seek away) and sealed values; `meta` with the store's format version.
//!
//! Snapshots are rare and large next to events, so each operation is its own RocksDB write on
//! tokio's blocking pool (RocksDB groups concurrent writers itself); there is no writer task.

use crate::error::{SnapshotError, validate_persistence_id};
use crate::store::{Snapshot, SnapshotMetadata, SnapshotSelectionCriteria, SnapshotStore};
use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use rocksdb::{ColumnFamilyDescriptor, DB, Options, WriteBatch, WriteOptions};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use tessera_storage::{
    self as storage, FORMAT_VERSION_KEY, FsyncPolicy, Manifest, RecordFormat, UnsealError,
};

/// The store format version this release writes; stores with a higher one are refused, and
/// older ones are read and marked with this one when opened:
///
/// - 1: snapshot records of format 1;
/// - 2: records of format 2 too. A release of store format 1 would fail on each such
///   snapshot when an entity loads it; the store is marked 2 so that such a release refuses
///   it at open instead.
pub const STORE_FORMAT_VERSION: u32 = 2;

/// The snapshot record format this release writes; it reads this one and every earlier one.
/// The body is postcard of [`StoredSnapshot`] in both; format 1 is sealed with keyed BLAKE3,
/// format 2 with xxh3 (see [`RecordFormat`]).
pub(crate) const SNAPSHOT_RECORDS: RecordFormat = RecordFormat::new(2, 2);

const CF_SNAPSHOTS: &str = "snapshots";
const CF_META: &str = "meta";

/// Configuration of a [`RocksSnapshotStore`].
#[derive(Debug, Clone)]
pub struct SnapshotConfig {
    /// Directory of the RocksDB database (created if missing).
    pub path: PathBuf,
    /// Durability of saves and deletes.
    pub fsync: FsyncPolicy,
}

impl SnapshotConfig {
    /// Defaults (fsync always), with the database at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SnapshotConfig {
            path: path.into(),
            fsync: FsyncPolicy::Always,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct StoredSnapshot<'a> {
    timestamp_ms: u64,
    manifest_type: &'a str,
    manifest_version: u32,
    payload: &'a [u8],
}

pub(crate) fn snapshot_key(persistence_id: &str, sequence_nr: u64) -> Vec<u8> {
    let mut key = log_prefix(persistence_id);
    key.extend_from_slice(&sequence_nr.to_be_bytes());
    key
}

/// Keys of one log's snapshots start with this; persistence ids are at most
/// [`tessera_storage::MAX_NAME_BYTES`] long, so the length fits a u16.
fn log_prefix(persistence_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(2 + persistence_id.len() + 8);
    key.extend_from_slice(&(persistence_id.len() as u16).to_be_bytes());
    key.extend_from_slice(persistence_id.as_bytes());
    key
}

pub(crate) fn sequence_nr_of(key: &[u8]) -> Option<u64> {
    let tail = key.len().checked_sub(8)?;
    Some(u64::from_be_bytes(key[tail..].try_into().ok()?))
}

/// The snapshot in the sealed record `value` of (`persistence_id`, `sequence_nr`), stored under
/// `key`: checksum verified, then decoded.
pub(crate) fn decode_record(
    persistence_id: &str,
    sequence_nr: u64,
    key: &[u8],
    value: &[u8],
) -> Result<Snapshot, SnapshotError> {
    let corrupt = |detail: String| SnapshotError::Corrupt {
        persistence_id: persistence_id.to_string(),
        sequence_nr,
        detail,
    };
    let (_, body) = storage::unseal(SNAPSHOT_RECORDS, key, value).map_err(|e| match e {
        UnsealError::NewerVersion { found, supported } => SnapshotError::NewerRecordVersion {
            persistence_id: persistence_id.to_string(),
            sequence_nr,
            found,
            supported,
        },
        other => corrupt(other.to_string()),
    })?;
    let stored: StoredSnapshot<'_> =
        postcard::from_bytes(body).map_err(|e| corrupt(format!("undecodable body: {e}")))?;
    Ok(Snapshot {
        metadata: SnapshotMetadata {
            persistence_id: persistence_id.to_string(),
            sequence_nr,
            timestamp_ms: stored.timestamp_ms,
        },
        manifest: Manifest::new(stored.manifest_type, stored.manifest_version),
        payload: Bytes::copy_from_slice(stored.payload),
    })
}

/// The sealed record of a snapshot stored under `key`.
pub(crate) fn encode_record(
    key: &[u8],
    timestamp_ms: u64,
    manifest: &Manifest,
    payload: &[u8],
) -> Result<Vec<u8>, SnapshotError> {
    let stored = StoredSnapshot {
        timestamp_ms,
        manifest_type: &manifest.type_name,
        manifest_version: manifest.version,
        payload,
    };
    let body = postcard::to_allocvec(&stored)
        .map_err(|e| SnapshotError::Storage(format!("cannot encode snapshot: {e}")))?;
    Ok(storage::seal(SNAPSHOT_RECORDS, key, &body))
}

struct Inner {
    db: DB,
    write_options: WriteOptions,
}

impl Inner {
    fn snapshots(&self) -> Result<&rocksdb::ColumnFamily, SnapshotError> {
        self.db
            .cf_handle(CF_SNAPSHOTS)
            .ok_or_else(|| SnapshotError::Storage("column family snapshots missing".into()))
    }

    fn save(
        &self,
        metadata: &SnapshotMetadata,
        manifest: &Manifest,
        payload: &[u8],
    ) -> Result<(), SnapshotError> {
        let key = snapshot_key(&metadata.persistence_id, metadata.sequence_nr);
        let value = encode_record(&key, metadata.timestamp_ms, manifest, payload)?;
        self.db
            .put_cf_opt(self.snapshots()?, key, value, &self.write_options)?;
        Ok(())
    }

    /// Visits the log's snapshots within the criteria's sequence bounds, newest first, until
    /// `visit` returns false.
    fn scan(
        &self,
        persistence_id: &str,
        criteria: &SnapshotSelectionCriteria,
        mut visit: impl FnMut(u64, &[u8], &[u8]) -> Result<bool, SnapshotError>,
    ) -> Result<(), SnapshotError> {
        if criteria.min_sequence_nr > criteria.max_sequence_nr {
            return Ok(());
        }
        let mut options = rocksdb::ReadOptions::default();
        options.set_iterate_lower_bound(snapshot_key(persistence_id, criteria.min_sequence_nr));
        let mut iter = self.db.raw_iterator_cf_opt(self.snapshots()?, options);
        iter.seek_for_prev(snapshot_key(persistence_id, criteria.max_sequence_nr));
        let prefix = log_prefix(persistence_id);
        while let Some((key, value)) = iter.item() {
            if !key.starts_with(&prefix) || key.len() != prefix.len() + 8 {
                break;
            }
            let Some(sequence_nr) = sequence_nr_of(key) else {
                break;
            };
            if !visit(sequence_nr, key, value)? {
                return Ok(());
            }
            iter.prev();
        }
        iter.status().map_err(|e| SnapshotError::Corrupt {
            persistence_id: persistence_id.to_string(),
            sequence_nr: criteria.max_sequence_nr,
            detail: e.to_string(),
        })
    }

    fn load(
        &self,
        persistence_id: &str,
        criteria: &SnapshotSelectionCriteria,
    ) -> Result<Option<Snapshot>, SnapshotError> {
        let mut found = None;
        self.scan(persistence_id, criteria, |sequence_nr, key, value| {
            let snapshot = decode_record(persistence_id, sequence_nr, key, value)?;
            if criteria.matches(sequence_nr, snapshot.metadata.timestamp_ms) {
                found = Some(snapshot);
                return Ok(false);
            }
            Ok(true)
        })?;
        Ok(found)
    }

    fn delete_matching(
        &self,
        persistence_id: &str,
        criteria: &SnapshotSelectionCriteria,
    ) -> Result<(), SnapshotError> {
        let mut doomed = Vec::new();
        self.scan(persistence_id, criteria, |sequence_nr, key, value| {
            let selected = criteria.any_timestamp() || {
                let snapshot = decode_record(persistence_id, sequence_nr, key, value)?;
                criteria.matches(sequence_nr, snapshot.metadata.timestamp_ms)
            };
            if selected {
                doomed.push(key.to_vec());
            }
            Ok(true)
        })?;
        if doomed.is_empty() {
            return Ok(());
        }
        let cf = self.snapshots()?;
        let mut batch = WriteBatch::default();
        for key in doomed {
            batch.delete_cf(cf, key);
        }
        self.db.write_opt(batch, &self.write_options)?;
        Ok(())
    }
}

/// The RocksDB snapshot store. Cheap to share behind an `Arc`.
pub struct RocksSnapshotStore {
    inner: Arc<Inner>,
}

impl RocksSnapshotStore {
    /// Opens (or creates) the store at `config.path`. A store written by a newer release is
    /// refused without changing a byte.
    pub async fn open(config: SnapshotConfig) -> Result<Self, SnapshotError> {
        tokio::task::spawn_blocking(move || Self::open_blocking(config))
            .await
            .map_err(|e| SnapshotError::Storage(format!("snapshot store open task failed: {e}")))?
    }

    fn open_blocking(config: SnapshotConfig) -> Result<Self, SnapshotError> {
        std::fs::create_dir_all(&config.path).map_err(|e| {
            SnapshotError::Storage(format!("cannot create {}: {e}", config.path.display()))
        })?;
        let existing = storage::check_store_format(
            &config.path,
            "snapshot",
            CF_META,
            &[CF_SNAPSHOTS],
            STORE_FORMAT_VERSION,
        )?;
        let mut options = Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        options.set_wal_recovery_mode(rocksdb::DBRecoveryMode::PointInTime);
        let mut snapshots = Options::default();
        snapshots.set_compression_type(rocksdb::DBCompressionType::Lz4);
        let cfs = vec![
            ColumnFamilyDescriptor::new(CF_SNAPSHOTS, snapshots),
            ColumnFamilyDescriptor::new(CF_META, Options::default()),
        ];
        let db = DB::open_cf_descriptors(&options, &config.path, cfs)?;
        let mut write_options = WriteOptions::default();
        write_options.set_sync(config.fsync == FsyncPolicy::Always);
        // An older store is marked with this release's format before anything is written to
        // it, so that the releases that wrote it refuse it from then on.
        if existing != Some(STORE_FORMAT_VERSION) {
            let meta = db
                .cf_handle(CF_META)
                .ok_or_else(|| SnapshotError::Storage("column family meta missing".into()))?;
            let mut sync = WriteOptions::default();
            sync.set_sync(true);
            db.put_cf_opt(
                meta,
                FORMAT_VERSION_KEY,
                STORE_FORMAT_VERSION.to_be_bytes(),
                &sync,
            )?;
        }
        Ok(RocksSnapshotStore {
            inner: Arc::new(Inner { db, write_options }),
        })
    }

    fn blocking<T: Send + 'static>(
        &self,
        persistence_id: &str,
        work: impl FnOnce(&Inner) -> Result<T, SnapshotError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, SnapshotError>> {
        if let Err(e) = validate_persistence_id(persistence_id) {
            return futures::future::ready(Err(e)).boxed();
        }
        let inner = self.inner.clone();
        async move {
            tokio::task::spawn_blocking(move || work(&inner))
                .await
                .map_err(|e| SnapshotError::Storage(format!("snapshot task failed: {e}")))?
        }
        .boxed()
    }
}

impl SnapshotStore for RocksSnapshotStore {
    fn save(
        &self,
        metadata: SnapshotMetadata,
        manifest: Manifest,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<(), SnapshotError>> {
        let persistence_id = metadata.persistence_id.clone();
        self.blocking(&persistence_id, move |inner| {
            inner.save(&metadata, &manifest, &payload)
        })
    }

    fn load(
        &self,
        persistence_id: &str,
        criteria: SnapshotSelectionCriteria,
    ) -> BoxFuture<'static, Result<Option<Snapshot>, SnapshotError>> {
        let pid = persistence_id.to_string();
        self.blocking(persistence_id, move |inner| inner.load(&pid, &criteria))
    }

    fn delete(
        &self,
        persistence_id: &str,
        sequence_nr: u64,
    ) -> BoxFuture<'static, Result<(), SnapshotError>> {
        let key = snapshot_key(persistence_id, sequence_nr);
        self.blocking(persistence_id, move |inner| {
            inner
                .db
                .delete_cf_opt(inner.snapshots()?, key, &inner.write_options)?;
            Ok(())
        })
    }

    fn delete_matching(
        &self,
        persistence_id: &str,
        criteria: SnapshotSelectionCriteria,
    ) -> BoxFuture<'static, Result<(), SnapshotError>> {
        let pid = persistence_id.to_string();
        self.blocking(persistence_id, move |inner| {
            inner.delete_matching(&pid, &criteria)
        })
    }
}
