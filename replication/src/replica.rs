//! The replica's rules, as pure functions: given what a replica holds of a log and a request,
//! what it answers and what it must store first (docs/src/design.md §5 "Replication").
//!
//! The rules keep four invariants, which the simulation checks on every seed:
//! - a replica never takes a write (append, seal, install, delete) from an epoch below its
//!   promise, and a promise never goes down;
//! - entries up to `lac` are acknowledged values, never removed but by a delete;
//! - a replica's log is always a prefix of some writer's log (log matching): an append
//!   lands only right after an entry that matches the writer's, and an entry that differs
//!   from the writer's replaces it and everything after it;
//! - a replica holds the configuration of the latest writer it took a write from, tagged
//!   with that writer's epoch: it takes no write of an epoch without that epoch's
//!   configuration.
//!
//! The caller persists the decision's meta and mutations in one synced write before it
//! answers. The RocksDB replica store and the simulation's in-memory store both apply them.
//!
//! Read leases ([`Leases`]) add a fifth rule, which only delays promises and so cannot break
//! the four above: while a lease a replica granted to the writer of epoch `e` runs, it
//! promises no other writer instance an epoch above `e`; a replica that restarted, having
//! forgotten its leases, promises no other writer of a log it holds anything until
//! [`MAX_READ_LEASE`] after it started. A writer whose confirmation round was acknowledged
//! by W replicas therefore knows that no other writer can finish a recovery (which needs
//! promises from a quorum meeting every W) until that lease ends, and may confirm reads from
//! memory until then. That, unlike everything else here, assumes the two processes' monotonic
//! clocks advance at rates within [`LEASE_DRIFT_DIVISOR`]'s margin of each other.

use crate::configuration::Configuration;
use crate::epoch::{Epoch, Position};
use crate::message::{ConfigAt, Entry, LogSummary};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest read lease a replica grants (longer requests are cut to it), and so how long a
/// restarted replica holds off promising a new writer of a log it holds.
pub const MAX_READ_LEASE: Duration = Duration::from_secs(2);

/// A writer counts its lease as ending a `1/LEASE_DRIFT_DIVISOR` part before the replicas do,
/// from the moment it sent the confirmation round (which every replica received later): the
/// margin for monotonic clocks running at different rates.
pub const LEASE_DRIFT_DIVISOR: u32 = 10;

/// How long a writer may count on a lease of `requested` (as the replicas cap it), from when
/// it sent the request.
pub fn writer_lease(requested: Duration) -> Duration {
    let granted = requested.min(MAX_READ_LEASE);
    granted - granted / LEASE_DRIFT_DIVISOR
}

/// One read lease a replica granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The writer's epoch.
    pub epoch: Epoch,
    pub until: Instant,
    /// A writer of this epoch waits for the log, until then: no writer of a lower epoch is
    /// granted a lease meanwhile, so writers that keep reading (or take the log from each
    /// other) cannot keep it from the waiting one for ever.
    pub contest: Option<(Epoch, Instant)>,
}

impl Lease {
    fn contested_above(&self, epoch: Epoch, now: Instant) -> bool {
        self.contest
            .is_some_and(|(contender, until)| now < until && epoch < contender)
    }

    fn contest(&mut self, by: Epoch, now: Instant) {
        let contender = match self.contest {
            Some((earlier, until)) if now < until => earlier.max(by),
            _ => by,
        };
        self.contest = Some((contender, now + 2 * MAX_READ_LEASE));
    }
}

/// The read leases a replica granted, per log, in memory only (a grant writes nothing).
#[derive(Clone, Debug)]
pub struct Leases {
    granted: HashMap<String, Lease>,
    /// Until then the replica promises no writer of a log it holds an epoch above the log's
    /// promise, unless it comes from that promise's own writer instance: before it started,
    /// it may have granted leases it no longer knows.
    restart_wait_until: Instant,
    /// Expired leases are dropped when the map grows to this many.
    prune_at: usize,
}

/// Leases kept before expired ones are dropped.
const MIN_PRUNE_AT: usize = 1_024;

impl Leases {
    /// The leases of a replica that starts at `started`, after `restart_wait` (at least
    /// [`MAX_READ_LEASE`] when a writer in another process may have held a lease from this
    /// replica's previous run; zero only for a store no other process ever served).
    pub fn new(started: Instant, restart_wait: Duration) -> Self {
        Leases {
            granted: HashMap::new(),
            restart_wait_until: started + restart_wait,
            prune_at: MIN_PRUNE_AT,
        }
    }

