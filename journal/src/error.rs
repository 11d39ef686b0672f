//! The journal's typed errors. Every message names the persistence id, sequence number or
//! value at fault and what was expected.

use tessera_storage::{StoreFormatError, name_excerpt, name_problem};

/// What can go wrong with a journal operation.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The write does not continue the log: a gap, or a sequence number already used.
    #[error(
        "append to {persistence_id} must continue its log at sequence number {expected}, \
         got {got}"
    )]
    SequenceMismatch {
        persistence_id: String,
        expected: u64,
        got: u64,
    },
    /// The write's events are not consecutive.
    #[error(
        "events of one write to {persistence_id} must have consecutive sequence numbers: \
         {previous} is followed by {got}"
    )]
    NonConsecutive {
        persistence_id: String,
        previous: u64,
        got: u64,
    },
    /// The write has no events.
    #[error("a write to {persistence_id} must contain at least one event")]
    EmptyWrite { persistence_id: String },
    /// A persistence id, writer id or tag is empty or too long.
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidName {
        what: &'static str,
        value: String,
        reason: String,
    },
    /// An event carries more tags than the journal accepts.
    #[error(
        "event {persistence_id}#{sequence_nr} has {count} tags, more than the limit of {limit}"
    )]
    TooManyTags {
        persistence_id: String,
        sequence_nr: u64,
        count: usize,
        limit: usize,
    },
    /// The write is larger than the journal accepts in one piece.
    #[error(
        "write to {persistence_id} of {size_bytes} bytes exceeds the limit of {limit_bytes} bytes"
    )]
    WriteTooLarge {
        persistence_id: String,
        size_bytes: usize,
        limit_bytes: usize,
    },
    /// The writer's queue is full: the caller should back off and retry. Nothing was written.
    #[error("the journal's write queue is full ({capacity} writes waiting); retry later")]
    QueueFull { capacity: usize },
    /// A stored record failed its checksum or could not be decoded.
    #[error("corrupt record {persistence_id}#{sequence_nr}: {detail}")]
    Corrupt {
        persistence_id: String,
        sequence_nr: u64,
        detail: String,
    },
    /// A stored record was written by a newer release in a format this one cannot read.
    #[error(
        "record {persistence_id}#{sequence_nr} has format version {found}, newer than the \
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
    /// The journal's own metadata is inconsistent (a bug or an altered file).
    #[error("corrupt journal metadata: {0}")]
    CorruptMetadata(String),
    /// The journal configuration is invalid.
    #[error("invalid journal configuration: {0}")]
    InvalidConfig(String),
    /// RocksDB reported an error.
    #[error("storage error: {0}")]
    Storage(String),
    /// The journal was closed.
    #[error("the journal is closed")]
    Closed,
    /// A replicated log could not be served: too few of its replicas answered, or it could
    /// not be found or created. Nothing of the operation was written; retry later.
    #[error("the log {persistence_id} is unavailable: {reason}; nothing was written")]
    Unavailable {
        persistence_id: String,
        reason: String,
    },
    /// Another writer (on another node, or a later activation) took the replicated log over
    /// before this operation was sent. Nothing of it was written.
    #[error(
        "the log {persistence_id} was taken over by another writer: {reason}; nothing was written"
    )]
    Fenced {
        persistence_id: String,
        reason: String,
    },
    /// A write to a replicated log was sent but not acknowledged: it may or may not be
    /// stored, and appear in later replays. The writer gave the log up; the next recovery
    /// tells.
    #[error("the outcome of a write to {persistence_id} is unknown: {reason}")]
    OutcomeUnknown {
        persistence_id: String,
        reason: String,
    },
}

impl JournalError {
    /// Whether the operation certainly did not take effect (nothing of it can appear later).
    /// False only for [`JournalError::OutcomeUnknown`] and storage failures of an append.
    pub fn is_not_applied(&self) -> bool {
        !matches!(
            self,
            JournalError::OutcomeUnknown { .. } | JournalError::Storage(_)
        )
    }
}

impl From<rocksdb::Error> for JournalError {
    fn from(e: rocksdb::Error) -> Self {
        JournalError::Storage(e.to_string())
    }
}

/// Most tags one event may carry.
pub const MAX_TAGS_PER_EVENT: usize = 256;

/// Checks a persistence id, writer id or tag.
pub(crate) fn validate_name(what: &'static str, value: &str) -> Result<(), JournalError> {
    match name_problem(value) {
        None => Ok(()),
        Some(reason) => Err(JournalError::InvalidName {
            what,
            value: name_excerpt(value),
            reason,
        }),
    }
}
