//! Reconnecting after a lost connection: a new connection to the same
//! server (or, of several gateways, to the first that answers, the one in
//! use tried first), which rejoins the client's session if the server still
//! has it (same server instance, within the lease: open files, offsets and
//! locks are all still there) or starts a new one (the server restarted, or
//! another gateway answered: files open before are opened again by their
//! identity).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferry_proto::{caps, Reply, Request};

use crate::client::SessionTicket;
use crate::engine::{Engine, Options};
use crate::error::{Error, Result};
use crate::gateways::Gateways;

/// Waiting for a server up to a bound (`Duration::MAX`: no bound): the
/// pauses between tries, growing to `cap`, never past the deadline.
pub(crate) struct Patience {
    start: Instant,
    deadline: Option<Instant>,
    pause: Duration,
    cap: Duration,
}

impl Patience {
    pub(crate) fn new(bound: Duration, cap: Duration) -> Patience {
        let start = Instant::now();
        Patience { start, deadline: start.checked_add(bound), pause: Duration::from_millis(20), cap }
    }

    pub(crate) fn over(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    pub(crate) fn waited(&self) -> Duration {
        self.start.elapsed()
    }

    /// How long it waits at most, in words.
    pub(crate) fn until(&self, bound: Duration) -> String {
        match self.deadline {
            Some(_) => format!("giving up after {} s", bound.as_secs_f64()),
            None => "for as long as it takes".into(),
        }
    }

    /// Sleeps until the next try.
    pub(crate) fn pause(&mut self) {
        let left = self.deadline.map_or(self.pause, |d| d.saturating_duration_since(Instant::now()));
        std::thread::sleep(self.pause.min(left));
        self.pause = (self.pause * 2).min(self.cap);
    }
}

pub(crate) struct Redial {
    gateways: Gateways,
    opts: Options,
    bound: Duration,
    ticket: Mutex<Option<SessionTicket>>,
    /// Bumped when a reconnect reached another server instance: handles
    /// from before name nothing on the server any more.
    epoch: AtomicU64,
    /// Bumped when a reconnect could not rejoin the session at all: replies
    /// of requests sent before are gone with it.
    lost: AtomicU64,
    /// Reconnects made.
    made: AtomicU64,
    /// The client's leases, turned on again on every new connection.
    pub(crate) leases: Mutex<Option<Arc<crate::leases::Leases>>>,
    /// The secret that names this client's fence record on a shared volume
    /// (drawn here: a forked child makes its own client, and its own), and
    /// how many sessions it made there: each new one fences the ones
    /// before, on whichever gateway they are (PROTOCOL.md 8.3).
    owner: [u8; 32],
    fence_epoch: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether an error means the connection is gone (and a new one may do).
/// Not for a connection used after `fork`: that one is fine, just not ours.
pub(crate) fn is_lost(e: &Error) -> bool {
    matches!(e, Error::Io { errno, .. } if *errno != Some(libc::ENOTCONN))
}

/// Registers the engine's state as a session (if the server can); a
/// volatile one (`keeps_handles` false) keeps only its replies.
pub(crate) fn new_session(e: &Engine, keeps_handles: bool) -> Result<SessionTicket> {
    if !e.has_cap(caps::SESSIONS) {
        return Err(Error::remote(libc::ENOSYS));
    }
    let req = if keeps_handles { Request::SessionNew } else { Request::SessionNewVolatile };
    match e.call(&req)?.reply()? {
        Reply::Session { id, lease_ms } => {
            let lease = Duration::from_millis(lease_ms.into());
            let mut t = SessionTicket::new(id, e.session_secret(), lease, e.welcome().boot_id);
            t.keeps_handles = keeps_handles;
            Ok(t)
        }
        r => Err(Error::Protocol(format!("unexpected reply {r:?}"))),
    }
}

/// Names `e`'s session the `epoch`-th of `owner` on a gateway that fences:
/// from now on the gateways refuse requests of the ones before.
fn fence(e: &Engine, owner: &[u8; 32], epoch: u64) -> Result<()> {
    if !e.has_cap(caps::FENCE) {
        return Ok(());
    }
    match e.call(&Request::SessionFence { owner: *owner, epoch })?.reply()? {
        Reply::Empty => Ok(()),
        r => Err(Error::Protocol(format!("unexpected reply {r:?}"))),
    }
}

pub(crate) fn attach(e: &Engine, t: &SessionTicket) -> Result<()> {
    if !e.has_cap(caps::SESSIONS) {
        return Err(Error::remote(libc::ENOSYS));
    }
    let proof = e.attach_proof(t.secret(), t.id);
    match e.call(&Request::SessionAttach { id: t.id, proof })?.reply()? {
        Reply::Session { .. } => Ok(()),
        r => Err(Error::Protocol(format!("unexpected reply {r:?}"))),
    }
}

impl Redial {
    /// For a client that reconnects: its first connection's state becomes a
    /// session right away, so that there is something to rejoin.
    pub(crate) fn new(gateways: Gateways, opts: &Options, bound: Duration, first: &Engine) -> Redial {
        // A server without sessions still gets reconnects, just never resumes.
        let ticket = new_session(first, opts.session_keeps_handles).ok();
        let mut owner = [0u8; 32];
        // Without randomness the owner is weak, not shared: a process id
        // and the time are this client's still.
        if getrandom::getrandom(&mut owner).is_err() {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            owner[..16].copy_from_slice(&t.as_nanos().to_le_bytes());
            owner[16..20].copy_from_slice(&std::process::id().to_le_bytes());
        }
        if ticket.is_some() {
            if let Err(e) = fence(first, &owner, 1) {
                eprintln!("ferry: {}: session not fenced: {e}", first.addr());
            }
        }
        Redial {
            gateways,
            opts: opts.clone(),
            bound,
            ticket: Mutex::new(ticket),
            epoch: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            made: AtomicU64::new(0),
            leases: Mutex::new(None),
            owner,
            fence_epoch: AtomicU64::new(1),
        }
    }

