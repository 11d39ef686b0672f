//! A node's replica store: where its replicas of logs live. [`RocksReplicaStore`] is the
//! node's RocksDB journal; [`MemoryReplicaStore`] keeps them in memory (tests).

use futures::StreamExt;
use futures::future::BoxFuture;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use tessera_journal::StoredEvent;
use tessera_journal::{Journal, JournalError, JournalStream, PersistentRepr, RocksJournal};
use tessera_replication::memory::{MemoryLog, ReadLimits};
use tessera_replication::replica::{Leases, Rules};
use tessera_replication::{ConfigAt, Request, Response};

/// A store failed; nothing is known of the request's effect.
#[derive(Debug, Clone, thiserror::Error)]
#[error("replica store: {0}")]
pub struct StoreError(pub String);

/// A node's replica store.
///
/// `apply` takes the request in when it is called (so calls for one log are applied in the
/// order they were made) and resolves once its effect is durable.
pub trait ReplicaStore: Send + Sync + 'static {
    /// The id this store was given when it was created; a new store has a new one.
    fn storage_id(&self) -> u64;

    /// Applies one request to one log.
    fn apply(
        &self,
        log: &str,
        request: Request<StoredEvent>,
    ) -> BoxFuture<'static, Result<Response<StoredEvent>, StoreError>>;

    /// Applies requests to several logs, as `apply` would one after another, answering in
    /// their order.
    fn apply_many(
        &self,
        requests: Vec<(String, Request<StoredEvent>)>,
    ) -> BoxFuture<'static, Vec<Result<Response<StoredEvent>, StoreError>>> {
        let applied: Vec<_> = requests
            .into_iter()
            .map(|(log, request)| self.apply(&log, request))
            .collect();
        Box::pin(futures::future::join_all(applied))
    }

    /// The log's entries `from..=to` as journal events, at most `max`: a writer reads its own
    /// node's replica this way when that replica holds the log.
    fn replay(&self, log: &str, from: u64, to: u64, max: u64) -> JournalStream<PersistentRepr>;

    /// Logs held here with their configuration, in log order after `after`, at most `limit`
    /// (for moving logs off members that left).
    fn logs(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<(String, ConfigAt)>, StoreError>>;
}

/// The node's RocksDB journal as its replica store: entries are event records (with their
/// epochs), so queries by tag and by persistence id cover the replicas this node holds.
pub struct RocksReplicaStore {
    journal: Arc<RocksJournal>,
}

impl RocksReplicaStore {
    pub fn new(journal: Arc<RocksJournal>) -> Arc<Self> {
        Arc::new(RocksReplicaStore { journal })
    }
}

impl ReplicaStore for RocksReplicaStore {
    fn storage_id(&self) -> u64 {
        self.journal.storage_id()
    }

    fn apply(
        &self,
        log: &str,
        request: Request<StoredEvent>,
    ) -> BoxFuture<'static, Result<Response<StoredEvent>, StoreError>> {
        let applied = self.journal.replica_apply(log, request);
        Box::pin(async move { applied.await.map_err(|e| StoreError(e.to_string())) })
    }

    fn apply_many(
        &self,
        requests: Vec<(String, Request<StoredEvent>)>,
    ) -> BoxFuture<'static, Vec<Result<Response<StoredEvent>, StoreError>>> {
        let applied = self.journal.replica_apply_many(requests);
        Box::pin(async move {
            applied
                .await
                .into_iter()
                .map(|result| result.map_err(|e| StoreError(e.to_string())))
                .collect()
        })
    }

    fn replay(&self, log: &str, from: u64, to: u64, max: u64) -> JournalStream<PersistentRepr> {
        self.journal.replay(log, from, to, max)
    }

    fn logs(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<(String, ConfigAt)>, StoreError>> {
        let logs = self.journal.replica_logs(after, limit);
        Box::pin(async move { logs.await.map_err(|e| StoreError(e.to_string())) })
    }
}

/// Logs read per page when looking for those that name a store.
const NAMING_SCAN_PAGE: usize = 512;
/// Logs read at most per [`logs_naming`] call (one replica request: it must answer well
/// within a request's timeout).
pub const NAMING_SCAN_LOGS: usize = 8_192;
/// Logs naming the store returned at most per call.
const NAMING_MAX_FOUND: usize = 64;

