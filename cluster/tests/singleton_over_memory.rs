//! Cluster singletons and their proxies on real cluster nodes over the in-memory transport,
//! in paused tokio time: the instance runs on the oldest, moves when the oldest leaves (the
//! old one stopped first) or crashes, and proxies' requests are buffered across the move.

use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tessera_cluster::core::{ClusterCoreConfig, DowningConfig};
use tessera_cluster::node::{self, ClusterHandle, ClusterSnapshot};
use tessera_cluster::singleton::{
    InstanceContext, InstancePhase, ProxyError, SingletonSettings, Singletons,
};
use tessera_cluster::transport::{
    Lane, MemoryNetwork, MemoryTransport, RemoteError, RequestError, Transport, services,
};
use tessera_cluster::{Address, Member, MemberStatus, UniqueAddress};
use tokio::sync::watch;
use tokio::task::JoinHandle;

fn address(i: usize) -> Address {
    Address::new("10.2.0.1", 25520 + u16::try_from(i).expect("small"))
}

/// What the instances did, across all nodes.
#[derive(Default)]
struct Log {
    running: AtomicUsize,
    max_running: AtomicUsize,
    events: Mutex<Vec<(usize, &'static str)>>,
}

impl Log {
    fn event(&self, node: usize, what: &'static str) {
        self.events.lock().expect("log").push((node, what));
    }

    fn events(&self) -> Vec<(usize, &'static str)> {
        self.events.lock().expect("log").clone()
    }
}

/// An instance that answers each request with its node's number and takes `stop_delay` to
/// stop (so that a successor starting early would overlap with it).
fn instance(
    node: usize,
    log: Arc<Log>,
    stop_delay: Duration,
) -> impl FnMut(InstanceContext) -> JoinHandle<()> + Send + 'static {
    move |mut context: InstanceContext| {
        let log = log.clone();
        tokio::spawn(async move {
            let running = log.running.fetch_add(1, Ordering::SeqCst) + 1;
            log.max_running.fetch_max(running, Ordering::SeqCst);
            log.event(node, "start");
            loop {
                tokio::select! {
                    _ = context.stop.cancelled() => break,
                    Some(request) = context.requests.recv() => {
                        let answer = format!("{node}:{}", String::from_utf8_lossy(&request.payload));
                        let _ = request.responder.respond(Bytes::from(answer));
                    }
                }
            }
            tokio::time::sleep(stop_delay).await;
            log.event(node, "stop");
            log.running.fetch_sub(1, Ordering::SeqCst);
        })
    }
}

fn settings() -> SingletonSettings {
    SingletonSettings {
        hand_over_retry_interval: Duration::from_millis(500),
        min_hand_over_retries: 4,
        ..SingletonSettings::default()
    }
}

struct TestNode {
    cluster: ClusterHandle,
    singletons: Singletons<MemoryTransport>,
}

fn start_node(network: &Arc<MemoryNetwork>, i: usize) -> TestNode {
    let transport = network
        .bind(u64::try_from(i).expect("small") + 500, address(i))
        .expect("bind");
    let mut config = ClusterCoreConfig::default();
    config.membership.seed_nodes = vec![address(0)];
    config.downing = Some(DowningConfig {
        stable_after: Duration::from_secs(2),
        ..DowningConfig::default()
    });
    let cluster = node::start(transport.clone(), config).expect("start");
    let singletons = Singletons::start(transport.clone(), cluster.watch()).expect("singletons");
    TestNode {
        cluster,
        singletons,
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

async fn three_nodes_with_a_singleton(
    seed: u64,
    log: &Arc<Log>,
) -> (
    Arc<MemoryNetwork>,
    Vec<TestNode>,
    Vec<tessera_cluster::singleton::ClusterSingleton>,
) {
    let network = MemoryNetwork::new(seed);
    // One at a time, so that node 0 is the oldest.
    let mut nodes = Vec::new();
    for i in 0..3 {
        nodes.push(start_node(&network, i));
        let refs: Vec<&TestNode> = nodes.iter().collect();
        wait_until("nodes up", Duration::from_secs(20), || all_up(&refs, i + 1)).await;
    }
    let singletons = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            node.singletons
                .start_singleton(
                    "counter",
                    settings(),
                    instance(i, log.clone(), Duration::from_millis(700)),
                )
                .expect("singleton")
        })
        .collect();
    (network, nodes, singletons)
}

