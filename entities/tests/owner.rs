//! What the owner of a host (cluster sharding) relies on: stopping a set of entities and
//! knowing when they have stopped (writes in flight included), listing the live ids, hearing
//! why each entity stopped, and the active-entity limit with least-recently-used eviction.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use support::{Fixture, Recorder, TallyCommand, config, eventually};
use tessera_entities::{
    ActiveEntityBudget, EntityConfig, EntityHost, EntityId, EntityLifecycle, StopReason,
};

fn id(text: &str) -> EntityId {
    EntityId::new(text).unwrap()
}

fn ids<'a>(texts: impl IntoIterator<Item = &'a str>) -> Vec<EntityId> {
    texts.into_iter().map(id).collect()
}

async fn live_ids<E: tessera_entities::EntityType>(host: &EntityHost<E>) -> BTreeSet<String> {
    host.live_entity_ids()
        .await
        .into_iter()
        .map(|id| id.as_str().to_string())
        .collect()
}

fn set<'a>(texts: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    texts.into_iter().map(str::to_string).collect()
}

fn stopped(text: &str, reason: StopReason) -> EntityLifecycle {
    EntityLifecycle::Stopped {
        id: id(text),
        reason,
    }
}

fn started(text: &str) -> EntityLifecycle {
    EntityLifecycle::Started { id: id(text) }
}

