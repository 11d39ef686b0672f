//! Target of the state machines cluster sharding's frames drive: a node's shard coordinator and
//! its shard region, fed frames from peers, ticks, the store's and the entities' reports,
//! membership changes, local callers, a shutdown and a coordinator moving to a new
//! incarnation.

use super::chunks;
use super::coordinator::assert_consistent;
use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};
use tessera_cluster::{Address, UniqueAddress};
use tessera_coordinator::ShardId;
use tessera_coordinator::coordinator::{CoordinatorOutput, MembershipView, ShardCoordinator};
use tessera_coordinator::messages::BetweenRegions;
use tessera_coordinator::region::{Origin, RegionOutput, RegionView, ShardRegion};
use tessera_coordinator::settings::ShardingSettings;
use tessera_coordinator::state::{CoordinatorState, RegionId};
use tessera_coordinator::wire::{self, ShardingFrame};

/// Nodes of the target: 1 runs the coordinator and the region under test, 2 and 3 host other
/// regions, and 4 is another incarnation of node 2.
fn node(selector: u8) -> RegionId {
    let n = u16::from(selector % 4) + 1;
    match n {
        4 => UniqueAddress::new(Address::new("10.0.0.1", 25522), 99),
        n => UniqueAddress::new(Address::new("10.0.0.1", 25520 + n), u64::from(n) * 1000 + 7),
    }
}

/// Settings small enough for fuzz input to reach their bounds: 16 shards, 64 buffered or
/// stashed messages.
fn settings() -> ShardingSettings {
    ShardingSettings {
        number_of_shards: 16,
        buffer_size: 64,
        coordinator_stash_capacity: 64,
        ..ShardingSettings::default()
    }
}

/// Outputs handled in one step at most: the machines answer each input with a bounded number
/// of messages, so more means they talk to each other without end.
const MAX_OUTPUTS_PER_STEP: usize = 100_000;

/// What one machine said, still to be delivered.
enum Said {
    Coordinator(Vec<CoordinatorOutput>),
    Region(Vec<RegionOutput<u64>>),
}

/// Node 1's coordinator and region, and what the simulated store and entities do.
struct Node {
    settings: ShardingSettings,
    me: RegionId,
    coordinator: ShardCoordinator,
    coordinator_nonce: u64,
    region: ShardRegion<u64>,
    region_view: RegionView,
    now: Instant,
    /// Whether the coordinator's writes are stored at once; otherwise they wait for the
    /// store's report (a step).
    store_prompt: bool,
    /// Whether the entities of a shard told to stop stop at once; otherwise they wait.
    entities_prompt: bool,
    /// Shards told to stop whose entities have not stopped yet.
    stopping: BTreeSet<ShardId>,
    next_message: u64,
}

impl Node {
    fn new() -> Node {
        let settings = settings();
        let me = node(0);
        let now = Instant::now();
        let mut node = Node {
            coordinator: ShardCoordinator::new(settings.clone(), 1),
            coordinator_nonce: 1,
            region: ShardRegion::new(settings.clone(), me.clone(), true),
            region_view: RegionView::default(),
            settings,
            me,
            now,
            store_prompt: true,
            entities_prompt: true,
            stopping: BTreeSet::new(),
            next_message: 0,
        };
        let loaded = node
            .coordinator
            .state_loaded(CoordinatorState::new(false), now);
        node.run(Said::Coordinator(loaded));
        // Every node Up and reachable, the coordinator here.
        node.membership(&[0b0111, 0b0111, 0b0001]);
        node
    }

    /// Delivers what the machines said, and what they answer to it, until they are quiet.
    /// Messages to other nodes are dropped: the fuzzer plays those nodes.
    fn run(&mut self, said: Said) {
        let mut queue = VecDeque::from([said]);
        let mut handled = 0usize;
        while let Some(said) = queue.pop_front() {
            match said {
                Said::Coordinator(outputs) => {
                    for output in outputs {
                        handled += 1;
                        self.coordinator_output(output, &mut queue);
                    }
                }
                Said::Region(outputs) => {
                    for output in outputs {
                        handled += 1;
                        self.region_output(output, &mut queue);
                    }
                }
            }
            assert!(
                handled <= MAX_OUTPUTS_PER_STEP,
                "the coordinator and the region keep talking: {handled} outputs for one input"
            );
        }
    }

