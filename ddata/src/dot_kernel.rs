//! The dot store shared by the observed-remove types: keys mapped to dotted values, plus the
//! causal context of every dot ever seen.
//!
//! This is the "map of dot functions" of Almeida et al.'s delta-state CRDTs. Each write puts a
//! value under a fresh dot and drops the dots it replaces (they stay in the context); a remove
//! drops dots. On merge a dot survives if both sides hold it, or if one side holds it and the
//! other has never seen it: a dot the other side has seen but no longer holds was removed there.
//! That rule is what makes removes affect only observed writes and concurrent writes win.
//! Deltas are kernels too: the written dots with their values, and a context naming the dots
//! written and replaced.

use crate::crdt::ReplicatedData;
use crate::dot_context::{Dot, DotContext};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use tessera_cluster::UniqueAddress;

/// A value stored under a dot. A dot is written once, so both sides of a merge normally hold the
/// same value for it; `join` decides deterministically when they differ (after pruning, or with
/// arbitrary decoded input).
pub(crate) trait DotValue: Clone {
    fn join(&self, other: &Self) -> Self;
}

impl DotValue for () {
    fn join(&self, _other: &()) {}
}

impl<V: ReplicatedData> DotValue for V {
    fn join(&self, other: &V) -> V {
        self.merge(other)
    }
}

/// Keys mapped to their live dots and the dots' values, with the shared causal context.
///
/// Invariants (restored on decode): no key maps to an empty dot map, and every dot in the store
/// is in the context.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(
    from = "DotKernelWire<K, V>",
    bound(deserialize = "K: Ord + Deserialize<'de>, V: Deserialize<'de>")
)]
pub(crate) struct DotKernel<K, V> {
    entries: BTreeMap<K, BTreeMap<Dot, V>>,
    context: DotContext,
}

/// The encoded form, normalised on decode.
#[derive(Deserialize)]
#[serde(bound(deserialize = "K: Ord + Deserialize<'de>, V: Deserialize<'de>"))]
struct DotKernelWire<K, V> {
    entries: BTreeMap<K, BTreeMap<Dot, V>>,
    context: DotContext,
}

impl<K: Ord, V> From<DotKernelWire<K, V>> for DotKernel<K, V> {
    fn from(wire: DotKernelWire<K, V>) -> Self {
        let mut entries = wire.entries;
        let mut context = wire.context;
        for dots in entries.values_mut() {
            dots.retain(|dot, _| dot.counter > 0);
            for dot in dots.keys() {
                context.insert(dot.clone());
            }
        }
        entries.retain(|_, dots| !dots.is_empty());
        Self { entries, context }
    }
}

impl<K, V> Default for DotKernel<K, V> {
    fn default() -> Self {
        Self {
            entries: BTreeMap::new(),
            context: DotContext::new(),
        }
    }
}

impl<K: Ord + Clone, V: DotValue> DotKernel<K, V> {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The live dots of `key` and their values.
    pub(crate) fn get(&self, key: &K) -> Option<&BTreeMap<Dot, V>> {
        self.entries.get(key)
    }

    /// Every key with at least one live dot, in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &BTreeMap<Dot, V>)> {
        self.entries.iter()
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Writes `value` under `key` with a fresh dot of `node`, first dropping the dots of `key`
    /// for which `replaces(dot, value)` holds. Returns the delta of this write.
    pub(crate) fn insert(
        &mut self,
        node: &UniqueAddress,
        key: K,
        value: V,
        replaces: impl Fn(&Dot, &V) -> bool,
    ) -> Self {
        let mut delta = Self::new();
        let dot = self.context.next_dot(node);
        let dots = self.entries.entry(key.clone()).or_default();
        dots.retain(|old, old_value| {
            let replaced = replaces(old, old_value);
            if replaced {
                delta.context.insert(old.clone());
            }
            !replaced
        });
        dots.insert(dot.clone(), value.clone());
        delta.context.insert(dot.clone());
        delta.entries.insert(key, BTreeMap::from([(dot, value)]));
        delta
    }

    /// Drops the dots of `key` for which `removes(dot, value)` holds. Returns the delta, or
    /// `None` when nothing was dropped.
    pub(crate) fn remove(&mut self, key: &K, removes: impl Fn(&Dot, &V) -> bool) -> Option<Self> {
        let dots = self.entries.get_mut(key)?;
        let mut delta = Self::new();
        dots.retain(|dot, value| {
            let removed = removes(dot, value);
            if removed {
                delta.context.insert(dot.clone());
            }
            !removed
        });
        if dots.is_empty() {
            self.entries.remove(key);
        }
        (!delta.context.is_empty()).then_some(delta)
    }

