//! Counters and the append latency of the replicated journal, for `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use tessera_metrics::LatencyHistogram;

/// What the replicated journal counts.
#[derive(Debug, Default)]
pub struct PersistenceMetrics {
    /// Appends acknowledged by a write quorum.
    pub appends_acknowledged: AtomicU64,
    /// Appends refused before anything was sent (not applied).
    pub appends_not_applied: AtomicU64,
    /// Appends whose outcome is unknown.
    pub appends_unknown: AtomicU64,
    /// Writers started: each fences and recovers its log.
    pub recoveries: AtomicU64,
    /// Writers stopped because a later writer fenced them.
    pub fenced: AtomicU64,
    /// Operations refused because the writer had been fenced.
    pub refused_fenced: AtomicU64,
    /// Entries copied to replicas that lacked them (repairs and catch-ups).
    pub entries_copied: AtomicU64,
    /// Configuration changes that completed (a log moved off a member, or grew to N).
    pub reconfigurations: AtomicU64,
    /// Writers live now.
    pub writers: AtomicU64,
    /// Times a log no member knew was not created because too many of the stores this node
    /// has seen did not answer.
    pub creations_held: AtomicU64,
    /// Stores this node has seen in the cluster and not forgotten.
    pub known_stores: AtomicU64,
    /// Saves of the known-stores file that failed (the latest list is saved again within a
    /// second).
    pub known_stores_save_failures: AtomicU64,
    /// How long acknowledged appends took, from the call to the write quorum's
    /// acknowledgement. Shared, not copied into snapshots: the node renders it in `/metrics`.
    pub append_durations: LatencyHistogram,
}

impl PersistenceMetrics {
    pub fn incr(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// The replicated journal's counters as read at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PersistenceMetricsSnapshot {
    pub appends_acknowledged: u64,
    pub appends_not_applied: u64,
    pub appends_unknown: u64,
    pub recoveries: u64,
    pub fenced: u64,
    pub refused_fenced: u64,
    pub entries_copied: u64,
    pub reconfigurations: u64,
    pub writers: u64,
    pub creations_held: u64,
    pub known_stores: u64,
    pub known_stores_save_failures: u64,
}

impl PersistenceMetrics {
    pub fn snapshot(&self) -> PersistenceMetricsSnapshot {
        PersistenceMetricsSnapshot {
            appends_acknowledged: Self::get(&self.appends_acknowledged),
            appends_not_applied: Self::get(&self.appends_not_applied),
            appends_unknown: Self::get(&self.appends_unknown),
            recoveries: Self::get(&self.recoveries),
            fenced: Self::get(&self.fenced),
            refused_fenced: Self::get(&self.refused_fenced),
            entries_copied: Self::get(&self.entries_copied),
            reconfigurations: Self::get(&self.reconfigurations),
            writers: Self::get(&self.writers),
            creations_held: Self::get(&self.creations_held),
            known_stores: Self::get(&self.known_stores),
            known_stores_save_failures: Self::get(&self.known_stores_save_failures),
        }
    }
}
