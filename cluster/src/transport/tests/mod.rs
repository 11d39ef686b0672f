//! One behavioural test suite for every [`Transport`] implementation, written against a small
//! [`Harness`] that creates nodes, and instantiated by `transport_suite!` in `tcp.rs` and
//! `memory.rs` next to the tests only one implementation can run.
//!
//! Tests assert on what arrives and in which order, never on how long it took; every wait is
//! bounded by [`WAIT`] so a broken transport fails the test instead of hanging it.

mod memory;
mod tcp;

use super::frame::Frame;
use super::{
    Address, Inbound, Lane, Outbound, REJECTED_REASON_MAX_BYTES, RemoteError, RequestError,
    SendError, ServiceId, Transport, TransportConfig,
};
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::Receiver;

/// Upper bound for any single wait in a test.
pub(super) const WAIT: Duration = Duration::from_secs(10);

/// Request timeout far beyond [`WAIT`]: an answer within `WAIT` did not come from the timeout.
const LONG_TIMEOUT: Duration = Duration::from_secs(30);

const SERVICE: ServiceId = 100;
const ECHO: ServiceId = 101;

/// Creates nodes of one transport implementation.
pub(super) trait Harness {
    /// `Outbound` lets a test put any frame on the wire, as a confused or hostile peer would.
    type T: Transport + Outbound;
    /// A fresh node with a fresh address; `config`'s bind address is replaced.
    async fn node(&self, uid: u64, config: TransportConfig) -> Arc<Self::T>;
    /// Stops `old` and starts a new incarnation `uid` at the same address.
    async fn restart(&self, old: Arc<Self::T>, uid: u64) -> Arc<Self::T>;
}

/// Limits for tests: fast reconnects so a restarted peer is found quickly.
pub(super) fn test_config() -> TransportConfig {
    TransportConfig {
        connect_timeout: Duration::from_secs(2),
        handshake_timeout: Duration::from_secs(2),
        reconnect_backoff_min: Duration::from_millis(10),
        reconnect_backoff_max: Duration::from_millis(200),
        ..TransportConfig::default()
    }
}

pub(super) async fn recv(rx: &mut Receiver<Inbound>) -> Inbound {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("no message within WAIT")
        .expect("service queue closed")
}

/// Polls `condition` until it holds, failing the test after [`WAIT`].
pub(super) async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let polling = async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(WAIT, polling)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {WAIT:?}"));
}

fn n(i: u32) -> Bytes {
    Bytes::copy_from_slice(&i.to_be_bytes())
}

pub(super) fn text(s: &'static str) -> Bytes {
    Bytes::from_static(s.as_bytes())
}

/// Starts `from.request(to, service)` in a task, so the test can act while it is pending.
fn spawn_request<T: Transport>(
    from: &Arc<T>,
    to: &Address,
    service: ServiceId,
    payload: Bytes,
    timeout: Duration,
) -> tokio::task::JoinHandle<Result<Bytes, RequestError>> {
    let (from, to) = (Arc::clone(from), to.clone());
    tokio::spawn(async move {
        from.request(&to, service, Lane::Control, payload, timeout)
            .await
    })
}

/// The result of a request started with [`spawn_request`], failing the test after [`WAIT`].
async fn outcome(
    request: tokio::task::JoinHandle<Result<Bytes, RequestError>>,
) -> Result<Bytes, RequestError> {
    tokio::time::timeout(WAIT, request)
        .await
        .expect("request finished within WAIT")
        .expect("request task did not panic")
}

/// Answers every request on `service` with "re:" + payload, until the queue closes.
pub(super) fn spawn_echo(mut rx: Receiver<Inbound>) {
    tokio::spawn(async move {
        while let Some(inbound) = rx.recv().await {
            if let Some(reply) = inbound.reply {
                let mut answer = b"re:".to_vec();
                answer.extend_from_slice(&inbound.payload);
                let _ = reply.respond(Bytes::from(answer));
            }
        }
    });
}

