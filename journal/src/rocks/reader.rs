//! Reading the journal: point lookups of a log's number and state, and cursors that read one
//! chunk of a replay or query at a time.
//!
//! [`stream`] turns a cursor into a stream. It reads a small first chunk in the consumer's
//! task, and every later chunk on tokio's blocking pool while the consumer works through the
//! current one, so a long replay keeps RocksDB and the consumer busy at the same time; live
//! streams wait on the writer's commit counter when caught up. Each record is verified and
//! decoded on the consumer's side only as the consumer takes it, so a chunk is never held
//! decoded in full; payloads are slices of the buffer a chunk was read into.

use super::Shared;
use super::keys::{
    self, CF_EVENTS, CF_META, CF_TAG_INDEX, LogState, pair_key, pair_upper_bound, parse_pair,
};
use super::recent::Recent;
use crate::error::JournalError;
use crate::journal::{JournalStream, QueryMode};
use crate::record::{EventDecoder, EventEnvelope, PAYLOAD_ARENA_BYTES, PersistentRepr};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use smol_str::SmolStr;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Names (pid number → persistence id) a tag query is sure to remember if used in a row; it
/// holds at most twice as many (see [`Recent`]).
const MAX_REMEMBERED_NAMES: usize = 10_000;

/// A log as its metadata describes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Log {
    pub pid_num: u64,
    pub state: LogState,
    /// Its state is a store-format-1 record of its own, to be replaced at the next write.
    pub legacy_state: bool,
    /// Where this replica's copy stands, for a replicated log written by store format 6 or
    /// later (it overrides the replica state record's last entry and mark).
    pub progress: Option<keys::ReplicaProgress>,
}

/// The number and state of a log, `None` if it was never written: one lookup, more for a log
/// last written in store format 1.
pub(crate) fn log_of(shared: &Shared, persistence_id: &str) -> Result<Option<Log>, JournalError> {
    let meta = shared.cf(CF_META)?;
    let log = read_log(persistence_id, |key| shared.db.get_pinned_cf(meta, key))?;
    if !log.is_some_and(|log| log.legacy_state) {
        return Ok(log);
    }
    // A format-1 log's number and state are two records, which the writer may replace with
    // one format-2 record between the two lookups: then the state would read as missing.
    // Read again, both from one snapshot.
    let snapshot = shared.db.snapshot();
    read_log(persistence_id, |key| snapshot.get_pinned_cf(meta, key))
}

/// [`log_of`] as of `snapshot`.
pub(crate) fn log_at(
    shared: &Shared,
    snapshot: &rocksdb::Snapshot<'_>,
    persistence_id: &str,
) -> Result<Option<Log>, JournalError> {
    let meta = shared.cf(CF_META)?;
    read_log(persistence_id, |key| snapshot.get_pinned_cf(meta, key))
}

/// Reads a log's records through `get`, of either store format.
fn read_log<'db>(
    persistence_id: &str,
    get: impl Fn(&[u8]) -> Result<Option<rocksdb::DBPinnableSlice<'db>>, rocksdb::Error>,
) -> Result<Option<Log>, JournalError> {
    let corrupt = |what: &str| {
        JournalError::CorruptMetadata(format!("malformed {what} of log {persistence_id}"))
    };
    let Some(value) = get(&keys::pid_key(persistence_id))? else {
        return Ok(None);
    };
    let (pid_num, state) = keys::decode_log(&value).ok_or_else(|| corrupt("record"))?;
    let progress = keys::decode_log_progress(&value);
    let (state, legacy_state) = match state {
        Some(state) => (state, false),
        None => match get(&keys::legacy_state_key(pid_num))? {
            None => (LogState::default(), true),
            Some(value) => (
                LogState::decode(&value).ok_or_else(|| corrupt("state"))?,
                true,
            ),
        },
    };
    Ok(Some(Log {
        pid_num,
        state,
        legacy_state,
        progress,
    }))
}

/// The state of a log, the default one if it was never written.
pub(crate) fn state_of(shared: &Shared, persistence_id: &str) -> Result<LogState, JournalError> {
    Ok(log_of(shared, persistence_id)?
        .map(|log| log.state)
        .unwrap_or_default())
}

