//! Sharded daemon processes over three real nodes: every instance runs exactly once, spread
//! over the nodes; the count changes at runtime; instances move with a graceful leave and
//! start elsewhere when their node dies.

use crate::cluster::{self, wait_until};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tessera::{DaemonContext, DaemonSettings, NodeBuilder, NodeHandle};

/// Which node runs each instance, with the count of its run, and any moment two ran at once.
#[derive(Default)]
struct Runs {
    live: BTreeMap<u32, Vec<(String, u32)>>,
    overlaps: Vec<String>,
    started: usize,
}

type Shared = Arc<Mutex<Runs>>;

/// Removes its run from the registry however the run ends (returned, or aborted).
struct Live {
    runs: Shared,
    index: u32,
    node: String,
}

impl Drop for Live {
    fn drop(&mut self) {
        let mut runs = self.runs.lock().unwrap();
        if let Some(live) = runs.live.get_mut(&self.index)
            && let Some(at) = live.iter().position(|(node, _)| *node == self.node)
        {
            live.remove(at);
        }
    }
}

fn builder(runs: &Shared) -> NodeBuilder {
    let runs = runs.clone();
    let settings = DaemonSettings {
        keep_alive_interval: Duration::from_millis(200),
        ..DaemonSettings::default()
    };
    NodeBuilder::new().daemon_with(
        "worker",
        4,
        settings,
        move |context: DaemonContext, node: NodeHandle| {
            let runs = runs.clone();
            async move {
                let me = node.cluster_address().to_string();
                {
                    let mut all = runs.lock().unwrap();
                    all.started += 1;
                    let live = all.live.entry(context.index()).or_default();
                    live.push((me.clone(), context.count()));
                    if live.len() > 1 {
                        let overlap = format!("instance {} on {live:?}", context.index());
                        all.overlaps.push(overlap);
                    }
                }
                let _live = Live {
                    runs: runs.clone(),
                    index: context.index(),
                    node: me,
                };
                context.stopped().await;
            }
        },
    )
}

/// Whether instances `0..count` each run once, with `count`, and no other runs.
fn running_exactly(runs: &Shared, count: u32) -> bool {
    let runs = runs.lock().unwrap();
    let live: Vec<_> = runs.live.iter().filter(|(_, v)| !v.is_empty()).collect();
    live.len() == count as usize
        && live
            .iter()
            .enumerate()
            .all(|(i, (index, on))| **index == i as u32 && on.len() == 1 && on[0].1 == count)
}

fn nodes_running(runs: &Shared) -> BTreeMap<String, usize> {
    let mut by_node = BTreeMap::new();
    for (node, _) in runs.lock().unwrap().live.values().flatten() {
        *by_node.entry(node.clone()).or_insert(0) += 1;
    }
    by_node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_instances_run_once_each_follow_their_count_and_move_on_a_leave() {
    let dir = tempfile::tempdir().unwrap();
    let runs = Shared::default();
    let (mut nodes, _) = cluster::start(dir.path(), 3, || builder(&runs)).await;
    // The first node may have allocated every shard before the others joined; rebalancing
    // spreads them (each instance has a shard of its own): 2, 1, 1.
    wait_until("instances 0..4 running once each, on every node", || {
        running_exactly(&runs, 4) && nodes_running(&runs).len() == 3
    })
    .await;
    let here: usize = nodes
        .iter()
        .map(|n| n.daemon_instances("worker").len())
        .sum();
    assert_eq!(here, 4);

    nodes[1]
        .handle()
        .set_daemon_count("worker", 6)
        .await
        .unwrap();
    wait_until("instances 0..6 running once each with count 6", || {
        running_exactly(&runs, 6)
    })
    .await;
    for node in &nodes {
        assert_eq!(node.handle().daemon_count("worker").unwrap(), 6);
    }
    nodes[2]
        .handle()
        .set_daemon_count("worker", 2)
        .await
        .unwrap();
    wait_until("instances 0..2 running once each with count 2", || {
        running_exactly(&runs, 2)
    })
    .await;

    // Bad counts and names are refused by name.
    let zero = nodes[0]
        .handle()
        .set_daemon_count("worker", 0)
        .await
        .unwrap_err();
    assert!(
        zero.to_string().contains("count 0 is out of range"),
        "{zero}"
    );
    let unknown = nodes[0].handle().daemon_count("nope").unwrap_err();
    assert!(unknown.to_string().contains("\"worker\""), "{unknown}");

    // The node running instance 0 leaves: it moves to another node.
    let holder = nodes
        .iter()
        .position(|n| n.daemon_instances("worker").contains(&0))
        .expect("a node runs instance 0");
    let leaving = nodes.remove(holder);
    let left = leaving.cluster_address().to_string();
    leaving.shutdown().await;
    wait_until("instances 0..2 running once each after a leave", || {
        running_exactly(&runs, 2)
            && runs
                .lock()
                .unwrap()
                .live
                .values()
                .flatten()
                .all(|(node, _)| *node != left)
    })
    .await;
    assert!(
        runs.lock().unwrap().overlaps.is_empty(),
        "{:?}",
        runs.lock().unwrap().overlaps
    );
    for node in nodes {
        node.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_instances_of_a_killed_node_start_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let runs = Shared::default();
    let (mut nodes, _) = cluster::start(dir.path(), 3, || builder(&runs)).await;
    wait_until("instances 0..4 running once each", || {
        running_exactly(&runs, 4)
    })
    .await;
    let busiest = (0..nodes.len())
        .max_by_key(|i| nodes[*i].daemon_instances("worker").len())
        .unwrap();
    let killed = nodes.remove(busiest);
    let gone = killed.cluster_address().to_string();
    killed.kill().await;
    wait_until("instances 0..4 running once each on the two others", || {
        running_exactly(&runs, 4)
            && runs
                .lock()
                .unwrap()
                .live
                .values()
                .flatten()
                .all(|(node, _)| *node != gone)
    })
    .await;
    assert!(
        runs.lock().unwrap().overlaps.is_empty(),
        "{:?}",
        runs.lock().unwrap().overlaps
    );
    for node in nodes {
        node.shutdown().await;
    }
}
