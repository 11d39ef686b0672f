//! Behaviour of the RocksDB journal: appends, replay, deletes, queries, live queries,
//! reopening, and the typed errors for bad input and altered or newer data.

mod common;

use common::{collect, config, event, open, open_raw, write};
use futures::StreamExt;
use std::time::Duration;
use tessera_journal::{
    AtomicWrite, Journal, JournalError, MAX_NAME_BYTES, Manifest, PersistentRepr, QueryMode,
    RECORD_FORMAT_VERSION, RocksJournal, STORE_FORMAT_VERSION, event_key, rocksdb_options, storage,
};

/// `body` stored under `key` sealed as a record of format `version` with keyed BLAKE3, built
/// by hand as the releases before record format 3 sealed it: the first 16 bytes of BLAKE3's
/// keyed hash of `version || body`, keyed by the record key's length byte and bytes
/// zero-padded to 32 bytes (event keys are 16 bytes), then the version and the body.
fn sealed_with_blake3(version: u8, key: &[u8], body: &[u8]) -> Vec<u8> {
    assert!(key.len() < 32, "longer keys were hashed");
    let mut blake3_key = [0u8; 32];
    blake3_key[0] = key.len() as u8;
    blake3_key[1..=key.len()].copy_from_slice(key);
    let versioned_body = [&[version][..], body].concat();
    let checksum = blake3::keyed_hash(&blake3_key, &versioned_body);
    [&checksum.as_bytes()[..16], &versioned_body].concat()
}

/// The sealed value of `event` with `tags` (stored under `key`, at `offset` in the tag order)
/// in record format 1, laid out by hand as the releases before format 2 wrote it.
fn format_1_record(key: &[u8], offset: u64, event: &PersistentRepr, tags: &[String]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&offset.to_le_bytes());
    body.extend_from_slice(&event.timestamp_ms.to_le_bytes());
    body.extend_from_slice(&event.manifest.version.to_le_bytes());
    let names = [&*event.writer_id, &*event.manifest.type_name];
    for name in names {
        body.extend_from_slice(&(name.len() as u16).to_le_bytes());
        body.extend_from_slice(name.as_bytes());
    }
    body.extend_from_slice(&(tags.len() as u16).to_le_bytes());
    for tag in tags {
        body.extend_from_slice(&(tag.len() as u16).to_le_bytes());
        body.extend_from_slice(tag.as_bytes());
    }
    body.extend_from_slice(&event.payload);
    sealed_with_blake3(1, key, &body)
}

/// The sealed value of `event` with `tags` (stored under `key`, at `offset` in the tag order)
/// in record format 2, laid out by hand as the releases before format 3 wrote it: the body of
/// format 3 (LEB128 varints, the offset only if tagged), with keyed BLAKE3.
fn format_2_record(key: &[u8], offset: u64, event: &PersistentRepr, tags: &[String]) -> Vec<u8> {
    fn varint(out: &mut Vec<u8>, mut value: u64) {
        while value >= 0x80 {
            out.push(value as u8 | 0x80);
            value >>= 7;
        }
        out.push(value as u8);
    }
    fn name(out: &mut Vec<u8>, name: &str) {
        varint(out, name.len() as u64);
        out.extend_from_slice(name.as_bytes());
    }
    let mut body = Vec::new();
    varint(&mut body, tags.len() as u64);
    if !tags.is_empty() {
        varint(&mut body, offset);
    }
    varint(&mut body, event.timestamp_ms);
    varint(&mut body, u64::from(event.manifest.version));
    name(&mut body, &event.writer_id);
    name(&mut body, &event.manifest.type_name);
    for tag in tags {
        name(&mut body, tag);
    }
    body.extend_from_slice(&event.payload);
    sealed_with_blake3(2, key, &body)
}

/// The record format that seals records as `version`, with xxh3 as this release does (for
/// its own version, or to play a newer release).
fn written_as(version: u8) -> storage::RecordFormat {
    storage::RecordFormat::new(version, version)
}

fn seqs(events: &[tessera_journal::PersistentRepr]) -> Vec<u64> {
    events.iter().map(|e| e.sequence_nr).collect()
}

/// The sequence numbers of a whole replay of `pid`.
async fn replayed_seqs(journal: &RocksJournal, pid: &str) -> Vec<u64> {
    let events = collect(journal.replay(pid, 1, u64::MAX, u64::MAX))
        .await
        .unwrap();
    seqs(&events)
}

#[tokio::test]
async fn appended_events_replay_in_order_with_their_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).await;
    journal.append(write("a", 1, 3)).await.unwrap();
    journal.append(write("a", 4, 20)).await.unwrap();
    journal.append(write("b", 1, 1)).await.unwrap();

    let events = collect(journal.replay("a", 1, u64::MAX, u64::MAX))
        .await
        .unwrap();
    assert_eq!(seqs(&events), (1..=20).collect::<Vec<_>>());
    let e = &events[4];
    assert_eq!(&*e.persistence_id, "a");
    assert_eq!(&e.payload[..], b"a-5");
    assert_eq!(&*e.writer_id, "writer-1");
    assert_eq!(e.timestamp_ms, 1_700_000_000_005);
    assert_eq!(&*e.manifest.type_name, "test.Event");
    assert_eq!(journal.highest_sequence_nr("a").await.unwrap(), 20);
    assert_eq!(journal.highest_sequence_nr("b").await.unwrap(), 1);
    assert_eq!(journal.highest_sequence_nr("nobody").await.unwrap(), 0);
    journal.close().await;
}

#[tokio::test]
async fn replay_honours_range_and_maximum() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).await;
    journal.append(write("a", 1, 30)).await.unwrap();
    let ranged = collect(journal.replay("a", 5, 17, u64::MAX)).await.unwrap();
    assert_eq!(seqs(&ranged), (5..=17).collect::<Vec<_>>());
    let capped = collect(journal.replay("a", 5, 17, 9)).await.unwrap();
    assert_eq!(seqs(&capped), (5..=13).collect::<Vec<_>>());
    assert!(
        collect(journal.replay("a", 5, 17, 0))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        collect(journal.replay("a", 31, 40, 10))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        collect(journal.replay("zz", 1, 40, 10))
            .await
            .unwrap()
            .is_empty()
    );
    journal.close().await;
}

