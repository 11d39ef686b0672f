//! [`MemorySnapshotStore`]: a [`SnapshotStore`] in memory, for tests of entity types without
//! RocksDB. Nothing survives the value.

use crate::error::SnapshotError;
use crate::store::{Snapshot, SnapshotMetadata, SnapshotSelectionCriteria, SnapshotStore};
use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tessera_storage::Manifest;

/// An in-memory [`SnapshotStore`]. Cheap to clone: clones share the snapshots.
#[derive(Clone, Default)]
pub struct MemorySnapshotStore {
    snapshots: Arc<Mutex<BTreeMap<(String, u64), Snapshot>>>,
}

impl MemorySnapshotStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<(String, u64), Snapshot>> {
        self.snapshots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The sequence numbers of a log's snapshots, in order.
    pub fn sequence_nrs(&self, persistence_id: &str) -> Vec<u64> {
        self.lock()
            .keys()
            .filter(|(pid, _)| pid == persistence_id)
            .map(|(_, seq)| *seq)
            .collect()
    }
}

impl SnapshotStore for MemorySnapshotStore {
    fn save(
        &self,
        metadata: SnapshotMetadata,
        manifest: Manifest,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<(), SnapshotError>> {
        self.lock().insert(
            (metadata.persistence_id.clone(), metadata.sequence_nr),
            Snapshot {
                metadata,
                manifest,
                payload,
            },
        );
        futures::future::ready(Ok(())).boxed()
    }

    fn load(
        &self,
        persistence_id: &str,
        criteria: SnapshotSelectionCriteria,
    ) -> BoxFuture<'static, Result<Option<Snapshot>, SnapshotError>> {
        let found = self
            .lock()
            .values()
            .filter(|s| {
                s.metadata.persistence_id == persistence_id
                    && criteria.matches(s.metadata.sequence_nr, s.metadata.timestamp_ms)
            })
            .max_by_key(|s| s.metadata.sequence_nr)
            .cloned();
        futures::future::ready(Ok(found)).boxed()
    }

    fn delete(
        &self,
        persistence_id: &str,
        sequence_nr: u64,
    ) -> BoxFuture<'static, Result<(), SnapshotError>> {
        self.lock()
            .remove(&(persistence_id.to_string(), sequence_nr));
        futures::future::ready(Ok(())).boxed()
    }

    fn delete_matching(
        &self,
        persistence_id: &str,
        criteria: SnapshotSelectionCriteria,
    ) -> BoxFuture<'static, Result<(), SnapshotError>> {
        self.lock().retain(|(pid, _), s| {
            !(pid == persistence_id
                && criteria.matches(s.metadata.sequence_nr, s.metadata.timestamp_ms))
        });
        futures::future::ready(Ok(())).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(seq: u64) -> SnapshotMetadata {
        SnapshotMetadata {
            persistence_id: "a".into(),
            sequence_nr: seq,
            timestamp_ms: 0,
        }
    }

    #[tokio::test]
    async fn the_latest_matching_snapshot_is_loaded() {
        let store = MemorySnapshotStore::new();
        for seq in [5, 10, 15] {
            store
                .save(
                    metadata(seq),
                    Manifest::new("t.State", 1),
                    Bytes::from(vec![seq as u8]),
                )
                .await
                .unwrap();
        }
        let latest = store
            .load("a", SnapshotSelectionCriteria::latest())
            .await
            .unwrap();
        assert_eq!(latest.unwrap().metadata.sequence_nr, 15);
        let up_to = store
            .load("a", SnapshotSelectionCriteria::up_to(12))
            .await
            .unwrap();
        assert_eq!(up_to.unwrap().metadata.sequence_nr, 10);
        store
            .delete_matching("a", SnapshotSelectionCriteria::up_to(10))
            .await
            .unwrap();
        assert_eq!(store.sequence_nrs("a"), [15]);
        assert!(
            store
                .load("b", SnapshotSelectionCriteria::latest())
                .await
                .unwrap()
                .is_none()
        );
    }
}
