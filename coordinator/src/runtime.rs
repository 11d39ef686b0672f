//! The tokio layer of cluster sharding: one [`Sharding`] per node. It owns the node's
//! [`services::SHARDING`] queue and routes its frames by entity type, runs a region task per
//! entity type around [`ShardRegion`], and starts each type's [`ShardCoordinator`] as a cluster
//! singleton whose instance task drives it and its [`CoordinatorStore`].
//!
//! Every message of the sharding service travels on one lane ([`SHARDING_LANE`]) as one-way
//! frames, so each pair of nodes sees them in the order sent: a region's handoff marker
//! arrives behind the commands it forwarded before it. Answers to forwarded commands travel
//! back as frames too, matched by a reply id at the node whose caller waits.

use crate::coordinator::{CoordinatorOutput, MembershipView, ShardCoordinator};
use crate::host::{AskFailure, AskOutcome, EntityNote, FailureKind, Payload, ShardHost};
use crate::messages::{BetweenRegions, HandoffId, ToCoordinator, ToRegion};
use crate::region::{Origin, RegionOutput, RegionView, ShardRegion};
use crate::remember::RememberStore;
use crate::settings::ShardingSettings;
use crate::shard_id::{ShardId, ShardMap};
use crate::store::{CoordinatorStore, StoreError};
use crate::wire::{self, RegionSnapshot, RemoteAsk, ShardingFrame, WireError};
use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tessera_cluster::node::ClusterSnapshot;
use tessera_cluster::singleton::{
    ClusterSingleton, InstanceContext, SingletonError, SingletonSettings, SingletonStatus,
    Singletons,
};
use tessera_cluster::transport::{Inbound, Lane, Responder, Transport, TransportError, services};
use tessera_cluster::{Address, MemberStatus, UniqueAddress};
use tessera_entities::EntityId;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The lane of every sharding frame: callers wait on them, so they must not queue behind the
/// journal's and Distributed Data's bulk traffic; one lane keeps each link's order.
pub const SHARDING_LANE: Lane = Lane::Quorum;
/// Bound of the node's inbound sharding queue (full: the transport drops and counts).
pub const SERVICE_QUEUE_CAPACITY: usize = 16_384;
/// Bound of each region's and each coordinator's input queue; a frame that finds it full is
/// dropped and counted (the protocol repeats what it needs; a command forwarded from another
/// node is refused back to its caller, not applied).
pub const INPUT_QUEUE_CAPACITY: usize = 16_384;
/// Resolution of the regions' and coordinators' timers.
pub const TICK_INTERVAL: Duration = Duration::from_millis(100);

/// Inputs a region handles in one turn of its loop at most, so that membership changes and
/// ticks are not kept waiting behind a full queue.
const INPUT_BATCH: usize = 64;
/// A coordinator that cannot read its state tries again after this long.
pub const LOAD_RETRY_INTERVAL: Duration = Duration::from_millis(500);
/// The longest wait between two reads of a shard's remembered entities while the store does
/// not answer: the reads go on for as long as the shard runs here.
const REMEMBERED_READ_RETRY_MAX: Duration = Duration::from_secs(5);
/// Failed reads of a shard's remembered entities after which a warning says they are still
/// not running (about half a minute with the waits above).
const REMEMBERED_READ_WARN_AFTER: u32 = 10;

/// How often a region logs that the node it takes for its coordinator's does not register its
/// type (the refusal repeats with every registration attempt).
const UNSUPPORTED_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// The singleton name of a type's coordinator.
pub fn coordinator_singleton_name(type_name: &str) -> String {
    format!("sharding-coordinator-{type_name}")
}

/// One entity type as this node shards it.
pub struct ShardedType {
    pub type_name: String,
    /// The type's entities on this node; `None` makes this node a proxy for the type.
    pub host: Option<Arc<dyn ShardHost>>,
    pub settings: ShardingSettings,
    /// Only members with this role host the type and run its coordinator.
    pub role: Option<String>,
    /// The store of the type's coordinator state.
    pub store: Arc<dyn CoordinatorStore>,
    /// With remember-entities: where shards keep their entity ids, and the host's reports of
    /// entities starting and passivating (a bounded queue the host's listener fills).
    pub remember: Option<RememberEntitiesSetup>,
    /// The version of the type's commands, replies and rejections in postcard
    /// (`EntityType::MESSAGE_VERSION`): carried by every forwarded command, and a command
    /// encoded under another version is refused rather than misread.
    pub message_version: u32,
}

/// Remember-entities for one entity type.
pub struct RememberEntitiesSetup {
    pub store: Arc<dyn RememberStore>,
    pub notes: mpsc::Receiver<EntityNote>,
}

/// Bound of a type's queue of entity notes (the host's listener `try_send`s into it; a note
/// that finds it full is counted and lost: that entity is not remembered or forgotten until
/// its next start or passivation).
pub const ENTITY_NOTE_QUEUE_CAPACITY: usize = 65_536;

/// Settings of the node's sharding runtime.
#[derive(Clone, Debug)]
pub struct RuntimeSettings {
    /// How long [`Sharding::ask`] waits for the entity's answer.
    pub ask_timeout: Duration,
    /// How long after a downed node's removal its coordinator may still run (it has not
    /// learned yet that it was downed): a successor waits this long. Set it to the split-brain
    /// resolver's `stable_after` (Akka's down-removal-margin).
    pub coordinator_removal_margin: Duration,
}

impl Default for RuntimeSettings {
    fn default() -> Self {
        RuntimeSettings {
            ask_timeout: Duration::from_secs(5),
            coordinator_removal_margin: Duration::ZERO,
        }
    }
}

/// Why sharding could not start.
#[derive(Debug, thiserror::Error)]
pub enum ShardingStartError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("the coordinator singleton of {type_name}: {source}")]
    Singleton {
        type_name: String,
        source: SingletonError,
    },
    #[error(transparent)]
    Settings(#[from] crate::settings::InvalidSetting),
    #[error("entity type {0:?} is sharded twice")]
    Duplicate(String),
}

/// Counters of the node's sharding runtime.
#[derive(Debug, Default)]
pub struct ShardingCounters {
    /// Sharding frames from peers that did not decode.
    pub frames_malformed: AtomicU64,
    /// Frames for a type this node does not shard, or for a coordinator not running here.
    pub frames_unrouted: AtomicU64,
    /// Frames dropped because a region's or coordinator's queue was full.
    pub frames_dropped: AtomicU64,
    /// Asks of this node's callers sent to the region of another node by the direct path.
    pub forwards_sent: AtomicU64,
    /// Replies that came after their caller stopped waiting.
    pub replies_late: AtomicU64,
    /// Replies (and refusals) for callers on other nodes that could not be encoded or handed
    /// to the transport: those callers hear nothing and end at their ask timeout.
    pub replies_unsent: AtomicU64,
    /// Remembered-entity changes stored, and writes that failed (retried).
    pub remember_writes: AtomicU64,
    pub remember_write_failures: AtomicU64,
    /// Remembered entities started where their shard landed.
    pub remembered_started: AtomicU64,
    /// Asks of this node's callers queued on the entity host past the region task.
    pub asks_direct: AtomicU64,
}

impl ShardingCounters {
    fn incr(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters as read at one moment.
    pub fn snapshot(&self) -> ShardingCountersSnapshot {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ShardingCountersSnapshot {
            frames_malformed: get(&self.frames_malformed),
            frames_unrouted: get(&self.frames_unrouted),
            frames_dropped: get(&self.frames_dropped),
            forwards_sent: get(&self.forwards_sent),
            replies_late: get(&self.replies_late),
            replies_unsent: get(&self.replies_unsent),
            remember_writes: get(&self.remember_writes),
            remember_write_failures: get(&self.remember_write_failures),
            remembered_started: get(&self.remembered_started),
            asks_direct: get(&self.asks_direct),
        }
    }
}

/// [`ShardingCounters`] as read at one moment (see there for what each counts).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardingCountersSnapshot {
    pub frames_malformed: u64,
    pub frames_unrouted: u64,
    pub frames_dropped: u64,
    pub forwards_sent: u64,
    pub replies_late: u64,
    pub replies_unsent: u64,
    pub remember_writes: u64,
    pub remember_write_failures: u64,
    pub remembered_started: u64,
    pub asks_direct: u64,
}

/// What a region publishes about itself, for metrics and readiness.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegionGauges {
    pub registered: bool,
    pub shards: usize,
    pub buffered: usize,
    pub handoffs: u64,
    pub forwarded: u64,
    pub delivered_local: u64,
    pub refused: u64,
    /// Why the region cannot register, when the node it takes for its coordinator's does not
    /// register the type (the nodes of the cluster register different types).
    pub unsupported: Option<String>,
}

/// What a coordinator publishes (on the node that runs it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CoordinatorGauges {
    pub running: bool,
    pub shards: usize,
    pub regions: usize,
    pub handoffs_completed: u64,
    /// Handoffs given up: not completed within the handoff timeout (counted from the start
    /// of the handoff), or their shard's owner left the cluster meanwhile.
    pub handoffs_given_up: u64,
    pub rebalance_rounds: u64,
    pub writes: u64,
    pub write_failures: u64,
}

