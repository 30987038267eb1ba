//! One client's state and the request dispatch: turns a typed [`Request`]
//! into backend calls. Knows messages, not bytes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ferry_proto::{cache, caps, lock, Attr, DirEntry, Request, StatFs, Target};

use crate::backend::{Backend, Errno, Node, ReadData, Result};
pub use crate::budget::HandleBudget;
use crate::changes::Changes;
use crate::dirpolicy::{self, DirPolicies};
use crate::locks::{self, FileKey, LockTable, Mode, Owner, OwnerId};

/// Settings that shape what a session allows.
#[derive(Clone, Debug)]
pub struct Policy {
    /// Open handles of all sessions together.
    pub budget: Arc<HandleBudget>,
    pub read_only: bool,
    /// Whether clients may create character and block device nodes.
    pub allow_devices: bool,
    pub max_handles: usize,
    /// Capabilities in force for this session (both sides have them).
    pub caps: u64,
    /// Largest read reply the client accepts.
    pub max_read: u32,
    /// Record locks of all sessions together.
    pub locks: Arc<LockTable>,
    /// Generations behind the change attribute, of all sessions together.
    pub changes: Arc<Changes>,
    /// Cache policies of directories, remembered.
    pub dirs: Arc<DirPolicies>,
    /// The server's key for the file ids it gives (`fileseal`).
    pub seals: Arc<crate::fileseal::Seals>,
}

/// What a request produced. `Read` hands the connection the handle, which
/// reads from it (`sendfile`) and moves its offset.
pub enum Answer<F> {
    Empty,
    Opened {
        handle: u64,
        attr: Attr,
    },
    OpenedId {
        handle: u64,
        attr: Attr,
        id: Vec<u8>,
    },
    OpenedData {
        handle: u64,
        attr: Attr,
        id: Vec<u8>,
        data: Vec<u8>,
    },
    OpenedCached {
        handle: u64,
        attr: Attr,
        id: Vec<u8>,
        change: u64,
        policy: u8,
        from: Vec<u8>,
        data: Vec<u8>,
    },
    CachePolicy {
        policy: u8,
        from: Vec<u8>,
    },
    Read(Cursor<F>, usize),
    Written(u32),
    Offset(u64),
    Attr(Attr),
    Name(Vec<u8>),
    StatFs(StatFs),
    Xattr {
        size: u32,
        value: Vec<u8>,
    },
    Dir {
        eof: bool,
        entries: Vec<DirEntry>,
    },
    /// `GetLock`: the conflicting lock (`typ` `F_UNLCK` when none).
    Lock {
        typ: u8,
        start: u64,
        len: u64,
        pid: u32,
    },
}

struct Handle<F> {
    /// Shared with a commit running beside later requests (see `commit`).
    file: Arc<F>,
    /// The shared file offset that `Read`, `Write` and `Seek` use. One
    /// request at a time uses a handle's offset: a connection never runs
    /// two requests on one handle at once (`conn`), and clients send these
    /// three on one connection only.
    offset: AtomicU64,
    is_dir: bool,
    /// `(dev, ino)`, where record locks live.
    key: FileKey,
    /// `O_ACCMODE` bits of the open: a write lock needs write access.
    acc: u32,
    /// Whether an OFD or `flock` lock may be held through this handle.
    locked: AtomicBool,
    /// The file's generation, for a handle that may change its data.
    gen: Option<Arc<AtomicU64>>,
    /// Its descriptor went to a client on this host (`FileFd`), whose
    /// writes through it this server does not see: its close counts one.
    lent: AtomicBool,
    /// While it lives, nobody is granted a lease on the file (`lend`).
    lent_mark: std::sync::OnceLock<crate::leases::LentMark>,
    /// Opened with `O_APPEND`: its `Write`s are changes that must not run
    /// twice (where they land depends on what ran before).
    append: bool,
}

/// A handle's file and offset, for a `Read` the connection makes outside
/// the session.
pub struct Cursor<F>(Arc<Handle<F>>);

impl<F> Cursor<F> {
    pub fn file(&self) -> &F {
        &self.0.file
    }

    pub fn offset(&self) -> u64 {
        self.0.offset.load(Ordering::Relaxed)
    }

    /// Moves the offset past `n` bytes read.
    pub fn advance(&self, n: usize) {
        self.0.offset.fetch_add(n as u64, Ordering::Relaxed);
    }
}

