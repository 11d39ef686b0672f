//! The `tessera` binary. Until the node wiring lands, `node` validates and prints its
//! configuration, and `demo` / `bench` say they are not available yet.

use clap::Parser;
use std::process::ExitCode;
use tessera::cli::{Cli, Command};
use tessera::logging;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Node(args) => {
            let config = match args.to_config() {
                Ok(config) => config,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            if let Err(e) = logging::init(config.log_format, &config.log_level) {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
            for warning in config.warnings() {
                tracing::warn!("{warning}");
            }
            println!("{config:#?}");
            ExitCode::SUCCESS
        }
        Command::Demo(_) | Command::Bench(_) => {
            eprintln!("error: this subcommand is not implemented yet");
            ExitCode::FAILURE
        }
    }
}
