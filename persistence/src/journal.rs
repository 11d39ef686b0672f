//! [`ReplicatedJournal`]: the [`Journal`] of a cluster member, every log replicated to N
//! replicas with one fenced writer.
//!
//! Appends, deletes and the highest sequence number go through this node's writer of the
//! log (started on first use: it fences the log and recovers it). Replays read the log from a
//! replica that holds all of it: this node's own store when it is one (as fast as the local
//! journal), another member's otherwise, page by page. Queries by tag and by persistence id,
//! and live queries, run over the logs this node's store holds.

use crate::caller::{CallResult, ReplicaCaller};
use crate::slice_query::{QueryProgress, QueryRun, SliceQuerySettings};
use crate::store::ReplicaStore;
use crate::wire::{ReplicaCall, ReplicaReply, ReplicaRequest};
use crate::writers::{Command, ReadyLog, Writers};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use smol_str::SmolStr;
use std::sync::Arc;
use tessera_cluster::node::ClusterSnapshot;
use tessera_cluster::{Address, MemberStatus};
use tessera_journal::slice::SliceRange;
use tessera_journal::{
    AtomicWrite, EventEnvelope, Journal, JournalError, JournalStream, PersistentRepr, QueryMode,
    SliceItem, SliceOffset, validate_write,
};
use tessera_replication::{
    ConfigAt, Epoch, LogSummary, ReplicaId, Request, Response, Target, WriterStatus,
};
use tokio::sync::watch;

/// A log this node's writer opened: see [`ReplicatedJournal::open_fenced`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FencedLog {
    pub highest: u64,
    /// The epoch of the writer that opened it: higher than that of every writer before.
    pub epoch: Epoch,
}

/// Events read per page from another node's replica.
const READ_PAGE_ENTRIES: u32 = 1_000;
const READ_PAGE_BYTES: u32 = 1024 * 1024;

/// Why a store was not forgotten.
#[derive(Debug, thiserror::Error)]
pub enum ForgetStoreError {
    #[error("no store {storage_id:016x} is known here")]
    Unknown { storage_id: u64 },
    #[error("the store {store} runs at {address}, a member of the cluster")]
    Running { store: ReplicaId, address: Address },
    #[error("the member {member} did not say which store it runs (it could be the store {store})")]
    MemberSilent { store: ReplicaId, member: Address },
    #[error(
        "the log {log:?} on the store {by} names the store {store} in its latest \
         configuration: its writer moves it off a store whose node is no member (the \
         maintenance scan starts one); forget the store once no log names it"
    )]
    Named {
        store: ReplicaId,
        by: ReplicaId,
        log: String,
    },
    #[error(
        "the store {other} could not say whether a log names the store {store}: {reason} \
         (every other known store must answer, except those named gone for good as well)"
    )]
    Unheard {
        store: ReplicaId,
        other: ReplicaId,
        reason: String,
    },
    #[error("{0}")]
    Journal(JournalError),
}

/// The replicated journal. Cheap to share behind an `Arc`.
pub struct ReplicatedJournal {
    writers: Writers,
    caller: Arc<dyn ReplicaCaller>,
    store: Arc<dyn ReplicaStore>,
    queries: Arc<dyn Journal>,
    membership: watch::Receiver<ClusterSnapshot>,
    max_write_bytes: usize,
}

/// One replica's view of a log, as [`ReplicatedJournal::inspect`] found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaView {
    pub replica: ReplicaId,
    /// Whether it answered; the fields below are its answer.
    pub reachable: bool,
    /// Its node runs another store than the configuration names (it lost its data).
    pub wrong_storage: bool,
    pub summary: Option<LogSummary>,
}

/// A log as its replicas see it, for operators.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogInspection {
    pub persistence_id: String,
    /// The latest configuration any member reported (with the epoch that stored it).
    pub config: Option<ConfigAt>,
    /// The configuration's members, each with its answer.
    pub replicas: Vec<ReplicaView>,
    /// This node's writer of the log, if it has one.
    pub writer: Option<WriterStatus>,
}

impl ReplicatedJournal {
    pub(crate) fn new(
        writers: Writers,
        caller: Arc<dyn ReplicaCaller>,
        store: Arc<dyn ReplicaStore>,
        queries: Arc<dyn Journal>,
        membership: watch::Receiver<ClusterSnapshot>,
        max_write_bytes: usize,
    ) -> Self {
        ReplicatedJournal {
            writers,
            caller,
            store,
            queries,
            membership,
            max_write_bytes,
        }
    }

