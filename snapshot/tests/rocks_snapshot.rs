//! Behaviour of the RocksDB snapshot store, and a property test against an in-memory model.

use bytes::Bytes;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;
use tessera_snapshot::{
    FsyncPolicy, Manifest, RocksSnapshotStore, STORE_FORMAT_VERSION, Snapshot, SnapshotConfig,
    SnapshotError, SnapshotMetadata, SnapshotSelectionCriteria as Criteria, SnapshotStore,
};
use tessera_storage as storage;

fn config(dir: &Path) -> SnapshotConfig {
    SnapshotConfig {
        path: dir.join("snapshots"),
        fsync: FsyncPolicy::Never,
    }
}

async fn open(dir: &Path) -> RocksSnapshotStore {
    RocksSnapshotStore::open(config(dir)).await.unwrap()
}

/// The database of a closed store at `path`, opened with RocksDB to alter or inspect it.
fn open_raw(path: &Path) -> rocksdb::DB {
    let cfs = rocksdb::DB::list_cf(&rocksdb::Options::default(), path).unwrap();
    rocksdb::DB::open_cf(&rocksdb::Options::default(), path, &cfs).unwrap()
}

/// The key of a snapshot: `len(persistence id) (u16 BE) ++ persistence id ++ sequence_nr
/// (u64 BE)`.
fn snapshot_key(persistence_id: &str, sequence_nr: u64) -> Vec<u8> {
    let mut key = (persistence_id.len() as u16).to_be_bytes().to_vec();
    key.extend_from_slice(persistence_id.as_bytes());
    key.extend_from_slice(&sequence_nr.to_be_bytes());
    key
}

/// A snapshot stored under `key` as the releases before record format 2 stored it, built by
/// hand: `[checksum: 16][1][postcard body]`, the checksum being the first 16 bytes of
/// BLAKE3's keyed hash of `1 || body`, keyed by the record key's length byte and bytes
/// zero-padded to 32 bytes (for keys under 32 bytes).
fn format_1_snapshot(
    key: &[u8],
    timestamp_ms: u64,
    manifest: &Manifest,
    payload: &[u8],
) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct StoredSnapshot<'a> {
        timestamp_ms: u64,
        manifest_type: &'a str,
        manifest_version: u32,
        payload: &'a [u8],
    }
    let body = postcard::to_allocvec(&StoredSnapshot {
        timestamp_ms,
        manifest_type: &manifest.type_name,
        manifest_version: manifest.version,
        payload,
    })
    .unwrap();
    assert!(key.len() < 32, "longer keys were hashed");
    let mut blake3_key = [0u8; 32];
    blake3_key[0] = key.len() as u8;
    blake3_key[1..=key.len()].copy_from_slice(key);
    let versioned_body = [&[1u8][..], &body].concat();
    let checksum = blake3::keyed_hash(&blake3_key, &versioned_body);
    [&checksum.as_bytes()[..16], &versioned_body].concat()
}

fn meta(pid: &str, sequence_nr: u64, timestamp_ms: u64) -> SnapshotMetadata {
    SnapshotMetadata {
        persistence_id: pid.into(),
        sequence_nr,
        timestamp_ms,
    }
}

async fn save(store: &RocksSnapshotStore, pid: &str, seq: u64, ts: u64) {
    store
        .save(
            meta(pid, seq, ts),
            Manifest::new("state", 1),
            Bytes::from(format!("{pid}@{seq}")),
        )
        .await
        .unwrap();
}

async fn loaded_seq(store: &RocksSnapshotStore, pid: &str, criteria: Criteria) -> Option<u64> {
    store
        .load(pid, criteria)
        .await
        .unwrap()
        .map(|s| s.metadata.sequence_nr)
}

#[tokio::test]
async fn latest_matching_snapshot_is_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    save(&store, "a", 10, 100).await;
    save(&store, "a", 20, 200).await;
    save(&store, "a", 30, 300).await;
    // A neighbouring id whose name extends "a" must not leak in.
    save(&store, "ab", 99, 999).await;

    let latest = store.load("a", Criteria::latest()).await.unwrap().unwrap();
    assert_eq!(latest.metadata, meta("a", 30, 300));
    assert_eq!(&latest.payload[..], b"a@30");
    assert_eq!(latest.manifest, Manifest::new("state", 1));
    assert_eq!(loaded_seq(&store, "a", Criteria::up_to(25)).await, Some(20));
    let by_time = Criteria {
        max_timestamp_ms: 150,
        ..Criteria::latest()
    };
    assert_eq!(loaded_seq(&store, "a", by_time).await, Some(10));
    let min_seq = Criteria {
        min_sequence_nr: 31,
        ..Criteria::latest()
    };
    assert_eq!(loaded_seq(&store, "a", min_seq).await, None);
    assert_eq!(loaded_seq(&store, "nobody", Criteria::latest()).await, None);
}

