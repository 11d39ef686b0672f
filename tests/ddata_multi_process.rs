//! Distributed Data on real `tessera node` processes: majority writes read at once on
//! another node, majority writes with one node killed, a 504 with two killed while local
//! writes go on, and durable keys across a restart.

mod common;

use common::*;
use std::time::Duration;
use tessera_harness::demo::{self, NodeProcess};
use tessera_harness::http_client::{self, HttpResponse};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

async fn post(node: &NodeProcess, path: &str, body: &str) -> HttpResponse {
    http_client::request(node.http, "POST", path, Some(body), REQUEST_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}"))
}

async fn get(node: &NodeProcess, path: &str) -> HttpResponse {
    http_client::get(node.http, path, REQUEST_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

async fn start_nodes(dir: &std::path::Path, ports: &[u16]) -> Vec<NodeProcess> {
    let mut nodes = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        nodes.push(start_node(dir, ports[0], *port, i).await);
    }
    let all: Vec<&NodeProcess> = nodes.iter().collect();
    let n = ports.len();
    wait_views(&all, "all members up", |views| {
        views.iter().all(|v| {
            v.as_ref()
                .is_some_and(|(m, _)| m.len() == n && m.iter().all(|(_, s, r)| s == "up" && *r))
        })
    })
    .await;
    nodes
}

async fn start_node(dir: &std::path::Path, seed: u16, port: u16, i: usize) -> NodeProcess {
    let args = node_args(
        port,
        seed,
        &dir.join(format!("n{i}")),
        &["--durable-keys", "durable-*", "--log-level", "warn"],
    );
    demo::spawn_node(exe(), i + 1, &args, dir.join(format!("n{i}-{port}.log")))
        .await
        .expect("node starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_writes_are_read_at_once_and_survive_one_loss_but_not_two() {
    let dir = tempfile::tempdir().unwrap();
    let ports = [free_port(), free_port(), free_port()];
    let mut nodes = start_nodes(dir.path(), &ports).await;
    // Give every replicator the final membership (it follows the cluster's view).
    tokio::time::sleep(Duration::from_millis(500)).await;

    for _ in 0..100 {
        let r = post(
            &nodes[0],
            "/ddata/counter/hits?consistency=majority",
            r#"{"increment": 1}"#,
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let read = get(&nodes[2], "/ddata/counter/hits?consistency=majority").await;
    assert_eq!(read.status, 200, "{}", read.body);
    assert_eq!(
        read.json().unwrap(),
        serde_json::json!({"type": "counter", "key": "hits", "value": 100})
    );

    // One of three killed: a majority is still there.
    let mut third = nodes.pop().unwrap();
    third.child.start_kill().unwrap();
    let _ = third.child.wait().await;
    let r = post(
        &nodes[0],
        "/ddata/counter/hits?consistency=majority",
        r#"{"increment": 1}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);

    // Two of three killed: a majority write times out with 504, a local write succeeds.
    let mut second = nodes.pop().unwrap();
    second.child.start_kill().unwrap();
    let _ = second.child.wait().await;
    let r = post(
        &nodes[0],
        "/ddata/counter/hits?consistency=majority&timeout=1s",
        r#"{"increment": 1}"#,
    )
    .await;
    assert_eq!(r.status, 504, "{}", r.body);
    assert!(
        r.json().unwrap()["error"]
            .as_str()
            .unwrap()
            .contains("not enough replicas")
    );
    let r = post(
        &nodes[0],
        "/ddata/counter/hits?consistency=local",
        r#"{"increment": 1}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json().unwrap()["value"],
        103,
        "the timed-out write stayed applied"
    );
    let alive = get(&nodes[0], "/health/alive").await;
    assert_eq!(alive.status, 200, "the node keeps serving");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_keys_are_present_after_a_node_restart() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let node = start_nodes(dir.path(), &[port]).await.pop().unwrap();
    for key in ["durable-orders", "volatile", "durable-carts"] {
        for n in 0..3 {
            let r = post(
                &node,
                &format!("/ddata/set/{key}"),
                &format!(r#"{{"add": "o{n}"}}"#),
            )
            .await;
            assert_eq!(r.status, 200, "{}", r.body);
        }
    }
    let mut node = node;
    node.child.start_kill().unwrap();
    let _ = node.child.wait().await;

    let node = start_node(dir.path(), port, port, 0).await;
    let durable = get(&node, "/ddata/set/durable-orders").await;
    assert_eq!(durable.status, 200, "{}", durable.body);
    assert_eq!(
        durable.json().unwrap()["value"],
        serde_json::json!(["o0", "o1", "o2"])
    );
    let volatile = get(&node, "/ddata/set/volatile").await;
    assert_eq!(
        volatile.status, 404,
        "a key that is not durable is gone: {}",
        volatile.body
    );
    // The keys that are left, a page at a time, in order.
    let first = get(&node, "/ddata/keys?limit=1").await;
    assert_eq!(
        first.json().unwrap(),
        serde_json::json!({"keys": ["durable-carts"], "next": "durable-carts"}),
        "{}",
        first.body
    );
    let rest = get(&node, "/ddata/keys?after=durable-carts&limit=5").await;
    let mut rest_json = rest.json().unwrap();
    // Cluster sharding keeps its coordinator's state in Distributed Data too (not durable:
    // the restarted node may or may not have it back from the others yet).
    if let Some(keys) = rest_json["keys"].as_array_mut() {
        keys.retain(|k| !k.as_str().is_some_and(|k| k.starts_with("sharding-")));
    }
    assert_eq!(
        rest_json,
        serde_json::json!({"keys": ["durable-orders"], "next": null}),
        "{}",
        rest.body
    );
    let bad = get(&node, "/ddata/keys?limit=0").await;
    assert_eq!(bad.status, 400, "{}", bad.body);
}
