//! Targets of what Distributed Data reads from elsewhere: Replicator messages (envelopes,
//! deltas, digests), durable records, merges of received state, and the Replicator acting on a
//! sequence of messages.

use super::{assert_round_trip, chunked, chunks};
use std::time::{Duration, Instant};
use tessera_cluster::{Address, MemberStatus, UniqueAddress};
use tessera_ddata::codec;
use tessera_ddata::fuzzing as durable;
use tessera_ddata::replicator::{
    ChunkKeyList, Command, DeltaEntry, DurableWriteId, Input, MembershipView, Output, Replicator,
    ReplicatorConfig, ReplicatorMessage, Time,
};
use tessera_ddata::{
    DataEnvelope, Flag, GCounter, GSet, LWWMap, LWWRegister, ORMultiMap, ORSet, PNCounter,
    PNCounterMap, PruningState, ReadConsistency, ReplicatedValue, VersionVector, WriteConsistency,
};

/// Decodes a Replicator message and checks its round trip; the message, if any.
fn decode_message(data: &[u8]) -> Option<ReplicatorMessage> {
    let message = ReplicatorMessage::decode(data).ok()?;
    assert_round_trip(
        "replicator message",
        &message,
        ReplicatorMessage::encode,
        ReplicatorMessage::decode,
    );
    Some(message)
}

/// Target `ddata_message`: a message from another node's Replicator.
pub fn ddata_message(data: &[u8]) {
    decode_message(data);
}

/// The key the durable-record target's records are stored under.
const DURABLE_KEY: &[u8] = b"orders-7";

/// Target `ddata_durable_record`: a record of the durable store, as read from disk. The first
/// byte chooses: the bytes as stored (checksum and all), or a body sealed with a valid
/// checksum, so that the decoder behind the checksum is reached.
pub fn ddata_durable_record(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let sealed;
    let value = if mode & 1 == 0 {
        rest
    } else {
        sealed = durable::seal_durable_record(DURABLE_KEY, rest);
        &sealed
    };
    if let Ok(envelope) = durable::decode_durable_record(DURABLE_KEY, value) {
        assert_round_trip(
            "durable record",
            &envelope,
            |e| durable::encode_durable_record(DURABLE_KEY, e),
            |b| durable::decode_durable_record(DURABLE_KEY, b),
        );
    }
}

/// Target `ddata_merge`: two decoded envelopes of one key merged, both ways, with each
/// other and with themselves, and a decoded value as a delta; what replicas do with every
/// state they receive. Input: the two envelopes as [`chunks`].
pub fn ddata_merge(data: &[u8]) {
    let mut pieces = chunks(data);
    let (Some(a), Some(b)) = (pieces.next(), pieces.next()) else {
        return;
    };
    let decode = |bytes| codec::decode::<DataEnvelope>("envelope", bytes).ok();
    let (Some(a), Some(b)) = (decode(a), decode(b)) else {
        return;
    };
    let _ = a.merge(&b);
    let _ = b.merge(&a);
    let _ = a.merge(&a);
    let _ = a.kind_conflict(&b);
    if let (Some(mut value), Some(delta)) = (a.data.clone(), b.data.clone()) {
        let _ = value.merge_delta(&delta);
        let _ = value.delta();
        for node in b.pruning.keys() {
            if value.need_pruning_from(node) {
                value.prune(node, &replica(1));
            }
            value.prune_cleanup(node);
        }
        let _ = value.modified_by_nodes();
    }
    let _ = a.digest("k");
}

/// The replicas of the Replicator target: this node is replica 1.
fn replica(n: u16) -> UniqueAddress {
    UniqueAddress::new(Address::new("10.0.0.1", 25520 + n), u64::from(n) * 1000 + 7)
}

/// Who a message of the Replicator target comes from: the two other members, a node that is
/// not one, and another incarnation of replica 2.
fn sender(selector: u8) -> UniqueAddress {
    match selector % 4 {
        0 => replica(2),
        1 => replica(3),
        2 => replica(4),
        _ => UniqueAddress::new(replica(2).address, 99),
    }
}

