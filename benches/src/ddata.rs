//! `tessera bench ddata`: Distributed Data on three nodes in this process over loopback TCP.
//!
//! - `update-local`, `update-majority`, `update-all`, `get-majority`: 16 clients each doing
//!   one counter update (or read) after the other for a fixed time; p50/p99 latency and
//!   operations per second. Baseline, in the same run with the same concurrency: the least a
//!   replica round trip costs here — for local updates a request/reply through a task's
//!   bounded queue (the shape every local request takes), for majority one request/response
//!   over the same TCP transport to one peer, for all to both peers at once.
//! - `catch-up-<K>keys`: the cluster holds K keys; a new node starts and joins; time until it
//!   holds them all. Baseline: the same number of bytes the new node received, sent over a
//!   raw loopback TCP connection.
//! - `idle-gossip-<K>keys`: bytes per second all nodes send while nothing changes. Baseline:
//!   what a naive anti-entropy sending every key's digest each round would send.

use super::{percentile, print_json_row, progress};
use bytes::Bytes;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_cluster::core::ClusterCoreConfig;
use tessera_cluster::node::{self, ClusterHandle};
use tessera_cluster::transport::{Lane, ServiceId, TcpTransport, Transport, TransportConfig};
use tessera_cluster::{Address, MemberStatus};
use tessera_ddata::node::{ReplicatorHandle, ReplicatorSettings};
use tessera_ddata::replicator::{GetResult, UpdateResult};
use tessera_ddata::{PNCounter, ReadConsistency, ReplicatedValue, WriteConsistency};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

/// A service id only this benchmark uses, for the transport round-trip baseline.
const ECHO_SERVICE: ServiceId = 900;
const CLIENTS: usize = 16;
const OP_TIMEOUT: Duration = Duration::from_secs(5);
const PHASE_TIMEOUT: Duration = Duration::from_secs(600);

/// The sizes of a run.
#[derive(Debug, Clone)]
pub struct DdataBenchParams {
    /// How long each latency workload runs.
    pub latency_duration: Duration,
    /// Key counts of the catch-up workloads (ascending; the cluster grows between them).
    pub catch_up_keys: Vec<usize>,
    /// How long idle gossip is measured.
    pub idle_duration: Duration,
}

impl DdataBenchParams {
    /// The standard workloads.
    pub fn full() -> Self {
        DdataBenchParams {
            latency_duration: Duration::from_secs(3),
            catch_up_keys: vec![10_000, 100_000, 1_000_000],
            idle_duration: Duration::from_secs(10),
        }
    }

    /// A fast run at a tenth of the sizes.
    pub fn quick() -> Self {
        DdataBenchParams {
            latency_duration: Duration::from_secs(1),
            catch_up_keys: vec![1_000, 10_000, 100_000],
            idle_duration: Duration::from_secs(3),
        }
    }
}

/// One result row. Latencies are in microseconds; `ratio` is tessera's rate over the
/// baseline's (for catch-up: the baseline's time over tessera's; for idle gossip: the naive
/// bytes over tessera's).
#[derive(Debug, Clone, Serialize)]
pub struct DdataBenchRow {
    pub bench: &'static str,
    pub workload: String,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub tessera_per_s: f64,
    pub baseline_per_s: f64,
    pub ratio: f64,
}

/// What went wrong in a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum DdataBenchError {
    #[error("cannot start node {index}: {reason}")]
    Start { index: usize, reason: String },
    #[error("{phase} did not complete within {timeout:?}")]
    Timeout { phase: String, timeout: Duration },
    #[error("{0}")]
    Failed(String),
}

struct BenchNode {
    cluster: ClusterHandle,
    replicator: ReplicatorHandle,
    transport: Arc<TcpTransport>,
}

impl BenchNode {
    async fn stop(self) {
        self.replicator.stop().await;
        self.cluster.abort();
        self.transport.shutdown();
    }
}

