//! `GET /metrics`: the node's counters, gauges and latency histograms in the Prometheus text
//! exposition format 0.0.4, encoded by prometheus-client.
//!
//! Each scrape fills a fresh `Registry` through one `Collector` over a [`NodeMetrics`]
//! snapshot: counters and gauges are the numbers the node read for this scrape, histograms
//! are the live handles the journal, the Replicator and the entity ask path record into.
//! Nothing is global, and a family is written with exactly its historical name, type, help
//! and labels (prometheus-client names a counter family after its `_total` samples in this
//! format, so counters are registered without the suffix it adds back).

use super::{Control, HttpStatsSnapshot};
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use std::fmt;
use tessera_cluster::MemberStatus;
use tessera_coordinator::runtime::ShardingCountersSnapshot;
use tessera_ddata::node::ReplicatorLatencies;
use tessera_ddata::replicator::{Limit, Refusals};
use tessera_entities::HostStats;
use tessera_metrics::{LatencyFamily, LatencyHistogram};
use tessera_persistence::PersistenceMetricsSnapshot;
use tessera_projection::{InstanceStatus, RunState};

/// Content type of the Prometheus text format.
pub const PROMETHEUS_CONTENT_TYPE: &str =
    prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// What `/metrics` shows, collected by the node wiring from the cluster, the transport, the
/// HTTP server, the Replicator, the entity hosts, the journal and sharding. Counters
/// (`*_total`) only grow for the life of the process; the other numbers are gauges;
/// [`Latencies`] are live histograms.
#[derive(Clone, Debug, Default)]
pub struct NodeMetrics {
    /// Members per status; statuses missing here are rendered as 0.
    pub members_by_status: Vec<(MemberStatus, u64)>,
    /// Members some observer cannot reach.
    pub unreachable_members: u64,
    /// Full gossip states sent.
    pub gossip_sent_total: u64,
    /// Gossip messages received.
    pub gossip_received_total: u64,
    /// Gossip status digests (version only) sent.
    pub gossip_status_sent_total: u64,
    /// Heartbeats sent to monitored nodes.
    pub heartbeats_sent_total: u64,
    /// Heartbeat responses received.
    pub heartbeat_responses_received_total: u64,
    /// Whether this node is the leader.
    pub is_leader: bool,
    /// Transport frames received.
    pub frames_in_total: u64,
    /// Transport frames sent.
    pub frames_out_total: u64,
    /// Transport bytes received.
    pub bytes_in_total: u64,
    /// Transport bytes sent.
    pub bytes_out_total: u64,
    /// Inbound connections accepted after the handshake.
    pub connections_accepted_total: u64,
    /// Inbound connections refused, by reason.
    pub connections_refused_total: RefusedConnections,
    /// Outbound messages dropped because a send queue was full.
    pub send_dropped_total: u64,
    /// Inbound messages dropped because a service queue was full.
    pub inbound_dropped_total: u64,
    /// Requests that got no response within their timeout.
    pub request_timeouts_total: u64,
    /// Distributed Data keys held by this node's replica (deleted ones included).
    pub ddata_keys: u64,
    /// Replicator messages the transport refused to queue.
    pub ddata_send_failures_total: u64,
    /// Replicator messages from peers that could not be decoded.
    pub ddata_decode_errors_total: u64,
    /// Change notifications dropped because a subscriber's queue was full.
    pub ddata_dropped_notifications_total: u64,
    /// Durable-key writes that failed.
    pub ddata_durable_failures_total: u64,
    /// Lifecycle counters of each hosted entity type, by type name.
    pub entity_types: Vec<(String, HostStats)>,
    /// Responses dropped because they came from another peer than the one asked.
    pub responses_wrong_peer_total: u64,
    /// The replicated journal's counters.
    pub journal: PersistenceMetricsSnapshot,
    /// Cluster sharding, by entity type.
    pub sharding: Vec<ShardingMetrics>,
    /// Cluster sharding's counters of the whole node (every entity type).
    pub sharding_counters: ShardingCountersSnapshot,
    /// Peers with outbound transport queues now: members, and addresses sent to recently.
    pub transport_peers: u64,
    /// Messages for a new peer dropped because `max_peers` peers already had queues.
    pub sends_refused_too_many_peers_total: u64,
    /// Inbound cluster connections open now, in their handshake or authenticated.
    pub transport_inbound_connections: u64,
    /// Inbound cluster connections in their handshake now.
    pub transport_inbound_handshakes: u64,
    /// Inbound cluster connections that did not finish the handshake in time.
    pub handshake_timeouts_total: u64,
    /// Transport requests waiting for an answer now.
    pub transport_requests_pending: u64,
    /// The most transport requests waiting for an answer from any one peer now.
    pub transport_requests_pending_max_per_peer: u64,
    /// Transport requests refused because `max_pending_requests` were waiting.
    pub requests_refused_too_many_pending_total: u64,
    /// Transport requests refused because `max_pending_requests_per_peer` were waiting for
    /// the same peer.
    pub requests_refused_too_many_pending_for_peer_total: u64,
    /// Bytes of keys and encoded values this node's Distributed Data replica holds.
    pub ddata_bytes: u64,
    /// Distributed Data states refused at a limit: local updates and deletes, and states
    /// from peers.
    pub ddata_refusals: Refusals,
    /// The HTTP API server's connections and refusals.
    pub http: HttpStatsSnapshot,
    /// Each projection instance that ran on this node (since the process started).
    pub projections: Vec<InstanceStatus>,
    /// Latency histograms, shared with the code that records them.
    pub latencies: Latencies,
}

/// The node's latency histograms: handles to the live ones (cheap clones), not copies.
#[derive(Clone, Debug)]
pub struct Latencies {
    /// Entity commands from the HTTP API to their answer, by entity type (label `type`).
    pub entity_asks: LatencyFamily,
    /// Acknowledged appends to the replicated journal.
    pub journal_appends: LatencyHistogram,
    /// Synced writes (group commits) of the journal's writer thread.
    pub journal_fsyncs: LatencyHistogram,
    /// Distributed Data reads and writes, by consistency level.
    pub ddata: ReplicatorLatencies,
}

impl Default for Latencies {
    /// No entity type; every consistency level.
    fn default() -> Self {
        Self {
            entity_asks: LatencyFamily::new("type", Vec::<String>::new()),
            journal_appends: LatencyHistogram::default(),
            journal_fsyncs: LatencyHistogram::default(),
            ddata: ReplicatorLatencies::default(),
        }
    }
}

