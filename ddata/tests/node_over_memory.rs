//! The Replicator's tokio driver with real cluster nodes over the in-memory transport, in
//! paused tokio time: quorum writes and reads through handles, subscriptions, and durable
//! keys across a restart.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tessera_cluster::core::ClusterCoreConfig;
use tessera_cluster::node::{self, ClusterHandle};
use tessera_cluster::transport::MemoryNetwork;
use tessera_cluster::{Address, MemberStatus};
use tessera_ddata::node::{ReplicatorHandle, ReplicatorSettings};
use tessera_ddata::replicator::{GetResult, ReplicatorConfig, UpdateResult};
use tessera_ddata::{PNCounter, ReadConsistency, ReplicatedValue, WriteConsistency};

const TIMEOUT: Duration = Duration::from_secs(3);
const MAJORITY_W: WriteConsistency = WriteConsistency::Majority { min_cap: 0 };
const MAJORITY_R: ReadConsistency = ReadConsistency::Majority { min_cap: 0 };

fn address(i: u16) -> Address {
    Address::new("10.2.0.1", 25520 + i)
}

async fn start(
    network: &Arc<MemoryNetwork>,
    i: u16,
    uid: u64,
    settings: ReplicatorSettings,
) -> (ClusterHandle, ReplicatorHandle) {
    let transport = network.bind(uid, address(i)).expect("bind");
    let mut config = ClusterCoreConfig::default();
    config.membership.seed_nodes = vec![address(0)];
    let cluster = node::start(transport.clone(), config).expect("start cluster");
    let replicator = tessera_ddata::node::start(transport, cluster.watch(), settings)
        .await
        .expect("start replicator");
    (cluster, replicator)
}

async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn all_up(handles: &[&ClusterHandle], n: usize) -> bool {
    handles.iter().all(|h| {
        let s = h.snapshot();
        s.members.len() == n && s.members.iter().all(|m| m.status == MemberStatus::Up)
    })
}

fn increment(
    current: Option<ReplicatedValue>,
    node: &tessera_cluster::UniqueAddress,
) -> Result<ReplicatedValue, String> {
    let mut counter = match current {
        None => PNCounter::new(),
        Some(ReplicatedValue::PNCounter(c)) => c,
        Some(other) => return Err(format!("not a counter: {}", other.kind())),
    };
    counter.increment(node, 1);
    Ok(counter.into())
}

fn counter(result: &GetResult) -> Option<i128> {
    match result {
        GetResult::Found(ReplicatedValue::PNCounter(c)) => Some(c.value()),
        _ => None,
    }
}

#[tokio::test(start_paused = true)]
async fn majority_writes_through_one_node_are_read_at_once_on_another() {
    let network = MemoryNetwork::new(3);
    let mut nodes = Vec::new();
    for i in 0..3 {
        nodes.push(
            start(
                &network,
                i,
                100 + u64::from(i),
                ReplicatorSettings::default(),
            )
            .await,
        );
    }
    let clusters: Vec<&ClusterHandle> = nodes.iter().map(|(c, _)| c).collect();
    wait_until("three members up", Duration::from_secs(30), || {
        all_up(&clusters, 3)
    })
    .await;
    // Let every replicator see the final membership.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut changes = nodes[2].1.subscribe("hits", 16).await.unwrap();
    for _ in 0..100 {
        let result = nodes[0]
            .1
            .update("hits", MAJORITY_W, TIMEOUT, |current, ctx| {
                increment(current, ctx.self_node)
            })
            .await
            .unwrap();
        assert_eq!(result, UpdateResult::Success);
    }
    let read = nodes[2].1.get("hits", MAJORITY_R, TIMEOUT).await.unwrap();
    assert_eq!(counter(&read), Some(100));
    // Each call was timed on the handle it went through, under its consistency level.
    let writes = tessera_metrics::to_text("writes", &nodes[0].1.latencies().writes);
    assert!(
        writes.contains("writes_count{consistency=\"majority\"} 100\n"),
        "{writes}"
    );
    assert!(
        writes.contains("writes_count{consistency=\"local\"} 0\n"),
        "{writes}"
    );
    let reads = tessera_metrics::to_text("reads", &nodes[2].1.latencies().reads);
    assert_eq!(tessera_metrics::count_in(&reads, "reads"), 1, "{reads}");
    assert!(
        reads.contains("reads_bucket{consistency=\"majority\",le=\"+Inf\"} 1\n"),
        "{reads}"
    );

    // The subscriber on node 2 ends up with the final value.
    let mut last = None;
    while let Ok(Some(change)) = tokio::time::timeout(Duration::from_secs(2), changes.recv()).await
    {
        last = change.value;
    }
    assert!(matches!(last, Some(ReplicatedValue::PNCounter(c)) if c.value() == 100));
    let page = nodes[1].1.keys(None, 10).await.unwrap();
    assert_eq!((page.keys, page.more), (vec!["hits".to_string()], false));
}

