//! Reads and writes at a consistency level: local first, then the other members, counting
//! the answers of the members that count until enough arrived or the timeout passed; a read
//! repairs the replicas that answered with an older state before it replies.

use super::limits::Origin;
use super::protocol::ReplicatorMessage;
use super::{
    DeleteResult, GetResult, Modify, Output, Replicator, RequestId, Response, Time, UpdateContext,
    UpdateResult,
};
use crate::consistency::{ReadConsistency, WriteConsistency};
use crate::envelope::DataEnvelope;
use crate::value::KindMismatch;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use tessera_cluster::UniqueAddress;

/// The longest timeout taken as given; longer ones are cut to it (no deadline overflows).
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// A read waiting for replies (then for its repairs).
pub(super) struct ReadOp {
    id: RequestId,
    key: String,
    /// Replies needed from other members that count.
    needed: usize,
    asked: BTreeSet<UniqueAddress>,
    replies: BTreeMap<UniqueAddress, Option<DataEnvelope>>,
    counted_replies: usize,
    /// Set once the quorum answered: the result, and the replicas still to acknowledge the
    /// repair (the replies themselves are dropped then).
    repair: Option<(GetResult, BTreeSet<UniqueAddress>)>,
}

/// A write (update or delete) waiting for acknowledgements.
pub(super) struct WriteOp {
    id: RequestId,
    /// The key written: its success waits for the key's durable write, if it is durable.
    key: String,
    delete: bool,
    needed: usize,
    asked: BTreeSet<UniqueAddress>,
    acks: BTreeSet<UniqueAddress>,
    nacks: BTreeMap<UniqueAddress, String>,
}

pub(super) enum PendingOp {
    Read(Box<ReadOp>),
    Write(WriteOp),
}

/// What a read answers for a key holding `envelope` (None: never written).
fn result_of(envelope: Option<&DataEnvelope>) -> GetResult {
    match envelope {
        None => GetResult::NotFound,
        Some(DataEnvelope { data: None, .. }) => GetResult::Deleted,
        Some(DataEnvelope {
            data: Some(value), ..
        }) => GetResult::Found(value.clone()),
    }
}

fn write_response(delete: bool, success: bool, timeout: bool, reason: String) -> Response {
    match (delete, success, timeout) {
        (true, true, _) => Response::Delete(DeleteResult::Success),
        (true, false, true) => Response::Delete(DeleteResult::Timeout),
        (true, false, false) => Response::Delete(DeleteResult::Failed(reason)),
        (false, true, _) => Response::Update(UpdateResult::Success),
        (false, false, true) => Response::Update(UpdateResult::Timeout),
        (false, false, false) => Response::Update(UpdateResult::Failed(reason)),
    }
}

impl Replicator {
    fn overload(&self) -> String {
        format!(
            "the replicator has {} operations waiting for other replicas (max_pending_operations); retry later",
            self.ops.len()
        )
    }

    /// Why a non-local operation cannot run here, if it cannot: a node that is not a member
    /// (not joined yet, or downed) would count only itself and call that a majority.
    fn refuse_quorum(&self, local: bool, required: usize) -> Option<String> {
        if !local && !self.members.self_member {
            return Some(
                "this node is not a member of a cluster (not joined yet, or downed): only consistency=local is possible"
                    .into(),
            );
        }
        if required > 1 && self.ops.len() >= self.config.max_pending_operations {
            return Some(self.overload());
        }
        None
    }

    fn local_result(&self, key: &str) -> GetResult {
        result_of(self.store.get(key))
    }

