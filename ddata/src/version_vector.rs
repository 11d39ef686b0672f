//! Version vectors: how many changes of each node a replica has seen.

use crate::crdt::{DeltaReplicatedData, RemovedNodePruning, ReplicatedData};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use tessera_cluster::UniqueAddress;
pub use tessera_cluster::vclock::VersionOrdering;

/// A counter per node, merged by taking the maximum; comparing two vectors tells whether one
/// replica has seen everything the other has (Before/After/Same) or neither has (Concurrent).
///
/// Nodes without an entry are at version 0, and no entry is ever 0, so equal vectors are equal
/// maps. Counters saturate at `u64::MAX` instead of wrapping.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(from = "VersionVectorWire")]
pub struct VersionVector {
    versions: BTreeMap<UniqueAddress, u64>,
    /// Entries incremented since the last `reset_delta`, at their new versions.
    #[serde(skip)]
    delta: BTreeMap<UniqueAddress, u64>,
}

/// The encoded form; decoding drops zero entries so every vector in memory is canonical.
#[derive(Deserialize)]
struct VersionVectorWire {
    versions: BTreeMap<UniqueAddress, u64>,
}

impl From<VersionVectorWire> for VersionVector {
    fn from(wire: VersionVectorWire) -> Self {
        let mut versions = wire.versions;
        versions.retain(|_, version| *version > 0);
        Self {
            versions,
            delta: BTreeMap::new(),
        }
    }
}

impl PartialEq for VersionVector {
    fn eq(&self, other: &Self) -> bool {
        self.versions == other.versions
    }
}

impl Eq for VersionVector {}

impl VersionVector {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one more change made by `node`.
    pub fn increment(&mut self, node: &UniqueAddress) {
        let version = self.version_at(node).saturating_add(1);
        self.versions.insert(node.clone(), version);
        self.delta.insert(node.clone(), version);
    }

    /// How many changes of `node` this vector has seen (0 when it has no entry).
    pub fn version_at(&self, node: &UniqueAddress) -> u64 {
        self.versions.get(node).copied().unwrap_or(0)
    }

    /// How this vector relates to `other`: `Before` when `other` has seen everything this one
    /// has and more, `Concurrent` when each has seen something the other has not.
    pub fn compare(&self, other: &VersionVector) -> VersionOrdering {
        tessera_cluster::vclock::compare_versions(&self.versions, &other.versions)
    }

    /// Whether no node has an entry.
    pub fn is_empty(&self) -> bool {
        self.versions.is_empty()
    }

    /// The (node, version) entries in node order.
    pub fn entries(&self) -> impl Iterator<Item = (&UniqueAddress, u64)> {
        self.versions.iter().map(|(node, &version)| (node, version))
    }

    /// Raises `node`'s entry to `version` (never lowers it). Used by the causal context, which
    /// advances the contiguous prefix without going through `increment`.
    pub(crate) fn raise_to(&mut self, node: &UniqueAddress, version: u64) {
        if version > self.version_at(node) {
            self.versions.insert(node.clone(), version);
        }
    }

    /// Drops `node`'s entry.
    pub(crate) fn remove(&mut self, node: &UniqueAddress) -> Option<u64> {
        self.versions.remove(node)
    }
}

/// The pointwise maximum of two per-node counter maps: the join shared by version vectors and
/// grow-only counters.
pub(crate) fn merge_max(
    a: &BTreeMap<UniqueAddress, u64>,
    b: &BTreeMap<UniqueAddress, u64>,
) -> BTreeMap<UniqueAddress, u64> {
    let mut merged = a.clone();
    for (node, &counter) in b {
        let entry = merged.entry(node.clone()).or_insert(0);
        *entry = (*entry).max(counter);
    }
    merged
}

impl ReplicatedData for VersionVector {
    fn merge(&self, other: &Self) -> Self {
        Self {
            versions: merge_max(&self.versions, &other.versions),
            delta: self.delta.clone(),
        }
    }
}

impl DeltaReplicatedData for VersionVector {
    /// The incremented entries at their new versions.
    type Delta = VersionVector;

    fn delta(&self) -> Option<VersionVector> {
        if self.delta.is_empty() {
            return None;
        }
        Some(VersionVector {
            versions: self.delta.clone(),
            delta: BTreeMap::new(),
        })
    }

