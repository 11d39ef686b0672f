//! Settings of one cluster singleton and its proxies, with Akka's defaults.

use std::time::Duration;

/// How a singleton hands over, how long its successor waits for a vanished node, and how its
/// proxies buffer. [`SingletonSettings::validate`] names the first bad field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SingletonSettings {
    /// The singleton runs only on members with this role (None: on any member).
    pub role: Option<String>,
    /// How often the new oldest asks its predecessors `HandOverToMe` until they answer
    /// `HandOverDone` (Akka's `hand-over-retry-interval`).
    pub hand_over_retry_interval: Duration,
    /// Extra wait after a predecessor was removed from membership before the new oldest starts,
    /// for a downed node that is still stopping its instance. Set it to the split-brain
    /// resolver's `stable_after` when nodes may be downed while alive (Akka's
    /// `removal-margin`, defaulting to `down-removal-margin`).
    pub removal_margin: Duration,
    /// A predecessor that left without being seen Down and was removed without answering
    /// `HandOverDone` is waited for `hand_over_retry_interval × min_hand_over_retries` after
    /// its removal (and after its last `HandOverInProgress`), since it may be alive and still
    /// stopping its instance (Akka's `min-number-of-hand-over-retries`).
    pub min_hand_over_retries: u32,
    /// Requests a proxy holds while no instance can be reached; a full buffer refuses new ones.
    pub proxy_buffer_capacity: usize,
    /// How long a proxy waits for the instance's answer to one request.
    pub proxy_request_timeout: Duration,
    /// How soon a proxy tries again after the node it believed to host the instance said it
    /// does not (membership changes make it try at once).
    pub proxy_retry_interval: Duration,
    /// Requests queued for the running instance; when full, requests are refused with
    /// `Overloaded` rather than queued without bound.
    pub instance_queue_capacity: usize,
}

impl Default for SingletonSettings {
    fn default() -> Self {
        Self {
            role: None,
            hand_over_retry_interval: Duration::from_secs(1),
            removal_margin: Duration::ZERO,
            min_hand_over_retries: 15,
            proxy_buffer_capacity: 1000,
            proxy_request_timeout: Duration::from_secs(5),
            proxy_retry_interval: Duration::from_millis(200),
            instance_queue_capacity: 1000,
        }
    }
}

/// A setting outside its allowed range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SingletonSettingsError {
    #[error("hand_over_retry_interval is {value:?} (expected more than 0)")]
    ZeroHandOverRetryInterval { value: Duration },
    #[error("min_hand_over_retries is 0 (expected at least 1)")]
    ZeroMinHandOverRetries,
    #[error("proxy_buffer_capacity is 0 (expected at least 1)")]
    ZeroProxyBufferCapacity,
    #[error("proxy_request_timeout is {value:?} (expected more than 0)")]
    ZeroProxyRequestTimeout { value: Duration },
    #[error("proxy_retry_interval is {value:?} (expected more than 0)")]
    ZeroProxyRetryInterval { value: Duration },
    #[error("instance_queue_capacity is 0 (expected at least 1)")]
    ZeroInstanceQueueCapacity,
    #[error("role is an empty string (expected None or a role name)")]
    EmptyRole,
    #[error("singleton name is {name:?} (expected 1..={max_bytes} bytes)")]
    InvalidName { name: String, max_bytes: usize },
}

/// Longest singleton name; names travel in every message.
pub const SINGLETON_NAME_MAX_BYTES: usize = 128;

impl SingletonSettings {
    /// Checks every field, naming the first one out of range.
    pub fn validate(&self) -> Result<(), SingletonSettingsError> {
        use SingletonSettingsError as E;
        if self.hand_over_retry_interval.is_zero() {
            return Err(E::ZeroHandOverRetryInterval {
                value: self.hand_over_retry_interval,
            });
        }
        if self.min_hand_over_retries == 0 {
            return Err(E::ZeroMinHandOverRetries);
        }
        if self.proxy_buffer_capacity == 0 {
            return Err(E::ZeroProxyBufferCapacity);
        }
        if self.proxy_request_timeout.is_zero() {
            return Err(E::ZeroProxyRequestTimeout {
                value: self.proxy_request_timeout,
            });
        }
        if self.proxy_retry_interval.is_zero() {
            return Err(E::ZeroProxyRetryInterval {
                value: self.proxy_retry_interval,
            });
        }
        if self.instance_queue_capacity == 0 {
            return Err(E::ZeroInstanceQueueCapacity);
        }
        if self.role.as_deref() == Some("") {
            return Err(E::EmptyRole);
        }
        Ok(())
    }

    /// How long a predecessor that was never seen Down stays unanswered after its removal (or
    /// its last `HandOverInProgress`) before the new oldest stops waiting for it.
    pub fn hand_over_silence(&self) -> Duration {
        self.hand_over_retry_interval
            .saturating_mul(self.min_hand_over_retries)
    }
}

/// Checks a singleton's name: it must be non-empty and at most [`SINGLETON_NAME_MAX_BYTES`].
pub fn validate_name(name: &str) -> Result<(), SingletonSettingsError> {
    if name.is_empty() || name.len() > SINGLETON_NAME_MAX_BYTES {
        return Err(SingletonSettingsError::InvalidName {
            name: name.chars().take(SINGLETON_NAME_MAX_BYTES).collect(),
            max_bytes: SINGLETON_NAME_MAX_BYTES,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_akkas_and_valid() {
        let s = SingletonSettings::default();
        assert_eq!(s.hand_over_retry_interval, Duration::from_secs(1));
        assert_eq!(s.removal_margin, Duration::ZERO);
        assert_eq!(s.proxy_buffer_capacity, 1000);
        assert_eq!(s.role, None);
        assert_eq!(s.validate(), Ok(()));
    }

    #[test]
    fn each_bad_field_is_named() {
        let bad = [
            SingletonSettings {
                hand_over_retry_interval: Duration::ZERO,
                ..Default::default()
            },
            SingletonSettings {
                min_hand_over_retries: 0,
                ..Default::default()
            },
            SingletonSettings {
                proxy_buffer_capacity: 0,
                ..Default::default()
            },
            SingletonSettings {
                proxy_request_timeout: Duration::ZERO,
                ..Default::default()
            },
            SingletonSettings {
                proxy_retry_interval: Duration::ZERO,
                ..Default::default()
            },
            SingletonSettings {
                instance_queue_capacity: 0,
                ..Default::default()
            },
            SingletonSettings {
                role: Some(String::new()),
                ..Default::default()
            },
        ];
        let names = [
            "hand_over_retry_interval",
            "min_hand_over_retries",
            "proxy_buffer_capacity",
            "proxy_request_timeout",
            "proxy_retry_interval",
            "instance_queue_capacity",
            "role",
        ];
        for (settings, name) in bad.iter().zip(names) {
            let error = settings.validate().expect_err(name);
            assert!(error.to_string().contains(name), "{error} names {name}");
        }
    }

    #[test]
    fn names_must_be_short_and_non_empty() {
        assert!(validate_name("coordinator").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name(&"x".repeat(SINGLETON_NAME_MAX_BYTES + 1)).is_err());
    }
}
