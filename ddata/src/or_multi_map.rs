//! Observed-remove multimaps: keys bound to sets of values.

use crate::crdt::{DeltaReplicatedData, Element, RemovedNodePruning, ReplicatedData};
use crate::dot_kernel::{DotKernel, DotValue};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use tessera_cluster::UniqueAddress;

/// One bound value, stored under the dot of the write that bound it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
struct Binding<V>(V);

impl<V: Ord + Clone> DotValue for Binding<V> {
    /// A dot binds one value; should two copies disagree (decoded input), keep the greater.
    fn join(&self, other: &Self) -> Self {
        self.max(other).clone()
    }
}

/// A map from keys to sets of values, each binding added and removed with observed-remove
/// semantics: a binding added concurrently with its removal, or with the removal of its key,
/// survives; a removal affects only the bindings it observed.
///
/// Every (key, value) binding is its own dot and all keys share one causal context, so this is
/// the multimap of Almeida et al.'s delta-state CRDTs rather than Akka's `ORMap` of `ORSet`s:
/// removing a key removes exactly the bindings it saw, and a concurrent `add_binding` brings
/// back only its own binding. A key with no bindings is absent.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(bound(deserialize = "K: Element, V: Element"))]
pub struct ORMultiMap<K, V> {
    kernel: DotKernel<K, Binding<V>>,
    /// Changes since the last `reset_delta`, as a kernel.
    #[serde(skip)]
    delta: Option<DotKernel<K, Binding<V>>>,
}

impl<K, V> Default for ORMultiMap<K, V> {
    fn default() -> Self {
        Self {
            kernel: DotKernel::default(),
            delta: None,
        }
    }
}

impl<K: PartialEq, V: PartialEq> PartialEq for ORMultiMap<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.kernel == other.kernel
    }
}

