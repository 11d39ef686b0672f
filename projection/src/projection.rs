//! A projection as a service registers it: a name, an entity type, a number of instances,
//! a handler and settings; and the same with its Rust type erased, as the node runs it.

use crate::control::ControlState;
use crate::envelope::Envelope;
use crate::exactly_once::{ExactlyOnceStore, OffsetCommit};
use crate::handler::{HandlerError, Handling};
use crate::instance::{InstanceSetup, run};
use crate::settings::{InvalidProjection, ProjectionSettings};
use crate::status::ProjectionStatuses;
use futures::FutureExt;
use futures::future::BoxFuture;
use std::future::Future;
use std::sync::Arc;
use tessera_daemon::DaemonContext;
use tessera_entities::EntityType;
use tessera_persistence::ReplicatedJournal;
use tokio::sync::watch;

/// A projection of entity type `E`'s events.
///
/// ```no_run
/// # use tessera_projection::{Envelope, HandlerError, Projection};
/// # fn example<Account: tessera_entities::EntityType + Default>() {
/// let balances = Projection::at_least_once(
///     "balances",
///     Account::default(),
///     4,
///     |envelope: Envelope<Account>| async move {
///         // update a read model with envelope.event ...
///         Ok::<(), HandlerError>(())
///     },
/// );
/// # }
/// ```
pub struct Projection<E: EntityType> {
    name: String,
    entity: Arc<E>,
    instances: u32,
    handling: Handling<E>,
    settings: ProjectionSettings,
}

impl<E: EntityType> Projection<E> {
    /// A projection named `name` over `E`'s events, in `instances` instances (each owns an
    /// equal range of the slices; fixed for the projection's life, as its offsets are kept
    /// per instance), handing one envelope at a time to `handler`, at least once. `entity`
    /// decodes old events through its upcasters.
    pub fn at_least_once<F, Fut>(name: &str, entity: E, instances: u32, handler: F) -> Self
    where
        F: Fn(Envelope<E>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        Projection {
            name: name.to_string(),
            entity: Arc::new(entity),
            instances,
            handling: Handling::One(Arc::new(move |envelope| handler(envelope).boxed())),
            settings: ProjectionSettings::default(),
        }
    }

    /// [`Projection::at_least_once`] handing groups of up to `max_group` envelopes (those
    /// ready when the handler is free) to `handler`, all or nothing.
    pub fn grouped_at_least_once<F, Fut>(
        name: &str,
        entity: E,
        instances: u32,
        max_group: usize,
        handler: F,
    ) -> Self
    where
        F: Fn(Vec<Envelope<E>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        Projection {
            name: name.to_string(),
            entity: Arc::new(entity),
            instances,
            handling: Handling::Group {
                max: max_group.max(1),
                handler: Arc::new(move |envelopes| handler(envelopes).boxed()),
            },
            settings: ProjectionSettings::default(),
        }
    }

    /// An exactly-once projection: `handler` gets groups of up to `max_group` envelopes with
    /// the [`OffsetCommit`] to commit in the same transaction as its effect, in `store`
    /// (which reads the offset back and fences the instances: see
    /// [`crate::exactly_once`]). A failed group is retried, then the instance stops
    /// ([`FailureAction::Skip`](crate::FailureAction) is refused: skipping would need a
    /// commit of its own).
    pub fn exactly_once<F, Fut>(
        name: &str,
        entity: E,
        instances: u32,
        max_group: usize,
        store: impl ExactlyOnceStore,
        handler: F,
    ) -> Self
    where
        F: Fn(Vec<Envelope<E>>, OffsetCommit) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        Projection {
            name: name.to_string(),
            entity: Arc::new(entity),
            instances,
            handling: Handling::Exactly {
                max: max_group.max(1),
                handler: Arc::new(move |envelopes, commit| handler(envelopes, commit).boxed()),
                store: Arc::new(store),
            },
            settings: ProjectionSettings::default(),
        }
    }

    /// The same projection with `settings`.
    pub fn with_settings(mut self, settings: ProjectionSettings) -> Self {
        self.settings = settings;
        self
    }
}

/// What a node gives a projection's instances.
pub struct NodeServices {
    pub journal: Arc<ReplicatedJournal>,
    pub statuses: ProjectionStatuses,
    /// Names the node (in offset log writer ids).
    pub node: String,
    /// The projection's control, as this node follows it.
    pub control: watch::Receiver<ControlState>,
}

/// A projection with its entity type erased, as the node runs it.
pub trait ProjectionRun: Send + Sync + 'static {
    fn name(&self) -> &str;
    fn entity_type(&self) -> &'static str;
    fn instances(&self) -> u32;
    /// Checks its name, instances and settings.
    fn validate(&self) -> Result<(), InvalidProjection>;
    /// Runs the instance `context` names on this node until it stops or fails.
    fn run(&self, context: DaemonContext, node: NodeServices) -> BoxFuture<'static, ()>;
}

impl<E: EntityType> ProjectionRun for Projection<E> {
    fn name(&self) -> &str {
        &self.name
    }

    fn entity_type(&self) -> &'static str {
        E::TYPE_NAME
    }

    fn instances(&self) -> u32 {
        self.instances
    }

    fn validate(&self) -> Result<(), InvalidProjection> {
        let bad = |problem: String| {
            Err(InvalidProjection::Setting {
                name: self.name.clone(),
                problem,
            })
        };
        if let Err(e) = tessera_daemon::settings::validate_name(&crate::daemon_name_of(&self.name))
        {
            return bad(e.to_string());
        }
        if self.instances == 0 || self.instances > u32::from(tessera_journal::slice::SLICE_COUNT) {
            return bad(format!(
                "{} instances: a projection has 1 to {} (each owns a range of the slices)",
                self.instances,
                tessera_journal::slice::SLICE_COUNT
            ));
        }
        if matches!(self.handling, Handling::Exactly { .. })
            && self.settings.on_failure == crate::FailureAction::Skip
        {
            return bad("an exactly-once projection stops on a failure; it cannot skip".into());
        }
        self.settings.validate(&self.name)
    }

    fn run(&self, context: DaemonContext, node: NodeServices) -> BoxFuture<'static, ()> {
        let setup = InstanceSetup {
            name: self.name.as_str().into(),
            entity: self.entity.clone(),
            handling: self.handling.clone(),
            settings: self.settings.clone(),
            journal: node.journal,
            statuses: node.statuses,
            node: node.node,
            control: node.control,
        };
        run(setup, context).boxed()
    }
}
