//! `ferry run` on the server's host: a program's read-only open of a
//! regular file gets the server's own descriptor of it (`FileFd`), as a
//! cached file gets its local copy's — its reads, `mmap`, `sendfile` and
//! `splice` are then the local kernel's on the very file the server
//! serves, with no hook, request or socket copy in the path.
//!
//! The descriptor comes over a second connection, to the server's Unix
//! socket (`state::local_client`, checked to be the same server process),
//! since descriptors pass only there and `ferry run`'s own connection keeps
//! TCP. The file is opened there again read-only and taken only if it is
//! the one the program's open found (same `(dev, ino)`); the server lends
//! only to its own user or root, and a read-only descriptor reads no more
//! than the program's own open was just allowed to. Small files (their
//! first 64 KiB came with the open) and every other open keep the
//! placeholder; so does everything when `FERRY_SAME_HOST=0`.

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
/// program's `flags`, if it may be handed to the program instead.
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
