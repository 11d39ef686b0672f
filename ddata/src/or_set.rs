//! Observed-remove sets.

use crate::crdt::{DeltaReplicatedData, Element, RemovedNodePruning, ReplicatedData};
use crate::dot_kernel::DotKernel;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use tessera_cluster::UniqueAddress;

/// A set with add and remove where a remove only undoes the adds it has observed: an add
/// concurrent with a remove of the same element wins, and removing an element another replica
/// added unseen changes nothing there.
///
/// Each add tags the element with a fresh dot (node, counter) and replaces the dots it had; a
/// remove drops the element's dots. The causal context remembers every dot seen, so a merge can
/// tell "removed here" from "not seen here yet" (see `dot_kernel`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(bound(deserialize = "T: Element"))]
pub struct ORSet<T> {
    kernel: DotKernel<T, ()>,
    /// Adds and removes since the last `reset_delta`, as a kernel.
    #[serde(skip)]
    delta: Option<DotKernel<T, ()>>,
}

impl<T> Default for ORSet<T> {
    fn default() -> Self {
        Self {
            kernel: DotKernel::default(),
            delta: None,
        }
    }
}

impl<T: PartialEq> PartialEq for ORSet<T> {
    fn eq(&self, other: &Self) -> bool {
        self.kernel == other.kernel
    }
}

