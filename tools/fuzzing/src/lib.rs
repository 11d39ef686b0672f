//! The bodies of the fuzz targets in `fuzz/` (cargo-fuzz): one function per target, over
//! every decoder that takes bytes from outside the process — from peers (transport frames,
//! the handshake, cluster, Distributed Data, replica and sharding messages), from disk
//! (journal, snapshot and durable records, stored coordinator state, entity events) and from
//! operators (the config file, Cluster Bootstrap's answers). Not an API.
//!
//! Each body takes any bytes and must return without panicking, within bounded memory. Beyond
//! that it checks what its decoder promises: what decodes encodes back to bytes that decode to
//! the same value, and decoders of the same bytes agree. A few targets go past the decoder
//! into the state machine the messages drive (`cluster_core`, `ddata_replicator`,
//! `replica_requests`, `coordinator_state`, `sharding_machines`), since that is where a hostile message does its
//! harm.
//!
//! [`TARGETS`] lists them with their seeds (valid encodings); `tests/fuzz_targets.rs` runs
//! every body over its seeds and over the crash inputs kept in `fuzz/regressions/<target>/`,
//! and checks that `fuzz/` has a target for each, so the targets cannot rot unnoticed while
//! the normal suite passes.

mod bootstrap;
mod cluster;
mod config;
mod coordinator;
mod ddata;
mod entities;
mod journal;
mod replica;
mod sharding;
mod snapshot;

use std::fmt::Debug;

/// One fuzz target: its name (that of `fuzz/fuzz_targets/<name>.rs`), its body, and the
/// seeds its corpus starts from.
pub struct FuzzTarget {
    pub name: &'static str,
    pub body: fn(&[u8]),
    pub seeds: fn() -> Vec<Vec<u8>>,
}

macro_rules! targets {
    ($($module:ident :: $name:ident),* $(,)?) => {
        $(pub use $module::$name;)*
        /// Every fuzz target, in the order of the list in `fuzz/README.md`.
        pub const TARGETS: &[FuzzTarget] = &[$(FuzzTarget {
            name: stringify!($name),
            body: $module::$name,
            seeds: $module::seeds::$name,
        }),*];
    };
}

targets![
    cluster::transport_frames,
    cluster::transport_handshake,
    cluster::cluster_membership,
    cluster::cluster_heartbeat,
    cluster::cluster_singleton,
    cluster::cluster_core,
    bootstrap::bootstrap_answer,
    ddata::ddata_message,
    ddata::ddata_durable_record,
    ddata::ddata_merge,
    ddata::ddata_replicator,
    journal::journal_record,
    journal::journal_meta,
    snapshot::snapshot_record,
    replica::replica_message,
    replica::replica_requests,
    coordinator::sharding_frame,
    coordinator::coordinator_state,
    sharding::sharding_machines,
    entities::entity_codec,
    config::config_file,
];

/// Splits fuzz input into pieces, each a u16 little-endian length and that many bytes (the
/// last piece takes what is left), for targets that feed a sequence of messages to a state
/// machine. [`chunked`] builds such input.
pub fn chunks(mut data: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        let (length, rest) = data.split_first_chunk::<2>()?;
        let length = usize::from(u16::from_le_bytes(*length)).min(rest.len());
        let (piece, rest) = rest.split_at(length);
        data = rest;
        Some(piece)
    })
}

/// The input [`chunks`] splits into `pieces` (each cut to `u16::MAX` bytes).
pub fn chunked<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in pieces {
        let length = u16::try_from(piece.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&length.to_le_bytes());
        out.extend_from_slice(&piece[..usize::from(length)]);
    }
    out
}

/// Panics unless `value`, which `decode` produced, encodes (by `encode`) to bytes that
/// `decode` turns into an equal value: a message must survive being forwarded or stored
/// again.
fn assert_round_trip<T, E, F>(
    what: &str,
    value: &T,
    encode: impl Fn(&T) -> Result<Vec<u8>, E>,
    decode: impl Fn(&[u8]) -> Result<T, F>,
) where
    T: PartialEq + Debug,
    E: Debug,
    F: Debug,
{
    let bytes = match encode(value) {
        Ok(bytes) => bytes,
        Err(e) => panic!("a decoded {what} does not encode: {e:?}\n{value:?}"),
    };
    match decode(&bytes) {
        Ok(again) if again == *value => {}
        Ok(again) => {
            panic!("a {what} decodes to another value after encoding:\n{value:?}\n{again:?}")
        }
        Err(e) => panic!("a decoded {what} does not decode after encoding: {e:?}\n{value:?}"),
    }
}
