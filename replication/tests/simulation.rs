//! The replicated log's safety under faults: every scenario of docs/src/design.md §5 over many
//! seeds (1,000 by default; `TESSERA_SIM_SEEDS` for more or fewer), each run checked for
//! every rule of §5 "Checks". Sabotaged runs show that the checks catch a replica that takes
//! writes from a fenced writer, promises without fencing, or lets a repeated seal truncate
//! again, and a writer that creates a log again on a node restarted alone.

#[path = "simulation/committed_reader.rs"]
mod committed_reader;
#[path = "simulation/fenced_appends.rs"]
mod fenced_appends;

use std::time::Duration;
use tessera_replication::replica::Sabotage;
use tessera_replication::sim::{FaultKind, FencedAppends, Scenario, Simulation, Stats};

fn seeds() -> u64 {
    std::env::var("TESSERA_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000)
}

fn base(name: &'static str) -> Scenario {
    Scenario {
        name,
        nodes: 3,
        latency_ms: (1, 8),
        duration: Duration::from_secs(4),
        append_interval: Duration::from_millis(40),
        ..Scenario::default()
    }
}

/// Runs `scenario` over the seeds; fails with the first violations found. Returns the summed
/// counters so that a test can check the scenario did what it says.
fn run(scenario: Scenario) -> Stats {
    let mut total = Stats::default();
    let mut violations = Vec::new();
    for seed in 0..seeds() {
        let mut sim = Simulation::new(scenario.clone(), seed);
        sim.run();
        violations.extend(sim.check());
        let s = &sim.stats;
        total.acknowledged += s.acknowledged;
        total.not_applied += s.not_applied;
        total.unknown += s.unknown;
        total.recoveries += s.recoveries;
        total.fenced += s.fenced;
        total.messages += s.messages;
        total.dropped += s.dropped;
        total.reconfigurations += s.reconfigurations;
        total.final_config_version += s.final_config_version;
        total.reads_from_lease += s.reads_from_lease;
        total.prepares_held_off += s.prepares_held_off;
        total.creations_held += s.creations_held;
        total.stores_forgotten += s.stores_forgotten;
        total.taken_over += s.taken_over;
        total.writer_reconfigurations += s.writer_reconfigurations;
        total.fenced_after_reconfiguration += s.fenced_after_reconfiguration;
        if violations.len() > 20 {
            break;
        }
    }
    assert!(
        violations.is_empty(),
        "{}: {} violations, first ones:\n{}",
        scenario.name,
        violations.len(),
        violations
            .iter()
            .take(20)
            .map(|v| v.0.clone())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        total.acknowledged > 0,
        "{}: nothing was acknowledged",
        scenario.name
    );
    eprintln!("{}: {total:?}", scenario.name);
    total
}

#[test]
fn writer_crashes_lose_no_acknowledged_value() {
    let stats = run(Scenario {
        faults: vec![FaultKind::CrashWriter, FaultKind::CrashWriter],
        ..base("writer crash")
    });
    assert!(stats.unknown > 0, "{stats:?}");
}

#[test]
fn replica_crash_and_restart() {
    run(Scenario {
        faults: vec![FaultKind::CrashReplica, FaultKind::CrashReplica],
        ..base("replica crash and restart")
    });
}

#[test]
fn a_replica_that_lost_its_disk_is_replaced_not_trusted() {
    run(Scenario {
        faults: vec![FaultKind::WipeReplica],
        delete_probability: 0.05,
        ..base("replica lost its disk")
    });
}

#[test]
fn a_lone_writer_brings_restarted_and_lagging_replicas_up_to_date() {
    run(Scenario {
        writers: vec![0],
        faults: vec![
            FaultKind::CrashReplica,
            FaultKind::CrashReplica,
            FaultKind::PartitionOneFromRest,
        ],
        latency_ms: (1, 20),
        drop_probability: 0.02,
        check_caught_up: true,
        ..base("one writer, replicas crash")
    });
}

#[test]
fn message_loss_duplication_and_reordering() {
    let stats = run(Scenario {
        latency_ms: (1, 40),
        drop_probability: 0.05,
        duplicate_probability: 0.05,
        ..base("message loss, duplication, reordering")
    });
    assert!(stats.dropped > 0);
}

#[test]
fn two_against_one_partitions() {
    let stats = run(Scenario {
        faults: vec![
            FaultKind::PartitionOneFromRest,
            FaultKind::PartitionOneFromRest,
        ],
        ..base("2|1 partitions")
    });
    assert!(stats.fenced > 0, "{stats:?}");
}

#[test]
fn one_one_one_partitions() {
    run(Scenario {
        faults: vec![FaultKind::PartitionAll],
        ..base("1|1|1 partition")
    });
}

#[test]
fn a_paused_writer_that_resumes_after_another_took_over_is_fenced() {
    let stats = run(Scenario {
        faults: vec![FaultKind::Pause, FaultKind::Pause],
        ..base("paused writer")
    });
    assert!(stats.fenced > 0, "{stats:?}");
}

#[test]
fn a_writer_cut_off_confirms_reads_only_within_its_lease() {
    let stats = run(Scenario {
        faults: vec![FaultKind::PartitionOneFromRest, FaultKind::Pause],
        mostly_reads: true,
        ..base("reads from leases, partitions and pauses")
    });
    assert!(stats.reads_from_lease > 0, "{stats:?}");
    assert!(stats.prepares_held_off > 0, "{stats:?}");
}

fn cut_off_and_restart_others() -> Scenario {
    Scenario {
        faults: vec![
            FaultKind::CutOffAndRestartOthers,
            FaultKind::CutOffAndRestartOthers,
        ],
        append_interval: Duration::from_millis(20),
        mostly_reads: true,
        ..base("one node cut off while the others restart")
    }
}

#[test]
fn read_leases_outlive_a_restart_of_the_replicas_that_granted_them() {
    let stats = run(cut_off_and_restart_others());
    assert!(stats.reads_from_lease > 0, "{stats:?}");
    assert!(stats.prepares_held_off > 0, "{stats:?}");
}

#[test]
fn a_node_that_moves_to_another_address_keeps_its_replicas() {
    run(Scenario {
        faults: vec![FaultKind::MoveNode],
        delete_probability: 0.03,
        ..base("node moved")
    });
}

#[test]
fn a_member_replaced_during_writes() {
    let stats = run(Scenario {
        spare_nodes: 1,
        faults: vec![FaultKind::ReplaceMember],
        delete_probability: 0.05,
        ..base("member replaced")
    });
    // Every seed replaced one member: a joint and a settled configuration on top of the
    // first one, at least.
    assert!(stats.final_config_version >= 3 * seeds(), "{stats:?}");
}

#[test]
fn requests_applied_after_their_writer_gave_up_on_them() {
    run(slow());
}

fn slow() -> Scenario {
    Scenario {
        latency_ms: (1, 20),
        slow_probability: 0.2,
        duplicate_probability: 0.02,
        faults: vec![FaultKind::CrashWriter, FaultKind::Pause],
        ..base("slow requests")
    }
}

#[test]
fn slow_requests_on_five_nodes_with_every_fault() {
    run(Scenario {
        slow_probability: 0.1,
        ..everything()
    });
}

fn everything() -> Scenario {
    Scenario {
        nodes: 5,
        spare_nodes: 1,
        latency_ms: (1, 20),
        drop_probability: 0.02,
        duplicate_probability: 0.02,
        delete_probability: 0.03,
        faults: vec![
            FaultKind::CrashWriter,
            FaultKind::CrashReplica,
            FaultKind::WipeReplica,
            FaultKind::PartitionOneFromRest,
            FaultKind::Pause,
            FaultKind::ReplaceMember,
            FaultKind::MoveNode,
            FaultKind::FullRestart,
        ],
        ..base("everything, five nodes")
    }
}

#[test]
fn everything_at_once_on_five_nodes() {
    let stats = run(everything());
    // Wiped and replaced stores were forgotten once nothing counted on them any more.
    assert!(stats.stores_forgotten > 0, "{stats:?}");
}

/// The whole cluster restarts and forms again from a node that holds no replica of the log,
/// Up alone while the others join one at a time: the log must be found on them, never
/// created again on the lone node.
fn full_restart() -> Scenario {
    Scenario {
        nodes: 5,
        faults: vec![FaultKind::FullRestart, FaultKind::CrashWriter],
        ..base("a full restart, one node at a time")
    }
}

#[test]
fn a_cluster_restarted_one_node_at_a_time_keeps_its_log() {
    let stats = run(full_restart());
    // The first node back waited for the others rather than create the log.
    assert!(stats.creations_held > 0, "{stats:?}");
}

#[test]
fn creating_a_log_again_on_a_lone_restarted_node_is_caught() {
    // Writers that know only the members they see create the log again on the first node
    // back, which held none of it.
    let scenario = Scenario {
        forget_known_stores: true,
        ..full_restart()
    };
    let caught = caught_on(&scenario, 200);
    assert!(caught > 0, "no seed showed the log created again");
    eprintln!("a log created again after a full restart: caught on {caught} of 200 seeds");
}

/// How many of the first `seeds` seeds of `scenario` show a violation.
fn caught_on(scenario: &Scenario, seeds: u64) -> usize {
    (0..seeds)
        .filter(|&seed| {
            let mut sim = Simulation::new(scenario.clone(), seed);
            sim.run();
            !sim.check().is_empty()
        })
        .count()
}

/// Runs a sabotaged scenario and returns how many seeds showed a violation.
fn seeds_caught(sabotage: Sabotage) -> usize {
    let scenario = Scenario {
        faults: vec![FaultKind::Pause, FaultKind::PartitionOneFromRest],
        sabotage,
        ..base("sabotaged")
    };
    caught_on(&scenario, 200)
}

#[test]
fn accepting_writes_from_a_lower_epoch_is_caught() {
    let caught = seeds_caught(Sabotage {
        accept_lower_epochs: true,
        ..Sabotage::default()
    });
    eprintln!("writes from lower epochs accepted: {caught} of 200 seeds caught");
    assert!(caught > 0, "no seed showed the broken fence");
}

#[test]
fn promising_without_fencing_is_caught() {
    let caught = seeds_caught(Sabotage {
        no_fence: true,
        ..Sabotage::default()
    });
    eprintln!("promises that fence nothing: {caught} of 200 seeds caught");
    assert!(caught > 0, "no seed showed the missing fence");
}

#[test]
fn promising_a_new_writer_during_a_read_lease_is_caught() {
    // Clients that mostly read: a writer cut off keeps confirming from its lease.
    let scenario = Scenario {
        faults: vec![FaultKind::PartitionOneFromRest, FaultKind::Pause],
        mostly_reads: true,
        sabotage: Sabotage {
            ignore_leases: true,
            ..Sabotage::default()
        },
        ..base("sabotaged: leases ignored")
    };
    let caught = caught_on(&scenario, 200);
    eprintln!("leases ignored: {caught} of 200 seeds caught");
    assert!(
        caught > 0,
        "no seed showed a read confirmed from a lease that was not kept"
    );
}

#[test]
fn promising_at_once_after_a_restart_is_caught() {
    // A replica that granted a lease restarts within it, forgets it, and promises a new
    // writer while the lease holder, cut off, still confirms reads from it.
    let scenario = Scenario {
        sabotage: Sabotage {
            no_restart_wait: true,
            ..Sabotage::default()
        },
        ..cut_off_and_restart_others()
    };
    let caught = caught_on(&scenario, seeds());
    eprintln!(
        "no wait after a restart: {caught} of {} seeds caught",
        seeds()
    );
    assert!(caught > 0, "no seed showed a lease forgotten in a restart");
}

#[test]
fn a_repeated_seal_that_truncates_again_is_caught() {
    // Seals duplicated and delayed past the writer's next appends.
    let scenario = Scenario {
        latency_ms: (1, 40),
        duplicate_probability: 0.5,
        append_interval: Duration::from_millis(10),
        faults: vec![
            FaultKind::CrashWriter,
            FaultKind::CrashWriter,
            FaultKind::CrashWriter,
        ],
        sabotage: Sabotage {
            reseal_repeats: true,
            ..Sabotage::default()
        },
        ..base("sabotaged: repeated seals truncate")
    };
    let caught = caught_on(&scenario, 200);
    assert!(caught > 0, "no seed showed the repeated seal's truncation");
}

/// Prints the trace of one seed of a scenario: `TESSERA_SIM_TRACE=<scenario test>:<seed>`.
#[test]
fn trace_one_seed() {
    let Ok(spec) = std::env::var("TESSERA_SIM_TRACE") else {
        return;
    };
    let (name, seed) = spec.split_once(':').expect("name:seed");
    let scenario = match name {
        "replaced" => Scenario {
            spare_nodes: 1,
            faults: vec![FaultKind::ReplaceMember],
            delete_probability: 0.05,
            ..base("member replaced")
        },
        "disk" => Scenario {
            faults: vec![FaultKind::WipeReplica],
            delete_probability: 0.05,
            ..base("replica lost its disk")
        },
        "loss" => Scenario {
            latency_ms: (1, 40),
            drop_probability: 0.05,
            duplicate_probability: 0.05,
            ..base("message loss, duplication, reordering")
        },
        "everything" => everything(),
        "slow" => slow(),
        "slow-everything" => Scenario {
            slow_probability: 0.1,
            ..everything()
        },
        "paused" => Scenario {
            faults: vec![FaultKind::Pause, FaultKind::Pause],
            ..base("paused writer")
        },
        "reads" => Scenario {
            faults: vec![FaultKind::PartitionOneFromRest, FaultKind::Pause],
            mostly_reads: true,
            ..base("reads from leases, partitions and pauses")
        },
        "cut-off" => cut_off_and_restart_others(),
        "fenced" => fenced_appends::contended(FencedAppends::Fenced),
        "fenced-one" => fenced_appends::one_writer_moves_its_log(),
        "moved" => Scenario {
            faults: vec![FaultKind::MoveNode],
            delete_probability: 0.03,
            ..base("node moved")
        },
        other => panic!("unknown scenario {other}"),
    };
    let mut sim = Simulation::new(scenario, seed.parse().unwrap());
    sim.enable_trace();
    sim.run();
    let violations = sim.check();
    for line in sim.trace.take().unwrap() {
        println!("{line}");
    }
    for v in violations {
        println!("VIOLATION {}", v.0);
    }
}
