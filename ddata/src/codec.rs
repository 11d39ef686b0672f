//! Versioned postcard encoding of CRDT state, for durable keys and the Replicator's payloads.
//!
//! Every encoding starts with a format-version byte, so a later release can still read state an
//! older one stored and refuses state a newer one wrote with a clear error. Decoding normalises
//! what it reads (for example zero entries or covered dots are dropped), so a decoded state is
//! canonical and merging it never panics.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The state format written by this release.
pub const DATA_FORMAT_VERSION: u8 = 1;

/// State that cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot encode {what}: {reason}")]
pub struct EncodeError {
    pub what: &'static str,
    pub reason: String,
}

/// Bytes that are not state written by [`encode`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("empty payload (expected a format-version byte)")]
    Empty,
    #[error("data format version {found} is not supported (this node reads version {supported})")]
    UnsupportedVersion { found: u8, supported: u8 },
    #[error("malformed {what}: {reason}")]
    Malformed { what: &'static str, reason: String },
}

/// Encodes `data` behind the format-version byte; `what` names the data type in errors.
///
/// Fails only for values postcard cannot express (for example a sequence of unknown length
/// from a hand-written `Serialize`); every type in this crate encodes.
pub fn encode<T: Serialize>(what: &'static str, data: &T) -> Result<Vec<u8>, EncodeError> {
    postcard::to_extend(data, vec![DATA_FORMAT_VERSION]).map_err(|e| EncodeError {
        what,
        reason: e.to_string(),
    })
}

/// The length of [`encode`]'s output for `data`, computed without building it.
pub fn encoded_size<T: Serialize>(what: &'static str, data: &T) -> Result<usize, EncodeError> {
    postcard::experimental::serialized_size(data)
        .map(|body| body + 1)
        .map_err(|e| EncodeError {
            what,
            reason: e.to_string(),
        })
}

/// Decodes bytes written by [`encode`]; `what` names the expected data type in errors.
pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, DecodeError> {
    let (&version, body) = bytes.split_first().ok_or(DecodeError::Empty)?;
    if version != DATA_FORMAT_VERSION {
        return Err(DecodeError::UnsupportedVersion {
            found: version,
            supported: DATA_FORMAT_VERSION,
        });
    }
    postcard::from_bytes(body).map_err(|e| DecodeError::Malformed {
        what,
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::version_vector::VersionVector;
    use tessera_cluster::{Address, UniqueAddress};

    #[test]
    fn round_trips_behind_the_version_byte() {
        let mut v = VersionVector::new();
        v.increment(&UniqueAddress::new(Address::new("10.0.0.1", 25520), 7));
        let bytes = encode("VersionVector", &v).unwrap();
        assert_eq!(bytes.first(), Some(&DATA_FORMAT_VERSION));
        assert_eq!(decode::<VersionVector>("VersionVector", &bytes), Ok(v));
    }

    #[test]
    fn refuses_empty_unknown_version_and_garbage() {
        assert_eq!(
            decode::<VersionVector>("VersionVector", &[]),
            Err(DecodeError::Empty)
        );
        assert_eq!(
            decode::<VersionVector>("VersionVector", &[9, 0]),
            Err(DecodeError::UnsupportedVersion {
                found: 9,
                supported: DATA_FORMAT_VERSION
            })
        );
        let garbage = decode::<VersionVector>("VersionVector", &[DATA_FORMAT_VERSION, 3, 0xff]);
        assert!(matches!(
            garbage,
            Err(DecodeError::Malformed {
                what: "VersionVector",
                ..
            })
        ));
    }

    #[test]
    fn decoding_drops_zero_entries() {
        let node = UniqueAddress::new(Address::new("10.0.0.1", 25520), 7);
        let raw: std::collections::BTreeMap<UniqueAddress, u64> = [(node, 0)].into();
        let bytes = encode("map", &raw).unwrap();
        let decoded: VersionVector = decode("VersionVector", &bytes).unwrap();
        assert!(decoded.is_empty());
    }
}
