//! `tessera bench journal`: the RocksDB journal against RocksDB itself, in the same run, on the
//! same disk, with the same RocksDB options.
//!
//! - `append-<N>ids-<size>`: N persistence ids each append one event at a time (the next only
//!   after the previous is acknowledged) with `fsync = always`. Baseline: N threads each
//!   writing a one-event `WriteBatch` with `sync = true` (RocksDB's own write group commit
//!   joins concurrent writers). The two alternate in four rounds so that both see the same
//!   disk.
//! - `replay-1id`, `replay-10000ids`: replay of 1,000,000 100-byte events from one log, and
//!   from 10,000 logs of 100 (one replay after the other). Baseline: a raw RocksDB iterator
//!   per log over the same keys, reading every key and value. The data set is compacted once
//!   before measuring; each pass opens both sides afresh (cold block caches of the same
//!   size), the spread logs in 20 slices on which the two take turns; best of four passes,
//!   after a warm-up pass.

use super::{print_json_row, progress};
use futures::StreamExt;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tessera_journal::{
    AtomicWrite, FsyncPolicy, Journal, JournalConfig, JournalError, Manifest, NewEvent,
    RocksJournal, event_key, rocksdb_options,
};

/// The sizes of a run.
#[derive(Debug, Clone)]
pub struct JournalBenchParams {
    /// Concurrent persistence ids of the append workloads (none: no append workloads).
    pub append_ids: Vec<usize>,
    /// Event payload sizes of the append workloads.
    pub append_payload_bytes: Vec<usize>,
    /// How long each side of an append workload runs.
    pub append_duration: Duration,
    /// Events of the replay workloads (0: no replay workloads).
    pub replay_events: u64,
    /// Logs the spread replay workload reads.
    pub replay_ids: u64,
    /// Where the databases go (a fresh directory, removed afterwards).
    pub dir: PathBuf,
}

impl JournalBenchParams {
    /// The standard workloads: 1, 16, 256 ids; 100 B and 1 KiB; 1,000,000 events.
    pub fn full(dir: PathBuf) -> Self {
        JournalBenchParams {
            append_ids: vec![1, 16, 256],
            append_payload_bytes: vec![100, 1024],
            append_duration: Duration::from_secs(3),
            replay_events: 1_000_000,
            replay_ids: 10_000,
            dir,
        }
    }

    /// A fast run with the same workloads at a tenth of the size.
    pub fn quick(dir: PathBuf) -> Self {
        JournalBenchParams {
            append_duration: Duration::from_secs(1),
            replay_events: 100_000,
            replay_ids: 1_000,
            ..Self::full(dir)
        }
    }
}

/// One result row.
#[derive(Debug, Clone, Serialize)]
pub struct JournalBenchRow {
    pub bench: &'static str,
    pub workload: String,
    pub tessera_per_s: f64,
    pub baseline_per_s: f64,
    /// tessera_per_s / baseline_per_s.
    pub ratio: f64,
}

/// What went wrong in a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum JournalBenchError {
    #[error("journal: {0}")]
    Journal(#[from] JournalError),
    #[error("rocksdb baseline: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error("{0}")]
    Io(String),
    #[error("{workload}: read {got} events, expected {expected}")]
    Incomplete {
        workload: String,
        got: u64,
        expected: u64,
    },
}

fn ids_label(n: u64) -> String {
    if n == 1 {
        "1id".to_string()
    } else {
        format!("{n}ids")
    }
}

fn size_label(bytes: usize) -> String {
    if bytes.is_multiple_of(1024) {
        format!("{}KiB", bytes / 1024)
    } else {
        format!("{bytes}B")
    }
}

