//! The `tessera` binary's command line (clap derive): the operator's commands of the library
//! ([`tessera::cli::Command`]) and the project's own tools.

use clap::{Args, Parser, Subcommand};

/// The `tessera` binary's command line: the operator's commands with the `account` example
/// registered, and the project's own tools (the demo, the soak, the benchmarks).
#[derive(Debug, Parser)]
#[command(name = "tessera", version, about, propagate_version = true)]
pub struct ToolCli {
    /// What to run.
    #[command(subcommand)]
    pub command: ToolCommand,
}

/// The `tessera` binary's subcommands.
#[derive(Debug, Subcommand)]
pub enum ToolCommand {
    #[command(flatten)]
    Operator(tessera::cli::Command),
    /// Start a small local cluster and show it working.
    Demo(DemoArgs),
    /// Run a cluster of real nodes under a mixed workload and a nemesis (kills, pauses,
    /// restarts, partitions), then check the history for lost or doubled writes.
    #[command(after_help = tessera_soak::args::SOAK_AFTER_HELP)]
    Soak(tessera_soak::args::SoakArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(tessera_benches::args::BenchCommand),
}

/// Flags of `tessera demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Number of nodes to start.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(2..=100))]
    pub nodes: u16,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn tool(args: &[&str]) -> ToolCli {
        ToolCli::try_parse_from(std::iter::once("tessera").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn cli_definition_is_consistent() {
        ToolCli::command().debug_assert();
    }

    #[test]
    fn the_operators_commands_are_the_binarys() {
        assert!(matches!(
            tool(&["members"]).command,
            ToolCommand::Operator(tessera::cli::Command::Members(_))
        ));
    }

    #[test]
    fn demo_nodes_defaults_to_three() {
        assert!(matches!(
            tool(&["demo"]).command,
            ToolCommand::Demo(DemoArgs { nodes: 3 })
        ));
        assert!(matches!(
            tool(&["demo", "--nodes", "5"]).command,
            ToolCommand::Demo(DemoArgs { nodes: 5 })
        ));
        assert!(ToolCli::try_parse_from(["tessera", "demo", "--nodes", "0"]).is_err());
    }
}
