//! This node's instances of one daemon, as sharding's host of the daemon's type: a
//! keep-alive asked of an instance starts it when it is not running, a stop from sharding (a
//! handoff, a shutdown) stops it, and a change of the count restarts every instance here
//! with the new count (and stops those no longer below it).
//!
//! Invariant: on this node at most one run of an instance exists at a time. An instance told
//! to stop stays listed, as stopping, until its task has returned (or been aborted after
//! `stop_timeout`); a keep-alive meanwhile does not start another run.

use crate::context::DaemonContext;
use crate::settings::DaemonSettings;
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use tessera_coordinator::host::{AskFailure, AskOutcome, FailureKind, Payload, ShardHost};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

/// The task of a daemon: called for each run of each instance.
pub type DaemonBehavior = Arc<dyn Fn(DaemonContext) -> BoxFuture<'static, ()> + Send + Sync>;

/// The version of [`KeepAlive`] and [`InstanceStatus`] in postcard, carried by every
/// keep-alive forwarded between nodes.
pub const MESSAGE_VERSION: u32 = 1;

/// The one command of a daemon's instances: be running.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeepAlive;

/// What an instance answers a keep-alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum InstanceStatus {
    /// It was not running here: this keep-alive started it.
    Started,
    /// It was running.
    Running,
    /// It is stopping; the next keep-alive after it stopped starts it again.
    Stopping,
}

/// What the instances of one daemon did on this node.
#[derive(Debug, Default)]
pub struct DaemonCounters {
    /// Runs started.
    pub started: AtomicU64,
    /// Runs whose task returned without being told to stop.
    pub ended: AtomicU64,
    /// Runs whose task panicked.
    pub panicked: AtomicU64,
    /// Runs stopped when told to (a handoff, a new count, the node stopping).
    pub stopped: AtomicU64,
    /// Runs aborted for not returning within `stop_timeout` of being told to stop.
    pub aborted: AtomicU64,
}

/// A run of an instance, listed until its task is over.
struct Run {
    id: u64,
    count: u32,
    stop: CancellationToken,
    abort: AbortHandle,
    finished: Shared<BoxFuture<'static, ()>>,
}

struct Inner {
    name: Arc<str>,
    behavior: DaemonBehavior,
    count: watch::Receiver<u32>,
    settings: DaemonSettings,
    runs: Mutex<BTreeMap<u32, Run>>,
    next_run: AtomicU64,
    closed: AtomicBool,
    counters: DaemonCounters,
}

/// This node's instances of one daemon. Cheap to clone.
#[derive(Clone)]
pub struct DaemonHost {
    inner: Arc<Inner>,
}

impl DaemonHost {
    /// The host of daemon `name` on this node, its runs started by `behavior`, following
    /// `count` (the daemon's current number of instances). Must be called in a tokio runtime:
    /// it starts the task that follows the count.
    pub fn start(
        name: &str,
        behavior: DaemonBehavior,
        count: watch::Receiver<u32>,
        settings: DaemonSettings,
    ) -> Self {
        let inner = Arc::new(Inner {
            name: name.into(),
            behavior,
            count: count.clone(),
            settings,
            runs: Mutex::new(BTreeMap::new()),
            next_run: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            counters: DaemonCounters::default(),
        });
        tokio::spawn(follow_count(Arc::downgrade(&inner), count));
        DaemonHost { inner }
    }

    /// The daemon's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The number of instances as this node knows it now.
    pub fn count(&self) -> u32 {
        *self.inner.count.borrow()
    }

    /// The instances running here (stopping ones included), in order.
    pub fn running(&self) -> Vec<u32> {
        self.inner.runs().keys().copied().collect()
    }

    /// What the instances did on this node.
    pub fn counters(&self) -> &DaemonCounters {
        &self.inner.counters
    }

    /// Stops every instance here and starts none again: the node is stopping.
    pub async fn shutdown(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        let all = self.running();
        self.inner.stop(all).await;
    }
}

