//! Versioned postcard encoding of protocol messages.
//!
//! Every payload starts with a format-version byte so that a later release can still read what
//! an older one sent, and a newer peer's message is refused with a clear error.

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The message format written by this release.
pub const MESSAGE_FORMAT_VERSION: u8 = 1;

/// A payload that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("empty message payload (expected a format-version byte)")]
    Empty,
    #[error(
        "message format version {found} is not supported (this node reads version {supported})"
    )]
    UnsupportedVersion { found: u8, supported: u8 },
    #[error("malformed {what} message: {reason}")]
    Malformed { what: &'static str, reason: String },
}

/// Encodes `message` behind the format-version byte.
pub fn encode<T: Serialize>(message: &T) -> Bytes {
    let out = vec![MESSAGE_FORMAT_VERSION];
    // Serialising plain derive(Serialize) data into a Vec cannot fail.
    match postcard::to_extend(message, out) {
        Ok(buf) => Bytes::from(buf),
        Err(_) => Bytes::from_static(&[MESSAGE_FORMAT_VERSION]),
    }
}

/// Decodes a payload written by [`encode`]; `what` names the message kind in errors.
pub fn decode<T: DeserializeOwned>(what: &'static str, payload: &[u8]) -> Result<T, DecodeError> {
    let (&version, body) = payload.split_first().ok_or(DecodeError::Empty)?;
    if version != MESSAGE_FORMAT_VERSION {
        return Err(DecodeError::UnsupportedVersion {
            found: version,
            supported: MESSAGE_FORMAT_VERSION,
        });
    }
    postcard::from_bytes(body).map_err(|e| DecodeError::Malformed {
        what,
        reason: e.to_string(),
    })
}
