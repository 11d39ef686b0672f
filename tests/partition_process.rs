//! The replicated journal across a real network partition: three
//! `tessera node` processes, each in its own network namespace, take the 20-s workload of
//! `replicated_process.rs` (64 concurrent callers depositing into 10 accounts through random
//! nodes) while node 3 is cut off from the other two, in both directions, from 5 s to 10 s.
//!
//! The network is `tessera_harness::netns`'s (shared with `tessera soak`): a bridge in the root
//! namespace at 10.231.X.1 (so the test reaches every node), a namespace per node joined to
//! it by a veth pair, every node binding its cluster and HTTP ports on its namespace's address
//! 10.231.X.(11 + i). The cut drops, on node 3's veth, its packets to nodes 1 and 2 (an `htb`
//! root qdisc, u32 filters, a `blackhole` class), and the mirror on nodes 1 and 2; packets to
//! and from the bridge address (the test) are untouched. Deleting the root qdiscs heals.
//!
//! Every answer must be 200, or 503/504 with a JSON body saying whether the deposit took
//! effect; the balances read through every node afterwards must lie in [ok, ok + unknown].
//! The cut is checked before it is relied on (TCP probes from inside the namespaces, and the
//! nodes' views marking each other unreachable), and again by probes when the workload's cut
//! starts. Deadlines only bound how long the test may hang; nothing asserts a timing.
//!
//! It runs only as root (network namespaces); elsewhere it says it was skipped, and why.
//! Everything it creates (namespaces, bridge, veths, node processes) is removed at the end,
//! also when it fails: a guard kills the nodes and deletes the links and namespaces on drop,
//! each node gets SIGKILL should the test process die (PR_SET_PDEATHSIG), and a run first
//! removes what a killed earlier run left behind.

mod common;

use common::deposits::{Answer, balances, check_bounds, workload};
use common::{SECRET, exe, test_dir, wait_views};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};
use tessera_harness::demo::{self, NodeProcess, View};
use tessera_harness::http_client;
use tessera_harness::netns::{self, Names};

const WORKLOAD: Duration = Duration::from_secs(20);
/// When the workload's cut starts and ends, from the workload's start.
const CUT_AT: Duration = Duration::from_secs(5);
const HEAL_AT: Duration = Duration::from_secs(10);
/// The cut-off node: node 3.
const CUT_OFF: usize = 2;
const NODES: usize = 3;
const CLUSTER_PORT: u16 = 25520;
const HTTP_PORT: u16 = 8558;
/// Every namespace and link this test creates is named `tsp<pid>...`.
const PREFIX: &str = "tsp";
/// Bounds a wait that has no deadline of its own.
const DEADLINE: Duration = Duration::from_secs(45);
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The test's namespaces and links, and its node processes; dropping it kills the nodes and
/// removes the rest.
struct Network {
    netns: Shared,
    names: Names,
    nodes: Vec<NodeProcess>,
    torn_down: bool,
}

/// The namespaces, shared with the task that cuts and heals during the workload.
type Shared = Arc<std::sync::Mutex<netns::Network>>;

/// Cuts node `a` off from the other nodes (on a thread of the blocking pool: the tc commands
/// block).
async fn cut(network: Shared, a: usize) {
    tokio::task::spawn_blocking(move || {
        let mut network = network.lock().unwrap_or_else(PoisonError::into_inner);
        network.cut(a).expect("cut");
    })
    .await
    .expect("cut");
}

async fn heal(network: Shared) {
    tokio::task::spawn_blocking(move || {
        let mut network = network.lock().unwrap_or_else(PoisonError::into_inner);
        network.heal().expect("heal");
    })
    .await
    .expect("heal");
}

impl Network {
    /// Every namespace and link this test creates is named `tsp<pid>...`, on a free
    /// 10.231.X.0/24.
    fn create() -> Network {
        let netns = netns::Network::create(PREFIX, [10, 231], NODES).expect("network namespaces");
        Network {
            names: netns.names().clone(),
            netns: Arc::new(std::sync::Mutex::new(netns)),
            nodes: Vec::new(),
            torn_down: false,
        }
    }

    /// Kills the nodes (and waits for them), deletes the namespaces and links, and returns
    /// what is still there afterwards (nothing, normally).
    fn teardown(&mut self) -> Vec<String> {
        self.torn_down = true;
        let mut left = Vec::new();
        for node in &mut self.nodes {
            let _ = node.child.start_kill();
        }
        for node in &mut self.nodes {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match node.child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    Ok(None) => {
                        left.push(format!("node process {:?}", node.child.id()));
                        break;
                    }
                    // Already reaped.
                    Err(_) => break,
                }
            }
        }
        left.extend(
            self.netns
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .teardown(),
        );
        left
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        if !self.torn_down {
            let left = self.teardown();
            if left.is_empty() {
                eprintln!("cleanup after a failure: namespaces, links and nodes removed");
            } else {
                eprintln!("cleanup after a failure left {left:?}");
            }
        }
    }
}