    fn coordinator_output(&mut self, output: CoordinatorOutput, queue: &mut VecDeque<Said>) {
        let now = self.now;
        match output {
            CoordinatorOutput::Send { to, message } if to == self.me => {
                let me = self.me.clone();
                let out = self.region.from_coordinator(&me, message, now);
                queue.push_back(Said::Region(out));
            }
            CoordinatorOutput::Write(_) if self.store_prompt => {
                queue.push_back(Said::Coordinator(self.coordinator.write_done(now)));
            }
            CoordinatorOutput::Send { .. }
            | CoordinatorOutput::Write(_)
            | CoordinatorOutput::Stop { .. } => {}
        }
    }

    fn region_output(&mut self, output: RegionOutput<u64>, queue: &mut VecDeque<Said>) {
        let now = self.now;
        let me = self.me.clone();
        match output {
            RegionOutput::ToCoordinator(message) => {
                if self.region_view.coordinator.as_ref() == Some(&me) {
                    let out = self.coordinator.receive(me, message, now);
                    queue.push_back(Said::Coordinator(out));
                }
            }
            RegionOutput::ToRegion { to, message } if to == me => {
                let out = match message {
                    BetweenRegions::Forward { shard, message } => {
                        self.region.deliver(Origin::Region(me), shard, message, now)
                    }
                    BetweenRegions::HandOffMarker { shard, handoff } => {
                        self.region.marker(me, shard, handoff)
                    }
                };
                queue.push_back(Said::Region(out));
            }
            RegionOutput::StopShard(shard) => {
                if self.entities_prompt {
                    queue.push_back(Said::Region(self.region.shard_stopped(shard, now)));
                } else {
                    self.stopping.insert(shard);
                }
            }
            RegionOutput::ToRegion { .. }
            | RegionOutput::DeliverLocal { .. }
            | RegionOutput::StartShard(_)
            | RegionOutput::Refused { .. }
            | RegionOutput::ShutdownComplete => {}
        }
    }

    /// A sharding frame from `from`, routed as the sharding runtime routes it.
    fn frame(&mut self, from: RegionId, payload: &[u8]) {
        let Ok(frame) = wire::decode::<ShardingFrame>(payload) else {
            return;
        };
        let now = self.now;
        let said = match frame {
            ShardingFrame::ToCoordinator { message, .. } => {
                Said::Coordinator(self.coordinator.receive(from, message, now))
            }
            // Meant for another incarnation of this node: the runtime drops it.
            ShardingFrame::ToRegion { to_uid, .. } if to_uid != self.me.uid => return,
            ShardingFrame::ToRegion { message, .. } => {
                let out = self.region.from_coordinator(&from, message, now);
                // Answers only from the coordinator it registered with.
                if self.region_view.coordinator.as_ref() != Some(&from) {
                    assert!(
                        out.is_empty(),
                        "the region acted on a message from {from}, which is not its coordinator"
                    );
                }
                Said::Region(out)
            }
            ShardingFrame::Marker { shard, handoff, .. } => {
                Said::Region(self.region.marker(from, shard, handoff))
            }
            ShardingFrame::Forward { shard, ask, .. } => {
                Said::Region(
                    self.region
                        .deliver(Origin::Region(from), shard, ask.reply_id, now),
                )
            }
            ShardingFrame::Reply { .. }
            | ShardingFrame::RegionState { .. }
            | ShardingFrame::Unsupported { .. } => return,
        };
        self.run(said);
    }

