//! Node addresses: `host:port`, and one incarnation of a node at that address.

use serde::{Deserialize, Serialize};
use smol_str::SmolStr;
use std::fmt;
use std::str::FromStr;

/// Where a node listens for cluster traffic, written `host:port`.
///
/// Ordering is by host then port; the leader is the first eligible member in this order, so
/// every node must compute it the same way (it is derived, never hashed).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Address {
    /// Inline when short (an IP address or a short name): cloning an address allocates
    /// nothing. Encoded as a string.
    pub host: SmolStr,
    pub port: u16,
}

impl Address {
    pub fn new(host: impl Into<SmolStr>, port: u16) -> Self {
        Self {
            host: host.into(),
            port,
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// A string that is not `host:port`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid address {input:?}: {reason} (expected host:port, e.g. 127.0.0.1:25520)")]
pub struct AddressParseError {
    pub input: String,
    pub reason: &'static str,
}

impl FromStr for Address {
    type Err = AddressParseError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason| AddressParseError {
            input: input.to_string(),
            reason,
        };
        let (host, port) = input.rsplit_once(':').ok_or_else(|| err("no ':port'"))?;
        if host.is_empty() {
            return Err(err("empty host"));
        }
        if host.chars().any(|c| c.is_whitespace() || c == '/') {
            return Err(err("host contains whitespace or '/'"));
        }
        let port: u16 = port
            .parse()
            .map_err(|_| err("port is not a number in 0..=65535"))?;
        Ok(Address::new(host, port))
    }
}

/// One incarnation of a node: its address plus a random uid drawn when the process starts.
///
/// A restarted node at the same address has a new uid, which lets the cluster tell the new
/// incarnation from the old one and down the old one.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct UniqueAddress {
    pub address: Address,
    pub uid: u64,
}

impl UniqueAddress {
    pub fn new(address: Address, uid: u64) -> Self {
        Self { address, uid }
    }
}

impl fmt::Display for UniqueAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.address, self.uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_host_and_port() {
        let a: Address = "127.0.0.1:25520".parse().unwrap();
        assert_eq!(a, Address::new("127.0.0.1", 25520));
        assert_eq!(a.to_string(), "127.0.0.1:25520");
    }

    /// Nodes of releases whose host was a `String` encoded it the same way: a host inline
    /// or not, the bytes on the wire do not change.
    #[test]
    fn encodes_as_a_string_host_and_a_port() {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct StringHost {
            host: String,
            port: u16,
        }
        for host in [
            "127.0.0.1",
            "a-host-name-longer-than-twenty-three-bytes.example",
        ] {
            let address = Address::new(host, 25520);
            let earlier = StringHost {
                host: host.to_string(),
                port: 25520,
            };
            let bytes = postcard::to_allocvec(&address).unwrap();
            assert_eq!(bytes, postcard::to_allocvec(&earlier).unwrap());
            assert_eq!(postcard::from_bytes::<Address>(&bytes).unwrap(), address);
        }
    }

    #[test]
    fn rejects_malformed_addresses_with_reason() {
        for bad in ["", "127.0.0.1", ":80", "h:99999", "h:x", "a b:1"] {
            let e = bad.parse::<Address>().unwrap_err();
            assert_eq!(e.input, bad);
        }
    }
}
