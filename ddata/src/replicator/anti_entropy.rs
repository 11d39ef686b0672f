//! Anti-entropy between two Replicators, in four steps that only ship what differs:
//!
//! 1. `Status`: the initiator sends the digests of its non-empty chunks (a chunk's digest is
//!    the XOR of its keys' digests) — about 18 KiB for a million keys.
//! 2. `ChunkKeys`: the peer lists its keys and their digests for the chunks that differ, as
//!    many chunks as fit a message.
//! 3. `Gossip`: the initiator sends its state of every key that differs or the peer lacks,
//!    and names the keys it wants back.
//! 4. `Gossip`: the peer merges and sends back what was asked. When anything did not fit,
//!    the exchange is marked `more` and the initiator starts the next round at once instead
//!    of waiting a gossip interval, so a new node fills up at the speed of the network.
//!
//! A node runs at most one exchange it started per peer; an empty `ChunkKeys` (nothing
//! differs) or the final `Gossip` ends it.
//!
//! A replica at one of its limits ([`super::limits`]) asks for no key it lacks, and an
//! exchange in which it refused a state does not go on at once: otherwise two replicas would
//! trade the same refused states as fast as the network allows. It then receives at most one
//! message of states it refuses per exchange, that is per peer and gossip interval.

use super::protocol::{ChunkKeyList, ReplicatorMessage};
use super::{Replicator, Time};
use crate::envelope::DataEnvelope;
use rand::Rng;
use std::collections::{BTreeSet, HashMap};
use tessera_cluster::UniqueAddress;

/// Bytes a key list entry costs besides the key: its digest and framing.
const KEY_ENTRY_OVERHEAD_BYTES: usize = 20;

/// How long an exchange this node started may go unanswered before another may start with
/// the same peer, in gossip intervals.
const EXCHANGE_TIMEOUT_INTERVALS: u32 = 5;

impl Replicator {
    fn exchange_active(&self, time: Time, peer: &UniqueAddress) -> bool {
        self.exchanges.get(peer).is_some_and(|started| {
            time.now.saturating_duration_since(*started)
                < self.config.gossip_interval * EXCHANGE_TIMEOUT_INTERVALS
        })
    }

    /// Starts an anti-entropy round with a random member that has none running, preferring
    /// reachable ones.
    pub(super) fn gossip_to_random_peer(&mut self, time: Time) {
        let idle: Vec<UniqueAddress> = self
            .members
            .receivers()
            .filter(|n| !self.exchange_active(time, n))
            .cloned()
            .collect();
        let reachable: Vec<UniqueAddress> = idle
            .iter()
            .filter(|n| !self.members.unreachable.contains(*n))
            .cloned()
            .collect();
        let candidates = if reachable.is_empty() {
            idle
        } else {
            reachable
        };
        if candidates.is_empty() {
            return;
        }
        let peer = candidates[self.rng.random_range(0..candidates.len())].clone();
        self.start_exchange(time, &peer);
    }

    /// Starts an exchange with `peer` unless one is running: one at a time per peer, so that
    /// gossip rounds and continuations never pile up.
    pub(super) fn start_exchange(&mut self, time: Time, peer: &UniqueAddress) {
        if self.exchange_active(time, peer) {
            return;
        }
        self.exchanges.insert(peer.clone(), time.now);
        let chunks = self.store.chunk_digests();
        self.send(peer, ReplicatorMessage::Status { chunks });
    }

    /// Step 2: list the keys of the chunks that differ (an empty list ends the exchange).
    pub(super) fn on_status(&mut self, from: &UniqueAddress, theirs: Vec<(u16, u128)>) {
        let mine: HashMap<u16, u128> = self.store.chunk_digests().into_iter().collect();
        let theirs: HashMap<u16, u128> = theirs.into_iter().collect();
        let differing: BTreeSet<u16> = mine
            .iter()
            .filter(|(chunk, digest)| theirs.get(chunk) != Some(digest))
            .map(|(chunk, _)| *chunk)
            .chain(theirs.keys().filter(|c| !mine.contains_key(c)).copied())
            .collect();
        let mut lists = Vec::new();
        let mut more = false;
        if !differing.is_empty() {
            // Start at a random differing chunk, so that repeated truncated rounds do not
            // always list the same chunks first.
            let differing: Vec<u16> = differing.into_iter().collect();
            let start = self.rng.random_range(0..differing.len());
            let mut budget = self.config.max_message_bytes;
            for chunk in differing[start..].iter().chain(&differing[..start]) {
                let keys = self.store.chunk_keys(*chunk);
                let size: usize = 8 + keys
                    .iter()
                    .map(|(k, _)| k.len() + KEY_ENTRY_OVERHEAD_BYTES)
                    .sum::<usize>();
                if size > budget && !lists.is_empty() {
                    more = true;
                    break;
                }
                budget = budget.saturating_sub(size);
                lists.push(ChunkKeyList {
                    chunk: *chunk,
                    keys,
                });
            }
        }
        self.send(
            from,
            ReplicatorMessage::ChunkKeys {
                chunks: lists,
                more,
            },
        );
    }

