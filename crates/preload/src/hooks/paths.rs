//! Calls that name a path.

use libc::{c_char, c_int, c_uint, c_void, mode_t, size_t, ssize_t};

use super::{bytes, crossing, remote_at, remote_path, slice, slice_mut};
use crate::conv;
use crate::guard::{enter, ret};
use crate::mounts::Remote;
use crate::ops::{self, R};
use ferry_client::{Target, Time};

/// `(atime, mtime)` from a `utimensat` argument (NULL = both now).
///
/// # Safety
/// `ts` is NULL or points at two timespecs.
pub unsafe fn times(ts: *const libc::timespec) -> (Time, Time) {
    if ts.is_null() {
        return (Time::NOW, Time::NOW);
    }
    // SAFETY: per the function's contract.
    let t = unsafe { std::slice::from_raw_parts(ts, 2) };
    let f = |t: &libc::timespec| Time { sec: t.tv_sec, nsec: t.tv_nsec as u32 };
    (f(&t[0]), f(&t[1]))
}

/// # Safety
/// `tv` is NULL or points at two timevals.
pub unsafe fn times_tv(tv: *const libc::timeval) -> (Time, Time) {
    if tv.is_null() {
        return (Time::NOW, Time::NOW);
    }
    // SAFETY: per the function's contract.
    let t = unsafe { std::slice::from_raw_parts(tv, 2) };
    let f = |t: &libc::timeval| Time { sec: t.tv_sec, nsec: (t.tv_usec * 1000) as u32 };
    (f(&t[0]), f(&t[1]))
}

/// The xattr convention: size 0 asks for the length; too small is ERANGE.
pub fn copy_out(val: &[u8], out: &mut [u8]) -> R<ssize_t> {
    if out.is_empty() {
        return Ok(val.len() as ssize_t);
    }
    if val.len() > out.len() {
        return Err(libc::ERANGE);
    }
    out[..val.len()].copy_from_slice(val);
    Ok(val.len() as ssize_t)
}

pub fn name_list(names: &[std::ffi::OsString]) -> Vec<u8> {
    let mut v = Vec::new();
    for n in names {
        v.extend_from_slice(std::os::unix::ffi::OsStrExt::as_bytes(n.as_os_str()));
        v.push(0);
    }
    v
}

fn name(p: Option<&[u8]>) -> R<&str> {
    std::str::from_utf8(p.ok_or(libc::EFAULT)?).map_err(|_| libc::EINVAL)
}

// ---- open ----

fn open_hook(r: Remote, flags: c_int, mode: c_uint) -> c_int {
    let fd = ret(enter(|| ops::open(&r, flags, mode)));
    if (0..=2).contains(&fd) {
        super::stdio::fd_changed(fd);
    }
    fd
}

fn mode_of(flags: c_int, mode: c_uint) -> c_uint {
    // The mode argument exists only with O_CREAT or O_TMPFILE.
    if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
        mode
    } else {
        0
    }
}

path_hook!(fn open(p: *const c_char, flags: c_int, mode: c_uint) -> c_int; path(p) => |r| {
    open_hook(r, flags, mode_of(flags, mode))
});

path_hook!(fn open64(p: *const c_char, flags: c_int, mode: c_uint) -> c_int; path(p) => |r| {
    open_hook(r, flags, mode_of(flags, mode))
});

path_hook!(fn __open_2(p: *const c_char, flags: c_int) -> c_int; path(p) => |r| open_hook(r, flags, 0));

path_hook!(fn __open64_2(p: *const c_char, flags: c_int) -> c_int; path(p) => |r| open_hook(r, flags, 0));

path_hook!(fn openat(d: c_int, p: *const c_char, flags: c_int, mode: c_uint) -> c_int; at(d, p) => |r| {
    open_hook(r, flags, mode_of(flags, mode))
});

path_hook!(fn openat64(d: c_int, p: *const c_char, flags: c_int, mode: c_uint) -> c_int; at(d, p) => |r| {
    open_hook(r, flags, mode_of(flags, mode))
});

