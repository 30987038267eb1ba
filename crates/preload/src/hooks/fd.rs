//! Calls on file descriptors.

use libc::{c_int, c_uint, c_void, off64_t, size_t, ssize_t};

use super::{remote_fd, slice, slice_mut};
use crate::guard::{self, enter, ret, ret_code};
use crate::{conv, ops, real, state};

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    let Some(o) = remote_fd(fd) else { return pass!(read(fd, buf, n)) };
    // SAFETY: the caller provides n writable bytes at buf.
    let b = unsafe { slice_mut(buf, n) };
    ret(enter(|| ops::read(fd, &o, b).map(|n| n as ssize_t)))
}

#[no_mangle]
pub unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t {
    if n > buflen {
        // SAFETY: what the real check does on overflow.
        return pass!(__read_chk(fd, buf, n, buflen));
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { read(fd, buf, n) }
}

fn pread_impl(fd: c_int, buf: *mut c_void, n: size_t, off: i64) -> Option<ssize_t> {
    let o = remote_fd(fd)?;
    // SAFETY: the caller provides n writable bytes at buf.
    let b = unsafe { slice_mut(buf, n) };
    Some(ret(enter(|| ops::pread(&o, b, off).map(|n| n as ssize_t))))
}

#[no_mangle]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, n: size_t, off: libc::off_t) -> ssize_t {
    pread_impl(fd, buf, n, off).unwrap_or_else(|| pass!(pread(fd, buf, n, off)))
}

#[no_mangle]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t {
    pread_impl(fd, buf, n, off).unwrap_or_else(|| pass!(pread64(fd, buf, n, off)))
}

#[no_mangle]
pub unsafe extern "C" fn __pread_chk(fd: c_int, b: *mut c_void, n: size_t, off: libc::off_t, bl: size_t) -> ssize_t {
    if n > bl {
        return pass!(__pread_chk(fd, b, n, off, bl));
    }
    pread_impl(fd, b, n, off).unwrap_or_else(|| pass!(pread(fd, b, n, off)))
}

#[no_mangle]
pub unsafe extern "C" fn __pread64_chk(fd: c_int, b: *mut c_void, n: size_t, off: off64_t, bl: size_t) -> ssize_t {
    if n > bl {
        return pass!(__pread64_chk(fd, b, n, off, bl));
    }
    pread_impl(fd, b, n, off).unwrap_or_else(|| pass!(pread64(fd, b, n, off)))
}

/// Vectored I/O on a remote fd: one call per piece, stopping at a short one.
fn vector(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: Option<i64>, write: bool) -> Option<ssize_t> {
    let o = remote_fd(fd)?;
    if !(0..=libc::UIO_MAXIOV).contains(&cnt) {
        crate::guard::set_errno(libc::EINVAL);
        return Some(-1);
    }
    // SAFETY: the caller passes cnt iovecs at iov.
    let v = if cnt == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(iov, cnt as usize) } };
    Some(ret(enter(|| {
        let mut total = 0usize;
        for piece in v {
            let at = off.map(|o| o + total as i64);
            let n = if write {
                // SAFETY: each iovec describes readable memory of the caller.
                let b = unsafe { slice(piece.iov_base, piece.iov_len) };
                match at {
                    Some(p) => ops::pwrite(&o, b, p)?,
                    None => ops::write(fd, &o, b)?,
                }
            } else {
                // SAFETY: each iovec describes writable memory of the caller.
                let b = unsafe { slice_mut(piece.iov_base, piece.iov_len) };
                match at {
                    Some(p) => ops::pread(&o, b, p)?,
                    None => ops::read(fd, &o, b)?,
                }
            };
            total += n;
            if n < piece.iov_len {
                break;
            }
        }
        Ok(total as ssize_t)
    })))
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t {
    vector(fd, iov, cnt, None, false).unwrap_or_else(|| pass!(readv(fd, iov, cnt)))
}

#[no_mangle]
pub unsafe extern "C" fn preadv(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: libc::off_t) -> ssize_t {
    vector(fd, iov, cnt, Some(off), false).unwrap_or_else(|| pass!(preadv(fd, iov, cnt, off)))
}

