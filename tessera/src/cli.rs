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
use crate::node::NodeBuilder;
use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

/// The operator's command line of a tessera service: run a node of it, and the clients of a
/// running node's HTTP API. Every service built on tessera has it ([`NodeBuilder::main`]).
#[derive(Debug, Parser)]
#[command(name = "tessera", version, about, propagate_version = true)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The operator's subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a cluster node until SIGINT/SIGTERM, then leave the cluster gracefully.
    #[command(after_help = NODE_AFTER_HELP)]
    Node(Box<NodeArgs>),
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
    /// List the projections (instances, nodes, offsets, lag), or pause, resume or reset one:
    /// tessera projections pause balances
    #[command(after_help = CLIENT_AFTER_HELP)]
    Projections(ProjectionsArgs),
}

/// Runs an operator's command with the service's entity types (`builder`): `node` starts a
/// node of the service and runs it until SIGINT/SIGTERM; the others talk to a running node or
/// to a stopped node's data directory. Returns the process's exit status.
pub async fn run(builder: NodeBuilder, command: Command) -> ExitCode {
    match command {
        Command::Node(args) => {
            let config = match args.to_config() {
                Ok(config) => config,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            if let Err(e) = builder.check(&config) {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
            if let Err(e) = crate::logging::init(config.log_format, &config.log_level) {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
            for warning in config.warnings() {
                tracing::warn!("{warning}");
            }
            ExitCode::from(builder.run(config).await)
        }
        Command::Sharding(ShardingCommand::RemoveInternalData(args)) => {
            let report = |removal: &crate::sharding_tool::TypeRemoval| {
                println!("{}", removal.describe());
            };
            match crate::sharding_tool::remove_internal_data(&args.data_dir, &args.types, report)
                .await
            {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        client => run_client(&client).await,
    }
}

/// Runs a client command against a node: its output on stdout, or the error on stderr with
/// the exit code that names what failed.
async fn run_client(command: &Command) -> ExitCode {
    let Some((client_command, args)) = command.client() else {
        eprintln!("error: not a client command");
        return ExitCode::from(2);
    };
    match crate::client::run(&client_command, &args.options()).await {
        Ok(output) => {
            println!("{output}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

impl NodeBuilder {
    /// The whole operator's command line of the service (see [`Cli`]), from the process's
    /// arguments, on a multi-threaded runtime: `main` of a service's binary is this one call.
    ///
    /// ```no_run
    /// # fn register(builder: tessera::NodeBuilder) -> tessera::NodeBuilder { builder }
    /// fn main() -> std::process::ExitCode {
    ///     register(tessera::NodeBuilder::new()).main()
    /// }
    /// ```
    pub fn main(self) -> ExitCode {
        let cli = Cli::parse();
        match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime.block_on(run(self, cli.command)),
            Err(e) => {
                eprintln!("error: cannot start the async runtime: {e}");
                ExitCode::FAILURE
            }
        }
    }
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

/// `tessera projections [ACTION NAME]`.
#[derive(Debug, Args)]
pub struct ProjectionsArgs {
    /// list (the default), pause, resume or reset (reset only while paused)
    #[arg(
        value_name = "ACTION",
        default_value = "list",
        value_parser = ["list", "pause", "resume", "reset"]
    )]
    pub action: String,
    /// The projection to pause, resume or reset
    #[arg(value_name = "NAME")]
    pub name: Option<String>,
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
            Command::Projections(a) => (
                match a.action.as_str() {
                    "list" => C::Projections,
                    action => C::ProjectionControl {
                        operation: action.to_string(),
                        name: a.name.clone(),
                    },
                },
                &a.client,
            ),
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
CLI client.

An entity type's own settings (sharding_role, remember_entities, state_store_mode, \
passivate_after, active_entity_limit, snapshot_every, entity_ask_timeout, number_of_shards, \
rebalance_interval, rebalance_absolute_limit, rebalance_relative_limit, handoff_timeout, \
shard_buffer_size) go in its section: [entity.<type>] in the file, TESSERA_ENTITY_<TYPE>_<KEY>, \
or --entity <type>.<key>=<value>. They win over the node-wide keys of the same names and over \
what the service's code set; a section for a type the service does not register stops the \
node.";

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
    // The doc comment is clap's help text, written for a terminal, not for rustdoc.
    #[allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]
    /// A key of one entity type's own section, <type>.<key>=<value> (repeat or
    /// comma-separate), e.g. account.passivate_after=30s [env: TESSERA_ENTITY_<TYPE>_<KEY>]
    #[arg(long = "entity", value_name = "TYPE.KEY=VALUE", value_delimiter = ',', value_parser = parse_entity_flag)]
    pub entity: Vec<EntityFlag>,
}

/// One `--entity <type>.<key>=<value>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntityFlag {
    pub type_name: String,
    pub key: String,
    pub value: String,
}

/// `<type>.<key>=<value>`: the type is what comes before the last `.` ahead of the `=` (type
/// names may contain `.`, keys do not).
fn parse_entity_flag(text: &str) -> Result<EntityFlag, String> {
    let bad = || {
        config::ConfigError::EntityFlag {
            value: text.to_string(),
        }
        .to_string()
    };
    let (name, value) = text.split_once('=').ok_or_else(bad)?;
    let (type_name, key) = name.rsplit_once('.').ok_or_else(bad)?;
    if type_name.is_empty() || key.is_empty() {
        return Err(bad());
    }
    if !crate::entity_settings::ENTITY_KEYS.contains(&key) {
        return Err(config::ConfigError::NotAnEntityKey {
            key: key.to_string(),
            allowed: crate::entity_settings::ENTITY_KEYS.join(", "),
        }
        .to_string());
    }
    Ok(EntityFlag {
        type_name: type_name.to_string(),
        key: key.to_string(),
        value: value.to_string(),
    })
}

impl NodeArgs {
    /// The flags the user typed, as the top configuration layer.
    pub fn to_layer(&self) -> ConfigLayer {
        let mut layer = self.keys.clone();
        for flag in &self.entity {
            layer
                .entity
                .entry(crate::entity_settings::section_name(&flag.type_name))
                .or_default()
                .set(&flag.key, flag.value.clone());
        }
        layer
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
    fn entity_flags_set_a_types_own_keys() {
        let config = node(&[
            "--entity",
            "cart.passivate_after=30s,cart.number_of_shards=64",
            "--entity",
            "shop.stock.snapshot_every=5",
        ])
        .to_config_with_env(no_env())
        .unwrap();
        let cart = config.entity_section("cart");
        assert_eq!(cart.passivate_after, Some(Duration::from_secs(30)));
        assert_eq!(cart.number_of_shards, Some(64));
        assert_eq!(config.entity_section("shop.stock").snapshot_every, Some(5));
        for bad in ["cart", "cart=1", ".snapshot_every=1", "cart.host=x"] {
            let refused = Cli::try_parse_from(["tessera", "node", "--entity", bad]);
            assert!(refused.is_err(), "{bad}");
        }
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
}
