//! Helpers shared by the journal's integration tests.
#![allow(dead_code)]

use bytes::Bytes;
use futures::StreamExt;
use std::path::Path;
use tessera_journal::{
    AtomicWrite, FsyncPolicy, JournalConfig, JournalError, JournalStream, Manifest, NewEvent,
    RocksJournal,
};

pub fn config(dir: &Path) -> JournalConfig {
    let mut config = JournalConfig::new(dir.join("journal"));
    // Tests check behaviour, not power-loss durability; `always` is exercised by the crash loop.
    config.fsync = FsyncPolicy::Never;
    config.read_chunk_events = 7;
    config
}

pub async fn open(dir: &Path) -> RocksJournal {
    RocksJournal::open(config(dir)).await.expect("open journal")
}

pub fn event(sequence_nr: u64, payload: &str, tags: &[&str]) -> NewEvent {
    NewEvent {
        sequence_nr,
        timestamp_ms: 1_700_000_000_000 + sequence_nr,
        manifest: Manifest::new("test.Event", 1),
        payload: Bytes::copy_from_slice(payload.as_bytes()),
        tags: tags.iter().map(|t| t.to_string()).collect(),
    }
}

/// A write of events `first..=last` to `pid` with payloads `"{pid}-{seq}"`.
pub fn write(pid: &str, first: u64, last: u64) -> AtomicWrite {
    AtomicWrite {
        persistence_id: pid.to_string(),
        writer_id: "writer-1".to_string(),
        events: (first..=last)
            .map(|seq| event(seq, &format!("{pid}-{seq}"), &[]))
            .collect(),
    }
}

pub async fn collect<T>(stream: JournalStream<T>) -> Result<Vec<T>, JournalError> {
    stream
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
}

/// The journal's database at `path` (a closed journal's), opened directly with RocksDB to
/// alter or inspect what is on disk.
pub fn open_raw(path: &Path) -> rocksdb::DB {
    let cfs = rocksdb::DB::list_cf(&rocksdb::Options::default(), path).unwrap();
    rocksdb::DB::open_cf(&rocksdb::Options::default(), path, &cfs).unwrap()
}
