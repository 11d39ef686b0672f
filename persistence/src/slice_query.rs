//! Events by slice across the cluster (docs/src/design.md §5 "Reading the acknowledged
//! logs"): a task per query asks every member which logs of the entity type in the slices its
//! replica holds and how far they are acknowledged — a full scan first, then its feed of the
//! marks it learned — and reads them with a [`CommittedReader`], which delivers each log's
//! acknowledged events in order from the query's offset. The task's queue to the consumer is
//! bounded: a slow consumer stops the reads, never the cluster.

use crate::caller::{CallResult, ReplicaCaller};
use crate::commit_feed::{FeedCursor, LogReach};
use crate::wire::{ReplicaCall, ReplicaReply, ReplicaRequest};
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use smol_str::SmolStr;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tessera_cluster::Address;
use tessera_cluster::node::ClusterSnapshot;
use tessera_journal::slice::{SliceRange, slice_of};
use tessera_journal::{
    JournalError, JournalStream, QueryMode, SliceEnvelope, SliceItem, SliceOffset, StoredEvent,
};
use tessera_replication::Target;
use tessera_replication::committed_reader::{CommittedReader, Delivered, Reach, ReaderSettings};
use tokio::sync::{mpsc, watch};

/// Settings of the queries by slice.
#[derive(Clone, Debug)]
pub struct SliceQuerySettings {
    /// How often each member's feed is asked what moved (at once again when an answer was
    /// full).
    pub poll_interval: Duration,
    /// Logs one feed answer names at most.
    pub max_logs_per_poll: u32,
    /// Logs a member reads per page of a scan.
    pub scan_page: u32,
    /// Items waiting for the consumer at most.
    pub buffer: usize,
    /// How long a current query waits, at most, for tails its replicas held above their
    /// marks when it found them: a live writer tells the mark within its `mark_delay`, so
    /// an event acknowledged before the query started is in it; one whose writer died
    /// before telling it comes once the log is recovered, to a live query.
    pub current_tail_wait: Duration,
    pub reader: ReaderSettings,
}

impl Default for SliceQuerySettings {
    fn default() -> Self {
        SliceQuerySettings {
            poll_interval: Duration::from_millis(100),
            max_logs_per_poll: 4_096,
            scan_page: 1_024,
            buffer: 1_024,
            current_tail_wait: Duration::from_secs(2),
            reader: ReaderSettings::default(),
        }
    }
}

/// Where the query is with one member.
#[derive(Clone, Debug)]
enum MemberFeed {
    /// It must be scanned, from after `after`; then its feed is read from `cursor`.
    Scanning {
        cursor: FeedCursor,
        after: Option<String>,
    },
    /// Scanned; its feed is read from `cursor`.
    Following {
        cursor: FeedCursor,
        /// Feed answers since the scan ended (a current query ends after one).
        polls: u32,
    },
    /// Not asked yet, or asked again after a failure.
    Unknown,
}

struct Member {
    feed: MemberFeed,
    busy: bool,
    /// Its last call failed (a current query does not wait for it).
    failed: bool,
}

enum Answer {
    Feed(Address, Result<ReplicaReply, String>),
    Read(u64, CallResult),
    /// The pause before a member is asked again is over.
    Rested(Address),
}

/// How far a query is, for its consumer's lag: updated at each poll of the members.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueryProgress {
    /// Acknowledged events the members reported that the query has not delivered yet.
    pub behind: u64,
    /// Items the query handed to its stream so far (some may wait in its buffer).
    pub delivered: u64,
}

/// How a query runs: its settings, and where to tell its progress (if anywhere).
pub(crate) struct QueryRun {
    pub settings: SliceQuerySettings,
    pub progress: Option<watch::Sender<QueryProgress>>,
}

/// Starts a query: see the module. Its progress, when asked for, is kept up to date.
pub(crate) fn events_by_slices(
    caller: Arc<dyn ReplicaCaller>,
    membership: watch::Receiver<ClusterSnapshot>,
    entity_type: &str,
    slices: SliceRange,
    offset: SliceOffset,
    mode: QueryMode,
    run: QueryRun,
) -> JournalStream<SliceItem> {
    let QueryRun { settings, progress } = run;
    let (items, received) = mpsc::channel(settings.buffer.max(1));
    let local = caller.local().0.clone();
    let mut query = Query {
        caller,
        membership,
        entity_type: entity_type.to_string(),
        slices,
        mode,
        reader: CommittedReader::new(settings.reader.clone(), 1).preferring(local.clone()),
        local,
        members: BTreeMap::new(),
        calls: FuturesUnordered::new(),
        settings,
        items,
        progress,
        delivered: 0,
    };
    for (log, seq) in offset.iter() {
        if slices.holds(log) {
            query.reader.follow(log, seq);
        }
    }
    tokio::spawn(query.run());
    tokio_stream_from(received)
}

