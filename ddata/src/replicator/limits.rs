//! What one replica may hold: at most `max_keys` keys (deleted ones included: a deleted key
//! stays as its tombstone), no state larger than `max_value_bytes` encoded, and at most
//! `max_total_bytes` of keys and encoded states together.
//!
//! Every change goes through [`Replicator::store_checked`]: a local update or delete beyond
//! a limit is refused with [`LimitExceeded`] and changes nothing; a state arriving from a
//! peer (a write, a read repair, a delta, anti-entropy) beyond a limit is refused the same
//! way, counted, and this replica keeps what it held. The CRDT laws still hold for every key
//! held: a refused state is one this replica does not take in, never a wrong merge. A key
//! refused here is missing from this replica only (it answers reads of it as not found and
//! does not acknowledge writes of it), and a held key whose merged state would exceed a
//! limit stays at its last admitted state here, counted each time a peer offers more.
//! Pruning changes and the keys loaded from disk at start are not checked: the first
//! only ever shrinks what was admitted (but for a marker of a few bytes), and refusing the
//! second would let a later write overwrite a durable key with less than it held.

use super::Replicator;
use super::store::held_bytes;
use crate::codec;
use crate::envelope::DataEnvelope;

/// The limit a state would break.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `max_keys`.
    Keys,
    /// `max_value_bytes`.
    ValueBytes,
    /// `max_total_bytes`.
    TotalBytes,
}

impl Limit {
    /// Every limit, in the order of their labels.
    pub const ALL: [Limit; 3] = [Limit::Keys, Limit::ValueBytes, Limit::TotalBytes];

    /// The metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Limit::Keys => "keys",
            Limit::ValueBytes => "value_bytes",
            Limit::TotalBytes => "total_bytes",
        }
    }
}

/// Why a state was not stored: the limit, with the numbers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitExceeded {
    #[error("this replica holds {held} keys, max_keys = {max_keys}: key {key:?} is not created")]
    Keys {
        key: String,
        held: usize,
        max_keys: usize,
    },
    #[error(
        "key {key:?} would hold {size_bytes} bytes encoded, more than max_value_bytes = \
         {max_value_bytes}"
    )]
    ValueBytes {
        key: String,
        size_bytes: usize,
        max_value_bytes: usize,
    },
    #[error(
        "this replica holds {held_bytes} bytes of keys and values and key {key:?} would take \
         it to {would_hold_bytes}, more than max_total_bytes = {max_total_bytes}"
    )]
    TotalBytes {
        key: String,
        held_bytes: usize,
        would_hold_bytes: usize,
        max_total_bytes: usize,
    },
}

impl LimitExceeded {
    /// Which limit it is.
    pub fn limit(&self) -> Limit {
        match self {
            LimitExceeded::Keys { .. } => Limit::Keys,
            LimitExceeded::ValueBytes { .. } => Limit::ValueBytes,
            LimitExceeded::TotalBytes { .. } => Limit::TotalBytes,
        }
    }
}

/// Refusals of one origin, by limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitCounts {
    pub keys: u64,
    pub value_bytes: u64,
    pub total_bytes: u64,
}

impl LimitCounts {
    /// The count of `limit`.
    pub fn of(&self, limit: Limit) -> u64 {
        match limit {
            Limit::Keys => self.keys,
            Limit::ValueBytes => self.value_bytes,
            Limit::TotalBytes => self.total_bytes,
        }
    }

    fn count(&mut self, limit: Limit) {
        let counter = match limit {
            Limit::Keys => &mut self.keys,
            Limit::ValueBytes => &mut self.value_bytes,
            Limit::TotalBytes => &mut self.total_bytes,
        };
        *counter = counter.saturating_add(1);
    }
}

/// States refused since the Replicator started: local updates and deletes, and states from
/// peers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Refusals {
    pub local: LimitCounts,
    pub remote: LimitCounts,
}

/// Where a state to store comes from, for counting its refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    Local,
    Remote,
}

impl Replicator {
    /// Whether this replica may hold `key` with a state of `size_bytes` encoded: within
    /// `max_value_bytes`, and, when it holds more than before, within `max_keys` (a new
    /// key) and `max_total_bytes`. A state no larger than the one held is always taken, so
    /// deletes and shrinking states pass at any fill.
    pub(super) fn admit(&self, key: &str, size_bytes: usize) -> Result<(), LimitExceeded> {
        let held = self.store.size_of(key);
        if held.is_some_and(|held| size_bytes <= held) {
            return Ok(());
        }
        let config = &self.config;
        if size_bytes > config.max_value_bytes {
            return Err(LimitExceeded::ValueBytes {
                key: key.to_string(),
                size_bytes,
                max_value_bytes: config.max_value_bytes,
            });
        }
        if held.is_none() && self.store.len() >= config.max_keys {
            return Err(LimitExceeded::Keys {
                key: key.to_string(),
                held: self.store.len(),
                max_keys: config.max_keys,
            });
        }
        let held_bytes_now = self.store.bytes();
        let freed = held.map_or(0, |held| held_bytes(key, held));
        let would_hold_bytes = held_bytes_now
            .saturating_sub(freed)
            .saturating_add(held_bytes(key, size_bytes));
        if would_hold_bytes > config.max_total_bytes {
            return Err(LimitExceeded::TotalBytes {
                key: key.to_string(),
                held_bytes: held_bytes_now,
                would_hold_bytes,
                max_total_bytes: config.max_total_bytes,
            });
        }
        Ok(())
    }

    /// Stores a changed envelope if this replica may hold it ([`Replicator::admit`]);
    /// otherwise changes nothing and counts the refusal under `origin`.
    pub(super) fn store_checked(
        &mut self,
        key: &str,
        envelope: DataEnvelope,
        origin: Origin,
    ) -> Result<(), LimitExceeded> {
        // An envelope that cannot be encoded could not be stored or sent: too large.
        let size_bytes = codec::encoded_size("data envelope", &envelope).unwrap_or(usize::MAX);
        if let Err(refused) = self.admit(key, size_bytes) {
            self.count_refusal(&refused, origin);
            return Err(refused);
        }
        self.store_changed(key, envelope, size_bytes);
        Ok(())
    }

    fn count_refusal(&mut self, refused: &LimitExceeded, origin: Origin) {
        let counts = match origin {
            Origin::Local => &mut self.refusals.local,
            Origin::Remote => &mut self.refusals.remote,
        };
        counts.count(refused.limit());
        // Once per limit and origin at warning level: a peer offering a full replica the
        // same keys every gossip round would otherwise flood the log.
        if origin == Origin::Remote && counts.of(refused.limit()) == 1 {
            tracing::warn!(error = %refused, "state from a peer refused: this replica is at its limit (counted in the refusals from now on)");
        } else {
            tracing::debug!(error = %refused, ?origin, "state refused: at a limit");
        }
    }

    /// Whether this replica is full: it holds `max_keys` keys or `max_total_bytes` bytes,
    /// so it can take no new key. Anti-entropy then neither asks peers for keys it lacks
    /// nor goes on with an exchange at once.
    pub(super) fn is_full(&self) -> bool {
        self.store.len() >= self.config.max_keys
            || self.store.bytes() >= self.config.max_total_bytes
    }
}
