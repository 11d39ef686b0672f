//! The Replicator's protocols on a simulated network: quorum writes and reads, read repair,
//! deltas, anti-entropy, deletion, subscriptions, durable keys, pruning and timeouts.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::time::Duration;
use tessera_cluster::MemberStatus;
use tessera_ddata::replicator::{
    Command, DeleteResult, GetResult, KeysPage, LimitExceeded, MembershipView, Output,
    ReplicatorConfig, Response, UpdateResult,
};
use tessera_ddata::{ReadConsistency, ReplicatedValue, WriteConsistency};

#[test]
fn a_majority_write_is_seen_by_a_majority_read_on_another_node_without_gossip() {
    for seed in seeds() {
        let mut sim = sim(3, quorum_only(), seed);
        for _ in 0..100 {
            let id = increment(&mut sim, 0, "hits", 1, MAJORITY_W);
            assert_eq!(
                update_answer(&mut sim, 0, id),
                UpdateResult::Success,
                "seed {seed}"
            );
        }
        let id = get(&mut sim, 2, "hits", MAJORITY_R);
        let result = get_answer(&mut sim, 2, id);
        assert_eq!(counter_value(&result), Some(100), "seed {seed}: {result:?}");
    }
}

#[test]
fn a_local_write_reaches_the_others_by_deltas() {
    let config = ReplicatorConfig {
        gossip_interval: Duration::from_secs(3600),
        ..ReplicatorConfig::default()
    };
    let mut sim = sim(3, config, 1);
    for _ in 0..5 {
        let id = increment(&mut sim, 1, "c", 2, WriteConsistency::Local);
        assert_eq!(update_answer(&mut sim, 1, id), UpdateResult::Success);
    }
    let spread = sim.run_until(Duration::from_secs(2), |s| {
        (0..3).all(|n| local_counter(s, n, "c") == Some(10))
    });
    assert!(spread, "deltas bring the value to every node");
}

#[test]
fn anti_entropy_alone_converges_many_keys_in_truncated_rounds() {
    let config = ReplicatorConfig {
        delta_propagation_interval: Duration::from_secs(3600),
        // Small messages force the exchange to continue over many rounds.
        max_message_bytes: 4 * 1024,
        ..ReplicatorConfig::default()
    };
    let mut sim = sim(3, config, 7);
    for i in 0..2_000 {
        let id = increment(
            &mut sim,
            i % 2,
            &format!("key-{i}"),
            1,
            WriteConsistency::Local,
        );
        assert_eq!(update_answer(&mut sim, i % 2, id), UpdateResult::Success);
    }
    let converged = sim.run_until(Duration::from_secs(120), |s| {
        (0..2_000).all(|i| local_counter(s, 2, &format!("key-{i}")) == Some(1))
            && (0..2_000).all(|i| local_counter(s, (i % 2) ^ 1, &format!("key-{i}")) == Some(1))
    });
    assert!(
        converged,
        "all 2,000 keys everywhere after {:?}",
        sim.elapsed()
    );
}

#[test]
fn read_repair_brings_stale_replicas_up_to_date_before_the_read_returns() {
    let mut sim = sim(3, quorum_only(), 3);
    // Each node counts on its own: three diverged replicas.
    for node in 0..3 {
        let id = increment(
            &mut sim,
            node,
            "r",
            node as u64 + 1,
            WriteConsistency::Local,
        );
        assert_eq!(update_answer(&mut sim, node, id), UpdateResult::Success);
    }
    let id = get(&mut sim, 0, "r", ReadConsistency::All);
    // Stop the moment the read answers: no gossip or delta ran meanwhile.
    sim.run_until(Duration::from_secs(5), |s| s.reply(0, id).is_some());
    assert_eq!(counter_value(&get_answer(&mut sim, 0, id)), Some(6));
    for node in 0..3 {
        assert_eq!(
            local_counter(&sim, node, "r"),
            Some(6),
            "node {node} was repaired before the read returned"
        );
    }
}

#[test]
fn a_majority_read_alone_does_not_repair_replicas_it_did_not_ask() {
    // The companion of the read-repair test: without a read, nodes stay diverged, so the
    // test above sees repair, not some other mechanism.
    let mut sim = sim(3, quorum_only(), 3);
    for node in 0..3 {
        let id = increment(
            &mut sim,
            node,
            "r",
            node as u64 + 1,
            WriteConsistency::Local,
        );
        update_answer(&mut sim, node, id);
    }
    sim.run_for(Duration::from_secs(5));
    assert_eq!(local_counter(&sim, 0, "r"), Some(1));
    assert_eq!(local_counter(&sim, 2, "r"), Some(3));
}

