//! The reader of logs' acknowledged entries, for queries that read the replicas rather than
//! a writer (the queries by slice; docs/src/design.md §5 "Reading the acknowledged logs").
//!
//! It follows many logs at once. For each it keeps the sequence number delivered so far (its
//! offset) and what each replica said it holds acknowledged, reads from the replica that holds
//! the most, and delivers each log's entries in order, one sequence number after the other.
//!
//! The rule that makes it safe: an entry is delivered only when the replica that returned it
//! knows it to be acknowledged (`seq <= summary.committed()`, the replica's own mark, which a
//! writer sent it after W replicas held the entry). Such an entry is the log's for good: no
//! recovery truncates or replaces it, and every replica that holds it holds the same value.
//! What a replica holds above its mark (a tail a recovery may still truncate) is never
//! delivered, however many replicas hold it. And the offset moves only by delivering
//! `delivered + 1`, so nothing is skipped: where a read comes back short, the next read starts
//! where it stopped. What tells the reader which logs to read (a scan of a replica's logs, a
//! feed of the marks it learned) is only a hint: it decides what to ask, never what to
//! deliver.

use crate::message::{Entry, Request, Response};
use crate::writer::RequestId;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_cluster::Address;

/// Limits of a reader.
#[derive(Clone, Debug)]
pub struct ReaderSettings {
    /// Most entries one read asks for.
    pub max_entries_per_read: u32,
    /// Most payload bytes one read asks for (a single larger entry still comes alone).
    pub max_bytes_per_read: u32,
    /// Reads out at once, over all logs.
    pub max_reads_in_flight: usize,
    /// A read unanswered this long counts as failed.
    pub request_timeout: Duration,
    /// Wait before reading a log again from a source that failed.
    pub retry_interval: Duration,
    /// Entries delivered but not yet taken by [`CommittedReader::take_delivered`]: no read
    /// starts while this many wait (the consumer's backpressure).
    pub max_undelivered: usize,
}

impl Default for ReaderSettings {
    fn default() -> Self {
        ReaderSettings {
            max_entries_per_read: 1_000,
            max_bytes_per_read: 1024 * 1024,
            max_reads_in_flight: 16,
            request_timeout: Duration::from_secs(2),
            retry_interval: Duration::from_millis(200),
            max_undelivered: 10_000,
        }
    }
}

/// Deliberately broken reading rules, to show that the checks of the simulation catch them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReaderSabotage {
    /// Deliver what a replica holds above its acknowledged mark too.
    pub serve_unacknowledged: bool,
    /// After a read, move the offset to the replica's mark even when the read came back
    /// short of it (skipping what it did not return).
    pub advance_to_mark: bool,
}

/// What the reader gives out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivered<P> {
    /// The log's next entry: its sequence number is the log's offset plus one.
    Entry { log: Arc<str>, entry: Entry<P> },
    /// Entries `from..=to` of the log were deleted (a snapshot's retention) on the replica
    /// read before this reader got to them: the offset moves past them.
    Deleted { log: Arc<str>, from: u64, to: u64 },
}

/// A read to send: `request` about `log` to the node at `to`, whatever store it has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadRequest<P> {
    pub id: RequestId,
    pub to: Address,
    pub log: String,
    pub request: Request<P>,
}

/// What a replica says it holds of a log (from its summary).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reach {
    /// Acknowledged up to here (what it knows).
    pub committed: u64,
    /// Its last entry.
    pub last: u64,
    /// Deleted up to here.
    pub base: u64,
}

impl Reach {
    pub fn of(summary: &crate::message::LogSummary) -> Self {
        Reach {
            committed: summary.committed(),
            last: summary.last.seq,
            base: summary.base.seq,
        }
    }

    /// A log that holds `1..=committed`, all acknowledged.
    pub fn committed(committed: u64) -> Self {
        Reach {
            committed,
            last: committed,
            base: 0,
        }
    }
}

/// What a source said of a log.
#[derive(Clone, Copy, Debug, Default)]
struct Reported {
    /// Acknowledged up to here.
    committed: u64,
    /// Its last entry.
    last: u64,
    /// Its entries up to here are deleted.
    base: u64,
    /// A read from it failed: it is passed over until then while another can serve (its
    /// report stays; a fresh one clears this).
    failed_until: Option<Instant>,
}

