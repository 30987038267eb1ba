//! ORFA's in-memory file system: a tree of inodes that lives only as long as
//! the server process, with the semantics (and errno values) of a Linux file
//! system used by root, so a client cannot tell it from a real export except
//! by its persistence.
//!
//! Locking: one namespace lock (`ns`) orders every change to the tree
//! (names, parents, link counts) against path walks; each inode has its own
//! mutex for its contents. Path operations take `ns` first, then lock inodes
//! one at a time, never two at once; operations on an open file take only
//! that file's inode lock. So reads and writes on different files run in
//! parallel, and no lock order can cycle.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use ferry_proto::{Attr, DirEntry, StatFs, Time, UTIME_NOW, UTIME_OMIT};

use crate::backend::{Backend, Errno, Node, ReadData, Result};

mod data;
mod names;
use data::FileData;

/// Reported as `st_dev` and `f_fsid`; any constant works since the tree is
/// one file system.
const DEV: u64 = 0x6665_7279;
const BLOCK: u64 = 4096;
/// File data lives in chunks of this size, so a write far past the end of a
/// file (or a truncate that extends it) costs nothing for the hole.
const CHUNK: u64 = 64 * 1024;
/// Bytes of file data and xattrs the tree may hold before writes fail with
/// `ENOSPC`, so a client cannot exhaust the server's memory.
const BUDGET: u64 = 8 << 30;
/// Inodes the tree may hold, for the same reason.
const MAX_INODES: u64 = 1 << 22;
/// Linux `MAXSYMLINKS`: a path may follow at most this many symlinks.
const MAX_SYMLINKS: u32 = 40;
const NAME_MAX: usize = 255;
/// Linux rejects a symlink target whose length, with its NUL, exceeds
/// `PATH_MAX`. Paths from the export root may be longer (see
/// `ferry_proto::MAX_PATH`): the tree is walked one name at a time.
const PATH_MAX: usize = 4096;
const XATTR_NAME_MAX: usize = 255;
const XATTR_SIZE_MAX: usize = 65536;
const XATTR_PREFIXES: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];
/// Largest file size and offset, as on tmpfs (`MAX_LFS_FILESIZE`).
const MAX_FILE_SIZE: u64 = i64::MAX as u64;
/// Linux caps one read at this many bytes (`MAX_RW_COUNT`).
const MAX_RW_COUNT: usize = 0x7fff_f000;
/// What ext4 reports as the size of a small directory.
const DIR_SIZE: u64 = 4096;
/// Readdir cookies of `.` and `..`; real entries count on from `FIRST_SEQ`.
const COOKIE_DOT: u64 = 1;
const COOKIE_DOTDOT: u64 = 2;
const FIRST_SEQ: u64 = 3;
/// Relatime refreshes an access time at least this often.
const RELATIME_SECS: i64 = 24 * 60 * 60;

const EBUSY: Errno = Errno(libc::EBUSY);
const E2BIG: Errno = Errno(libc::E2BIG);

const RENAME_NOREPLACE: u32 = 1;
const RENAME_EXCHANGE: u32 = 2;
const XATTR_CREATE: u32 = 1;
const XATTR_REPLACE: u32 = 2;

const O_ACCMODE: u32 = libc::O_ACCMODE as u32;
const O_RDONLY: u32 = libc::O_RDONLY as u32;
const O_WRONLY: u32 = libc::O_WRONLY as u32;
const O_RDWR: u32 = libc::O_RDWR as u32;
const O_CREAT: u32 = libc::O_CREAT as u32;
const O_EXCL: u32 = libc::O_EXCL as u32;
const O_TRUNC: u32 = libc::O_TRUNC as u32;
const O_APPEND: u32 = libc::O_APPEND as u32;
const O_DIRECTORY: u32 = libc::O_DIRECTORY as u32;
const O_NOFOLLOW: u32 = libc::O_NOFOLLOW as u32;
const O_NOATIME: u32 = libc::O_NOATIME as u32;

const S_IFREG: u32 = libc::S_IFREG;
const S_IFDIR: u32 = libc::S_IFDIR;
const S_IFLNK: u32 = libc::S_IFLNK;
const S_ISUID: u32 = libc::S_ISUID;
const S_ISGID: u32 = libc::S_ISGID;
const S_IXGRP: u32 = libc::S_IXGRP;
const PERM_MASK: u32 = 0o7777;
/// `mkdir` keeps only these bits of its mode, as Linux's `vfs_mkdir` does.
const MKDIR_MASK: u32 = 0o1777;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not take the whole file system down with it; the
    // state behind the lock is still structurally valid.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn now() -> Time {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => Time { sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX), nsec: d.subsec_nanos() },
        Err(e) => {
            let d = e.duration();
            let sec = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            match d.subsec_nanos() {
                0 => Time { sec: -sec, nsec: 0 },
                n => Time { sec: -sec - 1, nsec: 1_000_000_000 - n },
            }
        }
    }
}