impl Inner {
    fn runs(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, Run>> {
        // A panic cannot happen under this lock (no user code runs under it).
        self.runs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts instance `index` unless a run of it is listed.
    fn start(self: &Arc<Self>, index: u32) -> Result<InstanceStatus, AskFailure> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(AskFailure::new(
                FailureKind::Unavailable,
                AskOutcome::NotApplied,
                format!("daemon {}: this node is stopping", self.name),
            ));
        }
        // The count is read under the runs' lock: a change of the count checks the runs
        // under it too, so a run started with the count before is listed by then and is
        // stopped by it.
        let mut runs = self.runs();
        let count = *self.count.borrow();
        if index >= count {
            return Err(AskFailure::new(
                FailureKind::BadRequest,
                AskOutcome::NotApplied,
                format!(
                    "daemon {} has {count} instances (0 to {}): there is no instance {index}",
                    self.name,
                    count.saturating_sub(1)
                ),
            ));
        }
        if let Some(run) = runs.get(&index) {
            return Ok(if run.stop.is_cancelled() {
                InstanceStatus::Stopping
            } else {
                InstanceStatus::Running
            });
        }
        let id = self.next_run.fetch_add(1, Ordering::Relaxed);
        let stop = CancellationToken::new();
        let context = DaemonContext::new(self.name.clone(), index, count, stop.clone());
        let behavior = self.behavior.clone();
        let weak = Arc::downgrade(self);
        // The behavior is called in the task, not under the lock: a panic of the call is
        // the run's.
        let task = tokio::spawn(async move {
            let outcome = AssertUnwindSafe(async move { behavior(context).await })
                .catch_unwind()
                .await;
            if let Some(inner) = weak.upgrade() {
                inner.ended(index, id, outcome.is_err());
            }
        });
        let abort = task.abort_handle();
        let finished = async move {
            let _ = task.await;
        }
        .boxed()
        .shared();
        runs.insert(
            index,
            Run {
                id,
                count,
                stop,
                abort,
                finished,
            },
        );
        self.counters.started.fetch_add(1, Ordering::Relaxed);
        tracing::info!(daemon = %self.name, index, count, "daemon instance started");
        Ok(InstanceStatus::Started)
    }

    /// A run's task returned (or panicked): it is no longer listed.
    fn ended(&self, index: u32, id: u64, panicked: bool) {
        let mut runs = self.runs();
        let Some(run) = runs.get(&index).filter(|run| run.id == id) else {
            return;
        };
        let told = run.stop.is_cancelled();
        runs.remove(&index);
        drop(runs);
        if panicked {
            self.counters.panicked.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(daemon = %self.name, index, "daemon instance panicked; the next keep-alive starts it again");
        } else if told {
            self.counters.stopped.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters.ended.fetch_add(1, Ordering::Relaxed);
            tracing::info!(daemon = %self.name, index, "daemon instance returned; the next keep-alive starts it again");
        }
    }

    /// Tells the runs of `indexes` to stop and waits until their tasks are over, aborting
    /// those that do not return within `stop_timeout`.
    fn stop(self: &Arc<Self>, indexes: Vec<u32>) -> BoxFuture<'static, ()> {
        let stopping: Vec<(u32, u64, AbortHandle, Shared<BoxFuture<'static, ()>>)> = {
            let runs = self.runs();
            indexes
                .iter()
                .filter_map(|index| runs.get(index).map(|run| (*index, run)))
                .map(|(index, run)| {
                    run.stop.cancel();
                    (index, run.id, run.abort.clone(), run.finished.clone())
                })
                .collect()
        };
        let inner = self.clone();
        async move {
            let timeout = inner.settings.stop_timeout;
            futures::stream::iter(stopping)
                .for_each_concurrent(None, |(index, id, abort, finished)| {
                    let inner = inner.clone();
                    async move {
                        if tokio::time::timeout(timeout, finished.clone()).await.is_err() {
                            tracing::warn!(daemon = %inner.name, index, ?timeout, "daemon instance did not stop in time; aborted");
                            inner.counters.aborted.fetch_add(1, Ordering::Relaxed);
                            abort.abort();
                            finished.await;
                        }
                        // An aborted task never reports its end.
                        let mut runs = inner.runs();
                        if runs.get(&index).is_some_and(|run| run.id == id) {
                            runs.remove(&index);
                        }
                    }
                })
                .await;
        }
        .boxed()
    }
}