/// The handoff case: the entity's write is held in the journal; the stop resolves only once
/// it is stored and answered, and the commands stashed behind it ran too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_entities_waits_for_the_write_in_flight_and_the_stash() {
    let fixture = Fixture::new();
    let host = fixture.host(config());
    let entity = host.entity_ref("a").unwrap();
    assert_eq!(entity.ask(TallyCommand::Add(1)).await, Ok(1));
    fixture.journal.append_gate.close();
    let in_flight = entity.ask(TallyCommand::Add(2));
    eventually("the write reaches the journal", || {
        fixture.journal.replays().len() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    let stashed = entity.ask(TallyCommand::Add(3));

    let mut stop = Box::pin(host.stop_entities(ids(["a", "never-started"])));
    assert!(
        tokio::time::timeout(Duration::from_millis(100), &mut stop)
            .await
            .is_err(),
        "resolved while the write was in flight"
    );
    assert_eq!(host.stats().live_entities, 1);

    fixture.journal.append_gate.release();
    stop.await;
    assert_eq!(host.stats().live_entities, 0, "resolved before the stop");
    assert!(live_ids(&host).await.is_empty());
    assert_eq!(in_flight.await, Ok(3));
    assert_eq!(stashed.await, Ok(6), "the stash ran before the stop");
    assert_eq!(fixture.journal.appends().len(), 3);

    // The next command starts a new incarnation, which recovers everything.
    assert_eq!(entity.ask(TallyCommand::Get).await, Ok(6));
    assert_eq!(fixture.journal.replays().len(), 2);
    fixture.journal.assert_one_writer_at_a_time();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_entities_of_ids_not_live_resolves_at_once() {
    let fixture = Fixture::new();
    let host = fixture.host(config());
    host.ask("a", TallyCommand::Add(1)).await.unwrap();
    let quick = Duration::from_secs(1);
    tokio::time::timeout(quick, host.stop_entities(ids(["b", "c"])))
        .await
        .expect("ids with nothing running are stopped");
    tokio::time::timeout(quick, host.stop_entities(Vec::new()))
        .await
        .expect("no ids");
    assert_eq!(live_ids(&host).await, set(["a"]), "others untouched");
    host.shutdown().await;
    tokio::time::timeout(quick, host.stop_entities(ids(["a"])))
        .await
        .expect("a shut-down host runs nothing");
}

/// An entity that stopped itself but is still finishing (its snapshot hangs) is waited for,
/// and the command held for its next incarnation is handled before the stop resolves: after
/// it, nothing of the entity runs here, and nothing was dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_entities_waits_for_a_stopping_entity_and_handles_its_held_commands() {
    let fixture = Fixture::new();
    let recorder = Recorder::default();
    let host = fixture.host_recorded(
        EntityConfig {
            snapshot_every: 1,
            ..config()
        },
        &recorder,
    );
    let entity = host.entity_ref("a").unwrap();
    fixture.snapshots.save_gate.close();
    assert_eq!(entity.ask(TallyCommand::AddAndStop(1)).await, Ok(1));
    let held = entity.ask(TallyCommand::Add(2));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut stop = Box::pin(host.stop_entities(ids(["a"])));
    assert!(
        tokio::time::timeout(Duration::from_millis(50), &mut stop)
            .await
            .is_err(),
        "resolved while the snapshot was in flight"
    );

    fixture.snapshots.save_gate.release();
    stop.await;
    assert_eq!(held.await, Ok(3));
    assert_eq!(host.stats().live_entities, 0);
    assert!(live_ids(&host).await.is_empty());
    assert_eq!(
        recorder.events_of("a"),
        [
            started("a"),
            stopped("a", StopReason::StopEffect),
            started("a"),
            stopped("a", StopReason::StopRequested),
        ]
    );
    fixture.journal.assert_one_writer_at_a_time();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_entity_ids_lists_the_entities_running_on_the_host() {
    let fixture = Fixture::new();
    let host = fixture.host(config());
    assert!(live_ids(&host).await.is_empty());
    let names: Vec<String> = (0..40).map(|n| format!("e{n}")).collect();
    for name in &names {
        host.ask(name, TallyCommand::Add(1)).await.unwrap();
    }
    let all = live_ids(&host).await;
    assert_eq!(all, names.iter().cloned().collect::<BTreeSet<_>>());
    assert_eq!(host.live_entity_ids().await.len(), 40, "each id once");

    host.stop_entities(ids(["e3", "e17"])).await;
    let mut expected = all;
    expected.remove("e3");
    expected.remove("e17");
    assert_eq!(live_ids(&host).await, expected);
    host.shutdown().await;
    assert!(live_ids(&host).await.is_empty());
}

/// Each way of stopping reaches the listener with its reason; only passivations (idle
/// timeout, eviction, stop effect) count as such for remember-entities.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_events_say_why_each_entity_stopped() {
    let fixture = Fixture::new();
    let recorder = Recorder::default();
    let idle_host = fixture.host_recorded(
        EntityConfig {
            passivate_after: Some(Duration::from_millis(30)),
            ..config()
        },
        &recorder,
    );
    idle_host.ask("idle", TallyCommand::Add(1)).await.unwrap();
    eventually("idle passivation", || recorder.events_of("idle").len() == 2).await;
    assert_eq!(
        recorder.events_of("idle"),
        [started("idle"), stopped("idle", StopReason::IdleTimeout)]
    );

    let host = fixture.host_recorded(
        EntityConfig {
            host_partitions: 1,
            active_entity_limit: Some(2),
            ..config()
        },
        &recorder,
    );
    let stopped_with = |name: &'static str| {
        let recorder = recorder.clone();
        move || {
            recorder
                .events_of(name)
                .iter()
                .any(|e| matches!(e, EntityLifecycle::Stopped { .. }))
        }
    };
    host.ask("effect", TallyCommand::Stop).await.unwrap();
    eventually("stop effect", stopped_with("effect")).await;
    fixture.journal.fail_next_appends.store(1, Ordering::SeqCst);
    assert!(host.ask("broken", TallyCommand::Add(1)).await.is_err());
    eventually("failed write", stopped_with("broken")).await;
    host.ask("old", TallyCommand::Add(1)).await.unwrap();
    host.ask("requested", TallyCommand::Add(1)).await.unwrap();
    host.ask("new", TallyCommand::Add(1)).await.unwrap();
    eventually("eviction", stopped_with("old")).await;
    host.stop_entities(ids(["requested"])).await;
    host.shutdown().await;
    idle_host.shutdown().await;

    let reason_of = |name: &str| {
        recorder.events_of(name).iter().find_map(|e| match e {
            EntityLifecycle::Stopped { reason, .. } => Some(*reason),
            EntityLifecycle::Started { .. } => None,
        })
    };
    let expected = [
        ("idle", StopReason::IdleTimeout, true),
        ("effect", StopReason::StopEffect, true),
        ("broken", StopReason::Failed, false),
        ("old", StopReason::Evicted, true),
        ("requested", StopReason::StopRequested, false),
        ("new", StopReason::HostShutdown, false),
    ];
    for (name, reason, passivation) in expected {
        assert_eq!(reason_of(name), Some(reason), "{name}");
        assert_eq!(reason.is_passivation(), passivation, "{name}");
        assert_eq!(
            recorder.events_of(name),
            [started(name), stopped(name, reason)],
            "{name}: one start, then one stop"
        );
    }
}

