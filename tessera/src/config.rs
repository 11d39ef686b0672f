//! Node configuration: defaults, a TOML file, `TESSERA_*` environment variables and flags.
//!
//! Every key is defined once, as a field of [`ConfigLayer`]: its name is the TOML key, clap
//! derives the flag from it, the environment variable is `TESSERA_` and the name in upper case,
//! and its doc comment is the flag's help, stating the default. Each source is read into a
//! `ConfigLayer` (every key optional, values as written). Layers are stacked — flag over
//! environment over file over default — and the result is checked once, in
//! [`NodeConfig::from_layer`], so that a bad value gets the same message whichever source it
//! came from: the key, the value, and what is allowed.

use crate::entity_settings::{ENTITY_KEYS, EntitySettings, section_name};
use crate::logging::{self, LogFormat};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::ffi::OsString;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::LazyLock;
use std::time::Duration;
use tessera_cluster::{Address, AddressParseError};

/// Prefix of the environment variables that configure a node: `TESSERA_` and the key in upper
/// case. Any other variable with this prefix stops the node, unless it is in
/// [`ENV_VARS_NOT_KEYS`].
pub const ENV_PREFIX: &str = "TESSERA_";

/// Environment variable naming the config file when `--config` is not given.
pub const CONFIG_FILE_ENV: &str = "TESSERA_CONFIG";

/// The `TESSERA_*` variables that are not configuration keys, which the node accepts and
/// ignores (everything else with the prefix is refused as a likely typo): the config file, the
/// test tools' knobs (a node spawned by a test inherits them), and the CLI client's.
pub const ENV_VARS_NOT_KEYS: [&str; 13] = [
    // The config file, read by `NodeConfig::load`.
    CONFIG_FILE_ENV,
    // Seeds and trace of the deterministic simulation tests.
    "TESSERA_SIM_SEEDS",
    "TESSERA_SIM_TRACE",
    // The journal's crash tests.
    "TESSERA_CRASH_SEED",
    "TESSERA_CRASH_ITERATIONS",
    "TESSERA_JOURNAL_CRASH_CHILD_DIR",
    // The power-loss loop's child (tests/power_loss.rs).
    "TESSERA_POWER_LOSS_CHILD_DIR",
    "TESSERA_POWER_LOSS_CHILD_MODE",
    // The cluster singleton's simulation test.
    "TESSERA_SINGLETON_SIM_SEED",
    // Keeps the multi-process tests' directories for inspection.
    "TESSERA_KEEP_TEST_DIRS",
    // How long the soak test runs `tessera soak`.
    "TESSERA_SOAK_MINUTES",
    // The CLI client: which node's HTTP API it talks to, and its token.
    "TESSERA_NODE",
    "TESSERA_TOKEN",
];

/// Smallest and largest accepted `max_frame_size`: a frame must hold a full gossip state, and
/// one peer must not be able to make us buffer more than this per frame.
pub const MAX_FRAME_SIZE_RANGE: (u64, u64) = (1024, 1 << 30);

/// Largest accepted `journal_replication_factor` (and write quorum).
pub const MAX_REPLICATION_FACTOR: u64 = 7;

/// Largest accepted `snapshot_every`: beyond it recovery replays so many events that a
/// snapshot hardly helps.
pub const MAX_SNAPSHOT_EVERY: u64 = 1_000_000;

/// Largest accepted `number_of_shards` (and `rebalance_absolute_limit`, which can never move
/// more shards than there are): Akka suggests ten times the largest number of nodes, and every
/// shard costs the coordinator state and the regions a table entry.
pub const MAX_NUMBER_OF_SHARDS: u64 = 100_000;

/// Largest accepted `required_contact_points`: more contact points than nodes any cluster of
/// ours has would only keep a bootstrap from ever forming a cluster.
pub const MAX_REQUIRED_CONTACT_POINTS: u64 = 1000;

/// Smallest accepted `ddata_max_value_bytes` and `ddata_max_total_bytes`: an empty counter
/// under a short key takes a few dozen bytes.
pub const MIN_DDATA_VALUE_BYTES: u64 = 64;

/// Largest accepted transport limit (peers, connections, pending requests): each unit costs
/// a task, a socket or a table entry.
pub const MAX_TRANSPORT_LIMIT: u64 = 1_000_000;

/// Largest accepted `http_max_concurrent_requests` and `http_max_connections`: each costs a
/// task and buffers, and a management API never needs more.
pub const MAX_HTTP_LIMIT: u64 = 100_000;

/// A validated node configuration. Build it with [`NodeConfig::load`] (all sources) or
/// [`NodeConfig::from_layer`]; `Default` gives the documented defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeConfig {
    /// Host the cluster transport binds to and advertises.
    pub host: String,
    /// Cluster transport port (0 lets the OS choose, for tests).
    pub port: u16,
    /// Host the HTTP management API binds to (defaults to `host`).
    pub http_host: String,
    /// HTTP management API port.
    pub http_port: u16,
    /// Seed nodes to join through; empty means join manually over HTTP (or through Cluster
    /// Bootstrap, when `contact_points` or `discovery_dns` is set).
    pub seed_nodes: Vec<Address>,
    /// Directory for journal, snapshots and other local state.
    pub data_dir: PathBuf,
    /// Roles this node carries (for singletons and sharding by role).
    pub roles: BTreeSet<String>,
    /// Shared secret that peers prove they hold in the transport handshake.
    pub cluster_secret: Option<ClusterSecret>,
    /// How long the membership must be stable before the split-brain resolver decides.
    pub stable_after: Duration,
    /// Interval between heartbeats to the monitored neighbours.
    pub heartbeat_interval: Duration,
    /// Interval between gossip rounds.
    pub gossip_interval: Duration,
    /// How long the first seed waits for other seeds before joining itself.
    pub seed_node_timeout: Duration,
    /// How long without convergence before Joining members are moved to WeaklyUp.
    pub allow_weakly_up_after: Duration,
    /// Number of neighbours that monitor each node with the failure detector.
    pub monitored_by: u32,
    /// Phi above which a monitored node is considered unreachable.
    pub failure_detector_threshold: f64,
    /// Heartbeat pause tolerated before phi starts rising steeply (GC, network hiccups).
    pub acceptable_heartbeat_pause: Duration,
    /// Lower bound of the heartbeat interval standard deviation used by the failure detector.
    pub min_std_deviation: Duration,
    /// Split-brain resolver strategy, with its parameters.
    pub downing_strategy: DowningStrategy,
    /// Largest transport frame accepted or sent, in bytes.
    pub max_frame_size: usize,
    /// Application version gossiped with this member (for rolling updates).
    pub app_version: String,
    /// Log line format.
    pub log_format: LogFormat,
    /// Log level or tracing filter (`RUST_LOG` overrides it).
    pub log_level: String,
    /// Distributed Data keys written to disk before an update is acknowledged and loaded at
    /// start: exact keys, or prefixes ending in `*`.
    pub durable_keys: Vec<String>,
    /// Entities snapshot their state every this many events (0: never).
    pub snapshot_every: u64,
    /// Entities idle this long are passivated (stopped until their next command; 0: never).
    pub passivate_after: Duration,
    /// How long an entity command waits for its reply.
    pub entity_ask_timeout: Duration,
    /// Replicas of every journal log (N).
    pub journal_replication_factor: u32,
    /// Replicas that must hold an event before it is acknowledged (W, more than N/2).
    pub journal_write_quorum: u32,
    /// The read lease a log's writer asks W replicas for when it confirms a read: within
    /// it, further reads are confirmed without a round to the replicas (0: every read takes
    /// one). At most [`tessera_replication::replica::MAX_READ_LEASE`].
    pub journal_read_lease: Duration,
    /// Where each entity type's shard coordinator keeps its state.
    pub state_store_mode: StateStoreMode,
    /// Whether and where shards remember their entities, to restart them wherever the shard
    /// lands.
    pub remember_entities: RememberEntities,
    /// Shards per entity type; entity id → shard is a stable hash modulo this number, so it is
    /// fixed for the cluster's life (changing it needs a full cluster stop).
    pub number_of_shards: u32,
    /// How often the shard coordinator considers a rebalance round.
    pub rebalance_interval: Duration,
    /// Most shards moved in one rebalance round (with `rebalance_relative_limit`, the smaller
    /// wins).
    pub rebalance_absolute_limit: u32,
    /// Most shards moved in one rebalance round, as a fraction of `number_of_shards`, in (0, 1].
    pub rebalance_relative_limit: f64,
    /// A shard handoff not finished within this long is given up; the shard stays put.
    pub handoff_timeout: Duration,
    /// Live entities per entity type on this node; beyond it the least recently used are
    /// passivated (0: no limit). See [`NodeConfig::active_entity_limit`].
    pub active_entity_limit: u64,
    /// How many messages a shard region buffers for shards whose home it does not know yet;
    /// one more is refused with an error.
    pub shard_buffer_size: u32,
    /// Live entities on this node over all entity types; beyond it each type passivates its
    /// least recently used (0: no limit). See [`NodeConfig::node_active_entity_limit`].
    pub node_active_entity_limit: u64,
    /// Distributed Data keys this node's replica holds at most, deleted ones included; a new
    /// key beyond it is refused, whether written here or arriving from a peer.
    pub ddata_max_keys: u64,
    /// Largest Distributed Data value (one key's encoded state), in bytes.
    pub ddata_max_value_bytes: u64,
    /// Distributed Data bytes (keys and encoded states) this node's replica holds at most.
    pub ddata_max_total_bytes: u64,
    /// Peers the transport keeps outbound queues for at once.
    pub transport_max_peers: u32,
    /// Inbound cluster connections served at once, authenticated or in their handshake.
    pub transport_max_inbound_connections: u32,
    /// Inbound cluster connections in their handshake at once; one more is closed at once.
    pub transport_max_inbound_handshakes: u32,
    /// Time a cluster connection has to complete its handshake.
    pub transport_handshake_timeout: Duration,
    /// Transport requests waiting for an answer at once.
    pub transport_max_pending_requests: u32,
    /// Transport requests waiting for an answer from one peer at once.
    pub transport_max_pending_requests_per_peer: u32,
    /// Only members with this role host sharded entities and run their coordinators; the
    /// others route to them (proxy-only). None: every member hosts.
    pub sharding_role: Option<String>,
    /// Cluster Bootstrap (Akka's): the HTTP management addresses of the contact points, a
    /// fixed list. Empty: no bootstrap from a list (see `discovery_dns`). Exclusive with
    /// `seed_nodes` and with `discovery_dns`.
    pub contact_points: Vec<ContactPoint>,
    /// Cluster Bootstrap: a DNS name whose records are the contact points. A name starting
    /// with `_` (`_http._tcp.tessera.local`) is an SRV name, whose records give host and port;
    /// any other is looked up for A/AAAA records, each an address at `contact_point_port`.
    /// Exclusive with `seed_nodes` and with `contact_points`.
    pub discovery_dns: Option<String>,
    /// The DNS server to ask for `discovery_dns` instead of the system resolver (for tests).
    /// Only with `discovery_dns`.
    pub discovery_dns_server: Option<SocketAddr>,
    /// HTTP port of the contact points found through A/AAAA records of `discovery_dns`. None:
    /// this node's own `http_port`. Only with `discovery_dns`.
    pub contact_point_port: Option<u16>,
    /// Cluster Bootstrap forms a new cluster only when at least this many contact points have
    /// been found and answered, none of them in a cluster yet.
    pub required_contact_points: u32,
    /// Cluster Bootstrap: the set of contact points must stay unchanged this long before the
    /// node with the lowest address forms a new cluster.
    pub stable_margin: Duration,
    /// Cluster Bootstrap: whether this node may form a new cluster; false makes it only ever
    /// join an existing one (for nodes added to a running cluster).
    pub form_new_cluster: bool,
    /// Cluster Bootstrap: interval between probes of each contact point.
    pub bootstrap_probe_interval: Duration,
    /// Cluster Bootstrap: a node that has not joined within this long shuts down (to be
    /// restarted by its supervisor). None: it keeps trying.
    pub shutdown_after_unsuccessful_join: Option<Duration>,
    /// The token HTTP API callers must present, from `http_token` or read from
    /// `http_token_file`. Required when `http_host` is not a loopback address.
    pub http_token: Option<HttpToken>,
    /// The HTTP API closes a connection whose request head has not arrived within this long.
    pub http_header_timeout: Duration,
    /// The HTTP API gives up a request not answered within this long (the caller gets an
    /// error).
    pub http_request_timeout: Duration,
    /// Most HTTP requests served at once, so that a flood of calls cannot exhaust the node.
    pub http_max_concurrent_requests: u32,
    /// Most HTTP connections open at once, so that idle or slow clients cannot exhaust the
    /// node.
    pub http_max_connections: u32,
    /// Entity types' own settings, from their sections, by [`section_name`]: they win over
    /// the node-wide keys and over what the code registering the type set. A section no
    /// registered type goes by stops the node ([`ConfigError::UnknownEntitySection`]).
    pub entities: BTreeMap<String, EntitySettings>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 25520,
            http_host: "127.0.0.1".into(),
            http_port: 8558,
            seed_nodes: Vec::new(),
            data_dir: PathBuf::from("./tessera-data"),
            roles: BTreeSet::new(),
            cluster_secret: None,
            stable_after: Duration::from_secs(20),
            heartbeat_interval: Duration::from_secs(1),
            gossip_interval: Duration::from_secs(1),
            seed_node_timeout: Duration::from_secs(5),
            allow_weakly_up_after: Duration::from_secs(7),
            monitored_by: 5,
            failure_detector_threshold: 8.0,
            acceptable_heartbeat_pause: Duration::from_secs(3),
            min_std_deviation: Duration::from_millis(100),
            downing_strategy: DowningStrategy::KeepMajority,
            max_frame_size: 4 * 1024 * 1024,
            app_version: env!("CARGO_PKG_VERSION").into(),
            log_format: LogFormat::Text,
            log_level: "info".into(),
            durable_keys: Vec::new(),
            // Recovery then replays at most ~100 events after loading a snapshot, at the cost
            // of one snapshot write per 100 events (Akka's usual choice).
            snapshot_every: 100,
            passivate_after: Duration::from_secs(120),
            entity_ask_timeout: Duration::from_secs(5),
            // Three copies, two before an acknowledgement: one node may fail without losing or
            // blocking anything.
            journal_replication_factor: 3,
            journal_write_quorum: 2,
            journal_read_lease: tessera_replication::replica::MAX_READ_LEASE,
            // Akka's defaults for cluster sharding.
            state_store_mode: StateStoreMode::Ddata,
            remember_entities: RememberEntities::Off,
            number_of_shards: 1000,
            rebalance_interval: Duration::from_secs(10),
            rebalance_absolute_limit: 20,
            rebalance_relative_limit: 0.1,
            handoff_timeout: Duration::from_secs(60),
            active_entity_limit: 100_000,
            shard_buffer_size: 100_000,
            // One type's default: a node of one type behaves as before, and more types share
            // what one would have.
            node_active_entity_limit: 100_000,
            // Memory and anti-entropy stay sound well beyond a million keys, but a node's
            // replica should not grow without an operator deciding so.
            ddata_max_keys: 1_000_000,
            ddata_max_value_bytes: 1024 * 1024,
            ddata_max_total_bytes: 256 * 1024 * 1024,
            transport_max_peers: 1024,
            transport_max_inbound_connections: 1024,
            transport_max_inbound_handshakes: 256,
            transport_handshake_timeout: Duration::from_secs(5),
            transport_max_pending_requests: 65_536,
            transport_max_pending_requests_per_peer: 16_384,
            sharding_role: None,
            // Akka Management's Cluster Bootstrap defaults.
            contact_points: Vec::new(),
            discovery_dns: None,
            discovery_dns_server: None,
            contact_point_port: None,
            required_contact_points: 2,
            stable_margin: Duration::from_secs(5),
            form_new_cluster: true,
            bootstrap_probe_interval: Duration::from_secs(1),
            shutdown_after_unsuccessful_join: None,
            http_token: None,
            http_header_timeout: Duration::from_secs(10),
            http_request_timeout: Duration::from_secs(30),
            http_max_concurrent_requests: 4096,
            http_max_connections: 4096,
            entities: BTreeMap::new(),
        }
    }
}

