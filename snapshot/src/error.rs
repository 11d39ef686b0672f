//! The snapshot store's typed errors.

use tessera_storage::{StoreFormatError, name_excerpt, name_problem};

/// What can go wrong with a snapshot operation.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// A persistence id is empty or too long.
    #[error("invalid persistence id {value:?}: {reason}")]
    InvalidPersistenceId { value: String, reason: String },
    /// A stored snapshot failed its checksum or could not be decoded.
    #[error("corrupt snapshot {persistence_id}#{sequence_nr}: {detail}")]
    Corrupt {
        persistence_id: String,
        sequence_nr: u64,
        detail: String,
    },
    /// A stored snapshot was written by a newer release in a format this one cannot read.
    #[error(
        "snapshot {persistence_id}#{sequence_nr} has format version {found}, newer than the \
         supported version {supported}"
    )]
    NewerRecordVersion {
        persistence_id: String,
        sequence_nr: u64,
        found: u8,
        supported: u8,
    },
    /// The store cannot be opened with this release's format.
    #[error(transparent)]
    StoreFormat(#[from] StoreFormatError),
    /// RocksDB reported an error.
    #[error("storage error: {0}")]
    Storage(String),
    /// A replicated snapshot store could not reach enough replicas of the log, or this node
    /// no longer writes it. Nothing was saved or deleted.
    #[error("snapshots of {persistence_id} are unavailable: {reason}")]
    Unavailable {
        persistence_id: String,
        reason: String,
    },
}

impl From<rocksdb::Error> for SnapshotError {
    fn from(e: rocksdb::Error) -> Self {
        SnapshotError::Storage(e.to_string())
    }
}

pub(crate) fn validate_persistence_id(value: &str) -> Result<(), SnapshotError> {
    match name_problem(value) {
        None => Ok(()),
        Some(reason) => Err(SnapshotError::InvalidPersistenceId {
            value: name_excerpt(value),
            reason,
        }),
    }
}
