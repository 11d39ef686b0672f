//! The Replicator: a replicated key-value store of CRDTs, one replica per node, as a plain
//! state machine. It is given inputs — local commands, messages from other Replicators,
//! membership views and ticks, each with the time — and returns outputs: messages to send,
//! replies, change notifications and durable writes. It reads no clock, opens no socket and
//! spawns no task; [`crate::node`] drives it with tokio.
//!
//! - **Reads and writes** at Local, From/To(n), Majority{min_cap} and All consistency. A
//!   write is applied locally first, then sent to every other member; it succeeds when enough
//!   members that count acknowledge it, and times out otherwise (without rolling back). A
//!   read merges the replies of enough members and, before returning, writes the merged
//!   state back to the replicas that answered with an older one (read repair).
//! - **Deltas** of local updates go to every member every `delta_propagation_interval`, with
//!   per-key sequence numbers; a receiver that notices a gap applies the delta anyway (a delta
//!   is a state: joining it is always safe) and asks for the full state.
//! - **Anti-entropy**: every `gossip_interval` a random member gets the digests of this
//!   node's key chunks; chunks that differ are compared key by key and only differing keys
//!   travel. Messages stay below `max_message_bytes`; an unfinished exchange continues at
//!   once.
//! - **Pruning** folds removed nodes' entries into the leader's ([`pruning`]).
//! - **Limits**: a replica holds at most `max_keys` keys, `max_value_bytes` per state and
//!   `max_total_bytes` in all; what would go beyond them is refused, from a local caller or
//!   from a peer, and counted ([`limits`]).
//! - **Durable keys** are written to disk by the driver (an [`Output::Store`], reported back
//!   with [`Input::Stored`]); the acknowledgements of a durable key — a local update's success,
//!   a replica's `WriteAck` — are held until its write is reported stored, and withheld if it
//!   failed ([`durability`]). Nothing else waits for the disk.

mod anti_entropy;
mod deltas;
mod durability;
mod limits;
mod members;
pub mod protocol;
mod pruning;
mod quorum;
mod store;

pub use durability::DurableWriteId;
pub use limits::{Limit, LimitCounts, LimitExceeded, Refusals};
pub use members::MembershipView;
pub use protocol::{ChunkKeyList, DeltaEntry, ReplicatorMessage};
pub use store::{CHUNKS, chunk_of};

use crate::codec;
use crate::consistency::{ReadConsistency, WriteConsistency};
use crate::envelope::DataEnvelope;
use crate::value::{KindMismatch, ReplicatedValue};
use durability::Durability;
use members::Members;
use quorum::PendingOp;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};
use store::Store;
use tessera_cluster::{Address, UniqueAddress};

/// Settings of a Replicator.
#[derive(Debug, Clone)]
pub struct ReplicatorConfig {
    /// Interval of anti-entropy rounds.
    pub gossip_interval: Duration,
    /// Interval at which accumulated deltas are sent.
    pub delta_propagation_interval: Duration,
    /// Interval at which subscribers are told about changed keys (changes are batched).
    pub notify_subscribers_interval: Duration,
    /// Interval of the pruning steps.
    pub pruning_interval: Duration,
    /// How long after a node's removal the leader starts pruning it (time for its last
    /// updates to spread).
    pub max_pruning_dissemination: Duration,
    /// How long a performed pruning is remembered, dropping the removed node's entries from
    /// late copies.
    pub pruning_marker_time_to_live: Duration,
    /// The same for durable keys, which a node down for long can bring back from disk.
    pub durable_pruning_marker_time_to_live: Duration,
    /// Keys written to disk before they are acknowledged: exact names, or prefixes ending in
    /// `*`.
    pub durable_keys: Vec<String>,
    /// Largest anti-entropy or delta message, in encoded bytes (single envelopes larger than
    /// this still travel alone).
    pub max_message_bytes: usize,
    /// Reads and writes waiting for other replicas; more are refused as overload.
    pub max_pending_operations: usize,
    /// Largest value of one key, in encoded bytes; a larger update is refused (it could not
    /// travel in one message), and so is a larger state from a peer.
    pub max_value_bytes: usize,
    /// Keys this replica holds at most, deleted ones included (a deleted key stays as its
    /// tombstone); a new key beyond it is refused, from a local caller or from a peer.
    pub max_keys: usize,
    /// Bytes of keys and encoded states this replica holds at most; a state that would take
    /// it beyond is refused, from a local caller or from a peer. Memory is a few times this:
    /// the states decoded, and the per-key bookkeeping.
    pub max_total_bytes: usize,
}