impl<F> Handle<F> {
    fn changed(&self) {
        if let Some(g) = &self.gen {
            g.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A session's state. Requests of a session run side by side (several
/// connections, and several threads of one connection: `conn`), so what
/// changes is behind locks held for a lookup or an insert, never across a
/// backend call: a request waiting for a slow disk or a stalled network
/// file system holds up no other.
pub struct Session<B: Backend> {
    backend: Arc<B>,
    policy: Policy,
    table: Mutex<Table<B::File>>,
    /// This session's part of every lock owner it creates.
    conn: u64,
    /// Whether this session ever took a lock (so its end must release).
    locked: AtomicBool,
    /// Requests that must not run twice run one at a time, holding this
    /// from the look into the reply cache to the reply kept: a request
    /// sent again (after a lost connection) finds its first run finished.
    pub once: Mutex<Once>,
    /// Its leases, once a connection of it turned them on (`LeaseOn`).
    pub lease: std::sync::OnceLock<Arc<crate::leases::Holder>>,
    /// Its fence (`SessionFence`), if its client named one.
    fence: Mutex<Option<Arc<crate::fence::Fence>>>,
}

struct Table<F> {
    handles: HashMap<u64, Arc<Handle<F>>>,
    next_handle: u64,
    /// Who its requests' caller slots name, resolved (`IDENTITY`).
    callers: HashMap<u16, crate::identity::Creds>,
}

/// A session's exactly-once state.
#[derive(Default)]
pub struct Once {
    /// Replies to its latest requests that must not run twice.
    pub replies: crate::replay::Replies,
    /// Where they outlive the process (`--state-dir`), once registered.
    pub log: Option<crate::journal::SessionLog>,
}

/// A handle held by a request, whatever happens to the table meanwhile.
type OneHandle<F> = Arc<Handle<F>>;

/// An open that brought the file's first bytes.
struct ReadOpen<F> {
    handle: u64,
    attr: Attr,
    id: Vec<u8>,
    data: Vec<u8>,
    held: OneHandle<F>,
}

/// A request's target, its handle (if any) held.
enum Held<'t, F> {
    Handle(Arc<Handle<F>>),
    Path(&'t [u8]),
    PathNoFollow(&'t [u8]),
}

impl<F> Held<'_, F> {
    fn node(&self) -> Node<'_, F> {
        match self {
            Held::Handle(h) => Node::File(&h.file),
            Held::Path(p) => Node::Path(p),
            Held::PathNoFollow(p) => Node::PathNoFollow(p),
        }
    }
}

/// Most caller slots a session names (PROTOCOL.md 8.8).
const MAX_CALLERS: usize = 1024;

/// A random first handle id below 2^47: a client that reconnects to a new
/// session (the server restarted, or its lease ran out) and still sends an
/// old handle meets `EBADF`, never another file that took the same number.
fn first_handle() -> u64 {
    let mut b = [0u8; 8];
    // Weak randomness only makes a coincidence likelier.
    let _ = getrandom::getrandom(&mut b);
    (u64::from_le_bytes(b) >> 17).max(1)
}

/// Most bytes an `OpenRead` returns, whatever the client asks for.
const OPEN_READ_MAX: usize = 1 << 20;

/// A read's bytes in memory (an `OpenRead` reply carries them inline).
fn bytes_of(d: ReadData<'_>) -> Result<Vec<u8>> {
    match d {
        ReadData::Bytes(b) => Ok(b),
        ReadData::Fd { fd, offset, len } => {
            let mut buf = vec![0u8; len];
            let mut got = 0;
            while got < len {
                match rustix::io::pread(fd, &mut buf[got..], offset + got as u64)? {
                    0 => break,
                    n => got += n,
                }
            }
            buf.truncate(got);
            Ok(buf)
        }
    }
}

/// Largest directory batch, whatever the client asks for.
const READDIR_MAX: usize = 4096;

impl<B: Backend> Session<B> {
    pub fn new(backend: Arc<B>, policy: Policy) -> Self {
        Session {
            backend,
            policy,
            table: Mutex::new(Table { handles: HashMap::new(), next_handle: first_handle(), callers: HashMap::new() }),
            conn: locks::new_conn_id(),
            locked: AtomicBool::new(false),
            once: Mutex::default(),
            fence: Mutex::default(),
            lease: std::sync::OnceLock::new(),
        }
    }

    /// `(dev, ino)` and file type of what `path` names, not following a
    /// final symlink (for leases: what a change touches).
    pub fn lstat_key(&self, path: &[u8]) -> Option<(FileKey, u32)> {
        let a = self.backend.getattr(Node::PathNoFollow(path)).ok()?;
        Some(((a.dev, a.ino), a.mode & libc::S_IFMT))
    }

    /// `(dev, ino)` of a handle whose descriptor was lent for writing.
    pub fn lent_key(&self, handle: u64) -> Option<FileKey> {
        self.handle(handle).ok().filter(|h| h.lent.load(Ordering::Relaxed)).map(|h| h.key)
    }

    /// `(dev, ino)` of an open handle's file.
    pub fn handle_key(&self, handle: u64) -> Option<FileKey> {
        self.handle(handle).ok().map(|h| h.key)
    }

    /// Whether an open handle of this session was opened for writing.
    pub fn handle_writable(&self, handle: u64) -> bool {
        self.handle(handle).is_ok_and(|h| h.acc != libc::O_RDONLY as u32)
    }

    /// The owner of what a target names (looked up with the ids worn).
    pub fn owner_of(&self, t: &Target<'_>) -> Option<u32> {
        let a = match *t {
            Target::Handle(h) => self.backend.getattr(Node::File(&self.handle(h).ok()?.file)),
            Target::Path(p) => self.backend.getattr(Node::Path(p)),
            Target::PathNoFollow(p) => self.backend.getattr(Node::PathNoFollow(p)),
        };
        a.ok().map(|a| a.uid)
    }

    /// `(dev, ino)` of what a target names.
    pub fn target_key(&self, t: &Target<'_>) -> Option<FileKey> {
        match *t {
            Target::Handle(h) => self.handle_key(h),
            Target::Path(p) => self.backend.getattr(Node::Path(p)).ok().map(|a| (a.dev, a.ino)),
            Target::PathNoFollow(p) => self.lstat_key(p).map(|(k, _)| k),
        }
    }

    /// The session's fence, if it has one.
    pub fn fence(&self) -> Option<Arc<crate::fence::Fence>> {
        self.fence.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set_fence(&self, f: crate::fence::Fence) {
        *self.fence.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(f));
    }

    /// The id a client gets for `file`, open with attributes `attr`.
    fn sealed_id(&self, file: &B::File, attr: &Attr) -> Vec<u8> {
        let fh = self.backend.file_id(file);
        self.policy.seals.seal(&fh, (attr.dev, attr.ino))
    }

    /// For `Reopen`, run with the server's own ids: the file `id` names, if
    /// this server gave that id for `key` and the backend can find it
    /// by its id (a kernel file handle needs privileges to open). Nothing
    /// is opened for the caller yet.
    pub fn locate(&self, req: &Request<'_>) -> Option<B::File> {
        let Request::Reopen { dev, ino, id, path, .. } = *req else { return None };
        let fh = self.policy.seals.open(id, (dev, ino)).filter(|fh| !fh.is_empty())?;
        self.backend.locate(fh, path, (dev, ino)).ok()
    }

    /// `Reopen`, with the caller's ids: the file `locate` found, opened as
    /// a fresh open by the caller would be (the file's own permissions),
    /// or else the file at the path if it is still the one the client had.
    pub fn reopen(&self, req: &Request<'_>, found: Option<B::File>) -> Result<Answer<B::File>> {
        let Request::Reopen { flags, dev, ino, id, path } = *req else { return Err(Errno::INVAL) };
        self.file_ids()?;
        let flags = flags & !((libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC) as u32);
        let fh = self.policy.seals.open(id, (dev, ino)).unwrap_or_default();
        let (handle, attr, h) = self.open(flags, |b| b.reopen(found, fh, path, flags, (dev, ino)))?;
        Ok(Answer::OpenedId { handle, attr, id: self.sealed_id(&h.file, &attr) })
    }

    fn table(&self) -> MutexGuard<'_, Table<B::File>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The exactly-once state, held while a request that must not run
    /// twice runs.
    pub fn once(&self) -> MutexGuard<'_, Once> {
        self.once.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `Caller`: slot `slot` now names `creds`.
    pub fn name_caller(&self, slot: u16, creds: crate::identity::Creds) -> Result<()> {
        let mut t = self.table();
        if t.callers.len() >= MAX_CALLERS && !t.callers.contains_key(&slot) {
            return Err(Errno(libc::EUSERS));
        }
        t.callers.insert(slot, creds);
        Ok(())
    }

    /// Whom slot `slot` names; `ENOKEY` if no one (yet, or any more).
    pub fn caller(&self, slot: u16) -> Result<crate::identity::Creds> {
        self.table().callers.get(&slot).cloned().ok_or(Errno(libc::ENOKEY))
    }

    /// Whether `req` appends (a `Write` through a handle opened with
    /// `O_APPEND`): like a name-space change, it must not run twice.
    pub fn appends(&self, req: &Request<'_>) -> bool {
        match req {
            Request::Write { handle, .. } => self.handle(*handle).is_ok_and(|h| h.append),
            _ => false,
        }
    }

    /// Where the file of `handle` ends now.
    pub fn end_of(&self, handle: u64) -> Option<u64> {
        let h = self.handle(handle).ok()?;
        self.backend.getattr(Node::File(&h.file)).ok().map(|a| a.size)
    }

    /// Whether `data` is in the file of `handle` at `from` or after (up to
    /// 1 MiB further: other appenders' data may have come between): an
    /// append a dead server process started at that end of the file, found
    /// done.
    pub fn appended_since(&self, handle: u64, from: u64, data: &[u8]) -> bool {
        let Ok(h) = self.handle(handle) else { return false };
        let Some(end) = self.backend.getattr(Node::File(&h.file)).ok().map(|a| a.size) else { return false };
        let len = end.saturating_sub(from).min((1 << 20) + data.len() as u64) as usize;
        if data.is_empty() || len < data.len() {
            return false;
        }
        // The handle may be write-only: the file is read through a
        // read-only open of the same description's file (the server's own
        // descriptor, as the server), or through the backend.
        let mut bytes = vec![0u8; len];
        let got = match self.backend.fd_of(&h.file) {
            Some(fd) => {
                let proc = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
                rustix::fs::open(
                    proc.as_str(),
                    rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )
                .ok()
                .and_then(|r| rustix::io::pread(&r, &mut bytes, from).ok())
            }
            None => match self.backend.read(&h.file, from, len) {
                Ok(ReadData::Bytes(b)) => {
                    let n = b.len().min(len);
                    bytes[..n].copy_from_slice(&b[..n]);
                    Some(n)
                }
                _ => None,
            },
        };
        let Some(n) = got else { return false };
        bytes.truncate(n);
        bytes.windows(data.len()).any(|w| w == data)
    }

    /// The open file of handle `h`, to commit outside the session's lock.
    pub fn file_of(&self, h: u64) -> Result<Arc<B::File>> {
        self.handle(h).map(|x| Arc::clone(&x.file))
    }

    fn handle(&self, h: u64) -> Result<Arc<Handle<B::File>>> {
        self.table().handles.get(&h).cloned().ok_or(Errno::BADF)
    }

    fn writable(&self) -> Result<()> {
        if self.policy.read_only {
            Err(Errno::ROFS)
        } else {
            Ok(())
        }
    }

    fn cap(&self, bit: u64) -> bool {
        self.policy.caps & bit != 0
    }

    /// What a target names, a handle's file held for as long as the
    /// request runs (a `Close` meanwhile does not end it under the call).
    fn held<'t>(&self, t: &Target<'t>) -> Result<Held<'t, B::File>> {
        Ok(match *t {
            Target::Handle(h) => Held::Handle(self.handle(h)?),
            Target::Path(p) => Held::Path(p),
            Target::PathNoFollow(p) => Held::PathNoFollow(p),
        })
    }

