//! Symlinks on the server whose targets are paths of the *program's* name
//! space, as the kernel reads them on a mount: an absolute target outside
//! every mount prefix is local (`bin/python3 -> /usr/bin/python3` in a
//! venv), one under a prefix is remote, and a relative one is taken from
//! the link's directory, so enough `..` climb out of the mount into the
//! local name space.
//!
//! The server resolves a path inside its export and never outside it (an
//! absolute target from the export root, `..` stopping at the top): that
//! confinement is the server's security and stays. So the client crosses
//! the line itself, and only when it must: when a remote call by path
//! fails with `ENOENT` or `ENOTDIR`, the path is looked at from its end
//! upwards with `lstat` until a part exists; if that part is a symlink, the
//! call is made again on the path its target gives (which may be local).
//! A call that succeeds costs nothing more; one that fails in an existing
//! directory costs one or two `lstat`s (often answered by the attribute
//! cache). What this cannot see: a link whose target the server *finds*
//! inside the export (an absolute target that exists under the export
//! root, a relative one that climbs above the top and lands on something
//! that exists); those resolve as the server's in-root walk says.

use std::cell::Cell;

use crate::guard::enter;
use crate::mounts::Remote;
use crate::{namespace, ops, state};

/// The most links followed for one call of the program, as the kernel's
/// limit (past it, `ELOOP`).
const MAX_LINKS: u32 = 40;

thread_local! {
    /// Links followed by the call under way on this thread.
    static FOLLOWED: Cell<u32> = const { Cell::new(0) };
}

/// Runs a hook's remote work, and again on the path a symlink's target
/// gives if the work failed with `ENOENT`/`ENOTDIR` because a link on the
/// way leads out of the server's in-root walk. `again` runs the whole
/// hook on the new path (which may be local).
pub fn follow_out<T>(r: &Remote, work: impl FnOnce() -> T, again: impl FnOnce(&std::ffi::CStr) -> T) -> T {
    let saved = crate::guard::errno();
    crate::guard::set_errno(0);
    let out = work();
    let e = crate::guard::errno();
    if e != libc::ENOENT && e != libc::ENOTDIR {
        if e == 0 {
            crate::guard::set_errno(saved);
        }
        return out;
    }
    let Some(next) = enter(|| Ok(redirect(r))).ok().flatten() else {
        crate::guard::set_errno(e);
        return out;
    };
    let n = FOLLOWED.with(|f| f.get());
    if n >= MAX_LINKS {
        crate::guard::set_errno(libc::ELOOP);
        return out;
    }
    let Ok(c) = std::ffi::CString::new(next) else {
        crate::guard::set_errno(e);
        return out;
    };
    FOLLOWED.with(|f| f.set(n + 1));
    let res = again(&c);
    FOLLOWED.with(|f| f.set(n));
    res
}

/// Where `r` really leads if a symlink on its way leaves the export's
/// in-root walk: the part of the path that exists is found from the end
/// upwards; if it is a symlink, its target (in the program's name space)
/// with the rest of the path after it.
pub fn redirect(r: &Remote) -> Option<Vec<u8>> {
    let prefix = state::MOUNTS.read().get(r.mount)?.prefix.clone().into_bytes();
    let mut cur = r.local.clone();
    let mut rest: Vec<u8> = Vec::new();
    while cur.len() > prefix.len() && cur.starts_with(&prefix) {
        let here = state::resolve(&cur, None)?;
        match ops::stat_path(&here, false) {
            Ok(a) if a.mode & libc::S_IFMT == libc::S_IFLNK => {
                let t = ops::with_ro(&here, |c, p| c.read_link(p)).ok()?;
                let t = std::os::unix::ffi::OsStringExt::into_vec(t.into_os_string());
                let parent = &cur[..cur.iter().rposition(|b| *b == b'/').unwrap_or(0)];
                let mut next = if t.starts_with(b"/") { t } else { [parent, b"/", &t[..]].concat() };
                if !rest.is_empty() {
                    next.push(b'/');
                    next.extend_from_slice(&rest);
                }
                return Some(namespace::normalize(&state::MOUNTS.read(), &next));
            }
            Ok(_) => return None,
            Err(e) if e == libc::ENOENT || e == libc::ENOTDIR => {
                let cut = cur.iter().rposition(|b| *b == b'/').unwrap_or(0);
                let name = cur[cut + 1..].to_vec();
                rest = if rest.is_empty() { name } else { [&name[..], b"/", &rest[..]].concat() };
                cur.truncate(cut);
            }
            Err(_) => return None,
        }
    }
    None
}

/// `realpath` of a path under a mount: every symlink on the way resolved
/// in the program's name space (a remote part by `lstat`/`readlink`
/// component by component, a local one by libc), as the kernel would.
pub fn canonical(r: &Remote) -> Result<Vec<u8>, i32> {
    let mut r = std::borrow::Cow::Borrowed(r);
    for _ in 0..MAX_LINKS {
        let prefix = state::MOUNTS.read().get(r.mount).ok_or(libc::EIO)?.prefix.clone().into_bytes();
        let tail = r.local.get(prefix.len()..).unwrap_or_default().to_vec();
        let comps: Vec<&[u8]> = tail.split(|b| *b == b'/').filter(|c| !c.is_empty()).collect();
        let mut cur = prefix.clone();
        let mut next = None;
        for (i, c) in comps.iter().enumerate() {
            cur.push(b'/');
            cur.extend_from_slice(c);
            let here = state::resolve(&cur, None).ok_or(libc::EIO)?;
            let a = ops::stat_path(&here, false)?;
            if a.mode & libc::S_IFMT == libc::S_IFLNK {
                let t = ops::with_ro(&here, |c, p| c.read_link(p)).map_err(|_| libc::EIO)?;
                let t = std::os::unix::ffi::OsStringExt::into_vec(t.into_os_string());
                let parent = &cur[..cur.iter().rposition(|b| *b == b'/').unwrap_or(0)];
                let mut n = if t.starts_with(b"/") { t } else { [parent, b"/", &t[..]].concat() };
                for c in &comps[i + 1..] {
                    n.push(b'/');
                    n.extend_from_slice(c);
                }
                next = Some(namespace::normalize(&state::MOUNTS.read(), &n));
                break;
            }
            if i + 1 < comps.len() && a.mode & libc::S_IFMT != libc::S_IFDIR {
                return Err(libc::ENOTDIR);
            }
        }
        let Some(next) = next else {
            // The mount point itself, or no link on the way.
            ops::stat_path(&r, true)?;
            return Ok(r.local.clone());
        };
        match state::resolve(&next, None) {
            Some(n) => r = std::borrow::Cow::Owned(n),
            None => return local_realpath(&next),
        }
    }
    Err(libc::ELOOP)
}

/// libc's `realpath` of a local path.
fn local_realpath(p: &[u8]) -> Result<Vec<u8>, i32> {
    let c = std::ffi::CString::new(p).map_err(|_| libc::EINVAL)?;
    // SAFETY: c is a C string; a NULL buffer makes libc allocate the result.
    let out = unsafe { crate::real::realpath(c.as_ptr(), std::ptr::null_mut()) };
    if out.is_null() {
        return Err(crate::guard::errno());
    }
    // SAFETY: libc returned a NUL-terminated string it allocated.
    let v = unsafe { std::ffi::CStr::from_ptr(out) }.to_bytes().to_vec();
    // SAFETY: allocated by libc's realpath with malloc.
    unsafe { libc::free(out.cast()) };
    Ok(v)
}
