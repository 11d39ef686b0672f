//! A replica's limits on a simulated network: `max_keys`, `max_value_bytes` and
//! `max_total_bytes` refuse local updates with a typed error and states from peers by not
//! taking them in (counted), the keys held still converge, quorum operations still work
//! around the full replica, and a full replica does not trade refused states in a loop.

mod common;

use common::*;
use std::time::Duration;
use tessera_ddata::codec;
use tessera_ddata::replicator::{
    DeleteResult, GetResult, LimitExceeded, ReplicatorConfig, UpdateResult,
};
use tessera_ddata::{ReadConsistency, WriteConsistency};

const LOCAL: WriteConsistency = WriteConsistency::Local;

/// Three nodes with small messages (so that anti-entropy runs in truncated rounds), node 2
/// restarted with `limited`'s limits.
fn with_limited_node(limited: ReplicatorConfig, seed: u64) -> tessera_ddata::sim::ReplicatorSim {
    let config = ReplicatorConfig {
        max_message_bytes: 512,
        ..ReplicatorConfig::default()
    };
    let mut sim = sim(3, config.clone(), seed);
    sim.crash(2);
    sim.restart_with(
        2,
        ReplicatorConfig {
            max_message_bytes: 512,
            ..limited
        },
        Vec::new(),
    );
    sim
}

fn keys_held(sim: &tessera_ddata::sim::ReplicatorSim, node: usize) -> usize {
    sim.replicator(node).expect("running").key_count()
}

#[test]
fn a_full_replica_refuses_new_keys_from_callers_and_peers_and_converges_on_those_it_holds() {
    let limited = ReplicatorConfig {
        max_keys: 5,
        ..ReplicatorConfig::default()
    };
    let mut sim = with_limited_node(limited, 1);
    for i in 0..5 {
        let id = increment(&mut sim, 2, &format!("z{i}"), 1, LOCAL);
        assert_eq!(update_answer(&mut sim, 2, id), UpdateResult::Success);
    }
    let id = increment(&mut sim, 2, "z5", 1, LOCAL);
    assert_eq!(
        update_answer(&mut sim, 2, id),
        UpdateResult::LimitReached(LimitExceeded::Keys {
            key: "z5".into(),
            held: 5,
            max_keys: 5
        })
    );
    for i in 0..50 {
        let id = increment(&mut sim, 0, &format!("k{i}"), 1, LOCAL);
        assert_eq!(update_answer(&mut sim, 0, id), UpdateResult::Success);
    }
    let spread = sim.run_until(Duration::from_secs(30), |s| {
        keys_held(s, 0) == 55 && keys_held(s, 1) == 55
    });
    assert!(spread, "the others hold every key, the full node's too");
    sim.run_for(Duration::from_secs(5));
    assert_eq!(keys_held(&sim, 2), 5, "the full node took no key in");
    let refusals = sim.replicator(2).unwrap().refusals();
    assert_eq!(refusals.local.keys, 1);
    assert!(refusals.remote.keys > 0, "{refusals:?}");

    // A held key still converges.
    let id = increment(&mut sim, 0, "z0", 3, LOCAL);
    assert_eq!(update_answer(&mut sim, 0, id), UpdateResult::Success);
    let converged = sim.run_until(Duration::from_secs(10), |s| {
        local_counter(s, 2, "z0") == Some(4)
    });
    assert!(
        converged,
        "z0 on the full node: {:?}",
        local_counter(&sim, 2, "z0")
    );

    // Nothing changes now: the exchanges with the full node happen once per gossip round,
    // not back to back.
    let before = sim.messages_sent();
    sim.run_for(Duration::from_secs(10));
    let sent = sim.messages_sent() - before;
    println!("{sent} messages in 10 quiet seconds");
    assert!(
        sent < 400,
        "{sent} messages in 10 quiet seconds: refused states are traded in a loop"
    );
}

