//! The dashboard's routes over a fake node: the event stream's first state, its event names,
//! its lag recovery, its subscriber limit and its end; the embedded page and the node summary.

use super::{DashboardSource, Subscription, routes};
use axum::Router;
use axum::body::{Body, BodyDataStream};
use axum::http::{Request, StatusCode, header};
use axum::response::Response;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tessera_cluster::events::{ClusterEvent, CurrentClusterState};
use tessera_cluster::{Address, Member, MemberStatus, UniqueAddress};
use tokio::sync::{broadcast, watch};
use tower::ServiceExt;

/// How long a test waits for a frame that should come.
const FRAME_TIMEOUT: Duration = Duration::from_secs(5);

/// A node whose membership the test sets and whose events it sends.
struct FakeNode {
    state: Mutex<CurrentClusterState>,
    events: broadcast::Sender<ClusterEvent>,
    subscriptions: AtomicUsize,
    refuse: AtomicBool,
}

impl FakeNode {
    fn new(state: CurrentClusterState, buffer: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(state),
            events: broadcast::channel(buffer).0,
            subscriptions: AtomicUsize::new(0),
            refuse: AtomicBool::new(false),
        })
    }

    fn send(&self, event: ClusterEvent) {
        self.events.send(event).expect("a subscriber listens");
    }
}

impl DashboardSource for FakeNode {
    fn self_address(&self) -> Address {
        addr(1)
    }

    fn entity_types(&self) -> Vec<String> {
        vec!["account".to_string()]
    }

    fn ddata_keys(&self) -> u64 {
        12
    }

    fn subscribe(&self) -> BoxFuture<'static, Result<Subscription, String>> {
        let answer = if self.refuse.load(Ordering::Relaxed) {
            Err("the cluster node is shutting down".to_string())
        } else {
            self.subscriptions.fetch_add(1, Ordering::Relaxed);
            Ok((self.state.lock().unwrap().clone(), self.events.subscribe()))
        };
        async move { answer }.boxed()
    }
}

fn addr(n: u16) -> Address {
    Address::new("127.0.0.1", 25519 + n)
}

fn member(n: u16, status: MemberStatus) -> Member {
    let mut member = Member::joining(
        UniqueAddress::new(addr(n), 100 + u64::from(n)),
        BTreeSet::from(["backend".to_string()]),
        String::new(),
    );
    member.status = status;
    if status != MemberStatus::Joining {
        member.up_number = i32::from(n);
    }
    member
}

/// Members 1..=n Up, member n unreachable, member 1 leading.
fn cluster_of(n: u16) -> CurrentClusterState {
    CurrentClusterState {
        members: (1..=n).map(|i| member(i, MemberStatus::Up)).collect(),
        unreachable: BTreeSet::from([member(n, MemberStatus::Up).unique_address]),
        leader: Some(member(1, MemberStatus::Up).unique_address),
    }
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

async fn call(router: &Router, path: &str) -> Response {
    router.clone().oneshot(get(path)).await.unwrap()
}

async fn body_json(response: Response) -> Value {
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// The frames of a server-sent event stream, keep-alive comments skipped.
struct Frames {
    body: BodyDataStream,
    buffer: String,
}

impl Frames {
    fn of(response: Response) -> Self {
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "text/event-stream"
        );
        Self {
            body: response.into_body().into_data_stream(),
            buffer: String::new(),
        }
    }

    /// The next event's name and JSON data; None when the stream ended.
    async fn next(&mut self) -> Option<(String, Value)> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let frame: String = self.buffer.drain(..end + 2).collect();
                let field = |name: &str| {
                    frame
                        .lines()
                        .find_map(|line| line.strip_prefix(name))
                        .map(str::to_string)
                };
                if let Some(event) = field("event: ") {
                    let data = field("data: ").expect("an event has data");
                    return Some((event, serde_json::from_str(&data).expect("JSON data")));
                }
                continue;
            }
            let chunk = tokio::time::timeout(FRAME_TIMEOUT, self.body.next())
                .await
                .expect("a frame within the timeout")?
                .expect("the body streams");
            self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }

    async fn expect(&mut self, name: &str) -> Value {
        let (event, data) = self.next().await.expect("the stream goes on");
        assert_eq!(event, name, "{data}");
        data
    }
}