    /// Every acknowledged event of the logs of `entity_type` in `slices`, each log's in
    /// sequence order after its sequence number in `offset`, read from the members' replicas
    /// (docs/src/design.md §5 "Reading the acknowledged logs"): never an event that was not
    /// acknowledged, never a gap. `Current` ends once every member that answers was asked and
    /// all it reported acknowledged was delivered; `Live` goes on until the stream is dropped.
    pub fn events_by_slices(
        &self,
        entity_type: &str,
        slices: SliceRange,
        offset: SliceOffset,
        mode: QueryMode,
    ) -> JournalStream<SliceItem> {
        self.events_by_slices_with(
            entity_type,
            slices,
            offset,
            mode,
            SliceQuerySettings::default(),
        )
    }

    /// [`ReplicatedJournal::events_by_slices`] with other settings.
    pub fn events_by_slices_with(
        &self,
        entity_type: &str,
        slices: SliceRange,
        offset: SliceOffset,
        mode: QueryMode,
        settings: SliceQuerySettings,
    ) -> JournalStream<SliceItem> {
        crate::slice_query::events_by_slices(
            self.caller.clone(),
            self.membership.clone(),
            entity_type,
            slices,
            offset,
            mode,
            QueryRun {
                settings,
                progress: None,
            },
        )
    }

    /// [`ReplicatedJournal::events_by_slices`] with the query's progress beside it, for a
    /// consumer's lag in events: what the members reported acknowledged and the query did
    /// not deliver yet, and how many items it delivered.
    pub fn events_by_slices_with_progress(
        &self,
        entity_type: &str,
        slices: SliceRange,
        offset: SliceOffset,
        mode: QueryMode,
    ) -> (JournalStream<SliceItem>, watch::Receiver<QueryProgress>) {
        let (progress, watched) = watch::channel(QueryProgress::default());
        let items = crate::slice_query::events_by_slices(
            self.caller.clone(),
            self.membership.clone(),
            entity_type,
            slices,
            offset,
            mode,
            QueryRun {
                settings: SliceQuerySettings::default(),
                progress: Some(progress),
            },
        );
        (items, watched)
    }

    /// Asks every member of the cluster what it holds of a log (a read; nothing is fenced):
    /// its configuration, and each replica's promise, last entry, acknowledged mark and
    /// deleted prefix.
    pub async fn inspect(&self, persistence_id: &str) -> LogInspection {
        let addresses: Vec<Address> = self.live_members();
        let calls = addresses.iter().map(|address| {
            let reply = self.caller.call(
                &Target::Address(address.clone()),
                persistence_id,
                Request::Locate,
            );
            async move { (address.clone(), reply.await) }
        });
        let answers: Vec<(Address, u64, Option<LogSummary>)> = futures::future::join_all(calls)
            .await
            .into_iter()
            .filter_map(|(address, result)| match result {
                CallResult::Response(Response::Located {
                    storage_id,
                    summary,
                }) => Some((address, storage_id, summary)),
                _ => None,
            })
            .collect();
        let config = answers
            .iter()
            .filter_map(|(_, _, s)| s.as_ref().and_then(|s| s.config.as_deref().cloned()))
            .max_by_key(|c| c.rank());
        let replicas = config
            .as_ref()
            .map(|c| c.config.all_members())
            .unwrap_or_default()
            .into_iter()
            .map(|replica| {
                let answer = answers.iter().find(|(a, _, _)| *a == replica.address);
                ReplicaView {
                    reachable: answer.is_some(),
                    wrong_storage: answer.is_some_and(|(_, id, _)| *id != replica.storage_id),
                    summary: answer
                        .filter(|(_, id, _)| *id == replica.storage_id)
                        .and_then(|(_, _, s)| s.clone()),
                    replica,
                }
            })
            .collect();
        LogInspection {
            persistence_id: persistence_id.to_string(),
            config,
            replicas,
            writer: self.writers.status(persistence_id).await,
        }
    }

    /// The members that are neither down nor removed: those that may answer.
    fn live_members<C: FromIterator<Address>>(&self) -> C {
        self.membership
            .borrow()
            .members
            .iter()
            .filter(|m| !matches!(m.status, MemberStatus::Down | MemberStatus::Removed))
            .map(|m| m.address().clone())
            .collect()
    }