#[no_mangle]
pub unsafe extern "C" fn preadv64(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t) -> ssize_t {
    vector(fd, iov, cnt, Some(off), false).unwrap_or_else(|| pass!(preadv64(fd, iov, cnt, off)))
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t {
    vector(fd, iov, cnt, None, true).unwrap_or_else(|| pass!(writev(fd, iov, cnt)))
}

#[no_mangle]
pub unsafe extern "C" fn pwritev(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: libc::off_t) -> ssize_t {
    vector(fd, iov, cnt, Some(off), true).unwrap_or_else(|| pass!(pwritev(fd, iov, cnt, off)))
}

#[no_mangle]
pub unsafe extern "C" fn pwritev64(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t) -> ssize_t {
    vector(fd, iov, cnt, Some(off), true).unwrap_or_else(|| pass!(pwritev64(fd, iov, cnt, off)))
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    let Some(o) = remote_fd(fd) else { return pass!(write(fd, buf, n)) };
    // SAFETY: the caller provides n readable bytes at buf.
    let b = unsafe { slice(buf, n) };
    ret(enter(|| ops::write(fd, &o, b).map(|n| n as ssize_t)))
}

fn pwrite_impl(fd: c_int, buf: *const c_void, n: size_t, off: i64) -> Option<ssize_t> {
    let o = remote_fd(fd)?;
    // SAFETY: the caller provides n readable bytes at buf.
    let b = unsafe { slice(buf, n) };
    Some(ret(enter(|| ops::pwrite(&o, b, off).map(|n| n as ssize_t))))
}

#[no_mangle]
pub unsafe extern "C" fn pwrite(fd: c_int, buf: *const c_void, n: size_t, off: libc::off_t) -> ssize_t {
    pwrite_impl(fd, buf, n, off).unwrap_or_else(|| pass!(pwrite(fd, buf, n, off)))
}

#[no_mangle]
pub unsafe extern "C" fn pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off64_t) -> ssize_t {
    pwrite_impl(fd, buf, n, off).unwrap_or_else(|| pass!(pwrite64(fd, buf, n, off)))
}

#[no_mangle]
pub unsafe extern "C" fn lseek(fd: c_int, off: libc::off_t, whence: c_int) -> libc::off_t {
    let Some(o) = remote_fd(fd) else { return pass!(lseek(fd, off, whence)) };
    ret(enter(|| ops::lseek(fd, &o, off, whence)))
}

#[no_mangle]
pub unsafe extern "C" fn lseek64(fd: c_int, off: off64_t, whence: c_int) -> off64_t {
    let Some(o) = remote_fd(fd) else { return pass!(lseek64(fd, off, whence)) };
    ret(enter(|| ops::lseek(fd, &o, off, whence)))
}

// ---- descriptors ----

/// Is `fd` one of ferry's own (a connection), which the program never
/// opened? Inside our own logic every fd is ours to use.
fn internal(fd: c_int) -> bool {
    state::may_be_internal(fd) && !crate::guard::busy() && state::owner() && guarded(|| state::is_internal(fd))
}

/// Runs a check with the guard held; a panic counts as "no".
fn guarded(f: impl FnOnce() -> bool) -> bool {
    enter(|| Ok(f())).unwrap_or(false)
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    // The program never opened ferry's connection: to it, that number is
    // not open.
    if internal(fd) {
        return ret::<c_int>(Err(libc::EBADF));
    }
    // A vfork child shares our memory: it closes its fd and nothing else.
    if crate::guard::busy() || !state::owner() {
        return pass!(close(fd));
    }
    if crate::lent::is_lent(fd) {
        // The POSIX close rule, for locks taken through the server.
        let _ = enter(|| {
            if let Some(o) = crate::lent::lock_open_made(fd) {
                crate::locks::closing(&o);
            }
            Ok(())
        });
        let r = pass!(close(fd));
        let e = crate::guard::errno();
        let _ = enter(|| {
            crate::lent::closed(fd);
            Ok(())
        });
        crate::guard::set_errno(e);
        return r;
    }
    if !state::is_remote_fd(fd) {
        return pass!(close(fd));
    }
    super::stdio::fd_changing(fd);
    ret(enter(|| ops::close(fd).map(|_| 0)))
}

