//! Projections across the cluster, for operators: each node answers over the transport with
//! what its projection instances do ([`serve_statuses`]), and any node gathers every
//! member's answer into one view per projection ([`ClusterProjections`]): each instance
//! with the node it runs on, its offset, its lag in events and in time, and the pause and
//! resets operators asked for.

use super::running::{NodeHandle, ProjectionError};
use crate::http::projections::{ClusterView, InstanceView, ProjectionQueries, ProjectionView};
use futures::FutureExt;
use futures::future::BoxFuture;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tessera_cluster::transport::{Lane, RemoteError, TcpTransport, Transport, services};
use tessera_cluster::{Address, MemberStatus};
use tessera_projection::status::RunState;
use tessera_projection::{InstanceStatus, ProjectionStatuses};
use tokio::task::JoinHandle;

/// Requests waiting for this node's answer at most (each is answered at once).
const QUEUE_CAPACITY: usize = 64;

/// How long a member may take to say what its instances do.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(3);

/// Answers every member's request with this node's instance statuses (JSON).
pub fn serve_statuses(
    transport: &Arc<TcpTransport>,
    statuses: ProjectionStatuses,
) -> Result<JoinHandle<()>, tessera_cluster::transport::TransportError> {
    let mut inbound = transport.register(services::PROJECTIONS, QUEUE_CAPACITY)?;
    Ok(tokio::spawn(async move {
        while let Some(message) = inbound.recv().await {
            let Some(reply) = message.reply else { continue };
            let answer = match serde_json::to_vec(&statuses.all()) {
                Ok(bytes) => reply.respond(bytes.into()),
                Err(e) => reply.respond_error(RemoteError::Rejected {
                    reason: e.to_string(),
                }),
            };
            if let Err(e) = answer {
                tracing::debug!(error = %e, "a projection status answer was not sent");
            }
        }
    }))
}

/// The projections' routes' view of the node.
pub(super) struct ClusterProjections {
    pub handle: NodeHandle,
    pub transport: Arc<TcpTransport>,
}

impl ClusterProjections {
    /// Every member's instance statuses, or why it did not answer.
    async fn gather(&self) -> Vec<(Address, Result<Vec<InstanceStatus>, String>)> {
        let members: Vec<Address> = self
            .handle
            .cluster()
            .snapshot()
            .members
            .iter()
            .filter(|m| m.status != MemberStatus::Removed)
            .map(|m| m.address().clone())
            .collect();
        let local = self.transport.local().address.clone();
        let asks = members.into_iter().map(|address| {
            let transport = self.transport.clone();
            let statuses = self.handle.projection_statuses().clone();
            let local = local.clone();
            async move {
                if address == local {
                    return (address, Ok(statuses.all()));
                }
                let answer = transport
                    .request(
                        &address,
                        services::PROJECTIONS,
                        Lane::Quorum,
                        bytes::Bytes::new(),
                        STATUS_TIMEOUT,
                    )
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|bytes| {
                        serde_json::from_slice::<Vec<InstanceStatus>>(&bytes)
                            .map_err(|e| format!("its answer does not decode: {e}"))
                    });
                (address, answer)
            }
        });
        futures::future::join_all(asks).await
    }
}

/// Of the statuses members gave for one instance, the one that runs: a node where it ran
/// before keeps its last status, stopped. Among several running (a move in progress) the
/// one with more runs; without any, the last one stopped.
fn current(reports: Vec<(Address, InstanceStatus)>) -> Option<(Address, InstanceStatus)> {
    reports.into_iter().max_by_key(|(_, status)| {
        let active = status.state != RunState::Stopped;
        (active, status.runs, status.handled)
    })
}

impl ProjectionQueries for ClusterProjections {
    fn views(&self) -> BoxFuture<'static, ClusterView> {
        let registered = self.handle.projections();
        let gathering = ClusterProjections {
            handle: self.handle.clone(),
            transport: self.transport.clone(),
        };
        async move {
            let mut failed = Vec::new();
            let mut by_instance: BTreeMap<(String, u32), Vec<(Address, InstanceStatus)>> =
                BTreeMap::new();
            for (address, answer) in gathering.gather().await {
                match answer {
                    Ok(statuses) => {
                        for status in statuses {
                            by_instance
                                .entry((status.projection.clone(), status.index))
                                .or_default()
                                .push((address.clone(), status));
                        }
                    }
                    Err(e) => failed.push((address, e)),
                }
            }
            let views = registered
                .into_iter()
                .map(|(name, entity_type, instances, control)| {
                    let instance_views = (0..instances)
                        .map(|index| {
                            let reports = by_instance
                                .remove(&(name.clone(), index))
                                .unwrap_or_default();
                            match current(reports) {
                                Some((node, status)) => InstanceView {
                                    index,
                                    node: Some(node.to_string()),
                                    status: Some(status),
                                },
                                None => InstanceView {
                                    index,
                                    node: None,
                                    status: None,
                                },
                            }
                        })
                        .collect();
                    ProjectionView {
                        name,
                        entity_type,
                        instances,
                        control,
                        instance_views,
                    }
                })
                .collect();
            ClusterView {
                projections: views,
                failed,
            }
        }
        .boxed()
    }

    fn set_paused(
        &self,
        name: &str,
        paused: bool,
    ) -> BoxFuture<'static, Result<(), ProjectionError>> {
        let handle = self.handle.clone();
        let name = name.to_string();
        async move {
            if paused {
                handle.pause_projection(&name).await
            } else {
                handle.resume_projection(&name).await
            }
        }
        .boxed()
    }

    fn reset(&self, name: &str) -> BoxFuture<'static, Result<(), ProjectionError>> {
        let handle = self.handle.clone();
        let name = name.to_string();
        async move { handle.reset_projection(&name).await }.boxed()
    }
}