/// What a region gives a local caller: the reply, or (for an entity of this node) the
/// entity host's answer to await, so that no task is spawned just to pass it on.
enum Answer {
    Ready(Result<Payload, AskFailure>),
    Pending(BoxFuture<'static, Result<Payload, AskFailure>>),
}

enum ReplyTo {
    Local(oneshot::Sender<Answer>),
    Remote { to: Address, reply_id: u64 },
}

/// A command on its way to its entity: the message type of the region state machine.
pub struct Pending {
    entity_id: String,
    payload: Payload,
    reply: ReplyTo,
}

enum RegionInput {
    Ask {
        entity_id: String,
        payload: Payload,
        reply: oneshot::Sender<Answer>,
    },
    FromCoordinator {
        from: UniqueAddress,
        message: ToRegion,
    },
    Forward {
        from: UniqueAddress,
        shard: ShardId,
        ask: RemoteAsk,
    },
    Marker {
        from: UniqueAddress,
        shard: ShardId,
        handoff: HandoffId,
    },
    ShardStopped(ShardId),
    /// The remembered entities of `shard`, read for its incarnation `generation`.
    Remembered {
        shard: ShardId,
        generation: u64,
        ids: BTreeSet<String>,
    },
    /// A write of remembered-entity changes finished; failed ones are queued again.
    RememberWritten {
        shard: ShardId,
        failed: Option<RememberChanges>,
    },
    State(oneshot::Sender<RegionSnapshot>),
    RemoteState(Responder),
    BeginShutdown(oneshot::Sender<()>),
    /// The node this region takes for its coordinator's does not register the type.
    Unsupported {
        from: UniqueAddress,
        reason: String,
    },
}

enum CoordinatorInput {
    Message {
        from: UniqueAddress,
        message: ToCoordinator,
    },
}

struct RegionHandle {
    inputs: mpsc::Sender<RegionInput>,
    gauges: watch::Receiver<RegionGauges>,
    coordinator_gauges: watch::Receiver<CoordinatorGauges>,
    hosts: bool,
    /// This node's callers' way past the region task.
    direct: Arc<DirectPath>,
}

/// The way of this node's callers past the region task, for a shard whose messages the
/// region task would send on at once anyway: one that runs here and takes their messages
/// (active, not handing off, nothing buffered), queued straight on the entity host; or one
/// whose home is another known region (not handing off, nothing buffered), forwarded there.
///
/// Invariants: `routes` changes only under the write lock, together with the region state
/// it mirrors (the region task holds it while it handles whatever can change that state:
/// the coordinator's messages, markers, stopped shards, shutdown, ticks and membership; see
/// `RegionTask::take`), and a caller queues its command on the host, or sends it, under the
/// read lock; so a command never reaches the host after the region began stopping its shard,
/// nor leaves for a home after the region's handoff marker. `queued_asks` counts this node's
/// asks sent to the region task and not yet handled there; a caller goes direct only when it
/// is zero, so an ask never overtakes an earlier one of the same caller. The router does the
/// same for commands forwarded from other regions, counted in `queued_forwards`.
struct DirectPath {
    type_name: String,
    host: Option<Arc<dyn ShardHost>>,
    shards: ShardMap,
    /// The type's message version, sent with every forwarded command.
    message_version: u32,
    routes: std::sync::RwLock<HashMap<ShardId, DirectRoute>>,
    queued_asks: AtomicU64,
    /// The same for commands other regions forwarded here: the router delivers one direct
    /// only when none waits in the region task.
    queued_forwards: AtomicU64,
    /// This node's address, where replies to forwarded commands come back.
    self_address: Address,
    send: SendFrame,
    waiting: Waiting,
    /// Reply ids of forwarded commands, shared with the region task's.
    next_reply_id: AtomicU64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum DirectRoute {
    Local,
    Remote(Address),
}

/// What became of a command offered to the direct path.
enum Direct {
    /// Queued on the entity host: its reply.
    Local(BoxFuture<'static, Result<Payload, AskFailure>>),
    /// Forwarded: the reply comes under this id.
    Remote(oneshot::Receiver<Answer>, u64),
    /// Forwarding failed; nothing was sent.
    Failed(AskFailure),
    /// Not for the direct path: the command, for the region task.
    NotTaken(Payload),
}

/// The answer to a command that could not be encoded to leave the node: nothing was sent.
fn unencodable_command(type_name: &str, entity_id: &str, error: &str) -> AskFailure {
    AskFailure::new(
        FailureKind::BadRequest,
        AskOutcome::NotApplied,
        format!("{type_name} {entity_id:?}: the command cannot be encoded in postcard: {error}"),
    )
}

/// The answer to a command that could not be forwarded: nothing was sent.
fn unreachable_region(type_name: &str, entity_id: &str, to: &Address, error: &str) -> AskFailure {
    AskFailure::new(
        FailureKind::Unavailable,
        AskOutcome::NotApplied,
        format!("{type_name} {entity_id:?}: cannot reach the region at {to}: {error}"),
    )
}

impl DirectPath {
    /// Forwards a command of this node's caller to the region at `to`; its answer will go to
    /// `reply`, registered under the returned reply id before the frame leaves (the router
    /// may get the answer at once). When the frame cannot be sent, gives `reply` back with
    /// the failure (always, as nothing else removes a waiter whose frame never left).
    fn forward(
        &self,
        to: &Address,
        shard: ShardId,
        entity_id: &str,
        payload: Payload,
        reply: oneshot::Sender<Answer>,
    ) -> Result<u64, (AskFailure, Option<oneshot::Sender<Answer>>)> {
        // Encoded here, once, as the command leaves the node; nothing was sent if it fails.
        let payload = match payload.into_bytes() {
            Ok(bytes) => bytes,
            Err(error) => {
                return Err((
                    unencodable_command(&self.type_name, entity_id, &error),
                    Some(reply),
                ));
            }
        };
        let reply_id = self.next_reply_id.fetch_add(1, Ordering::Relaxed);
        lock_waiting(&self.waiting).insert(reply_id, reply);
        let frame = ShardingFrame::Forward {
            type_name: self.type_name.clone(),
            shard,
            ask: RemoteAsk {
                entity_id: entity_id.to_string(),
                payload,
                message_version: self.message_version,
                reply_to: self.self_address.clone(),
                reply_id,
            },
        };
        match (self.send)(to, &frame) {
            Ok(()) => Ok(reply_id),
            Err(error) => {
                let failure = unreachable_region(&self.type_name, entity_id, to, &error);
                Err((failure, lock_waiting(&self.waiting).remove(&reply_id)))
            }
        }
    }

