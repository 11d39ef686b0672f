//! Command-line definitions (clap derive) and the step from `tessera node` flags to a validated
//! [`NodeConfig`].
//!
//! The node's flags are the configuration keys themselves: [`ConfigLayer`] defines each key
//! once (TOML key, flag, environment variable and help) and is flattened into [`NodeArgs`].
//! Its flags are optional without clap defaults: a clap default would be indistinguishable from
//! a flag the user typed and would beat the config file. The defaults live in
//! [`NodeConfig::default`], and each flag's help states it and its environment variable (a test
//! keeps the two in step). Environment variables are read by [`ConfigLayer::from_env`], not by
//! clap, so that the precedence flag > env > file > default is decided in one place and can be
//! tested without touching the process environment.

use crate::config::{self, ConfigError, ConfigLayer, NodeConfig};
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
    /// Run a cluster of real nodes under a mixed workload and a nemesis (kills, pauses,
    /// restarts, partitions), then check the history for lost or doubled writes.
    #[command(after_help = SOAK_AFTER_HELP)]
    Soak(SoakArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Cluster sharding maintenance.
    #[command(subcommand)]
    Sharding(ShardingCommand),
    /// List the cluster's members as a node sees them.
    #[command(after_help = CLIENT_AFTER_HELP)]
    Members(ClientArgs),
    /// Make the node join the cluster at ADDRESS (its own cluster address forms a new one).
    #[command(after_help = CLIENT_AFTER_HELP)]
    Join(AddressArgs),
    /// Make the member at ADDRESS leave the cluster gracefully.
    #[command(after_help = CLIENT_AFTER_HELP)]
    Leave(AddressArgs),
    /// Mark the member at ADDRESS down (it is removed from the cluster).
    #[command(after_help = CLIENT_AFTER_HELP)]
    Down(AddressArgs),
    /// Every member's shards and live entities of an entity type.
    #[command(after_help = CLIENT_AFTER_HELP)]
    Shards(ShardsArgs),
    /// Read, update or delete Distributed Data keys.
    #[command(subcommand)]
    Ddata(DdataCommand),
    /// Send a JSON command to an entity and print its reply.
    #[command(after_help = CLIENT_AFTER_HELP)]
    Entity(EntityArgs),
}

const CLIENT_AFTER_HELP: &str = "Talks to a running node's HTTP API (--node, default \
http://127.0.0.1:8558, or TESSERA_NODE) with the bearer token of its http_token (--token or \
TESSERA_TOKEN). Exit codes: 0 done; 2 bad usage; 3 node unreachable; 4 token refused (401); \
5 refused by the node (4xx, nothing done); 6 the node could not do it (5xx, nothing done); \
7 outcome unknown (504: it may or may not have taken effect); 8 unexpected answer.";

/// How the client commands reach a node.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// The node's HTTP API
    #[arg(long, value_name = "URL", env = "TESSERA_NODE", default_value = crate::client::DEFAULT_NODE)]
    pub node: String,
    /// Bearer token (the node's http_token)
    #[arg(
        long,
        value_name = "TOKEN",
        env = "TESSERA_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// Print the node's JSON answer instead of a table
    #[arg(long)]
    pub json: bool,
    /// How long to wait for the node's answer (longer than a node's own request timeout, 30 s,
    /// so that the node's verdict arrives first)
    #[arg(long, value_name = "DURATION", default_value = "35s", value_parser = humantime::parse_duration)]
    pub timeout: std::time::Duration,
}

impl ClientArgs {
    /// The client's options.
    pub fn options(&self) -> crate::client::ClientOptions {
        crate::client::ClientOptions {
            node: self.node.clone(),
            token: self.token.clone(),
            json: self.json,
            timeout: self.timeout,
        }
    }
}

