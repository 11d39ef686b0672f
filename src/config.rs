//! Node configuration: defaults, a TOML file, `TESSERA_*` environment variables and flags.
//!
//! Each source is read into a [`ConfigLayer`] (every key optional, values not yet checked).
//! Layers are stacked — flag over environment over file over default — and the result is
//! checked once, in [`NodeConfig::from_layer`], so that a bad value gets the same message
//! whichever source it came from: the key, the value, and what is allowed.

use crate::logging::{self, LogFormat};
use serde::Deserialize;
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tessera_cluster::Address;

/// Every configuration key, as written in the TOML file; the environment variable is
/// `TESSERA_` followed by the key in upper case, the flag is the key with `-` for `_`
/// (except `seed_nodes`, whose flag is the repeatable `--seed`).
pub const KEYS: [&str; 40] = [
    "host",
    "port",
    "http_host",
    "http_port",
    "seed_nodes",
    "data_dir",
    "roles",
    "cluster_secret",
    "stable_after",
    "heartbeat_interval",
    "gossip_interval",
    "seed_node_timeout",
    "allow_weakly_up_after",
    "monitored_by",
    "failure_detector_threshold",
    "acceptable_heartbeat_pause",
    "min_std_deviation",
    "downing_strategy",
    "quorum_size",
    "down_if_alone",
    "max_frame_size",
    "app_version",
    "log_format",
    "log_level",
    "durable_keys",
    "snapshot_every",
    "passivate_after",
    "entity_ask_timeout",
    "journal_replication_factor",
    "journal_write_quorum",
    "state_store_mode",
    "remember_entities",
    "number_of_shards",
    "rebalance_interval",
    "rebalance_absolute_limit",
    "rebalance_relative_limit",
    "handoff_timeout",
    "active_entity_limit",
    "shard_buffer_size",
    "sharding_role",
];

/// Environment variable naming the config file when `--config` is not given.
pub const CONFIG_FILE_ENV: &str = "TESSERA_CONFIG";

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
    /// Seed nodes to join through; empty means join manually over HTTP.
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
    /// Only members with this role host sharded entities and run their coordinators; the
    /// others route to them (proxy-only). None: every member hosts.
    pub sharding_role: Option<String>,
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
            sharding_role: None,
        }
    }
}

/// The cluster secret. Its `Debug` output is redacted so that printing a config or logging an
/// error never leaks it.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret(String);

impl ClusterSecret {
    /// Wraps a secret (checked for emptiness by the config loader, not here).
    pub fn new(secret: impl Into<String>) -> Self {
        Self(secret.into())
    }

    /// The secret itself, for keying the handshake MAC.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterSecret(<redacted>)")
    }
}

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
        /// `host` or `http_host`.
        key: &'static str,
        /// The non-loopback host.
        host: String,
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
    /// A `TESSERA_*` variable that is not valid Unicode.
    #[error("environment variable {name} is not valid UTF-8")]
    NonUnicodeEnv {
        /// The variable.
        name: String,
    },
}

/// A single value as a source wrote it: the file has typed TOML values, flags and environment
/// variables only have text. Parsing to the key's type happens in one place for all sources.
#[derive(Clone, Debug, PartialEq, Deserialize)]
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

