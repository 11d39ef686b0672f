//! `tessera bench entities`: the entity runtime against the stores underneath it, in the same
//! run, on the same disk.
//!
//! - `persist-<N>entities`: N `account` entities, one caller each sending `{"deposit": 1}`
//!   one at a time (journal `fsync = always`, snapshots every 100 events as on a node).
//!   Baseline: N writers appending the same encoded event, one at a time, straight to the same
//!   journal. The two alternate in four rounds (T B, B T, T B, B T) so both see the same
//!   disk. Unit: commands/s.
//! - `recover-<E>events`: the first command to an entity with E events and no snapshot, until
//!   its reply. Baseline: replaying the same E events from the journal. Best of three after a
//!   warm-up. Unit: ms (ratio > 1 is slower than the baseline).
//! - `recover-<E>events-snapshot`: the same with a snapshot 50 events before the end (about
//!   where `snapshot_every = 100` leaves one on average). Baseline: loading that snapshot and
//!   replaying the 50 events.
//! - `memory-idle-entity`: resident memory per live idle entity, from the process RSS
//!   (`/proc/self/statm`) before and after activating M entities, with M others already live
//!   (they warm the caches, the runtime and the host's maps). No baseline.

use super::{print_json_row, progress};
use futures::StreamExt;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_entities::{AskError, Codec, EntityConfig, EntityHost, EntityId, EntityType};
use tessera_example_account::{Account, AccountCommand, AccountEvent, AccountState};
use tessera_journal::{
    AtomicWrite, FsyncPolicy, Journal, JournalConfig, JournalError, NewEvent, RocksJournal,
};
use tessera_snapshot::{
    RocksSnapshotStore, SnapshotConfig, SnapshotError, SnapshotMetadata, SnapshotSelectionCriteria,
    SnapshotStore,
};

/// The sizes of a run.
#[derive(Debug, Clone)]
pub struct EntitiesBenchParams {
    /// Concurrent entities of the persist workloads.
    pub concurrency: Vec<usize>,
    /// How long each side of a persist workload runs in all (over four rounds).
    pub phase: Duration,
    /// Events of the entity the recovery workloads recover.
    pub recovery_events: u64,
    /// Entities activated for the memory measurement.
    pub memory_entities: usize,
    /// Where the databases go (a fresh directory, removed afterwards).
    pub dir: PathBuf,
}

impl EntitiesBenchParams {
    /// The standard workloads: 1, 100 and 10,000 entities; 100,000 events; 10,000 idle
    /// entities.
    pub fn full(dir: PathBuf) -> Self {
        EntitiesBenchParams {
            concurrency: vec![1, 100, 10_000],
            phase: Duration::from_secs(4),
            recovery_events: 100_000,
            memory_entities: 10_000,
            dir,
        }
    }

    /// A fast run: a tenth of the sizes and short phases.
    pub fn quick(dir: PathBuf) -> Self {
        EntitiesBenchParams {
            concurrency: vec![1, 100, 1_000],
            phase: Duration::from_secs(1),
            recovery_events: 10_000,
            memory_entities: 1_000,
            dir,
        }
    }
}

/// One result row.
#[derive(Debug, Clone, Serialize)]
pub struct EntitiesBenchRow {
    pub bench: &'static str,
    pub workload: String,
    /// `commands_per_s`, `ms` or `bytes`.
    pub unit: &'static str,
    pub tessera: f64,
    pub baseline: Option<f64>,
    /// tessera / baseline, in the row's unit.
    pub ratio: Option<f64>,
}

