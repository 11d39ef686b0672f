//! What the journal stores: events as users hand them in ([`AtomicWrite`], [`NewEvent`]), as
//! they come back ([`PersistentRepr`], [`EventEnvelope`]), and their encoding on disk.

use crate::error::JournalError;
use crate::storage::{self, UnsealError};
use bytes::{Bytes, BytesMut};
use std::sync::Arc;

/// The type of a payload and the version of that type's encoding, so that an old event can be
/// recognised and upcast by a later release.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Manifest {
    /// The payload's type name, e.g. `account.Deposited`. Shared: a replay hands the same
    /// name to thousands of events.
    pub type_name: Arc<str>,
    /// The version of that type's encoding.
    pub version: u32,
}

impl Manifest {
    /// A manifest for `type_name` at `version`.
    pub fn new(type_name: impl Into<Arc<str>>, version: u32) -> Self {
        Manifest {
            type_name: type_name.into(),
            version,
        }
    }
}

/// One event of an [`AtomicWrite`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// Its sequence number: the log's highest plus one for the first event of a write, then
    /// consecutive.
    pub sequence_nr: u64,
    /// Milliseconds since the Unix epoch at which the event was created.
    pub timestamp_ms: u64,
    /// The payload's type and encoding version.
    pub manifest: Manifest,
    /// The encoded event.
    pub payload: Bytes,
    /// Tags under which [`Journal::events_by_tag`](crate::Journal::events_by_tag) finds it.
    pub tags: Vec<String>,
}

/// Events of one persistence id written all or nothing, continuing its log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AtomicWrite {
    /// The log written to.
    pub persistence_id: String,
    /// Identifies the writer incarnation (e.g. an entity's), recorded with every event.
    pub writer_id: String,
    /// The events, with consecutive sequence numbers.
    pub events: Vec<NewEvent>,
}

impl AtomicWrite {
    /// The total payload bytes of the write.
    pub fn payload_bytes(&self) -> usize {
        self.events.iter().map(|e| e.payload.len()).sum()
    }
}

/// A stored event as replay returns it. Names are shared (`Arc<str>`) between the events of
/// a replay, and payloads are slices of shared buffers, so a replay allocates per chunk of
/// events rather than per event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersistentRepr {
    /// The log it belongs to.
    pub persistence_id: Arc<str>,
    /// Its position in that log, from 1.
    pub sequence_nr: u64,
    /// The writer incarnation that wrote it.
    pub writer_id: Arc<str>,
    /// Milliseconds since the Unix epoch at which it was created.
    pub timestamp_ms: u64,
    /// The payload's type and encoding version.
    pub manifest: Manifest,
    /// The encoded event.
    pub payload: Bytes,
    /// Its tags.
    pub tags: Vec<String>,
}

/// An event found by tag, with the offset to resume after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventEnvelope {
    /// The event's position in the journal-wide order of tagged events, from 1. Passing it as
    /// `after_offset` resumes a query right after this event.
    pub offset: u64,
    /// The event.
    pub event: PersistentRepr,
}

/// The record format version this release writes and reads.
pub const RECORD_FORMAT_VERSION: u8 = 1;

/// The body of an event record on disk, a fixed little-endian layout (the persistence id and
/// sequence number live in the key):
///
/// ```text
/// offset u64 | timestamp_ms u64 | manifest_version u32
/// writer_id_len u16 | writer_id | manifest_len u16 | manifest | tag_count u16
/// (tag_len u16 | tag)* | payload (the rest)
/// ```
///
/// `offset` is the event's position in the tag order (0 for an untagged event), which lets a
/// physical delete find its tag index entries. A fixed layout rather than postcard: decoding
/// is on the replay path, and names equal to the previous record's are recognised by their
/// bytes without being validated again.
const FIXED_HEADER_BYTES: usize = 8 + 8 + 4;

