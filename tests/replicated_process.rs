//! The replicated journal in real `tessera node` processes on 127.0.0.1: acknowledged deposits survive the SIGKILL of the node that took them; 64
//! concurrent callers on three nodes neither lose nor double a deposit, nor apply a refused
//! one; a paused (SIGSTOP) node that resumes cannot apply stale state; with two of three nodes
//! down nothing is acknowledged, and all comes back with them.
//!
//! Every answer must be 200, or an error that says whether the command took effect (503 and
//! 4xx: not applied; 504: unknown). Balances are then checked against the answers: at least
//! the deposits answered 200, at most those plus the ones answered 504. Deadlines only bound
//! how long a test may hang; nothing asserts a timing.

mod common;

use common::deposits::{Tally, balance, balances, check_bounds, command, count, workload};
use common::{all_seeds_args, exe, free_port, kill, test_dir, wait_up};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use tessera_harness::demo::{self, NodeProcess};

async fn spawn(i: usize, run: usize, ports: &[u16], dir: &Path, extra: &[&str]) -> NodeProcess {
    demo::spawn_node(
        exe(),
        i + 1,
        &all_seeds_args(i, ports, dir, extra),
        dir.join(format!("n{i}-run{run}.log")),
    )
    .await
    .expect("node starts")
}

