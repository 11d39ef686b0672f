//! The transport-independent half of a node's transport: registered services, pending
//! requests, metrics, and what to do with a decoded frame. TCP and memory share it, which is
//! what makes their semantics the same.

use super::frame::{self, Frame, FrameError};
use super::metrics::TransportMetrics;
use super::{
    Inbound, Lane, Outbound, RemoteError, RequestError, Responder, SendError, ServiceId,
    TransportConfig, TransportError,
};
use crate::address::{Address, UniqueAddress};
use bytes::Bytes;
use rand::RngCore;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Locks a mutex whose data stays consistent even if a holder panicked (every critical section
/// here is a single map operation), so poisoning is not a reason to fail.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) struct Endpoint {
    local: UniqueAddress,
    services: Mutex<HashMap<ServiceId, mpsc::Sender<Inbound>>>,
    pending: Mutex<PendingRequests>,
    correlation_ids: CorrelationIds,
    max_pending_requests: usize,
    max_pending_requests_per_peer: usize,
    max_frame_size_bytes: usize,
    pub(crate) metrics: TransportMetrics,
    /// Cancelled by `shutdown`; every task of the transport selects on it.
    pub(crate) shutdown: CancellationToken,
}

impl Endpoint {
    pub(crate) fn new(local: UniqueAddress, config: &TransportConfig) -> Self {
        Self {
            local,
            services: Mutex::new(HashMap::new()),
            pending: Mutex::new(PendingRequests::default()),
            correlation_ids: CorrelationIds::random(),
            max_pending_requests: config.max_pending_requests,
            max_pending_requests_per_peer: config.max_pending_requests_per_peer,
            max_frame_size_bytes: config.max_frame_size_bytes,
            metrics: TransportMetrics::default(),
            shutdown: CancellationToken::new(),
        }
    }

