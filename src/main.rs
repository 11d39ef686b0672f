//! The `tessera` binary: `node` runs a cluster node, `demo` the main job, `soak` the nemesis
//! soak, `bench` benchmarks, `sharding` maintenance of a stopped node's sharding data, and the
//! client commands (`members`, `join`, `leave`, `down`, `shards`, `ddata`, `entity`) talk to a
//! running node.

use clap::Parser;
use std::process::ExitCode;
use tessera::cli::{BenchCommand, Cli, Command, ShardingCommand};
use tessera::logging::{self, LogFormat};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(cli))
}

/// Runs a client command against a node: its output on stdout, or the error on stderr with
/// the exit code that names what failed.
async fn run_client(command: &Command) -> ExitCode {
    let Some((client_command, args)) = command.client() else {
        eprintln!("error: not a client command");
        return ExitCode::from(2);
    };
    match tessera::client::run(&client_command, &args.options()).await {
        Ok(output) => {
            println!("{output}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

async fn run(cli: Cli) -> ExitCode {
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
            ExitCode::from(tessera::node::run(config).await)
        }
        Command::Demo(args) => {
            let _ = logging::init(LogFormat::Text, "warn");
            match tessera::demo::run(args.nodes).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: demo failed: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Soak(args) => {
            let _ = logging::init(LogFormat::Text, "warn");
            let options = tessera::soak::SoakOptions {
                minutes: args.minutes,
                nodes: usize::from(args.nodes),
                seed: args.seed.unwrap_or_else(rand::random),
                stable_after: args.stable_after,
                keep_dir: args.keep_dir,
                max_rss_bytes: args.max_rss_mib.saturating_mul(1024 * 1024),
                sabotage: args.sabotage,
            };
            match tessera::soak::run(options).await {
                Ok(summary) => {
                    if args.json {
                        match serde_json::to_string(&summary) {
                            Ok(json) => println!("{json}"),
                            Err(e) => eprintln!("error: cannot encode the summary: {e}"),
                        }
                    } else {
                        print!("{}", summary.text());
                    }
                    if summary.valid {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(tessera::soak::EXIT_ANOMALIES)
                    }
                }
                Err(e) => {
                    eprintln!("error: the soak could not run: {e}");
                    ExitCode::from(tessera::soak::EXIT_HARNESS_FAILURE)
                }
            }
        }
        Command::Sharding(ShardingCommand::RemoveInternalData(args)) => {
            let report = |removal: &tessera::sharding_tool::TypeRemoval| {
                println!("{}", removal.describe());
            };
            match tessera::sharding_tool::remove_internal_data(&args.data_dir, &args.types, report)
                .await
            {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Bench(BenchCommand::Cluster(args)) => {
            let _ = logging::init(LogFormat::Text, "warn");
            match tessera::bench::cluster::run(&args.nodes, args.json).await {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: bench cluster failed: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Bench(BenchCommand::Ddata(args)) => {
            let _ = logging::init(LogFormat::Text, "warn");
            let params = if args.quick {
                tessera::bench::ddata::DdataBenchParams::quick()
            } else {
                tessera::bench::ddata::DdataBenchParams::full()
            };
            match tessera::bench::ddata::run(params, args.json).await {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: bench ddata failed: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Bench(BenchCommand::Journal(args)) => {
            let _ = logging::init(LogFormat::Text, "warn");
            let dir = args.dir.unwrap_or_else(|| {
                std::env::temp_dir().join(format!("tessera-bench-journal-{}", std::process::id()))
            });
            if args.replicated {
                let mut params = if args.quick {
                    tessera::bench::replicated::ReplicatedBenchParams::quick(dir)
                } else {
                    tessera::bench::replicated::ReplicatedBenchParams::full(dir)
                };
                params.keep_only(args.only);
                return match tessera::bench::replicated::run(params, args.json).await {
                    Ok(_) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("error: bench journal --replicated failed: {e}");
                        ExitCode::FAILURE
                    }
                };
            }
            let mut params = if args.quick {
                tessera::bench::journal::JournalBenchParams::quick(dir)
            } else {
                tessera::bench::journal::JournalBenchParams::full(dir)
            };
            match args.only {
                Some(tessera::cli::JournalWorkloadKind::Append) => params.replay_events = 0,
                Some(tessera::cli::JournalWorkloadKind::Replay) => params.append_ids.clear(),
                None => {}
            }
            match tessera::bench::journal::run(params, args.json).await {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: bench journal failed: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Bench(BenchCommand::Entities(args)) => {
            let _ = logging::init(LogFormat::Text, "warn");
            let dir = args.dir.unwrap_or_else(|| {
                std::env::temp_dir().join(format!("tessera-bench-entities-{}", std::process::id()))
            });
            let params = if args.quick {
                tessera::bench::entities::EntitiesBenchParams::quick(dir)
            } else {
                tessera::bench::entities::EntitiesBenchParams::full(dir)
            };
            match tessera::bench::entities::run(params, args.json).await {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: bench entities failed: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        client @ (Command::Members(_)
        | Command::Join(_)
        | Command::Leave(_)
        | Command::Down(_)
        | Command::Shards(_)
        | Command::Ddata(_)
        | Command::Entity(_)) => run_client(&client).await,
        Command::Bench(BenchCommand::Sharding(args)) => {
            let _ = logging::init(LogFormat::Text, "warn");
            let dir = args.dir.unwrap_or_else(|| {
                std::env::temp_dir().join(format!("tessera-bench-sharding-{}", std::process::id()))
            });
            let mut params = if args.quick {
                tessera::bench::sharding::ShardingBenchParams::quick(dir)
            } else {
                tessera::bench::sharding::ShardingBenchParams::full(dir)
            };
            if !args.only.is_empty() {
                params.only(&args.only);
            }
            match tessera::bench::sharding::run(params, args.json).await {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: bench sharding failed: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
