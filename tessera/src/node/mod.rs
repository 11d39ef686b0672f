//! A tessera node: the cluster transport, the cluster protocols, the entity hosts on the
//! journal and snapshot store in `data_dir`, and the HTTP API, wired from a [`NodeConfig`],
//! running until a signal or the cluster ends its membership.

use crate::bootstrap::{BootstrapConfig, Discovery, JoiningVia};
use crate::config::{DowningStrategy, NodeConfig, RememberEntities, StateStoreMode};
use crate::entities::account::Account;
use crate::entities::{EntityTypes, JsonShardHost};
use crate::http::entities::{CommandError, EntityBackend};
use crate::http::sharding::ShardingQueries;
use crate::http::{
    self, ClusterControl, ControlError, MemberView, MembersView, NodeMetrics, RefusedConnections,
};
use futures::FutureExt;
use futures::future::BoxFuture;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tessera_cluster::bootstrap::BootstrapSettings;
use tessera_cluster::core::{ClusterCoreConfig, DowningConfig, StopReason};
use tessera_cluster::failure_detector::FailureDetectorConfig;
use tessera_cluster::heartbeat::HeartbeatConfig;
use tessera_cluster::membership::MembershipConfig;
use tessera_cluster::node::{ClusterError, ClusterHandle, ClusterStartError, Operation};
use tessera_cluster::sbr;
use tessera_cluster::singleton::{SingletonError, Singletons};
use tessera_cluster::transport::{TcpTransport, Transport, TransportConfig, TransportError};
use tessera_cluster::{Address, MemberStatus};
use tessera_coordinator::host::EntityNote;
use tessera_coordinator::remember::{DdataRememberStore, JournalRememberStore, RememberStore};
use tessera_coordinator::runtime::{
    ENTITY_NOTE_QUEUE_CAPACITY, RememberEntitiesSetup, RuntimeSettings, ShardedType, Sharding,
    ShardingStartError,
};
use tessera_coordinator::settings::ShardingSettings;
use tessera_coordinator::store::{CoordinatorStoreFactory, DdataStoreFactory, JournalStoreFactory};
use tessera_coordinator::wire::RegionSnapshot;
use tessera_ddata::node::{ReplicatorHandle, ReplicatorSettings, ReplicatorStartError};
use tessera_ddata::replicator::ReplicatorConfig;
use tessera_entities::{ActiveEntityBudget, EntityConfig, EntityHost, InvalidConfig};
use tessera_entities::{EntityLifecycle, EntityType};
use tessera_journal::{FsyncPolicy, JournalConfig, JournalError, RocksJournal};
use tessera_metrics::LatencyFamily;
use tessera_persistence::{Persistence, PersistenceSettings, RocksReplicaStore};
use tessera_replication::{QuorumError, Quorums};
use tessera_snapshot::{RocksSnapshotStore, SnapshotConfig, SnapshotError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

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

/// The Cluster Bootstrap settings a node configuration implies; None when it has neither
/// contact points nor a discovery name (then it joins through its seed nodes, if any).
/// `http_port` is this node's real HTTP port, the default port of contact points from DNS.
pub fn bootstrap_config(config: &NodeConfig, http_port: u16) -> Option<BootstrapConfig> {
    let discovery = if let Some(name) = &config.discovery_dns {
        Discovery::Dns {
            name: name.clone(),
            server: config.discovery_dns_server,
            port: config.contact_point_port.unwrap_or(http_port),
        }
    } else if !config.contact_points.is_empty() {
        Discovery::Static(config.contact_points.clone())
    } else {
        return None;
    };
    Some(BootstrapConfig {
        discovery,
        settings: BootstrapSettings {
            required_contact_points: config.required_contact_points as usize,
            stable_margin: config.stable_margin,
            form_new_cluster: config.form_new_cluster,
            // A probe round is at most an interval of probing plus an interval of waiting.
            answer_max_age: config.bootstrap_probe_interval.saturating_mul(2),
        },
        probe_interval: config.bootstrap_probe_interval,
        shutdown_after_unsuccessful_join: config.shutdown_after_unsuccessful_join,
    })
}

/// Failure to start a node.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
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

/// A started node.
pub struct RunningNode {
    pub cluster: ClusterHandle,
    pub transport: Arc<TcpTransport>,
    /// The node's Distributed Data replica.
    pub replicator: ReplicatorHandle,
    /// Where the HTTP API listens (the real port when 0 was configured).
    pub http_address: SocketAddr,
    /// What Cluster Bootstrap is joining through, shown to other bootstrapping nodes.
    pub joining_via: JoiningVia,
    /// The entity types this node hosts.
    pub entities: Arc<EntityTypes>,
    /// The replicated journal and snapshot store the entities use.
    pub persistence: Arc<Persistence>,
    /// Cluster sharding of the entity types.
    pub sharding: Arc<Sharding<TcpTransport>>,
    singletons: Singletons<TcpTransport>,
    journal: Arc<RocksJournal>,
    http_shutdown: watch::Sender<bool>,
    http_task: JoinHandle<()>,
}

impl RunningNode {
    /// The cluster address this node is reachable at.
    pub fn cluster_address(&self) -> &Address {
        &self.transport.local().address
    }

    /// Leaves the cluster gracefully and shuts everything down; returns why the node stopped.
    ///
    /// First every shard of this node is handed off to the others (requests keep being
    /// served meanwhile, routed to wherever their shard goes); then the entities stop, while
    /// the node is still a member, so that the writes they accepted reach their replicas;
    /// then the node leaves.
    pub async fn leave_and_stop(self, timeout: Duration) -> Option<StopReason> {
        if !self.sharding.hand_off_all(HANDOFF_ALL_TIMEOUT).await {
            tracing::warn!(
                timeout = ?HANDOFF_ALL_TIMEOUT,
                "not every shard was handed off in time; leaving anyway"
            );
        }
        self.stop_http().await;
        self.stop_entities().await;
        let reason = self.cluster.leave_and_stop(timeout).await;
        self.stop().await;
        reason
    }

    /// Vanishes without leaving, as a killed process would (for benchmarks and tests).
    pub async fn kill(self) {
        self.cluster.abort();
        self.stop().await;
    }

    /// Stops taking HTTP requests and waits for the ones under way.
    async fn stop_http(&self) {
        let _ = self.http_shutdown.send(true);
    }

    /// Lets the entities finish what they accepted (their writes need the replicas, so this
    /// runs while the transport and the membership are still up).
    async fn stop_entities(&self) {
        if tokio::time::timeout(ENTITY_SHUTDOWN_TIMEOUT, self.entities.shutdown())
            .await
            .is_err()
        {
            tracing::warn!(
                timeout = ?ENTITY_SHUTDOWN_TIMEOUT,
                "entities did not stop in time; stopping the node anyway"
            );
        }
    }

    async fn stop(self) {
        // HTTP first, so no request is cut off by the services it uses stopping under it.
        self.stop_http().await;
        self.stop_entities().await;
        let RunningNode {
            cluster: _,
            transport,
            replicator,
            entities,
            persistence,
            sharding,
            singletons,
            journal,
            http_task,
            ..
        } = self;
        let _ = http_task.await;
        singletons.shutdown();
        sharding.stop().await;
        drop(sharding);
        drop(entities);
        if let Ok(persistence) = Arc::try_unwrap(persistence) {
            persistence.stop();
        }
        replicator.stop().await;
        transport.shutdown();
        // Release the journal (its writer finishes the queued writes) so the store closes
        // cleanly, once the replica service's and the writers' last tasks let go of it.
        let deadline = tokio::time::Instant::now() + ENTITY_SHUTDOWN_TIMEOUT;
        while Arc::strong_count(&journal) > 1 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        match Arc::try_unwrap(journal) {
            Ok(journal) => journal.close().await,
            Err(_) => tracing::warn!("the journal is still in use; it closes when released"),
        }
    }
}

/// The cluster protocol settings a node configuration implies.
pub fn cluster_core_config(config: &NodeConfig) -> ClusterCoreConfig {
    let membership = MembershipConfig {
        roles: config.roles.clone(),
        app_version: config.app_version.clone(),
        seed_nodes: config.seed_nodes.clone(),
        seed_node_timeout: config.seed_node_timeout,
        gossip_interval: config.gossip_interval,
        allow_weakly_up_after: Some(config.allow_weakly_up_after),
        ..MembershipConfig::default()
    };
    let heartbeat = HeartbeatConfig {
        interval: config.heartbeat_interval,
        monitored_by: config.monitored_by as usize,
        expected_response_after: config.heartbeat_interval,
        fd: FailureDetectorConfig {
            threshold: config.failure_detector_threshold,
            acceptable_heartbeat_pause: config.acceptable_heartbeat_pause,
            min_std_deviation: config.min_std_deviation,
            first_heartbeat_estimate: config.heartbeat_interval,
            ..FailureDetectorConfig::default()
        },
    };
    let strategy = match config.downing_strategy {
        DowningStrategy::KeepMajority => sbr::DowningStrategy::KeepMajority { role: None },
        DowningStrategy::StaticQuorum { quorum_size } => sbr::DowningStrategy::StaticQuorum {
            quorum_size: quorum_size as usize,
            role: None,
        },
        DowningStrategy::KeepOldest { down_if_alone } => sbr::DowningStrategy::KeepOldest {
            down_if_alone,
            role: None,
        },
        DowningStrategy::DownAll => sbr::DowningStrategy::DownAll,
    };
    ClusterCoreConfig {
        membership,
        heartbeat,
        downing: Some(DowningConfig {
            strategy,
            stable_after: config.stable_after,
        }),
    }
}

/// The Distributed Data settings a node configuration implies.
pub fn replicator_settings(config: &NodeConfig) -> ReplicatorSettings {
    let mut durable_keys = config.durable_keys.clone();
    if config.remember_entities != RememberEntities::Off {
        // Remembered entities survive a full cluster stop.
        durable_keys.push(tessera_coordinator::remember::DURABLE_KEY_PATTERN.to_string());
    }
    ReplicatorSettings {
        config: ReplicatorConfig {
            gossip_interval: config.gossip_interval,
            durable_keys,
            max_keys: usize::try_from(config.ddata_max_keys).unwrap_or(usize::MAX),
            max_value_bytes: usize::try_from(config.ddata_max_value_bytes).unwrap_or(usize::MAX),
            max_total_bytes: usize::try_from(config.ddata_max_total_bytes).unwrap_or(usize::MAX),
            ..ReplicatorConfig::default()
        },
        durable_dir: Some(config.data_dir.join("ddata")),
        ..ReplicatorSettings::default()
    }
}

/// The budget of active entities every entity type of a node shares
/// (`node_active_entity_limit`), or None without one.
pub fn node_entity_budget(config: &NodeConfig) -> Option<ActiveEntityBudget> {
    config
        .node_active_entity_limit()
        .and_then(|limit| ActiveEntityBudget::new(limit).ok())
}

/// The entity host settings a node configuration implies; `node_id` names this node
/// incarnation in the events it writes, and `budget` is the node's budget that every type
/// shares ([`node_entity_budget`]).
pub fn entity_config(
    config: &NodeConfig,
    node_id: String,
    budget: Option<ActiveEntityBudget>,
) -> EntityConfig {
    let defaults = EntityConfig::default();
    // Remembered entities keep running wherever their shard is (Akka turns automatic
    // passivation off with remember-entities): a passivated entity would be forgotten.
    let remember = config.remember_entities != RememberEntities::Off;
    let active_entity_limit = config.active_entity_limit().filter(|_| !remember);
    EntityConfig {
        snapshot_every: config.snapshot_every,
        passivate_after: (!config.passivate_after.is_zero() && !remember)
            .then_some(config.passivate_after),
        ask_timeout: config.entity_ask_timeout,
        node_id,
        // The limit is split over the host's routing partitions: never more partitions than
        // the limit allows an entity each.
        host_partitions: active_entity_limit.map_or(defaults.host_partitions, |limit| {
            defaults.host_partitions.min(limit.max(1))
        }),
        active_entity_limit,
        node_budget: budget.filter(|_| !remember),
        ..defaults
    }
}

/// The sharding settings of every entity type a node configuration implies.
pub fn sharding_settings(config: &NodeConfig) -> ShardingSettings {
    ShardingSettings {
        number_of_shards: config.number_of_shards,
        rebalance_interval: config.rebalance_interval,
        rebalance_absolute_limit: config.rebalance_absolute_limit as usize,
        rebalance_relative_limit: config.rebalance_relative_limit,
        handoff_timeout: config.handoff_timeout,
        buffer_size: config.shard_buffer_size as usize,
        ..ShardingSettings::default()
    }
}

/// The replicated journal's settings a node configuration implies: the quorums, and timeouts
/// below the entities' ask timeout, so that a caller hears whether its command took effect
/// rather than that the ask timed out.
/// The file in the data directory listing the journal stores this node has seen in the
/// cluster ([`tessera_persistence::known_stores`]).
pub const KNOWN_STORES_FILE: &str = "known-stores";

pub fn persistence_settings(config: &NodeConfig) -> Result<PersistenceSettings, NodeError> {
    let quorums = Quorums::new(
        config.journal_replication_factor as usize,
        config.journal_write_quorum as usize,
    )
    .map_err(NodeError::Quorums)?;
    let ask = config.entity_ask_timeout;
    let mut settings = PersistenceSettings::default();
    settings.writers.writer.quorums = quorums;
    settings.writers.writer.request_timeout = (ask / 3).min(Duration::from_secs(2));
    settings.writers.writer.operation_timeout = ask * 3 / 4;
    settings.writers.writer.recovery_timeout = ask * 3 / 4;
    // A node taking a log over may wait a whole lease before its recovery can finish.
    settings.writers.writer.read_lease = config.journal_read_lease.min(ask / 3);
    // A write must fit a transport frame, with room for the message around it.
    settings.max_write_bytes = (config.max_frame_size / 2).max(1024);
    settings.known_stores_path = Some(config.data_dir.join(KNOWN_STORES_FILE));
    Ok(settings)
}

/// Opens the journal (`<data_dir>/journal`) and snapshot store (`<data_dir>/snapshots`),
/// with `fsync` for both (a node fsyncs every acknowledged write): this node's replicas.
async fn open_stores(
    config: &NodeConfig,
    fsync: FsyncPolicy,
) -> Result<(Arc<RocksJournal>, Arc<RocksSnapshotStore>), NodeError> {
    let journal_path = config.data_dir.join("journal");
    let mut journal_config = JournalConfig::new(&journal_path);
    journal_config.fsync = fsync;
    let journal =
        RocksJournal::open(journal_config)
            .await
            .map_err(|source| NodeError::Journal {
                path: journal_path.display().to_string(),
                source,
            })?;
    let snapshots_path = config.data_dir.join("snapshots");
    let mut snapshots_config = SnapshotConfig::new(&snapshots_path);
    snapshots_config.fsync = fsync;
    let snapshots = RocksSnapshotStore::open(snapshots_config)
        .await
        .map_err(|source| NodeError::Snapshots {
            path: snapshots_path.display().to_string(),
            source,
        })?;
    Ok((Arc::new(journal), Arc::new(snapshots)))
}

/// The management API's settings a node configuration implies: the token, needed for reads
/// too when the API is reachable from other hosts, and the limits.
pub fn http_settings(config: &NodeConfig) -> http::HttpSettings {
    http::HttpSettings {
        token: config.http_token.as_ref().map(|t| t.expose().to_string()),
        token_required_for_reads: !crate::config::is_loopback(&config.http_host),
        header_timeout: config.http_header_timeout,
        request_timeout: config.http_request_timeout,
        max_concurrent_requests: config.http_max_concurrent_requests as usize,
        max_connections: config.http_max_connections as usize,
    }
}

/// The transport settings a node configuration implies.
pub fn transport_config(config: &NodeConfig) -> TransportConfig {
    TransportConfig {
        bind_address: config.cluster_address(),
        cluster_secret: config
            .cluster_secret
            .as_ref()
            .map(|s| s.expose().to_string()),
        max_frame_size_bytes: config.max_frame_size,
        max_peers: config.transport_max_peers as usize,
        max_inbound_connections: config.transport_max_inbound_connections as usize,
        max_inbound_handshakes: config.transport_max_inbound_handshakes as usize,
        handshake_timeout: config.transport_handshake_timeout,
        max_pending_requests: config.transport_max_pending_requests as usize,
        max_pending_requests_per_peer: config.transport_max_pending_requests_per_peer as usize,
        ..TransportConfig::default()
    }
}

/// Binds the transport and the HTTP API and starts the cluster protocols (joining through the
/// seed nodes, if configured).
pub async fn start(config: &NodeConfig) -> Result<RunningNode, NodeError> {
    start_with_fsync(config, FsyncPolicy::Always).await
}

/// [`start`] with the journal's and snapshot store's fsync policy given: only for `tessera
/// bench sharding`, which measures persisted commands with fsync `never` beside `always`. A
/// node always fsyncs; the policy is deliberately not a configuration key.
pub(crate) async fn start_with_fsync(
    config: &NodeConfig,
    fsync: FsyncPolicy,
) -> Result<RunningNode, NodeError> {
    let (journal, snapshots) = open_stores(config, fsync).await?;
    let transport = TcpTransport::bind(transport_config(config), rand::random()).await?;
    let cluster = tessera_cluster::node::start(transport.clone(), cluster_core_config(config))?;
    let replicator = tessera_ddata::node::start(
        transport.clone(),
        cluster.watch(),
        replicator_settings(config),
    )
    .await?;
    let persistence = Arc::new(Persistence::start(
        transport.clone(),
        cluster.watch(),
        RocksReplicaStore::new(journal.clone()),
        snapshots,
        journal.clone(),
        persistence_settings(config)?,
    )?);
    let mut entities = EntityTypes::new();
    // One budget for every entity type of the node.
    let budget = node_entity_budget(config);
    // Remember-entities hears every entity start and passivation of each type.
    let mut notes = std::collections::BTreeMap::new();
    let remember = config.remember_entities != RememberEntities::Off;
    let account = if remember {
        let (tx, rx) = tokio::sync::mpsc::channel(ENTITY_NOTE_QUEUE_CAPACITY);
        notes.insert(Account::TYPE_NAME, rx);
        EntityHost::start_with_listener(
            Account,
            persistence.journal.clone(),
            persistence.snapshots.clone(),
            entity_config(config, cluster.self_node().to_string(), budget.clone()),
            entity_notes(tx),
        )?
    } else {
        EntityHost::start(
            Account,
            persistence.journal.clone(),
            persistence.snapshots.clone(),
            entity_config(config, cluster.self_node().to_string(), budget.clone()),
        )?
    };
    entities.register(account);
    let entities = Arc::new(entities);
    let singletons = Singletons::start(transport.clone(), cluster.watch())?;
    let stores: Box<dyn CoordinatorStoreFactory> = match config.state_store_mode {
        StateStoreMode::Ddata => Box::new(DdataStoreFactory(replicator.clone())),
        StateStoreMode::Persistence => Box::new(JournalStoreFactory {
            journal: persistence.journal.clone(),
            snapshots: persistence.snapshots.clone(),
        }),
    };
    // Without the sharding role this node only routes: its region is a proxy.
    let hosts_entities = config
        .sharding_role
        .as_ref()
        .is_none_or(|role| config.roles.contains(role));
    let types = entities
        .hosts()
        .map(|(name, host)| ShardedType {
            type_name: name.to_string(),
            host: hosts_entities.then(|| {
                Arc::new(JsonShardHost(host.clone()))
                    as Arc<dyn tessera_coordinator::host::ShardHost>
            }),
            settings: sharding_settings(config),
            role: config.sharding_role.clone(),
            store: stores.store(name, remember),
            remember: notes.remove(name).filter(|_| hosts_entities).map(|notes| {
                RememberEntitiesSetup {
                    store: match config.remember_entities {
                        RememberEntities::Eventsourced => Arc::new(JournalRememberStore::new(
                            persistence.journal.clone(),
                            replicator.clone(),
                            name,
                        ))
                            as Arc<dyn RememberStore>,
                        _ => Arc::new(DdataRememberStore::new(replicator.clone(), name)),
                    },
                    notes,
                }
            }),
        })
        .collect();
    let sharding = Arc::new(Sharding::start(
        transport.clone(),
        cluster.watch(),
        &singletons,
        types,
        RuntimeSettings {
            // Beyond the entity's own timeout, so that its answer (or its timeout) arrives.
            ask_timeout: config.entity_ask_timeout + Duration::from_secs(1),
            coordinator_removal_margin: config.stable_after,
        },
    )?);
    let http_bind = format!("{}:{}", config.http_host, config.http_port);
    let listener = bind_http(&http_bind)
        .await
        .map_err(|source| NodeError::HttpBind {
            address: http_bind.clone(),
            source,
        })?;
    let http_address = listener
        .local_addr()
        .map_err(|source| NodeError::HttpBind {
            address: http_bind,
            source,
        })?;
    let http_server = http::HttpServer::new(http_settings(config));
    let entity_asks = LatencyFamily::new("type", sharding.type_names());
    let control = Arc::new(NodeControl {
        cluster: cluster.clone(),
        transport: transport.clone(),
        replicator: replicator.clone(),
        entities: entities.clone(),
        persistence: persistence.clone(),
        sharding: sharding.clone(),
        http_stats: http_server.stats(),
        journal: journal.clone(),
        entity_asks: entity_asks.clone(),
    });
    let sharded = Arc::new(ShardedEntities {
        sharding: sharding.clone(),
        cluster: cluster.clone(),
        ask_durations: entity_asks,
    });
    let (http_shutdown, mut shutdown_rx) = watch::channel(false);
    let joining_via = JoiningVia::default();
    let services = http::ddata::router(replicator.clone())
        .merge(http::entities::router(sharded.clone()))
        .merge(http::sharding::router(sharded))
        .merge(http::journal::router(persistence.journal.clone()))
        .merge(crate::bootstrap::router(
            cluster.watch(),
            cluster.self_node().address.clone(),
            joining_via.clone(),
        ))
        .merge(crate::dashboard::router(
            &cluster,
            &replicator,
            &sharding,
            shutdown_rx.clone(),
        ));
    let router = http_server.router(control, services);
    let http_task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = shutdown_rx.wait_for(|stop| *stop).await;
        };
        if let Err(e) = http_server.serve(listener, router, shutdown).await {
            tracing::error!(error = %e, "HTTP API stopped");
        }
    });
    Ok(RunningNode {
        cluster,
        transport,
        replicator,
        http_address,
        joining_via,
        entities,
        persistence,
        sharding,
        singletons,
        journal,
        http_shutdown,
        http_task,
    })
}

