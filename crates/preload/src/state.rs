//! Process-wide state: the mount table, one connection per server, the
//! remote working directory, and the table of remote file descriptors.
//!
//! Locks are `sync`'s futex locks so that the `fork` handlers can take them
//! all before the fork and release them in both processes: a lock held by
//! another thread at `fork` would otherwise stay locked in the child.
//! Order, everywhere: `maps`'s locks, `TABLE`, an open file's `io`, `MOUNTS`, `CWD`,
//! `CONNS`, `REPORTED`, `NOT_LOCAL`, `lent`'s table (a thread never takes an earlier one while holding
//! a later one; `before_fork` takes them all in this order).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use crate::sync::{Mutex, RwLock};
use ferry_client::{Client, Error, Options};

use crate::mounts::{self, Mount, Remote};
use crate::namespace;
use crate::open::Open;

/// Settings read once at start.
pub struct Config {
    pub options: Options,
    /// Environment entries to put back if an `exec` drops them.
    pub keep_env: Vec<(String, String)>,
}

static CONFIG: OnceLock<Config> = OnceLock::new();
pub static MOUNTS: RwLock<Vec<Mount>> = RwLock::new(Vec::new());
/// One connection per server address, made on first use.
static CONNS: Mutex<Conns> = Mutex::new(Conns { live: Vec::new(), retired: Vec::new() });

struct Conns {
    live: Vec<(String, Client)>,
    /// Connections dropped after an error, still referenced by open files.
    /// Kept for good: their descriptors stay ours (registered, never closed
    /// under a number the program may have reused). One per lost
    /// connection, so a flaky server costs one descriptor per failure.
    retired: Vec<Client>,
}

impl Conns {
    fn all(&self) -> impl Iterator<Item = &Client> {
        self.live.iter().map(|(_, c)| c).chain(self.retired.iter())
    }
}

/// The lowest descriptor number ferry ever used for itself: a `close` or
/// `dup2` below it needs no look at the connections.
static LOWEST_INTERNAL: AtomicI32 = AtomicI32::new(i32::MAX);
/// Addresses already reported as unreachable (one message each).
static REPORTED: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// The remote working directory (local view), if `chdir` went remote.
pub static CWD: RwLock<Option<Vec<u8>>> = RwLock::new(None);
pub static TABLE: Mutex<Option<HashMap<i32, Arc<Open>>>> = Mutex::new(None);
/// One bit per fd below `BITS`: a lock-free "is this fd remote?" for the
/// hot path of every hooked call on a local fd.
const BITS: usize = 1 << 16;
static REMOTE_BITS: [AtomicU64; BITS / 64] = [const { AtomicU64::new(0) }; BITS / 64];
/// fds at or above `BITS` that are remote (rare): checked under the lock.
static HIGH_FDS: AtomicBool = AtomicBool::new(false);

/// The process that owns the state. A hook that sees another pid runs in
/// a `vfork`/`posix_spawn` child sharing our memory: it must not touch it.
pub static OWNER: AtomicI32 = AtomicI32::new(0);
/// Bumped in a `fork` child: handles from before belong to the parent's
/// connection and must be opened again.
pub static EPOCH: AtomicU64 = AtomicU64::new(1);
/// Set once exit has begun: writes are no longer gathered.
pub static EXITING: AtomicBool = AtomicBool::new(false);
pub static UMASK: AtomicU32 = AtomicU32::new(0o022);
/// Set once `init` finished with a non-empty mount table.
pub static ACTIVE: AtomicBool = AtomicBool::new(false);

pub fn config() -> Option<&'static Config> {
    CONFIG.get()
}

pub fn set_config(c: Config) {
    let _ = CONFIG.set(c);
}

pub fn getpid() -> i32 {
    // SAFETY: getpid has no preconditions; the raw syscall avoids any
    // cached value a vfork child would share with its parent.
    unsafe { libc::syscall(libc::SYS_getpid) as i32 }
}

/// Are we in the process that owns the state (not a vfork child)?
pub fn owner() -> bool {
    OWNER.load(Relaxed) == getpid()
}

