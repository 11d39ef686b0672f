//! The FUSE filesystem: a passthrough to a backing directory in which a file's data and length
//! change only when the file is fsynced; until then its writes live in an [`Unsynced`]
//! overlay that every reader sees and a power cut throws away. Names (creation, removal,
//! renaming of files and directories) and permissions go to the backing directory at once.

use crate::unsynced::{Backing, Unsynced};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::ffi::{CString, OsStr};
use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The kernel keeps no attribute or name: sizes change under the overlay's rules, and a cut
/// must not be hidden by anything the kernel remembered.
const TTL: Duration = Duration::ZERO;

/// What the filesystem and its [`FaultFs`](crate::FaultFs) handle share.
pub(crate) struct Shared {
    state: Mutex<State>,
}

/// Counters of what the filesystem was asked to do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultFsStats {
    /// Writes of file data (each kept in memory until its file is fsynced).
    pub writes: u64,
    /// fsync and fdatasync calls on files.
    pub fsyncs: u64,
    /// fsync calls on directories.
    pub directory_fsyncs: u64,
}

/// What a power cut threw away.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CutReport {
    /// Files that had writes or length changes not yet fsynced.
    pub files: u64,
    /// Memory those writes held (whole pages).
    pub bytes: u64,
}

struct State {
    backing_root: PathBuf,
    powered: bool,
    /// Inode numbers given to the kernel, and the node each stands for.
    nodes: HashMap<u64, Node>,
    /// The inode number given to each backing file (device, inode) that has a name.
    by_backing: HashMap<(u64, u64), u64>,
    next_ino: u64,
    handles: HashMap<u64, Handle>,
    next_fh: u64,
    /// Writes not yet fsynced, by inode number.
    unsynced: HashMap<u64, Unsynced>,
    /// Memory all of `unsynced` holds, and its bound.
    unsynced_bytes: u64,
    max_unsynced_bytes: u64,
    stats: FaultFsStats,
}

struct Node {
    /// Path below the backing root; `None` once the file was removed (it lives on while it
    /// is open).
    path: Option<PathBuf>,
}

struct Handle {
    ino: u64,
    /// The backing file, always opened for reading and writing: an fsync through a handle
    /// opened read-only must still write the overlay out.
    file: File,
}

