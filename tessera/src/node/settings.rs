//! The settings of each part of a node, as its configuration implies them: one translator per
//! part, so that the start reads as the order of the parts.

use super::NodeError;
use crate::bootstrap::{BootstrapConfig, Discovery};
use crate::config::{DowningStrategy, NodeConfig};
use crate::entity_settings::ResolvedEntitySettings;
use crate::http;
use std::sync::Arc;
use std::time::Duration;
use tessera_cluster::bootstrap::BootstrapSettings;
use tessera_cluster::core::{ClusterCoreConfig, DowningConfig};
use tessera_cluster::failure_detector::FailureDetectorConfig;
use tessera_cluster::heartbeat::HeartbeatConfig;
use tessera_cluster::membership::MembershipConfig;
use tessera_cluster::sbr;
use tessera_cluster::transport::TransportConfig;
use tessera_coordinator::settings::ShardingSettings;
use tessera_ddata::node::ReplicatorSettings;
use tessera_ddata::replicator::ReplicatorConfig;
use tessera_entities::{ActiveEntityBudget, EntityConfig};
use tessera_journal::{FsyncPolicy, JournalConfig, RocksJournal};
use tessera_persistence::PersistenceSettings;
use tessera_replication::Quorums;
use tessera_snapshot::{RocksSnapshotStore, SnapshotConfig};

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

/// The Distributed Data settings a node configuration implies; `remembering` is whether any
/// entity type remembers its entities (their keys are then durable, so that they survive a
/// full cluster stop).
pub fn replicator_settings(config: &NodeConfig, remembering: bool) -> ReplicatorSettings {
    let mut durable_keys = config.durable_keys.clone();
    if remembering {
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

/// The entity host settings of a type with `settings`; `node_id` names this node incarnation
/// in the events it writes, and `budget` is the node's budget that every type shares
/// ([`node_entity_budget`]).
pub fn entity_config(
    settings: &ResolvedEntitySettings,
    node_id: String,
    budget: Option<ActiveEntityBudget>,
) -> EntityConfig {
    let defaults = EntityConfig::default();
    // Remembered entities keep running wherever their shard is (Akka turns automatic
    // passivation off with remember-entities): a passivated entity would be forgotten.
    let remember = settings.remembers();
    let active_entity_limit = settings.active_entity_limit().filter(|_| !remember);
    EntityConfig {
        snapshot_every: settings.snapshot_every,
        passivate_after: (!settings.passivate_after.is_zero() && !remember)
            .then_some(settings.passivate_after),
        ask_timeout: settings.entity_ask_timeout,
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

/// The sharding settings of a type with `settings`.
pub fn sharding_settings(settings: &ResolvedEntitySettings) -> ShardingSettings {
    ShardingSettings {
        number_of_shards: settings.number_of_shards,
        rebalance_interval: settings.rebalance_interval,
        rebalance_absolute_limit: settings.rebalance_absolute_limit as usize,
        rebalance_relative_limit: settings.rebalance_relative_limit,
        handoff_timeout: settings.handoff_timeout,
        buffer_size: settings.shard_buffer_size as usize,
        ..ShardingSettings::default()
    }
}

/// The file in the data directory listing the journal stores this node has seen in the
/// cluster ([`tessera_persistence::known_stores`]).
pub const KNOWN_STORES_FILE: &str = "known-stores";

/// The replicated journal's settings a node configuration implies: the quorums, and timeouts
/// below `ask` (the shortest ask timeout of the node's entity types), so that a caller hears
/// whether its command took effect rather than that the ask timed out.
pub fn persistence_settings(
    config: &NodeConfig,
    ask: Duration,
) -> Result<PersistenceSettings, NodeError> {
    let quorums = Quorums::new(
        config.journal_replication_factor as usize,
        config.journal_write_quorum as usize,
    )
    .map_err(NodeError::Quorums)?;
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
pub(super) async fn open_stores(
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