impl Default for ReplicatorConfig {
    fn default() -> Self {
        ReplicatorConfig {
            gossip_interval: Duration::from_secs(1),
            delta_propagation_interval: Duration::from_millis(200),
            notify_subscribers_interval: Duration::from_millis(100),
            pruning_interval: Duration::from_secs(30),
            max_pruning_dissemination: Duration::from_secs(60),
            pruning_marker_time_to_live: Duration::from_secs(6 * 3600),
            durable_pruning_marker_time_to_live: Duration::from_secs(10 * 24 * 3600),
            durable_keys: Vec::new(),
            max_message_bytes: 1024 * 1024,
            max_pending_operations: 10_000,
            max_value_bytes: 1024 * 1024,
            // Far beyond what one node was measured with (a million keys), but not unbounded.
            max_keys: 4_000_000,
            max_total_bytes: 1024 * 1024 * 1024,
        }
    }
}

impl ReplicatorConfig {
    /// Whether `key` is durable.
    pub fn is_durable(&self, key: &str) -> bool {
        self.durable_keys
            .iter()
            .any(|pattern| match pattern.strip_suffix('*') {
                Some(prefix) => key.starts_with(prefix),
                None => key == pattern,
            })
    }
}

/// Identifies a local request, so its reply finds its way back.
pub type RequestId = u64;
/// Identifies a subscriber of change notifications.
pub type SubscriberId = u64;

/// What an update's `modify` function is given besides the current value.
pub struct UpdateContext<'a> {
    /// This node, for the CRDT operations that record who changed them.
    pub self_node: &'a UniqueAddress,
    /// Wall-clock milliseconds, for last-writer-wins timestamps.
    pub now_wall_ms: u64,
}

/// The update of a key holding a string register: `value` set over the current one (a new
/// register for a new key), timestamped after it. Refused when the key holds another kind.
pub fn set_register(
    current: Option<crate::value::ReplicatedValue>,
    context: &UpdateContext<'_>,
    value: String,
) -> Result<crate::value::ReplicatedValue, String> {
    use crate::lww_register::{LWWRegister, next_timestamp};
    use crate::value::ReplicatedValue;
    let register = match current {
        None => LWWRegister::new(context.self_node.clone(), value, context.now_wall_ms),
        Some(ReplicatedValue::LWWRegister(mut register)) => {
            let at = next_timestamp(register.timestamp_ms(), context.now_wall_ms);
            register.set(context.self_node, value, at);
            register
        }
        Some(other) => return Err(format!("the key holds a {:?}", other.kind())),
    };
    Ok(ReplicatedValue::LWWRegister(register))
}

