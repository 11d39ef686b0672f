//! Remember entities (`remember_entities = ddata | eventsourced`): each shard keeps the ids of
//! the entities it runs, so that wherever the shard lands — after a handoff, a crash of its
//! node, or a restart of the whole cluster — those entities are started again without a
//! message. Entities that passivate are forgotten; entities stopped by a handoff or a node's
//! shutdown are not.
//!
//! - The ids of a shard live in a Distributed Data OR-Set `shard-<type>-<shard>` (`ddata`) or
//!   in the journal log `sharding-shard|<type>|<shard>` (`eventsourced`, written by the
//!   shard's one owner, fenced like every log).
//! - Which shards have remembered entities lives in the grow-only set `shard-<type>-all`, in
//!   both modes, so that a coordinator that starts with no state (a full cluster restart with
//!   its state in Distributed Data) allocates them at once.
//!
//! Every `shard-` key is durable (written to disk before it is acknowledged), so the sets
//! survive a full cluster stop: the node configures `shard-*` as durable keys whenever
//! remember-entities is on.

use crate::shard_id::ShardId;
use crate::store::StoreError;
use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tessera_ddata::consistency::{ReadConsistency, WriteConsistency};
use tessera_ddata::g_set::GSet;
use tessera_ddata::node::ReplicatorHandle;
use tessera_ddata::or_set::ORSet;
use tessera_ddata::replicator::{GetResult, UpdateResult};
use tessera_ddata::value::ReplicatedValue;
use tessera_journal::{AtomicWrite, Journal, JournalError, Manifest, NewEvent};

/// The Distributed Data key prefix of every remember-entities key (configure it durable).
pub const DURABLE_KEY_PATTERN: &str = "shard-*";

/// Where one entity type's remembered entities are kept.
pub trait RememberStore: Send + Sync + 'static {
    /// The ids remembered for `shard`.
    fn entities(&self, shard: ShardId) -> BoxFuture<'static, Result<BTreeSet<String>, StoreError>>;

    /// Adds `started` to and removes `stopped` from `shard`'s ids.
    fn update(
        &self,
        shard: ShardId,
        started: Vec<String>,
        stopped: Vec<String>,
    ) -> BoxFuture<'static, Result<(), StoreError>>;

    /// The shards that have (had) remembered entities.
    fn shards(&self) -> BoxFuture<'static, Result<BTreeSet<ShardId>, StoreError>>;
}

const TIMEOUT: Duration = Duration::from_secs(5);

fn majority() -> (ReadConsistency, WriteConsistency) {
    (
        ReadConsistency::Majority { min_cap: 0 },
        WriteConsistency::Majority { min_cap: 0 },
    )
}

fn unavailable(error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(error.to_string())
}

fn update_result(key: &str, result: UpdateResult) -> Result<(), StoreError> {
    match result {
        UpdateResult::Success => Ok(()),
        UpdateResult::Timeout => Err(StoreError::Unavailable(format!(
            "writing {key}: too few replicas acknowledged"
        ))),
        UpdateResult::Deleted => Err(StoreError::Fatal(format!("key {key} was deleted"))),
        UpdateResult::Invalid(reason) => Err(StoreError::Fatal(format!("key {key}: {reason}"))),
        // The replica is full: retried, it may pass once an operator raised the limit.
        UpdateResult::LimitReached(refused) => {
            Err(StoreError::Unavailable(format!("writing {key}: {refused}")))
        }
        UpdateResult::Failed(reason) => Err(StoreError::Unavailable(reason)),
    }
}

/// The Distributed Data key of the shards of `type_name` that have remembered entities.
pub fn registry_key(type_name: &str) -> String {
    format!("shard-{type_name}-all")
}

/// The Distributed Data key of a shard's remembered entities (`ddata` mode).
pub fn shard_key(type_name: &str, shard: ShardId) -> String {
    format!("shard-{type_name}-{shard}")
}