/// The number of a tag, `None` if no event ever carried it.
pub(crate) fn tag_num(shared: &Shared, tag: &str) -> Result<Option<u64>, JournalError> {
    match shared
        .db
        .get_pinned_cf(shared.cf(CF_META)?, keys::tag_key(tag))?
    {
        None => Ok(None),
        Some(value) => keys::decode_u64(&value)
            .map(Some)
            .ok_or_else(|| JournalError::CorruptMetadata(format!("malformed number of tag {tag}"))),
    }
}

/// The persistence id of log number `pid_num`.
pub(crate) fn pid_name(shared: &Shared, pid_num: u64) -> Result<SmolStr, JournalError> {
    let value = shared
        .db
        .get_pinned_cf(shared.cf(CF_META)?, keys::pid_name_key(pid_num))?
        .ok_or_else(|| {
            JournalError::CorruptMetadata(format!("no persistence id for log number {pid_num}"))
        })?;
    std::str::from_utf8(&value).map(SmolStr::new).map_err(|_| {
        JournalError::CorruptMetadata(format!("persistence id of log {pid_num} is not UTF-8"))
    })
}

/// Maps a RocksDB error met while reading `persistence_id` at `sequence_nr`: RocksDB's own
/// checksums (blocks, WAL) report altered bytes before ours can.
fn read_error(e: rocksdb::Error, persistence_id: &str, sequence_nr: u64) -> JournalError {
    if e.kind() == rocksdb::ErrorKind::Corruption {
        JournalError::Corrupt {
            persistence_id: persistence_id.to_string(),
            sequence_nr,
            detail: e.to_string(),
        }
    } else {
        JournalError::Storage(e.to_string())
    }
}

/// What an event record takes on disk, for sizing a replay's first read ahead of time: a
/// small event with its header and checksum. Later reads of the replay go by the sizes of
/// the records already read.
const RECORD_BYTES_ESTIMATE: usize = 160;

/// The most a replay reads ahead from a file in one go (RocksDB's own limit for its
/// automatic readahead).
const MAX_READAHEAD_BYTES: usize = 256 * 1024;

/// One read step of a cursor.
pub(crate) struct Chunk<R> {
    /// What was read, not yet decoded.
    pub raw: R,
    /// Nothing more is stored right now.
    pub caught_up: bool,
    /// The read stopped at this error after `raw`; the stream ends with it.
    pub error: Option<JournalError>,
}

impl<R> Chunk<R> {
    fn complete(raw: R, caught_up: bool) -> Self {
        Chunk {
            raw,
            caught_up,
            error: None,
        }
    }
}

/// A position in a replay or query that can read its next chunk.
///
/// Reading (`read_chunk`, on the blocking pool but for a replay's small first chunk) and
/// decoding (`next_item`, in the stream's task) are separate so that a long replay verifies
/// checksums and decodes one chunk while RocksDB reads the next on another core.
pub(crate) trait Cursor: Send + 'static {
    /// Whether the first chunk is read in the stream's task (see
    /// `JournalConfig::inline_read_events`): for sequential reads of one log, not for queries
    /// that look records up one by one.
    const READ_FIRST_INLINE: bool = false;
    /// What a read step yields, from which the stream takes items one by one.
    type Raw: Send + 'static;
    /// What the stream yields.
    type Item: Send + 'static;
    /// State kept by the stream for decoding.
    type Decoder: Send + 'static;
    /// The decoder for this cursor's chunks.
    fn decoder(&self) -> Self::Decoder;
    /// Reads the next chunk of at most `limit` items and moves past it.
    fn read_chunk(
        &mut self,
        shared: &Shared,
        limit: usize,
    ) -> Result<Chunk<Self::Raw>, JournalError>;
    /// Takes the next item out of a chunk, `None` once it is used up or at a record that
    /// cannot be handed out: then [`Cursor::failure`] says why, and the stream ends with
    /// that error, dropping the chunk without asking it for more. (An item rather than a
    /// `Result`: the event is then built where the stream hands it out from, rather than
    /// moved through a temporary of each enum layer.)
    fn next_item(decoder: &mut Self::Decoder, raw: &mut Self::Raw) -> Option<Self::Item>;
    /// Why [`Cursor::next_item`] stopped before the end of the chunk, if it did.
    fn failure(_raw: &mut Self::Raw) -> Option<JournalError> {
        None
    }
    /// Nothing can ever follow (a bound or a maximum count was reached).
    fn finished(&self) -> bool;
}

