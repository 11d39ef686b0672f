//! A projection's handler, as the instance calls it, and why it failed.

use crate::envelope::Envelope;
use crate::exactly_once::{ExactlyOnceStore, OffsetCommit};
use futures::future::BoxFuture;
use std::fmt;
use std::sync::Arc;
use tessera_entities::EntityType;

/// Why a handler did not handle its envelopes. Any error converts into it (`?` works in a
/// handler); [`HandlerError::new`] makes one from a message.
pub struct HandlerError {
    message: String,
}

impl HandlerError {
    pub fn new(message: impl Into<String>) -> Self {
        HandlerError {
            message: message.into(),
        }
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

impl<T: std::error::Error + Send + Sync + 'static> From<T> for HandlerError {
    fn from(error: T) -> Self {
        HandlerError::new(error.to_string())
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HandlerError({:?})", self.message)
    }
}

/// A handler of one envelope at a time.
pub type OneHandler<E> =
    Arc<dyn Fn(Envelope<E>) -> BoxFuture<'static, Result<(), HandlerError>> + Send + Sync>;

/// A handler of groups of envelopes, all or nothing: after an error the whole group is
/// offered again (decoded anew).
pub type GroupHandler<E> =
    Arc<dyn Fn(Vec<Envelope<E>>) -> BoxFuture<'static, Result<(), HandlerError>> + Send + Sync>;

/// An exactly-once handler: a group of envelopes and the offset to commit with its effect.
pub type CommitHandler<E> = Arc<
    dyn Fn(Vec<Envelope<E>>, OffsetCommit) -> BoxFuture<'static, Result<(), HandlerError>>
        + Send
        + Sync,
>;

/// How a projection hands its envelopes to user code.
pub enum Handling<E: EntityType> {
    /// Exactly-once: offsets in the handler's store, committed by the handler.
    Exactly {
        max: usize,
        handler: CommitHandler<E>,
        store: Arc<dyn ExactlyOnceStore>,
    },
    One(OneHandler<E>),
    Group {
        /// At most this many envelopes per group (those ready when the handler is free).
        max: usize,
        handler: GroupHandler<E>,
    },
}

impl<E: EntityType> Clone for Handling<E> {
    fn clone(&self) -> Self {
        match self {
            Handling::One(handler) => Handling::One(handler.clone()),
            Handling::Group { max, handler } => Handling::Group {
                max: *max,
                handler: handler.clone(),
            },
            Handling::Exactly {
                max,
                handler,
                store,
            } => Handling::Exactly {
                max: *max,
                handler: handler.clone(),
                store: store.clone(),
            },
        }
    }
}
