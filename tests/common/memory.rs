//! A node process's memory, as the kernel counts it: the resident set (VmRSS of
//! /proc/PID/status), read now or sampled over a stretch of a test for its peak.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How often a [`PeakRss`] reads the resident set.
const SAMPLE_INTERVAL: Duration = Duration::from_millis(50);

/// The resident set size of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    try_rss_kib(pid).unwrap_or_else(|| panic!("no VmRSS for process {pid}: has it exited?"))
}

/// The resident set size of process `pid`, in KiB; None once it has exited (a zombie has no
/// VmRSS line).
pub fn try_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse().ok())
}

/// The highest resident set size of a process seen while it runs, sampled every 50 ms by a
/// task until [`PeakRss::stop`].
pub struct PeakRss {
    peak_kib: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl PeakRss {
    pub fn start(pid: u32) -> Self {
        let peak_kib = Arc::new(AtomicU64::new(rss_kib(pid)));
        let done = Arc::new(AtomicBool::new(false));
        let task = {
            let (peak_kib, done) = (peak_kib.clone(), done.clone());
            tokio::spawn(async move {
                // Until stopped, or the process exits (a failed test kills its nodes).
                while !done.load(Ordering::Relaxed) {
                    let Some(kib) = try_rss_kib(pid) else { break };
                    peak_kib.fetch_max(kib, Ordering::Relaxed);
                    tokio::time::sleep(SAMPLE_INTERVAL).await;
                }
            })
        };
        Self {
            peak_kib,
            done,
            task,
        }
    }

    /// The peak so far, in KiB.
    pub fn peak_kib(&self) -> u64 {
        self.peak_kib.load(Ordering::Relaxed)
    }

    /// Stops sampling; returns the peak in KiB (a last sample included).
    pub async fn stop(self, pid: u32) -> u64 {
        self.done.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.peak_kib.fetch_max(rss_kib(pid), Ordering::Relaxed);
        self.peak_kib.load(Ordering::Relaxed)
    }
}
