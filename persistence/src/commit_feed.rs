//! The feed of acknowledged marks a node's replica learned: which logs moved, so that a query
//! by slice asks this node only about those rather than scanning all its logs each time
//! (docs/src/design.md §5 "Reading the acknowledged logs").
//!
//! It is a bounded ring in memory, numbered by a counter that starts again, under a new
//! incarnation, whenever the node starts. A reader keeps a cursor (incarnation, counter);
//! when the ring no longer holds what follows its cursor (it fell behind, or the node
//! restarted) it is told so, gets a new cursor, and scans this node's logs in its slices
//! once. A change is entered after the store made it durable, so a scan that starts after the
//! cursor was taken sees every change the ring held before the cursor: nothing falls between
//! the two.

use crate::store::ReplicaStore;
use serde::{Deserialize, Serialize};
use smol_str::SmolStr;
use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use tessera_journal::slice::{SliceRange, entity_type_of, slice_of};
use tessera_replication::Response;

/// Changes the ring holds at most.
pub const FEED_CAPACITY: usize = 65_536;

/// Where a reader of the feed is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedCursor {
    pub incarnation: u64,
    /// The number of the last change read.
    pub counter: u64,
}

/// What a replica holds of a log: its acknowledged mark, last entry and deleted prefix.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogReach {
    pub log: String,
    pub committed: u64,
    pub last: u64,
    pub base: u64,
}

struct Change {
    counter: u64,
    log: SmolStr,
    slice: u16,
    committed: u64,
    last: u64,
    base: u64,
}

struct Ring {
    changes: VecDeque<Change>,
    /// The number the next change gets.
    next: u64,
}

/// See the module.
pub struct CommitFeed {
    incarnation: u64,
    capacity: usize,
    ring: Mutex<Ring>,
}

/// The changes after a cursor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FeedRead {
    /// Every change after the cursor in the slices asked about (at most the number asked
    /// for; `cursor` is where to go on from).
    Changes {
        cursor: FeedCursor,
        logs: Vec<LogReach>,
    },
    /// The ring no longer holds what follows the cursor (or the cursor is of another
    /// incarnation, or none was given): scan the store, then read on from `cursor`.
    Rescan { cursor: FeedCursor },
}

impl CommitFeed {
    pub fn new(capacity: usize) -> Self {
        CommitFeed {
            incarnation: rand::random(),
            capacity: capacity.max(1),
            ring: Mutex::new(Ring {
                changes: VecDeque::new(),
                next: 1,
            }),
        }
    }

    /// Enters the log's summary from a replica's answer that changed or confirmed it.
    pub fn observe(&self, log: &str, response: &Response<tessera_journal::StoredEvent>) {
        let summary = match response {
            Response::Appended { summary }
            | Response::Confirmed { summary, .. }
            | Response::Sealed { summary }
            | Response::Installed { summary }
            | Response::Deleted { summary } => summary,
            _ => return,
        };
        let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        let counter = ring.next;
        ring.next += 1;
        if ring.changes.len() >= self.capacity {
            ring.changes.pop_front();
        }
        ring.changes.push_back(Change {
            counter,
            log: SmolStr::new(log),
            slice: slice_of(log),
            committed: summary.committed(),
            last: summary.last.seq,
            base: summary.base.seq,
        });
    }

    /// The changes after `cursor` to logs of `entity_type` in `slices`, at most `max` (the
    /// latest summary of each log once).
    pub fn read(
        &self,
        cursor: Option<FeedCursor>,
        entity_type: &str,
        slices: SliceRange,
        max: usize,
    ) -> FeedRead {
        let ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        let now = FeedCursor {
            incarnation: self.incarnation,
            counter: ring.next - 1,
        };
        let Some(cursor) = cursor.filter(|c| c.incarnation == self.incarnation) else {
            return FeedRead::Rescan { cursor: now };
        };
        let oldest = ring.changes.front().map_or(ring.next, |c| c.counter);
        if cursor.counter + 1 < oldest || cursor.counter > now.counter {
            return FeedRead::Rescan { cursor: now };
        }
        let skip = (cursor.counter + 1 - oldest) as usize;
        let mut logs: Vec<LogReach> = Vec::new();
        let mut last_counter = cursor.counter;
        for change in ring.changes.iter().skip(skip) {
            last_counter = change.counter;
            if !slices.contains(change.slice) || entity_type_of(&change.log) != entity_type {
                continue;
            }
            match logs.iter_mut().find(|l| l.log == change.log.as_str()) {
                Some(known) => {
                    known.committed = known.committed.max(change.committed);
                    known.last = change.last;
                    known.base = known.base.max(change.base);
                }
                None => {
                    if logs.len() >= max {
                        // Stop before it: the next read starts with it.
                        last_counter = change.counter - 1;
                        break;
                    }
                    logs.push(LogReach {
                        log: change.log.to_string(),
                        committed: change.committed,
                        last: change.last,
                        base: change.base,
                    });
                }
            }
        }
        FeedRead::Changes {
            cursor: FeedCursor {
                incarnation: self.incarnation,
                counter: last_counter,
            },
            logs,
        }
    }
}