/// Event records of one log copied out of RocksDB, verified and decoded one at a time as the
/// stream hands them out.
pub(crate) struct RawEvents {
    pid_num: u64,
    /// The records' values, back to back.
    values: Bytes,
    /// Payloads are handed out as slices of `values` rather than copied (see
    /// [`RawEvents::new`]).
    share_payloads: bool,
    /// Sequence number and end offset in `values` of each record.
    records: Vec<(u64, usize)>,
    /// The next record to hand out.
    next: usize,
    /// Why the record before `next` could not be handed out; nothing after it is.
    failure: Option<JournalError>,
}

impl RawEvents {
    fn new(pid_num: u64, values: Vec<u8>, records: Vec<(u64, usize)>) -> Self {
        // A small chunk's payloads are handed out as slices of the buffer it was read into; a
        // larger chunk's are copied into the decoder's arena, so that a payload a consumer
        // keeps never keeps more than an arena's worth of other records alive.
        let share_payloads = values.capacity() <= PAYLOAD_ARENA_BYTES;
        RawEvents {
            pid_num,
            values: Bytes::from(values),
            share_payloads,
            records,
            next: 0,
            failure: None,
        }
    }

    fn empty() -> Self {
        RawEvents::new(0, Vec::new(), Vec::new())
    }

    /// Where record `index` starts in `values`.
    fn start_of(&self, index: usize) -> usize {
        match index.checked_sub(1) {
            Some(previous) => self.records[previous].1,
            None => 0,
        }
    }
}

/// Verifies and decodes [`RawEvents`].
pub(crate) struct LogDecoder {
    persistence_id: SmolStr,
    decoder: EventDecoder,
}

/// Events of one log, for replays and `events_by_persistence_id`.
pub(crate) struct EventCursor {
    persistence_id: SmolStr,
    next_sequence_nr: u64,
    to_sequence_nr: u64,
    remaining: u64,
    mode: QueryMode,
    /// A current query ends at the highest sequence number it found first.
    end_fixed: bool,
    /// Bytes per record to expect on disk: an estimate for the first chunk, then what the
    /// previous chunk's records took.
    record_bytes: usize,
}

impl EventCursor {
    pub fn new(persistence_id: &str, from: u64, to: u64, max: u64, mode: QueryMode) -> Self {
        EventCursor {
            persistence_id: SmolStr::new(persistence_id),
            next_sequence_nr: from.max(1),
            to_sequence_nr: to,
            remaining: max,
            mode,
            end_fixed: false,
            record_bytes: RECORD_BYTES_ESTIMATE,
        }
    }

    fn missing(&self, from: u64, to: u64) -> JournalError {
        JournalError::Corrupt {
            persistence_id: self.persistence_id.to_string(),
            sequence_nr: from,
            detail: format!("events {from}..={to} are missing although the log reaches {to}"),
        }
    }
}

impl Cursor for EventCursor {
    const READ_FIRST_INLINE: bool = true;
    type Raw = RawEvents;
    type Item = PersistentRepr;
    type Decoder = LogDecoder;

    fn decoder(&self) -> LogDecoder {
        LogDecoder {
            persistence_id: self.persistence_id.clone(),
            decoder: EventDecoder::new(),
        }
    }

    // Inlined into the stream's `poll_next`, so that the event is decoded into the slot the
    // stream hands it out from.
    #[inline(always)]
    fn next_item(decoder: &mut LogDecoder, raw: &mut RawEvents) -> Option<PersistentRepr> {
        let index = raw.next;
        let &(sequence_nr, end) = raw.records.get(index)?;
        raw.next += 1;
        let range = raw.start_of(index)..end;
        let key = pair_key(raw.pid_num, sequence_nr);
        let persistence_id = &decoder.persistence_id;
        let decoded = if raw.share_payloads {
            decoder
                .decoder
                .decode_shared(persistence_id, sequence_nr, &key, &raw.values, range)
        } else {
            let value = raw.values.get(range).unwrap_or_default();
            decoder
                .decoder
                .decode_copied(persistence_id, sequence_nr, &key, value)
        };
        match decoded {
            Ok(event) => Some(event),
            Err(e) => {
                // Nothing after a record that fails its check or decoding is handed out.
                raw.next = raw.records.len();
                raw.failure = Some(e);
                None
            }
        }
    }

