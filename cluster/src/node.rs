//! The tokio layer around [`ClusterCore`]: one task owns the core and drives it from the
//! transport's service queues, a ticker and a bounded command channel. Everything else talks to
//! it through a [`ClusterHandle`].

use crate::address::{Address, UniqueAddress};
use crate::codec;
use crate::core::{
    ClusterConfigError, ClusterCore, ClusterCoreConfig, CoreMessage, HeartbeatMessage, StopReason,
};
use crate::events::{ClusterEvent, CurrentClusterState};
use crate::member::{Member, MemberStatus};
use crate::membership::{MembershipError, MembershipMessage, MembershipStats};
use crate::transport::{Inbound, Lane, Transport, TransportError, services};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{broadcast, mpsc, oneshot, watch};

/// How often the core's timers are driven; gossip, heartbeats and leader actions run on their
/// own intervals, this is only their resolution.
pub const TICK_INTERVAL: Duration = Duration::from_millis(100);
/// Bound of the command queue in front of the driver task.
pub const COMMAND_QUEUE_CAPACITY: usize = 64;
/// Bound of each protocol service's inbound queue (full: the transport drops and counts).
pub const SERVICE_QUEUE_CAPACITY: usize = 1024;
/// Events kept for slow subscribers; one that falls further behind gets `Lagged`.
pub const EVENT_BUFFER_CAPACITY: usize = 1024;

/// A point-in-time view of the cluster from this node, published after every change.
#[derive(Clone, Debug, Default)]
pub struct ClusterSnapshot {
    pub self_node: Option<UniqueAddress>,
    pub self_status: Option<MemberStatus>,
    pub leader: Option<UniqueAddress>,
    pub members: Vec<Member>,
    pub unreachable: BTreeSet<UniqueAddress>,
    pub converged: bool,
    pub stats: MembershipStats,
    pub heartbeats_sent: u64,
    pub heartbeat_responses_received: u64,
}

impl ClusterSnapshot {
    pub fn member_at(&self, address: &Address) -> Option<&Member> {
        self.members.iter().find(|m| m.address() == address)
    }

    pub fn is_leader(&self) -> bool {
        self.self_node.is_some() && self.leader == self.self_node
    }
}

/// Why a request to the cluster driver could not be carried out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Membership(#[from] MembershipError),
    #[error("the cluster node is shutting down")]
    ShuttingDown,
    #[error("the cluster node's command queue is full ({capacity} commands); try again")]
    Overloaded { capacity: usize },
}

/// Failure to start a cluster node.
#[derive(Debug, thiserror::Error)]
pub enum ClusterStartError {
    #[error(transparent)]
    Config(#[from] ClusterConfigError),
    #[error(transparent)]
    Transport(#[from] TransportError),
}

/// Counters of the driver itself (the protocol counters are in the snapshot).
#[derive(Debug, Default)]
pub struct DriverCounters {
    /// Messages from authenticated peers that could not be decoded.
    pub decode_errors: AtomicU64,
}

/// An operator command for [`ClusterHandle::submit`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operation {
    Join(Address),
    Leave(Address),
    Down(Address),
}

enum Command {
    Join(Address, oneshot::Sender<Result<(), ClusterError>>),
    Leave(Address, oneshot::Sender<Result<(), ClusterError>>),
    Down(Address, oneshot::Sender<Result<(), ClusterError>>),
    Subscribe(oneshot::Sender<(CurrentClusterState, broadcast::Receiver<ClusterEvent>)>),
    Stop,
}

/// The way to a running cluster node. Cheap to clone.
#[derive(Clone)]
pub struct ClusterHandle {
    self_node: UniqueAddress,
    commands: mpsc::Sender<Command>,
    snapshot: watch::Receiver<ClusterSnapshot>,
    stopped: watch::Receiver<Option<StopReason>>,
    counters: Arc<DriverCounters>,
}

impl ClusterHandle {
    pub fn self_node(&self) -> &UniqueAddress {
        &self.self_node
    }

