//! An entity type's JSON host as a shard host: the sharding runtime carries commands as JSON
//! bytes between nodes, and the node that runs the entity decodes them.

use super::JsonEntityType;
use futures::FutureExt;
use futures::future::BoxFuture;
use std::sync::Arc;
use tessera_coordinator::host::{AskFailure, AskOutcome, FailureKind, ShardHost};

/// A [`JsonEntityType`] as a [`ShardHost`].
pub struct JsonShardHost(pub Arc<dyn JsonEntityType>);

impl ShardHost for JsonShardHost {
    fn ask(
        &self,
        entity_id: &str,
        payload: Vec<u8>,
    ) -> BoxFuture<'static, Result<Vec<u8>, AskFailure>> {
        let command = match serde_json::from_slice(&payload) {
            Ok(command) => command,
            Err(e) => {
                let failure = AskFailure::new(
                    FailureKind::BadRequest,
                    AskOutcome::NotApplied,
                    format!("the command is not JSON: {e}"),
                );
                return futures::future::ready(Err(failure)).boxed();
            }
        };
        // Queued here, before the future is polled (the host's ask queues at once).
        let reply = self.0.ask_json(entity_id, command);
        async move {
            let value = reply.await.map_err(|e| e.to_failure())?;
            serde_json::to_vec(&value).map_err(|e| {
                AskFailure::new(
                    FailureKind::Internal,
                    AskOutcome::Applied,
                    format!("cannot encode the reply: {e}"),
                )
            })
        }
        .boxed()
    }

    fn stop_entities(&self, entity_ids: Vec<String>) -> BoxFuture<'static, ()> {
        self.0.stop_entities(entity_ids)
    }

    fn start_entities(&self, entity_ids: Vec<String>) -> Vec<String> {
        self.0.start_entities(entity_ids)
    }

    fn live_entity_ids(&self) -> BoxFuture<'static, Vec<String>> {
        let host = self.0.clone();
        async move { host.live_entity_ids().await }.boxed()
    }
}
