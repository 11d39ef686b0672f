//! Crash loop: a child process appends batches with `fsync = always`, now and then deletes
//! the start of a log, and prints every acknowledged sequence number and deletion; the parent
//! SIGKILLs it at a random moment, reopens the store and checks that it opens, that every
//! acknowledged event is there unless deleted, that every acknowledged deletion holds (also
//! for events by tag), that each log is contiguous and that no batch is partially visible. 100
//! iterations by default; `TESSERA_CRASH_ITERATIONS=1000` for more, `TESSERA_CRASH_SEED` to
//! repeat a run. A second test kills children while they create their store.

mod common;

use rand::{Rng, SeedableRng};
use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tessera_journal::{
    AtomicWrite, FsyncPolicy, Journal, JournalConfig, Manifest, NewEvent, QueryMode, RocksJournal,
};

const CHILD_DIR_ENV: &str = "TESSERA_JOURNAL_CRASH_CHILD_DIR";
const WRITERS: usize = 8;
/// A child that the parent failed to kill stops by itself after this long.
const CHILD_LIFETIME_MAX: Duration = Duration::from_secs(60);

fn journal_config(dir: &Path) -> JournalConfig {
    let mut config = JournalConfig::new(dir);
    config.fsync = FsyncPolicy::Always;
    config
}

/// Payload of event `index` of a batch starting at `first` with `size` events.
fn payload(first: u64, size: u64, index: u64) -> String {
    format!("{first}:{size}:{index}")
}

fn parse_payload(bytes: &[u8]) -> Option<(u64, u64, u64)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut parts = text.split(':').map(|p| p.parse::<u64>().ok());
    Some((parts.next()??, parts.next()??, parts.next()??))
}

