//! The thin `fuser` adapter: translates kernel requests into [`DatasetFs`] calls and its answers
//! (and errors, through [`FsError::errno`]) into replies. No filesystem logic lives here.
//!
//! Shard files of `shards/` are opened in FUSE passthrough mode when the kernel and the process
//! allow it (Linux 6.9+, `CAP_SYS_ADMIN`): the open registers the shard's decompressed cache
//! file with the kernel, which then serves every read of it from that file's page cache without
//! a round trip to this daemon. Everything else, and every open when passthrough is off or
//! refused, reads through [`DatasetFs::read_into`] with the mount's page cache kept across opens.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fuser::{
    AccessFlags, BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::error::FsError;
use crate::fs::{Attr, Backing, DatasetFs, Kind};
use crate::passthrough::{IoModes, Mode};

/// Largest read the kernel is asked to send (and its read-ahead); the kernel's default cap on
/// one request (`fs.fuse.max_pages_limit`, 256 pages) makes more than 1 MiB useless.
const MAX_READ: u32 = 1 << 20;

/// `CAP_SYS_ADMIN`'s bit in `/proc/self/status`'s `CapEff`: the kernel registers backing files
/// only for a server that holds it.
const CAP_SYS_ADMIN: u32 = 21;

thread_local! {
    /// Each serving thread's read buffer, reused: a read costs one copy into it, no allocation.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// What a mount has done, for logs and tests.
#[derive(Debug, Default)]
pub struct MountStats {
    passthrough: AtomicBool,
    passthrough_opens: AtomicU64,
    daemon_reads: AtomicU64,
    open_files: AtomicU64,
}

impl MountStats {
    /// Whether passthrough is in use: negotiated at mount and not refused since.
    pub fn passthrough(&self) -> bool {
        self.passthrough.load(Ordering::Relaxed)
    }

    /// Opens served in passthrough mode so far.
    pub fn passthrough_opens(&self) -> u64 {
        self.passthrough_opens.load(Ordering::Relaxed)
    }

    /// Files open now (the kernel sends the release of a closed file a moment after `close`).
    pub fn open_files(&self) -> u64 {
        self.open_files.load(Ordering::Relaxed)
    }

    /// Read requests the daemon answered so far (passthrough reads never reach it).
    pub fn daemon_reads(&self) -> u64 {
        self.daemon_reads.load(Ordering::Relaxed)
    }
}

/// `DatasetFs` as a `fuser::Filesystem`.
#[derive(Debug)]
pub struct FuseAdapter {
    fs: DatasetFs,
    /// Whether to ask the kernel for passthrough at init.
    want_passthrough: bool,
    /// Whether init negotiated it: from then on every open of a shard goes through `modes`,
    /// even once a refusal has turned new backings off (files may still use old ones).
    negotiated: bool,
    modes: IoModes<BackingId>,
    stats: Arc<MountStats>,
}

impl FuseAdapter {
    /// Wraps the filesystem; `passthrough`: let the kernel read whole cached shards directly
    /// when it can.
    pub fn new(fs: DatasetFs, passthrough: bool) -> Self {
        FuseAdapter {
            fs,
            want_passthrough: passthrough,
            negotiated: false,
            modes: IoModes::default(),
            stats: Arc::new(MountStats::default()),
        }
    }

    /// The mount's figures, shared with the caller.
    pub fn stats(&self) -> Arc<MountStats> {
        Arc::clone(&self.stats)
    }

    /// Registers `file` with the kernel for passthrough; a refusal for lack of privilege turns
    /// passthrough off for the rest of the mount.
    fn register(&self, reply: &ReplyOpen, file: &std::fs::File) -> Option<BackingId> {
        if !self.stats.passthrough() {
            return None;
        }
        match reply.open_backing(file) {
            Ok(id) => Some(id),
            Err(e) => {
                if e.raw_os_error() == Some(libc::EPERM)
                    && self.stats.passthrough.swap(false, Ordering::Relaxed)
                {
                    tracing::warn!(error = %e, "the kernel refused a passthrough backing file; reading through the daemon from now on");
                } else {
                    tracing::debug!(error = %e, "no passthrough for this open");
                }
                None
            }
        }
    }
}

/// Whether this process holds `CAP_SYS_ADMIN` (effective), per `/proc/self/status`.
fn has_cap_sys_admin() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

fn errno(op: &str, e: &FsError) -> Errno {
    if e.is_expected() {
        tracing::debug!(op, error = %e, "fuse request refused");
    } else {
        tracing::warn!(op, error = %e, "fuse request failed");
    }
    Errno::from_i32(e.errno())
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.mtime,
        mtime: a.mtime,
        ctime: a.mtime,
        crtime: a.mtime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: MAX_READ,
        flags: 0,
    }
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::Dir => FileType::Directory,
        Kind::File => FileType::RegularFile,
    }
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // The largest reads and read-ahead the kernel allows, up to MAX_READ: fewer, larger
        // requests for every read that comes to the daemon.
        if let Err(max) = config.set_max_readahead(MAX_READ) {
            let _ = config.set_max_readahead(max);
        }
        if let Err(max) = config.set_max_write(MAX_READ) {
            let _ = config.set_max_write(max);
        }
        let _ = config.add_capabilities(InitFlags::FUSE_MAX_PAGES);
        if self.want_passthrough {
            let enabled = if !has_cap_sys_admin() {
                tracing::info!(
                    "no CAP_SYS_ADMIN: no FUSE passthrough, every read goes through the daemon"
                );
                false
            } else if let Err(missing) = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH) {
                tracing::info!(
                    ?missing,
                    "the kernel offers no FUSE passthrough; every read goes through the daemon"
                );
                false
            } else {
                // 2, the kernel's maximum: the cache folder may itself be on a stacked
                // filesystem (overlayfs in a container).
                if let Err(max) = config.set_max_stack_depth(2) {
                    let _ = config.set_max_stack_depth(max);
                }
                true
            };
            self.negotiated = enabled;
            self.stats.passthrough.store(enabled, Ordering::Relaxed);
        }
        tracing::info!(
            passthrough = self.stats.passthrough(),
            kernel_abi = ?config.kernel_abi(),
            "FUSE session negotiated"
        );
        // Listings carry attributes: `ls -l` / `os.walk` + stat cost one request per page of
        // entries, not one lookup per file.
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.fs.lookup(parent.into(), name) {
            Ok(a) => reply.entry(&self.fs.ttl(), &file_attr(&a), Generation(0)),
            // A negative entry is cached as long as a positive one: names never appear.
            Err(e @ FsError::NotFound { .. }) => {
                let _ = e;
                reply.error(Errno::ENOENT)
            }
            Err(e) => reply.error(errno("lookup", &e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino.into()) {
            Ok(a) => reply.attr(&self.fs.ttl(), &file_attr(&a)),
            Err(e) => reply.error(errno("getattr", &e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(errno("setattr", &self.fs.refuse("setattr")));
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(errno("mknod", &self.fs.refuse("mknod")));
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(errno("mkdir", &self.fs.refuse("mkdir")));
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(errno("unlink", &self.fs.refuse("unlink")));
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(errno("rmdir", &self.fs.refuse("rmdir")));
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        reply.error(errno("symlink", &self.fs.refuse("symlink")));
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(errno("rename", &self.fs.refuse("rename")));
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(errno("link", &self.fs.refuse("link")));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let write = !matches!(flags.acc_mode(), OpenAccMode::O_RDONLY);
        let fh = match self.fs.open(ino.into(), write) {
            Ok(fh) => fh,
            Err(e) => return reply.error(errno("open", &e)),
        };
        self.stats.open_files.fetch_add(1, Ordering::Relaxed);
        if self.negotiated {
            // A shard file is fetched here rather than at its first read: that read would wait
            // for the whole shard anyway, and once it is cached the kernel reads it itself.
            // Every open of a whole shard goes through `modes`, also one that cannot use
            // passthrough now: while it is open, the kernel refuses passthrough for the file.
            let mode = match self.fs.backing_file(fh) {
                Ok(Backing::Never) => None,
                Ok(Backing::NotNow) => Some(self.modes.open(ino.into(), fh, || None)),
                Ok(Backing::File(file)) => Some(
                    self.modes
                        .open(ino.into(), fh, || self.register(&reply, &file)),
                ),
                Err(e) => {
                    self.fs.release(fh);
                    self.stats.open_files.fetch_sub(1, Ordering::Relaxed);
                    return reply.error(errno("open", &e));
                }
            };
            if let Some(Mode::Passthrough(backing)) = mode {
                self.stats.passthrough_opens.fetch_add(1, Ordering::Relaxed);
                return reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &backing);
            }
        }
        // The bytes never change while mounted: keep the page cache across opens.
        reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE)
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.stats.daemon_reads.fetch_add(1, Ordering::Relaxed);
        READ_BUF.with_borrow_mut(|buf| {
            let size = size as usize;
            if buf.len() < size {
                buf.resize(size, 0);
            }
            match self.fs.read_into(fh.into(), offset, &mut buf[..size]) {
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => reply.error(errno("read", &e)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(errno("write", &self.fs.refuse("write")));
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // The backing (if any) goes first: the kernel is done with this open.
        self.modes.release(fh.into());
        self.fs.release(fh.into());
        self.stats.open_files.fetch_sub(1, Ordering::Relaxed);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.getattr(ino.into()) {
            Ok(a) if a.kind == Kind::Dir => reply.opened(
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR,
            ),
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(errno("opendir", &e)),
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
        let listed = self
            .fs
            .readdir(ino.into(), offset, |child, next, kind, name| {
                reply.add(INodeNo(child), next, file_type(kind), name)
            });
        match listed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno("readdir", &e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let ttl = self.fs.ttl();
        let mut added = 0usize;
        let mut failed = None;
        let listed = self
            .fs
            .readdir(ino.into(), offset, |child, next, _kind, name| {
                match self.fs.getattr(child) {
                    Ok(a) => {
                        added += 1;
                        reply.add(
                            INodeNo(child),
                            next,
                            name,
                            &ttl,
                            &file_attr(&a),
                            Generation(0),
                        )
                    }
                    Err(e) => {
                        failed = Some(e);
                        true
                    }
                }
            });
        match (listed, failed) {
            (Err(e), _) => reply.error(errno("readdirplus", &e)),
            // The entries before the failing one go out; the kernel asks again from there.
            (Ok(()), Some(e)) if added == 0 => reply.error(errno("readdirplus", &e)),
            (Ok(()), _) => reply.ok(),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.fs.statfs();
        let bsize = 4096u64;
        reply.statfs(
            s.bytes.div_ceil(bsize),
            0,
            0,
            s.files,
            0,
            bsize as u32,
            s.name_max,
            bsize as u32,
        );
    }

    // ENOSYS, not ENODATA: the kernel then stops asking (no extended attributes exist here), so
    // `ls -l` and other ACL-aware tools cost no round trip per file.
    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(errno("setxattr", &self.fs.refuse("setxattr")));
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(errno("removexattr", &self.fs.refuse("removexattr")));
    }

    fn access(&self, _req: &Request, _ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        if mask.contains(AccessFlags::W_OK) {
            reply.error(errno("access", &self.fs.refuse("write access")));
        } else {
            reply.ok();
        }
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(errno("create", &self.fs.refuse("create")));
    }
}

/// TTL helper kept here so that the adapter and tests agree on it.
pub fn default_ttl() -> Duration {
    crate::fs::FsConfig::default().ttl
}