/// Restarts the instances of this node with each new count, and stops those no longer below
/// it; ends with the host.
async fn follow_count(inner: Weak<Inner>, mut count: watch::Receiver<u32>) {
    while count.changed().await.is_ok() {
        let new_count = *count.borrow_and_update();
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let stale: Vec<u32> = inner
            .runs()
            .iter()
            .filter(|(_, run)| run.count != new_count)
            .map(|(index, _)| *index)
            .collect();
        if stale.is_empty() {
            continue;
        }
        tracing::info!(daemon = %inner.name, new_count, restarting = ?stale, "daemon count changed");
        inner.stop(stale.clone()).await;
        for index in stale.into_iter().filter(|index| *index < new_count) {
            // A keep-alive may have started it already; a refusal (the node stopping) is
            // the next keep-alive's to retry.
            let _ = inner.start(index);
        }
    }
}

/// An instance number from an entity id: its decimal, exactly.
fn index_of(entity_id: &str) -> Option<u32> {
    entity_id
        .parse::<u32>()
        .ok()
        .filter(|index| index.to_string() == entity_id)
}

fn answer(status: InstanceStatus, encoded: bool) -> Result<Payload, AskFailure> {
    if encoded {
        postcard::to_allocvec(&status)
            .map(Payload::Encoded)
            .map_err(|e| AskFailure::new(FailureKind::Internal, AskOutcome::Applied, e.to_string()))
    } else {
        Ok(Payload::local(status))
    }
}

