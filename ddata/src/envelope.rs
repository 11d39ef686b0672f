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
    /// `owner` (the leader that started it, at wall-clock `epoch_ms`) waits until every
    /// member has seen this marker; `seen` holds the members that have.
    Initialized {
        owner: UniqueAddress,
        epoch_ms: u64,
        seen: BTreeSet<Address>,
    },
    /// `owner` folded the removed node's entries into its own. Until `obsolete_at_ms` (wall
    /// clock) every replica drops entries of the removed node from copies that arrive late.
    Performed { obsolete_at_ms: u64 },
}

impl PruningState {
    /// The merge of two markers for the same removed node: performed beats initialized; of
    /// two initializations the later one (by epoch, then owner) wins, so a new leader can
    /// take over a pruning its predecessor left unfinished; the same initialization unions
    /// its seen sets. Commutative, associative and idempotent.
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
                    epoch_ms: epoch_a,
                    seen: seen_a,
                },
                PruningState::Initialized {
                    owner: b,
                    epoch_ms: epoch_b,
                    seen: seen_b,
                },
            ) => match (epoch_a, a).cmp(&(epoch_b, b)) {
                std::cmp::Ordering::Equal => PruningState::Initialized {
                    owner: a.clone(),
                    epoch_ms: *epoch_a,
                    seen: seen_a.union(seen_b).cloned().collect(),
                },
                std::cmp::Ordering::Greater => self.clone(),
                std::cmp::Ordering::Less => other.clone(),
            },
        }
    }
}

/// Merges `other`'s pruning markers into `into`.
fn merge_markers(
    into: &mut BTreeMap<UniqueAddress, PruningState>,
    other: &BTreeMap<UniqueAddress, PruningState>,
) {
    for (node, state) in other {
        let merged = match into.get(node) {
            Some(existing) => existing.merge(state),
            None => state.clone(),
        };
        into.insert(node.clone(), merged);
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
    ///
    /// Two different kinds under one key (two nodes created the key concurrently with
    /// different types) resolve to the lower [`ValueKind`](crate::ValueKind), the same on
    /// every replica, so the key converges; [`kind_conflict`](Self::kind_conflict) tells a
    /// caller that wants to report it.
    pub fn merge(&self, other: &DataEnvelope) -> DataEnvelope {
        let (Some(mine), Some(theirs)) = (&self.data, &other.data) else {
            return DataEnvelope::deleted();
        };
        let mut pruning = self.pruning.clone();
        merge_markers(&mut pruning, &other.pruning);
        let mine = cleaned(mine, &pruning);
        let theirs = cleaned(theirs, &pruning);
        let data = match mine.merge(&theirs) {
            Ok(merged) => merged,
            Err(_) if theirs.kind() < mine.kind() => theirs,
            Err(_) => mine,
        };
        DataEnvelope {
            data: Some(data),
            pruning,
        }
    }

    /// The kinds of the two envelopes, when both hold values of different kinds.
    pub fn kind_conflict(&self, other: &DataEnvelope) -> Option<KindMismatch> {
        match (&self.data, &other.data) {
            (Some(mine), Some(theirs)) if mine.kind() != theirs.kind() => Some(KindMismatch {
                held: mine.kind(),
                offered: theirs.kind(),
            }),
            _ => None,
        }
    }

    /// Merges a delta of the value, made by a replica holding `pruning` markers, into this
    /// envelope: the markers first, then the delta, cleaned of pruned nodes.
    pub fn merge_delta(
        &mut self,
        delta: &ReplicatedValue,
        pruning: &BTreeMap<UniqueAddress, PruningState>,
    ) -> Result<(), KindMismatch> {
        if let Some(value) = &self.data
            && value.kind() != delta.kind()
        {
            return Err(KindMismatch {
                held: value.kind(),
                offered: delta.kind(),
            });
        }
        merge_markers(&mut self.pruning, pruning);
        let markers = &self.pruning;
        if let Some(value) = &mut self.data {
            value.merge_delta(&cleaned(delta, markers))?;
            // The delta may carry entries of a node pruned here since it was made, and this
            // copy may still hold entries of a node the sender's markers say was pruned.
            *value = cleaned(value, markers);
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
        assert!(live.merge(&DataEnvelope::deleted()).is_deleted());
        assert!(DataEnvelope::deleted().merge(&live).is_deleted());
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
        let merged = pruned.merge(&late);
        assert_eq!(value_of(&merged), 7, "node 9's 5 is not counted twice");
        assert!(!merged.data.as_ref().unwrap().need_pruning_from(&node(9)));
        let merged = late.merge(&pruned);
        assert_eq!(value_of(&merged), 7);
    }

    #[test]
    fn pruning_markers_merge_to_the_same_state_in_any_order() {
        let init = |owner: UniqueAddress, epoch_ms, seen: &[u16]| PruningState::Initialized {
            owner,
            epoch_ms,
            seen: seen.iter().map(|p| node(*p).address).collect(),
        };
        let a = init(node(1), 10, &[1]);
        let b = init(node(1), 10, &[2]);
        let later = init(node(3), 20, &[]);
        // Same address, another incarnation: still a total order.
        let restarted = init(UniqueAddress::new(node(1).address, 99), 10, &[3]);
        let done = PruningState::Performed { obsolete_at_ms: 5 };
        let all = [&a, &b, &later, &restarted, &done];
        for x in all {
            for y in all {
                assert_eq!(x.merge(y), y.merge(x), "{x:?} {y:?}");
                for z in all {
                    assert_eq!(x.merge(y).merge(z), x.merge(&y.merge(z)));
                }
            }
            assert_eq!(x.merge(x), x.clone());
        }
        assert_eq!(
            a.merge(&later),
            later,
            "a newer leader's initialization wins"
        );
        assert_eq!(a.merge(&done), done);
        assert!(matches!(a.merge(&b), PruningState::Initialized { seen, .. } if seen.len() == 2));
    }

    #[test]
    fn different_kinds_under_one_key_converge_to_the_lower_kind() {
        let counter = counter(&[(1, 1)]);
        let mut set = ORSet::new();
        set.add(&node(2), "x".to_string());
        let set = DataEnvelope::new(set.into());
        assert_eq!(counter.merge(&set), set.merge(&counter));
        assert!(counter.kind_conflict(&set).is_some());
        let winner = counter.merge(&set).data.unwrap().kind();
        assert_eq!(
            winner,
            counter
                .data
                .as_ref()
                .unwrap()
                .kind()
                .min(set.data.as_ref().unwrap().kind())
        );
    }

    #[test]
    fn a_delta_brings_the_pruning_markers_it_was_made_under() {
        // Node 1 pruned node 9 into itself and counted on: its delta is {1: 8}.
        let mut delta = GCounter::new();
        delta.increment(&node(1), 8);
        let markers = BTreeMap::from([(node(9), PruningState::Performed { obsolete_at_ms: 1 })]);
        // This replica has not seen the pruning yet: {1: 2, 9: 5}.
        let mut replica = counter(&[(1, 2), (9, 5)]);
        replica
            .merge_delta(&ReplicatedValue::from(delta), &markers)
            .unwrap();
        assert_eq!(
            value_of(&replica),
            8,
            "node 9's 5 lives on in node 1's 8 only"
        );
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