#[test]
fn a_write_without_a_reachable_majority_times_out_and_stays_local() {
    let mut sim = sim(3, quorum_only(), 5);
    sim.partition(&[0], &[1, 2]);
    let id = increment(&mut sim, 0, "t", 1, MAJORITY_W);
    assert_eq!(update_answer(&mut sim, 0, id), UpdateResult::Timeout);
    assert_eq!(
        local_counter(&sim, 0, "t"),
        Some(1),
        "a timed-out update is not rolled back"
    );
    let id = increment(&mut sim, 0, "t", 1, WriteConsistency::Local);
    assert_eq!(update_answer(&mut sim, 0, id), UpdateResult::Success);
    let id = get(&mut sim, 0, "t", MAJORITY_R);
    assert_eq!(get_answer(&mut sim, 0, id), GetResult::Timeout);
}

#[test]
fn weakly_up_members_receive_writes_but_do_not_count() {
    let mut sim = sim(3, quorum_only(), 9);
    let mut view = sim.membership().clone();
    view.members[2].1 = MemberStatus::WeaklyUp;
    sim.set_membership(view);
    // Nodes 0 and 1 count: a majority is both. The write reaches the WeaklyUp node too.
    let id = increment(&mut sim, 0, "w", 1, MAJORITY_W);
    assert_eq!(update_answer(&mut sim, 0, id), UpdateResult::Success);
    sim.run_for(Duration::from_millis(200));
    assert_eq!(local_counter(&sim, 2, "w"), Some(1));
    // With node 1 cut off, node 2's acknowledgement does not make a majority.
    sim.partition(&[0], &[1]);
    let id = increment(&mut sim, 0, "w", 1, MAJORITY_W);
    assert_eq!(update_answer(&mut sim, 0, id), UpdateResult::Timeout);
    assert_eq!(
        local_counter(&sim, 2, "w"),
        Some(2),
        "the WeaklyUp node got it anyway"
    );
    let id = get(&mut sim, 0, "w", MAJORITY_R);
    assert_eq!(
        get_answer(&mut sim, 0, id),
        GetResult::Timeout,
        "nor does its read reply"
    );
}

#[test]
fn a_deleted_key_stays_deleted() {
    let mut sim = sim(3, ReplicatorConfig::default(), 11);
    let id = increment(&mut sim, 0, "d", 1, MAJORITY_W);
    assert_eq!(update_answer(&mut sim, 0, id), UpdateResult::Success);
    let id = delete(&mut sim, 1, "d", MAJORITY_W);
    assert_eq!(delete_answer(&mut sim, 1, id), DeleteResult::Success);
    let id = increment(&mut sim, 2, "d", 1, WriteConsistency::Local);
    let after = update_answer(&mut sim, 2, id);
    // Node 2 may not have seen the delete yet; either way the key ends deleted everywhere.
    assert!(
        matches!(after, UpdateResult::Success | UpdateResult::Deleted),
        "{after:?}"
    );
    sim.run_for(Duration::from_secs(5));
    for node in 0..3 {
        let id = get(&mut sim, node, "d", MAJORITY_R);
        assert_eq!(
            get_answer(&mut sim, node, id),
            GetResult::Deleted,
            "node {node}"
        );
    }
    let id = increment(&mut sim, 0, "d", 1, MAJORITY_W);
    assert_eq!(update_answer(&mut sim, 0, id), UpdateResult::Deleted);
    let id = sim.submit(
        0,
        Command::Keys {
            after: None,
            limit: 10,
        },
    );
    assert_eq!(answer(&mut sim, 0, id), Response::Keys(KeysPage::default()));
}

#[test]
fn another_kind_under_a_key_is_refused_and_changes_nothing() {
    let mut sim = sim(2, quorum_only(), 2);
    let id = increment(&mut sim, 0, "k", 1, MAJORITY_W);
    assert_eq!(update_answer(&mut sim, 0, id), UpdateResult::Success);
    let id = add(&mut sim, 0, "k", "x", MAJORITY_W);
    assert!(matches!(
        update_answer(&mut sim, 0, id),
        UpdateResult::Invalid(_)
    ));
    assert_eq!(local_counter(&sim, 0, "k"), Some(1));
}

