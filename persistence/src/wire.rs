//! The replica service's messages on the cluster transport: a version byte, then postcard.
//! Decoding any bytes gives a message or a typed error, never a panic.

use crate::commit_feed::{FeedCursor, LogReach};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use smol_str::SmolStr;
use tessera_journal::StoredEvent;
use tessera_journal::slice::SliceRange;
use tessera_replication::{Epoch, Request, Response};

/// Version byte in front of every single replica call and reply.
pub const WIRE_FORMAT_VERSION: u8 = 1;
/// Version byte in front of a batch of calls (several logs' requests to one node, carried in
/// one frame) and of the batch of replies to it, in the same order.
pub const BATCH_WIRE_FORMAT_VERSION: u8 = 2;

/// A writer's call to a node's replica store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaCall {
    /// The log (persistence id): a short one is kept inline, without an allocation per call.
    pub log: SmolStr,
    /// The store the writer expects there (`None` while locating): a node whose store is
    /// another answers [`ReplicaReply::WrongStorage`] and touches nothing.
    pub storage_id: Option<u64>,
    pub request: ReplicaRequest,
}

/// What a call asks of the replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicaRequest {
    /// A request of the log protocol.
    Log(Request<StoredEvent>),
    /// Store a snapshot of the log's state, if `epoch` is not below the log's promise.
    SaveSnapshot {
        epoch: Epoch,
        snapshot: SnapshotData,
    },
    /// The latest snapshot of the log within the bounds, if any.
    LoadSnapshot { criteria: Criteria },
    /// Delete the log's snapshots within the bounds, if `epoch` is not below its promise.
    DeleteSnapshots { epoch: Epoch, criteria: Criteria },
    /// Which logs held here, after `after` in log order, name the store `storage_id` in
    /// their configuration (the call's log is not used): an operator forgets a store only
    /// once no log's latest configuration does. A bounded part of the store is read per
    /// call.
    NamesStore {
        storage_id: u64,
        after: Option<String>,
    },
    /// Which logs of `entity_type` in `slices` moved since `cursor` (the call's log is not
    /// used), from this node's feed of acknowledged marks ([`crate::commit_feed`]); at most
    /// `max_logs`.
    SliceChanges {
        entity_type: String,
        slices: SliceRange,
        cursor: Option<FeedCursor>,
        max_logs: u32,
    },
    /// What this node holds of its logs of `entity_type` in `slices`, after `after` in log
    /// order, reading at most `max_scanned` of its logs (the call's log is not used).
    SliceScan {
        entity_type: String,
        slices: SliceRange,
        after: Option<String>,
        max_scanned: u32,
    },
}

/// A snapshot on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotData {
    pub sequence_nr: u64,
    pub timestamp_ms: u64,
    pub manifest: String,
    pub manifest_version: u32,
    pub payload: Bytes,
}

/// Snapshot selection bounds on the wire (inclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Criteria {
    pub min_sequence_nr: u64,
    pub max_sequence_nr: u64,
    pub min_timestamp_ms: u64,
    pub max_timestamp_ms: u64,
}

/// The answer to a [`ReplicaCall`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicaReply {
    Answer(Response<StoredEvent>),
    /// This node's store is not the one the call expected (it lost its data or was
    /// replaced).
    WrongStorage {
        storage_id: u64,
    },
    /// The store failed (an I/O error); nothing is known of the request's effect.
    Failed {
        reason: String,
    },
    /// A snapshot write's epoch is below the log's promise: that writer is fenced.
    Fenced {
        promise: Epoch,
    },
    /// A snapshot was saved, or snapshots were deleted.
    Done,
    /// The snapshot found, if any.
    Snapshot(Option<SnapshotData>),
    /// Logs held here whose configuration names the store asked about, among those read;
    /// `next`: where to go on, if the store holds more.
    NamedBy {
        logs: Vec<String>,
        next: Option<String>,
    },
    /// To `SliceChanges`: the logs that moved, and where to read on from; `rescan`: the
    /// feed no longer holds what followed the cursor (scan, then read on from `cursor`).
    SliceChanges {
        cursor: FeedCursor,
        logs: Vec<LogReach>,
        rescan: bool,
    },
    /// To `SliceScan`: the logs found, and where to go on (`None`: the scan is done).
    SliceScan {
        logs: Vec<LogReach>,
        next: Option<String>,
    },
}

