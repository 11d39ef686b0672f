//! Cluster sharding of an entity type, wired as `tessera::node::start` wires it (without the
//! HTTP API): the README's "Library API" snippet between the `README:` markers (kept identical
//! to the README by `tests/readme_examples.rs`).
//!
//! A single node on a free port of 127.0.0.1 forms a cluster of its own, starts Distributed
//! Data, the replicated journal and the node's `account` entity host, shards `account`, and
//! deposits to `alice` through the shard region: `cargo run --release --example sharding`.

use std::sync::Arc;
use std::time::Duration;
use tessera::entities::account::Account;
use tessera_cluster::core::ClusterCoreConfig;
use tessera_cluster::node::ClusterSnapshot;
use tessera_cluster::transport::{TcpTransport, Transport, TransportConfig};
use tessera_cluster::{Address, MemberStatus};
use tessera_ddata::node::ReplicatorSettings;
use tessera_entities::{EntityConfig, EntityHost};
use tessera_journal::{JournalConfig, RocksJournal};
use tessera_persistence::{Persistence, PersistenceSettings, RocksReplicaStore};
use tessera_snapshot::{RocksSnapshotStore, SnapshotConfig};

/// Bound on the wait for the node to be Up and on its leave, so that a broken build fails
/// instead of hanging.
const WAIT_TIMEOUT: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("tessera-example-sharding-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // A cluster member, as in the `cluster_member` example: the only seed, so it joins itself.
    let transport = TcpTransport::bind(
        TransportConfig {
            bind_address: Address::new("127.0.0.1", 0),
            ..TransportConfig::default()
        },
        rand::random(),
    )
    .await?;
    let mut config = ClusterCoreConfig::default();
    config.membership.seed_nodes = vec![transport.local().address.clone()];
    let cluster = tessera_cluster::node::start(transport.clone(), config)?;
    let mut membership = cluster.watch();
    let is_up = |s: &ClusterSnapshot| s.self_status == Some(MemberStatus::Up);
    tokio::time::timeout(WAIT_TIMEOUT, membership.wait_for(is_up)).await??;
    // Distributed Data (the coordinator's state store here) and the replicated journal, as in
    // the `cluster_member` and `replicated_journal` examples.
    let replicator = tessera_ddata::node::start(
        transport.clone(),
        cluster.watch(),
        ReplicatorSettings::default(),
    )
    .await?;
    let journal = Arc::new(RocksJournal::open(JournalConfig::new(dir.join("journal"))).await?);
    let snapshots =
        Arc::new(RocksSnapshotStore::open(SnapshotConfig::new(dir.join("snapshots"))).await?);
    let persistence = Persistence::start(
        transport.clone(),
        cluster.watch(),
        RocksReplicaStore::new(journal.clone()),
        snapshots,
        journal.clone(),
        PersistenceSettings::default(),
    )?;
    // The node's `account` entity type (src/entities/account.rs), on the replicated journal.
    let account_host = Arc::new(EntityHost::start(
        Account,
        persistence.journal.clone(),
        persistence.snapshots.clone(),
        EntityConfig::default(),
    )?);

    // README: begin sharding
    use tessera::entities::JsonShardHost;
    use tessera_cluster::singleton::Singletons;
    use tessera_coordinator::runtime::{RuntimeSettings, ShardedType, Sharding};
    use tessera_coordinator::settings::ShardingSettings;
    use tessera_coordinator::store::DdataStore;

    let singletons = Singletons::start(transport.clone(), cluster.watch())?; // runs the coordinators
    let account = ShardedType {
        type_name: "account".into(),
        host: Some(Arc::new(JsonShardHost(account_host.clone()))), // None: a proxy that only routes
        settings: ShardingSettings::default(), // 1,000 shards, rebalance every 10 s...
        role: None,
        store: Arc::new(DdataStore::new(replicator.clone(), "account", false)), // or JournalStore
        remember: None,
    };
    let sharding = Sharding::start(
        transport.clone(),
        cluster.watch(),
        &singletons,
        vec![account],
        RuntimeSettings::default(),
    )?;
    // The entity's encoded reply, or an AskFailure: what went wrong, and whether it was applied.
    let reply = sharding
        .ask("account", "alice", br#"{"deposit": 5}"#.to_vec())
        .await?;
    // README: end sharding

    println!("alice: {}", String::from_utf8_lossy(&reply));
    let balance = account_host.ask("alice", tessera::entities::account::AccountCommand::Get);
    println!("alice, asked on this node's host: {:?}", balance.await?);

    // Stop as a node does: the entities finish what they accepted, the node leaves, then the
    // services stop and the journal closes.
    account_host.shutdown().await;
    let reason = cluster.leave_and_stop(WAIT_TIMEOUT).await;
    println!("left the cluster: {reason:?}");
    singletons.shutdown();
    sharding.stop().await;
    drop((sharding, account_host));
    persistence.stop();
    replicator.stop().await;
    transport.shutdown();
    // Close the journal (its writer finishes what is queued) once the replica service's and
    // the writers' last tasks have let go of it, as a node does, then remove the directory.
    for _ in 0..250 {
        if Arc::strong_count(&journal) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let journal = Arc::try_unwrap(journal).map_err(|_| "the journal is still in use")?;
    journal.close().await;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