/// Computes the new value of a key from its current one (`None` for a new key). An `Err`
/// refuses the update with that message; nothing changes.
pub type Modify = Box<
    dyn FnOnce(Option<ReplicatedValue>, &UpdateContext<'_>) -> Result<ReplicatedValue, String>
        + Send,
>;

/// A local request.
pub enum Command {
    Get {
        key: String,
        consistency: ReadConsistency,
        timeout: Duration,
    },
    Update {
        key: String,
        consistency: WriteConsistency,
        timeout: Duration,
        modify: Modify,
    },
    /// Deletes a key for good: it can never be written again.
    Delete {
        key: String,
        consistency: WriteConsistency,
        timeout: Duration,
    },
    /// Changes of `key` go to `subscriber`, batched, starting with its current value.
    Subscribe {
        key: String,
        subscriber: SubscriberId,
    },
    Unsubscribe {
        key: String,
        subscriber: SubscriberId,
    },
    /// The keys that hold a value (not deleted ones), in order: the first `limit` after
    /// `after` (from the first key when `None`).
    Keys { after: Option<String>, limit: usize },
}

/// The answer to a `Get`.
#[derive(Debug, Clone, PartialEq)]
pub enum GetResult {
    Found(ReplicatedValue),
    NotFound,
    Deleted,
    /// Not enough replicas answered within the timeout.
    Timeout,
    Failed(String),
}

/// The answer to an `Update`.
#[derive(Debug, Clone, PartialEq)]
pub enum UpdateResult {
    Success,
    /// Applied locally, but not acknowledged by enough replicas in time. Not rolled back.
    Timeout,
    /// The key was deleted.
    Deleted,
    /// `modify` refused the update, or the key holds another kind; nothing changed.
    Invalid(String),
    /// The new value would take this replica beyond one of its limits; nothing changed.
    LimitReached(LimitExceeded),
    /// Refused (overload) or refused by other replicas.
    Failed(String),
}

/// The answer to a `Delete`.
#[derive(Debug, Clone, PartialEq)]
pub enum DeleteResult {
    Success,
    /// Deleted locally, but not acknowledged by enough replicas in time. Not rolled back.
    Timeout,
    /// The key is not held here and this replica holds `max_keys` keys: its tombstone would
    /// be one more; nothing changed.
    LimitReached(LimitExceeded),
    Failed(String),
}

/// A reply to a local request.
/// One page of keys, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeysPage {
    pub keys: Vec<String>,
    /// More keys follow the last one.
    pub more: bool,
}

impl KeysPage {
    /// The first `limit` of `keys` (in any order, each once) that come after `after`, in
    /// order. Keeps only `limit` of them at a time, so a page of a large store costs a pass
    /// over its keys, not a sort of all of them.
    pub fn of<'k>(keys: impl Iterator<Item = &'k str>, after: Option<&str>, limit: usize) -> Self {
        let mut smallest: std::collections::BinaryHeap<&str> =
            std::collections::BinaryHeap::with_capacity(limit.saturating_add(1).min(1 << 16));
        let mut more = false;
        for key in keys.filter(|k| after.is_none_or(|after| *k > after)) {
            if smallest.len() < limit {
                smallest.push(key);
            } else {
                more = true;
                if let Some(mut largest) = smallest.peek_mut()
                    && key < *largest
                {
                    *largest = key;
                }
            }
        }
        KeysPage {
            keys: smallest
                .into_sorted_vec()
                .into_iter()
                .map(str::to_string)
                .collect(),
            more,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    Get(GetResult),
    Update(UpdateResult),
    Delete(DeleteResult),
    Keys(KeysPage),
    Subscribed,
}

/// An input to the state machine. Inputs are moved once into `handle`, never stored, so the
/// size difference between variants costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Input {
    Command {
        id: RequestId,
        command: Command,
    },
    Message {
        from: UniqueAddress,
        message: ReplicatorMessage,
    },
    Membership(MembershipView),
    /// Time passed: timers and timeouts are due at [`Replicator::next_timer`].
    Tick,
    /// The durable writes `writes` (of [`Output::Store`]) are synced to disk (`Ok`) or failed
    /// (`Err` with the reason): the acknowledgements waiting for them go out, or are withheld.
    Stored {
        writes: Vec<DurableWriteId>,
        result: Result<(), String>,
    },
}

/// Something the driver must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    Send {
        to: Address,
        message: ReplicatorMessage,
    },
    Reply {
        id: RequestId,
        response: Response,
    },
    /// A subscribed key changed (`None`: it was deleted).
    Changed {
        subscriber: SubscriberId,
        key: String,
        value: Option<ReplicatedValue>,
    },
    /// Write this state of a durable key to disk, then report `write` with [`Input::Stored`].
    /// Writes may be grouped into one synced batch (a later write of a key replaces an
    /// earlier one), but each must be reported: the key's acknowledgements wait for it. The
    /// outputs of the same step that do not acknowledge the key need not wait.
    Store {
        write: DurableWriteId,
        key: String,
        envelope: DataEnvelope,
    },
}