#[derive(Debug, Default)]
struct Followed {
    /// The offset: entries up to here were delivered (or deleted before they could be).
    delivered: u64,
    /// Per source, what it last reported.
    sources: BTreeMap<Address, Reported>,
    reading: Option<RequestId>,
    /// No read before then (its last source failed).
    not_before: Option<Instant>,
    /// When first reported, a source held entries above every mark: until the offset
    /// reaches that last entry (or a source shows the tail truncated), the log's state as
    /// of then is not delivered yet.
    tail_target: Option<u64>,
}

impl Followed {
    /// The source to read from and how far: of those that still hold the next entry, the
    /// one that reported the highest mark (or, sabotaged, the longest log); if every source
    /// deleted it, the one that deleted least (its answer passes the deleted entries).
    fn best_source(
        &self,
        sabotage: ReaderSabotage,
        preferred: Option<&Address>,
        now: Instant,
    ) -> Option<(&Address, u64)> {
        let reach = |r: &Reported| {
            if sabotage.serve_unacknowledged {
                r.last.max(r.committed)
            } else {
                r.committed
            }
        };
        let up = |r: &Reported| r.failed_until.is_none_or(|until| until <= now);
        let holding = self
            .sources
            .iter()
            .filter(|(_, r)| up(r) && r.base <= self.delivered)
            .map(|(a, r)| (a, reach(r)))
            .max_by_key(|(a, to)| (*to, Some(*a) == preferred))
            .filter(|(_, to)| *to > self.delivered);
        holding.or_else(|| {
            self.sources
                .iter()
                .filter(|(_, r)| up(r) && reach(r) > self.delivered)
                .min_by_key(|(_, r)| r.base)
                .map(|(a, r)| (a, reach(r)))
        })
    }

    /// A read from `source` failed: the log is read again after `retry`, from another
    /// source if one can serve; `source` is passed over for four times as long. Its report
    /// stays, so that what it said it holds still counts as not yet delivered.
    fn failed(&mut self, source: &Address, now: Instant, retry: Duration) {
        self.not_before = Some(now + retry);
        if let Some(reported) = self.sources.get_mut(source) {
            reported.failed_until = Some(now + retry * 4);
        }
    }

    /// Whether a read of this log may become possible with time alone: it waits out a
    /// failed read, or a source is passed over for a while.
    fn waiting(&self, now: Instant) -> bool {
        self.not_before.is_some_and(|t| t > now)
            || self
                .sources
                .values()
                .any(|r| r.failed_until.is_some_and(|until| until > now))
    }

    /// Whether a source other than `except`, not failing, still holds the next entry,
    /// acknowledged.
    fn another_holds_next(&self, except: &Address, now: Instant) -> bool {
        self.sources.iter().any(|(a, r)| {
            a != except
                && r.failed_until.is_none_or(|until| until <= now)
                && r.base <= self.delivered
                && r.committed > self.delivered
        })
    }
}

struct Out {
    log: String,
    to: Address,
    deadline: Instant,
}

/// Reads logs' acknowledged entries from their replicas: see the module.
pub struct CommittedReader<P> {
    settings: ReaderSettings,
    sabotage: ReaderSabotage,
    /// Read from this source when it holds as much as any: this node's own replica, whose
    /// answers cross no network.
    preferred: Option<Address>,
    logs: BTreeMap<String, Followed>,
    /// The logs a read may be due for: every log whose state changed since a pump last
    /// found nothing to read of it, or that waits out a failure. A pump looks at these
    /// alone (a reader follows thousands of logs, and most have nothing new).
    due: BTreeSet<String>,
    sent: BTreeMap<RequestId, Out>,
    next_request: RequestId,
    delivered: VecDeque<Delivered<P>>,
    requests: Vec<ReadRequest<P>>,
}

impl<P: Clone> CommittedReader<P> {
    /// A reader whose request ids start at `first_request` (so that they can share a
    /// transport's id space with others).
    pub fn new(settings: ReaderSettings, first_request: RequestId) -> Self {
        CommittedReader {
            settings,
            sabotage: ReaderSabotage::default(),
            preferred: None,
            logs: BTreeMap::new(),
            due: BTreeSet::new(),
            sent: BTreeMap::new(),
            next_request: first_request,
            delivered: VecDeque::new(),
            requests: Vec::new(),
        }
    }

    /// The same reader with broken rules (for the simulation's own tests).
    pub fn sabotaged(mut self, sabotage: ReaderSabotage) -> Self {
        self.sabotage = sabotage;
        self
    }

    /// The same reader, reading from `source` whenever it reported as much as any other.
    pub fn preferring(mut self, source: Address) -> Self {
        self.preferred = Some(source);
        self
    }

