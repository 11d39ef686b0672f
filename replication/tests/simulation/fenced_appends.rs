//! Fenced appends (how a projection instance saves its offsets): a writer takes them only
//! while it holds the log as it opened it. Checked on every seed: no value of a writer lands
//! beyond the end of the log as a later writer opened it — even when the earlier one took
//! the log back by a configuration change's recovery. And a writer that moves its own log
//! between members keeps its opening: its fenced appends go on across the change.

use super::{base, caught_on, run};
use tessera_replication::sim::{FaultKind, FencedAppends, Scenario};

/// Writers on every node take the log from one another while members are replaced, moved
/// and wiped (each change a recovery that may meet another writer's promise).
pub fn contended(fenced: FencedAppends) -> Scenario {
    Scenario {
        fenced_appends: Some(fenced),
        spare_nodes: 2,
        latency_ms: (1, 20),
        faults: vec![
            FaultKind::ReplaceMember,
            FaultKind::MoveNode,
            FaultKind::ReplaceMember,
            FaultKind::WipeReplica,
            FaultKind::Pause,
        ],
        ..base("fenced appends: takeovers during configuration changes")
    }
}

#[test]
fn no_writer_appends_after_a_later_opening() {
    let stats = run(contended(FencedAppends::Fenced));
    assert!(
        stats.taken_over > 0,
        "no fenced append was refused: {stats:?}"
    );
    assert!(stats.writer_reconfigurations > 0, "{stats:?}");
}

/// One writer, whose members are replaced and moved: its changes meet no other writer, so
/// its opening holds and its fenced appends are taken across them.
pub fn one_writer_moves_its_log() -> Scenario {
    Scenario {
        fenced_appends: Some(FencedAppends::Fenced),
        writers: vec![0],
        spare_nodes: 2,
        faults: vec![
            FaultKind::MoveNode,
            FaultKind::ReplaceMember,
            FaultKind::ReplaceMember,
        ],
        ..base("fenced appends: one writer moves its log")
    }
}

#[test]
fn a_writer_keeps_its_opening_across_its_own_configuration_changes() {
    let stats = run(one_writer_moves_its_log());
    assert_eq!(stats.taken_over, 0, "{stats:?}");
    assert!(stats.fenced_after_reconfiguration > 0, "{stats:?}");
}

#[test]
fn appending_after_taking_the_log_back_is_caught() {
    let seeds = super::seeds();
    let caught = caught_on(&contended(FencedAppends::Unfenced), seeds);
    assert!(caught > 0, "no seed showed a write after a later opening");
    eprintln!("unfenced appends after a takeover: caught on {caught} of {seeds} seeds");
}