/// What went wrong in a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum EntitiesBenchError {
    #[error("journal: {0}")]
    Journal(#[from] JournalError),
    #[error("snapshot store: {0}")]
    Snapshot(#[from] SnapshotError),
    #[error("{0}")]
    Other(String),
}

fn other(message: impl Into<String>) -> EntitiesBenchError {
    EntitiesBenchError::Other(message.into())
}

fn row(
    workload: String,
    unit: &'static str,
    tessera: f64,
    baseline: Option<f64>,
) -> EntitiesBenchRow {
    EntitiesBenchRow {
        bench: "entities",
        workload,
        unit,
        tessera,
        baseline,
        ratio: baseline.filter(|b| *b > 0.0).map(|b| tessera / b),
    }
}

/// Runs every workload and prints a table (or JSON rows).
pub async fn run(
    params: EntitiesBenchParams,
    json: bool,
) -> Result<Vec<EntitiesBenchRow>, EntitiesBenchError> {
    std::fs::create_dir_all(&params.dir)
        .map_err(|e| other(format!("cannot create {}: {e}", params.dir.display())))?;
    progress(&format!("databases in {}", params.dir.display()));
    if !json {
        println!(
            "{:<32} {:>14} {:>14} {:>14} {:>6}",
            "workload", "unit", "tessera", "baseline", "ratio"
        );
    }
    let mut rows = Vec::new();
    let mut emit = |row: EntitiesBenchRow| {
        if json {
            print_json_row(&row);
        } else {
            let or_dash = |v: Option<f64>, precision: usize| {
                v.map(|v| format!("{v:.precision$}"))
                    .unwrap_or_else(|| "-".into())
            };
            println!(
                "{:<32} {:>14} {:>14.1} {:>14} {:>6}",
                row.workload,
                row.unit,
                row.tessera,
                or_dash(row.baseline, 1),
                or_dash(row.ratio, 2)
            );
        }
        rows.push(row);
    };
    for &entities in &params.concurrency {
        emit(persist_workload(&params, entities).await?);
    }
    for row in recovery_workloads(&params).await? {
        emit(row);
    }
    emit(memory_workload(&params).await?);
    let _ = std::fs::remove_dir_all(&params.dir);
    Ok(rows)
}

struct Stores {
    journal: Arc<RocksJournal>,
    snapshots: Arc<RocksSnapshotStore>,
}

impl Stores {
    async fn open(path: &Path, fsync: FsyncPolicy) -> Result<Self, EntitiesBenchError> {
        let mut journal = JournalConfig::new(path.join("journal"));
        journal.fsync = fsync;
        let mut snapshots = SnapshotConfig::new(path.join("snapshots"));
        snapshots.fsync = fsync;
        Ok(Stores {
            journal: Arc::new(RocksJournal::open(journal).await?),
            snapshots: Arc::new(RocksSnapshotStore::open(snapshots).await?),
        })
    }

    fn host(&self, config: EntityConfig) -> Result<EntityHost<Account>, EntitiesBenchError> {
        EntityHost::start(
            Account,
            self.journal.clone(),
            self.snapshots.clone(),
            config,
        )
        .map_err(|e| other(e.to_string()))
    }

    async fn close(self) {
        drop(self.snapshots);
        if let Ok(journal) = Arc::try_unwrap(self.journal) {
            journal.close().await;
        }
    }
}

/// The entity settings of the benchmark: a node's defaults, without passivation, with a long
/// ask timeout (10,000 callers queue behind one journal).
fn bench_config() -> EntityConfig {
    EntityConfig {
        passivate_after: None,
        ask_timeout: Duration::from_secs(60),
        node_id: "bench".into(),
        ..EntityConfig::default()
    }
}

fn entity_label(n: usize) -> String {
    if n == 1 {
        "1entity".into()
    } else {
        format!("{n}entities")
    }
}

fn ask_error(e: AskError<<Account as EntityType>::Rejection>) -> EntitiesBenchError {
    other(format!("entity command failed: {e}"))
}

/// Rounds of a persist workload: entities and baseline alternate (T B, B T, ...) so that both
/// see the same disk on a machine whose fsync latency drifts.
const PERSIST_ROUNDS: u32 = 4;

async fn persist_workload(
    params: &EntitiesBenchParams,
    entities: usize,
) -> Result<EntitiesBenchRow, EntitiesBenchError> {
    let workload = format!("persist-{}", entity_label(entities));
    progress(&format!(
        "{workload}: {PERSIST_ROUNDS} rounds of {:?} entities and {:?} raw journal appends",
        params.phase / PERSIST_ROUNDS,
        params.phase / PERSIST_ROUNDS
    ));
    let stores = Stores::open(&params.dir.join(&workload), FsyncPolicy::Always).await?;
    let host = Arc::new(stores.host(bench_config())?);
    let refs = (0..entities)
        .map(|i| host.entity_ref(&format!("e{i}")))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| other(e.to_string()))?;
    // Activate (recover) every entity before measuring.
    let mut activation = futures::stream::iter(refs.iter().cloned())
        .map(|entity| async move { entity.ask(AccountCommand::Get).await })
        .buffer_unordered(1_000);
    while let Some(reply) = activation.next().await {
        reply.map_err(ask_error)?;
    }
    drop(activation);

    let codec = Codec::<Account>::new();
    let (manifest, payload) = codec
        .encode_event(&AccountEvent::Deposited { amount: 1 })
        .map_err(|e| other(e.to_string()))?;
    let mut baseline_next = vec![1u64; entities];
    let (mut tessera_commands, mut tessera_time) = (0u64, Duration::ZERO);
    let (mut raw_events, mut raw_time) = (0u64, Duration::ZERO);
    let phase = params.phase / PERSIST_ROUNDS;
    for round in 0..PERSIST_ROUNDS {
        for side in [round % 2, 1 - round % 2] {
            if side == 0 {
                let started = Instant::now();
                let deadline = started + phase;
                let callers: Vec<_> = refs
                    .iter()
                    .cloned()
                    .map(|entity| {
                        tokio::spawn(async move {
                            let mut done = 0u64;
                            while Instant::now() < deadline {
                                entity.ask(AccountCommand::Deposit(1)).await?;
                                done += 1;
                            }
                            Ok::<u64, AskError<_>>(done)
                        })
                    })
                    .collect();
                for caller in callers {
                    tessera_commands += caller
                        .await
                        .map_err(|e| other(format!("caller task failed: {e}")))?
                        .map_err(ask_error)?;
                }
                tessera_time += started.elapsed();
            } else {
                let started = Instant::now();
                let deadline = started + phase;
                let writers: Vec<_> = baseline_next
                    .iter()
                    .enumerate()
                    .map(|(i, &first)| {
                        let journal = stores.journal.clone();
                        let manifest = manifest.clone();
                        let payload = payload.clone();
                        tokio::spawn(async move {
                            let pid = format!("baseline|{i}");
                            let mut seq = first;
                            while Instant::now() < deadline {
                                journal
                                    .append(AtomicWrite {
                                        persistence_id: pid.clone(),
                                        writer_id: "bench".into(),
                                        events: vec![NewEvent {
                                            sequence_nr: seq,
                                            timestamp_ms: 0,
                                            manifest: manifest.clone(),
                                            payload: payload.clone(),
                                            tags: Vec::new(),
                                        }],
                                    })
                                    .await?;
                                seq += 1;
                            }
                            Ok::<u64, JournalError>(seq)
                        })
                    })
                    .collect();
                for (writer, next) in writers.into_iter().zip(baseline_next.iter_mut()) {
                    let reached = writer
                        .await
                        .map_err(|e| other(format!("writer task failed: {e}")))??;
                    raw_events += reached - *next;
                    *next = reached;
                }
                raw_time += started.elapsed();
            }
        }
    }
    host.shutdown().await;
    drop(refs);
    drop(host);
    stores.close().await;
    Ok(row(
        workload,
        "commands_per_s",
        tessera_commands as f64 / tessera_time.as_secs_f64(),
        Some(raw_events as f64 / raw_time.as_secs_f64()),
    ))
}