pub fn is_remote_fd(fd: i32) -> bool {
    if fd < 0 {
        return false;
    }
    let fd = fd as usize;
    if fd < BITS {
        REMOTE_BITS[fd / 64].load(Relaxed) & (1 << (fd % 64)) != 0
    } else {
        HIGH_FDS.load(Relaxed) && TABLE.lock().as_ref().is_some_and(|t| t.contains_key(&(fd as i32)))
    }
}

fn set_bit(fd: i32, on: bool) {
    let fd = fd as usize;
    if fd < BITS {
        let bit = 1u64 << (fd % 64);
        if on {
            REMOTE_BITS[fd / 64].fetch_or(bit, Relaxed);
        } else {
            REMOTE_BITS[fd / 64].fetch_and(!bit, Relaxed);
        }
    } else if on {
        HIGH_FDS.store(true, Relaxed);
    }
}

pub fn get(fd: i32) -> Option<Arc<Open>> {
    if !is_remote_fd(fd) {
        return None;
    }
    TABLE.lock().as_ref().and_then(|t| t.get(&fd).cloned())
}

/// Records `fd` as remote; returns what it replaced.
pub fn insert(fd: i32, open: Arc<Open>) -> Option<Arc<Open>> {
    let mut t = TABLE.lock();
    let old = t.get_or_insert_with(HashMap::new).insert(fd, open);
    set_bit(fd, true);
    old
}

pub fn remove(fd: i32) -> Option<Arc<Open>> {
    if !is_remote_fd(fd) {
        return None;
    }
    let mut t = TABLE.lock();
    set_bit(fd, false);
    t.as_mut().and_then(|t| t.remove(&fd))
}

pub fn all_opens() -> Vec<(i32, Arc<Open>)> {
    TABLE.lock().as_ref().map(|t| t.iter().map(|(k, v)| (*k, v.clone())).collect()).unwrap_or_default()
}

/// The connection for a mount, made on first use.
pub fn client(mount: usize) -> Result<Client, i32> {
    let (addr, same) = {
        let mounts = MOUNTS.read();
        let addr = mounts.get(mount).map(|m| m.url.addr.clone()).ok_or(libc::EIO)?;
        let same: Vec<usize> = (0..mounts.len()).filter(|&i| mounts[i].url.addr == addr).collect();
        (addr, same)
    };
    let mut conns = CONNS.lock();
    if let Some((_, c)) = conns.live.iter().find(|(a, _)| *a == addr) {
        return Ok(c.clone());
    }
    let opts = config().map(|c| c.options.clone()).unwrap_or_default();
    match Client::connect(&addr, &opts) {
        Ok(c) => {
            LOWEST_INTERNAL.fetch_min(c.engine().raw_fd(), Relaxed);
            // Caching by lease where the server grants them; else by the
            // attribute timeout alone.
            let leases = ferry_client::Leases::new(crate::attrs::on_break());
            if c.leases_on(std::sync::Arc::clone(&leases)).is_ok() {
                let long = c.engine().has_cap(ferry_client::caps::WATCHED);
                crate::attrs::set_leases(&same, &leases, long);
            }
            conns.live.push((addr, c.clone()));
            Ok(c)
        }
        Err(e) => {
            report(&addr, &e.to_string());
            Err(match e {
                Error::Auth(_) => libc::EACCES,
                _ => libc::EIO,
            })
        }
    }
}

