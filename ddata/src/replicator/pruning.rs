//! Pruning of removed nodes, so that counters and version vectors do not keep an entry for
//! every node that ever joined (Akka's protocol):
//!
//! 1. The leader scans the data (a slice of the chunks per step) for nodes that are not
//!    members, whether it saw them leave or not. `max_pruning_dissemination` after it first
//!    knew a node gone (time for its last updates to spread), it marks every key that still
//!    records it `Initialized { owner: leader, epoch, seen }`; the marker spreads with the
//!    data, and a later leader's marker (higher epoch) takes over an unfinished one.
//! 2. Every replica adds itself to `seen` of the markers it holds.
//! 3. Once every member has seen a marker, its owner folds the removed node's entries into
//!    its own (`prune`) and marks the key `Performed`. From then on every replica drops the
//!    removed node's entries from any copy that arrives late (`prune_cleanup` on merge),
//!    until the marker expires after `pruning_marker_time_to_live` (longer for durable keys,
//!    which a node down for long brings back from disk).

use super::store::CHUNKS;
use super::{Replicator, Time};
use crate::codec;
use crate::envelope::{DataEnvelope, PruningState};
use std::collections::BTreeSet;
use tessera_cluster::{Address, UniqueAddress};

/// Chunks the leader scans for removed nodes per pruning step: a full pass takes eight steps,
/// so a step's cost stays a fraction of the store's size.
const SCAN_CHUNKS_PER_STEP: usize = CHUNKS / 8;

impl Replicator {
    /// One pruning step; runs every `pruning_interval`.
    pub(super) fn pruning_step(&mut self, time: Time) {
        let self_address = self.self_node.address.clone();
        let marked: Vec<String> = self.marked.iter().cloned().collect();
        for key in &marked {
            self.change_envelope(key, |envelope| {
                // Markers that expired go; initializations get this replica's mark.
                envelope.pruning.retain(|_, state| match state {
                    PruningState::Performed { obsolete_at_ms } => *obsolete_at_ms > time.wall_ms,
                    PruningState::Initialized { .. } => true,
                });
                let mut changed = false;
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
    }

    /// Applies `change` to a copy of `key`'s envelope and stores it if `change` says it
    /// changed something (or dropped markers).
    fn change_envelope(&mut self, key: &str, change: impl FnOnce(&mut DataEnvelope) -> bool) {
        let Some(mut envelope) = self.store.get(key).cloned() else {
            return;
        };
        let before = envelope.pruning.len();
        if change(&mut envelope) || envelope.pruning.len() != before {
            // Not checked against the limits: pruning shrinks a state, but for a marker of a
            // few bytes, and must be able to finish on every replica.
            let size_bytes = codec::encoded_size("data envelope", &envelope).unwrap_or(0);
            self.store_changed(key, envelope, size_bytes);
        }
    }

    fn is_member(&self, node: &UniqueAddress) -> bool {
        node == &self.self_node || self.members.receivers().any(|n| n == node)
    }

    /// Leader: marks the keys of the next slice of chunks that record a node gone for longer
    /// than the dissemination time.
    fn initialize_pruning(&mut self, time: Time) {
        let start = self.prune_scan_cursor;
        self.prune_scan_cursor = (start + SCAN_CHUNKS_PER_STEP) % CHUNKS;
        let keys = self
            .store
            .keys_in_chunks(start..start + SCAN_CHUNKS_PER_STEP);
        let dissemination = self.config.max_pruning_dissemination;
        for key in keys {
            let Some(envelope) = self.store.get(&key) else {
                continue;
            };
            let Some(value) = &envelope.data else {
                continue;
            };
            let mut start_for = Vec::new();
            for node in value.modified_by_nodes() {
                if self.is_member(&node) {
                    continue;
                }
                let removed_at = *self.members.removed.entry(node.clone()).or_insert(time.now);
                if time.now.saturating_duration_since(removed_at) < dissemination {
                    continue;
                }
                let start = match envelope.pruning.get(&node) {
                    None => true,
                    // An unfinished pruning of another (former) leader is taken over.
                    Some(PruningState::Initialized { owner, .. }) => owner != &self.self_node,
                    Some(PruningState::Performed { .. }) => false,
                };
                if start {
                    start_for.push(node);
                }
            }
            if start_for.is_empty() {
                continue;
            }
            let marker = PruningState::Initialized {
                owner: self.self_node.clone(),
                epoch_ms: time.wall_ms,
                seen: BTreeSet::from([self.self_node.address.clone()]),
            };
            self.change_envelope(&key, move |envelope| {
                for node in start_for {
                    envelope.pruning.insert(node, marker.clone());
                }
                true
            });
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
        let marked: Vec<String> = self.marked.iter().cloned().collect();
        let self_node = self.self_node.clone();
        for key in marked {
            let ttl = if self.config.is_durable(&key) {
                self.config.durable_pruning_marker_time_to_live
            } else {
                self.config.pruning_marker_time_to_live
            };
            let obsolete_at_ms = time.wall_ms.saturating_add(ttl.as_millis() as u64);
            self.change_envelope(&key, |envelope| {
                let ready: Vec<UniqueAddress> = envelope
                    .pruning
                    .iter()
                    .filter(|(_, state)| {
                        matches!(state,
                        PruningState::Initialized { owner, seen, .. }
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