/// One entity type's sharding numbers on this node. The coordinator's are non-zero only on
/// the node that runs it, and restart from 0 when it starts there again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardingMetrics {
    pub entity_type: String,
    /// The region is registered with the coordinator.
    pub registered: bool,
    /// Shards this region runs now.
    pub shards: u64,
    /// Messages waiting for their shard's home.
    pub buffered: u64,
    /// Shards this region handed off.
    pub region_handoffs_total: u64,
    /// Messages sent on to other regions.
    pub forwarded_total: u64,
    /// Messages refused (buffer full).
    pub refused_total: u64,
    /// Whether the type's coordinator runs on this node.
    pub coordinator_running: bool,
    pub coordinator_handoffs_total: u64,
    /// Handoffs the coordinator gave up (not confirmed within the handoff timeout).
    pub coordinator_handoffs_given_up_total: u64,
    pub rebalance_rounds_total: u64,
    pub coordinator_writes_total: u64,
    /// Coordinator state writes that failed (each retried, or fatal).
    pub coordinator_write_failures_total: u64,
}

/// Refused connections by reason (the `reason` label).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RefusedConnections {
    /// Handshake MAC did not match the cluster secret.
    pub auth: u64,
    /// Handshake or frame did not decode.
    pub malformed: u64,
    /// A frame was larger than `max_frame_size`.
    pub oversize: u64,
    /// Closed as soon as accepted: `max_inbound_handshakes` connections were in their
    /// handshake already.
    pub too_many_handshakes: u64,
}

/// Renders `metrics` in the Prometheus text format 0.0.4. Every member status and every
/// refusal reason is present, zeros included, and so is every histogram its family was made
/// with, so dashboards never see a series appear from nowhere.
pub fn render_prometheus(metrics: &NodeMetrics) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape(metrics.clone())));
    let mut out = String::with_capacity(32 * 1024);
    prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
        .expect("writing to a String cannot fail");
    out
}

/// One scrape's numbers, written as metric families when the registry is encoded.
#[derive(Debug)]
struct Scrape(NodeMetrics);

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let metrics = &self.0;
        let mut out = Families(&mut encoder);
        let members = MemberStatus::ALL.map(|status| {
            let count: u64 = metrics
                .members_by_status
                .iter()
                .filter(|(s, _)| *s == status)
                .map(|(_, n)| *n)
                .sum();
            (status.as_str(), count)
        });
        out.labelled(
            Gauge,
            "tessera_cluster_members",
            "Members of the cluster by status, as seen by this node.",
            "status",
            members,
        )?;
        out.one(
            Gauge,
            "tessera_cluster_unreachable_members",
            "Members that some observer cannot reach.",
            metrics.unreachable_members,
        )?;
        out.one(
            Gauge,
            "tessera_cluster_is_leader",
            "1 when this node is the cluster leader, else 0.",
            u64::from(metrics.is_leader),
        )?;
        for (name, help, value) in [
            (
                "tessera_cluster_gossip_sent_total",
                "Full gossip states sent.",
                metrics.gossip_sent_total,
            ),
            (
                "tessera_cluster_gossip_received_total",
                "Gossip messages received.",
                metrics.gossip_received_total,
            ),
            (
                "tessera_cluster_gossip_status_sent_total",
                "Gossip status digests sent.",
                metrics.gossip_status_sent_total,
            ),
            (
                "tessera_cluster_heartbeats_sent_total",
                "Heartbeats sent to monitored nodes.",
                metrics.heartbeats_sent_total,
            ),
            (
                "tessera_cluster_heartbeat_responses_received_total",
                "Heartbeat responses received.",
                metrics.heartbeat_responses_received_total,
            ),
            (
                "tessera_transport_frames_in_total",
                "Transport frames received.",
                metrics.frames_in_total,
            ),
            (
                "tessera_transport_frames_out_total",
                "Transport frames sent.",
                metrics.frames_out_total,
            ),
            (
                "tessera_transport_bytes_in_total",
                "Transport bytes received.",
                metrics.bytes_in_total,
            ),
            (
                "tessera_transport_bytes_out_total",
                "Transport bytes sent.",
                metrics.bytes_out_total,
            ),
            (
                "tessera_transport_connections_accepted_total",
                "Inbound connections accepted after the handshake.",
                metrics.connections_accepted_total,
            ),
        ] {
            out.one(Counter, name, help, value)?;
        }
        let refused = metrics.connections_refused_total;
        out.labelled(
            Counter,
            "tessera_transport_connections_refused_total",
            "Inbound connections refused, by reason.",
            "reason",
            [
                ("auth", refused.auth),
                ("malformed", refused.malformed),
                ("oversize", refused.oversize),
                ("too_many_handshakes", refused.too_many_handshakes),
            ],
        )?;
        for (name, help, value) in [
            (
                "tessera_transport_send_dropped_total",
                "Outbound messages dropped because a send queue was full.",
                metrics.send_dropped_total,
            ),
            (
                "tessera_transport_inbound_dropped_total",
                "Inbound messages dropped because a service queue was full.",
                metrics.inbound_dropped_total,
            ),
            (
                "tessera_transport_request_timeouts_total",
                "Requests that got no response within their timeout.",
                metrics.request_timeouts_total,
            ),
            (
                "tessera_transport_responses_wrong_peer_total",
                "Responses dropped because another peer than the one asked sent them.",
                metrics.responses_wrong_peer_total,
            ),
            (
                "tessera_transport_sends_refused_too_many_peers_total",
                "Messages for a new peer dropped because max_peers peers already had send queues.",
                metrics.sends_refused_too_many_peers_total,
            ),
            (
                "tessera_transport_handshake_timeouts_total",
                "Inbound connections closed because their handshake did not finish within \
                 handshake_timeout.",
                metrics.handshake_timeouts_total,
            ),
        ] {
            out.one(Counter, name, help, value)?;
        }
        out.labelled(
            Counter,
            "tessera_transport_requests_refused_total",
            "Requests refused before they were sent, by reason: max_pending_requests waiting \
             (too_many_pending) or max_pending_requests_per_peer waiting for the same peer \
             (too_many_pending_for_peer).",
            "reason",
            [
                (
                    "too_many_pending",
                    metrics.requests_refused_too_many_pending_total,
                ),
                (
                    "too_many_pending_for_peer",
                    metrics.requests_refused_too_many_pending_for_peer_total,
                ),
            ],
        )?;
        for (name, help, value) in [
            (
                "tessera_transport_peers",
                "Peers with outbound send queues now: members, and addresses sent to recently.",
                metrics.transport_peers,
            ),
            (
                "tessera_transport_inbound_connections",
                "Inbound cluster connections open now, in their handshake or authenticated.",
                metrics.transport_inbound_connections,
            ),
            (
                "tessera_transport_inbound_handshakes",
                "Inbound cluster connections in their handshake now (not yet authenticated).",
                metrics.transport_inbound_handshakes,
            ),
            (
                "tessera_transport_requests_pending",
                "Requests waiting for an answer now.",
                metrics.transport_requests_pending,
            ),
            (
                "tessera_transport_requests_pending_max_per_peer",
                "The most requests waiting for an answer from any one peer now.",
                metrics.transport_requests_pending_max_per_peer,
            ),
        ] {
            out.one(Gauge, name, help, value)?;
        }
        self.encode_http(&mut out)?;
        self.encode_ddata(&mut out)?;
        self.encode_entities(&mut out)?;
        self.encode_journal(&mut out)?;
        self.encode_sharding(&mut out)?;
        self.encode_projections(&mut out)
    }
}

