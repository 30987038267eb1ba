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

/// Sparse file contents: chunk `i` holds bytes from `i * CHUNK`; bytes below
/// `size` that no chunk holds read as zeros.
#[derive(Default)]
struct FileData {
    size: u64,
    chunks: BTreeMap<u64, Vec<u8>>,
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

impl FileData {
    fn allocated(&self) -> u64 {
        self.chunks.values().map(|c| c.len() as u64).sum()
    }

    /// Bytes a write of `len` at `pos` would add to the chunks, to charge them
    /// before touching anything.
    fn growth(&self, mut pos: u64, len: usize) -> u64 {
        let mut left = len as u64;
        let mut grow = 0;
        while left > 0 {
            let (idx, within) = (pos / CHUNK, pos % CHUNK);
            let n = left.min(CHUNK - within);
            let have = self.chunks.get(&idx).map_or(0, |c| c.len() as u64);
            grow += (within + n).saturating_sub(have);
            pos += n;
            left -= n;
        }
        grow
    }

    fn write_at(&mut self, mut pos: u64, mut data: &[u8]) {
        while !data.is_empty() {
            let idx = pos / CHUNK;
            let within = (pos % CHUNK) as usize;
            let n = data.len().min(CHUNK as usize - within);
            let end = within + n;
            let chunk = self.chunks.entry(idx).or_default();
            if chunk.len() < end {
                if chunk.capacity() < end {
                    // Double like a Vec would, but never past one chunk, so
                    // appends stay cheap without wasting half a chunk.
                    let want = end.max(chunk.capacity() * 2).min(CHUNK as usize);
                    chunk.reserve_exact(want - chunk.len());
                }
                chunk.resize(end, 0);
            }
            chunk[within..end].copy_from_slice(&data[..n]);
            pos += n as u64;
            data = &data[n..];
        }
        self.size = self.size.max(pos);
    }

    fn read_at(&self, offset: u64, len: usize) -> Vec<u8> {
        if offset >= self.size || len == 0 {
            return Vec::new();
        }
        let end = self.size.min(offset.saturating_add(len as u64));
        let mut out = vec![0u8; (end - offset) as usize];
        for (&idx, chunk) in self.chunks.range(offset / CHUNK..=(end - 1) / CHUNK) {
            let start = idx * CHUNK;
            let from = offset.max(start);
            let to = end.min(start + chunk.len() as u64);
            if from < to {
                out[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&chunk[(from - start) as usize..(to - start) as usize]);
            }
        }
        out
    }

    /// Returns the bytes freed.
    fn set_size(&mut self, size: u64) -> u64 {
        let mut freed = 0;
        if size < self.size {
            let dropped = self.chunks.split_off(&size.div_ceil(CHUNK));
            freed += dropped.values().map(|c| c.len() as u64).sum::<u64>();
            let within = (size % CHUNK) as usize;
            if within != 0 {
                if let Some(c) = self.chunks.get_mut(&(size / CHUNK)) {
                    if c.len() > within {
                        freed += (c.len() - within) as u64;
                        c.truncate(within);
                    }
                }
            }
        }
        self.size = size;
        freed
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

    fn parent_of(&self, dir: &Arc<Inode>) -> Arc<Inode> {
        let parent = dir.st().dir().and_then(|d| d.parent.upgrade());
        parent.unwrap_or_else(|| dir.clone())
    }

    fn lookup_child(&self, dir: &Arc<Inode>, name: &[u8]) -> Result<Option<Arc<Inode>>> {
        if name.len() > NAME_MAX {
            return Err(Errno::NAMETOOLONG);
        }
        let st = dir.st();
        let d = st.dir().ok_or(Errno::NOTDIR)?;
        Ok(d.get(name).cloned())
    }

    /// Resolves the symlink `link` found in `dir`, following everything.
    fn follow(&self, dir: &Arc<Inode>, link: &Inode, hops: &mut u32) -> Result<Arc<Inode>> {
        *hops += 1;
        if *hops > MAX_SYMLINKS {
            return Err(Errno::LOOP);
        }
        let target = link.target();
        if target.is_empty() {
            return Err(Errno::NOENT);
        }
        let start = if target.starts_with(b"/") { self.root.clone() } else { dir.clone() };
        self.resolve_from(start, &target, true, hops)
    }

    /// Walks `comps` from `dir`, every one of which must lead to a directory.
    fn walk_dirs(&self, mut dir: Arc<Inode>, comps: &[&[u8]], hops: &mut u32) -> Result<Arc<Inode>> {
        for &comp in comps {
            dir = match comp {
                b"." => dir,
                b".." => self.parent_of(&dir),
                name => {
                    let mut child = self.lookup_child(&dir, name)?.ok_or(Errno::NOENT)?;
                    if child.ftype == FType::Lnk {
                        child = self.follow(&dir, &child, hops)?;
                    }
                    if child.ftype != FType::Dir {
                        return Err(Errno::NOTDIR);
                    }
                    child
                }
            };
        }
        Ok(dir)
    }

    /// Resolves everything but the last component: the directory that holds
    /// it, the component, and whether a trailing slash followed it.
    fn walk_parent<'p>(
        &self,
        start: Arc<Inode>,
        path: &'p [u8],
        hops: &mut u32,
    ) -> Result<(Arc<Inode>, Last<'p>, bool)> {
        let (comps, trailing) = split(path);
        let Some((&last, init)) = comps.split_last() else {
            return Ok((start, Last::Root, false));
        };
        let dir = self.walk_dirs(start, init, hops)?;
        let last = match last {
            b"." => Last::Dot,
            b".." => Last::DotDot,
            name => Last::Name(name),
        };
        Ok((dir, last, trailing))
    }

    fn resolve_from(&self, start: Arc<Inode>, path: &[u8], follow: bool, hops: &mut u32) -> Result<Arc<Inode>> {
        let (dir, last, trailing) = self.walk_parent(start, path, hops)?;
        let node = match last {
            Last::Root | Last::Dot => dir,
            Last::DotDot => self.parent_of(&dir),
            Last::Name(name) => {
                let child = self.lookup_child(&dir, name)?.ok_or(Errno::NOENT)?;
                // A trailing slash asks for what the link points to.
                if child.ftype == FType::Lnk && (follow || trailing) {
                    self.follow(&dir, &child, hops)?
                } else {
                    child
                }
            }
        };
        if trailing && node.ftype != FType::Dir {
            return Err(Errno::NOTDIR);
        }
        Ok(node)
    }

    fn resolve(&self, path: &[u8], follow: bool) -> Result<Arc<Inode>> {
        check_path(path)?;
        let _ns = self.ns_read();
        self.resolve_from(self.root.clone(), path, follow, &mut 0)
    }

    fn node_inode(&self, node: Node<'_, MemoryFile>) -> Result<Arc<Inode>> {
        match node {
            Node::File(f) => Ok(f.inode.clone()),
            Node::Path(p) => self.resolve(p, true),
            Node::PathNoFollow(p) => self.resolve(p, false),
        }
    }

    /// A new inode owned by the server, taking its group (and, for a
    /// directory, the set-group-ID bit) from a set-group-ID parent as Linux
    /// does.
    fn make_inode(
        &self,
        parent: &State,
        parent_arc: &Arc<Inode>,
        kind: NewKind,
        perm: u32,
        now: Time,
    ) -> Result<Arc<Inode>> {
        let ino = self.shared.take_inode()?;
        let (mut perm, mut gid) = (perm, self.gid);
        if parent.perm & S_ISGID != 0 {
            gid = parent.gid;
            if matches!(kind, NewKind::Dir) {
                perm |= S_ISGID;
            }
        }
        let (ftype, nlink, content) = match kind {
            NewKind::File => (FType::Reg, 1, Content::File(FileData::default())),
            NewKind::Dir => (FType::Dir, 2, Content::Dir(DirData::new(Arc::downgrade(parent_arc)))),
            NewKind::Symlink(t) => (FType::Lnk, 1, Content::Symlink(t)),
            NewKind::Special { ifmt, rdev } => (FType::Special, 1, Content::Special { ifmt, rdev }),
        };
        Ok(Arc::new(Inode {
            ino,
            ftype,
            shared: self.shared.clone(),
            st: Mutex::new(State {
                perm,
                nlink,
                uid: self.uid,
                gid,
                atime: now,
                mtime: now,
                ctime: now,
                xattrs: BTreeMap::new(),
                content,
            }),
        }))
    }

    /// Creates `name` in `dir`; the caller holds the namespace write lock and
    /// has checked that the name is free.
    fn create(&self, dir: &Arc<Inode>, name: &[u8], kind: NewKind, perm: u32) -> Result<Arc<Inode>> {
        let t = now();
        let is_dir = matches!(kind, NewKind::Dir);
        let mut st = dir.st();
        if st.nlink == 0 {
            return Err(Errno::NOENT);
        }
        let inode = self.make_inode(&st, dir, kind, perm, t)?;
        st.dir_mut().ok_or(Errno::NOTDIR)?.insert(name, inode.clone());
        if is_dir {
            st.nlink += 1;
        }
        st.mtime = t;
        st.ctime = t;
        Ok(inode)
    }

    fn is_empty_dir(inode: &Inode) -> bool {
        inode.st().dir().is_none_or(|d| d.entries.is_empty())
    }

