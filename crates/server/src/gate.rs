//! Connections that have not proved the token yet (the TLS handshake
//! included) wait in a small budget of their own, per peer and in total,
//! and do not count against `--max-connections` until they authenticate.
//!
//! When the budget is full a new connection still gets in: the oldest
//! waiting one is shut down for it — the oldest of the newcomer's own peer
//! when that peer is at its cap, so a flood from one address only ever
//! evicts itself. Only a connection that has waited its `grace` (a second)
//! is shut down so: many honest clients connecting at once (200 from one
//! host) all finish handshakes that take milliseconds, waiting beyond the
//! budget, up to four times it; past that the oldest goes whatever its age.
//! No number of stalled connections can then keep out a client that proves
//! the token promptly: it is evicted only after as many newer connections
//! as four budgets hold arrived during its handshake.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferry_sock::Socket;

use crate::peer::Peer;

pub struct Gate {
    total: usize,
    per_peer: usize,
    /// How long a waiting connection is left alone when the budget is
    /// full but within four times it.
    grace: Duration,
    /// Past this a waiting connection is shut down by the next arrival
    /// even with room to spare (its own deadline normally ends it first;
    /// this also bounds a TLS handshake fed a byte at a time).
    deadline: Duration,
    st: Mutex<State>,
    /// Authenticated connections open (what `--max-connections` counts).
    live: AtomicUsize,
    evicted: AtomicU64,
}

#[derive(Default)]
struct State {
    next: u64,
    /// By arrival: the first is the oldest.
    waiting: BTreeMap<u64, Waiting>,
    by_peer: HashMap<Peer, usize>,
}

struct Waiting {
    peer: Peer,
    since: Instant,
    /// A second descriptor of the connection's socket, to shut it down
    /// from here while its own thread is blocked reading.
    sock: Socket,
}

/// One connection's place: waiting until `authenticated`, then counted
/// live until dropped.
pub struct Ticket {
    gate: Arc<Gate>,
    id: u64,
    live: bool,
}

