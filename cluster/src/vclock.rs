//! Vector clocks versioning the gossip state.

use crate::address::UniqueAddress;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// How two versions relate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VersionOrdering {
    Same,
    Before,
    After,
    Concurrent,
}

/// A set of (node, counter) pairs; each change to the gossip state increments the changing
/// node's counter. Entries of removed nodes are pruned so the clock does not grow forever.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct VectorClock {
    versions: BTreeMap<UniqueAddress, u64>,
}

impl VectorClock {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one more change made by `node`.
    pub fn increment(&mut self, node: &UniqueAddress) {
        let counter = self.versions.entry(node.clone()).or_insert(0);
        *counter = counter.saturating_add(1);
    }

    /// The pointwise maximum of both clocks.
    pub fn merge(&self, other: &VectorClock) -> VectorClock {
        let mut versions = self.versions.clone();
        for (node, &counter) in &other.versions {
            let entry = versions.entry(node.clone()).or_insert(0);
            *entry = (*entry).max(counter);
        }
        VectorClock { versions }
    }

    /// Drops the entry of a removed node.
    pub fn prune(&mut self, node: &UniqueAddress) {
        self.versions.remove(node);
    }

    pub fn nodes(&self) -> impl Iterator<Item = &UniqueAddress> {
        self.versions.keys()
    }

    pub fn compare(&self, other: &VectorClock) -> VersionOrdering {
        compare_versions(&self.versions, &other.versions)
    }
}

/// How two version maps (node → counter, a missing node counting as 0) relate. Shared by the
/// gossip's vector clocks and Distributed Data's version vectors.
pub fn compare_versions(
    a: &BTreeMap<UniqueAddress, u64>,
    b: &BTreeMap<UniqueAddress, u64>,
) -> VersionOrdering {
    let mut less = false;
    let mut greater = false;
    for node in a.keys().chain(b.keys()) {
        let x = a.get(node).copied().unwrap_or(0);
        let y = b.get(node).copied().unwrap_or(0);
        match x.cmp(&y) {
            Ordering::Less => less = true,
            Ordering::Greater => greater = true,
            Ordering::Equal => {}
        }
        if less && greater {
            return VersionOrdering::Concurrent;
        }
    }
    match (less, greater) {
        (false, false) => VersionOrdering::Same,
        (true, false) => VersionOrdering::Before,
        (false, true) => VersionOrdering::After,
        (true, true) => VersionOrdering::Concurrent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::Address;
    use proptest::prelude::*;

    fn node(i: u16) -> UniqueAddress {
        UniqueAddress::new(Address::new("127.0.0.1", 1000 + i), u64::from(i))
    }

    fn clock(increments: &[u16]) -> VectorClock {
        let mut c = VectorClock::new();
        for &i in increments {
            c.increment(&node(i));
        }
        c
    }

    #[test]
    fn increment_orders_versions() {
        let a = clock(&[1]);
        let b = clock(&[1, 1]);
        assert_eq!(a.compare(&b), VersionOrdering::Before);
        assert_eq!(b.compare(&a), VersionOrdering::After);
        assert_eq!(a.compare(&a.clone()), VersionOrdering::Same);
        assert_eq!(
            clock(&[1]).compare(&clock(&[2])),
            VersionOrdering::Concurrent
        );
    }

    proptest! {
        #[test]
        fn merge_is_after_or_same_as_both(xs in prop::collection::vec(0u16..4, 0..12), ys in prop::collection::vec(0u16..4, 0..12)) {
            let (a, b) = (clock(&xs), clock(&ys));
            let m = a.merge(&b);
            prop_assert!(matches!(m.compare(&a), VersionOrdering::After | VersionOrdering::Same));
            prop_assert!(matches!(m.compare(&b), VersionOrdering::After | VersionOrdering::Same));
            prop_assert_eq!(m.clone(), b.merge(&a));
            prop_assert_eq!(m.merge(&m), m);
        }
    }
}
