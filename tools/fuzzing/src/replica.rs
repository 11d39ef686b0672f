//! Targets of what the replicated journal's replicas and writers receive: replica calls and
//! replies, and a replica applying a sequence of calls.

use super::{assert_round_trip, chunked, chunks};
use std::collections::BTreeMap;
use tessera_persistence::StoredEvent;
use tessera_persistence::wire::{
    ReplicaCall, ReplicaCalls, ReplicaReply, ReplicaRequest, WireError, decode_replies,
    encode_replies,
};
use tessera_replication::memory::{MemoryLog, ReadLimits};
use tessera_replication::replica::Rules;

/// Decodes a replica call and checks its round trip.
fn decode_call(data: &[u8]) -> Option<ReplicaCall> {
    let call = ReplicaCall::decode(data).ok()?;
    assert_round_trip(
        "replica call",
        &call,
        ReplicaCall::encode,
        ReplicaCall::decode,
    );
    Some(call)
}

/// Decodes what a replica service receives (one call or a batch), checking round trips.
fn decode_calls(data: &[u8]) -> Vec<ReplicaCall> {
    match ReplicaCalls::decode(data) {
        Ok(ReplicaCalls::One(_)) => decode_call(data).into_iter().collect(),
        Ok(ReplicaCalls::Batch(calls)) => {
            assert_round_trip(
                "batch of replica calls",
                &calls,
                |c| ReplicaCalls::encode_batch(c),
                |b| match ReplicaCalls::decode(b) {
                    Ok(ReplicaCalls::Batch(calls)) => Ok(calls),
                    other => Err(format!("{other:?}")),
                },
            );
            calls
        }
        Err(_) => Vec::new(),
    }
}

/// Target `replica_message`: a writer's call (or batch of calls) to a replica, and a
/// replica's reply (or batch of replies).
pub fn replica_message(data: &[u8]) {
    decode_calls(data);
    if let Ok(reply) = ReplicaReply::decode(data) {
        assert_round_trip(
            "replica reply",
            &reply,
            ReplicaReply::encode,
            ReplicaReply::decode,
        );
    }
    // A batch of replies is taken only with the number of calls it answers: decode with a
    // count no batch has, then with the count found.
    if let Err(WireError::BatchLength { found, .. }) = decode_replies(data, usize::MAX) {
        assert_round_trip(
            "batch of replica replies",
            &decode_replies(data, found).expect("replies decode with their own count"),
            |r| encode_replies(r),
            |b| decode_replies(b, found),
        );
    }
}

/// What a replica answers with at most, as the node's stores.
const LIMITS: ReadLimits = ReadLimits {
    max_tail_entries: 1_000,
    max_bytes: 1024 * 1024,
};

/// Panics unless `log` is a log a replica may hold: its deleted prefix, acknowledged mark and
/// last entry in order, and exactly the entries after the prefix up to the last one, the last
/// with the last position's epoch.
fn assert_consistent(name: &str, log: &MemoryLog<StoredEvent>) {
    let Some(meta) = &log.meta else {
        assert!(
            log.entries.is_empty(),
            "log {name}: entries without a state"
        );
        return;
    };
    assert!(
        meta.base.seq <= meta.last.seq && meta.lac <= meta.last.seq,
        "log {name}: marks out of order: {meta:?}"
    );
    let expected = meta.last.seq - meta.base.seq;
    let seqs: Vec<u64> = log.entries.keys().copied().collect();
    let contiguous = seqs.first().is_none_or(|&first| first == meta.base.seq + 1)
        && seqs.windows(2).all(|w| w[1] == w[0] + 1)
        && seqs.len() as u64 == expected;
    assert!(
        contiguous,
        "log {name}: holds entries {seqs:?} with deleted prefix {} and last entry {}",
        meta.base, meta.last
    );
    if let Some(last) = log.entries.get(&meta.last.seq) {
        assert_eq!(
            last.epoch, meta.last.epoch,
            "log {name}: last entry's epoch"
        );
    }
}

