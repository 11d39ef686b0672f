//! The programming model: an [`EntityType`] turns commands into an [`Effect`] and folds events
//! into its state.

use crate::error::CodecError;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt;
use tessera_journal::Manifest;

/// An event-sourced entity type (Akka's `EventSourcedBehavior`).
///
/// The command handler decides, from the current state, what a command does ([`Effect`]); the
/// event handler folds a persisted event into the state. State is only ever changed by events,
/// so recovery (the latest snapshot, then every later event through [`EntityType::apply_event`])
/// rebuilds exactly the state the entity had.
///
/// Both handlers must be pure and quick: they run on the entity's task, one command at a time,
/// and the event handler runs again for every event at each recovery.
///
/// Commands, replies and rejections cross nodes in postcard too, under
/// [`EntityType::MESSAGE_VERSION`]; JSON is only the HTTP API's.
///
/// Events and state are stored with postcard and a manifest ([`EntityType::EVENT_MANIFEST`] and
/// [`EntityType::EVENT_VERSION`], likewise for state). Data written under an older manifest
/// reaches [`EntityType::upcast_event`] / [`EntityType::upcast_state`], which turn it into
/// today's type; changing a type's encoding means bumping its version and teaching the upcaster
/// the old one.
pub trait EntityType: Send + Sync + Sized + 'static {
    /// What callers send.
    type Command: Serialize + DeserializeOwned + Send + 'static;
    /// What the entity persists.
    type Event: Serialize + DeserializeOwned + Send + 'static;
    /// What the events fold into.
    type State: Serialize + DeserializeOwned + Send + 'static;
    /// What a successful command answers.
    type Reply: Serialize + DeserializeOwned + Send + 'static;
    /// Why the entity refused a command (a business rule, e.g. insufficient funds). Nothing is
    /// persisted for a rejected command.
    type Rejection: Serialize + DeserializeOwned + fmt::Display + fmt::Debug + Send + 'static;

    /// The type's name: the first part of its entities' persistence ids (`account|alice`) and
    /// the `{type}` of the HTTP route. Stored in the journal, so it must never change.
    const TYPE_NAME: &'static str;
    /// The name stored with every event, e.g. `account.Event`.
    const EVENT_MANIFEST: &'static str;
    /// The version of the event encoding this release writes.
    const EVENT_VERSION: u32 = 1;
    /// The name stored with every snapshot, e.g. `account.State`.
    const STATE_MANIFEST: &'static str;
    /// The version of the state encoding this release writes.
    const STATE_VERSION: u32 = 1;
    /// The version of the encoding of `Command`, `Reply` and `Rejection` between nodes
    /// (postcard, like events): every command that crosses nodes carries it, and a node of
    /// another version refuses the command rather than misread it. Bump it when one of the
    /// three changes shape.
    const MESSAGE_VERSION: u32 = 1;

    /// The state of an entity that has no events yet.
    fn initial_state(&self, entity_id: &str) -> Self::State;

    /// Decides what `command` does, given the current state.
    fn handle_command(&self, state: &Self::State, command: Self::Command) -> Effect<Self>;

    /// Folds a persisted event into the state.
    fn apply_event(&self, state: &mut Self::State, event: &Self::Event);

    /// Tags under which the journal's `events_by_tag` finds the event (none by default).
    fn tags(&self, _event: &Self::Event) -> Vec<String> {
        Vec::new()
    }

    /// Decodes an event stored under an older (or foreign) manifest. The default knows none and
    /// fails the recovery with an error naming the manifest.
    fn upcast_event(
        &self,
        manifest: &Manifest,
        _payload: &[u8],
    ) -> Result<Self::Event, CodecError> {
        Err(CodecError::unknown_manifest(
            manifest,
            Self::EVENT_MANIFEST,
            Self::EVENT_VERSION,
        ))
    }

    /// Decodes a snapshot stored under an older (or foreign) manifest. The default knows none
    /// and fails the recovery with an error naming the manifest.
    fn upcast_state(
        &self,
        manifest: &Manifest,
        _payload: &[u8],
    ) -> Result<Self::State, CodecError> {
        Err(CodecError::unknown_manifest(
            manifest,
            Self::STATE_MANIFEST,
            Self::STATE_VERSION,
        ))
    }
}

/// Produces the reply from the state after the persisted events were applied.
pub(crate) type ReplyFn<E> =
    Box<dyn FnOnce(&<E as EntityType>::State) -> <E as EntityType>::Reply + Send + 'static>;

/// What a command does: the command handler's answer.
///
/// - [`Effect::persist`] / [`Effect::persist_all`] then [`Persist::then_reply`]: store the
///   events atomically, apply them, then reply from the *new* state;
/// - [`Effect::reply`]: reply without persisting;
/// - [`Effect::reject`]: refuse the command with a [`EntityType::Rejection`];
/// - [`Effect::stop`]: reply, then stop the entity (commands queued behind this one go to its
///   next incarnation).
#[must_use = "an effect does nothing unless the command handler returns it"]
pub struct Effect<E: EntityType> {
    pub(crate) kind: EffectKind<E>,
}

pub(crate) enum EffectKind<E: EntityType> {
    Persist {
        events: Vec<E::Event>,
        reply: ReplyFn<E>,
        stop: bool,
    },
    Reply(E::Reply),
    Reject(E::Rejection),
    Stop(E::Reply),
}

impl<E: EntityType> Effect<E> {
    /// Persists one event; finish with [`Persist::then_reply`].
    pub fn persist(event: E::Event) -> Persist<E> {
        Persist {
            events: vec![event],
        }
    }

    /// Persists several events atomically (all or none); finish with [`Persist::then_reply`].
    /// No events is the same as replying without persisting.
    pub fn persist_all(events: Vec<E::Event>) -> Persist<E> {
        Persist { events }
    }

    /// Replies without persisting anything.
    pub fn reply(reply: E::Reply) -> Self {
        Effect {
            kind: EffectKind::Reply(reply),
        }
    }

    /// Refuses the command; nothing is persisted and the caller gets the rejection.
    pub fn reject(rejection: E::Rejection) -> Self {
        Effect {
            kind: EffectKind::Reject(rejection),
        }
    }

    /// Replies, then stops the entity. Commands that arrive later start a new incarnation,
    /// which recovers the state from the store.
    pub fn stop(reply: E::Reply) -> Self {
        Effect {
            kind: EffectKind::Stop(reply),
        }
    }
}

/// Events to persist, waiting for what to do once they are stored.
#[must_use = "finish a persist effect with then_reply or then_reply_and_stop"]
pub struct Persist<E: EntityType> {
    events: Vec<E::Event>,
}

impl<E: EntityType> Persist<E> {
    /// Once the events are stored and applied, replies with `reply(&new_state)`.
    pub fn then_reply(
        self,
        reply: impl FnOnce(&E::State) -> E::Reply + Send + 'static,
    ) -> Effect<E> {
        Effect {
            kind: EffectKind::Persist {
                events: self.events,
                reply: Box::new(reply),
                stop: false,
            },
        }
    }

    /// Like [`Persist::then_reply`], then stops the entity.
    pub fn then_reply_and_stop(
        self,
        reply: impl FnOnce(&E::State) -> E::Reply + Send + 'static,
    ) -> Effect<E> {
        Effect {
            kind: EffectKind::Persist {
                events: self.events,
                reply: Box::new(reply),
                stop: true,
            },
        }
    }
}
