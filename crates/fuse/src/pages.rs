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
//! An open of a clean node whose file the mount holds a lease on (by the
//! server's `(dev, ino)`: granted by an open's reply, gone with a break
//! naming it — counted at the break's arrival, before the kernel is told)
//! needs nothing from the server at all: its reads are the kernel's. The
//! mount opens the file on the server only when a read reaches it after
//! all (a page the kernel let go), or a lock or `fstat` asks for it.
//!
//! The sets are bounded: past `MAX` entries each starts again (an entry
//! missing only costs an open its pages, or a round trip).

use std::collections::{HashMap, HashSet};

use crate::nodes::Key;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long after the mount's last write to a file (and the close of its
/// writer) its pages are not kept: the server takes the kernel's notices
/// of changes to a file it lent a descriptor of for writing for the
/// borrower's own for 2 s after that descriptor's close (`LATE_NOTICE`),
/// so a change on its disk then is not broken to this mount.
const AFTER_WRITE: Duration = Duration::from_secs(3);

const MAX: usize = 1 << 16;

#[derive(Default)]
pub struct Pages {
    /// Breaks received (counted by the connection's reader, before the
    /// kernel is told).
    breaks: AtomicU64,
    clean: Mutex<HashSet<u64>>,
    /// Each with the caller (uid, gid) whose open was answered: the
    /// server checked that caller's rights, nobody else's.
    leased: Mutex<HashMap<Key, (u32, u32)>>,
    /// Nodes written through the mount, and when.
    written: Mutex<HashMap<u64, Instant>>,
}

impl Pages {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        self.clean.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A break of `objects` arrived (`None`: of everything). Counted
    /// first: an open that marked a lease before this forgets it
    /// (`lease`), one that marks it after sees the count move.
    pub fn broke<'a>(&self, objects: Option<impl Iterator<Item = Key> + 'a>) {
        self.breaks.fetch_add(1, Ordering::SeqCst);
        let mut l = self.leased.lock().unwrap_or_else(|e| e.into_inner());
        match objects {
            None => l.clear(),
            Some(keys) => {
                for k in keys {
                    l.remove(&k);
                }
            }
        }
    }

    /// An open's reply granted a lease on `key`, if no break arrived since
    /// `breaks` (taken before its request): says whether it holds.
    pub fn lease(&self, key: Key, caller: (u32, u32), breaks: u64) -> bool {
        let mut l = self.leased.lock().unwrap_or_else(|e| e.into_inner());
        if l.len() >= MAX {
            l.clear();
        }
        l.insert(key, caller);
        drop(l);
        if self.breaks() != breaks {
            self.leased.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
            return false;
        }
        true
    }

    /// Whether the mount holds a lease on `key` that nothing broke, from
    /// an open by `caller`.
    pub fn leased(&self, key: Key, caller: (u32, u32)) -> bool {
        self.leased.lock().unwrap_or_else(|e| e.into_inner()).get(&key) == Some(&caller)
    }

    /// Whether node `ino`'s pages may all be kept.
    pub fn is_clean(&self, ino: u64) -> bool {
        self.lock().contains(&ino) && !self.written_lately(ino)
    }

    /// Breaks so far: taken before an open's request, compared once its
    /// handle can be found by the next break.
    pub fn breaks(&self) -> u64 {
        self.breaks.load(Ordering::SeqCst)
    }

    /// The mount writes node `ino` (or closed a writer of it): unclean,
    /// and none of its pages kept for `AFTER_WRITE`.
    pub fn written(&self, ino: u64) {
        self.taint(ino);
        let mut w = self.written.lock().unwrap_or_else(|e| e.into_inner());
        if w.len() >= MAX {
            w.retain(|_, at| at.elapsed() < AFTER_WRITE);
        }
        w.insert(ino, Instant::now());
    }

    fn written_lately(&self, ino: u64) -> bool {
        let w = self.written.lock().unwrap_or_else(|e| e.into_inner());
        !w.is_empty() && w.get(&ino).is_some_and(|at| at.elapsed() < AFTER_WRITE)
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
        if self.written_lately(ino) {
            self.taint(ino);
            return false;
        }
        let mut c = self.lock();
        if c.contains(&ino) {
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
        assert!(p.lease((1, 2), (0, 0), b) && p.leased((1, 2), (0, 0)));
        p.broke(Some([(1, 2)].into_iter()));
        assert_ne!(p.breaks(), b);
        assert!(!p.leased((1, 2), (0, 0)), "broken");
        assert!(!p.lease((1, 2), (0, 0), b) && !p.leased((1, 2), (0, 0)), "a break came since the request");
        let b = p.breaks();
        assert!(p.lease((1, 3), (5, 5), b) && !p.leased((1, 3), (6, 5)), "another caller");
        p.broke(None::<std::iter::Empty<Key>>);
        assert!(!p.leased((1, 3), (5, 5)), "everything broke");
    }
}
