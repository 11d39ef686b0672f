//! What writers and replicas say to each other. Every request names the log; the tokio layer
//! adds the log's id and the expected storage id of the replica around these.

use crate::configuration::Configuration;
use crate::epoch::{Epoch, Position};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// A configuration and the epoch of the writer that stored it on this replica. Every write a
/// replica takes comes with (or after) its writer's configuration, so a replica holding any
/// entry of epoch `e` holds the configuration of epoch `e` or a later one: the configuration
/// with the highest epoch among a quorum's answers is never older than the last committed one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigAt {
    pub epoch: Epoch,
    pub config: Configuration,
}

impl ConfigAt {
    /// The order in which configurations supersede each other: a later writer's, then (one
    /// writer stores its recovery's source configuration, then a joint one, then the settled
    /// one) the higher version.
    pub fn rank(&self) -> (Epoch, u64) {
        (self.epoch, self.config.version)
    }
}

/// What a log's entries carry: anything cloneable whose size is known, so that requests
/// and answers stay within a byte bound.
pub trait Payload: Clone + std::fmt::Debug {
    /// Bytes it takes in a message (an estimate is fine; it bounds message sizes).
    fn size_bytes(&self) -> usize;
}

impl Payload for u64 {
    fn size_bytes(&self) -> usize {
        8
    }
}

/// One entry of a log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry<P> {
    pub seq: u64,
    pub epoch: Epoch,
    pub payload: P,
}

impl<P> Entry<P> {
    pub fn position(&self) -> Position {
        Position::new(self.seq, self.epoch)
    }
}

/// What a replica knows of a log, without its entries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogSummary {
    /// The highest epoch it promised (or accepted from).
    pub promise: Epoch,
    /// Its last entry, or `base` when it holds none.
    pub last: Position,
    /// Entries up to here are acknowledged (it learned so from a writer).
    pub lac: u64,
    /// Entries up to here are deleted; `base` is the last deleted one.
    pub base: Position,
    /// The configuration of the latest writer whose writes it took, if any (shared: it
    /// changes seldom and goes with every summary).
    pub config: Option<Arc<ConfigAt>>,
}

impl LogSummary {
    /// The highest sequence number this replica knows to be committed.
    pub fn committed(&self) -> u64 {
        self.lac.max(self.base.seq)
    }
}

/// A writer's request to one replica about one log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request<P> {
    /// What do you know of this log? Read-only.
    Locate,
    /// Promise `epoch` (fence every lower one) and tell me your tail. Also for a log the
    /// replica has never seen: the promise is stored all the same.
    Prepare { epoch: Epoch },
    /// Store `entries`, which follow the entry at `prev`. `lac` is the writer's
    /// acknowledged-up-to mark. `config` is the writer's configuration; it may be left out
    /// once the replica holds it (a replica refuses a write of an epoch whose configuration
    /// it does not hold).
    Append {
        epoch: Epoch,
        prev: Position,
        entries: Vec<Entry<P>>,
        lac: u64,
        config: Option<Configuration>,
    },
    /// The entry at `at` ends the log this writer recovered: take it over under `epoch`, hold
    /// `config`, and drop everything after it (the barrier of a recovery).
    Seal {
        epoch: Epoch,
        at: Position,
        config: Configuration,
    },
    /// Entries `from..=to`, at most `max_entries` and, beyond the first, at most
    /// `max_bytes` of payload. Read-only.
    Read {
        from: u64,
        to: u64,
        max_entries: u32,
        max_bytes: u32,
    },
    /// Replace whatever you hold with an empty log whose deleted prefix ends at `base`
    /// (entries the writer can no longer copy because they were deleted), under `config`.
    Install {
        epoch: Epoch,
        base: Position,
        config: Configuration,
    },
    /// Delete entries up to `to` (at most up to what you know to be acknowledged).
    DeleteTo { epoch: Epoch, to: u64 },
    /// An empty `Append` of the writer's mark (its log ends at `prev`) that also asks for a
    /// read lease of `lease_ms` (capped at [`crate::replica::MAX_READ_LEASE`]): once the
    /// replica answered `Appended`, it promises no other writer an epoch above `epoch` for
    /// that long, so the writer may confirm reads from memory within its own, shorter, view
    /// of the lease (see [`crate::replica::Leases`]).
    Confirm {
        epoch: Epoch,
        prev: Position,
        lac: u64,
        config: Option<Configuration>,
        lease_ms: u64,
    },
}

impl<P> Request<P> {
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Locate => "Locate",
            Request::Prepare { .. } => "Prepare",
            Request::Append { .. } => "Append",
            Request::Seal { .. } => "Seal",
            Request::Read { .. } => "Read",
            Request::Install { .. } => "Install",
            Request::DeleteTo { .. } => "DeleteTo",
            Request::Confirm { .. } => "Confirm",
        }
    }
}

/// A replica's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response<P> {
    /// To `Locate`: the replica's store id and what it knows (`None`: nothing at all).
    Located {
        storage_id: u64,
        summary: Option<LogSummary>,
    },
    /// To `Prepare`: the promise holds. `tail` are the entries above `summary.lac`, in order;
    /// `tail_complete` is false when they were cut short (read the rest).
    Promised {
        summary: LogSummary,
        tail: Vec<Entry<P>>,
        tail_complete: bool,
    },
    /// To `Append`: stored; the log matches the writer's up to the request's last entry.
    /// The summary leaves the configuration out (`config: None`): the writer that asked holds
    /// it, and it would cost every write the members' addresses on the wire.
    Appended { summary: LogSummary },
    /// To `Seal`.
    Sealed { summary: LogSummary },
    /// To `Read`: the entries found, in order. `summary.base` tells whether the start was
    /// deleted.
    Entries {
        entries: Vec<Entry<P>>,
        summary: LogSummary,
    },
    /// To `Install`.
    Installed { summary: LogSummary },
    /// To `DeleteTo`.
    Deleted { summary: LogSummary },
    /// The request's epoch is below the replica's promise: that writer is fenced.
    Fenced { promise: Epoch },
    /// The entry before the request's entries (or the sealed entry) is not in this replica's
    /// log as the writer has it (copy from `summary.committed() + 1`), or the write came
    /// without a configuration the replica does not hold (send it).
    Mismatch { summary: LogSummary },
    /// The request was malformed (a gap in its entries, a seal beyond the log).
    Invalid { reason: String },
    /// To `Confirm`: the mark is taken, as `Appended` says (and, as there, the summary
    /// leaves the configuration out); the replica also granted a read lease of `lease_ms`
    /// from when it took it (0: none, as when another writer already waits for the log).
    Confirmed { summary: LogSummary, lease_ms: u64 },
    /// To `Prepare`: not yet. This replica leased the log to its current writer for reads
    /// (or restarted less than a lease ago and so cannot know it did not): it promises
    /// another writer nothing for `remaining_ms` more. Ask again then.
    Leased { remaining_ms: u64 },
}

impl<P> Response<P> {
    pub fn kind(&self) -> &'static str {
        match self {
            Response::Located { .. } => "Located",
            Response::Promised { .. } => "Promised",
            Response::Appended { .. } => "Appended",
            Response::Sealed { .. } => "Sealed",
            Response::Entries { .. } => "Entries",
            Response::Installed { .. } => "Installed",
            Response::Deleted { .. } => "Deleted",
            Response::Fenced { .. } => "Fenced",
            Response::Mismatch { .. } => "Mismatch",
            Response::Invalid { .. } => "Invalid",
            Response::Leased { .. } => "Leased",
            Response::Confirmed { .. } => "Confirmed",
        }
    }
}
