//! [`HttpSettings`]: the management API's token and the limits it is served under.

use std::fmt;
use std::io;
use std::time::Duration;
use tokio::sync::Semaphore;

/// The HTTP API's security and limits, built by the node from its configuration.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpSettings {
    /// The bearer token (`http_token`, `TESSERA_HTTP_TOKEN` or a token file). None: mutating
    /// endpoints are open, which the node allows only when HTTP binds loopback.
    pub token: Option<String>,
    /// Reads need the token too: set when HTTP binds a non-loopback address.
    pub token_required_for_reads: bool,
    /// Longest time a client may take to send a request's headers (`http_header_timeout`).
    /// Also closes keep-alive connections idle for that long.
    pub header_timeout: Duration,
    /// Longest time from a request's headers to the start of its response
    /// (`http_request_timeout`), reading the request body included; then 504. A response
    /// body that streams on (the dashboard's event stream) is not cut.
    pub request_timeout: Duration,
    /// Requests handled at once (`http_max_concurrent_requests`); beyond, 503 at once.
    /// Health probes are not counted.
    pub max_concurrent_requests: usize,
    /// Open connections (`http_max_connections`); beyond, new ones get 503 and are closed.
    pub max_connections: usize,
}

impl Default for HttpSettings {
    /// No token (loopback only), reads open, 10 s to send headers, 30 s per request, 4,096
    /// requests at once, 4,096 connections (a thousand callers at once is ordinary load, and
    /// an in-flight request costs a few kilobytes).
    fn default() -> Self {
        Self {
            token: None,
            token_required_for_reads: false,
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            max_concurrent_requests: 4096,
            max_connections: 4096,
        }
    }
}

impl fmt::Debug for HttpSettings {
    /// Everything but the token itself, so that logging the settings never leaks it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpSettings")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_required_for_reads", &self.token_required_for_reads)
            .field("header_timeout", &self.header_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("max_concurrent_requests", &self.max_concurrent_requests)
            .field("max_connections", &self.max_connections)
            .finish()
    }
}

impl HttpSettings {
    /// Refuses limits that would serve nothing or that a semaphore cannot hold.
    pub(super) fn check(&self) -> io::Result<()> {
        let invalid = |message: String| Err(io::Error::new(io::ErrorKind::InvalidInput, message));
        for (key, value) in [
            ("http_max_concurrent_requests", self.max_concurrent_requests),
            ("http_max_connections", self.max_connections),
        ] {
            if !(1..=Semaphore::MAX_PERMITS).contains(&value) {
                return invalid(format!(
                    "{key} = {value}: must be between 1 and {}",
                    Semaphore::MAX_PERMITS
                ));
            }
        }
        for (key, value) in [
            ("http_header_timeout", self.header_timeout),
            ("http_request_timeout", self.request_timeout),
        ] {
            if value.is_zero() {
                return invalid(format!("{key} must be longer than 0"));
            }
        }
        Ok(())
    }
}
