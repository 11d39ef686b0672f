//! Phi accrual failure detector (Hayashibara et al.), in Akka's formulation.
//!
//! Instead of answering "is the node down?" the detector answers with `phi`, a suspicion level
//! that grows with the time since the last heartbeat, scaled by how regular the heartbeats have
//! been so far. The caller compares it with a threshold (8 by default). Time is passed in; the
//! detector never reads a clock.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Tuning of a [`PhiAccrualFailureDetector`]; the defaults are Akka's.
#[derive(Clone, Debug, PartialEq)]
pub struct FailureDetectorConfig {
    /// Phi at or above which the monitored node is considered unavailable.
    pub threshold: f64,
    /// How many heartbeat intervals the history keeps (oldest dropped first).
    pub max_sample_size: usize,
    /// Floor of the standard deviation, so perfectly regular heartbeats do not make the
    /// detector trigger on the first few milliseconds of delay.
    pub min_std_deviation: Duration,
    /// Pause (GC, network hiccup) tolerated on top of the mean interval before phi rises.
    pub acceptable_heartbeat_pause: Duration,
    /// Assumed heartbeat interval before any interval has been measured.
    pub first_heartbeat_estimate: Duration,
}

impl Default for FailureDetectorConfig {
    fn default() -> Self {
        Self {
            threshold: 8.0,
            max_sample_size: 1000,
            min_std_deviation: Duration::from_millis(100),
            acceptable_heartbeat_pause: Duration::from_secs(3),
            first_heartbeat_estimate: Duration::from_secs(1),
        }
    }
}

/// Upper bound of `max_sample_size`: keeps the history's memory and its running sums bounded
/// (intervals are capped at [`INTERVAL_MICROS_MAX`], so the squared sum stays far below
/// `u128::MAX`).
pub const MAX_SAMPLE_SIZE_LIMIT: usize = 1_000_000;

/// Longest interval recorded in the history, in microseconds (about 12.7 days). Longer
/// intervals are recorded as this value; they can only arise from an `acceptable_heartbeat_pause`
/// of that order.
pub const INTERVAL_MICROS_MAX: u64 = 1 << 40;

/// A failure detector setting outside its allowed range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid failure detector setting {field} = {value}: {allowed}")]
pub struct FailureDetectorConfigError {
    /// Name of the offending field.
    pub field: &'static str,
    /// The value that was given, as text.
    pub value: String,
    /// What the field accepts.
    pub allowed: &'static str,
}

impl FailureDetectorConfig {
    /// Checks every field; the first offending one is named in the error.
    pub fn validate(&self) -> Result<(), FailureDetectorConfigError> {
        let err = |field, value: String, allowed| {
            Err(FailureDetectorConfigError {
                field,
                value,
                allowed,
            })
        };
        if !(self.threshold.is_finite() && self.threshold > 0.0) {
            return err(
                "threshold",
                self.threshold.to_string(),
                "a finite number > 0 (default 8.0)",
            );
        }
        if self.max_sample_size == 0 || self.max_sample_size > MAX_SAMPLE_SIZE_LIMIT {
            return err(
                "max_sample_size",
                self.max_sample_size.to_string(),
                "an integer in 1..=1000000 (default 1000)",
            );
        }
        if self.min_std_deviation.is_zero() {
            return err(
                "min_std_deviation",
                format!("{:?}", self.min_std_deviation),
                "a duration > 0 (default 100ms)",
            );
        }
        if self.acceptable_heartbeat_pause.as_micros() > u128::from(INTERVAL_MICROS_MAX) {
            return err(
                "acceptable_heartbeat_pause",
                format!("{:?}", self.acceptable_heartbeat_pause),
                "a duration of at most 2^40 µs, about 12.7 days (default 3s)",
            );
        }
        let first_micros = self.first_heartbeat_estimate.as_micros();
        if first_micros == 0 || first_micros > u128::from(INTERVAL_MICROS_MAX) {
            return err(
                "first_heartbeat_estimate",
                format!("{:?}", self.first_heartbeat_estimate),
                "a duration in 1µs..=2^40 µs (default 1s)",
            );
        }
        Ok(())
    }
}

/// Bounded history of heartbeat intervals with running sums, so mean and variance cost O(1).
///
/// Intervals are whole microseconds in integers: running sums that are added to and subtracted
/// from for days do not drift the way floating-point sums do.
#[derive(Clone, Debug)]
struct HeartbeatHistory {
    max_sample_size: usize,
    intervals_micros: VecDeque<u64>,
    interval_sum_micros: u128,
    squared_interval_sum_micros: u128,
}