fn tokio_stream_from(
    mut received: mpsc::Receiver<Result<SliceItem, JournalError>>,
) -> JournalStream<SliceItem> {
    Box::pin(futures::stream::poll_fn(move |cx| received.poll_recv(cx)))
}

struct Query {
    caller: Arc<dyn ReplicaCaller>,
    membership: watch::Receiver<ClusterSnapshot>,
    entity_type: String,
    slices: SliceRange,
    mode: QueryMode,
    reader: CommittedReader<StoredEvent>,
    /// This node: its replica is scanned first and read from when it holds as much as any.
    local: Address,
    members: BTreeMap<Address, Member>,
    calls: FuturesUnordered<BoxFuture<'static, Answer>>,
    settings: SliceQuerySettings,
    items: mpsc::Sender<Result<SliceItem, JournalError>>,
    progress: Option<watch::Sender<QueryProgress>>,
    delivered: u64,
}

impl Query {
    async fn run(mut self) {
        let mut poll = tokio::time::interval(self.settings.poll_interval);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let started = std::time::Instant::now();
        loop {
            // Answers first: after a wait on a slow consumer, the reads answered meanwhile
            // are taken before the tick expires them.
            tokio::select! {
                biased;
                _ = self.items.closed() => return,
                Some(answer) = self.calls.next(), if !self.calls.is_empty() => {
                    match answer {
                        Answer::Feed(address, reply) => self.on_feed(address, reply),
                        Answer::Rested(address) => {
                            if let Some(member) = self.members.get_mut(&address) {
                                member.busy = false;
                            }
                        }
                        Answer::Read(id, result) => {
                            let now = std::time::Instant::now();
                            match result {
                                CallResult::Response(response) => {
                                    self.reader.on_response(id, response, now)
                                }
                                _ => self.reader.on_failure(id, now),
                            }
                        }
                    }
                    self.ask_members();
                }
                _ = poll.tick() => {
                    self.refresh_members();
                    self.ask_members();
                    self.reader.tick(std::time::Instant::now());
                    self.send_reads();
                    self.tell_progress();
                }
            }
            if !self.deliver().await {
                return;
            }
            self.reader.pump(std::time::Instant::now());
            self.send_reads();
            if self.mode == QueryMode::Current && self.is_current(started) {
                return;
            }
        }
    }

    /// Members that can hold replicas, as maintenance counts them.
    fn refresh_members(&mut self) {
        let now = crate::maintenance::holding_members(&self.membership.borrow());
        let gone: Vec<Address> = self
            .members
            .keys()
            .filter(|a| !now.contains(*a))
            .cloned()
            .collect();
        for address in gone {
            self.members.remove(&address);
            self.reader.forget_source(&address);
        }
        for address in now {
            self.members.entry(address).or_insert(Member {
                feed: MemberFeed::Unknown,
                busy: false,
                failed: false,
            });
        }
    }

    /// Sends each idle member its next feed call: a page of its scan, or what moved.
    fn ask_members(&mut self) {
        // This node's replica is scanned before the others, so that the logs it holds are
        // first reported, and read, here, across no network; the others' scans add what it
        // lacks. One that fails is not waited for.
        let scanning = |m: &Member| !matches!(m.feed, MemberFeed::Following { .. });
        let local_scanning = self
            .members
            .get(&self.local)
            .is_some_and(|m| !m.failed && scanning(m));
        for (address, member) in self.members.iter_mut() {
            if member.busy || local_scanning && *address != self.local && scanning(member) {
                continue;
            }
            let request = match &member.feed {
                MemberFeed::Unknown => ReplicaRequest::SliceChanges {
                    entity_type: self.entity_type.clone(),
                    slices: self.slices,
                    cursor: None,
                    max_logs: self.settings.max_logs_per_poll,
                },
                MemberFeed::Scanning { after, .. } => ReplicaRequest::SliceScan {
                    entity_type: self.entity_type.clone(),
                    slices: self.slices,
                    after: after.clone(),
                    max_scanned: self.settings.scan_page,
                },
                MemberFeed::Following { cursor, .. } => ReplicaRequest::SliceChanges {
                    entity_type: self.entity_type.clone(),
                    slices: self.slices,
                    cursor: Some(*cursor),
                    max_logs: self.settings.max_logs_per_poll,
                },
            };
            member.busy = true;
            let call = ReplicaCall {
                log: SmolStr::default(),
                storage_id: None,
                request,
            };
            let reply = self.caller.call_any(address, call);
            let address = address.clone();
            self.calls
                .push(Box::pin(async move { Answer::Feed(address, reply.await) }));
        }
    }

