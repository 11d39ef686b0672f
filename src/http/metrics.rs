//! `GET /metrics`: the node's counters in the Prometheus text exposition format 0.0.4.

use super::Control;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use std::fmt::Write;
use tessera_cluster::MemberStatus;
use tessera_entities::HostStats;
use tessera_persistence::PersistenceMetricsSnapshot;

/// Content type of the Prometheus text format.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The numbers `/metrics` shows, collected by the node wiring from the cluster and transport.
/// Counters (`*_total`) only grow for the life of the process; the rest are gauges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
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
    pub rebalance_rounds_total: u64,
    pub coordinator_writes_total: u64,
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
}

/// One metric family: name, help, type and its samples (`labels`, value).
struct Family<'a> {
    name: &'a str,
    help: &'a str,
    kind: &'a str,
    samples: Vec<(String, u64)>,
}

impl<'a> Family<'a> {
    fn new(name: &'a str, kind: &'a str, help: &'a str) -> Self {
        Self {
            name,
            help,
            kind,
            samples: Vec::new(),
        }
    }

    fn counter(name: &'a str, help: &'a str, value: u64) -> Self {
        Self::new(name, "counter", help).sample("", value)
    }

    fn gauge(name: &'a str, help: &'a str, value: u64) -> Self {
        Self::new(name, "gauge", help).sample("", value)
    }

    /// Adds a sample; `labels` is empty or `key="value"` pairs, already escaped.
    fn sample(mut self, labels: &str, value: u64) -> Self {
        self.samples.push((labels.to_string(), value));
        self
    }

