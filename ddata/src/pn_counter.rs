//! Counters that go up and down.

use crate::crdt::{DeltaReplicatedData, RemovedNodePruning, ReplicatedData};
use crate::g_counter::GCounter;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use tessera_cluster::UniqueAddress;

/// A counter that can be incremented and decremented: two grow-only counters, one per direction,
/// and the value is their difference.
///
/// Each node's total per direction is a `u64` that saturates at `u64::MAX`; the value is an
/// `i128`, which holds the exact difference for any realistic number of nodes (it saturates
/// rather than overflows beyond that).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PNCounter {
    increments: GCounter,
    decrements: GCounter,
}

impl PNCounter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `n` on behalf of `node`.
    pub fn increment(&mut self, node: &UniqueAddress, n: u64) {
        self.increments.increment(node, n);
    }

    /// Subtracts `n` on behalf of `node`.
    pub fn decrement(&mut self, node: &UniqueAddress, n: u64) {
        self.decrements.increment(node, n);
    }

    /// All increments minus all decrements.
    pub fn value(&self) -> i128 {
        difference(self.increments.value(), self.decrements.value())
    }
}

/// `up - down` as an `i128`: exact for any sum of fewer than 2^63 saturated `u64` totals,
/// saturating beyond.
pub(crate) fn difference(up: u128, down: u128) -> i128 {
    let up = i128::try_from(up).unwrap_or(i128::MAX);
    let down = i128::try_from(down).unwrap_or(i128::MAX);
    up.saturating_sub(down)
}

impl ReplicatedData for PNCounter {
    fn merge(&self, other: &Self) -> Self {
        Self {
            increments: self.increments.merge(&other.increments),
            decrements: self.decrements.merge(&other.decrements),
        }
    }
}

impl DeltaReplicatedData for PNCounter {
    /// The changed entries of both directions.
    type Delta = PNCounter;

    fn delta(&self) -> Option<PNCounter> {
        let increments = self.increments.delta();
        let decrements = self.decrements.delta();
        if increments.is_none() && decrements.is_none() {
            return None;
        }
        Some(PNCounter {
            increments: increments.unwrap_or_default(),
            decrements: decrements.unwrap_or_default(),
        })
    }

    fn reset_delta(&mut self) {
        self.increments.reset_delta();
        self.decrements.reset_delta();
    }

    fn merge_delta(&mut self, delta: &PNCounter) {
        *self = self.merge(delta);
    }
}

impl RemovedNodePruning for PNCounter {
    fn modified_by_nodes(&self) -> BTreeSet<UniqueAddress> {
        let mut nodes = self.increments.modified_by_nodes();
        nodes.extend(self.decrements.modified_by_nodes());
        nodes
    }

    fn need_pruning_from(&self, removed: &UniqueAddress) -> bool {
        self.increments.need_pruning_from(removed) || self.decrements.need_pruning_from(removed)
    }

    fn prune(&mut self, removed: &UniqueAddress, collapse_into: &UniqueAddress) {
        self.increments.prune(removed, collapse_into);
        self.decrements.prune(removed, collapse_into);
    }

    fn prune_cleanup(&mut self, removed: &UniqueAddress) {
        self.increments.prune_cleanup(removed);
        self.decrements.prune_cleanup(removed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_cluster::Address;

    fn node(i: u16) -> UniqueAddress {
        UniqueAddress::new(Address::new("127.0.0.1", 2550 + i), u64::from(i) + 1)
    }

    #[test]
    fn value_is_increments_minus_decrements_across_replicas() {
        let mut a = PNCounter::new();
        a.increment(&node(1), 10);
        a.decrement(&node(1), 3);
        let mut b = PNCounter::new();
        b.decrement(&node(2), 20);
        assert_eq!(a.value(), 7);
        assert_eq!(a.merge(&b).value(), -13);
        assert_eq!(b.merge(&a).value(), -13);
    }

    #[test]
    fn extreme_counts_saturate_per_direction_without_panicking() {
        let mut a = PNCounter::new();
        a.decrement(&node(1), u64::MAX);
        a.decrement(&node(1), u64::MAX);
        a.decrement(&node(2), u64::MAX);
        assert_eq!(a.value(), -2 * i128::from(u64::MAX));
        a.increment(&node(3), 1);
        assert_eq!(a.value(), 1 - 2 * i128::from(u64::MAX));
    }

    #[test]
    fn delta_holds_both_directions() {
        let mut a = PNCounter::new();
        a.increment(&node(1), 5);
        a.reset_delta();
        a.decrement(&node(2), 2);
        let delta = a.delta().unwrap();
        assert_eq!(delta.value(), -2);
        let mut seen = PNCounter::new();
        seen.increment(&node(1), 5);
        seen.merge_delta(&delta);
        assert_eq!(seen, a);
    }

    #[test]
    fn pruning_collapses_both_directions_and_keeps_the_value() {
        let mut a = PNCounter::new();
        a.increment(&node(1), 3);
        a.increment(&node(2), 10);
        a.decrement(&node(2), 4);
        a.prune(&node(2), &node(1));
        assert_eq!(a.value(), 9);
        assert_eq!(a.modified_by_nodes(), BTreeSet::from([node(1)]));
        let mut late = PNCounter::new();
        late.decrement(&node(2), 4);
        late.prune_cleanup(&node(2));
        assert!(!late.need_pruning_from(&node(2)));
        assert_eq!(a.merge(&late).value(), 9);
    }
}
