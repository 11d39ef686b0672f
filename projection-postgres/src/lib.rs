//! Exactly-once projections into PostgreSQL.
//!
//! An exactly-once projection's handler writes its effect and the group's offset in one
//! transaction: [`commit_offsets`] checks there that the instance still holds its slot and
//! records the offset, so that the effect and the offset are both committed or neither is.
//! [`PostgresOffsets`] is the [`ExactlyOnceStore`] the projection opens each instance's slot
//! with: it takes the slot with the instance's fence and reads the offset back.
//!
//! Two tables, made by [`PostgresOffsets::create_tables`]:
//! - `tessera_projection_fence (projection, slot, counter, writer)`: the fence that holds each
//!   instance's slot. Taking a slot replaces a lower fence and is refused by a higher one.
//! - `tessera_projection_offset (projection, persistence_id, slice, sequence_nr)`: per log,
//!   the sequence number handled last. Keyed by log, not by instance: a log is in one slice,
//!   so in one instance's range.
//!
//! Why no commit lands after a successor started: the successor's fence is higher (it is the
//! epoch of the writer that took the instance's offset log over), and it is written into the
//! slot before the successor reads its offset. A commit locks the slot's row (`FOR UPDATE`)
//! and goes on only if the row still holds its own fence; so a commit of the instance before
//! is either committed before the successor's fence was written — and the successor reads its
//! offset — or sees the successor's fence and is refused, its effect rolled back with it.
//! An instance paused inside its transaction holds the slot's row lock: the pool's sessions
//! end a transaction idle for 5 s, so its successor waits at most that long.
//!
//! Why no group is applied twice: a commit also moves each of the group's logs' offsets
//! forward, and is refused when one does not move — the group was committed already, by a
//! commit whose answer was lost and which the instance retried.

mod offsets;

pub use deadpool_postgres::Pool;
pub use offsets::{CommitError, PostgresOffsets, PostgresOffsetsError, commit_offsets, pool};
pub use tessera_projection::{ExactlyOnceStore, Fence, InstanceKey, OffsetCommit};
/// The client a handler's transactions use, at the version this crate's commits take.
pub use tokio_postgres;
