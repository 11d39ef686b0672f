//! The entity host: routes commands to the one live incarnation of each entity id on this
//! node, starting it on demand.
//!
//! Routing is spread over `host_partitions` tasks by a stable hash of the id, so no single task or
//! lock sits on every command. Each partition task owns a map id → slot:
//!
//! - `Live`: the incarnation's mailbox sender. A command is `try_send`-ed (a full mailbox is
//!   [`EntityError::MailboxFull`] for that caller).
//! - `Stopping`: the incarnation closed its mailbox (idle passivation, a stop effect, a
//!   failure) but has not finished yet. The partition learns this from the closed mailbox handing
//!   the command back, and holds such commands (bounded by `mailbox_capacity`).
//!
//! An incarnation that finished reports `Stopped` with the commands it did not handle; the
//! partition then starts the next incarnation with those followed by the held ones, in arrival
//! order. So at most one incarnation per id is ever live on the node, and no command is lost
//! across a passivation. A handler that panics ends its incarnation the same way (its callers
//! get [`EntityError::Stopped`]).

use crate::codec::Codec;
use crate::config::{EntityConfig, InvalidConfig};
use crate::entity::EntityType;
use crate::entity_ref::EntityRef;
use crate::error::{AskError, EntityError};
use crate::id::{EntityId, validate_type_name};
use crate::runner::{Envelope, HostContext, Mailbox, run_entity};
use futures::FutureExt;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tessera_journal::Journal;
use tessera_snapshot::SnapshotStore;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// A command for entity `id`, as queued to its partition.
pub(crate) struct Deliver<E: EntityType> {
    pub id: EntityId,
    pub envelope: Envelope<E>,
}

/// An incarnation's report that it finished.
struct Stopped<E: EntityType> {
    id: EntityId,
    incarnation: u64,
    leftovers: Vec<Envelope<E>>,
}

/// Bound of a partition's queue of `Stopped` reports. Entities await a free place (the partition never
/// waits on an entity, so it always drains this queue); each sends one report per incarnation.
const STOPPED_QUEUE_CAPACITY: usize = 1_024;

/// Counters of a host's entity lifecycle (not touched per command).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostStats {
    /// Incarnations running now.
    pub live_entities: u64,
    /// Incarnations started since the host started (first commands and restarts after a
    /// passivation or stop).
    pub incarnations_started: u64,
    /// Commands that arrived while their entity was stopping and were handed to its next
    /// incarnation.
    pub commands_handed_over: u64,
}

#[derive(Default)]
struct Counters {
    started: AtomicU64,
    stopped: AtomicU64,
    handed_over: AtomicU64,
}

