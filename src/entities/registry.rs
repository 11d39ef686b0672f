//! The registry of hosted entity types, each behind a JSON face: the HTTP API finds a type by
//! name and sends it a JSON command without knowing its Rust types.

use futures::FutureExt;
use futures::future::BoxFuture;
use std::collections::BTreeMap;
use std::sync::Arc;
use tessera_coordinator::host::{AskFailure, AskOutcome, FailureKind};
use tessera_entities::{AskError, EntityError, EntityHost, EntityId, EntityType, HostStats};

/// Why a JSON command got no JSON reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonAskError {
    /// The body is not a command of this type; names the type and serde's complaint.
    #[error("invalid command for entity type {entity_type}: {reason}")]
    MalformedCommand {
        entity_type: &'static str,
        reason: String,
    },
    /// The entity refused the command (its rejection's message); nothing was persisted.
    #[error("{0}")]
    Rejected(String),
    /// The runtime could not get a reply (invalid id, overload, failure, shutdown...).
    #[error(transparent)]
    Entity(#[from] EntityError),
    /// The reply could not be rendered as JSON (a bug in the entity type).
    #[error("cannot encode the reply as JSON: {0}")]
    Reply(String),
}

impl JsonAskError {
    /// What kind of failure this is and whether the command took effect, as a caller anywhere
    /// in the cluster learns it.
    pub fn to_failure(&self) -> AskFailure {
        use AskOutcome::{Applied, NotApplied, Unknown};
        let (kind, outcome) = match self {
            JsonAskError::MalformedCommand { .. } => (FailureKind::BadRequest, NotApplied),
            JsonAskError::Rejected(_) => (FailureKind::Rejected, NotApplied),
            // The command took effect; only its reply could not be encoded.
            JsonAskError::Reply(_) => (FailureKind::Internal, Applied),
            JsonAskError::Entity(e) => match e {
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
            },
        };
        AskFailure::new(kind, outcome, self.to_string())
    }
}

/// An entity type as the HTTP API sees it.
pub trait JsonEntityType: Send + Sync + 'static {
    /// Sends a JSON command to entity `id` and returns the JSON reply.
    fn ask_json(
        &self,
        id: &str,
        command: serde_json::Value,
    ) -> BoxFuture<'static, Result<serde_json::Value, JsonAskError>>;

    /// Stops the type's entities after they finish what they accepted.
    fn shutdown(&self) -> BoxFuture<'_, ()>;

    /// Stops the given entities after they finish what they accepted (a shard handoff).
    fn stop_entities(&self, ids: Vec<String>) -> BoxFuture<'static, ()>;

    /// The ids of the entities running now.
    fn live_entity_ids(&self) -> BoxFuture<'_, Vec<String>>;

    /// Starts the given entities without a command (remembered entities); returns those
    /// whose partition's queue was full, not started.
    fn start_entities(&self, ids: Vec<String>) -> Vec<String>;

    /// The host's lifecycle counters.
    fn stats(&self) -> HostStats;
}

impl<E: EntityType> JsonEntityType for EntityHost<E> {
    fn ask_json(
        &self,
        id: &str,
        command: serde_json::Value,
    ) -> BoxFuture<'static, Result<serde_json::Value, JsonAskError>> {
        let entity = match self.entity_ref(id) {
            Ok(entity) => entity,
            Err(e) => return futures::future::ready(Err(e.into())).boxed(),
        };
        let command: E::Command = match serde_json::from_value(command) {
            Ok(command) => command,
            Err(e) => {
                return futures::future::ready(Err(JsonAskError::MalformedCommand {
                    entity_type: E::TYPE_NAME,
                    reason: e.to_string(),
                }))
                .boxed();
            }
        };
        let reply = entity.ask(command);
        async move {
            match reply.await {
                Ok(reply) => {
                    serde_json::to_value(reply).map_err(|e| JsonAskError::Reply(e.to_string()))
                }
                Err(AskError::Rejected(rejection)) => {
                    Err(JsonAskError::Rejected(rejection.to_string()))
                }
                Err(AskError::Entity(e)) => Err(e.into()),
            }
        }
        .boxed()
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        EntityHost::shutdown(self).boxed()
    }

    fn stop_entities(&self, ids: Vec<String>) -> BoxFuture<'static, ()> {
        // Ids come from this host's own deliveries and listings; one that is not an entity id
        // cannot be running.
        let ids: Vec<EntityId> = ids.iter().filter_map(|id| EntityId::new(id).ok()).collect();
        EntityHost::stop_entities(self, ids).boxed()
    }

    fn start_entities(&self, ids: Vec<String>) -> Vec<String> {
        let ids: Vec<EntityId> = ids.iter().filter_map(|id| EntityId::new(id).ok()).collect();
        let skipped = EntityHost::start_entities(self, ids);
        if !skipped.is_empty() {
            tracing::debug!(
                count = skipped.len(),
                "remembered entities not started (queues full); offered again later"
            );
        }
        skipped.iter().map(|id| id.as_str().to_string()).collect()
    }

    fn live_entity_ids(&self) -> BoxFuture<'_, Vec<String>> {
        async move {
            EntityHost::live_entity_ids(self)
                .await
                .into_iter()
                .map(|id| id.as_str().to_string())
                .collect()
        }
        .boxed()
    }

    fn stats(&self) -> HostStats {
        EntityHost::stats(self)
    }
}

/// The entity types a node hosts, by name. Built at start and read-only afterwards, so the
/// HTTP path takes no lock.
#[derive(Default)]
pub struct EntityTypes {
    types: BTreeMap<&'static str, Arc<dyn JsonEntityType>>,
}

impl EntityTypes {
    /// No types.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a host under its type's name (replacing one of the same name).
    pub fn register<E: EntityType>(&mut self, host: EntityHost<E>) {
        self.types.insert(E::TYPE_NAME, Arc::new(host));
    }

    /// Every type with its host, by name.
    pub fn hosts(&self) -> impl Iterator<Item = (&'static str, &Arc<dyn JsonEntityType>)> {
        self.types.iter().map(|(name, host)| (*name, host))
    }

    /// The type called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn JsonEntityType>> {
        self.types.get(name)
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<&'static str> {
        self.types.keys().copied().collect()
    }

    /// Each type's lifecycle counters, by name.
    pub fn stats(&self) -> Vec<(&'static str, HostStats)> {
        self.types
            .iter()
            .map(|(name, host)| (*name, host.stats()))
            .collect()
    }

    /// Shuts every type's host down.
    pub async fn shutdown(&self) {
        for host in self.types.values() {
            host.shutdown().await;
        }
    }
}
