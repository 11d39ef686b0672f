//! The journal as a node's replica store of replicated logs (docs/src/design.md §5): reading a
//! log's replica state and entries. Changes go through the writer thread
//! (`writer::Writer::stage_replica`), which applies the replica rules of
//! `tessera_replication::replica` in the same batch as the entries.
//!
//! A log's replica state (its `LogMeta`: promise, acknowledged mark, last entry, deleted
//! prefix, configuration) lives under `r` ++ pid_num. A log written before replication
//! (by [`crate::RocksJournal`]'s own appends) has none: it reads as a log of epoch-zero
//! entries, all acknowledged, without a configuration.

use super::Shared;
use super::keys::{
    self, CF_EVENTS, CF_META, LogState, REPLICA_META_VERSION, ReplicaProgress, pair_key,
};
use super::reader::{self, Log};
use crate::entry::StoredEvent;
use crate::error::JournalError;
use crate::record::{self, EventDecoder};
use smol_str::SmolStr;
use tessera_replication::replica::{EntryEpochs, LogMeta};
use tessera_replication::{ConfigAt, Entry, Epoch, LogSummary, Position};

/// Entries above the acknowledged mark a promise carries at most (the writer reads the rest).
pub(crate) const MAX_TAIL_ENTRIES: usize = 1_000;
/// Payload bytes a promise's tail carries at most.
pub(crate) const MAX_TAIL_BYTES: usize = 1024 * 1024;

/// The buffer a replica state is encoded into starts this large.
const META_CAPACITY_BYTES: usize = 256;

/// Decodes a stored replica state.
pub(crate) fn decode_meta(value: &[u8]) -> Result<LogMeta, JournalError> {
    match value.split_first() {
        Some((&REPLICA_META_VERSION, body)) => postcard::from_bytes(body)
            .map_err(|e| JournalError::CorruptMetadata(format!("replica state: {e}"))),
        Some((&version, _)) => Err(JournalError::CorruptMetadata(format!(
            "replica state of version {version}, newer than {REPLICA_META_VERSION}"
        ))),
        None => Err(JournalError::CorruptMetadata("empty replica state".into())),
    }
}

/// Encodes a replica state for storage.
pub(crate) fn encode_meta(meta: &LogMeta) -> Result<Vec<u8>, JournalError> {
    // Room for a three-member configuration at once: growing the buffer as postcard
    // writes would copy it several times for every append.
    let mut buffer = Vec::with_capacity(META_CAPACITY_BYTES);
    buffer.push(REPLICA_META_VERSION);
    postcard::to_extend(meta, buffer)
        .map_err(|e| JournalError::CorruptMetadata(format!("cannot encode a replica state: {e}")))
}

/// The replica state a log written before replication reads as.
pub(crate) fn legacy_meta(state: LogState) -> LogMeta {
    let base = Position::new(state.deleted_to, Epoch::ZERO);
    LogMeta {
        promise: Epoch::ZERO,
        lac: state.highest,
        base,
        last: if state.highest > state.deleted_to {
            Position::new(state.highest, Epoch::ZERO)
        } else {
            base
        },
        config: None,
    }
}

/// The replica record of log `pid_num`, if it has one.
pub(crate) fn stored_meta(shared: &Shared, pid_num: u64) -> Result<Option<LogMeta>, JournalError> {
    shared
        .db
        .get_pinned_cf(shared.cf(CF_META)?, keys::replica_key(pid_num))?
        .map(|value| decode_meta(&value))
        .transpose()
}

/// A log's replica state from its replica record (`stored`) and the progress its log record
/// carries, or, without a replica record, as a log written before replication reads.
pub(crate) fn meta_or_legacy(stored: Option<LogMeta>, log: &Log) -> Option<LogMeta> {
    match stored {
        Some(meta) => Some(with_progress(meta, log)),
        None if log.state.highest > 0 => Some(legacy_meta(log.state)),
        None => None,
    }
}

fn meta_from(stored: Option<&[u8]>, log: &Log) -> Result<Option<LogMeta>, JournalError> {
    let stored = stored.map(decode_meta).transpose()?;
    Ok(meta_or_legacy(stored, log))
}

