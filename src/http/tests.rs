//! Router tests against a fake cluster: every endpoint, every error code, exact JSON shapes.

use super::test_support::{Call, FakeControl, addr};
use super::*;
use axum::body::Body;
use axum::http::{Method, Request, header};
use serde_json::{Value, json};
use tessera_cluster::MemberStatus;
use tessera_entities::HostStats;
use tower::ServiceExt;

struct Reply {
    status: StatusCode,
    content_type: String,
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

async fn send(control: &Arc<FakeControl>, method: Method, uri: &str, body: Option<&str>) -> Reply {
    let mut request = Request::builder().method(method).uri(uri);
    if body.is_some() {
        request = request.header(header::CONTENT_TYPE, "application/json");
    }
    let request = request
        .body(Body::from(body.unwrap_or_default().to_string()))
        .unwrap();
    send_request(control, request).await
}

async fn send_request(control: &Arc<FakeControl>, request: Request<Body>) -> Reply {
    let response = router(control.clone(), Router::new())
        .oneshot(request)
        .await
        .unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    Reply {
        status,
        content_type,
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
async fn join_reaches_the_cluster() {
    let control = fake();
    let reply = send(
        &control,
        Method::POST,
        "/cluster/join",
        Some(r#"{"address":"127.0.0.1:7000"}"#),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json(), json!({"message": "joining 127.0.0.1:7000"}));
    assert_eq!(control.calls(), vec![Call::Join(addr("127.0.0.1:7000"))]);
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
    assert_eq!(names.len(), 44);
    for name in &names {
        assert!(text.contains(&format!("# HELP {name} ")), "{name}");
        assert!(name.starts_with("tessera_"), "{name}");
        if name.ends_with("_total") {
            assert!(text.contains(&format!("# TYPE {name} counter")), "{name}");
        }
    }
    let samples = text.lines().filter(|l| !l.starts_with('#')).count();
    // 7 statuses + 3 refusal reasons + 3 append outcomes + 27 single-sample families + the
    // latency histogram's +Inf bucket, sum and count (no finer buckets without samples); the
    // entity and sharding families have one sample per entity type, and there are none here.
    assert_eq!(samples, 7 + 3 + 3 + 27 + 3);
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
