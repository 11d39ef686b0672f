//! An in-process network of transports with injectable link faults, for deterministic tests.
//!
//! Each [`MemoryTransport`] behaves like the TCP one — bounded lane queues per peer drained in
//! lane order (control, quorum, bulk) by one task per directed link, frames encoded and size-checked, the
//! same service dispatch and request handling — but delivery is a function call into the
//! receiving transport. The fault for each message is decided when it is sent, by
//! [`LinkFaults`]; a delay is applied by the link task, which keeps the link's order.

use super::endpoint::{Endpoint, lock};
use super::frame::Frame;
use super::lanes::{LaneReceivers, PeerQueues};
use super::link_faults::{InvalidProbability, LinkDecision, LinkFaults};
use super::metrics::TransportMetrics;
use super::{
    Inbound, Lane, Outbound, RequestError, SendError, ServiceId, Transport, TransportConfig,
    TransportError,
};
use crate::address::{Address, UniqueAddress};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::warn;

/// The shared medium: which transport is bound at which address, and the link faults.
pub struct MemoryNetwork {
    state: Mutex<NetworkState>,
}

struct NetworkState {
    endpoints: HashMap<Address, Arc<MemoryTransport>>,
    faults: LinkFaults,
    tap: Option<FrameTap>,
}

/// Sees every frame a transport of the network sends (that the link faults let through), with
/// its sender and destination: for tests that check what crosses between nodes.
pub type FrameTap = Arc<dyn Fn(&UniqueAddress, &Address, &Frame) + Send + Sync>;

impl MemoryNetwork {
    /// A network with healthy links whose random drops are reproducible from `seed`.
    pub fn new(seed: u64) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(NetworkState {
                endpoints: HashMap::new(),
                faults: LinkFaults::new(seed),
                tap: None,
            }),
        })
    }

    /// Binds a node incarnation at `address` with default limits. Must be called inside a
    /// tokio runtime (the transport spawns its link tasks there).
    pub fn bind(
        self: &Arc<Self>,
        uid: u64,
        address: Address,
    ) -> Result<Arc<MemoryTransport>, TransportError> {
        self.bind_with_config(uid, address, TransportConfig::default())
    }

    /// Like [`MemoryNetwork::bind`] with explicit queue, frame and request limits (socket
    /// settings are ignored). Fails if a live transport is bound at `address`; after `crash` or
    /// `shutdown` the address can be bound again by a new incarnation.
    pub fn bind_with_config(
        self: &Arc<Self>,
        uid: u64,
        address: Address,
        config: TransportConfig,
    ) -> Result<Arc<MemoryTransport>, TransportError> {
        config.validate()?;
        let runtime = Handle::try_current().map_err(|_| TransportError::NoRuntime)?;
        let mut state = lock(&self.state);
        if state.endpoints.contains_key(&address) {
            return Err(TransportError::AddressInUse { address });
        }
        let local = UniqueAddress::new(address.clone(), uid);
        let transport = Arc::new_cyclic(|me| MemoryTransport {
            endpoint: Endpoint::new(local, &config),
            network: Arc::downgrade(self),
            links: PeerQueues::new(&config),
            runtime,
            me: me.clone(),
        });
        state.endpoints.insert(address, Arc::clone(&transport));
        Ok(transport)
    }

    /// Stops the node at `address` as if its process died: it neither sends nor receives, its
    /// pending requests fail, and the address is free for a restarted incarnation.
    pub fn crash(&self, address: &Address) {
        let crashed = lock(&self.state).endpoints.remove(address);
        if let Some(transport) = crashed {
            transport.stop();
        }
    }

    /// Cuts both directions between `a` and `b`.
    pub fn partition(&self, a: &Address, b: &Address) {
        lock(&self.state).faults.partition(a, b);
    }

    /// Cuts only `from` → `to`.
    pub fn partition_one_way(&self, from: &Address, to: &Address) {
        lock(&self.state).faults.partition_one_way(from, to);
    }

    /// Restores both directions between `a` and `b` (no cut, drops or delay).
    pub fn heal(&self, a: &Address, b: &Address) {
        lock(&self.state).faults.heal(a, b);
    }

    /// Restores every link.
    pub fn heal_all(&self) {
        lock(&self.state).faults.heal_all();
    }

    /// Loses each message on `from` → `to` with probability `probability` (0.0..=1.0).
    pub fn set_drop_probability(
        &self,
        from: &Address,
        to: &Address,
        probability: f64,
    ) -> Result<(), InvalidProbability> {
        lock(&self.state)
            .faults
            .set_drop_probability(from, to, probability)
    }

    /// Delays every message on `from` → `to` by `delay`.
    pub fn set_delay(&self, from: &Address, to: &Address, delay: Duration) {
        lock(&self.state).faults.set_delay(from, to, delay);
    }

    /// Shows every frame sent from now on to `tap` (None: to nobody).
    pub fn set_tap(&self, tap: Option<FrameTap>) {
        lock(&self.state).tap = tap;
    }

    /// The link's fate for the next message, and the tap to show it to.
    fn decide(&self, from: &Address, to: &Address) -> (LinkDecision, Option<FrameTap>) {
        let mut state = lock(&self.state);
        (state.faults.decide(from, to), state.tap.clone())
    }

    fn lookup(&self, address: &Address) -> Option<Arc<MemoryTransport>> {
        lock(&self.state).endpoints.get(address).cloned()
    }

    /// Frees `address` if `transport` is the one bound there (a newer incarnation stays).
    fn unbind(&self, transport: &MemoryTransport) {
        let mut state = lock(&self.state);
        let address = &transport.endpoint.local().address;
        if state
            .endpoints
            .get(address)
            .is_some_and(|bound| std::ptr::eq(Arc::as_ptr(bound), transport))
        {
            state.endpoints.remove(address);
        }
    }
}

