//! `ferry run` on the server's host: a program's open of a regular file
//! gets the server's own descriptor of it (`FileFd`), as a cached file
//! gets its local copy's — its reads, writes, `mmap`, `sendfile` and
//! `splice` are then the local kernel's on the very file the server
//! serves, with no hook, request or socket copy in the path.
//!
//! The descriptor comes over a second connection, to the server's Unix
//! socket (`state::local_client`, checked to be the same server process),
//! since descriptors pass only there and `ferry run`'s own connection keeps
//! TCP. The file is opened there again read-only and taken only if it is
//! the one the program's open found (same `(dev, ino)`), with the
//! program's own access mode; the server lends only to its own user or
//! root, so a descriptor does no more than the program's own open was just
//! allowed to. A writer's descriptor is lent for writing: the server
//! breaks the file's leases and grants none until the handle it was lent
//! from closes, which `lent.rs` keeps open for as long as any process may
//! write through it. Small files opened read-only (their first 64 KiB
//! came with the open) and every other open keep the placeholder; so does
//! everything when `FERRY_SAME_HOST=0`.

use std::os::fd::OwnedFd;

use ferry_client::{File, OpenOptions};

use crate::mounts::Remote;
use crate::state;

/// Files no larger than this came whole with their open: read through the
/// placeholder they cost no request, a descriptor would cost three.
const OPEN_BRINGS: u64 = 64 * 1024;

fn wanted() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("FERRY_SAME_HOST").as_deref() != Ok("0"))
}

/// The server's descriptor of `file`, just opened at `r` with the
/// program's `flags`, if it may be handed to the program instead; for a
/// writer, with the handle it was lent from (`lent.rs` keeps it open).
pub fn descriptor(r: &Remote, file: &File, flags: i32) -> Option<(OwnedFd, Option<crate::lent::Lent>)> {
    let a = file.attr();
    let acc = flags & libc::O_ACCMODE;
    let writer = acc == libc::O_WRONLY || acc == libc::O_RDWR;
    let read_only = acc == libc::O_RDONLY && flags & (libc::O_CREAT | libc::O_TRUNC) == 0;
    if !wanted() || flags & (libc::O_DIRECTORY | libc::O_PATH) != 0 || a.mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    if !(writer || read_only && a.size > OPEN_BRINGS) {
        return None;
    }
    let c = state::local_client(r.mount)?;
    let path = crate::mounts::as_path(&r.path);
    // The program's open, again: its access mode, `O_APPEND`, `O_DIRECT`,
    // `O_SYNC`, `O_NOFOLLOW` (what it created or truncated is done).
    let drop = libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_CLOEXEC | libc::O_NOCTTY;
    let mut opts = OpenOptions::new();
    if writer {
        opts.custom_flags((flags & !drop) as u32);
    } else {
        opts.read(true).nofollow(flags & libc::O_NOFOLLOW != 0);
    }
    let side = match c.open(path, &opts) {
        Ok(f) => f,
        Err(ferry_client::Error::Remote { .. }) => return None,
        Err(_) => {
            state::local_lost(r.mount);
            return None;
        }
    };
    // The file the program's open found, or none: a file renamed over the
    // name in between is not lent (its open was not the program's).
    let same = side.attr().dev == a.dev && side.attr().ino == a.ino;
    let lent = if same { side.lend_fd() } else { Ok(None) };
    match lent {
        Ok(Some((fd, false))) if !writer => {
            let _ = side.close();
            Some((fd, None))
        }
        Ok(Some((fd, true))) if writer => {
            let held = crate::lent::Lent::new(side, c, std::os::fd::AsFd::as_fd(&fd), r, flags)?;
            Some((fd, Some(held)))
        }
        Ok(_) => {
            let _ = side.close();
            None
        }
        // Refused (another user than the server's): refused for every file.
        Err(_) => {
            let _ = side.close();
            state::local_lost(r.mount);
            None
        }
    }
}
