//! Helpers for tests that run real `tessera node` processes on 127.0.0.1.
#![allow(dead_code)]

pub mod deposits;
pub mod memory;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use tessera_harness::demo::{self, NodeProcess, View};
use tessera_harness::http_client;

pub const DEADLINE: Duration = Duration::from_secs(45);
pub const SECRET: &str = "multi-process-test-secret";

pub fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tessera"))
}

/// Held by a test for its whole run, so that the multi-node tests of one binary run one
/// after another: three node processes each on two cores are load enough, and an answer
/// that times out under the load of other tests' nodes says nothing about the test's own.
pub async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

/// A directory for one test's nodes, removed afterwards unless `TESSERA_KEEP_TEST_DIRS` is
/// set (then its path is printed, for reading the node logs of a failed run).
pub fn test_dir() -> tempfile::TempDir {
    let mut dir = tempfile::tempdir().expect("tempdir");
    if std::env::var_os("TESSERA_KEEP_TEST_DIRS").is_some() {
        dir.disable_cleanup(true);
        println!("test directory kept: {}", dir.path().display());
    }
    dir
}

/// Ports handed out below the kernel's ephemeral range (32768 and up on Linux): a port the
/// OS picks for `:0` may meanwhile become the local port of one of the tests' many outgoing
/// HTTP connections, and the node that was to listen on it then fails to start.
const TEST_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// A port that was free a moment ago, for nodes that must know their seed's address before
/// it starts: outside the ephemeral range, never the same twice in one test process.
pub fn free_port() -> u16 {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU32, Ordering};
    static OFFSET: OnceLock<u32> = OnceLock::new();
    static HANDED_OUT: AtomicU32 = AtomicU32::new(0);
    let span = u32::from(TEST_PORTS.end - TEST_PORTS.start);
    // A random start, so that test processes run one after another rarely meet.
    let offset = *OFFSET.get_or_init(|| rand::random_range(0..span));
    for _ in 0..span {
        let n = HANDED_OUT.fetch_add(1, Ordering::Relaxed);
        let port = TEST_PORTS.start + ((offset + n) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {TEST_PORTS:?}");
}

/// A node on `host` with cluster port `port` and HTTP port `http_port` (0: any), its data in
/// `data`, the tests' cluster secret, then `extra`.
pub fn base_args(
    host: &str,
    port: u16,
    http_port: u16,
    data: &Path,
    extra: &[&str],
) -> Vec<String> {
    let mut args: Vec<String> = [
        "--host",
        host,
        "--port",
        &port.to_string(),
        "--http-port",
        &http_port.to_string(),
        "--data-dir",
        &data.display().to_string(),
        "--cluster-secret",
        SECRET,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

pub fn node_args(port: u16, seed: u16, data: &Path, extra: &[&str]) -> Vec<String> {
    let seed = format!("127.0.0.1:{seed}");
    let mut all = vec!["--seed", seed.as_str()];
    all.extend_from_slice(extra);
    base_args("127.0.0.1", port, 0, data, &all)
}

pub async fn wait_views(
    nodes: &[&NodeProcess],
    what: &str,
    mut done: impl FnMut(&[Option<View>]) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        let mut views = Vec::new();
        for n in nodes {
            views.push(demo::view(n.http).await);
        }
        if done(&views) {
            let took = start.elapsed();
            println!("{what}: {:.2}s", took.as_secs_f64());
            return took;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{what}: not reached within {DEADLINE:?}; views {views:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn metric(http: SocketAddr, series: &str) -> u64 {
    let body = http_client::get(http, "/metrics", Duration::from_secs(5))
        .await
        .expect("GET /metrics")
        .body;
    body.lines()
        .find_map(|line| {
            line.strip_prefix(series)
                .and_then(|rest| rest.trim().parse().ok())
        })
        .unwrap_or_else(|| panic!("series {series} missing from /metrics:\n{body}"))
}

/// The arguments of node `i` of a cluster whose nodes are all seeds (a restarted first seed
/// joins the others instead of starting a cluster of its own), with a 5-s entity ask timeout.
pub fn all_seeds_args(i: usize, ports: &[u16], dir: &Path, extra: &[&str]) -> Vec<String> {
    let seeds: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut args: Vec<String> = [
        "--host",
        "127.0.0.1",
        "--port",
        &ports[i].to_string(),
        "--http-port",
        "0",
        "--seed",
        &seeds.join(","),
        "--data-dir",
        &dir.join(format!("n{i}")).display().to_string(),
        "--cluster-secret",
        SECRET,
        "--entity-ask-timeout",
        "5s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Node `i` of an all-seeds cluster ([`all_seeds_args`] with `extra`) running the account
/// example's projections into `database`.
pub async fn spawn_with_read_models(
    i: usize,
    ports: &[u16],
    dir: &Path,
    extra: &[&str],
    database: &tessera_harness::postgres::PostgresServer,
) -> NodeProcess {
    let mut command = tokio::process::Command::new(exe());
    command
        .arg("node")
        .args(all_seeds_args(i, ports, dir, extra))
        .env(
            tessera_example_account::projections::POSTGRES_ENV,
            database.connection_string(),
        );
    demo::spawn_command(command, i + 1, dir.join(format!("n{i}.log")))
        .await
        .expect("node starts")
}

/// Waits until every node sees `count` members Up and reachable.
pub async fn wait_up(nodes: &[&NodeProcess], count: usize) {
    wait_views(nodes, "members up on every node", |views| {
        views.iter().all(|v| {
            v.as_ref()
                .is_some_and(|(m, _)| m.iter().filter(|(_, s, r)| s == "up" && *r).count() == count)
        })
    })
    .await;
}

/// SIGKILLs a node and waits (bounded) for it to exit.
pub async fn kill(node: &mut NodeProcess) {
    node.child.start_kill().expect("SIGKILL");
    let _ = tokio::time::timeout(Duration::from_secs(60), node.child.wait()).await;
}

/// Waits until every node says it is ready (its regions registered with the coordinator).
pub async fn wait_ready(nodes: &[&NodeProcess]) {
    let start = Instant::now();
    loop {
        let mut ready = 0;
        for node in nodes {
            if let Ok(r) =
                http_client::get(node.http, "/health/ready", Duration::from_secs(5)).await
                && r.status == 200
            {
                ready += 1;
            }
        }
        if ready == nodes.len() {
            return;
        }
        assert!(start.elapsed() < DEADLINE, "nodes not ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The entities of `type_name` a node runs, from `GET /sharding/{type_name}`.
pub async fn hosted_of(node: &NodeProcess, type_name: &str) -> BTreeSet<String> {
    let path = format!("/sharding/{type_name}");
    let response = http_client::get(node.http, &path, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    assert_eq!(response.status, 200, "{}", response.body);
    let json: serde_json::Value = response.json().expect("JSON");
    assert_eq!(json["type"], type_name);
    json["shards"]
        .as_array()
        .expect("shards")
        .iter()
        .flat_map(|s| s["entities"].as_array().cloned().unwrap_or_default())
        .filter_map(|e| e.as_str().map(str::to_string))
        .collect()
}
