//! Sharded daemon processes on the node builder: each registered daemon becomes a sharded
//! type (`daemon.<name>`) whose host runs this node's instances, with a count followed in
//! Distributed Data and a keep-alive from this node. An instance's task gets the running
//! node's handle, so that it can ask entities and read the journal like any service code.

use super::running::NodeHandle;
use futures::FutureExt;
use futures::future::BoxFuture;
use std::sync::Arc;
use tessera_daemon::{DaemonBehavior, DaemonContext, DaemonSettings};
use tokio::sync::watch;

/// A daemon's task as a service writes it: given its context and the node.
pub type DaemonTask =
    Arc<dyn Fn(DaemonContext, NodeHandle) -> BoxFuture<'static, ()> + Send + Sync>;

/// One registered daemon.
pub struct DaemonRegistration {
    pub name: String,
    pub count: u32,
    /// A projection's daemon: its count is fixed (its instances' offsets are per slice
    /// range), so it is not offered to [`NodeHandle::set_daemon_count`].
    pub fixed_count: bool,
    pub settings: DaemonSettings,
    pub task: DaemonTask,
}

impl DaemonRegistration {
    /// The behavior the daemon's host runs: the service's task, once the node's handle
    /// exists. (An instance may be asked to start while the node is finishing its start;
    /// it waits for the handle rather than run without it.)
    pub fn behavior(&self, handle: watch::Receiver<Option<NodeHandle>>) -> DaemonBehavior {
        let task = self.task.clone();
        Arc::new(move |context: DaemonContext| {
            let task = task.clone();
            let mut handle = handle.clone();
            async move {
                let node = tokio::select! {
                    ready = handle.wait_for(Option::is_some) => match ready {
                        Ok(node) => node.clone(),
                        Err(_) => None,
                    },
                    () = context.stopped() => None,
                };
                if let Some(node) = node {
                    task(context, node).await;
                }
            }
            .boxed()
        })
    }
}
