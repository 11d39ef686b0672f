//! Re-replication of idle logs: a log whose configuration lost a member regains N copies
//! whether or not an entity writes it (docs/src/design.md §5 "Placement").
//!
//! Every node scans the logs its own store holds, a page at a time. A log needs care when a
//! member of its configuration is no longer a member of the cluster, or when that member's
//! node answers with another store than the configuration names (it lost its disk). Of the
//! configuration's live members, the first in configuration order takes care of it: it starts
//! a writer for the log, which recovers it and, once serving, moves it off the lost member
//! (one member per change); the writer is dropped again once it is idle. At most
//! `max_concurrent` such writers run at once, so a full scan of `L` logs takes at most about
//! `L / page_size` rounds plus the time their changes take.
//!
//! A log also needs care when its replica here holds entries above its acknowledged mark,
//! unchanged, for `stuck_tail_grace`: a live writer tells its replicas the mark within its
//! `mark_delay` and keeps telling it until they know, so its last writer died before telling
//! the mark (or cannot reach this replica), and a recovery settles the tail (so that the
//! queries by slice, which read only acknowledged entries, see them). The grace is far
//! shorter than `takeover_grace`: a projection waits for that tail, and a writer still alive
//! that this fences loses no data (its next write finds the log taken and recovers it).
//!
//! A log that an entity writes on another node is moved by that node's writer, which sees the
//! membership change itself; taking it over from here would fence that writer and fail the
//! entity's commands in flight. So a log is taken care of only once it has needed care for
//! `takeover_grace` (longer than a writer stays without writes before it is dropped): by then
//! no writer anywhere is serving it.

use crate::caller::ReplicaCaller;
use crate::store::ReplicaStore;
use crate::wire::{ReplicaCall, ReplicaReply, ReplicaRequest};
use crate::writers::{Command, Writers};
use smol_str::SmolStr;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tessera_cluster::node::ClusterSnapshot;
use tessera_cluster::{Address, MemberStatus};
use tessera_replication::{Configuration, Request, Response};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A log id no writer uses: asking a node to locate it tells its store id and nothing else.
pub const STORAGE_PROBE_LOG: &str = "tessera.storage-probe";

/// Settings of the scan.
#[derive(Clone, Debug)]
pub struct MaintenanceSettings {
    /// Time between two pages of the scan.
    pub scan_interval: Duration,
    /// Logs looked at per page.
    pub page_size: usize,
    /// Logs being moved at once by this node.
    pub max_concurrent: usize,
    /// How long a log must have needed care before this node takes it over (see the module
    /// documentation); never less than the writers' idle timeout plus `scan_interval`.
    pub takeover_grace: Duration,
    /// How long a replica's entries above its acknowledged mark must stay unchanged before
    /// this node recovers the log (see the module documentation); longer than a live
    /// writer's whole schedule of telling the mark.
    pub stuck_tail_grace: Duration,
}

/// The members' stores are probed again after this long at most, whatever the scan's pace
/// (and at once when the members change).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(10);

/// Logs remembered as needing care, at most; beyond it, newly seen ones wait for the next
/// pass (the scan finds them again).
pub const NEEDING_CARE_CAPACITY: usize = 100_000;

impl Default for MaintenanceSettings {
    fn default() -> Self {
        MaintenanceSettings {
            scan_interval: Duration::from_secs(2),
            page_size: 512,
            max_concurrent: 32,
            // Raised to the writers' idle timeout plus a scan interval when started.
            takeover_grace: Duration::ZERO,
            stuck_tail_grace: Duration::from_secs(10),
        }
    }
}

/// Whether a configuration has a member that is gone: not a cluster member that can hold
/// replicas any more, or its node now has another store.
pub fn has_lost_member(
    config: &Configuration,
    members: &BTreeSet<Address>,
    storage_ids: &HashMap<Address, u64>,
) -> bool {
    config.all_members().iter().any(|m| {
        !members.contains(&m.address)
            || storage_ids
                .get(&m.address)
                .is_some_and(|id| *id != m.storage_id)
    })
}

/// The members whose replicas count: those Up, Leaving or Exiting.
pub(crate) fn holding_members(snapshot: &ClusterSnapshot) -> BTreeSet<Address> {
    snapshot
        .members
        .iter()
        .filter(|m| {
            matches!(
                m.status,
                MemberStatus::Up | MemberStatus::Leaving | MemberStatus::Exiting
            )
        })
        .map(|m| m.address().clone())
        .collect()
}