fn put_name(out: &mut Vec<u8>, name: &str) -> Result<(), JournalError> {
    let len = u16::try_from(name.len())
        .map_err(|_| JournalError::Storage(format!("name of {} bytes in a record", name.len())))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(name.as_bytes());
    Ok(())
}

/// Encodes the sealed value of one event stored under `key`.
pub(crate) fn encode_event(
    key: &[u8],
    writer_id: &str,
    offset: u64,
    event: &NewEvent,
) -> Result<Vec<u8>, JournalError> {
    let names: usize = writer_id.len()
        + event.manifest.type_name.len()
        + event.tags.iter().map(|t| t.len() + 2).sum::<usize>();
    let mut value = Vec::with_capacity(
        storage::SEAL_HEADER_LEN + FIXED_HEADER_BYTES + 6 + names + event.payload.len(),
    );
    value.resize(storage::SEAL_HEADER_LEN, 0);
    value.extend_from_slice(&offset.to_le_bytes());
    value.extend_from_slice(&event.timestamp_ms.to_le_bytes());
    value.extend_from_slice(&event.manifest.version.to_le_bytes());
    put_name(&mut value, writer_id)?;
    put_name(&mut value, &event.manifest.type_name)?;
    let tags = u16::try_from(event.tags.len())
        .map_err(|_| JournalError::Storage(format!("{} tags on one event", event.tags.len())))?;
    value.extend_from_slice(&tags.to_le_bytes());
    for tag in &event.tags {
        put_name(&mut value, tag)?;
    }
    value.extend_from_slice(&event.payload);
    storage::seal_in_place(RECORD_FORMAT_VERSION, key, &mut value);
    Ok(value)
}

/// Reads a record body front to back; every read is checked, a short body is an error.
struct BodyReader<'b> {
    rest: &'b [u8],
}

impl<'b> BodyReader<'b> {
    fn take(&mut self, n: usize) -> Option<&'b [u8]> {
        if self.rest.len() < n {
            return None;
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Some(head)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }

    fn name(&mut self) -> Option<&'b [u8]> {
        let len = self.u16()?;
        self.take(usize::from(len))
    }
}

/// A decoded event record with its offset.
pub(crate) struct DecodedEvent {
    pub offset: u64,
    pub repr: PersistentRepr,
}

/// Payload bytes a decoder reserves at a time when it copies payloads out of borrowed
/// records: payloads of a chunk of events share these buffers, so a payload kept by a
/// consumer keeps at most this much memory alive (or itself, if larger).
pub(crate) const PAYLOAD_ARENA_BYTES: usize = 64 * 1024;

/// Decodes event records, sharing names between consecutive events. Payloads are slices of
/// shared buffers: of the buffer the records were read into ([`EventDecoder::decode_shared`])
/// or of an arena the decoder copies them into ([`EventDecoder::decode`]).
pub(crate) struct EventDecoder {
    writer_id: Arc<str>,
    manifest_type: Arc<str>,
    payloads: BytesMut,
}

impl EventDecoder {
    pub fn new() -> Self {
        EventDecoder {
            writer_id: Arc::from(""),
            manifest_type: Arc::from(""),
            payloads: BytesMut::new(),
        }
    }

    /// Decodes the sealed value stored under `key` for (`persistence_id`, `sequence_nr`),
    /// copying its payload.
    pub fn decode(
        &mut self,
        persistence_id: &Arc<str>,
        sequence_nr: u64,
        key: &[u8],
        value: &[u8],
    ) -> Result<DecodedEvent, JournalError> {
        let body = verify_event(persistence_id, sequence_nr, key, value)?;
        self.decode_verified(persistence_id, sequence_nr, body, |decoder, payload| {
            if decoder.payloads.capacity() - decoder.payloads.len() < payload.len() {
                decoder.payloads = BytesMut::with_capacity(PAYLOAD_ARENA_BYTES.max(payload.len()));
            }
            decoder.payloads.extend_from_slice(payload);
            decoder.payloads.split().freeze()
        })
    }

