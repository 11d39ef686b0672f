//! Logging setup: `tracing` events to stderr, as human-readable text or one JSON object per line.
//!
//! The level comes from the configuration (`log_level`); a non-empty `RUST_LOG` overrides it, so
//! an operator can turn on `debug` for one module without editing the config file.

use std::fmt;
use std::str::FromStr;
use tracing_subscriber::EnvFilter;

/// How log lines are written: `text` for people, `json` for log shippers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per event.
    Json,
}

impl LogFormat {
    /// The name used in the config file, flags and environment (`text`, `json`).
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that is neither `text` nor `json`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown log format {0:?}: expected text or json")]
pub struct UnknownLogFormat(pub String);

impl FromStr for LogFormat {
    type Err = UnknownLogFormat;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(UnknownLogFormat(other.to_string())),
        }
    }
}

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// The level or filter (from `log_level` or `RUST_LOG`) does not parse.
    #[error("invalid value {value:?} for {source_name}: {reason}")]
    InvalidFilter {
        /// Where the filter came from: `log_level` or `RUST_LOG`.
        source_name: &'static str,
        /// The filter as given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A global subscriber was installed earlier in this process.
    #[error("logging is already initialised in this process")]
    AlreadyInitialized,
}

/// The level names accepted on their own as a filter.
const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// Checks a `log_level` value: a level name (`info`) or a tracing filter (`tessera=debug,info`).
///
/// A bare word that is not a level is refused even though tracing would read it as a target
/// name: `log_level = "verbose"` is a typo far more often than a module called `verbose`.
pub fn parse_filter(level: &str) -> Result<EnvFilter, String> {
    const EXPECTED: &str = "expected a level (trace, debug, info, warn, error, off) or a filter like tessera=debug,info";
    let level = level.trim();
    let is_directive_list = level.contains(['=', ',', '[', ':']);
    if level.is_empty()
        || (!is_directive_list && !LEVELS.contains(&level.to_ascii_lowercase().as_str()))
    {
        return Err(EXPECTED.into());
    }
    EnvFilter::builder()
        .parse(level)
        .map_err(|e| format!("not a valid tracing filter: {e}"))
}

/// The filter in force: `RUST_LOG` when it is set and non-empty, else the configured level.
fn effective_filter(level: &str, rust_log: Option<&str>) -> Result<EnvFilter, LoggingError> {
    match rust_log.map(str::trim).filter(|s| !s.is_empty()) {
        Some(env) => EnvFilter::builder()
            .parse(env)
            .map_err(|e| LoggingError::InvalidFilter {
                source_name: "RUST_LOG",
                value: env.to_string(),
                reason: e.to_string(),
            }),
        None => parse_filter(level).map_err(|reason| LoggingError::InvalidFilter {
            source_name: "log_level",
            value: level.to_string(),
            reason,
        }),
    }
}

/// Installs the global tracing subscriber writing to stderr. Call once, early in `main`.
pub fn init(format: LogFormat, level: &str) -> Result<(), LoggingError> {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = effective_filter(level, rust_log.as_deref())?;
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    installed.map_err(|_| LoggingError::AlreadyInitialized)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_format_round_trips_through_its_name() {
        for format in [LogFormat::Text, LogFormat::Json] {
            assert_eq!(format.as_str().parse::<LogFormat>().unwrap(), format);
        }
        let err = "xml".parse::<LogFormat>().unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"unknown log format "xml": expected text or json"#
        );
    }

    #[test]
    fn level_names_and_filters_are_accepted() {
        for ok in [
            "info",
            "DEBUG",
            "off",
            "tessera=debug,info",
            "tessera_cluster=trace",
        ] {
            assert!(parse_filter(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn bare_words_that_are_not_levels_are_refused() {
        for bad in ["", "verbose", "loud"] {
            assert!(parse_filter(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rust_log_overrides_the_configured_level() {
        // An invalid configured level does not matter when RUST_LOG is set.
        assert!(effective_filter("verbose", Some("debug")).is_ok());
        let err = effective_filter("verbose", None).unwrap_err();
        assert!(err.to_string().contains("log_level"), "{err}");
        // An empty RUST_LOG counts as unset.
        assert!(effective_filter("info", Some("  ")).is_ok());
    }

    #[test]
    fn init_installs_once_then_reports_already_initialized() {
        // The only test in this binary that installs a global subscriber.
        let first = init(LogFormat::Json, "warn");
        assert!(first.is_ok() || matches!(first, Err(LoggingError::AlreadyInitialized)));
        assert!(matches!(
            init(LogFormat::Text, "info"),
            Err(LoggingError::AlreadyInitialized)
        ));
    }
}