    fn failure(raw: &mut RawEvents) -> Option<JournalError> {
        raw.failure.take()
    }

    fn read_chunk(
        &mut self,
        shared: &Shared,
        limit: usize,
    ) -> Result<Chunk<RawEvents>, JournalError> {
        let caught_up = || Chunk::complete(RawEvents::empty(), true);
        let Some(Log { pid_num, state, .. }) = log_of(shared, &self.persistence_id)? else {
            return Ok(caught_up());
        };
        if self.mode == QueryMode::Current && !self.end_fixed {
            self.to_sequence_nr = self.to_sequence_nr.min(state.highest);
            self.end_fixed = true;
        }
        let start = self
            .next_sequence_nr
            .max(state.deleted_to.saturating_add(1));
        let end = self.to_sequence_nr.min(state.highest);
        if start > end || self.remaining == 0 {
            self.next_sequence_nr = start;
            return Ok(caught_up());
        }
        let limit = (limit as u64).min(self.remaining).min(end - start + 1);

        let events = shared.cf(CF_EVENTS)?;
        let mut options = rocksdb::ReadOptions::default();
        // Read the whole range from the file at once rather than block by block: RocksDB's own
        // readahead starts only after two reads of one iterator, while the records wanted
        // here are known to lie together. Measured over six paired runs: replays of 10,000
        // logs of 100 events (about four blocks each) 5-10% faster. The same bound keeps the
        // buffer's first allocation moderate for large events; it grows as needed.
        let expected_bytes = (limit as usize)
            .saturating_mul(self.record_bytes)
            .min(MAX_READAHEAD_BYTES);
        options.set_readahead_size(expected_bytes);
        // A replay reads a log once (an entity recovering, a projection catching up), so its
        // blocks are not put into the block cache, where they would only evict blocks that
        // are read again. Each block is then decompressed into the iterator and dropped
        // when it moves on, without the cache's lookup, insertion and eviction (measured:
        // replays of 10,000 logs of 100 events 20% faster, of one long log 20% faster). A
        // log replayed again soon is read again from the operating system's page cache.
        options.fill_cache(false);
        let mut iter = shared.db.raw_iterator_cf_opt(events, options);
        iter.seek(pair_key(pid_num, start));
        let mut values = Vec::with_capacity(expected_bytes);
        let mut records = Vec::with_capacity(limit as usize);
        let mut expected = start;
        // No upper bound is set: the loop stops at the last record it wants without stepping
        // past it, and at a key of another log. With a bound and the readahead above, RocksDB
        // compared every key with the bound (measured: a twentieth of a replay of 100 events).
        // `limit` is at least 1 here.
        while let Some((key, value)) = iter.item() {
            let Some((key_pid_num, sequence_nr)) = parse_pair(key) else {
                return Err(self.missing(expected, end));
            };
            if key_pid_num != pid_num || sequence_nr > end {
                break;
            }
            if sequence_nr != expected {
                // A gap is only legitimate if a delete_to committed since the state was read.
                let now = state_of(shared, &self.persistence_id)?;
                if now.deleted_to < sequence_nr - 1 {
                    return Err(self.missing(expected, sequence_nr - 1));
                }
            }
            // Checksums are verified and records decoded in the consumer's task, while this
            // thread reads the next chunk: the replay's work is split over two cores, and the
            // blocking thread does no more than RocksDB's own iteration and a copy.
            values.extend_from_slice(value);
            records.push((sequence_nr, values.len()));
            expected = sequence_nr + 1;
            if records.len() as u64 == limit {
                break;
            }
            iter.next();
        }
        let read = records.len() as u64;
        self.remaining -= read;
        if read > 0 {
            self.record_bytes = values.len() / records.len();
        }
        let raw = RawEvents::new(pid_num, values, records);
        if let Err(e) = iter.status() {
            self.next_sequence_nr = expected;
            return Ok(Chunk {
                raw,
                caught_up: true,
                error: Some(read_error(e, &self.persistence_id, expected)),
            });
        }
        if read < limit && expected <= end {
            let now = state_of(shared, &self.persistence_id)?;
            if now.deleted_to < end {
                return Err(self.missing(expected, end));
            }
            expected = end + 1;
        }
        self.next_sequence_nr = expected;
        Ok(Chunk::complete(raw, expected > end))
    }

