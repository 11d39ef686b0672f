//! The tokio driver ([`tessera_cluster::node`]) over the in-memory transport, in paused tokio
//! time: event subscriptions, and a partition resolved by the split-brain resolver.

use std::sync::Arc;
use std::time::Duration;
use tessera_cluster::core::{ClusterCoreConfig, DowningConfig, StopReason};
use tessera_cluster::events::ClusterEvent;
use tessera_cluster::node::{self, ClusterHandle};
use tessera_cluster::transport::MemoryNetwork;
use tessera_cluster::{Address, MemberStatus};

fn address(i: u16) -> Address {
    Address::new("10.1.0.1", 25520 + i)
}

fn start(network: &Arc<MemoryNetwork>, i: u16, stable_after: Duration) -> ClusterHandle {
    let transport = network.bind(u64::from(i) + 1000, address(i)).expect("bind");
    let mut config = ClusterCoreConfig::default();
    config.membership.seed_nodes = vec![address(0)];
    config.downing = Some(DowningConfig {
        stable_after,
        ..DowningConfig::default()
    });
    node::start(transport, config).expect("start")
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

fn all_up(handles: &[&ClusterHandle], n: usize) -> bool {
    handles.iter().all(|h| {
        let s = h.snapshot();
        s.members.len() == n && s.members.iter().all(|m| m.status == MemberStatus::Up)
    })
}

#[tokio::test(start_paused = true)]
async fn subscription_starts_with_current_state_then_reports_changes() {
    let network = MemoryNetwork::new(7);
    let first = start(&network, 0, Duration::from_secs(20));
    wait_until("first node up", Duration::from_secs(10), || {
        all_up(&[&first], 1)
    })
    .await;

    let (state, mut events) = first.subscribe().await.expect("subscribe");
    assert_eq!(
        state.members.len(),
        1,
        "the current state comes first: {state:?}"
    );
    assert_eq!(state.members[0].status, MemberStatus::Up);
    assert_eq!(state.leader.as_ref(), Some(first.self_node()));

    let second = start(&network, 1, Duration::from_secs(20));
    wait_until("both up", Duration::from_secs(10), || {
        all_up(&[&first, &second], 2)
    })
    .await;
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(event);
    }
    let joined = seen
        .iter()
        .position(|e| matches!(e, ClusterEvent::MemberJoined(m) if m.address() == &address(1)));
    let up = seen
        .iter()
        .position(|e| matches!(e, ClusterEvent::MemberUp(m) if m.address() == &address(1)));
    assert!(
        matches!((joined, up), (Some(j), Some(u)) if j < u),
        "MemberJoined then MemberUp for the new node, got {seen:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn isolated_node_downs_itself_and_the_rest_remove_it() {
    let network = MemoryNetwork::new(11);
    let handles: Vec<ClusterHandle> = (0..3)
        .map(|i| start(&network, i, Duration::from_secs(2)))
        .collect();
    let refs: Vec<&ClusterHandle> = handles.iter().collect();
    wait_until("three up", Duration::from_secs(20), || all_up(&refs, 3)).await;

    let (_, mut events) = handles[0].subscribe().await.expect("subscribe");
    network.partition(&address(2), &address(0));
    network.partition(&address(2), &address(1));

    let isolated = handles[2].clone();
    let stopped = tokio::time::timeout(Duration::from_secs(60), isolated.stopped())
        .await
        .expect("the isolated node stops");
    assert_eq!(
        stopped,
        Some(StopReason::Downed),
        "a minority of one downs itself"
    );
    wait_until("the majority removed it", Duration::from_secs(60), || {
        all_up(&refs[..2], 2)
    })
    .await;

    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(event);
    }
    let position = |pred: &dyn Fn(&ClusterEvent) -> bool| seen.iter().position(pred);
    let unreachable = position(
        &|e| matches!(e, ClusterEvent::UnreachableMember(m) if m.address() == &address(2)),
    );
    let downed =
        position(&|e| matches!(e, ClusterEvent::MemberDowned(m) if m.address() == &address(2)));
    let removed = position(
        &|e| matches!(e, ClusterEvent::MemberRemoved { member, previous_status: MemberStatus::Down } if member.address() == &address(2)),
    );
    assert!(
        matches!((unreachable, downed, removed), (Some(a), Some(b), Some(c)) if a < b && b < c),
        "unreachable, then downed, then removed; got {seen:?}"
    );
}
