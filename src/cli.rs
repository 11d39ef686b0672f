//! Command-line definitions (clap derive) and the step from `tessera node` flags to a validated
//! [`NodeConfig`].
//!
//! Node flags are all optional strings without clap defaults: a clap default would be
//! indistinguishable from a flag the user typed and would beat the config file. The defaults
//! live in [`NodeConfig::default`], and each flag's help states it and its environment variable
//! (a test keeps the two in step). Environment variables are read by
//! [`ConfigLayer::from_env`], not by clap, so that the precedence flag > env > file > default is
//! decided in one place and can be tested without touching the process environment.

use crate::config::{ConfigError, ConfigLayer, NodeConfig};
use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;

/// `tessera`: run a cluster node, the demo, or the benchmarks.
#[derive(Debug, Parser)]
#[command(name = "tessera", version, about, propagate_version = true)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a cluster node until SIGINT/SIGTERM, then leave the cluster gracefully.
    #[command(after_help = NODE_AFTER_HELP)]
    Node(Box<NodeArgs>),
    /// Start a small local cluster and show it working.
    Demo(DemoArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Cluster sharding maintenance.
    #[command(subcommand)]
    Sharding(ShardingCommand),
}

const NODE_AFTER_HELP: &str = "Every flag has a config-file key (the flag name with '_' for \
'-', seed_nodes for --seed) and a TESSERA_<KEY> environment variable; lists in the environment \
are comma-separated. Precedence: flag > environment > config file > default.";

