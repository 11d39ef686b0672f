//! `tessera` as a client: every client command against a running
//! 3-node cluster whose nodes require a token for changes, its `--json` output parsed, and
//! a wrong token or an unreachable node reported clearly with a non-zero exit code.

mod common;

use common::{exe, free_port, test_dir, wait_up};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Output;
use std::time::Duration;
use tessera_harness::demo::{self, NodeProcess};

const TOKEN: &str = "cli-test-token-0123456789";

async fn tessera(args: &[&str]) -> Output {
    tokio::process::Command::new(exe())
        .args(args)
        .env_remove("TESSERA_NODE")
        .env_remove("TESSERA_TOKEN")
        .output()
        .await
        .expect("run tessera")
}

/// Runs a client command against `node` with the token; returns its stdout, failing the test
/// on a non-zero exit.
async fn ok(node: SocketAddr, args: &[&str]) -> String {
    let url = format!("http://{node}");
    let mut all = args.to_vec();
    all.extend(["--node", &url, "--token", TOKEN]);
    let output = tessera(&all).await;
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "tessera {all:?}: {:?}\nstdout: {stdout}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

async fn json(node: SocketAddr, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let text = ok(node, &all).await;
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {text}"))
}

async fn spawn(i: usize, ports: &[u16], dir: &Path) -> NodeProcess {
    let args = common::all_seeds_args(
        i,
        ports,
        dir,
        &["--http-token", TOKEN, "--stable-after", "2s"],
    );
    demo::spawn_node(exe(), i + 1, &args, dir.join(format!("n{i}.log")))
        .await
        .expect("node starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_client_command_works_against_a_three_node_cluster() {
    let _serial = common::one_at_a_time().await;
    let dir = test_dir();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut nodes = Vec::new();
    for i in 0..3 {
        nodes.push(spawn(i, &ports, dir.path()).await);
    }
    let refs: Vec<&NodeProcess> = nodes.iter().collect();
    wait_up(&refs, 3).await;
    let http = nodes[0].http;

    // members: a table for people, JSON for scripts.
    let table = ok(http, &["members"]).await;
    assert!(table.starts_with("ADDRESS"), "{table}");
    for node in &nodes {
        assert!(table.contains(&node.cluster), "{table}");
    }
    let members = json(http, &["members"]).await;
    assert_eq!(members["members"].as_array().map(Vec::len), Some(3));

    // entity and shards.
    let reply = json(http, &["entity", "account", "alice", r#"{"deposit": 5}"#]).await;
    assert_eq!(reply["balance"], 5);
    let reply = json(http, &["entity", "account", "alice", r#"{"get": null}"#]).await;
    assert_eq!(reply["balance"], 5);
    let shards = json(http, &["shards", "account"]).await;
    let entities: u64 = shards["regions"]
        .as_array()
        .expect("regions")
        .iter()
        .flat_map(|r| r["shards"].as_array().cloned().unwrap_or_default())
        .filter_map(|s| s["entities"].as_u64())
        .sum();
    assert_eq!(entities, 1, "{shards}");
    assert!(ok(http, &["shards", "account"]).await.contains("REGION"));

    // ddata update, get, delete.
    let updated = json(
        http,
        &[
            "ddata",
            "update",
            "counter",
            "hits",
            r#"{"increment": 3}"#,
            "--consistency",
            "majority",
        ],
    )
    .await;
    assert_eq!(updated["value"], 3, "{updated}");
    let read = json(
        nodes[1].http,
        &[
            "ddata",
            "get",
            "counter",
            "hits",
            "--consistency",
            "majority",
        ],
    )
    .await;
    assert_eq!(read["value"], 3, "{read}");
    ok(http, &["ddata", "delete", "counter", "hits"]).await;

    // A refused command: exit 5 and the node's reason.
    let url = format!("http://{http}");
    let output = tessera(&[
        "entity",
        "account",
        "alice",
        r#"{"withdraw": 50}"#,
        "--node",
        &url,
        "--token",
        TOKEN,
    ])
    .await;
    assert_eq!(output.status.code(), Some(5), "{output:?}");

    // A wrong token: exit 4, says so, and changes nothing.
    let output = tessera(&[
        "leave",
        &nodes[2].cluster,
        "--node",
        &url,
        "--token",
        "wrong-token-0123456789",
    ])
    .await;
    assert_eq!(output.status.code(), Some(4), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("token"), "{stderr}");
    assert_eq!(
        json(http, &["members"]).await["members"]
            .as_array()
            .map(Vec::len),
        Some(3)
    );

    // An unreachable node: exit 3, says how to fix it.
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let output = tessera(&["members", "--node", &nowhere]).await;
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot reach the node"));

    // leave: node 3 leaves and exits.
    ok(http, &["leave", &nodes[2].cluster]).await;
    let mut third = nodes.pop().expect("three nodes");
    let exit = tokio::time::timeout(Duration::from_secs(60), third.child.wait())
        .await
        .expect("the leaving node exits")
        .expect("exit status");
    assert!(exit.success(), "{exit:?}");

    // down: node 2 is killed, then downed by the operator.
    let mut second = nodes.pop().expect("two nodes");
    common::kill(&mut second).await;
    ok(http, &["down", &second.cluster]).await;
    let refs: Vec<&NodeProcess> = nodes.iter().collect();
    wait_up(&refs, 1).await;

    // join: a fresh node without seeds joins through the client.
    let port = free_port();
    let args = common::base_args(
        "127.0.0.1",
        port,
        0,
        &dir.path().join("n9"),
        &["--http-token", TOKEN],
    );
    let fresh = demo::spawn_node(exe(), 9, &args, dir.path().join("n9.log"))
        .await
        .expect("fresh node starts");
    let joined = json(fresh.http, &["join", &nodes[0].cluster]).await;
    assert!(joined["status"].is_string(), "{joined}");
    let refs: Vec<&NodeProcess> = vec![&nodes[0], &fresh];
    wait_up(&refs, 2).await;
}
