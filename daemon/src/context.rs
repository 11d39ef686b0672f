//! What the task of one daemon instance is given: which instance it is, of how many, and a
//! signal to stop.

use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// One run of one instance of a daemon. The run ends when the task returns: told to stop
/// (its shard moves, the count changed, the node stops), it should return soon; one that
/// returns on its own is started again by the next keep-alive.
#[derive(Clone, Debug)]
pub struct DaemonContext {
    name: Arc<str>,
    index: u32,
    count: u32,
    stop: CancellationToken,
}

impl DaemonContext {
    pub(crate) fn new(name: Arc<str>, index: u32, count: u32, stop: CancellationToken) -> Self {
        DaemonContext {
            name,
            index,
            count,
            stop,
        }
    }

    /// The daemon's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This instance's number, `0..count`.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The number of instances this run was started with. A change of the count stops
    /// the run and starts a new one with the new count.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Resolves when this run must stop.
    pub async fn stopped(&self) {
        self.stop.cancelled().await;
    }

    /// Whether this run was told to stop.
    pub fn is_stopping(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// The token that is cancelled when this run must stop, for tasks of its own.
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }
}