fn time_key(t: Time) -> (i64, u32) {
    (t.sec, t.nsec)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum FType {
    Reg,
    Dir,
    Lnk,
    /// FIFO, socket or device node: only a name and attributes here.
    Special,
}

/// Counters shared by the backend and every inode, so an inode can give its
/// bytes back when the last reference to it goes away.
struct Shared {
    bytes: AtomicU64,
    inodes: AtomicU64,
    next_ino: AtomicU64,
}

impl Shared {
    fn charge(&self, n: u64) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| cur.checked_add(n).filter(|&t| t <= BUDGET))
            .map(|_| ())
            .map_err(|_| Errno::NOSPC)
    }

    fn refund(&self, n: u64) {
        if n != 0 {
            let _ = self.bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| Some(cur.saturating_sub(n)));
        }
    }

    fn take_inode(&self) -> Result<u64> {
        self.inodes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| Some(cur + 1).filter(|&t| t <= MAX_INODES))
            .map_err(|_| Errno::NOSPC)?;
        Ok(self.next_ino.fetch_add(1, Ordering::Relaxed))
    }
}

struct Inode {
    ino: u64,
    /// Fixed at creation, so path walks can test it without the lock.
    ftype: FType,
    shared: Arc<Shared>,
    st: Mutex<State>,
}

struct State {
    /// Permission bits only (`0o7777`); the type comes from `ftype`.
    perm: u32,
    nlink: u64,
    uid: u32,
    gid: u32,
    atime: Time,
    mtime: Time,
    ctime: Time,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    content: Content,
}

enum Content {
    File(FileData),
    Dir(DirData),
    Symlink(Vec<u8>),
    /// `S_IF*` type bits and device number of a node made by `mknod`.
    Special {
        ifmt: u32,
        rdev: u64,
    },
}

struct DirData {
    /// For `..`; weak so the tree has no reference cycles. The root's is
    /// empty, which makes `..` at the root the root itself.
    parent: Weak<Inode>,
    names: HashMap<Vec<u8>, u64>,
    /// Entries by insertion sequence number, which is also their readdir
    /// cookie: a cookie stays valid however the directory changes.
    entries: BTreeMap<u64, Entry>,
    next_seq: u64,
}

struct Entry {
    name: Vec<u8>,
    inode: Arc<Inode>,
}

enum NewKind {
    File,
    Dir,
    Symlink(Vec<u8>),
    Special { ifmt: u32, rdev: u64 },
}

/// The last component of a path, which creating and removing calls treat
/// specially (Linux's `LAST_NORM`, `LAST_DOT`, `LAST_DOTDOT`, `LAST_ROOT`).
enum Last<'a> {
    Root,
    Dot,
    DotDot,
    Name(&'a [u8]),
}

impl Inode {
    fn st(&self) -> MutexGuard<'_, State> {
        lock(&self.st)
    }

    fn attr_of(&self, st: &State) -> Attr {
        let (kind, size) = match &st.content {
            Content::File(f) => (S_IFREG, f.size),
            // A removed directory is empty on disk, and ext4 says so.
            Content::Dir(_) => (S_IFDIR, if st.nlink == 0 { 0 } else { DIR_SIZE }),
            Content::Symlink(t) => (S_IFLNK, t.len() as u64),
            Content::Special { ifmt, .. } => (*ifmt, 0),
        };
        let rdev = match &st.content {
            Content::Special { rdev, .. } => *rdev,
            _ => 0,
        };
        Attr {
            dev: DEV,
            ino: self.ino,
            mode: kind | st.perm,
            nlink: st.nlink,
            uid: st.uid,
            gid: st.gid,
            rdev,
            size,
            blksize: BLOCK as u32,
            // Symlink targets live in the inode, as ext4's fast symlinks do.
            blocks: if self.ftype == FType::Lnk { 0 } else { size.div_ceil(512) },
            atime: st.atime,
            mtime: st.mtime,
            ctime: st.ctime,
        }
    }

    fn attr(&self) -> Attr {
        self.attr_of(&self.st())
    }

    fn target(&self) -> Vec<u8> {
        match &self.st().content {
            Content::Symlink(t) => t.clone(),
            _ => Vec::new(),
        }
    }
}

impl State {
    /// Linux's default `relatime`: refresh the access time only when it is
    /// older than the last change or a day old.
    fn touch_atime(&mut self, now: Time) {
        let a = time_key(self.atime);
        if a <= time_key(self.mtime)
            || a <= time_key(self.ctime)
            || now.sec.saturating_sub(self.atime.sec) >= RELATIME_SECS
        {
            self.atime = now;
        }
    }

    fn dir(&self) -> Option<&DirData> {
        match &self.content {
            Content::Dir(d) => Some(d),
            _ => None,
        }
    }

    fn dir_mut(&mut self) -> Option<&mut DirData> {
        match &mut self.content {
            Content::Dir(d) => Some(d),
            _ => None,
        }
    }
}

