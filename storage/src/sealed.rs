//! Sealed records: a body stored with its format version and a blake3 checksum that binds
//! the key it is stored under.
//!
//! A sealed value is `[checksum: 16 bytes][format version: u8][body]`, where the checksum is
//! the first 16 bytes of blake3 in keyed mode over `format version || body`, keyed by the
//! record's key (see [`hash_key`]). Binding the key means a record that ends up under the
//! wrong key (a bug, or bytes altered in a key) is caught, not only a record whose body
//! changed; doing it through the keyed mode rather than by hashing the key's bytes costs no
//! extra compression, which is most of the verification cost of a small event.

use crate::multihash::{self, Job, LANES};

/// Bytes of checksum kept per record: 128 bits detect any realistic corruption, and a full
/// 32-byte hash would add a fifth to a 100-byte event.
pub const CHECKSUM_LEN: usize = 16;
const _: () = assert!(CHECKSUM_LEN == multihash::OUT_LEN);

/// Bytes in front of a sealed record's body.
pub const SEAL_HEADER_LEN: usize = 1 + CHECKSUM_LEN;

/// Why a sealed value could not be opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UnsealError {
    /// The value is shorter than the header.
    #[error("record of {length_bytes} bytes is shorter than its {SEAL_HEADER_LEN}-byte header")]
    Truncated { length_bytes: usize },
    /// Written by a newer release whose record format this one does not know.
    #[error("record format version {found} is newer than the supported version {supported}")]
    NewerVersion { found: u8, supported: u8 },
    /// The checksum does not match the bytes: they were altered after they were written.
    #[error("checksum mismatch: the record's bytes were altered after it was written")]
    ChecksumMismatch,
}

/// The 32-byte blake3 key of a record key: a key of up to 31 bytes is its length byte and
/// its bytes, zero-padded (injective, and free); a longer key is hashed, with the first byte
/// set to 0xff so the two forms never meet.
fn hash_key(key: &[u8]) -> [u8; 32] {
    // The same bytes as below, for the 16-byte keys of events, built in registers: copying
    // the key in at offset 1 costs a call to memcpy and a stalled read of the result on
    // every record verified.
    if let Ok(key) = <&[u8; 16]>::try_from(key) {
        let key = u128::from_le_bytes(*key);
        let low = 16 | (key << 8);
        let high = key >> 120;
        let mut out = [0u8; 32];
        out[..16].copy_from_slice(&low.to_le_bytes());
        out[16..].copy_from_slice(&high.to_le_bytes());
        return out;
    }
    let mut out = [0u8; 32];
    if key.len() < 32 {
        out[0] = key.len() as u8;
        out[1..=key.len()].copy_from_slice(key);
    } else {
        out = *blake3::hash(key).as_bytes();
        out[0] = 0xff;
    }
    out
}

/// The checksum of `versioned_body` (the format version byte followed by the body) stored
/// under `key`.
fn checksum(key: &[u8], versioned_body: &[u8]) -> [u8; CHECKSUM_LEN] {
    multihash::keyed_hash(&hash_key(key), versioned_body)
}

/// Seals `body` stored under `key` with the given record format version.
pub fn seal(version: u8, key: &[u8], body: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(SEAL_HEADER_LEN + body.len());
    value.resize(SEAL_HEADER_LEN, 0);
    value.extend_from_slice(body);
    seal_in_place(version, key, &mut value);
    value
}

/// Seals a value whose body was written after [`SEAL_HEADER_LEN`] placeholder bytes: fills in
/// the header without copying the body. A value shorter than the header is left alone.
pub fn seal_in_place(version: u8, key: &[u8], value: &mut [u8]) {
    if value.len() < SEAL_HEADER_LEN {
        return;
    }
    value[CHECKSUM_LEN] = version;
    let sum = checksum(key, &value[CHECKSUM_LEN..]);
    value[..CHECKSUM_LEN].copy_from_slice(&sum);
}

/// Checks what can be checked of a sealed value without its checksum: its length and
/// format version. Versions above `supported` are refused before the checksum is looked at,
/// so that a newer release's records are reported as such rather than as corruption.
fn check_header(supported: u8, value: &[u8]) -> Result<(), UnsealError> {
    if value.len() < SEAL_HEADER_LEN {
        return Err(UnsealError::Truncated {
            length_bytes: value.len(),
        });
    }
    let version = value[CHECKSUM_LEN];
    if version > supported {
        return Err(UnsealError::NewerVersion {
            found: version,
            supported,
        });
    }
    Ok(())
}

