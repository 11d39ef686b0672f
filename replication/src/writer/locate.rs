//! Locating: which configuration holds the log, or proof that no replica knows it.
//!
//! The log's preference list (its first N Up members on the ring) is asked first: a log
//! lives there unless the cluster changed since it was created. If none of them knows it,
//! every member is asked. A configuration found anywhere wins (the one of the latest epoch;
//! recovery follows it to any later one); a log is new only when every member answered that
//! it knows nothing of it, membership has converged (so that no other node places it
//! elsewhere at the same time), and fewer than W of the stores this node has known in the
//! cluster are unheard (the members now may all be newcomers to the log's replicas: after a
//! restart of the whole cluster, the first node is Up alone while the others still join; a
//! log serves once W stores hold it, so W unheard stores could be all that know it).
//! A replica that holds entries but no configuration holds a log written before
//! replication: it becomes the log's first configuration.

use super::{Ctx, Next, RecoverFrom, RequestId, StopReason, Target};
use crate::configuration::{Configuration, ReplicaId};
use crate::epoch::Epoch;
use crate::message::{LogSummary, Request, Response};
use std::collections::{BTreeMap, BTreeSet};
use tessera_cluster::Address;

pub(crate) struct Locating {
    /// Asked every member (the second round).
    wide: bool,
    waiting: BTreeMap<RequestId, Address>,
    asked: BTreeSet<Address>,
    /// Replicas that know the log.
    found: Vec<(ReplicaId, LogSummary)>,
    storage: BTreeMap<Address, u64>,
    silent: BTreeSet<Address>,
    seen: Epoch,
    /// No member knows the log, but it cannot be created yet: it is asked again once that
    /// may have changed (until the recovery times out).
    awaiting: Option<Awaiting>,
}

/// Why a log no member knows is not created yet.
enum Awaiting {
    /// Membership had not converged.
    Convergence,
    /// At least W stores this node has known in the cluster did not answer (they are not
    /// members now): they could be all the stores that know the log. Asked again when the
    /// members are no longer `members`, or fewer stores are unheard (some were forgotten).
    Stores {
        members: Vec<Address>,
        unheard: Vec<ReplicaId>,
    },
}

impl Locating {
    pub fn start<P>(ctx: &mut Ctx<'_, P>) -> (Self, Next<P>) {
        let mut locating = Locating {
            wide: false,
            waiting: BTreeMap::new(),
            asked: BTreeSet::new(),
            found: Vec::new(),
            storage: BTreeMap::new(),
            silent: BTreeSet::new(),
            seen: Epoch::ZERO,
            awaiting: None,
        };
        let n = ctx.settings.quorums.replication_factor();
        let mut first: Vec<Address> = ctx.placement.preference.iter().take(n).cloned().collect();
        if let Some(local) = &ctx.placement.local
            && !first.contains(local)
        {
            first.push(local.clone());
        }
        locating.ask(ctx, first);
        let next = locating.decide(ctx);
        (locating, next)
    }

    fn ask<P>(&mut self, ctx: &mut Ctx<'_, P>, addresses: Vec<Address>) {
        for address in addresses {
            if self.asked.insert(address.clone()) {
                let id = ctx.send(Target::Address(address.clone()), Request::Locate);
                self.waiting.insert(id, address);
            }
        }
    }

    pub fn on_response<P>(
        &mut self,
        ctx: &mut Ctx<'_, P>,
        id: RequestId,
        to: &Target,
        response: Response<P>,
    ) -> Next<P> {
        let Some(address) = self.waiting.remove(&id) else {
            return Next::Stay;
        };
        match response {
            Response::Located {
                storage_id,
                summary,
            } => {
                // A store answering from a second address moved there (its node restarted
                // elsewhere); the later answer wins. (Two nodes running copies of one store
                // directory would look the same: that must never be done.)
                self.storage.retain(|_, id| *id != storage_id);
                self.storage.insert(address.clone(), storage_id);
                if let Some(summary) = summary {
                    self.seen = self.seen.max(summary.promise).max(summary.last.epoch);
                    if summary.config.is_some() || is_legacy(&summary) {
                        self.found
                            .push((ReplicaId::new(address, storage_id), summary));
                    }
                }
            }
            _ => {
                self.silent.insert(to.address().clone());
            }
        }
        self.decide(ctx)
    }

    pub fn on_failure<P>(&mut self, ctx: &mut Ctx<'_, P>, id: RequestId, _to: &Target) -> Next<P> {
        if let Some(address) = self.waiting.remove(&id) {
            self.silent.insert(address);
        }
        self.decide(ctx)
    }

