//! Maps of counters.

use crate::crdt::{DeltaReplicatedData, Element, RemovedNodePruning, ReplicatedData};
use crate::dot_kernel::{DotKernel, DotValue};
use crate::pn_counter::difference;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use tessera_cluster::UniqueAddress;

/// One node's total increments and decrements of one key, stored under that node's latest dot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Contribution {
    increments: u64,
    decrements: u64,
}

impl DotValue for Contribution {
    fn join(&self, other: &Self) -> Self {
        Contribution {
            increments: self.increments.max(other.increments),
            decrements: self.decrements.max(other.decrements),
        }
    }
}

impl Contribution {
    fn plus(self, other: Contribution) -> Contribution {
        Contribution {
            increments: self.increments.saturating_add(other.increments),
            decrements: self.decrements.saturating_add(other.decrements),
        }
    }
}

/// A map from keys to counters that go up and down, with observed-remove keys.
///
/// Per key, each node's running totals live under that node's latest dot, and the key's value
/// is the sum over nodes. A remove drops the contributions it observed; an increment concurrent
/// with it survives, carrying its node's whole contribution (the causal counter of Almeida et
/// al.). That is closer to a reset than Akka's `ORMap` of `PNCounter`s, where the concurrent
/// update brings back every node's counts. A node's totals saturate at `u64::MAX` per direction;
/// the value, an `i128`, is exact.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(bound(deserialize = "K: Element"))]
pub struct PNCounterMap<K> {
    kernel: DotKernel<K, Contribution>,
    /// Changes since the last `reset_delta`, as a kernel.
    #[serde(skip)]
    delta: Option<DotKernel<K, Contribution>>,
}

impl<K> Default for PNCounterMap<K> {
    fn default() -> Self {
        Self {
            kernel: DotKernel::default(),
            delta: None,
        }
    }
}

impl<K: PartialEq> PartialEq for PNCounterMap<K> {
    fn eq(&self, other: &Self) -> bool {
        self.kernel == other.kernel
    }
}

impl<K: Element> PNCounterMap<K> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `n` to `key`'s counter on behalf of `node`.
    pub fn increment(&mut self, node: &UniqueAddress, key: K, n: u64) {
        self.add(
            node,
            key,
            Contribution {
                increments: n,
                decrements: 0,
            },
        );
    }

    /// Subtracts `n` from `key`'s counter on behalf of `node`.
    pub fn decrement(&mut self, node: &UniqueAddress, key: K, n: u64) {
        self.add(
            node,
            key,
            Contribution {
                increments: 0,
                decrements: n,
            },
        );
    }

    /// The counter of `key`.
    pub fn get(&self, key: &K) -> Option<i128> {
        let (up, down) = self
            .kernel
            .get(key)?
            .values()
            .fold((0u128, 0u128), |(up, down), c| {
                (
                    up.saturating_add(u128::from(c.increments)),
                    down.saturating_add(u128::from(c.decrements)),
                )
            });
        Some(difference(up, down))
    }

    /// Removes `key` as far as this replica has observed its changes.
    pub fn remove(&mut self, key: &K) {
        if let Some(delta) = self.kernel.remove(key, |_, _| true) {
            DotKernel::accumulate(&mut self.delta, delta);
        }
    }

    pub fn contains_key(&self, key: &K) -> bool {
        self.kernel.get(key).is_some()
    }

    /// The keys in order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.kernel.iter().map(|(key, _)| key)
    }

    /// Every key with its counter.
    pub fn entries(&self) -> BTreeMap<K, i128> {
        self.keys()
            .filter_map(|key| Some((key.clone(), self.get(key)?)))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.kernel.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replaces `node`'s dot of `key` by a fresh one holding its total plus `change`.
    fn add(&mut self, node: &UniqueAddress, key: K, change: Contribution) {
        if change == Contribution::default() {
            return;
        }
        let current = self
            .kernel
            .get(&key)
            .map_or(Contribution::default(), |dots| {
                dots.iter()
                    .filter(|(dot, _)| dot.node == *node)
                    .fold(Contribution::default(), |own, (_, c)| own.join(c))
            });
        let delta = self
            .kernel
            .insert(node, key, current.plus(change), |dot, _| dot.node == *node);
        DotKernel::accumulate(&mut self.delta, delta);
    }
}

impl<K: Element> ReplicatedData for PNCounterMap<K> {
    fn merge(&self, other: &Self) -> Self {
        Self {
            kernel: self.kernel.merge(&other.kernel),
            delta: self.delta.clone(),
        }
    }
}

impl<K: Element> DeltaReplicatedData for PNCounterMap<K> {
    /// The changed keys with the changing nodes' new totals, and a context naming the totals
    /// they replaced and the keys removed.
    type Delta = PNCounterMap<K>;