/// Defines a secret string type: `Debug` is redacted so that printing a config or a layer, or
/// logging an error, never leaks it. It (de)serialises as the plain string, because the
/// configuration layers are merged as TOML tables.
macro_rules! secret_type {
    ($(#[$doc:meta])* $name:ident, $use:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Deserialize, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Wraps a secret (checked by the config loader, not here).
            pub fn new(secret: impl Into<String>) -> Self {
                Self(secret.into())
            }

            #[doc = concat!("The secret itself, ", $use, ".")]
            pub fn expose(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(concat!(stringify!($name), "(<redacted>)"))
            }
        }

        impl FromStr for $name {
            type Err = Infallible;

            fn from_str(s: &str) -> Result<Self, Infallible> {
                Ok(Self::new(s))
            }
        }
    };
}

secret_type!(
    /// The cluster secret, which peers prove they hold in the transport handshake.
    ClusterSecret,
    "for keying the handshake MAC"
);

secret_type!(
    /// The token callers of the HTTP management API must present.
    HttpToken,
    "to compare with what a caller presents"
);

pub use tessera_cluster::bootstrap::ContactPoint;

/// Split-brain resolver strategy (Akka's names), carrying the parameters of the chosen one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DowningStrategy {
    /// The side with more members survives; on a tie, the side with the lowest address.
    KeepMajority,
    /// A side with at least `quorum_size` members survives.
    StaticQuorum {
        /// Minimum number of members on a surviving side.
        quorum_size: u32,
    },
    /// The side with the oldest member survives.
    KeepOldest {
        /// Down the oldest instead when it is alone on its side.
        down_if_alone: bool,
    },
    /// Every side downs itself: safe, at the cost of the whole cluster.
    DownAll,
}

impl DowningStrategy {
    /// The name used in config, flags and environment (`keep-majority`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            DowningStrategy::KeepMajority => "keep-majority",
            DowningStrategy::StaticQuorum { .. } => "static-quorum",
            DowningStrategy::KeepOldest { .. } => "keep-oldest",
            DowningStrategy::DownAll => "down-all",
        }
    }
}

/// Where each entity type's shard coordinator keeps its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateStoreMode {
    /// Distributed Data, written and read with a majority plus a margin (Akka's default).
    Ddata,
    /// An event-sourced entity in the replicated journal, with snapshots and a fenced writer.
    Persistence,
}

impl StateStoreMode {
    /// The name used in config, flags and environment (`ddata`, `persistence`).
    pub fn as_str(self) -> &'static str {
        match self {
            StateStoreMode::Ddata => "ddata",
            StateStoreMode::Persistence => "persistence",
        }
    }

    /// The mode named `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        [StateStoreMode::Ddata, StateStoreMode::Persistence]
            .into_iter()
            .find(|mode| mode.as_str() == name)
    }
}

impl fmt::Display for StateStoreMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether and where shards remember their entities, to restart them wherever the shard lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RememberEntities {
    /// Entities start on their first message only (Akka's default).
    Off,
    /// Remembered in durable Distributed Data.
    Ddata,
    /// Remembered as events in the replicated journal.
    Eventsourced,
}

impl RememberEntities {
    /// The name used in config, flags and environment (`off`, `ddata`, `eventsourced`).
    pub fn as_str(self) -> &'static str {
        match self {
            RememberEntities::Off => "off",
            RememberEntities::Ddata => "ddata",
            RememberEntities::Eventsourced => "eventsourced",
        }
    }

    /// The setting named `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        [
            RememberEntities::Off,
            RememberEntities::Ddata,
            RememberEntities::Eventsourced,
        ]
        .into_iter()
        .find(|store| store.as_str() == name)
    }
}

impl fmt::Display for RememberEntities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a configuration was refused. Every message names the key, the value and what is allowed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A value that does not parse as the key's type.
    #[error("invalid value {value:?} for {key}: expected {expected}")]
    InvalidValue {
        /// The config key.
        key: &'static str,
        /// The value as given.
        value: String,
        /// What the key accepts.
        expected: String,
    },
    /// A value of the right type outside the allowed range.
    #[error("{key} = {value}: must be {allowed}")]
    OutOfRange {
        /// The config key.
        key: &'static str,
        /// The value as given.
        value: String,
        /// The allowed range.
        allowed: String,
    },
    /// `downing_strategy = static-quorum` without a quorum size.
    #[error(
        "static-quorum needs quorum_size >= 1 (set quorum_size in the config file, \
         --quorum-size or TESSERA_QUORUM_SIZE)"
    )]
    QuorumSizeRequired,
    /// `journal_write_quorum` is not a majority of `journal_replication_factor`.
    #[error(
        "journal_write_quorum = {write_quorum} with journal_replication_factor = \
         {replication_factor}: the write quorum must be more than half of the replication \
         factor and at most it (W > N/2, W <= N), so that a fenced writer can never be \
         acknowledged"
    )]
    WriteQuorum {
        write_quorum: u32,
        replication_factor: u32,
    },
    /// Binding a non-loopback address without a cluster secret.
    #[error(
        "{key} = {host:?} is not a loopback address and no cluster_secret is set: anyone who \
         can reach the node could join the cluster. Set cluster_secret in the config file, \
         TESSERA_CLUSTER_SECRET or --cluster-secret (the same on every node), or bind 127.0.0.1"
    )]
    NonLoopbackWithoutSecret {
        /// `host`.
        key: &'static str,
        /// The non-loopback host.
        host: String,
    },
    /// Serving the HTTP management API on a non-loopback address without a token.
    #[error(
        "http_host = {host:?} is not a loopback address and no http_token is set: anyone who \
         can reach the HTTP port could change the cluster (join, leave, down members). Set \
         http_token in the config file, TESSERA_HTTP_TOKEN or --http-token, or http_token_file \
         (TESSERA_HTTP_TOKEN_FILE, --http-token-file), or bind http_host to 127.0.0.1"
    )]
    NonLoopbackHttpWithoutToken {
        /// The non-loopback `http_host`.
        host: String,
    },
    /// Two keys set that exclude each other.
    #[error("{first} and {second} are both set: {why}; pick one")]
    Exclusive {
        /// The first key.
        first: &'static str,
        /// The second key.
        second: &'static str,
        /// Why they exclude each other.
        why: &'static str,
    },
    /// A key that only applies together with another key, set without it.
    #[error("{key} is set without {needs}: it only applies to {what}; set {needs} or remove {key}")]
    Without {
        /// The key that was set.
        key: &'static str,
        /// The key it needs.
        needs: &'static str,
        /// What it applies to.
        what: &'static str,
    },
    /// Cluster transport and HTTP API on the same host and port.
    #[error(
        "http_port = {port} is the same as port on host {host:?}: the cluster transport and \
         the HTTP API need different ports"
    )]
    PortClash {
        /// The shared port.
        port: u16,
        /// The shared host.
        host: String,
    },
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// The config file is not valid TOML for this schema (syntax, type, unknown key).
    #[error("invalid config file {path}: {message}")]
    ParseFile {
        /// The file.
        path: PathBuf,
        /// The parser's message, which names the key and line.
        message: String,
    },
    /// `http_token_file` could not be read.
    #[error("cannot read http_token_file {path}: {source}")]
    ReadTokenFile {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// `http_token_file` holds no token, or one that cannot be sent in an HTTP header.
    #[error("http_token_file {path}: {problem}")]
    BadTokenFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with its content (never the content itself).
        problem: &'static str,
    },
    /// A `TESSERA_*` environment variable that is no configuration key (nor one of
    /// [`ENV_VARS_NOT_KEYS`]): most likely a typo, which would otherwise be silently ignored.
    #[error(
        "unknown environment variable {name}{}: a TESSERA_* variable must be TESSERA_ and a \
         config key in upper case (see tessera node --help)",
        closest.as_ref().map(|c| format!(" (did you mean {c}?)")).unwrap_or_default()
    )]
    UnknownEnv {
        /// The variable.
        name: String,
        /// The known variable closest to it, if any is close.
        closest: Option<String>,
    },
    /// A key in an entity type's section that is not a per-type key.
    #[error("{key} cannot be set for one entity type; an [entity.<type>] section takes {allowed}")]
    NotAnEntityKey {
        /// The key.
        key: String,
        /// The keys a section takes.
        allowed: String,
    },
    /// A value in an entity type's section (or set by the code registering it) that is not
    /// allowed.
    #[error("entity type {type_name}: {source}")]
    EntitySection {
        /// The section's type.
        type_name: String,
        /// What is wrong with it.
        source: Box<ConfigError>,
    },
    /// A section for an entity type this node does not register (most likely a typo).
    #[error(
        "the configuration has a section for entity type {section}, but this node registers \
         {registered}"
    )]
    UnknownEntitySection {
        /// The section's name.
        section: String,
        /// The registered types.
        registered: String,
    },
    /// An `--entity` flag that is not `<type>.<key>=<value>`.
    #[error("--entity {value:?}: expected <type>.<key>=<value>, like account.passivate_after=30s")]
    EntityFlag {
        /// The flag's value.
        value: String,
    },
    /// A `TESSERA_*` variable that is not valid Unicode.
    #[error("environment variable {name} is not valid UTF-8")]
    NonUnicodeEnv {
        /// The variable.
        name: String,
    },
}

/// A single value as a source wrote it: the file has typed TOML values, flags and environment
/// variables only have text. Parsing to the key's type happens in one place for all sources.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Scalar {
    /// `true` / `false` in TOML.
    Bool(bool),
    /// An integer in TOML.
    Int(i64),
    /// A float in TOML.
    Float(f64),
    /// A string in TOML, or any flag or environment value.
    Text(String),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Float(x) => write!(f, "{x}"),
            Scalar::Text(s) => f.write_str(s),
        }
    }
}

impl From<&str> for Scalar {
    fn from(s: &str) -> Self {
        Scalar::Text(s.to_string())
    }
}

/// A flag's value is text, checked later like every other source's.
impl FromStr for Scalar {
    type Err = Infallible;

    fn from_str(s: &str) -> Result<Self, Infallible> {
        Ok(Scalar::Text(s.to_string()))
    }
}

