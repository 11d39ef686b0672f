//! [`ReplicatedValue`]: the CRDT types the Replicator stores, under one type so that one
//! key-value store holds counters, sets, registers and maps side by side.
//!
//! Set elements, map keys and register values are strings; structured values (the HTTP API's
//! JSON) are stored as their text. A key holds one kind for its whole life: merging two
//! different kinds is a [`KindMismatch`], never a silent overwrite.

use crate::crdt::{DeltaReplicatedData, RemovedNodePruning, ReplicatedData};
use crate::{
    Flag, GCounter, GSet, LWWMap, LWWRegister, ORMultiMap, ORSet, PNCounter, PNCounterMap,
    VersionVector,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use tessera_cluster::UniqueAddress;

/// A replicated value of one of the supported CRDT types.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ReplicatedValue {
    GCounter(GCounter),
    PNCounter(PNCounter),
    GSet(GSet<String>),
    ORSet(ORSet<String>),
    LWWRegister(LWWRegister<String>),
    Flag(Flag),
    LWWMap(LWWMap<String, String>),
    PNCounterMap(PNCounterMap<String>),
    ORMultiMap(ORMultiMap<String, String>),
    VersionVector(VersionVector),
}

/// The kind of a [`ReplicatedValue`], with the names the HTTP API and errors use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ValueKind {
    GCounter,
    PNCounter,
    GSet,
    ORSet,
    LWWRegister,
    Flag,
    LWWMap,
    PNCounterMap,
    ORMultiMap,
    VersionVector,
}

impl ValueKind {
    /// Every kind, for listings and error messages.
    pub const ALL: [ValueKind; 10] = [
        ValueKind::GCounter,
        ValueKind::PNCounter,
        ValueKind::GSet,
        ValueKind::ORSet,
        ValueKind::LWWRegister,
        ValueKind::Flag,
        ValueKind::LWWMap,
        ValueKind::PNCounterMap,
        ValueKind::ORMultiMap,
        ValueKind::VersionVector,
    ];

    /// The kind's name, as Akka users know it.
    pub fn name(self) -> &'static str {
        match self {
            ValueKind::GCounter => "GCounter",
            ValueKind::PNCounter => "PNCounter",
            ValueKind::GSet => "GSet",
            ValueKind::ORSet => "ORSet",
            ValueKind::LWWRegister => "LWWRegister",
            ValueKind::Flag => "Flag",
            ValueKind::LWWMap => "LWWMap",
            ValueKind::PNCounterMap => "PNCounterMap",
            ValueKind::ORMultiMap => "ORMultiMap",
            ValueKind::VersionVector => "VersionVector",
        }
    }

    /// The empty value of this kind (the bottom of its lattice), that a first update modifies.
    pub fn empty(self) -> Option<ReplicatedValue> {
        Some(match self {
            ValueKind::GCounter => ReplicatedValue::GCounter(GCounter::new()),
            ValueKind::PNCounter => ReplicatedValue::PNCounter(PNCounter::new()),
            ValueKind::GSet => ReplicatedValue::GSet(GSet::new()),
            ValueKind::ORSet => ReplicatedValue::ORSet(ORSet::new()),
            // A register has no empty value: its first write creates it.
            ValueKind::LWWRegister => return None,
            ValueKind::Flag => ReplicatedValue::Flag(Flag::new()),
            ValueKind::LWWMap => ReplicatedValue::LWWMap(LWWMap::new()),
            ValueKind::PNCounterMap => ReplicatedValue::PNCounterMap(PNCounterMap::new()),
            ValueKind::ORMultiMap => ReplicatedValue::ORMultiMap(ORMultiMap::new()),
            ValueKind::VersionVector => ReplicatedValue::VersionVector(VersionVector::new()),
        })
    }
}

impl std::fmt::Display for ValueKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Two values of different kinds met under one key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the key holds a {held}, not a {offered}")]
pub struct KindMismatch {
    pub held: ValueKind,
    pub offered: ValueKind,
}