    /// The latest published view.
    pub fn snapshot(&self) -> ClusterSnapshot {
        self.snapshot.borrow().clone()
    }

    /// A receiver that changes whenever the view does.
    pub fn watch(&self) -> watch::Receiver<ClusterSnapshot> {
        self.snapshot.clone()
    }

    pub fn counters(&self) -> &DriverCounters {
        &self.counters
    }

    /// Why the node stopped, once it has.
    pub fn stop_reason(&self) -> Option<StopReason> {
        *self.stopped.borrow()
    }

    /// Joins the node at `address` (this node's own address forms a new cluster).
    pub async fn join(&self, address: Address) -> Result<(), ClusterError> {
        self.call(|reply| Command::Join(address, reply)).await
    }

    /// Makes the member at `address` leave gracefully.
    pub async fn leave(&self, address: Address) -> Result<(), ClusterError> {
        self.call(|reply| Command::Leave(address, reply)).await
    }

    /// Marks the member at `address` Down.
    pub async fn down(&self, address: Address) -> Result<(), ClusterError> {
        self.call(|reply| Command::Down(address, reply)).await
    }

    /// Hands an operator command to the driver without waiting for it to be applied (for
    /// callers that must not block, such as HTTP handlers). An unknown member is refused
    /// here, against the latest snapshot.
    pub fn submit(&self, operation: Operation) -> Result<(), ClusterError> {
        if self.stop_reason().is_some() {
            return Err(ClusterError::ShuttingDown);
        }
        let snapshot = self.snapshot.borrow();
        let (tx, _) = oneshot::channel();
        let command = match operation {
            Operation::Join(address) => {
                if snapshot.self_status.is_some() {
                    return Err(MembershipError::AlreadyMember.into());
                }
                Command::Join(address, tx)
            }
            Operation::Leave(address) | Operation::Down(address)
                if snapshot.member_at(&address).is_none() =>
            {
                return Err(MembershipError::UnknownMember(address).into());
            }
            Operation::Leave(address) => Command::Leave(address, tx),
            Operation::Down(address) => Command::Down(address, tx),
        };
        drop(snapshot);
        self.try_command(command)
    }

    /// Stops the driver at once, without leaving: the node simply disappears, as if its
    /// process were killed (benchmarks and tests of failure detection use this).
    pub fn abort(&self) {
        let _ = self.commands.try_send(Command::Stop);
    }

    /// Subscribes to cluster events: the current state first, then every change. A
    /// subscriber that falls more than [`EVENT_BUFFER_CAPACITY`] events behind receives
    /// `RecvError::Lagged` and should resubscribe.
    pub async fn subscribe(
        &self,
    ) -> Result<(CurrentClusterState, broadcast::Receiver<ClusterEvent>), ClusterError> {
        let (tx, rx) = oneshot::channel();
        self.try_command(Command::Subscribe(tx))?;
        rx.await.map_err(|_| ClusterError::ShuttingDown)
    }

    /// Leaves the cluster and waits until this node has left (or `timeout` passed), then
    /// stops the driver. Returns why the node stopped.
    pub async fn leave_and_stop(&self, timeout: Duration) -> Option<StopReason> {
        let member = self
            .snapshot()
            .self_status
            .is_some_and(|s| s != MemberStatus::Removed);
        if member && self.stop_reason().is_none() {
            if let Err(e) = self.leave(self.self_node.address.clone()).await {
                tracing::warn!(error = %e, "could not start leaving the cluster");
            }
            let mut stopped = self.stopped.clone();
            let _ = tokio::time::timeout(timeout, stopped.wait_for(|s| s.is_some())).await;
        }
        let _ = self.commands.try_send(Command::Stop);
        self.stop_reason()
    }

