//! The reader of the acknowledged log beside the writers (what the queries by slice and the
//! projections read with): every scenario over the seeds, each checked on every seed — every
//! acknowledged entry delivered, nothing delivered that was not acknowledged or was
//! truncated, each log in order and at most once per offset, and a resume from any offset
//! delivered losing nothing. Broken reading rules (serving replicas' unacknowledged tails,
//! moving the offset past what a read returned) are caught.

use super::{base, caught_on, everything, run, seeds};
use std::time::Duration;
use tessera_replication::committed_reader::ReaderSabotage;
use tessera_replication::sim::{FaultKind, Scenario, Simulation};

fn reading(scenario: Scenario) -> Scenario {
    Scenario {
        committed_reader: Some(ReaderSabotage::default()),
        ..scenario
    }
}

fn takeovers() -> Scenario {
    reading(Scenario {
        latency_ms: (1, 20),
        slow_probability: 0.1,
        faults: vec![
            FaultKind::CrashWriter,
            FaultKind::CrashWriter,
            FaultKind::Pause,
        ],
        ..base("reader: writer crashes, takeovers and tail repair")
    })
}

#[test]
fn the_reader_follows_writer_crashes_and_tail_repairs() {
    let stats = run(takeovers());
    assert!(stats.recoveries > 0 && stats.unknown > 0, "{stats:?}");
}

#[test]
fn the_reader_follows_replica_losses_and_moves() {
    run(reading(Scenario {
        spare_nodes: 1,
        delete_probability: 0.03,
        faults: vec![
            FaultKind::WipeReplica,
            FaultKind::ReplaceMember,
            FaultKind::MoveNode,
            FaultKind::CrashReplica,
        ],
        ..base("reader: replicas lost, replaced and moved")
    }));
}

#[test]
fn the_reader_under_message_loss_duplication_and_reordering() {
    run(reading(Scenario {
        latency_ms: (1, 40),
        drop_probability: 0.05,
        duplicate_probability: 0.05,
        faults: vec![FaultKind::CrashWriter],
        ..base("reader: message loss, duplication, reordering")
    }));
}

#[test]
fn the_reader_across_partitions_and_pauses() {
    run(reading(Scenario {
        faults: vec![
            FaultKind::PartitionOneFromRest,
            FaultKind::PartitionOneFromRest,
            FaultKind::PartitionAll,
            FaultKind::Pause,
        ],
        ..base("reader: partitions and pauses")
    }));
}

#[test]
fn the_reader_with_every_fault_on_five_nodes() {
    run(reading(everything()));
}

/// Every seed delivered something, and restarts resumed from older offsets too (so that
/// "any delivered offset" was exercised).
#[test]
fn the_reader_restarts_from_older_offsets_and_delivers_again() {
    let scenario = takeovers();
    let (mut resumed_behind, mut delivered) = (0, 0);
    for seed in 0..seeds().min(200) {
        let mut sim = Simulation::new(scenario.clone(), seed);
        sim.run();
        assert!(sim.check().is_empty());
        let deliveries = sim.projection_deliveries();
        delivered += deliveries.len();
        resumed_behind += deliveries
            .windows(2)
            .filter(|w| w[1].incarnation != w[0].incarnation && w[1].seq <= w[0].seq)
            .count();
    }
    assert!(delivered > 0);
    assert!(
        resumed_behind > 0,
        "no restart resumed behind its last delivery"
    );
}

fn sabotaged(sabotage: ReaderSabotage) -> Scenario {
    Scenario {
        committed_reader: Some(sabotage),
        latency_ms: (1, 20),
        slow_probability: 0.1,
        append_interval: Duration::from_millis(20),
        faults: vec![
            FaultKind::CrashWriter,
            FaultKind::CrashWriter,
            FaultKind::PartitionOneFromRest,
        ],
        ..base("reader, sabotaged")
    }
}

#[test]
fn serving_unacknowledged_tails_is_caught() {
    let caught = caught_on(
        &sabotaged(ReaderSabotage {
            serve_unacknowledged: true,
            ..ReaderSabotage::default()
        }),
        200,
    );
    assert!(
        caught > 0,
        "no seed showed an unacknowledged entry delivered"
    );
    eprintln!("serving unacknowledged tails: caught on {caught} of 200 seeds");
}

#[test]
fn advancing_the_offset_past_a_gap_is_caught() {
    let caught = caught_on(
        &sabotaged(ReaderSabotage {
            advance_to_mark: true,
            ..ReaderSabotage::default()
        }),
        200,
    );
    assert!(caught > 0, "no seed showed an entry skipped");
    eprintln!("advancing the offset past a gap: caught on {caught} of 200 seeds");
}
