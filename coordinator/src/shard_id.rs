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

/// How an entity id maps to its shard. Every node of a cluster must map a type's ids the
/// same way (and with the same number of shards).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShardIds {
    /// The id's stable hash modulo the number of shards ([`shard_of`]): ids spread evenly
    /// whatever they look like.
    #[default]
    Hashed,
    /// Ids that are the numbers `0, 1, 2, ...` in decimal: entity `n` lives in shard
    /// `n mod number_of_shards`, so that each of up to `number_of_shards` entities has a
    /// shard of its own and allocation, which balances shards over the nodes, balances
    /// the entities (the instances of a sharded daemon process). An id that is not such a
    /// number is mapped by its hash.
    Numbered,
}

/// An entity type's mapping from entity ids to its shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardMap {
    pub number_of_shards: u32,
    pub ids: ShardIds,
}

impl ShardMap {
    /// The shard of entity `id`.
    pub fn shard_of(&self, id: &EntityId) -> ShardId {
        match self.ids {
            ShardIds::Numbered => match id.as_str().parse::<u32>() {
                Ok(n) if n.to_string() == id.as_str() => ShardId(n % self.number_of_shards.max(1)),
                _ => shard_of(id, self.number_of_shards),
            },
            ShardIds::Hashed => shard_of(id, self.number_of_shards),
        }
    }
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

    #[test]
    fn numbered_ids_have_a_shard_each() {
        let map = ShardMap {
            number_of_shards: 4,
            ids: ShardIds::Numbered,
        };
        let shard = |id: &str| map.shard_of(&EntityId::new(id).unwrap());
        assert_eq!(shard("0"), ShardId(0));
        assert_eq!(shard("3"), ShardId(3));
        assert_eq!(shard("5"), ShardId(1));
        // Not the canonical decimal of a number: by hash, like any other id.
        assert_eq!(shard("03"), shard_of(&EntityId::new("03").unwrap(), 4));
        assert_eq!(
            shard("alice"),
            shard_of(&EntityId::new("alice").unwrap(), 4)
        );
    }
}
