//! [`SingletonProxy`]: sends requests to wherever a singleton's instance runs.
//!
//! The proxy's task routes to the oldest Up or Leaving member (of the singleton's role), as
//! the node's membership view says, through [`Transport::request`] — or straight to the
//! router when that is this node. While no such member is known, while it is unreachable,
//! or after it answered that the instance does not run there (a hand-over is under way), the
//! request waits in the proxy's buffer and is sent again on the next membership change or
//! after `proxy_retry_interval`. The buffer holds at most `proxy_buffer_capacity` requests,
//! counting those in flight; a request beyond that is refused with
//! [`ProxyError::BufferFull`]. Requests are (re)sent in the order they were made.
//!
//! Only requests that certainly did not reach the instance are sent again. One that may have
//! reached it and got no answer (timeout, dropped) fails with an error: the outcome is unknown.

use super::manager::oldest_eligible;
use super::message::{ProxyReply, SingletonFrame};
use super::requests::{RouterCommand, SINGLETON_LANE};
use super::settings::SingletonSettings;
use crate::address::Address;
use crate::codec::DecodeError;
use crate::node::ClusterSnapshot;
use crate::transport::{RemoteError, RequestError, SendError, Transport, services};
use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Why a request through the proxy got no answer from the instance.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    #[error(
        "the proxy of singleton {name:?} holds {capacity} requests (proxy_buffer_capacity); request refused"
    )]
    BufferFull { name: String, capacity: usize },
    #[error(
        "the instance of singleton {name:?} on {at} has {capacity} requests queued (instance_queue_capacity); request refused"
    )]
    InstanceOverloaded {
        name: String,
        at: Address,
        capacity: u64,
    },
    /// The request may or may not have been handled.
    #[error("the instance of singleton {name:?} on {at} dropped the request unanswered")]
    Dropped { name: String, at: Address },
    /// The request may or may not have been handled (a timeout, a refusal).
    #[error("request to singleton {name:?} on {at} failed: {source}")]
    Request {
        name: String,
        at: Address,
        #[source]
        source: RequestError,
    },
    #[error("undecodable answer of singleton {name:?} from {at}: {source}")]
    Decode {
        name: String,
        at: Address,
        #[source]
        source: DecodeError,
    },
    #[error("the proxy of singleton {name:?} has stopped")]
    Stopped { name: String },
}

/// A proxy to one singleton. Cheap to clone; the proxy's task ends when every clone is
/// dropped or the node's [`Singletons`](super::driver::Singletons) shut down.
#[derive(Clone, Debug)]
pub struct SingletonProxy {
    name: String,
    capacity: usize,
    permits: Arc<Semaphore>,
    commands: mpsc::Sender<Pending>,
}

impl SingletonProxy {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sends `payload` to the instance and returns its answer; waits in the buffer while
    /// there is no instance to send it to (wrap it in a timeout to bound that wait).
    pub async fn request(&self, payload: Bytes) -> Result<Bytes, ProxyError> {
        let permit =
            self.permits
                .clone()
                .try_acquire_owned()
                .map_err(|_| ProxyError::BufferFull {
                    name: self.name.clone(),
                    capacity: self.capacity,
                })?;
        let (reply, answer) = oneshot::channel();
        // The channel holds as many requests as there are permits, so it is never full.
        self.commands
            .try_send(Pending {
                seq: 0,
                payload,
                reply,
                _permit: permit,
            })
            .map_err(|_| self.stopped())?;
        answer.await.map_err(|_| self.stopped())?
    }

    /// Requests buffered or in flight.
    pub fn outstanding(&self) -> usize {
        self.capacity - self.permits.available_permits()
    }

    fn stopped(&self) -> ProxyError {
        ProxyError::Stopped {
            name: self.name.clone(),
        }
    }
}