/// Target `replica_requests`: a node's replica store, as the in-memory store applies the
/// replica rules (exactly as the RocksDB store does), fed a sequence of decoded calls
/// ([`chunks`]). After each, every log must be one a replica may hold.
pub fn replica_requests(data: &[u8]) {
    let rules = Rules::default();
    let mut logs: BTreeMap<String, MemoryLog<StoredEvent>> = BTreeMap::new();
    for call in chunks(data).flat_map(decode_calls) {
        // Snapshot requests go to the snapshot store, after a look at the log's promise.
        let ReplicaRequest::Log(request) = call.request else {
            continue;
        };
        let log = logs.entry(call.log.to_string()).or_default();
        log.handle(&rules, request, LIMITS);
        assert_consistent(&call.log, log);
    }
}

/// Valid encodings the targets' corpora start from.
pub mod seeds {
    use super::*;
    use bytes::Bytes;
    use tessera_cluster::Address;
    use tessera_persistence::wire::{Criteria, SnapshotData};
    use tessera_replication::{
        ConfigAt, Configuration, Entry, Epoch, LogSummary, Position, ReplicaId, Request, Response,
    };

    fn replica(n: u16) -> ReplicaId {
        ReplicaId {
            address: Address::new("10.0.0.1", 25520 + n),
            storage_id: u64::from(n) * 1000 + 7,
        }
    }

    fn configuration() -> Configuration {
        Configuration {
            version: 1,
            members: vec![replica(1), replica(2), replica(3)],
            previous: None,
        }
    }

    fn event(n: u64) -> StoredEvent {
        StoredEvent {
            timestamp_ms: 1_700_000_000_000 + n,
            writer_id: "account|alice#1".into(),
            manifest: "account.Event".into(),
            manifest_version: 1,
            payload: Bytes::from(format!("{{\"deposit\": {n}}}")),
            tags: if n.is_multiple_of(2) {
                vec!["accounts".into()]
            } else {
                vec![]
            },
        }
    }

    fn epoch(counter: u64) -> Epoch {
        Epoch {
            counter,
            writer: 2007,
        }
    }

    /// A writer's life on one log: locate, fence, seal the empty log, append, read, move
    /// the log, delete a prefix; then a second writer fencing the first.
    fn writer_requests() -> Vec<Request<StoredEvent>> {
        let first = epoch(1);
        let second = epoch(2);
        let entries = |from: u64, to: u64, epoch: Epoch| -> Vec<Entry<StoredEvent>> {
            (from..=to)
                .map(|seq| Entry {
                    seq,
                    epoch,
                    payload: event(seq),
                })
                .collect()
        };
        vec![
            Request::Locate,
            Request::Prepare { epoch: first },
            Request::Seal {
                epoch: first,
                at: Position::START,
                config: configuration(),
            },
            Request::Append {
                epoch: first,
                prev: Position::new(0, first),
                entries: entries(1, 3, first),
                lac: 0,
                config: Some(configuration()),
            },
            Request::Append {
                epoch: first,
                prev: Position::new(3, first),
                entries: entries(4, 5, first),
                lac: 3,
                config: None,
            },
            Request::Confirm {
                epoch: first,
                prev: Position::new(5, first),
                lac: 5,
                config: None,
                lease_ms: 2_000,
            },
            Request::Read {
                from: 1,
                to: 5,
                max_entries: 100,
                max_bytes: 65_536,
            },
            Request::DeleteTo {
                epoch: first,
                to: 2,
            },
            Request::Prepare { epoch: second },
            Request::Append {
                epoch: first,
                prev: Position::new(5, first),
                entries: entries(6, 6, first),
                lac: 5,
                config: None,
            },
            Request::Seal {
                epoch: second,
                at: Position::new(5, first),
                config: configuration(),
            },
            Request::Install {
                epoch: second,
                base: Position::new(9, second),
                config: configuration(),
            },
        ]
    }

