//! `tessera bench projections`: at-least-once projections of 4 instances on three whole
//! tessera nodes in this process (127.0.0.1, a RocksDB store per node, fsync never), each
//! beside the local journal's replay of the same events in the same run.
//!
//! - `live`: 64 callers deposit into 1,000 accounts through the three nodes (each deposit's
//!   amount its own), while the projection `live` handles the events. Measured: envelopes
//!   handled per second while the deposits go on, and the lag from a deposit's
//!   acknowledgement (its answer) to its event's handling, p50 and p99 (0 when the handler saw
//!   the event before its caller saw the answer). Baseline: the local journal replays the
//!   same events (the same logs, as many events each), 64 logs at a time.
//! - `catch-up-<N>events`: N events (logs of 100) are written straight to the replicated
//!   journal while the projection `catch-up` is paused, then it is resumed and reads every
//!   event of the entity type from offset zero (the live workload's too). Measured: events
//!   handled per second until the last. Baseline: the local journal replays the same events,
//!   64 logs at a time.

use super::{percentile, print_json_row, progress};
use crate::sharding::{ShardingBenchError, start_nodes, stop_cluster};
use futures::StreamExt;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tessera::config::{NodeConfig, StateStoreMode};
use tessera::node::{Node as RunningNode, NodeBuilder};
use tessera::{Envelope, HandlerError, Projection};
use tessera_entities::{Codec, EntityType};
use tessera_example_account::{Account, AccountCommand, AccountEvent};
use tessera_journal::{
    AtomicWrite, FsyncPolicy, Journal, JournalConfig, JournalError, NewEvent, RocksJournal,
};

/// The sizes of a run.
#[derive(Debug, Clone)]
pub struct ProjectionsBenchParams {
    /// Accounts the live workload deposits into.
    pub accounts: usize,
    /// Callers of the live workload, one deposit at a time each.
    pub callers: usize,
    /// How long the live workload's deposits go on.
    pub live_duration: Duration,
    /// Events written for the catch-up (logs of [`EVENTS_PER_LOG`]).
    pub catch_up_events: u64,
    /// Where the databases go (a fresh directory, removed afterwards).
    pub dir: PathBuf,
}

impl ProjectionsBenchParams {
    /// 1,000 accounts, 64 callers for 10 s; a catch-up over 1,000,000 events.
    pub fn full(dir: PathBuf) -> Self {
        ProjectionsBenchParams {
            accounts: 1_000,
            callers: 64,
            live_duration: Duration::from_secs(10),
            catch_up_events: 1_000_000,
            dir,
        }
    }

    /// 3 s of deposits; a catch-up over 100,000 events.
    pub fn quick(dir: PathBuf) -> Self {
        ProjectionsBenchParams {
            live_duration: Duration::from_secs(3),
            catch_up_events: 100_000,
            ..ProjectionsBenchParams::full(dir)
        }
    }
}

/// One result row.
#[derive(Debug, Clone, Serialize)]
pub struct ProjectionsBenchRow {
    pub bench: &'static str,
    pub workload: String,
    /// Events the workload's projection handled.
    pub events: u64,
    pub projection_per_s: f64,
    pub local_replay_per_s: f64,
    /// projection_per_s / local_replay_per_s.
    pub ratio: f64,
    /// Acknowledgement to handling (the live workload only).
    pub lag_p50_ms: Option<f64>,
    pub lag_p99_ms: Option<f64>,
    /// Deposits acknowledged per second (the live workload only).
    pub appends_per_s: Option<f64>,
}

