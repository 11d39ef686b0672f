//! Key layouts of the RocksDB journal.
//!
//! Column families:
//! - `events`: `pid_num (u64 BE) ++ sequence_nr (u64 BE)` → sealed event record. Big-endian
//!   numbers make RocksDB's byte order the log order; the 8-byte prefix (one log) feeds a
//!   prefix bloom filter so that a replay's seek skips files without the log.
//! - `tag_index`: `tag_num (u64 BE) ++ offset (u64 BE)` → `pid_num ++ sequence_nr`.
//! - `meta`: small records distinguished by their first byte:
//!   `p` ++ persistence id → pid_num ++ [`LogState`] (++ [`ReplicaProgress`] for a
//!   replicated log; see [`encode_log`]); `n` ++ pid_num →
//!   persistence id (also the persistence-id order); `t` ++ tag → tag_num; `d` ++ pid_num →
//!   first sequence number not yet physically deleted (a deletion in progress); `c` →
//!   [`Counters`]; `r` ++ pid_num → the replica state of a replicated log (a version byte and
//!   the postcard of its `LogMeta`, whose last entry and acknowledged mark the `p` value's
//!   progress overrides when it has one); `#storage_id` → this store's replica id (u64 BE);
//!   `format_version` → the store format (u32 BE).
//!
//! Store format 1 kept a log's state apart, under `s` ++ pid_num, with the `p` value holding
//! the number alone; a replay then needed two lookups before its first read. Format 2 keeps
//! them together. A format-1 log is still read (its `p` value is 8 bytes long), and its `s`
//! record is replaced by the longer `p` value at its next write.
//!
//! Persistence ids and tags are mapped to numbers so that the hot keys stay 16 bytes whatever
//! the names' lengths.

use tessera_replication::{Epoch, Position};

pub(crate) const CF_EVENTS: &str = "events";
pub(crate) const CF_TAG_INDEX: &str = "tag_index";
pub(crate) const CF_META: &str = "meta";

const PID_PREFIX: u8 = b'p';
const PID_NAME_PREFIX: u8 = b'n';
const TAG_PREFIX: u8 = b't';
const STATE_PREFIX: u8 = b's';
const DELETION_PREFIX: u8 = b'd';
const REPLICA_PREFIX: u8 = b'r';
pub(crate) const COUNTERS_KEY: &[u8] = b"c";
/// The key of this store's replica id.
pub(crate) const STORAGE_ID_KEY: &[u8] = b"#storage_id";
/// The version byte in front of a stored replica state.
pub(crate) const REPLICA_META_VERSION: u8 = 1;

/// `hi ++ lo`, both big-endian.
pub(crate) fn pair_key(hi: u64, lo: u64) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&hi.to_be_bytes());
    key[8..].copy_from_slice(&lo.to_be_bytes());
    key
}

/// Splits a 16-byte pair key; `None` for any other length.
pub(crate) fn parse_pair(bytes: &[u8]) -> Option<(u64, u64)> {
    let hi = u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?);
    let lo = u64::from_be_bytes(bytes.get(8..16)?.try_into().ok()?);
    (bytes.len() == 16).then_some((hi, lo))
}

/// The exclusive upper bound of the keys `(hi, lo)` with `lo <= last_lo`.
pub(crate) fn pair_upper_bound(hi: u64, last_lo: u64) -> [u8; 16] {
    match last_lo.checked_add(1) {
        Some(next) => pair_key(hi, next),
        None => pair_key(hi.saturating_add(1), 0),
    }
}

fn prefixed(prefix: u8, rest: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + rest.len());
    key.push(prefix);
    key.extend_from_slice(rest);
    key
}

pub(crate) fn pid_key(persistence_id: &str) -> Vec<u8> {
    prefixed(PID_PREFIX, persistence_id.as_bytes())
}

pub(crate) fn pid_name_key(pid_num: u64) -> Vec<u8> {
    prefixed(PID_NAME_PREFIX, &pid_num.to_be_bytes())
}

/// The exclusive upper bound of all `n` keys.
pub(crate) fn pid_name_upper_bound() -> Vec<u8> {
    vec![PID_NAME_PREFIX + 1]
}

/// The pid number of an `n` key.
pub(crate) fn parse_pid_name_key(key: &[u8]) -> Option<u64> {
    match key {
        [PID_NAME_PREFIX, rest @ ..] => Some(u64::from_be_bytes(rest.try_into().ok()?)),
        _ => None,
    }
}

pub(crate) fn tag_key(tag: &str) -> Vec<u8> {
    prefixed(TAG_PREFIX, tag.as_bytes())
}