/// One source of configuration: every key optional, values not yet validated. The TOML file
/// deserialises into it directly, refusing unknown keys.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)] // the fields are the keys documented on `NodeConfig`
pub struct ConfigLayer {
    pub host: Option<String>,
    pub port: Option<Scalar>,
    pub http_host: Option<String>,
    pub http_port: Option<Scalar>,
    pub seed_nodes: Option<Vec<String>>,
    pub data_dir: Option<String>,
    pub roles: Option<Vec<String>>,
    pub cluster_secret: Option<String>,
    pub stable_after: Option<Scalar>,
    pub heartbeat_interval: Option<Scalar>,
    pub gossip_interval: Option<Scalar>,
    pub seed_node_timeout: Option<Scalar>,
    pub allow_weakly_up_after: Option<Scalar>,
    pub monitored_by: Option<Scalar>,
    pub failure_detector_threshold: Option<Scalar>,
    pub acceptable_heartbeat_pause: Option<Scalar>,
    pub min_std_deviation: Option<Scalar>,
    pub downing_strategy: Option<String>,
    pub quorum_size: Option<Scalar>,
    pub down_if_alone: Option<Scalar>,
    pub max_frame_size: Option<Scalar>,
    pub app_version: Option<String>,
    pub log_format: Option<String>,
    pub log_level: Option<String>,
    pub durable_keys: Option<Vec<String>>,
    pub snapshot_every: Option<Scalar>,
    pub passivate_after: Option<Scalar>,
    pub entity_ask_timeout: Option<Scalar>,
    pub journal_replication_factor: Option<Scalar>,
    pub journal_write_quorum: Option<Scalar>,
    pub state_store_mode: Option<String>,
    pub remember_entities: Option<String>,
    pub number_of_shards: Option<Scalar>,
    pub rebalance_interval: Option<Scalar>,
    pub rebalance_absolute_limit: Option<Scalar>,
    pub rebalance_relative_limit: Option<Scalar>,
    pub handoff_timeout: Option<Scalar>,
    pub active_entity_limit: Option<Scalar>,
    pub shard_buffer_size: Option<Scalar>,
    pub sharding_role: Option<String>,
}

