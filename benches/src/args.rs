//! The flags of `tessera bench ...` (clap derive), one set per benchmark.

use clap::{Args, Subcommand};
use std::path::PathBuf;

/// `tessera bench ...`.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Cluster formation and convergence at several sizes.
    Cluster(BenchClusterArgs),
    /// Journal write and replay throughput against raw RocksDB.
    Journal(BenchJournalArgs),
    /// Distributed Data latency, catch-up of a new node and idle gossip on 3 nodes.
    Ddata(BenchDdataArgs),
    /// Entity command throughput, recovery time and memory against the raw journal.
    Entities(BenchEntitiesArgs),
    /// Sharded asks against the entity host asked directly, and coordinator failover time.
    Sharding(BenchShardingArgs),
    /// Projections on 3 nodes while deposits go on, and a catch-up from offset zero, against
    /// the local journal's replay of the same events.
    Projections(BenchProjectionsArgs),
}

/// Flags of `tessera bench projections`.
#[derive(Debug, Args)]
pub struct BenchProjectionsArgs {
    /// Print results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// 3 s of deposits and a catch-up over 100,000 events (instead of 10 s and 1,000,000).
    #[arg(long)]
    pub quick: bool,
    /// Directory for the nodes' data (created, then removed) [default: a fresh directory in
    /// the system temp dir].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Flags of `tessera bench ddata`.
#[derive(Debug, Args)]
pub struct BenchDdataArgs {
    /// Print results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// A tenth of the keys and shorter phases, for a quick look.
    #[arg(long)]
    pub quick: bool,
}

/// Flags of `tessera bench cluster`.
#[derive(Debug, Args)]
pub struct BenchClusterArgs {
    /// Cluster sizes to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [3u16, 10, 25],
          value_parser = clap::value_parser!(u16).range(2..=1000))]
    pub nodes: Vec<u16>,
    /// Print results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `tessera bench journal`.
#[derive(Debug, Args)]
pub struct BenchJournalArgs {
    /// Print results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// A tenth of the data and one-second phases, for a quick look.
    #[arg(long)]
    pub quick: bool,
    /// Run only the append or only the replay workloads (with `--replicated`, the replay
    /// workloads are the replay and the recovery).
    #[arg(long, value_enum, value_name = "KIND")]
    pub only: Option<JournalWorkloadKind>,
    /// The replicated journal of a three-node cluster (loopback TCP, N = 3, W = 2) against the
    /// local journal, instead of the local journal against RocksDB.
    #[arg(long)]
    pub replicated: bool,
    /// Directory for the benchmark's databases (created, then removed) [default: a fresh
    /// directory in the system temp dir]. Put it on the disk you want to measure.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// The two kinds of workload of `tessera bench journal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum JournalWorkloadKind {
    /// `append-*`: concurrent appends with fsync.
    Append,
    /// `replay-*`: replays of one log and of many.
    Replay,
}

/// Flags of `tessera bench entities`.
#[derive(Debug, Args)]
pub struct BenchEntitiesArgs {
    /// Print results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// A tenth of the sizes and short phases, for a quick look.
    #[arg(long)]
    pub quick: bool,
    /// Directory for the benchmark's databases (created, then removed) [default: a fresh
    /// directory in the system temp dir]. Put it on the disk you want to measure.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Flags of `tessera bench sharding`.
#[derive(Debug, Args)]
pub struct BenchShardingArgs {
    /// Print results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Shorter phases and the failover with Distributed Data only, for a quick look.
    #[arg(long)]
    pub quick: bool,
    /// Run only these workloads, comma-separated (each ask workload on one node and on two)
    /// [default: all].
    #[arg(long, value_enum, value_delimiter = ',', value_name = "WORKLOAD")]
    pub only: Vec<ShardingWorkloadKind>,
    /// Directory for the nodes' data (created, then removed) [default: a fresh directory in
    /// the system temp dir]. Put it on the disk you want to measure.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// The workloads of `tessera bench sharding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ShardingWorkloadKind {
    /// `query-*`: asks that persist nothing.
    Query,
    /// `persist-always-*`: deposits, the journal fsyncing every write.
    PersistAlways,
    /// `persist-never-*`: deposits, the journal never fsyncing.
    PersistNever,
    /// `failover-*`: the coordinator's node killed.
    Failover,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `bench` and its subcommand, as the binary parses it.
    #[derive(Debug, Parser)]
    struct Bench {
        #[command(subcommand)]
        command: BenchCommand,
    }

    fn bench(args: &[&str]) -> BenchCommand {
        Bench::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
            .unwrap()
            .command
    }

    #[test]
    fn bench_cluster_sizes_and_json() {
        match bench(&["cluster"]) {
            BenchCommand::Cluster(a) => {
                assert_eq!(a.nodes, vec![3, 10, 25]);
                assert!(!a.json);
            }
            other => panic!("{other:?}"),
        }
        match bench(&["cluster", "--nodes", "5,50", "--json"]) {
            BenchCommand::Cluster(a) => {
                assert_eq!(a.nodes, vec![5, 50]);
                assert!(a.json);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bench_journal_flags() {
        match bench(&["journal", "--json", "--quick"]) {
            BenchCommand::Journal(a) => {
                assert!(a.json && a.quick && a.only.is_none())
            }
            other => panic!("{other:?}"),
        }
        match bench(&["journal", "--only", "replay"]) {
            BenchCommand::Journal(a) => {
                assert_eq!(a.only, Some(JournalWorkloadKind::Replay))
            }
            other => panic!("{other:?}"),
        }
        match bench(&["journal", "--replicated", "--quick"]) {
            BenchCommand::Journal(a) => assert!(a.replicated && a.quick),
            other => panic!("{other:?}"),
        }
        match bench(&["journal", "--replicated", "--only", "append"]) {
            BenchCommand::Journal(a) => {
                assert!(a.replicated);
                assert_eq!(a.only, Some(JournalWorkloadKind::Append));
            }
            other => panic!("{other:?}"),
        }
        assert!(Bench::try_parse_from(["bench", "journal", "--only", "scan"]).is_err());
        assert!(Bench::try_parse_from(["bench"]).is_err());
    }

    #[test]
    fn bench_entities_flags() {
        match bench(&["entities", "--quick", "--dir", "/tmp/b"]) {
            BenchCommand::Entities(a) => {
                assert!(a.quick && !a.json);
                assert_eq!(a.dir, Some(PathBuf::from("/tmp/b")));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bench_sharding_only_takes_a_list_of_workloads() {
        match bench(&["sharding", "--only", "persist-never,failover"]) {
            BenchCommand::Sharding(a) => assert_eq!(
                a.only,
                [
                    ShardingWorkloadKind::PersistNever,
                    ShardingWorkloadKind::Failover
                ]
            ),
            other => panic!("{other:?}"),
        }
        match bench(&["sharding"]) {
            BenchCommand::Sharding(a) => assert!(a.only.is_empty()),
            other => panic!("{other:?}"),
        }
        assert!(Bench::try_parse_from(["bench", "sharding", "--only", "persist"]).is_err());
    }
}