    /// The session to join from further connections, if there is one.
    pub(crate) fn ticket(&self) -> Option<SessionTicket> {
        lock(&self.ticket).clone()
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Relaxed)
    }

    pub(crate) fn sessions_lost(&self) -> u64 {
        self.lost.load(Relaxed)
    }

    pub(crate) fn reconnects(&self) -> u64 {
        self.made.load(Relaxed)
    }

    /// Replaces `failed` in `slot` with a new connection, trying for up to
    /// the bound, saying so on stderr (once when it starts waiting, once
    /// when it is back); the epoch moves on if the session could not be
    /// rejoined. If another thread already replaced it, returns at once.
    pub(crate) fn redial(&self, slot: &Mutex<Arc<Engine>>, failed: &Arc<Engine>, why: &Error) -> Result<()> {
        let mut cur = lock(slot);
        if !Arc::ptr_eq(&cur, failed) {
            return Ok(());
        }
        if failed.stalled() {
            self.gateways.pass(failed.addr());
        }
        // `Duration::MAX` (a hard mount): no deadline at all.
        let mut patience = Patience::new(self.bound, Duration::from_secs(1));
        let mut said = false;
        loop {
            // A server killed again between the connect and the attach is
            // one more failed attempt: taking it for a forgotten session
            // would give up replies the restarted server still keeps.
            let attempt = self.gateways.connect(&self.opts).and_then(|e| Ok((self.resume(&e)?, e)));
            match attempt {
                Ok(((resumed, same_instance), e)) => {
                    let e_addr = e.addr().to_string();
                    *cur = Arc::new(e);
                    if let Some(l) = lock(&self.leases).clone() {
                        // Nothing the old connection promised holds now.
                        failed.leases_lost();
                        if let Err(err) = cur.leases_on(l) {
                            eprintln!("ferry: {e_addr}: leases not turned on again ({err}); caching less");
                        }
                    }
                    self.made.fetch_add(1, Relaxed);
                    if !resumed {
                        self.lost.fetch_add(1, Relaxed);
                    }
                    if !same_instance {
                        self.epoch.fetch_add(1, Relaxed);
                    }
                    let moved = e_addr != failed.addr();
                    if said || moved {
                        let how = match (resumed, same_instance) {
                            (true, true) => "session resumed",
                            (true, false) => "server restarted, session resumed: files open before are opened again",
                            _ => "new session: files open before are opened again",
                        };
                        if moved && failed.stalled() {
                            eprintln!("ferry: {}: {why}; moved to gateway {e_addr} ({how})", failed.addr());
                        } else if moved {
                            eprintln!("ferry: {}: lost; moved to gateway {e_addr} ({how})", failed.addr());
                        } else {
                            eprintln!("ferry: {e_addr}: reconnected ({how})");
                        }
                    }
                    return Ok(());
                }
                // A server that answers but refuses us will go on refusing.
                Err(e @ Error::Auth(_)) => return Err(e),
                Err(e) => {
                    if patience.over() {
                        return Err(Error::Io {
                            kind: io::ErrorKind::TimedOut,
                            errno: Some(libc::EIO),
                            message: format!(
                                "lost the connection to {} ({why}) and could not reconnect within {} s: {e}",
                                failed.addr(),
                                self.bound.as_secs_f64()
                            ),
                        });
                    }
                    if !said {
                        let until = patience.until(self.bound);
                        eprintln!("ferry: {}: connection lost ({why}); reconnecting ({until})", failed.addr());
                        said = true;
                    }
                    patience.pause();
                }
            }
        }
    }

    /// Fences this client's sessions before the one of `e`. Fails only if
    /// the connection was lost: a gateway that cannot fence is said, and
    /// used all the same (as one that does not offer it is).
    fn fence(&self, e: &Engine) -> Result<()> {
        match fence(e, &self.owner, self.fence_epoch.load(Relaxed)) {
            Err(err) if is_lost(&err) => Err(err),
            Err(err) => {
                eprintln!("ferry: {}: session not fenced: {err}", e.addr());
                Ok(())
            }
            Ok(()) => Ok(()),
        }
    }

    /// Rejoins the session, or starts a new one when the server no longer
    /// has it (restarted without its state, or the lease ran out). Says
    /// whether the session was rejoined, and whether on the instance that
    /// made it (a restarted server that kept its sessions has their reply
    /// caches, not their handles).
    /// Fails only if this connection was lost too.
    fn resume(&self, e: &Engine) -> Result<(bool, bool)> {
        let mut t = lock(&self.ticket);
        let boot = e.welcome().boot_id;
        if let Some(ticket) = t.as_mut() {
            match attach(e, ticket) {
                Ok(()) => {
                    // A volatile session's handles went with the connection.
                    let same = ticket.boot == boot && ticket.keeps_handles;
                    ticket.boot = boot;
                    // Again: a restarted gateway kept the session, not its fence.
                    self.fence(e)?;
                    return Ok((true, same));
                }
                Err(err) if is_lost(&err) => return Err(err),
                Err(_) => {}
            }
        }
        match new_session(e, self.opts.session_keeps_handles) {
            Ok(n) => {
                *t = Some(n);
                self.fence_epoch.fetch_add(1, Relaxed);
                self.fence(e)?;
            }
            Err(err) if is_lost(&err) => return Err(err),
            Err(_) => *t = None,
        }
        Ok((false, false))
    }
}
