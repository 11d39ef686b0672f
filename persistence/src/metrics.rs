//! Counters of the replicated journal, for `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (inclusive) of the append latency buckets, in microseconds.
pub const LATENCY_BUCKETS_US: [u64; 14] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 5_000_000,
];

/// A histogram with fixed buckets (cumulative counts are computed when read).
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS_US.len()],
    overflow: AtomicU64,
    sum_us: AtomicU64,
}

/// A histogram as read at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// `(upper bound in µs, observations at or below it)`, cumulative.
    pub buckets: Vec<(u64, u64)>,
    pub count: u64,
    pub sum_us: u64,
}

impl Histogram {
    pub fn observe(&self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        match LATENCY_BUCKETS_US.iter().position(|bound| us <= *bound) {
            Some(i) => self.buckets[i].fetch_add(1, Ordering::Relaxed),
            None => self.overflow.fetch_add(1, Ordering::Relaxed),
        };
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut cumulative = 0;
        let buckets = LATENCY_BUCKETS_US
            .iter()
            .zip(&self.buckets)
            .map(|(bound, count)| {
                cumulative += count.load(Ordering::Relaxed);
                (*bound, cumulative)
            })
            .collect();
        HistogramSnapshot {
            buckets,
            count: cumulative + self.overflow.load(Ordering::Relaxed),
            sum_us: self.sum_us.load(Ordering::Relaxed),
        }
    }
}

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
    /// Append latency, from the call to the acknowledgement.
    pub append_latency: Histogram,
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
    pub append_latency: HistogramSnapshot,
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
            append_latency: self.append_latency.snapshot(),
        }
    }
}
