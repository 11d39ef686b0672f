//! A test kit for entity authors, in the spirit of Akka's `EventSourcedBehaviorTestKit`: one
//! entity of a type runs in memory, one command at a time, through the same command/event
//! loop a node runs it with. A test sees the events each command persisted, the reply or the
//! rejection, and the state; it can restart the entity from what was stored. No RocksDB, no
//! cluster and no async runtime: [`EntityTestKit::run`] returns when the command is done.
//!
//! Every command also checks that what crosses a wire or a disk survives the trip: the
//! command and the answer in postcard (as between nodes) and, unless switched off, in JSON
//! (as over HTTP); each event and the state through the type's codec under its manifest. A
//! value that does not decode, or decodes to one that encodes differently, fails the run with
//! an error naming it.
//!
//! ```
//! # use tessera::testkit::EntityTestKit;
//! # fn check<Counter: tessera::EntityType>(
//! #     counter: Counter,
//! #     increment: Counter::Command,
//! # ) -> Result<(), tessera::testkit::TestKitError> {
//! let mut kit = EntityTestKit::new(counter, "c-1")?;
//! let result = kit.run(increment)?;
//! assert_eq!(result.events.len(), 1); // what the command persisted
//! kit.restart()?; // a new incarnation, recovered from the stored events
//! # Ok(())
//! # }
//! ```

use futures::StreamExt;
use futures::executor::block_on;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::sync::Arc;
use tessera_entities::machine::{Action, EntityMachine, MachineSettings, SnapshotJob};
use tessera_entities::{AskError, Codec, EntityError, EntityId, EntityType};
use tessera_journal::{Journal, MemoryJournal, PersistentRepr};
use tessera_snapshot::{MemorySnapshotStore, SnapshotSelectionCriteria, SnapshotStore};

/// Why a test kit run failed: not the entity's answer (a rejection is an answer), but a value
/// that does not survive its encoding, or the runtime refusing the command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TestKitError {
    /// A value cannot be encoded or decoded.
    #[error("the {what} of entity type {type_name} does not {step}: {reason}")]
    Codec {
        type_name: &'static str,
        /// `command`, `reply`, `event 3`, `state`...
        what: String,
        /// `encode in postcard`, `decode from JSON`...
        step: &'static str,
        reason: String,
    },
    /// A value that decodes to one whose encoding differs: the encoding loses something.
    #[error(
        "the {what} of entity type {type_name} does not round-trip in {format}: encoded again \
         after decoding it differs ({before} bytes, then {after})"
    )]
    RoundTrip {
        type_name: &'static str,
        what: String,
        format: &'static str,
        before: usize,
        after: usize,
    },
    /// The entity's runtime refused the command or failed it (a recovery that failed, say).
    #[error(transparent)]
    Entity(#[from] EntityError),
}

/// What one command did.
#[derive(Debug)]
pub struct CommandResult<E: EntityType> {
    /// The events it persisted, read back from the journal through the type's codec.
    pub events: Vec<E::Event>,
    /// The entity's reply, or its rejection.
    pub reply: Result<E::Reply, E::Rejection>,
}

/// Settings of a test kit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestKitSettings {
    /// A snapshot each time the sequence number crosses a multiple of this many events (0:
    /// never), as a node takes them; [`EntityTestKit::restart`] recovers from the latest.
    pub snapshot_every: u64,
    /// Also check that commands, replies and rejections round-trip in JSON, the HTTP API's
    /// encoding.
    pub check_json: bool,
}

impl Default for TestKitSettings {
    /// No snapshots; JSON checked.
    fn default() -> Self {
        TestKitSettings {
            snapshot_every: 0,
            check_json: true,
        }
    }
}

/// One entity of type `E`, run in memory. See the module documentation.
pub struct EntityTestKit<E: EntityType> {
    entity: Arc<E>,
    codec: Arc<Codec<E>>,
    id: EntityId,
    settings: TestKitSettings,
    journal: MemoryJournal,
    snapshots: MemorySnapshotStore,
    machine: EntityMachine<E, ()>,
    incarnation: u64,
    /// The kit's clock, in milliseconds: one tick per command, for the events' timestamps.
    now_ms: u64,
}

impl<E: EntityType> EntityTestKit<E> {
    /// Entity `entity_id` of `entity`'s type, new (no events), with the default settings.
    pub fn new(entity: E, entity_id: &str) -> Result<Self, TestKitError> {
        Self::with_settings(entity, entity_id, TestKitSettings::default())
    }