fn setup(
    state: CurrentClusterState,
    buffer: usize,
    limit: usize,
) -> (Arc<FakeNode>, watch::Sender<bool>, Router) {
    let node = FakeNode::new(state, buffer);
    let (shutdown, stopped) = watch::channel(false);
    let router = routes(node.clone(), stopped, limit);
    (node, shutdown, router)
}

#[tokio::test]
async fn the_stream_starts_with_the_current_state_then_names_each_event_as_akka_does() {
    let (node, _shutdown, router) = setup(cluster_of(2), 16, 4);
    let mut frames = Frames::of(call(&router, "/cluster/events").await);
    let state = frames.expect("current-state").await;
    assert_eq!(
        state,
        json!({
            "self": "127.0.0.1:25520",
            "members": [
                {"address": "127.0.0.1:25520", "uid": 101, "status": "up", "roles": ["backend"], "up_number": 1},
                {"address": "127.0.0.1:25521", "uid": 102, "status": "up", "roles": ["backend"], "up_number": 2},
            ],
            "unreachable": [{"address": "127.0.0.1:25521", "uid": 102}],
            "leader": "127.0.0.1:25520",
        })
    );

    let joining = member(3, MemberStatus::Joining);
    let up = member(3, MemberStatus::Up);
    let events = [
        ClusterEvent::MemberJoined(joining.clone()),
        ClusterEvent::MemberWeaklyUp(member(3, MemberStatus::WeaklyUp)),
        ClusterEvent::MemberUp(up.clone()),
        ClusterEvent::MemberLeft(member(3, MemberStatus::Leaving)),
        ClusterEvent::MemberExited(member(3, MemberStatus::Exiting)),
        ClusterEvent::MemberDowned(member(3, MemberStatus::Down)),
        ClusterEvent::UnreachableMember(up.clone()),
        ClusterEvent::ReachableMember(up.clone()),
        ClusterEvent::MemberRemoved {
            member: member(3, MemberStatus::Removed),
            previous_status: MemberStatus::Down,
        },
        ClusterEvent::LeaderChanged(Some(up.unique_address.clone())),
        ClusterEvent::LeaderChanged(None),
    ];
    for event in events {
        node.send(event);
    }
    let names = [
        ("member-joined", "joining"),
        ("member-weakly-up", "weakly_up"),
        ("member-up", "up"),
        ("member-left", "leaving"),
        ("member-exited", "exiting"),
        ("member-downed", "down"),
        ("unreachable-member", "up"),
        ("reachable-member", "up"),
    ];
    for (name, status) in names {
        let data = frames.expect(name).await;
        assert_eq!(data["member"]["address"], "127.0.0.1:25522", "{name}");
        assert_eq!(data["member"]["uid"], 103, "{name}");
        assert_eq!(data["member"]["status"], status, "{name}");
    }
    let removed = frames.expect("member-removed").await;
    assert_eq!(removed["member"]["status"], "removed");
    assert_eq!(removed["previous_status"], "down");
    assert_eq!(
        frames.expect("leader-changed").await,
        json!({"leader": "127.0.0.1:25522"})
    );
    assert_eq!(
        frames.expect("leader-changed").await,
        json!({"leader": null})
    );
    assert_eq!(
        joining.up_number,
        i32::MAX,
        "joining members have no age yet"
    );
}

