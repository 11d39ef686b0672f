//! The connection handshake as pure functions: who speaks first, what is proven, what is checked.
//!
//! ```text
//! acceptor  → connector  Hello { protocol_version, nonce_a }
//! connector → acceptor   HandshakeInit { protocol_version, from, mac(nonce_a, from), nonce_c }
//! acceptor  → connector  HandshakeAccept { from, mac(nonce_c, from) }
//! ```
//! `mac` is a blake3 keyed hash over `nonce || postcard(UniqueAddress)` with a key derived from
//! the cluster secret, so both sides prove the secret without sending it, and each proof is
//! bound to a fresh challenge and to the identity it claims. No IO happens here: the TCP layer
//! moves the frames and applies the timeouts.

use super::frame::{Frame, Mac, Nonce};
use crate::address::UniqueAddress;

/// Version of the handshake and message protocol; both sides must speak the same one.
pub const PROTOCOL_VERSION: u16 = 1;

/// Context string for deriving the MAC key from the configured secret (blake3 `derive_key`).
const KEY_CONTEXT: &str = "tessera cluster secret v1";

/// The MAC key derived from the cluster secret; an unset secret derives from the empty string.
#[derive(Clone)]
pub struct SecretKey([u8; 32]);

impl SecretKey {
    /// Derives the key; every node of a cluster must be configured with the same secret.
    pub fn derive(cluster_secret: Option<&str>) -> Self {
        let secret = cluster_secret.unwrap_or("");
        Self(blake3::derive_key(KEY_CONTEXT, secret.as_bytes()))
    }
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKey(..)")
    }
}

/// Why a handshake failed; the TCP layer maps these to refusal counters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("peer speaks protocol version {got} (expected {expected})")]
    UnsupportedVersion { got: u16, expected: u16 },
    #[error(
        "peer claiming to be {claimed} failed the cluster secret check (wrong or missing cluster_secret)"
    )]
    BadMac { claimed: UniqueAddress },
    #[error("unexpected {got} frame during handshake (expected {expected})")]
    UnexpectedFrame {
        got: &'static str,
        expected: &'static str,
    },
    #[error("cannot encode address for the MAC: {0}")]
    Encode(String),
}

impl HandshakeError {
    /// True when the peer failed to prove the secret (as opposed to speaking garbage).
    pub fn is_auth_failure(&self) -> bool {
        matches!(self, HandshakeError::BadMac { .. })
    }
}

/// The keyed hash over `nonce || postcard(address)`.
pub fn mac(key: &SecretKey, nonce: &Nonce, address: &UniqueAddress) -> Result<Mac, HandshakeError> {
    let mut hasher = blake3::Hasher::new_keyed(&key.0);
    hasher.update(nonce);
    let encoded =
        postcard::to_allocvec(address).map_err(|e| HandshakeError::Encode(e.to_string()))?;
    hasher.update(&encoded);
    Ok(*hasher.finalize().as_bytes())
}

/// Checks a received MAC in constant time (`blake3::Hash` equality is constant time).
pub fn verify_mac(
    key: &SecretKey,
    nonce: &Nonce,
    address: &UniqueAddress,
    received: &Mac,
) -> Result<(), HandshakeError> {
    let expected = blake3::Hash::from(mac(key, nonce, address)?);
    if expected == blake3::Hash::from(*received) {
        Ok(())
    } else {
        Err(HandshakeError::BadMac {
            claimed: address.clone(),
        })
    }
}

fn check_version(got: u16) -> Result<(), HandshakeError> {
    if got == PROTOCOL_VERSION {
        Ok(())
    } else {
        Err(HandshakeError::UnsupportedVersion {
            got,
            expected: PROTOCOL_VERSION,
        })
    }
}

/// The accepting side of one connection.
pub struct Acceptor {
    key: SecretKey,
    local: UniqueAddress,
    nonce: Nonce,
}

impl Acceptor {
    /// `nonce` must be fresh and unpredictable for every connection (injected for testability).
    pub fn new(key: SecretKey, local: UniqueAddress, nonce: Nonce) -> Self {
        Self { key, local, nonce }
    }

    /// The first frame to send.
    pub fn hello(&self) -> Frame {
        Frame::Hello {
            protocol_version: PROTOCOL_VERSION,
            nonce: self.nonce,
        }
    }

    /// Checks the connector's `HandshakeInit`; on success returns the authenticated peer and
    /// the `HandshakeAccept` frame to send back.
    pub fn on_init(&self, frame: Frame) -> Result<(UniqueAddress, Frame), HandshakeError> {
        let Frame::HandshakeInit {
            protocol_version,
            from,
            mac: their_mac,
            nonce: their_nonce,
        } = frame
        else {
            return Err(HandshakeError::UnexpectedFrame {
                got: frame.kind(),
                expected: "HandshakeInit",
            });
        };
        check_version(protocol_version)?;
        verify_mac(&self.key, &self.nonce, &from, &their_mac)?;
        let accept = Frame::HandshakeAccept {
            from: self.local.clone(),
            mac: mac(&self.key, &their_nonce, &self.local)?,
        };
        Ok((from, accept))
    }
}

