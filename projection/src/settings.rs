//! How a projection saves its offset and treats its handler's failures.

use std::time::Duration;

/// What an instance does with envelopes its handler failed on after every retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureAction {
    /// Count them as skipped and go on: the offset moves past them.
    Skip,
    /// Stop the run without moving the offset past them: the instance starts again (at the
    /// next keep-alive) from its saved offset, and meets them again.
    Stop,
}

/// A projection's settings, Akka's defaults unless noted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProjectionSettings {
    /// The offset is saved after this many envelopes were handled (Akka: 100)...
    pub save_after_envelopes: u32,
    /// ...or this long after the first envelope not saved yet (Akka: 500 ms).
    pub save_interval: Duration,
    /// Attempts of a failing handler after its first one.
    pub retries: u32,
    /// The wait before the first retry; it doubles up to `retry_backoff_max`.
    pub retry_backoff_min: Duration,
    pub retry_backoff_max: Duration,
    /// What happens once the retries are spent.
    pub on_failure: FailureAction,
}

impl Default for ProjectionSettings {
    /// Save every 100 envelopes or 500 ms; 3 retries from 100 ms doubling to 5 s, then stop.
    fn default() -> Self {
        ProjectionSettings {
            save_after_envelopes: 100,
            save_interval: Duration::from_millis(500),
            retries: 3,
            retry_backoff_min: Duration::from_millis(100),
            retry_backoff_max: Duration::from_secs(5),
            on_failure: FailureAction::Stop,
        }
    }
}

/// A projection that cannot be registered, named.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidProjection {
    #[error("projection {name}: {problem}")]
    Setting { name: String, problem: String },
}

impl ProjectionSettings {
    /// The wait before retry `attempt` (1, 2, ...).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.saturating_sub(1));
        self.retry_backoff_min
            .saturating_mul(factor)
            .min(self.retry_backoff_max)
    }

    pub fn validate(&self, name: &str) -> Result<(), InvalidProjection> {
        let bad = |problem: &str| {
            Err(InvalidProjection::Setting {
                name: name.to_string(),
                problem: problem.to_string(),
            })
        };
        if self.save_after_envelopes == 0 {
            return bad("save_after_envelopes must be at least 1");
        }
        if self.save_interval.is_zero() {
            return bad("save_interval must be a positive duration");
        }
        if self.retry_backoff_min > self.retry_backoff_max {
            return bad("retry_backoff_min must not exceed retry_backoff_max");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_bound() {
        let settings = ProjectionSettings::default();
        assert_eq!(settings.backoff(1), Duration::from_millis(100));
        assert_eq!(settings.backoff(2), Duration::from_millis(200));
        assert_eq!(settings.backoff(7), Duration::from_secs(5));
        assert_eq!(settings.backoff(1_000), Duration::from_secs(5));
        assert!(settings.validate("p").is_ok());
        let zero = ProjectionSettings {
            save_after_envelopes: 0,
            ..settings
        };
        assert!(
            zero.validate("p")
                .unwrap_err()
                .to_string()
                .contains("save_after_envelopes")
        );
    }
}