    fn finished(&self) -> bool {
        self.remaining == 0 || self.next_sequence_nr > self.to_sequence_nr
    }
}

/// Events carrying one tag, in offset order.
pub(crate) struct TagCursor {
    tag: String,
    tag_num: Option<u64>,
    after_offset: u64,
    names: Recent<u64, SmolStr>,
    decoder: EventDecoder,
}

impl TagCursor {
    pub fn new(tag: &str, after_offset: u64) -> Self {
        TagCursor {
            tag: tag.to_string(),
            tag_num: None,
            after_offset,
            names: Recent::new(MAX_REMEMBERED_NAMES),
            decoder: EventDecoder::new(),
        }
    }
}

impl Cursor for TagCursor {
    /// Events by tag come from many logs by point lookups; they are decoded as they are read.
    type Raw = std::vec::IntoIter<EventEnvelope>;
    type Item = EventEnvelope;
    type Decoder = ();

    fn decoder(&self) {}

    fn next_item(_: &mut (), raw: &mut Self::Raw) -> Option<EventEnvelope> {
        raw.next()
    }

    fn read_chunk(
        &mut self,
        shared: &Shared,
        limit: usize,
    ) -> Result<Chunk<Self::Raw>, JournalError> {
        let tag_num = match self.tag_num {
            Some(n) => n,
            None => match tag_num(shared, &self.tag)? {
                Some(n) => *self.tag_num.insert(n),
                None => return Ok(Chunk::complete(Vec::new().into_iter(), true)),
            },
        };
        let mut entries = Vec::with_capacity(limit);
        {
            let mut options = rocksdb::ReadOptions::default();
            options.set_iterate_upper_bound(pair_upper_bound(tag_num, u64::MAX));
            let mut iter = shared
                .db
                .raw_iterator_cf_opt(shared.cf(CF_TAG_INDEX)?, options);
            iter.seek(pair_key(tag_num, self.after_offset.saturating_add(1)));
            while entries.len() < limit {
                let Some((key, value)) = iter.item() else {
                    break;
                };
                let (Some((_, offset)), Some((pid_num, sequence_nr))) =
                    (parse_pair(key), parse_pair(value))
                else {
                    return Err(JournalError::CorruptMetadata(format!(
                        "malformed tag index entry of tag {}",
                        self.tag
                    )));
                };
                entries.push((offset, pid_num, sequence_nr));
                iter.next();
            }
            iter.status()?;
        }
        let mut states: HashMap<u64, LogState> = HashMap::new();
        let events = shared.cf(CF_EVENTS)?;
        let mut items = Vec::with_capacity(entries.len());
        for &(offset, pid_num, sequence_nr) in &entries {
            self.after_offset = offset;
            let persistence_id = match self.names.get(&pid_num) {
                Some(name) => name,
                None => {
                    let name = pid_name(shared, pid_num)?;
                    self.names.insert(pid_num, name.clone());
                    name
                }
            };
            let deleted_to = match states.get(&pid_num) {
                Some(state) => state.deleted_to,
                None => {
                    states
                        .entry(pid_num)
                        .or_insert(state_of(shared, &persistence_id)?)
                        .deleted_to
                }
            };
            if sequence_nr <= deleted_to {
                continue;
            }
            let key = pair_key(pid_num, sequence_nr);
            let Some(value) = shared
                .db
                .get_pinned_cf(events, key)
                .map_err(|e| read_error(e, &persistence_id, sequence_nr))?
            else {
                // Deleted physically after the index was read.
                continue;
            };
            match self
                .decoder
                .decode(&persistence_id, sequence_nr, &key, &value)
            {
                Ok(decoded) => items.push(EventEnvelope {
                    offset,
                    event: decoded.repr,
                    tags: decoded.tags,
                }),
                Err(e) => {
                    return Ok(Chunk {
                        raw: items.into_iter(),
                        caught_up: true,
                        error: Some(e),
                    });
                }
            }
        }
        Ok(Chunk::complete(items.into_iter(), entries.len() < limit))
    }

