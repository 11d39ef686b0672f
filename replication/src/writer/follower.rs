//! One replica as the writer sees it while copying its log there: how far it is known to
//! match, what it reported committed, and the request it is waiting for.
//!
//! Copying works the same in a recovery (up to the adopted tail) and while serving (up to the
//! last entry): the next entries come from the writer's window of recent entries or, when the
//! window no longer has them, are read from a replica that holds them. A replica whose
//! missing entries were deleted everywhere is installed at the deleted prefix first.

use super::{Ctx, RequestId, Target};
use crate::configuration::{Configuration, ReplicaId};
use crate::epoch::{Epoch, Position};
use crate::message::{Entry, LogSummary, Payload, Request, Response};
use std::collections::BTreeMap;
use std::time::Instant;

/// What the follower waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum FollowerState {
    /// Nothing out.
    Idle,
    /// Not heard from since the writer took over: an empty append asks whether its log
    /// holds the writer's entry at `at`.
    Probing { request: RequestId, at: u64 },
    /// Entries up to `to_seq` are on their way.
    Appending { request: RequestId, to_seq: u64 },
    /// Entries for it are being read from another replica, starting at `from`.
    Reading { request: RequestId, from: u64 },
    /// Being installed at a deleted prefix.
    Installing(RequestId),
    /// The seal of a recovery is on its way.
    Sealing { request: RequestId, at: u64 },
    /// It failed; ask again at this time.
    Backoff(Instant),
    /// Its node has another store: this replica is gone.
    Lost,
}

/// The writer's view of the log for copying.
pub(crate) struct LogView<'a, P> {
    pub epoch: Epoch,
    /// The writer's acknowledged mark, sent along.
    pub lac: u64,
    /// Copy up to here.
    pub target: Position,
    /// Recent entries of the writer's log, by sequence number.
    pub window: &'a BTreeMap<u64, Entry<P>>,
    /// Replicas that hold the writer's log up to `target`, best first.
    pub sources: &'a [ReplicaId],
    /// The writer's configuration, sent with its first write to each replica.
    pub config: &'a Configuration,
}

/// What a follower's answer meant for the writer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Heard {
    /// Nothing the phase must act on.
    Nothing,
    /// It now matches up to `matched` (after an append or a seal).
    Progress,
    /// It sealed at the recovery's seal position.
    Sealed,
    /// A later writer fenced us.
    Fenced(Epoch),
    /// It broke the protocol.
    Invalid(String),
}

#[derive(Clone, Debug)]
pub(crate) struct Follower {
    pub id: ReplicaId,
    /// Its log matches the writer's up to here.
    pub matched: u64,
    /// It reported its log committed up to here (matching too: committed values are the
    /// writer's).
    pub committed: u64,
    /// It took a write of this writer's epoch, so it holds the writer's configuration.
    pub has_config: bool,
    /// Its log is known (from a promise or an answer); an unknown one is probed first.
    pub known: bool,
    pub state: FollowerState,
}

impl Follower {
    /// A follower whose log is unknown: it is probed first.
    pub fn unknown(id: ReplicaId) -> Self {
        Follower {
            id,
            matched: 0,
            committed: 0,
            has_config: false,
            known: false,
            state: FollowerState::Idle,
        }
    }

    /// A follower known from its summary, matching the writer's log up to `matched`.
    pub fn known(id: ReplicaId, summary: &LogSummary, matched: u64) -> Self {
        Follower {
            id,
            matched,
            committed: summary.committed(),
            has_config: false,
            known: true,
            state: FollowerState::Idle,
        }
    }

    pub fn is_idle(&self) -> bool {
        self.state == FollowerState::Idle
    }

    pub fn waits_for(&self, id: RequestId) -> bool {
        match self.state {
            FollowerState::Probing { request: r, .. }
            | FollowerState::Appending { request: r, .. }
            | FollowerState::Reading { request: r, .. }
            | FollowerState::Installing(r)
            | FollowerState::Sealing { request: r, .. } => r == id,
            _ => false,
        }
    }

    /// The configuration to send along, until the replica holds it.
    pub fn config_to_send(&self, view: &LogView<'_, impl Sized>) -> Option<Configuration> {
        (!self.has_config).then(|| view.config.clone())
    }

    /// Asks whether its log ends where the writer's does.
    pub fn probe<P>(&mut self, ctx: &mut Ctx<'_, P>, view: &LogView<'_, P>) {
        let request = ctx.send(
            Target::Replica(self.id.clone()),
            Request::Append {
                epoch: view.epoch,
                prev: view.target,
                entries: Vec::new(),
                lac: view.lac,
                config: self.config_to_send(view),
            },
        );
        self.state = FollowerState::Probing {
            request,
            at: view.target.seq,
        };
    }