/// Flags of `tessera node`: one per configuration key, all optional.
#[derive(Debug, Default, Args)]
pub struct NodeArgs {
    /// TOML config file [env: TESSERA_CONFIG]
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Host to bind and advertise for cluster traffic [default: 127.0.0.1] [env: TESSERA_HOST]
    #[arg(long, value_name = "HOST")]
    pub host: Option<String>,
    /// Cluster port [default: 25520] [env: TESSERA_PORT]
    #[arg(long, value_name = "PORT")]
    pub port: Option<String>,
    /// Host for the HTTP management API [default: same as --host] [env: TESSERA_HTTP_HOST]
    #[arg(long, value_name = "HOST")]
    pub http_host: Option<String>,
    /// HTTP management API port [default: 8558] [env: TESSERA_HTTP_PORT]
    #[arg(long, value_name = "PORT")]
    pub http_port: Option<String>,
    /// Seed node to join through; repeat or comma-separate [default: none] [env: TESSERA_SEED_NODES]
    #[arg(long = "seed", value_name = "HOST:PORT", value_delimiter = ',')]
    pub seed_nodes: Vec<String>,
    /// Directory for local state [default: ./tessera-data] [env: TESSERA_DATA_DIR]
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<String>,
    /// Roles of this node, comma-separated [default: none] [env: TESSERA_ROLES]
    #[arg(long, value_name = "ROLES", value_delimiter = ',')]
    pub roles: Vec<String>,
    /// Shared cluster secret; prefer the file or env, flags show in `ps` [default: none] [env: TESSERA_CLUSTER_SECRET]
    #[arg(long, value_name = "SECRET")]
    pub cluster_secret: Option<String>,
    /// Stable membership time before the split-brain resolver acts [default: 20s] [env: TESSERA_STABLE_AFTER]
    #[arg(long, value_name = "DURATION")]
    pub stable_after: Option<String>,
    /// Heartbeat interval [default: 1s] [env: TESSERA_HEARTBEAT_INTERVAL]
    #[arg(long, value_name = "DURATION")]
    pub heartbeat_interval: Option<String>,
    /// Gossip interval [default: 1s] [env: TESSERA_GOSSIP_INTERVAL]
    #[arg(long, value_name = "DURATION")]
    pub gossip_interval: Option<String>,
    /// Time the first seed waits for other seeds before joining itself [default: 5s] [env: TESSERA_SEED_NODE_TIMEOUT]
    #[arg(long, value_name = "DURATION")]
    pub seed_node_timeout: Option<String>,
    /// Time without convergence before joining members become WeaklyUp [default: 7s] [env: TESSERA_ALLOW_WEAKLY_UP_AFTER]
    #[arg(long, value_name = "DURATION")]
    pub allow_weakly_up_after: Option<String>,
    /// Neighbours monitoring each node, 1..=100 [default: 5] [env: TESSERA_MONITORED_BY]
    #[arg(long, value_name = "N")]
    pub monitored_by: Option<String>,
    /// Phi accrual threshold [default: 8] [env: TESSERA_FAILURE_DETECTOR_THRESHOLD]
    #[arg(long, value_name = "PHI")]
    pub failure_detector_threshold: Option<String>,
    /// Tolerated heartbeat pause [default: 3s] [env: TESSERA_ACCEPTABLE_HEARTBEAT_PAUSE]
    #[arg(long, value_name = "DURATION")]
    pub acceptable_heartbeat_pause: Option<String>,
    /// Minimum heartbeat standard deviation [default: 100ms] [env: TESSERA_MIN_STD_DEVIATION]
    #[arg(long, value_name = "DURATION")]
    pub min_std_deviation: Option<String>,
    /// keep-majority, static-quorum, keep-oldest or down-all [default: keep-majority] [env: TESSERA_DOWNING_STRATEGY]
    #[arg(long, value_name = "STRATEGY")]
    pub downing_strategy: Option<String>,
    /// Quorum for static-quorum [default: none] [env: TESSERA_QUORUM_SIZE]
    #[arg(long, value_name = "N")]
    pub quorum_size: Option<String>,
    /// keep-oldest: down the oldest when it is alone [default: true] [env: TESSERA_DOWN_IF_ALONE]
    #[arg(long, value_name = "BOOL")]
    pub down_if_alone: Option<String>,
    /// Largest transport frame in bytes [default: 4194304] [env: TESSERA_MAX_FRAME_SIZE]
    #[arg(long, value_name = "BYTES")]
    pub max_frame_size: Option<String>,
    /// Application version gossiped for rolling updates [default: the binary's version] [env: TESSERA_APP_VERSION]
    #[arg(long, value_name = "VERSION")]
    pub app_version: Option<String>,
    /// text or json [default: text] [env: TESSERA_LOG_FORMAT]
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// Level or filter; RUST_LOG overrides it [default: info] [env: TESSERA_LOG_LEVEL]
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// Distributed Data keys stored on disk, comma-separated; a trailing * matches a prefix [default: none] [env: TESSERA_DURABLE_KEYS]
    #[arg(long, value_name = "KEYS", value_delimiter = ',')]
    pub durable_keys: Vec<String>,
    /// Replicas of each journal log, 1..=7 [default: 3] [env: TESSERA_JOURNAL_REPLICATION_FACTOR]
    #[arg(long, value_name = "N")]
    pub journal_replication_factor: Option<String>,
    /// Replicas holding an event before it is acknowledged, more than half the replication factor [default: 2] [env: TESSERA_JOURNAL_WRITE_QUORUM]
    #[arg(long, value_name = "W")]
    pub journal_write_quorum: Option<String>,
    /// Entity snapshot every N events, 0 = never [default: 100] [env: TESSERA_SNAPSHOT_EVERY]
    #[arg(long, value_name = "N")]
    pub snapshot_every: Option<String>,
    /// Passivate entities idle this long, 0s = never [default: 2m] [env: TESSERA_PASSIVATE_AFTER]
    #[arg(long, value_name = "DURATION")]
    pub passivate_after: Option<String>,
    /// Time an entity command waits for its reply [default: 5s] [env: TESSERA_ENTITY_ASK_TIMEOUT]
    #[arg(long, value_name = "DURATION")]
    pub entity_ask_timeout: Option<String>,
    /// Where shard coordinators keep their state: ddata or persistence [default: ddata] [env: TESSERA_STATE_STORE_MODE]
    #[arg(long, value_name = "MODE")]
    pub state_store_mode: Option<String>,
    /// Whether shards remember their entities to restart them: off, ddata or eventsourced [default: off] [env: TESSERA_REMEMBER_ENTITIES]
    #[arg(long, value_name = "STORE")]
    pub remember_entities: Option<String>,
    /// Shards per entity type, 1..=100000; fixed for the cluster's life [default: 1000] [env: TESSERA_NUMBER_OF_SHARDS]
    #[arg(long, value_name = "N")]
    pub number_of_shards: Option<String>,
    /// How often the shard coordinator considers a rebalance [default: 10s] [env: TESSERA_REBALANCE_INTERVAL]
    #[arg(long, value_name = "DURATION")]
    pub rebalance_interval: Option<String>,
    /// Most shards moved per rebalance round [default: 20] [env: TESSERA_REBALANCE_ABSOLUTE_LIMIT]
    #[arg(long, value_name = "N")]
    pub rebalance_absolute_limit: Option<String>,
    /// Most shards moved per rebalance round as a fraction of all shards, in (0, 1] [default: 0.1] [env: TESSERA_REBALANCE_RELATIVE_LIMIT]
    #[arg(long, value_name = "FRACTION")]
    pub rebalance_relative_limit: Option<String>,
    /// A shard handoff not done within this long is given up [default: 1m] [env: TESSERA_HANDOFF_TIMEOUT]
    #[arg(long, value_name = "DURATION")]
    pub handoff_timeout: Option<String>,
    /// Live entities per entity type on this node, least recently used passivated beyond it, 0 = no limit [default: 100000] [env: TESSERA_ACTIVE_ENTITY_LIMIT]
    #[arg(long, value_name = "N")]
    pub active_entity_limit: Option<String>,
    /// Messages a shard region buffers for shards whose home is not known yet [default: 100000] [env: TESSERA_SHARD_BUFFER_SIZE]
    #[arg(long, value_name = "N")]
    pub shard_buffer_size: Option<String>,
    /// Hosts sharded entities only on members with this role; others route (proxy-only) [default: none] [env: TESSERA_SHARDING_ROLE]
    #[arg(long, value_name = "ROLE")]
    pub sharding_role: Option<String>,
}