    /// Waits until the node stops (left, downed, or stopped).
    pub async fn stopped(&self) -> Option<StopReason> {
        let mut stopped = self.stopped.clone();
        let _ = stopped.wait_for(|s| s.is_some()).await;
        self.stop_reason()
    }

    async fn call(
        &self,
        command: impl FnOnce(oneshot::Sender<Result<(), ClusterError>>) -> Command,
    ) -> Result<(), ClusterError> {
        let (tx, rx) = oneshot::channel();
        self.try_command(command(tx))?;
        rx.await.map_err(|_| ClusterError::ShuttingDown)?
    }

    fn try_command(&self, command: Command) -> Result<(), ClusterError> {
        self.commands.try_send(command).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => ClusterError::Overloaded {
                capacity: COMMAND_QUEUE_CAPACITY,
            },
            mpsc::error::TrySendError::Closed(_) => ClusterError::ShuttingDown,
        })
    }
}

/// Starts the cluster protocols of this node on `transport` and joins through the configured
/// seed nodes (if any). The driver task runs until the node left, was downed, or was stopped.
pub fn start<T: Transport>(
    transport: Arc<T>,
    config: ClusterCoreConfig,
) -> Result<ClusterHandle, ClusterStartError> {
    let self_node = transport.local().clone();
    let now = tokio::time::Instant::now().into_std();
    let wall_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    let core = ClusterCore::new(self_node.clone(), config, rand::random(), now, wall_ms)?;
    let membership_rx = transport.register(services::MEMBERSHIP, SERVICE_QUEUE_CAPACITY)?;
    let heartbeat_rx = transport.register(services::HEARTBEAT, SERVICE_QUEUE_CAPACITY)?;
    let (command_tx, command_rx) = mpsc::channel(COMMAND_QUEUE_CAPACITY);
    let (snapshot_tx, snapshot_rx) = watch::channel(ClusterSnapshot::default());
    let (stopped_tx, stopped_rx) = watch::channel(None);
    let (events_tx, _) = broadcast::channel(EVENT_BUFFER_CAPACITY);
    let counters = Arc::new(DriverCounters::default());
    let driver = Driver {
        core,
        transport,
        events: events_tx,
        snapshot: snapshot_tx,
        stopped: stopped_tx,
        counters: counters.clone(),
    };
    tokio::spawn(driver.run(membership_rx, heartbeat_rx, command_rx));
    Ok(ClusterHandle {
        self_node,
        commands: command_tx,
        snapshot: snapshot_rx,
        stopped: stopped_rx,
        counters,
    })
}

struct Driver<T: Transport> {
    core: ClusterCore,
    transport: Arc<T>,
    events: broadcast::Sender<ClusterEvent>,
    snapshot: watch::Sender<ClusterSnapshot>,
    stopped: watch::Sender<Option<StopReason>>,
    counters: Arc<DriverCounters>,
}

