//! Shared mappings of remote files (`mmap` with `MAP_SHARED`).
//!
//! The pages a program maps live in a *shadow*: a tmpfs file holding the
//! file's bytes, beside a *base* copy of what the server had when the two
//! last agreed. A byte that differs between them was written through a
//! mapping; `msync`, `munmap`, `close`, `fsync`, `exec` and exit send those
//! bytes, and only those (a byte another client wrote meanwhile is left
//! alone), then copy them into the base.
//!
//! Shadows are per host and user, in `/dev/shm/ferry-UID/`, named by a hash
//! of the server and the file's device and inode, so every process on this
//! machine that maps the file shares its pages as with a local file (sqlite's
//! WAL index depends on it). Each process holds a shared `flock` on the
//! shadow, through a description of its own, while it uses it; the last one
//! out (at its last `munmap`, or at exit) removes the files (a non-blocking
//! exclusive `flock` finds no other holder), under a third file's lock that
//! also serialises joining. A process that joins a shadow
//! others hold brings it up to date with the server first, by a three-way
//! merge: a byte not written through a mapping takes the server's value.
//! Where neither `/dev/shm`, `$XDG_RUNTIME_DIR` nor `/tmp` has a private
//! directory for the user, shared mappings fail with `ENODEV`: pages private
//! to one process would let two processes' views of the file diverge.
//!
//! Locks: `MAPS` (never held while taking another), a shadow's `busy`
//! (held across its server calls, so before `state`'s locks), then the
//! `flock` on its base (which orders processes, not threads: `busy` does).
//! `state::before_fork` takes the first two before its own.

use std::ffi::CString;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use libc::{c_int, c_void};

use crate::open::Open;
use crate::sync::Mutex;
use crate::{guard, real};

/// Bytes compared, sent and merged per step.
const CHUNK: usize = 1 << 20;
const PAGE: usize = 4096;
const STAMP: &[u8] = b"user.ferry.stamp\0";

pub struct Shadow {
    key: String,
    mount: usize,
    path: Vec<u8>,
    /// The handle write-backs go through: upgraded to a writable one when a
    /// writable fd maps the file.
    open: Mutex<Arc<Open>>,
    data: c_int,
    /// The base's own description in this process: its `flock` orders
    /// write-backs between processes (a `fork` child opens its own).
    base: AtomicI32,
    /// A description of the shadow held with a shared `flock` while this
    /// process uses the shadow (-1 once given up at exit); its own, never
    /// shared with a `fork` child, so each process counts once.
    hold: AtomicI32,
    /// The directory holding the host-wide files.
    dir: String,
    busy: Mutex<()>,
}

struct Mapping {
    start: usize,
    end: usize,
    shadow: Arc<Shadow>,
}

static MAPS: Mutex<Vec<Mapping>> = Mutex::new(Vec::new());
/// Tracked mappings: the hot `munmap`/`write` paths look at this alone.
static COUNT: AtomicUsize = AtomicUsize::new(0);

fn os<T: PartialOrd + Default>(r: T) -> Result<T, i32> {
    if r < T::default() {
        Err(guard::errno())
    } else {
        Ok(r)
    }
}

fn pread_full(fd: c_int, buf: &mut [u8], pos: u64) -> Result<usize, i32> {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: buf[got..] is valid for writes of its length.
        let n =
            unsafe { real::pread64(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got, (pos + got as u64) as i64) };
        match os(n)? {
            0 => break,
            n => got += n as usize,
        }
    }
    Ok(got)
}

fn pwrite_full(fd: c_int, buf: &[u8], pos: u64) -> Result<(), i32> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: buf[done..] is valid for reads of its length.
        let n =
            unsafe { real::pwrite64(fd, buf[done..].as_ptr().cast(), buf.len() - done, (pos + done as u64) as i64) };
        done += os(n)? as usize;
    }
    Ok(())
}

fn size_of(fd: c_int) -> Result<u64, i32> {
    // SAFETY: an all-zero stat is a valid out-buffer.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: st is valid for the call.
    os(unsafe { libc::fstat64(fd, &mut st) })?;
    Ok(st.st_size as u64)
}

