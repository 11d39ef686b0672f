//! [`NodeBuilder`]: what a service registers on its node (its entity types, its own HTTP
//! routes), and the start of every part of the node in the order they need each other.

use super::NodeError;
use super::control::NodeControl;
use super::daemons::DaemonRegistration;
use super::projections::ClusterProjections;
use super::queries::ShardedQueries;
use super::registration::{Listener, LocalHost, Registration, TypedRegistration};
use super::running::RegisteredProjection;
use super::running::{Node, NodeHandle, NodeParts};
use super::settings::{
    bootstrap_config, cluster_core_config, entity_config, http_settings, node_entity_budget,
    open_stores, persistence_settings, replicator_settings, sharding_settings, transport_config,
};
use crate::bootstrap::JoiningVia;
use crate::config::{NodeConfig, RememberEntities, StateStoreMode};
use crate::entities::{JsonEntities, JsonEntity};
use crate::entity_settings::{EntitySettings, ResolvedEntitySettings, section_name};
use crate::http;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tessera_cluster::singleton::Singletons;
use tessera_cluster::transport::{TcpTransport, Transport};
use tessera_coordinator::host::{EntityNote, ShardHost};
use tessera_coordinator::remember::{DdataRememberStore, JournalRememberStore, RememberStore};
use tessera_coordinator::runtime::{
    ENTITY_NOTE_QUEUE_CAPACITY, RememberEntitiesSetup, RuntimeSettings, ShardedType, Sharding,
};
use tessera_coordinator::store::{CoordinatorStoreFactory, DdataStoreFactory, JournalStoreFactory};
use tessera_coordinator::{ShardIds, settings::ShardingSettings};
use tessera_daemon::{DaemonContext, DaemonCount, DaemonHost, DaemonSettings, KeepAlivePinger};
use tessera_entities::{EntityLifecycle, EntityType};
use tessera_journal::FsyncPolicy;
use tessera_persistence::{Persistence, RocksReplicaStore};
use tessera_projection::{NodeServices, ProjectionControl, ProjectionRun, ProjectionStatuses};
use tokio::sync::watch;

/// Builds a service's own HTTP routes, given the running node (to ask its entities).
type RoutesFn = Box<dyn FnOnce(NodeHandle) -> axum::Router + Send>;

/// A tessera node to start: the entity types it runs and the service's own routes. Every node
/// of a cluster registers the same types (with the same `number_of_shards` and message
/// version): a command forwarded to a node that does not know its type, or shards it
/// differently, is refused with an error naming the difference.
///
/// ```no_run
/// # use tessera::node::NodeBuilder;
/// # use tessera::config::NodeConfig;
/// # async fn example<Account: tessera::EntityType + Default>() -> Result<(), Box<dyn std::error::Error>> {
/// let node = NodeBuilder::new()
///     .entity(Account::default())
///     .start(&NodeConfig::default())
///     .await?;
/// let alice = node.entity_ref::<Account>("alice");
/// // alice.ask(command).await ...
/// node.shutdown().await;
/// # Ok(())
/// # }
/// ```
#[must_use = "a builder does nothing until it is started"]
pub struct NodeBuilder {
    types: Vec<Box<dyn Registration>>,
    daemons: Vec<DaemonRegistration>,
    projections: Vec<Arc<dyn ProjectionRun>>,
    routes: Vec<RoutesFn>,
    fsync: FsyncPolicy,
}

impl Default for NodeBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl NodeBuilder {
    /// A node with no entity types yet.
    pub fn new() -> Self {
        NodeBuilder {
            types: Vec::new(),
            daemons: Vec::new(),
            projections: Vec::new(),
            routes: Vec::new(),
            fsync: FsyncPolicy::Always,
        }
    }

    /// Registers entity type `E`, with the node's settings for it (and its own section of
    /// the configuration, `[entity.<type>]`).
    pub fn entity<E: EntityType>(self, entity: E) -> Self {
        self.entity_with(entity, EntitySettings::default())
    }

    /// Registers entity type `E` with `settings`: its role, remember-entities, passivation,
    /// snapshots and sharding. What they leave unset comes from the node's keys; the type's
    /// section of the configuration wins over both.
    pub fn entity_with<E: EntityType>(mut self, entity: E, settings: EntitySettings) -> Self {
        self.types.push(Box::new(TypedRegistration {
            entity: Some(entity),
            settings,
        }));
        self
    }

