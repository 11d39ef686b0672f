//! `GET /health/alive` and `GET /health/ready`, for process supervisors and load balancers.

use super::Control;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};
use tessera_cluster::MemberStatus;

/// Always 200 while the server answers: the process is alive.
pub(super) async fn alive() -> Json<Value> {
    Json(json!({ "status": "alive" }))
}

/// 200 once this node is Up and its shard regions are registered with their coordinators;
/// 503 with the reason otherwise (joining, leaving, not yet a member, regions not registered),
/// so traffic only goes to nodes that can serve it.
pub(super) async fn ready(State(control): State<Control>) -> (StatusCode, Json<Value>) {
    match control.members().self_status {
        Some(MemberStatus::Up) => match control.not_ready_reason() {
            None => (StatusCode::OK, Json(json!({ "status": "up" }))),
            Some(reason) => (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({ "error": format!("not ready: {reason}"), "status": "up" })),
            ),
        },
        Some(status) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "error": format!("not ready: member status is {status}"),
                "status": status.as_str(),
            })),
        ),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "error": "not ready: not a member of a cluster yet",
                "status": null,
            })),
        ),
    }
}
