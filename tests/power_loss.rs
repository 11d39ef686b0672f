//! Power-loss loop (issue 18): a node's four stores — the RocksDB journal, the replica store
//! (the same journal under the replicated journal of a one-node `Persistence`), the snapshot
//! store (saves of its own and of the replicated journal) and the durable Distributed Data
//! keys — run in a child process on a [`FaultFs`] mount, which keeps every write that is not
//! fsynced in memory. The child prints a line before each write and one after each
//! acknowledgement; the parent cuts the power at a random moment (every write not yet
//! fsynced is gone), kills the child, and starts the next child on what the disk kept. That
//! child first opens every store (recovering from the cut, which may itself be cut), reads
//! everything back and prints it; the parent checks that every acknowledged write is there,
//! that nothing never written appears, that acknowledged deletions hold and that no batch is
//! partly visible. A final child only reads, after the last cut.
//!
//! `acknowledged_writes_survive_power_cuts` runs 100 cuts (`TESSERA_CRASH_ITERATIONS` for
//! more, `TESSERA_CRASH_SEED` to repeat a run); `power_cuts_lose_acknowledged_writes_without_fsync`
//! runs the same loop with every store's fsync off and must find lost acknowledged writes in
//! each of them: the loop can fail. Both skip, saying why, where FUSE cannot be mounted.

use bytes::Bytes;
use futures::StreamExt;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};
use tessera_cluster::node::ClusterSnapshot;
use tessera_cluster::transport::MemoryNetwork;
use tessera_cluster::{Address, Member, MemberStatus, UniqueAddress};
use tessera_ddata::node::{ReplicatorHandle, ReplicatorSettings};
use tessera_ddata::replicator::{GetResult, ReplicatorConfig, UpdateResult};
use tessera_ddata::{PNCounter, ReadConsistency, ReplicatedValue, WriteConsistency};
use tessera_faultfs::FaultFs;
use tessera_journal::{
    AtomicWrite, FsyncPolicy, Journal, JournalConfig, Manifest, NewEvent, RocksJournal,
};
use tessera_persistence::{Persistence, PersistenceSettings, RocksReplicaStore};
use tessera_snapshot::{
    RocksSnapshotStore, SnapshotConfig, SnapshotMetadata, SnapshotSelectionCriteria, SnapshotStore,
};
use tokio::sync::watch;

/// The child's data directory (on the mount); set only for the child.
const CHILD_DIR_ENV: &str = "TESSERA_POWER_LOSS_CHILD_DIR";
/// The child's fsync policy (`always` or `never`), and `verify` to only read.
const CHILD_MODE_ENV: &str = "TESSERA_POWER_LOSS_CHILD_MODE";
/// Logs (and snapshot series, and counters) of each kind the workload writes.
const LOGS: usize = 3;
/// A child the parent failed to kill stops by itself after this long.
const CHILD_LIFETIME_MAX: Duration = Duration::from_secs(60);
/// Longest a child may take to open and read its stores before the parent gives up on it.
const CHILD_VERIFY_MAX: Duration = Duration::from_secs(60);
/// Timeout of a Distributed Data read or write (one node: it never waits for another).
const DDATA_TIMEOUT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------
// The child: the stores, the check of what they hold, the workload.
// ---------------------------------------------------------------------------------------

