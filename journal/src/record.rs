//! What the journal stores: events as users hand them in ([`AtomicWrite`], [`NewEvent`]), as
//! they come back ([`PersistentRepr`], [`EventEnvelope`]), and their encoding on disk.

use crate::error::JournalError;
use bytes::{Bytes, BytesMut};
use smol_str::SmolStr;
use tessera_replication::Epoch;
use tessera_storage::{self as storage, Manifest, RecordFormat, UnsealError};

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

/// A stored event as replay returns it. Names are [`SmolStr`]s: up to 23 bytes they are
/// stored inline, so handing them to every event of a replay and dropping them costs no
/// reference count (measured: the three `Arc<str>` this replaced were a sixth of a spread
/// replay's time beyond RocksDB's own); longer names are shared. Payloads are slices of
/// shared buffers, so a replay allocates per chunk of events rather than per event.
///
/// Its tags are not part of it, as in Akka: they serve the queries by tag, whose
/// [`EventEnvelope`] carries them, while recovery has no use for them. A replay then
/// allocates nothing per tagged event (a `String` per tag before), and an event fits in 128
/// bytes, which a consumer moves without a call to `memcpy`.
///
/// Laid out in this order (`repr(C)`): the names after the words. Left to the compiler, a
/// name came first, and the tag byte of a name is where `Option<Result<PersistentRepr, _>>`
/// keeps its variant; the rest of the event was then moved about as 127 bytes from an odd
/// offset, each piece straddling two of the stores that had just written it, which stalled
/// the processor at every hand-over (measured: a replay of 100-event logs 3% faster so).
#[derive(Debug, Clone, PartialEq, Eq)]
#[repr(C)]
pub struct PersistentRepr {
    /// Its position in that log, from 1.
    pub sequence_nr: u64,
    /// Milliseconds since the Unix epoch at which it was created.
    pub timestamp_ms: u64,
    /// The encoded event.
    pub payload: Bytes,
    /// The log it belongs to.
    pub persistence_id: SmolStr,
    /// The writer incarnation that wrote it.
    pub writer_id: SmolStr,
    /// The payload's type and encoding version.
    pub manifest: Manifest,
}

/// An event found by tag, with the offset to resume after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventEnvelope {
    /// The event's position in the journal-wide order of tagged events, from 1. Passing it as
    /// `after_offset` resumes a query right after this event.
    pub offset: u64,
    /// The event.
    pub event: PersistentRepr,
    /// Every tag the event was written with, the one queried among them.
    pub tags: Vec<String>,
}

// Moved by value through every replay; see `PersistentRepr`.
const _: () = assert!(std::mem::size_of::<PersistentRepr>() <= 128);

/// The record format version this release writes; it reads this one and every earlier one.
///
/// The body of an event record on disk, formats 2 and 3 (the persistence id and sequence
/// number live in the key; integers are LEB128 varints):
///
/// ```text
/// tag_count | offset (only if tag_count > 0) | timestamp_ms | manifest_version
/// writer_id_len | writer_id | manifest_len | manifest | (tag_len | tag)* | payload (the rest)
/// ```
///
/// `offset` is the event's position in the tag order, which lets a physical delete find its
/// tag index entries; an untagged event has none (0). Varints rather than format 1's fixed
/// widths: the 15-odd bytes saved were a third fewer blocks for format 2's BLAKE3 to hash in
/// a 100-byte event with short names, and are still bytes every read handles. A hand-written
/// layout rather than postcard: decoding is on the replay path, and names equal to the
/// previous record's are recognised by their bytes without being validated again.
///
/// Format 3 differs from format 2 in its checksum only: xxh3 rather than keyed BLAKE3 (see
/// [`RecordFormat`]).
///
/// Format 4 puts the epoch of the writer that wrote the entry (a replicated log's) in front
/// of format 3's body: `epoch_counter varint | epoch_writer u64 LE (only if the counter is
/// not 0)`. Events written by this node alone carry epoch 0: one byte.
pub const RECORD_FORMAT_VERSION: u8 = 4;

/// The third record format, still read: format 4's body without the epoch, under xxh3.
const RECORD_FORMAT_VARINT_XXH3: u8 = 3;

/// The second record format, still read: the body of format 3 under a keyed BLAKE3 checksum.
const RECORD_FORMAT_VARINT_BLAKE3: u8 = 2;

/// The first record format, still read: a fixed little-endian layout
/// (`offset u64 | timestamp_ms u64 | manifest_version u32`, then names as `len u16 | bytes`:
/// writer id, manifest, `tag_count u16` and the tags, then the payload), under a keyed BLAKE3
/// checksum.
const RECORD_FORMAT_FIXED: u8 = 1;