/// `tessera join|leave|down ADDRESS`.
#[derive(Debug, Args)]
pub struct AddressArgs {
    /// A member's cluster address, host:port (as `tessera members` shows it)
    #[arg(value_name = "ADDRESS")]
    pub address: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `tessera shards TYPE`.
#[derive(Debug, Args)]
pub struct ShardsArgs {
    /// Entity type, e.g. account
    #[arg(value_name = "TYPE")]
    pub entity_type: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `tessera entity TYPE ID JSON`.
#[derive(Debug, Args)]
pub struct EntityArgs {
    /// Entity type, e.g. account
    #[arg(value_name = "TYPE")]
    pub entity_type: String,
    /// Entity id
    #[arg(value_name = "ID")]
    pub id: String,
    /// The command, as JSON, e.g. '{"deposit": 5}'
    #[arg(value_name = "JSON")]
    pub command: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `tessera ddata ...`.
#[derive(Debug, Subcommand)]
pub enum DdataCommand {
    /// Read a key: tessera ddata get counter hits
    #[command(after_help = CLIENT_AFTER_HELP)]
    Get(DdataKeyArgs),
    /// Apply an operation: tessera ddata update counter hits '{"increment": 1}'
    #[command(after_help = CLIENT_AFTER_HELP)]
    Update(DdataUpdateArgs),
    /// Delete a key for good: tessera ddata delete counter hits
    #[command(after_help = CLIENT_AFTER_HELP)]
    Delete(DdataKeyArgs),
}

/// A Distributed Data key and the consistency to use.
#[derive(Debug, Args)]
pub struct DdataKeyArgs {
    /// Data type: counter, set, register, map or flag
    #[arg(value_name = "TYPE")]
    pub data_type: String,
    /// Key
    #[arg(value_name = "KEY")]
    pub key: String,
    /// local, majority, all or a number of nodes [default: the node's, local]
    #[arg(long, value_name = "LEVEL")]
    pub consistency: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `tessera ddata update TYPE KEY JSON`.
#[derive(Debug, Args)]
pub struct DdataUpdateArgs {
    #[command(flatten)]
    pub key: DdataKeyArgs,
    /// The operation, as JSON, e.g. '{"increment": 1}' or '{"add": "x"}'
    #[arg(value_name = "JSON")]
    pub operation: String,
}

impl Command {
    /// The client command this is, with how to reach the node; None for the others.
    pub fn client(&self) -> Option<(crate::client::ClientCommand, &ClientArgs)> {
        use crate::client::ClientCommand as C;
        Some(match self {
            Command::Members(args) => (C::Members, args),
            Command::Join(a) => (C::Join(a.address.clone()), &a.client),
            Command::Leave(a) => (C::Leave(a.address.clone()), &a.client),
            Command::Down(a) => (C::Down(a.address.clone()), &a.client),
            Command::Shards(a) => (C::Shards(a.entity_type.clone()), &a.client),
            Command::Entity(a) => (
                C::Entity {
                    entity_type: a.entity_type.clone(),
                    id: a.id.clone(),
                    command: a.command.clone(),
                },
                &a.client,
            ),
            Command::Ddata(DdataCommand::Get(a)) => (
                C::DdataGet {
                    data_type: a.data_type.clone(),
                    key: a.key.clone(),
                    consistency: a.consistency.clone(),
                },
                &a.client,
            ),
            Command::Ddata(DdataCommand::Update(a)) => (
                C::DdataUpdate {
                    data_type: a.key.data_type.clone(),
                    key: a.key.key.clone(),
                    operation: a.operation.clone(),
                    consistency: a.key.consistency.clone(),
                },
                &a.key.client,
            ),
            Command::Ddata(DdataCommand::Delete(a)) => (
                C::DdataDelete {
                    data_type: a.data_type.clone(),
                    key: a.key.clone(),
                    consistency: a.consistency.clone(),
                },
                &a.client,
            ),
            _ => return None,
        })
    }
}

const NODE_AFTER_HELP: &str = "Every flag has a config-file key (the flag name with '_' for \
'-'; seed_nodes for --seed, contact_points for --contact-point) and a TESSERA_<KEY> environment \
variable; lists in the environment are comma-separated. Precedence: flag > environment > config \
file > default. Other TESSERA_* variables are refused, except those of the test tools and the \
CLI client.";

/// Flags of `tessera node`: the config file, and one flag per configuration key, all optional.
#[derive(Debug, Default, Args)]
#[command(mut_args = config::with_env_in_help)]
pub struct NodeArgs {
    /// TOML config file
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The keys given as flags: the top configuration layer.
    #[command(flatten)]
    pub keys: ConfigLayer,
}

impl NodeArgs {
    /// The flags the user typed, as the top configuration layer.
    pub fn to_layer(&self) -> ConfigLayer {
        self.keys.clone()
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

const SOAK_AFTER_HELP: &str = "The nodes are this binary's `tessera node` processes, each \
in a network namespace of its own when run as root (so that the nemesis can partition them), \
else on 127.0.0.1 (partitions skipped, and the summary says why). Progress goes to stderr, the \
summary to stdout. Exit status: 0 no anomalies; 1 anomalies found (the node logs and the \
history are kept, and their directory printed); 2 bad usage; 3 the soak could not run (a node \
would not start, the cluster did not form).";

/// Flags of `tessera soak`.
#[derive(Debug, Args)]
pub struct SoakArgs {
    /// How long the workload and the nemesis run, in minutes (fractions allowed)
    #[arg(long, default_value_t = 10.0, value_parser = parse_minutes)]
    pub minutes: f64,
    /// Number of nodes (the nemesis impairs at most a minority of them at a time)
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(3..=9))]
    pub nodes: u16,
    /// Seed of the nemesis's and the clients' choices [default: random, printed]
    #[arg(long)]
    pub seed: Option<u64>,
    /// The nodes' stable_after: how long the split-brain resolver waits for a stable view
    /// (Akka's recommendation for up to 10 nodes); long pauses and partitions are drawn to
    /// outlast it, so that nodes get downed
    #[arg(long, value_name = "DURATION", default_value = "7s", value_parser = parse_stable_after)]
    pub stable_after: std::time::Duration,
    /// Print the summary as one JSON object
    #[arg(long)]
    pub json: bool,
    /// Keep the nodes' data and logs and the history also when no anomaly was found
    #[arg(long)]
    pub keep_dir: bool,
    /// Bound on every node's resident memory (VmRSS), in MiB
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_rss_mib: u64,
    /// Corrupt the evidence so that the checker must find an anomaly (a check of the checker)
    #[arg(long, hide = true, value_enum)]
    pub sabotage: Option<crate::soak::Sabotage>,
}

/// A `stable_after` for the soak's nodes: 1 s to 1 min.
fn parse_stable_after(value: &str) -> Result<std::time::Duration, String> {
    let duration = humantime::parse_duration(value).map_err(|e| format!("{value:?}: {e}"))?;
    if (std::time::Duration::from_secs(1)..=std::time::Duration::from_secs(60)).contains(&duration)
    {
        Ok(duration)
    } else {
        Err(format!("{value}: expected 1s to 60s"))
    }
}

/// Minutes: a positive number, at most a week.
fn parse_minutes(value: &str) -> Result<f64, String> {
    let minutes: f64 = value
        .parse()
        .map_err(|_| format!("{value:?} is not a number of minutes"))?;
    if minutes.is_finite() && minutes > 0.0 && minutes <= 7.0 * 24.0 * 60.0 {
        Ok(minutes)
    } else {
        Err(format!(
            "{value} minutes: expected more than 0 and at most a week (10080)"
        ))
    }
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
the log empty (an empty-state snapshot at its highest sequence number), and its \
remember-entities data: the events of its shard logs sharding-shard|TYPE|<shard> \
(remember_entities = eventsourced) and its durable Distributed Data keys shard-TYPE-<shard> \
and shard-TYPE-all in DIR/ddata (either mode). It prints what was removed per type. The node \
must be stopped: the command refuses while a node holds the stores.

With state_store_mode = ddata (the default) the coordinator's state is kept in Distributed \
Data, not on disk: there is nothing to remove (it is gone once the whole cluster is stopped).

In a replicated cluster every node holds a replica of the logs and a copy of the durable \
keys: stop the cluster and run the \
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
    /// Run only the append or only the replay workloads (with `--replicated`, the replay
    /// workloads are the replay and the recovery).
    #[arg(long, value_enum, value_name = "KIND")]
    pub only: Option<JournalWorkloadKind>,
    /// The replicated journal of a three-node cluster (loopback TCP, N = 3, W = 2) against the
    /// local journal, instead of the local journal against RocksDB.
    #[arg(long)]
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
    /// Run only these workloads, comma-separated (each ask workload on one node and on two)
    /// [default: all].
    #[arg(long, value_enum, value_delimiter = ',', value_name = "WORKLOAD")]
    pub only: Vec<ShardingWorkloadKind>,
    /// Directory for the nodes' data (created, then removed) [default: a fresh directory in
    /// the system temp dir]. Put it on the disk you want to measure.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// The workloads of `tessera bench sharding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ShardingWorkloadKind {
    /// `query-*`: asks that persist nothing.
    Query,
    /// `persist-always-*`: deposits, the journal fsyncing every write.
    PersistAlways,
    /// `persist-never-*`: deposits, the journal never fsyncing.
    PersistNever,
    /// `failover-*`: the coordinator's node killed.
    Failover,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DowningStrategy, RememberEntities, StateStoreMode, keys};
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
        let node = cmd.find_subcommand_mut("node").unwrap();
        let help = node.render_long_help().to_string();
        assert!(help.contains("--config <FILE>") && help.contains("[env: TESSERA_CONFIG]"));
        for key in keys() {
            let arg = node
                .get_arguments()
                .find(|arg| arg.get_id() == key.as_str())
                .unwrap_or_else(|| panic!("{key} has no flag"));
            let flag = match key.as_str() {
                "seed_nodes" => "seed".to_string(),
                "contact_points" => "contact-point".to_string(),
                _ => key.replace('_', "-"),
            };
            assert_eq!(arg.get_long(), Some(flag.as_str()), "{key}");
            assert!(help.contains(&format!("--{flag} ")), "--{flag} missing");
            let env = format!("[env: TESSERA_{}]", key.to_ascii_uppercase());
            assert!(help.contains(&env), "{env} missing");
            assert_eq!(help.matches(&env).count(), 1, "{env} twice");
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
            format!("[default: {}]", dur(d.journal_read_lease)),
            format!("[default: {}]", d.state_store_mode),
            format!("[default: {}]", d.remember_entities),
            format!("[default: {}]", d.number_of_shards),
            format!("[default: {}]", dur(d.rebalance_interval)),
            format!("[default: {}]", d.rebalance_absolute_limit),
            format!("[default: {}]", d.rebalance_relative_limit),
            format!("[default: {}]", dur(d.handoff_timeout)),
            format!("[default: {}]", d.active_entity_limit),
            format!("[default: {}]", d.shard_buffer_size),
            format!("[default: {}]", d.required_contact_points),
            format!("[default: {}]", dur(d.stable_margin)),
            format!("[default: {}]", d.form_new_cluster),
            format!("[default: {}]", dur(d.bootstrap_probe_interval)),
            format!("[default: {}]", dur(d.http_header_timeout)),
            format!("[default: {}]", dur(d.http_request_timeout)),
            format!("[default: {}]", d.http_max_concurrent_requests),
            format!("[default: {}]", d.http_max_connections),
        ] {
            assert!(help.contains(&expected), "{expected} missing from:\n{help}");
        }
        assert_eq!(d.shutdown_after_unsuccessful_join, None);
        assert!(help.contains("off = never [default: off]"), "{help}");
    }