    /// How much longer a `Prepare(epoch)` of `log`, whose promise here is `promise`, must
    /// wait, if it must. A prepare held off contests the log: for two lease lengths no writer
    /// of a lower epoch is granted a lease on it, so the waiting writer gets it once the
    /// running lease (or the restart wait) ends.
    pub fn holds_off(
        &mut self,
        log: &str,
        promise: Option<Epoch>,
        epoch: Epoch,
        now: Instant,
    ) -> Option<Duration> {
        if let Some(lease) = self.granted.get_mut(log)
            && now < lease.until
            && epoch > lease.epoch
            && epoch.writer != lease.epoch.writer
        {
            lease.contest(epoch, now);
            return Some(lease.until - now);
        }
        match promise {
            Some(promise)
                if now < self.restart_wait_until
                    && promise > Epoch::ZERO
                    && epoch > promise
                    && epoch.writer != promise.writer =>
            {
                // Also against leases granted during the wait, which would outlast it.
                self.granted
                    .entry(log.to_string())
                    .or_insert(Lease {
                        epoch: promise,
                        until: now,
                        contest: None,
                    })
                    .contest(epoch, now);
                Some(self.restart_wait_until - now)
            }
            _ => None,
        }
    }

    /// Grants a lease of `requested` (capped at [`MAX_READ_LEASE`]) to the writer of
    /// `epoch`, whose confirmation this replica just took, unless a writer of a higher epoch
    /// contests the log. Returns the length granted (zero: none).
    pub fn grant(
        &mut self,
        log: &str,
        epoch: Epoch,
        requested: Duration,
        now: Instant,
    ) -> Duration {
        let length = requested.min(MAX_READ_LEASE);
        if length.is_zero() {
            return Duration::ZERO;
        }
        let until = now + length;
        match self.granted.get_mut(log) {
            Some(lease) if lease.contested_above(epoch, now) => return Duration::ZERO,
            Some(lease) if lease.epoch == epoch => {
                lease.until = lease.until.max(until);
                lease.contest = None;
            }
            Some(lease) => {
                *lease = Lease {
                    epoch,
                    until,
                    contest: None,
                }
            }
            None => {
                if self.granted.len() >= self.prune_at {
                    self.granted.retain(|_, lease| {
                        lease.until > now || lease.contest.is_some_and(|(_, c)| c > now)
                    });
                    self.prune_at = (self.granted.len() * 2).max(MIN_PRUNE_AT);
                }
                self.granted.insert(
                    log.to_string(),
                    Lease {
                        epoch,
                        until,
                        contest: None,
                    },
                );
            }
        }
        length
    }
}

/// Everything a replica keeps of a log besides its entries; stored in one record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogMeta {
    /// The highest epoch promised or accepted from.
    pub promise: Epoch,
    /// Acknowledged-up-to mark (entries up to here are committed values).
    pub lac: u64,
    /// The last deleted entry (`Position::START` when nothing was deleted).
    pub base: Position,
    /// The last entry held, or `base`.
    pub last: Position,
    /// The configuration of the latest writer it took a write from (shared: it changes
    /// seldom, and the meta is copied with every write).
    pub config: Option<Arc<ConfigAt>>,
}

impl Default for LogMeta {
    fn default() -> Self {
        LogMeta {
            promise: Epoch::ZERO,
            lac: 0,
            base: Position::START,
            last: Position::START,
            config: None,
        }
    }
}

impl LogMeta {
    /// The highest sequence number known committed here.
    pub fn committed(&self) -> u64 {
        self.lac.max(self.base.seq)
    }

    pub fn summary(&self) -> LogSummary {
        LogSummary {
            promise: self.promise,
            last: self.last,
            lac: self.lac,
            base: self.base,
            config: self.config.clone(),
        }
    }

    /// The summary that goes with `reply`: without the configuration for an append's or a
    /// confirmation's (see [`crate::Response::Appended`]), whole for every other.
    pub fn summary_for(&self, reply: &Reply) -> LogSummary {
        LogSummary {
            config: self.config.clone().filter(|_| reply.summary_has_config()),
            ..self.summary()
        }
    }

    /// [`LogMeta::summary_for`] of a log's state, or an empty summary for a log not held.
    pub fn summary_of(meta: Option<&LogMeta>, reply: &Reply) -> LogSummary {
        meta.map_or_else(|| LogMeta::default().summary(), |m| m.summary_for(reply))
    }

    /// Takes the writer's configuration along with a write of `epoch`; without one, the
    /// replica must already hold that epoch's. Returns false when the write must be refused.
    fn take_config(&mut self, epoch: Epoch, config: Option<Configuration>) -> bool {
        match config {
            Some(config) => {
                let offered = ConfigAt { epoch, config };
                if self
                    .config
                    .as_ref()
                    .is_none_or(|c| c.rank() <= offered.rank())
                {
                    self.config = Some(Arc::new(offered));
                }
                true
            }
            None => self.config.as_ref().is_some_and(|c| c.epoch == epoch),
        }
    }
}

/// Reads the epochs of a log's stored entries.
pub trait EntryEpochs {
    /// The epoch of the entry at `seq`, if the replica holds one.
    fn epoch_at(&self, seq: u64) -> Option<Epoch>;
}