pub(super) async fn one_way_messages_arrive_in_order_per_pair<H: Harness>(h: &H) {
    let a = h.node(1, test_config()).await;
    let b = h.node(2, test_config()).await;
    let mut rx = b.register(SERVICE, 2000).unwrap();
    const LANES: [Lane; 3] = [Lane::Bulk, Lane::Control, Lane::Quorum];
    let lane_of = |i: u32| LANES[i as usize % LANES.len()];
    for i in 0..1000 {
        // Rotate lanes but keep each lane's sequence: order is promised per lane.
        a.send(&b.local().address, SERVICE, lane_of(i), n(i))
            .unwrap();
    }
    let mut per_lane: [Vec<u32>; 3] = Default::default();
    for _ in 0..1000 {
        let inbound = recv(&mut rx).await;
        assert_eq!(&inbound.from, a.local());
        assert_eq!(inbound.service, SERVICE);
        assert!(inbound.reply.is_none());
        let i = u32::from_be_bytes(inbound.payload[..].try_into().unwrap());
        per_lane[i as usize % LANES.len()].push(i);
    }
    for (index, received) in per_lane.iter().enumerate() {
        let sent: Vec<u32> = (0..1000).filter(|i| *i as usize % 3 == index).collect();
        assert_eq!(received, &sent, "{:?} lane", LANES[index]);
    }
    let sent = a.metrics().snapshot();
    assert_eq!(sent.send_dropped_queue_full, 0);
    assert!(sent.frames_out >= 1000, "{sent:?}");
    assert_eq!(b.metrics().snapshot().frames_in, 1000);
}

pub(super) async fn request_gets_its_response<H: Harness>(h: &H) {
    let a = h.node(1, test_config()).await;
    let b = h.node(2, test_config()).await;
    spawn_echo(b.register(ECHO, 16).unwrap());
    for lane in [Lane::Control, Lane::Bulk, Lane::Quorum] {
        let answer = a
            .request(
                &b.local().address,
                ECHO,
                lane,
                Bytes::from_static(b"ping"),
                WAIT,
            )
            .await
            .unwrap();
        assert_eq!(&answer[..], b"re:ping");
    }
    assert_eq!(a.metrics().snapshot().requests_pending, 0);
}

pub(super) async fn request_to_silent_service_times_out_and_leaves_nothing_pending<H: Harness>(
    h: &H,
) {
    let a = h.node(1, test_config()).await;
    let b = h.node(2, test_config()).await;
    let mut silent = b.register(SERVICE, 16).unwrap();
    let to = b.local().address.clone();
    let err = a
        .request(
            &to,
            SERVICE,
            Lane::Control,
            Bytes::from_static(b"hello?"),
            Duration::from_millis(200),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        RequestError::Timeout {
            to,
            service: SERVICE,
            timeout_ms: 200
        }
    );
    let metrics = a.metrics().snapshot();
    assert_eq!(metrics.request_timeouts, 1);
    assert_eq!(metrics.requests_pending, 0);
    // An answer that comes after the timeout finds no waiter and is counted, not delivered.
    let late = recv(&mut silent).await;
    late.reply
        .expect("a request carries a responder")
        .respond(Bytes::from_static(b"too late"))
        .unwrap();
    eventually("late response counted", || {
        a.metrics().snapshot().responses_unmatched == 1
    })
    .await;
}

/// A peer that never answers holds at most `max_pending_requests_per_peer` of the pending
/// table: one more request to it is refused at once (typed, naming the peer and the limit,
/// counted), while requests to another peer still go out and are answered.
pub(super) async fn a_silent_peer_holds_at_most_its_share_of_pending_requests<H: Harness>(h: &H) {
    let config = TransportConfig {
        max_pending_requests: 4,
        max_pending_requests_per_peer: 2,
        ..test_config()
    };
    let a = h.node(1, config).await;
    let silent = h.node(2, test_config()).await;
    let echo = h.node(3, test_config()).await;
    let mut unanswered = silent.register(SERVICE, 16).unwrap();
    spawn_echo(echo.register(ECHO, 16).unwrap());
    let silent_address = silent.local().address.clone();
    let waiting: Vec<_> = (0..2)
        .map(|i| spawn_request(&a, &silent_address, SERVICE, n(i), LONG_TIMEOUT))
        .collect();
    // Both reached the silent service: they are pending, not refused.
    let held = [recv(&mut unanswered).await, recv(&mut unanswered).await];
    assert_eq!(a.metrics().snapshot().requests_pending, 2);
    let refused = a
        .request(&silent_address, SERVICE, Lane::Control, n(2), LONG_TIMEOUT)
        .await
        .unwrap_err();
    assert_eq!(
        refused,
        RequestError::TooManyPendingForPeer {
            to: silent_address.clone(),
            pending: 2,
            max_pending_requests_per_peer: 2,
        }
    );
    assert!(
        refused
            .to_string()
            .contains("max_pending_requests_per_peer=2")
    );
    let answer = a
        .request(
            &echo.local().address,
            ECHO,
            Lane::Control,
            text("still here"),
            LONG_TIMEOUT,
        )
        .await
        .expect("a request to another peer goes out");
    assert_eq!(&answer[..], b"re:still here");
    let metrics = a.metrics().snapshot();
    assert_eq!(metrics.requests_refused_too_many_pending_for_peer, 1);
    assert_eq!(metrics.requests_refused_too_many_pending, 0);
    // Answered, the silent peer's slots are free again.
    for inbound in held {
        inbound.reply.unwrap().respond(text("late")).unwrap();
    }
    for request in waiting {
        outcome(request).await.expect("answered");
    }
    assert_eq!(a.metrics().snapshot().requests_pending, 0);
    let mut echo_again = silent.register(ECHO, 16).unwrap();
    let again = spawn_request(&a, &silent_address, ECHO, n(3), LONG_TIMEOUT);
    recv(&mut echo_again)
        .await
        .reply
        .unwrap()
        .respond(text("ok"))
        .unwrap();
    assert_eq!(&outcome(again).await.unwrap()[..], b"ok");
}

