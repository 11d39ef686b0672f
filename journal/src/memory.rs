//! [`MemoryJournal`]: a [`Journal`] in memory, for tests of entity types and of code that
//! queries a journal, without RocksDB. It keeps the RocksDB journal's rules (a write is
//! checked as that journal checks it, atomic, and must continue its log), and its live queries
//! follow later commits; nothing survives the value.

use crate::error::JournalError;
use crate::journal::{Journal, JournalStream, QueryMode};
use crate::record::{AtomicWrite, EventEnvelope, PersistentRepr};
use crate::rocks::validate_write;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::watch;

/// The largest write a [`MemoryJournal`] takes, as the RocksDB journal's default.
const MAX_WRITE_BYTES: usize = 16 * 1024 * 1024;

#[derive(Default)]
struct Log {
    events: BTreeMap<u64, PersistentRepr>,
    highest: u64,
}

#[derive(Default)]
struct State {
    logs: HashMap<String, Log>,
    /// Persistence ids in the order of their first write.
    ids: Vec<String>,
    /// Every tagged event in commit order: (tags, persistence id, sequence number); the
    /// offset of the n-th is n.
    tagged: Vec<(Vec<String>, String, u64)>,
}

/// An in-memory [`Journal`]. Cheap to clone: clones share the events.
#[derive(Clone)]
pub struct MemoryJournal {
    state: Arc<Mutex<State>>,
    /// Bumped on every commit, so that live queries look again.
    commits: Arc<watch::Sender<u64>>,
}