    /// A membership view: `view[0]`'s low four bits are the members (nodes 1 to 4), `view[1]`'s
    /// those Up, `view[2]`'s low bit whether all are reachable, the rest where the coordinator
    /// runs (none, or a node).
    fn membership(&mut self, view: &[u8]) {
        let byte = |i: usize| view.get(i).copied().unwrap_or(0);
        let nodes = |mask: u8| -> BTreeSet<RegionId> {
            (0..4u8)
                .filter(|n| mask & (1 << n) != 0)
                .map(node)
                .collect()
        };
        let members = nodes(byte(0));
        let up: BTreeSet<RegionId> = nodes(byte(1)).intersection(&members).cloned().collect();
        let coordinator = match (byte(2) >> 1) % 5 {
            0 => None,
            n => Some(node(n - 1)),
        };
        let now = self.now;
        self.region_view = RegionView {
            members: members.clone(),
            coordinator,
            self_joining: false,
        };
        let out = self.region.membership(self.region_view.clone(), now);
        self.run(Said::Region(out));
        let out = self.coordinator.membership(
            MembershipView {
                members,
                up,
                stable: byte(2) & 1 != 0,
            },
            now,
        );
        self.run(Said::Coordinator(out));
    }

    /// One step: `op`'s low three bits say what, the next two which node a frame comes from,
    /// the rest how many 500 ms pass first.
    fn step(&mut self, op: u8, payload: &[u8]) {
        self.now += Duration::from_millis(500 * u64::from(op >> 5));
        let now = self.now;
        let byte = |i: usize| payload.get(i).copied().unwrap_or(0);
        match op & 7 {
            0 => self.frame(node(op >> 3), payload),
            1 => {
                self.now += Duration::from_secs(u64::from(byte(0)));
                let now = self.now;
                let out = self.coordinator.tick(now);
                self.run(Said::Coordinator(out));
                let out = self.region.tick(now);
                self.run(Said::Region(out));
            }
            2 => {
                // A caller on this node, for a shard (maybe out of range).
                self.next_message += 1;
                let shard = ShardId(u32::from(byte(0)));
                let out = self
                    .region
                    .deliver(Origin::Local, shard, self.next_message, now);
                self.run(Said::Region(out));
            }
            3 => {
                let out = match byte(0) % 4 {
                    0 => self.coordinator.write_done(now),
                    1 => self.coordinator.write_failed(false, "disk busy", now),
                    2 => self
                        .coordinator
                        .write_failed(true, "another coordinator", now),
                    _ => {
                        self.store_prompt = !self.store_prompt;
                        Vec::new()
                    }
                };
                self.run(Said::Coordinator(out));
            }
            4 => {
                if byte(0) % 2 == 0 {
                    let shard = ShardId(u32::from(byte(1)));
                    self.stopping.remove(&shard);
                    let out = self.region.shard_stopped(shard, now);
                    self.run(Said::Region(out));
                } else {
                    self.entities_prompt = !self.entities_prompt;
                }
            }
            5 => self.membership(payload),
            6 => {
                let out = self.region.begin_shutdown(now);
                self.run(Said::Region(out));
            }
            _ => {
                // The coordinator moves to a new incarnation, which loads the stored state.
                let state = self
                    .coordinator
                    .state()
                    .cloned()
                    .unwrap_or_else(|| CoordinatorState::new(false));
                self.coordinator_nonce += 1;
                self.coordinator =
                    ShardCoordinator::new(self.settings.clone(), self.coordinator_nonce);
                let out = self.coordinator.state_loaded(state, now);
                self.run(Said::Coordinator(out));
            }
        }
        if let Some(state) = self.coordinator.state() {
            assert_consistent(state);
        }
        assert!(
            self.region.buffered() <= self.settings.buffer_size,
            "the region buffers {} messages, above its buffer_size {}",
            self.region.buffered(),
            self.settings.buffer_size
        );
    }
}

