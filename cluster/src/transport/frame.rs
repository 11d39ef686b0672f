//! The wire frame: what travels inside one length-delimited TCP frame, and its codec.
//!
//! A frame on the socket is a u32 big-endian length followed by that many payload bytes. The
//! payload starts with [`FRAME_FORMAT_VERSION`] and continues with the postcard encoding of a
//! [`Frame`], so a later release can change the enum and still recognise older peers.

use super::{Lane, RemoteError, ServiceId};
use crate::address::UniqueAddress;
use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use tokio_util::codec::{Decoder, Encoder, LengthDelimitedCodec};

/// Version byte in front of every frame payload.
pub const FRAME_FORMAT_VERSION: u8 = 1;

/// Upper bound for frames before the handshake completes: handshake frames are small, and an
/// unauthenticated peer must not make us buffer `max_frame_size_bytes`.
pub const HANDSHAKE_MAX_FRAME_BYTES: usize = 1024;

/// Bytes of the length prefix in front of each frame.
const LENGTH_PREFIX_BYTES: usize = 4;

/// A 32-byte random challenge.
pub type Nonce = [u8; 32];

/// A 32-byte blake3 keyed hash proving knowledge of the cluster secret.
pub type Mac = [u8; 32];

/// Everything two nodes say to each other on a connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Frame {
    /// Acceptor → connector, first frame on a connection: a fresh challenge.
    Hello { protocol_version: u16, nonce: Nonce },
    /// Connector → acceptor: who I am, proof over the acceptor's nonce, and my own challenge.
    HandshakeInit {
        protocol_version: u16,
        from: UniqueAddress,
        mac: Mac,
        nonce: Nonce,
    },
    /// Acceptor → connector: who I am and proof over the connector's nonce (mutual auth).
    HandshakeAccept { from: UniqueAddress, mac: Mac },
    /// A fire-and-forget message for `service`.
    OneWay { service: ServiceId, payload: Bytes },
    /// A request; the response travels back on `lane` with the same `correlation_id`.
    Request {
        service: ServiceId,
        lane: Lane,
        correlation_id: u64,
        payload: Bytes,
    },
    /// The answer to the request with `correlation_id`.
    Response { correlation_id: u64, payload: Bytes },
    /// The error answer to the request with `correlation_id`: the asked peer did not serve it.
    /// Last, so the variants before it keep their encoding.
    ErrorResponse {
        correlation_id: u64,
        error: RemoteError,
    },
}

impl Frame {
    /// The variant name, for error messages that say what arrived instead of what was expected.
    pub fn kind(&self) -> &'static str {
        match self {
            Frame::Hello { .. } => "Hello",
            Frame::HandshakeInit { .. } => "HandshakeInit",
            Frame::HandshakeAccept { .. } => "HandshakeAccept",
            Frame::OneWay { .. } => "OneWay",
            Frame::Request { .. } => "Request",
            Frame::Response { .. } => "Response",
            Frame::ErrorResponse { .. } => "ErrorResponse",
        }
    }
}

