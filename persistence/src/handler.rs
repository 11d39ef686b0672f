//! What a node's replica does with a call: log requests go to its replica store, snapshot
//! requests to its snapshot store after a check of the log's promise. The replica service
//! runs calls from other nodes through it, and this node's own writers call it directly.

use crate::commit_feed::{self, CommitFeed, FeedRead};
use crate::store::ReplicaStore;
use crate::wire::{Criteria, ReplicaCall, ReplicaReply, ReplicaRequest, SnapshotData};
use futures::future::BoxFuture;
use std::sync::Arc;
use tessera_journal::Manifest;
use tessera_replication::{Epoch, Request, Response};
use tessera_snapshot::{SnapshotMetadata, SnapshotSelectionCriteria, SnapshotStore};

pub(crate) struct ReplicaHandler {
    pub store: Arc<dyn ReplicaStore>,
    pub snapshots: Arc<dyn SnapshotStore>,
    /// The marks the store learned, for the queries by slice.
    pub feed: Arc<CommitFeed>,
}

/// Logs a slice scan reads at most per call (one replica request: it must answer well
/// within a request's timeout).
const MAX_SLICE_SCAN: u32 = 4_096;

impl Criteria {
    pub fn from_selection(criteria: &SnapshotSelectionCriteria) -> Self {
        Criteria {
            min_sequence_nr: criteria.min_sequence_nr,
            max_sequence_nr: criteria.max_sequence_nr,
            min_timestamp_ms: criteria.min_timestamp_ms,
            max_timestamp_ms: criteria.max_timestamp_ms,
        }
    }

    pub fn to_selection(self) -> SnapshotSelectionCriteria {
        SnapshotSelectionCriteria {
            min_sequence_nr: self.min_sequence_nr,
            max_sequence_nr: self.max_sequence_nr,
            min_timestamp_ms: self.min_timestamp_ms,
            max_timestamp_ms: self.max_timestamp_ms,
        }
    }
}

fn failed(reason: impl ToString) -> ReplicaReply {
    ReplicaReply::Failed {
        reason: reason.to_string(),
    }
}

