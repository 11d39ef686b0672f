//! The flags of `tessera soak` (clap derive).

use clap::Args;

pub const SOAK_AFTER_HELP: &str = "The nodes are this binary's `tessera node` processes, each \
in a network namespace of its own when run as root (so that the nemesis can partition them), \
else on 127.0.0.1 (partitions skipped, and the summary says why). Progress goes to stderr, the \
summary to stdout. Exit status: 0 no anomalies; 1 anomalies found (the node logs and the \
history are kept, and their directory printed); 2 bad usage; 3 the soak could not run (a node \
would not start, the cluster did not form).";

/// Flags of `tessera soak`.
#[derive(Debug, Args)]
pub struct SoakArgs {
    /// How long the workload and the nemesis run, in minutes (fractions allowed)
    #[arg(long, default_value_t = 10.0, value_parser = parse_minutes)]
    pub minutes: f64,
    /// Number of nodes (the nemesis impairs at most a minority of them at a time)
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(3..=9))]
    pub nodes: u16,
    /// Seed of the nemesis's and the clients' choices [default: random, printed]
    #[arg(long)]
    pub seed: Option<u64>,
    /// The nodes' stable_after: how long the split-brain resolver waits for a stable view
    /// (Akka's recommendation for up to 10 nodes); long pauses and partitions are drawn to
    /// outlast it, so that nodes get downed
    #[arg(long, value_name = "DURATION", default_value = "7s", value_parser = parse_stable_after)]
    pub stable_after: std::time::Duration,
    /// Print the summary as one JSON object
    #[arg(long)]
    pub json: bool,
    /// Keep the nodes' data and logs and the history also when no anomaly was found
    #[arg(long)]
    pub keep_dir: bool,
    /// Bound on every node's resident memory (VmRSS), in MiB
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_rss_mib: u64,
    /// Corrupt the evidence so that the checker must find an anomaly (a check of the checker)
    #[arg(long, hide = true, value_enum)]
    pub sabotage: Option<crate::Sabotage>,
}

/// A `stable_after` for the soak's nodes: 1 s to 1 min.
fn parse_stable_after(value: &str) -> Result<std::time::Duration, String> {
    let duration = humantime::parse_duration(value).map_err(|e| format!("{value:?}: {e}"))?;
    if (std::time::Duration::from_secs(1)..=std::time::Duration::from_secs(60)).contains(&duration)
    {
        Ok(duration)
    } else {
        Err(format!("{value}: expected 1s to 60s"))
    }
}

/// Minutes: a positive number, at most a week.
fn parse_minutes(value: &str) -> Result<f64, String> {
    let minutes: f64 = value
        .parse()
        .map_err(|_| format!("{value:?} is not a number of minutes"))?;
    if minutes.is_finite() && minutes > 0.0 && minutes <= 7.0 * 24.0 * 60.0 {
        Ok(minutes)
    } else {
        Err(format!(
            "{value} minutes: expected more than 0 and at most a week (10080)"
        ))
    }
}