/// Event records: xxh3 checksums from format 3 on, keyed BLAKE3 before.
pub(crate) const EVENT_RECORDS: RecordFormat = RecordFormat::new(RECORD_FORMAT_VERSION, 3);

/// The two body layouts, named by the first format that has them: constant parameters of
/// the decoding, so that each layout is decoded along one straight path.
const FIXED_BODY: u8 = RECORD_FORMAT_FIXED;
const VARINT_BODY: u8 = RECORD_FORMAT_VARINT_BLAKE3;

/// The most bytes a LEB128 varint of a u64 takes.
const MAX_VARINT_BYTES: usize = 10;

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    put_varint(out, name.len() as u64);
    out.extend_from_slice(name.as_bytes());
}

/// The fields of an event as a record holds them.
pub(crate) struct EventFields<'a> {
    pub epoch: Epoch,
    pub offset: u64,
    pub timestamp_ms: u64,
    pub writer_id: &'a str,
    pub manifest: &'a str,
    pub manifest_version: u32,
    pub tags: &'a [String],
    pub payload: &'a [u8],
}

/// Encodes the sealed value of one event stored under `key`, in the current record format.
/// `offset` is the event's place in the tag order; it is kept only for a tagged event. Any
/// length fits (the limits on names are checked where writes come in).
pub(crate) fn encode_event(key: &[u8], writer_id: &str, offset: u64, event: &NewEvent) -> Vec<u8> {
    encode_fields(
        key,
        &EventFields {
            epoch: Epoch::ZERO,
            offset,
            timestamp_ms: event.timestamp_ms,
            writer_id,
            manifest: &event.manifest.type_name,
            manifest_version: event.manifest.version,
            tags: &event.tags,
            payload: &event.payload,
        },
    )
}

/// Encodes the sealed value of a record with these fields, stored under `key`.
pub(crate) fn encode_fields(key: &[u8], event: &EventFields<'_>) -> Vec<u8> {
    let names: usize = event.writer_id.len()
        + event.manifest.len()
        + event.tags.iter().map(|t| t.len() + 3).sum::<usize>();
    let mut value = Vec::with_capacity(
        storage::SEAL_HEADER_LEN + 5 * MAX_VARINT_BYTES + 14 + names + event.payload.len(),
    );
    value.resize(storage::SEAL_HEADER_LEN, 0);
    put_varint(&mut value, event.epoch.counter);
    if event.epoch.counter != 0 {
        value.extend_from_slice(&event.epoch.writer.to_le_bytes());
    }
    put_varint(&mut value, event.tags.len() as u64);
    if !event.tags.is_empty() {
        put_varint(&mut value, event.offset);
    }
    put_varint(&mut value, event.timestamp_ms);
    put_varint(&mut value, u64::from(event.manifest_version));
    put_name(&mut value, event.writer_id);
    put_name(&mut value, event.manifest);
    for tag in event.tags {
        put_name(&mut value, tag);
    }
    value.extend_from_slice(event.payload);
    storage::seal_in_place(EVENT_RECORDS, key, &mut value);
    value
}

/// Splits format 4's epoch off the front of a body; `None` if it is cut off.
#[inline(always)]
fn split_epoch(body: &[u8]) -> Option<(Epoch, &[u8])> {
    let mut reader = BodyReader::new(body);
    let counter = reader.varint()?;
    let writer = if counter == 0 { 0 } else { reader.u64()? };
    Some((Epoch { counter, writer }, reader.rest))
}

/// The epoch of the verified record of (`persistence_id`, `sequence_nr`) stored under `key`:
/// zero for records of formats before 4 (written before replication).
pub(crate) fn epoch_of(
    persistence_id: &str,
    sequence_nr: u64,
    key: &[u8],
    value: &[u8],
) -> Result<Epoch, JournalError> {
    let (version, body) = unseal_event(persistence_id, sequence_nr, key, value)?;
    if version < RECORD_FORMAT_VERSION {
        return Ok(Epoch::ZERO);
    }
    split_epoch(body)
        .map(|(epoch, _)| epoch)
        .ok_or_else(|| undecodable(persistence_id, sequence_nr, version, "truncated epoch"))
}

/// Reads a record body front to back; every read is checked, a short body is an error.
///
/// The `*_or` reads do not return the error: they note the first problem and go on with a
/// zero or an empty name, and the decoder looks at [`BodyReader::problem`] once, at the end.
/// A record is then decoded along one straight path with its fields in registers; passing
/// each field through a `Result` kept them in memory, to be read back in other pieces than
/// they were written in, which stalled the processor on every record (measured).
struct BodyReader<'b> {
    rest: &'b [u8],
    /// The first field found missing or malformed.
    problem: Option<&'static str>,
}

