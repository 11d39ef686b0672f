//! The two bounded outbound queues to one peer, and the biased receive that keeps the control
//! lane from waiting behind bulk data.

use super::endpoint::{Endpoint, lock};
use super::{Lane, SendError, TransportConfig};
use crate::address::Address;
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::mpsc::{self, error::TrySendError};

/// The outbound queues of one node, per peer address. A peer's queues are created on the first
/// send to it, together with the one task that drains them; they live until shutdown.
pub(crate) struct PeerQueues<T> {
    peers: Mutex<HashMap<Address, LaneSenders<T>>>,
    control_capacity: usize,
    bulk_capacity: usize,
}

impl<T> PeerQueues<T> {
    pub(crate) fn new(config: &TransportConfig) -> Self {
        Self {
            peers: Mutex::new(HashMap::new()),
            control_capacity: config.control_queue_capacity,
            bulk_capacity: config.bulk_queue_capacity,
        }
    }

    /// Queues `item` for `to` without waiting; `start` receives the consuming side of a new
    /// peer's queues and must spawn the task that drains them. A full lane drops the item and
    /// counts it.
    pub(crate) fn try_send(
        &self,
        endpoint: &Endpoint,
        to: &Address,
        lane: Lane,
        item: T,
        start: impl FnOnce(LaneReceivers<T>),
    ) -> Result<(), SendError> {
        let mut peers = lock(&self.peers);
        // Checked under the lock so no task is started after `close` cleared the table.
        if endpoint.is_closed() {
            return Err(SendError::Closed);
        }
        let queues = peers.entry(to.clone()).or_insert_with(|| {
            let (senders, receivers) = lane_queues(self.control_capacity, self.bulk_capacity);
            start(receivers);
            senders
        });
        queues.try_send(lane, item).map_err(|e| match e {
            EnqueueError::Full { capacity } => endpoint.queue_full(to, lane, capacity),
            EnqueueError::Closed => SendError::Closed,
        })
    }

    /// Closes the endpoint and drops every queue, so the draining tasks see both ends.
    pub(crate) fn close(&self, endpoint: &Endpoint) {
        let mut peers = lock(&self.peers);
        endpoint.close();
        peers.clear();
    }
}

/// Why an item could not be queued.
enum EnqueueError {
    /// The lane's queue holds `capacity` items already.
    Full { capacity: usize },
    /// The consuming task is gone (the transport is shutting down).
    Closed,
}

/// Producer side, kept in [`PeerQueues`].
struct LaneSenders<T> {
    control: mpsc::Sender<T>,
    bulk: mpsc::Sender<T>,
}

/// Consumer side: owned by the one task that writes to the peer.
pub(crate) struct LaneReceivers<T> {
    control: mpsc::Receiver<T>,
    bulk: mpsc::Receiver<T>,
}

/// A pair of bounded queues; both capacities must be at least 1 (checked by config validation).
fn lane_queues<T>(
    control_capacity: usize,
    bulk_capacity: usize,
) -> (LaneSenders<T>, LaneReceivers<T>) {
    let (control_tx, control_rx) = mpsc::channel(control_capacity.max(1));
    let (bulk_tx, bulk_rx) = mpsc::channel(bulk_capacity.max(1));
    (
        LaneSenders {
            control: control_tx,
            bulk: bulk_tx,
        },
        LaneReceivers {
            control: control_rx,
            bulk: bulk_rx,
        },
    )
}

impl<T> LaneSenders<T> {
    /// Queues without waiting; a full queue drops the item (the caller counts it).
    fn try_send(&self, lane: Lane, item: T) -> Result<(), EnqueueError> {
        let queue = match lane {
            Lane::Control => &self.control,
            Lane::Bulk => &self.bulk,
        };
        queue.try_send(item).map_err(|e| match e {
            TrySendError::Full(_) => EnqueueError::Full {
                capacity: queue.max_capacity(),
            },
            TrySendError::Closed(_) => EnqueueError::Closed,
        })
    }
}

impl<T> LaneReceivers<T> {
    /// Waits for the next item, always preferring the control lane. `None` once both lanes are
    /// closed and empty. Cancel safe: both inner receives are.
    pub(crate) async fn recv(&mut self) -> Option<T> {
        tokio::select! {
            biased;
            Some(item) = self.control.recv() => Some(item),
            Some(item) = self.bulk.recv() => Some(item),
            else => None,
        }
    }

    /// The next item that is ready now, control first; used to batch writes before a flush.
    pub(crate) fn try_recv(&mut self) -> Option<T> {
        self.control
            .try_recv()
            .ok()
            .or_else(|| self.bulk.try_recv().ok())
    }
}