#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if crate::guard::busy() || !state::owner() || first > last {
        return pass!(close_range(first, last, flags));
    }
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        for (fd, _) in state::all_opens() {
            if fd as c_uint >= first && fd as c_uint <= last {
                super::stdio::fd_changing(fd);
                let _ = enter(|| ops::close(fd));
            }
        }
    }
    let lent = enter(|| Ok(crate::lent::in_range(first, last))).unwrap_or_default();
    let r = close_range_around(first, last, flags);
    if r == 0 && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        let _ = enter(|| {
            lent.iter().for_each(|fd| crate::lent::closed(*fd));
            Ok(())
        });
    }
    r
}

/// `close_range` of the program's numbers, ferry's own skipped.
fn close_range_around(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    // ferry's connections are skipped: the range is closed around them.
    let ours = enter(|| Ok(state::internal_in(first, last))).unwrap_or_default();
    let mut from = first;
    for fd in ours {
        let fd = fd as c_uint;
        if fd > from {
            let r = pass!(close_range(from, fd - 1, flags));
            if r < 0 {
                return r;
            }
        }
        if fd == c_uint::MAX {
            return 0;
        }
        from = fd + 1;
    }
    if from > last {
        return 0;
    }
    pass!(close_range(from, last, flags))
}

#[no_mangle]
pub unsafe extern "C" fn closefrom(first: c_int) {
    // SAFETY: forwarding to our own close_range.
    unsafe { close_range(first.max(0) as c_uint, c_uint::MAX, 0) };
}

/// A real dup produced `new` from `old`; make `new` remote too (or local,
/// if it replaced a remote fd).
fn after_dup(old: c_int, new: c_int, replaced: bool) -> c_int {
    if new >= 0 && !crate::guard::busy() && state::owner() {
        if replaced {
            if let Some(o) = state::get(new) {
                crate::locks::closing(&o);
            }
            if let Some(o) = state::remove(new) {
                let _ = enter(|| {
                    if let Ok(o) = std::sync::Arc::try_unwrap(o) {
                        o.close()?;
                    }
                    Ok(())
                });
            }
        }
        if state::is_remote_fd(old) {
            ops::duped(old, new);
            super::stdio::fd_changed(new);
        }
        if crate::lent::is_lent(old) || crate::lent::is_lent(new) {
            let _ = enter(|| {
                crate::lent::duped(old, new);
                Ok(())
            });
        }
    }
    new
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    let new = pass!(dup(fd));
    after_dup(fd, new, false)
}

/// The program puts a file at `new`: a connection of ours there moves
/// away first. Err is the errno for the caller (no free number left).
fn make_room(new: c_int) -> Result<(), i32> {
    if !internal(new) {
        return Ok(());
    }
    enter(|| state::make_room(new))
}

#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if old == new {
        return pass!(dup2(old, new));
    }
    if internal(old) {
        return ret::<c_int>(Err(libc::EBADF));
    }
    if let Err(e) = make_room(new) {
        return ret::<c_int>(Err(e));
    }
    let replaced = state::is_remote_fd(new);
    if !crate::guard::busy() && state::owner() {
        super::stdio::fd_changing(new);
    }
    let r = pass!(dup2(old, new));
    if r < 0 {
        return r;
    }
    after_dup(old, r, replaced)
}

#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if internal(old) {
        return ret::<c_int>(Err(libc::EBADF));
    }
    if old != new {
        if let Err(e) = make_room(new) {
            return ret::<c_int>(Err(e));
        }
    }
    let replaced = state::is_remote_fd(new) && old != new;
    if !crate::guard::busy() && state::owner() {
        super::stdio::fd_changing(new);
    }
    let r = pass!(dup3(old, new, flags));
    if r < 0 {
        return r;
    }
    after_dup(old, r, replaced)
}

fn is_lock(cmd: c_int) -> bool {
    matches!(
        cmd,
        libc::F_GETLK | libc::F_SETLK | libc::F_SETLKW | libc::F_OFD_GETLK | libc::F_OFD_SETLK | libc::F_OFD_SETLKW
    )
}