#[tokio::test]
async fn a_finished_replay_stays_finished_when_polled_again() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).await;
    journal.append(write("a", 1, 3)).await.unwrap();
    for persistence_id in ["a", "never-written"] {
        let mut replay = journal.replay(persistence_id, 1, u64::MAX, u64::MAX);
        while let Some(event) = replay.next().await {
            event.unwrap();
        }
        assert!(replay.next().await.is_none(), "{persistence_id}");
        assert!(replay.next().await.is_none(), "{persistence_id}");
    }
    journal.close().await;
}

#[tokio::test]
async fn wrong_sequence_numbers_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).await;
    journal.append(write("a", 1, 3)).await.unwrap();

    let gap = journal.append(write("a", 5, 6)).await.unwrap_err();
    assert!(
        matches!(
            &gap,
            JournalError::SequenceMismatch {
                expected: 4,
                got: 5,
                ..
            }
        ),
        "{gap:?}"
    );
    assert!(gap.to_string().contains("a"), "{gap}");
    let reused = journal.append(write("a", 3, 4)).await.unwrap_err();
    assert!(matches!(
        reused,
        JournalError::SequenceMismatch {
            expected: 4,
            got: 3,
            ..
        }
    ));
    let fresh = journal.append(write("new", 2, 2)).await.unwrap_err();
    assert!(matches!(
        fresh,
        JournalError::SequenceMismatch {
            expected: 1,
            got: 2,
            ..
        }
    ));

    let mut non_consecutive = write("a", 4, 5);
    non_consecutive.events[1].sequence_nr = 7;
    assert!(matches!(
        journal.append(non_consecutive).await.unwrap_err(),
        JournalError::NonConsecutive {
            previous: 4,
            got: 7,
            ..
        }
    ));
    let empty = AtomicWrite {
        events: vec![],
        ..write("a", 1, 1)
    };
    assert!(matches!(
        journal.append(empty).await.unwrap_err(),
        JournalError::EmptyWrite { .. }
    ));
    assert!(matches!(
        journal.append(write("", 1, 1)).await.unwrap_err(),
        JournalError::InvalidName {
            what: "persistence id",
            ..
        }
    ));
    let mut long_manifest = write("a", 4, 4);
    long_manifest.events[0].manifest = Manifest::new("m".repeat(MAX_NAME_BYTES + 1), 1);
    assert!(matches!(
        journal.append(long_manifest).await.unwrap_err(),
        JournalError::InvalidName {
            what: "manifest",
            ..
        }
    ));

    assert_eq!(journal.highest_sequence_nr("a").await.unwrap(), 3);
    assert_eq!(journal.highest_sequence_nr("new").await.unwrap(), 0);
    assert_eq!(replayed_seqs(&journal, "a").await, vec![1, 2, 3]);
    let ids = collect(journal.persistence_ids(QueryMode::Current))
        .await
        .unwrap();
    assert_eq!(ids, vec!["a"]);
    // The log continues where it was.
    journal.append(write("a", 4, 4)).await.unwrap();
    journal.close().await;
}

#[tokio::test]
async fn concurrent_writes_to_one_log_commit_exactly_one_per_sequence_number() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).await;
    // 50 writers race for sequence number 1..: exactly one wins each round.
    let mut wins = 0;
    for seq in 1..=20u64 {
        let attempts: Vec<_> = (0..50)
            .map(|_| journal.append(write("race", seq, seq)))
            .collect();
        let results = futures::future::join_all(attempts).await;
        let ok = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 1, "round {seq}: {results:?}");
        wins += ok;
    }
    assert_eq!(wins, 20);
    assert_eq!(journal.highest_sequence_nr("race").await.unwrap(), 20);
    journal.close().await;
}

#[tokio::test]
async fn delete_to_hides_events_and_keeps_the_highest_sequence_number() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).await;
    journal.append(write("a", 1, 40)).await.unwrap();
    journal.delete_to("a", 25).await.unwrap();
    assert_eq!(
        replayed_seqs(&journal, "a").await,
        (26..=40).collect::<Vec<_>>()
    );

    // Beyond the highest: capped, and the highest stays.
    journal.delete_to("a", 1_000).await.unwrap();
    assert!(
        collect(journal.replay("a", 1, u64::MAX, u64::MAX))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(journal.highest_sequence_nr("a").await.unwrap(), 40);
    // Deleting less than before, or an unknown log, is a no-op.
    journal.delete_to("a", 3).await.unwrap();
    journal.delete_to("nobody", 3).await.unwrap();
    // The log continues after the highest, not after the deleted ones.
    assert!(matches!(
        journal.append(write("a", 1, 1)).await.unwrap_err(),
        JournalError::SequenceMismatch { expected: 41, .. }
    ));
    journal.append(write("a", 41, 42)).await.unwrap();
    journal.close().await;

    let journal = open(dir.path()).await;
    assert_eq!(journal.highest_sequence_nr("a").await.unwrap(), 42);
    assert_eq!(replayed_seqs(&journal, "a").await, vec![41, 42]);
    journal.close().await;
}

#[tokio::test]
async fn delete_to_removes_events_and_tag_entries_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).await;
    let tagged = AtomicWrite {
        persistence_id: "a".into(),
        writer_id: "w".into(),
        events: (1..=30).map(|s| event(s, "x", &["green"])).collect(),
    };
    journal.append(tagged).await.unwrap();
    journal.delete_to("a", 20).await.unwrap();
    // Physical deletion runs between groups and is finished by close; then look at the raw
    // database.
    journal.close().await;

    let path = config(dir.path()).path;
    {
        let cfs = rocksdb::DB::list_cf(&rocksdb::Options::default(), &path).unwrap();
        let db =
            rocksdb::DB::open_cf_for_read_only(&rocksdb::Options::default(), &path, &cfs, false)
                .unwrap();
        let events = db.cf_handle("events").unwrap();
        let stored = db.iterator_cf(events, rocksdb::IteratorMode::Start).count();
        assert_eq!(stored, 10, "only events 21..=30 remain on disk");
        let index = db.cf_handle("tag_index").unwrap();
        let entries = db.iterator_cf(index, rocksdb::IteratorMode::Start).count();
        assert_eq!(entries, 10, "only their tag entries remain");
    }
    let journal = open(dir.path()).await;
    let green = collect(journal.events_by_tag("green", 0, QueryMode::Current))
        .await
        .unwrap();
    let green: Vec<u64> = green.iter().map(|e| e.event.sequence_nr).collect();
    assert_eq!(green, (21..=30).collect::<Vec<_>>());
    journal.close().await;
}