struct Pending {
    /// Order of arrival: re-buffered requests go back to their place.
    seq: u64,
    payload: Bytes,
    reply: oneshot::Sender<Result<Bytes, ProxyError>>,
    _permit: OwnedSemaphorePermit,
}

/// What became of one attempt.
enum Attempt {
    Answered(Result<Bytes, ProxyError>),
    /// It did not reach the instance: buffer it again.
    NotDelivered,
}

pub(crate) fn start<T: Transport>(
    name: String,
    settings: SingletonSettings,
    transport: Arc<T>,
    membership: watch::Receiver<ClusterSnapshot>,
    router: mpsc::Sender<RouterCommand>,
    shutdown: CancellationToken,
) -> SingletonProxy {
    let capacity = settings.proxy_buffer_capacity;
    let (commands_tx, commands_rx) = mpsc::channel(capacity);
    let task = ProxyTask {
        name: name.clone(),
        settings,
        transport,
        router,
        target: None,
        buffer: BTreeMap::new(),
        next_seq: 0,
        retry_at: None,
    };
    tokio::spawn(task.run(commands_rx, membership, shutdown));
    SingletonProxy {
        name,
        capacity,
        permits: Arc::new(Semaphore::new(capacity)),
        commands: commands_tx,
    }
}

struct ProxyTask<T: Transport> {
    name: String,
    settings: SingletonSettings,
    transport: Arc<T>,
    router: mpsc::Sender<RouterCommand>,
    /// Where the instance should be, and whether that is this node.
    target: Option<(Address, bool)>,
    buffer: BTreeMap<u64, Pending>,
    next_seq: u64,
    /// Set after the target said it runs no instance: wait until then (or a membership
    /// change) before sending again.
    retry_at: Option<Instant>,
}

