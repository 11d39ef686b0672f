//! The TCP transport: a listener that authenticates and reads inbound connections, and one
//! writer task per peer that owns the outbound connection to it.
//!
//! Connections carry traffic one way: the connecting side writes, the accepting side reads.
//! Each node therefore has at most one outbound connection per peer, and a response travels back
//! over the responder's own outbound connection to the requester. The writer reads its
//! connection only to notice that the peer closed it (e.g. restarted), and then reconnects with
//! exponential backoff while new messages wait in the bounded lane queues.

use super::endpoint::Endpoint;
use super::frame::{self, Frame, FrameCodec, FrameError, HANDSHAKE_MAX_FRAME_BYTES, Nonce};
use super::handshake::{Acceptor, Connector, HandshakeError, SecretKey};
use super::lanes::{LaneReceivers, PeerQueues};
use super::metrics::TransportMetrics;
use super::{
    Inbound, Lane, Outbound, RequestError, SendError, ServiceId, Transport, TransportConfig,
    TransportError,
};
use crate::address::{Address, UniqueAddress};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use rand::RngCore;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::codec::Framed;
use tracing::{debug, warn};

/// Frames written before one flush: batches syscalls under load, bounds the time a control or
/// quorum message waits behind frames already taken from the queues.
const WRITE_BATCH_FRAMES_MAX: usize = 64;

/// Pause after a failed `accept` (e.g. out of file descriptors) before trying again.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

type Connection = Framed<TcpStream, FrameCodec>;

