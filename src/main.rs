//! The `tessera` binary: the operator's command line of a service whose one entity type is the
//! `account` example, with its read models in PostgreSQL when one is configured (`node` runs a
//! cluster node, `sharding` maintains a stopped node's sharding data, and the client commands
//! `members`, `join`, `leave`, `down`, `shards`, `ddata`, `entity` and `projections` talk to a
//! running node), and the project's own tools: `demo` the main job, `soak` the nemesis soak,
//! `bench` the benchmarks.

mod cli;

use clap::Parser;
use cli::{ToolCli, ToolCommand as Command};
use std::process::ExitCode;
use tessera::NodeBuilder;
use tessera::logging::{self, LogFormat};
use tessera_benches::args::BenchCommand;
use tessera_example_account::Account;

/// The `tessera` binary's service: the `account` example entity type, registered the way any
/// service registers its types, and its projections into PostgreSQL when
/// `ACCOUNT_PROJECTIONS_POSTGRES` names a database.
fn service() -> Result<NodeBuilder, String> {
    tessera_example_account::projections::register(NodeBuilder::new().entity(Account))
}

fn main() -> ExitCode {
    let cli = ToolCli::parse();
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

async fn run(cli: ToolCli) -> ExitCode {
    match cli.command {
        Command::Operator(command) => match service() {
            Ok(service) => tessera::cli::run(service, command).await,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        },
        Command::Demo(args) => {
            let _ = logging::init(LogFormat::Text, "warn");
            match tessera_harness::demo::run(args.nodes).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: demo failed: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Soak(args) => {
            let _ = logging::init(LogFormat::Text, "warn");
            let options = tessera_soak::SoakOptions {
                minutes: args.minutes,
                nodes: usize::from(args.nodes),
                seed: args.seed.unwrap_or_else(rand::random),
                stable_after: args.stable_after,
                keep_dir: args.keep_dir,
                max_rss_bytes: args.max_rss_mib.saturating_mul(1024 * 1024),
                sabotage: args.sabotage,
            };
            match tessera_soak::run(options).await {
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
                        ExitCode::from(tessera_soak::EXIT_ANOMALIES)
                    }
                }
                Err(e) => {
                    eprintln!("error: the soak could not run: {e}");
                    ExitCode::from(tessera_soak::EXIT_HARNESS_FAILURE)
                }
            }
        }
        Command::Bench(BenchCommand::Cluster(args)) => {
            let _ = logging::init(LogFormat::Text, "warn");
            match tessera_benches::cluster::run(&args.nodes, args.json).await {
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
                tessera_benches::ddata::DdataBenchParams::quick()
            } else {
                tessera_benches::ddata::DdataBenchParams::full()
            };
            match tessera_benches::ddata::run(params, args.json).await {
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
                    tessera_benches::replicated::ReplicatedBenchParams::quick(dir)
                } else {
                    tessera_benches::replicated::ReplicatedBenchParams::full(dir)
                };
                params.keep_only(args.only);
                return match tessera_benches::replicated::run(params, args.json).await {
                    Ok(_) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("error: bench journal --replicated failed: {e}");
                        ExitCode::FAILURE
                    }
                };
            }
            let mut params = if args.quick {
                tessera_benches::journal::JournalBenchParams::quick(dir)
            } else {
                tessera_benches::journal::JournalBenchParams::full(dir)
            };
            match args.only {
                Some(tessera_benches::args::JournalWorkloadKind::Append) => {
                    params.replay_events = 0
                }
                Some(tessera_benches::args::JournalWorkloadKind::Replay) => {
                    params.append_ids.clear()
                }
                None => {}
            }
            match tessera_benches::journal::run(params, args.json).await {
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
                tessera_benches::entities::EntitiesBenchParams::quick(dir)
            } else {
                tessera_benches::entities::EntitiesBenchParams::full(dir)
            };
            match tessera_benches::entities::run(params, args.json).await {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: bench entities failed: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Bench(BenchCommand::Projections(args)) => {
            let _ = logging::init(LogFormat::Text, "warn");
            let dir = args.dir.unwrap_or_else(|| {
                std::env::temp_dir()
                    .join(format!("tessera-bench-projections-{}", std::process::id()))
            });
            let params = if args.quick {
                tessera_benches::projections::ProjectionsBenchParams::quick(dir)
            } else {
                tessera_benches::projections::ProjectionsBenchParams::full(dir)
            };
            match tessera_benches::projections::run(params, args.json).await {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: bench projections failed: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Bench(BenchCommand::Sharding(args)) => {
            let _ = logging::init(LogFormat::Text, "warn");
            let dir = args.dir.unwrap_or_else(|| {
                std::env::temp_dir().join(format!("tessera-bench-sharding-{}", std::process::id()))
            });
            let mut params = if args.quick {
                tessera_benches::sharding::ShardingBenchParams::quick(dir)
            } else {
                tessera_benches::sharding::ShardingBenchParams::full(dir)
            };
            if !args.only.is_empty() {
                params.only(&args.only);
            }
            match tessera_benches::sharding::run(params, args.json).await {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: bench sharding failed: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
