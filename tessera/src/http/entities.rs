//! `POST /entities/{type}/{id}`: a JSON command to one entity, answered with its JSON reply.
//!
//! A node sends it through cluster sharding to the one node that runs the entity (recovering
//! it from its log's replicas when it starts there); the same route over a node's own hosts
//! serves single-process uses and tests. Every answer says whether the command took effect:
//!
//! - 200 with the reply: applied;
//! - 400 (unknown type, invalid id, malformed command), 409 (the entity rejected it), 503
//!   (a queue is full, the node is stopping, the entity's log is unavailable or was taken
//!   over, its state could not be confirmed current): not applied, and it never will be;
//! - 504: outcome unknown — no reply within the ask timeout, or a write was sent but not
//!   acknowledged; its events may or may not appear later;
//! - 500 only for a bug in the entity type's encoding (the body says whether it applied).
//!
//! Error bodies are `{"error": "...", "outcome": "not_applied" | "unknown" | "applied"}`.

use super::{ApiError, MAX_BODY_BYTES, method_not_allowed};
use crate::entities::{EntityTypes, JsonAskError};
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;
use std::sync::Arc;
use tessera_coordinator::host::{AskFailure, AskOutcome, FailureKind};

/// Where `POST /entities/{type}/{id}` sends its commands: this node's own hosts, or the
/// cluster's sharding.
pub trait EntityBackend: Send + Sync + 'static {
    /// Sends a JSON command to entity `id` of `entity_type` and returns its JSON reply.
    fn ask(
        &self,
        entity_type: &str,
        id: &str,
        command: Value,
    ) -> BoxFuture<'static, Result<Value, CommandError>>;
}

impl EntityBackend for EntityTypes {
    fn ask(
        &self,
        entity_type: &str,
        id: &str,
        command: Value,
    ) -> BoxFuture<'static, Result<Value, CommandError>> {
        let Some(host) = self.get(entity_type) else {
            let error = ApiError::bad_request(format!(
                "unknown entity type {entity_type:?}: this node hosts {}",
                self.names().join(", ")
            ));
            return futures::future::ready(Err(error.into())).boxed();
        };
        let reply = host.ask_json(id, command);
        async move { reply.await.map_err(CommandError::from) }.boxed()
    }
}

/// The entity routes over `backend`, to be merged into the management API's router.
pub fn router<B: EntityBackend>(backend: Arc<B>) -> Router {
    let backend: Arc<dyn EntityBackend> = backend;
    Router::new()
        .route("/entities/{type}/{id}", post(command))
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(backend)
}

/// A command that got no reply: its status, what happened, and whether it took effect.
#[derive(Debug)]
pub struct CommandError {
    pub status: StatusCode,
    pub message: String,
    /// `not_applied`, `unknown` or `applied`.
    pub outcome: &'static str,
}

impl IntoResponse for CommandError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(serde_json::json!({ "error": self.message, "outcome": self.outcome })),
        )
            .into_response()
    }
}

impl From<ApiError> for CommandError {
    /// A request refused before it reached an entity: not applied.
    fn from(error: ApiError) -> Self {
        CommandError {
            status: error.status,
            message: error.message,
            outcome: "not_applied",
        }
    }
}

async fn command(
    State(backend): State<Arc<dyn EntityBackend>>,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, CommandError> {
    let Path((entity_type, id)) = path.map_err(ApiError::from)?;
    let Json(command) = body.map_err(ApiError::from)?;
    backend.ask(&entity_type, &id, command).await.map(Json)
}

impl From<AskFailure> for CommandError {
    fn from(failure: AskFailure) -> Self {
        let status = match failure.kind {
            // Whatever went wrong, a command that may have taken effect is a 504.
            _ if failure.outcome == AskOutcome::Unknown => StatusCode::GATEWAY_TIMEOUT,
            FailureKind::BadRequest => StatusCode::BAD_REQUEST,
            FailureKind::Rejected => StatusCode::CONFLICT,
            FailureKind::Unavailable | FailureKind::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            FailureKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
            FailureKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        };
        CommandError {
            status,
            message: failure.message,
            outcome: failure.outcome.as_str(),
        }
    }
}

impl From<JsonAskError> for CommandError {
    fn from(error: JsonAskError) -> Self {
        error.to_failure().into()
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
        // Every error says whether the command took effect.
        assert_eq!(body["outcome"], "not_applied", "{body}");
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
