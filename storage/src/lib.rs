//! tessera-storage: what the journal, the snapshot store and Distributed Data's durable store
//! share about keeping data on disk, so that none of them depends on another.
//!
//! - [`seal`] and [`unseal`]: every stored record is `[checksum][format version][body]`, and
//!   the checksum binds the record's key; [`RecordFormat`] says which checksum (xxh3, or the
//!   keyed BLAKE3 of earlier releases) a version carries.
//! - [`check_store_format`]: a store written by a newer release is refused before it is
//!   opened for writing.
//! - [`Manifest`], [`FsyncPolicy`] and the rule for names ([`name_problem`]), which the stores
//!   use alike.

mod fsync;
mod manifest;
mod names;
mod sealed;
mod store_format;

pub use fsync::FsyncPolicy;
pub use manifest::Manifest;
pub use names::{MAX_NAME_BYTES, name_excerpt, name_problem};
pub use sealed::{
    CHECKSUM_LEN, RecordFormat, SEAL_HEADER_LEN, UnsealError, seal, seal_as_version, seal_in_place,
    unseal,
};
pub use store_format::{FORMAT_VERSION_KEY, StoreFormatError, check_store_format};
