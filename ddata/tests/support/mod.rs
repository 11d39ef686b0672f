//! The law-checking harness: random operation and merge schedules over a few replicas, and the
//! properties every CRDT must satisfy, written once for any type described by a [`Model`].

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::fmt::Debug;
use tessera_cluster::{Address, UniqueAddress};
use tessera_ddata::codec;
use tessera_ddata::{DeltaReplicatedData, RemovedNodePruning, ReplicatedData};

/// Cases per property: enough to find schedule bugs, few enough for the crate's whole test run
/// to take seconds.
pub const CASES: u32 = 96;

/// The node of replica `i`. Ports and uids run in opposite directions so that address order
/// and replica order differ, which exercises tie breaks.
pub fn node(i: usize) -> UniqueAddress {
    let i = u16::try_from(i).unwrap_or(u16::MAX);
    UniqueAddress::new(Address::new("127.0.0.1", 2560 - i), u64::from(i) + 1)
}

/// How to drive one CRDT type: its operations and its observable value.
pub trait Model: 'static {
    type Data: DeltaReplicatedData;
    type Op: Clone + Debug + 'static;
    type Value: PartialEq + Debug;

    /// The state every replica starts from.
    fn initial() -> Self::Data;
    fn op() -> BoxedStrategy<Self::Op>;
    /// Applies `op` on behalf of `node`.
    fn apply(data: &mut Self::Data, node: &UniqueAddress, op: &Self::Op);
    /// What a user reads.
    fn value(data: &Self::Data) -> Self::Value;
    /// What a single replica must read after applying `op` as `node`, given what it read
    /// before: the plain sequential data type. `None` where that is not modelled.
    fn expected(
        _before: &Self::Value,
        _node: &UniqueAddress,
        _op: &Self::Op,
    ) -> Option<Self::Value> {
        None
    }

    /// Whether cleanup of a late state always removes the removed node. Not for a register,
    /// whose one entry cannot be dropped without its value.
    const CLEANUP_FORGETS_REMOVED: bool = true;

    /// Whether a pruned state and the unpruned one read the same after the same operations.
    /// Not for a register: re-attributing the writer changes who wins a timestamp tie.
    const OPS_AFTER_PRUNING_MATCH: bool = true;

    /// The value pruning must leave, given the value before: the same value, for every type
    /// whose value does not name nodes.
    fn value_after_pruning(
        before: Self::Value,
        _removed: &UniqueAddress,
        _collapse_into: &UniqueAddress,
    ) -> Self::Value {
        before
    }
}

/// One step of a schedule. Replica indices are taken modulo the number of replicas.
#[derive(Clone, Debug)]
pub enum Step<Op> {
    /// The replica applies an operation as its own node.
    Apply { replica: usize, op: Op },
    /// `into` merges `from`'s full state.
    Merge { into: usize, from: usize },
    /// `from` ships its accumulated delta to `to` and resets it.
    ShipDelta { from: usize, to: usize },
}

#[derive(Clone, Debug)]
pub struct History<Op> {
    pub replicas: usize,
    pub steps: Vec<Step<Op>>,
}

/// 3 to 5 replicas and up to 40 steps, two thirds of them operations.
pub fn history<M: Model>() -> impl Strategy<Value = History<M::Op>> {
    let step = prop_oneof![
        4 => (0usize..5, M::op()).prop_map(|(replica, op)| Step::Apply { replica, op }),
        2 => (0usize..5, 0usize..5).prop_map(|(into, from)| Step::Merge { into, from }),
        1 => (0usize..5, 0usize..5).prop_map(|(from, to)| Step::ShipDelta { from, to }),
    ];
    (3usize..=5, prop::collection::vec(step, 0..40))
        .prop_map(|(replicas, steps)| History { replicas, steps })
}

/// A few operations for one replica.
pub fn ops<M: Model>() -> impl Strategy<Value = Vec<M::Op>> {
    prop::collection::vec(M::op(), 1..6)
}

/// A longer run of operations for one replica.
pub fn sequential_ops<M: Model>() -> impl Strategy<Value = Vec<M::Op>> {
    prop::collection::vec(M::op(), 0..30)
}

/// Runs the schedule and returns every replica's final state.
pub fn run<M: Model>(history: &History<M::Op>) -> Vec<M::Data> {
    let n = history.replicas;
    let mut states = vec![M::initial(); n];
    for step in &history.steps {
        match *step {
            Step::Apply { replica, ref op } => {
                let r = replica % n;
                M::apply(&mut states[r], &node(r), op);
            }
            Step::Merge { into, from } => {
                let merged = states[into % n].merge(&states[from % n]);
                states[into % n] = merged;
            }
            Step::ShipDelta { from, to } => {
                if let Some(delta) = states[from % n].delta() {
                    states[to % n].merge_delta(&delta);
                }
                states[from % n].reset_delta();
            }
        }
    }
    states
}

/// Without concurrency a replica behaves like the plain sequential data type.
pub fn single_replica_matches_the_sequential_type<M: Model>(
    ops: &[M::Op],
) -> Result<(), TestCaseError> {
    let mut data = M::initial();
    for op in ops {
        let expected = M::expected(&M::value(&data), &node(0), op);
        M::apply(&mut data, &node(0), op);
        if let Some(expected) = expected {
            prop_assert_eq!(M::value(&data), expected, "after {:?}", op);
        }
    }
    Ok(())
}

