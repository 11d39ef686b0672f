//! The traits every CRDT in this crate implements, shaped like Akka Distributed Data's.

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeSet;
use std::fmt::Debug;
use tessera_cluster::UniqueAddress;

/// A conflict-free replicated data type: replicas change their copy independently and reach the
/// same state by merging copies in any order, any number of times.
///
/// The bounds are what the Replicator needs: copies are cloned, compared, encoded for the wire
/// and disk, and moved between tasks.
pub trait ReplicatedData:
    Clone + Debug + PartialEq + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// The least upper bound of both states. Commutative, associative and idempotent, and never
    /// panics, whatever (decoded) states it is given.
    ///
    /// Any delta `self` has accumulated is carried into the result; `other`'s is not (it belongs
    /// to the replica that made those changes).
    fn merge(&self, other: &Self) -> Self;
}

/// A CRDT that records the changes made since the last [`reset_delta`](Self::reset_delta), so the
/// Replicator can ship those instead of the whole state (delta-state CRDTs, Almeida et al.).
pub trait DeltaReplicatedData: ReplicatedData {
    /// What [`delta`](Self::delta) returns. In this crate a delta is itself a (small) state of the
    /// same lattice, so deltas combine by `merge` and apply by `merge`.
    type Delta: Clone + Debug + PartialEq + Serialize + DeserializeOwned + Send + Sync + 'static;

    /// The changes accumulated since the last reset, or `None` when there are none.
    fn delta(&self) -> Option<Self::Delta>;

    /// Forgets the accumulated changes, typically right after they were handed to the Replicator.
    fn reset_delta(&mut self);

    /// Applies a delta produced by another replica. A replica that has seen the state the delta
    /// was made from ends exactly where merging the sender's full state would have taken it.
    fn merge_delta(&mut self, delta: &Self::Delta);
}

/// A CRDT that records which nodes changed it, so that after a node is removed from the cluster
/// its entries can be folded into another node's and the state stops naming it.
///
/// The Replicator's pruning protocol calls [`prune`](Self::prune) on the replica of
/// `collapse_into` (normally the leader) only: pruning creates entries for `collapse_into`, and
/// only its own replica knows which of those are fresh. Every other replica, and every state
/// that arrives later, gets [`prune_cleanup`](Self::prune_cleanup).
pub trait RemovedNodePruning: ReplicatedData {
    /// Every node this state records.
    fn modified_by_nodes(&self) -> BTreeSet<UniqueAddress>;

    /// Whether the state still records `removed`.
    fn need_pruning_from(&self, removed: &UniqueAddress) -> bool {
        self.modified_by_nodes().contains(removed)
    }

    /// Moves `removed`'s contribution to `collapse_into`, keeping the observable value, so that
    /// `removed` disappears from the state. Leaves the content alone when both are the same
    /// node. Drops any accumulated delta: a pruned state is propagated whole.
    fn prune(&mut self, removed: &UniqueAddress, collapse_into: &UniqueAddress);

    /// Drops entries of `removed` from a state that has not seen the pruning (a late copy); its
    /// contribution already lives on under `collapse_into` in the pruned state.
    fn prune_cleanup(&mut self, removed: &UniqueAddress);
}

/// What a set element, map key or last-writer-wins value must be: totally ordered, so every
/// replica stores and resolves it the same way, and serializable, so it can travel.
pub trait Element:
    Ord + Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static
{
}

impl<T: Ord + Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static> Element for T {}
