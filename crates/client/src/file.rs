//! An open remote file: `Read`/`Write`/`Seek`, positional I/O, read-ahead
//! and write-behind inside the connection's window.

use std::collections::VecDeque;
use std::io::{self, SeekFrom};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ferry_proto::{caps, lock, Attr, Reply, Request, Target};

use crate::ahead::{self, Ahead};
use crate::cache::{Cache, Entry, CHUNK as CACHE_CHUNK};
use crate::client::Client;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::local::Local;
use crate::lock::{typ_from_wire, Held, LockHolder, LockKind, LockSpec, LockType};
use crate::pagebuf::PageBuf;
use crate::unstable::{Commit, Unstable};

/// Like `std::fs::OpenOptions`, plus the flags ferry passes through.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    read: bool,
    write: bool,
    append: bool,
    truncate: bool,
    create: bool,
    create_new: bool,
    directory: bool,
    nofollow: bool,
    mode: u32,
    custom: u32,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl OpenOptions {
    pub fn new() -> Self {
        OpenOptions {
            read: false,
            write: false,
            append: false,
            truncate: false,
            create: false,
            create_new: false,
            directory: false,
            nofollow: false,
            mode: 0o666,
            custom: 0,
        }
    }
    pub fn read(&mut self, v: bool) -> &mut Self {
        self.read = v;
        self
    }
    pub fn write(&mut self, v: bool) -> &mut Self {
        self.write = v;
        self
    }
    pub fn append(&mut self, v: bool) -> &mut Self {
        self.append = v;
        self
    }
    pub fn truncate(&mut self, v: bool) -> &mut Self {
        self.truncate = v;
        self
    }
    pub fn create(&mut self, v: bool) -> &mut Self {
        self.create = v;
        self
    }
    pub fn create_new(&mut self, v: bool) -> &mut Self {
        self.create_new = v;
        self
    }
    pub fn directory(&mut self, v: bool) -> &mut Self {
        self.directory = v;
        self
    }
    pub fn nofollow(&mut self, v: bool) -> &mut Self {
        self.nofollow = v;
        self
    }
    /// Permission bits for a created file (the server applies no umask).
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode;
        self
    }
    /// Raw Linux `open(2)` flags added to the computed ones.
    pub fn custom_flags(&mut self, flags: u32) -> &mut Self {
        self.custom = flags;
        self
    }

    /// The Linux `open(2)` flags these options stand for.
    pub fn flags(&self) -> u32 {
        let write = self.write || self.append;
        let mut f = match (self.read, write) {
            (true, true) => libc::O_RDWR,
            (false, true) => libc::O_WRONLY,
            _ => libc::O_RDONLY,
        };
        if self.append {
            f |= libc::O_APPEND;
        }
        if self.truncate {
            f |= libc::O_TRUNC;
        }
        if self.create || self.create_new {
            f |= libc::O_CREAT;
        }
        if self.create_new {
            f |= libc::O_EXCL;
        }
        if self.directory {
            f |= libc::O_DIRECTORY;
        }
        if self.nofollow {
            f |= libc::O_NOFOLLOW;
        }
        f as u32 | self.custom
    }
}

/// Writes kept in flight before the oldest must be acknowledged.
const WRITE_BEHIND_MAX: usize = 8;
/// Below this a transfer is one request; above it, split to fill the window.
const SPLIT_MIN: usize = 1024 * 1024;
/// Sequential reads smaller than this are served from a buffer filled with
/// large requests (one round trip per 4 KiB read would cost more than the
/// data); larger reads go straight into the caller's buffer.
const SMALL_READ: usize = 64 * 1024;
/// Buffer fills grow from the first to the largest as a sequence goes on.
const FILL_FIRST: usize = 64 * 1024;
const FILL_MAX: usize = 1024 * 1024;
/// Reads at least this big into a buffer off a cache line go through the
/// thread's aligned buffer (`read_bounced`), this much at a time.
const BOUNCE_MIN: usize = 16 * 1024;
const BOUNCE_PIECE: usize = 1024 * 1024;

thread_local! {
    /// The buffer of `File::read_bounced`, as large as the largest piece
    /// this thread bounced.
    static BOUNCE: std::cell::RefCell<PageBuf> = std::cell::RefCell::default();
}

/// A write sent behind the caller's back, not yet acknowledged.
struct InFlight {
    id: u64,
    /// The connection it went on: after a reconnect its reply is there or
    /// nowhere.
    engine: Arc<Engine>,
    /// Offset and a copy of the data, kept when the client reconnects, so
    /// a write lost with its connection is sent again instead of failing;
    /// once acknowledged it is kept on until committed (see `unstable`).
    resend: Option<(u64, Vec<u8>)>,
    /// `Client::sessions_lost` when an append was sent: sent again only
    /// into the session whose replies say whether it ran.
    lost: u64,
    /// The file's epoch when its handle was put in the request.
    epoch: u64,
    /// Counts it among the client's writes in flight while it lives.
    _behind: crate::channels::Behind,
}

pub struct File {
    client: Client,
    /// The server's handle, valid in the client's `epoch` of that time:
    /// after a reconnect that could not rejoin the session (the server
    /// restarted), the file is opened again (see `live`), never another.
    handle: AtomicU64,
    epoch: AtomicU64,
    /// What opens it again: the path and flags of the first open, and the
    /// server's lasting identity of the file (empty if it has none).
    path: Vec<u8>,
    flags: u32,
    id: Vec<u8>,
    /// Serialises re-opening.
    reopening: Mutex<()>,
    /// A lock was taken through this handle (its close must be waited for).
    locked: AtomicBool,
    /// The OFD and `flock` locks this handle holds: taken again when the
    /// file is opened again on a server that lost them (POSIX locks are
    /// the client's, per owner).
    handle_locks: Mutex<(Held, Held)>,
    attr: Attr,
    pos: u64,
    append: bool,
    /// After an append, `pos` is wherever the server put the end.
    pos_unknown: bool,
    writes: VecDeque<InFlight>,
    /// Buffers of acknowledged writes, for the next copies.
    spare: Vec<Vec<u8>>,
    /// A write-behind failure, reported by the next call.
    error: Option<Error>,
    /// Copies of acknowledged writes not yet committed by the server
    /// instance that acknowledged them. Behind a lock for `live` and
    /// `write_at`, which take `&self`; the lock is never held across a
    /// call of `live`.
    unstable: Mutex<Unstable>,
    /// Read-ahead: what sequential reads will want next, requested.
    ahead: Ahead,
    /// Small sequential reads are served from here (`rbase`, `rlen` valid
    /// bytes) while `rgen` matches `gen`, which any write or size change
    /// through this handle bumps.
    rbuf: PageBuf,
    rbase: u64,
    rlen: usize,
    rgen: u64,
    gen: std::sync::atomic::AtomicU64,
    /// End of the last small read, to see a sequence.
    small_end: Option<u64>,
    closed: bool,
    /// The local cache's copy, for a file the cache policy caches.
    cached: Option<Entry>,
    /// What names `cached`'s version (`cache_ticket`).
    ticket: Option<CacheTicket>,
    /// The server's own descriptor of the file, when it is on this host
    /// (asked for at the first read or write that would go to it).
    local: std::sync::OnceLock<Option<Local>>,
}