impl ConfigLayer {
    /// Parses a TOML config file's text. Unknown keys are an error.
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::ParseFile {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })
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
    /// Other variables are ignored. Takes the environment as an argument so tests need not
    /// touch the process environment.
    pub fn from_env<I>(vars: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (OsString, OsString)>,
    {
        let mut layer = ConfigLayer::default();
        for (name, value) in vars {
            let Some(key) = name.to_str().and_then(key_of_env_var) else {
                continue;
            };
            let value = value
                .into_string()
                .map_err(|_| ConfigError::NonUnicodeEnv {
                    name: format!("TESSERA_{}", key.to_ascii_uppercase()),
                })?;
            layer.set(key, value);
        }
        Ok(layer)
    }

    /// Sets `key` from its text form (lists comma-separated). Returns false for an unknown key.
    pub fn set(&mut self, key: &str, value: String) -> bool {
        let text = || Some(value.clone());
        let scalar = || Some(Scalar::Text(value.clone()));
        match key {
            "host" => self.host = text(),
            "port" => self.port = scalar(),
            "http_host" => self.http_host = text(),
            "http_port" => self.http_port = scalar(),
            "seed_nodes" => self.seed_nodes = Some(split_list(&value)),
            "data_dir" => self.data_dir = text(),
            "roles" => self.roles = Some(split_list(&value)),
            "cluster_secret" => self.cluster_secret = text(),
            "stable_after" => self.stable_after = scalar(),
            "heartbeat_interval" => self.heartbeat_interval = scalar(),
            "gossip_interval" => self.gossip_interval = scalar(),
            "seed_node_timeout" => self.seed_node_timeout = scalar(),
            "allow_weakly_up_after" => self.allow_weakly_up_after = scalar(),
            "monitored_by" => self.monitored_by = scalar(),
            "failure_detector_threshold" => self.failure_detector_threshold = scalar(),
            "acceptable_heartbeat_pause" => self.acceptable_heartbeat_pause = scalar(),
            "min_std_deviation" => self.min_std_deviation = scalar(),
            "downing_strategy" => self.downing_strategy = text(),
            "quorum_size" => self.quorum_size = scalar(),
            "down_if_alone" => self.down_if_alone = scalar(),
            "max_frame_size" => self.max_frame_size = scalar(),
            "app_version" => self.app_version = text(),
            "log_format" => self.log_format = text(),
            "log_level" => self.log_level = text(),
            "durable_keys" => self.durable_keys = Some(split_list(&value)),
            "snapshot_every" => self.snapshot_every = scalar(),
            "passivate_after" => self.passivate_after = scalar(),
            "entity_ask_timeout" => self.entity_ask_timeout = scalar(),
            "journal_replication_factor" => self.journal_replication_factor = scalar(),
            "journal_write_quorum" => self.journal_write_quorum = scalar(),
            "state_store_mode" => self.state_store_mode = text(),
            "remember_entities" => self.remember_entities = text(),
            "number_of_shards" => self.number_of_shards = scalar(),
            "rebalance_interval" => self.rebalance_interval = scalar(),
            "rebalance_absolute_limit" => self.rebalance_absolute_limit = scalar(),
            "rebalance_relative_limit" => self.rebalance_relative_limit = scalar(),
            "handoff_timeout" => self.handoff_timeout = scalar(),
            "active_entity_limit" => self.active_entity_limit = scalar(),
            "shard_buffer_size" => self.shard_buffer_size = scalar(),
            "sharding_role" => self.sharding_role = text(),
            _ => return false,
        }
        true
    }

    /// Stacks `over` on top of `self`: every key `over` sets wins (lists are replaced, not
    /// appended, so `--seed` on the command line replaces the file's seed nodes).
    pub fn overridden_by(self, over: ConfigLayer) -> ConfigLayer {
        ConfigLayer {
            host: over.host.or(self.host),
            port: over.port.or(self.port),
            http_host: over.http_host.or(self.http_host),
            http_port: over.http_port.or(self.http_port),
            seed_nodes: over.seed_nodes.or(self.seed_nodes),
            data_dir: over.data_dir.or(self.data_dir),
            roles: over.roles.or(self.roles),
            cluster_secret: over.cluster_secret.or(self.cluster_secret),
            stable_after: over.stable_after.or(self.stable_after),
            heartbeat_interval: over.heartbeat_interval.or(self.heartbeat_interval),
            gossip_interval: over.gossip_interval.or(self.gossip_interval),
            seed_node_timeout: over.seed_node_timeout.or(self.seed_node_timeout),
            allow_weakly_up_after: over.allow_weakly_up_after.or(self.allow_weakly_up_after),
            monitored_by: over.monitored_by.or(self.monitored_by),
            failure_detector_threshold: over
                .failure_detector_threshold
                .or(self.failure_detector_threshold),
            acceptable_heartbeat_pause: over
                .acceptable_heartbeat_pause
                .or(self.acceptable_heartbeat_pause),
            min_std_deviation: over.min_std_deviation.or(self.min_std_deviation),
            downing_strategy: over.downing_strategy.or(self.downing_strategy),
            quorum_size: over.quorum_size.or(self.quorum_size),
            down_if_alone: over.down_if_alone.or(self.down_if_alone),
            max_frame_size: over.max_frame_size.or(self.max_frame_size),
            app_version: over.app_version.or(self.app_version),
            log_format: over.log_format.or(self.log_format),
            log_level: over.log_level.or(self.log_level),
            durable_keys: over.durable_keys.or(self.durable_keys),
            snapshot_every: over.snapshot_every.or(self.snapshot_every),
            passivate_after: over.passivate_after.or(self.passivate_after),
            entity_ask_timeout: over.entity_ask_timeout.or(self.entity_ask_timeout),
            journal_replication_factor: over
                .journal_replication_factor
                .or(self.journal_replication_factor),
            journal_write_quorum: over.journal_write_quorum.or(self.journal_write_quorum),
            state_store_mode: over.state_store_mode.or(self.state_store_mode),
            remember_entities: over.remember_entities.or(self.remember_entities),
            number_of_shards: over.number_of_shards.or(self.number_of_shards),
            rebalance_interval: over.rebalance_interval.or(self.rebalance_interval),
            rebalance_absolute_limit: over
                .rebalance_absolute_limit
                .or(self.rebalance_absolute_limit),
            rebalance_relative_limit: over
                .rebalance_relative_limit
                .or(self.rebalance_relative_limit),
            handoff_timeout: over.handoff_timeout.or(self.handoff_timeout),
            active_entity_limit: over.active_entity_limit.or(self.active_entity_limit),
            shard_buffer_size: over.shard_buffer_size.or(self.shard_buffer_size),
            sharding_role: over.sharding_role.or(self.sharding_role),
        }
    }
}

