//! Record locks on the mount: FUSE `getlk`/`setlk` (which carry `fcntl`
//! locks and, with `FUSE_FLOCK_LOCKS`, `flock`) kept by the server, so two
//! mounts of one server serialise.
//!
//! Every lock is a POSIX lock owned by the kernel's `lock_owner`: for
//! `fcntl` that is the process's file table, for `flock` the open file, so
//! `flock` is a whole-file record lock, as on NFS. The kernel asks for the
//! releases itself: `flush` (any close of the file by the owner, the POSIX
//! close rule) and `release` with the flock owner.
//!
//! The server never waits. A blocking `setlk` (`F_SETLKW`) that meets a
//! conflict polls on a thread of its own and replies when it gets the lock,
//! so the kernel reader thread goes back to serving the rest of the mount.
//! A `flush` of the same owner and file (the waiting process exiting or
//! closing the file) ends the wait with `EINTR`.
//!
//! A `flock` owner is the kernel's `struct file`, whose address (and so
//! owner id) is reused as soon as the file is closed, while the `release`
//! that asks us to drop its flock comes later, in the background. By then
//! a newer handle may hold a lock under the same id; the late release must
//! leave it alone, or another client gets the lock while this one still
//! writes under it. So the mount remembers which handles took locks under
//! each owner id.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ferry_client::{backoff, File, LockKind, LockSpec, LockType};
use fuser::{Errno, ReplyEmpty, ReplyLock};

use crate::{errno, OpenFile};

/// Waits in progress, per (node, owner): a ticket that a `flush` of the
/// owner removes, which cancels them.
type Waits = Arc<Mutex<HashMap<(u64, u64), u64>>>;

static NEXT_TICKET: AtomicU64 = AtomicU64::new(1);

#[derive(Default)]
pub(crate) struct MountLocks {
    /// Whether any lock was ever taken through this mount: until then a
    /// close sends no unlock.
    used: AtomicBool,
    waits: Waits,
    /// Owner id -> the handles that asked for locks under it.
    users: Mutex<HashMap<u64, Vec<u64>>>,
}

fn spec(owner: u64, start: u64, end: u64, typ: i32, pid: u32) -> Result<LockSpec, Errno> {
    let typ = match typ {
        libc::F_RDLCK => LockType::Read,
        libc::F_WRLCK => LockType::Write,
        libc::F_UNLCK => LockType::Unlock,
        _ => return Err(Errno::EINVAL),
    };
    // The kernel's end is inclusive, OFFSET_MAX meaning "to the end".
    let len = if end >= i64::MAX as u64 { 0 } else { end.checked_sub(start).ok_or(Errno::EINVAL)? + 1 };
    Ok(LockSpec { kind: LockKind::Posix(owner), typ, start, len, pid })
}

fn with_file<T>(f: &OpenFile, g: impl FnOnce(&File) -> ferry_client::Result<T>) -> Result<T, Errno> {
    let file = f.file.read().unwrap_or_else(|e| e.into_inner());
    g(file.as_ref().ok_or(Errno::EBADF)?).map_err(errno)
}

/// Takes (or releases) `s` through the handle. A whole-file lock that the
/// handle's access mode does not allow (`EBADF`) is what `flock(LOCK_EX)`
/// asks on a read-only descriptor, which Linux allows; fuser does not pass
/// the kernel's `FUSE_LK_FLOCK` flag that would tell it from `fcntl`, so it
/// is taken as the handle's whole-file lock (`LockKind::Flock`: owned by the
/// handle, as a flock is; no access check), and so is the unlock after it.
/// What a local file system would refuse — `fcntl(F_SETLK, F_WRLCK)` of a
/// whole read-only file — is granted as such a lock: the price of `flock`
/// on read-only descriptors (`flock(1)`, lock files) working.
fn take(f: &OpenFile, s: &LockSpec) -> Result<(), Errno> {
    let whole = s.start == 0 && s.len == 0;
    if whole && s.typ == LockType::Unlock && f.flock_kind.swap(false, Ordering::Relaxed) {
        with_file(f, |file| file.unlock(LockKind::Flock, 0, 0))?;
    }
    match with_file(f, |file| file.try_lock(s)) {
        Err(e) if e == Errno::EBADF && whole && s.typ != LockType::Unlock => {
            with_file(f, |file| file.try_lock(&LockSpec { kind: LockKind::Flock, ..*s }))?;
            f.flock_kind.store(true, Ordering::Relaxed);
            Ok(())
        }
        r => r,
    }
}

