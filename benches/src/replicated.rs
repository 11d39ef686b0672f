//! `tessera bench journal --replicated`: the replicated journal of a three-node cluster (one
//! process, loopback TCP, a RocksDB store per node, fsync always, N = 3, W = 2) against the
//! local RocksDB journal (fsync always) in the same run, on the same disk.
//!
//! - `append-<N>logs`: N logs each append one 100-byte event at a time (the next only after
//!   the previous is acknowledged) through node 1. Baseline: the same on the local journal.
//!   The two alternate in four rounds, so that both see the same disk.
//! - `replay-<N>logs`: node 2 replays N logs of 100 events that node 1 wrote: each replay
//!   first takes the log over (fence and recover: a promise and a seal on a quorum), then
//!   reads it from a replica; 64 logs at a time. Baseline: the local journal replays the same
//!   logs, 64 at a time.
//! - `recover-<N>events`: one log of N events written through one node is taken over by
//!   another and read whole, as an entity's recovery on another node does; best of five
//!   takeovers (each by the next node). Baseline: the local journal replays the same log.
//!
//! The cluster's membership is fixed (all three nodes Up), as the cluster layer would publish
//! it once converged; what is measured is the journal.

use super::{print_json_row, progress};
use futures::StreamExt;
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_cluster::node::ClusterSnapshot;
use tessera_cluster::transport::{TcpTransport, TransportConfig};
use tessera_cluster::{Address, Member, MemberStatus, UniqueAddress};
use tessera_journal::{
    AtomicWrite, FsyncPolicy, Journal, JournalConfig, JournalError, Manifest, NewEvent,
    RocksJournal,
};
use tessera_persistence::{Persistence, PersistenceSettings, RocksReplicaStore};
use tessera_snapshot::{RocksSnapshotStore, SnapshotConfig};
use tokio::sync::watch;

/// The sizes of a run.
#[derive(Debug, Clone)]
pub struct ReplicatedBenchParams {
    /// Concurrent logs of the append workloads.
    pub append_logs: Vec<usize>,
    /// How long each side of an append workload runs.
    pub append_duration: Duration,
    /// Logs of 100 events the replay workload reads.
    pub replay_logs: u64,
    /// Events of the log the recovery workload takes over.
    pub recover_events: u64,
    /// Where the databases go (a fresh directory, removed afterwards).
    pub dir: PathBuf,
}

impl ReplicatedBenchParams {
    /// The standard workloads: 1, 16 and 256 logs; 10,000 logs of 100 events; one log of
    /// 10,000 events.
    pub fn full(dir: PathBuf) -> Self {
        ReplicatedBenchParams {
            append_logs: vec![1, 16, 256],
            append_duration: Duration::from_secs(4),
            replay_logs: 10_000,
            recover_events: 10_000,
            dir,
        }
    }

    /// A fast run: shorter phases, a tenth of the replay.
    pub fn quick(dir: PathBuf) -> Self {
        ReplicatedBenchParams {
            append_duration: Duration::from_secs(2),
            replay_logs: 1_000,
            ..Self::full(dir)
        }
    }
}

impl ReplicatedBenchParams {
    /// Keeps only the append workloads, or only the replay and recovery ones.
    pub fn keep_only(&mut self, only: Option<crate::args::JournalWorkloadKind>) {
        use crate::args::JournalWorkloadKind;
        match only {
            Some(JournalWorkloadKind::Append) => {
                self.replay_logs = 0;
                self.recover_events = 0;
            }
            Some(JournalWorkloadKind::Replay) => self.append_logs.clear(),
            None => {}
        }
    }
}

/// One result row.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicatedBenchRow {
    pub bench: &'static str,
    pub workload: String,
    pub replicated_per_s: f64,
    pub local_per_s: f64,
    /// replicated_per_s / local_per_s.
    pub ratio: f64,
}

/// What went wrong in a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum ReplicatedBenchError {
    #[error("journal: {0}")]
    Journal(#[from] JournalError),
    #[error("{0}")]
    Setup(String),
    #[error("{workload}: read {got} events, expected {expected}")]
    Incomplete {
        workload: String,
        got: u64,
        expected: u64,
    },
}

/// Events per write when loading data.
const LOAD_BATCH: u64 = 100;
/// Replays under way at once in the replay workload (both sides).
const REPLAY_CONCURRENCY: usize = 64;
/// Takeovers of the recovery workload; the best counts.
const RECOVER_ROUNDS: usize = 5;
/// Rounds of an append workload (replicated and local alternate).
const APPEND_ROUNDS: u32 = 4;