#[test]
fn quorum_writes_and_reads_work_around_a_full_replica() {
    let limited = ReplicatorConfig {
        max_keys: 1,
        ..ReplicatorConfig::default()
    };
    let mut sim = with_limited_node(limited, 2);
    let id = increment(&mut sim, 2, "mine", 1, LOCAL);
    assert_eq!(update_answer(&mut sim, 2, id), UpdateResult::Success);
    // The full node refuses the write (it does not acknowledge what it does not hold); the
    // other two are a majority.
    let id = increment(&mut sim, 0, "m", 7, MAJORITY_W);
    assert_eq!(update_answer(&mut sim, 0, id), UpdateResult::Success);
    // All three are needed: the full node's refusal fails the write at once.
    let id = increment(&mut sim, 0, "n", 1, WriteConsistency::All);
    assert!(
        matches!(update_answer(&mut sim, 0, id), UpdateResult::Failed(reason) if reason.contains("max_keys")),
    );
    // A read through the full node answers what the others hold, though it keeps nothing.
    let id = get(&mut sim, 2, "m", ReadConsistency::All);
    assert_eq!(counter_value(&get_answer(&mut sim, 2, id)), Some(7));
    let id = get(&mut sim, 2, "m", ReadConsistency::Local);
    assert_eq!(get_answer(&mut sim, 2, id), GetResult::NotFound);
    assert_eq!(keys_held(&sim, 2), 1);
}

#[test]
fn deletes_pass_for_held_keys_and_are_refused_for_new_ones_at_the_key_limit() {
    let config = ReplicatorConfig {
        max_keys: 2,
        ..quorum_only()
    };
    let mut sim = sim(1, config, 3);
    for key in ["a", "b"] {
        let id = increment(&mut sim, 0, key, 1, LOCAL);
        assert_eq!(update_answer(&mut sim, 0, id), UpdateResult::Success);
    }
    let id = delete(&mut sim, 0, "a", LOCAL);
    assert_eq!(delete_answer(&mut sim, 0, id), DeleteResult::Success);
    let id = delete(&mut sim, 0, "c", LOCAL);
    assert!(matches!(
        delete_answer(&mut sim, 0, id),
        DeleteResult::LimitReached(LimitExceeded::Keys { .. })
    ));
    // A deleted key keeps its place: still two keys, and no room for a third.
    let id = increment(&mut sim, 0, "d", 1, LOCAL);
    assert!(matches!(
        update_answer(&mut sim, 0, id),
        UpdateResult::LimitReached(LimitExceeded::Keys { held: 2, .. })
    ));
}

#[test]
fn the_total_bytes_held_never_pass_max_total_bytes() {
    let config = ReplicatorConfig {
        max_total_bytes: 2_000,
        ..quorum_only()
    };
    let mut sim = sim(1, config, 4);
    let mut refused = None;
    for i in 0..200 {
        let id = add(
            &mut sim,
            0,
            &format!("s{}", i % 7),
            &format!("element-{i:04}"),
            LOCAL,
        );
        match update_answer(&mut sim, 0, id) {
            UpdateResult::Success => {}
            other => {
                refused = Some(other);
                break;
            }
        }
        assert!(sim.replicator(0).unwrap().held_bytes() <= 2_000);
    }
    assert!(
        matches!(
            &refused,
            Some(UpdateResult::LimitReached(LimitExceeded::TotalBytes {
                would_hold_bytes,
                max_total_bytes: 2_000,
                ..
            })) if *would_hold_bytes > 2_000
        ),
        "{refused:?}"
    );
    // The count is exact: every key's name and encoded state.
    let replicator = sim.replicator(0).unwrap();
    let counted: usize = (0..7)
        .filter_map(|i| {
            let key = format!("s{i}");
            let envelope = replicator.envelope(&key)?;
            Some(key.len() + codec::encode("data envelope", envelope).unwrap().len())
        })
        .sum();
    assert_eq!(replicator.held_bytes(), counted);
}

#[test]
fn a_state_from_a_peer_beyond_max_value_bytes_is_refused_and_the_older_one_kept() {
    let limited = ReplicatorConfig {
        max_value_bytes: 300,
        ..ReplicatorConfig::default()
    };
    let mut sim = with_limited_node(limited, 5);
    for i in 0..40 {
        let id = add(&mut sim, 0, "s", &format!("element-{i:04}"), LOCAL);
        assert_eq!(update_answer(&mut sim, 0, id), UpdateResult::Success);
        sim.run_for(Duration::from_millis(300));
    }
    let spread = sim.run_until(Duration::from_secs(10), |s| {
        let size_of = |node| {
            s.envelope(node, "s")
                .and_then(|e| e.data.clone())
                .map(|v| codec::encode("v", &v).unwrap().len())
        };
        size_of(1) == size_of(0)
    });
    assert!(spread, "node 1 holds the whole set");
    let held = sim
        .envelope(2, "s")
        .expect("node 2 holds an earlier state of s");
    assert!(codec::encode("data envelope", held).unwrap().len() <= 300);
    assert!(sim.replicator(2).unwrap().refusals().remote.value_bytes > 0);
}