/// Logs `store` holds, after `after`, whose configuration (either part of a joint one)
/// names the store `storage_id`: at most [`NAMING_SCAN_LOGS`] are read, and where to go on
/// is returned when there are more.
pub(crate) async fn logs_naming(
    store: &dyn ReplicaStore,
    storage_id: u64,
    mut after: Option<String>,
) -> Result<(Vec<String>, Option<String>), StoreError> {
    let mut found = Vec::new();
    let mut read = 0;
    loop {
        let page = store.logs(after, NAMING_SCAN_PAGE).await?;
        read += page.len();
        found.extend(
            page.iter()
                .filter(|(_, config)| {
                    config
                        .config
                        .all_members()
                        .iter()
                        .any(|m| m.storage_id == storage_id)
                })
                .map(|(log, _)| log.clone()),
        );
        let last = page.last().map(|(log, _)| log.clone());
        if page.len() < NAMING_SCAN_PAGE {
            return Ok((found, None));
        }
        if read >= NAMING_SCAN_LOGS || found.len() >= NAMING_MAX_FOUND {
            return Ok((found, last));
        }
        after = last;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Replicas in memory, for tests: applying the same rules as the RocksDB store.
pub struct MemoryReplicaStore {
    storage_id: u64,
    rules: Rules,
    limits: ReadLimits,
    /// The logs and the read leases granted on them, decided under one lock.
    logs: Mutex<(BTreeMap<String, MemoryLog<StoredEvent>>, Leases)>,
}

impl MemoryReplicaStore {
    /// A store that starts empty (it waits for no leases of an earlier run).
    pub fn new(storage_id: u64) -> Arc<Self> {
        Arc::new(MemoryReplicaStore {
            storage_id,
            rules: Rules::default(),
            limits: ReadLimits {
                max_tail_entries: 1_000,
                max_bytes: 1024 * 1024,
            },
            logs: Mutex::new((
                BTreeMap::new(),
                Leases::new(std::time::Instant::now(), std::time::Duration::ZERO),
            )),
        })
    }

    /// What this store keeps of a log besides its entries (for tests).
    pub fn meta(&self, log: &str) -> Option<tessera_replication::replica::LogMeta> {
        lock(&self.logs).0.get(log).and_then(|l| l.meta.clone())
    }

    /// The entries a log holds here, as `(seq, payload)` (for tests).
    pub fn entries(&self, log: &str) -> Vec<(u64, StoredEvent)> {
        lock(&self.logs)
            .0
            .get(log)
            .map(|l| {
                l.entries
                    .values()
                    .map(|e| (e.seq, e.payload.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl ReplicaStore for MemoryReplicaStore {
    fn storage_id(&self) -> u64 {
        self.storage_id
    }

    fn apply(
        &self,
        log: &str,
        request: Request<StoredEvent>,
    ) -> BoxFuture<'static, Result<Response<StoredEvent>, StoreError>> {
        let mut guard = lock(&self.logs);
        let (logs, leases) = &mut *guard;
        let response = if matches!(request, Request::Locate | Request::Read { .. })
            && !logs.contains_key(log)
        {
            MemoryLog::default().handle(&self.rules, request, self.limits)
        } else {
            logs.entry(log.to_string()).or_default().handle_leased(
                &self.rules,
                request,
                self.limits,
                leases,
                log,
                std::time::Instant::now(),
            )
        };
        let response = match response {
            Response::Located { summary, .. } => Response::Located {
                storage_id: self.storage_id,
                summary,
            },
            other => other,
        };
        Box::pin(futures::future::ready(Ok(response)))
    }

    fn replay(&self, log: &str, from: u64, to: u64, max: u64) -> JournalStream<PersistentRepr> {
        let events: Vec<Result<PersistentRepr, JournalError>> = lock(&self.logs)
            .0
            .get(log)
            .map(|l| {
                l.entries
                    .range(from..=to)
                    .take(usize::try_from(max).unwrap_or(usize::MAX))
                    .map(|(seq, e)| Ok(e.payload.to_repr(log, *seq)))
                    .collect()
            })
            .unwrap_or_default();
        futures::stream::iter(events).boxed()
    }

    fn logs(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<(String, ConfigAt)>, StoreError>> {
        let guard = lock(&self.logs);
        let logs = &guard.0;
        let range = match &after {
            Some(after) => logs
                .range::<String, _>((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded)),
            None => logs.range::<String, _>(..),
        };
        let found: Vec<(String, ConfigAt)> = range
            .filter_map(|(id, l)| {
                l.meta
                    .as_ref()
                    .and_then(|m| m.config.as_deref().cloned())
                    .map(|c| (id.clone(), c))
            })
            .take(limit)
            .collect();
        Box::pin(futures::future::ready(Ok(found)))
    }
}
