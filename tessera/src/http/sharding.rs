//! Cluster sharding's queries (Akka's GetShardRegionState and GetClusterShardingStats):
//!
//! - `GET /sharding/{type}`: this node's shards of the type and their live entities,
//!   `{"type": "account", "shards": [{"id": "17", "entities": ["alice"]}]}`;
//! - `GET /sharding/{type}/cluster`: every member's shards of the type with their entity
//!   counts, `{"type": "account", "regions": [{"address": "h:p", "shards": [{"id": "17",
//!   "entities": 1}]}], "failed": [{"address": "h:p", "error": "..."}]}`; members that did
//!   not answer in time are listed as failed.

use super::{ApiError, method_not_allowed};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use futures::future::BoxFuture;
use serde_json::{Value, json};
use std::sync::Arc;
use tessera_cluster::Address;
use tessera_coordinator::wire::RegionSnapshot;

/// What the sharding routes ask of the node.
pub trait ShardingQueries: Send + Sync + 'static {
    /// The sharded entity types, sorted.
    fn type_names(&self) -> Vec<String>;
    /// This node's shards of `entity_type` (None: not sharded, or no answer).
    fn region_state(&self, entity_type: &str) -> BoxFuture<'static, Option<RegionSnapshot>>;
    /// Every member's shards of `entity_type`, or why it did not answer.
    fn cluster_state(
        &self,
        entity_type: &str,
    ) -> BoxFuture<'static, Vec<(Address, Result<RegionSnapshot, String>)>>;
}

/// The sharding routes, to be merged into the management API's router.
pub fn router<Q: ShardingQueries>(queries: Arc<Q>) -> Router {
    let queries: Arc<dyn ShardingQueries> = queries;
    Router::new()
        .route("/sharding/{type}", get(region))
        .route("/sharding/{type}/cluster", get(cluster))
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(queries)
}

fn known(queries: &dyn ShardingQueries, entity_type: &str) -> Result<(), ApiError> {
    let names = queries.type_names();
    if names.iter().any(|n| n == entity_type) {
        Ok(())
    } else {
        Err(ApiError::not_found(format!(
            "entity type {entity_type:?} is not sharded here; sharded types: {}",
            names.join(", ")
        )))
    }
}

fn shards_json(snapshot: &RegionSnapshot, ids: bool) -> Value {
    Value::Array(
        snapshot
            .shards
            .iter()
            .map(|(shard, entities)| {
                let entities = if ids {
                    json!(entities)
                } else {
                    json!(entities.len())
                };
                json!({ "id": shard.to_string(), "entities": entities })
            })
            .collect(),
    )
}

async fn region(
    State(queries): State<Arc<dyn ShardingQueries>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(entity_type) = path.map_err(ApiError::from)?;
    known(&*queries, &entity_type)?;
    let snapshot = queries.region_state(&entity_type).await.ok_or_else(|| {
        ApiError::unavailable(format!(
            "the {entity_type} region did not answer; the node may be stopping"
        ))
    })?;
    Ok(Json(json!({
        "type": entity_type,
        "shards": shards_json(&snapshot, true),
    })))
}

async fn cluster(
    State(queries): State<Arc<dyn ShardingQueries>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(entity_type) = path.map_err(ApiError::from)?;
    known(&*queries, &entity_type)?;
    let mut regions = Vec::new();
    let mut failed = Vec::new();
    for (address, answer) in queries.cluster_state(&entity_type).await {
        match answer {
            Ok(snapshot) => regions.push(json!({
                "address": address.to_string(),
                "shards": shards_json(&snapshot, false),
            })),
            Err(error) => failed.push(json!({ "address": address.to_string(), "error": error })),
        }
    }
    Ok(Json(json!({
        "type": entity_type,
        "regions": regions,
        "failed": failed,
    })))
}
