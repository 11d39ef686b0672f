//! Sealed records: a body stored with its format version and a checksum that binds the key it
//! is stored under.
//!
//! A sealed value is `[checksum: 16 bytes][format version: u8][body]`. The checksum covers
//! the format version, the body and the record's key, so that a record that ends up under the
//! wrong key (a bug, or bytes altered in a key) is caught, not only a record whose bytes
//! changed. It is there to catch corruption, not tampering: whoever can write the store can
//! recompute it. Which checksum a record carries follows from its kind and format version
//! ([`RecordFormat`]):
//!
//! - **xxh3** (written): the 128-bit xxh3 of `format version || body`, seeded with the 64-bit
//!   xxh3 of the key, stored big-endian (xxh3's canonical byte order).
//! - **keyed BLAKE3** (written by earlier releases, still read): the first 16 bytes of BLAKE3
//!   in keyed mode over `format version || body`, keyed by the record's key made 32 bytes: a
//!   key of up to 31 bytes is its length byte and its bytes, zero-padded; a longer key is its
//!   BLAKE3 hash with the first byte set to 0xff. Keyed by the record's own key, it gave no
//!   more protection against tampering than xxh3 does, and it needed a hand-written multi-lane
//!   hasher to keep replays fast.

use xxhash_rust::xxh3::{xxh3_64, xxh3_128_with_seed};

/// Bytes of checksum kept per record: 128 bits detect any realistic corruption, and the
/// format version keeps its place (right after the checksum) in every record format.
pub const CHECKSUM_LEN: usize = 16;

/// Bytes in front of a sealed record's body.
pub const SEAL_HEADER_LEN: usize = 1 + CHECKSUM_LEN;

/// The record format versions of one kind of record (journal events, snapshots, durable
/// Distributed Data): the version this release writes, and which checksum each version
/// carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordFormat {
    current: u8,
    first_xxh3: u8,
}

impl RecordFormat {
    /// Records are written in version `current` and read up to it; versions from
    /// `first_xxh3` on carry the xxh3 checksum, earlier ones keyed BLAKE3. Panics (at
    /// compile time, in a constant) if `first_xxh3` is above `current`: new records would
    /// get a checksum their version does not say.
    pub const fn new(current: u8, first_xxh3: u8) -> Self {
        assert!(
            first_xxh3 <= current,
            "records are written with xxh3: the current version must carry it"
        );
        RecordFormat {
            current,
            first_xxh3,
        }
    }

    /// The version written, and the newest read.
    pub const fn current(&self) -> u8 {
        self.current
    }
}

/// Why a sealed value could not be opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UnsealError {
    /// The value is shorter than the header.
    #[error("record of {length_bytes} bytes is shorter than its {SEAL_HEADER_LEN}-byte header")]
    Truncated { length_bytes: usize },
    /// Written by a newer release whose record format this one does not know.
    #[error("record format version {found} is newer than the supported version {supported}")]
    NewerVersion { found: u8, supported: u8 },
    /// The checksum does not match the bytes and the key: they were altered after they were
    /// written, or the record is not under the key it was written for.
    #[error(
        "checksum mismatch: the record's bytes were altered after it was written, or it is \
         under another key"
    )]
    ChecksumMismatch,
}

/// The xxh3 checksum of `versioned_body` (the format version byte followed by the body)
/// stored under `key`.
fn xxh3_checksum(key: &[u8], versioned_body: &[u8]) -> [u8; CHECKSUM_LEN] {
    xxh3_128_with_seed(versioned_body, xxh3_64(key)).to_be_bytes()
}

/// The keyed BLAKE3 checksum earlier releases wrote, of `versioned_body` stored under `key`.
/// Out of line: it is needed only for old records, and kept out of the path of new ones.
#[inline(never)]
fn blake3_checksum(key: &[u8], versioned_body: &[u8]) -> [u8; CHECKSUM_LEN] {
    let mut blake3_key = [0u8; 32];
    if key.len() < 32 {
        blake3_key[0] = key.len() as u8;
        blake3_key[1..=key.len()].copy_from_slice(key);
    } else {
        blake3_key = *blake3::hash(key).as_bytes();
        blake3_key[0] = 0xff;
    }
    let hash = blake3::keyed_hash(&blake3_key, versioned_body);
    let mut checksum = [0u8; CHECKSUM_LEN];
    checksum.copy_from_slice(&hash.as_bytes()[..CHECKSUM_LEN]);
    checksum
}

/// Seals `body`, stored under `key`, as a record of `format`'s current version.
pub fn seal(format: RecordFormat, key: &[u8], body: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(SEAL_HEADER_LEN + body.len());
    value.resize(SEAL_HEADER_LEN, 0);
    value.extend_from_slice(body);
    seal_in_place(format, key, &mut value);
    value
}

/// Seals a value whose body was written after [`SEAL_HEADER_LEN`] placeholder bytes: fills in
/// the header without copying the body. A value shorter than the header is left alone.
pub fn seal_in_place(format: RecordFormat, key: &[u8], value: &mut [u8]) {
    let Some((checksum, versioned_body)) = value.split_first_chunk_mut::<CHECKSUM_LEN>() else {
        return;
    };
    let Some(version) = versioned_body.first_mut() else {
        return;
    };
    *version = format.current;
    *checksum = xxh3_checksum(key, versioned_body);
}

