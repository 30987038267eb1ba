//! Process-wide state: the mount table, one connection per server, the
//! remote working directory, and the table of remote file descriptors.
//!
//! Locks are `parking_lot` so that the `fork` handlers can take them all
//! before the fork and release them in both processes: a lock held by
//! another thread at `fork` would otherwise stay locked in the child.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use ferry_client::{Client, Error, Options};
use parking_lot::{Mutex, RwLock};

use crate::mounts::{self, Mount, Remote};
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
static CONNS: Mutex<Vec<(String, Client)>> = Mutex::new(Vec::new());
/// Addresses already reported as unreachable (one message each).
static REPORTED: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// The remote working directory (local view), if `chdir` went remote.
pub static CWD: RwLock<Option<String>> = RwLock::new(None);
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
    let addr = MOUNTS.read().get(mount).map(|m| m.url.addr.clone()).ok_or(libc::EIO)?;
    let mut conns = CONNS.lock();
    if let Some((_, c)) = conns.iter().find(|(a, _)| *a == addr) {
        return Ok(c.clone());
    }
    let opts = config().map(|c| c.options.clone()).unwrap_or_default();
    match Client::connect(&addr, &opts) {
        Ok(c) => {
            conns.push((addr, c.clone()));
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
                CONNS.lock().retain(|(a, _)| *a != addr);
                report(&addr, &e.to_string());
            }
            libc::EIO
        }
        e => e.errno(),
    }
}

/// Resolves a path argument: `Some` if it is remote. `dir` is the
/// directory a relative path starts from (`None` = the working directory).
pub fn resolve(path: &[u8], dir: Option<&str>) -> Option<Remote> {
    let mounts = MOUNTS.read();
    if mounts.is_empty() {
        return None;
    }
    let path = std::str::from_utf8(path).ok()?;
    if path.starts_with('/') {
        if !mounts::might_match(&mounts, path.as_bytes()) {
            return None;
        }
        return mounts::resolve(&mounts, path);
    }
    if let Some(d) = dir {
        return mounts::resolve(&mounts, &mounts::join(d, path));
    }
    let cwd = CWD.read();
    match cwd.as_deref() {
        Some(cwd) => mounts::resolve(&mounts, &mounts::join(cwd, path)),
        // A local working directory: only `..` can climb into a mount
        // (`../remote/x` from `/`), and only then is the real one needed.
        None if path.split('/').any(|c| c == "..") => {
            let real = std::env::current_dir().ok()?;
            mounts::resolve(&mounts, &mounts::join(real.to_str()?, path))
        }
        None => None,
    }
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

// ---- fork ----

/// Before `fork`: everything written reaches the server (the child may read
/// it, through its own connection), and no lock stays held across.
pub fn before_fork() {
    crate::ops::sync_all();
    std::mem::forget(CONNS.lock());
    std::mem::forget(TABLE.lock());
}

pub fn after_fork_parent() {
    // SAFETY: both locks were taken (and their guards forgotten) by
    // `before_fork` in this thread.
    unsafe {
        CONNS.force_unlock();
        TABLE.force_unlock();
    }
}

pub fn after_fork_child() {
    // SAFETY: as in the parent: locked by `before_fork` in this thread,
    // which is the only thread of the child.
    unsafe {
        CONNS.force_unlock();
        TABLE.force_unlock();
    }
    OWNER.store(getpid(), Relaxed);
    EPOCH.fetch_add(1, Relaxed);
    // The parent's connections are the parent's: never use, never close.
    for (_, c) in std::mem::take(&mut *CONNS.lock()) {
        std::mem::forget(c);
    }
}