    /// The stores this node has seen in the cluster ([`crate::known_stores`]).
    pub async fn known_stores(&self) -> Result<Vec<ReplicaId>, JournalError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.writers.send(Command::KnownStores { reply })?;
        answer.await.map_err(|_| JournalError::Closed)
    }

    /// Forgets a store that is gone for good, on this node (an operator runs it on every
    /// node). Refused while a member runs the store (or any member does not say which store
    /// it runs), and unless every other store this node knows answers, from where it was
    /// last seen, that no log it holds names the store in the log's latest configuration
    /// (a copy left behind by an older configuration does not count): then no remembered
    /// store still counts on it, and the logs it held have other replicas (the maintenance
    /// scan moves a log off a store whose node is no member). A log known only to forgotten
    /// stores is then not found, so this is an operator's decision that the store is gone.
    /// Stores in `also_gone` (gone for good as well, so unable to answer) are not asked:
    /// what only they and this store hold is given up.
    pub async fn forget_store(
        &self,
        storage_id: u64,
        also_gone: &[u64],
    ) -> Result<(), ForgetStoreError> {
        let known = self
            .known_stores()
            .await
            .map_err(ForgetStoreError::Journal)?;
        let Some(store) = known.iter().find(|s| s.storage_id == storage_id).cloned() else {
            return Err(ForgetStoreError::Unknown { storage_id });
        };
        let members: std::collections::BTreeSet<Address> = self.live_members();
        let running = crate::maintenance::probe_storage_ids(&self.caller, &members).await;
        if let Some(silent) = members.iter().find(|m| !running.contains_key(*m)) {
            return Err(ForgetStoreError::MemberSilent {
                store,
                member: silent.clone(),
            });
        }
        let local = self.store.storage_id();
        for gone in std::iter::once(storage_id).chain(also_gone.iter().copied()) {
            let at = running
                .iter()
                .find(|(_, id)| **id == gone)
                .map(|(address, _)| address.clone());
            if let Some(address) = at {
                return Err(ForgetStoreError::Running {
                    store: ReplicaId::new(address.clone(), gone),
                    address,
                });
            }
            if gone == local {
                let address = self.caller.local().0.clone();
                return Err(ForgetStoreError::Running {
                    store: ReplicaId::new(address.clone(), gone),
                    address,
                });
            }
        }
        for other in known
            .iter()
            .filter(|o| o.storage_id != storage_id && !also_gone.contains(&o.storage_id))
        {
            let mut after = None;
            loop {
                let reply = self
                    .caller
                    .call_any(
                        &other.address,
                        ReplicaCall {
                            log: SmolStr::new_static(crate::maintenance::STORAGE_PROBE_LOG),
                            storage_id: Some(other.storage_id),
                            request: ReplicaRequest::NamesStore {
                                storage_id,
                                after: after.clone(),
                            },
                        },
                    )
                    .await;
                let unheard = |reason: String| ForgetStoreError::Unheard {
                    store: store.clone(),
                    other: other.clone(),
                    reason,
                };
                let (logs, next) = match reply {
                    Ok(ReplicaReply::NamedBy { logs, next }) => (logs, next),
                    Ok(ReplicaReply::WrongStorage { storage_id: found }) => {
                        return Err(unheard(format!(
                            "another store ({found:016x}) answers at its address"
                        )));
                    }
                    Ok(ReplicaReply::Failed { reason }) => return Err(unheard(reason)),
                    Ok(reply) => return Err(unheard(format!("unexpected answer {reply:?}"))),
                    Err(reason) => return Err(unheard(reason)),
                };
                for log in logs {
                    // A copy an older configuration left on a store it dropped keeps naming
                    // the store; only the log's latest configuration counts.
                    let latest = self.inspect(&log).await.config;
                    let named = latest.is_none_or(|at| {
                        at.config
                            .all_members()
                            .iter()
                            .any(|m| m.storage_id == storage_id)
                    });
                    if named {
                        return Err(ForgetStoreError::Named {
                            store,
                            by: other.clone(),
                            log,
                        });
                    }
                }
                match next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.writers
            .send(Command::ForgetStore { storage_id, reply })
            .map_err(ForgetStoreError::Journal)?;
        match answer.await {
            Ok(true) => Ok(()),
            Ok(false) => Err(ForgetStoreError::Unknown { storage_id }),
            Err(_) => Err(ForgetStoreError::Journal(JournalError::Closed)),
        }
    }

    /// Makes this node the writer of a log — a new writer, recovering it afresh, which fences
    /// every writer before, this node's own included — and returns its highest sequence
    /// number with the epoch of this writer. Writes made
    /// with [`ReplicatedJournal::append_fenced`] and that epoch are taken only while this very
    /// writer holds the log as it opened it: once it was dropped or replaced, or another
    /// writer took the log over (even if this one took it back since), they are refused,
    /// though a new writer on this node could recover the log again. A configuration change
    /// this writer makes keeps them. So a caller that read the log through its writer never
    /// writes after another caller opened it (a projection instance's offsets).
    pub async fn open_fenced(&self, persistence_id: &str) -> Result<FencedLog, JournalError> {
        let ready = self
            .writers
            .ask(|reply| Command::Reopen {
                persistence_id: persistence_id.to_string(),
                reply,
            })
            .await?;
        let serving = self.writers.serving(persistence_id).await.ok_or_else(|| {
            JournalError::Unavailable {
                persistence_id: persistence_id.to_string(),
                reason: "its writer on this node stopped serving as it was opened".into(),
            }
        })?;
        // The opening's epoch, not the serving one: a configuration change since may have
        // recovered the log again under a newer epoch of this same writer.
        let epoch = ready.opened.unwrap_or(serving.epoch);
        Ok(FencedLog {
            highest: ready.highest.max(serving.highest),
            epoch,
        })
    }

    /// Appends `write` only while the writer [`ReplicatedJournal::open_fenced`] returned
    /// `epoch` for serves the log on this node.
    pub fn append_fenced(
        &self,
        write: AtomicWrite,
        epoch: Epoch,
    ) -> BoxFuture<'static, Result<(), JournalError>> {
        self.append_by(write, Some(epoch))
    }

    /// An append through this node's writer of the log; with `writer`, only by the writer
    /// serving with that epoch.
    fn append_by(
        &self,
        write: AtomicWrite,
        writer: Option<Epoch>,
    ) -> BoxFuture<'static, Result<(), JournalError>> {
        if let Err(e) = validate_write(&write, self.max_write_bytes) {
            return futures::future::ready(Err(e)).boxed();
        }
        let writers = self.writers.clone();
        async move {
            writers
                .ask(|reply| Command::Append {
                    write,
                    writer,
                    reply,
                })
                .await
        }
        .boxed()
    }

    /// The state of this node's writer of a log, if it has one.
    pub async fn writer_status(&self, persistence_id: &str) -> Option<WriterStatus> {
        self.writers.status(persistence_id).await
    }

    fn ready(&self, persistence_id: &str) -> BoxFuture<'static, Result<ReadyLog, JournalError>> {
        let writers = self.writers.clone();
        let persistence_id = persistence_id.to_string();
        async move {
            writers
                .ask(|reply| Command::Ready {
                    persistence_id,
                    reply,
                })
                .await
        }
        .boxed()
    }
}