/// The key of a format-1 log state.
pub(crate) fn legacy_state_key(pid_num: u64) -> Vec<u8> {
    prefixed(STATE_PREFIX, &pid_num.to_be_bytes())
}

/// The key of a replicated log's replica state.
pub(crate) fn replica_key(pid_num: u64) -> Vec<u8> {
    prefixed(REPLICA_PREFIX, &pid_num.to_be_bytes())
}

/// The bounds `[start, end)` of all `r` keys.
pub(crate) fn replica_key_range() -> (Vec<u8>, Vec<u8>) {
    (vec![REPLICA_PREFIX], vec![REPLICA_PREFIX + 1])
}

/// The pid number of an `r` key.
pub(crate) fn parse_replica_key(key: &[u8]) -> Option<u64> {
    match key {
        [REPLICA_PREFIX, rest @ ..] => Some(u64::from_be_bytes(rest.try_into().ok()?)),
        _ => None,
    }
}

pub(crate) fn deletion_key(pid_num: u64) -> Vec<u8> {
    prefixed(DELETION_PREFIX, &pid_num.to_be_bytes())
}

/// The bounds `[start, end)` of all `d` keys.
pub(crate) fn deletion_key_range() -> (Vec<u8>, Vec<u8>) {
    (vec![DELETION_PREFIX], vec![DELETION_PREFIX + 1])
}

pub(crate) fn parse_deletion_key(key: &[u8]) -> Option<u64> {
    match key {
        [DELETION_PREFIX, rest @ ..] => Some(u64::from_be_bytes(rest.try_into().ok()?)),
        _ => None,
    }
}

/// Decodes a big-endian u64 value.
pub(crate) fn decode_u64(value: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(value.try_into().ok()?))
}

/// The state of one log, written in the same batch as every change to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct LogState {
    /// Highest sequence number ever written; never decreases.
    pub highest: u64,
    /// Events up to here are deleted (logically at once, physically soon after).
    pub deleted_to: u64,
}

impl LogState {
    pub fn encode(&self) -> [u8; 16] {
        pair_key(self.highest, self.deleted_to)
    }

    pub fn decode(value: &[u8]) -> Option<Self> {
        let (highest, deleted_to) = parse_pair(value)?;
        Some(LogState {
            highest,
            deleted_to,
        })
    }
}

/// Where a replica's copy of a replicated log stands: its last entry and its acknowledged
/// mark. The two parts of the replica state that change with every write, kept in the log's
/// `p` value (written with every write anyway) rather than in the replica state record,
/// which is then rewritten only when the promise, the deleted prefix or the configuration
/// changes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaProgress {
    pub last: Position,
    pub lac: u64,
}

/// Bytes of a `p` value with a replica's progress: number, state, last entry (sequence
/// number, epoch counter, epoch writer), acknowledged mark.
const LOG_VALUE_WITH_PROGRESS_BYTES: usize = 56;

/// An encoded `p` value.
pub(crate) struct LogValue {
    bytes: [u8; LOG_VALUE_WITH_PROGRESS_BYTES],
    len: usize,
}

impl LogValue {
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The `p` value of log `pid_num` in `state`, with the replica's progress for a replicated
/// log (24 bytes without, 56 with).
pub(crate) fn encode_log(
    pid_num: u64,
    state: LogState,
    progress: Option<ReplicaProgress>,
) -> LogValue {
    let mut bytes = [0u8; LOG_VALUE_WITH_PROGRESS_BYTES];
    bytes[..8].copy_from_slice(&pid_num.to_be_bytes());
    bytes[8..24].copy_from_slice(&state.encode());
    let len = match progress {
        None => 24,
        Some(progress) => {
            bytes[24..32].copy_from_slice(&progress.last.seq.to_be_bytes());
            bytes[32..40].copy_from_slice(&progress.last.epoch.counter.to_be_bytes());
            bytes[40..48].copy_from_slice(&progress.last.epoch.writer.to_be_bytes());
            bytes[48..56].copy_from_slice(&progress.lac.to_be_bytes());
            LOG_VALUE_WITH_PROGRESS_BYTES
        }
    };
    LogValue { bytes, len }
}

/// A `p` value: the log's number and, but for a format-1 value, its state.
pub(crate) fn decode_log(value: &[u8]) -> Option<(u64, Option<LogState>)> {
    match value.len() {
        8 => Some((decode_u64(value)?, None)),
        24 | LOG_VALUE_WITH_PROGRESS_BYTES => Some((
            decode_u64(&value[..8])?,
            Some(LogState::decode(&value[8..24])?),
        )),
        _ => None,
    }
}

/// The replica's progress a `p` value carries, if it has one (a replicated log written by
/// store format 6 or later).
pub(crate) fn decode_log_progress(value: &[u8]) -> Option<ReplicaProgress> {
    if value.len() != LOG_VALUE_WITH_PROGRESS_BYTES {
        return None;
    }
    Some(ReplicaProgress {
        last: Position::new(
            decode_u64(&value[24..32])?,
            Epoch {
                counter: decode_u64(&value[32..40])?,
                writer: decode_u64(&value[40..48])?,
            },
        ),
        lac: decode_u64(&value[48..56])?,
    })
}

/// Journal-wide counters handing out numbers; written in every batch that takes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counters {
    pub next_pid_num: u64,
    pub next_tag_num: u64,
    pub next_offset: u64,
}