    /// For a `Chmod` of `target` to `mode` refused to its caller: the file,
    /// opened as the caller, if the change only clears set-user-ID or
    /// set-group-ID bits of a regular file the caller may write — what the
    /// kernel lets any writer do (a FUSE mount asks for it before a write
    /// by a user without `CAP_FSETID`), so the server may then make it as
    /// itself, on this descriptor, without looking at the path again. Run
    /// with the caller's ids: the open for writing is the proof.
    pub fn setid_file(&self, target: &Target<'_>, mode: u32) -> Option<Arc<B::File>> {
        let only_clears = |a: &Attr| {
            const SETID: u32 = libc::S_ISUID | libc::S_ISGID;
            let (old, new) = (a.mode & 0o7777, mode & 0o7777);
            a.mode & libc::S_IFMT == libc::S_IFREG && new != old && new & !SETID == old & !SETID && new & !old == 0
        };
        let (file, attr) = match *target {
            Target::Handle(h) => {
                let h = self.handle(h).ok()?;
                if h.acc == libc::O_RDONLY as u32 {
                    return None;
                }
                let a = self.backend.getattr(Node::File(&h.file)).ok()?;
                (Arc::clone(&h.file), a)
            }
            Target::Path(p) | Target::PathNoFollow(p) => {
                // Looked at first, so that nothing but a regular file is
                // ever opened for this (a FIFO's open has effects).
                let follow = matches!(target, Target::Path(_));
                let node = if follow { Node::Path(p) } else { Node::PathNoFollow(p) };
                if !only_clears(&self.backend.getattr(node).ok()?) {
                    return None;
                }
                let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
                let flags = (libc::O_WRONLY | libc::O_NONBLOCK | libc::O_NOCTTY | nofollow) as u32;
                let (f, a) = self.backend.open(p, flags, 0).ok()?;
                (Arc::new(f), a)
            }
        };
        only_clears(&attr).then_some(file)
    }

