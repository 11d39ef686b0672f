//! When to snapshot and what a new snapshot lets go: pure functions of sequence numbers, so
//! that every incarnation of an entity (and a test) computes the same answer without reading
//! the store.

/// Whether a write that moved the sequence number from `before` to `after` crossed a multiple
/// of `every` (0: snapshots are off). A write of several events crosses at most once as far
/// as snapshots go: one snapshot at `after`.
pub fn snapshot_due(before: u64, after: u64, every: u64) -> bool {
    every > 0 && after / every > before / every
}

/// What a snapshot taken at `sequence_nr` lets go when `keep` snapshots are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Delete snapshots at or below this sequence number.
    pub delete_snapshots_up_to: u64,
    /// Delete events at or below this sequence number (when enabled): every kept snapshot is
    /// above it, so each of them still recovers.
    pub delete_events_up_to: u64,
}

/// Retention after a snapshot at `sequence_nr`, with snapshots every `every` events and
/// `keep` kept (Akka's keep-N: the snapshots of the last `keep` multiples of `every`).
///
/// Snapshots are taken at or after each multiple (a snapshot that comes due while the previous
/// one is still being saved is taken when that finishes, of the state then), and never two
/// within one multiple; so keeping those at or above `(m - keep + 1) * every`, where
/// `m = sequence_nr / every`, keeps at most `keep`, the newest included. Everything below that
/// boundary goes. `None` while fewer than `keep` multiples have passed
/// or when snapshots are off.
pub fn retention(sequence_nr: u64, every: u64, keep: u64) -> Option<Retention> {
    if every == 0 || keep == 0 {
        return None;
    }
    let multiple = sequence_nr / every;
    let first_kept_multiple = (multiple + 1).checked_sub(keep)?;
    let boundary = first_kept_multiple.checked_mul(every)?;
    let below = boundary.checked_sub(1)?;
    (below > 0).then_some(Retention {
        delete_snapshots_up_to: below,
        delete_events_up_to: below,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn snapshots_fall_on_multiples() {
        assert!(!snapshot_due(0, 99, 100));
        assert!(snapshot_due(99, 100, 100));
        assert!(snapshot_due(98, 103, 100), "a batch across a multiple");
        assert!(!snapshot_due(100, 199, 100));
        assert!(!snapshot_due(0, 1_000, 0), "0 turns snapshots off");
    }

    #[test]
    fn keep_two_deletes_below_the_older_kept_multiple() {
        assert_eq!(retention(100, 100, 2), None);
        assert_eq!(
            retention(200, 100, 2),
            Some(Retention {
                delete_snapshots_up_to: 99,
                delete_events_up_to: 99
            })
        );
        assert_eq!(retention(305, 100, 2).unwrap().delete_snapshots_up_to, 199);
        assert_eq!(retention(300, 100, 1).unwrap().delete_snapshots_up_to, 299);
        assert_eq!(retention(300, 0, 1), None);
    }

    proptest! {
        /// Whatever the write sizes, after each snapshot exactly the snapshots of the last
        /// `keep` multiples survive, the newest among them, and no deleted event is needed
        /// by a surviving snapshot.
        #[test]
        fn at_most_keep_snapshots_survive_and_cover_the_deleted_events(
            every in 1u64..50,
            keep in 1u64..5,
            writes in proptest::collection::vec(1u64..120, 1..200),
        ) {
            let mut seq = 0u64;
            let mut kept: Vec<u64> = Vec::new();
            let mut deleted_events_to = 0u64;
            for n in writes {
                let before = seq;
                seq += n;
                if !snapshot_due(before, seq, every) {
                    continue;
                }
                kept.push(seq);
                if let Some(r) = retention(seq, every, keep) {
                    kept.retain(|s| *s > r.delete_snapshots_up_to);
                    deleted_events_to = deleted_events_to.max(r.delete_events_up_to);
                }
                prop_assert!(kept.len() as u64 <= keep, "{kept:?}");
                prop_assert_eq!(kept.last().copied(), Some(seq));
                prop_assert!(kept.iter().all(|s| *s > deleted_events_to));
            }
        }
    }
}
