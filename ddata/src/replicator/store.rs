//! The Replicator's key-value store, split into chunks by a stable hash of the key so that
//! anti-entropy can compare a chunk's XOR of key digests first and list keys only where a
//! chunk differs.

use crate::envelope::DataEnvelope;
use std::collections::BTreeMap;

/// Chunks of the key space. Fixed: every replica must split keys the same way. A chunk's key
/// list must fit one anti-entropy message (`max_message_bytes`), so with 1 MiB messages the
/// store compares well up to ~20 million keys.
pub const CHUNKS: usize = 1024;

/// The chunk of a key: FNV-1a over its bytes. Stable across releases and platforms (never
/// Rust's randomized hasher); changing it would make every replica think every chunk differs.
pub fn chunk_of(key: &str) -> u16 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash % CHUNKS as u64) as u16
}

/// A stored key: its envelope, its encoded size (known from the moment it is stored: the
/// store's limits count it), and its digest once computed (cleared on every change and
/// computed again when anti-entropy needs it).
#[derive(Debug, Clone)]
pub struct Stored {
    pub envelope: DataEnvelope,
    size_bytes: usize,
    digest: Option<u128>,
}

impl Stored {
    /// The key's digest, computed at most once per change.
    pub fn digest(&mut self, key: &str) -> u128 {
        *self
            .digest
            .get_or_insert_with(|| self.envelope.digest(key).0)
    }
}

/// What one key costs against `max_total_bytes`: its name and its encoded state.
pub fn held_bytes(key: &str, size_bytes: usize) -> usize {
    key.len().saturating_add(size_bytes)
}

#[derive(Debug, Default)]
struct Chunk {
    entries: BTreeMap<String, Stored>,
    /// XOR of the entries' digests; `None` after a change.
    digest: Option<u128>,
}

/// All keys, by chunk.
///
/// Invariant: `len` is the number of keys and `bytes` the sum of [`held_bytes`] over them.
#[derive(Debug)]
pub struct Store {
    chunks: Vec<Chunk>,
    len: usize,
    bytes: usize,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            chunks: (0..CHUNKS).map(|_| Chunk::default()).collect(),
            len: 0,
            bytes: 0,
        }
    }
}

impl Store {
    /// The envelope of `key`.
    pub fn get(&self, key: &str) -> Option<&DataEnvelope> {
        self.chunk(key)
            .and_then(|c| c.entries.get(key))
            .map(|s| &s.envelope)
    }

    /// Stores `envelope`, whose encoding is `size_bytes` long, under `key`, replacing what
    /// was there.
    pub fn put(&mut self, key: &str, envelope: DataEnvelope, size_bytes: usize) {
        let index = usize::from(chunk_of(key));
        let Some(chunk) = self.chunks.get_mut(index) else {
            return;
        };
        chunk.digest = None;
        if let Some(stored) = chunk.entries.get_mut(key) {
            self.bytes = self.bytes - stored.size_bytes + size_bytes;
            stored.envelope = envelope;
            stored.size_bytes = size_bytes;
            stored.digest = None;
            return;
        }
        chunk.entries.insert(
            key.to_string(),
            Stored {
                envelope,
                size_bytes,
                digest: None,
            },
        );
        self.len += 1;
        self.bytes = self.bytes.saturating_add(held_bytes(key, size_bytes));
    }

    /// The encoded size of `key`'s state, if stored.
    pub fn size_of(&self, key: &str) -> Option<usize> {
        self.chunk(key)
            .and_then(|c| c.entries.get(key))
            .map(|s| s.size_bytes)
    }

