//! tessera-snapshot: snapshots of event-sourced entities' state, so that recovery replays only
//! the events after the latest snapshot.
//!
//! [`SnapshotStore`] is the interface (save, load the latest matching criteria, delete one or
//! by criteria); [`RocksSnapshotStore`] implements it on RocksDB with versioned, checksummed
//! records. The quorum-replicated store will implement the same trait.

mod error;
#[doc(hidden)]
pub mod fuzzing;
mod memory;
mod rocks;
mod store;

pub use error::SnapshotError;
pub use memory::MemorySnapshotStore;
pub use rocks::{RocksSnapshotStore, STORE_FORMAT_VERSION, SnapshotConfig};
pub use store::{Snapshot, SnapshotMetadata, SnapshotSelectionCriteria, SnapshotStore};
pub use tessera_storage::{FsyncPolicy, Manifest, StoreFormatError};