/// 2026-09-21 in milliseconds since the Unix epoch.
const BENCH_TIMESTAMP_MS: u64 = 1_790_000_000_000;

fn event(sequence_nr: u64) -> NewEvent {
    NewEvent {
        sequence_nr,
        timestamp_ms: BENCH_TIMESTAMP_MS,
        manifest: Manifest::new("bench.Event", 1),
        payload: vec![0x5au8; 100].into(),
        tags: Vec::new(),
    }
}

fn write(pid: &str, from: u64, to: u64) -> AtomicWrite {
    AtomicWrite {
        persistence_id: pid.to_string(),
        writer_id: "bench".into(),
        events: (from..=to).map(event).collect(),
    }
}

fn row(workload: String, replicated_per_s: f64, local_per_s: f64) -> ReplicatedBenchRow {
    ReplicatedBenchRow {
        bench: "journal-replicated",
        workload,
        replicated_per_s,
        local_per_s,
        ratio: if local_per_s > 0.0 {
            replicated_per_s / local_per_s
        } else {
            0.0
        },
    }
}

/// A node of the benchmark's cluster: its transport, store and replicated journal.
struct BenchNode {
    persistence: Persistence,
    journal: Arc<RocksJournal>,
    _membership: watch::Sender<ClusterSnapshot>,
}

fn member(address: &Address, uid: u64) -> Member {
    Member {
        unique_address: UniqueAddress::new(address.clone(), uid),
        status: MemberStatus::Up,
        roles: BTreeSet::new(),
        up_number: uid as i32,
        app_version: env!("CARGO_PKG_VERSION").into(),
    }
}

fn fsyncing(path: &Path) -> JournalConfig {
    let mut config = JournalConfig::new(path);
    config.fsync = FsyncPolicy::Always;
    config
}

/// Three nodes on 127.0.0.1, each with its own RocksDB store under `dir`.
async fn cluster(dir: &Path) -> Result<Vec<BenchNode>, ReplicatedBenchError> {
    let secret = format!("bench-{}", rand::random::<u64>());
    let mut transports = Vec::new();
    for _ in 0..3 {
        let config = TransportConfig {
            bind_address: Address::new("127.0.0.1", 0),
            cluster_secret: Some(secret.clone()),
            ..TransportConfig::default()
        };
        let transport = TcpTransport::bind(config, rand::random())
            .await
            .map_err(|e| ReplicatedBenchError::Setup(format!("transport: {e}")))?;
        transports.push(transport);
    }
    let addresses: Vec<Address> = transports
        .iter()
        .map(|t| {
            tessera_cluster::transport::Transport::local(t.as_ref())
                .address
                .clone()
        })
        .collect();
    let members: Vec<Member> = addresses
        .iter()
        .enumerate()
        .map(|(i, a)| member(a, i as u64 + 1))
        .collect();
    let mut nodes = Vec::new();
    for (i, transport) in transports.into_iter().enumerate() {
        let node_dir = dir.join(format!("node-{}", i + 1));
        let journal = Arc::new(RocksJournal::open(fsyncing(&node_dir.join("journal"))).await?);
        let snapshots = Arc::new(
            RocksSnapshotStore::open(SnapshotConfig::new(node_dir.join("snapshots")))
                .await
                .map_err(|e| ReplicatedBenchError::Setup(format!("snapshot store: {e}")))?,
        );
        let (membership, watch) = watch::channel(ClusterSnapshot {
            self_node: Some(members[i].unique_address.clone()),
            self_status: Some(MemberStatus::Up),
            members: members.clone(),
            converged: true,
            ..ClusterSnapshot::default()
        });
        let persistence = Persistence::start(
            transport,
            watch,
            RocksReplicaStore::new(journal.clone()),
            snapshots,
            journal.clone(),
            PersistenceSettings::default(),
        )
        .map_err(|e| ReplicatedBenchError::Setup(format!("replica service: {e}")))?;
        nodes.push(BenchNode {
            persistence,
            journal,
            _membership: membership,
        });
    }
    Ok(nodes)
}