    fn on_feed(&mut self, address: Address, reply: Result<ReplicaReply, String>) {
        let Some(member) = self.members.get_mut(&address) else {
            return;
        };
        member.busy = false;
        member.failed = false;
        let report = |reader: &mut CommittedReader<StoredEvent>, logs: Vec<LogReach>| {
            for log in logs {
                reader.reported(
                    &log.log,
                    &address,
                    Reach {
                        committed: log.committed,
                        last: log.last,
                        base: log.base,
                    },
                );
            }
        };
        let mut rest = false;
        match (reply, &member.feed) {
            (
                Ok(ReplicaReply::SliceChanges {
                    cursor,
                    rescan: true,
                    ..
                }),
                _,
            ) => {
                member.feed = MemberFeed::Scanning {
                    cursor,
                    after: None,
                };
            }
            (
                Ok(ReplicaReply::SliceChanges {
                    cursor,
                    logs,
                    rescan: false,
                }),
                MemberFeed::Following { polls, .. },
            ) => {
                // A full answer goes on at once; otherwise the member is asked again after
                // the poll interval.
                let full = logs.len() >= self.settings.max_logs_per_poll as usize;
                let polls = if full { *polls } else { polls + 1 };
                rest = !full;
                report(&mut self.reader, logs);
                member.feed = MemberFeed::Following { cursor, polls };
            }
            (Ok(ReplicaReply::SliceScan { logs, next }), MemberFeed::Scanning { cursor, .. }) => {
                let cursor = *cursor;
                report(&mut self.reader, logs);
                member.feed = match next {
                    Some(after) => MemberFeed::Scanning {
                        cursor,
                        after: Some(after),
                    },
                    None => MemberFeed::Following { cursor, polls: 0 },
                };
            }
            (Err(reason), _) => {
                tracing::debug!(member = %address, %reason, "a query by slice could not ask a member");
                member.failed = true;
                member.feed = MemberFeed::Unknown;
                rest = true;
            }
            // A store's failure among them: as a failed call, it is not waited for.
            (Ok(other), _) => {
                tracing::debug!(member = %address, reply = ?other, "a query by slice got an answer that does not fit");
                member.failed = true;
                member.feed = MemberFeed::Unknown;
                rest = true;
            }
        }
        if rest {
            member.busy = true;
            let wait = self.settings.poll_interval;
            self.calls.push(Box::pin(async move {
                tokio::time::sleep(wait).await;
                Answer::Rested(address)
            }));
        }
    }

    fn send_reads(&mut self) {
        for read in self.reader.take_requests() {
            let call = self
                .caller
                .call(&Target::Address(read.to), &read.log, read.request);
            let id = read.id;
            self.calls
                .push(Box::pin(async move { Answer::Read(id, call.await) }));
        }
    }

    /// Hands what was delivered to the consumer, waiting while its queue is full. False once
    /// the consumer is gone.
    async fn deliver(&mut self) -> bool {
        for delivered in self.reader.take_delivered() {
            let item = match delivered {
                Delivered::Entry { log, entry } => SliceItem::Event(SliceEnvelope {
                    slice: slice_of(&log),
                    event: entry.payload.to_repr(&log, entry.seq),
                    tags: entry.payload.tags,
                }),
                Delivered::Deleted { log, from, to } => SliceItem::Deleted {
                    persistence_id: log.to_string(),
                    from,
                    to,
                },
            };
            if self.items.send(Ok(item)).await.is_err() {
                return false;
            }
            self.delivered += 1;
        }
        true
    }

    /// O(logs followed): at each poll, not each delivery.
    fn tell_progress(&self) {
        if let Some(progress) = &self.progress {
            let now = QueryProgress {
                behind: self.reader.behind(),
                delivered: self.delivered,
            };
            progress.send_if_modified(|before| std::mem::replace(before, now) != now);
        }
    }

    /// A current query is done once every member that answers was scanned and asked once
    /// more, and everything they reported was delivered.
    fn is_current(&self, started: std::time::Instant) -> bool {
        let asked = !self.members.is_empty()
            && self.members.values().all(|m| {
                m.failed && started.elapsed() > self.settings.reader.request_timeout * 3
                    || matches!(m.feed, MemberFeed::Following { polls, .. } if polls >= 1)
            });
        let tails_done = self.reader.tails_settling() == 0
            || started.elapsed() >= self.settings.current_tail_wait;
        asked && tails_done && self.reader.behind() == 0 && self.reader.reads_in_flight() == 0
    }
}
