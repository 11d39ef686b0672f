//! The reachability table: which observer currently sees which subject as unreachable.
//!
//! Every observer owns its own rows and versions them; a merge keeps, per observer, the rows of
//! the higher version. A subject is unreachable while any observer says so, and reachable again
//! only once every observer that said so has changed its mind (or was removed).

use crate::address::UniqueAddress;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// One observer's verdict on one subject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReachabilityStatus {
    Reachable,
    Unreachable,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct ObserverRows {
    version: u64,
    /// Only subjects this observer currently finds unreachable; an observer with no
    /// unreachable subject keeps its version and an empty map.
    unreachable: BTreeSet<UniqueAddress>,
}

/// Observer → subject reachability records, merged by per-observer version.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Reachability {
    observers: BTreeMap<UniqueAddress, ObserverRows>,
}

impl Reachability {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `observer`'s verdict on `subject`; returns true when the table changed.
    pub fn set(
        &mut self,
        observer: &UniqueAddress,
        subject: &UniqueAddress,
        status: ReachabilityStatus,
    ) -> bool {
        let rows = self.observers.entry(observer.clone()).or_default();
        let changed = match status {
            ReachabilityStatus::Unreachable => rows.unreachable.insert(subject.clone()),
            ReachabilityStatus::Reachable => rows.unreachable.remove(subject),
        };
        if changed {
            rows.version = rows.version.saturating_add(1);
        }
        changed
    }

    /// Keeps, per observer, the rows of the higher version. Equal versions from one observer
    /// hold equal rows; should they not, the union is kept so the merge stays commutative.
    pub fn merge(&self, other: &Reachability) -> Reachability {
        let mut observers = self.observers.clone();
        for (observer, theirs) in &other.observers {
            match observers.get_mut(observer) {
                Some(mine) if mine.version > theirs.version => {}
                Some(mine) if mine.version == theirs.version => {
                    mine.unreachable.extend(theirs.unreachable.iter().cloned());
                }
                _ => {
                    observers.insert(observer.clone(), theirs.clone());
                }
            }
        }
        Reachability { observers }
    }

    /// Forgets every row in which a removed node is observer or subject.
    pub fn remove_nodes(&mut self, nodes: &BTreeSet<UniqueAddress>) {
        self.observers
            .retain(|observer, _| !nodes.contains(observer));
        // Versions stay as they are: every replica drops the same rows for the same
        // tombstones, so no bump is needed to make the removal win a merge.
        for rows in self.observers.values_mut() {
            rows.unreachable.retain(|subject| !nodes.contains(subject));
        }
    }

    pub fn is_reachable(&self, subject: &UniqueAddress) -> bool {
        !self
            .observers
            .values()
            .any(|rows| rows.unreachable.contains(subject))
    }

    /// Whether `observer` itself reports `subject` unreachable.
    pub fn is_unreachable_by(&self, observer: &UniqueAddress, subject: &UniqueAddress) -> bool {
        self.observers
            .get(observer)
            .is_some_and(|rows| rows.unreachable.contains(subject))
    }

    /// Every subject some observer reports unreachable.
    pub fn all_unreachable(&self) -> BTreeSet<UniqueAddress> {
        self.observers
            .values()
            .flat_map(|rows| rows.unreachable.iter().cloned())
            .collect()
    }

    /// Observers that report at least one subject unreachable.
    pub fn observers_with_unreachable(&self) -> BTreeSet<UniqueAddress> {
        self.observers
            .iter()
            .filter(|(_, rows)| !rows.unreachable.is_empty())
            .map(|(observer, _)| observer.clone())
            .collect()
    }

    /// Observers reporting `subject` unreachable.
    pub fn observers_of(&self, subject: &UniqueAddress) -> BTreeSet<UniqueAddress> {
        self.observers
            .iter()
            .filter(|(_, rows)| rows.unreachable.contains(subject))
            .map(|(observer, _)| observer.clone())
            .collect()
    }

    /// Nodes that are both reported unreachable and themselves report others unreachable:
    /// the signature of a one-way or partial partition rather than a clean split. The
    /// split-brain resolver downs them, since no side can claim them.
    pub fn indirectly_connected(&self) -> BTreeSet<UniqueAddress> {
        let observers = self.observers_with_unreachable();
        self.all_unreachable()
            .into_iter()
            .filter(|subject| observers.contains(subject))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::Address;

    fn node(i: u16) -> UniqueAddress {
        UniqueAddress::new(Address::new("127.0.0.1", 1000 + i), u64::from(i))
    }

    #[test]
    fn subject_is_reachable_again_only_when_all_observers_agree() {
        let mut r = Reachability::new();
        r.set(&node(1), &node(3), ReachabilityStatus::Unreachable);
        r.set(&node(2), &node(3), ReachabilityStatus::Unreachable);
        assert!(!r.is_reachable(&node(3)));
        r.set(&node(1), &node(3), ReachabilityStatus::Reachable);
        assert!(!r.is_reachable(&node(3)));
        r.set(&node(2), &node(3), ReachabilityStatus::Reachable);
        assert!(r.is_reachable(&node(3)));
    }

    #[test]
    fn merge_keeps_newer_rows_per_observer() {
        let mut old = Reachability::new();
        old.set(&node(1), &node(3), ReachabilityStatus::Unreachable);
        let mut new = old.clone();
        new.set(&node(1), &node(3), ReachabilityStatus::Reachable);
        assert!(old.merge(&new).is_reachable(&node(3)));
        assert!(new.merge(&old).is_reachable(&node(3)));
    }

    #[test]
    fn removing_an_observer_drops_its_verdicts() {
        let mut r = Reachability::new();
        r.set(&node(1), &node(3), ReachabilityStatus::Unreachable);
        r.remove_nodes(&BTreeSet::from([node(1)]));
        assert!(r.is_reachable(&node(3)));
    }

    #[test]
    fn one_way_partition_shows_as_indirectly_connected() {
        let mut r = Reachability::new();
        r.set(&node(1), &node(2), ReachabilityStatus::Unreachable);
        r.set(&node(2), &node(1), ReachabilityStatus::Unreachable);
        r.set(&node(3), &node(4), ReachabilityStatus::Unreachable);
        assert_eq!(r.indirectly_connected(), BTreeSet::from([node(1), node(2)]));
    }
}
