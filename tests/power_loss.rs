//! Power-loss loop: a node's four stores — the RocksDB journal, the replica store
//! (the same journal under the replicated journal, here of three nodes in one process, N = 3
//! and W = 2, written through a node drawn for each child), the snapshot store (saves of its
//! own and of the replicated journal) and the durable Distributed Data keys — run in a child
//! process on a [`FaultFs`] mount, which keeps every write that is not fsynced in memory: a
//! cut is the power loss of a whole cluster. The child prints a line before each write and one after each
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

#[path = "power_loss/child.rs"]
mod child;
#[path = "power_loss/writes.rs"]
mod writes;

use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};
use tessera_faultfs::FaultFs;
use tessera_journal::FsyncPolicy;
use writes::{Violation, Writes, check, is_finding};

/// The child's data directory (on the mount); set only for the child.
const CHILD_DIR_ENV: &str = "TESSERA_POWER_LOSS_CHILD_DIR";
/// The child's fsync policy (`always` or `never`), and `verify` to only read.
const CHILD_MODE_ENV: &str = "TESSERA_POWER_LOSS_CHILD_MODE";
/// Longest a child may take to open and read its stores before the parent gives up on it.
const CHILD_VERIFY_MAX: Duration = Duration::from_secs(60);

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
    child::run(Path::new(&dir), fsync, verify_only);
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
                Ok(line) if is_finding(&line) => found.push(line),
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
            // Up to the cut the child must be writing: with fsync on, a write failing without
            // a cut, or a child that stopped, is a failure the cut must not hide. (Without
            // fsync, earlier cuts may have damaged a log for good.)
            while let Ok(line) = child.lines.try_recv() {
                assert!(
                    fsync != "always"
                        || !line.starts_with("stopped ") && !line.starts_with("error "),
                    "{test}: iteration {iteration}: before the cut: {line}\n{}",
                    child.stderr_tail()
                );
                workload_lines.push(line);
            }
            if let Some(status) = child.child.try_wait().unwrap()
                && fsync == "always"
            {
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
            if is_finding(&line) {
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
