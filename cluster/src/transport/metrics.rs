//! Transport counters: what came in, what went out, and every reason something was dropped.

use std::sync::atomic::{AtomicU64, Ordering};

/// Declares the counters once and derives both the atomic struct and its plain snapshot, so a
/// new counter cannot be added to one and forgotten in the other.
macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),+ $(,)?) => {
        /// Live transport counters, updated with relaxed atomics from every task of a node's
        /// transport; read them with [`TransportMetrics::snapshot`].
        #[derive(Debug, Default)]
        pub struct TransportMetrics {
            $($(#[$doc])* pub(crate) $name: AtomicU64,)+
        }

        /// A point-in-time copy of [`TransportMetrics`], for assertions and the metrics endpoint.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct MetricsSnapshot {
            $($(#[$doc])* pub $name: u64,)+
        }

        impl TransportMetrics {
            /// Copies every counter; counters are read one by one, so the copy is not atomic
            /// across counters (good enough for monitoring and for tests that wait for a value).
            pub fn snapshot(&self) -> MetricsSnapshot {
                MetricsSnapshot { $($name: self.$name.load(Ordering::Relaxed),)+ }
            }
        }
    };
}

counters! {
    /// Frames received on established connections (after the handshake).
    frames_in,
    /// Frames written to established connections.
    frames_out,
    /// Frame payload bytes received (without the 4-byte length prefix).
    bytes_in,
    /// Frame payload bytes written (without the 4-byte length prefix).
    bytes_out,
    /// Messages dropped by `send`/`request` because the peer's outbound lane queue was full (in
    /// messages or in bytes).
    send_dropped_queue_full,
    /// Messages dropped because they were for a new peer while `max_peers` peers had queues.
    send_dropped_too_many_peers,
    /// Peers with outbound queues now (a gauge): members, and addresses sent to recently.
    peers,
    /// Inbound messages dropped because the registered service's queue was full.
    inbound_dropped_queue_full,
    /// Inbound messages for a service nobody registered.
    inbound_unknown_service,
    /// Responses whose request had already timed out or never existed.
    responses_unmatched,
    /// Responses from a peer other than the one the request went to, dropped without touching
    /// the request. A peer known under two addresses (an alias, a different advertised host)
    /// shows up here: requests must name a peer by the address it announces itself with.
    responses_wrong_peer,
    /// Inbound connections that completed the handshake.
    connections_accepted,
    /// Connections refused because the peer could not prove the cluster secret (or, on the
    /// connecting side, the acceptor could not).
    connections_refused_auth,
    /// Connections closed for garbage bytes, undecodable frames or unsupported versions.
    connections_refused_malformed,
    /// Connections closed because a frame exceeded `max_frame_size_bytes`.
    connections_refused_oversize,
    /// Inbound connections that did not finish the handshake within `handshake_timeout`.
    handshake_timeouts,
    /// Inbound connections closed at once because `max_inbound_handshakes` connections were
    /// already in their handshake.
    connections_refused_too_many_handshakes,
    /// Inbound connections open now, in their handshake or authenticated (a gauge).
    inbound_connections,
    /// Inbound connections in their handshake now, not yet authenticated (a gauge).
    inbound_handshakes,
    /// Outbound connection attempts that failed (refused, timed out, handshake failed).
    connect_failures,
    /// Requests that got no response within their timeout.
    request_timeouts,
    /// Requests currently waiting for a response (a gauge, not a counter).
    requests_pending,
    /// Requests refused because `max_pending_requests` were waiting already.
    requests_refused_too_many_pending,
    /// Requests refused because `max_pending_requests_per_peer` requests to the same peer
    /// were waiting already.
    requests_refused_too_many_pending_for_peer,
}

impl TransportMetrics {
    pub(crate) fn incr(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add(counter: &AtomicU64, amount: usize) {
        counter.fetch_add(u64::try_from(amount).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub(crate) fn decr(counter: &AtomicU64) {
        counter.fetch_sub(1, Ordering::Relaxed);
    }
}