impl<'b> BodyReader<'b> {
    fn new(body: &'b [u8]) -> Self {
        BodyReader {
            rest: body,
            problem: None,
        }
    }

    /// Notes `problem` (unless an earlier one was noted) and yields a stand-in value.
    #[cold]
    fn fail<T: Default>(&mut self, problem: &'static str) -> T {
        self.problem.get_or_insert(problem);
        T::default()
    }

    /// `value`, or a stand-in with `problem` noted.
    #[inline(always)]
    fn or<T: Default>(&mut self, value: Option<T>, problem: &'static str) -> T {
        match value {
            Some(value) => value,
            None => self.fail(problem),
        }
    }

    #[inline(always)]
    fn varint_or(&mut self, problem: &'static str) -> u64 {
        let value = self.varint();
        self.or(value, problem)
    }

    #[inline(always)]
    fn name_or(&mut self, problem: &'static str) -> &'b [u8] {
        let value = self.name();
        self.or(value, problem)
    }

    fn fixed_name_or(&mut self, problem: &'static str) -> &'b [u8] {
        let value = self.fixed_name();
        self.or(value, problem)
    }

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

    /// A LEB128 varint; `None` if it is cut off or does not fit in a u64.
    #[inline(always)]
    fn varint(&mut self) -> Option<u64> {
        // Lengths, counts and versions are almost always below 128: one byte.
        if let Some((&byte, rest)) = self.rest.split_first()
            && byte < 0x80
        {
            self.rest = rest;
            return Some(u64::from(byte));
        }
        self.long_varint()
    }

    /// A varint of more than one byte. Up to eight bytes, and with eight bytes left to read
    /// (every record's timestamp, six bytes, in front of its names and payload), it is taken
    /// from one little-endian word: its end is the first byte without the high bit, and its
    /// seven-bit groups are shifted together without a loop.
    #[inline(always)]
    fn long_varint(&mut self) -> Option<u64> {
        if let Some(word) = self.rest.first_chunk::<8>() {
            let word = u64::from_le_bytes(*word);
            let ends = !word & 0x8080_8080_8080_8080;
            if ends != 0 {
                // Bytes of the varint: up to and including the first without the high bit.
                let len = (ends.trailing_zeros() / 8 + 1) as usize;
                let bytes = if len == 8 {
                    word
                } else {
                    word & ((1u64 << (8 * len)) - 1)
                };
                // Group k (bits 8k..8k+7 of `bytes`, high bit dropped) goes to bits 7k.. of
                // the value.
                let mut value = 0u64;
                for k in 0..8 {
                    value |= (bytes >> k) & (0x7f << (7 * k));
                }
                self.rest = &self.rest[len..];
                return Some(value);
            }
        }
        self.varint_bytewise()
    }

    /// A varint read byte by byte: near the end of the body, or longer than eight bytes.
    #[cold]
    fn varint_bytewise(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for (i, &byte) in self.rest.iter().take(MAX_VARINT_BYTES).enumerate() {
            let bits = u64::from(byte & 0x7f);
            let shift = 7 * i as u32;
            // The tenth byte holds bit 63 alone: anything more does not fit.
            if shift == 63 && bits > 1 {
                return None;
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                self.rest = &self.rest[i + 1..];
                return Some(value);
            }
        }
        None
    }

    /// A name of format 1: `len u16 | bytes`.
    fn fixed_name(&mut self) -> Option<&'b [u8]> {
        let len = self.u16()?;
        self.take(usize::from(len))
    }

    /// A name of format 2: `len varint | bytes`.
    #[inline(always)]
    fn name(&mut self) -> Option<&'b [u8]> {
        let len = usize::try_from(self.varint()?).ok()?;
        self.take(len)
    }
}

/// The fields of a record body in front of its tags, borrowed from the body.
#[derive(Default)]
struct Header<'b> {
    offset: u64,
    timestamp_ms: u64,
    manifest_version: u32,
    writer_id: &'b [u8],
    manifest: &'b [u8],
    tag_count: usize,
}