pub(super) async fn message_for_unknown_service_is_counted<H: Harness>(h: &H) {
    let a = h.node(1, test_config()).await;
    let b = h.node(2, test_config()).await;
    let mut rx = b.register(SERVICE, 16).unwrap();
    let to = b.local().address.clone();
    a.send(&to, 999, Lane::Control, n(1)).unwrap();
    a.send(&to, SERVICE, Lane::Control, n(2)).unwrap();
    // Same lane, so the unknown-service message was handled before this one arrived.
    assert_eq!(recv(&mut rx).await.payload, n(2));
    assert_eq!(b.metrics().snapshot().inbound_unknown_service, 1);
    assert!(b.register(SERVICE, 16).is_err(), "registering twice");
}

pub(super) async fn full_outbound_queue_drops_and_counts<H: Harness>(h: &H) {
    let config = TransportConfig {
        control_queue_capacity: 8,
        ..test_config()
    };
    let a = h.node(1, config).await;
    let b = h.node(2, test_config()).await;
    let mut rx = b.register(SERVICE, 64).unwrap();
    let to = b.local().address.clone();
    // No await between sends: the writer cannot drain the queue meanwhile.
    let results: Vec<_> = (0..20)
        .map(|i| a.send(&to, SERVICE, Lane::Control, n(i)))
        .collect();
    assert!(results[..8].iter().all(Result::is_ok), "{results:?}");
    for result in &results[8..] {
        assert_eq!(
            result,
            &Err(SendError::QueueFull {
                to: to.clone(),
                lane: Lane::Control,
                capacity: 8
            })
        );
    }
    assert_eq!(a.metrics().snapshot().send_dropped_queue_full, 12);
    for i in 0..8 {
        assert_eq!(recv(&mut rx).await.payload, n(i));
    }
}

pub(super) async fn full_service_queue_drops_and_counts<H: Harness>(h: &H) {
    let a = h.node(1, test_config()).await;
    let b = h.node(2, test_config()).await;
    let mut rx = b.register(SERVICE, 2).unwrap();
    for i in 0..5 {
        a.send(&b.local().address, SERVICE, Lane::Control, n(i))
            .unwrap();
    }
    eventually("all five frames received", || {
        b.metrics().snapshot().frames_in == 5
    })
    .await;
    assert_eq!(b.metrics().snapshot().inbound_dropped_queue_full, 3);
    assert_eq!(recv(&mut rx).await.payload, n(0));
    assert_eq!(recv(&mut rx).await.payload, n(1));
}

pub(super) async fn oversize_payload_is_refused_at_send<H: Harness>(h: &H) {
    let config = TransportConfig {
        max_frame_size_bytes: 4096,
        ..test_config()
    };
    let a = h.node(1, config).await;
    let b = h.node(2, test_config()).await;
    let err = a
        .send(
            &b.local().address,
            SERVICE,
            Lane::Bulk,
            Bytes::from(vec![0u8; 5000]),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            SendError::FrameTooLarge {
                max_frame_size_bytes: 4096,
                ..
            }
        ),
        "{err}"
    );
}