/// The replica record's state with the log record's progress, which is at least as recent:
/// every write of the replica record writes the log record too (see
/// [`keys::ReplicaProgress`]).
fn with_progress(meta: LogMeta, log: &Log) -> LogMeta {
    match log.progress {
        Some(progress) => overlay(meta, progress),
        None => meta,
    }
}

fn overlay(mut meta: LogMeta, progress: ReplicaProgress) -> LogMeta {
    meta.last = progress.last;
    meta.lac = progress.lac;
    meta
}

/// The part of `meta` the log record carries.
pub(crate) fn progress_of(meta: &LogMeta) -> ReplicaProgress {
    ReplicaProgress {
        last: meta.last,
        lac: meta.lac,
    }
}

/// Whether the replica record `stored` already holds `meta` but for the progress the log
/// record carries, so that a write of `meta` need not rewrite it.
pub(crate) fn record_holds(stored: &LogMeta, meta: &LogMeta) -> bool {
    overlay(stored.clone(), progress_of(meta)) == *meta
}

/// A `Read`: entries `from..=to` above the deleted prefix (at most `max_entries` and, beyond
/// the first, `max_bytes`) with the summary of the state they belong to. Both come from one
/// snapshot of the database: the writer thread may truncate, re-append or delete between two
/// reads, and entries of one state with the summary of another could pass a later writer's
/// entries off as an earlier one's, or show a gap.
pub(crate) fn read(
    shared: &Shared,
    persistence_id: &str,
    from: u64,
    to: u64,
    max_entries: usize,
    max_bytes: usize,
) -> Result<(Vec<Entry<StoredEvent>>, LogSummary), JournalError> {
    let snapshot = shared.db.snapshot();
    let Some(log) = reader::log_at(shared, &snapshot, persistence_id)? else {
        return Ok((Vec::new(), LogMeta::default().summary()));
    };
    let stored = snapshot.get_pinned_cf(shared.cf(CF_META)?, keys::replica_key(log.pid_num))?;
    let Some(meta) = meta_from(stored.as_deref(), &log)? else {
        return Ok((Vec::new(), LogMeta::default().summary()));
    };
    let mut options = rocksdb::ReadOptions::default();
    options.set_snapshot(&snapshot);
    let entries = entries_with(
        shared,
        options,
        persistence_id,
        log.pid_num,
        from.max(meta.base.seq + 1),
        to,
        max_entries,
        max_bytes,
    )?;
    Ok((entries, meta.summary()))
}

/// Looks entries' epochs up in the database.
pub(crate) struct StoredEpochs<'a> {
    pub shared: &'a Shared,
    pub persistence_id: &'a str,
    pub pid_num: u64,
}

impl EntryEpochs for StoredEpochs<'_> {
    fn epoch_at(&self, seq: u64) -> Option<Epoch> {
        let events = self.shared.cf(CF_EVENTS).ok()?;
        let key = pair_key(self.pid_num, seq);
        let value = self.shared.db.get_pinned_cf(events, key).ok()??;
        match record::epoch_of(self.persistence_id, seq, &key, &value) {
            Ok(epoch) => Some(epoch),
            Err(e) => {
                tracing::warn!(log = self.persistence_id, seq, error = %e, "unreadable entry");
                None
            }
        }
    }
}

/// The entries of a log `from..=to` with their epochs, at most `max_entries` and (beyond
/// the first) `max_bytes` of payload.
pub(crate) fn read_entries(
    shared: &Shared,
    persistence_id: &str,
    pid_num: u64,
    from: u64,
    to: u64,
    max_entries: usize,
    max_bytes: usize,
) -> Result<Vec<Entry<StoredEvent>>, JournalError> {
    entries_with(
        shared,
        rocksdb::ReadOptions::default(),
        persistence_id,
        pid_num,
        from,
        to,
        max_entries,
        max_bytes,
    )
}

