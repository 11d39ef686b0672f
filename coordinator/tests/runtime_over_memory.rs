//! The sharding runtime on real cluster nodes over the in-memory transport, in paused tokio
//! time, with counter entities whose state lives in one shared map (as a journal would keep
//! it): commands reach one live copy per entity from any node, a crashed node's shards come
//! back on the others, a joining node receives shards, a node that hands off its shards
//! loses no command, remembered entities follow their shard through a handoff, and a caller
//! that gives up on a forwarded ask leaves nothing behind.

use futures::FutureExt;
use futures::future::BoxFuture;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tessera_cluster::core::{ClusterCoreConfig, DowningConfig};
use tessera_cluster::node::{self, ClusterHandle};
use tessera_cluster::singleton::Singletons;
use tessera_cluster::transport::{MemoryNetwork, MemoryTransport};
use tessera_cluster::{Address, MemberStatus};
use tessera_coordinator::host::{AskFailure, EntityNote, Payload, ShardHost};
use tessera_coordinator::remember::RememberStore;
use tessera_coordinator::runtime::{RememberEntitiesSetup, RuntimeSettings, ShardedType, Sharding};
use tessera_coordinator::settings::ShardingSettings;
use tessera_coordinator::store::{CoordinatorStore, MemoryStore, StoreError};
use tessera_coordinator::{ShardId, shard_of};
use tessera_entities::EntityId;
use tokio::sync::mpsc;

#[path = "runtime_over_memory/typed.rs"]
mod typed;

fn address(i: usize) -> Address {
    Address::new("10.3.0.1", 25520 + u16::try_from(i).expect("small"))
}

/// Counters shared by every node (the "journal"), and which node runs each entity now.
#[derive(Default)]
struct World {
    counts: Mutex<HashMap<String, u64>>,
    /// entity → nodes running it; more than one is a double activation.
    running: Mutex<HashMap<String, HashSet<usize>>>,
    double_activations: Mutex<Vec<String>>,
    /// Remembered entities, when the test runs the type with remember-entities.
    remembered: Option<Arc<MemoryRemember>>,
    /// How many more `start_entities` calls the hosts refuse (as if their queues were full).
    starts_to_refuse: Mutex<usize>,
}

/// Remembered entity ids by shard, shared by every node (as Distributed Data would be).
#[derive(Default)]
struct MemoryRemember {
    ids: Arc<Mutex<BTreeMap<ShardId, BTreeSet<String>>>>,
    /// How long a write takes before its changes are visible (and it answers): zero writes
    /// at once.
    write_delay: Mutex<Duration>,
    /// Reads fail (the store is unavailable) until this moment.
    reads_fail_until: Mutex<Option<tokio::time::Instant>>,
    /// Reads asked of the store.
    reads: Mutex<usize>,
    /// Reads are refused for good (a damaged store) while set.
    reads_refused: Mutex<bool>,
}

impl RememberStore for MemoryRemember {
    fn entities(&self, shard: ShardId) -> BoxFuture<'static, Result<BTreeSet<String>, StoreError>> {
        *self.reads.lock().unwrap() += 1;
        if *self.reads_refused.lock().unwrap() {
            let error = StoreError::Fatal("damaged".into());
            return futures::future::ready(Err(error)).boxed();
        }
        if self
            .reads_fail_until
            .lock()
            .unwrap()
            .is_some_and(|until| tokio::time::Instant::now() < until)
        {
            let error = StoreError::Unavailable("no quorum".into());
            return futures::future::ready(Err(error)).boxed();
        }
        let ids = self
            .ids
            .lock()
            .unwrap()
            .get(&shard)
            .cloned()
            .unwrap_or_default();
        futures::future::ready(Ok(ids)).boxed()
    }

    fn update(
        &self,
        shard: ShardId,
        started: Vec<String>,
        stopped: Vec<String>,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let apply = {
            let all = self.ids.clone();
            move || {
                let mut all = all.lock().unwrap();
                let ids = all.entry(shard).or_default();
                ids.extend(started);
                for id in stopped {
                    ids.remove(&id);
                }
            }
        };
        let delay = *self.write_delay.lock().unwrap();
        if delay.is_zero() {
            apply();
            return futures::future::ready(Ok(())).boxed();
        }
        async move {
            tokio::time::sleep(delay).await;
            apply();
            Ok(())
        }
        .boxed()
    }

    fn shards(&self) -> BoxFuture<'static, Result<BTreeSet<ShardId>, StoreError>> {
        let shards = self.ids.lock().unwrap().keys().copied().collect();
        futures::future::ready(Ok(shards)).boxed()
    }
}

