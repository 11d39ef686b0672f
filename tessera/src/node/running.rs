//! [`Node`]: a started node, which owns its lifecycle, and [`NodeHandle`], what a service's
//! own code holds to ask the node's entities.

use super::registration::LocalHost;
use super::{
    ENTITY_SHUTDOWN_TIMEOUT, EXIT_CODE_BOOTSTRAP_FAILED, EXIT_CODE_DOWNED, HANDOFF_ALL_TIMEOUT,
    LEAVE_TIMEOUT,
};
use crate::bootstrap::{BootstrapError, JoiningVia};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tessera_cluster::Address;
use tessera_cluster::core::StopReason;
use tessera_cluster::node::ClusterHandle;
use tessera_cluster::singleton::Singletons;
use tessera_cluster::transport::{TcpTransport, Transport};
use tessera_coordinator::EntityRef;
use tessera_coordinator::runtime::Sharding;
use tessera_daemon::{DaemonCount, DaemonHost, KeepAlivePinger};
use tessera_ddata::node::ReplicatorHandle;
use tessera_entities::{EntityHost, EntityType};
use tessera_journal::RocksJournal;
use tessera_persistence::Persistence;
use tessera_persistence::ReplicatedJournal;
use tessera_projection::{ControlError, ControlState, ProjectionControl, ProjectionStatuses};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What a service's own code holds to talk to the node (its routes get one): typed references
/// to entities anywhere in the cluster. Cheap to clone.
#[derive(Clone)]
pub struct NodeHandle {
    inner: Arc<HandleInner>,
}

struct HandleInner {
    sharding: Arc<Sharding<TcpTransport>>,
    daemons: BTreeMap<String, DaemonCount>,
    journal: Arc<ReplicatedJournal>,
    projections: ProjectionStatuses,
    /// Each projection's entity type, instances and control, by name.
    projection_controls: BTreeMap<String, RegisteredProjection>,
    cluster: ClusterHandle,
    cluster_address: Address,
    http_address: SocketAddr,
}

/// A projection registered on the node, as its handle knows it.
#[derive(Clone)]
pub(super) struct RegisteredProjection {
    pub entity_type: String,
    pub instances: u32,
    pub control: ProjectionControl,
}

impl NodeHandle {
    pub(super) fn new(
        sharding: Arc<Sharding<TcpTransport>>,
        cluster: ClusterHandle,
        cluster_address: Address,
        http_address: SocketAddr,
        daemons: BTreeMap<String, DaemonCount>,
        journal: Arc<ReplicatedJournal>,
        (projections, projection_controls): (
            ProjectionStatuses,
            BTreeMap<String, RegisteredProjection>,
        ),
    ) -> Self {
        NodeHandle {
            inner: Arc::new(HandleInner {
                sharding,
                daemons,
                journal,
                projections,
                projection_controls,
                cluster,
                cluster_address,
                http_address,
            }),
        }
    }

    /// A typed reference to entity `id` of type `E`, wherever in the cluster it runs (Akka's
    /// `entityRefFor`). For a type this node does not register, every ask fails with an
    /// error naming the types it does.
    ///
    /// ```no_run
    /// # async fn example<Cart: tessera::EntityType>(
    /// #     node: tessera::NodeHandle,
    /// #     checkout: Cart::Command,
    /// # ) {
    /// use tessera::{AskError, AskOutcome};
    /// match node.entity_ref::<Cart>("alice").ask(checkout).await {
    ///     Ok(reply) => { /* handled, its events persisted on a quorum */ }
    ///     Err(AskError::Rejected(why)) => { /* the cart's own rejection: nothing persisted */ }
    ///     Err(AskError::Failed(failure)) if failure.outcome == AskOutcome::Unknown => {
    ///         /* no answer in time: the command may still take effect */
    ///     }
    ///     Err(AskError::Failed(failure)) => { /* not applied: safe to retry */ }
    /// }
    /// # }
    /// ```
    pub fn entity_ref<E: EntityType>(&self, id: impl Into<Arc<str>>) -> EntityRef<E> {
        let sharding = &self.inner.sharding;
        match sharding.region(E::TYPE_NAME) {
            Some(region) => EntityRef::new(region, id),
            None => EntityRef::unroutable(sharding.unknown_type(E::TYPE_NAME), id),
        }
    }

    /// The cluster address this node is reachable at.
    pub fn cluster_address(&self) -> &Address {
        &self.inner.cluster_address
    }

    /// Where the HTTP API listens (the real port when 0 was configured).
    pub fn http_address(&self) -> SocketAddr {
        self.inner.http_address
    }

