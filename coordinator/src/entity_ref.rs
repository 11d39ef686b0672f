//! [`EntityRef`]: a typed reference to one entity anywhere in the cluster (Akka's
//! `EntityRef`), routed by sharding to the one live copy.

use crate::host::{AskFailure, AskOutcome, FailureKind, Payload};
use crate::runtime::RegionRef;
use crate::typed_host::EntityAnswer;
use futures::FutureExt;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use tessera_entities::EntityType;

/// Why an ask got no reply: the entity's own rejection (its type), or a failure of the way
/// there, which says whether the command took effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AskError<R> {
    /// The entity refused the command; nothing was persisted.
    Rejected(R),
    /// No answer from the entity: what went wrong, and whether the command took effect
    /// ([`AskFailure::outcome`]).
    Failed(AskFailure),
}

impl<R> AskError<R> {
    /// Whether the command took effect: a rejection never did.
    pub fn outcome(&self) -> AskOutcome {
        match self {
            AskError::Rejected(_) => AskOutcome::NotApplied,
            AskError::Failed(failure) => failure.outcome,
        }
    }

    /// The rejection, if the entity refused the command.
    pub fn rejection(&self) -> Option<&R> {
        match self {
            AskError::Rejected(rejection) => Some(rejection),
            AskError::Failed(_) => None,
        }
    }
}

impl<R: fmt::Display> fmt::Display for AskError<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AskError::Rejected(rejection) => rejection.fmt(f),
            AskError::Failed(failure) => failure.fmt(f),
        }
    }
}

impl<R: fmt::Display + fmt::Debug> std::error::Error for AskError<R> {}

/// An ask of a host on this node answered as an ask through sharding answers: the entity's
/// rejection stays its own, a runtime error becomes the failure it means.
impl<R> From<tessera_entities::AskError<R>> for AskError<R> {
    fn from(error: tessera_entities::AskError<R>) -> Self {
        match error {
            tessera_entities::AskError::Rejected(rejection) => AskError::Rejected(rejection),
            tessera_entities::AskError::Entity(error) => {
                AskError::Failed(crate::typed_host::failure_of(&error))
            }
        }
    }
}

impl<R> From<AskFailure> for AskError<R> {
    fn from(failure: AskFailure) -> Self {
        AskError::Failed(failure)
    }
}

/// A reference to entity `id` of type `E`, wherever it runs (Akka's `EntityRef`, Orleans'
/// grain reference). Cheap to clone; it names the entity, not an incarnation or a node, so
/// it stays valid while the entity passivates, moves by handoff or recovers on another node
/// after a crash.
///
/// A command asked where the entity runs is never encoded; one asked on another node crosses
/// in postcard under `E::MESSAGE_VERSION`, and its answer comes back the same way.
///
/// # Example
///
/// A reference comes from the node (`tessera::Node::entity_ref::<E>(id)`); what an ask
/// answers is the entity's own reply or rejection type, and a failure says whether the
/// command took effect:
///
/// ```
/// use tessera_coordinator::host::AskOutcome;
/// use tessera_coordinator::{AskError, EntityRef};
/// use tessera_entities::EntityType;
///
/// /// Asks once and says what became of the command.
/// async fn ask_once<E: EntityType>(entity: &EntityRef<E>, command: E::Command) -> String {
///     match entity.ask(command).await {
///         Ok(_reply) => format!("{} answered", entity.id()),
///         Err(AskError::Rejected(rejection)) => format!("refused, nothing persisted: {rejection}"),
///         Err(AskError::Failed(failure)) => match failure.outcome {
///             AskOutcome::NotApplied => format!("not applied, safe to retry: {failure}"),
///             AskOutcome::Unknown => format!("may still take effect: {failure}"),
///             AskOutcome::Applied => format!("applied, its reply lost: {failure}"),
///         },
///     }
/// }
/// ```
pub struct EntityRef<E: EntityType> {
    route: Result<RegionRef, AskFailure>,
    id: Arc<str>,
    _type: PhantomData<fn() -> E>,
}

impl<E: EntityType> Clone for EntityRef<E> {
    fn clone(&self) -> Self {
        EntityRef {
            route: self.route.clone(),
            id: self.id.clone(),
            _type: PhantomData,
        }
    }
}

impl<E: EntityType> fmt::Debug for EntityRef<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EntityRef({}|{})", E::TYPE_NAME, self.id)
    }
}

impl<E: EntityType> EntityRef<E> {
    /// A reference through this node's region of `E`.
    pub fn new(region: RegionRef, id: impl Into<Arc<str>>) -> Self {
        EntityRef {
            route: Ok(region),
            id: id.into(),
            _type: PhantomData,
        }
    }

    /// A reference whose every ask fails with `failure` (a type this node does not shard):
    /// the error arrives where the caller awaits its answer.
    pub fn unroutable(failure: AskFailure, id: impl Into<Arc<str>>) -> Self {
        EntityRef {
            route: Err(failure),
            id: id.into(),
            _type: PhantomData,
        }
    }

    /// The entity's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Sends `command` and waits for the entity's reply or rejection, at most the ask
    /// timeout.
    ///
    /// The command is sent when this is called, not when the future is first polled, so a
    /// caller's commands reach the entity in the order of its calls. After a failure whose
    /// outcome is [`AskOutcome::Unknown`] (a timeout, a write not acknowledged) the command
    /// may still take effect.
    pub fn ask(
        &self,
        command: E::Command,
    ) -> impl Future<Output = Result<E::Reply, AskError<E::Rejection>>> + Send + 'static + use<E>
    {
        let answer = match &self.route {
            Ok(region) => region.ask(&self.id, Payload::local(command)).left_future(),
            Err(failure) => futures::future::ready(Err(failure.clone())).right_future(),
        };
        async move { decode_answer::<E>(answer.await?) }
    }

    /// Sends `command` without waiting for its answer (Akka's `tell`): the reply, a rejection
    /// or a later failure is dropped. Only a refusal on the spot (an invalid id, a full
    /// queue, a type this node does not shard) is returned; then nothing was sent.
    pub fn tell(&self, command: E::Command) -> Result<(), AskFailure> {
        match &self.route {
            Ok(region) => region.tell(&self.id, Payload::local(command)),
            Err(failure) => Err(failure.clone()),
        }
    }
}

/// The entity's answer as `E`'s reply or rejection.
fn decode_answer<E: EntityType>(answer: Payload) -> Result<E::Reply, AskError<E::Rejection>> {
    // Whether a reply or a rejection was sent shows in postcard's first byte (the variant of
    // the `Result`), so a failed decoding still says whether the command was applied.
    let outcome = match &answer {
        Payload::Encoded(bytes) => match bytes.first() {
            Some(0) => AskOutcome::Applied,
            Some(1) => AskOutcome::NotApplied,
            _ => AskOutcome::Unknown,
        },
        Payload::Local(_) => AskOutcome::Unknown,
    };
    match answer.into_typed::<EntityAnswer<E>>() {
        Ok(Ok(reply)) => Ok(reply),
        Ok(Err(rejection)) => Err(AskError::Rejected(rejection)),
        Err(error) => Err(AskError::Failed(AskFailure::new(
            FailureKind::Internal,
            outcome,
            format!(
                "the answer of a {} entity is not its reply or rejection (message version {}): \
                 {error}",
                E::TYPE_NAME,
                E::MESSAGE_VERSION
            ),
        ))),
    }
}