pub(super) async fn control_message_overtakes_bulk_backlog<H: Harness>(h: &H) {
    const BULK: u32 = 2000;
    let a = h.node(1, test_config()).await;
    let b = h.node(2, test_config()).await;
    let mut rx = b.register(SERVICE, 4000).unwrap();
    let to = b.local().address.clone();
    // Warm up so the connection exists and the backlog below is the only thing queued.
    a.send(&to, SERVICE, Lane::Control, n(u32::MAX)).unwrap();
    assert_eq!(recv(&mut rx).await.payload, n(u32::MAX));

    for i in 0..BULK {
        a.send(&to, SERVICE, Lane::Bulk, n(i)).unwrap();
    }
    a.send(&to, SERVICE, Lane::Control, n(u32::MAX)).unwrap();
    let mut control_position = None;
    for position in 0..=BULK {
        if recv(&mut rx).await.payload == n(u32::MAX) {
            control_position = Some(position);
        }
    }
    // With a single FIFO the control message would be last (position BULK).
    let control_position = control_position.expect("control message arrived");
    assert!(
        control_position < BULK,
        "control message arrived at position {control_position}, after the whole bulk backlog"
    );
}

pub(super) async fn quorum_message_is_not_delayed_behind_bulk_backlog<H: Harness>(h: &H) {
    const BULK: u32 = 2000;
    const QUORUM: u32 = u32::MAX - 1;
    const CONTROL: u32 = u32::MAX;
    let a = h.node(1, test_config()).await;
    let b = h.node(2, test_config()).await;
    let mut rx = b.register(SERVICE, 4000).unwrap();
    let to = b.local().address.clone();
    // Warm up so the connection exists and the queues below hold everything there is to send.
    a.send(&to, SERVICE, Lane::Control, n(CONTROL)).unwrap();
    assert_eq!(recv(&mut rx).await.payload, n(CONTROL));

    // Queued without an await in between, so the peer's writer sees all of it at once: a bulk
    // backlog, then a quorum message, then a control message.
    for i in 0..BULK {
        a.send(&to, SERVICE, Lane::Bulk, n(i)).unwrap();
    }
    a.send(&to, SERVICE, Lane::Quorum, n(QUORUM)).unwrap();
    a.send(&to, SERVICE, Lane::Control, n(CONTROL)).unwrap();
    let mut arrived = Vec::new();
    for _ in 0..BULK + 2 {
        let payload = recv(&mut rx).await.payload;
        arrived.push(u32::from_be_bytes(payload[..].try_into().unwrap()));
    }
    // The writer takes control, then quorum, then bulk: neither of the two queued last waits
    // behind a single bulk frame, and the bulk backlog keeps its order.
    assert_eq!(arrived[..2], [CONTROL, QUORUM], "first arrivals");
    assert_eq!(arrived[2..], (0..BULK).collect::<Vec<_>>()[..]);
}

pub(super) async fn restarted_peer_is_reached_at_the_same_address<H: Harness>(h: &H) {
    let a = h.node(1, test_config()).await;
    spawn_echo(a.register(ECHO, 16).unwrap());
    let b = h.node(2, test_config()).await;
    let mut rx = b.register(SERVICE, 1024).unwrap();
    let to = b.local().address.clone();
    a.send(&to, SERVICE, Lane::Control, n(0)).unwrap();
    assert_eq!(recv(&mut rx).await.from, *a.local());

    let b2 = h.restart(b, 3).await;
    assert_eq!(b2.local().address, to);
    assert_eq!(b2.local().uid, 3);
    let mut rx2 = b2.register(SERVICE, 1024).unwrap();
    // Messages sent while the old connection is found dead and re-established may be lost
    // (at-most-once), so keep sending until one gets through.
    let reached = async {
        loop {
            let _ = a.send(&to, SERVICE, Lane::Control, n(1));
            if let Ok(Some(inbound)) =
                tokio::time::timeout(Duration::from_millis(20), rx2.recv()).await
            {
                return inbound;
            }
        }
    };
    let inbound = tokio::time::timeout(WAIT, reached)
        .await
        .expect("restarted peer reached");
    assert_eq!(inbound.from, *a.local());
    // And the new incarnation can talk back.
    let answer = b2
        .request(
            &a.local().address,
            ECHO,
            Lane::Control,
            Bytes::from_static(b"new"),
            WAIT,
        )
        .await
        .unwrap();
    assert_eq!(&answer[..], b"re:new");
}