    /// What a positional read or write needs to run outside the session's
    /// lock: the handle's file, with a write's checks made and its change
    /// counted here, as `execute` would.
    pub fn bulk_file(&self, req: &Request<'_>) -> Option<Result<(Arc<B::File>, usize)>> {
        match *req {
            Request::Pread { handle, count, .. } => Some(self.file_of(handle).map(|f| (f, self.clamp(count)))),
            Request::Pwrite { handle, data, .. } => Some(self.writable().and_then(|()| {
                let h = self.handle(handle)?;
                h.changed();
                Ok((Arc::clone(&h.file), data.len()))
            })),
            _ => None,
        }
    }

    /// `FileFd`: the open file of `handle`, to pass to a client on this
    /// host, and whether it was opened for writing. A change is counted now
    /// and at its close: the writes between go past the server.
    pub fn lend(&self, handle: u64, leases: &Arc<crate::leases::Leases>) -> Result<(Arc<B::File>, bool, FileKey)> {
        let h = self.handle(handle)?;
        if h.is_dir {
            return Err(Errno::ISDIR);
        }
        let writable = h.acc != libc::O_RDONLY as u32;
        if writable {
            self.writable()?;
            h.changed();
            h.lent.store(true, Ordering::Relaxed);
            h.lent_mark.get_or_init(|| leases.lend(h.key, self.lease.get()));
        }
        Ok((Arc::clone(&h.file), writable, h.key))
    }

