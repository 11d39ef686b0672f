//! The management API's view of the running node: membership commands, readiness and every
//! metric, read from the parts that keep them.

use super::registration::LocalHost;
use crate::http::{
    self, ClusterControl, ControlError, MemberView, MembersView, NodeMetrics, RefusedConnections,
};
use std::sync::Arc;
use tessera_cluster::node::{ClusterError, ClusterHandle, Operation};
use tessera_cluster::transport::{TcpTransport, Transport};
use tessera_cluster::{Address, MemberStatus};
use tessera_coordinator::runtime::Sharding;
use tessera_ddata::node::ReplicatorHandle;
use tessera_journal::RocksJournal;
use tessera_metrics::LatencyFamily;
use tessera_persistence::Persistence;
use tessera_projection::ProjectionStatuses;

/// [`ClusterControl`] for the real cluster.
pub(super) struct NodeControl {
    pub cluster: ClusterHandle,
    pub transport: Arc<TcpTransport>,
    pub replicator: ReplicatorHandle,
    /// This node's entity hosts, by type (none on a node that only routes a type).
    pub hosts: Arc<[(String, Arc<dyn LocalHost>)]>,
    pub persistence: Arc<Persistence>,
    pub sharding: Arc<Sharding<TcpTransport>>,
    pub http_stats: Arc<http::HttpStats>,
    /// The local journal, for its fsync durations.
    pub journal: Arc<RocksJournal>,
    /// How long each type's asks over HTTP took.
    pub entity_asks: LatencyFamily,
    /// What this node's projection instances did.
    pub projections: ProjectionStatuses,
}

impl NodeControl {
    fn submit(&self, operation: Operation) -> Result<(), ControlError> {
        self.cluster.submit(operation).map_err(|e| match e {
            ClusterError::Membership(
                tessera_cluster::membership::MembershipError::UnknownMember(a),
            ) => ControlError::UnknownMember(a),
            ClusterError::Membership(other) => ControlError::Conflict(other.to_string()),
            ClusterError::ShuttingDown => ControlError::ShuttingDown,
            ClusterError::Overloaded { .. } => ControlError::Overloaded,
        })
    }
}

impl ClusterControl for NodeControl {
    fn members(&self) -> MembersView {
        let snapshot = self.cluster.snapshot();
        MembersView {
            self_address: self.cluster.self_node().address.clone(),
            self_status: snapshot.self_status,
            leader: snapshot.leader.as_ref().map(|l| l.address.clone()),
            members: snapshot
                .members
                .iter()
                .map(|m| MemberView {
                    address: m.address().clone(),
                    uid: m.unique_address.uid,
                    status: m.status,
                    roles: m.roles.iter().cloned().collect(),
                    reachable: !snapshot.unreachable.contains(&m.unique_address),
                    up_number: m.up_number,
                })
                .collect(),
        }
    }

    fn join(&self, address: Address) -> Result<(), ControlError> {
        self.submit(Operation::Join(address))
    }

    fn leave(&self, address: Address) -> Result<(), ControlError> {
        self.submit(Operation::Leave(address))
    }

    fn down(&self, address: Address) -> Result<(), ControlError> {
        self.submit(Operation::Down(address))
    }

    fn not_ready_reason(&self) -> Option<String> {
        let gauges = self.sharding.region_gauges();
        let waiting: Vec<&str> = gauges
            .iter()
            .filter(|(_, gauges)| !gauges.registered)
            .map(|(name, _)| *name)
            .collect();
        if waiting.is_empty() {
            return None;
        }
        let mut reason = format!(
            "the shard regions of {} are not registered with their coordinators yet",
            waiting.join(", ")
        );
        // A region that cannot register for good says why.
        for (_, region) in &gauges {
            if let Some(unsupported) = &region.unsupported {
                reason.push_str("; ");
                reason.push_str(unsupported);
            }
        }
        Some(reason)
    }

