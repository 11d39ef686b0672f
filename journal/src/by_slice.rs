//! What a query by slice returns and resumes from: envelopes of one log's events in sequence
//! order, and an offset that is the sequence number delivered last per log (docs/src/design.md
//! §5 "Reading the acknowledged logs").

use crate::record::PersistentRepr;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One event found by slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceEnvelope {
    /// Its slice ([`crate::slice::slice_of`] of its persistence id).
    pub slice: u16,
    /// The event; `event.sequence_nr` is the log's offset plus one.
    pub event: PersistentRepr,
    /// The tags it was written with.
    pub tags: Vec<String>,
}

/// An item of a query by slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SliceItem {
    /// The next event of its log.
    Event(SliceEnvelope),
    /// Events `from..=to` of the log were deleted (a snapshot's retention) from every replica
    /// the query could read before it got to them: the offset moves past them.
    Deleted {
        persistence_id: String,
        from: u64,
        to: u64,
    },
}

impl SliceItem {
    /// The log the item is of.
    pub fn persistence_id(&self) -> &str {
        match self {
            SliceItem::Event(envelope) => &envelope.event.persistence_id,
            SliceItem::Deleted { persistence_id, .. } => persistence_id,
        }
    }

    /// The sequence number the log's offset is at once the item is handled.
    pub fn sequence_nr(&self) -> u64 {
        match self {
            SliceItem::Event(envelope) => envelope.event.sequence_nr,
            SliceItem::Deleted { to, .. } => *to,
        }
    }
}

/// Where a query by slice resumes: per log, the sequence number handled last (a log not in
/// it starts from its first event). Serializable, so that it can be stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceOffset {
    seqs: BTreeMap<String, u64>,
}

impl SliceOffset {
    /// No event handled yet: from the start of every log.
    pub fn start() -> Self {
        SliceOffset::default()
    }

    /// The sequence number handled last of a log (0: none).
    pub fn get(&self, persistence_id: &str) -> u64 {
        self.seqs.get(persistence_id).copied().unwrap_or(0)
    }

    /// Records that the log was handled up to `sequence_nr`. Returns false, changing
    /// nothing, when it was already handled that far: a repeat to skip.
    pub fn advance(&mut self, persistence_id: &str, sequence_nr: u64) -> bool {
        self.advance_from(persistence_id, sequence_nr).is_some()
    }

    /// As [`SliceOffset::advance`], returning where the log was before it moved (0: not
    /// handled at all), or nothing for a repeat.
    pub fn advance_from(&mut self, persistence_id: &str, sequence_nr: u64) -> Option<u64> {
        match self.seqs.get_mut(persistence_id) {
            Some(seq) if *seq >= sequence_nr => None,
            Some(seq) => Some(std::mem::replace(seq, sequence_nr)),
            None => {
                self.seqs.insert(persistence_id.to_string(), sequence_nr);
                Some(0)
            }
        }
    }

    /// Records an item (see [`SliceOffset::advance`]).
    pub fn advance_past(&mut self, item: &SliceItem) -> bool {
        self.advance(item.persistence_id(), item.sequence_nr())
    }

    /// Every log's sequence number handled last, in log order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.seqs.iter().map(|(pid, seq)| (pid.as_str(), *seq))
    }

    /// Logs it knows.
    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Takes in `other`'s logs, keeping the higher of two sequence numbers.
    pub fn merge(&mut self, other: &SliceOffset) {
        for (pid, seq) in other.iter() {
            self.advance(pid, seq);
        }
    }

    /// Only the logs `keep` holds (an instance's slice range after a rescale).
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.seqs.retain(|pid, _| keep(pid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offset_moves_forward_only_and_tells_repeats() {
        let mut offset = SliceOffset::start();
        assert!(offset.advance("a|1", 1));
        assert!(offset.advance("a|1", 2));
        assert!(!offset.advance("a|1", 2));
        assert!(!offset.advance("a|1", 1));
        assert_eq!(offset.get("a|1"), 2);
        assert_eq!(offset.get("a|2"), 0);
        let mut other = SliceOffset::start();
        other.advance("a|1", 5);
        other.advance("a|3", 1);
        offset.merge(&other);
        assert_eq!(offset.get("a|1"), 5);
        assert_eq!(offset.len(), 2);
    }
}
