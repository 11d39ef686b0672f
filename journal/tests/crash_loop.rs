//! Crash loop: a child process appends batches with `fsync = always` and prints every
//! acknowledged sequence number; the parent SIGKILLs it at a random moment, reopens the store
//! and checks that it opens, that every acknowledged event is there, that each log is
//! contiguous and that no batch is partially visible. 100 iterations by default;
//! `TESSERA_CRASH_ITERATIONS=1000` for more, `TESSERA_CRASH_SEED` to repeat a run.

mod common;

use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tessera_journal::{
    AtomicWrite, FsyncPolicy, Journal, JournalConfig, Manifest, NewEvent, RocksJournal,
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
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "ack {pid} {}", next - 1).unwrap();
                    out.flush().unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    });
}

fn verify(dir: &Path, acked: &HashMap<String, u64>, runtime: &tokio::runtime::Runtime) -> u64 {
    runtime.block_on(async {
        let journal = RocksJournal::open(journal_config(dir))
            .await
            .expect("the store opens after every crash");
        let mut total = 0;
        for writer in 0..WRITERS {
            let pid = format!("crash-{writer}");
            let highest = journal.highest_sequence_nr(&pid).await.unwrap();
            let acked_to = acked.get(&pid).copied().unwrap_or(0);
            assert!(
                highest >= acked_to,
                "{pid}: acknowledged up to {acked_to}, store has {highest}"
            );
            let events = common::collect(journal.replay(&pid, 1, u64::MAX, u64::MAX))
                .await
                .unwrap_or_else(|e| panic!("{pid}: replay failed: {e}"));
            assert_eq!(
                events.len() as u64,
                highest,
                "{pid}: log is contiguous from 1"
            );
            for (i, event) in events.iter().enumerate() {
                assert_eq!(event.sequence_nr, i as u64 + 1, "{pid}: contiguous");
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
            }
            total += highest;
        }
        journal.close().await;
        total
    })
}

#[test]
fn journal_survives_being_killed_at_random_moments() {
    let iterations: usize = std::env::var("TESSERA_CRASH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let seed: u64 = std::env::var("TESSERA_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("crash loop: {iterations} iterations, TESSERA_CRASH_SEED={seed}");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let exe = std::env::current_exe().unwrap();
    let acked: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let mut events_stored = 0;
    for iteration in 0..iterations {
        let mut child = Command::new(&exe)
            .args([
                "crash_child",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let acked_by_reader = acked.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut parts = line.split_whitespace();
                if let (Some("ack"), Some(pid), Some(seq)) =
                    (parts.next(), parts.next(), parts.next())
                    && let Ok(seq) = seq.parse::<u64>()
                {
                    let mut acked = acked_by_reader.lock().unwrap();
                    let entry = acked.entry(pid.to_string()).or_insert(0);
                    *entry = (*entry).max(seq);
                }
            }
        });
        std::thread::sleep(Duration::from_millis(rng.random_range(20..400)));
        // SIGKILL: no destructor, no flush, no chance to finish a write.
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert!(
            !status.success(),
            "iteration {iteration}: the child was killed, not finished"
        );
        reader.join().unwrap();
        let acked_now = acked.lock().unwrap().clone();
        events_stored = verify(dir.path(), &acked_now, &runtime);
    }
    let acked_total: u64 = acked.lock().unwrap().values().sum();
    eprintln!("crash loop: {events_stored} events stored, {acked_total} acknowledged");
    assert!(acked_total > 0, "the children acknowledged writes");
}