    #[test]
    fn bootstrap_and_http_flags_reach_the_config() {
        let token = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(token.path(), "token-from-a-file\n").unwrap();
        let config = node(&[
            "--contact-point",
            "10.0.0.1:8558",
            "--contact-point",
            "10.0.0.2:8558,10.0.0.3:8558",
            "--required-contact-points",
            "3",
            "--stable-margin",
            "2s",
            "--form-new-cluster",
            "false",
            "--bootstrap-probe-interval",
            "250ms",
            "--shutdown-after-unsuccessful-join",
            "off",
            "--http-host",
            "0.0.0.0",
            "--http-token-file",
            token.path().to_str().unwrap(),
            "--http-header-timeout",
            "3s",
            "--http-request-timeout",
            "9s",
            "--http-max-concurrent-requests",
            "16",
            "--http-max-connections",
            "32",
        ])
        .to_config_with_env(no_env())
        .unwrap();
        assert_eq!(config.contact_points.len(), 3);
        assert_eq!(config.contact_points[2].to_string(), "10.0.0.3:8558");
        assert_eq!(config.required_contact_points, 3);
        assert_eq!(config.stable_margin, Duration::from_secs(2));
        assert!(!config.form_new_cluster);
        assert_eq!(config.bootstrap_probe_interval, Duration::from_millis(250));
        assert_eq!(config.shutdown_after_unsuccessful_join, None);
        assert_eq!(config.http_token.unwrap().expose(), "token-from-a-file");
        assert_eq!(config.http_header_timeout, Duration::from_secs(3));
        assert_eq!(config.http_request_timeout, Duration::from_secs(9));
        assert_eq!(config.http_max_concurrent_requests, 16);
        assert_eq!(config.http_max_connections, 32);

        let env = vec![("TESSERA_CONTACT_POINT_PORT".into(), "8600".into())];
        let config = node(&[
            "--discovery-dns",
            "_http._tcp.tessera.local",
            "--discovery-dns-server",
            "127.0.0.1:5353",
            "--http-token",
            "token-given-as-a-flag",
        ])
        .to_config_with_env(env)
        .unwrap();
        assert_eq!(
            config.discovery_dns.as_deref(),
            Some("_http._tcp.tessera.local")
        );
        assert_eq!(
            config.discovery_dns_server,
            Some("127.0.0.1:5353".parse().unwrap())
        );
        assert_eq!(config.contact_point_port, Some(8600));
        assert_eq!(config.http_token.unwrap().expose(), "token-given-as-a-flag");

        let err = node(&[
            "--seed",
            "127.0.0.1:25520",
            "--contact-point",
            "127.0.0.1:8558",
        ])
        .to_config_with_env(no_env())
        .unwrap_err();
        assert!(matches!(err, ConfigError::Exclusive { .. }), "{err}");
    }

