//! The JSON faces of a node's entity types, by name: what `POST /entities/{type}/{id}` asks.

use super::JsonEntity;
use crate::http::entities::{CommandError, EntityBackend};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use tessera_metrics::LatencyFamily;

/// Every entity type of a node as JSON, by name; built at start and read-only afterwards, so
/// the HTTP path takes no lock. Records how long each type's asks take.
pub struct JsonEntities {
    types: BTreeMap<String, Arc<dyn JsonEntity>>,
    ask_durations: LatencyFamily,
}

impl JsonEntities {
    /// The faces given, by type name.
    pub fn new(types: BTreeMap<String, Arc<dyn JsonEntity>>) -> Self {
        let ask_durations = LatencyFamily::new("type", types.keys().map(String::as_str));
        JsonEntities {
            types,
            ask_durations,
        }
    }

    /// The type names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.types.keys().map(String::as_str).collect()
    }

    /// How long each type's asks took, for `/metrics`.
    pub fn ask_durations(&self) -> &LatencyFamily {
        &self.ask_durations
    }
}

impl EntityBackend for JsonEntities {
    fn ask(
        &self,
        entity_type: &str,
        id: &str,
        command: Value,
    ) -> BoxFuture<'static, Result<Value, CommandError>> {
        let Some(face) = self.types.get(entity_type) else {
            let error = CommandError::bad_request(format!(
                "unknown entity type {entity_type:?}: this node runs {}",
                self.names().join(", ")
            ));
            return futures::future::ready(Err(error)).boxed();
        };
        let started = std::time::Instant::now();
        let answer = face.ask_json(id, command);
        let histogram = self.ask_durations.get(entity_type).cloned();
        async move {
            let answer = answer.await;
            if let Some(histogram) = histogram {
                histogram.observe_since(started);
            }
            answer
        }
        .boxed()
    }
}
