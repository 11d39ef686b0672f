//! What the fuzz targets of the root package (`tessera::fuzzing`) need of the snapshot
//! store's internals: its record codec and keys, without a store. Not an API.

use crate::error::SnapshotError;
use crate::rocks;
use crate::store::Snapshot;
use tessera_storage::Manifest;

/// Decodes the snapshot record `value` of (`persistence_id`, `sequence_nr`) stored under
/// `key`, as a load does.
pub fn decode_snapshot(
    persistence_id: &str,
    sequence_nr: u64,
    key: &[u8],
    value: &[u8],
) -> Result<Snapshot, SnapshotError> {
    rocks::decode_record(persistence_id, sequence_nr, key, value)
}

/// The record of a snapshot stored under `key`, as a save writes it.
pub fn encode_snapshot(
    key: &[u8],
    timestamp_ms: u64,
    manifest: &Manifest,
    payload: &[u8],
) -> Result<Vec<u8>, SnapshotError> {
    rocks::encode_record(key, timestamp_ms, manifest, payload)
}

/// `body` sealed as a snapshot record of format `version` stored under `key`, with the
/// checksum that format carries.
pub fn seal_snapshot(version: u8, key: &[u8], body: &[u8]) -> Vec<u8> {
    tessera_storage::seal_as_version(rocks::SNAPSHOT_RECORDS, version, key, body)
}

/// The key of the snapshot of (`persistence_id`, `sequence_nr`).
pub fn snapshot_key(persistence_id: &str, sequence_nr: u64) -> Vec<u8> {
    rocks::snapshot_key(persistence_id, sequence_nr)
}

/// The sequence number at the end of a snapshot key.
pub fn sequence_nr_of(key: &[u8]) -> Option<u64> {
    rocks::sequence_nr_of(key)
}

/// The record format this release writes.
pub fn current_format_version() -> u8 {
    rocks::SNAPSHOT_RECORDS.current()
}