    /// Follows `log` from after `delivered` (an offset delivered before, 0: from the start).
    /// A log followed already keeps its offset, unless `delivered` is higher.
    pub fn follow(&mut self, log: &str, delivered: u64) {
        let followed = self.logs.entry(log.to_string()).or_default();
        followed.delivered = followed.delivered.max(delivered);
        self.mark_due(log);
    }

    fn mark_due(&mut self, log: &str) {
        if !self.due.contains(log) {
            self.due.insert(log.to_string());
        }
    }

    /// The offset of every log followed: its last delivered sequence number.
    pub fn offsets(&self) -> impl Iterator<Item = (&str, u64)> {
        self.logs.iter().map(|(log, f)| (log.as_str(), f.delivered))
    }

    /// The offset of one log.
    pub fn offset(&self, log: &str) -> Option<u64> {
        self.logs.get(log).map(|f| f.delivered)
    }

    /// Acknowledged entries known to exist beyond the offsets: the sum over logs of the
    /// highest mark a source reported minus the offset.
    pub fn behind(&self) -> u64 {
        self.logs
            .values()
            .map(|f| {
                f.sources
                    .values()
                    .map(|r| r.committed)
                    .max()
                    .map_or(0, |c| c.saturating_sub(f.delivered))
            })
            .sum()
    }

    /// `source` says it holds `log` acknowledged up to `committed`, up to `last` in all,
    /// and deleted up to `base` (a hint: what to read, and where). The log is followed from
    /// the start if it was not.
    pub fn reported(&mut self, log: &str, source: &Address, summary: Reach) {
        let followed = self.logs.entry(log.to_string()).or_default();
        if followed.tail_target.is_none()
            && summary.last > summary.committed
            && summary.last > followed.delivered
        {
            followed.tail_target = Some(summary.last);
        }
        if let Some(target) = followed.tail_target
            && summary.last < target
            && summary.committed == summary.last
        {
            // Recovered shorter: the tail above was truncated.
            followed.tail_target = Some(summary.last);
        }
        followed.sources.insert(
            source.clone(),
            Reported {
                committed: summary.committed,
                last: summary.last,
                base: summary.base,
                failed_until: None,
            },
        );
        self.mark_due(log);
    }

    /// Forgets `source` for every log (it left the cluster).
    pub fn forget_source(&mut self, source: &Address) {
        for followed in self.logs.values_mut() {
            followed.sources.remove(source);
        }
    }

    /// Logs whose tail, when first reported, was above every mark and is not delivered yet
    /// (a writer tells the mark soon after it acknowledged; see [`Reach`]).
    pub fn tails_settling(&self) -> usize {
        self.logs
            .values()
            .filter(|f| f.tail_target.is_some_and(|t| t > f.delivered))
            .count()
    }

    /// Reads to send now.
    pub fn take_requests(&mut self) -> Vec<ReadRequest<P>> {
        std::mem::take(&mut self.requests)
    }

    /// What was delivered since the last call, in order (each log's in sequence order).
    pub fn take_delivered(&mut self) -> VecDeque<Delivered<P>> {
        std::mem::take(&mut self.delivered)
    }

    /// Starts the reads that are due: one per log at most, from the source that reported the
    /// highest mark.
    pub fn pump(&mut self, now: Instant) {
        if self.delivered.len() >= self.settings.max_undelivered {
            return;
        }
        let sabotage = self.sabotage;
        // Dropped from the due logs: what is read now, or holds nothing to read until its
        // state changes (which marks it due again). Kept: what waits for time to pass, and
        // what was not looked at because the reads in flight reached their limit.
        let mut done = Vec::new();
        for log in &self.due {
            if self.sent.len() >= self.settings.max_reads_in_flight {
                break;
            }
            let Some(followed) = self.logs.get_mut(log) else {
                done.push(log.clone());
                continue;
            };
            if followed.reading.is_some() {
                done.push(log.clone());
                continue;
            }
            if followed.not_before.is_some_and(|t| t > now) {
                continue;
            }
            let Some((source, to)) = followed.best_source(sabotage, self.preferred.as_ref(), now)
            else {
                if !followed.waiting(now) {
                    done.push(log.clone());
                }
                continue;
            };
            let source = source.clone();
            let id = self.next_request;
            self.next_request += 1;
            followed.reading = Some(id);
            followed.not_before = None;
            self.sent.insert(
                id,
                Out {
                    log: log.clone(),
                    to: source.clone(),
                    deadline: now + self.settings.request_timeout,
                },
            );
            self.requests.push(ReadRequest {
                id,
                to: source,
                log: log.clone(),
                request: Request::Read {
                    from: followed.delivered + 1,
                    to,
                    max_entries: self.settings.max_entries_per_read,
                    max_bytes: self.settings.max_bytes_per_read,
                },
            });
            done.push(log.clone());
        }
        for log in done {
            self.due.remove(&log);
        }
    }

