//! `ferry cp -p` and `-a`: a copy keeps its source's mode, times and (as
//! root) owner, as cp(1) does; with `-a` symbolic links are copied as
//! links, not followed.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use ferry_client::{Target, Time};
use rustix::fs::{Timespec, Timestamps};

use crate::commands::{display, local_fail, remote_fail, Clients, Loc};

struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    atime: Time,
    mtime: Time,
}

/// What a copy of `l` keeps: a link is followed (with `-a` links are
/// copied as links before this is asked).
fn meta(c: &mut Clients, l: &Loc) -> Result<Meta, String> {
    match l {
        Loc::Local(p) => {
            let m = fs::metadata(p).map_err(|e| local_fail(p, e))?;
            let t = |sec, nsec: i64| Time { sec, nsec: nsec as u32 };
            Ok(Meta {
                mode: m.mode(),
                uid: m.uid(),
                gid: m.gid(),
                atime: t(m.atime(), m.atime_nsec()),
                mtime: t(m.mtime(), m.mtime_nsec()),
            })
        }
        Loc::Remote(u, p) => {
            let a = c.get(u)?.metadata(p).map_err(|e| remote_fail(l, e))?;
            Ok(Meta { mode: a.mode, uid: a.uid, gid: a.gid, atime: a.atime, mtime: a.mtime })
        }
    }
}

/// The target of `l` if it is a symbolic link.
pub fn link_target(c: &mut Clients, l: &Loc) -> Result<Option<PathBuf>, String> {
    match l {
        Loc::Local(p) => match fs::symlink_metadata(p) {
            Ok(m) if m.file_type().is_symlink() => fs::read_link(p).map(Some).map_err(|e| local_fail(p, e)),
            Ok(_) => Ok(None),
            Err(e) => Err(local_fail(p, e)),
        },
        Loc::Remote(u, p) => {
            let c = c.get(u)?;
            match c.symlink_metadata(p) {
                Ok(a) if a.is_symlink() => c.read_link(p).map(Some).map_err(|e| remote_fail(l, e)),
                Ok(_) => Ok(None),
                Err(e) => Err(remote_fail(l, e)),
            }
        }
    }
}

/// Makes `dst` a symbolic link to `target` (replacing a link there).
pub fn make_symlink(c: &mut Clients, dst: &Loc, target: &PathBuf) -> Result<(), String> {
    match dst {
        Loc::Local(p) => {
            if fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink()) {
                fs::remove_file(p).map_err(|e| local_fail(p, e))?;
            }
            std::os::unix::fs::symlink(target, p).map_err(|e| local_fail(p, e))
        }
        Loc::Remote(u, p) => {
            let client = c.get(u)?;
            if client.symlink_metadata(p).is_ok_and(|a| a.is_symlink()) {
                client.remove_file(p).map_err(|e| remote_fail(dst, e))?;
            }
            client.symlink(target, p).map(drop).map_err(|e| remote_fail(dst, e))
        }
    }
}

/// Gives `dst` the mode, times and, as root, the owner of `src` (the owner
/// first: a change of owner clears set-id bits).
pub fn copy_attrs(c: &mut Clients, src: &Loc, dst: &Loc) -> Result<(), String> {
    let m = meta(c, src)?;
    let root = rustix::process::geteuid().is_root();
    let mode = m.mode & 0o7777;
    let said = |e: String| format!("{e} (preserving attributes of {})", display(src));
    match dst {
        Loc::Local(p) => {
            if root {
                std::os::unix::fs::chown(p, Some(m.uid), Some(m.gid)).map_err(|e| said(local_fail(p, e)))?;
            }
            fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .map_err(|e| said(local_fail(p, e)))?;
            let ts = |t: Time| Timespec { tv_sec: t.sec, tv_nsec: t.nsec as _ };
            let times = Timestamps { last_access: ts(m.atime), last_modification: ts(m.mtime) };
            rustix::fs::utimensat(rustix::fs::CWD, p, &times, rustix::fs::AtFlags::empty())
                .map_err(|e| said(local_fail(p, e.into())))
        }
        Loc::Remote(u, p) => {
            let client = c.get(u)?;
            let path = p.as_os_str().as_encoded_bytes();
            if root {
                client.chown(Target::Path(path), m.uid, m.gid).map_err(|e| said(remote_fail(dst, e)))?;
            }
            client.set_permissions(Target::Path(path), mode).map_err(|e| said(remote_fail(dst, e)))?;
            client.set_times(Target::Path(path), m.atime, m.mtime).map(drop).map_err(|e| said(remote_fail(dst, e)))
        }
    }
}