struct CounterHost {
    node: usize,
    world: Arc<World>,
    live: Mutex<HashSet<String>>,
    /// Where the host tells its region that an entity started (remember-entities).
    notes: Option<mpsc::Sender<EntityNote>>,
}

impl ShardHost for CounterHost {
    fn ask(
        &self,
        entity_id: &str,
        command: Payload,
    ) -> BoxFuture<'static, Result<Payload, AskFailure>> {
        // The test's callers send bytes, and they stay bytes on every node.
        let payload = command.into_bytes().expect("bytes");
        if payload == b"passivate" {
            // The entity stops itself: its region forgets it when it is remembered.
            if self.live.lock().unwrap().remove(entity_id) {
                if let Some(nodes) = self.world.running.lock().unwrap().get_mut(entity_id) {
                    nodes.remove(&self.node);
                }
                if let Some(notes) = &self.notes {
                    notes
                        .try_send(EntityNote::Passivated(entity_id.to_string()))
                        .expect("room for the note");
                }
            }
            return futures::future::ready(Ok(Payload::Encoded(b"passivated".to_vec()))).boxed();
        }
        let newly = self.live.lock().unwrap().insert(entity_id.to_string());
        if newly {
            let mut running = self.world.running.lock().unwrap();
            let nodes = running.entry(entity_id.to_string()).or_default();
            nodes.insert(self.node);
            if nodes.len() > 1 {
                self.world
                    .double_activations
                    .lock()
                    .unwrap()
                    .push(format!("{entity_id} on {nodes:?}"));
            }
            if let Some(notes) = &self.notes {
                notes
                    .try_send(EntityNote::Started(entity_id.to_string()))
                    .expect("room for the note");
            }
        }
        let mut counts = self.world.counts.lock().unwrap();
        let count = counts.entry(entity_id.to_string()).or_insert(0);
        if payload == b"inc" {
            *count += 1;
        }
        let answer = count.to_string().into_bytes();
        futures::future::ready(Ok(Payload::Encoded(answer))).boxed()
    }

    fn stop_entities(&self, entity_ids: Vec<String>) -> BoxFuture<'static, ()> {
        let mut live = self.live.lock().unwrap();
        let mut running = self.world.running.lock().unwrap();
        for id in entity_ids {
            if live.remove(&id)
                && let Some(nodes) = running.get_mut(&id)
            {
                nodes.remove(&self.node);
            }
        }
        futures::future::ready(()).boxed()
    }

    fn live_entity_ids(&self) -> BoxFuture<'static, Vec<String>> {
        let ids = self.live.lock().unwrap().iter().cloned().collect();
        futures::future::ready(ids).boxed()
    }

    fn start_entities(&self, entity_ids: Vec<String>) -> Vec<String> {
        {
            let mut refuse = self.world.starts_to_refuse.lock().unwrap();
            if *refuse > 0 {
                *refuse -= 1;
                return entity_ids;
            }
        }
        for id in entity_ids {
            drop(self.ask(&id, Payload::Encoded(b"get".to_vec())));
        }
        Vec::new()
    }
}

struct TestNode {
    cluster: ClusterHandle,
    sharding: Sharding<MemoryTransport>,
    _singletons: Singletons<MemoryTransport>,
}

fn sharding_settings() -> ShardingSettings {
    ShardingSettings {
        number_of_shards: 30,
        rebalance_interval: Duration::from_secs(2),
        retry_interval: Duration::from_millis(500),
        ..ShardingSettings::default()
    }
}

fn start_node(
    network: &Arc<MemoryNetwork>,
    i: usize,
    world: &Arc<World>,
    store: &Arc<MemoryStore>,
) -> TestNode {
    start_node_with(network, i, world, store, sharding_settings())
}