/// Servers found not on this host (or lending no descriptors): not asked
/// again by this process.
static NOT_LOCAL: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A second connection for `mount`, to its server's Unix socket, when the
/// server is on this host (`Client::same_host_client`): files opened on it
/// lend their descriptors. Made once per process, kept with the others (a
/// descriptor of ferry's own, high and close-on-exec, forgotten at `fork`).
pub fn local_client(mount: usize) -> Option<Client> {
    let main = client(mount).ok()?;
    let addr = MOUNTS.read().get(mount).map(|m| m.url.addr.clone())?;
    let key = format!("local:{addr}");
    if let Some((_, c)) = CONNS.lock().live.iter().find(|(a, _)| *a == key) {
        return Some(c.clone());
    }
    if NOT_LOCAL.lock().contains(&addr) {
        return None;
    }
    let opts = config().map(|c| c.options.clone()).unwrap_or_default();
    // Nothing to reconnect: a lost side connection only sends files back
    // to the main one.
    let opts = Options { reconnect: None, ..opts };
    let Some(c) = main.same_host_client(&opts) else {
        NOT_LOCAL.lock().push(addr);
        return None;
    };
    LOWEST_INTERNAL.fetch_min(c.engine().raw_fd(), Relaxed);
    let mut conns = CONNS.lock();
    if let Some((_, other)) = conns.live.iter().find(|(a, _)| *a == key) {
        // Another thread made one meanwhile: ours is kept (its descriptor
        // stays ferry's), unused.
        let other = other.clone();
        conns.retired.push(c);
        return Some(other);
    }
    conns.live.push((key, c.clone()));
    Some(c)
}

/// The side connection of `mount` failed: files go the usual way from now.
pub fn local_lost(mount: usize) {
    let Some(addr) = MOUNTS.read().get(mount).map(|m| m.url.addr.clone()) else { return };
    let key = format!("local:{addr}");
    let mut conns = CONNS.lock();
    if let Some(i) = conns.live.iter().position(|(a, _)| *a == key) {
        let (_, c) = conns.live.remove(i);
        conns.retired.push(c);
    }
    drop(conns);
    NOT_LOCAL.lock().push(addr);
}

/// One line on stderr per unreachable server, so a program's own error
/// message ("Input/output error") is not the only clue.
fn report(addr: &str, why: &str) {
    let mut seen = REPORTED.lock();
    if seen.iter().any(|a| a == addr) {
        return;
    }
    seen.push(addr.to_string());
    let msg = format!("ferry: cannot use ferry://{addr}/: {why}\n");
    // SAFETY: writing a buffer we own to fd 2.
    unsafe { crate::real::write(2, msg.as_ptr().cast(), msg.len()) };
}

/// Maps a client error to errno; a broken connection is dropped so the
/// next call connects again (after a server restart, say).
pub fn errno_of(mount: usize, e: &Error) -> i32 {
    match e {
        Error::Io { .. } | Error::Protocol(_) => {
            let addr = MOUNTS.read().get(mount).map(|m| m.url.addr.clone());
            if let Some(addr) = addr {
                let mut conns = CONNS.lock();
                if let Some(i) = conns.live.iter().position(|(a, _)| *a == addr) {
                    let (_, c) = conns.live.remove(i);
                    conns.retired.push(c);
                }
                drop(conns);
                report(&addr, &e.to_string());
            }
            libc::EIO
        }
        e => e.errno(),
    }
}

/// Resolves a path argument: `Some` if it is remote. `dir` is the
/// directory a relative path starts from (`None` = the working directory).
pub fn resolve(path: &[u8], dir: Option<&[u8]>) -> Option<Remote> {
    let abs = absolute(path, dir)?;
    let mounts = MOUNTS.read();
    mounts::resolve(&mounts, &namespace::normalize(&mounts, &abs))
}

/// The absolute path a path argument names, if it could be in a mount
/// (`None` for the many that cannot: the common local case stays cheap).
pub fn absolute(path: &[u8], dir: Option<&[u8]>) -> Option<Vec<u8>> {
    let mounts = MOUNTS.read();
    if mounts.is_empty() {
        return None;
    }
    if path.starts_with(b"/") {
        return mounts::might_match(&mounts, path).then(|| path.to_vec());
    }
    if let Some(d) = dir {
        return Some([d, b"/", path].concat());
    }
    // A copy, not the guard: the program may change it meanwhile.
    let cwd = CWD.read().clone();
    match cwd {
        Some(cwd) => Some([&cwd[..], b"/", path].concat()),
        // A local working directory: a path can only get into a mount
        // through a mount point's own name (`rmt/q` from the mount's
        // parent, `../remote/x`); only then is the kernel's cwd read.
        None if namespace::may_enter(&mounts, path) => {
            drop(mounts);
            let real = namespace::real_cwd()?;
            Some([&real[..], b"/", path].concat())
        }
        None => None,
    }
}

