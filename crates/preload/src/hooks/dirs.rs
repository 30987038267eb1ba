//! Directory streams over remote directories. glibc's `readdir` reads with
//! an internal `getdents64` we cannot see, so remote `DIR *` are ours: a
//! listing fetched in one batched READDIRPLUS, handed out entry by entry.

use std::ffi::CString;
use std::sync::Arc;

use crate::sync::Mutex;
use libc::{c_char, c_int, c_long};

use super::{remote_fd, remote_path};
use crate::guard::{enter, set_errno};
use crate::open::Open;
use crate::ops;

struct Entry {
    name: CString,
    ino: u64,
    kind: u8,
}

struct RemoteDir {
    /// The stream's placeholder fd; -1 until `dirfd` asks (`opendir`).
    fd: c_int,
    open: Arc<Open>,
    entries: Vec<Entry>,
    pos: usize,
    ent: libc::dirent64,
}

/// Our `DIR *` values (boxed `RemoteDir`s), told apart from glibc's.
static DIRS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn ours(d: *mut libc::DIR) -> bool {
    !d.is_null() && DIRS.lock().contains(&(d as usize))
}

fn list(o: &Open) -> Result<Vec<Entry>, i32> {
    let r = o.remote();
    let gen = crate::attrs::generation();
    let items = ops::with_ro(&r, |c, p| c.read_dir(p))?;
    crate::attrs::put_listing(
        gen,
        r.mount,
        &r.path,
        items.iter().filter_map(|e| Some((&e.name[..], e.attr.as_ref()?))),
    );
    let me = ops::stat_path(&r, true).map(|a| a.ino).unwrap_or(1);
    let mut out = vec![
        Entry { name: c".".to_owned(), ino: me, kind: libc::DT_DIR },
        Entry { name: c"..".to_owned(), ino: 1, kind: libc::DT_DIR },
    ];
    for e in items {
        if let Ok(name) = CString::new(e.name) {
            out.push(Entry { name, ino: e.ino, kind: e.kind });
        }
    }
    Ok(out)
}

fn make(fd: c_int, open: Arc<Open>) -> Result<*mut libc::DIR, i32> {
    if !open.dir {
        return Err(libc::ENOTDIR);
    }
    let entries = list(&open)?;
    // SAFETY: dirent64 is plain data; all-zero is valid.
    let ent = unsafe { std::mem::zeroed() };
    let p = Box::into_raw(Box::new(RemoteDir { fd, open, entries, pos: 0, ent })) as *mut libc::DIR;
    DIRS.lock().push(p as usize);
    Ok(p)
}

fn with_dir<T>(d: *mut libc::DIR, f: impl FnOnce(&mut RemoteDir) -> T) -> T {
    // SAFETY: `d` is in DIRS, so it is a live Box<RemoteDir> of ours; the
    // program uses one DIR from one thread at a time, as POSIX requires.
    f(unsafe { &mut *(d as *mut RemoteDir) })
}

fn null_with(e: i32) -> *mut libc::DIR {
    set_errno(e);
    std::ptr::null_mut()
}

#[no_mangle]
pub unsafe extern "C" fn opendir(p: *const c_char) -> *mut libc::DIR {
    let fixed = safe_path!(super::local_fix(p));
    let p = fixed.as_ref().map_or(p, |c| c.as_ptr());
    let Some(r) = safe_path!(remote_path(p)) else { return pass!(opendir(p)) };
    crate::links::follow_out(
        &r,
        || enter(|| make(-1, ops::open_dir_stream(&r))).unwrap_or_else(null_with),
        // SAFETY: this hook again, on the path a symlink's target gives.
        |next| unsafe { opendir(next.as_ptr()) },
    )
}

#[no_mangle]
pub unsafe extern "C" fn fdopendir(fd: c_int) -> *mut libc::DIR {
    let Some(o) = remote_fd(fd) else { return pass!(fdopendir(fd)) };
    enter(|| make(fd, o)).unwrap_or_else(null_with)
}

