//! Node-to-node transport: messages addressed to a service on a peer, one-way or as requests.
//!
//! [`Transport`] is what the protocol layers code against. [`tcp::TcpTransport`] is the real
//! implementation (length-delimited frames, authenticated handshake, one outbound connection per
//! peer whose control and quorum lanes never wait behind bulk data, see [`Lane`]);
//! [`memory::MemoryNetwork`] is an in-process network with the same semantics plus link faults,
//! for deterministic tests. One test suite runs against both.
//!
//! Delivery is at-most-once and ordered per (sender, receiver, lane). Every queue is bounded and
//! a full queue drops the message and counts it; nothing waits for a slow peer.
//!
//! # Requests
//!
//! [`Transport::request`] sends a payload to a service on one peer and waits for its answer.
//! The contract:
//!
//! - **At most once.** A request is sent once and never retried by the transport; it may be
//!   lost, and then the requester sees [`RequestError::Timeout`]. A timeout does not say whether
//!   the service acted on the request.
//! - **One answer per request.** The service gets a [`Responder`] that is consumed by
//!   [`Responder::respond`] or [`Responder::respond_error`]; dropping it unanswered answers
//!   [`RemoteError::Dropped`]. The first answer that matches completes the request; any later
//!   one finds no waiter and is counted in `responses_unmatched`.
//! - **Correlation ids are unique across incarnations.** Each transport draws a random start for
//!   its ids, so an answer meant for a previous incarnation at the same address does not match
//!   a request of the current one (it is counted as unmatched).
//! - **Answers only from the asked peer.** An answer counts only if it comes from the address
//!   the request was sent to, as authenticated by the handshake; one from any other peer is
//!   dropped and counted in `responses_wrong_peer`, and the request keeps waiting. Address a
//!   peer by the address it announces (the one membership reports), not by an alias.
//! - **Typed errors.** A request the peer does not serve fails fast with
//!   [`RequestError::Remote`] carrying a [`RemoteError`]: no such service, its queue is full, it
//!   dropped the request, or it rejected it with a bounded reason. Local failures are
//!   [`RequestError::Send`], [`RequestError::TooManyPending`],
//!   [`RequestError::TooManyPendingForPeer`], [`RequestError::Timeout`] and
//!   [`RequestError::Closed`].
//! - **Bounded per peer.** At most `max_pending_requests` requests wait at once, and at most
//!   `max_pending_requests_per_peer` of them for any one peer, so that a slow or paused peer
//!   cannot take every slot from the others.

mod endpoint;
pub mod frame;
pub mod handshake;
mod lanes;
pub mod link_faults;
pub mod memory;
pub mod metrics;
pub mod tcp;

#[cfg(test)]
mod tests;

pub use link_faults::{LinkDecision, LinkFaults};
pub use memory::{FrameTap, MemoryNetwork, MemoryTransport};
pub use metrics::{MetricsSnapshot, TransportMetrics};
pub use tcp::TcpTransport;

use crate::address::{Address, UniqueAddress};
use bytes::Bytes;
use frame::Frame;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::sync::Weak;
use std::time::Duration;

/// Identifies the receiving component on a node (membership, heartbeat, replicator, ...).
pub type ServiceId = u16;

/// The service ids in use; each layer that talks over the transport gets one.
pub mod services {
    use super::ServiceId;

    /// Join, gossip and other membership traffic.
    pub const MEMBERSHIP: ServiceId = 1;
    /// Failure detector heartbeats.
    pub const HEARTBEAT: ServiceId = 2;
    /// Distributed Data: the Replicator's reads, writes, deltas and anti-entropy.
    pub const REPLICATOR: ServiceId = 3;
    /// The replicated journal and snapshot store: a node's replica store.
    pub const JOURNAL_REPLICA: ServiceId = 4;
    /// Cluster singletons: the hand-over between managers and the proxies' requests.
    pub const SINGLETON: ServiceId = 5;
    /// Cluster sharding: the coordinator, the regions and their shards.
    pub const SHARDING: ServiceId = 6;
    /// Projections: a node's answer to what its projection instances do.
    pub const PROJECTIONS: ServiceId = 7;
}

