//! The command/event loop of one entity as a plain state machine (docs/src/design.md §2):
//! inputs are recovery results, commands, write and snapshot outcomes, each with `now_ms` where it
//! matters; outputs are [`Action`]s for the driver to carry out. It reads no clock, touches no
//! store and spawns nothing, so tests drive it through any interleaving.
//!
//! Lifecycle: `Recovering` (snapshot, then events, then the highest sequence number check) →
//! `Ready` ⇄ `Persisting` (one write in flight at a time) → `Stopped`. Commands that arrive
//! while recovering or persisting wait in a bounded stash and are handled, in order, as soon as
//! the entity is ready again. The state only ever changes by applying *persisted* events, so it
//! is always the fold of the log up to [`EntityMachine::sequence_nr`].
//!
//! `R` is whatever the driver uses to answer a caller (a oneshot sender in the runtime, a
//! number in tests).

use crate::codec::Codec;
use crate::entity::{EffectKind, EntityType, ReplyFn};
use crate::error::{AskError, EntityError};
use crate::id::EntityId;
use crate::retention::{self, Retention};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::Arc;
use tessera_journal::{AtomicWrite, JournalError, Manifest, NewEvent, PersistentRepr};
use tessera_snapshot::{Snapshot, SnapshotError, SnapshotMetadata};

/// A reply for a caller: the handler's reply, or why there is none.
pub type AskResult<E> = Result<<E as EntityType>::Reply, AskError<<E as EntityType>::Rejection>>;

/// The part of [`EntityConfig`](crate::EntityConfig) the machine itself applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MachineSettings {
    /// Snapshot at each multiple of this many events (0: never).
    pub snapshot_every: u64,
    /// Snapshots kept (keep-N retention).
    pub keep_snapshots: u64,
    /// Delete the events covered by the oldest kept snapshot.
    pub delete_events_on_snapshot: bool,
    /// Most commands held while recovering or persisting.
    pub stash_capacity: usize,
    /// Confirm with the journal that the state is current before answering from it without
    /// persisting (a reply, a rejection): for a journal whose logs another node may take over.
    pub confirm_reads: bool,
}

/// What the driver must do.
pub enum Action<E: EntityType, R> {
    /// Answer a caller.
    Reply { to: R, result: AskResult<E> },
    /// Append this write; report the outcome with [`EntityMachine::persisted`].
    Persist(AtomicWrite),
    /// Confirm that this entity still writes its log and that the log ends at `highest`;
    /// report the outcome with [`EntityMachine::confirmed`].
    Confirm { highest: u64 },
    /// Save this snapshot, then apply its retention; report the outcome with
    /// [`EntityMachine::snapshot_finished`].
    Snapshot(SnapshotJob),
    /// The entity is done: finish the write and snapshot in flight, then hand the stashed
    /// commands ([`EntityMachine::take_stash`]) to the next incarnation.
    Stop,
}

/// A snapshot to save and what to delete once it is saved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotJob {
    /// Where and when.
    pub metadata: SnapshotMetadata,
    /// The state's manifest.
    pub manifest: Manifest,
    /// The encoded state.
    pub payload: Bytes,
    /// Snapshots (and, if `delete_events`, events) this snapshot lets go.
    pub retention: Option<Retention>,
    /// Whether to delete the events up to `retention.delete_events_up_to`.
    pub delete_events: bool,
}

/// A write in flight: the events (to apply once stored) and whom to answer.
struct InFlight<E: EntityType, R> {
    events: Vec<E::Event>,
    reply: ReplyFn<E>,
    reply_to: R,
    stop: bool,
}

/// An answer computed from the state, held until the state is confirmed current.
struct Unconfirmed<E: EntityType, R> {
    result: AskResult<E>,
    reply_to: R,
    stop: bool,
}

enum Phase<E: EntityType, R> {
    Recovering,
    Ready,
    Persisting(InFlight<E, R>),
    Confirming(Unconfirmed<E, R>),
    /// `failed`: stopped by a failure rather than by the handler's stop effect.
    Stopped {
        failed: bool,
    },
}