impl ShardHost for DaemonHost {
    fn ask(
        &self,
        entity_id: &str,
        command: Payload,
    ) -> BoxFuture<'static, Result<Payload, AskFailure>> {
        let encoded = command.is_encoded();
        let result = match (command.into_typed::<KeepAlive>(), index_of(entity_id)) {
            (Err(e), _) => Err(AskFailure::new(
                FailureKind::BadRequest,
                AskOutcome::NotApplied,
                format!("daemon {} takes only keep-alives: {e}", self.inner.name),
            )),
            (Ok(_), None) => Err(AskFailure::new(
                FailureKind::BadRequest,
                AskOutcome::NotApplied,
                format!(
                    "daemon {}: {entity_id:?} is not an instance number",
                    self.inner.name
                ),
            )),
            (Ok(KeepAlive), Some(index)) => self
                .inner
                .start(index)
                .and_then(|status| answer(status, encoded)),
        };
        futures::future::ready(result).boxed()
    }

    fn stop_entities(&self, entity_ids: Vec<String>) -> BoxFuture<'static, ()> {
        let indexes = entity_ids.iter().filter_map(|id| index_of(id)).collect();
        self.inner.stop(indexes)
    }

    fn live_entity_ids(&self) -> BoxFuture<'static, Vec<String>> {
        let ids = self.running().iter().map(u32::to_string).collect();
        futures::future::ready(ids).boxed()
    }

    fn start_entities(&self, entity_ids: Vec<String>) -> Vec<String> {
        for index in entity_ids.iter().filter_map(|id| index_of(id)) {
            let _ = self.inner.start(index);
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn host_with(count: u32, behavior: DaemonBehavior) -> (DaemonHost, watch::Sender<u32>) {
        let (count_tx, count_rx) = watch::channel(count);
        let settings = DaemonSettings {
            stop_timeout: Duration::from_millis(200),
            ..DaemonSettings::default()
        };
        (
            DaemonHost::start("test", behavior, count_rx, settings),
            count_tx,
        )
    }

    /// Runs until told to stop, recording (index, count) of each run.
    fn recording(log: Arc<Mutex<Vec<(u32, u32)>>>) -> DaemonBehavior {
        Arc::new(move |context: DaemonContext| {
            log.lock().unwrap().push((context.index(), context.count()));
            async move { context.stopped().await }.boxed()
        })
    }

    async fn keep_alive(host: &DaemonHost, id: &str) -> Result<InstanceStatus, AskFailure> {
        host.ask(id, Payload::local(KeepAlive))
            .await
            .map(|answer| answer.into_typed::<InstanceStatus>().unwrap())
    }

    #[tokio::test]
    async fn a_keep_alive_starts_an_instance_once() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let (host, _count) = host_with(4, recording(log.clone()));
        assert_eq!(keep_alive(&host, "2").await, Ok(InstanceStatus::Started));
        assert_eq!(keep_alive(&host, "2").await, Ok(InstanceStatus::Running));
        assert_eq!(host.running(), vec![2]);
        while log.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(*log.lock().unwrap(), vec![(2, 4)]);
        // Encoded keep-alives get encoded answers.
        let encoded = host
            .ask(
                "2",
                Payload::Encoded(postcard::to_allocvec(&KeepAlive).unwrap()),
            )
            .await
            .unwrap();
        assert!(encoded.is_encoded());
        host.stop_entities(vec!["2".into()]).await;
        assert!(host.running().is_empty());
        assert_eq!(host.counters().stopped.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn bad_instances_and_commands_are_refused_by_name() {
        let (host, _count) = host_with(4, recording(Arc::default()));
        let beyond = keep_alive(&host, "4").await.unwrap_err();
        assert_eq!(beyond.kind, FailureKind::BadRequest);
        assert!(
            beyond.message.contains("no instance 4"),
            "{}",
            beyond.message
        );
        for id in ["-1", "01", "x"] {
            let refused = keep_alive(&host, id).await.unwrap_err();
            assert!(
                refused.message.contains("not an instance number"),
                "{}",
                refused.message
            );
        }
        let wrong = host
            .ask("1", Payload::Encoded(vec![1, 2, 3]))
            .await
            .unwrap_err();
        assert!(
            wrong.message.contains("only keep-alives"),
            "{}",
            wrong.message
        );
        assert!(host.running().is_empty());
    }

    #[tokio::test]
    async fn an_instance_that_returns_or_panics_is_started_by_the_next_keep_alive() {
        let runs = Arc::new(AtomicU64::new(0));
        let seen = runs.clone();
        let behavior: DaemonBehavior = Arc::new(move |_context| {
            let run = seen.fetch_add(1, Ordering::SeqCst);
            async move {
                if run == 0 {
                    panic!("the first run panics");
                }
            }
            .boxed()
        });
        let (host, _count) = host_with(1, behavior);
        for _ in 0..2 {
            assert_eq!(keep_alive(&host, "0").await, Ok(InstanceStatus::Started));
            while !host.running().is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert_eq!(host.counters().panicked.load(Ordering::Relaxed), 1);
        assert_eq!(host.counters().ended.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_run_that_ignores_its_stop_is_aborted_and_never_overlaps_the_next() {
        let live = Arc::new(AtomicU64::new(0));
        let gauge = live.clone();
        let behavior: DaemonBehavior = Arc::new(move |_context| {
            let gauge = gauge.clone();
            async move {
                struct Live(Arc<AtomicU64>);
                impl Drop for Live {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, Ordering::SeqCst);
                    }
                }
                assert_eq!(gauge.fetch_add(1, Ordering::SeqCst), 0, "two runs at once");
                let _live = Live(gauge);
                std::future::pending::<()>().await;
            }
            .boxed()
        });
        let (host, _count) = host_with(1, behavior);
        keep_alive(&host, "0").await.unwrap();
        let stopping = host.stop_entities(vec!["0".into()]);
        // While it stops, a keep-alive does not start a second run.
        assert_eq!(keep_alive(&host, "0").await, Ok(InstanceStatus::Stopping));
        stopping.await;
        assert_eq!(host.counters().aborted.load(Ordering::Relaxed), 1);
        assert_eq!(live.load(Ordering::SeqCst), 0);
        assert_eq!(keep_alive(&host, "0").await, Ok(InstanceStatus::Started));
    }

    #[tokio::test]
    async fn a_new_count_restarts_the_instances_and_stops_those_beyond_it() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let (host, count) = host_with(4, recording(log.clone()));
        for id in ["0", "3"] {
            keep_alive(&host, id).await.unwrap();
        }
        count.send(2).unwrap();
        while host.running() != vec![0] || log.lock().unwrap().len() < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(*log.lock().unwrap(), vec![(0, 4), (3, 4), (0, 2)]);
        assert!(keep_alive(&host, "3").await.is_err());
        host.shutdown().await;
        assert!(host.running().is_empty());
        assert!(keep_alive(&host, "0").await.is_err());
    }
}
