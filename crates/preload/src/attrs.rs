//! A short-lived attribute cache: what `readdir` (readdirplus) and `stat`
//! just fetched answers the `stat`/`lstat`/`fstatat`/`statx` calls that
//! follow, for `FERRY_ATTR_TIMEOUT` seconds (`ferry run --attr-timeout`,
//! 1 s by default, 0: off), so `ls -l`, `find`, `du` and builds cost one
//! request per directory instead of one per entry.
//!
//! Coherence: this process's own changes show at once: any call that may
//! change a file or the name space (a write, a `chmod`, a rename, an open
//! that creates or truncates, ...) empties the cache. Another ferry
//! client's change (another process, its own children included) shows at
//! once too, from a server that grants leases: the server breaks this
//! process's lease before it acknowledges that change, and a break empties
//! the cache; what is kept is answered only while the lease holds. A change
//! made on the server's disk by a program outside ferry shows within the
//! timeout, as with NFS's attribute cache — or, from a server that watches
//! its disk (`WATCHED`), as soon as its notice of the change breaks the
//! lease; answers are then kept until a break (60 s at most).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use std::sync::Arc;

use ferry_client::{Attr, CacheTicket, Leases};

use crate::sync::Mutex;

/// Listing entries kept at most: past it the listings start again (a
/// walk of a huge tree needs each entry only right after its directory was
/// read). A single listing longer than this keeps its first entries.
const MAX_ENTRIES: usize = 1 << 16;
/// Single `stat`/`lstat` answers kept at most; past it they start again.
const MAX_ANSWERS: usize = 1 << 12;

type Attrs = HashMap<Vec<u8>, (Attr, Instant)>;

/// One directory's listing, as `lstat` sees its entries. A walk puts in
/// hundreds of entries for each few it asks, so a listing is kept as it
/// came: its names in one buffer, its entries in the server's order, and
/// an index sorted by name; not one hashed and allocated key per entry.
struct Listing {
    at: Instant,
    names: Vec<u8>,
    /// `(start, len)` of the name in `names`, and its attributes.
    entries: Vec<(u32, u32, Attr)>,
    /// `entries` indexes in name order, made when first needed: a walk
    /// that asks in the listing's order never needs it.
    sorted: Vec<u32>,
    /// The entry after the last one found: `find`, `du`, `ls -lR` and
    /// `std::fs::read_dir` callers ask in the listing's order.
    next: usize,
}

impl Listing {
    fn name(&self, i: usize) -> &[u8] {
        let (start, len, _) = self.entries[i];
        &self.names[start as usize..(start + len) as usize]
    }

    fn find(&mut self, name: &[u8]) -> Option<Attr> {
        let i = if self.next < self.entries.len() && self.name(self.next) == name {
            self.next
        } else {
            if self.sorted.len() != self.entries.len() {
                let mut sorted: Vec<u32> = (0..self.entries.len() as u32).collect();
                sorted.sort_unstable_by(|&a, &b| self.name(a as usize).cmp(self.name(b as usize)));
                self.sorted = sorted;
            }
            let k = self.sorted.binary_search_by(|&i| self.name(i as usize).cmp(name)).ok()?;
            self.sorted[k] as usize
        };
        self.next = i + 1;
        Some(self.entries[i].2)
    }
}

/// What one mount's cache holds.
struct Mount {
    mount: usize,
    /// Listings by directory path (without a trailing `/`; the root's is
    /// empty).
    listings: HashMap<Vec<u8>, Listing>,
    /// Answers of single `lstat`s (`[0]`) and `stat`s (`[1]`) by path.
    answers: [Attrs; 2],
}

#[derive(Default)]
struct Cache {
    mounts: Vec<Mount>,
    /// Entries in all listings.
    listed: usize,
    /// The leases of each mount's connection, where the server grants
    /// them: what is kept of a mount is answered only while they hold.
    leases: Vec<(usize, Arc<Leases>, bool)>,
    /// Cached files this process opened under a lease of a server that
    /// sees every change, by (mount, path): the copy a next read-only open
    /// gets without asking the server, until a break or a change empties
    /// this (the lease is the check the open's round trip made).
    copies: HashMap<(usize, Vec<u8>), CacheTicket>,
}

impl Cache {
    fn mount(&mut self, mount: usize) -> &mut Mount {
        let i = match self.mounts.iter().position(|m| m.mount == mount) {
            Some(i) => i,
            None => {
                let answers = [HashMap::new(), HashMap::new()];
                self.mounts.push(Mount { mount, listings: HashMap::new(), answers });
                self.mounts.len() - 1
            }
        };
        &mut self.mounts[i]
    }

