//! What a region needs of the entities of its type on this node: a byte-level face of an
//! entity host, so the sharding runtime moves commands without knowing their Rust types.

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

/// Whether a command that got no reply took effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AskOutcome {
    /// Not applied, and it never will be.
    NotApplied,
    /// Maybe applied: its events may or may not appear.
    Unknown,
    /// Applied, but the reply could not be given.
    Applied,
}

impl AskOutcome {
    /// The name the HTTP API uses (`not_applied`, `unknown`, `applied`).
    pub fn as_str(self) -> &'static str {
        match self {
            AskOutcome::NotApplied => "not_applied",
            AskOutcome::Unknown => "unknown",
            AskOutcome::Applied => "applied",
        }
    }
}

/// What kind of failure, for the caller to map (the HTTP API maps it to a status).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureKind {
    /// The command or id is malformed, or the type unknown.
    BadRequest,
    /// The entity refused the command.
    Rejected,
    /// The entity, its log or the shard's home is unavailable now.
    Unavailable,
    /// A queue or buffer is full.
    Overloaded,
    /// No reply in time.
    Timeout,
    /// A bug (e.g. a reply that cannot be encoded).
    Internal,
}

/// Why an ask got no reply: its kind, whether it took effect, and a message naming the
/// problem. It travels between nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct AskFailure {
    pub kind: FailureKind,
    pub outcome: AskOutcome,
    pub message: String,
}

impl AskFailure {
    pub fn new(kind: FailureKind, outcome: AskOutcome, message: impl Into<String>) -> Self {
        AskFailure {
            kind,
            outcome,
            message: message.into(),
        }
    }
}

/// The entities of one type on this node, as the sharding runtime uses them.
pub trait ShardHost: Send + Sync + 'static {
    /// Sends the encoded command to entity `entity_id`. The command must be queued when this
    /// is called, not when the future is first polled: the region relies on it to keep each
    /// sender's order and to stop a shard only after what it delivered.
    fn ask(
        &self,
        entity_id: &str,
        payload: Vec<u8>,
    ) -> BoxFuture<'static, Result<Vec<u8>, AskFailure>>;

    /// Stops the given entities after they finish what they accepted (their writes
    /// included); resolves once all have stopped. Requests queue behind commands already
    /// sent with [`ShardHost::ask`].
    fn stop_entities(&self, entity_ids: Vec<String>) -> BoxFuture<'static, ()>;

    /// The ids of the entities running now.
    fn live_entity_ids(&self) -> BoxFuture<'static, Vec<String>>;

    /// Starts the given entities without a command (they recover and wait): a shard's
    /// remembered entities, wherever the shard lands. Returns the ids it could not take now
    /// (a full queue); the region offers them again on a later tick.
    fn start_entities(&self, entity_ids: Vec<String>) -> Vec<String>;
}

/// What a host tells the region about its entities, for remember-entities: an entity started,
/// or passivated (stopped by itself or for being idle, so it is forgotten). Entities stopped by
/// a handoff or a shutdown are not reported as passivated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntityNote {
    Started(String),
    Passivated(String),
}
