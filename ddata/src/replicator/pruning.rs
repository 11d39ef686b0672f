//! Pruning of removed nodes, so that counters and version vectors do not keep an entry for
//! every node that ever joined (Akka's protocol):
//!
//! 1. `max_pruning_dissemination` after a node's removal (time for its last updates to
//!    spread), the leader marks every key that still records it `Initialized { owner: leader,
//!    seen }`; the marker spreads with the data.
//! 2. Every replica adds itself to `seen` of the markers it holds.
//! 3. Once every member has seen a marker, the leader folds the removed node's entries into
//!    its own (`prune`) and marks the key `Performed`. From then on every replica drops the
//!    removed node's entries from any copy that arrives late (`prune_cleanup` on merge),
//!    until the marker expires after `pruning_marker_time_to_live`.

use super::{Replicator, Time};
use crate::envelope::{DataEnvelope, PruningState};
use std::collections::BTreeSet;
use tessera_cluster::{Address, UniqueAddress};

impl Replicator {
    /// One pruning step; runs every `pruning_interval`.
    pub(super) fn pruning_step(&mut self, time: Time) {
        let self_address = self.self_node.address.clone();
        let marked: Vec<String> = self.marked.iter().cloned().collect();
        for key in &marked {
            self.change_envelope(key, |envelope| {
                let mut changed = false;
                // Markers that expired go; initializations get this replica's mark.
                envelope.pruning.retain(|_, state| match state {
                    PruningState::Performed { obsolete_at_ms } => *obsolete_at_ms > time.wall_ms,
                    PruningState::Initialized { .. } => true,
                });
                for state in envelope.pruning.values_mut() {
                    if let PruningState::Initialized { seen, .. } = state {
                        changed |= seen.insert(self_address.clone());
                    }
                }
                changed
            });
        }
        if self.members.is_leader(&self.self_node) {
            self.initialize_pruning(time);
            self.perform_pruning(time);
        }
        let ttl = self.config.pruning_marker_time_to_live;
        self.members
            .removed
            .retain(|_, removed_at| time.now.saturating_duration_since(*removed_at) < ttl);
        let removed = &self.members.removed;
        self.pruning_pending
            .retain(|node| removed.contains_key(node));
    }

    /// Applies `change` to a copy of `key`'s envelope and stores it if `change` says it
    /// changed something.
    fn change_envelope(&mut self, key: &str, change: impl FnOnce(&mut DataEnvelope) -> bool) {
        let Some(mut envelope) = self.store.get(key).cloned() else {
            return;
        };
        let before = envelope.pruning.len();
        if change(&mut envelope) || envelope.pruning.len() != before {
            self.store_changed(key, envelope);
        }
    }

    fn is_member(&self, node: &UniqueAddress) -> bool {
        node == &self.self_node || self.members.receivers().any(|n| n == node)
    }

    /// Leader: marks the keys that record a removed node whose dissemination time passed.
    fn initialize_pruning(&mut self, time: Time) {
        let dissemination = self.config.max_pruning_dissemination;
        let due: Vec<UniqueAddress> = self
            .pruning_pending
            .iter()
            .filter(|node| {
                self.members
                    .removed
                    .get(*node)
                    .is_some_and(|at| time.now.saturating_duration_since(*at) >= dissemination)
            })
            .cloned()
            .collect();
        if due.is_empty() {
            return;
        }
        let keys: Vec<String> = self.store.iter().map(|(k, _)| k.clone()).collect();
        for removed in due {
            let mut initialized_any = false;
            for key in &keys {
                let Some(envelope) = self.store.get(key) else {
                    continue;
                };
                let Some(value) = &envelope.data else {
                    continue;
                };
                if !value.need_pruning_from(&removed) {
                    continue;
                }
                let start = match envelope.pruning.get(&removed) {
                    None => true,
                    // An initialization by a leader that is gone would never complete.
                    Some(PruningState::Initialized { owner, .. }) => {
                        owner != &self.self_node && !self.is_member(owner)
                    }
                    Some(PruningState::Performed { .. }) => false,
                };
                if start {
                    initialized_any = true;
                    let marker = PruningState::Initialized {
                        owner: self.self_node.clone(),
                        seen: BTreeSet::from([self.self_node.address.clone()]),
                    };
                    let removed = removed.clone();
                    self.change_envelope(key, move |envelope| {
                        envelope.pruning.insert(removed, marker);
                        true
                    });
                }
            }
            if !initialized_any {
                // Every key that records the node is marked (or done): nothing left to start.
                self.pruning_pending.remove(&removed);
            }
        }
    }

    /// Leader: prunes the keys whose markers it owns once every member has seen them.
    fn perform_pruning(&mut self, time: Time) {
        let everyone: BTreeSet<Address> = self
            .members
            .receivers()
            .map(|n| n.address.clone())
            .chain(std::iter::once(self.self_node.address.clone()))
            .collect();
        let obsolete_at_ms = time
            .wall_ms
            .saturating_add(self.config.pruning_marker_time_to_live.as_millis() as u64);
        let marked: Vec<String> = self.marked.iter().cloned().collect();
        let self_node = self.self_node.clone();
        for key in marked {
            self.change_envelope(&key, |envelope| {
                let ready: Vec<UniqueAddress> = envelope
                    .pruning
                    .iter()
                    .filter(|(_, state)| {
                        matches!(state,
                        PruningState::Initialized { owner, seen }
                            if owner == &self_node && everyone.is_subset(seen))
                    })
                    .map(|(node, _)| node.clone())
                    .collect();
                for removed in &ready {
                    if let Some(value) = &mut envelope.data {
                        value.prune(removed, &self_node);
                    }
                    envelope
                        .pruning
                        .insert(removed.clone(), PruningState::Performed { obsolete_at_ms });
                }
                !ready.is_empty()
            });
        }
    }
}
