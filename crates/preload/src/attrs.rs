//! A short-lived attribute cache: what `readdir` (readdirplus) and `stat`
//! just fetched answers the `stat`/`lstat`/`fstatat`/`statx` calls that
//! follow, for `FERRY_ATTR_TIMEOUT` seconds (`ferry run --attr-timeout`,
//! 1 s by default, 0: off), so `ls -l`, `find`, `du` and builds cost one
//! request per directory instead of one per entry.
//!
//! Coherence, as NFS's attribute cache: another client's change shows
//! within the timeout. This process's own changes show at once: any call
//! that may change a file or the name space (a write, a `chmod`, a rename,
//! an open that creates or truncates, ...) empties the cache.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use ferry_client::Attr;

use crate::sync::Mutex;

/// Entries kept at most; past it the cache starts again (a walk of a huge
/// tree needs each entry only right after its directory was read).
const MAX_ENTRIES: usize = 1 << 16;

/// `(mount, path inside the export, followed a final symlink)`.
type Key = (usize, Vec<u8>, bool);

struct Cache {
    map: HashMap<Key, (Attr, Instant)>,
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);
/// Whether the cache may hold anything: lets the many calls that would
/// empty an empty cache skip its lock.
static FILLED: AtomicBool = AtomicBool::new(false);
/// Bumped by every change: an answer fetched before a change is not put
/// in after it.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// The timeout in microseconds (0: off); set once at start.
static TIMEOUT_US: AtomicU64 = AtomicU64::new(1_000_000);

/// `FERRY_ATTR_TIMEOUT` (seconds), read at start.
pub fn configure(env: Option<&str>) {
    let secs = env.and_then(|v| v.parse::<f64>().ok()).filter(|s| s.is_finite() && *s >= 0.0).unwrap_or(1.0);
    TIMEOUT_US.store((secs * 1e6) as u64, Relaxed);
}

pub fn timeout() -> Option<Duration> {
    match TIMEOUT_US.load(Relaxed) {
        0 => None,
        us => Some(Duration::from_micros(us)),
    }
}

fn put_locked(c: &mut Option<Cache>, key: Key, attr: Attr, at: Instant) {
    let c = c.get_or_insert_with(|| Cache { map: HashMap::new() });
    if c.map.len() >= MAX_ENTRIES {
        c.map.clear();
    }
    c.map.insert(key, (attr, at));
}

/// Taken before fetching what `put` or `put_listing` will keep.
pub fn generation() -> u64 {
    GENERATION.load(Relaxed)
}

/// Remembers what a `stat` (`follow`) or `lstat` of `path` answered, if
/// nothing changed since `gen`.
pub fn put(gen: u64, mount: usize, path: &[u8], follow: bool, attr: Attr) {
    if timeout().is_none() {
        return;
    }
    let mut c = CACHE.lock();
    if GENERATION.load(Relaxed) != gen {
        return;
    }
    put_locked(&mut c, (mount, path.to_vec(), follow), attr, Instant::now());
    FILLED.store(true, Relaxed);
}

/// Remembers a directory listing's attributes (as `lstat` sees them), if
/// nothing changed since `gen`.
pub fn put_listing<'a>(gen: u64, mount: usize, dir: &[u8], entries: impl Iterator<Item = (&'a [u8], &'a Attr)>) {
    if timeout().is_none() {
        return;
    }
    let now = Instant::now();
    let base = dir.strip_suffix(b"/").unwrap_or(dir);
    let mut c = CACHE.lock();
    if GENERATION.load(Relaxed) != gen {
        return;
    }
    for (name, attr) in entries {
        let mut path = Vec::with_capacity(base.len() + 1 + name.len());
        path.extend_from_slice(base);
        path.push(b'/');
        path.extend_from_slice(name);
        put_locked(&mut c, (mount, path, false), *attr, now);
    }
    FILLED.store(true, Relaxed);
}

/// What the cache knows of `stat` (`follow`) or `lstat` of `path`.
pub fn get(mount: usize, path: &[u8], follow: bool) -> Option<Attr> {
    let ttl = timeout()?;
    if !FILLED.load(Relaxed) {
        return None;
    }
    let c = CACHE.lock();
    let map = &c.as_ref()?.map;
    let fresh = |k: &Key| map.get(k).filter(|(_, at)| at.elapsed() < ttl).map(|(a, _)| *a);
    // An `lstat` answer is a `stat` answer too unless it is a symlink.
    let plain = fresh(&(mount, path.to_vec(), false));
    match plain {
        Some(a) if !follow || a.mode & libc::S_IFMT != libc::S_IFLNK => Some(a),
        _ if follow => fresh(&(mount, path.to_vec(), true)),
        _ => None,
    }
}

/// This process changed something: forget everything.
pub fn changed() {
    GENERATION.fetch_add(1, Relaxed);
    if FILLED.swap(false, Relaxed) {
        if let Some(c) = CACHE.lock().as_mut() {
            c.map.clear();
        }
    }
}

/// For the `fork` handlers: the child may need the cache.
pub fn hold_for_fork() {
    std::mem::forget(CACHE.lock());
}

/// # Safety
/// Only after `hold_for_fork`, in the thread that called it.
pub unsafe fn release_after_fork() {
    // SAFETY: the caller took the lock in `hold_for_fork` and forgot its guard.
    unsafe { CACHE.force_unlock() };
}
