//! The durable store of Distributed Data: keys matching the configured patterns are written
//! here (fsynced) before an update of them is acknowledged, and loaded at start, so they
//! survive a restart of the whole cluster. One RocksDB database; values are sealed records
//! (format version + checksum, see `tessera_storage`) around the envelope's versioned
//! encoding.

use crate::codec;
use crate::envelope::DataEnvelope;
use rocksdb::{ColumnFamilyDescriptor, DB, Options, WriteBatch, WriteOptions};
use std::path::{Path, PathBuf};
use tessera_storage::{
    self as storage, FORMAT_VERSION_KEY, FsyncPolicy, RecordFormat, StoreFormatError,
};

/// The store format version this release writes; stores with a higher one are refused, and
/// older ones are read and marked with this one when opened:
///
/// - 1: records of format 1;
/// - 2: records of format 2 too. A release of store format 1 would fail to load such a
///   record, and with it the whole store, at start; the store is marked 2 so that such a
///   release refuses it at open instead.
pub const STORE_FORMAT_VERSION: u32 = 2;

/// The record format this release writes; it reads this one and every earlier one. The body
/// is the envelope's encoding in both; format 1 is sealed with keyed BLAKE3, format 2 with
/// xxh3 (see [`RecordFormat`]).
const DURABLE_RECORDS: RecordFormat = RecordFormat::new(2, 2);
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
    /// Opens (or creates) the store at `path`, fsyncing every write. A store of a newer
    /// format is refused without changing a byte.
    pub fn open(path: &Path) -> Result<Self, DurableStoreError> {
        Self::open_with(path, FsyncPolicy::Always)
    }

    /// [`DurableStore::open`] with the durability of its writes given: a node always
    /// fsyncs; `Never` is for tests that show what a power cut does without it.
    pub fn open_with(path: &Path, fsync: FsyncPolicy) -> Result<Self, DurableStoreError> {
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
        sync.set_sync(fsync == FsyncPolicy::Always);
        let store = DurableStore {
            db,
            path: path.to_path_buf(),
            sync,
        };
        // An older store is marked with this release's format before anything is written to
        // it, so that the releases that wrote it refuse it from then on.
        if existing != Some(STORE_FORMAT_VERSION) {
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

    /// Calls `each` with every stored record's key and value, in key order.
    fn for_each_record(
        &self,
        mut each: impl FnMut(&[u8], &[u8]) -> Result<(), DurableStoreError>,
    ) -> Result<(), DurableStoreError> {
        for item in self
            .db
            .iterator_cf(self.cf(CF_DATA)?, rocksdb::IteratorMode::Start)
        {
            let (key, value) = item.map_err(|e| DurableStoreError::Storage {
                path: self.path.clone(),
                detail: e.to_string(),
            })?;
            each(&key, &value)?;
        }
        Ok(())
    }

    /// Every stored key. A record that fails its checksum stops the load with an error naming
    /// the key: starting without it would silently forget acknowledged data.
    pub fn load_all(&self) -> Result<Vec<(String, DataEnvelope)>, DurableStoreError> {
        let mut entries = Vec::new();
        self.for_each_record(|key, value| {
            let name = String::from_utf8_lossy(key).into_owned();
            let envelope =
                decode_record(key, value).map_err(|detail| DurableStoreError::Corrupt {
                    path: self.path.clone(),
                    key: name.clone(),
                    detail,
                })?;
            entries.push((name, envelope));
            Ok(())
        })?;
        Ok(entries)
    }

    /// The names of every stored key, without reading their values (a damaged record does
    /// not hide its key).
    pub fn keys(&self) -> Result<Vec<String>, DurableStoreError> {
        let mut keys = Vec::new();
        self.for_each_record(|key, _| {
            keys.push(String::from_utf8_lossy(key).into_owned());
            Ok(())
        })?;
        Ok(keys)
    }

    /// Removes the keys in one batch, fsynced like [`DurableStore::store`]. This forgets them
    /// outright (no tombstone): it is for a stopped node's store, cleared on every node.
    pub fn remove(&self, keys: &[String]) -> Result<(), DurableStoreError> {
        let cf = self.cf(CF_DATA)?;
        let mut batch = WriteBatch::default();
        for key in keys {
            batch.delete_cf(cf, key.as_bytes());
        }
        self.db
            .write_opt(batch, &self.sync)
            .map_err(|e| DurableStoreError::Storage {
                path: self.path.clone(),
                detail: e.to_string(),
            })
    }

    /// Writes the entries in one batch, fsynced (unless opened with `FsyncPolicy::Never`).
    pub fn store(&self, entries: &[(String, DataEnvelope)]) -> Result<(), DurableStoreError> {
        let cf = self.cf(CF_DATA)?;
        let mut batch = WriteBatch::default();
        for (key, envelope) in entries {
            let record = encode_record(key.as_bytes(), envelope).map_err(|detail| {
                DurableStoreError::Storage {
                    path: self.path.clone(),
                    detail,
                }
            })?;
            batch.put_cf(cf, key.as_bytes(), record);
        }
        self.db
            .write_opt(batch, &self.sync)
            .map_err(|e| DurableStoreError::Storage {
                path: self.path.clone(),
                detail: e.to_string(),
            })
    }
}

/// The sealed record of `envelope` stored under `key`.
pub(crate) fn encode_record(key: &[u8], envelope: &DataEnvelope) -> Result<Vec<u8>, String> {
    let body = codec::encode("durable data envelope", envelope).map_err(|e| e.to_string())?;
    Ok(seal_record(key, &body))
}

/// `body` sealed as a record of the current format stored under `key`.
pub(crate) fn seal_record(key: &[u8], body: &[u8]) -> Vec<u8> {
    storage::seal(DURABLE_RECORDS, key, body)
}

/// The envelope of the record `value` stored under `key`: checksum verified, then decoded.
pub(crate) fn decode_record(key: &[u8], value: &[u8]) -> Result<DataEnvelope, String> {
    let (_, body) = storage::unseal(DURABLE_RECORDS, key, value).map_err(|e| e.to_string())?;
    codec::decode("durable data envelope", body).map_err(|e| e.to_string())
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
    fn removed_keys_are_gone_after_reopening_and_the_others_stay() {
        let dir = tempfile::tempdir().unwrap();
        let store = DurableStore::open(dir.path()).unwrap();
        store
            .store(&[
                ("a".into(), envelope(1)),
                ("b".into(), envelope(2)),
                ("c".into(), DataEnvelope::deleted()),
            ])
            .unwrap();
        assert_eq!(store.keys().unwrap(), ["a", "b", "c"]);
        store
            .remove(&["a".into(), "c".into(), "absent".into()])
            .unwrap();
        drop(store);
        let store = DurableStore::open(dir.path()).unwrap();
        assert_eq!(store.keys().unwrap(), ["b"]);
        let loaded = store.load_all().unwrap();
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].1, envelope(2));
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
        // Caught by the checksum: the altered byte would decode.
        assert!(error.to_string().contains("checksum"), "{error}");
    }

    #[test]
    fn a_record_moved_under_another_key_stops_the_load() {
        let dir = tempfile::tempdir().unwrap();
        let store = DurableStore::open(dir.path()).unwrap();
        store
            .store(&[("a".into(), envelope(1)), ("b".into(), envelope(2))])
            .unwrap();
        let cf = store.cf(CF_DATA).unwrap();
        let a = store.db.get_cf(cf, b"a").unwrap().unwrap();
        store.db.put_cf(cf, b"b", a).unwrap();
        let error = store.load_all().unwrap_err();
        assert!(
            matches!(&error, DurableStoreError::Corrupt { key, detail, .. }
                if key == "b" && detail.contains("checksum")),
            "{error:?}"
        );
    }

    /// `body` stored under `key` as the releases before record format 2 stored it, built by
    /// hand: `[checksum: 16][1][body]`, the checksum being the first 16 bytes of BLAKE3's
    /// keyed hash of `1 || body`, keyed by the key's length byte and bytes zero-padded to 32
    /// bytes (for keys under 32 bytes).
    fn format_1_record(key: &[u8], body: &[u8]) -> Vec<u8> {
        assert!(key.len() < 32, "longer keys were hashed");
        let mut blake3_key = [0u8; 32];
        blake3_key[0] = key.len() as u8;
        blake3_key[1..=key.len()].copy_from_slice(key);
        let versioned_body = [&[1u8][..], body].concat();
        let checksum = blake3::keyed_hash(&blake3_key, &versioned_body);
        [&checksum.as_bytes()[..16], &versioned_body].concat()
    }

    #[test]
    fn records_of_format_1_from_an_earlier_release_load() {
        let dir = tempfile::tempdir().unwrap();
        {
            // The store as a release of store format 1 left it, with one of its records.
            let store = DurableStore::open(dir.path()).unwrap();
            let meta = store.cf(CF_META).unwrap();
            store
                .db
                .put_cf(meta, FORMAT_VERSION_KEY, 1u32.to_be_bytes())
                .unwrap();
            let body = codec::encode("durable data envelope", &envelope(5)).unwrap();
            let value = format_1_record(b"old", &body);
            store
                .db
                .put_cf(store.cf(CF_DATA).unwrap(), b"old", value)
                .unwrap();
        }
        let store = DurableStore::open(dir.path()).unwrap();
        store.store(&[("new".into(), envelope(6))]).unwrap();
        assert_eq!(
            store.load_all().unwrap(),
            vec![("new".into(), envelope(6)), ("old".into(), envelope(5))]
        );
        // Marked with this release's format, which the release of format 1 refuses.
        let marker = store
            .db
            .get_cf(store.cf(CF_META).unwrap(), FORMAT_VERSION_KEY);
        assert_eq!(
            marker.unwrap(),
            Some(STORE_FORMAT_VERSION.to_be_bytes().to_vec())
        );
        // Its checksum is still checked.
        let cf = store.cf(CF_DATA).unwrap();
        let mut altered = store.db.get_cf(cf, b"old").unwrap().unwrap();
        let last = altered.len() - 1;
        altered[last] ^= 1;
        store.db.put_cf(cf, b"old", altered).unwrap();
        let error = store.load_all().unwrap_err();
        assert!(
            matches!(&error, DurableStoreError::Corrupt { key, detail, .. }
                if key == "old" && detail.contains("checksum")),
            "{error:?}"
        );
    }
}
