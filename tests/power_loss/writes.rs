//! The parent's side of the power-loss loop: what the children issued and had acknowledged
//! (their workload lines), and the check of what a child found against it.

use std::collections::{BTreeMap, BTreeSet};

/// What the children said about one log.
#[derive(Debug, Default, Clone)]
struct LogWrites {
    /// Highest sequence number acknowledged.
    acked: u64,
    /// Highest sequence number any write was issued for.
    issued: u64,
    /// Highest deletion acknowledged.
    deleted_acked: u64,
    /// Every deletion issued (a cut may or may not leave it done).
    deletions_issued: BTreeSet<u64>,
}

/// What the children said about one series of snapshots.
#[derive(Debug, Default, Clone)]
struct SnapshotWrites {
    acked: u64,
    issued: BTreeSet<u64>,
    deleted_acked: u64,
}

/// What the children said about one durable counter.
#[derive(Debug, Default, Clone)]
struct CounterWrites {
    acked: u64,
    issued: u64,
}

/// Everything the children issued and had acknowledged, over all iterations.
#[derive(Debug, Default, Clone)]
pub struct Writes {
    logs: BTreeMap<String, LogWrites>,
    snapshots: BTreeMap<String, SnapshotWrites>,
    counters: BTreeMap<String, CounterWrites>,
}

impl Writes {
    /// Takes in one line of a child's workload.
    pub fn record(&mut self, line: &str) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let number = |i: usize| {
            parts
                .get(i)
                .and_then(|p| p.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let Some((&tag, rest)) = parts.split_first() else {
            return;
        };
        let Some(&name) = rest.first() else { return };
        match tag {
            "j" | "r" => {
                let log = self.logs.entry(name.to_string()).or_default();
                log.issued = log.issued.max(number(2));
            }
            "J" | "R" => {
                let log = self.logs.entry(name.to_string()).or_default();
                log.acked = log.acked.max(number(2));
            }
            "jd" => {
                let log = self.logs.entry(name.to_string()).or_default();
                log.deletions_issued.insert(number(2));
            }
            "JD" => {
                let log = self.logs.entry(name.to_string()).or_default();
                log.deleted_acked = log.deleted_acked.max(number(2));
            }
            "s" | "rs" => {
                let series = self.snapshots.entry(name.to_string()).or_default();
                series.issued.insert(number(2));
            }
            "S" | "RS" => {
                let series = self.snapshots.entry(name.to_string()).or_default();
                series.acked = series.acked.max(number(2));
            }
            "SD" => {
                let series = self.snapshots.entry(name.to_string()).or_default();
                series.deleted_acked = series.deleted_acked.max(number(2));
            }
            "d" => self.counters.entry(name.to_string()).or_default().issued += 1,
            "D" => self.counters.entry(name.to_string()).or_default().acked += 1,
            _ => {}
        }
    }

    pub fn acknowledged(&self) -> u64 {
        self.logs.values().map(|l| l.acked).sum::<u64>()
            + self.snapshots.values().map(|s| s.acked).sum::<u64>()
            + self.counters.values().map(|c| c.acked).sum::<u64>()
    }
}

/// One thing a child found that contradicts what was acknowledged, and the store's kind.
#[derive(Debug, Clone)]
pub struct Violation {
    /// `J` (journal), `R` (replica store), `RS` / `S` (snapshot store, replicated / own),
    /// `D` (durable keys).
    pub kind: String,
    /// An acknowledged write is missing (as opposed to something never written appearing,
    /// or a store reporting itself inconsistent).
    pub lost: bool,
    pub what: String,
}

/// Whether a child's line reports what it found in the stores (as opposed to its workload).
pub fn is_finding(line: &str) -> bool {
    ["found ", "corrupt ", "unreadable "]
        .iter()
        .any(|prefix| line.starts_with(prefix))
}

/// Checks a child's `found`, `corrupt` and `unreadable` lines against what was acknowledged
/// before it started.
pub fn check(found: &[String], writes: &Writes) -> Vec<Violation> {
    let mut violations = Vec::new();
    let mut violation = |kind: &str, lost: bool, what: String| {
        violations.push(Violation {
            kind: kind.to_string(),
            lost,
            what,
        })
    };
    for line in found {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let numbers: Vec<u64> = parts
            .iter()
            .skip(3)
            .filter_map(|p| p.parse().ok())
            .collect();
        match parts[..] {
            ["corrupt", kind, ..] => violation(kind, false, line.clone()),
            // What cannot be read back is lost to its readers.
            ["unreadable", kind, ..] => violation(kind, true, line.clone()),
            ["found", kind @ ("J" | "R"), pid, highest, deleted] => {
                let (highest, deleted): (u64, u64) =
                    (highest.parse().unwrap_or(0), deleted.parse().unwrap_or(0));
                let log = writes.logs.get(pid).cloned().unwrap_or_default();
                if highest < log.acked {
                    violation(
                        kind,
                        true,
                        format!(
                            "{pid}: acknowledged up to {}, the store has up to {highest}",
                            log.acked
                        ),
                    );
                }
                if highest > log.issued {
                    violation(
                        kind,
                        false,
                        format!(
                            "{pid}: has up to {highest}, never written beyond {}",
                            log.issued
                        ),
                    );
                }
                if deleted < log.deleted_acked {
                    violation(
                        kind,
                        true,
                        format!(
                            "{pid}: deletion up to {} acknowledged, events from {} are back",
                            log.deleted_acked,
                            deleted + 1
                        ),
                    );
                }
                if deleted > 0 && !log.deletions_issued.contains(&deleted) {
                    violation(
                        kind,
                        false,
                        format!("{pid}: events up to {deleted} are gone, never deleted so"),
                    );
                }
            }
            ["found", kind @ ("RS" | "S"), pid, ..] => {
                let series = writes.snapshots.get(pid).cloned().unwrap_or_default();
                let latest = numbers.first().copied().unwrap_or(0);
                if latest < series.acked {
                    violation(
                        kind,
                        true,
                        format!(
                            "{pid}: snapshot {} acknowledged, the latest is {latest}",
                            series.acked
                        ),
                    );
                }
                for &seq in &numbers {
                    if seq != 0 && !series.issued.contains(&seq) {
                        violation(
                            kind,
                            false,
                            format!("{pid}: snapshot {seq} was never saved"),
                        );
                    }
                    if seq != 0 && seq <= series.deleted_acked {
                        violation(
                            kind,
                            true,
                            format!(
                                "{pid}: snapshot {seq} is back after the deletion up to {} was acknowledged",
                                series.deleted_acked
                            ),
                        );
                    }
                }
            }
            ["found", "D", key, value] => {
                let counter = writes.counters.get(key).cloned().unwrap_or_default();
                let value: u64 = value.parse().unwrap_or(0);
                if value < counter.acked {
                    violation(
                        "D",
                        true,
                        format!(
                            "{key}: {} increments acknowledged, the value is {value}",
                            counter.acked
                        ),
                    );
                }
                if value > counter.issued {
                    violation(
                        "D",
                        false,
                        format!(
                            "{key}: the value is {value}, only {} increments issued",
                            counter.issued
                        ),
                    );
                }
            }
            _ => violation("?", false, format!("unexpected line {line:?}")),
        }
    }
    violations
}