path_hook!(fn __openat_2(d: c_int, p: *const c_char, flags: c_int) -> c_int; at(d, p) => |r| open_hook(r, flags, 0));

path_hook!(fn __openat64_2(d: c_int, p: *const c_char, flags: c_int) -> c_int; at(d, p) => |r| open_hook(r, flags, 0));

const CREAT: c_int = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;

path_hook!(fn creat(p: *const c_char, mode: mode_t) -> c_int; path(p) => |r| open_hook(r, CREAT, mode));

path_hook!(fn creat64(p: *const c_char, mode: mode_t) -> c_int; path(p) => |r| open_hook(r, CREAT, mode));

// ---- stat ----

fn stat_into(r: Remote, follow: bool, st: *mut libc::stat64) -> c_int {
    ret(enter(|| {
        let a = ops::stat_path(&r, follow)?;
        // SAFETY: the caller passes a stat buffer.
        conv::stat(&a, unsafe { &mut *st });
        Ok(0)
    }))
}

path_hook!(fn stat(p: *const c_char, st: *mut libc::stat64) -> c_int; path(p) => |r| stat_into(r, true, st));
path_hook!(fn stat64(p: *const c_char, st: *mut libc::stat64) -> c_int; path(p) => |r| stat_into(r, true, st));
path_hook!(fn lstat(p: *const c_char, st: *mut libc::stat64) -> c_int; path(p) => |r| stat_into(r, false, st));
path_hook!(fn lstat64(p: *const c_char, st: *mut libc::stat64) -> c_int; path(p) => |r| stat_into(r, false, st));
path_hook!(fn __xstat(v: c_int, p: *const c_char, st: *mut libc::stat64) -> c_int; path(p) => |r| {
    stat_into(r, true, st)
});
path_hook!(fn __xstat64(v: c_int, p: *const c_char, st: *mut libc::stat64) -> c_int; path(p) => |r| {
    stat_into(r, true, st)
});
path_hook!(fn __lxstat(v: c_int, p: *const c_char, st: *mut libc::stat64) -> c_int; path(p) => |r| {
    stat_into(r, false, st)
});
path_hook!(fn __lxstat64(v: c_int, p: *const c_char, st: *mut libc::stat64) -> c_int; path(p) => |r| {
    stat_into(r, false, st)
});

/// `fstatat` and friends: an empty path with `AT_EMPTY_PATH` means the fd.
fn fstatat_impl(d: c_int, p: *const c_char, st: *mut libc::stat64, flags: c_int) -> Option<c_int> {
    // SAFETY: p is the caller's C string.
    let empty = unsafe { bytes(p) }.is_some_and(|b| b.is_empty());
    if empty && flags & libc::AT_EMPTY_PATH != 0 {
        let o = super::remote_fd(d)?;
        return Some(ret(enter(|| {
            let a = ops::stat_fd(&o)?;
            // SAFETY: the caller passes a stat buffer.
            conv::stat(&a, unsafe { &mut *st });
            Ok(0)
        })));
    }
    // SAFETY: as above.
    let r = unsafe { remote_at(d, p) }?;
    let seen = r.clone();
    crate::links::follow_out(
        &seen,
        || Some(stat_into(r, flags & libc::AT_SYMLINK_NOFOLLOW == 0, st)),
        // SAFETY: our own hook (one layout for all four), on the path a
        // symlink's target gives.
        |next| Some(unsafe { fstatat64(d, next.as_ptr(), st, flags) }),
    )
}

#[no_mangle]
pub unsafe extern "C" fn fstatat(d: c_int, p: *const c_char, st: *mut libc::stat64, f: c_int) -> c_int {
    let fixed = safe_path!(super::local_fix_at(d, p));
    let p = fixed.as_ref().map_or(p, |c| c.as_ptr());
    fstatat_impl(d, p, st, f).unwrap_or_else(|| pass!(fstatat(d, p, st, f)))
}

#[no_mangle]
pub unsafe extern "C" fn fstatat64(d: c_int, p: *const c_char, st: *mut libc::stat64, f: c_int) -> c_int {
    let fixed = safe_path!(super::local_fix_at(d, p));
    let p = fixed.as_ref().map_or(p, |c| c.as_ptr());
    fstatat_impl(d, p, st, f).unwrap_or_else(|| pass!(fstatat64(d, p, st, f)))
}