/// How many times a file is opened again or a commit sent again, each
/// after a reconnect that succeeded (the reconnect bound in time covers a
/// server that stays down): a server killed and restarted several times in
/// a row (a crash loop, the kill tests) must not turn an `fsync` into
/// `EIO`, and one that dies at every attempt must not loop for ever.
const AGAIN_MAX: usize = 64;

/// Largest cached file fetched whole at its open when it must be handed
/// over as a local file.
pub const WHOLE_FETCH_MAX: u64 = 256 << 20;

/// Names one version of a file the local cache holds, to open its copy
/// again without the server while a lease vouches that the file did not
/// change (`Client::reopen_cached`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheTicket {
    key: Vec<u8>,
    version: Vec<u8>,
    size: u64,
}

/// The cache entry of a file just opened, if the policy caches it. Any
/// failure of the local cache leaves the file uncached, never unopened.
#[allow(clippy::too_many_arguments)]
fn cache_entry(
    cache: &Cache,
    prefix: &[u8],
    path: &[u8],
    attr: &Attr,
    id: &[u8],
    change: u64,
    policy: u8,
    from: &[u8],
    first: &[u8],
) -> Option<(Entry, CacheTicket)> {
    if attr.mode & libc::S_IFMT != libc::S_IFREG || id.is_empty() || !cache.decide(path, policy, from).cache {
        return None;
    }
    // A file the open brought whole (64 KiB or less) is kept in memory
    // with the handle, not on disk: a store entry costs two files made,
    // a rename, a header read and the shared count's lock (~25 system
    // calls) to save nothing — the open that checks a copy brings the data
    // anyway, and under a lease the kernel's pages or the program keep it.
    if first.len() as u64 == attr.size {
        return None;
    }
    let t = ticket(prefix, id, change, attr.size);
    Some((cache.store.entry(&t.key, &t.version, t.size).ok()?, t))
}

fn ticket(prefix: &[u8], id: &[u8], change: u64, size: u64) -> CacheTicket {
    let key = [prefix, id].concat();
    let version = [change.to_le_bytes(), size.to_le_bytes()].concat();
    CacheTicket { key, version, size }
}