async fn start_node(index: usize, seed: Option<Address>) -> Result<BenchNode, DdataBenchError> {
    let error = |reason: String| DdataBenchError::Start { index, reason };
    let transport = TcpTransport::bind(
        TransportConfig {
            bind_address: Address::new("127.0.0.1", 0),
            ..TransportConfig::default()
        },
        rand::random(),
    )
    .await
    .map_err(|e| error(e.to_string()))?;
    let mut config = ClusterCoreConfig::default();
    config.membership.seed_nodes = seed.iter().cloned().collect();
    config.downing = None;
    let cluster = node::start(transport.clone(), config).map_err(|e| error(e.to_string()))?;
    if seed.is_none() {
        let own = transport.local().address.clone();
        let _ = cluster.join(own).await;
    }
    let replicator = tessera_ddata::node::start(
        transport.clone(),
        cluster.watch(),
        ReplicatorSettings::default(),
    )
    .await
    .map_err(|e| error(e.to_string()))?;
    // The echo service of the transport baseline.
    let mut inbound = transport
        .register(ECHO_SERVICE, 8192)
        .map_err(|e| error(e.to_string()))?;
    tokio::spawn(async move {
        while let Some(message) = inbound.recv().await {
            if let Some(reply) = message.reply {
                let _ = reply.respond(message.payload);
            }
        }
    });
    Ok(BenchNode {
        cluster,
        replicator,
        transport,
    })
}

async fn wait_until(phase: &str, mut done: impl FnMut() -> bool) -> Result<(), DdataBenchError> {
    let deadline = Instant::now() + PHASE_TIMEOUT;
    while !done() {
        if Instant::now() > deadline {
            return Err(DdataBenchError::Timeout {
                phase: phase.to_string(),
                timeout: PHASE_TIMEOUT,
            });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

fn all_up(nodes: &[BenchNode], n: usize) -> bool {
    nodes.iter().all(|node| {
        let s = node.cluster.snapshot();
        s.members.len() == n && s.members.iter().all(|m| m.status == MemberStatus::Up)
    })
}

fn increment(
    current: Option<ReplicatedValue>,
    node: &tessera_cluster::UniqueAddress,
) -> Result<ReplicatedValue, String> {
    let mut counter = match current {
        Some(ReplicatedValue::PNCounter(c)) => c,
        _ => PNCounter::new(),
    };
    counter.increment(node, 1);
    Ok(counter.into())
}

/// Latencies (µs) and elapsed time of `CLIENTS` clients running `op` back to back.
async fn measure<F, Fut>(duration: Duration, op: F) -> Result<(Vec<f64>, Duration), DdataBenchError>
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    let started = Instant::now();
    let deadline = started + duration;
    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let op = op.clone();
        clients.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = 0u64;
            while Instant::now() < deadline {
                let t = Instant::now();
                op(client, i).await?;
                latencies.push(t.elapsed().as_secs_f64() * 1e6);
                i += 1;
            }
            Ok::<_, String>(latencies)
        }));
    }
    let mut all = Vec::new();
    for client in clients {
        let latencies = client
            .await
            .map_err(|e| DdataBenchError::Failed(e.to_string()))?
            .map_err(DdataBenchError::Failed)?;
        all.extend(latencies);
    }
    all.sort_by(f64::total_cmp);
    Ok((all, started.elapsed()))
}

fn latency_row(
    workload: &str,
    tessera: &(Vec<f64>, Duration),
    baseline: &(Vec<f64>, Duration),
) -> DdataBenchRow {
    let rate = |(l, d): &(Vec<f64>, Duration)| l.len() as f64 / d.as_secs_f64();
    let (t, b) = (rate(tessera), rate(baseline));
    DdataBenchRow {
        bench: "ddata",
        workload: workload.to_string(),
        p50_us: percentile(&tessera.0, 0.5),
        p99_us: percentile(&tessera.0, 0.99),
        tessera_per_s: t,
        baseline_per_s: b,
        ratio: if b > 0.0 { t / b } else { 0.0 },
    }
}

