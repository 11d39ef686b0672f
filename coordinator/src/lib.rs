//! tessera-coordinator: cluster sharding (docs/src/design.md §7).
//!
//! Each entity type has a [`region::ShardRegion`] on every node: it maps an entity id to a
//! shard ([`shard_id::ShardId`]), asks the [`coordinator::ShardCoordinator`] (a cluster
//! singleton) where unknown shards live, buffers meanwhile, and hosts the shards the
//! coordinator gives it. The coordinator allocates shards with the least-shard strategy
//! ([`allocation`]), keeps its [`state::CoordinatorState`] in a store that must answer before
//! any shard home is told, and moves shards by handoff.
//!
//! Both are plain state machines with time passed in; [`sim`] runs them together over a
//! simulated network with crashes, message loss and membership changes, and checks the
//! sharding invariants on every step.

pub mod allocation;
pub mod coordinator;
pub mod entity_ref;
#[doc(hidden)]
pub mod fuzzing;
pub mod host;
pub mod messages;
pub mod region;
pub mod remember;
pub mod runtime;
pub mod settings;
pub mod shard_id;
pub mod sim;
pub mod state;
pub mod store;
pub mod typed_host;
pub mod wire;

pub use entity_ref::{AskError, EntityRef};
pub use shard_id::{ShardId, ShardIds, ShardMap, shard_of};
