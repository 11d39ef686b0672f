//! A service built the way the README's "A first service" section says: a crate of its own in
//! a temporary directory, outside the workspace, with tessera as a path dependency and an entity
//! type of its own (`wallet`), and a route of its own that asks it by typed references. The
//! test builds it (in this build's target directory, with this workspace's lock file and
//! release profile, so RocksDB is not compiled again), runs four processes of it that form a
//! cluster, and drives them:
//!
//! - typed asks made by the service's own code in each process reach the one live copy;
//! - SIGTERM of a process hands its wallets off with no failed ask, and it exits 0;
//! - after SIGKILL of the process hosting the most wallets, typed asks through the others
//!   answer with every acknowledged deposit;
//! - a typed rejection arrives as the wallet's own rejection type on a node other than the
//!   wallet's;
//! - the same processes answer over HTTP and through their own CLI client, with no code of
//!   the service's for either.

mod common;

use common::{free_port, hosted_of, kill, test_dir, wait_ready, wait_up};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tessera_harness::demo::{self, NodeProcess};
use tessera_harness::http_client;

const WALLETS: usize = 8;
const QUICK: [&str; 4] = ["--stable-after", "2s", "--rebalance-interval", "2s"];
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);
const ASK_DEADLINE: Duration = Duration::from_secs(60);

/// The service's crate, as the README's first-service section teaches it.
const SERVICE_MAIN: &str = r#"
use serde::{Deserialize, Serialize};
use std::process::ExitCode;
use tessera::axum::extract::{Path, State};
use tessera::axum::routing::post;
use tessera::axum::{Json, Router};
use tessera::{AskError, Effect, EntityType, NodeBuilder, NodeHandle};

pub struct Wallet;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WalletCommand {
    Deposit(u64),
    Withdraw(u64),
    Get,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum WalletEvent {
    Deposited(u64),
    Withdrawn(u64),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WalletRejection {
    InsufficientFunds { balance: u64, requested: u64 },
}

impl std::fmt::Display for WalletRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WalletRejection::InsufficientFunds { balance, requested } => {
                write!(f, "{requested} requested, {balance} held")
            }
        }
    }
}

impl EntityType for Wallet {
    type Command = WalletCommand;
    type Event = WalletEvent;
    type State = u64;
    type Reply = u64;
    type Rejection = WalletRejection;
    const TYPE_NAME: &'static str = "wallet";
    const EVENT_MANIFEST: &'static str = "svc.WalletEvent";
    const STATE_MANIFEST: &'static str = "svc.WalletState";

    fn initial_state(&self, _id: &str) -> u64 {
        0
    }

    fn handle_command(&self, balance: &u64, command: WalletCommand) -> Effect<Self> {
        match command {
            WalletCommand::Get => Effect::reply(*balance),
            WalletCommand::Deposit(n) => {
                Effect::persist(WalletEvent::Deposited(n)).then_reply(|b| *b)
            }
            WalletCommand::Withdraw(n) if n > *balance => {
                Effect::reject(WalletRejection::InsufficientFunds {
                    balance: *balance,
                    requested: n,
                })
            }
            WalletCommand::Withdraw(n) => {
                Effect::persist(WalletEvent::Withdrawn(n)).then_reply(|b| *b)
            }
        }
    }

    fn apply_event(&self, balance: &mut u64, event: &WalletEvent) {
        match event {
            WalletEvent::Deposited(n) => *balance = balance.saturating_add(*n),
            WalletEvent::Withdrawn(n) => *balance = balance.saturating_sub(*n),
        }
    }
}

/// What the service's route answers: the reply, the wallet's own rejection, or the failure.
#[derive(Serialize)]
struct Answer {
    balance: Option<u64>,
    insufficient: Option<(u64, u64)>,
    failed: Option<String>,
    outcome: Option<&'static str>,
}

fn routes(node: NodeHandle) -> Router {
    Router::new()
        .route("/svc/{id}/{op}/{amount}", post(ask))
        .with_state(node)
}

async fn ask(
    State(node): State<NodeHandle>,
    Path((id, op, amount)): Path<(String, String, u64)>,
) -> Json<Answer> {
    let command = match op.as_str() {
        "deposit" => WalletCommand::Deposit(amount),
        "withdraw" => WalletCommand::Withdraw(amount),
        _ => WalletCommand::Get,
    };
    let mut answer = Answer { balance: None, insufficient: None, failed: None, outcome: None };
    match node.entity_ref::<Wallet>(id).ask(command).await {
        Ok(balance) => answer.balance = Some(balance),
        Err(AskError::Rejected(WalletRejection::InsufficientFunds { balance, requested })) => {
            answer.insufficient = Some((balance, requested))
        }
        Err(AskError::Failed(failure)) => {
            answer.outcome = Some(failure.outcome.as_str());
            answer.failed = Some(failure.to_string());
        }
    }
    Json(answer)
}