    /// Walks up from `desc`: if `anc` is a proper ancestor, the child of
    /// `anc` on the way.
    fn child_toward(&self, anc: &Arc<Inode>, desc: &Arc<Inode>) -> Option<Arc<Inode>> {
        let mut cur = desc.clone();
        loop {
            let parent = self.parent_of(&cur);
            if Arc::ptr_eq(&parent, &cur) {
                return None;
            }
            if Arc::ptr_eq(&parent, anc) {
                return Some(cur);
            }
            cur = parent;
        }
    }

    fn apply_rename(
        &self,
        od: &Arc<Inode>,
        on: &[u8],
        nd: &Arc<Inode>,
        nn: &[u8],
        old: &Arc<Inode>,
        new: Option<&Arc<Inode>>,
    ) {
        let t = now();
        let same_dir = Arc::ptr_eq(od, nd);
        let old_is_dir = old.ftype == FType::Dir;
        if let Some(victim) = new {
            let victim_is_dir = victim.ftype == FType::Dir;
            {
                let mut st = victim.st();
                st.nlink = if victim_is_dir { 0 } else { st.nlink.saturating_sub(1) };
                st.ctime = t;
            }
            let mut st = nd.st();
            if let Some(d) = st.dir_mut() {
                d.remove(nn);
            }
            if victim_is_dir {
                st.nlink = st.nlink.saturating_sub(1);
            }
        }
        {
            let mut st = od.st();
            if let Some(d) = st.dir_mut() {
                d.remove(on);
            }
            if old_is_dir && !same_dir {
                st.nlink = st.nlink.saturating_sub(1);
            }
            st.mtime = t;
            st.ctime = t;
        }
        {
            let mut st = nd.st();
            if let Some(d) = st.dir_mut() {
                d.insert(nn, old.clone());
            }
            if old_is_dir && !same_dir {
                st.nlink += 1;
            }
            st.mtime = t;
            st.ctime = t;
        }
        let mut st = old.st();
        st.ctime = t;
        if let Some(d) = st.dir_mut() {
            d.parent = Arc::downgrade(nd);
        }
    }

    fn apply_exchange(&self, od: &Arc<Inode>, on: &[u8], nd: &Arc<Inode>, nn: &[u8], a: &Arc<Inode>, b: &Arc<Inode>) {
        let t = now();
        let same_dir = Arc::ptr_eq(od, nd);
        let (a_dir, b_dir) = (a.ftype == FType::Dir, b.ftype == FType::Dir);
        // Each directory loses the `..` of the subdirectory leaving it and
        // gains the one arriving.
        let shift = |dir: &Arc<Inode>, leaving: bool, arriving: bool, name: &[u8], put: &Arc<Inode>| {
            let mut st = dir.st();
            if let Some(d) = st.dir_mut() {
                d.replace(name, put.clone());
            }
            if !same_dir {
                if leaving && !arriving {
                    st.nlink = st.nlink.saturating_sub(1);
                } else if arriving && !leaving {
                    st.nlink += 1;
                }
            }
            st.mtime = t;
            st.ctime = t;
        };
        shift(od, a_dir, b_dir, on, b);
        shift(nd, b_dir, a_dir, nn, a);
        for (inode, parent) in [(a, nd), (b, od)] {
            let mut st = inode.st();
            st.ctime = t;
            if let Some(d) = st.dir_mut() {
                d.parent = Arc::downgrade(parent);
            }
        }
    }
}

impl Backend for MemoryBackend {
    type File = MemoryFile;

    fn file_id(&self, file: &MemoryFile) -> Vec<u8> {
        [self.tag, file.inode.ino.to_le_bytes()].concat()
    }

