//! A cluster member inside a tokio program, and a Distributed Data counter on it: the book's
//! first two library snippets, included from between the `ANCHOR:` markers (so they compile).
//!
//! A single node on a free port of 127.0.0.1 that forms a cluster of its own, increments a
//! PNCounter, reads it back and leaves: `cargo run --release --example cluster_member`.

use tessera_cluster::MemberStatus;
use tessera_cluster::events::ClusterEvent;
use tessera_ddata::replicator::{GetResult, UpdateResult};

/// Bound on every wait of this example, so that a broken build fails instead of hanging.
const WAIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // ANCHOR: cluster_member
    use tessera_cluster::Address;
    use tessera_cluster::core::ClusterCoreConfig;
    use tessera_cluster::transport::{TcpTransport, Transport, TransportConfig};

    let transport = TcpTransport::bind(
        TransportConfig {
            bind_address: Address::new("127.0.0.1", 0), // port 0: any free port
            cluster_secret: Some("same-on-every-node".into()),
            ..TransportConfig::default()
        },
        rand::random(), // this incarnation's uid
    )
    .await?;
    let mut config = ClusterCoreConfig::default();
    // The first seed node forms the cluster by joining itself, the other nodes join through
    // the seeds (e.g. `vec!["10.0.0.1:25520".parse()?]`); here this node is the only seed.
    config.membership.seed_nodes = vec![transport.local().address.clone()];
    let cluster = tessera_cluster::node::start(transport.clone(), config)?;
    let (state, mut events) = cluster.subscribe().await?; // current state first, then changes
    // ANCHOR_END: cluster_member

    let self_node = cluster.self_node().clone();
    let up_in_state = state
        .members
        .iter()
        .any(|m| m.unique_address == self_node && m.status == MemberStatus::Up);
    if !up_in_state {
        tokio::time::timeout(WAIT_TIMEOUT, async {
            loop {
                match events.recv().await {
                    Ok(ClusterEvent::MemberUp(m)) if m.unique_address == self_node => return Ok(()),
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        })
        .await??;
    }
    println!("{self_node} is Up");

    // ANCHOR: ddata
    use std::time::Duration;
    use tessera_ddata::node::ReplicatorSettings;
    use tessera_ddata::{PNCounter, ReadConsistency, ReplicatedValue, WriteConsistency};

    let replicator = tessera_ddata::node::start(
        transport.clone(),
        cluster.watch(),
        ReplicatorSettings::default(),
    )
    .await?;
    let timeout = Duration::from_secs(3);
    let updated = replicator
        .update(
            "hits",
            WriteConsistency::Majority { min_cap: 0 },
            timeout,
            |current, ctx| {
                let mut counter = match current {
                    Some(ReplicatedValue::PNCounter(c)) => c,
                    None => PNCounter::new(),
                    Some(_) => return Err("hits is not a PNCounter".to_string()),
                };
                counter.increment(ctx.self_node, 1);
                Ok(counter.into())
            },
        )
        .await?; // UpdateResult::Success | Timeout | Deleted | Invalid(_) | Failed(_)
    let hits = replicator
        .get("hits", ReadConsistency::Majority { min_cap: 0 }, timeout)
        .await?; // GetResult::Found(value) | NotFound | Deleted | Timeout | Failed(_)
    let mut changes = replicator.subscribe("hits", 16).await?; // batched Change { key, value }
    // ANCHOR_END: ddata

    if updated != UpdateResult::Success {
        return Err(format!("the update of hits answered {updated:?}").into());
    }
    let GetResult::Found(ReplicatedValue::PNCounter(counter)) = hits else {
        return Err(format!("reading hits answered {hits:?}").into());
    };
    println!("hits = {}", counter.value());
    let change = tokio::time::timeout(WAIT_TIMEOUT, changes.recv())
        .await?
        .ok_or("the subscription ended")?;
    match change.value {
        Some(ReplicatedValue::PNCounter(counter)) => {
            println!("change of {}: {}", change.key, counter.value())
        }
        other => return Err(format!("unexpected change of hits: {other:?}").into()),
    }

    replicator.stop().await;
    let reason = cluster.leave_and_stop(WAIT_TIMEOUT).await;
    transport.shutdown();
    println!("left the cluster: {reason:?}");
    Ok(())
}
