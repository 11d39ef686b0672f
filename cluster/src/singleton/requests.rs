//! How a request reaches a singleton's running instance: from a proxy on another node over the
//! transport, or on this node through the node's singleton router ([`RouterCommand`]), into
//! the instance's bounded queue ([`SingletonRequests`]), answered once through its
//! [`SingletonResponder`].

use super::message::{HandOver, ProxyReply};
use crate::transport::{Lane, Responder, SendError};
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};

/// Lane of all singleton traffic: hand-overs and the proxies' requests are small control
/// messages that must not wait behind replication's bulk data.
pub const SINGLETON_LANE: Lane = Lane::Control;

/// One request from a proxy, for the running instance.
#[derive(Debug)]
pub struct SingletonRequest {
    pub payload: Bytes,
    pub responder: SingletonResponder,
}

/// The way back to a proxy, good for one answer. Dropping it unanswered tells the caller
/// the request was dropped (outcome unknown).
#[derive(Debug)]
pub struct SingletonResponder(ResponderKind);

#[derive(Debug)]
enum ResponderKind {
    Remote(Responder),
    Local(oneshot::Sender<ProxyReply>),
}

impl SingletonResponder {
    /// Sends the instance's answer to the caller.
    pub fn respond(self, payload: Bytes) -> Result<(), SendError> {
        self.reply(ProxyReply::Answer(payload))
    }

    pub(crate) fn local(reply: oneshot::Sender<ProxyReply>) -> Self {
        Self(ResponderKind::Local(reply))
    }

    pub(crate) fn remote(responder: Responder) -> Self {
        Self(ResponderKind::Remote(responder))
    }

    pub(crate) fn reply(self, reply: ProxyReply) -> Result<(), SendError> {
        match self.0 {
            ResponderKind::Remote(responder) => responder.respond(reply.encode()),
            ResponderKind::Local(sender) => sender.send(reply).map_err(|_| SendError::Closed),
        }
    }
}

/// The running instance's queue of requests. Dropping it (the instance terminating) answers
/// every request still queued "not running here", so proxies send them to the next instance.
#[derive(Debug)]
pub struct SingletonRequests {
    receiver: mpsc::Receiver<SingletonRequest>,
}

impl SingletonRequests {
    pub(crate) fn new(receiver: mpsc::Receiver<SingletonRequest>) -> Self {
        SingletonRequests { receiver }
    }

    /// The next request; None once the instance is being stopped and the queue is empty.
    pub async fn recv(&mut self) -> Option<SingletonRequest> {
        self.receiver.recv().await
    }

    /// The next request if one is queued.
    pub fn try_recv(&mut self) -> Option<SingletonRequest> {
        self.receiver.try_recv().ok()
    }
}

impl Drop for SingletonRequests {
    fn drop(&mut self) {
        self.receiver.close();
        while let Ok(request) = self.receiver.try_recv() {
            // Best effort: a lost answer makes the proxy's request time out.
            let _ = request.responder.reply(ProxyReply::NotRunningHere);
        }
    }
}

/// A route of the router: where one singleton's hand-overs and requests go.
#[derive(Clone)]
pub(crate) struct Route {
    pub(crate) hand_over: mpsc::Sender<HandOver>,
    /// The running instance's queue, None while none runs here.
    pub(crate) instance: watch::Receiver<Option<mpsc::Sender<SingletonRequest>>>,
    pub(crate) instance_queue_capacity: usize,
}

pub(crate) enum RouterCommand {
    Register {
        name: String,
        route: Route,
    },
    Unregister {
        name: String,
    },
    /// A request from a proxy on this node, for an instance on this node.
    Local {
        name: String,
        payload: Bytes,
        reply: oneshot::Sender<ProxyReply>,
    },
}
