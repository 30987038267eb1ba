//! stdio on remote files. glibc's `FILE` reads and writes its fd with
//! internal calls we cannot see, so a remote `FILE *` is a `fopencookie`
//! stream whose functions call our hooks; and when fd 0, 1 or 2 becomes
//! remote (a shell redirection, an inherited fd after `exec`), the program's
//! `stdin`/`stdout`/`stderr` are switched to such a stream and back.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::sync::Mutex;
use libc::{c_char, c_int, c_void, size_t, ssize_t, FILE};

use super::{bytes, remote_fd, remote_path};
use crate::{guard, state};

#[repr(C)]
struct CookieIo {
    read: Option<unsafe extern "C" fn(*mut c_void, *mut c_char, size_t) -> ssize_t>,
    write: Option<unsafe extern "C" fn(*mut c_void, *const c_char, size_t) -> ssize_t>,
    seek: Option<unsafe extern "C" fn(*mut c_void, *mut i64, c_int) -> c_int>,
    close: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
}

extern "C" {
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, io: CookieIo) -> *mut FILE;
    static mut stdin: *mut FILE;
    static mut stdout: *mut FILE;
    static mut stderr: *mut FILE;
}

/// Our cookie streams and their fds, for `fileno`.
static COOKIES: Mutex<Vec<(usize, c_int)>> = Mutex::new(Vec::new());
/// glibc's own standard streams, to put back.
static ORIGINAL: [AtomicUsize; 3] = [const { AtomicUsize::new(0) }; 3];

unsafe extern "C" fn c_read(c: *mut c_void, buf: *mut c_char, n: size_t) -> ssize_t {
    // SAFETY: stdio passes a buffer of n bytes.
    let r = unsafe { super::fd::read(c as usize as c_int, buf.cast(), n) };
    // A cookie read reports errors as -1; stdio then sets the error flag.
    r.max(-1)
}

unsafe extern "C" fn c_write(c: *mut c_void, buf: *const c_char, n: size_t) -> ssize_t {
    // SAFETY: stdio passes n bytes.
    let r = unsafe { super::fd::write(c as usize as c_int, buf.cast(), n) };
    // A short count of 0 is how a cookie write reports failure.
    r.max(0)
}

unsafe extern "C" fn c_seek(c: *mut c_void, off: *mut i64, whence: c_int) -> c_int {
    // SAFETY: stdio passes a valid offset pointer.
    let r = unsafe { super::fd::lseek64(c as usize as c_int, *off, whence) };
    if r < 0 {
        return -1;
    }
    // SAFETY: as above.
    unsafe { *off = r };
    0
}

unsafe extern "C" fn c_close(c: *mut c_void) -> c_int {
    let fd = c as usize as c_int;
    COOKIES.lock().retain(|(_, f)| *f != fd);
    // SAFETY: the stream owned its fd.
    unsafe { super::fd::close(fd) }
}

/// A stdio stream over a remote fd.
fn cookie_stream(fd: c_int, mode: &std::ffi::CStr) -> *mut FILE {
    let io = CookieIo { read: Some(c_read), write: Some(c_write), seek: Some(c_seek), close: Some(c_close) };
    // SAFETY: the functions match fopencookie's contract; the cookie is the fd.
    let f = unsafe { fopencookie(fd as usize as *mut c_void, mode.as_ptr(), io) };
    if !f.is_null() {
        COOKIES.lock().push((f as usize, fd));
    }
    f
}

/// Remembers glibc's standard streams (at start).
pub fn remember_std() {
    // SAFETY: reading the three globals at start, before any thread.
    unsafe {
        ORIGINAL[0].store(stdin as usize, Relaxed);
        ORIGINAL[1].store(stdout as usize, Relaxed);
        ORIGINAL[2].store(stderr as usize, Relaxed);
    }
}

fn slot(fd: c_int) -> *mut *mut FILE {
    // Taking the address of the globals, not reading them.
    match fd {
        0 => &raw mut stdin,
        1 => &raw mut stdout,
        _ => &raw mut stderr,
    }
}