fn set_size(fd: c_int, size: u64) -> Result<(), i32> {
    // SAFETY: ftruncate on our own fd.
    os(unsafe { real::ftruncate64(fd, size as i64) }).map(|_| ())
}

fn flock(fd: c_int, op: c_int) -> Result<(), i32> {
    loop {
        // SAFETY: flock on our own fd.
        match os(unsafe { real::flock(fd, op) }) {
            Err(libc::EINTR) => continue,
            r => return r.map(|_| ()),
        }
    }
}

/// Holds the base's `flock` (one write-back or merge at a time, host-wide).
struct BaseLock(c_int);

impl BaseLock {
    fn take(fd: c_int) -> Result<BaseLock, i32> {
        flock(fd, libc::LOCK_EX)?;
        Ok(BaseLock(fd))
    }
}

impl Drop for BaseLock {
    fn drop(&mut self) {
        let _ = flock(self.0, libc::LOCK_UN);
    }
}

/// The byte ranges of `a` that differ from `b` (which may be shorter).
fn differing(a: &[u8], b: &[u8]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut page = 0;
    while page < a.len() {
        let end = (page + PAGE).min(a.len());
        let same = end <= b.len() && a[page..end] == b[page..end];
        if !same {
            for (i, x) in a.iter().enumerate().take(end).skip(page) {
                if b.get(i) != Some(x) {
                    match runs.last_mut() {
                        Some(r) if r.1 == i => r.1 = i + 1,
                        _ => runs.push((i, i + 1)),
                    }
                }
            }
        }
        page = end;
    }
    runs
}

/// What the server's file looked like when shadow and server last agreed.
fn stamp_of(a: &ferry_client::Attr) -> String {
    format!("{} {} {}.{} {}.{}", a.ino, a.size, a.mtime.sec, a.mtime.nsec, a.ctime.sec, a.ctime.nsec)
}