    fn finished(&self) -> bool {
        false
    }
}

/// Persistence ids in the order of their first write.
#[derive(Default)]
pub(crate) struct PersistenceIdCursor {
    after_pid_num: u64,
}

impl Cursor for PersistenceIdCursor {
    type Raw = std::vec::IntoIter<String>;
    type Item = String;
    type Decoder = ();

    fn decoder(&self) {}

    fn next_item(_: &mut (), raw: &mut Self::Raw) -> Option<String> {
        raw.next()
    }

    fn read_chunk(
        &mut self,
        shared: &Shared,
        limit: usize,
    ) -> Result<Chunk<Self::Raw>, JournalError> {
        let mut options = rocksdb::ReadOptions::default();
        options.set_iterate_upper_bound(keys::pid_name_upper_bound());
        let mut iter = shared.db.raw_iterator_cf_opt(shared.cf(CF_META)?, options);
        iter.seek(keys::pid_name_key(self.after_pid_num.saturating_add(1)));
        let mut items = Vec::new();
        while items.len() < limit {
            let Some((key, value)) = iter.item() else {
                break;
            };
            let pid_num = keys::parse_pid_name_key(key).ok_or_else(|| {
                JournalError::CorruptMetadata("malformed persistence-id record".into())
            })?;
            let name = String::from_utf8(value.to_vec()).map_err(|_| {
                JournalError::CorruptMetadata(format!(
                    "persistence id of log {pid_num} is not UTF-8"
                ))
            })?;
            items.push(name);
            self.after_pid_num = pid_num;
            iter.next();
        }
        iter.status()?;
        let caught_up = items.len() < limit;
        Ok(Chunk::complete(items.into_iter(), caught_up))
    }

    fn finished(&self) -> bool {
        false
    }
}

/// A chunk as a reader hands it over.
type ReadAhead<C> = Result<Chunk<<C as Cursor>::Raw>, JournalError>;

/// What a reader gives back when it stops: the cursor, and the chunk it read last but did
/// not send (its last one, or one the stream had no room for); none if the stream is gone.
type ReaderEnd<C> = (C, Option<ReadAhead<C>>);

/// Chunks a reader keeps ready beyond the one the stream is going through. One is enough for
/// a reader to stay ahead of a consumer that keeps up with it; each is at most
/// `read_chunk_events` events. A reader that finds no room stops with the chunk it read, so
/// a stream holds at most three chunks: in hand, ready, and left over.
const READ_AHEAD_CHUNKS: usize = 1;

/// A live query's wait for the next commit; it owns the commit counter while it waits and
/// gives it back, with whether the journal is still open.
type CommitWait = Pin<Box<dyn Future<Output = (watch::Receiver<u64>, bool)> + Send>>;

/// Where a stream gets its next chunk from.
enum Step<C: Cursor> {
    /// Nothing read yet: the first chunk is small and read in the stream's own task (see
    /// [`Cursor::READ_FIRST_INLINE`]).
    First(C),
    /// A reader is to be started on the blocking pool.
    Read(C),
    /// A reader on the blocking pool reads chunk after chunk into `chunks` (see
    /// [`read_ahead`]); `reader` gives the cursor back with the chunk it read last.
    Reading {
        chunks: tokio::sync::mpsc::Receiver<ReadAhead<C>>,
        reader: JoinHandle<ReaderEnd<C>>,
    },
    /// Caught up in a live query: wait for the next commit.
    AwaitCommit {
        cursor: C,
        wait: CommitWait,
    },
    Done,
}

/// The stream of a cursor, current (`commits` is `None`) or live: it hands out the items of
/// the chunk in hand one by one, decoding each as it is taken, and gets chunks as `step`
/// says. Written out as one state machine rather than composed from `unfold` and `flat_map`:
/// a replay moves every event through here, and each layer of adapters costs a move of the
/// event and a poll per event, and every stream an allocation.
struct CursorStream<C: Cursor> {
    shared: Arc<Shared>,
    /// `Some` for a live query, unless a commit wait holds it.
    commits: Option<watch::Receiver<u64>>,
    step: Step<C>,
    decoder: C::Decoder,
    /// The rest of the current chunk.
    chunk: Option<C::Raw>,
    /// The error the current chunk ends with, after its items.
    error: Option<JournalError>,
}