    fn reopen(&self, id: &[u8], path: &[u8], flags: u32, key: (u64, u64)) -> Result<(MemoryFile, Attr)> {
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
        let (dir, last, _) = self.walk_parent(self.root.clone(), path, &mut 0)?;
        let Last::Name(name) = last else {
            return Err(Errno::EXIST);
        };
        if self.lookup_child(&dir, name)?.is_some() {
            return Err(Errno::EXIST);
        }
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
        let (dir, last, _) = self.walk_parent(self.root.clone(), path, &mut 0)?;
        let Last::Name(name) = last else {
            return Err(Errno::EXIST);
        };
        if self.lookup_child(&dir, name)?.is_some() {
            return Err(Errno::EXIST);
        }
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
        let (dir, last, trailing) = self.walk_parent(self.root.clone(), to, &mut 0)?;
        let Last::Name(name) = last else {
            return Err(Errno::EXIST);
        };
        if self.lookup_child(&dir, name)?.is_some() {
            return Err(Errno::EXIST);
        }
        if trailing {
            return Err(Errno::NOENT);
        }
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
        let (dir, last, trailing) = self.walk_parent(self.root.clone(), path, &mut 0)?;
        let Last::Name(name) = last else {
            return Err(Errno::EXIST);
        };
        if self.lookup_child(&dir, name)?.is_some() {
            return Err(Errno::EXIST);
        }
        if trailing {
            return Err(Errno::NOENT);
        }
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
mod tests {
    use super::*;

    const RDONLY: u32 = O_RDONLY;
    const WRONLY: u32 = O_WRONLY;
    const RDWR: u32 = O_RDWR;
    const CREAT: u32 = O_CREAT;

    fn errno<T>(r: Result<T>) -> i32 {
        match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.0,
        }
    }

    fn open(b: &MemoryBackend, path: &str, flags: u32) -> MemoryFile {
        b.open(path.as_bytes(), flags, 0o644).unwrap_or_else(|e| panic!("open {path}: {e:?}")).0
    }

    fn mkfile(b: &MemoryBackend, path: &str, data: &[u8]) -> Attr {
        let f = open(b, path, CREAT | WRONLY | O_TRUNC);
        b.write(&f, 0, data).unwrap();
        b.getattr(Node::File(&f)).unwrap()
    }

    fn bytes(d: ReadData<'_>) -> Vec<u8> {
        match d {
            ReadData::Bytes(v) => v,
            ReadData::Fd { .. } => panic!("memory backend returned a descriptor"),
        }
    }

    fn read_at(b: &MemoryBackend, f: &MemoryFile, off: u64, len: usize) -> Vec<u8> {
        bytes(b.read(f, off, len).unwrap())
    }

    fn contents(b: &MemoryBackend, path: &str) -> Vec<u8> {
        let f = open(b, path, RDONLY);
        read_at(b, &f, 0, 1 << 24)
    }

    fn stat(b: &MemoryBackend, path: &str) -> Attr {
        b.getattr(Node::Path(path.as_bytes())).unwrap_or_else(|e| panic!("stat {path}: {e:?}"))
    }

    fn lstat(b: &MemoryBackend, path: &str) -> Attr {
        b.getattr(Node::PathNoFollow(path.as_bytes())).unwrap_or_else(|e| panic!("lstat {path}: {e:?}"))
    }

    fn list(b: &MemoryBackend, path: &str) -> Vec<String> {
        let d = open(b, path, RDONLY | O_DIRECTORY);
        let (entries, eof) = b.readdir(&d, 0, usize::MAX, false).unwrap();
        assert!(eof);
        entries.into_iter().map(|e| String::from_utf8(e.name).unwrap()).collect()
    }

    fn later(a: Time, b: Time) -> bool {
        time_key(a) > time_key(b)
    }

    /// Lets the clock move so a changed timestamp is visibly different.
    fn tick() {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }

    #[test]
    fn root_belongs_to_the_server() {
        let b = MemoryBackend::new();
        for p in ["", "/", ".", "//", "./.", "..", "/../.."] {
            let a = stat(&b, p);
            assert_eq!(a.mode, 0o40755, "{p}");
            assert_eq!(a.ino, 1);
        }
        let a = stat(&b, "");
        assert_eq!(a.nlink, 2);
        assert_eq!(a.uid, rustix::process::geteuid().as_raw());
        assert_eq!(a.gid, rustix::process::getegid().as_raw());
        assert_eq!(a.dev, DEV);
        assert_eq!(a.blksize, 4096);
    }

    #[test]
    fn create_write_read() {
        let b = MemoryBackend::new();
        let (f, a) = b.open(b"f", CREAT | RDWR, 0o640).unwrap();
        assert_eq!(a.mode, 0o100640);
        assert_eq!(a.nlink, 1);
        assert_eq!(a.size, 0);
        assert_eq!(b.write(&f, 0, b"hello").unwrap(), 5);
        assert_eq!(b.write(&f, 5, b" world").unwrap(), 11);
        assert_eq!(read_at(&b, &f, 0, 100), b"hello world");
        assert_eq!(read_at(&b, &f, 6, 3), b"wor");
        assert_eq!(read_at(&b, &f, 11, 10), b"");
        assert_eq!(read_at(&b, &f, 1000, 10), b"");
        assert_eq!(read_at(&b, &f, 0, 0), b"");
        let a = stat(&b, "f");
        assert_eq!(a.size, 11);
        assert_eq!(a.blocks, 1);
        // The mode is used as given: the memory backend has no umask.
        let (_, a) = b.open(b"g", CREAT | WRONLY, 0o7777).unwrap();
        assert_eq!(a.mode, 0o107777);
        let (_, a) = b.open(b"h", CREAT | WRONLY, 0o170644).unwrap();
        assert_eq!(a.mode, 0o100644);
        assert_eq!(b.write(&f, 0, b"").unwrap(), 0);
        assert_eq!(errno(b.read(&f, 1 << 63, 1)), libc::EINVAL);
        assert_eq!(errno(b.write(&f, 1 << 63, b"x")), libc::EINVAL);
        assert_eq!(errno(b.write(&f, (1 << 63) - 1, b"x")), libc::EFBIG);
    }

    #[test]
    fn holes_and_chunk_boundaries() {
        let b = MemoryBackend::new();
        let f = open(&b, "f", CREAT | RDWR);
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        b.write(&f, 10, &data).unwrap();
        let got = read_at(&b, &f, 0, 300_000);
        assert_eq!(got.len(), 200_010);
        assert_eq!(&got[..10], &[0; 10]);
        assert_eq!(&got[10..], &data[..]);
        // Reads straddling chunk edges.
        for off in [CHUNK - 3, CHUNK, 2 * CHUNK - 1, 3 * CHUNK + 5] {
            let got = read_at(&b, &f, off, 7);
            assert_eq!(got, &data[(off - 10) as usize..(off - 10 + 7) as usize]);
        }
        // Overwrite across a boundary.
        b.write(&f, CHUNK - 2, b"ABCD").unwrap();
        assert_eq!(read_at(&b, &f, CHUNK - 2, 4), b"ABCD");
        // A far write leaves a hole of zeros and costs only its chunk.
        let before = b.statfs(b"").unwrap().bfree;
        let far = 1u64 << 40;
        assert_eq!(b.write(&f, far, b"end").unwrap(), far + 3);
        assert_eq!(stat(&b, "f").size, far + 3);
        assert_eq!(read_at(&b, &f, far - 4, 100), b"\0\0\0\0end");
        assert_eq!(read_at(&b, &f, far / 2, 5), [0; 5]);
        assert!(before - b.statfs(b"").unwrap().bfree <= 1);
    }

    #[test]
    fn append_writes_at_the_end() {
        let b = MemoryBackend::new();
        mkfile(&b, "f", b"abc");
        let f = open(&b, "f", WRONLY | O_APPEND);
        assert_eq!(b.write(&f, 0, b"de").unwrap(), 5);
        assert_eq!(b.write(&f, 1, b"f").unwrap(), 6);
        assert_eq!(b.write(&f, 0, b"").unwrap(), 6);
        assert_eq!(contents(&b, "f"), b"abcdef");
    }

    #[test]
    fn access_modes_of_handles() {
        let b = MemoryBackend::new();
        mkfile(&b, "f", b"abc");
        let r = open(&b, "f", RDONLY);
        assert_eq!(errno(b.write(&r, 0, b"x")), libc::EBADF);
        let w = open(&b, "f", WRONLY);
        assert_eq!(errno(b.read(&w, 0, 1)), libc::EBADF);
        // Access mode 3 allows neither, as on Linux.
        let n = open(&b, "f", 3);
        assert_eq!(errno(b.read(&n, 0, 1)), libc::EBADF);
        assert_eq!(errno(b.write(&n, 0, b"x")), libc::EBADF);
        assert_eq!(errno(b.open(b"", 3, 0)), libc::EISDIR);
        let d = open(&b, "", RDONLY);
        assert_eq!(errno(b.read(&d, 0, 1)), libc::EISDIR);
        assert_eq!(errno(b.write(&d, 0, b"x")), libc::EBADF);
        b.fsync(&r, false).unwrap();
        b.fsync(&d, true).unwrap();
    }

    #[test]
    fn open_flags() {
        let b = MemoryBackend::new();
        mkfile(&b, "f", b"hello");
        b.mkdir(b"d", 0o755).unwrap();
        b.symlink(b"f", b"lf").unwrap();
        b.symlink(b"d", b"ld").unwrap();
        b.symlink(b"nowhere", b"dang").unwrap();
        b.symlink(b"/d/inside", b"abs").unwrap();

        assert_eq!(errno(b.open(b"f", CREAT | O_EXCL | RDWR, 0o644)), libc::EEXIST);
        assert_eq!(errno(b.open(b"lf", CREAT | O_EXCL | RDWR, 0o644)), libc::EEXIST);
        assert_eq!(errno(b.open(b"dang", CREAT | O_EXCL | RDWR, 0o644)), libc::EEXIST);
        assert_eq!(errno(b.open(b"lf", O_NOFOLLOW | RDONLY, 0)), libc::ELOOP);
        assert_eq!(errno(b.open(b"lf", O_NOFOLLOW | CREAT | RDONLY, 0o644)), libc::ELOOP);
        assert_eq!(errno(b.open(b"ld", O_NOFOLLOW | O_DIRECTORY | RDONLY, 0)), libc::ENOTDIR);
        open(&b, "ld/", O_NOFOLLOW | RDONLY);
        assert_eq!(errno(b.open(b"f", O_DIRECTORY | RDONLY, 0)), libc::ENOTDIR);
        assert_eq!(errno(b.open(b"lf/", RDONLY, 0)), libc::ENOTDIR);
        assert_eq!(errno(b.open(b"f/", RDONLY, 0)), libc::ENOTDIR);
        assert_eq!(errno(b.open(b"d", WRONLY, 0)), libc::EISDIR);
        assert_eq!(errno(b.open(b"d", RDWR, 0)), libc::EISDIR);
        assert_eq!(errno(b.open(b"d", RDONLY | O_TRUNC, 0)), libc::EISDIR);
        assert_eq!(errno(b.open(b"d", CREAT | RDONLY, 0o644)), libc::EISDIR);
        assert_eq!(errno(b.open(b"d", CREAT | O_EXCL | RDONLY, 0o644)), libc::EEXIST);
        assert_eq!(errno(b.open(b"d/.", CREAT | O_EXCL | RDONLY, 0o644)), libc::EEXIST);
        assert_eq!(errno(b.open(b"", CREAT | RDONLY, 0o644)), libc::EISDIR);
        assert_eq!(errno(b.open(b"new", CREAT | O_DIRECTORY | RDONLY, 0o644)), libc::EINVAL);
        assert_eq!(errno(b.open(b"new/", CREAT | RDWR, 0o644)), libc::EISDIR);
        assert_eq!(errno(b.open(b"f/", CREAT | RDWR, 0o644)), libc::EISDIR);
        assert_eq!(errno(b.open(b"missing", RDONLY, 0)), libc::ENOENT);
        assert_eq!(errno(b.open(b"missing/x", CREAT | RDWR, 0o644)), libc::ENOENT);
        assert_eq!(errno(b.open(b"f/x", CREAT | RDWR, 0o644)), libc::ENOTDIR);
        open(&b, "ld", O_DIRECTORY | RDONLY);

        // O_CREAT through a dangling symlink creates its target.
        let (_, a) = b.open(b"dang", CREAT | RDWR, 0o600).unwrap();
        assert_eq!(a.mode, 0o100600);
        assert_eq!(lstat(&b, "nowhere").ino, a.ino);
        // An absolute target resolves from the export root.
        let (_, a) = b.open(b"abs", CREAT | RDWR, 0o600).unwrap();
        assert_eq!(stat(&b, "d/inside").ino, a.ino);

        // O_TRUNC truncates even a read-only open, and stamps the times.
        let before = stat(&b, "f");
        tick();
        let (_, a) = b.open(b"f", RDONLY | O_TRUNC, 0).unwrap();
        assert_eq!(a.size, 0);
        assert!(later(a.mtime, before.mtime) && later(a.ctime, before.ctime));
        // O_CREAT on an existing file keeps it.
        mkfile(&b, "f", b"data");
        let (_, a) = b.open(b"f", CREAT | RDWR, 0o600).unwrap();
        assert_eq!((a.size, a.mode), (4, 0o100644));
        // Creating updates the parent's times.
        let d0 = stat(&b, "d");
        tick();
        b.open(b"d/new", CREAT | WRONLY, 0o644).unwrap();
        let d1 = stat(&b, "d");
        assert!(later(d1.mtime, d0.mtime) && later(d1.ctime, d0.ctime));
        assert_eq!(d1.nlink, 2);
        // Ignored flags.
        let flags =
            RDWR | libc::O_CLOEXEC as u32 | libc::O_NONBLOCK as u32 | libc::O_SYNC as u32 | libc::O_DIRECT as u32;
        open(&b, "f", flags);
    }

    #[test]
    fn path_resolution() {
        let b = MemoryBackend::new();
        b.mkdir(b"a", 0o755).unwrap();
        b.mkdir(b"a/b", 0o755).unwrap();
        mkfile(&b, "a/b/f", b"x");
        let ino = stat(&b, "a/b/f").ino;
        for p in ["a/b/f", "/a/b/f", "a//b///f", "./a/./b/f", "a/b/../b/f", "../../a/b/f", "a/../../a/b/f", "/../a/b/f"]
        {
            assert_eq!(stat(&b, p).ino, ino, "{p}");
        }
        assert_eq!(stat(&b, "a/b/..").ino, stat(&b, "a").ino);
        assert_eq!(errno(b.getattr(Node::Path(b"a/b/f/"))), libc::ENOTDIR);
        assert_eq!(errno(b.getattr(Node::Path(b"a/b/f/x"))), libc::ENOTDIR);
        assert_eq!(errno(b.getattr(Node::Path(b"a/b/f/.."))), libc::ENOTDIR);
        assert_eq!(errno(b.getattr(Node::Path(b"a/x/f"))), libc::ENOENT);
        assert_eq!(errno(b.getattr(Node::Path(b"a/x/.."))), libc::ENOENT);
        let long = "n".repeat(256);
        assert_eq!(errno(b.getattr(Node::Path(long.as_bytes()))), libc::ENAMETOOLONG);
        assert_eq!(errno(b.open(long.as_bytes(), CREAT | RDWR, 0o644)), libc::ENAMETOOLONG);
        assert_eq!(errno(b.mkdir((format!("a/{long}")).as_bytes(), 0o755)), libc::ENAMETOOLONG);
        // The walk stops at the missing directory before it sees the long name.
        assert_eq!(errno(b.getattr(Node::Path((format!("x/{long}")).as_bytes()))), libc::ENOENT);
        let ok = "n".repeat(255);
        mkfile(&b, &ok, b"");
        // Past PATH_MAX from the root is a deep tree, not an error; past
        // the wire's limit it is.
        assert_eq!(errno(b.getattr(Node::Path(("a/".repeat(2048)).as_bytes()))), libc::ENOENT);
        assert_eq!(errno(b.getattr(Node::Path(("a/".repeat(33_000)).as_bytes()))), libc::ENAMETOOLONG);
        assert_eq!(errno(b.getattr(Node::Path(b"a\0b"))), libc::EINVAL);

        // Symlinks: relative to their directory, absolute from the root,
        // never above the root.
        b.symlink(b"b/f", b"a/rel").unwrap();
        b.symlink(b"/a/b", b"a/b/absdir").unwrap();
        b.symlink(b"../../../../../a", b"a/b/up").unwrap();
        b.symlink(b"/../../a/b/f", b"escape").unwrap();
        assert_eq!(stat(&b, "a/rel").ino, ino);
        assert_eq!(stat(&b, "a/b/absdir/f").ino, ino);
        assert_eq!(stat(&b, "a/b/up/b/f").ino, ino);
        assert_eq!(stat(&b, "escape").ino, ino);
        assert_eq!(lstat(&b, "a/rel").mode, 0o120777);
        assert_eq!(lstat(&b, "a/b/absdir/").ino, stat(&b, "a/b").ino);
        assert_eq!(lstat(&b, "a/b/absdir/.").ino, stat(&b, "a/b").ino);
        b.symlink(b"missing", b"dangling").unwrap();
        assert_eq!(errno(b.getattr(Node::Path(b"dangling"))), libc::ENOENT);
        assert_eq!(lstat(&b, "dangling").size, 7);
        b.symlink(b"a/b/f", b"tofile").unwrap();
        assert_eq!(errno(b.getattr(Node::Path(b"tofile/x"))), libc::ENOTDIR);
        assert_eq!(errno(b.getattr(Node::Path(b"tofile/"))), libc::ENOTDIR);
    }

    #[test]
    fn symlink_hop_limit() {
        let b = MemoryBackend::new();
        mkfile(&b, "f", b"");
        b.symlink(b"f", b"l0").unwrap();
        for i in 1..=41 {
            b.symlink(format!("l{}", i - 1).as_bytes(), format!("l{i}").as_bytes()).unwrap();
        }
        // l39 needs 40 follows, l40 needs 41.
        open(&b, "l39", RDONLY);
        assert_eq!(errno(b.open(b"l40", RDONLY, 0)), libc::ELOOP);
        stat(&b, "l39");
        assert_eq!(errno(b.getattr(Node::Path(b"l40"))), libc::ELOOP);
        lstat(&b, "l40");
        b.symlink(b"loop", b"loop").unwrap();
        assert_eq!(errno(b.getattr(Node::Path(b"loop"))), libc::ELOOP);
        assert_eq!(errno(b.getattr(Node::Path(b"loop/x"))), libc::ELOOP);
        assert_eq!(errno(b.open(b"loop", CREAT | RDWR, 0o644)), libc::ELOOP);
        b.symlink(b"a", b"b").unwrap();
        b.symlink(b"b", b"a").unwrap();
        assert_eq!(errno(b.mkdir(b"a/x", 0o755)), libc::ELOOP);
        b.symlink(b"", b"empty").unwrap_err();
    }

    fn readdir_all(b: &MemoryBackend, d: &MemoryFile, mut cookie: u64, batch: usize) -> Vec<DirEntry> {
        let mut out = Vec::new();
        loop {
            let (entries, eof) = b.readdir(d, cookie, batch, false).unwrap();
            if let Some(last) = entries.last() {
                cookie = last.cookie;
            }
            out.extend(entries);
            if eof {
                return out;
            }
        }
    }

    #[test]
    fn readdir_lists_and_resumes() {
        let b = MemoryBackend::new();
        b.mkdir(b"d", 0o755).unwrap();
        mkfile(&b, "d/f", b"12345");
        b.mkdir(b"d/sub", 0o700).unwrap();
        b.symlink(b"f", b"d/l").unwrap();
        let d = open(&b, "d", RDONLY | O_DIRECTORY);
        let (all, eof) = b.readdir(&d, 0, 100, true).unwrap();
        assert!(eof);
        let names: Vec<&str> = all.iter().map(|e| std::str::from_utf8(&e.name).unwrap()).collect();
        assert_eq!(names, [".", "..", "f", "sub", "l"]);
        let kinds: Vec<u8> = all.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [libc::DT_DIR, libc::DT_DIR, libc::DT_REG, libc::DT_DIR, libc::DT_LNK]);
        assert_eq!(all[0].ino, stat(&b, "d").ino);
        assert_eq!(all[1].ino, 1);
        assert_eq!(all[2].attr, Some(lstat(&b, "d/f")));
        assert_eq!(all[4].attr.map(|a| a.mode), Some(0o120777));
        assert_eq!(all[1].attr.map(|a| a.ino), Some(1));
        let cookies: Vec<u64> = all.iter().map(|e| e.cookie).collect();
        assert!(cookies.windows(2).all(|w| w[0] < w[1]) && cookies[0] > 0);
        let (plain, _) = b.readdir(&d, 0, 100, false).unwrap();
        assert!(plain.iter().all(|e| e.attr.is_none()));

        // One at a time gives the same thing.
        let one: Vec<String> =
            readdir_all(&b, &d, 0, 1).into_iter().map(|e| String::from_utf8(e.name).unwrap()).collect();
        assert_eq!(one, names);
        // Exactly at the end: eof with nothing, and max 0 reports more left.
        let (none, eof) = b.readdir(&d, *cookies.last().unwrap(), 10, false).unwrap();
        assert!(none.is_empty() && eof);
        let (none, eof) = b.readdir(&d, 0, 0, false).unwrap();
        assert!(none.is_empty() && !eof);
        let (two, eof) = b.readdir(&d, 0, 2, false).unwrap();
        assert_eq!(two.len(), 2);
        assert!(!eof);

        // Cookies stay valid when entries around them come and go.
        let (first, _) = b.readdir(&d, 0, 3, false).unwrap();
        let at = first[2].cookie; // after "f"
        b.unlink(b"d/f").unwrap();
        mkfile(&b, "d/g", b"");
        let rest: Vec<String> =
            readdir_all(&b, &d, at, 2).into_iter().map(|e| String::from_utf8(e.name).unwrap()).collect();
        assert_eq!(rest, ["sub", "l", "g"]);
        b.unlink(b"d/l").unwrap();
        let rest: Vec<String> =
            readdir_all(&b, &d, at, 2).into_iter().map(|e| String::from_utf8(e.name).unwrap()).collect();
        assert_eq!(rest, ["sub", "g"]);

        // Root's ".." is the root.
        let r = open(&b, "", RDONLY);
        let (e, _) = b.readdir(&r, 0, 2, false).unwrap();
        assert_eq!((e[0].ino, e[1].ino), (1, 1));

        let f = open(&b, "d/g", RDONLY);
        assert_eq!(errno(b.readdir(&f, 0, 10, false)), libc::ENOTDIR);

        // A removed directory cannot be listed, as getdents says on Linux.
        b.mkdir(b"gone", 0o755).unwrap();
        let g = open(&b, "gone", RDONLY | O_DIRECTORY);
        b.rmdir(b"gone").unwrap();
        assert_eq!(errno(b.readdir(&g, 0, 10, false)), libc::ENOENT);
        let a = b.getattr(Node::File(&g)).unwrap();
        assert_eq!((a.nlink, a.size), (0, 0));
    }