/// A request/reply through a task's bounded queue: the baseline of a local update.
fn echo_task() -> mpsc::Sender<oneshot::Sender<()>> {
    let (requests, mut queue) = mpsc::channel::<oneshot::Sender<()>>(4096);
    tokio::spawn(async move {
        while let Some(reply) = queue.recv().await {
            let _ = reply.send(());
        }
    });
    requests
}

async fn latency_workloads(
    nodes: &[BenchNode],
    params: &DdataBenchParams,
) -> Result<Vec<DdataBenchRow>, DdataBenchError> {
    let mut rows = Vec::new();
    let duration = params.latency_duration;
    let peers: Vec<Address> = nodes[1..]
        .iter()
        .map(|n| n.transport.local().address.clone())
        .collect();
    let transport = nodes[0].transport.clone();
    let payload = Bytes::from(vec![0u8; 64]);

    let echo = echo_task();
    for (label, consistency) in [
        ("update-local", WriteConsistency::Local),
        ("update-majority", WriteConsistency::Majority { min_cap: 0 }),
        ("update-all", WriteConsistency::All),
    ] {
        progress(&format!("{label}: {CLIENTS} clients for {duration:?}"));
        let replicator = nodes[0].replicator.clone();
        let tessera = measure(duration, move |client, _| {
            let replicator = replicator.clone();
            async move {
                match replicator
                    .update(
                        &format!("latency-{client}"),
                        consistency,
                        OP_TIMEOUT,
                        |c, ctx| increment(c, ctx.self_node),
                    )
                    .await
                {
                    Ok(UpdateResult::Success) => Ok(()),
                    other => Err(format!("update failed: {other:?}")),
                }
            }
        })
        .await?;
        progress(&format!("{label}: baseline"));
        let baseline = match consistency {
            WriteConsistency::Local => {
                let echo = echo.clone();
                measure(duration, move |_, _| {
                    let echo = echo.clone();
                    async move {
                        let (reply, answer) = oneshot::channel();
                        echo.try_send(reply).map_err(|e| e.to_string())?;
                        answer.await.map_err(|e| e.to_string())
                    }
                })
                .await?
            }
            WriteConsistency::All => {
                let (transport, peers, payload) =
                    (transport.clone(), peers.clone(), payload.clone());
                measure(duration, move |_, _| {
                    let (transport, peers, payload) =
                        (transport.clone(), peers.clone(), payload.clone());
                    async move {
                        let requests = peers.iter().map(|p| {
                            transport.request(
                                p,
                                ECHO_SERVICE,
                                Lane::Bulk,
                                payload.clone(),
                                OP_TIMEOUT,
                            )
                        });
                        for r in futures::future::join_all(requests).await {
                            r.map_err(|e| e.to_string())?;
                        }
                        Ok(())
                    }
                })
                .await?
            }
            _ => transport_round_trips(&transport, &peers[0], &payload, duration).await?,
        };
        rows.push(latency_row(label, &tessera, &baseline));
    }

    progress(&format!("get-majority: {CLIENTS} clients for {duration:?}"));
    let replicator = nodes[1].replicator.clone();
    let tessera = measure(duration, move |client, _| {
        let replicator = replicator.clone();
        async move {
            match replicator
                .get(
                    &format!("latency-{client}"),
                    ReadConsistency::Majority { min_cap: 0 },
                    OP_TIMEOUT,
                )
                .await
            {
                Ok(GetResult::Found(_)) => Ok(()),
                other => Err(format!("read failed: {other:?}")),
            }
        }
    })
    .await?;
    progress("get-majority: baseline");
    let baseline = transport_round_trips(&transport, &peers[0], &payload, duration).await?;
    rows.push(latency_row("get-majority", &tessera, &baseline));
    Ok(rows)
}