/// Whether `key` is one of `type_name`'s remember-entities keys (its registry or a shard's
/// set) and not another type's: `shard-a-all` is type `a`'s registry, `shard-a-all-3` is
/// shard 3 of type `a-all`.
pub fn is_remember_key_of(type_name: &str, key: &str) -> bool {
    key == registry_key(type_name)
        || key
            .strip_prefix("shard-")
            .and_then(|rest| rest.strip_prefix(type_name))
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|shard| shard.parse::<u32>().ok())
            .is_some_and(|shard| key == shard_key(type_name, ShardId(shard)))
}

/// The shard of `persistence_id` when it is one of `type_name`'s remember-entities logs
/// (`eventsourced` mode).
pub fn remembered_log_shard(type_name: &str, persistence_id: &str) -> Option<ShardId> {
    let shard = persistence_id
        .strip_prefix(REMEMBERED_LOG_PREFIX)?
        .strip_prefix(type_name)?
        .strip_prefix('|')?
        .parse::<u32>()
        .ok()
        .map(ShardId)?;
    (shard_persistence_id(type_name, shard) == persistence_id).then_some(shard)
}

/// The registry of shards with remembered entities, in Distributed Data (both modes).
#[derive(Clone)]
struct ShardRegistry {
    replicator: ReplicatorHandle,
    key: String,
    /// Shards known to be in the set already: not written again.
    known: Arc<Mutex<BTreeSet<ShardId>>>,
}

impl ShardRegistry {
    fn new(replicator: ReplicatorHandle, type_name: &str) -> Self {
        ShardRegistry {
            replicator,
            key: registry_key(type_name),
            known: Arc::default(),
        }
    }

    async fn add(&self, shard: ShardId) -> Result<(), StoreError> {
        if self
            .known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&shard)
        {
            return Ok(());
        }
        let result = self
            .replicator
            .update(&self.key, majority().1, TIMEOUT, move |current, _| {
                let mut set = match current {
                    Some(ReplicatedValue::GSet(set)) => set,
                    None => GSet::new(),
                    Some(other) => return Err(format!("holds a {:?}, not a GSet", other.kind())),
                };
                set.add(shard.0.to_string());
                Ok(ReplicatedValue::GSet(set))
            })
            .await
            .map_err(unavailable)?;
        update_result(&self.key, result)?;
        self.known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(shard);
        Ok(())
    }

    async fn shards(&self) -> Result<BTreeSet<ShardId>, StoreError> {
        let result = self
            .replicator
            .get(&self.key, majority().0, TIMEOUT)
            .await
            .map_err(unavailable)?;
        match result {
            GetResult::Found(ReplicatedValue::GSet(set)) => {
                let shards: BTreeSet<ShardId> = set
                    .elements()
                    .filter_map(|e| e.parse().ok().map(ShardId))
                    .collect();
                self.known
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(shards.iter().copied());
                Ok(shards)
            }
            GetResult::Found(other) => Err(StoreError::Fatal(format!(
                "key {} holds a {:?}, not a GSet",
                self.key,
                other.kind()
            ))),
            GetResult::NotFound | GetResult::Deleted => Ok(BTreeSet::new()),
            GetResult::Timeout => Err(StoreError::Unavailable(format!(
                "reading {}: too few replicas answered",
                self.key
            ))),
            GetResult::Failed(reason) => Err(StoreError::Unavailable(reason)),
        }
    }
}

/// Remembered entities in Distributed Data OR-Sets.
pub struct DdataRememberStore {
    replicator: ReplicatorHandle,
    type_name: String,
    registry: ShardRegistry,
}

impl DdataRememberStore {
    pub fn new(replicator: ReplicatorHandle, type_name: &str) -> Self {
        DdataRememberStore {
            registry: ShardRegistry::new(replicator.clone(), type_name),
            replicator,
            type_name: type_name.to_string(),
        }
    }

    fn key(&self, shard: ShardId) -> String {
        shard_key(&self.type_name, shard)
    }
}