/// What a replica service receives: one call, or a batch of them to take in in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicaCalls {
    One(ReplicaCall),
    Batch(Vec<ReplicaCall>),
}

impl ReplicaCalls {
    /// Decodes either format.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        match bytes.first() {
            Some(&BATCH_WIRE_FORMAT_VERSION) => {
                Ok(ReplicaCalls::Batch(postcard::from_bytes(&bytes[1..])?))
            }
            _ => ReplicaCall::decode(bytes).map(ReplicaCalls::One),
        }
    }

    /// Encodes a batch of calls.
    pub fn encode_batch(calls: &[ReplicaCall]) -> Result<Vec<u8>, WireError> {
        let capacity = calls.iter().map(call_size_estimate).sum();
        encode(BATCH_WIRE_FORMAT_VERSION, calls, capacity)
    }
}

/// Encodes the replies to a batch, in the order of its calls.
pub fn encode_replies(replies: &[ReplicaReply]) -> Result<Vec<u8>, WireError> {
    // Batched calls have small answers (summaries).
    let capacity = SMALL_REPLY_CAPACITY_BYTES * replies.len();
    encode(BATCH_WIRE_FORMAT_VERSION, replies, capacity)
}

/// About the encoded size of a batched call's answer: a summary without a configuration,
/// or a short failure.
const SMALL_REPLY_CAPACITY_BYTES: usize = 64;

/// Decodes the replies to a batch of `expected` calls.
pub fn decode_replies(bytes: &[u8], expected: usize) -> Result<Vec<ReplicaReply>, WireError> {
    let (&version, body) = bytes.split_first().ok_or(WireError::Empty)?;
    if version != BATCH_WIRE_FORMAT_VERSION {
        return Err(WireError::Version {
            found: version,
            expected: BATCH_WIRE_FORMAT_VERSION,
        });
    }
    let replies: Vec<ReplicaReply> = postcard::from_bytes(body)?;
    if replies.len() != expected {
        return Err(WireError::BatchLength {
            found: replies.len(),
            expected,
        });
    }
    Ok(replies)
}

/// Why bytes are not a replica message.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("empty replica message")]
    Empty,
    #[error("replica message format version {found} is not supported (expected {expected})")]
    Version { found: u8, expected: u8 },
    #[error("a batch of {expected} calls was answered with {found} replies")]
    BatchLength { found: usize, expected: usize },
    #[error("malformed replica message: {0}")]
    Malformed(#[from] postcard::Error),
}

/// Encodes a message behind its format `version`, into a buffer of about the `capacity` it
/// needs (estimates err on the large side): grown as postcard writes, the buffer would copy
/// a batch's entries several times over.
fn encode<T: Serialize + ?Sized>(
    version: u8,
    message: &T,
    capacity: usize,
) -> Result<Vec<u8>, WireError> {
    let mut buffer = Vec::with_capacity(capacity + 1);
    buffer.push(version);
    Ok(postcard::to_extend(message, buffer)?)
}

fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, WireError> {
    let (&version, body) = bytes.split_first().ok_or(WireError::Empty)?;
    if version != WIRE_FORMAT_VERSION {
        return Err(WireError::Version {
            found: version,
            expected: WIRE_FORMAT_VERSION,
        });
    }
    Ok(postcard::from_bytes(body)?)
}

impl ReplicaCall {
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        encode(WIRE_FORMAT_VERSION, self, call_size_estimate(self))
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        decode(bytes)
    }
}

impl ReplicaReply {
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        encode(WIRE_FORMAT_VERSION, self, SMALL_REPLY_CAPACITY_BYTES)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        decode(bytes)
    }
}

