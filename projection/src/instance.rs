//! One run of one projection instance: take the offset log over, read the offset, follow
//! the events of the instance's slices from it, hand them to the handler, save the offset.
//!
//! Invariants: within a log the handler sees events in sequence order, and an event of a
//! log only after every earlier one of that log was handled or skipped (the offset moves by
//! one per event). The saved offset never passes an event that was neither handled nor
//! skipped, so a run that ends anywhere resumes with nothing lost; what it handled after the
//! last save is handled again by the next run (at-least-once). A save is written while the
//! handler goes on, one at a time: each records the offset as it was when the save started,
//! and the next starts once it is written.
//!
//! A paused instance ([`crate::control`]) ends its run (saving its offset) and waits to be
//! resumed; a reset asked by an operator is applied when the instance next opens its offset
//! log, through its fenced writer, before it reads a single event.

use crate::control::ControlState;
use crate::envelope::Envelope;
use crate::exactly_once::{InstanceKey, OffsetCommit};
use crate::handler::{HandlerError, Handling};
use crate::offset_log::{OffsetError, OffsetJournal, OffsetLog, offset_log_id};
use crate::settings::{FailureAction, ProjectionSettings};
use crate::status::{InstanceStatus, ProjectionStatuses, RunState};
use futures::StreamExt;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tessera_daemon::DaemonContext;
use tessera_entities::{Codec, EntityType};
use tessera_journal::slice::SliceRange;
use tessera_journal::{QueryMode, SliceEnvelope, SliceItem, SliceOffset};
use tessera_persistence::{QueryProgress, ReplicatedJournal};
use tessera_replication::Epoch;
use tokio::sync::watch;
use tokio::time::Instant;

/// How often an instance refreshes its lag in its status while nothing arrives.
const LAG_REFRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// What a run needs besides its context.
pub struct InstanceSetup<E: EntityType> {
    pub name: Arc<str>,
    pub entity: Arc<E>,
    pub handling: Handling<E>,
    pub settings: ProjectionSettings,
    pub journal: Arc<ReplicatedJournal>,
    pub statuses: ProjectionStatuses,
    /// Names this node in the offset log's writer id.
    pub node: String,
    /// What operators asked of the projection.
    pub control: watch::Receiver<ControlState>,
}

impl<E: EntityType> Clone for InstanceSetup<E> {
    fn clone(&self) -> Self {
        InstanceSetup {
            name: self.name.clone(),
            entity: self.entity.clone(),
            handling: self.handling.clone(),
            settings: self.settings.clone(),
            journal: self.journal.clone(),
            statuses: self.statuses.clone(),
            node: self.node.clone(),
            control: self.control.clone(),
        }
    }
}

/// How a run ended.
enum End {
    Stopped,
    /// An operator paused the projection.
    Paused,
    Failed(String),
}