fn failed<T: Send + 'static>(e: JournalError) -> JournalStream<T> {
    futures::stream::once(async move { Err(e) }).boxed()
}

/// Reads `from..=to` of a log from another node's replica, page by page, trying the sources
/// in turn when one fails.
fn remote_replay(
    caller: Arc<dyn ReplicaCaller>,
    persistence_id: String,
    sources: Vec<tessera_replication::ReplicaId>,
    from: u64,
    to: u64,
    max: u64,
) -> JournalStream<PersistentRepr> {
    struct Cursor {
        next: u64,
        left: u64,
        source: usize,
        failures: usize,
    }
    let start = Cursor {
        next: from,
        left: max,
        source: 0,
        failures: 0,
    };
    futures::stream::unfold(Some(start), move |cursor| {
        let caller = caller.clone();
        let persistence_id = persistence_id.clone();
        let sources = sources.clone();
        async move {
            let mut cursor = cursor?;
            loop {
                if cursor.next > to || cursor.left == 0 {
                    return None;
                }
                let Some(source) = sources.get(cursor.source % sources.len().max(1)) else {
                    let e = JournalError::Unavailable {
                        persistence_id,
                        reason: "no replica holds the whole log".into(),
                    };
                    return Some((vec![Err(e)], None));
                };
                let request = Request::Read {
                    from: cursor.next,
                    to,
                    max_entries: READ_PAGE_ENTRIES
                        .min(u32::try_from(cursor.left).unwrap_or(u32::MAX)),
                    max_bytes: READ_PAGE_BYTES,
                };
                let target = Target::Replica(source.clone());
                match caller.call(&target, &persistence_id, request).await {
                    CallResult::Response(Response::Entries { entries, summary }) => {
                        if cursor.next <= summary.base.seq {
                            // Deleted: a replay skips deleted events.
                            cursor.next = summary.base.seq + 1;
                            continue;
                        }
                        let mut page = Vec::with_capacity(entries.len());
                        for entry in entries {
                            if entry.seq != cursor.next || cursor.left == 0 {
                                break;
                            }
                            page.push(Ok(entry.payload.to_repr(&persistence_id, entry.seq)));
                            cursor.next += 1;
                            cursor.left -= 1;
                        }
                        if page.is_empty() {
                            let e = JournalError::Unavailable {
                                persistence_id,
                                reason: format!(
                                    "replica {source} does not hold entry {} any more",
                                    cursor.next
                                ),
                            };
                            return Some((vec![Err(e)], None));
                        }
                        return Some((page, Some(cursor)));
                    }
                    other => {
                        cursor.failures += 1;
                        cursor.source += 1;
                        if cursor.failures > sources.len() * 2 {
                            let e = JournalError::Unavailable {
                                persistence_id,
                                reason: format!(
                                    "reading the log from its replicas failed: {other:?}"
                                ),
                            };
                            return Some((vec![Err(e)], None));
                        }
                    }
                }
            }
        }
    })
    .flat_map(futures::stream::iter)
    .boxed()
}

