//! Requests to tessera's own management API on loopback (over `reqwest`): the demo and the
//! multi-process tests use them to watch nodes. Not part of the library API (hidden from its
//! documentation; public only because the integration tests are other crates): programs use
//! `tessera::client` or any HTTP client.

use std::net::SocketAddr;
use std::time::Duration;

/// Largest response accepted (the members list of a large cluster fits easily).
const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// The bearer token every request of this process sends, if set.
static TOKEN: std::sync::RwLock<Option<String>> = std::sync::RwLock::new(None);

/// Makes every later request of this process send `token` (for nodes whose HTTP API is not on
/// loopback, which require it for reads too).
pub fn use_token(token: &str) {
    *TOKEN
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(token.to_string());
}

/// A request that did not produce a response.
#[derive(Debug, thiserror::Error)]
pub enum HttpClientError {
    /// No connection could be opened: the request was never sent.
    #[error("HTTP request to {address}: cannot connect: {reason}")]
    Connect { address: SocketAddr, reason: String },
    #[error("HTTP request to {address} failed: {source}")]
    Io {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("HTTP request to {address} timed out after {timeout:?}")]
    Timeout {
        address: SocketAddr,
        timeout: Duration,
    },
    #[error("malformed HTTP response from {address}: {reason}")]
    Malformed { address: SocketAddr, reason: String },
}

/// A response: status code and body.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub body: String,
}

impl HttpResponse {
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_str(&self.body).ok()
    }
}

/// `GET path`.
pub async fn get(
    address: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<HttpResponse, HttpClientError> {
    request(address, "GET", path, None, timeout).await
}

/// A request with an optional JSON body.
pub async fn request(
    address: SocketAddr,
    method: &str,
    path: &str,
    json_body: Option<&str>,
    timeout: Duration,
) -> Result<HttpResponse, HttpClientError> {
    let io = |reason: String| HttpClientError::Io {
        address,
        source: std::io::Error::other(reason),
    };
    let method = reqwest::Method::from_bytes(method.as_bytes()).map_err(|e| io(e.to_string()))?;
    // One client for the process instead of one (with its pool and resolver) per request.
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    let client = CLIENT.get_or_init(|| {
        // No idle connections kept: one connection per request, as the nodes' connection
        // counters and idle-connection timeouts in the tests expect.
        reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap_or_default()
    });
    let mut request = client
        .request(method, format!("http://{address}{path}"))
        .timeout(timeout);
    let token = TOKEN
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = json_body {
        request = request
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.map_err(|e| {
        if e.is_connect() {
            // The error's own text names only the URL; the cause ("Connection refused") is
            // in its source chain.
            let mut reason = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                reason = cause.to_string();
                source = cause.source();
            }
            HttpClientError::Connect { address, reason }
        } else if e.is_timeout() {
            HttpClientError::Timeout { address, timeout }
        } else {
            io(e.to_string())
        }
    })?;
    let status = response.status().as_u16();
    if response
        .content_length()
        .is_some_and(|n| n > MAX_RESPONSE_BYTES as u64)
    {
        return Err(HttpClientError::Malformed {
            address,
            reason: "response larger than 4 MiB".into(),
        });
    }
    let body = response.text().await.map_err(|e| {
        if e.is_timeout() {
            HttpClientError::Timeout { address, timeout }
        } else {
            io(e.to_string())
        }
    })?;
    Ok(HttpResponse { status, body })
}