/// One entity's command/event loop. See the module documentation.
pub struct EntityMachine<E: EntityType, R> {
    entity: Arc<E>,
    codec: Arc<Codec<E>>,
    persistence_id: String,
    writer_id: String,
    settings: MachineSettings,
    phase: Phase<E, R>,
    state: E::State,
    sequence_nr: u64,
    stash: VecDeque<(E::Command, R)>,
    snapshot_in_flight: bool,
    snapshot_pending: bool,
    /// Why the machine last failed (a recovery, say), for a driver with nobody waiting to
    /// hear it from a reply.
    failure: Option<EntityError>,
}

impl<E: EntityType, R> EntityMachine<E, R> {
    /// A machine for entity `id`, about to recover. `writer_id` names this incarnation in the
    /// events it writes.
    pub fn new(
        entity: Arc<E>,
        codec: Arc<Codec<E>>,
        id: &EntityId,
        writer_id: String,
        settings: MachineSettings,
    ) -> Self {
        let state = entity.initial_state(id.as_str());
        EntityMachine {
            persistence_id: id.persistence_id(E::TYPE_NAME),
            entity,
            codec,
            writer_id,
            settings,
            phase: Phase::Recovering,
            state,
            sequence_nr: 0,
            stash: VecDeque::new(),
            snapshot_in_flight: false,
            snapshot_pending: false,
            failure: None,
        }
    }

    /// The entity's persistence id (`{type}|{id}`).
    pub fn persistence_id(&self) -> &str {
        &self.persistence_id
    }

    /// The current state: the fold of the persisted events up to [`Self::sequence_nr`].
    pub fn state(&self) -> &E::State {
        &self.state
    }

    /// The sequence number of the last event applied.
    pub fn sequence_nr(&self) -> u64 {
        self.sequence_nr
    }

    /// Commands waiting in the stash.
    pub fn stashed(&self) -> usize {
        self.stash.len()
    }

    /// True once recovery succeeded and until the entity stops.
    pub fn is_recovered(&self) -> bool {
        matches!(
            self.phase,
            Phase::Ready | Phase::Persisting(_) | Phase::Confirming(_)
        )
    }

    /// True when the entity stopped (by an effect or a failure).
    pub fn is_stopped(&self) -> bool {
        matches!(self.phase, Phase::Stopped { .. })
    }

    /// True when the entity stopped because recovery, a write or a read confirmation failed,
    /// false when it is running or its handler asked it to stop.
    pub fn stopped_by_failure(&self) -> bool {
        matches!(self.phase, Phase::Stopped { failed: true })
    }

    /// Why the machine last failed (its recovery, say), if it did.
    pub fn failure(&self) -> Option<&EntityError> {
        self.failure.as_ref()
    }

    /// True when a write is in flight.
    pub fn is_persisting(&self) -> bool {
        matches!(self.phase, Phase::Persisting(_))
    }

    /// True when a snapshot job is in flight.
    pub fn is_snapshotting(&self) -> bool {
        self.snapshot_in_flight
    }

    /// True when nothing is going on: ready, nothing stashed, nothing in flight. Only an idle
    /// entity passivates.
    pub fn is_idle(&self) -> bool {
        matches!(self.phase, Phase::Ready) && self.stash.is_empty() && !self.snapshot_in_flight
    }

    /// Removes the stashed commands (after a stop, for the next incarnation).
    pub fn take_stash(&mut self) -> VecDeque<(E::Command, R)> {
        std::mem::take(&mut self.stash)
    }

    fn entity_error_context(&self) -> String {
        self.persistence_id.clone()
    }

    // ---- recovery -----------------------------------------------------------------------

    /// The latest snapshot was loaded (or failed to load). Returns the first sequence number
    /// to replay, or `None` when recovery failed (then `out` holds the failure).
    pub fn snapshot_loaded(
        &mut self,
        loaded: Result<Option<Snapshot>, SnapshotError>,
        out: &mut Vec<Action<E, R>>,
    ) -> Option<u64> {
        match loaded {
            Ok(None) => Some(1),
            Ok(Some(snapshot)) => {
                let sequence_nr = snapshot.metadata.sequence_nr;
                match self
                    .codec
                    .decode_state(&self.entity, &snapshot.manifest, &snapshot.payload)
                {
                    Ok(state) => {
                        self.state = state;
                        self.sequence_nr = sequence_nr;
                        Some(sequence_nr.saturating_add(1))
                    }
                    Err(e) => {
                        self.recovery_failed(format!("snapshot at {sequence_nr}: {e}"), out);
                        None
                    }
                }
            }
            Err(e) => {
                self.recovery_failed(format!("loading the latest snapshot: {e}"), out);
                None
            }
        }
    }