/// The absolute path, `.` and `..` resolved as the kernel walks, that a
/// path argument names when it is *not* remote but passes through a mount
/// (`rmt/../x`, `/remote/..`), or leaves a remote working directory: the
/// kernel must be given this, since the mount point need not exist
/// locally and its own working directory is elsewhere.
pub fn local_detour(path: &[u8]) -> Option<Vec<u8>> {
    let remote_cwd = CWD.read().is_some();
    if !remote_cwd && !namespace::has_dotdot(path) {
        return None;
    }
    let abs = absolute(path, None)?;
    let mounts = MOUNTS.read();
    let norm = namespace::normalize(&mounts, &abs);
    if mounts::resolve(&mounts, &norm).is_some() {
        return None;
    }
    // Only a path whose walk touches a mount needs the detour.
    let touches = {
        let mut cur: Vec<u8> = Vec::new();
        abs.split(|c| *c == b'/').filter(|c| !c.is_empty() && *c != b".").any(|c| {
            if c == b".." {
                let cut = cur.iter().rposition(|b| *b == b'/').unwrap_or(0);
                cur.truncate(cut);
                false
            } else {
                cur.push(b'/');
                cur.extend_from_slice(c);
                mounts::resolve(&mounts, &cur).is_some()
            }
        })
    };
    touches.then_some(norm)
}

/// Finds or adds the mount for `prefix=url` (an fd inherited from a
/// process whose mount table we lack).
pub fn mount_index(prefix: &str, url: &str) -> Option<usize> {
    let m = mounts::parse_one(prefix, url).ok()?;
    let mut mounts = MOUNTS.write();
    if let Some(i) = mounts.iter().position(|x| x.url == m.url && x.prefix == m.prefix) {
        return Some(i);
    }
    mounts.push(m);
    Some(mounts.len() - 1)
}

// ---- ferry's own descriptors ----

/// Where a new connection's descriptor goes: near the top of the
/// descriptor limit, close-on-exec, where programs do not reach (shells
/// use 3-9 and 10-255, `dup2` targets are small numbers). Lower if the top
/// is full; any free number as a last resort.
pub fn place_high(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct we pass.
    let limit = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 { rl.rlim_cur } else { 1024 };
    // A huge limit would make the kernel grow the descriptor table to it.
    let top = limit.min(1 << 16) as i32;
    let mut last = std::io::Error::from_raw_os_error(libc::EMFILE);
    for min in [top - 16, top - 256, top / 2, 10, 3] {
        if min < 3 {
            continue;
        }
        // SAFETY: F_DUPFD_CLOEXEC on a descriptor we hold; the new one is ours.
        let r = unsafe { crate::real::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min as usize) };
        if r >= 0 {
            LOWEST_INTERNAL.fetch_min(r, Relaxed);
            // SAFETY: r was just made by fcntl and belongs to no one else.
            return Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(r) });
        }
        last = std::io::Error::last_os_error();
    }
    Err(last)
}

/// A descriptor of ferry's own that is no connection of `CONNS` (a socket
/// kept for its handles, `lent.rs`).
pub fn note_internal(fd: i32) {
    LOWEST_INTERNAL.fetch_min(fd, Relaxed);
}

/// A lock-free first look for the hot path: false for every number below
/// ferry's lowest own descriptor (all of a program's usual ones).
pub fn may_be_internal(fd: i32) -> bool {
    fd >= LOWEST_INTERNAL.load(Relaxed)
}

/// Is `fd` one of ferry's connections (not the program's)?
pub fn is_internal(fd: i32) -> bool {
    if !may_be_internal(fd) {
        return false;
    }
    CONNS.lock().all().any(|c| c.engine().raw_fd() == fd) || crate::lent::is_kept(fd)
}

