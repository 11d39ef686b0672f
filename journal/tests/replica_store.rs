//! The journal as a replica store: every request of the replicated log protocol gets the
//! same answer from the RocksDB store as from the in-memory model log the simulation checks
//! (`tessera_replication::memory::MemoryLog`), and what is stored survives a reopen. Tags of
//! truncated entries leave the tag index; a log written before replication reads as one.

use bytes::Bytes;
use futures::StreamExt;
use proptest::prelude::*;
use tessera_cluster::Address;
use tessera_journal::{
    AtomicWrite, FsyncPolicy, Journal, JournalConfig, Manifest, NewEvent, QueryMode, RocksJournal,
    StoredEvent,
};
use tessera_replication::memory::{MemoryLog, ReadLimits};
use tessera_replication::replica::Rules;
use tessera_replication::{Configuration, Entry, Epoch, Position, ReplicaId, Request, Response};

const LOG: &str = "account|x";

fn config() -> Configuration {
    Configuration::new(1, vec![ReplicaId::new(Address::new("a", 1), 1)])
}

fn event(value: u8, tagged: bool) -> StoredEvent {
    StoredEvent {
        timestamp_ms: 7,
        writer_id: "w".into(),
        manifest: "m".into(),
        manifest_version: 1,
        payload: Bytes::from(vec![value]),
        tags: if tagged { vec!["t".into()] } else { Vec::new() },
    }
}

fn epoch(counter: u64) -> Epoch {
    Epoch {
        counter,
        writer: counter * 1_000 + 7,
    }
}

/// The store, reopened as the model log (which grants no leases) would be: no other process
/// writes its logs, so it needs no restart wait.
async fn open(dir: &std::path::Path) -> RocksJournal {
    let mut config = JournalConfig::new(dir);
    config.fsync = FsyncPolicy::Never;
    config.replica_restart_wait = std::time::Duration::ZERO;
    RocksJournal::open(config).await.unwrap()
}

/// A request the model and the store both get, built from random choices against the
/// model's state so that most are plausible (and some are not).
#[derive(Debug, Clone)]
enum Step {
    Prepare(u64),
    Append {
        epoch: u64,
        prev_back: u64,
        prev_epoch_from_log: bool,
        count: u8,
        lac: u64,
        with_config: bool,
    },
    Seal {
        epoch: u64,
        back: u64,
    },
    Delete {
        epoch: u64,
        to: u64,
    },
    Install {
        epoch: u64,
        ahead: u64,
    },
    Read {
        from: u64,
        count: u32,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (1u64..6).prop_map(Step::Prepare),
        6 => (1u64..6, 0u64..4, any::<bool>(), 0u8..4, 0u64..12, any::<bool>()).prop_map(
            |(epoch, prev_back, prev_epoch_from_log, count, lac, with_config)| Step::Append {
                epoch, prev_back, prev_epoch_from_log, count, lac, with_config
            }
        ),
        2 => (1u64..6, 0u64..3).prop_map(|(epoch, back)| Step::Seal { epoch, back }),
        1 => (1u64..6, 0u64..12).prop_map(|(epoch, to)| Step::Delete { epoch, to }),
        1 => (1u64..6, 0u64..6).prop_map(|(epoch, ahead)| Step::Install { epoch, ahead }),
        2 => (0u64..14, 1u32..6).prop_map(|(from, count)| Step::Read { from, count }),
    ]
}

/// The concrete request of a step, given the model's state.
fn request(step: &Step, model: &MemoryLog<StoredEvent>, counter: &mut u8) -> Request<StoredEvent> {
    let meta = model.meta.clone().unwrap_or_default();
    match *step {
        Step::Prepare(e) => Request::Prepare { epoch: epoch(e) },
        Step::Append {
            epoch: e,
            prev_back,
            prev_epoch_from_log,
            count,
            lac,
            with_config,
        } => {
            let prev_seq = meta.last.seq.saturating_sub(prev_back);
            let prev_epoch = if prev_epoch_from_log {
                model
                    .entries
                    .get(&prev_seq)
                    .map_or(meta.last.epoch, |e| e.epoch)
            } else {
                epoch(e)
            };
            let entries = (1..=u64::from(count))
                .map(|i| {
                    *counter = counter.wrapping_add(1);
                    Entry {
                        seq: prev_seq + i,
                        epoch: epoch(e),
                        payload: event(*counter, (*counter).is_multiple_of(3)),
                    }
                })
                .collect();
            Request::Append {
                epoch: epoch(e),
                prev: Position::new(prev_seq, prev_epoch),
                entries,
                lac,
                config: with_config.then(config),
            }
        }
        Step::Seal { epoch: e, back } => {
            let seq = meta.last.seq.saturating_sub(back);
            let at_epoch = model.entries.get(&seq).map_or(meta.last.epoch, |e| e.epoch);
            Request::Seal {
                epoch: epoch(e),
                at: Position::new(seq, at_epoch),
                config: config(),
            }
        }
        Step::Delete { epoch: e, to } => Request::DeleteTo {
            epoch: epoch(e),
            to,
        },
        Step::Install { epoch: e, ahead } => Request::Install {
            epoch: epoch(e),
            base: Position::new(meta.committed() + ahead, epoch(1)),
            config: config(),
        },
        Step::Read { from, count } => Request::Read {
            from,
            to: from + u64::from(count),
            max_entries: count,
            max_bytes: 1 << 20,
        },
    }
}