fn http(names: &Names, i: usize) -> SocketAddr {
    SocketAddr::from((names.ip(i), HTTP_PORT))
}

/// Starts node `i` in its namespace: `ip netns exec NS tessera node ...` (ip execs the node,
/// so the child is the node itself), and waits for its "listening" line.
async fn spawn_node(names: &Names, i: usize, dir: &Path) -> NodeProcess {
    let seeds: Vec<String> = (0..NODES)
        .map(|j| format!("{}:{CLUSTER_PORT}", names.ip(j)))
        .collect();
    let ip = names.ip(i).to_string();
    let log = dir.join(format!("n{}.log", i + 1));
    let mut command = netns::command_in(&names.netns(i), exe());
    command.arg("node").args([
        "--host",
        &ip,
        "--port",
        &CLUSTER_PORT.to_string(),
        "--http-host",
        &ip,
        "--http-port",
        &HTTP_PORT.to_string(),
        "--seed",
        &seeds.join(","),
        "--data-dir",
        &dir.join(format!("n{}", i + 1)).display().to_string(),
        "--cluster-secret",
        SECRET,
        // HTTP binds the namespace's address, not loopback: the node requires a token.
        "--http-token",
        SECRET,
        "--entity-ask-timeout",
        "5s",
        // The split-brain resolver must not down the cut-off node during the cut.
        "--stable-after",
        "60s",
    ]);
    let node = demo::spawn_command(command, i + 1, log)
        .await
        .expect("ip netns exec tessera node");
    assert_eq!(
        node.http,
        http(names, i),
        "node {} listens elsewhere",
        i + 1
    );
    // The guard kills the child: it must be the node, not an `ip` that forked it.
    let pid = node.child.id().expect("pid");
    let running = std::fs::read_link(format!("/proc/{pid}/exe")).expect("/proc/pid/exe");
    assert_eq!(
        running,
        exe().canonicalize().expect("exe path"),
        "ip netns exec did not exec the node"
    );
    node
}

// ---------------------------------------------------------------------------------------------
// Observing the cut

/// Whether a TCP connection from inside namespace `ns` to `to` opens within a second.
async fn connects(ns: String, to: SocketAddr) -> bool {
    netns::connects(ns, to, PROBE_TIMEOUT).await
}

/// What TCP probes saw while node `a` was meant to be cut off.
#[derive(Debug)]
struct Probes {
    /// Connections between `a` and another node, either way, that opened (should be none).
    across: Vec<String>,
    /// Connections between the other nodes, or from the test to any node, that failed
    /// (should be none).
    within: Vec<String>,
}

async fn probe(names: &Names, a: usize) -> Probes {
    let pairs: Vec<(usize, usize)> = (0..NODES)
        .flat_map(|from| {
            (0..NODES)
                .filter(move |&to| to != from)
                .map(move |to| (from, to))
        })
        .collect();
    let opened = futures::future::join_all(
        pairs
            .iter()
            .map(|&(from, to)| connects(names.netns(from), http(names, to))),
    )
    .await;
    let answered = futures::future::join_all(
        (0..NODES)
            .map(|to| http_client::get(http(names, to), "/health/alive", Duration::from_secs(2))),
    )
    .await;
    let mut across = Vec::new();
    let mut within = Vec::new();
    for (&(from, to), opened) in pairs.iter().zip(opened) {
        let cut = from == a || to == a;
        let what = format!("node {} -> node {}", from + 1, to + 1);
        if cut && opened {
            across.push(what);
        } else if !cut && !opened {
            within.push(what);
        }
    }
    for (to, answer) in answered.iter().enumerate() {
        if !answer.as_ref().is_ok_and(|r| r.status == 200) {
            within.push(format!("test -> node {}", to + 1));
        }
    }
    Probes { across, within }
}

/// Whether `view` shows `target` as an unreachable member.
fn unreachable_in(view: &Option<View>, target: &str) -> bool {
    view.as_ref()
        .is_some_and(|(m, _)| m.iter().any(|(a, _, r)| a == target && !*r))
}

/// Whether node `a` sees every other node unreachable, and every other node sees `a` so.
fn split_seen(views: &[Option<View>], nodes: &[String], a: usize) -> (bool, bool) {
    let others: Vec<usize> = (0..nodes.len()).filter(|&b| b != a).collect();
    let by_others = others.iter().all(|&b| unreachable_in(&views[b], &nodes[a]));
    let by_cut_off = others.iter().all(|&b| unreachable_in(&views[a], &nodes[b]));
    (by_others, by_cut_off)
}

