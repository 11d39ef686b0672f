//! Pausing, resuming and resetting a projection across the cluster (Akka's
//! ProjectionManagement), in Distributed Data so that every instance follows it wherever it
//! runs: `projection-<name>-paused`, a last-writer-wins register (`true` or `false`), and
//! `projection-<name>-resets`, a grow-only counter of the resets asked for. Both are written
//! with a majority and are durable where the node keeps `projection-*` durable.
//!
//! A paused instance saves its offset and handles nothing until it is resumed. A reset is
//! applied by each instance itself, when it next opens its offset log (through its fenced
//! writer): it finds more resets asked for than its log records as applied, and starts from
//! the beginning of every log, recording the count. So a reset never races a running
//! instance's saves, and one asked while an instance was unreachable is applied when it
//! comes back. Resets are taken only while the projection is paused (as this node knows
//! it), so that an operator stops the handlers before their model is rebuilt.

use std::time::Duration;
use tessera_ddata::consistency::WriteConsistency;
use tessera_ddata::g_counter::GCounter;
use tessera_ddata::node::{ReplicatorError, ReplicatorHandle};
use tessera_ddata::replicator::{UpdateResult, set_register};
use tessera_ddata::value::ReplicatedValue;
use tokio::sync::watch;

/// The Distributed Data key pattern of every projection's control (configure it durable).
pub const DURABLE_KEY_PATTERN: &str = "projection-*";

const SUBSCRIPTION_CAPACITY: usize = 16;

fn paused_key(name: &str) -> String {
    format!("projection-{name}-paused")
}

fn resets_key(name: &str) -> String {
    format!("projection-{name}-resets")
}

/// What operators asked of a projection, as this node knows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ControlState {
    pub paused: bool,
    /// Resets asked for since the projection was first registered.
    pub resets: u64,
}

/// Why an operator's request was not written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("projection {name} is running: pause it before resetting its offset")]
    NotPaused { name: String },
    #[error("projection {name}: the change did not reach a majority: {reason}")]
    NotWritten { name: String, reason: String },
}

/// A projection's control as this node follows it.
#[derive(Clone)]
pub struct ProjectionControl {
    name: String,
    replicator: ReplicatorHandle,
    current: watch::Receiver<ControlState>,
}

impl ProjectionControl {
    /// Follows projection `name`'s control.
    pub async fn start(replicator: ReplicatorHandle, name: &str) -> Result<Self, ReplicatorError> {
        let (sender, current) = watch::channel(ControlState::default());
        let mut paused = replicator
            .subscribe(&paused_key(name), SUBSCRIPTION_CAPACITY)
            .await?;
        let mut resets = replicator
            .subscribe(&resets_key(name), SUBSCRIPTION_CAPACITY)
            .await?;
        let projection = name.to_string();
        tokio::spawn(async move {
            loop {
                let change = tokio::select! {
                    Some(change) = paused.recv() => match change.value.as_ref().map(parse_paused) {
                        None => Ok(ChangeOf::Paused(false)),
                        Some(parsed) => parsed.map(ChangeOf::Paused),
                    },
                    Some(change) = resets.recv() => match change.value.as_ref().map(parse_resets) {
                        None => Ok(ChangeOf::Resets(0)),
                        Some(parsed) => parsed.map(ChangeOf::Resets),
                    },
                    else => return,
                };
                match change {
                    Ok(change) => {
                        sender.send_if_modified(|state| {
                            let before = *state;
                            match change {
                                ChangeOf::Paused(paused) => state.paused = paused,
                                // A counter only grows; keep the highest seen.
                                ChangeOf::Resets(resets) => state.resets = state.resets.max(resets),
                            }
                            *state != before
                        });
                    }
                    Err(reason) => {
                        tracing::warn!(%projection, %reason, "projection control ignored")
                    }
                }
            }
        });
        Ok(ProjectionControl {
            name: name.to_string(),
            replicator,
            current,
        })
    }

    pub fn current(&self) -> ControlState {
        *self.current.borrow()
    }

    /// The control, as it changes.
    pub fn watch(&self) -> watch::Receiver<ControlState> {
        self.current.clone()
    }

    /// Pauses (`true`) or resumes the projection on every node.
    pub async fn set_paused(&self, paused: bool, timeout: Duration) -> Result<(), ControlError> {
        let value = paused.to_string();
        let result = self
            .replicator
            .update(
                &paused_key(&self.name),
                WriteConsistency::Majority { min_cap: 0 },
                timeout,
                move |current, context| set_register(current, context, value),
            )
            .await;
        self.written(result).await
    }

    /// Asks every instance to start again from the beginning of every log, when it next
    /// opens its offset (at the resume). Refused unless the projection is paused.
    pub async fn reset(&self, timeout: Duration) -> Result<(), ControlError> {
        if !self.current().paused {
            return Err(ControlError::NotPaused {
                name: self.name.clone(),
            });
        }
        let result = self
            .replicator
            .update(
                &resets_key(&self.name),
                WriteConsistency::Majority { min_cap: 0 },
                timeout,
                move |current, context| {
                    let mut counter = match current {
                        None => GCounter::new(),
                        Some(ReplicatedValue::GCounter(counter)) => counter,
                        Some(other) => return Err(format!("the key holds a {:?}", other.kind())),
                    };
                    counter.increment(context.self_node, 1);
                    Ok(ReplicatedValue::GCounter(counter))
                },
            )
            .await;
        self.written(result).await
    }

    async fn written(
        &self,
        result: Result<UpdateResult, ReplicatorError>,
    ) -> Result<(), ControlError> {
        let not_written = |reason: String| ControlError::NotWritten {
            name: self.name.clone(),
            reason,
        };
        match result.map_err(|e| not_written(e.to_string()))? {
            UpdateResult::Success => Ok(()),
            other => Err(not_written(format!("{other:?}"))),
        }
    }
}

enum ChangeOf {
    Paused(bool),
    Resets(u64),
}

fn parse_paused(value: &ReplicatedValue) -> Result<bool, String> {
    match value {
        ReplicatedValue::LWWRegister(register) => register
            .value()
            .parse::<bool>()
            .map_err(|_| format!("{:?} is not true or false", register.value())),
        other => Err(format!("the key holds a {:?}", other.kind())),
    }
}

fn parse_resets(value: &ReplicatedValue) -> Result<u64, String> {
    match value {
        ReplicatedValue::GCounter(counter) => {
            Ok(u64::try_from(counter.value()).unwrap_or(u64::MAX))
        }
        other => Err(format!("the key holds a {:?}", other.kind())),
    }
}