impl Shared {
    pub(crate) fn new(backing_root: PathBuf, max_unsynced_bytes: u64) -> io::Result<Arc<Self>> {
        let meta = std::fs::metadata(&backing_root)?;
        if !meta.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a directory", backing_root.display()),
            ));
        }
        let root_key = (meta.dev(), meta.ino());
        let root = u64::from(INodeNo::ROOT);
        let state = State {
            backing_root,
            powered: true,
            nodes: HashMap::from([(
                root,
                Node {
                    path: Some(PathBuf::new()),
                },
            )]),
            by_backing: HashMap::from([(root_key, root)]),
            next_ino: root + 1,
            handles: HashMap::new(),
            next_fh: 1,
            unsynced: HashMap::new(),
            unsynced_bytes: 0,
            max_unsynced_bytes,
            stats: FaultFsStats::default(),
        };
        Ok(Arc::new(Shared {
            state: Mutex::new(state),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The state while the power is on; `None` (answered with EIO) after a cut.
    fn powered(&self) -> Option<MutexGuard<'_, State>> {
        let state = self.lock();
        state.powered.then_some(state)
    }

    /// Cuts the power: every write not yet fsynced is gone, and every later request fails
    /// with EIO.
    pub(crate) fn cut_power(&self) -> CutReport {
        let mut state = self.lock();
        state.powered = false;
        let report = CutReport {
            files: state.unsynced.len() as u64,
            bytes: state.unsynced_bytes,
        };
        state.unsynced.clear();
        state.unsynced_bytes = 0;
        state.handles.clear();
        report
    }

    /// Writes every file's overlay to its backing file, as a clean shutdown would; files
    /// removed meanwhile have nothing to keep.
    pub(crate) fn sync_all(&self) -> io::Result<()> {
        let mut state = self.lock();
        if !state.powered {
            return Ok(());
        }
        let unsynced = std::mem::take(&mut state.unsynced);
        state.unsynced_bytes = 0;
        for (ino, overlay) in unsynced {
            if let Some(path) = state.nodes.get(&ino).and_then(|n| n.path.clone()) {
                let file = OpenOptions::new()
                    .write(true)
                    .open(state.backing_root.join(path))?;
                overlay.sync(&file)?;
            }
        }
        Ok(())
    }

    pub(crate) fn unsynced_bytes(&self) -> u64 {
        self.lock().unsynced_bytes
    }

    pub(crate) fn stats(&self) -> FaultFsStats {
        self.lock().stats
    }
}

impl State {
    fn full_path(&self, relative: &Path) -> PathBuf {
        self.backing_root.join(relative)
    }

    fn path_of(&self, ino: u64) -> Result<PathBuf, Errno> {
        self.nodes
            .get(&ino)
            .and_then(|node| node.path.clone())
            .ok_or(Errno::ENOENT)
    }

    fn child_path(&self, parent: u64, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.path_of(parent)?.join(name))
    }

    /// The inode number of the backing file `meta` found at `path`, given on first sight.
    fn node_for(&mut self, meta: &Metadata, path: PathBuf) -> u64 {
        let key = (meta.dev(), meta.ino());
        if let Some(&ino) = self.by_backing.get(&key)
            && let Some(node) = self.nodes.get_mut(&ino)
        {
            node.path = Some(path);
            return ino;
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.by_backing.insert(key, ino);
        self.nodes.insert(ino, Node { path: Some(path) });
        ino
    }

    /// The attributes of `ino`, whose backing file has `meta`, with the length its readers
    /// see.
    fn attr(&self, ino: u64, meta: &Metadata) -> FileAttr {
        let size = self
            .unsynced
            .get(&ino)
            .map_or(meta.len(), |overlay| overlay.len());
        let kind = FileType::from_std(meta.file_type()).unwrap_or(FileType::RegularFile);
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: time(meta.atime(), meta.atime_nsec()),
            mtime: time(meta.mtime(), meta.mtime_nsec()),
            ctime: time(meta.ctime(), meta.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind,
            perm: (meta.mode() & 0o7777) as u16,
            nlink: meta.nlink() as u32,
            uid: meta.uid(),
            gid: meta.gid(),
            rdev: meta.rdev() as u32,
            blksize: 4096,
            flags: 0,
        }
    }

    /// The metadata of `ino`'s backing file: through `fh` or any open handle, else by name.
    fn metadata(&self, ino: u64, fh: Option<u64>) -> Result<Metadata, Errno> {
        if let Some(handle) = self.handle_of(ino, fh) {
            return handle.file.metadata().map_err(Errno::from);
        }
        std::fs::symlink_metadata(self.full_path(&self.path_of(ino)?)).map_err(Errno::from)
    }

    /// The handle `fh` if it is one of `ino`'s, else any open handle of `ino`.
    fn handle_of(&self, ino: u64, fh: Option<u64>) -> Option<&Handle> {
        fh.and_then(|fh| self.handles.get(&fh))
            .filter(|handle| handle.ino == ino)
            .or_else(|| self.handles.values().find(|handle| handle.ino == ino))
    }

    /// A backing file of `ino` to read and write its content through.
    fn backing_file(&self, ino: u64, fh: Option<u64>) -> Result<File, Errno> {
        if let Some(handle) = self.handle_of(ino, fh) {
            return handle.file.try_clone().map_err(Errno::from);
        }
        open_backing(&self.full_path(&self.path_of(ino)?)).map_err(Errno::from)
    }

    /// Applies `change` to `ino`'s overlay (created over the durable content when missing),
    /// keeping the memory count.
    fn change_unsynced(
        &mut self,
        ino: u64,
        file: &File,
        change: impl FnOnce(&mut Unsynced) -> io::Result<()>,
    ) -> Result<(), Errno> {
        let overlay = match self.unsynced.entry(ino) {
            Entry::Occupied(held) => held.into_mut(),
            Entry::Vacant(new) => {
                let durable_len = Backing::len(file).map_err(Errno::from)?;
                new.insert(Unsynced::new(durable_len))
            }
        };
        let before = overlay.held_bytes();
        let changed = change(overlay);
        let after = overlay.held_bytes();
        self.unsynced_bytes = self.unsynced_bytes - before + after;
        changed.map_err(Errno::from)
    }

    fn drop_unsynced(&mut self, ino: u64) {
        if let Some(overlay) = self.unsynced.remove(&ino) {
            self.unsynced_bytes -= overlay.held_bytes();
        }
    }

    /// The name of the node at `path` is gone (removed, or replaced by a rename): the node
    /// lives on only while it is open, and its backing inode may be reused by a new file.
    fn forget_name(&mut self, key: (u64, u64)) {
        let Some(ino) = self.by_backing.remove(&key) else {
            return;
        };
        if self.handles.values().any(|handle| handle.ino == ino) {
            if let Some(node) = self.nodes.get_mut(&ino) {
                node.path = None;
            }
        } else {
            self.nodes.remove(&ino);
            self.drop_unsynced(ino);
        }
    }

    /// After a rename of `from` to `to`: the node there and, for a directory, every node
    /// below it have their new paths.
    fn renamed(&mut self, from: &Path, to: &Path) {
        for node in self.nodes.values_mut() {
            let Some(path) = &node.path else { continue };
            if let Ok(rest) = path.strip_prefix(from) {
                node.path = Some(to.join(rest));
            }
        }
    }

    fn add_handle(&mut self, ino: u64, file: File) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, Handle { ino, file });
        fh
    }
}