    /// The routes, unless a region task panicked while changing them: then none are used.
    fn read(&self) -> Option<std::sync::RwLockReadGuard<'_, HashMap<ShardId, DirectRoute>>> {
        self.routes.read().ok()
    }
}

type CoordinatorRoutes = Arc<Mutex<HashMap<String, (u64, mpsc::Sender<CoordinatorInput>)>>>;

/// This node's callers waiting for an answer from another node, by reply id.
type Waiting = Arc<Mutex<HashMap<u64, oneshot::Sender<Answer>>>>;

/// Forgets the reply slot of an ask this node's caller forwarded itself (past the region
/// task, whose deadlines forget its own) when the ask ends in any way: answered, timed out,
/// or dropped by its caller. Without it a caller that gave up on an ask whose reply never
/// comes would leave the slot for good.
struct ForgetReply {
    /// None once answered: there is nothing left to forget.
    waiting: Option<Waiting>,
    reply_id: u64,
}

impl ForgetReply {
    /// The answer came: whoever sent it took the slot out of the map already (the router,
    /// or a clean-up that dropped it), so there is nothing to forget.
    fn answered(mut self) {
        self.waiting = None;
    }
}

impl Drop for ForgetReply {
    fn drop(&mut self) {
        if let Some(waiting) = &self.waiting {
            lock_waiting(waiting).remove(&self.reply_id);
        }
    }
}

fn lock_waiting(
    waiting: &Waiting,
) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<Answer>>> {
    waiting.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sends a sharding frame to a node (the router's way to answer a command it delivered).
type SendFrame = Arc<dyn Fn(&Address, &ShardingFrame) -> Result<(), String> + Send + Sync>;

/// What the router needs of a type's region.
struct RegionRoute {
    inputs: mpsc::Sender<RegionInput>,
    direct: Arc<DirectPath>,
}

/// The node's sharding runtime. See the module documentation.
pub struct Sharding<T: Transport> {
    transport: Arc<T>,
    regions: BTreeMap<String, RegionHandle>,
    /// The coordinators' singletons, taken by [`Sharding::stop`].
    singletons: Mutex<Vec<ClusterSingleton>>,
    settings: RuntimeSettings,
    counters: Arc<ShardingCounters>,
    shutdown: CancellationToken,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl<T: Transport> Sharding<T> {
    /// Registers [`services::SHARDING`], starts a region per type and each type's coordinator
    /// singleton (`singletons` is the node's singleton service).
    pub fn start(
        transport: Arc<T>,
        membership: watch::Receiver<ClusterSnapshot>,
        singletons: &Singletons<T>,
        types: Vec<ShardedType>,
        settings: RuntimeSettings,
    ) -> Result<Self, ShardingStartError> {
        let mut names = BTreeSet::new();
        for sharded in &types {
            sharded.settings.validate()?;
            if !names.insert(sharded.type_name.clone()) {
                return Err(ShardingStartError::Duplicate(sharded.type_name.clone()));
            }
        }
        let inbound = transport.register(services::SHARDING, SERVICE_QUEUE_CAPACITY)?;
        let counters = Arc::new(ShardingCounters::default());
        let shutdown = CancellationToken::new();
        let coordinators: CoordinatorRoutes = Arc::new(Mutex::new(HashMap::new()));
        let send: SendFrame = {
            let transport = transport.clone();
            Arc::new(move |to: &Address, frame: &ShardingFrame| send_frame(&*transport, to, frame))
        };
        let mut regions = BTreeMap::new();
        let mut region_inputs = HashMap::new();
        let mut started = Vec::new();
        let mut tasks = Vec::new();
        for sharded in types {
            let singleton_settings = SingletonSettings {
                role: sharded.role.clone(),
                removal_margin: settings.coordinator_removal_margin,
                ..SingletonSettings::default()
            };
            let (coordinator_gauges_tx, coordinator_gauges) =
                watch::channel(CoordinatorGauges::default());
            let coordinator_gauges_tx = Arc::new(coordinator_gauges_tx);
            let factory = {
                let type_name = sharded.type_name.clone();
                let settings = sharded.settings.clone();
                let store = sharded.store.clone();
                let remember = sharded.remember.as_ref().map(|r| r.store.clone());
                let transport = transport.clone();
                let membership = membership.clone();
                let coordinators = coordinators.clone();
                let gauges = coordinator_gauges_tx.clone();
                move |context: InstanceContext| {
                    let task = CoordinatorTask {
                        type_name: type_name.clone(),
                        settings: settings.clone(),
                        store: store.clone(),
                        remember: remember.clone(),
                        transport: transport.clone(),
                        membership: membership.clone(),
                        coordinators: coordinators.clone(),
                        gauges: gauges.clone(),
                    };
                    tokio::spawn(task.run(context))
                }
            };
            let singleton = singletons
                .start_singleton(
                    &coordinator_singleton_name(&sharded.type_name),
                    singleton_settings,
                    factory,
                )
                .map_err(|source| ShardingStartError::Singleton {
                    type_name: sharded.type_name.clone(),
                    source,
                })?;
            let (inputs_tx, inputs_rx) = mpsc::channel(INPUT_QUEUE_CAPACITY);
            let (gauges_tx, gauges) = watch::channel(RegionGauges::default());
            let self_id = transport.local().clone();
            let hosts = sharded.host.is_some();
            let (remember_store, notes) = match sharded.remember {
                Some(setup) => (Some(setup.store), Some(setup.notes)),
                None => (None, None),
            };
            let direct = Arc::new(DirectPath {
                type_name: sharded.type_name.clone(),
                host: sharded.host.clone(),
                shards: sharded.settings.shard_map(),
                message_version: sharded.message_version,
                routes: std::sync::RwLock::new(HashMap::new()),
                queued_asks: AtomicU64::new(0),
                queued_forwards: AtomicU64::new(0),
                self_address: transport.local().address.clone(),
                send: send.clone(),
                waiting: Waiting::default(),
                next_reply_id: AtomicU64::new(rand::random()),
            });
            let task = RegionTask {
                type_name: sharded.type_name.clone(),
                region: ShardRegion::new(sharded.settings.clone(), self_id, hosts),
                host: sharded.host,
                direct: direct.clone(),
                shards: sharded.settings.shard_map(),
                handoff_timeout: sharded.settings.handoff_timeout,
                ask_timeout: settings.ask_timeout,
                transport: transport.clone(),
                deadlines: VecDeque::new(),
                shard_generations: HashMap::new(),
                remembered_reads: HashMap::new(),
                passivated_during_read: HashMap::new(),
                inputs: inputs_tx.clone(),
                gauges: gauges_tx,
                shutdown_waiters: Vec::new(),
                counters: counters.clone(),
                remember: remember_store,
                remember_pending: BTreeMap::new(),
                remember_writing: BTreeSet::new(),
                remembered_skipped: Vec::new(),
                stops_awaiting_remember: BTreeMap::new(),
                stops_began: HashMap::new(),
                unsupported: None,
            };
            tasks.push(tokio::spawn(task.run(
                inputs_rx,
                notes,
                membership.clone(),
                singleton.watch_status(),
                shutdown.child_token(),
            )));
            region_inputs.insert(
                sharded.type_name.clone(),
                RegionRoute {
                    inputs: inputs_tx.clone(),
                    direct: direct.clone(),
                },
            );
            regions.insert(
                sharded.type_name,
                RegionHandle {
                    inputs: inputs_tx,
                    gauges,
                    coordinator_gauges,
                    hosts,
                    direct,
                },
            );
            started.push(singleton);
        }
        let router = Router {
            self_uid: transport.local().uid,
            self_address: transport.local().address.clone(),
            regions: region_inputs,
            coordinators,
            counters: counters.clone(),
            send,
            version_warned: std::sync::atomic::AtomicBool::new(false),
        };
        tasks.push(tokio::spawn(router.run(inbound, shutdown.child_token())));
        Ok(Sharding {
            transport,
            regions,
            singletons: Mutex::new(started),
            settings,
            counters,
            shutdown,
            tasks: Mutex::new(tasks),
        })
    }

    /// The sharded types, sorted.
    pub fn type_names(&self) -> Vec<&str> {
        self.regions.keys().map(String::as_str).collect()
    }

    /// Whether this node hosts entities of `type_name` (false: a proxy, or not sharded).
    pub fn hosts(&self, type_name: &str) -> bool {
        self.regions.get(type_name).is_some_and(|r| r.hosts)
    }

    pub fn counters(&self) -> &ShardingCounters {
        &self.counters
    }

    /// Each region's gauges, by type.
    pub fn region_gauges(&self) -> Vec<(&str, RegionGauges)> {
        self.regions
            .iter()
            .map(|(name, r)| (name.as_str(), r.gauges.borrow().clone()))
            .collect()
    }

    /// Each type's coordinator gauges (running only on the coordinator's node).
    pub fn coordinator_gauges(&self) -> Vec<(&str, CoordinatorGauges)> {
        self.regions
            .iter()
            .map(|(name, r)| (name.as_str(), r.coordinator_gauges.borrow().clone()))
            .collect()
    }

    /// How many reply slots of asks this node forwarded for `type_name` are held: those its
    /// callers forwarded themselves until each ask ends; those the region task forwarded
    /// until their reply or their deadline (a little past the ask timeout).
    pub fn replies_awaited(&self, type_name: &str) -> Option<usize> {
        let region = self.regions.get(type_name)?;
        Some(lock_waiting(&region.direct.waiting).len())
    }

    /// Whether every region of this node is registered with its coordinator (readiness).
    pub fn all_registered(&self) -> bool {
        self.regions.values().all(|r| r.gauges.borrow().registered)
    }

    /// This node's region of `type_name`, through which its callers ask the type's entities
    /// wherever they run; None for a type this node does not shard.
    pub fn region(&self, type_name: &str) -> Option<RegionRef> {
        let region = self.regions.get(type_name)?;
        Some(RegionRef {
            inputs: region.inputs.clone(),
            direct: region.direct.clone(),
            counters: self.counters.clone(),
            ask_timeout: self.settings.ask_timeout,
        })
    }

    /// Sends `command` to entity `entity_id` of `type_name`, wherever its shard lives, and
    /// waits for the entity's answer (at most the ask timeout); see [`RegionRef::ask`]. A type
    /// this node does not shard is refused, naming the types it does.
    pub fn ask(
        &self,
        type_name: &str,
        entity_id: &str,
        command: Payload,
    ) -> BoxFuture<'static, Result<Payload, AskFailure>> {
        match self.region(type_name) {
            Some(region) => region.ask(entity_id, command).boxed(),
            None => {
                let failure = self.unknown_type(type_name);
                futures::future::ready(Err(failure)).boxed()
            }
        }
    }

    /// The refusal of a command for a type this node does not shard.
    pub fn unknown_type(&self, type_name: &str) -> AskFailure {
        AskFailure::new(
            FailureKind::BadRequest,
            AskOutcome::NotApplied,
            format!(
                "unknown entity type {type_name:?}: this node shards {}",
                self.type_names().join(", ")
            ),
        )
    }

    /// This node's shards of `type_name` and their live entities.
    pub async fn region_state(&self, type_name: &str) -> Option<RegionSnapshot> {
        let region = self.regions.get(type_name)?;
        let (reply, answer) = oneshot::channel();
        region.inputs.try_send(RegionInput::State(reply)).ok()?;
        tokio::time::timeout(self.settings.ask_timeout, answer)
            .await
            .ok()?
            .ok()
    }

    /// Every region's shards of `type_name` with their entity counts, by member; members
    /// that did not answer within `timeout` are listed as failed.
    pub async fn cluster_state(
        &self,
        type_name: &str,
        members: Vec<Address>,
        timeout: Duration,
    ) -> Vec<(Address, Result<RegionSnapshot, String>)> {
        let request = match wire::encode(&ShardingFrame::RegionState {
            type_name: type_name.to_string(),
        }) {
            Ok(bytes) => Bytes::from(bytes),
            Err(e) => {
                return members
                    .into_iter()
                    .map(|m| (m, Err(e.to_string())))
                    .collect();
            }
        };
        let asks = members.into_iter().map(|member| {
            let transport = self.transport.clone();
            let request = request.clone();
            async move {
                let answer = transport
                    .request(&member, services::SHARDING, SHARDING_LANE, request, timeout)
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|bytes| {
                        wire::decode::<RegionSnapshot>(&bytes).map_err(|e| e.to_string())
                    });
                (member, answer)
            }
        });
        futures::future::join_all(asks).await
    }

    /// Hands off every shard of this node's regions (graceful shutdown) and resolves once
    /// the coordinators confirmed none is left here, or after `timeout`. Returns whether all
    /// regions completed.
    pub async fn hand_off_all(&self, timeout: Duration) -> bool {
        let mut waits = Vec::new();
        for region in self.regions.values() {
            let (done, wait) = oneshot::channel();
            if region
                .inputs
                .send(RegionInput::BeginShutdown(done))
                .await
                .is_ok()
            {
                waits.push(wait);
            }
        }
        tokio::time::timeout(timeout, futures::future::join_all(waits))
            .await
            .is_ok_and(|results| results.iter().all(Result::is_ok))
    }

    /// Stops the regions, the coordinators and the router (leave the cluster first).
    pub async fn stop(&self) {
        self.shutdown.cancel();
        // The coordinators first (a coordinator stops with its manager, after what it was
        // writing), then the regions and the router.
        let singletons =
            std::mem::take(&mut *self.singletons.lock().unwrap_or_else(|e| e.into_inner()));
        for singleton in singletons {
            singleton.stop().await;
        }
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        for task in tasks {
            let _ = task.await;
        }
    }
}

/// A node's region of one entity type, as its callers use it: cheap to clone, and bound to
/// the type, so an ask looks nothing up by name.
#[derive(Clone)]
pub struct RegionRef {
    inputs: mpsc::Sender<RegionInput>,
    direct: Arc<DirectPath>,
    counters: Arc<ShardingCounters>,
    ask_timeout: Duration,
}

impl RegionRef {
    /// The entity type.
    pub fn type_name(&self) -> &str {
        &self.direct.type_name
    }

    /// Sends `command` to entity `entity_id`, wherever its shard lives, and waits for the
    /// entity's answer (at most the ask timeout): local when the command stayed on this node,
    /// encoded when it crossed to another.
    ///
    /// The command is routed when this is called, not when the future is first polled:
    /// queued on this node's entity host, sent to the region of another node, or queued for
    /// this node's region task. So a caller that drops the future without polling it (a
    /// fire-and-forget tell) has still sent the command, and the order of a caller's commands
    /// is the order of its calls.
    pub fn ask(
        &self,
        entity_id: &str,
        command: Payload,
    ) -> impl Future<Output = Result<Payload, AskFailure>> + Send + 'static + use<> {
        let timeout = self.ask_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let routed = self.route(entity_id, command);
        let direct = self.direct.clone();
        let entity_id = entity_id.to_string();
        async move {
            let timed_out = || Err(ask_timed_out(&direct.type_name, &entity_id, timeout));
            let (answer, forget) = match routed {
                Routed::Host(answer) => {
                    return tokio::time::timeout_at(deadline, answer)
                        .await
                        .unwrap_or_else(|_| timed_out());
                }
                Routed::Failed(failure) => return Err(failure),
                Routed::Waiting(answer, forget) => (answer, forget),
            };
            let answer = tokio::time::timeout_at(deadline, answer).await;
            if let (Ok(_), Some(forget)) = (&answer, forget) {
                forget.answered();
            }
            match answer {
                Ok(Ok(Answer::Ready(result))) => result,
                Ok(Ok(Answer::Pending(answer))) => tokio::time::timeout_at(deadline, answer)
                    .await
                    .unwrap_or_else(|_| timed_out()),
                // The region dropped it without an answer: it may have been delivered.
                Ok(Err(_)) => Err(AskFailure::new(
                    FailureKind::Timeout,
                    AskOutcome::Unknown,
                    format!(
                        "the {} region stopped while the command was under way",
                        direct.type_name
                    ),
                )),
                Err(_) => timed_out(),
            }
        }
    }

    /// Sends `command` to entity `entity_id` without waiting for its answer: routed as
    /// [`RegionRef::ask`] routes it, and its answer dropped. A refusal on the spot (an invalid
    /// id the direct path sees, a full queue, a region stopping) is returned: then nothing was
    /// sent.
    pub fn tell(&self, entity_id: &str, command: Payload) -> Result<(), AskFailure> {
        // Refused here rather than by the region task, whose answer nobody would hear.
        if let Err(error) = EntityId::new(entity_id) {
            return Err(AskFailure::new(
                FailureKind::BadRequest,
                AskOutcome::NotApplied,
                error.to_string(),
            ));
        }
        match self.route(entity_id, command) {
            Routed::Failed(failure) => Err(failure),
            // The host queues at once: a command it refused (a full queue, a stopping host)
            // has its answer ready on the first poll.
            Routed::Host(answer) => match answer.now_or_never() {
                Some(Err(failure)) if failure.outcome == AskOutcome::NotApplied => Err(failure),
                _ => Ok(()),
            },
            Routed::Waiting(..) => Ok(()),
        }
    }

    /// Routes a command at once (see [`RegionRef::ask`]): the direct path when it takes it
    /// (see [`DirectPath`]), else the region task's queue.
    fn route(&self, entity_id: &str, command: Payload) -> Routed {
        let direct = &self.direct;
        let command = match Self::route_direct(direct, entity_id, command) {
            Direct::Local(answer) => {
                ShardingCounters::incr(&self.counters.asks_direct);
                return Routed::Host(answer);
            }
            Direct::Failed(failure) => return Routed::Failed(failure),
            Direct::Remote(answer, reply_id) => {
                ShardingCounters::incr(&self.counters.asks_direct);
                ShardingCounters::incr(&self.counters.forwards_sent);
                let forget = ForgetReply {
                    waiting: Some(direct.waiting.clone()),
                    reply_id,
                };
                return Routed::Waiting(answer, Some(forget));
            }
            Direct::NotTaken(command) => command,
        };
        let (reply, answer) = oneshot::channel();
        direct.queued_asks.fetch_add(1, Ordering::SeqCst);
        let queued = self.inputs.try_send(RegionInput::Ask {
            entity_id: entity_id.to_string(),
            payload: command,
            reply,
        });
        match queued {
            Ok(()) => Routed::Waiting(answer, None),
            Err(e) => {
                direct.queued_asks.fetch_sub(1, Ordering::SeqCst);
                Routed::Failed(match e {
                    mpsc::error::TrySendError::Full(_) => AskFailure::new(
                        FailureKind::Overloaded,
                        AskOutcome::NotApplied,
                        format!(
                            "the {} region's queue is full ({INPUT_QUEUE_CAPACITY} inputs)",
                            direct.type_name
                        ),
                    ),
                    mpsc::error::TrySendError::Closed(_) => stopping(&direct.type_name),
                })
            }
        }
    }

    /// Offers a command to the direct path (see [`DirectPath`]): queued on the entity host
    /// when its shard runs here and takes this node's callers, forwarded when its home is
    /// another known region, in both cases only when no earlier ask of this node waits in the
    /// region task; otherwise given back for the region task.
    fn route_direct(direct: &DirectPath, entity_id: &str, command: Payload) -> Direct {
        let Ok(id) = EntityId::new(entity_id) else {
            // The region task answers with the reason.
            return Direct::NotTaken(command);
        };
        let shard = direct.shards.shard_of(&id);
        let Some(routes) = direct.read() else {
            return Direct::NotTaken(command);
        };
        if direct.queued_asks.load(Ordering::SeqCst) != 0 {
            return Direct::NotTaken(command);
        }
        match (routes.get(&shard), &direct.host) {
            (Some(DirectRoute::Local), Some(host)) => Direct::Local(host.ask(entity_id, command)),
            (Some(DirectRoute::Remote(home)), _) => {
                let (reply, answer) = oneshot::channel();
                match direct.forward(home, shard, entity_id, command, reply) {
                    Ok(reply_id) => Direct::Remote(answer, reply_id),
                    Err((failure, _)) => Direct::Failed(failure),
                }
            }
            _ => Direct::NotTaken(command),
        }
    }
}

/// Where a command went when it was routed.
enum Routed {
    /// Queued on this node's entity host: its answer.
    Host(BoxFuture<'static, Result<Payload, AskFailure>>),
    /// Refused at once: nothing was delivered.
    Failed(AskFailure),
    /// Forwarded by the caller itself (with the reply slot to forget when the ask ends) or
    /// queued for the region task: the answer comes here.
    Waiting(oneshot::Receiver<Answer>, Option<ForgetReply>),
}

/// The answer of an ask that got none within its timeout.
fn ask_timed_out(type_name: &str, entity_id: &str, timeout: Duration) -> AskFailure {
    AskFailure::new(
        FailureKind::Timeout,
        AskOutcome::Unknown,
        format!(
            "no reply from {type_name} {entity_id:?} within {} ms; the command may still be \
             carried out",
            timeout.as_millis()
        ),
    )
}

/// The current time on tokio's clock (which tests may pause), for the state machines.
fn clock_now() -> Instant {
    tokio::time::Instant::now().into_std()
}

fn stopping(type_name: &str) -> AskFailure {
    AskFailure::new(
        FailureKind::Unavailable,
        AskOutcome::NotApplied,
        format!("the {type_name} region is stopping"),
    )
}

/// Routes the node's inbound sharding frames to regions and coordinators.
struct Router {
    /// This node's incarnation: frames for a region of another one are dropped.
    self_uid: u64,
    /// Named in the refusals of forwarded commands.
    self_address: Address,
    regions: HashMap<String, RegionRoute>,
    coordinators: CoordinatorRoutes,
    counters: Arc<ShardingCounters>,
    send: SendFrame,
    /// Whether a frame of another release was logged already.
    version_warned: std::sync::atomic::AtomicBool,
}

impl Router {
    async fn run(self, mut inbound: mpsc::Receiver<Inbound>, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                message = inbound.recv() => match message {
                    Some(message) => self.route(message),
                    None => return,
                },
            }
        }
    }