fn main() -> ExitCode {
    NodeBuilder::new().entity(Wallet).routes(routes).main()
}
"#;

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// This build's target directory: the test runs from `<target>/release/deps/`.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    exe.ancestors()
        .nth(3)
        .expect("a test under <target>/release/deps")
        .to_path_buf()
}

/// The workspace's `[profile.*]` tables, as text: the service's build must compile its
/// dependencies with the same settings to reuse this build's units.
fn workspace_profiles() -> String {
    let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml")).expect("manifest");
    let mut profiles = String::new();
    let mut in_profile = false;
    for line in manifest.lines() {
        if line.starts_with('[') {
            in_profile = line.starts_with("[profile.");
        }
        if in_profile {
            profiles.push_str(line);
            profiles.push('\n');
        }
    }
    assert!(profiles.contains("[profile.release]"), "no release profile");
    profiles
}

/// RocksDB's builds in the target directory: build-script output directories holding the
/// compiled library.
fn rocksdb_builds(target: &Path) -> BTreeSet<PathBuf> {
    let build = target.join("release").join("build");
    let Ok(entries) = std::fs::read_dir(&build) else {
        return BTreeSet::new();
    };
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("librocksdb-sys-"))
                && p.join("out").join("librocksdb.a").is_file()
        })
        .collect()
}

