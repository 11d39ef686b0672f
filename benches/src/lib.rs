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

use serde::Serialize;

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