impl NodeArgs {
    /// The flags the user typed, as the top configuration layer.
    pub fn to_layer(&self) -> ConfigLayer {
        let list = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
        ConfigLayer {
            host: self.host.clone(),
            port: self.port.as_deref().map(Into::into),
            http_host: self.http_host.clone(),
            http_port: self.http_port.as_deref().map(Into::into),
            seed_nodes: list(&self.seed_nodes),
            data_dir: self.data_dir.clone(),
            roles: list(&self.roles),
            cluster_secret: self.cluster_secret.clone(),
            stable_after: self.stable_after.as_deref().map(Into::into),
            heartbeat_interval: self.heartbeat_interval.as_deref().map(Into::into),
            gossip_interval: self.gossip_interval.as_deref().map(Into::into),
            seed_node_timeout: self.seed_node_timeout.as_deref().map(Into::into),
            allow_weakly_up_after: self.allow_weakly_up_after.as_deref().map(Into::into),
            monitored_by: self.monitored_by.as_deref().map(Into::into),
            failure_detector_threshold: self.failure_detector_threshold.as_deref().map(Into::into),
            acceptable_heartbeat_pause: self.acceptable_heartbeat_pause.as_deref().map(Into::into),
            min_std_deviation: self.min_std_deviation.as_deref().map(Into::into),
            downing_strategy: self.downing_strategy.clone(),
            quorum_size: self.quorum_size.as_deref().map(Into::into),
            down_if_alone: self.down_if_alone.as_deref().map(Into::into),
            max_frame_size: self.max_frame_size.as_deref().map(Into::into),
            app_version: self.app_version.clone(),
            log_format: self.log_format.clone(),
            log_level: self.log_level.clone(),
            durable_keys: list(&self.durable_keys),
            snapshot_every: self.snapshot_every.as_deref().map(Into::into),
            passivate_after: self.passivate_after.as_deref().map(Into::into),
            entity_ask_timeout: self.entity_ask_timeout.as_deref().map(Into::into),
            journal_replication_factor: self.journal_replication_factor.as_deref().map(Into::into),
            journal_write_quorum: self.journal_write_quorum.as_deref().map(Into::into),
            state_store_mode: self.state_store_mode.clone(),
            remember_entities: self.remember_entities.clone(),
            number_of_shards: self.number_of_shards.as_deref().map(Into::into),
            rebalance_interval: self.rebalance_interval.as_deref().map(Into::into),
            rebalance_absolute_limit: self.rebalance_absolute_limit.as_deref().map(Into::into),
            rebalance_relative_limit: self.rebalance_relative_limit.as_deref().map(Into::into),
            handoff_timeout: self.handoff_timeout.as_deref().map(Into::into),
            active_entity_limit: self.active_entity_limit.as_deref().map(Into::into),
            shard_buffer_size: self.shard_buffer_size.as_deref().map(Into::into),
            sharding_role: self.sharding_role.clone(),
        }
    }