/// The copy `t` names, if the store holds it whole: a new read-only open
/// of its data file.
pub(crate) fn reopen_cached(cache: &Cache, t: &CacheTicket) -> Option<std::fs::File> {
    cache.store.complete(&t.key, &t.version, t.size)?.data_file().ok()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl File {
    pub(crate) fn open(client: Client, path: &[u8], opts: &OpenOptions) -> Result<File> {
        let flags = opts.flags();
        let engine = client.engine();
        let ids = engine.has_cap(caps::FILE_IDS);
        // A read-only open of what may be a regular file brings the file's
        // first bytes along (one round trip for a small file): they serve
        // the first reads.
        let with_data = engine.has_cap(caps::OPEN_READ)
            && flags & libc::O_ACCMODE as u32 == libc::O_RDONLY as u32
            && flags & libc::O_DIRECTORY as u32 == 0;
        // A read-only open where a cache is configured asks for what the
        // cache decision needs as well (the same round trip).
        let cached = with_data && client.cache().is_some() && engine.has_cap(caps::CACHING);
        let mut policy = None;
        let f = if cached {
            client.call(&Request::OpenCached { path, flags, mode: opts.mode, max: FILL_FIRST as u32 })?
        } else if with_data {
            client.call(&Request::OpenRead { path, flags, mode: opts.mode, max: FILL_FIRST as u32 })?
        } else if ids {
            client.call(&Request::OpenId { path, flags, mode: opts.mode })?
        } else {
            client.call(&Request::Open { path, flags, mode: opts.mode })?
        };
        let epoch = client.epoch();
        let mut first = Vec::new();
        let (handle, attr, id) = match f.reply()? {
            Reply::Opened { handle, attr } => (handle, attr, Vec::new()),
            Reply::OpenedId { handle, attr, id } => (handle, attr, id.to_vec()),
            Reply::OpenedData { handle, attr, id, data } => {
                first = data.to_vec();
                (handle, attr, id.to_vec())
            }
            Reply::OpenedCached { handle, attr, id, change, policy: p, from, data } => {
                first = data.to_vec();
                policy = Some((change, p, from.to_vec()));
                (handle, attr, id.to_vec())
            }
            r => return Err(Error::Protocol(format!("unexpected reply {r:?}"))),
        };
        let entry = match (policy, client.cache()) {
            (Some((change, p, from)), Some((cache, prefix))) => {
                cache_entry(cache, prefix, path, &attr, &id, change, p, &from, &first)
            }
            _ => None,
        };
        let (entry, ticket) = entry.map_or((None, None), |(e, t)| (Some(e), Some(t)));
        let rlen = first.len();
        let unstable = Mutex::new(Unstable::new(client.unstable_total()));
        Ok(File {
            client,
            handle: AtomicU64::new(handle),
            epoch: AtomicU64::new(epoch),
            path: path.to_vec(),
            flags,
            id,
            reopening: Mutex::new(()),
            locked: AtomicBool::new(false),
            handle_locks: Mutex::default(),
            attr,
            pos: 0,
            append: flags & libc::O_APPEND as u32 != 0,
            pos_unknown: false,
            writes: VecDeque::new(),
            spare: Vec::new(),
            error: None,
            unstable,
            ahead: Ahead::new(attr.size),
            rbuf: PageBuf::from_vec(first),
            rbase: 0,
            rlen,
            rgen: 0,
            gen: std::sync::atomic::AtomicU64::new(0),
            small_end: None,
            closed: false,
            cached: entry,
            ticket,
            local: std::sync::OnceLock::new(),
        })
    }

    /// Whether reads and writes go through the server's own descriptor of
    /// the file (the same-host path), as of the first read or write.
    pub fn is_local(&self) -> bool {
        self.local.get().is_some_and(Option::is_some)
    }

    /// Whether reads are served from the local cache.
    pub fn is_cached(&self) -> bool {
        self.cached.is_some()
    }

    /// For a cached file: what names the version this open found, to open
    /// its copy again without the server (`Client::reopen_cached`) while a
    /// lease vouches that the file did not change.
    pub fn cache_ticket(&self) -> Option<&CacheTicket> {
        self.ticket.as_ref()
    }

    /// For a cached file: which file and version of it the open found
    /// (equal for two opens only when their data is the same).
    pub fn cache_tag(&self) -> Option<&[u8]> {
        self.cached.as_ref().map(Entry::tag)
    }

    /// For a cached file: the local cache file with all of the file's data
    /// (fetched now where missing), to hand to the kernel (FUSE
    /// passthrough) or to a program (`ferry run`). `None` for a file not
    /// cached, or one larger than `WHOLE_FETCH_MAX` (256 MiB) not in the cache
    /// whole yet (a program reading a few bytes of a huge file must not
    /// wait for all of it: such a file is read through the cache in chunks,
    /// and handed over whole once it is there).
    pub fn cache_file(&self) -> Result<Option<std::fs::File>> {
        let Some(entry) = &self.cached else { return Ok(None) };
        let size = entry.size();
        if size > WHOLE_FETCH_MAX && !entry.is_complete() {
            return Ok(None);
        }
        while let Some((start, len)) = entry.missing(0, size) {
            self.cache_fetch(entry, start, len)?;
        }
        entry.data_file().map(Some).map_err(Error::from_io)
    }

    /// A read of a cached file: from the cache, missing chunks fetched from
    /// the server and kept. The file is as it was at the open (close-to-open
    /// consistency): its size then bounds the reads.
    fn cached_read(&self, entry: &Entry, buf: &mut [u8], offset: u64) -> Result<usize> {
        let size = entry.size();
        if offset >= size {
            return Ok(0);
        }
        let want = buf.len().min((size - offset) as usize);
        let mut done = 0;
        while done < want {
            let at = offset + done as u64;
            let n = entry.read_at(&mut buf[done..want], at).map_err(Error::from_io)?;
            if n > 0 {
                done += n;
                continue;
            }
            if let Some((start, len)) = entry.missing(at, (want - done) as u64) {
                // Misses in sequence are served by the read-ahead, which
                // fetches the next chunks while these are stored.
                self.cache_fetch(entry, start, len)?;
            }
        }
        Ok(done)
    }

    /// Fetches `need` bytes at chunk-aligned `start` into the cache.
    fn cache_fetch(&self, entry: &Entry, start: u64, need: u64) -> Result<()> {
        let mut data = vec![0u8; need as usize];
        let got = self.server_read_at(&mut data, start)?;
        if (got as u64) < need.min(entry.size() - start) {
            // The file shrank on the server since the open: its data is no
            // longer the version the cache entry holds.
            return Err(Error::remote(libc::ESTALE));
        }
        data.truncate(got);
        // Whole chunks only (or up to the end of the file).
        let end = start + got as u64;
        let keep = if end >= entry.size() { got } else { (got as u64 / CACHE_CHUNK * CACHE_CHUNK) as usize };
        entry.fill(start, &data[..keep]).map_err(Error::from_io)
    }

    /// A positional read answered from what the open brought, when that
    /// is the whole file: reads inside it, and one at its end (end of
    /// file), after which they go to the server again (a reader that
    /// reached the end and keeps reading, as `tail -f`, sees changes).
    pub fn read_from_open(&self, offset: u64, buf: &mut [u8]) -> Option<usize> {
        let all = self.whole()?;
        let len = all.len() as u64;
        if offset >= len {
            self.gen.fetch_add(1, Ordering::Relaxed);
            return (offset == len).then_some(0);
        }
        let at = offset as usize;
        let n = (all.len() - at).min(buf.len());
        buf[..n].copy_from_slice(&all[at..at + n]);
        Some(n)
    }

    /// The whole file, if the open brought all of it (a small file opened
    /// read-only from a server with `OPEN_READ`) and nothing changed since.
    pub(crate) fn whole(&self) -> Option<&[u8]> {
        let unchanged = self.rgen == self.gen.load(Ordering::Relaxed);
        let regular = self.attr.mode & libc::S_IFMT == libc::S_IFREG;
        (unchanged && regular && self.rbase == 0 && self.rlen as u64 == self.attr.size).then(|| &self.rbuf[..self.rlen])
    }

    /// The server's handle id.
    pub fn handle(&self) -> u64 {
        self.handle.load(Ordering::Acquire)
    }

    /// The server's handle id, the file opened again first if the server
    /// restarted since (by its identity: the same file, or `ESTALE`).
    pub fn current_handle(&self) -> Result<u64> {
        self.live()?;
        Ok(self.handle())
    }

    /// As `current_handle`, with the client's epoch it is valid in: a
    /// caller whose request with it fails with `EBADF` or `ESTALE` after
    /// the epoch moved on ([`Client::epoch`]) met a restarted server with
    /// the old handle, and asks again with the handle of then.
    pub fn current_handle_in(&self) -> Result<(u64, u64)> {
        self.live()?;
        let epoch = self.epoch.load(Ordering::Acquire);
        Ok((self.handle(), epoch))
    }

    /// As `current_handle`, for a caller about to keep a write back (the
    /// preload library gathers small writes): a file holding record locks
    /// first looks, without waiting (one `recv(MSG_PEEK)`), whether its
    /// connection was closed by the server, and if so moves now (opening
    /// the file again and taking its locks again), so that a lock lost
    /// meanwhile fails this call rather than one after more writes made
    /// under a lock no longer held.
    pub fn ensure_live(&self) -> Result<()> {
        if self.holds_locks() {
            let e = self.client.engine();
            if let Some(err) = e.gone() {
                self.client.replaced(&e, &err)?;
            }
        }
        self.live()
    }

    fn holds_locks(&self) -> bool {
        let (ofd, flock) = &*lock(&self.handle_locks);
        !ofd.is_empty() || !flock.is_empty() || self.client.posix_held_on((self.attr.dev, self.attr.ino))
    }

    fn same_epoch(&self) -> bool {
        self.client.epoch() == self.epoch.load(Ordering::Acquire)
    }

    /// Whether `err` came from sending the handle of this file's `epoch`
    /// to a server instance that never gave it: another thread reconnected
    /// to a restarted server between `live` and the send, so the request
    /// met the new instance with the old handle (`EBADF`), or was lost and
    /// found the epoch moved (`ESTALE`). Opened again, it may be asked
    /// again; the program must not see either (a close failed with `EBADF`
    /// on the mount when the kernel's writes raced a reconnect).
    fn went_stale(&self, err: &Error, epoch: u64) -> bool {
        matches!(err.errno(), libc::EBADF | libc::ESTALE) && self.client.epoch() != epoch
    }

    /// `op` with this file's handle, live first, and again on the file
    /// opened again if the handle went stale under the call.
    fn with_handle<T>(&self, mut op: impl FnMut(u64) -> Result<T>) -> Result<T> {
        let mut last = Error::remote(libc::ESTALE);
        for _ in 0..AGAIN_MAX {
            self.live()?;
            let epoch = self.epoch.load(Ordering::Acquire);
            match op(self.handle()) {
                Err(err) if self.went_stale(&err, epoch) => last = err,
                r => return r,
            }
        }
        Err(last)
    }

    /// Makes sure the server knows this handle. After a reconnect that
    /// could not rejoin the session (the server restarted, or another
    /// gateway answered), the file is opened again by its identity, so it is
    /// the same file even if it was renamed, and the locks held through it
    /// are taken again; a file removed meanwhile, a server without
    /// `FILE_IDS`, or a lock someone else took meanwhile is `ESTALE`.
    fn live(&self) -> Result<()> {
        if self.same_epoch() {
            return Ok(());
        }
        let _g = self.reopening.lock().unwrap_or_else(|e| e.into_inner());
        let stale = || Err(Error::remote(libc::ESTALE));
        for _ in 0..AGAIN_MAX {
            let before = self.client.epoch();
            if before == self.epoch.load(Ordering::Acquire) {
                return Ok(());
            }
            if !self.client.engine().has_cap(caps::FILE_IDS) {
                return stale();
            }
            let (a, create) = (&self.attr, (libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC) as u32);
            let req =
                Request::Reopen { flags: self.flags & !create, dev: a.dev, ino: a.ino, id: &self.id, path: &self.path };
            let handle = match self.client.call(&req)?.reply()? {
                Reply::OpenedId { handle, .. } => handle,
                r => return Err(Error::Protocol(format!("unexpected reply {r:?}"))),
            };
            // Read-ahead of the old connection is gone with it.
            self.drop_prefetch();
            if self.client.epoch() != before {
                // Another reconnect during the call: that handle may be gone too.
                continue;
            }
            self.handle.store(handle, Ordering::Release);
            // Locks first: writes made under a lock go out again only once
            // it is held again (a lock someone else took meanwhile is
            // `ESTALE`, and those writes are not sent over their data).
            match self.reclaim(handle, before).and_then(|()| self.replay(handle)) {
                Err(_) if self.client.epoch() != before => continue,
                r => r?,
            }
            if self.client.epoch() == before {
                self.epoch.store(before, Ordering::Release);
                return Ok(());
            }
        }
        stale()
    }

    /// Takes again, on the new `handle` in `epoch`, the locks held through
    /// this file and its owners' POSIX locks on it. One that another owner
    /// took meanwhile cannot be had: `ESTALE`, never a silent loss.
    fn reclaim(&self, handle: u64, epoch: u64) -> Result<()> {
        let key = (self.attr.dev, self.attr.ino);
        let (ofd, flock) = lock(&self.handle_locks).clone();
        let mine: Vec<LockSpec> = ofd.specs(LockKind::Ofd).chain(flock.specs(LockKind::Flock)).collect();
        self.take_again(handle, &mine)?;
        for (owner, specs) in self.client.posix_to_reclaim(key, epoch)? {
            match self.take_again(handle, &specs) {
                Ok(()) => self.client.posix_reclaimed(key, owner, epoch),
                // This handle's access does not allow that lock (a write
                // lock taken through another, writable, file of the owner):
                // that file takes them again when it is used.
                Err(e) if e.errno() == libc::EBADF => {}
                Err(e) => {
                    if e.errno() == libc::ESTALE {
                        self.client.posix_lost(key, owner);
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Sends `specs` on `handle`; a lock someone else holds now is `ESTALE`.
    fn take_again(&self, handle: u64, specs: &[LockSpec]) -> Result<()> {
        for spec in specs {
            let (owner, kind, typ) = spec.wire();
            let req = Request::Lock { handle, owner, start: spec.start, len: spec.len, pid: spec.pid, kind, typ };
            match self.client.call(&req) {
                Ok(_) => {}
                Err(e) if e.errno() == libc::EAGAIN => return Err(Error::remote(libc::ESTALE)),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Sends the copies of uncommitted writes again, oldest first, if the
    /// server instance that acknowledged them is gone (its replacement may
    /// have lost them with its page cache).
    fn replay(&self, handle: u64) -> Result<()> {
        let mut u = lock(&self.unstable);
        let boot = self.client.engine().welcome().boot_id;
        if u.is_empty() || u.boot() == boot {
            return Ok(());
        }
        if let Some(c) = u.commit.take() {
            c.engine.forget(c.id);
        }
        for (offset, data) in u.copies() {
            self.client.call(&Request::Pwrite { handle, offset, data })?;
        }
        u.rebased(boot);
        Ok(())
    }

    /// Bytes written through this file that the server acknowledged but
    /// has not committed (`fsync`), kept to be sent again if the server
    /// instance changes before it does. Zero for a client that does not
    /// reconnect.
    pub fn unstable_bytes(&self) -> usize {
        lock(&self.unstable).bytes()
    }

    /// Keeps the copy of a write acknowledged on `engine`, and sends a
    /// commit behind the writes when the copies grow.
    fn keep(&self, engine: &Arc<Engine>, offset: u64, data: Vec<u8>) {
        let mut u = lock(&self.unstable);
        u.keep(engine.welcome().boot_id, offset, data);
        if u.wants_commit() {
            let req = Request::Fsync { handle: self.handle(), datasync: true };
            if let Ok(id) = engine.start(&req, 0) {
                let covers = u.len();
                u.commit = Some(Commit { id, engine: Arc::clone(engine), covers });
            }
        }
    }

    /// Waits, while the copies kept are over their bound, for the commit
    /// sent behind the writes, and commits now if that is not enough.
    fn settle(&mut self) -> Result<()> {
        let u = self.unstable.get_mut().unwrap_or_else(|e| e.into_inner());
        if !u.must_wait() {
            return Ok(());
        }
        let mut spare = Vec::new();
        if let Some(c) = u.commit.take() {
            if c.engine.finish(c.id, None).is_ok() {
                spare = u.committed(c.engine.welcome().boot_id, c.covers);
            }
        }
        let still = u.must_wait();
        self.reuse(spare);
        if still {
            self.flush_writes()?;
            self.commit(true)?;
        }
        Ok(())
    }

    /// Keeps buffers for the next copies: up to half the bound of what a
    /// file keeps uncommitted, so a writer that commits every so often
    /// copies into memory it already has (fresh 1 MiB buffers cost a map
    /// and page faults each: measured 0.77 x the write rate with 9 spares).
    fn reuse(&mut self, bufs: Vec<Vec<u8>>) {
        let mut kept: usize = self.spare.iter().map(Vec::capacity).sum();
        for b in bufs {
            kept += b.capacity();
            if kept > crate::unstable::FILE_MAX / 2 {
                break;
            }
            self.spare.push(b);
        }
    }

    /// `fsync` of everything the server acknowledged: drops the copies it
    /// covers once the instance that has them answers. A connection lost
    /// meanwhile is replaced and the commit sent again (after the copies,
    /// if the server instance changed).
    fn commit(&mut self, datasync: bool) -> Result<()> {
        let spare = self.commit_now(datasync)?;
        self.reuse(spare);
        Ok(())
    }

    /// As `commit`, for callers with `&self`: returns the buffers freed.
    fn commit_now(&self, datasync: bool) -> Result<Vec<Vec<u8>>> {
        for _ in 0..AGAIN_MAX {
            self.live()?;
            let epoch = self.epoch.load(Ordering::Acquire);
            let e = self.client.engine();
            let n = lock(&self.unstable).len();
            match e.call(&Request::Fsync { handle: self.handle(), datasync }) {
                Ok(_) => {
                    let mut u = lock(&self.unstable);
                    if let Some(c) = u.commit.take() {
                        c.engine.forget(c.id);
                    }
                    return Ok(u.committed(e.welcome().boot_id, n));
                }
                Err(err) if self.went_stale(&err, epoch) || self.client.replaced(&e, &err)? => continue,
                Err(err) => return Err(err),
            }
        }
        Err(Error::remote(libc::EIO))
    }

    /// Attributes as of `open`.
    pub fn attr(&self) -> &Attr {
        &self.attr
    }

    fn max_io(&self) -> usize {
        self.client.engine().max_io()
    }

    /// Request size for a transfer of `n` bytes: one request up to
    /// `SPLIT_MIN`, otherwise about an eighth so the window stays full.
    fn chunk_for(&self, n: usize) -> usize {
        if n <= SPLIT_MIN {
            return n.max(1);
        }
        let c = n.div_ceil(8).next_multiple_of(64 * 1024);
        c.clamp(SPLIT_MIN, self.max_io())
    }

    fn depth(&self) -> usize {
        (self.client.engine().window() as usize).max(1)
    }

    /// Reads at `offset` without moving the position; returns bytes read
    /// (short only at end of file). Large buffers go as several requests
    /// in flight, each reply landing in its part of `buf`.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        match &self.cached {
            Some(entry) => self.cached_read(entry, buf, offset),
            None => self.server_read_at(buf, offset),
        }
    }

    /// The server's descriptor of this file, if it is on this host and
    /// passes it (a regular file, to a process of its user). Asked once.
    fn local(&self) -> Option<&Local> {
        self.local.get_or_init(|| self.fetch_local()).as_ref()
    }

    /// The server's own descriptor of this file and whether it was lent
    /// for writing, when the client is on the server's host and the server
    /// lends it (`FileFd`, asked once per file; a writable one makes the
    /// file unleasable on the server until this handle closes). The mount
    /// backs the file's node with it (FUSE passthrough).
    pub fn server_fd(&self) -> Option<(std::os::fd::BorrowedFd<'_>, bool)> {
        if self.cached.is_some() {
            return None;
        }
        self.local().map(|l| (l.fd(), l.writable))
    }

    /// The server's own descriptor of this file, to hand over (`ferry
    /// run`), and whether it was lent for writing: asked on this file's
    /// connection, which must be the server's Unix socket (see
    /// `Client::same_host_client`). `Ok(None)`: not a connection that can
    /// pass one.
    pub fn lend_fd(&self) -> Result<Option<(std::os::fd::OwnedFd, bool)>> {
        let e = self.client.engine();
        if !e.is_unix() || !e.has_cap(caps::SAME_HOST) {
            return Ok(None);
        }
        match e.call(&Request::FileFd { handle: self.current_handle()? })?.reply()? {
            Reply::FileFd { seq, writable } => Ok(e.take_passed_fd(seq).map(|fd| (fd, writable))),
            r => Err(Error::Protocol(format!("unexpected reply {r:?}"))),
        }
    }

    fn fetch_local(&self) -> Option<Local> {
        let main = self.client.engine();
        let e = self.client.local_engine(&main)?;
        let frame = match e.call(&Request::FileFd { handle: self.handle() }) {
            Ok(f) => f,
            Err(err) => {
                // Lost: the channel goes; refused (another user, no
                // descriptor for this file): the data goes by requests.
                self.client.channel_lost(&e, &err);
                return None;
            }
        };
        match frame.reply().ok()? {
            Reply::FileFd { seq, writable } => Some(Local::new(e.take_passed_fd(seq)?, writable)),
            _ => None,
        }
    }

    /// A read from the server: through its descriptor on this host, else
    /// through the read-ahead; read-ahead and large reads go on a data
    /// channel if the client has one, and on the main connection again if
    /// it fails under them.
    fn server_read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let mut tries = 0;
        loop {
            self.live()?;
            let epoch = self.epoch.load(Ordering::Acquire);
            tries += 1;
            match self.server_read_once(buf, offset) {
                // Read-ahead asked with the handle of before a restart:
                // none of it holds.
                Err(e) if tries < AGAIN_MAX && self.went_stale(&e, epoch) => self.ahead.reset(),
                r => return r,
            }
        }
    }

    fn server_read_once(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        // Writes sent behind and not yet answered must not be overtaken.
        if let Some(l) = self.local().filter(|_| !self.client.writes_behind()) {
            return l.read_at(buf, offset);
        }
        let main = self.client.engine();
        // Writes sent behind on the main connection and not yet answered
        // must not be overtaken by a read on another connection.
        if let Some((data, threshold)) = self.client.bulk(&main).filter(|_| !self.client.writes_behind()) {
            match self.read_through(&data, Some(threshold), buf, offset) {
                Err(e) if self.client.channel_lost(&data, &e) => self.ahead.reset(),
                r => return r,
            }
        }
        self.read_through(&main, None, buf, offset)
    }

    /// A read through the read-ahead on `engine`: the main connection, or a
    /// data channel carrying what reaches `threshold` (smaller direct reads
    /// go on the main connection, which may be replaced).
    fn read_through(&self, engine: &Arc<Engine>, threshold: Option<usize>, buf: &mut [u8], at: u64) -> Result<usize> {
        if buf.len() >= BOUNCE_MIN && !(buf.as_ptr() as usize).is_multiple_of(64) {
            // `try_with`: under `ferry run` a program may read from a
            // thread's destructors, after this one's buffer went.
            let bounced = BOUNCE
                .try_with(|b| {
                    let mut b = b.try_borrow_mut().ok()?;
                    Some(self.read_bounced(engine, threshold, &mut b, buf, at))
                })
                .ok()
                .flatten();
            if let Some(r) = bounced {
                return r;
            }
        }
        self.read_landing(engine, threshold, buf, at)
    }

    /// A read into a buffer that starts off a cache line (a program's own
    /// `malloc`ed buffer sits 16 bytes past one): the kernel's receive copy
    /// into it costs 2–4 times its copy into an aligned one here (0.8–0.9
    /// against 0.24–0.42 s/GiB of client CPU for 1 MiB reads,
    /// docs/benchmarks.md), while copying a received MiB over costs
    /// ~0.03 s/GiB. So it is received into an aligned buffer of the
    /// thread's (one per thread, not per file: a program may hold many files
    /// open), a piece at a time, and copied over.
    fn read_bounced(
        &self,
        engine: &Arc<Engine>,
        threshold: Option<usize>,
        bounce: &mut PageBuf,
        buf: &mut [u8],
        at: u64,
    ) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let piece = (buf.len() - done).min(BOUNCE_PIECE);
            bounce.set_len(piece);
            let got = match self.read_landing(engine, threshold, bounce, at + done as u64) {
                Ok(n) => n,
                Err(e) if done == 0 => return Err(e),
                // What was read stands; the error shows at the next read.
                Err(_) => break,
            };
            buf[done..done + got].copy_from_slice(&bounce[..got]);
            done += got;
            if got < piece {
                break;
            }
        }
        Ok(done)
    }

    fn read_landing(&self, engine: &Arc<Engine>, threshold: Option<usize>, buf: &mut [u8], at: u64) -> Result<usize> {
        let segment = ahead::segment_for(self.chunk_for(buf.len()), self.max_io());
        let mut direct = |b: &mut [u8], at: u64| {
            let got = match threshold {
                Some(t) if b.len() >= t => self.read_at_once(engine, b, at)?,
                _ => self.again(|main| self.read_at_once(main, b, at))?,
            };
            self.client.count_fetched(got);
            Ok(got)
        };
        self.ahead.read((engine, self.handle()), buf, at, segment, &mut direct, &self.client)
    }

    /// Bytes the read-ahead keeps requested past the reader now (0 when
    /// the reads are not sequential).
    pub fn read_ahead_window(&self) -> u64 {
        self.ahead.window()
    }

    /// Runs `op` on the current connection with a live handle; if the
    /// connection is lost under it and the client reconnects, once more
    /// (for requests that may run twice: positional reads and writes).
    fn again<T>(&self, mut op: impl FnMut(&Arc<Engine>) -> Result<T>) -> Result<T> {
        let mut tries = 0;
        loop {
            self.live()?;
            let epoch = self.epoch.load(Ordering::Acquire);
            let e = self.client.engine();
            tries += 1;
            match op(&e) {
                Err(err)
                    if tries < AGAIN_MAX && (self.went_stale(&err, epoch) || self.client.replaced(&e, &err)?) => {}
                r => return r,
            }
        }
    }

    fn read_at_once(&self, engine: &Arc<Engine>, buf: &mut [u8], offset: u64) -> Result<usize> {
        let chunk = self.chunk_for(buf.len());
        let depth = self.depth();
        let mut queue: VecDeque<(u64, usize)> = VecDeque::new();
        let mut parts: VecDeque<&mut [u8]> = VecDeque::new();
        let mut total = 0usize;
        let mut short = false;
        let mut at = offset;
        let mut finish_one = |queue: &mut VecDeque<(u64, usize)>, parts: &mut VecDeque<&mut [u8]>| -> Result<()> {
            let (id, want) = queue.pop_front().expect("queued");
            let part = parts.pop_front().expect("queued");
            let got = engine.finish(id, Some(part))?.data_len;
            if !short {
                total += got;
                short = got < want;
            }
            Ok(())
        };
        for part in buf.chunks_mut(chunk) {
            let len = part.len();
            // Collect the oldest before `start` would wait for room: it
            // would read that reply aside and its data would be copied.
            while !queue.is_empty() && (queue.len() >= depth || !engine.has_room(len as u64)) {
                finish_one(&mut queue, &mut parts)?;
            }
            let id =
                engine.start(&Request::Pread { handle: self.handle(), offset: at, count: len as u32 }, len as u64)?;
            queue.push_back((id, len));
            parts.push_back(part);
            at += len as u64;
        }
        while !queue.is_empty() {
            finish_one(&mut queue, &mut parts)?;
        }
        Ok(total)
    }

    /// Writes all of `buf` at `offset` and waits for the server.
    pub fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.drop_prefetch();
        self.live()?;
        let _stamp = self.client.stamp()?;
        if let Some(l) = self.local().filter(|l| l.writable && !self.client.writes_behind()) {
            return l.write_at(buf, offset, self.append).map(drop);
        }
        // Only a write that will go on a channel may set one up.
        let large = self.client.bulk_threshold().is_some_and(|t| buf.len() >= t);
        let channel = if large { self.client.bulk(&self.client.engine()) } else { None };
        let on_channel = match channel {
            Some((data, _)) => match self.write_at_once(&data, buf, offset) {
                Err(e) if self.client.channel_lost(&data, &e) => false,
                r => r.map(|()| true)?,
            },
            None => false,
        };
        if !on_channel {
            self.again(|engine| self.write_at_once(engine, buf, offset))?;
        }
        if self.client.reconnects() {
            self.keep(&self.client.engine(), offset, buf.to_vec());
            if lock(&self.unstable).must_wait() {
                self.commit_now(true)?;
            }
        }
        Ok(())
    }

    fn write_at_once(&self, engine: &Arc<Engine>, buf: &[u8], offset: u64) -> Result<()> {
        let mut ids = VecDeque::new();
        let mut first_err = None;
        let mut at = offset;
        for part in buf.chunks(self.chunk_for(buf.len())) {
            if ids.len() >= self.depth() {
                if let Err(e) = engine.finish(ids.pop_front().expect("queued"), None) {
                    first_err.get_or_insert(e);
                }
            }
            ids.push_back(engine.start(&Request::Pwrite { handle: self.handle(), offset: at, data: part }, 0)?);
            at += part.len() as u64;
        }
        for id in ids {
            if let Err(e) = engine.finish(id, None) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn take_error(&mut self) -> Result<()> {
        self.error.take().map_or(Ok(()), Err)
    }

    fn reap_one(&mut self) {
        let Some(w) = self.writes.pop_front() else { return };
        // The connection that acknowledged the write, if one did.
        let r = match w.engine.finish(w.id, None) {
            // Sent with a handle the server instance never gave (it did
            // not run): sent again through the file opened again.
            Err(e) if self.went_stale(&e, w.epoch) && w.resend.is_some() => {
                let (offset, data) = w.resend.as_ref().expect("just seen");
                self.with_handle(|handle| match self.append {
                    true => self.client.call(&Request::Write { handle, data }),
                    false => self.client.call(&Request::Pwrite { handle, offset: *offset, data }),
                })
                .map(|_| self.client.engine())
            }
            Err(e) => match &w.resend {
                Some((_, data)) if self.append => {
                    self.resend_append(&w.engine, &e, w.id, w.lost, data).map(|()| self.client.engine())
                }
                Some((offset, data)) => {
                    // The resend's own failure: a file that could not be
                    // opened again, or a lock lost, says so (`ESTALE`)
                    // rather than as a lost connection.
                    self.resend(&w.engine, &e, *offset, data).map(|()| self.client.engine())
                }
                None => Err(e),
            },
            Ok(_) => Ok(w.engine),
        };
        match (r, w.resend) {
            // An acknowledged append is never sent again (it would land twice).
            (Ok(_), Some((_, buf))) if self.append => self.reuse(vec![buf]),
            (Ok(by), Some((offset, buf))) => self.keep(&by, offset, buf),
            (Ok(_), None) => {}
            (Err(e), resend) => {
                self.error.get_or_insert(e);
                self.reuse(resend.into_iter().map(|(_, b)| b).collect());
            }
        }
    }

    /// Sends again a positional write whose connection was lost before it
    /// was acknowledged (writing the same bytes twice does no harm), on the
    /// new connection and, after a server restart, the re-opened file.
    fn resend(&self, failed: &Arc<Engine>, err: &Error, offset: u64, data: &[u8]) -> Result<()> {
        if !self.client.replaced(failed, err)? {
            return Err(err.clone());
        }
        self.with_handle(|handle| self.client.call(&Request::Pwrite { handle, offset, data }))?;
        Ok(())
    }

    /// Sends again an append whose connection was lost before it was
    /// acknowledged: under its first id, into the same session (rejoined,
    /// or restored by a restarted server from its journal), through the
    /// file opened again. The server answers from its reply cache if it ran
    /// it, finds its data past the file's end of then if it died running
    /// it, and runs it otherwise: it lands once. A session not rejoined
    /// has no such memory: then whether it ran is unknown (`EIO`).
    fn resend_append(&self, failed: &Arc<Engine>, err: &Error, id: u64, lost: u64, data: &[u8]) -> Result<()> {
        let (mut failed, mut err) = (Arc::clone(failed), err.clone());
        for _ in 0..AGAIN_MAX {
            if !self.client.replaced(&failed, &err)? {
                return Err(err);
            }
            if self.client.sessions_lost() != lost {
                return Err(Error::Io {
                    kind: std::io::ErrorKind::Other,
                    errno: Some(libc::EIO),
                    message: "the connection was lost during an append and the session with it; it may or may not \
                              have been done"
                        .into(),
                });
            }
            self.live()?;
            let engine = self.client.engine();
            match self.client.call_again(&Request::Write { handle: self.handle(), data }, id) {
                Err(e) if crate::redial::is_lost(&e) => (failed, err) = (engine, e),
                other => return other.map(drop),
            }
        }
        Err(err)
    }

    /// Waits for every write in flight; reports the first failure.
    pub fn flush_writes(&mut self) -> Result<()> {
        while !self.writes.is_empty() {
            self.reap_one();
        }
        self.take_error()
    }

    /// Forgets all read-ahead, for a caller that knows the file changed
    /// behind this handle (another handle of the same process wrote).
    pub fn discard_read_ahead(&self) {
        self.drop_prefetch();
    }

    /// Forgets all read-ahead: after a write its data may be stale.
    fn drop_prefetch(&self) {
        self.gen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.ahead.reset();
    }

    fn read_seq(&mut self, buf: &mut [u8]) -> Result<usize> {
        self.take_error()?;
        if self.pos_unknown {
            self.sync_pos()?;
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let got = self.read_at(buf, self.pos)?;
        self.pos += got as u64;
        Ok(got)
    }

    /// A small read, filled completely unless the file ends.
    fn read_small(&mut self, buf: &mut [u8]) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let n = match self.read_small_once(&mut buf[done..]) {
                Ok(n) => n,
                Err(e) if done == 0 => return Err(e),
                // What was read (and the position) stands; the error
                // shows again at the next read.
                Err(_) => break,
            };
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(done)
    }

    /// From the buffer when the read continues a sequence (or starts the
    /// file), else one request of its own.
    fn read_small_once(&mut self, buf: &mut [u8]) -> Result<usize> {
        self.take_error()?;
        if self.pos_unknown {
            self.sync_pos()?;
        }
        let gen = self.gen.load(std::sync::atomic::Ordering::Relaxed);
        if self.rgen != gen {
            self.rlen = 0;
            self.rgen = gen;
        }
        let pos = self.pos;
        let sequential = self.small_end == Some(pos) || pos == 0;
        if !sequential {
            self.rlen = 0;
            let n = self.read_at(buf, pos)?;
            self.pos += n as u64;
            self.small_end = Some(self.pos);
            return Ok(n);
        }
        if !(pos >= self.rbase && pos < self.rbase + self.rlen as u64) {
            // Refill: requests grow while the sequence lasts, and once their
            // size settles the read-ahead keeps the next ones in flight.
            let size = if self.rlen == 0 || self.rbase + self.rlen as u64 != pos {
                FILL_FIRST
            } else {
                (self.rbuf.len() * 2).clamp(FILL_FIRST, FILL_MAX)
            };
            let mut rbuf = std::mem::take(&mut self.rbuf);
            rbuf.set_len(size);
            let got = self.read_seq(&mut rbuf);
            self.rbuf = rbuf;
            let got = got?;
            // read_seq moved the position past the fill; the caller's
            // position is still `pos`.
            self.pos = pos;
            self.rbase = pos;
            self.rlen = got;
            self.rgen = self.gen.load(std::sync::atomic::Ordering::Relaxed);
            if got == 0 {
                self.small_end = Some(pos);
                return Ok(0);
            }
        }
        let off = (pos - self.rbase) as usize;
        let n = (self.rlen - off).min(buf.len());
        buf[..n].copy_from_slice(&self.rbuf[off..off + n]);
        self.pos += n as u64;
        self.small_end = Some(self.pos);
        Ok(n)
    }

    fn write_seq(&mut self, buf: &[u8]) -> Result<usize> {
        self.take_error()?;
        // After a server restart the file is opened again (and what it may
        // have lost sent again) before anything newer is written.
        self.live()?;
        self.drop_prefetch();
        let _stamp = self.client.stamp()?;
        if self.local().is_some_and(|l| l.writable) {
            self.flush_writes()?;
            if !self.client.writes_behind() {
                let l = self.local().expect("just seen");
                let end = l.write_at(buf, self.pos, self.append)?;
                self.pos = end;
                return Ok(buf.len());
            }
        }
        let mut engine = self.client.engine();
        for part in buf.chunks(self.chunk_for(buf.len())) {
            if self.writes.front().is_some_and(|w| !Arc::ptr_eq(&w.engine, &engine)) {
                // Writes of a lost connection are sent again first, in
                // order, so none lands over a later one.
                self.flush_writes()?;
            }
            let (append, pos) = (self.append, self.pos);
            let req = move |h| match append {
                true => Request::Write { handle: h, data: part },
                false => Request::Pwrite { handle: h, offset: pos, data: part },
            };
            let mut epoch = self.epoch.load(Ordering::Acquire);
            let id = match engine.start(&req(self.handle()), 0) {
                Ok(id) => id,
                // Found dead before it left: nothing was sent, so even an
                // append may go on the new connection.
                Err(e) if self.client.replaced(&engine, &e)? => {
                    self.flush_writes()?;
                    self.live()?;
                    epoch = self.epoch.load(Ordering::Acquire);
                    engine = self.client.engine();
                    engine.start(&req(self.handle()), 0)?
                }
                Err(e) => return Err(e),
            };
            // An append is kept too, to be sent again under its id (the
            // server's reply cache says whether it ran), never over data.
            let replays = !self.append || self.client.replays();
            let resend = (replays && self.client.reconnects()).then(|| {
                let mut buf = self.spare.pop().unwrap_or_default();
                buf.clear();
                buf.extend_from_slice(part);
                (self.pos, buf)
            });
            let _behind = self.client.write_behind();
            let lost = self.client.sessions_lost();
            self.writes.push_back(InFlight { id, engine: Arc::clone(&engine), resend, lost, epoch, _behind });
            self.pos += part.len() as u64;
            while self.writes.len() > WRITE_BEHIND_MAX {
                self.reap_one();
            }
            self.settle()?;
        }
        if self.append {
            self.pos_unknown = true;
        }
        self.take_error()?;
        Ok(buf.len())
    }

    /// After appends, the position is the end of the file.
    fn sync_pos(&mut self) -> Result<()> {
        self.flush_writes()?;
        self.pos = self.metadata()?.size;
        self.pos_unknown = false;
        Ok(())
    }

    pub fn metadata(&mut self) -> Result<Attr> {
        self.live()?;
        self.flush_writes()?;
        // The server restarted under the call (the handle died with it):
        // asking again through the file opened again is harmless (where an
        // append ended, after `write`).
        self.with_handle(|handle| self.client.stat(Target::Handle(handle)))
    }

    pub fn set_len(&mut self, size: u64) -> Result<()> {
        self.live()?;
        self.flush_writes()?;
        self.drop_prefetch();
        self.with_handle(|handle| self.client.truncate(Target::Handle(handle), size)).map(|_| ())
    }

    /// `fsync`: returns once everything written is on stable storage.
    pub fn sync_all(&mut self) -> Result<()> {
        self.sync(false)
    }

    /// `fdatasync`.
    pub fn sync_data(&mut self) -> Result<()> {
        self.sync(true)
    }

    fn sync(&mut self, datasync: bool) -> Result<()> {
        self.live()?;
        self.flush_writes()?;
        self.commit(datasync)
    }

    /// Takes, changes or releases a record lock without waiting: a lock held
    /// by another owner gives `EAGAIN`. Without the server's `LOCKS`
    /// capability every lock call fails with `ENOLCK`. A granted lock drops
    /// read-ahead, so what is read under the lock was read after it.
    pub fn try_lock(&self, spec: &LockSpec) -> Result<()> {
        let (owner, kind, typ) = spec.wire();
        self.lock_call(|handle| Request::Lock {
            handle,
            owner,
            start: spec.start,
            len: spec.len,
            pid: spec.pid,
            kind,
            typ,
        })?;
        if spec.typ != LockType::Unlock {
            self.locked.store(true, Ordering::Relaxed);
        }
        match spec.kind {
            LockKind::Posix(o) => self.client.posix_granted((self.attr.dev, self.attr.ino), o, spec),
            LockKind::Ofd => lock(&self.handle_locks).0.set(spec),
            LockKind::Flock => lock(&self.handle_locks).1.set(spec),
        }
        self.drop_prefetch();
        Ok(())
    }

    /// Sends a lock request on the handle, again on the connection that
    /// replaces a lost one (the file opened again and its locks taken again
    /// first, by `live`). A lock request may run twice: one owner taking or
    /// releasing the same range again changes nothing, and a server that
    /// died holding it has forgotten it. Without this, a program that
    /// locks on every transaction (sqlite3) failed with EIO when the server
    /// restarted under its lock call.
    fn lock_call(&self, req: impl Fn(u64) -> Request<'static>) -> Result<crate::wire::Frame> {
        for _ in 0..AGAIN_MAX {
            self.live()?;
            let epoch = self.epoch.load(Ordering::Acquire);
            let engine = self.client.engine();
            if !engine.has_cap(caps::LOCKS) {
                return Err(Error::remote(libc::ENOLCK));
            }
            match engine.call(&req(self.handle())) {
                Err(err) if self.went_stale(&err, epoch) || self.client.replaced(&engine, &err)? => continue,
                other => return other,
            }
        }
        Err(Error::remote(libc::EIO))
    }

    /// Takes a lock, waiting (polling with [`backoff`](crate::backoff)) while
    /// another owner holds a conflicting one.
    pub fn lock(&self, spec: &LockSpec) -> Result<()> {
        let mut n = 0;
        loop {
            match self.try_lock(spec) {
                Err(e) if e.errno() == libc::EAGAIN => std::thread::sleep(crate::backoff(n)),
                r => return r,
            }
            n += 1;
        }
    }

    /// Releases the `kind` lock over `start`, `len` (0: to the end of file).
    pub fn unlock(&self, kind: LockKind, start: u64, len: u64) -> Result<()> {
        self.try_lock(&LockSpec { kind, typ: LockType::Unlock, start, len, pid: 0 })
    }

    /// `F_GETLK`: the first lock of another owner that conflicts with
    /// `spec` (whose type must be `Read` or `Write`), if any.
    pub fn get_lock(&self, spec: &LockSpec) -> Result<Option<LockHolder>> {
        let (owner, kind, typ) = spec.wire();
        if spec.typ == LockType::Unlock {
            return Err(Error::remote(libc::EINVAL));
        }
        let frame = self.lock_call(|handle| Request::GetLock {
            handle,
            owner,
            start: spec.start,
            len: spec.len,
            pid: spec.pid,
            kind,
            typ,
        })?;
        match frame.reply()? {
            Reply::Lock { typ, start, len, pid } if typ != lock::UNLCK => {
                Ok(Some(LockHolder { typ: typ_from_wire(typ), start, len, pid }))
            }
            Reply::Lock { .. } => Ok(None),
            r => Err(Error::Protocol(format!("unexpected reply {r:?}"))),
        }
    }

    /// Waits for pending writes and closes; reports any failure, which a
    /// plain drop cannot.
    pub fn close(mut self) -> Result<()> {
        self.close_inner()
    }

    fn close_handle(&self, flushed: bool) -> Result<()> {
        // A stale handle has nothing left to close on the server.
        if !self.same_epoch() {
            Ok(())
        } else if self.flags & libc::O_ACCMODE as u32 == libc::O_RDONLY as u32
            && !self.locked.load(Ordering::Relaxed)
            && flushed
        {
            // Nothing to report from closing a read-only handle that holds
            // no lock: no need to wait (nothing this client sends after it
            // can tell whether it ran yet: PROTOCOL.md section 10).
            let e = self.client.engine();
            if let Ok(id) = e.start(&Request::Close { handle: self.handle() }, 0) {
                e.forget(id);
            }
            Ok(())
        } else {
            self.client.call(&Request::Close { handle: self.handle() }).map(|_| ())
        }
    }

    fn close_inner(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        self.drop_prefetch();
        let mut flushed = self.flush_writes();
        let kept = !lock(&self.unstable).is_empty();
        if kept && !self.same_epoch() {
            // The server restarted: what it may have lost goes to it again
            // before the close, so the next open finds it.
            flushed = flushed.and(self.live());
        }
        let mut closed = self.close_handle(flushed.is_ok());
        if kept && !self.same_epoch() {
            // The close itself found the server restarted.
            flushed = flushed.and(self.live());
            closed = self.close_handle(flushed.is_ok());
        }
        // A close is not a commit (as on a local file system, data not
        // fsynced may be lost in a crash of the server machine): the copies
        // go.
        lock(&self.unstable).clear();
        flushed?;
        closed
    }
}

impl Drop for File {
    fn drop(&mut self) {
        // Errors here have no one to go to; `close` reports them.
        let _ = self.close_inner();
    }
}

impl File {
    fn read_any(&mut self, buf: &mut [u8]) -> Result<usize> {
        if buf.len() < SMALL_READ {
            return self.read_small(buf);
        }
        self.read_seq(buf)
    }
}

impl File {
    /// A small sequential read the read-ahead buffer holds: its `memcpy`
    /// and nothing else (no connection looked up, no epoch checked — what
    /// the buffer holds was read before either could change, as
    /// `read_small_once` would serve it after them).
    fn read_buffered(&mut self, buf: &mut [u8]) -> Option<usize> {
        let pos = self.pos;
        let hit = buf.len() < SMALL_READ
            && !buf.is_empty()
            && self.error.is_none()
            && !self.pos_unknown
            && self.small_end == Some(pos)
            && self.rgen == self.gen.load(std::sync::atomic::Ordering::Relaxed)
            && pos >= self.rbase
            // Whole: a read that straddles the buffer's end is filled by
            // `read_small`, as every small read is.
            && pos + buf.len() as u64 <= self.rbase + self.rlen as u64;
        if !hit {
            return None;
        }
        let off = (pos - self.rbase) as usize;
        let n = buf.len();
        buf[..n].copy_from_slice(&self.rbuf[off..off + n]);
        self.pos += n as u64;
        self.small_end = Some(self.pos);
        Some(n)
    }
}

impl io::Read for File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(n) = self.read_buffered(buf) {
            return Ok(n);
        }
        if let Some(entry) = &self.cached {
            let n = self.cached_read(entry, buf, self.pos)?;
            self.pos += n as u64;
            return Ok(n);
        }
        self.live()?;
        let engine = self.client.engine();
        match self.read_any(buf) {
            // Lost with its connection: read-ahead went with it; the read
            // (which moved nothing yet) is done again on the new one.
            Err(e) if self.client.replaced(&engine, &e)? => {
                self.drop_prefetch();
                self.live()?;
                Ok(self.read_any(buf)?)
            }
            r => Ok(r?),
        }
    }
}

impl io::Write for File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.live()?;
        Ok(self.write_seq(buf)?)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(self.flush_writes()?)
    }
}

impl io::Seek for File {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        if self.pos_unknown {
            self.sync_pos()?;
        }
        let base = match pos {
            SeekFrom::Start(o) => {
                if o != self.pos {
                    self.small_end = None;
                    self.rlen = 0;
                }
                self.pos = o;
                return Ok(o);
            }
            SeekFrom::Current(d) => (self.pos as i128, d),
            SeekFrom::End(d) => (self.metadata()?.size as i128, d),
        };
        let to = base.0 + base.1 as i128;
        if to < 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        if to as u64 != self.pos {
            self.small_end = None;
            self.rlen = 0;
        }
        self.pos = to as u64;
        Ok(self.pos)
    }
}