#[tokio::test]
async fn a_subscriber_that_lags_gets_a_fresh_current_state_instead_of_a_gap() {
    let (node, _shutdown, router) = setup(cluster_of(1), 4, 4);
    let mut frames = Frames::of(call(&router, "/cluster/events").await);
    frames.expect("current-state").await;
    // More events than the buffer holds arrive while the client reads nothing.
    for i in 2..=9 {
        node.send(ClusterEvent::MemberUp(member(i, MemberStatus::Up)));
    }
    *node.state.lock().unwrap() = cluster_of(9);
    let fresh = frames.expect("current-state").await;
    assert_eq!(fresh["members"].as_array().unwrap().len(), 9);
    assert_eq!(node.subscriptions.load(Ordering::Relaxed), 2);
    // And the stream goes on from the new subscription.
    node.send(ClusterEvent::LeaderChanged(None));
    assert_eq!(
        frames.expect("leader-changed").await,
        json!({"leader": null})
    );
}

#[tokio::test]
async fn subscribers_beyond_the_limit_get_503_until_one_leaves() {
    let (_node, _shutdown, router) = setup(cluster_of(1), 16, 2);
    let mut first = Frames::of(call(&router, "/cluster/events").await);
    let mut second = Frames::of(call(&router, "/cluster/events").await);
    first.expect("current-state").await;
    second.expect("current-state").await;

    let refused = call(&router, "/cluster/events").await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
    let error = body_json(refused).await;
    assert!(
        error["error"].as_str().unwrap().contains("limit 2"),
        "{error}"
    );

    drop(first);
    let mut third = Frames::of(call(&router, "/cluster/events").await);
    third.expect("current-state").await;
}

#[tokio::test]
async fn streams_end_when_the_node_stops_serving_and_new_ones_are_refused() {
    let (_node, shutdown, router) = setup(cluster_of(1), 16, 4);
    let mut frames = Frames::of(call(&router, "/cluster/events").await);
    frames.expect("current-state").await;
    shutdown.send(true).unwrap();
    assert_eq!(frames.next().await, None);
    let refused = call(&router, "/cluster/events").await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn a_cluster_that_takes_no_subscription_is_503_with_its_reason() {
    let (node, _shutdown, router) = setup(cluster_of(1), 16, 4);
    node.refuse.store(true, Ordering::Relaxed);
    let refused = call(&router, "/cluster/events").await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let error = body_json(refused).await;
    assert!(
        error["error"].as_str().unwrap().contains("shutting down"),
        "{error}"
    );
}

#[tokio::test]
async fn the_page_its_script_and_its_style_come_from_the_binary() {
    let (_node, _shutdown, router) = setup(cluster_of(1), 16, 4);
    let page = call(&router, "/").await;
    assert_eq!(page.status(), StatusCode::OK);
    assert_eq!(
        page.headers()[header::CONTENT_TYPE],
        "text/html; charset=utf-8"
    );
    let policy = page.headers()[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap()
        .to_string();
    assert!(policy.contains("script-src 'self'"), "{policy}");
    let html = axum::body::to_bytes(page.into_body(), 1 << 20)
        .await
        .unwrap();
    let html = std::str::from_utf8(&html).unwrap();
    assert!(html.contains(r#"src="/dashboard/app.js""#), "{html}");
    assert!(html.contains(r#"href="/dashboard/style.css""#), "{html}");

    for (path, content_type) in [
        ("/dashboard/app.js", "text/javascript; charset=utf-8"),
        ("/dashboard/style.css", "text/css; charset=utf-8"),
    ] {
        let response = call(&router, path).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        assert_eq!(response.headers()[header::CONTENT_TYPE], content_type);
    }
}

#[tokio::test]
async fn the_node_summary_names_the_node_its_entity_types_and_its_key_count() {
    let (_node, _shutdown, router) = setup(cluster_of(1), 16, 4);
    assert_eq!(
        body_json(call(&router, "/dashboard/node").await).await,
        json!({"self": "127.0.0.1:25520", "entity_types": ["account"], "ddata_keys": 12})
    );
}