    #[test]
    fn readdir_many_entries() {
        let b = MemoryBackend::new();
        for i in 0..1000 {
            mkfile(&b, &format!("f{i}"), b"");
        }
        let d = open(&b, "", RDONLY);
        let all = readdir_all(&b, &d, 0, 37);
        assert_eq!(all.len(), 1002);
        let mut names: Vec<String> = all.into_iter().skip(2).map(|e| String::from_utf8(e.name).unwrap()).collect();
        names.sort();
        let mut want: Vec<String> = (0..1000).map(|i| format!("f{i}")).collect();
        want.sort();
        assert_eq!(names, want);
    }

    #[test]
    fn truncate_semantics() {
        let b = MemoryBackend::new();
        mkfile(&b, "f", b"hello world");
        b.mkdir(b"d", 0o755).unwrap();
        b.symlink(b"f", b"lf").unwrap();
        let before = stat(&b, "f");
        tick();
        let a = b.truncate(Node::Path(b"f"), 5).unwrap();
        assert_eq!(a.size, 5);
        assert!(later(a.mtime, before.mtime) && later(a.ctime, before.ctime));
        assert_eq!(contents(&b, "f"), b"hello");
        // Extending reads zeros, not the old bytes.
        assert_eq!(b.truncate(Node::Path(b"lf"), 8).unwrap().size, 8);
        assert_eq!(contents(&b, "f"), b"hello\0\0\0");
        // ext4 stamps the times even when the size stays.
        let before = stat(&b, "f");
        tick();
        let a = b.truncate(Node::Path(b"f"), 8).unwrap();
        assert!(later(a.mtime, before.mtime));
        assert_eq!(errno(b.truncate(Node::Path(b"d"), 0)), libc::EISDIR);
        assert_eq!(errno(b.truncate(Node::PathNoFollow(b"lf"), 0)), libc::ELOOP);
        assert_eq!(errno(b.truncate(Node::Path(b"f/"), 0)), libc::ENOTDIR);
        assert_eq!(errno(b.truncate(Node::Path(b"missing"), 0)), libc::ENOENT);
        assert_eq!(errno(b.truncate(Node::Path(b"f"), u64::MAX)), libc::EFBIG);
        let r = open(&b, "f", RDONLY);
        assert_eq!(errno(b.truncate(Node::File(&r), 0)), libc::EINVAL);
        let dh = open(&b, "d", RDONLY);
        assert_eq!(errno(b.truncate(Node::File(&dh), 0)), libc::EINVAL);
        let w = open(&b, "f", WRONLY);
        assert_eq!(b.truncate(Node::File(&w), 2).unwrap().size, 2);
        assert_eq!(contents(&b, "f"), b"he");
        // Shrinking across chunks, then growing again.
        let big: Vec<u8> = vec![7; 3 * CHUNK as usize + 10];
        b.write(&w, 0, &big).unwrap();
        b.truncate(Node::File(&w), CHUNK + 1).unwrap();
        b.truncate(Node::File(&w), 4 * CHUNK).unwrap();
        let got = contents(&b, "f");
        assert_eq!(got.len(), 4 * CHUNK as usize);
        assert!(got[..CHUNK as usize + 1].iter().all(|&x| x == 7));
        assert!(got[CHUNK as usize + 1..].iter().all(|&x| x == 0));
        b.truncate(Node::File(&w), CHUNK).unwrap();
        b.truncate(Node::File(&w), CHUNK + 5).unwrap();
        assert_eq!(read_at(&b, &r, CHUNK - 1, 10), [7, 0, 0, 0, 0, 0]);
        // A huge sparse extension is free.
        b.truncate(Node::File(&w), 1 << 50).unwrap();
        assert_eq!(stat(&b, "f").size, 1 << 50);
    }