    fn clamp(&self, count: u32) -> usize {
        count.min(self.policy.max_read) as usize
    }

    /// Executes one request. Handshake messages are the connection's job and
    /// are refused here.
    pub fn execute(&self, req: &Request<'_>) -> Result<Answer<B::File>> {
        let b = Arc::clone(&self.backend);
        match *req {
            // Connection-level requests: the connection answers them itself.
            Request::Hello { .. }
            | Request::Auth { .. }
            | Request::SessionNew
            | Request::SessionNewVolatile
            | Request::SessionAttach { .. }
            | Request::SessionFence { .. }
            | Request::LocalAddr
            | Request::LeaseOn
            | Request::LeaseReturn { .. }
            | Request::Caller { .. }
            | Request::FileFd { .. } => Err(Errno::INVAL),
            Request::Ping => Ok(Answer::Empty),
            Request::Open { path, flags, mode } => {
                let (handle, attr, _) = self.open(flags, |b| b.open(path, flags, mode))?;
                Ok(Answer::Opened { handle, attr })
            }
            Request::OpenId { path, flags, mode } => {
                self.file_ids()?;
                let (handle, attr, h) = self.open(flags, |b| b.open(path, flags, mode))?;
                Ok(Answer::OpenedId { handle, attr, id: self.sealed_id(&h.file, &attr) })
            }
            Request::OpenRead { path, flags, mode, max } => {
                if !self.cap(caps::OPEN_READ) {
                    return Err(Errno::NOSYS);
                }
                let ReadOpen { handle, attr, id, data, .. } = self.open_read(path, flags, mode, max)?;
                Ok(Answer::OpenedData { handle, attr, id, data })
            }
            Request::OpenCached { path, flags, mode, max } => {
                self.caching()?;
                // The attribute before the read: a change during it makes
                // the next open see another value, never this data under
                // an old one.
                let ReadOpen { handle, attr, id, data, held: h } = self.open_read(path, flags, mode, max)?;
                let change = self.policy.changes.attribute(&attr);
                let (policy, from) = self.cache_policy(path, Some(&h.file));
                Ok(Answer::OpenedCached { handle, attr, id, change, policy, from, data })
            }
            Request::CacheSet { path, policy } => {
                self.caching()?;
                self.writable()?;
                let node = Node::Path(path);
                self.policy.dirs.forget();
                match policy {
                    cache::NONE => match b.removexattr(node, CACHE_XATTR) {
                        Err(e) if e == Errno::NODATA => Ok(Answer::Empty),
                        r => r.map(|_| Answer::Empty),
                    },
                    p => b.setxattr(node, CACHE_XATTR, policy_name(p), 0).map(|_| Answer::Empty),
                }
            }
            Request::CacheGet { path } => {
                self.caching()?;
                b.getattr(Node::Path(path))?;
                let (policy, from) = self.cache_policy(path, None);
                Ok(Answer::CachePolicy { policy, from })
            }
            // The connection finds the file first (`locate`), as the server.
            Request::Reopen { .. } => self.reopen(req, None),
            Request::Close { handle } => {
                let h = self.table().handles.remove(&handle).ok_or(Errno::BADF)?;
                if h.lent.load(Ordering::Relaxed) {
                    h.changed();
                }
                if h.locked.load(Ordering::Relaxed) {
                    self.policy.locks.release(h.key, Owner { conn: self.conn, id: OwnerId::Handle(handle) });
                }
                self.policy.budget.give(1);
                Ok(Answer::Empty)
            }
            Request::Read { handle, count } => Ok(Answer::Read(Cursor(self.handle(handle)?), self.clamp(count))),
            Request::Write { handle, data } => {
                self.writable()?;
                let h = self.handle(handle)?;
                h.changed();
                h.offset.store(b.write(&h.file, h.offset.load(Ordering::Relaxed), data)?, Ordering::Relaxed);
                Ok(Answer::Written(data.len() as u32))
            }
            // The connection moves their data outside the session's lock
            // (`bulk_file`).
            Request::Pread { .. } | Request::Pwrite { .. } => Err(Errno::INVAL),
            Request::Seek { handle, offset, whence } => self.seek(handle, offset, whence),
            Request::Stat { target } => Ok(Answer::Attr(b.getattr(self.held(&target)?.node())?)),
            Request::Fsync { handle, datasync } => {
                b.fsync(&self.handle(handle)?.file, datasync)?;
                Ok(Answer::Empty)
            }
            Request::Truncate { target, size } => {
                self.writable()?;
                let attr = b.truncate(self.held(&target)?.node(), size)?;
                self.policy.changes.bump((attr.dev, attr.ino));
                Ok(Answer::Attr(attr))
            }
            Request::Mkdir { path, mode } => {
                self.writable()?;
                Ok(Answer::Attr(b.mkdir(path, mode)?))
            }
            Request::Mknod { path, mode, rdev } => {
                self.writable()?;
                let ifmt = mode & libc::S_IFMT;
                if (ifmt == libc::S_IFCHR || ifmt == libc::S_IFBLK) && !self.policy.allow_devices {
                    return Err(Errno::PERM);
                }
                Ok(Answer::Attr(b.mknod(path, mode, rdev)?))
            }
            Request::Rmdir { path } => {
                self.writable()?;
                b.rmdir(path).map(|_| Answer::Empty)
            }
            Request::Unlink { path } => {
                self.writable()?;
                b.unlink(path).map(|_| Answer::Empty)
            }
            Request::Rename { from, to, flags } => {
                self.writable()?;
                if flags != 0 && !self.cap(caps::RENAME_FLAGS) {
                    return Err(Errno::INVAL);
                }
                b.rename(from, to, flags).map(|_| Answer::Empty)
            }
            Request::Link { from, to } => {
                self.writable()?;
                Ok(Answer::Attr(b.link(from, to)?))
            }
            Request::Symlink { target, path } => {
                self.writable()?;
                Ok(Answer::Attr(b.symlink(target, path)?))
            }
            Request::Readlink { path } => Ok(Answer::Name(b.readlink(path)?)),
            Request::Chmod { target, mode } => {
                self.writable()?;
                Ok(Answer::Attr(b.chmod(self.held(&target)?.node(), mode)?))
            }
            Request::Chown { target, uid, gid } => {
                self.writable()?;
                Ok(Answer::Attr(b.chown(self.held(&target)?.node(), uid, gid)?))
            }
            Request::Utimens { target, atime, mtime } => {
                self.writable()?;
                Ok(Answer::Attr(b.utimens(self.held(&target)?.node(), atime, mtime)?))
            }
            Request::Statfs { path } => {
                let mut s = b.statfs(path)?;
                if self.policy.read_only {
                    s.flags |= libc::ST_RDONLY;
                }
                Ok(Answer::StatFs(s))
            }
            Request::Access { path, mode } => {
                if mode & libc::W_OK as u32 != 0 && self.policy.read_only {
                    b.access(path, libc::F_OK as u32)?;
                    return Err(Errno::ROFS);
                }
                b.access(path, mode).map(|_| Answer::Empty)
            }
            Request::GetXattr { target, name, size } => {
                self.xattr_cap()?;
                let v = b.getxattr(self.held(&target)?.node(), name)?;
                xattr_answer(v, size)
            }
            Request::SetXattr { target, name, value, flags } => {
                self.xattr_cap()?;
                self.writable()?;
                b.setxattr(self.held(&target)?.node(), name, value, flags).map(|_| Answer::Empty)
            }
            Request::ListXattr { target, size } => {
                self.xattr_cap()?;
                let v = b.listxattr(self.held(&target)?.node())?;
                xattr_answer(v, size)
            }
            Request::RemoveXattr { target, name } => {
                self.xattr_cap()?;
                self.writable()?;
                b.removexattr(self.held(&target)?.node(), name).map(|_| Answer::Empty)
            }
            Request::ReadDir { handle, cookie, max_entries, plus } => {
                let h = self.handle(handle)?;
                if !h.is_dir {
                    return Err(Errno::NOTDIR);
                }
                let plus = plus && self.cap(caps::READDIRPLUS);
                let max = (max_entries as usize).clamp(1, READDIR_MAX);
                let (entries, eof) = b.readdir(&h.file, cookie, max, plus)?;
                Ok(Answer::Dir { eof, entries })
            }
            Request::ListDir { path, max_entries, plus } => {
                if !self.cap(caps::LIST_DIR) {
                    return Err(Errno::NOSYS);
                }
                // A handle of its own for the length of the call, never
                // the session's (nothing to close, no budget taken).
                let flags = (libc::O_RDONLY | libc::O_DIRECTORY) as u32;
                let (dir, _) = b.open(path, flags, 0)?;
                let plus = plus && self.cap(caps::READDIRPLUS);
                let max = (max_entries as usize).clamp(1, READDIR_MAX);
                let (entries, eof) = b.readdir(&dir, 0, max, plus)?;
                Ok(Answer::Dir { eof, entries })
            }
            Request::Lock { handle, owner, start, len, pid, kind, typ } => {
                self.lock(handle, owner, (start, len), pid, kind, typ)
            }
            Request::GetLock { handle, owner, start, len, kind, typ, .. } => {
                self.get_lock(handle, owner, (start, len), kind, typ)
            }
        }
    }

