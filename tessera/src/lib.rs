//! tessera: a distributed data and persistence platform, in the spirit of Akka Cluster,
//! Distributed Data, Persistence and Cluster Sharding.
//!
//! A service registers its event-sourced entity types ([`EntityType`]) on a [`NodeBuilder`]
//! and runs; tessera keeps one live copy of each entity in the cluster, persists its events on
//! a quorum of nodes, moves it when nodes come and go, and answers typed asks made anywhere
//! through an [`EntityRef`]:
//!
//! ```no_run
//! # use tessera::{NodeBuilder, EntityType, EntitySettings};
//! # use tessera::config::NodeConfig;
//! # async fn example<Account: EntityType + Default>(deposit: Account::Command) -> Result<(), Box<dyn std::error::Error>> {
//! let node = NodeBuilder::new()
//!     .entity_with(Account::default(), EntitySettings::new().snapshot_every(50))
//!     .start(&NodeConfig::default())
//!     .await?;
//! let reply = node.entity_ref::<Account>("alice").ask(deposit).await;
//! node.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! [`NodeBuilder::main`] gives a service the whole `tessera` command line (`node`, `members`,
//! `join`, `leave`, `down`, `shards`, `ddata`, `entity`, `sharding remove-internal-data`)
//! with its types registered.

pub mod bootstrap;
pub mod cli;
pub mod client;
pub mod config;
pub mod dashboard;
pub mod entities;
pub mod entity_settings;
pub mod http;
pub mod logging;
pub mod node;
pub mod sharding_tool;
pub mod testkit;

/// The HTTP framework of the node's API, for a service's own routes ([`NodeBuilder::routes`]).
pub use axum;
pub use entity_settings::EntitySettings;
pub use node::{Node, NodeBuilder, NodeHandle};
pub use tessera_coordinator::host::{AskFailure, AskOutcome, FailureKind};
pub use tessera_coordinator::{AskError, EntityRef};
pub use tessera_daemon::{DaemonContext, DaemonSettings};
pub use tessera_entities::{CodecError, Effect, EntityType, Manifest, Persist};
pub use tessera_journal::SliceOffset;
pub use tessera_projection::{
    Envelope, ExactlyOnceStore, FailureAction, Fence, HandlerError, InstanceKey, OffsetCommit,
    Projection, ProjectionSettings,
};