impl RememberStore for DdataRememberStore {
    fn entities(&self, shard: ShardId) -> BoxFuture<'static, Result<BTreeSet<String>, StoreError>> {
        let replicator = self.replicator.clone();
        let key = self.key(shard);
        Box::pin(async move {
            match replicator
                .get(&key, majority().0, TIMEOUT)
                .await
                .map_err(unavailable)?
            {
                GetResult::Found(ReplicatedValue::ORSet(set)) => {
                    Ok(set.elements().cloned().collect())
                }
                GetResult::Found(other) => Err(StoreError::Fatal(format!(
                    "key {key} holds a {:?}, not an ORSet",
                    other.kind()
                ))),
                GetResult::NotFound | GetResult::Deleted => Ok(BTreeSet::new()),
                GetResult::Timeout => Err(StoreError::Unavailable(format!(
                    "reading {key}: too few replicas answered"
                ))),
                GetResult::Failed(reason) => Err(StoreError::Unavailable(reason)),
            }
        })
    }

    fn update(
        &self,
        shard: ShardId,
        started: Vec<String>,
        stopped: Vec<String>,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let replicator = self.replicator.clone();
        let key = self.key(shard);
        let registry = self.registry.clone();
        Box::pin(async move {
            if !started.is_empty() {
                registry.add(shard).await?;
            }
            let result = replicator
                .update(&key, majority().1, TIMEOUT, move |current, context| {
                    let mut set = match current {
                        Some(ReplicatedValue::ORSet(set)) => set,
                        None => ORSet::new(),
                        Some(other) => {
                            return Err(format!("holds a {:?}, not an ORSet", other.kind()));
                        }
                    };
                    for id in started {
                        set.add(context.self_node, id);
                    }
                    for id in &stopped {
                        set.remove(id);
                    }
                    Ok(ReplicatedValue::ORSet(set))
                })
                .await
                .map_err(unavailable)?;
            update_result(&key, result)
        })
    }

    fn shards(&self) -> BoxFuture<'static, Result<BTreeSet<ShardId>, StoreError>> {
        let registry = self.registry.clone();
        Box::pin(async move { registry.shards().await })
    }
}

/// A change of a shard's remembered ids, as stored in its journal log.
#[derive(Serialize, Deserialize)]
pub(crate) enum RememberEvent {
    Started(Vec<String>),
    Stopped(Vec<String>),
}

const REMEMBER_MANIFEST: &str = "sharding.RememberedEntities";

/// What the persistence id of every shard's remember-entities log starts with.
pub const REMEMBERED_LOG_PREFIX: &str = "sharding-shard|";

/// The persistence id of a shard's remembered entities.
pub fn shard_persistence_id(type_name: &str, shard: ShardId) -> String {
    format!("{REMEMBERED_LOG_PREFIX}{type_name}|{shard}")
}

/// Remembered entities as events in each shard's journal log (written by the shard's owner
/// only; the journal fences a former owner).
pub struct JournalRememberStore {
    journal: Arc<dyn Journal>,
    type_name: String,
    registry: ShardRegistry,
    /// The highest sequence number of each shard's log, as last read or written here.
    highest: Arc<Mutex<HashMap<ShardId, u64>>>,
}

impl JournalRememberStore {
    pub fn new(journal: Arc<dyn Journal>, replicator: ReplicatorHandle, type_name: &str) -> Self {
        JournalRememberStore {
            journal,
            type_name: type_name.to_string(),
            registry: ShardRegistry::new(replicator, type_name),
            highest: Arc::default(),
        }
    }
}

fn journal_error(error: JournalError) -> StoreError {
    match error {
        JournalError::Fenced { .. } => StoreError::Fatal(error.to_string()),
        other => StoreError::Unavailable(other.to_string()),
    }
}

