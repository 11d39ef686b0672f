//! The replicated journal and snapshot store of a cluster member: the book's snippet, included
//! from between the `ANCHOR:` markers (so it compiles).
//!
//! A single node on a free port of 127.0.0.1 forms a cluster of its own (so every log has one
//! replica, here), appends an event through `Persistence`, replays it, and inspects the log's
//! replicas: `cargo run --release --example replicated_journal`.

use bytes::Bytes;
use futures::StreamExt;
use std::time::Duration;
use tessera_cluster::core::ClusterCoreConfig;
use tessera_cluster::transport::{TcpTransport, Transport, TransportConfig};
use tessera_cluster::{Address, MemberStatus};
use tessera_journal::{AtomicWrite, Manifest, NewEvent};

/// Bound on the wait for the node to be Up, so that a broken build fails instead of hanging.
const WAIT_TIMEOUT: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!(
        "tessera-example-replicated-journal-{}",
        std::process::id()
    ));
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
    // Logs are placed on Up members: wait until this one is.
    let mut membership = cluster.watch();
    let is_up =
        |s: &tessera_cluster::node::ClusterSnapshot| s.self_status == Some(MemberStatus::Up);
    tokio::time::timeout(WAIT_TIMEOUT, membership.wait_for(is_up)).await??;
    let events = vec![NewEvent {
        sequence_nr: 1,
        timestamp_ms: 0,
        manifest: Manifest::new("order.Placed", 1),
        payload: Bytes::from_static(br#"{"total": 42}"#),
        tags: vec!["orders".to_string()],
    }];
    let write = AtomicWrite {
        persistence_id: "order-1".into(),
        writer_id: "w1".into(),
        events,
    };

    // ANCHOR: replicated_journal
    use std::sync::Arc;
    use tessera_journal::{Journal, JournalConfig, RocksJournal};
    use tessera_persistence::{Persistence, PersistenceSettings, RocksReplicaStore};
    use tessera_snapshot::{RocksSnapshotStore, SnapshotConfig};

    let journal = Arc::new(RocksJournal::open(JournalConfig::new(dir.join("journal"))).await?);
    let snapshots =
        Arc::new(RocksSnapshotStore::open(SnapshotConfig::new(dir.join("snapshots"))).await?);
    let replicas = RocksReplicaStore::new(journal.clone());
    let settings = PersistenceSettings::default();
    let persistence = Persistence::start(
        transport.clone(), // the cluster transport: it serves the replicas
        cluster.watch(),   // membership: logs are placed on the Up members
        replicas,          // this node's replicas of logs (its RocksDB journal)
        snapshots,         // and of snapshots
        journal.clone(),   // answers queries by tag and id over the logs held here
        settings,          // N = 3, W = 2, timeouts
    )?;
    // Err(Fenced | Unavailable): nothing was written; Err(OutcomeUnknown): it may have been.
    persistence.journal.append(write).await?;
    let inspection = persistence.journal.inspect("order-1").await; // configuration and replicas
    // ANCHOR_END: replicated_journal

    let mut replay = persistence.journal.replay("order-1", 1, u64::MAX, u64::MAX);
    while let Some(event) = replay.next().await {
        let event = event?;
        println!(
            "order-1 #{}: {}",
            event.sequence_nr, event.manifest.type_name
        );
    }
    drop(replay);
    for replica in &inspection.replicas {
        let last = replica.summary.as_ref().map(|summary| summary.last.seq);
        println!(
            "replica at {}: reachable {}, last sequence number {last:?}",
            replica.replica.address, replica.reachable
        );
    }
    assert_eq!(inspection.replicas.len(), 1);

    persistence.stop().await;
    let reason = cluster.leave_and_stop(WAIT_TIMEOUT).await;
    transport.shutdown();
    println!("left the cluster: {reason:?}");
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
