//! A minimal HTTP/1.1 client for tessera's own management API on loopback: the demo and the
//! multi-process tests use it to watch nodes. Not a general-purpose client: it sends one
//! request per connection and reads a `Content-Length` body.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest response accepted (the members list of a large cluster fits easily).
const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// A request that did not produce a response.
#[derive(Debug, thiserror::Error)]
pub enum HttpClientError {
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
    match tokio::time::timeout(timeout, exchange(address, method, path, json_body)).await {
        Ok(result) => result,
        Err(_) => Err(HttpClientError::Timeout { address, timeout }),
    }
}

async fn exchange(
    address: SocketAddr,
    method: &str,
    path: &str,
    json_body: Option<&str>,
) -> Result<HttpResponse, HttpClientError> {
    let io = |source| HttpClientError::Io { address, source };
    let malformed = |reason: &str| HttpClientError::Malformed {
        address,
        reason: reason.to_string(),
    };
    let mut stream = TcpStream::connect(address).await.map_err(io)?;
    let body = json_body.unwrap_or("");
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n");
    if json_body.is_some() {
        head.push_str("Content-Type: application/json\r\n");
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    stream.write_all(head.as_bytes()).await.map_err(io)?;
    stream.write_all(body.as_bytes()).await.map_err(io)?;
    let mut raw = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = stream.read(&mut chunk).await.map_err(io)?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&chunk[..n]);
        if raw.len() > MAX_RESPONSE_BYTES {
            return Err(malformed("response larger than 4 MiB"));
        }
    }
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| malformed("no end of headers"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| malformed("no status code"))?;
    Ok(HttpResponse {
        status,
        body: body.to_string(),
    })
}