#[tokio::test]
async fn events_by_tag_are_in_commit_order_and_resume_after_an_offset() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).await;
    let tagged = |pid: &str, seq: u64, tags: &[&str]| AtomicWrite {
        persistence_id: pid.into(),
        writer_id: "w".into(),
        events: vec![event(seq, &format!("{pid}{seq}"), tags)],
    };
    journal.append(tagged("a", 1, &["red"])).await.unwrap();
    journal.append(tagged("b", 1, &["blue"])).await.unwrap();
    journal
        .append(tagged("b", 2, &["red", "blue"]))
        .await
        .unwrap();
    journal.append(tagged("a", 2, &[])).await.unwrap();
    for i in 3..=20 {
        journal.append(tagged("a", i, &["red"])).await.unwrap();
    }
    let red = collect(journal.events_by_tag("red", 0, QueryMode::Current))
        .await
        .unwrap();
    let order: Vec<(String, u64)> = red
        .iter()
        .map(|e| (e.event.persistence_id.to_string(), e.event.sequence_nr))
        .collect();
    assert_eq!(
        order[..3],
        [("a".into(), 1), ("b".into(), 2), ("a".into(), 3)]
    );
    assert_eq!(order.len(), 20);
    assert!(red.windows(2).all(|w| w[0].offset < w[1].offset));

    let resumed = collect(journal.events_by_tag("red", red[1].offset, QueryMode::Current))
        .await
        .unwrap();
    assert_eq!(resumed, red[2..].to_vec());
    assert!(
        collect(journal.events_by_tag("nothing", 0, QueryMode::Current))
            .await
            .unwrap()
            .is_empty()
    );
    journal.close().await;
}

#[tokio::test]
async fn persistence_ids_list_every_log_in_first_write_order() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).await;
    let names: Vec<String> = (0..20).map(|i| format!("log-{}", 19 - i)).collect();
    for name in &names {
        journal.append(write(name, 1, 1)).await.unwrap();
    }
    journal.delete_to(&names[0], 1).await.unwrap();
    let ids = collect(journal.persistence_ids(QueryMode::Current))
        .await
        .unwrap();
    assert_eq!(ids, names);
    journal.close().await;
}

async fn next<T>(stream: &mut tessera_journal::JournalStream<T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("live query delivers within 10 s")
        .expect("stream open")
        .expect("no error")
}

#[tokio::test]
async fn live_queries_stream_events_committed_later() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).await;
    journal.append(write("a", 1, 2)).await.unwrap();
    let mut by_pid = journal.events_by_persistence_id("a", 2, QueryMode::Live);
    let mut by_tag = journal.events_by_tag("t", 0, QueryMode::Live);
    let mut ids = journal.persistence_ids(QueryMode::Live);
    let e: tessera_journal::PersistentRepr = next(&mut by_pid).await;
    assert_eq!(e.sequence_nr, 2);
    assert_eq!(next(&mut ids).await, "a");

    journal.append(write("a", 3, 3)).await.unwrap();
    journal
        .append(AtomicWrite {
            persistence_id: "b".into(),
            writer_id: "w".into(),
            events: vec![event(1, "tagged", &["t"])],
        })
        .await
        .unwrap();
    let e: tessera_journal::PersistentRepr = next(&mut by_pid).await;
    assert_eq!(e.sequence_nr, 3);
    let tagged: tessera_journal::EventEnvelope = next(&mut by_tag).await;
    assert_eq!(&*tagged.event.persistence_id, "b");
    assert_eq!(next(&mut ids).await, "b");

    // Closing the journal ends live streams.
    journal.close().await;
    let end = tokio::time::timeout(Duration::from_secs(10), by_pid.next())
        .await
        .unwrap();
    assert!(end.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_query_read_ahead_in_many_chunks_misses_nothing_committed_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    // Every chunk but the first read ahead on the blocking pool, three events at a time.
    config.read_chunk_events = 3;
    config.inline_read_events = 0;
    let journal = std::sync::Arc::new(RocksJournal::open(config).await.unwrap());
    journal.append(write("a", 1, 50)).await.unwrap();
    let mut live = journal.events_by_persistence_id("a", 1, QueryMode::Live);
    let writer = {
        let journal = journal.clone();
        tokio::spawn(async move {
            for seq in 51..=200 {
                journal.append(write("a", seq, seq)).await.unwrap();
            }
        })
    };
    let mut seen = Vec::new();
    while seen.len() < 200 {
        let e: PersistentRepr = next(&mut live).await;
        assert_eq!(e.payload, format!("a-{}", e.sequence_nr).as_bytes());
        seen.push(e.sequence_nr);
    }
    writer.await.unwrap();
    assert_eq!(seen, (1..=200).collect::<Vec<_>>());
    drop(live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_dropped_while_its_reader_is_ahead_releases_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.read_chunk_events = 2;
    config.inline_read_events = 0;
    let journal = RocksJournal::open(config.clone()).await.unwrap();
    journal.append(write("a", 1, 500)).await.unwrap();
    let mut replay = journal.replay("a", 1, u64::MAX, u64::MAX);
    assert_eq!(replay.next().await.unwrap().unwrap().sequence_nr, 1);
    // The reader has read ahead and waits for room to hand over more chunks. Dropping the
    // stream must stop it: it holds the database open, and the store could not be opened
    // again while it does.
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(replay);
    journal.close().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let reopened = loop {
        match RocksJournal::open(config.clone()).await {
            Ok(journal) => break journal,
            Err(e) if tokio::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("the store is still held 10 s after its replay was dropped: {e}"),
        }
    };
    assert_eq!(
        replayed_seqs(&reopened, "a").await,
        (1..=500).collect::<Vec<_>>()
    );
    reopened.close().await;
}

/// A runtime with one worker and one blocking thread, on which a reader that waited for its
/// consumer would hold the whole blocking pool.
fn runtime_with_one_blocking_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// A journal whose replays read every chunk on the blocking pool, two events at a time, with
/// log "a" of 50 events.
async fn journal_reading_ahead_in_small_chunks(dir: &std::path::Path) -> RocksJournal {
    let mut config = config(dir);
    config.read_chunk_events = 2;
    config.inline_read_events = 0;
    let journal = RocksJournal::open(config).await.unwrap();
    journal.append(write("a", 1, 50)).await.unwrap();
    journal
}

#[test]
fn a_paused_replay_leaves_the_blocking_pool_to_others() {
    runtime_with_one_blocking_thread().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal_reading_ahead_in_small_chunks(dir.path()).await;
        let mut replay = journal.replay("a", 1, u64::MAX, u64::MAX);
        assert_eq!(replay.next().await.unwrap().unwrap().sequence_nr, 1);
        // The consumer pauses with 48 events still to read: the reader stops rather than
        // wait on the pool's only thread for it.
        let highest =
            tokio::time::timeout(Duration::from_secs(10), journal.highest_sequence_nr("a"))
                .await
                .expect("the blocking pool is free while a replay's consumer pauses")
                .unwrap();
        assert_eq!(highest, 50);
        let rest: Vec<u64> = replay.map(|e| e.unwrap().sequence_nr).collect().await;
        assert_eq!(rest, (2..=50).collect::<Vec<_>>());
        journal.close().await;
    });
}

