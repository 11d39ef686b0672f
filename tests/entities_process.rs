//! Entities in real `tessera node` processes: 1,000 concurrent deposits over HTTP survive a
//! SIGKILL and a graceful restart (with snapshots every 100 events) on the same data
//! directory, and a withdrawal larger than the balance is a 409 that persists nothing.
//!
//! Deadlines only bound how long a test may hang; nothing here asserts a timing.

mod common;

use common::{SECRET, exe, free_port};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tessera_harness::demo::{self, NodeProcess};
use tessera_harness::http_client::{self, HttpResponse};

const DEPOSITS: u64 = 1_000;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// Starts a single node on loopback with its state in `data`: a cluster of one, its own seed
/// (entities live on the replicated journal of a cluster member).
async fn start(dir: &Path, data: &Path, run: usize, extra: &[&str]) -> NodeProcess {
    let port = free_port();
    let mut args: Vec<String> = [
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--seed",
        &format!("127.0.0.1:{port}"),
        "--http-port",
        "0",
        "--data-dir",
        &data.display().to_string(),
        "--cluster-secret",
        SECRET,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    let node = demo::spawn_node(exe(), run, &args, dir.join(format!("node-{run}.log")))
        .await
        .expect("node starts");
    wait_ready(node.http).await;
    node
}

/// Waits until the node is an Up member (it joins itself as its own seed).
async fn wait_ready(http: SocketAddr) {
    let deadline = std::time::Instant::now() + REQUEST_TIMEOUT;
    loop {
        let ready = http_client::get(http, "/health/ready", Duration::from_secs(5)).await;
        if ready.is_ok_and(|r| r.status == 200) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{http} never became ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn command(http: SocketAddr, id: &str, body: &str) -> HttpResponse {
    http_client::request(
        http,
        "POST",
        &format!("/entities/account/{id}"),
        Some(body),
        REQUEST_TIMEOUT,
    )
    .await
    .unwrap_or_else(|e| panic!("POST {body} to account/{id}: {e}"))
}

async fn balance(http: SocketAddr, id: &str) -> u64 {
    let response = command(http, id, r#"{"get": null}"#).await;
    assert_eq!(response.status, 200, "{}", response.body);
    response.json().expect("JSON reply")["balance"]
        .as_u64()
        .unwrap_or_else(|| panic!("no balance in {}", response.body))
}

/// `DEPOSITS` concurrent `{"deposit": 1}`, all of which must be answered 200.
async fn deposit_concurrently(http: SocketAddr, id: &str) {
    let mut requests = Vec::new();
    for _ in 0..DEPOSITS {
        let id = id.to_string();
        requests.push(tokio::spawn(async move {
            command(http, &id, r#"{"deposit": 1}"#).await
        }));
    }
    let mut balances = Vec::new();
    for request in requests {
        let response = request.await.expect("request task");
        assert_eq!(response.status, 200, "{}", response.body);
        balances.push(
            response.json().expect("JSON")["balance"]
                .as_u64()
                .expect("balance"),
        );
    }
    // Each deposit answered with the balance right after it: all distinct, 1..=N.
    balances.sort_unstable();
    assert_eq!(balances, (1..=DEPOSITS).collect::<Vec<_>>());
}

async fn wait_exit(node: &mut NodeProcess) -> std::process::ExitStatus {
    tokio::time::timeout(EXIT_TIMEOUT, node.child.wait())
        .await
        .expect("node exits in time")
        .expect("wait for node")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deposits_survive_sigkill_and_graceful_restart_and_overdrafts_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");

    // 1,000 concurrent deposits, then SIGKILL: every acknowledged deposit was fsynced.
    let mut node = start(dir.path(), &data, 1, &[]).await;
    deposit_concurrently(node.http, "alice").await;
    node.child.start_kill().expect("SIGKILL");
    let _ = wait_exit(&mut node).await;

    let mut node = start(dir.path(), &data, 2, &[]).await;
    assert_eq!(balance(node.http, "alice").await, DEPOSITS);

    // An overdraft is refused with 409 and a message, and changes nothing.
    let refused = command(node.http, "alice", r#"{"withdraw": 5000}"#).await;
    assert_eq!(refused.status, 409, "{}", refused.body);
    assert_eq!(
        refused.json().expect("JSON")["error"],
        "insufficient funds: cannot withdraw 5000 from a balance of 1000"
    );
    assert_eq!(balance(node.http, "alice").await, DEPOSITS);
    let ok = command(node.http, "alice", r#"{"withdraw": 1}"#).await;
    assert_eq!((ok.status, ok.body.as_str()), (200, r#"{"balance":999}"#));
    node.child.start_kill().expect("SIGKILL");
    let _ = wait_exit(&mut node).await;

    // Snapshots every 100 events, a graceful stop (SIGTERM), a restart on the same directory.
    let mut node = start(dir.path(), &data, 3, &["--snapshot-every", "100"]).await;
    assert_eq!(
        balance(node.http, "alice").await,
        DEPOSITS - 1,
        "nothing persisted by the 409"
    );
    deposit_concurrently(node.http, "carol").await;
    demo::terminate(&node.child);
    let status = wait_exit(&mut node).await;
    assert!(
        status.success(),
        "a node stopping on SIGTERM exits 0, got {status}"
    );
    let snapshots = std::fs::read_dir(data.join("snapshots")).expect("snapshot store exists");
    assert!(snapshots.count() > 0);

    let node = start(dir.path(), &data, 4, &["--snapshot-every", "100"]).await;
    assert_eq!(balance(node.http, "carol").await, DEPOSITS);
    assert_eq!(balance(node.http, "alice").await, DEPOSITS - 1);

    // Bad requests name the problem.
    let unknown = http_client::request(
        node.http,
        "POST",
        "/entities/cart/1",
        Some(r#"{"get": null}"#),
        REQUEST_TIMEOUT,
    )
    .await
    .expect("request");
    assert_eq!(unknown.status, 400, "{}", unknown.body);
    assert!(
        unknown.body.contains("unknown entity type"),
        "{}",
        unknown.body
    );
    let malformed = command(node.http, "alice", r#"{"deposit": "lots"}"#).await;
    assert_eq!(malformed.status, 400, "{}", malformed.body);
    assert!(
        malformed.body.contains("invalid command"),
        "{}",
        malformed.body
    );

    // The node's metrics count the account entities it started (carol and alice).
    let metrics = http_client::request(node.http, "GET", "/metrics", None, REQUEST_TIMEOUT)
        .await
        .expect("metrics");
    let value = |series: &str| -> u64 {
        metrics
            .body
            .lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{series} missing:\n{}", metrics.body))
    };
    let started = value("tessera_entities_started_total{type=\"account\"}");
    let live = value("tessera_entities_live{type=\"account\"}");
    assert!(started >= 2 && live <= started, "{}", metrics.body);
}