impl HeartbeatHistory {
    fn new(max_sample_size: usize) -> Self {
        Self {
            max_sample_size,
            intervals_micros: VecDeque::new(),
            interval_sum_micros: 0,
            squared_interval_sum_micros: 0,
        }
    }

    fn push(&mut self, interval: Duration) {
        let micros = u64::try_from(interval.as_micros())
            .unwrap_or(u64::MAX)
            .min(INTERVAL_MICROS_MAX);
        while self.intervals_micros.len() >= self.max_sample_size {
            let Some(oldest) = self.intervals_micros.pop_front() else {
                break;
            };
            let oldest = u128::from(oldest);
            self.interval_sum_micros = self.interval_sum_micros.saturating_sub(oldest);
            self.squared_interval_sum_micros = self
                .squared_interval_sum_micros
                .saturating_sub(oldest * oldest);
        }
        let m = u128::from(micros);
        self.intervals_micros.push_back(micros);
        // Cannot saturate: at most 2^20 samples of at most 2^80 µs² each.
        self.interval_sum_micros = self.interval_sum_micros.saturating_add(m);
        self.squared_interval_sum_micros = self.squared_interval_sum_micros.saturating_add(m * m);
    }

    fn len(&self) -> usize {
        self.intervals_micros.len()
    }

    fn mean_micros(&self) -> f64 {
        match self.len() {
            0 => 0.0,
            n => self.interval_sum_micros as f64 / n as f64,
        }
    }

    fn std_deviation_micros(&self) -> f64 {
        let n = self.len();
        if n == 0 {
            return 0.0;
        }
        let mean = self.mean_micros();
        let variance = self.squared_interval_sum_micros as f64 / n as f64 - mean * mean;
        // Rounding can make a zero variance slightly negative.
        variance.max(0.0).sqrt()
    }
}

/// Failure detector for one monitored node: feed it heartbeats, ask it for `phi`.
///
/// Follows Akka's `PhiAccrualFailureDetector`: the history starts with two synthetic intervals
/// around `first_heartbeat_estimate`, the acceptable pause is added to the mean, and a
/// heartbeat arriving after the node was already considered unavailable updates the timestamp
/// but not the history (a long pause would skew the statistics).
#[derive(Clone, Debug)]
pub struct PhiAccrualFailureDetector {
    config: FailureDetectorConfig,
    history: HeartbeatHistory,
    last_heartbeat_at: Option<Instant>,
}

impl PhiAccrualFailureDetector {
    /// A detector that has not yet seen a heartbeat (and so reports phi 0: available).
    pub fn new(config: FailureDetectorConfig) -> Result<Self, FailureDetectorConfigError> {
        config.validate()?;
        Ok(Self {
            history: HeartbeatHistory::new(config.max_sample_size),
            config,
            last_heartbeat_at: None,
        })
    }

    /// The configuration this detector runs with.
    pub fn config(&self) -> &FailureDetectorConfig {
        &self.config
    }

    /// Records a heartbeat from the monitored node at `now`.
    ///
    /// A `now` earlier than the previous heartbeat counts as a zero interval.
    pub fn heartbeat(&mut self, now: Instant) {
        match self.last_heartbeat_at {
            None => {
                let mean = self.config.first_heartbeat_estimate;
                let std_deviation = mean / 4;
                self.history.push(mean.saturating_sub(std_deviation));
                self.history.push(mean.saturating_add(std_deviation));
            }
            Some(last) => {
                if self.is_available(now) {
                    self.history.push(now.saturating_duration_since(last));
                }
            }
        }
        self.last_heartbeat_at = Some(now);
    }

    /// Suspicion level at `now`: 0 before the first heartbeat, then growing with the time since
    /// the last one. Always finite and non-negative.
    pub fn phi(&self, now: Instant) -> f64 {
        let Some(last) = self.last_heartbeat_at else {
            return 0.0;
        };
        let elapsed_micros = now.saturating_duration_since(last).as_micros() as f64;
        let mean_micros =
            self.history.mean_micros() + self.config.acceptable_heartbeat_pause.as_micros() as f64;
        let std_deviation_micros = self
            .history
            .std_deviation_micros()
            .max(self.config.min_std_deviation.as_micros() as f64)
            // `min_std_deviation` may be below 1 µs; never divide by zero.
            .max(f64::MIN_POSITIVE);
        phi(elapsed_micros, mean_micros, std_deviation_micros)
    }

    /// True while phi is below the threshold.
    pub fn is_available(&self, now: Instant) -> bool {
        self.phi(now) < self.config.threshold
    }

    /// True once the first heartbeat has been recorded.
    pub fn is_monitoring(&self) -> bool {
        self.last_heartbeat_at.is_some()
    }

