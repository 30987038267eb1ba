//! Path operations on one server, shaped like `std::fs`.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ferry_proto::{caps, Attr, DirEntry, Reply, Request, StatFs, Target, Time};

use crate::cache::Cache;
use crate::channels::Channels;
use crate::engine::{Engine, Frame, Options};
use crate::error::{Error, Result};
use crate::file::{File, OpenOptions};
use crate::gateways::Gateways;
use crate::lock::{Held, LockKind, LockSpec};
use crate::redial::{self, is_lost, Redial};

/// A connection to one server. Cheap to clone: clones share the connection
/// and its window (and, with `Options::reconnect`, its replacement).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    /// The connection in use; replaced by a reconnect.
    engine: Mutex<Arc<Engine>>,
    redial: Option<Redial>,
    /// Bytes of writes kept until the server commits them, over all files.
    unstable: Arc<AtomicUsize>,
    /// The local cache, and what names this server in its keys.
    cache: Option<(Arc<Cache>, Vec<u8>)>,
    /// File data received from the server by positional reads.
    fetched: std::sync::atomic::AtomicU64,
    ahead: std::sync::atomic::AtomicU64,
    /// Connections for bulk data beside the main one, if any.
    channels: Option<Channels>,
    /// Writes of all files sent behind and not yet answered.
    behind: Arc<AtomicUsize>,
    /// The POSIX locks this client holds, per file (the server's `dev`,
    /// `ino` at open) and owner: what to take again from a server that lost
    /// them. Locks of handles (OFD, `flock`) are their `File`'s.
    posix: Mutex<HashMap<(u64, u64, u64), PosixHeld>>,
    /// The slots this client gave its requests' callers (`IDENTITY`).
    slots: crate::caller::Slots,
}

/// One owner's POSIX locks on one file, and the epoch they were last taken
/// in: asked for again once per epoch, by whichever of its files opens
/// again first.
struct PosixHeld {
    held: Held,
    epoch: u64,
    /// Asking for them again failed (another owner took the range
    /// meanwhile): every file of the owner is stale.
    lost: bool,
}

/// What it takes to rejoin a session from another connection: its id and
/// secret (derived at both ends, never sent). Keep it private.
#[derive(Clone)]
pub struct SessionTicket {
    pub id: u64,
    secret: [u8; 32],
    /// How long the server keeps the session after its last connection.
    pub lease: std::time::Duration,
    /// The server instance the session's handles live in.
    pub(crate) boot: u64,
    /// Whether its handles outlive a connection (not a volatile session).
    pub(crate) keeps_handles: bool,
}

impl SessionTicket {
    pub(crate) fn new(id: u64, secret: [u8; 32], lease: std::time::Duration, boot: u64) -> SessionTicket {
        SessionTicket { id, secret, lease, boot, keeps_handles: true }
    }

    pub(crate) fn secret(&self) -> &[u8; 32] {
        &self.secret
    }
}

impl std::fmt::Debug for SessionTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionTicket").field("id", &self.id).field("lease", &self.lease).finish_non_exhaustive()
    }
}

/// Directory batch size asked of the server.
const DIR_BATCH: u32 = 1024;

/// A path's bytes as the protocol carries them: names are bytes on Linux,
/// not always UTF-8.
fn bytes(p: &Path) -> &[u8] {
    p.as_os_str().as_bytes()
}

fn unexpected(r: Reply<'_>) -> Error {
    Error::Protocol(format!("unexpected reply {r:?}"))
}

/// Whether a request names an open handle: after a reconnect that could
/// not rejoin the session, such a request is stale and must not be sent
/// (the handle may mean nothing, or, on an old server, something else).
fn names_handle(req: &Request<'_>) -> bool {
    req.handle().is_some()
}

/// What a request does if sent twice. Requests that change the name space,
/// and `Write` at the handle's offset, must not run twice: after a lost
/// connection they fail unless they were certainly never sent.
fn repeatable(req: &Request<'_>) -> bool {
    !req.once_only() && !matches!(req, Request::Write { .. } | Request::Read { .. } | Request::Seek { .. })
}