    /// Step 3: send what differs, ask for what is missing here.
    pub(super) fn on_chunk_keys(
        &mut self,
        time: Time,
        from: &UniqueAddress,
        lists: Vec<ChunkKeyList>,
        more: bool,
    ) {
        let mut entries = Vec::new();
        let mut send_back = Vec::new();
        let mut budget = self.config.max_message_bytes;
        let mut truncated = false;
        // A full replica would refuse every key it lacks: it does not ask for them.
        let full = self.is_full();
        for list in lists {
            let theirs: HashMap<String, u128> = list.keys.into_iter().collect();
            let mine = self.store.chunk_keys(list.chunk);
            let mine_keys: BTreeSet<&String> = mine.iter().map(|(k, _)| k).collect();
            let wanted = theirs
                .keys()
                .filter(|k| !full && !mine_keys.contains(k))
                .cloned();
            for (key, digest) in &mine {
                let differs = match theirs.get(key) {
                    Some(d) if d == digest => continue,
                    Some(_) => true,
                    None => false,
                };
                if truncated {
                    continue;
                }
                let Some((envelope, size)) = self.store.get_with_size(key) else {
                    continue;
                };
                // Asking back costs the key's name here and its state in the answer.
                let cost = key.len()
                    + size
                    + KEY_ENTRY_OVERHEAD_BYTES
                    + if differs { key.len() + size } else { 0 };
                if cost > budget && !entries.is_empty() {
                    truncated = true;
                    continue;
                }
                budget = budget.saturating_sub(cost);
                entries.push((key.clone(), envelope.clone()));
                if differs {
                    send_back.push(key.clone());
                }
            }
            for key in wanted {
                if truncated {
                    break;
                }
                let cost = 2 * key.len() + KEY_ENTRY_OVERHEAD_BYTES;
                if cost > budget {
                    truncated = true;
                    break;
                }
                budget -= cost;
                send_back.push(key);
            }
        }
        let more = more || truncated;
        if entries.is_empty() && send_back.is_empty() && !more {
            // Nothing differs: the exchange is over.
            self.exchanges.remove(from);
            return;
        }
        self.exchanges.insert(from.clone(), time.now);
        self.send(
            from,
            ReplicatorMessage::Gossip {
                entries,
                send_back,
                reply_expected: true,
                more,
            },
        );
    }

    /// Steps 3 and 4 on the receiving side, and the end of an exchange on the initiator's.
    pub(super) fn on_gossip(
        &mut self,
        time: Time,
        from: &UniqueAddress,
        entries: Vec<(String, DataEnvelope)>,
        send_back: Vec<String>,
        reply_expected: bool,
        more: bool,
    ) {
        let mut refused = false;
        for (key, envelope) in &entries {
            refused |= self.merge_incoming(key, envelope).is_err();
        }
        if reply_expected {
            let (entries, truncated) = self.envelopes_within_budget(send_back);
            self.send(
                from,
                ReplicatorMessage::Gossip {
                    entries,
                    send_back: Vec::new(),
                    reply_expected: false,
                    // Going on at once would only bring the refused states again.
                    more: (more || truncated) && !refused,
                },
            );
        } else if more && !refused && !self.is_full() {
            // The exchange this node started did not finish: go on at once.
            self.exchanges.remove(from);
            self.start_exchange(time, from);
        } else {
            self.exchanges.remove(from);
        }
    }

    /// Answers a `DeltaGap`: the full state of the keys whose deltas the peer missed (as many
    /// as fit a message; anti-entropy brings any others).
    pub(super) fn send_full_state(&mut self, to: &UniqueAddress, keys: Vec<String>) {
        let (entries, _) = self.envelopes_within_budget(keys);
        if entries.is_empty() {
            return;
        }
        self.send(
            to,
            ReplicatorMessage::Gossip {
                entries,
                send_back: Vec::new(),
                reply_expected: false,
                more: false,
            },
        );
    }

    /// The envelopes of `keys` held here, as many as fit a message; and whether some did not.
    fn envelopes_within_budget(&self, keys: Vec<String>) -> (Vec<(String, DataEnvelope)>, bool) {
        let mut budget = self.config.max_message_bytes;
        let mut entries = Vec::new();
        for key in keys {
            if let Some((envelope, size)) = self.store.get_with_size(&key) {
                let cost = key.len() + size + KEY_ENTRY_OVERHEAD_BYTES;
                if cost > budget && !entries.is_empty() {
                    return (entries, true);
                }
                budget = budget.saturating_sub(cost);
                entries.push((key, envelope.clone()));
            }
        }
        (entries, false)
    }
}
