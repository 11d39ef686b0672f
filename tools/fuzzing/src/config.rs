//! Target of what an operator gives the node: its TOML config file.

use std::path::Path;
use tessera::config::{ConfigLayer, NodeConfig};

/// Target `config_file`: a config file's text, parsed, stacked under an empty layer (as flags
/// and the environment are stacked on it), and validated into a node's configuration.
/// `http_token_file` is left out: it names a file to read, which a fuzzer must not choose.
pub fn config_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(mut layer) = ConfigLayer::from_toml(text, Path::new("fuzz.toml")) else {
        return;
    };
    layer.http_token_file = None;
    // Compared as text: a file may hold `nan`, which equals nothing.
    let stacked = layer.clone().overridden_by(ConfigLayer::default());
    assert_eq!(
        format!("{stacked:?}"),
        format!("{layer:?}"),
        "stacking an empty layer changed the file's"
    );
    if let Ok(config) = NodeConfig::from_layer(layer) {
        let _ = config.warnings();
        let _ = config.cluster_address();
        let _ = config.active_entity_limit();
    }
}

/// Valid encodings the targets' corpora start from.
pub mod seeds {
    /// Seeds of `config_file`: every key with a valid value, the lists as arrays and as text,
    /// and the other downing strategies.
    pub fn config_file() -> Vec<Vec<u8>> {
        [
            r#"host = "10.0.0.1"
port = 25520
http_host = "127.0.0.1"
http_port = 8558
seed_nodes = ["10.0.0.1:25520", "10.0.0.2:25520"]
data_dir = "/var/lib/tessera"
roles = ["backend", "frontend"]
cluster_secret = "s3cret"
stable_after = "20s"
heartbeat_interval = "1s"
gossip_interval = "1s"
seed_node_timeout = "5s"
allow_weakly_up_after = "7s"
monitored_by = 5
failure_detector_threshold = 8.0
acceptable_heartbeat_pause = "3s"
min_std_deviation = "100ms"
downing_strategy = "keep-majority"
max_frame_size = 4194304
app_version = "1.2.3"
log_format = "json"
log_level = "info"
durable_keys = ["orders-*", "config"]
snapshot_every = 100
passivate_after = "2m"
entity_ask_timeout = "5s"
journal_replication_factor = 3
journal_write_quorum = 2
journal_read_lease = "2s"
state_store_mode = "persistence"
remember_entities = "eventsourced"
number_of_shards = 1000
rebalance_interval = "10s"
rebalance_absolute_limit = 20
rebalance_relative_limit = 0.1
handoff_timeout = "1m"
active_entity_limit = 100000
shard_buffer_size = 100000
sharding_role = "backend"
http_token = "token"
http_header_timeout = "10s"
http_request_timeout = "30s"
http_max_concurrent_requests = 4096
http_max_connections = 4096
"#,
            r#"seed_nodes = "10.0.0.1:25520, 10.0.0.2:25520"
downing_strategy = "static-quorum"
quorum_size = "2"
port = "25521"
"#,
            r#"contact_points = ["10.0.0.1:8558", "10.0.0.2:8558"]
required_contact_points = 2
stable_margin = "5s"
form_new_cluster = false
bootstrap_probe_interval = "1s"
shutdown_after_unsuccessful_join = "off"
downing_strategy = "keep-oldest"
down_if_alone = true
"#,
            r#"discovery_dns = "_http._tcp.tessera.local"
discovery_dns_server = "10.0.0.53:53"
contact_point_port = 8558
downing_strategy = "down-all"
"#,
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect()
    }
}
