//! How a writer's request reaches a replica: this node's own replica directly, any other over
//! the cluster transport.

use crate::handler::ReplicaHandler;
use crate::wire::{ReplicaCall, ReplicaCalls, ReplicaReply, ReplicaRequest, decode_replies};
use bytes::Bytes;
use futures::future::BoxFuture;
use smol_str::SmolStr;
use std::sync::Arc;
use std::time::Duration;
use tessera_cluster::Address;
use tessera_cluster::transport::{Lane, Transport, services};
use tessera_journal::StoredEvent;
use tessera_replication::{Request, Response, Target};

/// What became of a log call.
#[derive(Debug)]
pub(crate) enum CallResult {
    Response(Response<StoredEvent>),
    /// The node's store is not the replica the call named.
    WrongStorage,
    /// No answer: timeout, unreachable, refused, or the store failed.
    Failed(String),
}

/// Sends replica calls.
pub(crate) trait ReplicaCaller: Send + Sync + 'static {
    /// This node's address and store id.
    fn local(&self) -> (&Address, u64);

    /// Sends a call to `to`. A call to this node's own replica is taken in before this
    /// returns, so that calls to it are applied in the order they were made.
    fn call_any(
        &self,
        to: &Address,
        call: ReplicaCall,
    ) -> BoxFuture<'static, Result<ReplicaReply, String>>;

    /// Calls `to` about `log` with a request of the log protocol.
    fn call(
        &self,
        to: &Target,
        log: &str,
        request: Request<StoredEvent>,
    ) -> BoxFuture<'static, CallResult> {
        let call = ReplicaCall {
            log: SmolStr::new(log),
            storage_id: match to {
                Target::Replica(r) => Some(r.storage_id),
                Target::Address(_) => None,
            },
            request: ReplicaRequest::Log(request),
        };
        let reply = self.call_any(to.address(), call);
        Box::pin(async move { CallResult::from_reply(reply.await) })
    }

    /// Sends `calls` to `to` in one message: they are taken in there in this order, and the
    /// answers come back together, in the same order. Only for calls whose answers are
    /// small ([`small_answer`]).
    fn call_batch(
        &self,
        to: &Address,
        calls: Vec<ReplicaCall>,
    ) -> BoxFuture<'static, Vec<Result<ReplicaReply, String>>>;
}

impl CallResult {
    pub(crate) fn from_reply(reply: Result<ReplicaReply, String>) -> Self {
        match reply {
            Ok(ReplicaReply::Answer(response)) => CallResult::Response(response),
            Ok(ReplicaReply::WrongStorage { .. }) => CallResult::WrongStorage,
            Ok(ReplicaReply::Failed { reason }) => CallResult::Failed(reason),
            Ok(other) => CallResult::Failed(format!("unexpected reply {other:?}")),
            Err(e) => CallResult::Failed(e),
        }
    }
}

/// Whether a request's answer is a summary rather than entries: such calls to one node may
/// share a frame, whose answer then stays far below the frame limit. A promise answers with
/// the log's unacknowledged tail and a read with a page of entries (up to a MiB each), so
/// they travel alone.
pub(crate) fn small_answer(request: &Request<StoredEvent>) -> bool {
    !matches!(request, Request::Prepare { .. } | Request::Read { .. })
}

pub(crate) struct TransportCaller<T: Transport> {
    pub transport: Arc<T>,
    /// This node's replica, called directly.
    pub local: Arc<ReplicaHandler>,
    pub timeout: Duration,
}

impl<T: Transport> ReplicaCaller for TransportCaller<T> {
    fn local(&self) -> (&Address, u64) {
        (
            &self.transport.local().address,
            self.local.store.storage_id(),
        )
    }

    fn call_any(
        &self,
        to: &Address,
        call: ReplicaCall,
    ) -> BoxFuture<'static, Result<ReplicaReply, String>> {
        if *to == self.transport.local().address {
            let reply = self.local.handle_checked(call);
            return Box::pin(async move { Ok(reply.await) });
        }
        let bytes = match call.encode() {
            Ok(bytes) => Bytes::from(bytes),
            Err(e) => return Box::pin(futures::future::ready(Err(e.to_string()))),
        };
        let answer = self.request(to, bytes);
        Box::pin(async move { ReplicaReply::decode(&answer.await?).map_err(|e| e.to_string()) })
    }

    fn call_batch(
        &self,
        to: &Address,
        calls: Vec<ReplicaCall>,
    ) -> BoxFuture<'static, Vec<Result<ReplicaReply, String>>> {
        let expected = calls.len();
        if *to == self.transport.local().address {
            let replies = self.local.handle_batch(calls);
            return Box::pin(async move { replies.await.into_iter().map(Ok).collect() });
        }
        let bytes = match ReplicaCalls::encode_batch(&calls) {
            Ok(bytes) => Bytes::from(bytes),
            Err(e) => {
                let reason = e.to_string();
                return Box::pin(futures::future::ready(vec![Err(reason); expected]));
            }
        };
        let answer = self.request(to, bytes);
        Box::pin(async move {
            let answer = answer
                .await
                .and_then(|answer| decode_replies(&answer, expected).map_err(|e| e.to_string()));
            match answer {
                Ok(replies) => replies.into_iter().map(Ok).collect(),
                Err(reason) => vec![Err(reason); expected],
            }
        })
    }
}

impl<T: Transport> TransportCaller<T> {
    /// Sends one encoded message to the replica service of `to` and waits for its answer.
    fn request(&self, to: &Address, bytes: Bytes) -> BoxFuture<'static, Result<Bytes, String>> {
        let transport = self.transport.clone();
        let address = to.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            transport
                .request(
                    &address,
                    services::JOURNAL_REPLICA,
                    Lane::Bulk,
                    bytes,
                    timeout,
                )
                .await
                .map_err(|e| e.to_string())
        })
    }
}