/// One source of configuration, and the one definition of every key.
///
/// A field is a key: its name is the key in the TOML file, the flag is `--` and the name with
/// `-` for `_` (the two lists with a repeatable flag in the singular, `--seed` and
/// `--contact-point`), and the environment variable is `TESSERA_` and the name in upper case
/// (see [`env_var_of`]). Its doc comment is the flag's help and states the default, which
/// [`NodeConfig::default`] holds (a test keeps the two in step); [`with_env_in_help`] adds the
/// variable. Values are kept as the source wrote them — the file's TOML types, the text of
/// flags and variables — and checked, whatever their source, in [`NodeConfig::from_layer`].
/// The TOML file deserialises into it directly, refusing unknown keys.
#[derive(Clone, Debug, Default, PartialEq, clap::Args, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigLayer {
    /// Host to bind and advertise for cluster traffic [default: 127.0.0.1]
    #[arg(long, value_name = "HOST")]
    pub host: Option<String>,
    /// Cluster port [default: 25520]
    #[arg(long, value_name = "PORT")]
    pub port: Option<Scalar>,
    /// Host for the HTTP management API; not a loopback address only with an http_token
    /// [default: same as --host]
    #[arg(long, value_name = "HOST")]
    pub http_host: Option<String>,
    /// HTTP management API port [default: 8558]
    #[arg(long, value_name = "PORT")]
    pub http_port: Option<Scalar>,
    /// Seed node to join through; repeat or comma-separate [default: none]
    #[arg(long = "seed", value_name = "HOST:PORT", value_delimiter = ',')]
    #[serde(default, deserialize_with = "list")]
    pub seed_nodes: Option<Vec<String>>,
    /// Directory for local state [default: ./tessera-data]
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<String>,
    /// Roles of this node, comma-separated [default: none]
    #[arg(long, value_name = "ROLES", value_delimiter = ',')]
    #[serde(default, deserialize_with = "list")]
    pub roles: Option<Vec<String>>,
    /// Shared cluster secret; prefer the file or env, flags show in `ps` [default: none]
    #[arg(long, value_name = "SECRET")]
    pub cluster_secret: Option<ClusterSecret>,
    /// Stable membership time before the split-brain resolver acts [default: 20s]
    #[arg(long, value_name = "DURATION")]
    pub stable_after: Option<Scalar>,
    /// Heartbeat interval [default: 1s]
    #[arg(long, value_name = "DURATION")]
    pub heartbeat_interval: Option<Scalar>,
    /// Gossip interval [default: 1s]
    #[arg(long, value_name = "DURATION")]
    pub gossip_interval: Option<Scalar>,
    /// Time the first seed waits for other seeds before joining itself [default: 5s]
    #[arg(long, value_name = "DURATION")]
    pub seed_node_timeout: Option<Scalar>,
    /// Time without convergence before joining members become WeaklyUp [default: 7s]
    #[arg(long, value_name = "DURATION")]
    pub allow_weakly_up_after: Option<Scalar>,
    /// Neighbours monitoring each node, 1..=100 [default: 5]
    #[arg(long, value_name = "N")]
    pub monitored_by: Option<Scalar>,
    /// Phi accrual threshold [default: 8]
    #[arg(long, value_name = "PHI")]
    pub failure_detector_threshold: Option<Scalar>,
    /// Tolerated heartbeat pause [default: 3s]
    #[arg(long, value_name = "DURATION")]
    pub acceptable_heartbeat_pause: Option<Scalar>,
    /// Minimum heartbeat standard deviation [default: 100ms]
    #[arg(long, value_name = "DURATION")]
    pub min_std_deviation: Option<Scalar>,
    /// keep-majority, static-quorum, keep-oldest or down-all [default: keep-majority]
    #[arg(long, value_name = "STRATEGY")]
    pub downing_strategy: Option<String>,
    /// Quorum for static-quorum [default: none]
    #[arg(long, value_name = "N")]
    pub quorum_size: Option<Scalar>,
    /// keep-oldest: down the oldest when it is alone [default: true]
    #[arg(long, value_name = "BOOL")]
    pub down_if_alone: Option<Scalar>,
    /// Largest transport frame in bytes [default: 4194304]
    #[arg(long, value_name = "BYTES")]
    pub max_frame_size: Option<Scalar>,
    /// Application version gossiped for rolling updates [default: the binary's version]
    #[arg(long, value_name = "VERSION")]
    pub app_version: Option<String>,
    /// text or json [default: text]
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// Level or filter; RUST_LOG overrides it [default: info]
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// Distributed Data keys stored on disk, comma-separated; a trailing * matches a prefix
    /// [default: none]
    #[arg(long, value_name = "KEYS", value_delimiter = ',')]
    #[serde(default, deserialize_with = "list")]
    pub durable_keys: Option<Vec<String>>,
    /// Entity snapshot every N events, 0 = never [default: 100]
    #[arg(long, value_name = "N")]
    pub snapshot_every: Option<Scalar>,
    /// Passivate entities idle this long, 0s = never [default: 2m]
    #[arg(long, value_name = "DURATION")]
    pub passivate_after: Option<Scalar>,
    /// Time an entity command waits for its reply [default: 5s]
    #[arg(long, value_name = "DURATION")]
    pub entity_ask_timeout: Option<Scalar>,
    /// Replicas of each journal log, 1..=7 [default: 3]
    #[arg(long, value_name = "N")]
    pub journal_replication_factor: Option<Scalar>,
    /// Replicas holding an event before it is acknowledged, more than half the replication
    /// factor [default: 2]
    #[arg(long, value_name = "W")]
    pub journal_write_quorum: Option<Scalar>,
    /// Read lease a log's writer takes from its replicas to confirm reads without a round
    /// trip, 0s..=2s (0s: none) [default: 2s]
    #[arg(long, value_name = "DURATION")]
    pub journal_read_lease: Option<Scalar>,
    /// Where shard coordinators keep their state: ddata or persistence [default: ddata]
    #[arg(long, value_name = "MODE")]
    pub state_store_mode: Option<String>,
    /// Whether shards remember their entities to restart them: off, ddata or eventsourced
    /// [default: off]
    #[arg(long, value_name = "STORE")]
    pub remember_entities: Option<String>,
    /// Shards per entity type, 1..=100000; fixed for the cluster's life [default: 1000]
    #[arg(long, value_name = "N")]
    pub number_of_shards: Option<Scalar>,
    /// How often the shard coordinator considers a rebalance [default: 10s]
    #[arg(long, value_name = "DURATION")]
    pub rebalance_interval: Option<Scalar>,
    /// Most shards moved per rebalance round [default: 20]
    #[arg(long, value_name = "N")]
    pub rebalance_absolute_limit: Option<Scalar>,
    /// Most shards moved per rebalance round as a fraction of all shards, in (0, 1]
    /// [default: 0.1]
    #[arg(long, value_name = "FRACTION")]
    pub rebalance_relative_limit: Option<Scalar>,
    /// A shard handoff not done within this long is given up [default: 1m]
    #[arg(long, value_name = "DURATION")]
    pub handoff_timeout: Option<Scalar>,
    /// Live entities per entity type on this node, least recently used passivated beyond it,
    /// 0 = no limit [default: 100000]
    #[arg(long, value_name = "N")]
    pub active_entity_limit: Option<Scalar>,
    /// Messages a shard region buffers for shards whose home is not known yet
    /// [default: 100000]
    #[arg(long, value_name = "N")]
    pub shard_buffer_size: Option<Scalar>,
    /// Live entities on this node over all entity types, least recently used passivated
    /// beyond it, 0 = no limit [default: 100000]
    #[arg(long, value_name = "N")]
    pub node_active_entity_limit: Option<Scalar>,
    /// Distributed Data keys this node holds, deleted ones included; new keys beyond it are
    /// refused [default: 1000000]
    #[arg(long, value_name = "N")]
    pub ddata_max_keys: Option<Scalar>,
    /// Largest Distributed Data value, encoded, in bytes [default: 1048576]
    #[arg(long, value_name = "BYTES")]
    pub ddata_max_value_bytes: Option<Scalar>,
    /// Distributed Data bytes (keys and encoded values) this node holds, at least
    /// ddata_max_value_bytes [default: 268435456]
    #[arg(long, value_name = "BYTES")]
    pub ddata_max_total_bytes: Option<Scalar>,
    /// Peers the cluster transport keeps send queues for at once [default: 1024]
    #[arg(long, value_name = "N")]
    pub transport_max_peers: Option<Scalar>,
    /// Inbound cluster connections served at once [default: 1024]
    #[arg(long, value_name = "N")]
    pub transport_max_inbound_connections: Option<Scalar>,
    /// Inbound cluster connections in their handshake at once; more are closed at once
    /// [default: 256]
    #[arg(long, value_name = "N")]
    pub transport_max_inbound_handshakes: Option<Scalar>,
    /// Time a cluster connection has to complete its handshake [default: 5s]
    #[arg(long, value_name = "DURATION")]
    pub transport_handshake_timeout: Option<Scalar>,
    /// Cluster transport requests waiting for an answer at once [default: 65536]
    #[arg(long, value_name = "N")]
    pub transport_max_pending_requests: Option<Scalar>,
    /// Cluster transport requests waiting for an answer from one peer at once, at most
    /// transport_max_pending_requests [default: 16384]
    #[arg(long, value_name = "N")]
    pub transport_max_pending_requests_per_peer: Option<Scalar>,
    /// Hosts sharded entities only on members with this role; others route (proxy-only)
    /// [default: none]
    #[arg(long, value_name = "ROLE")]
    pub sharding_role: Option<String>,
    /// Cluster Bootstrap: HTTP address of a contact point; repeat or comma-separate; not with
    /// seed nodes [default: none]
    #[arg(
        long = "contact-point",
        value_name = "HOST:PORT",
        value_delimiter = ','
    )]
    #[serde(default, deserialize_with = "list")]
    pub contact_points: Option<Vec<String>>,
    /// Cluster Bootstrap: DNS name listing the contact points (A/AAAA records, or SRV records
    /// for a name starting with _); not with seed nodes or contact points [default: none]
    #[arg(long, value_name = "NAME")]
    pub discovery_dns: Option<String>,
    /// DNS server to ask for discovery_dns instead of the system resolver; only with
    /// discovery_dns [default: none]
    #[arg(long, value_name = "IP:PORT")]
    pub discovery_dns_server: Option<String>,
    /// HTTP port of contact points found through A/AAAA records; only with discovery_dns
    /// [default: this node's http_port]
    #[arg(long, value_name = "PORT")]
    pub contact_point_port: Option<Scalar>,
    /// Contact points that must be found before a new cluster is formed, 1..=1000
    /// [default: 2]
    #[arg(long, value_name = "N")]
    pub required_contact_points: Option<Scalar>,
    /// Time the contact points found must stay unchanged before a new cluster is formed
    /// [default: 5s]
    #[arg(long, value_name = "DURATION")]
    pub stable_margin: Option<Scalar>,
    /// Whether this node may form a new cluster, or only join one [default: true]
    #[arg(long, value_name = "BOOL")]
    pub form_new_cluster: Option<Scalar>,
    /// Interval between probes of each contact point [default: 1s]
    #[arg(long, value_name = "DURATION")]
    pub bootstrap_probe_interval: Option<Scalar>,
    /// Shut down when not joined within this long, off = never [default: off]
    #[arg(long, value_name = "DURATION")]
    pub shutdown_after_unsuccessful_join: Option<Scalar>,
    /// Token HTTP API callers must present; prefer the file or env, flags show in `ps`
    /// [default: none]
    #[arg(long, value_name = "TOKEN")]
    pub http_token: Option<HttpToken>,
    /// File holding the HTTP API token, read at start [default: none]
    #[arg(long, value_name = "FILE")]
    pub http_token_file: Option<String>,
    /// Time allowed for a request's head to arrive [default: 10s]
    #[arg(long, value_name = "DURATION")]
    pub http_header_timeout: Option<Scalar>,
    /// Time allowed to answer an HTTP request [default: 30s]
    #[arg(long, value_name = "DURATION")]
    pub http_request_timeout: Option<Scalar>,
    /// HTTP requests served at once, 1..=100000 [default: 4096]
    #[arg(long, value_name = "N")]
    pub http_max_concurrent_requests: Option<Scalar>,
    /// HTTP connections open at once, 1..=100000 [default: 4096]
    #[arg(long, value_name = "N")]
    pub http_max_connections: Option<Scalar>,
    /// Entity types' own sections (`[entity.<type>]`), by [`section_name`]: each sets some of
    /// the per-type keys ([`ENTITY_KEYS`]) for that type alone. Set from the file, from
    /// `TESSERA_ENTITY_<TYPE>_<KEY>` and from `--entity <type>.<key>=<value>` (of `tessera
    /// node`), not a flag of its own.
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub entity: BTreeMap<String, ConfigLayer>,
}

/// Every configuration key, in definition order: the fields of [`ConfigLayer`] (read from its
/// flags, whose ids are the field names).
pub fn keys() -> &'static [String] {
    static KEYS: LazyLock<Vec<String>> = LazyLock::new(|| {
        <ConfigLayer as clap::Args>::augment_args(clap::Command::new("keys"))
            .get_arguments()
            .map(|arg| arg.get_id().to_string())
            .collect()
    });
    &KEYS
}

/// The environment variable of `key`: `stable_after` → `TESSERA_STABLE_AFTER`.
pub fn env_var_of(key: &str) -> String {
    format!("{ENV_PREFIX}{}", key.to_ascii_uppercase())
}

/// Appends `[env: TESSERA_<KEY>]` to a flag's help, the variable derived from the flag's id
/// (the key), so that no variable name is written by hand. For `mut_args` on the command that
/// holds the flags.
pub fn with_env_in_help(arg: clap::Arg) -> clap::Arg {
    // A flag whose help names its variables already (`--entity`) keeps its own.
    if arg
        .get_help()
        .is_some_and(|help| help.to_string().contains("[env: "))
    {
        return arg;
    }
    let env = env_var_of(arg.get_id().as_str());
    let help = arg.get_help().map(|help| format!("{help} [env: {env}]"));
    let long_help = arg
        .get_long_help()
        .map(|help| format!("{help} [env: {env}]"));
    let arg = match help {
        Some(help) => arg.help(help),
        None => arg,
    };
    match long_help {
        Some(help) => arg.long_help(help),
        None => arg,
    }
}

impl ConfigLayer {
    /// Parses a TOML config file's text. Unknown keys are an error.
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let layer: ConfigLayer = toml::from_str(text).map_err(|e| ConfigError::ParseFile {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })?;
        // Two sections that go by one name would be merged in no order anyone wrote.
        let mut seen = BTreeMap::new();
        for name in layer.entity.keys() {
            if let Some(other) = seen.insert(section_name(name), name) {
                return Err(ConfigError::ParseFile {
                    path: path.to_path_buf(),
                    message: format!(
                        "[entity.{other}] and [entity.{name}] are one type's section (names \
                         ignore case, '-', '.' and '_'); merge them"
                    ),
                });
            }
        }
        Ok(layer)
    }

    /// Reads and parses a TOML config file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(&text, path)
    }

    /// Picks the `TESSERA_<KEY>` variables out of an environment; lists are comma-separated.
    /// Variables without the prefix are ignored, and so are [`ENV_VARS_NOT_KEYS`]; any other
    /// `TESSERA_*` variable is refused, naming the closest known one. Takes the environment as
    /// an argument so tests need not touch the process environment.
    pub fn from_env<I>(vars: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (OsString, OsString)>,
    {
        let mut layer = ConfigLayer::default();
        for (name, value) in vars {
            let name_text = name.to_string_lossy();
            if !name_text.starts_with(ENV_PREFIX) || ENV_VARS_NOT_KEYS.contains(&&*name_text) {
                continue;
            }
            let key = keys().iter().find(|key| env_var_of(key) == name_text);
            let entity_key = || entity_env_var(&name_text);
            if key.is_none() && entity_key().is_none() {
                return Err(ConfigError::UnknownEnv {
                    closest: closest_env_var(&name_text),
                    name: name_text.into_owned(),
                });
            }
            let value = value
                .into_string()
                .map_err(|_| ConfigError::NonUnicodeEnv {
                    name: name_text.to_string(),
                })?;
            match (key, entity_key()) {
                (Some(key), _) => {
                    layer.set(key, value);
                }
                (None, Some((section, key))) => {
                    layer.entity.entry(section).or_default().set(key, value);
                }
                (None, None) => {}
            }
        }
        Ok(layer)
    }

    /// Sets `key` from its text form (lists comma-separated). Returns false for an unknown key.
    pub fn set(&mut self, key: &str, value: String) -> bool {
        if !keys().iter().any(|k| k == key) {
            return false;
        }
        let mut table = self.to_table();
        table.insert(key.to_string(), toml::Value::String(value));
        *self = Self::from_table(table);
        true
    }

    /// Stacks `over` on top of `self`: every key `over` sets wins (lists are replaced, not
    /// appended, so `--seed` on the command line replaces the file's seed nodes).
    pub fn overridden_by(mut self, mut over: ConfigLayer) -> ConfigLayer {
        // Entity sections merge key by key, by the name they go by.
        let mut sections: BTreeMap<String, ConfigLayer> = BTreeMap::new();
        for (name, section) in std::mem::take(&mut self.entity)
            .into_iter()
            .chain(std::mem::take(&mut over.entity))
        {
            let name = section_name(&name);
            let merged = match sections.remove(&name) {
                Some(below) => below.overridden_by(section),
                None => section,
            };
            sections.insert(name, merged);
        }
        let mut table = self.to_table();
        table.extend(over.to_table());
        let mut layer = Self::from_table(table);
        layer.entity = sections;
        layer
    }

    /// The keys this layer sets (`entity` too, when it holds sections).
    pub fn keys_set(&self) -> Vec<String> {
        self.to_table().keys().cloned().collect()
    }

    /// The keys this layer sets, as a TOML table (unset keys are left out).
    fn to_table(&self) -> toml::Table {
        toml::Table::try_from(self).expect("a layer is a table of TOML values")
    }

    /// The layer of a table of known keys, each a value of its type or text.
    fn from_table(table: toml::Table) -> Self {
        toml::Value::Table(table)
            .try_into()
            .expect("known keys with values of their type or text always deserialise")
    }
}

/// The known `TESSERA_*` variable closest to the unknown `name` (by Jaro similarity of what
/// follows the prefix, as clap suggests flags), if any is close enough to be a likely typo.
fn closest_env_var(name: &str) -> Option<String> {
    let rest = name[ENV_PREFIX.len()..].to_ascii_uppercase();
    let known = keys()
        .iter()
        .map(|key| env_var_of(key))
        .chain(ENV_VARS_NOT_KEYS.iter().map(|name| name.to_string()));
    known
        .map(|candidate| {
            (
                strsim::jaro(&rest, &candidate[ENV_PREFIX.len()..]),
                candidate,
            )
        })
        .filter(|(similarity, _)| *similarity > 0.7)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, candidate)| candidate)
}

/// The entity section and per-type key of `TESSERA_ENTITY_<TYPE>_<KEY>`, if `name` is one:
/// `<KEY>` is the longest per-type key it ends with, and what is left before it is the type's
/// section name (in upper case, `-` and `.` as `_`).
fn entity_env_var(name: &str) -> Option<(String, &'static str)> {
    let rest = name.strip_prefix(ENTITY_ENV_PREFIX)?;
    ENTITY_KEYS
        .iter()
        .filter_map(|key| {
            let section = rest.strip_suffix(&key.to_ascii_uppercase())?;
            let section = section.strip_suffix('_')?;
            (!section.is_empty()).then(|| (section_name(section), *key))
        })
        .max_by_key(|(_, key)| key.len())
}

/// The prefix of an entity type's own variables: `TESSERA_ENTITY_<TYPE>_<KEY>`.
pub const ENTITY_ENV_PREFIX: &str = "TESSERA_ENTITY_";

/// Deserialises a list key: a TOML array of strings, or text of comma-separated items (from
/// the environment or [`ConfigLayer::set`]).
fn list<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Vec<String>>, D::Error> {
    struct ListVisitor;

    impl<'de> Visitor<'de> for ListVisitor {
        type Value = Vec<String>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of strings, or a string of comma-separated items")
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Vec<String>, E> {
            Ok(split_list(text))
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
            let mut items = Vec::new();
            while let Some(item) = seq.next_element()? {
                items.push(item);
            }
            Ok(items)
        }
    }

    deserializer.deserialize_any(ListVisitor).map(Some)
}

/// A durable key pattern: a key, or a prefix ending in `*` (no other `*`).
fn parse_durable_key_pattern(pattern: &str) -> Result<String, ConfigError> {
    let body = pattern.strip_suffix('*').unwrap_or(pattern);
    if pattern.is_empty() || body.contains('*') || pattern.chars().any(char::is_control) {
        return Err(invalid(
            "durable_keys",
            pattern,
            "keys or key prefixes ending in *, like coordinator-* (no other *)",
        ));
    }
    Ok(pattern.to_string())
}

/// `"a, b,,c"` → `["a", "b", "c"]`.
fn split_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

impl NodeConfig {
    /// Loads the configuration from all sources: `flags` (already parsed from the command
    /// line) over the environment `env` over the file (`config_file`, else `TESSERA_CONFIG`)
    /// over the defaults, then validates it.
    pub fn load<I>(
        flags: ConfigLayer,
        config_file: Option<&Path>,
        env: I,
    ) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (OsString, OsString)>,
    {
        let env: Vec<(OsString, OsString)> = env.into_iter().collect();
        let env_file = env
            .iter()
            .find(|(name, _)| name == CONFIG_FILE_ENV)
            .map(|(_, value)| PathBuf::from(value));
        let env = ConfigLayer::from_env(env)?;
        let file = match config_file.map(Path::to_path_buf).or(env_file) {
            Some(path) => ConfigLayer::from_file(&path)?,
            None => ConfigLayer::default(),
        };
        Self::from_layer(file.overridden_by(env).overridden_by(flags))
    }

