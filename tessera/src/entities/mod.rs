//! The entity types this node hosts, and the JSON face the HTTP API talks to.

pub mod account;
mod registry;
mod sharded;

pub use registry::{EntityTypes, JsonAskError, JsonEntityType};
pub use sharded::JsonShardHost;