/// Which outbound queue a message waits in. A peer's writer always takes the next message from
/// the first non-empty lane in the order Control, Quorum, Bulk: heartbeats and membership are
/// never behind anything, so a backlog cannot make a node look dead; quorum reads, writes and
/// their answers are never behind bulk data (anti-entropy, deltas, journal copies), so a
/// caller waiting for a quorum does not wait for megabytes of background transfer.
///
/// Ordering is per lane: messages on different lanes to one peer may overtake each other.
///
/// A request's lane travels in [`frame::Frame::Request`] (its answer comes back on it): new
/// lanes go at the end, so the existing ones keep their encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Lane {
    /// Heartbeats and membership: small, and late means "unreachable".
    Control,
    /// Background data: anything large or that can wait.
    Bulk,
    /// Requests a caller waits on for a quorum (reads, writes, their acknowledgements), which
    /// must not wait behind bulk data. Written after Control, before Bulk.
    Quorum,
}

/// A message delivered to a registered service.
#[derive(Debug)]
pub struct Inbound {
    /// The sender's incarnation, authenticated by the handshake.
    pub from: UniqueAddress,
    pub service: ServiceId,
    pub payload: Bytes,
    /// Present when the sender made a request and waits for an answer; dropping it without
    /// answering tells the requester [`RemoteError::Dropped`].
    pub reply: Option<Responder>,
}

/// The way back to a requester, good for exactly one answer: [`Responder::respond`] and
/// [`Responder::respond_error`] consume it, and dropping it unanswered sends
/// [`RemoteError::Dropped`], so the requester learns at once instead of at its timeout.
pub struct Responder {
    to: Address,
    service: ServiceId,
    lane: Lane,
    correlation_id: u64,
    // Weak: an unanswered request sitting in a service queue must not keep a shut-down
    // transport alive. `None` once the answer is queued.
    outbound: Option<Weak<dyn Outbound>>,
}

impl Responder {
    /// Sends the response on the lane the request came on; same queueing rules as `send`. A
    /// payload too large for a frame is not sent; the requester is told `Dropped` instead.
    pub fn respond(mut self, payload: Bytes) -> Result<(), SendError> {
        let frame = Frame::Response {
            correlation_id: self.correlation_id,
            payload,
        };
        self.answer(&frame)
    }

    /// Answers with an error the requester receives as [`RequestError::Remote`]; a `Rejected`
    /// reason longer than [`REJECTED_REASON_MAX_BYTES`] is cut to it.
    pub fn respond_error(mut self, error: RemoteError) -> Result<(), SendError> {
        let frame = Frame::ErrorResponse {
            correlation_id: self.correlation_id,
            error: error.bounded(),
        };
        self.answer(&frame)
    }

    /// Queues `frame` as the answer. One that could not be encoded (too large) never left, so
    /// the way back is kept and dropping `self` still answers `Dropped`.
    fn answer(&mut self, frame: &Frame) -> Result<(), SendError> {
        let outbound = self
            .outbound
            .as_ref()
            .and_then(Weak::upgrade)
            .ok_or(SendError::Closed)?;
        let queued = outbound.enqueue(&self.to, self.lane, frame);
        if !matches!(
            queued,
            Err(SendError::FrameTooLarge { .. } | SendError::Encode(_))
        ) {
            self.outbound = None;
        }
        queued
    }
}

impl Drop for Responder {
    /// Answers `Dropped` if nothing was sent. Never waits: enqueueing only tries, and a
    /// transport that is gone or shut down refuses before taking any lock.
    fn drop(&mut self) {
        if self.outbound.is_some() {
            let frame = Frame::ErrorResponse {
                correlation_id: self.correlation_id,
                error: RemoteError::Dropped {
                    service: self.service,
                },
            };
            // Best effort, like every answer: if it is lost the requester times out.
            let _ = self.answer(&frame);
        }
    }
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder")
            .field("to", &self.to)
            .field("service", &self.service)
            .field("lane", &self.lane)
            .field("correlation_id", &self.correlation_id)
            .finish()
    }
}

/// The one primitive both implementations provide: queue a frame for a peer without blocking.
pub(crate) trait Outbound: Send + Sync {
    fn enqueue(&self, to: &Address, lane: Lane, frame: &Frame) -> Result<(), SendError>;
}

