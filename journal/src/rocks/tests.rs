//! Tests of how the journal uses RocksDB, which the public API does not show.

use super::RocksJournal;
use super::keys::CF_EVENTS;
use crate::{AtomicWrite, FsyncPolicy, Journal, JournalConfig, Manifest, NewEvent};
use futures::StreamExt;
use rand::{Rng, SeedableRng};

const EVENTS: u64 = 400;
const PAYLOAD_BYTES: usize = 1024;

/// A journal holding `EVENTS` events of incompressible payloads in one log, flushed to a table
/// file so that reading them goes through the block cache (or around it).
async fn journal_with_flushed_log(dir: &std::path::Path) -> RocksJournal {
    let mut config = JournalConfig::new(dir);
    config.fsync = FsyncPolicy::Never;
    let journal = RocksJournal::open(config).await.unwrap();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let events = (1..=EVENTS)
        .map(|sequence_nr| NewEvent {
            sequence_nr,
            timestamp_ms: 0,
            manifest: Manifest::new("test.Event", 1),
            payload: (0..PAYLOAD_BYTES).map(|_| rng.random::<u8>()).collect(),
            tags: Vec::new(),
        })
        .collect();
    journal
        .append(AtomicWrite {
            persistence_id: "log".into(),
            writer_id: "writer".into(),
            events,
        })
        .await
        .unwrap();
    let shared = &journal.shared;
    shared.db.flush_cf(shared.cf(CF_EVENTS).unwrap()).unwrap();
    journal
}

