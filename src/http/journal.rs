//! `GET /journal/{persistence_id}`: how a replicated log stands — its configuration, each
//! replica's promised epoch, last entry, acknowledged mark and deleted prefix, and this
//! node's writer of it, if any. A read: nothing is fenced or changed.

use super::{ApiError, method_not_allowed};
use axum::Json;
use axum::Router;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::routing::get;
use serde_json::{Value, json};
use std::sync::Arc;
use tessera_persistence::{LogInspection, ReplicatedJournal};
use tessera_replication::{Configuration, Epoch, LogSummary, Position};

/// The journal routes, to be merged into the management API's router.
pub fn router(journal: Arc<ReplicatedJournal>) -> Router {
    Router::new()
        .route("/journal/{persistence_id}", get(inspect))
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(journal)
}

async fn inspect(
    State(journal): State<Arc<ReplicatedJournal>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(persistence_id) = path?;
    if let Some(problem) = tessera_journal::name_problem(&persistence_id) {
        return Err(ApiError::bad_request(format!(
            "invalid persistence id {:?}: {problem}",
            tessera_journal::name_excerpt(&persistence_id)
        )));
    }
    Ok(Json(render(&journal.inspect(&persistence_id).await)))
}

fn epoch(epoch: Epoch) -> Value {
    json!({ "counter": epoch.counter, "writer": format!("{:016x}", epoch.writer) })
}

fn position(position: Position) -> Value {
    json!({ "seq": position.seq, "epoch": epoch(position.epoch) })
}

fn config(config: &Configuration) -> Value {
    let members = |m: &[tessera_replication::ReplicaId]| -> Vec<Value> {
        m.iter()
            .map(|r| json!({ "address": r.address.to_string(), "storage_id": format!("{:016x}", r.storage_id) }))
            .collect()
    };
    json!({
        "version": config.version,
        "members": members(&config.members),
        "joint_with": config.previous.as_deref().map(members),
    })
}

fn summary(summary: &LogSummary) -> Value {
    json!({
        "promised_epoch": epoch(summary.promise),
        "highest_sequence_nr": summary.last.seq,
        "last": position(summary.last),
        "acknowledged_sequence_nr": summary.lac,
        "deleted_to": summary.base.seq,
    })
}

/// The inspection as JSON: `{"persistence_id", "config": {"version", "members", "joint_with",
/// "epoch"} | null, "replicas": [{"address", "storage_id", "reachable", "wrong_storage",
/// "promised_epoch", "highest_sequence_nr", "acknowledged_sequence_nr", "deleted_to"}],
/// "writer": {"phase", "epoch", "highest_sequence_nr", "acknowledged_sequence_nr"} | null}`.
pub fn render(inspection: &LogInspection) -> Value {
    let replicas: Vec<Value> = inspection
        .replicas
        .iter()
        .map(|r| {
            let mut value = json!({
                "address": r.replica.address.to_string(),
                "storage_id": format!("{:016x}", r.replica.storage_id),
                "reachable": r.reachable,
                "wrong_storage": r.wrong_storage,
            });
            if let (Some(s), Some(map)) = (&r.summary, value.as_object_mut())
                && let Value::Object(fields) = summary(s)
            {
                map.extend(fields);
            }
            value
        })
        .collect();
    json!({
        "persistence_id": inspection.persistence_id,
        "config": inspection.config.as_ref().map(|c| {
            let mut value = config(&c.config);
            if let Some(map) = value.as_object_mut() {
                map.insert("epoch".into(), epoch(c.epoch));
            }
            value
        }),
        "replicas": replicas,
        "writer": inspection.writer.as_ref().map(|w| json!({
            "phase": w.phase,
            "epoch": w.epoch.map(epoch),
            "config": w.config.as_ref().map(config),
            "highest_sequence_nr": w.highest,
            "acknowledged_sequence_nr": w.lac,
        })),
    })
}
