//! Read and write consistency levels, and how many replicas each needs.

use serde::{Deserialize, Serialize};

/// How many replicas a read consults, this node included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReadConsistency {
    /// This node's replica only.
    Local,
    /// `n` replicas (at most all).
    From(usize),
    /// A majority of the members that count, and at least `min_cap` of them.
    Majority { min_cap: usize },
    /// Every member that counts.
    All,
    /// A majority plus `additional` members (at most all), and at least `min_cap` (Akka's
    /// `ReadMajorityPlus`): read together with [`WriteConsistency::MajorityPlus`] it still
    /// overlaps the last write when membership changed between the two.
    MajorityPlus { additional: usize, min_cap: usize },
}

/// How many replicas must acknowledge a write, this node included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WriteConsistency {
    /// This node's replica only.
    Local,
    /// `n` replicas (at most all).
    To(usize),
    /// A majority of the members that count, and at least `min_cap` of them.
    Majority { min_cap: usize },
    /// Every member that counts.
    All,
    /// A majority plus `additional` members (at most all), and at least `min_cap` (Akka's
    /// `WriteMajorityPlus`).
    MajorityPlus { additional: usize, min_cap: usize },
}

impl ReadConsistency {
    /// Every [`ReadConsistency::label`], in order.
    pub const LABELS: [&'static str; 5] = ["local", "from", "majority", "majority_plus", "all"];

    /// The level's name without its numbers (Akka's `ReadLocal`, `ReadFrom`, ...): a metrics
    /// label, one of [`ReadConsistency::LABELS`].
    pub fn label(self) -> &'static str {
        match self {
            ReadConsistency::Local => "local",
            ReadConsistency::From(_) => "from",
            ReadConsistency::Majority { .. } => "majority",
            ReadConsistency::MajorityPlus { .. } => "majority_plus",
            ReadConsistency::All => "all",
        }
    }

    /// Replicas needed, this node included, when `counted` members count (this node
    /// included).
    pub fn required(self, counted: usize) -> usize {
        required(counted, self.into())
    }
}

impl WriteConsistency {
    /// Every [`WriteConsistency::label`], in order.
    pub const LABELS: [&'static str; 5] = ["local", "to", "majority", "majority_plus", "all"];

    /// The level's name without its numbers (Akka's `WriteLocal`, `WriteTo`, ...): a metrics
    /// label, one of [`WriteConsistency::LABELS`].
    pub fn label(self) -> &'static str {
        match self {
            WriteConsistency::Local => "local",
            WriteConsistency::To(_) => "to",
            WriteConsistency::Majority { .. } => "majority",
            WriteConsistency::MajorityPlus { .. } => "majority_plus",
            WriteConsistency::All => "all",
        }
    }

    /// Replicas needed, this node included, when `counted` members count (this node
    /// included).
    pub fn required(self, counted: usize) -> usize {
        required(counted, self.into())
    }
}

/// The shape both consistencies share.
enum Level {
    Local,
    N(usize),
    Majority(usize),
    All,
    MajorityPlus(usize, usize),
}

impl From<ReadConsistency> for Level {
    fn from(c: ReadConsistency) -> Self {
        match c {
            ReadConsistency::Local => Level::Local,
            ReadConsistency::From(n) => Level::N(n),
            ReadConsistency::Majority { min_cap } => Level::Majority(min_cap),
            ReadConsistency::All => Level::All,
            ReadConsistency::MajorityPlus {
                additional,
                min_cap,
            } => Level::MajorityPlus(additional, min_cap),
        }
    }
}

impl From<WriteConsistency> for Level {
    fn from(c: WriteConsistency) -> Self {
        match c {
            WriteConsistency::Local => Level::Local,
            WriteConsistency::To(n) => Level::N(n),
            WriteConsistency::Majority { min_cap } => Level::Majority(min_cap),
            WriteConsistency::All => Level::All,
            WriteConsistency::MajorityPlus {
                additional,
                min_cap,
            } => Level::MajorityPlus(additional, min_cap),
        }
    }
}

/// Unreachable members still count: a write acknowledged by a majority of the reachable side
/// of a partition would be no majority at all.
fn required(counted: usize, level: Level) -> usize {
    let counted = counted.max(1);
    match level {
        Level::Local => 1,
        Level::N(n) => n.clamp(1, counted),
        Level::Majority(min_cap) => (counted / 2 + 1).max(min_cap.min(counted)),
        Level::All => counted,
        Level::MajorityPlus(additional, min_cap) => (counted / 2 + 1)
            .saturating_add(additional)
            .max(min_cap)
            .min(counted),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_level_has_one_of_the_listed_labels() {
        let reads = [
            ReadConsistency::Local,
            ReadConsistency::From(2),
            ReadConsistency::Majority { min_cap: 0 },
            ReadConsistency::MajorityPlus {
                additional: 1,
                min_cap: 0,
            },
            ReadConsistency::All,
        ];
        assert_eq!(reads.map(ReadConsistency::label), ReadConsistency::LABELS);
        let writes = [
            WriteConsistency::Local,
            WriteConsistency::To(2),
            WriteConsistency::Majority { min_cap: 0 },
            WriteConsistency::MajorityPlus {
                additional: 1,
                min_cap: 0,
            },
            WriteConsistency::All,
        ];
        assert_eq!(
            writes.map(WriteConsistency::label),
            WriteConsistency::LABELS
        );
    }

    #[test]
    fn majority_is_more_than_half_and_honours_min_cap() {
        let majority = WriteConsistency::Majority { min_cap: 0 };
        assert_eq!(majority.required(1), 1);
        assert_eq!(majority.required(2), 2);
        assert_eq!(majority.required(3), 2);
        assert_eq!(majority.required(4), 3);
        assert_eq!(majority.required(5), 3);
        let capped = ReadConsistency::Majority { min_cap: 4 };
        assert_eq!(capped.required(5), 4);
        assert_eq!(capped.required(3), 3, "min_cap never exceeds the members");
    }

    #[test]
    fn a_read_and_a_write_majority_always_overlap() {
        for n in 1..50 {
            let w = WriteConsistency::Majority { min_cap: 0 }.required(n);
            let r = ReadConsistency::Majority { min_cap: 0 }.required(n);
            assert!(w + r > n, "n={n}");
        }
    }

    #[test]
    fn majority_plus_adds_members_up_to_all() {
        let plus = WriteConsistency::MajorityPlus {
            additional: 3,
            min_cap: 5,
        };
        assert_eq!(plus.required(3), 3);
        assert_eq!(plus.required(5), 5);
        assert_eq!(plus.required(9), 8);
        assert_eq!(plus.required(20), 14);
        let read = ReadConsistency::MajorityPlus {
            additional: 5,
            min_cap: 5,
        };
        assert_eq!(read.required(20), 16);
    }

    #[test]
    fn fixed_counts_are_capped_by_the_members() {
        assert_eq!(WriteConsistency::To(5).required(3), 3);
        assert_eq!(WriteConsistency::To(0).required(3), 1);
        assert_eq!(ReadConsistency::From(2).required(3), 2);
        assert_eq!(ReadConsistency::All.required(4), 4);
        assert_eq!(ReadConsistency::Local.required(4), 1);
    }
}