    fn metrics(&self) -> NodeMetrics {
        let snapshot = self.cluster.snapshot();
        let transport = self.transport.metrics().snapshot();
        let ddata = self.replicator.counters();
        use std::sync::atomic::Ordering::Relaxed;
        let members_by_status = MemberStatus::ALL
            .iter()
            .map(|status| {
                let count = snapshot
                    .members
                    .iter()
                    .filter(|m| m.status == *status)
                    .count();
                (*status, count as u64)
            })
            .collect();
        NodeMetrics {
            members_by_status,
            unreachable_members: snapshot.unreachable.len() as u64,
            gossip_sent_total: snapshot.stats.gossip_sent,
            gossip_received_total: snapshot.stats.gossip_received,
            gossip_status_sent_total: snapshot.stats.gossip_status_sent,
            heartbeats_sent_total: snapshot.heartbeats_sent,
            heartbeat_responses_received_total: snapshot.heartbeat_responses_received,
            is_leader: snapshot.is_leader(),
            frames_in_total: transport.frames_in,
            frames_out_total: transport.frames_out,
            bytes_in_total: transport.bytes_in,
            bytes_out_total: transport.bytes_out,
            connections_accepted_total: transport.connections_accepted,
            connections_refused_total: RefusedConnections {
                auth: transport.connections_refused_auth,
                malformed: transport.connections_refused_malformed,
                oversize: transport.connections_refused_oversize,
                too_many_handshakes: transport.connections_refused_too_many_handshakes,
            },
            send_dropped_total: transport.send_dropped_queue_full,
            inbound_dropped_total: transport.inbound_dropped_queue_full
                + transport.inbound_unknown_service,
            request_timeouts_total: transport.request_timeouts,
            ddata_keys: ddata.keys.load(Relaxed),
            ddata_send_failures_total: ddata.send_failures.load(Relaxed),
            ddata_decode_errors_total: ddata.decode_errors.load(Relaxed),
            ddata_dropped_notifications_total: ddata.dropped_notifications.load(Relaxed),
            ddata_durable_failures_total: ddata.durable_failures.load(Relaxed),
            entity_types: self
                .hosts
                .iter()
                .map(|(name, host)| (name.clone(), host.stats()))
                .collect(),
            responses_wrong_peer_total: transport.responses_wrong_peer,
            journal: self.persistence.metrics.snapshot(),
            sharding: self.sharding_metrics(),
            sharding_counters: self.sharding.counters().snapshot(),
            transport_peers: transport.peers,
            sends_refused_too_many_peers_total: transport.send_dropped_too_many_peers,
            transport_inbound_connections: transport.inbound_connections,
            transport_inbound_handshakes: transport.inbound_handshakes,
            handshake_timeouts_total: transport.handshake_timeouts,
            transport_requests_pending: transport.requests_pending,
            transport_requests_pending_max_per_peer: self.transport.pending_requests_max_per_peer()
                as u64,
            requests_refused_too_many_pending_total: transport.requests_refused_too_many_pending,
            requests_refused_too_many_pending_for_peer_total: transport
                .requests_refused_too_many_pending_for_peer,
            ddata_bytes: ddata.bytes.load(Relaxed),
            ddata_refusals: ddata.refusals(),
            http: self.http_stats.snapshot(),
            projections: self.projections.all(),
            latencies: http::Latencies {
                entity_asks: self.entity_asks.clone(),
                journal_appends: self.persistence.metrics.append_durations.clone(),
                journal_fsyncs: self.journal.fsync_durations().clone(),
                ddata: self.replicator.latencies().clone(),
            },
        }
    }
}

impl NodeControl {
    fn sharding_metrics(&self) -> Vec<crate::http::ShardingMetrics> {
        let coordinators: std::collections::BTreeMap<&str, _> =
            self.sharding.coordinator_gauges().into_iter().collect();
        self.sharding
            .region_gauges()
            .into_iter()
            .map(|(name, region)| {
                let coordinator = coordinators.get(name).cloned().unwrap_or_default();
                crate::http::ShardingMetrics {
                    entity_type: name.to_string(),
                    registered: region.registered,
                    shards: region.shards as u64,
                    buffered: region.buffered as u64,
                    region_handoffs_total: region.handoffs,
                    forwarded_total: region.forwarded,
                    refused_total: region.refused,
                    coordinator_running: coordinator.running,
                    coordinator_handoffs_total: coordinator.handoffs_completed,
                    coordinator_handoffs_given_up_total: coordinator.handoffs_given_up,
                    rebalance_rounds_total: coordinator.rebalance_rounds,
                    coordinator_writes_total: coordinator.writes,
                    coordinator_write_failures_total: coordinator.write_failures,
                }
            })
            .collect()
    }
}
