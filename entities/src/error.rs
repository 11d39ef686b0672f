//! What a caller of an entity can get back instead of a reply.

use std::time::Duration;
use tessera_journal::Manifest;

/// Why a command got no reply from the entity's handler. Cloneable: one failure (a recovery
/// that failed) reaches every caller that was waiting for it.
///
/// `entity` fields hold the persistence id (`account|alice`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntityError {
    /// The entity id is empty, too long or contains control characters.
    #[error("invalid entity id {id:?}: {reason}")]
    InvalidId { id: String, reason: String },
    /// The host partition's queue is full. Nothing was delivered; retry later.
    #[error(
        "the entity host is overloaded ({capacity} commands queued for {entity}'s partition); retry later"
    )]
    HostBusy { entity: String, capacity: usize },
    /// The entity's mailbox is full. Nothing was delivered; retry later.
    #[error("the mailbox of {entity} is full ({capacity} commands waiting); retry later")]
    MailboxFull { entity: String, capacity: usize },
    /// The entity is recovering or persisting and its stash of waiting commands is full.
    /// Nothing was done; retry later.
    #[error(
        "the stash of {entity} is full ({capacity} commands waiting for recovery or a write \
         to finish); retry later"
    )]
    StashFull { entity: String, capacity: usize },
    /// The journal's write queue was full: nothing was written, the entity carries on.
    /// Retry later.
    #[error(
        "the journal is overloaded ({capacity} writes queued); {entity} wrote nothing, retry later"
    )]
    JournalBusy { entity: String, capacity: usize },
    /// No reply within the ask timeout. The command may still be carried out (outcome
    /// unknown).
    #[error("{entity} did not reply within {timeout:?}; the command may still take effect")]
    Timeout { entity: String, timeout: Duration },
    /// The entity could not rebuild its state (journal or snapshot store error, corrupt or
    /// unknown data, its log unavailable). Nothing was done; it stopped, and the next command
    /// tries again.
    #[error("recovery of {entity} failed: {reason}")]
    RecoveryFailed { entity: String, reason: String },
    /// Storing the command's events failed and whether they were stored is unknown: they may
    /// appear later. The entity stopped; commands queued behind this one go to its next
    /// incarnation, which recovers from the store.
    #[error(
        "the outcome of the command to {entity} is unknown: {reason}; its events may or may \
         not have been stored, and the entity stopped"
    )]
    PersistFailed { entity: String, reason: String },
    /// The journal refused the command's events before storing anything (another node took
    /// the entity's log over, or too few replicas were reachable): nothing was stored, and
    /// nothing will be. The entity stopped, since its state may be stale; commands queued
    /// behind this one go to its next incarnation. Retry.
    #[error("{entity} stored nothing: {reason}; retry")]
    PersistNotApplied { entity: String, reason: String },
    /// The command's answer was computed from the entity's state, but the entity could not
    /// confirm that state is current (another node may have taken it over): the answer was
    /// withheld and nothing was stored. The entity stopped; retry.
    #[error("{entity} could not confirm its state is current: {reason}; nothing was done, retry")]
    NotConfirmed { entity: String, reason: String },
    /// An event produced by the command could not be encoded; nothing was persisted.
    #[error("cannot encode an event of {entity}: {reason}")]
    Encode { entity: String, reason: String },
    /// The entity stopped before handling the command (the host shut down, or a handler
    /// panicked on it): nothing of it was stored.
    #[error("{entity} stopped before replying")]
    Stopped { entity: String },
    /// The host is shutting down and takes no more commands.
    #[error("the entity host is shutting down")]
    ShuttingDown,
}

impl EntityError {
    /// True for the errors that mean "busy, try again": full queues and the ask timeout.
    pub fn is_overload(&self) -> bool {
        matches!(
            self,
            EntityError::HostBusy { .. }
                | EntityError::MailboxFull { .. }
                | EntityError::StashFull { .. }
                | EntityError::JournalBusy { .. }
                | EntityError::Timeout { .. }
        )
    }
}

/// The outcome of an ask that did not produce a reply: the entity's own rejection, or a
/// runtime error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AskError<R> {
    /// The command handler refused the command; nothing was persisted.
    #[error("{0}")]
    Rejected(R),
    /// The runtime could not get a reply from the handler.
    #[error(transparent)]
    Entity(#[from] EntityError),
}

/// An event or state that cannot be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// No decoder for this manifest: written by another entity type or a newer release, or an
    /// old version nobody taught the upcaster.
    #[error(
        "unknown manifest {found_type}@{found_version}: this release reads \
         {expected_type}@{expected_version} and whatever the upcaster knows"
    )]
    UnknownManifest {
        found_type: String,
        found_version: u32,
        expected_type: String,
        expected_version: u32,
    },
    /// The payload does not decode as the manifest's type.
    #[error("cannot decode {manifest_type}@{manifest_version}: {reason}")]
    Decode {
        manifest_type: String,
        manifest_version: u32,
        reason: String,
    },
    /// A value could not be encoded (e.g. a type postcard does not support).
    #[error("cannot encode {manifest_type}: {reason}")]
    Encode {
        manifest_type: String,
        reason: String,
    },
}

impl CodecError {
    /// The error for a manifest nobody can decode; upcasters return it for versions they do
    /// not know.
    pub fn unknown_manifest(found: &Manifest, expected_type: &str, expected_version: u32) -> Self {
        CodecError::UnknownManifest {
            found_type: found.type_name.to_string(),
            found_version: found.version,
            expected_type: expected_type.to_string(),
            expected_version,
        }
    }
}
