//! The entity host: routes commands to the one live incarnation of each entity id on this
//! node, starting it on demand, and lets its owner stop entities, list them and follow their
//! lifecycle.
//!
//! Routing is spread over `host_partitions` tasks by a stable hash of the id, so no single task
//! or lock sits on every command. Each partition owns its entities outright (see
//! `partition`): the host itself holds only the partitions' queues.

use crate::codec::Codec;
use crate::config::{EntityConfig, InvalidConfig};
use crate::counters::Counters;
use crate::entity::EntityType;
use crate::entity_ref::EntityRef;
use crate::error::{AskError, EntityError};
use crate::id::{EntityId, validate_type_name};
use crate::lifecycle::{EntityLifecycle, LifecycleListener};
use crate::partition::{Partition, PartitionInput, STOPPED_QUEUE_CAPACITY, partition_of};
use crate::runner::HostContext;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use tessera_journal::Journal;
use tessera_snapshot::SnapshotStore;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

/// Counters of a host's entity lifecycle (not touched per command).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostStats {
    /// Incarnations running now, including those finishing a stop.
    pub live_entities: u64,
    /// Incarnations taking commands: `live_entities` less those the host knows are stopping.
    /// Never above `active_entity_limit`.
    pub active_entities: u64,
    /// Incarnations started since the host started (first commands and restarts after a
    /// passivation or stop).
    pub incarnations_started: u64,
    /// Commands that arrived while their entity was stopping and were handed to its next
    /// incarnation.
    pub commands_handed_over: u64,
    /// Live entities passivated because starting another would have exceeded
    /// `active_entity_limit` or the node budget.
    pub entities_evicted: u64,
}

/// Hosts the entities of type `E` on this node. See the module documentation.
pub struct EntityHost<E: EntityType> {
    context: Arc<HostContext<E>>,
    counters: Arc<Counters>,
    partitions: Arc<[mpsc::Sender<PartitionInput<E>>]>,
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
        Self::start_inner(entity, journal, snapshots, config, None)
    }

    /// [`EntityHost::start`] with a listener that hears every entity start and stop, with the
    /// reason (for remember-entities). It runs on the partition tasks and must return at once;
    /// see [`LifecycleListener`].
    pub fn start_with_listener(
        entity: E,
        journal: Arc<dyn Journal>,
        snapshots: Arc<dyn SnapshotStore>,
        config: EntityConfig,
        listener: impl Fn(EntityLifecycle) + Send + Sync + 'static,
    ) -> Result<Self, InvalidConfig> {
        Self::start_inner(entity, journal, snapshots, config, Some(Arc::new(listener)))
    }

    fn start_inner(
        entity: E,
        journal: Arc<dyn Journal>,
        snapshots: Arc<dyn SnapshotStore>,
        config: EntityConfig,
        listener: Option<LifecycleListener>,
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
        let count = context.config.host_partitions;
        let mut partitions = Vec::with_capacity(count);
        let mut tasks = Vec::with_capacity(count);
        for index in 0..count {
            let (inbox_tx, inbox_rx) = mpsc::channel(context.config.host_queue_capacity);
            let (stopped_tx, stopped_rx) = mpsc::channel(STOPPED_QUEUE_CAPACITY);
            let partition = Partition::new(
                index,
                count,
                context.clone(),
                counters.clone(),
                listener.clone(),
                stopped_tx,
            );
            tasks.push(tokio::spawn(partition.run(
                inbox_rx,
                stopped_rx,
                shutdown_rx.clone(),
            )));
            partitions.push(inbox_tx);
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
        let partition = partition_of(&id, self.partitions.len());
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

    /// Stops entities `ids` and resolves once none of them runs on this host any more (the
    /// owner's half of a shard handoff).
    ///
    /// Each live entity handles what it accepted before the request (its mailbox, its stash
    /// and the write in flight, as in a shutdown), then stops; one already stopping is waited
    /// for; an id with nothing running counts as stopped at once. Commands the host held for
    /// an entity's next incarnation are handled by an incarnation that then stops too, so
    /// none is dropped. Commands sent afterwards start a new incarnation as usual, but while
    /// they keep coming for an id its stop is not over: send none meanwhile.
    ///
    /// Nothing happens until the future is polled, and a future dropped before it resolves may
    /// have asked only some of the entities to stop. The requests queue behind the commands
    /// already queued to the partitions (bounded waits: the partitions drain their queues).
    /// Bound it with a timeout if the store may hang.
    pub fn stop_entities(
        &self,
        ids: impl IntoIterator<Item = EntityId>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let count = self.partitions.len();
        let mut by_partition: Vec<Vec<EntityId>> = vec![Vec::new(); count];
        for id in ids {
            by_partition[partition_of(&id, count)].push(id);
        }
        let partitions = self.partitions.clone();
        async move {
            let (done, mut all_stopped) = mpsc::channel::<()>(1);
            for (partition, ids) in partitions.iter().zip(by_partition) {
                if ids.is_empty() {
                    continue;
                }
                let done = done.clone();
                // A partition that has ended has stopped all its entities: a failed send
                // drops its `done` at once.
                let _ = partition.send(PartitionInput::Stop { ids, done }).await;
            }
            drop(done);
            // Nothing is sent: `recv` returns None once every partition dropped its clones.
            let _ = all_stopped.recv().await;
        }
    }

    /// Starts the given entities without a command (each recovers its state and then waits
    /// for commands, as after its first one), unless one runs or stops already: how a shard
    /// brings back its remembered entities. The requests queue behind the commands already
    /// queued; an id whose partition queue is full is skipped, and returned.
    pub fn start_entities(&self, ids: impl IntoIterator<Item = EntityId>) -> Vec<EntityId> {
        let count = self.partitions.len();
        let mut skipped = Vec::new();
        for id in ids {
            let partition = &self.partitions[partition_of(&id, count)];
            if let Err(
                mpsc::error::TrySendError::Full(PartitionInput::Start { id })
                | mpsc::error::TrySendError::Closed(PartitionInput::Start { id }),
            ) = partition.try_send(PartitionInput::Start { id })
            {
                skipped.push(id);
            }
        }
        skipped
    }

    /// The ids with an incarnation on this host now, including those finishing a stop, in no
    /// particular order. Each partition answers from its own map (work proportional to its
    /// entities); the answers are taken one partition at a time, so an entity that starts or
    /// stops meanwhile may or may not appear. Empty once the host has shut down.
    pub fn live_entity_ids(&self) -> impl Future<Output = Vec<EntityId>> + Send + 'static + use<E> {
        let partitions = self.partitions.clone();
        async move {
            let mut answers = Vec::with_capacity(partitions.len());
            for partition in partitions.iter() {
                let (reply, answer) = oneshot::channel();
                if partition
                    .send(PartitionInput::LiveIds { reply })
                    .await
                    .is_ok()
                {
                    answers.push(answer);
                }
            }
            let mut ids = Vec::new();
            for answer in answers {
                if let Ok(some) = answer.await {
                    ids.extend(some);
                }
            }
            ids
        }
    }

    /// Lifecycle counters.
    pub fn stats(&self) -> HostStats {
        let started = self.counters.started.load(Ordering::Relaxed);
        let stopped = self.counters.stopped.load(Ordering::Relaxed);
        HostStats {
            live_entities: started.saturating_sub(stopped),
            active_entities: self.counters.active.load(Ordering::Relaxed),
            incarnations_started: started,
            commands_handed_over: self.counters.handed_over.load(Ordering::Relaxed),
            entities_evicted: self.counters.evicted.load(Ordering::Relaxed),
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
