//! The RocksDB journal: one database, a group-committing writer thread, and readers that
//! iterate RocksDB on tokio's blocking pool.

pub(crate) mod keys;
mod reader;
mod recent;
pub(crate) mod replica;
#[cfg(test)]
mod tests;
mod writer;

use crate::config::JournalConfig;
use crate::entry::StoredEvent;
use crate::error::{JournalError, MAX_TAGS_PER_EVENT, validate_name};
use crate::journal::{Journal, JournalStream, QueryMode};
use crate::record::{AtomicWrite, EventEnvelope, PersistentRepr};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use keys::{CF_EVENTS, CF_META, CF_TAG_INDEX};
use rocksdb::{BlockBasedOptions, ColumnFamilyDescriptor, DB, Options, SliceTransform};
use std::sync::Arc;
use std::sync::mpsc::{SyncSender, TrySendError};
use tessera_metrics::LatencyHistogram;
use tessera_replication::{ConfigAt, Request, Response};
use tessera_storage::{self as storage, FORMAT_VERSION_KEY, MAX_NAME_BYTES, name_excerpt};
use tokio::sync::{oneshot, watch};

/// The key of event `sequence_nr` of log number `pid_num` in the `events` column family.
/// Public for `tessera bench journal`, whose raw-RocksDB baseline reads the same keys.
pub fn event_key(pid_num: u64, sequence_nr: u64) -> [u8; 16] {
    keys::pair_key(pid_num, sequence_nr)
}

/// The store format version this release writes; stores with a higher one are refused, and
/// older ones are read and upgraded:
///
/// - 1: log states kept apart from log numbers (read as they are, each log's records
///   rewritten at its next write);
/// - 2: log number and state in one record, events in record format 1 only;
/// - 3: events also in record format 2. A release of store format 2 would report these
///   records as newer when reading, but its physical deletion would drop them without their
///   tag entries; the store is marked 3 so that such a release refuses it instead.
/// - 4: events also in record format 3 (xxh3 checksums). For the same reason: a release of
///   store format 3 would report them as newer when replaying, and delete them without their
///   tag entries; marked 4, the store is refused by it at open.
/// - 5: events also in record format 4 (the entry's epoch in front), and the replica state of
///   replicated logs. A release of store format 4 could neither read those records nor keep
///   a replica's promises: marked 5, the store is refused by it at open.
/// - 6: a replicated log's `p` value also carries the replica's last entry and acknowledged
///   mark (`keys::ReplicaProgress`), and its replica state record is rewritten only when the
///   promise, the deleted prefix or the configuration changes. A release of store format 5
///   would find those values malformed, and read stale marks from the replica state records:
///   marked 6, the store is refused by it at open.
pub const STORE_FORMAT_VERSION: u32 = 6;

/// The longest [`RocksJournal::settle`] waits.
pub const SETTLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// What the writer, the readers and the handle share.
pub(crate) struct Shared {
    pub db: DB,
    pub config: JournalConfig,
    /// Each synced write of the writer thread: see [`RocksJournal::fsync_durations`].
    pub fsync_durations: LatencyHistogram,
}

impl Shared {
    pub fn cf(&self, name: &str) -> Result<&rocksdb::ColumnFamily, JournalError> {
        self.db
            .cf_handle(name)
            .ok_or_else(|| JournalError::CorruptMetadata(format!("column family {name} missing")))
    }
}

/// Hash buckets of the events' memtable (a pointer each, per memtable).
const EVENTS_MEMTABLE_BUCKETS: usize = 65_536;

/// Memtable size of the metadata and tag-index column families.
const METADATA_WRITE_BUFFER_BYTES: usize = 4 * 1024 * 1024;