/// One partition, a limit of 3: each new entity evicts the one whose last command is oldest,
/// the limit is never exceeded, and an evicted entity's next command recovers its state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_least_recently_used_entity_is_evicted_at_the_limit_and_recovers_later() {
    let fixture = Fixture::new();
    let recorder = Recorder::default();
    let host = fixture.host_recorded(
        EntityConfig {
            host_partitions: 1,
            active_entity_limit: Some(3),
            ..config()
        },
        &recorder,
    );
    let evicted = || {
        recorder
            .events()
            .into_iter()
            .filter_map(|e| match e {
                EntityLifecycle::Stopped {
                    id,
                    reason: StopReason::Evicted,
                } => Some(id.as_str().to_string()),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let host = &host;
    let ask = |name: &'static str, command: TallyCommand| async move {
        let reply = host.ask(name, command).await;
        assert!(host.stats().active_entities <= 3, "{:?}", host.stats());
        reply
    };
    assert_eq!(ask("a", TallyCommand::Add(1)).await, Ok(1));
    assert_eq!(ask("b", TallyCommand::Add(2)).await, Ok(2));
    assert_eq!(ask("c", TallyCommand::Add(3)).await, Ok(3));
    assert_eq!(ask("a", TallyCommand::Get).await, Ok(1), "a used after c");
    assert_eq!(ask("d", TallyCommand::Add(4)).await, Ok(4));
    eventually("b evicted", || evicted() == ["b"]).await;
    assert_eq!(live_ids(host).await, set(["a", "c", "d"]));
    assert_eq!(ask("e", TallyCommand::Add(5)).await, Ok(5));
    eventually("c evicted", || evicted() == ["b", "c"]).await;
    assert_eq!(live_ids(host).await, set(["a", "d", "e"]));

    // b comes back with its state, evicting a, now the least recently used.
    assert_eq!(ask("b", TallyCommand::Add(10)).await, Ok(12));
    eventually("a evicted", || evicted() == ["b", "c", "a"]).await;
    assert_eq!(live_ids(host).await, set(["b", "d", "e"]));
    let stats = host.stats();
    assert_eq!(
        (
            stats.entities_evicted,
            stats.active_entities,
            stats.live_entities
        ),
        (3, 3, 3)
    );
    assert_eq!(
        fixture
            .journal
            .replays()
            .iter()
            .filter(|(pid, _)| pid == "tally|b")
            .count(),
        2,
        "b recovered from the journal"
    );
}

/// Many callers over more ids than the limit, on several partitions: a sampler never sees more
/// active entities than the limit, every update lands, and two incarnations never write at
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_active_entity_limit_holds_under_concurrent_callers() {
    let fixture = Fixture::new();
    let limit = 8;
    let host = Arc::new(fixture.host(EntityConfig {
        host_partitions: 4,
        active_entity_limit: Some(limit),
        ..config()
    }));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let host = host.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let mut most = 0;
            while !done.load(Ordering::SeqCst) {
                most = most.max(host.stats().active_entities);
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            most
        })
    };
    let ids_count = 40u64;
    let rounds = 5u64;
    let mut callers = Vec::new();
    for caller in 0..8u64 {
        let host = host.clone();
        callers.push(tokio::spawn(async move {
            for round in 0..rounds {
                for n in 0..ids_count / 8 {
                    let name = format!("e{}", (caller * 5 + n + round * 3) % ids_count);
                    host.ask(&name, TallyCommand::Add(1)).await.unwrap();
                }
            }
        }));
    }
    for caller in callers {
        caller.await.unwrap();
    }
    done.store(true, Ordering::SeqCst);
    let most = sampler.await.unwrap();
    assert!(
        most <= limit as u64,
        "{most} active entities, limit {limit}"
    );
    let stats = host.stats();
    assert!(stats.entities_evicted > 0, "{stats:?}");
    let mut total = 0;
    for n in 0..ids_count {
        total += host.ask(&format!("e{n}"), TallyCommand::Get).await.unwrap();
        assert!(host.stats().active_entities <= limit as u64);
    }
    assert_eq!(total, 8 * rounds * (ids_count / 8));
    fixture.journal.assert_one_writer_at_a_time();
}