#[test]
fn replays_taking_turns_on_one_blocking_thread_each_get_every_event_in_order() {
    runtime_with_one_blocking_thread().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let journal = journal_reading_ahead_in_small_chunks(dir.path()).await;
        // Each replay's reader finds the other's consumer behind, stops with a chunk left
        // over and is started again once its stream takes it.
        let mut replays = [
            journal.replay("a", 1, u64::MAX, u64::MAX),
            journal.replay("a", 1, u64::MAX, u64::MAX),
        ];
        let mut seen = [Vec::new(), Vec::new()];
        for _ in 0..50 {
            for (replay, seen) in replays.iter_mut().zip(seen.iter_mut()) {
                let event = tokio::time::timeout(Duration::from_secs(10), replay.next())
                    .await
                    .expect("a replay whose consumer takes turns goes on")
                    .unwrap()
                    .unwrap();
                assert_eq!(event.payload, format!("a-{}", event.sequence_nr).as_bytes());
                seen.push(event.sequence_nr);
            }
        }
        for (replay, seen) in replays.iter_mut().zip(&seen) {
            assert_eq!(seen, &(1..=50).collect::<Vec<_>>());
            assert!(replay.next().await.is_none());
        }
        drop(replays);
        journal.close().await;
    });
}

#[test]
fn a_runtime_holding_a_paused_replay_shuts_down() {
    // Dropping a runtime waits for its blocking tasks: a reader waiting for a consumer that
    // never comes back would keep it from ever finishing.
    let (done, finished) = std::sync::mpsc::channel();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    std::thread::spawn(move || {
        let runtime = runtime_with_one_blocking_thread();
        let (journal, replay) = runtime.block_on(async {
            let journal = journal_reading_ahead_in_small_chunks(&path).await;
            let mut replay = journal.replay("a", 1, u64::MAX, u64::MAX);
            assert_eq!(replay.next().await.unwrap().unwrap().sequence_nr, 1);
            (journal, replay)
        });
        drop(runtime);
        let _ = done.send(());
        drop(replay);
        let closing = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        closing.unwrap().block_on(journal.close());
    });
    finished
        .recv_timeout(Duration::from_secs(10))
        .expect("the runtime shut down while a replay it started was paused");
}

#[tokio::test]
async fn events_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).await;
    journal.append(write("a", 1, 5)).await.unwrap();
    journal
        .append(AtomicWrite {
            persistence_id: "b".into(),
            writer_id: "w".into(),
            events: vec![event(1, "x", &["t"])],
        })
        .await
        .unwrap();
    journal.close().await;
    let journal = open(dir.path()).await;
    assert_eq!(journal.highest_sequence_nr("a").await.unwrap(), 5);
    journal.append(write("a", 6, 6)).await.unwrap();
    // New pids, tags and offsets continue after the old ones.
    journal
        .append(AtomicWrite {
            persistence_id: "c".into(),
            writer_id: "w".into(),
            events: vec![event(1, "y", &["t"])],
        })
        .await
        .unwrap();
    let tagged = collect(journal.events_by_tag("t", 0, QueryMode::Current))
        .await
        .unwrap();
    assert_eq!(tagged.len(), 2);
    assert!(tagged[0].offset < tagged[1].offset);
    let ids = collect(journal.persistence_ids(QueryMode::Current))
        .await
        .unwrap();
    assert_eq!(ids, vec!["a", "b", "c"]);
    journal.close().await;
}