    /// Whether [`Follower::copy`] towards `target` has anything to send: only then may it
    /// need the view's sources.
    pub fn is_behind(&self, target: u64) -> bool {
        self.matched.max(self.committed.min(target)) < target
    }

    /// Sends the next piece of the log if it is idle and behind `view.target`. Returns false
    /// when there is nothing to do (it matches up to the target, or it is busy).
    pub fn copy<P: Payload>(&mut self, ctx: &mut Ctx<'_, P>, view: &LogView<'_, P>) -> bool {
        if !self.is_idle() {
            return false;
        }
        let target = view.target.seq;
        let behind = self.is_behind(target);
        self.matched = self.matched.max(self.committed.min(target));
        if !behind {
            return false;
        }
        let next = self.matched + 1;
        let prev_seq = self.matched;
        // The entry before the copy: committed ones match whatever their epoch, others must
        // be named exactly.
        let prev = if prev_seq <= self.committed {
            Some(Position::new(prev_seq, Epoch::ZERO))
        } else {
            view.window.get(&prev_seq).map(|e| e.position())
        };
        let last = target.min(next + ctx.settings.max_entries_per_request as u64 - 1);
        if let Some(prev) = prev {
            let mut bytes = 0;
            let entries: Vec<Entry<P>> = view
                .window
                .range(next..=last)
                .take_while(|(_, e)| {
                    bytes += e.payload.size_bytes();
                    bytes <= ctx.settings.max_bytes_per_request || e.seq == next
                })
                .map(|(_, e)| e.clone())
                .collect();
            let consecutive = entries
                .iter()
                .enumerate()
                .all(|(i, e)| e.seq == next + i as u64);
            if let (true, Some(to_seq)) = (consecutive, entries.last().map(|e| e.seq)) {
                let last = to_seq;
                ctx.counters.entries_copied += entries.len() as u64;
                let request = ctx.send(
                    Target::Replica(self.id.clone()),
                    Request::Append {
                        epoch: view.epoch,
                        prev,
                        entries,
                        lac: view.lac,
                        config: self.config_to_send(view),
                    },
                );
                self.state = FollowerState::Appending {
                    request,
                    to_seq: last,
                };
                return true;
            }
        }
        // Read from a replica that has it, starting at the entry before when its epoch is
        // not known here.
        let Some(source) = view.sources.iter().find(|s| **s != self.id) else {
            self.state = FollowerState::Backoff(ctx.now + ctx.settings.retry_interval);
            return false;
        };
        let from = if prev.is_some() { next } else { prev_seq };
        let request = ctx.send(
            Target::Replica(source.clone()),
            Request::Read {
                from,
                to: last,
                max_entries: ctx.settings.max_entries_per_request as u32 + 1,
                max_bytes: u32::try_from(ctx.settings.max_bytes_per_request).unwrap_or(u32::MAX),
            },
        );
        self.state = FollowerState::Reading { request, from };
        true
    }

    /// Sends the recovery's seal.
    pub fn seal<P>(
        &mut self,
        ctx: &mut Ctx<'_, P>,
        epoch: Epoch,
        at: Position,
        config: &Configuration,
    ) {
        let request = ctx.send(
            Target::Replica(self.id.clone()),
            Request::Seal {
                epoch,
                at,
                config: config.clone(),
            },
        );
        self.state = FollowerState::Sealing {
            request,
            at: at.seq,
        };
    }