fn time(seconds: i64, nanos: i64) -> SystemTime {
    let nanos = Duration::from_nanos(nanos.clamp(0, 999_999_999) as u64);
    if seconds >= 0 {
        UNIX_EPOCH + Duration::from_secs(seconds as u64) + nanos
    } else {
        UNIX_EPOCH
    }
}

fn open_backing(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
}

fn c_path(path: &Path) -> Result<CString, Errno> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

/// The filesystem the FUSE session serves.
pub(crate) struct FaultFilesystem {
    pub(crate) shared: Arc<Shared>,
}

macro_rules! powered_or {
    ($self:ident, $reply:ident) => {
        match $self.shared.powered() {
            Some(state) => state,
            None => return $reply.error(Errno::EIO),
        }
    };
}

macro_rules! try_or {
    ($result:expr, $reply:ident) => {
        match $result {
            Ok(value) => value,
            Err(errno) => return $reply.error(errno),
        }
    };
}

impl Filesystem for FaultFilesystem {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut state = powered_or!(self, reply);
        let path = try_or!(state.child_path(parent.into(), name), reply);
        let meta = try_or!(
            std::fs::symlink_metadata(state.full_path(&path)).map_err(Errno::from),
            reply
        );
        let ino = state.node_for(&meta, path);
        reply.entry(&TTL, &state.attr(ino, &meta), Generation(0));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let state = powered_or!(self, reply);
        let ino = u64::from(ino);
        let meta = try_or!(state.metadata(ino, fh.map(u64::from)), reply);
        reply.attr(&TTL, &state.attr(ino, &meta));
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut state = powered_or!(self, reply);
        let ino = u64::from(ino);
        let fh = fh.map(u64::from);
        if mode.is_some() || uid.is_some() || gid.is_some() {
            let path = try_or!(state.path_of(ino), reply);
            let full = state.full_path(&path);
            if let Some(mode) = mode {
                let permissions = std::fs::Permissions::from_mode(mode & 0o7777);
                try_or!(
                    std::fs::set_permissions(&full, permissions).map_err(Errno::from),
                    reply
                );
            }
            if uid.is_some() || gid.is_some() {
                try_or!(
                    std::os::unix::fs::lchown(&full, uid, gid).map_err(Errno::from),
                    reply
                );
            }
        }
        if let Some(size) = size {
            let file = try_or!(state.backing_file(ino, fh), reply);
            try_or!(
                state.change_unsynced(ino, &file, |overlay| {
                    overlay.set_len(size);
                    Ok(())
                }),
                reply
            );
        }
        let meta = try_or!(state.metadata(ino, fh), reply);
        reply.attr(&TTL, &state.attr(ino, &meta));
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mut state = powered_or!(self, reply);
        let path = try_or!(state.child_path(parent.into(), name), reply);
        let full = state.full_path(&path);
        try_or!(
            std::fs::DirBuilder::new()
                .mode(mode & !umask & 0o7777)
                .create(&full)
                .map_err(Errno::from),
            reply
        );
        let meta = try_or!(std::fs::symlink_metadata(&full).map_err(Errno::from), reply);
        let ino = state.node_for(&meta, path);
        reply.entry(&TTL, &state.attr(ino, &meta), Generation(0));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut state = powered_or!(self, reply);
        let path = try_or!(state.child_path(parent.into(), name), reply);
        let full = state.full_path(&path);
        let meta = try_or!(std::fs::symlink_metadata(&full).map_err(Errno::from), reply);
        try_or!(std::fs::remove_file(&full).map_err(Errno::from), reply);
        state.forget_name((meta.dev(), meta.ino()));
        reply.ok();
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut state = powered_or!(self, reply);
        let path = try_or!(state.child_path(parent.into(), name), reply);
        let full = state.full_path(&path);
        let meta = try_or!(std::fs::symlink_metadata(&full).map_err(Errno::from), reply);
        try_or!(std::fs::remove_dir(&full).map_err(Errno::from), reply);
        state.forget_name((meta.dev(), meta.ino()));
        reply.ok();
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut state = powered_or!(self, reply);
        if flags.intersects(RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let from = try_or!(state.child_path(parent.into(), name), reply);
        let to = try_or!(state.child_path(newparent.into(), newname), reply);
        let (from_full, to_full) = (state.full_path(&from), state.full_path(&to));
        let replaced = std::fs::symlink_metadata(&to_full).ok();
        let renamed = if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            let (from_c, to_c) = (
                try_or!(c_path(&from_full), reply),
                try_or!(c_path(&to_full), reply),
            );
            // SAFETY: both paths are NUL-terminated strings that outlive the call.
            let result = unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    from_c.as_ptr(),
                    libc::AT_FDCWD,
                    to_c.as_ptr(),
                    libc::RENAME_NOREPLACE,
                )
            };
            if result == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        } else {
            std::fs::rename(&from_full, &to_full)
        };
        try_or!(renamed.map_err(Errno::from), reply);
        if let Some(meta) = replaced {
            state.forget_name((meta.dev(), meta.ino()));
        }
        state.renamed(&from, &to);
        reply.ok();
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut state = powered_or!(self, reply);
        let ino = u64::from(ino);
        let path = try_or!(state.path_of(ino), reply);
        // Truncation (O_TRUNC) reaches the filesystem as a setattr of the size; the backing
        // file is opened without it, for reading and writing whatever was asked.
        let file = try_or!(
            open_backing(&state.full_path(&path)).map_err(Errno::from),
            reply
        );
        let fh = state.add_handle(ino, file);
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut state = powered_or!(self, reply);
        let path = try_or!(state.child_path(parent.into(), name), reply);
        let full = state.full_path(&path);
        let mut options = OpenOptions::new();
        options
            .read(true)
            .write(true)
            .mode(mode & !umask & 0o7777)
            .custom_flags(libc::O_CLOEXEC);
        if flags & libc::O_EXCL != 0 {
            options.create_new(true);
        } else {
            options.create(true);
        }
        let file = try_or!(options.open(&full).map_err(Errno::from), reply);
        let meta = try_or!(file.metadata().map_err(Errno::from), reply);
        let ino = state.node_for(&meta, path);
        if flags & libc::O_TRUNC != 0 {
            try_or!(
                state.change_unsynced(ino, &file, |overlay| {
                    overlay.set_len(0);
                    Ok(())
                }),
                reply
            );
        }
        let attr = state.attr(ino, &meta);
        let fh = state.add_handle(ino, file);
        reply.created(
            &TTL,
            &attr,
            Generation(0),
            FileHandle(fh),
            FopenFlags::empty(),
        );
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let state = powered_or!(self, reply);
        let ino = u64::from(ino);
        let Some(handle) = state.handles.get(&u64::from(fh)) else {
            return reply.error(Errno::EBADF);
        };
        let read = match state.unsynced.get(&ino) {
            Some(overlay) => overlay.read(&handle.file, offset, u64::from(size)),
            None => Backing::len(&handle.file).and_then(|durable_len| {
                Unsynced::new(durable_len).read(&handle.file, offset, u64::from(size))
            }),
        };
        let data = try_or!(read.map_err(Errno::from), reply);
        reply.data(&data);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut state = powered_or!(self, reply);
        let ino = u64::from(ino);
        let file = try_or!(state.backing_file(ino, Some(u64::from(fh))), reply);
        let added = state.unsynced.get(&ino).map_or_else(
            || Unsynced::new(0).pages_added_by_write(offset, data.len() as u64),
            |overlay| overlay.pages_added_by_write(offset, data.len() as u64),
        ) * crate::unsynced::PAGE_BYTES;
        if state.unsynced_bytes + added > state.max_unsynced_bytes {
            return reply.error(Errno::ENOSPC);
        }
        try_or!(
            state.change_unsynced(ino, &file, |overlay| overlay.write(&file, offset, data)),
            reply
        );
        state.stats.writes += 1;
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _state = powered_or!(self, reply);
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut state = powered_or!(self, reply);
        let ino = u64::from(ino);
        state.handles.remove(&u64::from(fh));
        // A removed file is gone with its last handle.
        let removed = state
            .nodes
            .get(&ino)
            .is_some_and(|node| node.path.is_none());
        if removed && !state.handles.values().any(|handle| handle.ino == ino) {
            state.nodes.remove(&ino);
            state.drop_unsynced(ino);
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut state = powered_or!(self, reply);
        let ino = u64::from(ino);
        state.stats.fsyncs += 1;
        let Some(overlay) = state.unsynced.get(&ino) else {
            return reply.ok();
        };
        let file = try_or!(state.backing_file(ino, Some(u64::from(fh))), reply);
        // The backing file itself is not fsynced: the power cut is simulated, and what the
        // backing directory holds is what survives it.
        try_or!(overlay.sync(&file).map_err(Errno::from), reply);
        state.drop_unsynced(ino);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let state = powered_or!(self, reply);
        let _ = try_or!(state.path_of(ino.into()), reply);
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut state = powered_or!(self, reply);
        let ino = u64::from(ino);
        let path = try_or!(state.path_of(ino), reply);
        let full = state.full_path(&path);
        let dir_dev = try_or!(std::fs::metadata(&full).map_err(Errno::from), reply).dev();
        let listing = try_or!(std::fs::read_dir(&full).map_err(Errno::from), reply);
        let mut entries = vec![
            (ino, FileType::Directory, OsStr::new(".").to_os_string()),
            (ino, FileType::Directory, OsStr::new("..").to_os_string()),
        ];
        let mut found = Vec::new();
        for entry in listing {
            let entry = try_or!(entry.map_err(Errno::from), reply);
            let kind = try_or!(entry.file_type().map_err(Errno::from), reply);
            found.push((
                std::os::unix::fs::DirEntryExt::ino(&entry),
                FileType::from_std(kind).unwrap_or(FileType::RegularFile),
                entry.file_name(),
            ));
        }
        found.sort_by(|a, b| a.2.cmp(&b.2));
        for (backing_ino, kind, name) in found {
            let child_ino = match state.by_backing.get(&(dir_dev, backing_ino)) {
                Some(&child) => child,
                None => match std::fs::symlink_metadata(full.join(&name)) {
                    Ok(meta) => state.node_for(&meta, path.join(&name)),
                    // Removed meanwhile (by someone else than the kernel): not listed.
                    Err(_) => continue,
                },
            };
            entries.push((child_ino, kind, name));
        }
        for (index, (child, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), index as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut state = powered_or!(self, reply);
        // Names are durable at once (see the crate's documentation): nothing to do.
        state.stats.directory_fsyncs += 1;
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let state = powered_or!(self, reply);
        let root = try_or!(c_path(&state.backing_root), reply);
        // SAFETY: `root` is a NUL-terminated path; `stats` is written by the call.
        let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(root.as_ptr(), &mut stats) } != 0 {
            return reply.error(Errno::from(io::Error::last_os_error()));
        }
        reply.statfs(
            stats.f_blocks,
            stats.f_bfree,
            stats.f_bavail,
            stats.f_files,
            stats.f_ffree,
            stats.f_bsize as u32,
            stats.f_namemax as u32,
            stats.f_frsize as u32,
        );
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mut state = powered_or!(self, reply);
        let ino = u64::from(ino);
        match mode {
            // Space reserved beyond the end (RocksDB preallocates its logs so): nothing a
            // reader sees changes, and space is not what this filesystem models.
            libc::FALLOC_FL_KEEP_SIZE => reply.ok(),
            0 => {
                let file = try_or!(state.backing_file(ino, Some(u64::from(fh))), reply);
                let end = offset.saturating_add(length);
                try_or!(
                    state.change_unsynced(ino, &file, |overlay| {
                        if end > overlay.len() {
                            overlay.set_len(end);
                        }
                        Ok(())
                    }),
                    reply
                );
                reply.ok();
            }
            _ => reply.error(Errno::from_i32(libc::EOPNOTSUPP)),
        }
    }
}