#[tokio::test]
async fn a_full_write_queue_refuses_writes_without_writing_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.write_queue_capacity = 1;
    cfg.fsync = tessera_journal::FsyncPolicy::Always;
    let journal = RocksJournal::open(cfg).await.unwrap();
    let pending: Vec<_> = (0..500)
        .map(|i| journal.append(write(&format!("p{i}"), 1, 1)))
        .collect();
    let results = futures::future::join_all(pending).await;
    let mut full = 0;
    for (i, result) in results.iter().enumerate() {
        let highest = journal.highest_sequence_nr(&format!("p{i}")).await.unwrap();
        match result {
            Ok(()) => assert_eq!(highest, 1),
            Err(JournalError::QueueFull { capacity: 1 }) => {
                full += 1;
                assert_eq!(highest, 0, "a refused write left nothing behind");
            }
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert!(
        full > 0,
        "500 writes into a queue of one: some must be refused"
    );
    journal.close().await;
}

/// Replays `persistence_id` from `from` up to the error it must end with: the sequence
/// numbers before it, and the error (after which the stream has ended).
async fn replay_until_error(
    journal: &RocksJournal,
    persistence_id: &str,
    from: u64,
) -> (Vec<u64>, JournalError) {
    let mut replay = journal.replay(persistence_id, from, u64::MAX, u64::MAX);
    let mut ok = Vec::new();
    let error = loop {
        match replay.next().await {
            Some(Ok(e)) => ok.push(e.sequence_nr),
            Some(Err(e)) => break e,
            None => panic!("replay of {persistence_id} from {from} must fail"),
        }
    };
    assert!(replay.next().await.is_none(), "an error ends the stream");
    (ok, error)
}

/// Alters one payload byte of event `sequence_nr` of pid number 1 with raw RocksDB.
fn alter_event(path: &std::path::Path, sequence_nr: u64) {
    let db = open_raw(path);
    let events = db.cf_handle("events").unwrap();
    let key = event_key(1, sequence_nr);
    let mut value = db.get_cf(events, key).unwrap().expect("event stored");
    let last = value.len() - 1;
    value[last] ^= 0x01;
    db.put_cf(events, key, value).unwrap();
}

/// Opens the journal in `dir` with replays reading `inline_read_events` in the consumer's
/// task and `read_chunk_events` per chunk; also names the case for assertion messages.
async fn open_chunked(
    dir: &std::path::Path,
    inline_read_events: usize,
    read_chunk_events: usize,
) -> (RocksJournal, String) {
    let mut config = config(dir);
    config.inline_read_events = inline_read_events;
    config.read_chunk_events = read_chunk_events;
    let journal = RocksJournal::open(config).await.unwrap();
    let case = format!("inline {inline_read_events}, chunk {read_chunk_events}");
    (journal, case)
}

/// Chunkings of a replay of 1,000 events: small chunks hand out payloads as slices of what
/// was read; a chunk larger than the payload arena copies them.
const SHARED_AND_COPIED_PAYLOADS: [(usize, usize); 2] = [(128, 16), (0, 1_024)];

/// Writes events 1 to 1,000 of `persistence_id` (the store's first log), then replaces event
/// 700 by `body` sealed as a record of the current format, with a checksum that matches it.
async fn log_with_sealed_body_at_700(dir: &std::path::Path, persistence_id: &str, body: &[u8]) {
    let journal = open(dir).await;
    journal
        .append(write(persistence_id, 1, 1_000))
        .await
        .unwrap();
    journal.close().await;
    let db = open_raw(&config(dir).path);
    let key = event_key(1, 700);
    db.put_cf(
        db.cf_handle("events").unwrap(),
        key,
        storage::seal(written_as(RECORD_FORMAT_VERSION), &key, body),
    )
    .unwrap();
}

#[tokio::test]
async fn replays_read_inline_or_on_the_blocking_pool_agree_up_to_an_altered_record() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).await;
    journal.append(write("alice", 1, 50)).await.unwrap();
    journal.close().await;
    alter_event(&config(dir.path()).path, 37);

    for inline_read_events in [0, 1, 7, 128] {
        for read_chunk_events in [1, 7, 16, 1_024] {
            let (journal, case) =
                open_chunked(dir.path(), inline_read_events, read_chunk_events).await;
            let before = collect(journal.replay("alice", 1, 36, u64::MAX))
                .await
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!(seqs(&before), (1..=36).collect::<Vec<_>>(), "{case}");
            assert!(
                before
                    .iter()
                    .all(|e| e.payload == format!("alice-{}", e.sequence_nr).as_bytes()),
                "{case}"
            );
            let (ok, error) = replay_until_error(&journal, "alice", 30).await;
            assert_eq!(ok, (30..=36).collect::<Vec<_>>(), "{case}");
            assert!(
                matches!(
                    &error,
                    JournalError::Corrupt {
                        sequence_nr: 37,
                        ..
                    }
                ),
                "{case}: {error:?}"
            );
            let after = collect(journal.replay("alice", 38, u64::MAX, u64::MAX))
                .await
                .unwrap();
            assert_eq!(seqs(&after), (38..=50).collect::<Vec<_>>(), "{case}");
            // From the start: every event before it still comes first.
            let (ok, error) = replay_until_error(&journal, "alice", 1).await;
            assert_eq!(ok, (1..=36).collect::<Vec<_>>(), "{case}");
            assert!(
                matches!(&error, JournalError::Corrupt { sequence_nr: 37, detail, .. }
                    if detail.contains("checksum")),
                "{case}: {error:?}"
            );
            journal.close().await;
        }
    }
}

#[tokio::test]
async fn a_record_that_passes_its_checksum_but_cannot_be_decoded_ends_the_replay_by_name() {
    let dir = tempfile::tempdir().unwrap();
    // A body of the current format cut off inside its first varint.
    log_with_sealed_body_at_700(dir.path(), "dave", &[0x80]).await;
    // Both ways of handing out payloads end at the record, after every event before it.
    for (inline_read_events, read_chunk_events) in SHARED_AND_COPIED_PAYLOADS {
        let (journal, case) = open_chunked(dir.path(), inline_read_events, read_chunk_events).await;
        let (ok, error) = replay_until_error(&journal, "dave", 1).await;
        assert_eq!(ok, (1..=699).collect::<Vec<_>>(), "{case}");
        assert!(
            matches!(&error, JournalError::Corrupt { persistence_id, sequence_nr: 700, detail }
                if persistence_id == "dave" && detail.contains("undecodable")),
            "{case}: {error:?}"
        );
        journal.close().await;
    }
}

#[tokio::test]
async fn a_replayed_record_decodes_alike_whether_its_payload_is_shared_or_copied() {
    let dir = tempfile::tempdir().unwrap();
    // A record with one tag that is not UTF-8 (no release writes one: tags are strings). A
    // replay skips tags, whichever way its chunk hands out payloads.
    let body = [
        0, // epoch counter (a record written by this node alone)
        1, // tag count
        5, // offset in the tag order
        0, // timestamp_ms
        1, // manifest version
        1, b'w', // writer id
        1, b'm', // manifest
        1, 0xff, // the tag
        b'x', // the payload
    ];
    log_with_sealed_body_at_700(dir.path(), "erin", &body).await;
    for (inline_read_events, read_chunk_events) in SHARED_AND_COPIED_PAYLOADS {
        let (journal, case) = open_chunked(dir.path(), inline_read_events, read_chunk_events).await;
        let events = collect(journal.replay("erin", 1, u64::MAX, u64::MAX))
            .await
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(seqs(&events), (1..=1_000).collect::<Vec<_>>(), "{case}");
        let odd = &events[699];
        assert_eq!(
            (
                &odd.payload[..],
                odd.writer_id.as_str(),
                odd.manifest.type_name.as_str()
            ),
            (&b"x"[..], "w", "m"),
            "{case}"
        );
        journal.close().await;
    }
}

#[tokio::test]
async fn large_and_small_records_replay_with_their_payloads_whatever_the_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).await;
    let big = |seq: u64| format!("{seq:04}").repeat(300);
    let events = (1..=80).map(|seq| event(seq, &big(seq), &[])).collect();
    journal
        .append(AtomicWrite {
            persistence_id: "big".into(),
            writer_id: "w".into(),
            events,
        })
        .await
        .unwrap();
    journal.append(write("small", 1, 80)).await.unwrap();
    journal.close().await;
    for read_chunk_events in [3, 100, 1_024] {
        let mut config = config(dir.path());
        config.read_chunk_events = read_chunk_events;
        let journal = RocksJournal::open(config).await.unwrap();
        let replayed = collect(journal.replay("big", 1, u64::MAX, u64::MAX))
            .await
            .unwrap();
        assert_eq!(seqs(&replayed), (1..=80).collect::<Vec<_>>());
        for e in &replayed {
            assert_eq!(
                e.payload,
                big(e.sequence_nr).as_bytes(),
                "chunk {read_chunk_events}"
            );
        }
        let replayed = collect(journal.replay("small", 1, u64::MAX, u64::MAX))
            .await
            .unwrap();
        for e in &replayed {
            assert_eq!(e.payload, format!("small-{}", e.sequence_nr).as_bytes());
        }
        journal.close().await;
    }
}

