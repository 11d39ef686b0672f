//! The nemesis: on a schedule drawn from the soak's seed it kills nodes (SIGKILL, then a
//! restart on the same data directory), pauses them (SIGSTOP, then SIGCONT), restarts them
//! gracefully (SIGTERM, then a start) and, where nodes run in network namespaces, partitions
//! the cluster 2|3 or 1|4 and heals it. It never impairs more than a minority at a time, so
//! the cluster can make progress: a node counts as impaired from its fault until it is ready
//! again. It also supervises: a node that exits by itself (downed by the split-brain resolver
//! after a long pause or on the minority side of a partition: status 3) is restarted once it
//! is not cut off, and an exit with any other status than 0 or 3 is recorded as a crash.
//!
//! The seed decides the sequence of choices (which fault, which nodes, how long); when each
//! fault lands among the workload's operations depends on the machine, so two runs with one
//! seed are alike, not identical.

use super::SoakError;
use super::cluster::{Cluster, Placement};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::process::ExitStatus;
use std::sync::PoisonError;
use std::time::{Duration, Instant};
use tessera_harness::http_client;
use tokio::sync::watch;

/// How often the nemesis looks at its nodes.
const TICK: Duration = Duration::from_millis(100);
/// How often a node coming back is asked whether it is ready.
const READY_POLL: Duration = Duration::from_secs(1);
/// A node resumed or reconnected is first asked this long after: one the cluster downed
/// meanwhile may still call itself ready until it hears so, and exits then.
const SETTLE: Duration = Duration::from_secs(5);
/// Time between the start of one fault and the next, drawn uniformly.
const FAULT_INTERVAL_MS: std::ops::Range<u64> = 3_000..10_000;
/// The first fault comes this long after the workload starts.
const FIRST_FAULT_AFTER: Duration = Duration::from_secs(3);
/// A node given SIGTERM that has not exited after this long is killed (and that is recorded).
const TERMINATE_TIMEOUT: Duration = Duration::from_secs(90);
/// Consecutive failed starts of one node before the soak gives up.
const MAX_FAILED_STARTS: u32 = 5;
const RETRY_START_AFTER: Duration = Duration::from_secs(2);

/// What a nemesis event was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    /// SIGKILL.
    Kill,
    /// SIGSTOP.
    Pause,
    /// SIGCONT.
    Resume,
    /// SIGTERM, for a graceful restart.
    Terminate,
    /// A node's process started again.
    Restart,
    /// A node exited after SIGTERM, having left the cluster.
    Left,
    /// A node exited by itself with status 3: the cluster downed it.
    Downed,
    /// A node exited by itself with status 0: the cluster removed it.
    Removed,
    /// A node exited with a status that means it crashed, or did not exit after SIGTERM.
    Crash,
    Partition,
    Heal,
    /// A node failed to start (retried).
    StartFailed,
}

/// One thing the nemesis did or saw.
#[derive(Clone, Debug, Serialize)]
pub struct Event {
    /// From the start of the workload.
    pub at_ms: u64,
    pub kind: EventKind,
    /// The nodes concerned (1-based).
    pub nodes: Vec<usize>,
    pub detail: String,
}

/// A node exit that was not the soak's doing and not a downing: a crash of tessera.
#[derive(Clone, Debug, Serialize)]
pub struct Crash {
    pub at_ms: u64,
    /// 1-based.
    pub node: usize,
    pub incarnation: u32,
    pub status: String,
}

/// Everything the nemesis did, for the summary and the checker.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NemesisRecord {
    pub events: Vec<Event>,
    pub crashes: Vec<Crash>,
}

/// What the nemesis knows of one node.
#[derive(Clone, Copy, Debug)]
enum NodeState {
    /// Running and ready (its regions registered): a healthy member as far as it can tell.
    Healthy,
    /// Started or resumed, not ready yet; impaired.
    Recovering {
        next_poll: Instant,
    },
    Paused {
        until: Instant,
    },
    /// Killed; starts again at `restart_at`.
    Killed {
        restart_at: Instant,
    },
    /// SIGTERM sent; starts again `restart_after` its exit.
    Stopping {
        since: Instant,
        restart_after: Duration,
    },
    /// Exited by itself; starts again as soon as it is not cut off.
    Exited,
}

/// Whether every node is healthy (the end-of-soak wait watches this).
pub type Health = watch::Receiver<bool>;