async fn transport_round_trips(
    transport: &Arc<TcpTransport>,
    peer: &Address,
    payload: &Bytes,
    duration: Duration,
) -> Result<(Vec<f64>, Duration), DdataBenchError> {
    let (transport, peer, payload) = (transport.clone(), peer.clone(), payload.clone());
    measure(duration, move |_, _| {
        let (transport, peer, payload) = (transport.clone(), peer.clone(), payload.clone());
        async move {
            transport
                .request(&peer, ECHO_SERVICE, Lane::Bulk, payload, OP_TIMEOUT)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    })
    .await
}

/// Writes keys `from..to` through node 0 (64 in flight) and waits until every node holds
/// them.
async fn fill(nodes: &[BenchNode], from: usize, to: usize) -> Result<(), DdataBenchError> {
    use futures::StreamExt;
    let replicator = nodes[0].replicator.clone();
    let mut writes = futures::stream::iter(from..to)
        .map(|i| {
            let replicator = replicator.clone();
            async move {
                replicator
                    .update(
                        &format!("key-{i:07}"),
                        WriteConsistency::Local,
                        OP_TIMEOUT,
                        |c, ctx| increment(c, ctx.self_node),
                    )
                    .await
            }
        })
        .buffer_unordered(64);
    while let Some(result) = writes.next().await {
        match result {
            Ok(UpdateResult::Success) => {}
            other => return Err(DdataBenchError::Failed(format!("fill failed: {other:?}"))),
        }
    }
    let expected = (to + CLIENTS) as u64;
    wait_until("the cluster holding every key", || {
        nodes.iter().all(|n| {
            n.replicator
                .counters()
                .keys
                .load(std::sync::atomic::Ordering::Relaxed)
                >= expected
        })
    })
    .await
}

async fn catch_up_and_idle(
    nodes: &[BenchNode],
    params: &DdataBenchParams,
) -> Result<Vec<DdataBenchRow>, DdataBenchError> {
    let mut rows = Vec::new();
    let seed = nodes[0].transport.local().address.clone();
    let mut held = 0;
    for &keys in &params.catch_up_keys {
        progress(&format!("catch-up: the cluster fills up to {keys} keys"));
        fill(nodes, held, keys).await?;
        held = keys;
        let expected = (keys + CLIENTS) as u64;

        progress(&format!("catch-up-{keys}keys: a new node joins"));
        let joining = Instant::now();
        let newcomer = start_node(nodes.len(), Some(seed.clone())).await?;
        // Measured from starting the new node (it joins within tens of milliseconds and
        // starts exchanging data while it joins) until it holds every key.
        let started = joining;
        wait_until("the new node holding every key", || {
            newcomer
                .replicator
                .counters()
                .keys
                .load(std::sync::atomic::Ordering::Relaxed)
                >= expected
        })
        .await?;
        let took = started.elapsed();
        let bytes = newcomer.transport.metrics().snapshot().bytes_in;
        progress(&format!(
            "catch-up-{keys}keys: {:.2} s, {} MiB received; baseline: the same bytes over raw TCP",
            took.as_secs_f64(),
            bytes / (1024 * 1024)
        ));
        let raw = raw_tcp_transfer(bytes).await?;
        rows.push(DdataBenchRow {
            bench: "ddata",
            workload: format!("catch-up-{keys}keys"),
            p50_us: None,
            p99_us: None,
            tessera_per_s: keys as f64 / took.as_secs_f64(),
            baseline_per_s: keys as f64 / raw.as_secs_f64(),
            ratio: raw.as_secs_f64() / took.as_secs_f64(),
        });
        let _ = newcomer
            .cluster
            .leave_and_stop(Duration::from_secs(10))
            .await;
        newcomer.stop().await;
        let n = nodes.len();
        wait_until("the new node gone", || all_up(nodes, n)).await?;
    }

    progress(&format!(
        "idle-gossip-{held}keys: measuring for {:?}",
        params.idle_duration
    ));
    // Let deltas and repairs finish, then count bytes while nothing changes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let sent = |nodes: &[BenchNode]| -> u64 {
        nodes
            .iter()
            .map(|n| n.transport.metrics().snapshot().bytes_out)
            .sum()
    };
    let before = sent(nodes);
    tokio::time::sleep(params.idle_duration).await;
    let per_s = (sent(nodes) - before) as f64 / params.idle_duration.as_secs_f64();
    // Naive anti-entropy: each node sends every key and its 16-byte digest every second.
    let key_bytes = format!("key-{:07}", 0).len() + 16;
    let naive = (nodes.len() * (held + CLIENTS) * key_bytes) as f64;
    rows.push(DdataBenchRow {
        bench: "ddata",
        workload: format!("idle-gossip-{held}keys"),
        p50_us: None,
        p99_us: None,
        tessera_per_s: per_s,
        baseline_per_s: naive,
        ratio: if per_s > 0.0 { naive / per_s } else { 0.0 },
    });
    Ok(rows)
}