fn xattr_bytes(x: &BTreeMap<Vec<u8>, Vec<u8>>) -> u64 {
    x.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum()
}

impl Drop for Inode {
    fn drop(&mut self) {
        let st = self.st.get_mut().unwrap_or_else(PoisonError::into_inner);
        let mut bytes = xattr_bytes(&st.xattrs);
        let mut orphans: Vec<Arc<Inode>> = Vec::new();
        match &mut st.content {
            Content::File(f) => bytes += f.allocated(),
            Content::Dir(d) => orphans.extend(std::mem::take(&mut d.entries).into_values().map(|e| e.inode)),
            Content::Symlink(_) | Content::Special { .. } => {}
        }
        self.shared.refund(bytes);
        let _ = self.shared.inodes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| Some(c.saturating_sub(1)));
        // Only the tree going away drops a non-empty directory. Take its
        // subtree apart here, iteratively, so a deep tree cannot overflow the
        // stack through nested drops.
        while let Some(child) = orphans.pop() {
            if let Ok(mut inode) = Arc::try_unwrap(child) {
                let st = inode.st.get_mut().unwrap_or_else(PoisonError::into_inner);
                if let Content::Dir(d) = &mut st.content {
                    orphans.extend(std::mem::take(&mut d.entries).into_values().map(|e| e.inode));
                }
            }
        }
    }
}

impl DirData {
    fn new(parent: Weak<Inode>) -> DirData {
        DirData { parent, names: HashMap::new(), entries: BTreeMap::new(), next_seq: FIRST_SEQ }
    }

    fn get(&self, name: &[u8]) -> Option<&Arc<Inode>> {
        self.names.get(name).and_then(|seq| self.entries.get(seq)).map(|e| &e.inode)
    }

    fn insert(&mut self, name: &[u8], inode: Arc<Inode>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.names.insert(name.to_owned(), seq);
        self.entries.insert(seq, Entry { name: name.to_owned(), inode });
    }

    fn remove(&mut self, name: &[u8]) -> Option<Arc<Inode>> {
        let seq = self.names.remove(name)?;
        self.entries.remove(&seq).map(|e| e.inode)
    }

    /// Puts `inode` under an existing name, keeping the name's cookie.
    fn replace(&mut self, name: &[u8], inode: Arc<Inode>) -> Option<Arc<Inode>> {
        let seq = self.names.get(name)?;
        let entry = self.entries.get_mut(seq)?;
        Some(std::mem::replace(&mut entry.inode, inode))
    }
}

/// `DT_*` of a FIFO, socket or device from its mode.
fn dt_of_mode(mode: u32) -> u8 {
    match mode & libc::S_IFMT {
        libc::S_IFIFO => libc::DT_FIFO,
        libc::S_IFSOCK => libc::DT_SOCK,
        libc::S_IFCHR => libc::DT_CHR,
        libc::S_IFBLK => libc::DT_BLK,
        _ => libc::DT_UNKNOWN,
    }
}

fn dt_of(t: FType) -> u8 {
    match t {
        FType::Reg => libc::DT_REG,
        FType::Dir => libc::DT_DIR,
        FType::Lnk => libc::DT_LNK,
        // Readdir asks `dt_of_mode`, which knows the subtype.
        FType::Special => libc::DT_UNKNOWN,
    }
}

fn check_path(path: &[u8]) -> Result<()> {
    if path.len() > ferry_proto::MAX_PATH {
        return Err(Errno::NAMETOOLONG);
    }
    // A C path cannot hold a NUL, so no name can contain one.
    if path.contains(&0) {
        return Err(Errno::INVAL);
    }
    Ok(())
}

/// The non-empty components of `path`, and whether it ends in a slash after
/// a component (which demands a directory, as in Linux).
fn split(path: &[u8]) -> (Vec<&[u8]>, bool) {
    let comps: Vec<&[u8]> = path.split(|&b| b == b'/').filter(|c| !c.is_empty()).collect();
    let trailing = !comps.is_empty() && path.ends_with(b"/");
    (comps, trailing)
}

fn check_xattr_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return Err(Errno::RANGE);
    }
    if name.contains(&0) {
        return Err(Errno::INVAL);
    }
    Ok(())
}

/// The namespace part of an xattr name, checked after permissions as the
/// kernel's handler lookup is.
fn xattr_namespace(name: &[u8]) -> Result<()> {
    for prefix in XATTR_PREFIXES {
        if let Some(rest) = name.strip_prefix(prefix) {
            return if rest.is_empty() { Err(Errno::INVAL) } else { Ok(()) };
        }
    }
    Err(Errno::OPNOTSUPP)
}

/// Linux allows `user.` attributes only on regular files and directories;
/// elsewhere reads find nothing and writes are refused.
fn user_xattr_allowed(inode: &Inode, name: &[u8], write: bool) -> Result<()> {
    if name.starts_with(b"user.") && inode.ftype != FType::Reg && inode.ftype != FType::Dir {
        return Err(if write { Errno::PERM } else { Errno::NODATA });
    }
    Ok(())
}

