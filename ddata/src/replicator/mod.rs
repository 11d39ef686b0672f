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
//! - **Durable keys** are written to disk (an [`Output::Store`]) before anything that
//!   acknowledges them is sent; the driver keeps that order.

mod anti_entropy;
mod members;
pub mod protocol;
mod pruning;
mod store;

pub use members::MembershipView;
pub use protocol::{ChunkKeyList, DeltaEntry, ReplicatorMessage};
pub use store::{CHUNKS, chunk_of};

use crate::consistency::{ReadConsistency, WriteConsistency};
use crate::envelope::DataEnvelope;
use crate::value::{KindMismatch, ReplicatedValue};
use members::Members;
use rand::SeedableRng;
use rand::rngs::SmallRng;
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
    /// Keys written to disk before they are acknowledged: exact names, or prefixes ending in
    /// `*`.
    pub durable_keys: Vec<String>,
    /// Largest anti-entropy or delta message, in encoded bytes (single envelopes larger than
    /// this still travel alone).
    pub max_message_bytes: usize,
    /// Reads and writes waiting for other replicas; more are refused as overload.
    pub max_pending_operations: usize,
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
            durable_keys: Vec::new(),
            max_message_bytes: 1024 * 1024,
            max_pending_operations: 10_000,
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
    /// The keys that hold a value (not deleted ones).
    Keys,
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
    /// Refused (overload) or refused by other replicas.
    Failed(String),
}

/// The answer to a `Delete`.
#[derive(Debug, Clone, PartialEq)]
pub enum DeleteResult {
    Success,
    /// Deleted locally, but not acknowledged by enough replicas in time. Not rolled back.
    Timeout,
    Failed(String),
}