/// Reads chunks of `cursor` one after the other and sends them to the stream, until one is
/// the last (caught up, at the end, or failed) or the stream is behind: then it returns the
/// cursor with that chunk, which the stream takes after the ones sent before it. It stops
/// without one when the stream is gone.
///
/// The reader goes on with the next chunk while the stream goes through the previous ones:
/// waiting for the stream to take each chunk before starting the next (a hop to the
/// consumer's task and a new blocking task per chunk) left RocksDB idle for a tenth of a
/// long replay (measured). It never waits for the stream, though: a stream whose consumer
/// pauses (a slow client, a projection waiting on something else) would hold a thread of
/// the blocking pool for as long, and a few hundred of them would starve every other user
/// of the pool. The stream starts a new reader once it takes the chunk left over.
fn read_ahead<C: Cursor>(
    shared: &Shared,
    mut cursor: C,
    chunks: &tokio::sync::mpsc::Sender<ReadAhead<C>>,
) -> ReaderEnd<C> {
    use tokio::sync::mpsc::error::TrySendError;
    let limit = shared.config.read_chunk_events;
    loop {
        let read = cursor.read_chunk(shared, limit);
        let last = match &read {
            Ok(chunk) => chunk.error.is_some() || chunk.caught_up || cursor.finished(),
            Err(_) => true,
        };
        if last {
            return (cursor, Some(read));
        }
        match chunks.try_send(read) {
            Ok(()) => {}
            Err(TrySendError::Closed(_)) => return (cursor, None),
            Err(TrySendError::Full(left_over)) => return (cursor, Some(left_over)),
        }
    }
}

fn reader_failed(e: tokio::task::JoinError) -> JournalError {
    JournalError::Storage(format!("journal reader failed: {e}"))
}

impl<C: Cursor> CursorStream<C> {
    /// Marks the commit counter seen, so that a commit landing while the next read runs
    /// wakes the stream afterwards.
    fn mark_commits_seen(&mut self) {
        if let Some(commits) = &mut self.commits {
            commits.borrow_and_update();
        }
    }

    /// Starts a reader of the cursor's next chunks on the blocking pool.
    fn read(&mut self, cursor: C) -> Step<C> {
        self.mark_commits_seen();
        let shared = self.shared.clone();
        let (sender, chunks) = tokio::sync::mpsc::channel(READ_AHEAD_CHUNKS);
        let reader = tokio::task::spawn_blocking(move || read_ahead(&shared, cursor, &sender));
        Step::Reading { chunks, reader }
    }

    /// Reads the cursor's first chunk in this task. Most logs are short (an entity's events
    /// since its last snapshot), and for them the hop to a blocking thread and back costs
    /// more than the read itself; a long replay reads on from the blocking pool, ahead of the
    /// consumer.
    fn read_first(&mut self, mut cursor: C) -> Result<(), JournalError> {
        self.mark_commits_seen();
        let config = &self.shared.config;
        let limit = config.read_chunk_events.min(config.inline_read_events);
        let chunk = cursor.read_chunk(&self.shared, limit)?;
        self.take_last(cursor, chunk);
        Ok(())
    }

    /// Makes `chunk`, the last one `cursor` read, the one in hand, and sets out what follows
    /// it (a new reader if there is more to read, reading on while the consumer goes through
    /// this one).
    fn take_last(&mut self, cursor: C, chunk: Chunk<C::Raw>) {
        self.step = self.after(cursor, &chunk);
        self.take(chunk);
    }

    /// What follows `chunk`, read last by `cursor`.
    fn after(&mut self, cursor: C, chunk: &Chunk<C::Raw>) -> Step<C> {
        if chunk.error.is_some() || cursor.finished() {
            Step::Done
        } else if !chunk.caught_up {
            self.read(cursor)
        } else if let Some(mut commits) = self.commits.take() {
            let wait = Box::pin(async move {
                // An error means the writer stopped: the journal was closed.
                let open = commits.changed().await.is_ok();
                (commits, open)
            });
            Step::AwaitCommit { cursor, wait }
        } else {
            Step::Done
        }
    }

    /// Makes `chunk` the one in hand.
    fn take(&mut self, chunk: Chunk<C::Raw>) {
        self.chunk = Some(chunk.raw);
        self.error = chunk.error;
    }