fn read_stamp(fd: c_int) -> Option<String> {
    let mut buf = [0u8; 128];
    // SAFETY: buf is valid for buf.len() bytes; STAMP is NUL-terminated.
    let n = unsafe { libc::fgetxattr(fd, STAMP.as_ptr().cast(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        return None;
    }
    String::from_utf8(buf[..n as usize].to_vec()).ok()
}

fn write_stamp(fd: c_int, s: &str) {
    // SAFETY: as above; the value buffer is valid for its length.
    unsafe { libc::fsetxattr(fd, STAMP.as_ptr().cast(), s.as_ptr().cast(), s.len(), 0) };
}

impl Shadow {
    fn current(&self) -> Arc<Open> {
        self.open.lock().clone()
    }

    /// Brings the shadow up to date with the server (`fresh`: it holds
    /// nothing yet): bytes not written through a mapping take the server's
    /// value, bytes written through one are kept, to be written back.
    fn merge(&self, attr: &ferry_client::Attr, fresh: bool) -> Result<(), i32> {
        let _busy = self.busy.lock();
        let _b = BaseLock::take(self.base.load(Relaxed))?;
        let stamp = stamp_of(attr);
        let have = size_of(self.data)?;
        if !fresh && have == attr.size && read_stamp(self.data).as_deref() == Some(stamp.as_str()) {
            return Ok(());
        }
        let open = self.current();
        if attr.size < have {
            set_size(self.data, attr.size)?;
        }
        set_size(self.base.load(Relaxed), attr.size)?;
        if attr.size > have {
            set_size(self.data, attr.size)?;
        }
        let step = CHUNK.min(attr.size as usize);
        let (mut s, mut d, mut b) = (vec![0u8; step], vec![0u8; step], vec![0u8; step]);
        let mut pos = 0u64;
        while pos < attr.size {
            let n = CHUNK.min((attr.size - pos) as usize);
            let mut got = 0;
            while got < n {
                match open.read(pos + got as u64, &mut s[got..n])? {
                    0 => break,
                    k => got += k,
                }
            }
            // Past what the server returned (it shrank meanwhile): zeros.
            s[got..n].fill(0);
            if fresh || pos >= have {
                pwrite_full(self.data, &s[..n], pos)?;
            } else {
                let dn = pread_full(self.data, &mut d[..n], pos)?;
                let bn = pread_full(self.base.load(Relaxed), &mut b[..n], pos)?;
                d[dn..n].fill(0);
                b[bn..n].fill(0);
                // Clean bytes (shadow equal to base) that the server changed.
                let stale: Vec<bool> = (0..n).map(|i| d[i] == b[i] && d[i] != s[i]).collect();
                let mut i = 0;
                while i < n {
                    if !stale[i] {
                        i += 1;
                        continue;
                    }
                    let j = (i..n).find(|&j| !stale[j]).unwrap_or(n);
                    pwrite_full(self.data, &s[i..j], pos + i as u64)?;
                    i = j;
                }
            }
            pwrite_full(self.base.load(Relaxed), &s[..n], pos)?;
            pos += n as u64;
        }
        write_stamp(self.data, &stamp);
        Ok(())
    }

    /// Sends the bytes written through mappings (`durable`: and makes them
    /// stable, for `msync(MS_SYNC)`).
    fn write_back(&self, durable: bool) -> Result<(), i32> {
        let open = self.current();
        if open.access_mode() != libc::O_RDWR {
            // Mapped only read-only here: nothing of ours to send.
            return Ok(());
        }
        let _busy = self.busy.lock();
        let _b = BaseLock::take(self.base.load(Relaxed))?;
        let size = size_of(self.data)?;
        let step = CHUNK.min(size as usize);
        let (mut d, mut b) = (vec![0u8; step], vec![0u8; step]);
        let mut wrote = false;
        let mut pos = 0u64;
        while pos < size {
            let n = CHUNK.min((size - pos) as usize);
            let dn = pread_full(self.data, &mut d[..n], pos)?;
            let bn = pread_full(self.base.load(Relaxed), &mut b[..n], pos)?;
            let runs = differing(&d[..dn], &b[..bn]);
            if !runs.is_empty() {
                for &(s, e) in &runs {
                    open.write(pos + s as u64, &d[s..e], false)?;
                }
                // The base records only what the server acknowledged.
                open.sync_writes()?;
                for &(s, e) in &runs {
                    pwrite_full(self.base.load(Relaxed), &d[s..e], pos + s as u64)?;
                }
                wrote = true;
            }
            pos += n as u64;
        }
        if wrote {
            if durable {
                open.fsync_writes(true)?;
            }
            if let Ok(a) = open.stat() {
                write_stamp(self.data, &stamp_of(&a));
            }
        }
        Ok(())
    }

    /// A `write` through an fd of this process: mappings show it at once.
    fn apply(&self, pos: u64, data: &[u8]) -> Result<(), i32> {
        let _busy = self.busy.lock();
        let _b = BaseLock::take(self.base.load(Relaxed))?;
        let end = pos + data.len() as u64;
        if end > size_of(self.data)? {
            set_size(self.base.load(Relaxed), end)?;
            set_size(self.data, end)?;
        }
        pwrite_full(self.base.load(Relaxed), data, pos)?;
        pwrite_full(self.data, data, pos)
    }

    fn resize(&self, size: u64) -> Result<(), i32> {
        let _busy = self.busy.lock();
        let _b = BaseLock::take(self.base.load(Relaxed))?;
        set_size(self.data, size)?;
        set_size(self.base.load(Relaxed), size)
    }
}

impl Shadow {
    /// Gives up this process's hold and removes the files if no other
    /// process holds them (the pages stay mapped here until unmapped).
    fn give_up(&self) {
        let hold = self.hold.swap(-1, Relaxed);
        if hold >= 0 {
            close_all(&[hold]);
            leave(&self.dir, &self.key);
        }
    }
}

impl Drop for Shadow {
    fn drop(&mut self) {
        close_all(&[self.data, self.base.load(Relaxed)]);
        self.give_up();
    }
}

/// Where this user's shadows live: `/dev/shm/ferry-UID` (memory), else
/// `$XDG_RUNTIME_DIR/ferry`, else `/tmp/ferry-UID`, made if missing; only a
/// directory of ours that no one else can enter.
fn user_dir() -> Option<String> {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    let mut places = vec![format!("/dev/shm/ferry-{uid}")];
    if let Ok(run) = std::env::var("XDG_RUNTIME_DIR") {
        places.push(format!("{run}/ferry"));
    }
    places.push(format!("/tmp/ferry-{uid}"));
    places.into_iter().find(|dir| {
        let Ok(c) = CString::new(dir.as_bytes()) else { return false };
        // SAFETY: c is NUL-terminated.
        unsafe { libc::mkdir(c.as_ptr(), 0o700) };
        // SAFETY: an all-zero stat is a valid out-buffer.
        let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
        // SAFETY: c and st are valid for the call.
        if unsafe { libc::lstat64(c.as_ptr(), &mut st) } != 0 {
            return false;
        }
        st.st_mode & libc::S_IFMT == libc::S_IFDIR && st.st_uid == uid && st.st_mode & 0o077 == 0
    })
}

fn open_in(dir: &str, name: &str, create: bool) -> Result<c_int, i32> {
    let c = CString::new(format!("{dir}/{name}")).map_err(|_| libc::EINVAL)?;
    let mut flags = libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    if create {
        flags |= libc::O_CREAT;
    }
    // SAFETY: c is NUL-terminated.
    os(unsafe { real::open(c.as_ptr(), flags, 0o600) })
}

fn unlink_in(dir: &str, name: &str) {
    if let Ok(c) = CString::new(format!("{dir}/{name}")) {
        // SAFETY: c is NUL-terminated.
        unsafe { real::unlink(c.as_ptr()) };
    }
}

fn ino_of(fd: c_int) -> Option<u64> {
    // SAFETY: an all-zero stat is a valid out-buffer.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: st is valid for the call.
    (unsafe { libc::fstat64(fd, &mut st) } == 0).then_some(st.st_ino)
}

/// The lock file of `key`, locked exclusively (and still the one under
/// its name: a leaver may have removed it while we waited).
fn lock_key(dir: &str, key: &str) -> Result<c_int, i32> {
    let name = format!("{key}.lock");
    loop {
        let fd = open_in(dir, &name, true)?;
        if let Err(e) = flock(fd, libc::LOCK_EX) {
            // SAFETY: our fd.
            unsafe { real::close(fd) };
            return Err(e);
        }
        let now = open_in(dir, &name, false).ok();
        let same = now.and_then(ino_of).is_some() && now.and_then(ino_of) == ino_of(fd);
        if let Some(n) = now {
            // SAFETY: our fd.
            unsafe { real::close(n) };
        }
        if same {
            return Ok(fd);
        }
        // SAFETY: our fd (closing it drops the flock).
        unsafe { real::close(fd) };
    }
}

/// Joins (or starts) the host-wide shadow `key`: its data and base fds,
/// whether it is new, and the held lock file (closed once it is filled).
/// Joined files: data, base and hold descriptors, whether the shadow is
/// new, and the held lock file (closed once the shadow is filled).
struct Joined {
    data: c_int,
    base: c_int,
    hold: c_int,
    fresh: bool,
    lk: c_int,
}

fn close_all(fds: &[c_int]) {
    for &fd in fds {
        // SAFETY: our own descriptors, each closed once.
        unsafe { real::close(fd) };
    }
}

fn join(dir: &str, key: &str) -> Result<Joined, i32> {
    let lk = lock_key(dir, key)?;
    let mut fds: Vec<c_int> = vec![lk];
    let result = (|| {
        let data = open_in(dir, key, true)?;
        fds.push(data);
        let base = open_in(dir, &format!("{key}.base"), true)?;
        fds.push(base);
        let hold = open_in(dir, key, false)?;
        fds.push(hold);
        // No other holder: whatever is there is a leftover (its last holder
        // was killed), never trusted.
        let fresh = flock(hold, libc::LOCK_EX | libc::LOCK_NB).is_ok();
        if fresh {
            set_size(data, 0)?;
            set_size(base, 0)?;
        }
        flock(hold, libc::LOCK_SH)?;
        Ok(Joined { data, base, hold, fresh, lk })
    })();
    if result.is_err() {
        close_all(&fds);
    }
    result
}

/// After this process dropped its hold on `key`: the last holder removes
/// the files.
fn leave(dir: &str, key: &str) {
    let Ok(lk) = lock_key(dir, key) else { return };
    if let Ok(probe) = open_in(dir, key, false) {
        if flock(probe, libc::LOCK_EX | libc::LOCK_NB).is_ok() {
            unlink_in(dir, key);
            unlink_in(dir, &format!("{key}.base"));
            unlink_in(dir, &format!("{key}.lock"));
        }
        // SAFETY: our fd.
        unsafe { real::close(probe) };
    }
    // SAFETY: our fd.
    unsafe { real::close(lk) };
}

fn key_of(url: &str, a: &ferry_client::Attr) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in url.bytes().chain(a.dev.to_le_bytes()).chain(a.ino.to_le_bytes()) {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    format!("{h:016x}")
}

/// The shadow of `o`'s file, up to date with the server.
fn shadow_for(o: &Arc<Open>, attr: &ferry_client::Attr) -> Result<Arc<Shadow>, i32> {
    let url = crate::state::MOUNTS.read().get(o.mount).map(|m| m.url.to_string()).ok_or(libc::EBADF)?;
    let key = key_of(&url, attr);
    let found = MAPS.lock().iter().find(|m| m.shadow.key == key).map(|m| m.shadow.clone());
    if let Some(sh) = found {
        {
            let mut cur = sh.open.lock();
            if cur.access_mode() != libc::O_RDWR && o.access_mode() == libc::O_RDWR {
                *cur = o.clone();
            }
        }
        sh.merge(attr, false)?;
        return Ok(sh);
    }
    // Pages private to this process would let another process's mapping
    // of the same file diverge (sqlite's WAL index loses commits): with no
    // place to share them, refuse.
    let Some(dir) = user_dir() else { return Err(libc::ENODEV) };
    let j = join(&dir, &key)?;
    let sh = Arc::new(Shadow {
        key: key.clone(),
        mount: o.mount,
        path: o.path.clone(),
        open: Mutex::new(o.clone()),
        data: j.data,
        base: AtomicI32::new(j.base),
        hold: AtomicI32::new(j.hold),
        dir,
        busy: Mutex::new(()),
    });
    let r = sh.merge(attr, j.fresh);
    // Closing it lets the next joiner in.
    close_all(&[j.lk]);
    r.map(|_| sh)
}

/// `mmap(MAP_SHARED)` of a remote file.
pub fn map(o: &Arc<Open>, addr: usize, len: usize, prot: c_int, flags: c_int, off: i64) -> Result<*mut c_void, i32> {
    let mode = o.access_mode();
    if mode == libc::O_WRONLY || (prot & libc::PROT_WRITE != 0 && mode != libc::O_RDWR) {
        return Err(libc::EACCES);
    }
    if len == 0 || off < 0 || !(off as usize).is_multiple_of(PAGE) {
        return Err(libc::EINVAL);
    }
    let _replaced = if flags & libc::MAP_FIXED != 0 { Some(unmapping(addr, len)) } else { None };
    let attr = o.stat()?;
    let sh = shadow_for(o, &attr)?;
    // A read-only open maps a read-only description of the shadow, so an
    // `mprotect` cannot make it writable (as with the file itself).
    let fd = if mode == libc::O_RDWR {
        sh.data
    } else {
        let c = CString::new(format!("/proc/self/fd/{}", sh.data)).map_err(|_| libc::EINVAL)?;
        // SAFETY: c is NUL-terminated.
        os(unsafe { real::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC, 0) })?
    };
    // SAFETY: mapping the shadow with the caller's address hint, length and
    // flags, as the caller's own `mmap` would have mapped the file.
    let p = unsafe { real::mmap64(addr as *mut c_void, len, prot, flags, fd, off) };
    let e = guard::errno();
    if fd != sh.data {
        // SAFETY: our temporary fd; the mapping keeps its own reference.
        unsafe { real::close(fd) };
    }
    if p == libc::MAP_FAILED {
        return Err(e);
    }
    let start = p as usize;
    MAPS.lock().push(Mapping { start, end: start + len.div_ceil(PAGE) * PAGE, shadow: sh });
    COUNT.fetch_add(1, Relaxed);
    Ok(p)
}

fn overlapping(start: usize, end: usize) -> Vec<Arc<Shadow>> {
    let mut out: Vec<Arc<Shadow>> = Vec::new();
    for m in MAPS.lock().iter() {
        if m.start < end && start < m.end && !out.iter().any(|s| Arc::ptr_eq(s, &m.shadow)) {
            out.push(m.shadow.clone());
        }
    }
    out
}

fn report(sh: &Shadow, e: i32) {
    let msg = format!(
        "ferry: writing back a shared mapping of {} failed (errno {e}); its changes stay in memory\n",
        String::from_utf8_lossy(&sh.path)
    );
    // SAFETY: writing a buffer valid for its length to stderr.
    unsafe { real::write(2, msg.as_ptr().cast(), msg.len()) };
}

/// `msync`: `None` if no remote mapping is in the range.
pub fn msync(addr: *mut c_void, len: usize, flags: c_int) -> Option<Result<(), i32>> {
    if COUNT.load(Relaxed) == 0 {
        return None;
    }
    let start = addr as usize;
    let hit = overlapping(start, start.saturating_add(len.max(1)));
    if hit.is_empty() {
        return None;
    }
    let mut r = Ok(());
    for sh in hit {
        if let Err(e) = sh.write_back(flags & libc::MS_SYNC != 0) {
            r = Err(if e == libc::EBADF { libc::EIO } else { e });
        }
    }
    Some(r)
}

/// Mappings that left the table: dropped after the kernel unmapped them
/// (a shadow's last holder can only remove its files once its pages are
/// no longer mapped).
pub struct Leaving(Vec<Mapping>);

impl Drop for Leaving {
    fn drop(&mut self) {
        let gone = std::mem::take(&mut self.0);
        if gone.is_empty() {
            return;
        }
        let e = guard::errno();
        // A shadow's last drop closes its handle on the server: ferry's own
        // calls, inside the guard.
        let _ = guard::enter(|| {
            drop(gone);
            Ok(())
        });
        guard::set_errno(e);
    }
}

/// Before the range is unmapped (or replaced): its shadows' changes are
/// written back and the range no longer tracked.
pub fn unmapping(start: usize, len: usize) -> Leaving {
    if COUNT.load(Relaxed) == 0 {
        return Leaving(Vec::new());
    }
    let end = start.saturating_add(len.div_ceil(PAGE) * PAGE);
    for sh in overlapping(start, end) {
        if let Err(e) = sh.write_back(false) {
            report(&sh, e);
        }
    }
    let mut gone: Vec<Mapping> = Vec::new();
    {
        let mut maps = MAPS.lock();
        let mut kept: Vec<Mapping> = Vec::new();
        for m in maps.drain(..) {
            if m.end <= start || end <= m.start {
                kept.push(m);
                continue;
            }
            if m.start < start {
                kept.push(Mapping { start: m.start, end: start, shadow: m.shadow.clone() });
            }
            if end < m.end {
                kept.push(Mapping { start: end, end: m.end, shadow: m.shadow.clone() });
            }
            gone.push(m);
        }
        *maps = kept;
        COUNT.store(maps.len(), Relaxed);
    }
    Leaving(gone)
}

/// Everything written through mappings goes to the server (`close`,
/// `fsync` of the file, `exec`, exit): `None` means every one.
pub fn write_back(mount_path: Option<(usize, &[u8])>, durable: bool) -> Result<(), i32> {
    if COUNT.load(Relaxed) == 0 {
        return Ok(());
    }
    let mut all: Vec<Arc<Shadow>> = Vec::new();
    for m in MAPS.lock().iter() {
        let wanted = mount_path.is_none_or(|(mo, p)| m.shadow.mount == mo && m.shadow.path == p);
        if wanted && !all.iter().any(|s| Arc::ptr_eq(s, &m.shadow)) {
            all.push(m.shadow.clone());
        }
    }
    let mut r = Ok(());
    for sh in all {
        if let Err(e) = sh.write_back(durable) {
            report(&sh, e);
            r = Err(e);
        }
    }
    r
}

fn shadows_of(mount: usize, path: &[u8]) -> Vec<Arc<Shadow>> {
    if COUNT.load(Relaxed) == 0 {
        return Vec::new();
    }
    let mut out: Vec<Arc<Shadow>> = Vec::new();
    for m in MAPS.lock().iter() {
        if m.shadow.mount == mount && m.shadow.path == path && !out.iter().any(|s| Arc::ptr_eq(s, &m.shadow)) {
            out.push(m.shadow.clone());
        }
    }
    out
}

/// The program wrote `data` at `pos` through an fd: its mappings show it.
pub fn written(mount: usize, path: &[u8], pos: u64, data: &[u8]) {
    for sh in shadows_of(mount, path) {
        let _ = sh.apply(pos, data);
    }
}

/// The program truncated the file: its mappings see the new size.
pub fn truncated(mount: usize, path: &[u8], size: u64) {
    for sh in shadows_of(mount, path) {
        let _ = sh.resize(size);
    }
}

fn distinct() -> Vec<Arc<Shadow>> {
    let mut out: Vec<Arc<Shadow>> = Vec::new();
    for m in MAPS.lock().iter() {
        if !out.iter().any(|s| Arc::ptr_eq(s, &m.shadow)) {
            out.push(m.shadow.clone());
        }
    }
    out
}

/// At the end of the process (after the last write-back): every shadow is
/// given up, so the last process out removes the files even when it never
/// unmapped (most programs do not).
pub fn leave_all() {
    if COUNT.load(Relaxed) == 0 {
        return;
    }
    for sh in distinct() {
        sh.give_up();
    }
}

/// In a `fork` child: each inherited shadow gets a hold and a base
/// description of the child's own, so the child counts as a user of its
/// own, and its write-backs and the parent's exclude each other.
pub fn after_fork_child() {
    if COUNT.load(Relaxed) == 0 {
        return;
    }
    for sh in distinct() {
        if let Ok(h) = open_in(&sh.dir, &sh.key, false) {
            if flock(h, libc::LOCK_SH).is_ok() {
                let old = sh.hold.swap(h, Relaxed);
                if old >= 0 {
                    close_all(&[old]);
                }
            } else {
                close_all(&[h]);
            }
        }
        if let Ok(b) = open_in(&sh.dir, &format!("{}.base", sh.key), false) {
            close_all(&[sh.base.swap(b, Relaxed)]);
        }
    }
}

/// Shadows whose `busy` lock `before_fork` holds.
static FORK_HELD: Mutex<Vec<Arc<Shadow>>> = Mutex::new(Vec::new());

/// Before `fork`: the table and every write-back are held still.
pub fn hold_for_fork() {
    let maps = MAPS.lock();
    let mut held: Vec<Arc<Shadow>> = Vec::new();
    for m in maps.iter() {
        if !held.iter().any(|s| Arc::ptr_eq(s, &m.shadow)) {
            held.push(m.shadow.clone());
        }
    }
    std::mem::forget(maps);
    for sh in &held {
        std::mem::forget(sh.busy.lock());
    }
    *FORK_HELD.lock() = held;
}

/// # Safety
/// Only after `hold_for_fork`, in the thread that called it.
pub unsafe fn release_after_fork() {
    let held = std::mem::take(&mut *FORK_HELD.lock());
    // SAFETY: per the contract, this thread took these locks in
    // `hold_for_fork` and forgot their guards.
    unsafe {
        for sh in &held {
            sh.busy.force_unlock();
        }
        MAPS.force_unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_changed_bytes_are_sent() {
        let base = vec![0u8; 3 * PAGE];
        let mut now = base.clone();
        now[5] = 1;
        now[6] = 1;
        now[PAGE + 10] = 2;
        now[3 * PAGE - 1] = 3;
        assert_eq!(differing(&now, &base), vec![(5, 7), (PAGE + 10, PAGE + 11), (3 * PAGE - 1, 3 * PAGE)]);
        assert_eq!(differing(&now[..10], &now[..4]), vec![(4, 10)]);
        assert!(differing(&base, &base).is_empty());
    }

    #[test]
    fn keys_depend_on_server_and_file() {
        let k1 = key_of("ferry://127.0.0.1:7070/", &ferry_client::Attr { ino: 7, ..Default::default() });
        let a = ferry_client::Attr { ino: 8, ..Default::default() };
        assert_ne!(k1, key_of("ferry://127.0.0.1:7070/", &a));
        assert_ne!(key_of("ferry://127.0.0.1:7071/", &a), key_of("ferry://127.0.0.1:7070/", &a));
    }
}
