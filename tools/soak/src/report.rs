//! The soak's summary, Jepsen-style: per kind of operation how many ended ok, failed and
//! unknown; what the nemesis did; each check with its figures and anomalies; the verdict. As
//! text, or as one JSON object.

use super::checker::CheckResult;
use super::history::{OpKind, Tally};
use super::memory::NodeMemory;
use super::nemesis::{Event, EventKind};
use serde::Serialize;
use std::collections::BTreeMap;

/// Everything the summary says.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub nodes: usize,
    pub minutes: f64,
    pub seed: u64,
    /// Where the nodes ran.
    pub placement: String,
    /// `on`, or why partitions were skipped.
    pub partitions: String,
    pub operations: BTreeMap<OpKind, Tally>,
    /// Nemesis events by kind.
    pub nemesis: BTreeMap<EventKind, u64>,
    pub events: Vec<Event>,
    pub checks: Vec<CheckResult>,
    pub memory: Vec<NodeMemory>,
    pub anomalies: usize,
    pub valid: bool,
    /// The sabotage switched on, if any (a run that must be found invalid).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sabotage: Option<String>,
    /// The directory with the node logs, data and the history, if kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_dir: Option<String>,
}

impl Summary {
    /// The summary as text, for a terminal.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let mut line = |s: String| {
            out.push_str(&s);
            out.push('\n');
        };
        line(format!(
            "tessera soak: {} nodes, {} min, seed {}",
            self.nodes, self.minutes, self.seed
        ));
        line(format!("nodes: {}", self.placement));
        line(format!("partitions: {}", self.partitions));
        if let Some(sabotage) = &self.sabotage {
            line(format!(
                "sabotage: {sabotage} (the history is corrupted on purpose; the checker must \
                 find it)"
            ));
        }
        line(String::new());
        line(format!(
            "{:<20} {:>9} {:>9} {:>9}",
            "operation", "ok", "failed", "unknown"
        ));
        let mut total = Tally::default();
        for (kind, tally) in &self.operations {
            line(format!(
                "{:<20} {:>9} {:>9} {:>9}",
                kind.name(),
                tally.ok,
                tally.failed,
                tally.unknown
            ));
            total.ok += tally.ok;
            total.failed += tally.failed;
            total.unknown += tally.unknown;
        }
        line(format!(
            "{:<20} {:>9} {:>9} {:>9}",
            "total", total.ok, total.failed, total.unknown
        ));
        line(String::new());
        let events: Vec<String> = self
            .nemesis
            .iter()
            .map(|(kind, n)| format!("{n} {}", kind_name(*kind)))
            .collect();
        line(format!(
            "nemesis: {}",
            if events.is_empty() {
                "nothing".to_string()
            } else {
                events.join(", ")
            }
        ));
        line(String::new());
        line("checks:".to_string());
        for check in &self.checks {
            line(format!(
                "  {:<5} {:<14} {}",
                if check.anomaly_count == 0 {
                    "ok"
                } else {
                    "FAIL"
                },
                check.name,
                check.summary
            ));
            for anomaly in &check.anomalies {
                line(format!("        - {anomaly}"));
            }
            if check.anomaly_count > check.anomalies.len() {
                line(format!(
                    "        ... and {} more",
                    check.anomaly_count - check.anomalies.len()
                ));
            }
        }
        line(String::new());
        line(format!("anomalies: {}", self.anomalies));
        if let Some(dir) = &self.kept_dir {
            line(format!(
                "node logs, data and the history (history.jsonl) kept in {dir}"
            ));
        }
        line(format!(
            "verdict: {}",
            if self.valid {
                "valid: no anomalies".to_string()
            } else {
                format!("INVALID: {} anomalies", self.anomalies)
            }
        ));
        out
    }
}

fn kind_name(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Kill => "kill (SIGKILL)",
        EventKind::Pause => "pause (SIGSTOP)",
        EventKind::Resume => "resume (SIGCONT)",
        EventKind::Terminate => "graceful stop (SIGTERM)",
        EventKind::Restart => "restart",
        EventKind::Left => "left and exited after SIGTERM",
        EventKind::Downed => "downed by the cluster (exit 3)",
        EventKind::Removed => "removed by the cluster (exit 0)",
        EventKind::Crash => "crash",
        EventKind::Partition => "partition",
        EventKind::Heal => "heal",
        EventKind::StartFailed => "failed start (retried)",
    }
}

/// Counts of the events by kind.
pub fn count_events(events: &[Event]) -> BTreeMap<EventKind, u64> {
    let mut counts = BTreeMap::new();
    for event in events {
        *counts.entry(event.kind).or_default() += 1;
    }
    counts
}