#[no_mangle]
pub unsafe extern "C" fn __fxstatat(v: c_int, d: c_int, p: *const c_char, st: *mut libc::stat64, f: c_int) -> c_int {
    let fixed = safe_path!(super::local_fix_at(d, p));
    let p = fixed.as_ref().map_or(p, |c| c.as_ptr());
    fstatat_impl(d, p, st, f).unwrap_or_else(|| pass!(__fxstatat(v, d, p, st, f)))
}

#[no_mangle]
pub unsafe extern "C" fn __fxstatat64(v: c_int, d: c_int, p: *const c_char, st: *mut libc::stat64, f: c_int) -> c_int {
    let fixed = safe_path!(super::local_fix_at(d, p));
    let p = fixed.as_ref().map_or(p, |c| c.as_ptr());
    fstatat_impl(d, p, st, f).unwrap_or_else(|| pass!(__fxstatat64(v, d, p, st, f)))
}

#[no_mangle]
pub unsafe extern "C" fn statx(d: c_int, p: *const c_char, f: c_int, m: c_uint, sx: *mut libc::statx) -> c_int {
    let fixed = safe_path!(super::local_fix_at(d, p));
    let p = fixed.as_ref().map_or(p, |c| c.as_ptr());
    // SAFETY: p is the caller's C string.
    let empty = unsafe { bytes(p) }.is_some_and(|b| b.is_empty());
    let fill = |a: ferry_client::Attr| {
        // SAFETY: the caller passes a statx buffer.
        conv::statx(&a, unsafe { &mut *sx });
        0
    };
    if empty && f & libc::AT_EMPTY_PATH != 0 {
        return match super::remote_fd(d) {
            Some(o) => ret(enter(|| ops::stat_fd(&o)).map(fill)),
            None => pass!(statx(d, p, f, m, sx)),
        };
    }
    match safe_path!(remote_at(d, p)) {
        Some(r) => crate::links::follow_out(
            &r,
            || ret(enter(|| ops::stat_path(&r, f & libc::AT_SYMLINK_NOFOLLOW == 0)).map(fill)),
            // SAFETY: this hook again, on the path a symlink's target gives.
            |next| unsafe { statx(d, next.as_ptr(), f, m, sx) },
        ),
        None => pass!(statx(d, p, f, m, sx)),
    }
}

fn statfs_of(r: Remote) -> R<ferry_client::StatFs> {
    enter(|| ops::with_ro(&r, |c, p| c.statfs(p)))
}

path_hook!(fn statfs(p: *const c_char, out: *mut libc::statfs) -> c_int; path(p) => |r| {
    // SAFETY: statfs and statfs64 have one layout on 64-bit Linux.
    ret(statfs_of(r).map(|s| conv::statfs(&s, unsafe { &mut *out.cast() })).map(|_| 0))
});

path_hook!(fn statfs64(p: *const c_char, out: *mut libc::statfs64) -> c_int; path(p) => |r| {
    // SAFETY: the caller passes a statfs64 buffer.
    ret(statfs_of(r).map(|s| conv::statfs(&s, unsafe { &mut *out })).map(|_| 0))
});

path_hook!(fn statvfs(p: *const c_char, out: *mut libc::statvfs) -> c_int; path(p) => |r| {
    // SAFETY: statvfs and statvfs64 have one layout on 64-bit Linux.
    ret(statfs_of(r).map(|s| conv::statvfs(&s, unsafe { &mut *out.cast() })).map(|_| 0))
});

path_hook!(fn statvfs64(p: *const c_char, out: *mut libc::statvfs64) -> c_int; path(p) => |r| {
    // SAFETY: the caller passes a statvfs64 buffer.
    ret(statfs_of(r).map(|s| conv::statvfs(&s, unsafe { &mut *out })).map(|_| 0))
});

// ---- simple path calls ----

