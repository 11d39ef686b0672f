//! Latency histograms, recorded where the work happens (the journal's writer thread, the
//! replicated journal, the Replicator's handle, the node's entity asks) and read by the node's
//! `GET /metrics`.
//!
//! They are prometheus-client histograms behind two small types: [`LatencyHistogram`], one
//! series with the buckets every tessera latency uses, and [`LatencyFamily`], one histogram per
//! value of a label, all made up front. A clone shares its counts (an `Arc`), so the renderer
//! holds the live histogram rather than a copy, and there is no global registry: whoever
//! renders gets the handles from whoever records.

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::histogram::Histogram;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Upper bounds of the latency buckets, in seconds: 100 µs to 10 s in 1-2.5-5 steps, from a
/// write to the page cache to an ask that waits out its timeout (`+Inf` is implicit).
pub const LATENCY_BUCKETS_SECONDS: [f64; 16] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Durations in seconds, counted in [`LATENCY_BUCKETS_SECONDS`]. Cheap to clone; clones share
/// their counts. Recording takes a short uncontended lock: negligible beside the fsyncs and
/// network round trips it measures.
#[derive(Clone, Debug)]
pub struct LatencyHistogram(Histogram);

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self(Histogram::new(LATENCY_BUCKETS_SECONDS))
    }
}

impl LatencyHistogram {
    /// Counts one duration.
    pub fn observe(&self, elapsed: Duration) {
        self.0.observe(elapsed.as_secs_f64());
    }

    /// Counts the time since `started`.
    pub fn observe_since(&self, started: Instant) {
        self.observe(started.elapsed());
    }
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// One [`LatencyHistogram`] per value of a label (an entity type, a consistency level), all
/// made when the family is: the values are bounded whatever callers pass, and every series
/// exists from the start, at zero, rather than appearing with its first observation.
#[derive(Clone, Debug)]
pub struct LatencyFamily {
    label: &'static str,
    members: Arc<[(String, LatencyHistogram)]>,
}

impl LatencyFamily {
    /// A family labelled `label`, with one histogram for each of `values`, in their order.
    pub fn new<V: Into<String>>(label: &'static str, values: impl IntoIterator<Item = V>) -> Self {
        Self {
            label,
            members: values
                .into_iter()
                .map(|value| (value.into(), LatencyHistogram::default()))
                .collect(),
        }
    }

    /// The label's name.
    pub fn label(&self) -> &'static str {
        self.label
    }

    /// The histogram of `value`; None for a value the family was not made with.
    pub fn get(&self, value: &str) -> Option<&LatencyHistogram> {
        self.members
            .iter()
            .find(|(v, _)| v == value)
            .map(|(_, histogram)| histogram)
    }

    /// Each value with its histogram, in the order the family was made with.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &LatencyHistogram)> {
        self.members.iter().map(|(v, h)| (v.as_str(), h))
    }
}

impl EncodeMetric for LatencyFamily {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (value, histogram) in self.iter() {
            let labels = [(self.label, value)];
            histogram.encode(encoder.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// `metric` alone under `name`, in the Prometheus text format: for tests and tools that look
/// at one histogram without a node around it.
pub fn to_text(
    name: &str,
    metric: &(impl EncodeMetric + Clone + std::fmt::Debug + Send + Sync + 'static),
) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register(name, "", metric.clone());
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)
        .expect("writing to a String cannot fail");
    text
}

/// The `_count` of the histogram called `name` in `text` (summed over its label sets): how
/// many observations a rendering shows.
pub fn count_in(text: &str, name: &str) -> u64 {
    let prefix = format!("{name}_count");
    text.lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .filter_map(|rest| rest.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_counts_durations_in_cumulative_second_buckets() {
        let histogram = LatencyHistogram::default();
        let clone = histogram.clone();
        histogram.observe(Duration::from_micros(300));
        clone.observe(Duration::from_millis(20));
        let text = to_text("x_seconds", &histogram);
        for line in [
            "# TYPE x_seconds histogram",
            "x_seconds_bucket{le=\"0.0001\"} 0",
            "x_seconds_bucket{le=\"0.0005\"} 1",
            "x_seconds_bucket{le=\"0.025\"} 2",
            "x_seconds_bucket{le=\"10\"} 2",
            "x_seconds_bucket{le=\"+Inf\"} 2",
            "x_seconds_count 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        assert!(text.contains("x_seconds_sum 0.0203"), "{text}");
        assert_eq!(count_in(&text, "x_seconds"), 2);
    }

    #[test]
    fn a_family_has_every_value_from_the_start_and_no_other() {
        let family = LatencyFamily::new("level", ["local", "majority"]);
        family
            .get("majority")
            .expect("made")
            .observe(Duration::from_secs(1));
        assert!(family.get("all").is_none());
        let text = to_text("y_seconds", &family);
        assert!(
            text.contains("y_seconds_count{level=\"local\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("y_seconds_count{level=\"majority\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("y_seconds_bucket{level=\"majority\",le=\"1\"} 1\n"),
            "{text}"
        );
        assert_eq!(count_in(&text, "y_seconds"), 1);
        assert_eq!(family.label(), "level");
    }
}
