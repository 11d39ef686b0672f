//! The replica service: answers writers' calls to this node's replica store over the
//! cluster transport.
//!
//! Calls are taken in the order they arrive (per sender, the transport keeps them in order)
//! and handed to the store at once, so that a writer's appends to one log are applied in the
//! order it sent them; the answer leaves once the store made the effect durable. A message
//! may carry one call or a batch (the calls of many logs to this node, taken in in order and
//! answered together). At most `max_in_flight` calls wait for the store: beyond that a
//! message is refused with a typed `Overloaded` answer, never queued without bound.

use crate::handler::ReplicaHandler;
use crate::wire::{ReplicaCalls, ReplicaReply, encode_replies};
use bytes::Bytes;
use std::sync::Arc;
use tessera_cluster::transport::{RemoteError, Responder, Transport, TransportError, services};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// Limits of the replica service.
#[derive(Clone, Debug)]
pub struct ReplicaServiceSettings {
    /// Calls waiting in the transport's inbound queue.
    pub queue_capacity: usize,
    /// Calls the store works on at once.
    pub max_in_flight: usize,
}

impl Default for ReplicaServiceSettings {
    fn default() -> Self {
        ReplicaServiceSettings {
            queue_capacity: 4_096,
            max_in_flight: 4_096,
        }
    }
}

/// Registers the replica service on `transport` and serves `handler` until the transport
/// shuts down.
pub(crate) fn start<T: Transport>(
    transport: &Arc<T>,
    handler: Arc<ReplicaHandler>,
    settings: ReplicaServiceSettings,
) -> Result<JoinHandle<()>, TransportError> {
    let mut inbound = transport.register(services::JOURNAL_REPLICA, settings.queue_capacity)?;
    let in_flight = Arc::new(Semaphore::new(settings.max_in_flight));
    Ok(tokio::spawn(async move {
        while let Some(message) = inbound.recv().await {
            let Some(reply) = message.reply else {
                // Only requests are part of the protocol; anything else is dropped.
                continue;
            };
            let calls = match ReplicaCalls::decode(&message.payload) {
                Ok(calls) => calls,
                Err(e) => {
                    let _ = reply.respond_error(RemoteError::Rejected {
                        reason: e.to_string(),
                    });
                    continue;
                }
            };
            let count = match &calls {
                ReplicaCalls::One(_) => 1,
                ReplicaCalls::Batch(calls) => calls.len(),
            };
            let permits = u32::try_from(count).unwrap_or(u32::MAX);
            let Ok(permit) = in_flight.clone().try_acquire_many_owned(permits) else {
                let _ = reply.respond_error(RemoteError::Overloaded {
                    service: services::JOURNAL_REPLICA,
                    capacity: settings.max_in_flight as u64,
                });
                continue;
            };
            // Every call is taken in by the store here, in the order received; only the
            // answers are awaited elsewhere.
            match calls {
                ReplicaCalls::One(call) => {
                    let answer = handler.handle_checked(call);
                    tokio::spawn(async move {
                        respond(reply, answer.await);
                        drop(permit);
                    });
                }
                ReplicaCalls::Batch(calls) => {
                    let answers = handler.handle_batch(calls);
                    tokio::spawn(async move {
                        respond_batch(reply, &answers.await);
                        drop(permit);
                    });
                }
            }
        }
    }))
}

fn respond_batch(reply: Responder, replies: &[ReplicaReply]) {
    match encode_replies(replies) {
        Ok(bytes) => {
            let _ = reply.respond(Bytes::from(bytes));
        }
        Err(e) => {
            let _ = reply.respond_error(RemoteError::Rejected {
                reason: format!("cannot encode the answers: {e}"),
            });
        }
    }
}

fn respond(reply: Responder, answer: ReplicaReply) {
    match answer.encode() {
        Ok(bytes) => {
            let _ = reply.respond(Bytes::from(bytes));
        }
        Err(e) => {
            let _ = reply.respond_error(RemoteError::Rejected {
                reason: format!("cannot encode the answer: {e}"),
            });
        }
    }
}
