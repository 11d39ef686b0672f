//! Targets of what the journal reads from disk: event records (every record format still
//! read) and the metadata values beside them (log states, counters, replica states).

use super::assert_round_trip;
use bytes::Bytes;
use tessera_journal::fuzzing as journal;
use tessera_journal::{JournalError, PersistentRepr, RECORD_FORMAT_VERSION, event_key};

/// The log and sequence number of the record target's record.
const PID_NUM: u64 = 7;
const SEQUENCE_NR: u64 = 3;
const PERSISTENCE_ID: &str = "account|fuzz";

/// Bytes around a record in the buffer a chunked replay reads it from: its payload must come
/// out of the record's range only.
const AROUND: &[u8] = b"<around>";

/// Target `journal_record`: a stored event record through each of the journal's decoders
/// (with tags; a replay's, copied and shared; a replica's epoch lookup). The first byte
/// chooses: the bytes as stored (checksum and all), or a body sealed as a record of format 1
/// to 4 with a valid checksum, so that the decoders behind the checksum are reached. The
/// decoders must agree, and a decoded event must encode back to itself.
pub fn journal_record(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let key = event_key(PID_NUM, SEQUENCE_NR);
    let sealed;
    let value = if mode & 1 == 0 {
        rest
    } else {
        let version = 1 + (mode >> 1) % RECORD_FORMAT_VERSION;
        sealed = journal::seal_event(version, &key, rest);
        &sealed
    };
    let decoded = journal::decode_event(PERSISTENCE_ID, SEQUENCE_NR, &key, value);
    let copied = journal::decode_event_copied(PERSISTENCE_ID, SEQUENCE_NR, &key, value);
    let buffer = Bytes::from([AROUND, value, AROUND].concat());
    let range = AROUND.len()..AROUND.len() + value.len();
    let shared = journal::decode_event_shared(PERSISTENCE_ID, SEQUENCE_NR, &key, &buffer, range);
    let outcome = |r: &Result<PersistentRepr, JournalError>| match r {
        Ok(event) => Ok(event.clone()),
        Err(e) => Err(e.to_string()),
    };
    assert_eq!(
        outcome(&copied),
        outcome(&shared),
        "a record replays differently copied and shared"
    );
    let epoch = journal::event_epoch(PERSISTENCE_ID, SEQUENCE_NR, &key, value);
    let Ok((offset, writer_epoch, event, tags)) = decoded else {
        return;
    };
    // Tags are checked only where they are read: a record whose tags are not UTF-8 replays.
    assert_eq!(
        copied.ok().as_ref(),
        Some(&event),
        "replay and query disagree"
    );
    assert_eq!(
        epoch.ok(),
        Some(writer_epoch),
        "the epoch read alone differs"
    );
    let again = journal::encode_event(&key, writer_epoch, offset, &event, &tags);
    match journal::decode_event(PERSISTENCE_ID, SEQUENCE_NR, &key, &again) {
        Ok((offset_again, epoch_again, event_again, tags_again)) => {
            assert_eq!(event_again, event, "an event changed when encoded again");
            assert_eq!(tags_again, tags);
            assert_eq!(epoch_again, writer_epoch);
            // Only a tagged event keeps its place in the tag order (format 1 kept it always).
            if !tags.is_empty() {
                assert_eq!(offset_again, offset);
            }
        }
        Err(e) => panic!("a decoded event does not decode after encoding: {e}"),
    }
}

/// Target `journal_meta`: the journal's metadata values (a log's number and state, the
/// journal's counters, a replicated log's replica state) and event keys, as read from disk.
/// Fixed-width values must encode back to their bytes.
pub fn journal_meta(data: &[u8]) {
    if let Some((pid_num, seq)) = journal::parse_event_key(data) {
        assert_eq!(event_key(pid_num, seq)[..], *data);
    }
    if let Some((pid_num, state, progress)) = journal::decode_log_value(data) {
        assert_eq!(journal::encode_log_value(pid_num, state, progress), data);
    }
    if let Some((highest, deleted_to)) = journal::decode_log_state(data) {
        journal::legacy_replica_meta(highest, deleted_to).summary();
    }
    if let Some((pid, tag, offset)) = journal::decode_counters(data) {
        assert_eq!(journal::encode_counters(pid, tag, offset), data);
    }
    if let Ok(meta) = journal::decode_replica_meta(data) {
        assert_round_trip(
            "replica state",
            &meta,
            journal::encode_replica_meta,
            journal::decode_replica_meta,
        );
        let _ = meta.committed();
        let _ = meta.summary();
    }
}

/// Valid encodings the targets' corpora start from.
pub mod seeds {
    use super::*;
    use tessera_cluster::Address;
    use tessera_journal::Manifest;
    use tessera_replication::replica::LogMeta;
    use tessera_replication::{ConfigAt, Configuration, Epoch, Position, ReplicaId};

