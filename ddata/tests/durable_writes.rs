//! Durable keys on simulated disks that are slow and fail: an acknowledgement of a durable key
//! — a replica's `WriteAck`, a local update's success — goes out only once its state is on
//! disk, never after a failed write, and nothing else waits for the disk. The simulation
//! checks every such acknowledgement against its node's disk as it is released.

mod common;

use common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;
use tessera_ddata::replicator::{DeleteResult, GetResult, ReplicatorConfig, UpdateResult};
use tessera_ddata::sim::{DiskConfig, NetworkConfig, ReplicatorSim};
use tessera_ddata::{ReadConsistency, WriteConsistency};

fn durable(config: ReplicatorConfig) -> ReplicatorConfig {
    ReplicatorConfig {
        durable_keys: vec!["durable-*".into()],
        ..config
    }
}

fn disk(latency: Duration, failure_probability: f64) -> DiskConfig {
    DiskConfig {
        latency_min: latency,
        latency_max: latency,
        failure_probability,
    }
}

fn assert_no_violation(sim: &ReplicatorSim, context: &str) {
    let violations = sim.acknowledgement_violations();
    assert!(
        violations.is_empty(),
        "{context}: {} violations, the first: {:?}",
        violations.len(),
        &violations[..violations.len().min(3)]
    );
}

#[test]
fn a_durable_acknowledgement_waits_for_its_write_and_nothing_else_waits_for_the_disk() {
    let mut sim = sim(3, durable(quorum_only()), 1);
    sim.set_disk(0, disk(Duration::from_secs(2), 0.0));
    let slow = increment(&mut sim, 0, "durable-a", 1, WriteConsistency::Local);

    // Same instant: a key that is not durable is acknowledged at once.
    let volatile = increment(&mut sim, 0, "volatile", 1, WriteConsistency::Local);
    assert_eq!(
        sim.reply(0, volatile),
        Some(&tessera_ddata::replicator::Response::Update(
            UpdateResult::Success
        ))
    );
    // A majority read of the durable key answers (after repairing the replica that answered,
    // whose disk is fast) while node 0's own write is still syncing.
    let read = get(&mut sim, 0, "durable-a", MAJORITY_R);
    let result = get_answer(&mut sim, 0, read);
    assert_eq!(counter_value(&result), Some(1));
    assert!(
        sim.elapsed() < Duration::from_secs(1),
        "{:?}",
        sim.elapsed()
    );
    assert!(
        sim.reply(0, slow).is_none(),
        "acknowledged before its write"
    );
    assert!(sim.stored(0, "durable-a").is_none());

    assert_eq!(update_answer(&mut sim, 0, slow), UpdateResult::Success);
    assert!(
        sim.elapsed() >= Duration::from_secs(2),
        "{:?}",
        sim.elapsed()
    );
    assert!(sim.stored(0, "durable-a").is_some());
    // The read repaired the one replica whose answer completed its majority.
    assert_eq!(sim.acknowledgements_checked(), 2, "the update and a repair");
    assert_no_violation(&sim, "one slow disk");
}

#[test]
fn replicas_whose_durable_writes_fail_do_not_acknowledge_and_the_write_times_out() {
    let mut sim = sim(3, durable(quorum_only()), 2);
    for replica in [1, 2] {
        sim.set_disk(replica, disk(Duration::from_millis(5), 1.0));
    }
    let id = increment(&mut sim, 0, "durable-a", 1, MAJORITY_W);
    assert_eq!(update_answer(&mut sim, 0, id), UpdateResult::Timeout);
    assert_eq!(sim.failed_durable_writes(), 2, "one write per replica");
    assert!(sim.stored(1, "durable-a").is_none());

    // Disks back: the next write stores and is acknowledged, the first increment with it.
    for replica in [1, 2] {
        sim.set_disk(replica, DiskConfig::default());
    }
    let id = increment(&mut sim, 0, "durable-a", 1, MAJORITY_W);
    assert_eq!(update_answer(&mut sim, 0, id), UpdateResult::Success);
    let on_replicas = [1, 2]
        .iter()
        .filter(|replica| sim.stored(**replica, "durable-a").is_some())
        .count();
    assert!(on_replicas >= 1, "a majority holds it on disk");
    assert_no_violation(&sim, "failing replicas");
}

#[test]
fn a_failed_local_durable_write_fails_the_request_and_the_next_acknowledgement_writes_again() {
    let mut sim = sim(1, durable(quorum_only()), 3);
    sim.set_disk(0, disk(Duration::from_millis(5), 1.0));
    let id = increment(&mut sim, 0, "durable-a", 1, WriteConsistency::Local);
    assert_eq!(
        update_answer(&mut sim, 0, id),
        UpdateResult::Failed("durable store: simulated disk failure".into())
    );
    let id = delete(&mut sim, 0, "durable-b", WriteConsistency::Local);
    assert_eq!(
        delete_answer(&mut sim, 0, id),
        DeleteResult::Failed("durable store: simulated disk failure".into())
    );
    assert!(sim.stored(0, "durable-a").is_none());

    // Not rolled back in memory; the next update writes the whole state.
    sim.set_disk(0, DiskConfig::default());
    let id = increment(&mut sim, 0, "durable-a", 1, WriteConsistency::Local);
    assert_eq!(update_answer(&mut sim, 0, id), UpdateResult::Success);
    let stored = sim.stored(0, "durable-a").cloned().expect("stored");
    sim.crash(0);
    sim.restart(0, vec![("durable-a".into(), stored)]);
    assert_eq!(local_counter(&sim, 0, "durable-a"), Some(2));
    assert_no_violation(&sim, "failing local disk");
}