/// The time of an input: a monotonic instant for timers, wall-clock milliseconds for
/// last-writer-wins timestamps and pruning markers.
#[derive(Debug, Clone, Copy)]
pub struct Time {
    pub now: Instant,
    pub wall_ms: u64,
}

/// One node's Replicator.
pub struct Replicator {
    self_node: UniqueAddress,
    config: ReplicatorConfig,
    /// Random per Replicator start; see [`ReplicatorMessage`].
    incarnation: u64,
    store: Store,
    members: Members,
    ops: HashMap<u64, (PendingOp, Instant)>,
    deadlines: BTreeSet<(Instant, u64)>,
    next_op: u64,
    own_delta_seq: HashMap<String, u64>,
    pending_deltas: BTreeMap<String, DeltaEntry>,
    /// Per sender: its incarnation and the last delta sequence number seen per key.
    incoming_delta_seq: HashMap<UniqueAddress, (u64, HashMap<String, u64>)>,
    subscribers: BTreeMap<String, BTreeSet<SubscriberId>>,
    changed: BTreeSet<String>,
    /// Keys whose envelopes carry pruning markers.
    marked: BTreeSet<String>,
    /// Where the leader's scan of the data for removed nodes goes on (a chunk index).
    prune_scan_cursor: usize,
    /// Anti-entropy exchanges this node started, by peer, and when: one at a time per peer.
    exchanges: HashMap<UniqueAddress, Instant>,
    /// Durable writes not reported yet, and the acknowledgements waiting for them.
    durability: Durability,
    /// States refused at a limit.
    refusals: Refusals,
    next_gossip: Instant,
    next_deltas: Instant,
    next_notify: Instant,
    next_pruning: Instant,
    rng: SmallRng,
    outputs: Vec<Output>,
}