/// The empty reply of a request that needs nothing more done (a `Close` of
/// a handle the server no longer has).
fn done(req: &Request<'_>) -> Frame {
    Frame { op: req.op(), body: Vec::new(), data_len: 0 }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Client {
    /// Connects to the server at `addr`, or to one of several gateways
    /// exporting the same file system (`h1:7070,h2:7070`): a random one
    /// that answers, and another when it stops answering (with
    /// `Options::reconnect`).
    pub fn connect(addr: &str, opts: &Options) -> Result<Client> {
        let gateways = Gateways::new(addr);
        let engine = match opts.reconnect {
            Some(bound) => first_connect(&gateways, addr, opts, bound)?,
            None => gateways.connect(opts)?,
        };
        let redial = opts.reconnect.map(|bound| Redial::new(gateways, opts, bound, &engine));
        let unstable = Arc::new(AtomicUsize::new(0));
        let cache = opts.cache.clone().map(|c| (c, format!("{addr}\0").into_bytes()));
        Ok(Client {
            inner: Arc::new(Inner {
                engine: Mutex::new(Arc::new(engine)),
                redial,
                unstable,
                cache,
                fetched: 0.into(),
                posix: Mutex::default(),
                ahead: 0.into(),
                channels: Channels::new(opts),
                behind: Arc::default(),
                slots: Default::default(),
            }),
        })
    }

    /// A data channel beside the main connection `main` and the transfer
    /// size from which to use it; `None`: everything on `main`.
    pub(crate) fn bulk(&self, main: &Arc<Engine>) -> Option<(Arc<Engine>, usize)> {
        let c = self.inner.channels.as_ref()?;
        c.pick(main, || self.inner.redial.as_ref().and_then(Redial::ticket)).map(|e| (e, c.threshold()))
    }

    /// A connection to the server's Unix socket in `main`'s session, if the
    /// server is on this host and offers descriptors of its files.
    pub(crate) fn local_engine(&self, main: &Arc<Engine>) -> Option<Arc<Engine>> {
        let c = self.inner.channels.as_ref()?;
        c.local(main, || self.inner.redial.as_ref().and_then(Redial::ticket))
    }

    /// Whether the server is on this host and lends descriptors of its
    /// files (`LocalAddr` answered and its Unix socket reached, once per
    /// main connection).
    pub fn on_server_host(&self) -> bool {
        self.local_engine(&self.engine()).is_some()
    }

    /// Another client of this server, over its Unix socket, if it is on
    /// this host and offers descriptors of its files: the server tells its
    /// socket and process id (`LocalAddr`), and the socket's peer must be
    /// that process with the same boot id. For a client with no data
    /// channels (`ferry run`, whose volatile session has nothing to share):
    /// files opened on it lend their descriptors (`File::lend_fd`).
    /// `None`: not on this host, not offered, or another server answered.
    pub fn same_host_client(&self, opts: &Options) -> Option<Client> {
        let main = self.engine();
        if !opts.same_host || !main.has_cap(caps::SAME_HOST) {
            return None;
        }
        let (pid, addr) = match main.call(&Request::LocalAddr).ok()?.reply().ok()? {
            Reply::LocalAddr { pid, addr } => (pid, String::from_utf8_lossy(addr).into_owned()),
            _ => return None,
        };
        let c = Client::connect(&addr, opts).ok()?;
        let e = c.engine();
        (e.is_unix() && e.peer_pid() == Some(pid) && e.welcome().boot_id == main.welcome().boot_id).then_some(c)
    }

    /// The transfer size from which data goes on a data channel, if the
    /// client may open any.
    pub(crate) fn bulk_threshold(&self) -> Option<usize> {
        self.inner.channels.as_ref().map(Channels::threshold)
    }

    /// Data channels open now beside the connection in use (made on the
    /// first bulk transfer; 0 without them, or after one failed).
    pub fn data_channels(&self) -> usize {
        self.inner.channels.as_ref().map_or(0, |c| c.open(&self.engine()))
    }

    /// Counts a write sent behind until the result is dropped.
    pub(crate) fn write_behind(&self) -> crate::channels::Behind {
        crate::channels::Behind::new(&self.inner.behind)
    }

    /// Whether any file has writes sent behind and not yet answered.
    pub(crate) fn writes_behind(&self) -> bool {
        self.inner.behind.load(std::sync::atomic::Ordering::Acquire) > 0
    }

    /// After `err` from data channel `e`: whether the channel was lost (and
    /// is dropped: what failed goes again on the main connection).
    pub(crate) fn channel_lost(&self, e: &Arc<Engine>, err: &Error) -> bool {
        match &self.inner.channels {
            Some(c) if is_lost(err) || e.is_dead() => {
                c.failed(e, err);
                true
            }
            _ => false,
        }
    }

    /// Bytes of file data this client's files have read from the server
    /// with positional reads (what a cache or a read-ahead saves shows
    /// here).
    pub fn bytes_fetched(&self) -> u64 {
        self.inner.fetched.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn count_fetched(&self, n: usize) {
        self.inner.fetched.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Of `bytes_fetched`, those requested ahead of the reader (counted when
    /// requested; at most the file's known size).
    pub fn bytes_read_ahead(&self) -> u64 {
        self.inner.ahead.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn count_ahead(&self, n: usize) {
        self.count_fetched(n);
        self.inner.ahead.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether files may be cached locally (a cache was given).
    pub fn caches(&self) -> bool {
        self.inner.cache.is_some()
    }

    /// A new read-only descriptor of the local copy `t` names, if the
    /// cache holds it whole; asks the server nothing. The caller vouches
    /// that the file is still that version (a lease nothing broke since
    /// the open that gave `t`).
    pub fn reopen_cached(&self, t: &crate::file::CacheTicket) -> Option<std::fs::File> {
        crate::file::reopen_cached(&self.cache()?.0, t)
    }

    /// The local cache and this server's prefix of its keys.
    pub(crate) fn cache(&self) -> Option<&(Arc<Cache>, Vec<u8>)> {
        self.inner.cache.as_ref()
    }

    /// Stores a cache policy on the server for `path` (a file, or a
    /// directory and everything below it): [`cache::CACHE`](ferry_proto::cache),
    /// `BYPASS`, or `NONE` to remove the setting.
    pub fn set_cache_policy(&self, path: impl AsRef<Path>, policy: u8) -> Result<()> {
        self.need(caps::CACHING)?;
        self.call(&Request::CacheSet { path: bytes(path.as_ref()), policy })?.reply()?;
        Ok(())
    }

    /// The policy stored on the server for `path` or a directory above it,
    /// and where (`cache::NONE` and an empty path when none).
    pub fn cache_policy(&self, path: impl AsRef<Path>) -> Result<(u8, Vec<u8>)> {
        self.need(caps::CACHING)?;
        match self.call(&Request::CacheGet { path: bytes(path.as_ref()) })?.reply()? {
            Reply::CachePolicy { policy, from } => Ok((policy, from.to_vec())),
            r => Err(unexpected(r)),
        }
    }

    /// The cache decision for `path`: the server's setting, else the rules
    /// of `cache` (the configuration file), else the naming convention.
    pub fn cache_decision(&self, path: impl AsRef<Path>, cache: &Cache) -> Result<crate::cache::Decision> {
        let (policy, from) = if self.engine().has_cap(caps::CACHING) {
            self.cache_policy(path.as_ref())?
        } else {
            (ferry_proto::cache::NONE, Vec::new())
        };
        Ok(cache.decide(bytes(path.as_ref()), policy, &from))
    }

    fn need(&self, cap: u64) -> Result<()> {
        if self.engine().has_cap(cap) {
            Ok(())
        } else {
            Err(Error::remote(libc::EOPNOTSUPP))
        }
    }

    /// The connection in use now (a reconnect replaces it).
    pub fn engine(&self) -> Arc<Engine> {
        Arc::clone(&lock(&self.inner.engine))
    }

    /// The connection in use, unless another thread holds it this instant:
    /// for a child just forked, where that thread does not exist and never
    /// lets go (`engine` would wait for ever).
    pub fn engine_if_free(&self) -> Option<Arc<Engine>> {
        match self.inner.engine.try_lock() {
            Ok(g) => Some(Arc::clone(&g)),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(Arc::clone(&e.into_inner())),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Connections made again after one was lost (0 without
    /// `Options::reconnect`).
    pub fn reconnect_count(&self) -> u64 {
        self.inner.redial.as_ref().map_or(0, Redial::reconnects)
    }

    /// Reconnects that could not rejoin the session (the server restarted,
    /// or another gateway answered).
    pub fn sessions_lost(&self) -> u64 {
        self.inner.redial.as_ref().map_or(0, Redial::sessions_lost)
    }

    /// Changes each time a reconnect could not rejoin the client's session
    /// (the server restarted): handles obtained before are stale.
    pub fn epoch(&self) -> u64 {
        self.inner.redial.as_ref().map_or(0, Redial::epoch)
    }

    /// Records a POSIX lock or unlock of `owner` on `file` the server granted.
    pub(crate) fn posix_granted(&self, file: (u64, u64), owner: u64, spec: &LockSpec) {
        let mut posix = lock(&self.inner.posix);
        let key = (file.0, file.1, owner);
        let epoch = self.epoch();
        let e = posix.entry(key).or_insert_with(|| PosixHeld { held: Held::default(), epoch, lost: false });
        e.held.set(spec);
        if e.held.is_empty() {
            posix.remove(&key);
        }
    }

    /// Each owner's POSIX locks on `file` not yet asked for again in
    /// `epoch`, or `Err` if some owner's could not be had.
    pub(crate) fn posix_to_reclaim(&self, file: (u64, u64), epoch: u64) -> Result<Vec<(u64, Vec<LockSpec>)>> {
        let posix = lock(&self.inner.posix);
        let mut out = Vec::new();
        for (&(dev, ino, owner), e) in posix.iter() {
            if (dev, ino) != file {
                continue;
            }
            if e.lost {
                return Err(Error::remote(libc::ESTALE));
            }
            if e.epoch < epoch {
                out.push((owner, e.held.specs(LockKind::Posix(owner)).collect()));
            }
        }
        Ok(out)
    }

    /// Whether some owner holds (or held, and lost) POSIX locks on `file`.
    pub(crate) fn posix_held_on(&self, file: (u64, u64)) -> bool {
        lock(&self.inner.posix).keys().any(|&(dev, ino, _)| (dev, ino) == file)
    }

    /// `owner`'s POSIX locks on `file` are held again in `epoch`.
    pub(crate) fn posix_reclaimed(&self, file: (u64, u64), owner: u64, epoch: u64) {
        if let Some(e) = lock(&self.inner.posix).get_mut(&(file.0, file.1, owner)) {
            e.epoch = e.epoch.max(epoch);
        }
    }

    /// The POSIX locks of `owner` on `file` could not be taken again.
    pub(crate) fn posix_lost(&self, file: (u64, u64), owner: u64) {
        if let Some(e) = lock(&self.inner.posix).get_mut(&(file.0, file.1, owner)) {
            e.lost = true;
        }
    }

    /// Sends a request and waits for its reply. With `Options::reconnect`, a
    /// lost connection is replaced and the request sent again if that is
    /// safe: always when it was never sent, otherwise if sending it twice
    /// does no harm (see `repeatable`); a `Close` whose handle the server no
    /// longer has is done.
    pub fn call(&self, req: &Request<'_>) -> Result<Frame> {
        // The request carries its caller's slot, named in the session
        // first; a session that does not know it (a new one, after a
        // restart or a move) refuses with ENOKEY before running anything.
        let Some((slot, caller)) = self.caller_slot()? else { return self.call_once(req) };
        let _stamp = crate::caller::Stamp::new(slot);
        // Sent again with the same id: refused, it did not run, and a
        // server that kept its reply from before a restart still knows it.
        let mut id = None;
        // Each time: named, then refused again only if the server restarted
        // in between (a session resumed from its journal keeps no slots).
        for _ in 0..8 {
            match self.call_once_as(req, &mut id) {
                Err(e) if e.errno() == libc::ENOKEY => self.name_caller(slot, &caller)?,
                other => return other,
            }
        }
        self.call_once_as(req, &mut id)
    }

    /// Sends again, under its first id, an append whose connection was lost
    /// (on the connection that replaced it, through the handle opened
    /// again): a server that ran it answers from its reply cache, or finds
    /// its data in the file after a restart, and does not append twice.
    /// A loss of this connection too comes back as it is, for the caller
    /// to reconnect and try again.
    pub(crate) fn call_again(&self, req: &Request<'_>, id: u64) -> Result<Frame> {
        for _ in 0..8 {
            let named = self.caller_slot()?;
            let _stamp = named.as_ref().map(|(slot, _)| crate::caller::Stamp::new(*slot));
            match self.engine().call_as(req, &mut Some(id)) {
                Err(e) if e.errno() == libc::ENOKEY => match &named {
                    Some((slot, c)) => self.name_caller(*slot, c)?,
                    None => return Err(e),
                },
                other => return other,
            }
        }
        Err(Error::remote(libc::ENOKEY))
    }

    /// Whether the server keeps the replies of requests that must not run
    /// twice in the session (and so can tell an append sent again).
    pub(crate) fn replays(&self) -> bool {
        let e = self.engine();
        e.has_cap(ferry_proto::caps::REPLAY) && e.has_cap(ferry_proto::caps::SESSIONS)
    }

    /// The slot of this thread's caller, named in the session first if
    /// new; `None` from a server that does not act as callers.
    fn caller_slot(&self) -> Result<Option<(u16, crate::caller::Caller)>> {
        if !self.engine().has_cap(ferry_proto::caps::IDENTITY) {
            return Ok(None);
        }
        let caller = crate::caller::current();
        // Every server instance (a restart resumes the session, not its
        // slots) and every session lost has the slots named again.
        let generation = self.inner.redial.as_ref().map_or(0, |r| r.epoch() << 32 | r.sessions_lost());
        let (slot, fresh) = self.inner.slots.of(&caller, generation).ok_or_else(|| Error::remote(libc::EUSERS))?;
        if fresh {
            self.name_caller(slot, &caller)?;
        }
        Ok(Some((slot, caller)))
    }

    /// Stamps this thread's requests sent outside [`call`](Self::call)
    /// (writes sent behind) with its caller's slot, until dropped: the
    /// server treats a write by a user as the kernel would (set-id bits).
    pub(crate) fn stamp(&self) -> Result<Option<crate::caller::Stamp>> {
        Ok(self.caller_slot()?.map(|(s, _)| crate::caller::Stamp::new(s)))
    }

    /// `Caller`: names `slot` in the session.
    fn name_caller(&self, slot: u16, c: &crate::caller::Caller) -> Result<()> {
        let groups = ferry_proto::encode_groups(&c.groups);
        let _stamp = crate::caller::Stamp::new(0);
        self.call_once(&Request::Caller { slot, uid: c.uid, gid: c.gid, groups: &groups }).map(drop)
    }

    /// [`call`](Self::call) without naming the caller.
    fn call_once(&self, req: &Request<'_>) -> Result<Frame> {
        self.call_once_as(req, &mut None)
    }

    /// `call_once` with the id `id` if it is set (a request sent again),
    /// else with a new id, left in `id`.
    fn call_once_as(&self, req: &Request<'_>, id: &mut Option<u64>) -> Result<Frame> {
        let e = self.engine();
        let Some(r) = &self.inner.redial else {
            return e.call_as(req, id);
        };
        let mut e = e;
        let epoch = r.epoch();
        let lost = r.sessions_lost();
        // A request that must not run twice, to a server that keeps the
        // replies of such requests in the session: if the connection is
        // lost after it left, it is sent again with the same id on the
        // rejoined session, and answered without running again.
        let replay = req.once_only() && e.has_cap(ferry_proto::caps::REPLAY) && e.has_cap(ferry_proto::caps::SESSIONS);
        loop {
            // Before something that must not run twice, make sure the
            // connection is not already known gone: then it surely never
            // ran, and can go on a new connection. (Anything else is sent
            // again anyway: no need to look first.)
            let unsent = if repeatable(req) { None } else { e.gone() };
            let was_unsent = unsent.is_some();
            let err = match unsent {
                Some(err) => err,
                None => match e.call_as(req, id) {
                    Err(err) if is_lost(&err) => err,
                    Err(err) if err.errno() == libc::EBADF && matches!(req, Request::Close { .. }) => {
                        return Ok(done(req))
                    }
                    other => return other,
                },
            };
            r.redial(&self.inner.engine, &e, &err)?;
            if r.epoch() != epoch && names_handle(req) {
                // The server forgot the session: there is nothing to close,
                // and nothing else to do with the handle.
                return match req {
                    Request::Close { .. } => Ok(done(req)),
                    _ => Err(Error::remote(libc::ESTALE)),
                };
            }
            if !was_unsent && !repeatable(req) {
                if replay && r.sessions_lost() == lost && id.is_some() {
                    e = self.engine();
                    continue;
                }
                return Err(Error::Io {
                    kind: std::io::ErrorKind::Interrupted,
                    errno: Some(libc::EIO),
                    message: format!(
                        "the connection was lost during a request (op {}) that must not run twice; it may or may not \
                         have been done",
                        req.op()
                    ),
                });
            }
            e = self.engine();
        }
    }

    /// The client-wide count of bytes kept for commits (see `unstable`).
    pub(crate) fn unstable_total(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.inner.unstable)
    }

    /// Whether a lost connection is replaced (`Options::reconnect`).
    pub(crate) fn reconnects(&self) -> bool {
        self.inner.redial.is_some()
    }

    /// After `err` from a request sent on `failed` outside [`call`](Self::call)
    /// (pipelined reads and writes): whether the connection was lost and has
    /// been replaced, so the caller may send again what may run twice.
    pub(crate) fn replaced(&self, failed: &Arc<Engine>, err: &Error) -> Result<bool> {
        let Some(r) = &self.inner.redial else { return Ok(false) };
        if !is_lost(err) {
            return Ok(false);
        }
        r.redial(&self.inner.engine, failed, err)?;
        Ok(true)
    }

    /// Turns on leases (capability `LEASES`): from now on `leases` is told
    /// of every change another session makes to what this client was
    /// answered, before that change is acknowledged, and again whenever the
    /// connection is replaced. Returns the lease time; `ENOSYS` from a
    /// server without leases.
    pub fn leases_on(&self, leases: Arc<crate::leases::Leases>) -> Result<std::time::Duration> {
        if let Some(r) = &self.inner.redial {
            *lock(&r.leases) = Some(Arc::clone(&leases));
        }
        self.engine().leases_on(leases)
    }

    /// Makes this connection's state (open files, offsets, locks) a session
    /// that outlives the connection for the server's lease, and returns the
    /// ticket another connection joins it with. Needs the `SESSIONS`
    /// capability (`ENOSYS` without it).
    pub fn new_session(&self) -> Result<SessionTicket> {
        redial::new_session(&self.engine(), true)
    }

    /// Joins the session of `ticket`: from now on this connection shares its
    /// open files, offsets and locks (whatever it had of its own is
    /// closed). `ESTALE` if the session is gone (lease over, server
    /// restarted), `EACCES` for a ticket of another secret.
    pub fn attach(&self, ticket: &SessionTicket) -> Result<()> {
        redial::attach(&self.engine(), ticket)
    }

    fn attr_call(&self, req: &Request<'_>) -> Result<Attr> {
        let f = self.call(req)?;
        match f.reply()? {
            Reply::Attr(a) => Ok(a),
            r => Err(unexpected(r)),
        }
    }

    fn empty_call(&self, req: &Request<'_>) -> Result<()> {
        self.call(req)?;
        Ok(())
    }

    pub fn open(&self, path: impl AsRef<Path>, opts: &OpenOptions) -> Result<File> {
        File::open(self.clone(), bytes(path.as_ref()), opts)
    }

    /// `stat`: follows a final symlink.
    pub fn metadata(&self, path: impl AsRef<Path>) -> Result<Attr> {
        self.stat(Target::Path(bytes(path.as_ref())))
    }

    /// `lstat`.
    pub fn symlink_metadata(&self, path: impl AsRef<Path>) -> Result<Attr> {
        self.stat(Target::PathNoFollow(bytes(path.as_ref())))
    }

    pub fn stat(&self, target: Target<'_>) -> Result<Attr> {
        self.attr_call(&Request::Stat { target })
    }

    /// All entries of a directory except `.` and `..`, with attributes
    /// (readdirplus, or one `stat` each if the server lacks it).
    pub fn read_dir(&self, path: impl AsRef<Path>) -> Result<Vec<DirEntry>> {
        let path = path.as_ref();
        let plus = self.engine().has_cap(caps::READDIRPLUS);
        // A directory that fits in one batch is listed in one round trip.
        let listed = if self.engine().has_cap(caps::LIST_DIR) { self.list_dir(path, plus)? } else { None };
        let mut out = match listed {
            Some(entries) => entries,
            None => self.read_dir_by_handle(path, plus)?,
        };
        if !plus {
            for e in &mut out {
                let p = join(path, e.file_name());
                e.attr = self.symlink_metadata(&p).ok();
            }
        }
        Ok(out)
    }

    /// One `ListDir`: the listing if it fitted in one batch.
    fn list_dir(&self, path: &Path, plus: bool) -> Result<Option<Vec<DirEntry>>> {
        let f = self.call(&Request::ListDir { path: bytes(path), max_entries: DIR_BATCH, plus })?;
        match f.reply()? {
            Reply::Dir { eof: true, entries } => {
                Ok(Some(entries.into_iter().filter(|e| e.name != b"." && e.name != b"..").collect()))
            }
            Reply::Dir { .. } => Ok(None),
            r => Err(unexpected(r)),
        }
    }

    fn read_dir_by_handle(&self, path: &Path, plus: bool) -> Result<Vec<DirEntry>> {
        let dir = self.open(path, OpenOptions::new().read(true).directory(true))?;
        let mut out = Vec::new();
        let mut cookie = 0;
        loop {
            let f = self.call(&Request::ReadDir { handle: dir.handle(), cookie, max_entries: DIR_BATCH, plus })?;
            let (eof, entries) = match f.reply()? {
                Reply::Dir { eof, entries } => (eof, entries),
                r => return Err(unexpected(r)),
            };
            if let Some(last) = entries.last() {
                cookie = last.cookie;
            }
            let n = entries.len();
            out.extend(entries.into_iter().filter(|e| e.name != b"." && e.name != b".."));
            if eof || n == 0 {
                break;
            }
        }
        dir.close()?;
        Ok(out)
    }

    pub fn create_dir(&self, path: impl AsRef<Path>, mode: u32) -> Result<Attr> {
        self.attr_call(&Request::Mkdir { path: bytes(path.as_ref()), mode })
    }

    /// `mknod(2)`: `mode` holds the type (`S_IFIFO`, `S_IFSOCK`, `S_IFCHR`,
    /// `S_IFBLK`, `S_IFREG`) and the permission bits.
    pub fn mknod(&self, path: impl AsRef<Path>, mode: u32, rdev: u64) -> Result<Attr> {
        self.attr_call(&Request::Mknod { path: bytes(path.as_ref()), mode, rdev })
    }

    /// `mkdir -p`.
    pub fn create_dir_all(&self, path: impl AsRef<Path>, mode: u32) -> Result<()> {
        let mut cur = Vec::new();
        for comp in bytes(path.as_ref()).split(|&b| b == b'/').filter(|c| !c.is_empty()) {
            cur.push(b'/');
            cur.extend_from_slice(comp);
            let cur = OsStr::from_bytes(&cur);
            match self.create_dir(cur, mode) {
                Ok(_) => {}
                Err(e) if e.errno() == libc::EEXIST => {
                    if !self.metadata(cur)?.is_dir() {
                        return Err(Error::remote(libc::ENOTDIR));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub fn remove_file(&self, path: impl AsRef<Path>) -> Result<()> {
        self.empty_call(&Request::Unlink { path: bytes(path.as_ref()) })
    }

    pub fn remove_dir(&self, path: impl AsRef<Path>) -> Result<()> {
        self.empty_call(&Request::Rmdir { path: bytes(path.as_ref()) })
    }

    /// `rm -r`: depth first, symlinks removed, never followed.
    pub fn remove_dir_all(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        for e in self.read_dir(path)? {
            let p = join(path, e.file_name());
            if e.kind == libc::DT_DIR {
                self.remove_dir_all(&p)?;
            } else {
                self.remove_file(&p)?;
            }
        }
        self.remove_dir(path)
    }

    pub fn rename(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<()> {
        self.rename_with_flags(from, to, 0)
    }

    /// `renameat2` flags: `RENAME_NOREPLACE` (1), `RENAME_EXCHANGE` (2).
    pub fn rename_with_flags(&self, from: impl AsRef<Path>, to: impl AsRef<Path>, flags: u32) -> Result<()> {
        if flags != 0 && !self.engine().has_cap(caps::RENAME_FLAGS) {
            return Err(Error::remote(libc::EINVAL));
        }
        self.empty_call(&Request::Rename { from: bytes(from.as_ref()), to: bytes(to.as_ref()), flags })
    }

    pub fn hard_link(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<Attr> {
        self.attr_call(&Request::Link { from: bytes(from.as_ref()), to: bytes(to.as_ref()) })
    }

    /// Creates `path` as a symlink to `target`.
    pub fn symlink(&self, target: impl AsRef<Path>, path: impl AsRef<Path>) -> Result<Attr> {
        self.attr_call(&Request::Symlink { target: bytes(target.as_ref()), path: bytes(path.as_ref()) })
    }

    pub fn read_link(&self, path: impl AsRef<Path>) -> Result<PathBuf> {
        match self.call(&Request::Readlink { path: bytes(path.as_ref()) })?.reply()? {
            Reply::Name(n) => Ok(PathBuf::from(OsStr::from_bytes(n))),
            r => Err(unexpected(r)),
        }
    }

    pub fn set_permissions(&self, target: Target<'_>, mode: u32) -> Result<Attr> {
        self.attr_call(&Request::Chmod { target, mode })
    }

    /// `u32::MAX` leaves an id unchanged.
    pub fn chown(&self, target: Target<'_>, uid: u32, gid: u32) -> Result<Attr> {
        self.attr_call(&Request::Chown { target, uid, gid })
    }

    pub fn set_times(&self, target: Target<'_>, atime: Time, mtime: Time) -> Result<Attr> {
        self.attr_call(&Request::Utimens { target, atime, mtime })
    }

    pub fn truncate(&self, target: Target<'_>, size: u64) -> Result<Attr> {
        self.attr_call(&Request::Truncate { target, size })
    }

    pub fn statfs(&self, path: impl AsRef<Path>) -> Result<StatFs> {
        match self.call(&Request::Statfs { path: bytes(path.as_ref()) })?.reply()? {
            Reply::StatFs(s) => Ok(s),
            r => Err(unexpected(r)),
        }
    }

    pub fn access(&self, path: impl AsRef<Path>, mode: u32) -> Result<()> {
        self.empty_call(&Request::Access { path: bytes(path.as_ref()), mode })
    }

    fn xattr_cap(&self) -> Result<()> {
        if self.engine().has_cap(caps::XATTR) {
            Ok(())
        } else {
            Err(Error::remote(libc::EOPNOTSUPP))
        }
    }

    fn xattr_value(&self, req: &Request<'_>) -> Result<Vec<u8>> {
        self.xattr_cap()?;
        match self.call(req)?.reply()? {
            Reply::Xattr { value, .. } => Ok(value.to_vec()),
            r => Err(unexpected(r)),
        }
    }

    /// The whole value of an extended attribute.
    pub fn get_xattr(&self, target: Target<'_>, name: impl AsRef<OsStr>) -> Result<Vec<u8>> {
        self.xattr_value(&Request::GetXattr { target, name: name.as_ref().as_bytes(), size: u32::MAX })
    }

    pub fn set_xattr(&self, target: Target<'_>, name: impl AsRef<OsStr>, value: &[u8], flags: u32) -> Result<()> {
        self.xattr_cap()?;
        self.empty_call(&Request::SetXattr { target, name: name.as_ref().as_bytes(), value, flags })
    }

    /// Attribute names.
    pub fn list_xattr(&self, target: Target<'_>) -> Result<Vec<OsString>> {
        let raw = self.xattr_value(&Request::ListXattr { target, size: u32::MAX })?;
        Ok(raw.split(|b| *b == 0).filter(|s| !s.is_empty()).map(|s| OsString::from_vec(s.to_vec())).collect())
    }

    pub fn remove_xattr(&self, target: Target<'_>, name: impl AsRef<OsStr>) -> Result<()> {
        self.xattr_cap()?;
        self.empty_call(&Request::RemoveXattr { target, name: name.as_ref().as_bytes() })
    }

    /// Round trip with no work on the server (latency measurement).
    pub fn ping(&self) -> Result<()> {
        self.empty_call(&Request::Ping)
    }

    /// Reads a whole file.
    pub fn read(&self, path: impl AsRef<Path>) -> Result<Vec<u8>> {
        let f = self.open(path, OpenOptions::new().read(true))?;
        if let Some(all) = f.whole() {
            // Opened and read in one round trip.
            let all = all.to_vec();
            f.close()?;
            return Ok(all);
        }
        let mut buf = vec![0u8; (f.attr().size as usize).max(64 * 1024)];
        let mut len = 0;
        loop {
            let n = f.read_at(&mut buf[len..], len as u64)?;
            len += n;
            if n == 0 || len < buf.len() {
                break;
            }
            // The file grew since open: keep going.
            buf.resize(buf.len() * 2, 0);
        }
        buf.truncate(len);
        f.close()?;
        Ok(buf)
    }

    /// Creates or truncates a file and writes `data` to it.
    pub fn write(&self, path: impl AsRef<Path>, data: &[u8]) -> Result<()> {
        let f = self.open(path, OpenOptions::new().write(true).create(true).truncate(true))?;
        f.write_at(data, 0)?;
        f.close()
    }
}

/// `dir/name` for a path inside the export, byte for byte (`name` is one
/// component, as a directory entry gives it).
pub fn join(dir: impl AsRef<Path>, name: impl AsRef<OsStr>) -> PathBuf {
    let (dir, name) = (bytes(dir.as_ref()), name.as_ref().as_bytes());
    let mut out = Vec::with_capacity(dir.len() + 1 + name.len());
    out.extend_from_slice(dir);
    if !dir.is_empty() && !dir.ends_with(b"/") {
        out.push(b'/');
    }
    out.extend_from_slice(name);
    PathBuf::from(OsString::from_vec(out))
}

/// With `Options::reconnect`, a server not reachable yet is waited for as a
/// lost one is (a program started while the server restarts, a `ferry cp`
/// begun a moment too early): for up to `bound`, saying so once on stderr
/// after the first second, and once more when it answers. A refusal by a server that answers (the
/// token, TLS, a protocol error) fails at once.
fn first_connect(gateways: &Gateways, addr: &str, opts: &Options, bound: Duration) -> Result<Engine> {
    let mut patience = crate::redial::Patience::new(bound, Duration::from_millis(500));
    let mut said = false;
    loop {
        let e = match gateways.connect(opts) {
            Ok(engine) => {
                if said {
                    eprintln!("ferry: {addr}: reached");
                }
                return Ok(engine);
            }
            Err(e) if !unreachable(&e) => return Err(e),
            Err(e) => e,
        };
        if patience.over() {
            let waited = format!("waited {} s for it", bound.as_secs_f64());
            return Err(match e {
                Error::Io { kind, errno, message } => {
                    Error::Io { kind, errno, message: format!("{message} ({waited})") }
                }
                other => other,
            });
        }
        // Said once the wait is more than a hiccup.
        if !said && patience.waited() >= Duration::from_secs(1) {
            eprintln!("ferry: {addr}: not reachable ({e}); waiting for it ({})", patience.until(bound));
            said = true;
        }
        patience.pause();
    }
}

/// Whether a connect failed as it does while a server is down or
/// restarting (or too busy), not because of what it answered.
fn unreachable(e: &Error) -> bool {
    const DOWN: [i32; 8] = [
        libc::ECONNREFUSED,
        libc::ECONNRESET,
        libc::ECONNABORTED,
        libc::ETIMEDOUT,
        libc::EHOSTUNREACH,
        libc::ENETUNREACH,
        libc::EPIPE,
        // A Unix socket not made yet.
        libc::ENOENT,
    ];
    match e {
        Error::Io { errno: Some(n), .. } => DOWN.contains(n),
        Error::Io { kind, .. } => {
            matches!(kind, std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::ConnectionReset)
        }
        Error::Remote { errno, .. } => *errno == libc::EBUSY,
        _ => false,
    }
}