    /// Validates a (merged) layer, filling unset keys with the defaults, and reads
    /// `http_token_file`. `quorum_size` and `down_if_alone` are read only for the strategy they
    /// belong to, so switching `downing_strategy` with a flag does not trip over the other
    /// strategy's settings.
    pub fn from_layer(layer: ConfigLayer) -> Result<Self, ConfigError> {
        let d = NodeConfig::default();
        let host = match layer.host {
            Some(h) => parse_host("host", h)?,
            None => d.host,
        };
        let http_host = match layer.http_host {
            Some(h) => parse_host("http_host", h)?,
            None => host.clone(),
        };
        let cluster_secret = match layer.cluster_secret {
            Some(s) if s.expose().is_empty() => {
                return Err(invalid("cluster_secret", "", "a non-empty string"));
            }
            other => other,
        };
        let http_token = match (layer.http_token, layer.http_token_file) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::Exclusive {
                    first: "http_token",
                    second: "http_token_file",
                    why: "they are two ways to give the same token",
                });
            }
            (Some(token), None) => Some(check_http_token(token)?),
            (None, Some(path)) => Some(read_http_token_file(&path)?),
            (None, None) => None,
        };
        let downing_strategy = match layer.downing_strategy.as_deref() {
            None | Some("keep-majority") => DowningStrategy::KeepMajority,
            Some("static-quorum") => {
                let quorum_size = opt(layer.quorum_size, "quorum_size", |k, v| {
                    parse_int(k, v, 1, 10_000).map(|n| n as u32)
                })?
                .ok_or(ConfigError::QuorumSizeRequired)?;
                DowningStrategy::StaticQuorum { quorum_size }
            }
            Some("keep-oldest") => DowningStrategy::KeepOldest {
                down_if_alone: opt(layer.down_if_alone, "down_if_alone", parse_bool)?
                    .unwrap_or(true),
            },
            Some("down-all") => DowningStrategy::DownAll,
            Some(other) => {
                return Err(invalid(
                    "downing_strategy",
                    other,
                    "keep-majority, static-quorum, keep-oldest or down-all",
                ));
            }
        };
        let mut entities = BTreeMap::new();
        for (name, section) in &layer.entity {
            let settings = EntitySettings::from_section(section).map_err(|source| {
                ConfigError::EntitySection {
                    type_name: name.clone(),
                    source: Box::new(source),
                }
            })?;
            entities.insert(section_name(name), settings);
        }
        let config = NodeConfig {
            entities,
            port: opt(layer.port, "port", parse_port)?.unwrap_or(d.port),
            http_port: opt(layer.http_port, "http_port", parse_port)?.unwrap_or(d.http_port),
            seed_nodes: match layer.seed_nodes {
                Some(seeds) => seeds
                    .iter()
                    .map(|s| {
                        s.parse::<Address>().map_err(|e| {
                            invalid("seed_nodes", s, &format!("host:port ({})", e.reason))
                        })
                    })
                    .collect::<Result<_, _>>()?,
                None => d.seed_nodes,
            },
            data_dir: match layer.data_dir {
                Some(dir) if dir.trim().is_empty() => {
                    return Err(invalid("data_dir", &dir, "a directory path"));
                }
                Some(dir) => PathBuf::from(dir),
                None => d.data_dir,
            },
            roles: match layer.roles {
                Some(roles) => roles
                    .into_iter()
                    .map(|r| parse_role(r.trim()))
                    .collect::<Result<_, _>>()?,
                None => d.roles,
            },
            stable_after: opt(layer.stable_after, "stable_after", parse_duration)?
                .unwrap_or(d.stable_after),
            heartbeat_interval: opt(
                layer.heartbeat_interval,
                "heartbeat_interval",
                parse_positive_duration,
            )?
            .unwrap_or(d.heartbeat_interval),
            gossip_interval: opt(
                layer.gossip_interval,
                "gossip_interval",
                parse_positive_duration,
            )?
            .unwrap_or(d.gossip_interval),
            seed_node_timeout: opt(
                layer.seed_node_timeout,
                "seed_node_timeout",
                parse_positive_duration,
            )?
            .unwrap_or(d.seed_node_timeout),
            allow_weakly_up_after: opt(
                layer.allow_weakly_up_after,
                "allow_weakly_up_after",
                parse_duration,
            )?
            .unwrap_or(d.allow_weakly_up_after),
            monitored_by: opt(layer.monitored_by, "monitored_by", |k, v| {
                parse_int(k, v, 1, 100).map(|n| n as u32)
            })?
            .unwrap_or(d.monitored_by),
            failure_detector_threshold: opt(
                layer.failure_detector_threshold,
                "failure_detector_threshold",
                parse_threshold,
            )?
            .unwrap_or(d.failure_detector_threshold),
            acceptable_heartbeat_pause: opt(
                layer.acceptable_heartbeat_pause,
                "acceptable_heartbeat_pause",
                parse_duration,
            )?
            .unwrap_or(d.acceptable_heartbeat_pause),
            min_std_deviation: opt(
                layer.min_std_deviation,
                "min_std_deviation",
                parse_positive_duration,
            )?
            .unwrap_or(d.min_std_deviation),
            max_frame_size: opt(layer.max_frame_size, "max_frame_size", |k, v| {
                parse_int(k, v, MAX_FRAME_SIZE_RANGE.0, MAX_FRAME_SIZE_RANGE.1).map(|n| n as usize)
            })?
            .unwrap_or(d.max_frame_size),
            app_version: match layer.app_version {
                Some(v) if v.trim().is_empty() || v.chars().any(char::is_whitespace) => {
                    return Err(invalid("app_version", &v, "a version like 1.2.3"));
                }
                Some(v) => v,
                None => d.app_version,
            },
            log_format: match layer.log_format {
                Some(f) => f
                    .parse()
                    .map_err(|_| invalid("log_format", &f, "text or json"))?,
                None => d.log_format,
            },
            log_level: match layer.log_level {
                Some(level) => {
                    logging::parse_filter(&level)
                        .map_err(|expected| invalid_owned("log_level", &level, expected))?;
                    level
                }
                None => d.log_level,
            },
            durable_keys: match layer.durable_keys {
                Some(patterns) => patterns
                    .into_iter()
                    .map(|p| parse_durable_key_pattern(p.trim()))
                    .collect::<Result<_, _>>()?,
                None => d.durable_keys,
            },
            snapshot_every: opt(layer.snapshot_every, "snapshot_every", |k, v| {
                parse_int(k, v, 0, MAX_SNAPSHOT_EVERY)
            })?
            .unwrap_or(d.snapshot_every),
            passivate_after: opt(layer.passivate_after, "passivate_after", parse_duration)?
                .unwrap_or(d.passivate_after),
            entity_ask_timeout: opt(
                layer.entity_ask_timeout,
                "entity_ask_timeout",
                parse_positive_duration,
            )?
            .unwrap_or(d.entity_ask_timeout),
            journal_replication_factor: opt(
                layer.journal_replication_factor,
                "journal_replication_factor",
                |k, v| parse_int(k, v, 1, MAX_REPLICATION_FACTOR).map(|n| n as u32),
            )?
            .unwrap_or(d.journal_replication_factor),
            journal_write_quorum: opt(
                layer.journal_write_quorum,
                "journal_write_quorum",
                |k, v| parse_int(k, v, 1, MAX_REPLICATION_FACTOR).map(|n| n as u32),
            )?
            .unwrap_or(d.journal_write_quorum),
            journal_read_lease: opt(
                layer.journal_read_lease,
                "journal_read_lease",
                parse_read_lease,
            )?
            .unwrap_or(d.journal_read_lease),
            state_store_mode: match layer.state_store_mode {
                Some(mode) => StateStoreMode::from_name(mode.trim())
                    .ok_or_else(|| invalid("state_store_mode", &mode, "ddata or persistence"))?,
                None => d.state_store_mode,
            },
            remember_entities: match layer.remember_entities {
                Some(store) => RememberEntities::from_name(store.trim()).ok_or_else(|| {
                    invalid("remember_entities", &store, "off, ddata or eventsourced")
                })?,
                None => d.remember_entities,
            },
            number_of_shards: opt(layer.number_of_shards, "number_of_shards", |k, v| {
                parse_int(k, v, 1, MAX_NUMBER_OF_SHARDS).map(|n| n as u32)
            })?
            .unwrap_or(d.number_of_shards),
            rebalance_interval: opt(
                layer.rebalance_interval,
                "rebalance_interval",
                parse_positive_duration,
            )?
            .unwrap_or(d.rebalance_interval),
            rebalance_absolute_limit: opt(
                layer.rebalance_absolute_limit,
                "rebalance_absolute_limit",
                |k, v| parse_int(k, v, 1, MAX_NUMBER_OF_SHARDS).map(|n| n as u32),
            )?
            .unwrap_or(d.rebalance_absolute_limit),
            rebalance_relative_limit: opt(
                layer.rebalance_relative_limit,
                "rebalance_relative_limit",
                parse_fraction,
            )?
            .unwrap_or(d.rebalance_relative_limit),
            handoff_timeout: opt(
                layer.handoff_timeout,
                "handoff_timeout",
                parse_positive_duration,
            )?
            .unwrap_or(d.handoff_timeout),
            active_entity_limit: opt(layer.active_entity_limit, "active_entity_limit", |k, v| {
                parse_int(k, v, 0, u64::MAX)
            })?
            .unwrap_or(d.active_entity_limit),
            shard_buffer_size: opt(layer.shard_buffer_size, "shard_buffer_size", |k, v| {
                parse_int(k, v, 1, u32::MAX.into()).map(|n| n as u32)
            })?
            .unwrap_or(d.shard_buffer_size),
            node_active_entity_limit: opt(
                layer.node_active_entity_limit,
                "node_active_entity_limit",
                |k, v| parse_int(k, v, 0, u64::MAX),
            )?
            .unwrap_or(d.node_active_entity_limit),
            ddata_max_keys: opt(layer.ddata_max_keys, "ddata_max_keys", |k, v| {
                parse_int(k, v, 1, u64::from(u32::MAX))
            })?
            .unwrap_or(d.ddata_max_keys),
            ddata_max_value_bytes: opt(
                layer.ddata_max_value_bytes,
                "ddata_max_value_bytes",
                |k, v| parse_int(k, v, MIN_DDATA_VALUE_BYTES, MAX_FRAME_SIZE_RANGE.1 / 2),
            )?
            .unwrap_or(d.ddata_max_value_bytes),
            ddata_max_total_bytes: opt(
                layer.ddata_max_total_bytes,
                "ddata_max_total_bytes",
                |k, v| parse_int(k, v, MIN_DDATA_VALUE_BYTES, u64::MAX),
            )?
            .unwrap_or(d.ddata_max_total_bytes),
            transport_max_peers: opt(layer.transport_max_peers, "transport_max_peers", |k, v| {
                parse_int(k, v, 1, MAX_TRANSPORT_LIMIT).map(|n| n as u32)
            })?
            .unwrap_or(d.transport_max_peers),
            transport_max_inbound_connections: opt(
                layer.transport_max_inbound_connections,
                "transport_max_inbound_connections",
                |k, v| parse_int(k, v, 1, MAX_TRANSPORT_LIMIT).map(|n| n as u32),
            )?
            .unwrap_or(d.transport_max_inbound_connections),
            transport_max_inbound_handshakes: opt(
                layer.transport_max_inbound_handshakes,
                "transport_max_inbound_handshakes",
                |k, v| parse_int(k, v, 1, MAX_TRANSPORT_LIMIT).map(|n| n as u32),
            )?
            .unwrap_or(d.transport_max_inbound_handshakes),
            transport_handshake_timeout: opt(
                layer.transport_handshake_timeout,
                "transport_handshake_timeout",
                parse_positive_duration,
            )?
            .unwrap_or(d.transport_handshake_timeout),
            transport_max_pending_requests: opt(
                layer.transport_max_pending_requests,
                "transport_max_pending_requests",
                |k, v| parse_int(k, v, 1, MAX_TRANSPORT_LIMIT).map(|n| n as u32),
            )?
            .unwrap_or(d.transport_max_pending_requests),
            transport_max_pending_requests_per_peer: opt(
                layer.transport_max_pending_requests_per_peer,
                "transport_max_pending_requests_per_peer",
                |k, v| parse_int(k, v, 1, MAX_TRANSPORT_LIMIT).map(|n| n as u32),
            )?
            .unwrap_or(d.transport_max_pending_requests_per_peer),
            sharding_role: match layer.sharding_role {
                Some(role) if role.trim().is_empty() => None,
                Some(role) => Some(parse_role(role.trim()).map_err(|_| {
                    invalid(
                        "sharding_role",
                        &role,
                        "a role name without spaces or commas, like backend",
                    )
                })?),
                None => d.sharding_role,
            },
            contact_points: match layer.contact_points {
                Some(points) => points
                    .iter()
                    .map(|point| {
                        point.trim().parse().map_err(|e: AddressParseError| {
                            invalid_owned(
                                "contact_points",
                                point,
                                format!(
                                    "host:port of a node's HTTP API, like 10.0.0.1:8558 ({})",
                                    e.reason
                                ),
                            )
                        })
                    })
                    .collect::<Result<_, _>>()?,
                None => d.contact_points,
            },
            discovery_dns: match layer.discovery_dns {
                Some(name) if name.trim().is_empty() => None,
                Some(name) => Some(parse_dns_name(&name)?),
                None => d.discovery_dns,
            },
            discovery_dns_server: match layer.discovery_dns_server {
                Some(server) if server.trim().is_empty() => None,
                Some(server) => Some(server.trim().parse().map_err(|_| {
                    invalid(
                        "discovery_dns_server",
                        &server,
                        "the IP address and port of a DNS server, like 127.0.0.1:53",
                    )
                })?),
                None => d.discovery_dns_server,
            },
            contact_point_port: opt(layer.contact_point_port, "contact_point_port", |k, v| {
                parse_int(k, v, 1, u16::MAX.into()).map(|n| n as u16)
            })?
            .or(d.contact_point_port),
            required_contact_points: opt(
                layer.required_contact_points,
                "required_contact_points",
                |k, v| parse_int(k, v, 1, MAX_REQUIRED_CONTACT_POINTS).map(|n| n as u32),
            )?
            .unwrap_or(d.required_contact_points),
            stable_margin: opt(
                layer.stable_margin,
                "stable_margin",
                parse_positive_duration,
            )?
            .unwrap_or(d.stable_margin),
            form_new_cluster: opt(layer.form_new_cluster, "form_new_cluster", parse_bool)?
                .unwrap_or(d.form_new_cluster),
            bootstrap_probe_interval: opt(
                layer.bootstrap_probe_interval,
                "bootstrap_probe_interval",
                parse_positive_duration,
            )?
            .unwrap_or(d.bootstrap_probe_interval),
            shutdown_after_unsuccessful_join: opt(
                layer.shutdown_after_unsuccessful_join,
                "shutdown_after_unsuccessful_join",
                parse_duration_or_off,
            )?
            .unwrap_or(d.shutdown_after_unsuccessful_join),
            http_header_timeout: opt(
                layer.http_header_timeout,
                "http_header_timeout",
                parse_positive_duration,
            )?
            .unwrap_or(d.http_header_timeout),
            http_request_timeout: opt(
                layer.http_request_timeout,
                "http_request_timeout",
                parse_positive_duration,
            )?
            .unwrap_or(d.http_request_timeout),
            http_max_concurrent_requests: opt(
                layer.http_max_concurrent_requests,
                "http_max_concurrent_requests",
                |k, v| parse_int(k, v, 1, MAX_HTTP_LIMIT).map(|n| n as u32),
            )?
            .unwrap_or(d.http_max_concurrent_requests),
            http_max_connections: opt(
                layer.http_max_connections,
                "http_max_connections",
                |k, v| parse_int(k, v, 1, MAX_HTTP_LIMIT).map(|n| n as u32),
            )?
            .unwrap_or(d.http_max_connections),
            host,
            http_host,
            cluster_secret,
            downing_strategy,
            http_token,
        };
        config.check_rules()?;
        Ok(config)
    }

    /// Rules that involve more than one key.
    fn check_rules(&self) -> Result<(), ConfigError> {
        let at_most = [
            (
                "transport_max_pending_requests_per_peer",
                u64::from(self.transport_max_pending_requests_per_peer),
                "transport_max_pending_requests",
                u64::from(self.transport_max_pending_requests),
            ),
            (
                "ddata_max_value_bytes",
                self.ddata_max_value_bytes,
                "ddata_max_total_bytes",
                self.ddata_max_total_bytes,
            ),
        ];
        for (key, value, other, limit) in at_most {
            if value > limit {
                return Err(ConfigError::OutOfRange {
                    key,
                    value: value.to_string(),
                    allowed: format!("at most {other} = {limit}"),
                });
            }
        }
        let (n, w) = (self.journal_replication_factor, self.journal_write_quorum);
        if w * 2 <= n || w > n {
            return Err(ConfigError::WriteQuorum {
                write_quorum: w,
                replication_factor: n,
            });
        }
        if self.cluster_secret.is_none() && !is_loopback(&self.host) {
            return Err(ConfigError::NonLoopbackWithoutSecret {
                key: "host",
                host: self.host.clone(),
            });
        }
        if self.http_token.is_none() && !is_loopback(&self.http_host) {
            return Err(ConfigError::NonLoopbackHttpWithoutToken {
                host: self.http_host.clone(),
            });
        }
        if self.port == self.http_port && self.port != 0 && self.host == self.http_host {
            return Err(ConfigError::PortClash {
                port: self.port,
                host: self.host.clone(),
            });
        }
        self.check_bootstrap_rules()
    }

    /// Cluster Bootstrap's keys: one way to form a cluster, one source of contact points, and
    /// the DNS settings only with DNS.
    fn check_bootstrap_rules(&self) -> Result<(), ConfigError> {
        let two_ways = "they are two ways to form a cluster (joining through seed nodes, or \
                        Cluster Bootstrap through contact points)";
        let seeds = !self.seed_nodes.is_empty();
        let listed = !self.contact_points.is_empty();
        let dns = self.discovery_dns.is_some();
        let exclusive = [
            (seeds && listed, "seed_nodes", "contact_points", two_ways),
            (seeds && dns, "seed_nodes", "discovery_dns", two_ways),
            (
                listed && dns,
                "contact_points",
                "discovery_dns",
                "they are two sources of contact points for Cluster Bootstrap",
            ),
        ];
        if let Some((_, first, second, why)) = exclusive.into_iter().find(|rule| rule.0) {
            return Err(ConfigError::Exclusive { first, second, why });
        }
        let dns_only = [
            ("discovery_dns_server", self.discovery_dns_server.is_some()),
            ("contact_point_port", self.contact_point_port.is_some()),
        ];
        if let Some((key, _)) = dns_only.into_iter().find(|(_, set)| *set && !dns) {
            return Err(ConfigError::Without {
                key,
                needs: "discovery_dns",
                what: "contact points found through DNS",
            });
        }
        Ok(())
    }

    /// Things that are allowed but worth a log line at start; the caller logs them.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        match &self.cluster_secret {
            None => warnings.push(
                "no cluster_secret set: peers are not authenticated, so the node binds \
                 loopback only; set cluster_secret (TESSERA_CLUSTER_SECRET) before binding \
                 another address"
                    .to_string(),
            ),
            Some(secret) if secret.expose().len() < 16 => warnings.push(format!(
                "cluster_secret is {} characters long: use at least 16 random characters",
                secret.expose().len()
            )),
            Some(_) => {}
        }
        if let Some(token) = &self.http_token
            && token.expose().len() < 16
        {
            warnings.push(format!(
                "http_token is {} characters long: use at least 16 random characters",
                token.expose().len()
            ));
        }
        if self.acceptable_heartbeat_pause < self.heartbeat_interval {
            warnings.push(format!(
                "acceptable_heartbeat_pause = {} is shorter than heartbeat_interval = {}: \
                 nodes will be marked unreachable after a single late heartbeat",
                humantime::format_duration(self.acceptable_heartbeat_pause),
                humantime::format_duration(self.heartbeat_interval)
            ));
        }
        warnings
    }

    /// The address the cluster transport binds to and advertises.
    pub fn cluster_address(&self) -> Address {
        Address::new(self.host.clone(), self.port)
    }

    /// The settings of entity type `type_name`'s section (none set when it has none).
    pub fn entity_section(&self, type_name: &str) -> EntitySettings {
        self.entities
            .get(&section_name(type_name))
            .cloned()
            .unwrap_or_default()
    }

    /// Refuses a section that none of `registered` (the node's entity types) goes by.
    pub fn check_entity_sections<'a>(
        &self,
        registered: impl IntoIterator<Item = &'a str> + Clone,
    ) -> Result<(), ConfigError> {
        for section in self.entities.keys() {
            if !registered
                .clone()
                .into_iter()
                .any(|t| section_name(t) == *section)
            {
                let names: Vec<&str> = registered.into_iter().collect();
                return Err(ConfigError::UnknownEntitySection {
                    section: section.clone(),
                    registered: if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    },
                });
            }
        }
        Ok(())
    }

    /// `node_active_entity_limit` as a budget's limit: `None` for 0 (no limit).
    pub fn node_active_entity_limit(&self) -> Option<usize> {
        entity_limit(self.node_active_entity_limit)
    }

    /// `active_entity_limit` as the entities host takes it: `None` for 0 (no limit).
    pub fn active_entity_limit(&self) -> Option<usize> {
        entity_limit(self.active_entity_limit)
    }
}