/// Applies `$body` to the inner values of two `ReplicatedValue`s of the same kind, or returns a
/// `KindMismatch`.
macro_rules! same_kind {
    ($left:expr, $right:expr, |$a:ident, $b:ident| $body:expr) => {
        match ($left, $right) {
            (ReplicatedValue::GCounter($a), ReplicatedValue::GCounter($b)) => Ok($body),
            (ReplicatedValue::PNCounter($a), ReplicatedValue::PNCounter($b)) => Ok($body),
            (ReplicatedValue::GSet($a), ReplicatedValue::GSet($b)) => Ok($body),
            (ReplicatedValue::ORSet($a), ReplicatedValue::ORSet($b)) => Ok($body),
            (ReplicatedValue::LWWRegister($a), ReplicatedValue::LWWRegister($b)) => Ok($body),
            (ReplicatedValue::Flag($a), ReplicatedValue::Flag($b)) => Ok($body),
            (ReplicatedValue::LWWMap($a), ReplicatedValue::LWWMap($b)) => Ok($body),
            (ReplicatedValue::PNCounterMap($a), ReplicatedValue::PNCounterMap($b)) => Ok($body),
            (ReplicatedValue::ORMultiMap($a), ReplicatedValue::ORMultiMap($b)) => Ok($body),
            (ReplicatedValue::VersionVector($a), ReplicatedValue::VersionVector($b)) => Ok($body),
            (held, offered) => Err(KindMismatch {
                held: held.kind(),
                offered: offered.kind(),
            }),
        }
    };
}

/// Applies `$body` to the inner value whatever its kind.
macro_rules! each_kind {
    ($value:expr, |$v:ident| $body:expr) => {
        match $value {
            ReplicatedValue::GCounter($v) => $body,
            ReplicatedValue::PNCounter($v) => $body,
            ReplicatedValue::GSet($v) => $body,
            ReplicatedValue::ORSet($v) => $body,
            ReplicatedValue::LWWRegister($v) => $body,
            ReplicatedValue::Flag($v) => $body,
            ReplicatedValue::LWWMap($v) => $body,
            ReplicatedValue::PNCounterMap($v) => $body,
            ReplicatedValue::ORMultiMap($v) => $body,
            ReplicatedValue::VersionVector($v) => $body,
        }
    };
}

/// Applies `$body` to the inner value of the kinds that record nodes; `$none` for the others.
macro_rules! prunable_kind {
    ($value:expr, |$v:ident| $body:expr, $none:expr) => {
        match $value {
            ReplicatedValue::GCounter($v) => $body,
            ReplicatedValue::PNCounter($v) => $body,
            ReplicatedValue::ORSet($v) => $body,
            ReplicatedValue::LWWRegister($v) => $body,
            ReplicatedValue::LWWMap($v) => $body,
            ReplicatedValue::PNCounterMap($v) => $body,
            ReplicatedValue::ORMultiMap($v) => $body,
            ReplicatedValue::VersionVector($v) => $body,
            // Grow-only sets and flags record no node.
            ReplicatedValue::GSet(_) | ReplicatedValue::Flag(_) => $none,
        }
    };
}

impl ReplicatedValue {
    /// The value's kind.
    pub fn kind(&self) -> ValueKind {
        match self {
            ReplicatedValue::GCounter(_) => ValueKind::GCounter,
            ReplicatedValue::PNCounter(_) => ValueKind::PNCounter,
            ReplicatedValue::GSet(_) => ValueKind::GSet,
            ReplicatedValue::ORSet(_) => ValueKind::ORSet,
            ReplicatedValue::LWWRegister(_) => ValueKind::LWWRegister,
            ReplicatedValue::Flag(_) => ValueKind::Flag,
            ReplicatedValue::LWWMap(_) => ValueKind::LWWMap,
            ReplicatedValue::PNCounterMap(_) => ValueKind::PNCounterMap,
            ReplicatedValue::ORMultiMap(_) => ValueKind::ORMultiMap,
            ReplicatedValue::VersionVector(_) => ValueKind::VersionVector,
        }
    }

    /// The least upper bound of both values, which must be of the same kind.
    pub fn merge(&self, other: &ReplicatedValue) -> Result<ReplicatedValue, KindMismatch> {
        same_kind!(self, other, |a, b| wrap(a.merge(b)))
    }

    /// The changes since the last [`reset_delta`](Self::reset_delta), as a value of the same
    /// kind (every type's delta is a small state of its own lattice).
    pub fn delta(&self) -> Option<ReplicatedValue> {
        each_kind!(self, |v| v.delta().map(wrap))
    }

    /// Forgets the accumulated changes.
    pub fn reset_delta(&mut self) {
        each_kind!(self, |v| v.reset_delta())
    }