/// A change to a log's entries, applied in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mutation<P> {
    /// Remove every entry at `seq` and above.
    TruncateFrom(u64),
    /// Store an entry (right after the last one).
    Put(Entry<P>),
    /// Keep the entry at `seq` but under `epoch` (a seal).
    Reseal { seq: u64, epoch: Epoch },
    /// Remove every entry at `seq` and below.
    DeleteTo(u64),
}

/// The kind of answer a decision calls for; the caller builds the response from it and the
/// new meta.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Promised: answer with the summary and the entries above `lac`.
    Promised,
    Appended,
    Sealed,
    Installed,
    Deleted,
    /// The request's epoch is below this promise.
    Fenced(Epoch),
    /// The request does not continue this replica's log.
    Mismatch,
    Invalid(String),
    /// A promise that must wait this much longer for a read lease to end.
    Leased(Duration),
    /// A confirmation taken (as an empty append), with the read lease granted for it (zero:
    /// none). The rules never decide this; a store answers it after [`Leases::grant`].
    Confirmed(Duration),
}

impl Reply {
    /// Whether the summary answering this reply carries the log's configuration: every
    /// answer's does but an append's and a confirmation's.
    pub fn summary_has_config(&self) -> bool {
        !matches!(self, Reply::Appended | Reply::Confirmed(_))
    }
}

/// What to store and what to answer.
#[derive(Clone, Debug)]
pub struct Decision<P> {
    /// The log's new meta, when it changed (also for a log first seen).
    pub meta: Option<LogMeta>,
    pub mutations: Vec<Mutation<P>>,
    pub reply: Reply,
}

impl<P> Decision<P> {
    fn answer(reply: Reply) -> Self {
        Decision {
            meta: None,
            mutations: Vec::new(),
            reply,
        }
    }
}

/// Deliberate breakage of the rules, for showing that the simulation's checks catch it.
/// Never set outside tests.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sabotage {
    /// Take writes from epochs below the promise.
    pub accept_lower_epochs: bool,
    /// Answer prepares without raising (or storing) the promise.
    pub no_fence: bool,
    /// Treat a repeated seal as new unless nothing was appended since: it truncates what its
    /// writer appended after it.
    pub reseal_repeats: bool,
    /// Promise new writers whatever read leases run.
    pub ignore_leases: bool,
    /// Promise new writers at once after a restart, as if no lease had been granted before.
    pub no_restart_wait: bool,
}

/// The rules, with optional sabotage (see [`Sabotage`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Rules {
    #[doc(hidden)]
    pub sabotage: Sabotage,
}

impl Rules {
    fn fenced(&self, meta: &LogMeta, epoch: Epoch) -> Option<Reply> {
        (epoch < meta.promise && !self.sabotage.accept_lower_epochs)
            .then_some(Reply::Fenced(meta.promise))
    }

    /// Whether the replica's log holds the writer's entry at `at`: an empty prefix and the
    /// committed prefix always match (their values are the acknowledged ones), otherwise the
    /// epochs must be equal.
    fn holds(meta: &LogMeta, epochs: &impl EntryEpochs, at: Position) -> bool {
        if at.seq <= meta.committed() {
            return true;
        }
        if at.seq > meta.last.seq {
            return false;
        }
        if at.seq == meta.last.seq {
            return meta.last.epoch == at.epoch;
        }
        epochs.epoch_at(at.seq) == Some(at.epoch)
    }

    /// How much longer a `Prepare(epoch)` must wait for the read leases of `leases` (see
    /// [`Leases::holds_off`]), `None` when it may be decided now.
    pub fn held_off(
        &self,
        leases: &mut Leases,
        log: &str,
        meta: Option<&LogMeta>,
        epoch: Epoch,
        now: Instant,
    ) -> Option<Duration> {
        if self.sabotage.ignore_leases {
            return None;
        }
        let promise = if self.sabotage.no_restart_wait {
            None
        } else {
            meta.map(|m| m.promise)
        };
        leases.holds_off(log, promise, epoch, now)
    }

    /// `Prepare(epoch)`: promise it unless a higher one was promised. A repeated prepare of
    /// the promised epoch is answered again (only its own writer uses an epoch).
    pub fn prepare<P>(&self, meta: Option<&LogMeta>, epoch: Epoch) -> Decision<P> {
        let mut meta = meta.cloned().unwrap_or_default();
        if let Some(fenced) = self.fenced(&meta, epoch) {
            return Decision::answer(fenced);
        }
        if self.sabotage.no_fence {
            return Decision::answer(Reply::Promised);
        }
        let changed = epoch > meta.promise;
        meta.promise = meta.promise.max(epoch);
        Decision {
            meta: changed.then_some(meta),
            mutations: Vec::new(),
            reply: Reply::Promised,
        }
    }