/// About how many bytes a call takes on the wire (at least; strings and entries' fixed
/// fields are counted with room to spare): a batch stays within its byte budget by it.
pub(crate) fn call_size_estimate(call: &ReplicaCall) -> usize {
    const OVERHEAD_BYTES: usize = 256;
    let entries = match &call.request {
        ReplicaRequest::Log(Request::Append { entries, .. }) => entries
            .iter()
            .map(|e| {
                let event = &e.payload;
                OVERHEAD_BYTES
                    + event.payload.len()
                    + event.writer_id.len()
                    + event.manifest.len()
                    + event.tags.iter().map(|t| t.len() + 8).sum::<usize>()
            })
            .sum(),
        _ => 0,
    };
    OVERHEAD_BYTES + call.log.len() + entries
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_replication::{Entry, Epoch, Position};

    #[test]
    fn calls_and_replies_round_trip() {
        let call = ReplicaCall {
            log: "account|alice".into(),
            storage_id: Some(7),
            request: ReplicaRequest::Log(Request::Append {
                epoch: Epoch {
                    counter: 3,
                    writer: 9,
                },
                prev: Position::START,
                entries: vec![Entry {
                    seq: 1,
                    epoch: Epoch::ZERO,
                    payload: StoredEvent {
                        timestamp_ms: 5,
                        writer_id: "w".into(),
                        manifest: "m".into(),
                        manifest_version: 1,
                        payload: bytes::Bytes::from_static(b"x"),
                        tags: vec!["t".into()],
                    },
                }],
                lac: 0,
                config: None,
            }),
        };
        assert_eq!(ReplicaCall::decode(&call.encode().unwrap()).unwrap(), call);
        let reply = ReplicaReply::WrongStorage { storage_id: 4 };
        assert_eq!(
            ReplicaReply::decode(&reply.encode().unwrap()).unwrap(),
            reply
        );
    }

    #[test]
    fn batches_round_trip_and_single_calls_still_decode() {
        let call = |log: &str| ReplicaCall {
            log: log.into(),
            storage_id: Some(3),
            request: ReplicaRequest::Log(Request::Locate),
        };
        let calls = vec![call("a"), call("b")];
        let bytes = ReplicaCalls::encode_batch(&calls).unwrap();
        assert_eq!(
            ReplicaCalls::decode(&bytes).unwrap(),
            ReplicaCalls::Batch(calls)
        );
        let one = call("c");
        assert_eq!(
            ReplicaCalls::decode(&one.encode().unwrap()).unwrap(),
            ReplicaCalls::One(one)
        );
        let replies = vec![
            ReplicaReply::Done,
            ReplicaReply::WrongStorage { storage_id: 1 },
        ];
        let bytes = encode_replies(&replies).unwrap();
        assert_eq!(decode_replies(&bytes, 2).unwrap(), replies);
        assert!(matches!(
            decode_replies(&bytes, 3),
            Err(WireError::BatchLength {
                found: 2,
                expected: 3
            })
        ));
        assert!(matches!(
            decode_replies(&ReplicaReply::Done.encode().unwrap(), 1),
            Err(WireError::Version { found: 1, .. })
        ));
        for junk in [&[2u8][..], &[2, 0xff, 0xff, 0xff, 0xff, 0x0f], &[2, 5, 1]] {
            assert!(ReplicaCalls::decode(junk).is_err());
            assert!(decode_replies(junk, 1).is_err());
        }
    }

    #[test]
    fn bad_bytes_are_typed_errors() {
        assert!(matches!(ReplicaCall::decode(&[]), Err(WireError::Empty)));
        assert!(matches!(
            ReplicaCall::decode(&[9, 1, 2]),
            Err(WireError::Version { found: 9, .. })
        ));
        for junk in [&[1u8][..], &[1, 0xff, 0xff, 0xff], &[1, 200, 1]] {
            assert!(ReplicaCall::decode(junk).is_err());
            assert!(ReplicaReply::decode(junk).is_err());
        }
    }
}
