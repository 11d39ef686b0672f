//! Maps of last-writer-wins values.

use crate::crdt::{DeltaReplicatedData, Element, RemovedNodePruning, ReplicatedData};
use crate::lww_register::{LWWRegister, next_timestamp};
use crate::or_map::ORMap;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use tessera_cluster::UniqueAddress;

/// A map whose values are last-writer-wins registers: concurrent puts of a key resolve to the
/// latest write, and keys are removed observed-remove style (a put concurrent with a remove
/// wins). An `ORMap` of `LWWRegister`s, as in Akka.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(bound(deserialize = "K: Element, V: Element"))]
pub struct LWWMap<K, V> {
    map: ORMap<K, LWWRegister<V>>,
}

impl<K, V> Default for LWWMap<K, V> {
    fn default() -> Self {
        Self {
            map: ORMap::default(),
        }
    }
}

impl<K: PartialEq, V: PartialEq> PartialEq for LWWMap<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.map == other.map
    }
}

impl<K: Element, V: Element> LWWMap<K, V> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` to `value` on behalf of `node`. The write is stamped
    /// `next_timestamp(current, now_ms)`, so it wins over every write this replica has seen
    /// even when the local clock is behind the writer of the current value.
    pub fn put(&mut self, node: &UniqueAddress, key: K, value: V, now_ms: u64) {
        let current_ms = self
            .map
            .get(&key)
            .map_or(0, |register| register.timestamp_ms());
        let register = LWWRegister::new(node.clone(), value, next_timestamp(current_ms, now_ms));
        self.map.put(node, key, register);
    }

    /// The latest value written under `key`.
    pub fn get(&self, key: &K) -> Option<V> {
        self.map.get(key).map(|register| register.value().clone())
    }

    /// Removes `key` as far as this replica has observed its writes.
    pub fn remove(&mut self, key: &K) {
        self.map.remove(key);
    }

    pub fn contains_key(&self, key: &K) -> bool {
        self.map.contains_key(key)
    }

    /// The keys in order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.map.keys()
    }

    /// Every key with its latest value.
    pub fn entries(&self) -> BTreeMap<K, V> {
        self.map
            .entries()
            .into_iter()
            .map(|(key, register)| (key, register.value().clone()))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl<K: Element, V: Element> ReplicatedData for LWWMap<K, V> {
    fn merge(&self, other: &Self) -> Self {
        Self {
            map: self.map.merge(&other.map),
        }
    }
}

impl<K: Element, V: Element> DeltaReplicatedData for LWWMap<K, V> {
    /// The underlying `ORMap` delta: the registers written and the writes replaced or removed.
    type Delta = LWWMap<K, V>;

    fn delta(&self) -> Option<LWWMap<K, V>> {
        self.map.delta().map(|map| LWWMap { map })
    }

    fn reset_delta(&mut self) {
        self.map.reset_delta();
    }

    fn merge_delta(&mut self, delta: &LWWMap<K, V>) {
        self.map.merge_delta(&delta.map);
    }
}

impl<K: Element, V: Element> RemovedNodePruning for LWWMap<K, V> {
    fn modified_by_nodes(&self) -> BTreeSet<UniqueAddress> {
        self.map.modified_by_nodes()
    }

    fn need_pruning_from(&self, removed: &UniqueAddress) -> bool {
        self.map.need_pruning_from(removed)
    }

    fn prune(&mut self, removed: &UniqueAddress, collapse_into: &UniqueAddress) {
        self.map.prune(removed, collapse_into);
    }

    fn prune_cleanup(&mut self, removed: &UniqueAddress) {
        self.map.prune_cleanup(removed);
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
    fn put_get_and_remove() {
        let mut map = LWWMap::new();
        map.put(&node(1), key("a"), 1, 100);
        map.put(&node(1), key("b"), 2, 100);
        map.put(&node(1), key("a"), 3, 101);
        assert_eq!(map.get(&key("a")), Some(3));
        map.remove(&key("b"));
        assert_eq!(map.entries(), BTreeMap::from([(key("a"), 3)]));
    }

    #[test]
    fn concurrent_puts_resolve_to_the_latest_write() {
        let mut a = LWWMap::new();
        a.put(&node(1), key("k"), "old".to_string(), 100);
        let mut b = a.clone();
        a.put(&node(1), key("k"), "a".to_string(), 200);
        b.put(&node(2), key("k"), "b".to_string(), 300);
        assert_eq!(a.merge(&b).get(&key("k")), Some("b".to_string()));
        assert_eq!(b.merge(&a).get(&key("k")), Some("b".to_string()));
    }

    #[test]
    fn a_put_after_an_observed_write_wins_even_with_a_lagging_clock() {
        let mut a = LWWMap::new();
        a.put(&node(1), key("k"), 1, 1_000);
        let mut b = a.clone();
        b.put(&node(2), key("k"), 2, 10);
        assert_eq!(a.merge(&b).get(&key("k")), Some(2));
    }

    #[test]
    fn a_put_is_stamped_after_the_write_it_replaced() {
        let mut a = LWWMap::new();
        a.put(&node(1), key("k"), 1, 1_000);
        let mut b = a.clone();
        // b's clock lags: the put is stamped 1_001, not 10, so it beats a concurrent put
        // stamped 500 that never saw the write at 1_000.
        b.put(&node(2), key("k"), 2, 10);
        let mut c = LWWMap::new();
        c.put(&node(3), key("k"), 3, 500);
        assert_eq!(b.merge(&c).get(&key("k")), Some(2));
        assert_eq!(c.merge(&b).get(&key("k")), Some(2));
    }

    #[test]
    fn equal_timestamps_are_won_by_the_lower_node() {
        let mut a = LWWMap::new();
        a.put(&node(2), key("k"), "from 2".to_string(), 50);
        let mut b = LWWMap::new();
        b.put(&node(1), key("k"), "from 1".to_string(), 50);
        assert_eq!(a.merge(&b).get(&key("k")), Some("from 1".to_string()));
        assert_eq!(b.merge(&a).get(&key("k")), Some("from 1".to_string()));
    }

    #[test]
    fn put_concurrent_with_remove_wins() {
        let mut a = LWWMap::new();
        a.put(&node(1), key("k"), 1, 1);
        let mut b = a.clone();
        b.remove(&key("k"));
        a.put(&node(1), key("k"), 2, 2);
        assert_eq!(a.merge(&b).get(&key("k")), Some(2));
    }

    #[test]
    fn pruning_keeps_values_and_cleanup_drops_late_writes() {
        let mut leader = LWWMap::new();
        leader.put(&node(2), key("k"), 7, 10);
        let mut late = leader.clone();
        leader.prune(&node(2), &node(1));
        assert_eq!(leader.get(&key("k")), Some(7));
        assert!(!leader.need_pruning_from(&node(2)));
        late.prune_cleanup(&node(2));
        assert!(late.is_empty());
        assert_eq!(leader.merge(&late).get(&key("k")), Some(7));
    }
}
