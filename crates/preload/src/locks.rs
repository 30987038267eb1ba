//! Record locks on remote fds: `fcntl` (`F_GETLK`, `F_SETLK`, `F_SETLKW`
//! and the `F_OFD_*` forms), `flock` and `lockf`, kept by the server.
//!
//! POSIX locks belong to the process (owner = pid, on the process's own
//! connection); closing any fd of a file releases them (`closing`), and the
//! process's exit ends its connection, which releases the rest. OFD and
//! `flock` locks belong to the server handle, released when its last fd
//! closes. The server never waits: a blocking call polls with a growing
//! pause in `nanosleep`, which a signal interrupts (`EINTR`), and other
//! threads' calls go on meanwhile.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use ferry_client::{backoff, LockKind, LockSpec, LockType};
use libc::c_int;

use crate::open::Open;
use crate::ops::R;
use crate::state;

/// Whether this process ever took a POSIX lock: only then does `close` send
/// the unlock the POSIX close rule asks for.
static POSIX_HELD: AtomicBool = AtomicBool::new(false);

/// The POSIX close rule: a process's locks on a file go when it closes any
/// fd of that file. Errors have nowhere to go; the connection's end
/// releases the locks in any case.
pub fn closing(o: &Open) {
    if POSIX_HELD.load(Relaxed) && !o.dir {
        let owner = LockKind::Posix(state::getpid() as u64);
        let _ = o.with_lock(|f| f.unlock(owner, 0, 0));
    }
}

/// A lock request as the program described it, made absolute.
struct Req {
    spec: LockSpec,
    wait: bool,
}

fn lock_type(t: c_int) -> R<LockType> {
    match t {
        libc::F_RDLCK => Ok(LockType::Read),
        libc::F_WRLCK => Ok(LockType::Write),
        libc::F_UNLCK => Ok(LockType::Unlock),
        _ => Err(libc::EINVAL),
    }
}

/// `l_whence`/`l_start`/`l_len` to an absolute start and length (`len` 0:
/// to the end of file), as `fcntl` reads them.
fn absolute(fd: i32, o: &Open, whence: c_int, start: i64, len: i64) -> R<(u64, u64)> {
    let base = match whence {
        libc::SEEK_SET => 0,
        libc::SEEK_CUR => crate::ops::offset(fd, o)? as i64,
        libc::SEEK_END => o.stat()?.size as i64,
        _ => return Err(libc::EINVAL),
    };
    let mut s = base.checked_add(start).ok_or(libc::EOVERFLOW)?;
    let mut l = len;
    if l < 0 {
        // A negative length covers the bytes before start.
        s = s.checked_add(l).ok_or(libc::EINVAL)?;
        l = -l;
    }
    if s < 0 {
        return Err(libc::EINVAL);
    }
    Ok((s as u64, l as u64))
}

/// Takes the lock, polling while it is held elsewhere if `wait`.
fn set(o: &Open, r: &Req) -> R<()> {
    let mut n = 0;
    loop {
        match o.with_lock(|f| f.try_lock(&r.spec)) {
            Err(libc::EAGAIN) if r.wait => sleep(backoff(n))?,
            // fcntl's F_SETLK reports a conflict as EAGAIN (or EACCES); keep EAGAIN.
            res => {
                if res.is_ok() && matches!(r.spec.kind, LockKind::Posix(_)) && r.spec.typ != LockType::Unlock {
                    POSIX_HELD.store(true, Relaxed);
                }
                return res;
            }
        }
        n += 1;
    }
}

/// Sleeps; a signal handler running meanwhile makes the wait fail with
/// `EINTR`, as a blocked `F_SETLKW` does.
fn sleep(d: std::time::Duration) -> R<()> {
    let ts = libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as libc::c_long };
    // SAFETY: a valid timespec; no remainder wanted.
    let r = unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
    if r < 0 {
        Err(crate::guard::errno())
    } else {
        Ok(())
    }
}

