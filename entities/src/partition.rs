//! One routing task of an entity host: owns the entities whose ids hash to it and routes their
//! commands, starting each entity on demand.
//!
//! The partition owns a map id → slot:
//!
//! - `Live`: the incarnation's mailbox sender. A command is `try_send`-ed (a full mailbox is
//!   [`EntityError::MailboxFull`] for that caller).
//! - `Stopping`: the incarnation takes no more commands but has not finished yet. Either it
//!   closed its mailbox itself (idle passivation, a stop effect, a failure), which the
//!   partition learns from the closed mailbox handing a command back, or the partition dropped
//!   the mailbox's sender (an eviction, a stop request, shutdown), which makes the incarnation
//!   handle what it accepted and stop. Commands arriving meanwhile are held (bounded by
//!   `mailbox_capacity`).
//!
//! An incarnation that finished reports `Stopped` with the commands it did not handle; the
//! partition then starts the next incarnation with those followed by the held ones, in arrival
//! order. So at most one incarnation per id is ever live on the node, and no command is lost
//! across a passivation. A handler that panics ends its incarnation the same way (its callers
//! get [`EntityError::Stopped`]).
//!
//! A stop request ([`EntityHost::stop_entities`](crate::EntityHost::stop_entities)) leaves a
//! waiter in the slot; the waiter is released when the slot goes, that is when no incarnation
//! of the id runs any more. If the stopped incarnation left commands, the next one is started
//! already asked to stop: it handles them and stops, and the waiter waits for it too, so a
//! request resolves only once the id has nothing running here.
//!
//! With `active_entity_limit` or a node budget, the partition keeps its live entities in
//! order of their last command and, before starting one more than its share of the limit or
//! while the budget is full, evicts (passivates) the least recently used.

use crate::counters::Counters;
use crate::entity::EntityType;
use crate::error::EntityError;
use crate::id::EntityId;
use crate::lifecycle::{EntityLifecycle, LifecycleListener, StopReason};
use crate::lru::LruOrder;
use crate::runner::{Ending, Envelope, HostContext, Mailbox, run_entity};
use futures::FutureExt;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::{mpsc, oneshot, watch};

/// What a partition's queue carries. Commands and the owner's requests share one queue, so a
/// request is handled after the commands queued before it.
pub(crate) enum PartitionInput<E: EntityType> {
    /// A command for entity `id`.
    Command { id: EntityId, envelope: Envelope<E> },
    /// Stop these entities; `done` is dropped once none of them runs any more.
    Stop {
        ids: Vec<EntityId>,
        done: StopWaiter,
    },
    /// The ids with an incarnation here.
    LiveIds {
        reply: oneshot::Sender<Vec<EntityId>>,
    },
    /// Start entity `id` (it recovers) unless it runs or stops already.
    Start { id: EntityId },
}

/// Held while a stop request waits for an entity. Nothing is ever sent on it: the requester's
/// receiver resolves once every clone has been dropped.
pub(crate) type StopWaiter = mpsc::Sender<()>;

/// An incarnation's report that it finished.
pub(crate) struct Stopped<E: EntityType> {
    id: EntityId,
    incarnation: u64,
    ending: Ending<E>,
}

/// Bound of a partition's queue of `Stopped` reports. Entities await a free place (the
/// partition never waits on an entity, so it always drains this queue); each sends one report
/// per incarnation.
pub(crate) const STOPPED_QUEUE_CAPACITY: usize = 1_024;

/// The partition that routes entity `id` among `count`: the high bits of the id's stable hash
/// (multiply-shift). Not the hash modulo `count`: cluster sharding picks the shard from the
/// low bits (modulo `number_of_shards`), and a modulo here would put all the entities of one
/// shard in the few partitions that share those bits.
pub(crate) fn partition_of(id: &EntityId, count: usize) -> usize {
    ((u128::from(id.stable_hash()) * count as u128) >> 64) as usize
}

/// Partition `index`'s share of a host's `limit` over `count` partitions: an even split, the
/// remainder to the first partitions, so the shares add up to the limit.
pub(crate) fn limit_share(limit: usize, count: usize, index: usize) -> usize {
    limit / count + usize::from(index < limit % count)
}

enum Slot<E: EntityType> {
    Live {
        mailbox: mpsc::Sender<Envelope<E>>,
        incarnation: u64,
        /// The entity's tick in the partition's LRU order (0 without a limit).
        last_command: u64,
    },
    Stopping(Stopping<E>),
}

