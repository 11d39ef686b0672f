//! The registry of hosted entity types, each behind a JSON face: the HTTP API finds a type by
//! name and sends it a JSON command without knowing its Rust types.

use futures::FutureExt;
use futures::future::BoxFuture;
use std::collections::BTreeMap;
use std::sync::Arc;
use tessera_entities::{AskError, EntityError, EntityHost, EntityType, HostStats};

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
