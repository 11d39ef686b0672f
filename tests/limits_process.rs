//! Bounded memory under hostile load: each of a node's caps is driven from
//! outside — the HTTP API of real `tessera node` processes, or raw TCP to the cluster port —
//! with far more load than the cap allows. Each test asserts the refusal or eviction the cap
//! promises, the metric that counts it, the gauge it bounds, and that the node's resident
//! memory (VmRSS) grows by less than a stated bound while the load runs.
//!
//! `LIMITS_TEST_UNCAPPED=1` runs the same tests with each cap set out of reach: every test
//! must then fail (the sabotage check of each cap; not a variable of the node, which refuses
//! unknown `TESSERA_*` ones). `LIMITS_TEST_UNCAPPED=<config key>` lifts that one cap only
//! (the three Distributed Data caps share a test).
//!
//! Deadlines only bound how long a test may hang; nothing here asserts a timing.

mod common;

use common::deposits::balance;
use common::memory::{PeakRss, rss_kib};
use common::{all_seeds_args, exe, free_port, metric, test_dir, wait_up};
use futures::StreamExt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tessera_harness::demo::{self, NodeProcess};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long one HTTP request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Bound of every wait for a node to reach a state.
const DEADLINE: Duration = Duration::from_secs(60);

/// HTTP requests in flight at once from a test.
const CONCURRENCY: usize = 64;

/// Whether the cap of configuration key `key` is set out of reach (the sabotage run).
fn uncapped(key: &str) -> bool {
    std::env::var("LIMITS_TEST_UNCAPPED").is_ok_and(|v| v == "1" || v == key)
}

/// The value for `key`: `capped`, or `out_of_reach` in the sabotage run.
fn cap<'a>(key: &str, capped: &'a str, out_of_reach: &'a str) -> &'a str {
    if uncapped(key) { out_of_reach } else { capped }
}

/// At most the first 300 characters of an answer, for the log.
fn cut(body: &str) -> &str {
    body.char_indices()
        .nth(300)
        .map_or(body, |(at, _)| &body[..at])
}

/// One HTTP client for the test process, keeping connections (thousands of requests would
/// otherwise each open one).
fn client() -> &'static reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(CONCURRENCY)
            .build()
            .expect("HTTP client")
    })
}

/// `POST path` with a JSON body: the status (0 when no answer came) and the body.
async fn post(http: SocketAddr, path: &str, body: String) -> (u16, String) {
    let sent = client()
        .post(format!("http://{http}{path}"))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .timeout(REQUEST_TIMEOUT)
        .send()
        .await;
    match sent {
        Ok(response) => {
            let status = response.status().as_u16();
            (status, response.text().await.unwrap_or_default())
        }
        Err(e) => (0, e.to_string()),
    }
}

/// `GET path`: the status and the body.
async fn get(http: SocketAddr, path: &str) -> (u16, String) {
    match client()
        .get(format!("http://{http}{path}"))
        .timeout(REQUEST_TIMEOUT)
        .send()
        .await
    {
        Ok(response) => {
            let status = response.status().as_u16();
            (status, response.text().await.unwrap_or_default())
        }
        Err(e) => (0, e.to_string()),
    }
}

/// Sends every `(path, body)` with [`CONCURRENCY`] in flight; the answers in order.
async fn post_all(
    http: SocketAddr,
    requests: impl IntoIterator<Item = (String, String)>,
) -> Vec<(u16, String)> {
    futures::stream::iter(requests)
        .map(|(path, body)| async move { post(http, &path, body).await })
        .buffered(CONCURRENCY)
        .collect()
        .await
}