impl ReplicaHandler {
    /// Handles a call, first checking that it is meant for this node's store: a call that
    /// names another is answered `WrongStorage` and touches nothing.
    pub fn handle_checked(&self, call: ReplicaCall) -> BoxFuture<'static, ReplicaReply> {
        let storage_id = self.store.storage_id();
        if call
            .storage_id
            .is_some_and(|expected| expected != storage_id)
        {
            return Box::pin(futures::future::ready(ReplicaReply::WrongStorage {
                storage_id,
            }));
        }
        self.handle(call)
    }

    /// Handles calls in order (each checked as by [`Self::handle_checked`]), answering in
    /// their order: the log requests among them reach the store as one batch.
    pub fn handle_batch(&self, calls: Vec<ReplicaCall>) -> BoxFuture<'static, Vec<ReplicaReply>> {
        let storage_id = self.store.storage_id();
        let mut answers: Vec<Option<BoxFuture<'static, ReplicaReply>>> =
            Vec::with_capacity(calls.len());
        let mut log_requests = Vec::new();
        for call in calls {
            if call
                .storage_id
                .is_some_and(|expected| expected != storage_id)
            {
                answers.push(Some(Box::pin(futures::future::ready(
                    ReplicaReply::WrongStorage { storage_id },
                ))));
                continue;
            }
            match call.request {
                ReplicaRequest::Log(request) => {
                    log_requests.push((call.log.to_string(), request));
                    answers.push(None);
                }
                request => answers.push(Some(self.handle(ReplicaCall { request, ..call }))),
            }
        }
        let logs: Vec<String> = log_requests.iter().map(|(log, _)| log.clone()).collect();
        let applied = self.store.apply_many(log_requests);
        let feed = self.feed.clone();
        Box::pin(async move {
            let applied = applied.await;
            for (log, answer) in logs.iter().zip(&applied) {
                if let Ok(response) = answer {
                    feed.observe(log, response);
                }
            }
            let mut applied = applied.into_iter();
            let mut replies = Vec::with_capacity(answers.len());
            for answer in answers {
                replies.push(match answer {
                    Some(other) => other.await,
                    None => match applied.next() {
                        Some(Ok(response)) => ReplicaReply::Answer(response),
                        Some(Err(e)) => failed(e),
                        None => failed("the store did not answer every request"),
                    },
                });
            }
            replies
        })
    }

    /// Handles a call (whose storage id was checked). A log request is taken in by the store
    /// before this returns.
    pub fn handle(&self, call: ReplicaCall) -> BoxFuture<'static, ReplicaReply> {
        match call.request {
            ReplicaRequest::Log(request) => {
                let applied = self.store.apply(&call.log, request);
                let feed = self.feed.clone();
                Box::pin(async move {
                    match applied.await {
                        Ok(response) => {
                            feed.observe(&call.log, &response);
                            ReplicaReply::Answer(response)
                        }
                        Err(e) => failed(e),
                    }
                })
            }
            ReplicaRequest::SliceChanges {
                entity_type,
                slices,
                cursor,
                max_logs,
            } => {
                let read = self
                    .feed
                    .read(cursor, &entity_type, slices, max_logs.max(1) as usize);
                let reply = match read {
                    FeedRead::Changes { cursor, logs } => ReplicaReply::SliceChanges {
                        cursor,
                        logs,
                        rescan: false,
                    },
                    FeedRead::Rescan { cursor } => ReplicaReply::SliceChanges {
                        cursor,
                        logs: Vec::new(),
                        rescan: true,
                    },
                };
                Box::pin(futures::future::ready(reply))
            }
            ReplicaRequest::SliceScan {
                entity_type,
                slices,
                after,
                max_scanned,
            } => {
                let store = self.store.clone();
                let max_scanned = max_scanned.clamp(1, MAX_SLICE_SCAN) as usize;
                Box::pin(async move {
                    match commit_feed::scan(
                        store.as_ref(),
                        &entity_type,
                        slices,
                        after,
                        max_scanned,
                    )
                    .await
                    {
                        Ok((logs, next)) => ReplicaReply::SliceScan { logs, next },
                        Err(e) => failed(e),
                    }
                })
            }
            ReplicaRequest::SaveSnapshot { epoch, snapshot } => {
                let fence = self.fence(&call.log, epoch);
                let snapshots = self.snapshots.clone();
                let log = call.log.to_string();
                Box::pin(async move {
                    if let Err(reply) = fence.await {
                        return reply;
                    }
                    let metadata = SnapshotMetadata {
                        persistence_id: log,
                        sequence_nr: snapshot.sequence_nr,
                        timestamp_ms: snapshot.timestamp_ms,
                    };
                    let manifest =
                        Manifest::new(snapshot.manifest.as_str(), snapshot.manifest_version);
                    match snapshots.save(metadata, manifest, snapshot.payload).await {
                        Ok(()) => ReplicaReply::Done,
                        Err(e) => failed(e),
                    }
                })
            }
            ReplicaRequest::LoadSnapshot { criteria } => {
                let loaded = self.snapshots.load(&call.log, criteria.to_selection());
                Box::pin(async move {
                    match loaded.await {
                        Ok(found) => ReplicaReply::Snapshot(found.map(|s| SnapshotData {
                            sequence_nr: s.metadata.sequence_nr,
                            timestamp_ms: s.metadata.timestamp_ms,
                            manifest: s.manifest.type_name.to_string(),
                            manifest_version: s.manifest.version,
                            payload: s.payload,
                        })),
                        Err(e) => failed(e),
                    }
                })
            }
            ReplicaRequest::NamesStore { storage_id, after } => {
                let store = self.store.clone();
                Box::pin(async move {
                    match crate::store::logs_naming(store.as_ref(), storage_id, after).await {
                        Ok((logs, next)) => ReplicaReply::NamedBy { logs, next },
                        Err(e) => failed(e),
                    }
                })
            }
            ReplicaRequest::DeleteSnapshots { epoch, criteria } => {
                let fence = self.fence(&call.log, epoch);
                let snapshots = self.snapshots.clone();
                let log = call.log.to_string();
                Box::pin(async move {
                    if let Err(reply) = fence.await {
                        return reply;
                    }
                    match snapshots
                        .delete_matching(&log, criteria.to_selection())
                        .await
                    {
                        Ok(()) => ReplicaReply::Done,
                        Err(e) => failed(e),
                    }
                })
            }
        }
    }

    /// Refuses a snapshot write of an epoch below the log's promise (a fenced writer).
    fn fence(&self, log: &str, epoch: Epoch) -> BoxFuture<'static, Result<(), ReplicaReply>> {
        let located = self.store.apply(log, Request::Locate);
        Box::pin(async move {
            match located.await {
                Ok(Response::Located { summary, .. }) => {
                    let promise = summary.map_or(Epoch::ZERO, |s| s.promise);
                    if epoch < promise {
                        Err(ReplicaReply::Fenced { promise })
                    } else {
                        Ok(())
                    }
                }
                Ok(other) => Err(failed(format!("unexpected answer {}", other.kind()))),
                Err(e) => Err(failed(e)),
            }
        })
    }
}
