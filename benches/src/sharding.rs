//! `tessera bench sharding`: asks through cluster sharding against the entity host asked
//! directly, in the same run, and how long the cluster takes to answer for every entity again
//! after the coordinator's node crashed.
//!
//! The nodes are whole tessera nodes ([`tessera::node`]: transport, cluster, Distributed Data,
//! replicated journal, entity hosts, sharding, HTTP) in this process on 127.0.0.1, each with its
//! own RocksDB stores under the benchmark's directory. The `account` entity type, 1,000
//! entities, 64 callers: each caller asks a random entity, waits for the reply, and asks the
//! next.
//!
//! - `query-<nodes>`: `{"get": null}`, which persists nothing.
//! - `persist-<fsync>-<nodes>`: `{"deposit": 1}`, with the journal and snapshot store fsyncing
//!   `always` or `never` (snapshots every 100 events, as on a node). After the workload the
//!   balances must add up to the deposits answered.
//!
//! `<nodes>` is `1node`, or `2nodes`: then the entities are spread over both nodes (about half
//! on each) and the callers ask through the second node's region, so the asks for the first
//! node's entities cross the transport. Sharded side: [`Sharding::ask`] on the callers' node.
//! Baseline: the same command bytes given straight to the entity host of the node that runs
//! the entity (the byte-level JSON host a region delivers to), on the same nodes, the same live
//! entities and the same journal; no region, no coordinator, no transport. The one-node and
//! the two-node cluster of an fsync policy run at once (only one is asked at a time), and a
//! workload's four rounds go over both clusters, each side of each once a round (S B, B S,
//! S B, B S on each, the clusters taking turns first), so that all four figures see the same
//! disk and the same drift of the machine's speed. Rebalancing waits an hour, so that the
//! entities stay where the baseline asks them.
//!
//! - `failover-<state_store_mode>`: three nodes (`stable_after = 2s`, otherwise a node's
//!   defaults), the 1,000 entities spread over them; the node that runs the coordinator (the
//!   oldest) is killed without leaving ([`RunningNode::kill`]), and the youngest node asks all
//!   1,000 entities `{"get": null}` at once, each ask given 500 ms and repeated until answered.
//!   Measured from the kill: until both survivors see the node unreachable, until they have
//!   removed it, and until the last entity answered.

use super::{percentile, print_json_row, progress};
use crate::args::ShardingWorkloadKind;
use futures::StreamExt;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera::config::{ClusterSecret, NodeConfig, StateStoreMode};
use tessera::node::{Node as RunningNode, NodeBuilder, NodeError};
use tessera_cluster::node::ClusterHandle;
use tessera_cluster::transport::TcpTransport;
use tessera_cluster::{MemberStatus, UniqueAddress};
use tessera_coordinator::host::{AskFailure, AskOutcome, FailureKind};
use tessera_coordinator::runtime::Sharding;
use tessera_coordinator::{AskError, EntityRef};
use tessera_entities::EntityType;
use tessera_example_account::{Account, AccountCommand, AccountRejection, Balance};
use tessera_journal::FsyncPolicy;

/// The sizes of a run.
#[derive(Debug, Clone)]
pub struct ShardingBenchParams {
    /// Entities the callers ask.
    pub entities: usize,
    /// Concurrent callers, each with one ask under way at a time.
    pub callers: usize,
    /// How long each side of an ask workload runs in all (over four rounds).
    pub phase: Duration,
    /// The coordinator state stores whose failover is measured, one three-node cluster each.
    pub failover_modes: Vec<StateStoreMode>,
    /// Where the nodes' data goes (a fresh directory, removed afterwards).
    pub dir: PathBuf,
    /// The ask workloads run, on one node and on two; empty runs none.
    pub asks: Vec<ShardingWorkloadKind>,
}

/// The ask workloads, each run on one node and on two, in the order they run.
pub const ASK_WORKLOADS: [ShardingWorkloadKind; 3] = [
    ShardingWorkloadKind::Query,
    ShardingWorkloadKind::PersistAlways,
    ShardingWorkloadKind::PersistNever,
];

/// An ask workload's name, command and the fsync policy of the cluster it runs on (a query
/// persists nothing: it runs on the fsync-always cluster, before the persisted asks); none
/// for the failover.
fn ask_workload(kind: ShardingWorkloadKind) -> Option<(&'static str, AccountCommand, FsyncPolicy)> {
    match kind {
        ShardingWorkloadKind::Query => Some(("query", QUERY, FsyncPolicy::Always)),
        ShardingWorkloadKind::PersistAlways => {
            Some(("persist-always", DEPOSIT, FsyncPolicy::Always))
        }
        ShardingWorkloadKind::PersistNever => Some(("persist-never", DEPOSIT, FsyncPolicy::Never)),
        ShardingWorkloadKind::Failover => None,
    }
}

