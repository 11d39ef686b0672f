//! Recovering: fence the log under a new epoch, adopt the best tail, copy it to the members
//! that lack it, and seal it on a write quorum (the barrier), after which the log serves.
//!
//! A recovery runs on a set of configurations: promises and seals from a quorum of each.
//! For a plain recovery the set holds the configuration the log was found in. A
//! configuration change recovers on the old and the new one, so that whichever of the two a
//! later recovery starts from, it meets a replica that holds the new one. And when a
//! promiser holds the configuration of a later writer than any in the set, that
//! configuration joins the set (it may be a change that was cut short, or the log moved on):
//! the recovery then covers the latest committed configuration, wherever it started.
//! Creating a log is a recovery of its first configuration in which every member must
//! promise and none may know the log.
//!
//! The adopted log is the log of the promiser whose last entry ranks highest (epoch, then
//! sequence number): a later writer's log holds every entry acknowledged before it started
//! (Raft's "log up-to-date" argument; entries keep the epoch they were written in, only the
//! sealed last entry takes the new one). Promises come from N − W + 1 members of each
//! configuration, so at least one promiser holds every acknowledged entry.

use super::follower::{Follower, FollowerState, Heard, LogView};
use super::locate::{is_legacy, legacy_config};
use super::serving::Serving;
use super::{Ctx, Next, RecoverFrom, RequestId, StopReason, Target};
use crate::configuration::{Configuration, ReplicaId};
use crate::epoch::{Epoch, Position};
use crate::message::{Entry, LogSummary, Payload, Request, Response};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// Configurations one recovery may span before it gives up (the log keeps moving).
const MAX_CONFIGS: usize = 4;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Prepare {
    Waiting(RequestId),
    Promised,
    Refused,
    Retry(Instant),
    Lost,
}

/// The log the recovery settled on.
struct Adopted<P> {
    /// Its last entry: the one to seal.
    at: Position,
    /// Entries up to here are acknowledged.
    floor: u64,
    /// Known entries of the adopted log above the floor (from the best promiser's tail).
    window: BTreeMap<u64, Entry<P>>,
    /// Promisers whose log ends exactly at `at`, best first: they hold the adopted log.
    sources: Vec<ReplicaId>,
    /// Deleted up to here on some promiser.
    deleted_to: u64,
    /// The configuration of the latest writer among the promisers, sent with the copies:
    /// until a replica is sealed, it must not hold a configuration whose quorums may miss
    /// acknowledged entries (a change's new members before they hold the log).
    copy_config: Configuration,
    /// The configuration the log serves under afterwards, sent with the seals.
    config: Configuration,
}

pub(crate) struct Recovery<P> {
    epoch: Epoch,
    /// Where stores were last seen: members that moved are reached (and recorded) there.
    seen_at: BTreeMap<u64, tessera_cluster::Address>,
    configs: Vec<Configuration>,
    target: Option<Configuration>,
    creating: bool,
    seen: Epoch,
    prepares: BTreeMap<ReplicaId, Prepare>,
    promised: BTreeMap<ReplicaId, LogSummary>,
    tails: BTreeMap<ReplicaId, Vec<Entry<P>>>,
    adopted: Option<Adopted<P>>,
    followers: BTreeMap<ReplicaId, Follower>,
    sealed: BTreeSet<ReplicaId>,
    /// Locate requests out to find members whose address left the cluster (their node may
    /// have come back elsewhere with its store).
    locating: BTreeMap<RequestId, tessera_cluster::Address>,
    /// Addresses whose Locate failed, asked again from the given time.
    locate_again: BTreeMap<tessera_cluster::Address, Instant>,
}