/// The store's answer with its storage id (Locate) normalised away.
fn normalise(response: Response<StoredEvent>) -> Response<StoredEvent> {
    match response {
        Response::Located { summary, .. } => Response::Located {
            storage_id: 0,
            summary,
        },
        other => other,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn the_rocksdb_replica_answers_like_the_model(steps in proptest::collection::vec(step(), 1..60)) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let mut journal = open(dir.path()).await;
            let mut model = MemoryLog::<StoredEvent>::default();
            let rules = Rules::default();
            let limits = ReadLimits { max_tail_entries: 1_000, max_bytes: 1 << 20 };
            let mut counter = 0u8;
            for (i, step) in steps.iter().enumerate() {
                let request = request(step, &model, &mut counter);
                let expected = model.handle(&rules, request.clone(), limits);
                let actual = journal.replica_apply(LOG, request.clone()).await.unwrap();
                prop_assert_eq!(normalise(actual), expected, "step {} {:?}", i, request);
                if i % 10 == 9 {
                    // What the store answered is durable: it answers the same after a reopen.
                    journal.close().await;
                    journal = open(dir.path()).await;
                }
            }
            // The entries and the state agree with the model's, read back whole.
            let located = journal.replica_apply(LOG, Request::Locate).await.unwrap();
            let model_located = model.handle(&rules, Request::Locate, limits);
            prop_assert_eq!(normalise(located), model_located);
            let read = journal
                .replica_apply(LOG, Request::Read { from: 0, to: u64::MAX, max_entries: 10_000, max_bytes: 1 << 30 })
                .await
                .unwrap();
            let model_read = model.handle(
                &rules,
                Request::Read { from: 0, to: u64::MAX, max_entries: 10_000, max_bytes: 1 << 30 },
                limits,
            );
            prop_assert_eq!(normalise(read), model_read);
            // The tag index holds exactly the tagged entries still stored (and not deleted).
            let base = model.meta.as_ref().map_or(0, |m| m.base.seq);
            let mut expected_tagged: Vec<u64> = model
                .entries
                .values()
                .filter(|e| !e.payload.tags.is_empty() && e.seq > base)
                .map(|e| e.seq)
                .collect();
            expected_tagged.sort_unstable();
            let mut tagged: Vec<u64> = journal
                .events_by_tag("t", 0, QueryMode::Current)
                .map(|e| e.unwrap().event.sequence_nr)
                .collect()
                .await;
            tagged.sort_unstable();
            prop_assert_eq!(tagged, expected_tagged);
            journal.close().await;
            Ok(())
        })?;
    }
}

/// The logs the group properties write.
const GROUP_LOGS: [&str; 3] = ["account|a", "account|b", "account|c"];
const GROUP_LIMITS: ReadLimits = ReadLimits {
    max_tail_entries: 1_000,
    max_bytes: 1 << 20,
};

/// One write of a group property: the log (an index into [`GROUP_LOGS`]), the request, and
/// the model's answer to it.
type GroupWrite = (usize, Request<StoredEvent>, Response<StoredEvent>);

/// The writes `steps` make, each with the answer the model gives when they are applied one
/// by one in that order, and the models after them all. Reads are left out: they do not go
/// through the writer, so they are not ordered with writes.
fn group_writes(steps: &[(usize, Step)]) -> (Vec<GroupWrite>, Vec<MemoryLog<StoredEvent>>) {
    let mut models: Vec<MemoryLog<StoredEvent>> = (0..GROUP_LOGS.len())
        .map(|_| MemoryLog::default())
        .collect();
    let mut counter = 0u8;
    let mut writes = Vec::new();
    for (log, step) in steps {
        if matches!(step, Step::Read { .. }) {
            continue;
        }
        let request = request(step, &models[*log], &mut counter);
        let expected = models[*log].handle(&Rules::default(), request.clone(), GROUP_LIMITS);
        writes.push((*log, request, expected));
    }
    (writes, models)
}