struct Stopping<E: EntityType> {
    incarnation: u64,
    /// Commands for the next incarnation.
    held: Vec<Envelope<E>>,
    /// Why the partition closed the mailbox; None when the incarnation closed it itself (its
    /// report says why).
    reason: Option<StopReason>,
    waiters: Vec<StopWaiter>,
}

impl<E: EntityType> Slot<E> {
    fn incarnation(&self) -> u64 {
        match self {
            Slot::Live { incarnation, .. } | Slot::Stopping(Stopping { incarnation, .. }) => {
                *incarnation
            }
        }
    }
}

/// Live entities by last command, with this partition's share of `active_entity_limit`
/// (`usize::MAX` without one: then only the node budget evicts).
struct Lru {
    limit: usize,
    order: LruOrder<EntityId>,
}

/// One routing task's state.
pub(crate) struct Partition<E: EntityType> {
    index: usize,
    context: Arc<HostContext<E>>,
    counters: Arc<Counters>,
    listener: Option<LifecycleListener>,
    slots: HashMap<EntityId, Slot<E>>,
    /// Present when `active_entity_limit` or a node budget is set; holds exactly the `Live`
    /// slots.
    lru: Option<Lru>,
    /// Cloned into every incarnation for its `Stopped` report.
    stopped_tx: mpsc::Sender<Stopped<E>>,
    incarnations: u64,
    shutting_down: bool,
}

fn reply_error<E: EntityType>(envelope: Envelope<E>, error: EntityError) {
    let _ = envelope.reply.send(Err(error.into()));
}

impl<E: EntityType> Partition<E> {
    /// Partition `index` of `count`; its reports go to `stopped_tx`.
    pub(crate) fn new(
        index: usize,
        count: usize,
        context: Arc<HostContext<E>>,
        counters: Arc<Counters>,
        listener: Option<LifecycleListener>,
        stopped_tx: mpsc::Sender<Stopped<E>>,
    ) -> Self {
        let config = &context.config;
        let lru =
            (config.active_entity_limit.is_some() || config.node_budget.is_some()).then(|| Lru {
                limit: config
                    .active_entity_limit
                    .map_or(usize::MAX, |limit| limit_share(limit, count, index)),
                order: LruOrder::new(),
            });
        Partition {
            index,
            context,
            counters,
            listener,
            slots: HashMap::new(),
            lru,
            stopped_tx,
            incarnations: 0,
            shutting_down: false,
        }
    }

    /// Routes until the host shuts down and every entity here has stopped.
    pub(crate) async fn run(
        mut self,
        mut inbox: mpsc::Receiver<PartitionInput<E>>,
        mut stopped: mpsc::Receiver<Stopped<E>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut inbox_open = true;
        loop {
            if self.shutting_down && self.slots.is_empty() {
                // Later sends fail at once; what is queued is answered here.
                inbox.close();
                while let Ok(input) = inbox.try_recv() {
                    self.handle(input);
                }
                return;
            }
            tokio::select! {
                biased;
                Some(report) = stopped.recv() => self.on_stopped(report),
                _ = shutdown.wait_for(|stop| *stop), if !self.shutting_down => {
                    self.begin_shutdown();
                }
                input = inbox.recv(), if inbox_open => match input {
                    Some(input) => self.handle(input),
                    None => {
                        inbox_open = false;
                        self.begin_shutdown();
                    }
                },
            }
        }
    }

    fn handle(&mut self, input: PartitionInput<E>) {
        match input {
            PartitionInput::Command { envelope, .. } if self.shutting_down => {
                reply_error(envelope, EntityError::ShuttingDown);
            }
            PartitionInput::Command { id, envelope } => self.deliver(id, envelope),
            PartitionInput::Stop { ids, done } => {
                for id in ids {
                    self.begin_stop(&id, StopReason::StopRequested);
                    if let Some(Slot::Stopping(stopping)) = self.slots.get_mut(&id) {
                        stopping.waiters.push(done.clone());
                    }
                }
            }
            PartitionInput::LiveIds { reply } => {
                let _ = reply.send(self.slots.keys().cloned().collect());
            }
            PartitionInput::Start { id } => {
                if !self.shutting_down && !self.slots.contains_key(&id) {
                    self.start(id, Vec::new(), Vec::new());
                }
            }
        }
    }