    #[test]
    fn chmod_semantics() {
        let b = MemoryBackend::new();
        mkfile(&b, "f", b"");
        b.symlink(b"f", b"lf").unwrap();
        let before = stat(&b, "f");
        tick();
        let a = b.chmod(Node::Path(b"f"), 0o104751).unwrap();
        assert_eq!(a.mode, 0o104751);
        assert!(later(a.ctime, before.ctime));
        assert_eq!(a.mtime, before.mtime);
        assert_eq!(b.chmod(Node::Path(b"lf"), 0o600).unwrap().mode, 0o100600);
        assert_eq!(errno(b.chmod(Node::PathNoFollow(b"lf"), 0o600)), libc::EOPNOTSUPP);
        assert_eq!(b.chmod(Node::PathNoFollow(b"f"), 0o640).unwrap().mode, 0o100640);
        let r = open(&b, "f", RDONLY);
        assert_eq!(b.chmod(Node::File(&r), 0o444).unwrap().mode, 0o100444);
        assert_eq!(b.chmod(Node::Path(b""), 0o700).unwrap().mode, 0o40700);
        assert_eq!(errno(b.chmod(Node::Path(b"missing"), 0o700)), libc::ENOENT);
        // Root ignores permission bits.
        mkfile(&b, "f", b"still writable");
        assert_eq!(contents(&b, "f"), b"still writable");
    }

    #[test]
    fn chown_semantics() {
        let b = MemoryBackend::new();
        mkfile(&b, "f", b"");
        b.mkdir(b"d", 0o755).unwrap();
        b.symlink(b"f", b"lf").unwrap();
        let a = b.chown(Node::Path(b"f"), 5, u32::MAX).unwrap();
        assert_eq!((a.uid, a.gid), (5, rustix::process::getegid().as_raw()));
        let a = b.chown(Node::Path(b"f"), u32::MAX, 6).unwrap();
        assert_eq!((a.uid, a.gid), (5, 6));
        let before = a;
        tick();
        let a = b.chown(Node::Path(b"f"), u32::MAX, u32::MAX).unwrap();
        assert!(later(a.ctime, before.ctime));
        // Set-user-ID always goes; set-group-ID only with group execute.
        b.chmod(Node::Path(b"f"), 0o6755).unwrap();
        assert_eq!(b.chown(Node::Path(b"f"), u32::MAX, u32::MAX).unwrap().mode, 0o100755);
        b.chmod(Node::Path(b"f"), 0o6745).unwrap();
        assert_eq!(b.chown(Node::Path(b"f"), 1, 1).unwrap().mode, 0o102745);
        b.chmod(Node::Path(b"d"), 0o6755).unwrap();
        assert_eq!(b.chown(Node::Path(b"d"), 1, 1).unwrap().mode, 0o46755);
        // No follow changes the link itself.
        let a = b.chown(Node::PathNoFollow(b"lf"), 7, 8).unwrap();
        assert_eq!((a.uid, a.gid, a.mode), (7, 8, 0o120777));
        assert_eq!(stat(&b, "lf").uid, 1);
    }

    #[test]
    fn utimens_semantics() {
        let b = MemoryBackend::new();
        mkfile(&b, "f", b"");
        b.symlink(b"f", b"lf").unwrap();
        let t1 = Time { sec: 100, nsec: 5 };
        let t2 = Time { sec: -3, nsec: 999_999_999 };
        let before = stat(&b, "f");
        tick();
        let a = b.utimens(Node::Path(b"f"), t1, t2).unwrap();
        assert_eq!((a.atime, a.mtime), (t1, t2));
        assert!(later(a.ctime, before.ctime));
        let a = b.utimens(Node::Path(b"f"), Time::OMIT, t1).unwrap();
        assert_eq!((a.atime, a.mtime), (t1, t1));
        let a = b.utimens(Node::Path(b"f"), Time::NOW, Time::OMIT).unwrap();
        assert!(later(a.atime, t1));
        assert_eq!(a.atime, a.ctime);
        assert_eq!(a.mtime, t1);
        // Both omitted: nothing changes, not even ctime.
        let before = a;
        tick();
        assert_eq!(b.utimens(Node::Path(b"f"), Time::OMIT, Time::OMIT).unwrap(), before);
        let bad = Time { sec: 0, nsec: 1_000_000_000 };
        assert_eq!(errno(b.utimens(Node::Path(b"f"), bad, Time::OMIT)), libc::EINVAL);
        // The path is resolved before the times are checked.
        assert_eq!(errno(b.utimens(Node::Path(b"missing"), bad, Time::OMIT)), libc::ENOENT);
        let a = b.utimens(Node::PathNoFollow(b"lf"), t2, t2).unwrap();
        assert_eq!(a.mode, 0o120777);
        assert_eq!(a.mtime, t2);
        assert_eq!(stat(&b, "f").mtime, t1);
        let f = open(&b, "f", RDONLY);
        assert_eq!(b.utimens(Node::File(&f), t2, t2).unwrap().atime, t2);
    }

    #[test]
    fn atime_is_relatime() {
        let b = MemoryBackend::new();
        mkfile(&b, "f", b"abc");
        let f = open(&b, "f", RDONLY);
        let old = Time { sec: 1000, nsec: 0 };
        let recent = now();
        b.utimens(Node::File(&f), recent, old).unwrap();
        // atime newer than mtime but not ctime (utimens set ctime just now).
        read_at(&b, &f, 0, 1);
        let a = stat(&b, "f");
        assert!(later(a.atime, recent));
        // Now atime is newer than both: a read leaves it.
        tick();
        read_at(&b, &f, 0, 1);
        assert_eq!(stat(&b, "f").atime, a.atime);
        // O_NOATIME never touches it.
        b.utimens(Node::File(&f), old, old).unwrap();
        let n = open(&b, "f", RDONLY | O_NOATIME);
        read_at(&b, &n, 0, 1);
        assert_eq!(stat(&b, "f").atime, old);
    }