    /// `Append`: store the entries that follow `prev` in the writer's log.
    #[allow(clippy::too_many_arguments)]
    pub fn append<P>(
        &self,
        meta: Option<&LogMeta>,
        epochs: &impl EntryEpochs,
        epoch: Epoch,
        prev: Position,
        entries: Vec<Entry<P>>,
        lac: u64,
        config: Option<Configuration>,
    ) -> Decision<P> {
        let before = meta;
        let mut meta = meta.cloned().unwrap_or_default();
        if let Some(fenced) = self.fenced(&meta, epoch) {
            return Decision::answer(fenced);
        }
        if !meta.take_config(epoch, config) {
            return Decision::answer(Reply::Mismatch);
        }
        for (i, entry) in entries.iter().enumerate() {
            if Some(entry.seq) != prev.seq.checked_add(1 + i as u64) {
                return Decision::answer(Reply::Invalid(format!(
                    "entry {} of an append after {prev} has sequence number {}",
                    i, entry.seq
                )));
            }
        }
        if !Self::holds(&meta, epochs, prev) {
            return Decision::answer(Reply::Mismatch);
        }
        let matched_to = prev.seq + entries.len() as u64;
        let committed = meta.committed();
        let mut mutations = Vec::new();
        let mut diverged = false;
        for entry in entries {
            if entry.seq <= committed {
                // An acknowledged value: the writer's is the same.
                continue;
            }
            if !diverged && entry.seq <= meta.last.seq {
                let existing = if entry.seq == meta.last.seq {
                    Some(meta.last.epoch)
                } else {
                    epochs.epoch_at(entry.seq)
                };
                if existing == Some(entry.epoch) {
                    continue;
                }
                if existing == Some(epoch) {
                    // The entry here is this writer's own: the one its seal re-epoched (no
                    // other of its entries has an older twin). The copy is an older message
                    // of the same value, sent before the seal; taking it would undo the seal.
                    continue;
                }
                // A different entry from another writer: the writer's log wins from here.
                mutations.push(Mutation::TruncateFrom(entry.seq));
                diverged = true;
            }
            meta.last = entry.position();
            mutations.push(Mutation::Put(entry));
        }
        meta.promise = meta.promise.max(epoch);
        meta.lac = meta.lac.max(lac.min(matched_to));
        // An append that changes nothing (a probe, a repeat) needs no write.
        let changed = before != Some(&meta);
        Decision {
            meta: changed.then_some(meta),
            mutations,
            reply: Reply::Appended,
        }
    }

    /// `Seal`: the entry at `at` becomes the writer's, under `epoch`, the replica takes the
    /// writer's `config`, and the log ends there.
    pub fn seal<P>(
        &self,
        meta: Option<&LogMeta>,
        epochs: &impl EntryEpochs,
        epoch: Epoch,
        at: Position,
        config: Configuration,
    ) -> Decision<P> {
        let mut meta = meta.cloned().unwrap_or_default();
        if let Some(fenced) = self.fenced(&meta, epoch) {
            return Decision::answer(fenced);
        }
        // Entries of a writer's epoch exist only once its seal took effect somewhere: the
        // sealed entry is re-epoched to it, and everything it appends after carries it. A
        // replica whose last entry has this epoch took the seal or a later write of this
        // writer (a catch-up copy, which does not re-epoch the sealed entry here), and all
        // it holds above the sealed point is this writer's: a copy of them replaced what
        // conflicted. A seal arriving again, late, changes nothing: it must not truncate
        // what the writer appended since, nor be judged against the marks those moved.
        let repeated = if self.sabotage.reseal_repeats {
            at.seq == meta.last.seq && meta.last.epoch == epoch
        } else {
            meta.last.epoch == epoch
        };
        if repeated {
            return Decision::answer(Reply::Sealed);
        }
        if at.seq < meta.lac || at.seq < meta.base.seq {
            // A recovered log always holds every acknowledged entry: sealing below one would
            // drop it. Refused, whatever the writer believes.
            return Decision::answer(Reply::Invalid(format!(
                "a seal at {at} is below this replica's acknowledged mark {} or deleted prefix \
                 {}",
                meta.lac, meta.base
            )));
        }
        let sealed = Position::new(at.seq, epoch);
        if !Self::holds(&meta, epochs, at) {
            return Decision::answer(Reply::Mismatch);
        }
        let mut mutations = Vec::new();
        if meta.last.seq > at.seq {
            mutations.push(Mutation::TruncateFrom(at.seq + 1));
        }
        if at.seq == meta.base.seq {
            // No entry to take over (an empty log, or one deleted up to here).
            meta.base = sealed;
        } else {
            mutations.push(Mutation::Reseal { seq: at.seq, epoch });
        }
        meta.last = sealed;
        meta.take_config(epoch, Some(config));
        meta.promise = meta.promise.max(epoch);
        Decision {
            meta: Some(meta),
            mutations,
            reply: Reply::Sealed,
        }
    }

