//! Observed-remove maps of CRDT values.

use crate::crdt::{DeltaReplicatedData, Element, RemovedNodePruning, ReplicatedData};
use crate::dot_kernel::DotKernel;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use tessera_cluster::UniqueAddress;

/// A map from keys to CRDT values with observed-remove keys: a remove drops the writes it has
/// observed, and a put or update concurrent with a remove wins (as in Akka's ORMap).
///
/// Each put or update stores the key's whole new value under a fresh dot, replacing the dots it
/// observed; concurrent writes leave several dots and reading the key merges their values. So a
/// value is always a proper merge of writes, and a write that survives a concurrent remove keeps
/// what its writer had seen. Deltas carry whole values of the written keys.
///
/// A value type that is itself dot-based (`ORSet`, `ORMap`) can lose elements if a key is
/// removed and re-created by the same node while an older copy of it is still being updated
/// elsewhere: the re-created value starts its dots afresh. For sets of values use `ORMultiMap`,
/// which shares one causal context across all keys and has no such gap.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(bound(deserialize = "K: Element, V: ReplicatedData"))]
pub struct ORMap<K, V> {
    kernel: DotKernel<K, V>,
    /// Writes and removes since the last `reset_delta`, as a kernel.
    #[serde(skip)]
    delta: Option<DotKernel<K, V>>,
}

impl<K, V> Default for ORMap<K, V> {
    fn default() -> Self {
        Self {
            kernel: DotKernel::default(),
            delta: None,
        }
    }
}

impl<K: PartialEq, V: PartialEq> PartialEq for ORMap<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.kernel == other.kernel
    }
}

impl<K: Element, V: ReplicatedData> ORMap<K, V> {
    pub fn new() -> Self {
        Self::default()
    }

    /// The value of `key`: the merge of its concurrent writes.
    pub fn get(&self, key: &K) -> Option<V> {
        let mut values = self.kernel.get(key)?.values();
        let first = values.next()?.clone();
        Some(values.fold(first, |merged, value| merged.merge(value)))
    }

    pub fn contains_key(&self, key: &K) -> bool {
        self.kernel.get(key).is_some()
    }

    /// The keys in order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.kernel.iter().map(|(key, _)| key)
    }

    /// Every key with its value.
    pub fn entries(&self) -> BTreeMap<K, V> {
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

    /// Removes `key` as far as this replica has observed its writes.
    pub fn remove(&mut self, key: &K) {
        if let Some(delta) = self.kernel.remove(key, |_, _| true) {
            DotKernel::accumulate(&mut self.delta, delta);
        }
    }
}

impl<K: Element, V: DeltaReplicatedData> ORMap<K, V> {
    /// Sets `key` to `value` on behalf of `node`, replacing the writes this replica has seen.
    /// Prefer [`update`](Self::update) to change a value: a put discards what it replaces.
    ///
    /// The value's own pending delta is dropped: the map ships whole values.
    pub fn put(&mut self, node: &UniqueAddress, key: K, mut value: V) {
        value.reset_delta();
        let delta = self.kernel.insert(node, key, value, |_, _| true);
        DotKernel::accumulate(&mut self.delta, delta);
    }

    /// Applies `modify` to the value of `key` (or to `initial` when the key is absent) on behalf
    /// of `node`.
    pub fn update(
        &mut self,
        node: &UniqueAddress,
        key: K,
        initial: V,
        modify: impl FnOnce(&mut V),
    ) {
        let mut value = self.get(&key).unwrap_or(initial);
        modify(&mut value);
        self.put(node, key, value);
    }
}

impl<K: Element, V: ReplicatedData> ReplicatedData for ORMap<K, V> {
    fn merge(&self, other: &Self) -> Self {
        Self {
            kernel: self.kernel.merge(&other.kernel),
            delta: self.delta.clone(),
        }
    }
}

impl<K: Element, V: ReplicatedData> DeltaReplicatedData for ORMap<K, V> {
    /// The keys written since the last reset with their new values, and a context naming the
    /// writes they replaced and the keys removed.
    type Delta = ORMap<K, V>;

    fn delta(&self) -> Option<ORMap<K, V>> {
        self.delta.clone().map(|kernel| ORMap {
            kernel,
            delta: None,
        })
    }

    fn reset_delta(&mut self) {
        self.delta = None;
    }

    fn merge_delta(&mut self, delta: &ORMap<K, V>) {
        self.kernel = self.kernel.merge(&delta.kernel);
    }
}

impl<K: Element, V: RemovedNodePruning> RemovedNodePruning for ORMap<K, V> {
    fn modified_by_nodes(&self) -> BTreeSet<UniqueAddress> {
        self.kernel
            .nodes(|value, nodes| nodes.extend(value.modified_by_nodes()))
    }

    /// For every key that `removed` wrote or whose value records it: merges the key's writes
    /// into one value, prunes that value and writes it back under a fresh dot of
    /// `collapse_into`. Merging first matters: pruning each write separately could give two
    /// dot-based values colliding fresh dots.
    fn prune(&mut self, removed: &UniqueAddress, collapse_into: &UniqueAddress) {
        self.delta = None;
        self.kernel.prune_with(removed, collapse_into, |dots| {
            let affected = dots
                .iter()
                .any(|(dot, value)| dot.node == *removed || value.need_pruning_from(removed));
            if !affected {
                return Vec::new();
            }
            let mut values = std::mem::take(dots).into_values();
            let Some(first) = values.next() else {
                return Vec::new();
            };
            let mut merged = values.fold(first, |merged, value| merged.merge(&value));
            merged.prune(removed, collapse_into);
            vec![merged]
        });
    }

