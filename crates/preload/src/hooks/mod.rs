//! The exported C functions: thin wrappers that decide *remote*, *local*
//! (straight to libc) or *error*, and call the safe logic in `ops`.
//!
//! Every hook first checks the re-entry guard and the fd bitmap or the
//! mount table, so a local call costs a few loads before libc runs it.

#![allow(clippy::missing_safety_doc)]

use std::ffi::CStr;

/// Forwards a call to libc's function of the same name.
macro_rules! pass {
    ($f:ident($($a:expr),* $(,)?)) => {
        // SAFETY: the caller's own arguments go unchanged to libc's
        // function of the same name, whose contract the caller upholds.
        unsafe { $crate::real::$f($($a),*) }
    };
}

/// Looks at a path argument of the hook.
macro_rules! safe_path {
    ($($f:ident)::+($($a:expr),* $(,)?)) => {
        // SAFETY: the hook's caller passes NULL or a NUL-terminated path,
        // valid for the call, as every libc path function requires.
        unsafe { $($f)::+($($a),*) }
    };
}
/// A hook whose path argument is resolved against the mounts: `path(p)`
/// for an absolute or cwd-relative `p`, `at(d, p)` for one relative to
/// the directory fd `d`. A remote path runs the expression after `|r|`
/// with the `Remote` bound to `r`; any other goes to libc unchanged (but
/// for the fix of a path written relative to a remote cwd, `local_fix`).
macro_rules! path_hook {
    (fn $name:ident($($a:ident: $t:ty),*) -> $ret:ty; path($p:ident) => |$r:ident| $remote:expr) => {
        path_hook!(@ $name($($a: $t),*) -> $ret; local_fix($p), remote_path($p), $p => |$r| $remote);
    };
    (fn $name:ident($($a:ident: $t:ty),*) -> $ret:ty; at($d:ident, $p:ident) => |$r:ident| $remote:expr) => {
        path_hook!(@ $name($($a: $t),*) -> $ret; local_fix_at($d, $p), remote_at($d, $p), $p => |$r| $remote);
    };
    (@ $name:ident($($a:ident: $t:ty),*) -> $ret:ty; $fix:ident($($fa:ident),*), $find:ident($($ra:ident),*),
     $p:ident => |$r:ident| $remote:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $ret {
            let fixed = safe_path!(super::$fix($($fa),*));
            let $p = fixed.as_ref().map_or($p, |c| c.as_ptr());
            match safe_path!(super::$find($($ra),*)) {
                Some($r) => {
                    let seen = $r.clone();
                    $crate::links::follow_out(&seen, || $remote, |next| {
                        let $p = next.as_ptr();
                        // SAFETY: this hook again, on the path a symlink's target gives.
                        unsafe { $name($($a),*) }
                    })
                }
                None => pass!($name($($a),*)),
            }
        }
    };
}
use std::sync::atomic::Ordering::Relaxed;

use libc::{c_char, c_int};

use crate::guard;
use crate::mounts::Remote;
use crate::namespace;
use crate::open::Open;
use crate::state;

pub mod dirs;
pub mod fd;
pub mod paths;
pub mod process;
pub mod stdio;
pub mod temp;

/// A hook's decision must not panic into C (that aborts the program): a
/// panic while deciding means "not ours", and libc gets the call.
fn no_panic<T>(f: impl FnOnce() -> Option<T>) -> Option<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok().flatten()
}

/// `fork`: the hooks' own tables, held across (after `state`'s locks).
pub(crate) fn hold_for_fork() {
    dirs::hold_for_fork();
    stdio::hold_for_fork();
}

/// # Safety
/// Only after `hold_for_fork` in this thread.
pub(crate) unsafe fn release_after_fork() {
    // SAFETY: per the function's contract.
    unsafe {
        stdio::release_after_fork();
        dirs::release_after_fork();
    }
}

/// The remote open file behind `fd`, unless we are inside our own logic.
pub fn remote_fd(fd: c_int) -> Option<std::sync::Arc<Open>> {
    if guard::busy() {
        return None;
    }
    state::get(fd)
}

/// The bytes of a C string argument.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string that outlives the call.
pub unsafe fn bytes<'a>(p: *const c_char) -> Option<&'a [u8]> {
    if p.is_null() {
        return None;
    }
    // SAFETY: per the function's contract.
    Some(unsafe { CStr::from_ptr(p) }.to_bytes())
}

/// Is this path argument remote (relative paths from the working directory)?
///
/// # Safety
/// As for `bytes`.
pub unsafe fn remote_path(p: *const c_char) -> Option<Remote> {
    // SAFETY: per the function's contract.
    no_panic(|| unsafe { remote_path_inner(p) })
}

/// # Safety
/// As for `bytes`.
unsafe fn remote_path_inner(p: *const c_char) -> Option<Remote> {
    if guard::busy() || !state::ACTIVE.load(Relaxed) {
        return None;
    }
    // SAFETY: per the function's contract.
    let b = unsafe { bytes(p) }?;
    state::resolve(b, None)
}