#[tokio::test]
async fn deletes_remove_one_or_by_criteria() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    for seq in [10, 20, 30, 40] {
        save(&store, "a", seq, seq * 10).await;
    }
    store.delete("a", 40).await.unwrap();
    assert_eq!(loaded_seq(&store, "a", Criteria::latest()).await, Some(30));
    store
        .delete_matching("a", Criteria::up_to(20))
        .await
        .unwrap();
    assert_eq!(loaded_seq(&store, "a", Criteria::up_to(29)).await, None);
    assert_eq!(loaded_seq(&store, "a", Criteria::latest()).await, Some(30));
    store.delete("a", 12345).await.unwrap();
}

#[tokio::test]
async fn snapshots_survive_reopening_and_saving_twice_replaces() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    save(&store, "a", 10, 1).await;
    store
        .save(
            meta("a", 10, 2),
            Manifest::new("state", 2),
            Bytes::from_static(b"again"),
        )
        .await
        .unwrap();
    drop(store);
    let store = open(dir.path()).await;
    let latest = store.load("a", Criteria::latest()).await.unwrap().unwrap();
    assert_eq!(&latest.payload[..], b"again");
    assert_eq!(latest.manifest.version, 2);
}

#[tokio::test]
async fn an_altered_snapshot_is_reported_with_its_id_and_sequence_nr() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    save(&store, "alice", 7, 1).await;
    drop(store);
    let path = config(dir.path()).path;
    {
        let db = open_raw(&path);
        let cf = db.cf_handle("snapshots").unwrap();
        let (key, value) = db
            .iterator_cf(cf, rocksdb::IteratorMode::Start)
            .next()
            .unwrap()
            .unwrap();
        let mut altered = value.to_vec();
        let last = altered.len() - 1;
        altered[last] ^= 0x10;
        db.put_cf(cf, key, altered).unwrap();
    }
    let store = open(dir.path()).await;
    let error = store.load("alice", Criteria::latest()).await.unwrap_err();
    // Caught by the checksum: the altered payload byte would decode.
    assert!(
        matches!(&error, SnapshotError::Corrupt { persistence_id, sequence_nr: 7, detail }
            if persistence_id == "alice" && detail.contains("checksum")),
        "{error:?}"
    );
    assert!(error.to_string().contains("alice#7"), "{error}");
}

#[tokio::test]
async fn a_snapshot_moved_under_another_key_is_reported_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    save(&store, "alice", 7, 1).await;
    save(&store, "alice", 8, 2).await;
    save(&store, "bob", 7, 1).await;
    drop(store);
    let path = config(dir.path()).path;
    {
        // alice's snapshot at 8 as her snapshot at 7, and as bob's: intact records, which
        // would decode, under keys not theirs.
        let db = open_raw(&path);
        let cf = db.cf_handle("snapshots").unwrap();
        let alice_8 = db.get_cf(cf, snapshot_key("alice", 8)).unwrap().unwrap();
        db.put_cf(cf, snapshot_key("alice", 7), &alice_8).unwrap();
        db.put_cf(cf, snapshot_key("bob", 7), &alice_8).unwrap();
    }
    let store = open(dir.path()).await;
    for pid in ["alice", "bob"] {
        let error = store.load(pid, Criteria::up_to(7)).await.unwrap_err();
        assert!(
            matches!(&error, SnapshotError::Corrupt { persistence_id, sequence_nr: 7, detail }
                if persistence_id == pid && detail.contains("checksum")),
            "{pid}: {error:?}"
        );
    }
}

#[tokio::test]
async fn a_snapshot_of_record_format_1_from_an_earlier_release_loads() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path()).await);
    let path = config(dir.path()).path;
    let key = snapshot_key("old", 5);
    {
        // The store as a release of store format 1 left it, with one of its snapshots.
        let db = open_raw(&path);
        db.put_cf(
            db.cf_handle("meta").unwrap(),
            storage::FORMAT_VERSION_KEY,
            1u32.to_be_bytes(),
        )
        .unwrap();
        let manifest = Manifest::new("state", 3);
        let value = format_1_snapshot(&key, 77, &manifest, b"old state");
        db.put_cf(db.cf_handle("snapshots").unwrap(), &key, value)
            .unwrap();
    }
    let store = open(dir.path()).await;
    let expected = Snapshot {
        metadata: meta("old", 5, 77),
        manifest: Manifest::new("state", 3),
        payload: Bytes::from_static(b"old state"),
    };
    assert_eq!(
        store.load("old", Criteria::latest()).await.unwrap(),
        Some(expected)
    );
    // Beside a snapshot of the current format, selected by its timestamp.
    save(&store, "old", 6, 80).await;
    let before_80 = Criteria {
        max_timestamp_ms: 79,
        ..Criteria::latest()
    };
    assert_eq!(loaded_seq(&store, "old", before_80).await, Some(5));
    assert_eq!(loaded_seq(&store, "old", Criteria::latest()).await, Some(6));
    drop(store);
    // Marked with this release's format, which the release of format 1 refuses.
    let db = open_raw(&path);
    let marker = db
        .get_cf(db.cf_handle("meta").unwrap(), storage::FORMAT_VERSION_KEY)
        .unwrap();
    assert_eq!(marker, Some(STORE_FORMAT_VERSION.to_be_bytes().to_vec()));
    // Its checksum is still checked.
    let mut altered = db
        .get_cf(db.cf_handle("snapshots").unwrap(), &key)
        .unwrap()
        .unwrap();
    let last = altered.len() - 1;
    altered[last] ^= 1;
    db.put_cf(db.cf_handle("snapshots").unwrap(), &key, altered)
        .unwrap();
    drop(db);
    let store = open(dir.path()).await;
    let error = store.load("old", Criteria::up_to(5)).await.unwrap_err();
    assert!(
        matches!(&error, SnapshotError::Corrupt { detail, .. } if detail.contains("checksum")),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_store_of_a_newer_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path()).await);
    let path = config(dir.path()).path;
    {
        let db = open_raw(&path);
        db.put_cf(
            db.cf_handle("meta").unwrap(),
            storage::FORMAT_VERSION_KEY,
            5u32.to_be_bytes(),
        )
        .unwrap();
    }
    let error = RocksSnapshotStore::open(config(dir.path()))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(
            error,
            SnapshotError::StoreFormat(storage::StoreFormatError::Newer { found: 5, .. })
        ),
        "{error:?}"
    );
}

