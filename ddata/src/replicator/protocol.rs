//! Messages between Replicators, one-way on the transport's `replicator` service. Replies
//! name the operation they answer (`op`), so the state machine matches them to its pending
//! reads and writes without the transport's request/response machinery. The driver sends the
//! quorum messages (reads, writes and their answers) on the transport's quorum lane and the
//! anti-entropy and delta messages on its bulk lane.

use crate::codec;
use crate::envelope::{DataEnvelope, PruningState};
use crate::value::ReplicatedValue;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tessera_cluster::UniqueAddress;

/// A message from one Replicator to another.
///
/// `incarnation` is a random number each Replicator draws when it starts. Requests carry the
/// requester's and replies echo it, so a reply meant for an earlier incarnation at the same
/// address (a restarted node reuses its operation numbers) is never taken for an answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ReplicatorMessage {
    /// Asks for the replica of `key`.
    Read {
        op: u64,
        incarnation: u64,
        key: String,
    },
    /// The replica of the key a `Read` asked for (`None`: never seen).
    ReadResult {
        op: u64,
        incarnation: u64,
        key: String,
        envelope: Option<DataEnvelope>,
    },
    /// Merge this state of `key` (a quorum write, or a read repair) and acknowledge.
    Write {
        op: u64,
        incarnation: u64,
        key: String,
        envelope: DataEnvelope,
    },
    /// The `Write` of `op` is merged (and stored, for a durable key).
    WriteAck { op: u64, incarnation: u64 },
    /// The `Write` of `op` could not be merged as given (the key holds another kind here).
    WriteNack {
        op: u64,
        incarnation: u64,
        reason: String,
    },
    /// Changes since the last propagation, per key, with the sender's delta sequence numbers
    /// (which restart with every incarnation of the sender).
    Deltas {
        incarnation: u64,
        deltas: Vec<DeltaEntry>,
    },
    /// The receiver of `Deltas` missed some for these keys: send their full state.
    DeltaGap { keys: Vec<String> },
    /// Anti-entropy, step 1: the digests of the sender's non-empty chunks.
    Status { chunks: Vec<(u16, u128)> },
    /// Step 2: the key digests of chunks whose digests differ (`more`: more chunks differ
    /// than fitted). Empty when nothing differs, which ends the exchange.
    ChunkKeys {
        chunks: Vec<ChunkKeyList>,
        more: bool,
    },
    /// Step 3 and 4: states to merge, and keys whose state the receiver should send back
    /// (when `reply_expected`). `more`: the exchange did not finish; the initiator starts
    /// another round at once.
    Gossip {
        entries: Vec<(String, DataEnvelope)>,
        send_back: Vec<String>,
        reply_expected: bool,
        more: bool,
    },
}

/// The changes to one key since the last propagation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeltaEntry {
    pub key: String,
    /// Sender's delta sequence numbers covered, inclusive.
    pub from_seq: u64,
    pub to_seq: u64,
    pub delta: ReplicatedValue,
    /// The sender's pruning markers of the key: a delta made after a pruning must not be
    /// merged into a copy that still counts the pruned node.
    pub pruning: BTreeMap<UniqueAddress, PruningState>,
}

/// The keys of one chunk with their digests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkKeyList {
    pub chunk: u16,
    pub keys: Vec<(String, u128)>,
}

impl ReplicatorMessage {
    /// The versioned encoding (see [`codec`]).
    pub fn encode(&self) -> Result<Vec<u8>, codec::EncodeError> {
        codec::encode("replicator message", self)
    }

    /// Decodes bytes from a peer; anything malformed is an error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Self, codec::DecodeError> {
        codec::decode("replicator message", bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ORSet;
    use proptest::prelude::*;
    use tessera_cluster::Address;

    #[test]
    fn messages_round_trip() {
        let mut set = ORSet::new();
        set.add(
            &UniqueAddress::new(Address::new("h", 1), 1),
            "x".to_string(),
        );
        let messages = [
            ReplicatorMessage::Read {
                op: 1,
                incarnation: 9,
                key: "k".into(),
            },
            ReplicatorMessage::Write {
                op: 2,
                incarnation: 9,
                key: "k".into(),
                envelope: DataEnvelope::new(set.clone().into()),
            },
            ReplicatorMessage::Deltas {
                incarnation: 9,
                deltas: vec![DeltaEntry {
                    key: "k".into(),
                    from_seq: 1,
                    to_seq: 3,
                    delta: set.into(),
                    pruning: BTreeMap::new(),
                }],
            },
            ReplicatorMessage::Status {
                chunks: vec![(3, u128::MAX)],
            },
        ];
        for message in messages {
            let bytes = message.encode().unwrap();
            assert_eq!(ReplicatorMessage::decode(&bytes).unwrap(), message);
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_decode_to_an_error_or_a_message(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = ReplicatorMessage::decode(&bytes);
        }
    }
}