/// Writes the service's crate into `dir` and builds it; returns its binary.
fn build_service(dir: &Path) -> PathBuf {
    let tessera = workspace_root().join("tessera");
    let manifest = format!(
        "[package]\nname = \"svc\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
         [dependencies]\ntessera = {{ path = {:?} }}\n\
         serde = {{ version = \"1\", features = [\"derive\"] }}\n\n[workspace]\n\n{}",
        tessera.display().to_string(),
        workspace_profiles()
    );
    std::fs::create_dir_all(dir.join("src")).expect("src");
    std::fs::write(dir.join("Cargo.toml"), manifest).expect("Cargo.toml");
    std::fs::write(dir.join("src").join("main.rs"), SERVICE_MAIN).expect("main.rs");
    // The same versions of every dependency as this build.
    std::fs::copy(workspace_root().join("Cargo.lock"), dir.join("Cargo.lock")).expect("lock");
    let target = target_dir();
    let before = rocksdb_builds(&target);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let built = std::process::Command::new(cargo)
        .args(["build", "--release", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("cargo runs");
    let stderr = String::from_utf8_lossy(&built.stderr);
    assert!(
        built.status.success(),
        "the service does not build:\n{stderr}"
    );
    let after = rocksdb_builds(&target);
    let new: Vec<_> = after.difference(&before).collect();
    assert!(
        new.is_empty() || before.is_empty(),
        "building the service compiled RocksDB again ({new:?}):\n{stderr}"
    );
    target.join("release").join("svc")
}

fn args(i: usize, ports: &[u16], dir: &Path) -> Vec<String> {
    common::all_seeds_args(i, ports, dir, &QUICK)
}

/// The service's route on `node`: `op` on wallet `id` by the service's own typed ask.
async fn route(node: &NodeProcess, id: &str, op: &str, amount: u64) -> Value {
    let path = format!("/svc/{id}/{op}/{amount}");
    let reply = http_client::request(node.http, "POST", &path, None, Duration::from_secs(15))
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}"));
    assert_eq!(reply.status, 200, "POST {path}: {}", reply.body);
    reply.json().expect("JSON")
}

/// Asks through `node` until the wallet answers a balance (retrying failures whose outcome is
/// not applied or unknown, as while its shard moves), within the deadline.
async fn balance(node: &NodeProcess, id: &str) -> u64 {
    let start = Instant::now();
    loop {
        let answer = route(node, id, "get", 0).await;
        if let Some(balance) = answer["balance"].as_u64() {
            return balance;
        }
        assert!(
            start.elapsed() < ASK_DEADLINE,
            "{id} did not answer through {}: {answer}",
            node.http
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_built_from_the_readme_runs_as_a_cluster() {
    let dir = test_dir();
    let exe = build_service(&dir.path().join("svc"));
    let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let mut nodes = Vec::new();
    for i in 0..4 {
        let node = demo::spawn_node(
            &exe,
            i + 1,
            &args(i, &ports, dir.path()),
            dir.path().join(format!("n{i}.log")),
        )
        .await
        .expect("a service node starts");
        nodes.push(node);
        wait_up(&nodes.iter().collect::<Vec<_>>(), i + 1).await;
    }
    wait_ready(&nodes.iter().collect::<Vec<_>>()).await;
    let ids: Vec<String> = (0..WALLETS).map(|i| format!("w{i}")).collect();

    // Typed asks by the service's own code, through every process.
    let mut deposited: BTreeMap<String, u64> = BTreeMap::new();
    for round in 0..3u64 {
        for (i, id) in ids.iter().enumerate() {
            let node = &nodes[(i + round as usize) % nodes.len()];
            let answer = route(node, id, "deposit", round + 1).await;
            let total = deposited.entry(id.clone()).or_default();
            *total += round + 1;
            assert_eq!(answer["balance"].as_u64(), Some(*total), "{id}: {answer}");
        }
    }
    // One live copy each.
    let mut hosts: BTreeMap<String, usize> = BTreeMap::new();
    for (n, node) in nodes.iter().enumerate() {
        for id in hosted_of(node, "wallet").await {
            assert!(
                hosts.insert(id.clone(), n).is_none(),
                "{id} runs on two nodes"
            );
        }
    }
    for id in &ids {
        assert!(hosts.contains_key(id), "{id} runs nowhere");
    }

    // The same processes over HTTP and through their own CLI client.
    let over_http = http_client::request(
        nodes[0].http,
        "POST",
        "/entities/wallet/w0",
        Some(r#"{"get": null}"#),
        Duration::from_secs(15),
    )
    .await
    .expect("POST /entities/wallet/w0");
    assert_eq!(over_http.status, 200, "{}", over_http.body);
    assert_eq!(over_http.json(), Some(Value::from(deposited["w0"])));
    let cli = std::process::Command::new(&exe)
        .args(["entity", "wallet", "w1", r#"{"get": null}"#, "--node"])
        .arg(format!("http://{}", nodes[1].http))
        .output()
        .expect("the service's CLI runs");
    assert!(
        cli.status.success(),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    let printed = String::from_utf8_lossy(&cli.stdout);
    assert!(
        printed.contains(&deposited["w1"].to_string()),
        "the CLI printed {printed:?}"
    );
    let unknown = std::process::Command::new(&exe)
        .args(["entity", "account", "a", r#"{"get": null}"#, "--node"])
        .arg(format!("http://{}", nodes[1].http))
        .output()
        .expect("the service's CLI runs");
    assert!(!unknown.status.success());
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("unknown entity type \"account\""),
        "{}",
        String::from_utf8_lossy(&unknown.stderr)
    );

    // SIGTERM of the process hosting the most wallets (not the oldest, which runs the
    // coordinator): every ask meanwhile succeeds, and it exits 0.
    let count =
        |n: usize, hosts: &BTreeMap<String, usize>| hosts.values().filter(|&&h| h == n).count();
    let leaving = (1..nodes.len())
        .max_by_key(|&n| count(n, &hosts))
        .expect("a node");
    println!(
        "SIGTERM to node {leaving}, which runs {} wallets",
        count(leaving, &hosts)
    );
    let caller = if leaving == 1 { 2 } else { 1 };
    demo::terminate(&nodes[leaving].child);
    let mut asked = 0;
    let deadline = Instant::now() + EXIT_TIMEOUT;
    loop {
        for id in &ids {
            let answer = route(&nodes[caller], id, "deposit", 1).await;
            let total = deposited.entry(id.clone()).or_default();
            *total += 1;
            assert_eq!(
                answer["balance"].as_u64(),
                Some(*total),
                "an ask failed during the hand-off: {id}: {answer}"
            );
            asked += 1;
        }
        if let Ok(Some(status)) = nodes[leaving].child.try_wait() {
            assert!(status.success(), "the SIGTERMed node exited with {status}");
            break;
        }
        assert!(Instant::now() < deadline, "the SIGTERMed node did not exit");
    }
    println!("{asked} asks during the hand-off, none failed");
    let left = nodes.remove(leaving);
    drop(left);

    // SIGKILL of the process hosting the most wallets now.
    let mut hosts: BTreeMap<String, usize> = BTreeMap::new();
    for (n, node) in nodes.iter().enumerate() {
        for id in hosted_of(node, "wallet").await {
            hosts.insert(id, n);
        }
    }
    let victim = (1..nodes.len())
        .max_by_key(|&n| count(n, &hosts))
        .expect("a node");
    println!(
        "SIGKILL to a node that runs {} wallets",
        count(victim, &hosts)
    );
    kill(&mut nodes[victim]).await;
    let killed = nodes.remove(victim);
    drop(killed);
    for id in &ids {
        assert_eq!(
            balance(&nodes[0], id).await,
            deposited[id],
            "{id} lost a deposit"
        );
    }

    // A typed rejection, asked on a node other than the wallet's.
    let mut hosts: BTreeMap<String, usize> = BTreeMap::new();
    for (n, node) in nodes.iter().enumerate() {
        for id in hosted_of(node, "wallet").await {
            hosts.insert(id, n);
        }
    }
    let (id, &home) = hosts.iter().next().expect("a live wallet");
    let other = &nodes[(home + 1) % nodes.len()];
    let refused = route(other, id, "withdraw", 1_000_000).await;
    assert_eq!(
        refused["insufficient"],
        serde_json::json!([deposited[id], 1_000_000]),
        "{refused}"
    );

    for node in &nodes {
        demo::terminate(&node.child);
    }
    for node in &mut nodes {
        let status = tokio::time::timeout(EXIT_TIMEOUT, node.child.wait())
            .await
            .expect("the node exits")
            .expect("its status");
        assert!(status.success(), "a node exited with {status}");
    }
}