/// Merge is commutative, associative and idempotent on states reached by random schedules.
pub fn merge_is_a_join<M: Model>(history: &History<M::Op>) -> Result<(), TestCaseError> {
    let states = run::<M>(history);
    let (a, b, c) = (&states[0], &states[1], &states[2]);
    prop_assert_eq!(a.merge(b), b.merge(a), "commutative");
    prop_assert_eq!(a.merge(b).merge(c), a.merge(&b.merge(c)), "associative");
    prop_assert_eq!(&a.merge(a), a, "idempotent");
    prop_assert_eq!(&a.merge(b).merge(b), &a.merge(b), "idempotent after merge");
    Ok(())
}

/// A replica that has seen state `s` and receives the delta of operations applied to `s` ends
/// where merging the resulting full state would take it.
pub fn delta_merge_equals_full_merge<M: Model>(
    history: &History<M::Op>,
    ops: &[M::Op],
) -> Result<(), TestCaseError> {
    let states = run::<M>(history);
    let mut s = states[0].clone();
    let seen_s = states[1].merge(&s);
    s.reset_delta();
    let before = s.clone();
    for op in ops {
        M::apply(&mut s, &node(0), op);
    }
    let Some(delta) = s.delta() else {
        prop_assert_eq!(&s, &before, "no delta but the state changed");
        return Ok(());
    };
    let mut via_delta = seen_s.clone();
    via_delta.merge_delta(&delta);
    prop_assert_eq!(&via_delta, &seen_s.merge(&s));
    let mut origin = before;
    origin.merge_delta(&delta);
    prop_assert_eq!(&origin, &s);
    Ok(())
}

/// After any schedule, a final all-to-all merge leaves every replica with the same state.
pub fn replicas_converge<M: Model>(history: &History<M::Op>) -> Result<(), TestCaseError> {
    let states = run::<M>(history);
    let forward = states
        .iter()
        .skip(1)
        .fold(states[0].clone(), |all, s| all.merge(s));
    let backward = states
        .iter()
        .rev()
        .skip(1)
        .fold(states[states.len() - 1].clone(), |all, s| all.merge(s));
    prop_assert_eq!(&forward, &backward);
    let value = M::value(&forward);
    for state in &states {
        let converged = state.merge(&forward);
        prop_assert_eq!(&converged, &forward);
        prop_assert_eq!(M::value(&converged), M::value(&forward));
    }
    prop_assert_eq!(M::value(&backward), value);
    Ok(())
}

/// States survive the versioned encoding, and damaged bytes either fail to decode or decode to
/// a state that merges like any other (no panic, laws intact).
pub fn codec_round_trips_and_damage_is_harmless<M: Model>(
    history: &History<M::Op>,
    damage_at: usize,
    damage: u8,
) -> Result<(), TestCaseError> {
    let states = run::<M>(history);
    let state = &states[0];
    let bytes = codec::encode("state", state).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let decoded: M::Data =
        codec::decode("state", &bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&decoded, state);

    let mut damaged = bytes;
    if damaged.len() > 1 {
        let at = 1 + damage_at % (damaged.len() - 1);
        damaged[at] = damage;
    }
    if let Ok(odd) = codec::decode::<M::Data>("state", &damaged) {
        let other = &states[1];
        prop_assert_eq!(odd.merge(other), other.merge(&odd));
        prop_assert_eq!(&odd.merge(&odd), &odd);
        let _ = M::value(&odd.merge(other));
    }
    Ok(())
}

/// Pruning on `collapse_into`'s replica keeps the value and forgets the removed node, and the
/// pruned state goes on reading like the unpruned one under further operations; cleanup of a
/// late state forgets the node too, and so does their merge.
pub fn pruning_keeps_the_value<M: Model>(
    history: &History<M::Op>,
    ops_after: &[M::Op],
) -> Result<(), TestCaseError>
where
    M::Data: RemovedNodePruning,
{
    let states = run::<M>(history);
    let (removed, collapse_into) = (node(2), node(0));
    let before = states[0].merge(&states[2]);

    let mut unchanged = before.clone();
    unchanged.prune(&removed, &removed);
    prop_assert_eq!(
        &unchanged,
        &before,
        "pruning into the removed node itself is a no-op"
    );

    let mut leader = before.clone();
    leader.prune(&removed, &collapse_into);
    prop_assert_eq!(
        M::value(&leader),
        M::value_after_pruning(M::value(&before), &removed, &collapse_into)
    );
    prop_assert!(!leader.need_pruning_from(&removed));
    prop_assert!(!leader.modified_by_nodes().contains(&removed));
    prop_assert_eq!(leader.delta(), None);

    if M::OPS_AFTER_PRUNING_MATCH && M::value(&leader) == M::value(&before) {
        let (mut pruned, mut unpruned) = (leader.clone(), before.clone());
        for op in ops_after {
            M::apply(&mut pruned, &collapse_into, op);
            M::apply(&mut unpruned, &collapse_into, op);
            prop_assert_eq!(M::value(&pruned), M::value(&unpruned), "after {:?}", op);
        }
    }

    let mut late = states[1].merge(&states[2]);
    late.prune_cleanup(&removed);
    let merged = leader.merge(&late);
    if M::CLEANUP_FORGETS_REMOVED {
        prop_assert!(!late.need_pruning_from(&removed));
        prop_assert!(!merged.need_pruning_from(&removed));
    }
    prop_assert_eq!(&merged.merge(&merged), &merged);
    Ok(())
}