#[tokio::test(start_paused = true)]
async fn durable_keys_survive_a_restart_of_the_only_node() {
    let dir = tempfile::tempdir().unwrap();
    let settings = ReplicatorSettings {
        config: ReplicatorConfig {
            durable_keys: vec!["durable-*".into()],
            ..ReplicatorConfig::default()
        },
        durable_dir: Some(dir.path().join("ddata")),
        ..ReplicatorSettings::default()
    };
    let network = MemoryNetwork::new(5);
    let (cluster, replicator) = start(&network, 0, 1, settings.clone()).await;
    for key in ["durable-a", "volatile"] {
        for _ in 0..3 {
            let result = replicator
                .update(key, WriteConsistency::Local, TIMEOUT, |current, ctx| {
                    increment(current, ctx.self_node)
                })
                .await
                .unwrap();
            assert_eq!(result, UpdateResult::Success);
        }
    }
    replicator.stop().await;
    cluster.abort();
    drop(cluster);

    let network = MemoryNetwork::new(6);
    let (_cluster, replicator) = start(&network, 0, 2, settings).await;
    let durable = replicator
        .get("durable-a", ReadConsistency::Local, TIMEOUT)
        .await
        .unwrap();
    assert_eq!(counter(&durable), Some(3));
    let volatile = replicator
        .get("volatile", ReadConsistency::Local, TIMEOUT)
        .await
        .unwrap();
    assert_eq!(volatile, GetResult::NotFound);
}

#[tokio::test(start_paused = true)]
async fn majority_writes_of_durable_keys_are_acknowledged_through_the_durable_writers() {
    let dir = tempfile::tempdir().unwrap();
    let network = MemoryNetwork::new(7);
    let mut nodes = Vec::new();
    for i in 0..3 {
        let settings = ReplicatorSettings {
            config: ReplicatorConfig {
                durable_keys: vec!["durable-*".into()],
                ..ReplicatorConfig::default()
            },
            durable_dir: Some(dir.path().join(format!("node-{i}"))),
            ..ReplicatorSettings::default()
        };
        nodes.push(start(&network, i, 200 + u64::from(i), settings).await);
    }
    let clusters: Vec<&ClusterHandle> = nodes.iter().map(|(c, _)| c).collect();
    wait_until("three members up", Duration::from_secs(30), || {
        all_up(&clusters, 3)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Ten keys written at once from two nodes: the acknowledgements wait for the disks, the
    // Replicators' tasks do not.
    let mut updates = Vec::new();
    for (_, writer) in &nodes[..2] {
        for key in 0..10 {
            let replicator = writer.clone();
            updates.push(tokio::spawn(async move {
                replicator
                    .update(
                        &format!("durable-{key}"),
                        MAJORITY_W,
                        TIMEOUT,
                        |current, ctx| increment(current, ctx.self_node),
                    )
                    .await
            }));
        }
    }
    for update in updates {
        assert_eq!(update.await.unwrap().unwrap(), UpdateResult::Success);
    }
    for key in 0..10 {
        let read = nodes[2]
            .1
            .get(&format!("durable-{key}"), MAJORITY_R, TIMEOUT)
            .await
            .unwrap();
        assert_eq!(counter(&read), Some(2), "durable-{key}");
    }
    for (_, replicator) in &nodes {
        let counters = replicator.counters();
        // The third node is in no quorum the writes waited for: its disk writes may still be
        // on their writer thread, which runs in real time while this test's clock is paused.
        let real_deadline = std::time::Instant::now() + Duration::from_secs(30);
        while counters.durable_writes.load(Ordering::Relaxed) < 10
            && std::time::Instant::now() < real_deadline
        {
            std::thread::sleep(Duration::from_millis(5));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(counters.durable_failures.load(Ordering::Relaxed), 0);
        let writes = counters.durable_writes.load(Ordering::Relaxed);
        let commits = counters.durable_commits.load(Ordering::Relaxed);
        assert!(
            writes >= 10 && commits >= 1,
            "{writes} writes in {commits} commits"
        );
    }
}
