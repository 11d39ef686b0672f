//! tessera-faultfs: a FUSE filesystem that loses every write not yet fsynced when its power
//! is cut, for power-loss tests of the stores (used only by tests).
//!
//! [`FaultFs::mount`] mounts a passthrough of a backing directory. A process using the mount
//! sees an ordinary filesystem; the backing directory holds what a disk would hold after a
//! power cut at that moment. [`FaultFs::cut_power`] makes that moment now: everything not
//! yet durable is gone, and every later request fails with EIO.
//!
//! # What it models
//!
//! - **File data and length are durable only once fsynced.** A `write`, a truncation
//!   (`ftruncate`, `O_TRUNC`) or a size-changing `fallocate` of a file is kept in memory (in
//!   4 KiB pages over the durable content) until an `fsync` or `fdatasync` of that file,
//!   through any of its descriptors, writes the file's pending changes to the backing file.
//!   Readers see the pending changes at once, as with a page cache. A cut throws away every
//!   pending change of every file: a file comes back with the content and length of its
//!   last fsync (a file never fsynced comes back empty, or as it was before this mount).
//!   Writes that are not fsynced are lost **all**, none partially and none kept: the
//!   harshest outcome a disk allows for them, not a torn or reordered subset of them.
//! - **An fsync is all-or-nothing and immediate**: when the call returns, all of the file's
//!   data and length are durable; a cut never tears a file's fsync.
//!
//! # What it does not model
//!
//! - **Names and attributes are durable at once**: creating, removing and renaming files and
//!   directories, and changing permissions or owners, reach the backing directory when the
//!   call is made, as if every directory operation were followed by an fsync of its
//!   directory. A program that forgets to fsync a directory after creating or renaming a
//!   file in it is not caught (on a journaling filesystem such as ext4 a later fsync usually
//!   makes the name durable anyway; POSIX does not promise it). Directory fsyncs are counted
//!   and answered.
//! - Timestamps are not changed through the mount (atime and mtime updates are ignored);
//!   hard links, symbolic links, special files, extended attributes, locks held in the
//!   filesystem (the kernel keeps `flock` and `fcntl` locks locally) and `RENAME_EXCHANGE`
//!   are not offered; `fallocate` only extends or reserves (`FALLOC_FL_KEEP_SIZE`, which
//!   changes nothing a reader sees).
//! - `mmap` writes are not supported (the kernel writes through to the filesystem, no
//!   writeback cache, so writes made with `write` are seen in order).
//! - The backing directory itself is never fsynced: the power cut is simulated, not a crash
//!   of the machine that runs the test.
//!
//! Pending writes are bounded ([`FaultFsSettings::max_unsynced_bytes`], 1 GiB by default):
//! beyond it a write fails with ENOSPC.
//!
//! Mounting needs `/dev/fuse` and root (mount(2) directly, no libfuse); as another user,
//! the `fusermount3` helper of Debian's `fuse3` package. [`FaultFs::unavailable`] says why a
//! machine cannot mount one, so that a test can say it skipped and why.

mod filesystem;
mod mount;
mod unsynced;

pub use filesystem::{CutReport, FaultFsStats};
pub use mount::{FaultFs, FaultFsSettings, MountError};
