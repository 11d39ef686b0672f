//! The bounded outbound queues to one peer, one per [`Lane`], and the biased receive that takes
//! control before quorum before bulk, so neither of the first two waits behind bulk data.
//!
//! Each lane is bounded twice: in messages and in bytes (a few large frames must not hold
//! gigabytes for a slow peer). The number of peers with queues is bounded too, and a peer's
//! queues (with the task draining them) are dropped once nothing was sent to it for a while,
//! so addresses that are no longer members stop costing memory.

use super::endpoint::{Endpoint, lock};
use super::{Lane, SendError, TransportConfig};
use crate::address::Address;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{self, error::TrySendError};

/// The outbound queues of one node, per peer address. A peer's queues are created on the first
/// send to it, together with the one task that drains them; that task removes them (see
/// [`PeerQueues::remove_if_idle`]) once the peer has been idle long enough, or they go at
/// shutdown.
pub(crate) struct PeerQueues<T> {
    peers: Mutex<HashMap<Address, LaneSenders<T>>>,
    limits: LaneLimits,
    max_peers: usize,
}

/// How much one lane of one peer may hold: messages and payload bytes; each at least 1
/// (checked by config validation).
#[derive(Clone, Copy)]
struct LaneLimit {
    messages: usize,
    bytes: usize,
}

#[derive(Clone, Copy)]
struct LaneLimits {
    control: LaneLimit,
    quorum: LaneLimit,
    bulk: LaneLimit,
}

impl<T> PeerQueues<T> {
    pub(crate) fn new(config: &TransportConfig) -> Self {
        Self {
            peers: Mutex::new(HashMap::new()),
            limits: LaneLimits {
                control: LaneLimit {
                    messages: config.control_queue_capacity,
                    bytes: config.control_queue_bytes,
                },
                quorum: LaneLimit {
                    messages: config.quorum_queue_capacity,
                    bytes: config.quorum_queue_bytes,
                },
                bulk: LaneLimit {
                    messages: config.bulk_queue_capacity,
                    bytes: config.bulk_queue_bytes,
                },
            },
            max_peers: config.max_peers,
        }
    }

    /// Queues `item` (of `size_bytes`) for `to` without waiting; `start` receives the
    /// consuming side of a new peer's queues and must spawn the task that drains them. A full
    /// lane drops the item and counts it; so does a send to a new peer beyond `max_peers`.
    pub(crate) fn try_send(
        &self,
        endpoint: &Endpoint,
        to: &Address,
        lane: Lane,
        item: T,
        size_bytes: usize,
        start: impl FnOnce(LaneReceivers<T>),
    ) -> Result<(), SendError> {
        let mut peers = lock(&self.peers);
        // Checked under the lock so no task is started after `close` cleared the table.
        if endpoint.is_closed() {
            return Err(SendError::Closed);
        }
        // A writer that ended without removing its queues (it panicked) left them closed:
        // they are replaced, so that the peer is not unreachable for good.
        if peers.get(to).is_some_and(LaneSenders::is_closed) {
            peers.remove(to);
        }
        if !peers.contains_key(to) {
            if peers.len() >= self.max_peers {
                return Err(endpoint.too_many_peers(to, self.max_peers));
            }
            let (senders, receivers) = lane_queues(self.limits);
            start(receivers);
            peers.insert(to.clone(), senders);
            endpoint.set_peers(peers.len());
        }
        let Some(queues) = peers.get_mut(to) else {
            return Err(SendError::Closed);
        };
        queues.last_enqueued = Instant::now();
        queues
            .try_send(lane, item, size_bytes)
            .map_err(|e| match e {
                EnqueueError::Full { capacity } => endpoint.queue_full(to, lane, capacity),
                EnqueueError::BytesFull { max_bytes } => {
                    endpoint.queue_bytes_full(to, lane, max_bytes)
                }
                EnqueueError::Closed => SendError::Closed,
            })
    }

    /// Called by the task draining `peer`'s queues when its idle timer fires: when nothing
    /// was queued for `peer` for `idle`, drops its queues (with anything still in them: a
    /// peer that has not been reachable for that long gets nothing late) and returns None, and
    /// the task ends; the next send starts afresh. Otherwise returns how long until it could
    /// be idle. Under the table's lock no send can slip in between the check and the removal.
    pub(crate) fn remove_if_idle(
        &self,
        endpoint: &Endpoint,
        peer: &Address,
        idle: Duration,
    ) -> Option<Duration> {
        let mut peers = lock(&self.peers);
        let quiet = peers.get(peer)?.last_enqueued.elapsed();
        if quiet < idle {
            return Some(idle - quiet);
        }
        peers.remove(peer);
        endpoint.set_peers(peers.len());
        None
    }