#[tokio::test(start_paused = true)]
async fn the_instance_moves_to_the_next_oldest_only_after_the_leaving_one_stopped() {
    let log = Arc::new(Log::default());
    let (_network, nodes, singletons) = three_nodes_with_a_singleton(21, &log).await;
    wait_until(
        "the instance runs on node 0",
        Duration::from_secs(10),
        || log.events() == vec![(0, "start")],
    )
    .await;
    for singleton in &singletons {
        assert_eq!(
            singleton.status().oldest.as_ref(),
            Some(nodes[0].cluster.self_node())
        );
    }
    let proxy = nodes[2]
        .singletons
        .proxy("counter", settings())
        .expect("proxy");
    assert_eq!(
        proxy.request(Bytes::from_static(b"a")).await,
        Ok(Bytes::from_static(b"0:a"))
    );

    // Node 0 leaves while node 2 keeps asking, one request every 100 ms.
    let asking = tokio::spawn({
        let proxy = proxy.clone();
        async move {
            let mut answers = Vec::new();
            for i in 0..60 {
                let request = proxy.request(Bytes::from(format!("r{i}")));
                answers.push(tokio::time::timeout(Duration::from_secs(30), request).await);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            answers
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    nodes[0].cluster.leave(address(0)).await.expect("leave");
    tokio::time::timeout(Duration::from_secs(30), singletons[0].retired())
        .await
        .expect("node 0 hands over");
    wait_until(
        "the instance runs on node 1",
        Duration::from_secs(30),
        || singletons[1].status().phase == InstancePhase::Running,
    )
    .await;
    let answers = asking.await.expect("asking task");
    let events = log.events();
    assert_eq!(
        events,
        vec![(0, "start"), (0, "stop"), (1, "start")],
        "node 1 starts only after node 0's instance stopped"
    );
    assert_eq!(log.max_running.load(Ordering::SeqCst), 1);
    let mut by = [0usize; 3];
    for (i, answer) in answers.iter().enumerate() {
        let answer = answer
            .as_ref()
            .unwrap_or_else(|_| panic!("request {i} waited 30 s"))
            .as_ref()
            .unwrap_or_else(|e| panic!("request {i} failed: {e}"));
        let text = String::from_utf8_lossy(answer);
        assert!(text.ends_with(&format!(":r{i}")), "answer {text} to r{i}");
        let node: usize = text[..1].parse().expect("node number");
        by[node] += 1;
    }
    assert!(
        by[0] > 0 && by[1] > 0 && by[2] == 0,
        "answered by node 0 before the move and node 1 after: {by:?}"
    );
    assert_eq!(proxy.outstanding(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_crashed_oldest_is_replaced_after_its_removal_and_requests_wait_meanwhile() {
    let log = Arc::new(Log::default());
    let (network, nodes, singletons) = three_nodes_with_a_singleton(22, &log).await;
    wait_until(
        "the instance runs on node 0",
        Duration::from_secs(10),
        || log.events() == vec![(0, "start")],
    )
    .await;
    let proxy = nodes[2]
        .singletons
        .proxy("counter", settings())
        .expect("proxy");
    assert_eq!(
        proxy.request(Bytes::from_static(b"a")).await,
        Ok(Bytes::from_static(b"0:a"))
    );

    // Node 0's process dies: its instance with it.
    network.crash(&address(0));
    nodes[0].cluster.abort();
    nodes[0].singletons.shutdown();
    let crashed = nodes[0].cluster.self_node().clone();
    // A request already on its way to the dead node has an unknown outcome: it fails.
    let lost = proxy.request(Bytes::from_static(b"lost")).await;
    assert!(
        matches!(lost, Err(ProxyError::Request { .. })),
        "a request to a crashed node times out: {lost:?}"
    );
    // Node 1 starts the instance only once node 0 is gone from its view (unreachable is not
    // enough, nor Down), and requests wait in the proxy meanwhile.
    let asking = tokio::spawn({
        let proxy = proxy.clone();
        async move {
            // Once node 2 no longer sends to node 0.
            tokio::time::sleep(Duration::from_secs(1)).await;
            proxy.request(Bytes::from_static(b"b")).await
        }
    });
    wait_until("node 1 runs the instance", Duration::from_secs(60), || {
        let running = singletons[1].status().phase == InstancePhase::Running;
        if running {
            let view = nodes[1].cluster.snapshot();
            assert!(
                view.members.iter().all(|m| m.unique_address != crashed),
                "node 1 started while node 0 was still a member: {:?}",
                view.members
            );
        }
        running
    })
    .await;
    let answer = tokio::time::timeout(Duration::from_secs(30), asking)
        .await
        .expect("answered")
        .expect("task");
    assert_eq!(answer, Ok(Bytes::from_static(b"1:b")));
    // Node 0's tasks live on in this process; shutting its singletons down stands for the
    // process's death.
    assert_eq!(log.events().last(), Some(&(1, "start")));
    assert_eq!(log.max_running.load(Ordering::SeqCst), 1);
}

fn member(node: &UniqueAddress, status: MemberStatus, up_number: i32) -> Member {
    Member {
        unique_address: node.clone(),
        status,
        roles: Default::default(),
        up_number,
        app_version: "1".into(),
    }
}

#[tokio::test(start_paused = true)]
async fn the_proxy_buffers_until_there_is_an_instance_and_refuses_beyond_its_capacity() {
    let network = MemoryNetwork::new(23);
    let transport = network.bind(1, address(0)).expect("bind");
    let (membership, view) = watch::channel(ClusterSnapshot::default());
    let singletons = Singletons::start(transport.clone(), view).expect("singletons");
    let log = Arc::new(Log::default());
    let settings = SingletonSettings {
        proxy_buffer_capacity: 2,
        ..settings()
    };
    let _singleton = singletons
        .start_singleton(
            "counter",
            settings.clone(),
            instance(0, log.clone(), Duration::ZERO),
        )
        .expect("singleton");
    let proxy = singletons.proxy("counter", settings).expect("proxy");
    let first = tokio::spawn({
        let proxy = proxy.clone();
        async move { proxy.request(Bytes::from_static(b"1")).await }
    });
    let second = tokio::spawn({
        let proxy = proxy.clone();
        async move { proxy.request(Bytes::from_static(b"2")).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(proxy.outstanding(), 2, "both wait: no member is known");
    assert_eq!(
        proxy.request(Bytes::from_static(b"3")).await,
        Err(ProxyError::BufferFull {
            name: "counter".into(),
            capacity: 2
        })
    );
    let me = transport.local().clone();
    membership.send_replace(ClusterSnapshot {
        self_node: Some(me.clone()),
        self_status: Some(MemberStatus::Up),
        members: vec![member(&me, MemberStatus::Up, 1)],
        ..ClusterSnapshot::default()
    });
    assert_eq!(first.await.expect("task"), Ok(Bytes::from_static(b"0:1")));
    assert_eq!(second.await.expect("task"), Ok(Bytes::from_static(b"0:2")));
    assert_eq!(log.events(), vec![(0, "start")]);
}

#[tokio::test(start_paused = true)]
async fn malformed_frames_get_a_typed_error_and_change_nothing() {
    let network = MemoryNetwork::new(24);
    let target = network.bind(1, address(0)).expect("bind");
    let sender = network.bind(2, address(1)).expect("bind");
    let (_membership, view) = watch::channel(ClusterSnapshot::default());
    let singletons = Singletons::start(target.clone(), view).expect("singletons");
    for garbage in [&b""[..], &[1, 0xff, 0xff, 0xff], &[9, 1, 2]] {
        let answer = sender
            .request(
                &address(0),
                services::SINGLETON,
                Lane::Control,
                Bytes::copy_from_slice(garbage),
                Duration::from_secs(1),
            )
            .await;
        assert!(
            matches!(
                answer,
                Err(RequestError::Remote {
                    error: RemoteError::Rejected { .. },
                    ..
                })
            ),
            "{garbage:?} answered {answer:?}"
        );
    }
    sender
        .send(
            &address(0),
            services::SINGLETON,
            Lane::Control,
            Bytes::from_static(&[1, 0xff]),
        )
        .expect("sent");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        singletons.counters().decode_errors.load(Ordering::Relaxed),
        4
    );
}