/// Three Up members, replica 1 the leader.
fn three_members() -> MembershipView {
    MembershipView {
        members: (1..=3).map(|n| (replica(n), MemberStatus::Up)).collect(),
        unreachable: Default::default(),
        leader: Some(replica(1)),
    }
}

fn replicator_config() -> ReplicatorConfig {
    ReplicatorConfig {
        durable_keys: vec!["durable-*".into()],
        ..ReplicatorConfig::default()
    }
}

/// A local command of the Replicator target, chosen by `selector`, on key `key`.
fn command(selector: u8, key: String) -> Command {
    let timeout = Duration::from_secs(3);
    let write = match selector % 3 {
        0 => WriteConsistency::Local,
        1 => WriteConsistency::Majority { min_cap: 0 },
        _ => WriteConsistency::All,
    };
    let read = match selector % 3 {
        0 => ReadConsistency::Local,
        1 => ReadConsistency::Majority { min_cap: 0 },
        _ => ReadConsistency::All,
    };
    match (selector / 3) % 6 {
        0 => Command::Get {
            key,
            consistency: read,
            timeout,
        },
        1 => Command::Update {
            key,
            consistency: write,
            timeout,
            modify: Box::new(|current, ctx| {
                let mut counter = match current {
                    Some(ReplicatedValue::PNCounter(c)) => c,
                    None => PNCounter::new(),
                    Some(other) => return Err(format!("{:?} is not a counter", other.kind())),
                };
                counter.increment(ctx.self_node, 1);
                Ok(counter.into())
            }),
        },
        2 => Command::Update {
            key,
            consistency: write,
            timeout,
            modify: Box::new(|current, ctx| {
                let mut set = match current {
                    Some(ReplicatedValue::ORSet(s)) => s,
                    None => ORSet::new(),
                    Some(other) => return Err(format!("{:?} is not a set", other.kind())),
                };
                set.add(ctx.self_node, "x".to_string());
                Ok(set.into())
            }),
        },
        3 => Command::Delete {
            key,
            consistency: write,
            timeout,
        },
        4 => Command::Subscribe { key, subscriber: 1 },
        _ => Command::Keys {
            after: None,
            limit: 10,
        },
    }
}

/// A Replicator under test, with what its driver keeps: the time, the durable writes not
/// reported yet, the last request id.
struct Harness {
    replicator: Replicator,
    start: Instant,
    now: Instant,
    pending_writes: Vec<DurableWriteId>,
    request_id: u64,
}

impl Harness {
    fn time(&self) -> Time {
        Time {
            now: self.now,
            wall_ms: 1_700_000_000_000 + (self.now - self.start).as_millis() as u64,
        }
    }

    fn handle(&mut self, input: Input) {
        for output in self.replicator.handle(self.time(), input) {
            if let Output::Store { write, .. } = output {
                self.pending_writes.push(write);
            }
        }
    }

    /// One step: `op`'s low two bits say what (a message from a peer, a local command, time
    /// passing with a membership change, the durable writes reported), the other bits who or
    /// which.
    fn step(&mut self, op: u8, payload: &[u8]) {
        match op & 3 {
            0 => {
                if let Some(message) = decode_message(payload) {
                    let from = sender(op >> 2);
                    self.handle(Input::Message { from, message });
                }
            }
            1 => {
                self.request_id += 1;
                let key = match payload.first().map(|b| b % 4) {
                    Some(0) => "durable-orders",
                    Some(1) => "hits",
                    Some(2) => "users",
                    _ => "k",
                };
                let id = self.request_id;
                let command = command(op >> 2, key.to_string());
                self.handle(Input::Command { id, command });
            }
            2 => {
                self.now += Duration::from_millis(50 * u64::from(op >> 2));
                self.handle(Input::Tick);
                if op & 0x80 != 0 {
                    let mut view = three_members();
                    view.unreachable.insert(replica(3));
                    if op & 0x40 != 0 {
                        view.members.pop();
                    }
                    self.handle(Input::Membership(view));
                }
            }
            _ => {
                let writes = std::mem::take(&mut self.pending_writes);
                let result = if op & 4 == 0 {
                    Ok(())
                } else {
                    Err("disk full".to_string())
                };
                self.handle(Input::Stored { writes, result });
            }
        }
    }
}