    /// A sample event: its epoch, place in the tag order, tags, writer id and payload.
    type SampleEvent = (Epoch, u64, Vec<String>, &'static str, &'static [u8]);

    /// Events for seeds: untagged, tagged, with long names and an empty payload.
    fn sample_events() -> Vec<SampleEvent> {
        let replicated = Epoch {
            counter: 3,
            writer: 0x0123_4567_89ab_cdef,
        };
        vec![
            (Epoch::ZERO, 0, vec![], "entity-1", b"{\"deposit\": 5}"),
            (
                replicated,
                1_000_000,
                vec!["orders".into(), "eu".into()],
                "w",
                b"\x00\x01\x02",
            ),
            (
                replicated,
                7,
                vec!["t".repeat(200)],
                "a-writer-id-longer-than-twenty-three-bytes",
                b"",
            ),
        ]
    }

    /// The body of `event`'s record in `version`'s layout (1: fixed widths; 2 and 3: varints;
    /// 4: the epoch in front), as the release that wrote it laid it out.
    fn body_of(version: u8, event: &SampleEvent) -> Vec<u8> {
        let (epoch, offset, tags, writer_id, payload) = event;
        let manifest = Manifest::new("account.Event", 2);
        if version == 1 {
            let mut body = Vec::new();
            body.extend_from_slice(&offset.to_le_bytes());
            body.extend_from_slice(&1_700_000_000_000u64.to_le_bytes());
            body.extend_from_slice(&manifest.version.to_le_bytes());
            for name in [*writer_id, &manifest.type_name] {
                body.extend_from_slice(&(name.len() as u16).to_le_bytes());
                body.extend_from_slice(name.as_bytes());
            }
            body.extend_from_slice(&(tags.len() as u16).to_le_bytes());
            for tag in tags {
                body.extend_from_slice(&(tag.len() as u16).to_le_bytes());
                body.extend_from_slice(tag.as_bytes());
            }
            body.extend_from_slice(payload);
            return body;
        }
        let repr = PersistentRepr {
            sequence_nr: SEQUENCE_NR,
            timestamp_ms: 1_700_000_000_000,
            payload: Bytes::from_static(payload),
            persistence_id: PERSISTENCE_ID.into(),
            writer_id: (*writer_id).into(),
            manifest,
        };
        let written_epoch = if version == 4 { *epoch } else { Epoch::ZERO };
        let key = event_key(PID_NUM, SEQUENCE_NR);
        let record = journal::encode_event(&key, written_epoch, *offset, &repr, tags);
        let body = &record[tessera_journal::storage::SEAL_HEADER_LEN..];
        // Formats 2 and 3 are format 4 without the epoch in front (one byte for epoch zero).
        if version == 4 { body } else { &body[1..] }.to_vec()
    }

    /// Seeds of `journal_record`: records of every format as stored (mode byte 0), and their
    /// bodies to seal (the mode byte naming the format).
    pub fn journal_record() -> Vec<Vec<u8>> {
        let key = event_key(PID_NUM, SEQUENCE_NR);
        let mut seeds = Vec::new();
        for event in sample_events() {
            for version in 1..=RECORD_FORMAT_VERSION {
                let body = body_of(version, &event);
                let sealed = journal::seal_event(version, &key, &body);
                seeds.push([&[0u8][..], &sealed].concat());
                seeds.push([&[1 + ((version - 1) << 1)][..], &body].concat());
            }
        }
        seeds
    }

    fn replica(n: u16) -> ReplicaId {
        ReplicaId {
            address: Address::new("10.0.0.1", 25520 + n),
            storage_id: u64::from(n) * 1000 + 7,
        }
    }

    /// Seeds of `journal_meta`: each kind of value.
    pub fn journal_meta() -> Vec<Vec<u8>> {
        let epoch = Epoch {
            counter: 2,
            writer: 77,
        };
        let meta = LogMeta {
            promise: epoch,
            lac: 40,
            base: Position::new(10, Epoch::ZERO),
            last: Position::new(42, epoch),
            config: Some(std::sync::Arc::new(ConfigAt {
                epoch,
                config: Configuration {
                    version: 3,
                    members: vec![replica(1), replica(2), replica(3)],
                    previous: Some(vec![replica(1), replica(4)]),
                },
            })),
        };
        let mut seeds = vec![
            event_key(9, 42).to_vec(),
            journal::encode_log_value(9, None, None),
            journal::encode_log_value(9, Some((42, 10)), None),
            journal::encode_log_value(9, Some((42, 10)), Some((41, 3, 77, 40))),
            journal::encode_counters(10, 3, 1_000),
        ];
        for meta in [
            meta,
            LogMeta::default(),
            journal::legacy_replica_meta(42, 10),
        ] {
            if let Ok(bytes) = journal::encode_replica_meta(&meta) {
                seeds.push(bytes);
            }
        }
        seeds
    }
}
