//! How a writer's request reaches a replica: this node's own store directly, any other over
//! the cluster transport.

use crate::event::StoredEvent;
use crate::store::ReplicaStore;
use crate::wire::{ReplicaCall, ReplicaReply};
use bytes::Bytes;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;
use tessera_cluster::Address;
use tessera_cluster::transport::{Lane, Transport, services};
use tessera_replication::{Request, Response, Target};

/// What became of a call.
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

    /// Calls `to` about `log`. A call to this node's own store is taken in before this
    /// returns, so that calls to it are applied in the order they were made.
    fn call(
        &self,
        to: &Target,
        log: &str,
        request: Request<StoredEvent>,
    ) -> BoxFuture<'static, CallResult>;
}

pub(crate) struct TransportCaller<T: Transport> {
    pub transport: Arc<T>,
    pub store: Arc<dyn ReplicaStore>,
    pub timeout: Duration,
}

impl<T: Transport> ReplicaCaller for TransportCaller<T> {
    fn local(&self) -> (&Address, u64) {
        (&self.transport.local().address, self.store.storage_id())
    }

    fn call(
        &self,
        to: &Target,
        log: &str,
        request: Request<StoredEvent>,
    ) -> BoxFuture<'static, CallResult> {
        let expected = match to {
            Target::Replica(r) => Some(r.storage_id),
            Target::Address(_) => None,
        };
        if *to.address() == self.transport.local().address {
            if expected.is_some_and(|s| s != self.store.storage_id()) {
                return Box::pin(futures::future::ready(CallResult::WrongStorage));
            }
            let applied = self.store.apply(log, request);
            return Box::pin(async move {
                match applied.await {
                    Ok(response) => CallResult::Response(response),
                    Err(e) => CallResult::Failed(e.to_string()),
                }
            });
        }
        let call = ReplicaCall {
            log: log.to_string(),
            storage_id: expected,
            request,
        };
        let bytes = match call.encode() {
            Ok(bytes) => Bytes::from(bytes),
            Err(e) => return Box::pin(futures::future::ready(CallResult::Failed(e.to_string()))),
        };
        let transport = self.transport.clone();
        let address = to.address().clone();
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
                .await;
            match answer {
                Ok(bytes) => match ReplicaReply::decode(&bytes) {
                    Ok(ReplicaReply::Answer(response)) => CallResult::Response(response),
                    Ok(ReplicaReply::WrongStorage { .. }) => CallResult::WrongStorage,
                    Ok(ReplicaReply::Failed { reason }) => CallResult::Failed(reason),
                    Err(e) => CallResult::Failed(e.to_string()),
                },
                Err(e) => CallResult::Failed(e.to_string()),
            }
        })
    }
}
