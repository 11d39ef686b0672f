//! Model tests: whatever the interleaving of commands, write outcomes, snapshot outcomes,
//! stops and restarts, the entity's state is the pure fold of its committed log, and every
//! command gets exactly one answer.

mod support;

use proptest::prelude::*;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use support::{Fixture, Tally, TallyCommand, TallyEvent, TallyState};
use tessera_entities::machine::{Action, EntityMachine, MachineSettings, SnapshotJob};
use tessera_entities::{AskError, Codec, EntityConfig, EntityId, EntityType};
use tessera_journal::{AtomicWrite, JournalError, Manifest, PersistentRepr};
use tessera_snapshot::Snapshot;

#[derive(Debug, Clone)]
enum Op {
    Command(TallyCommand),
    FinishWrite { ok: bool },
    FinishConfirm { ok: bool },
    FinishSnapshot { ok: bool },
    Restart,
}

fn command() -> impl Strategy<Value = TallyCommand> {
    prop_oneof![
        4 => (1u64..10).prop_map(TallyCommand::Add),
        1 => proptest::collection::vec(1u64..5, 0..4).prop_map(TallyCommand::AddAll),
        2 => (1u64..30).prop_map(TallyCommand::Sub),
        1 => Just(TallyCommand::Get),
        1 => Just(TallyCommand::Stop),
        1 => (1u64..10).prop_map(TallyCommand::AddAndStop),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => command().prop_map(Op::Command),
        3 => Just(Op::FinishWrite { ok: true }),
        1 => Just(Op::FinishWrite { ok: false }),
        2 => any::<bool>().prop_map(|ok| Op::FinishConfirm { ok }),
        2 => any::<bool>().prop_map(|ok| Op::FinishSnapshot { ok }),
        1 => Just(Op::Restart),
    ]
}

fn fold(log: &[TallyEvent]) -> TallyState {
    let mut state = TallyState::default();
    for event in log {
        Tally.apply_event(&mut state, event);
    }
    state
}

type Machine = EntityMachine<Tally, u64>;

/// A driver with a perfect in-memory store, under the test's control.
struct Sim {
    codec: Arc<Codec<Tally>>,
    settings: MachineSettings,
    machine: Machine,
    incarnation: u64,
    log: Vec<TallyEvent>,
    snapshots: BTreeMap<u64, Snapshot>,
    write: Option<AtomicWrite>,
    /// A confirmation in flight: the sequence number it confirms.
    confirm: Option<u64>,
    snapshot: Option<SnapshotJob>,
    /// Stopped incarnations whose write or snapshot is still in flight, with their stash.
    handed_over: VecDeque<(TallyCommand, u64)>,
    answers: BTreeMap<u64, u32>,
    next_token: u64,
}

impl Sim {
    fn new(settings: MachineSettings) -> Self {
        let codec = Arc::new(Codec::new());
        let machine = Self::start(&codec, settings, 1);
        let mut sim = Sim {
            codec,
            settings,
            machine,
            incarnation: 1,
            log: Vec::new(),
            snapshots: BTreeMap::new(),
            write: None,
            confirm: None,
            snapshot: None,
            handed_over: VecDeque::new(),
            answers: BTreeMap::new(),
            next_token: 0,
        };
        sim.recover();
        sim
    }

    fn start(codec: &Arc<Codec<Tally>>, settings: MachineSettings, incarnation: u64) -> Machine {
        EntityMachine::new(
            Arc::new(Tally),
            codec.clone(),
            &EntityId::new("m").unwrap(),
            format!("w{incarnation}"),
            settings,
        )
    }

    fn perform(&mut self, out: Vec<Action<Tally, u64>>) {
        for action in out {
            match action {
                Action::Reply { to, result } => {
                    *self.answers.entry(to).or_default() += 1;
                    if let Ok(total) = result {
                        // Every successful reply is computed from a state that is a prefix
                        // fold of the committed log.
                        assert!(
                            (0..=self.log.len()).any(|n| fold(&self.log[..n]).total == total),
                            "reply {total} matches no prefix of the log"
                        );
                    } else if let Err(AskError::Rejected(r)) = result {
                        assert!(r.requested > r.total);
                    }
                }
                Action::Persist(write) => {
                    assert!(self.write.is_none(), "two writes in flight");
                    assert!(self.confirm.is_none(), "a write beside a confirmation");
                    self.write = Some(write);
                }
                Action::Confirm { highest } => {
                    assert!(
                        self.settings.confirm_reads,
                        "a confirmation nobody asked for"
                    );
                    assert!(self.confirm.is_none(), "two confirmations in flight");
                    assert!(self.write.is_none(), "a confirmation beside a write");
                    assert_eq!(
                        highest,
                        self.log.len() as u64,
                        "confirms where the log ends"
                    );
                    self.confirm = Some(highest);
                }
                Action::Snapshot(job) => {
                    assert!(self.snapshot.is_none(), "two snapshot jobs in flight");
                    self.snapshot = Some(job);
                }
                Action::Stop => {}
            }
        }
    }