/// The remote open taking a lent descriptor's locks (`lent.rs`).
fn lent_locks(fd: c_int) -> Option<std::sync::Arc<crate::open::Open>> {
    if guard::busy() || !state::owner() || !crate::lent::is_lent(fd) {
        return None;
    }
    enter(|| Ok(crate::lent::lock_open(fd))).ok().flatten()
}

fn fcntl_impl(fd: c_int, cmd: c_int, arg: usize, real_fn: unsafe fn(c_int, c_int, usize) -> c_int) -> c_int {
    let lent = if is_lock(cmd) { lent_locks(fd) } else { None };
    let Some(o) = remote_fd(fd).or(lent) else {
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { real_fn(fd, cmd, arg) };
        if matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) && crate::lent::is_lent(fd) {
            return after_dup(fd, r, false);
        }
        return r;
    };
    use std::sync::atomic::Ordering::Relaxed;
    if !is_lock(cmd) && !state::is_remote_fd(fd) {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { real_fn(fd, cmd, arg) };
    }
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            // SAFETY: as above.
            let new = unsafe { real_fn(fd, cmd, arg) };
            after_dup(fd, new, false)
        }
        libc::F_GETFL => o.flags.load(Relaxed) | libc::O_LARGEFILE,
        libc::F_SETFL => {
            let settable = libc::O_APPEND | libc::O_NONBLOCK | libc::O_ASYNC | libc::O_DIRECT | libc::O_NOATIME;
            let new = (o.flags.load(Relaxed) & !settable) | (arg as c_int & settable);
            o.flags.store(new, Relaxed);
            0
        }
        libc::F_GETLK | libc::F_SETLK | libc::F_SETLKW | libc::F_OFD_GETLK | libc::F_OFD_SETLK | libc::F_OFD_SETLKW => {
            if arg == 0 {
                return ret::<c_int>(Err(libc::EFAULT));
            }
            // SAFETY: for lock commands the argument is the caller's
            // `struct flock`, valid and writable for the call.
            let fl = unsafe { &mut *(arg as *mut libc::flock) };
            ret(enter(|| crate::locks::fcntl(fd, &o, cmd, fl)))
        }
        libc::F_ADD_SEALS | libc::F_GET_SEALS => ret::<c_int>(Err(libc::EINVAL)),
        // SAFETY: F_GETFD, F_SETFD and the rest act on the fd itself.
        _ => unsafe { real_fn(fd, cmd, arg) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    fcntl_impl(fd, cmd, arg, real::fcntl)
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    fcntl_impl(fd, cmd, arg, real::fcntl64)
}

#[no_mangle]
pub unsafe extern "C" fn flock(fd: c_int, op: c_int) -> c_int {
    if let Some(o) = remote_fd(fd).or_else(|| lent_locks(fd)) {
        return ret(enter(|| crate::locks::flock(&o, op)));
    }
    pass!(flock(fd, op))
}

#[no_mangle]
pub unsafe extern "C" fn lockf(fd: c_int, cmd: c_int, len: libc::off_t) -> c_int {
    if let Some(o) = remote_fd(fd).or_else(|| lent_locks(fd)) {
        return ret(enter(|| crate::locks::lockf(fd, &o, cmd, len)));
    }
    pass!(lockf(fd, cmd, len))
}

#[no_mangle]
pub unsafe extern "C" fn lockf64(fd: c_int, cmd: c_int, len: off64_t) -> c_int {
    if let Some(o) = remote_fd(fd).or_else(|| lent_locks(fd)) {
        return ret(enter(|| crate::locks::lockf(fd, &o, cmd, len)));
    }
    pass!(lockf64(fd, cmd, len))
}

// ---- attributes ----

fn fstat_impl(fd: c_int, st: *mut libc::stat64) -> Option<c_int> {
    let o = remote_fd(fd)?;
    Some(ret(enter(|| {
        let a = ops::stat_fd(&o)?;
        // SAFETY: the caller passes a stat buffer.
        conv::stat(&a, unsafe { &mut *st });
        Ok(0)
    })))
}

#[no_mangle]
pub unsafe extern "C" fn fstat(fd: c_int, st: *mut libc::stat64) -> c_int {
    fstat_impl(fd, st).unwrap_or_else(|| pass!(fstat(fd, st)))
}