    /// The cluster's replicated journal, as this node reaches it: for queries of its own
    /// (events by slice across the cluster, among others).
    pub fn replicated_journal(&self) -> &Arc<ReplicatedJournal> {
        &self.inner.journal
    }

    /// What the projection instances that ran on this node did, and where they are.
    pub fn projection_statuses(&self) -> &ProjectionStatuses {
        &self.inner.projections
    }

    /// The registered projections: name, entity type, instances and control, by name.
    pub fn projections(&self) -> Vec<(String, String, u32, ControlState)> {
        self.inner
            .projection_controls
            .iter()
            .map(|(name, p)| {
                (
                    name.clone(),
                    p.entity_type.clone(),
                    p.instances,
                    p.control.current(),
                )
            })
            .collect()
    }

    /// Projection `name`'s control as this node follows it.
    pub fn projection_control(&self, name: &str) -> Result<&ProjectionControl, ProjectionError> {
        self.inner
            .projection_controls
            .get(name)
            .map(|p| &p.control)
            .ok_or_else(|| ProjectionError::Unknown {
                name: name.to_string(),
                known: self.inner.projection_controls.keys().cloned().collect(),
            })
    }

    /// Pauses projection `name` on every node: each instance saves its offset and handles
    /// nothing until resumed.
    pub async fn pause_projection(&self, name: &str) -> Result<(), ProjectionError> {
        Ok(self
            .projection_control(name)?
            .set_paused(true, PROJECTION_CONTROL_WRITE_TIMEOUT)
            .await?)
    }

    /// Resumes projection `name` on every node.
    pub async fn resume_projection(&self, name: &str) -> Result<(), ProjectionError> {
        Ok(self
            .projection_control(name)?
            .set_paused(false, PROJECTION_CONTROL_WRITE_TIMEOUT)
            .await?)
    }

    /// Resets projection `name`'s offset to the beginning of every log, applied by each
    /// instance when resumed. Refused unless the projection is paused.
    pub async fn reset_projection(&self, name: &str) -> Result<(), ProjectionError> {
        Ok(self
            .projection_control(name)?
            .reset(PROJECTION_CONTROL_WRITE_TIMEOUT)
            .await?)
    }

    /// The number of instances of daemon `name` as this node knows it now.
    pub fn daemon_count(&self, name: &str) -> Result<u32, DaemonError> {
        Ok(self.daemon(name)?.current())
    }

    /// Changes the number of instances of daemon `name` (written to a majority of the
    /// members): every node restarts its instances with the new count as it learns it, and
    /// stops those whose number is no longer below it.
    pub async fn set_daemon_count(&self, name: &str, count: u32) -> Result<(), DaemonError> {
        self.daemon(name)?
            .set(count, DAEMON_COUNT_WRITE_TIMEOUT)
            .await
            .map_err(DaemonError::from)
    }

    fn daemon(&self, name: &str) -> Result<&DaemonCount, DaemonError> {
        self.inner
            .daemons
            .get(name)
            .ok_or_else(|| DaemonError::Unknown {
                name: name.to_string(),
                known: self.inner.daemons.keys().cloned().collect(),
            })
    }

    /// The cluster membership as this node sees it now.
    pub fn cluster(&self) -> &ClusterHandle {
        &self.inner.cluster
    }
}