    fn add(&mut self, mount: usize, dir: Vec<u8>, l: Listing) {
        if self.listed + l.entries.len() > MAX_ENTRIES {
            self.mounts.iter_mut().for_each(|m| m.listings.clear());
            self.listed = 0;
        }
        self.listed += l.entries.len();
        if let Some(old) = self.mount(mount).listings.insert(dir, l) {
            self.listed -= old.entries.len();
        }
    }
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
    let map = &mut c.get_or_insert_with(Cache::default).mount(mount).answers[usize::from(follow)];
    if map.len() >= MAX_ANSWERS {
        map.clear();
    }
    map.insert(path.to_vec(), (attr, Instant::now()));
    FILLED.store(true, Relaxed);
}

/// Remembers a directory listing's attributes (as `lstat` sees them), if
/// nothing changed since `gen`.
pub fn put_listing<'a>(gen: u64, mount: usize, dir: &[u8], entries: impl Iterator<Item = (&'a [u8], &'a Attr)>) {
    if timeout().is_none() {
        return;
    }
    let dir = dir.strip_suffix(b"/").unwrap_or(dir).to_vec();
    let mut l = Listing { at: Instant::now(), names: Vec::new(), entries: Vec::new(), sorted: Vec::new(), next: 0 };
    for (name, attr) in entries.take(MAX_ENTRIES) {
        let (Ok(start), Ok(len)) = (u32::try_from(l.names.len()), u32::try_from(name.len())) else { break };
        l.names.extend_from_slice(name);
        l.entries.push((start, len, *attr));
    }
    let mut c = CACHE.lock();
    if GENERATION.load(Relaxed) != gen {
        return;
    }
    c.get_or_insert_with(Cache::default).add(mount, dir, l);
    FILLED.store(true, Relaxed);
}

/// What the cache knows of `stat` (`follow`) or `lstat` of `path`.
pub fn get(mount: usize, path: &[u8], follow: bool) -> Option<Attr> {
    let ttl = timeout()?;
    if !FILLED.load(Relaxed) {
        return None;
    }
    let mut c = CACHE.lock();
    let c = c.as_mut()?;
    let mut ttl = ttl;
    if let Some((_, l, long)) = c.leases.iter().find(|(m, _, _)| *m == mount) {
        if !l.held() {
            return None;
        }
        // Promised by a server that sees every change: good until broken.
        if *long {
            ttl = ttl.max(LEASED);
        }
    }
    let m = c.mounts.iter_mut().find(|m| m.mount == mount)?;
    let answer = |m: &Mount, follow: bool| {
        let (a, at) = m.answers[usize::from(follow)].get(path)?;
        (at.elapsed() < ttl).then_some((*a, *at))
    };
    let listed = |m: &mut Mount| {
        let cut = path.iter().rposition(|&b| b == b'/')?;
        let l = m.listings.get_mut(&path[..cut]).filter(|l| l.at.elapsed() < ttl)?;
        let at = l.at;
        Some((l.find(&path[cut + 1..])?, at))
    };
    // An `lstat` answer is a `stat` answer too unless it is a symlink; of
    // an answer and a listing, the younger counts.
    let plain = match (answer(m, false), listed(m)) {
        (Some(a), Some(l)) => Some(if a.1 >= l.1 { a.0 } else { l.0 }),
        (a, l) => a.or(l).map(|(a, _)| a),
    };
    match plain {
        Some(a) if !follow || a.mode & libc::S_IFMT != libc::S_IFLNK => Some(a),
        _ if follow => answer(m, true).map(|(a, _)| a),
        _ => None,
    }
}

/// This process changed something, or a lease broke: forget everything.
pub fn changed() {
    GENERATION.fetch_add(1, Relaxed);
    if FILLED.swap(false, Relaxed) {
        if let Some(c) = CACHE.lock().as_mut() {
            c.mounts.clear();
            c.listed = 0;
            c.copies.clear();
        }
    }
}

/// Copies kept at most; past it they start again.
const MAX_COPIES: usize = 1 << 12;

/// Remembers the local copy of a cached file an open of `path` found, if
/// nothing changed or broke since `gen` (taken before its request) and the
/// mount's lease, from a server that sees every change, holds.
pub fn put_copy(gen: u64, mount: usize, path: &[u8], ticket: &CacheTicket) {
    if timeout().is_none() {
        return;
    }
    let mut c = CACHE.lock();
    let Some(c) = c.as_mut() else { return };
    if GENERATION.load(Relaxed) != gen || !c.leases.iter().any(|(m, l, long)| *m == mount && *long && l.held()) {
        return;
    }
    if c.copies.len() >= MAX_COPIES {
        c.copies.clear();
    }
    c.copies.insert((mount, path.to_vec()), ticket.clone());
    FILLED.store(true, Relaxed);
}

/// The copy of `path` a read-only open may get without asking the server:
/// one an open found under the lease that still holds.
pub fn copy(mount: usize, path: &[u8]) -> Option<CacheTicket> {
    if !FILLED.load(Relaxed) {
        return None;
    }
    let c = CACHE.lock();
    let c = c.as_ref()?;
    if !c.leases.iter().any(|(m, l, long)| *m == mount && *long && l.held()) {
        return None;
    }
    c.copies.get(&(mount, path.to_vec())).cloned()
}