fn access_of(r: Remote, mode: c_int) -> c_int {
    ret(enter(|| ops::with_ro(&r, |c, p| c.access(p, mode as u32)).map(|_| 0)))
}

path_hook!(fn access(p: *const c_char, m: c_int) -> c_int; path(p) => |r| access_of(r, m));

path_hook!(fn euidaccess(p: *const c_char, m: c_int) -> c_int; path(p) => |r| access_of(r, m));

path_hook!(fn eaccess(p: *const c_char, m: c_int) -> c_int; path(p) => |r| access_of(r, m));

path_hook!(fn faccessat(d: c_int, p: *const c_char, m: c_int, f: c_int) -> c_int; at(d, p) => |r| access_of(r, m));

fn mkdir_of(r: Remote, mode: mode_t) -> c_int {
    let mode = mode & 0o7777 & !ops::umask();
    ret(enter(|| ops::with(&r, |c, p| c.create_dir(p, mode)).map(|_| 0)))
}

path_hook!(fn mkdir(p: *const c_char, m: mode_t) -> c_int; path(p) => |r| mkdir_of(r, m));

path_hook!(fn mkdirat(d: c_int, p: *const c_char, m: mode_t) -> c_int; at(d, p) => |r| mkdir_of(r, m));

fn mknod_of(r: Remote, mode: mode_t, dev: libc::dev_t) -> c_int {
    let mode = (mode & libc::S_IFMT) | (mode & 0o7777 & !ops::umask());
    let mode = if mode & libc::S_IFMT == 0 { mode | libc::S_IFREG } else { mode };
    ret(enter(|| ops::with(&r, |c, p| c.mknod(p, mode, dev)).map(|_| 0)))
}

path_hook!(fn mknod(p: *const c_char, m: mode_t, dev: libc::dev_t) -> c_int; path(p) => |r| mknod_of(r, m, dev));

path_hook!(fn mknodat(d: c_int, p: *const c_char, m: mode_t, dev: libc::dev_t) -> c_int; at(d, p) => |r| {
    mknod_of(r, m, dev)
});

path_hook!(fn mkfifo(p: *const c_char, m: mode_t) -> c_int; path(p) => |r| {
    mknod_of(r, libc::S_IFIFO | (m & 0o7777), 0)
});

fn unlink_of(r: Remote) -> c_int {
    ret(enter(|| ops::with(&r, |c, p| c.remove_file(p)).map(|_| 0)))
}

fn rmdir_of(r: Remote) -> c_int {
    ret(enter(|| ops::with(&r, |c, p| c.remove_dir(p)).map(|_| 0)))
}

path_hook!(fn unlink(p: *const c_char) -> c_int; path(p) => |r| unlink_of(r));

#[no_mangle]
pub unsafe extern "C" fn unlinkat(d: c_int, p: *const c_char, f: c_int) -> c_int {
    let fixed = safe_path!(super::local_fix_at(d, p));
    let p = fixed.as_ref().map_or(p, |c| c.as_ptr());
    match safe_path!(remote_at(d, p)) {
        Some(r) if f & libc::AT_REMOVEDIR != 0 => rmdir_of(r),
        Some(r) => unlink_of(r),
        None => pass!(unlinkat(d, p, f)),
    }
}

path_hook!(fn rmdir(p: *const c_char) -> c_int; path(p) => |r| rmdir_of(r));

#[no_mangle]
pub unsafe extern "C" fn remove(p: *const c_char) -> c_int {
    let fixed = safe_path!(super::local_fix(p));
    let p = fixed.as_ref().map_or(p, |c| c.as_ptr());
    match safe_path!(remote_path(p)) {
        Some(r) => ret(enter(|| {
            let is_dir = ops::stat_path(&r, false)?.mode & libc::S_IFMT == libc::S_IFDIR;
            ops::with(&r, |c, p| if is_dir { c.remove_dir(p) } else { c.remove_file(p) }).map(|_| 0)
        })),
        None => pass!(remove(p)),
    }
}

