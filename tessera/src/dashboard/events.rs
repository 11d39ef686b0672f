//! `GET /cluster/events`: the cluster's membership as server-sent events, as Akka
//! Management's cluster domain events.
//!
//! A subscriber first gets `current-state`, `{"self": "h:p", "members": [{"address", "uid",
//! "status", "roles", "up_number"}], "unreachable": [{"address", "uid"}], "leader": "h:p" |
//! null}`, then one event per change: `member-joined`, `member-weakly-up`, `member-up`,
//! `member-left`, `member-exited`, `member-downed` and `member-removed` (`{"member": {...}}`,
//! the removal with `"previous_status"`), `unreachable-member` and `reachable-member`
//! (`{"member": {...}}`), `leader-changed` (`{"leader": "h:p" | null}`).
//!
//! Never silently incomplete: a subscriber that falls so far behind that the cluster's event
//! buffer dropped events for it gets a fresh `current-state` instead. Bounded: at most
//! [`MAX_EVENT_SUBSCRIBERS`] streams at once per node (beyond, 503); a stream ends when the
//! node stops serving HTTP.

use super::{DashboardSource, Subscription};
use crate::http::ApiError;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::Stream;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tessera_cluster::events::{ClusterEvent, CurrentClusterState};
use tessera_cluster::{Address, Member, UniqueAddress};
use tokio::sync::broadcast::Receiver;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

/// Event streams one node serves at once; each holds a connection and a cluster subscription.
pub const MAX_EVENT_SUBSCRIBERS: usize = 64;

/// How often an idle stream sends a comment line, so that proxies keep it open and a client
/// notices a dead connection.
pub const EVENT_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// What every stream of a node shares.
struct Streams {
    source: Arc<dyn DashboardSource>,
    shutdown: watch::Receiver<bool>,
    slots: Arc<Semaphore>,
    max_subscribers: usize,
}

/// The event-stream route.
pub(super) fn router(
    source: Arc<dyn DashboardSource>,
    shutdown: watch::Receiver<bool>,
    max_subscribers: usize,
) -> Router {
    let streams = Streams {
        source,
        shutdown,
        slots: Arc::new(Semaphore::new(max_subscribers)),
        max_subscribers,
    };
    Router::new()
        .route("/cluster/events", get(subscribe))
        .with_state(Arc::new(streams))
}

/// `GET /cluster/events`: 503 when the node is stopping, the cluster takes no subscription or
/// [`MAX_EVENT_SUBSCRIBERS`] streams are open; otherwise the stream.
async fn subscribe(State(streams): State<Arc<Streams>>) -> Response {
    if *streams.shutdown.borrow() {
        return unavailable("the node is stopping".to_string());
    }
    let Ok(slot) = streams.slots.clone().try_acquire_owned() else {
        return unavailable(format!(
            "too many cluster event subscribers (limit {}); retry later",
            streams.max_subscribers
        ));
    };
    let (state, events) = match streams.source.subscribe().await {
        Ok(subscription) => subscription,
        Err(e) => return unavailable(format!("cannot subscribe to cluster events: {e}")),
    };
    let subscriber = Subscriber {
        source: streams.source.clone(),
        self_address: streams.source.self_address(),
        first: Some(state),
        events,
        shutdown: streams.shutdown.clone(),
        _slot: slot,
    };
    Sse::new(subscriber.into_stream())
        .keep_alive(KeepAlive::new().interval(EVENT_KEEP_ALIVE_INTERVAL))
        .into_response()
}

