//! How a writer's request reaches a replica: this node's own replica directly, any other over
//! the cluster transport.

use crate::handler::ReplicaHandler;
use crate::wire::{ReplicaCall, ReplicaReply, ReplicaRequest};
use bytes::Bytes;
use futures::future::BoxFuture;
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
            log: log.to_string(),
            storage_id: match to {
                Target::Replica(r) => Some(r.storage_id),
                Target::Address(_) => None,
            },
            request: ReplicaRequest::Log(request),
        };
        let reply = self.call_any(to.address(), call);
        Box::pin(async move {
            match reply.await {
                Ok(ReplicaReply::Answer(response)) => CallResult::Response(response),
                Ok(ReplicaReply::WrongStorage { .. }) => CallResult::WrongStorage,
                Ok(ReplicaReply::Failed { reason }) => CallResult::Failed(reason),
                Ok(other) => CallResult::Failed(format!("unexpected reply {other:?}")),
                Err(e) => CallResult::Failed(e),
            }
        })
    }
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
            let storage_id = self.local.store.storage_id();
            if call.storage_id.is_some_and(|s| s != storage_id) {
                return Box::pin(futures::future::ready(Ok(ReplicaReply::WrongStorage {
                    storage_id,
                })));
            }
            let reply = self.local.handle(call);
            return Box::pin(async move { Ok(reply.await) });
        }
        let bytes = match call.encode() {
            Ok(bytes) => Bytes::from(bytes),
            Err(e) => return Box::pin(futures::future::ready(Err(e.to_string()))),
        };
        let transport = self.transport.clone();
        let address = to.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            let answer = transport
                .request(
                    &address,
                    services::JOURNAL_REPLICA,
                    Lane::Bulk,
                    bytes,
                    timeout,
                )
                .await
                .map_err(|e| e.to_string())?;
            ReplicaReply::decode(&answer).map_err(|e| e.to_string())
        })
    }
}
