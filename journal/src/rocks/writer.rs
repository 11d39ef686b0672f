//! The writer thread: the only code that writes the journal's database.
//!
//! It takes every write waiting in its bounded queue (up to `max_batch_writes` and
//! `max_batch_bytes`), checks each against its log's state, puts the valid ones into one
//! RocksDB `WriteBatch` and commits that with one WAL write (and one fsync under
//! `FsyncPolicy::Always`). A write is acknowledged only after its batch is durable; a write
//! that does not continue its log is refused on its own and adds nothing to the batch.
//!
//! Because one thread hands out pid numbers, tag numbers and tag offsets, and commits batches
//! in order, offsets are committed in increasing order: a live tag query that has read offset
//! N can never later see a commit of an offset below N.
//!
//! Physical deletion (events and their tag-index entries up to a log's `deleted_to`) runs here
//! too, one chunk at a time between groups, so that it never races an append.

use super::Shared;
use super::keys::{
    self, CF_EVENTS, CF_META, CF_TAG_INDEX, COUNTERS_KEY, Counters, LogState, pair_key,
    pair_upper_bound,
};
use super::reader;
use super::recent::Recent;
use super::replica;
use crate::entry::StoredEvent;
use crate::error::JournalError;
use crate::record::{self, AtomicWrite, EventFields};
use rocksdb::{WriteBatch, WriteOptions};
use smol_str::SmolStr;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError};
use std::time::{Duration, Instant};
use tessera_replication::replica::{Decision, Leases, LogMeta, Mutation, Reply, Rules};
use tessera_replication::{LogSummary, Request, Response};
use tessera_storage::FsyncPolicy;
use tokio::sync::{oneshot, watch};

/// Logs and tags whose numbers and state the writer is sure to keep in memory, each, if used
/// in a row (it holds at most twice as many, see [`Recent`]): memory stays bounded whatever
/// the number of persistence ids, and what was forgotten is read from RocksDB again.
const MAX_CACHED_NAMES: usize = 100_000;

/// A chunk of physical deletion runs at least once per this many groups, so that a busy
/// journal still reclaims space.
const GROUPS_PER_DELETION_STEP: u32 = 16;
/// Pending compaction requests; further ones are dropped (RocksDB's own compaction gets to the
/// range eventually).
const COMPACTION_QUEUE_CAPACITY: usize = 16;
/// A deletion of fewer events is not followed by a compaction of its range. Such a
/// compaction rewrites every file that overlaps the range — the level-0 files and a
/// bottom-level file of many logs, tens of megabytes, for a few records (a projection's
/// offset log deletes its records before each full one) — while the tombstones of a small
/// deletion slow only reads of its own log, and RocksDB's own compactions drop them.
const MIN_DELETED_EVENTS_TO_COMPACT: u64 = 4_096;

/// A request to the writer.
pub(crate) enum WriterRequest {
    Append {
        write: AtomicWrite,
        reply: oneshot::Sender<Result<(), JournalError>>,
    },
    DeleteTo {
        persistence_id: String,
        to_sequence_nr: u64,
        reply: oneshot::Sender<Result<(), JournalError>>,
    },
    /// Finish what is queued before this request, then stop.
    Close { reply: oneshot::Sender<()> },
    /// A change to a replicated log this store holds a replica of: the replica rules decide
    /// it against the stored state, and it goes into the batch with everything else.
    Replica {
        persistence_id: String,
        request: Request<StoredEvent>,
        reply: ReplicaReply,
    },
    /// Replica changes to many logs (a replica service's batch), decided in order, each as a
    /// `Replica` request would be, and answered together once all are durable.
    Replicas {
        requests: Vec<(String, Request<StoredEvent>)>,
        reply: ReplicasReply,
    },
}

/// What a replica request is answered.
pub(crate) type ReplicaAnswer = Result<Response<StoredEvent>, JournalError>;
/// Where the answer to a replica request goes.
pub(crate) type ReplicaReply = oneshot::Sender<ReplicaAnswer>;
/// Where the answers to a batch of replica requests go, in the order of the requests.
pub(crate) type ReplicasReply = oneshot::Sender<Vec<ReplicaAnswer>>;

/// Where one replica request's answer goes: its own channel, or its place in a batch.
enum ReplySlot {
    One(ReplicaReply),
    Part { batch: usize, index: usize },
}

/// The batches of replica requests of one group, filled in as their parts are answered and
/// sent once the group is done.
#[derive(Default)]
struct BatchAnswers {
    batches: Vec<(ReplicasReply, Vec<Option<ReplicaAnswer>>)>,
}

impl BatchAnswers {
    fn answer(&mut self, slot: ReplySlot, answer: ReplicaAnswer) {
        match slot {
            ReplySlot::One(reply) => {
                let _ = reply.send(answer);
            }
            ReplySlot::Part { batch, index } => {
                if let Some(place) = self
                    .batches
                    .get_mut(batch)
                    .and_then(|(_, answers)| answers.get_mut(index))
                {
                    *place = Some(answer);
                }
            }
        }
    }

    /// Sends every batch's answers; a part never answered (none is, but for a bug) reads as
    /// a failed store.
    fn send(self) {
        for (reply, answers) in self.batches {
            let answers = answers
                .into_iter()
                .map(|answer| {
                    answer.unwrap_or_else(|| {
                        Err(JournalError::Storage(
                            "the replica request was not decided".into(),
                        ))
                    })
                })
                .collect();
            let _ = reply.send(answers);
        }
    }
}

impl WriterRequest {
    fn size_bytes(&self) -> usize {
        fn replica_bytes(request: &Request<StoredEvent>) -> usize {
            match request {
                Request::Append { entries, .. } => {
                    entries.iter().map(|e| e.payload.payload.len()).sum()
                }
                _ => 0,
            }
        }
        match self {
            WriterRequest::Append { write, .. } => write.payload_bytes(),
            WriterRequest::Replica { request, .. } => replica_bytes(request),
            WriterRequest::Replicas { requests, .. } => {
                requests.iter().map(|(_, r)| replica_bytes(r)).sum()
            }
            _ => 0,
        }
    }