fn start_node_with(
    network: &Arc<MemoryNetwork>,
    i: usize,
    world: &Arc<World>,
    store: &Arc<MemoryStore>,
    settings: ShardingSettings,
) -> TestNode {
    let transport = network
        .bind(u64::try_from(i).expect("small") + 700, address(i))
        .expect("bind");
    let mut config = ClusterCoreConfig::default();
    config.membership.seed_nodes = vec![address(0)];
    config.downing = Some(DowningConfig {
        stable_after: Duration::from_secs(2),
        ..DowningConfig::default()
    });
    let cluster = node::start(transport.clone(), config).expect("start");
    let singletons = Singletons::start(transport.clone(), cluster.watch()).expect("singletons");
    let (notes, notes_from_host) = mpsc::channel(1_024);
    let host = Arc::new(CounterHost {
        node: i,
        world: world.clone(),
        live: Mutex::new(HashSet::new()),
        notes: world.remembered.is_some().then_some(notes),
    });
    let sharding = Sharding::start(
        transport,
        cluster.watch(),
        &singletons,
        vec![ShardedType {
            type_name: "counter".into(),
            host: Some(host),
            settings,
            role: None,
            store: store.clone() as Arc<dyn CoordinatorStore>,
            remember: world.remembered.clone().map(|store| RememberEntitiesSetup {
                store: store as Arc<dyn RememberStore>,
                notes: notes_from_host,
            }),
            message_version: 1,
        }],
        RuntimeSettings::default(),
    )
    .expect("sharding");
    TestNode {
        cluster,
        sharding,
        _singletons: singletons,
    }
}

async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn all_up(nodes: &[&TestNode], n: usize) -> bool {
    nodes.iter().all(|node| {
        let s = node.cluster.snapshot();
        s.members.len() == n && s.members.iter().all(|m| m.status == MemberStatus::Up)
    })
}

async fn cluster(
    n: usize,
    world: &Arc<World>,
    store: &Arc<MemoryStore>,
) -> (Arc<MemoryNetwork>, Vec<TestNode>) {
    cluster_with(n, world, store, sharding_settings()).await
}

async fn cluster_with(
    n: usize,
    world: &Arc<World>,
    store: &Arc<MemoryStore>,
    settings: ShardingSettings,
) -> (Arc<MemoryNetwork>, Vec<TestNode>) {
    let network = MemoryNetwork::new(5);
    let mut nodes = Vec::new();
    for i in 0..n {
        nodes.push(start_node_with(&network, i, world, store, settings.clone()));
        let refs: Vec<&TestNode> = nodes.iter().collect();
        wait_until("nodes up", Duration::from_secs(30), || all_up(&refs, i + 1)).await;
    }
    let refs: Vec<&TestNode> = nodes.iter().collect();
    wait_until("regions registered", Duration::from_secs(30), || {
        refs.iter().all(|n| n.sharding.all_registered())
    })
    .await;
    (network, nodes)
}

async fn inc(node: &TestNode, entity: &str) -> Result<u64, AskFailure> {
    let reply = node
        .sharding
        .ask("counter", entity, Payload::Encoded(b"inc".to_vec()))
        .await?;
    let reply = reply.into_bytes().expect("bytes");
    Ok(String::from_utf8(reply).unwrap().parse().unwrap())
}

/// Which node's region runs each entity, from every node's `region_state`.
async fn placement(nodes: &[&TestNode]) -> BTreeMap<String, Vec<usize>> {
    let mut placed: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, node) in nodes.iter().enumerate() {
        let state = node.sharding.region_state("counter").await.expect("state");
        for (_, ids) in state.shards {
            for id in ids {
                placed.entry(id).or_default().push(i);
            }
        }
    }
    placed
}

#[tokio::test(start_paused = true)]
async fn every_entity_lives_on_one_node_and_answers_from_any() {
    let world = Arc::new(World::default());
    let store = Arc::new(MemoryStore::default());
    let (_network, nodes) = cluster(3, &world, &store).await;
    for round in 1..=3u64 {
        for e in 0..60 {
            let node = &nodes[(e + round as usize) % 3];
            assert_eq!(inc(node, &format!("e{e}")).await, Ok(round));
        }
    }
    let refs: Vec<&TestNode> = nodes.iter().collect();
    let placed = placement(&refs).await;
    assert_eq!(placed.len(), 60);
    assert!(placed.values().all(|nodes| nodes.len() == 1), "{placed:?}");
    let used: HashSet<usize> = placed.values().map(|n| n[0]).collect();
    assert_eq!(used.len(), 3, "every node hosts shards: {placed:?}");
    assert!(world.double_activations.lock().unwrap().is_empty());
    // An id the entities runtime refuses is a clear error that applied nothing.
    let error = nodes[0]
        .sharding
        .ask("counter", "", Payload::Encoded(b"inc".to_vec()))
        .await
        .unwrap_err();
    assert_eq!(
        error.outcome,
        tessera_coordinator::host::AskOutcome::NotApplied
    );
}