    fn reset_delta(&mut self) {
        self.delta.clear();
    }

    fn merge_delta(&mut self, delta: &VersionVector) {
        *self = self.merge(delta);
    }
}

impl RemovedNodePruning for VersionVector {
    fn modified_by_nodes(&self) -> BTreeSet<UniqueAddress> {
        self.versions.keys().cloned().collect()
    }

    fn need_pruning_from(&self, removed: &UniqueAddress) -> bool {
        self.versions.contains_key(removed)
    }

    /// Drops `removed`'s entry and increments `collapse_into`'s, so the pruned vector is a new
    /// version rather than one that looks older than what other replicas hold (as in Akka).
    fn prune(&mut self, removed: &UniqueAddress, collapse_into: &UniqueAddress) {
        if removed == collapse_into {
            return;
        }
        self.delta.clear();
        if self.versions.remove(removed).is_some() {
            self.increment(collapse_into);
            self.delta.clear();
        }
    }

    fn prune_cleanup(&mut self, removed: &UniqueAddress) {
        self.delta.clear();
        self.versions.remove(removed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_cluster::Address;

    fn node(i: u16) -> UniqueAddress {
        UniqueAddress::new(Address::new("127.0.0.1", 2550 + i), u64::from(i) + 1)
    }

    fn vector(increments: &[u16]) -> VersionVector {
        let mut v = VersionVector::new();
        for &i in increments {
            v.increment(&node(i));
        }
        v
    }

    #[test]
    fn increment_orders_versions() {
        let a = vector(&[1]);
        let b = vector(&[1, 1]);
        assert_eq!(a.compare(&b), VersionOrdering::Before);
        assert_eq!(b.compare(&a), VersionOrdering::After);
        assert_eq!(a.compare(&a.clone()), VersionOrdering::Same);
        assert_eq!(
            vector(&[1]).compare(&vector(&[2])),
            VersionOrdering::Concurrent
        );
        assert_eq!(b.version_at(&node(1)), 2);
        assert_eq!(b.version_at(&node(2)), 0);
    }

    #[test]
    fn merge_takes_the_maximum_per_node() {
        let merged = vector(&[1, 1, 2]).merge(&vector(&[1, 2, 2, 3]));
        assert_eq!(merged, vector(&[1, 1, 2, 2, 3]));
        assert_eq!(merged.compare(&vector(&[1, 1, 2])), VersionOrdering::After);
    }

    #[test]
    fn delta_holds_incremented_entries_only() {
        let mut v = vector(&[1, 2]);
        v.reset_delta();
        assert_eq!(v.delta(), None);
        v.increment(&node(2));
        assert_eq!(v.delta(), Some(vector(&[2, 2])));
        let mut other = vector(&[1, 2, 3]);
        other.merge_delta(&v.delta().unwrap_or_default());
        assert_eq!(other, vector(&[1, 2, 2, 3]));
    }

    #[test]
    fn prune_drops_removed_entry_and_bumps_collapse_into() {
        let mut v = vector(&[1, 2, 2, 3]);
        assert!(v.need_pruning_from(&node(2)));
        v.prune(&node(2), &node(1));
        assert_eq!(v, vector(&[1, 1, 3]));
        assert!(!v.modified_by_nodes().contains(&node(2)));
        assert!(!v.need_pruning_from(&node(2)));
        // Pruning a node the vector does not record changes nothing.
        v.prune(&node(2), &node(1));
        assert_eq!(v, vector(&[1, 1, 3]));
    }

    #[test]
    fn prune_cleanup_drops_late_entries() {
        let mut late = vector(&[2, 2, 3]);
        late.prune_cleanup(&node(2));
        assert_eq!(late, vector(&[3]));
    }

    #[test]
    fn increment_saturates_instead_of_wrapping() {
        let at_max = BTreeMap::from([(node(1), u64::MAX)]);
        let bytes = crate::codec::encode("map", &at_max).unwrap();
        let mut v: VersionVector = crate::codec::decode("VersionVector", &bytes).unwrap();
        v.increment(&node(1));
        assert_eq!(v.version_at(&node(1)), u64::MAX);
    }
}