    /// `Install`: become an empty log whose deleted prefix ends at `base`, unless this replica
    /// already holds the committed log that far.
    pub fn install<P>(
        &self,
        meta: Option<&LogMeta>,
        epoch: Epoch,
        base: Position,
        config: Configuration,
    ) -> Decision<P> {
        let mut meta = meta.cloned().unwrap_or_default();
        if let Some(fenced) = self.fenced(&meta, epoch) {
            return Decision::answer(fenced);
        }
        // A replica holding this writer's own entries through `base` has what the install
        // brings (it is an older message, sent before they were): nothing to replace.
        let holds_writers_log = meta.last.epoch == epoch && base.seq <= meta.last.seq;
        if base.seq <= meta.committed() || holds_writers_log {
            meta.promise = meta.promise.max(epoch);
            meta.take_config(epoch, Some(config));
            return Decision {
                meta: Some(meta),
                mutations: Vec::new(),
                reply: Reply::Installed,
            };
        }
        let mutations = if meta.last.seq > 0 {
            vec![Mutation::TruncateFrom(0)]
        } else {
            Vec::new()
        };
        let meta = LogMeta {
            promise: meta.promise.max(epoch),
            lac: base.seq,
            base,
            last: base,
            config: Some(Arc::new(ConfigAt { epoch, config })),
        };
        Decision {
            meta: Some(meta),
            mutations,
            reply: Reply::Installed,
        }
    }

