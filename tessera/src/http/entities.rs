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
//! Error bodies are `{"error": "...", "outcome": "not_applied" | "unknown" | "applied"}`, and
//! a 409 also carries the entity type's rejection as JSON under `"rejection"`.
//!
//! JSON exists only here: the command is decoded once into its type's Rust command, and the
//! reply encoded once; between nodes they travel in postcard.

use super::{ApiError, MAX_BODY_BYTES, method_not_allowed};
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use futures::future::BoxFuture;
use serde_json::Value;
use std::sync::Arc;
use tessera_coordinator::host::{AskFailure, AskOutcome, FailureKind};

/// Where `POST /entities/{type}/{id}` sends its commands: the node's entity types
/// ([`crate::entities::JsonEntities`]), each through cluster sharding.
pub trait EntityBackend: Send + Sync + 'static {
    /// Sends a JSON command to entity `id` of `entity_type` and returns its JSON reply.
    fn ask(
        &self,
        entity_type: &str,
        id: &str,
        command: Value,
    ) -> BoxFuture<'static, Result<Value, CommandError>>;
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

/// A command that got no reply: its status, what happened, whether it took effect, and the
/// entity's rejection when it refused the command.
#[derive(Debug)]
pub struct CommandError {
    pub status: StatusCode,
    pub message: String,
    /// `not_applied`, `unknown` or `applied`.
    pub outcome: &'static str,
    /// The entity type's rejection, as JSON (a 409).
    pub rejection: Option<Value>,
}

impl CommandError {
    /// A request refused before it reached an entity (400): not applied.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::bad_request(message).into()
    }

    /// The entity refused the command (409): nothing was persisted. `message` is the
    /// rejection's text, `rejection` the rejection itself.
    pub fn rejected(message: String, rejection: Option<Value>) -> Self {
        CommandError {
            status: StatusCode::CONFLICT,
            message,
            outcome: AskOutcome::NotApplied.as_str(),
            rejection,
        }
    }

    /// A bug in the entity type's encoding (500), with whether the command took effect.
    pub fn internal(message: String, outcome: AskOutcome) -> Self {
        CommandError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message,
            outcome: outcome.as_str(),
            rejection: None,
        }
    }
}

impl IntoResponse for CommandError {
    fn into_response(self) -> Response {
        let mut body = serde_json::json!({ "error": self.message, "outcome": self.outcome });
        if let Some(rejection) = self.rejection {
            body["rejection"] = rejection;
        }
        (self.status, Json(body)).into_response()
    }
}

impl From<ApiError> for CommandError {
    /// A request refused before it reached an entity: not applied.
    fn from(error: ApiError) -> Self {
        CommandError {
            status: error.status,
            message: error.message,
            outcome: "not_applied",
            rejection: None,
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
            FailureKind::Unavailable | FailureKind::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            FailureKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
            FailureKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        };
        CommandError {
            status,
            message: failure.message,
            outcome: failure.outcome.as_str(),
            rejection: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entities::{JsonEntities, JsonEntity, JsonFace};
    use crate::http::test_support::Tally;
    use axum::body::Body;
    use axum::http::{Method, Request, header};
    use serde_json::json;
    use std::collections::BTreeMap;
    use tessera_entities::{EntityConfig, EntityHost};
    use tower::ServiceExt;

    async fn types() -> (Arc<JsonEntities>, tempfile::TempDir) {
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
            Tally,
            Arc::new(journal),
            Arc::new(snapshots),
            EntityConfig::default(),
        )
        .unwrap();
        let face: Arc<dyn JsonEntity> = Arc::new(JsonFace::over_host(Arc::new(host)));
        let types = JsonEntities::new(BTreeMap::from([("tally".to_string(), face)]));
        (Arc::new(types), dir)
    }

    async fn post(types: &Arc<JsonEntities>, uri: &str, body: &str) -> (StatusCode, Value) {
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
    async fn commands_reply_with_json_and_rejections_carry_the_rejection() {
        let (types, _dir) = types().await;
        let a = "/entities/tally/a";
        assert_eq!(
            post(&types, a, r#"{"add": 10}"#).await,
            (StatusCode::OK, json!(10))
        );
        assert_eq!(
            post(&types, a, r#"{"take": 4}"#).await,
            (StatusCode::OK, json!(6))
        );
        let (status, body) = post(&types, a, r#"{"take": 7}"#).await;
        assert_eq!(status, StatusCode::CONFLICT);
        assert_eq!(
            body,
            json!({
                "error": "cannot take 7 from a tally of 6",
                "outcome": "not_applied",
                "rejection": {"too_little": {"tally": 6, "asked": 7}},
            })
        );
        assert_eq!(
            post(&types, a, r#"{"get": null}"#).await,
            (StatusCode::OK, json!(6))
        );
        // Percent-encoded ids are decoded; another id is another entity.
        assert_eq!(
            post(&types, "/entities/tally/bob%20smith", r#"{"get": null}"#).await,
            (StatusCode::OK, json!(0))
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bad_requests_name_the_problem() {
        let (types, _dir) = types().await;
        let (status, body) = post(&types, "/entities/cart/1", r#"{"get": null}"#).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(
            error_of(&body),
            r#"unknown entity type "cart": this node runs tally"#
        );

        let (status, body) = post(&types, "/entities/tally/a%0Ab", r#"{"get": null}"#).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(error_of(&body).starts_with("invalid entity id"), "{body}");
        assert!(error_of(&body).contains("control character"), "{body}");

        let long = format!("/entities/tally/{}", "x".repeat(300));
        let (status, body) = post(&types, &long, r#"{"get": null}"#).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(error_of(&body).contains("more than 256"), "{body}");

        for bad in [
            r#"{"transfer": 1}"#,
            r#"{"add": -5}"#,
            r#"{"get": 1}"#,
            "{}",
        ] {
            let (status, body) = post(&types, "/entities/tally/a", bad).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
            assert!(
                error_of(&body).starts_with("invalid command for entity type tally"),
                "{bad}: {body}"
            );
        }
        // Every error says whether the command took effect.
        assert_eq!(body["outcome"], "not_applied", "{body}");
        let (status, body) = post(&types, "/entities/tally/a", "{not json").await;
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
            .oneshot(request(Method::GET, "/entities/tally/a"))
            .await
            .unwrap();
        assert_eq!(wrong.status(), StatusCode::METHOD_NOT_ALLOWED);
        let missing = app.oneshot(request(Method::GET, "/nope")).await.unwrap();
        assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    }
}