impl Scrape {
    fn encode_http(&self, out: &mut Families) -> fmt::Result {
        let http = &self.0.http;
        out.one(
            Gauge,
            "tessera_http_connections_open",
            "HTTP API connections open now.",
            http.connections_open,
        )?;
        for (name, help, value) in [
            (
                "tessera_http_connections_accepted_total",
                "HTTP API connections accepted under the connection limit.",
                http.connections_accepted_total,
            ),
            (
                "tessera_http_connections_refused_total",
                "HTTP API connections refused (503 and closed) because max_connections were open.",
                http.connections_refused_total,
            ),
            (
                "tessera_http_header_timeouts_total",
                "HTTP API connections closed because a request's headers did not arrive within \
                 header_timeout.",
                http.header_timeouts_total,
            ),
            (
                "tessera_http_requests_shed_total",
                "HTTP API requests refused with 503 because max_concurrent_requests were in \
                 flight.",
                http.requests_shed_total,
            ),
            (
                "tessera_http_requests_timed_out_total",
                "HTTP API requests answered 504 because they ran longer than request_timeout.",
                http.requests_timed_out_total,
            ),
            (
                "tessera_http_requests_unauthorized_total",
                "HTTP API requests refused with 401 (missing or wrong bearer token).",
                http.requests_unauthorized_total,
            ),
        ] {
            out.one(Counter, name, help, value)?;
        }
        Ok(())
    }

    fn encode_ddata(&self, out: &mut Families) -> fmt::Result {
        let metrics = &self.0;
        out.one(
            Gauge,
            "tessera_ddata_keys",
            "Distributed Data keys held by this node's replica, deleted ones included.",
            metrics.ddata_keys,
        )?;
        out.one(
            Gauge,
            "tessera_ddata_bytes",
            "Bytes of keys and encoded values held by this node's replica (what \
             ddata_max_total_bytes bounds).",
            metrics.ddata_bytes,
        )?;
        let refusals = &metrics.ddata_refusals;
        out.labelled(
            Counter,
            "tessera_ddata_updates_refused_total",
            "Local Distributed Data updates and deletes refused at a limit (507), by limit.",
            "limit",
            Limit::ALL.map(|limit| (limit.label(), refusals.local.of(limit))),
        )?;
        out.labelled(
            Counter,
            "tessera_ddata_remote_states_refused_total",
            "Distributed Data states from peers (writes, read repairs, deltas, anti-entropy) \
             this node's replica refused at a limit, by limit.",
            "limit",
            Limit::ALL.map(|limit| (limit.label(), refusals.remote.of(limit))),
        )?;
        for (name, help, value) in [
            (
                "tessera_ddata_send_failures_total",
                "Replicator messages the transport refused to queue.",
                metrics.ddata_send_failures_total,
            ),
            (
                "tessera_ddata_decode_errors_total",
                "Replicator messages from peers that could not be decoded.",
                metrics.ddata_decode_errors_total,
            ),
            (
                "tessera_ddata_dropped_notifications_total",
                "Change notifications dropped because a subscriber's queue was full.",
                metrics.ddata_dropped_notifications_total,
            ),
            (
                "tessera_ddata_durable_failures_total",
                "Durable-key writes that failed.",
                metrics.ddata_durable_failures_total,
            ),
        ] {
            out.one(Counter, name, help, value)?;
        }
        let ddata = &metrics.latencies.ddata;
        out.histogram(
            "tessera_ddata_read_duration_seconds",
            "Time from a Distributed Data get on this node to the Replicator's answer, by \
             consistency level.",
            &ddata.reads,
        )?;
        out.histogram(
            "tessera_ddata_write_duration_seconds",
            "Time from a Distributed Data update or delete on this node to the Replicator's \
             answer, by consistency level.",
            &ddata.writes,
        )
    }

    fn encode_entities(&self, out: &mut Families) -> fmt::Result {
        let types = &self.0.entity_types;
        let by_type = |stat: fn(&HostStats) -> u64| {
            types
                .iter()
                .map(move |(name, stats)| (name.as_str(), stat(stats)))
        };
        out.labelled(
            Gauge,
            "tessera_entities_live",
            "Entity incarnations running now, by entity type.",
            "type",
            by_type(|s| s.live_entities),
        )?;
        out.labelled(
            Gauge,
            "tessera_entities_active",
            "Entities taking commands now, by entity type (what active_entity_limit and \
             node_active_entity_limit bound; live entities also count those stopping).",
            "type",
            by_type(|s| s.active_entities),
        )?;
        out.labelled(
            Counter,
            "tessera_entities_evicted_total",
            "Entities passivated because active_entity_limit or node_active_entity_limit was \
             reached (least recently used first), by entity type.",
            "type",
            by_type(|s| s.entities_evicted),
        )?;
        out.labelled(
            Counter,
            "tessera_entities_started_total",
            "Entity incarnations started (first commands, and restarts after a passivation or \
             stop), by entity type.",
            "type",
            by_type(|s| s.incarnations_started),
        )?;
        out.labelled(
            Counter,
            "tessera_entities_commands_handed_over_total",
            "Commands that arrived while their entity was stopping and went to its next \
             incarnation, by entity type.",
            "type",
            by_type(|s| s.commands_handed_over),
        )?;
        out.histogram(
            "tessera_entity_ask_duration_seconds",
            "Time from an entity command's arrival over HTTP to its answer (or its timeout), \
             by entity type.",
            &self.0.latencies.entity_asks,
        )
    }