    /// Builds the validated configuration from these flags, the process environment and the
    /// config file.
    pub fn to_config(&self) -> Result<NodeConfig, ConfigError> {
        self.to_config_with_env(std::env::vars_os())
    }

    /// Like [`NodeArgs::to_config`] with an explicit environment (for tests).
    pub fn to_config_with_env<I>(&self, env: I) -> Result<NodeConfig, ConfigError>
    where
        I: IntoIterator<Item = (OsString, OsString)>,
    {
        NodeConfig::load(self.to_layer(), self.config.as_deref(), env)
    }
}

/// Flags of `tessera demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Number of nodes to start.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(2..=100))]
    pub nodes: u16,
}

/// `tessera sharding ...`.
#[derive(Debug, Subcommand)]
pub enum ShardingCommand {
    /// Remove cluster sharding's stored state of entity types from a stopped node's data
    /// directory (Akka's RemoveInternalClusterShardingData).
    #[command(after_help = REMOVE_INTERNAL_DATA_AFTER_HELP)]
    RemoveInternalData(RemoveInternalDataArgs),
}

const REMOVE_INTERNAL_DATA_AFTER_HELP: &str = "Removes, for each TYPE, the events and \
snapshots of the coordinator's log sharding-coordinator|TYPE (its shard homes) from \
DIR/journal and DIR/snapshots, leaving \
the log empty (an empty-state snapshot at its highest sequence number), and prints what was \
removed per type. The node must be stopped: the command refuses while a node holds the stores. \
Remember-entities data (logs sharding-shard|TYPE|<shard>, durable keys shard-TYPE-*) is not \
removed.

With state_store_mode = ddata (the default) the coordinator's state is kept in Distributed \
Data, not on disk: there is nothing to remove (it is gone once the whole cluster is stopped).

In a replicated cluster every node holds a replica of the log: stop the cluster and run the \
command on every node's data dir before starting it again.";

/// Flags of `tessera sharding remove-internal-data`.
#[derive(Debug, Args)]
pub struct RemoveInternalDataArgs {
    /// The stopped node's data directory (its data_dir)
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,
    /// Entity types whose sharding data to remove, e.g. account
    #[arg(value_name = "TYPE", required = true, num_args = 1..)]
    pub types: Vec<String>,
}

/// `tessera bench ...`.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Cluster formation and convergence at several sizes.
    Cluster(BenchClusterArgs),
    /// Journal write and replay throughput against raw RocksDB.
    Journal(BenchJournalArgs),
    /// Distributed Data latency, catch-up of a new node and idle gossip on 3 nodes.
    Ddata(BenchDdataArgs),
    /// Entity command throughput, recovery time and memory against the raw journal.
    Entities(BenchEntitiesArgs),
    /// Sharded asks against the entity host asked directly, and coordinator failover time.
    Sharding(BenchShardingArgs),
}

/// Flags of `tessera bench ddata`.
#[derive(Debug, Args)]
pub struct BenchDdataArgs {
    /// Print results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// A tenth of the keys and shorter phases, for a quick look.
    #[arg(long)]
    pub quick: bool,
}

/// Flags of `tessera bench cluster`.
#[derive(Debug, Args)]
pub struct BenchClusterArgs {
    /// Cluster sizes to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [3u16, 10, 25],
          value_parser = clap::value_parser!(u16).range(2..=1000))]
    pub nodes: Vec<u16>,
    /// Print results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `tessera bench journal`.
#[derive(Debug, Args)]
pub struct BenchJournalArgs {
    /// Print results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// A tenth of the data and one-second phases, for a quick look.
    #[arg(long)]
    pub quick: bool,
    /// Run only the append or only the replay workloads.
    #[arg(long, value_enum, value_name = "KIND")]
    pub only: Option<JournalWorkloadKind>,
    /// The replicated journal of a three-node cluster (loopback TCP, N = 3, W = 2) against the
    /// local journal, instead of the local journal against RocksDB.
    #[arg(long, conflicts_with = "only")]
    pub replicated: bool,
    /// Directory for the benchmark's databases (created, then removed) [default: a fresh
    /// directory in the system temp dir]. Put it on the disk you want to measure.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// The two kinds of workload of `tessera bench journal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum JournalWorkloadKind {
    /// `append-*`: concurrent appends with fsync.
    Append,
    /// `replay-*`: replays of one log and of many.
    Replay,
}