struct Run<E: EntityType> {
    setup: InstanceSetup<E>,
    /// The instance's status as it is before its first run.
    template: InstanceStatus,
    index: u32,
    codec: Codec<E>,
    offset: SliceOffset,
    /// The logs whose sequence numbers moved since the offset was saved last.
    moved: BTreeSet<String>,
    /// The events the offset passed: its sequence numbers summed.
    offset_events: u64,
    /// The offset log; away while a save writes through it.
    log: Option<OffsetLog>,
    /// Its writer's epoch, the fence of exactly-once commits.
    fence: Option<Epoch>,
    /// The save being written (at-least-once): the offset moves on meanwhile, and the next
    /// save starts once it is done.
    saving: Option<SaveInFlight>,
    /// Envelopes the save being written covers, and the logs it moved: back to unsaved
    /// should it fail, so that the save at the end of the run covers them again.
    saving_envelopes: u32,
    saving_moved: BTreeSet<String>,
    /// Envelopes handled since the save being written (or the last) was taken.
    unsaved: u32,
    first_unsaved: Option<Instant>,
    /// Items taken from the query (for the lag in events).
    received: u64,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Runs instance `context.index()` of `context.count()` until told to stop or until it fails
/// (a failed run ends; the daemon's next keep-alive starts another). While the projection
/// is paused it waits, running nothing.
pub async fn run<E: EntityType>(setup: InstanceSetup<E>, context: DaemonContext) {
    let (index, count) = (context.index(), context.count());
    let Some(range) = SliceRange::split(count)
        .ok()
        .and_then(|ranges| ranges.get(index as usize).copied())
    else {
        tracing::error!(projection = %setup.name, index, count, "no slice range for this instance");
        return;
    };
    let statuses = setup.statuses.clone();
    let name = setup.name.clone();
    let template =
        InstanceStatus::new(&name, E::TYPE_NAME, index, count, (range.first, range.last));
    let initial = || template.clone();
    let mut control = setup.control.clone();
    let end = loop {
        if control.borrow_and_update().paused {
            statuses.update(&name, index, initial, |s| s.state = RunState::Paused);
            tokio::select! {
                () = context.stopped() => break End::Stopped,
                resumed = async { control.wait_for(|c| !c.paused).await.is_ok() } => {
                    if !resumed {
                        break End::Stopped;
                    }
                }
            }
        }
        statuses.update(&name, index, initial, |s| {
            s.runs += 1;
            s.state = RunState::Opening;
            s.instances = count;
            s.slices = (range.first, range.last);
        });
        match run_once(setup.clone(), &context, range, &template).await {
            End::Paused => continue,
            end => break end,
        }
    };
    statuses.update(&name, index, initial, |s| {
        s.state = RunState::Stopped;
        if let End::Failed(reason) = &end {
            s.last_error = Some(reason.clone());
        }
    });
    if let End::Failed(reason) = end {
        tracing::warn!(projection = %name, index, %reason, "projection instance failed; it starts again at the next keep-alive");
    }
}

/// Opens the offset (applying a reset that was asked), follows the events until the run
/// ends, and saves the offset on the way out.
async fn run_once<E: EntityType>(
    setup: InstanceSetup<E>,
    context: &DaemonContext,
    range: SliceRange,
    template: &InstanceStatus,
) -> End {
    let (index, count) = (context.index(), context.count());
    let name = setup.name.clone();
    let persistence_id = offset_log_id(&setup.name, index, count);
    let writer_id = format!("{}#{}", setup.node, persistence_id);
    let journal = OffsetJournal::Replicated(setup.journal.clone());
    let opened = tokio::select! {
        () = context.stopped() => return End::Stopped,
        opened = OffsetLog::open(journal, persistence_id, writer_id) => opened,
    };
    let (mut log, offset) = match opened {
        Err(e) => return End::Failed(e.to_string()),
        Ok(opened) => opened,
    };
    let resets = setup.control.borrow().resets;
    let reset = resets > log.resets();
    // Exactly-once: the offset is the handler's store's, taken with the log's fence.
    let offset = match &setup.handling {
        Handling::Exactly { store, .. } => {
            let Some(fence) = log.fence() else {
                return End::Failed("the offset log has no fencing writer".into());
            };
            let key = InstanceKey {
                projection: name.to_string(),
                index,
                instances: count,
            };
            let taken = tokio::select! {
                () = context.stopped() => return End::Stopped,
                opened = store.open(&key, fence.into()) => opened,
            };
            match taken {
                Err(e) => {
                    return End::Failed(format!(
                        "the exactly-once store refused the instance's slot: {e}"
                    ));
                }
                // The store's offsets go first: were the log's reset recorded and the
                // store's not, the reset would be lost.
                Ok(_) if reset => match store.reset(&key, fence.into()).await {
                    Ok(()) => SliceOffset::start(),
                    Err(e) => {
                        return End::Failed(format!(
                            "the exactly-once store did not reset the offset: {e}"
                        ));
                    }
                },
                Ok(offset) => offset,
            }
        }
        _ if reset => SliceOffset::start(),
        _ => offset,
    };
    if reset {
        if let Err(e) = log.replace(&SliceOffset::start(), resets).await {
            return End::Failed(format!("the reset of the offset was not saved: {e}"));
        }
        tracing::info!(projection = %name, index, resets, "offset reset: every event is handled again");
    }
    let applied = log.resets();
    setup.statuses.update(
        &name,
        index,
        || template.clone(),
        |s| s.resets_applied = applied,
    );
    let offset_events = offset.iter().map(|(_, seq)| seq).sum();
    let mut run = Run {
        setup,
        template: template.clone(),
        index,
        codec: Codec::new(),
        offset,
        moved: BTreeSet::new(),
        offset_events,
        fence: log.fence(),
        log: Some(log),
        saving: None,
        saving_envelopes: 0,
        saving_moved: BTreeSet::new(),
        unsaved: 0,
        first_unsaved: None,
        received: 0,
    };
    run.note_offset();
    let end = run.follow(range, context).await;
    // What was handled since the last save is saved on the way out (a fenced writer's save
    // fails, and changes nothing).
    if let Err(e) = run.save_all().await {
        tracing::debug!(projection = %name, index, error = %e, "offset not saved at the end of the run");
    }
    end
}

impl<E: EntityType> Run<E> {
    fn status(&self, change: impl FnOnce(&mut InstanceStatus)) {
        let setup = &self.setup;
        setup
            .statuses
            .update(&setup.name, self.index, || self.template.clone(), change);
    }

