//! tessera-ddata: the replicated data types of Distributed Data, as in Akka Distributed Data.
//!
//! Every type here is a conflict-free replicated data type ([`ReplicatedData`]): replicas
//! update their own copy without coordination and converge by merging copies in any order.
//! Most also record the changes since they were last shipped ([`DeltaReplicatedData`]), so the
//! Replicator can send small deltas between full-state gossip rounds, and the ones that record
//! node ids can fold a removed node's entries into another node's ([`RemovedNodePruning`]).
//!
//! The types are plain data: they read no clock (timestamps are passed in), do no IO and never
//! panic on input decoded from elsewhere; [`codec`] gives them a versioned encoding. The
//! Replicator that stores and spreads them is built on top of these types.
//!
//! A delta is a small state of the same type (delta-state CRDTs, Almeida et al.), so deltas
//! combine and apply by merge. The observed-remove types (`ORSet`, `ORMap`, `LWWMap`,
//! `PNCounterMap`, `ORMultiMap`) share one design: values live under dots (node, counter), and
//! a causal context of every dot seen tells a remove apart from a write not yet seen.

pub mod codec;
pub mod consistency;
pub mod crdt;
mod dot_context;
mod dot_kernel;
pub mod durable;
pub mod durable_writer;
pub mod envelope;
pub mod flag;
#[doc(hidden)]
pub mod fuzzing;
pub mod g_counter;
pub mod g_set;
pub mod lww_map;
pub mod lww_register;
pub mod node;
pub mod or_map;
pub mod or_multi_map;
pub mod or_set;
pub mod pn_counter;
pub mod pn_counter_map;
pub mod replicator;
pub mod sim;
pub mod value;
pub mod version_vector;

pub use consistency::{ReadConsistency, WriteConsistency};
pub use crdt::{DeltaReplicatedData, Element, RemovedNodePruning, ReplicatedData};
pub use envelope::{DataEnvelope, PruningState};
pub use flag::Flag;
pub use g_counter::GCounter;
pub use g_set::GSet;
pub use lww_map::LWWMap;
pub use lww_register::{LWWRegister, next_timestamp};
pub use or_map::ORMap;
pub use or_multi_map::ORMultiMap;
pub use or_set::ORSet;
pub use pn_counter::PNCounter;
pub use pn_counter_map::PNCounterMap;
pub use value::{KindMismatch, ReplicatedValue, ValueKind};
pub use version_vector::{VersionOrdering, VersionVector};