    fn encode_journal(&self, out: &mut Families) -> fmt::Result {
        let journal = &self.0.journal;
        out.labelled(
            Counter,
            "tessera_journal_appends_total",
            "Replicated appends by outcome: acknowledged by a write quorum, not applied \
             (refused before anything was sent), unknown (sent, not acknowledged).",
            "outcome",
            [
                ("acknowledged", journal.appends_acknowledged),
                ("not_applied", journal.appends_not_applied),
                ("unknown", journal.appends_unknown),
            ],
        )?;
        for (name, help, value) in [
            (
                "tessera_journal_recoveries_total",
                "Log writers started: each fenced its log and recovered it.",
                journal.recoveries,
            ),
            (
                "tessera_journal_fenced_total",
                "Log writers stopped because a later writer fenced them.",
                journal.fenced,
            ),
            (
                "tessera_journal_refused_writes_total",
                "Writes refused because their writer had been fenced.",
                journal.refused_fenced,
            ),
            (
                "tessera_journal_repaired_entries_total",
                "Entries copied to replicas that lacked them (repairs and catch-ups).",
                journal.entries_copied,
            ),
            (
                "tessera_journal_reconfigurations_total",
                "Configuration changes completed: logs moved off members that left, or grown \
                 to N.",
                journal.reconfigurations,
            ),
            (
                "tessera_journal_creations_held_total",
                "Times a log no member knew was not created because at least W of the stores \
                 this node has seen did not answer.",
                journal.creations_held,
            ),
            (
                "tessera_journal_known_stores_save_failures_total",
                "Saves of this node's known-stores file that failed; the latest list is saved \
                 again within a second.",
                journal.known_stores_save_failures,
            ),
        ] {
            out.one(Counter, name, help, value)?;
        }
        out.one(
            Gauge,
            "tessera_journal_writers",
            "Log writers this node runs now.",
            journal.writers,
        )?;
        out.one(
            Gauge,
            "tessera_journal_known_stores",
            "Journal stores this node has seen in the cluster and not forgotten.",
            journal.known_stores,
        )?;
        let latencies = &self.0.latencies;
        out.histogram(
            "tessera_journal_append_duration_seconds",
            "Time from a replicated append's call to its acknowledgement by a write quorum.",
            &latencies.journal_appends,
        )?;
        out.histogram(
            "tessera_journal_append_latency_seconds",
            // Its first name, kept for existing dashboards: the same histogram as above.
            "Time from a replicated append's call to its acknowledgement.",
            &latencies.journal_appends,
        )?;
        out.histogram(
            "tessera_journal_fsync_duration_seconds",
            "Time of each synced write (WAL write and fsync of a group commit) of the local \
             journal's writer.",
            &latencies.journal_fsyncs,
        )
    }

    fn encode_sharding(&self, out: &mut Families) -> fmt::Result {
        let sharding = &self.0.sharding;
        let by_type = |stat: fn(&ShardingMetrics) -> u64| {
            sharding
                .iter()
                .map(move |s| (s.entity_type.as_str(), stat(s)))
        };
        let families: [(Kind, &str, &str, ShardingStat); 12] = [
            (
                Gauge,
                "tessera_sharding_shards",
                "Shards this node's region runs, by entity type.",
                |s| s.shards,
            ),
            (
                Gauge,
                "tessera_sharding_buffered_messages",
                "Messages a region holds while it learns where their shard lives.",
                |s| s.buffered,
            ),
            (
                Gauge,
                "tessera_sharding_region_registered",
                "1 when the region is registered with its coordinator, else 0.",
                |s| u64::from(s.registered),
            ),
            (
                Counter,
                "tessera_sharding_region_handoffs_total",
                "Shards this node's region stopped and handed off.",
                |s| s.region_handoffs_total,
            ),
            (
                Counter,
                "tessera_sharding_forwarded_total",
                "Messages sent on to the region that runs their shard.",
                |s| s.forwarded_total,
            ),
            (
                Counter,
                "tessera_sharding_refused_total",
                "Messages refused because the region's buffer was full.",
                |s| s.refused_total,
            ),
            (
                Gauge,
                "tessera_sharding_coordinator_running",
                "1 when the entity type's shard coordinator runs on this node, else 0.",
                |s| u64::from(s.coordinator_running),
            ),
            (
                Counter,
                "tessera_sharding_coordinator_handoffs_total",
                "Handoffs the coordinator on this node completed (since it started here).",
                |s| s.coordinator_handoffs_total,
            ),
            (
                Counter,
                "tessera_sharding_coordinator_handoffs_given_up_total",
                "Handoffs the coordinator on this node gave up: not completed within the handoff \
                 timeout, or the shard's owner left meanwhile (since it started here).",
                |s| s.coordinator_handoffs_given_up_total,
            ),
            (
                Counter,
                "tessera_sharding_rebalance_rounds_total",
                "Rebalance rounds the coordinator on this node started (since it started here).",
                |s| s.rebalance_rounds_total,
            ),
            (
                Counter,
                "tessera_sharding_coordinator_writes_total",
                "Coordinator state writes stored (since it started here).",
                |s| s.coordinator_writes_total,
            ),
            (
                Counter,
                "tessera_sharding_coordinator_write_failures_total",
                "Coordinator state writes that failed, each retried or, when the store refused \
                 it for good, stopping the coordinator (since it started here).",
                |s| s.coordinator_write_failures_total,
            ),
        ];
        for (kind, name, help, stat) in families {
            out.labelled(kind, name, help, "type", by_type(stat))?;
        }
        let counters = &self.0.sharding_counters;
        out.labelled(
            Counter,
            "tessera_sharding_frames_refused_total",
            "Sharding frames from peers this node did not take: malformed (did not decode), \
             unrouted (for a type not sharded here, a coordinator not running here or an \
             earlier incarnation of this node), queue_full (the region's or coordinator's \
             queue was full, or closed as it stopped).",
            "reason",
            [
                ("malformed", counters.frames_malformed),
                ("unrouted", counters.frames_unrouted),
                ("queue_full", counters.frames_dropped),
            ],
        )?;
        out.labelled(
            Counter,
            "tessera_sharding_remember_writes_total",
            "Writes of remembered-entity changes by this node's regions (one per shard \
             update), by outcome (a failed write is retried).",
            "outcome",
            [
                ("stored", counters.remember_writes),
                ("failed", counters.remember_write_failures),
            ],
        )?;
        for (name, help, value) in [
            (
                "tessera_sharding_remembered_started_total",
                "Remembered entities this node's regions asked their entity host to start where \
                 their shard landed (one already running is left as it is).",
                counters.remembered_started,
            ),
            (
                "tessera_sharding_replies_late_total",
                "Replies from other nodes that came after their caller stopped waiting.",
                counters.replies_late,
            ),
            (
                "tessera_sharding_replies_unsent_total",
                "Replies and refusals for callers on other nodes that could not be encoded or \
                 handed to the transport (those callers end at their ask timeout).",
                counters.replies_unsent,
            ),
        ] {
            out.one(Counter, name, help, value)?;
        }
        Ok(())
    }
}