/// Flags of `tessera bench entities`.
#[derive(Debug, Args)]
pub struct BenchEntitiesArgs {
    /// Print results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// A tenth of the sizes and short phases, for a quick look.
    #[arg(long)]
    pub quick: bool,
    /// Directory for the benchmark's databases (created, then removed) [default: a fresh
    /// directory in the system temp dir]. Put it on the disk you want to measure.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Flags of `tessera bench sharding`.
#[derive(Debug, Args)]
pub struct BenchShardingArgs {
    /// Print results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Shorter phases and the failover with Distributed Data only, for a quick look.
    #[arg(long)]
    pub quick: bool,
    /// Directory for the nodes' data (created, then removed) [default: a fresh directory in
    /// the system temp dir]. Put it on the disk you want to measure.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DowningStrategy, KEYS, RememberEntities, StateStoreMode};
    use clap::CommandFactory;
    use std::time::Duration;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("tessera").chain(args.iter().copied())).unwrap()
    }

    fn node(args: &[&str]) -> NodeArgs {
        match parse(&[&["node"], args].concat()).command {
            Command::Node(node) => *node,
            other => panic!("expected node, got {other:?}"),
        }
    }

    fn no_env() -> Vec<(OsString, OsString)> {
        Vec::new()
    }

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn node_without_flags_gives_defaults() {
        let config = node(&[]).to_config_with_env(no_env()).unwrap();
        assert_eq!(config, NodeConfig::default());
    }

    #[test]
    fn node_flags_reach_the_config() {
        let args = node(&[
            "--host",
            "127.0.0.2",
            "--port",
            "3000",
            "--http-port",
            "3001",
            "--seed",
            "127.0.0.1:1",
            "--seed",
            "127.0.0.1:2,127.0.0.1:3",
            "--data-dir",
            "/tmp/x",
            "--roles",
            "a,b",
            "--stable-after",
            "30s",
            "--heartbeat-interval",
            "2s",
            "--monitored-by",
            "9",
            "--downing-strategy",
            "static-quorum",
            "--quorum-size",
            "2",
            "--log-format",
            "json",
            "--cluster-secret",
            "0123456789abcdef",
            "--snapshot-every",
            "250",
            "--passivate-after",
            "30s",
            "--entity-ask-timeout",
            "1s",
        ]);
        let config = args.to_config_with_env(no_env()).unwrap();
        assert_eq!(config.host, "127.0.0.2");
        assert_eq!(config.http_host, "127.0.0.2");
        assert_eq!((config.port, config.http_port), (3000, 3001));
        assert_eq!(config.seed_nodes.len(), 3);
        assert_eq!(config.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(config.roles.len(), 2);
        assert_eq!(config.stable_after, Duration::from_secs(30));
        assert_eq!(config.heartbeat_interval, Duration::from_secs(2));
        assert_eq!(config.monitored_by, 9);
        assert_eq!(
            config.downing_strategy,
            DowningStrategy::StaticQuorum { quorum_size: 2 }
        );
        assert!(config.cluster_secret.is_some());
        assert_eq!(config.snapshot_every, 250);
        assert_eq!(config.passivate_after, Duration::from_secs(30));
        assert_eq!(config.entity_ask_timeout, Duration::from_secs(1));
    }

    #[test]
    fn sharding_flags_reach_the_config() {
        let args = node(&[
            "--state-store-mode",
            "persistence",
            "--remember-entities",
            "eventsourced",
            "--number-of-shards",
            "64",
            "--rebalance-interval",
            "2s",
            "--rebalance-absolute-limit",
            "3",
            "--rebalance-relative-limit",
            "0.25",
            "--handoff-timeout",
            "15s",
            "--active-entity-limit",
            "0",
            "--shard-buffer-size",
            "1000",
        ]);
        let env = vec![
            ("TESSERA_STATE_STORE_MODE".into(), "ddata".into()),
            ("TESSERA_NUMBER_OF_SHARDS".into(), "32".into()),
            ("TESSERA_SHARD_BUFFER_SIZE".into(), "5".into()),
        ];
        let config = args.to_config_with_env(env).unwrap();
        assert_eq!(config.state_store_mode, StateStoreMode::Persistence);
        assert_eq!(config.remember_entities, RememberEntities::Eventsourced);
        assert_eq!(config.number_of_shards, 64);
        assert_eq!(config.rebalance_interval, Duration::from_secs(2));
        assert_eq!(config.rebalance_absolute_limit, 3);
        assert_eq!(config.rebalance_relative_limit, 0.25);
        assert_eq!(config.handoff_timeout, Duration::from_secs(15));
        assert_eq!(config.active_entity_limit(), None);
        assert_eq!(config.shard_buffer_size, 1000);
        let err = node(&["--remember-entities", "yes"])
            .to_config_with_env(no_env())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"invalid value "yes" for remember_entities: expected off, ddata or eventsourced"#
        );
    }

    #[test]
    fn flag_beats_env_and_env_fills_what_flags_leave_out() {
        let env = vec![
            ("TESSERA_PORT".into(), "4000".into()),
            ("TESSERA_GOSSIP_INTERVAL".into(), "3s".into()),
        ];
        let config = node(&["--port", "5000"]).to_config_with_env(env).unwrap();
        assert_eq!(config.port, 5000);
        assert_eq!(config.gossip_interval, Duration::from_secs(3));
    }

    #[test]
    fn flags_beat_the_config_file() {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), "port = 6000\nhttp_port = 6001\n").unwrap();
        let path = file.path().to_str().unwrap();
        let config = node(&["--config", path, "--port", "7000"])
            .to_config_with_env(no_env())
            .unwrap();
        assert_eq!((config.port, config.http_port), (7000, 6001));
    }

    #[test]
    fn bad_flag_values_are_config_errors_naming_the_key() {
        let err = node(&["--stable-after", "abc"])
            .to_config_with_env(no_env())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"invalid value "abc" for stable_after: expected a duration like 2s or 500ms"#
        );
        let err = node(&["--host", "0.0.0.0"])
            .to_config_with_env(no_env())
            .unwrap_err();
        assert!(matches!(err, ConfigError::NonLoopbackWithoutSecret { .. }));
    }

    #[test]
    fn unknown_flag_is_refused() {
        assert!(Cli::try_parse_from(["tessera", "node", "--prot", "1"]).is_err());
        assert!(Cli::try_parse_from(["tessera"]).is_err());
    }

    #[test]
    fn every_config_key_has_a_flag_documented_with_its_env_var() {
        let mut cmd = Cli::command();
        let help = cmd
            .find_subcommand_mut("node")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(help.contains("--config <FILE>") && help.contains("[env: TESSERA_CONFIG]"));
        for key in KEYS {
            let flag = if key == "seed_nodes" {
                "seed".to_string()
            } else {
                key.replace('_', "-")
            };
            assert!(help.contains(&format!("--{flag} ")), "--{flag} missing");
            let env = format!("[env: TESSERA_{}]", key.to_ascii_uppercase());
            assert!(help.contains(&env), "{env} missing");
        }
    }

    #[test]
    fn help_states_the_real_defaults() {
        let help = Cli::command()
            .find_subcommand_mut("node")
            .unwrap()
            .render_long_help()
            .to_string();
        let d = NodeConfig::default();
        let dur = |d: Duration| humantime::format_duration(d).to_string();
        for expected in [
            format!("[default: {}]", d.host),
            format!("[default: {}]", d.port),
            format!("[default: {}]", d.http_port),
            format!("[default: {}]", d.data_dir.display()),
            format!("[default: {}]", dur(d.stable_after)),
            format!("[default: {}]", dur(d.heartbeat_interval)),
            format!("[default: {}]", dur(d.seed_node_timeout)),
            format!("[default: {}]", dur(d.allow_weakly_up_after)),
            format!("[default: {}]", dur(d.acceptable_heartbeat_pause)),
            format!("[default: {}]", dur(d.min_std_deviation)),
            format!("[default: {}]", d.monitored_by),
            format!("[default: {}]", d.failure_detector_threshold),
            format!("[default: {}]", d.downing_strategy.as_str()),
            format!("[default: {}]", d.max_frame_size),
            format!("[default: {}]", d.log_format),
            format!("[default: {}]", d.log_level),
            format!("[default: {}]", d.snapshot_every),
            format!("[default: {}]", dur(d.passivate_after)),
            format!("[default: {}]", dur(d.entity_ask_timeout)),
            format!("[default: {}]", d.state_store_mode),
            format!("[default: {}]", d.remember_entities),
            format!("[default: {}]", d.number_of_shards),
            format!("[default: {}]", dur(d.rebalance_interval)),
            format!("[default: {}]", d.rebalance_absolute_limit),
            format!("[default: {}]", d.rebalance_relative_limit),
            format!("[default: {}]", dur(d.handoff_timeout)),
            format!("[default: {}]", d.active_entity_limit),
            format!("[default: {}]", d.shard_buffer_size),
        ] {
            assert!(help.contains(&expected), "{expected} missing from:\n{help}");
        }
    }

    #[test]
    fn demo_nodes_defaults_to_three() {
        assert!(matches!(
            parse(&["demo"]).command,
            Command::Demo(DemoArgs { nodes: 3 })
        ));
        assert!(matches!(
            parse(&["demo", "--nodes", "5"]).command,
            Command::Demo(DemoArgs { nodes: 5 })
        ));
        assert!(Cli::try_parse_from(["tessera", "demo", "--nodes", "0"]).is_err());
    }

    #[test]
    fn sharding_remove_internal_data_takes_a_data_dir_and_types() {
        let args = [
            "sharding",
            "remove-internal-data",
            "--data-dir",
            "d",
            "a",
            "b",
        ];
        match parse(&args).command {
            Command::Sharding(ShardingCommand::RemoveInternalData(args)) => {
                assert_eq!(args.data_dir, PathBuf::from("d"));
                assert_eq!(args.types, ["a", "b"]);
            }
            other => panic!("parsed as {other:?}"),
        }
        let no_type = [
            "tessera",
            "sharding",
            "remove-internal-data",
            "--data-dir",
            "d",
        ];
        assert!(Cli::try_parse_from(no_type).is_err());
    }

    #[test]
    fn bench_cluster_sizes_and_json() {
        match parse(&["bench", "cluster"]).command {
            Command::Bench(BenchCommand::Cluster(a)) => {
                assert_eq!(a.nodes, vec![3, 10, 25]);
                assert!(!a.json);
            }
            other => panic!("{other:?}"),
        }
        match parse(&["bench", "cluster", "--nodes", "5,50", "--json"]).command {
            Command::Bench(BenchCommand::Cluster(a)) => {
                assert_eq!(a.nodes, vec![5, 50]);
                assert!(a.json);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bench_journal_flags() {
        match parse(&["bench", "journal", "--json", "--quick"]).command {
            Command::Bench(BenchCommand::Journal(a)) => {
                assert!(a.json && a.quick && a.only.is_none())
            }
            other => panic!("{other:?}"),
        }
        match parse(&["bench", "journal", "--only", "replay"]).command {
            Command::Bench(BenchCommand::Journal(a)) => {
                assert_eq!(a.only, Some(JournalWorkloadKind::Replay))
            }
            other => panic!("{other:?}"),
        }
        match parse(&["bench", "journal", "--replicated", "--quick"]).command {
            Command::Bench(BenchCommand::Journal(a)) => assert!(a.replicated && a.quick),
            other => panic!("{other:?}"),
        }
        assert!(
            Cli::try_parse_from([
                "tessera",
                "bench",
                "journal",
                "--replicated",
                "--only",
                "append"
            ])
            .is_err()
        );
        assert!(Cli::try_parse_from(["tessera", "bench", "journal", "--only", "scan"]).is_err());
        assert!(Cli::try_parse_from(["tessera", "bench"]).is_err());
    }

    #[test]
    fn bench_entities_flags() {
        match parse(&["bench", "entities", "--quick", "--dir", "/tmp/b"]).command {
            Command::Bench(BenchCommand::Entities(a)) => {
                assert!(a.quick && !a.json);
                assert_eq!(a.dir, Some(PathBuf::from("/tmp/b")));
            }
            other => panic!("{other:?}"),
        }
    }
}