/// Hosts the entities of type `E` on this node. See the module documentation.
pub struct EntityHost<E: EntityType> {
    context: Arc<HostContext<E>>,
    counters: Arc<Counters>,
    partitions: Arc<[mpsc::Sender<Deliver<E>>]>,
    shutdown: watch::Sender<bool>,
    /// Taken by the first [`EntityHost::shutdown`]; never touched on the command path.
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl<E: EntityType> EntityHost<E> {
    /// Starts the host's partition tasks (on the current tokio runtime).
    pub fn start(
        entity: E,
        journal: Arc<dyn Journal>,
        snapshots: Arc<dyn SnapshotStore>,
        config: EntityConfig,
    ) -> Result<Self, InvalidConfig> {
        config.validate().map_err(InvalidConfig)?;
        validate_type_name(E::TYPE_NAME).map_err(InvalidConfig)?;
        let context = Arc::new(HostContext {
            entity: Arc::new(entity),
            codec: Arc::new(Codec::new()),
            journal,
            snapshots,
            config,
        });
        let (shutdown, shutdown_rx) = watch::channel(false);
        let counters = Arc::new(Counters::default());
        let mut partitions = Vec::with_capacity(context.config.host_partitions);
        let mut tasks = Vec::with_capacity(context.config.host_partitions);
        for index in 0..context.config.host_partitions {
            let (deliver_tx, deliver_rx) = mpsc::channel(context.config.host_queue_capacity);
            let (stopped_tx, stopped_rx) = mpsc::channel(STOPPED_QUEUE_CAPACITY);
            let partition = Partition {
                index,
                context: context.clone(),
                counters: counters.clone(),
                slots: HashMap::new(),
                stopped_tx,
                incarnations: 0,
                shutting_down: false,
            };
            tasks.push(tokio::spawn(partition.run(
                deliver_rx,
                stopped_rx,
                shutdown_rx.clone(),
            )));
            partitions.push(deliver_tx);
        }
        Ok(EntityHost {
            context,
            counters,
            partitions: partitions.into(),
            shutdown,
            tasks: Mutex::new(tasks),
        })
    }

    /// A handle to entity `id`, after checking the id.
    pub fn entity_ref(&self, id: &str) -> Result<EntityRef<E>, EntityError> {
        let id = EntityId::new(id)?;
        let partition = (id.stable_hash() % self.partitions.len() as u64) as usize;
        Ok(EntityRef::new(
            id,
            self.partitions[partition].clone(),
            self.context.config.host_queue_capacity,
            self.context.config.ask_timeout,
        ))
    }

    /// Sends `command` to entity `id` and waits for the reply (at most the ask timeout).
    pub async fn ask(
        &self,
        id: &str,
        command: E::Command,
    ) -> Result<E::Reply, AskError<E::Rejection>> {
        self.entity_ref(id)?.ask(command).await
    }

    /// Lifecycle counters.
    pub fn stats(&self) -> HostStats {
        let started = self.counters.started.load(Ordering::Relaxed);
        let stopped = self.counters.stopped.load(Ordering::Relaxed);
        HostStats {
            live_entities: started.saturating_sub(stopped),
            incarnations_started: started,
            commands_handed_over: self.counters.handed_over.load(Ordering::Relaxed),
        }
    }

    /// The entity type.
    pub fn entity(&self) -> &E {
        &self.context.entity
    }

    /// The host's configuration.
    pub fn config(&self) -> &EntityConfig {
        &self.context.config
    }

    /// Stops taking commands, lets every live entity finish what it accepted (stash and writes
    /// in flight included), and returns once all have stopped. Commands arriving meanwhile get
    /// [`EntityError::ShuttingDown`]. Bound it with a timeout if the store may hang.
    pub async fn shutdown(&self) {
        let _ = self.shutdown.send(true);
        let tasks = match self.tasks.lock() {
            Ok(mut tasks) => std::mem::take(&mut *tasks),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        };
        for task in tasks {
            let _ = task.await;
        }
    }
}

impl<E: EntityType> Drop for EntityHost<E> {
    fn drop(&mut self) {
        // Without a shutdown the partitions would wait for commands forever.
        let _ = self.shutdown.send(true);
    }
}

enum Slot<E: EntityType> {
    Live {
        mailbox: mpsc::Sender<Envelope<E>>,
        incarnation: u64,
    },
    Stopping {
        incarnation: u64,
        held: Vec<Envelope<E>>,
    },
}

/// One routing task's state.
struct Partition<E: EntityType> {
    index: usize,
    context: Arc<HostContext<E>>,
    counters: Arc<Counters>,
    slots: HashMap<EntityId, Slot<E>>,
    /// Cloned into every incarnation for its `Stopped` report.
    stopped_tx: mpsc::Sender<Stopped<E>>,
    incarnations: u64,
    shutting_down: bool,
}

fn reply_error<E: EntityType>(envelope: Envelope<E>, error: EntityError) {
    let _ = envelope.reply.send(Err(error.into()));
}

impl<E: EntityType> Partition<E> {
    async fn run(
        mut self,
        mut deliveries: mpsc::Receiver<Deliver<E>>,
        mut stopped: mpsc::Receiver<Stopped<E>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            if self.shutting_down && self.slots.is_empty() {
                return;
            }
            tokio::select! {
                biased;
                Some(report) = stopped.recv() => self.on_stopped(report),
                _ = shutdown.wait_for(|stop| *stop), if !self.shutting_down => {
                    self.begin_shutdown(&mut deliveries);
                }
                deliver = deliveries.recv(), if !self.shutting_down => match deliver {
                    Some(deliver) => self.deliver(deliver.id, deliver.envelope),
                    None => self.begin_shutdown(&mut deliveries),
                },
            }
        }
    }