/// How long an answer is kept under a lease of a server that sees every
/// change (`WATCHED`): a bound on what a break lost on the way could cost.
const LEASED: Duration = Duration::from_secs(60);

/// From now on what is kept of `mounts` holds only while `leases` do
/// (their connection turned them on); their breaks empty the cache.
/// `long`: the server sees every change, so what it promised is kept past
/// the timeout, until broken.
pub fn set_leases(mounts: &[usize], leases: &Arc<Leases>, long: bool) {
    let mut c = CACHE.lock();
    let c = c.get_or_insert_with(Cache::default);
    c.leases.retain(|(m, _, _)| !mounts.contains(m));
    c.leases.extend(mounts.iter().map(|&m| (m, Arc::clone(leases), long)));
}

/// The break handler of a connection's leases.
pub fn on_break() -> Box<ferry_client::leases::OnBreak> {
    // Returned as soon as the cache is empty (the `Return` dropped here).
    Box::new(|_, _returned| changed())
}

/// In a child just forked: nothing the parent's connections were promised
/// holds here (their breaks go to the parent), so the cache starts empty
/// and answers nothing by lease until the child's own connections do.
pub fn forget_after_fork() {
    GENERATION.fetch_add(1, Relaxed);
    FILLED.store(false, Relaxed);
    if let Some(c) = CACHE.lock().as_mut() {
        c.mounts.clear();
        c.listed = 0;
        c.leases.clear();
        c.copies.clear();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(ino: u64, mode: u32) -> Attr {
        Attr { ino, mode, ..Attr::default() }
    }

    /// One test: the cache is process-wide.
    #[test]
    fn listings_answer_lstat_in_any_order_and_changes_empty_them() {
        configure(Some("5"));
        changed();
        let names: Vec<Vec<u8>> = (0..300u32).map(|i| format!("f{}", (i * 7919) % 1000).into_bytes()).collect();
        let attrs: Vec<Attr> = (0..300).map(|i| attr(i, libc::S_IFREG)).collect();
        let listing = || names.iter().map(|n| &n[..]).zip(attrs.iter());
        put_listing(generation(), 0, b"/d/", listing());
        // In the listing's order (a walk), then backwards (a sorted `ls -l`
        // would jump about as much).
        for i in (0..300).chain((0..300).rev()) {
            let path = [&b"/d/"[..], &names[i]].concat();
            assert_eq!(get(0, &path, false).map(|a| a.ino), Some(i as u64), "{}", String::from_utf8_lossy(&path));
        }
        assert_eq!(get(0, b"/d/nothing", false), None);
        assert_eq!(get(1, b"/d/f0", false), None, "another mount");
        assert_eq!(get(0, b"/d", false), None, "the directory itself was not listed");

        // The root's entries; a symlink answers lstat, not stat.
        let root = [(&b"a"[..], attr(1, libc::S_IFDIR)), (b"l", attr(2, libc::S_IFLNK))];
        put_listing(generation(), 0, b"/", root.iter().map(|(n, a)| (*n, a)));
        assert_eq!(get(0, b"/a", true).map(|a| a.ino), Some(1));
        assert_eq!(get(0, b"/l", false).map(|a| a.ino), Some(2));
        assert_eq!(get(0, b"/l", true), None);
        put(generation(), 0, b"/l", true, attr(3, libc::S_IFREG));
        assert_eq!(get(0, b"/l", true).map(|a| a.ino), Some(3));

        // Of an answer and a listing, the younger counts.
        put(generation(), 0, b"/a", false, attr(7, libc::S_IFDIR));
        assert_eq!(get(0, b"/a", false).map(|a| a.ino), Some(7));
        put_listing(generation(), 0, b"/", root.iter().map(|(n, a)| (*n, a)));
        assert_eq!(get(0, b"/a", false).map(|a| a.ino), Some(1));

        // A listing fetched before a change is not kept after it.
        let gen = generation();
        changed();
        assert_eq!(get(0, b"/a", false), None);
        put_listing(gen, 0, b"/", root.iter().map(|(n, a)| (*n, a)));
        assert_eq!(get(0, b"/a", false), None);

        // Past MAX_ENTRIES the listings start again; the newest stays.
        let many: Vec<Vec<u8>> = (0..MAX_ENTRIES / 2 + 1).map(|i| format!("n{i}").into_bytes()).collect();
        let a = attr(9, libc::S_IFREG);
        put_listing(generation(), 0, b"/x", many.iter().map(|n| (&n[..], &a)));
        put_listing(generation(), 0, b"/y", many.iter().map(|n| (&n[..], &a)));
        assert_eq!(get(0, b"/x/n0", false), None);
        assert_eq!(get(0, b"/y/n0", false).map(|a| a.ino), Some(9));

        configure(Some("0"));
        put_listing(generation(), 0, b"/z", many.iter().map(|n| (&n[..], &a)));
        assert_eq!(get(0, b"/z/n0", false), None, "timeout 0 keeps nothing");
        configure(None);
    }
}