    fn note_offset(&self) {
        let logs = self.offset.len() as u64;
        let events = self.offset_events;
        let unsaved = self.unsaved_envelopes();
        self.status(|s| {
            s.offset_logs = logs;
            s.offset_events = events;
            s.unsaved = unsaved;
        });
    }

    /// The lag in events: what the members reported acknowledged that the query has not
    /// delivered, and what it delivered that the instance did not take yet. Caught up, the
    /// lag in time is zero too.
    fn note_lag(&self, progress: &QueryProgress) {
        let events = (progress.behind + progress.delivered).saturating_sub(self.received);
        self.status(|s| {
            s.lag_events = Some(events);
            if events == 0 {
                s.lag_ms = Some(0);
            }
        });
    }

    async fn follow(&mut self, range: SliceRange, context: &DaemonContext) -> End {
        let chunk = match &self.setup.handling {
            Handling::One(_) => self.setup.settings.save_after_envelopes as usize,
            Handling::Group { max, .. } | Handling::Exactly { max, .. } => *max,
        };
        let (items, mut progress) = self.setup.journal.events_by_slices_with_progress(
            E::TYPE_NAME,
            range,
            self.offset.clone(),
            QueryMode::Live,
        );
        let mut items = items.ready_chunks(chunk.max(1));
        let mut control = self.setup.control.clone();
        let mut lag_refresh = tokio::time::interval(LAG_REFRESH);
        self.status(|s| s.state = RunState::Running);
        loop {
            // While a save is written, the next waits for it.
            let save_due = match self.saving {
                Some(_) => None,
                None => self
                    .first_unsaved
                    .map(|first| first + self.setup.settings.save_interval),
            };
            let next = tokio::select! {
                biased;
                () = context.stopped() => return End::Stopped,
                paused = async { control.wait_for(|c| c.paused).await.is_ok() } => {
                    return if paused { End::Paused } else { End::Stopped };
                }
                _ = lag_refresh.tick() => {
                    self.note_lag(&progress.borrow_and_update());
                    continue;
                }
                () = sleep_until_some(save_due) => {
                    self.start_save();
                    continue;
                }
                saved = in_flight(&mut self.saving) => {
                    if let Err(reason) = self.on_saved(saved) {
                        return End::Failed(reason);
                    }
                    continue;
                }
                next = items.next() => next,
            };
            let Some(batch) = next else {
                return End::Failed("the query by slice ended".into());
            };
            self.received += batch.len() as u64;
            // A repeat of what the offset already passed is skipped by (persistence id,
            // sequence number), and so is one of what the batch passed before it.
            let fresh: Vec<bool> = {
                let mut passed_in_batch: HashMap<&str, u64> = HashMap::new();
                batch
                    .iter()
                    .map(|item| match item {
                        Ok(SliceItem::Event(envelope)) => {
                            let pid = envelope.event.persistence_id.as_str();
                            let seq = envelope.event.sequence_nr;
                            let passed = passed_in_batch
                                .entry(pid)
                                .or_insert_with(|| self.offset.get(pid));
                            let fresh = seq > *passed;
                            *passed = seq.max(*passed);
                            fresh
                        }
                        Ok(SliceItem::Deleted {
                            persistence_id, to, ..
                        }) => {
                            let passed = passed_in_batch
                                .entry(persistence_id.as_str())
                                .or_insert_with(|| self.offset.get(persistence_id));
                            *passed = (*to).max(*passed);
                            false
                        }
                        Err(_) => false,
                    })
                    .collect()
            };
            let mut events = Vec::with_capacity(batch.len());
            for (item, fresh) in batch.into_iter().zip(fresh) {
                match item {
                    Err(e) => return End::Failed(format!("the query by slice failed: {e}")),
                    // The offset passes a deletion only after what came before it: a run
                    // that stops on an earlier event must not save the deletion's end.
                    Ok(SliceItem::Deleted {
                        persistence_id, to, ..
                    }) => {
                        if let Err(end) = self.handle(std::mem::take(&mut events), context).await {
                            return end;
                        }
                        self.advance(&persistence_id, to);
                    }
                    Ok(SliceItem::Event(envelope)) if fresh => events.push(envelope),
                    Ok(SliceItem::Event(_)) => {}
                }
            }
            if let Err(end) = self.handle(events, context).await {
                return end;
            }
            self.note_lag(&progress.borrow_and_update());
            if self.unsaved >= self.setup.settings.save_after_envelopes {
                self.start_save();
            }
        }
    }