/// A message accepted by the link, waiting for its delivery time.
struct Queued {
    payload: Bytes,
    deliver_at: Option<Instant>,
}

/// One node's transport on a [`MemoryNetwork`].
pub struct MemoryTransport {
    endpoint: Endpoint,
    network: Weak<MemoryNetwork>,
    /// Outbound lane queues per destination address, each drained by one link task.
    links: PeerQueues<Queued>,
    runtime: Handle,
    me: Weak<MemoryTransport>,
}

impl MemoryTransport {
    fn stop(&self) {
        self.links.close(&self.endpoint);
    }

    /// Moves frames from this node to `to` in lane order, honouring each frame's delay. The
    /// receiver is looked up per frame, so a restarted incarnation at `to` gets later frames.
    async fn run_link(self: Arc<Self>, to: Address, mut queues: LaneReceivers<Queued>) {
        let shutdown = self.endpoint.shutdown.clone();
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return,
                next = queues.recv() => next,
            };
            let Some(Queued {
                payload,
                deliver_at,
            }) = next
            else {
                return;
            };
            if let Some(deliver_at) = deliver_at {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep_until(deliver_at) => {}
                }
            }
            let Some(network) = self.network.upgrade() else {
                return;
            };
            TransportMetrics::incr(&self.endpoint.metrics.frames_out);
            TransportMetrics::add(&self.endpoint.metrics.bytes_out, payload.len());
            // Nobody bound at `to` (crashed, not started): the frame is lost, as on a socket.
            if let Some(receiver) = network.lookup(&to) {
                receiver.receive(self.endpoint.local(), &payload);
            }
        }
    }

    fn receive(&self, from: &UniqueAddress, payload: &[u8]) {
        let outbound: Weak<dyn Outbound> = self.me.clone();
        if let Err(e) = self.endpoint.receive(from, payload, outbound) {
            // Only a bug can produce this here (frames are encoded by our own code), but it is
            // counted like on TCP so tests see it.
            TransportMetrics::incr(&self.endpoint.metrics.connections_refused_malformed);
            warn!(local = %self.endpoint.local(), %from, error = %e, "dropping undecodable frame");
        }
    }
}

impl Outbound for MemoryTransport {
    fn enqueue(&self, to: &Address, lane: Lane, frame: &Frame) -> Result<(), SendError> {
        let payload = self.endpoint.encode(frame)?;
        let network = self.network.upgrade().ok_or(SendError::Closed)?;
        let (decision, tap) = network.decide(&self.endpoint.local().address, to);
        if let (Some(tap), false) = (tap, matches!(decision, LinkDecision::Drop)) {
            tap(self.endpoint.local(), to, frame);
        }
        let deliver_at = match decision {
            // Lost on the wire: the sender cannot tell (at-most-once).
            LinkDecision::Drop => return Ok(()),
            LinkDecision::Deliver { delay } if delay.is_zero() => None,
            LinkDecision::Deliver { delay } => Some(Instant::now() + delay),
        };
        let size_bytes = payload.len();
        let queued = Queued {
            payload,
            deliver_at,
        };
        self.links
            .try_send(&self.endpoint, to, lane, queued, size_bytes, |queues| {
                if let Some(me) = self.me.upgrade() {
                    self.runtime.spawn(me.run_link(to.clone(), queues));
                }
            })
    }
}

impl Transport for MemoryTransport {
    fn local(&self) -> &UniqueAddress {
        self.endpoint.local()
    }

    fn register(
        &self,
        service: ServiceId,
        queue_capacity: usize,
    ) -> Result<mpsc::Receiver<Inbound>, TransportError> {
        self.endpoint.register(service, queue_capacity)
    }

    fn send(
        &self,
        to: &Address,
        service: ServiceId,
        lane: Lane,
        payload: Bytes,
    ) -> Result<(), SendError> {
        self.enqueue(to, lane, &Frame::OneWay { service, payload })
    }

    async fn request(
        &self,
        to: &Address,
        service: ServiceId,
        lane: Lane,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, RequestError> {
        self.endpoint
            .request(self, to, service, lane, payload, timeout)
            .await
    }

    fn metrics(&self) -> &TransportMetrics {
        &self.endpoint.metrics
    }

    fn shutdown(&self) {
        self.stop();
        if let Some(network) = self.network.upgrade() {
            network.unbind(self);
        }
    }
}
