//! Router tests against a fake cluster: every endpoint, every error code, exact JSON shapes;
//! the bearer token; and the server's limits over real TCP connections.

use super::test_support::{Call, FakeControl, addr};
use super::*;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, header};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tessera_cluster::MemberStatus;
use tessera_entities::HostStats;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower::ServiceExt;

struct Reply {
    status: StatusCode,
    content_type: String,
    headers: HeaderMap,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    /// Asserts an error reply: this status, a JSON body `{"error": ...}` containing `needle`.
    fn assert_error(&self, status: StatusCode, needle: &str) {
        assert_eq!(self.status, status, "{}", self.body);
        assert!(
            self.content_type.starts_with("application/json"),
            "{}",
            self.content_type
        );
        let error = self.json()["error"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(error.contains(needle), "{error:?} lacks {needle:?}");
    }
}

/// A request with an optional JSON body and an optional bearer token.
fn request(method: Method, uri: &str, body: Option<&str>, token: Option<&str>) -> Request<Body> {
    let mut request = Request::builder().method(method).uri(uri);
    if body.is_some() {
        request = request.header(header::CONTENT_TYPE, "application/json");
    }
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    request
        .body(Body::from(body.unwrap_or_default().to_string()))
        .unwrap()
}

async fn send(control: &Arc<FakeControl>, method: Method, uri: &str, body: Option<&str>) -> Reply {
    send_request(control, request(method, uri, body, None)).await
}

async fn send_request(control: &Arc<FakeControl>, request: Request<Body>) -> Reply {
    call(router(control.clone(), Router::new()), request).await
}

async fn call(router: Router, request: Request<Body>) -> Reply {
    let response = router.oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    Reply {
        status,
        content_type,
        headers,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

fn fake() -> Arc<FakeControl> {
    Arc::new(FakeControl::two_up())
}

#[tokio::test]
async fn members_lists_self_leader_and_members_in_the_documented_shape() {
    let control = fake();
    let reply = send(&control, Method::GET, "/cluster/members", None).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.json(),
        json!({
            "self": "127.0.0.1:25520",
            "leader": "127.0.0.1:25520",
            "members": [
                {"address": "127.0.0.1:25520", "uid": 7, "status": "up", "roles": [],
                 "reachable": true, "up_number": 1},
                {"address": "127.0.0.1:25521", "uid": 8, "status": "up", "roles": ["backend"],
                 "reachable": true, "up_number": 2},
            ]
        })
    );
}

#[tokio::test]
async fn members_without_leader_renders_null_and_status_names() {
    let control = fake();
    {
        let mut view = control.view.lock().unwrap();
        view.leader = None;
        view.members[1].status = MemberStatus::WeaklyUp;
        view.members[1].reachable = false;
    }
    let body = send(&control, Method::GET, "/cluster/members", None)
        .await
        .json();
    assert_eq!(body["leader"], Value::Null);
    assert_eq!(body["members"][1]["status"], "weakly_up");
    assert_eq!(body["members"][1]["reachable"], false);
}

#[tokio::test]
async fn put_leave_and_down_reach_the_cluster() {
    let control = fake();
    let reply = send(
        &control,
        Method::PUT,
        "/cluster/members/127.0.0.1:25521",
        Some(r#"{"operation": "leave"}"#),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.json(),
        json!({"message": "leave requested for 127.0.0.1:25521"})
    );

    let reply = send(
        &control,
        Method::PUT,
        "/cluster/members/127.0.0.1%3A25521",
        Some(r#"{"operation": "down"}"#),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.json(),
        json!({"message": "down requested for 127.0.0.1:25521"})
    );
    assert_eq!(
        control.calls(),
        vec![
            Call::Leave(addr("127.0.0.1:25521")),
            Call::Down(addr("127.0.0.1:25521"))
        ]
    );
}

#[tokio::test]
async fn put_on_unknown_member_is_404() {
    let control = fake();
    send(
        &control,
        Method::PUT,
        "/cluster/members/127.0.0.1:9",
        Some(r#"{"operation":"down"}"#),
    )
    .await
    .assert_error(StatusCode::NOT_FOUND, "no member with address 127.0.0.1:9");
}

#[tokio::test]
async fn put_with_unknown_operation_is_400_naming_it() {
    let control = fake();
    send(
        &control,
        Method::PUT,
        "/cluster/members/127.0.0.1:25521",
        Some(r#"{"operation": "explode"}"#),
    )
    .await
    .assert_error(StatusCode::BAD_REQUEST, r#"unknown operation "explode""#);
    assert!(control.calls().is_empty());
}

#[tokio::test]
async fn put_with_malformed_address_is_400_naming_it() {
    let control = fake();
    send(
        &control,
        Method::PUT,
        "/cluster/members/not-an-address",
        Some(r#"{"operation":"leave"}"#),
    )
    .await
    .assert_error(
        StatusCode::BAD_REQUEST,
        r#"invalid address "not-an-address""#,
    );
}

#[tokio::test]
async fn malformed_or_incomplete_json_bodies_are_400() {
    let control = fake();
    for (body, needle) in [
        ("{not json", "invalid request body"),
        (r#"{"op": "leave"}"#, "missing field `operation`"),
        (r#"{"operation": 5}"#, "invalid type"),
        ("", "invalid request body"),
    ] {
        send(
            &control,
            Method::PUT,
            "/cluster/members/127.0.0.1:25521",
            Some(body),
        )
        .await
        .assert_error(StatusCode::BAD_REQUEST, needle);
    }
    assert!(control.calls().is_empty());
}

#[tokio::test]
async fn body_without_json_content_type_is_415() {
    let control = fake();
    let request = Request::builder()
        .method(Method::POST)
        .uri("/cluster/join")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(r#"{"address":"127.0.0.1:1"}"#))
        .unwrap();
    send_request(&control, request)
        .await
        .assert_error(StatusCode::UNSUPPORTED_MEDIA_TYPE, "Content-Type");
}

#[tokio::test]
async fn oversized_body_is_413() {
    let control = fake();
    let huge = format!(r#"{{"address": "{}"}}"#, "a".repeat(MAX_BODY_BYTES * 2));
    send(&control, Method::POST, "/cluster/join", Some(&huge))
        .await
        .assert_error(StatusCode::PAYLOAD_TOO_LARGE, "invalid request body");
}

#[tokio::test]
async fn join_answers_with_the_status_reached_once_confirmed() {
    let control = Arc::new(FakeControl::not_a_member(Some(Duration::from_millis(200))));
    let reply = send(
        &control,
        Method::POST,
        "/cluster/join",
        Some(r#"{"address":"127.0.0.1:7000"}"#),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(
        reply.json(),
        json!({
            "message": "joined the cluster of 127.0.0.1:7000; this node is up",
            "status": "up",
        })
    );
    assert_eq!(control.calls(), vec![Call::Join(addr("127.0.0.1:7000"))]);
}

#[tokio::test]
async fn join_to_its_own_address_forms_a_cluster_and_is_confirmed() {
    let control = Arc::new(FakeControl::not_a_member(Some(Duration::ZERO)));
    let reply = send(
        &control,
        Method::POST,
        "/cluster/join",
        Some(r#"{"address":"127.0.0.1:25520"}"#),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.json()["status"], "up");
}

#[tokio::test]
async fn join_not_confirmed_in_time_is_504_with_outcome_unknown() {
    let control = Arc::new(FakeControl::not_a_member(None));
    let started = Instant::now();
    let reply = send(
        &control,
        Method::POST,
        "/cluster/join",
        Some(r#"{"address":"127.0.0.1:7000", "timeout": "300ms"}"#),
    )
    .await;
    reply.assert_error(
        StatusCode::GATEWAY_TIMEOUT,
        "join of 127.0.0.1:7000 sent but not confirmed within 300ms: this node is not a member yet",
    );
    assert_eq!(reply.json()["outcome"], "unknown");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(control.calls(), vec![Call::Join(addr("127.0.0.1:7000"))]);
}

#[tokio::test]
async fn join_with_invalid_timeout_is_400_and_sends_nothing() {
    let control = Arc::new(FakeControl::not_a_member(Some(Duration::ZERO)));
    for timeout in ["0s", "2h", "soon"] {
        let body = format!(r#"{{"address":"127.0.0.1:7000", "timeout": "{timeout}"}}"#);
        send(&control, Method::POST, "/cluster/join", Some(&body))
            .await
            .assert_error(StatusCode::BAD_REQUEST, "invalid timeout");
    }
    assert!(control.calls().is_empty());
}

#[tokio::test]
async fn join_with_malformed_address_is_400() {
    let control = fake();
    send(
        &control,
        Method::POST,
        "/cluster/join",
        Some(r#"{"address":"127.0.0.1:99999"}"#),
    )
    .await
    .assert_error(StatusCode::BAD_REQUEST, "port is not a number");
    send(
        &control,
        Method::POST,
        "/cluster/join",
        Some(r#"{"adress":"127.0.0.1:1"}"#),
    )
    .await
    .assert_error(StatusCode::BAD_REQUEST, "missing field `address`");
}

#[tokio::test]
async fn shutting_down_and_overloaded_are_503() {
    for (err, needle) in [
        (ControlError::ShuttingDown, "shutting down"),
        (ControlError::Overloaded, "overloaded"),
    ] {
        let control = fake();
        *control.fail_with.lock().unwrap() = Some(err);
        send(
            &control,
            Method::POST,
            "/cluster/join",
            Some(r#"{"address":"127.0.0.1:1"}"#),
        )
        .await
        .assert_error(StatusCode::SERVICE_UNAVAILABLE, needle);
        send(
            &control,
            Method::PUT,
            "/cluster/members/127.0.0.1:25521",
            Some(r#"{"operation":"leave"}"#),
        )
        .await
        .assert_error(StatusCode::SERVICE_UNAVAILABLE, needle);
    }
}

#[tokio::test]
async fn alive_is_always_200() {
    let control = fake();
    control.set_self_status(None);
    let reply = send(&control, Method::GET, "/health/alive", None).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json(), json!({"status": "alive"}));
}

#[tokio::test]
async fn ready_is_200_only_when_up() {
    let control = fake();
    let reply = send(&control, Method::GET, "/health/ready", None).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json(), json!({"status": "up"}));

    for status in MemberStatus::ALL
        .into_iter()
        .filter(|s| *s != MemberStatus::Up)
    {
        control.set_self_status(Some(status));
        let reply = send(&control, Method::GET, "/health/ready", None).await;
        reply.assert_error(StatusCode::SERVICE_UNAVAILABLE, status.as_str());
        assert_eq!(reply.json()["status"], status.as_str());
    }

    control.set_self_status(None);
    let reply = send(&control, Method::GET, "/health/ready", None).await;
    reply.assert_error(StatusCode::SERVICE_UNAVAILABLE, "not a member");
    assert_eq!(reply.json()["status"], Value::Null);
}

/// An Up node whose shard regions are not registered with their coordinators yet is not
/// ready: 503 naming why, until they are.
#[tokio::test]
async fn ready_waits_for_the_shard_regions_to_register() {
    let control = fake();
    let reason = "the shard regions of account are not registered with their coordinators yet";
    *control.not_ready.lock().unwrap() = Some(reason.to_string());
    let reply = send(&control, Method::GET, "/health/ready", None).await;
    reply.assert_error(StatusCode::SERVICE_UNAVAILABLE, reason);
    assert_eq!(reply.json()["status"], "up");
    *control.not_ready.lock().unwrap() = None;
    let reply = send(&control, Method::GET, "/health/ready", None).await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test]
async fn metrics_are_prometheus_text_with_every_series() {
    let mut control = FakeControl::two_up();
    control.metrics = NodeMetrics {
        members_by_status: vec![(MemberStatus::Up, 3), (MemberStatus::Joining, 1)],
        is_leader: true,
        gossip_sent_total: 12,
        connections_refused_total: RefusedConnections {
            auth: 1,
            malformed: 0,
            oversize: 2,
            too_many_handshakes: 0,
        },
        entity_types: vec![
            (
                "account".to_string(),
                HostStats {
                    live_entities: 4,
                    incarnations_started: 9,
                    commands_handed_over: 2,
                    ..HostStats::default()
                },
            ),
            ("odd\"type".to_string(), HostStats::default()),
        ],
        sharding: vec![crate::http::ShardingMetrics {
            entity_type: "account".to_string(),
            registered: true,
            shards: 17,
            buffered: 3,
            coordinator_running: true,
            rebalance_rounds_total: 2,
            ..crate::http::ShardingMetrics::default()
        }],
        ..NodeMetrics::default()
    };
    let reply = send(&Arc::new(control), Method::GET, "/metrics", None).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        reply.content_type.starts_with("text/plain; version=0.0.4"),
        "{}",
        reply.content_type
    );
    for line in [
        "# HELP tessera_cluster_members ",
        "# TYPE tessera_cluster_members gauge",
        "tessera_cluster_members{status=\"up\"} 3",
        "tessera_cluster_members{status=\"joining\"} 1",
        "tessera_cluster_members{status=\"weakly_up\"} 0",
        "tessera_cluster_members{status=\"removed\"} 0",
        "tessera_cluster_is_leader 1",
        "# TYPE tessera_cluster_gossip_sent_total counter",
        "tessera_cluster_gossip_sent_total 12",
        "tessera_transport_connections_refused_total{reason=\"auth\"} 1",
        "tessera_transport_connections_refused_total{reason=\"malformed\"} 0",
        "tessera_transport_connections_refused_total{reason=\"oversize\"} 2",
        "# TYPE tessera_entities_live gauge",
        "tessera_entities_live{type=\"account\"} 4",
        "tessera_entities_started_total{type=\"account\"} 9",
        "tessera_entities_commands_handed_over_total{type=\"account\"} 2",
        "tessera_entities_live{type=\"odd\\\"type\"} 0",
        "# TYPE tessera_sharding_shards gauge",
        "tessera_sharding_shards{type=\"account\"} 17",
        "tessera_sharding_buffered_messages{type=\"account\"} 3",
        "tessera_sharding_region_registered{type=\"account\"} 1",
        "tessera_sharding_coordinator_running{type=\"account\"} 1",
        "tessera_sharding_rebalance_rounds_total{type=\"account\"} 2",
        "tessera_sharding_coordinator_writes_total{type=\"account\"} 0",
    ] {
        assert!(
            reply.body.lines().any(|l| l.starts_with(line)),
            "{line} missing:\n{}",
            reply.body
        );
    }
}

#[test]
fn every_metric_has_help_and_type_and_one_sample_per_label() {
    let text = render_prometheus(&NodeMetrics::default());
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(names.len(), 87);
    for name in &names {
        assert!(text.contains(&format!("# HELP {name} ")), "{name}");
        assert!(name.starts_with("tessera_"), "{name}");
        if name.ends_with("_total") {
            assert!(text.contains(&format!("# TYPE {name} counter")), "{name}");
        }
    }
    let samples = text.lines().filter(|l| !l.starts_with('#')).count();
    // 7 statuses + 4 connection refusal reasons + 3 append outcomes + 2 × 3 ddata limits
    // refused + 2 request refusal reasons + 3 sharding frame refusal reasons + 2 remember
    // write outcomes + 48 single-sample families + 3 histograms (journal appends under two
    // names, fsyncs) and 2 × 5 consistency levels of ddata reads and writes, each with 16
    // buckets, +Inf, sum and count; the entity, sharding and entity ask families of a type
    // have one sample (or histogram) per entity type, none here.
    let histogram = tessera_metrics::LATENCY_BUCKETS_SECONDS.len() + 3;
    assert_eq!(
        samples,
        7 + 4 + 3 + 2 * 3 + 2 + 3 + 2 + 48 + (3 + 2 * 5) * histogram
    );
}

#[tokio::test]
async fn unknown_route_and_wrong_method_are_json_errors() {
    let control = fake();
    send(&control, Method::GET, "/nope", None)
        .await
        .assert_error(StatusCode::NOT_FOUND, "no such route");
    send(&control, Method::DELETE, "/cluster/members", None)
        .await
        .assert_error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    send(&control, Method::GET, "/cluster/join", None)
        .await
        .assert_error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
}

#[tokio::test]
async fn hostile_inputs_get_client_errors_not_panics() {
    let control = fake();
    let paths = [
        "/cluster/members/%FF%FE",
        "/cluster/members/%00:1",
        "/cluster/members/:",
        "/cluster/members/a:b:c",
        "/cluster/members/127.0.0.1:-1",
        "/cluster/members/127.0.0.1:25521/extra",
    ];
    let bodies = [
        "null",
        "[]",
        "\"leave\"",
        "{\"operation\": null}",
        "\u{0}",
        "{\"operation\":\"leave\"}",
    ];
    for path in paths {
        for body in bodies {
            let reply = send(&control, Method::PUT, path, Some(body)).await;
            assert!(
                reply.status.is_client_error(),
                "{path} {body:?}: {}",
                reply.status
            );
            assert!(
                reply.json()["error"].is_string(),
                "{path} {body:?}: {}",
                reply.body
            );
        }
    }
    assert!(control.calls().is_empty());
}

#[tokio::test]
async fn serve_answers_over_tcp_and_stops_on_shutdown() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let local = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, router(fake(), Router::new()), async {
        let _ = stopped.await;
    }));

    let mut stream = tokio::net::TcpStream::connect(local).await.unwrap();
    stream
        .write_all(b"GET /health/alive HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with(r#"{"status":"alive"}"#), "{response}");

    stop.send(()).unwrap();
    let result = tokio::time::timeout(std::time::Duration::from_secs(5), server)
        .await
        .expect("server stops after shutdown")
        .unwrap();
    assert!(result.is_ok());
}

// --- The bearer token -------------------------------------------------------------------

const TOKEN: &str = "s3cret-token";

fn secured(reads_required: bool) -> HttpServer {
    HttpServer::new(HttpSettings {
        token: Some(TOKEN.to_string()),
        token_required_for_reads: reads_required,
        ..HttpSettings::default()
    })
}

/// A service merged in beside the cluster routes, as the node merges ddata and entities.
fn poke_service() -> Router {
    Router::new().route("/test/poke", post(|| async { "poked" }))
}

impl Reply {
    /// Asserts a 401 naming `needle`, with a Bearer challenge.
    fn assert_unauthorized(&self, needle: &str) {
        self.assert_error(StatusCode::UNAUTHORIZED, needle);
        let challenge = self.headers[header::WWW_AUTHENTICATE].to_str().unwrap();
        assert!(challenge.starts_with("Bearer"), "{challenge}");
    }
}

#[tokio::test]
async fn mutations_without_the_right_token_are_401_and_change_nothing() {
    let control = fake();
    let server = secured(false);
    let mutations = [
        (
            Method::PUT,
            "/cluster/members/127.0.0.1:25521",
            r#"{"operation": "down"}"#,
        ),
        (
            Method::POST,
            "/cluster/join",
            r#"{"address": "127.0.0.1:7000"}"#,
        ),
        (Method::POST, "/test/poke", "{}"),
    ];
    for (method, uri, body) in mutations {
        for (token, needle) in [
            (None, "missing bearer token"),
            (Some("not-the-token"), "wrong bearer token"),
            (Some(""), "missing bearer token"),
        ] {
            let router = server.router(control.clone(), poke_service());
            let reply = call(router, request(method.clone(), uri, Some(body), token)).await;
            reply.assert_unauthorized(needle);
            assert!(!reply.body.contains("not-the-token"), "{}", reply.body);
        }
    }
    assert!(control.calls().is_empty(), "{:?}", control.calls());
    assert_eq!(server.stats().snapshot().requests_unauthorized_total, 9);
}

#[tokio::test]
async fn mutations_with_the_token_reach_the_cluster() {
    let control = fake();
    let server = secured(false);
    let reply = call(
        server.router(control.clone(), poke_service()),
        request(
            Method::PUT,
            "/cluster/members/127.0.0.1:25521",
            Some(r#"{"operation": "down"}"#),
            Some(TOKEN),
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(control.calls(), vec![Call::Down(addr("127.0.0.1:25521"))]);
    let reply = call(
        server.router(control.clone(), poke_service()),
        request(Method::POST, "/test/poke", Some("{}"), Some(TOKEN)),
    )
    .await;
    assert_eq!(
        (reply.status, reply.body.as_str()),
        (StatusCode::OK, "poked")
    );
}

#[tokio::test]
async fn reads_need_the_token_only_when_required() {
    let control = fake();
    let get = |token| request(Method::GET, "/cluster/members", None, token);
    let open = secured(false);
    let reply = call(open.router(control.clone(), Router::new()), get(None)).await;
    assert_eq!(reply.status, StatusCode::OK);

    let closed = secured(true);
    let router = || closed.router(control.clone(), Router::new());
    call(router(), get(None))
        .await
        .assert_unauthorized("missing bearer token");
    call(router(), get(Some("nope")))
        .await
        .assert_unauthorized("wrong bearer token");
    assert_eq!(
        call(router(), get(Some(TOKEN))).await.status,
        StatusCode::OK
    );
    // Unknown routes too: without the token, nothing tells which routes exist.
    call(router(), request(Method::GET, "/nope", None, None))
        .await
        .assert_unauthorized("missing bearer token");
}

#[tokio::test]
async fn health_and_seed_nodes_stay_open_whatever_the_token_policy() {
    let control = fake();
    let closed = secured(true);
    for uri in ["/health/alive", "/health/ready"] {
        let reply = call(
            closed.router(control.clone(), Router::new()),
            request(Method::GET, uri, None, None),
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "{uri}: {}", reply.body);
    }
    // Not routed here (Cluster Bootstrap and the dashboard add them), but never refused for a
    // missing token.
    for uri in [
        "/bootstrap/seed-nodes",
        "/",
        "/dashboard/app.js",
        "/dashboard/style.css",
    ] {
        let reply = call(
            closed.router(control.clone(), Router::new()),
            request(Method::GET, uri, None, None),
        )
        .await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{uri}");
    }
    // The dashboard's data is not open.
    call(
        closed.router(control.clone(), Router::new()),
        request(Method::GET, "/dashboard/node", None, None),
    )
    .await
    .assert_unauthorized("missing bearer token");
}

#[tokio::test]
async fn reads_required_without_a_configured_token_refuse_everything_but_probes() {
    let control = fake();
    let server = HttpServer::new(HttpSettings {
        token_required_for_reads: true,
        ..HttpSettings::default()
    });
    call(
        server.router(control.clone(), Router::new()),
        request(Method::GET, "/cluster/members", None, Some("anything")),
    )
    .await
    .assert_unauthorized("no http_token configured");
    let reply = call(
        server.router(control.clone(), Router::new()),
        request(Method::GET, "/health/alive", None, None),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[test]
fn settings_debug_never_shows_the_token() {
    let shown = format!("{:?}", secured(true).settings());
    assert!(!shown.contains(TOKEN), "{shown}");
    assert!(shown.contains("<redacted>"), "{shown}");
}

// --- The server's limits, over TCP ------------------------------------------------------

/// A server on an ephemeral loopback port, stopped by [`Running::stop`].
struct Running {
    address: SocketAddr,
    stats: Arc<HttpStats>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn start(settings: HttpSettings, services: Router) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let server = HttpServer::new(settings);
    let stats = server.stats();
    let router = server.router(fake(), services);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.serve(listener, router, async {
        let _ = stopped.await;
    }));
    Running {
        address,
        stats,
        stop,
        task,
    }
}

impl Running {
    async fn get(&self, path: &str) -> crate::http::test_support::HttpResponse {
        crate::http::test_support::get(self.address, path, Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// Signals shutdown and waits for `serve` to return Ok.
    async fn stop(self) {
        self.stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("server stops after shutdown")
            .unwrap()
            .unwrap();
    }
}

/// Waits, within a generous bound, until `condition` holds.
async fn eventually(what: &str, mut condition: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Routes whose handler is held until the test releases it: `/test/held` (announces itself on
/// `entered`, answers "released" once a permit is added to `release`) and `/test/hang` (never
/// answers).
struct Gate {
    entered: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Semaphore>,
}

impl Gate {
    fn new() -> Self {
        Self {
            entered: Arc::default(),
            release: Arc::new(tokio::sync::Semaphore::new(0)),
        }
    }

    fn routes(&self) -> Router {
        let (entered, release) = (self.entered.clone(), self.release.clone());
        Router::new()
            .route(
                "/test/held",
                get(move || {
                    let (entered, release) = (entered.clone(), release.clone());
                    async move {
                        entered.notify_one();
                        let _permit = release.acquire().await.unwrap();
                        "released"
                    }
                }),
            )
            .route("/test/hang", get(std::future::pending::<&'static str>))
    }

    async fn wait_entered(&self) {
        tokio::time::timeout(Duration::from_secs(10), self.entered.notified())
            .await
            .expect("the held request reached its handler");
    }
}

#[tokio::test]
async fn a_client_sending_headers_one_byte_per_second_is_cut_off_while_others_are_served() {
    let server = start(
        HttpSettings {
            header_timeout: Duration::from_secs(1),
            ..HttpSettings::default()
        },
        Router::new(),
    )
    .await;
    let (mut reader, mut writer) = TcpStream::connect(server.address)
        .await
        .unwrap()
        .into_split();
    writer
        .write_all(b"GET /health/alive HTTP/1.1\r\n")
        .await
        .unwrap();
    let trickle = tokio::spawn(async move {
        for byte in b"Host: slow.example\r\nX-Slow: one-byte-per-second\r\n\r\n" {
            if writer.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });

    // Another client is served meanwhile.
    assert_eq!(server.get("/health/alive").await.status, 200);

    // The slow one is disconnected long before its ~50 s of headers end: EOF or a reset,
    // never an answer to its request.
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(15), reader.read_to_end(&mut answer))
        .await
        .expect("the slow client is disconnected after the header timeout");
    let answer = String::from_utf8_lossy(&answer);
    assert!(!answer.contains("200 OK"), "{read:?} {answer}");
    trickle.abort();
    assert_eq!(server.stats.snapshot().header_timeouts_total, 1);
    assert_eq!(server.get("/health/alive").await.status, 200);
    server.stop().await;
}

#[tokio::test]
async fn connections_beyond_the_limit_get_503_and_are_closed_until_one_closes() {
    let server = start(
        HttpSettings {
            max_connections: 2,
            header_timeout: Duration::from_secs(60),
            ..HttpSettings::default()
        },
        Router::new(),
    )
    .await;
    let idle_1 = TcpStream::connect(server.address).await.unwrap();
    let _idle_2 = TcpStream::connect(server.address).await.unwrap();
    let stats = server.stats.clone();
    eventually("two open connections", async || {
        stats.snapshot().connections_open == 2
    })
    .await;

    let mut third = TcpStream::connect(server.address).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), third.read_to_string(&mut answer))
        .await
        .expect("the third connection is closed at once")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.ends_with(r#"{"error":"too many connections (limit 2); retry later"}"#),
        "{answer}"
    );
    assert_eq!(stats.snapshot().connections_refused_total, 1);
    assert_eq!(stats.snapshot().connections_open, 2);

    drop(idle_1);
    let address = server.address;
    eventually("a connection served after one closed", async || {
        crate::http::test_support::get(address, "/health/alive", Duration::from_secs(5))
            .await
            .is_ok_and(|reply| reply.status == 200)
    })
    .await;
    server.stop().await;
}

#[tokio::test]
async fn requests_beyond_the_concurrency_limit_are_503_at_once_and_probes_still_answer() {
    let gate = Gate::new();
    let server = start(
        HttpSettings {
            max_concurrent_requests: 1,
            ..HttpSettings::default()
        },
        gate.routes(),
    )
    .await;
    let address = server.address;
    let held = tokio::spawn(crate::http::test_support::get(
        address,
        "/test/held",
        Duration::from_secs(20),
    ));
    gate.wait_entered().await;

    let shed = server.get("/cluster/members").await;
    assert_eq!(shed.status, 503, "{}", shed.body);
    let error = shed.json().unwrap()["error"].as_str().unwrap().to_string();
    assert!(
        error.contains("too many requests in flight (limit 1)"),
        "{error}"
    );
    assert_eq!(server.get("/health/alive").await.status, 200);

    gate.release.add_permits(1);
    let held = held.await.unwrap().unwrap();
    assert_eq!((held.status, held.body.as_str()), (200, "released"));
    assert_eq!(server.get("/cluster/members").await.status, 200);
    assert_eq!(server.stats.snapshot().requests_shed_total, 1);
    server.stop().await;
}

#[tokio::test]
async fn a_request_beyond_the_request_timeout_is_504_naming_it() {
    let gate = Gate::new();
    let server = start(
        HttpSettings {
            request_timeout: Duration::from_secs(1),
            ..HttpSettings::default()
        },
        gate.routes(),
    )
    .await;
    let reply = server.get("/test/hang").await;
    assert_eq!(reply.status, 504, "{}", reply.body);
    let body = reply.json().unwrap();
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("request timed out after 1s (http_request_timeout)"),
        "{body}"
    );
    assert_eq!(body["outcome"], "unknown");
    assert_eq!(server.stats.snapshot().requests_timed_out_total, 1);
    server.stop().await;
}

#[tokio::test]
async fn a_streamed_response_outlives_the_header_and_request_timeouts() {
    /// Three chunks, 700 ms apart: 2.1 s of body, past both 1 s timeouts.
    async fn slow_stream() -> Body {
        Body::from_stream(futures::stream::unfold(0, |n| async move {
            if n == 3 {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(700)).await;
            Some((
                Ok::<_, std::convert::Infallible>(format!("chunk{n};")),
                n + 1,
            ))
        }))
    }
    let services = Router::new().route("/test/stream", get(slow_stream));
    let server = start(
        HttpSettings {
            header_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
            ..HttpSettings::default()
        },
        services,
    )
    .await;
    let reply = server.get("/test/stream").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    for chunk in ["chunk0;", "chunk1;", "chunk2;"] {
        assert!(reply.body.contains(chunk), "{}", reply.body);
    }
    let stats = server.stats.snapshot();
    assert_eq!(
        (stats.header_timeouts_total, stats.requests_timed_out_total),
        (0, 0)
    );
    server.stop().await;
}

#[tokio::test]
async fn shutdown_stops_accepting_and_lets_the_request_in_flight_finish() {
    let gate = Gate::new();
    let server = start(HttpSettings::default(), gate.routes()).await;
    let address = server.address;
    let idle = TcpStream::connect(address).await.unwrap();
    let held = tokio::spawn(crate::http::test_support::get(
        address,
        "/test/held",
        Duration::from_secs(20),
    ));
    gate.wait_entered().await;

    let Running {
        stop, task, stats, ..
    } = server;
    stop.send(()).unwrap();
    // The idle connection is closed at once; the held request still runs.
    eventually("the idle connection closed", async || {
        stats.snapshot().connections_open == 1
    })
    .await;
    assert!(!held.is_finished());
    gate.release.add_permits(1);
    let held = held.await.unwrap().unwrap();
    assert_eq!((held.status, held.body.as_str()), (200, "released"));
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("serve returns once the last request finished")
        .unwrap()
        .unwrap();
    assert!(TcpStream::connect(address).await.is_err());
    drop(idle);
}

#[tokio::test]
async fn serve_refuses_limits_of_zero() {
    for (settings, key) in [
        (
            HttpSettings {
                max_connections: 0,
                ..HttpSettings::default()
            },
            "http_max_connections",
        ),
        (
            HttpSettings {
                max_concurrent_requests: 0,
                ..HttpSettings::default()
            },
            "http_max_concurrent_requests",
        ),
        (
            HttpSettings {
                header_timeout: Duration::ZERO,
                ..HttpSettings::default()
            },
            "http_header_timeout",
        ),
    ] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let err = HttpServer::new(settings)
            .serve(listener, Router::new(), std::future::pending())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert!(err.to_string().starts_with(key), "{err}");
    }
}
