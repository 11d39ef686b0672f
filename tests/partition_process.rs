//! The replicated journal across a real network partition (issue 15's acceptance): three
//! `tessera node` processes, each in its own network namespace, take the 20-s workload of
//! `replicated_process.rs` (64 concurrent callers depositing into 10 accounts through random
//! nodes) while node 3 is cut off from the other two, in both directions, from 5 s to 10 s.
//!
//! The network: one bridge in the root namespace with the address 10.231.X.1 (so the test
//! reaches every node), one veth pair per node, its host end on the bridge and its other end
//! moved into the node's namespace with the address 10.231.X.(11 + i); every node binds its
//! cluster and HTTP ports on that address (the same ports in every namespace). The cut: tc
//! only shapes egress, so the drop rules go on the namespace end of each veth, where a node's
//! own packets leave it. On node 3's veth an `htb` root qdisc (default class 1:10) sends
//! packets to nodes 1 and 2 (u32 `match ip dst`) to class 1:20, whose qdisc is a `blackhole`;
//! the mirror on nodes 1 and 2 drops their packets to node 3. Packets to and from the bridge
//! address (the test) are untouched. Deleting the root qdiscs heals.
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
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tessera::demo::{self, NodeProcess, View};
use tessera::http_client;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::oneshot;

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

// ---------------------------------------------------------------------------------------------
// Commands

/// Runs `program args`; Err with its stderr (or why it did not run) when it fails.
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let output = std::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program} {}: {e}", args.join(" ")))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {} exited with {}: {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Runs a command that must succeed.
fn must(program: &str, args: &[&str]) {
    if let Err(e) = run(program, args) {
        panic!("{e}");
    }
}

/// Why the test cannot run here, if it cannot.
fn skip_reason() -> Option<String> {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid != 0 {
        return Some(format!(
            "the partition test needs root to create network namespaces (running as uid {uid})"
        ));
    }
    if let Err(e) = run("ip", &["netns", "list"]) {
        return Some(format!("`ip netns` is unavailable: {e}"));
    }
    if let Err(e) = run("tc", &["-V"]) {
        return Some(format!("`tc` is unavailable: {e}"));
    }
    // Root in a container may still lack the capabilities.
    let probe = format!("{PREFIX}{}-probe", std::process::id());
    if let Err(e) = run("ip", &["netns", "add", &probe]) {
        return Some(format!("cannot create a network namespace: {e}"));
    }
    let _ = run("ip", &["netns", "del", &probe]);
    None
}

