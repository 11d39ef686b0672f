//! The transport-independent half of a node's transport: registered services, pending
//! requests, metrics, and what to do with a decoded frame. TCP and memory share it, which is
//! what makes their semantics the same.

use super::frame::{self, Frame, FrameError};
use super::metrics::TransportMetrics;
use super::{
    Inbound, Lane, Outbound, RequestError, Responder, SendError, ServiceId, TransportConfig,
    TransportError,
};
use crate::address::{Address, UniqueAddress};
use bytes::Bytes;
use std::collections::HashMap;
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
    pending: Mutex<HashMap<u64, oneshot::Sender<Bytes>>>,
    next_correlation_id: AtomicU64,
    max_pending_requests: usize,
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
            pending: Mutex::new(HashMap::new()),
            next_correlation_id: AtomicU64::new(1),
            max_pending_requests: config.max_pending_requests,
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
        services.insert(service, tx);
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
                    lane,
                    correlation_id,
                    outbound,
                }),
            }),
            Frame::Response {
                correlation_id,
                payload,
            } => self.complete(correlation_id, payload),
            other => return Err(FrameError::OutOfPlace { kind: other.kind() }),
        }
        Ok(())
    }

    /// Hands a message to its service without waiting: a full or missing queue drops it.
    fn deliver(&self, inbound: Inbound) {
        let services = lock(&self.services);
        let Some(queue) = services.get(&inbound.service) else {
            TransportMetrics::incr(&self.metrics.inbound_unknown_service);
            return;
        };
        match queue.try_send(inbound) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                TransportMetrics::incr(&self.metrics.inbound_dropped_queue_full);
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                TransportMetrics::incr(&self.metrics.inbound_unknown_service);
            }
        }
    }

    fn complete(&self, correlation_id: u64, payload: Bytes) {
        match self.take_pending(correlation_id) {
            // The requester may have given up between the lookup and now; that is fine.
            Some(waiter) => drop(waiter.send(payload)),
            None => TransportMetrics::incr(&self.metrics.responses_unmatched),
        }
    }

    fn take_pending(&self, correlation_id: u64) -> Option<oneshot::Sender<Bytes>> {
        let waiter = lock(&self.pending).remove(&correlation_id);
        if waiter.is_some() {
            TransportMetrics::decr(&self.metrics.requests_pending);
        }
        waiter
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
        let correlation_id = self.next_correlation_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = lock(&self.pending);
            if pending.len() >= self.max_pending_requests {
                return Err(RequestError::TooManyPending {
                    pending: pending.len(),
                    max_pending_requests: self.max_pending_requests,
                });
            }
            pending.insert(correlation_id, tx);
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
                Ok(Ok(payload)) => Ok(payload),
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
        lock(&self.services).clear();
        let dropped = std::mem::take(&mut *lock(&self.pending));
        for _ in 0..dropped.len() {
            TransportMetrics::decr(&self.metrics.requests_pending);
        }
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