/// Whether `local` is the first live member of `config`: the one that takes care of it.
pub fn takes_care(config: &Configuration, members: &BTreeSet<Address>, local: &Address) -> bool {
    config
        .all_members()
        .iter()
        .find(|m| members.contains(&m.address))
        .is_some_and(|m| &m.address == local)
}

/// Starts the scan. With `learn_from_configs` (the node had no list of known stores yet, as
/// after an upgrade), its first pass also teaches the writers every store the
/// configurations of the logs held here name; afterwards only the probes do (a copy an
/// older configuration left here may name a store an operator has since forgotten).
pub(crate) fn start(
    store: Arc<dyn ReplicaStore>,
    caller: Arc<dyn ReplicaCaller>,
    writers: Writers,
    mut membership: watch::Receiver<ClusterSnapshot>,
    settings: MaintenanceSettings,
    mut learn_from_configs: bool,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let local = caller.local().0.clone();
        let mut after: Option<String> = None;
        let mut storage_ids: HashMap<Address, u64> = HashMap::new();
        let mut probed: Option<(BTreeSet<Address>, tokio::time::Instant)> = None;
        // Logs that need care, and since when.
        let mut needing_care: HashMap<String, tokio::time::Instant> = HashMap::new();
        // Logs whose tail here stays above the acknowledged mark: since when, the (mark,
        // last entry) it stays at, and whether a recovery was started for it already (one
        // that left it so — a replica the log's writers no longer count, say — is not
        // started again until the tail changes: it would only fence the log's writer).
        let mut stuck_tails: HashMap<String, (tokio::time::Instant, (u64, u64), bool)> =
            HashMap::new();
        loop {
            tokio::time::sleep(settings.scan_interval).await;
            let snapshot = membership.borrow_and_update().clone();
            if snapshot.self_status != Some(MemberStatus::Up) {
                continue;
            }
            let members = holding_members(&snapshot);
            let due = probed.as_ref().is_none_or(|(probed_members, at)| {
                *probed_members != members || at.elapsed() >= PROBE_INTERVAL
            });
            if after.is_none() || due {
                // Which store each member runs now, at the start of each pass and whenever
                // the members change (the writers remember them: a log no member knows is
                // created only when enough of the stores ever seen answer).
                storage_ids = probe_storage_ids(&caller, &members).await;
                probed = Some((members.clone(), tokio::time::Instant::now()));
                let answered = storage_ids
                    .iter()
                    .map(|(address, id)| (address.clone(), *id))
                    .collect();
                let _ = writers.send(Command::StoresSeen {
                    answered,
                    named: Vec::new(),
                });
            }
            let page = match store.logs(after.clone(), settings.page_size).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(error = %e, "scanning the replica store failed");
                    continue;
                }
            };
            after = if page.len() < settings.page_size {
                None
            } else {
                page.last().map(|(id, _)| id.clone())
            };
            if learn_from_configs {
                // Every store a configuration here names may hold logs.
                let named: BTreeSet<(Address, u64)> = page
                    .iter()
                    .flat_map(|(_, config)| config.config.all_members())
                    .map(|m| (m.address, m.storage_id))
                    .collect();
                let sent = named.is_empty()
                    || writers
                        .send(Command::StoresSeen {
                            answered: Vec::new(),
                            named: named.into_iter().collect(),
                        })
                        .is_ok();
                if !sent {
                    // The writers are busy: this pass starts again.
                    after = None;
                    continue;
                }
                if after.is_none() {
                    learn_from_configs = false;
                }
            }
            let unsettled = unsettled_tails(store.as_ref(), &page).await;
            let mut started = 0;
            let now = tokio::time::Instant::now();
            for (log, config) in page {
                if started >= settings.max_concurrent {
                    // The rest of the page is looked at again in the next pass.
                    after = None;
                    break;
                }
                // A tail counts as left behind only while it stays exactly as it was: a log
                // being written moves.
                let stuck = match unsettled.get(&log) {
                    Some(&tail) => match stuck_tails.get(&log) {
                        Some((since, seen, tried)) if *seen == tail => {
                            !tried && now.duration_since(*since) >= settings.stuck_tail_grace
                        }
                        _ => {
                            if stuck_tails.len() < NEEDING_CARE_CAPACITY {
                                stuck_tails.insert(log.clone(), (now, tail, false));
                            }
                            false
                        }
                    },
                    None => {
                        stuck_tails.remove(&log);
                        false
                    }
                };
                if stuck && takes_care(&config.config, &members, &local) {
                    started += 1;
                    if let Some(entry) = stuck_tails.get_mut(&log) {
                        entry.2 = true;
                    }
                    needing_care.remove(&log);
                    let _ = writers.send(Command::Maintain {
                        persistence_id: log,
                    });
                    continue;
                }
                if !(has_lost_member(&config.config, &members, &storage_ids)
                    && takes_care(&config.config, &members, &local))
                {
                    needing_care.remove(&log);
                    continue;
                }
                let since = match needing_care.get(&log) {
                    Some(since) => *since,
                    None if needing_care.len() < NEEDING_CARE_CAPACITY => {
                        needing_care.insert(log.clone(), now);
                        now
                    }
                    None => continue,
                };
                if now.duration_since(since) >= settings.takeover_grace {
                    started += 1;
                    needing_care.remove(&log);
                    let _ = writers.send(Command::Maintain {
                        persistence_id: log,
                    });
                }
            }
        }
    })
}

