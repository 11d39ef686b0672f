//! The replicated journal on three nodes in one process: in-memory transport and replica
//! stores, membership set by the test.

#[path = "cluster/by_slice.rs"]
mod by_slice;
#[path = "cluster/fenced.rs"]
mod fenced;

use bytes::Bytes;
use futures::StreamExt;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tessera_cluster::node::ClusterSnapshot;
use tessera_cluster::transport::{MemoryNetwork, MemoryTransport, Transport};
use tessera_cluster::{Address, Member, MemberStatus, UniqueAddress};
use tessera_journal::{
    AtomicWrite, FsyncPolicy, Journal, JournalConfig, JournalError, Manifest, NewEvent,
    RocksJournal,
};
use tessera_persistence::{
    MemoryReplicaStore, Persistence, PersistenceMetrics, PersistenceSettings, ReplicaStore,
    RocksReplicaStore,
};
use tessera_snapshot::{
    RocksSnapshotStore, SnapshotConfig, SnapshotMetadata, SnapshotSelectionCriteria, SnapshotStore,
};
use tokio::sync::watch;

struct Node {
    transport: Arc<MemoryTransport>,
    /// The replica store in memory, unless the cluster runs on RocksDB stores.
    store: Arc<MemoryReplicaStore>,
    persistence: Persistence,
    membership: watch::Sender<ClusterSnapshot>,
    /// The node's list of the stores it saw in the cluster.
    known_stores: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn member(address: &Address, uid: u64) -> Member {
    Member {
        unique_address: UniqueAddress::new(address.clone(), uid),
        status: MemberStatus::Up,
        roles: BTreeSet::new(),
        up_number: uid as i32,
        app_version: "test".into(),
    }
}

fn snapshot(me: usize, addresses: &[Address]) -> ClusterSnapshot {
    let members: Vec<Member> = addresses
        .iter()
        .enumerate()
        .map(|(i, a)| member(a, i as u64 + 1))
        .collect();
    ClusterSnapshot {
        self_node: Some(members[me].unique_address.clone()),
        self_status: Some(MemberStatus::Up),
        members,
        converged: true,
        ..ClusterSnapshot::default()
    }
}

fn settings() -> PersistenceSettings {
    let mut settings = PersistenceSettings::default();
    settings.writers.writer.request_timeout = Duration::from_millis(500);
    settings.writers.writer.operation_timeout = Duration::from_secs(2);
    settings.writers.writer.recovery_timeout = Duration::from_secs(3);
    settings.maintenance.scan_interval = Duration::from_millis(100);
    settings
}

async fn cluster(n: usize) -> (Arc<MemoryNetwork>, Vec<Node>) {
    cluster_with(n, settings()).await
}

async fn cluster_with(n: usize, settings: PersistenceSettings) -> (Arc<MemoryNetwork>, Vec<Node>) {
    cluster_on(n, settings, false).await
}

/// A cluster whose replica stores are in memory, or (`rocks`) the nodes' RocksDB journals.
async fn cluster_on(
    n: usize,
    settings: PersistenceSettings,
    rocks: bool,
) -> (Arc<MemoryNetwork>, Vec<Node>) {
    cluster_prepared(n, settings, rocks, |_, _| {}).await
}

/// As [`cluster_on`], with `prepare(i, dir)` run on node `i`'s data directory before the
/// node starts.
async fn cluster_prepared(
    n: usize,
    settings: PersistenceSettings,
    rocks: bool,
    prepare: impl Fn(usize, &std::path::Path),
) -> (Arc<MemoryNetwork>, Vec<Node>) {
    let network = MemoryNetwork::new(7);
    let addresses: Vec<Address> = (0..n)
        .map(|i| Address::new("10.0.0.1", 7000 + i as u16))
        .collect();
    let mut nodes = Vec::new();
    for (i, address) in addresses.iter().enumerate() {
        let transport = network.bind(i as u64 + 1, address.clone()).unwrap();
        let store = MemoryReplicaStore::new(100 + i as u64);
        let dir = tempfile::tempdir().unwrap();
        prepare(i, dir.path());
        let mut config = JournalConfig::new(dir.path().join("journal"));
        config.fsync = FsyncPolicy::Never;
        let queries = Arc::new(RocksJournal::open(config).await.unwrap());
        let replicas: Arc<dyn ReplicaStore> = if rocks {
            RocksReplicaStore::new(queries.clone())
        } else {
            store.clone()
        };
        let snapshots = Arc::new(
            RocksSnapshotStore::open(SnapshotConfig::new(dir.path().join("snapshots")))
                .await
                .unwrap(),
        );
        let (membership, watch) = watch::channel(snapshot(i, &addresses));
        let known_stores = dir.path().join("known-stores");
        let persistence = Persistence::start(
            transport.clone(),
            watch,
            replicas,
            snapshots,
            queries,
            PersistenceSettings {
                known_stores_path: Some(known_stores.clone()),
                ..settings.clone()
            },
        )
        .unwrap();
        nodes.push(Node {
            transport,
            store,
            persistence,
            membership,
            known_stores,
            _dir: dir,
        });
    }
    (network, nodes)
}

/// A replica of the configuration on another node than `node`.
fn replica_elsewhere(
    config: &tessera_replication::Configuration,
    node: &Node,
) -> tessera_replication::ReplicaId {
    let local = &node.transport.local().address;
    config
        .members
        .iter()
        .find(|m| m.address != *local)
        .expect("a replica on another node")
        .clone()
}

fn write(pid: &str, seq: u64, text: &str) -> AtomicWrite {
    AtomicWrite {
        persistence_id: pid.into(),
        writer_id: "w".into(),
        events: vec![NewEvent {
            sequence_nr: seq,
            timestamp_ms: 1,
            manifest: Manifest::new("test", 1),
            payload: Bytes::from(text.to_string()),
            tags: Vec::new(),
        }],
    }
}

async fn payloads(journal: &dyn Journal, pid: &str) -> Vec<String> {
    journal
        .replay(pid, 1, u64::MAX, u64::MAX)
        .map(|e| String::from_utf8(e.unwrap().payload.to_vec()).unwrap())
        .collect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_written_on_one_node_are_recovered_on_another() {
    let (_network, nodes) = cluster(3).await;
    let a = nodes[0].persistence.journal.clone();
    assert_eq!(a.highest_sequence_nr("log-1").await.unwrap(), 0);
    for seq in 1..=20 {
        a.append(write("log-1", seq, &format!("e{seq}")))
            .await
            .unwrap();
    }
    // Each acknowledged append was timed, from the call to the write quorum's answer.
    let appends = &nodes[0].persistence.metrics.append_durations;
    let text = tessera_metrics::to_text("append_seconds", appends);
    assert_eq!(
        tessera_metrics::count_in(&text, "append_seconds"),
        20,
        "{text}"
    );
    assert!(
        text.contains("append_seconds_bucket{le=\"+Inf\"} 20\n"),
        "{text}"
    );
    // Every replica holds at least the acknowledged prefix of W of them.
    let held = nodes
        .iter()
        .filter(|n| n.store.entries("log-1").len() >= 19)
        .count();
    assert!(held >= 2, "{held} replicas hold the log");
    // An operator sees the configuration and every replica's state. The replica outside
    // the write quorum may still be behind when the last append is acknowledged (its answers
    // were not waited for); the writer brings it up to date, which the view shows.
    let caught_up =
        |summary: &tessera_replication::LogSummary| summary.last.seq >= 19 && summary.lac >= 18;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let inspection = loop {
        let inspection = nodes[2].persistence.journal.inspect("log-1").await;
        let all_caught_up = inspection
            .replicas
            .iter()
            .all(|r| r.summary.as_ref().is_some_and(caught_up));
        if all_caught_up || tokio::time::Instant::now() >= deadline {
            break inspection;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let config = inspection.config.expect("a configuration");
    assert_eq!(config.config.members.len(), 3);
    assert_eq!(inspection.replicas.len(), 3);
    for replica in &inspection.replicas {
        assert!(replica.reachable && !replica.wrong_storage, "{replica:?}");
        let summary = replica.summary.as_ref().unwrap();
        assert!(caught_up(summary), "{summary:?}");
    }
    assert!(inspection.writer.is_none(), "node 3 writes nothing");
    let b = nodes[1].persistence.journal.clone();
    let expected: Vec<String> = (1..=20).map(|s| format!("e{s}")).collect();
    assert_eq!(payloads(b.as_ref(), "log-1").await, expected);
    assert_eq!(b.highest_sequence_nr("log-1").await.unwrap(), 20);
    // B writes on; A, which B fenced, can write nothing more: its writer is refused, or,
    // if it noticed the fence and starts again, the log no longer ends where it thinks.
    b.append(write("log-1", 21, "from-b")).await.unwrap();
    let refused = a.append(write("log-1", 21, "from-a")).await;
    let refused = refused.unwrap_err();
    assert!(
        matches!(
            refused,
            JournalError::OutcomeUnknown { .. }
                | JournalError::Fenced { .. }
                | JournalError::SequenceMismatch { .. }
        ),
        "{refused}"
    );
    let mut expected = expected;
    expected.push("from-b".into());
    assert_eq!(
        payloads(nodes[2].persistence.journal.as_ref(), "log-1").await,
        expected
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lost_the_log_cannot_confirm_a_read() {
    let (_network, nodes) = cluster(3).await;
    let a = nodes[0].persistence.journal.clone();
    let b = nodes[1].persistence.journal.clone();
    a.append(write("log-2", 1, "x")).await.unwrap();
    a.confirm_writer("log-2", 1).await.unwrap();
    assert_eq!(b.highest_sequence_nr("log-2").await.unwrap(), 1);
    let stale = a.confirm_writer("log-2", 1).await.unwrap_err();
    assert!(matches!(stale, JournalError::Fenced { .. }), "{stale}");
    b.confirm_writer("log-2", 1).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_down_keeps_writing_two_down_refuses() {
    let (network, nodes) = cluster(3).await;
    let a = nodes[0].persistence.journal.clone();
    a.append(write("log-3", 1, "one")).await.unwrap();
    network.crash(&nodes[2].transport.local().address);
    let two = a.append(write("log-3", 2, "two")).await;
    eprintln!("{:?}", a.writer_status("log-3").await);
    two.unwrap();
    network.crash(&nodes[1].transport.local().address);
    let error = a.append(write("log-3", 3, "three")).await.unwrap_err();
    assert!(
        matches!(
            error,
            JournalError::OutcomeUnknown { .. } | JournalError::Unavailable { .. }
        ),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_go_through_the_writer_and_cover_deleted_events_on_another_node() {
    let (_network, nodes) = cluster(3).await;
    let a = &nodes[0].persistence;
    for seq in 1..=10 {
        a.journal
            .append(write("log-4", seq, &format!("e{seq}")))
            .await
            .unwrap();
    }
    let metadata = SnapshotMetadata {
        persistence_id: "log-4".into(),
        sequence_nr: 8,
        timestamp_ms: 5,
    };
    a.snapshots
        .save(
            metadata,
            Manifest::new("state", 1),
            Bytes::from_static(b"up to 8"),
        )
        .await
        .unwrap();
    a.journal.delete_to("log-4", 8).await.unwrap();
    // Another node recovers: the snapshot from the replicas, then the events after it.
    let b = &nodes[1].persistence;
    let loaded = b
        .snapshots
        .load("log-4", SnapshotSelectionCriteria::latest())
        .await
        .unwrap()
        .expect("a snapshot");
    assert_eq!(loaded.metadata.sequence_nr, 8);
    assert_eq!(loaded.payload, Bytes::from_static(b"up to 8"));
    let after: Vec<String> = b
        .journal
        .replay("log-4", 9, u64::MAX, u64::MAX)
        .map(|e| String::from_utf8(e.unwrap().payload.to_vec()).unwrap())
        .collect()
        .await;
    assert_eq!(after, vec!["e9", "e10"]);
    // A, fenced by B's recovery, can no longer save snapshots.
    let stale = a
        .snapshots
        .save(
            SnapshotMetadata {
                persistence_id: "log-4".into(),
                sequence_nr: 10,
                timestamp_ms: 6,
            },
            Manifest::new("state", 1),
            Bytes::from_static(b"stale"),
        )
        .await
        .unwrap_err();
    // A learns of the takeover either from this save's replies or earlier, from its own
    // background checks of the log; both refuse the save.
    let refused = stale.to_string();
    assert!(
        refused.contains("taken over") || refused.contains("does not write the log"),
        "{refused}"
    );
    let latest = b
        .snapshots
        .load("log-4", SnapshotSelectionCriteria::latest())
        .await
        .unwrap()
        .expect("a snapshot");
    assert_eq!(latest.payload, Bytes::from_static(b"up to 8"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_log_moves_off_a_member_that_left() {
    let mut settings = settings();
    settings.writers.writer_idle_timeout = Duration::from_millis(300);
    let (network, nodes) = cluster_with(4, settings).await;
    let a = nodes[0].persistence.journal.clone();
    for seq in 1..=5 {
        a.append(write("log-5", seq, &format!("e{seq}")))
            .await
            .unwrap();
    }
    let status = a.writer_status("log-5").await.unwrap();
    let config = status.config.unwrap();
    // The writer goes idle and is dropped: nobody writes the log any more.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while a.writer_status("log-5").await.is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the idle writer stays"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A member of the log's configuration other than this node leaves the cluster for good.
    let gone_store = replica_elsewhere(&config, &nodes[0]);
    let gone = gone_store.address.clone();
    // A store a member runs cannot be forgotten.
    let refused = a
        .forget_store(gone_store.storage_id, &[])
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            tessera_persistence::ForgetStoreError::Running { .. }
        ),
        "{refused}"
    );
    let spare = nodes
        .iter()
        .map(|n| n.transport.local().address.clone())
        .find(|addr| !config.members.iter().any(|m| &m.address == addr))
        .unwrap();
    network.crash(&gone);
    let remaining: Vec<Address> = nodes
        .iter()
        .map(|n| n.transport.local().address.clone())
        .filter(|addr| *addr != gone)
        .collect();
    for (i, node) in nodes.iter().enumerate() {
        let address = node.transport.local().address.clone();
        if address == gone {
            continue;
        }
        let me = remaining.iter().position(|a| *a == address).unwrap();
        let _ = i;
        node.membership.send_replace(snapshot(me, &remaining));
    }
    // Nobody writes the log; within bounded time its replicas are the spare and the two
    // that stayed, and the spare holds every event.
    let spare_node = nodes
        .iter()
        .find(|n| n.transport.local().address == spare)
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let held = spare_node.store.entries("log-5").len();
        let meta = spare_node.store.meta("log-5");
        let moved = meta
            .as_ref()
            .and_then(|m| m.config.as_ref())
            .is_some_and(|c| {
                !c.config.is_joint()
                    && c.config.members.iter().any(|m| m.address == spare)
                    && !c.config.members.iter().any(|m| m.address == gone)
            });
        if held == 5 && moved {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the log did not move to {spare}: {held} events there, meta {meta:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every event is still readable from another node.
    let expected: Vec<String> = (1..=5).map(|s| format!("e{s}")).collect();
    assert_eq!(
        payloads(spare_node.persistence.journal.as_ref(), "log-5").await,
        expected
    );
    // No log names the gone store any more: an operator may forget it (the stores that
    // held the log's older configuration may still name it for a moment).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match a.forget_store(gone_store.storage_id, &[]).await {
            Ok(()) => break,
            Err(tessera_persistence::ForgetStoreError::Named { .. })
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let known = a.known_stores().await.unwrap();
    assert_eq!(known.len(), 3, "{known:?}");
    assert!(known.iter().all(|s| s.storage_id != gone_store.storage_id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_rocksdb_stores_a_log_moves_between_nodes_with_its_tags_and_deletes() {
    let (_network, nodes) = cluster_on(3, settings(), true).await;
    let a = nodes[0].persistence.journal.clone();
    for seq in 1..=30 {
        let mut w = write("log-6", seq, &format!("e{seq}"));
        if seq.is_multiple_of(3) {
            w.events[0].tags = vec!["third".into()];
        }
        a.append(w).await.unwrap();
    }
    let b = nodes[1].persistence.journal.clone();
    let expected: Vec<String> = (1..=30).map(|s| format!("e{s}")).collect();
    assert_eq!(payloads(b.as_ref(), "log-6").await, expected);
    b.append(write("log-6", 31, "e31")).await.unwrap();
    b.delete_to("log-6", 10).await.unwrap();
    let c = nodes[2].persistence.journal.clone();
    let rest: Vec<String> = (11..=31).map(|s| format!("e{s}")).collect();
    assert_eq!(payloads(c.as_ref(), "log-6").await, rest);
    assert_eq!(c.highest_sequence_nr("log-6").await.unwrap(), 31);
    // Every node's own store answers tag queries over the logs it holds.
    for node in &nodes {
        let tagged: Vec<u64> = node
            .persistence
            .journal
            .events_by_tag("third", 0, tessera_journal::QueryMode::Current)
            .map(|e| e.unwrap().event.sequence_nr)
            .collect()
            .await;
        // Deleted events (up to 10) are gone from the replicas that deleted them.
        assert!(tagged.iter().all(|s| s.is_multiple_of(3)), "{tagged:?}");
        assert!(
            (12..=30).step_by(3).all(|s| tagged.contains(&s)),
            "{tagged:?}"
        );
    }
}

/// The whole log as its writer on this node holds it, confirmed current: a node whose
/// writer another took the log from (without its knowing yet) reads again after recovering.
async fn current_payloads(journal: &dyn Journal, pid: &str) -> Vec<String> {
    for _ in 0..10 {
        let highest = journal.highest_sequence_nr(pid).await.unwrap();
        let read = payloads(journal, pid).await;
        if journal.confirm_writer(pid, highest).await.is_ok() {
            return read;
        }
    }
    panic!("{pid} could not be read and confirmed");
}

/// What writers on every node were told about their appends to one log.
#[derive(Default)]
struct Answers {
    acknowledged: Vec<String>,
    not_applied: Vec<String>,
    unknown: Vec<String>,
    inconsistent: Vec<String>,
}

/// Writers on every node append to four logs at once, each taking a log over from the others
/// (an entity activated on several nodes, as before sharding places it once), the logs
/// created together. Every append acknowledged is in its log once; none answered "not
/// applied" is; the replicas never disagree about what was acknowledged.
async fn dueling_writers(rocks: bool) {
    let (_network, nodes) = cluster_on(3, settings(), rocks).await;
    let answers = Arc::new(std::sync::Mutex::new(Answers::default()));
    let end = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        for task in 0..4 {
            let journal = node.persistence.journal.clone();
            let answers = answers.clone();
            tasks.push(tokio::spawn(async move {
                let mut i = 0;
                while tokio::time::Instant::now() < end {
                    i += 1;
                    let text = format!("n{n}-t{task}-{i}");
                    let pid = format!("duel-{task}");
                    let result = match journal.highest_sequence_nr(&pid).await {
                        Ok(highest) => journal.append(write(&pid, highest + 1, &text)).await,
                        Err(e) => Err(e),
                    };
                    let mut answers = answers.lock().unwrap();
                    match result {
                        Ok(()) => answers.acknowledged.push(text),
                        Err(e) if e.to_string().contains("inconsistent") => {
                            answers.inconsistent.push(e.to_string())
                        }
                        Err(e) if e.is_not_applied() => answers.not_applied.push(text),
                        Err(_) => answers.unknown.push(text),
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let answers = std::mem::take(&mut *answers.lock().unwrap());
    assert!(
        answers.inconsistent.is_empty(),
        "{:?}",
        &answers.inconsistent[..answers.inconsistent.len().min(5)]
    );
    assert!(!answers.acknowledged.is_empty());
    let mut seen = BTreeSet::new();
    let mut log = Vec::new();
    for task in 0..4 {
        log.extend(
            current_payloads(
                nodes[0].persistence.journal.as_ref(),
                &format!("duel-{task}"),
            )
            .await,
        );
    }
    for text in &log {
        assert!(seen.insert(text.clone()), "{text} is in the log twice");
    }
    for text in &answers.acknowledged {
        assert!(seen.contains(text), "acknowledged {text} is not in the log");
    }
    for text in &answers.not_applied {
        assert!(
            !seen.contains(text),
            "{text}, answered not applied, is in the log"
        );
    }
    println!(
        "{} acknowledged, {} not applied, {} unknown; the logs hold {}",
        answers.acknowledged.len(),
        answers.not_applied.len(),
        answers.unknown.len(),
        log.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dueling_writers_in_memory_stores() {
    dueling_writers(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dueling_writers_on_rocksdb_stores() {
    dueling_writers(true).await;
}

/// A log no member knows is created only once membership has converged: a first use while it
/// has not waits for it (within the recovery timeout) rather than failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_log_waits_for_membership_to_converge() {
    let (_network, nodes) = cluster(3).await;
    for node in &nodes {
        node.membership.send_modify(|s| s.converged = false);
    }
    let journal = nodes[0].persistence.journal.clone();
    let first_use = tokio::spawn(async move { journal.highest_sequence_nr("log-new").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !first_use.is_finished(),
        "created before membership converged"
    );
    for node in &nodes {
        node.membership.send_modify(|s| s.converged = true);
    }
    assert_eq!(first_use.await.unwrap().unwrap(), 0);
    let a = nodes[0].persistence.journal.clone();
    a.append(write("log-new", 1, "e1")).await.unwrap();
    assert_eq!(
        payloads(nodes[1].persistence.journal.as_ref(), "log-new").await,
        ["e1"]
    );
}

/// Found by `tessera soak`: an entity that started on a node while that node's writer of its
/// log was moving the log off a member that left asked for the log (`Ready`) during the move,
/// and was never answered: the writer serves again after a move without announcing it, so the
/// entity's recovery waited for ever and every command to it timed out.
/// Crashes a member of `pid`'s configuration other than node 0 (whose writer serves the log),
/// tells the others it left, and returns once node 0's writer is moving the log off it. Every
/// message to and from node 0 takes `delay`, so that the move (locating the spare, then two
/// rounds of fencing) lasts long enough to ask something during it.
async fn start_moving_off_a_member(
    network: &MemoryNetwork,
    nodes: &[Node],
    pid: &str,
    delay: Duration,
) -> Address {
    let journal = &nodes[0].persistence.journal;
    let here = nodes[0].transport.local().address.clone();
    let config = journal.writer_status(pid).await.unwrap().config.unwrap();
    let gone = config
        .members
        .iter()
        .find(|m| m.address != here)
        .unwrap()
        .address
        .clone();
    for node in nodes {
        let other = node.transport.local().address.clone();
        if other != here {
            network.set_delay(&here, &other, delay);
            network.set_delay(&other, &here, delay);
        }
    }
    network.crash(&gone);
    let remaining: Vec<Address> = nodes
        .iter()
        .map(|n| n.transport.local().address.clone())
        .filter(|address| *address != gone)
        .collect();
    for node in nodes {
        let address = node.transport.local().address.clone();
        if let Some(me) = remaining.iter().position(|a| *a == address) {
            node.membership.send_replace(snapshot(me, &remaining));
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let phase = journal.writer_status(pid).await.map(|s| s.phase);
        if phase.is_some_and(|p| p != "serving") {
            return gone;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the writer never moved the log off {gone}: {phase:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_asked_while_the_writer_moves_the_log_is_answered_when_it_serves_again() {
    let (network, nodes) = cluster(4).await;
    let a = nodes[0].persistence.journal.clone();
    for seq in 1..=3 {
        a.append(write("log-m", seq, &format!("e{seq}")))
            .await
            .unwrap();
    }
    let gone =
        start_moving_off_a_member(&network, &nodes, "log-m", Duration::from_millis(150)).await;
    let journal = a.clone();
    let asked = tokio::spawn(async move { journal.highest_sequence_nr("log-m").await });
    let answer = tokio::time::timeout(Duration::from_secs(15), asked)
        .await
        .expect("the read asked during the move is never answered")
        .unwrap();
    assert_eq!(answer.unwrap(), 3);
    let status = a.writer_status("log-m").await.unwrap();
    assert_eq!(status.phase, "serving");
    assert!(
        !status
            .config
            .unwrap()
            .members
            .iter()
            .any(|m| m.address == gone),
        "the log did not move off {gone}"
    );
}

/// Found by `tessera soak`: after the whole cluster was downed and restarted, the first node
/// back was Up alone while the others still joined; a log none of its members (itself) knew
/// looked new, and its writer created it again there — an acknowledged history replaced by
/// an empty one. The node remembers the stores it saw in the cluster (in its data
/// directory), and a log is created only when fewer than W of them are unheard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_up_alone_after_a_full_restart_does_not_create_a_log_again() {
    let dir = tempfile::tempdir().unwrap();
    let known_path = dir.path().join("known-stores");
    let (network, nodes) = cluster(5).await;
    let writer = nodes[0].persistence.journal.clone();
    for seq in 1..=3 {
        writer
            .append(write("log-r", seq, &format!("e{seq}")))
            .await
            .unwrap();
    }
    let config = writer.writer_status("log-r").await.unwrap().config.unwrap();
    let addresses: Vec<Address> = nodes
        .iter()
        .map(|n| n.transport.local().address.clone())
        .collect();
    let stranger = addresses
        .iter()
        .position(|a| !config.members.iter().any(|m| &m.address == a))
        .expect("five nodes, three replicas");
    // The stranger's probes of the members found the five stores, and its list says so.
    let node = &nodes[stranger];
    wait_for_stores_on_disk(node, 5, "the stranger's").await;
    // It restarts with that list and is Up alone: the others are not members yet.
    std::fs::copy(&node.known_stores, &known_path).unwrap();
    let restarted_settings = PersistenceSettings {
        known_stores_path: Some(known_path.clone()),
        ..settings()
    };
    network.crash(&addresses[stranger]);
    let transport = network.bind(99, addresses[stranger].clone()).unwrap();
    let others = tempfile::tempdir().unwrap();
    let mut config = JournalConfig::new(others.path().join("journal"));
    config.fsync = FsyncPolicy::Never;
    let queries = Arc::new(RocksJournal::open(config).await.unwrap());
    let snapshots = Arc::new(
        RocksSnapshotStore::open(SnapshotConfig::new(others.path().join("snapshots")))
            .await
            .unwrap(),
    );
    let alone = [addresses[stranger].clone()];
    let (membership, watch) = watch::channel(snapshot(0, &alone));
    let restarted = Persistence::start(
        transport,
        watch,
        node.store.clone(),
        snapshots,
        queries,
        restarted_settings,
    )
    .unwrap();
    let refused = restarted
        .journal
        .highest_sequence_nr("log-r")
        .await
        .unwrap_err();
    assert!(
        matches!(refused, JournalError::Unavailable { .. }),
        "{refused}"
    );
    assert!(refused.to_string().contains("could hold it"), "{refused}");
    assert!(
        node.store.meta("log-r").is_none(),
        "the log was created on the node up alone: {:?}",
        node.store.meta("log-r")
    );
    // Its list survived and still names the five.
    let reloaded = tessera_persistence::KnownStores::load(&known_path).unwrap();
    assert_eq!(reloaded.len(), 5);
    // Once the others are members again, the log is found with its history.
    let mut order = vec![addresses[stranger].clone()];
    order.extend(
        addresses
            .iter()
            .filter(|a| **a != addresses[stranger])
            .cloned(),
    );
    membership.send_replace(snapshot(0, &order));
    assert_eq!(
        payloads(restarted.journal.as_ref(), "log-r").await,
        ["e1", "e2", "e3"]
    );
}

/// A save of the known-stores file that fails is tried again a second later: the list does
/// not change again once every member's store is in it, so without that a passing write
/// error would leave the file without stores a restart needs to remember.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_save_of_the_known_stores_is_tried_again() {
    // A directory where node 0 writes its list before renaming it fails every save.
    let obstacle = |dir: &std::path::Path| dir.join("known-stores.new");
    let (_network, nodes) = cluster_prepared(3, settings(), false, |i, dir| {
        if i == 0 {
            std::fs::create_dir(obstacle(dir)).unwrap();
        }
    })
    .await;
    let node = &nodes[0];
    let failures = || PersistenceMetrics::get(&node.persistence.metrics.known_stores_save_failures);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while node.persistence.journal.known_stores().await.unwrap().len() < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "node 0 knows only {:?}",
            node.persistence.journal.known_stores().await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Two failures more once the list is whole: the saves it handed out for its changes
    // are over, so only the retries can write the file once the obstacle is gone.
    let whole = failures();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while failures() < whole + 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} failed saves, {whole} when the list was whole",
            failures()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        tessera_persistence::KnownStores::load(&node.known_stores)
            .unwrap()
            .len(),
        0,
        "a save succeeded through the obstacle"
    );
    std::fs::remove_dir(obstacle(node.known_stores.parent().unwrap())).unwrap();
    wait_for_stores_on_disk(node, 3, "after the obstacle went, node 0's").await;
}

/// Waits (at most 10 s) until `node`'s known-stores file names `stores` stores.
async fn wait_for_stores_on_disk(node: &Node, stores: usize, whose: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let on_disk = tessera_persistence::KnownStores::load(&node.known_stores).unwrap();
        if on_disk.len() == stores {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{whose} list on disk is {on_disk:?}, not {stores} stores"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A store that a log's latest configuration still names cannot be forgotten: the log is
/// not moved off it here (no writer runs, and maintenance never takes a log over), so every
/// known store is asked and the configurations name it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_a_log_still_names_is_not_forgotten() {
    let mut settings = settings();
    settings.writers.writer_idle_timeout = Duration::from_millis(300);
    settings.maintenance.takeover_grace = Duration::from_secs(3600);
    let (network, nodes) = cluster_with(4, settings).await;
    let a = nodes[0].persistence.journal.clone();
    a.append(write("log-n", 1, "e1")).await.unwrap();
    let config = a.writer_status("log-n").await.unwrap().config.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while a.writer_status("log-n").await.is_some() || a.known_stores().await.unwrap().len() < 4 {
        assert!(tokio::time::Instant::now() < deadline, "the writer stays");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let gone = replica_elsewhere(&config, &nodes[0]);
    network.crash(&gone.address);
    let remaining: Vec<Address> = nodes
        .iter()
        .map(|n| n.transport.local().address.clone())
        .filter(|address| *address != gone.address)
        .collect();
    for node in &nodes {
        let address = node.transport.local().address.clone();
        if let Some(me) = remaining.iter().position(|a| *a == address) {
            node.membership.send_replace(snapshot(me, &remaining));
        }
    }
    let refused = a.forget_store(gone.storage_id, &[]).await.unwrap_err();
    match &refused {
        tessera_persistence::ForgetStoreError::Named { log, .. } => assert_eq!(log, "log-n"),
        other => panic!("{other}"),
    }
    assert_eq!(a.known_stores().await.unwrap().len(), 4);
}
