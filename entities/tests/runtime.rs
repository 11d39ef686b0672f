//! The entity runtime against in-memory stores: stashing and its bound, passivation and the
//! hand-over of commands that arrive meanwhile, snapshots and their retention, recovery, and
//! failures that must reach the caller.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;
use support::{Fixture, TallyCommand, TooLow, config, eventually, pid};
use tessera_entities::{AskError, EntityConfig, EntityError};
use tessera_journal::Manifest;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_get_replies_from_the_new_state_and_survive_a_restart() {
    let fixture = Fixture::new();
    let host = fixture.host(config());
    assert_eq!(host.ask("a", TallyCommand::Add(5)).await, Ok(5));
    assert_eq!(
        host.ask("a", TallyCommand::AddAll(vec![1, 2, 3])).await,
        Ok(11)
    );
    assert_eq!(host.ask("b", TallyCommand::Add(1)).await, Ok(1));
    assert_eq!(host.ask("a", TallyCommand::Get).await, Ok(11));
    host.shutdown().await;

    let appends = fixture.journal.appends();
    assert_eq!(appends.len(), 3);
    assert_eq!(
        (appends[1].first, appends[1].count),
        (2, 3),
        "persist_all is one atomic write"
    );
    let restarted = fixture.host(config());
    assert_eq!(restarted.ask("a", TallyCommand::Get).await, Ok(11));
    assert_eq!(restarted.ask("b", TallyCommand::Get).await, Ok(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_command_persists_nothing() {
    let fixture = Fixture::new();
    let host = fixture.host(config());
    assert_eq!(host.ask("a", TallyCommand::Add(3)).await, Ok(3));
    let before = fixture.journal.sequence_nrs(&pid("a"));
    assert_eq!(
        host.ask("a", TallyCommand::Sub(10)).await,
        Err(AskError::Rejected(TooLow {
            total: 3,
            requested: 10
        }))
    );
    assert_eq!(fixture.journal.sequence_nrs(&pid("a")), before);
    assert_eq!(host.ask("a", TallyCommand::Get).await, Ok(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_stash_refuses_with_a_clear_error_and_the_stashed_commands_complete() {
    let fixture = Fixture::new();
    let host = fixture.host(EntityConfig {
        stash_capacity: 3,
        ..config()
    });
    let entity = host.entity_ref("a").unwrap();
    assert_eq!(entity.ask(TallyCommand::Add(1)).await, Ok(1));

    fixture.journal.append_gate.close();
    let in_flight = entity.ask(TallyCommand::Add(1));
    // The write is held at the gate: everything after it waits in the stash.
    eventually("first write in flight", || {
        fixture.journal.appends().len() == 1 && fixture.journal.replays().len() == 1
    })
    .await;
    let stashed: Vec<_> = (0..3).map(|_| entity.ask(TallyCommand::Add(1))).collect();
    let overflow = entity.ask(TallyCommand::Add(1)).await;
    match overflow {
        Err(AskError::Entity(EntityError::StashFull { entity, capacity })) => {
            assert_eq!((entity.as_str(), capacity), ("tally|a", 3));
        }
        other => panic!("expected StashFull, got {other:?}"),
    }
    let message = EntityError::StashFull {
        entity: "tally|a".into(),
        capacity: 3,
    }
    .to_string();
    assert!(
        message.contains("stash of tally|a is full (3 commands"),
        "{message}"
    );

    fixture.journal.append_gate.release();
    assert_eq!(in_flight.await, Ok(2));
    let mut replies = Vec::new();
    for ask in stashed {
        replies.push(ask.await.unwrap());
    }
    assert_eq!(replies, [3, 4, 5], "stashed commands run in arrival order");
    assert_eq!(entity.ask(TallyCommand::Get).await, Ok(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_times_out_while_the_write_hangs() {
    let fixture = Fixture::new();
    let host = fixture.host(config());
    let entity = host.entity_ref("a").unwrap();
    fixture.journal.append_gate.close();
    let reply = entity
        .ask_with_timeout(TallyCommand::Add(1), Duration::from_millis(50))
        .await;
    assert!(
        matches!(reply, Err(AskError::Entity(EntityError::Timeout { .. }))),
        "{reply:?}"
    );
    fixture.journal.append_gate.release();
    // The command was still carried out: a timeout says nothing about the outcome.
    assert_eq!(entity.ask(TallyCommand::Get).await, Ok(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_entity_passivates_and_its_next_command_recovers_the_state() {
    let fixture = Fixture::new();
    let host = fixture.host(EntityConfig {
        passivate_after: Some(Duration::from_millis(30)),
        ..config()
    });
    assert_eq!(host.ask("a", TallyCommand::Add(7)).await, Ok(7));
    assert_eq!(host.stats().live_entities, 1);
    eventually("idle passivation", || host.stats().live_entities == 0).await;
    assert_eq!(host.ask("a", TallyCommand::Add(1)).await, Ok(8));
    assert_eq!(
        fixture.journal.replays().len(),
        2,
        "the new incarnation recovered"
    );
    let stats = host.stats();
    assert_eq!((stats.live_entities, stats.incarnations_started), (1, 2));
    let writers: Vec<String> = fixture
        .journal
        .appends()
        .into_iter()
        .map(|a| a.writer_id)
        .collect();
    assert_ne!(
        writers[0], writers[1],
        "a new incarnation wrote the second event"
    );
}

/// A stopping incarnation finishes its snapshot job before it reports; commands that arrive
/// meanwhile are held and go, in order, to the next incarnation, which sees every event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_that_arrive_while_an_entity_stops_reach_the_next_incarnation() {
    let fixture = Fixture::new();
    let host = fixture.host(EntityConfig {
        snapshot_every: 1,
        ..config()
    });
    let entity = host.entity_ref("a").unwrap();
    fixture.snapshots.save_gate.close();
    // The snapshot of event 1 hangs, so the stop below cannot finish.
    assert_eq!(entity.ask(TallyCommand::AddAndStop(1)).await, Ok(1));
    let during: Vec<_> = (2..=4).map(|n| entity.ask(TallyCommand::Add(n))).collect();
    eventually("commands held for the next incarnation", || {
        host.stats().incarnations_started == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        fixture.journal.appends().len(),
        1,
        "nothing ran while stopping"
    );
    assert_eq!(
        host.stats().live_entities,
        1,
        "the old incarnation is still finishing"
    );

    fixture.snapshots.save_gate.release();
    let mut replies = Vec::new();
    for ask in during {
        replies.push(ask.await.unwrap());
    }
    assert_eq!(replies, [3, 6, 10]);
    let stats = host.stats();
    assert_eq!(stats.incarnations_started, 2);
    assert_eq!(stats.commands_handed_over, 3);
    fixture.journal.assert_one_writer_at_a_time();
}

/// Idle passivation every millisecond while many callers keep sending: every command is
/// answered exactly once, no update is lost, and two incarnations never write at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passivation_with_commands_in_flight_loses_nothing() {
    let fixture = Fixture::new();
    let host = std::sync::Arc::new(fixture.host(EntityConfig {
        passivate_after: Some(Duration::from_millis(1)),
        host_partitions: 1,
        ..config()
    }));
    let callers = 8u64;
    let per_caller = 60u64;
    let mut tasks = Vec::new();
    for caller in 0..callers {
        let host = host.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..per_caller {
                let id = if i % 2 == 0 { "hot" } else { "warm" };
                host.ask(id, TallyCommand::Add(1)).await.unwrap();
                // Gaps around the idle timeout, so passivations race with commands.
                let pause = (caller * 7 + i * 13) % 3;
                tokio::time::sleep(Duration::from_micros(500 * pause)).await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let hot = host.ask("hot", TallyCommand::Get).await.unwrap();
    let warm = host.ask("warm", TallyCommand::Get).await.unwrap();
    assert_eq!(hot + warm, callers * per_caller);
    assert_eq!(hot, callers * per_caller / 2);
    let stats = host.stats();
    println!("passivation race: {stats:?}");
    assert!(stats.incarnations_started > 2, "{stats:?}");
    fixture.journal.assert_one_writer_at_a_time();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_taken_every_n_events_and_only_the_last_k_kept() {
    let fixture = Fixture::new();
    let host = fixture.host(EntityConfig {
        snapshot_every: 10,
        keep_snapshots: 2,
        ..config()
    });
    for n in 1..=55u64 {
        assert_eq!(host.ask("a", TallyCommand::Add(1)).await, Ok(n));
    }
    // One write crossing a multiple takes one snapshot, at the write's end.
    assert_eq!(
        host.ask("a", TallyCommand::AddAll(vec![1; 7])).await,
        Ok(62)
    );
    host.shutdown().await;
    assert_eq!(fixture.snapshots.sequence_nrs(&pid("a")), [50, 62]);
    assert_eq!(
        fixture.journal.sequence_nrs(&pid("a")).len(),
        62,
        "events are kept unless delete_events_on_snapshot"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_events_on_snapshot_keeps_what_the_oldest_kept_snapshot_needs() {
    let fixture = Fixture::new();
    let config = EntityConfig {
        snapshot_every: 10,
        keep_snapshots: 2,
        delete_events_on_snapshot: true,
        ..config()
    };
    let host = fixture.host(config.clone());
    for _ in 0..45 {
        host.ask("a", TallyCommand::Add(2)).await.unwrap();
    }
    host.shutdown().await;
    assert_eq!(fixture.snapshots.sequence_nrs(&pid("a")), [30, 40]);
    let events = fixture.journal.sequence_nrs(&pid("a"));
    assert_eq!(events.first(), Some(&30), "events up to 29 deleted");
    assert_eq!(events.last(), Some(&45));

    let restarted = fixture.host(config);
    assert_eq!(restarted.ask("a", TallyCommand::Get).await, Ok(90));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_starts_from_the_latest_snapshot_and_replays_only_later_events() {
    let fixture = Fixture::new();
    let config = EntityConfig {
        snapshot_every: 10,
        ..config()
    };
    let host = fixture.host(config.clone());
    for _ in 0..25 {
        host.ask("a", TallyCommand::Add(3)).await.unwrap();
    }
    host.shutdown().await;
    assert_eq!(fixture.snapshots.sequence_nrs(&pid("a")), [10, 20]);

    let restarted = fixture.host(config);
    assert_eq!(restarted.ask("a", TallyCommand::Get).await, Ok(75));
    assert_eq!(
        fixture.journal.replays().last(),
        Some(&(pid("a"), 21)),
        "replayed from after the snapshot"
    );
    // And it keeps going from there.
    assert_eq!(restarted.ask("a", TallyCommand::Add(1)).await, Ok(76));
    assert_eq!(fixture.journal.sequence_nrs(&pid("a")).last(), Some(&26));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_recovery_reaches_every_waiting_caller_and_the_next_command_retries() {
    let fixture = Fixture::new();
    let host = fixture.host(config());
    host.ask("a", TallyCommand::Add(4)).await.unwrap();
    host.shutdown().await;

    let host = fixture.host(config());
    fixture.journal.fail_replays.store(true, Ordering::SeqCst);
    let entity = host.entity_ref("a").unwrap();
    let asks: Vec<_> = (0..3).map(|_| entity.ask(TallyCommand::Get)).collect();
    for ask in asks {
        match ask.await {
            Err(AskError::Entity(EntityError::RecoveryFailed { entity, reason })) => {
                assert_eq!(entity, "tally|a");
                assert!(reason.contains("injected replay failure"), "{reason}");
            }
            other => panic!("expected RecoveryFailed, got {other:?}"),
        }
    }
    eventually("failed entity stopped", || host.stats().live_entities == 0).await;

    fixture.journal.fail_replays.store(false, Ordering::SeqCst);
    assert_eq!(
        entity.ask(TallyCommand::Get).await,
        Ok(4),
        "a new incarnation recovers"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_that_cannot_be_loaded_or_decoded_fails_recovery_with_its_reason() {
    let fixture = Fixture::new();
    let host = fixture.host(config());
    fixture.snapshots.fail_loads.store(true, Ordering::SeqCst);
    let error = host
        .ask("a", TallyCommand::Get)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with("recovery of tally|a failed: loading the latest snapshot"),
        "{error}"
    );
    fixture.snapshots.fail_loads.store(false, Ordering::SeqCst);

    fixture
        .snapshots
        .insert(&pid("b"), 3, Manifest::new("tally.State", 9), vec![1, 2]);
    let error = host
        .ask("b", TallyCommand::Get)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("snapshot at 3: unknown manifest tally.State@9"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_events_fail_recovery_instead_of_giving_a_wrong_state() {
    let fixture = Fixture::new();
    let host = fixture.host(config());
    for _ in 0..5 {
        host.ask("a", TallyCommand::Add(1)).await.unwrap();
    }
    host.shutdown().await;
    use tessera_journal::Journal;
    support::SharedJournal(fixture.journal.clone())
        .delete_to(&pid("a"), 2)
        .await
        .unwrap();
    let host = fixture.host(config());
    let error = host
        .ask("a", TallyCommand::Get)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("event 1 is missing"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persist_failure_fails_its_caller_and_hands_the_stash_to_the_next_incarnation() {
    let fixture = Fixture::new();
    let host = fixture.host(config());
    let entity = host.entity_ref("a").unwrap();
    assert_eq!(entity.ask(TallyCommand::Add(1)).await, Ok(1));
    fixture.journal.append_gate.close();
    fixture.journal.fail_appends.store(true, Ordering::SeqCst);
    let failing = tokio::spawn({
        let entity = entity.clone();
        async move { entity.ask(TallyCommand::Add(1)).await }
    });
    eventually("write in flight", || host.stats().live_entities == 1).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    let stashed = tokio::spawn({
        let entity = entity.clone();
        async move { entity.ask(TallyCommand::Add(1)).await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    // The failing write's outcome is unknown (a storage error); the stashed command was
    // never handled, so it waits for the next incarnation, whose write goes through.
    fixture.journal.fail_appends.store(false, Ordering::SeqCst);
    fixture.journal.fail_next_appends.store(1, Ordering::SeqCst);
    fixture.journal.append_gate.release();
    match failing.await.unwrap() {
        Err(AskError::Entity(EntityError::PersistFailed { entity, reason })) => {
            assert_eq!(entity, "tally|a");
            assert!(reason.contains("injected append failure"), "{reason}");
        }
        other => panic!("expected PersistFailed, got {other:?}"),
    }
    assert_eq!(stashed.await.unwrap(), Ok(2));
    assert_eq!(host.stats().incarnations_started, 2);
    assert_eq!(entity.ask(TallyCommand::Get).await, Ok(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_wait_for_the_journal_to_confirm_the_state_and_fail_when_it_cannot() {
    let fixture = Fixture::new();
    fixture.journal.confirm_reads.store(true, Ordering::SeqCst);
    let host = fixture.host(config());
    let entity = host.entity_ref("a").unwrap();
    assert_eq!(entity.ask(TallyCommand::Add(3)).await, Ok(3));
    assert_eq!(entity.ask(TallyCommand::Get).await, Ok(3));
    // A rejection is an answer from the state too.
    assert!(matches!(
        entity.ask(TallyCommand::Sub(10)).await,
        Err(AskError::Rejected(_))
    ));
    fixture.journal.fail_confirms.store(true, Ordering::SeqCst);
    match entity.ask(TallyCommand::Get).await {
        Err(AskError::Entity(EntityError::NotConfirmed { entity, reason })) => {
            assert_eq!(entity, "tally|a");
            assert!(reason.contains("took the log over"), "{reason}");
        }
        other => panic!("expected NotConfirmed, got {other:?}"),
    }
    fixture.journal.fail_confirms.store(false, Ordering::SeqCst);
    // The entity stopped; the next command recovers it afresh.
    assert_eq!(entity.ask(TallyCommand::Get).await, Ok(3));
    assert_eq!(host.stats().incarnations_started, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_stops_only_its_entity() {
    let fixture = Fixture::new();
    let host = fixture.host(config());
    host.ask("a", TallyCommand::Add(2)).await.unwrap();
    let reply = host.ask("a", TallyCommand::Panic { blocking_ms: 0 }).await;
    assert!(
        matches!(reply, Err(AskError::Entity(EntityError::Stopped { .. }))),
        "{reply:?}"
    );
    assert_eq!(host.ask("a", TallyCommand::Get).await, Ok(2));
    assert_eq!(host.ask("b", TallyCommand::Add(1)).await, Ok(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_queued_behind_a_panicking_handler_reach_the_next_incarnation() {
    let fixture = Fixture::new();
    let host = fixture.host(config());
    let entity = host.entity_ref("a").unwrap();
    assert_eq!(entity.ask(TallyCommand::Add(2)).await, Ok(2));
    let panicking = tokio::spawn({
        let entity = entity.clone();
        async move { entity.ask(TallyCommand::Panic { blocking_ms: 300 }).await }
    });
    // While the handler blocks, these wait in its incarnation's mailbox.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let queued: Vec<_> = (0..3)
        .map(|_| {
            let entity = entity.clone();
            tokio::spawn(async move { entity.ask(TallyCommand::Add(1)).await })
        })
        .collect();
    let reply = panicking.await.unwrap();
    assert!(
        matches!(reply, Err(AskError::Entity(EntityError::Stopped { .. }))),
        "{reply:?}"
    );
    let mut totals = Vec::new();
    for ask in queued {
        totals.push(ask.await.unwrap().unwrap());
    }
    totals.sort_unstable();
    assert_eq!(totals, vec![3, 4, 5]);
    assert_eq!(entity.ask(TallyCommand::Get).await, Ok(5));
    assert_eq!(host.stats().incarnations_started, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_accepted_commands_then_refuses_new_ones() {
    let fixture = Fixture::new();
    let host = fixture.host(config());
    let entity = host.entity_ref("a").unwrap();
    entity.ask(TallyCommand::Add(1)).await.unwrap();
    fixture.journal.append_gate.close();
    let accepted: Vec<_> = (0..5).map(|_| entity.ask(TallyCommand::Add(1))).collect();
    eventually("write in flight", || fixture.journal.replays().len() == 1).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    let releaser = {
        let gate = fixture.journal.append_gate.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            gate.release();
        })
    };
    host.shutdown().await;
    releaser.await.unwrap();
    let mut replies = Vec::new();
    for ask in accepted {
        replies.push(ask.await.unwrap());
    }
    assert_eq!(replies, [2, 3, 4, 5, 6]);
    assert_eq!(
        entity.ask(TallyCommand::Get).await,
        Err(AskError::Entity(EntityError::ShuttingDown))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_ids_are_refused_before_anything_is_sent() {
    let fixture = Fixture::new();
    let host = fixture.host(config());
    for (id, needle) in [("", "must not be empty"), ("a\u{7}b", "control character")] {
        let error = host
            .ask(id, TallyCommand::Get)
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains(needle), "{id:?}: {error}");
    }
    let long = "x".repeat(300);
    assert!(host.entity_ref(&long).is_err());
    assert_eq!(host.stats().incarnations_started, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_journal_queue_fails_only_that_command() {
    let fixture = Fixture::new();
    let host = fixture.host(config());
    assert_eq!(host.ask("a", TallyCommand::Add(1)).await, Ok(1));
    fixture.journal.queue_full.store(true, Ordering::SeqCst);
    match host.ask("a", TallyCommand::Add(1)).await {
        Err(AskError::Entity(e @ EntityError::JournalBusy { .. })) => assert!(e.is_overload()),
        other => panic!("expected JournalBusy, got {other:?}"),
    }
    fixture.journal.queue_full.store(false, Ordering::SeqCst);
    assert_eq!(host.ask("a", TallyCommand::Add(1)).await, Ok(2));
    assert_eq!(
        fixture.journal.replays().len(),
        1,
        "the entity did not stop and recover"
    );
}