async fn views(https: &[SocketAddr]) -> Vec<Option<View>> {
    let mut views = Vec::new();
    for &http in https {
        views.push(demo::view(http).await);
    }
    views
}

async fn wait_up(nodes: &[&NodeProcess]) {
    wait_views(nodes, "members up and reachable on every node", |views| {
        views.iter().all(|v| {
            v.as_ref()
                .is_some_and(|(m, _)| m.iter().filter(|(_, s, r)| s == "up" && *r).count() == NODES)
        })
    })
    .await;
}

/// Cuts node `a` off, checks the cut with probes and in the nodes' views, and heals it.
async fn check_the_cut(network: &Network, a: usize) {
    let names = &network.names;
    let nodes: Vec<&NodeProcess> = network.nodes.iter().collect();
    let addresses: Vec<String> = nodes.iter().map(|n| n.cluster.clone()).collect();
    cut(network.netns.clone(), a).await;
    let probes = probe(names, a).await;
    println!("check: probes during the cut {probes:?}");
    assert!(
        probes.across.is_empty() && probes.within.is_empty(),
        "the cut does not cut as meant: {probes:?}"
    );
    wait_views(
        &nodes,
        "check: node 3 and the others see each other unreachable",
        |views| split_seen(views, &addresses, a) == (true, true),
    )
    .await;
    heal(network.netns.clone()).await;
    let deadline = Instant::now() + DEADLINE;
    // Healed, every connection opens again.
    loop {
        if probe_all_open(names).await {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "connections do not open again after healing"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_up(&nodes).await;
}

/// Whether every node reaches every other node.
async fn probe_all_open(names: &Names) -> bool {
    let pairs = (0..NODES).flat_map(|from| {
        (0..NODES)
            .filter(move |&to| to != from)
            .map(move |to| (from, to))
    });
    futures::future::join_all(pairs.map(|(from, to)| connects(names.netns(from), http(names, to))))
        .await
        .into_iter()
        .all(|opened| opened)
}

/// What happened during the workload's cut.
#[derive(Debug, Default)]
struct CutReport {
    /// From the workload's start.
    cut_at: Duration,
    healed_at: Duration,
    probes: Option<Probes>,
    /// When (from the workload's start) the views first showed nodes 1 and 2 seeing node 3
    /// unreachable, and node 3 seeing them so (during the cut or after it: the failure
    /// detector may take longer than the cut).
    seen_by_others: Option<Duration>,
    seen_by_cut_off: Option<Duration>,
    /// When some view last showed a member unreachable or not up.
    last_split: Option<Duration>,
    /// Since when every node has seen all members up and reachable (None: not at the end).
    whole_since: Option<Duration>,
}

/// Cuts node `a` off from `CUT_AT` to `HEAL_AT` (probing the cut meanwhile), and watches the
/// views from the cut to the workload's end.
async fn partition(
    network: Shared,
    names: Names,
    https: Vec<SocketAddr>,
    nodes: Vec<String>,
    start: Instant,
) -> CutReport {
    let a = CUT_OFF;
    let cutter = tokio::spawn(async move {
        tokio::time::sleep_until((start + CUT_AT).into()).await;
        cut(network.clone(), a).await;
        let cut_at = start.elapsed();
        let probes = probe(&names, a).await;
        tokio::time::sleep_until((start + HEAL_AT).into()).await;
        heal(network).await;
        (cut_at, start.elapsed(), probes)
    });
    let mut report = CutReport::default();
    tokio::time::sleep_until((start + CUT_AT).into()).await;
    while start.elapsed() < WORKLOAD {
        let views = views(&https).await;
        let now = start.elapsed();
        let (by_others, by_cut_off) = split_seen(&views, &nodes, a);
        if by_others && report.seen_by_others.is_none() {
            report.seen_by_others = Some(now);
        }
        if by_cut_off && report.seen_by_cut_off.is_none() {
            report.seen_by_cut_off = Some(now);
        }
        let whole = views.iter().all(|v| {
            v.as_ref()
                .is_some_and(|(m, _)| m.iter().filter(|(_, s, r)| s == "up" && *r).count() == NODES)
        });
        if whole {
            report.whole_since.get_or_insert(now);
        } else {
            report.last_split = Some(now);
            report.whole_since = None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (cut_at, healed_at, probes) = cutter.await.expect("cut and heal");
    report.cut_at = cut_at;
    report.healed_at = healed_at;
    report.probes = Some(probes);
    report
}

/// Prints the answers per node to deposits sent before, during and after the cut: statuses,
/// the slowest answer and the commonest errors (digits masked so alike errors group).
fn print_answers(answers: &[Answer], report: &CutReport) {
    for node in 0..NODES {
        for (phase, from, to) in [
            ("before the cut", Duration::ZERO, report.cut_at),
            ("during the cut", report.cut_at, report.healed_at),
            ("after the cut", report.healed_at, Duration::MAX),
        ] {
            let mine: Vec<&Answer> = answers
                .iter()
                .filter(|a| a.node == node && a.sent >= from && a.sent < to)
                .collect();
            let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
            let mut errors: BTreeMap<(u16, String), u64> = BTreeMap::new();
            for answer in &mine {
                *statuses.entry(answer.status).or_default() += 1;
                if let Some(error) = &answer.error {
                    let masked: String = error
                        .chars()
                        .map(|c| if c.is_ascii_digit() { '#' } else { c })
                        .take(160)
                        .collect();
                    *errors.entry((answer.status, masked)).or_default() += 1;
                }
            }
            let slowest = mine
                .iter()
                .map(|a| a.answered - a.sent)
                .max()
                .unwrap_or_default();
            println!(
                "node {} {phase}: statuses {statuses:?}, slowest answer {:.1}s",
                node + 1,
                slowest.as_secs_f64()
            );
            let mut errors: Vec<_> = errors.into_iter().collect();
            errors.sort_by_key(|e| std::cmp::Reverse(e.1));
            for ((status, error), n) in errors.iter().take(4) {
                println!("    {n} x {status}: {error}");
            }
        }
    }
    let within: Vec<&Answer> = answers
        .iter()
        .filter(|a| {
            a.node == CUT_OFF
                && a.status == 200
                && a.sent >= report.cut_at
                && a.answered < report.healed_at
        })
        .collect();
    println!(
        "deposits node 3 acknowledged (200) while cut off, sent and answered within the cut: {}",
        within.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deposits_across_a_real_partition_are_neither_lost_nor_doubled() {
    if let Some(reason) = netns::unavailable_reason(PREFIX) {
        println!("skipped: the partition test runs only as root: {reason}");
        return;
    }
    for name in netns::remove_stale(PREFIX) {
        println!("removed {name}, left by an earlier run");
    }
    // The nodes' HTTP APIs are not on loopback, so they need the token for reads too.
    http_client::use_token(SECRET);
    let dir = test_dir();
    let mut network = Network::create();
    let names = network.names.clone();
    println!(
        "network {}: bridge {} ({}), nodes {:?} in namespaces {:?}",
        names.subnet(),
        names.bridge(),
        names.bridge_ip(),
        (0..NODES).map(|i| names.ip(i)).collect::<Vec<_>>(),
        (0..NODES).map(|i| names.netns(i)).collect::<Vec<_>>(),
    );
    for i in 0..NODES {
        let node = spawn_node(&names, i, dir.path()).await;
        network.nodes.push(node);
    }
    wait_up(&network.nodes.iter().collect::<Vec<_>>()).await;

    // The cut is checked before the workload relies on it.
    check_the_cut(&network, CUT_OFF).await;

    let https: Vec<SocketAddr> = network.nodes.iter().map(|n| n.http).collect();
    let addresses: Vec<String> = network.nodes.iter().map(|n| n.cluster.clone()).collect();
    let start = Instant::now();
    let partition = tokio::spawn(partition(
        network.netns.clone(),
        names.clone(),
        https.clone(),
        addresses,
        start,
    ));
    let (tallies, answers) = workload(https.clone(), start, WORKLOAD).await;
    let report = partition.await.expect("partition task");
    println!(
        "cut node 3 off at {:.1}s, healed at {:.1}s: it lasted {:.1}s",
        report.cut_at.as_secs_f64(),
        report.healed_at.as_secs_f64(),
        (report.healed_at - report.cut_at).as_secs_f64()
    );
    println!("probes when the cut started: {:?}", report.probes);
    let secs = |d: Option<Duration>| d.map(|d| format!("{:.1}s", d.as_secs_f64()));
    println!(
        "views: nodes 1 and 2 first saw node 3 unreachable at {:?}, node 3 saw them unreachable \
         at {:?}; a view last showed a member unreachable at {:?}; all up and reachable on \
         every node since {:?}",
        secs(report.seen_by_others),
        secs(report.seen_by_cut_off),
        secs(report.last_split),
        secs(report.whole_since)
    );
    print_answers(&answers, &report);
    let probes = report.probes.as_ref().expect("probes");
    assert!(
        probes.across.is_empty() && probes.within.is_empty(),
        "the workload's cut did not cut as meant: {probes:?}"
    );
    assert!(tallies.values().map(|t| t.ok).sum::<u64>() > 0);

    wait_up(&network.nodes.iter().collect::<Vec<_>>()).await;
    // Read through every node: each read is confirmed current.
    for http in &https {
        println!("balances read through {http}:");
        check_bounds(&tallies, &balances(*http, &tallies).await);
    }

    let left = network.teardown();
    assert!(left.is_empty(), "left behind: {left:?}");
    println!("cleanup: nodes killed, namespaces, veths and bridge deleted; nothing left");
}