    fn deliver(&mut self, id: EntityId, envelope: Envelope<E>) {
        let capacity = self.context.config.mailbox_capacity;
        match self.slots.get_mut(&id) {
            None => self.start_incarnation(id, vec![envelope]),
            Some(Slot::Live {
                mailbox,
                incarnation,
            }) => match mailbox.try_send(envelope) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(envelope)) => {
                    let entity = id.persistence_id(E::TYPE_NAME);
                    reply_error(envelope, EntityError::MailboxFull { entity, capacity });
                }
                Err(mpsc::error::TrySendError::Closed(envelope)) => {
                    let incarnation = *incarnation;
                    self.slots.insert(
                        id,
                        Slot::Stopping {
                            incarnation,
                            held: vec![envelope],
                        },
                    );
                }
            },
            Some(Slot::Stopping { held, .. }) => {
                if held.len() < capacity {
                    held.push(envelope);
                } else {
                    let entity = id.persistence_id(E::TYPE_NAME);
                    reply_error(envelope, EntityError::MailboxFull { entity, capacity });
                }
            }
        }
    }

    fn on_stopped(&mut self, report: Stopped<E>) {
        let held = match self.slots.get(&report.id) {
            Some(Slot::Live { incarnation, .. } | Slot::Stopping { incarnation, .. })
                if *incarnation == report.incarnation =>
            {
                match self.slots.remove(&report.id) {
                    Some(Slot::Stopping { held, .. }) => held,
                    _ => Vec::new(),
                }
            }
            // A report of an incarnation that is not the current one cannot happen (one
            // incarnation at a time); ignore rather than disturb the current one.
            _ => return,
        };
        self.counters.stopped.fetch_add(1, Ordering::Relaxed);
        let mut pending = report.leftovers;
        pending.extend(held);
        if pending.is_empty() {
            return;
        }
        if self.shutting_down {
            for envelope in pending {
                reply_error(envelope, EntityError::ShuttingDown);
            }
        } else {
            self.counters
                .handed_over
                .fetch_add(pending.len() as u64, Ordering::Relaxed);
            self.start_incarnation(report.id, pending);
        }
    }

    fn start_incarnation(&mut self, id: EntityId, initial: Vec<Envelope<E>>) {
        self.incarnations += 1;
        self.counters.started.fetch_add(1, Ordering::Relaxed);
        let incarnation = self.incarnations;
        let writer_id = format!(
            "{}/{}/{}",
            self.context.config.node_id, self.index, incarnation
        );
        let (mailbox, receiver) = mpsc::channel(self.context.config.mailbox_capacity);
        self.slots.insert(
            id.clone(),
            Slot::Live {
                mailbox,
                incarnation,
            },
        );
        let context = self.context.clone();
        let stopped = self.stopped_tx.clone();
        tokio::spawn(async move {
            let mut mailbox = Mailbox::new(receiver);
            let run = run_entity(context, id.clone(), writer_id, &mut mailbox, initial);
            let leftovers = match AssertUnwindSafe(run).catch_unwind().await {
                Ok(leftovers) => leftovers,
                Err(_) => {
                    tracing::error!(entity = %id.persistence_id(E::TYPE_NAME), "an entity handler panicked; the entity stopped");
                    // The commands queued behind the one that panicked go to the next
                    // incarnation, as after any other stop. A caller that saw `Stopped` and
                    // asked again may have queued its command here before the unwinding
                    // ended.
                    mailbox.close();
                    mailbox.drain()
                }
            };
            let _ = stopped
                .send(Stopped {
                    id,
                    incarnation,
                    leftovers,
                })
                .await;
        });
    }

    /// Closes the queue (later commands get `ShuttingDown`) and lets every live entity finish:
    /// dropping its mailbox sender tells it to stop once it has handled what it accepted.
    fn begin_shutdown(&mut self, deliveries: &mut mpsc::Receiver<Deliver<E>>) {
        self.shutting_down = true;
        deliveries.close();
        while let Ok(deliver) = deliveries.try_recv() {
            reply_error(deliver.envelope, EntityError::ShuttingDown);
        }
        for slot in self.slots.values_mut() {
            match slot {
                Slot::Live { incarnation, .. } => {
                    *slot = Slot::Stopping {
                        incarnation: *incarnation,
                        held: Vec::new(),
                    };
                }
                Slot::Stopping { held, .. } => {
                    for envelope in held.drain(..) {
                        reply_error(envelope, EntityError::ShuttingDown);
                    }
                }
            }
        }
    }
}