impl ShardingBenchParams {
    /// The standard workloads: 1,000 entities, 64 callers, 8-second sides, the failover
    /// with either coordinator state store.
    pub fn full(dir: PathBuf) -> Self {
        ShardingBenchParams {
            entities: 1_000,
            callers: 64,
            phase: Duration::from_secs(8),
            failover_modes: vec![StateStoreMode::Ddata, StateStoreMode::Persistence],
            dir,
            asks: ASK_WORKLOADS.to_vec(),
        }
    }

    /// Keeps only the workloads named (each ask workload still runs on one node and on two).
    pub fn only(&mut self, kinds: &[ShardingWorkloadKind]) {
        self.asks.retain(|ask| kinds.contains(ask));
        if !kinds.contains(&ShardingWorkloadKind::Failover) {
            self.failover_modes.clear();
        }
    }

    /// A fast run: 2-second sides, the failover with Distributed Data only.
    pub fn quick(dir: PathBuf) -> Self {
        ShardingBenchParams {
            phase: Duration::from_secs(2),
            failover_modes: vec![StateStoreMode::Ddata],
            ..Self::full(dir)
        }
    }
}

/// One ask workload: the sharded side, the direct-host baseline and their ratio.
#[derive(Debug, Clone, Serialize)]
pub struct AskRow {
    pub bench: &'static str,
    pub workload: String,
    pub nodes: usize,
    pub sharded_per_s: f64,
    pub sharded_p50_us: f64,
    pub sharded_p99_us: f64,
    pub direct_per_s: f64,
    pub direct_p50_us: f64,
    pub direct_p99_us: f64,
    /// sharded_per_s / direct_per_s.
    pub ratio: f64,
    /// sharded_per_s / the same workload's sharded_per_s on one node (two-node rows).
    pub vs_one_node: Option<f64>,
}

/// One failover of the coordinator's node; times from the kill.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverRow {
    pub bench: &'static str,
    pub workload: String,
    pub state_store_mode: &'static str,
    pub entities: usize,
    /// Until both survivors saw the killed node unreachable.
    pub unreachable_ms: f64,
    /// Until both survivors had removed it.
    pub removed_ms: f64,
    /// Until the last entity answered.
    pub all_answered_ms: f64,
    /// all_answered_ms - removed_ms (the target is at most 10 s).
    pub after_removal_ms: f64,
    /// Asks that failed or got no answer within 500 ms and were asked again.
    pub asks_repeated: u64,
}

/// Every row of a run.
#[derive(Debug, Clone, Default)]
pub struct ShardingBenchReport {
    pub asks: Vec<AskRow>,
    pub failovers: Vec<FailoverRow>,
}

/// What went wrong in a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum ShardingBenchError {
    #[error("cannot start node {index}: {source}")]
    Start { index: usize, source: NodeError },
    #[error("{workload}: entity {entity:?}: {failure}")]
    Ask {
        workload: String,
        entity: String,
        failure: AskFailure,
    },
    #[error("{what}: not within {timeout:?}")]
    Timeout { what: String, timeout: Duration },
    #[error("{0}")]
    Other(String),
}

fn other(message: impl Into<String>) -> ShardingBenchError {
    ShardingBenchError::Other(message.into())
}

const TYPE_NAME: &str = Account::TYPE_NAME;
const QUERY: AccountCommand = AccountCommand::Get;
const DEPOSIT: AccountCommand = AccountCommand::Deposit(1);
/// Rounds of an ask workload; the sharded side and the baseline alternate.
const ROUNDS: u32 = 4;
/// Longest a cluster may take to form, or its entities to start.
const SETUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest the failover may take before the benchmark gives up.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one ask of the activation and the failover is given before it is repeated.
const RETRY_ASK_TIMEOUT: Duration = Duration::from_millis(500);
/// Pause after an ask failed, before it is repeated.
const RETRY_PAUSE: Duration = Duration::from_millis(50);
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// The split-brain resolver's `stable_after` of the failover clusters.
const FAILOVER_STABLE_AFTER: Duration = Duration::from_secs(2);
/// Rebalancing of the ask workloads' clusters: never within a run.
const NO_REBALANCE: Duration = Duration::from_secs(3_600);
/// Targets (docs/src/benchmarks.md): a one-node ask through sharding costs at most 15% over
/// the entity host asked directly; two nodes keep half of one; a failover answers within 10 s.
const QUERY_VS_DIRECT_TARGET: f64 = 0.85;
const TWO_NODES_VS_ONE_TARGET: f64 = 0.5;
const AFTER_REMOVAL_TARGET: Duration = Duration::from_secs(10);

fn fsync_label(fsync: FsyncPolicy) -> &'static str {
    match fsync {
        FsyncPolicy::Always => "always",
        FsyncPolicy::Never => "never",
    }
}