    pub(super) fn on_get(
        &mut self,
        time: Time,
        id: RequestId,
        key: String,
        consistency: ReadConsistency,
        timeout: Duration,
    ) {
        let required = consistency.required(self.members.counted_with_self());
        let local = consistency == ReadConsistency::Local;
        if let Some(reason) = self.refuse_quorum(local, required) {
            return self.reply(id, Response::Get(GetResult::Failed(reason)));
        }
        if required <= 1 {
            let result = self.local_result(&key);
            return self.reply(id, Response::Get(result));
        }
        let op = self.next_op_id();
        let asked: BTreeSet<UniqueAddress> = self.members.receivers().cloned().collect();
        for node in &asked {
            self.send(
                node,
                ReplicatorMessage::Read {
                    op,
                    incarnation: self.incarnation,
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
            time.now + timeout.min(MAX_TIMEOUT),
        );
    }

    pub(super) fn on_update(
        &mut self,
        time: Time,
        id: RequestId,
        key: String,
        consistency: WriteConsistency,
        timeout: Duration,
        modify: Modify,
    ) {
        let invalid = |reason: String| Response::Update(UpdateResult::Invalid(reason));
        let required = consistency.required(self.members.counted_with_self());
        let local = consistency == WriteConsistency::Local;
        if let Some(reason) = self.refuse_quorum(local, required) {
            return self.reply(id, Response::Update(UpdateResult::Failed(reason)));
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
            Err(reason) => return self.reply(id, invalid(reason)),
        };
        if let Some(current) = &current
            && current.kind() != new.kind()
        {
            let mismatch = KindMismatch {
                held: current.kind(),
                offered: new.kind(),
            };
            return self.reply(id, invalid(mismatch.to_string()));
        }
        // A change without a recorded delta (a register's first write) travels whole.
        let delta = new
            .delta()
            .or_else(|| (current.as_ref() != Some(&new)).then(|| new.clone()));
        new.reset_delta();
        let envelope = match existing {
            // `new` was made from the current value, so merging changes nothing but guards
            // against a `modify` that returned an unrelated value.
            Some(existing) => existing.merge(&DataEnvelope {
                data: Some(new),
                pruning: existing.pruning.clone(),
            }),
            None => DataEnvelope::new(new),
        };
        if let Err(refused) = self.store_checked(&key, envelope.clone(), Origin::Local) {
            return self.reply(id, Response::Update(UpdateResult::LimitReached(refused)));
        }
        if let Some(mut delta) = delta {
            delta.reset_delta();
            self.record_delta(&key, delta);
        }
        self.start_write(time, id, key, envelope, required, timeout, false);
    }

    pub(super) fn on_delete(
        &mut self,
        time: Time,
        id: RequestId,
        key: String,
        consistency: WriteConsistency,
        timeout: Duration,
    ) {
        let required = consistency.required(self.members.counted_with_self());
        let local = consistency == WriteConsistency::Local;
        if let Some(reason) = self.refuse_quorum(local, required) {
            return self.reply(id, Response::Delete(DeleteResult::Failed(reason)));
        }
        let deleted = DataEnvelope::deleted();
        if let Err(refused) = self.store_checked(&key, deleted.clone(), Origin::Local) {
            return self.reply(id, Response::Delete(DeleteResult::LimitReached(refused)));
        }
        self.pending_deltas.remove(&key);
        self.own_delta_seq.remove(&key);
        self.start_write(time, id, key, deleted, required, timeout, true);
    }

    #[allow(clippy::too_many_arguments)]
    fn start_write(
        &mut self,
        time: Time,
        id: RequestId,
        key: String,
        envelope: DataEnvelope,
        required: usize,
        timeout: Duration,
        delete: bool,
    ) {
        if required <= 1 {
            let success = write_response(delete, true, false, String::new());
            return self.acknowledge(
                &key,
                Output::Reply {
                    id,
                    response: success,
                },
            );
        }
        let op = self.next_op_id();
        let asked: BTreeSet<UniqueAddress> = self.members.receivers().cloned().collect();
        for node in &asked {
            self.send(
                node,
                ReplicatorMessage::Write {
                    op,
                    incarnation: self.incarnation,
                    key: key.clone(),
                    envelope: envelope.clone(),
                },
            );
        }
        self.add_op(
            op,
            PendingOp::Write(WriteOp {
                id,
                key,
                delete,
                needed: required - 1,
                asked,
                acks: BTreeSet::new(),
                nacks: BTreeMap::new(),
            }),
            time.now + timeout.min(MAX_TIMEOUT),
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

    pub(super) fn on_read_result(
        &mut self,
        from: UniqueAddress,
        op: u64,
        key: &str,
        envelope: Option<DataEnvelope>,
    ) {
        let counted = self.members.counted.contains(&from);
        let Some((PendingOp::Read(read), _)) = self.ops.get_mut(&op) else {
            return;
        };
        if read.key != key
            || read.repair.is_some()
            || !read.asked.contains(&from)
            || read.replies.contains_key(&from)
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
        let Some((PendingOp::Read(read), _)) = self.ops.get_mut(&op) else {
            return;
        };
        let key = read.key.clone();
        let id = read.id;
        let replies = std::mem::take(&mut read.replies);
        let mut merged = self.store.get(&key).cloned();
        for envelope in replies.values().flatten() {
            merged = Some(match merged {
                None => envelope.clone(),
                Some(m) => m.merge(envelope),
            });
        }
        let Some(merged) = merged else {
            self.remove_op(op);
            return self.reply(id, Response::Get(GetResult::NotFound));
        };
        let stale: BTreeSet<UniqueAddress> = replies
            .iter()
            .filter(|(_, reply)| reply.as_ref() != Some(&merged))
            .map(|(node, _)| node.clone())
            .collect();
        let result = match self.merge_incoming(&key, &merged) {
            Ok(_) => self.local_result(&key),
            // This replica cannot hold the key: the read still answers what the quorum holds.
            Err(_) => result_of(Some(&merged)),
        };
        if stale.is_empty() {
            self.remove_op(op);
            return self.reply(id, Response::Get(result));
        }
        for node in &stale {
            self.send(
                node,
                ReplicatorMessage::Write {
                    op,
                    incarnation: self.incarnation,
                    key: key.clone(),
                    envelope: merged.clone(),
                },
            );
        }
        if let Some((PendingOp::Read(read), _)) = self.ops.get_mut(&op) {
            read.repair = Some((result, stale));
        }
    }

    pub(super) fn on_write_ack(&mut self, from: UniqueAddress, op: u64) {
        let counted = self.members.counted.contains(&from);
        match self.ops.get_mut(&op) {
            Some((PendingOp::Write(write), _)) => {
                if !counted || !write.asked.contains(&from) {
                    return;
                }
                write.acks.insert(from);
                if write.acks.len() >= write.needed
                    && let Some(PendingOp::Write(write)) = self.remove_op(op)
                {
                    let success = write_response(write.delete, true, false, String::new());
                    let reply = Output::Reply {
                        id: write.id,
                        response: success,
                    };
                    self.acknowledge(&write.key, reply);
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

    pub(super) fn on_write_nack(&mut self, from: UniqueAddress, op: u64, reason: String) {
        let counted = &self.members.counted;
        match self.ops.get_mut(&op) {
            Some((PendingOp::Write(write), _)) => {
                if !counted.contains(&from) || !write.asked.contains(&from) {
                    return;
                }
                write.nacks.insert(from, reason.clone());
                // Only members that still count can still acknowledge.
                let possible = write
                    .asked
                    .iter()
                    .filter(|n| counted.contains(*n) && !write.nacks.contains_key(*n))
                    .count();
                if possible < write.needed {
                    let (id, delete) = (write.id, write.delete);
                    self.remove_op(op);
                    self.reply(id, write_response(delete, false, false, reason));
                }
            }
            Some((PendingOp::Read(read), _)) => {
                // A replica that refuses the repair will not take it later either.
                if let Some((_, awaiting)) = &mut read.repair {
                    awaiting.remove(&from);
                    if awaiting.is_empty() {
                        self.finish_repair(op);
                    }
                }
            }
            None => {}
        }
    }

    pub(super) fn expire_operations(&mut self, now: Instant) {
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
                    let response = write_response(write.delete, false, true, String::new());
                    self.reply(write.id, response);
                }
                None => {
                    self.deadlines.remove(&(deadline, op));
                }
            }
        }
    }
}