impl Scrape {
    /// Per instance of each projection that ran here (labels `projection` and `instance`):
    /// its counters over every run on this node, and, while it runs here, its lag.
    fn encode_projections(&self, out: &mut Families) -> fmt::Result {
        let instances = &self.0.projections;
        let indexes: Vec<String> = instances.iter().map(|i| i.index.to_string()).collect();
        let labels = |i: usize| {
            [
                ("projection", instances[i].projection.as_str()),
                ("instance", indexes[i].as_str()),
            ]
        };
        let counters: [(&str, &str, ProjectionStat); 5] = [
            (
                "tessera_projection_envelopes_handled_total",
                "Envelopes a projection instance's handler handled on this node (skipped ones \
                 not included).",
                |s| Some(s.handled),
            ),
            (
                "tessera_projection_handler_errors_total",
                "Handler calls of a projection instance that failed on this node (each retry \
                 counts).",
                |s| Some(s.handler_errors),
            ),
            (
                "tessera_projection_envelopes_skipped_total",
                "Envelopes a projection instance skipped after its handler's retries were spent.",
                |s| Some(s.skipped),
            ),
            (
                "tessera_projection_offset_saves_total",
                "Offsets a projection instance saved (at-least-once) or groups whose offset its \
                 handler committed (exactly-once) on this node.",
                |s| Some(s.saves),
            ),
            (
                "tessera_projection_offset_save_failures_total",
                "Offset saves of a projection instance that failed on this node (the run ends; \
                 the next starts from the offset saved last).",
                |s| Some(s.save_failures),
            ),
        ];
        let running_here = |s: &InstanceStatus| s.state != RunState::Stopped;
        let gauges: [(&str, &str, ProjectionStat); 2] = [
            (
                "tessera_projection_instance_running",
                "1 while a projection instance runs on this node (opening, handling, retrying \
                 or paused), else 0.",
                |s| Some(u64::from(s.state != RunState::Stopped)),
            ),
            (
                "tessera_projection_lag_events",
                "Acknowledged events of a projection instance's slices it has not handled yet, \
                 while it runs on this node.",
                |s| s.lag_events.filter(|_| s.state != RunState::Stopped),
            ),
        ];
        for (kind, families) in [(Counter, &counters[..]), (Gauge, &gauges[..])] {
            for (name, help, stat) in families {
                let mut encoder = out.0.encode_descriptor(
                    kind.registered_name(name),
                    help,
                    None,
                    kind.metric_type(),
                )?;
                for (i, status) in instances.iter().enumerate() {
                    if let Some(value) = stat(status) {
                        kind.encode(value, encoder.encode_family(&labels(i))?)?;
                    }
                }
            }
        }
        let mut encoder = out.0.encode_descriptor(
            "tessera_projection_lag_seconds",
            "How old the event a projection instance handled last was when it was handled (0 \
             once it is caught up), while it runs on this node.",
            None,
            MetricType::Gauge,
        )?;
        for (i, status) in instances.iter().enumerate() {
            if let Some(ms) = status.lag_ms.filter(|_| running_here(status)) {
                ConstGauge::new(ms as f64 / 1000.0).encode(encoder.encode_family(&labels(i))?)?;
            }
        }
        Ok(())
    }
}

/// One number of a projection instance's metrics, if it has one.
type ProjectionStat = fn(&InstanceStatus) -> Option<u64>;

/// One number of a type's sharding metrics.
type ShardingStat = fn(&ShardingMetrics) -> u64;

/// Counter or gauge: how a family of plain numbers is typed.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Counter,
    Gauge,
}
use Kind::{Counter, Gauge};

impl Kind {
    fn metric_type(self) -> MetricType {
        match self {
            Counter => MetricType::Counter,
            Gauge => MetricType::Gauge,
        }
    }

    /// The family name to register: the encoder appends `_total` to a counter's, and our
    /// counter names already end in it.
    fn registered_name(self, name: &str) -> &str {
        match self {
            Counter => name.strip_suffix("_total").unwrap_or(name),
            Gauge => name,
        }
    }

    fn encode(self, value: u64, encoder: MetricEncoder) -> fmt::Result {
        match self {
            Counter => ConstCounter::new(value).encode(encoder),
            Gauge => ConstGauge::new(value).encode(encoder),
        }
    }
}

/// Writes metric families, each with its help and type, to a scrape's encoder.
struct Families<'a, 'b>(&'a mut DescriptorEncoder<'b>);

impl Families<'_, '_> {
    /// A family of one unlabelled sample.
    fn one(&mut self, kind: Kind, name: &str, help: &str, value: u64) -> fmt::Result {
        let encoder =
            self.0
                .encode_descriptor(kind.registered_name(name), help, None, kind.metric_type())?;
        kind.encode(value, encoder)
    }

    /// A family of one sample per value of `label` (none when `samples` is empty).
    fn labelled<'v>(
        &mut self,
        kind: Kind,
        name: &str,
        help: &str,
        label: &str,
        samples: impl IntoIterator<Item = (&'v str, u64)>,
    ) -> fmt::Result {
        let mut encoder =
            self.0
                .encode_descriptor(kind.registered_name(name), help, None, kind.metric_type())?;
        for (value, sample) in samples {
            let labels = [(label, value)];
            kind.encode(sample, encoder.encode_family(&labels)?)?;
        }
        Ok(())
    }

    /// A histogram family: one histogram, or one per label value of a [`LatencyFamily`].
    fn histogram(&mut self, name: &str, help: &str, histogram: &impl EncodeMetric) -> fmt::Result {
        histogram.encode(
            self.0
                .encode_descriptor(name, help, None, MetricType::Histogram)?,
        )
    }
}

/// `GET /metrics`.
pub(super) async fn handler(State(control): State<Control>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE)],
        render_prometheus(&control.metrics()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};
    use std::fmt::Write;
    use tessera_entities::HostStats;

    /// Every family `/metrics` carries: `TYPE family kind`, then the signature of each of its
    /// samples (name and labels, `le` without its value), with one entity type and one sharded
    /// type, `account`, and one running projection instance, `balances` 0. Dashboards and alerts name these: the list only ever grows.
    const SERIES: &str = r#"
TYPE tessera_cluster_gossip_received_total counter
  tessera_cluster_gossip_received_total
TYPE tessera_cluster_gossip_sent_total counter
  tessera_cluster_gossip_sent_total
TYPE tessera_cluster_gossip_status_sent_total counter
  tessera_cluster_gossip_status_sent_total
TYPE tessera_cluster_heartbeat_responses_received_total counter
  tessera_cluster_heartbeat_responses_received_total
TYPE tessera_cluster_heartbeats_sent_total counter
  tessera_cluster_heartbeats_sent_total