impl Replicator {
    /// A Replicator for `self_node`; `seed` drives its random choices (its incarnation
    /// number, gossip peers).
    pub fn new(
        self_node: UniqueAddress,
        config: ReplicatorConfig,
        seed: u64,
        now: Instant,
    ) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        Replicator {
            incarnation: rng.random(),
            next_gossip: now + config.gossip_interval,
            next_deltas: now + config.delta_propagation_interval,
            next_notify: now + config.notify_subscribers_interval,
            next_pruning: now + config.pruning_interval,
            self_node,
            config,
            store: Store::default(),
            members: Members::default(),
            ops: HashMap::new(),
            deadlines: BTreeSet::new(),
            next_op: 1,
            own_delta_seq: HashMap::new(),
            pending_deltas: BTreeMap::new(),
            incoming_delta_seq: HashMap::new(),
            subscribers: BTreeMap::new(),
            changed: BTreeSet::new(),
            marked: BTreeSet::new(),
            prune_scan_cursor: 0,
            exchanges: HashMap::new(),
            durability: Durability::default(),
            refusals: Refusals::default(),
            rng,
            outputs: Vec::new(),
        }
    }

    /// This node.
    pub fn self_node(&self) -> &UniqueAddress {
        &self.self_node
    }

    /// The configuration.
    pub fn config(&self) -> &ReplicatorConfig {
        &self.config
    }

    /// Loads a key read from the durable store at start, before any input. Limits are not
    /// checked: what is on disk was admitted once (see [`limits`]), and a replica started
    /// with lower limits holds it but admits nothing new beyond them.
    pub fn load(&mut self, key: &str, envelope: DataEnvelope) {
        if !envelope.pruning.is_empty() {
            self.marked.insert(key.to_string());
        }
        let size_bytes = codec::encoded_size("data envelope", &envelope).unwrap_or(0);
        self.store.put(key, envelope, size_bytes);
    }

    /// This replica's state of `key`.
    pub fn envelope(&self, key: &str) -> Option<&DataEnvelope> {
        self.store.get(key)
    }

    /// Number of keys held, deleted ones included.
    pub fn key_count(&self) -> usize {
        self.store.len()
    }

    /// Bytes held: every key's name and encoded state (what `max_total_bytes` bounds).
    pub fn held_bytes(&self) -> usize {
        self.store.bytes()
    }

    /// States refused at a limit since start, by origin and limit.
    pub fn refusals(&self) -> Refusals {
        self.refusals
    }

    /// Operations waiting for other replicas.
    pub fn pending_operations(&self) -> usize {
        self.ops.len()
    }

    /// Durable writes issued ([`Output::Store`]) and not yet reported ([`Input::Stored`]).
    pub fn pending_durable_writes(&self) -> usize {
        self.durability.in_flight()
    }

    /// When the next timer or timeout is due; tick then.
    pub fn next_timer(&self) -> Instant {
        let mut next = self
            .next_gossip
            .min(self.next_deltas)
            .min(self.next_notify)
            .min(self.next_pruning);
        if let Some((deadline, _)) = self.deadlines.first() {
            next = next.min(*deadline);
        }
        next
    }

    /// Handles one input; returns what to do, in order.
    pub fn handle(&mut self, time: Time, input: Input) -> Vec<Output> {
        match input {
            Input::Command { id, command } => self.on_command(time, id, command),
            Input::Message { from, message } => self.on_message(time, from, message),
            Input::Membership(view) => self.on_membership(time, &view),
            Input::Tick => self.on_tick(time),
            Input::Stored { writes, result } => self.on_stored(writes, result),
        }
        std::mem::take(&mut self.outputs)
    }

    fn reply(&mut self, id: RequestId, response: Response) {
        self.outputs.push(Output::Reply { id, response });
    }

    fn send(&mut self, to: &UniqueAddress, message: ReplicatorMessage) {
        self.outputs.push(Output::Send {
            to: to.address.clone(),
            message,
        });
    }

    /// Stores a changed envelope of `size_bytes` encoded: notes it for subscribers and
    /// pruning, and emits the durable write for a durable key. Limits are checked before, by
    /// [`Replicator::store_checked`], except for pruning's changes.
    fn store_changed(&mut self, key: &str, envelope: DataEnvelope, size_bytes: usize) {
        if self.config.is_durable(key) {
            self.write_durably(key, envelope.clone());
        }
        if envelope.pruning.is_empty() {
            self.marked.remove(key);
        } else {
            self.marked.insert(key.to_string());
        }
        if self.subscribers.contains_key(key) {
            self.changed.insert(key.to_string());
        }
        self.store.put(key, envelope, size_bytes);
    }

    /// Merges a state received from elsewhere into this replica. Returns the conflict when
    /// the key holds another kind here and `incoming`'s kind lost (see
    /// [`DataEnvelope::merge`]), or the limit that refused the merged state (then nothing
    /// changed here).
    fn merge_incoming(
        &mut self,
        key: &str,
        incoming: &DataEnvelope,
    ) -> Result<Option<KindMismatch>, LimitExceeded> {
        let (merged, conflict) = match self.store.get(key) {
            None => (incoming.clone(), None),
            Some(local) => {
                let conflict = local.kind_conflict(incoming);
                let merged = local.merge(incoming);
                if &merged == local {
                    return Ok(conflict.filter(|c| c.offered != c.held.min(c.offered)));
                }
                (merged, conflict)
            }
        };
        self.store_checked(key, merged, limits::Origin::Remote)?;
        if let Some(conflict) = &conflict {
            tracing::warn!(key, held = %conflict.held, offered = %conflict.offered,
                "two kinds of value under one key; the lower kind wins on every replica");
        }
        Ok(conflict.filter(|c| c.offered != c.held.min(c.offered)))
    }

    fn on_command(&mut self, time: Time, id: RequestId, command: Command) {
        match command {
            Command::Get {
                key,
                consistency,
                timeout,
            } => self.on_get(time, id, key, consistency, timeout),
            Command::Update {
                key,
                consistency,
                timeout,
                modify,
            } => self.on_update(time, id, key, consistency, timeout, modify),
            Command::Delete {
                key,
                consistency,
                timeout,
            } => self.on_delete(time, id, key, consistency, timeout),
            Command::Subscribe { key, subscriber } => {
                let current = self.store.get(&key).map(|e| e.data.clone());
                self.subscribers
                    .entry(key.clone())
                    .or_default()
                    .insert(subscriber);
                if let Some(value) = current {
                    self.outputs.push(Output::Changed {
                        subscriber,
                        key,
                        value,
                    });
                }
                self.reply(id, Response::Subscribed);
            }
            Command::Unsubscribe { key, subscriber } => {
                if let Some(subs) = self.subscribers.get_mut(&key) {
                    subs.remove(&subscriber);
                    if subs.is_empty() {
                        self.subscribers.remove(&key);
                    }
                }
                self.reply(id, Response::Subscribed);
            }
            Command::Keys { after, limit } => {
                let live = self
                    .store
                    .iter()
                    .filter(|(_, e)| !e.is_deleted())
                    .map(|(k, _)| k.as_str());
                let page = KeysPage::of(live, after.as_deref(), limit);
                self.reply(id, Response::Keys(page));
            }
        }
    }

    fn on_message(&mut self, time: Time, from: UniqueAddress, message: ReplicatorMessage) {
        // A node removed from the cluster that still runs must not bring back what pruning
        // took out, nor count in anything.
        if self.members.removed.contains_key(&from) {
            return;
        }
        match message {
            ReplicatorMessage::Read {
                op,
                incarnation,
                key,
            } => {
                let envelope = self.store.get(&key).cloned();
                self.send(
                    &from,
                    ReplicatorMessage::ReadResult {
                        op,
                        incarnation,
                        key,
                        envelope,
                    },
                );
            }
            ReplicatorMessage::ReadResult {
                op,
                incarnation,
                key,
                envelope,
            } => {
                if incarnation == self.incarnation {
                    self.on_read_result(from, op, &key, envelope);
                }
            }
            ReplicatorMessage::Write {
                op,
                incarnation,
                key,
                envelope,
            } => match self.merge_incoming(&key, &envelope) {
                Ok(None) => {
                    let ack = Output::Send {
                        to: from.address.clone(),
                        message: ReplicatorMessage::WriteAck { op, incarnation },
                    };
                    self.acknowledge(&key, ack);
                }
                Ok(Some(conflict)) => {
                    let nack = ReplicatorMessage::WriteNack {
                        op,
                        incarnation,
                        reason: format!("key {key}: {conflict}"),
                    };
                    self.send(&from, nack);
                }
                // Not held here: this replica does not count toward the write.
                Err(refused) => {
                    let nack = ReplicatorMessage::WriteNack {
                        op,
                        incarnation,
                        reason: format!("replica {}: {refused}", self.self_node.address),
                    };
                    self.send(&from, nack);
                }
            },
            ReplicatorMessage::WriteAck { op, incarnation } => {
                if incarnation == self.incarnation {
                    self.on_write_ack(from, op);
                }
            }
            ReplicatorMessage::WriteNack {
                op,
                incarnation,
                reason,
            } => {
                if incarnation == self.incarnation {
                    self.on_write_nack(from, op, reason);
                }
            }
            ReplicatorMessage::Deltas {
                incarnation,
                deltas,
            } => self.on_deltas(from, incarnation, deltas),
            ReplicatorMessage::DeltaGap { keys } => self.send_full_state(&from, keys),
            ReplicatorMessage::Status { chunks } => self.on_status(&from, chunks),
            ReplicatorMessage::ChunkKeys { chunks, more } => {
                self.on_chunk_keys(time, &from, chunks, more)
            }
            ReplicatorMessage::Gossip {
                entries,
                send_back,
                reply_expected,
                more,
            } => self.on_gossip(time, &from, entries, send_back, reply_expected, more),
        }
    }

    fn on_membership(&mut self, time: Time, view: &MembershipView) {
        let before: BTreeSet<UniqueAddress> = self.members.receivers().cloned().collect();
        let removed = self.members.update(&self.self_node, view, time.now);
        for node in &removed {
            self.incoming_delta_seq.remove(node);
            self.exchanges.remove(node);
        }
        // A new member gets an anti-entropy exchange at once instead of waiting for random
        // gossip rounds to pick it: it fills up right after joining.
        let joined: Vec<UniqueAddress> = self
            .members
            .receivers()
            .filter(|n| !before.contains(*n))
            .cloned()
            .collect();
        if !self.store.is_empty() {
            for node in joined {
                self.start_exchange(time, &node);
            }
        }
    }

    fn on_tick(&mut self, time: Time) {
        self.expire_operations(time.now);
        if time.now >= self.next_deltas {
            self.next_deltas = time.now + self.config.delta_propagation_interval;
            self.propagate_deltas();
        }
        if time.now >= self.next_notify {
            self.next_notify = time.now + self.config.notify_subscribers_interval;
            self.notify_subscribers();
        }
        if time.now >= self.next_gossip {
            self.next_gossip = time.now + self.config.gossip_interval;
            self.gossip_to_random_peer(time);
        }
        if time.now >= self.next_pruning {
            self.next_pruning = time.now + self.config.pruning_interval;
            self.pruning_step(time);
        }
    }

    fn notify_subscribers(&mut self) {
        for key in std::mem::take(&mut self.changed) {
            let Some(subscribers) = self.subscribers.get(&key) else {
                continue;
            };
            let value = self.store.get(&key).and_then(|e| e.data.clone());
            for subscriber in subscribers {
                self.outputs.push(Output::Changed {
                    subscriber: *subscriber,
                    key: key.clone(),
                    value: value.clone(),
                });
            }
        }
    }
}