/// Target `ddata_replicator`: a node's Replicator, one of three members, fed a sequence of
/// messages from peers, local commands, ticks, membership changes and durable-write reports
/// ([`chunks`]: each piece an op byte, see `Harness::step`, and a message).
pub fn ddata_replicator(data: &[u8]) {
    let start = Instant::now();
    let mut harness = Harness {
        replicator: Replicator::new(replica(1), replicator_config(), 7, start),
        start,
        now: start,
        pending_writes: Vec::new(),
        request_id: 0,
    };
    harness.handle(Input::Membership(three_members()));
    for piece in chunks(data) {
        if let Some((&op, payload)) = piece.split_first() {
            harness.step(op, payload);
        }
    }
}

/// Valid encodings the targets' corpora start from.
pub mod seeds {
    use super::*;

    /// One value of every kind, for seeds.
    fn sample_values() -> Vec<ReplicatedValue> {
        let a = replica(1);
        let b = replica(2);
        let mut counter = PNCounter::new();
        counter.increment(&a, 5);
        counter.decrement(&b, 2);
        let mut set = ORSet::new();
        set.add(&a, "x".to_string());
        set.add(&b, "y".to_string());
        set.remove(&"x".to_string());
        let mut g_set = GSet::new();
        g_set.add("g".to_string());
        let mut flag = Flag::new();
        flag.switch_on();
        let mut map = LWWMap::new();
        map.put(&a, "k".to_string(), "v".to_string(), 1_700_000_000_000);
        let mut vv = VersionVector::new();
        vv.increment(&a);
        vv.increment(&b);
        let mut values = vec![
            counter.clone().into(),
            set.into(),
            g_set.into(),
            ReplicatedValue::LWWRegister(LWWRegister::new(
                a.clone(),
                "r".into(),
                1_700_000_000_000,
            )),
            flag.into(),
            map.into(),
            vv.into(),
        ];
        let mut g_counter = GCounter::new();
        g_counter.increment(&a, 3);
        values.push(g_counter.into());
        let mut counter_map = PNCounterMap::new();
        counter_map.increment(&a, "c".to_string(), 2);
        values.push(counter_map.into());
        let mut multi_map = ORMultiMap::new();
        multi_map.add_binding(&a, "k".to_string(), "v".to_string());
        values.push(multi_map.into());
        values
    }

    /// Envelopes for seeds: every kind of value, with and without pruning markers, and deleted.
    fn sample_envelopes() -> Vec<DataEnvelope> {
        let mut envelopes: Vec<DataEnvelope> =
            sample_values().into_iter().map(DataEnvelope::new).collect();
        let mut marked = envelopes[0].clone();
        marked.pruning.insert(
            replica(3),
            PruningState::Initialized {
                owner: replica(1),
                epoch_ms: 1_700_000_000_000,
                seen: [replica(1).address].into_iter().collect(),
            },
        );
        marked.pruning.insert(
            replica(4),
            PruningState::Performed {
                obsolete_at_ms: 1_700_000_600_000,
            },
        );
        envelopes.push(marked);
        envelopes.push(DataEnvelope::deleted());
        envelopes
    }

    /// Seeds of `ddata_message`: every message kind, with every kind of value.
    pub fn ddata_message() -> Vec<Vec<u8>> {
        sample_messages()
            .iter()
            .filter_map(|m| m.encode().ok())
            .collect()
    }