/// The entity host's lifecycle listener for remember-entities: starts and passivations, into a
/// bounded queue (it must not block the host; a full queue loses the note, see
/// [`ENTITY_NOTE_QUEUE_CAPACITY`]).
fn entity_notes(
    notes: tokio::sync::mpsc::Sender<EntityNote>,
) -> impl Fn(EntityLifecycle) + Send + Sync + 'static {
    move |event| {
        let note = match event {
            EntityLifecycle::Started { id } => EntityNote::Started(id.as_str().to_string()),
            EntityLifecycle::Stopped { id, reason } if reason.is_passivation() => {
                EntityNote::Passivated(id.as_str().to_string())
            }
            EntityLifecycle::Stopped { .. } => return,
        };
        if notes.try_send(note).is_err() {
            tracing::debug!("an entity note was lost: the remember-entities queue is full");
        }
    }
}

/// The HTTP API's face of cluster sharding: entity commands routed to their shard's node,
/// and the sharding queries.
struct ShardedEntities {
    sharding: Arc<Sharding<TcpTransport>>,
    cluster: ClusterHandle,
    /// How long asks of each sharded type took, for `/metrics`.
    ask_durations: LatencyFamily,
}

impl EntityBackend for ShardedEntities {
    fn ask(
        &self,
        entity_type: &str,
        id: &str,
        command: serde_json::Value,
    ) -> BoxFuture<'static, Result<serde_json::Value, CommandError>> {
        let sharding = self.sharding.clone();
        // None for a type that is not sharded here: it is refused, and adds no series.
        let ask_duration = self.ask_durations.get(entity_type).cloned();
        let entity_type = entity_type.to_string();
        let id = id.to_string();
        async move {
            let started = std::time::Instant::now();
            let payload = serde_json::to_vec(&command).map_err(|e| {
                CommandError::from(crate::http::ApiError::bad_request(e.to_string()))
            })?;
            let reply = sharding.ask(&entity_type, &id, payload).await;
            if let Some(histogram) = ask_duration {
                histogram.observe_since(started);
            }
            let reply = reply?;
            serde_json::from_slice(&reply).map_err(|e| CommandError {
                status: axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                message: format!("the entity's reply is not JSON: {e}"),
                outcome: "applied",
            })
        }
        .boxed()
    }
}