TYPE tessera_cluster_is_leader gauge
  tessera_cluster_is_leader
TYPE tessera_cluster_members gauge
  tessera_cluster_members{status="down"}
  tessera_cluster_members{status="exiting"}
  tessera_cluster_members{status="joining"}
  tessera_cluster_members{status="leaving"}
  tessera_cluster_members{status="removed"}
  tessera_cluster_members{status="up"}
  tessera_cluster_members{status="weakly_up"}
TYPE tessera_cluster_unreachable_members gauge
  tessera_cluster_unreachable_members
TYPE tessera_ddata_bytes gauge
  tessera_ddata_bytes
TYPE tessera_ddata_decode_errors_total counter
  tessera_ddata_decode_errors_total
TYPE tessera_ddata_dropped_notifications_total counter
  tessera_ddata_dropped_notifications_total
TYPE tessera_ddata_durable_failures_total counter
  tessera_ddata_durable_failures_total
TYPE tessera_ddata_keys gauge
  tessera_ddata_keys
TYPE tessera_ddata_read_duration_seconds histogram
  tessera_ddata_read_duration_seconds_bucket{consistency="all",le}
  tessera_ddata_read_duration_seconds_bucket{consistency="from",le}
  tessera_ddata_read_duration_seconds_bucket{consistency="local",le}
  tessera_ddata_read_duration_seconds_bucket{consistency="majority",le}
  tessera_ddata_read_duration_seconds_bucket{consistency="majority_plus",le}
  tessera_ddata_read_duration_seconds_count{consistency="all"}
  tessera_ddata_read_duration_seconds_count{consistency="from"}
  tessera_ddata_read_duration_seconds_count{consistency="local"}
  tessera_ddata_read_duration_seconds_count{consistency="majority"}
  tessera_ddata_read_duration_seconds_count{consistency="majority_plus"}
  tessera_ddata_read_duration_seconds_sum{consistency="all"}
  tessera_ddata_read_duration_seconds_sum{consistency="from"}
  tessera_ddata_read_duration_seconds_sum{consistency="local"}
  tessera_ddata_read_duration_seconds_sum{consistency="majority"}
  tessera_ddata_read_duration_seconds_sum{consistency="majority_plus"}
TYPE tessera_ddata_remote_states_refused_total counter
  tessera_ddata_remote_states_refused_total{limit="keys"}
  tessera_ddata_remote_states_refused_total{limit="total_bytes"}
  tessera_ddata_remote_states_refused_total{limit="value_bytes"}
TYPE tessera_ddata_send_failures_total counter
  tessera_ddata_send_failures_total
TYPE tessera_ddata_updates_refused_total counter
  tessera_ddata_updates_refused_total{limit="keys"}
  tessera_ddata_updates_refused_total{limit="total_bytes"}
  tessera_ddata_updates_refused_total{limit="value_bytes"}
TYPE tessera_ddata_write_duration_seconds histogram
  tessera_ddata_write_duration_seconds_bucket{consistency="all",le}
  tessera_ddata_write_duration_seconds_bucket{consistency="local",le}
  tessera_ddata_write_duration_seconds_bucket{consistency="majority",le}
  tessera_ddata_write_duration_seconds_bucket{consistency="majority_plus",le}
  tessera_ddata_write_duration_seconds_bucket{consistency="to",le}
  tessera_ddata_write_duration_seconds_count{consistency="all"}
  tessera_ddata_write_duration_seconds_count{consistency="local"}
  tessera_ddata_write_duration_seconds_count{consistency="majority"}
  tessera_ddata_write_duration_seconds_count{consistency="majority_plus"}
  tessera_ddata_write_duration_seconds_count{consistency="to"}
  tessera_ddata_write_duration_seconds_sum{consistency="all"}
  tessera_ddata_write_duration_seconds_sum{consistency="local"}
  tessera_ddata_write_duration_seconds_sum{consistency="majority"}
  tessera_ddata_write_duration_seconds_sum{consistency="majority_plus"}
  tessera_ddata_write_duration_seconds_sum{consistency="to"}
TYPE tessera_entities_active gauge
  tessera_entities_active{type="account"}
TYPE tessera_entities_commands_handed_over_total counter
  tessera_entities_commands_handed_over_total{type="account"}
TYPE tessera_entities_evicted_total counter
  tessera_entities_evicted_total{type="account"}
TYPE tessera_entities_live gauge
  tessera_entities_live{type="account"}
TYPE tessera_entities_started_total counter
  tessera_entities_started_total{type="account"}
TYPE tessera_entity_ask_duration_seconds histogram
  tessera_entity_ask_duration_seconds_bucket{type="account",le}
  tessera_entity_ask_duration_seconds_count{type="account"}
  tessera_entity_ask_duration_seconds_sum{type="account"}
TYPE tessera_http_connections_accepted_total counter
  tessera_http_connections_accepted_total
TYPE tessera_http_connections_open gauge
  tessera_http_connections_open
TYPE tessera_http_connections_refused_total counter
  tessera_http_connections_refused_total
TYPE tessera_http_header_timeouts_total counter
  tessera_http_header_timeouts_total
TYPE tessera_http_requests_shed_total counter
  tessera_http_requests_shed_total
TYPE tessera_http_requests_timed_out_total counter
  tessera_http_requests_timed_out_total
TYPE tessera_http_requests_unauthorized_total counter
  tessera_http_requests_unauthorized_total
TYPE tessera_journal_append_duration_seconds histogram
  tessera_journal_append_duration_seconds_bucket{le}
  tessera_journal_append_duration_seconds_count
  tessera_journal_append_duration_seconds_sum
TYPE tessera_journal_append_latency_seconds histogram
  tessera_journal_append_latency_seconds_bucket{le}
  tessera_journal_append_latency_seconds_count
  tessera_journal_append_latency_seconds_sum
TYPE tessera_journal_appends_total counter
  tessera_journal_appends_total{outcome="acknowledged"}
  tessera_journal_appends_total{outcome="not_applied"}
  tessera_journal_appends_total{outcome="unknown"}
TYPE tessera_journal_creations_held_total counter
  tessera_journal_creations_held_total
TYPE tessera_journal_fenced_total counter
  tessera_journal_fenced_total
TYPE tessera_journal_fsync_duration_seconds histogram
  tessera_journal_fsync_duration_seconds_bucket{le}
  tessera_journal_fsync_duration_seconds_count
  tessera_journal_fsync_duration_seconds_sum
TYPE tessera_journal_known_stores gauge
  tessera_journal_known_stores
TYPE tessera_journal_known_stores_save_failures_total counter
  tessera_journal_known_stores_save_failures_total