    /// One replayed event. Returns false when recovery failed (stop replaying).
    pub fn event_replayed(&mut self, event: &PersistentRepr, out: &mut Vec<Action<E, R>>) -> bool {
        let expected = self.sequence_nr + 1;
        if event.sequence_nr != expected {
            self.recovery_failed(
                format!(
                    "event {expected} is missing (the replay continued at {}): deleted \
                     without a snapshot that covers it?",
                    event.sequence_nr
                ),
                out,
            );
            return false;
        }
        match self
            .codec
            .decode_event(&self.entity, &event.manifest, &event.payload)
        {
            Ok(decoded) => {
                self.entity.apply_event(&mut self.state, &decoded);
                self.sequence_nr = event.sequence_nr;
                true
            }
            Err(e) => {
                self.recovery_failed(format!("event {}: {e}", event.sequence_nr), out);
                false
            }
        }
    }

    /// The replay failed midway.
    pub fn replay_failed(&mut self, error: &JournalError, out: &mut Vec<Action<E, R>>) {
        self.recovery_failed(format!("replaying events: {error}"), out);
    }

    /// The replay ended; `highest` is the journal's highest sequence number of the log, read
    /// afterwards. It must be where the replay ended: anything else means events are missing
    /// or the snapshot is ahead of the journal, and the entity would write a corrupt log.
    pub fn recovery_completed(
        &mut self,
        highest: Result<u64, JournalError>,
        now_ms: u64,
        out: &mut Vec<Action<E, R>>,
    ) {
        if !matches!(self.phase, Phase::Recovering) {
            return;
        }
        match highest {
            Ok(highest) if highest == self.sequence_nr => {
                self.phase = Phase::Ready;
                self.unstash(now_ms, out);
            }
            Ok(highest) if highest > self.sequence_nr => self.recovery_failed(
                format!(
                    "events {}..={highest} are missing from the replay",
                    self.sequence_nr + 1
                ),
                out,
            ),
            Ok(highest) => self.recovery_failed(
                format!(
                    "the state is at sequence number {} but the journal's highest is {highest}: \
                     the journal lost events the snapshot covers",
                    self.sequence_nr
                ),
                out,
            ),
            Err(e) => {
                self.recovery_failed(format!("reading the highest sequence number: {e}"), out)
            }
        }
    }

    fn recovery_failed(&mut self, reason: String, out: &mut Vec<Action<E, R>>) {
        tracing::warn!(entity = %self.persistence_id, %reason, "entity recovery failed");
        let error = EntityError::RecoveryFailed {
            entity: self.entity_error_context(),
            reason,
        };
        self.fail(error, None, out);
    }

    // ---- commands -----------------------------------------------------------------------

    /// A command from a caller: handled now when ready, stashed (bounded) otherwise. After a
    /// stop it is stashed for the next incarnation.
    pub fn command(
        &mut self,
        command: E::Command,
        reply_to: R,
        now_ms: u64,
        out: &mut Vec<Action<E, R>>,
    ) {
        if matches!(self.phase, Phase::Ready) && self.stash.is_empty() {
            self.handle(command, reply_to, now_ms, out);
        } else if self.stash.len() >= self.settings.stash_capacity {
            out.push(Action::Reply {
                to: reply_to,
                result: Err(EntityError::StashFull {
                    entity: self.entity_error_context(),
                    capacity: self.settings.stash_capacity,
                }
                .into()),
            });
        } else {
            self.stash.push_back((command, reply_to));
            self.unstash(now_ms, out);
        }
    }

    /// Handles stashed commands while the entity is ready.
    fn unstash(&mut self, now_ms: u64, out: &mut Vec<Action<E, R>>) {
        while matches!(self.phase, Phase::Ready) {
            let Some((command, reply_to)) = self.stash.pop_front() else {
                return;
            };
            self.handle(command, reply_to, now_ms, out);
        }
    }