    pub(crate) fn local(&self) -> &UniqueAddress {
        &self.local
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    pub(crate) fn register(
        &self,
        service: ServiceId,
        queue_capacity: usize,
    ) -> Result<mpsc::Receiver<Inbound>, TransportError> {
        if self.is_closed() {
            return Err(TransportError::Closed {
                local: self.local.clone(),
            });
        }
        if queue_capacity == 0 {
            return Err(TransportError::ZeroQueueCapacity { service });
        }
        let mut services = lock(&self.services);
        // A service whose receiver was dropped has unregistered itself and may register again.
        if services.get(&service).is_some_and(|tx| !tx.is_closed()) {
            return Err(TransportError::AlreadyRegistered {
                service,
                local: self.local.clone(),
            });
        }
        let (tx, rx) = mpsc::channel(queue_capacity);
        let replaced = services.insert(service, tx);
        // Dropped outside the lock: a request left in the old queue answers `Dropped` as it goes,
        // and queueing that answer takes the peer-queue lock (see `deliver`).
        drop(services);
        drop(replaced);
        Ok(rx)
    }

    /// Encodes a frame for the wire, refusing frames the peer would refuse.
    pub(crate) fn encode(&self, frame: &Frame) -> Result<Bytes, SendError> {
        if self.is_closed() {
            return Err(SendError::Closed);
        }
        let bytes = frame::encode(frame).map_err(|e| SendError::Encode(e.to_string()))?;
        if bytes.len() > self.max_frame_size_bytes {
            return Err(SendError::FrameTooLarge {
                size_bytes: bytes.len(),
                max_frame_size_bytes: self.max_frame_size_bytes,
            });
        }
        Ok(bytes)
    }

    /// Counts a send dropped because the lane queue was full.
    pub(crate) fn queue_bytes_full(&self, to: &Address, lane: Lane, max_bytes: usize) -> SendError {
        TransportMetrics::incr(&self.metrics.send_dropped_queue_full);
        SendError::QueueBytesFull {
            to: to.clone(),
            lane,
            max_bytes,
        }
    }

    pub(crate) fn too_many_peers(&self, to: &Address, max_peers: usize) -> SendError {
        TransportMetrics::incr(&self.metrics.send_dropped_too_many_peers);
        SendError::TooManyPeers {
            to: to.clone(),
            max_peers,
        }
    }

    /// Records how many peers have outbound queues now.
    pub(crate) fn set_peers(&self, peers: usize) {
        self.metrics.peers.store(
            u64::try_from(peers).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    pub(crate) fn queue_full(&self, to: &Address, lane: Lane, capacity: usize) -> SendError {
        TransportMetrics::incr(&self.metrics.send_dropped_queue_full);
        SendError::QueueFull {
            to: to.clone(),
            lane,
            capacity,
        }
    }

    /// Handles one frame payload from an authenticated peer. An error means the peer broke the
    /// protocol and its connection should be closed.
    pub(crate) fn receive(
        &self,
        from: &UniqueAddress,
        payload: &[u8],
        outbound: Weak<dyn Outbound>,
    ) -> Result<(), FrameError> {
        if self.is_closed() {
            return Ok(());
        }
        TransportMetrics::incr(&self.metrics.frames_in);
        TransportMetrics::add(&self.metrics.bytes_in, payload.len());
        match frame::decode(payload)? {
            Frame::OneWay { service, payload } => self.deliver(Inbound {
                from: from.clone(),
                service,
                payload,
                reply: None,
            }),
            Frame::Request {
                service,
                lane,
                correlation_id,
                payload,
            } => self.deliver(Inbound {
                from: from.clone(),
                service,
                payload,
                reply: Some(Responder {
                    to: from.address.clone(),
                    service,
                    lane,
                    correlation_id,
                    outbound: Some(outbound),
                }),
            }),
            Frame::Response {
                correlation_id,
                payload,
            } => self.complete(from, correlation_id, Ok(payload)),
            Frame::ErrorResponse {
                correlation_id,
                error,
            } => self.complete(from, correlation_id, Err(error.bounded())),
            other => return Err(FrameError::OutOfPlace { kind: other.kind() }),
        }
        Ok(())
    }

    /// Hands a message to its service without waiting. A missing or full queue drops it and
    /// counts it; a request among those is answered at once with the reason, so the requester
    /// fails fast instead of waiting for its timeout.
    fn deliver(&self, inbound: Inbound) {
        let service = inbound.service;
        let refused = {
            let services = lock(&self.services);
            match services.get(&service) {
                None => Some((inbound, RemoteError::UnknownService { service })),
                Some(queue) => match queue.try_send(inbound) {
                    Ok(()) => None,
                    Err(mpsc::error::TrySendError::Full(inbound)) => {
                        let capacity = u64::try_from(queue.max_capacity()).unwrap_or(u64::MAX);
                        Some((inbound, RemoteError::Overloaded { service, capacity }))
                    }
                    // The service dropped its receiver: it is gone.
                    Err(mpsc::error::TrySendError::Closed(inbound)) => {
                        Some((inbound, RemoteError::UnknownService { service }))
                    }
                },
            }
        };
        let Some((inbound, error)) = refused else {
            return;
        };
        let counter = match error {
            RemoteError::Overloaded { .. } => &self.metrics.inbound_dropped_queue_full,
            _ => &self.metrics.inbound_unknown_service,
        };
        TransportMetrics::incr(counter);
        // Answered after the services lock is released: queueing the answer takes the
        // peer-queue lock, and shutdown takes the two in the other order.
        if let Some(reply) = inbound.reply {
            // Best effort, like every answer: if it is lost the requester times out.
            let _ = reply.respond_error(error);
        }
    }

    /// Hands an answer to the request `correlation_id` if `from` is the peer that request went
    /// to. An answer from any other peer is counted and leaves the request waiting for the
    /// asked peer, its timeout or shutdown.
    fn complete(&self, from: &UniqueAddress, correlation_id: u64, answer: Answer) {
        let waiter = {
            let mut pending = lock(&self.pending);
            match pending.by_id.entry(correlation_id) {
                Entry::Occupied(request) if request.get().to == from.address => {
                    let request = request.remove();
                    pending.forget_peer(&request.to);
                    TransportMetrics::decr(&self.metrics.requests_pending);
                    request.waiter
                }
                Entry::Occupied(_) => {
                    TransportMetrics::incr(&self.metrics.responses_wrong_peer);
                    return;
                }
                Entry::Vacant(_) => {
                    TransportMetrics::incr(&self.metrics.responses_unmatched);
                    return;
                }
            }
        };
        // The requester may have given up between the lookup and now; that is fine.
        drop(waiter.send(answer));
    }

    fn take_pending(&self, correlation_id: u64) -> Option<PendingRequest> {
        let mut pending = lock(&self.pending);
        let request = pending.by_id.remove(&correlation_id)?;
        pending.forget_peer(&request.to);
        TransportMetrics::decr(&self.metrics.requests_pending);
        Some(request)
    }

    /// The most requests waiting for answers from any one peer now (0 with none pending).
    pub(crate) fn pending_requests_max_per_peer(&self) -> usize {
        lock(&self.pending)
            .by_peer
            .values()
            .copied()
            .max()
            .unwrap_or(0)
    }

    /// Sends a request through `outbound` and waits for the matching response, the timeout or
    /// shutdown, whichever comes first. The pending entry is removed on every path, including
    /// when the caller drops this future.
    pub(crate) async fn request(
        &self,
        outbound: &dyn Outbound,
        to: &Address,
        service: ServiceId,
        lane: Lane,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, RequestError> {
        if self.is_closed() {
            return Err(SendError::Closed.into());
        }
        let correlation_id = self.correlation_ids.next();
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = lock(&self.pending);
            if pending.by_id.len() >= self.max_pending_requests {
                TransportMetrics::incr(&self.metrics.requests_refused_too_many_pending);
                return Err(RequestError::TooManyPending {
                    pending: pending.by_id.len(),
                    max_pending_requests: self.max_pending_requests,
                });
            }
            // Checked before the request is counted, so that one slow or paused peer can
            // hold at most its share of the table and requests to the others still go out.
            let for_peer = pending.by_peer.get(to).copied().unwrap_or(0);
            if for_peer >= self.max_pending_requests_per_peer {
                TransportMetrics::incr(&self.metrics.requests_refused_too_many_pending_for_peer);
                return Err(RequestError::TooManyPendingForPeer {
                    to: to.clone(),
                    pending: for_peer,
                    max_pending_requests_per_peer: self.max_pending_requests_per_peer,
                });
            }
            pending.insert(
                correlation_id,
                PendingRequest {
                    to: to.clone(),
                    waiter: tx,
                },
            );
            TransportMetrics::incr(&self.metrics.requests_pending);
        }
        let _cleanup = PendingGuard {
            endpoint: self,
            correlation_id,
        };
        let frame = Frame::Request {
            service,
            lane,
            correlation_id,
            payload,
        };
        outbound.enqueue(to, lane, &frame)?;
        tokio::select! {
            _ = self.shutdown.cancelled() => Err(RequestError::Closed { to: to.clone() }),
            answer = tokio::time::timeout(timeout, rx) => match answer {
                Ok(Ok(Ok(payload))) => Ok(payload),
                Ok(Ok(Err(error))) => Err(RequestError::Remote { to: to.clone(), service, error }),
                // The waiter was dropped without an answer: only `close` does that.
                Ok(Err(_)) => Err(RequestError::Closed { to: to.clone() }),
                Err(_elapsed) => {
                    TransportMetrics::incr(&self.metrics.request_timeouts);
                    Err(RequestError::Timeout {
                        to: to.clone(),
                        service,
                        timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                    })
                }
            },
        }
    }

    /// Stops the endpoint: tasks see the cancellation, services' receivers end, pending requests
    /// fail with `Closed`.
    pub(crate) fn close(&self) {
        self.shutdown.cancel();
        // Taken out before dropping, like in `register`; after the cancel above, the `Dropped`
        // answers of requests still queued are refused before any lock.
        let services = std::mem::take(&mut *lock(&self.services));
        drop(services);
        let dropped = std::mem::take(&mut *lock(&self.pending));
        for _ in 0..dropped.by_id.len() {
            TransportMetrics::decr(&self.metrics.requests_pending);
        }
    }
}

/// What the asked peer sent back: a response payload or an error answer.
type Answer = Result<Bytes, RemoteError>;

/// The requests waiting for answers, by correlation id, and how many of them each peer holds.
///
/// Invariant: `by_peer[a]` is the number of entries of `by_id` whose `to` is `a`, and a peer
/// with none has no entry, so `by_peer` never holds more entries than `by_id`.
#[derive(Default)]
struct PendingRequests {
    by_id: HashMap<u64, PendingRequest>,
    by_peer: HashMap<Address, usize>,
}

impl PendingRequests {
    fn insert(&mut self, correlation_id: u64, request: PendingRequest) {
        *self.by_peer.entry(request.to.clone()).or_insert(0) += 1;
        if let Some(replaced) = self.by_id.insert(correlation_id, request) {
            // Ids repeat only after 2^64 requests; keep the counts right anyway.
            self.forget_peer(&replaced.to);
        }
    }

    /// Counts one request to `to` as no longer pending.
    fn forget_peer(&mut self, to: &Address) {
        if let Some(count) = self.by_peer.get_mut(to) {
            *count -= 1;
            if *count == 0 {
                self.by_peer.remove(to);
            }
        }
    }
}

/// A request waiting for its answer.
struct PendingRequest {
    /// The peer the request went to: the only one whose answer completes it.
    to: Address,
    waiter: oneshot::Sender<Answer>,
}

/// The correlation ids of one endpoint: consecutive (wrapping) from a random start.
///
/// Invariant: ids are unique across incarnations, not just within one. A restarted node keeps
/// its address, so a late response meant for the previous incarnation reaches the new one; if
/// both counted from the same start, it would complete whichever new request drew the same id.
/// With a random 64-bit start per endpoint, two incarnations making `n` and `m` requests share
/// an id with probability about `(n + m) / 2^64`. Within one endpoint an id repeats only after
/// 2^64 requests.
struct CorrelationIds {
    next: AtomicU64,
}

impl CorrelationIds {
    /// Starts at a value from the OS-seeded thread RNG, not the injectable simulation RNG: a
    /// simulation that replays a seed for a restarted node must still get fresh ids, and ids
    /// only ever match answers to requests, they steer no protocol decision.
    fn random() -> Self {
        Self::starting_at(rand::rng().next_u64())
    }

    fn starting_at(start: u64) -> Self {
        Self {
            next: AtomicU64::new(start),
        }
    }

    /// The next id; after `u64::MAX` comes 0 (`fetch_add` wraps, it does not panic).
    fn next(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }
}

struct PendingGuard<'a> {
    endpoint: &'a Endpoint,
    correlation_id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.endpoint.take_pending(self.correlation_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn correlation_ids_wrap_around_without_panicking() {
        let ids = CorrelationIds::starting_at(u64::MAX - 1);
        let drawn: Vec<u64> = (0..4).map(|_| ids.next()).collect();
        assert_eq!(drawn, [u64::MAX - 1, u64::MAX, 0, 1]);
    }

    #[test]
    fn two_incarnations_at_one_address_draw_different_correlation_ids() {
        let address = Address::new("10.0.0.1", 1);
        let config = TransportConfig::default();
        let old = Endpoint::new(UniqueAddress::new(address.clone(), 1), &config);
        let new = Endpoint::new(UniqueAddress::new(address, 2), &config);
        // Counting from a fixed start would collide every time; random starts collide with
        // probability 2^-64.
        assert_ne!(old.correlation_ids.next(), new.correlation_ids.next());
    }
}