/// The child, run by the parent as `power_loss power_loss_child --exact --ignored`.
#[test]
#[ignore = "run as a child process by the power-loss loops"]
fn power_loss_child() {
    let (Some(dir), Some(mode)) = (
        std::env::var_os(CHILD_DIR_ENV),
        std::env::var(CHILD_MODE_ENV).ok(),
    ) else {
        return;
    };
    let (fsync, verify_only) = match mode.as_str() {
        "always" => (FsyncPolicy::Always, false),
        "never" => (FsyncPolicy::Never, false),
        "verify" => (FsyncPolicy::Always, true),
        other => panic!("unknown child mode {other:?}"),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let stores = match Stores::open(Path::new(&dir), fsync).await {
            Ok(stores) => stores,
            Err(e) => {
                line(&format!("error opening the stores: {e}"));
                std::process::exit(2);
            }
        };
        line("opened");
        if let Err(e) = verify(&stores).await {
            line(&format!("error reading the stores: {e}"));
            std::process::exit(2);
        }
        line("verified");
        if !verify_only {
            workload(Arc::new(stores)).await;
        }
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

/// A node's stores as `tessera node` opens them under its data directory, with one member
/// (itself, Up) and the in-memory transport.
struct Stores {
    journal: Arc<RocksJournal>,
    snapshots: Arc<RocksSnapshotStore>,
    persistence: Persistence,
    replicator: ReplicatorHandle,
    _membership: watch::Sender<ClusterSnapshot>,
    _network: Arc<MemoryNetwork>,
}

impl Stores {
    async fn open(dir: &Path, fsync: FsyncPolicy) -> Result<Self, String> {
        let mut journal_config = JournalConfig::new(dir.join("journal"));
        journal_config.fsync = fsync;
        // Small memtables: flushes to table files (and their MANIFEST records) happen during
        // the workload too, not only when a store recovers.
        journal_config.write_buffer_bytes = 256 * 1024;
        let journal = Arc::new(
            RocksJournal::open(journal_config)
                .await
                .map_err(|e| format!("journal: {e}"))?,
        );
        let mut snapshot_config = SnapshotConfig::new(dir.join("snapshots"));
        snapshot_config.fsync = fsync;
        let snapshots = Arc::new(
            RocksSnapshotStore::open(snapshot_config)
                .await
                .map_err(|e| format!("snapshot store: {e}"))?,
        );
        let network = MemoryNetwork::new(1);
        let address = Address::new("127.0.0.1", 25520);
        let uid = rand::random::<u64>() | 1;
        let transport = network
            .bind(uid, address.clone())
            .map_err(|e| format!("transport: {e}"))?;
        let member = Member {
            unique_address: UniqueAddress::new(address, uid),
            status: MemberStatus::Up,
            roles: BTreeSet::new(),
            up_number: 1,
            app_version: "power-loss".into(),
        };
        let (membership, watch) = watch::channel(ClusterSnapshot {
            self_node: Some(member.unique_address.clone()),
            self_status: Some(MemberStatus::Up),
            members: vec![member],
            converged: true,
            ..ClusterSnapshot::default()
        });
        let persistence = Persistence::start(
            transport.clone(),
            watch.clone(),
            RocksReplicaStore::new(journal.clone()),
            snapshots.clone(),
            journal.clone(),
            PersistenceSettings::default(),
        )
        .map_err(|e| format!("replicated journal: {e}"))?;
        let settings = ReplicatorSettings {
            config: ReplicatorConfig {
                durable_keys: vec!["durable-*".into()],
                ..ReplicatorConfig::default()
            },
            durable_dir: Some(dir.join("ddata")),
            durable_fsync: fsync,
            ..ReplicatorSettings::default()
        };
        let replicator = tessera_ddata::node::start(transport, watch, settings)
            .await
            .map_err(|e| format!("durable Distributed Data: {e}"))?;
        Ok(Stores {
            journal,
            snapshots,
            persistence,
            replicator,
            _membership: membership,
            _network: network,
        })
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

/// Reads every store and prints what it holds: `found <kind> <name> ...` lines, and a
/// `corrupt <kind> <name> <what>` line for anything inconsistent in itself.
async fn verify(stores: &Stores) -> Result<(), String> {
    for k in 0..LOGS {
        let journals: [(&str, String, &dyn Journal); 2] = [
            ("J", local_log(k), stores.journal.as_ref()),
            ("R", replicated_log(k), stores.persistence.journal.as_ref()),
        ];
        for (kind, pid, journal) in journals {
            let highest = journal
                .highest_sequence_nr(&pid)
                .await
                .map_err(|e| format!("{pid}: highest sequence number: {e}"))?;
            let mut replay = journal.replay(&pid, 1, u64::MAX, u64::MAX);
            let mut events = Vec::new();
            while let Some(event) = replay.next().await {
                events.push(event.map_err(|e| format!("{pid}: replay: {e}"))?);
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
            line(&format!("found {kind} {pid} {highest} {deleted}"));
        }

        let pid = replicated_log(k);
        let latest = stores
            .persistence
            .snapshots
            .load(&pid, SnapshotSelectionCriteria::latest())
            .await
            .map_err(|e| format!("{pid}: replicated snapshot: {e}"))?;
        let seq = latest.as_ref().map_or(0, |s| s.metadata.sequence_nr);
        if let Some(snapshot) = latest
            && snapshot.payload != snapshot_payload(&pid, seq)
        {
            line(&format!(
                "corrupt RS {pid} snapshot {seq} holds other bytes"
            ));
        }
        line(&format!("found RS {pid} {seq}"));

        // Every snapshot of the series, newest first.
        let pid = snapshot_series(k);
        let mut seqs = Vec::new();
        let mut below = u64::MAX;
        while let Some(snapshot) = stores
            .snapshots
            .load(&pid, SnapshotSelectionCriteria::up_to(below))
            .await
            .map_err(|e| format!("{pid}: snapshot: {e}"))?
        {
            let seq = snapshot.metadata.sequence_nr;
            if snapshot.payload != snapshot_payload(&pid, seq) {
                line(&format!("corrupt S {pid} snapshot {seq} holds other bytes"));
            }
            seqs.push(seq.to_string());
            if seq == 0 {
                break;
            }
            below = seq - 1;
        }
        line(format!("found S {pid} {}", seqs.join(" ")).trim_end());

        let key = counter_key(k);
        let value = match stores
            .replicator
            .get(&key, ReadConsistency::Local, DDATA_TIMEOUT)
            .await
            .map_err(|e| format!("{key}: {e}"))?
        {
            GetResult::Found(ReplicatedValue::PNCounter(counter)) => counter.value(),
            GetResult::NotFound => 0,
            other => return Err(format!("{key}: read {other:?}")),
        };
        line(&format!("found D {key} {value}"));
    }
    Ok(())
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
            let journal = &s.persistence.journal;
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
                    s.persistence
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

// ---------------------------------------------------------------------------------------
// The parent: what was acknowledged, and what a child found.
// ---------------------------------------------------------------------------------------

/// What the children said about one log.
#[derive(Debug, Default, Clone)]
struct LogWrites {
    /// Highest sequence number acknowledged.
    acked: u64,
    /// Highest sequence number any write was issued for.
    issued: u64,
    /// Highest deletion acknowledged.
    deleted_acked: u64,
    /// Every deletion issued (a cut may or may not leave it done).
    deletions_issued: BTreeSet<u64>,
}

/// What the children said about one series of snapshots.
#[derive(Debug, Default, Clone)]
struct SnapshotWrites {
    acked: u64,
    issued: BTreeSet<u64>,
    deleted_acked: u64,
}

/// What the children said about one durable counter.
#[derive(Debug, Default, Clone)]
struct CounterWrites {
    acked: u64,
    issued: u64,
}

/// Everything the children issued and had acknowledged, over all iterations.
#[derive(Debug, Default, Clone)]
struct Writes {
    logs: BTreeMap<String, LogWrites>,
    snapshots: BTreeMap<String, SnapshotWrites>,
    counters: BTreeMap<String, CounterWrites>,
}

impl Writes {
    /// Takes in one line of a child's workload.
    fn record(&mut self, line: &str) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let number = |i: usize| {
            parts
                .get(i)
                .and_then(|p| p.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let Some((&tag, rest)) = parts.split_first() else {
            return;
        };
        let Some(&name) = rest.first() else { return };
        match tag {
            "j" | "r" => {
                let log = self.logs.entry(name.to_string()).or_default();
                log.issued = log.issued.max(number(2));
            }
            "J" | "R" => {
                let log = self.logs.entry(name.to_string()).or_default();
                log.acked = log.acked.max(number(2));
            }
            "jd" => {
                let log = self.logs.entry(name.to_string()).or_default();
                log.deletions_issued.insert(number(2));
            }
            "JD" => {
                let log = self.logs.entry(name.to_string()).or_default();
                log.deleted_acked = log.deleted_acked.max(number(2));
            }
            "s" | "rs" => {
                let series = self.snapshots.entry(name.to_string()).or_default();
                series.issued.insert(number(2));
            }
            "S" | "RS" => {
                let series = self.snapshots.entry(name.to_string()).or_default();
                series.acked = series.acked.max(number(2));
            }
            "SD" => {
                let series = self.snapshots.entry(name.to_string()).or_default();
                series.deleted_acked = series.deleted_acked.max(number(2));
            }
            "d" => self.counters.entry(name.to_string()).or_default().issued += 1,
            "D" => self.counters.entry(name.to_string()).or_default().acked += 1,
            _ => {}
        }
    }

    fn acknowledged(&self) -> u64 {
        self.logs.values().map(|l| l.acked).sum::<u64>()
            + self.snapshots.values().map(|s| s.acked).sum::<u64>()
            + self.counters.values().map(|c| c.acked).sum::<u64>()
    }
}

/// One thing a child found that contradicts what was acknowledged, and the store's kind.
#[derive(Debug, Clone)]
struct Violation {
    /// `J` (journal), `R` (replica store), `RS` / `S` (snapshot store, replicated / own),
    /// `D` (durable keys).
    kind: String,
    /// An acknowledged write is missing (as opposed to something never written appearing,
    /// or a store reporting itself inconsistent).
    lost: bool,
    what: String,
}

/// Checks a child's `found` and `corrupt` lines against what was acknowledged before it
/// started.
fn check(found: &[String], writes: &Writes) -> Vec<Violation> {
    let mut violations = Vec::new();
    let mut violation = |kind: &str, lost: bool, what: String| {
        violations.push(Violation {
            kind: kind.to_string(),
            lost,
            what,
        })
    };
    for line in found {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let numbers: Vec<u64> = parts
            .iter()
            .skip(3)
            .filter_map(|p| p.parse().ok())
            .collect();
        match parts[..] {
            ["corrupt", kind, ..] => violation(kind, false, line.clone()),
            ["found", kind @ ("J" | "R"), pid, highest, deleted] => {
                let (highest, deleted): (u64, u64) =
                    (highest.parse().unwrap_or(0), deleted.parse().unwrap_or(0));
                let log = writes.logs.get(pid).cloned().unwrap_or_default();
                if highest < log.acked {
                    violation(
                        kind,
                        true,
                        format!(
                            "{pid}: acknowledged up to {}, the store has up to {highest}",
                            log.acked
                        ),
                    );
                }
                if highest > log.issued {
                    violation(
                        kind,
                        false,
                        format!(
                            "{pid}: has up to {highest}, never written beyond {}",
                            log.issued
                        ),
                    );
                }
                if deleted < log.deleted_acked {
                    violation(
                        kind,
                        true,
                        format!(
                            "{pid}: deletion up to {} acknowledged, events from {} are back",
                            log.deleted_acked,
                            deleted + 1
                        ),
                    );
                }
                if deleted > 0 && !log.deletions_issued.contains(&deleted) {
                    violation(
                        kind,
                        false,
                        format!("{pid}: events up to {deleted} are gone, never deleted so"),
                    );
                }
            }
            ["found", kind @ ("RS" | "S"), pid, ..] => {
                let series = writes.snapshots.get(pid).cloned().unwrap_or_default();
                let latest = numbers.first().copied().unwrap_or(0);
                if latest < series.acked {
                    violation(
                        kind,
                        true,
                        format!(
                            "{pid}: snapshot {} acknowledged, the latest is {latest}",
                            series.acked
                        ),
                    );
                }
                for &seq in &numbers {
                    if seq != 0 && !series.issued.contains(&seq) {
                        violation(
                            kind,
                            false,
                            format!("{pid}: snapshot {seq} was never saved"),
                        );
                    }
                    if seq != 0 && seq <= series.deleted_acked {
                        violation(
                            kind,
                            true,
                            format!(
                                "{pid}: snapshot {seq} is back after the deletion up to {} was acknowledged",
                                series.deleted_acked
                            ),
                        );
                    }
                }
            }
            ["found", "D", key, value] => {
                let counter = writes.counters.get(key).cloned().unwrap_or_default();
                let value: u64 = value.parse().unwrap_or(0);
                if value < counter.acked {
                    violation(
                        "D",
                        true,
                        format!(
                            "{key}: {} increments acknowledged, the value is {value}",
                            counter.acked
                        ),
                    );
                }
                if value > counter.issued {
                    violation(
                        "D",
                        false,
                        format!(
                            "{key}: the value is {value}, only {} increments issued",
                            counter.issued
                        ),
                    );
                }
            }
            _ => violation("?", false, format!("unexpected line {line:?}")),
        }
    }
    violations
}

/// The iterations asked for with `TESSERA_CRASH_ITERATIONS`, if any.
fn iterations_asked() -> Option<usize> {
    std::env::var("TESSERA_CRASH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
}

/// The random source of a run: seeded with `TESSERA_CRASH_SEED`, or with a new seed, printed
/// so that the run can be repeated (the children's own timing still varies).
fn run_rng(test: &str) -> rand::rngs::SmallRng {
    let seed: u64 = std::env::var("TESSERA_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{test}: TESSERA_CRASH_SEED={seed}");
    rand::rngs::SmallRng::seed_from_u64(seed)
}

/// A child process and what it printed so far.
struct RunningChild {
    child: Child,
    lines: Receiver<String>,
    reader: Option<std::thread::JoinHandle<()>>,
    stderr_path: PathBuf,
}

impl Drop for RunningChild {
    /// A child is never left running (a failed test would leave it writing on the mount).
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl RunningChild {
    fn spawn(data_dir: &Path, mode: &str, stderr_path: &Path) -> Self {
        let stderr = std::fs::File::create(stderr_path).unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "power_loss_child",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR_ENV, data_dir)
            .env(CHILD_MODE_ENV, mode)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        RunningChild {
            child,
            lines,
            reader: Some(reader),
            stderr_path: stderr_path.to_path_buf(),
        }
    }

    /// The end of the child's error output, for a failure message.
    fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

/// What a run of the loop found.
#[derive(Debug, Default)]
struct Summary {
    iterations: usize,
    /// Iterations whose child got to read its stores (the others were cut before).
    verified: usize,
    violations: Vec<(usize, Violation)>,
    first_loss: Option<usize>,
    writes_acknowledged: u64,
    unsynced_files_cut: u64,
    unsynced_bytes_cut: u64,
    fsyncs: u64,
}

impl Summary {
    fn lost_kinds(&self) -> BTreeSet<String> {
        self.violations
            .iter()
            .filter(|(_, v)| v.lost)
            .map(|(_, v)| v.kind.clone())
            .collect()
    }
}

/// Runs the loop: up to `iterations` power cuts of children with `fsync`, each followed by
/// the next child's check, then a final check; stops early once `enough` holds.
fn power_loss_loop(
    test: &str,
    fsync: &str,
    iterations: usize,
    enough: impl Fn(&Summary) -> bool,
) -> Option<Summary> {
    if let Some(reason) = FaultFs::unavailable() {
        eprintln!("{test}: SKIPPED: FUSE cannot be mounted here: {reason}");
        return None;
    }
    let mut rng = run_rng(test);
    let backing = tempfile::tempdir().unwrap();
    let mountpoint = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let data_dir = mountpoint.path().join("node");
    let stderr_path = logs.path().join("child.stderr");
    let mut writes = Writes::default();
    let mut summary = Summary::default();
    let mut iteration = 0;
    loop {
        let last = iteration == iterations || enough(&summary);
        let fs = FaultFs::mount(backing.path(), mountpoint.path())
            .unwrap_or_else(|e| panic!("{test}: iteration {iteration}: {e}"));
        let mode = if last { "verify" } else { fsync };
        let mut child = RunningChild::spawn(&data_dir, mode, &stderr_path);
        // Most cuts fall in the workload, some while the stores open and recover.
        let cut_while_opening = !last && rng.random_range(0..8) == 0;
        let started = Instant::now();
        let opening_cut_at = Duration::from_millis(rng.random_range(0..120));
        let workload_cut_after = Duration::from_millis(rng.random_range(0..250));
        let mut found = Vec::new();
        let mut workload_lines = Vec::new();
        let mut verified = false;
        let mut ended = false;
        while !verified && !ended {
            let wait = if cut_while_opening {
                opening_cut_at.saturating_sub(started.elapsed())
            } else {
                CHILD_VERIFY_MAX.saturating_sub(started.elapsed())
            };
            match child.lines.recv_timeout(wait) {
                Ok(line) if line == "verified" => verified = true,
                Ok(line) if line.starts_with("found ") || line.starts_with("corrupt ") => {
                    found.push(line)
                }
                Ok(line) if line.starts_with("error ") => panic!(
                    "{test}: iteration {iteration}: the child failed: {line}\n{}",
                    child.stderr_tail()
                ),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) if cut_while_opening => break,
                Err(RecvTimeoutError::Timeout) => panic!(
                    "{test}: iteration {iteration}: the child did not read its stores within \
                     {CHILD_VERIFY_MAX:?}\n{}",
                    child.stderr_tail()
                ),
                Err(RecvTimeoutError::Disconnected) => ended = true,
            }
        }
        if last {
            let status = child.child.wait().unwrap();
            assert!(
                verified && status.success(),
                "{test}: the final check did not finish: {status}\n{}",
                child.stderr_tail()
            );
        } else {
            assert!(
                !ended,
                "{test}: iteration {iteration}: the child ended before the cut\n{}",
                child.stderr_tail()
            );
            if verified {
                std::thread::sleep(workload_cut_after);
            }
            // Up to the cut the child must be writing: a write failing without a cut, or a
            // child that stopped, is a failure the cut must not hide.
            while let Ok(line) = child.lines.try_recv() {
                assert!(
                    !line.starts_with("stopped ") && !line.starts_with("error "),
                    "{test}: iteration {iteration}: before the cut: {line}\n{}",
                    child.stderr_tail()
                );
                workload_lines.push(line);
            }
            if let Some(status) = child.child.try_wait().unwrap() {
                panic!(
                    "{test}: iteration {iteration}: the child ended before the cut: \
                     {status}\n{}",
                    child.stderr_tail()
                );
            }
            let cut = fs.cut_power();
            summary.unsynced_files_cut += cut.files;
            summary.unsynced_bytes_cut += cut.bytes;
            child.child.kill().unwrap();
            child.child.wait().unwrap();
        }
        if let Some(reader) = child.reader.take() {
            reader.join().unwrap();
        }
        // Lines printed before the cut, and (acknowledgements of durable writes) after it.
        while let Ok(line) = child.lines.try_recv() {
            if line.starts_with("found ") || line.starts_with("corrupt ") {
                found.push(line);
            } else {
                workload_lines.push(line);
            }
        }
        summary.fsyncs += fs.stats().fsyncs;
        fs.unmount()
            .unwrap_or_else(|e| panic!("{test}: iteration {iteration}: unmount: {e}"));
        if verified {
            summary.verified += 1;
            for violation in check(&found, &writes) {
                if violation.lost && summary.first_loss.is_none() {
                    summary.first_loss = Some(iteration);
                }
                summary.violations.push((iteration, violation));
            }
        }
        for line in &workload_lines {
            writes.record(line);
        }
        if last {
            break;
        }
        iteration += 1;
        summary.iterations = iteration;
    }
    summary.writes_acknowledged = writes.acknowledged();
    eprintln!(
        "{test}: {} power cuts ({} while the stores opened or recovered), {} acknowledged \
         writes, {} fsyncs, {} files with unsynced writes thrown away ({} KiB); {} \
         violations, first loss of an acknowledged write at iteration {:?}",
        summary.iterations,
        summary.iterations + 1 - summary.verified,
        summary.writes_acknowledged,
        summary.fsyncs,
        summary.unsynced_files_cut,
        summary.unsynced_bytes_cut / 1024,
        summary.violations.len(),
        summary.first_loss,
    );
    Some(summary)
}

#[test]
fn acknowledged_writes_survive_power_cuts() {
    let test = "power-loss loop";
    let iterations = iterations_asked().unwrap_or(100);
    let Some(summary) = power_loss_loop(test, "always", iterations, |_| false) else {
        return;
    };
    let shown: Vec<String> = summary
        .violations
        .iter()
        .take(20)
        .map(|(i, v)| format!("iteration {i}: {} {}", v.kind, v.what))
        .collect();
    assert!(
        summary.violations.is_empty(),
        "{test}: {} violations:\n{}",
        summary.violations.len(),
        shown.join("\n")
    );
    assert!(
        summary.writes_acknowledged > 0,
        "the children acknowledged writes"
    );
    assert!(
        summary.unsynced_bytes_cut > 0,
        "cuts threw unsynced writes away"
    );
}

/// The loop can fail: with every store's fsync off, a cut loses acknowledged writes of the
/// journal, the replica store, both kinds of snapshots and the durable keys.
#[test]
fn power_cuts_lose_acknowledged_writes_without_fsync() {
    let test = "power-loss loop without fsync";
    let kinds: BTreeSet<String> = ["J", "R", "RS", "S", "D"].map(String::from).into();
    let Some(summary) = power_loss_loop(test, "never", 40, |summary| summary.lost_kinds() == kinds)
    else {
        return;
    };
    let mut lost_per_kind: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, violation) in summary.violations.iter().filter(|(_, v)| v.lost) {
        *lost_per_kind.entry(violation.kind.as_str()).or_default() += 1;
    }
    eprintln!("{test}: lost acknowledged writes found per store kind: {lost_per_kind:?}");
    for (iteration, violation) in summary.violations.iter().take(10) {
        eprintln!(
            "{test}: iteration {iteration}: {} {}",
            violation.kind, violation.what
        );
    }
    assert_eq!(
        summary.lost_kinds(),
        kinds,
        "{test}: lost acknowledged writes found in these stores only"
    );
}