impl ShardingQueries for ShardedEntities {
    fn type_names(&self) -> Vec<String> {
        self.sharding
            .type_names()
            .into_iter()
            .map(str::to_string)
            .collect()
    }

    fn region_state(&self, entity_type: &str) -> BoxFuture<'static, Option<RegionSnapshot>> {
        let sharding = self.sharding.clone();
        let entity_type = entity_type.to_string();
        async move { sharding.region_state(&entity_type).await }.boxed()
    }

    fn cluster_state(
        &self,
        entity_type: &str,
    ) -> BoxFuture<'static, Vec<(Address, Result<RegionSnapshot, String>)>> {
        let sharding = self.sharding.clone();
        let entity_type = entity_type.to_string();
        let members: Vec<Address> = self
            .cluster
            .snapshot()
            .members
            .iter()
            .filter(|m| m.status != MemberStatus::Removed)
            .map(|m| m.address().clone())
            .collect();
        async move {
            sharding
                .cluster_state(&entity_type, members, CLUSTER_STATE_TIMEOUT)
                .await
        }
        .boxed()
    }
}

/// Connections the HTTP listener queues before accepting them (Linux caps it at
/// `net.core.somaxconn`). Bursts of a thousand clients, as entity commands bring, overflow
/// tokio's default of 1,024 on a busy machine and get their connections reset.
pub const HTTP_LISTEN_BACKLOG: u32 = 4_096;

