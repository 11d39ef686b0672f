//! The [`Journal`] trait: what an event-sourced entity and a query need from an event store.
//! The RocksDB store implements it now; the quorum-replicated journal will implement it too.

use crate::error::JournalError;
use crate::record::{AtomicWrite, EventEnvelope, PersistentRepr};
use futures::future::BoxFuture;
use futures::stream::BoxStream;

/// A stream of journal items; an error ends the stream.
pub type JournalStream<T> = BoxStream<'static, Result<T, JournalError>>;

/// Whether a query ends at the events stored when it reaches them (`Current`) or keeps
/// streaming events written later (`Live`, ended by dropping the stream or closing the
/// journal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryMode {
    /// Stream what is stored, then end.
    Current,
    /// Stream what is stored, then every new event as it is committed.
    Live,
}

/// An append-only event log per persistence id, with tag and persistence-id queries.
///
/// Futures and streams own what they need (`'static`), so callers can hold them across awaits
/// and spawn them; trait objects (`Arc<dyn Journal>`) work.
pub trait Journal: Send + Sync + 'static {
    /// Appends the write's events atomically: all are stored or none. The first sequence
    /// number must be the log's highest plus one. Resolves once the events are durable under
    /// the journal's fsync policy.
    fn append(&self, write: AtomicWrite) -> BoxFuture<'static, Result<(), JournalError>>;

    /// Replays events `from_sequence_nr..=to_sequence_nr` of a log, at most `max` of them, in
    /// order. Deleted events are skipped.
    fn replay(
        &self,
        persistence_id: &str,
        from_sequence_nr: u64,
        to_sequence_nr: u64,
        max: u64,
    ) -> JournalStream<PersistentRepr>;

    /// The highest sequence number ever written to a log (0 for a new log). Never decreases,
    /// also not after [`Journal::delete_to`].
    fn highest_sequence_nr(
        &self,
        persistence_id: &str,
    ) -> BoxFuture<'static, Result<u64, JournalError>>;

    /// Deletes the events of a log up to and including `to_sequence_nr` (capped at the
    /// highest). Resolves once the deletion is durable; the space is reclaimed afterwards.
    fn delete_to(
        &self,
        persistence_id: &str,
        to_sequence_nr: u64,
    ) -> BoxFuture<'static, Result<(), JournalError>>;

    /// Events of a log from `from_sequence_nr` on, in order.
    fn events_by_persistence_id(
        &self,
        persistence_id: &str,
        from_sequence_nr: u64,
        mode: QueryMode,
    ) -> JournalStream<PersistentRepr>;

    /// Events carrying `tag` with an offset above `after_offset` (0: from the start), in
    /// offset order, which is the order in which they were committed.
    fn events_by_tag(
        &self,
        tag: &str,
        after_offset: u64,
        mode: QueryMode,
    ) -> JournalStream<EventEnvelope>;

    /// Every persistence id that has events or had them, in the order of their first write.
    fn persistence_ids(&self, mode: QueryMode) -> JournalStream<String>;

    /// Whether a reply computed from a log's events up to `highest` needs
    /// [`Journal::confirm_writer`] first: true for a journal whose logs another node may take
    /// over (the replicated journal), false for one that only this process writes.
    fn confirms_reads(&self) -> bool {
        false
    }

    /// Confirms that this process still writes the log and that it ends at `highest`, so
    /// that state folded from its events up to `highest` is current: once it resolves `Ok`,
    /// no other writer had taken the log over when it was called. `Err` (typically
    /// [`JournalError::Fenced`]) means the state may be stale. A journal that only this
    /// process writes confirms at once.
    fn confirm_writer(
        &self,
        _persistence_id: &str,
        _highest: u64,
    ) -> BoxFuture<'static, Result<(), JournalError>> {
        Box::pin(futures::future::ready(Ok(())))
    }
}