    fn delta(&self) -> Option<PNCounterMap<K>> {
        self.delta.clone().map(|kernel| PNCounterMap {
            kernel,
            delta: None,
        })
    }

    fn reset_delta(&mut self) {
        self.delta = None;
    }

    fn merge_delta(&mut self, delta: &PNCounterMap<K>) {
        self.kernel = self.kernel.merge(&delta.kernel);
    }
}

impl<K: Element> RemovedNodePruning for PNCounterMap<K> {
    fn modified_by_nodes(&self) -> BTreeSet<UniqueAddress> {
        self.kernel.nodes(|_, _| {})
    }

    /// Per key, adds `removed`'s totals to `collapse_into`'s under a fresh dot of
    /// `collapse_into`. The value is unchanged unless a total saturates.
    fn prune(&mut self, removed: &UniqueAddress, collapse_into: &UniqueAddress) {
        self.delta = None;
        self.kernel.prune_with(removed, collapse_into, |dots| {
            if !dots.keys().any(|dot| dot.node == *removed) {
                return Vec::new();
            }
            let mut collapsed = Contribution::default();
            dots.retain(|dot, c| {
                let moves = dot.node == *removed || dot.node == *collapse_into;
                if moves {
                    collapsed = collapsed.plus(*c);
                }
                !moves
            });
            vec![collapsed]
        });
    }

    fn prune_cleanup(&mut self, removed: &UniqueAddress) {
        self.delta = None;
        self.kernel.prune_cleanup_with(removed, |_| {});
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_cluster::Address;

    fn node(i: u16) -> UniqueAddress {
        UniqueAddress::new(Address::new("127.0.0.1", 2550 + i), u64::from(i) + 1)
    }

    fn key(k: &str) -> String {
        k.to_string()
    }

    #[test]
    fn increments_and_decrements_per_key() {
        let mut a = PNCounterMap::new();
        a.increment(&node(1), key("x"), 5);
        a.decrement(&node(1), key("x"), 2);
        a.decrement(&node(1), key("y"), 4);
        let mut b = PNCounterMap::new();
        b.increment(&node(2), key("x"), 10);
        let merged = a.merge(&b);
        assert_eq!(
            merged.entries(),
            BTreeMap::from([(key("x"), 13), (key("y"), -4)])
        );
        assert_eq!(merged, b.merge(&a));
    }

    #[test]
    fn remove_drops_observed_counts_and_a_concurrent_increment_keeps_its_node_only() {
        let mut a = PNCounterMap::new();
        a.increment(&node(1), key("x"), 5);
        let mut b = a.clone();
        b.increment(&node(2), key("x"), 3);
        let mut c = b.clone();
        c.remove(&key("x"));
        b.increment(&node(2), key("x"), 1);
        let merged = c.merge(&b).merge(&a);
        // node 1's 5 was observed by the remove; node 2's contribution (3 + 1) survives.
        assert_eq!(merged.get(&key("x")), Some(4));
    }

    #[test]
    fn remove_of_an_unobserved_key_does_nothing() {
        let mut a = PNCounterMap::new();
        a.increment(&node(1), key("x"), 5);
        let mut b = PNCounterMap::new();
        b.remove(&key("x"));
        assert_eq!(b.merge(&a).get(&key("x")), Some(5));
    }

    #[test]
    fn delta_reaches_the_same_state_as_the_full_state() {
        let mut a = PNCounterMap::new();
        a.increment(&node(1), key("x"), 5);
        let mut b = a.clone();
        a.reset_delta();
        a.decrement(&node(1), key("x"), 1);
        a.increment(&node(1), key("z"), 2);
        b.merge_delta(&a.delta().unwrap());
        assert_eq!(b, a);
    }

    #[test]
    fn extreme_counts_saturate_without_panicking() {
        let mut a = PNCounterMap::new();
        a.increment(&node(1), key("x"), u64::MAX);
        a.increment(&node(1), key("x"), 1);
        a.decrement(&node(2), key("x"), u64::MAX);
        assert_eq!(a.get(&key("x")), Some(0));
    }

    #[test]
    fn pruning_collapses_counts_and_keeps_values() {
        let mut leader = PNCounterMap::new();
        leader.increment(&node(1), key("x"), 1);
        let mut other = PNCounterMap::new();
        other.increment(&node(2), key("x"), 10);
        other.decrement(&node(2), key("y"), 3);
        let mut leader = leader.merge(&other);
        leader.prune(&node(2), &node(1));
        assert_eq!(
            leader.entries(),
            BTreeMap::from([(key("x"), 11), (key("y"), -3)])
        );
        assert!(!leader.need_pruning_from(&node(2)));
        other.prune_cleanup(&node(2));
        assert!(!other.need_pruning_from(&node(2)));
        assert_eq!(leader.merge(&other), leader);
    }
}