/// Target `sharding_machines`: node 1's shard coordinator and region fed a sequence of steps
/// ([`chunks`]: each piece an op byte, see `Node::step`, and its payload: a sharding frame, a
/// membership view...). The coordinator's state keeps its invariant, the region never buffers
/// more than its bound nor acts on a coordinator message from another node, and the two never
/// talk without end.
pub fn sharding_machines(data: &[u8]) {
    let mut node = Node::new();
    for piece in chunks(data) {
        let Some((&op, payload)) = piece.split_first() else {
            continue;
        };
        node.step(op, payload);
    }
}

/// Valid encodings the targets' corpora start from.
pub mod seeds {
    use super::super::chunked;
    use super::*;
    use tessera_coordinator::messages::{ToCoordinator, ToRegion};
    use tessera_coordinator::wire::RemoteAsk;

    /// The op byte of a step of kind `kind` from node `from` (0 to 3), after `half_seconds`.
    fn op(kind: u8, from: u8, half_seconds: u8) -> u8 {
        (half_seconds << 5) | (from << 3) | kind
    }

    fn frame(from: u8, sent: ShardingFrame) -> Vec<u8> {
        let payload = wire::encode(&sent).unwrap_or_default();
        [&[op(0, from, 1)][..], &payload].concat()
    }

    fn to_coordinator(from: u8, message: ToCoordinator) -> Vec<u8> {
        frame(
            from,
            ShardingFrame::ToCoordinator {
                type_name: "account".into(),
                message,
            },
        )
    }

    /// Seeds of `sharding_machines`: nodes 2 and 3 register and ask for homes, callers here
    /// send to shards, node 3 leaves and its shards move; then the coordinator's store stalls
    /// and fails, the coordinator moves, and this region shuts down.
    pub fn sharding_machines() -> Vec<Vec<u8>> {
        let shard = |n| ShardId(n);
        let mut steps = vec![
            to_coordinator(1, ToCoordinator::Register),
            to_coordinator(2, ToCoordinator::Register),
            vec![op(2, 0, 0), 3],
            vec![op(2, 0, 0), 4],
            to_coordinator(1, ToCoordinator::GetShardHome { shard: shard(5) }),
            to_coordinator(2, ToCoordinator::GetShardHome { shard: shard(6) }),
            to_coordinator(2, ToCoordinator::ShardStarted { shard: shard(6) }),
            frame(
                2,
                ShardingFrame::Forward {
                    type_name: "account".into(),
                    shard: shard(3),
                    ask: RemoteAsk {
                        entity_id: "alice".into(),
                        payload: vec![0, 5],
                        message_version: 1,
                        reply_to: node(2).address,
                        reply_id: 7,
                    },
                },
            ),
            frame(
                1,
                ShardingFrame::ToRegion {
                    type_name: "account".into(),
                    to_uid: node(0).uid,
                    message: ToRegion::HostShard { shard: shard(9) },
                },
            ),
            vec![op(1, 0, 0), 12],
            // Node 3 is gone; then every node is Up again, with rebalancing allowed.
            vec![op(5, 0, 0), 0b0011, 0b0011, 0b0011],
            vec![op(1, 0, 0), 12],
            vec![op(5, 0, 0), 0b0111, 0b0111, 0b0011],
            to_coordinator(2, ToCoordinator::Register),
            vec![op(1, 0, 0), 12],
            vec![op(4, 0, 0), 1],
            vec![op(2, 0, 0), 3],
            vec![op(3, 0, 0), 3],
            vec![op(2, 0, 0), 8],
            vec![op(3, 0, 0), 1],
            vec![op(1, 0, 0), 2],
            vec![op(3, 0, 0), 0],
            vec![op(7, 0, 0)],
            to_coordinator(1, ToCoordinator::GracefulShutdownRequest),
            vec![op(6, 0, 0)],
            vec![op(1, 0, 0), 3],
        ];
        let first: Vec<Vec<u8>> = steps.drain(..8).collect();
        vec![
            chunked(first.iter().chain(&steps).map(Vec::as_slice)),
            chunked(first.iter().map(Vec::as_slice)),
        ]
    }
}
