//! Open handles, in fair shares of the descriptors the server may hold.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::backend::{Errno, Result};
use crate::peer::Peer;

/// Open handles, in fair shares of what the process may hold: below the
/// file descriptor limit across all sessions, so one client opening files
/// without end never leaves the server without descriptors; and shared so
/// that one client at its cap does not make another's open fail.
///
/// The server's budget has a peer's share under it (`for_peer`) for each
/// address (or local user) that has sessions: a peer holds at most half
/// the budget, however many connections and sessions it opens (`EMFILE`
/// past that). The last eighth of the budget is a reserve that only a
/// session holding few handles, of a peer holding few, may take from: once
/// the rest is gone (`ENFILE` for the others), new and small clients still
/// open files.
#[derive(Debug)]
pub struct HandleBudget {
    open: AtomicUsize,
    max: usize,
    /// `None`: this is the server's budget; else a peer's share of it.
    parent: Option<Arc<HandleBudget>>,
    /// The server's only: the reserve, its peers' shares, and the opens
    /// refused.
    reserve: usize,
    peers: Mutex<HashMap<Peer, std::sync::Weak<HandleBudget>>>,
    refused: AtomicU64,
}

/// A session holding fewer handles than this is small: it may take from
/// the reserve (if its peer is small too).
const SMALL_SESSION: usize = 64;

/// Takes one of `limit` from `open`, never counting past it (so a refused
/// take does not make a concurrent one fail).
fn grab(open: &AtomicUsize, limit: usize) -> bool {
    open.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < limit).then_some(n + 1)).is_ok()
}

impl HandleBudget {
    /// The server's budget of `max` handles.
    pub fn new(max: usize) -> Self {
        HandleBudget {
            open: AtomicUsize::new(0),
            max,
            parent: None,
            reserve: (max / 8).max(256).min(max / 4),
            peers: Mutex::default(),
            refused: AtomicU64::new(0),
        }
    }

    /// The share of `peer`, made on its first session and gone with its
    /// last.
    pub fn for_peer(self: &Arc<Self>, peer: Peer) -> Arc<HandleBudget> {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(share) = peers.get(&peer).and_then(std::sync::Weak::upgrade) {
            return share;
        }
        // Forget peers that left, now and then (each insert past a
        // doubling), so the map stays the size of the peers present.
        if peers.len() >= 64 && peers.len().is_power_of_two() {
            peers.retain(|_, w| w.strong_count() > 0);
        }
        let share = Arc::new(HandleBudget {
            open: AtomicUsize::new(0),
            max: self.max / 2,
            parent: Some(Arc::clone(self)),
            reserve: 0,
            peers: Mutex::default(),
            refused: AtomicU64::new(0),
        });
        peers.insert(peer, Arc::downgrade(&share));
        share
    }

    /// Handles open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Most handles open at once.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Opens refused for the budget (a peer's share, or the server's).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// One more handle, for a session that holds `held`.
    pub(crate) fn take(&self, held: usize) -> Result<()> {
        let Some(server) = &self.parent else { return self.take_server(held, 0) };
        if !grab(&self.open, self.max) {
            server.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Errno(libc::EMFILE));
        }
        let r = server.take_server(held, self.open() - 1);
        if r.is_err() {
            self.open.fetch_sub(1, Ordering::Relaxed);
        }
        r
    }

    /// The server's side of `take`, for a peer that holds `peer_held`.
    fn take_server(&self, held: usize, peer_held: usize) -> Result<()> {
        let small = held < SMALL_SESSION && peer_held < self.reserve / 4;
        let limit = if small { self.max } else { self.max - self.reserve };
        if !grab(&self.open, limit) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Errno(libc::ENFILE));
        }
        Ok(())
    }

    pub(crate) fn give(&self, n: usize) {
        self.open.fetch_sub(n, Ordering::Relaxed);
        if let Some(server) = &self.parent {
            server.give(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(n: u8) -> Peer {
        Peer::Ip(std::net::Ipv4Addr::new(127, 0, 0, n).into())
    }

    /// Takes for sessions of `held` until refused; how many went.
    fn fill(b: &HandleBudget, held: usize) -> usize {
        (0..).take_while(|_| b.take(held).is_ok()).count()
    }

    #[test]
    fn one_peer_takes_at_most_half_and_others_still_open() {
        let server = Arc::new(HandleBudget::new(4000));
        let hog = server.for_peer(peer(2));
        assert_eq!(fill(&hog, 1000), 2000);
        assert_eq!(hog.take(1000), Err(Errno(libc::EMFILE)));
        // A second hog gets the rest but the reserve.
        let hog2 = server.for_peer(peer(3));
        assert_eq!(fill(&hog2, 1000), 4000 - 500 - 2000);
        assert_eq!(hog2.take(0), Err(Errno(libc::ENFILE)), "a big peer has no part in the reserve");
        // Small sessions of a new peer still open, from the reserve.
        let small = server.for_peer(peer(4));
        for _ in 0..10 {
            small.take(3).unwrap();
        }
        assert_eq!(small.take(SMALL_SESSION), Err(Errno(libc::ENFILE)));
        assert_eq!(server.refused(), 5);
        small.give(10);
        hog.give(2000);
        hog2.give(1500);
        assert_eq!(server.open(), 0);
    }

    #[test]
    fn a_peer_share_lives_while_its_sessions_do() {
        let server = Arc::new(HandleBudget::new(1000));
        let a = server.for_peer(peer(2));
        assert!(Arc::ptr_eq(&a, &server.for_peer(peer(2))));
        a.take(0).unwrap();
        drop(a);
        let again = server.for_peer(peer(2));
        assert_eq!(again.open(), 0, "a new share after the last holder left");
        assert_eq!(server.open(), 1);
        server.give(1);
    }
}
