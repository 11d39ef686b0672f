//! [`DataEnvelope`]: what the Replicator stores and ships per key — the value (or the fact
//! that the key was deleted) and the state of pruning removed nodes out of it.

use crate::codec;
use crate::value::{KindMismatch, ReplicatedValue};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use tessera_cluster::{Address, UniqueAddress};

/// Where the pruning of one removed node from one key stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PruningState {
    /// `owner` (the leader that started it) waits until every member has seen this marker;
    /// `seen` holds the members that have.
    Initialized {
        owner: UniqueAddress,
        seen: BTreeSet<Address>,
    },
    /// `owner` folded the removed node's entries into its own. Until `obsolete_at_ms` (wall
    /// clock) every replica drops entries of the removed node from copies that arrive late.
    Performed { obsolete_at_ms: u64 },
}

impl PruningState {
    /// The merge of two markers for the same removed node: performed beats initialized;
    /// two initializations by the same owner union their seen sets; of two owners, the one
    /// with the lower address wins (every replica picks the same).
    fn merge(&self, other: &PruningState) -> PruningState {
        match (self, other) {
            (
                PruningState::Performed { obsolete_at_ms: a },
                PruningState::Performed { obsolete_at_ms: b },
            ) => PruningState::Performed {
                obsolete_at_ms: (*a).max(*b),
            },
            (PruningState::Performed { .. }, _) => self.clone(),
            (_, PruningState::Performed { .. }) => other.clone(),
            (
                PruningState::Initialized {
                    owner: a,
                    seen: seen_a,
                },
                PruningState::Initialized {
                    owner: b,
                    seen: seen_b,
                },
            ) => {
                if a == b {
                    PruningState::Initialized {
                        owner: a.clone(),
                        seen: seen_a.union(seen_b).cloned().collect(),
                    }
                } else if a.address <= b.address {
                    self.clone()
                } else {
                    other.clone()
                }
            }
        }
    }
}

/// A key's replicated state: its value, or `None` once the key was deleted (a deleted key
/// stays deleted: deletion wins every merge), and pruning markers per removed node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataEnvelope {
    pub data: Option<ReplicatedValue>,
    pub pruning: BTreeMap<UniqueAddress, PruningState>,
}

impl DataEnvelope {
    /// An envelope holding `value` without pruning markers.
    pub fn new(value: ReplicatedValue) -> Self {
        DataEnvelope {
            data: Some(value),
            pruning: BTreeMap::new(),
        }
    }

    /// The envelope of a deleted key.
    pub fn deleted() -> Self {
        DataEnvelope {
            data: None,
            pruning: BTreeMap::new(),
        }
    }

    /// Whether the key was deleted.
    pub fn is_deleted(&self) -> bool {
        self.data.is_none()
    }

    /// The merge of two envelopes of one key. Each side's value is first cleaned of nodes the
    /// other side's markers say were pruned, so a late copy cannot bring a pruned node back.
    pub fn merge(&self, other: &DataEnvelope) -> Result<DataEnvelope, KindMismatch> {
        let (Some(mine), Some(theirs)) = (&self.data, &other.data) else {
            return Ok(DataEnvelope::deleted());
        };
        let mut pruning = self.pruning.clone();
        for (node, state) in &other.pruning {
            let merged = match pruning.get(node) {
                Some(existing) => existing.merge(state),
                None => state.clone(),
            };
            pruning.insert(node.clone(), merged);
        }
        let mine = cleaned(mine, &pruning);
        let theirs = cleaned(theirs, &pruning);
        Ok(DataEnvelope {
            data: Some(mine.merge(&theirs)?),
            pruning,
        })
    }

    /// Merges a delta of the value into this envelope (cleaned of pruned nodes first).
    pub fn merge_delta(&mut self, delta: &ReplicatedValue) -> Result<(), KindMismatch> {
        let pruning = &self.pruning;
        if let Some(value) = &mut self.data {
            let delta = cleaned(delta, pruning);
            value.merge_delta(&delta)?;
            // A delta can carry entries of a node pruned here since it was made.
            *value = cleaned(value, pruning);
        }
        Ok(())
    }