    #[test]
    fn mkdir_semantics() {
        let b = MemoryBackend::new();
        let a = b.mkdir(b"d", 0o7777).unwrap();
        // mkdir keeps only permissions and the sticky bit.
        assert_eq!(a.mode, 0o41777);
        assert_eq!(a.nlink, 2);
        assert_eq!(a.size, 4096);
        assert_eq!(stat(&b, "").nlink, 3);
        b.mkdir(b"d/e/", 0o755).unwrap();
        assert_eq!(stat(&b, "d").nlink, 3);
        mkfile(&b, "f", b"");
        b.symlink(b"nowhere", b"dang").unwrap();
        for p in ["d", "f", "dang", "d/.", "d/..", "", "/", "f/"] {
            assert_eq!(errno(b.mkdir(p.as_bytes(), 0o755)), libc::EEXIST, "{p}");
        }
        assert_eq!(errno(b.mkdir(b"x/y", 0o755)), libc::ENOENT);
        assert_eq!(errno(b.mkdir(b"f/y", 0o755)), libc::ENOTDIR);
        // A set-group-ID directory passes on its group, and the bit to
        // subdirectories.
        b.chmod(Node::Path(b"d"), 0o2775).unwrap();
        b.chown(Node::Path(b"d"), u32::MAX, 4242).unwrap();
        let a = b.mkdir(b"d/sub", 0o755).unwrap();
        assert_eq!((a.gid, a.mode), (4242, 0o42755));
        let (_, a) = b.open(b"d/file", CREAT | WRONLY, 0o644).unwrap();
        assert_eq!((a.gid, a.mode), (4242, 0o100644));
        let a = b.symlink(b"x", b"d/link").unwrap();
        assert_eq!(a.gid, 4242);
        assert_eq!(b.mkdir(b"plain", 0o755).unwrap().gid, rustix::process::getegid().as_raw());
    }

    #[test]
    fn rmdir_semantics() {
        let b = MemoryBackend::new();
        b.mkdir(b"d", 0o755).unwrap();
        b.mkdir(b"d/e", 0o755).unwrap();
        mkfile(&b, "f", b"");
        b.symlink(b"d", b"ld").unwrap();
        assert_eq!(errno(b.rmdir(b"d")), libc::ENOTEMPTY);
        assert_eq!(errno(b.rmdir(b"f")), libc::ENOTDIR);
        assert_eq!(errno(b.rmdir(b"ld")), libc::ENOTDIR);
        assert_eq!(errno(b.rmdir(b"d/.")), libc::EINVAL);
        assert_eq!(errno(b.rmdir(b".")), libc::EINVAL);
        assert_eq!(errno(b.rmdir(b"d/e/..")), libc::ENOTEMPTY);
        assert_eq!(errno(b.rmdir(b"")), libc::EBUSY);
        assert_eq!(errno(b.rmdir(b"/")), libc::EBUSY);
        assert_eq!(errno(b.rmdir(b"missing")), libc::ENOENT);
        assert_eq!(stat(&b, "d").nlink, 3);
        let before = stat(&b, "d");
        tick();
        b.rmdir(b"d/e/").unwrap();
        let a = stat(&b, "d");
        assert_eq!(a.nlink, 2);
        assert!(later(a.mtime, before.mtime));
        b.rmdir(b"ld/").unwrap_err();
        b.rmdir(b"d").unwrap();
        assert_eq!(stat(&b, "").nlink, 2);
        assert_eq!(list(&b, ""), [".", "..", "f", "ld"]);
    }

    #[test]
    fn unlink_semantics() {
        let b = MemoryBackend::new();
        b.mkdir(b"d", 0o755).unwrap();
        mkfile(&b, "f", b"data");
        b.symlink(b"d", b"ld").unwrap();
        assert_eq!(errno(b.unlink(b"d")), libc::EISDIR);
        assert_eq!(errno(b.unlink(b"d/")), libc::EISDIR);
        assert_eq!(errno(b.unlink(b"d/.")), libc::EISDIR);
        assert_eq!(errno(b.unlink(b"")), libc::EISDIR);
        assert_eq!(errno(b.unlink(b"f/")), libc::ENOTDIR);
        assert_eq!(errno(b.unlink(b"ld/")), libc::ENOTDIR);
        assert_eq!(errno(b.unlink(b"missing/")), libc::ENOENT);
        assert_eq!(errno(b.unlink(b"missing")), libc::ENOENT);
        // The link goes, not its target.
        b.unlink(b"ld").unwrap();
        stat(&b, "d");
        // An open file outlives its name.
        let used = b.statfs(b"").unwrap();
        let f = open(&b, "f", RDWR);
        let before = stat(&b, "f");
        tick();
        b.unlink(b"f").unwrap();
        assert_eq!(errno(b.getattr(Node::Path(b"f"))), libc::ENOENT);
        let a = b.getattr(Node::File(&f)).unwrap();
        assert_eq!(a.nlink, 0);
        assert!(later(a.ctime, before.ctime));
        assert_eq!(b.write(&f, 4, b" more").unwrap(), 9);
        assert_eq!(read_at(&b, &f, 0, 100), b"data more");
        assert_eq!(b.statfs(b"").unwrap().ffree, used.ffree);
        drop(f);
        assert_eq!(b.statfs(b"").unwrap().ffree, used.ffree + 1);
        assert_eq!(list(&b, ""), [".", "..", "d"]);
    }

    #[test]
    fn rename_files() {
        let b = MemoryBackend::new();
        mkfile(&b, "a", b"A");
        mkfile(&b, "b", b"B");
        let ia = stat(&b, "a").ino;
        let f = open(&b, "b", RDONLY);
        tick();
        let before = stat(&b, "");
        b.rename(b"a", b"b", 0).unwrap();
        assert_eq!(contents(&b, "b"), b"A");
        assert_eq!(stat(&b, "b").ino, ia);
        assert_eq!(errno(b.getattr(Node::Path(b"a"))), libc::ENOENT);
        // The replaced file lives on through its handle, with no links.
        assert_eq!(b.getattr(Node::File(&f)).unwrap().nlink, 0);
        assert_eq!(read_at(&b, &f, 0, 10), b"B");
        let after = stat(&b, "");
        assert!(later(after.mtime, before.mtime));
        assert!(later(stat(&b, "b").ctime, before.ctime));
        // Same file under two names: nothing happens.
        b.link(b"b", b"c").unwrap();
        b.rename(b"b", b"c", 0).unwrap();
        assert_eq!(stat(&b, "b").nlink, 2);
        assert_eq!(list(&b, ""), [".", "..", "b", "c"]);
        b.rename(b"b", b"b", 0).unwrap();
        assert_eq!(errno(b.rename(b"b", b"b", RENAME_NOREPLACE)), libc::EEXIST);
        assert_eq!(errno(b.rename(b"b", b"c", RENAME_NOREPLACE)), libc::EEXIST);
        b.rename(b"b", b"z", RENAME_NOREPLACE).unwrap();
        assert_eq!(errno(b.rename(b"missing", b"q", 0)), libc::ENOENT);
        assert_eq!(errno(b.rename(b"missing", b"z", RENAME_NOREPLACE)), libc::ENOENT);
        assert_eq!(errno(b.rename(b"z", b"q/", 0)), libc::ENOTDIR);
        assert_eq!(errno(b.rename(b"z/", b"q", 0)), libc::ENOTDIR);
        assert_eq!(errno(b.rename(b"z", b"nodir/q", 0)), libc::ENOENT);
        assert_eq!(errno(b.rename(b".", b"q", 0)), libc::EBUSY);
        assert_eq!(errno(b.rename(b"", b"q", 0)), libc::EBUSY);
        assert_eq!(errno(b.rename(b"z", b".", 0)), libc::EBUSY);
        assert_eq!(errno(b.rename(b"z", b".", RENAME_NOREPLACE)), libc::EEXIST);
        assert_eq!(errno(b.rename(b"z", b"c", 3)), libc::EINVAL);
        assert_eq!(errno(b.rename(b"z", b"c", 4)), libc::EINVAL);
        assert_eq!(errno(b.rename(b"z", b"c", 8)), libc::EINVAL);
        // A symlink moves as itself.
        b.symlink(b"z", b"l").unwrap();
        b.rename(b"l", b"m", 0).unwrap();
        assert_eq!(b.readlink(b"m").unwrap(), "z".as_bytes());
        // Renaming within a directory re-lists the name at the end.
        assert_eq!(list(&b, ""), [".", "..", "c", "z", "m"]);
    }