#[test]
fn subscribers_get_the_current_value_then_batched_changes() {
    let config = ReplicatorConfig {
        notify_subscribers_interval: Duration::from_millis(500),
        ..ReplicatorConfig::default()
    };
    let mut sim = sim(2, config, 4);
    let id = increment(&mut sim, 0, "s", 1, WriteConsistency::Local);
    update_answer(&mut sim, 0, id);
    let id = sim.submit(
        1,
        Command::Subscribe {
            key: "s".into(),
            subscriber: 42,
        },
    );
    answer(&mut sim, 1, id);
    sim.run_for(Duration::from_secs(2));
    // Ten quick increments on node 0 arrive at node 1's subscriber in far fewer batches.
    for _ in 0..10 {
        let id = increment(&mut sim, 0, "s", 1, WriteConsistency::Local);
        update_answer(&mut sim, 0, id);
    }
    sim.run_for(Duration::from_secs(2));
    let seen: Vec<i128> = sim
        .notifications()
        .iter()
        .filter(|(node, sub, key, _)| *node == 1 && *sub == 42 && key == "s")
        .filter_map(|(_, _, _, v)| match v {
            Some(ReplicatedValue::PNCounter(c)) => Some(c.value()),
            _ => None,
        })
        .collect();
    assert!(!seen.is_empty());
    assert_eq!(
        *seen.last().unwrap(),
        11,
        "the last notification holds the final value"
    );
    assert!(seen.len() <= 4, "changes are batched: {seen:?}");
}

#[test]
fn durable_keys_are_stored_before_the_update_is_acknowledged() {
    use tessera_ddata::replicator::{Input, Time};
    let config = ReplicatorConfig {
        durable_keys: vec!["durable-*".into()],
        ..quorum_only()
    };
    let mut replicator = tessera_ddata::replicator::Replicator::new(
        tessera_cluster::UniqueAddress::new(tessera_cluster::Address::new("h", 1), 1),
        config,
        1,
        std::time::Instant::now(),
    );
    let time = Time {
        now: std::time::Instant::now(),
        wall_ms: 0,
    };
    let update = |key: &str| Input::Command {
        id: 1,
        command: Command::Update {
            key: key.into(),
            consistency: WriteConsistency::Local,
            timeout: TIMEOUT,
            modify: Box::new(|_, ctx| {
                let mut c = tessera_ddata::PNCounter::new();
                c.increment(ctx.self_node, 1);
                Ok(c.into())
            }),
        },
    };
    let success = Output::Reply {
        id: 1,
        response: Response::Update(UpdateResult::Success),
    };
    // Not durable: acknowledged at once, nothing to store.
    assert_eq!(
        replicator.handle(time, update("other")),
        std::slice::from_ref(&success)
    );
    // Durable: the step only writes; the success waits for the write's report.
    let outputs = replicator.handle(time, update("durable-a"));
    let [Output::Store { write, key, .. }] = &outputs[..] else {
        panic!("expected only the durable write: {outputs:?}");
    };
    assert_eq!(key, "durable-a");
    assert_eq!(replicator.pending_durable_writes(), 1);
    let stored = Input::Stored {
        writes: vec![*write],
        result: Ok(()),
    };
    assert_eq!(replicator.handle(time, stored), [success]);
    assert_eq!(replicator.pending_durable_writes(), 0);
}

#[test]
fn a_restarted_node_gets_its_durable_keys_back() {
    let config = ReplicatorConfig {
        durable_keys: vec!["dur".into()],
        ..ReplicatorConfig::default()
    };
    let mut sim = sim(3, config, 8);
    let id = increment(&mut sim, 2, "dur", 5, WriteConsistency::Local);
    assert_eq!(update_answer(&mut sim, 2, id), UpdateResult::Success);
    let stored = sim.stored(2, "dur").cloned().expect("stored durably");
    sim.crash(2);
    // Nobody else has it: only the durable store can bring it back.
    sim.restart(2, vec![("dur".into(), stored)]);
    assert_eq!(local_counter(&sim, 2, "dur"), Some(5));
}

fn prune_config() -> ReplicatorConfig {
    ReplicatorConfig {
        pruning_interval: Duration::from_secs(1),
        max_pruning_dissemination: Duration::from_secs(3),
        ..ReplicatorConfig::default()
    }
}