/// RocksDB options for the journal's database and its column families. Public so that
/// `tessera bench journal` runs its raw-RocksDB baseline with exactly the same settings.
pub fn rocksdb_options(config: &JournalConfig) -> (Options, Vec<ColumnFamilyDescriptor>) {
    let mut db = Options::default();
    db.create_if_missing(true);
    db.create_missing_column_families(true);
    db.set_max_background_jobs(2);
    db.set_bytes_per_sync(1024 * 1024);
    // The hash memtable of the events takes no concurrent inserts; one writer thread writes
    // anyway.
    db.set_allow_concurrent_memtable_write(false);
    // A torn last WAL record after a crash is the write that was never acknowledged; recovery
    // stops there and keeps everything before it.
    db.set_wal_recovery_mode(rocksdb::DBRecoveryMode::PointInTime);

    let cache = rocksdb::Cache::new_lru_cache(config.block_cache_bytes);
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(&cache);
    table.set_bloom_filter(10.0, false);
    // Index and filter blocks stay with the table readers (RocksDB's default), loaded when a
    // table file is opened, rather than in the block cache: replays read with `fill_cache`
    // off (see `reader::EventCursor::read_chunk`), and a replay that does not find the index
    // in the cache reads and decompresses it again, for every log (measured: a replay of
    // 10,000 logs of 100 events 3.6 times slower). They take about 1.5% of the events'
    // uncompressed size in memory.

    let mut events = Options::default();
    events.set_write_buffer_size(config.write_buffer_bytes);
    events.set_compression_type(rocksdb::DBCompressionType::Lz4);
    events.set_prefix_extractor(SliceTransform::create_fixed_prefix(8));
    events.set_memtable_prefix_bloom_ratio(0.1);
    // Every read of the events is within one log (a prefix), so the memtable can keep a small
    // skip list per log in a hash table: an append then searches its own log's entries
    // rather than every log's (the shared skip list's search was a tenth of the replicated
    // journal's CPU with 256 logs appending). Iterators seek within a log and stop at its
    // bound, as they do now.
    events.set_memtable_factory(rocksdb::MemtableFactory::HashSkipList {
        bucket_count: EVENTS_MEMTABLE_BUCKETS,
        height: 12,
        branching_factor: 4,
    });
    events.set_block_based_table_factory(&table);

    // The metadata (log numbers and states, tag numbers, the tag index) has a cache of its
    // own: every replay starts with a lookup there, and event blocks passing through a
    // shared cache would evict them (measured when replays still filled the cache: a
    // replay's metadata lookups took twice as long with one shared cache; events found by
    // tag still fill it). Its index and filter blocks are few and stay with the table
    // readers rather than in a cache.
    let metadata_cache = rocksdb::Cache::new_lru_cache(config.metadata_cache_bytes);
    let mut metadata_table = BlockBasedOptions::default();
    metadata_table.set_block_cache(&metadata_cache);
    metadata_table.set_bloom_filter(10.0, false);
    let mut small = Options::default();
    small.set_compression_type(rocksdb::DBCompressionType::Lz4);
    small.set_block_based_table_factory(&metadata_table);
    // Every write rewrites a log's small records, so a metadata memtable fills with versions
    // of a few keys: a small one keeps its skip list shallow (each insert searches it) and is
    // flushed into a file of mostly the latest versions.
    small.set_write_buffer_size(METADATA_WRITE_BUFFER_BYTES);

    let cfs = vec![
        ColumnFamilyDescriptor::new(CF_EVENTS, events),
        ColumnFamilyDescriptor::new(CF_TAG_INDEX, small.clone()),
        ColumnFamilyDescriptor::new(CF_META, small),
    ];
    (db, cfs)
}

/// The RocksDB event journal. Cheap to share behind an `Arc`; see [`Journal`] for the
/// operations.
pub struct RocksJournal {
    shared: Arc<Shared>,
    /// The writer's bounded queue. A std channel: the writer thread needs `recv_timeout` to
    /// linger for a group, and async callers only ever `try_send`.
    requests: SyncSender<writer::WriterRequest>,
    commits: watch::Receiver<u64>,
    /// This store's id as a replica of replicated logs (drawn when the store was created).
    storage_id: u64,
    /// Joined when the journal is dropped: the database is closed by then, and not by a
    /// thread still running while the process exits (RocksDB aborts when its globals are
    /// torn down under an open database).
    writer: Option<std::thread::JoinHandle<()>>,
}