#[allow(clippy::too_many_arguments)]
fn entries_with(
    shared: &Shared,
    mut options: rocksdb::ReadOptions,
    persistence_id: &str,
    pid_num: u64,
    from: u64,
    to: u64,
    max_entries: usize,
    max_bytes: usize,
) -> Result<Vec<Entry<StoredEvent>>, JournalError> {
    if from > to || max_entries == 0 {
        return Ok(Vec::new());
    }
    let events = shared.cf(CF_EVENTS)?;
    options.set_iterate_upper_bound(keys::pair_upper_bound(pid_num, to));
    let mut iter = shared.db.raw_iterator_cf_opt(events, options);
    iter.seek(pair_key(pid_num, from));
    let name = SmolStr::new(persistence_id);
    let mut decoder = EventDecoder::new();
    let mut entries = Vec::new();
    let mut bytes = 0;
    while let Some((key, value)) = iter.item() {
        let Some((_, seq)) = keys::parse_pair(key) else {
            break;
        };
        let decoded = decoder.decode(&name, seq, key, value)?;
        let event = StoredEvent {
            timestamp_ms: decoded.repr.timestamp_ms,
            writer_id: decoded.repr.writer_id,
            manifest: decoded.repr.manifest.type_name,
            manifest_version: decoded.repr.manifest.version,
            payload: decoded.repr.payload,
            tags: decoded.tags,
        };
        bytes += tessera_replication::Payload::size_bytes(&event);
        if !entries.is_empty() && (entries.len() >= max_entries || bytes > max_bytes) {
            break;
        }
        entries.push(Entry {
            seq,
            epoch: decoded.epoch,
            payload: event,
        });
        iter.next();
    }
    iter.status()?;
    Ok(entries)
}

/// What a replica holds of a log: its number and replica state, `None` if it holds nothing.
pub(crate) fn replica_of(
    shared: &Shared,
    persistence_id: &str,
) -> Result<Option<(u64, LogMeta)>, JournalError> {
    // The log record (with the replica's progress) and the replica record from one
    // snapshot: read apart, a write between them could pair one state's promise, deleted
    // prefix and configuration with another's last entry.
    let snapshot = shared.db.snapshot();
    let Some(log) = reader::log_at(shared, &snapshot, persistence_id)? else {
        return Ok(None);
    };
    let stored = snapshot.get_pinned_cf(shared.cf(CF_META)?, keys::replica_key(log.pid_num))?;
    Ok(meta_from(stored.as_deref(), &log)?.map(|meta| (log.pid_num, meta)))
}

/// The summary of a log held here, for `Locate`.
pub(crate) fn summary(
    shared: &Shared,
    persistence_id: &str,
) -> Result<Option<LogSummary>, JournalError> {
    Ok(replica_of(shared, persistence_id)?.map(|(_, meta)| meta.summary()))
}

/// Replicated logs held here with their configuration, in log number order after the log
/// `after` (by name), at most `limit`.
pub(crate) fn logs(
    shared: &Shared,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<(String, ConfigAt)>, JournalError> {
    let meta_cf = shared.cf(CF_META)?;
    let start = match after {
        Some(name) => match reader::log_of(shared, name)? {
            Some(log) => keys::replica_key(log.pid_num.saturating_add(1)),
            None => keys::replica_key_range().0,
        },
        None => keys::replica_key_range().0,
    };
    let mut options = rocksdb::ReadOptions::default();
    options.set_iterate_upper_bound(keys::replica_key_range().1);
    let mut iter = shared.db.raw_iterator_cf_opt(meta_cf, options);
    iter.seek(start);
    let mut found = Vec::new();
    while found.len() < limit {
        let Some((key, value)) = iter.item() else {
            break;
        };
        let Some(pid_num) = keys::parse_replica_key(key) else {
            break;
        };
        if let Some(config) = decode_meta(value)?.config {
            found.push((
                reader::pid_name(shared, pid_num)?.to_string(),
                std::sync::Arc::unwrap_or_clone(config),
            ));
        }
        iter.next();
    }
    iter.status()?;
    Ok(found)
}

/// This store's replica id, created with a random value the first time it is asked for.
pub(crate) fn storage_id(shared: &Shared) -> Result<u64, JournalError> {
    let meta = shared.cf(CF_META)?;
    if let Some(value) = shared.db.get_cf(meta, keys::STORAGE_ID_KEY)? {
        return keys::decode_u64(&value)
            .ok_or_else(|| JournalError::CorruptMetadata("malformed storage id".into()));
    }
    let id: u64 = rand::random();
    let mut options = rocksdb::WriteOptions::default();
    options.set_sync(true);
    shared
        .db
        .put_cf_opt(meta, keys::STORAGE_ID_KEY, id.to_be_bytes(), &options)?;
    Ok(id)
}