    fn route(&self, inbound: Inbound) {
        let frame = match wire::decode::<ShardingFrame>(&inbound.payload) {
            Ok(frame) => frame,
            Err(error) => {
                ShardingCounters::incr(&self.counters.frames_malformed);
                if matches!(error, WireError::Version(_))
                    && !self.version_warned.swap(true, Ordering::Relaxed)
                {
                    // Another release's frames: every one of them is dropped, so it is said
                    // once, loudly (this release's sharding does not talk to older ones).
                    tracing::warn!(from = %inbound.from, %error, "a sharding frame of another release; every such frame is dropped");
                } else {
                    tracing::debug!(from = %inbound.from, %error, "malformed sharding frame");
                }
                return;
            }
        };
        let from = inbound.from;
        if let ShardingFrame::ToCoordinator { type_name, message } = frame {
            let route = self
                .coordinators
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&type_name)
                .map(|(_, tx)| tx.clone());
            match route {
                Some(tx) => {
                    if tx
                        .try_send(CoordinatorInput::Message { from, message })
                        .is_err()
                    {
                        ShardingCounters::incr(&self.counters.frames_dropped);
                    }
                }
                None => {
                    ShardingCounters::incr(&self.counters.frames_unrouted);
                    if !self.regions.contains_key(&type_name) {
                        // The sender takes this node for its type's coordinator, but this node
                        // does not register the type: the sender's region would wait for ever.
                        // It is told why, naming this node and the types it registers.
                        let mut known: Vec<&str> =
                            self.regions.keys().map(String::as_str).collect();
                        known.sort_unstable();
                        let reason = format!(
                            "the node at {} does not register entity type {type_name:?} (it \
                             registers {}): every node of a cluster must register the same types",
                            self.self_address,
                            if known.is_empty() {
                                "none".to_string()
                            } else {
                                known.join(", ")
                            }
                        );
                        let refusal = ShardingFrame::Unsupported { type_name, reason };
                        if let Err(error) = (self.send)(&from.address, &refusal) {
                            tracing::debug!(%error, "an unsupported-type answer was not sent");
                        }
                    }
                }
            }
            return;
        }
        let Some((type_key, region)) = self.regions.get_key_value(frame.type_name()) else {
            ShardingCounters::incr(&self.counters.frames_unrouted);
            if let ShardingFrame::Forward { type_name, ask, .. } = frame {
                // Never delivered: its caller hears why now rather than at its timeout.
                // The sender shards the type and placed the shard here: the nodes disagree
                // (this one restarted without the type, say) until the coordinator moves it.
                let failure = AskFailure::new(
                    FailureKind::Unavailable,
                    AskOutcome::NotApplied,
                    format!(
                        "the node at {} does not shard entity type {type_name:?}",
                        self.self_address
                    ),
                );
                self.refuse(&type_name, ask, failure);
            }
            return;
        };
        let input = match frame {
            ShardingFrame::Forward { type_name, ask, .. }
                if ask.message_version != region.direct.message_version =>
            {
                // Decoded under another version it would be misread: refused, naming both.
                // A mismatch of releases (an upgrade under way), not of the caller's making.
                let failure = AskFailure::new(
                    FailureKind::Unavailable,
                    AskOutcome::NotApplied,
                    format!(
                        "entity type {type_name:?}: {from} sent a command encoded under message \
                         version {}, but the node at {} reads version {}; every node must run \
                         a release of the type that reads the other's messages",
                        ask.message_version, self.self_address, region.direct.message_version
                    ),
                );
                tracing::warn!("{}", failure.message);
                self.refuse(&type_name, ask, failure);
                return;
            }
            ShardingFrame::Forward {
                type_name,
                shard,
                ask,
            } => match self.forward_direct(region, &type_name, shard, ask) {
                Ok(()) => return,
                Err(ask) => {
                    region.direct.queued_forwards.fetch_add(1, Ordering::SeqCst);
                    RegionInput::Forward { from, shard, ask }
                }
            },
            ShardingFrame::Reply {
                reply_id, result, ..
            } => {
                match lock_waiting(&region.direct.waiting).remove(&reply_id) {
                    Some(waiter) => {
                        let _ = waiter.send(Answer::Ready(result.map(Payload::Encoded)));
                    }
                    None => ShardingCounters::incr(&self.counters.replies_late),
                }
                return;
            }
            ShardingFrame::ToRegion { to_uid, .. } if to_uid != self.self_uid => {
                ShardingCounters::incr(&self.counters.frames_unrouted);
                tracing::debug!(%from, to_uid, "sharding frame for an earlier incarnation of this node dropped");
                return;
            }
            ShardingFrame::ToRegion { message, .. } => {
                RegionInput::FromCoordinator { from, message }
            }
            ShardingFrame::Marker { shard, handoff, .. } => RegionInput::Marker {
                from,
                shard,
                handoff,
            },
            ShardingFrame::RegionState { .. } => match inbound.reply {
                Some(responder) => RegionInput::RemoteState(responder),
                None => return,
            },
            ShardingFrame::Unsupported { reason, .. } => RegionInput::Unsupported { from, reason },
            ShardingFrame::ToCoordinator { .. } => return,
        };
        if let Err(error) = region.inputs.try_send(input) {
            ShardingCounters::incr(&self.counters.frames_dropped);
            let (failure, input) = match error {
                mpsc::error::TrySendError::Full(input) => (
                    AskFailure::new(
                        FailureKind::Overloaded,
                        AskOutcome::NotApplied,
                        format!(
                            "the {type_key} region's queue on {} is full \
                             ({INPUT_QUEUE_CAPACITY} inputs)",
                            self.self_address
                        ),
                    ),
                    input,
                ),
                mpsc::error::TrySendError::Closed(input) => (
                    AskFailure::new(
                        FailureKind::Unavailable,
                        AskOutcome::NotApplied,
                        format!("the {type_key} region on {} is stopping", self.self_address),
                    ),
                    input,
                ),
            };
            if let RegionInput::Forward { ask, .. } = input {
                region.direct.queued_forwards.fetch_sub(1, Ordering::SeqCst);
                // Never delivered: its caller hears why now rather than at its timeout.
                self.refuse(type_key, ask, failure);
            }
        }
    }

    /// Answers a forwarded command that was not delivered with `failure`.
    fn refuse(&self, type_name: &str, ask: RemoteAsk, failure: AskFailure) {
        send_reply(
            &self.send,
            &self.counters,
            &ask.reply_to,
            type_name.to_string(),
            ask.reply_id,
            Err(failure),
        );
    }

    /// Queues a command another region forwarded on the entity host at once when its shard
    /// runs here and takes callers directly, and no earlier forwarded command waits in the
    /// region task (see [`DirectPath`]); the answer goes back from a task of its own.
    /// Otherwise gives the command back for the region task.
    fn forward_direct(
        &self,
        region: &RegionRoute,
        type_name: &str,
        shard: ShardId,
        ask: RemoteAsk,
    ) -> Result<(), RemoteAsk> {
        let direct = &region.direct;
        let Some(host) = &direct.host else {
            return Err(ask);
        };
        // A shard that is not this entity's here is the region task's to refuse.
        let ours = EntityId::new(&ask.entity_id).map(|id| direct.shards.shard_of(&id));
        if ours.ok() != Some(shard) {
            return Err(ask);
        }
        let Some(routes) = direct.read() else {
            return Err(ask);
        };
        if direct.queued_forwards.load(Ordering::SeqCst) != 0
            || routes.get(&shard) != Some(&DirectRoute::Local)
        {
            return Err(ask);
        }
        let RemoteAsk {
            entity_id,
            payload,
            reply_to,
            reply_id,
            ..
        } = ask;
        let answer = host.ask(&entity_id, Payload::Encoded(payload));
        drop(routes);
        ShardingCounters::incr(&self.counters.asks_direct);
        let send = self.send.clone();
        let counters = self.counters.clone();
        let type_name = type_name.to_string();
        tokio::spawn(async move {
            let result = answer.await;
            send_reply(&send, &counters, &reply_to, type_name, reply_id, result);
        });
        Ok(())
    }
}

/// Sends the reply (or refusal) of a command a caller at `to` forwarded. One that cannot be
/// encoded or handed to the transport is counted: that caller ends at its ask timeout.
fn send_reply(
    send: &SendFrame,
    counters: &ShardingCounters,
    to: &Address,
    type_name: String,
    reply_id: u64,
    result: Result<Payload, AskFailure>,
) {
    // The entity's answer is encoded here, once, as it leaves for its caller's node (a host
    // answers a command from another node encoded already).
    let result = result.and_then(|answer| {
        answer.into_bytes().map_err(|error| {
            AskFailure::new(
                FailureKind::Internal,
                AskOutcome::Unknown,
                format!("the entity's answer cannot be encoded in postcard: {error}"),
            )
        })
    });
    let frame = ShardingFrame::Reply {
        type_name,
        reply_id,
        result,
    };
    if let Err(error) = send(to, &frame) {
        ShardingCounters::incr(&counters.replies_unsent);
        tracing::debug!(%to, %error, "a sharding reply was not sent");
    }
}

fn send_frame<T: Transport>(
    transport: &T,
    to: &Address,
    frame: &ShardingFrame,
) -> Result<(), String> {
    let bytes = wire::encode(frame).map_err(|e| e.to_string())?;
    transport
        .send(to, services::SHARDING, SHARDING_LANE, Bytes::from(bytes))
        .map_err(|e| e.to_string())
}

/// Members not removed, any status: regions elsewhere are gone.
fn live_members(snapshot: &ClusterSnapshot) -> BTreeSet<UniqueAddress> {
    snapshot
        .members
        .iter()
        .filter(|m| m.status != MemberStatus::Removed)
        .map(|m| m.unique_address.clone())
        .collect()
}

/// Remembered-entity changes of one shard not stored yet.
#[derive(Default)]
struct RememberChanges {
    started: BTreeSet<String>,
    stopped: BTreeSet<String>,
}