/// A reply to a local request.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    Get(GetResult),
    Update(UpdateResult),
    Delete(DeleteResult),
    Keys(Vec<String>),
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
    /// Write this durable key to disk before any later output of the same step.
    Store {
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

/// A read waiting for replies (then for its repairs).
struct ReadOp {
    id: RequestId,
    key: String,
    /// Replies needed from other members that count.
    needed: usize,
    asked: BTreeSet<UniqueAddress>,
    replies: BTreeMap<UniqueAddress, Option<DataEnvelope>>,
    counted_replies: usize,
    /// Set once the quorum answered: the result, and the replicas still to acknowledge the
    /// repair.
    repair: Option<(GetResult, BTreeSet<UniqueAddress>)>,
}

/// A write (update or delete) waiting for acknowledgements.
struct WriteOp {
    id: RequestId,
    delete: bool,
    needed: usize,
    asked: BTreeSet<UniqueAddress>,
    acks: BTreeSet<UniqueAddress>,
    nacks: BTreeMap<UniqueAddress, String>,
}

enum PendingOp {
    Read(Box<ReadOp>),
    Write(WriteOp),
}

/// One node's Replicator.
pub struct Replicator {
    self_node: UniqueAddress,
    config: ReplicatorConfig,
    store: Store,
    members: Members,
    ops: HashMap<u64, (PendingOp, Instant)>,
    deadlines: BTreeSet<(Instant, u64)>,
    next_op: u64,
    own_delta_seq: HashMap<String, u64>,
    pending_deltas: BTreeMap<String, DeltaEntry>,
    incoming_delta_seq: HashMap<(UniqueAddress, String), u64>,
    subscribers: BTreeMap<String, BTreeSet<SubscriberId>>,
    changed: BTreeSet<String>,
    /// Keys whose envelopes carry pruning markers.
    marked: BTreeSet<String>,
    /// Removed nodes the leader has not yet started pruning everywhere.
    pruning_pending: BTreeSet<UniqueAddress>,
    next_gossip: Instant,
    next_deltas: Instant,
    next_notify: Instant,
    next_pruning: Instant,
    rng: SmallRng,
    outputs: Vec<Output>,
}

impl Replicator {
    /// A Replicator for `self_node`; `seed` drives its random choices (gossip peers).
    pub fn new(
        self_node: UniqueAddress,
        config: ReplicatorConfig,
        seed: u64,
        now: Instant,
    ) -> Self {
        Replicator {
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
            pruning_pending: BTreeSet::new(),
            rng: SmallRng::seed_from_u64(seed),
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

    /// Loads a key read from the durable store at start, before any input.
    pub fn load(&mut self, key: &str, envelope: DataEnvelope) {
        if !envelope.pruning.is_empty() {
            self.marked.insert(key.to_string());
        }
        self.store.put(key, envelope);
    }

    /// This replica's state of `key`.
    pub fn envelope(&self, key: &str) -> Option<&DataEnvelope> {
        self.store.get(key)
    }

    /// Number of keys held, deleted ones included.
    pub fn key_count(&self) -> usize {
        self.store.len()
    }

    /// Operations waiting for other replicas.
    pub fn pending_operations(&self) -> usize {
        self.ops.len()
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

    /// Stores a changed envelope: notes it for subscribers and pruning, and emits the
    /// durable write for a durable key.
    fn store_changed(&mut self, key: &str, envelope: DataEnvelope) {
        if self.config.is_durable(key) {
            self.outputs.push(Output::Store {
                key: key.to_string(),
                envelope: envelope.clone(),
            });
        }
        if envelope.pruning.is_empty() {
            self.marked.remove(key);
        } else {
            self.marked.insert(key.to_string());
        }
        if self.subscribers.contains_key(key) {
            self.changed.insert(key.to_string());
        }
        self.store.put(key, envelope);
    }

    /// Merges a state received from elsewhere into this replica. Returns whether it changed.
    fn merge_incoming(&mut self, key: &str, incoming: &DataEnvelope) -> Result<bool, KindMismatch> {
        let merged = match self.store.get(key) {
            None => incoming.clone(),
            Some(local) => {
                let merged = local.merge(incoming)?;
                if &merged == local {
                    return Ok(false);
                }
                merged
            }
        };
        self.store_changed(key, merged);
        Ok(true)
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
            } => {
                if self.ops.len() >= self.config.max_pending_operations {
                    return self.reply(id, Response::Delete(DeleteResult::Failed(self.overload())));
                }
                let deleted = DataEnvelope::deleted();
                self.store_changed(&key, deleted.clone());
                self.pending_deltas.remove(&key);
                self.start_write(time, id, key, deleted, consistency, timeout, true);
            }
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
            Command::Keys => {
                let keys = self
                    .store
                    .iter()
                    .filter(|(_, e)| !e.is_deleted())
                    .map(|(k, _)| k.clone())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                self.reply(id, Response::Keys(keys));
            }
        }
    }

    fn overload(&self) -> String {
        format!(
            "the replicator has {} operations waiting for other replicas (max_pending_operations); retry later",
            self.ops.len()
        )
    }

    fn local_result(&self, key: &str) -> GetResult {
        match self.store.get(key) {
            None => GetResult::NotFound,
            Some(DataEnvelope { data: None, .. }) => GetResult::Deleted,
            Some(DataEnvelope {
                data: Some(value), ..
            }) => GetResult::Found(value.clone()),
        }
    }

    fn on_get(
        &mut self,
        time: Time,
        id: RequestId,
        key: String,
        consistency: ReadConsistency,
        timeout: Duration,
    ) {
        let required = consistency.required(self.members.counted_with_self());
        if required <= 1 {
            let result = self.local_result(&key);
            return self.reply(id, Response::Get(result));
        }
        if self.ops.len() >= self.config.max_pending_operations {
            return self.reply(id, Response::Get(GetResult::Failed(self.overload())));
        }
        let op = self.next_op_id();
        let asked: BTreeSet<UniqueAddress> = self.members.receivers().cloned().collect();
        for node in &asked {
            self.send(
                node,
                ReplicatorMessage::Read {
                    op,
                    key: key.clone(),
                },
            );
        }
        self.add_op(
            op,
            PendingOp::Read(Box::new(ReadOp {
                id,
                key,
                needed: required - 1,
                asked,
                replies: BTreeMap::new(),
                counted_replies: 0,
                repair: None,
            })),
            time.now + timeout,
        );
    }

    fn on_update(
        &mut self,
        time: Time,
        id: RequestId,
        key: String,
        consistency: WriteConsistency,
        timeout: Duration,
        modify: Modify,
    ) {
        if self.ops.len() >= self.config.max_pending_operations {
            return self.reply(id, Response::Update(UpdateResult::Failed(self.overload())));
        }
        let existing = self.store.get(&key).cloned();
        if existing.as_ref().is_some_and(DataEnvelope::is_deleted) {
            return self.reply(id, Response::Update(UpdateResult::Deleted));
        }
        let current = existing.as_ref().and_then(|e| e.data.clone());
        let context = UpdateContext {
            self_node: &self.self_node,
            now_wall_ms: time.wall_ms,
        };
        let mut new = match modify(current.clone(), &context) {
            Ok(value) => value,
            Err(reason) => return self.reply(id, Response::Update(UpdateResult::Invalid(reason))),
        };
        if let Some(current) = &current
            && current.kind() != new.kind()
        {
            let mismatch = KindMismatch {
                held: current.kind(),
                offered: new.kind(),
            };
            return self.reply(
                id,
                Response::Update(UpdateResult::Invalid(mismatch.to_string())),
            );
        }
        let delta = new.delta();
        new.reset_delta();
        let envelope = match existing {
            // `new` was made from the current value, so merging changes nothing but guards
            // against a `modify` that returned an unrelated value.
            Some(existing) => {
                match existing.merge(&DataEnvelope {
                    data: Some(new),
                    pruning: existing.pruning.clone(),
                }) {
                    Ok(merged) => merged,
                    Err(e) => {
                        return self
                            .reply(id, Response::Update(UpdateResult::Invalid(e.to_string())));
                    }
                }
            }
            None => DataEnvelope::new(new),
        };
        self.store_changed(&key, envelope.clone());
        if let Some(delta) = delta {
            self.record_delta(&key, delta);
        }
        self.start_write(time, id, key, envelope, consistency, timeout, false);
    }

    #[allow(clippy::too_many_arguments)]
    fn start_write(
        &mut self,
        time: Time,
        id: RequestId,
        key: String,
        envelope: DataEnvelope,
        consistency: WriteConsistency,
        timeout: Duration,
        delete: bool,
    ) {
        let required = consistency.required(self.members.counted_with_self());
        if required <= 1 {
            let response = if delete {
                Response::Delete(DeleteResult::Success)
            } else {
                Response::Update(UpdateResult::Success)
            };
            return self.reply(id, response);
        }
        let op = self.next_op_id();
        let asked: BTreeSet<UniqueAddress> = self.members.receivers().cloned().collect();
        for node in &asked {
            self.send(
                node,
                ReplicatorMessage::Write {
                    op,
                    key: key.clone(),
                    envelope: envelope.clone(),
                },
            );
        }
        self.add_op(
            op,
            PendingOp::Write(WriteOp {
                id,
                delete,
                needed: required - 1,
                asked,
                acks: BTreeSet::new(),
                nacks: BTreeMap::new(),
            }),
            time.now + timeout,
        );
    }

    fn next_op_id(&mut self) -> u64 {
        let op = self.next_op;
        self.next_op += 1;
        op
    }

    fn add_op(&mut self, op: u64, pending: PendingOp, deadline: Instant) {
        self.deadlines.insert((deadline, op));
        self.ops.insert(op, (pending, deadline));
    }

    fn remove_op(&mut self, op: u64) -> Option<PendingOp> {
        let (pending, deadline) = self.ops.remove(&op)?;
        self.deadlines.remove(&(deadline, op));
        Some(pending)
    }

    fn on_message(&mut self, time: Time, from: UniqueAddress, message: ReplicatorMessage) {
        match message {
            ReplicatorMessage::Read { op, key } => {
                let envelope = self.store.get(&key).cloned();
                self.send(&from, ReplicatorMessage::ReadResult { op, envelope });
            }
            ReplicatorMessage::ReadResult { op, envelope } => {
                self.on_read_result(from, op, envelope)
            }
            ReplicatorMessage::Write { op, key, envelope } => {
                let answer = match self.merge_incoming(&key, &envelope) {
                    Ok(_) => ReplicatorMessage::WriteAck { op },
                    Err(e) => ReplicatorMessage::WriteNack {
                        op,
                        reason: format!("key {key}: {e}"),
                    },
                };
                self.send(&from, answer);
            }
            ReplicatorMessage::WriteAck { op } => self.on_write_ack(from, op),
            ReplicatorMessage::WriteNack { op, reason } => self.on_write_nack(from, op, reason),
            ReplicatorMessage::Deltas { deltas } => self.on_deltas(from, deltas),
            ReplicatorMessage::DeltaGap { keys } => self.send_full_state(&from, keys),
            ReplicatorMessage::Status { chunks } => self.on_status(&from, chunks),
            ReplicatorMessage::ChunkKeys { chunks, more } => {
                self.on_chunk_keys(&from, chunks, more)
            }
            ReplicatorMessage::Gossip {
                entries,
                send_back,
                reply_expected,
                more,
            } => self.on_gossip(time, &from, entries, send_back, reply_expected, more),
        }
    }

    fn on_read_result(&mut self, from: UniqueAddress, op: u64, envelope: Option<DataEnvelope>) {
        let counted = self.members.counted.contains(&from);
        let Some((PendingOp::Read(read), _)) = self.ops.get_mut(&op) else {
            return;
        };
        if read.repair.is_some() || !read.asked.contains(&from) || read.replies.contains_key(&from)
        {
            return;
        }
        read.replies.insert(from, envelope);
        if counted {
            read.counted_replies += 1;
        }
        if read.counted_replies >= read.needed {
            self.finish_read(op);
        }
    }

    /// The quorum answered: merge, keep the result locally, and repair the replicas that
    /// answered with an older state before replying.
    fn finish_read(&mut self, op: u64) {
        let Some((PendingOp::Read(read), _)) = self.ops.get(&op) else {
            return;
        };
        let key = read.key.clone();
        let id = read.id;
        let mut merged = self.store.get(&key).cloned();
        for envelope in read.replies.values().flatten() {
            merged = Some(match merged {
                None => envelope.clone(),
                Some(m) => match m.merge(envelope) {
                    Ok(m) => m,
                    // A replica holding another kind under this key is left out of the read.
                    Err(_) => m,
                },
            });
        }
        let Some(merged) = merged else {
            self.remove_op(op);
            return self.reply(id, Response::Get(GetResult::NotFound));
        };
        let stale: BTreeSet<UniqueAddress> = read
            .replies
            .iter()
            .filter(|(_, reply)| reply.as_ref() != Some(&merged))
            .map(|(node, _)| node.clone())
            .collect();
        let _ = self.merge_incoming(&key, &merged);
        let result = self.local_result(&key);
        if stale.is_empty() {
            self.remove_op(op);
            return self.reply(id, Response::Get(result));
        }
        for node in &stale {
            self.send(
                node,
                ReplicatorMessage::Write {
                    op,
                    key: key.clone(),
                    envelope: merged.clone(),
                },
            );
        }
        if let Some((PendingOp::Read(read), _)) = self.ops.get_mut(&op) {
            read.repair = Some((result, stale));
        }
    }

    fn on_write_ack(&mut self, from: UniqueAddress, op: u64) {
        let counted = self.members.counted.contains(&from);
        match self.ops.get_mut(&op) {
            Some((PendingOp::Write(write), _)) => {
                if !counted || !write.asked.contains(&from) {
                    return;
                }
                write.acks.insert(from);
                if write.acks.len() >= write.needed {
                    let response = if write.delete {
                        Response::Delete(DeleteResult::Success)
                    } else {
                        Response::Update(UpdateResult::Success)
                    };
                    let id = write.id;
                    self.remove_op(op);
                    self.reply(id, response);
                }
            }
            Some((PendingOp::Read(read), _)) => {
                let Some((_, awaiting)) = &mut read.repair else {
                    return;
                };
                awaiting.remove(&from);
                if awaiting.is_empty() {
                    self.finish_repair(op);
                }
            }
            None => {}
        }
    }

    fn finish_repair(&mut self, op: u64) {
        if let Some(PendingOp::Read(read)) = self.remove_op(op) {
            let result = read.repair.map_or(GetResult::Timeout, |(result, _)| result);
            self.reply(read.id, Response::Get(result));
        }
    }

    fn on_write_nack(&mut self, from: UniqueAddress, op: u64, reason: String) {
        let Some((PendingOp::Write(write), _)) = self.ops.get_mut(&op) else {
            return;
        };
        if !self.members.counted.contains(&from) || !write.asked.contains(&from) {
            return;
        }
        write.nacks.insert(from, reason.clone());
        let counted_asked = write
            .asked
            .iter()
            .filter(|n| self.members.counted.contains(*n))
            .count();
        let possible = counted_asked - write.nacks.len();
        if possible < write.needed {
            let (id, delete) = (write.id, write.delete);
            self.remove_op(op);
            let response = if delete {
                Response::Delete(DeleteResult::Failed(reason))
            } else {
                Response::Update(UpdateResult::Failed(reason))
            };
            self.reply(id, response);
        }
    }

    fn on_membership(&mut self, time: Time, view: &MembershipView) {
        let before: BTreeSet<UniqueAddress> = self.members.receivers().cloned().collect();
        let removed = self.members.update(&self.self_node, view, time.now);
        for node in removed {
            self.incoming_delta_seq.retain(|(from, _), _| from != &node);
            self.pruning_pending.insert(node);
        }
        // A new member starts an anti-entropy exchange with everyone at once instead of
        // waiting for random gossip rounds to pick it: it fills up right after joining.
        let joined: Vec<UniqueAddress> = self
            .members
            .receivers()
            .filter(|n| !before.contains(*n))
            .cloned()
            .collect();
        if !self.store.is_empty() {
            for node in joined {
                self.send_status(&node);
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
            self.gossip_to_random_peer();
        }
        if time.now >= self.next_pruning {
            self.next_pruning = time.now + self.config.pruning_interval;
            self.pruning_step(time);
        }
    }

    fn expire_operations(&mut self, now: Instant) {
        while let Some(&(deadline, op)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            match self.remove_op(op) {
                Some(PendingOp::Read(read)) => {
                    // A read whose quorum answered succeeded; only its repairs ran late.
                    let result = read.repair.map_or(GetResult::Timeout, |(result, _)| result);
                    self.reply(read.id, Response::Get(result));
                }
                Some(PendingOp::Write(write)) => {
                    let response = if write.delete {
                        Response::Delete(DeleteResult::Timeout)
                    } else {
                        Response::Update(UpdateResult::Timeout)
                    };
                    self.reply(write.id, response);
                }
                None => {
                    self.deadlines.remove(&(deadline, op));
                }
            }
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

    fn record_delta(&mut self, key: &str, delta: ReplicatedValue) {
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
                    },
                );
            }
        }
    }

    /// Sends the accumulated deltas to every member, in messages below the size bound.
    fn propagate_deltas(&mut self) {
        if self.pending_deltas.is_empty() {
            return;
        }
        let receivers: Vec<UniqueAddress> = self.members.receivers().cloned().collect();
        let deltas: Vec<DeltaEntry> = std::mem::take(&mut self.pending_deltas)
            .into_values()
            .collect();
        if receivers.is_empty() {
            return;
        }
        for batch in split_by_size(deltas, self.config.max_message_bytes, |d| {
            d.key.len() + crate::codec::encode("delta", &d.delta).map_or(0, |b| b.len()) + 24
        }) {
            for node in &receivers {
                self.send(
                    node,
                    ReplicatorMessage::Deltas {
                        deltas: batch.clone(),
                    },
                );
            }
        }
    }

    fn on_deltas(&mut self, from: UniqueAddress, deltas: Vec<DeltaEntry>) {
        let mut gaps = Vec::new();
        for entry in deltas {
            let seq_key = (from.clone(), entry.key.clone());
            let last = self.incoming_delta_seq.get(&seq_key).copied().unwrap_or(0);
            if entry.to_seq <= last {
                continue;
            }
            if entry.from_seq > last + 1 {
                gaps.push(entry.key.clone());
            }
            self.incoming_delta_seq.insert(seq_key, entry.to_seq);
            let merged = match self.store.get(&entry.key) {
                Some(local) if local.is_deleted() => continue,
                Some(local) => {
                    let mut merged = local.clone();
                    if merged.merge_delta(&entry.delta).is_err() || &merged == local {
                        continue;
                    }
                    merged
                }
                // A delta is a state of its lattice: joined with nothing it is the state.
                None => {
                    let mut value = entry.delta;
                    value.reset_delta();
                    DataEnvelope::new(value)
                }
            };
            self.store_changed(&entry.key, merged);
        }
        if !gaps.is_empty() {
            self.send(&from, ReplicatorMessage::DeltaGap { keys: gaps });
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