/// The largest value of the gauge `series` of `http` seen while sampling, every 50 ms until
/// [`Watch::stop`].
struct Watch {
    most: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    fn start(http: SocketAddr, series: &'static str) -> Self {
        let most = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let task = {
            let (most, done) = (most.clone(), done.clone());
            tokio::spawn(async move {
                while !done.load(Ordering::Relaxed) {
                    most.fetch_max(metric(http, series).await, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        };
        Self { most, done, task }
    }

    async fn stop(self) -> u64 {
        self.done.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.most.load(Ordering::Relaxed)
    }
}

/// Waits until the node answers `GET /health/ready` with 200 (Up, its regions registered).
async fn wait_ready(http: SocketAddr) {
    let start = Instant::now();
    while get(http, "/health/ready").await.0 != 200 {
        assert!(start.elapsed() < DEADLINE, "{http} never became ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Node `i` of a cluster whose nodes are all seeds, with `extra` arguments.
async fn spawn(i: usize, ports: &[u16], dir: &Path, extra: &[&str]) -> NodeProcess {
    demo::spawn_node(
        exe(),
        i + 1,
        &all_seeds_args(i, ports, dir, extra),
        dir.join(format!("n{i}.log")),
    )
    .await
    .expect("node starts")
}

fn pid(node: &NodeProcess) -> u32 {
    node.child.id().expect("the node runs")
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The growth of a node's resident set over a load: before it and its peak during it, in
/// KiB. Printed when measured (the sabotage runs fail on other checks first), asserted with
/// [`RssGrowth::assert_at_most`].
struct RssGrowth {
    what: &'static str,
    before_kib: u64,
    peak_kib: u64,
}

impl RssGrowth {
    fn new(what: &'static str, before_kib: u64, peak_kib: u64) -> Self {
        println!(
            "{what}: VmRSS {:.1} MiB before the load, peak {:.1} MiB during it: +{:.1} MiB",
            mib(before_kib),
            mib(peak_kib),
            mib(peak_kib.saturating_sub(before_kib)),
        );
        Self {
            what,
            before_kib,
            peak_kib,
        }
    }

    fn assert_at_most(&self, bound_kib: u64) {
        let growth = self.peak_kib.saturating_sub(self.before_kib);
        assert!(
            growth <= bound_kib,
            "{}: resident memory grew by {:.1} MiB, more than the bound of {:.1} MiB",
            self.what,
            mib(growth),
            mib(bound_kib)
        );
    }
}

/// Live entities per node: `node_active_entity_limit = 200` against 4,000 accounts (20
/// times the cap), each created by a deposit. Every deposit succeeds, never more than the
/// limit (plus one per host partition, the documented slack) is active, the rest are
/// passivated and counted, and an evicted account's next command finds its balance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entities_beyond_the_node_limit_are_passivated_and_memory_stays_bounded() {
    const LIMIT: u64 = 200;
    const PARTITIONS: u64 = 16;
    const ACCOUNTS: usize = 4_000;
    /// The node's resident growth while 4,000 accounts pass through 200 slots: what the
    /// replicated journal keeps per log (its writers, bounded on their own) and the
    /// allocator's slack, not the entities.
    const RSS_GROWTH_MAX_KIB: u64 = 40 * 1024;
    let _serial = common::one_at_a_time().await;
    let dir = test_dir();
    let port = free_port();
    let limit = LIMIT.to_string();
    let node = spawn(
        0,
        &[port],
        dir.path(),
        &[
            "--node-active-entity-limit",
            cap("node_active_entity_limit", &limit, "0"),
        ],
    )
    .await;
    wait_ready(node.http).await;
    let deposit = |id: String| {
        (
            format!("/entities/account/{id}"),
            r#"{"deposit": 1}"#.into(),
        )
    };
    // The cap filled once, so that the figure below is what more entities cost.
    for (status, body) in
        post_all(node.http, (0..LIMIT).map(|i| deposit(format!("warm-{i}")))).await
    {
        assert_eq!(status, 200, "{body}");
    }
    let before = rss_kib(pid(&node));
    let peak = PeakRss::start(pid(&node));
    let active = Watch::start(node.http, "tessera_entities_active{type=\"account\"}");
    let answers = post_all(node.http, (0..ACCOUNTS).map(|i| deposit(format!("a-{i}")))).await;
    let most_active = active.stop().await;
    let rss = RssGrowth::new("entities", before, peak.stop(pid(&node)).await);
    for (status, body) in &answers {
        assert_eq!(*status, 200, "{body}");
    }
    let evicted = metric(
        node.http,
        "tessera_entities_evicted_total{type=\"account\"}",
    )
    .await;
    let started = metric(
        node.http,
        "tessera_entities_started_total{type=\"account\"}",
    )
    .await;
    println!(
        "{} accounts: at most {most_active} active (limit {LIMIT}), {started} started, \
         {evicted} evicted",
        ACCOUNTS as u64 + LIMIT
    );
    assert!(
        most_active <= LIMIT + PARTITIONS,
        "{most_active} entities active, node_active_entity_limit = {LIMIT}"
    );
    assert!(
        evicted >= ACCOUNTS as u64 + LIMIT - (LIMIT + PARTITIONS),
        "{evicted} evicted of {started} started"
    );
    rss.assert_at_most(RSS_GROWTH_MAX_KIB);
    // Passivated, not forgotten: the first accounts were evicted long ago.
    for i in 0..50 {
        assert_eq!(balance(node.http, &format!("a-{i}")).await, 1, "a-{i}");
    }
}

/// Distributed Data: node B holds at most 1,000 keys, 16 KiB per value and 200,000 bytes.
/// Written through B's HTTP API, a growing set is refused at the value limit, 10,000 new
/// counters (10 times the key limit) at the key limit, and growing registers at the byte
/// limit, each with 507 naming the configuration key. Then node A (no such limits) takes
/// 10,000 registers of 2 KiB, which reach B as deltas and anti-entropy: B refuses them all
/// and counts them, its keys and bytes never pass the limits, its memory stays bounded, and
/// a quorum read through B still answers a key B cannot hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddata_beyond_its_limits_is_refused_from_callers_and_peers() {
    const MAX_KEYS: u64 = 1_000;
    const MAX_VALUE_BYTES: u64 = 16 * 1024;
    const MAX_TOTAL_BYTES: u64 = 200_000;
    const COUNTERS: usize = 10_000;
    const REMOTE_REGISTERS: usize = 10_000;
    /// B's resident growth while it refuses 10,000 counters from callers and 20 MB of
    /// registers from A: messages decoded and dropped, not kept.
    const RSS_GROWTH_MAX_KIB: u64 = 24 * 1024;
    let _serial = common::one_at_a_time().await;
    let dir = test_dir();
    let ports = [free_port(), free_port()];
    let a = spawn(0, &ports, dir.path(), &[]).await;
    let (max_keys, max_value, max_total) = (
        MAX_KEYS.to_string(),
        MAX_VALUE_BYTES.to_string(),
        MAX_TOTAL_BYTES.to_string(),
    );
    let b = spawn(
        1,
        &ports,
        dir.path(),
        &[
            "--ddata-max-keys",
            cap("ddata_max_keys", &max_keys, "4000000"),
            "--ddata-max-value-bytes",
            cap(
                "ddata_max_value_bytes",
                &max_value,
                // Beyond the set's 100 KiB, within ddata_max_total_bytes as the node requires.
                "150000",
            ),
            "--ddata-max-total-bytes",
            cap("ddata_max_total_bytes", &max_total, "1073741824"),
        ],
    )
    .await;
    wait_up(&[&a, &b], 2).await;
    let before = rss_kib(pid(&b));
    let peak = PeakRss::start(pid(&b));
    let keys = Watch::start(b.http, "tessera_ddata_keys");
    let bytes = Watch::start(b.http, "tessera_ddata_bytes");

    // 1. Twenty small registers, then a set that grows past the value limit.
    for i in 0..20 {
        let (status, body) = post(b.http, &format!("/ddata/register/reg-{i}"), set_body(8)).await;
        assert_eq!(status, 200, "{body}");
    }
    let element = "e".repeat(1000);
    let mut added = 0;
    let (status, body) = loop {
        if added == 100 {
            break (200, "100 elements taken".to_string());
        }
        let body = serde_json::json!({ "add": format!("{added}-{element}") }).to_string();
        let (status, body) = post(b.http, "/ddata/set/big", body).await;
        if status != 200 {
            break (status, body);
        }
        added += 1;
    };
    println!(
        "set: {added} elements of 1 KiB, then {status} {}",
        cut(&body)
    );
    assert_eq!(status, 507, "{}", cut(&body));
    assert!(body.contains("ddata_max_value_bytes"), "{}", cut(&body));

    // 2. Ten times the key limit in new counters.
    let answers = post_all(
        b.http,
        (0..COUNTERS).map(|i| {
            (
                format!("/ddata/counter/c-{i}"),
                r#"{"increment": 1}"#.into(),
            )
        }),
    )
    .await;
    let created = answers.iter().filter(|(status, _)| *status == 200).count();
    for (status, body) in answers.iter().filter(|(status, _)| *status != 200) {
        assert_eq!(*status, 507, "{body}");
        assert!(body.contains("ddata_max_keys"), "{body}");
    }
    println!("counters: {created} created of {COUNTERS}");
    assert!(created < MAX_KEYS as usize, "{created} counters created");
    assert_eq!(metric(b.http, "tessera_ddata_keys").await, MAX_KEYS);

    // 3. The registers grow until the node holds its byte limit.
    let mut grown = 0;
    let (status, body) = loop {
        if grown == 20 {
            break (200, "all 20 registers grown".to_string());
        }
        let path = format!("/ddata/register/reg-{grown}");
        let (status, body) = post(b.http, &path, set_body(12 * 1024)).await;
        if status != 200 {
            break (status, body);
        }
        grown += 1;
    };
    println!(
        "registers: {grown} grown to 12 KiB, then {status} {}",
        cut(&body)
    );
    assert_eq!(status, 507, "{}", cut(&body));
    assert!(body.contains("ddata_max_total_bytes"), "{}", cut(&body));
    for (limit, at_least) in [
        ("keys", (COUNTERS - created) as u64),
        ("value_bytes", 1),
        ("total_bytes", 1),
    ] {
        let series = format!("tessera_ddata_updates_refused_total{{limit=\"{limit}\"}}");
        let refused = metric(b.http, &series).await;
        assert!(refused >= at_least, "{series} = {refused}");
    }

    // 4. 20 MB of registers written on A spread to B (deltas, anti-entropy), which refuses
    //    them: counted, not held.
    let answers = post_all(
        a.http,
        (0..REMOTE_REGISTERS).map(|i| (format!("/ddata/register/r-{i}"), set_body(2048))),
    )
    .await;
    for (status, body) in &answers {
        assert_eq!(*status, 200, "{body}");
    }
    // Until B has refused many of them, or (a broken cap) holds more keys than it may: the
    // checks below then say which.
    let remote = "tessera_ddata_remote_states_refused_total{limit=\"keys\"}";
    let start = Instant::now();
    let refused_remote = loop {
        let refused = metric(b.http, remote).await;
        if refused >= 1_000 || metric(b.http, "tessera_ddata_keys").await > MAX_KEYS {
            break refused;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{remote} = {refused} after {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let most_keys = keys.stop().await;
    let most_bytes = bytes.stop().await;
    let rss = RssGrowth::new("ddata", before, peak.stop(pid(&b)).await);
    println!(
        "B: at most {most_keys} keys and {most_bytes} bytes; {refused_remote} states from A \
         refused"
    );
    assert!(most_keys <= MAX_KEYS, "{most_keys} keys held");
    assert!(
        refused_remote >= 1_000,
        "{refused_remote} states from A refused"
    );
    assert!(most_bytes <= MAX_TOTAL_BYTES, "{most_bytes} bytes held");
    rss.assert_at_most(RSS_GROWTH_MAX_KIB);

    // B serves what it holds, and a quorum read through it still answers a key it refused.
    let (status, body) = get(b.http, "/ddata/counter/c-0").await;
    assert_eq!(
        (status, body.contains("\"value\":1")),
        (200, true),
        "{body}"
    );
    assert_eq!(get(b.http, "/ddata/register/r-7").await.0, 404);
    let (status, body) = get(b.http, "/ddata/register/r-7?consistency=all").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"key\":\"r-7\""), "{body}");
}

/// A register's `{"set": ...}` body holding a string of `len` bytes.
fn set_body(len: usize) -> String {
    serde_json::json!({ "set": "v".repeat(len) }).to_string()
}

/// Pending requests per peer: three nodes with room for 256 transport requests waiting, 64
/// per peer. Node 3 is paused (SIGSTOP) while 64 callers deposit into accounts that live on
/// node 1 (their logs on all three nodes): node 1's appends to node 3 go unanswered, yet
/// node 3 never holds more than 64 of node 1's slots, the ones beyond are refused and
/// counted, and every deposit is acknowledged by nodes 1 and 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_peer_holds_at_most_its_share_of_pending_requests() {
    const PER_PEER: u64 = 64;
    const ACCOUNTS: usize = 64;
    const LOAD: Duration = Duration::from_secs(8);
    /// Node 1's resident growth while node 3 is paused: the bounded queues and pending table.
    const RSS_GROWTH_MAX_KIB: u64 = 48 * 1024;
    let _serial = common::one_at_a_time().await;
    let dir = test_dir();
    let ports = [free_port(), free_port(), free_port()];
    let per_peer = PER_PEER.to_string();
    let extra = [
        "--transport-max-pending-requests",
        "256",
        "--transport-max-pending-requests-per-peer",
        cap("transport_max_pending_requests_per_peer", &per_peer, "256"),
        // Node 3 stays a member while paused: nothing here is about downing it.
        "--stable-after",
        "2m",
    ];
    let mut nodes = Vec::new();
    for i in 0..3 {
        nodes.push(spawn(i, &ports, dir.path(), &extra).await);
    }
    wait_up(&nodes.iter().collect::<Vec<_>>(), 3).await;
    for node in &nodes {
        wait_ready(node.http).await;
    }
    // Accounts that live on node 1: created through it, then picked from its shards.
    let http = nodes[0].http;
    for (status, body) in post_all(
        http,
        (0..400).map(|i| {
            (
                format!("/entities/account/p-{i}"),
                r#"{"deposit": 1}"#.into(),
            )
        }),
    )
    .await
    {
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = get(http, "/sharding/account").await;
    assert_eq!(status, 200, "{body}");
    let region: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let mut local: Vec<String> = region["shards"]
        .as_array()
        .expect("shards")
        .iter()
        .flat_map(|shard| shard["entities"].as_array().cloned().unwrap_or_default())
        .filter_map(|id| id.as_str().map(str::to_string))
        .collect();
    local.truncate(ACCOUNTS);
    assert!(local.len() >= 32, "node 1 hosts only {local:?}");

    let before = rss_kib(pid(&nodes[0]));
    let peak = PeakRss::start(pid(&nodes[0]));
    let paused = pid(&nodes[2]);
    // SAFETY: kill(2) with a valid pid and signal has no memory effects.
    assert_eq!(unsafe { libc::kill(paused as i32, libc::SIGSTOP) }, 0);
    let most_pending = Watch::start(http, "tessera_transport_requests_pending_max_per_peer");
    let stop_at = Instant::now() + LOAD;
    let callers: Vec<_> = local
        .iter()
        .cloned()
        .map(|id| {
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while Instant::now() < stop_at {
                    let path = format!("/entities/account/{id}");
                    answers.push(post(http, &path, r#"{"deposit": 1}"#.into()).await);
                }
                answers
            })
        })
        .collect();
    let mut answers = Vec::new();
    for caller in callers {
        answers.extend(caller.await.expect("caller"));
    }
    let most_pending = most_pending.stop().await;
    let rss = RssGrowth::new("pending requests", before, peak.stop(pid(&nodes[0])).await);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(paused as i32, libc::SIGCONT) }, 0);
    let refused_for_peer = metric(
        http,
        "tessera_transport_requests_refused_total{reason=\"too_many_pending_for_peer\"}",
    )
    .await;
    let refused_total = metric(
        http,
        "tessera_transport_requests_refused_total{reason=\"too_many_pending\"}",
    )
    .await;
    let ok = answers.iter().filter(|(status, _)| *status == 200).count();
    println!(
        "{} deposits, {ok} acknowledged; at most {most_pending} requests pending for one \
         peer; refused: {refused_for_peer} for the peer's limit, {refused_total} for the \
         node's",
        answers.len()
    );
    assert!(
        most_pending <= PER_PEER,
        "{most_pending} requests pending for one peer"
    );
    assert!(
        refused_for_peer > 0,
        "the paused peer never reached its limit"
    );
    assert_eq!(refused_total, 0, "the node's table was exhausted");
    for (status, body) in &answers {
        assert_eq!(*status, 200, "{body}");
    }
    rss.assert_at_most(RSS_GROWTH_MAX_KIB);
}

/// Inbound connections before the handshake: 3,000 TCP connections to the cluster port (47
/// times `transport_max_inbound_handshakes = 64`) from 127.0.0.2–9, a third silent, a third
/// sending the start of a frame and stopping, a third sending a handshake one byte every
/// 300 ms. At most 64 are ever in their handshake; the others are closed at once and
/// counted; those let in are closed after `transport_handshake_timeout` and counted; memory
/// stays bounded; and a node with the secret joins afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_finish_a_handshake_are_bounded_in_number_and_time() {
    const MAX_HANDSHAKES: u64 = 64;
    const CONNECTIONS: usize = 3_000;
    /// The node's resident growth under the flood: 64 handshakes' buffers at a time.
    const RSS_GROWTH_MAX_KIB: u64 = 16 * 1024;
    let _serial = common::one_at_a_time().await;
    let connections = CONNECTIONS.min(raise_open_file_limit().saturating_sub(256));
    let dir = test_dir();
    let ports = [free_port(), free_port()];
    let max_handshakes = MAX_HANDSHAKES.to_string();
    let extra = [
        "--transport-max-inbound-handshakes",
        cap(
            "transport_max_inbound_handshakes",
            &max_handshakes,
            "100000",
        ),
        "--transport-max-inbound-connections",
        cap("transport_max_inbound_handshakes", "1024", "100000"),
        "--transport-handshake-timeout",
        "2s",
    ];
    let node = spawn(0, &ports[..1], dir.path(), &extra).await;
    wait_up(&[&node], 1).await;
    let cluster: SocketAddr = format!("127.0.0.1:{}", ports[0]).parse().expect("address");
    let before = rss_kib(pid(&node));
    let peak = PeakRss::start(pid(&node));
    let handshakes = Watch::start(node.http, "tessera_transport_inbound_handshakes");

    let mut attackers = Vec::new();
    for i in 0..connections {
        let source: std::net::IpAddr = format!("127.0.0.{}", 2 + i % 8).parse().expect("ip");
        attackers.push(tokio::spawn(attack(cluster, source, i % 3)));
        if i % 100 == 99 {
            // Let the node accept as the flood grows, as a real one would.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let mut closed_by_node = 0;
    for attacker in attackers {
        if attacker.await.expect("attacker") {
            closed_by_node += 1;
        }
    }
    let most_handshakes = handshakes.stop().await;
    let rss = RssGrowth::new("handshakes", before, peak.stop(pid(&node)).await);
    let refused = metric(
        node.http,
        "tessera_transport_connections_refused_total{reason=\"too_many_handshakes\"}",
    )
    .await;
    let timeouts = metric(node.http, "tessera_transport_handshake_timeouts_total").await;
    println!(
        "{connections} connections: at most {most_handshakes} in their handshake, {refused} \
         closed at once, {timeouts} timed out, {closed_by_node} closed by the node"
    );
    assert!(
        most_handshakes <= MAX_HANDSHAKES,
        "{most_handshakes} handshakes at once"
    );
    assert!(
        refused >= (connections as u64) / 2,
        "only {refused} connections refused"
    );
    assert!(timeouts >= 1, "no handshake timed out");
    assert_eq!(
        closed_by_node, connections,
        "every connection must be closed by the node"
    );
    rss.assert_at_most(RSS_GROWTH_MAX_KIB);
    assert_eq!(
        metric(node.http, "tessera_transport_inbound_handshakes").await,
        0
    );
    // The cluster port still serves members: a second node joins.
    let second = spawn(1, &ports, dir.path(), &[]).await;
    wait_up(&[&node, &second], 2).await;
}

/// One hostile connection from `source`: silent (0), the start of a frame (1) or a
/// handshake-sized frame one byte every 300 ms (2). Returns whether the node closed it
/// within [`DEADLINE`].
async fn attack(cluster: SocketAddr, source: std::net::IpAddr, kind: usize) -> bool {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(source, 0))
        .expect("bind a loopback source address");
    let Ok(mut stream) = socket.connect(cluster).await else {
        // Refused outright (a full backlog): nothing held on the node.
        return true;
    };
    let closed = async {
        match kind {
            0 => {}
            1 => {
                // A length prefix of 1,000 bytes and ten of them.
                let _ = stream.write_all(&1000u32.to_be_bytes()).await;
                let _ = stream.write_all(&[7u8; 10]).await;
            }
            _ => {
                let mut frame = 200u32.to_be_bytes().to_vec();
                frame.extend([1u8; 200]);
                for byte in frame {
                    if stream.write_all(&[byte]).await.is_err() {
                        return;
                    }
                    let mut probe = [0u8; 512];
                    // The node closed the connection (or broke it): the attack is over.
                    let probe = stream.read(&mut probe);
                    if let Ok(Ok(0) | Err(_)) =
                        tokio::time::timeout(Duration::from_millis(300), probe).await
                    {
                        return;
                    }
                }
            }
        }
        let mut sink = Vec::new();
        let _ = stream.read_to_end(&mut sink).await;
    };
    tokio::time::timeout(DEADLINE, closed).await.is_ok()
}

/// Raises this process's open-file limit to its hard limit (the nodes it spawns inherit
/// it); returns the soft limit now in force.
fn raise_open_file_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        limit.rlim_cur = limit.rlim_max.min(65_536);
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        }
    }
    usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
}