#[test]
fn a_short_replay_is_read_in_the_consumers_task_unless_configured_otherwise() {
    // One blocking thread, kept busy: a replay read on the blocking pool cannot make
    // progress, one read in the consumer's task can.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let journal = open(dir.path()).await;
        journal.append(write("a", 1, 5)).await.unwrap();
        journal.close().await;
        let mut inline = config(dir.path());
        inline.inline_read_events = 128;
        let inline = RocksJournal::open(inline).await.unwrap();
        let mut pooled = config(dir.path());
        pooled.path = dir.path().join("journal");
        pooled.inline_read_events = 0;

        let (release, released) = std::sync::mpsc::channel::<()>();
        let busy = tokio::task::spawn_blocking(move || released.recv());
        let events = tokio::time::timeout(
            Duration::from_secs(10),
            collect(inline.replay("a", 1, u64::MAX, u64::MAX)),
        )
        .await
        .expect("an inline replay does not need the blocking pool")
        .unwrap();
        assert_eq!(seqs(&events), vec![1, 2, 3, 4, 5]);
        release.send(()).unwrap();
        busy.await.unwrap().unwrap();
        inline.close().await;

        let pooled = RocksJournal::open(pooled).await.unwrap();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let busy = tokio::task::spawn_blocking(move || released.recv());
        let mut replay = pooled.replay("a", 1, u64::MAX, u64::MAX);
        assert!(
            tokio::time::timeout(Duration::from_millis(200), replay.next())
                .await
                .is_err(),
            "with inline_read_events = 0 every read waits for the blocking pool"
        );
        release.send(()).unwrap();
        busy.await.unwrap().unwrap();
        assert_eq!(replay.next().await.unwrap().unwrap().sequence_nr, 1);
        drop(replay);
        pooled.close().await;
    });
}

#[tokio::test]
async fn a_record_altered_in_place_is_reported_with_its_id_and_sequence_nr() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).await;
    journal.append(write("alice", 1, 5)).await.unwrap();
    journal.close().await;

    let path = config(dir.path()).path;
    let original = {
        // Flip one payload bit of event 3 (pid number 1) with raw RocksDB.
        let db = open_raw(&path);
        let events = db.cf_handle("events").unwrap();
        let key = event_key(1, 3);
        let original = db.get_cf(events, key).unwrap().expect("event 3 stored");
        let mut altered = original.clone();
        let last = altered.len() - 1;
        altered[last] ^= 0x01;
        db.put_cf(events, key, altered).unwrap();
        original
    };

    let journal = open(dir.path()).await;
    let (ok, error) = replay_until_error(&journal, "alice", 1).await;
    assert_eq!(ok, vec![1, 2]);
    // Caught by the record's checksum: the altered payload would decode.
    assert!(
        matches!(&error, JournalError::Corrupt { persistence_id, sequence_nr: 3, detail }
            if persistence_id == "alice" && detail.contains("checksum")),
        "{error:?}"
    );
    assert!(error.to_string().contains("alice#3"), "{error}");
    // Nothing was changed: the altered bytes are still there, the log is intact otherwise.
    assert_eq!(journal.highest_sequence_nr("alice").await.unwrap(), 5);
    journal.close().await;
    let cfs = rocksdb::DB::list_cf(&rocksdb::Options::default(), &path).unwrap();
    let db = rocksdb::DB::open_cf_for_read_only(&rocksdb::Options::default(), &path, &cfs, false)
        .unwrap();
    let stored = db
        .get_cf(db.cf_handle("events").unwrap(), event_key(1, 3))
        .unwrap()
        .unwrap();
    assert_ne!(stored, original);
    assert_eq!(stored.len(), original.len());
}

#[tokio::test]
async fn a_record_moved_under_another_key_is_reported_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).await;
    journal.append(write("alice", 1, 5)).await.unwrap();
    journal.append(write("bob", 1, 5)).await.unwrap();
    journal.close().await;
    let path = config(dir.path()).path;
    {
        // alice (log 1) gets her own event 4 as event 3, bob (log 2) alice's event 2 as his
        // event 2: intact records, each of which would decode, under keys not theirs.
        let db = open_raw(&path);
        let events = db.cf_handle("events").unwrap();
        let alice_4 = db.get_cf(events, event_key(1, 4)).unwrap().unwrap();
        let alice_2 = db.get_cf(events, event_key(1, 2)).unwrap().unwrap();
        db.put_cf(events, event_key(1, 3), alice_4).unwrap();
        db.put_cf(events, event_key(2, 2), alice_2).unwrap();
    }
    let journal = open(dir.path()).await;
    for (pid, moved_to) in [("alice", 3), ("bob", 2)] {
        let (ok, error) = replay_until_error(&journal, pid, 1).await;
        assert_eq!(ok, (1..moved_to).collect::<Vec<_>>(), "{pid}");
        assert!(
            matches!(&error, JournalError::Corrupt { persistence_id, sequence_nr, detail }
                if persistence_id == pid && *sequence_nr == moved_to
                    && detail.contains("checksum")),
            "{pid}: {error:?}"
        );
    }
    journal.close().await;
}

#[tokio::test]
async fn bytes_altered_in_a_table_file_are_reported_as_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).await;
    for seq in 1..=200 {
        journal.append(write("bob", seq, seq)).await.unwrap();
    }
    journal.close().await;
    let path = config(dir.path()).path;
    {
        let db = open_raw(&path);
        db.flush_cf(db.cf_handle("events").unwrap()).unwrap();
    }
    // The events table is the largest .sst file; its data blocks come first.
    let sst = std::fs::read_dir(&path)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "sst"))
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .expect("a table file");
    let mut bytes = std::fs::read(&sst).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&sst, &bytes).unwrap();

    let journal = open(dir.path()).await;
    let result = collect(journal.replay("bob", 1, u64::MAX, u64::MAX)).await;
    let error = result.expect_err("altered table bytes must not replay");
    assert!(
        matches!(&error, JournalError::Corrupt { persistence_id, .. } if persistence_id == "bob"),
        "{error:?}"
    );
    journal.close().await;
}