    fn handle(
        &mut self,
        command: E::Command,
        reply_to: R,
        now_ms: u64,
        out: &mut Vec<Action<E, R>>,
    ) {
        let effect = self.entity.handle_command(&self.state, command);
        match effect.kind {
            EffectKind::Reply(reply) => self.answer_from_state(Ok(reply), reply_to, false, out),
            EffectKind::Reject(rejection) => {
                self.answer_from_state(Err(AskError::Rejected(rejection)), reply_to, false, out)
            }
            EffectKind::Stop(reply) => self.answer_from_state(Ok(reply), reply_to, true, out),
            EffectKind::Persist {
                events,
                reply,
                stop,
            } if events.is_empty() => {
                let result = Ok(reply(&self.state));
                self.answer_from_state(result, reply_to, stop, out)
            }
            EffectKind::Persist {
                events,
                reply,
                stop,
            } => match self.encode(&events, now_ms) {
                Ok(write) => {
                    out.push(Action::Persist(write));
                    self.phase = Phase::Persisting(InFlight {
                        events,
                        reply,
                        reply_to,
                        stop,
                    });
                }
                Err(error) => out.push(Action::Reply {
                    to: reply_to,
                    result: Err(error.into()),
                }),
            },
        }
    }

    /// An answer computed from the state without persisting: sent at once, or, when reads are
    /// confirmed, once the journal confirms the state is current.
    fn answer_from_state(
        &mut self,
        result: AskResult<E>,
        reply_to: R,
        stop: bool,
        out: &mut Vec<Action<E, R>>,
    ) {
        if self.settings.confirm_reads {
            self.phase = Phase::Confirming(Unconfirmed {
                result,
                reply_to,
                stop,
            });
            out.push(Action::Confirm {
                highest: self.sequence_nr,
            });
            return;
        }
        out.push(Action::Reply {
            to: reply_to,
            result,
        });
        if stop {
            self.stop(false, out);
        }
    }

    /// The journal's answer to [`Action::Confirm`]. Confirmed: the held answer goes out.
    /// Otherwise the state may be stale: the caller hears that nothing was done, and the
    /// entity stops, leaving the stashed commands to its next incarnation.
    pub fn confirmed(
        &mut self,
        result: Result<(), JournalError>,
        now_ms: u64,
        out: &mut Vec<Action<E, R>>,
    ) {
        let Phase::Confirming(held) = std::mem::replace(&mut self.phase, Phase::Ready) else {
            return;
        };
        match result {
            Ok(()) => {
                out.push(Action::Reply {
                    to: held.reply_to,
                    result: held.result,
                });
                if held.stop {
                    self.stop(false, out);
                } else {
                    self.unstash(now_ms, out);
                }
            }
            Err(e) => {
                tracing::info!(entity = %self.persistence_id, error = %e, "state not confirmed current; stopping");
                out.push(Action::Reply {
                    to: held.reply_to,
                    result: Err(EntityError::NotConfirmed {
                        entity: self.entity_error_context(),
                        reason: e.to_string(),
                    }
                    .into()),
                });
                self.stop(true, out);
            }
        }
    }

    fn encode(&self, events: &[E::Event], now_ms: u64) -> Result<AtomicWrite, EntityError> {
        let mut encoded = Vec::with_capacity(events.len());
        for (sequence_nr, event) in (self.sequence_nr + 1..).zip(events) {
            let (manifest, payload) =
                self.codec
                    .encode_event(event)
                    .map_err(|e| EntityError::Encode {
                        entity: self.entity_error_context(),
                        reason: e.to_string(),
                    })?;
            encoded.push(NewEvent {
                sequence_nr,
                timestamp_ms: now_ms,
                manifest,
                payload,
                tags: self.entity.tags(event),
            });
        }
        Ok(AtomicWrite {
            persistence_id: self.persistence_id.clone(),
            writer_id: self.writer_id.clone(),
            events: encoded,
        })
    }