/// 503 with `Retry-After: 1`.
fn unavailable(message: String) -> Response {
    let mut response = ApiError::unavailable(message).into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// One open stream: its cluster subscription and its slot under the limit, released when the
/// client goes away (the server drops the stream).
struct Subscriber {
    source: Arc<dyn DashboardSource>,
    self_address: Address,
    /// The state to send before any event: the subscription's, or a fresh one after a lag.
    first: Option<CurrentClusterState>,
    events: Receiver<ClusterEvent>,
    shutdown: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
}

impl Subscriber {
    fn into_stream(self) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
        futures::stream::unfold(self, |mut subscriber| async move {
            let event = subscriber.next().await?;
            Some((Ok(event), subscriber))
        })
    }

    /// The next event to send; None ends the stream (the node stops serving, or its cluster
    /// node stopped).
    async fn next(&mut self) -> Option<Event> {
        if let Some(state) = self.first.take() {
            return Some(current_state_event(&self.self_address, &state));
        }
        let received = tokio::select! {
            _ = self.shutdown.wait_for(|stop| *stop) => return None,
            received = self.events.recv() => received,
        };
        match received {
            Ok(event) => Some(cluster_event(&event)),
            Err(RecvError::Lagged(missed)) => {
                // The buffer dropped events for this subscriber: start over from the state
                // now rather than show a membership with changes missing.
                tracing::debug!(
                    missed,
                    "cluster event subscriber lagged; resending the state"
                );
                let (state, events) = self.resubscribe().await?;
                self.events = events;
                Some(current_state_event(&self.self_address, &state))
            }
            Err(RecvError::Closed) => None,
        }
    }

    async fn resubscribe(&self) -> Option<Subscription> {
        match self.source.subscribe().await {
            Ok(subscription) => Some(subscription),
            Err(e) => {
                tracing::debug!(error = %e, "cluster event subscriber cannot resubscribe");
                None
            }
        }
    }
}

/// The `current-state` event.
fn current_state_event(self_address: &Address, state: &CurrentClusterState) -> Event {
    named("current-state", &current_state_json(self_address, state))
}

/// The event for one cluster event.
fn cluster_event(event: &ClusterEvent) -> Event {
    let (name, data) = cluster_event_json(event);
    named(name, &data)
}

fn named(name: &'static str, data: &Value) -> Event {
    // Compact JSON has no line breaks, so the data is one `data:` line.
    Event::default().event(name).data(data.to_string())
}

/// `current-state`'s data.
pub(super) fn current_state_json(self_address: &Address, state: &CurrentClusterState) -> Value {
    json!({
        "self": self_address.to_string(),
        "members": state.members.iter().map(member_json).collect::<Vec<_>>(),
        "unreachable": state.unreachable.iter().map(unique_json).collect::<Vec<_>>(),
        "leader": leader_json(&state.leader),
    })
}

/// The name (Akka Management's, in kebab case) and data of one cluster event.
pub(super) fn cluster_event_json(event: &ClusterEvent) -> (&'static str, Value) {
    let member = |name, m: &Member| (name, json!({ "member": member_json(m) }));
    match event {
        ClusterEvent::MemberJoined(m) => member("member-joined", m),
        ClusterEvent::MemberWeaklyUp(m) => member("member-weakly-up", m),
        ClusterEvent::MemberUp(m) => member("member-up", m),
        ClusterEvent::MemberLeft(m) => member("member-left", m),
        ClusterEvent::MemberExited(m) => member("member-exited", m),
        ClusterEvent::MemberDowned(m) => member("member-downed", m),
        ClusterEvent::MemberRemoved {
            member,
            previous_status,
        } => (
            "member-removed",
            json!({
                "member": member_json(member),
                "previous_status": previous_status.as_str(),
            }),
        ),
        ClusterEvent::UnreachableMember(m) => member("unreachable-member", m),
        ClusterEvent::ReachableMember(m) => member("reachable-member", m),
        ClusterEvent::LeaderChanged(leader) => {
            ("leader-changed", json!({ "leader": leader_json(leader) }))
        }
    }
}

/// A member as `GET /cluster/members` shows it, without reachability (events carry it).
fn member_json(member: &Member) -> Value {
    json!({
        "address": member.address().to_string(),
        "uid": member.unique_address.uid,
        "status": member.status.as_str(),
        "roles": member.roles,
        "up_number": member.up_number,
    })
}

fn unique_json(node: &UniqueAddress) -> Value {
    json!({ "address": node.address.to_string(), "uid": node.uid })
}

fn leader_json(leader: &Option<UniqueAddress>) -> Value {
    leader
        .as_ref()
        .map_or(Value::Null, |l| Value::String(l.address.to_string()))
}
