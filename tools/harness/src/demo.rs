//! `tessera demo`: the main job. Shows cluster sharding end to end on a local cluster of real
//! `tessera node` processes: accounts spread over the nodes (which node hosts which), a node
//! killed with SIGKILL and its accounts served by the others with every acknowledged deposit
//! in their balances, a node joining and receiving shards from the coordinator's rebalancing,
//! a node leaving gracefully on SIGTERM (handing its shards off), then everything stopped.
//! Beside them the accounts' projections keep read models in PostgreSQL ([`read_model`]),
//! checked against the accounts after each step: exactly once, whatever was killed.
//!
//! The helpers to start a node and read its membership view are shared with the
//! multi-process tests.

mod read_model;

use crate::http_client::{self, HttpResponse};
use read_model::ReadModel;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Split-brain resolver stability used by the demo, so that a dead node is removed quickly.
const DEMO_STABLE_AFTER: &str = "2s";
/// The coordinator's rebalance interval in the demo, so that a joining node gets shards soon.
const DEMO_REBALANCE_INTERVAL: &str = "2s";
/// Accounts the demo deposits into.
const ACCOUNT_COUNT: u64 = 30;
/// Upper bound for every phase; the demo fails rather than hang.
const PHASE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the demo watches a joining node receive shards before it moves on.
const REBALANCE_WATCH: Duration = Duration::from_secs(30);
const POLL_INTERVAL: Duration = Duration::from_millis(200);
const HTTP_TIMEOUT: Duration = Duration::from_secs(2);
/// Time for one entity command: it may wait in a region's buffer while its shard moves.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(15);
/// Time a node has to exit after SIGTERM (its shards' handoff included).
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// What stopped the demo.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("the demo needs at least 2 nodes, got {0}")]
    TooFewNodes(u16),
    #[error("cannot find the tessera executable: {0}")]
    Executable(std::io::Error),
    #[error("cannot start node {index}: {reason}")]
    Spawn { index: usize, reason: String },
    #[error("{phase} did not happen within {timeout:?}")]
    Timeout { phase: String, timeout: Duration },
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Http(#[from] http_client::HttpClientError),
    #[error("unexpected answer from node {node}: {what}")]
    Answer { node: usize, what: String },
    #[error("balances do not match the acknowledged deposits: {0}")]
    Lost(String),
    #[error("the read models: {0}")]
    ReadModel(String),
    #[error("node {node} exited with {status} after SIGTERM (a graceful stop exits 0)")]
    Exit {
        node: usize,
        status: std::process::ExitStatus,
    },
}

/// A `tessera node` child process.
pub struct NodeProcess {
    pub child: Child,
    pub cluster: String,
    pub http: SocketAddr,
    pub log: PathBuf,
}

/// Spawns `tessera node` with `args`, its logs to `log`, and waits for its "listening" line.
pub async fn spawn_node(
    exe: &Path,
    index: usize,
    args: &[String],
    log: PathBuf,
) -> Result<NodeProcess, DemoError> {
    let mut command = Command::new(exe);
    command.arg("node").args(args);
    spawn_command(command, index, log).await
}

/// Spawns `command`, a `tessera node` invocation (possibly wrapped, as in `ip netns exec`,
/// which must exec the node), with its stderr appended to `log`, and waits for the node's
/// "listening" line.
pub async fn spawn_command(
    mut command: Command,
    index: usize,
    log: PathBuf,
) -> Result<NodeProcess, DemoError> {
    let spawn_error = |reason: String| DemoError::Spawn { index, reason };
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)?;
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file))
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| spawn_error(e.to_string()))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| spawn_error("no stdout".into()))?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .map_err(|_| spawn_error("no 'listening' line within 30 s".into()))?
        .map_err(|e| spawn_error(e.to_string()))?
        .ok_or_else(|| spawn_error(format!("exited before listening; see {}", log.display())))?;
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .map(str::to_string)
    };
    let cluster =
        field("cluster=").ok_or_else(|| spawn_error(format!("unexpected line {line:?}")))?;
    let http = field("http=")
        .and_then(|h| h.parse().ok())
        .ok_or_else(|| spawn_error(format!("unexpected line {line:?}")))?;
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(NodeProcess {
        child,
        cluster,
        http,
        log,
    })
}