/// `TESSERA_STABLE_AFTER` → `stable_after`; `None` for anything that is not a config key.
fn key_of_env_var(name: &str) -> Option<&'static str> {
    let rest = name.strip_prefix("TESSERA_")?;
    KEYS.iter()
        .copied()
        .find(|key| key.eq_ignore_ascii_case(rest) && rest.bytes().all(|b| !b.is_ascii_lowercase()))
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
        let file = match config_file.map(Path::to_path_buf).or(env_file) {
            Some(path) => ConfigLayer::from_file(&path)?,
            None => ConfigLayer::default(),
        };
        let env = ConfigLayer::from_env(env)?;
        Self::from_layer(file.overridden_by(env).overridden_by(flags))
    }

    /// Validates a (merged) layer, filling unset keys with the defaults. `quorum_size` and
    /// `down_if_alone` are read only for the strategy they belong to, so switching
    /// `downing_strategy` with a flag does not trip over the other strategy's settings.
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
            Some(s) if s.is_empty() => {
                return Err(invalid("cluster_secret", "", "a non-empty string"));
            }
            Some(s) => Some(ClusterSecret(s)),
            None => None,
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
        let config = NodeConfig {
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
            host,
            http_host,
            cluster_secret,
            downing_strategy,
        };
        config.check_rules()?;
        Ok(config)
    }

    /// Rules that involve more than one key.
    fn check_rules(&self) -> Result<(), ConfigError> {
        let (n, w) = (self.journal_replication_factor, self.journal_write_quorum);
        if w * 2 <= n || w > n {
            return Err(ConfigError::WriteQuorum {
                write_quorum: w,
                replication_factor: n,
            });
        }
        if self.cluster_secret.is_none() {
            for (key, host) in [("host", &self.host), ("http_host", &self.http_host)] {
                if !is_loopback(host) {
                    return Err(ConfigError::NonLoopbackWithoutSecret {
                        key,
                        host: host.clone(),
                    });
                }
            }
        }
        if self.port == self.http_port && self.port != 0 && self.host == self.http_host {
            return Err(ConfigError::PortClash {
                port: self.port,
                host: self.host.clone(),
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

    /// `active_entity_limit` as the entities host takes it: `None` for 0 (no limit).
    pub fn active_entity_limit(&self) -> Option<usize> {
        (self.active_entity_limit != 0)
            .then(|| usize::try_from(self.active_entity_limit).unwrap_or(usize::MAX))
    }
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

fn parse_duration(key: &'static str, value: &Scalar) -> Result<Duration, ConfigError> {
    let expected = "a duration like 2s or 500ms";
    match value {
        Scalar::Text(text) => {
            humantime::parse_duration(text.trim()).map_err(|_| invalid(key, text, expected))
        }
        other => Err(invalid(key, &other.to_string(), expected)),
    }
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
    fn env_ignores_other_variables_and_lower_case_names() {
        let layer = ConfigLayer::from_env(env(&[
            ("TESSERA_port", "1"),
            ("PORT", "2"),
            ("TESSERA_UNKNOWN", "3"),
        ]))
        .unwrap();
        assert_eq!(layer, ConfigLayer::default());
    }

    #[test]
    fn http_host_follows_host_unless_set() {
        let secret = ("cluster_secret", "0123456789abcdef");
        let config = from(&[("host", "10.0.0.5"), secret]).unwrap();
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
        for (key, host) in [
            ("host", "10.0.0.5"),
            ("host", "0.0.0.0"),
            ("http_host", "node1.example"),
        ] {
            let err = from(&[(key, host)]).unwrap_err();
            assert!(
                matches!(&err, ConfigError::NonLoopbackWithoutSecret { key: k, .. } if *k == key),
                "{err}"
            );
            let msg = err.to_string();
            assert!(
                msg.starts_with(&format!("{key} = {host:?} is not a loopback")),
                "{msg}"
            );
            assert!(msg.contains("TESSERA_CLUSTER_SECRET"), "{msg}");
        }
    }

    #[test]
    fn non_loopback_host_with_secret_is_accepted_without_warning() {
        let config = from(&[
            ("host", "0.0.0.0"),
            ("cluster_secret", "a-long-enough-secret"),
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
        let config = from(&[("cluster_secret", "hunter2-hunter2-hunter2")]).unwrap();
        let debug = format!("{config:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(debug.contains("<redacted>"));
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
        for key in KEYS {
            assert!(ConfigLayer::default().set(key, "1".into()), "{key}");
        }
        assert!(!ConfigLayer::default().set("nope", "1".into()));
    }
}