impl RememberChanges {
    fn start(&mut self, id: String) {
        self.stopped.remove(&id);
        self.started.insert(id);
    }

    fn stop(&mut self, id: String) {
        self.started.remove(&id);
        self.stopped.insert(id);
    }

    /// Adds `later` after these changes.
    fn then(&mut self, later: RememberChanges) {
        for id in later.started {
            self.start(id);
        }
        for id in later.stopped {
            self.stop(id);
        }
    }

    fn is_empty(&self) -> bool {
        self.started.is_empty() && self.stopped.is_empty()
    }
}

struct RegionTask<T: Transport> {
    type_name: String,
    region: ShardRegion<Pending>,
    host: Option<Arc<dyn ShardHost>>,
    direct: Arc<DirectPath>,
    shards: ShardMap,
    handoff_timeout: Duration,
    ask_timeout: Duration,
    transport: Arc<T>,
    deadlines: VecDeque<(Instant, u64)>,
    /// Bumped each time a local shard starts or stops: a read of remembered entities started
    /// for one incarnation of the shard is ignored by any other.
    shard_generations: HashMap<ShardId, u64>,
    /// The read of remembered entities of each local shard that has not answered yet,
    /// cancelled when the shard stops or starts again: it is retried until then.
    remembered_reads: HashMap<ShardId, CancellationToken>,
    /// Entities of each shard whose read of remembered entities is in flight that passivated
    /// meanwhile: the read may have been answered before their stop was stored, and must not
    /// bring them back.
    passivated_during_read: HashMap<ShardId, HashSet<String>>,
    inputs: mpsc::Sender<RegionInput>,
    gauges: watch::Sender<RegionGauges>,
    shutdown_waiters: Vec<oneshot::Sender<()>>,
    counters: Arc<ShardingCounters>,
    remember: Option<Arc<dyn RememberStore>>,
    /// Changes waiting to be written, per shard (one write in flight per shard).
    remember_pending: BTreeMap<ShardId, RememberChanges>,
    remember_writing: BTreeSet<ShardId>,
    /// Remembered entities the host could not take (full queues), as the inputs that
    /// offered them: offered again on the next tick. At most one per shard incarnation that
    /// read its entities, each no larger than the shard's remembered ids.
    remembered_skipped: Vec<RegionInput>,
    /// Shards whose entities stopped (for a handoff, a shutdown, or a home elsewhere) while
    /// remembered-entity changes of theirs were not stored yet, with the deadline of the
    /// wait: the shard is reported stopped once they are stored, so that its next home reads
    /// them (an entity started here just before the handoff is started there; one passivated
    /// here is not brought back by a late write). At the deadline, half the handoff timeout
    /// after the stop began, the shard is reported stopped anyway.
    stops_awaiting_remember: BTreeMap<ShardId, Instant>,
    /// When each shard's stop began (for the deadline above).
    stops_began: HashMap<ShardId, Instant>,
    /// Why the node taken for the coordinator's refused this region's type, and when that was
    /// last logged.
    unsupported: Option<(String, Instant)>,
}

