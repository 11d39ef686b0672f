//! `tessera bench cluster`: how fast a cluster forms and how fast a dead node is noticed.
//!
//! For each cluster size N, N nodes run in this process over loopback TCP. Measured:
//! - `all_up_ms`: from starting the first node until every node sees all N members Up;
//! - `detect_ms`: from killing one node (it vanishes without a word, like SIGKILL) until every
//!   other node sees it unreachable.
//!
//! Baseline for detection: the failure detector's own bound, computed in the same run from the
//! same settings — with perfectly regular heartbeats, the time from the last heartbeat until phi
//! crosses the threshold, minus half a heartbeat interval (a kill lands on average half an
//! interval after the last heartbeat). The ratio shows what gossip dissemination and timer
//! resolution add on top of the detector's inherent delay.

use super::{print_json_row, progress};
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_cluster::core::ClusterCoreConfig;
use tessera_cluster::failure_detector::{FailureDetectorConfig, PhiAccrualFailureDetector};
use tessera_cluster::node::{self, ClusterHandle};
use tessera_cluster::transport::{TcpTransport, Transport, TransportConfig};
use tessera_cluster::{Address, MemberStatus};

/// Longest any phase may take before the benchmark gives up on that row.
const PHASE_TIMEOUT: Duration = Duration::from_secs(120);
const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// One failure-detector setting to measure.
#[derive(Clone, Copy, Debug)]
pub struct DetectorSetting {
    pub label: &'static str,
    pub heartbeat_interval: Duration,
    pub acceptable_heartbeat_pause: Duration,
}

/// The settings measured by default: Akka's defaults, and a tuned, faster one.
pub const SETTINGS: [DetectorSetting; 2] = [
    DetectorSetting {
        label: "default",
        heartbeat_interval: Duration::from_secs(1),
        acceptable_heartbeat_pause: Duration::from_secs(3),
    },
    DetectorSetting {
        label: "tuned",
        heartbeat_interval: Duration::from_millis(200),
        acceptable_heartbeat_pause: Duration::from_millis(800),
    },
];

/// One result row.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterBenchRow {
    pub bench: &'static str,
    pub nodes: usize,
    pub setting: &'static str,
    pub heartbeat_interval_ms: u64,
    pub acceptable_heartbeat_pause_ms: u64,
    pub all_up_ms: f64,
    pub detect_ms: f64,
    pub detector_bound_ms: f64,
    /// detect_ms / detector_bound_ms.
    pub ratio: f64,
}

/// What went wrong in a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum ClusterBenchError {
    #[error("cannot start node {index}: {reason}")]
    Start { index: usize, reason: String },
    #[error("{phase} did not complete within {timeout:?} for {nodes} nodes")]
    Timeout {
        phase: &'static str,
        nodes: usize,
        timeout: Duration,
    },
}

struct BenchNode {
    handle: ClusterHandle,
    transport: Arc<TcpTransport>,
}

