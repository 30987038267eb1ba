//! Descriptors lent for writing (`ferry run` on the server's host, see
//! `samehost.rs`): the program writes the server's file with the local
//! kernel, past the server. The server breaks the file's leases when it
//! lends the descriptor and grants none while the handle it was lent from
//! is open (`LentMark`), so the one rule here is: **that handle stays open
//! while any process may still write through the descriptor.**
//!
//! In this process the table follows the descriptor's numbers (`dup`,
//! `dup2`, `F_DUPFD`, `close`, `close_range`) and closes the handle when
//! the last of them closes. Where the description may live on out of
//! sight, the handle is *pinned* — kept until its connection closes:
//!
//! - a `fork` child shares every descriptor: both pin, and the child keeps
//!   its copy of the connection's socket open, unused (the parent's
//!   connection; the child never sends on it), so the server's handle
//!   lasts until both let go of the socket;
//! - an `exec` (or a spawned program) that inherits a lent description
//!   inherits the socket too: its close-on-exec flag is cleared for the
//!   exec, and the new program's library keeps it as its own
//!   (`FERRY_KEEP`), out of the program's reach, and hands it down to its
//!   own children — the handle goes when the last of them exits;
//! - a shared mapping outlives its descriptor: pinned until exit.
//!
//! Pinning is the safe side: a pinned file only gets no leases for longer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use ferry_client::{Client, File};

use crate::sync::Mutex;

/// One lent description, shared by every number that names it here.
pub struct Lent {
    /// The handle it was lent from, on `conn` (the side connection). `None`
    /// in a `fork` child: that handle is the parent's.
    file: Option<File>,
    conn: Client,
    /// The file's `(dev, ino)`, from the descriptor itself.
    key: (u64, u64),
    /// The socket of `conn` as of the last `fork` (for a child, which must
    /// not touch the parent's connection to ask it).
    sock: AtomicI32,
    pinned: AtomicBool,
    /// Where the program opened it, and how: record locks on it are the
    /// server's (`shadow`), as on a placeholder — the server takes them as
    /// OFD locks on the file, but a program's own `flock` would not meet
    /// them, nor would clients of other gateways of a shared volume.
    remote: crate::mounts::Remote,
    flags: i32,
    /// A placeholder-less remote open of the file for its lock calls, made
    /// at the first (on the main connection, as the program's open was).
    shadow: Mutex<Option<Arc<crate::open::Open>>>,
}

impl Lent {
    /// `fd` is the descriptor lent from `file`, a handle on `conn`, for the
    /// program's open of `remote` with `flags`.
    pub fn new(
        file: File,
        conn: Client,
        fd: std::os::fd::BorrowedFd<'_>,
        remote: &crate::mounts::Remote,
        flags: i32,
    ) -> Option<Lent> {
        let st = rustix::fs::fstat(fd).ok()?;
        let key = (st.st_dev, st.st_ino);
        let sock = conn.engine().raw_fd();
        let flags = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_CLOEXEC);
        Some(Lent {
            file: Some(file),
            conn,
            key,
            sock: AtomicI32::new(sock),
            pinned: AtomicBool::new(false),
            remote: remote.clone(),
            flags,
            shadow: Mutex::new(None),
        })
    }
}

#[derive(Default)]
struct Table {
    fds: HashMap<i32, Arc<Lent>>,
    /// Handles of pinned descriptors this process no longer names: kept
    /// open, never used, until the process ends.
    kept: Vec<Arc<Lent>>,
    /// Sockets kept open only so that the handles on them stay: a `fork`
    /// parent's connection, or one inherited across `exec` (`FERRY_KEEP`).
    socks: Vec<i32>,
    /// Sockets the child of the `fork` under way keeps.
    fork_socks: Vec<i32>,
}

/// A leaf lock: nothing else is locked while it is held (the handles are
/// closed after it is let go).
static TABLE: Mutex<Option<Table>> = Mutex::new(None);

/// One bit per fd below `BITS`, as `state`'s remote bits: every `close`
/// and `dup` of the program looks here first.
const BITS: usize = 1 << 16;
static LENT_BITS: [AtomicU64; BITS / 64] = [const { AtomicU64::new(0) }; BITS / 64];
static HIGH: AtomicBool = AtomicBool::new(false);
/// Any lent descriptor or kept socket in this process ever: an `exec`
/// without looks at nothing.
static ANY: AtomicBool = AtomicBool::new(false);