    /// [`EntityTestKit::new`] with `settings`.
    pub fn with_settings(
        entity: E,
        entity_id: &str,
        settings: TestKitSettings,
    ) -> Result<Self, TestKitError> {
        let entity = Arc::new(entity);
        let codec = Arc::new(Codec::new());
        let id = EntityId::new(entity_id)?;
        let machine = Self::machine(&entity, &codec, &id, &settings, 1);
        let mut kit = EntityTestKit {
            entity,
            codec,
            id,
            settings,
            journal: MemoryJournal::new(),
            snapshots: MemorySnapshotStore::new(),
            machine,
            incarnation: 1,
            now_ms: 0,
        };
        kit.recover()?;
        Ok(kit)
    }

    fn machine(
        entity: &Arc<E>,
        codec: &Arc<Codec<E>>,
        id: &EntityId,
        settings: &TestKitSettings,
        incarnation: u64,
    ) -> EntityMachine<E, ()> {
        EntityMachine::new(
            entity.clone(),
            codec.clone(),
            id,
            format!("testkit-{incarnation}"),
            MachineSettings {
                snapshot_every: settings.snapshot_every,
                keep_snapshots: 2,
                delete_events_on_snapshot: false,
                stash_capacity: 1,
                confirm_reads: false,
            },
        )
    }

    /// The entity's persistence id (`<type>|<id>`).
    pub fn persistence_id(&self) -> String {
        self.id.persistence_id(E::TYPE_NAME)
    }

    /// The entity's state now.
    pub fn state(&self) -> &E::State {
        self.machine.state()
    }

    /// The journal the kit stores the entity's events in (to seed it with events of an older
    /// release, say, before a [`EntityTestKit::restart`]).
    pub fn journal(&self) -> &MemoryJournal {
        &self.journal
    }

    /// The snapshot store the kit saves the entity's snapshots in.
    pub fn snapshots(&self) -> &MemorySnapshotStore {
        &self.snapshots
    }

    /// Every event stored so far, decoded through the type's codec.
    pub fn events(&self) -> Result<Vec<E::Event>, TestKitError> {
        self.journal
            .events(&self.persistence_id())
            .iter()
            .map(|stored| self.decode_event(stored))
            .collect()
    }

    /// Stops the entity and starts a new incarnation, which recovers from the latest snapshot
    /// and the events after it, as on a node after a passivation, a handoff or a crash.
    pub fn restart(&mut self) -> Result<(), TestKitError> {
        self.incarnation += 1;
        self.machine = Self::machine(
            &self.entity,
            &self.codec,
            &self.id,
            &self.settings,
            self.incarnation,
        );
        self.recover()
    }

    /// Runs `command` to its end: the events it persisted, and the reply or the rejection.
    /// An entity that stopped (its handler's stop effect) is restarted first, as a node
    /// starts a new incarnation for the next command.
    pub fn run(&mut self, command: E::Command) -> Result<CommandResult<E>, TestKitError> {
        if self.machine.is_stopped() {
            self.restart()?;
        }
        let command = self.crossed("command", command)?;
        self.now_ms += 1;
        let before = self.machine.sequence_nr();
        let mut out = Vec::new();
        self.machine.command(command, (), self.now_ms, &mut out);
        let answer = self.drive(out)?;
        let events = self
            .journal
            .events(&self.persistence_id())
            .iter()
            .filter(|stored| stored.sequence_nr > before)
            .map(|stored| self.decode_event(stored))
            .collect::<Result<Vec<_>, _>>()?;
        self.check_state()?;
        let reply = match answer {
            Ok(reply) => Ok(reply),
            Err(AskError::Rejected(rejection)) => Err(rejection),
            Err(AskError::Entity(error)) => return Err(error.into()),
        };
        let reply = self.crossed("answer", reply)?;
        Ok(CommandResult { events, reply })
    }

