//! A daemon's number of instances, kept in Distributed Data so that it can change while the
//! cluster runs: a last-writer-wins register under `daemon-<name>-count` (written with a
//! majority, durable where the node keeps durable keys), read by every node through a
//! subscription. Until a count was written, the count is the one the daemon was registered
//! with.

use crate::settings::{MAX_COUNT, validate_count};
use std::time::Duration;
use tessera_ddata::consistency::WriteConsistency;
use tessera_ddata::node::{ReplicatorError, ReplicatorHandle};
use tessera_ddata::replicator::{UpdateResult, set_register};
use tessera_ddata::value::ReplicatedValue;
use tokio::sync::watch;

/// The Distributed Data key pattern of every daemon's count (configure it durable).
pub const DURABLE_KEY_PATTERN: &str = "daemon-*";

/// The key of daemon `name`'s count.
pub fn count_key(name: &str) -> String {
    format!("daemon-{name}-count")
}

/// Why a new count was not written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SetCountError {
    #[error(transparent)]
    Invalid(#[from] crate::settings::InvalidDaemon),
    #[error("daemon {name}: the new count did not reach a majority: {reason}")]
    NotWritten { name: String, reason: String },
}

/// How many changes of the count a node's subscription holds before it drops some (the next
/// change carries the whole value, so only intermediate counts are missed).
const SUBSCRIPTION_CAPACITY: usize = 16;

/// A daemon's count as this node follows it.
#[derive(Clone)]
pub struct DaemonCount {
    name: String,
    replicator: ReplicatorHandle,
    current: watch::Receiver<u32>,
}

impl DaemonCount {
    /// Follows daemon `name`'s count, `registered` until one is written.
    pub async fn start(
        replicator: ReplicatorHandle,
        name: &str,
        registered: u32,
    ) -> Result<Self, ReplicatorError> {
        let (sender, current) = watch::channel(registered);
        let mut changes = replicator
            .subscribe(&count_key(name), SUBSCRIPTION_CAPACITY)
            .await?;
        let daemon = name.to_string();
        tokio::spawn(async move {
            while let Some(change) = changes.recv().await {
                let count = match change.value.as_ref().map(parse) {
                    None => registered,
                    Some(Ok(count)) => count,
                    Some(Err(reason)) => {
                        tracing::warn!(%daemon, %reason, "daemon count ignored");
                        continue;
                    }
                };
                sender.send_if_modified(|current| std::mem::replace(current, count) != count);
            }
        });
        Ok(DaemonCount {
            name: name.to_string(),
            replicator,
            current,
        })
    }

    /// The count as this node knows it now.
    pub fn current(&self) -> u32 {
        *self.current.borrow()
    }

    /// The count, as it changes.
    pub fn watch(&self) -> watch::Receiver<u32> {
        self.current.clone()
    }

    /// Writes a new count (to a majority of the members). The instances follow it on each
    /// node as the node learns it.
    pub async fn set(&self, count: u32, timeout: Duration) -> Result<(), SetCountError> {
        validate_count(&self.name, count)?;
        let not_written = |reason: String| SetCountError::NotWritten {
            name: self.name.clone(),
            reason,
        };
        let result = self
            .replicator
            .update(
                &count_key(&self.name),
                WriteConsistency::Majority { min_cap: 0 },
                timeout,
                move |current, context| set_register(current, context, count.to_string()),
            )
            .await
            .map_err(|e| not_written(e.to_string()))?;
        match result {
            UpdateResult::Success => Ok(()),
            other => Err(not_written(format!("{other:?}"))),
        }
    }
}

fn parse(value: &ReplicatedValue) -> Result<u32, String> {
    match value {
        ReplicatedValue::LWWRegister(register) => register
            .value()
            .parse::<u32>()
            .ok()
            .filter(|count| (1..=MAX_COUNT).contains(count))
            .ok_or_else(|| format!("{:?} is not a count (1 to {MAX_COUNT})", register.value())),
        other => Err(format!("the key holds a {:?}", other.kind())),
    }
}
