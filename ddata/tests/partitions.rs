//! The Replicator under network partitions, in the style of Akka's JepsenInspiredInsertSpec
//! and ReplicatorChaosSpec, over many seeds (`TESSERA_SIM_SEEDS`, default 100).

mod common;

use common::*;
use std::collections::BTreeSet;
use std::time::Duration;
use tessera_ddata::replicator::{GetResult, ReplicatorConfig, UpdateResult};
use tessera_ddata::sim::{NetworkConfig, ReplicatorSim};
use tessera_ddata::{ReadConsistency, WriteConsistency};

const MAJORITY_SIDE: [usize; 3] = [0, 1, 2];
const MINORITY_SIDE: [usize; 2] = [3, 4];

/// 5 nodes split 3|2; every node inserts unique elements into one ORSet with WriteMajority
/// and records each result. After healing, a ReadMajority from any node holds every
/// acknowledged insert, the minority acknowledged none, and nothing never written appears.
#[test]
fn jepsen_inspired_inserts_with_majority_writes_across_a_partition() {
    for seed in seeds() {
        let network = NetworkConfig {
            drop_probability: 0.02,
            ..NetworkConfig::default()
        };
        let mut sim = ReplicatorSim::new(5, ReplicatorConfig::default(), network, seed);
        sim.run_for(Duration::from_millis(500));
        sim.partition(&MAJORITY_SIDE, &MINORITY_SIDE);

        let mut written = BTreeSet::new();
        let mut requests = Vec::new();
        for round in 0..10 {
            for node in 0..5 {
                let element = format!("n{node}-{round}");
                written.insert(element.clone());
                let id = add(&mut sim, node, "inserts", &element, MAJORITY_W);
                requests.push((node, id, element));
            }
            sim.run_for(Duration::from_millis(50));
        }
        let all_answered = sim.run_until(Duration::from_secs(10), |s| {
            requests
                .iter()
                .all(|(node, id, _)| s.reply(*node, *id).is_some())
        });
        assert!(all_answered, "seed {seed}: every insert gets an answer");
        let mut acknowledged = BTreeSet::new();
        for (node, id, element) in &requests {
            let result = update_answer(&mut sim, *node, *id);
            if MINORITY_SIDE.contains(node) {
                assert_ne!(
                    result,
                    UpdateResult::Success,
                    "seed {seed}: the minority acknowledged {element}"
                );
            }
            if result == UpdateResult::Success {
                acknowledged.insert(element.clone());
            }
        }
        assert!(
            !acknowledged.is_empty(),
            "seed {seed}: the majority side made progress"
        );

        sim.heal();
        sim.run_for(Duration::from_secs(5));
        for node in 0..5 {
            let id = get(&mut sim, node, "inserts", MAJORITY_R);
            let result = get_answer(&mut sim, node, id);
            let elements: BTreeSet<String> = set_elements(&result)
                .unwrap_or_else(|| panic!("seed {seed}: node {node} read {result:?}"))
                .into_iter()
                .collect();
            let missing: Vec<_> = acknowledged.difference(&elements).collect();
            assert!(
                missing.is_empty(),
                "seed {seed}: node {node} lost acknowledged {missing:?}"
            );
            let invented: Vec<_> = elements.difference(&written).collect();
            assert!(
                invented.is_empty(),
                "seed {seed}: node {node} shows unwritten {invented:?}"
            );
        }
    }
}

fn value_everywhere(sim: &mut ReplicatorSim, nodes: &[usize], key: &str) -> Vec<GetResult> {
    nodes
        .iter()
        .map(|node| {
            let id = get(sim, *node, key, ReadConsistency::Local);
            get_answer(sim, *node, id)
        })
        .collect()
}

/// Writes of several kinds on both sides of a partition, with a node crashed in the middle of
/// it; after healing, every live node holds exactly the expected values.
#[test]
fn chaos_writes_on_both_sides_with_a_crash_converge_to_the_exact_values() {
    for seed in seeds() {
        let mut sim = sim(5, ReplicatorConfig::default(), seed);
        // Before the partition: everyone counts and adds.
        for node in 0..5 {
            let id = increment(&mut sim, node, "A", 1, WriteConsistency::Local);
            update_answer(&mut sim, node, id);
            let id = add(
                &mut sim,
                node,
                "E",
                &format!("before-{node}"),
                WriteConsistency::Local,
            );
            update_answer(&mut sim, node, id);
        }
        sim.run_for(Duration::from_secs(3));

        sim.partition(&MAJORITY_SIDE, &MINORITY_SIDE);
        // Majority side: quorum writes succeed.
        for node in MAJORITY_SIDE {
            let id = increment(&mut sim, node, "A", 10, MAJORITY_W);
            assert_eq!(
                update_answer(&mut sim, node, id),
                UpdateResult::Success,
                "seed {seed}"
            );
            let id = add(&mut sim, node, "E", &format!("major-{node}"), MAJORITY_W);
            assert_eq!(
                update_answer(&mut sim, node, id),
                UpdateResult::Success,
                "seed {seed}"
            );
        }
        // Minority side: local writes only.
        for node in MINORITY_SIDE {
            let id = increment(&mut sim, node, "A", 100, WriteConsistency::Local);
            assert_eq!(update_answer(&mut sim, node, id), UpdateResult::Success);
            let id = increment(&mut sim, node, "B", 1, WriteConsistency::Local);
            assert_eq!(update_answer(&mut sim, node, id), UpdateResult::Success);
            let id = add(
                &mut sim,
                node,
                "E",
                &format!("minor-{node}"),
                WriteConsistency::Local,
            );
            assert_eq!(update_answer(&mut sim, node, id), UpdateResult::Success);
        }
        sim.run_for(Duration::from_secs(2));
        // Node 2 crashes mid-partition. What it wrote reached a majority and survives it.
        sim.crash(2);
        for node in [0, 1] {
            let id = increment(&mut sim, node, "A", 1_000, WriteConsistency::To(2));
            assert_eq!(
                update_answer(&mut sim, node, id),
                UpdateResult::Success,
                "seed {seed}"
            );
        }
        for node in MINORITY_SIDE {
            let id = add(
                &mut sim,
                node,
                "E",
                &format!("late-{node}"),
                WriteConsistency::All,
            );
            // Node 2 is gone and the other side unreachable: All cannot succeed.
            assert_eq!(update_answer(&mut sim, node, id), UpdateResult::Timeout);
        }

        sim.heal();
        let live = [0, 1, 3, 4];
        let expected_a: i128 = 5 + 3 * 10 + 2 * 100 + 2 * 1_000;
        let converged = sim.run_until(Duration::from_secs(30), |s| {
            live.iter()
                .all(|n| local_counter(s, *n, "A") == Some(expected_a))
        });
        assert!(
            converged,
            "seed {seed}: counter A converges to {expected_a}"
        );
        sim.run_for(Duration::from_secs(3));
        for result in value_everywhere(&mut sim, &live, "B") {
            assert_eq!(counter_value(&result), Some(2), "seed {seed}");
        }
        let expected_e: BTreeSet<String> = (0..5)
            .map(|n| format!("before-{n}"))
            .chain(MAJORITY_SIDE.iter().map(|n| format!("major-{n}")))
            .chain(MINORITY_SIDE.iter().map(|n| format!("minor-{n}")))
            .chain(MINORITY_SIDE.iter().map(|n| format!("late-{n}")))
            .collect();
        for result in value_everywhere(&mut sim, &live, "E") {
            let elements: BTreeSet<String> = set_elements(&result).unwrap().into_iter().collect();
            assert_eq!(elements, expected_e, "seed {seed}");
        }
    }
}