impl Drop for RocksJournal {
    fn drop(&mut self) {
        // The queue's only lasting sender goes first: the writer sees its end, finishes what
        // it holds and stops (a close already stopped it).
        let (closed, _) = std::sync::mpsc::sync_channel(0);
        drop(std::mem::replace(&mut self.requests, closed));
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

impl RocksJournal {
    /// Opens (or creates) the journal at `config.path` and starts its writer.
    ///
    /// A store written by a newer release is refused without changing a byte.
    pub async fn open(config: JournalConfig) -> Result<Self, JournalError> {
        tokio::task::spawn_blocking(move || Self::open_blocking(config))
            .await
            .map_err(|e| JournalError::Storage(format!("journal open task failed: {e}")))?
    }

    fn open_blocking(config: JournalConfig) -> Result<Self, JournalError> {
        config.validate().map_err(JournalError::InvalidConfig)?;
        std::fs::create_dir_all(&config.path).map_err(|e| {
            JournalError::Storage(format!("cannot create {}: {e}", config.path.display()))
        })?;
        let existing = storage::check_store_format(
            &config.path,
            "journal",
            CF_META,
            &[CF_EVENTS, CF_TAG_INDEX],
            STORE_FORMAT_VERSION,
        )?;
        let (options, cfs) = rocksdb_options(&config);
        let db = DB::open_cf_descriptors(&options, &config.path, cfs)?;
        let shared = Arc::new(Shared {
            db,
            config,
            fsync_durations: LatencyHistogram::default(),
        });
        // An older store is marked with this release's format before anything is written to
        // it: from now on it gets log records and event records that older releases cannot
        // handle, and they refuse the store for its marker.
        if existing != Some(STORE_FORMAT_VERSION) {
            let mut write_options = rocksdb::WriteOptions::default();
            write_options.set_sync(true);
            shared.db.put_cf_opt(
                shared.cf(CF_META)?,
                FORMAT_VERSION_KEY,
                STORE_FORMAT_VERSION.to_be_bytes(),
                &write_options,
            )?;
        }
        let storage_id = replica::storage_id(&shared)?;
        let (requests, commits, writer) = writer::start(shared.clone())?;
        Ok(RocksJournal {
            shared,
            requests,
            commits,
            storage_id,
            writer: Some(writer),
        })
    }

    /// This store's id as a replica: drawn at random when the store was created, so that a
    /// node that comes back with an empty directory is another replica.
    pub fn storage_id(&self) -> u64 {
        self.storage_id
    }

    /// How long each synced write of the writer thread took: one WAL write and its fsync per
    /// group commit, under `FsyncPolicy::Always` (under `Never` nothing is synced, and nothing
    /// is counted). Shared: the node renders it in `/metrics`.
    pub fn fsync_durations(&self) -> &LatencyHistogram {
        &self.shared.fsync_durations
    }

    /// Applies a request of the replicated log protocol to this store's replica of a log:
    /// writes are decided by the replica rules in the writer and answered once durable (the
    /// writer takes them in the order of the calls); `Locate` and `Read` read what is stored.
    pub fn replica_apply(
        &self,
        persistence_id: &str,
        request: Request<StoredEvent>,
    ) -> BoxFuture<'static, Result<Response<StoredEvent>, JournalError>> {
        if let Err(e) = validate_name("persistence id", persistence_id) {
            return futures::future::ready(Err(e)).boxed();
        }
        let persistence_id = persistence_id.to_string();
        match request {
            Request::Locate => {
                let shared = self.shared.clone();
                let storage_id = self.storage_id;
                blocking(move || {
                    Ok(Response::Located {
                        storage_id,
                        summary: replica::summary(&shared, &persistence_id)?,
                    })
                })
            }
            Request::Read {
                from,
                to,
                max_entries,
                max_bytes,
            } => {
                let shared = self.shared.clone();
                blocking(move || {
                    let (entries, summary) = replica::read(
                        &shared,
                        &persistence_id,
                        from,
                        to,
                        max_entries as usize,
                        (max_bytes as usize).min(replica::MAX_TAIL_BYTES),
                    )?;
                    Ok(Response::Entries { entries, summary })
                })
            }
            request => self.submit(|reply| writer::WriterRequest::Replica {
                persistence_id,
                request,
                reply,
            }),
        }
    }

    /// Applies requests of the replicated log protocol to this store's replicas of several
    /// logs, as [`RocksJournal::replica_apply`] would one by one, answering in the order of
    /// the requests. The writes among them reach the writer as one request (one queue slot,
    /// one wake-up, one answer), which takes them in in this order.
    pub fn replica_apply_many(
        &self,
        requests: Vec<(String, Request<StoredEvent>)>,
    ) -> BoxFuture<'static, Vec<Result<Response<StoredEvent>, JournalError>>> {
        let count = requests.len();
        let mut answers: Vec<Option<BoxFuture<'static, _>>> = Vec::with_capacity(count);
        let mut writes = Vec::with_capacity(count);
        let mut write_places = Vec::with_capacity(count);
        for (persistence_id, request) in requests {
            let is_write = !matches!(request, Request::Locate | Request::Read { .. });
            if is_write && validate_name("persistence id", &persistence_id).is_ok() {
                write_places.push(answers.len());
                writes.push((persistence_id, request));
                answers.push(None);
            } else {
                answers.push(Some(self.replica_apply(&persistence_id, request)));
            }
        }
        let written = if writes.is_empty() {
            None
        } else {
            let (reply, answer) = oneshot::channel();
            let sent = self
                .requests
                .try_send(writer::WriterRequest::Replicas {
                    requests: writes,
                    reply,
                })
                .map_err(|e| match e {
                    TrySendError::Full(_) => Some(self.shared.config.write_queue_capacity),
                    TrySendError::Disconnected(_) => None,
                });
            Some((sent, answer))
        };
        async move {
            let mut written: Vec<Option<Result<Response<StoredEvent>, JournalError>>> =
                match written {
                    Some((sent, answer)) => {
                        // `Some(capacity)`: the queue was full; `None`: the journal closed.
                        let results = match sent {
                            Ok(()) => answer.await.map_err(|_| None),
                            Err(full) => Err(full),
                        };
                        match results {
                            Ok(results) => results.into_iter().map(Some).collect(),
                            Err(full) => write_places
                                .iter()
                                .map(|_| {
                                    Some(Err(match full {
                                        Some(capacity) => JournalError::QueueFull { capacity },
                                        None => JournalError::Closed,
                                    }))
                                })
                                .collect(),
                        }
                    }
                    None => Vec::new(),
                };
            let mut results = Vec::with_capacity(count);
            let mut next_write = 0;
            for answer in answers {
                match answer {
                    Some(read) => results.push(read.await),
                    None => {
                        let result = written
                            .get_mut(next_write)
                            .and_then(Option::take)
                            .unwrap_or_else(|| {
                                Err(JournalError::Storage(
                                    "a replica write was not answered".into(),
                                ))
                            });
                        next_write += 1;
                        results.push(result);
                    }
                }
            }
            results
        }
        .boxed()
    }