/// Logs of `page` whose replica here holds entries above its acknowledged mark, with the
/// mark and the last entry. Once that has lasted `takeover_grace` unchanged, no writer
/// serves the log (one that did would have told its
/// replicas the mark within its `mark_delay`): the last one died between storing entries and
/// telling the mark. A writer started here recovers the log, which settles the tail —
/// acknowledged and so marked, or truncated — and the queries by slice see what was
/// acknowledged without waiting for the entity to write again.
async fn unsettled_tails(
    store: &dyn ReplicaStore,
    page: &[(String, tessera_replication::ConfigAt)],
) -> HashMap<String, (u64, u64)> {
    let located = store
        .apply_many(
            page.iter()
                .map(|(log, _)| (log.clone(), Request::Locate))
                .collect(),
        )
        .await;
    page.iter()
        .zip(located)
        .filter_map(|((log, _), answer)| match answer {
            Ok(Response::Located {
                summary: Some(summary),
                ..
            }) if summary.last.seq > summary.committed() => {
                Some((log.clone(), (summary.committed(), summary.last.seq)))
            }
            _ => None,
        })
        .collect()
}

/// Asks every member which store it runs, with the probe log.
pub(crate) async fn probe_storage_ids(
    caller: &Arc<dyn ReplicaCaller>,
    members: &BTreeSet<Address>,
) -> HashMap<Address, u64> {
    let calls = members.iter().map(|address| {
        let reply = caller.call_any(
            address,
            ReplicaCall {
                log: SmolStr::new_static(STORAGE_PROBE_LOG),
                storage_id: None,
                request: ReplicaRequest::Log(Request::Locate),
            },
        );
        async move { (address.clone(), reply.await) }
    });
    futures::future::join_all(calls)
        .await
        .into_iter()
        .filter_map(|(address, reply)| match reply {
            Ok(ReplicaReply::Answer(Response::Located { storage_id, .. })) => {
                Some((address, storage_id))
            }
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_replication::ReplicaId;

    fn address(port: u16) -> Address {
        Address::new("10.0.0.1", port)
    }

    #[test]
    fn a_member_that_left_or_changed_its_store_is_lost() {
        let config = Configuration::new(
            1,
            vec![
                ReplicaId::new(address(1), 11),
                ReplicaId::new(address(2), 12),
                ReplicaId::new(address(3), 13),
            ],
        );
        let all: BTreeSet<Address> = [address(1), address(2), address(3)].into();
        let mut ids = HashMap::new();
        assert!(!has_lost_member(&config, &all, &ids));
        let two: BTreeSet<Address> = [address(2), address(3)].into();
        assert!(has_lost_member(&config, &two, &ids));
        // The first live member in configuration order takes care of it.
        assert!(takes_care(&config, &two, &address(2)));
        assert!(!takes_care(&config, &two, &address(3)));
        ids.insert(address(3), 99);
        assert!(has_lost_member(&config, &all, &ids));
    }
}
