//! Operating projections (Akka's ProjectionManagement):
//!
//! - `GET /projections`: every registered projection with its control (paused, resets
//!   asked) and each instance with the node it runs on, its state, its offset, its lag in
//!   events and in seconds, and what it handled and failed:
//!   `{"projections": [{"name": "balances", "entity_type": "account", "instances": 4,
//!   "paused": false, "resets": 0, "lag_events": 0, "lag_seconds": 0.0, "instance_status":
//!   [{"index": 0, "node": "h:p", "state": "running", ...}]}], "failed": [{"address": "h:p",
//!   "error": "..."}]}`; members that did not answer in time are listed as failed.
//! - `POST /projections/{name}/pause`, `/resume`: written to a majority; every instance
//!   follows it wherever it runs.
//! - `POST /projections/{name}/reset`: the offset back to the beginning of every log,
//!   applied by each instance when resumed. 409 unless paused.

use super::{ApiError, method_not_allowed};
use crate::node::ProjectionError;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::future::BoxFuture;
use serde_json::{Value, json};
use std::sync::Arc;
use tessera_cluster::Address;
use tessera_projection::{ControlError, ControlState, InstanceStatus};

/// One projection as the cluster runs it.
pub struct ProjectionView {
    pub name: String,
    pub entity_type: String,
    pub instances: u32,
    pub control: ControlState,
    pub instance_views: Vec<InstanceView>,
}

/// One instance: where it runs and what it reported (none when no member reported it).
pub struct InstanceView {
    pub index: u32,
    pub node: Option<String>,
    pub status: Option<InstanceStatus>,
}

/// Every registered projection across the cluster, and the members that did not answer.
pub struct ClusterView {
    pub projections: Vec<ProjectionView>,
    pub failed: Vec<(Address, String)>,
}

/// What the projection routes ask of the node.
pub trait ProjectionQueries: Send + Sync + 'static {
    /// Every registered projection with its instances across the cluster, and the members
    /// that did not answer.
    fn views(&self) -> BoxFuture<'static, ClusterView>;
    fn set_paused(
        &self,
        name: &str,
        paused: bool,
    ) -> BoxFuture<'static, Result<(), ProjectionError>>;
    fn reset(&self, name: &str) -> BoxFuture<'static, Result<(), ProjectionError>>;
}

/// The projection routes, to be merged into the management API's router.
pub fn router<Q: ProjectionQueries>(queries: Arc<Q>) -> Router {
    let queries: Arc<dyn ProjectionQueries> = queries;
    Router::new()
        .route("/projections", get(list))
        .route("/projections/{name}/pause", post(pause))
        .route("/projections/{name}/resume", post(resume))
        .route("/projections/{name}/reset", post(reset))
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(queries)
}

fn instance_json(view: &InstanceView) -> Value {
    let Some(status) = &view.status else {
        return json!({ "index": view.index, "node": null, "state": "unknown" });
    };
    json!({
        "index": view.index,
        "node": view.node,
        "state": status.state,
        "slices": [status.slices.0, status.slices.1],
        "runs": status.runs,
        "handled": status.handled,
        "handler_errors": status.handler_errors,
        "skipped": status.skipped,
        "saves": status.saves,
        "save_failures": status.save_failures,
        "unsaved": status.unsaved,
        "offset_logs": status.offset_logs,
        "offset_events": status.offset_events,
        "lag_events": status.lag_events,
        "lag_seconds": status.lag_ms.map(|ms| ms as f64 / 1000.0),
        "resets_applied": status.resets_applied,
        "last_error": status.last_error,
    })
}

/// The projection's lag: the sum of its instances' lags in events, the largest in time
/// (unknown while an instance has not reported one).
fn lag(views: &[InstanceView]) -> (Option<u64>, Option<f64>) {
    let mut events = Some(0u64);
    let mut seconds = Some(0f64);
    for view in views {
        let status = view.status.as_ref();
        events = events
            .zip(status.and_then(|s| s.lag_events))
            .map(|(a, b)| a + b);
        seconds = seconds
            .zip(status.and_then(|s| s.lag_ms))
            .map(|(a, b)| a.max(b as f64 / 1000.0));
    }
    (events, seconds)
}

async fn list(State(queries): State<Arc<dyn ProjectionQueries>>) -> Json<Value> {
    let ClusterView {
        projections: views,
        failed,
    } = queries.views().await;
    let projections: Vec<Value> = views
        .iter()
        .map(|view| {
            let (lag_events, lag_seconds) = lag(&view.instance_views);
            json!({
                "name": view.name,
                "entity_type": view.entity_type,
                "instances": view.instances,
                "paused": view.control.paused,
                "resets": view.control.resets,
                "lag_events": lag_events,
                "lag_seconds": lag_seconds,
                "instance_status": view.instance_views.iter().map(instance_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    let failed: Vec<Value> = failed
        .into_iter()
        .map(|(address, error)| json!({ "address": address.to_string(), "error": error }))
        .collect();
    Json(json!({ "projections": projections, "failed": failed }))
}

fn api_error(error: ProjectionError) -> ApiError {
    let message = error.to_string();
    match error {
        ProjectionError::Unknown { .. } => ApiError::not_found(message),
        ProjectionError::Control(ControlError::NotPaused { .. }) => {
            ApiError::new(StatusCode::CONFLICT, message)
        }
        ProjectionError::Control(ControlError::NotWritten { .. }) => ApiError::unavailable(message),
    }
}

async fn change(
    queries: Arc<dyn ProjectionQueries>,
    path: Result<Path<String>, PathRejection>,
    operation: &'static str,
) -> Result<Json<Value>, ApiError> {
    let Path(name) = path.map_err(ApiError::from)?;
    let done = match operation {
        "pause" => queries.set_paused(&name, true).await,
        "resume" => queries.set_paused(&name, false).await,
        _ => queries.reset(&name).await,
    };
    done.map_err(api_error)?;
    let message = match operation {
        "pause" => format!("projection {name} paused"),
        "resume" => format!("projection {name} resumed"),
        _ => format!("projection {name} reset: it starts from the beginning when resumed"),
    };
    Ok(Json(
        json!({ "name": name, "operation": operation, "message": message }),
    ))
}

async fn pause(
    State(queries): State<Arc<dyn ProjectionQueries>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    change(queries, path, "pause").await
}

async fn resume(
    State(queries): State<Arc<dyn ProjectionQueries>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    change(queries, path, "resume").await
}

async fn reset(
    State(queries): State<Arc<dyn ProjectionQueries>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    change(queries, path, "reset").await
}
