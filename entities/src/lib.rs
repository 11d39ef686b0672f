//! tessera-entities: event-sourced entities on the journal and the snapshot store
//! (ARCHITECTURE §6).
//!
//! A user implements [`EntityType`]: a command handler that answers with an [`Effect`]
//! (persist events then reply from the new state, reply, reject, stop) and an event handler
//! that folds events into the state. An [`EntityHost`] runs the entities of one type on this
//! node: one task per live entity, started on its first command, recovering from the latest
//! snapshot plus the later events, stashing commands (bounded) while it recovers or persists,
//! snapshotting every N events with keep-N retention, and passivating after an idle timeout.
//! Callers use an [`EntityRef`] and get the reply, the entity's rejection, or an
//! [`EntityError`].
//!
//! Layout, one concept per file: [`entity`] (trait and effects), [`codec`] (postcard +
//! manifest, upcasting), [`machine`] (the command/event loop as a plain state machine),
//! `runner` (the tokio task around it), `host` (routing by id, passivation handshake),
//! [`retention`] (when to snapshot and what to delete), [`config`], [`error`], [`id`].

pub mod codec;
pub mod config;
pub mod entity;
mod entity_ref;
pub mod error;
mod host;
pub mod id;
pub mod machine;
pub mod retention;
mod runner;

pub use codec::{Codec, CodecError, decode_postcard};
pub use config::{EntityConfig, InvalidConfig};
pub use entity::{Effect, EntityType, Persist};
pub use entity_ref::EntityRef;
pub use error::{AskError, EntityError};
pub use host::{EntityHost, HostStats};
pub use id::{EntityId, MAX_ENTITY_ID_BYTES};
pub use machine::AskResult;
pub use tessera_journal::Manifest;
