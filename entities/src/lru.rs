//! The order in which a partition's live entities were last used, for the active-entity
//! limit: which one to passivate first.

use std::collections::BTreeMap;

/// Keys ordered by their last use. Each key is held under a *tick*, a number that only grows;
/// its owner keeps the tick to move or remove the key. Every operation is O(log n), and a use
/// moves the key without cloning it.
#[derive(Debug)]
pub(crate) struct LruOrder<K> {
    by_tick: BTreeMap<u64, K>,
    next_tick: u64,
}

impl<K> LruOrder<K> {
    pub(crate) fn new() -> Self {
        LruOrder {
            by_tick: BTreeMap::new(),
            next_tick: 0,
        }
    }

    fn tick(&mut self) -> u64 {
        let tick = self.next_tick;
        // 2^64 uses at one per nanosecond take over 500 years.
        self.next_tick = self.next_tick.wrapping_add(1);
        tick
    }

    /// Adds `key` as the most recently used; returns its tick.
    pub(crate) fn insert(&mut self, key: K) -> u64 {
        let tick = self.tick();
        self.by_tick.insert(tick, key);
        tick
    }

    /// Marks the key held under `tick` as the most recently used; returns its new tick (the
    /// same tick when there is no such key).
    pub(crate) fn touch(&mut self, tick: u64) -> u64 {
        match self.by_tick.remove(&tick) {
            Some(key) => self.insert(key),
            None => tick,
        }
    }

    /// Removes the key held under `tick`.
    pub(crate) fn remove(&mut self, tick: u64) -> Option<K> {
        self.by_tick.remove(&tick)
    }

    /// The least recently used key.
    pub(crate) fn least_recent(&self) -> Option<&K> {
        self.by_tick.first_key_value().map(|(_, key)| key)
    }

    pub(crate) fn len(&self) -> usize {
        self.by_tick.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_key_comes_first_and_a_use_moves_a_key_last() {
        let mut order = LruOrder::new();
        let a = order.insert("a");
        let b = order.insert("b");
        let _c = order.insert("c");
        assert_eq!(order.least_recent(), Some(&"a"));
        let a = order.touch(a);
        assert_eq!(order.least_recent(), Some(&"b"));
        assert_eq!(order.remove(b), Some("b"));
        assert_eq!(order.least_recent(), Some(&"c"));
        assert_eq!(order.len(), 2);
        assert_eq!(order.touch(b), b, "a removed key's tick moves nothing");
        assert_eq!(order.remove(a), Some("a"));
        assert_eq!(order.len(), 1);
    }
}
