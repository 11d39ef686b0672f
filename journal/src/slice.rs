//! Slices: the fixed partition of every entity type's logs that the queries by slice and the
//! projections divide among themselves (docs/src/design.md §5 "Reading the acknowledged
//! logs").
//!
//! A log belongs to the entity type named before the first `|` of its persistence id
//! (`{type}|{id}`, as entities name their logs) and to slice
//! `xxh3_64(persistence id) mod 1024`. The number of slices is fixed for the life of a
//! cluster, and the hash is a published, versioned algorithm computed on the bytes alone: every
//! node and every release agrees on a log's slice. A projection of `n` instances gives each a
//! contiguous range ([`SliceRange::split`]); changing `n` moves range bounds, never a log to
//! another slice, so offsets kept per log stay valid.

use serde::{Deserialize, Serialize};
use std::fmt;

/// How many slices there are.
pub const SLICE_COUNT: u16 = 1024;

/// The separator between the entity type and the entity id in a persistence id.
pub const TYPE_SEPARATOR: char = '|';

/// The slice of a log.
pub fn slice_of(persistence_id: &str) -> u16 {
    (xxhash_rust::xxh3::xxh3_64(persistence_id.as_bytes()) % u64::from(SLICE_COUNT)) as u16
}

/// The entity type of a log: its persistence id up to the first `|` (the whole id if it has
/// none).
pub fn entity_type_of(persistence_id: &str) -> &str {
    persistence_id
        .split_once(TYPE_SEPARATOR)
        .map_or(persistence_id, |(entity_type, _)| entity_type)
}

/// A contiguous range of slices, `first..=last`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SliceRange {
    pub first: u16,
    pub last: u16,
}

/// A slice range that cannot be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SliceRangeError {
    #[error("slice range {first}..={last} is empty or reaches past slice {max}", max = SLICE_COUNT - 1)]
    Bounds { first: u16, last: u16 },
    #[error(
        "{instances} instances cannot divide {SLICE_COUNT} slices: between 1 and {SLICE_COUNT}"
    )]
    Instances { instances: u32 },
}

impl SliceRange {
    /// Every slice.
    pub const ALL: SliceRange = SliceRange {
        first: 0,
        last: SLICE_COUNT - 1,
    };

    /// `first..=last`, checked.
    pub fn new(first: u16, last: u16) -> Result<Self, SliceRangeError> {
        if first > last || last >= SLICE_COUNT {
            return Err(SliceRangeError::Bounds { first, last });
        }
        Ok(SliceRange { first, last })
    }

    /// Whether `slice` is in the range.
    pub fn contains(&self, slice: u16) -> bool {
        (self.first..=self.last).contains(&slice)
    }

    /// Whether the log `persistence_id` is in the range.
    pub fn holds(&self, persistence_id: &str) -> bool {
        self.contains(slice_of(persistence_id))
    }

    /// The slices divided into `instances` contiguous ranges as equal as they can be, in
    /// order: instance `i` reads the `i`-th. With a power of two they are Akka's (4: 0–255,
    /// 256–511, 512–767, 768–1023), and doubling the instances splits each range in two.
    pub fn split(instances: u32) -> Result<Vec<SliceRange>, SliceRangeError> {
        if instances == 0 || instances > u32::from(SLICE_COUNT) {
            return Err(SliceRangeError::Instances { instances });
        }
        let total = u32::from(SLICE_COUNT);
        Ok((0..instances)
            .map(|i| SliceRange {
                first: (i * total / instances) as u16,
                last: ((i + 1) * total / instances - 1) as u16,
            })
            .collect())
    }
}

impl fmt::Display for SliceRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slice_of_a_log_is_fixed_forever() {
        // Computed once and written down: a change here moves every log of every cluster
        // to another slice, and every projection's offsets with it.
        assert_eq!(slice_of("account|1"), slice_of("account|1"));
        let fixed: Vec<u16> = ["account|1", "account|2", "cart|alice", ""]
            .iter()
            .map(|pid| slice_of(pid))
            .collect();
        assert_eq!(fixed, FIXED_SLICES);
    }

    const FIXED_SLICES: [u16; 4] = [453, 780, 656, 194];

    #[test]
    fn entity_types_are_named_before_the_first_separator() {
        assert_eq!(entity_type_of("account|1"), "account");
        assert_eq!(entity_type_of("account|a|b"), "account");
        assert_eq!(entity_type_of("plain"), "plain");
    }

    #[test]
    fn ranges_divide_every_slice_once() {
        let four = SliceRange::split(4).unwrap();
        assert_eq!(
            four,
            vec![
                SliceRange {
                    first: 0,
                    last: 255
                },
                SliceRange {
                    first: 256,
                    last: 511
                },
                SliceRange {
                    first: 512,
                    last: 767
                },
                SliceRange {
                    first: 768,
                    last: 1023
                },
            ]
        );
        for n in [1, 3, 7, 1000, 1024] {
            let ranges = SliceRange::split(n).unwrap();
            assert_eq!(ranges.len(), n as usize);
            assert_eq!(ranges[0].first, 0);
            assert_eq!(ranges.last().unwrap().last, SLICE_COUNT - 1);
            for pair in ranges.windows(2) {
                assert_eq!(pair[1].first, pair[0].last + 1);
            }
        }
        assert!(SliceRange::split(0).is_err());
        assert!(SliceRange::split(1025).is_err());
        assert!(SliceRange::new(5, 4).is_err());
        assert!(SliceRange::new(0, 1024).is_err());
    }
}