struct Partition {
    minority: Vec<usize>,
    heal_at: Instant,
}

/// The kinds of fault, drawn by weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Kill,
    Pause,
    /// SIGTERM, then a restart.
    Terminate,
    /// A minority (2 of 5) cut from the rest.
    PartitionMinority,
    /// One node cut from the rest.
    PartitionOne,
}

impl Fault {
    /// Kill 3, pause 3, graceful restart 2, and where partitions are possible 2|3 2 and 1|4 2.
    fn weights(partitions: bool) -> [(Fault, u32); 5] {
        let partition = if partitions { 2 } else { 0 };
        [
            (Fault::Kill, 3),
            (Fault::Pause, 3),
            (Fault::Terminate, 2),
            (Fault::PartitionMinority, partition),
            (Fault::PartitionOne, partition),
        ]
    }
}

/// The nemesis and supervisor of a [`Cluster`].
pub struct Nemesis {
    cluster: Cluster,
    states: Vec<NodeState>,
    failed_starts: Vec<u32>,
    partition: Option<Partition>,
    partitions: bool,
    rng: SmallRng,
    next_fault_at: Instant,
    /// The fault drawn for `next_fault_at`, waiting until it is possible: until a node is
    /// healthy with room for one more impaired, or, for a partition, until all are healthy.
    next_fault: Option<Fault>,
    /// From the start of the workload; set by [`Nemesis::run`].
    start: Instant,
    record: NemesisRecord,
    healthy: watch::Sender<bool>,
    quiet: bool,
    /// About how long after it stops answering a node is downed: failure detection (about
    /// 4 s at the defaults) plus the split-brain resolver's `stable_after`.
    downed_after_ms: u64,
}

impl Nemesis {
    /// A nemesis over `cluster` (not started yet) drawing its choices from `seed`; partitions
    /// only where the nodes run in namespaces. `quiet`: no progress lines on stderr.
    pub fn new(
        cluster: Cluster,
        seed: u64,
        stable_after: Duration,
        quiet: bool,
    ) -> (Nemesis, Health) {
        let partitions = matches!(cluster.placement(), Placement::Namespaces { .. });
        let nodes = cluster.len();
        let (healthy, health) = watch::channel(false);
        let now = Instant::now();
        let nemesis = Nemesis {
            cluster,
            states: vec![NodeState::Exited; nodes],
            failed_starts: vec![0; nodes],
            partition: None,
            partitions,
            rng: SmallRng::seed_from_u64(seed),
            next_fault_at: now,
            next_fault: None,
            start: now,
            record: NemesisRecord::default(),
            healthy,
            quiet,
            downed_after_ms: 4_000 + u64::try_from(stable_after.as_millis()).unwrap_or(u64::MAX),
        };
        (nemesis, health)
    }

    /// Starts every node (all are seeds: the first forms the cluster when the others do not
    /// answer in time, and a restarted first seed joins the others).
    pub async fn start_all(&mut self) -> Result<(), SoakError> {
        for i in 0..self.cluster.len() {
            self.cluster.start(i).await?;
            self.states[i] = NodeState::Recovering {
                next_poll: Instant::now(),
            };
        }
        Ok(())
    }

    fn at_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn event(&mut self, kind: EventKind, nodes: &[usize], detail: String) {
        let event = Event {
            at_ms: self.at_ms(),
            kind,
            nodes: nodes.iter().map(|i| i + 1).collect(),
            detail,
        };
        if !self.quiet {
            eprintln!(
                "  {:>7.1}s nemesis: {:?} node(s) {:?}{}{}",
                event.at_ms as f64 / 1000.0,
                event.kind,
                event.nodes,
                if event.detail.is_empty() { "" } else { ": " },
                event.detail
            );
        }
        self.record.events.push(event);
    }

    fn cut_off(&self, i: usize) -> bool {
        self.partition
            .as_ref()
            .is_some_and(|p| p.minority.contains(&i))
    }

    fn impaired(&self) -> usize {
        (0..self.states.len())
            .filter(|&i| !matches!(self.states[i], NodeState::Healthy) || self.cut_off(i))
            .count()
    }

    /// The most nodes that may be impaired at once: a minority.
    fn minority(&self) -> usize {
        (self.states.len() - 1) / 2
    }

