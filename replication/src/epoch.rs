//! Epochs and log positions: how the protocol orders writers and compares logs.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The term of one writer of a log: a counter, and the random id of the writer instance that
/// chose it. Ordered by counter, then id. A writer only ever uses epochs it chose itself, and
/// the id makes two instances (on two nodes, or one after another on one node) never choose
/// the same epoch, so an epoch names exactly one writer instance.
///
/// [`Epoch::ZERO`] is below every chosen epoch: the promise of a replica that promised
/// nothing, and the epoch of entries written before replication (a single node's journal).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Epoch {
    pub counter: u64,
    pub writer: u64,
}

impl Epoch {
    /// Below every epoch a writer chooses.
    pub const ZERO: Epoch = Epoch {
        counter: 0,
        writer: 0,
    };

    /// The epoch writer instance `writer` chooses after having seen `seen`: the next counter.
    /// Saturates at `u64::MAX` (2^64 recoveries of one log do not happen).
    pub fn after(seen: Epoch, writer: u64) -> Epoch {
        Epoch {
            counter: seen.counter.saturating_add(1),
            writer,
        }
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:016x}", self.counter, self.writer)
    }
}

/// A place in a log: an entry's sequence number and the epoch it was written (or sealed) in.
///
/// Ordered by epoch first, then sequence number: the order in which recovery ranks the logs
/// of the replicas (Raft's "at least as up-to-date"). A log whose last entry has a higher
/// epoch was extended by a later writer, which held every acknowledged entry when it started.
/// Sequence number 0 is the place before the first entry.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Position {
    pub epoch: Epoch,
    pub seq: u64,
}

impl Position {
    /// The place before the first entry of a log that no writer sealed.
    pub const START: Position = Position {
        epoch: Epoch::ZERO,
        seq: 0,
    };

    pub fn new(seq: u64, epoch: Epoch) -> Self {
        Position { epoch, seq }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.seq, self.epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_order_by_counter_then_writer() {
        let a = Epoch {
            counter: 1,
            writer: 9,
        };
        let b = Epoch {
            counter: 2,
            writer: 1,
        };
        assert!(Epoch::ZERO < a && a < b);
        assert_eq!(
            Epoch::after(b, 5),
            Epoch {
                counter: 3,
                writer: 5
            }
        );
        assert!(Epoch::after(b, 0) > b);
    }

    #[test]
    fn positions_order_by_epoch_before_sequence_number() {
        let old = Epoch {
            counter: 1,
            writer: 1,
        };
        let new = Epoch {
            counter: 2,
            writer: 1,
        };
        assert!(Position::new(100, old) < Position::new(3, new));
        assert!(Position::new(3, new) < Position::new(4, new));
        assert!(Position::START < Position::new(1, Epoch::ZERO));
    }
}