impl Default for MemoryJournal {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryJournal {
    /// An empty journal.
    pub fn new() -> Self {
        MemoryJournal {
            state: Arc::default(),
            commits: Arc::new(watch::channel(0).0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The events of a log that are stored (not deleted), in order.
    pub fn events(&self, persistence_id: &str) -> Vec<PersistentRepr> {
        self.lock()
            .logs
            .get(persistence_id)
            .map(|log| log.events.values().cloned().collect())
            .unwrap_or_default()
    }

    fn apply(&self, write: AtomicWrite) -> Result<(), JournalError> {
        validate_write(&write, MAX_WRITE_BYTES)?;
        let mut state = self.lock();
        let state = &mut *state;
        let log = state.logs.entry(write.persistence_id.clone()).or_default();
        let first = write.events.first().map_or(0, |e| e.sequence_nr);
        if first != log.highest + 1 {
            return Err(JournalError::SequenceMismatch {
                persistence_id: write.persistence_id,
                expected: log.highest + 1,
                got: first,
            });
        }
        if log.highest == 0 && !state.ids.contains(&write.persistence_id) {
            state.ids.push(write.persistence_id.clone());
        }
        for event in write.events {
            if !event.tags.is_empty() {
                state.tagged.push((
                    event.tags.clone(),
                    write.persistence_id.clone(),
                    event.sequence_nr,
                ));
            }
            log.highest = event.sequence_nr;
            log.events.insert(
                event.sequence_nr,
                PersistentRepr {
                    persistence_id: write.persistence_id.as_str().into(),
                    sequence_nr: event.sequence_nr,
                    writer_id: write.writer_id.as_str().into(),
                    timestamp_ms: event.timestamp_ms,
                    manifest: event.manifest,
                    payload: event.payload,
                },
            );
        }
        Ok(())
    }

    /// The events of a log from `from` to `to`, at most `max`.
    fn log_from(&self, persistence_id: &str, from: u64, to: u64, max: u64) -> Vec<PersistentRepr> {
        let limit = usize::try_from(max).unwrap_or(usize::MAX);
        self.lock()
            .logs
            .get(persistence_id)
            .map(|log| {
                log.events
                    .range(from..=to.max(from))
                    .filter(|(seq, _)| **seq <= to)
                    .take(limit)
                    .map(|(_, e)| e.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Tagged events carrying `tag` with offsets above `after`.
    fn tagged_after(&self, tag: &str, after: u64) -> Vec<EventEnvelope> {
        let state = self.lock();
        let start = usize::try_from(after).unwrap_or(usize::MAX);
        state
            .tagged
            .iter()
            .enumerate()
            .skip(start)
            .filter(|(_, (tags, _, _))| tags.iter().any(|t| t == tag))
            .filter_map(|(index, (tags, pid, seq))| {
                let event = state.logs.get(pid)?.events.get(seq)?.clone();
                Some(EventEnvelope {
                    offset: index as u64 + 1,
                    event,
                    tags: tags.clone(),
                })
            })
            .collect()
    }

    /// A stream of `fetch(position)` batches: one batch in `Current` mode; in `Live` mode a
    /// new batch after every commit, from where the last one ended (`next` gives the position
    /// after an item).
    fn query<T: Send + 'static>(
        &self,
        start: u64,
        mode: QueryMode,
        fetch: impl Fn(&MemoryJournal, u64) -> Vec<T> + Send + Sync + 'static,
        next: impl Fn(&T) -> u64 + Send + Sync + 'static,
    ) -> JournalStream<T> {
        // Subscribed before the first fetch: a commit after it is seen as a change.
        let mut commits = self.commits.subscribe();
        commits.mark_unchanged();
        let first = fetch(self, start);
        if mode == QueryMode::Current {
            return futures::stream::iter(first.into_iter().map(Ok)).boxed();
        }
        let position = first.last().map_or(start, &next);
        let (fetch, next) = (Arc::new(fetch), Arc::new(next));
        let later = futures::stream::unfold(
            (self.clone(), commits, position),
            move |(journal, mut commits, position)| {
                let (fetch, next) = (fetch.clone(), next.clone());
                async move {
                    let mut found = fetch(&journal, position);
                    while found.is_empty() {
                        commits.changed().await.ok()?;
                        found = fetch(&journal, position);
                    }
                    let position = found.last().map_or(position, |item| next(item));
                    Some((
                        futures::stream::iter(found.into_iter().map(Ok)),
                        (journal, commits, position),
                    ))
                }
            },
        )
        .flatten();
        futures::stream::iter(first.into_iter().map(Ok))
            .chain(later)
            .boxed()
    }
}

impl Journal for MemoryJournal {
    fn append(&self, write: AtomicWrite) -> BoxFuture<'static, Result<(), JournalError>> {
        let applied = self.apply(write);
        if applied.is_ok() {
            self.commits.send_modify(|n| *n += 1);
        }
        futures::future::ready(applied).boxed()
    }

    fn replay(
        &self,
        persistence_id: &str,
        from_sequence_nr: u64,
        to_sequence_nr: u64,
        max: u64,
    ) -> JournalStream<PersistentRepr> {
        let events = self.log_from(persistence_id, from_sequence_nr, to_sequence_nr, max);
        futures::stream::iter(events.into_iter().map(Ok)).boxed()
    }

    fn highest_sequence_nr(
        &self,
        persistence_id: &str,
    ) -> BoxFuture<'static, Result<u64, JournalError>> {
        let highest = self
            .lock()
            .logs
            .get(persistence_id)
            .map_or(0, |l| l.highest);
        futures::future::ready(Ok(highest)).boxed()
    }

    fn delete_to(
        &self,
        persistence_id: &str,
        to_sequence_nr: u64,
    ) -> BoxFuture<'static, Result<(), JournalError>> {
        if let Some(log) = self.lock().logs.get_mut(persistence_id) {
            log.events.retain(|seq, _| *seq > to_sequence_nr);
        }
        futures::future::ready(Ok(())).boxed()
    }

    fn events_by_persistence_id(
        &self,
        persistence_id: &str,
        from_sequence_nr: u64,
        mode: QueryMode,
    ) -> JournalStream<PersistentRepr> {
        let pid = persistence_id.to_string();
        self.query(
            from_sequence_nr.max(1),
            mode,
            move |journal, from| journal.log_from(&pid, from, u64::MAX, u64::MAX),
            |event| event.sequence_nr + 1,
        )
    }

    fn events_by_tag(
        &self,
        tag: &str,
        after_offset: u64,
        mode: QueryMode,
    ) -> JournalStream<EventEnvelope> {
        let tag = tag.to_string();
        self.query(
            after_offset,
            mode,
            move |journal, after| journal.tagged_after(&tag, after),
            |envelope| envelope.offset,
        )
    }

    fn persistence_ids(&self, mode: QueryMode) -> JournalStream<String> {
        // Positions are indexes into the order of first writes.
        self.query(
            0,
            mode,
            |journal, from| {
                let state = journal.lock();
                let start = usize::try_from(from).unwrap_or(usize::MAX);
                state
                    .ids
                    .iter()
                    .enumerate()
                    .skip(start)
                    .map(|(index, id)| (index as u64 + 1, id.clone()))
                    .collect::<Vec<_>>()
            },
            |(next, _)| *next,
        )
        .map(|item| item.map(|(_, id)| id))
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::NewEvent;
    use bytes::Bytes;
    use tessera_storage::Manifest;

    fn write(pid: &str, first: u64, count: u64, tag: Option<&str>) -> AtomicWrite {
        AtomicWrite {
            persistence_id: pid.to_string(),
            writer_id: "w".to_string(),
            events: (first..first + count)
                .map(|sequence_nr| NewEvent {
                    sequence_nr,
                    timestamp_ms: 0,
                    manifest: Manifest::new("t.Event", 1),
                    payload: Bytes::from(vec![sequence_nr as u8]),
                    tags: tag.map(|t| vec![t.to_string()]).unwrap_or_default(),
                })
                .collect(),
        }
    }

    #[tokio::test]
    async fn appends_continue_their_log_and_queries_see_them() {
        let journal = MemoryJournal::new();
        journal.append(write("a", 1, 2, Some("x"))).await.unwrap();
        let gap = journal.append(write("a", 4, 1, None)).await.unwrap_err();
        assert!(matches!(
            gap,
            JournalError::SequenceMismatch { expected: 3, .. }
        ));
        journal.append(write("b", 1, 1, Some("x"))).await.unwrap();
        assert_eq!(journal.highest_sequence_nr("a").await.unwrap(), 2);
        let replayed: Vec<u64> = journal
            .replay("a", 1, u64::MAX, u64::MAX)
            .map(|e| e.unwrap().sequence_nr)
            .collect()
            .await;
        assert_eq!(replayed, [1, 2]);
        let tagged: Vec<(u64, String)> = journal
            .events_by_tag("x", 1, QueryMode::Current)
            .map(|e| {
                let e = e.unwrap();
                (e.offset, e.event.persistence_id.to_string())
            })
            .collect()
            .await;
        assert_eq!(tagged, [(2, "a".to_string()), (3, "b".to_string())]);
        let ids: Vec<String> = journal
            .persistence_ids(QueryMode::Current)
            .map(Result::unwrap)
            .collect()
            .await;
        assert_eq!(ids, ["a", "b"]);
        journal.delete_to("a", 1).await.unwrap();
        assert_eq!(journal.events("a").len(), 1);
        assert_eq!(journal.highest_sequence_nr("a").await.unwrap(), 2);
    }

    #[tokio::test]
    async fn live_queries_follow_later_commits() {
        let journal = MemoryJournal::new();
        journal.append(write("a", 1, 1, None)).await.unwrap();
        let mut live = journal.events_by_persistence_id("a", 1, QueryMode::Live);
        assert_eq!(live.next().await.unwrap().unwrap().sequence_nr, 1);
        let appender = journal.clone();
        tokio::spawn(async move {
            appender.append(write("a", 2, 2, None)).await.unwrap();
        });
        assert_eq!(live.next().await.unwrap().unwrap().sequence_nr, 2);
        assert_eq!(live.next().await.unwrap().unwrap().sequence_nr, 3);
    }
}