    /// Runs the schedule from `start` until `end`, then heals, resumes and restarts every node
    /// and keeps supervising (restarting nodes that exit) until `stop` turns true; returns the
    /// record and the cluster (its nodes still running).
    pub async fn run(
        mut self,
        start: Instant,
        end: Instant,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(NemesisRecord, Cluster), SoakError> {
        self.start = start;
        self.next_fault_at = start + FIRST_FAULT_AFTER;
        let mut ended = false;
        loop {
            if *stop.borrow() {
                break;
            }
            let now = Instant::now();
            if !ended && now >= end {
                ended = true;
                self.end_faults().await?;
            }
            self.supervise().await?;
            if !ended && now >= self.next_fault_at {
                let fault = match self.next_fault {
                    Some(fault) => fault,
                    None => self.draw_fault(),
                };
                self.next_fault = Some(fault);
                if self.inject(fault).await? {
                    self.next_fault = None;
                    let interval = self.rng.random_range(FAULT_INTERVAL_MS);
                    self.next_fault_at = now + Duration::from_millis(interval);
                }
            }
            let healthy = self.impaired() == 0 && self.partition.is_none();
            self.healthy
                .send_if_modified(|h| std::mem::replace(h, healthy) != healthy);
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                changed = stop.changed() => if changed.is_err() { break },
            }
        }
        Ok((self.record, self.cluster))
    }

    /// Looks at every node: exits, resumes and restarts that are due, readiness, the heal.
    async fn supervise(&mut self) -> Result<(), SoakError> {
        let now = Instant::now();
        for i in 0..self.states.len() {
            if let Some(status) = self.cluster.poll_exit(i) {
                self.exited(i, status, now);
            }
        }
        if self.partition.as_ref().is_some_and(|p| now >= p.heal_at) {
            self.heal().await?;
        }
        let mut polls = Vec::new();
        for i in 0..self.states.len() {
            match self.states[i] {
                NodeState::Paused { until } if now >= until => {
                    self.cluster.resume(i);
                    self.states[i] = NodeState::Recovering {
                        next_poll: now + SETTLE,
                    };
                    self.event(EventKind::Resume, &[i], String::new());
                }
                NodeState::Killed { restart_at } if now >= restart_at && !self.cut_off(i) => {
                    self.restart(i).await?;
                }
                NodeState::Exited if !self.cut_off(i) => self.restart(i).await?,
                NodeState::Stopping { since, .. } if now - since > TERMINATE_TIMEOUT => {
                    let incarnation = self.cluster.incarnations(i);
                    self.cluster.kill(i).await;
                    self.record.crashes.push(Crash {
                        at_ms: self.at_ms(),
                        node: i + 1,
                        incarnation,
                        status: format!("did not exit within {TERMINATE_TIMEOUT:?} of SIGTERM"),
                    });
                    self.event(
                        EventKind::Crash,
                        &[i],
                        "no exit after SIGTERM; killed".into(),
                    );
                    self.states[i] = NodeState::Killed { restart_at: now };
                }
                NodeState::Recovering { next_poll } if now >= next_poll => {
                    self.states[i] = NodeState::Recovering {
                        next_poll: now + READY_POLL,
                    };
                    polls.push(i);
                }
                _ => {}
            }
        }
        let specs = self.cluster.specs();
        let answers = futures::future::join_all(polls.iter().map(|&i| {
            http_client::get(specs[i].http, "/health/ready", Duration::from_millis(800))
        }))
        .await;
        for (i, answer) in polls.into_iter().zip(answers) {
            // Still recovering, and its process still there (it may have exited meanwhile).
            if answer.is_ok_and(|r| r.status == 200)
                && matches!(self.states[i], NodeState::Recovering { .. })
                && self.cluster.has_process(i)
            {
                self.states[i] = NodeState::Healthy;
                self.failed_starts[i] = 0;
            }
        }
        Ok(())
    }

