//! The mount on the server's own host: a file's node backed by the
//! server's own descriptor of it (FUSE passthrough), so the program's reads
//! and writes are the local kernel's on the very file the server serves —
//! no request, no copy through the daemon or a socket.
//!
//! When an open takes it (the rules, in ARCHITECTURE.md's crates/fuse
//! section): the client is on the server's host and the server lends the
//! open handle's descriptor (`FileFd`: to root or the server's own user
//! only, opened as the handle was, so the kernel's open of the backing
//! with the caller's flags does nothing the server did not just allow);
//! the file is not in the disk cache, and the kernel let the
//! daemon register backings (root: `CAP_SYS_ADMIN`). A backing *starts*
//! only at an open of a node with no other open the kernel would refuse
//! beside it or that writes behind the server (`passthrough::IoModes`), of
//! a file with no execute bit, not opened to run it, and for a reader only
//! past the first 64 KiB the open brings along anyway. Any open of a backed
//! node joins its backing — the kernel allows no other — a writer only with
//! a descriptor lent for writing, which marks the file written past the
//! server (its leases broken, none granted until the handle closes).

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ferry_client::File;
use fuser::BackingId;

use crate::passthrough::IoModes;

/// The kernel's `__FMODE_EXEC` in a FUSE open's flags: the open of a
/// program being run.
const FMODE_EXEC: i32 = 0x20;
/// A read-only open of a file no larger than this got all of it with its
/// open (`OpenRead`): reading it through the daemon costs no request, and a
/// backing would cost one (`FileFd`).
const OPEN_BRINGS: u64 = 64 * 1024;

#[derive(Default)]
pub struct SameHost {
    /// The client is on the server's host and the kernel took passthrough.
    on: bool,
    /// The kernel refused to register a backing once (not root, a stacked
    /// export): said once, not tried again.
    refused: AtomicBool,
}

impl SameHost {
    pub fn new(on: bool) -> SameHost {
        SameHost { on, refused: AtomicBool::new(false) }
    }

    pub fn is_on(&self) -> bool {
        self.on && !self.refused.load(Ordering::Relaxed)
    }

    /// The backing for an open of node `ino` through `file` with the
    /// kernel's open `flags` (`writes`: it may write or truncate); `None`:
    /// it opens the usual way.
    pub fn backing(
        &self,
        modes: &IoModes,
        file: &File,
        ino: u64,
        flags: i32,
        writes: bool,
        register: impl FnOnce(BorrowedFd<'_>) -> io::Result<BackingId>,
    ) -> Option<Arc<BackingId>> {
        if !self.is_on() {
            return None;
        }
        let attr = file.attr();
        // A small file read: the open brought it; a backed node is joined
        // by `IoModes::open` without asking for a descriptor.
        if !writes && attr.size <= OPEN_BRINGS {
            return None;
        }
        let runs = flags & FMODE_EXEC != 0 || attr.mode & 0o111 != 0;
        let fd = file.server_fd()?;
        let mut refused = None;
        let id =
            modes.same_host(ino, fd, writes, !runs, |fd| register(fd).inspect_err(|e| refused = Some(e.to_string())));
        if let Some(e) = refused {
            if !self.refused.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "ferry mount: the kernel refused a passthrough backing ({e}): \
                     files on the server's host are read and written through the daemon"
                );
            }
        }
        id
    }
}