    fn decide<P>(&mut self, ctx: &mut Ctx<'_, P>) -> Next<P> {
        // A replicated log's configuration is enough to start once every member's store has
        // answered (the recovery follows the promisers to any later configuration): the
        // answers still out need not be waited for. A member not heard from yet may have
        // moved to another address, which the rest of the answers (or asking everyone) tell.
        // A log from before replication waits for all answers: a replicated one would win.
        if let Some(config) = self.best_found() {
            let seen_at = self.seen_at();
            let replicated = self.found.iter().any(|(_, s)| s.config.is_some());
            let all_seen = config
                .all_members()
                .iter()
                .all(|m| seen_at.contains_key(&m.storage_id));
            let asked_everyone =
                self.wide || ctx.placement.members.iter().all(|a| self.asked.contains(a));
            let start = if self.waiting.is_empty() {
                all_seen || asked_everyone
            } else {
                replicated && all_seen
            };
            if start {
                return Next::Recover(RecoverFrom {
                    configs: vec![config.relocated(&seen_at)],
                    target: None,
                    creating: false,
                    seen: self.seen,
                    seen_at,
                });
            }
            if self.waiting.is_empty() {
                // Look for the members not heard from among every member of the cluster.
                self.wide = true;
                let rest: Vec<Address> = ctx
                    .placement
                    .members
                    .iter()
                    .filter(|a| !self.asked.contains(*a))
                    .cloned()
                    .collect();
                self.ask(ctx, rest);
                return self.decide(ctx);
            }
            return Next::Stay;
        }
        if !self.waiting.is_empty() {
            return Next::Stay;
        }
        if !self.wide {
            self.wide = true;
            let rest: Vec<Address> = ctx
                .placement
                .members
                .iter()
                .filter(|a| !self.asked.contains(*a))
                .cloned()
                .collect();
            if !rest.is_empty() {
                self.ask(ctx, rest);
                return Next::Stay;
            }
        }
        if !self.silent.is_empty() {
            let silent: Vec<String> = self.silent.iter().map(|a| a.to_string()).collect();
            return Next::Stop(StopReason::Unavailable(format!(
                "cannot tell whether the log exists: {} did not answer",
                silent.join(", ")
            )));
        }
        if !ctx.placement.converged {
            // Another node may be placing the log at this moment on a view of its own.
            self.awaiting = Some(Awaiting::Convergence);
            return Next::Stay;
        }
        let unheard = self.unheard_stores(ctx);
        if unheard.len() >= ctx.settings.quorums.write_quorum() {
            ctx.counters.creations_held += 1;
            self.awaiting = Some(Awaiting::Stores {
                members: ctx.placement.members.clone(),
                unheard,
            });
            return Next::Stay;
        }
        let n = ctx.settings.quorums.replication_factor();
        let mut members = Vec::new();
        for address in ctx.placement.preference.iter().take(n) {
            match self.storage.get(address) {
                Some(storage_id) => members.push(ReplicaId::new(address.clone(), *storage_id)),
                None => {
                    return Next::Stop(StopReason::Unavailable(format!(
                        "{address} is in the log's placement but was not asked"
                    )));
                }
            }
        }
        if members.is_empty() {
            return Next::Stop(StopReason::Unavailable(
                "no Up member to place the log on".to_string(),
            ));
        }
        Next::Recover(RecoverFrom {
            configs: vec![Configuration::new(1, members)],
            target: None,
            creating: true,
            seen: self.seen,
            seen_at: self.seen_at(),
        })
    }

    /// Time passed: once membership has converged, or the members are others than when no
    /// member knew the log, it is looked for again (members may have come or gone
    /// meanwhile), then created if still unknown.
    pub fn tick<P>(&mut self, ctx: &mut Ctx<'_, P>) -> Next<P> {
        let again = match &self.awaiting {
            None => false,
            Some(Awaiting::Convergence) => ctx.placement.converged,
            Some(Awaiting::Stores { members, .. }) => {
                *members != ctx.placement.members
                    || self.unheard_stores(ctx).len() < ctx.settings.quorums.write_quorum()
            }
        };
        if !again {
            return Next::Stay;
        }
        let (fresh, next) = Locating::start(ctx);
        *self = fresh;
        next
    }

    /// What it waits for, for an error message.
    pub fn describe(&self) -> String {
        match &self.awaiting {
            None => "locating the log".to_string(),
            Some(Awaiting::Convergence) => {
                "the log is not known to any member, and cluster membership did not converge \
                 (it is created once membership has converged)"
                    .to_string()
            }
            Some(Awaiting::Stores { unheard, .. }) => {
                let stores: Vec<String> = unheard.iter().map(|r| r.to_string()).collect();
                format!(
                    "the log is not known to any member, but {} stores this node has seen in \
                     the cluster did not answer and could hold it: {} (it is created once \
                     fewer of them than the write quorum are unheard)",
                    unheard.len(),
                    stores.join(", ")
                )
            }
        }
    }

    /// Stores this node has known in the cluster that did not answer this locating.
    fn unheard_stores<P>(&self, ctx: &Ctx<'_, P>) -> Vec<ReplicaId> {
        let heard: BTreeSet<u64> = self.storage.values().copied().collect();
        ctx.placement
            .known_stores
            .iter()
            .filter(|store| !heard.contains(&store.storage_id))
            .cloned()
            .collect()
    }

    /// Where each store answered from.
    fn seen_at(&self) -> BTreeMap<u64, Address> {
        self.storage
            .iter()
            .map(|(address, id)| (*id, address.clone()))
            .collect()
    }

    /// The configuration of the latest epoch among the answers; a log from before replication
    /// counts as a configuration of its one replica, below any other.
    fn best_found(&self) -> Option<Configuration> {
        let mut best: Option<(Option<(Epoch, u64)>, Configuration)> = None;
        for (replica, summary) in &self.found {
            let candidate = match &summary.config {
                Some(at) => (Some(at.rank()), at.config.clone()),
                None => (None, legacy_config(replica)),
            };
            if best.as_ref().is_none_or(|(epoch, _)| candidate.0 > *epoch) {
                best = Some(candidate);
            }
        }
        best.map(|(_, config)| config)
    }
}

/// Whether a replica's log was written before replication: entries, all of epoch zero, and
/// no writer ever took it over (a replicated log always has a configuration).
pub(crate) fn is_legacy(summary: &LogSummary) -> bool {
    summary.config.is_none() && summary.last.seq > 0 && summary.last.epoch == Epoch::ZERO
}

/// The configuration of a log written before replication: the one replica that holds it,
/// version 0.
pub(crate) fn legacy_config(replica: &ReplicaId) -> Configuration {
    Configuration::new(0, vec![replica.clone()])
}