    #[test]
    fn rename_directories() {
        let b = MemoryBackend::new();
        b.mkdir(b"a", 0o755).unwrap();
        b.mkdir(b"a/b", 0o755).unwrap();
        b.mkdir(b"a/b/c", 0o755).unwrap();
        b.mkdir(b"e", 0o755).unwrap();
        mkfile(&b, "f", b"");
        assert_eq!(errno(b.rename(b"a", b"a/b/x", 0)), libc::EINVAL);
        assert_eq!(errno(b.rename(b"a", b"a/x", 0)), libc::EINVAL);
        assert_eq!(errno(b.rename(b"a/b", b"a", 0)), libc::ENOTEMPTY);
        assert_eq!(errno(b.rename(b"a/b/c", b"a", 0)), libc::ENOTEMPTY);
        assert_eq!(errno(b.rename(b"a/b/c", b"a", RENAME_EXCHANGE)), libc::EINVAL);
        assert_eq!(errno(b.rename(b"a", b"a/b", RENAME_EXCHANGE)), libc::EINVAL);
        assert_eq!(errno(b.rename(b"f", b"a", 0)), libc::EISDIR);
        assert_eq!(errno(b.rename(b"a", b"f", 0)), libc::ENOTDIR);
        assert_eq!(errno(b.rename(b"e", b"a", 0)), libc::ENOTEMPTY);
        b.rename(b"a/b", b"a/b", 0).unwrap();
        // Move a directory to another parent: link counts and `..` follow.
        let ib = stat(&b, "a/b").ino;
        b.rename(b"a/b", b"e/b2/", 0).unwrap();
        assert_eq!(stat(&b, "a").nlink, 2);
        assert_eq!(stat(&b, "e").nlink, 3);
        assert_eq!(stat(&b, "e/b2").ino, ib);
        assert_eq!(stat(&b, "e/b2/c/../..").ino, stat(&b, "e").ino);
        let d = open(&b, "e/b2", RDONLY);
        let (ents, _) = b.readdir(&d, 0, 2, false).unwrap();
        assert_eq!(ents[1].ino, stat(&b, "e").ino);
        // Replace an empty directory.
        let ia = stat(&b, "a").ino;
        let root_links = stat(&b, "").nlink;
        b.rename(b"a", b"e/b2/c", 0).unwrap();
        assert_eq!(stat(&b, "e/b2/c").ino, ia);
        assert_eq!(stat(&b, "").nlink, root_links - 1);
        assert_eq!(stat(&b, "e/b2").nlink, 3);
        // Same parent, dir over empty dir: the parent loses one link.
        b.mkdir(b"e/b2/x", 0o755).unwrap();
        assert_eq!(stat(&b, "e/b2").nlink, 4);
        b.rename(b"e/b2/x", b"e/b2/c", 0).unwrap();
        assert_eq!(stat(&b, "e/b2").nlink, 3);
        // A moved directory's ctime changes.
        let before = stat(&b, "e/b2");
        tick();
        b.rename(b"e/b2", b"top", 0).unwrap();
        assert!(later(stat(&b, "top").ctime, before.ctime));
        assert_eq!(stat(&b, "top/..").ino, 1);
    }

    #[test]
    fn rename_exchange() {
        let b = MemoryBackend::new();
        b.mkdir(b"d1", 0o755).unwrap();
        b.mkdir(b"d2", 0o755).unwrap();
        b.mkdir(b"d1/sub", 0o755).unwrap();
        mkfile(&b, "d2/file", b"F");
        let (isub, ifile) = (stat(&b, "d1/sub").ino, stat(&b, "d2/file").ino);
        assert_eq!(errno(b.rename(b"d1/sub", b"d2/none", RENAME_EXCHANGE)), libc::ENOENT);
        assert_eq!(errno(b.rename(b"d2/file/", b"d1/sub", RENAME_EXCHANGE)), libc::ENOTDIR);
        assert_eq!(errno(b.rename(b"d1/sub", b"d2/file/", RENAME_EXCHANGE)), libc::ENOTDIR);
        b.rename(b"d1/sub", b"d2/file", RENAME_EXCHANGE).unwrap();
        assert_eq!(stat(&b, "d1/sub").ino, ifile);
        assert_eq!(stat(&b, "d2/file").ino, isub);
        assert_eq!(stat(&b, "d1").nlink, 2);
        assert_eq!(stat(&b, "d2").nlink, 3);
        assert_eq!(stat(&b, "d2/file/..").ino, stat(&b, "d2").ino);
        assert_eq!(contents(&b, "d1/sub"), b"F");
        // Names keep their places in the listing.
        mkfile(&b, "x", b"X");
        mkfile(&b, "y", b"Y");
        b.rename(b"x", b"y", RENAME_EXCHANGE).unwrap();
        assert_eq!(contents(&b, "x"), b"Y");
        assert_eq!(list(&b, ""), [".", "..", "d1", "d2", "x", "y"]);
        b.rename(b"x", b"x", RENAME_EXCHANGE).unwrap();
        assert_eq!(contents(&b, "x"), b"Y");
    }

    #[test]
    fn deep_tree_drops_without_recursion() {
        let b = MemoryBackend::new();
        b.mkdir(b"a", 0o755).unwrap();
        // Renames build a chain deeper than any path could name.
        for _ in 0..200_000 {
            b.mkdir(b"t", 0o755).unwrap();
            b.rename(b"a", b"t/a", 0).unwrap();
            b.rename(b"t", b"a", 0).unwrap();
        }
        assert_eq!(b.statfs(b"").unwrap().files - b.statfs(b"").unwrap().ffree, 200_002);
        drop(b);
    }

    #[test]
    fn link_semantics() {
        let b = MemoryBackend::new();
        mkfile(&b, "f", b"x");
        b.mkdir(b"d", 0o755).unwrap();
        b.symlink(b"f", b"lf").unwrap();
        let before = stat(&b, "f");
        tick();
        let a = b.link(b"f", b"d/g").unwrap();
        assert_eq!(a.ino, before.ino);
        assert_eq!(a.nlink, 2);
        assert!(later(a.ctime, before.ctime));
        assert_eq!(stat(&b, "d/g").nlink, 2);
        assert_eq!(errno(b.link(b"d", b"dl")), libc::EPERM);
        assert_eq!(errno(b.link(b".", b"dl")), libc::EPERM);
        assert_eq!(errno(b.link(b"d", b"f")), libc::EEXIST);
        assert_eq!(errno(b.link(b"f", b"d/g")), libc::EEXIST);
        assert_eq!(errno(b.link(b"f", b"new/")), libc::ENOENT);
        assert_eq!(errno(b.link(b"f", b"d/..")), libc::EEXIST);
        assert_eq!(errno(b.link(b"missing", b"x")), libc::ENOENT);
        assert_eq!(errno(b.link(b"f/", b"x")), libc::ENOTDIR);
        // A hard link to a symlink is to the link itself.
        let a = b.link(b"lf", b"lf2").unwrap();
        assert_eq!(a.mode, 0o120777);
        assert_eq!(lstat(&b, "lf").nlink, 2);
        b.unlink(b"f").unwrap();
        assert_eq!(contents(&b, "d/g"), b"x");
        assert_eq!(stat(&b, "d/g").nlink, 1);
    }

    #[test]
    fn symlink_and_readlink() {
        let b = MemoryBackend::new();
        mkfile(&b, "f", b"");
        b.mkdir(b"d", 0o755).unwrap();
        let a = b.symlink(b"some/target", b"l").unwrap();
        assert_eq!((a.mode, a.size, a.nlink, a.blocks), (0o120777, 11, 1, 0));
        assert_eq!(b.readlink(b"l").unwrap(), "some/target".as_bytes());
        assert_eq!(b.readlink(b"/l").unwrap(), "some/target".as_bytes());
        assert_eq!(errno(b.symlink(b"x", b"l")), libc::EEXIST);
        assert_eq!(errno(b.symlink(b"x", b"f")), libc::EEXIST);
        assert_eq!(errno(b.symlink(b"x", b"f/")), libc::EEXIST);
        assert_eq!(errno(b.symlink(b"x", b"new/")), libc::ENOENT);
        assert_eq!(errno(b.symlink(b"x", b"d/.")), libc::EEXIST);
        assert_eq!(errno(b.symlink(b"", b"e")), libc::ENOENT);
        assert_eq!(errno(b.symlink("x".repeat(4096).as_bytes(), b"e")), libc::ENAMETOOLONG);
        assert_eq!(errno(b.readlink(b"f")), libc::EINVAL);
        assert_eq!(errno(b.readlink(b"d")), libc::EINVAL);
        assert_eq!(errno(b.readlink(b"")), libc::EINVAL);
        assert_eq!(errno(b.readlink(b"missing")), libc::ENOENT);
        b.symlink(b"f", b"lf").unwrap();
        b.symlink(b"d", b"ld").unwrap();
        assert_eq!(errno(b.readlink(b"lf/")), libc::ENOTDIR);
        assert_eq!(errno(b.readlink(b"ld/")), libc::EINVAL);
        b.symlink(b"../lf", b"d/up").unwrap();
        assert_eq!(b.readlink(b"ld/up").unwrap(), "../lf".as_bytes());
        assert_eq!(stat(&b, "d/up").ino, stat(&b, "f").ino);
    }