    /// `DeleteTo`: delete entries up to `to`, never past the acknowledged mark.
    pub fn delete_to<P>(
        &self,
        meta: Option<&LogMeta>,
        epochs: &impl EntryEpochs,
        epoch: Epoch,
        to: u64,
    ) -> Decision<P> {
        let mut meta = meta.cloned().unwrap_or_default();
        if let Some(fenced) = self.fenced(&meta, epoch) {
            return Decision::answer(fenced);
        }
        let to = to.min(meta.lac);
        if to <= meta.base.seq {
            return Decision::answer(Reply::Deleted);
        }
        let base_epoch = if to == meta.last.seq {
            Some(meta.last.epoch)
        } else {
            epochs.epoch_at(to)
        };
        let Some(base_epoch) = base_epoch else {
            return Decision::answer(Reply::Invalid(format!(
                "entry {to} is acknowledged here but missing"
            )));
        };
        meta.base = Position::new(to, base_epoch);
        if meta.last.seq == to {
            meta.last = meta.base;
        }
        meta.promise = meta.promise.max(epoch);
        Decision {
            meta: Some(meta),
            mutations: vec![Mutation::DeleteTo(to)],
            reply: Reply::Deleted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::configuration::ReplicaId;
    use std::collections::BTreeMap;
    use tessera_cluster::Address;

    /// A log in memory, applying decisions the way a store does.
    #[derive(Default)]
    struct Log {
        meta: Option<LogMeta>,
        entries: BTreeMap<u64, Entry<u32>>,
    }

    impl EntryEpochs for Log {
        fn epoch_at(&self, seq: u64) -> Option<Epoch> {
            self.entries.get(&seq).map(|e| e.epoch)
        }
    }

    impl Log {
        fn apply(&mut self, decision: Decision<u32>) -> Reply {
            if let Some(meta) = decision.meta {
                self.meta = Some(meta);
            }
            for mutation in decision.mutations {
                match mutation {
                    Mutation::TruncateFrom(seq) => {
                        self.entries.split_off(&seq);
                    }
                    Mutation::Put(entry) => {
                        self.entries.insert(entry.seq, entry);
                    }
                    Mutation::Reseal { seq, epoch } => {
                        self.entries.get_mut(&seq).unwrap().epoch = epoch;
                    }
                    Mutation::DeleteTo(seq) => {
                        self.entries = self.entries.split_off(&(seq + 1));
                    }
                }
            }
            decision.reply
        }

        fn meta(&self) -> &LogMeta {
            self.meta.as_ref().unwrap()
        }

        fn values(&self) -> Vec<u32> {
            self.entries.values().map(|e| e.payload).collect()
        }
    }

    fn epoch(counter: u64) -> Epoch {
        Epoch {
            counter,
            writer: counter * 10,
        }
    }

    fn entry(seq: u64, e: Epoch, payload: u32) -> Entry<u32> {
        Entry {
            seq,
            epoch: e,
            payload,
        }
    }

    fn config() -> Configuration {
        Configuration::new(1, vec![ReplicaId::new(Address::new("a", 1), 7)])
    }

    const RULES: Rules = Rules {
        sabotage: Sabotage {
            accept_lower_epochs: false,
            no_fence: false,
            reseal_repeats: false,
            ignore_leases: false,
            no_restart_wait: false,
        },
    };

    fn append(
        log: &mut Log,
        e: Epoch,
        prev: Position,
        entries: Vec<Entry<u32>>,
        lac: u64,
    ) -> Reply {
        let decision = RULES.append(
            log.meta.as_ref(),
            log,
            e,
            prev,
            entries,
            lac,
            Some(config()),
        );
        log.apply(decision)
    }

    #[test]
    fn a_promise_fences_lower_epochs_and_never_goes_down() {
        let mut log = Log::default();
        assert_eq!(log.apply(RULES.prepare(None, epoch(2))), Reply::Promised);
        assert_eq!(log.meta().promise, epoch(2));
        assert_eq!(
            log.apply(RULES.prepare(log.meta.as_ref(), epoch(1))),
            Reply::Fenced(epoch(2))
        );
        // The promised epoch itself is answered again.
        assert_eq!(
            log.apply(RULES.prepare(log.meta.as_ref(), epoch(2))),
            Reply::Promised
        );
        assert_eq!(
            append(
                &mut log,
                epoch(1),
                Position::START,
                vec![entry(1, epoch(1), 1)],
                0
            ),
            Reply::Fenced(epoch(2))
        );
        assert!(log.entries.is_empty());
        assert_eq!(
            append(
                &mut log,
                epoch(3),
                Position::START,
                vec![entry(1, epoch(3), 1)],
                0
            ),
            Reply::Appended
        );
        assert_eq!(log.meta().promise, epoch(3), "accepting promises too");
    }

    #[test]
    fn appends_continue_only_a_matching_entry() {
        let mut log = Log::default();
        let e1 = epoch(1);
        append(
            &mut log,
            e1,
            Position::START,
            vec![entry(1, e1, 10), entry(2, e1, 20)],
            0,
        );
        // A gap: the writer believes entry 3 exists.
        assert_eq!(
            append(
                &mut log,
                e1,
                Position::new(3, e1),
                vec![entry(4, e1, 40)],
                0
            ),
            Reply::Mismatch
        );
        // The right epoch at 2 is needed.
        assert_eq!(
            append(
                &mut log,
                e1,
                Position::new(2, epoch(9)),
                vec![entry(3, e1, 30)],
                0
            ),
            Reply::Mismatch
        );
        assert_eq!(
            append(
                &mut log,
                e1,
                Position::new(2, e1),
                vec![entry(3, e1, 30)],
                2
            ),
            Reply::Appended
        );
        assert_eq!(log.values(), vec![10, 20, 30]);
        assert_eq!(log.meta().lac, 2);
        assert_eq!(log.meta().last, Position::new(3, e1));
    }

    #[test]
    fn a_duplicate_append_changes_nothing_and_a_different_entry_truncates() {
        let mut log = Log::default();
        let (e1, e2) = (epoch(1), epoch(2));
        append(
            &mut log,
            e1,
            Position::START,
            vec![entry(1, e1, 1), entry(2, e1, 2), entry(3, e1, 3)],
            1,
        );
        // The same entries again (a late duplicate): nothing is lost.
        assert_eq!(
            append(&mut log, e1, Position::new(1, e1), vec![entry(2, e1, 2)], 1),
            Reply::Appended
        );
        assert_eq!(log.values(), vec![1, 2, 3]);
        // A later writer's entry 2 replaces 2 and drops 3.
        assert_eq!(
            append(
                &mut log,
                e2,
                Position::new(1, e1),
                vec![entry(2, e2, 22)],
                1
            ),
            Reply::Appended
        );
        assert_eq!(log.values(), vec![1, 22]);
        assert_eq!(log.meta().last, Position::new(2, e2));
    }

    #[test]
    fn acknowledged_entries_are_never_replaced() {
        let mut log = Log::default();
        let (e1, e2) = (epoch(1), epoch(2));
        append(
            &mut log,
            e1,
            Position::START,
            vec![entry(1, e1, 1), entry(2, e1, 2)],
            2,
        );
        assert_eq!(log.meta().lac, 2);
        // A writer whose copy of entry 2 carries another epoch (it sealed there): the value
        // is the acknowledged one, kept as it is; the prefix matches by the mark.
        assert_eq!(
            append(
                &mut log,
                e2,
                Position::new(1, e2),
                vec![entry(2, e2, 2), entry(3, e2, 3)],
                2
            ),
            Reply::Appended
        );
        assert_eq!(log.values(), vec![1, 2, 3]);
        // A later writer's seal below the mark is refused.
        let decision = RULES.seal::<u32>(
            log.meta.as_ref(),
            &log,
            epoch(3),
            Position::new(1, e1),
            config(),
        );
        assert!(matches!(log.apply(decision), Reply::Invalid(_)));
        assert_eq!(log.values(), vec![1, 2, 3]);
    }

    #[test]
    fn the_lac_never_passes_what_the_append_matched() {
        let mut log = Log::default();
        let e1 = epoch(1);
        append(&mut log, e1, Position::START, vec![entry(1, e1, 1)], 0);
        // The writer's mark is 5, but this replica only matched up to 1.
        append(&mut log, e1, Position::new(1, e1), vec![], 5);
        assert_eq!(log.meta().lac, 1);
    }

    #[test]
    fn a_seal_takes_over_the_last_entry_and_drops_the_rest() {
        let mut log = Log::default();
        let (e1, e2) = (epoch(1), epoch(2));
        append(
            &mut log,
            e1,
            Position::START,
            vec![entry(1, e1, 1), entry(2, e1, 2), entry(3, e1, 3)],
            1,
        );
        log.apply(RULES.prepare(log.meta.as_ref(), e2));
        let decision =
            RULES.seal::<u32>(log.meta.as_ref(), &log, e2, Position::new(2, e1), config());
        assert_eq!(log.apply(decision), Reply::Sealed);
        assert_eq!(log.values(), vec![1, 2]);
        assert_eq!(log.meta().last, Position::new(2, e2));
        assert_eq!(log.entries[&2].epoch, e2);
        assert_eq!(log.meta().config.as_ref().unwrap().epoch, e2);
        // The same seal again is answered again.
        let decision =
            RULES.seal::<u32>(log.meta.as_ref(), &log, e2, Position::new(2, e1), config());
        assert_eq!(log.apply(decision), Reply::Sealed);
        // A seal of an entry this replica does not hold as the writer does: copy first.
        let mut other = Log::default();
        append(&mut other, e1, Position::START, vec![entry(1, e1, 1)], 0);
        let decision = RULES.seal::<u32>(
            other.meta.as_ref(),
            &other,
            e2,
            Position::new(2, e1),
            config(),
        );
        assert_eq!(other.apply(decision), Reply::Mismatch);
    }

    #[test]
    fn a_repeated_seal_keeps_what_its_writer_appended_since() {
        let mut log = Log::default();
        let (e1, e2) = (epoch(1), epoch(2));
        append(&mut log, e1, Position::START, vec![entry(1, e1, 1)], 0);
        let seal = |log: &Log, rules: &Rules| {
            rules.seal::<u32>(log.meta.as_ref(), log, e2, Position::new(1, e1), config())
        };
        assert_eq!(log.apply(seal(&log, &RULES)), Reply::Sealed);
        let after_seal = Position::new(1, e2);
        append(&mut log, e2, after_seal, vec![entry(2, e2, 2)], 1);
        append(&mut log, e2, Position::new(2, e2), vec![entry(3, e2, 3)], 2);
        // The first seal again, late: nothing changes, and it is not judged against the
        // acknowledged mark the later appends moved.
        assert_eq!(log.apply(seal(&log, &RULES)), Reply::Sealed);
        assert_eq!(log.values(), vec![1, 2, 3]);
        assert_eq!(log.meta().last, Position::new(3, e2));
        // Also once the writer deleted past the sealed entry.
        log.apply(RULES.delete_to::<u32>(log.meta.as_ref(), &log, e2, 2));
        assert_eq!(log.apply(seal(&log, &RULES)), Reply::Sealed);
        assert_eq!(log.values(), vec![3]);
        // A seal of another epoch below the acknowledged mark is refused.
        let other = RULES.seal::<u32>(
            log.meta.as_ref(),
            &log,
            epoch(3),
            Position::new(1, e1),
            config(),
        );
        assert!(matches!(log.apply(other), Reply::Invalid(_)));

        // A replica that missed the seal but got the writer's next entries by a catch-up
        // copy (after its acknowledged prefix, the sealed entry keeping its old epoch here):
        // the late seal leaves them.
        let mut log = Log::default();
        append(&mut log, e1, Position::START, vec![entry(1, e1, 1)], 0);
        append(&mut log, e1, Position::new(1, e1), Vec::new(), 1);
        let copied = Position::new(1, Epoch::ZERO);
        append(&mut log, e2, copied, vec![entry(2, e2, 2)], 1);
        assert_eq!(log.apply(seal(&log, &RULES)), Reply::Sealed);
        assert_eq!(log.values(), vec![1, 2]);

        // Sabotaged, the repeat truncates the writer's appends.
        let sabotaged = Rules {
            sabotage: Sabotage {
                reseal_repeats: true,
                ..Sabotage::default()
            },
        };
        let mut log = Log::default();
        let seal_start = |log: &Log| {
            sabotaged.seal::<u32>(log.meta.as_ref(), log, e2, Position::START, config())
        };
        log.apply(seal_start(&log));
        append(&mut log, e2, Position::new(0, e2), vec![entry(1, e2, 1)], 0);
        log.apply(seal_start(&log));
        assert!(log.values().is_empty());
    }

    #[test]
    fn an_older_copy_or_install_from_the_sealing_writer_does_not_undo_its_seal() {
        let (e1, e2) = (epoch(1), epoch(2));
        let mut log = Log::default();
        append(&mut log, e1, Position::START, vec![entry(1, e1, 1)], 0);
        append(&mut log, e1, Position::new(1, e1), vec![entry(2, e1, 2)], 0);
        let seal = RULES.seal::<u32>(log.meta.as_ref(), &log, e2, Position::new(2, e1), config());
        assert_eq!(log.apply(seal), Reply::Sealed);
        // The copy the writer sent before sealing arrives late, with entry 2's old epoch.
        let copy = vec![entry(1, e1, 1), entry(2, e1, 2)];
        assert_eq!(
            append(&mut log, e2, Position::START, copy, 0),
            Reply::Appended
        );
        assert_eq!(log.meta().last, Position::new(2, e2));
        assert_eq!(log.entries[&2].epoch, e2);
        append(&mut log, e2, Position::new(2, e2), vec![entry(3, e2, 3)], 1);
        // So does an install it sent before: the writer's entries stay.
        let install = RULES.install::<u32>(log.meta.as_ref(), e2, Position::new(2, e1), config());
        assert_eq!(log.apply(install), Reply::Installed);
        assert_eq!(log.values(), vec![1, 2, 3]);
        assert_eq!(log.meta().last, Position::new(3, e2));
    }

    #[test]
    fn sealing_an_empty_log_marks_its_start() {
        let mut log = Log::default();
        let e1 = epoch(1);
        let decision = RULES.seal::<u32>(None, &log, e1, Position::START, config());
        assert_eq!(log.apply(decision), Reply::Sealed);
        assert_eq!(log.meta().last, Position::new(0, e1));
        assert_eq!(log.meta().base, Position::new(0, e1));
        // The next append must follow the sealed start.
        assert_eq!(
            append(&mut log, e1, Position::new(0, e1), vec![entry(1, e1, 1)], 0),
            Reply::Appended
        );
    }

    #[test]
    fn a_write_needs_its_epochs_configuration() {
        let mut log = Log::default();
        let (e1, e2) = (epoch(1), epoch(2));
        append(&mut log, e1, Position::START, vec![entry(1, e1, 1)], 0);
        // Without a configuration, a write of another epoch is refused.
        let decision = RULES.append(
            log.meta.as_ref(),
            &log,
            e2,
            Position::new(1, e1),
            vec![entry(2, e2, 2)],
            0,
            None,
        );
        assert_eq!(log.apply(decision), Reply::Mismatch);
        assert_eq!(log.values(), vec![1]);
        // With its own epoch's configuration held, a write may leave it out.
        let decision = RULES.append(
            log.meta.as_ref(),
            &log,
            e1,
            Position::new(1, e1),
            vec![entry(2, e1, 2)],
            0,
            None,
        );
        assert_eq!(log.apply(decision), Reply::Appended);
        // A later writer's configuration replaces it, tagged with its epoch.
        let other = Configuration::new(2, vec![ReplicaId::new(Address::new("b", 1), 8)]);
        let decision = RULES.append(
            log.meta.as_ref(),
            &log,
            e2,
            Position::new(2, e1),
            vec![],
            0,
            Some(other.clone()),
        );
        assert_eq!(log.apply(decision), Reply::Appended);
        assert_eq!(
            log.meta().config,
            Some(Arc::new(ConfigAt {
                epoch: e2,
                config: other
            }))
        );
    }

    #[test]
    fn deletes_stop_at_the_acknowledged_mark_and_install_replaces_a_lagging_log() {
        let mut log = Log::default();
        let e1 = epoch(1);
        append(
            &mut log,
            e1,
            Position::START,
            (1..=4).map(|s| entry(s, e1, s as u32)).collect(),
            3,
        );
        let decision = RULES.delete_to::<u32>(log.meta.as_ref(), &log, e1, 10);
        assert_eq!(log.apply(decision), Reply::Deleted);
        assert_eq!(log.values(), vec![4]);
        assert_eq!(log.meta().base, Position::new(3, e1));
        // Appending after the deleted prefix still works.
        assert_eq!(
            append(&mut log, e1, Position::new(4, e1), vec![entry(5, e1, 5)], 4),
            Reply::Appended
        );
        let mut lagging = Log::default();
        append(&mut lagging, e1, Position::START, vec![entry(1, e1, 1)], 0);
        let decision =
            RULES.install::<u32>(lagging.meta.as_ref(), e1, Position::new(3, e1), config());
        assert_eq!(lagging.apply(decision), Reply::Installed);
        assert!(lagging.values().is_empty());
        assert_eq!(lagging.meta().committed(), 3);
        assert_eq!(
            append(
                &mut lagging,
                e1,
                Position::new(3, e1),
                vec![entry(4, e1, 4)],
                0
            ),
            Reply::Appended
        );
    }

    #[test]
    fn malformed_appends_are_refused() {
        let mut log = Log::default();
        let e1 = epoch(1);
        let reply = append(&mut log, e1, Position::START, vec![entry(2, e1, 2)], 0);
        assert!(matches!(reply, Reply::Invalid(_)));
        assert!(log.meta.is_none());
    }
}