fn set_bit(fd: i32, on: bool) {
    let fd = fd as usize;
    if fd < BITS {
        let bit = 1u64 << (fd % 64);
        if on {
            LENT_BITS[fd / 64].fetch_or(bit, Relaxed);
        } else {
            LENT_BITS[fd / 64].fetch_and(!bit, Relaxed);
        }
    } else if on {
        HIGH.store(true, Relaxed);
    }
}

pub fn is_lent(fd: i32) -> bool {
    if fd < 0 {
        return false;
    }
    let u = fd as usize;
    if u < BITS {
        LENT_BITS[u / 64].load(Relaxed) & (1 << (u % 64)) != 0
    } else {
        HIGH.load(Relaxed) && TABLE.lock().as_ref().is_some_and(|t| t.fds.contains_key(&fd))
    }
}

fn with<T>(f: impl FnOnce(&mut Table) -> T) -> T {
    f(TABLE.lock().get_or_insert_with(Table::default))
}

/// The program's new descriptor `fd` was lent for writing from `lent`.
pub fn add(fd: i32, lent: Lent) {
    ANY.store(true, Relaxed);
    let old = with(|t| {
        set_bit(fd, true);
        t.fds.insert(fd, Arc::new(lent))
    });
    if let Some(old) = old {
        release(old);
    }
}

/// A handle no number here names any more: closed, unless pinned. Its
/// lock handle goes in any case (with it the `flock` locks the last close
/// releases).
fn release(e: Arc<Lent>) {
    let Ok(mut e) = Arc::try_unwrap(e) else { return };
    drop(e.shadow.lock().take());
    if e.pinned.load(Relaxed) {
        with(|t| t.kept.push(Arc::new(e)));
        return;
    }
    if let Some(f) = e.file.take() {
        // A lost connection took the handle with it (a server restart):
        // nothing to report, the program's own close succeeded.
        let _ = f.close();
    }
}

/// `fd` was closed (or a `dup2` put another file there).
pub fn closed(fd: i32) {
    if !is_lent(fd) {
        return;
    }
    let gone = with(|t| {
        set_bit(fd, false);
        let e = t.fds.remove(&fd)?;
        // Checked under the lock: another number of the same description
        // closing at once sees the count after this one.
        if Arc::strong_count(&e) == 1 {
            Some(e)
        } else {
            None
        }
    });
    if let Some(e) = gone {
        release(e);
    }
}

/// The remote open that takes `fd`'s record locks, if `fd` is lent.
pub fn lock_open(fd: i32) -> Option<Arc<crate::open::Open>> {
    if !is_lent(fd) {
        return None;
    }
    let e = with(|t| t.fds.get(&fd).cloned())?;
    let mut s = e.shadow.lock();
    let o = s.get_or_insert_with(|| {
        let r = &e.remote;
        let o = crate::open::Open::new(r.mount, r.path.clone(), r.local.clone(), e.flags, false, None);
        // Its offset (for `SEEK_CUR` locks) is the descriptor's own.
        o.make_shared();
        Arc::new(o)
    });
    Some(o.clone())
}

/// The lock open of `fd` if one was made (for the close rule).
pub fn lock_open_made(fd: i32) -> Option<Arc<crate::open::Open>> {
    if !is_lent(fd) {
        return None;
    }
    let e = with(|t| t.fds.get(&fd).cloned())?;
    let s = e.shadow.lock().clone();
    s
}

/// Lent numbers in `first..=last` (for `close_range`).
pub fn in_range(first: u32, last: u32) -> Vec<i32> {
    if !ANY.load(Relaxed) {
        return Vec::new();
    }
    with(|t| t.fds.keys().copied().filter(|fd| (first..=last).contains(&(*fd as u32))).collect())
}

/// A `dup` made `new` name what `old` names.
pub fn duped(old: i32, new: i32) {
    closed(new);
    if !is_lent(old) {
        return;
    }
    with(|t| {
        if let Some(e) = t.fds.get(&old).cloned() {
            set_bit(new, true);
            t.fds.insert(new, e);
        }
    });
}

/// `mmap` of `fd`: a shared mapping writes through the description after
/// its last close.
pub fn mapped(fd: i32, flags: i32) {
    if flags & libc::MAP_SHARED == 0 || !is_lent(fd) {
        return;
    }
    with(|t| {
        if let Some(e) = t.fds.get(&fd) {
            e.pinned.store(true, Relaxed);
        }
    });
}

// ---- ferry's own sockets ----

/// Sockets kept for their handles (never a program's file).
pub fn kept_socks() -> Vec<i32> {
    if !ANY.load(Relaxed) {
        return Vec::new();
    }
    with(|t| t.socks.clone())
}