    /// The answer to read `id`.
    pub fn on_response(&mut self, id: RequestId, response: Response<P>, now: Instant) {
        let Some(out) = self.sent.remove(&id) else {
            return;
        };
        let Some(followed) = self.logs.get_mut(&out.log) else {
            return;
        };
        if followed.reading != Some(id) {
            return;
        }
        followed.reading = None;
        // Whatever the answer, the log may be read again (on, elsewhere, or later).
        if !self.due.contains(&out.log) {
            self.due.insert(out.log.clone());
        }
        let Response::Entries { entries, summary } = response else {
            // Not an answer to a read: try again later, elsewhere first.
            let retry = self.settings.retry_interval;
            followed.failed(&out.to, now, retry);
            return;
        };
        let mark = if self.sabotage.serve_unacknowledged {
            summary.last.seq.max(summary.committed())
        } else {
            summary.committed()
        };
        // What this source holds now (less than it said, if it lost its data).
        followed.sources.insert(
            out.to.clone(),
            Reported {
                committed: summary.committed(),
                last: summary.last.seq,
                base: summary.base.seq,
                failed_until: None,
            },
        );
        if summary.base.seq > followed.delivered && followed.another_holds_next(&out.to, now) {
            // Deleted here but not everywhere: read it where it still is.
            return;
        }
        // One name shared by the answer's entries.
        let log: Arc<str> = Arc::from(out.log.as_str());
        if summary.base.seq > followed.delivered {
            self.delivered.push_back(Delivered::Deleted {
                log: log.clone(),
                from: followed.delivered + 1,
                to: summary.base.seq,
            });
            followed.delivered = summary.base.seq;
        }
        for entry in entries {
            if entry.seq != followed.delivered + 1 || entry.seq > mark {
                continue;
            }
            followed.delivered = entry.seq;
            self.delivered.push_back(Delivered::Entry {
                log: log.clone(),
                entry,
            });
        }
        if self.sabotage.advance_to_mark {
            followed.delivered = followed.delivered.max(mark);
        }
    }

    /// Read `id` got no answer (the node is unreachable, or the transport gave up).
    pub fn on_failure(&mut self, id: RequestId, now: Instant) {
        let Some(out) = self.sent.remove(&id) else {
            return;
        };
        if let Some(followed) = self.logs.get_mut(&out.log)
            && followed.reading == Some(id)
        {
            followed.reading = None;
            followed.failed(&out.to, now, self.settings.retry_interval);
            self.due.insert(out.log);
        }
    }

    /// Time passed: reads past their timeout fail.
    pub fn tick(&mut self, now: Instant) {
        let expired: Vec<RequestId> = self
            .sent
            .iter()
            .filter(|(_, out)| out.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            self.on_failure(id, now);
        }
        self.pump(now);
    }