    /// Hands `events` to the handler, in order, moving the offset past each one handled or
    /// skipped.
    async fn handle(
        &mut self,
        events: Vec<SliceEnvelope>,
        context: &DaemonContext,
    ) -> Result<(), End> {
        match self.setup.handling.clone() {
            Handling::One(handler) => {
                // Each envelope alone; those handled are passed and counted together, and
                // one the handler failed on is retried alone, its failure the first attempt.
                let mut counted = 0;
                for (at, event) in events.iter().enumerate() {
                    let first_error = match self.decode_one(event) {
                        Ok(envelope) => match handler(envelope).await {
                            Ok(()) => continue,
                            Err(error) => Some(error.to_string()),
                        },
                        // Decoded again by the retries, which stop at once.
                        Err(_) => None,
                    };
                    self.handled(&events[counted..at]);
                    counted = at + 1;
                    let one = std::slice::from_ref(event);
                    self.with_retries(one, context, first_error, |mut envelopes| {
                        let envelope = envelopes.pop();
                        let handler = handler.clone();
                        async move {
                            match envelope {
                                Some(envelope) => handler(envelope).await,
                                None => Ok(()),
                            }
                        }
                    })
                    .await?;
                }
                self.handled(&events[counted..]);
            }
            Handling::Group { max, handler } => {
                for group in events.chunks(max.max(1)) {
                    self.with_retries(group, context, None, |envelopes| handler(envelopes))
                        .await?;
                }
            }
            Handling::Exactly { max, handler, .. } => {
                let Some(fence) = self.fence else {
                    return Err(End::Failed("the offset log has no fencing writer".into()));
                };
                for group in events.chunks(max.max(1)) {
                    let commit = OffsetCommit {
                        instance: InstanceKey {
                            projection: self.setup.name.to_string(),
                            index: self.index,
                            instances: self.template.instances,
                        },
                        fence: fence.into(),
                        seqs: last_seqs(group),
                    };
                    self.with_retries(group, context, None, |envelopes| {
                        handler(envelopes, commit.clone())
                    })
                    .await?;
                    // The handler committed the group's offset with its effect.
                    self.status(|s| s.saves += 1);
                }
            }
        }
        Ok(())
    }