pub(super) async fn shutdown_fails_pending_requests_with_closed<H: Harness>(h: &H) {
    let a = h.node(1, test_config()).await;
    let b = h.node(2, test_config()).await;
    let mut silent = b.register(SERVICE, 16).unwrap();
    let to = b.local().address.clone();
    let pending = tokio::spawn({
        let a = Arc::clone(&a);
        let to = to.clone();
        async move {
            a.request(&to, SERVICE, Lane::Control, Bytes::new(), WAIT)
                .await
        }
    });
    // The request reached b, so it is pending on a. Held, because dropping it would answer.
    let _unanswered = recv(&mut silent).await;
    a.shutdown();
    let result = tokio::time::timeout(WAIT, pending).await.unwrap().unwrap();
    assert_eq!(result, Err(RequestError::Closed { to: to.clone() }));
    assert_eq!(a.metrics().snapshot().requests_pending, 0);
    assert_eq!(
        a.send(&to, SERVICE, Lane::Control, Bytes::new()),
        Err(SendError::Closed)
    );
}

pub(super) async fn late_answer_for_a_previous_incarnation_does_not_complete_a_new_request<
    H: Harness,
>(
    h: &H,
) {
    let a = h.node(1, test_config()).await;
    let b = h.node(2, test_config()).await;
    let mut at_b = b.register(SERVICE, 16).unwrap();
    let to = b.local().address.clone();
    let old_request = spawn_request(&a, &to, SERVICE, text("old"), WAIT);
    let old = recv(&mut at_b).await;
    assert_eq!(old.from, *a.local());

    let a2 = h.restart(a, 3).await;
    assert!(
        matches!(outcome(old_request).await, Err(RequestError::Closed { .. })),
        "the old incarnation's request ends with its transport"
    );
    let new_request = spawn_request(&a2, &to, SERVICE, text("new"), WAIT);
    let new = recv(&mut at_b).await;
    assert_eq!(new.from, *a2.local());
    let (old_reply, new_reply) = (old.reply.unwrap(), new.reply.unwrap());
    assert_ne!(
        old_reply.correlation_id, new_reply.correlation_id,
        "two incarnations drew the same correlation id"
    );
    // Same lane, so the answer meant for the old incarnation reaches the new one first.
    old_reply.respond(text("for the old incarnation")).unwrap();
    new_reply.respond(text("for the new incarnation")).unwrap();
    assert_eq!(
        outcome(new_request).await,
        Ok(text("for the new incarnation"))
    );
    assert_eq!(a2.metrics().snapshot().responses_unmatched, 1);
}

pub(super) async fn answer_from_a_peer_that_was_not_asked_is_dropped_and_counted<H: Harness>(
    h: &H,
) {
    let a = h.node(1, test_config()).await;
    let b = h.node(2, test_config()).await;
    let c = h.node(3, test_config()).await;
    let mut at_b = b.register(SERVICE, 16).unwrap();
    let request = spawn_request(&a, &b.local().address, SERVICE, text("question"), WAIT);
    let reply = recv(&mut at_b).await.reply.unwrap();
    // c answers a's request to b with the right correlation id, before b does, both ways.
    let forged = [
        Frame::Response {
            correlation_id: reply.correlation_id,
            payload: text("forged"),
        },
        Frame::ErrorResponse {
            correlation_id: reply.correlation_id,
            error: RemoteError::Rejected {
                reason: "forged".to_string(),
            },
        },
    ];
    for frame in &forged {
        c.enqueue(&a.local().address, Lane::Control, frame).unwrap();
    }
    eventually("answers from c counted", || {
        a.metrics().snapshot().responses_wrong_peer == 2
    })
    .await;
    assert!(!request.is_finished(), "c's answer completed the request");
    assert_eq!(a.metrics().snapshot().requests_pending, 1);

    reply.respond(text("genuine")).unwrap();
    assert_eq!(outcome(request).await, Ok(text("genuine")));
    let metrics = a.metrics().snapshot();
    assert_eq!(metrics.responses_wrong_peer, 2);
    assert_eq!(metrics.responses_unmatched, 0);
    assert_eq!(metrics.requests_pending, 0);
}

