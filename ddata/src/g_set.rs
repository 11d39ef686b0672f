//! Grow-only sets.

use crate::crdt::{DeltaReplicatedData, Element, ReplicatedData};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// A set that only grows: merge is the union. Elements can never be removed, which is what makes
/// it the cheapest set (no node ids, no tombstones).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(bound(deserialize = "T: Element"))]
pub struct GSet<T> {
    elements: BTreeSet<T>,
    /// Elements added since the last `reset_delta`.
    #[serde(skip)]
    delta: BTreeSet<T>,
}

impl<T> Default for GSet<T> {
    fn default() -> Self {
        Self {
            elements: BTreeSet::new(),
            delta: BTreeSet::new(),
        }
    }
}

impl<T: PartialEq> PartialEq for GSet<T> {
    fn eq(&self, other: &Self) -> bool {
        self.elements == other.elements
    }
}

impl<T: Element> GSet<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `element` (nothing changes if it is already there).
    pub fn add(&mut self, element: T) {
        if self.elements.insert(element.clone()) {
            self.delta.insert(element);
        }
    }

    pub fn contains(&self, element: &T) -> bool {
        self.elements.contains(element)
    }

    /// The elements in order.
    pub fn elements(&self) -> impl Iterator<Item = &T> {
        self.elements.iter()
    }

    pub fn len(&self) -> usize {
        self.elements.len()
    }

    pub fn is_empty(&self) -> bool {
        self.elements.is_empty()
    }
}

impl<T: Element> ReplicatedData for GSet<T> {
    fn merge(&self, other: &Self) -> Self {
        Self {
            elements: self.elements.union(&other.elements).cloned().collect(),
            delta: self.delta.clone(),
        }
    }
}

impl<T: Element> DeltaReplicatedData for GSet<T> {
    /// The elements added since the last reset.
    type Delta = GSet<T>;

    fn delta(&self) -> Option<GSet<T>> {
        if self.delta.is_empty() {
            return None;
        }
        Some(GSet {
            elements: self.delta.clone(),
            delta: BTreeSet::new(),
        })
    }

    fn reset_delta(&mut self) {
        self.delta.clear();
    }

    fn merge_delta(&mut self, delta: &GSet<T>) {
        self.elements.extend(delta.elements.iter().cloned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_is_the_union() {
        let mut a = GSet::new();
        a.add("a".to_string());
        a.add("b".to_string());
        let mut b = GSet::new();
        b.add("b".to_string());
        b.add("c".to_string());
        let merged = a.merge(&b);
        assert_eq!(merged.elements().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(merged, b.merge(&a));
        assert!(merged.contains(&"c".to_string()));
        assert_eq!(merged.len(), 3);
    }

    #[test]
    fn delta_holds_the_newly_added_elements() {
        let mut a = GSet::new();
        a.add(1);
        a.reset_delta();
        a.add(1);
        assert_eq!(a.delta(), None);
        a.add(2);
        let delta = a.delta().unwrap();
        assert_eq!(delta.elements().copied().collect::<Vec<_>>(), [2]);
        let mut seen = GSet::new();
        seen.add(1);
        seen.merge_delta(&delta);
        assert_eq!(seen, a);
    }
}
