//! What a region needs of the entities of its type on this node: the one type-erased face of
//! an entity host, so that the sharding runtime moves commands without knowing their Rust
//! types.
//!
//! A command keeps its Rust type for as long as it stays on the node of its caller
//! ([`Payload::Local`]) and is encoded in postcard only when it leaves for another node
//! ([`Payload::Encoded`]); the entity's answer (its reply, or its rejection) comes back the
//! same way. So a command asked where its entity runs is never encoded, and one asked
//! elsewhere is encoded once each way.

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::any::Any;

/// A typed value on its way through the sharding runtime of its own node: it can be
/// encoded, should it have to leave the node, and taken back as the type it is.
pub trait LocalMessage: Any + Send {
    /// The value in postcard, for another node.
    fn encode(&self) -> Result<Vec<u8>, String>;
}

/// A typed value as a [`LocalMessage`].
pub struct Typed<T>(pub T);

impl<T: Serialize + Send + 'static> LocalMessage for Typed<T> {
    fn encode(&self) -> Result<Vec<u8>, String> {
        postcard::to_allocvec(&self.0).map_err(|e| e.to_string())
    }
}

/// A command or an answer as the sharding runtime carries it: the caller's typed value while
/// it stays on the caller's node, postcard bytes once it crossed nodes.
pub enum Payload {
    /// From this node: typed, not encoded.
    Local(Box<dyn LocalMessage>),
    /// From another node (or a caller that holds only bytes): postcard under the type's
    /// message version.
    Encoded(Vec<u8>),
}

impl Payload {
    /// A typed value, not encoded.
    pub fn local<T: Serialize + Send + 'static>(value: T) -> Self {
        Payload::Local(Box::new(Typed(value)))
    }

    /// The payload as bytes for another node: encodes a local value (the one place a command
    /// or an answer is encoded).
    pub fn into_bytes(self) -> Result<Vec<u8>, String> {
        match self {
            Payload::Local(message) => message.encode(),
            Payload::Encoded(bytes) => Ok(bytes),
        }
    }

    /// The value as `T`: taken back when local, decoded from postcard when encoded. The error
    /// says which of the two failed.
    pub fn into_typed<T: serde::de::DeserializeOwned + 'static>(self) -> Result<T, String> {
        match self {
            Payload::Local(message) => {
                let any: Box<dyn Any> = message;
                any.downcast::<Typed<T>>()
                    .map(|typed| typed.0)
                    .map_err(|_| format!("a local value is not a {}", std::any::type_name::<T>()))
            }
            // Every byte must be the value's: bytes left over mean another shape of it (a
            // field dropped without a new message version), which must not pass for this one.
            Payload::Encoded(bytes) => match postcard::take_from_bytes(&bytes) {
                Ok((value, [])) => Ok(value),
                Ok((_, rest)) => Err(format!(
                    "{} bytes left over after a {}",
                    rest.len(),
                    std::any::type_name::<T>()
                )),
                Err(e) => Err(e.to_string()),
            },
        }
    }

    /// Whether this is postcard bytes (it came from another node).
    pub fn is_encoded(&self) -> bool {
        matches!(self, Payload::Encoded(_))
    }
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Payload::Local(_) => f.write_str("Payload::Local"),
            Payload::Encoded(bytes) => write!(f, "Payload::Encoded({} bytes)", bytes.len()),
        }
    }
}

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
    /// The command or id is malformed, or the type unknown. (An entity's own refusal of a
    /// command is not a failure: it is its answer, the type's rejection.)
    BadRequest,
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
    /// Sends `command` to entity `entity_id`; resolves with the entity's answer (its reply or
    /// its rejection), local when the command was local and encoded when it was encoded, or
    /// with why there is none. The command must be queued when this is called, not when the
    /// future is first polled: the region relies on it to keep each sender's order and to
    /// stop a shard only after what it delivered.
    fn ask(
        &self,
        entity_id: &str,
        command: Payload,
    ) -> BoxFuture<'static, Result<Payload, AskFailure>>;

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