fn nodes_label(nodes: usize) -> String {
    if nodes == 1 {
        "1node".into()
    } else {
        format!("{nodes}nodes")
    }
}

/// Runs every workload, prints a table (or JSON rows) and removes the directory.
pub async fn run(
    params: ShardingBenchParams,
    json: bool,
) -> Result<ShardingBenchReport, ShardingBenchError> {
    std::fs::create_dir_all(&params.dir)
        .map_err(|e| other(format!("cannot create {}: {e}", params.dir.display())))?;
    progress(&format!("node data in {}", params.dir.display()));
    let report = run_workloads(&params, json).await;
    let _ = std::fs::remove_dir_all(&params.dir);
    report
}

async fn run_workloads(
    params: &ShardingBenchParams,
    json: bool,
) -> Result<ShardingBenchReport, ShardingBenchError> {
    let ids: Arc<[String]> = (0..params.entities).map(|i| format!("bench-{i}")).collect();
    let mut report = ShardingBenchReport::default();
    if !json && !params.asks.is_empty() {
        println!(
            "{:<22} {:>13} {:>8} {:>8} {:>12} {:>8} {:>8} {:>6} {:>8}",
            "workload",
            "sharded_per_s",
            "p50_us",
            "p99_us",
            "direct_per_s",
            "p50_us",
            "p99_us",
            "ratio",
            "vs_1node"
        );
    }
    for fsync in [FsyncPolicy::Always, FsyncPolicy::Never] {
        let workloads: Vec<(&str, AccountCommand)> = ASK_WORKLOADS
            .into_iter()
            .filter(|w| params.asks.contains(w))
            .filter_map(ask_workload)
            .filter(|&(_, _, policy)| policy == fsync)
            .map(|(name, payload, _)| (name, payload))
            .collect();
        if workloads.is_empty() {
            continue;
        }
        let rows = ask_workloads(params, &ids, fsync, &workloads).await?;
        for mut row in rows {
            row.vs_one_node = (row.nodes > 1)
                .then(|| {
                    let one = row
                        .workload
                        .replace(&nodes_label(row.nodes), &nodes_label(1));
                    report.asks.iter().find(|r| r.workload == one)
                })
                .flatten()
                .filter(|one| one.sharded_per_s > 0.0)
                .map(|one| row.sharded_per_s / one.sharded_per_s);
            print_ask_row(&row, json);
            report.asks.push(row);
        }
    }
    for (i, &mode) in params.failover_modes.iter().enumerate() {
        if i == 0 && !json {
            println!();
            println!(
                "{:<22} {:>8} {:>14} {:>10} {:>15} {:>16} {:>13}",
                "workload",
                "entities",
                "unreachable_ms",
                "removed_ms",
                "all_answered_ms",
                "after_removal_ms",
                "asks_repeated"
            );
        }
        let row = failover(params, &ids, mode).await?;
        if json {
            print_json_row(&row);
        } else {
            println!(
                "{:<22} {:>8} {:>14.0} {:>10.0} {:>15.0} {:>16.0} {:>13}",
                row.workload,
                row.entities,
                row.unreachable_ms,
                row.removed_ms,
                row.all_answered_ms,
                row.after_removal_ms,
                row.asks_repeated
            );
        }
        report.failovers.push(row);
    }
    if !json {
        print_targets(&report);
    }
    Ok(report)
}

fn print_ask_row(row: &AskRow, json: bool) {
    if json {
        print_json_row(row);
        return;
    }
    println!(
        "{:<22} {:>13.0} {:>8.0} {:>8.0} {:>12.0} {:>8.0} {:>8.0} {:>6.2} {:>8}",
        row.workload,
        row.sharded_per_s,
        row.sharded_p50_us,
        row.sharded_p99_us,
        row.direct_per_s,
        row.direct_p50_us,
        row.direct_p99_us,
        row.ratio,
        row.vs_one_node
            .map(|r| format!("{r:.2}"))
            .unwrap_or_else(|| "-".into())
    );
}

/// The targets, each with the figure that answers it.
fn print_targets(report: &ShardingBenchReport) {
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    println!();
    if let Some(row) = report.asks.iter().find(|r| r.workload == "query-1node") {
        println!(
            "target: one-node query asks >= {QUERY_VS_DIRECT_TARGET} x the direct host: {:.2} ({})",
            row.ratio,
            verdict(row.ratio >= QUERY_VS_DIRECT_TARGET)
        );
    }
    for row in report.asks.iter().filter(|r| r.vs_one_node.is_some()) {
        let ratio = row.vs_one_node.unwrap_or(0.0);
        println!(
            "target: {} >= {TWO_NODES_VS_ONE_TARGET} x one node: {ratio:.2} ({})",
            row.workload,
            verdict(ratio >= TWO_NODES_VS_ONE_TARGET)
        );
    }
    for row in &report.failovers {
        println!(
            "target: {} every entity answers within {AFTER_REMOVAL_TARGET:?} of the removal: \
             {:.1} s ({})",
            row.workload,
            row.after_removal_ms / 1e3,
            verdict(row.after_removal_ms <= AFTER_REMOVAL_TARGET.as_secs_f64() * 1e3)
        );
    }
}