/// Verifies a sealed value read under `key` and returns its body and format version.
pub fn unseal<'v>(
    supported: u8,
    key: &[u8],
    value: &'v [u8],
) -> Result<(u8, &'v [u8]), UnsealError> {
    check_header(supported, value)?;
    if checksum(key, &value[CHECKSUM_LEN..])[..] != value[..CHECKSUM_LEN] {
        return Err(UnsealError::ChecksumMismatch);
    }
    split_sealed(value).ok_or(UnsealError::Truncated {
        length_bytes: value.len(),
    })
}

/// The format version and body of a sealed value, without looking at its checksum (for a
/// value already verified, e.g. by [`check_sealed_many`]); `None` if it is shorter than the
/// header.
pub fn split_sealed(value: &[u8]) -> Option<(u8, &[u8])> {
    Some((*value.get(CHECKSUM_LEN)?, value.get(SEAL_HEADER_LEN..)?))
}

/// Records [`check_sealed_many`] verifies side by side: callers that check a long run of
/// records in pieces do best with pieces of this many.
pub const CHECK_GROUP: usize = LANES;

/// Verifies many sealed values, each read under its key, as [`unseal`] does one: the
/// checksums of several records are computed side by side (see [`multihash`]). Returns the
/// index of the first value that fails, and why; after it, nothing is known.
pub fn check_sealed_many(
    supported: u8,
    records: &[(&[u8], &[u8])],
) -> Result<(), (usize, UnsealError)> {
    for (group_index, group) in records.chunks(LANES).enumerate() {
        let first = group_index * LANES;
        let mut jobs = [Job {
            key: [0; 32],
            message: &[],
        }; LANES];
        let mut header = [Ok(()); LANES];
        for (lane, &(key, value)) in group.iter().enumerate() {
            header[lane] = check_header(supported, value);
            if header[lane].is_ok() {
                jobs[lane] = Job {
                    key: hash_key(key),
                    message: &value[CHECKSUM_LEN..],
                };
            }
        }
        let mut sums = [[0u8; CHECKSUM_LEN]; LANES];
        multihash::keyed_hash_lanes(&jobs[..group.len()], &mut sums);
        for (lane, &(_, value)) in group.iter().enumerate() {
            header[lane].map_err(|e| (first + lane, e))?;
            // Compared as arrays: as slices it is a call to memcmp for 16 bytes.
            if value.first_chunk::<CHECKSUM_LEN>() != Some(&sums[lane]) {
                return Err((first + lane, UnsealError::ChecksumMismatch));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_every_length_are_padded_by_one_rule() {
        // Stored checksums depend on these bytes: the shortcut for 16-byte keys must give
        // what the general rule gives.
        for len in 0..32usize {
            let key: Vec<u8> = (1..=len as u8).collect();
            let mut expected = [0u8; 32];
            expected[0] = len as u8;
            expected[1..=len].copy_from_slice(&key);
            assert_eq!(hash_key(&key), expected, "key of {len} bytes");
        }
        let long = [7u8; 40];
        assert_eq!(hash_key(&long)[0], 0xff);
        assert_eq!(hash_key(&long)[1..], blake3::hash(&long).as_bytes()[1..]);
    }

    #[test]
    fn sealed_record_opens_with_its_body() {
        let sealed = seal(1, b"key", b"body");
        assert_eq!(unseal(1, b"key", &sealed), Ok((1, &b"body"[..])));
    }

    #[test]
    fn altered_body_key_or_checksum_is_detected() {
        let sealed = seal(1, b"key", b"body");
        for i in 0..sealed.len() {
            let mut altered = sealed.clone();
            altered[i] ^= 0x01;
            assert_eq!(
                unseal(1, b"key", &altered),
                Err(UnsealError::ChecksumMismatch),
                "flip at byte {i}"
            );
        }
        assert_eq!(
            unseal(1, b"kez", &sealed),
            Err(UnsealError::ChecksumMismatch)
        );
    }

    #[test]
    fn keys_of_any_length_bind_the_checksum() {
        for key in [&b""[..], b"k", b"k\0", &[7u8; 31], &[7u8; 32], &[7u8; 300]] {
            let sealed = seal(1, key, b"body");
            assert_eq!(unseal(1, key, &sealed), Ok((1, &b"body"[..])));
            let mut other = key.to_vec();
            other.push(0);
            assert_eq!(
                unseal(1, &other, &sealed),
                Err(UnsealError::ChecksumMismatch)
            );
        }
    }

    #[test]
    fn newer_version_is_reported_as_such() {
        let sealed = seal(7, b"k", b"b");
        assert_eq!(
            unseal(1, b"k", &sealed),
            Err(UnsealError::NewerVersion {
                found: 7,
                supported: 1
            })
        );
    }

    #[test]
    fn many_values_are_checked_as_one_by_one() {
        let keys: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 1 + usize::from(i) * 3]).collect();
        let sealed: Vec<Vec<u8>> = keys
            .iter()
            .enumerate()
            .map(|(i, key)| seal(1, key, &vec![i as u8; i * 40]))
            .collect();
        let records = |values: &[Vec<u8>]| -> Vec<(Vec<u8>, Vec<u8>)> {
            keys.iter().cloned().zip(values.iter().cloned()).collect()
        };
        let check = |records: &[(Vec<u8>, Vec<u8>)]| {
            let refs: Vec<(&[u8], &[u8])> = records
                .iter()
                .map(|(k, v)| (k.as_slice(), v.as_slice()))
                .collect();
            check_sealed_many(1, &refs)
        };
        assert_eq!(check(&records(&sealed)), Ok(()));
        assert_eq!(check(&[]), Ok(()));
        // The first failure is reported, whichever lane of whichever group it is in.
        for bad in [0, 7, 8, 13, 19] {
            let mut altered = sealed.clone();
            let last = altered[bad].len() - 1;
            altered[bad][last] ^= 1;
            assert_eq!(
                check(&records(&altered)),
                Err((bad, UnsealError::ChecksumMismatch)),
                "altered record {bad}"
            );
            let mut newer = altered.clone();
            newer[bad + 1..]
                .iter_mut()
                .for_each(|v| v[CHECKSUM_LEN] = 9);
            assert_eq!(
                check(&records(&newer)),
                Err((bad, UnsealError::ChecksumMismatch))
            );
            let mut short = sealed.clone();
            short[bad].truncate(3);
            assert_eq!(
                check(&records(&short)),
                Err((bad, UnsealError::Truncated { length_bytes: 3 }))
            );
            let mut newer = sealed.clone();
            newer[bad][CHECKSUM_LEN] = 2;
            newer[bad + 1..].iter_mut().for_each(|v| v[0] ^= 1);
            assert_eq!(
                check(&records(&newer)),
                Err((
                    bad,
                    UnsealError::NewerVersion {
                        found: 2,
                        supported: 1
                    }
                ))
            );
        }
    }

    #[test]
    fn values_longer_than_a_hash_chunk_are_checked_among_short_ones() {
        let keys: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 16]).collect();
        let mut sealed: Vec<Vec<u8>> = keys
            .iter()
            .zip([10, 3000, 1024 - 1 - SEAL_HEADER_LEN + CHECKSUM_LEN, 0, 5000])
            .map(|(key, len)| seal(1, key, &vec![7u8; len]))
            .collect();
        let refs = |sealed: &[Vec<u8>]| -> Vec<(Vec<u8>, Vec<u8>)> {
            keys.iter().cloned().zip(sealed.iter().cloned()).collect()
        };
        let check = |records: Vec<(Vec<u8>, Vec<u8>)>| {
            let refs: Vec<(&[u8], &[u8])> = records
                .iter()
                .map(|(k, v)| (k.as_slice(), v.as_slice()))
                .collect();
            check_sealed_many(1, &refs)
        };
        assert_eq!(check(refs(&sealed)), Ok(()));
        let last = sealed[4].len() - 1;
        sealed[4][last] ^= 1;
        assert_eq!(
            check(refs(&sealed)),
            Err((4, UnsealError::ChecksumMismatch))
        );
        sealed[1][SEAL_HEADER_LEN + 2000] ^= 1;
        assert_eq!(
            check(refs(&sealed)),
            Err((1, UnsealError::ChecksumMismatch))
        );
    }

    #[test]
    fn short_value_is_truncated_not_a_panic() {
        for len in 0..SEAL_HEADER_LEN {
            assert_eq!(
                unseal(1, b"k", &vec![1u8; len]),
                Err(UnsealError::Truncated { length_bytes: len })
            );
        }
    }
}
