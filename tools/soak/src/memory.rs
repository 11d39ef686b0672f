//! Every node's memory during the soak: its resident set (`VmRSS` of `/proc/<pid>/status`)
//! against the bound the soak states, and the node's own gauges of what its caps bound
//! (live entities, transport peers, HTTP connections, buffered messages; Distributed Data keys
//! are reported, no cap bounds them yet).

use super::metrics::{metrics_text, series_value};
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::watch;

const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);
const HTTP_TIMEOUT: Duration = Duration::from_secs(2);

/// A gauge a node exports and the cap that bounds it (the node's default configuration,
/// which the soak's nodes run with).
pub struct Cap {
    pub name: &'static str,
    pub series: &'static str,
    /// None: reported only.
    pub limit: Option<u64>,
    pub setting: &'static str,
}

/// The gauges the soak watches.
pub const CAPS: &[Cap] = &[
    Cap {
        name: "live entities",
        series: "tessera_entities_live{type=\"account\"}",
        limit: Some(100_000),
        setting: "active_entity_limit",
    },
    Cap {
        name: "buffered messages",
        series: "tessera_sharding_buffered_messages{type=\"account\"}",
        limit: Some(100_000),
        setting: "shard_buffer_size",
    },
    Cap {
        name: "transport peers",
        series: "tessera_transport_peers",
        limit: Some(1_024),
        setting: "transport_max_peers",
    },
    Cap {
        name: "HTTP connections",
        series: "tessera_http_connections_open",
        limit: Some(4_096),
        setting: "http_max_connections",
    },
    Cap {
        name: "ddata keys",
        series: "tessera_ddata_keys",
        limit: Some(1_000_000),
        setting: "ddata_max_keys",
    },
    Cap {
        name: "ddata bytes",
        series: "tessera_ddata_bytes",
        limit: Some(256 * 1024 * 1024),
        setting: "ddata_max_total_bytes",
    },
];

/// The most one node (over all its incarnations) used.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NodeMemory {
    /// 1-based.
    pub node: usize,
    pub max_rss_bytes: u64,
    /// Per entry of [`CAPS`], the largest value seen.
    pub max_gauges: Vec<u64>,
    pub samples: u64,
}

/// What the sampler saw, per node.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MemoryRecord {
    pub nodes: Vec<NodeMemory>,
}

/// A process's resident set in bytes, from `/proc/<pid>/status`.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// One round: every running node's resident set and gauges, folded into `record`.
async fn sample(https: &[SocketAddr], pids: &Mutex<Vec<Option<u32>>>, record: &mut MemoryRecord) {
    let pids: Vec<Option<u32>> = pids.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let texts =
        futures::future::join_all(https.iter().map(|&h| metrics_text(h, HTTP_TIMEOUT))).await;
    for (i, text) in texts.into_iter().enumerate() {
        let node = &mut record.nodes[i];
        if let Some(rss) = pids[i].and_then(rss_bytes) {
            node.max_rss_bytes = node.max_rss_bytes.max(rss);
            node.samples += 1;
        }
        if let Some(text) = text {
            for (max, cap) in node.max_gauges.iter_mut().zip(CAPS) {
                if let Some(value) = series_value(&text, cap.series) {
                    *max = (*max).max(value);
                }
            }
        }
    }
}

/// Samples every `SAMPLE_INTERVAL` until `stop` turns true, and once more then.
pub async fn run(
    https: Vec<SocketAddr>,
    pids: Arc<Mutex<Vec<Option<u32>>>>,
    mut stop: watch::Receiver<bool>,
) -> MemoryRecord {
    let mut record = MemoryRecord {
        nodes: (0..https.len())
            .map(|i| NodeMemory {
                node: i + 1,
                max_gauges: vec![0; CAPS.len()],
                ..NodeMemory::default()
            })
            .collect(),
    };
    loop {
        sample(&https, &pids, &mut record).await;
        if *stop.borrow() {
            return record;
        }
        tokio::select! {
            _ = tokio::time::sleep(SAMPLE_INTERVAL) => {}
            changed = stop.changed() => if changed.is_err() { return record },
        }
    }
}