/// The header of record format 1: fixed widths, little-endian.
fn fixed_header<'b>(reader: &mut BodyReader<'b>) -> Header<'b> {
    let (Some(offset), Some(timestamp_ms), Some(manifest_version)) =
        (reader.u64(), reader.u64(), reader.u32())
    else {
        return reader.fail("truncated header");
    };
    // Struct fields are evaluated in the order written: the order of the format.
    Header {
        offset,
        timestamp_ms,
        manifest_version,
        writer_id: reader.fixed_name_or("truncated writer id"),
        manifest: reader.fixed_name_or("truncated manifest"),
        tag_count: {
            let count = reader.u16();
            usize::from(reader.or(count, "truncated tags"))
        },
    }
}

/// The header of record format 2: varints, the tag count first and an offset only if tagged.
#[inline(always)]
fn varint_header<'b>(reader: &mut BodyReader<'b>) -> Header<'b> {
    let body_len = reader.rest.len();
    let tag_count = reader.varint_or("truncated tag count");
    // Each tag takes at least its length byte, so a count beyond the body is corrupt; this
    // also bounds the allocation of the tags.
    let tag_count = match usize::try_from(tag_count) {
        Ok(count) if count <= body_len => count,
        _ => reader.fail("tag count larger than the record"),
    };
    let offset = if tag_count > 0 {
        reader.varint_or("truncated offset")
    } else {
        0
    };
    let timestamp_ms = reader.varint_or("truncated timestamp");
    let manifest_version = match u32::try_from(reader.varint_or("truncated manifest version")) {
        Ok(version) => version,
        Err(_) => reader.fail("oversized manifest version"),
    };
    Header {
        offset,
        timestamp_ms,
        manifest_version,
        writer_id: reader.name_or("truncated writer id"),
        manifest: reader.name_or("truncated manifest"),
        tag_count,
    }
}

/// A record body split at its tags: the header read, the tags and the payload still to be
/// read (names of the record's format, then the rest of the body). An untagged record's
/// payload is the rest as it is, with nothing collected on the way.
struct BodyFields<'b> {
    header: Header<'b>,
    reader: BodyReader<'b>,
}

impl<'b> BodyFields<'b> {
    /// The next tag, a name of body layout `BODY`.
    fn tag<const BODY: u8>(&mut self) -> &'b [u8] {
        if BODY == FIXED_BODY {
            self.reader.fixed_name_or("truncated tag")
        } else {
            self.reader.name_or("truncated tag")
        }
    }
}

/// Splits a body of layout `BODY` ([`FIXED_BODY`] or [`VARINT_BODY`]) at its tags; a problem
/// is noted in the reader.
#[inline(always)]
fn parse_body<const BODY: u8>(body: &[u8]) -> BodyFields<'_> {
    let mut reader = BodyReader::new(body);
    let header = if BODY == FIXED_BODY {
        fixed_header(&mut reader)
    } else {
        varint_header(&mut reader)
    };
    BodyFields { header, reader }
}

/// A decoded event record with its place in the tag order, its tags and its epoch.
pub(crate) struct DecodedEvent {
    pub offset: u64,
    pub epoch: Epoch,
    pub repr: PersistentRepr,
    pub tags: Vec<String>,
}

/// Payload bytes a decoder reserves at a time when it copies payloads out of borrowed
/// records: payloads of a chunk of events share these buffers, so a payload kept by a
/// consumer keeps at most this much memory alive (or itself, if larger).
pub(crate) const PAYLOAD_ARENA_BYTES: usize = 64 * 1024;

/// Decodes event records, sharing names between consecutive events. Payloads are slices of
/// shared buffers: of the buffer the records were read into ([`EventDecoder::decode_shared`])
/// or of an arena the decoder copies them into ([`EventDecoder::decode`]).
pub(crate) struct EventDecoder {
    writer_id: SmolStr,
    manifest_type: SmolStr,
    payloads: BytesMut,
}

impl EventDecoder {
    pub fn new() -> Self {
        EventDecoder {
            writer_id: SmolStr::default(),
            manifest_type: SmolStr::default(),
            payloads: BytesMut::new(),
        }
    }

    /// Verifies and decodes the sealed value stored under `key` for (`persistence_id`,
    /// `sequence_nr`), with its tags, copying its payload.
    pub fn decode(
        &mut self,
        persistence_id: &SmolStr,
        sequence_nr: u64,
        key: &[u8],
        value: &[u8],
    ) -> Result<DecodedEvent, JournalError> {
        let (version, body) = unseal_event(persistence_id, sequence_nr, key, value)?;
        let mut offset = 0;
        let mut tags = Vec::new();
        let mut epoch = Epoch::ZERO;
        let body = if version >= RECORD_FORMAT_VERSION {
            let Some((found, rest)) = split_epoch(body) else {
                return Err(undecodable(
                    persistence_id,
                    sequence_nr,
                    version,
                    "truncated epoch",
                ));
            };
            epoch = found;
            rest
        } else {
            body
        };
        let repr = self.decode_body(
            persistence_id,
            sequence_nr,
            version.min(RECORD_FORMAT_VARINT_XXH3),
            body,
            Self::copy_payload,
            &mut offset,
            Some(&mut tags),
        )?;
        Ok(DecodedEvent {
            offset,
            epoch,
            repr,
            tags,
        })
    }

