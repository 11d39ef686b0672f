//! What singleton managers and proxies send each other over [`services::SINGLETON`].
//!
//! Every payload is [`codec::encode`]d: a format-version byte, then postcard. Several
//! singletons share the one service id, so every frame names its singleton.
//!
//! [`services::SINGLETON`]: crate::transport::services::SINGLETON

use crate::address::UniqueAddress;
use crate::codec::{self, DecodeError};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The hand-over protocol between the managers of one singleton (Akka's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HandOverKind {
    /// From the new oldest to a predecessor: stop your instance and tell me when it is gone.
    HandOverToMe,
    /// From a predecessor: my instance is stopping; keep waiting.
    HandOverInProgress,
    /// From a predecessor: I run no instance and never will again; you may start.
    HandOverDone,
    /// From a node that lost oldest status to the new oldest: ask me (`HandOverToMe`).
    TakeOverFromMe,
}

/// One hand-over message, between two incarnations: a receiver whose incarnation is not `to`
/// ignores it, and `from` must be the incarnation the transport authenticated.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HandOver {
    pub from: UniqueAddress,
    pub to: UniqueAddress,
    pub kind: HandOverKind,
}

/// A frame on [`services::SINGLETON`](crate::transport::services::SINGLETON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SingletonFrame {
    /// One-way, between the managers of singleton `name`.
    HandOver { name: String, hand_over: HandOver },
    /// A proxy's request for the instance of singleton `name`; answered by a [`ProxyReply`].
    Request { name: String, payload: Bytes },
}

/// The answer to a [`SingletonFrame::Request`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProxyReply {
    /// The instance's answer.
    Answer(Bytes),
    /// The instance does not run on this node (or never saw the request: it stopped first);
    /// the proxy may send the request again elsewhere.
    NotRunningHere,
    /// The instance's request queue is full; the request was not delivered.
    Overloaded { capacity: u64 },
}

impl SingletonFrame {
    pub fn encode(&self) -> Bytes {
        codec::encode(self)
    }

    /// Decodes a frame; a malformed or foreign-version payload is a typed error.
    pub fn decode(payload: &[u8]) -> Result<Self, DecodeError> {
        codec::decode("singleton", payload)
    }
}

impl ProxyReply {
    pub fn encode(&self) -> Bytes {
        codec::encode(self)
    }

    /// Decodes an answer; a malformed or foreign-version payload is a typed error.
    pub fn decode(payload: &[u8]) -> Result<Self, DecodeError> {
        codec::decode("singleton reply", payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::Address;
    use proptest::prelude::*;

    fn node(port: u16, uid: u64) -> UniqueAddress {
        UniqueAddress::new(Address::new("10.0.0.1", port), uid)
    }

    #[test]
    fn frames_round_trip_behind_a_version_byte() {
        let frames = [
            SingletonFrame::HandOver {
                name: "coordinator".into(),
                hand_over: HandOver {
                    from: node(1, 7),
                    to: node(2, 9),
                    kind: HandOverKind::HandOverToMe,
                },
            },
            SingletonFrame::Request {
                name: "coordinator".into(),
                payload: Bytes::from_static(b"where is shard 17"),
            },
        ];
        for frame in frames {
            let bytes = frame.encode();
            assert_eq!(bytes[0], codec::MESSAGE_FORMAT_VERSION);
            assert_eq!(SingletonFrame::decode(&bytes), Ok(frame));
        }
        for reply in [
            ProxyReply::Answer(Bytes::from_static(b"node 3")),
            ProxyReply::NotRunningHere,
            ProxyReply::Overloaded { capacity: 10 },
        ] {
            assert_eq!(ProxyReply::decode(&reply.encode()), Ok(reply));
        }
    }

    #[test]
    fn a_newer_format_is_refused_by_name() {
        let mut bytes = SingletonFrame::Request {
            name: "c".into(),
            payload: Bytes::new(),
        }
        .encode()
        .to_vec();
        bytes[0] = 2;
        assert_eq!(
            SingletonFrame::decode(&bytes),
            Err(DecodeError::UnsupportedVersion {
                found: 2,
                supported: 1
            })
        );
        assert_eq!(SingletonFrame::decode(&[]), Err(DecodeError::Empty));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = SingletonFrame::decode(&bytes);
            let _ = ProxyReply::decode(&bytes);
        }

        #[test]
        fn truncated_frames_are_errors(cut in 0usize..40) {
            let bytes = SingletonFrame::HandOver {
                name: "coordinator".into(),
                hand_over: HandOver {
                    from: node(1, 7),
                    to: node(2, 9),
                    kind: HandOverKind::HandOverDone,
                },
            }
            .encode();
            prop_assume!(cut < bytes.len());
            prop_assert!(SingletonFrame::decode(&bytes[..cut]).is_err());
        }
    }
}
