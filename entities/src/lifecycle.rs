//! What an [`EntityHost`](crate::EntityHost) tells its owner about the incarnations it starts
//! and stops, for remember-entities: an entity that *passivated* is forgotten, one that was
//! *asked to stop* (a handoff, a shutdown) or *failed* is remembered and started again.

use crate::id::EntityId;
use std::sync::Arc;

/// Why an incarnation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// It received no command for `passivate_after` (passivation).
    IdleTimeout,
    /// It was the least recently used live entity of its partition when starting another would
    /// have exceeded `active_entity_limit` (passivation).
    Evicted,
    /// Its command handler returned a stop effect (passivation, asked for by the entity).
    StopEffect,
    /// Recovery, a write or a read confirmation failed, or a handler panicked. The entity did
    /// not ask to stop; its next command recovers it.
    Failed,
    /// [`EntityHost::stop_entities`](crate::EntityHost::stop_entities) asked it to stop.
    StopRequested,
    /// The host shut down (or was dropped).
    HostShutdown,
}

impl StopReason {
    /// True for the passivations (idle timeout, eviction, stop effect): the entity is done for
    /// now and remember-entities forgets it. False when it was stopped from outside or failed.
    pub fn is_passivation(self) -> bool {
        matches!(
            self,
            StopReason::IdleTimeout | StopReason::Evicted | StopReason::StopEffect
        )
    }
}

/// One event in the life of an entity on a host. The events of one id arrive in the order they
/// happened (one partition task sends them all); those of different ids are not ordered with
/// each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntityLifecycle {
    /// An incarnation of `id` started: on its first command, or to handle the commands that
    /// arrived while its previous incarnation stopped (right after that one's `Stopped`).
    Started { id: EntityId },
    /// The incarnation of `id` has stopped: its writes are finished and nothing of it runs.
    Stopped { id: EntityId, reason: StopReason },
}

/// Called by a host's partition tasks, on the task, for every [`EntityLifecycle`] event.
///
/// It must return at once: it must not block, await or panic, since the partition routes the
/// commands of its entities meanwhile. The host keeps no queue of events of its own, so the
/// owner chooses what a backlog means: for example `try_send` into its own bounded channel and,
/// when that is full, count the loss and later resynchronise from
/// [`EntityHost::live_entity_ids`](crate::EntityHost::live_entity_ids), or fold the events
/// into a set of ids under a short lock.
pub type LifecycleListener = Arc<dyn Fn(EntityLifecycle) + Send + Sync>;