/// Time to send `bytes` over a raw loopback TCP connection and have them all read.
async fn raw_tcp_transfer(bytes: u64) -> Result<Duration, DdataBenchError> {
    let io = |e: std::io::Error| DdataBenchError::Failed(format!("raw TCP baseline: {e}"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(io)?;
    let address = listener.local_addr().map_err(io)?;
    let reader = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await?;
        let mut buffer = vec![0u8; 1 << 20];
        let mut total = 0u64;
        while total < bytes {
            let n = socket.read(&mut buffer).await?;
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        Ok::<_, std::io::Error>(total)
    });
    let started = Instant::now();
    let mut socket = tokio::net::TcpStream::connect(address).await.map_err(io)?;
    let chunk = vec![0x5au8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        socket.write_all(&chunk[..n]).await.map_err(io)?;
        left -= n as u64;
    }
    socket.flush().await.map_err(io)?;
    reader
        .await
        .map_err(|e| DdataBenchError::Failed(e.to_string()))?
        .map_err(io)?;
    Ok(started.elapsed())
}

/// Runs every workload and prints a table (or JSON rows).
pub async fn run(
    params: DdataBenchParams,
    json: bool,
) -> Result<Vec<DdataBenchRow>, DdataBenchError> {
    progress("starting 3 nodes");
    let first = start_node(0, None).await?;
    let seed = first.transport.local().address.clone();
    let mut nodes = vec![first];
    for index in 1..3 {
        nodes.push(start_node(index, Some(seed.clone())).await?);
    }
    wait_until("three members Up", || all_up(&nodes, 3)).await?;
    // Every Replicator follows the membership it was published.
    tokio::time::sleep(Duration::from_millis(500)).await;

    if !json {
        println!(
            "{:<24} {:>9} {:>9} {:>14} {:>14} {:>7}",
            "workload", "p50_us", "p99_us", "tessera_per_s", "baseline_per_s", "ratio"
        );
    }
    let mut rows = latency_workloads(&nodes, &params).await?;
    for row in &rows {
        emit(row, json);
    }
    for row in catch_up_and_idle(&nodes, &params).await? {
        emit(&row, json);
        rows.push(row);
    }
    for node in nodes {
        node.stop().await;
    }
    Ok(rows)
}

fn emit(row: &DdataBenchRow, json: bool) {
    if json {
        print_json_row(row);
    } else {
        let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
        println!(
            "{:<24} {:>9} {:>9} {:>14.0} {:>14.0} {:>7.2}",
            row.workload,
            us(row.p50_us),
            us(row.p99_us),
            row.tessera_per_s,
            row.baseline_per_s,
            row.ratio
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_workload_runs_and_reports_a_ratio() {
        let params = DdataBenchParams {
            latency_duration: Duration::from_millis(200),
            catch_up_keys: vec![200],
            // Longer than two rounds of gossip and heartbeats (1 s each): a shorter window
            // can fall between the rounds and count nothing (it did, once in CI).
            idle_duration: Duration::from_millis(2_500),
        };
        let rows = run(params, true).await.unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r.workload.as_str()).collect();
        assert_eq!(
            names,
            [
                "update-local",
                "update-majority",
                "update-all",
                "get-majority",
                "catch-up-200keys",
                "idle-gossip-200keys"
            ]
        );
        for row in &rows {
            assert!(
                row.tessera_per_s > 0.0 && row.baseline_per_s > 0.0,
                "{row:?}"
            );
            assert!(row.ratio > 0.0, "{row:?}");
        }
    }
}