/// The node-to-node transport every protocol layer codes against.
pub trait Transport: Send + Sync + 'static {
    /// This node's incarnation, with the port actually bound.
    fn local(&self) -> &UniqueAddress;

    /// Register a service; inbound messages for it go to the returned bounded receiver.
    /// Registering twice is an error.
    fn register(
        &self,
        service: ServiceId,
        queue_capacity: usize,
    ) -> Result<tokio::sync::mpsc::Receiver<Inbound>, TransportError>;

    /// Fire-and-forget, at-most-once, ordered per (sender,receiver) pair. Never blocks: when the
    /// peer's outbound queue for that lane is full the message is dropped, counted, and
    /// Err(SendError::QueueFull) returned.
    fn send(
        &self,
        to: &Address,
        service: ServiceId,
        lane: Lane,
        payload: Bytes,
    ) -> Result<(), SendError>;

    /// Request/response with a correlation id and timeout; see the module docs for the contract
    /// (at-most-once, one answer, answers only from `to`, typed errors).
    fn request(
        &self,
        to: &Address,
        service: ServiceId,
        lane: Lane,
        payload: Bytes,
        timeout: Duration,
    ) -> impl Future<Output = Result<Bytes, RequestError>> + Send;

    /// Counters for monitoring and tests.
    fn metrics(&self) -> &TransportMetrics;

    /// Stop listening, close connections; pending requests fail with a Closed error.
    fn shutdown(&self);
}

/// Errors of setting up a transport or registering a service.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("cannot bind {address}: {source}")]
    Bind {
        address: Address,
        #[source]
        source: std::io::Error,
    },
    #[error("address {address} is already bound in this in-memory network")]
    AddressInUse { address: Address },
    #[error("service {service} is already registered on {local}")]
    AlreadyRegistered {
        service: ServiceId,
        local: UniqueAddress,
    },
    #[error("queue_capacity for service {service} is 0 (expected at least 1)")]
    ZeroQueueCapacity { service: ServiceId },
    #[error("invalid transport config: {field}={value} ({expected})")]
    InvalidConfig {
        field: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("no tokio runtime: transports must be created inside one")]
    NoRuntime,
    #[error("transport {local} is shut down")]
    Closed { local: UniqueAddress },
}

/// Why a message was not queued. Queued messages may still be lost (at-most-once).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("outbound {lane:?} queue to {to} is full (capacity {capacity}); message dropped")]
    QueueFull {
        to: Address,
        lane: Lane,
        capacity: usize,
    },
    #[error(
        "outbound {lane:?} queue to {to} holds too many bytes (limit {max_bytes}); message dropped"
    )]
    QueueBytesFull {
        to: Address,
        lane: Lane,
        max_bytes: usize,
    },
    #[error(
        "{to} would be peer number {} with outbound queues (max_peers = {max_peers}); message \
         dropped",
        max_peers + 1
    )]
    TooManyPeers { to: Address, max_peers: usize },
    #[error("frame of {size_bytes} bytes exceeds max_frame_size_bytes={max_frame_size_bytes}")]
    FrameTooLarge {
        size_bytes: usize,
        max_frame_size_bytes: usize,
    },
    #[error("cannot encode frame: {0}")]
    Encode(String),
    #[error("transport is shut down")]
    Closed,
}

/// Why a request produced no response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("request to service {service} at {to} timed out after {timeout_ms} ms")]
    Timeout {
        to: Address,
        service: ServiceId,
        timeout_ms: u64,
    },
    #[error("request not sent: {0}")]
    Send(#[from] SendError),
    #[error("{pending} requests pending, max_pending_requests={max_pending_requests}")]
    TooManyPending {
        pending: usize,
        max_pending_requests: usize,
    },
    /// `to` has `max_pending_requests_per_peer` requests unanswered already (it is slow,
    /// paused or gone); the request was not sent.
    #[error(
        "{pending} requests to {to} pending, \
         max_pending_requests_per_peer={max_pending_requests_per_peer}"
    )]
    TooManyPendingForPeer {
        to: Address,
        pending: usize,
        max_pending_requests_per_peer: usize,
    },
    #[error("transport shut down while the request to {to} was pending")]
    Closed { to: Address },
    /// The asked peer answered with an error instead of a response.
    #[error("service {service} at {to} answered with an error: {error}")]
    Remote {
        to: Address,
        service: ServiceId,
        error: RemoteError,
    },
}

/// Longest [`RemoteError::Rejected`] reason, in bytes; longer ones are cut (at a character
/// boundary) when sent and again when received, so a peer cannot make us hold a long one.
pub const REJECTED_REASON_MAX_BYTES: usize = 256;

/// Why the asked peer answered a request with an error instead of a response. It travels in
/// [`frame::Frame::ErrorResponse`]: add new variants at the end, so the existing ones keep
/// their encoding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RemoteError {
    /// No service `service` is registered on the peer (never was, or it stopped).
    #[error("no service {service} is registered there")]
    UnknownService { service: ServiceId },
    /// The service's inbound queue held `capacity` messages already; the request was dropped
    /// without reaching the service.
    #[error("the inbound queue of service {service} is full (capacity {capacity})")]
    Overloaded { service: ServiceId, capacity: u64 },
    /// The service took the request but dropped it without answering.
    #[error("service {service} dropped the request without answering")]
    Dropped { service: ServiceId },
    /// The service refused the request; `reason` is at most [`REJECTED_REASON_MAX_BYTES`].
    #[error("rejected: {reason:?}")]
    Rejected { reason: String },
}

