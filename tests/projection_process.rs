//! Projections in real `tessera node` processes on 127.0.0.1, into a PostgreSQL server of the
//! test's own: the `tessera` binary's two projections of the accounts (`account-ledger` at
//! least once, `account-balances` exactly once, 4 instances each; see
//! `tessera_example_account::projections`).
//!
//! - Through a SIGKILL and restart of the node running most instances, under 64 callers each
//!   depositing amounts no other deposit has: every deposit answered 200 is in both read
//!   models, none refused is in either, the exactly-once tables hold exactly the journal's
//!   events (each account's events 1..=n once, summing to its balance), and an event the
//!   ledger holds twice was first handled within the offset-save window before its
//!   instance's run ended.
//! - Then, through the CLI, `account-ledger` is paused, reset and resumed: every event is
//!   handled again, and `GET /projections` shows its lag back at 0.
//! - A node paused with SIGSTOP in the middle of its instances' transactions (held there by
//!   table locks) until it is downed, then resumed: no exactly-once row of it is committed,
//!   and no offset record of its instances accepted by the survivors' replicas, after their
//!   successors started.

mod common;

use common::{exe, free_port, kill, test_dir, wait_ready, wait_up, wait_views};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tessera_example_account::projections::{BALANCES, INSTANCES, LEDGER};
use tessera_harness::demo::NodeProcess;
use tessera_harness::http_client;
use tessera_harness::postgres::PostgresServer;
use tessera_journal::slice::SliceRange;
use tokio::process::Command;
use tokio::sync::Mutex;
use tokio_postgres::{Client, NoTls};

const NODES: usize = 3;
const CALLERS: u64 = 64;
const ACCOUNTS: u64 = 1_000;
const WORKLOAD: Duration = Duration::from_secs(20);
/// The projections' offset-save interval (the default, 500 ms), and what a save and a
/// handler call with its retries' backoff (0.1 + 0.2 + 0.4 s) may take besides on a loaded
/// machine: an event handled this long before its run ended may be handled again by the
/// next run.
const SAVE_WINDOW: Duration = Duration::from_millis(500 + 3_000);
const DEADLINE: Duration = Duration::from_secs(120);

/// Failure detection, downing and rebalancing in seconds, so that the tests stay short.
const QUICK: [&str; 4] = ["--stable-after", "2s", "--rebalance-interval", "2s"];

struct Cluster {
    server: PostgresServer,
    ports: Vec<u16>,
    nodes: Vec<NodeProcess>,
}

async fn spawn(i: usize, ports: &[u16], dir: &Path, server: &PostgresServer) -> NodeProcess {
    common::spawn_with_read_models(i, ports, dir, &QUICK, server).await
}

async fn cluster(dir: &Path) -> Cluster {
    let server = PostgresServer::start().await.expect("PostgreSQL starts");
    let ports: Vec<u16> = (0..NODES).map(|_| free_port()).collect();
    let mut nodes = Vec::new();
    for i in 0..NODES {
        nodes.push(spawn(i, &ports, dir, &server).await);
        wait_up(&nodes.iter().collect::<Vec<_>>(), i + 1).await;
    }
    wait_ready(&nodes.iter().collect::<Vec<_>>()).await;
    Cluster {
        server,
        ports,
        nodes,
    }
}

/// The test's own sessions' name, which lock waits are counted without.
const TEST_SESSIONS: &str = "projection-test";

