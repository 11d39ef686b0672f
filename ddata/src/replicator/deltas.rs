//! Delta propagation: the changes of local updates, merged per key, go to every member every
//! `delta_propagation_interval`, with the sender's sequence numbers and pruning markers.
//!
//! A delta is a state of its type's lattice, so joining it is always safe, in any order. The
//! sequence numbers only tell a receiver that it missed some (a lost message): it applies
//! what it got and asks for the key's full state.

use super::limits::Origin;
use super::protocol::{DeltaEntry, ReplicatorMessage};
use super::{Replicator, split_by_size};
use crate::codec;
use crate::envelope::DataEnvelope;
use crate::value::ReplicatedValue;
use std::collections::HashMap;
use tessera_cluster::UniqueAddress;

impl Replicator {
    pub(super) fn record_delta(&mut self, key: &str, delta: ReplicatedValue) {
        let seq = self.own_delta_seq.entry(key.to_string()).or_insert(0);
        *seq += 1;
        let seq = *seq;
        match self.pending_deltas.get_mut(key) {
            Some(entry) => {
                // Deltas combine by merge; a kind mismatch cannot happen (the update checked).
                if let Ok(merged) = entry.delta.merge(&delta) {
                    entry.delta = merged;
                }
                entry.to_seq = seq;
            }
            None => {
                self.pending_deltas.insert(
                    key.to_string(),
                    DeltaEntry {
                        key: key.to_string(),
                        from_seq: seq,
                        to_seq: seq,
                        delta,
                        pruning: Default::default(),
                    },
                );
            }
        }
    }

    /// Sends the accumulated deltas to every member, in messages below the size bound.
    pub(super) fn propagate_deltas(&mut self) {
        if self.pending_deltas.is_empty() {
            return;
        }
        let receivers: Vec<UniqueAddress> = self.members.receivers().cloned().collect();
        let mut deltas: Vec<DeltaEntry> = std::mem::take(&mut self.pending_deltas)
            .into_values()
            .collect();
        if receivers.is_empty() {
            return;
        }
        for entry in &mut deltas {
            if let Some(envelope) = self.store.get(&entry.key) {
                entry.pruning = envelope.pruning.clone();
            }
        }
        for batch in split_by_size(deltas, self.config.max_message_bytes, |d| {
            d.key.len() + codec::encode("delta", &d.delta).map_or(0, |b| b.len()) + 24
        }) {
            for node in &receivers {
                self.send(
                    node,
                    ReplicatorMessage::Deltas {
                        incarnation: self.incarnation,
                        deltas: batch.clone(),
                    },
                );
            }
        }
    }

    pub(super) fn on_deltas(
        &mut self,
        from: UniqueAddress,
        incarnation: u64,
        deltas: Vec<DeltaEntry>,
    ) {
        let mut gaps = Vec::new();
        for entry in deltas {
            let seqs = self
                .incoming_delta_seq
                .entry(from.clone())
                .or_insert_with(|| (incarnation, HashMap::new()));
            if seqs.0 != incarnation {
                // The sender's Replicator restarted: its numbering starts again.
                *seqs = (incarnation, HashMap::new());
            }
            let last = seqs.1.get(&entry.key).copied().unwrap_or(0);
            if entry.to_seq <= last {
                continue;
            }
            // Missed deltas of this sender: fetch the key's full state. (A key this node has
            // never held arriving with sequence number 1 is the sender's first change of it;
            // if the key is older than that, anti-entropy brings the rest.)
            let gap = entry.from_seq > last + 1;
            let merged = match self.store.get(&entry.key) {
                Some(local) if local.is_deleted() => None,
                Some(local) => {
                    let mut merged = local.clone();
                    let changed = merged.merge_delta(&entry.delta, &entry.pruning).is_ok()
                        && &merged != local;
                    changed.then_some(merged)
                }
                // A delta is a state of its lattice: joined with nothing it is the state.
                None => {
                    let mut value = entry.delta;
                    value.reset_delta();
                    let mut envelope = DataEnvelope::new(value);
                    envelope.pruning = entry.pruning;
                    Some(envelope)
                }
            };
            if let Some(merged) = merged
                && self
                    .store_checked(&entry.key, merged, Origin::Remote)
                    .is_err()
            {
                // Refused at a limit: neither the sequence number nor the gap is noted, so
                // that a later delta (once there is room) fetches the whole state again.
                continue;
            }
            if gap {
                gaps.push(entry.key.clone());
            }
            if let Some((_, seqs)) = self.incoming_delta_seq.get_mut(&from) {
                seqs.insert(entry.key, entry.to_seq);
            }
        }
        if !gaps.is_empty() {
            self.send(&from, ReplicatorMessage::DeltaGap { keys: gaps });
        }
    }
}
