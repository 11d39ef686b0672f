//! The bounded outbound queues to one peer, one per [`Lane`], and the biased receive that takes
//! control before quorum before bulk, so neither of the first two waits behind bulk data.

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
    capacities: LaneCapacities,
}

/// The queue capacity of each lane, in messages; each at least 1 (checked by config
/// validation).
#[derive(Clone, Copy)]
struct LaneCapacities {
    control: usize,
    quorum: usize,
    bulk: usize,
}

impl<T> PeerQueues<T> {
    pub(crate) fn new(config: &TransportConfig) -> Self {
        Self {
            peers: Mutex::new(HashMap::new()),
            capacities: LaneCapacities {
                control: config.control_queue_capacity,
                quorum: config.quorum_queue_capacity,
                bulk: config.bulk_queue_capacity,
            },
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
            let (senders, receivers) = lane_queues(self.capacities);
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
    quorum: mpsc::Sender<T>,
    bulk: mpsc::Sender<T>,
}

/// Consumer side: owned by the one task that writes to the peer.
pub(crate) struct LaneReceivers<T> {
    control: mpsc::Receiver<T>,
    quorum: mpsc::Receiver<T>,
    bulk: mpsc::Receiver<T>,
}

/// One bounded queue per lane.
fn lane_queues<T>(capacities: LaneCapacities) -> (LaneSenders<T>, LaneReceivers<T>) {
    let (control_tx, control_rx) = mpsc::channel(capacities.control.max(1));
    let (quorum_tx, quorum_rx) = mpsc::channel(capacities.quorum.max(1));
    let (bulk_tx, bulk_rx) = mpsc::channel(capacities.bulk.max(1));
    (
        LaneSenders {
            control: control_tx,
            quorum: quorum_tx,
            bulk: bulk_tx,
        },
        LaneReceivers {
            control: control_rx,
            quorum: quorum_rx,
            bulk: bulk_rx,
        },
    )
}

impl<T> LaneSenders<T> {
    /// Queues without waiting; a full queue drops the item (the caller counts it).
    fn try_send(&self, lane: Lane, item: T) -> Result<(), EnqueueError> {
        let queue = match lane {
            Lane::Control => &self.control,
            Lane::Quorum => &self.quorum,
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
    /// Waits for the next item from the first non-empty lane in the order control, quorum,
    /// bulk. `None` once every lane is closed and empty. Cancel safe: the inner receives are.
    ///
    /// Strict priority: bulk data waits as long as the other lanes have something. Their
    /// traffic is small and bounded by the requests in flight, so bulk is delayed, not starved.
    pub(crate) async fn recv(&mut self) -> Option<T> {
        tokio::select! {
            biased;
            Some(item) = self.control.recv() => Some(item),
            Some(item) = self.quorum.recv() => Some(item),
            Some(item) = self.bulk.recv() => Some(item),
            else => None,
        }
    }

    /// The next item that is ready now, in the same lane order; used to batch writes before a
    /// flush, so a message queued while a batch is written still overtakes the bulk behind it.
    pub(crate) fn try_recv(&mut self) -> Option<T> {
        self.control
            .try_recv()
            .ok()
            .or_else(|| self.quorum.try_recv().ok())
            .or_else(|| self.bulk.try_recv().ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queues(capacity: usize) -> (LaneSenders<u32>, LaneReceivers<u32>) {
        lane_queues(LaneCapacities {
            control: capacity,
            quorum: capacity,
            bulk: capacity,
        })
    }

    #[tokio::test]
    async fn lanes_drain_control_then_quorum_then_bulk_each_in_order() {
        let (senders, mut receivers) = queues(8);
        // Queued in the opposite order of their priority.
        for (lane, item) in [
            (Lane::Bulk, 1),
            (Lane::Bulk, 2),
            (Lane::Quorum, 10),
            (Lane::Bulk, 3),
            (Lane::Quorum, 11),
            (Lane::Control, 20),
        ] {
            assert!(senders.try_send(lane, item).is_ok());
        }
        let first = receivers.recv().await;
        let mut drained = vec![first];
        while let Some(item) = receivers.try_recv() {
            drained.push(Some(item));
        }
        let drained: Vec<u32> = drained.into_iter().flatten().collect();
        assert_eq!(drained, [20, 10, 11, 1, 2, 3]);
    }

    #[tokio::test]
    async fn a_full_bulk_lane_leaves_the_quorum_lane_open() {
        let (senders, mut receivers) = queues(2);
        for item in 0..2 {
            assert!(senders.try_send(Lane::Bulk, item).is_ok());
        }
        assert!(matches!(
            senders.try_send(Lane::Bulk, 2),
            Err(EnqueueError::Full { capacity: 2 })
        ));
        assert!(senders.try_send(Lane::Quorum, 100).is_ok());
        assert_eq!(receivers.recv().await, Some(100));
    }
}