impl RemoteError {
    /// This error with a `Rejected` reason cut to [`REJECTED_REASON_MAX_BYTES`].
    pub(crate) fn bounded(self) -> Self {
        match self {
            RemoteError::Rejected { mut reason } => {
                let mut end = REJECTED_REASON_MAX_BYTES.min(reason.len());
                // At most three steps back: a UTF-8 character is at most four bytes.
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                reason.truncate(end);
                RemoteError::Rejected { reason }
            }
            other => other,
        }
    }
}

/// Settings of a node's transport; the in-memory transport uses the queue, frame and request
/// limits and ignores the socket ones.
#[derive(Clone)]
pub struct TransportConfig {
    /// Where to listen; port 0 picks a free port (see [`Transport::local`] for the real one).
    pub bind_address: Address,
    /// Host other nodes should use to reach us, when it differs from the bind host
    /// (e.g. binding 0.0.0.0).
    pub advertised_host: Option<String>,
    /// Shared secret every node of the cluster must know; `None` still runs the handshake with
    /// an empty secret (so versions and identities are checked) but authenticates nothing.
    pub cluster_secret: Option<String>,
    /// Largest frame payload accepted or sent; a larger inbound frame closes the connection.
    pub max_frame_size_bytes: usize,
    /// Outbound control-lane queue per peer.
    pub control_queue_capacity: usize,
    /// Outbound bulk-lane queue per peer.
    pub bulk_queue_capacity: usize,
    /// Outbound quorum-lane queue per peer, in messages. Every quorum read or write a node
    /// has in flight puts one message per peer here (and each answer one on the way back), so
    /// it bounds the burst of quorum operations a node can start at once; a full queue drops
    /// the message like the other lanes, and the operation times out.
    pub quorum_queue_capacity: usize,
    /// Payload bytes the control lane of one peer may hold (beyond it a message is dropped
    /// like on a full queue; an empty lane takes any frame).
    pub control_queue_bytes: usize,
    /// Payload bytes the quorum lane of one peer may hold.
    pub quorum_queue_bytes: usize,
    /// Payload bytes the bulk lane of one peer may hold.
    pub bulk_queue_bytes: usize,
    /// Peers with outbound queues at once; a send to one more is dropped (`TooManyPeers`).
    pub max_peers: usize,
    /// A peer nothing was sent to for this long has its queues and writer task dropped (they
    /// come back with the next send), so addresses that stopped being members cost nothing.
    pub idle_peer_timeout: Duration,
    pub connect_timeout: Duration,
    /// First wait after a failed connection attempt; doubles up to `reconnect_backoff_max`.
    pub reconnect_backoff_min: Duration,
    pub reconnect_backoff_max: Duration,
    /// Time an inbound or outbound connection has to complete the handshake: a client that
    /// sends nothing, garbage or a handshake one byte at a time holds its connection at most
    /// this long.
    pub handshake_timeout: Duration,
    /// Inbound connections served at once, authenticated or in their handshake; further ones
    /// wait in the listen backlog (the kernel's, bounded by `net.core.somaxconn`).
    pub max_inbound_connections: usize,
    /// Inbound connections in their handshake at once (not yet authenticated, so anyone's);
    /// one more is closed as soon as it is accepted, and counted. Smaller than
    /// `max_inbound_connections`, so that unauthenticated clients cannot take the slots of
    /// the cluster's members.
    pub max_inbound_handshakes: usize,
    /// Requests waiting for a response at once; more fail with `TooManyPending`.
    pub max_pending_requests: usize,
    /// Requests waiting for a response from one peer at once; more to that peer fail with
    /// `TooManyPendingForPeer`. At most `max_pending_requests`.
    pub max_pending_requests_per_peer: usize,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            bind_address: Address::new("127.0.0.1", 25520),
            advertised_host: None,
            cluster_secret: None,
            max_frame_size_bytes: 4 * 1024 * 1024,
            control_queue_capacity: 1024,
            bulk_queue_capacity: 4096,
            quorum_queue_capacity: 4096,
            control_queue_bytes: 8 * 1024 * 1024,
            quorum_queue_bytes: 64 * 1024 * 1024,
            bulk_queue_bytes: 64 * 1024 * 1024,
            max_peers: 1024,
            // Members hear from this node every heartbeat interval, so only addresses that
            // left (or were never members) reach it.
            idle_peer_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
            reconnect_backoff_min: Duration::from_millis(100),
            reconnect_backoff_max: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(5),
            max_inbound_connections: 1024,
            // A member opens one connection to each peer; a few hundred handshakes at once
            // cover a cluster of hundreds restarting together.
            max_inbound_handshakes: 256,
            max_pending_requests: 65_536,
            // A quarter of the table: it takes four stuck peers to exhaust it.
            max_pending_requests_per_peer: 16_384,
        }
    }
}

