//! The two bounded outbound queues to one peer, and the biased receive that keeps the control
//! lane from waiting behind bulk data.

use super::Lane;
use tokio::sync::mpsc::{self, error::TrySendError};

/// Why an item could not be queued.
pub(crate) enum EnqueueError {
    /// The lane's queue holds `capacity` items already.
    Full { capacity: usize },
    /// The consuming task is gone (the transport is shutting down).
    Closed,
}

/// Producer side: cloned into the transport's peer table, used by `send` without blocking.
pub(crate) struct LaneSenders<T> {
    control: mpsc::Sender<T>,
    bulk: mpsc::Sender<T>,
}

/// Consumer side: owned by the one task that writes to the peer.
pub(crate) struct LaneReceivers<T> {
    control: mpsc::Receiver<T>,
    bulk: mpsc::Receiver<T>,
}

/// A pair of bounded queues; both capacities must be at least 1 (checked by config validation).
pub(crate) fn lane_queues<T>(
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
    pub(crate) fn try_send(&self, lane: Lane, item: T) -> Result<(), EnqueueError> {
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