TYPE tessera_journal_reconfigurations_total counter
  tessera_journal_reconfigurations_total
TYPE tessera_journal_recoveries_total counter
  tessera_journal_recoveries_total
TYPE tessera_journal_refused_writes_total counter
  tessera_journal_refused_writes_total
TYPE tessera_journal_repaired_entries_total counter
  tessera_journal_repaired_entries_total
TYPE tessera_journal_writers gauge
  tessera_journal_writers
TYPE tessera_projection_envelopes_handled_total counter
  tessera_projection_envelopes_handled_total{projection="balances",instance="0"}
TYPE tessera_projection_envelopes_skipped_total counter
  tessera_projection_envelopes_skipped_total{projection="balances",instance="0"}
TYPE tessera_projection_handler_errors_total counter
  tessera_projection_handler_errors_total{projection="balances",instance="0"}
TYPE tessera_projection_instance_running gauge
  tessera_projection_instance_running{projection="balances",instance="0"}
TYPE tessera_projection_lag_events gauge
  tessera_projection_lag_events{projection="balances",instance="0"}
TYPE tessera_projection_lag_seconds gauge
  tessera_projection_lag_seconds{projection="balances",instance="0"}
TYPE tessera_projection_offset_save_failures_total counter
  tessera_projection_offset_save_failures_total{projection="balances",instance="0"}
TYPE tessera_projection_offset_saves_total counter
  tessera_projection_offset_saves_total{projection="balances",instance="0"}
TYPE tessera_sharding_buffered_messages gauge
  tessera_sharding_buffered_messages{type="account"}
TYPE tessera_sharding_coordinator_handoffs_given_up_total counter
  tessera_sharding_coordinator_handoffs_given_up_total{type="account"}
TYPE tessera_sharding_coordinator_handoffs_total counter
  tessera_sharding_coordinator_handoffs_total{type="account"}
TYPE tessera_sharding_coordinator_running gauge
  tessera_sharding_coordinator_running{type="account"}
TYPE tessera_sharding_coordinator_write_failures_total counter
  tessera_sharding_coordinator_write_failures_total{type="account"}
TYPE tessera_sharding_coordinator_writes_total counter
  tessera_sharding_coordinator_writes_total{type="account"}
TYPE tessera_sharding_forwarded_total counter
  tessera_sharding_forwarded_total{type="account"}
TYPE tessera_sharding_frames_refused_total counter
  tessera_sharding_frames_refused_total{reason="malformed"}
  tessera_sharding_frames_refused_total{reason="queue_full"}
  tessera_sharding_frames_refused_total{reason="unrouted"}
TYPE tessera_sharding_rebalance_rounds_total counter
  tessera_sharding_rebalance_rounds_total{type="account"}
TYPE tessera_sharding_refused_total counter
  tessera_sharding_refused_total{type="account"}
TYPE tessera_sharding_region_handoffs_total counter
  tessera_sharding_region_handoffs_total{type="account"}
TYPE tessera_sharding_region_registered gauge
  tessera_sharding_region_registered{type="account"}
TYPE tessera_sharding_remember_writes_total counter
  tessera_sharding_remember_writes_total{outcome="failed"}
  tessera_sharding_remember_writes_total{outcome="stored"}
TYPE tessera_sharding_remembered_started_total counter
  tessera_sharding_remembered_started_total
TYPE tessera_sharding_replies_late_total counter
  tessera_sharding_replies_late_total
TYPE tessera_sharding_replies_unsent_total counter
  tessera_sharding_replies_unsent_total
TYPE tessera_sharding_shards gauge
  tessera_sharding_shards{type="account"}
TYPE tessera_transport_bytes_in_total counter
  tessera_transport_bytes_in_total
TYPE tessera_transport_bytes_out_total counter
  tessera_transport_bytes_out_total
TYPE tessera_transport_connections_accepted_total counter
  tessera_transport_connections_accepted_total
TYPE tessera_transport_connections_refused_total counter
  tessera_transport_connections_refused_total{reason="auth"}
  tessera_transport_connections_refused_total{reason="malformed"}
  tessera_transport_connections_refused_total{reason="oversize"}
  tessera_transport_connections_refused_total{reason="too_many_handshakes"}
TYPE tessera_transport_frames_in_total counter
  tessera_transport_frames_in_total
TYPE tessera_transport_frames_out_total counter
  tessera_transport_frames_out_total
TYPE tessera_transport_handshake_timeouts_total counter
  tessera_transport_handshake_timeouts_total
TYPE tessera_transport_inbound_connections gauge
  tessera_transport_inbound_connections
TYPE tessera_transport_inbound_dropped_total counter
  tessera_transport_inbound_dropped_total
TYPE tessera_transport_inbound_handshakes gauge
  tessera_transport_inbound_handshakes
TYPE tessera_transport_peers gauge
  tessera_transport_peers
TYPE tessera_transport_request_timeouts_total counter
  tessera_transport_request_timeouts_total
TYPE tessera_transport_requests_pending gauge
  tessera_transport_requests_pending
TYPE tessera_transport_requests_pending_max_per_peer gauge
  tessera_transport_requests_pending_max_per_peer
TYPE tessera_transport_requests_refused_total counter
  tessera_transport_requests_refused_total{reason="too_many_pending"}
  tessera_transport_requests_refused_total{reason="too_many_pending_for_peer"}
TYPE tessera_transport_responses_wrong_peer_total counter
  tessera_transport_responses_wrong_peer_total
TYPE tessera_transport_send_dropped_total counter
  tessera_transport_send_dropped_total
TYPE tessera_transport_sends_refused_too_many_peers_total counter
  tessera_transport_sends_refused_too_many_peers_total