/// Three nodes, all Up on every node.
async fn three_nodes(dir: &Path, extra: &[&str]) -> (Vec<u16>, Vec<NodeProcess>) {
    let ports = vec![free_port(), free_port(), free_port()];
    let mut nodes = Vec::new();
    for i in 0..3 {
        nodes.push(spawn(i, 1, &ports, dir, extra).await);
    }
    wait_up(&nodes.iter().collect::<Vec<_>>(), 3).await;
    (ports, nodes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deposits_through_one_node_survive_its_sigkill() {
    let _serial = common::one_at_a_time().await;
    let dir = test_dir();
    let (ports, mut nodes) = three_nodes(dir.path(), &[]).await;
    let mut requests = Vec::new();
    for _ in 0..1_000 {
        let http = nodes[0].http;
        requests.push(tokio::spawn(async move {
            command(http, "alice", r#"{"deposit": 1}"#).await
        }));
    }
    for request in requests {
        let response = request.await.expect("task");
        assert_eq!(response.status, 200, "{}", response.body);
    }
    // An operator's view of the log from another node: three members, at least W = 2
    // replicas holding all 1,000 events.
    let view = tessera_harness::http_client::get(
        nodes[1].http,
        "/journal/account%7Calice",
        Duration::from_secs(10),
    )
    .await
    .expect("GET /journal");
    assert_eq!(view.status, 200, "{}", view.body);
    let view = view.json().expect("JSON");
    assert_eq!(
        view["config"]["members"].as_array().map(Vec::len),
        Some(3),
        "{view}"
    );
    let holding = view["replicas"]
        .as_array()
        .expect("replicas")
        .iter()
        .filter(|r| {
            r["highest_sequence_nr"]
                .as_u64()
                .is_some_and(|h| h >= 1_000)
        })
        .count();
    assert!(holding >= 2, "{view}");
    let too_long = format!("/journal/{}", "x".repeat(2_000));
    let invalid =
        tessera_harness::http_client::get(nodes[1].http, &too_long, Duration::from_secs(10))
            .await
            .expect("GET /journal");
    assert_eq!(invalid.status, 400, "{}", invalid.body);
    // Node 2 knows the three stores; one a log still names cannot be forgotten, nor one
    // it never saw.
    // (Its probes of the members find them within a scan interval or two.)
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let known = tessera_harness::http_client::get(
            nodes[1].http,
            "/known-stores",
            Duration::from_secs(10),
        )
        .await
        .expect("GET /known-stores");
        assert_eq!(known.status, 200, "{}", known.body);
        let known = known.json().expect("JSON");
        if known["stores"].as_array().map(Vec::len) == Some(3) {
            break;
        }
        assert!(Instant::now() < deadline, "{known}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let first_store = view["config"]["members"]
        .as_array()
        .expect("members")
        .iter()
        .find(|m| m["address"].as_str() == Some(&format!("127.0.0.1:{}", ports[0])))
        .and_then(|m| m["storage_id"].as_str())
        .expect("node 1's store in the configuration")
        .to_string();
    let http = nodes[1].http;
    let forget = |path: String| async move {
        tessera_harness::http_client::request(http, "DELETE", &path, None, Duration::from_secs(10))
            .await
            .expect("DELETE /known-stores")
    };
    // A store a member runs is not forgotten.
    let running = forget(format!("/known-stores/{first_store}")).await;
    assert_eq!(running.status, 409, "{}", running.body);
    kill(&mut nodes[0]).await;
    assert_eq!(balance(nodes[1].http, "alice").await, 1_000);
    assert_eq!(balance(nodes[2].http, "alice").await, 1_000);
    // Killed, it is refused all the same: while it is still a member that does not answer
    // (503), then while alice's log names it (409).
    let refused = forget(format!("/known-stores/{first_store}")).await;
    assert!([409, 503].contains(&refused.status), "{}", refused.body);
    for (path, status) in [
        ("/known-stores/00000000000000ab".to_string(), 404),
        ("/known-stores/not-hex".to_string(), 400),
        ("/known-stores/+1".to_string(), 400),
    ] {
        let answer = forget(path.clone()).await;
        assert_eq!(answer.status, status, "{path}: {}", answer.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_deposits_through_every_node_are_neither_lost_nor_doubled() {
    let _serial = common::one_at_a_time().await;
    let dir = test_dir();
    let (_ports, nodes) = three_nodes(dir.path(), &[]).await;
    let https: Vec<SocketAddr> = nodes.iter().map(|n| n.http).collect();
    let (tallies, _) = workload(https.clone(), Instant::now(), Duration::from_secs(20)).await;
    assert!(tallies.values().map(|t| t.ok).sum::<u64>() > 0);
    // Read through every node: each read is confirmed current.
    for http in &https {
        check_bounds(&tallies, &balances(*http, &tallies).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_that_resumes_applies_no_stale_state() {
    let _serial = common::one_at_a_time().await;
    let dir = test_dir();
    // Paused for seconds only: the others must not down it meanwhile.
    let (_ports, nodes) = three_nodes(dir.path(), &["--stable-after", "120s"]).await;
    let mut tally = Tally::default();
    // Node 1 hosts the account: it recovered it and wrote to it last.
    for _ in 0..50 {
        count(
            &mut tally,
            &command(nodes[0].http, "bob", r#"{"deposit": 1}"#).await,
        );
    }
    let pid = nodes[0].child.id().expect("pid") as i32;
    // SAFETY: kill(2) with a pid of a child this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    // Sharding routes them to the paused node, which runs the account: they time out (504,
    // outcome unknown) together, in one ask timeout, rather than one after another.
    let paused: Vec<_> = (0..50)
        .map(|_| {
            let http = nodes[1].http;
            tokio::spawn(async move { command(http, "bob", r#"{"deposit": 1}"#).await })
        })
        .collect();
    for deposit in paused {
        count(&mut tally, &deposit.await.expect("deposit"));
    }
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    // Through the resumed node: its entity still holds the old state, and must not use it.
    for _ in 0..50 {
        count(
            &mut tally,
            &command(nodes[0].http, "bob", r#"{"deposit": 1}"#).await,
        );
    }
    let mut tallies = BTreeMap::new();
    tallies.insert("bob".to_string(), tally);
    for node in &nodes {
        check_bounds(&tallies, &balances(node.http, &tallies).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_of_three_down_nothing_is_acknowledged_and_all_comes_back() {
    let _serial = common::one_at_a_time().await;
    let dir = test_dir();
    // The split-brain resolver must not down the lone survivor before the others are back.
    let (ports, mut nodes) = three_nodes(dir.path(), &["--stable-after", "120s"]).await;
    let mut tally = Tally::default();
    for _ in 0..20 {
        let response = command(nodes[2].http, "carol", r#"{"deposit": 1}"#).await;
        assert_eq!(response.status, 200, "{}", response.body);
        count(&mut tally, &response);
    }
    kill(&mut nodes[0]).await;
    kill(&mut nodes[1]).await;
    for _ in 0..3 {
        let response = command(nodes[2].http, "carol", r#"{"deposit": 1}"#).await;
        assert!(
            response.status == 503 || response.status == 504,
            "a deposit with two of three nodes down must not be acknowledged: {} {}",
            response.status,
            response.body
        );
        count(&mut tally, &response);
    }
    // The two come back on their data; deposits succeed again.
    nodes[0] = spawn(0, 2, &ports, dir.path(), &["--stable-after", "120s"]).await;
    nodes[1] = spawn(1, 2, &ports, dir.path(), &["--stable-after", "120s"]).await;
    wait_up(&nodes.iter().collect::<Vec<_>>(), 3).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let response = command(nodes[2].http, "carol", r#"{"deposit": 1}"#).await;
        count(&mut tally, &response);
        if response.status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "deposits do not succeed again: {} {}",
            response.status,
            response.body
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut tallies = BTreeMap::new();
    tallies.insert("carol".to_string(), tally);
    for node in &nodes {
        check_bounds(&tallies, &balances(node.http, &tallies).await);
    }
}