    /// Closes the endpoint and drops every queue, so the draining tasks see both ends.
    pub(crate) fn close(&self, endpoint: &Endpoint) {
        let mut peers = lock(&self.peers);
        endpoint.close();
        peers.clear();
        endpoint.set_peers(0);
    }
}

/// Why an item could not be queued.
enum EnqueueError {
    /// The lane's queue holds `capacity` items already.
    Full { capacity: usize },
    /// The lane's queue holds so many bytes that this item would exceed `max_bytes`.
    BytesFull { max_bytes: usize },
    /// The consuming task is gone (the transport is shutting down).
    Closed,
}

/// One lane's producer side: the channel and the bytes it holds.
struct LaneSender<T> {
    queue: mpsc::Sender<(T, usize)>,
    bytes: Arc<AtomicUsize>,
    max_bytes: usize,
}

/// One lane's consumer side.
struct LaneReceiver<T> {
    queue: mpsc::Receiver<(T, usize)>,
    bytes: Arc<AtomicUsize>,
}

impl<T> LaneReceiver<T> {
    fn took(&self, (item, size): (T, usize)) -> T {
        self.bytes.fetch_sub(size, Ordering::AcqRel);
        item
    }
}

/// Producer side, kept in [`PeerQueues`].
struct LaneSenders<T> {
    control: LaneSender<T>,
    quorum: LaneSender<T>,
    bulk: LaneSender<T>,
    /// When something was last queued for the peer (whether or not it fit).
    last_enqueued: Instant,
}

/// Consumer side: owned by the one task that writes to the peer.
pub(crate) struct LaneReceivers<T> {
    control: LaneReceiver<T>,
    quorum: LaneReceiver<T>,
    bulk: LaneReceiver<T>,
}

fn lane<T>(limit: LaneLimit) -> (LaneSender<T>, LaneReceiver<T>) {
    let (tx, rx) = mpsc::channel(limit.messages.max(1));
    let bytes = Arc::new(AtomicUsize::new(0));
    (
        LaneSender {
            queue: tx,
            bytes: bytes.clone(),
            max_bytes: limit.bytes.max(1),
        },
        LaneReceiver { queue: rx, bytes },
    )
}

/// One bounded queue per lane.
fn lane_queues<T>(limits: LaneLimits) -> (LaneSenders<T>, LaneReceivers<T>) {
    let (control_tx, control_rx) = lane(limits.control);
    let (quorum_tx, quorum_rx) = lane(limits.quorum);
    let (bulk_tx, bulk_rx) = lane(limits.bulk);
    (
        LaneSenders {
            control: control_tx,
            quorum: quorum_tx,
            bulk: bulk_tx,
            last_enqueued: Instant::now(),
        },
        LaneReceivers {
            control: control_rx,
            quorum: quorum_rx,
            bulk: bulk_rx,
        },
    )
}

impl<T> LaneSenders<T> {
    /// Whether the task draining these queues is gone.
    fn is_closed(&self) -> bool {
        self.control.queue.is_closed()
    }