    fn deliver(&mut self, id: EntityId, envelope: Envelope<E>) {
        let capacity = self.context.config.mailbox_capacity;
        match self.slots.get_mut(&id) {
            None => self.start(id, vec![envelope], Vec::new()),
            Some(Slot::Live {
                mailbox,
                incarnation,
                last_command,
            }) => {
                if let Some(lru) = &mut self.lru {
                    *last_command = lru.order.touch(*last_command);
                }
                match mailbox.try_send(envelope) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(envelope)) => {
                        let entity = id.persistence_id(E::TYPE_NAME);
                        reply_error(envelope, EntityError::MailboxFull { entity, capacity });
                    }
                    Err(mpsc::error::TrySendError::Closed(envelope)) => {
                        let (incarnation, last_command) = (*incarnation, *last_command);
                        self.forget_live(last_command);
                        self.slots.insert(
                            id,
                            Slot::Stopping(Stopping {
                                incarnation,
                                held: vec![envelope],
                                reason: None,
                                waiters: Vec::new(),
                            }),
                        );
                    }
                }
            }
            Some(Slot::Stopping(Stopping { held, .. })) => {
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
        // A report of an incarnation that is not the current one cannot happen (one
        // incarnation at a time); ignore rather than disturb the current one.
        if self.slots.get(&report.id).map(Slot::incarnation) != Some(report.incarnation) {
            return;
        }
        let (held, host_reason, waiters) = match self.slots.remove(&report.id) {
            Some(Slot::Live { last_command, .. }) => {
                self.forget_live(last_command);
                (Vec::new(), None, Vec::new())
            }
            Some(Slot::Stopping(stopping)) => (stopping.held, stopping.reason, stopping.waiters),
            None => return,
        };
        self.counters.stopped.fetch_add(1, Ordering::Relaxed);
        // The entity's own reason first: one that stopped itself while the host also asked it
        // to (say a stop effect among the commands it finished) asked for it.
        let reason = report
            .ending
            .reason
            .or(host_reason)
            .unwrap_or(StopReason::HostShutdown);
        self.notify(|| EntityLifecycle::Stopped {
            id: report.id.clone(),
            reason,
        });
        let mut pending = report.ending.leftovers;
        pending.extend(held);
        if pending.is_empty() {
            // Dropping the waiters tells their requests this entity has stopped.
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
            self.start(report.id, pending, waiters);
        }
    }

    /// Starts the next incarnation of `id` with `initial` commands. Without `stop_waiters` it is
    /// live (evicting the least recently used entity first when at the limit); with them it is
    /// asked to stop at once: it handles `initial`, then stops and releases them.
    fn start(&mut self, id: EntityId, initial: Vec<Envelope<E>>, stop_waiters: Vec<StopWaiter>) {
        if stop_waiters.is_empty() {
            self.make_room();
        }
        self.incarnations += 1;
        self.counters.started.fetch_add(1, Ordering::Relaxed);
        let incarnation = self.incarnations;
        let writer_id = format!(
            "{}/{}/{}",
            self.context.config.node_id, self.index, incarnation
        );
        let (mailbox, receiver) = mpsc::channel(self.context.config.mailbox_capacity);
        self.notify(|| EntityLifecycle::Started { id: id.clone() });
        let slot = if stop_waiters.is_empty() {
            let last_command = match &mut self.lru {
                Some(lru) => lru.order.insert(id.clone()),
                None => 0,
            };
            self.counters.active.fetch_add(1, Ordering::Relaxed);
            if let Some(budget) = &self.context.config.node_budget {
                budget.started();
            }
            Slot::Live {
                mailbox,
                incarnation,
                last_command,
            }
        } else {
            // Without a sender the incarnation handles `initial` and stops.
            drop(mailbox);
            Slot::Stopping(Stopping {
                incarnation,
                held: Vec::new(),
                reason: Some(StopReason::StopRequested),
                waiters: stop_waiters,
            })
        };
        self.slots.insert(id.clone(), slot);
        let context = self.context.clone();
        let stopped = self.stopped_tx.clone();
        tokio::spawn(async move {
            let mut mailbox = Mailbox::new(receiver);
            let run = run_entity(context, id.clone(), writer_id, &mut mailbox, initial);
            let ending = match AssertUnwindSafe(run).catch_unwind().await {
                Ok(ending) => ending,
                Err(_) => {
                    tracing::error!(entity = %id.persistence_id(E::TYPE_NAME), "an entity handler panicked; the entity stopped");
                    // The commands queued behind the one that panicked go to the next
                    // incarnation, as after any other stop. A caller that saw `Stopped` and
                    // asked again may have queued its command here before the unwinding
                    // ended.
                    mailbox.close();
                    Ending {
                        leftovers: mailbox.drain(),
                        reason: Some(StopReason::Failed),
                    }
                }
            };
            let _ = stopped
                .send(Stopped {
                    id,
                    incarnation,
                    ending,
                })
                .await;
        });
    }

