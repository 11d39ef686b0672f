//! HTTP management API (docs/src/design.md §8): cluster members, join/leave/down, health, metrics.
//!
//! The API reaches the cluster only through [`ClusterControl`], which the node wiring
//! implements for the real cluster and the tests implement with a fake. Every error is JSON
//! `{"error": "..."}` with a fitting status, including axum's own rejections, unknown routes and
//! wrong methods.
//!
//! [`HttpServer`] puts the routes behind a bearer token (`auth.rs`) and serves them under
//! limits (`server.rs`): header-read and request timeouts, at most so many requests at once
//! and so many connections, each from [`HttpSettings`].

mod auth;
pub mod ddata;
pub mod entities;
mod health;
pub mod journal;
mod members;
mod metrics;
pub mod projections;
mod server;
mod settings;
pub mod sharding;
mod stats;

pub use members::{JOIN_WAIT_DEFAULT, JOIN_WAIT_MAX, MemberView, MembersView};
pub use metrics::{Latencies, NodeMetrics, RefusedConnections, ShardingMetrics, render_prometheus};
pub use server::HttpServer;
pub use settings::HttpSettings;
pub use stats::{HttpStats, HttpStatsSnapshot};

use axum::extract::DefaultBodyLimit;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use std::future::Future;
use std::sync::Arc;
use tessera_cluster::Address;

/// Largest request body accepted; every request body of this API is a few dozen bytes.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// What the HTTP API needs from the running cluster. Calls must be cheap and must not block:
/// the implementation hands commands to the cluster task (failing with
/// [`ControlError::Overloaded`] when its queue is full) rather than waiting for them.
pub trait ClusterControl: Send + Sync + 'static {
    /// A snapshot of the membership as this node sees it.
    fn members(&self) -> MembersView;
    /// Asks this node to join the cluster that `address` belongs to.
    fn join(&self, address: Address) -> Result<(), ControlError>;
    /// Asks the member at `address` to leave gracefully.
    fn leave(&self, address: Address) -> Result<(), ControlError>;
    /// Marks the member at `address` as down (operator decision).
    fn down(&self, address: Address) -> Result<(), ControlError>;
    /// Counters and gauges for `/metrics`.
    fn metrics(&self) -> NodeMetrics;
    /// Why this node is not ready to serve yet beyond its member status (its shard regions
    /// not yet registered with their coordinators), or None.
    fn not_ready_reason(&self) -> Option<String> {
        None
    }
}

/// Why the cluster refused a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// No member has this address.
    #[error("no member with address {0}")]
    UnknownMember(Address),
    /// The node is shutting down and takes no more commands.
    #[error("the node is shutting down")]
    ShuttingDown,
    /// The cluster's command queue is full; retry later.
    #[error("the node is overloaded, retry later")]
    Overloaded,
    /// The command contradicts the node's state (e.g. joining while already a member).
    #[error("{0}")]
    Conflict(String),
}

/// An error response: a status code and a message, rendered as `{"error": message}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for the operator.
    pub message: String,
}

impl ApiError {
    /// An error with this status and message.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// 400 Bad Request.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 404 Not Found.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    /// 503 Service Unavailable.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(serde_json::json!({ "error": self.message })),
        )
            .into_response()
    }
}

/// 504 `{"error": message, "outcome": "unknown"}`: the request was sent on (or its handler
/// cut off) and whether it took effect is not known, as the entities API says it.
fn outcome_unknown(message: String) -> Response {
    (
        StatusCode::GATEWAY_TIMEOUT,
        Json(serde_json::json!({ "error": message, "outcome": "unknown" })),
    )
        .into_response()
}

impl From<ControlError> for ApiError {
    fn from(err: ControlError) -> Self {
        let status = match err {
            ControlError::UnknownMember(_) => StatusCode::NOT_FOUND,
            ControlError::Conflict(_) => StatusCode::CONFLICT,
            ControlError::ShuttingDown | ControlError::Overloaded => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        ApiError::new(status, err.to_string())
    }
}

impl From<JsonRejection> for ApiError {
    /// Syntax and shape errors are the client's malformed body: 400 with serde's description.
    /// A missing `Content-Type: application/json` stays 415: requiring it makes browsers send
    /// a CORS preflight, so a web page cannot down members through an operator's browser.
    fn from(rejection: JsonRejection) -> Self {
        let status = match &rejection {
            JsonRejection::JsonDataError(_) | JsonRejection::JsonSyntaxError(_) => {
                StatusCode::BAD_REQUEST
            }
            other => other.status(),
        };
        ApiError::new(
            status,
            format!("invalid request body: {}", rejection.body_text()),
        )
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::bad_request(format!("invalid path: {}", rejection.body_text()))
    }
}

/// Parses an address from a request, naming the problem on failure.
fn parse_address(text: &str) -> Result<Address, ApiError> {
    text.parse::<Address>()
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

/// The shared state of every handler.
type Control = Arc<dyn ClusterControl>;

/// The management API's routes over `control`, with the node's `services` (Distributed
/// Data, entities: routers with their own state) merged in under the same error handling and
/// body limit, and no token check: see [`HttpServer::router`].
fn routes(control: Arc<dyn ClusterControl>, services: Router) -> Router {
    Router::new()
        .route("/cluster/members", get(members::list))
        .route("/cluster/members/{address}", put(members::update))
        .route("/cluster/join", post(members::join))
        .route("/health/alive", get(health::alive))
        .route("/health/ready", get(health::ready))
        .route("/metrics", get(metrics::handler))
        .with_state(control)
        .merge(services)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this route",
    )
}

/// The routes with [`HttpSettings::default`]: no token, so mutating endpoints are open, which
/// is only sound on loopback. Kept for callers that do not pass settings yet; the node should
/// use [`HttpServer::router`].
pub fn router(control: Arc<dyn ClusterControl>, services: Router) -> Router {
    HttpServer::new(HttpSettings::default()).router(control, services)
}

/// [`HttpServer::serve`] with the default limits ([`HttpSettings::default`]). Kept for
/// callers that do not pass settings yet.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    HttpServer::new(HttpSettings::default())
        .serve(listener, router, shutdown)
        .await
}

#[cfg(test)]
pub(crate) mod test_support;

#[cfg(test)]
mod tests;