    /// Node `i`'s process exited with `status` without being killed by the nemesis.
    fn exited(&mut self, i: usize, status: ExitStatus, now: Instant) {
        let incarnation = self.cluster.incarnations(i);
        let describe = |status: ExitStatus| match status.code() {
            Some(code) => format!("exit status {code}"),
            None => format!("{status}"),
        };
        match self.states[i] {
            NodeState::Stopping { restart_after, .. } => {
                // After SIGTERM: 0, or 3 when it was downed while leaving.
                if !matches!(status.code(), Some(0 | 3)) {
                    self.crash(i, incarnation, describe(status));
                } else {
                    self.event(
                        EventKind::Left,
                        &[i],
                        format!("{} after SIGTERM", describe(status)),
                    );
                }
                self.states[i] = NodeState::Killed {
                    restart_at: now + restart_after,
                };
            }
            _ => {
                match status.code() {
                    Some(3) => self.event(EventKind::Downed, &[i], "exit status 3".into()),
                    Some(0) => self.event(EventKind::Removed, &[i], "exit status 0".into()),
                    _ => self.crash(i, incarnation, describe(status)),
                }
                self.states[i] = NodeState::Exited;
            }
        }
    }

    fn crash(&mut self, i: usize, incarnation: u32, status: String) {
        self.record.crashes.push(Crash {
            at_ms: self.at_ms(),
            node: i + 1,
            incarnation,
            status: status.clone(),
        });
        self.event(EventKind::Crash, &[i], status);
    }

    async fn restart(&mut self, i: usize) -> Result<(), SoakError> {
        match self.cluster.start(i).await {
            Ok(()) => {
                let incarnation = self.cluster.incarnations(i);
                self.event(
                    EventKind::Restart,
                    &[i],
                    format!("incarnation {incarnation}"),
                );
                self.states[i] = NodeState::Recovering {
                    next_poll: Instant::now(),
                };
                Ok(())
            }
            Err(e) => {
                self.failed_starts[i] += 1;
                self.event(EventKind::StartFailed, &[i], e.to_string());
                if self.failed_starts[i] >= MAX_FAILED_STARTS {
                    return Err(e);
                }
                self.states[i] = NodeState::Killed {
                    restart_at: Instant::now() + RETRY_START_AFTER,
                };
                Ok(())
            }
        }
    }

    /// The end of the faults: heal, resume, and let every stopped node start at once.
    async fn end_faults(&mut self) -> Result<(), SoakError> {
        if self.partition.is_some() {
            self.heal().await?;
        }
        let now = Instant::now();
        for i in 0..self.states.len() {
            match self.states[i] {
                NodeState::Paused { .. } => {
                    self.states[i] = NodeState::Paused { until: now };
                }
                NodeState::Killed { .. } => {
                    self.states[i] = NodeState::Killed { restart_at: now };
                }
                NodeState::Stopping { since, .. } => {
                    self.states[i] = NodeState::Stopping {
                        since,
                        restart_after: Duration::ZERO,
                    };
                }
                _ => {}
            }
        }
        if !self.quiet {
            eprintln!(
                "  {:>7.1}s nemesis: end of faults; healing, resuming and restarting every node",
                self.at_ms() as f64 / 1000.0
            );
        }
        Ok(())
    }

    fn draw_fault(&mut self) -> Fault {
        let weights = Fault::weights(self.partitions);
        let total: u32 = weights.iter().map(|(_, w)| w).sum();
        let mut pick = self.rng.random_range(0..total);
        for (fault, weight) in weights {
            if pick < weight {
                return fault;
            }
            pick -= weight;
        }
        Fault::Kill
    }