/// Runs every workload and prints a table (or JSON rows).
pub async fn run(
    params: JournalBenchParams,
    json: bool,
) -> Result<Vec<JournalBenchRow>, JournalBenchError> {
    std::fs::create_dir_all(&params.dir).map_err(|e| {
        JournalBenchError::Io(format!("cannot create {}: {e}", params.dir.display()))
    })?;
    progress(&format!("databases in {}", params.dir.display()));
    if !json {
        println!(
            "{:<22} {:>14} {:>14} {:>6}",
            "workload", "tessera_per_s", "rocksdb_per_s", "ratio"
        );
    }
    let mut rows = Vec::new();
    let mut emit = |row: JournalBenchRow| {
        if json {
            print_json_row(&row);
        } else {
            println!(
                "{:<22} {:>14.0} {:>14.0} {:>6.2}",
                row.workload, row.tessera_per_s, row.baseline_per_s, row.ratio
            );
        }
        rows.push(row);
    };
    for &payload_bytes in &params.append_payload_bytes {
        for &ids in &params.append_ids {
            emit(append_workload(&params, ids, payload_bytes).await?);
        }
    }
    if params.replay_events > 0 {
        for row in replay_workloads(&params).await? {
            emit(row);
        }
    }
    let _ = std::fs::remove_dir_all(&params.dir);
    Ok(rows)
}

fn row(workload: String, tessera_per_s: f64, baseline_per_s: f64) -> JournalBenchRow {
    JournalBenchRow {
        bench: "journal",
        workload,
        tessera_per_s,
        baseline_per_s,
        ratio: if baseline_per_s > 0.0 {
            tessera_per_s / baseline_per_s
        } else {
            0.0
        },
    }
}

fn journal_config(path: &Path, fsync: FsyncPolicy) -> JournalConfig {
    let mut config = JournalConfig::new(path);
    config.fsync = fsync;
    config
}

/// 2026-09-21 in milliseconds since the Unix epoch.
const BENCH_TIMESTAMP_MS: u64 = 1_790_000_000_000;

fn event(sequence_nr: u64, payload: &[u8]) -> NewEvent {
    NewEvent {
        sequence_nr,
        // A current time (6 varint bytes), as real events have.
        timestamp_ms: BENCH_TIMESTAMP_MS,
        manifest: Manifest::new("bench.Event", 1),
        payload: payload.to_vec().into(),
        tags: Vec::new(),
    }
}

/// Slices of the spread replay workload, raw RocksDB and tessera alternating on each.
const REPLAY_SLICES: u64 = 20;

/// Counted passes of each replay workload, after a warm-up pass; each side's best counts.
/// Four rather than two: on a shared virtual machine a pass of either side is often slowed
/// by a third by something else, and with two passes a run's ratio moved by ±0.1.
const REPLAY_PASSES: usize = 4;

/// Rounds of an append workload: tessera and RocksDB alternate (T R, R T, T R, R T) so that
/// both see the same disk on a machine whose fsync latency drifts.
const APPEND_ROUNDS: u32 = 4;

async fn append_workload(
    params: &JournalBenchParams,
    ids: usize,
    payload_bytes: usize,
) -> Result<JournalBenchRow, JournalBenchError> {
    let workload = format!(
        "append-{}-{}",
        ids_label(ids as u64),
        size_label(payload_bytes)
    );
    let payload = vec![0x5au8; payload_bytes];
    let phase = params.append_duration / APPEND_ROUNDS;
    progress(&format!(
        "{workload}: {APPEND_ROUNDS} rounds of {phase:?} tessera and {phase:?} raw RocksDB"
    ));
    let journal_path = params.dir.join(format!("{workload}-tessera"));
    let journal =
        Arc::new(RocksJournal::open(journal_config(&journal_path, FsyncPolicy::Always)).await?);
    let raw_path = params.dir.join(format!("{workload}-rocksdb"));
    let (options, cfs) = rocksdb_options(&JournalConfig::new(&raw_path));
    let raw = Arc::new(rocksdb::DB::open_cf_descriptors(&options, &raw_path, cfs)?);

    let mut next_seqs = vec![1u64; ids];
    let mut raw_next_seqs = vec![1u64; ids];
    let (mut tessera_events, mut tessera_time) = (0u64, Duration::ZERO);
    let (mut raw_events, mut raw_time) = (0u64, Duration::ZERO);
    for round in 0..APPEND_ROUNDS {
        for side in [round % 2, 1 - round % 2] {
            if side == 0 {
                let (events, elapsed) =
                    tessera_append(&journal, &mut next_seqs, &payload, phase).await?;
                tessera_events += events;
                tessera_time += elapsed;
            } else {
                let raw = raw.clone();
                let payload = payload.clone();
                let mut seqs = std::mem::take(&mut raw_next_seqs);
                let (events, elapsed, seqs) = tokio::task::spawn_blocking(move || {
                    let result = raw_append(&raw, &mut seqs, &payload, phase);
                    result.map(|(events, elapsed)| (events, elapsed, seqs))
                })
                .await
                .map_err(|e| JournalBenchError::Io(format!("baseline task failed: {e}")))??;
                raw_next_seqs = seqs;
                raw_events += events;
                raw_time += elapsed;
            }
        }
    }
    if let Ok(journal) = Arc::try_unwrap(journal) {
        journal.close().await;
    }
    Ok(row(
        workload,
        tessera_events as f64 / tessera_time.as_secs_f64(),
        raw_events as f64 / raw_time.as_secs_f64(),
    ))
}