    /// Verifies and decodes a replayed event's sealed value, stored under `key`, copying its
    /// payload. Like [`EventDecoder::decode_shared`] it skips the tags (a replayed event
    /// carries none), so that a record decodes alike whichever way its chunk hands out
    /// payloads.
    pub fn decode_copied(
        &mut self,
        persistence_id: &SmolStr,
        sequence_nr: u64,
        key: &[u8],
        value: &[u8],
    ) -> Result<PersistentRepr, JournalError> {
        let (version, body) = unseal_event(persistence_id, sequence_nr, key, value)?;
        self.decode_body(
            persistence_id,
            sequence_nr,
            version,
            body,
            Self::copy_payload,
            &mut 0,
            None,
        )
    }

    /// Copies a payload into the decoder's arena.
    fn copy_payload(&mut self, payload: &[u8]) -> Bytes {
        if self.payloads.capacity() - self.payloads.len() < payload.len() {
            self.payloads = BytesMut::with_capacity(PAYLOAD_ARENA_BYTES.max(payload.len()));
        }
        self.payloads.extend_from_slice(payload);
        self.payloads.split().freeze()
    }

    /// Verifies and decodes the record at `range` of `values`, stored under `key`, without
    /// copying its payload: the payload is a slice of `values`, and keeps all of `values`
    /// alive as long as it lives.
    ///
    /// This is a replay's decoding of every event, so the event is built once, from fields
    /// read where they lie (measured: building it through intermediate structs and results
    /// cost a replay of 100-event logs about a tenth of its time, mostly in stalls on reading
    /// back what had just been moved through memory).
    #[inline(always)]
    pub fn decode_shared(
        &mut self,
        persistence_id: &SmolStr,
        sequence_nr: u64,
        key: &[u8],
        values: &Bytes,
        range: std::ops::Range<usize>,
    ) -> Result<PersistentRepr, JournalError> {
        let end = range.end;
        let value = values.get(range).unwrap_or_default();
        let (version, body) = unseal_event(persistence_id, sequence_nr, key, value)?;
        // The payload is the rest of the body, so it ends where the record ends (and `end`
        // is inside `values`: the range was just read from it).
        let payload =
            |_: &mut Self, payload: &[u8]| values.slice(end.saturating_sub(payload.len())..end);
        let mut offset = 0;
        self.decode_body(
            persistence_id,
            sequence_nr,
            version,
            body,
            payload,
            &mut offset,
            None,
        )
    }

