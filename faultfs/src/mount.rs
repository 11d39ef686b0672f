//! [`FaultFs`]: a mounted fault filesystem, and the power switch of its "machine".

use crate::filesystem::{CutReport, FaultFilesystem, FaultFsStats, Shared};
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Settings of a [`FaultFs`].
#[derive(Debug, Clone)]
pub struct FaultFsSettings {
    /// Memory the writes not yet fsynced may hold, in whole 4 KiB pages; a write beyond it
    /// fails with ENOSPC.
    pub max_unsynced_bytes: u64,
}

impl Default for FaultFsSettings {
    fn default() -> Self {
        FaultFsSettings {
            max_unsynced_bytes: 1024 * 1024 * 1024,
        }
    }
}

/// Why a [`FaultFs`] could not be mounted.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// This machine cannot mount FUSE filesystems for this process (see
    /// [`FaultFs::unavailable`]).
    #[error("FUSE is unavailable: {0}")]
    Unavailable(String),
    /// The backing directory cannot be used.
    #[error("cannot use {path} as the backing directory: {source}")]
    Backing { path: PathBuf, source: io::Error },
    /// The mount itself failed.
    #[error("cannot mount at {path}: {source}")]
    Mount { path: PathBuf, source: io::Error },
}

/// A FUSE filesystem mounted at a directory, passing through to a backing directory, whose
/// power can be cut: see the crate's documentation for what it models.
///
/// Dropping it unmounts it (as [`FaultFs::unmount`] does, errors ignored).
pub struct FaultFs {
    shared: Arc<Shared>,
    /// The mount, until unmounted.
    unmounter: Option<fuser::SessionUnmounter>,
    /// The thread serving the kernel's requests: it ends when the kernel drops the
    /// connection.
    server: Option<std::thread::JoinHandle<io::Result<()>>>,
    /// The device number of the mount: the FUSE connection's name in the control filesystem.
    device: u64,
    mountpoint: PathBuf,
}

impl FaultFs {
    /// Why this process cannot mount a `FaultFs` here, or `None` when it can: FUSE needs
    /// `/dev/fuse`, and either root (which mounts with mount(2) directly) or the setuid
    /// `fusermount3` helper of Debian's `fuse3` package.
    pub fn unavailable() -> Option<String> {
        if !Path::new("/dev/fuse").exists() {
            return Some("/dev/fuse does not exist (no FUSE in this kernel or container)".into());
        }
        // SAFETY: geteuid has no preconditions and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        if !root && !on_path("fusermount3") && !on_path("fusermount") {
            return Some(
                "not root, and no fusermount3 (Debian's fuse3 package) to mount as a user".into(),
            );
        }
        None
    }

    /// Mounts a `FaultFs` of `backing` at `mountpoint` (an existing, empty directory) with
    /// the default settings.
    pub fn mount(backing: &Path, mountpoint: &Path) -> Result<Self, MountError> {
        Self::mount_with(backing, mountpoint, FaultFsSettings::default())
    }

    /// Mounts a `FaultFs` of `backing` at `mountpoint` with `settings`.
    pub fn mount_with(
        backing: &Path,
        mountpoint: &Path,
        settings: FaultFsSettings,
    ) -> Result<Self, MountError> {
        if let Some(reason) = Self::unavailable() {
            return Err(MountError::Unavailable(reason));
        }
        let backing_error = |source| MountError::Backing {
            path: backing.to_path_buf(),
            source,
        };
        let mount_error = |source| MountError::Mount {
            path: mountpoint.to_path_buf(),
            source,
        };
        let backing_root = backing.canonicalize().map_err(backing_error)?;
        let shared =
            Shared::new(backing_root, settings.max_unsynced_bytes).map_err(backing_error)?;
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("tessera-faultfs".into()),
            fuser::MountOption::DefaultPermissions,
            fuser::MountOption::NoAtime,
        ];
        let filesystem = FaultFilesystem {
            shared: shared.clone(),
        };
        let mut session =
            fuser::Session::new(filesystem, mountpoint, &config).map_err(mount_error)?;
        let unmounter = session.unmount_callable();
        let server = std::thread::Builder::new()
            .name("tessera-faultfs".into())
            .spawn(move || session.run())
            .map_err(mount_error)?;
        let mut fs = FaultFs {
            shared,
            unmounter: Some(unmounter),
            server: Some(server),
            device: 0,
            mountpoint: mountpoint.to_path_buf(),
        };
        // Asked through the mount, so only once its server runs.
        fs.device = std::fs::metadata(mountpoint).map_err(mount_error)?.dev();
        Ok(fs)
    }

    /// Where it is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Cuts the power: every write and length change not yet fsynced is thrown away, at
    /// once, and every later request fails with EIO (what processes still running see is a
    /// dead disk). The backing directory now holds what a machine would find on its disk
    /// after the power came back. Unmount afterwards, once the processes using the mount
    /// are gone.
    pub fn cut_power(&self) -> CutReport {
        self.shared.cut_power()
    }

    /// Memory held by writes not yet fsynced (whole pages).
    pub fn unsynced_bytes(&self) -> u64 {
        self.shared.unsynced_bytes()
    }

    /// What the filesystem was asked to do so far.
    pub fn stats(&self) -> FaultFsStats {
        self.shared.stats()
    }

    /// Unmounts: fails (and detaches the mount lazily, so that it goes once its last user
    /// closes it) while a process uses it. With the power on, what was not yet fsynced is
    /// then written to the backing directory, as a clean shutdown of a machine would; after
    /// [`FaultFs::cut_power`] nothing is left to write.
    pub fn unmount(mut self) -> io::Result<()> {
        self.unmount_now()
    }

    fn unmount_now(&mut self) -> io::Result<()> {
        let Some(mut unmounter) = self.unmounter.take() else {
            return Ok(());
        };
        if let Err(e) = unmounter.unmount() {
            if let Ok(path) = CString::new(self.mountpoint.as_os_str().as_bytes()) {
                // SAFETY: `path` is a NUL-terminated string that outlives the call.
                unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
            }
            self.server.take();
            return Err(e);
        }
        self.stop_server()?;
        self.shared.sync_all()
    }

    /// Waits for the server thread to end. The kernel ends the connection when the last
    /// copy of the mount goes, and a process that made itself a new mount namespace while
    /// this one was mounted (`ip netns exec`, `unshare -m`) holds a copy: then the
    /// connection is aborted through the FUSE control filesystem (that copy fails from then
    /// on). A server that still does not end is an error (its thread is left to end with the
    /// process; it only answers EIO, or nothing).
    fn stop_server(&mut self) -> io::Result<()> {
        let Some(server) = self.server.take() else {
            return Ok(());
        };
        if !ended_within(&server, SERVER_END_WAIT) {
            eprintln!(
                "tessera-faultfs: {} is unmounted but its server did not end within {:?}: \
                 aborting its FUSE connection",
                self.mountpoint.display(),
                SERVER_END_WAIT
            );
            abort_connection(self.device).map_err(|e| {
                io::Error::other(format!(
                    "{} is unmounted, but its FUSE connection lives on (a copy of the mount in \
                     another mount namespace?) and cannot be aborted: {e}",
                    self.mountpoint.display()
                ))
            })?;
            if !ended_within(&server, SERVER_ABORT_WAIT) {
                return Err(io::Error::other(format!(
                    "the server of {} did not end after its connection was aborted",
                    self.mountpoint.display()
                )));
            }
        }
        match server.join() {
            // Reads of an aborted connection fail so (Linux since 4.20): the session is over
            // all the same, whoever aborted it (this unmount, or an abort written to the
            // control filesystem by someone else while the server was still ending).
            Ok(Err(e)) if e.raw_os_error() == Some(libc::ECONNABORTED) => Ok(()),
            Ok(result) => result,
            Err(_) => Err(io::Error::other("the FUSE server thread panicked")),
        }
    }
}