    /// Reads out now.
    pub fn reads_in_flight(&self) -> usize {
        self.sent.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::epoch::{Epoch, Position};
    use crate::message::LogSummary;

    fn summary(last: u64, lac: u64, base: u64) -> LogSummary {
        LogSummary {
            promise: Epoch::ZERO,
            last: Position::new(last, Epoch::ZERO),
            lac,
            base: Position::new(base, Epoch::ZERO),
            config: None,
        }
    }

    fn entries(from: u64, to: u64) -> Vec<Entry<u64>> {
        (from..=to)
            .map(|seq| Entry {
                seq,
                epoch: Epoch::ZERO,
                payload: seq * 10,
            })
            .collect()
    }

    fn seqs(delivered: VecDeque<Delivered<u64>>) -> Vec<u64> {
        delivered
            .into_iter()
            .filter_map(|d| match d {
                Delivered::Entry { entry, .. } => Some(entry.seq),
                Delivered::Deleted { .. } => None,
            })
            .collect()
    }

    #[test]
    fn delivers_only_what_the_answering_replica_knows_acknowledged() {
        let now = Instant::now();
        let a = Address::new("127.0.0.1", 1);
        let mut reader = CommittedReader::<u64>::new(ReaderSettings::default(), 1);
        reader.reported("l", &a, Reach::committed(5));
        reader.pump(now);
        let read = reader.take_requests().remove(0);
        assert_eq!(
            read.request,
            Request::Read {
                from: 1,
                to: 5,
                max_entries: 1_000,
                max_bytes: 1024 * 1024
            }
        );
        // It holds 1..=7 but knows only 1..=3 acknowledged.
        reader.on_response(
            read.id,
            Response::Entries {
                entries: entries(1, 7),
                summary: summary(7, 3, 0),
            },
            now,
        );
        assert_eq!(seqs(reader.take_delivered()), vec![1, 2, 3]);
        assert_eq!(reader.offset("l"), Some(3));
        // It lowered its own report: no read until it (or another) reports more.
        reader.pump(now);
        assert!(reader.take_requests().is_empty());
        reader.reported("l", &a, Reach::committed(7));
        reader.pump(now);
        let read = reader.take_requests().remove(0);
        // A short answer: the next read starts where it stopped.
        reader.on_response(
            read.id,
            Response::Entries {
                entries: entries(4, 5),
                summary: summary(7, 7, 0),
            },
            now,
        );
        assert_eq!(seqs(reader.take_delivered()), vec![4, 5]);
        reader.pump(now);
        let read = reader.take_requests().remove(0);
        assert!(matches!(read.request, Request::Read { from: 6, .. }));
    }

    #[test]
    fn entries_out_of_order_or_repeated_are_not_delivered() {
        let now = Instant::now();
        let a = Address::new("127.0.0.1", 1);
        let mut reader = CommittedReader::<u64>::new(ReaderSettings::default(), 1);
        reader.follow("l", 2);
        reader.reported("l", &a, Reach::committed(9));
        reader.pump(now);
        let read = reader.take_requests().remove(0);
        let mut answer = entries(1, 4);
        answer.extend(entries(6, 9));
        reader.on_response(
            read.id,
            Response::Entries {
                entries: answer,
                summary: summary(9, 9, 0),
            },
            now,
        );
        assert_eq!(seqs(reader.take_delivered()), vec![3, 4]);
        // A late duplicate of the answer changes nothing.
        reader.on_response(
            read.id,
            Response::Entries {
                entries: entries(1, 9),
                summary: summary(9, 9, 0),
            },
            now,
        );
        assert!(reader.take_delivered().is_empty());
    }

    #[test]
    fn a_deleted_prefix_is_reported_and_passed() {
        let now = Instant::now();
        let a = Address::new("127.0.0.1", 1);
        let mut reader = CommittedReader::<u64>::new(ReaderSettings::default(), 1);
        reader.reported("l", &a, Reach::committed(6));
        reader.pump(now);
        let read = reader.take_requests().remove(0);
        reader.on_response(
            read.id,
            Response::Entries {
                entries: entries(5, 6),
                summary: summary(6, 6, 4),
            },
            now,
        );
        let delivered: Vec<_> = reader.take_delivered().into_iter().collect();
        assert_eq!(
            delivered[0],
            Delivered::Deleted {
                log: "l".into(),
                from: 1,
                to: 4
            }
        );
        assert_eq!(delivered.len(), 3);
    }

    #[test]
    fn a_failed_source_is_retried_after_the_interval_and_another_preferred() {
        let now = Instant::now();
        let (a, b) = (Address::new("127.0.0.1", 1), Address::new("127.0.0.1", 2));
        let settings = ReaderSettings::default();
        let retry = settings.retry_interval;
        let mut reader = CommittedReader::<u64>::new(settings, 1);
        reader.reported("l", &a, Reach::committed(5));
        reader.reported("l", &b, Reach::committed(4));
        reader.pump(now);
        let read = reader.take_requests().remove(0);
        assert_eq!(read.to, a);
        reader.on_failure(read.id, now);
        reader.pump(now);
        assert!(reader.take_requests().is_empty());
        reader.pump(now + retry);
        let read = reader.take_requests().remove(0);
        assert_eq!(read.to, b);
        // Both failed: what they reported still counts, and each is asked again once its
        // own wait is over — nothing is given up.
        reader.on_failure(read.id, now + retry);
        assert_eq!(reader.behind(), 5);
        reader.pump(now + retry * 2);
        assert!(reader.take_requests().is_empty());
        reader.pump(now + retry * 4);
        let read = reader.take_requests().remove(0);
        assert_eq!(read.to, a);
    }
}