    /// Hands out `e` as the last item: what is left of the chunk, its read error and the read
    /// ahead (with the reader's other resources) are dropped at once.
    fn end_with(&mut self, e: JournalError) -> Option<Result<C::Item, JournalError>> {
        self.chunk = None;
        self.error = None;
        self.step = Step::Done;
        Some(Err(e))
    }

    /// Gets the next chunk into hand: `Ready(Ok(true))` when there is one, `Ready(Ok(false))`
    /// at the end. Out of line: it runs once a chunk, and inlined into `poll_next` it made
    /// the loop over the chunk's events slower (measured).
    #[inline(never)]
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Result<bool, JournalError>> {
        loop {
            match std::mem::replace(&mut self.step, Step::Done) {
                Step::Done => return Poll::Ready(Ok(false)),
                Step::First(cursor) => {
                    self.read_first(cursor)?;
                    return Poll::Ready(Ok(true));
                }
                Step::Read(cursor) => self.step = self.read(cursor),
                Step::Reading {
                    mut chunks,
                    mut reader,
                } => match chunks.poll_recv(cx) {
                    Poll::Pending => {
                        self.step = Step::Reading { chunks, reader };
                        return Poll::Pending;
                    }
                    Poll::Ready(Some(read)) => {
                        self.step = Step::Reading { chunks, reader };
                        self.take(read?);
                        return Poll::Ready(Ok(true));
                    }
                    // The reader stopped, after the chunks it sent: it gives back the cursor
                    // with the chunk it read last, or it panicked.
                    Poll::Ready(None) => match Pin::new(&mut reader).poll(cx) {
                        Poll::Pending => {
                            self.step = Step::Reading { chunks, reader };
                            return Poll::Pending;
                        }
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(reader_failed(e))),
                        Poll::Ready(Ok((cursor, Some(read)))) => {
                            self.take_last(cursor, read?);
                            return Poll::Ready(Ok(true));
                        }
                        Poll::Ready(Ok((_, None))) => {
                            return Poll::Ready(Err(JournalError::Storage(
                                "journal reader stopped".into(),
                            )));
                        }
                    },
                },
                Step::AwaitCommit { cursor, mut wait } => match wait.as_mut().poll(cx) {
                    Poll::Pending => {
                        self.step = Step::AwaitCommit { cursor, wait };
                        return Poll::Pending;
                    }
                    Poll::Ready((commits, open)) => {
                        self.commits = Some(commits);
                        if !open {
                            return Poll::Ready(Ok(false));
                        }
                        self.step = Step::Read(cursor);
                    }
                },
            }
        }
    }
}

/// The stream of `cursor`: current (`commits` is `None`) or live.
pub(crate) fn stream<C: Cursor>(
    shared: Arc<Shared>,
    cursor: C,
    commits: Option<watch::Receiver<u64>>,
) -> JournalStream<C::Item> {
    let inline = C::READ_FIRST_INLINE && shared.config.inline_read_events > 0;
    CursorStream {
        shared,
        commits,
        decoder: cursor.decoder(),
        step: if inline {
            Step::First(cursor)
        } else {
            Step::Read(cursor)
        },
        chunk: None,
        error: None,
    }
    .boxed()
}

// Nothing in it is pinned in place: futures it waits on are boxed or `Unpin`, and items are
// moved out of the current chunk.
impl<C: Cursor> Unpin for CursorStream<C> {}

impl<C: Cursor> Stream for CursorStream<C> {
    type Item = Result<C::Item, JournalError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(chunk) = &mut this.chunk {
                if let Some(item) = C::next_item(&mut this.decoder, chunk) {
                    return Poll::Ready(Some(Ok(item)));
                }
                // A record that fails its check or decoding comes before anything the read
                // stopped at.
                if let Some(e) = C::failure(chunk) {
                    return Poll::Ready(this.end_with(e));
                }
                this.chunk = None;
            }
            if let Some(e) = this.error.take() {
                return Poll::Ready(this.end_with(e));
            }
            match this.poll_chunk(cx) {
                Poll::Ready(Ok(true)) => {}
                Poll::Ready(Ok(false)) => return Poll::Ready(None),
                Poll::Ready(Err(e)) => return Poll::Ready(this.end_with(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
