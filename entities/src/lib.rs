//! tessera-entities: event-sourced entities on the journal and the snapshot store
//! (docs/src/design.md §6).
//!
//! A user implements [`EntityType`]: a command handler that answers with an [`Effect`]
//! (persist events then reply from the new state, reply, reject, stop) and an event handler
//! that folds events into the state. An [`EntityHost`] runs the entities of one type on this
//! node: one task per live entity, started on its first command, recovering from the latest
//! snapshot plus the later events, stashing commands (bounded) while it recovers or persists,
//! snapshotting every N events with keep-N retention, and passivating after an idle timeout or
//! when an active-entity limit is reached (least recently used first), per host or over
//! several hosts sharing an [`ActiveEntityBudget`]. Callers use an
//! [`EntityRef`] and get the reply, the entity's rejection, or an [`EntityError`]. The host's
//! owner (cluster sharding) can also stop a set of entities and wait for them, list the live
//! ones, and hear why each stopped.
//!
//! Layout, one concept per file: [`entity`] (trait and effects), [`codec`] (postcard +
//! manifest, upcasting), [`machine`] (the command/event loop as a plain state machine),
//! `runner` (the tokio task around it), `host` (the handle: start, ask, stop, list),
//! `partition` (a routing task: slots per id, passivation handshake, stop requests), `lru`
//! (the active-entity limit's order), `budget` (a limit shared by hosts), [`lifecycle`]
//! (start and stop events), [`retention`] (when to snapshot and what to delete), [`config`],
//! [`error`], [`id`].

mod budget;
pub mod codec;
pub mod config;
mod counters;
pub mod entity;
mod entity_ref;
pub mod error;
mod host;
pub mod id;
pub mod lifecycle;
mod lru;
pub mod machine;
mod partition;
pub mod retention;
mod runner;

pub use budget::ActiveEntityBudget;
pub use codec::{Codec, CodecError, decode_postcard};
pub use config::{EntityConfig, InvalidConfig};
pub use entity::{Effect, EntityType, Persist};
pub use entity_ref::EntityRef;
pub use error::{AskError, EntityError};
pub use host::{EntityHost, HostStats};
pub use id::{EntityId, MAX_ENTITY_ID_BYTES};
pub use lifecycle::{EntityLifecycle, LifecycleListener, StopReason};
pub use machine::AskResult;
pub use tessera_journal::Manifest;