    /// Carries out the machine's actions until it has answered the command.
    fn drive(
        &mut self,
        mut actions: Vec<Action<E, ()>>,
    ) -> Result<Result<E::Reply, AskError<E::Rejection>>, TestKitError> {
        let mut answer = None;
        while !actions.is_empty() {
            let mut next = Vec::new();
            for action in actions {
                match action {
                    Action::Reply { result, .. } => answer = Some(result),
                    Action::Persist(write) => {
                        let stored = block_on(self.journal.append(write));
                        self.machine.persisted(stored, self.now_ms, &mut next);
                    }
                    Action::Confirm { .. } => {
                        self.machine.confirmed(Ok(()), self.now_ms, &mut next);
                    }
                    Action::Snapshot(job) => {
                        let saved = self.snapshot(job);
                        self.machine
                            .snapshot_finished(saved, self.now_ms, &mut next);
                    }
                    // The next command starts a new incarnation.
                    Action::Stop => {}
                }
            }
            actions = next;
        }
        answer.ok_or_else(|| {
            EntityError::Stopped {
                entity: self.persistence_id(),
            }
            .into()
        })
    }

    /// Saves a snapshot and applies its retention, as a node's host does.
    fn snapshot(&self, job: SnapshotJob) -> Result<(), String> {
        let pid = job.metadata.persistence_id.clone();
        block_on(self.snapshots.save(job.metadata, job.manifest, job.payload))
            .map_err(|e| e.to_string())?;
        if let Some(retention) = job.retention {
            let older = SnapshotSelectionCriteria::up_to(retention.delete_snapshots_up_to);
            block_on(self.snapshots.delete_matching(&pid, older)).map_err(|e| e.to_string())?;
            if job.delete_events {
                block_on(self.journal.delete_to(&pid, retention.delete_events_up_to))
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    /// Recovers the machine from the latest snapshot and the events after it.
    fn recover(&mut self) -> Result<(), TestKitError> {
        let pid = self.persistence_id();
        let mut out = Vec::new();
        let latest = block_on(
            self.snapshots
                .load(&pid, SnapshotSelectionCriteria::latest()),
        );
        if let Some(from) = self.machine.snapshot_loaded(latest, &mut out) {
            let mut events = self.journal.replay(&pid, from, u64::MAX, u64::MAX);
            while let Some(event) = block_on(events.next()) {
                let replayed = match event {
                    Ok(event) => self.machine.event_replayed(&event, &mut out),
                    Err(error) => {
                        self.machine.replay_failed(&error, &mut out);
                        false
                    }
                };
                if !replayed {
                    break;
                }
            }
            let highest = block_on(self.journal.highest_sequence_nr(&pid));
            self.machine
                .recovery_completed(highest, self.now_ms, &mut out);
        }
        for action in out {
            if let Action::Reply {
                result: Err(AskError::Entity(error)),
                ..
            } = action
            {
                return Err(error.into());
            }
        }
        if self.machine.stopped_by_failure() {
            let error = self
                .machine
                .failure()
                .cloned()
                .unwrap_or(EntityError::RecoveryFailed {
                    entity: pid,
                    reason: "the entity stopped while recovering".to_string(),
                });
            return Err(error.into());
        }
        Ok(())
    }

    fn decode_event(&self, stored: &PersistentRepr) -> Result<E::Event, TestKitError> {
        let what = || format!("event {}", stored.sequence_nr);
        let event = self
            .codec
            .decode_event(&self.entity, &stored.manifest, &stored.payload)
            .map_err(|e| self.codec_error(what(), "decode through its codec", e.to_string()))?;
        // Only events under today's manifest must encode back to their bytes (an older one is
        // upcast).
        if stored.manifest == *self.codec.event_manifest() {
            let (_, again) = self
                .codec
                .encode_event(&event)
                .map_err(|e| self.codec_error(what(), "encode through its codec", e.to_string()))?;
            self.same_bytes(what(), "postcard", &stored.payload, &again)?;
        }
        Ok(event)
    }

    /// The state encodes through the codec, decodes, and encodes to the same bytes again.
    fn check_state(&self) -> Result<(), TestKitError> {
        let encode = |state: &E::State| {
            self.codec.encode_state(state).map_err(|e| {
                self.codec_error("state".into(), "encode through its codec", e.to_string())
            })
        };
        let (manifest, bytes) = encode(self.state())?;
        let decoded = self
            .codec
            .decode_state(&self.entity, &manifest, &bytes)
            .map_err(|e| {
                self.codec_error("state".into(), "decode through its codec", e.to_string())
            })?;
        let (_, again) = encode(&decoded)?;
        self.same_bytes("state".into(), "postcard", &bytes, &again)
    }

    /// `value` after the trips it makes between nodes (postcard) and, when checked, over
    /// HTTP (JSON): the decoded copy, checked to encode as the original did.
    fn crossed<T: Serialize + DeserializeOwned>(
        &self,
        what: &str,
        value: T,
    ) -> Result<T, TestKitError> {
        let bytes = postcard::to_allocvec(&value)
            .map_err(|e| self.codec_error(what.into(), "encode in postcard", e.to_string()))?;
        let decoded: T = postcard::from_bytes(&bytes)
            .map_err(|e| self.codec_error(what.into(), "decode from postcard", e.to_string()))?;
        let again = postcard::to_allocvec(&decoded)
            .map_err(|e| self.codec_error(what.into(), "encode in postcard", e.to_string()))?;
        self.same_bytes(what.into(), "postcard", &bytes, &again)?;
        if !self.settings.check_json {
            return Ok(decoded);
        }
        let json = serde_json::to_vec(&decoded)
            .map_err(|e| self.codec_error(what.into(), "encode in JSON", e.to_string()))?;
        let from_json: T = serde_json::from_slice(&json)
            .map_err(|e| self.codec_error(what.into(), "decode from JSON", e.to_string()))?;
        let json_again = serde_json::to_vec(&from_json)
            .map_err(|e| self.codec_error(what.into(), "encode in JSON", e.to_string()))?;
        self.same_bytes(what.into(), "JSON", &json, &json_again)?;
        Ok(from_json)
    }

    fn same_bytes(
        &self,
        what: String,
        format: &'static str,
        before: &[u8],
        after: &[u8],
    ) -> Result<(), TestKitError> {
        if before == after {
            return Ok(());
        }
        Err(TestKitError::RoundTrip {
            type_name: E::TYPE_NAME,
            what,
            format,
            before: before.len(),
            after: after.len(),
        })
    }

    fn codec_error(&self, what: String, step: &'static str, reason: String) -> TestKitError {
        TestKitError::Codec {
            type_name: E::TYPE_NAME,
            what,
            step,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::test_support::{Tally, TallyCommand, TallyRejection};

    #[test]
    fn a_command_shows_its_events_reply_and_state() {
        let mut kit = EntityTestKit::new(Tally, "t").unwrap();
        let added = kit.run(TallyCommand::Add(5)).unwrap();
        assert_eq!(added.events, [5]);
        assert_eq!(added.reply, Ok(5));
        let refused = kit.run(TallyCommand::Take(9)).unwrap();
        assert!(refused.events.is_empty());
        assert_eq!(
            refused.reply,
            Err(TallyRejection::TooLittle { tally: 5, asked: 9 })
        );
        assert_eq!(*kit.state(), 5);
        assert_eq!(kit.events().unwrap(), [5]);
    }

    #[test]
    fn a_restart_recovers_from_the_stored_events_and_snapshots() {
        let settings = TestKitSettings {
            snapshot_every: 2,
            ..TestKitSettings::default()
        };
        let mut kit = EntityTestKit::with_settings(Tally, "t", settings).unwrap();
        for n in 1..=7 {
            kit.run(TallyCommand::Add(n)).unwrap();
        }
        // The last two kept, as a node keeps them.
        assert_eq!(kit.snapshots().sequence_nrs(&kit.persistence_id()), [4, 6]);
        kit.restart().unwrap();
        assert_eq!(*kit.state(), 28);
        assert_eq!(kit.run(TallyCommand::Get).unwrap().reply, Ok(28));
    }

    #[test]
    fn a_restart_that_cannot_read_an_event_says_why() {
        use tessera_journal::{AtomicWrite, Manifest, NewEvent};
        let mut kit = EntityTestKit::new(Tally, "t").unwrap();
        kit.run(TallyCommand::Add(1)).unwrap();
        // An event of a newer release, which this one's upcaster does not know.
        let newer = AtomicWrite {
            persistence_id: kit.persistence_id(),
            writer_id: "newer".into(),
            events: vec![NewEvent {
                sequence_nr: 2,
                timestamp_ms: 0,
                manifest: Manifest::new("tally.Event", 2),
                payload: vec![1].into(),
                tags: Vec::new(),
            }],
        };
        block_on(kit.journal().append(newer)).unwrap();
        let error = kit.restart().unwrap_err().to_string();
        assert!(error.contains("unknown manifest tally.Event@2"), "{error}");
    }
}
