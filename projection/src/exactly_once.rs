//! Exactly-once delivery: the handler commits each group's offset in its own transaction,
//! together with its effect, in a store of its own (a database), so that a group's effect
//! and its offset are both there or neither is.
//!
//! The store is fenced by the epoch of the instance's offset log writer in the replicated
//! journal: an instance first opens its offset log (recovering it, which fences every
//! writer before and gives it an epoch higher than theirs), then takes its slot in the store
//! with that epoch ([`ExactlyOnceStore::open`]: refused when a higher one holds it); every
//! commit checks in its transaction that the slot still holds its epoch. So an instance
//! that lost its slot — paused, or on the far side of a partition — commits nothing after
//! its successor opened the store.

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tessera_journal::SliceOffset;
use tessera_replication::Epoch;

use crate::handler::HandlerError;

/// One instance of a projection, as its store names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct InstanceKey {
    pub projection: String,
    pub index: u32,
    pub instances: u32,
}

impl InstanceKey {
    /// `<index>-of-<instances>`: the instance within its projection.
    pub fn slot(&self) -> String {
        format!("{}-of-{}", self.index, self.instances)
    }
}

/// A fencing token: the epoch of the writer that opened the instance's offset log, higher
/// than every earlier one's. Compared by `counter`, then `writer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Fence {
    pub counter: u64,
    pub writer: u64,
}

impl From<Epoch> for Fence {
    fn from(epoch: Epoch) -> Self {
        Fence {
            counter: epoch.counter,
            writer: epoch.writer,
        }
    }
}

/// What a handler commits with its effect: the instance, its fence, and the logs the group
/// moves, each to the sequence number of its last event in the group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffsetCommit {
    pub instance: InstanceKey,
    pub fence: Fence,
    pub seqs: Vec<(String, u64)>,
}

/// Where an exactly-once projection keeps its offsets and fences: the handler's own store.
pub trait ExactlyOnceStore: Send + Sync + 'static {
    /// Takes `instance`'s slot with `fence` — refused when a higher fence holds it — and
    /// reads the offset committed for it.
    fn open(
        &self,
        instance: &InstanceKey,
        fence: Fence,
    ) -> BoxFuture<'static, Result<SliceOffset, HandlerError>>;

    /// Forgets the offset committed for `instance`'s slices (an operator's reset), if
    /// `fence` still holds its slot. The handler's read model is the service's: a service
    /// that resets a projection clears or rebuilds it itself.
    fn reset(
        &self,
        instance: &InstanceKey,
        fence: Fence,
    ) -> BoxFuture<'static, Result<(), HandlerError>>;
}