impl<T: Transport> Driver<T> {
    async fn run(
        mut self,
        mut membership_rx: mpsc::Receiver<Inbound>,
        mut heartbeat_rx: mpsc::Receiver<Inbound>,
        mut command_rx: mpsc::Receiver<Command>,
    ) {
        let mut ticker = tokio::time::interval(TICK_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.core.start(now());
        self.flush();
        loop {
            // Heartbeats first: a backlog of gossip must not make this node look dead.
            tokio::select! {
                biased;
                Some(inbound) = heartbeat_rx.recv() => self.on_heartbeat(inbound),
                Some(command) = command_rx.recv() => {
                    if self.on_command(command) {
                        break;
                    }
                }
                Some(inbound) = membership_rx.recv() => self.on_membership(inbound),
                _ = ticker.tick() => self.core.tick(now()),
                else => break,
            }
            if self.flush() {
                break;
            }
        }
        if self.stopped.borrow().is_none() {
            let _ = self.stopped.send(Some(StopReason::Left));
        }
    }

    fn on_heartbeat(&mut self, inbound: Inbound) {
        match codec::decode::<HeartbeatMessage>("heartbeat", &inbound.payload) {
            Ok(message) => self.core.handle_heartbeat(now(), &inbound.from, message),
            Err(e) => self.decode_error(&inbound.from, e),
        }
    }

    fn on_membership(&mut self, inbound: Inbound) {
        match codec::decode::<MembershipMessage>("membership", &inbound.payload) {
            Ok(message) => self.core.handle_membership(now(), &inbound.from, message),
            Err(e) => self.decode_error(&inbound.from, e),
        }
    }

    fn decode_error(&self, from: &UniqueAddress, error: codec::DecodeError) {
        self.counters.decode_errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(peer = %from, error = %error, "dropping undecodable cluster message");
    }

    /// Applies a command; returns true when the driver must stop.
    fn on_command(&mut self, command: Command) -> bool {
        let now = now();
        let reply = |tx: oneshot::Sender<Result<(), ClusterError>>,
                     r: Result<(), MembershipError>| {
            let _ = tx.send(r.map_err(ClusterError::from));
        };
        match command {
            Command::Join(address, tx) => reply(tx, self.core.join(now, address)),
            Command::Leave(address, tx) => reply(tx, self.core.leave(now, &address)),
            Command::Down(address, tx) => reply(tx, self.core.down(now, &address)),
            Command::Subscribe(tx) => {
                let membership = self.core.membership();
                let state = CurrentClusterState::from_gossip(
                    membership.gossip(),
                    membership.leader().cloned(),
                );
                let _ = tx.send((state, self.events.subscribe()));
            }
            Command::Stop => return true,
        }
        false
    }

    /// Sends what the core produced, publishes events and the snapshot; returns true when
    /// this node's cluster life is over.
    fn flush(&mut self) -> bool {
        let now = now();
        let stop = self.core.stop_reason(now);
        if stop.is_some() {
            // Make sure our last decision (downing ourselves, our exit) reaches the others.
            self.core.gossip_to_all_reachable();
        }
        for out in self.core.take_outbox() {
            let (service, payload) = match &out.message {
                CoreMessage::Membership(m) => (services::MEMBERSHIP, codec::encode(m)),
                CoreMessage::Heartbeat(h) => (services::HEARTBEAT, codec::encode(h)),
            };
            // A full queue is counted by the transport; gossip and heartbeats are periodic,
            // so a dropped one is replaced by the next.
            let _ = self
                .transport
                .send(&out.to, service, Lane::Control, payload);
        }
        let events = self.core.take_events();
        let changed = !events.is_empty();
        for event in events {
            tracing::info!(node = %self.core.self_node(), event = ?event, "cluster event");
            let _ = self.events.send(event);
        }
        let stats = self.core.membership().stats();
        let needs_publish = changed || {
            let published = self.snapshot.borrow();
            published.stats != stats
                || published.heartbeats_sent != self.core.heartbeats_sent()
                || published.heartbeat_responses_received
                    != self.core.heartbeat_responses_received()
        };
        if needs_publish {
            let membership = self.core.membership();
            let gossip = membership.gossip();
            let snapshot = ClusterSnapshot {
                self_node: Some(membership.self_node().clone()),
                self_status: membership.self_status(),
                leader: membership.leader().cloned(),
                members: gossip.members.values().cloned().collect(),
                unreachable: gossip.reachability.all_unreachable(),
                converged: gossip.is_converged(),
                stats,
                heartbeats_sent: self.core.heartbeats_sent(),
                heartbeat_responses_received: self.core.heartbeat_responses_received(),
            };
            let _ = self.snapshot.send(snapshot);
        }
        if let Some(reason) = stop {
            tracing::info!(node = %self.core.self_node(), reason = ?reason, "cluster membership ended");
            let _ = self.stopped.send(Some(reason));
            return true;
        }
        false
    }
}

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}
