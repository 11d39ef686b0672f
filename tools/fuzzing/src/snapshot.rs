//! Target of what the snapshot store reads from disk: snapshot records and their keys.

use tessera_snapshot::fuzzing as snapshots;

const PERSISTENCE_ID: &str = "account|fuzz";
const SEQUENCE_NR: u64 = 12;

/// Target `snapshot_record`: a stored snapshot record as a load decodes it. The first byte
/// chooses: the bytes as stored (checksum and all), or a body sealed as a record of format 1
/// or 2 with a valid checksum, so that the decoder behind the checksum is reached. A decoded
/// snapshot must encode back to itself. The rest is also read as a key.
pub fn snapshot_record(data: &[u8]) {
    let _ = snapshots::sequence_nr_of(data);
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let key = snapshots::snapshot_key(PERSISTENCE_ID, SEQUENCE_NR);
    let sealed;
    let value = if mode & 1 == 0 {
        rest
    } else {
        let version = 1 + (mode >> 1) % snapshots::current_format_version();
        sealed = snapshots::seal_snapshot(version, &key, rest);
        &sealed
    };
    let Ok(snapshot) = snapshots::decode_snapshot(PERSISTENCE_ID, SEQUENCE_NR, &key, value) else {
        return;
    };
    assert_eq!(snapshot.metadata.sequence_nr, SEQUENCE_NR);
    let again = snapshots::encode_snapshot(
        &key,
        snapshot.metadata.timestamp_ms,
        &snapshot.manifest,
        &snapshot.payload,
    );
    match again.map(|bytes| snapshots::decode_snapshot(PERSISTENCE_ID, SEQUENCE_NR, &key, &bytes)) {
        Ok(Ok(back)) => assert_eq!(back, snapshot, "a snapshot changed when encoded again"),
        other => panic!("a decoded snapshot does not decode after encoding: {other:?}"),
    }
}

/// Valid encodings the targets' corpora start from.
pub mod seeds {
    use super::*;
    use tessera_journal::Manifest;

    /// Seeds of `snapshot_record`: records as stored (mode byte 0), and their bodies to seal
    /// as each format (mode bytes 1 and 3).
    pub fn snapshot_record() -> Vec<Vec<u8>> {
        let key = snapshots::snapshot_key(PERSISTENCE_ID, SEQUENCE_NR);
        let samples: [(&str, u32, &[u8]); 3] = [
            ("account.State", 1, b"\x05"),
            ("sharding.CoordinatorState", 2, &[0u8; 300]),
            ("", 0, b""),
        ];
        let mut seeds = Vec::new();
        for (manifest, version, payload) in samples {
            let manifest = Manifest::new(manifest, version);
            let Ok(record) =
                snapshots::encode_snapshot(&key, 1_700_000_000_000, &manifest, payload)
            else {
                continue;
            };
            let body = &record[tessera_journal::storage::SEAL_HEADER_LEN..];
            seeds.push([&[0u8][..], &record].concat());
            seeds.push([&[1u8][..], body].concat());
            seeds.push([&[3u8][..], body].concat());
        }
        seeds
    }
}