#[tokio::test]
async fn invalid_persistence_ids_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    let long = "x".repeat(tessera_storage::MAX_NAME_BYTES + 1);
    for pid in ["", long.as_str()] {
        assert!(matches!(
            store.load(pid, Criteria::latest()).await,
            Err(SnapshotError::InvalidPersistenceId { .. })
        ));
        assert!(matches!(
            store
                .save(meta(pid, 1, 1), Manifest::new("s", 1), Bytes::new())
                .await,
            Err(SnapshotError::InvalidPersistenceId { .. })
        ));
    }
}

#[derive(Debug, Clone)]
enum Op {
    Save { pid: usize, seq: u64, ts: u64 },
    Load { pid: usize, criteria: Criteria },
    Delete { pid: usize, seq: u64 },
    DeleteMatching { pid: usize, criteria: Criteria },
    Reopen,
}

fn criteria() -> impl Strategy<Value = Criteria> {
    (0..12u64, 0..12u64, 0..12u64, 0..12u64, any::<bool>()).prop_map(
        |(a, b, c, d, unbounded_time)| Criteria {
            min_sequence_nr: a.min(b),
            max_sequence_nr: a.max(b),
            min_timestamp_ms: if unbounded_time { 0 } else { c.min(d) },
            max_timestamp_ms: if unbounded_time { u64::MAX } else { c.max(d) },
        },
    )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 0..12u64, 0..12u64).prop_map(|(pid, seq, ts)| Op::Save { pid, seq, ts }),
        3 => (0..3usize, criteria()).prop_map(|(pid, criteria)| Op::Load { pid, criteria }),
        1 => (0..3usize, 0..12u64).prop_map(|(pid, seq)| Op::Delete { pid, seq }),
        1 => (0..3usize, criteria()).prop_map(|(pid, criteria)| Op::DeleteMatching { pid, criteria }),
        1 => Just(Op::Reopen),
    ]
}

const PIDS: [&str; 3] = ["s", "s2", "t"];

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn snapshot_store_agrees_with_the_model(ops in proptest::collection::vec(op(), 1..30)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let dir = tempfile::tempdir().unwrap();
            let mut store = open(dir.path()).await;
            // pid -> seq -> timestamp
            let mut model: BTreeMap<&str, BTreeMap<u64, u64>> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Save { pid, seq, ts } => {
                        save(&store, PIDS[pid], seq, ts).await;
                        model.entry(PIDS[pid]).or_default().insert(seq, ts);
                    }
                    Op::Load { pid, criteria } => {
                        let got = store.load(PIDS[pid], criteria).await.unwrap()
                            .map(|s| (s.metadata.sequence_nr, s.metadata.timestamp_ms));
                        let want = model.get(PIDS[pid]).and_then(|snaps| {
                            snaps.iter().rev().find(|(s, t)| criteria.matches(**s, **t)).map(|(s, t)| (*s, *t))
                        });
                        prop_assert_eq!(got, want);
                    }
                    Op::Delete { pid, seq } => {
                        store.delete(PIDS[pid], seq).await.unwrap();
                        if let Some(snaps) = model.get_mut(PIDS[pid]) { snaps.remove(&seq); }
                    }
                    Op::DeleteMatching { pid, criteria } => {
                        store.delete_matching(PIDS[pid], criteria).await.unwrap();
                        if let Some(snaps) = model.get_mut(PIDS[pid]) {
                            snaps.retain(|s, t| !criteria.matches(*s, *t));
                        }
                    }
                    Op::Reopen => {
                        drop(store);
                        store = open(dir.path()).await;
                    }
                }
            }
            Ok(())
        })?;
    }
}
