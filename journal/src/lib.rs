//! tessera-journal: the event journal under event-sourced entities.
//!
//! [`Journal`] is what entities and queries use: atomic appends that continue a log, replay,
//! the highest sequence number, delete-to, events by tag with a resumable offset, persistence
//! ids, and live variants of the queries. [`RocksJournal`] implements it on RocksDB with one
//! group-committing writer thread; the quorum-replicated journal will implement it too.
//!
//! Every record carries a format version and a checksum that binds its key, verified on read
//! ([`storage`]): xxh3 for the records this release writes, keyed BLAKE3 for those of
//! earlier releases, which stay readable. A store written by a newer release is refused at
//! open.

mod by_slice;
mod config;
mod entry;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod journal;
mod memory;
mod record;
mod rocks;
pub mod slice;

pub use by_slice::{SliceEnvelope, SliceItem, SliceOffset};
pub use config::JournalConfig;
pub use entry::StoredEvent;
pub use error::{JournalError, MAX_TAGS_PER_EVENT};
pub use journal::{Journal, JournalStream, QueryMode};
pub use memory::MemoryJournal;
pub use record::{AtomicWrite, EventEnvelope, NewEvent, PersistentRepr, RECORD_FORMAT_VERSION};
pub use rocks::{RocksJournal, STORE_FORMAT_VERSION, event_key, rocksdb_options, validate_write};
/// The string type of the names in [`PersistentRepr`] and [`Manifest`].
pub use smol_str::SmolStr;
/// The storage building blocks the journal is made of (sealed records, the store-format
/// check), from `tessera-storage`: here so that a user of the journal can match a
/// [`JournalError::StoreFormat`] without a dependency of its own.
pub use tessera_storage as storage;
/// Shared with the snapshot store: the durability of writes, a payload's type and version,
/// and the rule for names.
pub use tessera_storage::{FsyncPolicy, MAX_NAME_BYTES, Manifest, name_excerpt, name_problem};