fn rename_of(a: Option<Remote>, b: Option<Remote>, flags: c_uint) -> Option<c_int> {
    if crossing(&a, &b) {
        return Some(ret::<c_int>(Err(libc::EXDEV)));
    }
    let (a, b) = (a?, b?);
    Some(ret(enter(|| {
        ops::same_mount(&a, &b)?;
        ops::with(&a, |c, p| c.rename_with_flags(p, crate::mounts::as_path(&b.path), flags)).map(|_| 0)
    })))
}

#[no_mangle]
pub unsafe extern "C" fn rename(a: *const c_char, b: *const c_char) -> c_int {
    let fa = safe_path!(super::local_fix(a));
    let a = fa.as_ref().map_or(a, |c| c.as_ptr());
    let fb = safe_path!(super::local_fix(b));
    let b = fb.as_ref().map_or(b, |c| c.as_ptr());
    // SAFETY: both are the caller's C strings.
    let (ra, rb) = unsafe { (remote_path(a), remote_path(b)) };
    rename_of(ra, rb, 0).unwrap_or_else(|| pass!(rename(a, b)))
}

#[no_mangle]
pub unsafe extern "C" fn renameat(d1: c_int, a: *const c_char, d2: c_int, b: *const c_char) -> c_int {
    let fa = safe_path!(super::local_fix_at(d1, a));
    let a = fa.as_ref().map_or(a, |c| c.as_ptr());
    let fb = safe_path!(super::local_fix_at(d2, b));
    let b = fb.as_ref().map_or(b, |c| c.as_ptr());
    // SAFETY: both are the caller's C strings.
    let (ra, rb) = unsafe { (remote_at(d1, a), remote_at(d2, b)) };
    rename_of(ra, rb, 0).unwrap_or_else(|| pass!(renameat(d1, a, d2, b)))
}

#[no_mangle]
pub unsafe extern "C" fn renameat2(d1: c_int, a: *const c_char, d2: c_int, b: *const c_char, f: c_uint) -> c_int {
    let fa = safe_path!(super::local_fix_at(d1, a));
    let a = fa.as_ref().map_or(a, |c| c.as_ptr());
    let fb = safe_path!(super::local_fix_at(d2, b));
    let b = fb.as_ref().map_or(b, |c| c.as_ptr());
    // SAFETY: both are the caller's C strings.
    let (ra, rb) = unsafe { (remote_at(d1, a), remote_at(d2, b)) };
    rename_of(ra, rb, f).unwrap_or_else(|| pass!(renameat2(d1, a, d2, b, f)))
}

fn link_of(a: Option<Remote>, b: Option<Remote>) -> Option<c_int> {
    if crossing(&a, &b) {
        return Some(ret::<c_int>(Err(libc::EXDEV)));
    }
    let (a, b) = (a?, b?);
    Some(ret(enter(|| {
        ops::same_mount(&a, &b)?;
        ops::with(&a, |c, p| c.hard_link(p, crate::mounts::as_path(&b.path))).map(|_| 0)
    })))
}

#[no_mangle]
pub unsafe extern "C" fn link(a: *const c_char, b: *const c_char) -> c_int {
    let fa = safe_path!(super::local_fix(a));
    let a = fa.as_ref().map_or(a, |c| c.as_ptr());
    let fb = safe_path!(super::local_fix(b));
    let b = fb.as_ref().map_or(b, |c| c.as_ptr());
    // SAFETY: both are the caller's C strings.
    let (ra, rb) = unsafe { (remote_path(a), remote_path(b)) };
    link_of(ra, rb).unwrap_or_else(|| pass!(link(a, b)))
}

#[no_mangle]
pub unsafe extern "C" fn linkat(d1: c_int, a: *const c_char, d2: c_int, b: *const c_char, f: c_int) -> c_int {
    let fa = safe_path!(super::local_fix_at(d1, a));
    let a = fa.as_ref().map_or(a, |c| c.as_ptr());
    let fb = safe_path!(super::local_fix_at(d2, b));
    let b = fb.as_ref().map_or(b, |c| c.as_ptr());
    // SAFETY: both are the caller's C strings.
    let (ra, rb) = unsafe { (remote_at(d1, a), remote_at(d2, b)) };
    link_of(ra, rb).unwrap_or_else(|| pass!(linkat(d1, a, d2, b, f)))
}

