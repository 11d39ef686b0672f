//! The sharding runtime on real cluster nodes over the in-memory transport, in paused tokio
//! time, with counter entities whose state lives in one shared map (as a journal would keep
//! it): commands reach one live copy per entity from any node, a crashed node's shards come
//! back on the others, a joining node receives shards, and a node that hands off its shards
//! loses no command.

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
use tessera_coordinator::host::{AskFailure, ShardHost};
use tessera_coordinator::remember::RememberStore;
use tessera_coordinator::runtime::{RememberEntitiesSetup, RuntimeSettings, ShardedType, Sharding};
use tessera_coordinator::settings::ShardingSettings;
use tessera_coordinator::store::{CoordinatorStore, MemoryStore, StoreError};
use tessera_coordinator::{ShardId, shard_of};
use tessera_entities::EntityId;

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
    ids: Mutex<BTreeMap<ShardId, BTreeSet<String>>>,
}

impl RememberStore for MemoryRemember {
    fn entities(&self, shard: ShardId) -> BoxFuture<'static, Result<BTreeSet<String>, StoreError>> {
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
        let mut all = self.ids.lock().unwrap();
        let ids = all.entry(shard).or_default();
        ids.extend(started);
        for id in stopped {
            ids.remove(&id);
        }
        futures::future::ready(Ok(())).boxed()
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
}

impl ShardHost for CounterHost {
    fn ask(
        &self,
        entity_id: &str,
        payload: Vec<u8>,
    ) -> BoxFuture<'static, Result<Vec<u8>, AskFailure>> {
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
        }
        let mut counts = self.world.counts.lock().unwrap();
        let count = counts.entry(entity_id.to_string()).or_insert(0);
        if payload == b"inc" {
            *count += 1;
        }
        let answer = count.to_string().into_bytes();
        futures::future::ready(Ok(answer)).boxed()
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
            drop(self.ask(&id, b"get".to_vec()));
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
    let host = Arc::new(CounterHost {
        node: i,
        world: world.clone(),
        live: Mutex::new(HashSet::new()),
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
                // No notes: the test writes the remembered ids itself.
                notes: tokio::sync::mpsc::channel(1).1,
            }),
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
    let network = MemoryNetwork::new(5);
    let mut nodes = Vec::new();
    for i in 0..n {
        nodes.push(start_node(&network, i, world, store));
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
        .ask("counter", entity, b"inc".to_vec())
        .await?;
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
        .ask("counter", "", b"inc".to_vec())
        .await
        .unwrap_err();
    assert_eq!(
        error.outcome,
        tessera_coordinator::host::AskOutcome::NotApplied
    );
}

/// A shard's remembered entities that its host could not take at once (full queues) are
/// offered again on a later tick: they run without a message sent to them.
#[tokio::test(start_paused = true)]
async fn remembered_entities_a_full_host_refused_are_started_on_a_later_tick() {
    let remembered = Arc::new(MemoryRemember::default());
    let settings = sharding_settings();
    let ids: Vec<String> = (0..30).map(|e| format!("r{e}")).collect();
    for id in &ids {
        let shard = shard_of(&EntityId::new(id).unwrap(), settings.number_of_shards);
        remembered
            .update(shard, vec![id.clone()], Vec::new())
            .now_or_never();
    }
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