    /// Number of intervals in the history (including the two synthetic ones); never above
    /// `max_sample_size`.
    pub fn sample_count(&self) -> usize {
        self.history.len()
    }
}

/// Phi for `elapsed` time since the last heartbeat, given the (pause-adjusted) mean and the
/// standard deviation of the intervals, all in the same unit.
///
/// Akka computes, with `y = (t - mean) / std` and `e = exp(-y (1.5976 + 0.070566 y²))` (a
/// logistic approximation of the normal CDF), `-log10(e / (1 + e))` when `t > mean` and
/// `-log10(1 - 1 / (1 + e))` otherwise. Both branches equal `log10(1 + exp(z))` with
/// `z = y (1.5976 + 0.070566 y²)`; evaluating that as a softplus keeps phi finite where `e`
/// underflows to 0 (Akka's version then returns infinity) and non-negative everywhere.
fn phi(elapsed: f64, mean: f64, std_deviation: f64) -> f64 {
    let y = (elapsed - mean) / std_deviation;
    let z = y * (1.5976 + 0.070566 * y * y);
    let softplus = z.max(0.0) + (-z.abs()).exp().ln_1p();
    let value = softplus / std::f64::consts::LN_10;
    if value.is_nan() {
        0.0
    } else {
        value.clamp(0.0, f64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn detector() -> PhiAccrualFailureDetector {
        PhiAccrualFailureDetector::new(FailureDetectorConfig::default()).unwrap()
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    /// Heartbeats at t0, t0+1s, ..., returns the time of the last one.
    fn regular_heartbeats(fd: &mut PhiAccrualFailureDetector, t0: Instant, count: u32) -> Instant {
        let mut t = t0;
        for i in 0..count {
            t = t0 + Duration::from_secs(u64::from(i));
            fd.heartbeat(t);
        }
        t
    }

    #[test]
    fn unmonitored_node_has_phi_zero_and_is_available() {
        let fd = detector();
        let now = Instant::now();
        assert!(!fd.is_monitoring());
        assert_eq!(fd.phi(now), 0.0);
        assert!(fd.is_available(now + Duration::from_secs(3600)));
    }

    #[test]
    fn phi_rises_with_time_since_last_heartbeat() {
        let mut fd = detector();
        let t0 = Instant::now();
        let last = regular_heartbeats(&mut fd, t0, 10);
        let mut previous = fd.phi(last);
        for ms in (100..10_000).step_by(100) {
            let p = fd.phi(last + Duration::from_millis(ms));
            assert!(p >= previous, "phi fell from {previous} to {p} at {ms} ms");
            previous = p;
        }
        assert!(previous > 8.0);
    }

    #[test]
    fn one_second_heartbeats_detected_between_4_3_and_5_seconds_of_silence() {
        let mut fd = detector();
        let t0 = Instant::now();
        let last = regular_heartbeats(&mut fd, t0, 10);
        assert!(fd.is_available(last + secs(3.0)));
        assert!(fd.is_available(last + secs(4.0)));
        assert!(!fd.is_available(last + secs(5.0)));
        let first_unavailable_ms = (0..10_000u64)
            .find(|ms| !fd.is_available(last + Duration::from_millis(*ms)))
            .unwrap();
        assert!(
            (4_300..=5_000).contains(&first_unavailable_ms),
            "unavailable after {first_unavailable_ms} ms"
        );
    }

    #[test]
    fn regular_heartbeats_keep_node_available() {
        let mut fd = detector();
        let t0 = Instant::now();
        for i in 0..5_000u64 {
            // 1 s ± up to 200 ms of jitter.
            let t = t0 + Duration::from_millis(i * 1000 + (i * 37) % 200);
            assert!(fd.is_available(t), "unavailable at heartbeat {i}");
            fd.heartbeat(t);
            assert!(fd.is_available(t + Duration::from_millis(1500)));
        }
    }

    #[test]
    fn history_never_exceeds_max_sample_size() {
        let config = FailureDetectorConfig {
            max_sample_size: 5,
            ..FailureDetectorConfig::default()
        };
        let mut fd = PhiAccrualFailureDetector::new(config).unwrap();
        let t0 = Instant::now();
        for i in 0..50u64 {
            fd.heartbeat(t0 + Duration::from_secs(i));
            assert!(fd.sample_count() <= 5);
        }
        assert_eq!(fd.sample_count(), 5);
        // The synthetic bootstrap samples have been pushed out: only 1 s intervals remain.
        assert_eq!(fd.history.mean_micros(), 1_000_000.0);
        assert_eq!(fd.history.std_deviation_micros(), 0.0);
    }

    #[test]
    fn heartbeat_after_unavailability_does_not_enter_history() {
        let mut fd = detector();
        let t0 = Instant::now();
        let last = regular_heartbeats(&mut fd, t0, 10);
        let samples = fd.sample_count();
        let late = last + Duration::from_secs(60);
        fd.heartbeat(late);
        assert_eq!(fd.sample_count(), samples);
        assert!(fd.is_available(late + Duration::from_secs(1)));
    }

    #[test]
    fn out_of_order_time_does_not_panic() {
        let mut fd = detector();
        let t0 = Instant::now() + Duration::from_secs(100);
        fd.heartbeat(t0);
        fd.heartbeat(t0 - Duration::from_secs(50));
        assert_eq!(
            fd.phi(t0 - Duration::from_secs(99)),
            fd.phi(t0 - Duration::from_secs(50))
        );
    }

    #[test]
    fn invalid_settings_are_named_in_the_error() {
        let base = FailureDetectorConfig::default();
        let cases = [
            (
                FailureDetectorConfig {
                    threshold: 0.0,
                    ..base.clone()
                },
                "threshold",
            ),
            (
                FailureDetectorConfig {
                    threshold: f64::NAN,
                    ..base.clone()
                },
                "threshold",
            ),
            (
                FailureDetectorConfig {
                    max_sample_size: 0,
                    ..base.clone()
                },
                "max_sample_size",
            ),
            (
                FailureDetectorConfig {
                    min_std_deviation: Duration::ZERO,
                    ..base.clone()
                },
                "min_std_deviation",
            ),
            (
                FailureDetectorConfig {
                    first_heartbeat_estimate: Duration::ZERO,
                    ..base.clone()
                },
                "first_heartbeat_estimate",
            ),
            (
                FailureDetectorConfig {
                    acceptable_heartbeat_pause: Duration::MAX,
                    ..base.clone()
                },
                "acceptable_heartbeat_pause",
            ),
        ];
        for (config, field) in cases {
            let err = PhiAccrualFailureDetector::new(config).unwrap_err();
            assert_eq!(err.field, field);
            assert!(err.to_string().contains(field), "{err}");
        }
        assert!(base.validate().is_ok());
    }

    /// Akka's two-branch expression, verbatim, to check the stable form against.
    fn akka_phi(elapsed: f64, mean: f64, std_deviation: f64) -> f64 {
        let y = (elapsed - mean) / std_deviation;
        let e = (-y * (1.5976 + 0.070566 * y * y)).exp();
        if elapsed > mean {
            -(e / (1.0 + e)).log10()
        } else {
            -(1.0 - 1.0 / (1.0 + e)).log10()
        }
    }

    #[test]
    fn stable_phi_matches_akka_formula_where_akka_is_precise() {
        for elapsed_ms in (0..12_000).step_by(7) {
            let elapsed = f64::from(elapsed_ms);
            let ours = phi(elapsed, 4_000.0, 100.0);
            let akka = akka_phi(elapsed, 4_000.0, 100.0);
            // Past phi ≈ 300 Akka's `e` is subnormal and loses digits; compare below that.
            if akka < 300.0 {
                assert!(
                    (ours - akka).abs() <= 1e-9 * akka.abs().max(1.0),
                    "{elapsed_ms} ms: ours {ours}, akka {akka}"
                );
            } else {
                assert!(
                    ours.is_finite() && ours > 299.0,
                    "{elapsed_ms} ms: ours {ours}"
                );
            }
        }
    }

    proptest! {
        #[test]
        fn phi_is_finite_non_negative_and_monotonic(
            intervals_ms in proptest::collection::vec(0u64..20_000, 0..40),
            max_sample_size in 1usize..50,
            min_std_deviation_ms in 1u64..2_000,
            pause_ms in 0u64..10_000,
            probes_ms in proptest::collection::vec(0u64..1_000_000, 1..30),
        ) {
            let config = FailureDetectorConfig {
                max_sample_size,
                min_std_deviation: Duration::from_millis(min_std_deviation_ms),
                acceptable_heartbeat_pause: Duration::from_millis(pause_ms),
                ..FailureDetectorConfig::default()
            };
            let mut fd = PhiAccrualFailureDetector::new(config).unwrap();
            let mut t = Instant::now();
            fd.heartbeat(t);
            for ms in intervals_ms {
                t += Duration::from_millis(ms);
                fd.heartbeat(t);
            }
            let mut probes = probes_ms;
            probes.sort_unstable();
            let mut previous = 0.0;
            for ms in probes {
                let p = fd.phi(t + Duration::from_millis(ms));
                prop_assert!(p.is_finite() && p >= 0.0, "phi {} at {} ms", p, ms);
                prop_assert!(p >= previous, "phi fell from {} to {} at {} ms", previous, p, ms);
                previous = p;
            }
        }
    }
}
