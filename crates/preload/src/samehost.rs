//! `ferry run` on the server's host: a program's open of a regular file
//! gets the server's own descriptor of it (`FileFd`), as a cached file
//! gets its local copy's — its reads, writes, `mmap`, `sendfile` and
//! `splice` are then the local kernel's on the very file the server
//! serves, with no hook, request or socket copy in the path.
//!
//! The descriptor comes over a second connection, to the server's Unix
//! socket (`state::local_client`, checked to be the same server process),
//! since descriptors pass only there and `ferry run`'s own connection keeps
//! TCP. A reader's file is opened there again read-only and taken only if
//! it is the one the program's open found (same `(dev, ino)`); a writer's
//! open is made there in the first place, as the program (the connection
//! names the caller as the main one does). The server lends only to its
//! own user or root, so a descriptor does no more than the program's own
//! open was just allowed to. A writer's descriptor is lent for writing: the server
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
/// program's read-only `flags`, if it may be handed to the program.
pub fn descriptor(r: &Remote, file: &File, flags: i32) -> Option<OwnedFd> {
    let a = file.attr();
    let read_only = flags & libc::O_ACCMODE == libc::O_RDONLY
        && flags & (libc::O_CREAT | libc::O_TRUNC | libc::O_DIRECTORY | libc::O_PATH) == 0;
    if !wanted() || !read_only || a.mode & libc::S_IFMT != libc::S_IFREG || a.size <= OPEN_BRINGS {
        return None;
    }
    let c = state::local_client(r.mount)?;
    let path = crate::mounts::as_path(&r.path);
    let side = match c.open(path, OpenOptions::new().read(true).nofollow(flags & libc::O_NOFOLLOW != 0)) {
        Ok(f) => f,
        Err(ferry_client::Error::Remote { .. }) => return None,
        Err(_) => {
            state::local_lost(r.mount);
            return None;
        }
    };
    let same = side.attr().dev == a.dev && side.attr().ino == a.ino;
    let lent = if same { side.lend_fd() } else { Ok(None) };
    let _ = side.close();
    match lent {
        Ok(Some((fd, false))) => Some(fd),
        Ok(_) => None,
        // Refused (another user than the server's): refused for every file.
        Err(_) => {
            state::local_lost(r.mount);
            None
        }
    }
}

/// What became of a writer's open on the server's Unix socket.
pub enum Writer {
    /// The descriptor, lent for writing, and the handle it came from.
    Lent(OwnedFd, Box<crate::lent::Lent>),
    /// The open ran there (it created or truncated) but nothing was lent.
    Opened,
    /// Not tried.
    No,
}

/// A writer's open (`O_WRONLY`/`O_RDWR`, `flags` as the server takes them,
/// `mode` with the umask applied) made on the side connection: as the
/// program (the connection names the caller as the main one does), so it
/// is refused what the program's open would be refused, with its errno.
/// Only a regular file's descriptor is taken, lent for writing.
pub fn writer(r: &Remote, flags: i32, mode: u32) -> Result<Writer, i32> {
    let acc = flags & libc::O_ACCMODE;
    // An exclusive create keeps the main connection: if the server dies
    // before its reply, only a session that resumes (the main one, with
    // the server's reply cache) can tell "created" from "already there";
    // the side connection has none and could only say `EIO` (the kill
    // suite's `ferry run` test met it). Any other open lost there is
    // simply made again the usual way.
    if !wanted()
        || (acc != libc::O_WRONLY && acc != libc::O_RDWR)
        || flags & (libc::O_DIRECTORY | libc::O_PATH | libc::O_EXCL) != 0
    {
        return Ok(Writer::No);
    }
    let Some(c) = state::local_client(r.mount) else { return Ok(Writer::No) };
    let path = crate::mounts::as_path(&r.path);
    let side = match c.open(path, OpenOptions::new().custom_flags(flags as u32).mode(mode)) {
        Ok(f) => f,
        Err(ferry_client::Error::Remote { errno, .. }) => return Err(errno),
        Err(_) => {
            state::local_lost(r.mount);
            return Ok(Writer::No);
        }
    };
    if side.attr().mode & libc::S_IFMT != libc::S_IFREG {
        let _ = side.close();
        return Ok(Writer::Opened);
    }
    match side.lend_fd() {
        Ok(Some((fd, true))) => match crate::lent::Lent::new(side, c, std::os::fd::AsFd::as_fd(&fd), r, flags) {
            Some(l) => Ok(Writer::Lent(fd, Box::new(l))),
            None => Ok(Writer::Opened),
        },
        Ok(_) => {
            let _ = side.close();
            Ok(Writer::Opened)
        }
        // Refused (another user than the server's): refused for every file.
        Err(_) => {
            let _ = side.close();
            state::local_lost(r.mount);
            Ok(Writer::Opened)
        }
    }
}