    /// Registers a sharded daemon process (Akka's `ShardedDaemonProcess`): `count`
    /// instances of `task`, numbered `0..count`, each kept running on one node of the
    /// cluster — started on some node, started elsewhere when that node is removed, moved by
    /// rebalancing when nodes join. The task gets its [`DaemonContext`] (its number, the
    /// count, a stop signal it must heed) and the node; one that returns is started again.
    /// The count can change at runtime ([`NodeHandle::set_daemon_count`]).
    ///
    /// ```no_run
    /// # use tessera::{DaemonContext, NodeBuilder, NodeHandle};
    /// let builder = NodeBuilder::new().daemon("reindexer", 4, |context: DaemonContext, _node: NodeHandle| async move {
    ///     while !context.is_stopping() {
    ///         // ... a share of the work: context.index() of context.count() ...
    ///         tokio::select! {
    ///             () = context.stopped() => {}
    ///             () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
    ///         }
    ///     }
    /// });
    /// ```
    pub fn daemon<F, Fut>(self, name: &str, count: u32, task: F) -> Self
    where
        F: Fn(DaemonContext, NodeHandle) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        self.daemon_with(name, count, DaemonSettings::default(), task)
    }

    /// [`NodeBuilder::daemon`] with its keep-alive interval, stop timeout and role.
    pub fn daemon_with<F, Fut>(
        mut self,
        name: &str,
        count: u32,
        settings: DaemonSettings,
        task: F,
    ) -> Self
    where
        F: Fn(DaemonContext, NodeHandle) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        use futures::FutureExt;
        self.daemons.push(DaemonRegistration {
            name: name.to_string(),
            count,
            fixed_count: false,
            settings,
            task: Arc::new(move |context, node| task(context, node).boxed()),
        });
        self
    }

    /// Registers a projection ([`Projection`](tessera_projection::Projection)): its
    /// instances run as a sharded daemon process, `projection.<name>`, each following the
    /// events of its slices from the offset it saved.
    pub fn projection(mut self, projection: impl ProjectionRun) -> Self {
        let projection: Arc<dyn ProjectionRun> = Arc::new(projection);
        self.projections.push(projection.clone());
        self.daemons.push(DaemonRegistration {
            name: tessera_projection::daemon_name_of(projection.name()),
            count: projection.instances(),
            fixed_count: true,
            settings: DaemonSettings::default(),
            task: Arc::new(move |context, node: NodeHandle| {
                let control = match node.projection_control(projection.name()) {
                    Ok(control) => control.watch(),
                    Err(e) => {
                        tracing::error!(error = %e, "a projection instance without its control");
                        return Box::pin(futures::future::ready(()));
                    }
                };
                projection.run(
                    context,
                    NodeServices {
                        journal: node.replicated_journal().clone(),
                        statuses: node.projection_statuses().clone(),
                        node: node.cluster().self_node().to_string(),
                        control,
                    },
                )
            }),
        });
        self
    }

    /// Adds the service's own HTTP routes to the node's HTTP API (behind its token and its
    /// limits), built once the node runs so that they can ask its entities.
    pub fn routes(
        mut self,
        routes: impl FnOnce(NodeHandle) -> axum::Router + Send + 'static,
    ) -> Self {
        self.routes.push(Box::new(routes));
        self
    }

    /// The registered entity types' names, in registration order.
    pub fn type_names(&self) -> Vec<&'static str> {
        self.types.iter().map(|t| t.type_name()).collect()
    }

    /// The journal's and snapshot store's fsync policy: only for `tessera bench sharding`,
    /// which measures persisted commands with fsync `never` beside `always`. A node always
    /// fsyncs; the policy is deliberately not a configuration key.
    #[doc(hidden)]
    pub fn fsync(mut self, fsync: FsyncPolicy) -> Self {
        self.fsync = fsync;
        self
    }

    /// Checks the registrations against `config`: no type registered twice (nor two whose
    /// sections would share a name), every configuration section names a registered type,
    /// and every type's settings are allowed. Returns each type's settings with nothing left
    /// to the node.
    pub fn check(&self, config: &NodeConfig) -> Result<Vec<ResolvedEntitySettings>, NodeError> {
        let mut sections = BTreeMap::new();
        for registration in &self.types {
            let name = registration.type_name();
            if let Some(other) = sections.insert(section_name(name), name) {
                return Err(NodeError::DuplicateType {
                    first: other.to_string(),
                    second: name.to_string(),
                });
            }
        }
        config.check_entity_sections(self.type_names())?;
        for projection in &self.projections {
            projection.validate()?;
            if !self.type_names().contains(&projection.entity_type()) {
                return Err(NodeError::ProjectionType {
                    projection: projection.name().to_string(),
                    entity_type: projection.entity_type().to_string(),
                    registered: self.type_names().iter().map(|t| t.to_string()).collect(),
                });
            }
        }
        let mut daemon_names = BTreeMap::new();
        for daemon in &self.daemons {
            daemon.settings.validate(&daemon.name, daemon.count)?;
            let type_name = tessera_daemon::type_name_of(&daemon.name);
            if let Some(other) = sections
                .insert(section_name(&type_name), "a daemon")
                .or_else(|| daemon_names.insert(daemon.name.clone(), "a daemon"))
            {
                return Err(NodeError::DuplicateDaemon {
                    name: daemon.name.clone(),
                    other: other.to_string(),
                });
            }
        }
        self.types
            .iter()
            .map(|registration| {
                let name = registration.type_name();
                let code = registration.settings().validated(name)?;
                let settings = code.overridden_by(&config.entity_section(name));
                Ok(ResolvedEntitySettings::resolve(&settings, config))
            })
            .collect()
    }

    /// Starts the node: binds the cluster transport and the HTTP API, starts the cluster
    /// protocols (joining through the seed nodes or Cluster Bootstrap, if configured),
    /// Distributed Data, the replicated journal, each entity type's host and its sharding,
    /// and the service's routes. The node then runs until [`Node::shutdown`],
    /// [`Node::run_until_stopped`] or the cluster ending its membership.
    pub async fn start(mut self, config: &NodeConfig) -> Result<Node, NodeError> {
        let resolved = self.check(config)?;
        // The HTTP port first: the likeliest start error (a port in use) stops the start
        // before anything runs.
        let http_bind = format!("{}:{}", config.http_host, config.http_port);
        let listener = bind_http(&http_bind)
            .await
            .map_err(|source| NodeError::HttpBind {
                address: http_bind.clone(),
                source,
            })?;
        let http_address = listener
            .local_addr()
            .map_err(|source| NodeError::HttpBind {
                address: http_bind,
                source,
            })?;
        let (journal, snapshots) = open_stores(config, self.fsync).await?;
        let transport = TcpTransport::bind(transport_config(config), rand::random()).await?;
        let cluster = tessera_cluster::node::start(transport.clone(), cluster_core_config(config))?;
        let remembering = resolved.iter().any(ResolvedEntitySettings::remembers);
        // The journal's timeouts stay below every type's ask timeout.
        let shortest_ask = resolved
            .iter()
            .map(|s| s.entity_ask_timeout)
            .min()
            .unwrap_or(config.entity_ask_timeout);
        let mut ddata_settings = replicator_settings(config, remembering);
        if !self.daemons.is_empty() {
            let pattern = tessera_daemon::count::DURABLE_KEY_PATTERN.to_string();
            ddata_settings.config.durable_keys.push(pattern);
        }
        if !self.projections.is_empty() {
            let pattern = tessera_projection::control::DURABLE_KEY_PATTERN.to_string();
            ddata_settings.config.durable_keys.push(pattern);
        }
        let replicator =
            tessera_ddata::node::start(transport.clone(), cluster.watch(), ddata_settings).await?;
        let persistence = Arc::new(Persistence::start(
            transport.clone(),
            cluster.watch(),
            RocksReplicaStore::new(journal.clone()),
            snapshots,
            journal.clone(),
            persistence_settings(config, shortest_ask)?,
        )?);
        // One budget for every entity type of the node.
        let budget = node_entity_budget(config);
        let singletons = Singletons::start(transport.clone(), cluster.watch())?;
        let node_id = cluster.self_node().to_string();
        let mut hosts: Vec<(String, Arc<dyn LocalHost>)> = Vec::new();
        let mut types = Vec::with_capacity(self.types.len());
        for (registration, settings) in self.types.iter_mut().zip(&resolved) {
            let name = registration.type_name();
            // Without the type's role this node only routes: its region is a proxy.
            let hosts_entities = settings
                .sharding_role
                .as_ref()
                .is_none_or(|role| config.roles.contains(role));
            let (notes, listener) = if settings.remembers() && hosts_entities {
                let (tx, rx) = tokio::sync::mpsc::channel(ENTITY_NOTE_QUEUE_CAPACITY);
                (Some(rx), Some(entity_notes(tx)))
            } else {
                (None, None)
            };
            let host = if hosts_entities {
                let host = registration.start_host(
                    persistence.journal.clone(),
                    persistence.snapshots.clone(),
                    entity_config(settings, node_id.clone(), budget.clone()),
                    listener,
                )?;
                hosts.push((name.to_string(), host.clone()));
                Some(host as Arc<dyn ShardHost>)
            } else {
                None
            };
            let store: Box<dyn CoordinatorStoreFactory> = match settings.state_store_mode {
                StateStoreMode::Ddata => Box::new(DdataStoreFactory(replicator.clone())),
                StateStoreMode::Persistence => Box::new(JournalStoreFactory {
                    journal: persistence.journal.clone(),
                    snapshots: persistence.snapshots.clone(),
                }),
            };
            let remember = notes.map(|notes| RememberEntitiesSetup {
                store: match settings.remember_entities {
                    RememberEntities::Eventsourced => Arc::new(JournalRememberStore::new(
                        persistence.journal.clone(),
                        replicator.clone(),
                        name,
                    ))
                        as Arc<dyn RememberStore>,
                    _ => Arc::new(DdataRememberStore::new(replicator.clone(), name)),
                },
                notes,
            });
            types.push(ShardedType {
                type_name: name.to_string(),
                host,
                settings: sharding_settings(settings),
                role: settings.sharding_role.clone(),
                store: store.store(name, settings.remembers()),
                remember,
                message_version: registration.message_version(),
            });
        }
        // The node's handle reaches the daemons' tasks once it exists.
        let (handle_ready, handle_rx) = watch::channel(None);
        let node_defaults = ResolvedEntitySettings::resolve(&EntitySettings::default(), config);
        let mut daemons = Vec::with_capacity(self.daemons.len());
        for daemon in &self.daemons {
            let type_name = tessera_daemon::type_name_of(&daemon.name);
            let count = DaemonCount::start(replicator.clone(), &daemon.name, daemon.count)
                .await
                .map_err(|source| NodeError::DaemonCount {
                    name: daemon.name.clone(),
                    source,
                })?;
            let runs_here = daemon
                .settings
                .role
                .as_ref()
                .is_none_or(|role| config.roles.contains(role));
            let host = runs_here.then(|| {
                DaemonHost::start(
                    &daemon.name,
                    daemon.behavior(handle_rx.clone()),
                    count.watch(),
                    daemon.settings.clone(),
                )
            });
            let store: Box<dyn CoordinatorStoreFactory> = match node_defaults.state_store_mode {
                StateStoreMode::Ddata => Box::new(DdataStoreFactory(replicator.clone())),
                StateStoreMode::Persistence => Box::new(JournalStoreFactory {
                    journal: persistence.journal.clone(),
                    snapshots: persistence.snapshots.clone(),
                }),
            };
            types.push(ShardedType {
                type_name: type_name.clone(),
                host: host
                    .clone()
                    .map(|host| Arc::new(host) as Arc<dyn ShardHost>),
                settings: ShardingSettings {
                    number_of_shards: tessera_daemon::settings::MAX_COUNT,
                    shard_ids: ShardIds::Numbered,
                    ..sharding_settings(&node_defaults)
                },
                role: daemon.settings.role.clone(),
                store: store.store(&type_name, false),
                remember: None,
                message_version: tessera_daemon::host::MESSAGE_VERSION,
            });
            daemons.push(RunningDaemon {
                fixed_count: daemon.fixed_count,
                name: daemon.name.clone(),
                type_name,
                count,
                host,
                keep_alive_interval: daemon.settings.keep_alive_interval,
            });
        }
        let ask_timeout = resolved
            .iter()
            .map(|s| s.entity_ask_timeout)
            .max()
            .unwrap_or(config.entity_ask_timeout);
        let sharding = Arc::new(Sharding::start(
            transport.clone(),
            cluster.watch(),
            &singletons,
            types,
            RuntimeSettings {
                // Beyond the entity's own timeout, so that its answer (or its timeout) arrives.
                ask_timeout: ask_timeout + Duration::from_secs(1),
                coordinator_removal_margin: config.stable_after,
            },
        )?);
        let faces: BTreeMap<String, Arc<dyn JsonEntity>> = self
            .types
            .iter()
            .filter_map(|registration| {
                let name = registration.type_name();
                let region = sharding.region(name)?;
                Some((name.to_string(), registration.json_face(region)))
            })
            .collect();
        let json = Arc::new(JsonEntities::new(faces));
        let daemon_counts = daemons
            .iter()
            .filter(|daemon| !daemon.fixed_count)
            .map(|daemon| (daemon.name.clone(), daemon.count.clone()))
            .collect();
        let mut projection_controls = BTreeMap::new();
        for projection in &self.projections {
            let control = ProjectionControl::start(replicator.clone(), projection.name())
                .await
                .map_err(|source| NodeError::ProjectionControl {
                    projection: projection.name().to_string(),
                    source,
                })?;
            projection_controls.insert(
                projection.name().to_string(),
                RegisteredProjection {
                    entity_type: projection.entity_type().to_string(),
                    instances: projection.instances(),
                    control,
                },
            );
        }
        let projection_statuses = ProjectionStatuses::default();
        let projection_service =
            super::projections::serve_statuses(&transport, projection_statuses.clone())?;
        let handle = NodeHandle::new(
            sharding.clone(),
            cluster.clone(),
            transport.local().address.clone(),
            http_address,
            daemon_counts,
            persistence.journal.clone(),
            (projection_statuses.clone(), projection_controls),
        );
        let _ = handle_ready.send(Some(handle.clone()));
        let pingers = daemons
            .iter()
            .filter_map(|daemon| {
                let region = sharding.region(&daemon.type_name)?;
                Some(KeepAlivePinger::start(
                    region,
                    daemon.count.watch(),
                    daemon.keep_alive_interval,
                ))
            })
            .collect();
        let daemon_hosts = daemons
            .into_iter()
            .filter_map(|daemon| daemon.host)
            .collect();
        let hosts: Arc<[(String, Arc<dyn LocalHost>)]> = hosts.into();
        let http_server = http::HttpServer::new(http_settings(config));
        let control = Arc::new(NodeControl {
            cluster: cluster.clone(),
            transport: transport.clone(),
            replicator: replicator.clone(),
            hosts: hosts.clone(),
            persistence: persistence.clone(),
            sharding: sharding.clone(),
            http_stats: http_server.stats(),
            journal: journal.clone(),
            entity_asks: json.ask_durations().clone(),
            projections: projection_statuses,
        });
        let queries = Arc::new(ShardedQueries {
            sharding: sharding.clone(),
            cluster: cluster.clone(),
        });
        let (http_shutdown, mut shutdown_rx) = watch::channel(false);
        let joining_via = JoiningVia::default();
        let mut services = http::ddata::router(replicator.clone())
            .merge(http::entities::router(json))
            .merge(http::sharding::router(queries))
            .merge(http::journal::router(persistence.journal.clone()))
            .merge(http::projections::router(Arc::new(ClusterProjections {
                handle: handle.clone(),
                transport: transport.clone(),
            })))
            .merge(crate::bootstrap::router(
                cluster.watch(),
                cluster.self_node().address.clone(),
                joining_via.clone(),
            ))
            .merge(crate::dashboard::router(
                &cluster,
                &replicator,
                &sharding,
                shutdown_rx.clone(),
            ));
        for routes in self.routes {
            services = services.merge(routes(handle.clone()));
        }
        let router = http_server.router(control, services);
        let http_task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = shutdown_rx.wait_for(|stop| *stop).await;
            };
            if let Err(e) = http_server.serve(listener, router, shutdown).await {
                tracing::error!(error = %e, "HTTP API stopped");
            }
        });
        let bootstrap = bootstrap_config(config, http_address.port()).map(|bootstrap| {
            tracing::info!(discovery = ?bootstrap.discovery, "bootstrap: looking for a cluster to join or form");
            tokio::spawn(crate::bootstrap::run(
                bootstrap,
                cluster.clone(),
                joining_via.clone(),
            ))
        });
        if bootstrap.is_none() && config.seed_nodes.is_empty() {
            tracing::warn!(
                "no seed nodes and no contact points: this node waits to be joined. To form \
                 or join a cluster, give every node the same --contact-point HOST:HTTP_PORT \
                 list (or --discovery-dns NAME) for Cluster Bootstrap, or --seed HOST:PORT; \
                 or ask it with POST /cluster/join (tessera join ADDRESS)"
            );
        }
        Ok(Node::from_parts(NodeParts {
            handle,
            cluster,
            transport,
            replicator,
            joining_via,
            hosts,
            daemon_hosts,
            pingers,
            persistence,
            sharding,
            singletons,
            journal,
            http_shutdown,
            http_task,
            projection_service,
            bootstrap,
        }))
    }

    /// Starts the node with `config` and runs it until SIGINT or SIGTERM (then it hands its
    /// shards off, stops its entities after their writes, leaves the cluster and closes its
    /// stores) or until the cluster ends its membership. Prints the line
    /// `tessera node <self> listening: cluster=<address> http=<address>` on stdout once
    /// started. Returns the process's exit status ([`super::EXIT_CODE_DOWNED`] when downed).
    pub async fn run(self, config: NodeConfig) -> u8 {
        let node = match self.start(&config).await {
            Ok(node) => node,
            Err(e) => {
                tracing::error!(error = %e, "node failed to start");
                eprintln!("error: {e}");
                return 1;
            }
        };
        // A stable line on stdout that scripts and tests wait for.
        println!(
            "tessera node {} listening: cluster={} http={}",
            node.cluster.self_node(),
            node.cluster_address(),
            node.http_address()
        );
        tracing::info!(
            node = %node.cluster.self_node(),
            http = %node.http_address(),
            seeds = ?config.seed_nodes.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            "node started"
        );
        node.run_until_stopped().await
    }
}