fn ticket(waits: &Waits, key: (u64, u64)) -> u64 {
    let mut w = waits.lock().unwrap_or_else(|e| e.into_inner());
    *w.entry(key).or_insert_with(|| NEXT_TICKET.fetch_add(1, Ordering::Relaxed))
}

fn cancelled(waits: &Waits, key: (u64, u64), ticket: u64) -> bool {
    waits.lock().unwrap_or_else(|e| e.into_inner()).get(&key) != Some(&ticket)
}

impl MountLocks {
    pub(crate) fn getlk(&self, f: &OpenFile, owner: u64, range: (u64, u64), typ: i32, pid: u32, reply: ReplyLock) {
        let r = spec(owner, range.0, range.1, typ, pid).and_then(|s| with_file(f, |file| file.get_lock(&s)));
        match r {
            Ok(None) => reply.locked(0, 0, libc::F_UNLCK, 0),
            Ok(Some(h)) => {
                let end = if h.len == 0 { i64::MAX as u64 } else { h.start + h.len - 1 };
                let typ = if h.typ == LockType::Write { libc::F_WRLCK } else { libc::F_RDLCK };
                reply.locked(h.start, end, typ, h.pid)
            }
            Err(e) => reply.error(e),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn setlk(
        &self,
        f: Arc<OpenFile>,
        fh: u64,
        ino: u64,
        owner: u64,
        range: (u64, u64),
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let s = match spec(owner, range.0, range.1, typ, pid) {
            Ok(s) => s,
            Err(e) => return reply.error(e),
        };
        if s.typ != LockType::Unlock {
            self.used.store(true, Ordering::Relaxed);
            // Before the request goes out: a `release` that runs meanwhile
            // then knows the id is taken (see the module comment).
            let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
            let fhs = users.entry(owner).or_default();
            if !fhs.contains(&fh) {
                fhs.push(fh);
            }
        }
        match take(&f, &s) {
            Err(e) if e == Errno::EAGAIN && sleep => {}
            Err(e) => return reply.error(e),
            Ok(()) => return reply.ok(),
        }
        let waits = Arc::clone(&self.waits);
        let key = (ino, owner);
        let ticket = ticket(&waits, key);
        let spawned =
            std::thread::Builder::new().name("ferry-lock-wait".into()).stack_size(64 * 1024).spawn(move || {
                let mut n = 0;
                loop {
                    std::thread::sleep(backoff(n));
                    n += 1;
                    if cancelled(&waits, key, ticket) {
                        return reply.error(Errno::EINTR);
                    }
                    match take(&f, &s) {
                        Err(e) if e == Errno::EAGAIN => {}
                        Err(e) => return reply.error(e),
                        Ok(()) => return reply.ok(),
                    }
                }
            });
        if let Err(e) = spawned {
            // The reply went with the closure; the kernel sees the request fail.
            eprintln!("ferry mount: cannot start a lock wait: {e}");
        }
    }

    /// `release` of handle `fh`, with the flock owner if the handle took a
    /// flock: the flock goes unless a newer handle holds the owner id now.
    pub(crate) fn released(&self, f: Option<&OpenFile>, fh: u64, ino: u64, flock_owner: Option<u64>) {
        if !self.used.load(Ordering::Relaxed) {
            return;
        }
        let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        users.retain(|_, fhs| {
            fhs.retain(|&h| h != fh);
            !fhs.is_empty()
        });
        if let (Some(f), Some(owner)) = (f, flock_owner) {
            if !users.contains_key(&owner) {
                // Under the lock of `users`: a newer handle's lock under
                // this id reaches the server after this unlock.
                self.closing(f, ino, owner);
            }
        }
    }

    /// `flush` (a close by `owner`) or `release` with a flock owner: the
    /// owner's locks on the file go, and its waits on the file end.
    /// Whether any lock was ever taken through the mount (a close then
    /// sends an unlock through the handle closed).
    pub(crate) fn in_use(&self) -> bool {
        self.used.load(Ordering::Relaxed)
    }

    pub(crate) fn closing(&self, f: &OpenFile, ino: u64, owner: u64) {
        if !self.used.load(Ordering::Relaxed) {
            return;
        }
        self.waits.lock().unwrap_or_else(|e| e.into_inner()).remove(&(ino, owner));
        // Errors have nowhere to go; the connection's end releases in any case.
        let _ = with_file(f, |file| file.unlock(LockKind::Posix(owner), 0, 0));
    }
}