/// How long an unmount waits for the server to end before it aborts the connection (it ends
/// at once unless a copy of the mount lives on elsewhere), and after.
const SERVER_END_WAIT: Duration = Duration::from_millis(500);
const SERVER_ABORT_WAIT: Duration = Duration::from_secs(5);

/// Whether `thread` ended within `wait` (checked every few milliseconds).
fn ended_within<T>(thread: &std::thread::JoinHandle<T>, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    while !thread.is_finished() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// Aborts the FUSE connection of the mount with device number `device` through the FUSE
/// control filesystem (mounted for the purpose, in a fresh directory, when it is not at its
/// usual place): every request waiting on it fails and the server's reads end.
fn abort_connection(device: u64) -> io::Result<()> {
    // The kernel names a connection by its device number in the kernel's encoding.
    let name = (u64::from(libc::major(device)) << 20) | u64::from(libc::minor(device));
    let usual = Path::new("/sys/fs/fuse/connections").join(name.to_string());
    if usual.exists() {
        return std::fs::write(usual.join("abort"), "1");
    }
    let control = std::env::temp_dir().join(format!(
        "tessera-faultfs-control-{}-{name}",
        std::process::id()
    ));
    std::fs::create_dir_all(&control)?;
    let result = (|| {
        let target = CString::new(control.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let fusectl = c"fusectl";
        // SAFETY: every pointer is a NUL-terminated string that outlives the call; no data.
        let mounted = unsafe {
            libc::mount(
                fusectl.as_ptr(),
                target.as_ptr(),
                fusectl.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if mounted != 0 {
            return Err(io::Error::last_os_error());
        }
        let written = std::fs::write(control.join(name.to_string()).join("abort"), "1");
        // SAFETY: as above.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        written
    })();
    let _ = std::fs::remove_dir(&control);
    result
}

impl Drop for FaultFs {
    fn drop(&mut self) {
        let _ = self.unmount_now();
    }
}

/// Whether an executable named `name` is on the PATH.
fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(name).is_file()))
}
