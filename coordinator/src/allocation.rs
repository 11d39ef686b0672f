//! The least-shard allocation strategy (Akka's `LeastShardAllocationStrategy` with absolute
//! and relative rebalance limits).
//!
//! - A new shard goes to the candidate region with the fewest shards (ties: the lowest
//!   address, so every run decides the same).
//! - A rebalance round moves at most `max(1, min(relative_limit × shards, absolute_limit))`
//!   shards. First it takes the shards above `ceil(shards / regions)` from the regions that
//!   hold more; when none do but some region holds fewer than `floor(shards / regions)`, it
//!   takes one shard from each of the fullest regions, as many as regions are short. So a
//!   round never moves a shard that would only come back, and rounds stop once the spread is
//!   at most one shard.
//!
//! The coordinator runs one round at a time and only while every member is Up and reachable.

use crate::shard_id::ShardId;
use crate::state::RegionId;
use std::collections::{BTreeMap, BTreeSet};

/// Limits of one rebalance round.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RebalanceLimits {
    /// At most this many shards per round.
    pub absolute_limit: usize,
    /// At most this fraction of all allocated shards per round.
    pub relative_limit: f64,
}

impl RebalanceLimits {
    /// Shards one round may move when `total_shards` are allocated (at least 1).
    pub fn per_round(&self, total_shards: usize) -> usize {
        let relative = (self.relative_limit * total_shards as f64) as usize;
        relative.min(self.absolute_limit).max(1)
    }
}

/// The region for a new shard among `candidates` (regions that may take shards now), given
/// the current allocation; `None` when there is no candidate.
pub fn allocate(
    allocation: &BTreeMap<RegionId, BTreeSet<ShardId>>,
    candidates: &BTreeSet<RegionId>,
) -> Option<RegionId> {
    candidates
        .iter()
        .min_by_key(|region| (allocation.get(*region).map_or(0, BTreeSet::len), *region))
        .cloned()
}

/// The shards to move in one rebalance round. `candidates` are the regions that may take
/// shards (Up, not leaving); shards of other regions are not counted and not moved here
/// (graceful shutdown moves those).
pub fn rebalance(
    allocation: &BTreeMap<RegionId, BTreeSet<ShardId>>,
    candidates: &BTreeSet<RegionId>,
    limits: RebalanceLimits,
) -> BTreeSet<ShardId> {
    let counted: Vec<(&RegionId, &BTreeSet<ShardId>)> = allocation
        .iter()
        .filter(|(region, _)| candidates.contains(*region))
        .collect();
    let regions = candidates.len();
    if regions < 2 {
        return BTreeSet::new();
    }
    let total: usize = counted.iter().map(|(_, shards)| shards.len()).sum();
    let limit = limits.per_round(total);
    let ceil = total.div_ceil(regions);
    let floor = total / regions;
    // Fullest first, so the limit takes from where it helps most.
    let mut fullest: Vec<(&RegionId, &BTreeSet<ShardId>)> = counted.clone();
    fullest.sort_by_key(|(region, shards)| (std::cmp::Reverse(shards.len()), *region));
    let mut moved = BTreeSet::new();
    for (_, shards) in &fullest {
        for shard in shards.iter().skip(ceil) {
            if moved.len() == limit {
                return moved;
            }
            moved.insert(*shard);
        }
    }
    if !moved.is_empty() {
        return moved;
    }
    let counts: BTreeMap<&RegionId, usize> = candidates
        .iter()
        .map(|region| (region, allocation.get(region).map_or(0, BTreeSet::len)))
        .collect();
    let short = counts.values().filter(|count| **count < floor).count();
    if short == 0 {
        return moved;
    }
    for (_, shards) in fullest {
        if moved.len() == limit.min(short) || shards.len() <= floor {
            break;
        }
        if let Some(shard) = shards.iter().next_back() {
            moved.insert(*shard);
        }
    }
    moved
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tessera_cluster::{Address, UniqueAddress};

    fn region(port: u16) -> RegionId {
        UniqueAddress {
            address: Address::new("127.0.0.1", port),
            uid: 1,
        }
    }

    const LIMITS: RebalanceLimits = RebalanceLimits {
        absolute_limit: 20,
        relative_limit: 0.1,
    };

    fn spread(counts: &[usize]) -> BTreeMap<RegionId, BTreeSet<ShardId>> {
        let mut next = 0;
        counts
            .iter()
            .enumerate()
            .map(|(i, count)| {
                let shards = (next..next + *count as u32).map(ShardId).collect();
                next += *count as u32;
                (region(i as u16 + 1), shards)
            })
            .collect()
    }

    #[test]
    fn a_new_shard_goes_to_the_region_with_fewest() {
        let allocation = spread(&[3, 1, 2]);
        let candidates = allocation.keys().cloned().collect();
        assert_eq!(allocate(&allocation, &candidates), Some(region(2)));
        let only_first = [region(1)].into_iter().collect();
        assert_eq!(allocate(&allocation, &only_first), Some(region(1)));
        assert_eq!(allocate(&allocation, &BTreeSet::new()), None);
    }

    #[test]
    fn a_joining_region_gets_shards_within_the_limits() {
        let mut allocation = spread(&[500, 500]);
        allocation.insert(region(3), BTreeSet::new());
        let candidates = allocation.keys().cloned().collect();
        let moved = rebalance(&allocation, &candidates, LIMITS);
        // min(0.1 × 1000, 20) = 20.
        assert_eq!(moved.len(), 20);
    }

    #[test]
    fn the_relative_limit_applies_to_small_clusters() {
        let mut allocation = spread(&[30]);
        allocation.insert(region(2), BTreeSet::new());
        let candidates = allocation.keys().cloned().collect();
        assert_eq!(rebalance(&allocation, &candidates, LIMITS).len(), 3);
    }

    proptest! {
        /// Repeated rounds converge to a spread of at most one shard, never move more than
        /// the limit, and never move a shard of a region that is not a candidate.
        #[test]
        fn rounds_converge_within_limits(
            counts in proptest::collection::vec(0usize..60, 1..6),
            extra in 0usize..3,
        ) {
            let mut allocation = spread(&counts);
            for i in 0..extra {
                allocation.insert(region(100 + i as u16), BTreeSet::new());
            }
            let candidates: BTreeSet<RegionId> = allocation.keys().cloned().collect();
            let total: usize = counts.iter().sum();
            for _ in 0..200 {
                let moved = rebalance(&allocation, &candidates, LIMITS);
                if moved.is_empty() {
                    break;
                }
                prop_assert!(moved.len() <= LIMITS.per_round(total));
                for shard in moved {
                    for shards in allocation.values_mut() {
                        shards.remove(&shard);
                    }
                    let target = allocate(&allocation, &candidates).unwrap();
                    allocation.get_mut(&target).unwrap().insert(shard);
                }
            }
            let sizes: Vec<usize> = allocation.values().map(BTreeSet::len).collect();
            let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            prop_assert!(max - min <= 1, "spread {sizes:?}");
            prop_assert!(rebalance(&allocation, &candidates, LIMITS).is_empty());
        }
    }
}