    /// Replicated logs this store holds, with their configuration, after the log `after`
    /// (in the store's order), at most `limit`.
    pub fn replica_logs(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<(String, ConfigAt)>, JournalError>> {
        let shared = self.shared.clone();
        blocking(move || replica::logs(&shared, after.as_deref(), limit))
    }

    /// Waits until RocksDB's background work is done: the memtables written so far are
    /// flushed and no compaction is pending or running (the journal's own deletions between
    /// groups are not waited for). For benchmarks, which compare reads of the same events on
    /// stores in the same state. Fails after [`SETTLE_TIMEOUT`].
    pub fn settle(&self) -> BoxFuture<'static, Result<(), JournalError>> {
        let shared = self.shared.clone();
        blocking(move || {
            let mut options = rocksdb::WaitForCompactOptions::default();
            options.set_flush(true);
            // Writes that go on could keep it waiting for ever.
            options.set_timeout(SETTLE_TIMEOUT.as_micros() as u64);
            shared.db.wait_for_compact(&options)?;
            Ok(())
        })
    }

    /// Finishes the writes queued so far, stops the writer and closes the journal. The
    /// database files are released once every stream reading from it has been dropped too.
    pub async fn close(self) {
        self.finish_writes().await;
    }

    /// Finishes the writes queued so far and stops the writer, for a journal still shared
    /// with tasks that have not let go of it yet: later writes fail with an error, and the
    /// database files are released once the last of them drops it.
    pub async fn finish_writes(&self) {
        let (reply, done) = oneshot::channel();
        // A full queue still gets the close request in: the blocking send waits (off the async
        // threads) for as long as the writes ahead of it take.
        let requests = self.requests.clone();
        let sent = tokio::task::spawn_blocking(move || {
            requests
                .send(writer::WriterRequest::Close { reply })
                .is_ok()
        })
        .await
        .unwrap_or(false);
        if sent {
            let _ = done.await;
        }
    }