/// Starts `size` nodes (the first forms the cluster, the others join through it) and waits
/// until every node sees all of them Up and its regions are registered with the coordinator.
async fn start_cluster(
    dir: &Path,
    size: usize,
    fsync: FsyncPolicy,
    state_store_mode: StateStoreMode,
    stable_after: Duration,
    rebalance_interval: Duration,
) -> Result<Vec<RunningNode>, ShardingBenchError> {
    let service = || NodeBuilder::new().entity(Account).fsync(fsync);
    start_nodes(
        dir,
        size,
        &service,
        state_store_mode,
        stable_after,
        rebalance_interval,
    )
    .await
}

/// [`start_cluster`] of nodes of the service `service` makes.
pub(crate) async fn start_nodes(
    dir: &Path,
    size: usize,
    service: &dyn Fn() -> NodeBuilder,
    state_store_mode: StateStoreMode,
    stable_after: Duration,
    rebalance_interval: Duration,
) -> Result<Vec<RunningNode>, ShardingBenchError> {
    let secret = ClusterSecret::new(format!("bench-{}", rand::random::<u64>()));
    let mut nodes: Vec<RunningNode> = Vec::with_capacity(size);
    for index in 0..size {
        let config = NodeConfig {
            host: "127.0.0.1".into(),
            port: 0,
            http_host: "127.0.0.1".into(),
            http_port: 0,
            seed_nodes: nodes
                .first()
                .map(|seed| seed.cluster_address().clone())
                .into_iter()
                .collect(),
            data_dir: dir.join(format!("node-{}", index + 1)),
            cluster_secret: Some(secret.clone()),
            stable_after,
            passivate_after: Duration::ZERO,
            state_store_mode,
            rebalance_interval,
            ..NodeConfig::default()
        };
        let node = match service().start(&config).await {
            Ok(node) => node,
            Err(source) => {
                stop_cluster(nodes).await;
                return Err(ShardingBenchError::Start { index, source });
            }
        };
        let formed = if index == 0 {
            node.cluster
                .join(node.cluster_address().clone())
                .await
                .map_err(|e| other(format!("the first node cannot form the cluster: {e}")))
        } else {
            Ok(())
        };
        nodes.push(node);
        if let Err(e) = formed {
            stop_cluster(nodes).await;
            return Err(e);
        }
    }
    let formed = wait_until(
        &format!("{size} nodes Up with their regions registered"),
        SETUP_TIMEOUT,
        || {
            nodes.iter().all(|node| {
                let snapshot = node.cluster.snapshot();
                snapshot.members.len() == size
                    && snapshot
                        .members
                        .iter()
                        .all(|m| m.status == MemberStatus::Up)
                    && node.sharding.all_registered()
            })
        },
    )
    .await;
    match formed {
        Ok(_) => Ok(nodes),
        Err(e) => {
            stop_cluster(nodes).await;
            Err(e)
        }
    }
}

/// Stops every node at once, without handing shards off (the run is over).
pub(crate) async fn stop_cluster(nodes: Vec<RunningNode>) {
    futures::future::join_all(nodes.into_iter().map(RunningNode::kill)).await;
}