/// Every log of [`GROUP_LOGS`] reads whole from `journal` as from its model.
async fn assert_logs_read_as_models(
    journal: &RocksJournal,
    models: &[MemoryLog<StoredEvent>],
) -> Result<(), TestCaseError> {
    for (log, model) in GROUP_LOGS.iter().zip(models) {
        let whole = Request::Read {
            from: 0,
            to: u64::MAX,
            max_entries: 10_000,
            max_bytes: 1 << 30,
        };
        let read = journal.replica_apply(log, whole.clone()).await.unwrap();
        let mut model = MemoryLog {
            meta: model.meta.clone(),
            entries: model.entries.clone(),
        };
        prop_assert_eq!(
            normalise(read),
            model.handle(&Rules::default(), whole, GROUP_LIMITS)
        );
    }
    Ok(())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Requests for several logs sent together, unanswered: the writer thread takes them in
    /// order and groups them into batches (a log changed at most once per batch). Each gets
    /// the answer the model gives when they are applied one by one in that order.
    #[test]
    fn requests_for_many_logs_in_one_group_answer_as_one_by_one(
        steps in proptest::collection::vec((0usize..3, step()), 1..80)
    ) {
        runtime().block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let journal = open(dir.path()).await;
            let (writes, models) = group_writes(&steps);
            let sent: Vec<_> = writes
                .into_iter()
                .map(|(log, request, expected)| {
                    (journal.replica_apply(GROUP_LOGS[log], request.clone()), expected, request)
                })
                .collect();
            for (i, (answer, expected, request)) in sent.into_iter().enumerate() {
                let actual = answer.await.unwrap();
                prop_assert_eq!(normalise(actual), expected, "request {} {:?}", i, request);
            }
            assert_logs_read_as_models(&journal, &models).await?;
            journal.close().await;
            Ok(())
        })?;
    }

    /// The same, with the requests sent in batches (`replica_apply_many`, as a replica
    /// service passes on a message from a writer node) of random sizes, some for one log
    /// several times: each gets the answer it gets one by one, in order.
    #[test]
    fn batches_of_requests_answer_as_one_by_one(
        steps in proptest::collection::vec((0usize..3, step()), 1..80),
        cuts in proptest::collection::vec(1usize..12, 1..20),
    ) {
        runtime().block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let journal = open(dir.path()).await;
            let (writes, models) = group_writes(&steps);
            let mut sent = Vec::new();
            let mut rest = writes.as_slice();
            for cut in cuts.iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                let (batch, after) = rest.split_at((*cut).min(rest.len()));
                rest = after;
                let answers = journal.replica_apply_many(
                    batch
                        .iter()
                        .map(|(log, request, _)| (GROUP_LOGS[*log].to_string(), request.clone()))
                        .collect(),
                );
                sent.push((answers, batch.to_vec()));
            }
            for (answers, batch) in sent {
                let answers = answers.await;
                prop_assert_eq!(answers.len(), batch.len());
                for (answer, (log, request, expected)) in answers.into_iter().zip(batch) {
                    prop_assert_eq!(normalise(answer.unwrap()), expected, "{} {:?}", log, request);
                }
            }
            assert_logs_read_as_models(&journal, &models).await?;
            journal.close().await;
            Ok(())
        })?;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_keeps_its_storage_id_and_a_new_one_gets_another() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(&dir.path().join("a")).await;
    let id = journal.storage_id();
    journal.close().await;
    let journal = open(&dir.path().join("a")).await;
    assert_eq!(journal.storage_id(), id);
    let other = open(&dir.path().join("b")).await;
    assert_ne!(other.storage_id(), id);
    journal.close().await;
    other.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_written_before_replication_reads_as_acknowledged_entries_of_epoch_zero() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).await;
    let events = (1..=3)
        .map(|seq| NewEvent {
            sequence_nr: seq,
            timestamp_ms: 1,
            manifest: Manifest::new("m", 1),
            payload: Bytes::from_static(b"x"),
            tags: Vec::new(),
        })
        .collect();
    journal
        .append(AtomicWrite {
            persistence_id: LOG.into(),
            writer_id: "w".into(),
            events,
        })
        .await
        .unwrap();
    let Response::Located { summary, .. } =
        journal.replica_apply(LOG, Request::Locate).await.unwrap()
    else {
        panic!("not located");
    };
    let summary = summary.expect("the log is held");
    assert_eq!(summary.last, Position::new(3, Epoch::ZERO));
    assert_eq!(summary.lac, 3);
    assert!(summary.config.is_none());
    assert_eq!(summary.promise, Epoch::ZERO);
    // A writer takes it over: promise, then seal its last entry.
    let promised = journal
        .replica_apply(LOG, Request::Prepare { epoch: epoch(1) })
        .await
        .unwrap();
    assert!(
        matches!(promised, Response::Promised { .. }),
        "{promised:?}"
    );
    let sealed = journal
        .replica_apply(
            LOG,
            Request::Seal {
                epoch: epoch(1),
                at: Position::new(3, Epoch::ZERO),
                config: config(),
            },
        )
        .await
        .unwrap();
    assert!(matches!(sealed, Response::Sealed { .. }), "{sealed:?}");
    // Its events replay as before.
    let replayed: Vec<u64> = journal
        .replay(LOG, 1, u64::MAX, u64::MAX)
        .map(|e| e.unwrap().sequence_nr)
        .collect()
        .await;
    assert_eq!(replayed, vec![1, 2, 3]);
    journal.close().await;
}

