//! [`HttpStats`]: what the management API's server counts, for `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of the HTTP server, for `/metrics`. `*_total` only grow; `connections_open` is a
/// gauge.
#[derive(Debug, Default)]
pub struct HttpStats {
    pub(super) connections_open: AtomicU64,
    pub(super) connections_accepted_total: AtomicU64,
    pub(super) connections_refused_total: AtomicU64,
    pub(super) header_timeouts_total: AtomicU64,
    pub(super) requests_shed_total: AtomicU64,
    pub(super) requests_timed_out_total: AtomicU64,
    pub(super) requests_unauthorized_total: AtomicU64,
}

/// A copy of [`HttpStats`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HttpStatsSnapshot {
    /// Connections open now.
    pub connections_open: u64,
    /// Connections accepted under the connection limit.
    pub connections_accepted_total: u64,
    /// Connections refused (503 and closed) because `max_connections` were open.
    pub connections_refused_total: u64,
    /// Connections closed because a request's headers, or the next request on an idle
    /// keep-alive connection, did not arrive within `header_timeout`.
    pub header_timeouts_total: u64,
    /// Requests refused with 503 because `max_concurrent_requests` were in flight.
    pub requests_shed_total: u64,
    /// Requests answered 504 because they ran longer than `request_timeout`.
    pub requests_timed_out_total: u64,
    /// Requests refused with 401 (missing or wrong bearer token).
    pub requests_unauthorized_total: u64,
}

impl HttpStats {
    /// The counters now.
    pub fn snapshot(&self) -> HttpStatsSnapshot {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        HttpStatsSnapshot {
            connections_open: read(&self.connections_open),
            connections_accepted_total: read(&self.connections_accepted_total),
            connections_refused_total: read(&self.connections_refused_total),
            header_timeouts_total: read(&self.header_timeouts_total),
            requests_shed_total: read(&self.requests_shed_total),
            requests_timed_out_total: read(&self.requests_timed_out_total),
            requests_unauthorized_total: read(&self.requests_unauthorized_total),
        }
    }

    pub(super) fn count_unauthorized(&self) {
        bump(&self.requests_unauthorized_total);
    }
}

pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}