    /// Decodes the verified body of a record of format `version`, sets `offset` to its place
    /// in the tag order and puts its tags into `tags` (if asked for; they are skipped
    /// otherwise); `payload` makes the payload's `Bytes` from its bytes in the body.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn decode_body(
        &mut self,
        persistence_id: &SmolStr,
        sequence_nr: u64,
        version: u8,
        body: &[u8],
        payload: impl FnOnce(&mut Self, &[u8]) -> Bytes,
        offset: &mut u64,
        tags: Option<&mut Vec<String>>,
    ) -> Result<PersistentRepr, JournalError> {
        match version {
            // The epoch in front is not needed to replay an event.
            RECORD_FORMAT_VERSION => match split_epoch(body) {
                Some((_, rest)) => self.decode_layout::<VARINT_BODY>(
                    persistence_id,
                    sequence_nr,
                    version,
                    rest,
                    payload,
                    offset,
                    tags,
                ),
                None => Err(undecodable(
                    persistence_id,
                    sequence_nr,
                    version,
                    "truncated epoch",
                )),
            },
            RECORD_FORMAT_VARINT_XXH3 | RECORD_FORMAT_VARINT_BLAKE3 => self
                .decode_layout::<VARINT_BODY>(
                    persistence_id,
                    sequence_nr,
                    version,
                    body,
                    payload,
                    offset,
                    tags,
                ),
            RECORD_FORMAT_FIXED => self.decode_layout::<FIXED_BODY>(
                persistence_id,
                sequence_nr,
                version,
                body,
                payload,
                offset,
                tags,
            ),
            _ => Err(undecodable(
                persistence_id,
                sequence_nr,
                version,
                "unknown record format version",
            )),
        }
    }

    /// Decodes the body, of layout `BODY`, of a record of format `version`: see
    /// [`EventDecoder::decode_body`].
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn decode_layout<const BODY: u8>(
        &mut self,
        persistence_id: &SmolStr,
        sequence_nr: u64,
        version: u8,
        body: &[u8],
        payload: impl FnOnce(&mut Self, &[u8]) -> Bytes,
        offset: &mut u64,
        mut tags: Option<&mut Vec<String>>,
    ) -> Result<PersistentRepr, JournalError> {
        let corrupt = |detail| undecodable(persistence_id, sequence_nr, version, detail);
        let mut fields = parse_body::<BODY>(body);
        let Header {
            offset: tag_offset,
            timestamp_ms,
            manifest_version,
            writer_id,
            manifest,
            tag_count,
        } = fields.header;
        if let Some(tags) = &mut tags {
            tags.reserve_exact(tag_count);
        }
        for _ in 0..tag_count {
            let tag = fields.tag::<BODY>();
            if let Some(tags) = &mut tags {
                match std::str::from_utf8(tag) {
                    Ok(tag) => tags.push(tag.to_string()),
                    Err(_) => fields.reader.fail("tag is not UTF-8"),
                }
            }
        }
        if let Some(problem) = fields.reader.problem {
            return Err(corrupt(problem));
        }
        if !refresh_name(&mut self.writer_id, writer_id) {
            return Err(corrupt("writer id is not UTF-8"));
        }
        if !refresh_name(&mut self.manifest_type, manifest) {
            return Err(corrupt("manifest is not UTF-8"));
        }
        *offset = tag_offset;
        let payload_bytes = fields.reader.rest;
        Ok(PersistentRepr {
            persistence_id: persistence_id.clone(),
            sequence_nr,
            writer_id: self.writer_id.clone(),
            timestamp_ms,
            manifest: Manifest {
                type_name: self.manifest_type.clone(),
                version: manifest_version,
            },
            payload: payload(self, payload_bytes),
        })
    }
}

/// The error of a verified record of format `version` whose body cannot be decoded.
#[cold]
fn undecodable(persistence_id: &str, sequence_nr: u64, version: u8, detail: &str) -> JournalError {
    JournalError::Corrupt {
        persistence_id: persistence_id.to_string(),
        sequence_nr,
        detail: format!("undecodable body of record format {version}: {detail}"),
    }
}

/// Checks the format version and checksum of the sealed value of (`persistence_id`,
/// `sequence_nr`) stored under `key`, and returns its version and body.
#[inline(always)]
fn unseal_event<'v>(
    persistence_id: &str,
    sequence_nr: u64,
    key: &[u8],
    value: &'v [u8],
) -> Result<(u8, &'v [u8]), JournalError> {
    storage::unseal(EVENT_RECORDS, key, value)
        .map_err(|e| unseal_error(persistence_id, sequence_nr, e))
}

/// Makes `slot` the name in `bytes`, unless it is that already (then no UTF-8 check is
/// needed); false when the bytes are not UTF-8. It answers with a flag, and the caller clones
/// the slot: a `SmolStr` returned from an out-of-line call is read back in pieces other than
/// those it was written in, which stalls the processor on every record (measured).
fn refresh_name(slot: &mut SmolStr, bytes: &[u8]) -> bool {
    if same_bytes(slot.as_bytes(), bytes) {
        return true;
    }
    match std::str::from_utf8(bytes) {
        Ok(name) => {
            *slot = SmolStr::new(name);
            true
        }
        Err(_) => false,
    }
}

/// Whether two byte strings are equal. Names in records are short, and nearly always equal
/// to the previous record's: up to 16 bytes they are compared as two overlapping words each,
/// without a call to `memcmp`.
#[inline(always)]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let len = a.len();
    if len != b.len() {
        return false;
    }
    if (8..=16).contains(&len) {
        let word =
            |s: &[u8], at: usize| u64::from_le_bytes(s[at..at + 8].try_into().unwrap_or_default());
        return word(a, 0) == word(b, 0) && word(a, len - 8) == word(b, len - 8);
    }
    if (4..8).contains(&len) {
        let word =
            |s: &[u8], at: usize| u32::from_le_bytes(s[at..at + 4].try_into().unwrap_or_default());
        return word(a, 0) == word(b, 0) && word(a, len - 4) == word(b, len - 4);
    }
    a == b
}

