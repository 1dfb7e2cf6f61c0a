//! A file system whose power can be cut: a FUSE layer over a folder (the "disk") that keeps
//! every write made since a file's last `fsync`/`fdatasync` in memory only. Cutting the
//! power drops those writes (or, in the harsh mode, lets a torn prefix of them reach the
//! disk), fails every later call with `EIO`, and leaves the folder as the disk would be
//! after a reboot; mounting the folder again is the reboot.
//!
//! The model, and why it is a fair one for SQLite:
//! - File data reaches the disk only through `fsync` or `fdatasync` of that file, in the
//!   order it was written. Reads see every write, synced or not, as a page cache would.
//! - The namespace (create, unlink, rename) is journaled at once, as ext4's journal may
//!   commit a new name before the data it names: a file created and written but never
//!   synced survives a cut, empty. Directory syncs therefore have nothing left to do.
//! - Files are flat in one folder (SQLite's database, `-wal`, `-shm` and journal files).
//! - The `-shm` file is shared-mapped by SQLite: its pages live in the kernel's page cache
//!   (opened with `FOPEN_KEEP_CACHE`, so another process's open does not invalidate a
//!   mapping) and reach this layer as ordinary writes when the kernel writes them back. It
//!   is treated like any file; SQLite rebuilds it from the WAL after a reboot anyway.
//! - POSIX locks are left to the kernel (the layer does not ask to handle them), so the
//!   processes using the mount lock each other as on a local disk.
//!
//! The process that serves the mount must not map its files itself (SQLite maps `-shm`): a
//! page fault on such a mapping holds that process's memory-map lock while it waits for the
//! server, and a server thread that allocates needs the same lock, so both wait forever
//! (seen as a hung test). Tests run SQLite on the mount in child processes, and read the
//! disk folder directly once it is unmounted.

#![allow(dead_code)]

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};

/// How long the kernel may cache names and attributes. Every change goes through the
/// kernel, so its cache is never stale; short anyway, so nothing outlives a remount.
const TTL: Duration = Duration::from_secs(1);

/// The unit a torn write is cut at: a disk sector.
const SECTOR: usize = 512;

/// How a cut treats the writes that were not synced yet.
#[derive(Debug, Clone, Copy)]
pub enum Cut {
    /// All of them are lost.
    DropUnsynced,
    /// A prefix of each file's unsynced writes reaches the disk, in order, the last one
    /// torn at a sector boundary; the rest are lost. `seed` picks the prefixes.
    TornPrefix { seed: u64 },
}

/// One unsynced change to a file.
#[derive(Debug, Clone)]
enum Change {
    Write { offset: u64, bytes: Vec<u8> },
    SetLen(u64),
}

/// A file: what readers see, and the changes the disk has not got yet.
struct Node {
    name: OsString,
    /// False once unlinked (the node is kept while the kernel may still use the inode).
    linked: bool,
    data: Vec<u8>,
    unsynced: Vec<Change>,
}

struct State {
    disk: PathBuf,
    powered: bool,
    nodes: HashMap<u64, Node>,
    names: HashMap<OsString, u64>,
    next_ino: u64,
    syncs: u64,
}

/// The file system served over FUSE (the state is shared with [`Mounted`]).
struct PowerCutFs {
    state: Arc<Mutex<State>>,
}

/// A mounted power-cut file system. Dropping it unmounts.
pub struct Mounted {
    state: Arc<Mutex<State>>,
    session: Option<fuser::BackgroundSession>,
    mountpoint: PathBuf,
}

const ROOT: u64 = 1;