fn events_cache_bytes(journal: &RocksJournal) -> u64 {
    let shared = &journal.shared;
    shared
        .db
        .property_int_value_cf(shared.cf(CF_EVENTS).unwrap(), "rocksdb.block-cache-usage")
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn a_replay_leaves_the_block_cache_to_other_reads() {
    let dir = tempfile::tempdir().unwrap();
    let journal = journal_with_flushed_log(dir.path()).await;
    let before = events_cache_bytes(&journal);

    let mut replay = journal.replay("log", 1, u64::MAX, u64::MAX);
    let mut replayed = 0;
    while let Some(event) = replay.next().await {
        assert_eq!(event.unwrap().payload.len(), PAYLOAD_BYTES);
        replayed += 1;
    }
    assert_eq!(replayed, EVENTS);
    let after_replay = events_cache_bytes(&journal);
    assert!(
        after_replay < before + 16 * 1024,
        "a replay of {EVENTS} KiB filled the block cache from {before} to {after_replay} bytes"
    );

    // Control: the same records read with RocksDB's default options do fill it.
    let shared = &journal.shared;
    let mut iter = shared.db.raw_iterator_cf(shared.cf(CF_EVENTS).unwrap());
    iter.seek_to_first();
    while iter.valid() {
        iter.next();
    }
    iter.status().unwrap();
    drop(iter);
    let after_scan = events_cache_bytes(&journal);
    assert!(
        after_scan > after_replay + EVENTS * PAYLOAD_BYTES as u64 / 2,
        "a scan with the cache filled took it only from {after_replay} to {after_scan} bytes"
    );
    journal.close().await;
}

#[tokio::test]
async fn index_and_filter_blocks_of_event_tables_stay_out_of_the_block_cache() {
    let dir = tempfile::tempdir().unwrap();
    let journal = journal_with_flushed_log(dir.path()).await;
    // Loaded with the table file when the flush opened it: in the cache they would be
    // about 3.5 KiB here, and a replay (which does not fill the cache) would read them
    // again for every log.
    let cached = events_cache_bytes(&journal);
    assert!(
        cached < 1024,
        "{cached} bytes of the events' block cache in use before anything was read"
    );
    journal.close().await;
}

fn one_event_write(persistence_id: &str, sequence_nr: u64) -> AtomicWrite {
    AtomicWrite {
        persistence_id: persistence_id.into(),
        writer_id: "writer".into(),
        events: vec![NewEvent {
            sequence_nr,
            timestamp_ms: 0,
            manifest: Manifest::new("test.Event", 1),
            payload: vec![1, 2, 3].into(),
            tags: Vec::new(),
        }],
    }
}

#[tokio::test]
async fn each_synced_group_commit_is_timed_and_unsynced_ones_are_not() {
    const NAME: &str = "fsync_seconds";
    let dir = tempfile::tempdir().unwrap();
    let synced = RocksJournal::open(JournalConfig::new(dir.path().join("synced")))
        .await
        .unwrap();
    for sequence_nr in 1..=3 {
        synced
            .append(one_event_write("log", sequence_nr))
            .await
            .unwrap();
    }
    let text = tessera_metrics::to_text(NAME, synced.fsync_durations());
    // One group commit per append: each waited for the one before.
    assert_eq!(tessera_metrics::count_in(&text, NAME), 3, "{text}");
    assert!(
        text.contains(&format!("{NAME}_bucket{{le=\"+Inf\"}} 3\n")),
        "{text}"
    );
    assert!(text.contains(&format!("{NAME}_sum ")), "{text}");

    let mut config = JournalConfig::new(dir.path().join("unsynced"));
    config.fsync = FsyncPolicy::Never;
    let unsynced = RocksJournal::open(config).await.unwrap();
    unsynced.append(one_event_write("log", 1)).await.unwrap();
    let text = tessera_metrics::to_text(NAME, unsynced.fsync_durations());
    assert_eq!(tessera_metrics::count_in(&text, NAME), 0, "{text}");
}

mod replica_progress {
    use super::super::keys::{self, CF_META};
    use super::super::{RocksJournal, replica};
    use crate::{FsyncPolicy, JournalConfig, StoredEvent};
    use bytes::Bytes;
    use tessera_cluster::Address;
    use tessera_replication::{
        Configuration, Entry, Epoch, LogSummary, Position, ReplicaId, Request, Response,
    };

    const LOG: &str = "account|x";

    async fn open(dir: &std::path::Path) -> RocksJournal {
        let mut config = JournalConfig::new(dir);
        config.fsync = FsyncPolicy::Never;
        config.replica_restart_wait = std::time::Duration::ZERO;
        RocksJournal::open(config).await.unwrap()
    }

    fn entry(seq: u64, epoch: Epoch) -> Entry<StoredEvent> {
        Entry {
            seq,
            epoch,
            payload: StoredEvent {
                timestamp_ms: 1,
                writer_id: "w".into(),
                manifest: "m".into(),
                manifest_version: 1,
                payload: Bytes::from(vec![seq as u8]),
                tags: Vec::new(),
            },
        }
    }

    async fn located(journal: &RocksJournal) -> LogSummary {
        match journal.replica_apply(LOG, Request::Locate).await.unwrap() {
            Response::Located {
                summary: Some(summary),
                ..
            } => summary,
            other => panic!("Locate answered {other:?}"),
        }
    }

    async fn append(journal: &RocksJournal, epoch: Epoch, prev: u64, seqs: &[u64], lac: u64) {
        let config = Configuration::new(1, vec![ReplicaId::new(Address::new("a", 1), 1)]);
        let request = Request::Append {
            epoch,
            prev: Position::new(prev, if prev == 0 { Epoch::ZERO } else { epoch }),
            entries: seqs.iter().map(|&seq| entry(seq, epoch)).collect(),
            lac,
            config: (prev == 0).then_some(config),
        };
        let answer = journal.replica_apply(LOG, request).await.unwrap();
        assert!(
            matches!(answer, Response::Appended { .. }),
            "append after {prev}: {answer:?}"
        );
    }

    /// A replica's last entry and mark travel in the log record with every write; the
    /// replica record keeps the rest. A store of format 5 has them only in the replica
    /// record (and a log record without progress): it reads them from there, and its next
    /// write moves them to the log record.
    #[tokio::test]
    async fn a_replicas_progress_is_read_from_either_record() {
        let dir = tempfile::tempdir().unwrap();
        let epoch = Epoch {
            counter: 1,
            writer: 7,
        };
        let journal = open(dir.path()).await;
        let prepared = journal
            .replica_apply(LOG, Request::Prepare { epoch })
            .await
            .unwrap();
        assert!(
            matches!(prepared, Response::Promised { .. }),
            "{prepared:?}"
        );
        append(&journal, epoch, 0, &[1, 2, 3], 0).await;
        append(&journal, epoch, 3, &[4], 3).await;
        let written = located(&journal).await;
        assert_eq!((written.last, written.lac), (Position::new(4, epoch), 3));
        assert!(written.config.is_some());

        // The replica record was written with the first append only: its own last entry
        // and mark are those of then, the log record's are current.
        let shared = journal.shared.clone();
        let log = super::super::reader::log_of(&shared, LOG).unwrap().unwrap();
        let stored = replica::stored_meta(&shared, log.pid_num).unwrap().unwrap();
        assert_eq!((stored.last, stored.lac), (Position::new(3, epoch), 0));
        assert_eq!(
            log.progress,
            Some(keys::ReplicaProgress {
                last: Position::new(4, epoch),
                lac: 3
            })
        );

        // As store format 5 left it: the whole state in the replica record, a log record
        // without progress.
        let mut format_5 = replica::meta_or_legacy(Some(stored), &log).unwrap();
        assert_eq!((format_5.last, format_5.lac), (Position::new(4, epoch), 3));
        format_5.lac = 2;
        let meta_cf = shared.cf(CF_META).unwrap();
        shared
            .db
            .put_cf(
                meta_cf,
                keys::replica_key(log.pid_num),
                replica::encode_meta(&format_5).unwrap(),
            )
            .unwrap();
        shared
            .db
            .put_cf(
                meta_cf,
                keys::pid_key(LOG),
                keys::encode_log(log.pid_num, log.state, None).as_slice(),
            )
            .unwrap();
        drop(shared);
        journal.close().await;

        let journal = open(dir.path()).await;
        let reopened = located(&journal).await;
        assert_eq!((reopened.last, reopened.lac), (Position::new(4, epoch), 2));
        append(&journal, epoch, 4, &[5], 4).await;
        journal.close().await;
        let journal = open(dir.path()).await;
        let after = located(&journal).await;
        assert_eq!((after.last, after.lac), (Position::new(5, epoch), 4));
        assert_eq!(after.config, written.config);
    }
}