/// How long a pause, resume or reset may take to reach a majority.
pub const PROJECTION_CONTROL_WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a projection was not paused, resumed or reset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProjectionError {
    #[error("no projection {name:?} is registered on this node (projections: {known:?})")]
    Unknown { name: String, known: Vec<String> },
    #[error(transparent)]
    Control(#[from] ControlError),
}

/// How long a new daemon count may take to reach a majority.
pub const DAEMON_COUNT_WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a daemon's count was not read or changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DaemonError {
    #[error("no daemon {name:?} is registered on this node (daemons: {known:?})")]
    Unknown { name: String, known: Vec<String> },
    #[error(transparent)]
    Count(#[from] tessera_daemon::SetCountError),
}

/// What the builder hands the running node.
pub(super) struct NodeParts {
    pub handle: NodeHandle,
    pub cluster: ClusterHandle,
    pub transport: Arc<TcpTransport>,
    pub replicator: ReplicatorHandle,
    pub joining_via: JoiningVia,
    pub hosts: Arc<[(String, Arc<dyn LocalHost>)]>,
    pub daemon_hosts: Vec<DaemonHost>,
    pub pingers: Vec<KeepAlivePinger>,
    pub persistence: Arc<Persistence>,
    pub sharding: Arc<Sharding<TcpTransport>>,
    pub singletons: Singletons<TcpTransport>,
    pub journal: Arc<RocksJournal>,
    pub http_shutdown: watch::Sender<bool>,
    pub http_task: JoinHandle<()>,
    /// Answers the members' questions about this node's projection instances.
    pub projection_service: JoinHandle<()>,
    pub bootstrap: Option<JoinHandle<Result<(), BootstrapError>>>,
}

/// A started node. It runs until [`Node::shutdown`] (graceful), [`Node::run_until_stopped`]
/// (which waits for SIGINT/SIGTERM, then shuts down gracefully) or the cluster ending its
/// membership; every way stops each of its tasks and closes its stores, in order.
pub struct Node {
    handle: NodeHandle,
    /// The cluster membership.
    pub cluster: ClusterHandle,
    /// The cluster transport.
    pub transport: Arc<TcpTransport>,
    /// The node's Distributed Data replica.
    pub replicator: ReplicatorHandle,
    /// What Cluster Bootstrap is joining through, shown to other bootstrapping nodes.
    pub joining_via: JoiningVia,
    /// The replicated journal and snapshot store the entities use.
    pub persistence: Arc<Persistence>,
    /// Cluster sharding of the entity types.
    pub sharding: Arc<Sharding<TcpTransport>>,
    hosts: Arc<[(String, Arc<dyn LocalHost>)]>,
    daemon_hosts: Vec<DaemonHost>,
    pingers: std::sync::Mutex<Vec<KeepAlivePinger>>,
    singletons: Singletons<TcpTransport>,
    journal: Arc<RocksJournal>,
    http_shutdown: watch::Sender<bool>,
    http_task: JoinHandle<()>,
    projection_service: JoinHandle<()>,
    bootstrap: Option<JoinHandle<Result<(), BootstrapError>>>,
}

impl Node {
    pub(super) fn from_parts(parts: NodeParts) -> Self {
        Node {
            handle: parts.handle,
            cluster: parts.cluster,
            transport: parts.transport,
            replicator: parts.replicator,
            joining_via: parts.joining_via,
            persistence: parts.persistence,
            sharding: parts.sharding,
            hosts: parts.hosts,
            daemon_hosts: parts.daemon_hosts,
            pingers: std::sync::Mutex::new(parts.pingers),
            singletons: parts.singletons,
            journal: parts.journal,
            http_shutdown: parts.http_shutdown,
            http_task: parts.http_task,
            projection_service: parts.projection_service,
            bootstrap: parts.bootstrap,
        }
    }

    /// A handle for the service's own code.
    pub fn handle(&self) -> NodeHandle {
        self.handle.clone()
    }

    /// A typed reference to entity `id` of type `E`; see [`NodeHandle::entity_ref`].
    pub fn entity_ref<E: EntityType>(&self, id: impl Into<Arc<str>>) -> EntityRef<E> {
        self.handle.entity_ref(id)
    }

    /// The cluster address this node is reachable at.
    pub fn cluster_address(&self) -> &Address {
        self.handle.cluster_address()
    }

    /// Where the HTTP API listens (the real port when 0 was configured).
    pub fn http_address(&self) -> SocketAddr {
        self.handle.http_address()
    }

    /// The node's own store: its replicas of the logs placed on it.
    pub fn local_journal(&self) -> &Arc<RocksJournal> {
        &self.journal
    }

    /// The instances of daemon `name` running on this node now (stopping ones included).
    pub fn daemon_instances(&self, name: &str) -> Vec<u32> {
        self.daemon_hosts
            .iter()
            .find(|host| host.name() == name)
            .map(DaemonHost::running)
            .unwrap_or_default()
    }

    /// This node's host of `E`'s entities, asked without sharding (benchmarks and tests);
    /// None when this node only routes `E` or does not register it.
    #[doc(hidden)]
    pub fn local_host<E: EntityType>(&self) -> Option<Arc<EntityHost<E>>> {
        let (_, host) = self.hosts.iter().find(|(name, _)| name == E::TYPE_NAME)?;
        let host: Arc<dyn std::any::Any + Send + Sync> = host.clone();
        host.downcast::<EntityHost<E>>().ok()
    }

    /// Runs the node until SIGINT or SIGTERM (then shuts it down gracefully, see
    /// [`Node::shutdown`]), until the cluster ends its membership (downed, or removed), or
    /// until Cluster Bootstrap gives up joining. Returns the process's exit status: 0 after a
    /// clean stop, [`EXIT_CODE_DOWNED`] when downed, [`EXIT_CODE_BOOTSTRAP_FAILED`] when
    /// bootstrap gave up.
    pub async fn run_until_stopped(mut self) -> u8 {
        let cluster = self.cluster.clone();
        let bootstrap = self.bootstrap.take();
        // The task moves into the wait below; it is aborted through this however the wait ends.
        let bootstrap_abort = bootstrap.as_ref().map(JoinHandle::abort_handle);
        // Resolves only when bootstrapping ended without this node becoming a member.
        let bootstrap_failed = async move {
            match bootstrap {
                Some(task) => match task.await {
                    Ok(Ok(())) => std::future::pending().await,
                    Ok(Err(e)) => e,
                    // A bootstrap that died must not leave the node waiting as a non-member.
                    Err(e) => BootstrapError::Crashed(e.to_string()),
                },
                None => std::future::pending().await,
            }
        };
        let reason = tokio::select! {
            signal = shutdown_signal() => {
                tracing::info!(signal, "shutting down: leaving the cluster");
                if let Some(task) = &bootstrap_abort {
                    task.abort();
                }
                self.shutdown().await
            }
            reason = cluster.stopped() => {
                if let Some(task) = &bootstrap_abort {
                    task.abort();
                }
                self.stop().await;
                reason
            }
            error = bootstrap_failed => {
                tracing::error!(error = %error, "bootstrap failed; shutting down");
                eprintln!("error: {error}");
                self.kill().await;
                return EXIT_CODE_BOOTSTRAP_FAILED;
            }
        };
        match reason {
            Some(StopReason::Downed) => {
                tracing::warn!("this node was downed; exiting");
                EXIT_CODE_DOWNED
            }
            _ => {
                tracing::info!("node stopped");
                0
            }
        }
    }

    /// Leaves the cluster gracefully and shuts everything down; returns why the node stopped.
    ///
    /// First every shard of this node is handed off to the others (requests keep being
    /// served meanwhile, routed to wherever their shard goes); then the entities stop after
    /// what they accepted, while the node is still a member, so that the writes they
    /// accepted reach their replicas; then the node leaves, and its tasks stop and its
    /// stores close.
    pub async fn shutdown(self) -> Option<StopReason> {
        if !self.sharding.hand_off_all(HANDOFF_ALL_TIMEOUT).await {
            tracing::warn!(
                timeout = ?HANDOFF_ALL_TIMEOUT,
                "not every shard was handed off in time; leaving anyway"
            );
        }
        self.stop_http();
        self.stop_entities().await;
        let reason = self.cluster.leave_and_stop(LEAVE_TIMEOUT).await;
        self.stop().await;
        reason
    }

    /// Vanishes without leaving, as a killed process would (for benchmarks and tests).
    #[doc(hidden)]
    pub async fn kill(self) {
        self.cluster.abort();
        self.stop().await;
    }

    /// Stops taking HTTP requests; the ones under way finish.
    fn stop_http(&self) {
        let _ = self.http_shutdown.send(true);
    }

    /// Lets the entities finish what they accepted (their writes need the replicas, so this
    /// runs while the transport and the membership are still up).
    async fn stop_entities(&self) {
        // No keep-alive starts a daemon instance again; the instances stop first, since
        // their tasks may still ask entities.
        self.pingers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clear();
        let daemons = futures::future::join_all(self.daemon_hosts.iter().map(DaemonHost::shutdown));
        if tokio::time::timeout(ENTITY_SHUTDOWN_TIMEOUT, daemons)
            .await
            .is_err()
        {
            tracing::warn!(timeout = ?ENTITY_SHUTDOWN_TIMEOUT, "daemon instances did not stop in time");
        }
        let all = futures::future::join_all(self.hosts.iter().map(|(_, host)| host.shutdown()));
        if tokio::time::timeout(ENTITY_SHUTDOWN_TIMEOUT, all)
            .await
            .is_err()
        {
            tracing::warn!(
                timeout = ?ENTITY_SHUTDOWN_TIMEOUT,
                "entities did not stop in time; stopping the node anyway"
            );
        }
    }

    /// Stops every part, each after the parts that use it.
    async fn stop(self) {
        // HTTP first, so no request is cut off by the services it uses stopping under it.
        self.stop_http();
        self.stop_entities().await;
        let Node {
            transport,
            replicator,
            persistence,
            sharding,
            singletons,
            journal,
            http_task,
            projection_service,
            bootstrap,
            ..
        } = self;
        let _ = http_task.await;
        projection_service.abort();
        if let Some(bootstrap) = bootstrap {
            bootstrap.abort();
            let _ = bootstrap.await;
        }
        singletons.shutdown();
        sharding.stop().await;
        persistence.stop().await;
        replicator.stop().await;
        transport.shutdown();
        // The writer finishes the queued writes and stops; the store's files are released
        // as the last of the journal's users lets go of it.
        journal.finish_writes().await;
    }
}

async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the node can still be stopped through the cluster.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}
