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
use crate::error::JournalError;
use crate::record::{self, AtomicWrite};
use rocksdb::{WriteBatch, WriteOptions};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError};
use std::time::Instant;
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
}

impl WriterRequest {
    fn size_bytes(&self) -> usize {
        match self {
            WriterRequest::Append { write, .. } => write.payload_bytes(),
            _ => 0,
        }
    }
}

/// A log's number and state as the writer knows it.
type CachedLog = reader::Log;

/// Events of a log to remove from disk: `from..=to`.
#[derive(Debug, Clone, Copy)]
struct PendingDeletion {
    from: u64,
    to: u64,
}

/// What a group changes, applied to the writer's memory only once the batch is durable.
struct Staged {
    logs: HashMap<String, CachedLog>,
    tags: HashMap<String, u64>,
    counters: Counters,
    deletions: Vec<(u64, PendingDeletion)>,
}

struct Writer {
    shared: Arc<Shared>,
    logs: Recent<String, CachedLog>,
    tags: Recent<String, u64>,
    counters: Counters,
    deletions: BTreeMap<u64, PendingDeletion>,
    commits: watch::Sender<u64>,
    durable: WriteOptions,
    /// For physical deletion: losing it in a crash only means doing it again at start.
    relaxed: WriteOptions,
    compactions: std::sync::mpsc::SyncSender<(Vec<u8>, Vec<u8>)>,
    compactor: Option<std::thread::JoinHandle<()>>,
}

/// Starts the writer and its compaction thread; returns the request queue and the commit
/// counter that live queries watch.
pub(crate) fn start(
    shared: Arc<Shared>,
) -> Result<(SyncSender<WriterRequest>, watch::Receiver<u64>), JournalError> {
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
    let writer = Writer {
        shared,
        logs: Recent::new(MAX_CACHED_NAMES),
        tags: Recent::new(MAX_CACHED_NAMES),
        counters,
        deletions,
        commits,
        durable,
        relaxed: WriteOptions::default(),
        compactions,
        compactor: Some(compactor),
    };
    std::thread::Builder::new()
        .name("tessera-journal-writer".into())
        .spawn(move || writer.run(queue))
        .map_err(|e| JournalError::Storage(format!("cannot start the writer thread: {e}")))?;
    Ok((requests, committed))
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
        deletions.insert(
            pid_num,
            PendingDeletion {
                from,
                to: state.deleted_to,
            },
        );
        iter.next();
    }
    iter.status()?;
    Ok(deletions)
}

/// Writes a log's number and state, replacing a store-format-1 state record.
fn put_log(batch: &mut WriteBatch, meta: &rocksdb::ColumnFamily, pid: &str, log: &mut CachedLog) {
    batch.put_cf(
        meta,
        keys::pid_key(pid),
        keys::encode_log(log.pid_num, log.state),
    );
    if log.legacy_state {
        batch.delete_cf(meta, keys::legacy_state_key(log.pid_num));
        log.legacy_state = false;
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
        let compactor = self.compactor.take();
        // Dropping the writer drops the compaction queue's sender, which ends the compactor
        // after the compaction it may be running.
        drop(self);
        if let Some(compactor) = compactor {
            let _ = compactor.join();
        }
        let _ = reply.send(());
    }

    fn commit_group(&mut self, group: Vec<WriterRequest>) {
        let mut batch = WriteBatch::default();
        let mut staged = Staged {
            logs: HashMap::new(),
            tags: HashMap::new(),
            counters: self.counters,
            deletions: Vec::new(),
        };
        let mut accepted = Vec::with_capacity(group.len());
        for request in group {
            let (result, reply) = match request {
                WriterRequest::Append { write, reply } => {
                    (self.stage_append(&mut batch, &mut staged, &write), reply)
                }
                WriterRequest::DeleteTo {
                    persistence_id,
                    to_sequence_nr,
                    reply,
                } => (
                    self.stage_delete(&mut batch, &mut staged, &persistence_id, to_sequence_nr),
                    reply,
                ),
                WriterRequest::Close { .. } => continue,
            };
            match result {
                Ok(()) => accepted.push(reply),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            }
        }
        if batch.is_empty() {
            for reply in accepted {
                let _ = reply.send(Ok(()));
            }
            return;
        }
        if staged.counters != self.counters {
            match self.shared.cf(CF_META) {
                Ok(meta) => batch.put_cf(meta, COUNTERS_KEY, staged.counters.encode()),
                Err(e) => return fail_all(accepted, &e.to_string()),
            }
        }
        match self.shared.db.write_opt(batch, &self.durable) {
            Ok(()) => {
                self.apply(staged);
                self.commits.send_modify(|n| *n += 1);
                for reply in accepted {
                    let _ = reply.send(Ok(()));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "journal batch write failed");
                fail_all(accepted, e.as_ref());
            }
        }
    }

    fn apply(&mut self, staged: Staged) {
        for (pid, log) in staged.logs {
            self.logs.insert(pid, log);
        }
        for (tag, num) in staged.tags {
            self.tags.insert(tag, num);
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
        put_log(batch, meta, pid, &mut log);
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
        let from = self
            .deletions
            .get(&log.pid_num)
            .map_or(log.state.deleted_to + 1, |pending| pending.from);
        log.state.deleted_to = to;
        put_log(batch, meta, pid, &mut log);
        batch.put_cf(meta, keys::deletion_key(log.pid_num), from.to_be_bytes());
        staged
            .deletions
            .push((log.pid_num, PendingDeletion { from, to }));
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

fn fail_all(replies: Vec<oneshot::Sender<Result<(), JournalError>>>, message: &str) {
    for reply in replies {
        let _ = reply.send(Err(JournalError::Storage(message.to_string())));
    }
}
