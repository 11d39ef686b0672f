//! Property test: any sequence of appends (right and wrong), replays, deletes, tag and
//! persistence-id queries and reopenings gives the same answers from the RocksDB journal as
//! from a plain in-memory model.

mod common;

use common::{collect, event, open};
use proptest::prelude::*;
use std::collections::BTreeMap;
use tessera_journal::{AtomicWrite, Journal, JournalError, QueryMode, RocksJournal};

const PIDS: [&str; 3] = ["p0", "p1", "p2"];
const TAGS: [&str; 2] = ["red", "blue"];

#[derive(Debug, Clone)]
enum Op {
    /// `count` events to `PIDS[pid]`, starting `skew` away from the right sequence number.
    Append {
        pid: usize,
        count: u64,
        skew: i64,
        tag_mask: u8,
    },
    Replay {
        pid: usize,
        from: u64,
        to: u64,
        max: u64,
    },
    Highest {
        pid: usize,
    },
    DeleteTo {
        pid: usize,
        to: u64,
    },
    ByTag {
        tag: usize,
        after: u64,
    },
    ByPersistenceId {
        pid: usize,
        from: u64,
    },
    PersistenceIds,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    let pid = 0..PIDS.len();
    prop_oneof![
        6 => (pid.clone(), 1..4u64, prop_oneof![8 => Just(0i64), 1 => Just(-1i64), 1 => Just(1i64)], 0..4u8)
            .prop_map(|(pid, count, skew, tag_mask)| Op::Append { pid, count, skew, tag_mask }),
        2 => (pid.clone(), 0..25u64, 0..25u64, 0..25u64)
            .prop_map(|(pid, from, to, max)| Op::Replay { pid, from, to, max }),
        1 => pid.clone().prop_map(|pid| Op::Highest { pid }),
        1 => (pid.clone(), 0..25u64).prop_map(|(pid, to)| Op::DeleteTo { pid, to }),
        1 => (0..TAGS.len(), 0..30u64).prop_map(|(tag, after)| Op::ByTag { tag, after }),
        1 => (pid, 0..25u64).prop_map(|(pid, from)| Op::ByPersistenceId { pid, from }),
        1 => Just(Op::PersistenceIds),
        1 => Just(Op::Reopen),
    ]
}

#[derive(Default)]
struct ModelLog {
    /// (sequence number, payload, tags) of every event ever written.
    events: Vec<(u64, String, Vec<String>)>,
    deleted_to: u64,
}

impl ModelLog {
    fn highest(&self) -> u64 {
        self.events.last().map_or(0, |e| e.0)
    }
}

#[derive(Default)]
struct Model {
    logs: BTreeMap<String, ModelLog>,
    first_write_order: Vec<String>,
    /// (offset, pid, sequence number, tags) of tagged events, in commit order.
    tagged: Vec<(u64, String, u64, Vec<String>)>,
    next_offset: u64,
}

fn tags_of(mask: u8, seq: u64) -> Vec<&'static str> {
    // Vary tags between events of one write too.
    let mask = if seq.is_multiple_of(2) {
        mask
    } else {
        mask.rotate_right(1) & 3
    };
    TAGS.iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, t)| *t)
        .collect()
}