/// Why a connection was closed before or during use; decides which counter goes up.
#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("{0}")]
    Handshake(#[from] HandshakeError),
    /// Before authentication every framing error, even an oversize length, means the peer is
    /// not speaking our protocol.
    #[error("during handshake: {0}")]
    HandshakeFrame(FrameError),
    #[error("connection closed by peer during the handshake")]
    ClosedDuringHandshake,
    #[error("connect did not complete within connect_timeout={0:?}")]
    ConnectTimeout(Duration),
    #[error("handshake did not complete within handshake_timeout={0:?}")]
    HandshakeTimeout(Duration),
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

impl ConnectionError {
    /// Counts the refusal by reason; returns true when the peer misbehaved (worth a warning)
    /// rather than the network failing.
    fn count_refusal(&self, metrics: &TransportMetrics) -> bool {
        let counter = match self {
            ConnectionError::Handshake(e) if e.is_auth_failure() => {
                &metrics.connections_refused_auth
            }
            ConnectionError::Handshake(_) => &metrics.connections_refused_malformed,
            ConnectionError::Frame(FrameError::TooLarge { .. }) => {
                &metrics.connections_refused_oversize
            }
            ConnectionError::Frame(e) | ConnectionError::HandshakeFrame(e)
                if e.is_protocol_violation() =>
            {
                &metrics.connections_refused_malformed
            }
            ConnectionError::HandshakeTimeout(_) => &metrics.handshake_timeouts,
            _ => return false,
        };
        TransportMetrics::incr(counter);
        true
    }
}

/// The production transport over TCP. Create it with [`TcpTransport::bind`]; stop it with
/// [`Transport::shutdown`] (its tasks hold it alive until then).
pub struct TcpTransport {
    endpoint: Endpoint,
    config: TransportConfig,
    key: SecretKey,
    /// Outbound lane queues per peer, each drained by that peer's writer task.
    peers: PeerQueues<Bytes>,
    runtime: Handle,
    me: Weak<TcpTransport>,
}

impl TcpTransport {
    /// Binds the listener, then forms this incarnation's [`UniqueAddress`] from the port actually
    /// bound (so port 0 works) and `uid`, and starts accepting connections.
    pub async fn bind(config: TransportConfig, uid: u64) -> Result<Arc<Self>, TransportError> {
        config.validate()?;
        let bind_error = |source| TransportError::Bind {
            address: config.bind_address.clone(),
            source,
        };
        let listener =
            TcpListener::bind((config.bind_address.host.as_str(), config.bind_address.port))
                .await
                .map_err(bind_error)?;
        let port = listener.local_addr().map_err(bind_error)?.port();
        let host = config
            .advertised_host
            .as_deref()
            .map_or_else(|| config.bind_address.host.clone(), Into::into);
        let local = UniqueAddress::new(Address::new(host, port), uid);
        let transport = Arc::new_cyclic(|me| TcpTransport {
            endpoint: Endpoint::new(local, &config),
            key: SecretKey::derive(config.cluster_secret.as_deref()),
            peers: PeerQueues::new(&config),
            config,
            runtime: Handle::current(),
            me: me.clone(),
        });
        transport
            .runtime
            .spawn(Arc::clone(&transport).accept_loop(listener));
        Ok(transport)
    }

    fn outbound(&self) -> Weak<dyn Outbound> {
        self.me.clone()
    }

    /// The most requests waiting for answers from any one peer now: at most
    /// `max_pending_requests_per_peer` (for `/metrics`).
    pub fn pending_requests_max_per_peer(&self) -> usize {
        self.endpoint.pending_requests_max_per_peer()
    }

    /// Accepts connections while fewer than `max_inbound_connections` are being served, like
    /// mini-redis: the permit travels with the connection's task and is released when it ends.
    /// Of those, at most `max_inbound_handshakes` may be in their handshake: a connection
    /// beyond that is closed as soon as it is accepted (and counted), so that clients without
    /// the secret, however many connections they open, hold a bounded number of tasks and
    /// buffers for at most `handshake_timeout` each, and leave the remaining slots to
    /// authenticated peers.
    async fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        let limit = Arc::new(Semaphore::new(self.config.max_inbound_connections));
        let handshakes = Arc::new(Semaphore::new(self.config.max_inbound_handshakes));
        let shutdown = self.endpoint.shutdown.clone();
        loop {
            let permit = tokio::select! {
                _ = shutdown.cancelled() => return,
                permit = Arc::clone(&limit).acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_closed) => return,
                },
            };
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok((stream, peer_socket)) => {
                    let Ok(handshake) = Arc::clone(&handshakes).try_acquire_owned() else {
                        TransportMetrics::incr(
                            &self
                                .endpoint
                                .metrics
                                .connections_refused_too_many_handshakes,
                        );
                        debug!(local = %self.endpoint.local(), peer = %peer_socket,
                            "too many inbound handshakes; connection closed");
                        continue;
                    };
                    let transport = Arc::clone(&self);
                    self.runtime.spawn(async move {
                        let metrics = &transport.endpoint.metrics;
                        TransportMetrics::incr(&metrics.inbound_connections);
                        transport
                            .serve_inbound(
                                stream,
                                peer_socket,
                                Handshaking::new(handshake, metrics),
                            )
                            .await;
                        TransportMetrics::decr(&metrics.inbound_connections);
                        drop(permit);
                    });
                }
                Err(e) => {
                    warn!(local = %self.endpoint.local(), error = %e, "accept failed; pausing");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => {}
                    }
                }
            }
        }
    }

    /// Authenticates one inbound connection, then reads and dispatches its frames until it
    /// closes, breaks the protocol, or the transport shuts down.
    async fn serve_inbound(
        &self,
        stream: TcpStream,
        peer_socket: SocketAddr,
        handshaking: Handshaking<'_>,
    ) {
        let shutdown = self.endpoint.shutdown.clone();
        let result = tokio::select! {
            _ = shutdown.cancelled() => return,
            result = self.read_inbound(stream, handshaking) => result,
        };
        if let Err(e) = result {
            if e.count_refusal(&self.endpoint.metrics) {
                warn!(local = %self.endpoint.local(), peer = %peer_socket, error = %e,
                    "closing inbound connection");
            } else {
                debug!(local = %self.endpoint.local(), peer = %peer_socket, error = %e,
                    "inbound connection ended");
            }
        }
    }

    async fn read_inbound(
        &self,
        stream: TcpStream,
        handshaking: Handshaking<'_>,
    ) -> Result<(), ConnectionError> {
        stream.set_nodelay(true)?;
        let mut connection = Framed::new(stream, FrameCodec::new(HANDSHAKE_MAX_FRAME_BYTES));
        let timeout = self.config.handshake_timeout;
        let handshake = tokio::time::timeout(timeout, self.accept_handshake(&mut connection)).await;
        // The handshake slot is free again whatever the outcome.
        drop(handshaking);
        let peer = handshake.map_err(|_| ConnectionError::HandshakeTimeout(timeout))??;
        TransportMetrics::incr(&self.endpoint.metrics.connections_accepted);
        connection
            .codec_mut()
            .set_max_frame_size_bytes(self.config.max_frame_size_bytes);
        while let Some(payload) = connection.next().await {
            self.endpoint.receive(&peer, &payload?, self.outbound())?;
        }
        Ok(())
    }

    async fn accept_handshake(
        &self,
        connection: &mut Connection,
    ) -> Result<UniqueAddress, ConnectionError> {
        let acceptor = Acceptor::new(self.key.clone(), self.endpoint.local().clone(), nonce());
        connection.send(frame::encode(&acceptor.hello())?).await?;
        let init = read_frame(connection).await?;
        let (peer, accept) = acceptor.on_init(init)?;
        connection.send(frame::encode(&accept)?).await?;
        Ok(peer)
    }

    /// Connects to `peer` and runs the connecting side of the handshake.
    async fn connect(&self, peer: &Address) -> Result<Connection, ConnectionError> {
        let connect_timeout = self.config.connect_timeout;
        let stream = tokio::time::timeout(
            connect_timeout,
            TcpStream::connect((peer.host.as_str(), peer.port)),
        )
        .await
        .map_err(|_| ConnectionError::ConnectTimeout(connect_timeout))??;
        stream.set_nodelay(true)?;
        let mut connection = Framed::new(stream, FrameCodec::new(HANDSHAKE_MAX_FRAME_BYTES));
        let handshake_timeout = self.config.handshake_timeout;
        tokio::time::timeout(handshake_timeout, async {
            let connector =
                Connector::new(self.key.clone(), self.endpoint.local().clone(), nonce());
            let init = connector.on_hello(read_frame(&mut connection).await?)?;
            connection.send(frame::encode(&init)?).await?;
            connector.on_accept(read_frame(&mut connection).await?)?;
            Ok::<_, ConnectionError>(())
        })
        .await
        .map_err(|_| ConnectionError::HandshakeTimeout(handshake_timeout))??;
        connection
            .codec_mut()
            .set_max_frame_size_bytes(self.config.max_frame_size_bytes);
        Ok(connection)
    }

    /// Owns the outbound connection to one peer: connects (with backoff), writes queued frames
    /// in lane order (control, quorum, bulk), and reconnects when the connection fails. Runs
    /// until shutdown.
    async fn run_writer(self: Arc<Self>, peer: Address, mut queues: LaneReceivers<Bytes>) {
        let shutdown = self.endpoint.shutdown.clone();
        let mut backoff = self.config.reconnect_backoff_min;
        // When it fires and nothing was sent to the peer for `idle_peer_timeout`, its queues
        // are dropped and this task ends; otherwise it is set for when that could be.
        let idle = tokio::time::sleep(self.config.idle_peer_timeout);
        tokio::pin!(idle);
        macro_rules! on_idle {
            () => {
                match self
                    .peers
                    .remove_if_idle(&self.endpoint, &peer, self.config.idle_peer_timeout)
                {
                    None => {
                        debug!(local = %self.endpoint.local(), %peer, "idle peer forgotten");
                        return;
                    }
                    Some(left) => idle.as_mut().reset(tokio::time::Instant::now() + left),
                }
            };
        }
        loop {
            let attempt = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = &mut idle => { on_idle!(); continue; }
                attempt = self.connect(&peer) => attempt,
            };
            let mut connection = match attempt {
                Ok(connection) => {
                    backoff = self.config.reconnect_backoff_min;
                    connection
                }
                Err(e) => {
                    TransportMetrics::incr(&self.endpoint.metrics.connect_failures);
                    if e.count_refusal(&self.endpoint.metrics) {
                        warn!(local = %self.endpoint.local(), %peer, error = %e, "outbound handshake failed");
                    } else {
                        debug!(local = %self.endpoint.local(), %peer, error = %e, ?backoff, "connect failed");
                    }
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = &mut idle => on_idle!(),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(self.config.reconnect_backoff_max);
                    continue;
                }
            };
            let ended = loop {
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return,
                    first = queues.recv() => {
                        let Some(first) = first else { return };
                        if let Err(e) = self.write_batch(&mut connection, first, &mut queues).await {
                            break e;
                        }
                    }
                    // The acceptor sends nothing after the handshake: any read result means the
                    // connection is over (closed, reset, or a confused peer).
                    read = connection.next() => break match read {
                        None => ConnectionError::Io(std::io::ErrorKind::UnexpectedEof.into()),
                        Some(Err(e)) => e.into(),
                        Some(Ok(_)) => FrameError::OutOfPlace { kind: "inbound data" }.into(),
                    },
                    _ = &mut idle => on_idle!(),
                }
            };
            debug!(local = %self.endpoint.local(), %peer, error = %ended, "outbound connection lost; reconnecting");
        }
    }

    /// Writes `first` and whatever else is ready (in lane order, bounded), then flushes once.
    async fn write_batch(
        &self,
        connection: &mut Connection,
        first: Bytes,
        queues: &mut LaneReceivers<Bytes>,
    ) -> Result<(), ConnectionError> {
        let mut next = Some(first);
        let mut written = 0;
        let mut yielded = false;
        while let Some(payload) = next {
            let size_bytes = payload.len();
            connection.feed(payload).await?;
            TransportMetrics::incr(&self.endpoint.metrics.frames_out);
            TransportMetrics::add(&self.endpoint.metrics.bytes_out, size_bytes);
            written += 1;
            next = if written < WRITE_BATCH_FRAMES_MAX {
                match queues.try_recv() {
                    // Once per batch, the tasks ready to run go first: under load they are
                    // the ones about to queue frames for this peer, which then share the
                    // write (a system call each) rather than follow one by one.
                    None if !yielded => {
                        yielded = true;
                        tokio::task::yield_now().await;
                        queues.try_recv()
                    }
                    next => next,
                }
            } else {
                None
            };
        }
        connection.flush().await?;
        Ok(())
    }
}