pub fn is_kept(fd: i32) -> bool {
    ANY.load(Relaxed) && with(|t| t.socks.contains(&fd))
}

/// A program's `dup2` onto a kept socket: the socket moves to another
/// number first (inheritable as it was).
pub fn make_room(fd: i32) -> Result<(), i32> {
    if !is_kept(fd) {
        return Ok(());
    }
    // SAFETY: F_GETFD on our own socket.
    let inherit = unsafe { crate::real::fcntl(fd, libc::F_GETFD, 0) } & libc::FD_CLOEXEC == 0;
    // SAFETY: borrowing our own socket for the call.
    let moved = crate::state::place_high(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))?;
    let new = std::os::fd::IntoRawFd::into_raw_fd(moved);
    if inherit {
        // SAFETY: F_SETFD on the socket just made.
        unsafe { crate::real::fcntl(new, libc::F_SETFD, 0) };
    }
    with(|t| {
        t.socks.retain(|s| *s != fd);
        t.socks.push(new);
        for e in t.fds.values().chain(t.kept.iter()) {
            if e.file.is_none() && e.sock.load(Relaxed) == fd {
                e.sock.store(new, Relaxed);
            }
        }
    });
    // SAFETY: our own socket, now also at `new`.
    unsafe { crate::real::close(fd) };
    Ok(())
}

/// At start: the sockets the program before `exec` left for us.
pub fn adopt_kept() {
    let Ok(v) = std::env::var("FERRY_KEEP") else { return };
    for (fd, ino) in v.split(',').filter_map(|s| s.split_once(':')) {
        let (Ok(fd), Ok(ino)) = (fd.parse::<i32>(), ino.parse::<u64>()) else { continue };
        if stat_of(fd).is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFSOCK && st.st_ino == ino) {
            ANY.store(true, Relaxed);
            crate::state::note_internal(fd);
            with(|t| t.socks.push(fd));
        }
    }
}

// ---- fork ----

/// Before `fork` (last of `state::before_fork`'s locks): every lent
/// description is shared with the child from now on.
pub fn hold_for_fork() {
    if !ANY.load(Relaxed) {
        std::mem::forget(TABLE.lock());
        return;
    }
    let mut g = TABLE.lock();
    let t = g.get_or_insert_with(Table::default);
    let mut socks = Vec::new();
    for e in t.fds.values() {
        e.pinned.store(true, Relaxed);
        socks.push(if e.file.is_some() { e.conn.engine().raw_fd() } else { e.sock.load(Relaxed) });
    }
    socks.sort_unstable();
    socks.dedup();
    t.fork_socks = socks;
    std::mem::forget(g);
}

/// # Safety
/// Only after `hold_for_fork` in this thread.
pub unsafe fn release_after_fork() {
    // SAFETY: per the contract, this thread took the lock and forgot it.
    unsafe { TABLE.force_unlock() };
}

/// In the child, after `release_after_fork`: the handles are the parent's
/// (forgotten, never closed from here); the sockets they are on stay open
/// here, unused. Returns those sockets: the caller must not close them.
pub fn after_fork_child() -> Vec<i32> {
    if !ANY.load(Relaxed) {
        return Vec::new();
    }
    with(|t| {
        let socks = std::mem::take(&mut t.fork_socks);
        let fds = std::mem::take(&mut t.fds);
        let mut fresh = HashMap::new();
        let mut same: Vec<(*const Lent, Arc<Lent>)> = Vec::new();
        for (fd, e) in fds {
            // One new entry per description, shared by its numbers as before.
            let p = Arc::as_ptr(&e);
            let n = match same.iter().find(|(q, _)| *q == p) {
                Some((_, n)) => n.clone(),
                None => {
                    let old = e.sock.load(Relaxed);
                    let sock = if e.file.is_some() { e.conn.engine_if_free().map_or(old, |x| x.raw_fd()) } else { old };
                    let n = Arc::new(Lent {
                        file: None,
                        conn: e.conn.clone(),
                        key: e.key,
                        sock: AtomicI32::new(sock),
                        pinned: AtomicBool::new(true),
                        remote: e.remote.clone(),
                        flags: e.flags,
                        // Its handle is the parent's: the child's own is
                        // opened again at its first use (`Open`'s epoch).
                        shadow: Mutex::new(e.shadow.lock().clone()),
                    });
                    same.push((p, n.clone()));
                    n
                }
            };
            // The parent's entry (and its handle) is the parent's.
            std::mem::forget(e);
            fresh.insert(fd, n);
        }
        t.fds = fresh;
        std::mem::forget(std::mem::take(&mut t.kept));
        for s in &socks {
            if !t.socks.contains(s) {
                t.socks.push(*s);
            }
        }
        socks
    })
}

