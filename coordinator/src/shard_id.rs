//! Shard ids: which shard an entity belongs to.

use serde::{Deserialize, Serialize};
use std::fmt;
use tessera_entities::EntityId;

/// A shard of an entity type: `0..number_of_shards`. Fixed for a cluster's life, because the
/// mapping from entity ids to shards depends on the number of shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ShardId(pub u32);

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The shard of entity `id`: its stable hash (the same in every process and release, never
/// Rust's randomized hasher) modulo `number_of_shards`, which must be at least 1.
pub fn shard_of(id: &EntityId, number_of_shards: u32) -> ShardId {
    ShardId((id.stable_hash() % u64::from(number_of_shards.max(1))) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PINNED_ALICE: u32 = 665;

    #[test]
    fn the_shard_of_an_id_is_stable_and_in_range() {
        let id = EntityId::new("alice").unwrap();
        let shard = shard_of(&id, 1000);
        assert!(shard.0 < 1000);
        // Pinned: a change of the hash would move every entity of a running cluster.
        assert_eq!(shard, ShardId(PINNED_ALICE));
        assert_eq!(shard_of(&id, 1), ShardId(0));
    }
}