    /// A histogram family: cumulative buckets (`le` in seconds), then `_sum` and `_count`.
    fn write_histogram(
        out: &mut String,
        name: &str,
        help: &str,
        histogram: &tessera_persistence::HistogramSnapshot,
    ) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (bound_us, count) in &histogram.buckets {
            let le = *bound_us as f64 / 1e6;
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {count}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", histogram.count);
        let _ = writeln!(out, "{name}_sum {}", histogram.sum_us as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {}", histogram.count);
    }

    fn write(&self, out: &mut String) {
        // Writing to a String cannot fail.
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
        for (labels, value) in &self.samples {
            if labels.is_empty() {
                let _ = writeln!(out, "{} {value}", self.name);
            } else {
                let _ = writeln!(out, "{}{{{labels}}} {value}", self.name);
            }
        }
    }
}

/// A label value escaped as the text format wants: backslash, double quote and newline.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Renders `metrics` in the Prometheus text format. Every member status and every refusal
/// reason is present, zeros included, so dashboards never see a series appear from nowhere.
pub fn render_prometheus(metrics: &NodeMetrics) -> String {
    let mut members = Family::new(
        "tessera_cluster_members",
        "gauge",
        "Members of the cluster by status, as seen by this node.",
    );
    for status in MemberStatus::ALL {
        let count: u64 = metrics
            .members_by_status
            .iter()
            .filter(|(s, _)| *s == status)
            .map(|(_, n)| *n)
            .sum();
        members = members.sample(&format!("status=\"{}\"", status.as_str()), count);
    }
    let refused = metrics.connections_refused_total;
    let mut live = Family::new(
        "tessera_entities_live",
        "gauge",
        "Entity incarnations running now, by entity type.",
    );
    let mut started = Family::new(
        "tessera_entities_started_total",
        "counter",
        "Entity incarnations started (first commands, and restarts after a passivation or \
         stop), by entity type.",
    );
    let mut handed_over = Family::new(
        "tessera_entities_commands_handed_over_total",
        "counter",
        "Commands that arrived while their entity was stopping and went to its next \
         incarnation, by entity type.",
    );
    for (entity_type, stats) in &metrics.entity_types {
        let label = format!("type=\"{}\"", escape_label(entity_type));
        live = live.sample(&label, stats.live_entities);
        started = started.sample(&label, stats.incarnations_started);
        handed_over = handed_over.sample(&label, stats.commands_handed_over);
    }
    let mut sharding_families = [
        Family::new(
            "tessera_sharding_shards",
            "gauge",
            "Shards this node's region runs, by entity type.",
        ),
        Family::new(
            "tessera_sharding_buffered_messages",
            "gauge",
            "Messages a region holds while it learns where their shard lives.",
        ),
        Family::new(
            "tessera_sharding_region_registered",
            "gauge",
            "1 when the region is registered with its coordinator, else 0.",
        ),
        Family::new(
            "tessera_sharding_region_handoffs_total",
            "counter",
            "Shards this node's region stopped and handed off.",
        ),
        Family::new(
            "tessera_sharding_forwarded_total",
            "counter",
            "Messages sent on to the region that runs their shard.",
        ),
        Family::new(
            "tessera_sharding_refused_total",
            "counter",
            "Messages refused because the region's buffer was full.",
        ),
        Family::new(
            "tessera_sharding_coordinator_running",
            "gauge",
            "1 when the entity type's shard coordinator runs on this node, else 0.",
        ),
        Family::new(
            "tessera_sharding_coordinator_handoffs_total",
            "counter",
            "Handoffs the coordinator on this node completed (since it started here).",
        ),
        Family::new(
            "tessera_sharding_rebalance_rounds_total",
            "counter",
            "Rebalance rounds the coordinator on this node started (since it started here).",
        ),
        Family::new(
            "tessera_sharding_coordinator_writes_total",
            "counter",
            "Coordinator state writes stored (since it started here).",
        ),
    ];
    for sharding in &metrics.sharding {
        let label = format!("type=\"{}\"", escape_label(&sharding.entity_type));
        let values = [
            sharding.shards,
            sharding.buffered,
            u64::from(sharding.registered),
            sharding.region_handoffs_total,
            sharding.forwarded_total,
            sharding.refused_total,
            u64::from(sharding.coordinator_running),
            sharding.coordinator_handoffs_total,
            sharding.rebalance_rounds_total,
            sharding.coordinator_writes_total,
        ];
        for (family, value) in sharding_families.iter_mut().zip(values) {
            let taken = std::mem::replace(family, Family::new("", "", ""));
            *family = taken.sample(&label, value);
        }
    }
    let families = [
        members,
        Family::gauge(
            "tessera_cluster_unreachable_members",
            "Members that some observer cannot reach.",
            metrics.unreachable_members,
        ),
        Family::gauge(
            "tessera_cluster_is_leader",
            "1 when this node is the cluster leader, else 0.",
            u64::from(metrics.is_leader),
        ),
        Family::counter(
            "tessera_cluster_gossip_sent_total",
            "Full gossip states sent.",
            metrics.gossip_sent_total,
        ),
        Family::counter(
            "tessera_cluster_gossip_received_total",
            "Gossip messages received.",
            metrics.gossip_received_total,
        ),
        Family::counter(
            "tessera_cluster_gossip_status_sent_total",
            "Gossip status digests sent.",
            metrics.gossip_status_sent_total,
        ),
        Family::counter(
            "tessera_cluster_heartbeats_sent_total",
            "Heartbeats sent to monitored nodes.",
            metrics.heartbeats_sent_total,
        ),
        Family::counter(
            "tessera_cluster_heartbeat_responses_received_total",
            "Heartbeat responses received.",
            metrics.heartbeat_responses_received_total,
        ),
        Family::counter(
            "tessera_transport_frames_in_total",
            "Transport frames received.",
            metrics.frames_in_total,
        ),
        Family::counter(
            "tessera_transport_frames_out_total",
            "Transport frames sent.",
            metrics.frames_out_total,
        ),
        Family::counter(
            "tessera_transport_bytes_in_total",
            "Transport bytes received.",
            metrics.bytes_in_total,
        ),
        Family::counter(
            "tessera_transport_bytes_out_total",
            "Transport bytes sent.",
            metrics.bytes_out_total,
        ),
        Family::counter(
            "tessera_transport_connections_accepted_total",
            "Inbound connections accepted after the handshake.",
            metrics.connections_accepted_total,
        ),
        Family::new(
            "tessera_transport_connections_refused_total",
            "counter",
            "Inbound connections refused, by reason.",
        )
        .sample("reason=\"auth\"", refused.auth)
        .sample("reason=\"malformed\"", refused.malformed)
        .sample("reason=\"oversize\"", refused.oversize),
        Family::counter(
            "tessera_transport_send_dropped_total",
            "Outbound messages dropped because a send queue was full.",
            metrics.send_dropped_total,
        ),
        Family::counter(
            "tessera_transport_inbound_dropped_total",
            "Inbound messages dropped because a service queue was full.",
            metrics.inbound_dropped_total,
        ),
        Family::counter(
            "tessera_transport_request_timeouts_total",
            "Requests that got no response within their timeout.",
            metrics.request_timeouts_total,
        ),
        Family::gauge(
            "tessera_ddata_keys",
            "Distributed Data keys held by this node's replica, deleted ones included.",
            metrics.ddata_keys,
        ),
        Family::counter(
            "tessera_ddata_send_failures_total",
            "Replicator messages the transport refused to queue.",
            metrics.ddata_send_failures_total,
        ),
        Family::counter(
            "tessera_ddata_decode_errors_total",
            "Replicator messages from peers that could not be decoded.",
            metrics.ddata_decode_errors_total,
        ),
        Family::counter(
            "tessera_ddata_dropped_notifications_total",
            "Change notifications dropped because a subscriber's queue was full.",
            metrics.ddata_dropped_notifications_total,
        ),
        Family::counter(
            "tessera_ddata_durable_failures_total",
            "Durable-key writes that failed.",
            metrics.ddata_durable_failures_total,
        ),
        live,
        started,
        handed_over,
        Family::counter(
            "tessera_transport_responses_wrong_peer_total",
            "Responses dropped because another peer than the one asked sent them.",
            metrics.responses_wrong_peer_total,
        ),
        Family::new(
            "tessera_journal_appends_total",
            "counter",
            "Replicated appends by outcome: acknowledged by a write quorum, not applied \
             (refused before anything was sent), unknown (sent, not acknowledged).",
        )
        .sample(
            "outcome=\"acknowledged\"",
            metrics.journal.appends_acknowledged,
        )
        .sample(
            "outcome=\"not_applied\"",
            metrics.journal.appends_not_applied,
        )
        .sample("outcome=\"unknown\"", metrics.journal.appends_unknown),
        Family::counter(
            "tessera_journal_recoveries_total",
            "Log writers started: each fenced its log and recovered it.",
            metrics.journal.recoveries,
        ),
        Family::counter(
            "tessera_journal_fenced_total",
            "Log writers stopped because a later writer fenced them.",
            metrics.journal.fenced,
        ),
        Family::counter(
            "tessera_journal_refused_writes_total",
            "Writes refused because their writer had been fenced.",
            metrics.journal.refused_fenced,
        ),
        Family::counter(
            "tessera_journal_repaired_entries_total",
            "Entries copied to replicas that lacked them (repairs and catch-ups).",
            metrics.journal.entries_copied,
        ),
        Family::counter(
            "tessera_journal_reconfigurations_total",
            "Configuration changes completed: logs moved off members that left, or grown to N.",
            metrics.journal.reconfigurations,
        ),
        Family::gauge(
            "tessera_journal_writers",
            "Log writers this node runs now.",
            metrics.journal.writers,
        ),
    ];
    let mut out = String::with_capacity(8192);
    for family in families.iter().chain(&sharding_families) {
        family.write(&mut out);
    }
    Family::write_histogram(
        &mut out,
        "tessera_journal_append_latency_seconds",
        "Time from a replicated append's call to its acknowledgement.",
        &metrics.journal.append_latency,
    );
    out
}

/// `GET /metrics`.
pub(super) async fn handler(State(control): State<Control>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE)],
        render_prometheus(&control.metrics()),
    )
}