impl Gate {
    pub fn new(total: usize, per_peer: usize, grace: Duration, deadline: Duration) -> Arc<Gate> {
        Arc::new(Gate {
            total: total.max(1),
            per_peer: per_peer.clamp(1, total.max(1)),
            grace,
            deadline,
            st: Mutex::default(),
            live: AtomicUsize::new(0),
            evicted: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Authenticated connections open.
    pub fn live(&self) -> usize {
        self.live.load(Relaxed)
    }

    /// Connections waiting in their handshake.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Waiting connections shut down to make room (or for overstaying).
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Relaxed)
    }

    /// Lets `sock` in to wait for its handshake, making room if need be.
    pub fn admit(self: &Arc<Self>, sock: &Socket) -> std::io::Result<Ticket> {
        let peer = Peer::of(sock);
        let spare = sock.try_clone()?;
        let now = Instant::now();
        let mut st = self.lock();
        let stale: Vec<u64> =
            st.waiting.iter().take_while(|(_, w)| now - w.since >= self.deadline).map(|(id, _)| *id).collect();
        for id in stale {
            self.evict(&mut st, id);
        }
        let at_cap = st.by_peer.get(&peer).copied().unwrap_or(0) >= self.per_peer;
        let peers_oldest = |st: &State| st.waiting.iter().find(|(_, w)| w.peer == peer).map(|(id, w)| (*id, w.since));
        let oldest = |st: &State| st.waiting.iter().next().map(|(id, w)| (*id, w.since));
        if st.waiting.len() >= self.total.saturating_mul(4) {
            // Past four budgets the grace is over: one goes, whatever its age.
            let id = if at_cap { peers_oldest(&st) } else { oldest(&st) };
            if let Some((id, _)) = id {
                self.evict(&mut st, id);
            }
        } else {
            let aged = |c: Option<(u64, Instant)>| c.filter(|(_, since)| now - *since >= self.grace).map(|(id, _)| id);
            // One in, one out: the peer's own oldest first.
            let mine = if at_cap { aged(peers_oldest(&st)) } else { None };
            let any = || if st.waiting.len() >= self.total { aged(oldest(&st)) } else { None };
            if let Some(id) = mine.or_else(any) {
                self.evict(&mut st, id);
            }
        }
        let id = st.next;
        st.next += 1;
        st.waiting.insert(id, Waiting { peer, since: now, sock: spare });
        *st.by_peer.entry(peer).or_default() += 1;
        Ok(Ticket { gate: Arc::clone(self), id, live: false })
    }

    fn evict(&self, st: &mut State, id: u64) {
        if let Some(w) = Self::forget(st, id) {
            // Its thread, blocked in a read, sees the end and leaves.
            let _ = w.sock.shutdown_both();
            self.evicted.fetch_add(1, Relaxed);
            tracing::debug!(peer = ?w.peer, "handshake evicted to make room");
        }
    }

    fn forget(st: &mut State, id: u64) -> Option<Waiting> {
        let w = st.waiting.remove(&id)?;
        if let Some(n) = st.by_peer.get_mut(&w.peer) {
            *n -= 1;
            if *n == 0 {
                st.by_peer.remove(&w.peer);
            }
        }
        Some(w)
    }
}

impl Ticket {
    /// The peer proved the token: it leaves the waiting budget and counts
    /// as a connection. Called before the handshake's last reply is sent,
    /// so a client that has its answer is already counted.
    pub fn authenticated(&mut self) {
        if !self.live {
            Gate::forget(&mut self.gate.lock(), self.id);
            self.gate.live.fetch_add(1, Relaxed);
            self.live = true;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.live {
            self.gate.live.fetch_sub(1, Relaxed);
        } else {
            Gate::forget(&mut self.gate.lock(), self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    /// A connected socket from `from` (a loopback address) and the
    /// server's side of it.
    fn pair(l: &TcpListener, from: &str) -> (TcpStream, Socket) {
        let s = connect_from(l.local_addr().unwrap(), from);
        let (a, _) = l.accept().unwrap();
        (s, Socket::from(a))
    }

    fn connect_from(to: std::net::SocketAddr, from: &str) -> TcpStream {
        use rustix::net::{AddressFamily, SocketType};
        let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
        let from: std::net::SocketAddr = format!("{from}:0").parse().unwrap();
        rustix::net::bind(&fd, &from).unwrap();
        rustix::net::connect(&fd, &to).unwrap();
        TcpStream::from(fd)
    }

    /// Whether our side saw the server's shutdown (a read timing out
    /// means the connection is still open).
    fn closed(s: &mut TcpStream) -> bool {
        use std::io::{ErrorKind, Read};
        s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        match s.read(&mut [0u8; 1]) {
            Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
            Ok(n) => n == 0,
        }
    }

    #[test]
    fn a_flood_from_one_peer_evicts_only_itself() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let gate = Gate::new(4, 2, Duration::ZERO, Duration::from_secs(60));
        let (mut other, s) = pair(&l, "127.0.0.3");
        let _kept = gate.admit(&s).unwrap();
        let mut flood = Vec::new();
        for _ in 0..10 {
            let (c, s) = pair(&l, "127.0.0.2");
            flood.push((c, gate.admit(&s).unwrap(), s));
        }
        assert_eq!(gate.waiting(), 3);
        assert_eq!(gate.evicted(), 8);
        assert!(!closed(&mut other), "another peer's handshake was evicted");
        assert!(closed(&mut flood[0].0));
        assert!(!closed(&mut flood[9].0));
    }

    #[test]
    fn a_full_gate_evicts_its_oldest_and_authenticated_ones_leave_it() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let gate = Gate::new(3, 3, Duration::ZERO, Duration::from_secs(60));
        let mut held = Vec::new();
        for k in 0..3 {
            let (c, s) = pair(&l, &format!("127.0.0.{}", 10 + k));
            held.push((c, gate.admit(&s).unwrap(), s));
        }
        held[1].1.authenticated();
        assert_eq!((gate.waiting(), gate.live()), (2, 1));
        let (_c, s) = pair(&l, "127.0.0.20");
        let t = gate.admit(&s).unwrap();
        let (_c2, s2) = pair(&l, "127.0.0.21");
        let _t2 = gate.admit(&s2).unwrap();
        assert_eq!(gate.evicted(), 1);
        assert!(closed(&mut held[0].0), "the oldest waiting one goes first");
        assert!(!closed(&mut held[1].0), "an authenticated connection is never evicted");
        assert!(!closed(&mut held[2].0));
        drop(t);
        drop(held);
        assert_eq!((gate.waiting(), gate.live()), (1, 0));
    }

    #[test]
    fn young_handshakes_wait_beyond_the_budget_up_to_four_times_it() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let gate = Gate::new(2, 2, Duration::from_secs(60), Duration::from_secs(60));
        let mut held = Vec::new();
        for _ in 0..8 {
            let (c, s) = pair(&l, "127.0.0.30");
            held.push((c, gate.admit(&s).unwrap(), s));
        }
        assert_eq!((gate.waiting(), gate.evicted()), (8, 0), "honest clients connecting at once all wait");
        let (_c, s) = pair(&l, "127.0.0.30");
        let _t = gate.admit(&s).unwrap();
        assert_eq!(gate.evicted(), 1, "past four budgets the oldest goes, whatever its age");
        assert!(closed(&mut held[0].0));
        assert!(!closed(&mut held[1].0));
    }
}