fn without(view: &MembershipView, node: &tessera_cluster::UniqueAddress) -> MembershipView {
    MembershipView {
        members: view
            .members
            .iter()
            .filter(|(n, _)| n != node)
            .cloned()
            .collect(),
        ..view.clone()
    }
}

#[test]
fn pruning_removes_a_removed_node_from_counters_and_keeps_the_value() {
    for seed in 0..20 {
        let mut sim = sim(3, prune_config(), seed);
        for node in 0..3 {
            let id = increment(&mut sim, node, "p", 10, MAJORITY_W);
            assert_eq!(update_answer(&mut sim, node, id), UpdateResult::Success);
        }
        sim.run_for(Duration::from_secs(2));
        let removed = sim.address(2).clone();
        sim.crash(2);
        let view = without(sim.membership(), &removed);
        sim.set_membership(view);
        let pruned = sim.run_until(Duration::from_secs(60), |s| {
            (0..2).all(|n| {
                s.envelope(n, "p")
                    .and_then(|e| e.data.as_ref())
                    .is_some_and(|v| !v.modified_by_nodes().contains(&removed))
            })
        });
        assert!(
            pruned,
            "seed {seed}: node 2 is pruned from the counter on both survivors"
        );
        for node in 0..2 {
            assert_eq!(
                local_counter(&sim, node, "p"),
                Some(30),
                "seed {seed}: value kept"
            );
            let nodes: BTreeSet<_> = sim
                .envelope(node, "p")
                .unwrap()
                .data
                .as_ref()
                .unwrap()
                .modified_by_nodes();
            assert!(nodes.is_subset(&BTreeSet::from([
                sim.address(0).clone(),
                sim.address(1).clone()
            ])));
        }
    }
}

#[test]
fn without_the_pruning_protocol_a_removed_node_stays_recorded() {
    // The control for the test above: with pruning steps never due, nothing else prunes.
    let config = ReplicatorConfig {
        pruning_interval: Duration::from_secs(3600),
        ..prune_config()
    };
    let mut sim = sim(3, config, 1);
    let id = increment(&mut sim, 2, "p", 10, MAJORITY_W);
    assert_eq!(update_answer(&mut sim, 2, id), UpdateResult::Success);
    let removed = sim.address(2).clone();
    sim.crash(2);
    let view = without(sim.membership(), &removed);
    sim.set_membership(view);
    sim.run_for(Duration::from_secs(60));
    let value = sim.envelope(0, "p").unwrap().data.as_ref().unwrap();
    assert!(value.modified_by_nodes().contains(&removed));
}

#[test]
fn a_late_copy_from_before_pruning_does_not_double_count() {
    let mut sim = sim(3, prune_config(), 3);
    let id = increment(&mut sim, 2, "p", 7, MAJORITY_W);
    assert_eq!(update_answer(&mut sim, 2, id), UpdateResult::Success);
    sim.run_for(Duration::from_secs(1));
    let late_copy = sim.envelope(1, "p").cloned().unwrap();
    let removed = sim.address(2).clone();
    sim.crash(2);
    let view = without(sim.membership(), &removed);
    sim.set_membership(view);
    sim.run_until(Duration::from_secs(60), |s| {
        (0..2).all(|n| {
            !s.envelope(n, "p")
                .unwrap()
                .data
                .as_ref()
                .unwrap()
                .need_pruning_from(&removed)
        })
    });
    // Node 1 receives the old copy again (say, from a slow message).
    let id = sim.submit(
        1,
        Command::Get {
            key: "p".into(),
            consistency: ReadConsistency::Local,
            timeout: TIMEOUT,
        },
    );
    answer(&mut sim, 1, id);
    let restored = sim
        .replicator(1)
        .unwrap()
        .envelope("p")
        .unwrap()
        .merge(&late_copy);
    match restored.data {
        Some(ReplicatedValue::PNCounter(c)) => assert_eq!(c.value(), 7),
        other => panic!("{other:?}"),
    }
}

fn single(
    config: ReplicatorConfig,
) -> (
    tessera_ddata::replicator::Replicator,
    tessera_ddata::replicator::Time,
) {
    let node = tessera_cluster::UniqueAddress::new(tessera_cluster::Address::new("h", 1), 1);
    let now = std::time::Instant::now();
    let mut replicator = tessera_ddata::replicator::Replicator::new(node.clone(), config, 1, now);
    let time = tessera_ddata::replicator::Time { now, wall_ms: 0 };
    let peer = tessera_cluster::UniqueAddress::new(tessera_cluster::Address::new("h", 2), 2);
    replicator.handle(
        time,
        tessera_ddata::replicator::Input::Membership(MembershipView {
            members: vec![(node, MemberStatus::Up), (peer, MemberStatus::Up)],
            ..MembershipView::default()
        }),
    );
    (replicator, time)
}

