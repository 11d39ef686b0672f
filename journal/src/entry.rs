//! What a replicated log's entries carry: one event, as the writer handed it in. Replicas
//! store it as an event record (with the entry's epoch), so that queries by tag and by
//! persistence id work on every node over the logs it holds.

use crate::record::{NewEvent, PersistentRepr};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use smol_str::SmolStr;
use tessera_replication::Payload;
use tessera_storage::Manifest;

/// An event in a replicated log (its sequence number is the entry's). The names are shared,
/// not copied, when the event is (a writer keeps a copy for each replica it sends it to and
/// one in its window); on the wire and on disk they are plain strings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredEvent {
    pub timestamp_ms: u64,
    pub writer_id: SmolStr,
    pub manifest: SmolStr,
    pub manifest_version: u32,
    pub payload: Bytes,
    pub tags: Vec<String>,
}

impl StoredEvent {
    /// The event of a write, by `writer_id`.
    pub fn from_new(writer_id: &SmolStr, event: &NewEvent) -> Self {
        StoredEvent {
            timestamp_ms: event.timestamp_ms,
            writer_id: writer_id.clone(),
            manifest: event.manifest.type_name.clone(),
            manifest_version: event.manifest.version,
            payload: event.payload.clone(),
            tags: event.tags.clone(),
        }
    }

    /// The event back as a journal event of log `persistence_id` at `sequence_nr`.
    pub fn to_repr(&self, persistence_id: &str, sequence_nr: u64) -> PersistentRepr {
        PersistentRepr {
            sequence_nr,
            timestamp_ms: self.timestamp_ms,
            payload: self.payload.clone(),
            persistence_id: SmolStr::new(persistence_id),
            writer_id: self.writer_id.clone(),
            manifest: Manifest::new(self.manifest.clone(), self.manifest_version),
        }
    }

    /// The event as a journal write's event at `sequence_nr`.
    pub fn to_new(&self, sequence_nr: u64) -> NewEvent {
        NewEvent {
            sequence_nr,
            timestamp_ms: self.timestamp_ms,
            manifest: Manifest::new(self.manifest.clone(), self.manifest_version),
            payload: self.payload.clone(),
            tags: self.tags.clone(),
        }
    }
}

impl Payload for StoredEvent {
    fn size_bytes(&self) -> usize {
        // The payload and names, plus the fixed fields and length prefixes.
        32 + self.payload.len()
            + self.writer_id.len()
            + self.manifest.len()
            + self.tags.iter().map(|t| t.len() + 4).sum::<usize>()
    }
}
