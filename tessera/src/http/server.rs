//! The management API's server: an accept loop under a connection limit, one hyper HTTP/1
//! connection task per client with a header-read timeout, and around every request a
//! concurrency limit and a request timeout. Every limit is bounded and configurable
//! ([`HttpSettings`]); every refusal is counted ([`HttpStats`]).
//!
//! Reading order: [`HttpServer::serve`] accepts and shuts down, [`connection`] runs one
//! client, [`Requests::handle`] runs one request.

use super::settings::HttpSettings;
use super::stats::{HttpStats, bump};
use super::{ApiError, ClusterControl, auth, outcome_unknown};
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, Response, header};
use axum::response::IntoResponse;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tower::ServiceExt;

/// After shutdown, how much longer than [`HttpSettings::request_timeout`] in-flight
/// connections get to finish (writing the last responses) before they are cut.
const SHUTDOWN_MARGIN: Duration = Duration::from_secs(1);

/// Pause after an accept error that is not about one connection (e.g. out of file
/// descriptors), so that the loop does not spin while the condition lasts.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(200);

/// The HTTP API server: its settings and its counters. Build the router with
/// [`HttpServer::router`] (which applies the token policy) and run it with
/// [`HttpServer::serve`] (which applies the limits).
#[derive(Debug)]
pub struct HttpServer {
    settings: HttpSettings,
    stats: Arc<HttpStats>,
}

impl HttpServer {
    /// A server with these settings and zeroed counters.
    pub fn new(settings: HttpSettings) -> Self {
        Self {
            settings,
            stats: Arc::default(),
        }
    }

    /// The settings it was built with.
    pub fn settings(&self) -> &HttpSettings {
        &self.settings
    }

    /// Its counters, shared: keep a clone to render them in `/metrics`.
    pub fn stats(&self) -> Arc<HttpStats> {
        self.stats.clone()
    }

    /// The management API's routes over `control`, with `services` merged in, behind the
    /// bearer-token check of these settings: mutations need the token when one is configured,
    /// reads too when `token_required_for_reads`, `/health/*` and `/bootstrap/seed-nodes`
    /// never.
    pub fn router(&self, control: Arc<dyn ClusterControl>, services: Router) -> Router {
        auth::protect(
            super::routes(control, services),
            &self.settings,
            self.stats.clone(),
        )
    }

    /// Serves `router` on `listener` until `shutdown` completes; then stops accepting, lets
    /// the requests in flight finish (closing idle connections at once), and after
    /// `request_timeout` plus a second cuts whatever is still open. Fails at once, serving
    /// nothing, when a limit is 0.
    pub async fn serve(
        self,
        listener: TcpListener,
        router: Router,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> io::Result<()> {
        self.settings.check()?;
        let HttpServer { settings, stats } = self;
        let requests = Arc::new(Requests {
            router,
            in_flight: Semaphore::new(settings.max_concurrent_requests),
            max_in_flight: settings.max_concurrent_requests,
            timeout: settings.request_timeout,
            stats: stats.clone(),
        });
        let mut http = http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(settings.header_timeout);
        let connection_slots = Arc::new(Semaphore::new(settings.max_connections));
        let refusal = refusal_response(settings.max_connections);
        let (stop, stopped) = watch::channel(false);
        // At most `max_connections` running, plus finished ones not yet reaped below.
        let mut connections = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                accepted = listener.accept() => {
                    let stream = match accepted {
                        Ok((stream, _peer)) => stream,
                        Err(e) if is_connection_error(&e) => continue,
                        Err(e) => {
                            tracing::error!(error = %e, "HTTP API cannot accept connections");
                            tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                            continue;
                        }
                    };
                    match connection_slots.clone().try_acquire_owned() {
                        Ok(slot) => {
                            let open = OpenConnection::new(slot, stats.clone());
                            connections.spawn(connection(
                                stream,
                                open,
                                http.clone(),
                                requests.clone(),
                                stopped.clone(),
                            ));
                        }
                        Err(_) => {
                            bump(&stats.connections_refused_total);
                            refuse(stream, &refusal);
                        }
                    }
                }
            }
        }
        drop(listener);
        let _ = stop.send(true);
        let grace = settings.request_timeout + SHUTDOWN_MARGIN;
        let drained = async { while connections.join_next().await.is_some() {} };
        if tokio::time::timeout(grace, drained).await.is_err() {
            tracing::warn!(
                connections = connections.len(),
                ?grace,
                "HTTP connections still open after shutdown; closing them"
            );
            connections.shutdown().await;
        }
        Ok(())
    }
}

