//! The child of the power-loss loop: a node's four stores on the mount, the check of what
//! they hold after a cut (`found` and `corrupt` lines), and the workload (a line before each
//! write is issued, lower case, and one after it is acknowledged, upper case).

use bytes::Bytes;
use futures::StreamExt;
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_cluster::node::ClusterSnapshot;
use tessera_cluster::transport::MemoryNetwork;
use tessera_cluster::{Address, Member, MemberStatus, UniqueAddress};
use tessera_ddata::node::{ReplicatorHandle, ReplicatorSettings};
use tessera_ddata::replicator::{GetResult, ReplicatorConfig, UpdateResult};
use tessera_ddata::{PNCounter, ReadConsistency, ReplicatedValue, WriteConsistency};
use tessera_journal::{
    AtomicWrite, FsyncPolicy, Journal, JournalConfig, Manifest, NewEvent, RocksJournal,
};
use tessera_persistence::{Persistence, PersistenceSettings, RocksReplicaStore};
use tessera_snapshot::{
    RocksSnapshotStore, SnapshotConfig, SnapshotMetadata, SnapshotSelectionCriteria, SnapshotStore,
};
use tokio::sync::watch;

/// Logs (and snapshot series, and counters) of each kind the workload writes.
const LOGS: usize = 3;
/// A child the parent failed to kill stops by itself after this long.
const CHILD_LIFETIME_MAX: Duration = Duration::from_secs(60);
/// Timeout of a Distributed Data read or write (one node: it never waits for another).
const DDATA_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens the stores in `dir`, prints what they hold, then (unless `verify_only`) writes
/// until killed. Exits with status 2 after an `error` line when a store cannot be opened.
pub fn run(dir: &Path, fsync: FsyncPolicy, verify_only: bool) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let stores = match Stores::open(dir, fsync).await {
            Ok(stores) => stores,
            Err(e) => {
                line(&format!("error opening the stores: {e}"));
                std::process::exit(2);
            }
        };
        line("opened");
        verify(&stores).await;
        line("verified");
        if verify_only {
            // Everything this child had to say is said. The stores' background threads
            // (RocksDB's, the journals' writers) still run: leaving through `exit` would run
            // RocksDB's static destructors under them, which aborts now and then ("pthread
            // lock: Invalid argument") after a check that passed.
            // SAFETY: `_exit` ends the process at once; no Rust code runs after it.
            unsafe { libc::_exit(0) };
        }
        workload(Arc::new(stores)).await;
    });
}

fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Prints one line for the parent, at once.
fn line(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

/// The stores of a three-node cluster in this process, each node's as `tessera node` opens
/// them under its data directory (`node-<i>/`), over the in-memory transport with a fixed
/// membership (all Up): node 0's journal, snapshot store and durable Distributed Data keys
/// are written directly; the replicated journal writes through one node, drawn for each
/// child, to the replica stores of all three (N = 3, W = 2), so that a child takes the logs
/// over from the replicas as the previous cut left them.
struct Stores {
    journal: Arc<RocksJournal>,
    snapshots: Arc<RocksSnapshotStore>,
    /// Every node's replicated journal; `persistence[writer]` is the one written through.
    persistence: Vec<Persistence>,
    writer: usize,
    replicator: ReplicatorHandle,
    _memberships: Vec<watch::Sender<ClusterSnapshot>>,
    _network: Arc<MemoryNetwork>,
}

/// Nodes of the cluster.
const NODES: usize = 3;

impl Stores {
    async fn open(dir: &Path, fsync: FsyncPolicy) -> Result<Self, String> {
        let network = MemoryNetwork::new(1);
        let members: Vec<Member> = (0..NODES)
            .map(|i| Member {
                unique_address: UniqueAddress::new(
                    Address::new("127.0.0.1", 25520 + i as u16),
                    rand::random::<u64>() | 1,
                ),
                status: MemberStatus::Up,
                roles: BTreeSet::new(),
                up_number: i as i32 + 1,
                app_version: "power-loss".into(),
            })
            .collect();
        let view = |me: usize, members: Vec<Member>| ClusterSnapshot {
            self_node: Some(members[me].unique_address.clone()),
            self_status: Some(MemberStatus::Up),
            members,
            converged: true,
            ..ClusterSnapshot::default()
        };
        let mut journals = Vec::new();
        let mut snapshot_stores = Vec::new();
        let mut persistence = Vec::new();
        let mut memberships = Vec::new();
        let mut transports = Vec::new();
        for (i, member) in members.iter().enumerate() {
            let node_dir = dir.join(format!("node-{i}"));
            let mut journal_config = JournalConfig::new(node_dir.join("journal"));
            journal_config.fsync = fsync;
            // Small memtables: flushes to table files (and their MANIFEST records) happen
            // during the workload too, not only when a store recovers.
            journal_config.write_buffer_bytes = 256 * 1024;
            let journal = Arc::new(
                RocksJournal::open(journal_config)
                    .await
                    .map_err(|e| format!("node {i}: journal: {e}"))?,
            );
            let mut snapshot_config = SnapshotConfig::new(node_dir.join("snapshots"));
            snapshot_config.fsync = fsync;
            let snapshots = Arc::new(
                RocksSnapshotStore::open(snapshot_config)
                    .await
                    .map_err(|e| format!("node {i}: snapshot store: {e}"))?,
            );
            let address = &member.unique_address;
            let transport = network
                .bind(address.uid, address.address.clone())
                .map_err(|e| format!("node {i}: transport: {e}"))?;
            let (membership, watch) = watch::channel(view(i, members.clone()));
            persistence.push(
                Persistence::start(
                    transport.clone(),
                    watch,
                    RocksReplicaStore::new(journal.clone()),
                    snapshots.clone(),
                    journal.clone(),
                    PersistenceSettings::default(),
                )
                .map_err(|e| format!("node {i}: replicated journal: {e}"))?,
            );
            journals.push(journal);
            snapshot_stores.push(snapshots);
            memberships.push(membership);
            transports.push(transport);
        }
        // Distributed Data on node 0 alone (its own view): durable keys are a node's disk.
        let (ddata_membership, ddata_view) = watch::channel(view(0, vec![members[0].clone()]));
        memberships.push(ddata_membership);
        let settings = ReplicatorSettings {
            config: ReplicatorConfig {
                durable_keys: vec!["durable-*".into()],
                ..ReplicatorConfig::default()
            },
            durable_dir: Some(dir.join("node-0").join("ddata")),
            durable_fsync: fsync,
            ..ReplicatorSettings::default()
        };
        let replicator = tessera_ddata::node::start(transports[0].clone(), ddata_view, settings)
            .await
            .map_err(|e| format!("durable Distributed Data: {e}"))?;
        let writer = rand::random_range(0..NODES);
        line(&format!("writer node-{writer}"));
        Ok(Stores {
            journal: journals[0].clone(),
            snapshots: snapshot_stores[0].clone(),
            persistence,
            writer,
            replicator,
            _memberships: memberships,
            _network: network,
        })
    }

    /// The replicated journal and snapshot store written and read through.
    fn replicated(&self) -> &Persistence {
        &self.persistence[self.writer]
    }
}

fn local_log(k: usize) -> String {
    format!("local-{k}")
}

fn replicated_log(k: usize) -> String {
    format!("replicated-{k}")
}

fn snapshot_series(k: usize) -> String {
    format!("snapshots-{k}")
}

fn counter_key(k: usize) -> String {
    format!("durable-counter-{k}")
}

/// The payload of event `index` of a batch of `size` events starting at `first`.
fn event_payload(pid: &str, first: u64, size: u64, index: u64) -> Bytes {
    Bytes::from(format!("{pid}:{first}:{size}:{index}"))
}

/// The payload of the snapshot of `pid` at `sequence_nr`: 1 to 16 KiB, derived from both.
fn snapshot_payload(pid: &str, sequence_nr: u64) -> Bytes {
    let unit = format!("{pid}@{sequence_nr};");
    let len = 1024 * (1 + (sequence_nr % 16) as usize);
    Bytes::from(unit.repeat(len / unit.len() + 1).into_bytes())
}

fn batch(pid: &str, first: u64, size: u64) -> AtomicWrite {
    AtomicWrite {
        persistence_id: pid.to_string(),
        writer_id: "power-loss".into(),
        events: (0..size)
            .map(|i| NewEvent {
                sequence_nr: first + i,
                timestamp_ms: 0,
                manifest: Manifest::new("power-loss", 1),
                payload: event_payload(pid, first, size, i),
                tags: Vec::new(),
            })
            .collect(),
    }
}

/// Reads every store and prints what it holds: a `found <kind> <name> ...` line for each
/// log, snapshot series and counter, a `corrupt <kind> <name> <what>` line for anything
/// inconsistent in itself, and an `unreadable <kind> <name> <error>` line for one that
/// cannot be read (a replicated log whose replicas disagree in a way only lost durable
/// state explains is refused, not served).
async fn verify(stores: &Stores) {
    for k in 0..LOGS {
        let checks = [
            (
                "J",
                local_log(k),
                verify_log("J", &local_log(k), stores.journal.as_ref()).await,
            ),
            (
                "R",
                replicated_log(k),
                verify_log(
                    "R",
                    &replicated_log(k),
                    stores.replicated().journal.as_ref(),
                )
                .await,
            ),
            (
                "RS",
                replicated_log(k),
                verify_replicated_snapshot(stores, &replicated_log(k)).await,
            ),
            (
                "S",
                snapshot_series(k),
                verify_snapshots(stores, &snapshot_series(k)).await,
            ),
            (
                "D",
                counter_key(k),
                verify_counter(stores, &counter_key(k)).await,
            ),
        ];
        for (kind, name, checked) in checks {
            match checked {
                Ok(found) => line(format!("found {kind} {name} {found}").trim_end()),
                Err(e) => line(&format!("unreadable {kind} {name} {e}")),
            }
        }
    }
}

/// Reads a log whole: `<highest> <deleted up to>`, after checking that its events follow
/// each other after the deleted ones, hold their own payloads and that no batch is partly
/// there.
async fn verify_log(kind: &str, pid: &str, journal: &dyn Journal) -> Result<String, String> {
    let highest = journal
        .highest_sequence_nr(pid)
        .await
        .map_err(|e| format!("highest sequence number: {e}"))?;
    let mut replay = journal.replay(pid, 1, u64::MAX, u64::MAX);
    let mut events = Vec::new();
    while let Some(event) = replay.next().await {
        events.push(event.map_err(|e| format!("replay: {e}"))?);
    }
    let deleted = highest.saturating_sub(events.len() as u64);
    for (i, event) in events.iter().enumerate() {
        let expected_seq = deleted + 1 + i as u64;
        let payload = std::str::from_utf8(&event.payload).unwrap_or("");
        let fields: Vec<u64> = payload
            .rsplitn(4, ':')
            .take(3)
            .filter_map(|f| f.parse().ok())
            .collect();
        let problem = if event.sequence_nr != expected_seq {
            Some(format!(
                "event {} where {expected_seq} was due",
                event.sequence_nr
            ))
        } else if let [index, size, first] = fields[..] {
            if !payload.starts_with(&format!("{pid}:")) || first + index != expected_seq {
                Some(format!("#{expected_seq} holds {payload:?}"))
            } else if first + size - 1 > highest {
                Some(format!(
                    "batch {first}..={} partly visible (highest {highest})",
                    first + size - 1
                ))
            } else {
                None
            }
        } else {
            Some(format!("#{expected_seq} holds {payload:?}"))
        };
        if let Some(problem) = problem {
            line(&format!("corrupt {kind} {pid} {problem}"));
            break;
        }
    }
    Ok(format!("{highest} {deleted}"))
}

/// The latest snapshot of a replicated log: `<sequence number>` (0 for none).
async fn verify_replicated_snapshot(stores: &Stores, pid: &str) -> Result<String, String> {
    let latest = stores
        .replicated()
        .snapshots
        .load(pid, SnapshotSelectionCriteria::latest())
        .await
        .map_err(|e| e.to_string())?;
    let seq = latest.as_ref().map_or(0, |s| s.metadata.sequence_nr);
    if let Some(snapshot) = latest
        && snapshot.payload != snapshot_payload(pid, seq)
    {
        line(&format!(
            "corrupt RS {pid} snapshot {seq} holds other bytes"
        ));
    }
    Ok(seq.to_string())
}

/// Every snapshot of a series, newest first: their sequence numbers.
async fn verify_snapshots(stores: &Stores, pid: &str) -> Result<String, String> {
    let mut seqs = Vec::new();
    let mut below = u64::MAX;
    while let Some(snapshot) = stores
        .snapshots
        .load(pid, SnapshotSelectionCriteria::up_to(below))
        .await
        .map_err(|e| e.to_string())?
    {
        let seq = snapshot.metadata.sequence_nr;
        if snapshot.payload != snapshot_payload(pid, seq) {
            line(&format!("corrupt S {pid} snapshot {seq} holds other bytes"));
        }
        seqs.push(seq.to_string());
        if seq == 0 {
            break;
        }
        below = seq - 1;
    }
    Ok(seqs.join(" "))
}

/// A durable counter's value (0 for a key never written).
async fn verify_counter(stores: &Stores, key: &str) -> Result<String, String> {
    match stores
        .replicator
        .get(key, ReadConsistency::Local, DDATA_TIMEOUT)
        .await
        .map_err(|e| e.to_string())?
    {
        GetResult::Found(ReplicatedValue::PNCounter(counter)) => Ok(counter.value().to_string()),
        GetResult::NotFound => Ok("0".into()),
        other => Err(format!("read {other:?}")),
    }
}

/// Writes until killed: appends (and deletions) on the local journal, appends and snapshots
/// through the replicated journal, snapshot saves with retention, durable counter increments.
/// Every write is announced before it is issued (lower case) and acknowledged after it
/// returned (upper case); a task whose write fails stops.
async fn workload(stores: Arc<Stores>) {
    let deadline = Instant::now() + CHILD_LIFETIME_MAX;
    let mut tasks = Vec::new();
    for k in 0..LOGS {
        let seed = rand::random::<u64>();
        let s = stores.clone();
        tasks.push(tokio::spawn(async move {
            let pid = local_log(k);
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            let mut next = s.journal.highest_sequence_nr(&pid).await.map_err(text)? + 1;
            while Instant::now() < deadline {
                let size = rng.random_range(1..=3u64);
                let last = next + size - 1;
                line(&format!("j {pid} {last}"));
                s.journal
                    .append(batch(&pid, next, size))
                    .await
                    .map_err(text)?;
                line(&format!("J {pid} {last}"));
                next = last + 1;
                if rng.random_range(0..6) == 0 {
                    let to = last.saturating_sub(rng.random_range(0..=2));
                    line(&format!("jd {pid} {to}"));
                    s.journal.delete_to(&pid, to).await.map_err(text)?;
                    line(&format!("JD {pid} {to}"));
                }
            }
            Ok::<_, String>(())
        }));
        let s = stores.clone();
        tasks.push(tokio::spawn(async move {
            let pid = replicated_log(k);
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed ^ 1);
            let journal = &s.replicated().journal;
            let mut next = journal.highest_sequence_nr(&pid).await.map_err(text)? + 1;
            while Instant::now() < deadline {
                let size = rng.random_range(1..=3u64);
                let last = next + size - 1;
                line(&format!("r {pid} {last}"));
                journal
                    .append(batch(&pid, next, size))
                    .await
                    .map_err(text)?;
                line(&format!("R {pid} {last}"));
                next = last + 1;
                if rng.random_range(0..4) == 0 {
                    let metadata = SnapshotMetadata {
                        persistence_id: pid.clone(),
                        sequence_nr: last,
                        timestamp_ms: 0,
                    };
                    line(&format!("rs {pid} {last}"));
                    s.replicated()
                        .snapshots
                        .save(
                            metadata,
                            Manifest::new("power-loss", 1),
                            snapshot_payload(&pid, last),
                        )
                        .await
                        .map_err(text)?;
                    line(&format!("RS {pid} {last}"));
                }
            }
            Ok(())
        }));
        let s = stores.clone();
        tasks.push(tokio::spawn(async move {
            let pid = snapshot_series(k);
            let latest = s
                .snapshots
                .load(&pid, SnapshotSelectionCriteria::latest())
                .await
                .map_err(text)?;
            let mut seq = latest.map_or(0, |l| l.metadata.sequence_nr) + 1;
            while Instant::now() < deadline {
                let metadata = SnapshotMetadata {
                    persistence_id: pid.clone(),
                    sequence_nr: seq,
                    timestamp_ms: 0,
                };
                line(&format!("s {pid} {seq}"));
                s.snapshots
                    .save(
                        metadata,
                        Manifest::new("power-loss", 1),
                        snapshot_payload(&pid, seq),
                    )
                    .await
                    .map_err(text)?;
                line(&format!("S {pid} {seq}"));
                // Retention: the two latest are kept.
                if seq >= 3 {
                    let to = seq - 2;
                    line(&format!("sd {pid} {to}"));
                    s.snapshots
                        .delete_matching(&pid, SnapshotSelectionCriteria::up_to(to))
                        .await
                        .map_err(text)?;
                    line(&format!("SD {pid} {to}"));
                }
                seq += 1;
            }
            Ok(())
        }));
        let s = stores.clone();
        tasks.push(tokio::spawn(async move {
            let key = counter_key(k);
            while Instant::now() < deadline {
                line(&format!("d {key}"));
                let result = s
                    .replicator
                    .update(
                        &key,
                        WriteConsistency::Local,
                        DDATA_TIMEOUT,
                        |current, ctx| {
                            let mut counter = match current {
                                Some(ReplicatedValue::PNCounter(c)) => c,
                                None => PNCounter::new(),
                                Some(other) => return Err(format!("not a counter: {other:?}")),
                            };
                            counter.increment(ctx.self_node, 1);
                            Ok(counter.into())
                        },
                    )
                    .await
                    .map_err(text)?;
                if result != UpdateResult::Success {
                    return Err(format!("{key}: {result:?}"));
                }
                line(&format!("D {key}"));
            }
            Ok(())
        }));
    }
    for task in tasks {
        // A failed write (the disk is gone after the cut) ends its task; the others go on.
        // Before the cut, the parent fails on this line.
        if let Ok(Err(e)) = task.await {
            line(&format!("stopped {e}"));
        }
    }
}