    fn calls() -> Vec<ReplicaCall> {
        let mut calls: Vec<ReplicaCall> = writer_requests()
            .into_iter()
            .map(|request| ReplicaCall {
                log: "account|alice".into(),
                storage_id: Some(1007),
                request: ReplicaRequest::Log(request),
            })
            .collect();
        let criteria = Criteria {
            min_sequence_nr: 0,
            max_sequence_nr: u64::MAX,
            min_timestamp_ms: 0,
            max_timestamp_ms: u64::MAX,
        };
        for request in [
            ReplicaRequest::SaveSnapshot {
                epoch: epoch(1),
                snapshot: SnapshotData {
                    sequence_nr: 5,
                    timestamp_ms: 1_700_000_000_000,
                    manifest: "account.State".into(),
                    manifest_version: 1,
                    payload: Bytes::from_static(b"\x0f"),
                },
            },
            ReplicaRequest::LoadSnapshot { criteria },
            ReplicaRequest::DeleteSnapshots {
                epoch: epoch(1),
                criteria,
            },
        ] {
            calls.push(ReplicaCall {
                log: "account|alice".into(),
                storage_id: None,
                request,
            });
        }
        calls
    }

    fn replies() -> Vec<ReplicaReply> {
        let summary = LogSummary {
            promise: epoch(1),
            last: Position::new(5, epoch(1)),
            lac: 3,
            base: Position::START,
            config: Some(std::sync::Arc::new(ConfigAt {
                epoch: epoch(1),
                config: configuration(),
            })),
        };
        let tail = vec![Entry {
            seq: 4,
            epoch: epoch(1),
            payload: event(4),
        }];
        vec![
            ReplicaReply::Answer(Response::Located {
                storage_id: 1007,
                summary: Some(summary.clone()),
            }),
            ReplicaReply::Answer(Response::Promised {
                summary: summary.clone(),
                tail: tail.clone(),
                tail_complete: true,
            }),
            ReplicaReply::Answer(Response::Entries {
                entries: tail,
                summary: summary.clone(),
            }),
            ReplicaReply::Answer(Response::Fenced { promise: epoch(2) }),
            ReplicaReply::Answer(Response::Mismatch { summary }),
            ReplicaReply::Answer(Response::Invalid {
                reason: "gap".into(),
            }),
            ReplicaReply::WrongStorage { storage_id: 9 },
            ReplicaReply::Failed {
                reason: "disk".into(),
            },
            ReplicaReply::Fenced { promise: epoch(2) },
            ReplicaReply::Done,
            ReplicaReply::Snapshot(None),
        ]
    }

    /// Seeds of `replica_message`: every kind of call and reply.
    pub fn replica_message() -> Vec<Vec<u8>> {
        let batches = [
            ReplicaCalls::encode_batch(&calls()).ok(),
            encode_replies(&replies()).ok(),
        ];
        let calls = calls().into_iter().filter_map(|c| c.encode().ok());
        let replies = replies().into_iter().filter_map(|r| r.encode().ok());
        calls
            .chain(replies)
            .chain(batches.into_iter().flatten())
            .collect()
    }

    /// Seeds of `replica_requests`: a writer's life on one log, the same calls on two logs
    /// interleaved, and the first as one batch.
    pub fn replica_requests() -> Vec<Vec<u8>> {
        let encoded: Vec<Vec<u8>> = calls().iter().filter_map(|c| c.encode().ok()).collect();
        let other_log: Vec<Vec<u8>> = calls()
            .into_iter()
            .map(|mut c| {
                c.log = "account|bob".into();
                c
            })
            .filter_map(|c| c.encode().ok())
            .collect();
        let interleaved = encoded
            .iter()
            .zip(&other_log)
            .flat_map(|(a, b)| [a.as_slice(), b.as_slice()]);
        let batch = ReplicaCalls::encode_batch(&calls()).unwrap_or_default();
        vec![
            chunked(encoded.iter().map(Vec::as_slice)),
            chunked(interleaved),
            chunked([batch.as_slice()]),
        ]
    }
}
