//! The [`SnapshotStore`] trait and its types.

use crate::error::SnapshotError;
use bytes::Bytes;
use futures::future::BoxFuture;
use tessera_storage::Manifest;

/// Which snapshot of a log a snapshot was taken at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotMetadata {
    /// The log whose state the snapshot holds.
    pub persistence_id: String,
    /// The sequence number of the last event folded into the state.
    pub sequence_nr: u64,
    /// Milliseconds since the Unix epoch at which it was taken.
    pub timestamp_ms: u64,
}

/// A stored snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Where it belongs.
    pub metadata: SnapshotMetadata,
    /// The state's type and encoding version.
    pub manifest: Manifest,
    /// The encoded state.
    pub payload: Bytes,
}

/// Bounds (inclusive) on the snapshots a load or delete considers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotSelectionCriteria {
    pub max_sequence_nr: u64,
    pub max_timestamp_ms: u64,
    pub min_sequence_nr: u64,
    pub min_timestamp_ms: u64,
}

impl SnapshotSelectionCriteria {
    /// Every snapshot: `load` with it returns the latest.
    pub fn latest() -> Self {
        SnapshotSelectionCriteria {
            max_sequence_nr: u64::MAX,
            max_timestamp_ms: u64::MAX,
            min_sequence_nr: 0,
            min_timestamp_ms: 0,
        }
    }

    /// Snapshots at or below a sequence number.
    pub fn up_to(max_sequence_nr: u64) -> Self {
        SnapshotSelectionCriteria {
            max_sequence_nr,
            ..Self::latest()
        }
    }

    /// Whether a snapshot taken at `sequence_nr` and `timestamp_ms` is selected.
    pub fn matches(&self, sequence_nr: u64, timestamp_ms: u64) -> bool {
        (self.min_sequence_nr..=self.max_sequence_nr).contains(&sequence_nr)
            && (self.min_timestamp_ms..=self.max_timestamp_ms).contains(&timestamp_ms)
    }

    /// Whether the timestamp bounds select every snapshot (then a delete need not read them).
    pub fn any_timestamp(&self) -> bool {
        self.min_timestamp_ms == 0 && self.max_timestamp_ms == u64::MAX
    }
}

/// Snapshots of entity state, per persistence id.
pub trait SnapshotStore: Send + Sync + 'static {
    /// Saves a snapshot; one saved before at the same sequence number is replaced. Resolves
    /// once it is durable under the store's fsync policy.
    fn save(
        &self,
        metadata: SnapshotMetadata,
        manifest: Manifest,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<(), SnapshotError>>;

    /// The snapshot with the highest sequence number that matches `criteria`, if any.
    fn load(
        &self,
        persistence_id: &str,
        criteria: SnapshotSelectionCriteria,
    ) -> BoxFuture<'static, Result<Option<Snapshot>, SnapshotError>>;

    /// Deletes the snapshot of a log at a sequence number (nothing if there is none).
    fn delete(
        &self,
        persistence_id: &str,
        sequence_nr: u64,
    ) -> BoxFuture<'static, Result<(), SnapshotError>>;

    /// Deletes every snapshot of a log that matches `criteria`.
    fn delete_matching(
        &self,
        persistence_id: &str,
        criteria: SnapshotSelectionCriteria,
    ) -> BoxFuture<'static, Result<(), SnapshotError>>;
}
