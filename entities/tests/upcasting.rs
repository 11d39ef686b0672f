//! Events and snapshots written by an older release (an older manifest version) are recognised
//! by their manifest and upcast; unknown manifests fail recovery with an error naming them.

mod support;

use serde::{Deserialize, Serialize};
use std::sync::Arc;
use support::{MemoryJournal, MemorySnapshots, SharedJournal, SharedSnapshots};
use tessera_entities::{
    AskError, CodecError, Effect, EntityError, EntityHost, EntityType, decode_postcard,
};
use tessera_journal::Manifest;

/// Version 1 of the event: an amount in a u32.
#[derive(Serialize, Deserialize)]
enum EventV1 {
    Added(u32),
}

/// Version 2 (current): a u64 amount and a note.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Event {
    Added { amount: u64, note: String },
}

/// Version 1 of the state: the total only.
#[derive(Serialize, Deserialize)]
struct StateV1 {
    total: u32,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct State {
    total: u64,
    notes: Vec<String>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Never;

impl std::fmt::Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("never")
    }
}

struct Ledger;

impl EntityType for Ledger {
    type Command = Option<u64>;
    type Event = Event;
    type State = State;
    type Reply = (u64, usize);
    type Rejection = Never;

    const TYPE_NAME: &'static str = "ledger";
    const EVENT_MANIFEST: &'static str = "ledger.Event";
    const EVENT_VERSION: u32 = 2;
    const STATE_MANIFEST: &'static str = "ledger.State";
    const STATE_VERSION: u32 = 2;

    fn initial_state(&self, _entity_id: &str) -> State {
        State::default()
    }

    fn handle_command(&self, state: &State, command: Option<u64>) -> Effect<Self> {
        match command {
            Some(amount) => Effect::persist(Event::Added {
                amount,
                note: "v2".into(),
            })
            .then_reply(|s: &State| (s.total, s.notes.len())),
            None => Effect::reply((state.total, state.notes.len())),
        }
    }

    fn apply_event(&self, state: &mut State, event: &Event) {
        let Event::Added { amount, note } = event;
        state.total += amount;
        state.notes.push(note.clone());
    }

    fn upcast_event(&self, manifest: &Manifest, payload: &[u8]) -> Result<Event, CodecError> {
        match (&*manifest.type_name, manifest.version) {
            ("ledger.Event", 1) => {
                let EventV1::Added(amount) = decode_postcard(manifest, payload)?;
                Ok(Event::Added {
                    amount: amount.into(),
                    note: "upcast".into(),
                })
            }
            _ => Err(CodecError::unknown_manifest(
                manifest,
                Self::EVENT_MANIFEST,
                Self::EVENT_VERSION,
            )),
        }
    }

    fn upcast_state(&self, manifest: &Manifest, payload: &[u8]) -> Result<State, CodecError> {
        match (&*manifest.type_name, manifest.version) {
            ("ledger.State", 1) => {
                let old: StateV1 = decode_postcard(manifest, payload)?;
                Ok(State {
                    total: old.total.into(),
                    notes: Vec::new(),
                })
            }
            _ => Err(CodecError::unknown_manifest(
                manifest,
                Self::STATE_MANIFEST,
                Self::STATE_VERSION,
            )),
        }
    }
}

fn host(journal: &Arc<MemoryJournal>, snapshots: &Arc<MemorySnapshots>) -> EntityHost<Ledger> {
    EntityHost::start(
        Ledger,
        Arc::new(SharedJournal(journal.clone())),
        Arc::new(SharedSnapshots(snapshots.clone())),
        support::config(),
    )
    .unwrap()
}

fn v1_event(amount: u32) -> Vec<u8> {
    postcard::to_allocvec(&EventV1::Added(amount)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_events_are_upcast_and_new_ones_written_under_the_new_version() {
    let journal = MemoryJournal::new();
    let snapshots = MemorySnapshots::new();
    let v1 = Manifest::new("ledger.Event", 1);
    journal.insert("ledger|x", 1, v1.clone(), v1_event(5));
    journal.insert("ledger|x", 2, v1, v1_event(6));
    let host = host(&journal, &snapshots);
    assert_eq!(host.ask("x", None).await, Ok((11, 2)));
    assert_eq!(host.ask("x", Some(1)).await, Ok((12, 3)));
    host.shutdown().await;

    // Mixed versions in one log recover too.
    let host2 = self::host(&journal, &snapshots);
    assert_eq!(host2.ask("x", None).await, Ok((12, 3)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_snapshot_is_upcast() {
    let journal = MemoryJournal::new();
    let snapshots = MemorySnapshots::new();
    let v1 = Manifest::new("ledger.Event", 1);
    journal.insert("ledger|y", 1, v1.clone(), v1_event(1));
    journal.insert("ledger|y", 2, v1, v1_event(2));
    snapshots.insert(
        "ledger|y",
        1,
        Manifest::new("ledger.State", 1),
        postcard::to_allocvec(&StateV1 { total: 100 }).unwrap(),
    );
    let host = host(&journal, &snapshots);
    assert_eq!(host.ask("y", None).await, Ok((102, 1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_manifest_or_undecodable_payload_fails_recovery_naming_it() {
    let journal = MemoryJournal::new();
    let snapshots = MemorySnapshots::new();
    journal.insert("ledger|z", 1, Manifest::new("ledger.Event", 3), vec![0]);
    journal.insert(
        "ledger|w",
        1,
        Manifest::new("ledger.Event", 2),
        vec![0xff; 3],
    );
    let host = host(&journal, &snapshots);
    match host.ask("z", None).await {
        Err(AskError::Entity(EntityError::RecoveryFailed { reason, .. })) => assert_eq!(
            reason,
            "event 1: unknown manifest ledger.Event@3: this release reads ledger.Event@2 and \
             whatever the upcaster knows"
        ),
        other => panic!("{other:?}"),
    }
    let error = host.ask("w", None).await.unwrap_err().to_string();
    assert!(
        error.contains("event 1: cannot decode ledger.Event@2"),
        "{error}"
    );
}