/// One node's view: (address, status, reachable) per member, and the leader.
pub type View = (Vec<(String, String, bool)>, Option<String>);

/// Reads `GET /cluster/members` of a node; None when it does not answer.
pub async fn view(http: SocketAddr) -> Option<View> {
    let response = http_client::get(http, "/cluster/members", HTTP_TIMEOUT)
        .await
        .ok()?;
    let json = response.json()?;
    let members = json["members"]
        .as_array()?
        .iter()
        .map(|m| {
            (
                m["address"].as_str().unwrap_or("?").to_string(),
                m["status"].as_str().unwrap_or("?").to_string(),
                m["reachable"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    Some((members, json["leader"].as_str().map(str::to_string)))
}

/// Sends SIGTERM to a child.
pub fn terminate(child: &Child) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: kill(2) with a pid we own and a valid signal has no memory effects.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}

/// A node the demo started: its number (1, 2, ... in start order) and its process.
struct DemoNode {
    number: usize,
    process: NodeProcess,
}

impl DemoNode {
    fn http(&self) -> SocketAddr {
        self.process.http
    }

    fn name(&self) -> String {
        format!("node {} ({})", self.number, self.process.cluster)
    }
}

/// What the demo knows of each account's deposits: the sum of those answered 200, and the
/// sum of those whose outcome is unknown (no answer, or 504), which may or may not be in the
/// balance.
#[derive(Debug, Default, Clone, Copy)]
struct Ledger {
    acknowledged: u64,
    unknown: u64,
}

fn account(index: u64) -> String {
    format!("acct-{index:02}")
}

/// Starts node `number`; the first one forms the cluster by joining itself.
async fn start_node(
    exe: &Path,
    dir: &Path,
    read_model: &ReadModel,
    number: usize,
    seed: Option<&str>,
) -> Result<DemoNode, DemoError> {
    let mut args: Vec<String> = [
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--http-port",
        "0",
        "--stable-after",
        DEMO_STABLE_AFTER,
        "--rebalance-interval",
        DEMO_REBALANCE_INTERVAL,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push("--data-dir".to_string());
    args.push(dir.join(format!("node-{number}")).display().to_string());
    if let Some(seed) = seed {
        args.push("--seed".to_string());
        args.push(seed.to_string());
    }
    let log = dir.join(format!("node-{number}.log"));
    let mut command = Command::new(exe);
    let (name, value) = read_model.node_env();
    command.arg("node").args(&args).env(name, value);
    let process = spawn_command(command, number, log).await?;
    if seed.is_none() {
        let body = format!("{{\"address\": \"{}\"}}", process.cluster);
        let joined = http_client::request(
            process.http,
            "POST",
            "/cluster/join",
            Some(&body),
            HTTP_TIMEOUT,
        )
        .await?;
        if joined.status != 200 {
            return Err(DemoError::Answer {
                node: number,
                what: format!("POST /cluster/join: {} {}", joined.status, joined.body),
            });
        }
    }
    Ok(DemoNode { number, process })
}

fn timeout(phase: &str) -> DemoError {
    DemoError::Timeout {
        phase: phase.to_string(),
        timeout: PHASE_TIMEOUT,
    }
}

/// Waits until every node sees exactly the addresses of `nodes` as members, all Up and
/// reachable, and answers `/health/ready` (its regions registered with the coordinator).
async fn wait_converged(nodes: &[&DemoNode], phase: &str) -> Result<Duration, DemoError> {
    let start = Instant::now();
    let expected: BTreeSet<&str> = nodes.iter().map(|n| n.process.cluster.as_str()).collect();
    loop {
        let mut converged = true;
        for node in nodes {
            let up = view(node.http()).await.is_some_and(|(members, _)| {
                let addresses: BTreeSet<&str> = members.iter().map(|m| m.0.as_str()).collect();
                addresses == expected && members.iter().all(|(_, s, r)| s == "up" && *r)
            });
            let ready = up
                && http_client::get(node.http(), "/health/ready", HTTP_TIMEOUT)
                    .await
                    .is_ok_and(|r| r.status == 200);
            converged &= ready;
        }
        if converged {
            return Ok(start.elapsed());
        }
        if start.elapsed() > PHASE_TIMEOUT {
            return Err(timeout(phase));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Waits until no node of `nodes` lists `gone` as a member any more.
async fn wait_removed(nodes: &[&DemoNode], gone: &str) -> Result<Duration, DemoError> {
    let start = Instant::now();
    loop {
        let mut removed = true;
        for node in nodes {
            removed &= view(node.http())
                .await
                .is_some_and(|(members, _)| members.iter().all(|m| m.0 != gone));
        }
        if removed {
            return Ok(start.elapsed());
        }
        if start.elapsed() > PHASE_TIMEOUT {
            return Err(timeout(&format!("the removal of {gone}")));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Sends one command to an account through `node`; no answer reads as status 0.
async fn command(node: &DemoNode, id: &str, body: &str) -> HttpResponse {
    let path = format!("/entities/account/{id}");
    match http_client::request(node.http(), "POST", &path, Some(body), COMMAND_TIMEOUT).await {
        Ok(response) => response,
        Err(e) => HttpResponse {
            status: 0,
            body: e.to_string(),
        },
    }
}

/// Whether a failed command is known not to have taken effect (then it can be sent again).
fn not_applied(response: &HttpResponse) -> bool {
    response.status == 503
        && response
            .json()
            .is_some_and(|j| j["outcome"] == "not_applied")
}

/// Deposits `amount(i)` into every account, through the nodes in turn.
async fn deposit_round(
    nodes: &[&DemoNode],
    ledger: &mut BTreeMap<String, Ledger>,
    amount: impl Fn(u64) -> u64,
) -> Result<(), DemoError> {
    let mut unknown = 0;
    for i in 1..=ACCOUNT_COUNT {
        let id = account(i);
        let node = nodes[(i as usize) % nodes.len()];
        let body = format!("{{\"deposit\": {}}}", amount(i));
        let entry = ledger.entry(id.clone()).or_default();
        let start = Instant::now();
        loop {
            let response = command(node, &id, &body).await;
            if response.status == 200 {
                entry.acknowledged += amount(i);
                break;
            }
            if !not_applied(&response) || start.elapsed() > PHASE_TIMEOUT {
                // No answer, or one that leaves the outcome open: the deposit may be in.
                entry.unknown += amount(i);
                unknown += 1;
                println!(
                    "   deposit into {id} via node {}: {} {} (outcome unknown)",
                    node.number, response.status, response.body
                );
                break;
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
    let total: u64 = (1..=ACCOUNT_COUNT).map(amount).sum();
    println!(
        "   {} deposits (total {total}) sent through {}; {} acknowledged with 200{}",
        ACCOUNT_COUNT,
        names(nodes),
        ACCOUNT_COUNT - unknown,
        if unknown > 0 {
            format!(", {unknown} with an unknown outcome")
        } else {
            String::new()
        }
    );
    Ok(())
}

fn names(nodes: &[&DemoNode]) -> String {
    let numbers: Vec<String> = nodes.iter().map(|n| n.number.to_string()).collect();
    format!("node(s) {}", numbers.join(", "))
}

/// An account's balance read through `node`, asked again after a failure for at most
/// [`PHASE_TIMEOUT`]; returns it with the time it took.
async fn balance(node: &DemoNode, id: &str) -> Result<(u64, Duration), DemoError> {
    let start = Instant::now();
    loop {
        let response = command(node, id, r#"{"get": null}"#).await;
        if response.status == 200 {
            let balance = response.json().and_then(|j| j["balance"].as_u64());
            let balance = balance.ok_or_else(|| DemoError::Answer {
                node: node.number,
                what: format!("no balance in {}", response.body),
            })?;
            return Ok((balance, start.elapsed()));
        }
        if start.elapsed() > PHASE_TIMEOUT {
            return Err(timeout(&format!("an answer from {id}")));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Reads every balance at once (through the nodes in turn) and checks each against the
/// ledger: at least what was acknowledged, at most that plus the deposits of unknown outcome.
/// Returns the balances.
async fn check_balances(
    nodes: &[&DemoNode],
    ledger: &BTreeMap<String, Ledger>,
) -> Result<BTreeMap<String, u64>, DemoError> {
    let reads = ledger
        .keys()
        .enumerate()
        .map(|(i, id)| balance(nodes[i % nodes.len()], id));
    let balances = futures::future::join_all(reads).await;
    let mut wrong = Vec::new();
    let mut sum = 0;
    let mut slowest = Duration::ZERO;
    let mut read_balances = BTreeMap::new();
    for ((id, expected), read) in ledger.iter().zip(balances) {
        let (balance, took) = read?;
        read_balances.insert(id.clone(), balance);
        sum += balance;
        slowest = slowest.max(took);
        let high = expected.acknowledged + expected.unknown;
        if balance < expected.acknowledged || balance > high {
            wrong.push(format!(
                "{id}: {balance}, acknowledged {}, at most {high}",
                expected.acknowledged
            ));
        }
    }
    if !wrong.is_empty() {
        return Err(DemoError::Lost(wrong.join("; ")));
    }
    let acknowledged: u64 = ledger.values().map(|l| l.acknowledged).sum();
    println!(
        "   balances: all {} read through {} match the acknowledged deposits (sum {sum}, \
         acknowledged {acknowledged}); slowest answer {:.1}s",
        ledger.len(),
        names(nodes),
        slowest.as_secs_f64()
    );
    Ok(read_balances)
}

/// The accounts running on a node, from `GET /sharding/account`, with the number of shards
/// it hosts.
async fn hosted(node: &DemoNode) -> Result<(usize, BTreeSet<String>), DemoError> {
    let start = Instant::now();
    loop {
        let response = http_client::get(node.http(), "/sharding/account", HTTP_TIMEOUT).await?;
        if response.status == 200 {
            let json = response.json().ok_or_else(|| DemoError::Answer {
                node: node.number,
                what: format!("GET /sharding/account: not JSON: {}", response.body),
            })?;
            let shards = json["shards"].as_array().cloned().unwrap_or_default();
            let accounts = shards
                .iter()
                .flat_map(|s| s["entities"].as_array().cloned().unwrap_or_default())
                .filter_map(|e| e.as_str().map(str::to_string))
                .collect();
            return Ok((shards.len(), accounts));
        }
        // 503: the region is not registered yet or is busy; ask again.
        if start.elapsed() > PHASE_TIMEOUT {
            return Err(DemoError::Answer {
                node: node.number,
                what: format!(
                    "GET /sharding/account: {} {}",
                    response.status, response.body
                ),
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Prints which node hosts which accounts and returns account → node number.
async fn print_homes(nodes: &[&DemoNode]) -> Result<BTreeMap<String, usize>, DemoError> {
    let mut homes = BTreeMap::new();
    for node in nodes {
        let (shards, accounts) = hosted(node).await?;
        let list: Vec<&str> = accounts.iter().map(String::as_str).collect();
        println!(
            "   {:<28} {:>2} accounts in {:>2} shards: {}",
            node.name(),
            accounts.len(),
            shards,
            if list.is_empty() {
                "-".to_string()
            } else {
                list.join(" ")
            }
        );
        for id in accounts {
            if let Some(other) = homes.insert(id.clone(), node.number) {
                return Err(DemoError::Lost(format!(
                    "{id} runs on node {other} and node {}",
                    node.number
                )));
            }
        }
    }
    Ok(homes)
}

/// Shards per member, from `GET /sharding/account/cluster` on `node`.
async fn shard_counts(node: &DemoNode) -> Result<BTreeMap<String, usize>, DemoError> {
    let response =
        http_client::get(node.http(), "/sharding/account/cluster", COMMAND_TIMEOUT).await?;
    let json = response.json().ok_or_else(|| DemoError::Answer {
        node: node.number,
        what: format!(
            "GET /sharding/account/cluster: {} {}",
            response.status, response.body
        ),
    })?;
    Ok(json["regions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|r| {
            (
                r["address"].as_str().unwrap_or("?").to_string(),
                r["shards"].as_array().map_or(0, Vec::len),
            )
        })
        .collect())
}

/// Of `candidates`, the node hosting the most accounts (the first such in start order).
fn busiest<'a>(
    candidates: impl Iterator<Item = &'a DemoNode>,
    homes: &BTreeMap<String, usize>,
) -> Option<usize> {
    candidates
        .map(|n| (homes.values().filter(|&&h| h == n.number).count(), n.number))
        .filter(|(count, _)| *count > 0)
        .max_by_key(|(count, number)| (*count, std::cmp::Reverse(*number)))
        .map(|(_, number)| number)
}

/// Prints where the accounts `moved` (which ran on node `from`) run now.
fn print_moved(moved: &[String], from: usize, homes: &BTreeMap<String, usize>) {
    let mut by_node: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
    for id in moved {
        by_node.entry(homes[id]).or_default().push(id);
    }
    for (number, ids) in by_node {
        println!(
            "   {} of node {from}'s accounts now on node {number}: {}",
            ids.len(),
            ids.join(" ")
        );
    }
}

/// Checks every account hosted before `from` left now runs on another node.
fn moved_accounts(
    before: &BTreeMap<String, usize>,
    after: &BTreeMap<String, usize>,
    from: usize,
) -> Result<Vec<String>, DemoError> {
    let moved: Vec<String> = before
        .iter()
        .filter(|&(_, &n)| n == from)
        .map(|(id, _)| id.clone())
        .collect();
    if let Some(missing) = moved.iter().find(|id| !after.contains_key(*id)) {
        return Err(DemoError::Lost(format!(
            "{missing} is not running on any node"
        )));
    }
    Ok(moved)
}

fn take(nodes: &mut Vec<DemoNode>, number: usize) -> Option<DemoNode> {
    let index = nodes.iter().position(|n| n.number == number)?;
    Some(nodes.remove(index))
}

/// Runs the demo with `node_count` nodes at first.
pub async fn run(node_count: u16) -> Result<(), DemoError> {
    if node_count < 2 {
        return Err(DemoError::TooFewNodes(node_count));
    }
    let exe = std::env::current_exe().map_err(DemoError::Executable)?;
    let dir = std::env::temp_dir().join(format!("tessera-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run_in(&exe, &dir, usize::from(node_count)).await;
    match &result {
        Ok(()) => {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Err(_) => println!("\nnode logs and data kept in {}", dir.display()),
    }
    result
}

async fn run_in(exe: &Path, dir: &Path, node_count: usize) -> Result<(), DemoError> {
    println!(
        "tessera demo: cluster sharding of `account` entities on {node_count} nodes on \
         127.0.0.1 (stable-after {DEMO_STABLE_AFTER}, rebalance-interval \
         {DEMO_REBALANCE_INTERVAL}; logs in {})",
        dir.display()
    );

    let read_model = ReadModel::start().await?;
    println!(
        "\n1. Start PostgreSQL for the accounts' read models (127.0.0.1:{}), then \
         {node_count} nodes",
        read_model.port()
    );
    let first = start_node(exe, dir, &read_model, 1, None).await?;
    let seed = first.process.cluster.clone();
    println!(
        "   {} formed the cluster, http={}",
        first.name(),
        first.http()
    );
    let mut nodes = vec![first];
    for number in 2..=node_count {
        let node = start_node(exe, dir, &read_model, number, Some(&seed)).await?;
        println!(
            "   {} joins through {seed}, http={}",
            node.name(),
            node.http()
        );
        nodes.push(node);
    }
    let all: Vec<&DemoNode> = nodes.iter().collect();
    let took = wait_converged(&all, "all members Up and ready").await?;
    println!(
        "=> {node_count} members Up on every node, every region registered with the \
         coordinator ({:.1}s)",
        took.as_secs_f64()
    );

    println!(
        "\n2. Deposit into {ACCOUNT_COUNT} accounts (POST /entities/account/<id>, any node \
         routes to the one that runs the account)"
    );
    let mut ledger = BTreeMap::new();
    deposit_round(&all, &mut ledger, |i| i).await?;
    println!("   who hosts what (GET /sharding/account on each node):");
    let homes = print_homes(&all).await?;
    let balances = check_balances(&all, &ledger).await?;
    println!(
        "   the read models (projections of the accounts' events into PostgreSQL, \
         GET /projections):"
    );
    read_model.check(&all, &balances).await?;

    // Not the first node if another hosts accounts: the first runs the coordinator, and the
    // point here is the accounts, not the coordinator's failover.
    let victim = busiest(nodes.iter().skip(1), &homes)
        .or_else(|| busiest(nodes.iter(), &homes))
        .ok_or_else(|| DemoError::Lost("no node hosts an account".into()))?;
    let mut killed = take(&mut nodes, victim).ok_or(DemoError::TooFewNodes(0))?;
    let gone = killed.process.cluster.clone();
    let lost = homes.values().filter(|&&n| n == victim).count();
    println!("\n3. SIGKILL {} (it hosts {lost} accounts)", killed.name());
    killed.process.child.start_kill()?;
    let _ = killed.process.child.wait().await;
    let survivors: Vec<&DemoNode> = nodes.iter().collect();
    let took = wait_removed(&survivors, &gone).await?;
    println!(
        "=> the survivors detected it, the split-brain resolver downed it and it was removed \
         {:.1}s after the kill; its shards are allocated anew on first use",
        took.as_secs_f64()
    );
    check_balances(&survivors, &ledger).await?;
    println!("   who hosts what now:");
    let after_kill = print_homes(&survivors).await?;
    let moved = moved_accounts(&homes, &after_kill, victim)?;
    print_moved(&moved, victim, &after_kill);
    deposit_round(&survivors, &mut ledger, |_| 100).await?;
    let balances = check_balances(&survivors, &ledger).await?;
    println!(
        "   the read models, the killed node's projection instances restarted on the \
         survivors from their saved offsets:"
    );
    read_model.check(&survivors, &balances).await?;

    let number = node_count + 1;
    let seed = nodes[0].process.cluster.clone();
    println!("\n4. Start node {number}: the coordinator rebalances shards to it");
    let joining = start_node(exe, dir, &read_model, number, Some(&seed)).await?;
    println!("   {} joins through {seed}", joining.name());
    nodes.push(joining);
    let members: Vec<&DemoNode> = nodes.iter().collect();
    let took = wait_converged(&members, "the new node Up and ready").await?;
    println!(
        "=> Up and ready on every node after {:.1}s",
        took.as_secs_f64()
    );
    let newcomer = nodes.last().ok_or(DemoError::TooFewNodes(0))?;
    let newcomer_address = newcomer.process.cluster.clone();
    println!(
        "   every account is read once a second meanwhile (a moved shard starts on its new \
         node with the first message)"
    );
    let start = Instant::now();
    let mut last_printed = BTreeMap::new();
    let mut received_at = None;
    while start.elapsed() < REBALANCE_WATCH {
        let reads = ledger
            .keys()
            .enumerate()
            .map(|(i, id)| balance(members[i % members.len()], id));
        for read in futures::future::join_all(reads).await {
            read?;
        }
        let counts = shard_counts(newcomer).await?;
        if counts != last_printed {
            let line: Vec<String> = members
                .iter()
                .map(|n| {
                    let shards = counts.get(&n.process.cluster).copied().unwrap_or(0);
                    format!("node {}: {shards:>2}", n.number)
                })
                .collect();
            println!(
                "   t={:>4.1}s shards per node: {}",
                start.elapsed().as_secs_f64(),
                line.join(", ")
            );
            last_printed = counts.clone();
        }
        let received = counts.get(&newcomer_address).copied().unwrap_or(0);
        let most = counts.values().copied().max().unwrap_or(0);
        if received > 0 && received_at.is_none() {
            received_at = Some(start.elapsed());
        }
        // Balanced within one shard: further rounds move nothing.
        if received > 0 && most <= received + 1 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let Some(received_at) = received_at else {
        return Err(DemoError::Timeout {
            phase: format!("node {number} receiving shards"),
            timeout: REBALANCE_WATCH,
        });
    };
    println!(
        "=> node {number} received its first shards {:.1}s after it was ready; {} of them \
         after {:.1}s (at most 10% of the shards move per round, one round per interval)",
        received_at.as_secs_f64(),
        last_printed.get(&newcomer_address).copied().unwrap_or(0),
        start.elapsed().as_secs_f64()
    );
    check_balances(&members, &ledger).await?;
    println!("   who hosts what now:");
    let after_join = print_homes(&members).await?;

    // The node to stop: the busiest apart from the first (the coordinator's node).
    let leaver = busiest(nodes.iter().skip(1), &after_join)
        .or_else(|| busiest(nodes.iter(), &after_join))
        .ok_or_else(|| DemoError::Lost("no node hosts an account".into()))?;
    let mut leaving = take(&mut nodes, leaver).ok_or(DemoError::TooFewNodes(0))?;
    let count = after_join.values().filter(|&&n| n == leaver).count();
    println!(
        "\n5. SIGTERM {} (it hosts {count} accounts): it hands its shards off, then leaves",
        leaving.name()
    );
    terminate(&leaving.process.child);
    let start = Instant::now();
    let status = tokio::time::timeout(EXIT_TIMEOUT, leaving.process.child.wait())
        .await
        .map_err(|_| DemoError::Timeout {
            phase: format!("node {leaver} exiting after SIGTERM"),
            timeout: EXIT_TIMEOUT,
        })??;
    println!(
        "=> node {leaver} exited with {status} after {:.1}s",
        start.elapsed().as_secs_f64()
    );
    if !status.success() {
        return Err(DemoError::Exit {
            node: leaver,
            status,
        });
    }
    let remaining: Vec<&DemoNode> = nodes.iter().collect();
    let balances = check_balances(&remaining, &ledger).await?;
    println!("   the read models:");
    read_model.check(&remaining, &balances).await?;
    println!("   who hosts what now:");
    let after_leave = print_homes(&remaining).await?;
    let moved = moved_accounts(&after_join, &after_leave, leaver)?;
    print_moved(&moved, leaver, &after_leave);

    println!("\n6. SIGTERM the remaining nodes");
    for node in &nodes {
        terminate(&node.process.child);
    }
    for node in &mut nodes {
        let status = tokio::time::timeout(EXIT_TIMEOUT, node.process.child.wait())
            .await
            .map_err(|_| DemoError::Timeout {
                phase: format!("node {} exiting after SIGTERM", node.number),
                timeout: EXIT_TIMEOUT,
            })??;
        println!("   {} exited with {status}", node.name());
        if !status.success() {
            return Err(DemoError::Exit {
                node: node.number,
                status,
            });
        }
    }
    println!(
        "\ndemo complete: every acknowledged deposit survived a crash, a join and a graceful \
         leave, and is in the read models exactly once"
    );
    Ok(())
}