"#;

    /// The families of a rendering: name → (type, sample signatures). Panics on a sample that
    /// belongs to no family, or a family without help.
    fn families(text: &str) -> BTreeMap<String, (String, BTreeSet<String>)> {
        let mut families: BTreeMap<String, (String, BTreeSet<String>)> = BTreeMap::new();
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
                assert!(
                    text.contains(&format!("# HELP {name} ")),
                    "{name} has no help"
                );
                current = name.to_string();
                let previous =
                    families.insert(current.clone(), (kind.to_string(), BTreeSet::new()));
                assert!(previous.is_none(), "{name} rendered twice");
            } else if line.starts_with('#') || line.is_empty() {
                continue;
            } else {
                let (family, kind_samples) = families
                    .get_mut(&current)
                    .unwrap_or_else(|| panic!("sample before any TYPE: {line}"));
                let name_end = line.find(['{', ' ']).expect("sample name");
                let name = &line[..name_end];
                let allowed: Vec<String> = if family == "histogram" {
                    ["_bucket", "_sum", "_count"]
                        .iter()
                        .map(|suffix| format!("{current}{suffix}"))
                        .collect()
                } else {
                    vec![current.clone()]
                };
                assert!(
                    allowed.iter().any(|a| a == name),
                    "{line} is not in {current}"
                );
                let labels = match line[name_end..].strip_prefix('{') {
                    Some(rest) => {
                        let end = rest.rfind('}').expect("closing brace");
                        rest[..end]
                            .split(',')
                            .map(|pair| match pair.split_once('=') {
                                Some(("le", _)) => "le".to_string(),
                                _ => pair.to_string(),
                            })
                            .collect::<Vec<_>>()
                            .join(",")
                    }
                    None => String::new(),
                };
                let signature = if labels.is_empty() {
                    name.to_string()
                } else {
                    format!("{name}{{{labels}}}")
                };
                kind_samples.insert(signature);
            }
        }
        families
    }

    fn listed(families: &BTreeMap<String, (String, BTreeSet<String>)>) -> String {
        let mut out = String::new();
        for (name, (kind, samples)) in families {
            let _ = writeln!(out, "TYPE {name} {kind}");
            for sample in samples {
                let _ = writeln!(out, "  {sample}");
            }
        }
        out
    }

    #[test]
    fn metrics_carry_every_listed_series_with_its_type_and_labels() {
        let metrics = NodeMetrics {
            entity_types: vec![("account".to_string(), HostStats::default())],
            sharding: vec![ShardingMetrics {
                entity_type: "account".to_string(),
                ..ShardingMetrics::default()
            }],
            latencies: Latencies {
                entity_asks: LatencyFamily::new("type", ["account"]),
                ..Latencies::default()
            },
            projections: vec![InstanceStatus {
                state: RunState::Running,
                lag_events: Some(3),
                lag_ms: Some(1_500),
                ..InstanceStatus::new("balances", "account", 0, 4, (0, 255))
            }],
            ..NodeMetrics::default()
        };
        let rendered = listed(&families(&render_prometheus(&metrics)));
        let expected: String = SERIES
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(rendered, expected, "rendered:\n{rendered}");
    }

    /// The value of the sample `series` (name and labels exactly as rendered) in `text`.
    fn sample(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{series} missing:\n{text}"))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_running_node_times_entity_asks_journal_writes_and_ddata_calls() {
        use crate::config::{ClusterSecret, NodeConfig};
        use crate::http::test_support as http_client;
        use std::time::{Duration, Instant};
        const TIMEOUT: Duration = Duration::from_secs(10);

        let dir = tempfile::tempdir().unwrap();
        let config = NodeConfig {
            host: "127.0.0.1".into(),
            port: 0,
            http_host: "127.0.0.1".into(),
            http_port: 0,
            data_dir: dir.path().join("node"),
            cluster_secret: Some(ClusterSecret::new("metrics-test")),
            ..NodeConfig::default()
        };
        let node = crate::node::NodeBuilder::new()
            .entity(crate::http::test_support::Tally)
            .start(&config)
            .await
            .expect("node starts");
        node.cluster
            .join(node.cluster_address().clone())
            .await
            .expect("the node forms its own cluster");
        let deadline = Instant::now() + TIMEOUT;
        while !(node.cluster.snapshot().self_status == Some(MemberStatus::Up)
            && node.sharding.all_registered())
        {
            assert!(
                Instant::now() < deadline,
                "the node is not Up and registered"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let http = node.http_address();
        let call = |method: &'static str, path: &'static str, body: Option<&'static str>| async move {
            let reply = http_client::request(http, method, path, body, TIMEOUT)
                .await
                .expect("request");
            assert_eq!(reply.status, 200, "{method} {path}: {}", reply.body);
        };
        for _ in 0..3 {
            call("POST", "/entities/tally/alice", Some(r#"{"add": 5}"#)).await;
        }
        call(
            "POST",
            "/ddata/counter/hits?consistency=majority",
            Some(r#"{"increment": 1}"#),
        )
        .await;
        call("GET", "/ddata/counter/hits", None).await;
        let text = http_client::get(http, "/metrics", TIMEOUT)
            .await
            .expect("GET /metrics")
            .body;
        node.kill().await;

        let asks = "tessera_entity_ask_duration_seconds";
        assert_eq!(
            sample(&text, &format!("{asks}_count{{type=\"tally\"}}")),
            3.0
        );
        assert_eq!(
            sample(
                &text,
                &format!("{asks}_bucket{{type=\"tally\",le=\"+Inf\"}}")
            ),
            3.0
        );
        assert!(sample(&text, &format!("{asks}_sum{{type=\"tally\"}}")) > 0.0);
        // Three deposits one after the other: an append and a synced group commit each.
        for appends in [
            "tessera_journal_append_duration_seconds",
            "tessera_journal_append_latency_seconds",
        ] {
            assert!(sample(&text, &format!("{appends}_count")) >= 3.0, "{text}");
            assert!(sample(&text, &format!("{appends}_sum")) > 0.0, "{text}");
            assert!(sample(&text, &format!("{appends}_bucket{{le=\"10\"}}")) >= 3.0);
        }
        let fsyncs = "tessera_journal_fsync_duration_seconds";
        assert!(sample(&text, &format!("{fsyncs}_count")) >= 3.0, "{text}");
        assert!(sample(&text, &format!("{fsyncs}_bucket{{le=\"+Inf\"}}")) >= 3.0);
        assert!(sample(&text, &format!("{fsyncs}_sum")) > 0.0, "{text}");
        // The HTTP calls at their levels (the coordinator keeps its state in Distributed Data
        // too, at its own levels).
        let writes = "tessera_ddata_write_duration_seconds";
        assert!(
            sample(
                &text,
                &format!("{writes}_count{{consistency=\"majority\"}}")
            ) >= 1.0
        );
        assert!(sample(&text, &format!("{writes}_sum{{consistency=\"majority\"}}")) > 0.0);
        let reads = "tessera_ddata_read_duration_seconds";
        assert!(sample(&text, &format!("{reads}_count{{consistency=\"local\"}}")) >= 1.0);
        assert!(
            sample(
                &text,
                &format!("{reads}_bucket{{consistency=\"local\",le=\"+Inf\"}}")
            ) >= 1.0
        );
        // And the new counters and gauges of the HTTP server and the transport.
        assert!(sample(&text, "tessera_http_connections_accepted_total") >= 6.0);
        assert_eq!(
            sample(&text, "tessera_http_requests_unauthorized_total"),
            0.0
        );
        sample(&text, "tessera_transport_peers");
        sample(
            &text,
            "tessera_transport_sends_refused_too_many_peers_total",
        );
    }
}