/// Binds the HTTP API's listener on `address` (`host:port`) with [`HTTP_LISTEN_BACKLOG`].
async fn bind_http(address: &str) -> std::io::Result<tokio::net::TcpListener> {
    let mut last_error = None;
    for resolved in tokio::net::lookup_host(address).await? {
        let socket = if resolved.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(resolved) {
            Ok(()) => return socket.listen(HTTP_LISTEN_BACKLOG),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error
        .unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address to bind")))
}

/// Runs a node until SIGINT/SIGTERM (then leaves gracefully) or until the cluster ends its
/// membership. Returns the process exit status.
pub async fn run(config: NodeConfig) -> u8 {
    let node = match start(&config).await {
        Ok(node) => node,
        Err(e) => {
            tracing::error!(error = %e, "node failed to start");
            eprintln!("error: {e}");
            return 1;
        }
    };
    // A stable line on stdout that scripts and tests wait for.
    println!(
        "tessera node {} listening: cluster={} http={}",
        node.cluster.self_node(),
        node.cluster_address(),
        node.http_address
    );
    tracing::info!(
        node = %node.cluster.self_node(),
        http = %node.http_address,
        seeds = ?config.seed_nodes.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        "node started"
    );
    let cluster = node.cluster.clone();
    let bootstrap = match bootstrap_config(&config, node.http_address.port()) {
        Some(bootstrap) => {
            tracing::info!(discovery = ?bootstrap.discovery, "bootstrap: looking for a cluster to join or form");
            Some(tokio::spawn(crate::bootstrap::run(
                bootstrap,
                cluster.clone(),
                node.joining_via.clone(),
            )))
        }
        None => {
            if config.seed_nodes.is_empty() {
                tracing::warn!(
                    "no seed nodes and no contact points: this node waits to be joined. To form \
                     or join a cluster, give every node the same --contact-point HOST:HTTP_PORT \
                     list (or --discovery-dns NAME) for Cluster Bootstrap, or --seed HOST:PORT; \
                     or ask it with POST /cluster/join (tessera join ADDRESS)"
                );
            }
            None
        }
    };
    // Resolves only when bootstrapping ended without this node becoming a member.
    let bootstrap_failed = async move {
        match bootstrap {
            Some(task) => match task.await {
                Ok(Ok(())) => std::future::pending().await,
                Ok(Err(e)) => e,
                // A bootstrap that died must not leave the node waiting as a non-member.
                Err(e) => crate::bootstrap::BootstrapError::Crashed(e.to_string()),
            },
            None => std::future::pending().await,
        }
    };
    let reason = tokio::select! {
        signal = shutdown_signal() => {
            tracing::info!(signal, "shutting down: leaving the cluster");
            node.leave_and_stop(LEAVE_TIMEOUT).await
        }
        reason = cluster.stopped() => {
            node.stop().await;
            reason
        }
        error = bootstrap_failed => {
            tracing::error!(error = %error, "bootstrap failed; shutting down");
            eprintln!("error: {error}");
            node.kill().await;
            return EXIT_CODE_BOOTSTRAP_FAILED;
        }
    };
    match reason {
        Some(StopReason::Downed) => {
            tracing::warn!("this node was downed; exiting");
            EXIT_CODE_DOWNED
        }
        _ => {
            tracing::info!("node stopped");
            0
        }
    }
}

async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the node can still be stopped through the cluster.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

/// [`ClusterControl`] for the real cluster.
struct NodeControl {
    cluster: ClusterHandle,
    transport: Arc<TcpTransport>,
    replicator: ReplicatorHandle,
    entities: Arc<EntityTypes>,
    persistence: Arc<Persistence>,
    sharding: Arc<Sharding<TcpTransport>>,
    http_stats: Arc<http::HttpStats>,
    /// The local journal, for its fsync durations.
    journal: Arc<RocksJournal>,
    /// The entity ask durations [`ShardedEntities`] records.
    entity_asks: LatencyFamily,
}

impl NodeControl {
    fn submit(&self, operation: Operation) -> Result<(), ControlError> {
        self.cluster.submit(operation).map_err(|e| match e {
            ClusterError::Membership(
                tessera_cluster::membership::MembershipError::UnknownMember(a),
            ) => ControlError::UnknownMember(a),
            ClusterError::Membership(other) => ControlError::Conflict(other.to_string()),
            ClusterError::ShuttingDown => ControlError::ShuttingDown,
            ClusterError::Overloaded { .. } => ControlError::Overloaded,
        })
    }
}

impl ClusterControl for NodeControl {
    fn members(&self) -> MembersView {
        let snapshot = self.cluster.snapshot();
        MembersView {
            self_address: self.cluster.self_node().address.clone(),
            self_status: snapshot.self_status,
            leader: snapshot.leader.as_ref().map(|l| l.address.clone()),
            members: snapshot
                .members
                .iter()
                .map(|m| MemberView {
                    address: m.address().clone(),
                    uid: m.unique_address.uid,
                    status: m.status,
                    roles: m.roles.iter().cloned().collect(),
                    reachable: !snapshot.unreachable.contains(&m.unique_address),
                    up_number: m.up_number,
                })
                .collect(),
        }
    }

    fn join(&self, address: Address) -> Result<(), ControlError> {
        self.submit(Operation::Join(address))
    }

    fn leave(&self, address: Address) -> Result<(), ControlError> {
        self.submit(Operation::Leave(address))
    }

    fn down(&self, address: Address) -> Result<(), ControlError> {
        self.submit(Operation::Down(address))
    }

    fn not_ready_reason(&self) -> Option<String> {
        let waiting: Vec<&str> = self
            .sharding
            .region_gauges()
            .into_iter()
            .filter(|(_, gauges)| !gauges.registered)
            .map(|(name, _)| name)
            .collect();
        (!waiting.is_empty()).then(|| {
            format!(
                "the shard regions of {} are not registered with their coordinators yet",
                waiting.join(", ")
            )
        })
    }

    fn metrics(&self) -> NodeMetrics {
        let snapshot = self.cluster.snapshot();
        let transport = self.transport.metrics().snapshot();
        let ddata = self.replicator.counters();
        use std::sync::atomic::Ordering::Relaxed;
        let members_by_status = MemberStatus::ALL
            .iter()
            .map(|status| {
                let count = snapshot
                    .members
                    .iter()
                    .filter(|m| m.status == *status)
                    .count();
                (*status, count as u64)
            })
            .collect();
        NodeMetrics {
            members_by_status,
            unreachable_members: snapshot.unreachable.len() as u64,
            gossip_sent_total: snapshot.stats.gossip_sent,
            gossip_received_total: snapshot.stats.gossip_received,
            gossip_status_sent_total: snapshot.stats.gossip_status_sent,
            heartbeats_sent_total: snapshot.heartbeats_sent,
            heartbeat_responses_received_total: snapshot.heartbeat_responses_received,
            is_leader: snapshot.is_leader(),
            frames_in_total: transport.frames_in,
            frames_out_total: transport.frames_out,
            bytes_in_total: transport.bytes_in,
            bytes_out_total: transport.bytes_out,
            connections_accepted_total: transport.connections_accepted,
            connections_refused_total: RefusedConnections {
                auth: transport.connections_refused_auth,
                malformed: transport.connections_refused_malformed,
                oversize: transport.connections_refused_oversize,
                too_many_handshakes: transport.connections_refused_too_many_handshakes,
            },
            send_dropped_total: transport.send_dropped_queue_full,
            inbound_dropped_total: transport.inbound_dropped_queue_full
                + transport.inbound_unknown_service,
            request_timeouts_total: transport.request_timeouts,
            ddata_keys: ddata.keys.load(Relaxed),
            ddata_send_failures_total: ddata.send_failures.load(Relaxed),
            ddata_decode_errors_total: ddata.decode_errors.load(Relaxed),
            ddata_dropped_notifications_total: ddata.dropped_notifications.load(Relaxed),
            ddata_durable_failures_total: ddata.durable_failures.load(Relaxed),
            entity_types: self
                .entities
                .stats()
                .into_iter()
                .map(|(name, stats)| (name.to_string(), stats))
                .collect(),
            responses_wrong_peer_total: transport.responses_wrong_peer,
            journal: self.persistence.metrics.snapshot(),
            sharding: self.sharding_metrics(),
            sharding_counters: self.sharding.counters().snapshot(),
            transport_peers: transport.peers,
            sends_refused_too_many_peers_total: transport.send_dropped_too_many_peers,
            transport_inbound_connections: transport.inbound_connections,
            transport_inbound_handshakes: transport.inbound_handshakes,
            handshake_timeouts_total: transport.handshake_timeouts,
            transport_requests_pending: transport.requests_pending,
            transport_requests_pending_max_per_peer: self.transport.pending_requests_max_per_peer()
                as u64,
            requests_refused_too_many_pending_total: transport.requests_refused_too_many_pending,
            requests_refused_too_many_pending_for_peer_total: transport
                .requests_refused_too_many_pending_for_peer,
            ddata_bytes: ddata.bytes.load(Relaxed),
            ddata_refusals: ddata.refusals(),
            http: self.http_stats.snapshot(),
            latencies: http::Latencies {
                entity_asks: self.entity_asks.clone(),
                journal_appends: self.persistence.metrics.append_durations.clone(),
                journal_fsyncs: self.journal.fsync_durations().clone(),
                ddata: self.replicator.latencies().clone(),
            },
        }
    }
}

impl NodeControl {
    fn sharding_metrics(&self) -> Vec<crate::http::ShardingMetrics> {
        let coordinators: std::collections::BTreeMap<&str, _> =
            self.sharding.coordinator_gauges().into_iter().collect();
        self.sharding
            .region_gauges()
            .into_iter()
            .map(|(name, region)| {
                let coordinator = coordinators.get(name).cloned().unwrap_or_default();
                crate::http::ShardingMetrics {
                    entity_type: name.to_string(),
                    registered: region.registered,
                    shards: region.shards as u64,
                    buffered: region.buffered as u64,
                    region_handoffs_total: region.handoffs,
                    forwarded_total: region.forwarded,
                    refused_total: region.refused,
                    coordinator_running: coordinator.running,
                    coordinator_handoffs_total: coordinator.handoffs_completed,
                    coordinator_handoffs_given_up_total: coordinator.handoffs_given_up,
                    rebalance_rounds_total: coordinator.rebalance_rounds,
                    coordinator_writes_total: coordinator.writes,
                    coordinator_write_failures_total: coordinator.write_failures,
                }
            })
            .collect()
    }
}