    /// The outcome of the write in flight. On success the events are applied, the caller
    /// gets the reply computed from the new state, a snapshot may be due, and stashed commands
    /// run. A full journal queue wrote nothing: the caller gets
    /// [`EntityError::JournalBusy`] and the entity carries on. On any other failure the caller
    /// hears whether the write certainly did not happen ([`EntityError::PersistNotApplied`])
    /// or may have ([`EntityError::PersistFailed`]), and the entity stops: only a new recovery
    /// knows the true state. The stashed commands were not handled: they go to the next
    /// incarnation.
    pub fn persisted(
        &mut self,
        result: Result<(), JournalError>,
        now_ms: u64,
        out: &mut Vec<Action<E, R>>,
    ) {
        let Phase::Persisting(in_flight) = std::mem::replace(&mut self.phase, Phase::Ready) else {
            return;
        };
        let InFlight {
            events,
            reply,
            reply_to,
            stop,
        } = in_flight;
        match result {
            Ok(()) => {
                let before = self.sequence_nr;
                for event in &events {
                    self.entity.apply_event(&mut self.state, event);
                }
                self.sequence_nr += events.len() as u64;
                out.push(Action::Reply {
                    to: reply_to,
                    result: Ok(reply(&self.state)),
                });
                if retention::snapshot_due(before, self.sequence_nr, self.settings.snapshot_every) {
                    self.request_snapshot(now_ms, out);
                }
                if stop {
                    self.stop(false, out);
                } else {
                    self.unstash(now_ms, out);
                }
            }
            Err(JournalError::QueueFull { capacity }) => {
                out.push(Action::Reply {
                    to: reply_to,
                    result: Err(EntityError::JournalBusy {
                        entity: self.entity_error_context(),
                        capacity,
                    }
                    .into()),
                });
                self.unstash(now_ms, out);
            }
            Err(e) => {
                tracing::warn!(entity = %self.persistence_id, error = %e, "persist failed; stopping");
                let entity = self.entity_error_context();
                let reason = e.to_string();
                let error = if e.is_not_applied() {
                    EntityError::PersistNotApplied { entity, reason }
                } else {
                    EntityError::PersistFailed { entity, reason }
                };
                out.push(Action::Reply {
                    to: reply_to,
                    result: Err(error.into()),
                });
                self.stop(true, out);
            }
        }
    }

    // ---- snapshots ----------------------------------------------------------------------

    /// One snapshot job at a time: a snapshot due while one is in flight is taken when it
    /// finishes, of the state at that time.
    fn request_snapshot(&mut self, now_ms: u64, out: &mut Vec<Action<E, R>>) {
        if self.snapshot_in_flight {
            self.snapshot_pending = true;
            return;
        }
        let (manifest, payload) = match self.codec.encode_state(&self.state) {
            Ok(encoded) => encoded,
            Err(e) => {
                tracing::warn!(entity = %self.persistence_id, error = %e, "cannot encode a snapshot; skipped");
                return;
            }
        };
        self.snapshot_in_flight = true;
        out.push(Action::Snapshot(SnapshotJob {
            metadata: SnapshotMetadata {
                persistence_id: self.persistence_id.clone(),
                sequence_nr: self.sequence_nr,
                timestamp_ms: now_ms,
            },
            manifest,
            payload,
            retention: retention::retention(
                self.sequence_nr,
                self.settings.snapshot_every,
                self.settings.keep_snapshots,
            ),
            delete_events: self.settings.delete_events_on_snapshot,
        }));
    }

    /// The snapshot job finished. A failure is logged and otherwise ignored: the events are
    /// all still there, recovery only replays more of them.
    pub fn snapshot_finished(
        &mut self,
        result: Result<(), String>,
        now_ms: u64,
        out: &mut Vec<Action<E, R>>,
    ) {
        self.snapshot_in_flight = false;
        if let Err(reason) = result {
            tracing::warn!(entity = %self.persistence_id, %reason, "snapshot failed");
        }
        if std::mem::take(&mut self.snapshot_pending) && !self.is_stopped() {
            self.request_snapshot(now_ms, out);
        }
    }

    // ---- stopping -----------------------------------------------------------------------

    fn stop(&mut self, failed: bool, out: &mut Vec<Action<E, R>>) {
        self.phase = Phase::Stopped { failed };
        out.push(Action::Stop);
    }

    /// Answers `first` and every stashed command with `error`, and stops.
    fn fail(&mut self, error: EntityError, first: Option<R>, out: &mut Vec<Action<E, R>>) {
        self.failure = Some(error.clone());
        for to in first
            .into_iter()
            .chain(self.stash.drain(..).map(|(_, to)| to))
        {
            out.push(Action::Reply {
                to,
                result: Err(error.clone().into()),
            });
        }
        self.stop(true, out);
    }
}