impl Journal for ReplicatedJournal {
    fn append(&self, write: AtomicWrite) -> BoxFuture<'static, Result<(), JournalError>> {
        self.append_by(write, None)
    }

    fn replay(
        &self,
        persistence_id: &str,
        from_sequence_nr: u64,
        to_sequence_nr: u64,
        max: u64,
    ) -> JournalStream<PersistentRepr> {
        if let Some(problem) = tessera_journal::name_problem(persistence_id) {
            return failed(JournalError::InvalidName {
                what: "persistence id",
                value: tessera_journal::name_excerpt(persistence_id),
                reason: problem,
            });
        }
        let ready = self.ready(persistence_id);
        let caller = self.caller.clone();
        let store = self.store.clone();
        let persistence_id = persistence_id.to_string();
        futures::stream::once(async move {
            let ready = match ready.await {
                Ok(ready) => ready,
                Err(e) => return failed(e),
            };
            let to = to_sequence_nr.min(ready.highest);
            let from = from_sequence_nr.max(ready.deleted_to + 1).max(1);
            if from > to || max == 0 {
                return futures::stream::empty().boxed();
            }
            let (local_address, storage_id) = caller.local();
            let local_is_source = ready
                .sources
                .first()
                .is_some_and(|s| &s.address == local_address && s.storage_id == storage_id);
            if local_is_source {
                store.replay(&persistence_id, from, to, max)
            } else {
                remote_replay(caller, persistence_id, ready.sources, from, to, max)
            }
        })
        .flatten()
        .boxed()
    }

    fn highest_sequence_nr(
        &self,
        persistence_id: &str,
    ) -> BoxFuture<'static, Result<u64, JournalError>> {
        let ready = self.ready(persistence_id);
        async move { Ok(ready.await?.highest) }.boxed()
    }

    fn delete_to(
        &self,
        persistence_id: &str,
        to_sequence_nr: u64,
    ) -> BoxFuture<'static, Result<(), JournalError>> {
        let writers = self.writers.clone();
        let persistence_id = persistence_id.to_string();
        async move {
            writers
                .ask(|reply| Command::DeleteTo {
                    persistence_id,
                    to: to_sequence_nr,
                    reply,
                })
                .await
        }
        .boxed()
    }

    fn events_by_persistence_id(
        &self,
        persistence_id: &str,
        from_sequence_nr: u64,
        mode: QueryMode,
    ) -> JournalStream<PersistentRepr> {
        self.queries
            .events_by_persistence_id(persistence_id, from_sequence_nr, mode)
    }

    fn events_by_tag(
        &self,
        tag: &str,
        after_offset: u64,
        mode: QueryMode,
    ) -> JournalStream<EventEnvelope> {
        self.queries.events_by_tag(tag, after_offset, mode)
    }

    fn persistence_ids(&self, mode: QueryMode) -> JournalStream<String> {
        self.queries.persistence_ids(mode)
    }

    fn confirms_reads(&self) -> bool {
        true
    }

    fn confirm_writer(
        &self,
        persistence_id: &str,
        highest: u64,
    ) -> BoxFuture<'static, Result<(), JournalError>> {
        let writers = self.writers.clone();
        let persistence_id = persistence_id.to_string();
        async move {
            writers
                .ask(|reply| Command::Confirm {
                    persistence_id,
                    highest,
                    reply,
                })
                .await
        }
        .boxed()
    }
}