fn next(d: *mut libc::DIR) -> *mut libc::dirent64 {
    with_dir(d, |rd| {
        let Some(e) = rd.entries.get(rd.pos) else { return std::ptr::null_mut() };
        rd.pos += 1;
        let name = e.name.as_bytes_with_nul();
        let n = name.len().min(rd.ent.d_name.len());
        rd.ent.d_ino = e.ino;
        rd.ent.d_off = rd.pos as i64;
        rd.ent.d_type = e.kind;
        rd.ent.d_reclen = std::mem::size_of::<libc::dirent64>() as u16;
        for (dst, src) in rd.ent.d_name.iter_mut().zip(&name[..n]) {
            *dst = *src as c_char;
        }
        rd.ent.d_name[n - 1] = 0;
        &mut rd.ent as *mut libc::dirent64
    })
}

#[no_mangle]
pub unsafe extern "C" fn readdir(d: *mut libc::DIR) -> *mut libc::dirent {
    if !ours(d) {
        return pass!(readdir(d));
    }
    // dirent and dirent64 are the same structure on 64-bit Linux.
    next(d).cast()
}

#[no_mangle]
pub unsafe extern "C" fn readdir64(d: *mut libc::DIR) -> *mut libc::dirent64 {
    if !ours(d) {
        return pass!(readdir64(d));
    }
    next(d)
}

#[no_mangle]
pub unsafe extern "C" fn readdir_r(d: *mut libc::DIR, e: *mut libc::dirent, r: *mut *mut libc::dirent) -> c_int {
    if !ours(d) {
        return pass!(readdir_r(d, e, r));
    }
    let n = next(d);
    // SAFETY: the caller passes an entry buffer and a result pointer.
    unsafe {
        if n.is_null() {
            *r = std::ptr::null_mut();
        } else {
            std::ptr::copy_nonoverlapping(n.cast::<libc::dirent>(), e, 1);
            *r = e;
        }
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn readdir64_r(d: *mut libc::DIR, e: *mut libc::dirent64, r: *mut *mut libc::dirent64) -> c_int {
    if !ours(d) {
        return pass!(readdir64_r(d, e, r));
    }
    let n = next(d);
    // SAFETY: as in readdir_r.
    unsafe {
        if n.is_null() {
            *r = std::ptr::null_mut();
        } else {
            std::ptr::copy_nonoverlapping(n, e, 1);
            *r = e;
        }
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn closedir(d: *mut libc::DIR) -> c_int {
    if !ours(d) {
        return pass!(closedir(d));
    }
    DIRS.lock().retain(|p| *p != d as usize);
    // SAFETY: it was ours and is now out of DIRS: we own the box.
    let rd = unsafe { Box::from_raw(d as *mut RemoteDir) };
    let fd = rd.fd;
    drop(rd);
    if fd < 0 {
        return 0;
    }
    // SAFETY: the stream owned its fd; our close hook releases it.
    unsafe { super::fd::close(fd) }
}

#[no_mangle]
pub unsafe extern "C" fn dirfd(d: *mut libc::DIR) -> c_int {
    if !ours(d) {
        return pass!(dirfd(d));
    }
    with_dir(d, |rd| {
        if rd.fd < 0 {
            match enter(|| ops::number(&rd.open, true)) {
                Ok(fd) => rd.fd = fd,
                Err(e) => set_errno(e),
            }
        }
        rd.fd
    })
}

#[no_mangle]
pub unsafe extern "C" fn rewinddir(d: *mut libc::DIR) {
    if !ours(d) {
        return pass!(rewinddir(d));
    }
    with_dir(d, |rd| {
        if let Ok(e) = enter(|| list(&rd.open)) {
            rd.entries = e;
        }
        rd.pos = 0;
    })
}

#[no_mangle]
pub unsafe extern "C" fn telldir(d: *mut libc::DIR) -> c_long {
    if !ours(d) {
        return pass!(telldir(d));
    }
    with_dir(d, |rd| rd.pos as c_long)
}

#[no_mangle]
pub unsafe extern "C" fn seekdir(d: *mut libc::DIR, loc: c_long) {
    if !ours(d) {
        return pass!(seekdir(d, loc));
    }
    with_dir(d, |rd| rd.pos = (loc.max(0) as usize).min(rd.entries.len()))
}

/// `fork`: the list of streams is held across, as `state::before_fork`
/// holds the rest.
pub(crate) fn hold_for_fork() {
    std::mem::forget(DIRS.lock());
}

/// # Safety
/// Only after `hold_for_fork` in this thread.
pub(crate) unsafe fn release_after_fork() {
    // SAFETY: per the function's contract.
    unsafe { DIRS.force_unlock() };
}
