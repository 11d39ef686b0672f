//! An [`EntityHost`] as a [`ShardHost`]: the one place where a sharded command meets its Rust
//! type again. A local command is taken back as the type it is; one from another node is
//! decoded from postcard here, and its answer encoded here, once.

use crate::host::{AskFailure, AskOutcome, FailureKind, Payload, ShardHost};
use futures::FutureExt;
use futures::future::BoxFuture;
use tessera_entities::{AskError, EntityError, EntityHost, EntityId, EntityType};

/// What an entity answers a command it handled: its reply, or its rejection.
pub type EntityAnswer<E> = Result<<E as EntityType>::Reply, <E as EntityType>::Rejection>;

/// What kind of failure an entity error is and whether its command took effect, as a caller
/// anywhere in the cluster learns it.
pub fn failure_of(error: &EntityError) -> AskFailure {
    use AskOutcome::{NotApplied, Unknown};
    let (kind, outcome) = match error {
        EntityError::InvalidId { .. } => (FailureKind::BadRequest, NotApplied),
        EntityError::Timeout { .. } | EntityError::PersistFailed { .. } => {
            (FailureKind::Timeout, Unknown)
        }
        EntityError::HostBusy { .. }
        | EntityError::MailboxFull { .. }
        | EntityError::StashFull { .. }
        | EntityError::JournalBusy { .. } => (FailureKind::Overloaded, NotApplied),
        EntityError::ShuttingDown
        | EntityError::RecoveryFailed { .. }
        | EntityError::PersistNotApplied { .. }
        | EntityError::NotConfirmed { .. }
        | EntityError::Stopped { .. } => (FailureKind::Unavailable, NotApplied),
        EntityError::Encode { .. } => (FailureKind::Internal, NotApplied),
    };
    AskFailure::new(kind, outcome, error.to_string())
}

/// Encodes an entity's answer for the node of its caller. A reply that cannot be encoded was
/// applied; a rejection, not.
fn encode_answer<E: EntityType>(answer: &EntityAnswer<E>) -> Result<Vec<u8>, AskFailure> {
    postcard::to_allocvec(answer).map_err(|e| {
        let (outcome, what) = match answer {
            Ok(_) => (AskOutcome::Applied, "reply"),
            Err(_) => (AskOutcome::NotApplied, "rejection"),
        };
        AskFailure::new(
            FailureKind::Internal,
            outcome,
            format!(
                "the {what} of a {} entity cannot be encoded in postcard: {e}",
                E::TYPE_NAME
            ),
        )
    })
}

impl<E: EntityType> ShardHost for EntityHost<E> {
    fn ask(
        &self,
        entity_id: &str,
        command: Payload,
    ) -> BoxFuture<'static, Result<Payload, AskFailure>> {
        let encoded = command.is_encoded();
        let command: E::Command = match command.into_typed() {
            Ok(command) => command,
            Err(error) => {
                let failure = AskFailure::new(
                    FailureKind::BadRequest,
                    AskOutcome::NotApplied,
                    format!(
                        "not a command of entity type {} (message version {}): {error}",
                        E::TYPE_NAME,
                        E::MESSAGE_VERSION
                    ),
                );
                return futures::future::ready(Err(failure)).boxed();
            }
        };
        let entity = match self.entity_ref(entity_id) {
            Ok(entity) => entity,
            Err(error) => return futures::future::ready(Err(failure_of(&error))).boxed(),
        };
        // Queued now, before the future is polled (the entity ref queues at once).
        let reply = entity.ask(command);
        async move {
            let answer: EntityAnswer<E> = match reply.await {
                Ok(reply) => Ok(reply),
                Err(AskError::Rejected(rejection)) => Err(rejection),
                Err(AskError::Entity(error)) => return Err(failure_of(&error)),
            };
            if encoded {
                encode_answer::<E>(&answer).map(Payload::Encoded)
            } else {
                Ok(Payload::local(answer))
            }
        }
        .boxed()
    }

    fn stop_entities(&self, entity_ids: Vec<String>) -> BoxFuture<'static, ()> {
        // Ids come from this host's own deliveries and listings; one that is not an entity id
        // cannot be running.
        let ids: Vec<EntityId> = entity_ids
            .iter()
            .filter_map(|id| EntityId::new(id).ok())
            .collect();
        EntityHost::stop_entities(self, ids).boxed()
    }

    fn live_entity_ids(&self) -> BoxFuture<'static, Vec<String>> {
        let ids = EntityHost::live_entity_ids(self);
        async move {
            ids.await
                .into_iter()
                .map(|id| id.as_str().to_string())
                .collect()
        }
        .boxed()
    }

    fn start_entities(&self, entity_ids: Vec<String>) -> Vec<String> {
        let ids: Vec<EntityId> = entity_ids
            .iter()
            .filter_map(|id| EntityId::new(id).ok())
            .collect();
        let skipped = EntityHost::start_entities(self, ids);
        if !skipped.is_empty() {
            tracing::debug!(
                count = skipped.len(),
                "remembered entities not started (queues full); offered again later"
            );
        }
        skipped.iter().map(|id| id.as_str().to_string()).collect()
    }
}