impl<P: Payload> Recovery<P> {
    pub fn start(ctx: &mut Ctx<'_, P>, from: RecoverFrom) -> (Self, Next<P>) {
        let epoch = Epoch::after(from.seen, ctx.writer_id);
        let mut recovery = Recovery {
            epoch,
            seen_at: from.seen_at,
            configs: Vec::new(),
            target: from.target,
            creating: from.creating,
            seen: from.seen.max(epoch),
            prepares: BTreeMap::new(),
            promised: BTreeMap::new(),
            tails: BTreeMap::new(),
            adopted: None,
            followers: BTreeMap::new(),
            sealed: BTreeSet::new(),
            locating: BTreeMap::new(),
            locate_again: BTreeMap::new(),
        };
        for config in from.configs {
            recovery.add_config(ctx, config);
        }
        recovery.find_moved(ctx);
        (recovery, Next::Stay)
    }

    /// When a member's address is no longer a cluster member, asks the members that are not
    /// in the configurations which store they run: the missing one may have moved.
    fn find_moved(&mut self, ctx: &mut Ctx<'_, P>) {
        let addresses: BTreeSet<tessera_cluster::Address> = self
            .configs
            .iter()
            .flat_map(|c| c.all_members())
            .map(|m| m.address)
            .collect();
        let missing = addresses.iter().any(|a| !ctx.placement.members.contains(a));
        if !missing {
            return;
        }
        for address in ctx.placement.members.clone() {
            if !addresses.contains(&address) && !self.locating.values().any(|a| *a == address) {
                let id = ctx.send(Target::Address(address.clone()), Request::Locate);
                self.locating.insert(id, address);
            }
        }
    }

    /// A store answered from `address`: if a member of the configurations runs it elsewhere,
    /// the member moved there; prepare it at its new address.
    fn found_at(
        &mut self,
        ctx: &mut Ctx<'_, P>,
        storage_id: u64,
        address: tessera_cluster::Address,
    ) {
        let moved = self.configs.iter().any(|c| {
            c.all_members()
                .iter()
                .any(|m| m.storage_id == storage_id && m.address != address)
        });
        self.seen_at.insert(storage_id, address.clone());
        if !moved {
            return;
        }
        self.configs = self
            .configs
            .iter()
            .map(|c| c.relocated(&self.seen_at))
            .collect();
        let Some((member, state)) = self
            .prepares
            .iter()
            .find(|(m, _)| m.storage_id == storage_id)
            .map(|(m, p)| (m.clone(), p.clone()))
        else {
            return;
        };
        if matches!(state, Prepare::Promised | Prepare::Refused) {
            return;
        }
        self.prepares.remove(&member);
        let relocated = ReplicaId::new(address, storage_id);
        let id = ctx.send(
            Target::Replica(relocated.clone()),
            Request::Prepare { epoch: self.epoch },
        );
        self.prepares.insert(relocated, Prepare::Waiting(id));
    }

    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The configuration the log will serve under, once adopted.
    pub fn final_config(&self) -> Option<&Configuration> {
        self.adopted
            .as_ref()
            .map(|a| &a.config)
            .or(self.target.as_ref())
            .or(self.configs.first())
    }

    /// Adds a configuration to recover on, preparing its members not asked yet (at the
    /// address their store was last seen at).
    fn add_config(&mut self, ctx: &mut Ctx<'_, P>, config: Configuration) {
        let config = config.relocated(&self.seen_at);
        for member in &config.all_members() {
            if !self.prepares.contains_key(member) {
                let id = ctx.send(
                    Target::Replica(member.clone()),
                    Request::Prepare { epoch: self.epoch },
                );
                self.prepares.insert(member.clone(), Prepare::Waiting(id));
            }
        }
        if !self.configs.contains(&config) {
            self.configs.push(config);
        }
    }

    /// Promises needed from a member set of `size`.
    fn promises_needed(&self, size: usize, ctx: &Ctx<'_, P>) -> usize {
        if self.creating {
            size
        } else {
            ctx.settings.quorums.promises(size)
        }
    }