#[tokio::test]
async fn a_record_of_a_newer_format_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).await;
    journal.append(write("carol", 1, 2)).await.unwrap();
    journal.close().await;
    let path = config(dir.path()).path;
    {
        let db = open_raw(&path);
        let key = event_key(1, 2);
        db.put_cf(
            db.cf_handle("events").unwrap(),
            key,
            storage::seal(written_as(9), &key, b"from the future"),
        )
        .unwrap();
    }
    let journal = open(dir.path()).await;
    let error = collect(journal.replay("carol", 1, 2, 10))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            JournalError::NewerRecordVersion {
                sequence_nr: 2,
                found: 9,
                supported: RECORD_FORMAT_VERSION,
                ..
            }
        ),
        "{error:?}"
    );
    journal.close().await;
}

/// Makes a record of an earlier format from an event (stored under `key`, at `offset` in the
/// tag order, with `tags`).
type EarlierRecord = fn(&[u8], u64, &PersistentRepr, &[String]) -> Vec<u8>;

/// Writes 40 events of one log (some tagged), rewrites events 1..=30 with `earlier_record`
/// in a store marked with `store_format`, and checks that replays and queries by tag return
/// what was written, that the store is marked with this release's format once opened, and
/// that a physical delete finds the rewritten records' tag entries.
async fn records_of_an_earlier_format_are_read_beside_newer_ones(
    earlier_record: EarlierRecord,
    store_format: u32,
) {
    let dir = tempfile::tempdir().unwrap();
    // Chunks of up to 128 records (the first read inline), holding records of both formats.
    let mut wide = config(dir.path());
    wide.read_chunk_events = 1024;
    let journal = RocksJournal::open(wide.clone()).await.unwrap();
    // Events 1..=20 are large, so that a chunk holding them has its payloads copied out
    // (`decode_copied`); a chunk of the small ones shares its buffer (`decode_shared`).
    // Every third event is untagged.
    let events = (1..=40u64)
        .map(|seq| {
            let payload = if seq <= 20 {
                format!("d-{seq}-").repeat(1000)
            } else {
                format!("d-{seq}")
            };
            let tags: &[&str] = if seq % 3 == 0 {
                &[]
            } else {
                &["green", "blue"]
            };
            event(seq, &payload, tags)
        })
        .collect();
    let tagged = AtomicWrite {
        persistence_id: "d".into(),
        writer_id: "w".into(),
        events,
    };
    journal.append(tagged).await.unwrap();
    let written = collect(journal.replay("d", 1, u64::MAX, u64::MAX))
        .await
        .unwrap();
    let green = collect(journal.events_by_tag("green", 0, QueryMode::Current))
        .await
        .unwrap();
    journal.close().await;
    // Events 1..=30 rewritten in the earlier format, each with its offset in the tag order
    // (none for an untagged one), in a store marked as the release that wrote them marked it.
    {
        let db = open_raw(&wide.path);
        db.put_cf(
            db.cf_handle("meta").unwrap(),
            storage::FORMAT_VERSION_KEY,
            store_format.to_be_bytes(),
        )
        .unwrap();
        let events = db.cf_handle("events").unwrap();
        for event in &written[..30] {
            // Every tagged event has both tags, so the query by one finds all of them.
            let (offset, tags) = green
                .iter()
                .find(|e| e.event.sequence_nr == event.sequence_nr)
                .map_or((0, Vec::new()), |e| (e.offset, e.tags.clone()));
            let key = event_key(1, event.sequence_nr);
            db.put_cf(events, key, earlier_record(&key, offset, event, &tags))
                .unwrap();
        }
    }

    let journal = RocksJournal::open(wide.clone()).await.unwrap();
    let replayed = collect(journal.replay("d", 1, u64::MAX, u64::MAX))
        .await
        .unwrap();
    assert_eq!(replayed, written);
    let small = collect(journal.replay("d", 21, u64::MAX, u64::MAX))
        .await
        .unwrap();
    assert_eq!(small, written[20..]);
    let green_again = collect(journal.events_by_tag("green", 0, QueryMode::Current))
        .await
        .unwrap();
    assert_eq!(green_again, green);
    // A physical delete finds the tag entries of the earlier records through their offsets.
    journal.delete_to("d", 35).await.unwrap();
    journal.close().await;
    assert_eq!(
        format_and_legacy_states(&wide.path),
        (STORE_FORMAT_VERSION, 0),
        "marked with this release's format, which the release of format {store_format} refuses"
    );
    {
        let db = open_raw(&wide.path);
        let count = |cf: &str| {
            db.iterator_cf(db.cf_handle(cf).unwrap(), rocksdb::IteratorMode::Start)
                .count()
        };
        assert_eq!(count("events"), 5);
        assert_eq!(count("tag_index"), 6, "two tags of events 37, 38 and 40");
    }
}

#[tokio::test]
async fn records_of_format_1_are_read_beside_newer_ones_and_deleted_with_their_tag_entries() {
    // Store format 2 was the last to hold only records of format 1.
    records_of_an_earlier_format_are_read_beside_newer_ones(format_1_record, 2).await;
}

#[tokio::test]
async fn records_of_format_2_are_read_beside_format_3_and_deleted_with_their_tag_entries() {
    // Store format 3 was the last to hold no record of format 3.
    records_of_an_earlier_format_are_read_beside_newer_ones(format_2_record, 3).await;
}

#[tokio::test]
async fn a_store_of_a_newer_format_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).await;
    journal.append(write("a", 1, 3)).await.unwrap();
    journal.close().await;
    let path = config(dir.path()).path;
    {
        let db = open_raw(&path);
        db.put_cf(
            db.cf_handle("meta").unwrap(),
            storage::FORMAT_VERSION_KEY,
            (STORE_FORMAT_VERSION + 1).to_be_bytes(),
        )
        .unwrap();
        db.flush_cf(db.cf_handle("meta").unwrap()).unwrap();
    }
    let listing = |p: &std::path::Path| {
        let mut files: Vec<(String, u64)> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    e.metadata().unwrap().len(),
                )
            })
            .filter(|(name, _)| !name.starts_with("LOG"))
            .collect();
        files.sort();
        files
    };
    let before = listing(&path);
    let error = RocksJournal::open(config(dir.path()))
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(
            &error,
            JournalError::StoreFormat(storage::StoreFormatError::Newer {
                found,
                supported,
                ..
            }) if *found == STORE_FORMAT_VERSION + 1 && *supported == STORE_FORMAT_VERSION
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("newer"), "{error}");
    assert_eq!(
        listing(&path),
        before,
        "the refused store's files are unchanged"
    );
}