/// What went wrong in a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum ProjectionsBenchError {
    #[error(transparent)]
    Cluster(#[from] ShardingBenchError),
    #[error("journal: {0}")]
    Journal(#[from] JournalError),
    #[error("{0}")]
    Other(String),
}

fn other(message: impl Into<String>) -> ProjectionsBenchError {
    ProjectionsBenchError::Other(message.into())
}

const LIVE: &str = "live";
const CATCH_UP: &str = "catch-up";
const INSTANCES: u32 = 4;
/// Events per log, and per write, of the catch-up's data.
pub const EVENTS_PER_LOG: u64 = 100;
/// Writes (and replays) under way at once.
const CONCURRENCY: usize = 64;
const SETUP_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest wait for a projection to handle what it must.
const HANDLE_TIMEOUT: Duration = Duration::from_secs(600);
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// 2026-09-21 in milliseconds since the Unix epoch.
const BENCH_TIMESTAMP_MS: u64 = 1_790_000_000_000;

/// What the handlers saw, shared by the three nodes' projections.
#[derive(Default)]
struct Recorder {
    live_handled: AtomicU64,
    /// When each deposit's event was first handled, by amount.
    live_first_handled: Mutex<HashMap<u64, Instant>>,
    catch_up_handled: AtomicU64,
}

fn service(recorder: &Arc<Recorder>) -> NodeBuilder {
    let live = recorder.clone();
    let catch_up = recorder.clone();
    NodeBuilder::new()
        .entity(Account)
        .fsync(FsyncPolicy::Never)
        .projection(Projection::at_least_once(
            LIVE,
            Account,
            INSTANCES,
            move |envelope: Envelope<Account>| {
                let recorder = live.clone();
                async move {
                    let now = Instant::now();
                    if let AccountEvent::Deposited { amount } = envelope.event
                        && let Ok(mut first) = recorder.live_first_handled.lock()
                    {
                        first.entry(amount).or_insert(now);
                    }
                    recorder.live_handled.fetch_add(1, Ordering::Relaxed);
                    Ok::<(), HandlerError>(())
                }
            },
        ))
        .projection(Projection::at_least_once(
            CATCH_UP,
            Account,
            INSTANCES,
            move |_envelope: Envelope<Account>| {
                let recorder = catch_up.clone();
                async move {
                    recorder.catch_up_handled.fetch_add(1, Ordering::Relaxed);
                    Ok::<(), HandlerError>(())
                }
            },
        ))
}

/// Runs both workloads and prints a table (or JSON rows).
pub async fn run(
    params: ProjectionsBenchParams,
    json: bool,
) -> Result<Vec<ProjectionsBenchRow>, ProjectionsBenchError> {
    std::fs::create_dir_all(&params.dir)
        .map_err(|e| other(format!("cannot create {}: {e}", params.dir.display())))?;
    progress(&format!("databases in {}", params.dir.display()));
    let recorder = Arc::new(Recorder::default());
    let nodes = start_nodes(
        &params.dir.join("cluster"),
        3,
        &|| service(&recorder),
        StateStoreMode::Ddata,
        NodeConfig::default().stable_after,
        NodeConfig::default().rebalance_interval,
    )
    .await?;
    let mut local_config = JournalConfig::new(params.dir.join("local").join("journal"));
    local_config.fsync = FsyncPolicy::Never;
    let local = RocksJournal::open(local_config).await;
    let result = match local {
        Ok(local) => workloads(&params, &nodes, &Arc::new(local), &recorder, json).await,
        Err(e) => Err(e.into()),
    };
    stop_cluster(nodes).await;
    let _ = std::fs::remove_dir_all(&params.dir);
    result
}

async fn workloads(
    params: &ProjectionsBenchParams,
    nodes: &[RunningNode],
    local: &Arc<RocksJournal>,
    recorder: &Arc<Recorder>,
    json: bool,
) -> Result<Vec<ProjectionsBenchRow>, ProjectionsBenchError> {
    pause(nodes, CATCH_UP).await?;
    wait_running(nodes, LIVE).await?;
    if !json {
        println!(
            "{:<24} {:>9} {:>16} {:>18} {:>6} {:>10} {:>10} {:>12}",
            "workload",
            "events",
            "projection_per_s",
            "local_replay_per_s",
            "ratio",
            "lag_p50_ms",
            "lag_p99_ms",
            "appends_per_s"
        );
    }
    let mut rows = Vec::new();
    let mut emit = |row: ProjectionsBenchRow| {
        if json {
            print_json_row(&row);
        } else {
            let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
            println!(
                "{:<24} {:>9} {:>16.0} {:>18.0} {:>6.2} {:>10} {:>10} {:>12}",
                row.workload,
                row.events,
                row.projection_per_s,
                row.local_replay_per_s,
                row.ratio,
                ms(row.lag_p50_ms),
                ms(row.lag_p99_ms),
                row.appends_per_s
                    .map_or("-".to_string(), |v| format!("{v:.0}"))
            );
        }
        rows.push(row);
    };
    let live_logs = live_workload(params, nodes, local, recorder).await?;
    emit(live_logs.0);
    emit(catch_up_workload(params, nodes, local, recorder, &live_logs.1).await?);
    Ok(rows)
}

/// Pauses `projection` and waits until every node knows it paused.
async fn pause(nodes: &[RunningNode], projection: &str) -> Result<(), ProjectionsBenchError> {
    nodes[0]
        .handle()
        .pause_projection(projection)
        .await
        .map_err(|e| other(format!("cannot pause {projection}: {e}")))?;
    let started = Instant::now();
    let paused_everywhere = || {
        nodes.iter().all(|node| {
            node.handle()
                .projections()
                .iter()
                .any(|(name, _, _, control)| name == projection && control.paused)
        })
    };
    while !paused_everywhere() {
        if started.elapsed() > SETUP_TIMEOUT {
            return Err(other(format!(
                "{projection} not paused on every node within {SETUP_TIMEOUT:?}"
            )));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    Ok(())
}

/// Waits until the projection's instances all run somewhere in the cluster.
async fn wait_running(
    nodes: &[RunningNode],
    projection: &str,
) -> Result<(), ProjectionsBenchError> {
    let daemon = tessera_projection::daemon_name_of(projection);
    let started = Instant::now();
    while nodes
        .iter()
        .map(|n| n.daemon_instances(&daemon).len())
        .sum::<usize>()
        < INSTANCES as usize
    {
        if started.elapsed() > SETUP_TIMEOUT {
            return Err(other(format!(
                "the {INSTANCES} instances of {projection} did not start within {SETUP_TIMEOUT:?}"
            )));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    Ok(())
}

/// Waits until `handled` reaches `target`; returns when it did (from `since`).
async fn wait_handled(
    what: &str,
    handled: &AtomicU64,
    target: u64,
    since: Instant,
) -> Result<Duration, ProjectionsBenchError> {
    while handled.load(Ordering::Relaxed) < target {
        if since.elapsed() > HANDLE_TIMEOUT {
            return Err(other(format!(
                "{what}: {} of {target} events handled within {HANDLE_TIMEOUT:?}",
                handled.load(Ordering::Relaxed)
            )));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    Ok(since.elapsed())
}

/// The live workload; returns its row and the events each account's log got.
async fn live_workload(
    params: &ProjectionsBenchParams,
    nodes: &[RunningNode],
    local: &Arc<RocksJournal>,
    recorder: &Arc<Recorder>,
) -> Result<(ProjectionsBenchRow, Vec<(String, u64)>), ProjectionsBenchError> {
    progress(&format!(
        "live: {} callers deposit into {} accounts for {:?}",
        params.callers, params.accounts, params.live_duration
    ));
    let ids: Arc<[String]> = (0..params.accounts).map(|i| format!("acct-{i}")).collect();
    let handled_before = recorder.live_handled.load(Ordering::Relaxed);
    let started = Instant::now();
    let deadline = started + params.live_duration;
    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..params.callers {
        let node = nodes[caller % nodes.len()].handle();
        let ids = ids.clone();
        callers.spawn(async move {
            let mut rng = SmallRng::seed_from_u64(rand::random());
            let mut acknowledged = Vec::new();
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                // An amount no other deposit has: the handler names the deposit by it.
                let amount = (caller as u64 + 1) * 1_000_000_000 + n;
                let id = &ids[rng.random_range(0..ids.len())];
                let reference = node.entity_ref::<Account>(id.as_str());
                if reference.ask(AccountCommand::Deposit(amount)).await.is_ok() {
                    acknowledged.push((amount, Instant::now()));
                }
            }
            acknowledged
        });
    }
    let mut acknowledged = Vec::new();
    while let Some(caller) = callers.join_next().await {
        acknowledged.extend(caller.map_err(|e| other(format!("a caller failed: {e}")))?);
    }
    let elapsed = started.elapsed();
    let handled_during = recorder.live_handled.load(Ordering::Relaxed) - handled_before;
    // Every acknowledged deposit handled, for the lag.
    let since = Instant::now();
    loop {
        let seen = recorder
            .live_first_handled
            .lock()
            .map(|first| acknowledged.iter().all(|(a, _)| first.contains_key(a)))
            .unwrap_or(false);
        if seen {
            break;
        }
        if since.elapsed() > HANDLE_TIMEOUT {
            return Err(other("live: acknowledged deposits not handled"));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    let mut lags_ms: Vec<f64> = {
        let first = recorder
            .live_first_handled
            .lock()
            .map_err(|_| other("live: the recorder's lock is poisoned"))?;
        acknowledged
            .iter()
            .map(|(amount, at)| first[amount].saturating_duration_since(*at).as_secs_f64() * 1e3)
            .collect()
    };
    lags_ms.sort_by(f64::total_cmp);
    // The logs as they are now (deposits with no answer may be in them too).
    let journal = nodes[0].handle().replicated_journal().clone();
    let mut logs = Vec::new();
    for id in ids.iter() {
        let pid = format!("{}|{id}", Account::TYPE_NAME);
        let highest = journal.highest_sequence_nr(&pid).await?;
        if highest > 0 {
            logs.push((pid, highest));
        }
    }
    progress("live: the local journal replays the same events");
    for (pid, highest) in &logs {
        write_local(local, pid, *highest).await?;
    }
    let (replayed, replay_time) = replay(local.clone(), logs.clone()).await?;
    let projection_per_s = handled_during as f64 / elapsed.as_secs_f64();
    let local_replay_per_s = replayed as f64 / replay_time.as_secs_f64().max(1e-9);
    Ok((
        ProjectionsBenchRow {
            bench: "projections",
            workload: LIVE.to_string(),
            events: handled_during,
            projection_per_s,
            local_replay_per_s,
            ratio: projection_per_s / local_replay_per_s.max(1e-9),
            lag_p50_ms: percentile(&lags_ms, 0.5),
            lag_p99_ms: percentile(&lags_ms, 0.99),
            appends_per_s: Some(acknowledged.len() as f64 / elapsed.as_secs_f64()),
        },
        logs,
    ))
}

/// The deposits of log `pid`, `1..=highest`, each an event of its own (the local copy of a
/// log: the same number of events, of the same size).
async fn write_local(
    local: &Arc<RocksJournal>,
    pid: &str,
    highest: u64,
) -> Result<(), ProjectionsBenchError> {
    let codec = Codec::<Account>::new();
    let events: Result<Vec<NewEvent>, _> = (1..=highest).map(|seq| event(&codec, seq)).collect();
    local
        .append(AtomicWrite {
            persistence_id: pid.to_string(),
            writer_id: "bench".into(),
            events: events?,
        })
        .await?;
    Ok(())
}

fn event(codec: &Codec<Account>, sequence_nr: u64) -> Result<NewEvent, ProjectionsBenchError> {
    let (manifest, payload) = codec
        .encode_event(&AccountEvent::Deposited {
            amount: 1_000_000_000 + sequence_nr,
        })
        .map_err(|e| other(format!("cannot encode an event: {e}")))?;
    Ok(NewEvent {
        sequence_nr,
        timestamp_ms: BENCH_TIMESTAMP_MS,
        manifest,
        payload,
        tags: Vec::new(),
    })
}

/// Replays each log whole, [`CONCURRENCY`] at a time.
async fn replay(
    journal: Arc<RocksJournal>,
    logs: Vec<(String, u64)>,
) -> Result<(u64, Duration), ProjectionsBenchError> {
    let pids = logs.into_iter().map(|(pid, _)| pid);
    Ok(super::replay_logs(journal, pids, CONCURRENCY).await?)
}

/// Writes `logs` logs of [`EVENTS_PER_LOG`] events to `journal`, [`CONCURRENCY`] at a time.
async fn load(journal: Arc<dyn Journal>, logs: &[String]) -> Result<(), ProjectionsBenchError> {
    let codec = Arc::new(Codec::<Account>::new());
    let results = futures::stream::iter(logs.iter().cloned())
        .map(|pid| {
            let journal = journal.clone();
            let codec = codec.clone();
            async move {
                let events: Result<Vec<NewEvent>, _> =
                    (1..=EVENTS_PER_LOG).map(|seq| event(&codec, seq)).collect();
                journal
                    .append(AtomicWrite {
                        persistence_id: pid,
                        writer_id: "bench".into(),
                        events: events?,
                    })
                    .await?;
                Ok::<(), ProjectionsBenchError>(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    results.into_iter().collect()
}

/// Waits for the stores' flushes and compactions of a load: the projection's read and the
/// local replay each start on stores that finished their background work.
async fn settle(
    stores: impl IntoIterator<Item = Arc<RocksJournal>>,
) -> Result<(), ProjectionsBenchError> {
    for store in stores {
        store
            .settle()
            .await
            .map_err(|e| other(format!("a store did not settle after the load: {e}")))?;
    }
    Ok(())
}

async fn catch_up_workload(
    params: &ProjectionsBenchParams,
    nodes: &[RunningNode],
    local: &Arc<RocksJournal>,
    recorder: &Arc<Recorder>,
    live_logs: &[(String, u64)],
) -> Result<ProjectionsBenchRow, ProjectionsBenchError> {
    let workload = format!("catch-up-{}events", params.catch_up_events);
    // Only the catch-up reads from here on.
    pause(nodes, LIVE).await?;
    let bulk: Vec<String> = (0..params.catch_up_events.div_ceil(EVENTS_PER_LOG))
        .map(|i| format!("{}|bulk-{i}", Account::TYPE_NAME))
        .collect();
    progress(&format!(
        "{workload}: writing {} logs of {EVENTS_PER_LOG} events to the replicated journal",
        bulk.len()
    ));
    let replicated: Arc<dyn Journal> = nodes[0].handle().replicated_journal().clone();
    load(replicated, &bulk).await?;
    settle(nodes.iter().map(|node| node.local_journal().clone())).await?;
    let total = bulk.len() as u64 * EVENTS_PER_LOG + live_logs.iter().map(|(_, n)| n).sum::<u64>();
    progress(&format!(
        "{workload}: the projection reads {total} events from offset zero"
    ));
    let started = Instant::now();
    nodes[0]
        .handle()
        .resume_projection(CATCH_UP)
        .await
        .map_err(|e| other(format!("cannot resume {CATCH_UP}: {e}")))?;
    let took = wait_handled(&workload, &recorder.catch_up_handled, total, started).await?;
    progress(&format!(
        "{workload}: the local journal replays the same events"
    ));
    let local_journal: Arc<dyn Journal> = local.clone();
    load(local_journal, &bulk).await?;
    settle([local.clone()]).await?;
    let mut logs: Vec<(String, u64)> = bulk.into_iter().map(|pid| (pid, EVENTS_PER_LOG)).collect();
    logs.extend(live_logs.iter().cloned());
    let (replayed, replay_time) = replay(local.clone(), logs).await?;
    if replayed != total {
        return Err(other(format!(
            "{workload}: the local journal replayed {replayed} events, {total} were written"
        )));
    }
    let projection_per_s = total as f64 / took.as_secs_f64();
    let local_replay_per_s = replayed as f64 / replay_time.as_secs_f64().max(1e-9);
    Ok(ProjectionsBenchRow {
        bench: "projections",
        workload,
        events: total,
        projection_per_s,
        local_replay_per_s,
        ratio: projection_per_s / local_replay_per_s.max(1e-9),
        lag_p50_ms: None,
        lag_p99_ms: None,
        appends_per_s: None,
    })
}