/// Seals `body`, stored under `key`, as a record of `version` of `format` (at most the
/// current one), with the checksum that version carries: as the release that wrote that
/// version sealed it. For the tests and fuzz targets of the formats still read.
#[doc(hidden)]
pub fn seal_as_version(format: RecordFormat, version: u8, key: &[u8], body: &[u8]) -> Vec<u8> {
    let mut versioned_body = Vec::with_capacity(1 + body.len());
    versioned_body.push(version);
    versioned_body.extend_from_slice(body);
    let checksum = if version >= format.first_xxh3 {
        xxh3_checksum(key, &versioned_body)
    } else {
        blake3_checksum(key, &versioned_body)
    };
    [&checksum[..], &versioned_body].concat()
}

/// Verifies a sealed value read under `key` and returns its format version and body. A
/// version above `format`'s current one is refused before the checksum is looked at, so that
/// a newer release's records are reported as such rather than as corruption.
pub fn unseal<'v>(
    format: RecordFormat,
    key: &[u8],
    value: &'v [u8],
) -> Result<(u8, &'v [u8]), UnsealError> {
    let truncated = UnsealError::Truncated {
        length_bytes: value.len(),
    };
    let (stored, versioned_body) = value.split_first_chunk::<CHECKSUM_LEN>().ok_or(truncated)?;
    let (&version, body) = versioned_body.split_first().ok_or(truncated)?;
    if version > format.current {
        return Err(UnsealError::NewerVersion {
            found: version,
            supported: format.current,
        });
    }
    let checksum = if version >= format.first_xxh3 {
        xxh3_checksum(key, versioned_body)
    } else {
        blake3_checksum(key, versioned_body)
    };
    if checksum != *stored {
        return Err(UnsealError::ChecksumMismatch);
    }
    Ok((version, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kind of record as the journal's events: versions 1 and 2 with keyed BLAKE3, 3 with
    /// xxh3.
    const FORMAT: RecordFormat = RecordFormat::new(3, 3);

    fn hex(bytes: &str) -> Vec<u8> {
        (0..bytes.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&bytes[i..i + 2], 16).unwrap())
            .collect()
    }

    /// A value sealed with keyed BLAKE3 as the releases before xxh3 sealed it, built here by
    /// hand from the layout in the module documentation.
    fn sealed_with_blake3(version: u8, key: &[u8], body: &[u8]) -> Vec<u8> {
        let mut blake3_key = [0u8; 32];
        if key.len() < 32 {
            blake3_key[0] = key.len() as u8;
            blake3_key[1..=key.len()].copy_from_slice(key);
        } else {
            blake3_key = *blake3::hash(key).as_bytes();
            blake3_key[0] = 0xff;
        }
        let mut versioned_body = vec![version];
        versioned_body.extend_from_slice(body);
        let hash = blake3::keyed_hash(&blake3_key, &versioned_body);
        let mut value = hash.as_bytes()[..CHECKSUM_LEN].to_vec();
        value.extend_from_slice(&versioned_body);
        value
    }

    /// Every value `value` becomes with one bit flipped.
    fn with_one_bit_flipped(value: &[u8]) -> impl Iterator<Item = (usize, Vec<u8>)> + '_ {
        (0..value.len() * 8).map(move |bit| {
            let mut altered = value.to_vec();
            altered[bit / 8] ^= 1 << (bit % 8);
            (bit, altered)
        })
    }

    #[test]
    fn a_sealed_record_opens_with_its_version_and_body() {
        let sealed = seal(FORMAT, b"key", b"body");
        assert_eq!(sealed[CHECKSUM_LEN], 3);
        assert_eq!(unseal(FORMAT, b"key", &sealed), Ok((3, &b"body"[..])));
        assert_eq!(
            unseal(FORMAT, b"key", &seal(FORMAT, b"key", b"")),
            Ok((3, &b""[..]))
        );
    }

    #[test]
    fn sealing_as_the_current_version_is_sealing() {
        assert_eq!(
            seal_as_version(FORMAT, 3, b"key", b"body"),
            seal(FORMAT, b"key", b"body")
        );
    }

    #[test]
    fn the_xxh3_checksum_is_laid_out_as_documented_and_stays_so() {
        let sealed = seal(FORMAT, b"key", b"body");
        let seed = xxh3_64(b"key");
        let expected = xxh3_128_with_seed(b"\x03body", seed).to_be_bytes();
        assert_eq!(sealed[..CHECKSUM_LEN], expected);
        // Stored records depend on these bytes: pinned, so that a change of the layout or of
        // the crate's output is caught here rather than as corruption in a user's store.
        assert_eq!(sealed, hex("40102b54c94bac6d3bb77b7e7ff0dd5a03626f6479"));
    }

    #[test]
    fn a_flipped_bit_in_a_new_record_is_a_checksum_mismatch() {
        // Records of 0, 1, 100 and 300 bytes: xxh3 takes several paths by length.
        for body_len in [0usize, 1, 100, 300] {
            let body: Vec<u8> = (0..body_len).map(|i| i as u8).collect();
            let sealed = seal(FORMAT, b"key", &body);
            for (bit, altered) in with_one_bit_flipped(&sealed) {
                let expected = if bit / 8 == CHECKSUM_LEN && altered[CHECKSUM_LEN] > 3 {
                    // The version byte made newer is reported as such.
                    Err(UnsealError::NewerVersion {
                        found: altered[CHECKSUM_LEN],
                        supported: 3,
                    })
                } else {
                    Err(UnsealError::ChecksumMismatch)
                };
                assert_eq!(
                    unseal(FORMAT, b"key", &altered),
                    expected,
                    "body of {body_len} bytes, bit {bit} flipped"
                );
            }
        }
    }

    #[test]
    fn a_record_under_another_key_is_a_checksum_mismatch() {
        let event_key: Vec<u8> = (1..=16).collect();
        for key in [
            &b""[..],
            b"k",
            b"k\0",
            &event_key,
            &[7u8; 31],
            &[7u8; 32],
            &[7u8; 300],
        ] {
            let sealed = seal(FORMAT, key, b"body");
            assert_eq!(unseal(FORMAT, key, &sealed), Ok((3, &b"body"[..])));
            let mut longer = key.to_vec();
            longer.push(0);
            assert_eq!(
                unseal(FORMAT, &longer, &sealed),
                Err(UnsealError::ChecksumMismatch),
                "key of {} bytes, lengthened",
                key.len()
            );
            for (bit, other) in with_one_bit_flipped(key) {
                assert_eq!(
                    unseal(FORMAT, &other, &sealed),
                    Err(UnsealError::ChecksumMismatch),
                    "key of {} bytes, bit {bit} flipped",
                    key.len()
                );
            }
        }
    }

    #[test]
    fn records_sealed_with_keyed_blake3_by_earlier_releases_open() {
        // Bytes written by the release before xxh3 (its `storage::seal`), for keys of 3, 16
        // and 40 bytes (padded, padded, hashed).
        let event_key: Vec<u8> = (1..=16).collect();
        let long_key = [7u8; 40];
        let written = [
            (
                1,
                &b"key"[..],
                &b"body"[..],
                "a8246d04f3bd1a0e2572f16163967dd101626f6479",
            ),
            (
                2,
                &event_key,
                b"a body of an event",
                "9dad0ed74eba46eeb5f58be7429c4d6d026120626f6479206f6620616e206576656e74",
            ),
            (
                1,
                &long_key,
                b"body",
                "9d422a08ab73865404f6185e8f1807cc01626f6479",
            ),
        ];
        for (version, key, body, bytes) in written {
            let value = hex(bytes);
            assert_eq!(value, sealed_with_blake3(version, key, body));
            assert_eq!(value, seal_as_version(FORMAT, version, key, body));
            assert_eq!(unseal(FORMAT, key, &value), Ok((version, body)));
            // Still checked: altered bytes and another key are caught as before.
            for (bit, altered) in with_one_bit_flipped(&value) {
                assert!(unseal(FORMAT, key, &altered).is_err(), "bit {bit} flipped");
            }
            let mut other = key.to_vec();
            other[0] ^= 1;
            assert_eq!(
                unseal(FORMAT, &other, &value),
                Err(UnsealError::ChecksumMismatch)
            );
        }
    }

    #[test]
    fn a_version_is_checked_with_the_checksum_its_kind_gave_it() {
        // Version 2 is keyed BLAKE3 for a kind that took xxh3 at 3, xxh3 for one that took
        // it at 2: neither record passes for the other.
        let blake3_record = sealed_with_blake3(2, b"key", b"body");
        let xxh3_record = seal(RecordFormat::new(2, 2), b"key", b"body");
        assert_eq!(
            unseal(FORMAT, b"key", &blake3_record),
            Ok((2, &b"body"[..]))
        );
        assert_eq!(
            unseal(FORMAT, b"key", &xxh3_record),
            Err(UnsealError::ChecksumMismatch)
        );
        assert_eq!(
            unseal(RecordFormat::new(2, 2), b"key", &blake3_record),
            Err(UnsealError::ChecksumMismatch)
        );
    }

    #[test]
    fn a_newer_version_is_reported_as_such() {
        let sealed = seal(RecordFormat::new(7, 3), b"k", b"b");
        assert_eq!(
            unseal(FORMAT, b"k", &sealed),
            Err(UnsealError::NewerVersion {
                found: 7,
                supported: 3
            })
        );
    }

    #[test]
    fn a_short_value_is_truncated_not_a_panic() {
        for len in 0..SEAL_HEADER_LEN {
            assert_eq!(
                unseal(FORMAT, b"k", &vec![1u8; len]),
                Err(UnsealError::Truncated { length_bytes: len })
            );
            let mut short = vec![0u8; len];
            seal_in_place(FORMAT, b"k", &mut short);
            assert_eq!(short, vec![0u8; len]);
        }
    }
}
