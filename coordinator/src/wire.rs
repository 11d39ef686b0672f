//! The sharding service's frames on the cluster transport: a format version byte, then the
//! postcard encoding of [`ShardingFrame`]. Every frame names its entity type.

use crate::host::AskFailure;
use crate::messages::{HandoffId, ToCoordinator, ToRegion};
use crate::shard_id::ShardId;
use serde::{Deserialize, Serialize};
use tessera_cluster::Address;

/// The format version of this release's frames. Version 2 added the message version of a
/// forwarded command's entity type.
pub const WIRE_VERSION: u8 = 2;

/// The buffer a frame is encoded into starts this large.
const ENCODE_INITIAL_CAPACITY_BYTES: usize = 256;

/// A command for an entity, on its way to the region that runs its shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteAsk {
    pub entity_id: String,
    /// The command in postcard, under its type's `message_version`.
    pub payload: Vec<u8>,
    /// The entity type's message version the sender encoded the command (and reads the
    /// answer) under: a node of another version refuses it.
    pub message_version: u32,
    /// Where the answer goes: the node whose caller waits, under `reply_id`.
    pub reply_to: Address,
    pub reply_id: u64,
}

/// One region's shards and their live entities (`GET /sharding/{type}`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionSnapshot {
    pub shards: Vec<(ShardId, Vec<String>)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShardingFrame {
    ToCoordinator {
        type_name: String,
        message: ToCoordinator,
    },
    ToRegion {
        type_name: String,
        /// The incarnation of the region's node the coordinator means: a node restarted at
        /// the same address drops the frame, since a `HostShard` repeated for its previous
        /// incarnation would otherwise start a shard the coordinator has since given to
        /// another region.
        to_uid: u64,
        message: ToRegion,
    },
    Marker {
        type_name: String,
        shard: ShardId,
        handoff: HandoffId,
    },
    Forward {
        type_name: String,
        shard: ShardId,
        ask: RemoteAsk,
    },
    /// The answer to a forwarded command: the entity's reply or rejection in postcard
    /// (`Result<Reply, Rejection>`), or why there is none.
    Reply {
        type_name: String,
        reply_id: u64,
        result: Result<Vec<u8>, AskFailure>,
    },
    /// A request (answered with a [`RegionSnapshot`]): this region's shards and entities.
    RegionState { type_name: String },
    /// The answer to a frame for a type's coordinator from a node that does not register the
    /// type: why (naming the node and the types it registers).
    Unsupported { type_name: String, reason: String },
}

impl ShardingFrame {
    pub fn type_name(&self) -> &str {
        match self {
            ShardingFrame::ToCoordinator { type_name, .. }
            | ShardingFrame::ToRegion { type_name, .. }
            | ShardingFrame::Marker { type_name, .. }
            | ShardingFrame::Forward { type_name, .. }
            | ShardingFrame::Reply { type_name, .. }
            | ShardingFrame::RegionState { type_name }
            | ShardingFrame::Unsupported { type_name, .. } => type_name,
        }
    }
}

/// A frame that cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("empty sharding frame")]
    Empty,
    #[error("sharding frame format version {0} is not supported (expected {WIRE_VERSION})")]
    Version(u8),
    #[error("malformed sharding frame: {0}")]
    Malformed(String),
    #[error("cannot encode a sharding frame: {0}")]
    Encode(String),
}

pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, WireError> {
    // Room for a forwarded ask or its reply at once: grown from one byte as postcard
    // writes, the buffer would be reallocated several times for every message.
    let mut bytes = Vec::with_capacity(ENCODE_INITIAL_CAPACITY_BYTES);
    bytes.push(WIRE_VERSION);
    postcard::to_extend(value, bytes).map_err(|e| WireError::Encode(e.to_string()))
}

pub fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, WireError> {
    let (&version, rest) = bytes.split_first().ok_or(WireError::Empty)?;
    if version != WIRE_VERSION {
        return Err(WireError::Version(version));
    }
    postcard::from_bytes(rest).map_err(|e| WireError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frames_round_trip_and_bad_bytes_are_typed_errors() {
        let frame = ShardingFrame::Marker {
            type_name: "account".into(),
            shard: ShardId(3),
            handoff: HandoffId {
                coordinator_nonce: 7,
                number: 1,
            },
        };
        let bytes = encode(&frame).unwrap();
        assert_eq!(decode::<ShardingFrame>(&bytes).unwrap(), frame);
        assert_eq!(decode::<ShardingFrame>(&[]), Err(WireError::Empty));
        assert_eq!(decode::<ShardingFrame>(&[9, 0]), Err(WireError::Version(9)));
        assert!(matches!(
            decode::<ShardingFrame>(&[WIRE_VERSION, 250, 1]),
            Err(WireError::Malformed(_))
        ));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode::<ShardingFrame>(&bytes);
        }
    }
}