/// Writes `events` deposits of 1 to `account|{id}` straight into the journal, as the entity
/// would have written them.
async fn write_account_log(
    journal: &RocksJournal,
    id: &str,
    events: u64,
) -> Result<(), EntitiesBenchError> {
    let codec = Codec::<Account>::new();
    let (manifest, payload) = codec
        .encode_event(&AccountEvent::Deposited { amount: 1 })
        .map_err(|e| other(e.to_string()))?;
    let pid = EntityId::new(id)
        .map_err(|e| other(e.to_string()))?
        .persistence_id(Account::TYPE_NAME);
    let mut seq = 1;
    while seq <= events {
        let last = (seq + 999).min(events);
        journal
            .append(AtomicWrite {
                persistence_id: pid.clone(),
                writer_id: "bench".into(),
                events: (seq..=last)
                    .map(|s| NewEvent {
                        sequence_nr: s,
                        timestamp_ms: 0,
                        manifest: manifest.clone(),
                        payload: payload.clone(),
                        tags: Vec::new(),
                    })
                    .collect(),
            })
            .await?;
        seq = last + 1;
    }
    Ok(())
}

/// Events after the snapshot in the snapshot recovery workload.
const EVENTS_AFTER_SNAPSHOT: u64 = 50;

async fn recovery_workloads(
    params: &EntitiesBenchParams,
) -> Result<Vec<EntitiesBenchRow>, EntitiesBenchError> {
    let events = params.recovery_events;
    progress(&format!(
        "recovery: writing {events} events to each of 2 accounts"
    ));
    let stores = Stores::open(&params.dir.join("recovery"), FsyncPolicy::Never).await?;
    write_account_log(&stores.journal, "plain", events).await?;
    write_account_log(&stores.journal, "snapshotted", events).await?;
    let snapshot_at = events.saturating_sub(EVENTS_AFTER_SNAPSHOT);
    let (manifest, payload) = Codec::<Account>::new()
        .encode_state(&AccountState {
            balance: snapshot_at,
        })
        .map_err(|e| other(e.to_string()))?;
    stores
        .snapshots
        .save(
            SnapshotMetadata {
                persistence_id: "account|snapshotted".into(),
                sequence_nr: snapshot_at,
                timestamp_ms: 0,
            },
            manifest,
            payload,
        )
        .await?;

    let mut rows = Vec::new();
    for (id, with_snapshot) in [("plain", false), ("snapshotted", true)] {
        let workload = if with_snapshot {
            format!("recover-{events}events-snapshot")
        } else {
            format!("recover-{events}events")
        };
        let pid = format!("account|{id}");
        let (mut best_tessera, mut best_raw) = (f64::MAX, f64::MAX);
        // Pass 0 warms the caches and is not counted.
        for pass in 0..4 {
            progress(&format!("{workload}: pass {pass} of 3"));
            let started = Instant::now();
            let from = if with_snapshot {
                let snapshot = stores
                    .snapshots
                    .load(&pid, SnapshotSelectionCriteria::latest())
                    .await?
                    .ok_or_else(|| other("the snapshot is missing"))?;
                std::hint::black_box(&snapshot.payload);
                snapshot.metadata.sequence_nr + 1
            } else {
                1
            };
            let mut replay = stores.journal.replay(&pid, from, u64::MAX, u64::MAX);
            let mut bytes = 0usize;
            while let Some(event) = replay.next().await {
                bytes += event?.payload.len();
            }
            std::hint::black_box(bytes);
            let raw = started.elapsed();

            // A fresh host: the entity is not live, so the command waits for its recovery.
            let host = stores.host(bench_config())?;
            let started = Instant::now();
            let reply = host.ask(id, AccountCommand::Get).await.map_err(ask_error)?;
            let tessera = started.elapsed();
            host.shutdown().await;
            if reply.balance != events {
                return Err(other(format!(
                    "{workload}: recovered balance {}, expected {events}",
                    reply.balance
                )));
            }
            if pass > 0 {
                best_tessera = best_tessera.min(tessera.as_secs_f64() * 1e3);
                best_raw = best_raw.min(raw.as_secs_f64() * 1e3);
            }
        }
        rows.push(row(workload, "ms", best_tessera, Some(best_raw)));
    }
    stores.close().await;
    Ok(rows)
}

