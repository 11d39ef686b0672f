//! Acknowledgements that wait for the disk. A change of a durable key becomes an
//! [`Output::Store`] with a [`DurableWriteId`]; the driver writes it whenever it likes (group
//! commit, off the Replicator's task) and reports it with [`Input::Stored`]. Until then, every
//! output that claims the key is stored — the success reply of a local update or delete, the
//! `WriteAck` of a replica — is held here, and only those: reads, sends and notifications go
//! out at once.
//!
//! The rule: an acknowledgement of a durable key waits for the latest write of that key issued
//! up to the acknowledgement (every write stores the key's whole state, so the latest covers
//! all earlier changes). When that write fails, what waits on it is withheld: a replica's
//! `WriteAck` is not sent (its requester counts it as silent), a local success becomes
//! `Failed`. A key whose latest write failed is written again before its next
//! acknowledgement, so one disk error does not refuse the key for good.
//!
//! [`Output::Store`]: super::Output::Store
//! [`Input::Stored`]: super::Input::Stored

use super::{DeleteResult, Output, Replicator, Response, UpdateResult};
use crate::envelope::DataEnvelope;
use std::collections::HashMap;

/// Identifies one durable write (one [`super::Output::Store`]) of a Replicator.
pub type DurableWriteId = u64;

/// The durable writes not yet reported and the acknowledgements waiting for them.
#[derive(Default)]
pub(super) struct Durability {
    next_write: DurableWriteId,
    /// Durable keys whose disk state may lag behind memory: the latest write is in flight, or
    /// failed. A key absent here is stored as it is held (or not durable).
    keys: HashMap<String, KeyDurability>,
    /// Issued and not yet reported, with what waits for each.
    in_flight: HashMap<DurableWriteId, InFlightWrite>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum KeyDurability {
    /// The latest write of the key, not reported yet.
    Writing(DurableWriteId),
    /// The latest write of the key failed: what memory holds may not be on disk.
    Failed,
}

struct InFlightWrite {
    key: String,
    held: Vec<Output>,
}

impl Durability {
    /// Durable writes issued and not yet reported.
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

impl Replicator {
    /// Emits the write of `key`'s state to the durable store; acknowledgements of the key wait
    /// for it from now on.
    pub(super) fn write_durably(&mut self, key: &str, envelope: DataEnvelope) {
        let durability = &mut self.durability;
        durability.next_write += 1;
        let write = durability.next_write;
        durability
            .keys
            .insert(key.to_string(), KeyDurability::Writing(write));
        durability.in_flight.insert(
            write,
            InFlightWrite {
                key: key.to_string(),
                held: Vec::new(),
            },
        );
        self.outputs.push(Output::Store {
            write,
            key: key.to_string(),
            envelope,
        });
    }

    /// Emits `output`, an acknowledgement that `key` is stored as this replica holds it now:
    /// at once for a key that is not durable or whose writes are all done, else once the
    /// key's latest write is reported stored (and never if it fails).
    pub(super) fn acknowledge(&mut self, key: &str, output: Output) {
        if !self.config.is_durable(key) {
            return self.outputs.push(output);
        }
        let write = match self.durability.keys.get(key).copied() {
            None => return self.outputs.push(output),
            Some(KeyDurability::Writing(write)) => write,
            Some(KeyDurability::Failed) => {
                let Some(envelope) = self.store.get(key).cloned() else {
                    // Nothing held under the key: nothing to claim stored.
                    return self.outputs.push(output);
                };
                self.write_durably(key, envelope);
                self.durability.next_write
            }
        };
        match self.durability.in_flight.get_mut(&write) {
            Some(in_flight) => in_flight.held.push(output),
            // Unreachable by construction (a key's latest write is in flight until reported),
            // but if it happened the key would be stored already.
            None => self.outputs.push(output),
        }
    }

    /// The driver reports `writes` as stored (`Ok`) or failed: releases or withholds what
    /// waited for them. Unknown ids (reported twice, or never issued) are ignored.
    pub(super) fn on_stored(&mut self, writes: Vec<DurableWriteId>, result: Result<(), String>) {
        for write in writes {
            let Some(InFlightWrite { key, held }) = self.durability.in_flight.remove(&write) else {
                continue;
            };
            if self.durability.keys.get(&key) == Some(&KeyDurability::Writing(write)) {
                match &result {
                    Ok(()) => self.durability.keys.remove(&key),
                    Err(_) => self.durability.keys.insert(key, KeyDurability::Failed),
                };
            }
            for output in held {
                match &result {
                    Ok(()) => self.outputs.push(output),
                    Err(error) => {
                        if let Some(failed) = withheld(output, error) {
                            self.outputs.push(failed);
                        }
                    }
                }
            }
        }
    }
}

/// What becomes of an acknowledgement whose durable write failed: a local success turns into
/// a failure naming the error; a replica's acknowledgement is not sent (`None`).
fn withheld(output: Output, error: &str) -> Option<Output> {
    let failed = |what: &str| format!("durable store: {what}");
    match output {
        Output::Reply {
            id,
            response: Response::Update(UpdateResult::Success),
        } => Some(Output::Reply {
            id,
            response: Response::Update(UpdateResult::Failed(failed(error))),
        }),
        Output::Reply {
            id,
            response: Response::Delete(DeleteResult::Success),
        } => Some(Output::Reply {
            id,
            response: Response::Delete(DeleteResult::Failed(failed(error))),
        }),
        Output::Reply { id, response } => Some(Output::Reply { id, response }),
        Output::Send { .. } | Output::Changed { .. } | Output::Store { .. } => None,
    }
}