/// A configured count of entities as a limit: `None` for 0 (no limit).
pub(crate) fn entity_limit(configured: u64) -> Option<usize> {
    (configured != 0).then(|| usize::try_from(configured).unwrap_or(usize::MAX))
}

/// True for 127.0.0.0/8, ::1 (bracketed or not) and `localhost`.
pub fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn invalid(key: &'static str, value: &str, expected: &str) -> ConfigError {
    invalid_owned(key, value, expected.to_string())
}

fn invalid_owned(key: &'static str, value: &str, expected: String) -> ConfigError {
    ConfigError::InvalidValue {
        key,
        value: value.to_string(),
        expected,
    }
}

/// Applies `parse` to a value that may be absent.
fn opt<T>(
    value: Option<Scalar>,
    key: &'static str,
    parse: impl FnOnce(&'static str, &Scalar) -> Result<T, ConfigError>,
) -> Result<Option<T>, ConfigError> {
    value.map(|v| parse(key, &v)).transpose()
}

fn parse_host(key: &'static str, host: String) -> Result<String, ConfigError> {
    let h = host.trim();
    if h.is_empty() || h.chars().any(|c| c.is_whitespace() || c == '/') {
        return Err(invalid(
            key,
            &host,
            "a host name or IP address like 127.0.0.1",
        ));
    }
    Ok(h.to_string())
}

fn parse_role(role: &str) -> Result<String, ConfigError> {
    if role.is_empty() || role.chars().any(|c| c.is_whitespace() || c == ',') {
        return Err(invalid(
            "roles",
            role,
            "role names without spaces or commas, like backend,frontend",
        ));
    }
    Ok(role.to_string())
}

/// Longest duration any key accepts: beyond it a value is a typo, and timers and deadlines
/// computed from it could overflow.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

fn parse_duration(key: &'static str, value: &Scalar) -> Result<Duration, ConfigError> {
    let expected = "a duration like 2s or 500ms";
    let d = match value {
        Scalar::Text(text) => {
            humantime::parse_duration(text.trim()).map_err(|_| invalid(key, text, expected))?
        }
        other => return Err(invalid(key, &other.to_string(), expected)),
    };
    if d > MAX_DURATION {
        return Err(ConfigError::OutOfRange {
            key,
            value: value.to_string(),
            allowed: "at most a year (365d)".into(),
        });
    }
    Ok(d)
}

/// A read lease: replicas grant at most `MAX_READ_LEASE` (and a restarted replica waits that
/// long), so a writer must not count on more.
fn parse_read_lease(key: &'static str, value: &Scalar) -> Result<Duration, ConfigError> {
    let d = parse_duration(key, value)?;
    let max = tessera_replication::replica::MAX_READ_LEASE;
    if d > max {
        return Err(ConfigError::OutOfRange {
            key,
            value: value.to_string(),
            allowed: format!("at most {}", humantime::format_duration(max)),
        });
    }
    Ok(d)
}

/// Durations that drive a timer must not be zero: a zero interval would spin.
fn parse_positive_duration(key: &'static str, value: &Scalar) -> Result<Duration, ConfigError> {
    let d = parse_duration(key, value)?;
    if d.is_zero() {
        return Err(ConfigError::OutOfRange {
            key,
            value: value.to_string(),
            allowed: "greater than zero".into(),
        });
    }
    Ok(d)
}

/// An integer in `min..=max`, from a TOML integer or a text value.
fn parse_int(key: &'static str, value: &Scalar, min: u64, max: u64) -> Result<u64, ConfigError> {
    let expected = "an integer";
    let n: i128 = match value {
        Scalar::Int(i) => (*i).into(),
        Scalar::Text(t) => t.trim().parse().map_err(|_| invalid(key, t, expected))?,
        other => return Err(invalid(key, &other.to_string(), expected)),
    };
    match u64::try_from(n) {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(ConfigError::OutOfRange {
            key,
            value: n.to_string(),
            allowed: format!("between {min} and {max}"),
        }),
    }
}

fn parse_port(key: &'static str, value: &Scalar) -> Result<u16, ConfigError> {
    // In range by construction, so the conversion cannot fail.
    parse_int(key, value, 0, u16::MAX.into()).map(|n| n as u16)
}

fn parse_bool(key: &'static str, value: &Scalar) -> Result<bool, ConfigError> {
    match value {
        Scalar::Bool(b) => Ok(*b),
        Scalar::Text(t) if t.trim() == "true" => Ok(true),
        Scalar::Text(t) if t.trim() == "false" => Ok(false),
        other => Err(invalid(key, &other.to_string(), "true or false")),
    }
}

/// A number in `(0, max]`, from a TOML float or integer or a text value; `example` shows the
/// form in the message for a value that is not a number.
fn parse_positive_number(
    key: &'static str,
    value: &Scalar,
    max: f64,
    example: &str,
) -> Result<f64, ConfigError> {
    let expected = || format!("a number like {example}");
    let x = match value {
        Scalar::Float(x) => *x,
        Scalar::Int(i) => *i as f64,
        Scalar::Text(t) => t
            .trim()
            .parse()
            .map_err(|_| invalid_owned(key, t, expected()))?,
        Scalar::Bool(b) => return Err(invalid_owned(key, &b.to_string(), expected())),
    };
    if !x.is_finite() || x <= 0.0 || x > max {
        return Err(ConfigError::OutOfRange {
            key,
            value: value.to_string(),
            allowed: format!("a number greater than 0 and at most {max}"),
        });
    }
    Ok(x)
}

fn parse_threshold(key: &'static str, value: &Scalar) -> Result<f64, ConfigError> {
    parse_positive_number(key, value, 1000.0, "8.0")
}

fn parse_fraction(key: &'static str, value: &Scalar) -> Result<f64, ConfigError> {
    parse_positive_number(key, value, 1.0, "0.1")
}

/// A duration, or `off` (also `0s`) for none.
fn parse_duration_or_off(
    key: &'static str,
    value: &Scalar,
) -> Result<Option<Duration>, ConfigError> {
    if let Scalar::Text(text) = value
        && text.trim() == "off"
    {
        return Ok(None);
    }
    let d = parse_duration(key, value).map_err(|_| {
        invalid(
            key,
            &value.to_string(),
            "a duration like 2s or 500ms, or off",
        )
    })?;
    Ok((!d.is_zero()).then_some(d))
}

/// A DNS name: dot-separated labels of letters, digits, `-` and `_` (SRV names start with
/// `_`), at most 63 characters each and 253 in all, an optional final dot.
fn parse_dns_name(name: &str) -> Result<String, ConfigError> {
    let trimmed = name.trim();
    let body = trimmed.strip_suffix('.').unwrap_or(trimmed);
    let label_ok = |label: &str| {
        (1..=63).contains(&label.len())
            && label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    if body.len() > 253 || !body.split('.').all(label_ok) {
        return Err(invalid(
            "discovery_dns",
            name,
            "a DNS name like tessera.default.svc.cluster.local, or an SRV name like \
             _http._tcp.tessera.local",
        ));
    }
    Ok(trimmed.to_string())
}

/// What an HTTP token must be: text a client can send in a header.
const HTTP_TOKEN_FORM: &str = "a non-empty string without whitespace or control characters";

/// Checks a token given directly; the message never shows the token.
fn check_http_token(token: HttpToken) -> Result<HttpToken, ConfigError> {
    if token_fits_a_header(token.expose()) {
        Ok(token)
    } else {
        Err(invalid("http_token", "<redacted>", HTTP_TOKEN_FORM))
    }
}

/// Reads the token from `http_token_file`, trimming whitespace around it (a final newline).
fn read_http_token_file(path: &str) -> Result<HttpToken, ConfigError> {
    if path.trim().is_empty() {
        return Err(invalid("http_token_file", path, "a file path"));
    }
    let path = PathBuf::from(path);
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::ReadTokenFile {
        path: path.clone(),
        source,
    })?;
    let token = text.trim();
    let problem = if token.is_empty() {
        "the file is empty: it must hold the HTTP API token"
    } else if !token_fits_a_header(token) {
        "the token holds whitespace or control characters, which an HTTP header cannot carry"
    } else {
        return Ok(HttpToken::new(token));
    };
    Err(ConfigError::BadTokenFile { path, problem })
}

fn token_fits_a_header(token: &str) -> bool {
    !token.is_empty() && token.chars().all(|c| !c.is_whitespace() && !c.is_control())
}

#[cfg(test)]
#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    fn layer(pairs: &[(&str, &str)]) -> ConfigLayer {
        let mut layer = ConfigLayer::default();
        for (key, value) in pairs {
            assert!(layer.set(key, value.to_string()), "unknown key {key}");
        }
        layer
    }

    fn from(pairs: &[(&str, &str)]) -> Result<NodeConfig, ConfigError> {
        NodeConfig::from_layer(layer(pairs))
    }

    fn error(pairs: &[(&str, &str)]) -> String {
        from(pairs).unwrap_err().to_string()
    }

    fn toml_file(text: &str) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        file
    }

    #[test]
    fn empty_sources_give_the_documented_defaults() {
        let config = NodeConfig::load(ConfigLayer::default(), None, env(&[])).unwrap();
        assert_eq!(config, NodeConfig::default());
        assert_eq!(config.cluster_address().to_string(), "127.0.0.1:25520");
        assert_eq!(config.http_port, 8558);
        assert_eq!(config.app_version, env!("CARGO_PKG_VERSION"));
        assert_eq!(config.downing_strategy, DowningStrategy::KeepMajority);
    }

    #[test]
    fn flag_beats_env_beats_file_beats_default() {
        let file = toml_file("port = 1001\nhttp_port = 2001\nmonitored_by = 7\n");
        let envs = env(&[("TESSERA_PORT", "1002"), ("TESSERA_HTTP_PORT", "2002")]);
        let flags = layer(&[("port", "1003")]);
        let config = NodeConfig::load(flags, Some(file.path()), envs.clone()).unwrap();
        assert_eq!(config.port, 1003, "flag wins over env and file");
        assert_eq!(config.http_port, 2002, "env wins over file");
        assert_eq!(config.monitored_by, 7, "file wins over default");
        assert_eq!(config.gossip_interval, Duration::from_secs(1), "default");
    }

    #[test]
    fn config_file_can_be_named_by_env() {
        let file = toml_file("port = 4242\n");
        let path = file.path().to_str().unwrap();
        let config = NodeConfig::load(
            ConfigLayer::default(),
            None,
            env(&[("TESSERA_CONFIG", path)]),
        )
        .unwrap();
        assert_eq!(config.port, 4242);
    }

    #[test]
    fn env_lists_are_comma_separated_and_flags_replace_file_lists() {
        let file = toml_file("seed_nodes = [\"127.0.0.1:1\"]\nroles = [\"a\"]\n");
        let envs = env(&[
            ("TESSERA_SEED_NODES", "127.0.0.1:2, 127.0.0.1:3"),
            ("TESSERA_ROLES", "backend,frontend"),
        ]);
        let config = NodeConfig::load(ConfigLayer::default(), Some(file.path()), envs).unwrap();
        assert_eq!(
            config.seed_nodes,
            vec![Address::new("127.0.0.1", 2), Address::new("127.0.0.1", 3)]
        );
        assert_eq!(
            config.roles,
            BTreeSet::from(["backend".to_string(), "frontend".to_string()])
        );
    }

    #[test]
    fn env_ignores_variables_without_the_prefix() {
        let layer = ConfigLayer::from_env(env(&[("PORT", "2"), ("tessera_port", "1")])).unwrap();
        assert_eq!(layer, ConfigLayer::default());
    }

    #[test]
    fn unknown_tessera_variables_are_refused_naming_the_closest_key() {
        for (name, closest) in [
            ("TESSERA_PROT", Some("TESSERA_PORT")),
            ("TESSERA_port", Some("TESSERA_PORT")),
            ("TESSERA_SEED", Some("TESSERA_SEED_NODES")),
            ("TESSERA_HTTP_TOKENFILE", Some("TESSERA_HTTP_TOKEN_FILE")),
            ("TESSERA_CONTACT_POINT", Some("TESSERA_CONTACT_POINTS")),
            ("TESSERA_CONFIG_FILE", Some("TESSERA_CONFIG")),
            ("TESSERA_XYZZY", None),
        ] {
            let err =
                ConfigLayer::from_env(env(&[("TESSERA_PORT", "1"), (name, "3")])).unwrap_err();
            match &err {
                ConfigError::UnknownEnv {
                    name: n,
                    closest: c,
                } => {
                    assert_eq!(n, name);
                    assert_eq!(c.as_deref(), closest, "{name}");
                }
                other => panic!("{name}: {other:?}"),
            }
            let msg = err.to_string();
            assert!(
                msg.starts_with(&format!("unknown environment variable {name}")),
                "{msg}"
            );
            if let Some(closest) = closest {
                assert!(msg.contains(&format!("(did you mean {closest}?)")), "{msg}");
            }
        }
        let err = NodeConfig::load(
            ConfigLayer::default(),
            None,
            env(&[("TESSERA_GOSIP_INTERVAL", "1s")]),
        )
        .unwrap_err();
        assert!(
            matches!(&err, ConfigError::UnknownEnv { name, .. } if name == "TESSERA_GOSIP_INTERVAL"),
            "{err}"
        );
    }

    #[test]
    fn the_variables_of_tools_and_the_client_are_not_refused() {
        assert_eq!(ENV_VARS_NOT_KEYS.len(), 13);
        for name in [
            "TESSERA_CONFIG",
            "TESSERA_SIM_SEEDS",
            "TESSERA_SIM_TRACE",
            "TESSERA_CRASH_SEED",
            "TESSERA_CRASH_ITERATIONS",
            "TESSERA_SINGLETON_SIM_SEED",
            "TESSERA_KEEP_TEST_DIRS",
            "TESSERA_JOURNAL_CRASH_CHILD_DIR",
            "TESSERA_POWER_LOSS_CHILD_DIR",
            "TESSERA_POWER_LOSS_CHILD_MODE",
            "TESSERA_SOAK_MINUTES",
            "TESSERA_NODE",
            "TESSERA_TOKEN",
        ] {
            assert!(ENV_VARS_NOT_KEYS.contains(&name), "{name}");
            let layer = ConfigLayer::from_env(env(&[(name, "1")])).unwrap();
            assert_eq!(layer, ConfigLayer::default(), "{name} is not a key");
        }
        // None of them is a key's variable, which would make the key unsettable.
        for key in keys() {
            assert!(
                !ENV_VARS_NOT_KEYS.contains(&env_var_of(key).as_str()),
                "{key}"
            );
        }
        let config = NodeConfig::load(
            ConfigLayer::default(),
            None,
            env(&[("TESSERA_NODE", "10.0.0.1:8558"), ("TESSERA_TOKEN", "t")]),
        )
        .unwrap();
        assert_eq!(config, NodeConfig::default());
    }

    #[test]
    fn every_key_is_a_toml_key_a_variable_and_a_settable_name() {
        let keys = keys();
        assert!(keys.len() >= 55, "{keys:?}");
        assert!(keys.iter().any(|k| k == "seed_nodes"));
        for key in keys {
            let text = format!("{key} = \"1\"\n");
            let file = ConfigLayer::from_toml(&text, Path::new("f")).unwrap();
            let var = ConfigLayer::from_env(env(&[(&env_var_of(key), "1")])).unwrap();
            assert_eq!(file, var, "{key}");
            assert_ne!(file, ConfigLayer::default(), "{key}");
        }
    }

    #[test]
    fn http_host_follows_host_unless_set() {
        let secret = ("cluster_secret", "0123456789abcdef");
        let token = ("http_token", "0123456789abcdef-token");
        let config = from(&[("host", "10.0.0.5"), secret, token]).unwrap();
        assert_eq!(config.http_host, "10.0.0.5");
        let config = from(&[("host", "10.0.0.5"), ("http_host", "127.0.0.1"), secret]).unwrap();
        assert_eq!(config.http_host, "127.0.0.1");
    }

    #[test]
    fn file_values_are_typed_toml() {
        let text = r#"
            host = "127.0.0.2"
            port = 3000
            stable_after = "30s"
            failure_detector_threshold = 10
            downing_strategy = "keep-oldest"
            down_if_alone = false
            max_frame_size = 65536
            log_format = "json"
            log_level = "tessera=debug,info"
        "#;
        let config =
            NodeConfig::from_layer(ConfigLayer::from_toml(text, Path::new("t.toml")).unwrap())
                .unwrap();
        assert_eq!(config.host, "127.0.0.2");
        assert_eq!(config.port, 3000);
        assert_eq!(config.stable_after, Duration::from_secs(30));
        assert_eq!(config.failure_detector_threshold, 10.0);
        assert_eq!(
            config.downing_strategy,
            DowningStrategy::KeepOldest {
                down_if_alone: false
            }
        );
        assert_eq!(config.max_frame_size, 65536);
        assert_eq!(config.log_format, LogFormat::Json);
    }

    #[test]
    fn unknown_file_key_is_an_error_naming_it() {
        let err = ConfigLayer::from_toml("prot = 1\n", Path::new("node.toml")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("node.toml"), "{msg}");
        assert!(msg.contains("unknown field `prot`"), "{msg}");
    }

    #[test]
    fn malformed_file_and_missing_file_are_errors() {
        let err = ConfigLayer::from_toml("port = [", Path::new("x.toml")).unwrap_err();
        assert!(matches!(err, ConfigError::ParseFile { .. }));
        let err = ConfigLayer::from_file(Path::new("/nonexistent/tessera.toml")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot read config file /nonexistent/tessera.toml")
        );
    }

    #[test]
    fn durations_longer_than_a_year_are_refused_naming_the_key() {
        let message = error(&[("stable_margin", "500000000000y")]);
        assert!(message.contains("stable_margin"), "{message}");
        assert!(message.contains("at most a year"), "{message}");
        assert!(from(&[("stable_margin", "365d")]).is_ok());
    }

    /// The caps on what a node holds: each read from the environment, and the rules between
    /// them enforced naming the key.
    #[test]
    fn memory_caps_are_read_and_checked_against_each_other() {
        let config = from(&[
            ("node_active_entity_limit", "0"),
            ("ddata_max_keys", "10"),
            ("ddata_max_value_bytes", "100"),
            ("ddata_max_total_bytes", "1000"),
            ("transport_max_inbound_handshakes", "8"),
            ("transport_handshake_timeout", "1s"),
            ("transport_max_pending_requests", "100"),
            ("transport_max_pending_requests_per_peer", "100"),
        ])
        .unwrap();
        assert_eq!(config.node_active_entity_limit(), None);
        assert_eq!(
            (config.ddata_max_keys, config.ddata_max_total_bytes),
            (10, 1000)
        );
        assert_eq!(config.transport_max_inbound_handshakes, 8);
        assert_eq!(config.transport_handshake_timeout, Duration::from_secs(1));
        let message = error(&[
            ("transport_max_pending_requests", "100"),
            ("transport_max_pending_requests_per_peer", "101"),
        ]);
        assert!(
            message.contains("transport_max_pending_requests_per_peer")
                && message.contains("at most transport_max_pending_requests = 100"),
            "{message}"
        );
        let message = error(&[
            ("ddata_max_value_bytes", "2000"),
            ("ddata_max_total_bytes", "1000"),
        ]);
        assert!(message.contains("ddata_max_value_bytes"), "{message}");
        let message = error(&[("ddata_max_keys", "0")]);
        assert!(message.contains("ddata_max_keys"), "{message}");
        let message = error(&[("transport_max_inbound_handshakes", "0")]);
        assert!(
            message.contains("transport_max_inbound_handshakes"),
            "{message}"
        );
    }

    #[test]
    fn durations_accept_humantime_forms() {
        let config = from(&[
            ("stable_after", "1m"),
            ("heartbeat_interval", "500ms"),
            ("acceptable_heartbeat_pause", "2s 500ms"),
            ("allow_weakly_up_after", "0s"),
        ])
        .unwrap();
        assert_eq!(config.stable_after, Duration::from_secs(60));
        assert_eq!(config.heartbeat_interval, Duration::from_millis(500));
        assert_eq!(
            config.acceptable_heartbeat_pause,
            Duration::from_millis(2500)
        );
        assert_eq!(config.allow_weakly_up_after, Duration::ZERO);
    }

    #[test]
    fn bad_duration_names_key_value_and_form() {
        assert_eq!(
            error(&[("stable_after", "abc")]),
            r#"invalid value "abc" for stable_after: expected a duration like 2s or 500ms"#
        );
        let err = ConfigLayer::from_toml("gossip_interval = 5", Path::new("f")).unwrap();
        assert_eq!(
            NodeConfig::from_layer(err).unwrap_err().to_string(),
            r#"invalid value "5" for gossip_interval: expected a duration like 2s or 500ms"#
        );
    }

    #[test]
    fn timer_intervals_must_be_positive() {
        assert_eq!(
            error(&[("gossip_interval", "0s")]),
            "gossip_interval = 0s: must be greater than zero"
        );
        assert!(from(&[("heartbeat_interval", "0ms")]).is_err());
    }

    #[test]
    fn the_journal_read_lease_is_at_most_what_replicas_grant() {
        assert_eq!(
            from(&[("journal_read_lease", "500ms")])
                .unwrap()
                .journal_read_lease,
            Duration::from_millis(500)
        );
        assert!(
            from(&[("journal_read_lease", "0s")])
                .unwrap()
                .journal_read_lease
                .is_zero()
        );
        assert_eq!(
            error(&[("journal_read_lease", "3s")]),
            "journal_read_lease = 3s: must be at most 2s"
        );
    }

    #[test]
    fn the_journal_write_quorum_must_be_a_majority_of_the_replication_factor() {
        let config = from(&[]).unwrap();
        assert_eq!(
            (
                config.journal_replication_factor,
                config.journal_write_quorum
            ),
            (3, 2)
        );
        assert_eq!(
            error(&[("journal_write_quorum", "1")]),
            "journal_write_quorum = 1 with journal_replication_factor = 3: the write quorum \
             must be more than half of the replication factor and at most it (W > N/2, W <= \
             N), so that a fenced writer can never be acknowledged"
        );
        assert!(from(&[("journal_write_quorum", "4")]).is_err());
        assert!(
            from(&[
                ("journal_replication_factor", "5"),
                ("journal_write_quorum", "3")
            ])
            .is_ok()
        );
        assert!(
            from(&[
                ("journal_replication_factor", "1"),
                ("journal_write_quorum", "1")
            ])
            .is_ok()
        );
        assert_eq!(
            error(&[("journal_replication_factor", "0")]),
            "journal_replication_factor = 0: must be between 1 and 7"
        );
    }

    #[test]
    fn monitored_by_must_be_between_1_and_100() {
        assert_eq!(
            error(&[("monitored_by", "0")]),
            "monitored_by = 0: must be between 1 and 100"
        );
        assert!(from(&[("monitored_by", "101")]).is_err());
        assert_eq!(
            error(&[("monitored_by", "five")]),
            r#"invalid value "five" for monitored_by: expected an integer"#
        );
        assert_eq!(from(&[("monitored_by", "100")]).unwrap().monitored_by, 100);
    }

    #[test]
    fn ports_must_fit_u16() {
        assert_eq!(
            error(&[("port", "70000")]),
            "port = 70000: must be between 0 and 65535"
        );
        assert_eq!(
            error(&[("http_port", "-1")]),
            "http_port = -1: must be between 0 and 65535"
        );
    }

    #[test]
    fn cluster_and_http_ports_must_differ_on_one_host() {
        let err = error(&[("port", "9000"), ("http_port", "9000")]);
        assert!(
            err.starts_with("http_port = 9000 is the same as port"),
            "{err}"
        );
        // Port 0 means "any free port" for both: no clash.
        assert!(from(&[("port", "0"), ("http_port", "0")]).is_ok());
    }

    #[test]
    fn static_quorum_needs_quorum_size() {
        assert_eq!(
            error(&[("downing_strategy", "static-quorum")])
                .split(" (")
                .next(),
            Some("static-quorum needs quorum_size >= 1")
        );
        assert_eq!(
            error(&[("downing_strategy", "static-quorum"), ("quorum_size", "0")]),
            "quorum_size = 0: must be between 1 and 10000"
        );
        let config = from(&[("downing_strategy", "static-quorum"), ("quorum_size", "3")]).unwrap();
        assert_eq!(
            config.downing_strategy,
            DowningStrategy::StaticQuorum { quorum_size: 3 }
        );
    }

    #[test]
    fn downing_strategy_names_are_checked() {
        assert_eq!(
            error(&[("downing_strategy", "auto-down")]),
            r#"invalid value "auto-down" for downing_strategy: expected keep-majority, static-quorum, keep-oldest or down-all"#
        );
        assert_eq!(
            from(&[("downing_strategy", "keep-oldest")])
                .unwrap()
                .downing_strategy,
            DowningStrategy::KeepOldest {
                down_if_alone: true
            }
        );
        assert_eq!(
            from(&[("downing_strategy", "down-all")])
                .unwrap()
                .downing_strategy,
            DowningStrategy::DownAll
        );
        assert_eq!(
            error(&[
                ("downing_strategy", "keep-oldest"),
                ("down_if_alone", "yes")
            ]),
            r#"invalid value "yes" for down_if_alone: expected true or false"#
        );
    }

    #[test]
    fn other_values_are_validated_with_key_and_expectation() {
        let cases: &[(&str, &str, &str)] = &[
            ("seed_nodes", "nohost", "seed_nodes"),
            ("roles", "a b", "roles"),
            (
                "failure_detector_threshold",
                "-1",
                "failure_detector_threshold = -1",
            ),
            (
                "failure_detector_threshold",
                "NaN",
                "failure_detector_threshold = NaN",
            ),
            (
                "max_frame_size",
                "10",
                "max_frame_size = 10: must be between 1024",
            ),
            ("log_format", "xml", r#"invalid value "xml" for log_format"#),
            (
                "log_level",
                "verbose",
                r#"invalid value "verbose" for log_level"#,
            ),
            ("cluster_secret", "", "cluster_secret"),
            ("host", "a b", r#"invalid value "a b" for host"#),
            ("app_version", "", "app_version"),
            ("data_dir", " ", "data_dir"),
            ("durable_keys", "a*b", "durable_keys"),
        ];
        for (key, value, expected) in cases {
            let err = error(&[(key, value)]);
            assert!(err.contains(expected), "{key}={value:?}: {err}");
        }
    }

    #[test]
    fn non_loopback_host_without_secret_is_refused() {
        for host in ["10.0.0.5", "0.0.0.0"] {
            // A token does not stand in for the cluster secret.
            let err = from(&[("host", host), ("http_token", "0123456789abcdef")]).unwrap_err();
            assert!(
                matches!(
                    &err,
                    ConfigError::NonLoopbackWithoutSecret { key: "host", .. }
                ),
                "{err}"
            );
            let msg = err.to_string();
            assert!(
                msg.starts_with(&format!("host = {host:?} is not a loopback")),
                "{msg}"
            );
            assert!(msg.contains("TESSERA_CLUSTER_SECRET"), "{msg}");
        }
    }

    #[test]
    fn non_loopback_http_host_without_token_is_refused() {
        let secret = ("cluster_secret", "a-long-enough-secret");
        for layer in [
            vec![("http_host", "node1.example")],
            // A cluster secret does not stand in for the token.
            vec![("http_host", "10.0.0.5"), secret],
            // http_host follows host.
            vec![("host", "0.0.0.0"), secret],
        ] {
            let err = from(&layer).unwrap_err();
            assert!(
                matches!(&err, ConfigError::NonLoopbackHttpWithoutToken { .. }),
                "{layer:?}: {err}"
            );
            let msg = err.to_string();
            assert!(msg.starts_with("http_host = "), "{msg}");
            assert!(msg.contains("is not a loopback address and no http_token"));
            for named in ["TESSERA_HTTP_TOKEN", "--http-token", "http_token_file"] {
                assert!(msg.contains(named), "{named} missing: {msg}");
            }
        }
        let config = from(&[
            ("http_host", "node1.example"),
            ("http_token", "0123456789abcdef"),
        ])
        .unwrap();
        assert_eq!(config.http_host, "node1.example");
        assert_eq!(config.http_token.unwrap().expose(), "0123456789abcdef");
    }

    #[test]
    fn non_loopback_host_with_secret_and_token_is_accepted_without_warning() {
        let config = from(&[
            ("host", "0.0.0.0"),
            ("cluster_secret", "a-long-enough-secret"),
            ("http_token", "a-long-enough-token"),
        ])
        .unwrap();
        assert_eq!(
            config.cluster_secret.as_ref().unwrap().expose(),
            "a-long-enough-secret"
        );
        assert!(config.warnings().is_empty(), "{:?}", config.warnings());
    }

    #[test]
    fn loopback_without_secret_is_accepted_with_a_warning() {
        for host in [
            "127.0.0.1",
            "127.1.2.3",
            "::1",
            "[::1]",
            "localhost",
            "LOCALHOST",
        ] {
            let config = from(&[("host", host)]).unwrap();
            let warnings = config.warnings();
            assert_eq!(warnings.len(), 1, "{host}: {warnings:?}");
            assert!(warnings[0].contains("no cluster_secret"), "{warnings:?}");
        }
    }

    #[test]
    fn short_secret_and_tight_heartbeat_pause_are_warned_about() {
        let config = from(&[
            ("cluster_secret", "short"),
            ("acceptable_heartbeat_pause", "100ms"),
        ])
        .unwrap();
        let warnings = config.warnings();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
    }

    #[test]
    fn secret_is_redacted_in_debug_output() {
        let pairs = [
            ("cluster_secret", "hunter2-hunter2-hunter2"),
            ("http_token", "swordfish-swordfish"),
        ];
        let debug = format!("{:?}", from(&pairs).unwrap());
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(!debug.contains("swordfish"), "{debug}");
        assert!(debug.contains("ClusterSecret(<redacted>)"), "{debug}");
        assert!(debug.contains("HttpToken(<redacted>)"), "{debug}");
        let debug = format!("{:?}", layer(&pairs));
        assert!(
            !debug.contains("hunter2") && !debug.contains("swordfish"),
            "{debug}"
        );
    }

    #[test]
    fn entity_keys_are_read_and_checked() {
        let config = from(&[
            ("snapshot_every", "0"),
            ("passivate_after", "0s"),
            ("entity_ask_timeout", "250ms"),
        ])
        .unwrap();
        assert_eq!(config.snapshot_every, 0, "0 turns snapshots off");
        assert_eq!(
            config.passivate_after,
            Duration::ZERO,
            "0 turns passivation off"
        );
        assert_eq!(config.entity_ask_timeout, Duration::from_millis(250));
        let file = ConfigLayer::from_toml(
            "snapshot_every = 500\npassivate_after = \"10m\"\n",
            Path::new("f"),
        )
        .unwrap();
        let config = NodeConfig::from_layer(file).unwrap();
        assert_eq!(config.snapshot_every, 500);
        assert_eq!(config.passivate_after, Duration::from_secs(600));
        assert_eq!(
            error(&[("snapshot_every", "2000000")]),
            "snapshot_every = 2000000: must be between 0 and 1000000"
        );
        assert_eq!(
            error(&[("snapshot_every", "often")]),
            r#"invalid value "often" for snapshot_every: expected an integer"#
        );
        assert_eq!(
            error(&[("entity_ask_timeout", "0s")]),
            "entity_ask_timeout = 0s: must be greater than zero"
        );
        assert_eq!(
            error(&[("passivate_after", "soon")]),
            r#"invalid value "soon" for passivate_after: expected a duration like 2s or 500ms"#
        );
    }

    #[test]
    fn sharding_keys_default_to_akkas_values() {
        let config = from(&[]).unwrap();
        assert_eq!(config.state_store_mode, StateStoreMode::Ddata);
        assert_eq!(config.remember_entities, RememberEntities::Off);
        assert_eq!(config.number_of_shards, 1000);
        assert_eq!(config.rebalance_interval, Duration::from_secs(10));
        assert_eq!(config.rebalance_absolute_limit, 20);
        assert_eq!(config.rebalance_relative_limit, 0.1);
        assert_eq!(config.handoff_timeout, Duration::from_secs(60));
        assert_eq!(config.active_entity_limit, 100_000);
        assert_eq!(config.active_entity_limit(), Some(100_000));
        assert_eq!(config.shard_buffer_size, 100_000);
    }

    #[test]
    fn sharding_keys_are_read_from_the_file_and_overridden_by_env_and_flags() {
        let file = toml_file(
            "state_store_mode = \"persistence\"\nremember_entities = \"ddata\"\n\
             number_of_shards = 300\nrebalance_interval = \"5s\"\n\
             rebalance_absolute_limit = 5\nrebalance_relative_limit = 0.5\n\
             handoff_timeout = \"30s\"\nactive_entity_limit = 0\nshard_buffer_size = 10\n",
        );
        let config = NodeConfig::load(ConfigLayer::default(), Some(file.path()), env(&[])).unwrap();
        assert_eq!(config.state_store_mode, StateStoreMode::Persistence);
        assert_eq!(config.remember_entities, RememberEntities::Ddata);
        assert_eq!(config.number_of_shards, 300);
        assert_eq!(config.rebalance_interval, Duration::from_secs(5));
        assert_eq!(config.rebalance_absolute_limit, 5);
        assert_eq!(config.rebalance_relative_limit, 0.5);
        assert_eq!(config.handoff_timeout, Duration::from_secs(30));
        assert_eq!(config.active_entity_limit, 0);
        assert_eq!(config.shard_buffer_size, 10);

        let envs = env(&[
            ("TESSERA_STATE_STORE_MODE", "ddata"),
            ("TESSERA_REMEMBER_ENTITIES", "eventsourced"),
            ("TESSERA_NUMBER_OF_SHARDS", "400"),
            ("TESSERA_REBALANCE_INTERVAL", "6s"),
            ("TESSERA_REBALANCE_ABSOLUTE_LIMIT", "6"),
            ("TESSERA_REBALANCE_RELATIVE_LIMIT", "0.6"),
            ("TESSERA_HANDOFF_TIMEOUT", "40s"),
            ("TESSERA_ACTIVE_ENTITY_LIMIT", "500"),
            ("TESSERA_SHARD_BUFFER_SIZE", "20"),
        ]);
        let config =
            NodeConfig::load(ConfigLayer::default(), Some(file.path()), envs.clone()).unwrap();
        assert_eq!(
            config.state_store_mode,
            StateStoreMode::Ddata,
            "env over file"
        );
        assert_eq!(config.remember_entities, RememberEntities::Eventsourced);
        assert_eq!(config.number_of_shards, 400);
        assert_eq!(config.rebalance_interval, Duration::from_secs(6));
        assert_eq!(config.rebalance_absolute_limit, 6);
        assert_eq!(config.rebalance_relative_limit, 0.6);
        assert_eq!(config.handoff_timeout, Duration::from_secs(40));
        assert_eq!(config.active_entity_limit, 500);
        assert_eq!(config.shard_buffer_size, 20);

        let flags = layer(&[
            ("state_store_mode", "persistence"),
            ("remember_entities", "off"),
            ("number_of_shards", "500"),
            ("rebalance_interval", "7s"),
            ("rebalance_absolute_limit", "7"),
            ("rebalance_relative_limit", "1"),
            ("handoff_timeout", "50s"),
            ("active_entity_limit", "0"),
            ("shard_buffer_size", "30"),
        ]);
        let config = NodeConfig::load(flags, Some(file.path()), envs).unwrap();
        assert_eq!(
            config.state_store_mode,
            StateStoreMode::Persistence,
            "flag over env"
        );
        assert_eq!(config.remember_entities, RememberEntities::Off);
        assert_eq!(config.number_of_shards, 500);
        assert_eq!(config.rebalance_interval, Duration::from_secs(7));
        assert_eq!(config.rebalance_absolute_limit, 7);
        assert_eq!(config.rebalance_relative_limit, 1.0);
        assert_eq!(config.handoff_timeout, Duration::from_secs(50));
        assert_eq!(config.active_entity_limit, 0);
        assert_eq!(config.shard_buffer_size, 30);
    }

    #[test]
    fn state_store_mode_and_remember_entities_names_are_checked() {
        assert_eq!(
            error(&[("state_store_mode", "memory")]),
            r#"invalid value "memory" for state_store_mode: expected ddata or persistence"#
        );
        assert_eq!(
            error(&[("remember_entities", "true")]),
            r#"invalid value "true" for remember_entities: expected off, ddata or eventsourced"#
        );
        let err = ConfigLayer::from_toml("remember_entities = true\n", Path::new("f"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("remember_entities"), "{err}");
        for mode in [StateStoreMode::Ddata, StateStoreMode::Persistence] {
            let config = from(&[("state_store_mode", mode.as_str())]).unwrap();
            assert_eq!(config.state_store_mode, mode);
        }
        for store in [
            RememberEntities::Off,
            RememberEntities::Ddata,
            RememberEntities::Eventsourced,
        ] {
            let config = from(&[("remember_entities", store.as_str())]).unwrap();
            assert_eq!(config.remember_entities, store);
        }
    }

    #[test]
    fn sharding_counts_name_the_key_the_value_and_the_range() {
        assert_eq!(
            error(&[("number_of_shards", "0")]),
            "number_of_shards = 0: must be between 1 and 100000"
        );
        assert_eq!(
            error(&[("number_of_shards", "100001")]),
            "number_of_shards = 100001: must be between 1 and 100000"
        );
        assert_eq!(
            from(&[("number_of_shards", "100000")])
                .unwrap()
                .number_of_shards,
            100_000
        );
        assert_eq!(
            error(&[("number_of_shards", "many")]),
            r#"invalid value "many" for number_of_shards: expected an integer"#
        );
        assert_eq!(
            error(&[("rebalance_absolute_limit", "0")]),
            "rebalance_absolute_limit = 0: must be between 1 and 100000"
        );
        assert_eq!(
            error(&[("shard_buffer_size", "0")]),
            "shard_buffer_size = 0: must be between 1 and 4294967295"
        );
        assert_eq!(
            error(&[("shard_buffer_size", "4294967296")]),
            "shard_buffer_size = 4294967296: must be between 1 and 4294967295"
        );
        assert_eq!(
            error(&[("active_entity_limit", "-1")]),
            "active_entity_limit = -1: must be between 0 and 18446744073709551615"
        );
    }

    #[test]
    fn rebalance_relative_limit_is_a_fraction_above_zero_and_at_most_one() {
        for bad in ["0", "-0.1", "1.5", "NaN", "inf"] {
            assert_eq!(
                error(&[("rebalance_relative_limit", bad)]),
                format!(
                    "rebalance_relative_limit = {bad}: must be a number greater than 0 and at \
                     most 1"
                )
            );
        }
        assert_eq!(
            error(&[("rebalance_relative_limit", "10%")]),
            r#"invalid value "10%" for rebalance_relative_limit: expected a number like 0.1"#
        );
        let file =
            ConfigLayer::from_toml("rebalance_relative_limit = 1\n", Path::new("f")).unwrap();
        assert_eq!(
            NodeConfig::from_layer(file)
                .unwrap()
                .rebalance_relative_limit,
            1.0
        );
    }

    #[test]
    fn sharding_timers_must_be_positive_durations() {
        assert_eq!(
            error(&[("rebalance_interval", "0s")]),
            "rebalance_interval = 0s: must be greater than zero"
        );
        assert_eq!(
            error(&[("handoff_timeout", "0ms")]),
            "handoff_timeout = 0ms: must be greater than zero"
        );
        assert_eq!(
            error(&[("handoff_timeout", "60")]),
            r#"invalid value "60" for handoff_timeout: expected a duration like 2s or 500ms"#
        );
        let config = from(&[("rebalance_interval", "500ms"), ("handoff_timeout", "2m")]).unwrap();
        assert_eq!(config.rebalance_interval, Duration::from_millis(500));
        assert_eq!(config.handoff_timeout, Duration::from_secs(120));
    }

    #[test]
    fn sharding_role_is_a_role_name() {
        assert_eq!(from(&[]).unwrap().sharding_role, None);
        assert_eq!(
            from(&[("sharding_role", "backend")]).unwrap().sharding_role,
            Some("backend".to_string())
        );
        assert_eq!(
            error(&[("sharding_role", "a b")]),
            "invalid value \"a b\" for sharding_role: expected a role name without spaces or \
             commas, like backend"
        );
    }

    #[test]
    fn active_entity_limit_zero_means_no_limit() {
        let config = from(&[("active_entity_limit", "0")]).unwrap();
        assert_eq!(config.active_entity_limit(), None);
        let config = from(&[("active_entity_limit", "64")]).unwrap();
        assert_eq!(config.active_entity_limit(), Some(64));
    }

    #[test]
    fn every_key_can_be_set_by_name() {
        for key in keys() {
            assert!(ConfigLayer::default().set(key, "1".into()), "{key}");
        }
        assert!(!ConfigLayer::default().set("nope", "1".into()));
    }

    #[test]
    fn bootstrap_keys_default_to_akka_managements_values() {
        let config = from(&[]).unwrap();
        assert!(config.contact_points.is_empty());
        assert_eq!(config.discovery_dns, None);
        assert_eq!(config.discovery_dns_server, None);
        assert_eq!(config.contact_point_port, None);
        assert_eq!(config.required_contact_points, 2);
        assert_eq!(config.stable_margin, Duration::from_secs(5));
        assert!(config.form_new_cluster);
        assert_eq!(config.bootstrap_probe_interval, Duration::from_secs(1));
        assert_eq!(config.shutdown_after_unsuccessful_join, None);
    }

    #[test]
    fn contact_points_are_host_port_lists_from_every_source() {
        let config = from(&[(
            "contact_points",
            "10.0.0.1:8558, node2.local:8559,[::1]:9000",
        )])
        .unwrap();
        assert_eq!(
            config.contact_points,
            vec![
                ContactPoint::new("10.0.0.1", 8558),
                ContactPoint::new("node2.local", 8559),
                ContactPoint::new("[::1]", 9000),
            ]
        );
        let shown: Vec<String> = config
            .contact_points
            .iter()
            .map(|p| p.to_string())
            .collect();
        assert_eq!(shown, ["10.0.0.1:8558", "node2.local:8559", "[::1]:9000"]);
        let file = toml_file("contact_points = [\"10.0.0.1:8558\", \"10.0.0.2:8558\"]\n");
        let config = NodeConfig::load(ConfigLayer::default(), Some(file.path()), env(&[])).unwrap();
        assert_eq!(config.contact_points.len(), 2);
        let envs = env(&[("TESSERA_CONTACT_POINTS", "10.0.0.3:8558")]);
        let config = NodeConfig::load(ConfigLayer::default(), Some(file.path()), envs).unwrap();
        assert_eq!(
            config.contact_points,
            vec!["10.0.0.3:8558".parse().unwrap()]
        );
    }

    #[test]
    fn bad_contact_points_name_the_key() {
        for bad in [
            "10.0.0.1",
            "10.0.0.1:http",
            "a b:8558",
            ":8558",
            "10.0.0.1:0",
        ] {
            let err = from(&[("contact_points", bad)]).unwrap_err();
            assert!(
                matches!(
                    &err,
                    ConfigError::InvalidValue {
                        key: "contact_points",
                        ..
                    }
                ),
                "{bad}: {err}"
            );
            assert!(
                err.to_string()
                    .contains("expected host:port of a node's HTTP API"),
                "{err}"
            );
        }
        assert!("10.0.0.1:0".parse::<ContactPoint>().is_err());
        let err = ConfigLayer::from_toml("contact_points = 5\n", Path::new("f"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("contact_points"), "{err}");
    }

    #[test]
    fn discovery_dns_takes_a_dns_or_srv_name() {
        for name in [
            "tessera.default.svc.cluster.local",
            "_http._tcp.tessera.local",
            "tessera",
            "tessera.local.",
        ] {
            let config = from(&[("discovery_dns", name)]).unwrap();
            assert_eq!(config.discovery_dns.as_deref(), Some(name));
        }
        let long_label = "a".repeat(64);
        for bad in [
            "a b.local",
            "a..b",
            ".local",
            "tessera/x",
            long_label.as_str(),
        ] {
            let err = error(&[("discovery_dns", bad)]);
            assert!(
                err.starts_with(&format!(
                    "invalid value {bad:?} for discovery_dns: expected a DNS name"
                )),
                "{err}"
            );
        }
        assert_eq!(from(&[("discovery_dns", "")]).unwrap().discovery_dns, None);
    }

    #[test]
    fn dns_server_and_contact_point_port_apply_only_with_discovery_dns() {
        let config = from(&[
            ("discovery_dns", "tessera.local"),
            ("discovery_dns_server", "127.0.0.1:5353"),
            ("contact_point_port", "8600"),
        ])
        .unwrap();
        assert_eq!(
            config.discovery_dns_server,
            Some("127.0.0.1:5353".parse().unwrap())
        );
        assert_eq!(config.contact_point_port, Some(8600));
        let dns = ("discovery_dns", "tessera.local");
        assert_eq!(
            from(&[dns, ("discovery_dns_server", "[::1]:53")])
                .unwrap()
                .discovery_dns_server,
            Some("[::1]:53".parse().unwrap())
        );
        assert_eq!(
            error(&[dns, ("discovery_dns_server", "dns.local:53")]),
            "invalid value \"dns.local:53\" for discovery_dns_server: expected the IP address \
             and port of a DNS server, like 127.0.0.1:53"
        );
        assert_eq!(
            error(&[dns, ("contact_point_port", "0")]),
            "contact_point_port = 0: must be between 1 and 65535"
        );
        assert_eq!(
            error(&[dns, ("contact_point_port", "http")]),
            r#"invalid value "http" for contact_point_port: expected an integer"#
        );
        for (key, value) in [
            ("discovery_dns_server", "127.0.0.1:53"),
            ("contact_point_port", "8558"),
        ] {
            let err = from(&[(key, value)]).unwrap_err();
            assert!(
                matches!(&err, ConfigError::Without { key: k, needs: "discovery_dns", .. } if *k == key),
                "{err}"
            );
            assert_eq!(
                err.to_string(),
                format!(
                    "{key} is set without discovery_dns: it only applies to contact points \
                     found through DNS; set discovery_dns or remove {key}"
                )
            );
        }
    }

    #[test]
    fn seed_nodes_and_bootstrap_are_two_ways_to_form_a_cluster() {
        let seeds = ("seed_nodes", "127.0.0.1:25520");
        let listed = ("contact_points", "127.0.0.1:8558");
        let dns = ("discovery_dns", "tessera.local");
        for (pairs, second) in [
            ([seeds, listed], "contact_points"),
            ([seeds, dns], "discovery_dns"),
        ] {
            let err = from(&pairs).unwrap_err();
            assert!(
                matches!(&err, ConfigError::Exclusive { first: "seed_nodes", second: s, .. } if *s == second),
                "{err}"
            );
            let msg = err.to_string();
            assert!(
                msg.starts_with(&format!(
                    "seed_nodes and {second} are both set: they are two ways to form a cluster"
                )),
                "{msg}"
            );
            assert!(msg.ends_with("; pick one"), "{msg}");
        }
        let err = from(&[listed, dns]).unwrap_err();
        assert!(
            matches!(
                &err,
                ConfigError::Exclusive {
                    first: "contact_points",
                    second: "discovery_dns",
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains("two sources of contact points"),
            "{err}"
        );
        // An empty list from a higher layer clears the file's seeds.
        let file = toml_file("seed_nodes = [\"127.0.0.1:25520\"]\n");
        let envs = env(&[
            ("TESSERA_SEED_NODES", ""),
            ("TESSERA_CONTACT_POINTS", "127.0.0.1:8558"),
        ]);
        let config = NodeConfig::load(ConfigLayer::default(), Some(file.path()), envs).unwrap();
        assert!(config.seed_nodes.is_empty());
        assert_eq!(config.contact_points.len(), 1);
    }

    #[test]
    fn bootstrap_numbers_and_timers_are_checked() {
        let config = from(&[
            ("required_contact_points", "5"),
            ("stable_margin", "10s"),
            ("form_new_cluster", "false"),
            ("bootstrap_probe_interval", "500ms"),
            ("shutdown_after_unsuccessful_join", "5m"),
        ])
        .unwrap();
        assert_eq!(config.required_contact_points, 5);
        assert_eq!(config.stable_margin, Duration::from_secs(10));
        assert!(!config.form_new_cluster);
        assert_eq!(config.bootstrap_probe_interval, Duration::from_millis(500));
        assert_eq!(
            config.shutdown_after_unsuccessful_join,
            Some(Duration::from_secs(300))
        );
        for (key, value, expected) in [
            (
                "required_contact_points",
                "0",
                "required_contact_points = 0: must be between 1 and 1000",
            ),
            (
                "required_contact_points",
                "1001",
                "required_contact_points = 1001: must be between 1 and 1000",
            ),
            (
                "stable_margin",
                "0s",
                "stable_margin = 0s: must be greater than zero",
            ),
            (
                "stable_margin",
                "5",
                r#"invalid value "5" for stable_margin: expected a duration like 2s or 500ms"#,
            ),
            (
                "form_new_cluster",
                "yes",
                r#"invalid value "yes" for form_new_cluster: expected true or false"#,
            ),
            (
                "bootstrap_probe_interval",
                "0ms",
                "bootstrap_probe_interval = 0ms: must be greater than zero",
            ),
            (
                "shutdown_after_unsuccessful_join",
                "never",
                "invalid value \"never\" for shutdown_after_unsuccessful_join: expected a \
                 duration like 2s or 500ms, or off",
            ),
        ] {
            assert_eq!(error(&[(key, value)]), expected);
        }
        for off in ["off", "0s", " off "] {
            let config = from(&[("shutdown_after_unsuccessful_join", off)]).unwrap();
            assert_eq!(config.shutdown_after_unsuccessful_join, None, "{off:?}");
        }
        let file = ConfigLayer::from_toml(
            "required_contact_points = 3\nform_new_cluster = false\n\
             shutdown_after_unsuccessful_join = \"30s\"\n",
            Path::new("f"),
        )
        .unwrap();
        let config = NodeConfig::from_layer(file).unwrap();
        assert_eq!(config.required_contact_points, 3);
        assert!(!config.form_new_cluster);
        assert_eq!(
            config.shutdown_after_unsuccessful_join,
            Some(Duration::from_secs(30))
        );
    }

    #[test]
    fn http_limits_default_and_are_checked() {
        let config = from(&[]).unwrap();
        assert_eq!(config.http_token, None);
        assert_eq!(config.http_header_timeout, Duration::from_secs(10));
        assert_eq!(config.http_request_timeout, Duration::from_secs(30));
        assert_eq!(config.http_max_concurrent_requests, 4096);
        assert_eq!(config.http_max_connections, 4096);
        let config = from(&[
            ("http_header_timeout", "2s"),
            ("http_request_timeout", "1m"),
            ("http_max_concurrent_requests", "1"),
            ("http_max_connections", "100000"),
        ])
        .unwrap();
        assert_eq!(config.http_header_timeout, Duration::from_secs(2));
        assert_eq!(config.http_request_timeout, Duration::from_secs(60));
        assert_eq!(config.http_max_concurrent_requests, 1);
        assert_eq!(config.http_max_connections, 100_000);
        for (key, value, expected) in [
            (
                "http_header_timeout",
                "0s",
                "http_header_timeout = 0s: must be greater than zero",
            ),
            (
                "http_request_timeout",
                "soon",
                r#"invalid value "soon" for http_request_timeout: expected a duration like 2s or 500ms"#,
            ),
            (
                "http_max_concurrent_requests",
                "0",
                "http_max_concurrent_requests = 0: must be between 1 and 100000",
            ),
            (
                "http_max_connections",
                "100001",
                "http_max_connections = 100001: must be between 1 and 100000",
            ),
            (
                "http_max_connections",
                "many",
                r#"invalid value "many" for http_max_connections: expected an integer"#,
            ),
        ] {
            assert_eq!(error(&[(key, value)]), expected);
        }
    }

    #[test]
    fn http_token_is_checked_without_being_shown() {
        for bad in ["", "two words", "line\nbreak"] {
            let err = from(&[("http_token", bad)]).unwrap_err();
            assert!(
                matches!(
                    &err,
                    ConfigError::InvalidValue {
                        key: "http_token",
                        ..
                    }
                ),
                "{err}"
            );
            assert_eq!(
                err.to_string(),
                "invalid value \"<redacted>\" for http_token: expected a non-empty string \
                 without whitespace or control characters"
            );
        }
        let config = from(&[("http_token", "short")]).unwrap();
        assert_eq!(config.http_token, Some(HttpToken::new("short")));
        let warnings = config.warnings();
        assert!(
            warnings
                .iter()
                .any(|w| w.starts_with("http_token is 5 characters long")),
            "{warnings:?}"
        );
        let config = NodeConfig::load(
            ConfigLayer::default(),
            None,
            env(&[("TESSERA_HTTP_TOKEN", "from-the-environment")]),
        )
        .unwrap();
        assert_eq!(config.http_token.unwrap().expose(), "from-the-environment");
    }

    #[test]
    fn http_token_file_is_read_and_trimmed() {
        let file = toml_file("  s3cret-token-from-a-file\n\n");
        let path = file.path().to_str().unwrap();
        let config = from(&[("http_token_file", path)]).unwrap();
        assert_eq!(
            config.http_token.as_ref().map(HttpToken::expose),
            Some("s3cret-token-from-a-file")
        );
        let config = NodeConfig::load(
            ConfigLayer::default(),
            None,
            env(&[("TESSERA_HTTP_TOKEN_FILE", path)]),
        )
        .unwrap();
        assert_eq!(
            config.http_token.unwrap().expose(),
            "s3cret-token-from-a-file"
        );
        // A token from a file allows a non-loopback HTTP host.
        assert!(from(&[("http_token_file", path), ("http_host", "10.0.0.5")]).is_ok());
    }

    #[test]
    fn unreadable_or_empty_token_file_is_refused_naming_key_and_path() {
        let err = from(&[("http_token_file", "/nonexistent/token")]).unwrap_err();
        assert!(matches!(&err, ConfigError::ReadTokenFile { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("cannot read http_token_file /nonexistent/token: "),
            "{err}"
        );
        let empty = toml_file(" \n");
        let path = empty.path().to_str().unwrap();
        let err = error(&[("http_token_file", path)]);
        assert_eq!(
            err,
            format!("http_token_file {path}: the file is empty: it must hold the HTTP API token")
        );
        let spaced = toml_file("two words\n");
        let path = spaced.path().to_str().unwrap();
        let err = error(&[("http_token_file", path)]);
        assert!(err.starts_with(&format!(
            "http_token_file {path}: the token holds whitespace"
        )));
        assert!(!err.contains("two words"), "{err}");
        assert_eq!(
            error(&[("http_token_file", "")]),
            r#"invalid value "" for http_token_file: expected a file path"#
        );
    }

    #[test]
    fn http_token_and_token_file_exclude_each_other() {
        let file = toml_file("token-in-a-file\n");
        let err = from(&[
            ("http_token", "token-given-directly"),
            ("http_token_file", file.path().to_str().unwrap()),
        ])
        .unwrap_err();
        assert!(
            matches!(
                &err,
                ConfigError::Exclusive {
                    first: "http_token",
                    second: "http_token_file",
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "http_token and http_token_file are both set: they are two ways to give the same \
             token; pick one"
        );
    }

    #[test]
    fn entity_sections_come_from_the_file_the_environment_and_win_in_that_order() {
        let file = ConfigLayer::from_toml(
            "passivate_after = \"2m\"\n[entity.shop-cart]\npassivate_after = \"30s\"\n\
             number_of_shards = 64\n",
            Path::new("node.toml"),
        )
        .unwrap();
        let env = ConfigLayer::from_env(vec![
            (
                OsString::from("TESSERA_ENTITY_SHOP_CART_NUMBER_OF_SHARDS"),
                OsString::from("32"),
            ),
            // A node-wide key whose name starts like an entity type's variable.
            (
                OsString::from("TESSERA_ENTITY_ASK_TIMEOUT"),
                OsString::from("3s"),
            ),
        ])
        .unwrap();
        let config = NodeConfig::from_layer(file.overridden_by(env)).unwrap();
        assert_eq!(config.entity_ask_timeout, Duration::from_secs(3));
        assert_eq!(config.passivate_after, Duration::from_secs(120));
        let cart = config.entity_section("shop.cart");
        assert_eq!(cart.passivate_after, Some(Duration::from_secs(30)));
        assert_eq!(cart.number_of_shards, Some(32));
        assert_eq!(config.entity_section("stock"), EntitySettings::default());
        config
            .check_entity_sections(["shop-cart", "stock"])
            .unwrap();
        assert_eq!(
            config
                .check_entity_sections(["cart"])
                .unwrap_err()
                .to_string(),
            "the configuration has a section for entity type shop_cart, but this node \
             registers cart"
        );
    }

    #[test]
    fn a_bad_entity_section_names_its_type_and_key() {
        let bad = ConfigLayer::from_toml(
            "[entity.cart]\nnumber_of_shards = 0\n",
            Path::new("node.toml"),
        )
        .unwrap();
        let error = NodeConfig::from_layer(bad).unwrap_err().to_string();
        assert!(error.starts_with("entity type cart: "), "{error}");
        assert!(error.contains("number_of_shards"), "{error}");
        let node_key =
            ConfigLayer::from_toml("[entity.cart]\nhost = \"x\"\n", Path::new("n.toml")).unwrap();
        let error = NodeConfig::from_layer(node_key).unwrap_err().to_string();
        assert!(
            error.contains("host cannot be set for one entity type"),
            "{error}"
        );
        let twice = ConfigLayer::from_toml(
            "[entity.Cart]\nsnapshot_every = 1\n[entity.cart]\nsnapshot_every = 2\n",
            Path::new("n.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(twice.contains("are one type's section"), "{twice}");
        assert!(
            ConfigLayer::from_env(vec![(
                OsString::from("TESSERA_ENTITY_CART_PASIVATE_AFTER"),
                OsString::from("1s")
            )])
            .is_err(),
            "a misspelt per-type key is refused"
        );
    }
}
