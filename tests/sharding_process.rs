//! Cluster sharding in real `tessera node` processes on 127.0.0.1:
//! every account lives on exactly one node; after the SIGKILL of the coordinator's node every
//! account answers again and no acknowledged deposit is lost or doubled, with the
//! coordinator's state in Distributed Data and in the journal; a joining node receives shards
//! while deposits keep succeeding; a node stopped with SIGTERM hands its shards off and exits
//! 0 without failing a request.
//!
//! Every answer must be 200 or an error that says whether the command took effect; balances
//! are checked against the answers (at least the deposits answered 200, at most those plus
//! the ones answered 504). Durations are printed, never asserted.

mod common;

use common::deposits::{self, Answer, Tally, check_bounds};
use common::{exe, free_port, hosted_of, kill, test_dir, wait_ready, wait_up, wait_views};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use tessera_harness::demo::{self, NodeProcess};
use tessera_harness::http_client;

const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// Failure detection, downing and rebalancing in seconds, so that the tests stay short.
const QUICK: [&str; 4] = ["--stable-after", "2s", "--rebalance-interval", "2s"];

fn args(i: usize, ports: &[u16], dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut all = QUICK.to_vec();
    all.extend_from_slice(extra);
    common::all_seeds_args(i, ports, dir, &all)
}

async fn spawn(i: usize, ports: &[u16], dir: &Path, extra: &[&str]) -> NodeProcess {
    demo::spawn_node(
        exe(),
        i + 1,
        &args(i, ports, dir, extra),
        dir.join(format!("n{i}.log")),
    )
    .await
    .expect("node starts")
}

/// Nodes started one after another (node 0 is the oldest: it runs the coordinator).
async fn cluster(n: usize, dir: &Path, extra: &[&str]) -> (Vec<u16>, Vec<NodeProcess>) {
    let ports: Vec<u16> = (0..n + 1).map(|_| free_port()).collect();
    let mut nodes = Vec::new();
    for i in 0..n {
        nodes.push(spawn(i, &ports[..n], dir, extra).await);
        wait_up(&nodes.iter().collect::<Vec<_>>(), i + 1).await;
    }
    wait_ready(&nodes.iter().collect::<Vec<_>>()).await;
    (ports, nodes)
}

/// Every account answered 200 at least once is on exactly one node, and every node hosts.
async fn check_single_homes(nodes: &[&NodeProcess], tallies: &BTreeMap<String, Tally>) {
    let mut homes: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, node) in nodes.iter().enumerate() {
        let accounts = hosted_of(node, "account").await;
        assert!(!accounts.is_empty(), "node {i} hosts no account");
        for account in accounts {
            homes.entry(account).or_default().push(i);
        }
    }
    for (account, tally) in tallies {
        if tally.ok > 0 {
            let on = homes.get(account).cloned().unwrap_or_default();
            assert!(on.len() <= 1, "{account} runs on nodes {on:?}");
        }
    }
    for (account, on) in &homes {
        assert_eq!(on.len(), 1, "{account} runs on nodes {on:?}");
    }
    println!("{} accounts live, each on one node", homes.len());
}

/// When `gone` is no longer a member in the views of `survivors`.
async fn wait_removed(survivors: &[&NodeProcess], gone: &str) -> Instant {
    wait_views(survivors, "the killed node removed", |views| {
        views.iter().all(|v| {
            v.as_ref()
                .is_some_and(|(m, _)| m.iter().all(|(address, _, _)| address != gone))
        })
    })
    .await;
    Instant::now()
}