#[test]
fn a_reply_to_an_earlier_incarnation_is_not_taken_for_an_answer() {
    use tessera_ddata::replicator::{Input, ReplicatorMessage};
    let (mut replicator, time) = single(quorum_only());
    let outputs = replicator.handle(
        time,
        Input::Command {
            id: 1,
            command: Command::Get {
                key: "y".into(),
                consistency: MAJORITY_R,
                timeout: TIMEOUT,
            },
        },
    );
    let Some(Output::Send {
        message: ReplicatorMessage::Read {
            op, incarnation, ..
        },
        ..
    }) = outputs.first()
    else {
        panic!("{outputs:?}");
    };
    let peer = tessera_cluster::UniqueAddress::new(tessera_cluster::Address::new("h", 2), 2);
    let stale = |incarnation, key: &str| Input::Message {
        from: peer.clone(),
        message: ReplicatorMessage::ReadResult {
            op: *op,
            incarnation,
            key: key.into(),
            envelope: Some(tessera_ddata::DataEnvelope::deleted()),
        },
    };
    // Same operation number, another incarnation's request, or another key: ignored.
    assert!(
        replicator
            .handle(time, stale(incarnation.wrapping_add(1), "y"))
            .is_empty()
    );
    assert!(replicator.handle(time, stale(*incarnation, "x")).is_empty());
    assert_eq!(replicator.pending_operations(), 1);
    let answered = replicator.handle(time, stale(*incarnation, "y"));
    assert!(
        answered.iter().any(|o| matches!(
            o,
            Output::Reply {
                id: 1,
                response: Response::Get(GetResult::Deleted)
            }
        )),
        "{answered:?}"
    );
}

#[test]
fn a_node_outside_any_cluster_refuses_quorum_operations() {
    let node = tessera_cluster::UniqueAddress::new(tessera_cluster::Address::new("h", 1), 1);
    let now = std::time::Instant::now();
    let mut replicator = tessera_ddata::replicator::Replicator::new(node, quorum_only(), 1, now);
    let time = tessera_ddata::replicator::Time { now, wall_ms: 0 };
    let outputs = replicator.handle(
        time,
        tessera_ddata::replicator::Input::Command {
            id: 7,
            command: Command::Get {
                key: "k".into(),
                consistency: MAJORITY_R,
                timeout: TIMEOUT,
            },
        },
    );
    assert!(
        matches!(&outputs[..], [Output::Reply { id: 7, response: Response::Get(GetResult::Failed(reason)) }] if reason.contains("not a member")),
        "{outputs:?}"
    );
}

#[test]
fn an_update_larger_than_max_value_bytes_is_refused() {
    let config = ReplicatorConfig {
        max_value_bytes: 200,
        ..quorum_only()
    };
    let mut sim = sim(2, config, 1);
    let mut last = UpdateResult::Success;
    for i in 0..50 {
        let id = add(
            &mut sim,
            0,
            "big",
            &format!("element-{i:04}"),
            WriteConsistency::Local,
        );
        last = update_answer(&mut sim, 0, id);
        if last != UpdateResult::Success {
            break;
        }
    }
    assert!(
        matches!(
            &last,
            UpdateResult::LimitReached(LimitExceeded::ValueBytes { key, size_bytes, max_value_bytes: 200 })
                if key == "big" && *size_bytes > 200
        ),
        "{last:?}"
    );
}

#[test]
fn two_kinds_created_at_once_under_one_key_converge_everywhere() {
    for seed in 0..20 {
        let mut sim = sim(3, ReplicatorConfig::default(), seed);
        sim.partition(&[0], &[1, 2]);
        let id = increment(&mut sim, 0, "k", 1, WriteConsistency::Local);
        assert_eq!(update_answer(&mut sim, 0, id), UpdateResult::Success);
        let id = add(&mut sim, 1, "k", "x", WriteConsistency::Local);
        assert_eq!(update_answer(&mut sim, 1, id), UpdateResult::Success);
        sim.heal();
        let converged = sim.run_until(Duration::from_secs(30), |s| {
            let kinds: BTreeSet<_> = (0..3)
                .map(|n| {
                    s.envelope(n, "k")
                        .and_then(|e| e.data.as_ref())
                        .map(|v| v.kind())
                })
                .collect();
            kinds.len() == 1 && !kinds.contains(&None)
        });
        assert!(converged, "seed {seed}: every replica holds the same kind");
    }
}