pub(super) async fn request_to_unknown_service_fails_fast_with_unknown_service<H: Harness>(h: &H) {
    let a = h.node(1, test_config()).await;
    let b = h.node(2, test_config()).await;
    let to = b.local().address.clone();
    let err = outcome(spawn_request(&a, &to, 999, text("anyone?"), LONG_TIMEOUT))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("service 999 at {to} answered with an error: no service 999 is registered there")
    );
    assert_eq!(
        err,
        RequestError::Remote {
            to,
            service: 999,
            error: RemoteError::UnknownService { service: 999 }
        }
    );
    assert_eq!(b.metrics().snapshot().inbound_unknown_service, 1);
    assert_eq!(a.metrics().snapshot().requests_pending, 0);
}

pub(super) async fn request_to_full_service_queue_fails_fast_with_overloaded<H: Harness>(h: &H) {
    let a = h.node(1, test_config()).await;
    let b = h.node(2, test_config()).await;
    let mut at_b = b.register(SERVICE, 1).unwrap();
    let to = b.local().address.clone();
    let first = spawn_request(&a, &to, SERVICE, text("first"), LONG_TIMEOUT);
    eventually("first request queued at b", || {
        b.metrics().snapshot().frames_in == 1
    })
    .await;
    let second = spawn_request(&a, &to, SERVICE, text("second"), LONG_TIMEOUT);
    assert_eq!(
        outcome(second).await,
        Err(RequestError::Remote {
            to,
            service: SERVICE,
            error: RemoteError::Overloaded {
                service: SERVICE,
                capacity: 1
            }
        })
    );
    assert_eq!(b.metrics().snapshot().inbound_dropped_queue_full, 1);
    // The queued request is still served.
    let queued = recv(&mut at_b).await;
    assert_eq!(queued.payload, text("first"));
    queued.reply.unwrap().respond(text("served")).unwrap();
    assert_eq!(outcome(first).await, Ok(text("served")));
}

pub(super) async fn request_dropped_by_its_service_fails_fast_with_dropped<H: Harness>(h: &H) {
    let a = h.node(1, test_config()).await;
    let b = h.node(2, test_config()).await;
    let to = b.local().address.clone();
    let dropped = RequestError::Remote {
        to: to.clone(),
        service: SERVICE,
        error: RemoteError::Dropped { service: SERVICE },
    };
    // A service that reads the request and drops it.
    let mut at_b = b.register(SERVICE, 16).unwrap();
    let request = spawn_request(&a, &to, SERVICE, text("one"), LONG_TIMEOUT);
    drop(recv(&mut at_b).await);
    assert_eq!(outcome(request).await, Err(dropped.clone()));
    // A service that stops with the request still in its queue.
    let request = spawn_request(&a, &to, SERVICE, text("two"), LONG_TIMEOUT);
    eventually("second request queued at b", || {
        b.metrics().snapshot().frames_in == 2
    })
    .await;
    drop(at_b);
    assert_eq!(outcome(request).await, Err(dropped));
}

pub(super) async fn respond_error_reaches_the_requester_unchanged<H: Harness>(h: &H) {
    let a = h.node(1, test_config()).await;
    let b = h.node(2, test_config()).await;
    let mut at_b = b.register(SERVICE, 16).unwrap();
    let to = b.local().address.clone();
    let request = spawn_request(&a, &to, SERVICE, text("append"), LONG_TIMEOUT);
    let refusal = RemoteError::Rejected {
        reason: "not the leader of epoch 7".to_string(),
    };
    recv(&mut at_b)
        .await
        .reply
        .unwrap()
        .respond_error(refusal.clone())
        .unwrap();
    let err = outcome(request).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "service {SERVICE} at {to} answered with an error: rejected: \"not the leader of epoch 7\""
        )
    );
    assert_eq!(
        err,
        RequestError::Remote {
            to: to.clone(),
            service: SERVICE,
            error: refusal
        }
    );
    // One answer only: a second one for the same request would come back on the same lane
    // before the next request's answer, and be counted as unmatched.
    let next = spawn_request(&a, &to, SERVICE, text("next"), LONG_TIMEOUT);
    let reply = recv(&mut at_b).await.reply.unwrap();
    reply.respond(text("ok")).unwrap();
    assert_eq!(outcome(next).await, Ok(text("ok")));
    assert_eq!(a.metrics().snapshot().responses_unmatched, 0);
}

