//! A null FUSE file system: the FUSE ceiling of this machine.
//!
//! One regular file, `data`, of a fixed size, in the root directory. Reads
//! are answered from a buffer in memory, writes are acknowledged and
//! dropped: no network, no disk, no tables. It is mounted exactly as
//! `ferry mount` mounts (direct I/O, 1 MiB requests, the same number of
//! kernel-reader threads), so what it reaches is what any FUSE file system
//! can reach here, and `ferry bench --fuse` reports ferry's mount as a
//! fraction of it.

use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyWrite, Request, SessionACL, TimeOrNow, WriteFlags,
};

use crate::{Mounted, MAX_IO};

/// The one file's name in the root directory.
pub const NULL_FILE: &str = "data";

const FILE_INO: u64 = 2;

/// Serves `data` (`size` bytes) from memory.
pub struct NullFs {
    size: u64,
    /// Attribute and entry lifetime handed to the kernel (zero: every
    /// `stat` is a request, as ferry's mount with caching off).
    ttl: Duration,
    /// Twice the largest request, so any read (at most `MAX_IO` bytes at any
    /// offset) is one contiguous slice of it.
    buf: Vec<u8>,
    uid: u32,
    gid: u32,
}

impl NullFs {
    /// `owner` (uid, gid) owns the root and the file.
    pub fn new(size: u64, ttl: Duration, owner: (u32, u32)) -> NullFs {
        // A pattern rather than zeros, so nothing downstream can take a
        // short cut on zero pages.
        let buf = (0..2 * MAX_IO as usize).map(|i| (i % 251) as u8).collect();
        NullFs { size, ttl, buf, uid: owner.0, gid: owner.1 }
    }

    fn attr(&self, ino: u64) -> FileAttr {
        let dir = ino == INodeNo::ROOT.0;
        FileAttr {
            ino: INodeNo(ino),
            size: if dir { 0 } else { self.size },
            blocks: if dir { 0 } else { self.size.div_ceil(512) },
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind: if dir { FileType::Directory } else { FileType::RegularFile },
            perm: if dir { 0o755 } else { 0o644 },
            nlink: if dir { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: MAX_IO,
            flags: 0,
        }
    }
}

/// Mounts a [`NullFs`] on `mountpoint` the way `ferry mount` mounts (same
/// request size, direct I/O, `threads` readers of /dev/fuse, and the
/// io_uring rings if `ring` and the kernel offers them); unmounted
/// when the session is dropped, and by `fusermount3` if the process dies
/// first and `auto_unmount` is set. The mount point's owner owns the files.
pub fn spawn_null(
    mountpoint: &Path,
    size: u64,
    ttl: Duration,
    threads: usize,
    auto_unmount: bool,
    ring: bool,
) -> io::Result<Mounted> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(mountpoint)?;
    let mut config = Config::default();
    config.mount_options =
        vec![MountOption::FSName("ferry-null".into()), MountOption::Subtype("ferry-null".into()), MountOption::RW];
    // fusermount3 wants an ACL wider than the owner for auto_unmount, as
    // in `crate::spawn`.
    config.acl = if auto_unmount { SessionACL::RootAndOwner } else { SessionACL::Owner };
    if auto_unmount {
        config.mount_options.push(MountOption::AutoUnmount);
    }
    config.n_threads = Some(threads.max(1));
    config.clone_fd = true;
    config.uring = ring;
    fuser::spawn_mount(NullFs::new(size, ttl, (m.uid(), m.gid())), mountpoint, &config).map(Mounted::new)
}

impl Filesystem for NullFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // The same limits and flags `FerryFs::init` asks for.
        if let Err(max) = config.set_max_write(MAX_IO) {
            let _ = config.set_max_write(max);
        }
        if let Err(max) = config.set_max_readahead(MAX_IO) {
            let _ = config.set_max_readahead(max);
        }
        for f in (InitFlags::FUSE_ATOMIC_O_TRUNC | InitFlags::FUSE_PARALLEL_DIROPS).iter() {
            let _ = config.add_capabilities(f);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == INodeNo::ROOT && name == NULL_FILE {
            reply.entry(&self.ttl, &self.attr(FILE_INO), Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match ino.0 {
            1 | FILE_INO => reply.attr(&self.ttl, &self.attr(ino.0)),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
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
        // Nothing changes: the file keeps its size whatever is asked.
        reply.attr(&self.ttl, &self.attr(ino.0));
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino.0 != FILE_INO {
            return reply.error(Errno::EISDIR);
        }
        reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let n = (size.min(MAX_IO) as u64).min(self.size.saturating_sub(offset)) as usize;
        let start = (offset % u64::from(MAX_IO)) as usize;
        reply.data(&self.buf[start..start + n]);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.written(data.len() as u32);
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        reply.ok();
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (INodeNo::ROOT, FileType::Directory, "."),
            (INodeNo::ROOT, FileType::Directory, ".."),
            (INodeNo(FILE_INO), FileType::RegularFile, NULL_FILE),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }
}