impl<T: Transport> RegionTask<T> {
    async fn run(
        mut self,
        mut inputs: mpsc::Receiver<RegionInput>,
        mut notes: Option<mpsc::Receiver<EntityNote>>,
        mut membership: watch::Receiver<ClusterSnapshot>,
        mut singleton: watch::Receiver<SingletonStatus>,
        stop: CancellationToken,
    ) {
        let mut ticker = tokio::time::interval(TICK_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let snapshot = membership.borrow_and_update().clone();
        let status = singleton.borrow_and_update().clone();
        self.rerouting(|task| task.update_view(&snapshot, &status));
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                changed = membership.changed() => {
                    if changed.is_err() { break; }
                    let snapshot = membership.borrow_and_update().clone();
                    let status = singleton.borrow().clone();
                    self.rerouting(|task| task.update_view(&snapshot, &status));
                }
                changed = singleton.changed() => {
                    if changed.is_err() { break; }
                    let status = singleton.borrow_and_update().clone();
                    let snapshot = membership.borrow().clone();
                    self.rerouting(|task| task.update_view(&snapshot, &status));
                }
                input = inputs.recv() => match input {
                    Some(input) => {
                        self.take_after_notes(input, &mut notes);
                        // What queued meanwhile, before the gauges are published and the
                        // other sources polled again: under load that is once per batch.
                        for _ in 1..INPUT_BATCH {
                            match inputs.try_recv() {
                                Ok(input) => self.take_after_notes(input, &mut notes),
                                Err(_) => break,
                            }
                        }
                    }
                    None => break,
                },
                note = async {
                    match notes.as_mut() {
                        Some(notes) => notes.recv().await,
                        None => std::future::pending().await,
                    }
                } => match note {
                    Some(note) => self.note(note),
                    None => notes = None,
                },
                _ = ticker.tick() => {
                    self.rerouting(|task| {
                        let out = task.region.tick(clock_now());
                        task.outputs(out);
                    });
                    self.expire_waiting();
                    self.write_remembered();
                    self.expire_stop_waits();
                    for skipped in std::mem::take(&mut self.remembered_skipped) {
                        self.handle(skipped);
                    }
                }
            }
            self.publish();
        }
        self.close_direct();
    }

    /// Takes an input; a shard's stop only after the entity notes queued before it (inputs
    /// go first in the task's loop): an entity that started before its shard stopped is
    /// noted, and so written, before the shard is reported stopped.
    fn take_after_notes(
        &mut self,
        input: RegionInput,
        notes: &mut Option<mpsc::Receiver<EntityNote>>,
    ) {
        if matches!(input, RegionInput::ShardStopped(_))
            && let Some(receiver) = notes.as_mut()
        {
            while let Ok(note) = receiver.try_recv() {
                self.note(note);
            }
        }
        self.take(input);
    }

    /// Handles one input. Those that may change which shards take this node's callers
    /// directly are handled under the direct path's write lock, which is then brought up to
    /// date (see [`DirectPath`]); an ask handled here lets later ones go direct again.
    fn take(&mut self, input: RegionInput) {
        match input {
            RegionInput::ShardStopped(shard) => {
                let began = self.stops_began.remove(&shard);
                if self.remember_unsettled(shard) {
                    // Half the handoff timeout from the stop: the coordinator's own counts from
                    // before the stop began (from the start of the handoff), and a stop that
                    // reports past it is given up. A shard that restarts for messages that
                    // reached it while it stopped (and stops again) waits afresh.
                    let deadline = began.unwrap_or_else(clock_now) + self.handoff_timeout / 2;
                    if deadline > clock_now() {
                        self.stops_awaiting_remember.insert(shard, deadline);
                        self.write_remembered();
                        return;
                    }
                    self.warn_unstored(shard);
                }
                self.report_stopped(shard);
            }
            RegionInput::RememberWritten { shard, ref failed } => {
                let failed = failed.is_some();
                self.handle(input);
                self.settle_stop(shard, failed);
            }
            RegionInput::FromCoordinator { .. }
            | RegionInput::Marker { .. }
            | RegionInput::BeginShutdown(_) => self.rerouting(|task| task.handle(input)),
            RegionInput::Ask { .. } => {
                self.handle(input);
                self.direct.queued_asks.fetch_sub(1, Ordering::SeqCst);
            }
            RegionInput::Forward { .. } => {
                self.handle(input);
                self.direct.queued_forwards.fetch_sub(1, Ordering::SeqCst);
            }
            RegionInput::Remembered { .. }
            | RegionInput::State(_)
            | RegionInput::RemoteState(_)
            | RegionInput::Unsupported { .. } => self.handle(input),
        }
    }

    /// Runs `change` with the direct path closed, then opens it to the shards whose messages
    /// this node's callers may send on themselves.
    fn rerouting(&mut self, change: impl FnOnce(&mut Self)) {
        let direct = self.direct.clone();
        let mut routes = direct
            .routes
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        change(self);
        routes.clear();
        if self.host.is_some() {
            for &shard in self.region.local_shards() {
                if self.region.takes_local_callers(shard) {
                    routes.insert(shard, DirectRoute::Local);
                }
            }
        }
        for &shard in self.region.known_homes() {
            if let Some(home) = self.region.forwards_local_callers(shard) {
                routes.insert(shard, DirectRoute::Remote(home.address.clone()));
            }
        }
    }

    /// Closes the direct path for good: the region task is ending.
    fn close_direct(&self) {
        self.direct
            .routes
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    fn update_view(&mut self, snapshot: &ClusterSnapshot, singleton: &SingletonStatus) {
        let view = RegionView {
            members: live_members(snapshot),
            coordinator: singleton.oldest.clone(),
            self_joining: matches!(
                snapshot.self_status,
                None | Some(MemberStatus::Joining | MemberStatus::WeaklyUp)
            ),
        };
        let coordinator_before = self.region.coordinator().cloned();
        let out = self.region.membership(view, clock_now());
        if self.region.coordinator() != coordinator_before.as_ref() {
            // What the former coordinator's node said of the type no longer holds.
            self.unsupported = None;
        }
        self.outputs(out);
    }

    fn publish(&self) {
        let stats = self.region.stats();
        let gauges = RegionGauges {
            registered: self.region.is_registered(),
            shards: self.region.local_shard_count(),
            buffered: self.region.buffered(),
            handoffs: stats.handoffs,
            forwarded: stats.forwarded,
            delivered_local: stats.delivered_local,
            refused: stats.refused,
            unsupported: self
                .unsupported
                .as_ref()
                .filter(|_| !self.region.is_registered())
                .map(|(reason, _)| reason.clone()),
        };
        self.gauges.send_if_modified(|current| {
            if *current == gauges {
                false
            } else {
                *current = gauges;
                true
            }
        });
    }

    fn handle(&mut self, input: RegionInput) {
        let now = clock_now();
        match input {
            RegionInput::Ask {
                entity_id,
                payload,
                reply,
            } => {
                let id = match EntityId::new(&entity_id) {
                    Ok(id) => id,
                    Err(e) => {
                        let _ = reply.send(Answer::Ready(Err(AskFailure::new(
                            FailureKind::BadRequest,
                            AskOutcome::NotApplied,
                            e.to_string(),
                        ))));
                        return;
                    }
                };
                let shard = self.shards.shard_of(&id);
                let pending = Pending {
                    entity_id,
                    payload,
                    reply: ReplyTo::Local(reply),
                };
                let out = self.region.deliver(Origin::Local, shard, pending, now);
                self.outputs(out);
            }
            RegionInput::FromCoordinator { from, message } => {
                tracing::debug!(type_name = %self.type_name, %from, ?message, "from the coordinator");
                let out = self.region.from_coordinator(&from, message, now);
                self.outputs(out);
            }
            RegionInput::Forward { from, shard, ask } => {
                // The sender's shard for this entity must be ours: nodes configured with
                // different `number_of_shards` would run one entity under two shards.
                let ours = EntityId::new(&ask.entity_id)
                    .map(|id| self.shards.shard_of(&id))
                    .ok();
                if ours != Some(shard) {
                    let failure = AskFailure::new(
                        FailureKind::BadRequest,
                        AskOutcome::NotApplied,
                        format!(
                            "{} {:?} was sent for shard {shard}, but it belongs to shard {} \
                             here: do all nodes use the same number_of_shards ({})?",
                            self.type_name,
                            ask.entity_id,
                            ours.map_or_else(|| "none".to_string(), |s| s.to_string()),
                            self.shards.number_of_shards
                        ),
                    );
                    tracing::warn!(%from, "{}", failure.message);
                    self.reply(
                        ReplyTo::Remote {
                            to: ask.reply_to,
                            reply_id: ask.reply_id,
                        },
                        Err(failure),
                    );
                    return;
                }
                let pending = Pending {
                    entity_id: ask.entity_id,
                    payload: Payload::Encoded(ask.payload),
                    reply: ReplyTo::Remote {
                        to: ask.reply_to,
                        reply_id: ask.reply_id,
                    },
                };
                let out = self
                    .region
                    .deliver(Origin::Region(from), shard, pending, now);
                self.outputs(out);
            }
            RegionInput::Marker {
                from,
                shard,
                handoff,
            } => {
                let out = self.region.marker(from, shard, handoff);
                self.outputs(out);
            }
            RegionInput::ShardStopped(shard) => {
                let out = self.region.shard_stopped(shard, now);
                self.outputs(out);
            }
            RegionInput::Remembered {
                shard,
                generation,
                ids,
            } => {
                // Only for the incarnation of the shard that asked: one that stopped since (a
                // handoff) must not bring its entities back here.
                let current = self.shard_generations.get(&shard).copied().unwrap_or(0);
                let mut passivated = HashSet::new();
                if current == generation {
                    // Answered: nothing of this incarnation's read is left to cancel.
                    self.remembered_reads.remove(&shard);
                    passivated = self
                        .passivated_during_read
                        .remove(&shard)
                        .unwrap_or_default();
                }
                if current == generation
                    && self.region.is_active(shard)
                    && let Some(host) = &self.host
                    && !ids.is_empty()
                {
                    // Only valid ids are offered (and counted as started): any other came
                    // from a damaged or foreign remember store, and the host would drop it.
                    let (ids, invalid): (Vec<String>, Vec<String>) = ids
                        .into_iter()
                        .filter(|id| !passivated.contains(id))
                        .partition(|id| EntityId::new(id).is_ok());
                    if let Some(first) = invalid.first() {
                        tracing::warn!(
                            type_name = %self.type_name,
                            %shard,
                            count = invalid.len(),
                            first = ?first.chars().take(64).collect::<String>(),
                            "remembered entity ids that are not valid entity ids are not started"
                        );
                    }
                    let offered = ids.len();
                    let skipped = host.start_entities(ids);
                    self.counters.remembered_started.fetch_add(
                        offered.saturating_sub(skipped.len()) as u64,
                        Ordering::Relaxed,
                    );
                    if !skipped.is_empty() {
                        // The host's queues were full: offered again on the next tick, for
                        // this incarnation of the shard only (checked again then).
                        self.remembered_skipped.push(RegionInput::Remembered {
                            shard,
                            generation,
                            ids: skipped.into_iter().collect(),
                        });
                    }
                }
            }
            RegionInput::RememberWritten { shard, failed } => {
                self.remember_writing.remove(&shard);
                if let Some(mut changes) = failed {
                    // Retried on a later tick, before the changes noted since.
                    if let Some(later) = self.remember_pending.remove(&shard) {
                        changes.then(later);
                    }
                    self.remember_pending.insert(shard, changes);
                }
            }
            RegionInput::State(reply) => {
                let answer = self.snapshot();
                tokio::spawn(async move {
                    let _ = reply.send(answer.await);
                });
            }
            RegionInput::RemoteState(responder) => {
                let answer = self.snapshot();
                tokio::spawn(async move {
                    let snapshot = answer.await;
                    match wire::encode(&snapshot) {
                        Ok(bytes) => {
                            let _ = responder.respond(Bytes::from(bytes));
                        }
                        Err(_) => drop(responder),
                    }
                });
            }
            // Only from the node this region takes for its coordinator's now: an answer from
            // one it took before says nothing about the current one.
            RegionInput::Unsupported { from, .. } if self.region.coordinator() != Some(&from) => {}
            RegionInput::Unsupported { from, reason } => {
                let logged = self.unsupported.as_ref().map(|(_, at)| *at);
                if logged.is_none_or(|at| now.duration_since(at) >= UNSUPPORTED_LOG_INTERVAL) {
                    tracing::error!(type_name = %self.type_name, %from, "{reason}");
                    self.unsupported = Some((reason, now));
                }
            }
            RegionInput::BeginShutdown(done) => {
                self.shutdown_waiters.push(done);
                let out = self.region.begin_shutdown(now);
                self.outputs(out);
                if self.region.is_shutdown_complete() {
                    for waiter in self.shutdown_waiters.drain(..) {
                        let _ = waiter.send(());
                    }
                }
            }
        }
    }

    /// An entity started or passivated: noted for its shard's remembered ids.
    fn note(&mut self, note: EntityNote) {
        if self.remember.is_none() {
            return;
        }
        let (id, started) = match note {
            EntityNote::Started(id) => (id, true),
            EntityNote::Passivated(id) => (id, false),
        };
        let Ok(entity) = EntityId::new(&id) else {
            return;
        };
        let shard = self.shards.shard_of(&entity);
        // Every start is written, those of remembered entities too: the write puts back an
        // id a late stop of the shard's former home (or of its own earlier incarnation here)
        // took out after the read.
        if !started && self.remembered_reads.contains_key(&shard) {
            self.passivated_during_read
                .entry(shard)
                .or_default()
                .insert(id.clone());
        }
        let changes = self.remember_pending.entry(shard).or_default();
        if started {
            changes.start(id);
        } else {
            changes.stop(id);
        }
    }

    /// Whether remembered-entity changes of `shard` are noted but not stored yet.
    fn remember_unsettled(&self, shard: ShardId) -> bool {
        self.remember.is_some()
            && (self.remember_writing.contains(&shard)
                || self
                    .remember_pending
                    .get(&shard)
                    .is_some_and(|changes| !changes.is_empty()))
    }

    /// After a write of `shard`'s remembered entities: a shard waiting for it is reported
    /// stopped once nothing of it is left to store. Changes noted during the write go at
    /// once; a failed write is tried again on the tick.
    fn settle_stop(&mut self, shard: ShardId, failed: bool) {
        if !self.stops_awaiting_remember.contains_key(&shard) {
            return;
        }
        if self.remember_unsettled(shard) {
            if !failed {
                self.write_remembered();
            }
            return;
        }
        self.stops_awaiting_remember.remove(&shard);
        self.report_stopped(shard);
    }

    /// Tells the region state machine that `shard`'s entities stopped (under the direct
    /// path's write lock, as every input that may move a shard).
    fn report_stopped(&mut self, shard: ShardId) {
        self.rerouting(|task| task.handle(RegionInput::ShardStopped(shard)));
    }

    /// Reports stopped the shards whose remembered-entity changes could not be stored by
    /// their deadline: a handoff must not wait for a store that is down or slow until the
    /// coordinator gives it up. Their changes stay noted and are written when the store
    /// answers again.
    fn expire_stop_waits(&mut self) {
        let now = clock_now();
        let expired: Vec<ShardId> = self
            .stops_awaiting_remember
            .iter()
            .filter(|(_, deadline)| **deadline <= now)
            .map(|(shard, _)| *shard)
            .collect();
        for shard in expired {
            self.stops_awaiting_remember.remove(&shard);
            self.warn_unstored(shard);
            self.report_stopped(shard);
        }
    }

    fn warn_unstored(&self, shard: ShardId) {
        tracing::warn!(
            type_name = %self.type_name,
            %shard,
            "remembered-entity changes of a stopped shard not stored within half the handoff \
             timeout; the shard is reported stopped without them (its next home may not start \
             an entity that started here last)"
        );
    }

    /// Writes the noted changes of every shard that has no write in flight.
    fn write_remembered(&mut self) {
        let Some(store) = self.remember.clone() else {
            return;
        };
        let ready: Vec<ShardId> = self
            .remember_pending
            .keys()
            .filter(|s| !self.remember_writing.contains(*s))
            .copied()
            .collect();
        for shard in ready {
            let Some(changes) = self.remember_pending.remove(&shard) else {
                continue;
            };
            if changes.is_empty() {
                continue;
            }
            self.remember_writing.insert(shard);
            let write = store.update(
                shard,
                changes.started.iter().cloned().collect(),
                changes.stopped.iter().cloned().collect(),
            );
            let inputs = self.inputs.clone();
            let counters = self.counters.clone();
            let type_name = self.type_name.clone();
            tokio::spawn(async move {
                let failed = match write.await {
                    Ok(()) => {
                        ShardingCounters::incr(&counters.remember_writes);
                        None
                    }
                    Err(error) => {
                        ShardingCounters::incr(&counters.remember_write_failures);
                        tracing::debug!(type_name, %shard, %error, "remembered entities not written; retrying");
                        Some(changes)
                    }
                };
                let _ = inputs
                    .send(RegionInput::RememberWritten { shard, failed })
                    .await;
            });
        }
    }

    /// Reads the shard's remembered entities and hands them to the region task, which starts
    /// them if this incarnation of the shard still runs. A read the store cannot answer now
    /// ([`StoreError::Unavailable`]) is retried (waiting longer each time, up to
    /// [`REMEMBERED_READ_RETRY_MAX`]) until it is answered or the shard stops here:
    /// remembered entities must run again wherever their shard lands, however long the store
    /// is away (a whole cluster restarting, say). One it refuses for good
    /// ([`StoreError::Fatal`]) is given up with a warning.
    fn start_remembered(&mut self, shard: ShardId) {
        let generation = {
            let g = self.shard_generations.entry(shard).or_default();
            *g += 1;
            *g
        };
        let Some(store) = self.remember.clone() else {
            return;
        };
        if self.host.is_none() {
            return;
        }
        let cancelled = CancellationToken::new();
        if let Some(earlier) = self.remembered_reads.insert(shard, cancelled.clone()) {
            earlier.cancel();
        }
        self.passivated_during_read.remove(&shard);
        let inputs = self.inputs.clone();
        let type_name = self.type_name.clone();
        tokio::spawn(async move {
            let mut failures = 0u32;
            loop {
                let read = tokio::select! {
                    _ = cancelled.cancelled() => return,
                    _ = inputs.closed() => return,
                    read = store.entities(shard) => read,
                };
                match read {
                    Ok(ids) => {
                        let _ = inputs
                            .send(RegionInput::Remembered {
                                shard,
                                generation,
                                ids,
                            })
                            .await;
                        return;
                    }
                    Err(error @ StoreError::Fatal(_)) => {
                        // Never readable as it is (a damaged log, a key of another type, a
                        // newer owner of the log): reading again would not help. The empty
                        // answer ends the read for the region.
                        tracing::warn!(type_name, %shard, %error, "the shard's remembered entities cannot be read; they start on their next message");
                        let _ = inputs
                            .send(RegionInput::Remembered {
                                shard,
                                generation,
                                ids: BTreeSet::new(),
                            })
                            .await;
                        return;
                    }
                    Err(error) => {
                        failures = failures.saturating_add(1);
                        if failures == REMEMBERED_READ_WARN_AFTER {
                            tracing::warn!(type_name, %shard, failures, %error, "the shard's remembered entities cannot be read yet; still trying");
                        } else {
                            tracing::debug!(type_name, %shard, failures, %error, "cannot read the shard's remembered entities");
                        }
                    }
                }
                let wait = LOAD_RETRY_INTERVAL
                    .saturating_mul(failures)
                    .min(REMEMBERED_READ_RETRY_MAX);
                tokio::select! {
                    _ = cancelled.cancelled() => return,
                    _ = inputs.closed() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        });
    }

    /// The local shards with their live entities, computed off the task.
    fn snapshot(&self) -> BoxFuture<'static, RegionSnapshot> {
        let shards: BTreeSet<ShardId> = self.region.local_shards().copied().collect();
        let host = self.host.clone();
        let map = self.shards;
        async move {
            let mut by_shard: BTreeMap<ShardId, Vec<String>> =
                shards.iter().map(|s| (*s, Vec::new())).collect();
            if let Some(host) = host {
                for id in host.live_entity_ids().await {
                    if let Ok(entity) = EntityId::new(&id)
                        && let Some(ids) = by_shard.get_mut(&map.shard_of(&entity))
                    {
                        ids.push(id);
                    }
                }
            }
            for ids in by_shard.values_mut() {
                ids.sort();
            }
            RegionSnapshot {
                shards: by_shard.into_iter().collect(),
            }
        }
        .boxed()
    }

    fn expire_waiting(&mut self) {
        let now = clock_now();
        while let Some((deadline, reply_id)) = self.deadlines.front().copied() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_front();
            // The caller gave up at its own timeout; forget the slot.
            lock_waiting(&self.direct.waiting).remove(&reply_id);
        }
    }

    fn reply(&self, reply: ReplyTo, result: Result<Payload, AskFailure>) {
        match reply {
            ReplyTo::Local(tx) => {
                let _ = tx.send(Answer::Ready(result));
            }
            ReplyTo::Remote { to, reply_id } => send_reply(
                &self.direct.send,
                &self.counters,
                &to,
                self.type_name.clone(),
                reply_id,
                result,
            ),
        }
    }

    fn outputs(&mut self, outputs: Vec<RegionOutput<Pending>>) {
        for output in outputs {
            match output {
                RegionOutput::ToCoordinator(message) => {
                    let Some(coordinator) = self.region_coordinator() else {
                        continue;
                    };
                    let frame = ShardingFrame::ToCoordinator {
                        type_name: self.type_name.clone(),
                        message,
                    };
                    // Lost messages are repeated by the region's timers.
                    let _ = send_frame(&*self.transport, &coordinator.address, &frame);
                }
                RegionOutput::ToRegion { to, message } => match message {
                    BetweenRegions::Forward { shard, message } => {
                        self.forward(&to.address, shard, message);
                    }
                    BetweenRegions::HandOffMarker { shard, handoff } => {
                        let frame = ShardingFrame::Marker {
                            type_name: self.type_name.clone(),
                            shard,
                            handoff,
                        };
                        let _ = send_frame(&*self.transport, &to.address, &frame);
                    }
                },
                RegionOutput::DeliverLocal { message, .. } => self.deliver_local(message),
                RegionOutput::StartShard(shard) => self.start_remembered(shard),
                RegionOutput::StopShard(shard) => self.stop_shard(shard),
                RegionOutput::Refused { message, error } => {
                    let failure = AskFailure::new(
                        FailureKind::Overloaded,
                        AskOutcome::NotApplied,
                        format!("{} {:?}: {error}", self.type_name, message.entity_id),
                    );
                    self.reply(message.reply, Err(failure));
                }
                RegionOutput::ShutdownComplete => {
                    for waiter in self.shutdown_waiters.drain(..) {
                        let _ = waiter.send(());
                    }
                }
            }
        }
    }

    fn region_coordinator(&self) -> Option<UniqueAddress> {
        self.region.coordinator().cloned()
    }

    fn forward(&mut self, to: &Address, shard: ShardId, pending: Pending) {
        let Pending {
            entity_id,
            payload,
            reply,
        } = pending;
        ShardingCounters::incr(&self.counters.forwards_sent);
        match reply {
            ReplyTo::Local(tx) => {
                match self.direct.forward(to, shard, &entity_id, payload, tx) {
                    // Later than the caller's own timeout, so the caller hears a timeout
                    // (outcome unknown) rather than a dropped answer.
                    Ok(reply_id) => self.deadlines.push_back((
                        clock_now() + self.ask_timeout + Duration::from_secs(1),
                        reply_id,
                    )),
                    Err((failure, tx)) => {
                        if let Some(tx) = tx {
                            self.reply(ReplyTo::Local(tx), Err(failure));
                        }
                    }
                }
            }
            ReplyTo::Remote {
                to: reply_to,
                reply_id,
            } => {
                // A command from another region is bytes already: passed on as it came.
                let sent = payload.into_bytes().and_then(|payload| {
                    let frame = ShardingFrame::Forward {
                        type_name: self.type_name.clone(),
                        shard,
                        ask: RemoteAsk {
                            entity_id: entity_id.clone(),
                            payload,
                            message_version: self.direct.message_version,
                            reply_to: reply_to.clone(),
                            reply_id,
                        },
                    };
                    send_frame(&*self.transport, to, &frame)
                });
                if let Err(error) = sent {
                    let failure = unreachable_region(&self.type_name, &entity_id, to, &error);
                    self.reply(
                        ReplyTo::Remote {
                            to: reply_to,
                            reply_id,
                        },
                        Err(failure),
                    );
                }
            }
        }
    }

    fn deliver_local(&mut self, pending: Pending) {
        let Some(host) = self.host.clone() else {
            let failure = AskFailure::new(
                FailureKind::Unavailable,
                AskOutcome::NotApplied,
                format!("this node hosts no {} entities", self.type_name),
            );
            self.reply(pending.reply, Err(failure));
            return;
        };
        // Queued now, in the order the region delivers: a later stop of the shard lists and
        // stops its entities behind it.
        let answer = host.ask(&pending.entity_id, pending.payload);
        match pending.reply {
            ReplyTo::Local(tx) => {
                let _ = tx.send(Answer::Pending(answer));
            }
            ReplyTo::Remote { to, reply_id } => {
                let send = self.direct.send.clone();
                let counters = self.counters.clone();
                let type_name = self.type_name.clone();
                tokio::spawn(async move {
                    let result = answer.await;
                    send_reply(&send, &counters, &to, type_name, reply_id, result);
                });
            }
        }
    }

    /// Stops the shard's entities after their writes, then reports back to the region. The
    /// listing goes through the host's per-entity queues behind every command delivered so
    /// far, so each entity a command was delivered to is live by then and stopped. The shard
    /// is reported stopped only once they all stopped, however long that takes: reporting it
    /// earlier would let the coordinator start it elsewhere beside them.
    fn stop_shard(&mut self, shard: ShardId) {
        *self.shard_generations.entry(shard).or_default() += 1;
        if let Some(read) = self.remembered_reads.remove(&shard) {
            read.cancel();
        }
        self.passivated_during_read.remove(&shard);
        self.stops_began.insert(shard, clock_now());
        let inputs = self.inputs.clone();
        let Some(host) = self.host.clone() else {
            tokio::spawn(async move {
                let _ = inputs.send(RegionInput::ShardStopped(shard)).await;
            });
            return;
        };
        let shards = self.shards;
        let timeout = self.handoff_timeout;
        let type_name = self.type_name.clone();
        tokio::spawn(async move {
            let live: Vec<String> = host
                .live_entity_ids()
                .await
                .into_iter()
                .filter(|id| EntityId::new(id).is_ok_and(|e| shards.shard_of(&e) == shard))
                .collect();
            let stopped = host.stop_entities(live);
            tokio::pin!(stopped);
            tokio::select! {
                _ = &mut stopped => {}
                _ = tokio::time::sleep(timeout) => {
                    tracing::warn!(
                        type_name,
                        %shard,
                        ?timeout,
                        "the shard's entities have not stopped within the handoff timeout; still waiting"
                    );
                    stopped.await;
                }
            }
            let _ = inputs.send(RegionInput::ShardStopped(shard)).await;
        });
    }
}

