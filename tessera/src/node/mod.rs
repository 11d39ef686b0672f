//! A tessera node: the cluster transport, the cluster protocols, Distributed Data, the
//! replicated journal and snapshot store in `data_dir`, the entity types a service registers
//! (each sharded over the cluster) and the HTTP API, started by a [`NodeBuilder`] from a
//! [`NodeConfig`](crate::config::NodeConfig) and running as a [`Node`] until a signal, a
//! shutdown or the cluster ending its membership.
//!
//! Layout: [`builder`] (registrations and the start, in order), `registration` (an entity
//! type with its Rust type erased until it starts), [`running`] (the running node and the
//! handle a service's code holds), [`settings`] (each part's settings from the
//! configuration), `control` and `queries` (the HTTP API's view of the node).

pub mod builder;
mod control;
mod daemons;
mod projections;
mod queries;
mod registration;
pub mod running;
pub mod settings;

pub use builder::{HTTP_LISTEN_BACKLOG, NodeBuilder};
pub use running::{DaemonError, Node, NodeHandle, ProjectionError};
pub use settings::KNOWN_STORES_FILE;

use std::time::Duration;
use tessera_cluster::node::ClusterStartError;
use tessera_cluster::singleton::SingletonError;
use tessera_cluster::transport::TransportError;
use tessera_coordinator::runtime::ShardingStartError;
use tessera_ddata::node::ReplicatorStartError;
use tessera_entities::InvalidConfig;
use tessera_journal::JournalError;
use tessera_replication::QuorumError;
use tessera_snapshot::SnapshotError;

/// How long a node waits for its graceful leave to complete before it exits anyway.
pub const LEAVE_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a stopping node waits for its entities to finish the commands they accepted
/// before it closes the journal anyway.
pub const ENTITY_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a stopping node waits for its shards to be handed off to other nodes before it
/// leaves the cluster anyway.
pub const HANDOFF_ALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long `GET /sharding/{type}/cluster` waits for each member's answer.
pub const CLUSTER_STATE_TIMEOUT: Duration = Duration::from_secs(3);

/// Exit status of a node that was downed (by an operator or the split-brain resolver), so
/// that a supervisor can tell it from a clean leave (0).
pub const EXIT_CODE_DOWNED: u8 = 3;

/// Exit status of a node that gave up joining a cluster (`shutdown_after_unsuccessful_join`),
/// so that a supervisor restarts it.
pub const EXIT_CODE_BOOTSTRAP_FAILED: u8 = 4;

/// Failure to start a node.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("configuration: {0}")]
    Config(#[from] crate::config::ConfigError),
    #[error(
        "entity types {first:?} and {second:?} are both registered: a type is registered once, \
         and two types must not differ only in case, '-', '.' or '_' (their configuration \
         sections would be one)"
    )]
    DuplicateType { first: String, second: String },
    #[error("{0}")]
    Daemon(#[from] tessera_daemon::InvalidDaemon),
    #[error(
        "daemon {name:?} is registered twice, or its sharded type daemon.{name} clashes with \
         {other}"
    )]
    DuplicateDaemon { name: String, other: String },
    #[error("daemon {name}: cannot follow its count in distributed data: {source}")]
    DaemonCount {
        name: String,
        source: tessera_ddata::node::ReplicatorError,
    },
    #[error("{0}")]
    Projection(#[from] tessera_projection::InvalidProjection),
    #[error(
        "projection {projection} reads entity type {entity_type}, which this node does not \
         register (registered: {registered:?})"
    )]
    ProjectionType {
        projection: String,
        entity_type: String,
        registered: Vec<String>,
    },
    #[error("projection {projection}: cannot follow its control in distributed data: {source}")]
    ProjectionControl {
        projection: String,
        source: tessera_ddata::node::ReplicatorError,
    },
    #[error("cluster transport: {0}")]
    Transport(#[from] TransportError),
    #[error("cluster: {0}")]
    Cluster(#[from] ClusterStartError),
    #[error("distributed data: {0}")]
    Replicator(#[from] ReplicatorStartError),
    #[error("cannot bind the HTTP API to {address}: {source}")]
    HttpBind {
        address: String,
        source: std::io::Error,
    },
    #[error("cannot open the journal in {path}: {source}")]
    Journal { path: String, source: JournalError },
    #[error("cannot open the snapshot store in {path}: {source}")]
    Snapshots { path: String, source: SnapshotError },
    #[error("entities: {0}")]
    Entities(#[from] InvalidConfig),
    #[error("journal replication: {0}")]
    Quorums(QuorumError),
    #[error("replicated journal: {0}")]
    Persistence(#[from] tessera_persistence::StartError),
    #[error("cluster singletons: {0}")]
    Singletons(#[from] SingletonError),
    #[error("cluster sharding: {0}")]
    Sharding(#[from] ShardingStartError),
}