/// An open file or directory. Holding the inode keeps an unlinked file alive
/// and usable until the last handle goes.
pub struct MemoryFile {
    inode: Arc<Inode>,
    read: bool,
    write: bool,
    append: bool,
    noatime: bool,
}

pub struct MemoryBackend {
    root: Arc<Inode>,
    ns: RwLock<()>,
    shared: Arc<Shared>,
    uid: u32,
    gid: u32,
    /// Random per instance: its files die with it, so an id from another
    /// instance (before a restart) names nothing here.
    tag: [u8; 8],
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    /// An empty tree whose root belongs to the server's user, as a fresh
    /// export directory would.
    pub fn new() -> MemoryBackend {
        let uid = rustix::process::geteuid().as_raw();
        let gid = rustix::process::getegid().as_raw();
        let shared =
            Arc::new(Shared { bytes: AtomicU64::new(0), inodes: AtomicU64::new(1), next_ino: AtomicU64::new(2) });
        let t = now();
        let root = Arc::new(Inode {
            ino: 1,
            ftype: FType::Dir,
            shared: shared.clone(),
            st: Mutex::new(State {
                perm: 0o755,
                nlink: 2,
                uid,
                gid,
                atime: t,
                mtime: t,
                ctime: t,
                xattrs: BTreeMap::new(),
                content: Content::Dir(DirData::new(Weak::new())),
            }),
        });
        let mut tag = [0u8; 8];
        // Weak randomness only makes a stale id likelier to pass as ours
        // when the inode number and path match too.
        let _ = getrandom::getrandom(&mut tag);
        MemoryBackend { root, ns: RwLock::new(()), shared, uid, gid, tag }
    }