/// The journal error of a record of (`persistence_id`, `sequence_nr`) that cannot be unsealed.
#[cold]
fn unseal_error(persistence_id: &str, sequence_nr: u64, e: UnsealError) -> JournalError {
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

    /// `body` sealed under `b"key"` as a record of format `version`. The formats before 3
    /// get keyed BLAKE3, built here by hand as the releases that wrote them did: keyed by the
    /// record key's length byte and bytes, zero-padded to 32 bytes.
    fn sealed(version: u8, body: &[u8]) -> Vec<u8> {
        if version >= RECORD_FORMAT_VERSION {
            return storage::seal(RecordFormat::new(version, version), b"key", body);
        }
        let mut blake3_key = [0u8; 32];
        blake3_key[..4].copy_from_slice(b"\x03key");
        let versioned_body = [&[version][..], body].concat();
        let checksum = blake3::keyed_hash(&blake3_key, &versioned_body);
        [
            &checksum.as_bytes()[..storage::CHECKSUM_LEN],
            &versioned_body,
        ]
        .concat()
    }

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
            // Names long enough for lengths of two varint bytes.
            tags in proptest::collection::vec("[a-z]{1,200}", 0..4),
            writer_id in "[a-z0-9-]{0,200}",
            offset in any::<u64>(),
            timestamp_ms in any::<u64>(),
            manifest_version in any::<u32>(),
        ) {
            let mut e = event(payload, tags);
            e.timestamp_ms = timestamp_ms;
            e.manifest.version = manifest_version;
            let value = encode_event(b"key", &writer_id, offset, &e);
            let decoded = EventDecoder::new().decode(&"pid".into(), 3, b"key", &value).unwrap();
            // Only a tagged event has a place in the tag order.
            prop_assert_eq!(decoded.offset, if e.tags.is_empty() { 0 } else { offset });
            prop_assert_eq!(decoded.repr.timestamp_ms, e.timestamp_ms);
            prop_assert_eq!(decoded.repr.payload, e.payload);
            prop_assert_eq!(decoded.tags, e.tags);
            prop_assert_eq!(decoded.repr.manifest, e.manifest);
            prop_assert_eq!(&*decoded.repr.writer_id, writer_id.as_str());
        }

        #[test]
        fn varints_round_trip(value in any::<u64>()) {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            prop_assert!(out.len() <= MAX_VARINT_BYTES);
            let mut reader = BodyReader::new(&out);
            prop_assert_eq!(reader.varint(), Some(value));
            prop_assert!(reader.rest.is_empty());
        }

        #[test]
        fn varints_followed_by_more_bytes_round_trip(
            value in any::<u64>(),
            rest in proptest::collection::vec(any::<u8>(), 0..12),
        ) {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            out.extend_from_slice(&rest);
            let mut reader = BodyReader::new(&out);
            prop_assert_eq!(reader.varint(), Some(value));
            prop_assert_eq!(reader.rest, &rest[..]);
        }

        #[test]
        fn a_varint_read_by_the_word_is_what_it_is_read_by_the_byte(
            bytes in proptest::collection::vec(
                prop_oneof![any::<u8>(), 0x80u8..=0xff, Just(0x80u8), Just(0u8)],
                0..14,
            ),
        ) {
            // Non-canonical encodings (0x80 0x00 for 0) and cut-off ones included.
            let mut by_word = BodyReader::new(&bytes);
            let mut by_byte = BodyReader::new(&bytes);
            prop_assert_eq!(by_word.varint(), by_byte.varint_bytewise());
            prop_assert_eq!(by_word.rest, by_byte.rest);
        }

        #[test]
        fn names_compared_by_the_word_are_equal_exactly_when_their_bytes_are(
            a in proptest::collection::vec(any::<u8>(), 0..40),
            flip in any::<proptest::sample::Index>(),
            same_length in any::<bool>(),
        ) {
            prop_assert!(same_bytes(&a, &a.clone()));
            // One byte changed anywhere, the length changed, or both.
            let mut b = a.clone();
            if let Some(byte) = (!b.is_empty()).then(|| flip.index(b.len())) {
                b[byte] ^= 1;
                prop_assert!(!same_bytes(&a, &b));
            }
            if !same_length {
                b.push(0);
                prop_assert!(!same_bytes(&a, &b));
            }
        }

        #[test]
        fn arbitrary_bodies_of_any_format_never_panic_the_decoder(
            version in 0u8..5,
            body in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let value = sealed(version, &body);
            let _ = EventDecoder::new().decode(&"pid".into(), 1, b"key", &value);
        }

        #[test]
        fn arbitrary_bodies_replay_alike_with_shared_or_copied_payloads(
            version in 0u8..5,
            body in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let value = sealed(version, &body);
            let values = Bytes::from(value.clone());
            let pid = SmolStr::new("pid");
            let shared = EventDecoder::new()
                .decode_shared(&pid, 1, b"key", &values, 0..values.len())
                .map_err(|e| e.to_string());
            let copied = EventDecoder::new()
                .decode_copied(&pid, 1, b"key", &value)
                .map_err(|e| e.to_string());
            prop_assert_eq!(shared, copied);
        }

        #[test]
        fn arbitrary_bytes_never_panic_the_decoder(value in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = EventDecoder::new().decode(&"pid".into(), 1, b"key", &value);
        }
    }

    #[test]
    fn altered_record_names_persistence_id_and_sequence_nr() {
        let mut value = encode_event(b"key", "w", 0, &event(vec![1, 2, 3], vec![]));
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

    #[test]
    fn varints_that_do_not_fit_or_are_cut_off_are_refused() {
        let too_long = [0xffu8; MAX_VARINT_BYTES + 1];
        assert_eq!(BodyReader::new(&too_long).varint(), None);
        // Ten bytes that all say "more follows", with or without an eleventh.
        let mut continued = [0x80u8; MAX_VARINT_BYTES + 1];
        continued[MAX_VARINT_BYTES] = 0;
        assert_eq!(BodyReader::new(&continued).varint(), None);
        continued[MAX_VARINT_BYTES - 1] = 0x81;
        assert_eq!(BodyReader::new(&continued).varint(), None);
        let mut overflow = [0xffu8; MAX_VARINT_BYTES];
        overflow[MAX_VARINT_BYTES - 1] = 0x02;
        assert_eq!(BodyReader::new(&overflow).varint(), None);
        assert_eq!(BodyReader::new(&[0x80, 0x80]).varint(), None);
        let mut max = [0xffu8; MAX_VARINT_BYTES];
        max[MAX_VARINT_BYTES - 1] = 0x01;
        assert_eq!(BodyReader::new(&max).varint(), Some(u64::MAX));
    }

    #[test]
    fn a_release_of_an_earlier_record_format_refuses_the_current_one_as_newer() {
        let value = encode_event(b"key", "w", 0, &event(vec![1], vec![]));
        assert_eq!(value[storage::CHECKSUM_LEN], RECORD_FORMAT_VERSION);
        // The version is looked at before the checksum, whichever that release verified.
        let earlier = RecordFormat::new(RECORD_FORMAT_VARINT_BLAKE3, RECORD_FORMAT_VARINT_BLAKE3);
        assert_eq!(
            storage::unseal(earlier, b"key", &value),
            Err(UnsealError::NewerVersion {
                found: RECORD_FORMAT_VERSION,
                supported: RECORD_FORMAT_VARINT_BLAKE3,
            })
        );
    }

    #[test]
    fn a_format_2_record_written_by_the_release_before_xxh3_reads_back() {
        // An event record as the last release of format 2 encoded and sealed it (keyed
        // BLAKE3), under the key of log 1's first event.
        let value: Vec<u8> = (0..FORMAT_2_RECORD.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&FORMAT_2_RECORD[i..i + 2], 16).unwrap())
            .collect();
        let key = crate::event_key(1, 1);
        let decoded = EventDecoder::new()
            .decode(&"pid".into(), 1, &key, &value)
            .unwrap();
        assert_eq!(decoded.offset, 7);
        assert_eq!(decoded.tags, vec!["red".to_string()]);
        assert_eq!(decoded.repr.timestamp_ms, 1_790_000_000_000);
        assert_eq!(&*decoded.repr.writer_id, "writer-1");
        assert_eq!(decoded.repr.manifest, Manifest::new("account.Deposited", 2));
        assert_eq!(&decoded.repr.payload[..], b"deposit 100");
        // Its checksum is still checked.
        let mut altered = value.clone();
        let last = altered.len() - 1;
        altered[last] ^= 1;
        assert!(matches!(
            EventDecoder::new().decode(&"pid".into(), 1, &key, &altered),
            Err(JournalError::Corrupt { detail, .. }) if detail.contains("checksum")
        ));
        assert!(matches!(
            EventDecoder::new().decode(&"pid".into(), 2, &crate::event_key(1, 2), &value),
            Err(JournalError::Corrupt { detail, .. }) if detail.contains("checksum")
        ));
    }

    /// See `a_format_2_record_written_by_the_release_before_xxh3_reads_back`.
    const FORMAT_2_RECORD: &str = "7a227e67fe1750ed95a18fe87043b23302010780d8c1a28c3402087772\
        697465722d31116163636f756e742e4465706f7369746564037265646465706f73697420313030";
}