async fn check(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let mut journal: RocksJournal = open(dir.path()).await;
    let mut model = Model {
        next_offset: 1,
        ..Model::default()
    };
    for op in ops {
        match op {
            Op::Append {
                pid,
                count,
                skew,
                tag_mask,
            } => {
                let pid = PIDS[pid];
                let log_highest = model.logs.get(pid).map_or(0, ModelLog::highest);
                let first = (log_highest as i64 + 1 + skew).max(0) as u64;
                let write = AtomicWrite {
                    persistence_id: pid.into(),
                    writer_id: "w".into(),
                    events: (first..first + count)
                        .map(|s| event(s, &format!("{pid}/{s}"), &tags_of(tag_mask, s)))
                        .collect(),
                };
                let result = journal.append(write.clone()).await;
                if skew == 0 {
                    prop_assert!(result.is_ok(), "{result:?}");
                    if !model.logs.contains_key(pid) {
                        model.first_write_order.push(pid.to_string());
                    }
                    let log = model.logs.entry(pid.to_string()).or_default();
                    for e in &write.events {
                        let payload = String::from_utf8(e.payload.to_vec()).unwrap();
                        log.events.push((e.sequence_nr, payload, e.tags.clone()));
                        if !e.tags.is_empty() {
                            model.tagged.push((
                                model.next_offset,
                                pid.to_string(),
                                e.sequence_nr,
                                e.tags.clone(),
                            ));
                            model.next_offset += 1;
                        }
                    }
                } else {
                    let refused = matches!(result, Err(JournalError::SequenceMismatch { .. }));
                    prop_assert!(refused, "{result:?}");
                }
            }
            Op::Replay { pid, from, to, max } => {
                let pid = PIDS[pid];
                let got = collect(journal.replay(pid, from, to, max)).await.unwrap();
                let got: Vec<(u64, String)> = got
                    .into_iter()
                    .map(|e| {
                        (
                            e.sequence_nr,
                            String::from_utf8(e.payload.to_vec()).unwrap(),
                        )
                    })
                    .collect();
                let want: Vec<(u64, String)> = model.logs.get(pid).map_or(vec![], |log| {
                    log.events
                        .iter()
                        .filter(|e| e.0 > log.deleted_to && e.0 >= from && e.0 <= to)
                        .take(max as usize)
                        .map(|e| (e.0, e.1.clone()))
                        .collect()
                });
                prop_assert_eq!(got, want);
            }
            Op::ByPersistenceId { pid, from } => {
                let pid = PIDS[pid];
                let got = collect(journal.events_by_persistence_id(pid, from, QueryMode::Current))
                    .await
                    .unwrap();
                let got: Vec<u64> = got.iter().map(|e| e.sequence_nr).collect();
                let want: Vec<u64> = model.logs.get(pid).map_or(vec![], |log| {
                    log.events
                        .iter()
                        .map(|e| e.0)
                        .filter(|s| *s > log.deleted_to && *s >= from)
                        .collect()
                });
                prop_assert_eq!(got, want);
            }
            Op::Highest { pid } => {
                let pid = PIDS[pid];
                let got = journal.highest_sequence_nr(pid).await.unwrap();
                prop_assert_eq!(got, model.logs.get(pid).map_or(0, ModelLog::highest));
            }
            Op::DeleteTo { pid, to } => {
                let pid = PIDS[pid];
                journal.delete_to(pid, to).await.unwrap();
                if let Some(log) = model.logs.get_mut(pid) {
                    log.deleted_to = log.deleted_to.max(to.min(log.highest()));
                }
            }
            Op::ByTag { tag, after } => {
                let tag = TAGS[tag];
                let got = collect(journal.events_by_tag(tag, after, QueryMode::Current))
                    .await
                    .unwrap();
                let got: Vec<(u64, String, u64, Vec<String>)> = got
                    .into_iter()
                    .map(|e| {
                        (
                            e.offset,
                            e.event.persistence_id.to_string(),
                            e.event.sequence_nr,
                            e.tags,
                        )
                    })
                    .collect();
                let want: Vec<(u64, String, u64, Vec<String>)> = model
                    .tagged
                    .iter()
                    .filter(|(offset, pid, seq, tags)| {
                        *offset > after
                            && tags.iter().any(|t| t == tag)
                            && *seq > model.logs[pid].deleted_to
                    })
                    .map(|(o, p, s, tags)| (*o, p.clone(), *s, tags.clone()))
                    .collect();
                prop_assert_eq!(got, want);
            }
            Op::PersistenceIds => {
                let got = collect(journal.persistence_ids(QueryMode::Current))
                    .await
                    .unwrap();
                prop_assert_eq!(&got, &model.first_write_order);
            }
            Op::Reopen => {
                journal.close().await;
                journal = open(dir.path()).await;
            }
        }
    }
    journal.close().await;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn journal_agrees_with_the_model(ops in proptest::collection::vec(op(), 1..40)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(check(ops))?;
    }
}