    fn check_state(&self) {
        if self.machine.is_recovered() && self.write.is_none() {
            assert_eq!(self.machine.sequence_nr(), self.log.len() as u64);
            assert_eq!(*self.machine.state(), fold(&self.log));
        }
        assert!(self.machine.stashed() <= self.settings.stash_capacity);
    }

    fn command(&mut self, command: TallyCommand) {
        let token = self.next_token;
        self.next_token += 1;
        let mut out = Vec::new();
        self.machine.command(command, token, 0, &mut out);
        self.perform(out);
        self.maybe_restart_stopped();
    }

    fn finish_write(&mut self, ok: bool) {
        let Some(write) = self.write.take() else {
            return;
        };
        let result = if ok {
            assert_eq!(write.events[0].sequence_nr, self.log.len() as u64 + 1);
            for event in &write.events {
                let decoded = self
                    .codec
                    .decode_event(&Tally, &event.manifest, &event.payload)
                    .unwrap();
                self.log.push(decoded);
            }
            Ok(())
        } else {
            Err(JournalError::Storage("simulated".into()))
        };
        let mut out = Vec::new();
        self.machine.persisted(result, 0, &mut out);
        self.perform(out);
        self.maybe_restart_stopped();
    }

    fn finish_confirm(&mut self, ok: bool) {
        if self.confirm.take().is_none() {
            return;
        }
        let result = if ok {
            Ok(())
        } else {
            Err(JournalError::Fenced {
                persistence_id: "tally|m".into(),
                reason: "simulated".into(),
            })
        };
        let mut out = Vec::new();
        self.machine.confirmed(result, 0, &mut out);
        self.perform(out);
        self.maybe_restart_stopped();
    }

    fn finish_snapshot(&mut self, ok: bool) {
        let Some(job) = self.snapshot.take() else {
            return;
        };
        if ok {
            self.snapshots.insert(
                job.metadata.sequence_nr,
                Snapshot {
                    metadata: job.metadata.clone(),
                    manifest: job.manifest.clone(),
                    payload: job.payload.clone(),
                },
            );
            if let Some(r) = job.retention {
                self.snapshots.retain(|s, _| *s > r.delete_snapshots_up_to);
            }
        }
        let mut out = Vec::new();
        self.machine.snapshot_finished(
            ok.then_some(()).ok_or_else(|| "simulated".into()),
            0,
            &mut out,
        );
        self.perform(out);
        self.maybe_restart_stopped();
    }

    /// Like the host: a stopped machine with nothing in flight is replaced by a new
    /// incarnation when commands wait for it.
    fn maybe_restart_stopped(&mut self) {
        if self.machine.is_stopped()
            && self.write.is_none()
            && self.confirm.is_none()
            && self.snapshot.is_none()
        {
            self.restart();
        }
    }

    /// A restart between writes: a snapshot job in flight is lost (never saved), the stash
    /// goes to the next incarnation. (With a write in flight the op waits: its caller would
    /// get no answer from the machine, which the exactly-once check cannot tell apart.)
    fn restart(&mut self) {
        if self.write.is_some() || self.confirm.is_some() {
            return;
        }
        self.snapshot = None;
        let leftovers = self.machine.take_stash();
        self.handed_over.extend(leftovers);
        self.incarnation += 1;
        self.machine = Self::start(&self.codec, self.settings, self.incarnation);
        self.recover();
    }