/// Splits `items` into batches whose estimated sizes stay below `max_bytes` (an item larger
/// than that travels alone).
fn split_by_size<T>(items: Vec<T>, max_bytes: usize, size: impl Fn(&T) -> usize) -> Vec<Vec<T>> {
    let mut batches = Vec::new();
    let mut batch = Vec::new();
    let mut batch_bytes = 0;
    for item in items {
        let item_bytes = size(&item);
        if !batch.is_empty() && batch_bytes + item_bytes > max_bytes {
            batches.push(std::mem::take(&mut batch));
            batch_bytes = 0;
        }
        batch_bytes += item_bytes;
        batch.push(item);
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::KeysPage;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn pages_of_keys_are_the_sorted_keys_in_order(
            keys in proptest::collection::btree_set("[a-e]{0,3}", 0..60),
            limit in 1usize..10,
        ) {
            // Shuffled input: the store holds keys in no particular order.
            let mut shuffled: Vec<&str> = keys.iter().map(String::as_str).collect();
            shuffled.reverse();
            shuffled.rotate_left(keys.len() / 3);
            let mut paged = Vec::new();
            let mut after: Option<String> = None;
            loop {
                let page = KeysPage::of(shuffled.iter().copied(), after.as_deref(), limit);
                prop_assert!(page.keys.len() <= limit);
                paged.extend(page.keys.iter().cloned());
                if !page.more {
                    break;
                }
                prop_assert_eq!(page.keys.len(), limit);
                after = page.keys.last().cloned();
            }
            prop_assert_eq!(paged, keys.into_iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_page_after_the_last_key_is_empty_and_final() {
        let keys = ["b", "a", "c"];
        let page = KeysPage::of(keys.iter().copied(), Some("c"), 5);
        assert_eq!(page, KeysPage::default());
        let page = KeysPage::of(keys.iter().copied(), None, 3);
        assert_eq!((page.keys.len(), page.more), (3, false));
    }
}
