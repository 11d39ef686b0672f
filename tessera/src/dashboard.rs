//! The live dashboard every node serves at `GET /`: its members with status, reachability,
//! leader and roles; per entity type the shards and live entities of each node; the
//! Distributed Data key count. Updated live from `GET /cluster/events`.
//!
//! The page, its script and its style are embedded in the binary (no build step, nothing
//! loaded from elsewhere). Besides the HTTP API's own routes the page reads:
//! - `GET /cluster/events`: the cluster's membership events as server-sent events;
//! - `GET /dashboard/node`: this node's address, entity types and key count, `{"self":
//!   "127.0.0.1:25520", "entity_types": ["account"], "ddata_keys": 12}`.
//!
//! Every route here is merged into the HTTP API's services, so the API's token check and
//! limits apply to it as to any other route.

mod events;

pub use events::{EVENT_KEEP_ALIVE_INTERVAL, MAX_EVENT_SUBSCRIBERS};

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures::FutureExt;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tessera_cluster::Address;
use tessera_cluster::events::{ClusterEvent, CurrentClusterState};
use tessera_cluster::node::ClusterHandle;
use tessera_cluster::transport::Transport;
use tessera_coordinator::runtime::Sharding;
use tessera_ddata::node::ReplicatorHandle;
use tokio::sync::{broadcast, watch};

/// What the dashboard reads from its node; the node wiring implements it over the cluster,
/// the Replicator and sharding, the tests with a fake.
pub trait DashboardSource: Send + Sync + 'static {
    /// This node's cluster address.
    fn self_address(&self) -> Address;
    /// The sharded entity types, sorted.
    fn entity_types(&self) -> Vec<String>;
    /// Distributed Data keys this node's replica holds.
    fn ddata_keys(&self) -> u64;
    /// The membership now and every change after it (see `ClusterHandle::subscribe`), or why
    /// the cluster takes no subscription.
    fn subscribe(&self) -> BoxFuture<'static, Result<Subscription, String>>;
}

/// The membership at one moment and the receiver of every change after it.
pub type Subscription = (CurrentClusterState, broadcast::Receiver<ClusterEvent>);

/// The dashboard's routes for a running node, to be merged into the HTTP API's services.
/// Event streams end once `shutdown` turns true, so that they never hold the server's
/// graceful shutdown open.
pub fn router<T: Transport>(
    cluster: &ClusterHandle,
    replicator: &ReplicatorHandle,
    sharding: &Sharding<T>,
    shutdown: watch::Receiver<bool>,
) -> Router {
    let source = NodeSource {
        cluster: cluster.clone(),
        replicator: replicator.clone(),
        entity_types: sharding
            .type_names()
            .into_iter()
            .map(str::to_string)
            .collect(),
    };
    routes(Arc::new(source), shutdown, MAX_EVENT_SUBSCRIBERS)
}

/// The routes over any source, with at most `max_subscribers` event streams at once.
fn routes(
    source: Arc<dyn DashboardSource>,
    shutdown: watch::Receiver<bool>,
    max_subscribers: usize,
) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/dashboard/app.js", get(script))
        .route("/dashboard/style.css", get(style))
        .route("/dashboard/node", get(node))
        .with_state(source.clone())
        .merge(events::router(source, shutdown, max_subscribers))
}

/// The page. Its policy lets it load only its own script and style and talk only to its own
/// node, and keeps it out of other sites' frames.
async fn page() -> Response {
    let mut response = asset(
        "text/html; charset=utf-8",
        include_str!("../assets/dashboard/index.html"),
    );
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
             img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        ),
    );
    response
        .headers_mut()
        .insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

async fn script() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("../assets/dashboard/app.js"),
    )
}

async fn style() -> Response {
    asset(
        "text/css; charset=utf-8",
        include_str!("../assets/dashboard/style.css"),
    )
}

/// An embedded file. `no-cache`: the browser revalidates, so a node upgraded in place never
/// runs a page against the previous version's script.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        body,
    )
        .into_response()
}

/// `GET /dashboard/node`.
async fn node(State(source): State<Arc<dyn DashboardSource>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "self": source.self_address().to_string(),
        "entity_types": source.entity_types(),
        "ddata_keys": source.ddata_keys(),
    }))
}

/// [`DashboardSource`] of a running node.
struct NodeSource {
    cluster: ClusterHandle,
    replicator: ReplicatorHandle,
    /// Fixed when the node starts.
    entity_types: Vec<String>,
}

impl DashboardSource for NodeSource {
    fn self_address(&self) -> Address {
        self.cluster.self_node().address.clone()
    }

    fn entity_types(&self) -> Vec<String> {
        self.entity_types.clone()
    }

    fn ddata_keys(&self) -> u64 {
        self.replicator.counters().keys.load(Ordering::Relaxed)
    }

    fn subscribe(&self) -> BoxFuture<'static, Result<Subscription, String>> {
        let cluster = self.cluster.clone();
        async move { cluster.subscribe().await.map_err(|e| e.to_string()) }.boxed()
    }
}

#[cfg(test)]
mod tests;