/// Resident memory of this process, from `/proc/self/statm`.
fn resident_bytes() -> Result<u64, EntitiesBenchError> {
    let statm = std::fs::read_to_string("/proc/self/statm")
        .map_err(|e| other(format!("cannot read /proc/self/statm: {e}")))?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| other(format!("unexpected /proc/self/statm: {statm:?}")))?;
    // SAFETY: sysconf has no memory effects; it only reads a system constant.
    let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Ok(pages * u64::try_from(page_size).unwrap_or(4096))
}

async fn activate(
    host: &EntityHost<Account>,
    prefix: &str,
    count: usize,
) -> Result<(), EntitiesBenchError> {
    let refs = (0..count)
        .map(|i| host.entity_ref(&format!("{prefix}{i}")))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| other(e.to_string()))?;
    let mut replies = futures::stream::iter(refs)
        .map(|entity| async move { entity.ask(AccountCommand::Get).await })
        .buffer_unordered(1_000);
    while let Some(reply) = replies.next().await {
        reply.map_err(ask_error)?;
    }
    Ok(())
}

async fn memory_workload(
    params: &EntitiesBenchParams,
) -> Result<EntitiesBenchRow, EntitiesBenchError> {
    let count = params.memory_entities;
    progress(&format!(
        "memory: activating {count} idle entities (after {count} others)"
    ));
    let stores = Stores::open(&params.dir.join("memory"), FsyncPolicy::Never).await?;
    let host = stores.host(bench_config())?;
    // The first batch stays live: it warms the stores' caches, the runtime and the host's
    // maps, so the second batch measures what one more live entity costs.
    activate(&host, "warm-", count).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = resident_bytes()?;
    activate(&host, "idle-", count).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = resident_bytes()?;
    let live = host.stats().live_entities;
    if live != 2 * count as u64 {
        return Err(other(format!(
            "{live} entities live, expected {}",
            2 * count
        )));
    }
    host.shutdown().await;
    drop(host);
    stores.close().await;
    Ok(row(
        "memory-idle-entity".into(),
        "bytes",
        after.saturating_sub(before) as f64 / count as f64,
        None,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_workload_runs_and_reports() {
        let dir = tempfile::tempdir().unwrap();
        let params = EntitiesBenchParams {
            concurrency: vec![1, 8],
            phase: Duration::from_millis(200),
            recovery_events: 500,
            memory_entities: 50,
            dir: dir.path().join("bench"),
        };
        let rows = run(params, true).await.unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r.workload.as_str()).collect();
        assert_eq!(
            names,
            [
                "persist-1entity",
                "persist-8entities",
                "recover-500events",
                "recover-500events-snapshot",
                "memory-idle-entity"
            ]
        );
        for row in &rows[..4] {
            assert!(row.tessera > 0.0 && row.baseline.unwrap() > 0.0, "{row:?}");
            let ratio = row.ratio.unwrap();
            assert!((ratio - row.tessera / row.baseline.unwrap()).abs() < 1e-9);
        }
        assert_eq!(rows[4].baseline, None);
    }
}