/// Whether an accept error concerns only the connection being accepted (the client gave up
/// already), so that the next accept can go ahead at once.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// The bytes sent to a connection refused by the connection limit.
fn refusal_response(max_connections: usize) -> Vec<u8> {
    let body = serde_json::json!({
        "error": format!("too many connections (limit {max_connections}); retry later")
    })
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Refuses a connection beyond the limit: one non-blocking write of the 503 (a fresh socket's
/// send buffer takes it whole), then close. Nothing waits on the client, so a flood of
/// connections costs an accept and a write each. Best effort: a client whose request bytes
/// arrived before the close may see a reset instead of the 503.
fn refuse(stream: TcpStream, response: &[u8]) {
    let _ = stream.try_write(response);
}

/// A connection's place under the limit: holds its slot and keeps the open-connections gauge,
/// both released when the connection task ends, however it ends.
struct OpenConnection {
    _slot: OwnedSemaphorePermit,
    stats: Arc<HttpStats>,
}

impl OpenConnection {
    fn new(slot: OwnedSemaphorePermit, stats: Arc<HttpStats>) -> Self {
        bump(&stats.connections_accepted_total);
        bump(&stats.connections_open);
        Self { _slot: slot, stats }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.stats.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves one client until it closes, breaks the protocol, times out sending headers, or the
/// server stops (then the request in flight, if any, finishes first).
async fn connection(
    stream: TcpStream,
    open: OpenConnection,
    http: http1::Builder,
    requests: Arc<Requests>,
    stopped: watch::Receiver<bool>,
) {
    // Small JSON answers: do not hold them back waiting for more to send.
    let _ = stream.set_nodelay(true);
    let service = hyper::service::service_fn(move |request| {
        let requests = requests.clone();
        async move { Ok::<_, Infallible>(requests.handle(request).await) }
    });
    let connection = http.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = stopping(stopped) => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    match result {
        Ok(()) => {}
        Err(e) if e.is_timeout() => {
            bump(&open.stats.header_timeouts_total);
            tracing::debug!("HTTP client did not send its request headers in time; closed");
        }
        Err(e) => tracing::debug!(error = %e, "HTTP connection ended with an error"),
    }
}

/// Completes once the server stops (or is gone).
async fn stopping(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// What runs every request: the router under the concurrency limit and the request timeout.
struct Requests {
    router: Router,
    in_flight: Semaphore,
    max_in_flight: usize,
    timeout: Duration,
    stats: Arc<HttpStats>,
}

impl Requests {
    /// Beyond the concurrency limit, 503 at once (never a queue); beyond the timeout, 504
    /// (the handler is dropped where it stood, so what it was doing may or may not have
    /// happened). Health probes skip the limit, so that a busy node is not restarted as dead;
    /// HTTP/1 serves one request per connection at a time, so they stay bounded by the
    /// connection limit.
    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        let request = request.map(Body::new);
        let _permit = if auth::is_health(request.uri().path()) {
            None
        } else {
            match self.in_flight.try_acquire() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    bump(&self.stats.requests_shed_total);
                    return self.overloaded();
                }
            }
        };
        match tokio::time::timeout(self.timeout, self.router.clone().oneshot(request)).await {
            Ok(Ok(response)) => response,
            Ok(Err(never)) => match never {},
            Err(_) => {
                bump(&self.stats.requests_timed_out_total);
                outcome_unknown(format!(
                    "request timed out after {} (http_request_timeout); its outcome is unknown",
                    humantime::format_duration(self.timeout)
                ))
            }
        }
    }

    fn overloaded(&self) -> Response<Body> {
        let mut response = ApiError::unavailable(format!(
            "too many requests in flight (limit {}); retry later",
            self.max_in_flight
        ))
        .into_response();
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        response
    }
}
