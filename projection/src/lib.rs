//! Projections (Akka Projections): a handler that sees every acknowledged event of one entity
//! type, in order per entity, across the cluster, and resumes where it stopped.
//!
//! A projection runs as `instances` instances of a sharded daemon process; instance `i` owns
//! slice range `i` of [`SliceRange::split`](tessera_journal::slice::SliceRange::split) and
//! reads its events by slice from the replicated journal (never one that was not
//! acknowledged, never a gap). Its offset — per log, the sequence number handled last — is
//! kept in a log of its own in the replicated journal ([`offset_log`]), whose one writer is
//! fenced: an instance takes the log over (fencing any writer before it) before it reads its
//! offset, so an instance that lost its slot (a paused process, the far side of a partition)
//! cannot save an offset after its successor started.
//!
//! Delivery is at-least-once — the offset is saved every `save_after_envelopes` envelopes or
//! `save_interval`, and after a restart the events handled since the last save are handled
//! again (never one before it: the query resumes from the offset per log) — or
//! exactly-once ([`exactly_once`]): the handler commits each group's offset with its effect
//! in a store of its own, fenced by the offset log's writer epoch.
//!
//! Layout: [`envelope`] (what a handler gets), [`handler`] (user code and its failures),
//! [`offset_log`] (the fenced offsets), [`instance`] (the run of one instance),
//! [`settings`], [`status`] (what each instance on this node did, for operators),
//! [`control`] (pause, resume and reset, across the cluster).

pub mod control;
pub mod envelope;
pub mod exactly_once;
pub mod handler;
pub mod instance;
pub mod offset_log;
pub mod projection;
pub mod settings;
pub mod status;

pub use control::{ControlError, ControlState, ProjectionControl};
pub use envelope::Envelope;
pub use exactly_once::{ExactlyOnceStore, Fence, InstanceKey, OffsetCommit};
pub use handler::HandlerError;
pub use projection::{NodeServices, Projection, ProjectionRun};
pub use settings::{FailureAction, InvalidProjection, ProjectionSettings};
pub use status::{InstanceStatus, ProjectionStatuses, RunState};

/// The daemon that runs projection `name`'s instances.
pub fn daemon_name_of(name: &str) -> String {
    format!("projection.{name}")
}
