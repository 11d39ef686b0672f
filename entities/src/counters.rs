//! The lifecycle counters of a host, written by its partitions and read by
//! [`EntityHost::stats`](crate::EntityHost::stats).

use std::sync::atomic::AtomicU64;

/// Written by the partitions, read by the host.
#[derive(Default)]
pub(crate) struct Counters {
    pub started: AtomicU64,
    pub stopped: AtomicU64,
    /// `Live` slots over all partitions.
    pub active: AtomicU64,
    pub handed_over: AtomicU64,
    pub evicted: AtomicU64,
}