impl<K: Element, V: Element> ORMultiMap<K, V> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Binds `value` to `key` on behalf of `node` (refreshing the binding if it exists).
    pub fn add_binding(&mut self, node: &UniqueAddress, key: K, value: V) {
        let delta = self
            .kernel
            .insert(node, key, Binding(value.clone()), |_, bound| {
                bound.0 == value
            });
        DotKernel::accumulate(&mut self.delta, delta);
    }

    /// Unbinds `value` from `key`, as far as this replica has observed the binding.
    pub fn remove_binding(&mut self, key: &K, value: &V) {
        if let Some(delta) = self.kernel.remove(key, |_, bound| bound.0 == *value) {
            DotKernel::accumulate(&mut self.delta, delta);
        }
    }

    /// Replaces the bindings of `key` this replica has observed by `values`, on behalf of
    /// `node`. An empty set removes the key.
    pub fn put(&mut self, node: &UniqueAddress, key: K, values: BTreeSet<V>) {
        self.remove(&key);
        for value in values {
            let delta = self
                .kernel
                .insert(node, key.clone(), Binding(value), |_, _| false);
            DotKernel::accumulate(&mut self.delta, delta);
        }
    }

    /// Removes every binding of `key` this replica has observed.
    pub fn remove(&mut self, key: &K) {
        if let Some(delta) = self.kernel.remove(key, |_, _| true) {
            DotKernel::accumulate(&mut self.delta, delta);
        }
    }

    /// The values bound to `key`.
    pub fn get(&self, key: &K) -> Option<BTreeSet<V>> {
        let dots = self.kernel.get(key)?;
        Some(dots.values().map(|bound| bound.0.clone()).collect())
    }

    /// Whether `value` is bound to `key`.
    pub fn contains_binding(&self, key: &K, value: &V) -> bool {
        self.kernel
            .get(key)
            .is_some_and(|dots| dots.values().any(|bound| bound.0 == *value))
    }

    pub fn contains_key(&self, key: &K) -> bool {
        self.kernel.get(key).is_some()
    }

    /// The keys in order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.kernel.iter().map(|(key, _)| key)
    }

    /// Every key with its values.
    pub fn entries(&self) -> BTreeMap<K, BTreeSet<V>> {
        self.kernel
            .iter()
            .map(|(key, dots)| {
                let values = dots.values().map(|bound| bound.0.clone()).collect();
                (key.clone(), values)
            })
            .collect()
    }

    /// The number of keys with at least one binding.
    pub fn len(&self) -> usize {
        self.kernel.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<K: Element, V: Element> ReplicatedData for ORMultiMap<K, V> {
    fn merge(&self, other: &Self) -> Self {
        Self {
            kernel: self.kernel.merge(&other.kernel),
            delta: self.delta.clone(),
        }
    }
}

impl<K: Element, V: Element> DeltaReplicatedData for ORMultiMap<K, V> {
    /// The bindings added since the last reset, and a context naming them and the bindings
    /// removed or replaced.
    type Delta = ORMultiMap<K, V>;

    fn delta(&self) -> Option<ORMultiMap<K, V>> {
        self.delta.clone().map(|kernel| ORMultiMap {
            kernel,
            delta: None,
        })
    }

    fn reset_delta(&mut self) {
        self.delta = None;
    }

    fn merge_delta(&mut self, delta: &ORMultiMap<K, V>) {
        self.kernel = self.kernel.merge(&delta.kernel);
    }
}

impl<K: Element, V: Element> RemovedNodePruning for ORMultiMap<K, V> {
    fn modified_by_nodes(&self) -> BTreeSet<UniqueAddress> {
        self.kernel.nodes(|_, _| {})
    }

    /// Drops `removed`'s dots and re-binds, under a fresh dot of `collapse_into`, every value
    /// that only those dots kept bound.
    fn prune(&mut self, removed: &UniqueAddress, collapse_into: &UniqueAddress) {
        self.delta = None;
        self.kernel.prune_with(removed, collapse_into, |dots| {
            let mut moved = BTreeSet::new();
            dots.retain(|dot, bound| {
                let moves = dot.node == *removed;
                if moves {
                    moved.insert(bound.clone());
                }
                !moves
            });
            moved.retain(|bound| !dots.values().any(|kept| kept == bound));
            moved.into_iter().collect()
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
    fn add_and_remove_bindings() {
        let mut m = ORMultiMap::new();
        m.add_binding(&node(1), key("k"), 1);
        m.add_binding(&node(1), key("k"), 2);
        m.add_binding(&node(1), key("j"), 3);
        m.remove_binding(&key("k"), &1);
        assert_eq!(m.get(&key("k")), Some(BTreeSet::from([2])));
        assert!(m.contains_binding(&key("j"), &3));
        m.remove_binding(&key("j"), &3);
        assert!(!m.contains_key(&key("j")));
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn bindings_of_one_key_accumulate() {
        let mut m = ORMultiMap::new();
        m.add_binding(&node(1), key("k"), 1);
        m.add_binding(&node(2), key("k"), 2);
        m.add_binding(&node(1), key("k"), 1);
        assert_eq!(m.get(&key("k")), Some(BTreeSet::from([1, 2])));
    }

    #[test]
    fn put_replaces_the_observed_set() {
        let mut m = ORMultiMap::new();
        m.add_binding(&node(1), key("k"), 1);
        m.add_binding(&node(1), key("k"), 2);
        m.put(&node(1), key("k"), BTreeSet::from([2, 3]));
        assert_eq!(m.get(&key("k")), Some(BTreeSet::from([2, 3])));
        m.put(&node(1), key("k"), BTreeSet::new());
        assert!(m.is_empty());
    }

    #[test]
    fn concurrent_add_and_remove_of_a_binding_add_wins() {
        let mut a = ORMultiMap::new();
        a.add_binding(&node(1), key("k"), 1);
        let mut b = a.clone();
        b.remove_binding(&key("k"), &1);
        a.add_binding(&node(1), key("k"), 1);
        assert_eq!(a.merge(&b).get(&key("k")), Some(BTreeSet::from([1])));
    }

    #[test]
    fn removing_the_last_binding_does_not_undo_a_concurrent_removal_elsewhere() {
        let mut a = ORMultiMap::new();
        a.add_binding(&node(1), key("k"), 1);
        let mut b = a.clone();
        a.remove_binding(&key("k"), &1);
        b.add_binding(&node(2), key("k"), 2);
        assert_eq!(a.merge(&b).get(&key("k")), Some(BTreeSet::from([2])));
    }

    #[test]
    fn key_removal_concurrent_with_add_binding_keeps_only_the_new_binding() {
        let mut a = ORMultiMap::new();
        a.add_binding(&node(1), key("k"), 1);
        a.add_binding(&node(1), key("k"), 2);
        let mut b = a.clone();
        b.remove(&key("k"));
        a.add_binding(&node(1), key("k"), 3);
        assert_eq!(a.merge(&b).get(&key("k")), Some(BTreeSet::from([3])));
    }

    #[test]
    fn remove_of_unobserved_bindings_does_nothing() {
        let mut a = ORMultiMap::new();
        a.add_binding(&node(1), key("k"), 1);
        let mut b = ORMultiMap::new();
        b.remove(&key("k"));
        b.remove_binding(&key("k"), &1);
        assert_eq!(b.delta(), None);
        assert_eq!(b.merge(&a).get(&key("k")), Some(BTreeSet::from([1])));
    }

    #[test]
    fn delta_reaches_the_same_state_as_the_full_state() {
        let mut a = ORMultiMap::new();
        a.add_binding(&node(1), key("k"), 1);
        a.add_binding(&node(1), key("j"), 1);
        let mut b = a.clone();
        a.reset_delta();
        a.remove_binding(&key("k"), &1);
        a.put(&node(1), key("j"), BTreeSet::from([5, 6]));
        b.merge_delta(&a.delta().unwrap());
        assert_eq!(b, a);
    }

    #[test]
    fn pruning_rebinds_and_cleanup_drops_late_bindings() {
        let mut leader = ORMultiMap::new();
        leader.add_binding(&node(1), key("k"), 1);
        let mut other = ORMultiMap::new();
        other.add_binding(&node(2), key("k"), 2);
        other.add_binding(&node(2), key("j"), 2);
        let mut leader = leader.merge(&other);
        let expected = leader.entries();
        leader.prune(&node(2), &node(1));
        assert_eq!(leader.entries(), expected);
        assert_eq!(leader.modified_by_nodes(), BTreeSet::from([node(1)]));
        other.prune_cleanup(&node(2));
        assert!(other.is_empty());
        assert_eq!(leader.merge(&other).entries(), expected);
    }
}
