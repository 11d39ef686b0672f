//! Settings of a sharded daemon process, and the check of its name and count.

use std::time::Duration;

/// A daemon that cannot be registered: its name, its count or a setting, named.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidDaemon {
    #[error(
        "daemon name {name:?}: {reason} (a name is 1 to {MAX_NAME_BYTES} bytes of ASCII \
         letters, digits, '-', '_' and '.')"
    )]
    Name { name: String, reason: &'static str },
    #[error("daemon {name}: count {count} is out of range (1 to {MAX_COUNT})")]
    Count { name: String, count: u32 },
    #[error("daemon {name}: {setting} must be a positive duration")]
    Setting { name: String, setting: &'static str },
}

/// The longest daemon name: the name of its sharded type (`daemon.` and the name) stays
/// within an entity type name's 64 bytes.
pub const MAX_NAME_BYTES: usize = 57;

/// The most instances a daemon may have: the shards of its sharded type, so that each
/// instance has a shard of its own (and allocation balances instances).
pub const MAX_COUNT: u32 = 1_000;

/// How a daemon's instances are kept running.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonSettings {
    /// Every node asks each instance this often; an instance that is not running is started
    /// by the ask (so this is also how soon one that ended is started again). Akka: 10 s.
    pub keep_alive_interval: Duration,
    /// An instance told to stop (a handoff, a new count, the node stopping) has this long to
    /// return before its task is aborted.
    pub stop_timeout: Duration,
    /// Only members with this role run the instances.
    pub role: Option<String>,
}

impl Default for DaemonSettings {
    /// A keep-alive every second (an instance ended or moved off a removed node is started
    /// again within about a second of its shard's new home being known); 10 s to stop.
    fn default() -> Self {
        DaemonSettings {
            keep_alive_interval: Duration::from_secs(1),
            stop_timeout: Duration::from_secs(10),
            role: None,
        }
    }
}

impl DaemonSettings {
    /// Checks a daemon's name, count and these settings.
    pub fn validate(&self, name: &str, count: u32) -> Result<(), InvalidDaemon> {
        validate_name(name)?;
        validate_count(name, count)?;
        for (setting, value) in [
            ("keep_alive_interval", self.keep_alive_interval),
            ("stop_timeout", self.stop_timeout),
        ] {
            if value.is_zero() {
                return Err(InvalidDaemon::Setting {
                    name: name.to_string(),
                    setting,
                });
            }
        }
        Ok(())
    }
}

/// Checks a daemon's name.
pub fn validate_name(name: &str) -> Result<(), InvalidDaemon> {
    let bad = |reason| {
        Err(InvalidDaemon::Name {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > MAX_NAME_BYTES {
        return bad("too long");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return bad("a character that is not allowed");
    }
    Ok(())
}

/// Checks a daemon's number of instances.
pub fn validate_count(name: &str, count: u32) -> Result<(), InvalidDaemon> {
    if count == 0 || count > MAX_COUNT {
        return Err(InvalidDaemon::Count {
            name: name.to_string(),
            count,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_counts_and_settings_are_checked() {
        let settings = DaemonSettings::default();
        assert!(settings.validate("indexer", 4).is_ok());
        assert!(settings.validate("", 4).is_err());
        assert!(settings.validate("a b", 4).is_err());
        assert!(
            settings
                .validate(&"x".repeat(MAX_NAME_BYTES + 1), 4)
                .is_err()
        );
        // The longest name still makes an entity type name.
        let longest = crate::type_name_of(&"x".repeat(MAX_NAME_BYTES));
        assert!(tessera_entities::id::validate_type_name(&longest).is_ok());
        assert!(matches!(
            settings.validate("indexer", 0),
            Err(InvalidDaemon::Count { count: 0, .. })
        ));
        assert!(settings.validate("indexer", MAX_COUNT + 1).is_err());
        let zero = DaemonSettings {
            stop_timeout: Duration::ZERO,
            ..DaemonSettings::default()
        };
        assert!(matches!(
            zero.validate("indexer", 1),
            Err(InvalidDaemon::Setting {
                setting: "stop_timeout",
                ..
            })
        ));
    }
}