#[tokio::test]
async fn a_store_whose_creation_was_cut_short_opens_as_a_new_one() {
    // A crash after RocksDB created the database but before the journal recorded its format
    // leaves the column families without the format marker: the store must still open.
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    {
        let (options, cfs) = rocksdb_options(&config);
        rocksdb::DB::open_cf_descriptors(&options, &config.path, cfs).unwrap();
    }
    let journal = RocksJournal::open(config.clone())
        .await
        .expect("an empty store without its marker opens");
    journal.append(write("a", 1, 3)).await.unwrap();
    journal.close().await;
    let journal = RocksJournal::open(config).await.unwrap();
    assert_eq!(replayed_seqs(&journal, "a").await, [1, 2, 3]);
    journal.close().await;
}

/// Rewrites the metadata of a format-2 store as store format 1 wrote it: the `p` value of a
/// log holds its number alone, and its state lives under `s` ++ number.
fn downgrade_to_format_1(path: &std::path::Path, persistence_ids: &[&str]) {
    let db = open_raw(path);
    let meta = db.cf_handle("meta").unwrap();
    for pid in persistence_ids {
        let key = [b"p".as_slice(), pid.as_bytes()].concat();
        let value = db.get_cf(meta, &key).unwrap().unwrap();
        assert_eq!(value.len(), 24, "a format-2 value");
        db.put_cf(meta, &key, &value[..8]).unwrap();
        let state_key = [b"s".as_slice(), &value[..8]].concat();
        db.put_cf(meta, state_key, &value[8..]).unwrap();
    }
    db.put_cf(meta, storage::FORMAT_VERSION_KEY, 1u32.to_be_bytes())
        .unwrap();
    db.flush_cf(meta).unwrap();
}

/// The store format version and the number of format-1 state records of a closed store.
fn format_and_legacy_states(path: &std::path::Path) -> (u32, usize) {
    let db = open_raw(path);
    let meta = db.cf_handle("meta").unwrap();
    let version = db
        .get_cf(meta, storage::FORMAT_VERSION_KEY)
        .unwrap()
        .unwrap();
    let states = db
        .prefix_iterator_cf(meta, b"s")
        .map(|item| item.unwrap())
        .take_while(|(key, _)| key.starts_with(b"s"))
        .count();
    (u32::from_be_bytes(version[..].try_into().unwrap()), states)
}

#[tokio::test]
async fn a_store_of_format_1_is_read_and_upgraded() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path()).path;
    let journal = open(dir.path()).await;
    journal.append(write("a", 1, 10)).await.unwrap();
    journal.delete_to("a", 3).await.unwrap();
    journal
        .append(AtomicWrite {
            persistence_id: "b".into(),
            writer_id: "w".into(),
            events: vec![event(1, "b-1", &["green"]), event(2, "b-2", &["green"])],
        })
        .await
        .unwrap();
    journal
        .append(AtomicWrite {
            persistence_id: "c".into(),
            writer_id: "w".into(),
            events: (1..=4)
                .map(|seq| event(seq, &format!("c-{seq}"), &["red"]))
                .collect(),
        })
        .await
        .unwrap();
    journal.close().await;
    downgrade_to_format_1(&path, &["a", "b", "c"]);
    assert_eq!(format_and_legacy_states(&path), (1, 3));
    // Events of c up to 2 deleted logically, not yet physically, as format 1 recorded it.
    {
        let db = open_raw(&path);
        let meta = db.cf_handle("meta").unwrap();
        let pid_num = db.get_cf(meta, b"pc").unwrap().unwrap();
        let state = [4u64.to_be_bytes(), 2u64.to_be_bytes()].concat();
        db.put_cf(meta, [b"s".as_slice(), &pid_num].concat(), state)
            .unwrap();
        db.flush_cf(meta).unwrap();
    }

    let journal = open(dir.path()).await;
    // Everything reads as before the downgrade.
    assert_eq!(
        replayed_seqs(&journal, "a").await,
        (4..=10).collect::<Vec<_>>()
    );
    assert_eq!(journal.highest_sequence_nr("a").await.unwrap(), 10);
    assert_eq!(journal.highest_sequence_nr("b").await.unwrap(), 2);
    let green = collect(journal.events_by_tag("green", 0, QueryMode::Current))
        .await
        .unwrap();
    assert_eq!(green.len(), 2);
    let red = collect(journal.events_by_tag("red", 0, QueryMode::Current))
        .await
        .unwrap();
    let red: Vec<u64> = red.iter().map(|e| e.event.sequence_nr).collect();
    assert_eq!(red, vec![3, 4], "a format-1 state hides deleted events");
    assert_eq!(replayed_seqs(&journal, "c").await, vec![3, 4]);
    // A delete as the first write to a format-1 log replaces its state too.
    journal.delete_to("c", 3).await.unwrap();
    assert_eq!(replayed_seqs(&journal, "c").await, vec![4]);
    // A write continues the log and replaces its format-1 state; the other log keeps its own.
    let error = journal.append(write("a", 10, 10)).await.err().unwrap();
    assert!(
        matches!(error, JournalError::SequenceMismatch { expected: 11, .. }),
        "{error:?}"
    );
    journal.append(write("a", 11, 12)).await.unwrap();
    journal.delete_to("a", 5).await.unwrap();
    assert_eq!(
        replayed_seqs(&journal, "a").await,
        (6..=12).collect::<Vec<_>>()
    );
    journal.close().await;
    assert_eq!(format_and_legacy_states(&path), (STORE_FORMAT_VERSION, 1));

    let journal = open(dir.path()).await;
    assert_eq!(journal.highest_sequence_nr("a").await.unwrap(), 12);
    assert_eq!(replayed_seqs(&journal, "b").await, vec![1, 2]);
    journal.close().await;
}

#[tokio::test]
async fn invalid_configuration_is_refused_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.max_batch_writes = 0;
    let error = RocksJournal::open(cfg).await.err().unwrap();
    assert!(error.to_string().contains("max_batch_writes"), "{error}");
}

#[tokio::test]
async fn an_event_with_too_many_tags_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).await;
    let tags: Vec<String> = (0..=tessera_journal::MAX_TAGS_PER_EVENT)
        .map(|i| format!("t{i}"))
        .collect();
    let tag_refs: Vec<&str> = tags.iter().map(String::as_str).collect();
    let error = journal
        .append(AtomicWrite {
            persistence_id: "a".into(),
            writer_id: "w".into(),
            events: vec![event(1, "x", &tag_refs)],
        })
        .await
        .unwrap_err();
    assert!(
        matches!(error, JournalError::TooManyTags { sequence_nr: 1, .. }),
        "{error:?}"
    );
    assert_eq!(journal.highest_sequence_nr("a").await.unwrap(), 0);
    journal.close().await;
}