impl<T: Transport> ProxyTask<T> {
    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Pending>,
        mut membership: watch::Receiver<ClusterSnapshot>,
        shutdown: CancellationToken,
    ) {
        let mut in_flight: FuturesUnordered<BoxFuture<'static, (Pending, Attempt)>> =
            FuturesUnordered::new();
        membership.mark_changed();
        let mut membership_open = true;
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                changed = membership.changed(), if membership_open => match changed {
                    Ok(()) => {
                        self.target = self.oldest(&membership.borrow_and_update());
                        self.retry_at = None;
                    }
                    Err(_) => membership_open = false,
                },
                Some((pending, attempt)) = in_flight.next(), if !in_flight.is_empty() => {
                    match attempt {
                        Attempt::Answered(result) => {
                            let _ = pending.reply.send(result);
                        }
                        Attempt::NotDelivered => {
                            self.buffer.insert(pending.seq, pending);
                            if self.retry_at.is_none() {
                                self.retry_at =
                                    Some(Instant::now() + self.settings.proxy_retry_interval);
                            }
                        }
                    }
                }
                _ = sleep_until(self.retry_at), if self.retry_at.is_some() => self.retry_at = None,
                command = commands.recv() => match command {
                    Some(mut pending) => {
                        pending.seq = self.next_seq;
                        self.next_seq += 1;
                        self.buffer.insert(pending.seq, pending);
                    }
                    None => break,
                },
            }
            self.dispatch(&mut in_flight);
        }
    }

    /// Sends every buffered request to the target, if there is one to send to now.
    fn dispatch(
        &mut self,
        in_flight: &mut FuturesUnordered<BoxFuture<'static, (Pending, Attempt)>>,
    ) {
        if self.retry_at.is_some() {
            return;
        }
        let Some((to, local)) = self.target.clone() else {
            return;
        };
        while let Some((_, pending)) = self.buffer.pop_first() {
            // A caller that gave up needs no answer.
            if pending.reply.is_closed() {
                continue;
            }
            let attempt = if local {
                self.local_attempt(to.clone(), pending)
            } else {
                self.remote_attempt(to.clone(), pending)
            };
            in_flight.push(attempt);
        }
    }

    fn remote_attempt(
        &self,
        to: Address,
        pending: Pending,
    ) -> BoxFuture<'static, (Pending, Attempt)> {
        let transport = self.transport.clone();
        let name = self.name.clone();
        let timeout = self.settings.proxy_request_timeout;
        let frame = SingletonFrame::Request {
            name: name.clone(),
            payload: pending.payload.clone(),
        }
        .encode();
        async move {
            let result = transport
                .request(&to, services::SINGLETON, SINGLETON_LANE, frame, timeout)
                .await;
            let attempt = match result {
                Ok(bytes) => from_reply(&name, &to, ProxyReply::decode(&bytes)),
                Err(error) => from_request_error(&name, &to, error),
            };
            (pending, attempt)
        }
        .boxed()
    }

    fn local_attempt(
        &self,
        to: Address,
        pending: Pending,
    ) -> BoxFuture<'static, (Pending, Attempt)> {
        let (reply, answer) = oneshot::channel();
        let sent = self.router.try_send(RouterCommand::Local {
            name: self.name.clone(),
            payload: pending.payload.clone(),
            reply,
        });
        let name = self.name.clone();
        let timeout = self.settings.proxy_request_timeout;
        async move {
            if sent.is_err() {
                return (pending, Attempt::NotDelivered);
            }
            let attempt = match tokio::time::timeout(timeout, answer).await {
                Ok(Ok(reply)) => from_reply(&name, &to, Ok(reply)),
                Ok(Err(_)) => Attempt::Answered(Err(ProxyError::Dropped { name, at: to })),
                Err(_) => Attempt::Answered(Err(ProxyError::Request {
                    name,
                    at: to.clone(),
                    source: RequestError::Timeout {
                        to,
                        service: services::SINGLETON,
                        timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                    },
                })),
            };
            (pending, attempt)
        }
        .boxed()
    }

    /// The oldest Up or Leaving member with the role, unless it is unreachable.
    fn oldest(&self, snapshot: &ClusterSnapshot) -> Option<(Address, bool)> {
        let oldest = oldest_eligible(&snapshot.members, self.settings.role.as_deref())?;
        if snapshot.unreachable.contains(&oldest.unique_address) {
            return None;
        }
        let local = snapshot.self_node.as_ref() == Some(&oldest.unique_address);
        Some((oldest.address().clone(), local))
    }
}

fn from_reply(name: &str, at: &Address, reply: Result<ProxyReply, DecodeError>) -> Attempt {
    match reply {
        Ok(ProxyReply::Answer(bytes)) => Attempt::Answered(Ok(bytes)),
        Ok(ProxyReply::NotRunningHere) => Attempt::NotDelivered,
        Ok(ProxyReply::Overloaded { capacity }) => {
            Attempt::Answered(Err(ProxyError::InstanceOverloaded {
                name: name.to_string(),
                at: at.clone(),
                capacity,
            }))
        }
        Err(source) => Attempt::Answered(Err(ProxyError::Decode {
            name: name.to_string(),
            at: at.clone(),
            source,
        })),
    }
}

fn from_request_error(name: &str, at: &Address, error: RequestError) -> Attempt {
    match error {
        // Certainly not delivered to the instance: no singleton service there yet, its queue
        // was full, or the request never left this node.
        RequestError::Remote {
            error: RemoteError::UnknownService { .. } | RemoteError::Overloaded { .. },
            ..
        }
        | RequestError::Send(SendError::QueueFull { .. })
        | RequestError::TooManyPending { .. }
        | RequestError::TooManyPendingForPeer { .. } => Attempt::NotDelivered,
        RequestError::Remote {
            error: RemoteError::Dropped { .. },
            ..
        } => Attempt::Answered(Err(ProxyError::Dropped {
            name: name.to_string(),
            at: at.clone(),
        })),
        source => Attempt::Answered(Err(ProxyError::Request {
            name: name.to_string(),
            at: at.clone(),
            source,
        })),
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