#[no_mangle]
pub unsafe extern "C" fn fstat64(fd: c_int, st: *mut libc::stat64) -> c_int {
    fstat_impl(fd, st).unwrap_or_else(|| pass!(fstat64(fd, st)))
}

#[no_mangle]
pub unsafe extern "C" fn __fxstat(v: c_int, fd: c_int, st: *mut libc::stat64) -> c_int {
    fstat_impl(fd, st).unwrap_or_else(|| pass!(__fxstat(v, fd, st)))
}

#[no_mangle]
pub unsafe extern "C" fn __fxstat64(v: c_int, fd: c_int, st: *mut libc::stat64) -> c_int {
    fstat_impl(fd, st).unwrap_or_else(|| pass!(__fxstat64(v, fd, st)))
}

fn fstatfs_any(fd: c_int) -> Option<Result<ferry_client::StatFs, i32>> {
    let o = remote_fd(fd)?;
    Some(enter(|| ops::with_ro(&o.remote(), |c, p| c.statfs(p))))
}

#[no_mangle]
pub unsafe extern "C" fn fstatfs(fd: c_int, out: *mut libc::statfs) -> c_int {
    match fstatfs_any(fd) {
        // SAFETY: statfs and statfs64 have one layout on 64-bit Linux.
        Some(r) => ret(r.map(|s| conv::statfs(&s, unsafe { &mut *out.cast() })).map(|_| 0)),
        None => pass!(fstatfs(fd, out)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn fstatfs64(fd: c_int, out: *mut libc::statfs64) -> c_int {
    match fstatfs_any(fd) {
        // SAFETY: the caller passes a statfs64 buffer.
        Some(r) => ret(r.map(|s| conv::statfs(&s, unsafe { &mut *out })).map(|_| 0)),
        None => pass!(fstatfs64(fd, out)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn fstatvfs(fd: c_int, out: *mut libc::statvfs) -> c_int {
    match fstatfs_any(fd) {
        // SAFETY: statvfs and statvfs64 have one layout on 64-bit Linux.
        Some(r) => ret(r.map(|s| conv::statvfs(&s, unsafe { &mut *out.cast() })).map(|_| 0)),
        None => pass!(fstatvfs(fd, out)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn fstatvfs64(fd: c_int, out: *mut libc::statvfs64) -> c_int {
    match fstatfs_any(fd) {
        // SAFETY: the caller passes a statvfs64 buffer.
        Some(r) => ret(r.map(|s| conv::statvfs(&s, unsafe { &mut *out })).map(|_| 0)),
        None => pass!(fstatvfs64(fd, out)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    let Some(o) = remote_fd(fd) else { return pass!(fsync(fd)) };
    ret(enter(|| if o.dir { Ok(0) } else { o.fsync(false).map(|_| 0) }))
}

#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    let Some(o) = remote_fd(fd) else { return pass!(fdatasync(fd)) };
    ret(enter(|| if o.dir { Ok(0) } else { o.fsync(true).map(|_| 0) }))
}

fn ftruncate_impl(fd: c_int, len: i64) -> Option<c_int> {
    let o = remote_fd(fd)?;
    Some(ret(enter(|| {
        if o.access_mode() == libc::O_RDONLY {
            return Err(libc::EINVAL);
        }
        o.truncate(u64::try_from(len).map_err(|_| libc::EINVAL)?).map(|_| 0)
    })))
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: libc::off_t) -> c_int {
    ftruncate_impl(fd, len).unwrap_or_else(|| pass!(ftruncate(fd, len)))
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off64_t) -> c_int {
    ftruncate_impl(fd, len).unwrap_or_else(|| pass!(ftruncate64(fd, len)))
}

#[no_mangle]
pub unsafe extern "C" fn fchmod(fd: c_int, mode: libc::mode_t) -> c_int {
    let Some(o) = remote_fd(fd) else { return pass!(fchmod(fd, mode)) };
    ret(enter(|| o.with_handle(|c, t| c.set_permissions(t, mode & 0o7777)).map(|_| 0)))
}

#[no_mangle]
pub unsafe extern "C" fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    let Some(o) = remote_fd(fd) else { return pass!(fchown(fd, uid, gid)) };
    ret(enter(|| o.with_handle(|c, t| c.chown(t, uid, gid)).map(|_| 0)))
}

#[no_mangle]
pub unsafe extern "C" fn futimens(fd: c_int, ts: *const libc::timespec) -> c_int {
    let Some(o) = remote_fd(fd) else { return pass!(futimens(fd, ts)) };
    // SAFETY: NULL or two timespecs, per futimens(3).
    let (a, m) = unsafe { super::paths::times(ts) };
    ret(enter(|| o.with_handle(|c, t| c.set_times(t, a, m)).map(|_| 0)))
}

#[no_mangle]
pub unsafe extern "C" fn futimes(fd: c_int, tv: *const libc::timeval) -> c_int {
    let Some(o) = remote_fd(fd) else { return pass!(futimes(fd, tv)) };
    // SAFETY: NULL or two timevals, per futimes(3).
    let (a, m) = unsafe { super::paths::times_tv(tv) };
    ret(enter(|| o.with_handle(|c, t| c.set_times(t, a, m)).map(|_| 0)))
}

// ---- extended attributes by fd ----

#[no_mangle]
pub unsafe extern "C" fn fgetxattr(fd: c_int, n: *const libc::c_char, v: *mut c_void, s: size_t) -> ssize_t {
    let Some(o) = remote_fd(fd) else { return pass!(fgetxattr(fd, n, v, s)) };
    // SAFETY: name is a C string; value has s bytes.
    let (name, out) = unsafe { (super::bytes(n), slice_mut(v, s)) };
    ret(enter(|| {
        let name = std::str::from_utf8(name.ok_or(libc::EFAULT)?).map_err(|_| libc::ENODATA)?;
        let val = o.with_handle(|c, t| c.get_xattr(t, name))?;
        super::paths::copy_out(&val, out)
    }))
}

#[no_mangle]
pub unsafe extern "C" fn flistxattr(fd: c_int, l: *mut libc::c_char, s: size_t) -> ssize_t {
    let Some(o) = remote_fd(fd) else { return pass!(flistxattr(fd, l, s)) };
    // SAFETY: the list buffer has s bytes.
    let out = unsafe { slice_mut(l.cast(), s) };
    ret(enter(|| {
        let names = o.with_handle(|c, t| c.list_xattr(t))?;
        super::paths::copy_out(&super::paths::name_list(&names), out)
    }))
}

#[no_mangle]
pub unsafe extern "C" fn fsetxattr(fd: c_int, n: *const libc::c_char, v: *const c_void, s: size_t, f: c_int) -> c_int {
    let Some(o) = remote_fd(fd) else { return pass!(fsetxattr(fd, n, v, s, f)) };
    // SAFETY: name is a C string; value has s bytes.
    let (name, val) = unsafe { (super::bytes(n), slice(v, s)) };
    ret(enter(|| {
        let name = std::str::from_utf8(name.ok_or(libc::EFAULT)?).map_err(|_| libc::EINVAL)?;
        o.with_handle(|c, t| c.set_xattr(t, name, val, f as u32)).map(|_| 0)
    }))
}

#[no_mangle]
pub unsafe extern "C" fn fremovexattr(fd: c_int, n: *const libc::c_char) -> c_int {
    let Some(o) = remote_fd(fd) else { return pass!(fremovexattr(fd, n)) };
    // SAFETY: name is a C string.
    let name = unsafe { super::bytes(n) };
    ret(enter(|| {
        let name = std::str::from_utf8(name.ok_or(libc::EFAULT)?).map_err(|_| libc::ENODATA)?;
        o.with_handle(|c, t| c.remove_xattr(t, name)).map(|_| 0)
    }))
}

// ---- data movement between fds ----

#[no_mangle]
pub unsafe extern "C" fn posix_fadvise(fd: c_int, o: libc::off_t, l: libc::off_t, a: c_int) -> c_int {
    if remote_fd(fd).is_some() {
        return 0; // advice only; the read-ahead sees sequential reads itself
    }
    pass!(posix_fadvise(fd, o, l, a))
}

#[no_mangle]
pub unsafe extern "C" fn posix_fadvise64(fd: c_int, o: off64_t, l: off64_t, a: c_int) -> c_int {
    if remote_fd(fd).is_some() {
        return 0;
    }
    pass!(posix_fadvise64(fd, o, l, a))
}

fn fallocate_impl(fd: c_int, off: i64, len: i64) -> Option<c_int> {
    let o = remote_fd(fd)?;
    Some(ret_code(enter(|| {
        if off < 0 || len <= 0 {
            return Err(libc::EINVAL);
        }
        // Grows the file like posix_fallocate; space is not reserved.
        let end = (off + len) as u64;
        if ops::stat_fd(&o)?.size < end {
            o.truncate(end)?;
        }
        Ok(())
    })))
}

#[no_mangle]
pub unsafe extern "C" fn posix_fallocate(fd: c_int, off: libc::off_t, len: libc::off_t) -> c_int {
    fallocate_impl(fd, off, len).unwrap_or_else(|| pass!(posix_fallocate(fd, off, len)))
}

#[no_mangle]
pub unsafe extern "C" fn posix_fallocate64(fd: c_int, off: off64_t, len: off64_t) -> c_int {
    fallocate_impl(fd, off, len).unwrap_or_else(|| pass!(posix_fallocate64(fd, off, len)))
}

#[no_mangle]
pub unsafe extern "C" fn fallocate(fd: c_int, mode: c_int, off: libc::off_t, len: libc::off_t) -> c_int {
    if remote_fd(fd).is_some() {
        return ret::<c_int>(Err(libc::EOPNOTSUPP));
    }
    pass!(fallocate(fd, mode, off, len))
}

#[no_mangle]
pub unsafe extern "C" fn fallocate64(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int {
    if remote_fd(fd).is_some() {
        return ret::<c_int>(Err(libc::EOPNOTSUPP));
    }
    pass!(fallocate64(fd, mode, off, len))
}

/// Copies between a remote fd and anything else are refused with `EXDEV`
/// (copy_file_range) or `EINVAL` (sendfile, splice): the callers (cp, cat,
/// python's shutil) fall back to read and write.
fn any_remote(a: c_int, b: c_int) -> bool {
    remote_fd(a).is_some() || remote_fd(b).is_some()
}

#[no_mangle]
pub unsafe extern "C" fn copy_file_range(
    a: c_int,
    ao: *mut off64_t,
    b: c_int,
    bo: *mut off64_t,
    n: size_t,
    f: c_uint,
) -> ssize_t {
    if any_remote(a, b) {
        return ret::<ssize_t>(Err(libc::EXDEV));
    }
    pass!(copy_file_range(a, ao, b, bo, n, f))
}

#[no_mangle]
pub unsafe extern "C" fn sendfile(o: c_int, i: c_int, off: *mut libc::off_t, n: size_t) -> ssize_t {
    if any_remote(o, i) {
        return ret::<ssize_t>(Err(libc::EINVAL));
    }
    pass!(sendfile(o, i, off, n))
}

#[no_mangle]
pub unsafe extern "C" fn sendfile64(o: c_int, i: c_int, off: *mut off64_t, n: size_t) -> ssize_t {
    if any_remote(o, i) {
        return ret::<ssize_t>(Err(libc::EINVAL));
    }
    pass!(sendfile64(o, i, off, n))
}

#[no_mangle]
pub unsafe extern "C" fn splice(
    a: c_int,
    ao: *mut off64_t,
    b: c_int,
    bo: *mut off64_t,
    n: size_t,
    f: c_uint,
) -> ssize_t {
    if any_remote(a, b) {
        return ret::<ssize_t>(Err(libc::EINVAL));
    }
    pass!(splice(a, ao, b, bo, n, f))
}

// ---- mmap ----

fn mmap_impl(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: i64) -> Option<*mut c_void> {
    let o = remote_fd(fd)?;
    let r = enter(|| {
        if o.dir || off < 0 {
            return Err(if o.dir { libc::ENODEV } else { libc::EINVAL });
        }
        let kind = flags & (libc::MAP_SHARED | libc::MAP_PRIVATE);
        if kind == libc::MAP_SHARED || kind == libc::MAP_SHARED_VALIDATE {
            return crate::maps::map(&o, addr as usize, len, prot, flags, off);
        }
        // A private copy of the file's bytes, mapped from a fresh memfd.
        // SAFETY: the name is a NUL-terminated literal.
        let copy = unsafe { libc::memfd_create(c"ferry-map".as_ptr(), libc::MFD_CLOEXEC) };
        if copy < 0 {
            return Err(crate::guard::errno());
        }
        let result = (|| {
            let size = ops::stat_fd(&o)?.size;
            let want = (len as u64).min(size.saturating_sub(off as u64)) as usize;
            let mut buf = vec![0u8; want];
            let mut got = 0;
            while got < want {
                let n = o.read(off as u64 + got as u64, &mut buf[got..])?;
                if n == 0 {
                    break;
                }
                got += n;
            }
            // SAFETY: copy is our memfd; buf is valid for got bytes.
            let w = pass!(pwrite64(copy, buf.as_ptr().cast(), got, off));
            if w < 0 || (w as usize) < got {
                return Err(libc::EIO);
            }
            // SAFETY: mapping our memfd with the caller's arguments.
            let p = pass!(mmap64(addr, len, prot, flags & !libc::MAP_SHARED | libc::MAP_PRIVATE, copy, off));
            if p == libc::MAP_FAILED {
                return Err(crate::guard::errno());
            }
            Ok(p)
        })();
        // SAFETY: the mapping keeps its own reference to the memfd.
        pass!(close(copy));
        result
    });
    Some(match r {
        Ok(p) => p,
        Err(e) => {
            crate::guard::set_errno(e);
            libc::MAP_FAILED
        }
    })
}

/// A local mapping placed over a remote one (`MAP_FIXED`) replaces it:
/// what is returned goes once the new mapping is in place.
fn replacing(a: *mut c_void, l: size_t, f: c_int) -> Option<crate::maps::Leaving> {
    if f & libc::MAP_FIXED != 0 && !guard::busy() {
        enter(|| Ok(crate::maps::unmapping(a as usize, l))).ok()
    } else {
        None
    }
}

#[no_mangle]
pub unsafe extern "C" fn mmap(a: *mut c_void, l: size_t, p: c_int, f: c_int, fd: c_int, o: libc::off_t) -> *mut c_void {
    if fd < 0 || f & libc::MAP_ANONYMOUS != 0 {
        let _old = replacing(a, l, f);
        return pass!(mmap(a, l, p, f, fd, o));
    }
    mmap_impl(a, l, p, f, fd, o).unwrap_or_else(|| {
        let _old = replacing(a, l, f);
        let m = pass!(mmap(a, l, p, f, fd, o));
        if m != libc::MAP_FAILED && crate::lent::is_lent(fd) && !guard::busy() {
            let _ = enter(|| {
                crate::lent::mapped(fd, f);
                Ok(())
            });
        }
        m
    })
}

#[no_mangle]
pub unsafe extern "C" fn mmap64(a: *mut c_void, l: size_t, p: c_int, f: c_int, fd: c_int, o: off64_t) -> *mut c_void {
    if fd < 0 || f & libc::MAP_ANONYMOUS != 0 {
        let _old = replacing(a, l, f);
        return pass!(mmap64(a, l, p, f, fd, o));
    }
    mmap_impl(a, l, p, f, fd, o).unwrap_or_else(|| {
        let _old = replacing(a, l, f);
        let m = pass!(mmap64(a, l, p, f, fd, o));
        if m != libc::MAP_FAILED && crate::lent::is_lent(fd) && !guard::busy() {
            let _ = enter(|| {
                crate::lent::mapped(fd, f);
                Ok(())
            });
        }
        m
    })
}

/// Changes made through a remote shared mapping go to the server first.
#[no_mangle]
pub unsafe extern "C" fn munmap(a: *mut c_void, l: size_t) -> c_int {
    if guard::busy() {
        return pass!(munmap(a, l));
    }
    let _old = enter(|| Ok(crate::maps::unmapping(a as usize, l)));
    pass!(munmap(a, l))
}

#[no_mangle]
pub unsafe extern "C" fn msync(a: *mut c_void, l: size_t, f: c_int) -> c_int {
    if guard::busy() {
        return pass!(msync(a, l, f));
    }
    match enter(|| Ok(crate::maps::msync(a, l, f))) {
        Ok(Some(r)) => ret(r.map(|_| 0)),
        _ => pass!(msync(a, l, f)),
    }
}
