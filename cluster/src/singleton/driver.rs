//! The tokio layer around [`SingletonManager`]: [`Singletons`] owns the node's
//! [`services::SINGLETON`] queue and routes it by singleton name; [`ClusterSingleton`] is one
//! running manager, its timers and its instance.
//!
//! # The instance
//!
//! A factory given to [`Singletons::start_singleton`] starts the user's instance as a task and
//! returns its [`JoinHandle`]; the task's completion is the instance's termination, which the
//! manager awaits before it answers `HandOverDone`. The task gets an [`InstanceContext`]: a
//! stop signal, and the bounded queue of requests that proxies send it. Requests it never
//! took from the queue are answered "not running here" when it drops the queue, so proxies
//! send them again to the next instance; a request it took and dropped unanswered is reported
//! to its caller as dropped (outcome unknown).

use super::manager::{InstancePhase, MembershipView, SingletonEffect, SingletonManager};
use super::message::{HandOver, ProxyReply, SingletonFrame};
use super::proxy::{self, SingletonProxy};
use super::requests::{
    Route, RouterCommand, SINGLETON_LANE, SingletonRequest, SingletonRequests, SingletonResponder,
};
use super::settings::{SingletonSettings, SingletonSettingsError, validate_name};
use crate::address::UniqueAddress;
use crate::node::ClusterSnapshot;
use crate::transport::{Inbound, RemoteError, Transport, TransportError, services};
use bytes::Bytes;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Resolution of the managers' timers (hand-over retries, removal margins).
pub const TICK_INTERVAL: Duration = Duration::from_millis(100);
/// Bound of the node's inbound singleton queue (full: the transport drops and counts).
pub const SERVICE_QUEUE_CAPACITY: usize = 1024;
/// Bound of each manager's queue of hand-over messages; a message that finds it full is
/// dropped and counted (hand-over messages are retried).
pub const HAND_OVER_QUEUE_CAPACITY: usize = 64;
/// Bound of the router's command queue (registrations and same-node proxy requests).
pub const ROUTER_COMMAND_CAPACITY: usize = 1024;

/// Why a singleton or proxy could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SingletonError {
    #[error(transparent)]
    Settings(#[from] SingletonSettingsError),
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("singleton {name:?} is already started on this node")]
    AlreadyStarted { name: String },
    #[error("the singleton service of this node has shut down")]
    ShutDown,
    #[error("the singleton router's command queue is full ({capacity} commands); try again")]
    Overloaded { capacity: usize },
}

/// Counters of the node's singleton service.
#[derive(Debug, Default)]
pub struct SingletonCounters {
    /// Frames from peers that could not be decoded.
    pub decode_errors: AtomicU64,
    /// Hand-over messages whose `from` is not the sender the transport authenticated.
    pub forged_senders: AtomicU64,
    /// Hand-over messages for a singleton not started here, or finding its queue full.
    pub hand_overs_dropped: AtomicU64,
    /// Requests answered "not running here".
    pub requests_not_here: AtomicU64,
    /// Requests refused because the instance's queue was full.
    pub requests_overloaded: AtomicU64,
}

fn incr(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What the user's instance is started with.
#[derive(Debug)]
pub struct InstanceContext {
    pub name: String,
    /// Cancelled when the instance must stop: finish what is in flight, then return.
    pub stop: CancellationToken,
    /// Requests from proxies, bounded by `instance_queue_capacity`.
    pub requests: SingletonRequests,
}

/// Where a singleton stands on this node, published after every change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SingletonStatus {
    pub phase: InstancePhase,
    /// The member the singleton belongs on, as this node sees it.
    pub oldest: Option<UniqueAddress>,
    /// This node handed over or left: it will never run the instance again.
    pub retired: bool,
}

/// The node's singleton service: every singleton and proxy of the node shares its one
/// registration of [`services::SINGLETON`]; frames name their singleton.
pub struct Singletons<T: Transport> {
    transport: Arc<T>,
    membership: watch::Receiver<ClusterSnapshot>,
    router: mpsc::Sender<RouterCommand>,
    names: Arc<Mutex<BTreeSet<String>>>,
    counters: Arc<SingletonCounters>,
    shutdown: CancellationToken,
}