async fn wait_until(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> bool,
) -> Result<Duration, ShardingBenchError> {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > timeout {
            return Err(ShardingBenchError::Timeout {
                what: what.to_string(),
                timeout,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    Ok(started.elapsed())
}

/// Asks entity `id` through `sharding` until it answers, each ask given [`RETRY_ASK_TIMEOUT`];
/// returns how many asks were repeated. Gives up at `give_up_at` with the last failure.
async fn ask_until_answered(
    sharding: &Sharding<TcpTransport>,
    id: &str,
    give_up_at: Instant,
) -> Result<u64, ShardingBenchError> {
    let mut repeated = 0;
    loop {
        let failure =
            match tokio::time::timeout(RETRY_ASK_TIMEOUT, account_ref(sharding, id).ask(QUERY))
                .await
            {
                Ok(Ok(_)) => return Ok(repeated),
                Ok(Err(error)) => {
                    tokio::time::sleep(RETRY_PAUSE).await;
                    error.to_string()
                }
                Err(_) => format!("no answer within {RETRY_ASK_TIMEOUT:?}"),
            };
        if Instant::now() >= give_up_at {
            return Err(other(format!(
                "entity {id:?} did not answer (last: {failure})"
            )));
        }
        repeated += 1;
    }
}

/// Asks every entity once through `sharding` (starting it where the coordinator puts its
/// shard), as many at once as there are callers; returns the asks repeated.
async fn activate(
    sharding: &Sharding<TcpTransport>,
    ids: &[String],
    concurrency: usize,
) -> Result<u64, ShardingBenchError> {
    let give_up_at = Instant::now() + SETUP_TIMEOUT;
    let mut answers = futures::stream::iter(ids)
        .map(|id| ask_until_answered(sharding, id, give_up_at))
        .buffer_unordered(concurrency.max(1));
    let mut repeated = 0;
    while let Some(answer) = answers.next().await {
        repeated += answer?;
    }
    Ok(repeated)
}

/// The index of the node that runs each entity, from every region's own report.
async fn owners(nodes: &[RunningNode], ids: &[String]) -> Result<Vec<usize>, ShardingBenchError> {
    let mut owner_of: HashMap<String, usize> = HashMap::new();
    for (index, node) in nodes.iter().enumerate() {
        let region = node
            .sharding
            .region_state(TYPE_NAME)
            .await
            .ok_or_else(|| other(format!("node {} did not report its shards", index + 1)))?;
        for (_, entities) in region.shards {
            for entity in entities {
                if let Some(before) = owner_of.insert(entity.clone(), index) {
                    return Err(other(format!(
                        "entity {entity:?} is live on nodes {} and {}",
                        before + 1,
                        index + 1
                    )));
                }
            }
        }
    }
    ids.iter()
        .map(|id| {
            owner_of
                .get(id)
                .copied()
                .ok_or_else(|| other(format!("entity {id:?} is not live on any node")))
        })
        .collect()
}

/// How many of the entities each node runs, by node index.
fn entities_per_node(owners: &[usize], nodes: usize) -> Vec<usize> {
    (0..nodes)
        .map(|node| owners.iter().filter(|&&owner| owner == node).count())
        .collect()
}

/// A reference to account `id` through `sharding`.
fn account_ref(sharding: &Sharding<TcpTransport>, id: &str) -> EntityRef<Account> {
    match sharding.region(TYPE_NAME) {
        Some(region) => EntityRef::new(region, id),
        None => EntityRef::unroutable(sharding.unknown_type(TYPE_NAME), id),
    }
}

/// An ask that got no balance, for the report (a rejection too: no workload expects one).
fn ask_failure(error: AskError<AccountRejection>) -> AskFailure {
    match error {
        AskError::Failed(failure) => failure,
        AskError::Rejected(rejection) => AskFailure::new(
            FailureKind::BadRequest,
            AskOutcome::NotApplied,
            format!("rejected: {rejection}"),
        ),
    }
}

/// How an ask reaches its entity: typed references made once per entity, so that both sides
/// pay the same for naming it.
#[derive(Clone)]
enum Route {
    /// Through this node's shard region.
    Sharded(Arc<[EntityRef<Account>]>),
    /// Straight to the entity host of the node that runs the entity.
    Direct(Arc<[tessera_entities::EntityRef<Account>]>),
}

impl Route {
    async fn ask(&self, entity: usize, command: AccountCommand) -> Result<Balance, AskFailure> {
        match self {
            Route::Sharded(refs) => refs[entity].ask(command).await.map_err(ask_failure),
            Route::Direct(refs) => refs[entity]
                .ask(command)
                .await
                .map_err(|e| ask_failure(e.into())),
        }
    }
}

/// What one side of a workload did: ask latencies and the time its phases took.
#[derive(Default)]
struct Samples {
    latencies_us: Vec<f64>,
    elapsed: Duration,
}

impl Samples {
    fn per_s(&self) -> f64 {
        self.latencies_us.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn percentile_us(&self, p: f64) -> f64 {
        percentile(&self.latencies_us, p).unwrap_or(0.0)
    }
}

/// `callers` tasks ask random entities through `route`, one ask at a time each, for
/// `duration`.
async fn ask_phase(
    workload: &str,
    route: &Route,
    ids: &Arc<[String]>,
    command: AccountCommand,
    callers: usize,
    duration: Duration,
    samples: &mut Samples,
) -> Result<(), ShardingBenchError> {
    let started = Instant::now();
    let deadline = started + duration;
    // Dropped on the first failure: the other callers stop asking then.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..callers {
        let route = route.clone();
        let ids = ids.clone();
        let command = command.clone();
        tasks.spawn(async move {
            let mut rng = SmallRng::seed_from_u64(rand::random());
            let mut latencies_us = Vec::new();
            while Instant::now() < deadline {
                let entity = rng.random_range(0..ids.len());
                let asked = Instant::now();
                route
                    .ask(entity, command.clone())
                    .await
                    .map_err(|failure| (ids[entity].clone(), failure))?;
                latencies_us.push(asked.elapsed().as_secs_f64() * 1e6);
            }
            Ok::<_, (String, AskFailure)>(latencies_us)
        });
    }
    while let Some(task) = tasks.join_next().await {
        let latencies_us = task
            .map_err(|e| other(format!("{workload}: a caller task failed: {e}")))?
            .map_err(|(entity, failure)| ShardingBenchError::Ask {
                workload: workload.to_string(),
                entity,
                failure,
            })?;
        samples.latencies_us.extend(latencies_us);
    }
    samples.elapsed += started.elapsed();
    Ok(())
}

/// A started cluster with its entities running, and the two routes the callers ask by.
struct AskCluster {
    nodes: usize,
    label: String,
    cluster: Vec<RunningNode>,
    sharded: Route,
    direct: Route,
    /// Deposits answered on this cluster so far: what its balances must add up to.
    deposits_expected: u64,
}

/// Starts a cluster of `nodes` nodes with `fsync` and runs the entities on it.
async fn start_ask_cluster(
    params: &ShardingBenchParams,
    ids: &Arc<[String]>,
    nodes: usize,
    fsync: FsyncPolicy,
) -> Result<AskCluster, ShardingBenchError> {
    let label = nodes_label(nodes);
    progress(&format!(
        "{label}, fsync {}: starting the cluster",
        fsync_label(fsync)
    ));
    let dir = params
        .dir
        .join(format!("{label}-fsync-{}", fsync_label(fsync)));
    let cluster = start_cluster(
        &dir,
        nodes,
        fsync,
        StateStoreMode::Ddata,
        NodeConfig::default().stable_after,
        NO_REBALANCE,
    )
    .await?;
    let routes = async {
        // The callers are on the last node: with two, on the second.
        let caller = &cluster[nodes - 1];
        progress(&format!("{label}: starting {} entities", ids.len()));
        activate(&caller.sharding, ids, params.callers).await?;
        let owners = owners(&cluster, ids).await?;
        progress(&format!(
            "{label}: entities per node {:?}",
            entities_per_node(&owners, nodes)
        ));
        let hosts = cluster
            .iter()
            .map(|node| {
                node.local_host::<Account>()
                    .ok_or_else(|| other(format!("no {TYPE_NAME} host on a node")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let direct = ids
            .iter()
            .zip(&owners)
            .map(|(id, &owner)| hosts[owner].entity_ref(id))
            .collect::<Result<Arc<[_]>, _>>()
            .map_err(|e| other(format!("an entity id is invalid: {e}")))?;
        let sharded = ids
            .iter()
            .map(|id| caller.entity_ref::<Account>(id.as_str()))
            .collect();
        Ok((Route::Sharded(sharded), Route::Direct(direct)))
    }
    .await;
    match routes {
        Ok((sharded, direct)) => Ok(AskCluster {
            nodes,
            label,
            cluster,
            sharded,
            direct,
            deposits_expected: 0,
        }),
        Err(e) => {
            stop_cluster(cluster).await;
            Err(e)
        }
    }
}

/// The given ask workloads on a one-node and a two-node cluster with `fsync`, both running at
/// once: each workload's rounds alternate between the clusters and between the sharded and
/// the direct side, so that a change of the machine's speed during the run weighs on the
/// one-node and the two-node figures alike. Only one cluster is asked at a time.
async fn ask_workloads(
    params: &ShardingBenchParams,
    ids: &Arc<[String]>,
    fsync: FsyncPolicy,
    workloads: &[(&str, AccountCommand)],
) -> Result<Vec<AskRow>, ShardingBenchError> {
    let mut clusters = Vec::new();
    for nodes in [1, 2] {
        match start_ask_cluster(params, ids, nodes, fsync).await {
            Ok(cluster) => clusters.push(cluster),
            Err(e) => {
                for cluster in clusters {
                    stop_cluster(cluster.cluster).await;
                }
                return Err(e);
            }
        }
    }
    let result = ask_rounds(params, ids, &mut clusters, workloads).await;
    for cluster in clusters {
        stop_cluster(cluster.cluster).await;
    }
    result
}

async fn ask_rounds(
    params: &ShardingBenchParams,
    ids: &Arc<[String]>,
    clusters: &mut [AskCluster],
    workloads: &[(&str, AccountCommand)],
) -> Result<Vec<AskRow>, ShardingBenchError> {
    let mut rows = Vec::new();
    for (name, command) in workloads {
        let phase = params.phase / ROUNDS;
        progress(&format!(
            "{name}: {ROUNDS} rounds of {phase:?} sharded and {phase:?} direct on each cluster, \
             {} callers",
            params.callers
        ));
        // Per cluster: (sharded, direct).
        let mut samples: Vec<(Samples, Samples)> =
            clusters.iter().map(|_| Default::default()).collect();
        for round in 0..ROUNDS as usize {
            let count = clusters.len();
            for turn in 0..count {
                // S B, B S, ... on each cluster, the clusters' order turning each round.
                let index = (turn + round) % count;
                let cluster = &clusters[index];
                let workload = format!("{name}-{}", cluster.label);
                for side in [round % 2, 1 - round % 2] {
                    let (route, samples) = if side == 0 {
                        (&cluster.sharded, &mut samples[index].0)
                    } else {
                        (&cluster.direct, &mut samples[index].1)
                    };
                    ask_phase(
                        &workload,
                        route,
                        ids,
                        command.clone(),
                        params.callers,
                        phase,
                        samples,
                    )
                    .await?;
                }
            }
        }
        for (cluster, (sharded, direct)) in clusters.iter_mut().zip(samples.iter_mut()) {
            let workload = format!("{name}-{}", cluster.label);
            if *command == DEPOSIT {
                cluster.deposits_expected +=
                    (sharded.latencies_us.len() + direct.latencies_us.len()) as u64;
                let caller = &cluster.cluster[cluster.nodes - 1];
                check_balances(
                    &workload,
                    &caller.sharding,
                    ids,
                    cluster.deposits_expected,
                    params,
                )
                .await?;
            }
            for samples in [&mut *sharded, &mut *direct] {
                samples.latencies_us.sort_by(f64::total_cmp);
            }
            let (s, d) = (&*sharded, &*direct);
            rows.push(AskRow {
                bench: "sharding",
                workload,
                nodes: cluster.nodes,
                sharded_per_s: s.per_s(),
                sharded_p50_us: s.percentile_us(0.5),
                sharded_p99_us: s.percentile_us(0.99),
                direct_per_s: d.per_s(),
                direct_p50_us: d.percentile_us(0.5),
                direct_p99_us: d.percentile_us(0.99),
                ratio: s.per_s() / d.per_s().max(1e-9),
                vs_one_node: None,
            });
        }
    }
    Ok(rows)
}

/// Every deposit answered is in a balance, and no other: the balances add up to `expected`.
async fn check_balances(
    workload: &str,
    sharding: &Sharding<TcpTransport>,
    ids: &[String],
    expected: u64,
    params: &ShardingBenchParams,
) -> Result<(), ShardingBenchError> {
    let mut balances = futures::stream::iter(ids)
        .map(|id| async move {
            account_ref(sharding, id)
                .ask(QUERY)
                .await
                .map(|reply| reply.balance)
                .map_err(|error| ShardingBenchError::Ask {
                    workload: workload.to_string(),
                    entity: id.clone(),
                    failure: ask_failure(error),
                })
        })
        .buffer_unordered(params.callers.max(1));
    let mut total = 0u64;
    while let Some(balance) = balances.next().await {
        total += balance?;
    }
    if total != expected {
        return Err(other(format!(
            "{workload}: the balances add up to {total}, but {expected} deposits were answered"
        )));
    }
    Ok(())
}

/// When both survivors first saw the killed node unreachable, and when they had removed it.
struct Removal {
    unreachable: Duration,
    removed: Duration,
}

/// Watches the survivors' views of `victim` from `killed_at` on.
async fn watch_removal(
    survivors: Vec<ClusterHandle>,
    victim: UniqueAddress,
    killed_at: Instant,
) -> Result<Removal, ShardingBenchError> {
    let gone = |handle: &ClusterHandle| {
        !handle
            .snapshot()
            .members
            .iter()
            .any(|m| m.unique_address == victim && m.status != MemberStatus::Removed)
    };
    let mut unreachable = None;
    loop {
        if unreachable.is_none()
            && survivors
                .iter()
                .all(|handle| handle.snapshot().unreachable.contains(&victim) || gone(handle))
        {
            unreachable = Some(killed_at.elapsed());
        }
        if survivors.iter().all(gone) {
            let removed = killed_at.elapsed();
            return Ok(Removal {
                unreachable: unreachable.unwrap_or(removed),
                removed,
            });
        }
        if killed_at.elapsed() > FAILOVER_TIMEOUT {
            return Err(ShardingBenchError::Timeout {
                what: format!("removal of the killed node {victim}"),
                timeout: FAILOVER_TIMEOUT,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Three nodes, the coordinator's node killed, every entity asked until it answers again.
async fn failover(
    params: &ShardingBenchParams,
    ids: &Arc<[String]>,
    mode: StateStoreMode,
) -> Result<FailoverRow, ShardingBenchError> {
    let workload = format!("failover-{}", mode.as_str());
    progress(&format!("{workload}: starting 3 nodes"));
    let mut cluster = start_cluster(
        &params.dir.join(&workload),
        3,
        FsyncPolicy::Always,
        mode,
        FAILOVER_STABLE_AFTER,
        NodeConfig::default().rebalance_interval,
    )
    .await?;
    let result = async {
        let asker = cluster[2].sharding.clone();
        progress(&format!("{workload}: starting {} entities", ids.len()));
        activate(&asker, ids, params.callers).await?;
        let per_node = entities_per_node(&owners(&cluster, ids).await?, cluster.len());
        let victim_index = cluster
            .iter()
            .position(|node| {
                node.sharding
                    .coordinator_gauges()
                    .iter()
                    .any(|(name, gauges)| *name == TYPE_NAME && gauges.running)
            })
            .ok_or_else(|| other(format!("{workload}: no node runs the coordinator")))?;
        if victim_index == 2 {
            return Err(other(format!(
                "{workload}: the youngest node runs the coordinator; expected the oldest"
            )));
        }
        progress(&format!(
            "{workload}: entities per node {per_node:?}; killing node {} (the coordinator's)",
            victim_index + 1
        ));
        let victim = cluster.remove(victim_index);
        let victim_address = victim.cluster.self_node().clone();
        let survivors: Vec<ClusterHandle> = cluster.iter().map(|n| n.cluster.clone()).collect();
        let killed_at = Instant::now();
        let kill = tokio::spawn(victim.kill());
        let removal = tokio::spawn(watch_removal(survivors, victim_address, killed_at));
        let give_up_at = killed_at + FAILOVER_TIMEOUT;
        let mut answers = futures::stream::iter(ids.iter())
            .map(|id| ask_until_answered(&asker, id, give_up_at))
            .buffer_unordered(ids.len().max(1));
        let mut asks_repeated = 0;
        while let Some(answer) = answers.next().await {
            asks_repeated += answer?;
        }
        let all_answered = killed_at.elapsed();
        let removal = removal
            .await
            .map_err(|e| other(format!("{workload}: the removal watch failed: {e}")))??;
        let _ = kill.await;
        progress(&format!(
            "{workload}: removed after {} ms, every entity answered after {} ms",
            removal.removed.as_millis(),
            all_answered.as_millis()
        ));
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        Ok(FailoverRow {
            bench: "sharding",
            workload: workload.clone(),
            state_store_mode: mode.as_str(),
            entities: ids.len(),
            unreachable_ms: ms(removal.unreachable),
            removed_ms: ms(removal.removed),
            all_answered_ms: ms(all_answered),
            after_removal_ms: ms(all_answered) - ms(removal.removed),
            asks_repeated,
        })
    }
    .await;
    stop_cluster(cluster).await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_workload_runs_and_reports() {
        let dir = tempfile::tempdir().unwrap();
        let params = ShardingBenchParams {
            entities: 20,
            callers: 4,
            phase: Duration::from_millis(200),
            failover_modes: vec![StateStoreMode::Ddata],
            dir: dir.path().join("bench"),
            asks: ASK_WORKLOADS.to_vec(),
        };
        let report = run(params.clone(), true).await.unwrap();
        let names: Vec<&str> = report.asks.iter().map(|r| r.workload.as_str()).collect();
        assert_eq!(
            names,
            [
                "query-1node",
                "query-2nodes",
                "persist-always-1node",
                "persist-always-2nodes",
                "persist-never-1node",
                "persist-never-2nodes"
            ]
        );
        for row in &report.asks {
            assert!(row.sharded_per_s > 0.0 && row.direct_per_s > 0.0, "{row:?}");
            assert!((row.ratio - row.sharded_per_s / row.direct_per_s).abs() < 1e-9);
            assert_eq!(row.vs_one_node.is_some(), row.nodes == 2, "{row:?}");
        }
        assert_eq!(report.failovers.len(), 1);
        assert_eq!(report.failovers[0].workload, "failover-ddata");
        assert_eq!(report.failovers[0].entities, 20);
        assert!(
            !params.dir.exists(),
            "the benchmark leaves its directory behind"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_workloads_named_run() {
        let dir = tempfile::tempdir().unwrap();
        let mut params = ShardingBenchParams {
            entities: 10,
            callers: 2,
            phase: Duration::from_millis(100),
            ..ShardingBenchParams::quick(dir.path().join("bench"))
        };
        params.only(&[ShardingWorkloadKind::PersistNever]);
        assert!(params.failover_modes.is_empty());
        let report = run(params, true).await.unwrap();
        let names: Vec<&str> = report.asks.iter().map(|r| r.workload.as_str()).collect();
        assert_eq!(names, ["persist-never-1node", "persist-never-2nodes"]);
        assert!(report.asks[1].vs_one_node.is_some());
        assert!(report.failovers.is_empty());

        let mut params = ShardingBenchParams::full(dir.path().join("other"));
        params.only(&[ShardingWorkloadKind::Query, ShardingWorkloadKind::Failover]);
        assert_eq!(params.asks, [ShardingWorkloadKind::Query]);
        assert_eq!(params.failover_modes.len(), 2);
    }
}
