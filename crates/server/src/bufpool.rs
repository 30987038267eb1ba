//! Memory for large request frames, shared by all connections and bounded.
//!
//! A connection keeps a small input buffer of its own; a frame larger than
//! that (a big `Pwrite`) borrows a buffer from this pool for as long as its
//! request runs. The pool caps the bytes lent out at once: when 200 clients
//! each send a 64 MiB write, they take turns instead of pinning 12 GiB, and
//! nothing stays allocated for a connection after its big request is done.
//!
//! One peer (`peer.rs`) holds at most half the pool: a client that
//! announces big frames and sends their bodies a byte at a time holds its
//! loans for as long as it likes, and must not make everyone else's big
//! writes wait without end.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::peer::Peer;

pub struct BufPool {
    max_bytes: usize,
    st: Mutex<State>,
    cv: Condvar,
}

struct State {
    /// Bytes of buffers lent out now.
    lent: usize,
    /// Returned buffers kept for reuse (their capacity counts against
    /// `max_bytes` together with `lent`).
    free: Vec<Vec<u8>>,
    /// Bytes lent out now, by peer.
    by_peer: HashMap<Peer, usize>,
}

impl State {
    fn free_bytes(&self) -> usize {
        self.free.iter().map(Vec::capacity).sum()
    }
}

impl BufPool {
    pub fn new(max_bytes: usize) -> BufPool {
        BufPool {
            max_bytes,
            st: Mutex::new(State { lent: 0, free: Vec::new(), by_peer: HashMap::new() }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A buffer of exactly `len` bytes for a frame of `peer`, waiting while
    /// others hold too much, or while `peer` holds half the pool. A request
    /// larger than that still runs, alone, so no frame within the
    /// protocol's limit can wait for ever.
    pub fn take(self: &Arc<Self>, peer: Peer, len: usize) -> Lent {
        let mut st = self.lock();
        loop {
            let mine = st.by_peer.get(&peer).copied().unwrap_or(0);
            let full = st.lent > 0 && st.lent + len > self.max_bytes;
            let over_share = mine > 0 && mine + len > self.max_bytes / 2;
            if !full && !over_share {
                break;
            }
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        // Reuse a kept buffer only if it is not much bigger than needed, so
        // what is lent stays close to what is counted.
        let reuse = st.free.iter().position(|b| b.capacity() >= len && b.capacity() <= len.saturating_mul(2));
        let mut buf = match reuse {
            Some(i) => st.free.swap_remove(i),
            None => Vec::new(),
        };
        let cost = buf.capacity().max(len);
        st.lent += cost;
        *st.by_peer.entry(peer).or_default() += cost;
        // Keep lent + kept within the cap: drop kept buffers first.
        while st.lent + st.free_bytes() > self.max_bytes && !st.free.is_empty() {
            st.free.pop();
        }
        drop(st);
        // Zero-filling only what grows: the bytes are overwritten by the
        // frame before anyone reads them.
        buf.resize(len, 0);
        Lent { pool: Arc::clone(self), buf: Some(buf), cost, peer }
    }

    fn give_back(&self, buf: Vec<u8>, cost: usize, peer: Peer) {
        let mut st = self.lock();
        st.lent -= cost;
        if let Some(n) = st.by_peer.get_mut(&peer) {
            *n -= cost;
            if *n == 0 {
                st.by_peer.remove(&peer);
            }
        }
        if st.lent + st.free_bytes() + buf.capacity() <= self.max_bytes {
            st.free.push(buf);
        }
        drop(st);
        self.cv.notify_all();
    }

    #[cfg(test)]
    fn lent(&self) -> usize {
        self.lock().lent
    }
}

/// A buffer on loan; returned to the pool when dropped.
pub struct Lent {
    pool: Arc<BufPool>,
    buf: Option<Vec<u8>>,
    /// What the loan counts against the pool.
    cost: usize,
    peer: Peer,
}

impl Lent {
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.buf.as_deref_mut().unwrap_or_default()
    }

    pub fn as_slice(&self) -> &[u8] {
        self.buf.as_deref().unwrap_or_default()
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.give_back(b, self.cost, self.peer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const P: Peer = Peer::Local(Some(1));

    #[test]
    fn lends_and_takes_back() {
        let p = Arc::new(BufPool::new(100));
        let a = p.take(P, 60);
        assert_eq!(a.as_slice().len(), 60);
        assert_eq!(p.lent(), 60);
        drop(a);
        assert_eq!(p.lent(), 0);
        let b = p.take(P, 50);
        assert_eq!(b.as_slice().len(), 50);
    }

    #[test]
    fn a_request_larger_than_the_pool_runs_alone() {
        let p = Arc::new(BufPool::new(10));
        let a = p.take(P, 1000);
        assert_eq!(a.as_slice().len(), 1000);
    }

    #[test]
    fn waits_while_the_pool_is_spent() {
        let p = Arc::new(BufPool::new(100));
        let a = p.take(P, 80);
        let p2 = Arc::clone(&p);
        let t = std::thread::spawn(move || {
            let b = p2.take(P, 50);
            b.as_slice().len()
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!t.is_finished(), "the second loan must wait: 80 + 50 > 100");
        drop(a);
        assert_eq!(t.join().unwrap(), 50);
        assert_eq!(p.lent(), 0);
    }

    #[test]
    fn one_peer_holds_at_most_half_and_leaves_the_rest_to_others() {
        let p = Arc::new(BufPool::new(100));
        let a = p.take(P, 60);
        let other = Peer::Local(Some(2));
        let b = p.take(other, 30);
        let p2 = Arc::clone(&p);
        let t = std::thread::spawn(move || p2.take(P, 10).as_slice().len());
        std::thread::sleep(Duration::from_millis(100));
        assert!(!t.is_finished(), "a peer past half the pool waits");
        drop(a);
        assert_eq!(t.join().unwrap(), 10);
        drop(b);
    }

    #[test]
    fn kept_buffers_stay_within_the_cap() {
        let p = Arc::new(BufPool::new(100));
        drop(p.take(P, 90));
        let a = p.take(P, 30);
        let st = p.lock();
        assert!(st.lent + st.free_bytes() <= 100, "lent {} + kept {}", st.lent, st.free_bytes());
        drop(st);
        drop(a);
    }
}