fn symlink_of(target: *const c_char, r: Remote) -> c_int {
    // SAFETY: target is the caller's C string.
    let t = unsafe { bytes(target) };
    ret(enter(|| {
        let t = name(t)?;
        ops::with(&r, |c, p| c.symlink(t, p)).map(|_| 0)
    }))
}

path_hook!(fn symlink(t: *const c_char, p: *const c_char) -> c_int; path(p) => |r| symlink_of(t, r));

path_hook!(fn symlinkat(t: *const c_char, d: c_int, p: *const c_char) -> c_int; at(d, p) => |r| symlink_of(t, r));

fn readlink_of(r: Remote, buf: *mut c_char, n: size_t) -> ssize_t {
    // SAFETY: the caller provides n writable bytes.
    let out = unsafe { slice_mut(buf.cast(), n) };
    ret(enter(|| {
        let t = std::os::unix::ffi::OsStringExt::into_vec(ops::with_ro(&r, |c, p| c.read_link(p))?.into_os_string());
        // readlink truncates silently and adds no NUL.
        let k = t.len().min(out.len());
        out[..k].copy_from_slice(&t[..k]);
        Ok(k as ssize_t)
    }))
}

path_hook!(fn readlink(p: *const c_char, b: *mut c_char, n: size_t) -> ssize_t; path(p) => |r| readlink_of(r, b, n));

path_hook!(fn readlinkat(d: c_int, p: *const c_char, b: *mut c_char, n: size_t) -> ssize_t; at(d, p) => |r| {
    readlink_of(r, b, n)
});

fn target(r: &Remote, follow: bool) -> Target<'_> {
    if follow {
        Target::Path(&r.path)
    } else {
        Target::PathNoFollow(&r.path)
    }
}

fn chmod_of(r: Remote, mode: mode_t, follow: bool) -> c_int {
    ret(enter(|| {
        let c = ops::client(&r)?;
        c.set_permissions(target(&r, follow), mode & 0o7777).map(|_| 0).map_err(|e| ops::err(&r, e))
    }))
}

path_hook!(fn chmod(p: *const c_char, m: mode_t) -> c_int; path(p) => |r| chmod_of(r, m, true));

path_hook!(fn fchmodat(d: c_int, p: *const c_char, m: mode_t, f: c_int) -> c_int; at(d, p) => |r| {
    chmod_of(r, m, f & libc::AT_SYMLINK_NOFOLLOW == 0)
});

fn chown_of(r: Remote, uid: libc::uid_t, gid: libc::gid_t, follow: bool) -> c_int {
    ret(enter(|| {
        let c = ops::client(&r)?;
        c.chown(target(&r, follow), uid, gid).map(|_| 0).map_err(|e| ops::err(&r, e))
    }))
}

path_hook!(fn chown(p: *const c_char, u: libc::uid_t, g: libc::gid_t) -> c_int; path(p) => |r| chown_of(r, u, g, true));

path_hook!(fn lchown(p: *const c_char, u: libc::uid_t, g: libc::gid_t) -> c_int; path(p) => |r| {
    chown_of(r, u, g, false)
});

#[no_mangle]
pub unsafe extern "C" fn fchownat(d: c_int, p: *const c_char, u: libc::uid_t, g: libc::gid_t, f: c_int) -> c_int {
    let fixed = safe_path!(super::local_fix_at(d, p));
    let p = fixed.as_ref().map_or(p, |c| c.as_ptr());
    // SAFETY: p is the caller's C string.
    let empty = unsafe { bytes(p) }.is_some_and(|b| b.is_empty());
    if empty && f & libc::AT_EMPTY_PATH != 0 {
        // SAFETY: forwarding to our own fchown.
        return unsafe { super::fd::fchown(d, u, g) };
    }
    match safe_path!(remote_at(d, p)) {
        Some(r) => chown_of(r, u, g, f & libc::AT_SYMLINK_NOFOLLOW == 0),
        None => pass!(fchownat(d, p, u, g, f)),
    }
}

