//! `POST /entities/{type}/{id}`: a JSON command to one entity, answered with its JSON reply.
//!
//! On this node's own entity hosts for now; the sharding issue routes the same endpoint across
//! the cluster. Status codes: 200 with the reply; 400 for an unknown type, an invalid id or a
//! malformed command (the message names which); 409 when the entity rejects the command (e.g.
//! insufficient funds), nothing persisted; 503 when a queue is full or the node is shutting
//! down (retry later); 504 when no reply came within the ask timeout (the command may still
//! take effect); 500 when recovery or a write failed.

use super::{ApiError, MAX_BODY_BYTES, method_not_allowed};
use crate::entities::{EntityTypes, JsonAskError};
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::Value;
use std::sync::Arc;
use tessera_entities::EntityError;

/// The entity routes over `types`, to be merged into the management API's router.
pub fn router(types: Arc<EntityTypes>) -> Router {
    Router::new()
        .route("/entities/{type}/{id}", post(command))
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(types)
}

async fn command(
    State(types): State<Arc<EntityTypes>>,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path((entity_type, id)) = path?;
    let Some(host) = types.get(&entity_type) else {
        return Err(ApiError::bad_request(format!(
            "unknown entity type {entity_type:?}: this node hosts {}",
            types.names().join(", ")
        )));
    };
    let Json(command) = body?;
    host.ask_json(&id, command)
        .await
        .map(Json)
        .map_err(ApiError::from)
}

impl From<JsonAskError> for ApiError {
    fn from(error: JsonAskError) -> Self {
        let status = match &error {
            JsonAskError::MalformedCommand { .. } => StatusCode::BAD_REQUEST,
            JsonAskError::Rejected(_) => StatusCode::CONFLICT,
            JsonAskError::Reply(_) => StatusCode::INTERNAL_SERVER_ERROR,
            JsonAskError::Entity(e) => match e {
                EntityError::InvalidId { .. } => StatusCode::BAD_REQUEST,
                EntityError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
                EntityError::HostBusy { .. }
                | EntityError::MailboxFull { .. }
                | EntityError::StashFull { .. }
                | EntityError::JournalBusy { .. }
                | EntityError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
                EntityError::RecoveryFailed { .. }
                | EntityError::PersistFailed { .. }
                | EntityError::Encode { .. }
                | EntityError::Stopped { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            },
        };
        ApiError::new(status, error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entities::account::Account;
    use axum::body::Body;
    use axum::http::{Method, Request, header};
    use serde_json::json;
    use tessera_entities::{EntityConfig, EntityHost};
    use tower::ServiceExt;

    async fn types() -> (Arc<EntityTypes>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = tessera_journal::JournalConfig::new(dir.path().join("journal"));
        journal.fsync = tessera_journal::FsyncPolicy::Never;
        let journal = tessera_journal::RocksJournal::open(journal).await.unwrap();
        let snapshots = tessera_snapshot::RocksSnapshotStore::open(
            tessera_snapshot::SnapshotConfig::new(dir.path().join("snapshots")),
        )
        .await
        .unwrap();
        let host = EntityHost::start(
            Account,
            Arc::new(journal),
            Arc::new(snapshots),
            EntityConfig::default(),
        )
        .unwrap();
        let mut types = EntityTypes::new();
        types.register(host);
        (Arc::new(types), dir)
    }

    async fn post(types: &Arc<EntityTypes>, uri: &str, body: &str) -> (StatusCode, Value) {
        let request = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let response = router(types.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    fn error_of(value: &Value) -> &str {
        value["error"].as_str().unwrap_or_default()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn account_commands_reply_with_the_balance() {
        let (types, _dir) = types().await;
        let alice = "/entities/account/alice";
        assert_eq!(
            post(&types, alice, r#"{"deposit": 10}"#).await,
            (StatusCode::OK, json!({"balance": 10}))
        );
        assert_eq!(
            post(&types, alice, r#"{"withdraw": 4}"#).await,
            (StatusCode::OK, json!({"balance": 6}))
        );
        assert_eq!(
            post(&types, alice, r#"{"get": null}"#).await,
            (StatusCode::OK, json!({"balance": 6}))
        );
        let (status, body) = post(&types, alice, r#"{"withdraw": 7}"#).await;
        assert_eq!(status, StatusCode::CONFLICT);
        assert_eq!(
            error_of(&body),
            "insufficient funds: cannot withdraw 7 from a balance of 6"
        );
        assert_eq!(
            post(&types, alice, r#"{"get": null}"#).await,
            (StatusCode::OK, json!({"balance": 6}))
        );
        // Percent-encoded ids are decoded; another id is another account.
        assert_eq!(
            post(&types, "/entities/account/bob%20smith", r#"{"get": null}"#).await,
            (StatusCode::OK, json!({"balance": 0}))
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bad_requests_name_the_problem() {
        let (types, _dir) = types().await;
        let (status, body) = post(&types, "/entities/cart/1", r#"{"get": null}"#).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(
            error_of(&body),
            r#"unknown entity type "cart": this node hosts account"#
        );

        let (status, body) = post(&types, "/entities/account/a%0Ab", r#"{"get": null}"#).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(error_of(&body).starts_with("invalid entity id"), "{body}");
        assert!(error_of(&body).contains("control character"), "{body}");

        let long = format!("/entities/account/{}", "x".repeat(300));
        let (status, body) = post(&types, &long, r#"{"get": null}"#).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(error_of(&body).contains("more than 256"), "{body}");

        for bad in [
            r#"{"transfer": 1}"#,
            r#"{"deposit": -5}"#,
            r#"{"get": 1}"#,
            "{}",
        ] {
            let (status, body) = post(&types, "/entities/account/a", bad).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
            assert!(
                error_of(&body).starts_with("invalid command for entity type account"),
                "{bad}: {body}"
            );
        }
        let (status, body) = post(&types, "/entities/account/a", "{not json").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            error_of(&body).starts_with("invalid request body"),
            "{body}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn merged_into_the_management_api_other_routes_still_work() {
        let (types, _dir) = types().await;
        let control = Arc::new(crate::http::test_support::FakeControl::two_up());
        let app = crate::http::router(control, router(types));
        let request = |method: Method, uri: &str| {
            Request::builder()
                .method(method)
                .uri(uri)
                .body(Body::empty())
                .unwrap()
        };
        let alive = app
            .clone()
            .oneshot(request(Method::GET, "/health/alive"))
            .await
            .unwrap();
        assert_eq!(alive.status(), StatusCode::OK);
        let wrong = app
            .clone()
            .oneshot(request(Method::GET, "/entities/account/a"))
            .await
            .unwrap();
        assert_eq!(wrong.status(), StatusCode::METHOD_NOT_ALLOWED);
        let missing = app.oneshot(request(Method::GET, "/nope")).await.unwrap();
        assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    }
}