    /// Injects `fault` if it is possible now; whether it did.
    async fn inject(&mut self, fault: Fault) -> Result<bool, SoakError> {
        let healthy: Vec<usize> = (0..self.states.len())
            .filter(|&i| matches!(self.states[i], NodeState::Healthy) && !self.cut_off(i))
            .collect();
        let room = self.minority().saturating_sub(self.impaired());
        let all_healthy = healthy.len() == self.states.len() && self.partition.is_none();
        let possible = match fault {
            Fault::PartitionMinority | Fault::PartitionOne => all_healthy,
            Fault::Kill | Fault::Pause | Fault::Terminate => room > 0 && !healthy.is_empty(),
        };
        if !possible {
            return Ok(false);
        }
        let mut targets = healthy.clone();
        targets.shuffle(&mut self.rng);
        // One node, or two (when there is room) a third of the time.
        let count = if room >= 2 && self.rng.random_ratio(1, 3) {
            2
        } else {
            1
        };
        targets.truncate(count);
        let now = Instant::now();
        match fault {
            Fault::Kill => {
                // Most restarts come before the cluster downs the node, some after.
                let down_ms = self.rng.random_range(500..self.downed_after_ms + 4_000);
                for &i in &targets {
                    self.cluster.kill(i).await;
                    self.states[i] = NodeState::Killed {
                        restart_at: now + Duration::from_millis(down_ms),
                    };
                }
                self.event(
                    EventKind::Kill,
                    &targets,
                    format!("SIGKILL, restart after {:.1}s", down_ms as f64 / 1000.0),
                );
            }
            Fault::Pause => {
                // Half the pauses are shorter than failure detection, half long enough for
                // the split-brain resolver to down the node (it exits when it resumes).
                let pause_ms = if self.rng.random_bool(0.5) {
                    self.rng.random_range(500..3_000)
                } else {
                    self.rng
                        .random_range(self.downed_after_ms..self.downed_after_ms + 8_000)
                };
                for &i in &targets {
                    self.cluster.pause(i);
                    self.states[i] = NodeState::Paused {
                        until: now + Duration::from_millis(pause_ms),
                    };
                }
                self.event(
                    EventKind::Pause,
                    &targets,
                    format!("SIGSTOP for {:.1}s", pause_ms as f64 / 1000.0),
                );
            }
            Fault::Terminate => {
                let i = targets[0];
                let restart_ms = self.rng.random_range(0..3_000);
                self.cluster.terminate(i);
                self.states[i] = NodeState::Stopping {
                    since: now,
                    restart_after: Duration::from_millis(restart_ms),
                };
                self.event(
                    EventKind::Terminate,
                    &[i],
                    format!(
                        "SIGTERM (graceful leave), restart {:.1}s after it exits",
                        restart_ms as f64 / 1000.0
                    ),
                );
            }
            Fault::PartitionMinority | Fault::PartitionOne => {
                let minority_size = if fault == Fault::PartitionMinority {
                    self.minority()
                } else {
                    1
                };
                let mut nodes: Vec<usize> = (0..self.states.len()).collect();
                nodes.shuffle(&mut self.rng);
                let mut minority: Vec<usize> = nodes[..minority_size].to_vec();
                let mut majority: Vec<usize> = nodes[minority_size..].to_vec();
                minority.sort_unstable();
                majority.sort_unstable();
                let heal_ms = self.rng.random_range(3_000..self.downed_after_ms + 8_000);
                self.partition_network(vec![minority.clone(), majority.clone()])
                    .await?;
                let shape = format!("{}|{}", minority.len(), majority.len());
                self.event(
                    EventKind::Partition,
                    &minority,
                    format!(
                        "{shape}: {:?} | {:?}, heal after {:.1}s",
                        minority.iter().map(|i| i + 1).collect::<Vec<_>>(),
                        majority.iter().map(|i| i + 1).collect::<Vec<_>>(),
                        heal_ms as f64 / 1000.0
                    ),
                );
                self.partition = Some(Partition {
                    minority,
                    heal_at: now + Duration::from_millis(heal_ms),
                });
            }
        }
        Ok(true)
    }

    async fn partition_network(&mut self, groups: Vec<Vec<usize>>) -> Result<(), SoakError> {
        let Placement::Namespaces { network, .. } = self.cluster.placement() else {
            return Ok(());
        };
        let network = network.clone();
        // The tc commands block: on a thread of the blocking pool.
        tokio::task::spawn_blocking(move || {
            network
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .partition(&groups)
        })
        .await
        .map_err(|e| SoakError::Network(e.to_string()))?
        .map_err(|e| SoakError::Network(e.to_string()))
    }

    async fn heal(&mut self) -> Result<(), SoakError> {
        if let Placement::Namespaces { network, .. } = self.cluster.placement() {
            let network = network.clone();
            tokio::task::spawn_blocking(move || {
                network
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .heal()
            })
            .await
            .map_err(|e| SoakError::Network(e.to_string()))?
            .map_err(|e| SoakError::Network(e.to_string()))?;
        }
        let minority = self
            .partition
            .take()
            .map(|p| p.minority)
            .unwrap_or_default();
        for &i in &minority {
            if matches!(self.states[i], NodeState::Healthy) {
                self.states[i] = NodeState::Recovering {
                    next_poll: Instant::now() + SETTLE,
                };
            }
        }
        self.event(EventKind::Heal, &minority, String::new());
        Ok(())
    }
}
