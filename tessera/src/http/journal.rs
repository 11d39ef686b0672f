//! `GET /journal/{persistence_id}`: how a replicated log stands — its configuration, each
//! replica's promised epoch, last entry, acknowledged mark and deleted prefix, and this
//! node's writer of it, if any. A read: nothing is fenced or changed.
//!
//! `GET /known-stores`: the journal stores this node has seen in the cluster (a log no
//! member knows is created only when fewer than W of them are unheard);
//! `DELETE /known-stores/{storage_id}` forgets one that is gone for good, on this node.

use super::{ApiError, method_not_allowed};
use axum::Json;
use axum::Router;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{delete, get};
use serde_json::{Value, json};
use std::sync::Arc;
use tessera_persistence::{ForgetStoreError, LogInspection, ReplicatedJournal};
use tessera_replication::{Configuration, Epoch, LogSummary, Position};

/// The journal routes, to be merged into the management API's router.
pub fn router(journal: Arc<ReplicatedJournal>) -> Router {
    Router::new()
        .route("/journal/{persistence_id}", get(inspect))
        .route("/known-stores", get(known_stores))
        .route("/known-stores/{storage_id}", delete(forget_store))
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

/// `{"stores": [{"address", "storage_id"}]}`.
async fn known_stores(
    State(journal): State<Arc<ReplicatedJournal>>,
) -> Result<Json<Value>, ApiError> {
    let stores = journal
        .known_stores()
        .await
        .map_err(|e| ApiError::unavailable(e.to_string()))?;
    let stores: Vec<Value> = stores
        .iter()
        .map(|s| {
            json!({ "address": s.address.to_string(), "storage_id": format!("{:016x}", s.storage_id) })
        })
        .collect();
    Ok(Json(json!({ "stores": stores })))
}

fn parse_storage_id(text: &str) -> Result<u64, ApiError> {
    let invalid = |reason: String| {
        ApiError::bad_request(format!(
            "invalid storage id {:?}: {reason} (expected 1 to 16 hex digits)",
            tessera_journal::name_excerpt(text)
        ))
    };
    if text.is_empty() || text.len() > 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(invalid("not 1 to 16 hex digits".to_string()));
    }
    u64::from_str_radix(text, 16).map_err(|e| invalid(e.to_string()))
}

#[derive(serde::Deserialize)]
struct ForgetQuery {
    /// Other stores gone for good, comma-separated: they need not answer.
    gone: Option<String>,
}

/// Forgets a store (16 hex digits, as `GET /known-stores` shows it), `?gone=ID,ID` naming
/// other stores gone for good that need not answer: 200 `{"forgotten": id}`; 404 unknown;
/// 409 while a member runs it or a log's latest configuration names it; 503 while a known
/// store or a member does not answer.
async fn forget_store(
    State(journal): State<Arc<ReplicatedJournal>>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<ForgetQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(text) = path?;
    let storage_id = parse_storage_id(&text)?;
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let also_gone = match query.gone.as_deref() {
        None | Some("") => Vec::new(),
        Some(list) => list
            .split(',')
            .map(|id| parse_storage_id(id.trim()))
            .collect::<Result<Vec<u64>, ApiError>>()?,
    };
    match journal.forget_store(storage_id, &also_gone).await {
        Ok(()) => Ok(Json(json!({ "forgotten": format!("{storage_id:016x}") }))),
        Err(e @ ForgetStoreError::Unknown { .. }) => Err(ApiError::not_found(e.to_string())),
        Err(e @ (ForgetStoreError::Running { .. } | ForgetStoreError::Named { .. })) => {
            Err(ApiError::new(StatusCode::CONFLICT, e.to_string()))
        }
        Err(e @ (ForgetStoreError::Unheard { .. } | ForgetStoreError::MemberSilent { .. })) => {
            Err(ApiError::unavailable(e.to_string()))
        }
        Err(e @ ForgetStoreError::Journal(_)) => Err(ApiError::unavailable(e.to_string())),
    }
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
