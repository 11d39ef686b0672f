//! Targets of cluster sharding's messages between coordinators and regions, and of the state
//! a coordinator (and a shard's remembered entities) recovers from its store.

use super::{assert_round_trip, chunked, chunks};
use std::collections::BTreeSet;
use tessera_coordinator::fuzzing as stored;
use tessera_coordinator::state::{CoordinatorState, StateEvent};
use tessera_coordinator::wire::{self, RegionSnapshot, ShardingFrame};

/// Target `sharding_frame`: a frame of the sharding service (to a coordinator, to a region,
/// handoff markers, forwarded commands, replies) and a region's answer to a state query.
pub fn sharding_frame(data: &[u8]) {
    if let Ok(frame) = wire::decode::<ShardingFrame>(data) {
        assert_round_trip(
            "sharding frame",
            &frame,
            wire::encode,
            wire::decode::<ShardingFrame>,
        );
        let _ = frame.type_name();
    }
    if let Ok(snapshot) = wire::decode::<RegionSnapshot>(data) {
        assert_round_trip(
            "region snapshot",
            &snapshot,
            wire::encode,
            wire::decode::<RegionSnapshot>,
        );
    }
}

/// Panics unless `state` keeps its invariant: its shard homes and its regions' shard sets
/// describe the same allocation, to registered regions.
pub(super) fn assert_consistent(state: &CoordinatorState) {
    for (shard, region) in state.shards() {
        assert!(
            state
                .regions()
                .get(region)
                .is_some_and(|s| s.contains(shard)),
            "shard {shard} is at {region}, which does not list it"
        );
    }
    for (region, shards) in state.regions() {
        for shard in shards {
            assert_eq!(
                state.home(*shard),
                Some(region),
                "shard {shard} of {region}"
            );
        }
    }
}

/// Target `coordinator_state`: a coordinator's state recovered from its store, then events of
/// its log applied to it ([`chunks`]). The first piece's first byte chooses the state's
/// source: a snapshot of the coordinator's log (`state_store_mode = persistence`), the JSON of
/// its Distributed Data register (`ddata`), or a shard's remembered-entities events instead.
/// A recovered state must keep its invariant and store back to itself.
pub fn coordinator_state(data: &[u8]) {
    let mut pieces = chunks(data);
    let Some((&mode, first)) = pieces.next().and_then(|p| p.split_first()) else {
        return;
    };
    if mode % 3 == 2 {
        remembered_entities(first, pieces);
        return;
    }
    let recovered = if mode % 3 == 0 {
        stored::decode_snapshot_state(first).inspect(|state| {
            assert_round_trip(
                "coordinator snapshot",
                state,
                stored::encode_snapshot_state,
                stored::decode_snapshot_state,
            );
        })
    } else {
        let Ok(text) = std::str::from_utf8(first) else {
            return;
        };
        stored::decode_json_state(text).inspect(|state| {
            assert_round_trip(
                "coordinator register",
                state,
                |s| stored::encode_json_state(s).map(String::into_bytes),
                |b| stored::decode_json_state(&String::from_utf8_lossy(b)),
            );
        })
    };
    let Ok(mut state) = recovered else {
        return;
    };
    assert_consistent(&state);
    for piece in pieces {
        let Ok(event) = stored::decode_state_event(piece) else {
            continue;
        };
        assert_round_trip(
            "coordinator event",
            &event,
            stored::encode_state_event,
            stored::decode_state_event,
        );
        // An event that does not fit changes nothing, as in a recovery.
        let before = state.clone();
        if state.apply(&event).is_err() {
            assert_eq!(state, before, "a refused event changed the state");
        }
        assert_consistent(&state);
    }
}

/// A shard's remembered entities replayed from its events, as `JournalRememberStore` does.
fn remembered_entities<'a>(first: &'a [u8], rest: impl Iterator<Item = &'a [u8]>) {
    let mut ids = BTreeSet::new();
    for piece in std::iter::once(first).chain(rest) {
        let Ok((started, changed)) = stored::decode_remember_event(piece) else {
            continue;
        };
        assert_round_trip(
            "remember event",
            &(started, changed.clone()),
            |(s, c)| stored::encode_remember_event(*s, c.clone()),
            stored::decode_remember_event,
        );
        if started {
            ids.extend(changed);
        } else {
            for id in &changed {
                ids.remove(id);
            }
        }
    }
}

/// Valid encodings the targets' corpora start from.
pub mod seeds {
    use super::*;
    use tessera_cluster::{Address, UniqueAddress};
    use tessera_coordinator::ShardId;
    use tessera_coordinator::host::{AskFailure, AskOutcome, FailureKind};
    use tessera_coordinator::messages::{HandoffId, ToCoordinator, ToRegion};
    use tessera_coordinator::wire::RemoteAsk;

    fn region(n: u16) -> UniqueAddress {
        UniqueAddress::new(Address::new("10.0.0.1", 25520 + n), u64::from(n) * 1000 + 7)
    }

    const HANDOFF: HandoffId = HandoffId {
        coordinator_nonce: 77,
        number: 3,
    };