    fn submit<T: Send + 'static>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, JournalError>>) -> writer::WriterRequest,
    ) -> BoxFuture<'static, Result<T, JournalError>> {
        let (reply, answer) = oneshot::channel();
        let sent = match self.requests.try_send(make(reply)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(JournalError::QueueFull {
                capacity: self.shared.config.write_queue_capacity,
            }),
            Err(TrySendError::Disconnected(_)) => Err(JournalError::Closed),
        };
        async move {
            sent?;
            answer.await.map_err(|_| JournalError::Closed)?
        }
        .boxed()
    }

    fn live(&self, mode: QueryMode) -> Option<watch::Receiver<u64>> {
        (mode == QueryMode::Live).then(|| self.commits.clone())
    }
}

/// Runs a read on the blocking pool.
fn blocking<T: Send + 'static>(
    read: impl FnOnce() -> Result<T, JournalError> + Send + 'static,
) -> BoxFuture<'static, Result<T, JournalError>> {
    async move {
        tokio::task::spawn_blocking(read)
            .await
            .map_err(|e| JournalError::Storage(format!("reader task failed: {e}")))?
    }
    .boxed()
}

/// Checks what can be checked without the log's state, so that a malformed write never takes
/// a place in the writer's queue.
///
/// Public for the replicated journal, which checks writes the same way before it sends them.
pub fn validate_write(write: &AtomicWrite, max_write_bytes: usize) -> Result<(), JournalError> {
    validate_name("persistence id", &write.persistence_id)?;
    validate_name("writer id", &write.writer_id)?;
    let Some(first) = write.events.first() else {
        return Err(JournalError::EmptyWrite {
            persistence_id: write.persistence_id.clone(),
        });
    };
    if first.sequence_nr == 0 {
        return Err(JournalError::SequenceMismatch {
            persistence_id: write.persistence_id.clone(),
            expected: 1,
            got: 0,
        });
    }
    for pair in write.events.windows(2) {
        if pair[0].sequence_nr.checked_add(1) != Some(pair[1].sequence_nr) {
            return Err(JournalError::NonConsecutive {
                persistence_id: write.persistence_id.clone(),
                previous: pair[0].sequence_nr,
                got: pair[1].sequence_nr,
            });
        }
    }
    for event in &write.events {
        if event.tags.len() > MAX_TAGS_PER_EVENT {
            return Err(JournalError::TooManyTags {
                persistence_id: write.persistence_id.clone(),
                sequence_nr: event.sequence_nr,
                count: event.tags.len(),
                limit: MAX_TAGS_PER_EVENT,
            });
        }
        for tag in &event.tags {
            validate_name("tag", tag)?;
        }
        // A manifest may be empty (an event without a type name), but not unbounded.
        let manifest = &event.manifest.type_name;
        if manifest.len() > MAX_NAME_BYTES {
            return Err(JournalError::InvalidName {
                what: "manifest",
                value: name_excerpt(manifest),
                reason: format!("is {} bytes, more than {MAX_NAME_BYTES}", manifest.len()),
            });
        }
    }
    let size_bytes = write.payload_bytes();
    if size_bytes > max_write_bytes {
        return Err(JournalError::WriteTooLarge {
            persistence_id: write.persistence_id.clone(),
            size_bytes,
            limit_bytes: max_write_bytes,
        });
    }
    Ok(())
}