    /// Bytes held: every key's name and encoded state.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    fn chunk(&self, key: &str) -> Option<&Chunk> {
        self.chunks.get(usize::from(chunk_of(key)))
    }

    /// Number of keys, deleted ones included.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no key is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every key with its envelope, in chunk order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &DataEnvelope)> {
        self.chunks
            .iter()
            .flat_map(|c| c.entries.iter().map(|(k, s)| (k, &s.envelope)))
    }

    /// The keys of the chunks in `range` (indices past the last chunk wrap around).
    pub fn keys_in_chunks(&self, range: std::ops::Range<usize>) -> Vec<String> {
        range
            .filter_map(|i| self.chunks.get(i % CHUNKS))
            .flat_map(|c| c.entries.keys().cloned())
            .collect()
    }

    /// Digests of the non-empty chunks.
    pub fn chunk_digests(&mut self) -> Vec<(u16, u128)> {
        let mut digests = Vec::new();
        for (index, chunk) in self.chunks.iter_mut().enumerate() {
            if chunk.entries.is_empty() {
                continue;
            }
            let digest = match chunk.digest {
                Some(d) => d,
                None => {
                    let d = chunk
                        .entries
                        .iter_mut()
                        .fold(0u128, |acc, (key, stored)| acc ^ stored.digest(key));
                    chunk.digest = Some(d);
                    d
                }
            };
            digests.push((index as u16, digest));
        }
        digests
    }

    /// The keys of a chunk with their digests.
    pub fn chunk_keys(&mut self, chunk: u16) -> Vec<(String, u128)> {
        match self.chunks.get_mut(usize::from(chunk)) {
            Some(c) => c
                .entries
                .iter_mut()
                .map(|(key, stored)| (key.clone(), stored.digest(key)))
                .collect(),
            None => Vec::new(),
        }
    }

    /// The envelope of one key with its encoded size, if stored.
    pub fn get_with_size(&self, key: &str) -> Option<(&DataEnvelope, usize)> {
        let stored = self.chunk(key)?.entries.get(key)?;
        Some((&stored.envelope, stored.size_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::ValueKind;

    #[test]
    fn chunk_of_is_stable() {
        // Pinned: a change here would split replicas' key spaces differently.
        assert_eq!(chunk_of(""), (0xcbf2_9ce4_8422_2325u64 % 1024) as u16);
        assert_eq!(chunk_of("a"), chunk_of("a"));
        let spread: std::collections::BTreeSet<u16> =
            (0..2000).map(|i| chunk_of(&format!("key-{i}"))).collect();
        assert!(
            spread.len() > 800,
            "keys spread over the chunks: {}",
            spread.len()
        );
    }

    fn put(store: &mut Store, key: &str, envelope: DataEnvelope) {
        let size = crate::codec::encoded_size("data envelope", &envelope).unwrap();
        store.put(key, envelope, size);
    }

    #[test]
    fn chunk_digest_follows_changes() {
        let mut store = Store::default();
        put(
            &mut store,
            "a",
            DataEnvelope::new(ValueKind::PNCounter.empty().unwrap()),
        );
        let before = store.chunk_digests();
        assert_eq!(before.len(), 1);
        put(&mut store, "a", DataEnvelope::deleted());
        let after = store.chunk_digests();
        assert_ne!(before, after);
        assert_eq!(store.len(), 1);
        let keys = store.chunk_keys(before[0].0);
        assert_eq!(keys.len(), 1);
        assert_eq!(
            keys[0].1, after[0].1,
            "one key: the chunk digest is the key digest"
        );
    }

    /// The byte count follows every put: new keys, replacements, and sizes as encoded.
    #[test]
    fn bytes_are_the_keys_and_their_encoded_states() {
        let mut store = Store::default();
        let counter = DataEnvelope::new(ValueKind::PNCounter.empty().unwrap());
        let size = crate::codec::encode("data envelope", &counter)
            .unwrap()
            .len();
        assert_eq!(
            crate::codec::encoded_size("data envelope", &counter).unwrap(),
            size
        );
        put(&mut store, "ab", counter.clone());
        put(&mut store, "cde", counter);
        assert_eq!(store.bytes(), 2 + size + 3 + size);
        let deleted = DataEnvelope::deleted();
        let deleted_size = crate::codec::encoded_size("data envelope", &deleted).unwrap();
        put(&mut store, "ab", deleted);
        assert_eq!(store.bytes(), 2 + deleted_size + 3 + size);
        assert_eq!(store.size_of("ab"), Some(deleted_size));
        assert_eq!(store.get_with_size("cde").map(|(_, s)| s), Some(size));
        assert_eq!(store.size_of("zz"), None);
    }
}