fn utimes_of(r: Remote, (a, m): (Time, Time), follow: bool) -> c_int {
    ret(enter(|| {
        let c = ops::client(&r)?;
        c.set_times(target(&r, follow), a, m).map(|_| 0).map_err(|e| ops::err(&r, e))
    }))
}

#[no_mangle]
pub unsafe extern "C" fn utimensat(d: c_int, p: *const c_char, t: *const libc::timespec, f: c_int) -> c_int {
    let fixed = safe_path!(super::local_fix_at(d, p));
    let p = fixed.as_ref().map_or(p, |c| c.as_ptr());
    if p.is_null() {
        // utimensat(fd, NULL, ...) is futimens.
        if super::remote_fd(d).is_some() {
            // SAFETY: forwarding to our own futimens.
            return unsafe { super::fd::futimens(d, t) };
        }
        return pass!(utimensat(d, p, t, f));
    }
    match safe_path!(remote_at(d, p)) {
        // SAFETY: t is NULL or two timespecs.
        Some(r) => utimes_of(r, unsafe { times(t) }, f & libc::AT_SYMLINK_NOFOLLOW == 0),
        None => pass!(utimensat(d, p, t, f)),
    }
}

path_hook!(fn utimes(p: *const c_char, t: *const libc::timeval) -> c_int; path(p) => |r| {
    // SAFETY: t is NULL or two timevals.
    utimes_of(r, unsafe { times_tv(t) }, true)
});

path_hook!(fn lutimes(p: *const c_char, t: *const libc::timeval) -> c_int; path(p) => |r| {
    // SAFETY: t is NULL or two timevals.
    utimes_of(r, unsafe { times_tv(t) }, false)
});

#[no_mangle]
pub unsafe extern "C" fn utime(p: *const c_char, t: *const libc::utimbuf) -> c_int {
    let fixed = safe_path!(super::local_fix(p));
    let p = fixed.as_ref().map_or(p, |c| c.as_ptr());
    match safe_path!(remote_path(p)) {
        Some(r) => {
            let tt = if t.is_null() {
                (Time::NOW, Time::NOW)
            } else {
                // SAFETY: t points at a utimbuf.
                let u = unsafe { &*t };
                (Time { sec: u.actime, nsec: 0 }, Time { sec: u.modtime, nsec: 0 })
            };
            utimes_of(r, tt, true)
        }
        None => pass!(utime(p, t)),
    }
}

fn truncate_of(r: Remote, len: i64) -> c_int {
    ret(enter(|| {
        let len = u64::try_from(len).map_err(|_| libc::EINVAL)?;
        let c = ops::client(&r)?;
        c.truncate(Target::Path(&r.path), len).map_err(|e| ops::err(&r, e))?;
        crate::maps::truncated(r.mount, &r.path, len);
        Ok(0)
    }))
}

path_hook!(fn truncate(p: *const c_char, l: libc::off_t) -> c_int; path(p) => |r| truncate_of(r, l));

path_hook!(fn truncate64(p: *const c_char, l: libc::off64_t) -> c_int; path(p) => |r| truncate_of(r, l));

// ---- extended attributes by path ----

fn getxattr_of(r: Remote, n: *const c_char, v: *mut c_void, s: size_t, follow: bool) -> ssize_t {
    // SAFETY: n is a C string; v has s bytes.
    let (n, out) = unsafe { (bytes(n), slice_mut(v, s)) };
    ret(enter(|| {
        let n = std::str::from_utf8(n.ok_or(libc::EFAULT)?).map_err(|_| libc::ENODATA)?;
        let c = ops::client(&r)?;
        let val = c.get_xattr(target(&r, follow), n).map_err(|e| ops::err(&r, e))?;
        copy_out(&val, out)
    }))
}

path_hook!(fn getxattr(p: *const c_char, n: *const c_char, v: *mut c_void, s: size_t) -> ssize_t; path(p) => |r| {
    getxattr_of(r, n, v, s, true)
});

path_hook!(fn lgetxattr(p: *const c_char, n: *const c_char, v: *mut c_void, s: size_t) -> ssize_t; path(p) => |r| {
    getxattr_of(r, n, v, s, false)
});

