//! Typed asks through sharding between two nodes, each running real entity hosts on an
//! in-memory journal, with every sharding frame between them inspected: a command asked on
//! the node that does not run its entity crosses once, in postcard, and its reply comes back
//! once, in postcard; neither is JSON; a command asked where its entity runs sends no frame at
//! all; and the entity's rejection arrives as its own type on the other node.

use super::{address, wait_until};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tessera_cluster::core::ClusterCoreConfig;
use tessera_cluster::node::{self, ClusterHandle};
use tessera_cluster::singleton::Singletons;
use tessera_cluster::transport::frame::Frame;
use tessera_cluster::transport::{MemoryNetwork, MemoryTransport, services};
use tessera_coordinator::runtime::{RuntimeSettings, ShardedType, Sharding};
use tessera_coordinator::settings::ShardingSettings;
use tessera_coordinator::store::{CoordinatorStore, MemoryStore};
use tessera_coordinator::wire::{self, ShardingFrame};
use tessera_coordinator::{AskError, EntityRef};
use tessera_entities::{Effect, EntityConfig, EntityHost, EntityType};
use tessera_journal::MemoryJournal;
use tessera_snapshot::MemorySnapshotStore;

/// A tally that `add` raises and `take` lowers, never below zero.
struct Tally;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum TallyCommand {
    Add(u64),
    Take(u64),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum TallyRejection {
    TooLittle { tally: u64, asked: u64 },
}

impl std::fmt::Display for TallyRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl EntityType for Tally {
    type Command = TallyCommand;
    type Event = i64;
    type State = u64;
    type Reply = u64;
    type Rejection = TallyRejection;

    const TYPE_NAME: &'static str = "tally";
    const EVENT_MANIFEST: &'static str = "tally.Event";
    const STATE_MANIFEST: &'static str = "tally.State";

    fn initial_state(&self, _entity_id: &str) -> u64 {
        0
    }

    fn handle_command(&self, tally: &u64, command: TallyCommand) -> Effect<Self> {
        match command {
            TallyCommand::Add(n) => Effect::persist(n as i64).then_reply(|t| *t),
            TallyCommand::Take(n) if n > *tally => Effect::reject(TallyRejection::TooLittle {
                tally: *tally,
                asked: n,
            }),
            TallyCommand::Take(n) => Effect::persist(-(n as i64)).then_reply(|t| *t),
        }
    }