/// Logs of the store past `after`, of `entity_type` in `slices`, with what it holds of each:
/// reads at most `max_scanned` logs, returns where to go on (`None`: the scan is done).
pub(crate) async fn scan(
    store: &dyn ReplicaStore,
    entity_type: &str,
    slices: SliceRange,
    after: Option<String>,
    max_scanned: usize,
) -> Result<(Vec<LogReach>, Option<String>), crate::StoreError> {
    let page = store.logs(after, max_scanned).await?;
    let next = if page.len() < max_scanned {
        None
    } else {
        page.last().map(|(log, _)| log.clone())
    };
    let wanted: Vec<String> = page
        .into_iter()
        .map(|(log, _)| log)
        .filter(|log| entity_type_of(log) == entity_type && slices.holds(log))
        .collect();
    let located = store
        .apply_many(
            wanted
                .iter()
                .map(|log| (log.clone(), tessera_replication::Request::Locate))
                .collect(),
        )
        .await;
    let logs = wanted
        .into_iter()
        .zip(located)
        .filter_map(|(log, answer)| match answer {
            Ok(Response::Located {
                summary: Some(summary),
                ..
            }) => Some(LogReach {
                log,
                committed: summary.committed(),
                last: summary.last.seq,
                base: summary.base.seq,
            }),
            _ => None,
        })
        .collect();
    Ok((logs, next))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_replication::{Epoch, LogSummary, Position};

    fn appended(committed: u64, last: u64) -> Response<tessera_journal::StoredEvent> {
        Response::Appended {
            summary: LogSummary {
                promise: Epoch::ZERO,
                last: Position::new(last, Epoch::ZERO),
                lac: committed,
                base: Position::new(0, Epoch::ZERO),
                config: None,
            },
        }
    }

    #[test]
    fn a_reader_follows_changes_and_is_told_to_rescan_when_it_falls_behind() {
        let feed = CommitFeed::new(4);
        let FeedRead::Rescan { cursor } = feed.read(None, "a", SliceRange::ALL, 10) else {
            panic!("a first read rescans");
        };
        feed.observe("a|1", &appended(1, 2));
        feed.observe("b|1", &appended(1, 1));
        feed.observe("a|1", &appended(2, 2));
        let FeedRead::Changes { cursor, logs } = feed.read(Some(cursor), "a", SliceRange::ALL, 10)
        else {
            panic!("changes");
        };
        assert_eq!(
            logs,
            vec![LogReach {
                log: "a|1".into(),
                committed: 2,
                last: 2,
                base: 0
            }]
        );
        assert_eq!(cursor.counter, 3);
        // Five more changes overflow a ring of four: the cursor fell behind.
        for i in 0..5 {
            feed.observe("a|2", &appended(i, i));
        }
        assert!(matches!(
            feed.read(Some(cursor), "a", SliceRange::ALL, 10),
            FeedRead::Rescan { .. }
        ));
        // Another incarnation's cursor rescans too.
        let stranger = FeedCursor {
            incarnation: cursor.incarnation.wrapping_add(1),
            counter: 8,
        };
        assert!(matches!(
            feed.read(Some(stranger), "a", SliceRange::ALL, 10),
            FeedRead::Rescan { .. }
        ));
    }

    #[test]
    fn a_read_stops_before_the_log_beyond_its_limit() {
        let feed = CommitFeed::new(16);
        let FeedRead::Rescan { cursor } = feed.read(None, "a", SliceRange::ALL, 1) else {
            panic!("rescan");
        };
        feed.observe("a|1", &appended(1, 1));
        feed.observe("a|2", &appended(1, 1));
        let FeedRead::Changes { cursor, logs } = feed.read(Some(cursor), "a", SliceRange::ALL, 1)
        else {
            panic!("changes");
        };
        assert_eq!(logs.len(), 1);
        let FeedRead::Changes { logs, .. } = feed.read(Some(cursor), "a", SliceRange::ALL, 1)
        else {
            panic!("changes");
        };
        assert_eq!(logs[0].log, "a|2");
    }
}