    pub fn on_response(
        &mut self,
        ctx: &mut Ctx<'_, P>,
        id: RequestId,
        to: &Target,
        response: Response<P>,
    ) -> Next<P> {
        if let Some(address) = self.locating.remove(&id) {
            match response {
                Response::Located { storage_id, .. } => self.found_at(ctx, storage_id, address),
                _ => {
                    self.locate_again
                        .insert(address, ctx.now + ctx.settings.retry_interval);
                }
            }
            return self.after_locating(ctx);
        }
        if let Target::Replica(member) = to
            && self.prepares.get(member) == Some(&Prepare::Waiting(id))
        {
            return self.on_prepared(ctx, member.clone(), response);
        }
        // A follower waits for it (a read for a follower goes to another replica).
        let Some(member) = self
            .followers
            .values()
            .find(|f| f.waits_for(id))
            .map(|f| f.id.clone())
        else {
            return Next::Stay;
        };
        self.on_follower(ctx, member, response)
    }

    fn on_prepared(
        &mut self,
        ctx: &mut Ctx<'_, P>,
        member: ReplicaId,
        response: Response<P>,
    ) -> Next<P> {
        match response {
            Response::Promised {
                summary,
                tail,
                tail_complete: _,
            } => {
                self.seen = self.seen.max(summary.promise);
                self.prepares.insert(member.clone(), Prepare::Promised);
                self.tails.insert(member.clone(), tail);
                self.promised.insert(member.clone(), summary.clone());
                if self.adopted.is_some() {
                    // A late promiser: bring it to the adopted log too.
                    let matched = self.matched_from(&summary);
                    self.followers.insert(
                        member.clone(),
                        Follower::known(member.clone(), &summary, matched),
                    );
                    return self.drive(ctx, &member);
                }
                self.try_adopt(ctx)
            }
            Response::Fenced { promise } => {
                self.seen = self.seen.max(promise);
                self.prepares.insert(member, Prepare::Refused);
                if self.quorum_possible(ctx) {
                    Next::Stay
                } else {
                    // A later writer got there first: take the log over with a higher epoch.
                    Next::Recover(RecoverFrom {
                        configs: self.configs.clone(),
                        target: self.target.clone(),
                        creating: self.creating,
                        seen: self.seen.max(self.epoch),
                        seen_at: self.seen_at.clone(),
                    })
                }
            }
            _ => {
                self.prepares.insert(
                    member,
                    Prepare::Retry(ctx.now + ctx.settings.retry_interval),
                );
                Next::Stay
            }
        }
    }

    fn quorum_possible(&self, ctx: &Ctx<'_, P>) -> bool {
        let alive: Vec<&ReplicaId> = self
            .prepares
            .iter()
            .filter(|(_, p)| !matches!(p, Prepare::Refused | Prepare::Lost))
            .map(|(m, _)| m)
            .collect();
        self.configs.iter().all(|config| {
            config.has_quorum(alive.iter().copied(), |n| self.promises_needed(n, ctx))
        })
    }

    fn matched_from(&self, summary: &LogSummary) -> u64 {
        match &self.adopted {
            Some(adopted) if summary.last == adopted.at => adopted.at.seq,
            _ => 0,
        }
    }

