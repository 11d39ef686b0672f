//! Dots and causal contexts: the bookkeeping behind the observed-remove types.
//!
//! A dot names one event (an add, an update) by the node that made it and that node's event
//! counter. A causal context is the set of dots a replica has seen, kept as a version vector
//! for the contiguous prefix per node plus a "dot cloud" for the dots seen out of order (which
//! deltas and pruning produce). Almeida, Shoker, Baquero: "Delta State Replicated Data Types".

use crate::crdt::ReplicatedData;
use crate::version_vector::VersionVector;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use tessera_cluster::UniqueAddress;

/// One event: the `counter`-th event made by `node`. Counters start at 1.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub(crate) struct Dot {
    pub(crate) node: UniqueAddress,
    pub(crate) counter: u64,
}

/// The set of dots a replica has seen.
///
/// Canonical in memory: `compact` holds, per node, the longest prefix 1..=n of counters seen,
/// and `cloud` only dots beyond a gap. So two contexts are equal exactly when they hold the same
/// dots.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "DotContextWire")]
pub(crate) struct DotContext {
    compact: VersionVector,
    cloud: BTreeSet<Dot>,
}

/// The encoded form; decoding compacts it, since a peer's bytes may not be canonical.
#[derive(Deserialize)]
struct DotContextWire {
    compact: VersionVector,
    cloud: BTreeSet<Dot>,
}

impl From<DotContextWire> for DotContext {
    fn from(wire: DotContextWire) -> Self {
        let mut context = DotContext {
            compact: wire.compact,
            cloud: wire.cloud,
        };
        context.compact_cloud();
        context
    }
}

impl DotContext {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Whether this context has seen `dot`.
    pub(crate) fn contains(&self, dot: &Dot) -> bool {
        dot.counter <= self.compact.version_at(&dot.node) || self.cloud.contains(dot)
    }

    /// Whether the context holds no dot at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.compact.is_empty() && self.cloud.is_empty()
    }

    /// Makes a dot `node` has not used in anything this context has seen, and records it.
    ///
    /// Saturates at `u64::MAX` events per node (reusing the last dot) rather than wrapping.
    pub(crate) fn next_dot(&mut self, node: &UniqueAddress) -> Dot {
        let highest_in_cloud = self
            .cloud
            .range(Self::node_range(node))
            .next_back()
            .map_or(0, |dot| dot.counter);
        let counter = self
            .compact
            .version_at(node)
            .max(highest_in_cloud)
            .saturating_add(1);
        let dot = Dot {
            node: node.clone(),
            counter,
        };
        self.insert(dot.clone());
        dot
    }

    /// Records `dot` as seen.
    pub(crate) fn insert(&mut self, dot: Dot) {
        let seen = self.compact.version_at(&dot.node);
        if dot.counter <= seen {
            return;
        }
        if dot.counter != seen.saturating_add(1) {
            self.cloud.insert(dot);
            return;
        }
        // The dot extends the contiguous prefix; absorb whatever the cloud holds right after it.
        let mut top = dot.counter;
        while top < u64::MAX
            && self.cloud.remove(&Dot {
                node: dot.node.clone(),
                counter: top + 1,
            })
        {
            top += 1;
        }
        self.compact.raise_to(&dot.node, top);
    }

    /// The union of both contexts.
    pub(crate) fn merge(&self, other: &DotContext) -> DotContext {
        let mut merged = DotContext {
            compact: self.compact.merge(&other.compact),
            cloud: self.cloud.union(&other.cloud).cloned().collect(),
        };
        merged.compact_cloud();
        merged
    }

    /// Forgets every dot of `node` (pruning).
    pub(crate) fn remove_node(&mut self, node: &UniqueAddress) {
        self.compact.remove(node);
        self.cloud.retain(|dot| dot.node != *node);
    }

    /// Adds every node this context has seen a dot of to `nodes`.
    pub(crate) fn collect_nodes(&self, nodes: &mut BTreeSet<UniqueAddress>) {
        nodes.extend(self.compact.entries().map(|(node, _)| node.clone()));
        nodes.extend(self.cloud.iter().map(|dot| dot.node.clone()));
    }

    /// Moves cloud dots that now extend (or fall inside) the contiguous prefix into it.
    /// One pass suffices: the cloud is ordered by node, then counter.
    fn compact_cloud(&mut self) {
        let cloud = std::mem::take(&mut self.cloud);
        for dot in cloud {
            let seen = self.compact.version_at(&dot.node);
            if dot.counter <= seen {
                continue;
            }
            if dot.counter == seen.saturating_add(1) {
                self.compact.raise_to(&dot.node, dot.counter);
            } else {
                self.cloud.insert(dot);
            }
        }
    }

    fn node_range(node: &UniqueAddress) -> std::ops::RangeInclusive<Dot> {
        Dot {
            node: node.clone(),
            counter: 0,
        }..=Dot {
            node: node.clone(),
            counter: u64::MAX,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_cluster::Address;

    fn node(i: u16) -> UniqueAddress {
        UniqueAddress::new(Address::new("127.0.0.1", 2550 + i), u64::from(i) + 1)
    }

    fn dot(i: u16, counter: u64) -> Dot {
        Dot {
            node: node(i),
            counter,
        }
    }

    fn context(dots: &[(u16, u64)]) -> DotContext {
        let mut c = DotContext::new();
        for &(i, counter) in dots {
            c.insert(dot(i, counter));
        }
        c
    }

    #[test]
    fn out_of_order_dots_wait_in_the_cloud_until_the_gap_closes() {
        let mut c = context(&[(1, 1), (1, 3), (1, 4)]);
        assert!(c.contains(&dot(1, 3)));
        assert!(!c.contains(&dot(1, 2)));
        assert_eq!(c.cloud.len(), 2);
        c.insert(dot(1, 2));
        assert!(c.cloud.is_empty());
        assert_eq!(c.compact.version_at(&node(1)), 4);
    }

    #[test]
    fn next_dot_is_beyond_everything_seen_of_that_node() {
        let mut c = context(&[(1, 1), (1, 5)]);
        assert_eq!(c.next_dot(&node(1)), dot(1, 6));
        assert_eq!(c.next_dot(&node(2)), dot(2, 1));
        assert!(c.contains(&dot(1, 6)));
    }

    #[test]
    fn merge_is_the_union_in_canonical_form() {
        let a = context(&[(1, 1), (1, 3), (2, 2)]);
        let b = context(&[(1, 2), (2, 1)]);
        let merged = a.merge(&b);
        assert_eq!(merged, context(&[(1, 1), (1, 2), (1, 3), (2, 1), (2, 2)]));
        assert!(merged.cloud.is_empty());
        assert_eq!(merged, b.merge(&a));
    }

    #[test]
    fn remove_node_forgets_its_dots_everywhere() {
        let mut c = context(&[(1, 1), (1, 3), (2, 1)]);
        c.remove_node(&node(1));
        assert_eq!(c, context(&[(2, 1)]));
    }
}