    #[test]
    fn unknown_tessera_variables_stop_the_node() {
        let env = vec![("TESSERA_HTTP_PROT".into(), "1".into())];
        let err = node(&[]).to_config_with_env(env).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown environment variable TESSERA_HTTP_PROT (did you mean TESSERA_HTTP_PORT?): \
             a TESSERA_* variable must be TESSERA_ and a config key in upper case (see tessera \
             node --help)"
        );
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
        match parse(&["bench", "journal", "--replicated", "--only", "append"]).command {
            Command::Bench(BenchCommand::Journal(a)) => {
                assert!(a.replicated);
                assert_eq!(a.only, Some(JournalWorkloadKind::Append));
            }
            other => panic!("{other:?}"),
        }
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

    #[test]
    fn bench_sharding_only_takes_a_list_of_workloads() {
        match parse(&["bench", "sharding", "--only", "persist-never,failover"]).command {
            Command::Bench(BenchCommand::Sharding(a)) => assert_eq!(
                a.only,
                [
                    ShardingWorkloadKind::PersistNever,
                    ShardingWorkloadKind::Failover
                ]
            ),
            other => panic!("{other:?}"),
        }
        match parse(&["bench", "sharding"]).command {
            Command::Bench(BenchCommand::Sharding(a)) => assert!(a.only.is_empty()),
            other => panic!("{other:?}"),
        }
        assert!(
            Cli::try_parse_from(["tessera", "bench", "sharding", "--only", "persist"]).is_err()
        );
    }
}