/// A daemon as the start builds it.
struct RunningDaemon {
    fixed_count: bool,
    name: String,
    type_name: String,
    count: DaemonCount,
    host: Option<DaemonHost>,
    keep_alive_interval: Duration,
}

/// The entity host's lifecycle listener for remember-entities: starts and passivations, into a
/// bounded queue (it must not block the host; a full queue loses the note, see
/// [`ENTITY_NOTE_QUEUE_CAPACITY`]).
fn entity_notes(notes: tokio::sync::mpsc::Sender<EntityNote>) -> Listener {
    Box::new(move |event| {
        let note = match event {
            EntityLifecycle::Started { id } => EntityNote::Started(id.as_str().to_string()),
            EntityLifecycle::Stopped { id, reason } if reason.is_passivation() => {
                EntityNote::Passivated(id.as_str().to_string())
            }
            EntityLifecycle::Stopped { .. } => return,
        };
        if notes.try_send(note).is_err() {
            tracing::debug!("an entity note was lost: the remember-entities queue is full");
        }
    })
}

/// Connections the HTTP listener queues before accepting them (Linux caps it at
/// `net.core.somaxconn`). Bursts of a thousand clients, as entity commands bring, overflow
/// tokio's default of 1,024 on a busy machine and get their connections reset.
pub const HTTP_LISTEN_BACKLOG: u32 = 4_096;

/// Binds the HTTP API's listener on `address` (`host:port`) with [`HTTP_LISTEN_BACKLOG`].
async fn bind_http(address: &str) -> std::io::Result<tokio::net::TcpListener> {
    let mut last_error = None;
    for resolved in tokio::net::lookup_host(address).await? {
        let socket = if resolved.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(resolved) {
            Ok(()) => return socket.listen(HTTP_LISTEN_BACKLOG),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error
        .unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address to bind")))
}
