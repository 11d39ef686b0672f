//! Last-writer-wins registers.

use crate::crdt::{DeltaReplicatedData, Element, RemovedNodePruning, ReplicatedData};
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::BTreeSet;
use tessera_cluster::UniqueAddress;

/// The timestamp for a write that must win over a register last written at `current_ms`:
/// `now_ms`, or one past `current_ms` when the local clock is behind it. Akka's default clock.
pub fn next_timestamp(current_ms: u64, now_ms: u64) -> u64 {
    current_ms.saturating_add(1).max(now_ms)
}

/// A register holding one value; merge keeps the write with the highest timestamp.
///
/// Timestamps are passed in by the caller (this type reads no clock). Ties are broken the same
/// way on every replica: the lower writer node wins (as in Akka), and if the same node wrote
/// twice with the same timestamp, the greater value wins. Without that last rule two writes in
/// one millisecond could leave replicas disagreeing forever.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(bound(deserialize = "T: Element"))]
pub struct LWWRegister<T> {
    value: T,
    timestamp_ms: u64,
    node: UniqueAddress,
    /// Whether `set` was called since the last `reset_delta`; the delta is the whole register.
    #[serde(skip)]
    changed: bool,
}

impl<T: PartialEq> PartialEq for LWWRegister<T> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
            && self.timestamp_ms == other.timestamp_ms
            && self.node == other.node
    }
}

impl<T: Eq> Eq for LWWRegister<T> {}

impl<T: Element> LWWRegister<T> {
    /// A register holding `value`, written by `node` at `timestamp_ms`.
    pub fn new(node: UniqueAddress, value: T, timestamp_ms: u64) -> Self {
        Self {
            value,
            timestamp_ms,
            node,
            changed: false,
        }
    }

    /// Writes `value` on behalf of `node` at `timestamp_ms`. A write that loses to the current
    /// value by the merge order (an older timestamp) changes nothing, since it would lose the
    /// next merge anyway; pass `next_timestamp(self.timestamp_ms(), now_ms)` to make it win.
    pub fn set(&mut self, node: &UniqueAddress, value: T, timestamp_ms: u64) {
        let write = Self::new(node.clone(), value, timestamp_ms);
        if write.wins_over(self) {
            *self = Self {
                changed: true,
                ..write
            };
        }
    }

    pub fn value(&self) -> &T {
        &self.value
    }

    /// When the current value was written, in the writer's milliseconds.
    pub fn timestamp_ms(&self) -> u64 {
        self.timestamp_ms
    }

    /// The node that wrote the current value.
    pub fn updated_by(&self) -> &UniqueAddress {
        &self.node
    }

    /// Whether this register's write wins over `other`'s.
    fn wins_over(&self, other: &Self) -> bool {
        let order = self
            .timestamp_ms
            .cmp(&other.timestamp_ms)
            .then_with(|| other.node.cmp(&self.node))
            .then_with(|| self.value.cmp(&other.value));
        order == Ordering::Greater
    }
}

impl<T: Element> ReplicatedData for LWWRegister<T> {
    fn merge(&self, other: &Self) -> Self {
        if other.wins_over(self) {
            Self {
                changed: self.changed,
                ..other.clone()
            }
        } else {
            self.clone()
        }
    }
}

impl<T: Element> DeltaReplicatedData for LWWRegister<T> {
    /// The whole register: it is as small as any delta would be.
    type Delta = LWWRegister<T>;

    fn delta(&self) -> Option<LWWRegister<T>> {
        self.changed.then(|| Self {
            changed: false,
            ..self.clone()
        })
    }

    fn reset_delta(&mut self) {
        self.changed = false;
    }

    fn merge_delta(&mut self, delta: &LWWRegister<T>) {
        *self = self.merge(delta);
    }
}

impl<T: Element> RemovedNodePruning for LWWRegister<T> {
    fn modified_by_nodes(&self) -> BTreeSet<UniqueAddress> {
        BTreeSet::from([self.node.clone()])
    }

    fn need_pruning_from(&self, removed: &UniqueAddress) -> bool {
        self.node == *removed
    }

    /// Re-attributes a value written by `removed` to `collapse_into`; value and timestamp stay.
    fn prune(&mut self, removed: &UniqueAddress, collapse_into: &UniqueAddress) {
        self.changed = false;
        if self.node == *removed {
            self.node = collapse_into.clone();
        }
    }

    /// Nothing to drop: the writer is the register's only entry, and a late copy of a value the
    /// removed node wrote is still that value. It keeps naming the removed node until it is
    /// overwritten or loses a merge to the pruned copy.
    fn prune_cleanup(&mut self, _removed: &UniqueAddress) {
        self.changed = false;
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
    fn later_timestamp_wins() {
        let mut a = LWWRegister::new(node(1), "a".to_string(), 10);
        let mut b = a.clone();
        b.set(&node(2), "b".to_string(), 11);
        a.set(&node(1), "a2".to_string(), 5);
        assert_eq!(a.merge(&b).value(), "b");
        assert_eq!(b.merge(&a).value(), "b");
        assert_eq!(a.merge(&b).updated_by(), &node(2));
    }

    #[test]
    fn a_write_older_than_the_current_value_changes_nothing() {
        let mut a = LWWRegister::new(node(1), 1, 10);
        a.set(&node(1), 2, 9);
        assert_eq!((*a.value(), a.timestamp_ms()), (1, 10));
        assert_eq!(a.delta(), None);
        a.set(&node(1), 3, next_timestamp(a.timestamp_ms(), 9));
        assert_eq!((*a.value(), a.timestamp_ms()), (3, 11));
    }

    #[test]
    fn equal_timestamps_are_won_by_the_lower_node() {
        let a = LWWRegister::new(node(1), "from 1".to_string(), 7);
        let b = LWWRegister::new(node(2), "from 2".to_string(), 7);
        assert_eq!(a.merge(&b).value(), "from 1");
        assert_eq!(b.merge(&a).value(), "from 1");
    }

    #[test]
    fn same_node_and_timestamp_are_won_by_the_greater_value() {
        let a = LWWRegister::new(node(1), 3, 7);
        let b = LWWRegister::new(node(1), 4, 7);
        assert_eq!(a.merge(&b), b);
        assert_eq!(b.merge(&a), b);
    }

    #[test]
    fn next_timestamp_moves_past_the_current_write_when_the_clock_lags() {
        assert_eq!(next_timestamp(100, 500), 500);
        assert_eq!(next_timestamp(500, 100), 501);
        assert_eq!(next_timestamp(u64::MAX, 0), u64::MAX);
    }

    #[test]
    fn delta_is_the_whole_register_after_a_set() {
        let mut a = LWWRegister::new(node(1), 1, 1);
        assert_eq!(a.delta(), None);
        a.set(&node(1), 2, 2);
        let delta = a.delta().unwrap();
        let mut b = LWWRegister::new(node(1), 1, 1);
        b.merge_delta(&delta);
        assert_eq!(b, a);
        a.reset_delta();
        assert_eq!(a.delta(), None);
    }

    #[test]
    fn pruning_reattributes_the_writer_and_keeps_the_value() {
        let mut a = LWWRegister::new(node(2), 9, 3);
        assert!(a.need_pruning_from(&node(2)));
        a.prune(&node(2), &node(1));
        assert_eq!((*a.value(), a.timestamp_ms()), (9, 3));
        assert_eq!(a.modified_by_nodes(), BTreeSet::from([node(1)]));
        let mut late = LWWRegister::new(node(2), 9, 3);
        late.prune_cleanup(&node(2));
        assert_eq!(*a.merge(&late).value(), 9);
    }
}
