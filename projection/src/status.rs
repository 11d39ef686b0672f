//! What each projection instance running on this node did and where it is, for operators
//! (`GET /projections`) and metrics.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Where one instance's run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Taking its offset log over and reading its offset.
    Opening,
    /// Reading and handling events.
    Running,
    /// Waiting before retrying a failed handler.
    Retrying,
    /// Paused by an operator: waiting to be resumed.
    Paused,
    /// Ended (told to stop, or failed); a new run starts at the next keep-alive.
    Stopped,
}

/// One instance of a projection on this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceStatus {
    pub projection: String,
    pub entity_type: String,
    pub index: u32,
    pub instances: u32,
    /// Its slice range, first and last.
    pub slices: (u16, u16),
    pub state: RunState,
    /// Runs started on this node.
    pub runs: u64,
    /// Envelopes handled (skipped ones not included), over every run on this node.
    pub handled: u64,
    /// Handler calls that failed (each retry counts).
    pub handler_errors: u64,
    /// Envelopes skipped after their retries were spent.
    pub skipped: u64,
    /// Offsets saved, and saves that failed (a save that fails ends the run: the instance
    /// may have lost its slot).
    pub saves: u64,
    pub save_failures: u64,
    /// Envelopes handled since the offset was last saved: what the next run handles again
    /// if this one ends now without a save (0 for exactly-once delivery, whose handler
    /// commits each group's offset).
    #[serde(default)]
    pub unsaved: u64,
    /// Logs in the offset, and the sum of their sequence numbers handled (events handled
    /// in all, as far as the offset knows).
    pub offset_logs: u64,
    pub offset_events: u64,
    /// Milliseconds from the last handled event's write to its handling; 0 once the
    /// instance caught up.
    pub lag_ms: Option<u64>,
    /// Acknowledged events of its slices not handled yet, as far as its query knows (the
    /// members' acknowledged marks, polled every 100 ms).
    pub lag_events: Option<u64>,
    /// The operators' resets this instance applied to its offset.
    pub resets_applied: u64,
    /// The last error, handler's or journal's.
    pub last_error: Option<String>,
}

impl InstanceStatus {
    /// An instance that has not run yet.
    pub fn new(
        projection: &str,
        entity_type: &str,
        index: u32,
        instances: u32,
        slices: (u16, u16),
    ) -> Self {
        InstanceStatus {
            projection: projection.to_string(),
            entity_type: entity_type.to_string(),
            index,
            instances,
            slices,
            state: RunState::Opening,
            runs: 0,
            handled: 0,
            handler_errors: 0,
            skipped: 0,
            saves: 0,
            save_failures: 0,
            unsaved: 0,
            offset_logs: 0,
            offset_events: 0,
            lag_ms: None,
            lag_events: None,
            resets_applied: 0,
            last_error: None,
        }
    }
}

/// The instances on this node, by projection and index. Cheap to clone.
#[derive(Clone, Default)]
pub struct ProjectionStatuses {
    /// By projection, then by index: a lookup by name borrows it (statuses change per
    /// envelope handled).
    inner: Arc<Mutex<BTreeMap<String, BTreeMap<u32, InstanceStatus>>>>,
}

impl ProjectionStatuses {
    /// Every instance that ran on this node, in order.
    pub fn all(&self) -> Vec<InstanceStatus> {
        self.lock()
            .values()
            .flat_map(|instances| instances.values().cloned())
            .collect()
    }

    /// Changes the status of one instance (made from `initial` the first time).
    pub fn update(
        &self,
        projection: &str,
        index: u32,
        initial: impl FnOnce() -> InstanceStatus,
        change: impl FnOnce(&mut InstanceStatus),
    ) {
        let mut all = self.lock();
        if let Some(instances) = all.get_mut(projection) {
            change(instances.entry(index).or_insert_with(initial));
            return;
        }
        let instances = all.entry(projection.to_string()).or_default();
        change(instances.entry(index).or_insert_with(initial));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, BTreeMap<u32, InstanceStatus>>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}
