//! What regions and the coordinator say to each other. The sender of every message is the
//! node incarnation the transport authenticated, never a field of the message, except where a
//! region relays another's acknowledgement ([`ToCoordinator::BeginHandOffAck`]).

use crate::shard_id::ShardId;
use crate::state::RegionId;
use serde::{Deserialize, Serialize};

/// Names one handoff of one coordinator incarnation, so an owner's late `ShardStopped` from a
/// handoff that was given up cannot end a later one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HandoffId {
    /// Drawn at random when the coordinator incarnation starts.
    pub coordinator_nonce: u64,
    pub number: u64,
}

/// From a region (or proxy) to the coordinator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToCoordinator {
    /// A region that hosts shards.
    Register,
    /// A proxy-only region: it routes, hosts nothing.
    RegisterProxy,
    /// Where does `shard` live? Answered with [`ToRegion::ShardHome`] once it is allocated.
    GetShardHome { shard: ShardId },
    /// The owner started the shard the coordinator asked it to host.
    ShardStarted { shard: ShardId },
    /// Relayed by the owner of `shard`: `region` stopped sending to it and everything it sent
    /// before has reached the owner (the marker travelled behind its messages on the same
    /// ordered link) for handoff `handoff`; an acknowledgement of an earlier handoff of the
    /// shard (given up since) does not count for a later one.
    BeginHandOffAck {
        shard: ShardId,
        region: RegionId,
        handoff: HandoffId,
    },
    /// The owner stopped `shard` for handoff `handoff` (its entities finished their writes).
    ShardStopped { shard: ShardId, handoff: HandoffId },
    /// The region's node is leaving: move all its shards away and give it no new ones.
    GracefulShutdownRequest,
}

/// From the coordinator to a region.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToRegion {
    RegisterAck,
    /// `shard` lives at `region` (which may be the receiver).
    ShardHome {
        shard: ShardId,
        region: RegionId,
    },
    /// Start hosting `shard`; answer [`ToCoordinator::ShardStarted`].
    HostShard {
        shard: ShardId,
    },
    /// `shard` is about to move away from `owner`: stop sending to it, buffer, and send a
    /// marker to the owner behind everything already sent.
    BeginHandOff {
        shard: ShardId,
        owner: RegionId,
        handoff: HandoffId,
    },
    /// To the owner, once every region's marker reached it: stop the shard.
    HandOff {
        shard: ShardId,
        handoff: HandoffId,
    },
    /// Answers each [`ToCoordinator::GracefulShutdownRequest`]; `done` once the region holds
    /// no shard in the coordinator's state and none is in handoff from it.
    GracefulShutdownAck {
        done: bool,
    },
}

/// From one region to another, on one ordered link so that a marker follows the messages
/// sent before it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BetweenRegions<M> {
    /// A message for an entity of `shard`.
    Forward { shard: ShardId, message: M },
    /// The sender will send nothing more for `shard` to the receiver until it learns the
    /// shard's new home.
    HandOffMarker { shard: ShardId, handoff: HandoffId },
}