/// A remember store holding `ids`, each under its shard.
fn remembering(ids: &[String]) -> Arc<MemoryRemember> {
    let remembered = Arc::new(MemoryRemember::default());
    let number_of_shards = sharding_settings().number_of_shards;
    for id in ids {
        let shard = shard_of(&EntityId::new(id).unwrap(), number_of_shards);
        remembered
            .update(shard, vec![id.clone()], Vec::new())
            .now_or_never();
    }
    remembered
}

/// A shard's remembered entities that its host could not take at once (full queues) are
/// offered again on a later tick: they run without a message sent to them.
#[tokio::test(start_paused = true)]
async fn remembered_entities_a_full_host_refused_are_started_on_a_later_tick() {
    let ids: Vec<String> = (0..30).map(|e| format!("r{e}")).collect();
    let remembered = remembering(&ids);
    let world = Arc::new(World {
        remembered: Some(remembered),
        // More than the shards holding the 30 ids: every shard's first offer is refused.
        starts_to_refuse: Mutex::new(40),
        ..World::default()
    });
    let store = Arc::new(MemoryStore::default());
    let (_network, _nodes) = cluster(3, &world, &store).await;
    wait_until(
        "every remembered entity running",
        Duration::from_secs(30),
        || {
            let running = world.running.lock().unwrap();
            ids.iter()
                .all(|id| running.get(id).is_some_and(|nodes| nodes.len() == 1))
        },
    )
    .await;
    assert_eq!(*world.starts_to_refuse.lock().unwrap(), 0, "refusals left");
    assert!(world.double_activations.lock().unwrap().is_empty());
}

/// A world whose entities are remembered in `remembered`, on one node (each shard lands
/// once, so each remembered id is started once).
async fn one_node_remembering(
    remembered: &Arc<MemoryRemember>,
) -> (Arc<World>, Arc<MemoryNetwork>, TestNode) {
    let world = Arc::new(World {
        remembered: Some(remembered.clone()),
        ..World::default()
    });
    let store = Arc::new(MemoryStore::default());
    let (network, mut nodes) = cluster(1, &world, &store).await;
    let node = nodes.pop().expect("one node");
    (world, network, node)
}

/// Waits until each of `ids` runs on some node.
async fn wait_running(world: &World, ids: &[String], limit: Duration) {
    wait_until("the remembered entities running", limit, || {
        let running = world.running.lock().unwrap();
        ids.iter()
            .all(|id| running.get(id).is_some_and(|nodes| !nodes.is_empty()))
    })
    .await;
}

/// Ids in the remember store that are not valid entity ids (a damaged or foreign store) are
/// neither offered to the host nor counted as started; the valid ones of the same shard are.
#[tokio::test(start_paused = true)]
async fn remembered_ids_that_are_not_entity_ids_are_not_started_or_counted() {
    let ids: Vec<String> = (0..10).map(|e| format!("v{e}")).collect();
    let remembered = remembering(&ids);
    let shard = shard_of(
        &EntityId::new("v0").unwrap(),
        sharding_settings().number_of_shards,
    );
    let invalid = vec![String::new(), "bad\u{1}id".to_string()];
    remembered
        .update(shard, invalid.clone(), Vec::new())
        .now_or_never();
    let (world, _network, node) = one_node_remembering(&remembered).await;
    wait_running(&world, &ids, Duration::from_secs(30)).await;
    let running = world.running.lock().unwrap();
    for id in &invalid {
        assert!(!running.contains_key(id), "{id:?} was offered to the host");
    }
    assert_eq!(
        node.sharding.counters().snapshot().remembered_started,
        ids.len() as u64
    );
}

/// Remembered entities run again once their store answers, however long it was away: the
/// read of each shard's ids is retried for as long as the shard runs here (two minutes here,
/// several times what ten retries would last).
#[tokio::test(start_paused = true)]
async fn remembered_entities_start_once_a_long_unavailable_store_answers() {
    let ids: Vec<String> = (0..10).map(|e| format!("u{e}")).collect();
    let remembered = remembering(&ids);
    let unavailable_for = Duration::from_secs(120);
    *remembered.reads_fail_until.lock().unwrap() =
        Some(tokio::time::Instant::now() + unavailable_for);
    let (world, _network, node) = one_node_remembering(&remembered).await;
    wait_running(&world, &ids, unavailable_for + Duration::from_secs(60)).await;
    assert_eq!(
        node.sharding.counters().snapshot().remembered_started,
        ids.len() as u64
    );
}