impl Outbound for TcpTransport {
    fn enqueue(&self, to: &Address, lane: Lane, frame: &Frame) -> Result<(), SendError> {
        let payload = self.endpoint.encode(frame)?;
        let size_bytes = payload.len();
        self.peers
            .try_send(&self.endpoint, to, lane, payload, size_bytes, |queues| {
                if let Some(me) = self.me.upgrade() {
                    self.runtime.spawn(me.run_writer(to.clone(), queues));
                }
            })
    }
}

impl Transport for TcpTransport {
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
        self.peers.close(&self.endpoint);
    }
}

/// An inbound connection's place among those in their handshake: the permit of
/// `max_inbound_handshakes` and the gauge, both given back when it is dropped.
struct Handshaking<'a> {
    _permit: OwnedSemaphorePermit,
    metrics: &'a TransportMetrics,
}

impl<'a> Handshaking<'a> {
    fn new(permit: OwnedSemaphorePermit, metrics: &'a TransportMetrics) -> Self {
        TransportMetrics::incr(&metrics.inbound_handshakes);
        Self {
            _permit: permit,
            metrics,
        }
    }
}

impl Drop for Handshaking<'_> {
    fn drop(&mut self) {
        TransportMetrics::decr(&self.metrics.inbound_handshakes);
    }
}

/// Reads one handshake frame; end of stream before it is a failed handshake.
async fn read_frame(connection: &mut Connection) -> Result<Frame, ConnectionError> {
    let payload = connection
        .next()
        .await
        .ok_or(ConnectionError::ClosedDuringHandshake)?
        .map_err(ConnectionError::HandshakeFrame)?;
    frame::decode(&payload).map_err(ConnectionError::HandshakeFrame)
}

/// A fresh challenge from the OS-seeded thread RNG (a CSPRNG): handshake nonces must be
/// unpredictable, so they do not come from the injectable simulation RNG.
fn nonce() -> Nonce {
    let mut nonce = [0u8; 32];
    rand::rng().fill_bytes(&mut nonce);
    nonce
}