    fn ns_read(&self) -> RwLockReadGuard<'_, ()> {
        self.ns.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn ns_write(&self) -> RwLockWriteGuard<'_, ()> {
        self.ns.write().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Backend for MemoryBackend {
    fn sees_every_change(&self) -> bool {
        true
    }

    type File = MemoryFile;

    fn file_id(&self, file: &MemoryFile) -> Vec<u8> {
        [self.tag, file.inode.ino.to_le_bytes()].concat()
    }

    fn reopen(
        &self,
        _found: Option<MemoryFile>,
        id: &[u8],
        path: &[u8],
        flags: u32,
        key: (u64, u64),
    ) -> Result<(MemoryFile, Attr)> {
        if id.get(..8) != Some(&self.tag[..]) {
            return Err(Errno::STALE);
        }
        crate::backend::reopen_by_path(self, path, flags, |a| (a.dev, a.ino) == key)
    }

    fn open(&self, path: &[u8], flags: u32, mode: u32) -> Result<(MemoryFile, Attr)> {
        // Other bits (O_PATH, O_TMPFILE, O_CLOEXEC, O_SYNC, ...) are ignored, as
        // the protocol asks of a server and as the directory backend does.
        check_path(path)?;
        let acc = flags & O_ACCMODE;
        let creat = flags & O_CREAT != 0;
        if creat && flags & O_DIRECTORY != 0 {
            return Err(Errno::INVAL);
        }
        let excl = creat && flags & O_EXCL != 0;
        // O_EXCL never follows a final symlink: it must not create elsewhere.
        let nofollow = flags & O_NOFOLLOW != 0 || excl;
        let trunc = flags & O_TRUNC != 0;
        // Linux counts O_TRUNC, and the odd access mode 3, as asking to write.
        let wants_write = acc != O_RDONLY || trunc;

        let (_read_guard, _write_guard);
        if creat {
            _write_guard = self.ns_write();
        } else {
            _read_guard = self.ns_read();
        }
        let mut start = self.root.clone();
        let mut cur: Vec<u8> = path.to_owned();
        let mut hops = 0;
        let mut want_dir = flags & O_DIRECTORY != 0;
        let (inode, created) = loop {
            let (dir, last, trailing) = self.walk_parent(start.clone(), &cur, &mut hops)?;
            want_dir |= trailing;
            let name = match last {
                Last::Root | Last::Dot => break (dir, false),
                Last::DotDot => break (self.parent_of(&dir), false),
                Last::Name(n) => n,
            };
            if creat && trailing {
                return Err(Errno::ISDIR);
            }
            match self.lookup_child(&dir, name)? {
                None if creat => break (self.create(&dir, name, NewKind::File, mode & PERM_MASK)?, true),
                None => return Err(Errno::NOENT),
                Some(link) if link.ftype == FType::Lnk && (!nofollow || trailing) => {
                    hops += 1;
                    if hops > MAX_SYMLINKS {
                        return Err(Errno::LOOP);
                    }
                    let target = link.target();
                    if target.is_empty() {
                        return Err(Errno::NOENT);
                    }
                    start = if target.starts_with(b"/") { self.root.clone() } else { dir };
                    cur = target;
                }
                Some(node) => break (node, false),
            }
        };

        if !created {
            let is_dir = inode.ftype == FType::Dir;
            if creat {
                if excl {
                    return Err(Errno::EXIST);
                }
                if is_dir {
                    return Err(Errno::ISDIR);
                }
            }
            if want_dir && !is_dir {
                return Err(Errno::NOTDIR);
            }
            if inode.ftype == FType::Lnk {
                return Err(Errno::LOOP);
            }
            if inode.ftype == FType::Special {
                // Nothing behind a FIFO, socket or device here; devices are
                // refused as on a `nodev` mount.
                let ifmt = inode.attr().mode & libc::S_IFMT;
                return Err(if ifmt == libc::S_IFCHR || ifmt == libc::S_IFBLK { Errno::ACCES } else { Errno::NXIO });
            }
            if is_dir && wants_write {
                return Err(Errno::ISDIR);
            }
        }
        let attr = {
            let mut st = inode.st();
            if trunc && !created {
                if let Content::File(f) = &mut st.content {
                    let freed = f.set_size(0);
                    self.shared.refund(freed);
                    let t = now();
                    st.mtime = t;
                    st.ctime = t;
                }
            }
            inode.attr_of(&st)
        };
        let file = MemoryFile {
            inode,
            read: acc == O_RDONLY || acc == O_RDWR,
            write: acc == O_WRONLY || acc == O_RDWR,
            append: flags & O_APPEND != 0,
            noatime: flags & O_NOATIME != 0,
        };
        Ok((file, attr))
    }

    fn read<'f>(&self, file: &'f MemoryFile, offset: u64, len: usize) -> Result<ReadData<'f>> {
        if !file.read {
            return Err(Errno::BADF);
        }
        if offset > MAX_FILE_SIZE {
            return Err(Errno::INVAL);
        }
        let mut st = file.inode.st();
        let Content::File(f) = &st.content else {
            return Err(Errno::ISDIR);
        };
        let data = f.read_at(offset, len.min(MAX_RW_COUNT));
        if len > 0 && !file.noatime {
            st.touch_atime(now());
        }
        Ok(ReadData::Bytes(data))
    }

    fn write(&self, file: &MemoryFile, offset: u64, data: &[u8]) -> Result<u64> {
        if !file.write {
            return Err(Errno::BADF);
        }
        if offset > MAX_FILE_SIZE {
            return Err(Errno::INVAL);
        }
        let mut st = file.inode.st();
        let Content::File(f) = &mut st.content else {
            return Err(Errno::BADF);
        };
        let pos = if file.append { f.size } else { offset };
        if data.is_empty() {
            return Ok(pos);
        }
        if pos >= MAX_FILE_SIZE {
            return Err(Errno::FBIG);
        }
        // Like Linux, write what fits below the size limit.
        let n = data.len().min(usize::try_from(MAX_FILE_SIZE - pos).unwrap_or(usize::MAX));
        self.shared.charge(f.growth(pos, n))?;
        f.write_at(pos, &data[..n]);
        let t = now();
        st.mtime = t;
        st.ctime = t;
        Ok(pos + n as u64)
    }

    fn fsync(&self, _file: &MemoryFile, _datasync: bool) -> Result<()> {
        // Nothing is more durable than memory here.
        Ok(())
    }

    fn readdir(&self, dir: &MemoryFile, cookie: u64, max: usize, plus: bool) -> Result<(Vec<DirEntry>, bool)> {
        if dir.inode.ftype != FType::Dir {
            return Err(Errno::NOTDIR);
        }
        // Hold the namespace still so `..` and the entries agree.
        let _ns = self.ns_read();
        let mut picked: Vec<(u64, Vec<u8>, Arc<Inode>)> = Vec::new();
        let more;
        {
            let mut st = dir.inode.st();
            // Linux's getdents fails on a removed directory.
            if st.nlink == 0 {
                return Err(Errno::NOENT);
            }
            let d = st.dir().ok_or(Errno::NOTDIR)?;
            let parent = d.parent.upgrade().unwrap_or_else(|| dir.inode.clone());
            let dots = [(COOKIE_DOT, &b"."[..], dir.inode.clone()), (COOKIE_DOTDOT, &b".."[..], parent)];
            let mut all = dots.into_iter().filter(|(c, _, _)| *c > cookie).map(|(c, n, i)| (c, n.to_owned(), i)).chain(
                d.entries
                    .range((Bound::Excluded(cookie.max(COOKIE_DOTDOT)), Bound::Unbounded))
                    .map(|(&c, e)| (c, e.name.clone(), e.inode.clone())),
            );
            picked.extend(all.by_ref().take(max));
            more = all.next().is_some();
            if !dir.noatime {
                st.touch_atime(now());
            }
        }
        let entries = picked
            .into_iter()
            .map(|(cookie, name, inode)| DirEntry {
                name,
                ino: inode.ino,
                kind: if inode.ftype == FType::Special { dt_of_mode(inode.attr().mode) } else { dt_of(inode.ftype) },
                cookie,
                attr: plus.then(|| inode.attr()),
            })
            .collect();
        Ok((entries, !more))
    }

    fn getattr(&self, node: Node<'_, MemoryFile>) -> Result<Attr> {
        Ok(self.node_inode(node)?.attr())
    }

    fn truncate(&self, node: Node<'_, MemoryFile>, size: u64) -> Result<Attr> {
        // Beyond `off_t`: the largest file there could be, as the directory
        // backend reports it.
        if size > MAX_FILE_SIZE {
            return Err(Errno::FBIG);
        }
        let inode = match node {
            Node::File(f) => {
                // ftruncate wants a regular file open for writing.
                if f.inode.ftype != FType::Reg || !f.write {
                    return Err(Errno::INVAL);
                }
                f.inode.clone()
            }
            Node::Path(p) | Node::PathNoFollow(p) => {
                let inode = self.resolve(p, matches!(node, Node::Path(_)))?;
                match inode.ftype {
                    FType::Dir => return Err(Errno::ISDIR),
                    // Opening a symlink itself for writing fails so.
                    FType::Lnk => return Err(Errno::LOOP),
                    FType::Special => return Err(Errno::INVAL),
                    FType::Reg => inode,
                }
            }
        };
        let mut st = inode.st();
        if let Content::File(f) = &mut st.content {
            let freed = f.set_size(size);
            self.shared.refund(freed);
        }
        // ext4 stamps both times even when the size does not change.
        let t = now();
        st.mtime = t;
        st.ctime = t;
        Ok(inode.attr_of(&st))
    }

    fn chmod(&self, node: Node<'_, MemoryFile>, mode: u32) -> Result<Attr> {
        let inode = self.node_inode(node)?;
        // Linux has no way to change a symlink's mode.
        if inode.ftype == FType::Lnk {
            return Err(Errno::OPNOTSUPP);
        }
        let mut st = inode.st();
        st.perm = mode & PERM_MASK;
        st.ctime = now();
        Ok(inode.attr_of(&st))
    }

    fn chown(&self, node: Node<'_, MemoryFile>, uid: u32, gid: u32) -> Result<Attr> {
        let inode = self.node_inode(node)?;
        let mut st = inode.st();
        if uid != u32::MAX {
            st.uid = uid;
        }
        if gid != u32::MAX {
            st.gid = gid;
        }
        // Linux drops set-user-ID on any chown of a non-directory, even by
        // root, and set-group-ID when it means "executable by the group".
        if inode.ftype != FType::Dir {
            st.perm &= !S_ISUID;
            if st.perm & S_IXGRP != 0 {
                st.perm &= !S_ISGID;
            }
        }
        st.ctime = now();
        Ok(inode.attr_of(&st))
    }

    fn utimens(&self, node: Node<'_, MemoryFile>, atime: Time, mtime: Time) -> Result<Attr> {
        let inode = self.node_inode(node)?;
        let valid = |t: Time| t.nsec == UTIME_NOW || t.nsec == UTIME_OMIT || t.nsec < 1_000_000_000;
        if !valid(atime) || !valid(mtime) {
            return Err(Errno::INVAL);
        }
        let mut st = inode.st();
        if atime.nsec == UTIME_OMIT && mtime.nsec == UTIME_OMIT {
            return Ok(inode.attr_of(&st));
        }
        let t = now();
        let pick = |v: Time| if v.nsec == UTIME_NOW { t } else { v };
        if atime.nsec != UTIME_OMIT {
            st.atime = pick(atime);
        }
        if mtime.nsec != UTIME_OMIT {
            st.mtime = pick(mtime);
        }
        st.ctime = t;
        Ok(inode.attr_of(&st))
    }

    fn mkdir(&self, path: &[u8], mode: u32) -> Result<Attr> {
        check_path(path)?;
        let _ns = self.ns_write();
        let (dir, name) = self.free_name(path, true)?;
        Ok(self.create(&dir, name, NewKind::Dir, mode & MKDIR_MASK)?.attr())
    }

    fn mknod(&self, path: &[u8], mode: u32, rdev: u64) -> Result<Attr> {
        check_path(path)?;
        let ifmt = mode & libc::S_IFMT;
        let kind = match ifmt {
            0 | libc::S_IFREG => NewKind::File,
            libc::S_IFIFO | libc::S_IFSOCK | libc::S_IFCHR | libc::S_IFBLK => NewKind::Special { ifmt, rdev },
            libc::S_IFDIR => return Err(Errno::PERM),
            _ => return Err(Errno::INVAL),
        };
        let _ns = self.ns_write();
        let (dir, name) = self.free_name(path, true)?;
        Ok(self.create(&dir, name, kind, mode & PERM_MASK)?.attr())
    }

    fn rmdir(&self, path: &[u8]) -> Result<()> {
        check_path(path)?;
        let _ns = self.ns_write();
        let (dir, last, _) = self.walk_parent(self.root.clone(), path, &mut 0)?;
        let name = match last {
            Last::Name(n) => n,
            Last::DotDot => return Err(Errno::NOTEMPTY),
            Last::Dot => return Err(Errno::INVAL),
            Last::Root => return Err(EBUSY),
        };
        let child = self.lookup_child(&dir, name)?.ok_or(Errno::NOENT)?;
        if child.ftype != FType::Dir {
            return Err(Errno::NOTDIR);
        }
        let t = now();
        {
            let mut st = child.st();
            if st.dir().is_some_and(|d| !d.entries.is_empty()) {
                return Err(Errno::NOTEMPTY);
            }
            st.nlink = 0;
            st.ctime = t;
        }
        let mut st = dir.st();
        if let Some(d) = st.dir_mut() {
            d.remove(name);
        }
        st.nlink = st.nlink.saturating_sub(1);
        st.mtime = t;
        st.ctime = t;
        Ok(())
    }

    fn unlink(&self, path: &[u8]) -> Result<()> {
        check_path(path)?;
        let _ns = self.ns_write();
        let (dir, last, trailing) = self.walk_parent(self.root.clone(), path, &mut 0)?;
        let Last::Name(name) = last else {
            return Err(Errno::ISDIR);
        };
        let child = self.lookup_child(&dir, name)?.ok_or(Errno::NOENT)?;
        if child.ftype == FType::Dir {
            return Err(Errno::ISDIR);
        }
        if trailing {
            return Err(Errno::NOTDIR);
        }
        let t = now();
        {
            let mut st = child.st();
            st.nlink = st.nlink.saturating_sub(1);
            st.ctime = t;
        }
        let mut st = dir.st();
        if let Some(d) = st.dir_mut() {
            d.remove(name);
        }
        st.mtime = t;
        st.ctime = t;
        Ok(())
    }

    fn rename(&self, from: &[u8], to: &[u8], flags: u32) -> Result<()> {
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0 || flags == RENAME_NOREPLACE | RENAME_EXCHANGE {
            return Err(Errno::INVAL);
        }
        let exchange = flags & RENAME_EXCHANGE != 0;
        check_path(from)?;
        check_path(to)?;
        let _ns = self.ns_write();
        let (od, olast, otrail) = self.walk_parent(self.root.clone(), from, &mut 0)?;
        let (nd, nlast, ntrail) = self.walk_parent(self.root.clone(), to, &mut 0)?;
        let Last::Name(on) = olast else {
            return Err(EBUSY);
        };
        let Last::Name(nn) = nlast else {
            return Err(if flags & RENAME_NOREPLACE != 0 { Errno::EXIST } else { EBUSY });
        };
        let old = self.lookup_child(&od, on)?.ok_or(Errno::NOENT)?;
        let new = self.lookup_child(&nd, nn)?;
        if flags & RENAME_NOREPLACE != 0 && new.is_some() {
            return Err(Errno::EXIST);
        }
        if exchange {
            match &new {
                None => return Err(Errno::NOENT),
                Some(n) if n.ftype != FType::Dir && ntrail => return Err(Errno::NOTDIR),
                Some(_) => {}
            }
        }
        if old.ftype != FType::Dir && (otrail || (!exchange && ntrail)) {
            return Err(Errno::NOTDIR);
        }
        // Linux's `lock_rename` trap: the child of one parent that is an
        // ancestor of the other. Moving it would cut it loose from the tree.
        let trap = if Arc::ptr_eq(&od, &nd) {
            None
        } else {
            self.child_toward(&od, &nd).or_else(|| self.child_toward(&nd, &od))
        };
        if let Some(trap) = &trap {
            if Arc::ptr_eq(trap, &old) {
                return Err(Errno::INVAL);
            }
            if new.as_ref().is_some_and(|n| Arc::ptr_eq(trap, n)) {
                return Err(if exchange { Errno::INVAL } else { Errno::NOTEMPTY });
            }
        }
        if new.as_ref().is_some_and(|n| Arc::ptr_eq(n, &old)) {
            return Ok(());
        }
        match &new {
            Some(n) if exchange => self.apply_exchange(&od, on, &nd, nn, &old, n),
            Some(n) => {
                let old_is_dir = old.ftype == FType::Dir;
                let new_is_dir = n.ftype == FType::Dir;
                if old_is_dir && !new_is_dir {
                    return Err(Errno::NOTDIR);
                }
                if !old_is_dir && new_is_dir {
                    return Err(Errno::ISDIR);
                }
                if new_is_dir && !Self::is_empty_dir(n) {
                    return Err(Errno::NOTEMPTY);
                }
                self.apply_rename(&od, on, &nd, nn, &old, Some(n));
            }
            None => self.apply_rename(&od, on, &nd, nn, &old, None),
        }
        Ok(())
    }

    fn link(&self, from: &[u8], to: &[u8]) -> Result<Attr> {
        check_path(from)?;
        check_path(to)?;
        let _ns = self.ns_write();
        let src = self.resolve_from(self.root.clone(), from, false, &mut 0)?;
        let (dir, name) = self.free_name(to, false)?;
        if src.ftype == FType::Dir {
            return Err(Errno::PERM);
        }
        let t = now();
        {
            let mut st = dir.st();
            if st.nlink == 0 {
                return Err(Errno::NOENT);
            }
            if let Some(d) = st.dir_mut() {
                d.insert(name, src.clone());
            }
            st.mtime = t;
            st.ctime = t;
        }
        let mut st = src.st();
        st.nlink += 1;
        st.ctime = t;
        Ok(src.attr_of(&st))
    }

    fn symlink(&self, target: &[u8], path: &[u8]) -> Result<Attr> {
        if target.is_empty() {
            return Err(Errno::NOENT);
        }
        check_path(target)?;
        if target.len() >= PATH_MAX {
            return Err(Errno::NAMETOOLONG);
        }
        check_path(path)?;
        let _ns = self.ns_write();
        let (dir, name) = self.free_name(path, false)?;
        Ok(self.create(&dir, name, NewKind::Symlink(target.to_owned()), 0o777)?.attr())
    }

    fn readlink(&self, path: &[u8]) -> Result<Vec<u8>> {
        let inode = self.resolve(path, false)?;
        let mut st = inode.st();
        let Content::Symlink(t) = &st.content else {
            return Err(Errno::INVAL);
        };
        let target = t.clone();
        st.touch_atime(now());
        Ok(target)
    }

    fn statfs(&self, path: &[u8]) -> Result<StatFs> {
        self.resolve(path, true)?;
        let used = self.shared.bytes.load(Ordering::Relaxed).min(BUDGET);
        let inodes = self.shared.inodes.load(Ordering::Relaxed).min(MAX_INODES);
        let free = (BUDGET - used) / BLOCK;
        Ok(StatFs {
            bsize: BLOCK,
            frsize: BLOCK,
            blocks: BUDGET / BLOCK,
            bfree: free,
            bavail: free,
            files: MAX_INODES,
            ffree: MAX_INODES - inodes,
            favail: MAX_INODES - inodes,
            fsid: DEV,
            flags: 0,
            namemax: NAME_MAX as u64,
        })
    }

    fn access(&self, path: &[u8], mode: u32) -> Result<()> {
        let all = (libc::R_OK | libc::W_OK | libc::X_OK) as u32;
        if mode & !all != 0 {
            return Err(Errno::INVAL);
        }
        let inode = self.resolve(path, true)?;
        // Root may do anything, except execute a file nobody may execute.
        if mode & libc::X_OK as u32 != 0 && inode.ftype == FType::Reg && inode.st().perm & 0o111 == 0 {
            return Err(Errno::ACCES);
        }
        Ok(())
    }

    fn getxattr(&self, node: Node<'_, MemoryFile>, name: &[u8]) -> Result<Vec<u8>> {
        check_xattr_name(name)?;
        let inode = self.node_inode(node)?;
        user_xattr_allowed(&inode, name, false)?;
        xattr_namespace(name)?;
        let st = inode.st();
        st.xattrs.get(name).cloned().ok_or(Errno::NODATA)
    }

    fn setxattr(&self, node: Node<'_, MemoryFile>, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
            return Err(Errno::INVAL);
        }
        check_xattr_name(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(E2BIG);
        }
        let inode = self.node_inode(node)?;
        user_xattr_allowed(&inode, name, true)?;
        xattr_namespace(name)?;
        let mut st = inode.st();
        let old = st.xattrs.get(name).map(|v| (name.len() + v.len()) as u64);
        match old {
            Some(_) if flags & XATTR_CREATE != 0 => return Err(Errno::EXIST),
            None if flags & XATTR_REPLACE != 0 => return Err(Errno::NODATA),
            _ => {}
        }
        self.shared.charge((name.len() + value.len()) as u64)?;
        self.shared.refund(old.unwrap_or(0));
        st.xattrs.insert(name.to_owned(), value.to_vec());
        st.ctime = now();
        Ok(())
    }

    fn listxattr(&self, node: Node<'_, MemoryFile>) -> Result<Vec<u8>> {
        let inode = self.node_inode(node)?;
        let st = inode.st();
        let mut out = Vec::new();
        for name in st.xattrs.keys() {
            out.extend_from_slice(name);
            out.push(0);
        }
        Ok(out)
    }

    fn removexattr(&self, node: Node<'_, MemoryFile>, name: &[u8]) -> Result<()> {
        check_xattr_name(name)?;
        let inode = self.node_inode(node)?;
        user_xattr_allowed(&inode, name, true)?;
        xattr_namespace(name)?;
        let mut st = inode.st();
        let value = st.xattrs.remove(name).ok_or(Errno::NODATA)?;
        self.shared.refund((name.len() + value.len()) as u64);
        st.ctime = now();
        Ok(())
    }
}

#[cfg(test)]
mod tests;