    /// The first 16 bytes of blake3 over the key and the envelope's encoding (replicas with
    /// equal digests hold equal state), and the encoding's length.
    pub fn digest(&self, key: &str) -> (u128, usize) {
        // Every type here encodes (see `codec::encode`); were one not to, all replicas would
        // agree on the empty encoding's digest and anti-entropy would skip the key rather
        // than fail.
        let encoded = codec::encode("data envelope", self).unwrap_or_default();
        let mut hasher = blake3::Hasher::new();
        hasher.update(&(key.len() as u64).to_be_bytes());
        hasher.update(key.as_bytes());
        hasher.update(&encoded);
        let mut first = [0u8; 16];
        first.copy_from_slice(&hasher.finalize().as_bytes()[..16]);
        (u128::from_be_bytes(first), encoded.len())
    }
}

/// `value` without the nodes that `pruning` marks as pruned.
fn cleaned(
    value: &ReplicatedValue,
    pruning: &BTreeMap<UniqueAddress, PruningState>,
) -> ReplicatedValue {
    let mut value = value.clone();
    for (removed, state) in pruning {
        if matches!(state, PruningState::Performed { .. }) && value.need_pruning_from(removed) {
            value.prune_cleanup(removed);
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GCounter, ORSet};

    fn node(port: u16) -> UniqueAddress {
        UniqueAddress::new(Address::new("127.0.0.1", port), u64::from(port))
    }

    fn counter(entries: &[(u16, u64)]) -> DataEnvelope {
        let mut c = GCounter::new();
        for (n, count) in entries {
            c.increment(&node(*n), *count);
        }
        DataEnvelope::new(c.into())
    }

    fn value_of(envelope: &DataEnvelope) -> u128 {
        match &envelope.data {
            Some(ReplicatedValue::GCounter(c)) => c.value(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn deletion_wins_every_merge() {
        let live = counter(&[(1, 1)]);
        assert!(live.merge(&DataEnvelope::deleted()).unwrap().is_deleted());
        assert!(DataEnvelope::deleted().merge(&live).unwrap().is_deleted());
    }

    #[test]
    fn a_late_copy_cannot_bring_back_a_pruned_node() {
        // Node 9 was removed; the leader (node 1) folded its 5 into its own entry.
        let mut pruned = counter(&[(1, 2), (9, 5)]);
        if let Some(value) = &mut pruned.data {
            value.prune(&node(9), &node(1));
        }
        pruned.pruning.insert(
            node(9),
            PruningState::Performed {
                obsolete_at_ms: 1_000,
            },
        );
        assert_eq!(value_of(&pruned), 7);
        // A copy from before the pruning still counts node 9.
        let late = counter(&[(1, 2), (9, 5)]);
        let merged = pruned.merge(&late).unwrap();
        assert_eq!(value_of(&merged), 7, "node 9's 5 is not counted twice");
        assert!(!merged.data.as_ref().unwrap().need_pruning_from(&node(9)));
        let merged = late.merge(&pruned).unwrap();
        assert_eq!(value_of(&merged), 7);
    }

    #[test]
    fn pruning_markers_merge_to_the_same_state_in_any_order() {
        let a = PruningState::Initialized {
            owner: node(1),
            seen: BTreeSet::from([node(1).address]),
        };
        let b = PruningState::Initialized {
            owner: node(1),
            seen: BTreeSet::from([node(2).address]),
        };
        let c = PruningState::Initialized {
            owner: node(3),
            seen: BTreeSet::new(),
        };
        let done = PruningState::Performed { obsolete_at_ms: 5 };
        assert_eq!(a.merge(&b), b.merge(&a));
        assert_eq!(a.merge(&c), c.merge(&a));
        assert_eq!(a.merge(&done), done);
        assert_eq!(done.merge(&c), done);
        assert!(matches!(a.merge(&b), PruningState::Initialized { seen, .. } if seen.len() == 2));
    }

    #[test]
    fn digests_differ_by_key_and_by_state() {
        let mut set = ORSet::new();
        set.add(&node(1), "x".to_string());
        let one = DataEnvelope::new(set.clone().into());
        set.add(&node(1), "y".to_string());
        let two = DataEnvelope::new(set.into());
        assert_eq!(one.digest("k"), one.clone().digest("k"));
        assert_ne!(one.digest("k").0, one.digest("j").0);
        assert_ne!(one.digest("k").0, two.digest("k").0);
    }
}