/// A read of remembered entities the store refuses for good is not repeated: each shard
/// holding remembered entities reads once, and its entities start on their next message.
#[tokio::test(start_paused = true)]
async fn a_remembered_entities_read_refused_for_good_is_not_repeated() {
    let ids: Vec<String> = (0..5).map(|e| format!("f{e}")).collect();
    let remembered = remembering(&ids);
    *remembered.reads_refused.lock().unwrap() = true;
    let (world, _network, node) = one_node_remembering(&remembered).await;
    wait_until(
        "a read of every shard with remembered entities",
        Duration::from_secs(30),
        || *remembered.reads.lock().unwrap() >= 1,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let shards: BTreeSet<ShardId> = remembered.ids.lock().unwrap().keys().copied().collect();
    assert_eq!(*remembered.reads.lock().unwrap(), shards.len());
    assert!(world.running.lock().unwrap().is_empty());
    inc(&node, "f0").await.expect("f0 starts on its message");
}

/// An entity that passivated while its shard's read of remembered entities was in flight is
/// not brought back by that read, even when the read was answered before the entity's stop
/// was stored.
#[tokio::test(start_paused = true)]
async fn an_entity_passivated_during_the_read_of_remembered_entities_stays_stopped() {
    let ids: Vec<String> = (0..5).map(|e| format!("q{e}")).collect();
    let remembered = remembering(&ids);
    // Writes take 10 s, and reads fail until the entity passivated: the read answers with
    // the ids stored before the entity's start and stop below are.
    *remembered.write_delay.lock().unwrap() = Duration::from_secs(10);
    *remembered.reads_fail_until.lock().unwrap() =
        Some(tokio::time::Instant::now() + Duration::from_secs(3_600));
    let (world, _network, node) = one_node_remembering(&remembered).await;
    inc(&node, "q0").await.expect("q0 answers");
    let passivated = node
        .sharding
        .ask("counter", "q0", Payload::Encoded(b"passivate".to_vec()))
        .await
        .expect("q0 passivates");
    assert_eq!(passivated.into_bytes().unwrap(), b"passivated");
    *remembered.reads_fail_until.lock().unwrap() = None;
    wait_running(&world, &ids[1..], Duration::from_secs(30)).await;
    // Past every write: the start's, then the stop's.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let running = world.running.lock().unwrap();
    assert!(
        running.get("q0").is_none_or(|nodes| nodes.is_empty()),
        "q0 was brought back"
    );
    let shard = shard_of(
        &EntityId::new("q0").unwrap(),
        sharding_settings().number_of_shards,
    );
    let stored = remembered.ids.lock().unwrap().get(&shard).cloned();
    assert!(
        !stored.unwrap_or_default().contains("q0"),
        "q0 is still remembered"
    );
}

/// A world whose entities are remembered in a store whose writes take `write_delay`.
fn remembering_world(write_delay: Duration) -> (Arc<MemoryRemember>, Arc<World>) {
    let remembered = Arc::new(MemoryRemember {
        write_delay: Mutex::new(write_delay),
        ..MemoryRemember::default()
    });
    let world = Arc::new(World {
        remembered: Some(remembered.clone()),
        ..World::default()
    });
    (remembered, world)
}

/// An entity started just before its shard is handed off: its remembered-entity write is
/// still under way (each takes a second here) when the shard's entities have stopped. The
/// shard is reported stopped only once the write is stored, so its next home reads the
/// entity and starts it without a message.
#[tokio::test(start_paused = true)]
async fn entities_started_just_before_a_handoff_are_started_at_the_shards_next_home() {
    let (remembered, world) = remembering_world(Duration::from_secs(1));
    // The coordinator's state with remember-entities on: shards handed off are allocated
    // again without a message.
    let store = Arc::new(MemoryStore::new(true));
    let (_network, nodes) = cluster(2, &world, &store).await;
    for e in 0..20 {
        assert_eq!(inc(&nodes[1], &format!("h{e}")).await, Ok(1));
    }
    let on_node_1: Vec<String> = {
        let running = world.running.lock().unwrap();
        (0..20)
            .map(|e| format!("h{e}"))
            .filter(|id| running.get(id).is_some_and(|nodes| nodes.contains(&1)))
            .collect()
    };
    assert!(!on_node_1.is_empty(), "some entities run on node 1");
    // At once: the notes of the starts are not stored yet.
    assert!(
        nodes[1]
            .sharding
            .hand_off_all(Duration::from_secs(30))
            .await
    );
    wait_until(
        "node 1's entities running on node 0 without a message",
        Duration::from_secs(30),
        || {
            let running = world.running.lock().unwrap();
            on_node_1.iter().all(|id| {
                running
                    .get(id)
                    .is_some_and(|nodes| nodes.len() == 1 && nodes.contains(&0))
            })
        },
    )
    .await;
    assert!(world.double_activations.lock().unwrap().is_empty());
    let stored = remembered.ids.lock().unwrap().clone();
    for id in &on_node_1 {
        let shard = shard_of(
            &EntityId::new(id).unwrap(),
            sharding_settings().number_of_shards,
        );
        assert!(
            stored.get(&shard).is_some_and(|ids| ids.contains(id)),
            "{id} remembered"
        );
    }
}

/// A remember-entities store that does not answer within the handoff timeout does not stop
/// a handoff: the region waits for the shard's writes for half the timeout (the coordinator's
/// own counts from before the stop), then reports the shard stopped without them.
#[tokio::test(start_paused = true)]
async fn a_handoff_does_not_wait_for_a_remember_store_that_does_not_answer() {
    let (_remembered, world) = remembering_world(Duration::from_secs(3_600));
    let store = Arc::new(MemoryStore::new(true));
    let settings = ShardingSettings {
        handoff_timeout: Duration::from_secs(4),
        ..sharding_settings()
    };
    let (_network, nodes) = cluster_with(2, &world, &store, settings).await;
    for e in 0..20 {
        assert_eq!(inc(&nodes[1], &format!("w{e}")).await, Ok(1));
    }
    assert!(
        nodes[1]
            .sharding
            .hand_off_all(Duration::from_secs(30))
            .await,
        "node 1 handed off its shards"
    );
    assert_eq!(nodes[1].sharding.region_gauges()[0].1.shards, 0);
    // Within the coordinator's (node 0's) timeout: it gave up none of the handoffs.
    let coordinator = nodes[0].sharding.coordinator_gauges()[0].1.clone();
    assert!(coordinator.running);
    assert_eq!(coordinator.handoffs_given_up, 0, "{coordinator:?}");
    // Their entities answer from node 0 (started by their next command).
    for e in 0..20 {
        assert_eq!(inc(&nodes[0], &format!("w{e}")).await, Ok(2));
    }
    assert!(world.double_activations.lock().unwrap().is_empty());
}

/// A caller that gives up on an ask forwarded to another node (its future dropped before
/// the reply) leaves no reply slot behind while the reply is still to come.
#[tokio::test(start_paused = true)]
async fn an_ask_its_caller_dropped_leaves_no_reply_slot() {
    let world = Arc::new(World::default());
    let store = Arc::new(MemoryStore::default());
    let (network, nodes) = cluster(2, &world, &store).await;
    // Entities whose shards node 0 hosts, asked once through node 1 so that node 1 knows
    // their home and forwards its callers' asks itself.
    let mut on_node_0 = Vec::new();
    for e in 0..20 {
        let id = format!("d{e}");
        assert_eq!(inc(&nodes[1], &id).await, Ok(1));
        if world.running.lock().unwrap()[&id].contains(&0) {
            on_node_0.push(id);
        }
    }
    assert!(!on_node_0.is_empty(), "some entities run on node 0");
    assert_eq!(nodes[1].sharding.replies_awaited("counter"), Some(0));
    // Node 1's frames now take a minute to reach node 0; each caller gives up after 100 ms.
    network.set_delay(&address(1), &address(0), Duration::from_secs(60));
    for id in &on_node_0 {
        let gave_up = tokio::time::timeout(Duration::from_millis(100), inc(&nodes[1], id)).await;
        assert!(gave_up.is_err(), "{id} answered: {gave_up:?}");
    }
    assert_eq!(nodes[1].sharding.replies_awaited("counter"), Some(0));
}

#[tokio::test(start_paused = true)]
async fn a_crashed_nodes_shards_come_back_on_the_others() {
    let world = Arc::new(World::default());
    let store = Arc::new(MemoryStore::default());
    let (network, nodes) = cluster(3, &world, &store).await;
    for e in 0..40 {
        assert_eq!(inc(&nodes[e % 3], &format!("e{e}")).await, Ok(1));
    }
    // Node 0 runs the coordinator (the oldest) and some entities.
    network.crash(&address(0));
    let survivors = [&nodes[1], &nodes[2]];
    wait_until("node 0 removed", Duration::from_secs(60), || {
        survivors
            .iter()
            .all(|n| n.cluster.snapshot().members.len() == 2)
    })
    .await;
    for e in 0..40 {
        let mut answer = Err(None);
        for _ in 0..20 {
            match inc(survivors[e % 2], &format!("e{e}")).await {
                Ok(count) => {
                    answer = Ok(count);
                    break;
                }
                Err(error) => answer = Err(Some(error)),
            }
        }
        // A command that timed out may have been applied; the count is 2 or 3.
        let count = answer.unwrap_or_else(|last| panic!("e{e} never answered: {last:?}"));
        assert!((2..=3).contains(&count), "e{e}: {count}");
    }
    let placed = placement(&survivors).await;
    assert!(placed.values().all(|nodes| nodes.len() == 1), "{placed:?}");
}

#[tokio::test(start_paused = true)]
async fn a_joining_node_receives_shards_and_a_leaving_one_hands_them_off() {
    let world = Arc::new(World::default());
    let store = Arc::new(MemoryStore::default());
    let (network, mut nodes) = cluster(2, &world, &store).await;
    for e in 0..60 {
        assert_eq!(inc(&nodes[e % 2], &format!("e{e}")).await, Ok(1));
    }
    nodes.push(start_node(&network, 2, &world, &store));
    let refs: Vec<&TestNode> = nodes.iter().collect();
    wait_until("three up", Duration::from_secs(30), || all_up(&refs, 3)).await;
    // Commands keep flowing while shards move; every one is answered exactly once.
    let mut expected: HashMap<String, u64> = (0..60).map(|e| (format!("e{e}"), 1)).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut i = 0usize;
    while tokio::time::Instant::now() < deadline {
        let entity = format!("e{}", i % 60);
        let count = inc(&nodes[i % 3], &entity).await.expect("answered");
        let want = expected.get_mut(&entity).unwrap();
        *want += 1;
        assert_eq!(count, *want, "{entity}");
        i += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gauges = nodes[2].sharding.region_gauges();
    assert!(
        gauges[0].1.shards > 0,
        "the new node hosts shards: {gauges:?}"
    );
    // Node 1 hands everything off; its entities answer from the others afterwards.
    assert!(
        nodes[1]
            .sharding
            .hand_off_all(Duration::from_secs(30))
            .await
    );
    assert_eq!(nodes[1].sharding.region_gauges()[0].1.shards, 0);
    for e in 0..60 {
        let entity = format!("e{e}");
        let count = inc(&nodes[0], &entity).await.expect("answered");
        let want = expected.get_mut(&entity).unwrap();
        *want += 1;
        assert_eq!(count, *want, "{entity}");
    }
    assert!(world.double_activations.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn nodes_with_different_numbers_of_shards_refuse_the_mismatch() {
    let world = Arc::new(World::default());
    let store = Arc::new(MemoryStore::default());
    let network = MemoryNetwork::new(9);
    let first = start_node(&network, 0, &world, &store);
    wait_until("first up", Duration::from_secs(30), || all_up(&[&first], 1)).await;
    let mut other = sharding_settings();
    other.number_of_shards = 31;
    let second = start_node_with(&network, 1, &world, &store, other);
    wait_until("both up", Duration::from_secs(30), || {
        all_up(&[&first, &second], 2)
    })
    .await;
    wait_until("registered", Duration::from_secs(30), || {
        first.sharding.all_registered() && second.sharding.all_registered()
    })
    .await;
    // Every entity of node 0's shards asked through node 1: a forward to node 0 for a shard
    // that node 0 computes differently is refused, naming the setting.
    let mut refused = 0;
    for e in 0..40 {
        if let Err(failure) = inc(&second, &format!("e{e}")).await
            && failure.message.contains("number_of_shards")
        {
            assert_eq!(
                failure.outcome,
                tessera_coordinator::host::AskOutcome::NotApplied
            );
            refused += 1;
        }
    }
    assert!(refused > 0, "no mismatch was refused");
    assert!(world.double_activations.lock().unwrap().is_empty());
}