/// Runs every workload and prints a table (or JSON rows).
pub async fn run(
    params: ReplicatedBenchParams,
    json: bool,
) -> Result<Vec<ReplicatedBenchRow>, ReplicatedBenchError> {
    std::fs::create_dir_all(&params.dir).map_err(|e| {
        ReplicatedBenchError::Setup(format!("cannot create {}: {e}", params.dir.display()))
    })?;
    progress(&format!("databases in {}", params.dir.display()));
    let nodes = cluster(&params.dir.join("cluster")).await?;
    let local =
        Arc::new(RocksJournal::open(fsyncing(&params.dir.join("local").join("journal"))).await?);
    if !json {
        println!(
            "{:<22} {:>16} {:>14} {:>6}",
            "workload", "replicated_per_s", "local_per_s", "ratio"
        );
    }
    let mut rows = Vec::new();
    let mut emit = |row: ReplicatedBenchRow| {
        if json {
            print_json_row(&row);
        } else {
            println!(
                "{:<22} {:>16.0} {:>14.0} {:>6.2}",
                row.workload, row.replicated_per_s, row.local_per_s, row.ratio
            );
        }
        rows.push(row);
    };
    for &logs in &params.append_logs {
        emit(append_workload(&nodes, &local, logs, params.append_duration).await?);
    }
    if params.replay_logs > 0 {
        emit(replay_workload(&nodes, &local, params.replay_logs).await?);
    }
    if params.recover_events > 0 {
        emit(recover_workload(&nodes, &local, params.recover_events).await?);
    }
    for node in nodes {
        node.persistence.stop().await;
        drop(node.journal);
    }
    drop(local);
    let _ = std::fs::remove_dir_all(&params.dir);
    Ok(rows)
}

fn logs_label(n: u64) -> String {
    if n == 1 {
        "1log".to_string()
    } else {
        format!("{n}logs")
    }
}

/// One task per log, each appending one event at a time until `phase` is over. Returns the
/// events appended and the time taken; `next` holds each log's next sequence number.
async fn append_phase(
    journal: Arc<dyn Journal>,
    prefix: &str,
    next: &mut [u64],
    phase: Duration,
) -> Result<(u64, Duration), ReplicatedBenchError> {
    let started = Instant::now();
    let deadline = started + phase;
    let mut tasks = Vec::new();
    for (log, &first) in next.iter().enumerate() {
        let journal = journal.clone();
        let pid = format!("{prefix}-{log}");
        tasks.push(tokio::spawn(async move {
            let mut seq = first;
            while Instant::now() < deadline {
                journal.append(write(&pid, seq, seq)).await?;
                seq += 1;
            }
            Ok::<u64, JournalError>(seq)
        }));
    }
    let mut appended = 0;
    for (task, next) in tasks.into_iter().zip(next.iter_mut()) {
        let reached = task
            .await
            .map_err(|e| ReplicatedBenchError::Setup(format!("writer task failed: {e}")))??;
        appended += reached - *next;
        *next = reached;
    }
    Ok((appended, started.elapsed()))
}

