//! [`ReplicatedSnapshotStore`]: snapshots saved on the replicas of their log, through the
//! log's fenced writer (docs/src/design.md §5 "Snapshots").
//!
//! A save goes to every member of the log's configuration under the writer's epoch and counts
//! once W of them stored it: only then may the entity delete the events it covers. A replica
//! refuses a save or delete of an epoch below its promise (a fenced writer). A load asks every
//! member and takes the latest snapshot any of them holds: each is a fold of acknowledged
//! events, whichever replica holds it.

use crate::caller::ReplicaCaller;
use crate::wire::{Criteria, ReplicaCall, ReplicaReply, ReplicaRequest, SnapshotData};
use crate::writers::{Command, ServingLog, Writers};
use bytes::Bytes;
use futures::FutureExt;
use futures::future::{BoxFuture, join_all};
use smol_str::SmolStr;
use std::sync::Arc;
use tessera_journal::Manifest;
use tessera_replication::Quorums;
use tessera_snapshot::{
    Snapshot, SnapshotError, SnapshotMetadata, SnapshotSelectionCriteria, SnapshotStore,
};

/// The replicated snapshot store. Cheap to share behind an `Arc`.
pub struct ReplicatedSnapshotStore {
    writers: Writers,
    caller: Arc<dyn ReplicaCaller>,
    quorums: Quorums,
}

fn unavailable(persistence_id: &str, reason: impl Into<String>) -> SnapshotError {
    SnapshotError::Unavailable {
        persistence_id: persistence_id.to_string(),
        reason: reason.into(),
    }
}

impl ReplicatedSnapshotStore {
    pub(crate) fn new(writers: Writers, caller: Arc<dyn ReplicaCaller>, quorums: Quorums) -> Self {
        ReplicatedSnapshotStore {
            writers,
            caller,
            quorums,
        }
    }

    /// This node's serving writer of the log: snapshots are written only through it.
    async fn serving(writers: &Writers, persistence_id: &str) -> Result<ServingLog, SnapshotError> {
        writers.serving(persistence_id).await.ok_or_else(|| {
            unavailable(
                persistence_id,
                "this node does not write the log (any more); snapshots go through its writer",
            )
        })
    }

    /// Sends a snapshot write to every member and waits for W of each part to take it.
    fn write_everywhere(
        &self,
        persistence_id: &str,
        make: impl Fn(tessera_replication::Epoch) -> ReplicaRequest + Send + 'static,
    ) -> BoxFuture<'static, Result<(), SnapshotError>> {
        let writers = self.writers.clone();
        let caller = self.caller.clone();
        let quorums = self.quorums;
        let persistence_id = persistence_id.to_string();
        async move {
            let log = Self::serving(&writers, &persistence_id).await?;
            let members = log.config.all_members();
            let calls = members.iter().map(|member| {
                caller.call_any(
                    &member.address,
                    ReplicaCall {
                        log: SmolStr::new(&persistence_id),
                        storage_id: Some(member.storage_id),
                        request: make(log.epoch),
                    },
                )
            });
            let replies = join_all(calls).await;
            let mut took = Vec::new();
            for (member, reply) in members.iter().zip(replies) {
                match reply {
                    Ok(ReplicaReply::Done) => took.push(member),
                    Ok(ReplicaReply::Fenced { promise }) => {
                        return Err(unavailable(
                            &persistence_id,
                            format!("the log was taken over by a later writer (epoch {promise})"),
                        ));
                    }
                    _ => {}
                }
            }
            if log
                .config
                .has_quorum(took.iter().copied(), |n| quorums.acks(n))
            {
                Ok(())
            } else {
                Err(unavailable(
                    &persistence_id,
                    format!(
                        "only {} of the replicas of {} took it",
                        took.len(),
                        log.config
                    ),
                ))
            }
        }
        .boxed()
    }
}

impl SnapshotStore for ReplicatedSnapshotStore {
    fn save(
        &self,
        metadata: SnapshotMetadata,
        manifest: Manifest,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<(), SnapshotError>> {
        let snapshot = SnapshotData {
            sequence_nr: metadata.sequence_nr,
            timestamp_ms: metadata.timestamp_ms,
            manifest: manifest.type_name.to_string(),
            manifest_version: manifest.version,
            payload,
        };
        self.write_everywhere(&metadata.persistence_id, move |epoch| {
            ReplicaRequest::SaveSnapshot {
                epoch,
                snapshot: snapshot.clone(),
            }
        })
    }

    fn load(
        &self,
        persistence_id: &str,
        criteria: SnapshotSelectionCriteria,
    ) -> BoxFuture<'static, Result<Option<Snapshot>, SnapshotError>> {
        let writers = self.writers.clone();
        let caller = self.caller.clone();
        let persistence_id = persistence_id.to_string();
        async move {
            // Loading comes first in an entity's recovery: it recovers the log.
            writers
                .ask(|reply| Command::Ready {
                    persistence_id: persistence_id.clone(),
                    reply,
                })
                .await
                .map_err(|e| unavailable(&persistence_id, e.to_string()))?;
            let log = Self::serving(&writers, &persistence_id).await?;
            let criteria = SnapshotSelectionCriteria {
                max_sequence_nr: criteria.max_sequence_nr.min(log.highest),
                ..criteria
            };
            let calls = log.config.all_members().into_iter().map(|member| {
                caller.call_any(
                    &member.address,
                    ReplicaCall {
                        log: SmolStr::new(&persistence_id),
                        storage_id: Some(member.storage_id),
                        request: ReplicaRequest::LoadSnapshot {
                            criteria: Criteria::from_selection(&criteria),
                        },
                    },
                )
            });
            let best = join_all(calls)
                .await
                .into_iter()
                .filter_map(|reply| match reply {
                    Ok(ReplicaReply::Snapshot(found)) => found,
                    _ => None,
                })
                .max_by_key(|s| s.sequence_nr);
            // Events up to `deleted_to` are gone: a recovery needs a snapshot at or above.
            if log.deleted_to > 0 && best.as_ref().is_none_or(|s| s.sequence_nr < log.deleted_to) {
                return Err(unavailable(
                    &persistence_id,
                    format!(
                        "events up to {} are deleted and no replica answered with a snapshot \
                         covering them",
                        log.deleted_to
                    ),
                ));
            }
            Ok(best.map(|s| Snapshot {
                metadata: SnapshotMetadata {
                    persistence_id: persistence_id.clone(),
                    sequence_nr: s.sequence_nr,
                    timestamp_ms: s.timestamp_ms,
                },
                manifest: Manifest::new(s.manifest.as_str(), s.manifest_version),
                payload: s.payload,
            }))
        }
        .boxed()
    }

    fn delete(
        &self,
        persistence_id: &str,
        sequence_nr: u64,
    ) -> BoxFuture<'static, Result<(), SnapshotError>> {
        let criteria = SnapshotSelectionCriteria {
            min_sequence_nr: sequence_nr,
            max_sequence_nr: sequence_nr,
            ..SnapshotSelectionCriteria::latest()
        };
        self.delete_matching(persistence_id, criteria)
    }

    fn delete_matching(
        &self,
        persistence_id: &str,
        criteria: SnapshotSelectionCriteria,
    ) -> BoxFuture<'static, Result<(), SnapshotError>> {
        let criteria = Criteria::from_selection(&criteria);
        self.write_everywhere(persistence_id, move |epoch| {
            ReplicaRequest::DeleteSnapshots { epoch, criteria }
        })
    }
}
