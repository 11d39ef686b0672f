//! The durable writer: one task beside the Replicator's that group-commits durable writes, so
//! no fsync is ever awaited on the Replicator's task. Each step's writes arrive as one item of
//! a bounded queue; the writer takes everything queued (up to [`COMMIT_WRITES_MAX`]), writes
//! it as one synced RocksDB batch on the blocking pool, and reports the outcome of every write
//! back on a bounded completion queue. While one batch syncs, the next accumulates.
//!
//! When the queue is full, [`DurableWriter::submit`] refuses the step's writes at once with
//! [`DurableWriteError::QueueFull`] instead of waiting: the Replicator's task keeps serving
//! reads and every other key while the disk is slow or stuck, and the refused writes are
//! reported failed like any failed write — their acknowledgements are withheld, and the
//! key's next acknowledgement writes it again. No write is dropped silently.

use crate::durable::DurableStore;
use crate::envelope::DataEnvelope;
use crate::replicator::DurableWriteId;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Most writes in one commit: a bound on the size of a RocksDB batch. One step's writes are
/// never split, so a commit may exceed it by the writes of the step that crossed it.
pub const COMMIT_WRITES_MAX: usize = 4096;

/// Completed commits waiting for the Replicator's task; the writer waits while it is full.
const COMPLETION_QUEUE_CAPACITY: usize = 64;

/// One key's state to store, as the Replicator issued it.
#[derive(Debug)]
pub struct DurableWrite {
    pub write: DurableWriteId,
    pub key: String,
    pub envelope: DataEnvelope,
}

/// The outcome of one commit: every write in it is stored, or none is.
#[derive(Debug)]
pub struct DurableCompletion {
    pub writes: Vec<DurableWriteId>,
    pub result: Result<(), DurableWriteError>,
}

/// Why durable writes were not stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurableWriteError {
    /// `capacity` steps' writes were waiting for the disk already.
    #[error("the durable writer's queue is full (capacity {capacity} steps); not written")]
    QueueFull { capacity: usize },
    #[error("{0}")]
    Store(String),
    #[error("the durable writer stopped before writing")]
    Stopped,
}

/// The Replicator's side of the durable writer.
pub struct DurableWriter {
    queue: mpsc::Sender<Vec<DurableWrite>>,
    capacity: usize,
    task: JoinHandle<()>,
}

impl DurableWriter {
    /// Starts the writer task on `store`; `queue_capacity` steps' writes may wait for it
    /// (at least 1). Completions arrive on the returned receiver.
    pub fn start(
        store: Arc<DurableStore>,
        queue_capacity: usize,
    ) -> (Self, mpsc::Receiver<DurableCompletion>) {
        let capacity = queue_capacity.max(1);
        let (queue, queued) = mpsc::channel(capacity);
        let (completions, completed) = mpsc::channel(COMPLETION_QUEUE_CAPACITY);
        let task = tokio::spawn(run(store, queued, completions));
        let writer = DurableWriter {
            queue,
            capacity,
            task,
        };
        (writer, completed)
    }

    /// Queues one step's writes without waiting. A full queue (or a stopped writer) refuses
    /// them all and hands them back with the reason, for the caller to report them failed.
    pub fn submit(
        &self,
        writes: Vec<DurableWrite>,
    ) -> Result<(), (DurableWriteError, Vec<DurableWrite>)> {
        self.queue.try_send(writes).map_err(|e| match e {
            mpsc::error::TrySendError::Full(writes) => (
                DurableWriteError::QueueFull {
                    capacity: self.capacity,
                },
                writes,
            ),
            mpsc::error::TrySendError::Closed(writes) => (DurableWriteError::Stopped, writes),
        })
    }

    /// Stops taking writes, lets the writer finish what is queued, and waits until it has
    /// let go of the store (so it can be opened again). The caller must have dropped the
    /// completion receiver, or keep draining it, or this waits for it.
    pub async fn stop(self) {
        drop(self.queue);
        // A writer that panicked has let go of the store too.
        let _ = self.task.await;
    }
}

/// The writer task: commits everything queued in one synced batch, reports, repeats. Ends
/// when the queue is closed and empty, or when nobody takes completions any more.
async fn run(
    store: Arc<DurableStore>,
    mut queued: mpsc::Receiver<Vec<DurableWrite>>,
    completions: mpsc::Sender<DurableCompletion>,
) {
    while let Some(mut batch) = queued.recv().await {
        while batch.len() < COMMIT_WRITES_MAX {
            match queued.try_recv() {
                Ok(more) => batch.extend(more),
                Err(_) => break,
            }
        }
        let writes = batch.iter().map(|w| w.write).collect();
        let entries: Vec<(String, DataEnvelope)> =
            batch.into_iter().map(|w| (w.key, w.envelope)).collect();
        let store = Arc::clone(&store);
        // RocksDB blocks: the sync runs on the blocking pool, never on a runtime thread.
        let result = match tokio::task::spawn_blocking(move || store.store(&entries)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(DurableWriteError::Store(e.to_string())),
            Err(e) => Err(DurableWriteError::Store(format!(
                "the durable write task failed: {e}"
            ))),
        };
        if completions
            .send(DurableCompletion { writes, result })
            .await
            .is_err()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PNCounter;
    use tessera_cluster::{Address, UniqueAddress};

    fn write(write: DurableWriteId, key: &str, n: u64) -> DurableWrite {
        let mut counter = PNCounter::new();
        counter.increment(&UniqueAddress::new(Address::new("h", 1), 1), n);
        DurableWrite {
            write,
            key: key.to_string(),
            envelope: DataEnvelope::new(counter.into()),
        }
    }

    #[tokio::test]
    async fn steps_queued_while_the_writer_is_busy_are_committed_in_one_batch() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(DurableStore::open(dir.path()).unwrap());
        let (writer, mut completed) = DurableWriter::start(Arc::clone(&store), 16);
        // On this single-threaded runtime the writer task has not run yet: all three steps
        // are queued when it first looks.
        writer.submit(vec![write(1, "a", 1)]).unwrap();
        writer
            .submit(vec![write(2, "b", 1), write(3, "a", 2)])
            .unwrap();
        writer.submit(vec![write(4, "c", 1)]).unwrap();
        let completion = completed.recv().await.unwrap();
        assert_eq!(completion.writes, [1, 2, 3, 4]);
        assert_eq!(completion.result, Ok(()));
        writer.stop().await;
        let stored = store.load_all().unwrap();
        // The later write of a key in one batch wins.
        let expected: Vec<(String, DataEnvelope)> = [write(3, "a", 2), write(2, "b", 1)]
            .into_iter()
            .chain([write(4, "c", 1)])
            .map(|w| (w.key, w.envelope))
            .collect();
        assert_eq!(stored, expected);
    }

    #[tokio::test]
    async fn a_full_queue_refuses_the_step_with_a_typed_error_and_hands_its_writes_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(DurableStore::open(dir.path()).unwrap());
        let (writer, mut completed) = DurableWriter::start(store, 1);
        writer.submit(vec![write(1, "a", 1)]).unwrap();
        let (error, refused) = writer.submit(vec![write(2, "b", 1)]).unwrap_err();
        assert_eq!(error, DurableWriteError::QueueFull { capacity: 1 });
        assert_eq!(
            error.to_string(),
            "the durable writer's queue is full (capacity 1 steps); not written"
        );
        assert_eq!(refused.iter().map(|w| w.write).collect::<Vec<_>>(), [2]);
        // The queued step is still written.
        let completion = completed.recv().await.unwrap();
        assert_eq!((completion.writes, completion.result), (vec![1], Ok(())));
    }
}