    fn recover(&mut self) {
        let mut out = Vec::new();
        for (command, token) in std::mem::take(&mut self.handed_over) {
            self.machine.command(command, token, 0, &mut out);
        }
        let latest = self.snapshots.values().next_back().cloned();
        let from = self.machine.snapshot_loaded(Ok(latest), &mut out).unwrap();
        for (seq, event) in (1u64..).zip(self.log.clone()) {
            if seq < from {
                continue;
            }
            let (manifest, payload) = self.codec.encode_event(&event).unwrap();
            let repr = PersistentRepr {
                persistence_id: "tally|m".into(),
                sequence_nr: seq,
                writer_id: "w".into(),
                timestamp_ms: 0,
                manifest,
                payload,
            };
            assert!(self.machine.event_replayed(&repr, &mut out));
        }
        self.machine
            .recovery_completed(Ok(self.log.len() as u64), 0, &mut out);
        self.perform(out);
        assert!(self.machine.is_recovered() || self.machine.is_stopped());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn state_is_the_fold_of_the_committed_log_and_every_command_is_answered_once(
        ops in proptest::collection::vec(op(), 1..120),
        snapshot_every in 0u64..6,
        keep in 1u64..3,
        stash_capacity in 1usize..6,
        confirm_reads: bool,
    ) {
        let mut sim = Sim::new(MachineSettings {
            snapshot_every,
            keep_snapshots: keep,
            delete_events_on_snapshot: false,
            stash_capacity,
            confirm_reads,
        });
        for op in ops {
            match op {
                Op::Command(command) => sim.command(command),
                Op::FinishWrite { ok } => sim.finish_write(ok),
                Op::FinishConfirm { ok } => sim.finish_confirm(ok),
                Op::FinishSnapshot { ok } => sim.finish_snapshot(ok),
                Op::Restart => sim.restart(),
            }
            sim.check_state();
        }
        // Drain: finish everything in flight successfully.
        for _ in 0..1_000 {
            if sim.write.is_none()
                && sim.confirm.is_none()
                && sim.snapshot.is_none()
                && sim.machine.stashed() == 0
            {
                break;
            }
            sim.finish_write(true);
            sim.finish_confirm(true);
            sim.finish_snapshot(true);
            if sim.write.is_none()
                && sim.confirm.is_none()
                && sim.snapshot.is_none()
                && sim.machine.is_stopped()
            {
                sim.restart();
            }
        }
        sim.check_state();
        for token in 0..sim.next_token {
            prop_assert_eq!(sim.answers.get(&token).copied(), Some(1), "command {} answered once", token);
        }
        // A fresh incarnation recovers exactly the fold of the log.
        sim.restart();
        prop_assert_eq!(sim.machine.state().clone(), fold(&sim.log));
        prop_assert!(sim.snapshots.len() as u64 <= keep.max(1));
    }
}

/// Commands, stops, idle passivations and host restarts in random order on the real runtime:
/// the final totals are the pure fold of the successful commands.
#[test]
fn random_commands_passivations_and_restarts_match_a_pure_fold() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let strategy = proptest::collection::vec((0usize..3, command(), 0u8..10), 1..60);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(24));
    runner
        .run(&strategy, |steps| {
            runtime.block_on(async {
                let fixture = Fixture::new();
                let config = EntityConfig {
                    snapshot_every: 3,
                    keep_snapshots: 1,
                    delete_events_on_snapshot: true,
                    passivate_after: Some(std::time::Duration::from_millis(1)),
                    ..support::config()
                };
                let mut host = fixture.host(config.clone());
                let mut model: BTreeMap<usize, TallyState> = BTreeMap::new();
                for (entity, command, chance) in steps {
                    if chance == 0 {
                        host.shutdown().await;
                        host = fixture.host(config.clone());
                    } else if chance == 1 {
                        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
                    }
                    let id = format!("e{entity}");
                    let state = model.entry(entity).or_default();
                    let expected = expected_reply(state, &command);
                    let reply = host.ask(&id, command.clone()).await;
                    match (reply, expected) {
                        (Ok(total), Ok(model_total)) => assert_eq!(total, model_total),
                        (Err(AskError::Rejected(_)), Err(())) => {}
                        (reply, expected) => {
                            panic!("{id} {command:?}: got {reply:?}, model says {expected:?}")
                        }
                    }
                }
                for (entity, state) in &model {
                    let total = host
                        .ask(&format!("e{entity}"), TallyCommand::Get)
                        .await
                        .unwrap();
                    assert_eq!(total, state.total);
                }
                host.shutdown().await;
                fixture.journal.assert_one_writer_at_a_time();
            });
            Ok(())
        })
        .unwrap();
}

/// The model: applies `command` to `state` and returns the expected reply.
fn expected_reply(state: &mut TallyState, command: &TallyCommand) -> Result<u64, ()> {
    let events = match command {
        TallyCommand::Add(n) | TallyCommand::AddAndStop(n) => vec![TallyEvent::Added(*n)],
        TallyCommand::AddAll(ns) => ns.iter().copied().map(TallyEvent::Added).collect(),
        TallyCommand::Sub(n) if *n > state.total => return Err(()),
        TallyCommand::Sub(n) => vec![TallyEvent::Subtracted(*n)],
        TallyCommand::Get | TallyCommand::Stop => vec![],
        TallyCommand::Panic { .. } => unreachable!("not generated"),
    };
    for event in &events {
        Tally.apply_event(state, event);
    }
    Ok(state.total)
}

#[test]
fn codec_round_trips_under_the_current_manifest() {
    let codec = Codec::<Tally>::new();
    let (manifest, payload) = codec.encode_event(&TallyEvent::Added(7)).unwrap();
    assert_eq!(manifest, Manifest::new("tally.Event", 1));
    assert_eq!(
        codec.decode_event(&Tally, &manifest, &payload).unwrap(),
        TallyEvent::Added(7)
    );
    let state = TallyState {
        total: 3,
        events: 2,
    };
    let (manifest, payload) = codec.encode_state(&state).unwrap();
    assert_eq!(manifest, Manifest::new("tally.State", 1));
    assert_eq!(
        codec.decode_state(&Tally, &manifest, &payload).unwrap(),
        state
    );
}