    fn try_adopt(&mut self, ctx: &mut Ctx<'_, P>) -> Next<P> {
        let enough = self.configs.iter().all(|config| {
            config.has_quorum(self.promised.keys(), |n| self.promises_needed(n, ctx))
        });
        if !enough {
            return Next::Stay;
        }
        if self.creating {
            // Someone created it meanwhile (or it was written before replication).
            if let Some((replica, summary)) = self
                .promised
                .iter()
                .find(|(_, s)| s.config.is_some() || s.last.seq > 0)
            {
                let config = match &summary.config {
                    Some(at) => at.config.clone(),
                    None => legacy_config(replica),
                };
                return Next::Recover(RecoverFrom {
                    configs: vec![config],
                    target: None,
                    creating: false,
                    seen: self.seen,
                    seen_at: self.seen_at.clone(),
                });
            }
        }
        // The configuration of the latest writer any promiser took writes from: if it is not
        // among the ones recovered on, recover on it too.
        let latest = self
            .promised
            .values()
            .filter_map(|s| s.config.as_ref())
            .max_by_key(|c| c.rank())
            .map(|c| c.config.clone());
        if let Some(latest) = latest.clone()
            && !self.configs.contains(&latest)
        {
            if self.configs.len() >= MAX_CONFIGS {
                return Next::Stop(StopReason::Unavailable(format!(
                    "the log's configuration kept changing during its recovery (now {latest})"
                )));
            }
            if self.target.as_ref().is_some_and(|t| *t != latest) {
                // Another writer changed the configuration meanwhile: this change is moot.
                self.target = None;
            }
            self.add_config(ctx, latest);
            return self.try_adopt(ctx);
        }
        let Some((best, best_summary)) = self
            .promised
            .iter()
            .max_by(|a, b| a.1.last.cmp(&b.1.last))
            .map(|(r, s)| (r.clone(), s.clone()))
        else {
            return Next::Stay;
        };
        let floor = self
            .promised
            .values()
            .map(|s| s.committed())
            .max()
            .unwrap_or(0);
        let at = best_summary.last;
        if at.seq < floor {
            return Next::Stop(StopReason::Inconsistent(format!(
                "the most recent log ({best} ending at {at}) is shorter than the acknowledged \
                 mark {floor} of another replica"
            )));
        }
        let copy_config = match latest {
            Some(latest) => latest,
            // Created now, or written before replication.
            None => {
                if !self.creating && !is_legacy(&best_summary) && at.seq > 0 {
                    return Next::Stop(StopReason::Inconsistent(format!(
                        "{best} holds entries up to {at} but no configuration"
                    )));
                }
                self.configs[0].clone()
            }
        };
        // Members that moved are recorded at their new address with the seal.
        let copy_config = copy_config.relocated(&self.seen_at);
        let config = self
            .target
            .clone()
            .unwrap_or_else(|| copy_config.clone())
            .relocated(&self.seen_at);
        let window: BTreeMap<u64, Entry<P>> = self
            .tails
            .get(&best)
            .into_iter()
            .flatten()
            .filter(|e| e.seq <= at.seq)
            .map(|e| (e.seq, e.clone()))
            .collect();
        let mut sources = vec![best.clone()];
        for (replica, summary) in &self.promised {
            if summary.last == at && *replica != best {
                sources.push(replica.clone());
            }
        }
        let deleted_to = self
            .promised
            .values()
            .map(|s| s.base.seq)
            .max()
            .unwrap_or(0);
        self.adopted = Some(Adopted {
            at,
            floor,
            window,
            sources,
            deleted_to,
            copy_config,
            config,
        });
        let summaries: Vec<(ReplicaId, LogSummary)> = self
            .promised
            .iter()
            .map(|(r, s)| (r.clone(), s.clone()))
            .collect();
        for (replica, summary) in summaries {
            let matched = self.matched_from(&summary);
            self.followers
                .insert(replica.clone(), Follower::known(replica, &summary, matched));
        }
        let members: Vec<ReplicaId> = self.followers.keys().cloned().collect();
        for member in members {
            if let next @ (Next::Stop(_) | Next::Recover(_) | Next::Serve(_)) =
                self.drive(ctx, &member)
            {
                return next;
            }
        }
        Next::Stay
    }

    /// Moves a follower on: copy what it lacks, or seal it once it has everything.
    fn drive(&mut self, ctx: &mut Ctx<'_, P>, member: &ReplicaId) -> Next<P> {
        let Some(adopted) = &self.adopted else {
            return Next::Stay;
        };
        let Some(follower) = self.followers.get_mut(member) else {
            return Next::Stay;
        };
        if !follower.is_idle() || self.sealed.contains(member) {
            return Next::Stay;
        }
        if follower.matched >= adopted.at.seq || follower.committed >= adopted.at.seq {
            follower.matched = adopted.at.seq;
            follower.seal(ctx, self.epoch, adopted.at, &adopted.config);
            return Next::Stay;
        }
        let view = LogView {
            epoch: self.epoch,
            lac: adopted.floor,
            target: adopted.at,
            window: &adopted.window,
            sources: &adopted.sources,
            config: &adopted.copy_config,
        };
        follower.copy(ctx, &view);
        Next::Stay
    }