    /// The log it changes, if any.
    fn persistence_id(&self) -> Option<&str> {
        match self {
            WriterRequest::Append { write, .. } => Some(&write.persistence_id),
            WriterRequest::DeleteTo { persistence_id, .. }
            | WriterRequest::Replica { persistence_id, .. } => Some(persistence_id),
            WriterRequest::Close { .. } | WriterRequest::Replicas { .. } => None,
        }
    }
}

/// A replica request staged in a batch, answered once the batch is durable.
struct StagedReplica {
    reply: ReplySlot,
    decided: Reply,
    summary: LogSummary,
    /// The log's number, to read the tail of a promise from (none: the log holds nothing).
    pid_num: Option<u64>,
    persistence_id: String,
}

/// One change to the database, collected before any is added to the batch: a replica
/// request that fails halfway adds nothing.
enum Op {
    Put(&'static str, Vec<u8>, Vec<u8>),
    Delete(&'static str, Vec<u8>),
    DeleteRange(&'static str, Vec<u8>, Vec<u8>),
}

/// A log's number and state as the writer knows it.
type CachedLog = reader::Log;

/// Events of a log to remove from disk: `from..=to`.
#[derive(Debug, Clone, Copy)]
struct PendingDeletion {
    from: u64,
    to: u64,
    /// Where the deletion started, or resumed after a restart (`from` moves on as chunks
    /// are removed).
    first: u64,
}

impl PendingDeletion {
    fn new(from: u64, to: u64) -> Self {
        PendingDeletion {
            from,
            to,
            first: from,
        }
    }

    /// The same deletion, or the one pending before it, extended to `to`.
    fn extended(before: Option<&PendingDeletion>, from: u64, to: u64) -> Self {
        // The earliest pending start is the one recorded on disk: a restart resumes there.
        match before {
            Some(before) => PendingDeletion { to, ..*before },
            None => PendingDeletion::new(from, to),
        }
    }
}

/// What a group changes, applied to the writer's memory only once the batch is durable.
struct Staged {
    logs: HashMap<String, CachedLog>,
    tags: HashMap<String, u64>,
    /// Replica states written, by log number.
    replicas: Vec<(u64, LogMeta)>,
    counters: Counters,
    deletions: Vec<(u64, PendingDeletion)>,
}

struct Writer {
    shared: Arc<Shared>,
    logs: Recent<String, CachedLog>,
    tags: Recent<String, u64>,
    /// The stored replica state of replicated logs (`None`: the log has no replica record),
    /// by log number, as the writer (the database's only writer) last wrote or read it:
    /// deciding a replica request then reads nothing from RocksDB.
    replicas: Recent<u64, Option<LogMeta>>,
    counters: Counters,
    deletions: BTreeMap<u64, PendingDeletion>,
    commits: watch::Sender<u64>,
    durable: WriteOptions,
    /// For physical deletion: losing it in a crash only means doing it again at start.
    relaxed: WriteOptions,
    compactions: std::sync::mpsc::SyncSender<(Vec<u8>, Vec<u8>)>,
    compactor: Option<std::thread::JoinHandle<()>>,
    /// The read leases this replica granted: held here, where every replica request is
    /// decided in turn, so that a promise and a lease are never decided at once.
    leases: Leases,
}

/// What [`start`] gives back: the request queue, the commit counter, the writer thread.
pub(crate) type Started = (
    SyncSender<WriterRequest>,
    watch::Receiver<u64>,
    std::thread::JoinHandle<()>,
);

/// Starts the writer and its compaction thread; returns the request queue, the commit
/// counter that live queries watch, and the writer thread (which ends once every sender of
/// the queue is gone or a close was asked).
pub(crate) fn start(shared: Arc<Shared>) -> Result<Started, JournalError> {
    let counters = load_counters(&shared)?;
    let deletions = load_deletions(&shared)?;
    let (requests, queue) = std::sync::mpsc::sync_channel(shared.config.write_queue_capacity);
    let (commits, committed) = watch::channel(0u64);
    let (compactions, compaction_queue) = std::sync::mpsc::sync_channel(COMPACTION_QUEUE_CAPACITY);

    let compactor_shared = shared.clone();
    let compactor = std::thread::Builder::new()
        .name("tessera-journal-compactor".into())
        .spawn(move || compact(compactor_shared, compaction_queue))
        .map_err(|e| JournalError::Storage(format!("cannot start the compaction thread: {e}")))?;

    let mut durable = WriteOptions::default();
    durable.set_sync(shared.config.fsync == FsyncPolicy::Always);
    let leases = Leases::new(Instant::now(), shared.config.replica_restart_wait);
    let writer = Writer {
        shared,
        logs: Recent::new(MAX_CACHED_NAMES),
        tags: Recent::new(MAX_CACHED_NAMES),
        replicas: Recent::new(MAX_CACHED_NAMES),
        counters,
        deletions,
        commits,
        durable,
        relaxed: WriteOptions::default(),
        compactions,
        compactor: Some(compactor),
        leases,
    };
    let thread = std::thread::Builder::new()
        .name("tessera-journal-writer".into())
        .spawn(move || writer.run(queue))
        .map_err(|e| JournalError::Storage(format!("cannot start the writer thread: {e}")))?;
    Ok((requests, committed, thread))
}

fn load_counters(shared: &Shared) -> Result<Counters, JournalError> {
    match shared.db.get_cf(shared.cf(CF_META)?, COUNTERS_KEY)? {
        None => Ok(Counters::default()),
        Some(value) => Counters::decode(&value).ok_or_else(|| {
            JournalError::CorruptMetadata(format!("counters record of {} bytes", value.len()))
        }),
    }
}

/// Deletions a previous run committed but did not finish removing from disk.
fn load_deletions(shared: &Shared) -> Result<BTreeMap<u64, PendingDeletion>, JournalError> {
    let meta = shared.cf(CF_META)?;
    let (start, end) = keys::deletion_key_range();
    let mut options = rocksdb::ReadOptions::default();
    options.set_iterate_upper_bound(end);
    let mut iter = shared.db.raw_iterator_cf_opt(meta, options);
    iter.seek(start);
    let mut deletions = BTreeMap::new();
    while let Some((key, value)) = iter.item() {
        let (Some(pid_num), Some(from)) = (keys::parse_deletion_key(key), keys::decode_u64(value))
        else {
            return Err(JournalError::CorruptMetadata(
                "malformed pending-deletion record".into(),
            ));
        };
        let state = reader::state_of(shared, &reader::pid_name(shared, pid_num)?)?;
        deletions.insert(pid_num, PendingDeletion::new(from, state.deleted_to));
        iter.next();
    }
    iter.status()?;
    Ok(deletions)
}

/// Writes the number and state of each log a batch changed, once with its final state,
/// replacing a store-format-1 state record. In key order: the metadata memtable's skip list
/// then finds each insert's place next to the previous one rather than searching from its
/// top.
fn put_logs(
    batch: &mut WriteBatch,
    meta: &rocksdb::ColumnFamily,
    logs: &mut HashMap<String, CachedLog>,
) {
    let mut records: Vec<(Vec<u8>, &mut CachedLog)> = logs
        .iter_mut()
        .map(|(pid, log)| (keys::pid_key(pid), log))
        .collect();
    records.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    for (key, log) in records {
        batch.put_cf(
            meta,
            key,
            keys::encode_log(log.pid_num, log.state, log.progress).as_slice(),
        );
        if log.legacy_state {
            batch.delete_cf(meta, keys::legacy_state_key(log.pid_num));
            log.legacy_state = false;
        }
    }
}

fn compact(shared: Arc<Shared>, queue: std::sync::mpsc::Receiver<(Vec<u8>, Vec<u8>)>) {
    while let Ok((start, end)) = queue.recv() {
        if let Ok(cf) = shared.cf(CF_EVENTS) {
            shared.db.compact_range_cf(cf, Some(start), Some(end));
        }
    }
}

impl Writer {
    fn run(mut self, queue: Receiver<WriterRequest>) {
        let mut groups_since_deletion_step = 0u32;
        let mut last_group_len = 1;
        loop {
            let first = if self.deletions.is_empty() {
                match queue.recv() {
                    Ok(request) => request,
                    Err(_) => break,
                }
            } else {
                match queue.try_recv() {
                    Ok(request) => request,
                    Err(TryRecvError::Empty) => {
                        self.physical_deletion_step();
                        continue;
                    }
                    Err(TryRecvError::Disconnected) => break,
                }
            };
            if let WriterRequest::Close { reply } = first {
                self.finish(reply);
                return;
            }
            let (group, close) = self.gather(first, &queue, last_group_len);
            last_group_len = group.len();
            self.commit_group(group);
            if let Some(reply) = close {
                self.finish(reply);
                return;
            }
            groups_since_deletion_step += 1;
            if !self.deletions.is_empty() && groups_since_deletion_step >= GROUPS_PER_DELETION_STEP
            {
                groups_since_deletion_step = 0;
                self.physical_deletion_step();
            }
        }
        // The journal was dropped without `close`: no thread of the journal may keep the
        // database open after its writer ended (a process exiting under a running compaction
        // can abort in RocksDB's teardown).
        self.stop();
    }

    /// Gathers a group: everything queued, and — when the previous group was larger than
    /// what is queued — up to `group_commit_linger` more for the writers that are likely
    /// still on their way (each was acknowledged a moment ago and is sending its next write).
    /// A lone writer never waits: its previous group had one write.
    fn gather(
        &self,
        first: WriterRequest,
        queue: &Receiver<WriterRequest>,
        expected_len: usize,
    ) -> (Vec<WriterRequest>, Option<oneshot::Sender<()>>) {
        let config = &self.shared.config;
        let deadline = Instant::now() + config.group_commit_linger;
        let mut size_bytes = first.size_bytes();
        let mut group = vec![first];
        while group.len() < config.max_batch_writes && size_bytes < config.max_batch_bytes {
            let next = match queue.try_recv() {
                Ok(request) => request,
                Err(TryRecvError::Disconnected) => break,
                Err(TryRecvError::Empty) => {
                    let now = Instant::now();
                    if group.len() >= expected_len || now >= deadline {
                        break;
                    }
                    match queue.recv_timeout(deadline - now) {
                        Ok(request) => request,
                        Err(_) => break,
                    }
                }
            };
            if let WriterRequest::Close { reply } = next {
                return (group, Some(reply));
            }
            size_bytes += next.size_bytes();
            group.push(next);
        }
        (group, None)
    }

    /// Releases the database and then tells the closer: once it hears back, only readers still
    /// hold the database open.
    fn finish(mut self, reply: oneshot::Sender<()>) {
        // Space of deleted events is reclaimed before closing, so a closed journal holds no
        // deleted events (a crash instead leaves the markers that resume it at the next open).
        while !self.deletions.is_empty() {
            self.physical_deletion_step();
        }
        self.stop();
        let _ = reply.send(());
    }

    /// Drops the writer and waits for the compactor: dropping the writer drops the
    /// compaction queue's sender, which ends the compactor after the compaction it may be
    /// running.
    fn stop(mut self) {
        let compactor = self.compactor.take();
        drop(self);
        if let Some(compactor) = compactor {
            let _ = compactor.join();
        }
    }

    fn new_staged(&self) -> Staged {
        Staged {
            logs: HashMap::new(),
            tags: HashMap::new(),
            replicas: Vec::new(),
            counters: self.counters,
            deletions: Vec::new(),
        }
    }

    /// Commits a group. A log is changed by at most one request per batch when replica
    /// requests are involved: a second one for it starts a new batch, so that each replica
    /// decision reads the log as it is on disk (and no answer leaves before what it relies
    /// on is durable).
    fn commit_group(&mut self, group: Vec<WriterRequest>) {
        let mut batch = WriteBatch::default();
        let mut staged = self.new_staged();
        let mut accepted = Vec::with_capacity(group.len());
        let mut replicas = Vec::new();
        let mut answers = BatchAnswers::default();
        // Logs changed in this batch, by a hash of their name: a collision only starts a
        // new batch early.
        let mut touched: HashSet<u64> = HashSet::new();
        let item_count = group
            .iter()
            .map(|request| match request {
                WriterRequest::Replicas { requests, .. } => requests.len(),
                _ => 1,
            })
            .sum();
        let mut items = Vec::with_capacity(item_count);
        for request in group {
            match request {
                WriterRequest::Replicas { requests, reply } => {
                    let batch = answers.batches.len();
                    answers
                        .batches
                        .push((reply, (0..requests.len()).map(|_| None).collect()));
                    items.extend(requests.into_iter().enumerate().map(
                        |(index, (persistence_id, request))| {
                            Item::Replica(persistence_id, request, ReplySlot::Part { batch, index })
                        },
                    ));
                }
                WriterRequest::Replica {
                    persistence_id,
                    request,
                    reply,
                } => items.push(Item::Replica(
                    persistence_id,
                    request,
                    ReplySlot::One(reply),
                )),
                other => items.push(Item::Other(other)),
            }
        }
        replicas.reserve(items.len());
        for item in items {
            let (pid, is_replica) = match &item {
                Item::Replica(pid, ..) => (Some(pid.as_str()), true),
                Item::Other(request) => (request.persistence_id(), false),
            };
            if let Some(pid) = pid {
                let hash = xxhash_rust::xxh3::xxh3_64(pid.as_bytes());
                if touched.contains(&hash) && (is_replica || !replicas.is_empty()) {
                    let full = std::mem::take(&mut batch);
                    let done = std::mem::replace(&mut staged, self.new_staged());
                    self.commit_batch(
                        full,
                        done,
                        std::mem::take(&mut accepted),
                        std::mem::take(&mut replicas),
                        &mut answers,
                    );
                    // Staged anew from the counters the commit left: a log or tag created in
                    // the next batch must not get a number the last one gave out.
                    staged = self.new_staged();
                    touched.clear();
                }
                touched.insert(hash);
            }
            match item {
                Item::Replica(persistence_id, request, reply) => {
                    match self.stage_replica(&mut batch, &mut staged, &persistence_id, request) {
                        Ok((decided, summary, pid_num)) => replicas.push(StagedReplica {
                            reply,
                            decided,
                            summary,
                            pid_num,
                            persistence_id,
                        }),
                        Err(e) => answers.answer(reply, Err(e)),
                    }
                }
                Item::Other(WriterRequest::Append { write, reply }) => {
                    match self.stage_append(&mut batch, &mut staged, &write) {
                        Ok(()) => accepted.push(reply),
                        Err(e) => {
                            let _ = reply.send(Err(e));
                        }
                    }
                }
                Item::Other(WriterRequest::DeleteTo {
                    persistence_id,
                    to_sequence_nr,
                    reply,
                }) => {
                    match self.stage_delete(
                        &mut batch,
                        &mut staged,
                        &persistence_id,
                        to_sequence_nr,
                    ) {
                        Ok(()) => accepted.push(reply),
                        Err(e) => {
                            let _ = reply.send(Err(e));
                        }
                    }
                }
                Item::Other(_) => continue,
            }
        }
        self.commit_batch(batch, staged, accepted, replicas, &mut answers);
        answers.send();
    }

    /// Writes a batch (one WAL write, one sync) and answers what it holds.
    fn commit_batch(
        &mut self,
        mut batch: WriteBatch,
        mut staged: Staged,
        accepted: Vec<oneshot::Sender<Result<(), JournalError>>>,
        replicas: Vec<StagedReplica>,
        answers: &mut BatchAnswers,
    ) {
        if !staged.logs.is_empty() {
            match self.shared.cf(CF_META) {
                Ok(meta) => put_logs(&mut batch, meta, &mut staged.logs),
                Err(e) => {
                    fail_replicas(replicas, answers, &e.to_string());
                    return fail_all(accepted, &e.to_string());
                }
            }
        }
        if batch.is_empty() {
            for reply in accepted {
                let _ = reply.send(Ok(()));
            }
            self.answer_replicas(replicas, answers);
            return;
        }
        if staged.counters != self.counters {
            match self.shared.cf(CF_META) {
                Ok(meta) => batch.put_cf(meta, COUNTERS_KEY, staged.counters.encode()),
                Err(e) => {
                    fail_replicas(replicas, answers, &e.to_string());
                    return fail_all(accepted, &e.to_string());
                }
            }
        }
        let started = Instant::now();
        let written = self.shared.db.write_opt(batch, &self.durable);
        if self.shared.config.fsync == FsyncPolicy::Always {
            self.shared.fsync_durations.observe_since(started);
        }
        match written {
            Ok(()) => {
                self.apply(staged);
                self.commits.send_modify(|n| *n += 1);
                for reply in accepted {
                    let _ = reply.send(Ok(()));
                }
                self.answer_replicas(replicas, answers);
            }
            Err(e) => {
                tracing::error!(error = %e, "journal batch write failed");
                fail_replicas(replicas, answers, e.as_ref());
                fail_all(accepted, e.as_ref());
            }
        }
    }

    /// Answers replica requests whose changes are durable; a promise brings the entries
    /// above the log's acknowledged mark, read now.
    fn answer_replicas(&self, replicas: Vec<StagedReplica>, answers: &mut BatchAnswers) {
        for staged in replicas {
            let summary = staged.summary;
            let response = match staged.decided {
                Reply::Promised => {
                    let tail = match staged.pid_num {
                        Some(pid_num) => replica::read_entries(
                            &self.shared,
                            &staged.persistence_id,
                            pid_num,
                            summary.lac.saturating_add(1),
                            summary.last.seq,
                            replica::MAX_TAIL_ENTRIES + 1,
                            replica::MAX_TAIL_BYTES,
                        ),
                        None => Ok(Vec::new()),
                    };
                    match tail {
                        Ok(mut tail) => {
                            let complete = tail.last().is_none_or(|e| e.seq >= summary.last.seq);
                            tail.truncate(replica::MAX_TAIL_ENTRIES);
                            Ok(Response::Promised {
                                summary,
                                tail,
                                tail_complete: complete,
                            })
                        }
                        Err(e) => Err(e),
                    }
                }
                Reply::Appended => Ok(Response::Appended { summary }),
                Reply::Sealed => Ok(Response::Sealed { summary }),
                Reply::Installed => Ok(Response::Installed { summary }),
                Reply::Deleted => Ok(Response::Deleted { summary }),
                Reply::Fenced(promise) => Ok(Response::Fenced { promise }),
                Reply::Mismatch => Ok(Response::Mismatch { summary }),
                Reply::Invalid(reason) => Ok(Response::Invalid { reason }),
                Reply::Leased(remaining) => Ok(Response::Leased {
                    remaining_ms: tessera_replication::memory::remaining_ms(remaining),
                }),
                Reply::Confirmed(lease) => Ok(Response::Confirmed {
                    summary,
                    lease_ms: tessera_replication::memory::lease_ms(lease),
                }),
            };
            answers.answer(staged.reply, response);
        }
    }

    /// Decides a replica request with the replica rules against the log as stored, and adds
    /// what it changes to the batch: its entries (with their tag-index entries) and its
    /// replica state. Returns the decision's reply, the summary after it, and the log's number.
    fn stage_replica(
        &mut self,
        batch: &mut WriteBatch,
        staged: &mut Staged,
        pid: &str,
        request: Request<StoredEvent>,
    ) -> Result<(Reply, LogSummary, Option<u64>), JournalError> {
        let log = self.find_log(staged, pid)?;
        // The replica record as stored (its last entry and mark may be older than the log
        // record's progress), and the replica state the rules decide on.
        let stored = match &log {
            Some(log) => self.find_replica_record(log.pid_num)?,
            None => None,
        };
        let before = log
            .as_ref()
            .and_then(|log| replica::meta_or_legacy(stored.clone(), log));
        let rules = Rules::default();
        // Log number 0 is never given out: a log not held here has no entries to look up.
        let epochs = replica::StoredEpochs {
            shared: &self.shared,
            persistence_id: pid,
            pid_num: log.map_or(0, |l| l.pid_num),
        };
        let before_ref = before.as_ref();
        // The clock is read only for the requests leases concern: not for every append.
        if let Request::Prepare { epoch } = &request
            && let Some(held) =
                rules.held_off(&mut self.leases, pid, before_ref, *epoch, Instant::now())
        {
            let reply = Reply::Leased(held);
            let summary = LogMeta::summary_of(before_ref, &reply);
            return Ok((reply, summary, log.map(|l| l.pid_num)));
        }
        let mut lease = None;
        let Decision {
            meta,
            mutations,
            mut reply,
        } = match request {
            Request::Prepare { epoch } => rules.prepare(before_ref, epoch),
            Request::Confirm {
                epoch,
                prev,
                lac,
                config,
                lease_ms,
            } => {
                lease = Some((epoch, Duration::from_millis(lease_ms)));
                rules.append(before_ref, &epochs, epoch, prev, Vec::new(), lac, config)
            }
            Request::Append {
                epoch,
                prev,
                entries,
                lac,
                config,
            } => rules.append(before_ref, &epochs, epoch, prev, entries, lac, config),
            Request::Seal { epoch, at, config } => {
                rules.seal(before_ref, &epochs, epoch, at, config)
            }
            Request::Install {
                epoch,
                base,
                config,
            } => rules.install(before_ref, epoch, base, config),
            Request::DeleteTo { epoch, to } => rules.delete_to(before_ref, &epochs, epoch, to),
            Request::Locate | Request::Read { .. } => {
                return Err(JournalError::InvalidConfig(
                    "replica reads do not go through the writer".into(),
                ));
            }
        };
        if let (Some((epoch, requested)), Reply::Appended) = (lease, &reply) {
            // Granted as the confirmation is decided: a prepare staged after it sees it.
            reply = Reply::Confirmed(self.leases.grant(pid, epoch, requested, Instant::now()));
        }
        let summary = LogMeta::summary_of(meta.as_ref().or(before_ref), &reply);
        if meta.is_none() && mutations.is_empty() {
            return Ok((reply, summary, log.map(|l| l.pid_num)));
        }
        // Everything that can fail happens before the first change reaches the batch.
        let mut counters = staged.counters;
        let mut new_tags: Vec<(String, u64)> = Vec::new();
        let mut deletions = Vec::new();
        // An entry, its tag-index entries, a new log's name, the replica state.
        let mut ops = Vec::with_capacity(mutations.len() + 2);
        let mut log = match log {
            Some(log) => log,
            None => {
                let pid_num = counters.next_pid_num;
                counters.next_pid_num += 1;
                ops.push(Op::Put(
                    CF_META,
                    keys::pid_name_key(pid_num),
                    pid.as_bytes().to_vec(),
                ));
                CachedLog {
                    pid_num,
                    state: LogState::default(),
                    legacy_state: false,
                    progress: None,
                }
            }
        };
        for mutation in mutations {
            match mutation {
                Mutation::TruncateFrom(seq) => {
                    self.stage_truncate(&mut ops, staged, pid, &log, seq)?
                }
                Mutation::Put(entry) => {
                    let key = pair_key(log.pid_num, entry.seq);
                    let event = &entry.payload;
                    let offset = if event.tags.is_empty() {
                        0
                    } else {
                        counters.next_offset += 1;
                        counters.next_offset - 1
                    };
                    for tag in &event.tags {
                        let known =
                            staged.tags.get(tag.as_str()).copied().or_else(|| {
                                new_tags.iter().find(|(t, _)| t == tag).map(|(_, n)| *n)
                            });
                        let tag_num = match known {
                            Some(num) => num,
                            None => match self.find_tag(tag)? {
                                Some(num) => num,
                                None => {
                                    let num = counters.next_tag_num;
                                    counters.next_tag_num += 1;
                                    ops.push(Op::Put(
                                        CF_META,
                                        keys::tag_key(tag),
                                        num.to_be_bytes().to_vec(),
                                    ));
                                    new_tags.push((tag.clone(), num));
                                    num
                                }
                            },
                        };
                        ops.push(Op::Put(
                            CF_TAG_INDEX,
                            pair_key(tag_num, offset).to_vec(),
                            key.to_vec(),
                        ));
                    }
                    let value = record::encode_fields(
                        &key,
                        &EventFields {
                            epoch: entry.epoch,
                            offset,
                            timestamp_ms: event.timestamp_ms,
                            writer_id: &event.writer_id,
                            manifest: &event.manifest,
                            manifest_version: event.manifest_version,
                            tags: &event.tags,
                            payload: &event.payload,
                        },
                    );
                    ops.push(Op::Put(CF_EVENTS, key.to_vec(), value));
                    log.state.highest = log.state.highest.max(entry.seq);
                }
                Mutation::Reseal { seq, epoch } => {
                    let key = pair_key(log.pid_num, seq);
                    let events = self.shared.cf(CF_EVENTS)?;
                    let value = self.shared.db.get_cf(events, key)?.ok_or_else(|| {
                        JournalError::Corrupt {
                            persistence_id: pid.to_string(),
                            sequence_nr: seq,
                            detail: "the entry to seal is missing".into(),
                        }
                    })?;
                    let decoded = record::EventDecoder::new().decode(
                        &SmolStr::new(pid),
                        seq,
                        &key,
                        &value,
                    )?;
                    let resealed = record::encode_fields(
                        &key,
                        &EventFields {
                            epoch,
                            offset: decoded.offset,
                            timestamp_ms: decoded.repr.timestamp_ms,
                            writer_id: &decoded.repr.writer_id,
                            manifest: &decoded.repr.manifest.type_name,
                            manifest_version: decoded.repr.manifest.version,
                            tags: &decoded.tags,
                            payload: &decoded.repr.payload,
                        },
                    );
                    ops.push(Op::Put(CF_EVENTS, key.to_vec(), resealed));
                }
                Mutation::DeleteTo(to) => {
                    let to = to.min(log.state.highest);
                    if to > log.state.deleted_to {
                        let before = deletions
                            .iter()
                            .chain(staged.deletions.iter())
                            .rev()
                            .find(|(num, _)| *num == log.pid_num)
                            .map(|(_, pending)| pending)
                            .or_else(|| self.deletions.get(&log.pid_num));
                        let pending =
                            PendingDeletion::extended(before, log.state.deleted_to + 1, to);
                        log.state.deleted_to = to;
                        ops.push(Op::Put(
                            CF_META,
                            keys::deletion_key(log.pid_num),
                            pending.from.to_be_bytes().to_vec(),
                        ));
                        deletions.push((log.pid_num, pending));
                    }
                }
            }
        }
        if let Some(meta) = &meta {
            // The log record carries the last entry and the mark with every write; the
            // replica record is rewritten only when the rest of the state changes.
            if !stored
                .as_ref()
                .is_some_and(|stored| replica::record_holds(stored, meta))
            {
                ops.push(Op::Put(
                    CF_META,
                    keys::replica_key(log.pid_num),
                    replica::encode_meta(meta)?,
                ));
            }
            log.progress = Some(replica::progress_of(meta));
        }
        // From here on nothing fails.
        for op in ops {
            match op {
                Op::Put(cf, key, value) => batch.put_cf(self.shared.cf(cf)?, key, value),
                Op::Delete(cf, key) => batch.delete_cf(self.shared.cf(cf)?, key),
                Op::DeleteRange(cf, from, to) => {
                    batch.delete_range_cf(self.shared.cf(cf)?, from, to)
                }
            }
        }
        staged.counters = counters;
        for (tag, num) in new_tags {
            staged.tags.insert(tag, num);
        }
        staged.deletions.extend(deletions);
        if let Some(meta) = meta {
            staged.replicas.push((log.pid_num, meta));
        }
        let pid_num = log.pid_num;
        staged.logs.insert(pid.to_string(), log);
        Ok((reply, summary, Some(pid_num)))
    }

    /// Removes a replica's entries from `seq` on, with their tag-index entries (read from the
    /// records: they are few, the unacknowledged tail of a log).
    fn stage_truncate(
        &mut self,
        ops: &mut Vec<Op>,
        staged: &Staged,
        pid: &str,
        log: &CachedLog,
        seq: u64,
    ) -> Result<(), JournalError> {
        let shared = self.shared.clone();
        let events = shared.cf(CF_EVENTS)?;
        let mut options = rocksdb::ReadOptions::default();
        options.set_iterate_upper_bound(pair_upper_bound(log.pid_num, u64::MAX));
        let mut iter = shared.db.raw_iterator_cf_opt(events, options);
        iter.seek(pair_key(log.pid_num, seq));
        let name = SmolStr::new(pid);
        let mut decoder = record::EventDecoder::new();
        while let Some((key, value)) = iter.item() {
            let Some((_, at)) = keys::parse_pair(key) else {
                break;
            };
            match decoder.decode(&name, at, key, value) {
                Ok(decoded) => {
                    for tag in &decoded.tags {
                        let num = match staged.tags.get(tag.as_str()) {
                            Some(num) => Some(*num),
                            None => self.find_tag(tag)?,
                        };
                        if let Some(num) = num {
                            ops.push(Op::Delete(
                                CF_TAG_INDEX,
                                pair_key(num, decoded.offset).to_vec(),
                            ));
                        }
                    }
                }
                Err(e) => tracing::warn!(log = pid, seq = at, error = %e,
                    "truncating an unreadable entry; its tag-index entries stay"),
            }
            iter.next();
        }
        iter.status()?;
        ops.push(Op::DeleteRange(
            CF_EVENTS,
            pair_key(log.pid_num, seq).to_vec(),
            pair_upper_bound(log.pid_num, u64::MAX).to_vec(),
        ));
        Ok(())
    }

    fn apply(&mut self, staged: Staged) {
        for (pid, log) in staged.logs {
            self.logs.insert(pid, log);
        }
        for (tag, num) in staged.tags {
            self.tags.insert(tag, num);
        }
        for (pid_num, meta) in staged.replicas {
            self.replicas.insert(pid_num, Some(meta));
        }
        self.counters = staged.counters;
        for (pid_num, deletion) in staged.deletions {
            self.deletions
                .entry(pid_num)
                .and_modify(|pending| pending.to = pending.to.max(deletion.to))
                .or_insert(deletion);
        }
    }

    /// The log's number and state: staged in this group, cached, or read from RocksDB.
    fn find_log(&mut self, staged: &Staged, pid: &str) -> Result<Option<CachedLog>, JournalError> {
        if let Some(log) = staged.logs.get(pid) {
            return Ok(Some(*log));
        }
        if let Some(log) = self.logs.get(pid) {
            return Ok(Some(log));
        }
        let found = reader::log_of(&self.shared, pid)?;
        if let Some(log) = found {
            self.logs.insert(pid.to_string(), log);
        }
        Ok(found)
    }

    /// The replica record of log `pid_num`: cached, or read from RocksDB. The cache may hold
    /// a later last entry and mark than the stored record (the log record's progress
    /// overrides both anyway), never another promise, deleted prefix or configuration.
    fn find_replica_record(&mut self, pid_num: u64) -> Result<Option<LogMeta>, JournalError> {
        match self.replicas.get(&pid_num) {
            Some(stored) => Ok(stored),
            None => {
                let stored = replica::stored_meta(&self.shared, pid_num)?;
                self.replicas.insert(pid_num, stored.clone());
                Ok(stored)
            }
        }
    }

    /// The tag's number: cached or read from RocksDB (tags numbered in the current group are
    /// in `Staged::tags`, looked at by the caller).
    fn find_tag(&mut self, tag: &str) -> Result<Option<u64>, JournalError> {
        if let Some(num) = self.tags.get(tag) {
            return Ok(Some(num));
        }
        let found = reader::tag_num(&self.shared, tag)?;
        if let Some(num) = found {
            self.tags.insert(tag.to_string(), num);
        }
        Ok(found)
    }

    /// Adds a write to the batch, or refuses it having added nothing: every lookup that can
    /// fail happens before the first put.
    fn stage_append(
        &mut self,
        batch: &mut WriteBatch,
        staged: &mut Staged,
        write: &AtomicWrite,
    ) -> Result<(), JournalError> {
        let pid = write.persistence_id.as_str();
        let log = self.find_log(staged, pid)?;
        let highest = log.map_or(0, |l| l.state.highest);
        let first = write.events.first().map_or(0, |e| e.sequence_nr);
        if Some(first) != highest.checked_add(1) {
            return Err(JournalError::SequenceMismatch {
                persistence_id: pid.to_string(),
                expected: highest.saturating_add(1),
                got: first,
            });
        }
        let mut tag_nums: Vec<(&str, Option<u64>)> = Vec::new();
        for tag in write.events.iter().flat_map(|e| &e.tags) {
            if !tag_nums.iter().any(|(t, _)| *t == tag) {
                let num = match staged.tags.get(tag.as_str()) {
                    Some(num) => Some(*num),
                    None => self.find_tag(tag)?,
                };
                tag_nums.push((tag, num));
            }
        }
        let meta = self.shared.cf(CF_META)?;
        let events = self.shared.cf(CF_EVENTS)?;
        let tag_index = self.shared.cf(CF_TAG_INDEX)?;
        let pid_num = log.map_or(staged.counters.next_pid_num, |l| l.pid_num);
        let mut next_offset = staged.counters.next_offset;
        let mut records = Vec::with_capacity(write.events.len());
        for event in &write.events {
            let offset = if event.tags.is_empty() {
                0
            } else {
                next_offset += 1;
                next_offset - 1
            };
            let key = pair_key(pid_num, event.sequence_nr);
            let value = record::encode_event(&key, &write.writer_id, offset, event);
            records.push((key, offset, value));
        }

        // From here on nothing fails.
        staged.counters.next_offset = next_offset;
        let mut log = match log {
            Some(log) => log,
            None => {
                let pid_num = staged.counters.next_pid_num;
                staged.counters.next_pid_num += 1;
                batch.put_cf(meta, keys::pid_name_key(pid_num), pid.as_bytes());
                CachedLog {
                    pid_num,
                    state: LogState::default(),
                    legacy_state: false,
                    progress: None,
                }
            }
        };
        for (tag, num) in &mut tag_nums {
            if num.is_none() {
                let tag_num = staged.counters.next_tag_num;
                staged.counters.next_tag_num += 1;
                batch.put_cf(meta, keys::tag_key(tag), tag_num.to_be_bytes());
                staged.tags.insert(tag.to_string(), tag_num);
                *num = Some(tag_num);
            }
        }
        for (event, (key, offset, value)) in write.events.iter().zip(records) {
            batch.put_cf(events, key, value);
            for tag in &event.tags {
                if let Some((_, Some(tag_num))) = tag_nums.iter().find(|(t, _)| t == tag) {
                    batch.put_cf(tag_index, pair_key(*tag_num, offset), key);
                }
            }
            log.state.highest = event.sequence_nr;
        }
        staged.logs.insert(pid.to_string(), log);
        Ok(())
    }

    fn stage_delete(
        &mut self,
        batch: &mut WriteBatch,
        staged: &mut Staged,
        pid: &str,
        to_sequence_nr: u64,
    ) -> Result<(), JournalError> {
        let Some(mut log) = self.find_log(staged, pid)? else {
            return Ok(());
        };
        let to = to_sequence_nr.min(log.state.highest);
        if to <= log.state.deleted_to {
            return Ok(());
        }
        let meta = self.shared.cf(CF_META)?;
        // A deletion staged earlier in this group is pending too.
        let before = staged
            .deletions
            .iter()
            .rev()
            .find(|(num, _)| *num == log.pid_num)
            .map(|(_, pending)| pending)
            .or_else(|| self.deletions.get(&log.pid_num));
        let pending = PendingDeletion::extended(before, log.state.deleted_to + 1, to);
        log.state.deleted_to = to;
        batch.put_cf(
            meta,
            keys::deletion_key(log.pid_num),
            pending.from.to_be_bytes(),
        );
        staged.deletions.push((log.pid_num, pending));
        staged.logs.insert(pid.to_string(), log);
        Ok(())
    }

    /// Removes one chunk of deleted events, with their tag-index entries, from disk.
    fn physical_deletion_step(&mut self) {
        let Some((&pid_num, &pending)) = self.deletions.iter().next() else {
            return;
        };
        match self.delete_chunk(pid_num, pending) {
            Ok(Some(next_from)) => {
                if let Some(p) = self.deletions.get_mut(&pid_num) {
                    p.from = next_from;
                }
            }
            Ok(None) => {
                self.deletions.remove(&pid_num);
                if (pending.to + 1).saturating_sub(pending.first) < MIN_DELETED_EVENTS_TO_COMPACT {
                    return;
                }
                let _ = self.compactions.try_send((
                    pair_key(pid_num, 0).to_vec(),
                    pair_upper_bound(pid_num, pending.to).to_vec(),
                ));
            }
            Err(e) => {
                // The marker stays on disk: the next start tries again.
                tracing::warn!(pid_num, error = %e, "physical deletion of journal events failed");
                self.deletions.remove(&pid_num);
            }
        }
    }

    /// Deletes up to one read chunk of `pending`; returns where to continue, or `None` when
    /// the deletion is complete.
    fn delete_chunk(
        &mut self,
        pid_num: u64,
        pending: PendingDeletion,
    ) -> Result<Option<u64>, JournalError> {
        let shared = self.shared.clone();
        let events = shared.cf(CF_EVENTS)?;
        let tag_index = shared.cf(CF_TAG_INDEX)?;
        let meta = shared.cf(CF_META)?;
        let limit = shared.config.read_chunk_events;
        let mut options = rocksdb::ReadOptions::default();
        options.set_iterate_upper_bound(pair_upper_bound(pid_num, pending.to));
        let mut iter = shared.db.raw_iterator_cf_opt(events, options);
        iter.seek(pair_key(pid_num, pending.from));
        let mut batch = WriteBatch::default();
        let mut last_seen = None;
        let mut count = 0;
        // Only the offset and tags are needed; the name is not.
        let mut decoder = record::EventDecoder::new();
        let unnamed = smol_str::SmolStr::default();
        while count < limit {
            let Some((key, value)) = iter.item() else {
                break;
            };
            let Some((_, sequence_nr)) = keys::parse_pair(key) else {
                break;
            };
            match decoder.decode(&unnamed, sequence_nr, key, value) {
                Ok(decoded) => {
                    for tag in &decoded.tags {
                        if let Some(tag_num) = self.find_tag(tag)? {
                            batch.delete_cf(tag_index, pair_key(tag_num, decoded.offset));
                        }
                    }
                }
                Err(e) => tracing::warn!(pid_num, sequence_nr, error = %e,
                    "deleting an unreadable journal record; its tag-index entries stay"),
            }
            last_seen = Some(sequence_nr);
            count += 1;
            iter.next();
        }
        iter.status()?;
        let next_from = match last_seen {
            Some(last) if count == limit && last < pending.to => Some(last + 1),
            _ => None,
        };
        let end = match next_from {
            Some(next) => pair_key(pid_num, next),
            None => pair_upper_bound(pid_num, pending.to),
        };
        batch.delete_range_cf(events, pair_key(pid_num, pending.from), end);
        match next_from {
            Some(next) => batch.put_cf(meta, keys::deletion_key(pid_num), next.to_be_bytes()),
            None => batch.delete_cf(meta, keys::deletion_key(pid_num)),
        }
        drop(iter);
        shared.db.write_opt(batch, &self.relaxed)?;
        Ok(next_from)
    }
}

fn fail_replicas(replicas: Vec<StagedReplica>, answers: &mut BatchAnswers, message: &str) {
    for staged in replicas {
        answers.answer(
            staged.reply,
            Err(JournalError::Storage(message.to_string())),
        );
    }
}

/// One request of a group as the group is committed: a batch of replica requests is taken
/// apart into its requests.
enum Item {
    Replica(String, Request<StoredEvent>, ReplySlot),
    Other(WriterRequest),
}

fn fail_all(replies: Vec<oneshot::Sender<Result<(), JournalError>>>, message: &str) {
    for reply in replies {
        let _ = reply.send(Err(JournalError::Storage(message.to_string())));
    }
}