    /// Calls `call` with `events` decoded, retrying with backoff; then the events are
    /// handled, or skipped, or the run stops — each counted. `first_error`: the first
    /// attempt was made already, and failed so.
    async fn with_retries<F, Fut>(
        &mut self,
        events: &[SliceEnvelope],
        context: &DaemonContext,
        mut first_error: Option<String>,
        call: F,
    ) -> Result<(), End>
    where
        F: Fn(Vec<Envelope<E>>) -> Fut,
        Fut: std::future::Future<Output = Result<(), HandlerError>>,
    {
        if events.is_empty() {
            return Ok(());
        }
        let settings = self.setup.settings.clone();
        let mut attempt = 0;
        let failure = loop {
            let error = match first_error.take() {
                Some(error) => error,
                None => match self.decode(events) {
                    // An event that does not decode never will: no retry helps.
                    Err(reason) => break reason,
                    Ok(envelopes) => match call(envelopes).await {
                        Ok(()) => {
                            self.handled(events);
                            return Ok(());
                        }
                        Err(error) => error.to_string(),
                    },
                },
            };
            self.status(|s| {
                s.handler_errors += 1;
                s.last_error = Some(error.clone());
            });
            attempt += 1;
            if attempt > settings.retries {
                break error;
            }
            self.status(|s| s.state = RunState::Retrying);
            tokio::select! {
                () = context.stopped() => return Err(End::Stopped),
                () = tokio::time::sleep(settings.backoff(attempt)) => {}
            }
        };
        let first = &events[0].event;
        let what = format!(
            "the handler failed on {} event(s) from {} {}: {failure}",
            events.len(),
            first.persistence_id,
            first.sequence_nr
        );
        match settings.on_failure {
            FailureAction::Skip => {
                tracing::warn!(projection = %self.setup.name, index = self.index, "{what}; skipped");
                self.passed(events);
                let unsaved = self.unsaved_envelopes();
                self.status(|s| {
                    s.skipped += events.len() as u64;
                    s.unsaved = unsaved;
                });
                Ok(())
            }
            FailureAction::Stop => Err(End::Failed(what)),
        }
    }

    /// Envelopes handled and not saved, as the status shows them: none for exactly-once
    /// delivery, whose handler committed each group's offset with its effect.
    fn unsaved_envelopes(&self) -> u64 {
        match self.setup.handling {
            Handling::Exactly { .. } => 0,
            _ => u64::from(self.unsaved + self.saving_envelopes),
        }
    }

    /// Moves the offset past `events`, which the handler handled, and counts them.
    fn handled(&mut self, events: &[SliceEnvelope]) {
        let Some(last) = events.last() else {
            return;
        };
        let lag = now_ms().saturating_sub(last.event.timestamp_ms);
        self.passed(events);
        let unsaved = self.unsaved_envelopes();
        self.status(|s| {
            s.handled += events.len() as u64;
            s.unsaved = unsaved;
            s.lag_ms = Some(lag);
            s.state = RunState::Running;
        });
    }

    /// Moves the offset past `events`.
    fn passed(&mut self, events: &[SliceEnvelope]) {
        for envelope in events {
            self.advance(&envelope.event.persistence_id, envelope.event.sequence_nr);
        }
        self.unsaved += events.len() as u32;
        self.first_unsaved.get_or_insert_with(Instant::now);
    }

    /// Moves the offset of one log to `sequence_nr` (nothing when it is there already).
    fn advance(&mut self, persistence_id: &str, sequence_nr: u64) {
        if let Some(before) = self.offset.advance_from(persistence_id, sequence_nr) {
            self.offset_events += sequence_nr - before;
            if !self.moved.contains(persistence_id) {
                self.moved.insert(persistence_id.to_string());
            }
        }
    }

    fn decode(&self, events: &[SliceEnvelope]) -> Result<Vec<Envelope<E>>, String> {
        events
            .iter()
            .map(|envelope| self.decode_one(envelope))
            .collect()
    }