/// The child: run by the parent as `crash_loop crash_child --exact --ignored`, never on its own.
#[test]
#[ignore = "run as a child process by journal_survives_being_killed_at_random_moments"]
fn crash_child() {
    let Some(dir) = std::env::var_os(CHILD_DIR_ENV) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let journal = Arc::new(
            RocksJournal::open(journal_config(Path::new(&dir)))
                .await
                .unwrap(),
        );
        let deadline = Instant::now() + CHILD_LIFETIME_MAX;
        let mut tasks = Vec::new();
        for writer in 0..WRITERS {
            let journal = journal.clone();
            tasks.push(tokio::spawn(async move {
                let pid = format!("crash-{writer}");
                let mut rng =
                    rand::rngs::SmallRng::seed_from_u64(writer as u64 ^ rand::random::<u64>());
                let mut next = journal.highest_sequence_nr(&pid).await.unwrap() + 1;
                while Instant::now() < deadline {
                    let size = rng.random_range(1..=5u64);
                    let write = AtomicWrite {
                        persistence_id: pid.clone(),
                        writer_id: "crash-child".into(),
                        events: (0..size)
                            .map(|i| NewEvent {
                                sequence_nr: next + i,
                                timestamp_ms: 0,
                                manifest: Manifest::new("crash", 1),
                                payload: payload(next, size, i).into_bytes().into(),
                                tags: if i == 0 { vec!["batch".into()] } else { vec![] },
                            })
                            .collect(),
                    };
                    journal.append(write).await.unwrap();
                    next += size;
                    print_line(&format!("ack {pid} {}", next - 1));
                    // Now and then the start of the log goes, a few events short of its end,
                    // so that deletions (logical, then physical) are cut short too.
                    if rng.random_range(0..8) == 0 {
                        let to = (next - 1).saturating_sub(rng.random_range(0..=3));
                        print_line(&format!("delete {pid} {to}"));
                        journal.delete_to(&pid, to).await.unwrap();
                        print_line(&format!("deleted {pid} {to}"));
                    }
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    });
}

/// Prints one line for the parent, at once.
fn print_line(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

/// What the parent learnt from the children about one log.
#[derive(Debug, Default, Clone)]
struct Log {
    /// The highest sequence number acknowledged.
    acked: u64,
    /// The highest deletion acknowledged.
    deleted: u64,
    /// Every deletion requested (acknowledged or not: a crash may or may not leave it done).
    requested: BTreeSet<u64>,
}

/// What one check after a crash found.
struct Verified {
    /// Events in the logs, deleted ones included.
    events: u64,
    /// Events deleted from the logs.
    deleted: u64,
}

fn verify(dir: &Path, logs: &HashMap<String, Log>, runtime: &tokio::runtime::Runtime) -> Verified {
    runtime.block_on(async {
        let journal = RocksJournal::open(journal_config(dir))
            .await
            .expect("the store opens after every crash");
        let mut total = 0;
        let mut total_deleted = 0;
        // The first event of every batch carries the tag: those not deleted must come by tag.
        let mut expected_by_tag = BTreeSet::new();
        for writer in 0..WRITERS {
            let pid = format!("crash-{writer}");
            let highest = journal.highest_sequence_nr(&pid).await.unwrap();
            let log = logs.get(&pid).cloned().unwrap_or_default();
            assert!(
                highest >= log.acked,
                "{pid}: acknowledged up to {}, store has {highest}",
                log.acked
            );
            let events = common::collect(journal.replay(&pid, 1, u64::MAX, u64::MAX))
                .await
                .unwrap_or_else(|e| panic!("{pid}: replay failed: {e}"));
            // Events up to the deletion that took effect are gone: one that was requested,
            // no earlier than the last acknowledged one.
            let deleted = highest - events.len() as u64;
            assert!(
                deleted >= log.deleted && (deleted == 0 || log.requested.contains(&deleted)),
                "{pid}: events up to {deleted} are gone; the last deletions requested were \
                 {:?}, acknowledged up to {}",
                log.requested.iter().rev().take(5).collect::<Vec<_>>(),
                log.deleted
            );
            total_deleted += deleted;
            for (i, event) in events.iter().enumerate() {
                assert_eq!(
                    event.sequence_nr,
                    deleted + i as u64 + 1,
                    "{pid}: contiguous after the deleted events"
                );
                let (first, size, index) = parse_payload(&event.payload)
                    .unwrap_or_else(|| panic!("{pid}#{}: payload", event.sequence_nr));
                assert_eq!(
                    first + index,
                    event.sequence_nr,
                    "{pid}: event in its batch"
                );
                assert!(
                    first + size - 1 <= highest,
                    "{pid}: batch {first}..{} is partially visible (highest {highest})",
                    first + size - 1
                );
                if index == 0 {
                    expected_by_tag.insert((pid.clone(), event.sequence_nr));
                }
            }
            total += highest;
        }
        let tagged = common::collect(journal.events_by_tag("batch", 0, QueryMode::Current))
            .await
            .unwrap_or_else(|e| panic!("events by tag failed: {e}"));
        let by_tag: BTreeSet<(String, u64)> = tagged
            .iter()
            .map(|e| (e.event.persistence_id.to_string(), e.event.sequence_nr))
            .collect();
        assert_eq!(by_tag.len(), tagged.len(), "each event comes by tag once");
        let extra: Vec<_> = by_tag.difference(&expected_by_tag).take(5).collect();
        let missing: Vec<_> = expected_by_tag.difference(&by_tag).take(5).collect();
        assert!(
            extra.is_empty() && missing.is_empty(),
            "events by tag: deleted or unknown ones came {extra:?}, stored ones did not {missing:?}"
        );
        journal.close().await;
        Verified {
            events: total,
            deleted: total_deleted,
        }
    })
}

/// The iterations asked for with `TESSERA_CRASH_ITERATIONS`, if any.
fn iterations_asked() -> Option<usize> {
    std::env::var("TESSERA_CRASH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
}

/// The random source of a run of `test` with `iterations`: seeded with `TESSERA_CRASH_SEED`,
/// or with a new seed, printed so that the run can be repeated.
fn run_rng(test: &str, iterations: usize) -> rand::rngs::SmallRng {
    let seed: u64 = std::env::var("TESSERA_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{test}: {iterations} iterations, TESSERA_CRASH_SEED={seed}");
    rand::rngs::SmallRng::seed_from_u64(seed)
}

/// Starts [`crash_child`] in a process of its own, writing to the store in `dir`.
fn spawn_child(dir: &Path, stdout: Stdio) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "crash_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR_ENV, dir)
        .stdout(stdout)
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// SIGKILLs a child (no destructor, no flush, no chance to finish a write) and reaps it.
fn kill(child: &mut std::process::Child) -> std::process::ExitStatus {
    child.kill().unwrap();
    child.wait().unwrap()
}

#[test]
fn journal_survives_being_killed_at_random_moments() {
    let iterations = iterations_asked().unwrap_or(100);
    let mut rng = run_rng("crash loop", iterations);
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let logs: Arc<Mutex<HashMap<String, Log>>> = Arc::default();
    let mut events_stored = 0;
    let mut events_deleted = 0;
    for iteration in 0..iterations {
        let mut child = spawn_child(dir.path(), Stdio::piped());
        let stdout = child.stdout.take().unwrap();
        let logs_of_reader = logs.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut parts = line.split_whitespace();
                let (Some(what), Some(pid), Some(Ok(seq))) = (
                    parts.next(),
                    parts.next(),
                    parts.next().map(str::parse::<u64>),
                ) else {
                    continue;
                };
                let mut logs = logs_of_reader.lock().unwrap();
                let log = logs.entry(pid.to_string()).or_default();
                match what {
                    "ack" => log.acked = log.acked.max(seq),
                    "delete" => {
                        log.requested.insert(seq);
                    }
                    "deleted" => log.deleted = log.deleted.max(seq),
                    _ => {}
                }
            }
        });
        std::thread::sleep(Duration::from_millis(rng.random_range(20..400)));
        let status = kill(&mut child);
        assert!(
            !status.success(),
            "iteration {iteration}: the child was killed, not finished"
        );
        reader.join().unwrap();
        let logs_now = logs.lock().unwrap().clone();
        let verified = verify(dir.path(), &logs_now, &runtime);
        events_stored = verified.events;
        events_deleted = verified.deleted;
    }
    let logs = logs.lock().unwrap();
    let acked_total: u64 = logs.values().map(|log| log.acked).sum();
    let deletions: usize = logs.values().map(|log| log.requested.len()).sum();
    eprintln!(
        "crash loop: {events_stored} events stored, {acked_total} acknowledged, {deletions} \
         deletions requested, {events_deleted} events deleted"
    );
    assert!(acked_total > 0, "the children acknowledged writes");
    assert!(events_deleted > 0, "deletions took effect");
}

/// Kills children while they create their store, each in a fresh directory: whatever a kill
/// leaves, the store opens and reads.
#[test]
fn a_store_opens_after_a_crash_during_its_creation() {
    let iterations = iterations_asked().map_or(30, |n| n.div_ceil(3));
    let mut rng = run_rng("crashes during creation", iterations);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for iteration in 0..iterations {
        let dir = tempfile::tempdir().unwrap();
        let mut child = spawn_child(dir.path(), Stdio::null());
        // From the start of the process to its first writes: the store is created in between.
        std::thread::sleep(Duration::from_millis(rng.random_range(0..60)));
        kill(&mut child);
        runtime.block_on(async {
            let journal = RocksJournal::open(journal_config(dir.path()))
                .await
                .unwrap_or_else(|e| panic!("iteration {iteration}: the store must open: {e}"));
            for writer in 0..WRITERS {
                let pid = format!("crash-{writer}");
                common::collect(journal.replay(&pid, 1, u64::MAX, u64::MAX))
                    .await
                    .unwrap_or_else(|e| panic!("iteration {iteration}: {pid}: {e}"));
            }
            journal.close().await;
        });
    }
}
