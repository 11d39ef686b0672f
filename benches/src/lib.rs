//! `tessera bench ...`: benchmarks that measure their baseline in the same run and print the
//! ratio. Progress goes to stderr; results go to stdout as a table or, with `--json`, as one
//! JSON object per row.

pub mod args;
pub mod cluster;
pub mod ddata;
pub mod entities;
pub mod journal;
pub mod projections;
pub mod replicated;
pub mod sharding;

use futures::StreamExt;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_journal::{Journal, JournalError};

/// Replays each of `pids` whole, `concurrency` at a time (the local journal's baseline of
/// several benchmarks); returns the events read and the time it took.
pub async fn replay_logs(
    journal: Arc<dyn Journal>,
    pids: impl Iterator<Item = String>,
    concurrency: usize,
) -> Result<(u64, Duration), JournalError> {
    let started = Instant::now();
    let counts = futures::stream::iter(pids)
        .map(|pid| {
            let journal = journal.clone();
            async move {
                let mut replay = journal.replay(&pid, 1, u64::MAX, u64::MAX);
                let mut events = 0u64;
                while let Some(event) = replay.next().await {
                    std::hint::black_box(event?.payload.len());
                    events += 1;
                }
                Ok::<u64, JournalError>(events)
            }
        })
        .buffer_unordered(concurrency)
        .collect::<Vec<_>>()
        .await;
    let mut events = 0;
    for count in counts {
        events += count?;
    }
    Ok((events, started.elapsed()))
}

/// Prints a progress line on stderr (visible while a long benchmark runs).
pub fn progress(message: &str) {
    eprintln!("  .. {message}");
}

/// Prints one result row as a JSON object on its own line.
pub fn print_json_row<T: Serialize>(row: &T) {
    match serde_json::to_string(row) {
        Ok(line) => println!("{line}"),
        Err(e) => eprintln!("error: cannot encode a benchmark row: {e}"),
    }
}

/// The value at fraction `p` (0.5 for the median) of ascending `sorted`; `None` when empty.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(index).copied()
}