/// Runs the benchmark for every size in `sizes` and every setting; prints rows as they come.
pub async fn run(sizes: &[u16], json: bool) -> Result<Vec<ClusterBenchRow>, ClusterBenchError> {
    let mut rows = Vec::new();
    if !json {
        println!(
            "{:>5} {:>8} {:>6} {:>7} {:>10} {:>10} {:>12} {:>6}",
            "nodes",
            "setting",
            "hb_ms",
            "pause_ms",
            "all_up_ms",
            "detect_ms",
            "fd_bound_ms",
            "ratio"
        );
    }
    for &size in sizes {
        for setting in SETTINGS {
            let row = run_one(usize::from(size), setting).await?;
            if json {
                print_json_row(&row);
            } else {
                println!(
                    "{:>5} {:>8} {:>6} {:>7} {:>10.0} {:>10.0} {:>12.0} {:>6.2}",
                    row.nodes,
                    row.setting,
                    row.heartbeat_interval_ms,
                    row.acceptable_heartbeat_pause_ms,
                    row.all_up_ms,
                    row.detect_ms,
                    row.detector_bound_ms,
                    row.ratio
                );
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

fn config(setting: DetectorSetting) -> ClusterCoreConfig {
    let mut config = ClusterCoreConfig::default();
    config.heartbeat.interval = setting.heartbeat_interval;
    config.heartbeat.expected_response_after = setting.heartbeat_interval;
    config.heartbeat.fd.acceptable_heartbeat_pause = setting.acceptable_heartbeat_pause;
    config.heartbeat.fd.first_heartbeat_estimate = setting.heartbeat_interval;
    // Measure detection only: nothing is downed while the benchmark watches.
    config.downing = None;
    config
}

async fn start_node(
    index: usize,
    mut config: ClusterCoreConfig,
    seed: Option<Address>,
) -> Result<BenchNode, ClusterBenchError> {
    let error = |reason: String| ClusterBenchError::Start { index, reason };
    let transport_config = TransportConfig {
        bind_address: Address::new("127.0.0.1", 0),
        ..TransportConfig::default()
    };
    let transport = TcpTransport::bind(transport_config, rand::random())
        .await
        .map_err(|e| error(e.to_string()))?;
    config.membership.seed_nodes = seed.into_iter().collect();
    let handle = node::start(transport.clone(), config).map_err(|e| error(e.to_string()))?;
    Ok(BenchNode { handle, transport })
}

async fn wait_until(
    phase: &'static str,
    nodes: usize,
    mut done: impl FnMut() -> bool,
) -> Result<(), ClusterBenchError> {
    let deadline = Instant::now() + PHASE_TIMEOUT;
    while !done() {
        if Instant::now() > deadline {
            return Err(ClusterBenchError::Timeout {
                phase,
                nodes,
                timeout: PHASE_TIMEOUT,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    Ok(())
}

async fn run_one(
    size: usize,
    setting: DetectorSetting,
) -> Result<ClusterBenchRow, ClusterBenchError> {
    progress(&format!(
        "{size} nodes, {} detector: starting nodes",
        setting.label
    ));
    let started = Instant::now();
    let first = start_node(0, config(setting), None).await?;
    let seed = first.transport.local().address.clone();
    // The first node forms the cluster: it joins itself.
    let _ = first.handle.join(seed.clone()).await;
    let mut nodes = vec![first];
    for index in 1..size {
        nodes.push(start_node(index, config(setting), Some(seed.clone())).await?);
    }
    wait_until("all members Up", size, || {
        nodes.iter().all(|n| {
            let s = n.handle.snapshot();
            s.members.len() == size && s.members.iter().all(|m| m.status == MemberStatus::Up)
        })
    })
    .await?;
    let all_up = started.elapsed();
    progress(&format!(
        "{size} nodes, {} detector: all Up after {} ms; letting heartbeats settle, then killing one",
        setting.label,
        all_up.as_millis()
    ));
    // Let the failure detectors collect a history of real heartbeat intervals.
    tokio::time::sleep(setting.heartbeat_interval * 10).await;

    let victim = nodes.pop().ok_or(ClusterBenchError::Start {
        index: size,
        reason: "no node to kill".into(),
    })?;
    let victim_node = victim.handle.self_node().clone();
    victim.handle.abort();
    victim.transport.shutdown();
    let killed = Instant::now();
    wait_until("unreachability detection", size, || {
        nodes
            .iter()
            .all(|n| n.handle.snapshot().unreachable.contains(&victim_node))
    })
    .await?;
    let detect = killed.elapsed();
    progress(&format!(
        "{size} nodes, {} detector: all survivors see it unreachable after {} ms",
        setting.label,
        detect.as_millis()
    ));
    for node in &nodes {
        node.handle.abort();
        node.transport.shutdown();
    }
    let bound = detector_bound(setting);
    Ok(ClusterBenchRow {
        bench: "cluster",
        nodes: size,
        setting: setting.label,
        heartbeat_interval_ms: setting.heartbeat_interval.as_millis() as u64,
        acceptable_heartbeat_pause_ms: setting.acceptable_heartbeat_pause.as_millis() as u64,
        all_up_ms: all_up.as_secs_f64() * 1000.0,
        detect_ms: detect.as_secs_f64() * 1000.0,
        detector_bound_ms: bound.as_secs_f64() * 1000.0,
        ratio: detect.as_secs_f64() / bound.as_secs_f64().max(1e-9),
    })
}

/// The failure detector's inherent detection delay for this setting (see the module docs).
pub fn detector_bound(setting: DetectorSetting) -> Duration {
    let config = FailureDetectorConfig {
        acceptable_heartbeat_pause: setting.acceptable_heartbeat_pause,
        first_heartbeat_estimate: setting.heartbeat_interval,
        ..FailureDetectorConfig::default()
    };
    let Ok(mut fd) = PhiAccrualFailureDetector::new(config) else {
        return Duration::ZERO;
    };
    let start = Instant::now();
    let mut last = start;
    for i in 0..100u32 {
        last = start + setting.heartbeat_interval * i;
        fd.heartbeat(last);
    }
    let step = Duration::from_millis(1);
    let mut elapsed = Duration::ZERO;
    while fd.is_available(last + elapsed) && elapsed < Duration::from_secs(3600) {
        elapsed += step;
    }
    elapsed.saturating_sub(setting.heartbeat_interval / 2)
}