    /// Seeds of `sharding_frame`: every message to coordinators and regions, the other
    /// frames, and a region snapshot.
    pub fn sharding_frame() -> Vec<Vec<u8>> {
        let shard = ShardId(17);
        let to_coordinator = [
            ToCoordinator::Register,
            ToCoordinator::RegisterProxy,
            ToCoordinator::GetShardHome { shard },
            ToCoordinator::ShardStarted { shard },
            ToCoordinator::BeginHandOffAck {
                shard,
                region: region(2),
                handoff: HANDOFF,
            },
            ToCoordinator::ShardStopped {
                shard,
                handoff: HANDOFF,
            },
            ToCoordinator::GracefulShutdownRequest,
        ];
        let to_region = [
            ToRegion::RegisterAck,
            ToRegion::ShardHome {
                shard,
                region: region(1),
            },
            ToRegion::HostShard { shard },
            ToRegion::BeginHandOff {
                shard,
                owner: region(1),
                handoff: HANDOFF,
            },
            ToRegion::HandOff {
                shard,
                handoff: HANDOFF,
            },
            ToRegion::GracefulShutdownAck { done: true },
        ];
        let type_name = || "account".to_string();
        let mut frames: Vec<ShardingFrame> = to_coordinator
            .into_iter()
            .map(|message| ShardingFrame::ToCoordinator {
                type_name: type_name(),
                message,
            })
            .chain(
                to_region
                    .into_iter()
                    .map(|message| ShardingFrame::ToRegion {
                        type_name: type_name(),
                        to_uid: 2007,
                        message,
                    }),
            )
            .collect();
        frames.extend([
            ShardingFrame::Marker {
                type_name: type_name(),
                shard,
                handoff: HANDOFF,
            },
            ShardingFrame::Forward {
                type_name: type_name(),
                shard,
                ask: RemoteAsk {
                    entity_id: "alice".into(),
                    payload: vec![0, 5],
                    message_version: 1,
                    reply_to: region(3).address,
                    reply_id: 99,
                },
            },
            ShardingFrame::Reply {
                type_name: type_name(),
                reply_id: 99,
                result: Ok(vec![0, 5]),
            },
            ShardingFrame::Reply {
                type_name: type_name(),
                reply_id: 100,
                result: Err(AskFailure::new(
                    FailureKind::Timeout,
                    AskOutcome::Unknown,
                    "no reply",
                )),
            },
            ShardingFrame::RegionState {
                type_name: type_name(),
            },
        ]);
        let mut seeds: Vec<Vec<u8>> = frames.iter().filter_map(|f| wire::encode(f).ok()).collect();
        let snapshot = RegionSnapshot {
            shards: vec![(shard, vec!["alice".into(), "bob".into()])],
        };
        seeds.extend(wire::encode(&snapshot).ok());
        seeds
    }

    /// A coordinator's state with two regions, a proxy and shard homes, and the events that
    /// built it.
    fn sample_state() -> (CoordinatorState, Vec<StateEvent>) {
        let events = vec![
            StateEvent::RegionRegistered { region: region(1) },
            StateEvent::RegionRegistered { region: region(2) },
            StateEvent::ProxyRegistered { proxy: region(3) },
            StateEvent::ShardHomeAllocated {
                shard: ShardId(1),
                region: region(1),
            },
            StateEvent::ShardHomeAllocated {
                shard: ShardId(2),
                region: region(2),
            },
        ];
        let mut state = CoordinatorState::new(true);
        for event in &events {
            let _ = state.apply(event);
        }
        (state, events)
    }

    /// Events of a later life of the log: a shard moved, a region and the proxy gone.
    fn later_events() -> Vec<StateEvent> {
        vec![
            StateEvent::ShardHomeDeallocated { shard: ShardId(1) },
            StateEvent::ShardHomeAllocated {
                shard: ShardId(1),
                region: region(2),
            },
            StateEvent::RegionTerminated { region: region(1) },
            StateEvent::ProxyTerminated { proxy: region(3) },
        ]
    }

    /// Seeds of `coordinator_state`: a snapshot and a register value followed by events, and
    /// remembered-entities events.
    pub fn coordinator_state() -> Vec<Vec<u8>> {
        let (state, built) = sample_state();
        let events: Vec<Vec<u8>> = built
            .iter()
            .chain(&later_events())
            .filter_map(|e| stored::encode_state_event(e).ok())
            .collect();
        let mut seeds = Vec::new();
        let empty = CoordinatorState::new(false);
        if let (Ok(snapshot), Ok(empty_snapshot)) = (
            stored::encode_snapshot_state(&state),
            stored::encode_snapshot_state(&empty),
        ) {
            let first = [&[0u8][..], &snapshot].concat();
            let later = events[built.len()..].iter().map(Vec::as_slice);
            seeds.push(chunked(std::iter::once(first.as_slice()).chain(later)));
            let first = [&[0u8][..], &empty_snapshot].concat();
            let all = events.iter().map(Vec::as_slice);
            seeds.push(chunked(std::iter::once(first.as_slice()).chain(all)));
        }
        if let Ok(json) = stored::encode_json_state(&state) {
            let first = [&[1u8][..], json.as_bytes()].concat();
            seeds.push(chunked([first.as_slice()]));
        }
        let remembered: Vec<Vec<u8>> = [
            (true, vec!["alice".to_string(), "bob".to_string()]),
            (false, vec!["alice".to_string()]),
            (true, vec!["carol".to_string()]),
        ]
        .into_iter()
        .filter_map(|(started, ids)| stored::encode_remember_event(started, ids).ok())
        .collect();
        if let Some((first, rest)) = remembered.split_first() {
            let first = [&[2u8][..], first].concat();
            seeds.push(chunked(
                std::iter::once(first.as_slice()).chain(rest.iter().map(Vec::as_slice)),
            ));
        }
        seeds
    }
}