    /// Handles the answer to the request it waits for.
    pub fn on_response<P: Payload>(
        &mut self,
        ctx: &mut Ctx<'_, P>,
        view: &LogView<'_, P>,
        response: Response<P>,
    ) -> Heard {
        let state = std::mem::replace(&mut self.state, FollowerState::Idle);
        if matches!(
            response,
            Response::Appended { .. } | Response::Sealed { .. } | Response::Installed { .. }
        ) {
            self.has_config = true;
        }
        if !matches!(response, Response::Entries { .. } | Response::Fenced { .. }) {
            self.known = true;
        }
        match (state, response) {
            (_, Response::Fenced { promise }) => Heard::Fenced(promise),
            (_, Response::Invalid { reason }) => Heard::Invalid(format!("{}: {reason}", self.id)),
            (FollowerState::Probing { at, .. }, Response::Appended { summary }) => {
                // Its log holds the writer's entry at `at` (the last one when the probe left;
                // the log may have grown since).
                self.committed = self.committed.max(summary.committed().min(at));
                self.matched = self.matched.max(at);
                Heard::Progress
            }
            (FollowerState::Appending { to_seq, .. }, Response::Appended { summary }) => {
                self.committed = self.committed.max(summary.committed().min(to_seq));
                self.matched = self.matched.max(to_seq);
                Heard::Progress
            }
            (
                FollowerState::Probing { .. }
                | FollowerState::Appending { .. }
                | FollowerState::Sealing { .. },
                Response::Mismatch { summary },
            ) => {
                // Its log differs after its committed prefix (copy from there), or it lacks
                // the writer's configuration (send it again).
                self.has_config = false;
                self.committed = summary.committed();
                self.matched = self.committed.min(self.matched);
                Heard::Nothing
            }
            (FollowerState::Sealing { at, .. }, Response::Sealed { .. }) => {
                self.matched = self.matched.max(at);
                Heard::Sealed
            }
            (FollowerState::Installing(_), Response::Installed { summary }) => {
                self.committed = summary.committed();
                self.matched = self.committed.min(view.target.seq);
                Heard::Progress
            }
            (FollowerState::Reading { from, .. }, Response::Entries { entries, summary }) => {
                self.copy_read(ctx, view, from, entries, summary)
            }
            (state, other) => {
                // An answer that does not fit the question: treat it as no answer.
                self.state = state;
                Heard::Invalid(format!(
                    "{} answered {} to a request it did not fit",
                    self.id,
                    other.kind()
                ))
            }
        }
    }

    /// Entries read from a source for this follower: send them on, or install it first when
    /// the source deleted what it needs.
    fn copy_read<P: Payload>(
        &mut self,
        ctx: &mut Ctx<'_, P>,
        view: &LogView<'_, P>,
        from: u64,
        entries: Vec<Entry<P>>,
        summary: LogSummary,
    ) -> Heard {
        if summary.promise > view.epoch {
            // The source promised a later writer: what it holds now may be that writer's
            // (its entries, its deleted prefix), which this writer must not hand on.
            return Heard::Fenced(summary.promise);
        }
        let next = self.matched + 1;
        if summary.base.seq >= next {
            // Deleted at the source: what this replica lacks exists only as a prefix.
            let request = ctx.send(
                Target::Replica(self.id.clone()),
                Request::Install {
                    epoch: view.epoch,
                    base: summary.base,
                    config: view.config.clone(),
                },
            );
            self.state = FollowerState::Installing(request);
            return Heard::Nothing;
        }
        let mut entries = entries.into_iter().peekable();
        let prev = if from < next {
            match entries.next() {
                Some(e) if e.seq == from => e.position(),
                _ => {
                    self.state = FollowerState::Backoff(ctx.now + ctx.settings.retry_interval);
                    return Heard::Nothing;
                }
            }
        } else if self.matched <= self.committed {
            Position::new(self.matched, Epoch::ZERO)
        } else {
            match view.window.get(&self.matched) {
                Some(e) => e.position(),
                None => {
                    self.state = FollowerState::Backoff(ctx.now + ctx.settings.retry_interval);
                    return Heard::Nothing;
                }
            }
        };
        let entries: Vec<Entry<P>> = entries.filter(|e| e.seq <= view.target.seq).collect();
        let consecutive = entries
            .iter()
            .enumerate()
            .all(|(i, e)| e.seq == next + i as u64);
        let Some(to_seq) = entries.last().map(|e| e.seq) else {
            // The source does not have them (any more): try again later.
            self.state = FollowerState::Backoff(ctx.now + ctx.settings.retry_interval);
            return Heard::Nothing;
        };
        if !consecutive {
            return Heard::Invalid(format!("a read for {} returned a gap", self.id));
        }
        ctx.counters.entries_copied += entries.len() as u64;
        let request = ctx.send(
            Target::Replica(self.id.clone()),
            Request::Append {
                epoch: view.epoch,
                prev,
                entries,
                lac: view.lac,
                config: self.config_to_send(view),
            },
        );
        self.state = FollowerState::Appending { request, to_seq };
        Heard::Nothing
    }

    /// The request it waited for failed: wait, then carry on.
    pub fn on_failure(&mut self, now: Instant, retry_after: std::time::Duration) {
        self.state = FollowerState::Backoff(now + retry_after);
    }

    /// Ends a backoff that is over. Returns true when it became idle.
    pub fn wake(&mut self, now: Instant) -> bool {
        match self.state {
            FollowerState::Backoff(until) if until <= now => {
                self.state = FollowerState::Idle;
                true
            }
            _ => false,
        }
    }
}