    #[test]
    fn statfs_and_access() {
        let b = MemoryBackend::new();
        let s = b.statfs(b"").unwrap();
        assert_eq!((s.bsize, s.frsize, s.namemax), (4096, 4096, 255));
        assert_eq!(s.blocks, BUDGET / 4096);
        assert_eq!(s.bfree, s.blocks);
        assert_eq!(s.files - s.ffree, 1);
        mkfile(&b, "f", &vec![1; 1 << 20]);
        let s2 = b.statfs(b"f").unwrap();
        assert_eq!(s.bfree - s2.bfree, 256);
        assert_eq!(s.ffree - s2.ffree, 1);
        b.unlink(b"f").unwrap();
        assert_eq!(b.statfs(b"/").unwrap(), s);
        assert_eq!(errno(b.statfs(b"missing")), libc::ENOENT);

        mkfile(&b, "f", b"");
        b.mkdir(b"d", 0o000).unwrap();
        b.symlink(b"f", b"lf").unwrap();
        b.chmod(Node::Path(b"f"), 0o000).unwrap();
        for m in [0, 2, 4, 6] {
            b.access(b"f", m).unwrap();
        }
        assert_eq!(errno(b.access(b"f", 1)), libc::EACCES);
        assert_eq!(errno(b.access(b"lf", 1)), libc::EACCES);
        b.access(b"d", 7).unwrap();
        b.chmod(Node::Path(b"f"), 0o001).unwrap();
        b.access(b"f", 1).unwrap();
        assert_eq!(errno(b.access(b"f", 8)), libc::EINVAL);
        assert_eq!(errno(b.access(b"missing", 0)), libc::ENOENT);
    }

    #[test]
    fn xattrs() {
        let b = MemoryBackend::new();
        mkfile(&b, "f", b"");
        b.mkdir(b"d", 0o755).unwrap();
        b.symlink(b"f", b"lf").unwrap();
        let before = stat(&b, "f");
        tick();
        b.setxattr(Node::Path(b"f"), b"user.a", b"1", 0).unwrap();
        assert!(later(stat(&b, "f").ctime, before.ctime));
        b.setxattr(Node::Path(b"f"), b"trusted.t", b"", 0).unwrap();
        b.setxattr(Node::Path(b"f"), b"security.s", b"sss", 0).unwrap();
        assert_eq!(b.getxattr(Node::Path(b"f"), b"user.a").unwrap(), b"1");
        assert_eq!(b.getxattr(Node::Path(b"lf"), b"trusted.t").unwrap(), b"");
        assert_eq!(b.listxattr(Node::Path(b"f")).unwrap(), b"security.s\0trusted.t\0user.a\0");
        assert_eq!(errno(b.setxattr(Node::Path(b"f"), b"user.a", b"2", XATTR_CREATE)), libc::EEXIST);
        assert_eq!(errno(b.setxattr(Node::Path(b"f"), b"user.b", b"2", XATTR_REPLACE)), libc::ENODATA);
        assert_eq!(errno(b.setxattr(Node::Path(b"f"), b"user.b", b"2", 3)), libc::ENODATA);
        assert_eq!(errno(b.setxattr(Node::Path(b"f"), b"user.b", b"2", 4)), libc::EINVAL);
        b.setxattr(Node::Path(b"f"), b"user.a", b"22", XATTR_REPLACE).unwrap();
        assert_eq!(b.getxattr(Node::Path(b"f"), b"user.a").unwrap(), b"22");
        b.setxattr(Node::Path(b"f"), b"user.b", b"3", XATTR_CREATE).unwrap();
        assert_eq!(errno(b.getxattr(Node::Path(b"f"), b"user.zz")), libc::ENODATA);
        assert_eq!(errno(b.removexattr(Node::Path(b"f"), b"user.zz")), libc::ENODATA);
        b.removexattr(Node::Path(b"f"), b"user.b").unwrap();
        assert_eq!(errno(b.getxattr(Node::Path(b"f"), b"user.b")), libc::ENODATA);
        // Names.
        for (name, e) in [
            ("", libc::ERANGE),
            ("user.", libc::EINVAL),
            ("foo.a", libc::EOPNOTSUPP),
            ("system.posix_acl_access", libc::EOPNOTSUPP),
            ("user", libc::EOPNOTSUPP),
        ] {
            assert_eq!(errno(b.setxattr(Node::Path(b"f"), name.as_bytes(), b"v", 0)), e, "{name}");
            assert_eq!(errno(b.getxattr(Node::Path(b"f"), name.as_bytes())), e, "{name}");
            assert_eq!(errno(b.removexattr(Node::Path(b"f"), name.as_bytes())), e, "{name}");
        }
        let long = format!("user.{}", "n".repeat(250));
        b.setxattr(Node::Path(b"f"), long.as_bytes(), b"v", 0).unwrap();
        let too_long = format!("user.{}", "n".repeat(251));
        assert_eq!(errno(b.setxattr(Node::Path(b"f"), too_long.as_bytes(), b"v", 0)), libc::ERANGE);
        // Values.
        let big = vec![9; XATTR_SIZE_MAX];
        b.setxattr(Node::Path(b"d"), b"user.big", &big, 0).unwrap();
        assert_eq!(b.getxattr(Node::Path(b"d"), b"user.big").unwrap(), big);
        assert_eq!(errno(b.setxattr(Node::Path(b"d"), b"user.big", &vec![0; XATTR_SIZE_MAX + 1], 0)), libc::E2BIG);
        // user.* is only for files and directories.
        assert_eq!(errno(b.setxattr(Node::PathNoFollow(b"lf"), b"user.a", b"v", 0)), libc::EPERM);
        assert_eq!(errno(b.setxattr(Node::PathNoFollow(b"lf"), b"user.", b"v", 0)), libc::EPERM);
        assert_eq!(errno(b.getxattr(Node::PathNoFollow(b"lf"), b"user.a")), libc::ENODATA);
        assert_eq!(errno(b.removexattr(Node::PathNoFollow(b"lf"), b"user.a")), libc::EPERM);
        b.setxattr(Node::PathNoFollow(b"lf"), b"trusted.x", b"v", 0).unwrap();
        assert_eq!(b.listxattr(Node::PathNoFollow(b"lf")).unwrap(), b"trusted.x\0");
        assert_eq!(b.getxattr(Node::Path(b"lf"), b"user.a").unwrap(), b"22");
        // Through a handle, whatever its access mode.
        let r = open(&b, "f", RDONLY);
        b.setxattr(Node::File(&r), b"user.h", b"h", 0).unwrap();
        assert_eq!(b.getxattr(Node::Path(b"f"), b"user.h").unwrap(), b"h");
        assert_eq!(errno(b.listxattr(Node::Path(b"missing"))), libc::ENOENT);
        // Attribute bytes count against the budget and come back.
        let free = b.statfs(b"").unwrap().bfree;
        b.removexattr(Node::Path(b"d"), b"user.big").unwrap();
        assert_eq!(b.statfs(b"").unwrap().bfree, free + 16);
    }

    #[test]
    fn out_of_space() {
        let b = MemoryBackend::new();
        let f = open(&b, "f", CREAT | RDWR);
        // Pretend the budget is nearly spent.
        b.shared.bytes.store(BUDGET - 10, Ordering::Relaxed);
        assert_eq!(b.write(&f, 0, b"0123456789").unwrap(), 10);
        assert_eq!(errno(b.write(&f, 10, b"x")), libc::ENOSPC);
        // Overwriting allocated bytes needs no new space.
        assert_eq!(b.write(&f, 0, b"abc").unwrap(), 3);
        assert_eq!(errno(b.setxattr(Node::File(&f), b"user.x", b"", 0)), libc::ENOSPC);
        b.truncate(Node::File(&f), 0).unwrap();
        assert_eq!(b.shared.bytes.load(Ordering::Relaxed), BUDGET - 10);
        b.shared.inodes.store(MAX_INODES, Ordering::Relaxed);
        assert_eq!(errno(b.mkdir(b"d", 0o755)), libc::ENOSPC);
        assert_eq!(errno(b.open(b"g", CREAT | RDWR, 0o644)), libc::ENOSPC);
        assert_eq!(list(&b, ""), [".", "..", "f"]);
    }

    #[test]
    fn concurrent_use() {
        let b = Arc::new(MemoryBackend::new());
        b.mkdir(b"shared", 0o755).unwrap();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let b = b.clone();
                std::thread::spawn(move || {
                    let dir = format!("t{t}");
                    b.mkdir(dir.as_bytes(), 0o755).unwrap();
                    for i in 0..200 {
                        let p = format!("{dir}/f{i}");
                        let f = open(&b, &p, CREAT | RDWR);
                        b.write(&f, 0, p.as_bytes()).unwrap();
                        assert_eq!(read_at(&b, &f, 0, 100), p.as_bytes());
                        let q = format!("shared/{t}-{i}");
                        b.rename(p.as_bytes(), q.as_bytes(), 0).unwrap();
                        if i % 2 == 0 {
                            b.unlink(q.as_bytes()).unwrap();
                        }
                    }
                    b.rmdir(dir.as_bytes()).unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let names = list(&b, "shared");
        assert_eq!(names.len(), 2 + 8 * 100);
        assert_eq!(stat(&b, "").nlink, 3);
        assert_eq!(contents(&b, "shared/3-7"), b"t3/f7");
    }

    #[test]
    fn inode_numbers_are_unique() {
        let b = MemoryBackend::new();
        let mut seen = std::collections::HashSet::new();
        seen.insert(1);
        for i in 0..100 {
            assert!(seen.insert(mkfile(&b, &format!("f{i}"), b"").ino));
            assert!(seen.insert(b.mkdir((format!("d{i}")).as_bytes(), 0o755).unwrap().ino));
            assert!(seen.insert(b.symlink(b"x", (format!("l{i}")).as_bytes()).unwrap().ino));
        }
    }
}