    /// Before a new live entity: passivates the least recently used one when the partition
    /// is at its share of `active_entity_limit`, or when the node budget is full (then a
    /// partition with no live entity evicts nothing: see [`ActiveEntityBudget`](
    /// crate::ActiveEntityBudget)).
    fn make_room(&mut self) {
        let Some(lru) = &self.lru else {
            return;
        };
        let node_full = self
            .context
            .config
            .node_budget
            .as_ref()
            .is_some_and(|budget| budget.is_full());
        if lru.order.len() < lru.limit && !node_full {
            return;
        }
        if let Some(victim) = lru.order.least_recent().cloned() {
            self.begin_stop(&victim, StopReason::Evicted);
            self.counters.evicted.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Closes the mailbox of live entity `id` by dropping its sender: the incarnation handles
    /// what it accepted (its mailbox, stash and write in flight), then stops. An entity that
    /// is stopping already or not here is left as it is.
    fn begin_stop(&mut self, id: &EntityId, reason: StopReason) {
        let Some(&Slot::Live {
            incarnation,
            last_command,
            ..
        }) = self.slots.get(id)
        else {
            return;
        };
        self.forget_live(last_command);
        self.slots.insert(
            id.clone(),
            Slot::Stopping(Stopping {
                incarnation,
                held: Vec::new(),
                reason: Some(reason),
                waiters: Vec::new(),
            }),
        );
    }

    /// Bookkeeping of a slot that stops being `Live`.
    fn forget_live(&mut self, last_command: u64) {
        if let Some(lru) = &mut self.lru {
            lru.order.remove(last_command);
        }
        self.counters.active.fetch_sub(1, Ordering::Relaxed);
        if let Some(budget) = &self.context.config.node_budget {
            budget.stopped();
        }
    }

    fn notify(&self, event: impl FnOnce() -> EntityLifecycle) {
        if let Some(listener) = &self.listener {
            listener(event());
        }
    }

    /// Refuses commands from now on (`ShuttingDown`) and lets every live entity finish.
    fn begin_shutdown(&mut self) {
        if self.shutting_down {
            return;
        }
        self.shutting_down = true;
        let live: Vec<EntityId> = self
            .slots
            .iter()
            .filter(|(_, slot)| matches!(slot, Slot::Live { .. }))
            .map(|(id, _)| id.clone())
            .collect();
        for id in &live {
            self.begin_stop(id, StopReason::HostShutdown);
        }
        for slot in self.slots.values_mut() {
            if let Slot::Stopping(stopping) = slot {
                for envelope in stopping.held.drain(..) {
                    reply_error(envelope, EntityError::ShuttingDown);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_shares_add_up_to_the_limit() {
        for (limit, count) in [(16, 16), (17, 16), (100_000, 16), (5, 3), (7, 1)] {
            let shares: Vec<usize> = (0..count).map(|i| limit_share(limit, count, i)).collect();
            assert_eq!(shares.iter().sum::<usize>(), limit, "{limit} over {count}");
            assert!(shares.iter().all(|&s| s >= 1 && s <= limit / count + 1));
        }
    }

    /// The ids of one cluster shard (equal hashes modulo the number of shards) still spread
    /// over every partition.
    #[test]
    fn the_entities_of_one_shard_spread_over_all_partitions() {
        let count = 16;
        let mut used = vec![0usize; count];
        let mut in_shard = 0;
        for n in 0..200_000 {
            let id = EntityId::new(&format!("id-{n}")).unwrap();
            if id.stable_hash() % 1000 == 17 {
                in_shard += 1;
                used[partition_of(&id, count)] += 1;
            }
        }
        assert!(in_shard > 100, "{in_shard}");
        assert!(used.iter().all(|&n| n > 0), "{used:?}");
    }
}