/// The connecting side of one connection.
pub struct Connector {
    key: SecretKey,
    local: UniqueAddress,
    nonce: Nonce,
}

impl Connector {
    /// `nonce` must be fresh and unpredictable for every connection (injected for testability).
    pub fn new(key: SecretKey, local: UniqueAddress, nonce: Nonce) -> Self {
        Self { key, local, nonce }
    }

    /// Answers the acceptor's `Hello` with our identity, proof and challenge.
    pub fn on_hello(&self, frame: Frame) -> Result<Frame, HandshakeError> {
        let Frame::Hello {
            protocol_version,
            nonce,
        } = frame
        else {
            return Err(HandshakeError::UnexpectedFrame {
                got: frame.kind(),
                expected: "Hello",
            });
        };
        check_version(protocol_version)?;
        Ok(Frame::HandshakeInit {
            protocol_version: PROTOCOL_VERSION,
            from: self.local.clone(),
            mac: mac(&self.key, &nonce, &self.local)?,
            nonce: self.nonce,
        })
    }

    /// Checks the acceptor's proof; returns who we are connected to.
    pub fn on_accept(&self, frame: Frame) -> Result<UniqueAddress, HandshakeError> {
        let Frame::HandshakeAccept {
            from,
            mac: their_mac,
        } = frame
        else {
            return Err(HandshakeError::UnexpectedFrame {
                got: frame.kind(),
                expected: "HandshakeAccept",
            });
        };
        verify_mac(&self.key, &self.nonce, &from, &their_mac)?;
        Ok(from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::Address;

    fn ua(port: u16, uid: u64) -> UniqueAddress {
        UniqueAddress::new(Address::new("127.0.0.1", port), uid)
    }

    fn run(
        acceptor_secret: Option<&str>,
        connector_secret: Option<&str>,
    ) -> Result<(UniqueAddress, UniqueAddress), HandshakeError> {
        let acceptor = Acceptor::new(SecretKey::derive(acceptor_secret), ua(1, 10), [1; 32]);
        let connector = Connector::new(SecretKey::derive(connector_secret), ua(2, 20), [2; 32]);
        let init = connector.on_hello(acceptor.hello())?;
        let (peer_of_acceptor, accept) = acceptor.on_init(init)?;
        let peer_of_connector = connector.on_accept(accept)?;
        Ok((peer_of_acceptor, peer_of_connector))
    }

    #[test]
    fn same_secret_authenticates_both_sides() {
        assert_eq!(run(Some("s"), Some("s")), Ok((ua(2, 20), ua(1, 10))));
        assert_eq!(run(None, None), Ok((ua(2, 20), ua(1, 10))));
    }

    #[test]
    fn wrong_or_missing_secret_is_refused_as_auth_failure() {
        for (a, c) in [(Some("s"), Some("t")), (Some("s"), None), (None, Some("s"))] {
            let err = run(a, c).unwrap_err();
            assert!(err.is_auth_failure(), "{err}");
        }
    }

    #[test]
    fn forged_identity_fails_even_with_a_valid_mac_for_another_address() {
        let key = SecretKey::derive(Some("s"));
        let acceptor = Acceptor::new(key.clone(), ua(1, 10), [1; 32]);
        let Frame::HandshakeInit { mac, nonce, .. } = Connector::new(key, ua(2, 20), [2; 32])
            .on_hello(acceptor.hello())
            .unwrap()
        else {
            unreachable!()
        };
        let forged = Frame::HandshakeInit {
            protocol_version: PROTOCOL_VERSION,
            from: ua(3, 30),
            mac,
            nonce,
        };
        assert_eq!(
            acceptor.on_init(forged).unwrap_err(),
            HandshakeError::BadMac { claimed: ua(3, 30) }
        );
    }

    #[test]
    fn other_protocol_version_is_refused_with_both_versions_named() {
        let connector = Connector::new(SecretKey::derive(None), ua(2, 20), [2; 32]);
        let err = connector
            .on_hello(Frame::Hello {
                protocol_version: 9,
                nonce: [0; 32],
            })
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "peer speaks protocol version 9 (expected 1)"
        );
    }

    #[test]
    fn unexpected_frame_names_what_arrived() {
        let acceptor = Acceptor::new(SecretKey::derive(None), ua(1, 10), [1; 32]);
        let err = acceptor
            .on_init(Frame::Response {
                correlation_id: 0,
                payload: Default::default(),
            })
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "unexpected Response frame during handshake (expected HandshakeInit)"
        );
    }
}
