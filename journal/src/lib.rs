//! tessera-journal: the event journal under event-sourced entities.
//!
//! [`Journal`] is what entities and queries use: atomic appends that continue a log, replay,
//! the highest sequence number, delete-to, events by tag with a resumable offset, persistence
//! ids, and live variants of the queries. [`RocksJournal`] implements it on RocksDB with one
//! group-committing writer thread; the quorum-replicated journal will implement it too.
//!
//! Every record carries a format version and a blake3 checksum verified on read
//! ([`storage`]); a store written by a newer release is refused at open.

mod config;
mod error;
mod journal;
mod multihash;
mod record;
mod rocks;
pub mod storage;

pub use config::{FsyncPolicy, JournalConfig};
pub use error::{JournalError, MAX_NAME_BYTES, MAX_TAGS_PER_EVENT, name_excerpt, name_problem};
pub use journal::{Journal, JournalStream, QueryMode};
pub use record::{
    AtomicWrite, EventEnvelope, Manifest, NewEvent, PersistentRepr, RECORD_FORMAT_VERSION,
};
pub use rocks::{RocksJournal, STORE_FORMAT_VERSION, event_key, rocksdb_options, validate_write};
/// The string type of the names in [`PersistentRepr`] and [`Manifest`].
pub use smol_str::SmolStr;