/// Whether a process with this pid exists.
fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The pid in a name `tsp<pid>...` of this test.
fn owner(name: &str) -> Option<u32> {
    let digits: String = name
        .strip_prefix(PREFIX)?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

fn netns_names() -> Vec<String> {
    run("ip", &["netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The root namespace's links, without the `@peer` suffix.
fn link_names() -> Vec<String> {
    run("ip", &["-o", "link", "show"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_string())
        .collect()
}

/// Removes the namespaces and links of earlier runs of this test whose process is gone (a run
/// killed before its guard could clean up).
fn remove_stale() {
    let stale = |name: &String| owner(name).is_some_and(|pid| !alive(pid));
    for ns in netns_names().iter().filter(|n| stale(n)) {
        println!("removing namespace {ns} left by an earlier run");
        let _ = run("ip", &["netns", "del", ns]);
    }
    for link in link_names().iter().filter(|n| stale(n)) {
        println!("removing link {link} left by an earlier run");
        let _ = run("ip", &["link", "del", link]);
    }
}

// ---------------------------------------------------------------------------------------------
// The network

/// The names and addresses of this run's namespaces and links.
#[derive(Clone)]
struct Links {
    pid: u32,
    subnet: u8,
}

impl Links {
    fn bridge(&self) -> String {
        format!("{PREFIX}{}br", self.pid)
    }

    fn netns(&self, i: usize) -> String {
        format!("{PREFIX}{}-n{i}", self.pid)
    }

    /// The veth end on the bridge, in the root namespace.
    fn host_veth(&self, i: usize) -> String {
        format!("{PREFIX}{}h{i}", self.pid)
    }

    /// The veth end in node `i`'s namespace.
    fn node_veth(&self, i: usize) -> String {
        format!("{PREFIX}{}n{i}", self.pid)
    }

    fn bridge_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 231, self.subnet, 1)
    }

    fn ip(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 231, self.subnet, 11 + i as u8)
    }

    fn http(&self, i: usize) -> SocketAddr {
        SocketAddr::from((self.ip(i), HTTP_PORT))
    }

    /// Runs `args` inside node `i`'s namespace.
    fn in_netns(&self, i: usize, args: &[&str]) {
        let ns = self.netns(i);
        let mut all = vec!["netns", "exec", &ns];
        all.extend_from_slice(args);
        must("ip", &all);
    }

    /// Drops every packet node `from` sends to the nodes `to`: an htb root qdisc on the
    /// namespace end of its veth (egress, that is: what leaves the node), whose default class
    /// 1:10 passes and whose class 1:20, where u32 filters send packets to `to`, is a blackhole.
    fn drop_egress(&self, from: usize, to: &[usize]) {
        let dev = self.node_veth(from);
        let dev = dev.as_str();
        self.in_netns(
            from,
            &[
                "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10",
            ],
        );
        for class in ["1:10", "1:20"] {
            self.in_netns(
                from,
                &[
                    "tc", "class", "add", "dev", dev, "parent", "1:", "classid", class, "htb",
                    "rate", "10gbit", "quantum", "60000",
                ],
            );
        }
        self.in_netns(
            from,
            &[
                "tc",
                "qdisc",
                "add",
                "dev",
                dev,
                "parent",
                "1:20",
                "handle",
                "20:",
                "blackhole",
            ],
        );
        for &target in to {
            let dst = format!("{}/32", self.ip(target));
            self.in_netns(
                from,
                &[
                    "tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio",
                    "1", "u32", "match", "ip", "dst", &dst, "flowid", "1:20",
                ],
            );
        }
    }

    /// Cuts node `a` from every other node, in both directions.
    fn cut(&self, a: usize) {
        let others: Vec<usize> = (0..NODES).filter(|&b| b != a).collect();
        self.drop_egress(a, &others);
        for &b in &others {
            self.drop_egress(b, &[a]);
        }
    }

    /// Undoes `cut`: deletes the root qdiscs (`cut` put one on every node's veth).
    fn heal(&self) {
        for i in 0..NODES {
            let dev = self.node_veth(i);
            self.in_netns(i, &["tc", "qdisc", "del", "dev", &dev, "root"]);
        }
    }
}

/// The namespaces, links and node processes of one run; dropping it removes them all.
struct Network {
    links: Links,
    nodes: Vec<NodeProcess>,
    torn_down: bool,
}

impl Network {
    /// A free 10.231.X.0/24 (X from the pid) and everything but the nodes. A failure half-way
    /// panics, and the drop removes what was made.
    fn create() -> Network {
        let pid = std::process::id();
        let used = run("ip", &["-o", "-4", "addr", "show"]).unwrap_or_default()
            + &run("ip", &["-4", "route", "show", "table", "all"]).unwrap_or_default();
        let subnet = (0..254u32)
            .map(|k| ((pid + k) % 254 + 1) as u8)
            .find(|x| !used.contains(&format!("10.231.{x}.")))
            .expect("a free 10.231.X.0/24");
        let network = Network {
            links: Links { pid, subnet },
            nodes: Vec::new(),
            torn_down: false,
        };
        let l = &network.links;
        let bridge = l.bridge();
        must("ip", &["link", "add", &bridge, "type", "bridge"]);
        must(
            "ip",
            &[
                "addr",
                "add",
                &format!("{}/24", l.bridge_ip()),
                "dev",
                &bridge,
            ],
        );
        must("ip", &["link", "set", &bridge, "up"]);
        for i in 0..NODES {
            let (ns, host, node) = (l.netns(i), l.host_veth(i), l.node_veth(i));
            must("ip", &["netns", "add", &ns]);
            must(
                "ip",
                &["link", "add", &host, "type", "veth", "peer", "name", &node],
            );
            must("ip", &["link", "set", &node, "netns", &ns]);
            must("ip", &["link", "set", &host, "master", &bridge]);
            must("ip", &["link", "set", &host, "up"]);
            let address = format!("{}/24", l.ip(i));
            must("ip", &["-n", &ns, "addr", "add", &address, "dev", &node]);
            must("ip", &["-n", &ns, "link", "set", &node, "up"]);
            // A node's own address is routed through lo.
            must("ip", &["-n", &ns, "link", "set", "lo", "up"]);
        }
        network
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
        let l = &self.links;
        for i in 0..NODES {
            let _ = run("ip", &["netns", "del", &l.netns(i)]);
            // Deleting the namespace destroys its veth end, and with it the pair; this covers
            // a pair whose end never moved there.
            let _ = run("ip", &["link", "del", &l.host_veth(i)]);
        }
        let _ = run("ip", &["link", "del", &l.bridge()]);
        // A namespace's devices go away asynchronously.
        let mine = format!("{PREFIX}{}", l.pid);
        let deadline = Instant::now() + Duration::from_secs(10);
        let remaining = loop {
            let remaining: Vec<String> = netns_names()
                .into_iter()
                .chain(link_names())
                .filter(|n| owner(n) == owner(&mine))
                .collect();
            if remaining.is_empty() || Instant::now() > deadline {
                break remaining;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        left.extend(remaining);
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

/// Starts node `i` in its namespace: `ip netns exec NS tessera node ...` (ip execs the node,
/// so the child is the node itself), and waits for its "listening" line.
async fn spawn_node(links: &Links, i: usize, dir: &Path) -> NodeProcess {
    let seeds: Vec<String> = (0..NODES)
        .map(|j| format!("{}:{CLUSTER_PORT}", links.ip(j)))
        .collect();
    let ip = links.ip(i).to_string();
    let log = dir.join(format!("n{}.log", i + 1));
    let mut command = tokio::process::Command::new("ip");
    command
        .args(["netns", "exec", &links.netns(i)])
        .arg(exe())
        .arg("node")
        .args([
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
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(
            std::fs::File::create(&log).expect("node log file"),
        ))
        .kill_on_drop(true);
    // SAFETY: prctl(2) is async-signal-safe; the closure allocates nothing.
    unsafe {
        command.pre_exec(|| {
            // SIGKILL the node should the thread that started it (the test's) die.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().expect("ip netns exec tessera node");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("a 'listening' line within 30 s")
        .expect("node stdout")
        .unwrap_or_else(|| panic!("node {} exited; see {}", i + 1, log.display()));
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("unexpected line {line:?}"))
    };
    let http: SocketAddr = field("http=").parse().expect("http address");
    assert_eq!(http, links.http(i), "{line}");
    // The guard kills the child: it must be the node, not an `ip` that forked it.
    let pid = child.id().expect("pid");
    let running = std::fs::read_link(format!("/proc/{pid}/exe")).expect("/proc/pid/exe");
    assert_eq!(
        running,
        exe().canonicalize().expect("exe path"),
        "ip netns exec did not exec the node"
    );
    NodeProcess {
        child,
        cluster: field("cluster="),
        http,
        log,
    }
}

// ---------------------------------------------------------------------------------------------
// Observing the cut

/// Whether a TCP connection from inside namespace `ns` to `to` opens within a second. The
/// probe runs on a thread of its own, which enters the namespace and then ends.
async fn connects(ns: String, to: SocketAddr) -> bool {
    let (tx, rx) = oneshot::channel();
    std::thread::spawn(move || {
        let file = std::fs::File::open(format!("/run/netns/{ns}")).expect("namespace file");
        // SAFETY: setns(2) with a namespace fd we hold; it changes this thread only.
        let entered = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(
            entered,
            0,
            "setns {ns}: {}",
            std::io::Error::last_os_error()
        );
        let _ = tx.send(std::net::TcpStream::connect_timeout(&to, PROBE_TIMEOUT).is_ok());
    });
    rx.await.expect("probe thread")
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

async fn probe(links: &Links, a: usize) -> Probes {
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
            .map(|&(from, to)| connects(links.netns(from), links.http(to))),
    )
    .await;
    let answered = futures::future::join_all(
        (0..NODES)
            .map(|to| http_client::get(links.http(to), "/health/alive", Duration::from_secs(2))),
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
    let links = &network.links;
    let nodes: Vec<&NodeProcess> = network.nodes.iter().collect();
    let addresses: Vec<String> = nodes.iter().map(|n| n.cluster.clone()).collect();
    links.cut(a);
    let probes = probe(links, a).await;
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
    links.heal();
    let deadline = Instant::now() + DEADLINE;
    // Healed, every connection opens again.
    loop {
        if probe_all_open(links).await {
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
async fn probe_all_open(links: &Links) -> bool {
    let pairs = (0..NODES).flat_map(|from| {
        (0..NODES)
            .filter(move |&to| to != from)
            .map(move |to| (from, to))
    });
    futures::future::join_all(pairs.map(|(from, to)| connects(links.netns(from), links.http(to))))
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
    links: Links,
    https: Vec<SocketAddr>,
    nodes: Vec<String>,
    start: Instant,
) -> CutReport {
    let a = CUT_OFF;
    // The tc commands block: on a thread of the blocking pool, not a worker.
    let cutter = tokio::spawn(async move {
        tokio::time::sleep_until((start + CUT_AT).into()).await;
        let l = links.clone();
        tokio::task::spawn_blocking(move || l.cut(a))
            .await
            .expect("cut");
        let cut_at = start.elapsed();
        let probes = probe(&links, a).await;
        tokio::time::sleep_until((start + HEAL_AT).into()).await;
        let l = links.clone();
        tokio::task::spawn_blocking(move || l.heal())
            .await
            .expect("heal");
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
    if let Some(reason) = skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    remove_stale();
    // The nodes' HTTP APIs are not on loopback, so they need the token for reads too.
    http_client::use_token(SECRET);
    let dir = test_dir();
    let mut network = Network::create();
    let links = network.links.clone();
    println!(
        "network 10.231.{}.0/24: bridge {} ({}), nodes {:?} in namespaces {:?}",
        links.subnet,
        links.bridge(),
        links.bridge_ip(),
        (0..NODES).map(|i| links.ip(i)).collect::<Vec<_>>(),
        (0..NODES).map(|i| links.netns(i)).collect::<Vec<_>>(),
    );
    for i in 0..NODES {
        let node = spawn_node(&links, i, dir.path()).await;
        network.nodes.push(node);
    }
    wait_up(&network.nodes.iter().collect::<Vec<_>>()).await;

    // The cut is checked before the workload relies on it.
    check_the_cut(&network, CUT_OFF).await;

    let https: Vec<SocketAddr> = network.nodes.iter().map(|n| n.http).collect();
    let addresses: Vec<String> = network.nodes.iter().map(|n| n.cluster.clone()).collect();
    let start = Instant::now();
    let partition = tokio::spawn(partition(links.clone(), https.clone(), addresses, start));
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