#[test]
fn a_leader_that_never_saw_a_node_leave_still_prunes_it() {
    // Node 2 counts, then vanishes from the view while node 0 (the leader) is cut off: the
    // leader learns of node 2 only from the data.
    let mut sim = sim(3, prune_config(), 5);
    let id = increment(&mut sim, 2, "p", 4, MAJORITY_W);
    assert_eq!(update_answer(&mut sim, 2, id), UpdateResult::Success);
    let removed = sim.address(2).clone();
    sim.crash(2);
    // A view without node 2 that never listed it as leaving: as after a leader restart.
    let view = without(sim.membership(), &removed);
    sim.set_membership(view);
    let pruned = sim.run_until(Duration::from_secs(120), |s| {
        (0..2).all(|n| {
            s.envelope(n, "p")
                .and_then(|e| e.data.as_ref())
                .is_some_and(|v| !v.need_pruning_from(&removed))
        })
    });
    assert!(pruned);
    assert_eq!(local_counter(&sim, 1, "p"), Some(4));
}

#[test]
fn a_new_leader_takes_over_an_unfinished_pruning() {
    let mut sim = sim(4, prune_config(), 8);
    let id = increment(&mut sim, 3, "p", 6, MAJORITY_W);
    assert_eq!(update_answer(&mut sim, 3, id), UpdateResult::Success);
    sim.run_for(Duration::from_secs(1));
    let removed = sim.address(3).clone();
    sim.crash(3);
    // Node 1 cannot hear node 0: node 0's initialization never gets node 1's mark.
    sim.partition(&[0], &[1]);
    let view = without(sim.membership(), &removed);
    sim.set_membership(view.clone());
    let old_leader = sim.address(0).clone();
    let started = sim.run_until(Duration::from_secs(60), |s| {
        s.envelope(2, "p").is_some_and(|e| {
            matches!(e.pruning.get(&removed),
                Some(tessera_ddata::PruningState::Initialized { owner, .. }) if owner == &old_leader)
        })
    });
    assert!(
        started,
        "node 0 started the pruning and node 2 holds its marker"
    );
    // Node 0 crashes; node 1 leads now and must finish the job on its own.
    sim.crash(0);
    sim.heal();
    let mut view = without(&view, &old_leader);
    view.leader = Some(sim.address(1).clone());
    sim.set_membership(view);
    let pruned = sim.run_until(Duration::from_secs(120), |s| {
        (1..3).all(|n| {
            s.envelope(n, "p")
                .and_then(|e| e.data.as_ref())
                .is_some_and(|v| {
                    !v.need_pruning_from(&removed) && !v.need_pruning_from(&old_leader)
                })
        })
    });
    assert!(pruned, "the new leader prunes both removed nodes");
    assert_eq!(local_counter(&sim, 2, "p"), Some(6));
}

#[test]
fn keys_come_in_pages_in_order_without_deleted_ones() {
    let mut sim = sim(3, quorum_only(), 7);
    for key in ["k3", "k1", "k5", "k2", "k4"] {
        let id = increment(&mut sim, 0, key, 1, WriteConsistency::Local);
        assert_eq!(update_answer(&mut sim, 0, id), UpdateResult::Success);
    }
    let id = delete(&mut sim, 0, "k2", WriteConsistency::Local);
    answer(&mut sim, 0, id);
    let mut page = |after: Option<&str>, limit: usize| {
        let id = sim.submit(
            0,
            Command::Keys {
                after: after.map(str::to_string),
                limit,
            },
        );
        match answer(&mut sim, 0, id) {
            Response::Keys(page) => page,
            other => panic!("expected keys, got {other:?}"),
        }
    };
    let first = page(None, 2);
    assert_eq!(first.keys, ["k1", "k3"]);
    assert!(first.more);
    let second = page(Some("k3"), 2);
    assert_eq!(second.keys, ["k4", "k5"]);
    assert!(!second.more);
    let all = page(None, 10);
    assert_eq!(all.keys, ["k1", "k3", "k4", "k5"]);
}