impl RememberStore for JournalRememberStore {
    fn entities(&self, shard: ShardId) -> BoxFuture<'static, Result<BTreeSet<String>, StoreError>> {
        let journal = self.journal.clone();
        let pid = shard_persistence_id(&self.type_name, shard);
        let highest_seen = self.highest.clone();
        Box::pin(async move {
            // The first use of the log by this node fences its former owner.
            let highest = journal
                .highest_sequence_nr(&pid)
                .await
                .map_err(journal_error)?;
            let mut ids = BTreeSet::new();
            let mut events = journal.replay(&pid, 1, highest, u64::MAX);
            while let Some(event) = events.next().await {
                let event = event.map_err(journal_error)?;
                match postcard::from_bytes::<RememberEvent>(&event.payload) {
                    Ok(RememberEvent::Started(started)) => ids.extend(started),
                    Ok(RememberEvent::Stopped(stopped)) => {
                        for id in stopped {
                            ids.remove(&id);
                        }
                    }
                    Err(e) => {
                        return Err(StoreError::Fatal(format!(
                            "event {pid}#{}: {e}",
                            event.sequence_nr
                        )));
                    }
                }
            }
            highest_seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(shard, highest);
            Ok(ids)
        })
    }

    fn update(
        &self,
        shard: ShardId,
        started: Vec<String>,
        stopped: Vec<String>,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let journal = self.journal.clone();
        let pid = shard_persistence_id(&self.type_name, shard);
        let highest = self.highest.clone();
        let registry = self.registry.clone();
        Box::pin(async move {
            if !started.is_empty() {
                registry.add(shard).await?;
            }
            let known = highest
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&shard)
                .copied();
            let mut next = match known {
                Some(n) => n + 1,
                None => {
                    journal
                        .highest_sequence_nr(&pid)
                        .await
                        .map_err(journal_error)?
                        + 1
                }
            };
            let now_ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            let mut events = Vec::new();
            for change in [
                (!started.is_empty()).then_some(RememberEvent::Started(started)),
                (!stopped.is_empty()).then_some(RememberEvent::Stopped(stopped)),
            ]
            .into_iter()
            .flatten()
            {
                let payload =
                    postcard::to_allocvec(&change).map_err(|e| StoreError::Fatal(e.to_string()))?;
                events.push(NewEvent {
                    sequence_nr: next,
                    timestamp_ms: now_ms,
                    manifest: Manifest::new(REMEMBER_MANIFEST, 1),
                    payload: Bytes::from(payload),
                    tags: Vec::new(),
                });
                next += 1;
            }
            if events.is_empty() {
                return Ok(());
            }
            let write = AtomicWrite {
                persistence_id: pid.clone(),
                writer_id: "sharding-shard".to_string(),
                events,
            };
            let result = journal.append(write).await;
            // Whatever happened, read the log's position again before the next write.
            highest
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&shard);
            result.map_err(journal_error)?;
            highest
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(shard, next - 1);
            Ok(())
        })
    }

    fn shards(&self) -> BoxFuture<'static, Result<BTreeSet<ShardId>, StoreError>> {
        let registry = self.registry.clone();
        Box::pin(async move { registry.shards().await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remember_keys_and_logs_are_matched_to_their_own_type_only() {
        assert!(is_remember_key_of("a", "shard-a-all"));
        assert!(is_remember_key_of("a", "shard-a-17"));
        assert!(
            !is_remember_key_of("a", "shard-a-all-3"),
            "type a-all's shard 3"
        );
        assert!(is_remember_key_of("a-all", "shard-a-all-3"));
        assert!(!is_remember_key_of("a", "shard-a-v2-17"), "type a-v2's");
        assert!(
            !is_remember_key_of("a", "shard-a-017"),
            "not a key this release writes"
        );
        assert!(!is_remember_key_of("a", "shard-ab-1"));
        assert!(!is_remember_key_of("a", "counter"));
        assert_eq!(
            remembered_log_shard("a", "sharding-shard|a|17"),
            Some(ShardId(17))
        );
        assert_eq!(remembered_log_shard("a", "sharding-shard|a|b|17"), None);
        assert_eq!(remembered_log_shard("a", "sharding-shard|ab|17"), None);
        assert_eq!(remembered_log_shard("a", "sharding-shard|a|x"), None);
        assert_eq!(remembered_log_shard("a", "sharding-coordinator|a"), None);
    }
}