// ---- exec ----

/// What `before_exec` changed, to undo if the program was not replaced.
pub struct Exposed {
    /// Sockets whose close-on-exec flag was cleared.
    cleared: Vec<i32>,
    /// Every socket the new program inherits for its handles.
    pub keep: Vec<i32>,
}

impl Exposed {
    pub fn none() -> Exposed {
        Exposed { cleared: Vec::new(), keep: Vec::new() }
    }
}

/// Before an `exec` (or a spawn): lent descriptions the new program will
/// hold keep their handles — their sockets are inherited too, and the
/// handles pinned here. `all`: a spawn whose file actions may move any
/// descriptor into place, so every lent one counts.
pub fn before_exec(all: bool) -> Exposed {
    let mut x = Exposed::none();
    if !ANY.load(Relaxed) {
        return x;
    }
    let keys: Vec<(u64, u64)> = with(|t| t.fds.values().map(|e| e.key).collect());
    let inherited = if all { keys.clone() } else { inherited_files(&keys) };
    let socks = with(|t| {
        let mut socks = Vec::new();
        for e in t.fds.values().chain(t.kept.iter()) {
            if inherited.contains(&e.key) {
                e.pinned.store(true, Relaxed);
                socks.push(if e.file.is_some() { e.conn.engine().raw_fd() } else { e.sock.load(Relaxed) });
            }
        }
        // Kept sockets the new program inherits (a `fork` child's copy of
        // its parent's connection stays close-on-exec unless exposed here).
        x.keep = t.socks.iter().copied().filter(|s| inheritable(*s)).collect();
        socks
    });
    for s in socks {
        // SAFETY: F_GETFD/F_SETFD on ferry's own socket.
        let fl = unsafe { crate::real::fcntl(s, libc::F_GETFD, 0) };
        if fl >= 0 && fl & libc::FD_CLOEXEC != 0 {
            // SAFETY: as above.
            unsafe { crate::real::fcntl(s, libc::F_SETFD, (fl & !libc::FD_CLOEXEC) as usize) };
            x.cleared.push(s);
        }
        if !x.keep.contains(&s) {
            x.keep.push(s);
        }
    }
    x
}

fn inheritable(fd: i32) -> bool {
    // SAFETY: F_GETFD on ferry's own socket.
    let fl = unsafe { crate::real::fcntl(fd, libc::F_GETFD, 0) };
    fl >= 0 && fl & libc::FD_CLOEXEC == 0
}

/// `FERRY_KEEP`'s value for `socks`: each number with its socket's inode,
/// so that a stale list (passed on by a program without this library)
/// never makes a program's own socket ferry's.
pub fn keep_value(socks: &[i32]) -> String {
    let v: Vec<String> = socks.iter().filter_map(|fd| stat_of(*fd).map(|st| format!("{fd}:{}", st.st_ino))).collect();
    v.join(",")
}

/// The `exec` failed, or a spawn returned: the sockets are close-on-exec
/// again (the handles stay pinned: a spawned program holds them).
pub fn after_exec(x: &Exposed) {
    for &s in &x.cleared {
        // SAFETY: F_SETFD on ferry's own socket.
        unsafe { crate::real::fcntl(s, libc::F_SETFD, libc::FD_CLOEXEC as usize) };
    }
}

/// Of `keys`, the files some descriptor without close-on-exec opened for
/// writing names: those the new program inherits (whatever number a
/// `dup2` in a `vfork` child, which this library does not see, gave them).
fn inherited_files(keys: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return keys.to_vec() };
    let mut found = Vec::new();
    for fd in dir.flatten().filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok())) {
        // SAFETY: F_GETFD and F_GETFL on a number of ours; a closed one fails.
        let (fdfl, fl) =
            unsafe { (crate::real::fcntl(fd, libc::F_GETFD, 0), crate::real::fcntl(fd, libc::F_GETFL, 0)) };
        if fdfl < 0 || fdfl & libc::FD_CLOEXEC != 0 || fl & libc::O_ACCMODE == libc::O_RDONLY {
            continue;
        }
        let Some(st) = stat_of(fd) else { continue };
        let k = (st.st_dev, st.st_ino);
        if keys.contains(&k) && !found.contains(&k) {
            found.push(k);
        }
    }
    found
}

fn stat_of(fd: i32) -> Option<rustix::fs::Stat> {
    if fd < 0 {
        return None;
    }
    // SAFETY: borrowed for the call only; a number not open fails `fstat`.
    rustix::fs::fstat(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }).ok()
}