impl Mounted {
    /// Mounts a power-cut layer over `disk` at `mountpoint` (both existing folders).
    pub fn mount(disk: &Path, mountpoint: &Path) -> io::Result<Mounted> {
        let mut nodes = HashMap::new();
        let mut names = HashMap::new();
        let mut next_ino = ROOT + 1;
        for entry in std::fs::read_dir(disk)? {
            let entry = entry?;
            if !entry.file_type()?.is_file() {
                continue;
            }
            let name = entry.file_name();
            names.insert(name.clone(), next_ino);
            nodes.insert(
                next_ino,
                Node {
                    name,
                    linked: true,
                    data: std::fs::read(entry.path())?,
                    unsynced: Vec::new(),
                },
            );
            next_ino += 1;
        }
        let state = Arc::new(Mutex::new(State {
            disk: disk.to_path_buf(),
            powered: true,
            nodes,
            names,
            next_ino,
            syncs: 0,
        }));
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName("powercut".into()),
            MountOption::RW,
            MountOption::NoAtime,
        ];
        config.n_threads = Some(1);
        let session = fuser::spawn_mount(
            PowerCutFs {
                state: state.clone(),
            },
            mountpoint,
            &config,
        )?;
        Ok(Mounted {
            state,
            session: Some(session),
            mountpoint: mountpoint.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// Cuts the power: unsynced writes are dropped (or torn, per `cut`) and every later call
    /// fails with `EIO`. The disk folder is then what a reboot would find.
    pub fn cut(&self, cut: Cut) -> io::Result<()> {
        let mut state = lock(&self.state);
        state.powered = false;
        let disk = state.disk.clone();
        let mut rng = match cut {
            Cut::DropUnsynced => None,
            Cut::TornPrefix { seed } => Some(fastrand::Rng::with_seed(seed)),
        };
        for node in state.nodes.values_mut() {
            let changes = std::mem::take(&mut node.unsynced);
            let Some(rng) = rng.as_mut() else { continue };
            if !node.linked || changes.is_empty() {
                continue;
            }
            let kept = rng.usize(0..=changes.len());
            let file = OpenOptions::new().write(true).open(disk.join(&node.name))?;
            for change in &changes[..kept] {
                apply(&file, change)?;
            }
            if let Some(Change::Write { offset, bytes }) = changes.get(kept) {
                let sectors = bytes.len().div_ceil(SECTOR);
                let torn = (rng.usize(0..=sectors) * SECTOR).min(bytes.len());
                file.write_all_at(&bytes[..torn], *offset)?;
            }
        }
        Ok(())
    }

    /// How many file syncs reached the disk.
    pub fn syncs(&self) -> u64 {
        lock(&self.state).syncs
    }

    /// Unmounts (after a cut, the processes that used it should be gone).
    pub fn unmount(mut self) -> io::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        // A file closed a moment ago may still be released by the kernel: the mount is busy
        // for that moment, so try again for a while (util-linux `umount`).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while is_mounted(&self.mountpoint) && std::time::Instant::now() < deadline {
            let unmounted = std::process::Command::new("umount")
                .arg(&self.mountpoint)
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !unmounted {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        match session.umount_and_join() {
            Ok(()) => Ok(()),
            // The session thread may end with the kernel's "connection aborted" when the
            // unmount cuts a request short; what matters is that the mount is gone.
            Err(_) if !is_mounted(&self.mountpoint) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            let _ = session.umount_and_join();
        }
    }
}

/// Whether `path` is a mount point now (per `/proc/self/mounts`).
fn is_mounted(path: &Path) -> bool {
    // Not the mount point itself: a stat of a mount whose server is gone fails.
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return false;
    };
    let Ok(path) = parent.canonicalize().map(|p| p.join(name)) else {
        return false;
    };
    std::fs::read_to_string("/proc/self/mounts").is_ok_and(|mounts| {
        mounts
            .lines()
            .any(|line| line.split(' ').nth(1) == Some(path.to_string_lossy().as_ref()))
    })
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Answers a call that returns nothing but success or an errno.
fn answer(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn apply(file: &File, change: &Change) -> io::Result<()> {
    match change {
        Change::Write { offset, bytes } => file.write_all_at(bytes, *offset),
        Change::SetLen(len) => file.set_len(*len),
    }
}

fn attr(ino: u64, node: Option<&Node>) -> FileAttr {
    let (kind, perm, size, nlink) = match node {
        None => (FileType::Directory, 0o755, 0, 2),
        Some(n) => (FileType::RegularFile, 0o644, n.data.len() as u64, 1),
    };
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: UNIX_EPOCH,
        mtime: SystemTime::now(),
        ctime: SystemTime::now(),
        crtime: UNIX_EPOCH,
        kind,
        perm,
        nlink,
        uid: 0,
        gid: 0,
        rdev: 0,
        flags: 0,
        blksize: 4096,
    }
}

impl State {
    /// The node behind `ino`, or the errno to answer: `EIO` once the power is off.
    fn node(&mut self, ino: INodeNo) -> Result<&mut Node, Errno> {
        if !self.powered {
            return Err(Errno::EIO);
        }
        self.nodes.get_mut(&ino.0).ok_or(Errno::ENOENT)
    }

    /// The attributes of `ino`: the root folder or a file.
    fn attr_of(&mut self, ino: INodeNo) -> Result<FileAttr, Errno> {
        if ino.0 == ROOT {
            self.powered()?;
            return Ok(attr(ROOT, None));
        }
        let node = self.node(ino)?;
        Ok(attr(ino.0, Some(node)))
    }

    fn powered(&self) -> Result<(), Errno> {
        if self.powered {
            Ok(())
        } else {
            Err(Errno::EIO)
        }
    }

    fn in_root(&self, parent: INodeNo) -> Result<(), Errno> {
        self.powered()?;
        if parent.0 == ROOT {
            Ok(())
        } else {
            Err(Errno::ENOENT)
        }
    }

    /// Writes the file's unsynced changes to the disk and syncs it there.
    fn sync(&mut self, ino: INodeNo) -> Result<(), Errno> {
        let disk = self.disk.clone();
        let node = self.node(ino)?;
        if !node.linked {
            node.unsynced.clear();
            return Ok(());
        }
        let file = OpenOptions::new()
            .write(true)
            .open(disk.join(&node.name))
            .map_err(|_| Errno::EIO)?;
        for change in &node.unsynced {
            apply(&file, change).map_err(|_| Errno::EIO)?;
        }
        file.sync_data().map_err(|_| Errno::EIO)?;
        node.unsynced.clear();
        self.syncs += 1;
        Ok(())
    }
}

impl Filesystem for PowerCutFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let state = lock(&self.state);
        if let Err(e) = state.in_root(parent) {
            return reply.error(e);
        }
        match state.names.get(name).copied() {
            Some(ino) => reply.entry(&TTL, &attr(ino, state.nodes.get(&ino)), Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match lock(&self.state).attr_of(ino) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut state = lock(&self.state);
        if let (Some(len), true) = (size, ino.0 != ROOT) {
            match state.node(ino) {
                Ok(node) => {
                    node.data.resize(len as usize, 0);
                    node.unsynced.push(Change::SetLen(len));
                }
                Err(e) => return reply.error(e),
            }
        }
        match state.attr_of(ino) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match lock(&self.state).node(ino) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match lock(&self.state).node(ino) {
            Ok(node) => {
                let start = (offset as usize).min(node.data.len());
                let end = (start + size as usize).min(node.data.len());
                reply.data(&node.data[start..end])
            }
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match lock(&self.state).node(ino) {
            Ok(node) => {
                let end = offset as usize + data.len();
                if node.data.len() < end {
                    node.data.resize(end, 0);
                }
                node.data[offset as usize..end].copy_from_slice(data);
                node.unsynced.push(Change::Write {
                    offset,
                    bytes: data.to_vec(),
                });
                reply.written(data.len() as u32)
            }
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        answer(reply, lock(&self.state).powered())
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        answer(reply, lock(&self.state).sync(ino))
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // The namespace is journaled as it changes: nothing left to sync.
        answer(reply, lock(&self.state).powered())
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut state = lock(&self.state);
        if let Err(e) = state.in_root(parent) {
            return reply.error(e);
        }
        if let Some(&ino) = state.names.get(name) {
            return reply.created(
                &TTL,
                &attr(ino, state.nodes.get(&ino)),
                Generation(0),
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE,
            );
        }
        if File::create(state.disk.join(name)).is_err() {
            return reply.error(Errno::EIO);
        }
        let ino = state.next_ino;
        state.next_ino += 1;
        state.names.insert(name.to_os_string(), ino);
        state.nodes.insert(
            ino,
            Node {
                name: name.to_os_string(),
                linked: true,
                data: Vec::new(),
                unsynced: Vec::new(),
            },
        );
        reply.created(
            &TTL,
            &attr(ino, state.nodes.get(&ino)),
            Generation(0),
            FileHandle(0),
            FopenFlags::FOPEN_KEEP_CACHE,
        )
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut state = lock(&self.state);
        if let Err(e) = state.in_root(parent) {
            return reply.error(e);
        }
        let Some(ino) = state.names.remove(name) else {
            return reply.error(Errno::ENOENT);
        };
        if let Some(node) = state.nodes.get_mut(&ino) {
            node.linked = false;
            node.unsynced.clear();
        }
        match std::fs::remove_file(state.disk.join(name)) {
            Ok(()) => reply.ok(),
            Err(_) => reply.error(Errno::EIO),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut state = lock(&self.state);
        if let Err(e) = state.in_root(parent).and(state.in_root(newparent)) {
            return reply.error(e);
        }
        let Some(ino) = state.names.remove(name) else {
            return reply.error(Errno::ENOENT);
        };
        if let Some(replaced) = state.names.insert(newname.to_os_string(), ino) {
            if let Some(node) = state.nodes.get_mut(&replaced) {
                node.linked = false;
                node.unsynced.clear();
            }
        }
        if let Some(node) = state.nodes.get_mut(&ino) {
            node.name = newname.to_os_string();
        }
        match std::fs::rename(state.disk.join(name), state.disk.join(newname)) {
            Ok(()) => reply.ok(),
            Err(_) => reply.error(Errno::EIO),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let state = lock(&self.state);
        if let Err(e) = state.in_root(ino) {
            return reply.error(e);
        }
        let mut entries = vec![
            (ROOT, FileType::Directory, OsString::from(".")),
            (ROOT, FileType::Directory, OsString::from("..")),
        ];
        let mut files: Vec<_> = state.names.iter().collect();
        files.sort();
        entries.extend(
            files
                .into_iter()
                .map(|(name, &ino)| (ino, FileType::RegularFile, name.clone())),
        );
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), (i + 1) as u64, kind, &name) {
                break;
            }
        }
        reply.ok()
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 20, 1 << 19, 1 << 19, 1 << 16, 1 << 15, 4096, 255, 4096)
    }
}