    fn on_follower(
        &mut self,
        ctx: &mut Ctx<'_, P>,
        member: ReplicaId,
        response: Response<P>,
    ) -> Next<P> {
        let Some(adopted) = &self.adopted else {
            return Next::Stay;
        };
        let Some(follower) = self.followers.get_mut(&member) else {
            return Next::Stay;
        };
        let view = LogView {
            epoch: self.epoch,
            lac: adopted.floor,
            target: adopted.at,
            window: &adopted.window,
            sources: &adopted.sources,
            config: &adopted.copy_config,
        };
        match follower.on_response(ctx, &view, response) {
            Heard::Fenced(by) => Next::Stop(StopReason::Fenced { by }),
            Heard::Invalid(reason) => Next::Stop(StopReason::Inconsistent(reason)),
            Heard::Sealed => {
                self.sealed.insert(member.clone());
                self.try_finish(ctx)
            }
            Heard::Progress | Heard::Nothing => self.drive(ctx, &member),
        }
    }

    fn try_finish(&mut self, ctx: &mut Ctx<'_, P>) -> Next<P> {
        let quorums = ctx.settings.quorums;
        let sealed_everywhere = self
            .configs
            .iter()
            .chain(self.adopted.as_ref().map(|a| &a.config))
            .all(|config| config.has_quorum(self.sealed.iter(), |n| quorums.acks(n)));
        if !sealed_everywhere {
            return Next::Stay;
        }
        let Some(adopted) = self.adopted.take() else {
            return Next::Stay;
        };
        let last = Position::new(adopted.at.seq, self.epoch);
        let mut window = adopted.window;
        if let Some(entry) = window.get_mut(&last.seq) {
            entry.epoch = self.epoch;
        }
        let mut followers = BTreeMap::new();
        for member in &adopted.config.all_members() {
            let mut follower = match self.followers.remove(member) {
                Some(f) => f,
                None => Follower::unknown(member.clone()),
            };
            follower.id = member.clone();
            if self.prepares.get(member) == Some(&Prepare::Lost) {
                // Its store is gone (another store answers at its address): serving starts
                // by replacing it, even when nothing is left to copy that would find out.
                follower.state = FollowerState::Lost;
            }
            followers.insert(member.clone(), follower);
        }
        Next::Serve(Box::new(
            Serving::new(
                self.epoch,
                adopted.config,
                last,
                adopted.deleted_to,
                followers,
                window,
                &self.sealed,
            )
            .owe_mark(ctx.now),
        ))
    }

    pub fn on_failure(&mut self, ctx: &mut Ctx<'_, P>, id: RequestId, to: &Target) -> Next<P> {
        if let Some(address) = self.locating.remove(&id) {
            self.locate_again
                .insert(address, ctx.now + ctx.settings.retry_interval);
            return Next::Stay;
        }
        if let Target::Replica(member) = to
            && self.prepares.get(member) == Some(&Prepare::Waiting(id))
        {
            self.prepares.insert(
                member.clone(),
                Prepare::Retry(ctx.now + ctx.settings.retry_interval),
            );
            return self.after_locating(ctx);
        }
        if let Some(f) = self.followers.values_mut().find(|f| f.waits_for(id)) {
            f.on_failure(ctx.now, ctx.settings.retry_interval);
        }
        Next::Stay
    }

    /// Once every member of the cluster outside the configurations has said which store it
    /// runs, a member whose address left the cluster, did not answer there, and whose store
    /// none runs is gone (its node came back empty elsewhere, or not at all): it is lost, as
    /// a member whose address answers with another store is. (A node that left may still
    /// run and answer at its old address: it is asked there until then.)
    fn after_locating(&mut self, ctx: &mut Ctx<'_, P>) -> Next<P> {
        if !self.locating.is_empty() || !self.locate_again.is_empty() {
            return Next::Stay;
        }
        let gone: Vec<ReplicaId> = self
            .prepares
            .iter()
            .filter(|(m, p)| {
                matches!(p, Prepare::Retry(_))
                    && !ctx.placement.members.contains(&m.address)
                    && !self.seen_at.contains_key(&m.storage_id)
            })
            .map(|(m, _)| m.clone())
            .collect();
        if gone.is_empty() {
            return Next::Stay;
        }
        for member in gone {
            self.prepares.insert(member, Prepare::Lost);
        }
        self.unless_quorum_possible(ctx)
    }