/// `fd` (0, 1 or 2) is about to stop being what it was: flush its stream,
/// and if that was our cookie stream, put glibc's back.
pub fn fd_changing(fd: c_int) {
    if !(0..=2).contains(&fd) || !state::ACTIVE.load(Relaxed) || guard::busy() {
        return;
    }
    let s = slot(fd);
    // SAFETY: reading and writing a stdio global from the thread making the
    // change, as a program's own `freopen` would.
    unsafe {
        let cur = *s;
        if cur.is_null() {
            return;
        }
        libc::fflush(cur);
        if COOKIES.lock().iter().any(|(f, _)| *f == cur as usize) {
            let orig = ORIGINAL[fd as usize].load(Relaxed);
            if orig != 0 {
                *s = orig as *mut FILE;
            }
        }
    }
}

/// `fd` (0, 1 or 2) is now remote: point the standard stream at a cookie
/// stream for it, so `printf` and friends reach the server.
pub fn fd_changed(fd: c_int) {
    if !(0..=2).contains(&fd) || !state::ACTIVE.load(Relaxed) || guard::busy() || !state::is_remote_fd(fd) {
        return;
    }
    let mode = if fd == 0 { c"r" } else { c"w" };
    let f = cookie_stream(fd, mode);
    if f.is_null() {
        return;
    }
    // SAFETY: as in fd_changing.
    unsafe {
        if fd == 2 {
            libc::setvbuf(f, std::ptr::null_mut(), libc::_IONBF, 0);
        }
        *slot(fd) = f;
    }
}

/// `fopen` mode string into open flags.
fn mode_flags(m: &[u8]) -> Option<c_int> {
    let (mut f, plus) = (0, m.contains(&b'+'));
    match m.first()? {
        b'r' => f |= if plus { libc::O_RDWR } else { libc::O_RDONLY },
        b'w' => f |= libc::O_CREAT | libc::O_TRUNC | if plus { libc::O_RDWR } else { libc::O_WRONLY },
        b'a' => f |= libc::O_CREAT | libc::O_APPEND | if plus { libc::O_RDWR } else { libc::O_WRONLY },
        _ => return None,
    }
    if m.contains(&b'x') {
        f |= libc::O_EXCL;
    }
    if m.contains(&b'e') {
        f |= libc::O_CLOEXEC;
    }
    Some(f)
}

fn fopen_remote(p: *const c_char, m: *const c_char) -> Option<*mut FILE> {
    // SAFETY: the caller's C strings.
    let r = unsafe { remote_path(p) }?;
    // SAFETY: as above.
    let mode = unsafe { bytes(m) }.unwrap_or(b"");
    let Some(flags) = mode_flags(mode) else {
        guard::set_errno(libc::EINVAL);
        return Some(std::ptr::null_mut());
    };
    let mut elsewhere = None;
    let fd = crate::links::follow_out(
        &r,
        || guard::ret(guard::enter(|| crate::ops::open(&r, flags, 0o666))),
        |next| {
            // SAFETY: our own fopen, on the path a symlink's target gives.
            elsewhere = Some(unsafe { fopen(next.as_ptr(), m) });
            -1
        },
    );
    if let Some(f) = elsewhere {
        return Some(f);
    }
    if fd < 0 {
        return Some(std::ptr::null_mut());
    }
    // SAFETY: m is the caller's mode string.
    let f = cookie_stream(fd, unsafe { std::ffi::CStr::from_ptr(m) });
    if f.is_null() {
        let e = guard::errno();
        // SAFETY: closing the fd we opened.
        unsafe { super::fd::close(fd) };
        guard::set_errno(e);
    }
    Some(f)
}

#[no_mangle]
pub unsafe extern "C" fn fopen(p: *const c_char, m: *const c_char) -> *mut FILE {
    let fixed = safe_path!(super::local_fix(p));
    let p = fixed.as_ref().map_or(p, |c| c.as_ptr());
    fopen_remote(p, m).unwrap_or_else(|| pass!(fopen(p, m)))
}