    /// Applies a delta of the same kind produced by [`delta`](Self::delta) elsewhere.
    pub fn merge_delta(&mut self, delta: &ReplicatedValue) -> Result<(), KindMismatch> {
        same_kind!(self, delta, |a, b| a.merge_delta(b))
    }

    /// Every node the value records.
    pub fn modified_by_nodes(&self) -> BTreeSet<UniqueAddress> {
        prunable_kind!(self, |v| v.modified_by_nodes(), BTreeSet::new())
    }

    /// Whether the value still records `removed`.
    pub fn need_pruning_from(&self, removed: &UniqueAddress) -> bool {
        prunable_kind!(self, |v| v.need_pruning_from(removed), false)
    }

    /// Folds `removed`'s contribution into `collapse_into` (on `collapse_into`'s replica).
    pub fn prune(&mut self, removed: &UniqueAddress, collapse_into: &UniqueAddress) {
        prunable_kind!(self, |v| v.prune(removed, collapse_into), ())
    }

    /// Drops entries of `removed` from a copy that has not seen the pruning.
    pub fn prune_cleanup(&mut self, removed: &UniqueAddress) {
        prunable_kind!(self, |v| v.prune_cleanup(removed), ())
    }
}

/// Wraps a concrete CRDT into its `ReplicatedValue` variant.
fn wrap<T: IntoValue>(value: T) -> ReplicatedValue {
    value.into_value()
}

/// The concrete types that have a `ReplicatedValue` variant.
pub trait IntoValue {
    /// The value in its variant.
    fn into_value(self) -> ReplicatedValue;
}

macro_rules! into_value {
    ($($variant:ident($ty:ty)),* $(,)?) => {
        $(impl IntoValue for $ty {
            fn into_value(self) -> ReplicatedValue {
                ReplicatedValue::$variant(self)
            }
        })*
    };
}

into_value!(
    GCounter(GCounter),
    PNCounter(PNCounter),
    GSet(GSet<String>),
    ORSet(ORSet<String>),
    LWWRegister(LWWRegister<String>),
    Flag(Flag),
    LWWMap(LWWMap<String, String>),
    PNCounterMap(PNCounterMap<String>),
    ORMultiMap(ORMultiMap<String, String>),
    VersionVector(VersionVector),
);

impl<T: IntoValue> From<T> for ReplicatedValue {
    fn from(value: T) -> Self {
        value.into_value()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_cluster::Address;

    fn node(port: u16) -> UniqueAddress {
        UniqueAddress::new(Address::new("127.0.0.1", port), u64::from(port))
    }

    #[test]
    fn values_of_one_kind_merge() {
        let mut a = PNCounter::new();
        a.increment(&node(1), 3);
        let mut b = PNCounter::new();
        b.decrement(&node(2), 1);
        let merged = ReplicatedValue::from(a)
            .merge(&ReplicatedValue::from(b))
            .unwrap();
        match merged {
            ReplicatedValue::PNCounter(c) => assert_eq!(c.value(), 2),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn values_of_different_kinds_do_not_merge() {
        let counter = ValueKind::PNCounter.empty().unwrap();
        let set = ValueKind::ORSet.empty().unwrap();
        assert_eq!(
            counter.merge(&set),
            Err(KindMismatch {
                held: ValueKind::PNCounter,
                offered: ValueKind::ORSet
            })
        );
        let mut counter = counter;
        assert!(counter.merge_delta(&set).is_err());
    }

    #[test]
    fn delta_of_an_update_applies_elsewhere() {
        let mut set = ORSet::new();
        set.add(&node(1), "x".to_string());
        let value = ReplicatedValue::from(set);
        let delta = value.delta().expect("an add leaves a delta");
        let mut other = ValueKind::ORSet.empty().unwrap();
        other.merge_delta(&delta).unwrap();
        assert_eq!(other, value);
    }

    #[test]
    fn pruning_dispatches_to_the_kinds_that_record_nodes() {
        let mut counter = GCounter::new();
        counter.increment(&node(9), 5);
        let mut value = ReplicatedValue::from(counter);
        assert!(value.need_pruning_from(&node(9)));
        value.prune(&node(9), &node(1));
        assert!(!value.need_pruning_from(&node(9)));
        assert_eq!(value.modified_by_nodes(), BTreeSet::from([node(1)]));
        let flag = ValueKind::Flag.empty().unwrap();
        assert!(!flag.need_pruning_from(&node(9)));
    }
}