/// Why bytes could not be turned into a frame (or a frame into bytes).
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {size_bytes} bytes exceeds max_frame_size_bytes={max_frame_size_bytes}")]
    TooLarge {
        size_bytes: usize,
        max_frame_size_bytes: usize,
    },
    #[error("empty frame (expected at least the format version byte)")]
    Empty,
    #[error("frame format version {got} is not supported (expected {expected})")]
    UnsupportedVersion { got: u8, expected: u8 },
    #[error("undecodable frame body: {0}")]
    Malformed(postcard::Error),
    #[error("{count} trailing bytes after the frame body (expected none)")]
    TrailingBytes { count: usize },
    #[error("connection closed in the middle of a frame with {remaining_bytes} bytes buffered")]
    Truncated { remaining_bytes: usize },
    #[error(
        "unexpected {kind} frame on an established connection (expected OneWay, Request, Response or ErrorResponse)"
    )]
    OutOfPlace { kind: &'static str },
    #[error("cannot encode frame: {0}")]
    Encode(postcard::Error),
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

impl FrameError {
    /// True for errors that mean the peer sent something it should not have (as opposed to the
    /// connection simply failing), so the connection is refused and counted as malformed.
    pub fn is_protocol_violation(&self) -> bool {
        !matches!(self, FrameError::Io(_))
    }
}

/// Encodes a frame payload: version byte, then postcard.
pub fn encode(frame: &Frame) -> Result<Bytes, FrameError> {
    // Sized for the payload at once: grown as postcard writes, the buffer would copy a
    // large payload several times over.
    let payload_bytes = match frame {
        Frame::OneWay { payload, .. }
        | Frame::Request { payload, .. }
        | Frame::Response { payload, .. } => payload.len(),
        _ => 0,
    };
    let mut buffer = Vec::with_capacity(FRAME_HEADER_CAPACITY_BYTES + payload_bytes);
    buffer.push(FRAME_FORMAT_VERSION);
    let body = postcard::to_extend(frame, buffer).map_err(FrameError::Encode)?;
    Ok(Bytes::from(body))
}

/// Room for everything of a frame but its payload: the version, the variant, ids, the
/// payload's length, and a handshake's addresses and keys.
const FRAME_HEADER_CAPACITY_BYTES: usize = 160;

/// Decodes a frame payload; any byte string gives a frame or a typed error, never a panic.
pub fn decode(payload: &[u8]) -> Result<Frame, FrameError> {
    let (&version, body) = payload.split_first().ok_or(FrameError::Empty)?;
    if version != FRAME_FORMAT_VERSION {
        return Err(FrameError::UnsupportedVersion {
            got: version,
            expected: FRAME_FORMAT_VERSION,
        });
    }
    let (frame, rest) = postcard::take_from_bytes(body).map_err(FrameError::Malformed)?;
    if !rest.is_empty() {
        return Err(FrameError::TrailingBytes { count: rest.len() });
    }
    Ok(frame)
}

/// Length-delimited framing with a size limit that names the offending length.
///
/// Wraps [`LengthDelimitedCodec`] (u32 big-endian prefix) and checks the announced length
/// itself first, so the error carries the size. The limit is raised from
/// [`HANDSHAKE_MAX_FRAME_BYTES`] to the configured maximum once the peer is authenticated.
pub struct FrameCodec {
    inner: LengthDelimitedCodec,
    max_frame_size_bytes: usize,
    /// The inner codec has consumed a length prefix and waits for the payload, so the buffer
    /// starts with payload bytes, not with a prefix to check.
    mid_frame: bool,
}

impl FrameCodec {
    /// A codec accepting frames of up to `max_frame_size_bytes` payload bytes.
    pub fn new(max_frame_size_bytes: usize) -> Self {
        let inner = LengthDelimitedCodec::builder()
            .length_field_length(LENGTH_PREFIX_BYTES)
            .big_endian()
            .max_frame_length(max_frame_size_bytes)
            .new_codec();
        Self {
            inner,
            max_frame_size_bytes,
            mid_frame: false,
        }
    }

    /// Changes the limit for subsequent frames (after the handshake).
    pub fn set_max_frame_size_bytes(&mut self, max_frame_size_bytes: usize) {
        self.inner.set_max_frame_length(max_frame_size_bytes);
        self.max_frame_size_bytes = max_frame_size_bytes;
    }

    fn too_large(&self, size_bytes: usize) -> FrameError {
        FrameError::TooLarge {
            size_bytes,
            max_frame_size_bytes: self.max_frame_size_bytes,
        }
    }
}

impl Decoder for FrameCodec {
    type Item = BytesMut;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, FrameError> {
        if !self.mid_frame {
            let announced = src
                .get(..LENGTH_PREFIX_BYTES)
                .and_then(|prefix| <[u8; LENGTH_PREFIX_BYTES]>::try_from(prefix).ok())
                .map(u32::from_be_bytes);
            if let Some(announced) = announced {
                let size_bytes = usize::try_from(announced).unwrap_or(usize::MAX);
                if size_bytes > self.max_frame_size_bytes {
                    return Err(self.too_large(size_bytes));
                }
            }
        }
        let buffered_bytes = src.len();
        let frame = self.inner.decode(src)?;
        // No frame yet but the buffer shrank: the inner codec took the prefix and now waits for
        // the payload. A complete frame ends the frame either way.
        self.mid_frame = frame.is_none() && (self.mid_frame || src.len() < buffered_bytes);
        Ok(frame)
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, FrameError> {
        match self.decode(src)? {
            Some(frame) => Ok(Some(frame)),
            None if src.is_empty() => Ok(None),
            None => Err(FrameError::Truncated {
                remaining_bytes: src.len(),
            }),
        }
    }
}

impl Encoder<Bytes> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, payload: Bytes, dst: &mut BytesMut) -> Result<(), FrameError> {
        if payload.len() > self.max_frame_size_bytes {
            return Err(self.too_large(payload.len()));
        }
        Ok(self.inner.encode(payload, dst)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::Address;
    use proptest::prelude::*;

    fn arb_bytes() -> impl Strategy<Value = Bytes> {
        proptest::collection::vec(any::<u8>(), 0..256).prop_map(Bytes::from)
    }

    fn arb_unique_address() -> impl Strategy<Value = UniqueAddress> {
        ("[a-z0-9.]{1,20}", any::<u16>(), any::<u64>())
            .prop_map(|(host, port, uid)| UniqueAddress::new(Address::new(host, port), uid))
    }

    fn arb_lane() -> impl Strategy<Value = Lane> {
        prop_oneof![Just(Lane::Control), Just(Lane::Bulk), Just(Lane::Quorum)]
    }

    fn arb_remote_error() -> impl Strategy<Value = RemoteError> {
        prop_oneof![
            any::<u16>().prop_map(|service| RemoteError::UnknownService { service }),
            (any::<u16>(), any::<u64>())
                .prop_map(|(service, capacity)| RemoteError::Overloaded { service, capacity }),
            any::<u16>().prop_map(|service| RemoteError::Dropped { service }),
            ".{0,64}".prop_map(|reason| RemoteError::Rejected { reason }),
        ]
    }

    fn arb_frame() -> impl Strategy<Value = Frame> {
        prop_oneof![
            (any::<u16>(), any::<Nonce>()).prop_map(|(protocol_version, nonce)| Frame::Hello {
                protocol_version,
                nonce
            }),
            (
                any::<u16>(),
                arb_unique_address(),
                any::<Mac>(),
                any::<Nonce>()
            )
                .prop_map(|(protocol_version, from, mac, nonce)| {
                    Frame::HandshakeInit {
                        protocol_version,
                        from,
                        mac,
                        nonce,
                    }
                }),
            (arb_unique_address(), any::<Mac>())
                .prop_map(|(from, mac)| Frame::HandshakeAccept { from, mac }),
            (any::<u16>(), arb_bytes())
                .prop_map(|(service, payload)| Frame::OneWay { service, payload }),
            (any::<u16>(), arb_lane(), any::<u64>(), arb_bytes()).prop_map(
                |(service, lane, correlation_id, payload)| Frame::Request {
                    service,
                    lane,
                    correlation_id,
                    payload
                }
            ),
            (any::<u64>(), arb_bytes()).prop_map(|(correlation_id, payload)| Frame::Response {
                correlation_id,
                payload
            }),
            (any::<u64>(), arb_remote_error()).prop_map(|(correlation_id, error)| {
                Frame::ErrorResponse {
                    correlation_id,
                    error,
                }
            }),
        ]
    }

    proptest! {
        #[test]
        fn frame_round_trips_through_encode_and_decode(frame in arb_frame()) {
            let bytes = encode(&frame).unwrap();
            prop_assert_eq!(bytes[0], FRAME_FORMAT_VERSION);
            prop_assert_eq!(decode(&bytes).unwrap(), frame);
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&bytes);
            let mut with_version = vec![FRAME_FORMAT_VERSION];
            with_version.extend_from_slice(&bytes);
            let _ = decode(&with_version);
        }

        #[test]
        fn frame_codec_on_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let mut codec = FrameCodec::new(HANDSHAKE_MAX_FRAME_BYTES);
            let mut buf = BytesMut::from(&bytes[..]);
            while let Ok(Some(frame)) = codec.decode(&mut buf) {
                let _ = decode(&frame);
            }
            let _ = codec.decode_eof(&mut buf);
        }
    }

    #[test]
    fn rejects_unknown_format_version_with_both_versions_named() {
        let mut bytes = encode(&Frame::Response {
            correlation_id: 1,
            payload: Bytes::new(),
        })
        .unwrap()
        .to_vec();
        bytes[0] = 7;
        let err = decode(&bytes).unwrap_err();
        assert_eq!(
            err.to_string(),
            "frame format version 7 is not supported (expected 1)"
        );
    }

    #[test]
    fn existing_variants_keep_their_encoding_and_error_response_comes_last() {
        // Version byte, variant index, then the fields (postcard varints, length-prefixed bytes).
        let response = Frame::Response {
            correlation_id: 1,
            payload: Bytes::from_static(b"ok"),
        };
        assert_eq!(&encode(&response).unwrap()[..], &[1, 5, 1, 2, b'o', b'k']);
        let error_response = Frame::ErrorResponse {
            correlation_id: 1,
            error: RemoteError::UnknownService { service: 7 },
        };
        assert_eq!(&encode(&error_response).unwrap()[..], &[1, 6, 1, 0, 7]);
    }

    #[test]
    fn lanes_keep_their_encoding_and_quorum_comes_last() {
        // Version byte, Request's variant index, service, then the lane's variant index.
        for (lane, index) in [(Lane::Control, 0), (Lane::Bulk, 1), (Lane::Quorum, 2)] {
            let request = Frame::Request {
                service: 3,
                lane,
                correlation_id: 1,
                payload: Bytes::new(),
            };
            assert_eq!(&encode(&request).unwrap()[..], &[1, 4, 3, index, 1, 0]);
        }
    }

    #[test]
    fn malformed_error_responses_give_typed_errors() {
        let bytes = encode(&Frame::ErrorResponse {
            correlation_id: 1,
            error: RemoteError::Dropped { service: 7 },
        })
        .unwrap()
        .to_vec();
        assert_eq!(bytes, [1, 6, 1, 2, 7]);
        let unknown_error_kind = [1, 6, 1, 99, 7];
        let cut_inside_the_error = &bytes[..4];
        let reason_not_utf8 = [1, 6, 1, 3, 2, 0xff, 0xfe];
        let reason_longer_than_the_frame = [1, 6, 1, 3, 200, b'x'];
        for malformed in [
            &unknown_error_kind[..],
            cut_inside_the_error,
            &reason_not_utf8[..],
            &reason_longer_than_the_frame[..],
        ] {
            assert!(
                matches!(decode(malformed), Err(FrameError::Malformed(_))),
                "{malformed:?} gave {:?}",
                decode(malformed)
            );
        }
    }

    #[test]
    fn rejects_trailing_bytes() {
        let mut bytes = encode(&Frame::Response {
            correlation_id: 1,
            payload: Bytes::new(),
        })
        .unwrap()
        .to_vec();
        bytes.push(0);
        assert!(matches!(
            decode(&bytes),
            Err(FrameError::TrailingBytes { count: 1 })
        ));
    }

    #[test]
    fn codec_names_oversize_length_and_limit() {
        let mut codec = FrameCodec::new(4_194_304);
        let mut buf = BytesMut::from(&9_000_000u32.to_be_bytes()[..]);
        let err = codec.decode(&mut buf).unwrap_err();
        assert_eq!(
            err.to_string(),
            "frame of 9000000 bytes exceeds max_frame_size_bytes=4194304"
        );
    }

    #[test]
    fn codec_does_not_mistake_payload_bytes_for_a_length_prefix() {
        let mut codec = FrameCodec::new(1024);
        let mut buf = BytesMut::from(&100u32.to_be_bytes()[..]);
        buf.extend_from_slice(&[0xff; 10]);
        assert!(codec.decode(&mut buf).unwrap().is_none());
        buf.extend_from_slice(&[0xff; 90]);
        assert_eq!(
            &codec.decode(&mut buf).unwrap().unwrap()[..],
            &[0xff; 100][..]
        );
        buf.extend_from_slice(&2000u32.to_be_bytes());
        assert!(matches!(
            codec.decode(&mut buf),
            Err(FrameError::TooLarge {
                size_bytes: 2000,
                ..
            })
        ));
    }

    #[test]
    fn codec_reports_truncated_frame_at_eof() {
        let mut codec = FrameCodec::new(1024);
        let mut buf = BytesMut::from(&[0u8, 0, 0, 10, 1, 2][..]);
        assert!(matches!(
            codec.decode_eof(&mut buf),
            Err(FrameError::Truncated { .. })
        ));
    }
}