    /// Checks a lock request and resolves its owner, file and range.
    fn lock_target(
        &self,
        handle: u64,
        owner: u64,
        start: u64,
        len: u64,
        kind: u8,
    ) -> Result<(Owner, FileKey, u64, u64, u32)> {
        if !self.cap(caps::LOCKS) {
            return Err(Errno(libc::ENOLCK));
        }
        let h = self.handle(handle)?;
        let id = if kind == lock::POSIX { OwnerId::Process(owner) } else { OwnerId::Handle(handle) };
        let (start, end) =
            if kind == lock::FLOCK { (0, u64::MAX) } else { locks::range(start, len).ok_or(Errno::INVAL)? };
        Ok((Owner { conn: self.conn, id }, h.key, start, end, h.acc))
    }

    fn lock(
        &self,
        handle: u64,
        owner: u64,
        (start, len): (u64, u64),
        pid: u32,
        kind: u8,
        typ: u8,
    ) -> Result<Answer<B::File>> {
        let (who, key, start, end, acc) = self.lock_target(handle, owner, start, len, kind)?;
        // flock needs no particular access mode; fcntl locks do.
        let checked = kind != lock::FLOCK;
        let mode = match typ {
            lock::RDLCK if checked && acc == libc::O_WRONLY as u32 => return Err(Errno::BADF),
            lock::WRLCK if checked && acc == libc::O_RDONLY as u32 => return Err(Errno::BADF),
            lock::RDLCK => Some(Mode::Read),
            lock::WRLCK => Some(Mode::Write),
            _ => None,
        };
        let h = self.handle(handle)?;
        let writable = acc != libc::O_RDONLY as u32;
        let file = self.backend.fd_of(&h.file).map(|fd| locks::OnFile { fd, writable });
        self.policy.locks.set(key, who, mode, start, end, pid, file).map_err(|_| Errno(libc::EAGAIN))?;
        if mode.is_some() {
            self.locked.store(true, Ordering::Relaxed);
            if let OwnerId::Handle(_) = who.id {
                h.locked.store(true, Ordering::Relaxed);
            }
        }
        Ok(Answer::Empty)
    }