async fn connect(server: &PostgresServer) -> Client {
    let config = format!(
        "{} application_name={TEST_SESSIONS}",
        server.connection_string()
    );
    let (client, connection) = tokio_postgres::connect(&config, NoTls)
        .await
        .expect("PostgreSQL connection");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// One instance as `GET /projections` shows it.
#[derive(Debug, Clone, PartialEq)]
struct Instance {
    projection: String,
    index: u64,
    node: Option<String>,
    state: String,
}

async fn instances(http: SocketAddr) -> Option<Vec<Instance>> {
    let response = http_client::get(http, "/projections", Duration::from_secs(10))
        .await
        .ok()?;
    let json = response.json()?;
    let mut all = Vec::new();
    for projection in json["projections"].as_array()? {
        for instance in projection["instance_status"].as_array()? {
            all.push(Instance {
                projection: projection["name"].as_str()?.to_string(),
                index: instance["index"].as_u64()?,
                node: instance["node"].as_str().map(str::to_string),
                state: instance["state"].as_str()?.to_string(),
            });
        }
    }
    Some(all)
}

/// Waits until `http` reports every instance of both projections running, and `accept`
/// holds of them; returns them.
async fn wait_instances(
    http: SocketAddr,
    what: &str,
    accept: impl Fn(&[Instance]) -> bool,
) -> Vec<Instance> {
    let start = Instant::now();
    loop {
        if let Some(all) = instances(http).await
            && all.len() == 2 * INSTANCES as usize
            && all.iter().all(|i| i.state == "running")
            && accept(&all)
        {
            return all;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{what}: not within {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn on_node<'a>(all: &'a [Instance], node: &str) -> impl Iterator<Item = &'a Instance> {
    all.iter().filter(move |i| i.node.as_deref() == Some(node))
}

/// How a deposit was answered.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    Acknowledged,
    Refused,
    Unknown,
}

fn outcome(response: &http_client::HttpResponse) -> Outcome {
    match response.status {
        200 => Outcome::Acknowledged,
        400..=499 => Outcome::Refused,
        503 if response
            .json()
            .is_some_and(|j| j["outcome"] == "not_applied") =>
        {
            Outcome::Refused
        }
        0 if response.body.contains("onnection refused") => Outcome::Refused,
        _ => Outcome::Unknown,
    }
}

/// 64 callers deposit into 1,000 accounts through every node until `stop`; each deposit's
/// amount is its own, so that a read model's row names the deposit it came from. Returns each
/// amount's outcome and account.
async fn deposits(
    nodes: Arc<std::sync::RwLock<Vec<SocketAddr>>>,
    stop: Arc<AtomicBool>,
) -> BTreeMap<i64, (Outcome, String)> {
    let outcomes: Arc<Mutex<BTreeMap<i64, (Outcome, String)>>> = Arc::default();
    let mut callers = Vec::new();
    for caller in 0..CALLERS {
        let nodes = nodes.clone();
        let stop = stop.clone();
        let outcomes = outcomes.clone();
        callers.push(tokio::spawn(async move {
            let mut next = common::deposits::caller_random(caller);
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let amount = ((caller + 1) * 10_000_000 + n) as i64;
                let id = format!("acct-{}", next() % ACCOUNTS);
                let pick = next();
                let node = {
                    let nodes = nodes.read().expect("the nodes' addresses");
                    nodes[(pick % nodes.len() as u64) as usize]
                };
                let body = format!("{{\"deposit\": {amount}}}");
                let response = common::deposits::command(node, &id, &body).await;
                let outcome = outcome(&response);
                outcomes.lock().await.insert(amount, (outcome, id));
                if response.status == 0 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }));
    }
    for caller in callers {
        caller.await.expect("caller");
    }
    outcomes.lock().await.clone()
}

/// One row of a read model.
#[derive(Debug, Clone)]
struct Row {
    persistence_id: String,
    sequence_nr: i64,
    slice: i32,
    amount: i64,
    handled_by: i32,
    written_at_ms: i64,
    /// When the row's transaction committed (the server tracks commit timestamps).
    committed_at_ms: i64,
}

async fn rows(client: &Client, table: &str) -> Vec<Row> {
    let query = format!(
        "SELECT persistence_id, sequence_nr, slice, amount, handled_by, \
         (extract(epoch FROM written_at) * 1000)::bigint, \
         (extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1000)::bigint \
         FROM {table} ORDER BY written_at"
    );
    client
        .query(&query, &[])
        .await
        .expect("rows")
        .iter()
        .map(|row| Row {
            persistence_id: row.get(0),
            sequence_nr: row.get(1),
            slice: row.get(2),
            amount: row.get(3),
            handled_by: row.get(4),
            written_at_ms: row.get(5),
            committed_at_ms: row.get(6),
        })
        .collect()
}

async fn balances_table(client: &Client) -> BTreeMap<String, u64> {
    client
        .query("SELECT account_id, balance FROM account_balance", &[])
        .await
        .expect("balances")
        .iter()
        .map(|row| (row.get(0), row.get::<_, i64>(1) as u64))
        .collect()
}

/// The instance whose slice range holds `slice`.
fn instance_of(slice: i32) -> usize {
    let ranges = SliceRange::split(INSTANCES).expect("ranges");
    ranges
        .iter()
        .position(|r| (i32::from(r.first)..=i32::from(r.last)).contains(&slice))
        .expect("a range holds every slice")
}

/// The amounts of the rows.
fn amounts(rows: &[Row]) -> BTreeSet<i64> {
    rows.iter().map(|r| r.amount).collect()
}

/// Every acknowledged deposit is among `amounts`, and no refused one.
fn check_outcomes(
    table: &str,
    outcomes: &BTreeMap<i64, (Outcome, String)>,
    amounts: &BTreeSet<i64>,
) {
    let missing: Vec<_> = outcomes
        .iter()
        .filter(|(amount, (o, _))| *o == Outcome::Acknowledged && !amounts.contains(*amount))
        .take(10)
        .collect();
    assert!(
        missing.is_empty(),
        "{table}: acknowledged, not handled: {missing:?}"
    );
    let refused: Vec<_> = outcomes
        .iter()
        .filter(|(amount, (o, _))| *o == Outcome::Refused && amounts.contains(*amount))
        .take(10)
        .collect();
    assert!(
        refused.is_empty(),
        "{table}: refused, yet handled: {refused:?}"
    );
}

/// Each event the ledger holds twice was first handled within [`SAVE_WINDOW`] before the run
/// that handled it ended. The end of that run is estimated as the last first-time handling by
/// the same process and instance before any event it first handled (at or after this one)
/// was handled again: a re-handling comes only after the run before ended. Returns
/// (duplicates, the largest gap).
fn check_duplicates_within_the_save_window(rows: &[Row]) -> (usize, Duration) {
    let mut copies: BTreeMap<(&str, i64), Vec<&Row>> = BTreeMap::new();
    for row in rows {
        copies
            .entry((row.persistence_id.as_str(), row.sequence_nr))
            .or_default()
            .push(row);
    }
    // First-time handlings per (process, instance), in time order (rows are).
    let mut first_times: BTreeMap<(i32, usize), Vec<i64>> = BTreeMap::new();
    for copies in copies.values() {
        let first = copies[0];
        first_times
            .entry((first.handled_by, instance_of(first.slice)))
            .or_default()
            .push(first.written_at_ms);
    }
    for times in first_times.values_mut() {
        times.sort_unstable();
    }
    // Re-handlings of the events each (process, instance) handled first: (first, again).
    let mut rehandled: BTreeMap<(i32, usize), Vec<(i64, i64)>> = BTreeMap::new();
    for copies in copies.values() {
        let first = copies[0];
        for again in &copies[1..] {
            rehandled
                .entry((first.handled_by, instance_of(first.slice)))
                .or_default()
                .push((first.written_at_ms, again.written_at_ms));
        }
    }
    let mut duplicates = 0;
    let mut largest = 0;
    for (event, copies) in &copies {
        let first = copies[0];
        let key = (first.handled_by, instance_of(first.slice));
        let times = &first_times[&key];
        // The earliest re-handling of an event this run (or a later one) handled first.
        let run_over = rehandled
            .get(&key)
            .into_iter()
            .flatten()
            .filter(|(first_at, _)| *first_at >= first.written_at_ms)
            .map(|(_, again_at)| *again_at)
            .min()
            .unwrap_or(i64::MAX);
        for _again in &copies[1..] {
            duplicates += 1;
            let end = times
                .iter()
                .take_while(|t| **t <= run_over)
                .last()
                .copied()
                .unwrap_or(first.written_at_ms);
            let gap = end - first.written_at_ms;
            largest = largest.max(gap);
            assert!(
                gap <= SAVE_WINDOW.as_millis() as i64,
                "{event:?} first handled by process {} {gap} ms before its run ended, then \
                 again: outside the offset-save window",
                first.handled_by,
            );
        }
    }
    (duplicates, Duration::from_millis(largest as u64))
}

/// The exactly-once table holds each account's events 1..=n once, summing to its balance.
fn check_exactly_the_journal(rows: &[Row], balances: &BTreeMap<String, u64>) {
    let mut by_log: BTreeMap<&str, Vec<&Row>> = BTreeMap::new();
    for row in rows {
        by_log.entry(&row.persistence_id).or_default().push(row);
    }
    for (log, mut events) in by_log {
        events.sort_by_key(|r| r.sequence_nr);
        let seqs: Vec<i64> = events.iter().map(|r| r.sequence_nr).collect();
        let expected: Vec<i64> = (1..=events.len() as i64).collect();
        assert_eq!(seqs, expected, "{log}: events not 1..=n once each");
        let account = log.strip_prefix("account|").expect("an account's log");
        let sum: i64 = events.iter().map(|r| r.amount).sum();
        assert_eq!(
            sum as u64,
            balances.get(account).copied().unwrap_or(0),
            "{log}: the events' sum is not the account's balance"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_read_models_keep_every_acknowledged_deposit_through_a_node_kill() {
    let _serial = common::one_at_a_time().await;
    let dir = test_dir();
    let mut cluster = cluster(dir.path()).await;
    let mut http: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.http).collect();
    let before = wait_instances(http[0], "8 instances running", |_| true).await;

    let stop = Arc::new(AtomicBool::new(false));
    let addresses = Arc::new(std::sync::RwLock::new(http.clone()));
    let workload = tokio::spawn(deposits(addresses.clone(), stop.clone()));
    tokio::time::sleep(WORKLOAD / 2).await;
    let now = instances(http[0]).await.unwrap_or(before);
    let busiest = (0..NODES)
        .max_by_key(|i| on_node(&now, &cluster.nodes[*i].cluster).count())
        .expect("nodes");
    println!(
        "SIGKILL node {busiest}: it runs {} instances",
        on_node(&now, &cluster.nodes[busiest].cluster).count()
    );
    kill(&mut cluster.nodes[busiest]).await;
    cluster.nodes[busiest] = spawn(busiest, &cluster.ports, dir.path(), &cluster.server).await;
    // Its HTTP port is new.
    http[busiest] = cluster.nodes[busiest].http;
    *addresses.write().expect("the nodes' addresses") = http.clone();
    tokio::time::sleep(WORKLOAD / 2).await;
    stop.store(true, Ordering::Relaxed);
    let outcomes = workload.await.expect("workload");
    let count = |o: Outcome| outcomes.values().filter(|(x, _)| *x == o).count();
    println!(
        "{} deposits: {} acknowledged, {} refused, {} unknown",
        outcomes.len(),
        count(Outcome::Acknowledged),
        count(Outcome::Refused),
        count(Outcome::Unknown)
    );
    assert!(count(Outcome::Acknowledged) > 1_000);

    let all: Vec<&NodeProcess> = cluster.nodes.iter().collect();
    wait_up(&all, NODES).await;
    let touched: BTreeSet<String> = outcomes.values().map(|(_, id)| id.clone()).collect();
    let mut balances = BTreeMap::new();
    for id in &touched {
        balances.insert(id.clone(), common::deposits::balance(http[0], id).await);
    }
    balances.retain(|_, b| *b > 0);

    // Caught up: the balances table is the accounts', and the ledger holds every event.
    let client = connect(&cluster.server).await;
    let start = Instant::now();
    let (events, ledger) = loop {
        let events = rows(&client, "account_event").await;
        let ledger = rows(&client, "account_ledger").await;
        let in_ledger: BTreeSet<i64> = amounts(&ledger);
        if balances_table(&client).await == balances
            && events.iter().all(|e| in_ledger.contains(&e.amount))
        {
            break (events, ledger);
        }
        assert!(
            start.elapsed() < DEADLINE,
            "the read models did not catch up"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!(
        "caught up {:.1}s after the balances were read: {} events, {} ledger rows",
        start.elapsed().as_secs_f64(),
        events.len(),
        ledger.len()
    );

    check_outcomes("account_event", &outcomes, &amounts(&events));
    check_outcomes("account_ledger", &outcomes, &amounts(&ledger));
    check_exactly_the_journal(&events, &balances);
    let (duplicates, largest) = check_duplicates_within_the_save_window(&ledger);
    println!(
        "account_ledger: {duplicates} events handled twice, each first handled at most \
         {largest:?} before its run ended"
    );

    // An operator rebuilds the ledger: pause, reset, resume, with the CLI.
    let events_now: BTreeSet<(String, i64)> = ledger
        .iter()
        .map(|r| (r.persistence_id.clone(), r.sequence_nr))
        .collect();
    let rows_before = ledger.len();
    let listed = cli(http[1], &["projections"]).await;
    assert!(
        listed.contains(LEDGER) && listed.contains(BALANCES),
        "{listed}"
    );
    // Each step once every node knows the one before (a reset is taken only while the node
    // asked knows the projection paused; an instance applies it when resumed).
    cli(http[1], &["projections", "pause", LEDGER]).await;
    wait_control(&http, "paused", |p| p["paused"] == true).await;
    cli(http[1], &["projections", "reset", LEDGER]).await;
    wait_control(&http, "reset", |p| p["resets"] == 1).await;
    cli(http[1], &["projections", "resume", LEDGER]).await;
    let start = Instant::now();
    loop {
        let ledger = rows(&client, "account_ledger").await;
        let mut counts: BTreeMap<(&str, i64), usize> = BTreeMap::new();
        for row in &ledger[rows_before..] {
            *counts
                .entry((row.persistence_id.as_str(), row.sequence_nr))
                .or_default() += 1;
        }
        let again = events_now
            .iter()
            .all(|(pid, seq)| counts.contains_key(&(pid.as_str(), *seq)));
        let lag_zero = http_client::get(http[0], "/projections", Duration::from_secs(10))
            .await
            .ok()
            .and_then(|r| r.json())
            .is_some_and(|json| {
                json["projections"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p["name"] == LEDGER && p["lag_events"] == 0)
            });
        if again && lag_zero {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "after the reset, the ledger was not rebuilt with its lag at 0"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "after pause, reset and resume by the CLI: all {} events handled again in {:.1}s, lag 0",
        events_now.len(),
        start.elapsed().as_secs_f64()
    );
    for node in &mut cluster.nodes {
        kill(node).await;
    }
}

/// The offset log of `instance` as node `http` sees it (`GET /journal/...`): its writer's
/// epoch on that node, if it writes it there, and each reachable replica's (highest sequence
/// number, last entry's epoch) by address. None when the node does not answer.
async fn offset_log(http: SocketAddr, instance: &Instance) -> Option<OffsetLog> {
    let path = format!(
        "/journal/%23projection%7C{}%7C{}-of-{INSTANCES}",
        instance.projection, instance.index
    );
    let response = http_client::get(http, &path, Duration::from_secs(10))
        .await
        .ok()?;
    let json = response.json()?;
    let writer = json["writer"]["epoch"].clone();
    let replicas = json["replicas"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| !r["last"].is_null())
        .map(|r| {
            let address = r["address"].as_str().unwrap_or("?").to_string();
            let highest = r["highest_sequence_nr"].as_u64().unwrap_or(0);
            (address, (highest, epoch_order(&r["last"]["epoch"])))
        })
        .collect();
    Some(OffsetLog {
        writer: (!writer.is_null()).then(|| epoch_order(&writer)),
        replicas,
    })
}

struct OffsetLog {
    writer: Option<Epoch>,
    replicas: Replicas,
}

/// Each replica's (highest sequence number, last entry's epoch) by address.
type Replicas = BTreeMap<String, (u64, Epoch)>;

/// An epoch in its order: (counter, writer).
type Epoch = (u64, String);

fn epoch_order(epoch: &Value) -> Epoch {
    (
        epoch["counter"].as_u64().unwrap_or(0),
        epoch["writer"].as_str().unwrap_or("").to_string(),
    )
}

/// Waits until every node shows `account-ledger`'s control as `accept` says.
async fn wait_control(http: &[SocketAddr], what: &str, accept: impl Fn(&Value) -> bool) {
    let start = Instant::now();
    loop {
        let mut shown = 0;
        for node in http {
            let ledger = http_client::get(*node, "/projections", Duration::from_secs(10))
                .await
                .ok()
                .and_then(|r| r.json())
                .and_then(|json| {
                    json["projections"]
                        .as_array()?
                        .iter()
                        .find(|p| p["name"] == LEDGER)
                        .cloned()
                });
            if ledger.as_ref().is_some_and(&accept) {
                shown += 1;
            }
        }
        if shown == http.len() {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{LEDGER} not {what} on every node"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs `tessera ARGS --node http://NODE` and returns its standard output; it must succeed.
async fn cli(node: SocketAddr, args: &[&str]) -> String {
    let url = format!("http://{node}");
    let output = Command::new(exe())
        .args(args)
        .args(["--node", &url])
        .output()
        .await
        .expect("the CLI runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "tessera {args:?}: {}\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The envelopes instance `index` of `projection` handled since its last save, as `http`
/// reports it (None when it does not answer).
async fn unsaved(http: SocketAddr, projection: &str, index: u64) -> Option<u64> {
    let json = http_client::get(http, "/projections", Duration::from_secs(10))
        .await
        .ok()?
        .json()?;
    json["projections"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["name"] == projection)
        .flat_map(|p| p["instance_status"].as_array().into_iter().flatten())
        .find(|i| i["index"].as_u64() == Some(index))
        .and_then(|i| i["unsaved"].as_u64())
}

/// A session queued for `table` locked against writes (behind whoever holds or waits for
/// it), which holds the lock once it has it until released.
struct TableLock {
    pid: i32,
    release: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl TableLock {
    async fn queue(server: &PostgresServer, table: &str) -> TableLock {
        let client = connect(server).await;
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .expect("a backend")
            .get(0);
        let (release, released) = tokio::sync::oneshot::channel();
        let lock = format!("BEGIN; LOCK TABLE {table} IN EXCLUSIVE MODE");
        let task = tokio::spawn(async move {
            client.batch_execute(&lock).await.expect("the table locked");
            let _ = released.await;
            client.batch_execute("COMMIT").await.expect("unlocked");
        });
        TableLock { pid, release, task }
    }

    /// Lets the lock go once it is taken; returns when it was.
    async fn release(self) {
        let _ = self.release.send(());
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("the lock taken and let go")
            .expect("the lock's session");
    }
}

/// Waits until no replica of the offset logs of `instances` (each with the node its
/// successor runs on) grew for two seconds, four save intervals, as the successor's node sees
/// them; returns what each replica then held.
async fn wait_offset_logs_quiet(instances: &[(Instance, SocketAddr, Epoch)]) -> Vec<Replicas> {
    let start = Instant::now();
    let mut last: Option<(Vec<Replicas>, Instant)> = None;
    loop {
        let mut now = Vec::new();
        for (instance, http, _) in instances {
            let log = offset_log(*http, instance)
                .await
                .expect("the successor answers");
            now.push(log.replicas);
        }
        match &last {
            Some((then, since)) if *then == now => {
                if since.elapsed() >= Duration::from_secs(2) {
                    return now;
                }
            }
            _ => last = Some((now, Instant::now())),
        }
        assert!(
            start.elapsed() < DEADLINE,
            "the successors' offset logs still grow"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until `count` backends of the nodes wait for a lock on `table`.
async fn wait_lock_waiters(client: &Client, table: &str, count: i64) {
    let start = Instant::now();
    loop {
        let waiting: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
                 WHERE NOT l.granted AND l.relation = $1::text::regclass \
                 AND a.application_name <> $2",
                &[&table, &TEST_SESSIONS],
            )
            .await
            .expect("pg_locks")
            .get(0);
        if waiting >= count {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{waiting} of {count} handlers wait for {table}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until backend `pid` waits for a lock.
async fn wait_backend_waiting(client: &Client, pid: i32) {
    let start = Instant::now();
    loop {
        let waiting: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid = $1",
                &[&pid],
            )
            .await
            .expect("pg_locks")
            .get(0);
        if waiting > 0 {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "backend {pid} waits for no lock"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn signal(node: &NodeProcess, signal: i32) {
    let pid = node.child.id().expect("running") as i32;
    // SAFETY: kill(2) with a pid we own and a valid signal has no memory effects.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_paused_until_downed_writes_nothing_after_its_successors_started() {
    let _serial = common::one_at_a_time().await;
    let dir = test_dir();
    let mut cluster = cluster(dir.path()).await;
    let http: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.http).collect();
    wait_instances(http[0], "8 instances running", |_| true).await;
    let stop = Arc::new(AtomicBool::new(false));
    let addresses = Arc::new(std::sync::RwLock::new(http.clone()));
    let workload = tokio::spawn(deposits(addresses, stop.clone()));
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Not the oldest node (the coordinator's): the point is the projections' instances. One
    // that runs instances of both, once the rebalancing placed them.
    let both_on_one = |all: &[Instance]| {
        (1..NODES).any(|i| {
            let on = |p: &str| on_node(all, &cluster.nodes[i].cluster).any(|x| x.projection == p);
            on(BALANCES) && on(LEDGER)
        })
    };
    let now = wait_instances(
        http[0],
        "a node but the oldest running both projections",
        both_on_one,
    )
    .await;
    let runs = |i: usize, projection: &str| {
        on_node(&now, &cluster.nodes[i].cluster).any(|instance| instance.projection == projection)
    };
    let paused = (1..NODES)
        .max_by_key(|i| {
            let both = runs(*i, BALANCES) && runs(*i, LEDGER);
            (both, on_node(&now, &cluster.nodes[*i].cluster).count())
        })
        .expect("nodes");
    let paused_address = cluster.nodes[paused].cluster.clone();
    let paused_pid = cluster.nodes[paused].child.id().expect("running") as i32;
    let moved: Vec<Instance> = on_node(&now, &paused_address).cloned().collect();
    let paused_ledger = moved
        .iter()
        .find(|i| i.projection == LEDGER)
        .expect("a ledger instance")
        .index;
    // The node is paused in the middle of its transactions, the pause a fence is for: every
    // instance's handler is held in PostgreSQL first, `account-balances` between its effect
    // and its offset commit, `account-ledger` in its insert.
    let client = connect(&cluster.server).await;
    let balances_lock = TableLock::queue(&cluster.server, "account_balance").await;
    let mut ledger_lock = TableLock::queue(&cluster.server, "account_ledger").await;
    wait_lock_waiters(&client, "account_balance", i64::from(INSTANCES)).await;
    // The paused node's ledger instance must have handled envelopes it has not saved, so that
    // it saves them on its way out: while its held call is the first since a save, every
    // held insert is let go and the next ones held.
    let holding = Instant::now();
    loop {
        wait_lock_waiters(&client, "account_ledger", i64::from(INSTANCES)).await;
        if unsaved(cluster.nodes[paused].http, LEDGER, paused_ledger)
            .await
            .is_some_and(|n| n > 0)
        {
            break;
        }
        assert!(
            holding.elapsed() < DEADLINE,
            "the paused node's ledger instance held nothing unsaved"
        );
        let next = TableLock::queue(&cluster.server, "account_ledger").await;
        wait_backend_waiting(&client, next.pid).await;
        std::mem::replace(&mut ledger_lock, next).release().await;
    }
    println!("SIGSTOP node {paused} (process {paused_pid}): it runs {moved:?}");
    signal(&cluster.nodes[paused], libc::SIGSTOP);
    // What the successors commit waits for the paused node's transactions to end: a lock on
    // `account_event` queues behind them (their inserts hold the table), and every later
    // insert behind it. So a commit of the paused node, if its fence let it through, would
    // come before its successors' and be refused by nothing else.
    let queued = TableLock::queue(&cluster.server, "account_event").await;
    wait_backend_waiting(&client, queued.pid).await;
    // Likewise the ledger: a second lock queues behind the held inserts, so that once they
    // are let go the paused node's insert is done (in its own transaction) and every later
    // one, the successors' included, waits until the end of the test: the successors then
    // write no offset record, and one that a survivors' replica takes is the paused node's.
    let ledger_queued = TableLock::queue(&cluster.server, "account_ledger").await;
    wait_backend_waiting(&client, ledger_queued.pid).await;

    let survivors: Vec<&NodeProcess> = (0..NODES)
        .filter(|i| *i != paused)
        .map(|i| &cluster.nodes[i])
        .collect();
    wait_views(&survivors, "the paused node removed", |views| {
        views.iter().all(|v| {
            v.as_ref().is_some_and(|(members, _)| {
                members
                    .iter()
                    .all(|(address, _, _)| *address != paused_address)
            })
        })
    })
    .await;
    let after = wait_instances(survivors[0].http, "the instances restarted", |all| {
        on_node(all, &paused_address).count() == 0
    })
    .await;
    // The successors have started (each took its slot and offset log before it ran).
    let successors_started: i64 = client
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            &[],
        )
        .await
        .expect("now")
        .get(0);
    let mut successors = Vec::new();
    for instance in &moved {
        let successor = after
            .iter()
            .find(|i| i.projection == instance.projection && i.index == instance.index)
            .and_then(|i| i.node.clone())
            .expect("a successor");
        let node = survivors
            .iter()
            .find(|n| n.cluster == successor)
            .expect("a survivor");
        let log = offset_log(node.http, instance)
            .await
            .expect("the successor answers");
        let epoch = log.writer.expect("the successor writes its offset log");
        successors.push((instance.clone(), node.http, epoch));
    }

    stop.store(true, Ordering::Relaxed);
    let outcomes = workload.await.expect("workload");
    println!("{} deposits", outcomes.len());
    ledger_lock.release().await;
    let quiet = wait_offset_logs_quiet(&successors).await;
    // The held statements of `account-balances` go on while the node is still stopped; it
    // resumes with their answers waiting, well within the pool's idle-transaction timeout
    // (which would otherwise end its transactions for it).
    balances_lock.release().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!("SIGCONT node {paused}");
    signal(&cluster.nodes[paused], libc::SIGCONT);
    // Taken once the paused node's transactions ended.
    queued.release().await;
    let exited = tokio::time::timeout(DEADLINE, cluster.nodes[paused].child.wait())
        .await
        .expect("the downed node exits")
        .expect("its status");
    println!("the paused node exited: {exited}");
    // Again, after the wait above borrowed the paused node.
    let survivors: Vec<&NodeProcess> = (0..NODES)
        .filter(|i| *i != paused)
        .map(|i| &cluster.nodes[i])
        .collect();

    // No exactly-once row of the paused process after its successors started, none twice.
    let events = rows(&client, "account_event").await;
    let late: Vec<&Row> = events
        .iter()
        .filter(|r| r.handled_by == paused_pid && r.committed_at_ms > successors_started)
        .take(5)
        .collect();
    assert!(
        late.is_empty(),
        "the paused node committed after its successors started: {late:?}"
    );
    let distinct: BTreeSet<(&str, i64)> = events
        .iter()
        .map(|r| (r.persistence_id.as_str(), r.sequence_nr))
        .collect();
    assert_eq!(
        distinct.len(),
        events.len(),
        "an event is in account_event twice"
    );
    // No offset of the paused node's instances accepted after its successors started: the
    // successors wrote none since their logs went quiet, so a survivors' replica whose log
    // changed since (grew, or had its tail replaced) changed by a survivor's writer, with the
    // successor's epoch or a later one (a survivor's that recovered the log since).
    for ((instance, _, epoch), at_quiet) in successors.iter().zip(&quiet) {
        for node in &survivors {
            let log = offset_log(node.http, instance)
                .await
                .expect("a survivor answers");
            for (address, (highest, last)) in &log.replicas {
                let Some(then) = at_quiet.get(address) else {
                    continue;
                };
                assert!(
                    (highest, last) == (&then.0, &then.1) || last >= epoch,
                    "{instance:?}: the replica at {address} holds offset records up to \
                     {highest}, the last of epoch {last:?} (it held {then:?}), below the \
                     successor's {epoch:?}"
                );
            }
        }
    }
    ledger_queued.release().await;
    println!(
        "{} exactly-once rows, none of process {paused_pid} after its successors started; \
         {} offset logs written only by their successors",
        events.len(),
        successors.len()
    );
    // The paused node exited; the others are stopped here.
    for (i, node) in cluster.nodes.iter_mut().enumerate() {
        if i != paused {
            kill(node).await;
        }
    }
}
