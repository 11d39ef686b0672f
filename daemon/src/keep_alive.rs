//! The keep-alive of a daemon's instances: every node asks each of the `count` instances,
//! through sharding, every `keep_alive_interval`. The ask starts an instance that is not
//! running wherever its shard lives (and allocates the shard if it has no home), so an
//! instance that ended, or lost its node, runs again within about one interval of its
//! shard's new home being known.

use crate::host::KeepAlive;
use std::time::Duration;
use tessera_coordinator::host::Payload;
use tessera_coordinator::runtime::RegionRef;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The keep-alive task of one daemon on this node; stops when dropped.
pub struct KeepAlivePinger {
    task: JoinHandle<()>,
}

impl KeepAlivePinger {
    /// Asks each of the `count` instances of the daemon behind `region` every `interval`. A
    /// round still waiting for answers when the next is due delays it: no more than one
    /// keep-alive per instance and node is under way.
    pub fn start(region: RegionRef, count: watch::Receiver<u32>, interval: Duration) -> Self {
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let count = *count.borrow();
                let asks = (0..count).map(|index| {
                    let region = &region;
                    async move {
                        let answer = region.ask(&index.to_string(), Payload::local(KeepAlive)).await;
                        if let Err(failure) = answer {
                            tracing::debug!(daemon = region.type_name(), index, %failure, "keep-alive not answered");
                        }
                    }
                });
                futures::future::join_all(asks).await;
            }
        });
        KeepAlivePinger { task }
    }
}

impl Drop for KeepAlivePinger {
    fn drop(&mut self) {
        self.task.abort();
    }
}