/// One writer task per id, each appending one event at a time until the phase is over.
async fn tessera_append(
    journal: &Arc<RocksJournal>,
    next_seqs: &mut [u64],
    payload: &[u8],
    phase: Duration,
) -> Result<(u64, Duration), JournalBenchError> {
    let started = Instant::now();
    let deadline = started + phase;
    let mut writers = Vec::new();
    for (id, &first) in next_seqs.iter().enumerate() {
        let journal = journal.clone();
        let payload = payload.to_vec();
        writers.push(tokio::spawn(async move {
            let pid = format!("bench-{id}");
            let mut seq = first;
            while Instant::now() < deadline {
                journal
                    .append(AtomicWrite {
                        persistence_id: pid.clone(),
                        writer_id: "bench".into(),
                        events: vec![event(seq, &payload)],
                    })
                    .await?;
                seq += 1;
            }
            Ok::<u64, JournalError>(seq)
        }));
    }
    let mut appended = 0;
    for (writer, next) in writers.into_iter().zip(next_seqs.iter_mut()) {
        let reached = writer
            .await
            .map_err(|e| JournalBenchError::Io(format!("writer task failed: {e}")))??;
        appended += reached - *next;
        *next = reached;
    }
    Ok((appended, started.elapsed()))
}

/// One thread per id, each writing one-event batches with sync until the phase is over.
fn raw_append(
    db: &rocksdb::DB,
    next_seqs: &mut [u64],
    payload: &[u8],
    phase: Duration,
) -> Result<(u64, Duration), JournalBenchError> {
    let cf = db
        .cf_handle("events")
        .ok_or_else(|| JournalBenchError::Io("no events column family".into()))?;
    let failed = AtomicBool::new(false);
    let started = Instant::now();
    let deadline = started + phase;
    let written: u64 = std::thread::scope(|scope| {
        let threads: Vec<_> = next_seqs
            .iter_mut()
            .enumerate()
            .map(|(id, seq)| {
                let failed = &failed;
                scope.spawn(move || {
                    let mut sync = rocksdb::WriteOptions::default();
                    sync.set_sync(true);
                    let first = *seq;
                    while Instant::now() < deadline {
                        let mut batch = rocksdb::WriteBatch::default();
                        batch.put_cf(cf, event_key(id as u64 + 1, *seq), payload);
                        if db.write_opt(batch, &sync).is_err() {
                            failed.store(true, Ordering::Relaxed);
                            break;
                        }
                        *seq += 1;
                    }
                    *seq - first
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap_or(0)).sum()
    });
    if failed.load(Ordering::Relaxed) {
        return Err(JournalBenchError::Io("a baseline write failed".into()));
    }
    Ok((written, started.elapsed()))
}

/// Writes the replay data set: log `replay-one` (pid number 1) with `replay_events` events,
/// then `replay_ids` logs (pid numbers 2..) sharing as many.
async fn write_replay_data(
    journal: &Arc<RocksJournal>,
    params: &JournalBenchParams,
) -> Result<(), JournalBenchError> {
    let payload = vec![0x5au8; 100];
    let per_write = 1_000u64;
    let mut seq = 1;
    while seq <= params.replay_events {
        let last = (seq + per_write - 1).min(params.replay_events);
        journal
            .append(AtomicWrite {
                persistence_id: "replay-one".into(),
                writer_id: "bench".into(),
                events: (seq..=last).map(|s| event(s, &payload)).collect(),
            })
            .await?;
        seq = last + 1;
    }
    let per_log = params.replay_events / params.replay_ids;
    let mut pending = futures::stream::iter(0..params.replay_ids)
        .map(|id| {
            let journal = journal.clone();
            let events = (1..=per_log).map(|s| event(s, &payload)).collect();
            async move {
                journal
                    .append(AtomicWrite {
                        persistence_id: format!("replay-{id}"),
                        writer_id: "bench".into(),
                        events,
                    })
                    .await
            }
        })
        // In id order, so that log `replay-{id}` gets pid number id + 2.
        .buffered(64);
    while let Some(result) = pending.next().await {
        result?;
    }
    Ok(())
}

async fn tessera_replay(
    journal: &RocksJournal,
    pids: &[String],
) -> Result<(u64, Duration), JournalBenchError> {
    let started = Instant::now();
    let mut events = 0u64;
    let mut bytes = 0usize;
    for pid in pids {
        let mut replay = journal.replay(pid, 1, u64::MAX, u64::MAX);
        while let Some(event) = replay.next().await {
            bytes += event?.payload.len();
            events += 1;
        }
    }
    std::hint::black_box(bytes);
    Ok((events, started.elapsed()))
}

/// Iterates the events of pid numbers `pid_nums` with a raw iterator, touching every key and
/// value.
fn raw_replay(
    db: &rocksdb::DB,
    pid_nums: std::ops::RangeInclusive<u64>,
) -> Result<(u64, Duration), JournalBenchError> {
    let cf = db
        .cf_handle("events")
        .ok_or_else(|| JournalBenchError::Io("no events column family".into()))?;
    let started = Instant::now();
    let mut events = 0u64;
    let mut bytes = 0usize;
    for pid_num in pid_nums {
        let mut options = rocksdb::ReadOptions::default();
        options.set_iterate_upper_bound(event_key(pid_num + 1, 0));
        let mut iter = db.raw_iterator_cf_opt(cf, options);
        iter.seek(event_key(pid_num, 1));
        while let Some((key, value)) = iter.item() {
            bytes += key.len() + value.len();
            events += 1;
            iter.next();
        }
        iter.status()?;
    }
    std::hint::black_box(bytes);
    Ok((events, started.elapsed()))
}

async fn replay_workloads(
    params: &JournalBenchParams,
) -> Result<Vec<JournalBenchRow>, JournalBenchError> {
    let path = params.dir.join("replay");
    progress(&format!(
        "replay: writing {} events to 1 log and {} to {} logs",
        params.replay_events, params.replay_events, params.replay_ids
    ));
    let journal = Arc::new(RocksJournal::open(journal_config(&path, FsyncPolicy::Never)).await?);
    write_replay_data(&journal, params).await?;
    if let Ok(journal) = Arc::try_unwrap(journal) {
        journal.close().await;
    }
    // Settle the tree before measuring: flush and compact everything once, so that no pass
    // (of either side) shares the CPU with a background compaction of the freshly written
    // data.
    progress("replay: compacting the data set");
    let compact_path = path.clone();
    tokio::task::spawn_blocking(move || -> Result<(), JournalBenchError> {
        let (options, cfs) = rocksdb_options(&JournalConfig::new(&compact_path));
        let db = rocksdb::DB::open_cf_descriptors(&options, &compact_path, cfs)?;
        for name in ["events", "tag_index", "meta"] {
            if let Some(cf) = db.cf_handle(name) {
                db.flush_cf(cf)?;
                db.compact_range_cf(cf, None::<&[u8]>, None::<&[u8]>);
            }
        }
        Ok(())
    })
    .await
    .map_err(|e| JournalBenchError::Io(format!("compaction task failed: {e}")))??;
    let per_log = params.replay_events / params.replay_ids;
    // The spread workload is measured in slices of logs, raw RocksDB and tessera taking turns
    // on each slice, so that both see the same machine when its speed drifts (it does, on a
    // shared virtual machine, by tens of percent within a minute).
    let slice_logs = (params.replay_ids / REPLAY_SLICES).max(1);
    let spread_slices: Vec<(Vec<String>, std::ops::RangeInclusive<u64>)> = (0..params.replay_ids)
        .step_by(slice_logs as usize)
        .map(|first| {
            let last = (first + slice_logs).min(params.replay_ids) - 1;
            let pids = (first..=last).map(|id| format!("replay-{id}")).collect();
            // Log `replay-{id}` has pid number id + 2.
            (pids, first + 2..=last + 2)
        })
        .collect();
    let workloads = [
        (
            "replay-1id".to_string(),
            vec![(vec!["replay-one".to_string()], 1..=1u64)],
            params.replay_events,
        ),
        (
            format!("replay-{}", ids_label(params.replay_ids)),
            spread_slices,
            per_log * params.replay_ids,
        ),
    ];
    let mut rows = Vec::new();
    for (workload, slices, expected) in workloads {
        let mut best_tessera = f64::MAX;
        let mut best_raw = f64::MAX;
        // Pass 0 warms the caches and is not counted.
        for pass in 0..=REPLAY_PASSES {
            progress(&format!("{workload}: pass {pass} of {REPLAY_PASSES}"));
            // Both sides start each pass with a cold block cache of the same size: the journal
            // freshly opened, the baseline a read-only RocksDB instance with the same options.
            let journal = RocksJournal::open(journal_config(&path, FsyncPolicy::Never)).await?;
            let raw_path = path.clone();
            let raw = tokio::task::spawn_blocking(move || {
                let (options, cfs) = rocksdb_options(&JournalConfig::new(&raw_path));
                rocksdb::DB::open_cf_descriptors_read_only(&options, &raw_path, cfs, false)
            })
            .await
            .map_err(|e| JournalBenchError::Io(format!("baseline task failed: {e}")))??;
            let raw = Arc::new(raw);
            let (mut raw_events, mut raw_time) = (0u64, Duration::ZERO);
            let (mut tessera_events, mut tessera_time) = (0u64, Duration::ZERO);
            for (index, (pids, pid_nums)) in slices.iter().enumerate() {
                for side in [index % 2, 1 - index % 2] {
                    if side == 0 {
                        let (events, elapsed) = tessera_replay(&journal, pids).await?;
                        tessera_events += events;
                        tessera_time += elapsed;
                    } else {
                        let raw = raw.clone();
                        let nums = pid_nums.clone();
                        let (events, elapsed) =
                            tokio::task::spawn_blocking(move || raw_replay(&raw, nums))
                                .await
                                .map_err(|e| {
                                    JournalBenchError::Io(format!("baseline task failed: {e}"))
                                })??;
                        raw_events += events;
                        raw_time += elapsed;
                    }
                }
            }
            journal.close().await;
            check_count(&workload, raw_events, expected)?;
            check_count(&workload, tessera_events, expected)?;
            progress(&format!(
                "{workload}: pass {pass}: tessera {:.0}/s, rocksdb {:.0}/s",
                expected as f64 / tessera_time.as_secs_f64(),
                expected as f64 / raw_time.as_secs_f64()
            ));
            if pass > 0 {
                best_raw = best_raw.min(raw_time.as_secs_f64());
                best_tessera = best_tessera.min(tessera_time.as_secs_f64());
            }
        }
        rows.push(row(
            workload,
            expected as f64 / best_tessera,
            expected as f64 / best_raw,
        ));
    }
    Ok(rows)
}

fn check_count(workload: &str, got: u64, expected: u64) -> Result<(), JournalBenchError> {
    if got == expected {
        Ok(())
    } else {
        Err(JournalBenchError::Incomplete {
            workload: workload.to_string(),
            got,
            expected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_workload_runs_and_reports_a_ratio() {
        let dir = tempfile::tempdir().unwrap();
        let params = JournalBenchParams {
            append_ids: vec![1, 4],
            append_payload_bytes: vec![100],
            append_duration: Duration::from_millis(200),
            replay_events: 2_000,
            replay_ids: 20,
            dir: dir.path().join("bench"),
        };
        let rows = run(params, true).await.unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r.workload.as_str()).collect();
        assert_eq!(
            names,
            [
                "append-1id-100B",
                "append-4ids-100B",
                "replay-1id",
                "replay-20ids"
            ]
        );
        for row in &rows {
            assert!(
                row.tessera_per_s > 0.0 && row.baseline_per_s > 0.0,
                "{row:?}"
            );
            assert!((row.ratio - row.tessera_per_s / row.baseline_per_s).abs() < 1e-9);
        }
    }
}