/// Path argument of an `*at` call, relative to `dirfd`.
///
/// # Safety
/// As for `bytes`.
pub unsafe fn remote_at(dirfd: c_int, p: *const c_char) -> Option<Remote> {
    // SAFETY: per the function's contract.
    no_panic(|| unsafe { remote_at_inner(dirfd, p) })
}

/// # Safety
/// As for `bytes`.
unsafe fn remote_at_inner(dirfd: c_int, p: *const c_char) -> Option<Remote> {
    if guard::busy() || !state::ACTIVE.load(Relaxed) {
        return None;
    }
    // SAFETY: per the function's contract.
    let b = unsafe { bytes(p) }?;
    if b.first() == Some(&b'/') || dirfd == libc::AT_FDCWD {
        return state::resolve(b, None);
    }
    if let Some(o) = state::get(dirfd) {
        return state::resolve(b, Some(&o.local));
    }
    // A local directory above a mount (rsync opens `/` and asks for
    // `remote/dir/...`): the path can only get there through the mount
    // point's own name. Only then is the directory's path read.
    if !namespace::may_enter(&state::MOUNTS.read(), b) {
        return None;
    }
    let dir = local_dir(dirfd)?;
    state::resolve(b, Some(&dir))
}

/// The path of a local directory fd, from `/proc/self/fd`.
fn local_dir(fd: c_int) -> Option<Vec<u8>> {
    let link = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).ok()?;
    let mut buf = [0u8; 4096];
    // SAFETY: link is a C string; buf is writable for its length.
    let n = unsafe { crate::real::readlink(link.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 || n as usize >= buf.len() || buf[0] != b'/' {
        return None;
    }
    Some(buf[..n as usize].to_vec())
}

/// The path a local call must really use: one that passes through a mount
/// and comes out again (`rmt/../x`, `/remote/..`), or one relative to a
/// remote working directory that leads out of the mount (`cd ..`,
/// `../../etc/x`), goes to the kernel as the absolute path it means: the
/// mount point need not exist locally, and the kernel's own working
/// directory is elsewhere.
///
/// # Safety
/// As for `bytes`.
pub unsafe fn local_fix(p: *const c_char) -> Option<std::ffi::CString> {
    // SAFETY: per the function's contract.
    no_panic(|| unsafe { local_fix_inner(p) })
}

/// # Safety
/// As for `bytes`.
unsafe fn local_fix_inner(p: *const c_char) -> Option<std::ffi::CString> {
    if guard::busy() || !state::ACTIVE.load(Relaxed) {
        return None;
    }
    // SAFETY: per the function's contract.
    let s = unsafe { bytes(p) }?;
    std::ffi::CString::new(state::local_detour(s)?).ok()
}

/// `local_fix` for an `*at` call: only paths from the working directory.
///
/// # Safety
/// As for `bytes`.
pub unsafe fn local_fix_at(d: c_int, p: *const c_char) -> Option<std::ffi::CString> {
    // SAFETY: per the function's contract.
    no_panic(|| unsafe { local_fix_at_inner(d, p) })
}

/// # Safety
/// As for `bytes`.
unsafe fn local_fix_at_inner(d: c_int, p: *const c_char) -> Option<std::ffi::CString> {
    // SAFETY: per the function's contract.
    let b = unsafe { bytes(p) }?;
    if d == libc::AT_FDCWD || b.first() == Some(&b'/') {
        // SAFETY: per the function's contract.
        return unsafe { local_fix_inner(p) };
    }
    // From a remote directory fd, `..` can lead out of the mount; the
    // kernel cannot walk from the placeholder, so it gets the full path.
    if guard::busy() || !namespace::has_dotdot(b) {
        return None;
    }
    let o = state::get(d)?;
    let joined = [&o.local[..], b"/", b].concat();
    let norm = namespace::normalize(&state::MOUNTS.read(), &joined);
    if state::resolve(&norm, None).is_some() {
        return None;
    }
    std::ffi::CString::new(norm).ok()
}

/// `Some(errno)` when exactly one of two paths is remote: the call would
/// cross file systems.
pub fn crossing(a: &Option<Remote>, b: &Option<Remote>) -> bool {
    a.is_some() != b.is_some()
}

/// A mutable byte slice from a C buffer.
///
/// # Safety
/// `p` is valid for `n` writable bytes (or `n` is 0).
pub unsafe fn slice_mut<'a>(p: *mut libc::c_void, n: usize) -> &'a mut [u8] {
    if n == 0 || p.is_null() {
        return &mut [];
    }
    // SAFETY: per the function's contract.
    unsafe { std::slice::from_raw_parts_mut(p.cast(), n) }
}

/// # Safety
/// `p` is valid for `n` readable bytes (or `n` is 0).
pub unsafe fn slice<'a>(p: *const libc::c_void, n: usize) -> &'a [u8] {
    if n == 0 || p.is_null() {
        return &[];
    }
    // SAFETY: per the function's contract.
    unsafe { std::slice::from_raw_parts(p.cast(), n) }
}
