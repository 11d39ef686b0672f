//! Configuration of the RocksDB journal.

use std::path::PathBuf;
use std::time::Duration;
use tessera_storage::FsyncPolicy;

/// Configuration of a [`RocksJournal`](crate::RocksJournal).
#[derive(Debug, Clone)]
pub struct JournalConfig {
    /// Directory of the RocksDB database (created if missing).
    pub path: PathBuf,
    /// Durability of acknowledged writes.
    pub fsync: FsyncPolicy,
    /// Writes that may wait for the writer; a write arriving at a full queue is refused with
    /// [`JournalError::QueueFull`](crate::JournalError::QueueFull).
    pub write_queue_capacity: usize,
    /// Most writes group-committed in one RocksDB batch.
    pub max_batch_writes: usize,
    /// Most payload bytes group-committed in one batch (a larger single write is a batch of
    /// its own).
    pub max_batch_bytes: usize,
    /// Longest the writer waits for more writes before committing a group, when the previous
    /// group was larger than what is queued (0: never wait). Trades a little latency under
    /// concurrency for fewer fsyncs; a lone writer never waits.
    pub group_commit_linger: Duration,
    /// Largest single [`AtomicWrite`](crate::AtomicWrite), in payload bytes.
    pub max_write_bytes: usize,
    /// Events read from RocksDB per step of a replay or query.
    pub read_chunk_events: usize,
    /// Events of a replay's first step (and of `events_by_persistence_id`'s) read in the
    /// consumer's task rather than on the blocking pool: short logs are read without a hop to
    /// another thread, which costs more than reading them, at the price of the task blocking
    /// for that read (0: every step on the blocking pool, e.g. when the journal's files are
    /// not in memory and the disk is slow).
    pub inline_read_events: usize,
    /// Size of RocksDB's block cache for events: it keeps the blocks that events found by
    /// tag are read from. Replays read past it (each reads a log once). The events' index
    /// and filter blocks are not in it but held with their table files, about 1.5% of the
    /// events' uncompressed size, which no setting bounds.
    pub block_cache_bytes: usize,
    /// Size of the separate block cache of the journal's metadata (log numbers and states,
    /// tags), which every replay reads first; kept apart so that reads of events do not evict it.
    pub metadata_cache_bytes: usize,
    /// Size of each RocksDB memtable.
    pub write_buffer_bytes: usize,
    /// How long after opening the replica store promises no new writer of a log it holds:
    /// the read leases it granted before it was opened are forgotten, and a writer in
    /// another process may still count on one. At least the longest read lease writers ask
    /// for ([`tessera_replication::replica::MAX_READ_LEASE`], the default); zero only for a
    /// store whose logs no other process ever wrote (tests).
    pub replica_restart_wait: Duration,
}

impl JournalConfig {
    /// The defaults, with the database at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        JournalConfig {
            path: path.into(),
            fsync: FsyncPolicy::Always,
            write_queue_capacity: 16_384,
            max_batch_writes: 4_096,
            max_batch_bytes: 8 * 1024 * 1024,
            group_commit_linger: Duration::from_micros(100),
            max_write_bytes: 64 * 1024 * 1024,
            read_chunk_events: 1_024,
            inline_read_events: 128,
            block_cache_bytes: 64 * 1024 * 1024,
            metadata_cache_bytes: 8 * 1024 * 1024,
            write_buffer_bytes: 64 * 1024 * 1024,
            replica_restart_wait: tessera_replication::replica::MAX_READ_LEASE,
        }
    }

    /// Checks the bounds; returns a message naming the key and value at fault.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("write_queue_capacity", self.write_queue_capacity),
            ("max_batch_writes", self.max_batch_writes),
            ("max_batch_bytes", self.max_batch_bytes),
            ("max_write_bytes", self.max_write_bytes),
            ("read_chunk_events", self.read_chunk_events),
            ("write_buffer_bytes", self.write_buffer_bytes),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(format!("journal {key} = 0: must be at least 1"));
            }
        }
        Ok(())
    }
}