    fn prune_cleanup(&mut self, removed: &UniqueAddress) {
        self.delta = None;
        self.kernel
            .prune_cleanup_with(removed, |value| value.prune_cleanup(removed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::g_counter::GCounter;
    use crate::or_set::ORSet;
    use tessera_cluster::Address;

    fn node(i: u16) -> UniqueAddress {
        UniqueAddress::new(Address::new("127.0.0.1", 2550 + i), u64::from(i) + 1)
    }

    fn count(map: &ORMap<String, GCounter>, key: &str) -> Option<u128> {
        map.get(&key.to_string()).map(|counter| counter.value())
    }

    fn increment(map: &mut ORMap<String, GCounter>, i: u16, key: &str, n: u64) {
        map.update(&node(i), key.to_string(), GCounter::new(), |c| {
            c.increment(&node(i), n)
        });
    }

    #[test]
    fn update_put_get_and_remove() {
        let mut map = ORMap::new();
        increment(&mut map, 1, "a", 2);
        increment(&mut map, 1, "a", 3);
        increment(&mut map, 1, "b", 1);
        assert_eq!(count(&map, "a"), Some(5));
        map.put(&node(1), "b".to_string(), GCounter::new());
        assert_eq!(count(&map, "b"), Some(0));
        map.remove(&"a".to_string());
        assert_eq!(map.keys().collect::<Vec<_>>(), ["b"]);
        assert!(!map.contains_key(&"a".to_string()));
    }

    #[test]
    fn concurrent_updates_of_a_key_merge_their_values() {
        let mut a = ORMap::new();
        increment(&mut a, 1, "k", 1);
        let mut b = a.clone();
        increment(&mut a, 1, "k", 10);
        increment(&mut b, 2, "k", 100);
        assert_eq!(count(&a.merge(&b), "k"), Some(111));
        let mut c = a.merge(&b);
        increment(&mut c, 3, "k", 1000);
        assert_eq!(count(&c, "k"), Some(1111));
        assert_eq!(c.merge(&a).merge(&b), c);
    }

    #[test]
    fn update_concurrent_with_remove_wins() {
        let mut a = ORMap::new();
        increment(&mut a, 1, "k", 1);
        let mut b = a.clone();
        b.remove(&"k".to_string());
        increment(&mut a, 1, "k", 1);
        assert_eq!(count(&a.merge(&b), "k"), Some(2));
        assert_eq!(count(&b.merge(&a), "k"), Some(2));
    }

    #[test]
    fn observed_remove_removes_the_key_everywhere() {
        let mut a = ORMap::new();
        increment(&mut a, 1, "k", 1);
        let mut b = ORMap::new();
        increment(&mut b, 2, "k", 1);
        let mut merged = a.merge(&b);
        merged.remove(&"k".to_string());
        assert!(merged.merge(&a).merge(&b).is_empty());
    }

    #[test]
    fn remove_of_an_unobserved_key_does_nothing() {
        let mut a = ORMap::new();
        increment(&mut a, 1, "k", 1);
        let mut b: ORMap<String, GCounter> = ORMap::new();
        b.remove(&"k".to_string());
        assert_eq!(count(&b.merge(&a), "k"), Some(1));
    }

    #[test]
    fn delta_of_update_and_remove_reaches_the_same_state() {
        let mut a = ORMap::new();
        increment(&mut a, 1, "x", 1);
        increment(&mut a, 1, "y", 1);
        let mut b = a.clone();
        a.reset_delta();
        increment(&mut a, 1, "x", 1);
        a.remove(&"y".to_string());
        b.merge_delta(&a.delta().unwrap());
        assert_eq!(b, a);
        assert_eq!(b.entries().len(), 1);
    }

    #[test]
    fn nested_sets_merge_their_concurrent_changes() {
        let mut a: ORMap<String, ORSet<u32>> = ORMap::new();
        a.update(&node(1), "k".to_string(), ORSet::new(), |s| {
            s.add(&node(1), 1)
        });
        let mut b = a.clone();
        a.update(&node(1), "k".to_string(), ORSet::new(), |s| s.remove(&1));
        b.update(&node(2), "k".to_string(), ORSet::new(), |s| {
            s.add(&node(2), 2)
        });
        let merged = a.merge(&b).get(&"k".to_string()).unwrap();
        assert_eq!(merged.elements().copied().collect::<Vec<_>>(), [2]);
    }

    #[test]
    fn pruning_keeps_values_and_forgets_the_removed_node() {
        let mut leader = ORMap::new();
        increment(&mut leader, 1, "b", 1);
        let mut other = ORMap::new();
        increment(&mut other, 2, "a", 5);
        increment(&mut other, 2, "b", 7);
        let mut leader = leader.merge(&other);
        let late = leader.clone();
        leader.prune(&node(2), &node(1));
        assert_eq!(count(&leader, "a"), Some(5));
        assert_eq!(count(&leader, "b"), Some(8));
        assert!(!leader.need_pruning_from(&node(2)));
        let mut late = late;
        late.prune_cleanup(&node(2));
        assert!(!late.need_pruning_from(&node(2)));
        let merged = leader.merge(&late);
        assert_eq!(count(&merged, "b"), Some(8));
        assert!(!merged.need_pruning_from(&node(2)));
    }
}
