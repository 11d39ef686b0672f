//! tessera-replication: the fenced quorum protocol behind the replicated journal
//! (docs/src/design.md §5 "Replication"), as plain state machines with no IO.
//!
//! - [`committed_reader`]: reads logs' acknowledged entries from their replicas, in order
//!   and never past a replica's acknowledged mark (the queries by slice).
//! - [`epoch`]: epochs (which writer) and positions (how up to date a log is).
//! - [`configuration`]: replica identities, a log's configuration, quorum sizes.
//! - [`message`]: what writers and replicas say to each other.
//! - [`replica`]: the replica's rules, as pure decisions the stores apply; [`memory`] applies
//!   them to a log in memory.
//! - [`writer`]: the writer of one log: locate, fence, recover, seal, append, copy, move.
//! - [`placement`]: the consistent-hash ring that says where logs should live.
//! - [`sim`]: a deterministic simulation of writers and replicas over a faulty network, with
//!   the safety checks of docs/src/design.md §5 "Checks".
//!
//! The journal's RocksDB replica store applies [`replica`]'s decisions; the tokio layer that
//! runs writers and serves replicas over the cluster transport lives in `tessera-persistence`.

pub mod committed_reader;
pub mod configuration;
pub mod epoch;
pub mod memory;
pub mod message;
pub mod placement;
pub mod replica;
pub mod sim;
pub mod writer;

pub use configuration::{Configuration, QuorumError, Quorums, ReplicaId};
pub use epoch::{Epoch, Position};
pub use message::{ConfigAt, Entry, LogSummary, Payload, Request, Response};
pub use writer::{
    LogWriter, NotApplied, OpId, Outcome, Output, Placement, RequestId, StopReason, Target,
    WriterCounters, WriterSettings, WriterStatus,
};