    /// Drops every live dot. Returns the delta, or `None` when the store was empty.
    pub(crate) fn clear(&mut self) -> Option<Self> {
        let mut delta = Self::new();
        for dots in std::mem::take(&mut self.entries).into_values() {
            for dot in dots.into_keys() {
                delta.context.insert(dot);
            }
        }
        (!delta.context.is_empty()).then_some(delta)
    }

    /// The join: per key, the dots both sides hold (values joined) and the dots one side holds
    /// that the other has never seen; contexts are united.
    pub(crate) fn merge(&self, other: &Self) -> Self {
        let mut entries = BTreeMap::new();
        for (key, dots) in &self.entries {
            let joined = join_dots(dots, &self.context, other.entries.get(key), &other.context);
            if !joined.is_empty() {
                entries.insert(key.clone(), joined);
            }
        }
        for (key, dots) in &other.entries {
            if self.entries.contains_key(key) {
                continue;
            }
            let unseen: BTreeMap<Dot, V> = dots
                .iter()
                .filter(|(dot, _)| !self.context.contains(dot))
                .map(|(dot, value)| (dot.clone(), value.clone()))
                .collect();
            if !unseen.is_empty() {
                entries.insert(key.clone(), unseen);
            }
        }
        Self {
            entries,
            context: self.context.merge(&other.context),
        }
    }

    /// Folds `delta` into the pending delta of a type (a delta group is their join).
    pub(crate) fn accumulate(pending: &mut Option<Self>, delta: Self) {
        *pending = Some(match pending.take() {
            Some(earlier) => earlier.merge(&delta),
            None => delta,
        });
    }

    /// Every node named by a dot in the store or the context, plus what `value_nodes` adds
    /// for each value.
    pub(crate) fn nodes(
        &self,
        mut value_nodes: impl FnMut(&V, &mut BTreeSet<UniqueAddress>),
    ) -> BTreeSet<UniqueAddress> {
        let mut nodes = BTreeSet::new();
        self.context.collect_nodes(&mut nodes);
        for dots in self.entries.values() {
            for (dot, value) in dots {
                nodes.insert(dot.node.clone());
                value_nodes(value, &mut nodes);
            }
        }
        nodes
    }

    /// Pruning: `rewrite` takes, per key, whatever dots it must move off `removed` out of the
    /// key's dot map and returns the values to write back under fresh dots of `collapse_into`;
    /// then the context forgets `removed`. Must run on `collapse_into`'s own replica, the only
    /// one that knows which of its dots are unused.
    pub(crate) fn prune_with(
        &mut self,
        removed: &UniqueAddress,
        collapse_into: &UniqueAddress,
        mut rewrite: impl FnMut(&mut BTreeMap<Dot, V>) -> Vec<V>,
    ) {
        if removed == collapse_into {
            return;
        }
        let Self { entries, context } = self;
        for dots in entries.values_mut() {
            for value in rewrite(dots) {
                dots.insert(context.next_dot(collapse_into), value);
            }
        }
        entries.retain(|_, dots| !dots.is_empty());
        context.remove_node(removed);
    }

    /// Pruning cleanup of a late state: drops the dots of `removed` from store and context and
    /// lets `clean` tidy each remaining value.
    pub(crate) fn prune_cleanup_with(
        &mut self,
        removed: &UniqueAddress,
        mut clean: impl FnMut(&mut V),
    ) {
        for dots in self.entries.values_mut() {
            dots.retain(|dot, _| dot.node != *removed);
            dots.values_mut().for_each(&mut clean);
        }
        self.entries.retain(|_, dots| !dots.is_empty());
        self.context.remove_node(removed);
    }
}

/// The dots of one key after a merge, given each side's dots for it and context.
fn join_dots<V: DotValue>(
    ours: &BTreeMap<Dot, V>,
    our_context: &DotContext,
    theirs: Option<&BTreeMap<Dot, V>>,
    their_context: &DotContext,
) -> BTreeMap<Dot, V> {
    let mut joined = BTreeMap::new();
    for (dot, value) in ours {
        match theirs.and_then(|theirs| theirs.get(dot)) {
            Some(their_value) => {
                joined.insert(dot.clone(), value.join(their_value));
            }
            None if !their_context.contains(dot) => {
                joined.insert(dot.clone(), value.clone());
            }
            None => {}
        }
    }
    for (dot, value) in theirs.into_iter().flatten() {
        if !ours.contains_key(dot) && !our_context.contains(dot) {
            joined.insert(dot.clone(), value.clone());
        }
    }
    joined
}