    fn sample_messages() -> Vec<ReplicatorMessage> {
        let mut messages: Vec<ReplicatorMessage> = sample_envelopes()
            .into_iter()
            .enumerate()
            .map(|(i, envelope)| ReplicatorMessage::Write {
                op: i as u64,
                incarnation: 9,
                key: format!("key-{i}"),
                envelope,
            })
            .collect();
        let deltas = sample_values()
            .into_iter()
            .enumerate()
            .map(|(i, delta)| DeltaEntry {
                key: format!("key-{i}"),
                from_seq: 1,
                to_seq: 2,
                delta,
                pruning: Default::default(),
            })
            .collect();
        messages.extend([
            ReplicatorMessage::Read {
                op: 1,
                incarnation: 9,
                key: "hits".into(),
            },
            ReplicatorMessage::ReadResult {
                op: 1,
                incarnation: 9,
                key: "hits".into(),
                envelope: sample_envelopes().into_iter().next(),
            },
            ReplicatorMessage::WriteAck {
                op: 2,
                incarnation: 9,
            },
            ReplicatorMessage::WriteNack {
                op: 3,
                incarnation: 9,
                reason: "kind".into(),
            },
            ReplicatorMessage::Deltas {
                incarnation: 9,
                deltas,
            },
            ReplicatorMessage::DeltaGap {
                keys: vec!["hits".into()],
            },
            ReplicatorMessage::Status {
                chunks: vec![(3, 0xdead_beef), (17, 42)],
            },
            ReplicatorMessage::ChunkKeys {
                chunks: vec![ChunkKeyList {
                    chunk: 3,
                    keys: vec![("hits".into(), 7)],
                }],
                more: false,
            },
            ReplicatorMessage::Gossip {
                entries: vec![("users".into(), sample_envelopes().remove(1))],
                send_back: vec!["hits".into()],
                reply_expected: true,
                more: false,
            },
        ]);
        messages
    }

    /// Seeds of `ddata_durable_record`: stored records as read (mode byte 0) and bodies to seal
    /// (mode byte 1).
    pub fn ddata_durable_record() -> Vec<Vec<u8>> {
        let mut seeds = Vec::new();
        for envelope in sample_envelopes() {
            if let Ok(record) = durable::encode_durable_record(DURABLE_KEY, &envelope) {
                seeds.push([&[0u8][..], &record].concat());
            }
            if let Ok(body) = codec::encode("durable data envelope", &envelope) {
                seeds.push([&[1u8][..], &body].concat());
            }
        }
        seeds
    }

    /// Seeds of `ddata_merge`: pairs of envelopes of the same kind and of different kinds.
    pub fn ddata_merge() -> Vec<Vec<u8>> {
        let envelopes: Vec<Vec<u8>> = sample_envelopes()
            .iter()
            .filter_map(|e| codec::encode("envelope", e).ok())
            .collect();
        let mut seeds = Vec::new();
        for (i, a) in envelopes.iter().enumerate() {
            let b = &envelopes[(i + 1) % envelopes.len()];
            seeds.push(chunked([a.as_slice(), a.as_slice()]));
            seeds.push(chunked([a.as_slice(), b.as_slice()]));
        }
        seeds
    }

    /// Seeds of `ddata_replicator`: local commands, then every sample message from replica 2
    /// with ticks between.
    pub fn ddata_replicator() -> Vec<Vec<u8>> {
        let messages: Vec<Vec<u8>> = sample_messages()
            .iter()
            .filter_map(|m| m.encode().ok())
            .map(|m| [&[0u8][..], &m].concat())
            .collect();
        let increment_majority = [1u8 | (4 << 2), 1];
        let add_durable = [1u8 | (8 << 2), 0];
        let get_all = [1u8 | (2 << 2), 1];
        let tick = [2u8 | (10 << 2)];
        let stored = [3u8];
        let mut steps: Vec<&[u8]> =
            vec![&increment_majority, &add_durable, &get_all, &tick, &stored];
        for message in &messages {
            steps.push(message);
            steps.push(&tick);
        }
        vec![
            chunked(steps.iter().copied()),
            chunked([&increment_majority[..], &tick, &tick, &tick, &tick]),
        ]
    }
}
