//! Clusters of real nodes in this process, on loopback, for the platform's tests.

use std::path::Path;
use std::time::Duration;
use tessera::config::{ClusterSecret, NodeConfig};
use tessera::{Node, NodeBuilder};
use tessera_cluster::MemberStatus;

/// How long a cluster may take to form, or a condition to hold, before the test fails.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The configuration of node `index` of a test cluster in `dir`, joining through `seed`.
pub fn node_config(
    dir: &Path,
    index: usize,
    secret: &ClusterSecret,
    seed: Option<&Node>,
) -> NodeConfig {
    NodeConfig {
        host: "127.0.0.1".into(),
        port: 0,
        http_host: "127.0.0.1".into(),
        http_port: 0,
        seed_nodes: seed
            .map(|s| s.cluster_address().clone())
            .into_iter()
            .collect(),
        data_dir: dir.join(format!("node-{index}")),
        cluster_secret: Some(secret.clone()),
        stable_after: Duration::from_secs(2),
        acceptable_heartbeat_pause: Duration::from_secs(1),
        rebalance_interval: Duration::from_secs(1),
        ..NodeConfig::default()
    }
}

/// Starts `size` nodes, each built by `build`, and waits until every node sees all Up with
/// their regions registered.
pub async fn start(
    dir: &Path,
    size: usize,
    build: impl Fn() -> NodeBuilder,
) -> (Vec<Node>, ClusterSecret) {
    let secret = ClusterSecret::new(format!("platform-{}", rand::random::<u64>()));
    let mut nodes: Vec<Node> = Vec::new();
    for index in 0..size {
        let config = node_config(dir, index, &secret, nodes.first());
        let node = build().start(&config).await.expect("node starts");
        if index == 0 {
            node.cluster
                .join(node.cluster_address().clone())
                .await
                .expect("the first node forms the cluster");
        }
        nodes.push(node);
    }
    wait_until("every node Up with its regions registered", || {
        all_up(&nodes, size)
    })
    .await;
    (nodes, secret)
}

/// Whether every node sees `size` members, all Up, and has its regions registered.
pub fn all_up(nodes: &[Node], size: usize) -> bool {
    nodes.iter().all(|node| {
        let snapshot = node.cluster.snapshot();
        snapshot.members.len() == size
            && snapshot
                .members
                .iter()
                .all(|m| m.status == MemberStatus::Up)
            && node.sharding.all_registered()
    })
}

/// Waits until `done` holds, or fails the test naming `what`.
pub async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + SETTLE_TIMEOUT;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {SETTLE_TIMEOUT:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