    /// Queues without waiting; a full queue drops the item (the caller counts it).
    fn try_send(&self, lane: Lane, item: T, size_bytes: usize) -> Result<(), EnqueueError> {
        let sender = match lane {
            Lane::Control => &self.control,
            Lane::Quorum => &self.quorum,
            Lane::Bulk => &self.bulk,
        };
        // Reserve the bytes first: an item larger than what is left never gets in, whatever
        // the message count says. Sends to one peer happen under the table's lock, so the
        // reservation cannot race another send.
        let before = sender.bytes.fetch_add(size_bytes, Ordering::AcqRel);
        if before.saturating_add(size_bytes) > sender.max_bytes && before > 0 {
            sender.bytes.fetch_sub(size_bytes, Ordering::AcqRel);
            return Err(EnqueueError::BytesFull {
                max_bytes: sender.max_bytes,
            });
        }
        sender.queue.try_send((item, size_bytes)).map_err(|e| {
            sender.bytes.fetch_sub(size_bytes, Ordering::AcqRel);
            match e {
                TrySendError::Full(_) => EnqueueError::Full {
                    capacity: sender.queue.max_capacity(),
                },
                TrySendError::Closed(_) => EnqueueError::Closed,
            }
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
            Some(item) = self.control.queue.recv() => Some(self.control.took(item)),
            Some(item) = self.quorum.queue.recv() => Some(self.quorum.took(item)),
            Some(item) = self.bulk.queue.recv() => Some(self.bulk.took(item)),
            else => None,
        }
    }

    /// The next item that is ready now, in the same lane order; used to batch writes before a
    /// flush, so a message queued while a batch is written still overtakes the bulk behind it.
    pub(crate) fn try_recv(&mut self) -> Option<T> {
        if let Ok(item) = self.control.queue.try_recv() {
            return Some(self.control.took(item));
        }
        if let Ok(item) = self.quorum.queue.try_recv() {
            return Some(self.quorum.took(item));
        }
        if let Ok(item) = self.bulk.queue.try_recv() {
            return Some(self.bulk.took(item));
        }
        None
    }

    /// Whether every lane is empty.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.control.queue.is_empty() && self.quorum.queue.is_empty() && self.bulk.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queues(capacity: usize) -> (LaneSenders<u32>, LaneReceivers<u32>) {
        queues_with_bytes(capacity, usize::MAX)
    }

    fn queues_with_bytes(capacity: usize, bytes: usize) -> (LaneSenders<u32>, LaneReceivers<u32>) {
        let limit = LaneLimit {
            messages: capacity,
            bytes,
        };
        lane_queues(LaneLimits {
            control: limit,
            quorum: limit,
            bulk: limit,
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
            assert!(senders.try_send(lane, item, 1).is_ok());
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
            assert!(senders.try_send(Lane::Bulk, item, 1).is_ok());
        }
        assert!(matches!(
            senders.try_send(Lane::Bulk, 2, 1),
            Err(EnqueueError::Full { capacity: 2 })
        ));
        assert!(senders.try_send(Lane::Quorum, 100, 1).is_ok());
        assert_eq!(receivers.recv().await, Some(100));
    }

    #[tokio::test]
    async fn a_lane_is_bounded_in_bytes_and_frees_them_as_items_leave() {
        let (senders, mut receivers) = queues_with_bytes(100, 1_000);
        assert!(senders.try_send(Lane::Bulk, 1, 600).is_ok());
        assert!(matches!(
            senders.try_send(Lane::Bulk, 2, 600),
            Err(EnqueueError::BytesFull { max_bytes: 1_000 })
        ));
        // Another lane has its own budget.
        assert!(senders.try_send(Lane::Quorum, 3, 900).is_ok());
        assert!(senders.try_send(Lane::Bulk, 4, 400).is_ok());
        assert_eq!(receivers.recv().await, Some(3));
        assert_eq!(receivers.recv().await, Some(1));
        assert!(senders.try_send(Lane::Bulk, 5, 600).is_ok());
        assert_eq!(receivers.try_recv(), Some(4));
        assert_eq!(receivers.try_recv(), Some(5));
        assert!(receivers.is_empty());
        // An item larger than the whole budget still goes through an empty lane, so a frame
        // within max_frame_size can always be sent eventually.
        assert!(senders.try_send(Lane::Bulk, 6, 5_000).is_ok());
        assert!(matches!(
            senders.try_send(Lane::Bulk, 7, 1),
            Err(EnqueueError::BytesFull { .. })
        ));
    }

    #[tokio::test]
    async fn queues_whose_writer_died_are_replaced_on_the_next_send() {
        let config = TransportConfig::default();
        let queues: PeerQueues<u32> = PeerQueues::new(&config);
        let endpoint = Endpoint::new(
            crate::address::UniqueAddress::new(Address::new("127.0.0.1", 1), 1),
            &config,
        );
        let peer = Address::new("127.0.0.1", 2);
        let mut first = None;
        queues
            .try_send(&endpoint, &peer, Lane::Bulk, 1, 1, |r| first = Some(r))
            .expect("queued");
        // The writer dies (its receivers dropped) without removing the queues.
        drop(first.take());
        let mut second = None;
        queues
            .try_send(&endpoint, &peer, Lane::Bulk, 2, 1, |r| second = Some(r))
            .expect("queued on new queues");
        let mut second = second.expect("a new writer was started");
        assert_eq!(second.recv().await, Some(2));
    }
}
