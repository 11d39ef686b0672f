//! The JSON face of an entity type, for the HTTP API: the one place a command is decoded from
//! JSON and its answer encoded to JSON. Past it the command is the type's own Rust value,
//! asked through cluster sharding like any typed ask (and encoded in postcard, not JSON, if it
//! crosses to another node).

use crate::http::entities::CommandError;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;
use std::sync::Arc;
use tessera_coordinator::runtime::RegionRef;
use tessera_coordinator::typed_host::failure_of;
use tessera_coordinator::{AskError, EntityRef};
use tessera_entities::{EntityHost, EntityType};

/// An entity type as the HTTP API sees it: a JSON command to an entity, its JSON reply.
pub trait JsonEntity: Send + Sync + 'static {
    /// Decodes `command` as the type's command, asks entity `id`, and encodes the answer. A
    /// rejection is a 409 carrying the rejection as JSON; every error says whether the
    /// command took effect.
    fn ask_json(&self, id: &str, command: Value)
    -> BoxFuture<'static, Result<Value, CommandError>>;
}

/// How a [`JsonFace`] asks its type's entities once the command is typed.
type TypedAsk<E> = Arc<
    dyn Fn(
            &str,
            <E as EntityType>::Command,
        ) -> BoxFuture<
            'static,
            Result<<E as EntityType>::Reply, AskError<<E as EntityType>::Rejection>>,
        > + Send
        + Sync,
>;

/// The [`JsonEntity`] of type `E`, over cluster sharding or over a local host.
pub struct JsonFace<E: EntityType> {
    ask: TypedAsk<E>,
}

impl<E: EntityType> JsonFace<E> {
    /// Asks through this node's region of `E`: to the one live copy, wherever it runs.
    pub fn over_region(region: RegionRef) -> Self {
        JsonFace {
            ask: Arc::new(move |id, command| {
                EntityRef::<E>::new(region.clone(), id).ask(command).boxed()
            }),
        }
    }

    /// Asks this node's host of `E` directly (a single process without sharding: tests).
    pub fn over_host(host: Arc<EntityHost<E>>) -> Self {
        JsonFace {
            ask: Arc::new(move |id, command| {
                let answer = host.entity_ref(id).map(|entity| entity.ask(command));
                async move { Ok(answer.map_err(|e| failure_of(&e))?.await?) }.boxed()
            }),
        }
    }
}

impl<E: EntityType> JsonEntity for JsonFace<E> {
    fn ask_json(
        &self,
        id: &str,
        command: Value,
    ) -> BoxFuture<'static, Result<Value, CommandError>> {
        let command: E::Command = match serde_json::from_value(command) {
            Ok(command) => command,
            Err(e) => {
                let error = CommandError::bad_request(format!(
                    "invalid command for entity type {}: {e}",
                    E::TYPE_NAME
                ));
                return futures::future::ready(Err(error)).boxed();
            }
        };
        let answer = (self.ask)(id, command);
        async move {
            match answer.await {
                Ok(reply) => serde_json::to_value(reply).map_err(|e| {
                    CommandError::internal(
                        format!("the entity's reply cannot be encoded as JSON: {e}"),
                        tessera_coordinator::host::AskOutcome::Applied,
                    )
                }),
                Err(AskError::Rejected(rejection)) => Err(CommandError::rejected(
                    rejection.to_string(),
                    serde_json::to_value(&rejection).ok(),
                )),
                Err(AskError::Failed(failure)) => Err(failure.into()),
            }
        }
        .boxed()
    }
}