/// `fcntl` with a lock command on a remote fd. `fl` is the caller's
/// `struct flock` (the same layout as `flock64` on x86_64).
pub fn fcntl(fd: i32, o: &Open, cmd: c_int, fl: &mut libc::flock) -> R<c_int> {
    let ofd = matches!(cmd, libc::F_OFD_GETLK | libc::F_OFD_SETLK | libc::F_OFD_SETLKW);
    if ofd && fl.l_pid != 0 {
        return Err(libc::EINVAL);
    }
    let typ = lock_type(fl.l_type as c_int)?;
    let (start, len) = absolute(fd, o, fl.l_whence as c_int, fl.l_start, fl.l_len)?;
    let pid = state::getpid();
    let (kind, pid) = if ofd { (LockKind::Ofd, u32::MAX) } else { (LockKind::Posix(pid as u64), pid as u32) };
    let spec = LockSpec { kind, typ, start, len, pid };
    match cmd {
        libc::F_GETLK | libc::F_OFD_GETLK => {
            if typ == LockType::Unlock {
                return Err(libc::EINVAL);
            }
            match o.with_lock(|f| f.get_lock(&spec))? {
                None => fl.l_type = libc::F_UNLCK as libc::c_short,
                Some(h) => {
                    fl.l_type = if h.typ == LockType::Write { libc::F_WRLCK } else { libc::F_RDLCK } as libc::c_short;
                    fl.l_whence = libc::SEEK_SET as libc::c_short;
                    fl.l_start = h.start as i64;
                    fl.l_len = h.len as i64;
                    fl.l_pid = h.pid as i32;
                }
            }
            Ok(0)
        }
        _ => {
            check_access(o, typ)?;
            let wait = matches!(cmd, libc::F_SETLKW | libc::F_OFD_SETLKW);
            set(o, &Req { spec, wait }).map(|_| 0)
        }
    }
}

/// A read lock needs the fd open for reading, a write lock for writing.
fn check_access(o: &Open, typ: LockType) -> R<()> {
    let acc = o.access_mode();
    match typ {
        LockType::Read if acc == libc::O_WRONLY => Err(libc::EBADF),
        LockType::Write if acc == libc::O_RDONLY => Err(libc::EBADF),
        _ => Ok(()),
    }
}

/// `flock(2)`: a whole-file lock of the open file description.
pub fn flock(o: &Open, op: c_int) -> R<c_int> {
    let typ = match op & !libc::LOCK_NB {
        libc::LOCK_SH => LockType::Read,
        libc::LOCK_EX => LockType::Write,
        libc::LOCK_UN => LockType::Unlock,
        _ => return Err(libc::EINVAL),
    };
    let spec = LockSpec { kind: LockKind::Flock, typ, start: 0, len: 0, pid: u32::MAX };
    // A conflict is EWOULDBLOCK, which is EAGAIN, as the server says.
    set(o, &Req { spec, wait: op & libc::LOCK_NB == 0 }).map(|_| 0)
}

/// `lockf(3)`: POSIX write locks from the current offset (glibc's own
/// `lockf` calls `fcntl` internally, past our hook, so it is done here).
pub fn lockf(fd: i32, o: &Open, cmd: c_int, len: i64) -> R<c_int> {
    let mut fl = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_CUR as libc::c_short,
        l_start: 0,
        l_len: len,
        l_pid: 0,
    };
    match cmd {
        libc::F_TEST => {
            fl.l_type = libc::F_RDLCK as libc::c_short;
            fcntl(fd, o, libc::F_GETLK, &mut fl)?;
            if fl.l_type == libc::F_UNLCK as libc::c_short || fl.l_pid == state::getpid() {
                Ok(0)
            } else {
                Err(libc::EACCES)
            }
        }
        libc::F_ULOCK => {
            fl.l_type = libc::F_UNLCK as libc::c_short;
            fcntl(fd, o, libc::F_SETLK, &mut fl)
        }
        libc::F_LOCK => fcntl(fd, o, libc::F_SETLKW, &mut fl),
        libc::F_TLOCK => fcntl(fd, o, libc::F_SETLK, &mut fl),
        _ => Err(libc::EINVAL),
    }
}