    fn apply_event(&self, tally: &mut u64, event: &i64) {
        *tally = tally.saturating_add_signed(*event);
    }
}

struct TypedNode {
    cluster: ClusterHandle,
    sharding: Sharding<MemoryTransport>,
    _singletons: Singletons<MemoryTransport>,
}

fn start(
    network: &Arc<MemoryNetwork>,
    i: usize,
    journal: &MemoryJournal,
    store: &Arc<MemoryStore>,
) -> TypedNode {
    let transport = network
        .bind(u64::try_from(i).expect("small") + 900, address(i))
        .expect("bind");
    let mut config = ClusterCoreConfig::default();
    config.membership.seed_nodes = vec![address(0)];
    let cluster = node::start(transport.clone(), config).expect("start");
    let singletons = Singletons::start(transport.clone(), cluster.watch()).expect("singletons");
    // One journal for both nodes, as the replicated one would be.
    let host = EntityHost::start(
        Tally,
        Arc::new(journal.clone()),
        Arc::new(MemorySnapshotStore::new()),
        EntityConfig {
            node_id: format!("node-{i}"),
            ..EntityConfig::default()
        },
    )
    .expect("host");
    let sharding = Sharding::start(
        transport,
        cluster.watch(),
        &singletons,
        vec![ShardedType {
            type_name: Tally::TYPE_NAME.into(),
            host: Some(Arc::new(host)),
            settings: ShardingSettings {
                number_of_shards: 10,
                ..ShardingSettings::default()
            },
            role: None,
            store: store.clone() as Arc<dyn CoordinatorStore>,
            remember: None,
            message_version: Tally::MESSAGE_VERSION,
        }],
        RuntimeSettings::default(),
    )
    .expect("sharding");
    TypedNode {
        cluster,
        sharding,
        _singletons: singletons,
    }
}

fn tally(node: &TypedNode, id: &str) -> EntityRef<Tally> {
    EntityRef::new(node.sharding.region(Tally::TYPE_NAME).expect("region"), id)
}

/// The forwarded commands and replies of the sharding service sent so far, taken.
type Seen = Arc<Mutex<Vec<ShardingFrame>>>;

fn tap(network: &MemoryNetwork) -> Seen {
    let seen: Seen = Arc::default();
    let sink = seen.clone();
    network.set_tap(Some(Arc::new(move |_from, _to, frame: &Frame| {
        if let Frame::OneWay { service, payload } = frame
            && *service == services::SHARDING
            && let Ok(frame) = wire::decode::<ShardingFrame>(payload)
            && matches!(
                frame,
                ShardingFrame::Forward { .. } | ShardingFrame::Reply { .. }
            )
        {
            sink.lock().unwrap().push(frame);
        }
    })));
    seen
}

fn taken(seen: &Seen) -> Vec<ShardingFrame> {
    std::mem::take(&mut *seen.lock().unwrap())
}

fn is_json(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(bytes).is_ok()
}

#[tokio::test(start_paused = true)]
async fn a_command_and_its_reply_cross_nodes_once_each_in_postcard() {
    let network = MemoryNetwork::new(9);
    let journal = MemoryJournal::new();
    let store = Arc::new(MemoryStore::default());
    let nodes = [
        start(&network, 0, &journal, &store),
        start(&network, 1, &journal, &store),
    ];
    wait_until("both nodes up", Duration::from_secs(30), || {
        all_up_typed(&nodes)
    })
    .await;
    wait_until("regions registered", Duration::from_secs(30), || {
        nodes.iter().all(|n| n.sharding.all_registered())
    })
    .await;
    // Placed by its first command; then asked from the node that does not run it.
    assert_eq!(tally(&nodes[0], "t").ask(TallyCommand::Add(1)).await, Ok(1));
    let state = nodes[0].sharding.region_state(Tally::TYPE_NAME).await;
    let on_first = state.is_some_and(|s| s.shards.iter().any(|(_, ids)| ids.contains(&"t".into())));
    let (home, caller) = if on_first { (0, 1) } else { (1, 0) };
    let seen = tap(&network);

    assert_eq!(
        tally(&nodes[caller], "t").ask(TallyCommand::Add(5)).await,
        Ok(6)
    );
    let frames = taken(&seen);
    let command = postcard::to_allocvec(&TallyCommand::Add(5)).unwrap();
    let reply = postcard::to_allocvec(&Ok::<u64, TallyRejection>(6)).unwrap();
    match frames.as_slice() {
        [
            ShardingFrame::Forward { ask, .. },
            ShardingFrame::Reply {
                result: Ok(answer), ..
            },
        ] => {
            assert_eq!(ask.payload, command, "the command, in postcard");
            assert_eq!(ask.message_version, Tally::MESSAGE_VERSION);
            assert_eq!(*answer, reply, "the reply, in postcard");
            assert!(!is_json(&ask.payload) && !is_json(answer));
        }
        other => panic!("expected one forward and one reply, saw {other:?}"),
    }

    // Asked where it runs, a command sends no sharding frame.
    assert_eq!(
        tally(&nodes[home], "t").ask(TallyCommand::Add(1)).await,
        Ok(7)
    );
    assert!(taken(&seen).is_empty(), "a local ask crossed nodes");

    // The rejection arrives as the entity type's own, on the other node.
    assert_eq!(
        tally(&nodes[caller], "t").ask(TallyCommand::Take(9)).await,
        Err(AskError::Rejected(TallyRejection::TooLittle {
            tally: 7,
            asked: 9
        }))
    );
    // And a tell reaches the entity without waiting for it.
    tally(&nodes[caller], "t")
        .tell(TallyCommand::Add(3))
        .expect("sent");
    wait_until("the tell applied", Duration::from_secs(10), || {
        journal.events("tally|t").len() == 4
    })
    .await;
    assert_eq!(
        tally(&nodes[caller], "t").ask(TallyCommand::Take(0)).await,
        Ok(10)
    );
    network.set_tap(None);
}

fn all_up_typed(nodes: &[TypedNode]) -> bool {
    nodes.iter().all(|node| {
        let s = node.cluster.snapshot();
        s.members.len() == nodes.len()
            && s.members
                .iter()
                .all(|m| m.status == tessera_cluster::MemberStatus::Up)
    })
}