#[no_mangle]
pub unsafe extern "C" fn fopen64(p: *const c_char, m: *const c_char) -> *mut FILE {
    let fixed = safe_path!(super::local_fix(p));
    let p = fixed.as_ref().map_or(p, |c| c.as_ptr());
    fopen_remote(p, m).unwrap_or_else(|| pass!(fopen64(p, m)))
}

#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, m: *const c_char) -> *mut FILE {
    // A lent descriptor's stream too: glibc's `fclose` closes its fd with
    // an internal call this library would not see (the server's handle
    // would stay open, and the file unleasable, until exit).
    if remote_fd(fd).is_none() && (guard::busy() || !crate::lent::is_lent(fd)) {
        return pass!(fdopen(fd, m));
    }
    // SAFETY: m is the caller's mode string.
    cookie_stream(fd, unsafe { std::ffi::CStr::from_ptr(m) })
}

/// `freopen` onto a remote path: the standard streams keep their identity
/// (the remote fd takes their number); another stream is replaced by a new
/// one, which is what is returned.
fn freopen_remote(p: *const c_char, m: *const c_char, s: *mut FILE) -> Option<*mut FILE> {
    // SAFETY: the caller's C string.
    unsafe { remote_path(p) }?;
    // SAFETY: s is the caller's stream.
    let old_fd = unsafe { fileno(s) };
    // SAFETY: flushing the caller's stream before its fd changes.
    unsafe { libc::fflush(s) };
    let f = fopen_remote(p, m)?;
    if f.is_null() {
        return Some(f);
    }
    if (0..=2).contains(&old_fd) {
        // SAFETY: our own fileno and dup2/fclose hooks on our new stream.
        unsafe {
            let nfd = fileno(f);
            super::fd::dup2(nfd, old_fd);
            COOKIES.lock().retain(|(x, _)| *x != f as usize);
            real_fclose(f);
            return Some(*slot(old_fd));
        }
    }
    // SAFETY: closing the caller's old stream, as freopen does.
    unsafe { libc::fclose(s) };
    Some(f)
}

/// Closes a cookie stream whose fd was already handed on.
unsafe fn real_fclose(f: *mut FILE) {
    // SAFETY: f is a live stream; its close function closes its fd, which
    // dup2 has already duplicated.
    unsafe { libc::fclose(f) };
}

#[no_mangle]
pub unsafe extern "C" fn freopen(p: *const c_char, m: *const c_char, s: *mut FILE) -> *mut FILE {
    let fixed = safe_path!(super::local_fix(p));
    let p = fixed.as_ref().map_or(p, |c| c.as_ptr());
    freopen_remote(p, m, s).unwrap_or_else(|| pass!(freopen(p, m, s)))
}

#[no_mangle]
pub unsafe extern "C" fn freopen64(p: *const c_char, m: *const c_char, s: *mut FILE) -> *mut FILE {
    let fixed = safe_path!(super::local_fix(p));
    let p = fixed.as_ref().map_or(p, |c| c.as_ptr());
    freopen_remote(p, m, s).unwrap_or_else(|| pass!(freopen64(p, m, s)))
}

fn cookie_fd(s: *mut FILE) -> Option<c_int> {
    COOKIES.lock().iter().find(|(f, _)| *f == s as usize).map(|(_, fd)| *fd)
}

#[no_mangle]
pub unsafe extern "C" fn fileno(s: *mut FILE) -> c_int {
    cookie_fd(s).unwrap_or_else(|| pass!(fileno(s)))
}

#[no_mangle]
pub unsafe extern "C" fn fileno_unlocked(s: *mut FILE) -> c_int {
    cookie_fd(s).unwrap_or_else(|| pass!(fileno_unlocked(s)))
}

/// `fork`: the list of streams is held across, as `state::before_fork`
/// holds the rest.
pub(crate) fn hold_for_fork() {
    std::mem::forget(COOKIES.lock());
}

/// # Safety
/// Only after `hold_for_fork` in this thread.
pub(crate) unsafe fn release_after_fork() {
    // SAFETY: per the function's contract.
    unsafe { COOKIES.force_unlock() };
}