#[test]
fn writes_issued_while_a_commit_syncs_share_the_next_commit() {
    let mut sim = sim(1, durable(quorum_only()), 4);
    sim.set_disk(0, disk(Duration::from_millis(100), 0.0));
    let first = increment(&mut sim, 0, "durable-0", 1, WriteConsistency::Local);
    let rest: Vec<_> = (1..10)
        .map(|i| {
            increment(
                &mut sim,
                0,
                &format!("durable-{i}"),
                1,
                WriteConsistency::Local,
            )
        })
        .collect();
    for id in std::iter::once(first).chain(rest) {
        assert_eq!(update_answer(&mut sim, 0, id), UpdateResult::Success);
    }
    assert_eq!(sim.commit_sizes(0), [1, 9]);
    assert_no_violation(&sim, "group commit");
}

/// Five nodes with disks of random latency that fail one commit in five, a lossy network, a
/// partition, a crash and a restart from disk, and random updates, deletes and reads at every
/// consistency, over many seeds: no acknowledgement of a durable key is ever released before
/// its state is on its node's disk.
#[test]
fn no_acknowledgement_runs_ahead_of_its_durable_write_under_slow_and_failing_disks() {
    let (mut checked, mut failed_writes, mut successes) = (0, 0, 0);
    for seed in seeds() {
        let network = NetworkConfig {
            drop_probability: 0.01,
            ..NetworkConfig::default()
        };
        let config = durable(ReplicatorConfig::default());
        let mut sim = ReplicatorSim::new(5, config, network, seed);
        let mut rng = SmallRng::seed_from_u64(seed);
        for node in 0..5 {
            sim.set_disk(
                node,
                DiskConfig {
                    latency_min: Duration::ZERO,
                    latency_max: Duration::from_millis(30),
                    failure_probability: 0.2,
                },
            );
        }
        let mut requests = Vec::new();
        for round in 0..60 {
            let node = rng.random_range(0..5);
            let key = format!("durable-{}", rng.random_range(0..3));
            let write = match rng.random_range(0..3) {
                0 => WriteConsistency::Local,
                1 => MAJORITY_W,
                _ => WriteConsistency::All,
            };
            let id = match rng.random_range(0..10) {
                0..=5 => increment(&mut sim, node, &key, 1, write),
                6 => delete(&mut sim, node, "durable-gone", write),
                7 => increment(&mut sim, node, "volatile", 1, write),
                _ => get(&mut sim, node, &key, ReadConsistency::All),
            };
            requests.push((node, id));
            match round {
                20 => sim.partition(&[0, 1], &[2, 3, 4]),
                30 => sim.heal(),
                40 => sim.crash(4),
                45 => {
                    let disk: Vec<_> = ["durable-0", "durable-1", "durable-2", "durable-gone"]
                        .iter()
                        .filter_map(|k| sim.stored(4, k).map(|e| (k.to_string(), e.clone())))
                        .collect();
                    sim.restart(4, disk);
                }
                _ => {}
            }
            sim.run_for(Duration::from_millis(rng.random_range(0..40)));
        }
        sim.run_for(Duration::from_secs(10));
        for (node, id) in requests {
            if matches!(
                sim.reply(node, id),
                Some(tessera_ddata::replicator::Response::Update(
                    UpdateResult::Success
                ))
            ) {
                successes += 1;
            }
        }
        assert_no_violation(&sim, &format!("seed {seed}"));
        checked += sim.acknowledgements_checked();
        failed_writes += sim.failed_durable_writes();
    }
    // Not vacuous: acknowledgements were checked, writes failed, and updates still succeeded.
    assert!(
        checked > 0 && failed_writes > 0 && successes > 0,
        "checked {checked}, failed writes {failed_writes}, successes {successes}"
    );
}

#[test]
fn without_a_failure_a_durable_majority_write_is_read_back_from_a_majority() {
    for seed in seeds().take(20) {
        let mut sim = sim(3, durable(quorum_only()), seed);
        let id = increment(&mut sim, 0, "durable-a", 7, MAJORITY_W);
        assert_eq!(
            update_answer(&mut sim, 0, id),
            UpdateResult::Success,
            "seed {seed}"
        );
        let id = get(&mut sim, 2, "durable-a", MAJORITY_R);
        let result = get_answer(&mut sim, 2, id);
        assert!(
            matches!(result, GetResult::Found(_)),
            "seed {seed}: {result:?}"
        );
        assert_eq!(counter_value(&result), Some(7), "seed {seed}");
        assert_no_violation(&sim, &format!("seed {seed}"));
    }
}