/// Reads every account through `http`, all at once, each again after a failure, until each
/// answered 200; returns when the last one first answered (from the call).
async fn all_answer(http: SocketAddr, accounts: u64) -> Duration {
    let start = Instant::now();
    let mut readers = Vec::new();
    for id in 0..accounts {
        readers.push(tokio::spawn(async move {
            loop {
                let r = deposits::command(http, &format!("acct-{id}"), r#"{"get": null}"#).await;
                if r.status == 200 {
                    return start.elapsed();
                }
                assert!(
                    start.elapsed() < Duration::from_secs(120),
                    "acct-{id} never answered: {} {}",
                    r.status,
                    r.body
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    let mut last = Duration::ZERO;
    for reader in readers {
        last = last.max(reader.await.expect("reader"));
    }
    last
}

async fn coordinator_failover(mode: &str) {
    let _serial = common::one_at_a_time().await;
    let dir = test_dir();
    let (_ports, mut nodes) = cluster(3, dir.path(), &["--state-store-mode", mode]).await;
    const ACCOUNTS: u64 = 1_000;
    let start = Instant::now();
    let https: Vec<SocketAddr> = nodes.iter().map(|n| n.http).collect();
    let (tallies, _) =
        deposits::workload_over(https.clone(), ACCOUNTS, start, Duration::from_secs(10)).await;
    check_single_homes(&nodes.iter().collect::<Vec<_>>(), &tallies).await;

    // Deposits go on while the coordinator's node (the oldest, node 0) is killed.
    let during = tokio::spawn(deposits::workload_over(
        https[1..].to_vec(),
        ACCOUNTS,
        Instant::now(),
        Duration::from_secs(25),
    ));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let gone = nodes[0].cluster.clone();
    kill(&mut nodes[0]).await;
    let killed_at = Instant::now();
    let removed_at = wait_removed(&[&nodes[1], &nodes[2]], &gone).await;
    let answering = all_answer(nodes[1].http, ACCOUNTS).await;
    println!(
        "[{mode}] node removed {:.1}s after the SIGKILL; every account answered again {:.1}s \
         after its removal",
        (removed_at - killed_at).as_secs_f64(),
        answering.as_secs_f64()
    );
    let (after, answers) = during.await.expect("workload");
    let mut all = tallies;
    for (id, t) in after {
        let total = all.entry(id).or_default();
        total.ok += t.ok;
        total.unknown += t.unknown;
        total.not_applied += t.not_applied;
    }
    let failed = answers.iter().filter(|a: &&Answer| a.status != 200).count();
    println!(
        "[{mode}] {failed} of {} deposits during the failover not answered 200",
        answers.len()
    );
    let balances = deposits::balances(nodes[2].http, &all).await;
    check_bounds(&all, &balances);
    check_single_homes(&[&nodes[1], &nodes[2]], &all).await;
    for node in &mut nodes[1..] {
        kill(node).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinators_node_killed_with_its_state_in_ddata() {
    coordinator_failover("ddata").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinators_node_killed_with_its_state_in_the_journal() {
    coordinator_failover("persistence").await;
}

async fn metric_value(http: SocketAddr, series: &str) -> Option<u64> {
    let body = http_client::get(http, "/metrics", Duration::from_secs(5))
        .await
        .ok()?
        .body;
    body.lines().find_map(|line| {
        line.strip_prefix(series)
            .and_then(|rest| rest.trim().parse().ok())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_node_receives_shards_while_every_deposit_succeeds() {
    let _serial = common::one_at_a_time().await;
    let dir = test_dir();
    let (ports, mut nodes) = cluster(3, dir.path(), &[]).await;
    const ACCOUNTS: u64 = 200;
    let https: Vec<SocketAddr> = nodes.iter().map(|n| n.http).collect();
    let load = tokio::spawn(deposits::workload_over(
        https,
        ACCOUNTS,
        Instant::now(),
        Duration::from_secs(25),
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let fourth = spawn(3, &ports, dir.path(), &[]).await;
    nodes.push(fourth);
    let joined = Instant::now();
    let mut receiving = None;
    while joined.elapsed() < Duration::from_secs(60) {
        if !hosted_of(&nodes[3], "account").await.is_empty() {
            receiving = Some(joined.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let receiving = receiving.expect("the fourth node never hosted an account");
    println!(
        "the joining node hosted accounts {:.1}s after it started",
        receiving.as_secs_f64()
    );
    let (tallies, answers) = load.await.expect("workload");
    deposits::assert_all_ok(&answers);
    let balances = deposits::balances(nodes[0].http, &tallies).await;
    check_bounds(&tallies, &balances);
    // Per round at most min(20, 10 % of the shards) moved: with at most as many rounds as
    // intervals passed, the handoffs stay within rounds × limit.
    let rounds = metric_value(
        nodes[0].http,
        "tessera_sharding_rebalance_rounds_total{type=\"account\"}",
    )
    .await
    .expect("rounds");
    let handoffs = metric_value(
        nodes[0].http,
        "tessera_sharding_coordinator_handoffs_total{type=\"account\"}",
    )
    .await
    .expect("handoffs");
    let shards = hosted_shard_count(&nodes).await;
    let limit = (shards / 10).clamp(1, 20) as u64;
    println!("{rounds} rebalance rounds moved {handoffs} shards (limit {limit} per round)");
    assert!(rounds > 0 && handoffs <= rounds * limit.max(1) + 1);
    for node in &mut nodes {
        kill(node).await;
    }
}

async fn hosted_shard_count(nodes: &[NodeProcess]) -> usize {
    let response = http_client::get(
        nodes[0].http,
        "/sharding/account/cluster",
        Duration::from_secs(10),
    )
    .await
    .expect("cluster stats");
    let json: Value = response.json().expect("JSON");
    json["regions"]
        .as_array()
        .map(|regions| {
            regions
                .iter()
                .map(|r| r["shards"].as_array().map_or(0, Vec::len))
                .sum()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopped_with_sigterm_hands_off_its_shards_and_fails_no_request() {
    let _serial = common::one_at_a_time().await;
    let dir = test_dir();
    let (_ports, mut nodes) = cluster(3, dir.path(), &[]).await;
    const ACCOUNTS: u64 = 200;
    // Callers use nodes 0 and 1; node 2 runs shards and is stopped.
    let https: Vec<SocketAddr> = nodes[..2].iter().map(|n| n.http).collect();
    let load = tokio::spawn(deposits::workload_over(
        https,
        ACCOUNTS,
        Instant::now(),
        Duration::from_secs(20),
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = hosted_of(&nodes[2], "account").await;
    assert!(!before.is_empty(), "node 2 hosts accounts before it stops");
    let pid = nodes[2].child.id().expect("pid") as i32;
    // SAFETY: sending a signal to our own child process.
    let sent = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(sent, 0);
    let status = tokio::time::timeout(EXIT_TIMEOUT, nodes[2].child.wait())
        .await
        .expect("node 2 exits")
        .expect("status");
    assert_eq!(status.code(), Some(0), "node 2 exits 0");
    let (tallies, answers) = load.await.expect("workload");
    deposits::assert_all_ok(&answers);
    let balances = deposits::balances(nodes[0].http, &tallies).await;
    check_bounds(&tallies, &balances);
    let served: BTreeSet<String> = hosted_of(&nodes[0], "account")
        .await
        .union(&hosted_of(&nodes[1], "account").await)
        .cloned()
        .collect();
    assert!(
        before
            .iter()
            .all(|a| served.contains(a) || !tallies.contains_key(a)),
        "node 2's accounts are served by the others"
    );
    for node in &mut nodes[..2] {
        kill(node).await;
    }
}

/// Polls `GET /sharding/account` on `nodes` until every one of `accounts` runs somewhere
/// (nothing is sent to the accounts themselves); returns how long it took.
async fn wait_running(nodes: &[&NodeProcess], accounts: &BTreeSet<String>, what: &str) -> Duration {
    let start = Instant::now();
    loop {
        let mut running = BTreeSet::new();
        for node in nodes {
            if let Ok(response) =
                http_client::get(node.http, "/sharding/account", Duration::from_secs(5)).await
                && response.status == 200
                && let Some(json) = response.json()
            {
                for shard in json["shards"].as_array().cloned().unwrap_or_default() {
                    for id in shard["entities"].as_array().cloned().unwrap_or_default() {
                        if let Some(id) = id.as_str() {
                            running.insert(id.to_string());
                        }
                    }
                }
            }
        }
        let missing: Vec<&String> = accounts.difference(&running).collect();
        if missing.is_empty() {
            println!("{what}: {:.1}s", start.elapsed().as_secs_f64());
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{what}: {} accounts never started, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn remembered_entities(remember: &str, state_store: &str) {
    let _serial = common::one_at_a_time().await;
    let dir = test_dir();
    let extra = [
        "--remember-entities",
        remember,
        "--state-store-mode",
        state_store,
    ];
    let (ports, mut nodes) = cluster(3, dir.path(), &extra).await;
    let ports = &ports[..3];
    let accounts: BTreeSet<String> = (0..30).map(|i| format!("acct-{i}")).collect();
    let mut balances = BTreeMap::new();
    for (i, account) in accounts.iter().enumerate() {
        let response = deposits::command(
            nodes[0].http,
            account,
            &format!(r#"{{"deposit": {}}}"#, i + 1),
        )
        .await;
        assert_eq!(response.status, 200, "{}", response.body);
        balances.insert(account.clone(), (i + 1) as u64);
    }
    // The shards write their remembered ids a tick after the entities start.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let on_node_2 = hosted_of(&nodes[2], "account").await;
    assert!(!on_node_2.is_empty(), "node 2 runs accounts");
    let gone = nodes[2].cluster.clone();
    kill(&mut nodes[2]).await;
    wait_removed(&[&nodes[0], &nodes[1]], &gone).await;
    wait_running(
        &[&nodes[0], &nodes[1]],
        &on_node_2,
        &format!(
            "[{remember}] node 2's remembered accounts running on the others after its SIGKILL"
        ),
    )
    .await;
    // The whole cluster stops (killed) and starts again on the same data.
    for node in &mut nodes[..2] {
        kill(node).await;
    }
    let mut restarted = Vec::new();
    for i in 0..3 {
        let node = demo::spawn_node(
            exe(),
            i + 1,
            &args(i, ports, dir.path(), &extra),
            dir.path().join(format!("n{i}-restart.log")),
        )
        .await
        .expect("node restarts");
        restarted.push(node);
    }
    wait_up(&restarted.iter().collect::<Vec<_>>(), 3).await;
    wait_running(
        &restarted.iter().collect::<Vec<_>>(),
        &accounts,
        &format!("[{remember}] every remembered account running after a full cluster restart"),
    )
    .await;
    // Started by their shards, not by a message: the regions counted each.
    let mut started = 0;
    for node in &restarted {
        started += metric_value(node.http, "tessera_sharding_remembered_started_total")
            .await
            .expect("remembered_started");
    }
    assert!(
        started >= accounts.len() as u64,
        "[{remember}] {started} remembered entities counted as started after the restart"
    );
    for (account, balance) in &balances {
        assert_eq!(
            deposits::balance(restarted[1].http, account).await,
            *balance,
            "{account}"
        );
    }
    for node in &mut restarted {
        kill(node).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remembered_entities_in_ddata_restart_after_a_crash_and_a_full_restart() {
    remembered_entities("ddata", "ddata").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remembered_entities_in_the_journal_restart_after_a_crash_and_a_full_restart() {
    remembered_entities("eventsourced", "persistence").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_only_node_routes_to_the_others_and_hosts_nothing() {
    let _serial = common::one_at_a_time().await;
    let dir = test_dir();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut nodes = Vec::new();
    for i in 0..3 {
        let mut extra = vec!["--sharding-role", "shard"];
        if i < 2 {
            extra.extend(["--roles", "shard"]);
        }
        nodes.push(spawn(i, &ports, dir.path(), &extra).await);
        wait_up(&nodes.iter().collect::<Vec<_>>(), i + 1).await;
    }
    wait_ready(&nodes.iter().collect::<Vec<_>>()).await;
    let accounts: BTreeSet<String> = (0..40).map(|i| format!("acct-{i}")).collect();
    for account in &accounts {
        let response = deposits::command(nodes[2].http, account, r#"{"deposit": 3}"#).await;
        assert_eq!(response.status, 200, "{}", response.body);
    }
    assert!(
        hosted_of(&nodes[2], "account").await.is_empty(),
        "the proxy hosts nothing"
    );
    let shards = http_client::get(nodes[2].http, "/sharding/account", Duration::from_secs(5))
        .await
        .expect("GET /sharding/account");
    assert_eq!(
        shards.json().expect("JSON")["shards"]
            .as_array()
            .map(Vec::len),
        Some(0)
    );
    let served: BTreeSet<String> = hosted_of(&nodes[0], "account")
        .await
        .union(&hosted_of(&nodes[1], "account").await)
        .cloned()
        .collect();
    assert_eq!(served, accounts, "the role's members run every account");
    for account in &accounts {
        assert_eq!(deposits::balance(nodes[2].http, account).await, 3);
    }
    for node in &mut nodes {
        kill(node).await;
    }
}