impl std::fmt::Debug for TransportConfig {
    // Hand-written so the secret never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransportConfig")
            .field("bind_address", &self.bind_address)
            .field("advertised_host", &self.advertised_host)
            .field(
                "cluster_secret",
                &self.cluster_secret.as_ref().map(|_| "<redacted>"),
            )
            .field("max_frame_size_bytes", &self.max_frame_size_bytes)
            .field("control_queue_capacity", &self.control_queue_capacity)
            .field("bulk_queue_capacity", &self.bulk_queue_capacity)
            .field("quorum_queue_capacity", &self.quorum_queue_capacity)
            .field("control_queue_bytes", &self.control_queue_bytes)
            .field("quorum_queue_bytes", &self.quorum_queue_bytes)
            .field("bulk_queue_bytes", &self.bulk_queue_bytes)
            .field("max_peers", &self.max_peers)
            .field("idle_peer_timeout", &self.idle_peer_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("reconnect_backoff_min", &self.reconnect_backoff_min)
            .field("reconnect_backoff_max", &self.reconnect_backoff_max)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("max_inbound_connections", &self.max_inbound_connections)
            .field("max_inbound_handshakes", &self.max_inbound_handshakes)
            .field("max_pending_requests", &self.max_pending_requests)
            .field(
                "max_pending_requests_per_peer",
                &self.max_pending_requests_per_peer,
            )
            .finish()
    }
}

impl TransportConfig {
    /// Checks every limit, naming the first bad field, its value and what is expected.
    pub fn validate(&self) -> Result<(), TransportError> {
        fn bad(
            field: &'static str,
            value: impl ToString,
            expected: &'static str,
        ) -> TransportError {
            TransportError::InvalidConfig {
                field,
                value: value.to_string(),
                expected,
            }
        }
        let max_frame_limit = usize::try_from(u32::MAX).unwrap_or(usize::MAX);
        if self.max_frame_size_bytes < frame::HANDSHAKE_MAX_FRAME_BYTES
            || self.max_frame_size_bytes > max_frame_limit
        {
            return Err(bad(
                "max_frame_size_bytes",
                self.max_frame_size_bytes,
                "expected 1024..=4294967295",
            ));
        }
        for (field, value) in [
            ("control_queue_capacity", self.control_queue_capacity),
            ("bulk_queue_capacity", self.bulk_queue_capacity),
            ("quorum_queue_capacity", self.quorum_queue_capacity),
            ("control_queue_bytes", self.control_queue_bytes),
            ("quorum_queue_bytes", self.quorum_queue_bytes),
            ("bulk_queue_bytes", self.bulk_queue_bytes),
            ("max_peers", self.max_peers),
            ("max_inbound_connections", self.max_inbound_connections),
            ("max_inbound_handshakes", self.max_inbound_handshakes),
            ("max_pending_requests", self.max_pending_requests),
            (
                "max_pending_requests_per_peer",
                self.max_pending_requests_per_peer,
            ),
        ] {
            if value == 0 {
                return Err(bad(field, value, "expected at least 1"));
            }
        }
        if self.max_pending_requests_per_peer > self.max_pending_requests {
            return Err(bad(
                "max_pending_requests_per_peer",
                self.max_pending_requests_per_peer,
                "expected at most max_pending_requests",
            ));
        }
        if self.reconnect_backoff_min.is_zero()
            || self.reconnect_backoff_min > self.reconnect_backoff_max
        {
            return Err(bad(
                "reconnect_backoff_min",
                format!("{:?}", self.reconnect_backoff_min),
                "expected > 0 and <= reconnect_backoff_max",
            ));
        }
        for (field, value) in [
            ("connect_timeout", self.connect_timeout),
            ("handshake_timeout", self.handshake_timeout),
            ("idle_peer_timeout", self.idle_peer_timeout),
        ] {
            if value.is_zero() {
                return Err(bad(field, format!("{value:?}"), "expected > 0"));
            }
        }
        Ok(())
    }
}