    /// Decodes a sealed value whose checksum was already verified, copying its payload.
    pub fn decode_checked(
        &mut self,
        persistence_id: &Arc<str>,
        sequence_nr: u64,
        value: &[u8],
    ) -> Result<DecodedEvent, JournalError> {
        let body = value
            .get(storage::SEAL_HEADER_LEN..)
            .ok_or_else(|| shorter_than_header(persistence_id, sequence_nr))?;
        self.decode_verified(persistence_id, sequence_nr, body, Self::copy_payload)
    }

    /// Copies a payload into the decoder's arena.
    fn copy_payload(&mut self, payload: &[u8]) -> Bytes {
        if self.payloads.capacity() - self.payloads.len() < payload.len() {
            self.payloads = BytesMut::with_capacity(PAYLOAD_ARENA_BYTES.max(payload.len()));
        }
        self.payloads.extend_from_slice(payload);
        self.payloads.split().freeze()
    }

    /// Decodes the record at `range` of `values`, whose checksum was already verified,
    /// without copying its payload: the payload is a slice of `values`, and keeps all of
    /// `values` alive as long as it lives.
    pub fn decode_shared(
        &mut self,
        persistence_id: &Arc<str>,
        sequence_nr: u64,
        values: &Bytes,
        range: std::ops::Range<usize>,
    ) -> Result<DecodedEvent, JournalError> {
        let end = range.end;
        let body = values
            .get(range)
            .and_then(|value| value.get(storage::SEAL_HEADER_LEN..))
            .ok_or_else(|| shorter_than_header(persistence_id, sequence_nr))?;
        // The payload is the rest of the body, so it ends where the record ends (and `end`
        // is inside `values`: the range was just read from it).
        self.decode_verified(persistence_id, sequence_nr, body, |_, payload| {
            values.slice(end.saturating_sub(payload.len())..end)
        })
    }

    /// Decodes the body of a record that [`verify_event`] accepted; `payload` makes the
    /// payload's `Bytes` from its bytes in `body`.
    fn decode_verified(
        &mut self,
        persistence_id: &Arc<str>,
        sequence_nr: u64,
        body: &[u8],
        payload: impl FnOnce(&mut Self, &[u8]) -> Bytes,
    ) -> Result<DecodedEvent, JournalError> {
        let corrupt = |detail: &str| JournalError::Corrupt {
            persistence_id: persistence_id.to_string(),
            sequence_nr,
            detail: format!("undecodable body: {detail}"),
        };
        let mut reader = BodyReader { rest: body };
        let (Some(offset), Some(timestamp_ms), Some(manifest_version)) =
            (reader.u64(), reader.u64(), reader.u32())
        else {
            return Err(corrupt("truncated header"));
        };
        let writer_id = reader
            .name()
            .ok_or_else(|| corrupt("truncated writer id"))?;
        let writer_id = intern(&mut self.writer_id, writer_id)
            .ok_or_else(|| corrupt("writer id is not UTF-8"))?;
        let manifest = reader.name().ok_or_else(|| corrupt("truncated manifest"))?;
        let manifest = intern(&mut self.manifest_type, manifest)
            .ok_or_else(|| corrupt("manifest is not UTF-8"))?;
        let tag_count = reader.u16().ok_or_else(|| corrupt("truncated tags"))?;
        let mut tags = Vec::with_capacity(usize::from(tag_count));
        for _ in 0..tag_count {
            let tag = reader.name().ok_or_else(|| corrupt("truncated tag"))?;
            let tag = std::str::from_utf8(tag).map_err(|_| corrupt("tag is not UTF-8"))?;
            tags.push(tag.to_string());
        }
        let payload = payload(self, reader.rest);
        Ok(DecodedEvent {
            offset,
            repr: PersistentRepr {
                persistence_id: persistence_id.clone(),
                sequence_nr,
                writer_id,
                timestamp_ms,
                manifest: Manifest {
                    type_name: manifest,
                    version: manifest_version,
                },
                payload,
                tags,
            },
        })
    }
}