    fn get_lock(
        &self,
        handle: u64,
        owner: u64,
        (start, len): (u64, u64),
        kind: u8,
        typ: u8,
    ) -> Result<Answer<B::File>> {
        let (who, key, start, end, _) = self.lock_target(handle, owner, start, len, kind)?;
        let mode = if typ == lock::WRLCK { Mode::Write } else { Mode::Read };
        let h = self.handle(handle)?;
        let file = self.backend.fd_of(&h.file);
        Ok(match self.policy.locks.test(key, who, mode, start, end, file) {
            None => Answer::Lock { typ: lock::UNLCK, start: 0, len: 0, pid: 0 },
            Some(l) => {
                let (start, len) = locks::start_len(l.start, l.end);
                let typ = if l.mode == Mode::Write { lock::WRLCK } else { lock::RDLCK };
                Answer::Lock { typ, start, len, pid: l.pid }
            }
        })
    }

    fn file_ids(&self) -> Result<()> {
        if self.cap(caps::FILE_IDS) {
            Ok(())
        } else {
            Err(Errno::NOSYS)
        }
    }

    /// A new handle for what `open` opens with `flags`.
    fn open(
        &self,
        flags: u32,
        open: impl FnOnce(&B) -> Result<(B::File, Attr)>,
    ) -> Result<(u64, Attr, OneHandle<B::File>)> {
        let acc = flags & libc::O_ACCMODE as u32;
        let changes = acc != libc::O_RDONLY as u32 || flags & (libc::O_CREAT | libc::O_TRUNC) as u32 != 0;
        if changes && self.policy.read_only {
            return Err(Errno::ROFS);
        }
        let held = self.table().handles.len();
        if held >= self.policy.max_handles {
            return Err(Errno::MFILE);
        }
        self.policy.budget.take(held)?;
        let (file, attr) = match open(&self.backend) {
            Ok(x) => x,
            Err(e) => {
                self.policy.budget.give(1);
                return Err(e);
            }
        };
        let is_dir = attr.is_dir();
        let (key, acc) = ((attr.dev, attr.ino), flags & libc::O_ACCMODE as u32);
        let file = Arc::new(file);
        let gen = (changes && attr.mode & libc::S_IFMT == libc::S_IFREG).then(|| self.policy.changes.counter(key));
        if flags & libc::O_TRUNC as u32 != 0 {
            self.policy.changes.bump(key);
        }
        let h = Arc::new(Handle {
            file,
            offset: AtomicU64::new(0),
            is_dir,
            key,
            acc,
            locked: AtomicBool::new(false),
            gen,
            lent: AtomicBool::new(false),
            lent_mark: std::sync::OnceLock::new(),
            append: flags & libc::O_APPEND as u32 != 0,
        });
        let mut t = self.table();
        // Checked again: opens of the session run side by side.
        if t.handles.len() >= self.policy.max_handles {
            drop(t);
            self.policy.budget.give(1);
            return Err(Errno::MFILE);
        }
        let handle = t.next_handle;
        t.next_handle += 1;
        t.handles.insert(handle, Arc::clone(&h));
        Ok((handle, attr, h))
    }