fn failed_stream<T: Send + 'static>(e: JournalError) -> JournalStream<T> {
    futures::stream::once(async move { Err(e) }).boxed()
}

impl Journal for RocksJournal {
    fn append(&self, write: AtomicWrite) -> BoxFuture<'static, Result<(), JournalError>> {
        if let Err(e) = validate_write(&write, self.shared.config.max_write_bytes) {
            return futures::future::ready(Err(e)).boxed();
        }
        self.submit(|reply| writer::WriterRequest::Append { write, reply })
    }

    fn replay(
        &self,
        persistence_id: &str,
        from_sequence_nr: u64,
        to_sequence_nr: u64,
        max: u64,
    ) -> JournalStream<PersistentRepr> {
        if let Err(e) = validate_name("persistence id", persistence_id) {
            return failed_stream(e);
        }
        let cursor = reader::EventCursor::new(
            persistence_id,
            from_sequence_nr,
            to_sequence_nr,
            max,
            QueryMode::Current,
        );
        reader::stream(self.shared.clone(), cursor, None)
    }

    fn highest_sequence_nr(
        &self,
        persistence_id: &str,
    ) -> BoxFuture<'static, Result<u64, JournalError>> {
        if let Err(e) = validate_name("persistence id", persistence_id) {
            return futures::future::ready(Err(e)).boxed();
        }
        let shared = self.shared.clone();
        let persistence_id = persistence_id.to_string();
        async move {
            tokio::task::spawn_blocking(move || {
                Ok(reader::state_of(&shared, &persistence_id)?.highest)
            })
            .await
            .map_err(|e| JournalError::Storage(format!("reader task failed: {e}")))?
        }
        .boxed()
    }

    fn delete_to(
        &self,
        persistence_id: &str,
        to_sequence_nr: u64,
    ) -> BoxFuture<'static, Result<(), JournalError>> {
        if let Err(e) = validate_name("persistence id", persistence_id) {
            return futures::future::ready(Err(e)).boxed();
        }
        let persistence_id = persistence_id.to_string();
        self.submit(|reply| writer::WriterRequest::DeleteTo {
            persistence_id,
            to_sequence_nr,
            reply,
        })
    }

    fn events_by_persistence_id(
        &self,
        persistence_id: &str,
        from_sequence_nr: u64,
        mode: QueryMode,
    ) -> JournalStream<PersistentRepr> {
        if let Err(e) = validate_name("persistence id", persistence_id) {
            return failed_stream(e);
        }
        let cursor =
            reader::EventCursor::new(persistence_id, from_sequence_nr, u64::MAX, u64::MAX, mode);
        reader::stream(self.shared.clone(), cursor, self.live(mode))
    }

    fn events_by_tag(
        &self,
        tag: &str,
        after_offset: u64,
        mode: QueryMode,
    ) -> JournalStream<EventEnvelope> {
        if let Err(e) = validate_name("tag", tag) {
            return failed_stream(e);
        }
        let cursor = reader::TagCursor::new(tag, after_offset);
        reader::stream(self.shared.clone(), cursor, self.live(mode))
    }

    fn persistence_ids(&self, mode: QueryMode) -> JournalStream<String> {
        reader::stream(
            self.shared.clone(),
            reader::PersistenceIdCursor::default(),
            self.live(mode),
        )
    }
}