    /// When too few members are left to promise: take the log over again with a higher epoch
    /// if later writers took some promises, or give up.
    fn unless_quorum_possible(&mut self, ctx: &mut Ctx<'_, P>) -> Next<P> {
        if self.quorum_possible(ctx) {
            Next::Stay
        } else if self
            .prepares
            .values()
            .any(|p| matches!(p, Prepare::Refused))
        {
            // Later writers took some of the promises: take the log over again.
            Next::Recover(RecoverFrom {
                configs: self.configs.clone(),
                target: self.target.clone(),
                creating: self.creating,
                seen: self.seen.max(self.epoch),
                seen_at: self.seen_at.clone(),
            })
        } else {
            let configs: Vec<String> = self.configs.iter().map(|c| c.to_string()).collect();
            Next::Stop(StopReason::Unavailable(format!(
                "too few replicas of the log's configuration {} still hold its data",
                configs.join(" and ")
            )))
        }
    }

    pub fn on_lost(&mut self, ctx: &mut Ctx<'_, P>, id: RequestId, to: &Target) -> Next<P> {
        let Target::Replica(member) = to else {
            return Next::Stay;
        };
        let waited = self.prepares.get(member) == Some(&Prepare::Waiting(id))
            || self.followers.get(member).is_some_and(|f| f.waits_for(id));
        if !waited {
            return self.on_failure(ctx, id, to);
        }
        self.prepares.insert(member.clone(), Prepare::Lost);
        if let Some(f) = self.followers.get_mut(member) {
            f.state = FollowerState::Lost;
        }
        self.unless_quorum_possible(ctx)
    }

    pub fn tick(&mut self, ctx: &mut Ctx<'_, P>) -> Next<P> {
        let again: Vec<tessera_cluster::Address> = self
            .locate_again
            .iter()
            .filter(|(_, at)| **at <= ctx.now)
            .map(|(a, _)| a.clone())
            .collect();
        for address in again {
            self.locate_again.remove(&address);
            if ctx.placement.members.contains(&address) {
                let id = ctx.send(Target::Address(address.clone()), Request::Locate);
                self.locating.insert(id, address);
            } else if let next @ (Next::Stop(_) | Next::Recover(_)) = self.after_locating(ctx) {
                return next;
            }
        }
        let retry: Vec<ReplicaId> = self
            .prepares
            .iter()
            .filter(|(_, p)| matches!(p, Prepare::Retry(at) if *at <= ctx.now))
            .map(|(m, _)| m.clone())
            .collect();
        for member in retry {
            let id = ctx.send(
                Target::Replica(member.clone()),
                Request::Prepare { epoch: self.epoch },
            );
            self.prepares.insert(member, Prepare::Waiting(id));
        }
        let woken: Vec<ReplicaId> = self
            .followers
            .values_mut()
            .filter_map(|f| f.wake(ctx.now).then(|| f.id.clone()))
            .collect();
        for member in woken {
            if let next @ (Next::Stop(_) | Next::Recover(_) | Next::Serve(_)) =
                self.drive(ctx, &member)
            {
                return next;
            }
        }
        Next::Stay
    }

    /// Which members the recovery still waits for, for an error message.
    pub fn describe_missing(&self) -> String {
        let configs: Vec<String> = self.configs.iter().map(|c| c.to_string()).collect();
        let waiting: Vec<String> = self
            .prepares
            .iter()
            .filter(|(_, p)| !matches!(p, Prepare::Promised))
            .map(|(m, _)| m.address.to_string())
            .collect();
        if self.adopted.is_none() {
            format!(
                "{} members of {} promised; none from {}",
                self.promised.len(),
                configs.join(" and "),
                waiting.join(", ")
            )
        } else {
            format!(
                "{} members of {} sealed the recovered log",
                self.sealed.len(),
                configs.join(" and ")
            )
        }
    }
}