    fn decode_one(&self, envelope: &SliceEnvelope) -> Result<Envelope<E>, String> {
        let repr = &envelope.event;
        let event = self
            .codec
            .decode_event(&self.setup.entity, &repr.manifest, &repr.payload)
            .map_err(|e| {
                format!(
                    "event {} of {} does not decode: {e}",
                    repr.sequence_nr, repr.persistence_id
                )
            })?;
        let entity_id = repr
            .persistence_id
            .split_once('|')
            .map_or("", |(_, id)| id)
            .to_string();
        Ok(Envelope {
            persistence_id: repr.persistence_id.to_string(),
            entity_id,
            sequence_nr: repr.sequence_nr,
            timestamp_ms: repr.timestamp_ms,
            slice: envelope.slice,
            tags: envelope.tags.clone(),
            event,
        })
    }

    /// Starts saving the offset as it is now, unless a save is being written (the next one
    /// starts when that one is done) or nothing moved since the last.
    fn start_save(&mut self) {
        if matches!(self.setup.handling, Handling::Exactly { .. }) {
            // The handler committed every group's offset itself.
            self.moved.clear();
            self.unsaved = 0;
            self.first_unsaved = None;
            self.note_offset();
            return;
        }
        if self.saving.is_some() || self.unsaved == 0 && self.first_unsaved.is_none() {
            return;
        }
        let Some(mut log) = self.log.take() else {
            return;
        };
        let prepared = log.prepare_save(&self.offset, &self.moved);
        self.saving_moved = std::mem::take(&mut self.moved);
        self.saving_envelopes = self.unsaved;
        self.unsaved = 0;
        self.first_unsaved = None;
        self.saving = Some(Box::pin(async move {
            let written = match prepared {
                Some(prepared) => log.write_save(prepared).await,
                None => Ok(()),
            };
            (log, written)
        }));
    }

    /// A save was written, or failed (then the run ends: the instance may have lost its
    /// slot). The next one starts at once when it is due already.
    fn on_saved(
        &mut self,
        (log, written): (OffsetLog, Result<(), OffsetError>),
    ) -> Result<(), String> {
        self.saving = None;
        self.log = Some(log);
        match written {
            Ok(()) => {
                self.saving_envelopes = 0;
                self.saving_moved.clear();
                self.status(|s| s.saves += 1);
                self.note_offset();
                let settings = &self.setup.settings;
                let due = self.unsaved >= settings.save_after_envelopes
                    || self
                        .first_unsaved
                        .is_some_and(|first| first + settings.save_interval <= Instant::now());
                if due {
                    self.start_save();
                }
                Ok(())
            }
            Err(e) => {
                self.moved.append(&mut self.saving_moved);
                self.unsaved += std::mem::take(&mut self.saving_envelopes);
                self.first_unsaved.get_or_insert_with(Instant::now);
                let reason =
                    format!("the offset was not saved (the instance may have lost its slot): {e}");
                self.status(|s| {
                    s.save_failures += 1;
                    s.last_error = Some(reason.clone());
                });
                Err(reason)
            }
        }
    }

    /// Waits for the save being written, then saves what was handled since.
    async fn save_all(&mut self) -> Result<(), String> {
        if let Some(saving) = self.saving.take() {
            self.on_saved(saving.await)?;
        }
        self.start_save();
        if let Some(saving) = self.saving.take() {
            self.on_saved(saving.await)?;
        }
        Ok(())
    }
}

/// A save being written: the offset log comes back with what became of it.
type SaveInFlight = std::pin::Pin<
    Box<dyn std::future::Future<Output = (OffsetLog, Result<(), OffsetError>)> + Send>,
>;

/// The save being written, done; never without one.
async fn in_flight(saving: &mut Option<SaveInFlight>) -> (OffsetLog, Result<(), OffsetError>) {
    match saving {
        Some(saving) => saving.await,
        None => std::future::pending().await,
    }
}

/// Each log of `events` with the sequence number of its last event there, in log order.
fn last_seqs(events: &[SliceEnvelope]) -> Vec<(String, u64)> {
    let mut last = std::collections::BTreeMap::new();
    for envelope in events {
        let seq = last
            .entry(envelope.event.persistence_id.to_string())
            .or_insert(0);
        *seq = envelope.event.sequence_nr.max(*seq);
    }
    last.into_iter().collect()
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
