//! The durable store of Distributed Data: keys matching the configured patterns are written
//! here (fsynced) before an update of them is acknowledged, and loaded at start, so they
//! survive a restart of the whole cluster. One RocksDB database; values are sealed records
//! (format version + blake3 checksum, see `tessera_storage`) around the envelope's
//! versioned encoding.

use crate::codec;
use crate::envelope::DataEnvelope;
use rocksdb::{ColumnFamilyDescriptor, DB, Options, WriteBatch, WriteOptions};
use std::path::{Path, PathBuf};
use tessera_storage::{self as storage, FORMAT_VERSION_KEY, StoreFormatError};

/// The store format version this release writes.
pub const STORE_FORMAT_VERSION: u32 = 1;
const RECORD_FORMAT_VERSION: u8 = 1;
const CF_DATA: &str = "data";
const CF_META: &str = "meta";

/// What can go wrong with the durable store.
#[derive(Debug, thiserror::Error)]
pub enum DurableStoreError {
    #[error(transparent)]
    StoreFormat(#[from] StoreFormatError),
    /// A stored key failed its checksum or could not be decoded.
    #[error("corrupt durable key {key:?} in {path}: {detail}")]
    Corrupt {
        path: PathBuf,
        key: String,
        detail: String,
    },
    #[error("durable store at {path}: {detail}")]
    Storage { path: PathBuf, detail: String },
}

/// The RocksDB store of durable keys.
pub struct DurableStore {
    db: DB,
    path: PathBuf,
    sync: WriteOptions,
}

impl DurableStore {
    /// Opens (or creates) the store at `path`. A store of a newer format is refused without
    /// changing a byte.
    pub fn open(path: &Path) -> Result<Self, DurableStoreError> {
        let storage_error = |detail: String| DurableStoreError::Storage {
            path: path.to_path_buf(),
            detail,
        };
        std::fs::create_dir_all(path).map_err(|e| storage_error(e.to_string()))?;
        let existing =
            storage::check_store_format(path, "ddata", CF_META, &[CF_DATA], STORE_FORMAT_VERSION)?;
        let mut options = Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        options.set_wal_recovery_mode(rocksdb::DBRecoveryMode::PointInTime);
        let cfs = vec![
            ColumnFamilyDescriptor::new(CF_DATA, Options::default()),
            ColumnFamilyDescriptor::new(CF_META, Options::default()),
        ];
        let db = DB::open_cf_descriptors(&options, path, cfs)
            .map_err(|e| storage_error(e.to_string()))?;
        let mut sync = WriteOptions::default();
        sync.set_sync(true);
        let store = DurableStore {
            db,
            path: path.to_path_buf(),
            sync,
        };
        if existing.is_none() {
            let meta = store.cf(CF_META)?;
            store
                .db
                .put_cf_opt(
                    meta,
                    FORMAT_VERSION_KEY,
                    STORE_FORMAT_VERSION.to_be_bytes(),
                    &store.sync,
                )
                .map_err(|e| storage_error(e.to_string()))?;
        }
        Ok(store)
    }

    fn cf(&self, name: &str) -> Result<&rocksdb::ColumnFamily, DurableStoreError> {
        self.db
            .cf_handle(name)
            .ok_or_else(|| DurableStoreError::Storage {
                path: self.path.clone(),
                detail: format!("column family {name} missing"),
            })
    }

    /// Every stored key. A record that fails its checksum stops the load with an error naming
    /// the key: starting without it would silently forget acknowledged data.
    pub fn load_all(&self) -> Result<Vec<(String, DataEnvelope)>, DurableStoreError> {
        let mut entries = Vec::new();
        for item in self
            .db
            .iterator_cf(self.cf(CF_DATA)?, rocksdb::IteratorMode::Start)
        {
            let (key, value) = item.map_err(|e| DurableStoreError::Storage {
                path: self.path.clone(),
                detail: e.to_string(),
            })?;
            let name = String::from_utf8_lossy(&key).into_owned();
            let corrupt = |detail: String| DurableStoreError::Corrupt {
                path: self.path.clone(),
                key: name.clone(),
                detail,
            };
            let (_, body) = storage::unseal(RECORD_FORMAT_VERSION, &key, &value)
                .map_err(|e| corrupt(e.to_string()))?;
            let envelope: DataEnvelope =
                codec::decode("durable data envelope", body).map_err(|e| corrupt(e.to_string()))?;
            entries.push((name, envelope));
        }
        Ok(entries)
    }

    /// Writes the entries in one fsynced batch.
    pub fn store(&self, entries: &[(String, DataEnvelope)]) -> Result<(), DurableStoreError> {
        let cf = self.cf(CF_DATA)?;
        let mut batch = WriteBatch::default();
        for (key, envelope) in entries {
            let body = codec::encode("durable data envelope", envelope).map_err(|e| {
                DurableStoreError::Storage {
                    path: self.path.clone(),
                    detail: e.to_string(),
                }
            })?;
            batch.put_cf(
                cf,
                key.as_bytes(),
                storage::seal(RECORD_FORMAT_VERSION, key.as_bytes(), &body),
            );
        }
        self.db
            .write_opt(batch, &self.sync)
            .map_err(|e| DurableStoreError::Storage {
                path: self.path.clone(),
                detail: e.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PNCounter;
    use tessera_cluster::{Address, UniqueAddress};

    fn envelope(n: u64) -> DataEnvelope {
        let mut c = PNCounter::new();
        c.increment(&UniqueAddress::new(Address::new("h", 1), 1), n);
        DataEnvelope::new(c.into())
    }

    #[test]
    fn stored_keys_load_after_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let store = DurableStore::open(dir.path()).unwrap();
        store
            .store(&[
                ("a".into(), envelope(1)),
                ("b".into(), DataEnvelope::deleted()),
            ])
            .unwrap();
        store.store(&[("a".into(), envelope(2))]).unwrap();
        drop(store);
        let store = DurableStore::open(dir.path()).unwrap();
        let loaded = store.load_all().unwrap();
        assert_eq!(
            loaded,
            vec![
                ("a".into(), envelope(2)),
                ("b".into(), DataEnvelope::deleted())
            ]
        );
    }

    #[test]
    fn an_altered_record_stops_the_load_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = DurableStore::open(dir.path()).unwrap();
        store.store(&[("precious".into(), envelope(1))]).unwrap();
        let cf = store.cf(CF_DATA).unwrap();
        let mut value = store.db.get_cf(cf, b"precious").unwrap().unwrap();
        let last = value.len() - 1;
        value[last] ^= 1;
        store.db.put_cf(cf, b"precious", value).unwrap();
        let error = store.load_all().unwrap_err();
        assert!(error.to_string().contains("precious"), "{error}");
    }
}
