//! Writes the server acknowledged but has not yet made stable. The server's
//! acknowledgement of a write means its kernel has the data, not its disk:
//! a server *machine* that crashes and comes back has lost it, and a later
//! `fsync` on the new instance would succeed over the hole. So, as NFS
//! clients do with unstable writes, the client keeps a copy of each write
//! until a commit (`fsync`) acknowledged by the *same* server instance (its
//! boot id, sent in the welcome, is the write verifier), and sends the
//! copies again, oldest first, to an instance that replaced it, before
//! anything newer reaches that file.
//!
//! Memory is bounded: past half the per-file bound a commit is sent behind
//! the writes (it runs while more are written), and past the bound, or
//! while the client as a whole keeps more than its bound, a writer waits
//! for its file's commit before going on.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use crate::engine::Engine;

/// What one file keeps at most before its writer waits for a commit.
pub(crate) const FILE_MAX: usize = 64 << 20;
/// What a client keeps at most over all its files; beyond it every writer
/// commits its own file's copies before going on.
pub(crate) const CLIENT_MAX: usize = 256 << 20;

/// A commit sent behind the writes: its request, its connection, and how
/// many of the oldest copies it covers.
pub(crate) struct Commit {
    pub id: u64,
    pub engine: Arc<Engine>,
    pub covers: usize,
}

pub(crate) struct Unstable {
    kept: VecDeque<(u64, Vec<u8>)>,
    bytes: usize,
    /// The server instance that acknowledged the copies kept.
    boot: u64,
    pub commit: Option<Commit>,
    /// The client-wide count this file adds to.
    total: Arc<AtomicUsize>,
}

impl Unstable {
    pub(crate) fn new(total: Arc<AtomicUsize>) -> Unstable {
        Unstable { kept: VecDeque::new(), bytes: 0, boot: 0, commit: None, total }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(crate) fn boot(&self) -> u64 {
        self.boot
    }

    pub(crate) fn len(&self) -> usize {
        self.kept.len()
    }

    /// Keeps a write acknowledged by instance `boot`. The caller has sent
    /// the older copies to that instance already if it is a new one.
    pub(crate) fn keep(&mut self, boot: u64, offset: u64, data: Vec<u8>) {
        self.boot = boot;
        self.bytes += data.len();
        self.total.fetch_add(data.len(), Relaxed);
        self.kept.push_back((offset, data));
    }

    /// Whether a commit should be sent behind the writes now.
    pub(crate) fn wants_commit(&self) -> bool {
        self.commit.is_none() && (self.bytes >= FILE_MAX / 2 || self.over_client())
    }

    /// Whether the writer must wait for a commit before writing more.
    pub(crate) fn must_wait(&self) -> bool {
        self.bytes > FILE_MAX || (self.bytes > 0 && self.over_client())
    }

    fn over_client(&self) -> bool {
        self.total.load(Relaxed) > CLIENT_MAX
    }

    /// The copies, oldest first, for sending again to a new instance.
    pub(crate) fn copies(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.kept.iter().map(|(o, d)| (*o, d.as_slice()))
    }

    /// A new instance has every copy now.
    pub(crate) fn rebased(&mut self, boot: u64) {
        self.boot = boot;
    }

    /// Drops the `n` oldest copies: a commit of instance `boot` covered
    /// them. Nothing is dropped if another instance answered (the copies
    /// were sent again to it, so a later commit will cover them there).
    /// Returns the buffers for reuse.
    pub(crate) fn committed(&mut self, boot: u64, n: usize) -> Vec<Vec<u8>> {
        if boot != self.boot {
            return Vec::new();
        }
        let n = n.min(self.kept.len());
        let gone: Vec<Vec<u8>> = self.kept.drain(..n).map(|(_, d)| d).collect();
        let freed: usize = gone.iter().map(Vec::len).sum();
        self.bytes -= freed;
        self.total.fetch_sub(freed, Relaxed);
        gone
    }

    /// Forgets every copy (the file is closed or no longer written).
    pub(crate) fn clear(&mut self) {
        self.total.fetch_sub(self.bytes, Relaxed);
        self.bytes = 0;
        self.kept.clear();
        if let Some(c) = self.commit.take() {
            c.engine.forget(c.id);
        }
    }
}

impl Drop for Unstable {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_dropped_only_by_a_commit_of_the_instance_that_has_them() {
        let total = Arc::new(AtomicUsize::new(0));
        let mut u = Unstable::new(Arc::clone(&total));
        u.keep(7, 0, vec![1; 10]);
        u.keep(7, 10, vec![2; 5]);
        assert_eq!((u.bytes(), total.load(Relaxed)), (15, 15));
        // Another instance's commit says nothing about these.
        assert!(u.committed(8, 2).is_empty());
        assert_eq!(u.len(), 2);
        assert_eq!(u.committed(7, 1).len(), 1);
        assert_eq!((u.bytes(), total.load(Relaxed)), (5, 5));
        assert_eq!(u.copies().map(|(o, d)| (o, d.len())).collect::<Vec<_>>(), vec![(10, 5)]);
        drop(u);
        assert_eq!(total.load(Relaxed), 0);
    }

    #[test]
    fn bounds() {
        let total = Arc::new(AtomicUsize::new(0));
        let mut u = Unstable::new(Arc::clone(&total));
        u.keep(1, 0, vec![0; FILE_MAX / 2 - 1]);
        assert!(!u.wants_commit() && !u.must_wait());
        u.keep(1, 0, vec![0; 1]);
        assert!(u.wants_commit() && !u.must_wait());
        u.keep(1, 0, vec![0; FILE_MAX / 2 + 1]);
        assert!(u.must_wait());
        // Other files' copies count against the client's bound.
        let mut small = Unstable::new(Arc::clone(&total));
        small.keep(1, 0, vec![0; 1]);
        assert!(!small.must_wait());
        total.fetch_add(CLIENT_MAX, Relaxed);
        assert!(small.must_wait() && small.wants_commit());
        total.fetch_sub(CLIENT_MAX, Relaxed);
    }
}