/// Two hosts (two entity types of a node) share a budget of 3 active entities: the second
/// type starts although the first filled the budget (at most one entity per partition
/// beyond the limit), then evicts its own least recently used entity at each new one; every
/// evicted entity's next command finds its state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_sharing_a_node_budget_evict_within_it() {
    let fixture = Fixture::new();
    let budget = ActiveEntityBudget::new(3).unwrap();
    let shared = || EntityConfig {
        host_partitions: 1,
        node_budget: Some(budget.clone()),
        ..config()
    };
    let first = fixture.host(shared());
    let second = fixture.host(shared());
    let active = || first.stats().active_entities + second.stats().active_entities;
    for name in ["a", "b", "c"] {
        assert_eq!(first.ask(name, TallyCommand::Add(1)).await, Ok(1));
    }
    assert_eq!((budget.active(), active()), (3, 3));
    // The first host at the limit evicts its own least recently used entity.
    assert_eq!(first.ask("d", TallyCommand::Add(1)).await, Ok(1));
    assert_eq!(first.stats().entities_evicted, 1);
    // The evicted entity stops on its own task, after the eviction was counted.
    eventually("the evicted entity stopped", || {
        first.stats().live_entities == 3
    })
    .await;
    assert_eq!(live_ids(&first).await.len(), 3);
    // The second host, with nothing running, is not locked out: one over the limit.
    assert_eq!(second.ask("x", TallyCommand::Add(2)).await, Ok(2));
    assert_eq!(budget.active(), 4);
    for (n, name) in ["y", "z", "w"].into_iter().enumerate() {
        assert_eq!(second.ask(name, TallyCommand::Add(2)).await, Ok(2));
        assert_eq!(second.stats().entities_evicted, n as u64 + 1);
        assert!(budget.active() <= 3 + 2, "{budget:?}");
        assert_eq!(budget.active() as u64, active());
    }
    eventually("evicted entities stopped", || {
        first.stats().live_entities + second.stats().live_entities == 4
    })
    .await;
    // Evicted, not forgotten: "a" and "x" recover their state.
    assert_eq!(first.ask("a", TallyCommand::Add(1)).await, Ok(2));
    assert_eq!(second.ask("x", TallyCommand::Get).await, Ok(2));
    assert!(budget.active() <= 3 + 2, "{budget:?}");
    first.shutdown().await;
    second.shutdown().await;
    assert_eq!(budget.active(), 0);
}

/// An entity evicted while its write is in flight finishes the write (its caller gets the
/// reply) before its next incarnation recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entity_evicted_during_a_write_finishes_it_before_recovering() {
    let fixture = Fixture::new();
    let host = fixture.host(EntityConfig {
        host_partitions: 1,
        active_entity_limit: Some(1),
        ..config()
    });
    assert_eq!(host.ask("a", TallyCommand::Add(1)).await, Ok(1));
    fixture.journal.append_gate.close();
    let in_flight = host.entity_ref("a").unwrap().ask(TallyCommand::Add(1));
    tokio::time::sleep(Duration::from_millis(20)).await;
    // b evicts a while a's write waits at the gate; a's next command waits for a to finish.
    assert_eq!(host.ask("b", TallyCommand::Get).await, Ok(0));
    let next = host.entity_ref("a").unwrap().ask(TallyCommand::Get);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(host.stats().entities_evicted, 1);
    fixture.journal.append_gate.release();
    assert_eq!(in_flight.await, Ok(2));
    assert_eq!(next.await, Ok(2));
    assert_eq!(host.stats().entities_evicted, 2, "a's return evicted b");
    fixture.journal.assert_one_writer_at_a_time();
}

/// Remember-entities: a shard starts its remembered entities without a command; each
/// recovers (its state is there for the first command) and one already live is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_entities_recovers_them_without_a_command() {
    let fixture = Fixture::new();
    let first = fixture.host(config());
    first.ask("a", TallyCommand::Add(5)).await.unwrap();
    first.ask("b", TallyCommand::Add(7)).await.unwrap();
    first.shutdown().await;
    let host = fixture.host(config());
    host.ask("c", TallyCommand::Add(1)).await.unwrap();
    let replays_before = fixture.journal.replays().len();
    assert!(host.start_entities(ids(["a", "b", "c"])).is_empty());
    eventually("a and b are live", || {
        fixture.journal.replays().len() == replays_before + 2
    })
    .await;
    assert_eq!(live_ids(&host).await, set(["a", "b", "c"]));
    // Recovered: the next command sees the stored state.
    assert_eq!(host.ask("a", TallyCommand::Add(1)).await, Ok(6));
    assert_eq!(host.ask("b", TallyCommand::Add(0)).await, Ok(7));
    host.shutdown().await;
}