pub(super) async fn over_long_rejected_reason_reaches_the_requester_cut_at_a_character_boundary<
    H: Harness,
>(
    h: &H,
) {
    let a = h.node(1, test_config()).await;
    let b = h.node(2, test_config()).await;
    let mut at_b = b.register(SERVICE, 16).unwrap();
    let to = b.local().address.clone();
    // Two-byte characters, so the limit falls inside one unless cut at a character boundary.
    let long = "é".repeat(REJECTED_REASON_MAX_BYTES);
    let cut = RemoteError::Rejected {
        reason: "é".repeat(REJECTED_REASON_MAX_BYTES / 2),
    };
    let remote = |error| RequestError::Remote {
        to: to.clone(),
        service: SERVICE,
        error,
    };

    let request = spawn_request(&a, &to, SERVICE, text("one"), LONG_TIMEOUT);
    let reply = recv(&mut at_b).await.reply.unwrap();
    reply
        .respond_error(RemoteError::Rejected {
            reason: format!("x{long}"),
        })
        .unwrap();
    let odd_cut = RemoteError::Rejected {
        reason: format!("x{}", "é".repeat(REJECTED_REASON_MAX_BYTES / 2 - 1)),
    };
    assert_eq!(outcome(request).await, Err(remote(odd_cut)));

    // A peer that skips `respond_error` and puts a long reason on the wire itself.
    let request = spawn_request(&a, &to, SERVICE, text("two"), LONG_TIMEOUT);
    let reply = recv(&mut at_b).await.reply.unwrap();
    let unbounded = Frame::ErrorResponse {
        correlation_id: reply.correlation_id,
        error: RemoteError::Rejected {
            reason: long.clone(),
        },
    };
    b.enqueue(&a.local().address, Lane::Control, &unbounded)
        .unwrap();
    assert_eq!(outcome(request).await, Err(remote(cut)));
}

pub(super) async fn answer_too_large_to_send_reaches_the_requester_as_dropped<H: Harness>(h: &H) {
    let a = h.node(1, test_config()).await;
    let config = TransportConfig {
        max_frame_size_bytes: 4096,
        ..test_config()
    };
    let b = h.node(2, config).await;
    let mut at_b = b.register(SERVICE, 16).unwrap();
    let to = b.local().address.clone();
    let request = spawn_request(&a, &to, SERVICE, text("everything"), LONG_TIMEOUT);
    let reply = recv(&mut at_b).await.reply.unwrap();
    let refused = reply.respond(Bytes::from(vec![0u8; 5000]));
    assert!(
        matches!(refused, Err(SendError::FrameTooLarge { .. })),
        "{refused:?}"
    );
    assert_eq!(
        outcome(request).await,
        Err(RequestError::Remote {
            to,
            service: SERVICE,
            error: RemoteError::Dropped { service: SERVICE }
        })
    );
}

/// Instantiates every suite test for one harness expression (evaluated once per test).
macro_rules! transport_suite {
    ($harness:expr) => {
        transport_suite!(@tests $harness;
            one_way_messages_arrive_in_order_per_pair,
            request_gets_its_response,
            request_to_silent_service_times_out_and_leaves_nothing_pending,
            message_for_unknown_service_is_counted,
            full_outbound_queue_drops_and_counts,
            full_service_queue_drops_and_counts,
            oversize_payload_is_refused_at_send,
            control_message_overtakes_bulk_backlog,
            quorum_message_is_not_delayed_behind_bulk_backlog,
            restarted_peer_is_reached_at_the_same_address,
            shutdown_fails_pending_requests_with_closed,
            late_answer_for_a_previous_incarnation_does_not_complete_a_new_request,
            answer_from_a_peer_that_was_not_asked_is_dropped_and_counted,
            request_to_unknown_service_fails_fast_with_unknown_service,
            request_to_full_service_queue_fails_fast_with_overloaded,
            request_dropped_by_its_service_fails_fast_with_dropped,
            respond_error_reaches_the_requester_unchanged,
            over_long_rejected_reason_reaches_the_requester_cut_at_a_character_boundary,
            answer_too_large_to_send_reaches_the_requester_as_dropped,
            a_silent_peer_holds_at_most_its_share_of_pending_requests,
        );
    };
    (@tests $harness:expr; $($name:ident),+ $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                super::$name(&$harness).await;
            }
        )+
    };
}
use transport_suite;