impl<T: Element> ORSet<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `element` on behalf of `node`. Re-adding a present element refreshes its dot, so a
    /// concurrent remove of the earlier add does not remove it.
    pub fn add(&mut self, node: &UniqueAddress, element: T) {
        let delta = self.kernel.insert(node, element, (), |_, _| true);
        DotKernel::accumulate(&mut self.delta, delta);
    }

    /// Removes `element` as far as this replica has observed it.
    pub fn remove(&mut self, element: &T) {
        if let Some(delta) = self.kernel.remove(element, |_, _| true) {
            DotKernel::accumulate(&mut self.delta, delta);
        }
    }

    /// Removes every element this replica has observed.
    pub fn clear(&mut self) {
        if let Some(delta) = self.kernel.clear() {
            DotKernel::accumulate(&mut self.delta, delta);
        }
    }

    pub fn contains(&self, element: &T) -> bool {
        self.kernel.get(element).is_some()
    }

    /// The elements in order.
    pub fn elements(&self) -> impl Iterator<Item = &T> {
        self.kernel.iter().map(|(element, _)| element)
    }

    pub fn len(&self) -> usize {
        self.kernel.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T: Element> ReplicatedData for ORSet<T> {
    fn merge(&self, other: &Self) -> Self {
        Self {
            kernel: self.kernel.merge(&other.kernel),
            delta: self.delta.clone(),
        }
    }
}

impl<T: Element> DeltaReplicatedData for ORSet<T> {
    /// The dots added since the last reset, and a context naming them and the dots removed
    /// or replaced, so applying it removes exactly what the sender removed.
    type Delta = ORSet<T>;

    fn delta(&self) -> Option<ORSet<T>> {
        self.delta.clone().map(|kernel| ORSet {
            kernel,
            delta: None,
        })
    }

    fn reset_delta(&mut self) {
        self.delta = None;
    }

    fn merge_delta(&mut self, delta: &ORSet<T>) {
        self.kernel = self.kernel.merge(&delta.kernel);
    }
}

impl<T: Element> RemovedNodePruning for ORSet<T> {
    fn modified_by_nodes(&self) -> BTreeSet<UniqueAddress> {
        self.kernel.nodes(|_, _| {})
    }

    /// Drops `removed`'s dots and re-adds, under a fresh dot of `collapse_into`, every element
    /// that only those dots kept in the set (Akka re-adds every element `removed` touched; an
    /// element with another live dot needs nothing).
    fn prune(&mut self, removed: &UniqueAddress, collapse_into: &UniqueAddress) {
        self.delta = None;
        self.kernel.prune_with(removed, collapse_into, |dots| {
            dots.retain(|dot, _| dot.node != *removed);
            if dots.is_empty() {
                vec![()]
            } else {
                Vec::new()
            }
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

    fn elements(set: &ORSet<String>) -> Vec<&str> {
        set.elements().map(String::as_str).collect()
    }

    #[test]
    fn add_remove_and_contains() {
        let mut a = ORSet::new();
        a.add(&node(1), "x".to_string());
        a.add(&node(1), "y".to_string());
        a.remove(&"x".to_string());
        assert_eq!(elements(&a), ["y"]);
        assert!(!a.contains(&"x".to_string()));
        a.clear();
        assert!(a.is_empty());
    }

    #[test]
    fn concurrent_add_and_remove_add_wins() {
        let mut a = ORSet::new();
        a.add(&node(1), "x".to_string());
        let mut b = a.clone();
        b.remove(&"x".to_string());
        a.add(&node(1), "x".to_string());
        assert_eq!(elements(&a.merge(&b)), ["x"]);
        assert_eq!(elements(&b.merge(&a)), ["x"]);
    }

    #[test]
    fn concurrent_adds_on_two_nodes_survive_a_remove_that_saw_one() {
        let mut a = ORSet::new();
        a.add(&node(1), "x".to_string());
        let mut b = ORSet::new();
        b.add(&node(2), "x".to_string());
        let mut c = a.clone();
        c.remove(&"x".to_string());
        let merged = a.merge(&b).merge(&c);
        assert_eq!(elements(&merged), ["x"]);
    }

    #[test]
    fn remove_of_an_unobserved_add_does_nothing() {
        let mut a = ORSet::new();
        a.add(&node(1), "x".to_string());
        let mut b: ORSet<String> = ORSet::new();
        b.remove(&"x".to_string());
        assert_eq!(b.delta(), None);
        assert_eq!(elements(&b.merge(&a)), ["x"]);
    }

    #[test]
    fn observed_remove_propagates() {
        let mut a = ORSet::new();
        a.add(&node(1), "x".to_string());
        let mut b = a.clone();
        b.remove(&"x".to_string());
        assert!(a.merge(&b).is_empty());
        assert!(b.merge(&a).is_empty());
    }

    #[test]
    fn delta_of_a_remove_removes_at_the_receiver() {
        let mut a = ORSet::new();
        a.add(&node(1), "x".to_string());
        a.add(&node(1), "y".to_string());
        let mut b = a.clone();
        a.reset_delta();
        a.remove(&"x".to_string());
        a.add(&node(1), "z".to_string());
        b.merge_delta(&a.delta().unwrap());
        assert_eq!(b, a);
        assert_eq!(elements(&b), ["y", "z"]);
    }

    #[test]
    fn deltas_delivered_out_of_order_still_converge() {
        let mut a = ORSet::new();
        a.add(&node(1), "x".to_string());
        let first = a.delta().unwrap();
        a.reset_delta();
        a.remove(&"x".to_string());
        let second = a.delta().unwrap();
        let mut b = ORSet::new();
        b.merge_delta(&second);
        b.merge_delta(&first);
        assert_eq!(b, a);
        assert!(b.is_empty());
    }

    #[test]
    fn pruning_moves_elements_to_collapse_into_and_keeps_them() {
        let mut a = ORSet::new();
        a.add(&node(2), "x".to_string());
        a.add(&node(1), "y".to_string());
        a.add(&node(2), "z".to_string());
        a.remove(&"z".to_string());
        assert!(a.need_pruning_from(&node(2)));
        a.prune(&node(2), &node(1));
        assert_eq!(elements(&a), ["x", "y"]);
        assert!(!a.need_pruning_from(&node(2)));
        assert_eq!(a.modified_by_nodes(), BTreeSet::from([node(1)]));
    }

    #[test]
    fn prune_cleanup_drops_late_dots_and_the_pruned_state_keeps_the_elements() {
        let mut leader = ORSet::new();
        leader.add(&node(2), "x".to_string());
        let mut late = leader.clone();
        late.add(&node(2), "x".to_string());
        leader.prune(&node(2), &node(1));
        late.prune_cleanup(&node(2));
        assert!(!late.need_pruning_from(&node(2)));
        let merged = leader.merge(&late);
        assert_eq!(elements(&merged), ["x"]);
        assert!(!merged.need_pruning_from(&node(2)));
    }
}
