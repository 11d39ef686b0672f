//! What the fuzz targets of the root package (`tessera::fuzzing`) need of the journal's
//! internals: the event record codec and the metadata values' codecs, without a store. Not an
//! API.

use crate::error::JournalError;
use crate::record::{self, EVENT_RECORDS, EventDecoder, EventFields, PersistentRepr};
use crate::rocks::keys::{self, Counters, LogState};
use crate::rocks::replica;
use bytes::Bytes;
use smol_str::SmolStr;
use std::ops::Range;
use tessera_replication::Epoch;
use tessera_replication::replica::LogMeta;

/// An event record decoded with its tags: its place in the tag order, its writer's epoch,
/// the event and its tags.
pub type DecodedEvent = (u64, Epoch, PersistentRepr, Vec<String>);

/// Decodes the event record `value` of (`persistence_id`, `sequence_nr`) stored under `key`
/// as queries by tag and replicas do: with its tags, copying its payload.
pub fn decode_event(
    persistence_id: &str,
    sequence_nr: u64,
    key: &[u8],
    value: &[u8],
) -> Result<DecodedEvent, JournalError> {
    let event =
        EventDecoder::new().decode(&SmolStr::new(persistence_id), sequence_nr, key, value)?;
    Ok((event.offset, event.epoch, event.repr, event.tags))
}

/// Decodes an event record as a replay of single records does (tags skipped).
pub fn decode_event_copied(
    persistence_id: &str,
    sequence_nr: u64,
    key: &[u8],
    value: &[u8],
) -> Result<PersistentRepr, JournalError> {
    EventDecoder::new().decode_copied(&SmolStr::new(persistence_id), sequence_nr, key, value)
}

/// Decodes the event record at `range` of `values` as a replay of a chunk does (tags
/// skipped, the payload a slice of `values`).
pub fn decode_event_shared(
    persistence_id: &str,
    sequence_nr: u64,
    key: &[u8],
    values: &Bytes,
    range: Range<usize>,
) -> Result<PersistentRepr, JournalError> {
    EventDecoder::new().decode_shared(
        &SmolStr::new(persistence_id),
        sequence_nr,
        key,
        values,
        range,
    )
}

/// The epoch of an event record, read as a replica's rules read it.
pub fn event_epoch(
    persistence_id: &str,
    sequence_nr: u64,
    key: &[u8],
    value: &[u8],
) -> Result<Epoch, JournalError> {
    record::epoch_of(persistence_id, sequence_nr, key, value)
}

/// The record of `event` (at `offset` in the tag order, with `tags`, written under `epoch`)
/// stored under `key`, in the current record format.
pub fn encode_event(
    key: &[u8],
    epoch: Epoch,
    offset: u64,
    event: &PersistentRepr,
    tags: &[String],
) -> Vec<u8> {
    record::encode_fields(
        key,
        &EventFields {
            epoch,
            offset,
            timestamp_ms: event.timestamp_ms,
            writer_id: &event.writer_id,
            manifest: &event.manifest.type_name,
            manifest_version: event.manifest.version,
            tags,
            payload: &event.payload,
        },
    )
}

/// `body` sealed as an event record of format `version` (1 to the current one) stored under
/// `key`, with the checksum that format carries.
pub fn seal_event(version: u8, key: &[u8], body: &[u8]) -> Vec<u8> {
    tessera_storage::seal_as_version(EVENT_RECORDS, version, key, body)
}

/// A replica's progress in a log's `p` value: last entry (sequence number, epoch counter,
/// epoch writer) and acknowledged mark.
pub type LogProgress = (u64, u64, u64, u64);

/// A decoded `p` value: number, (highest, deleted-to), progress.
pub type LogValueParts = (u64, Option<(u64, u64)>, Option<LogProgress>);

/// A log's `p` value: its number, (but for a store-format-1 value) its highest sequence
/// number and deleted-to mark, and (for a replicated log) the replica's progress.
pub fn decode_log_value(value: &[u8]) -> Option<LogValueParts> {
    let (pid_num, state) = keys::decode_log(value)?;
    let progress = keys::decode_log_progress(value)
        .map(|p| (p.last.seq, p.last.epoch.counter, p.last.epoch.writer, p.lac));
    Some((pid_num, state.map(|s| (s.highest, s.deleted_to)), progress))
}

/// The `p` value of log `pid_num` with `state` (highest, deleted-to) and a replica's
/// `progress`, or of store format 1 without a state.
pub fn encode_log_value(
    pid_num: u64,
    state: Option<(u64, u64)>,
    progress: Option<LogProgress>,
) -> Vec<u8> {
    match state {
        Some((highest, deleted_to)) => keys::encode_log(
            pid_num,
            LogState {
                highest,
                deleted_to,
            },
            progress.map(|(seq, counter, writer, lac)| keys::ReplicaProgress {
                last: tessera_replication::Position::new(
                    seq,
                    tessera_replication::Epoch { counter, writer },
                ),
                lac,
            }),
        )
        .as_slice()
        .to_vec(),
        None => pid_num.to_be_bytes().to_vec(),
    }
}

/// A store-format-1 log state (highest, deleted-to).
pub fn decode_log_state(value: &[u8]) -> Option<(u64, u64)> {
    LogState::decode(value).map(|s| (s.highest, s.deleted_to))
}

/// The journal's counters (next pid number, next tag number, next offset).
pub fn decode_counters(value: &[u8]) -> Option<(u64, u64, u64)> {
    Counters::decode(value).map(|c| (c.next_pid_num, c.next_tag_num, c.next_offset))
}

/// The value of the journal's counters.
pub fn encode_counters(next_pid_num: u64, next_tag_num: u64, next_offset: u64) -> Vec<u8> {
    Counters {
        next_pid_num,
        next_tag_num,
        next_offset,
    }
    .encode()
    .to_vec()
}

/// The (log number, sequence number) of an event key.
pub fn parse_event_key(key: &[u8]) -> Option<(u64, u64)> {
    keys::parse_pair(key)
}

/// A replicated log's stored replica state.
pub fn decode_replica_meta(value: &[u8]) -> Result<LogMeta, JournalError> {
    replica::decode_meta(value)
}

/// The stored value of a replica state.
pub fn encode_replica_meta(meta: &LogMeta) -> Result<Vec<u8>, JournalError> {
    replica::encode_meta(meta)
}

/// The replica state a log written before replication, with this (highest, deleted-to),
/// reads as.
pub fn legacy_replica_meta(highest: u64, deleted_to: u64) -> LogMeta {
    replica::legacy_meta(LogState {
        highest,
        deleted_to,
    })
}
