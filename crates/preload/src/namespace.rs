//! Paths as the program means them, across the line between the local
//! name space and the mounts: a `..` after a local symlink climbs from
//! the link's target (as the kernel walks), and a path the program gives
//! relative to a local directory may lead into a mount.
//!
//! Paths that cannot reach a mount cost nothing here: the lexical tests
//! in `mounts` decide first, and only a path that names a mount point's
//! last component (or climbs with `..`) is looked at further.

use std::ffi::CString;

use crate::mounts::{self, Mount};

/// The most symlinks followed in one path, as the kernel's limit.
const MAX_LINKS: usize = 40;

/// Could a path relative to a *local* directory lead into a mount? Only
/// if it names a mount point's last component: lexically every way into a
/// mount passes the mount point's own name (`../remote/x` from `/tmp`), a
/// `..` alone only climbs further from one. So `../lib/x` from a local
/// directory costs no look at the working directory.
pub fn may_enter(mounts: &[Mount], rel: &[u8]) -> bool {
    rel.split(|c| *c == b'/')
        .any(|c| mounts.iter().any(|m| m.prefix.rsplit('/').next().is_some_and(|last| last.as_bytes() == c)))
}

/// Does the path have a `..` component?
pub fn has_dotdot(path: &[u8]) -> bool {
    path.split(|c| *c == b'/').any(|c| c == b"..")
}

/// The absolute path `abs` means, `.` and `..` taken away: lexically
/// inside a mount (the server resolves what is below a mount point), and
/// in the local part with the kernel's rule that `..` after a symlink is
/// the parent of the link's *target*. Only when the path has a `..` and
/// could reach a mount are local links looked at (one `readlink` per `..`
/// whose directory is local); otherwise it is `mounts::normalize`.
pub fn normalize(mounts: &[Mount], abs: &[u8]) -> Vec<u8> {
    if !has_dotdot(abs) || !may_enter(mounts, abs) {
        return mounts::normalize(abs);
    }
    walk(mounts, abs, 0).unwrap_or_else(|| mounts::normalize(abs))
}

fn walk(mounts: &[Mount], abs: &[u8], depth: usize) -> Option<Vec<u8>> {
    if depth > MAX_LINKS {
        return None;
    }
    let mut cur: Vec<u8> = Vec::with_capacity(abs.len());
    for c in abs.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                if !cur.is_empty() && mounts::resolve(mounts, &cur).is_none() {
                    if let Some(target) = local_link(&cur) {
                        let parent = &cur[..cur.iter().rposition(|b| *b == b'/').unwrap_or(0)];
                        let next = if target.starts_with(b"/") { target } else { mounts::join(parent, &target) };
                        cur = walk(mounts, &next, depth + 1)?;
                    }
                }
                let cut = cur.iter().rposition(|b| *b == b'/').unwrap_or(0);
                cur.truncate(cut);
            }
            c => {
                cur.push(b'/');
                cur.extend_from_slice(c);
            }
        }
    }
    if cur.is_empty() {
        cur.push(b'/');
    }
    Some(cur)
}

/// The target of `path` if it is a local symlink.
fn local_link(path: &[u8]) -> Option<Vec<u8>> {
    let c = CString::new(path).ok()?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: c is a C string; buf is writable for its length. libc's own
    // readlink: the path is local, our hook must not see it.
    let n = unsafe { crate::real::readlink(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 || n as usize >= buf.len() {
        return None;
    }
    buf.truncate(n as usize);
    Some(buf)
}

/// The kernel's working directory (the program's, when it is local).
pub fn real_cwd() -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: buf is writable for its length; libc's own getcwd (ours
    // would answer the remote working directory).
    let p = unsafe { crate::real::getcwd(buf.as_mut_ptr().cast(), buf.len()) };
    if p.is_null() {
        return None;
    }
    let n = buf.iter().position(|b| *b == 0)?;
    buf.truncate(n);
    buf.starts_with(b"/").then_some(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_that_can_reach_a_mount_are_walked() {
        let t = mounts::parse_table("/tmp/x/rmt=ferry://h:1/").unwrap();
        assert!(may_enter(&t, b"rmt"));
        assert!(may_enter(&t, b"x/rmt/q"));
        assert!(may_enter(&t, b"../x/rmt"));
        assert!(!may_enter(&t, b"../y"), "climbing alone never enters a mount");
        assert!(!may_enter(&t, b"rmtx/q"));
        assert!(!may_enter(&t, b"a/b"));
        assert_eq!(normalize(&t, b"/tmp/x/rmt/../y"), b"/tmp/x/y");
        assert_eq!(normalize(&t, b"/a/../b"), b"/b");
    }

    #[test]
    fn dotdot_after_a_local_symlink_climbs_from_its_target() {
        let base = std::env::temp_dir().join(format!("ferry-ns-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("real/deep")).unwrap();
        std::os::unix::fs::symlink(base.join("real/deep"), base.join("link")).unwrap();
        let b = base.to_str().unwrap();
        let t = mounts::parse_table(&format!("{b}/real/rmt=ferry://h:1/")).unwrap();
        // The kernel: link -> real/deep, `..` -> real, then rmt: the mount.
        let p = format!("{b}/link/../rmt/f");
        assert_eq!(normalize(&t, p.as_bytes()), format!("{b}/real/rmt/f").as_bytes());
        // Lexically it would have been `{b}/rmt/f`, outside the mount.
        assert_eq!(mounts::normalize(p.as_bytes()), format!("{b}/rmt/f").as_bytes());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