async fn append_workload(
    nodes: &[BenchNode],
    local: &Arc<RocksJournal>,
    logs: usize,
    duration: Duration,
) -> Result<ReplicatedBenchRow, ReplicatedBenchError> {
    let workload = format!("append-{}", logs_label(logs as u64));
    let phase = duration / APPEND_ROUNDS;
    progress(&format!(
        "{workload}: {APPEND_ROUNDS} rounds of {phase:?} replicated and {phase:?} local"
    ));
    let replicated: Arc<dyn Journal> = nodes[0].persistence.journal.clone();
    let prefix = format!("append-{logs}");
    // Each log is created (its writer placed and its replicas set up) before measuring.
    let created = futures::stream::iter(0..logs)
        .map(|log| {
            let journal = replicated.clone();
            let pid = format!("{prefix}-{log}");
            async move { journal.highest_sequence_nr(&pid).await }
        })
        .buffer_unordered(REPLAY_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    for result in created {
        result?;
    }
    let local: Arc<dyn Journal> = local.clone();
    let mut replicated_next = vec![1u64; logs];
    let mut local_next = vec![1u64; logs];
    let (mut replicated_events, mut replicated_time) = (0u64, Duration::ZERO);
    let (mut local_events, mut local_time) = (0u64, Duration::ZERO);
    for round in 0..APPEND_ROUNDS {
        for side in [round % 2, 1 - round % 2] {
            if side == 0 {
                let (events, elapsed) =
                    append_phase(replicated.clone(), &prefix, &mut replicated_next, phase).await?;
                replicated_events += events;
                replicated_time += elapsed;
            } else {
                let (events, elapsed) =
                    append_phase(local.clone(), &prefix, &mut local_next, phase).await?;
                local_events += events;
                local_time += elapsed;
            }
        }
    }
    Ok(row(
        workload,
        replicated_events as f64 / replicated_time.as_secs_f64(),
        local_events as f64 / local_time.as_secs_f64(),
    ))
}

/// Writes `logs` logs of `events` events to `journal`, 64 writes at a time.
async fn load(
    journal: Arc<dyn Journal>,
    prefix: &str,
    logs: u64,
    events: u64,
) -> Result<(), ReplicatedBenchError> {
    let results = futures::stream::iter(0..logs)
        .map(|log| {
            let journal = journal.clone();
            let pid = format!("{prefix}-{log}");
            async move {
                let mut from = 1;
                while from <= events {
                    let to = (from + LOAD_BATCH - 1).min(events);
                    journal.append(write(&pid, from, to)).await?;
                    from = to + 1;
                }
                Ok::<(), JournalError>(())
            }
        })
        .buffer_unordered(REPLAY_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    for result in results {
        result?;
    }
    Ok(())
}

/// Replays logs `<prefix>-0..logs` whole, `REPLAY_CONCURRENCY` at a time.
async fn replay_all(
    journal: Arc<dyn Journal>,
    prefix: &str,
    logs: u64,
) -> Result<(u64, Duration), ReplicatedBenchError> {
    let pids = (0..logs).map(|log| format!("{prefix}-{log}"));
    Ok(super::replay_logs(journal, pids, REPLAY_CONCURRENCY).await?)
}

async fn replay_workload(
    nodes: &[BenchNode],
    local: &Arc<RocksJournal>,
    logs: u64,
) -> Result<ReplicatedBenchRow, ReplicatedBenchError> {
    let workload = format!("replay-{}", logs_label(logs));
    let per_log = 100;
    progress(&format!(
        "{workload}: writing {logs} logs of {per_log} events through node 1 and locally"
    ));
    let prefix = "replay";
    load(nodes[0].persistence.journal.clone(), prefix, logs, per_log).await?;
    load(local.clone(), prefix, logs, per_log).await?;
    progress(&format!(
        "{workload}: node 2 takes over and replays every log; the local journal replays them"
    ));
    let expected = logs * per_log;
    let (local_events, local_time) = replay_all(local.clone(), prefix, logs).await?;
    let (replicated_events, replicated_time) =
        replay_all(nodes[1].persistence.journal.clone(), prefix, logs).await?;
    for got in [local_events, replicated_events] {
        if got != expected {
            return Err(ReplicatedBenchError::Incomplete {
                workload,
                got,
                expected,
            });
        }
    }
    Ok(row(
        workload,
        replicated_events as f64 / replicated_time.as_secs_f64(),
        local_events as f64 / local_time.as_secs_f64(),
    ))
}

async fn recover_workload(
    nodes: &[BenchNode],
    local: &Arc<RocksJournal>,
    events: u64,
) -> Result<ReplicatedBenchRow, ReplicatedBenchError> {
    let workload = format!("recover-{events}events");
    progress(&format!(
        "{workload}: writing one log of {events} events through node 1 and locally"
    ));
    let prefix = "recover";
    load(nodes[0].persistence.journal.clone(), prefix, 1, events).await?;
    load(local.clone(), prefix, 1, events).await?;
    let pid = format!("{prefix}-0");
    let mut best_replicated = Duration::MAX;
    let mut best_local = Duration::MAX;
    for round in 0..RECOVER_ROUNDS {
        // Node 2, 3, 1, 2, ... takes the log over from the one before.
        let node = &nodes[(round + 1) % nodes.len()];
        progress(&format!(
            "{workload}: takeover {} of {RECOVER_ROUNDS} by node {}",
            round + 1,
            (round + 1) % nodes.len() + 1
        ));
        let journal: Arc<dyn Journal> = node.persistence.journal.clone();
        let started = Instant::now();
        let highest = journal.highest_sequence_nr(&pid).await?;
        let (read, _) = replay_all(journal, prefix, 1).await?;
        best_replicated = best_replicated.min(started.elapsed());
        let local_journal: Arc<dyn Journal> = local.clone();
        let started = Instant::now();
        let local_highest = local_journal.highest_sequence_nr(&pid).await?;
        let (local_read, _) = replay_all(local_journal, prefix, 1).await?;
        best_local = best_local.min(started.elapsed());
        for got in [highest, read, local_highest, local_read] {
            if got != events {
                return Err(ReplicatedBenchError::Incomplete {
                    workload,
                    got,
                    expected: events,
                });
            }
        }
    }
    Ok(row(
        workload,
        events as f64 / best_replicated.as_secs_f64(),
        events as f64 / best_local.as_secs_f64(),
    ))
}