impl<T: Transport> Singletons<T> {
    /// Registers [`services::SINGLETON`] on `transport` and starts the router. `membership`
    /// is the cluster node's view ([`crate::node::ClusterHandle::watch`]).
    pub fn start(
        transport: Arc<T>,
        membership: watch::Receiver<ClusterSnapshot>,
    ) -> Result<Self, SingletonError> {
        let inbound = transport.register(services::SINGLETON, SERVICE_QUEUE_CAPACITY)?;
        let (router_tx, router_rx) = mpsc::channel(ROUTER_COMMAND_CAPACITY);
        let counters = Arc::new(SingletonCounters::default());
        let shutdown = CancellationToken::new();
        let router = Router {
            routes: HashMap::new(),
            counters: counters.clone(),
        };
        tokio::spawn(router.run(inbound, router_rx, shutdown.clone()));
        Ok(Self {
            transport,
            membership,
            router: router_tx,
            names: Arc::new(Mutex::new(BTreeSet::new())),
            counters,
            shutdown,
        })
    }

    pub fn counters(&self) -> &SingletonCounters {
        &self.counters
    }

    /// Starts the manager of singleton `name` on this node; `factory` starts the instance
    /// whenever this node is to run it (see the module docs). Start it on every node that has
    /// the singleton's role: the oldest of them hosts the instance, and a node that never
    /// answers the hand-over is waited for until it has left. Dropping the returned handle
    /// leaves the singleton running; [`ClusterSingleton::stop`] stops it.
    pub fn start_singleton<F>(
        &self,
        name: &str,
        settings: SingletonSettings,
        factory: F,
    ) -> Result<ClusterSingleton, SingletonError>
    where
        F: FnMut(InstanceContext) -> JoinHandle<()> + Send + 'static,
    {
        let manager =
            SingletonManager::new(name, self.transport.local().clone(), settings.clone())?;
        if self.shutdown.is_cancelled() {
            return Err(SingletonError::ShutDown);
        }
        {
            let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
            if !names.insert(name.to_string()) {
                return Err(SingletonError::AlreadyStarted {
                    name: name.to_string(),
                });
            }
        }
        let (hand_over_tx, hand_over_rx) = mpsc::channel(HAND_OVER_QUEUE_CAPACITY);
        let (instance_tx, instance_rx) = watch::channel(None);
        let route = Route {
            hand_over: hand_over_tx,
            instance: instance_rx,
            instance_queue_capacity: settings.instance_queue_capacity,
        };
        let registered = self.router.try_send(RouterCommand::Register {
            name: name.to_string(),
            route,
        });
        if let Err(e) = registered {
            self.names
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(name);
            return Err(router_error(e));
        }
        let (status_tx, status_rx) = watch::channel(SingletonStatus {
            phase: InstancePhase::Idle,
            oldest: None,
            retired: false,
        });
        let stop = self.shutdown.child_token();
        let driver = ManagerDriver {
            manager,
            transport: self.transport.clone(),
            factory: Box::new(factory),
            instance: None,
            instance_route: instance_tx,
            status: status_tx,
        };
        let task = tokio::spawn(driver.run(
            self.membership.clone(),
            hand_over_rx,
            stop.clone(),
            self.router.clone(),
            self.names.clone(),
        ));
        Ok(ClusterSingleton {
            name: name.to_string(),
            status: status_rx,
            stop,
            task,
        })
    }

    /// A proxy to singleton `name`, wherever it runs (this node included).
    pub fn proxy(
        &self,
        name: &str,
        settings: SingletonSettings,
    ) -> Result<SingletonProxy, SingletonError> {
        validate_name(name)?;
        settings.validate()?;
        if self.shutdown.is_cancelled() {
            return Err(SingletonError::ShutDown);
        }
        Ok(proxy::start(
            name.to_string(),
            settings,
            self.transport.clone(),
            self.membership.clone(),
            self.router.clone(),
            self.shutdown.child_token(),
        ))
    }

    /// Stops every singleton (their instances, without hand-over: leave the cluster first
    /// and wait for [`ClusterSingleton::retired`]), every proxy and the router.
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }
}

fn router_error<C>(error: mpsc::error::TrySendError<C>) -> SingletonError {
    match error {
        mpsc::error::TrySendError::Full(_) => SingletonError::Overloaded {
            capacity: ROUTER_COMMAND_CAPACITY,
        },
        mpsc::error::TrySendError::Closed(_) => SingletonError::ShutDown,
    }
}