impl Default for Counters {
    fn default() -> Self {
        // Numbers start at 1 so that 0 can mean "none" (an untagged event's offset, the
        // `after_offset` that starts a tag query at the beginning).
        Counters {
            next_pid_num: 1,
            next_tag_num: 1,
            next_offset: 1,
        }
    }
}

impl Counters {
    pub fn encode(&self) -> [u8; 24] {
        let mut out = [0u8; 24];
        out[..8].copy_from_slice(&self.next_pid_num.to_be_bytes());
        out[8..16].copy_from_slice(&self.next_tag_num.to_be_bytes());
        out[16..].copy_from_slice(&self.next_offset.to_be_bytes());
        out
    }

    pub fn decode(value: &[u8]) -> Option<Self> {
        if value.len() != 24 {
            return None;
        }
        Some(Counters {
            next_pid_num: decode_u64(&value[..8])?,
            next_tag_num: decode_u64(&value[8..16])?,
            next_offset: decode_u64(&value[16..])?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pair_keys_sort_like_their_numbers() {
        let mut keys = [
            pair_key(2, 1),
            pair_key(1, 256),
            pair_key(1, 2),
            pair_key(1, u64::MAX),
        ];
        keys.sort();
        let parsed: Vec<_> = keys.iter().map(|k| parse_pair(k).unwrap()).collect();
        assert_eq!(parsed, vec![(1, 2), (1, 256), (1, u64::MAX), (2, 1)]);
    }

    #[test]
    fn upper_bound_of_the_last_sequence_number_is_the_next_log() {
        assert_eq!(pair_upper_bound(5, u64::MAX), pair_key(6, 0));
        assert_eq!(pair_upper_bound(5, 9), pair_key(5, 10));
    }

    #[test]
    fn meta_prefixes_do_not_collide() {
        assert!(parse_pid_name_key(&pid_key("x")).is_none());
        assert_eq!(parse_pid_name_key(&pid_name_key(7)), Some(7));
        assert_eq!(parse_deletion_key(&deletion_key(9)), Some(9));
        assert!(parse_deletion_key(&legacy_state_key(9)).is_none());
        assert!(parse_pair(&[0u8; 15]).is_none());
        assert!(parse_pair(&[0u8; 17]).is_none());
    }

    #[test]
    fn state_and_counters_round_trip() {
        let state = LogState {
            highest: 10,
            deleted_to: 4,
        };
        assert_eq!(LogState::decode(&state.encode()), Some(state));
        let counters = Counters {
            next_pid_num: 3,
            next_tag_num: 5,
            next_offset: 99,
        };
        assert_eq!(Counters::decode(&counters.encode()), Some(counters));
        assert_eq!(Counters::decode(&[1, 2]), None);
    }

    #[test]
    fn log_values_of_both_formats_decode() {
        let state = LogState {
            highest: 10,
            deleted_to: 4,
        };
        let plain = encode_log(7, state, None);
        assert_eq!(decode_log(plain.as_slice()), Some((7, Some(state))));
        assert_eq!(decode_log_progress(plain.as_slice()), None);
        let progress = ReplicaProgress {
            last: Position::new(
                9,
                Epoch {
                    counter: 3,
                    writer: u64::MAX - 1,
                },
            ),
            lac: 8,
        };
        let replicated = encode_log(7, state, Some(progress));
        assert_eq!(decode_log(replicated.as_slice()), Some((7, Some(state))));
        assert_eq!(decode_log_progress(replicated.as_slice()), Some(progress));
        assert_eq!(decode_log(&7u64.to_be_bytes()), Some((7, None)));
        for len in [0, 7, 9, 16, 23, 25, 55, 57] {
            assert_eq!(decode_log(&vec![1u8; len]), None, "{len} bytes");
        }
    }
}