fn setxattr_of(r: Remote, n: *const c_char, v: *const c_void, s: size_t, f: c_int, follow: bool) -> c_int {
    // SAFETY: n is a C string; v has s bytes.
    let (n, val) = unsafe { (bytes(n), slice(v, s)) };
    ret(enter(|| {
        let n = name(n)?;
        let c = ops::client(&r)?;
        c.set_xattr(target(&r, follow), n, val, f as u32).map(|_| 0).map_err(|e| ops::err(&r, e))
    }))
}

path_hook!(fn setxattr(p: *const c_char, n: *const c_char, v: *const c_void, s: size_t, f: c_int) -> c_int; path(p) => |r| {
    setxattr_of(r, n, v, s, f, true)
});

path_hook!(fn lsetxattr(p: *const c_char, n: *const c_char, v: *const c_void, s: size_t, f: c_int) -> c_int; path(p) => |r| {
    setxattr_of(r, n, v, s, f, false)
});

fn listxattr_of(r: Remote, l: *mut c_char, s: size_t, follow: bool) -> ssize_t {
    // SAFETY: l has s bytes.
    let out = unsafe { slice_mut(l.cast(), s) };
    ret(enter(|| {
        let c = ops::client(&r)?;
        let names = c.list_xattr(target(&r, follow)).map_err(|e| ops::err(&r, e))?;
        copy_out(&name_list(&names), out)
    }))
}

path_hook!(fn listxattr(p: *const c_char, l: *mut c_char, s: size_t) -> ssize_t; path(p) => |r| {
    listxattr_of(r, l, s, true)
});

path_hook!(fn llistxattr(p: *const c_char, l: *mut c_char, s: size_t) -> ssize_t; path(p) => |r| {
    listxattr_of(r, l, s, false)
});

fn removexattr_of(r: Remote, n: *const c_char, follow: bool) -> c_int {
    // SAFETY: n is a C string.
    let n = unsafe { bytes(n) };
    ret(enter(|| {
        let n = name(n)?;
        let c = ops::client(&r)?;
        c.remove_xattr(target(&r, follow), n).map(|_| 0).map_err(|e| ops::err(&r, e))
    }))
}

path_hook!(fn removexattr(p: *const c_char, n: *const c_char) -> c_int; path(p) => |r| removexattr_of(r, n, true));

path_hook!(fn lremovexattr(p: *const c_char, n: *const c_char) -> c_int; path(p) => |r| removexattr_of(r, n, false));

// ---- canonical names ----

/// `realpath` of a remote path: every symlink on the way resolved in the
/// program's name space (`links::canonical`), and it must exist.
fn realpath_of(r: Remote, out: *mut c_char) -> *mut c_char {
    let res = enter(|| {
        let s = std::ffi::CString::new(crate::links::canonical(&r)?).map_err(|_| libc::EINVAL)?;
        if s.as_bytes().len() >= libc::PATH_MAX as usize {
            return Err(libc::ENAMETOOLONG);
        }
        Ok(s)
    });
    match res {
        Err(e) => {
            crate::guard::set_errno(e);
            std::ptr::null_mut()
        }
        Ok(s) => {
            let b = s.as_bytes_with_nul();
            let dst = if out.is_null() {
                // SAFETY: malloc, as realpath(3) documents for a NULL buffer.
                unsafe { libc::malloc(b.len()) }.cast::<c_char>()
            } else {
                out
            };
            if dst.is_null() {
                crate::guard::set_errno(libc::ENOMEM);
                return dst;
            }
            // SAFETY: dst has room for PATH_MAX bytes (or b.len() if we
            // allocated it); b.len() < PATH_MAX was checked.
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr().cast(), dst, b.len()) };
            dst
        }
    }
}

path_hook!(fn realpath(p: *const c_char, out: *mut c_char) -> *mut c_char; path(p) => |r| realpath_of(r, out));

path_hook!(fn canonicalize_file_name(p: *const c_char) -> *mut c_char; path(p) => |r| {
    realpath_of(r, std::ptr::null_mut())
});