struct CoordinatorTask<T: Transport> {
    type_name: String,
    settings: ShardingSettings,
    store: Arc<dyn CoordinatorStore>,
    remember: Option<Arc<dyn RememberStore>>,
    transport: Arc<T>,
    membership: watch::Receiver<ClusterSnapshot>,
    coordinators: CoordinatorRoutes,
    gauges: Arc<watch::Sender<CoordinatorGauges>>,
}

fn coordinator_view(snapshot: &ClusterSnapshot) -> MembershipView {
    let live = || {
        snapshot
            .members
            .iter()
            .filter(|m| m.status != MemberStatus::Removed)
    };
    MembershipView {
        members: live_members(snapshot),
        up: live()
            .filter(|m| m.status == MemberStatus::Up)
            .map(|m| m.unique_address.clone())
            .collect(),
        stable: snapshot.unreachable.is_empty() && live().all(|m| m.status == MemberStatus::Up),
    }
}

impl<T: Transport> CoordinatorTask<T> {
    async fn run(mut self, context: InstanceContext) {
        let route_id: u64 = rand::random();
        let (tx, mut inputs) = mpsc::channel(INPUT_QUEUE_CAPACITY);
        self.coordinators
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(self.type_name.clone(), (route_id, tx));
        tracing::info!(type_name = %self.type_name, "shard coordinator starting");
        let mut coordinator = ShardCoordinator::new(self.settings.clone(), rand::random());
        // Read the state, as long as it takes; the regions repeat what they ask meanwhile.
        let mut state = loop {
            tokio::select! {
                _ = context.stop.cancelled() => {
                    self.unregister(route_id);
                    return;
                }
                loaded = self.store.load() => match loaded {
                    Ok(state) => break state,
                    Err(error) => {
                        tracing::warn!(type_name = %self.type_name, %error, "cannot read the coordinator's state; retrying");
                        tokio::time::sleep(LOAD_RETRY_INTERVAL).await;
                    }
                },
            }
        };
        // Shards with remembered entities are allocated at once, also those a coordinator whose
        // state was lost (a full restart with its state in Distributed Data) never knew.
        if let Some(remember) = &self.remember {
            let remembered = loop {
                tokio::select! {
                    _ = context.stop.cancelled() => {
                        self.unregister(route_id);
                        return;
                    }
                    shards = remember.shards() => match shards {
                        Ok(shards) => break shards,
                        Err(error) => {
                            tracing::warn!(type_name = %self.type_name, %error, "cannot read the shards with remembered entities; retrying");
                            tokio::time::sleep(LOAD_RETRY_INTERVAL).await;
                        }
                    },
                }
            };
            let unallocated: BTreeSet<ShardId> = state
                .unallocated()
                .iter()
                .copied()
                .chain(remembered)
                .filter(|s| s.0 < self.settings.number_of_shards)
                .collect();
            state.set_unallocated(unallocated);
        }
        tracing::info!(
            type_name = %self.type_name,
            shards = state.shards().len(),
            regions = state.regions().len(),
            "shard coordinator read its state"
        );
        let now = clock_now();
        let view = coordinator_view(&self.membership.borrow_and_update());
        let mut out = coordinator.membership(view, now);
        out.extend(coordinator.state_loaded(state, now));
        let mut writing: Option<BoxFuture<'static, Result<(), StoreError>>> = None;
        self.outputs(&coordinator, out, &mut writing);
        self.publish(&coordinator, true);
        let mut ticker = tokio::time::interval(TICK_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut requests = context.requests;
        loop {
            let write = async {
                match writing.as_mut() {
                    Some(future) => future.await,
                    None => std::future::pending().await,
                }
            };
            let out = tokio::select! {
                biased;
                _ = context.stop.cancelled() => break,
                result = write => {
                    writing = None;
                    let now = clock_now();
                    match result {
                        Ok(()) => coordinator.write_done(now),
                        Err(StoreError::Unavailable(reason)) => {
                            tracing::debug!(type_name = %self.type_name, %reason, "coordinator state write failed; retrying");
                            coordinator.write_failed(false, &reason, now)
                        }
                        Err(StoreError::Fatal(reason)) => {
                            coordinator.write_failed(true, &reason, now)
                        }
                    }
                }
                changed = self.membership.changed() => {
                    if changed.is_err() { break; }
                    let view = coordinator_view(&self.membership.borrow_and_update());
                    coordinator.membership(view, clock_now())
                }
                input = inputs.recv() => match input {
                    Some(CoordinatorInput::Message { from, message }) => {
                        coordinator.receive(from, message, clock_now())
                    }
                    None => break,
                },
                // Sharding does not use the singleton's proxies; anything sent is refused.
                request = requests.recv() => match request {
                    Some(request) => { drop(request); Vec::new() }
                    None => Vec::new(),
                },
                _ = ticker.tick() => coordinator.tick(clock_now()),
            };
            self.outputs(&coordinator, out, &mut writing);
            self.publish(&coordinator, !coordinator.is_stopped());
            if coordinator.is_stopped() && writing.is_none() {
                break;
            }
        }
        self.unregister(route_id);
        self.publish(&coordinator, false);
        tracing::info!(type_name = %self.type_name, "shard coordinator stopped");
    }

    fn unregister(&self, route_id: u64) {
        let mut routes = self.coordinators.lock().unwrap_or_else(|e| e.into_inner());
        if routes
            .get(&self.type_name)
            .is_some_and(|(id, _)| *id == route_id)
        {
            routes.remove(&self.type_name);
        }
    }

    fn publish(&self, coordinator: &ShardCoordinator, running: bool) {
        let stats = coordinator.stats();
        let gauges = CoordinatorGauges {
            running,
            shards: coordinator.state().map_or(0, |s| s.shards().len()),
            regions: coordinator.state().map_or(0, |s| s.regions().len()),
            handoffs_completed: stats.handoffs_completed,
            handoffs_given_up: stats.handoffs_given_up,
            rebalance_rounds: stats.rebalance_rounds,
            writes: stats.writes,
            write_failures: stats.write_failures,
        };
        self.gauges.send_if_modified(|current| {
            if *current == gauges {
                false
            } else {
                *current = gauges;
                true
            }
        });
    }

    fn outputs(
        &self,
        coordinator: &ShardCoordinator,
        outputs: Vec<CoordinatorOutput>,
        writing: &mut Option<BoxFuture<'static, Result<(), StoreError>>>,
    ) {
        for output in outputs {
            match output {
                CoordinatorOutput::Send { to, message } => {
                    let frame = ShardingFrame::ToRegion {
                        type_name: self.type_name.clone(),
                        to_uid: to.uid,
                        message,
                    };
                    // Lost messages are repeated by the coordinator's or regions' timers.
                    let _ = send_frame(&*self.transport, &to.address, &frame);
                }
                CoordinatorOutput::Write(events) => {
                    tracing::debug!(type_name = %self.type_name, changes = events.len(), "coordinator state write");
                    let mut after = coordinator.state().cloned().unwrap_or_default();
                    for event in &events {
                        // The coordinator writes only changes that fit, in order.
                        let _ = after.apply(event);
                    }
                    *writing = Some(self.store.write(events, after));
                }
                CoordinatorOutput::Stop { reason } => {
                    tracing::error!(type_name = %self.type_name, %reason, "shard coordinator stops");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inbound_to_region(to_uid: u64) -> Inbound {
        let frame = ShardingFrame::ToRegion {
            type_name: "account".into(),
            to_uid,
            message: ToRegion::HostShard { shard: ShardId(3) },
        };
        Inbound {
            from: UniqueAddress::new(Address::new("10.0.0.2", 25520), 99),
            service: services::SHARDING,
            payload: Bytes::from(wire::encode(&frame).unwrap()),
            reply: None,
        }
    }

    /// The frames a router sent, with their destinations.
    type Sent = Arc<Mutex<Vec<(Address, ShardingFrame)>>>;

    /// A router of node uid 7 with an `account` region whose inputs queue holds `capacity`,
    /// and the frames it sends.
    fn account_router(capacity: usize) -> (Router, mpsc::Receiver<RegionInput>, Sent) {
        let (tx, rx) = mpsc::channel(capacity);
        let sent = Arc::new(Mutex::new(Vec::new()));
        let send: SendFrame = {
            let sent = sent.clone();
            Arc::new(move |to: &Address, frame: &ShardingFrame| {
                sent.lock().unwrap().push((to.clone(), frame.clone()));
                Ok(())
            })
        };
        let direct = Arc::new(DirectPath {
            type_name: "account".into(),
            host: None,
            shards: ShardMap {
                number_of_shards: 10,
                ids: crate::shard_id::ShardIds::Hashed,
            },
            message_version: 1,
            routes: std::sync::RwLock::new(HashMap::new()),
            queued_asks: AtomicU64::new(0),
            queued_forwards: AtomicU64::new(0),
            self_address: Address::new("10.0.0.1", 25520),
            send: send.clone(),
            waiting: Waiting::default(),
            next_reply_id: AtomicU64::new(0),
        });
        let route = RegionRoute { inputs: tx, direct };
        let router = Router {
            self_uid: 7,
            self_address: Address::new("10.0.0.1", 25520),
            regions: HashMap::from([("account".to_string(), route)]),
            coordinators: CoordinatorRoutes::default(),
            counters: Arc::new(ShardingCounters::default()),
            send,
            version_warned: std::sync::atomic::AtomicBool::new(false),
        };
        (router, rx, sent)
    }

    fn forwarded(type_name: &str, reply_id: u64) -> Inbound {
        forwarded_under(type_name, reply_id, 1)
    }

    fn forwarded_under(type_name: &str, reply_id: u64, message_version: u32) -> Inbound {
        let frame = ShardingFrame::Forward {
            type_name: type_name.into(),
            shard: ShardId(3),
            ask: RemoteAsk {
                entity_id: "alice".into(),
                payload: vec![0],
                message_version,
                reply_to: Address::new("10.0.0.2", 25520),
                reply_id,
            },
        };
        Inbound {
            from: UniqueAddress::new(Address::new("10.0.0.2", 25520), 99),
            service: services::SHARDING,
            payload: Bytes::from(wire::encode(&frame).unwrap()),
            reply: None,
        }
    }

    /// The refusals a router sent, each to the forward's sender: reply id and failure.
    fn refusals_sent(sent: &Sent, type_names: &[&str]) -> Vec<(u64, AskFailure)> {
        let refusals: Vec<(u64, AskFailure)> = sent
            .lock()
            .unwrap()
            .drain(..)
            .map(|(to, frame)| {
                assert_eq!(to, Address::new("10.0.0.2", 25520));
                match frame {
                    ShardingFrame::Reply {
                        type_name,
                        reply_id,
                        result: Err(failure),
                    } => (type_name, reply_id, failure),
                    other => panic!("not a refusal: {other:?}"),
                }
            })
            .enumerate()
            .map(|(i, (type_name, reply_id, failure))| {
                // The sender finds the waiting caller by type and reply id.
                assert_eq!(Some(&type_name.as_str()), type_names.get(i));
                (reply_id, failure)
            })
            .collect();
        assert_eq!(refusals.len(), type_names.len(), "{refusals:?}");
        refusals
    }

    /// A command forwarded here that the region cannot take (its queue full, a type this node
    /// does not shard, its region stopping) was never delivered: its caller is told so at
    /// once, rather than waiting for its ask timeout and hearing "outcome unknown".
    #[test]
    fn a_forwarded_command_that_is_not_delivered_is_refused_at_once() {
        let (router, mut rx, sent) = account_router(1);
        router.route(inbound_to_region(7));
        router.route(forwarded("account", 41));
        router.route(forwarded("order", 42));
        let refusals = refusals_sent(&sent, &["account", "order"]);
        let (id, full) = &refusals[0];
        assert_eq!(*id, 41);
        assert_eq!(full.kind, FailureKind::Overloaded);
        assert_eq!(full.outcome, AskOutcome::NotApplied);
        assert_eq!(
            full.message,
            format!(
                "the account region's queue on 10.0.0.1:25520 is full ({INPUT_QUEUE_CAPACITY} inputs)"
            )
        );
        let (id, unknown) = &refusals[1];
        assert_eq!(*id, 42);
        assert_eq!(unknown.kind, FailureKind::Unavailable);
        assert_eq!(unknown.outcome, AskOutcome::NotApplied);
        assert_eq!(
            unknown.message,
            "the node at 10.0.0.1:25520 does not shard entity type \"order\""
        );
        let direct = &router.regions["account"].direct;
        assert_eq!(direct.queued_forwards.load(Ordering::SeqCst), 0);
        assert_eq!(router.counters.frames_dropped.load(Ordering::Relaxed), 1);
        // The queue's one input is the frame that filled it.
        assert!(matches!(
            rx.try_recv(),
            Ok(RegionInput::FromCoordinator { .. })
        ));
        assert!(rx.try_recv().is_err());

        // The region task ended: its queue is closed.
        drop(rx);
        router.route(forwarded("account", 43));
        let refusals = refusals_sent(&sent, &["account"]);
        let (id, stopping) = &refusals[0];
        assert_eq!(*id, 43);
        assert_eq!(stopping.kind, FailureKind::Unavailable);
        assert_eq!(stopping.outcome, AskOutcome::NotApplied);
        assert_eq!(
            stopping.message,
            "the account region on 10.0.0.1:25520 is stopping"
        );
        assert_eq!(direct.queued_forwards.load(Ordering::SeqCst), 0);
    }

    /// A command encoded under another message version of its type (a node running another
    /// release) is refused before anything decodes it, naming both versions.
    #[test]
    fn a_command_under_another_message_version_is_refused_naming_both() {
        let (router, mut rx, sent) = account_router(8);
        router.route(forwarded_under("account", 5, 2));
        let refusals = refusals_sent(&sent, &["account"]);
        let (id, refused) = &refusals[0];
        assert_eq!(*id, 5);
        assert_eq!(refused.kind, FailureKind::Unavailable);
        assert_eq!(refused.outcome, AskOutcome::NotApplied);
        assert_eq!(
            refused.message,
            "entity type \"account\": 10.0.0.2:25520#99 sent a command encoded under message \
             version 2, but the node at 10.0.0.1:25520 reads version 1; every node must run a \
             release of the type that reads the other's messages"
        );
        assert!(rx.try_recv().is_err(), "nothing reached the region");
    }

    /// A region that takes this node for its type's coordinator, when this node does not
    /// register the type at all, hears why (the nodes register different types) instead of
    /// waiting for ever; a type this node registers, whose coordinator runs elsewhere, gets no
    /// such answer.
    #[test]
    fn a_registration_for_a_type_this_node_does_not_register_is_answered_with_why() {
        let (router, _rx, sent) = account_router(8);
        let register = |type_name: &str| {
            let frame = ShardingFrame::ToCoordinator {
                type_name: type_name.into(),
                message: ToCoordinator::Register,
            };
            Inbound {
                from: UniqueAddress::new(Address::new("10.0.0.2", 25520), 99),
                service: services::SHARDING,
                payload: Bytes::from(wire::encode(&frame).unwrap()),
                reply: None,
            }
        };
        router.route(register("account"));
        assert!(sent.lock().unwrap().is_empty());
        router.route(register("order"));
        let sent = std::mem::take(&mut *sent.lock().unwrap());
        match sent.as_slice() {
            [(to, ShardingFrame::Unsupported { type_name, reason })] => {
                assert_eq!(*to, Address::new("10.0.0.2", 25520));
                assert_eq!(type_name, "order");
                assert_eq!(
                    reason,
                    "the node at 10.0.0.1:25520 does not register entity type \"order\" (it \
                     registers account): every node of a cluster must register the same types"
                );
            }
            other => panic!("expected one answer, sent {other:?}"),
        }
    }

    /// A refusal the transport does not take is counted: its caller ends at its timeout.
    #[test]
    fn a_refusal_the_transport_does_not_take_is_counted() {
        let (mut router, _rx, _sent) = account_router(1);
        router.send = Arc::new(|_: &Address, _: &ShardingFrame| Err("no connection".into()));
        router.route(forwarded("order", 7));
        assert_eq!(router.counters.replies_unsent.load(Ordering::Relaxed), 1);
    }

    /// Found by `tessera soak`: an account hosted by two regions at once after nodes were
    /// restarted at their addresses. A frame for the previous incarnation of this node (a
    /// repeated `HostShard`, say) must not reach the new one's region.
    #[test]
    fn a_frame_for_an_earlier_incarnation_of_this_node_is_dropped() {
        let (router, mut rx, _sent) = account_router(4);
        let counters = router.counters.clone();
        router.route(inbound_to_region(6));
        assert!(rx.try_recv().is_err());
        assert_eq!(counters.frames_unrouted.load(Ordering::Relaxed), 1);
        router.route(inbound_to_region(7));
        assert!(matches!(
            rx.try_recv(),
            Ok(RegionInput::FromCoordinator {
                message: ToRegion::HostShard { .. },
                ..
            })
        ));
    }
}