/// One singleton started on this node.
#[derive(Debug)]
pub struct ClusterSingleton {
    name: String,
    status: watch::Receiver<SingletonStatus>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl ClusterSingleton {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn status(&self) -> SingletonStatus {
        self.status.borrow().clone()
    }

    /// A receiver that changes whenever the status does.
    pub fn watch_status(&self) -> watch::Receiver<SingletonStatus> {
        self.status.clone()
    }

    /// Waits until this node has given the singleton up for good (handed over, or left the
    /// cluster) and its instance has terminated: what a graceful shutdown waits for after
    /// leaving the cluster.
    pub async fn retired(&self) {
        let mut status = self.status.clone();
        let _ = status
            .wait_for(|s| s.retired && s.phase == InstancePhase::Idle)
            .await;
    }

    /// Stops the manager and its instance (without hand-over) and waits for both.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

type Factory = Box<dyn FnMut(InstanceContext) -> JoinHandle<()> + Send>;

struct RunningInstance {
    handle: JoinHandle<()>,
    stop: CancellationToken,
}

struct ManagerDriver<T: Transport> {
    manager: SingletonManager,
    transport: Arc<T>,
    factory: Factory,
    instance: Option<RunningInstance>,
    instance_route: watch::Sender<Option<mpsc::Sender<SingletonRequest>>>,
    status: watch::Sender<SingletonStatus>,
}

impl<T: Transport> ManagerDriver<T> {
    async fn run(
        mut self,
        mut membership: watch::Receiver<ClusterSnapshot>,
        mut hand_overs: mpsc::Receiver<HandOver>,
        stop: CancellationToken,
        router: mpsc::Sender<RouterCommand>,
        names: Arc<Mutex<BTreeSet<String>>>,
    ) {
        let mut ticker = tokio::time::interval(TICK_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The view at start counts as a change.
        membership.mark_changed();
        let mut membership_open = true;
        loop {
            let effects = tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                _ = terminated(&mut self.instance) => {
                    self.instance = None;
                    self.instance_route.send_replace(None);
                    self.manager.on_instance_terminated(now())
                }
                Some(message) = hand_overs.recv() => self.manager.on_message(now(), message),
                changed = membership.changed(), if membership_open => match changed {
                    Ok(()) => {
                        let view = MembershipView::from_snapshot(&membership.borrow_and_update());
                        match view {
                            Some(view) => self.manager.on_membership(now(), &view),
                            None => Vec::new(),
                        }
                    }
                    // The cluster node stopped: its last view stands (we have left or been
                    // downed, so the instance is already stopping).
                    Err(_) => {
                        membership_open = false;
                        Vec::new()
                    }
                },
                _ = ticker.tick() => self.manager.tick(now()),
            };
            self.apply(effects);
            self.publish();
        }
        self.instance_route.send_replace(None);
        if let Some(running) = self.instance.take() {
            running.stop.cancel();
            let _ = running.handle.await;
        }
        let name = self.manager.name().to_string();
        let _ = router.try_send(RouterCommand::Unregister { name: name.clone() });
        names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&name);
    }

    fn apply(&mut self, effects: Vec<SingletonEffect>) {
        for effect in effects {
            match effect {
                SingletonEffect::StartInstance => self.start_instance(),
                SingletonEffect::StopInstance => {
                    // New requests are answered "not running here" from now on.
                    self.instance_route.send_replace(None);
                    if let Some(running) = &self.instance {
                        running.stop.cancel();
                    }
                    tracing::info!(singleton = %self.manager.name(), "stopping the instance");
                }
                SingletonEffect::Send(hand_over) => {
                    let to = hand_over.to.address.clone();
                    let frame = SingletonFrame::HandOver {
                        name: self.manager.name().to_string(),
                        hand_over,
                    };
                    // Lost or refused messages are retried by the protocol.
                    if let Err(e) = self.transport.send(
                        &to,
                        services::SINGLETON,
                        SINGLETON_LANE,
                        frame.encode(),
                    ) {
                        tracing::debug!(singleton = %self.manager.name(), %to, error = %e, "hand-over message not sent");
                    }
                }
            }
        }
    }

    fn start_instance(&mut self) {
        let capacity = self.manager.settings().instance_queue_capacity;
        let (requests_tx, requests_rx) = mpsc::channel(capacity);
        let stop = CancellationToken::new();
        let context = InstanceContext {
            name: self.manager.name().to_string(),
            stop: stop.clone(),
            requests: SingletonRequests::new(requests_rx),
        };
        tracing::info!(singleton = %self.manager.name(), node = %self.manager.self_node(), "starting the instance");
        let handle = (self.factory)(context);
        self.instance = Some(RunningInstance { handle, stop });
        self.instance_route.send_replace(Some(requests_tx));
    }

    fn publish(&self) {
        let status = SingletonStatus {
            phase: self.manager.instance_phase(),
            oldest: self.manager.oldest().cloned(),
            retired: self.manager.is_retired(),
        };
        self.status.send_if_modified(|published| {
            let changed = *published != status;
            *published = status;
            changed
        });
    }
}

/// Completes when the running instance has terminated; never while none runs.
async fn terminated(instance: &mut Option<RunningInstance>) {
    match instance {
        // A panicking instance has terminated too.
        Some(running) => {
            let _ = (&mut running.handle).await;
        }
        None => std::future::pending().await,
    }
}

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// Owns the routes and the node's singleton queue.
struct Router {
    routes: HashMap<String, Route>,
    counters: Arc<SingletonCounters>,
}

impl Router {
    async fn run(
        mut self,
        mut inbound: mpsc::Receiver<Inbound>,
        mut commands: mpsc::Receiver<RouterCommand>,
        shutdown: CancellationToken,
    ) {
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                Some(command) = commands.recv() => self.on_command(command),
                message = inbound.recv() => match message {
                    Some(message) => self.on_inbound(message),
                    None => return,
                },
            }
        }
    }

    fn on_command(&mut self, command: RouterCommand) {
        match command {
            RouterCommand::Register { name, route } => {
                self.routes.insert(name, route);
            }
            RouterCommand::Unregister { name } => {
                self.routes.remove(&name);
            }
            RouterCommand::Local {
                name,
                payload,
                reply,
            } => self.deliver(&name, payload, SingletonResponder::local(reply)),
        }
    }

    fn on_inbound(&mut self, inbound: Inbound) {
        let frame = match SingletonFrame::decode(&inbound.payload) {
            Ok(frame) => frame,
            Err(e) => {
                incr(&self.counters.decode_errors);
                tracing::warn!(peer = %inbound.from, error = %e, "dropping undecodable singleton frame");
                if let Some(reply) = inbound.reply {
                    let _ = reply.respond_error(RemoteError::Rejected {
                        reason: e.to_string(),
                    });
                }
                return;
            }
        };
        match frame {
            SingletonFrame::HandOver { name, hand_over } => {
                if hand_over.from != inbound.from {
                    incr(&self.counters.forged_senders);
                    tracing::warn!(peer = %inbound.from, claimed = %hand_over.from, "hand-over message from another sender than it names");
                    return;
                }
                let delivered = self
                    .routes
                    .get(&name)
                    .is_some_and(|route| route.hand_over.try_send(hand_over).is_ok());
                if !delivered {
                    incr(&self.counters.hand_overs_dropped);
                }
            }
            SingletonFrame::Request { name, payload } => {
                // A one-way request has nobody to answer; it is dropped.
                if let Some(reply) = inbound.reply {
                    self.deliver(&name, payload, SingletonResponder::remote(reply));
                }
            }
        }
    }

    fn deliver(&self, name: &str, payload: Bytes, responder: SingletonResponder) {
        let route = self.routes.get(name);
        let queue = route.and_then(|r| r.instance.borrow().clone());
        let Some(queue) = queue else {
            incr(&self.counters.requests_not_here);
            let _ = responder.reply(ProxyReply::NotRunningHere);
            return;
        };
        let request = SingletonRequest { payload, responder };
        match queue.try_send(request) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(request)) => {
                incr(&self.counters.requests_overloaded);
                let capacity = route.map_or(0, |r| r.instance_queue_capacity);
                let _ = request.responder.reply(ProxyReply::Overloaded {
                    capacity: u64::try_from(capacity).unwrap_or(u64::MAX),
                });
            }
            Err(mpsc::error::TrySendError::Closed(request)) => {
                incr(&self.counters.requests_not_here);
                let _ = request.responder.reply(ProxyReply::NotRunningHere);
            }
        }
    }
}