/// Checks the format version and checksum of the sealed value stored under `key` and returns
/// its body.
pub(crate) fn verify_event<'v>(
    persistence_id: &str,
    sequence_nr: u64,
    key: &[u8],
    value: &'v [u8],
) -> Result<&'v [u8], JournalError> {
    storage::unseal(RECORD_FORMAT_VERSION, key, value)
        .map(|(_, body)| body)
        .map_err(|e| unseal_error(persistence_id, sequence_nr, e))
}

/// The shared copy of the name in `bytes`: the previous one when the bytes are the same
/// (no UTF-8 check needed then), else a new one; `None` when the bytes are not UTF-8.
fn intern(slot: &mut Arc<str>, bytes: &[u8]) -> Option<Arc<str>> {
    if slot.as_bytes() != bytes {
        *slot = Arc::from(std::str::from_utf8(bytes).ok()?);
    }
    Some(slot.clone())
}

fn shorter_than_header(persistence_id: &str, sequence_nr: u64) -> JournalError {
    JournalError::Corrupt {
        persistence_id: persistence_id.to_string(),
        sequence_nr,
        detail: "record shorter than its header".to_string(),
    }
}

/// The journal error of a record of (`persistence_id`, `sequence_nr`) that cannot be unsealed.
pub(crate) fn unseal_error(persistence_id: &str, sequence_nr: u64, e: UnsealError) -> JournalError {
    match e {
        UnsealError::NewerVersion { found, supported } => JournalError::NewerRecordVersion {
            persistence_id: persistence_id.to_string(),
            sequence_nr,
            found,
            supported,
        },
        other => JournalError::Corrupt {
            persistence_id: persistence_id.to_string(),
            sequence_nr,
            detail: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn event(payload: Vec<u8>, tags: Vec<String>) -> NewEvent {
        NewEvent {
            sequence_nr: 3,
            timestamp_ms: 1_700_000_000_000,
            manifest: Manifest::new("account.Deposited", 2),
            payload: Bytes::from(payload),
            tags,
        }
    }

    proptest! {
        #[test]
        fn event_record_round_trips(
            payload in proptest::collection::vec(any::<u8>(), 0..300),
            tags in proptest::collection::vec("[a-z]{1,8}", 0..4),
            offset in any::<u64>(),
        ) {
            let e = event(payload, tags);
            let value = encode_event(b"key", "w1", offset, &e).unwrap();
            let decoded = EventDecoder::new().decode(&"pid".into(), 3, b"key", &value).unwrap();
            prop_assert_eq!(decoded.offset, offset);
            prop_assert_eq!(decoded.repr.payload, e.payload);
            prop_assert_eq!(decoded.repr.tags, e.tags);
            prop_assert_eq!(decoded.repr.manifest, e.manifest);
            prop_assert_eq!(&*decoded.repr.writer_id, "w1");
        }

        #[test]
        fn arbitrary_bytes_never_panic_the_decoder(value in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = EventDecoder::new().decode(&"pid".into(), 1, b"key", &value);
        }
    }

    #[test]
    fn altered_record_names_persistence_id_and_sequence_nr() {
        let mut value = encode_event(b"key", "w", 0, &event(vec![1, 2, 3], vec![])).unwrap();
        let last = value.len() - 1;
        value[last] ^= 0xff;
        let err = EventDecoder::new()
            .decode(&"alice".into(), 3, b"key", &value)
            .err()
            .unwrap();
        assert!(
            matches!(&err, JournalError::Corrupt { persistence_id, sequence_nr: 3, .. } if persistence_id == "alice"),
            "{err:?}"
        );
        assert!(err.to_string().contains("alice"), "{err}");
    }
}
