//! Grow-only counters.

use crate::crdt::{DeltaReplicatedData, RemovedNodePruning, ReplicatedData};
use crate::version_vector::merge_max;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use tessera_cluster::UniqueAddress;

/// A counter that only grows: each node counts its own increments and the value is the sum over
/// nodes; merge takes the maximum per node.
///
/// A node's count saturates at `u64::MAX` (it never wraps or panics); the value is a `u128`, so
/// the sum over nodes is exact.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(from = "GCounterWire")]
pub struct GCounter {
    counts: BTreeMap<UniqueAddress, u64>,
    /// Entries incremented since the last `reset_delta`, at their new counts.
    #[serde(skip)]
    delta: BTreeMap<UniqueAddress, u64>,
}

/// The encoded form; decoding drops zero entries so every counter in memory is canonical.
#[derive(Deserialize)]
struct GCounterWire {
    counts: BTreeMap<UniqueAddress, u64>,
}

impl From<GCounterWire> for GCounter {
    fn from(wire: GCounterWire) -> Self {
        let mut counts = wire.counts;
        counts.retain(|_, count| *count > 0);
        Self {
            counts,
            delta: BTreeMap::new(),
        }
    }
}

impl PartialEq for GCounter {
    fn eq(&self, other: &Self) -> bool {
        self.counts == other.counts
    }
}

impl Eq for GCounter {}

impl GCounter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `n` to `node`'s count (saturating at `u64::MAX`). Adding 0 changes nothing.
    pub fn increment(&mut self, node: &UniqueAddress, n: u64) {
        if n == 0 {
            return;
        }
        let count = self.count_of(node).saturating_add(n);
        self.counts.insert(node.clone(), count);
        self.delta.insert(node.clone(), count);
    }

    /// The sum of all nodes' counts.
    pub fn value(&self) -> u128 {
        self.counts
            .values()
            .fold(0u128, |sum, &count| sum.saturating_add(u128::from(count)))
    }

    /// What `node` has added (0 when it never incremented).
    pub fn count_of(&self, node: &UniqueAddress) -> u64 {
        self.counts.get(node).copied().unwrap_or(0)
    }
}

impl ReplicatedData for GCounter {
    fn merge(&self, other: &Self) -> Self {
        Self {
            counts: merge_max(&self.counts, &other.counts),
            delta: self.delta.clone(),
        }
    }
}

impl DeltaReplicatedData for GCounter {
    /// The incremented nodes at their new counts.
    type Delta = GCounter;

    fn delta(&self) -> Option<GCounter> {
        if self.delta.is_empty() {
            return None;
        }
        Some(GCounter {
            counts: self.delta.clone(),
            delta: BTreeMap::new(),
        })
    }

    fn reset_delta(&mut self) {
        self.delta.clear();
    }

    fn merge_delta(&mut self, delta: &GCounter) {
        *self = self.merge(delta);
    }
}

impl RemovedNodePruning for GCounter {
    fn modified_by_nodes(&self) -> BTreeSet<UniqueAddress> {
        self.counts.keys().cloned().collect()
    }

    fn need_pruning_from(&self, removed: &UniqueAddress) -> bool {
        self.counts.contains_key(removed)
    }

    /// Adds `removed`'s count to `collapse_into`'s. The value is unchanged unless the sum
    /// exceeds `u64::MAX`, where it saturates.
    fn prune(&mut self, removed: &UniqueAddress, collapse_into: &UniqueAddress) {
        if removed == collapse_into {
            return;
        }
        self.delta.clear();
        if let Some(count) = self.counts.remove(removed) {
            let collapsed = self.count_of(collapse_into).saturating_add(count);
            self.counts.insert(collapse_into.clone(), collapsed);
        }
    }

    fn prune_cleanup(&mut self, removed: &UniqueAddress) {
        self.delta.clear();
        self.counts.remove(removed);
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
    fn value_is_the_sum_of_all_nodes_increments() {
        let mut a = GCounter::new();
        a.increment(&node(1), 3);
        a.increment(&node(1), 2);
        let mut b = GCounter::new();
        b.increment(&node(2), 10);
        assert_eq!(a.value(), 5);
        assert_eq!(a.merge(&b).value(), 15);
    }

    #[test]
    fn merge_keeps_the_highest_count_per_node() {
        let mut a = GCounter::new();
        a.increment(&node(1), 1);
        let mut newer = a.clone();
        newer.increment(&node(1), 4);
        assert_eq!(a.merge(&newer).value(), 5);
        assert_eq!(newer.merge(&a).value(), 5);
        assert_eq!(newer.merge(&newer), newer);
    }

    #[test]
    fn delta_carries_changed_nodes_only() {
        let mut a = GCounter::new();
        a.increment(&node(1), 1);
        a.increment(&node(2), 7);
        a.reset_delta();
        assert_eq!(a.delta(), None);
        a.increment(&node(1), 2);
        let delta = a.delta().unwrap();
        assert_eq!(delta.value(), 3);
        assert_eq!(delta.modified_by_nodes(), BTreeSet::from([node(1)]));
    }

    #[test]
    fn counts_saturate_instead_of_overflowing() {
        let mut a = GCounter::new();
        a.increment(&node(1), u64::MAX);
        a.increment(&node(1), 5);
        a.increment(&node(2), u64::MAX);
        assert_eq!(a.count_of(&node(1)), u64::MAX);
        assert_eq!(a.value(), 2 * u128::from(u64::MAX));
    }

    #[test]
    fn pruning_collapses_counts_and_keeps_the_value() {
        let mut a = GCounter::new();
        a.increment(&node(1), 3);
        a.increment(&node(2), 4);
        a.increment(&node(3), 5);
        a.prune(&node(2), &node(1));
        assert_eq!(a.value(), 12);
        assert_eq!(a.count_of(&node(1)), 7);
        assert!(!a.need_pruning_from(&node(2)));
        assert_eq!(a.modified_by_nodes(), BTreeSet::from([node(1), node(3)]));
    }

    #[test]
    fn pruning_saturates_a_collapsed_count_beyond_u64() {
        let mut a = GCounter::new();
        a.increment(&node(1), 1);
        a.increment(&node(2), u64::MAX);
        a.prune(&node(2), &node(1));
        assert_eq!(a.count_of(&node(1)), u64::MAX);
        assert_eq!(a.value(), u128::from(u64::MAX));
    }

    #[test]
    fn prune_cleanup_drops_late_entries_of_the_removed_node() {
        let mut pruned = GCounter::new();
        pruned.increment(&node(1), 3);
        pruned.increment(&node(2), 4);
        let mut late = pruned.clone();
        pruned.prune(&node(2), &node(1));
        late.prune_cleanup(&node(2));
        let merged = pruned.merge(&late);
        assert_eq!(merged.value(), 7);
        assert!(!merged.need_pruning_from(&node(2)));
    }
}
