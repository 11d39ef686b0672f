//! Helpers for the Replicator's simulated multi-node tests.
#![allow(dead_code)]

use std::time::Duration;
use tessera_ddata::replicator::{
    Command, DeleteResult, GetResult, Modify, ReplicatorConfig, RequestId, Response, UpdateResult,
};
use tessera_ddata::sim::{NetworkConfig, ReplicatorSim};
use tessera_ddata::{ORSet, PNCounter, ReadConsistency, ReplicatedValue, WriteConsistency};

pub const TIMEOUT: Duration = Duration::from_secs(3);
pub const MAJORITY_W: WriteConsistency = WriteConsistency::Majority { min_cap: 0 };
pub const MAJORITY_R: ReadConsistency = ReadConsistency::Majority { min_cap: 0 };

/// A config where data spreads only through reads and writes (no deltas, no gossip within a
/// test's horizon), to test the quorum paths on their own.
pub fn quorum_only() -> ReplicatorConfig {
    ReplicatorConfig {
        gossip_interval: Duration::from_secs(3600),
        delta_propagation_interval: Duration::from_secs(3600),
        ..ReplicatorConfig::default()
    }
}

pub fn sim(n: usize, config: ReplicatorConfig, seed: u64) -> ReplicatorSim {
    ReplicatorSim::new(n, config, NetworkConfig::default(), seed)
}

/// An update of `key` on `node` with `modify`.
pub fn update(
    sim: &mut ReplicatorSim,
    node: usize,
    key: &str,
    consistency: WriteConsistency,
    modify: Modify,
) -> RequestId {
    sim.submit(
        node,
        Command::Update {
            key: key.into(),
            consistency,
            timeout: TIMEOUT,
            modify,
        },
    )
}

pub fn increment(
    sim: &mut ReplicatorSim,
    node: usize,
    key: &str,
    n: u64,
    consistency: WriteConsistency,
) -> RequestId {
    let modify: Modify = Box::new(move |current, ctx| {
        let mut counter = match current {
            None => PNCounter::new(),
            Some(ReplicatedValue::PNCounter(c)) => c,
            Some(other) => return Err(format!("not a counter: {:?}", other.kind())),
        };
        counter.increment(ctx.self_node, n);
        Ok(counter.into())
    });
    update(sim, node, key, consistency, modify)
}

pub fn add(
    sim: &mut ReplicatorSim,
    node: usize,
    key: &str,
    element: &str,
    consistency: WriteConsistency,
) -> RequestId {
    let element = element.to_string();
    let modify: Modify = Box::new(move |current, ctx| {
        let mut set = match current {
            None => ORSet::new(),
            Some(ReplicatedValue::ORSet(s)) => s,
            Some(other) => return Err(format!("not a set: {:?}", other.kind())),
        };
        set.add(ctx.self_node, element);
        Ok(set.into())
    });
    update(sim, node, key, consistency, modify)
}

pub fn get(
    sim: &mut ReplicatorSim,
    node: usize,
    key: &str,
    consistency: ReadConsistency,
) -> RequestId {
    sim.submit(
        node,
        Command::Get {
            key: key.into(),
            consistency,
            timeout: TIMEOUT,
        },
    )
}

pub fn delete(
    sim: &mut ReplicatorSim,
    node: usize,
    key: &str,
    consistency: WriteConsistency,
) -> RequestId {
    sim.submit(
        node,
        Command::Delete {
            key: key.into(),
            consistency,
            timeout: TIMEOUT,
        },
    )
}

/// Runs until the request is answered (at most 10 simulated seconds).
pub fn answer(sim: &mut ReplicatorSim, node: usize, id: RequestId) -> Response {
    sim.run_until(Duration::from_secs(10), |s| s.reply(node, id).is_some());
    sim.reply(node, id).cloned().expect("an answer within 10 s")
}

pub fn update_answer(sim: &mut ReplicatorSim, node: usize, id: RequestId) -> UpdateResult {
    match answer(sim, node, id) {
        Response::Update(r) => r,
        other => panic!("expected an update result, got {other:?}"),
    }
}

pub fn delete_answer(sim: &mut ReplicatorSim, node: usize, id: RequestId) -> DeleteResult {
    match answer(sim, node, id) {
        Response::Delete(r) => r,
        other => panic!("expected a delete result, got {other:?}"),
    }
}

pub fn get_answer(sim: &mut ReplicatorSim, node: usize, id: RequestId) -> GetResult {
    match answer(sim, node, id) {
        Response::Get(r) => r,
        other => panic!("expected a get result, got {other:?}"),
    }
}

pub fn counter_value(result: &GetResult) -> Option<i128> {
    match result {
        GetResult::Found(ReplicatedValue::PNCounter(c)) => Some(c.value()),
        _ => None,
    }
}

pub fn set_elements(result: &GetResult) -> Option<Vec<String>> {
    match result {
        GetResult::Found(ReplicatedValue::ORSet(s)) => Some(s.elements().cloned().collect()),
        _ => None,
    }
}

/// The value of the counter `key` in the node's replica.
pub fn local_counter(sim: &ReplicatorSim, node: usize, key: &str) -> Option<i128> {
    match sim.envelope(node, key)?.data.as_ref()? {
        ReplicatedValue::PNCounter(c) => Some(c.value()),
        _ => None,
    }
}

/// Seeds to run a scenario with: `TESSERA_SIM_SEEDS` (default 100).
pub fn seeds() -> std::ops::Range<u64> {
    let n = std::env::var("TESSERA_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    0..n
}