    fn seek(&self, handle: u64, offset: i64, whence: u32) -> Result<Answer<B::File>> {
        let h = self.handle(handle)?;
        let size = self.backend.getattr(Node::File(&h.file))?.size;
        let base: i128 = match whence as i32 {
            libc::SEEK_SET => 0,
            libc::SEEK_CUR => h.offset.load(Ordering::Relaxed) as i128,
            libc::SEEK_END => size as i128,
            // No holes are tracked: data runs to the end, one hole sits there.
            libc::SEEK_DATA | libc::SEEK_HOLE => {
                if offset < 0 || offset as u64 >= size {
                    return Err(Errno::NXIO);
                }
                let to = if whence as i32 == libc::SEEK_DATA { offset as u64 } else { size };
                h.offset.store(to, Ordering::Relaxed);
                return Ok(Answer::Offset(to));
            }
            _ => return Err(Errno::INVAL),
        };
        let to = base + offset as i128;
        if to < 0 || to > i64::MAX as i128 {
            return Err(Errno::INVAL);
        }
        h.offset.store(to as u64, Ordering::Relaxed);
        Ok(Answer::Offset(to as u64))
    }

    /// An open that brings the first `max` bytes of a regular file.
    fn open_read(&self, path: &[u8], flags: u32, mode: u32, max: u32) -> Result<ReadOpen<B::File>> {
        let (handle, attr, h) = self.open(flags, |b| b.open(path, flags, mode))?;
        let file = &h.file;
        let id = if self.cap(caps::FILE_IDS) { self.sealed_id(file, &attr) } else { Vec::new() };
        let readable = flags & libc::O_ACCMODE as u32 != libc::O_WRONLY as u32;
        let data = if readable && attr.mode & libc::S_IFMT == libc::S_IFREG {
            // The open stands even if this read fails: the client then
            // reads as after any open.
            let max = (max as usize).min(OPEN_READ_MAX);
            self.backend.read(file, 0, max).and_then(bytes_of).unwrap_or_default()
        } else {
            Vec::new()
        };
        Ok(ReadOpen { handle, attr, id, data, held: h })
    }

    fn caching(&self) -> Result<()> {
        if self.cap(caps::CACHING) {
            Ok(())
        } else {
            Err(Errno::NOSYS)
        }
    }

    /// The policy stored on `path` or the nearest directory above it, and
    /// where. An unreadable setting counts as none: caching is an
    /// optimisation, never a reason to fail an open.
    /// `file`, when given, is `path` open: its own setting is read
    /// through it, without resolving the path again.
    fn cache_policy(&self, path: &[u8], file: Option<&B::File>) -> (u8, Vec<u8>) {
        let own = |n: Node<'_, B::File>| {
            self.backend.getxattr(n, CACHE_XATTR).ok().and_then(|v| match &v[..] {
                b"cache" => Some(cache::CACHE),
                b"bypass" => Some(cache::BYPASS),
                _ => None,
            })
        };
        let mine = match file {
            Some(f) => own(Node::File(f)),
            None => own(Node::Path(if dirpolicy::is_root(path) { b"/" } else { path })),
        };
        if let Some(p) = mine {
            return (p, if dirpolicy::is_root(path) { b"/".to_vec() } else { path.to_vec() });
        }
        if dirpolicy::is_root(path) {
            return (cache::NONE, Vec::new());
        }
        self.policy.dirs.get(dirpolicy::parent(path), |d| own(Node::Path(d)))
    }

    fn xattr_cap(&self) -> Result<()> {
        if self.cap(caps::XATTR) {
            Ok(())
        } else {
            Err(Errno::OPNOTSUPP)
        }
    }
}

impl<B: Backend> Drop for Session<B> {
    fn drop(&mut self) {
        let t = self.table.get_mut().unwrap_or_else(|e| e.into_inner());
        self.policy.budget.give(t.handles.len());
        if *self.locked.get_mut() {
            self.policy.locks.release_conn(self.conn);
        }
    }
}

/// Where a cache policy is stored: an extended attribute, so it follows
/// the file through renames, lives with the data on both backends, and
/// any server exporting the same file system (a gateway) sees it.
const CACHE_XATTR: &[u8] = b"user.ferry.cache";

fn policy_name(p: u8) -> &'static [u8] {
    if p == cache::CACHE {
        b"cache"
    } else {
        b"bypass"
    }
}

/// `size` 0 asks for the length only; a too-small buffer is `ERANGE`.
fn xattr_answer<F>(v: Vec<u8>, size: u32) -> Result<Answer<F>> {
    let len = u32::try_from(v.len()).map_err(|_| Errno::RANGE)?;
    if size == 0 {
        return Ok(Answer::Xattr { size: len, value: Vec::new() });
    }
    if len > size {
        return Err(Errno::RANGE);
    }
    Ok(Answer::Xattr { size: len, value: v })
}