/// A confirmation grants a read lease: another writer's prepare is held off until it ends,
/// and contesting it stops the lease from being extended; the lease holder's own next epoch
/// is not held off. A reopened store has forgotten its leases, so it holds off other writers
/// of the logs it holds for its restart wait, and promises a log it does not hold at once.
#[tokio::test]
async fn read_leases_hold_off_other_writers_also_across_a_reopen() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let restart_wait = Duration::from_millis(700);
    let open_waiting = |dir: std::path::PathBuf| async move {
        let mut config = JournalConfig::new(dir);
        config.fsync = FsyncPolicy::Never;
        config.replica_restart_wait = restart_wait;
        RocksJournal::open(config).await.unwrap()
    };
    let journal = open_waiting(dir.path().to_path_buf()).await;
    let first = epoch(1);
    let apply = |journal: &RocksJournal, log: &str, request| {
        let answer = journal.replica_apply(log, request);
        async move { answer.await.unwrap() }
    };
    // A store that held nothing promises at once.
    let promised = apply(&journal, LOG, Request::Prepare { epoch: first }).await;
    assert!(
        matches!(promised, Response::Promised { .. }),
        "{promised:?}"
    );
    let appended = apply(
        &journal,
        LOG,
        Request::Append {
            epoch: first,
            prev: Position::START,
            entries: vec![Entry {
                seq: 1,
                epoch: first,
                payload: event(1, false),
            }],
            lac: 0,
            config: Some(config()),
        },
    )
    .await;
    assert!(
        matches!(appended, Response::Appended { .. }),
        "{appended:?}"
    );
    let confirm = Request::Confirm {
        epoch: first,
        prev: Position::new(1, first),
        lac: 1,
        config: None,
        lease_ms: 60_000,
    };
    match apply(&journal, LOG, confirm.clone()).await {
        Response::Confirmed { lease_ms, summary } => {
            // Capped at what any replica grants.
            assert_eq!(
                u128::from(lease_ms),
                tessera_replication::replica::MAX_READ_LEASE.as_millis()
            );
            assert_eq!(summary.lac, 1);
        }
        other => panic!("a confirmation answered {other:?}"),
    }
    // Another writer waits for the lease; the holder's next confirmation is still taken,
    // without a lease, once another writer waits.
    match apply(&journal, LOG, Request::Prepare { epoch: epoch(2) }).await {
        Response::Leased { remaining_ms } => assert!(remaining_ms > 0),
        other => panic!("a prepare during a lease answered {other:?}"),
    }
    match apply(&journal, LOG, confirm).await {
        Response::Confirmed { lease_ms, .. } => assert_eq!(lease_ms, 0),
        other => panic!("a contested confirmation answered {other:?}"),
    }
    // The holder's own next epoch is promised: it gave up its lease by moving on.
    let own_next = Epoch {
        counter: 2,
        writer: first.writer,
    };
    let promised = apply(&journal, LOG, Request::Prepare { epoch: own_next }).await;
    assert!(
        matches!(promised, Response::Promised { .. }),
        "{promised:?}"
    );
    journal.close().await;

    let journal = open_waiting(dir.path().to_path_buf()).await;
    match apply(&journal, LOG, Request::Prepare { epoch: epoch(3) }).await {
        Response::Leased { remaining_ms } => {
            assert!(u128::from(remaining_ms) <= restart_wait.as_millis())
        }
        other => panic!("a prepare just after a reopen answered {other:?}"),
    }
    let unknown = apply(
        &journal,
        "account|new",
        Request::Prepare { epoch: epoch(3) },
    )
    .await;
    assert!(matches!(unknown, Response::Promised { .. }), "{unknown:?}");
    tokio::time::sleep(restart_wait).await;
    let promised = apply(&journal, LOG, Request::Prepare { epoch: epoch(3) }).await;
    assert!(
        matches!(promised, Response::Promised { .. }),
        "{promised:?}"
    );
    journal.close().await;
}