/// ferry's descriptors in `first..=last`, sorted.
pub fn internal_in(first: u32, last: u32) -> Vec<i32> {
    if (last as i64) < LOWEST_INTERNAL.load(Relaxed) as i64 {
        return Vec::new();
    }
    let mut v: Vec<i32> = CONNS
        .lock()
        .all()
        .map(|c| c.engine().raw_fd())
        .chain(crate::lent::kept_socks())
        .filter(|fd| *fd >= 0 && (first..=last).contains(&(*fd as u32)))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The program is about to put its own file at `fd` (`dup2`): if a
/// connection lives there, it moves to another number first. Err if no
/// number is free.
pub fn make_room(fd: i32) -> Result<(), i32> {
    let here: Vec<Client> = CONNS.lock().all().filter(|c| c.engine().raw_fd() == fd).cloned().collect();
    for c in here {
        c.engine().move_fd(place_high).map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))?;
    }
    crate::lent::make_room(fd)
}

// ---- fork ----

/// Open files whose locks `before_fork` holds, for the handlers after.
static FORK_HELD: Mutex<Vec<Arc<Open>>> = Mutex::new(Vec::new());

/// Before `fork`: everything written reaches the server (the child may read
/// it, through its own connection), and every lock the child may need is
/// held by this thread, so none is left locked by a thread the child does
/// not have. Taken in the order of the module's comment.
pub fn before_fork() {
    crate::maps::hold_for_fork();
    let table = TABLE.lock();
    let mut opens: Vec<Arc<Open>> = Vec::new();
    for (fd, o) in table.iter().flatten() {
        // The child and the parent share these offsets from now on.
        o.share(*fd);
        if !opens.iter().any(|x| Arc::ptr_eq(x, o)) {
            opens.push(o.clone());
        }
    }
    std::mem::forget(table);
    for o in &opens {
        o.hold_for_fork();
    }
    std::mem::forget(MOUNTS.write());
    std::mem::forget(CWD.write());
    std::mem::forget(CONNS.lock());
    std::mem::forget(REPORTED.lock());
    std::mem::forget(NOT_LOCAL.lock());
    crate::attrs::hold_for_fork();
    crate::hooks::hold_for_fork();
    *FORK_HELD.lock() = opens;
    crate::lent::hold_for_fork();
}

/// Releases what `before_fork` took (in the parent and in the child alike).
fn release_after_fork() {
    let opens = std::mem::take(&mut *FORK_HELD.lock());
    // SAFETY: each lock was taken by `before_fork` in this thread and its
    // guard forgotten; in the child this thread is the only one.
    unsafe {
        crate::lent::release_after_fork();
        crate::hooks::release_after_fork();
        crate::attrs::release_after_fork();
        NOT_LOCAL.force_unlock();
        REPORTED.force_unlock();
        CONNS.force_unlock();
        CWD.force_unlock_write();
        MOUNTS.force_unlock_write();
        for o in &opens {
            o.release_after_fork();
        }
        TABLE.force_unlock();
        crate::maps::release_after_fork();
    }
}

pub fn after_fork_parent() {
    release_after_fork();
}

pub fn after_fork_child() {
    release_after_fork();
    crate::attrs::forget_after_fork();
    crate::maps::after_fork_child();
    OWNER.store(getpid(), Relaxed);
    EPOCH.fetch_add(1, Relaxed);
    // Sockets holding handles the child's descriptors were lent from stay.
    let kept = crate::lent::after_fork_child();
    // The parent's connections are the parent's: never used here. Their
    // descriptors are closed (the parent's stay open, so the server sees
    // nothing) and the connections forgotten, never dropped.
    let conns = std::mem::replace(&mut *CONNS.lock(), Conns { live: Vec::new(), retired: Vec::new() });
    for c in conns.all() {
        // A connection another thread was looking up at the fork stays
        // open here (that thread is not in the child to let go of it); the
        // parent's copy keeps it open anyway.
        if let Some(e) = c.engine_if_free().filter(|e| !kept.contains(&e.raw_fd())) {
            // SAFETY: our own descriptor, in our own (new) descriptor table.
            unsafe { crate::real::close(e.raw_fd()) };
        }
    }
    std::mem::forget(conns);
}
