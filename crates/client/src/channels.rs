//! Data channels, the AFS paper's split path: further connections joined to
//! the client's session that carry bulk positional reads and writes, so a
//! large transfer never queues a `stat` behind it on the main connection
//! (the server runs a session's transfers beside its other requests).
//!
//! Made on first use, for the main connection of the moment (a reconnect
//! makes new ones on the next use). A server without the `DATA_CHANNELS`
//! capability gets none; a channel that cannot be set up, or that fails,
//! is said once on stderr and its transfers go on the main connection until
//! that one is replaced: a fallback, never an error.
//!
//! A server on this host (it tells its Unix socket, `LocalAddr`, and the
//! socket's peer is the process that told it) gets one channel over that
//! socket instead: data skips the network stack, and regular files' data
//! moves through descriptors the server passes on it (`FileFd`), with no
//! request at all (see `File::local`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use ferry_proto::{caps, Reply, Request};

use crate::client::SessionTicket;
use crate::engine::{Engine, Options};
use crate::error::{Error, Result};
use crate::redial::{attach, new_session};

pub(crate) struct Channels {
    opts: Options,
    st: Mutex<State>,
    said: AtomicBool,
}

#[derive(Default)]
struct State {
    /// The main connection the channels belong to (held weakly: its
    /// allocation, so its address, is not reused while compared).
    main: Weak<Engine>,
    engines: Vec<Arc<Engine>>,
    next: usize,
    /// Setting up or using a channel failed on this main connection.
    off: bool,
    /// The channel is the server's Unix socket (the same-host path).
    local: bool,
    /// The same-host path was looked for on this main connection.
    local_tried: bool,
    /// The session made for the channels of a client that does not
    /// reconnect (one that does has its own).
    own: Option<SessionTicket>,
}

impl State {
    fn belongs_to(&self, main: &Arc<Engine>) -> bool {
        std::ptr::eq(self.main.as_ptr(), Arc::as_ptr(main))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Channels {
    pub(crate) fn new(opts: &Options) -> Option<Channels> {
        // A volatile session's handles end with its main connection
        // (`ferry run`): nothing for another connection to share.
        if (opts.data_channels == 0 && !opts.same_host) || (opts.reconnect.is_some() && !opts.session_keeps_handles) {
            return None;
        }
        Some(Channels { opts: opts.clone(), st: Mutex::default(), said: AtomicBool::new(false) })
    }

    /// Bytes from which a transfer goes on a channel.
    pub(crate) fn threshold(&self) -> usize {
        self.opts.data_threshold
    }

    /// A channel for bulk data beside `main`, made if there is none yet
    /// (`ticket`: the session to join, if the client keeps one); `None`:
    /// stay on `main`. Threads wait for the one setting up (once per main
    /// connection): falling back meanwhile would move their read-ahead
    /// from one connection to the other.
    pub(crate) fn pick(
        &self,
        main: &Arc<Engine>,
        ticket: impl FnOnce() -> Option<SessionTicket>,
    ) -> Option<Arc<Engine>> {
        self.pick_with(main, ticket, true)
    }

    /// `pick`; with `tcp` false only the same-host channel is made (a
    /// file's first read or write looks for it, whatever its size, and a
    /// client of a server elsewhere must not get a TCP channel for that).
    fn pick_with(
        &self,
        main: &Arc<Engine>,
        ticket: impl FnOnce() -> Option<SessionTicket>,
        tcp: bool,
    ) -> Option<Arc<Engine>> {
        let offered = main.has_cap(caps::DATA_CHANNELS) || main.has_cap(caps::SAME_HOST);
        if !offered || !main.has_cap(caps::SESSIONS) {
            return None;
        }
        let mut st = lock(&self.st);
        if !st.belongs_to(main) {
            *st = State { main: Arc::downgrade(main), ..State::default() };
        }
        if st.off {
            return None;
        }
        if let Some(i) = st.engines.iter().position(|e| e.is_dead()) {
            let e = st.engines.swap_remove(i);
            let why = e.gone().map_or_else(|| "closed".to_string(), |e| e.to_string());
            self.fall_back(&mut st, &format!("a data channel was lost ({why})"));
            return None;
        }
        if st.engines.is_empty() {
            if let Err(e) = self.set_up(&mut st, main, ticket, tcp) {
                self.fall_back(&mut st, &format!("could not set up data channels ({e})"));
            }
            if st.engines.is_empty() {
                return None;
            }
        }
        st.next = st.next.wrapping_add(1);
        Some(Arc::clone(&st.engines[st.next % st.engines.len()]))
    }

    /// A connection to the server's Unix socket that belongs to `main`'s
    /// session, for `FileFd`: `main` itself if it is one, else the
    /// same-host channel (made if need be), if the server is on this host.
    pub(crate) fn local(
        &self,
        main: &Arc<Engine>,
        ticket: impl FnOnce() -> Option<SessionTicket>,
    ) -> Option<Arc<Engine>> {
        if main.is_unix() {
            return Some(Arc::clone(main));
        }
        if !self.opts.same_host || !main.has_cap(caps::SAME_HOST) {
            return None;
        }
        let e = self.pick_with(main, ticket, false)?;
        lock(&self.st).local.then_some(e)
    }

    /// Channels open beside `main` now.
    pub(crate) fn open(&self, main: &Arc<Engine>) -> usize {
        let st = lock(&self.st);
        match st.belongs_to(main) {
            true => st.engines.iter().filter(|e| !e.is_dead()).count(),
            false => 0,
        }
    }

    fn set_up(
        &self,
        st: &mut State,
        main: &Arc<Engine>,
        ticket: impl FnOnce() -> Option<SessionTicket>,
        tcp: bool,
    ) -> Result<()> {
        let mut given = Some(ticket);
        let mut ticket = |st: &mut State| -> Result<SessionTicket> {
            match given.take().and_then(|t| t()) {
                Some(t) => Ok(t),
                None => match &st.own {
                    Some(t) => Ok(t.clone()),
                    None => Ok(st.own.insert(new_session(main, true)?).clone()),
                },
            }
        };
        if !st.local_tried {
            st.local_tried = true;
            if let Some(e) = self.same_host(main)? {
                let t = ticket(st)?;
                attach(&e, &t)
                    .map_err(|err| Error::Protocol(format!("same-host socket, joining the session: {err}")))?;
                st.engines.push(Arc::new(e));
                st.local = true;
                return Ok(());
            }
        }
        if !tcp {
            return Ok(());
        }
        let ticket = ticket(st)?;
        if self.opts.data_channels == 0 || !main.has_cap(caps::DATA_CHANNELS) {
            // Only the same-host path was wanted or offered, and it is not
            // to be had: nothing to fall back from, nothing to say.
            st.off = true;
            return Ok(());
        }
        for _ in 0..self.opts.data_channels {
            // The main connection's server: of several gateways, the one
            // holding the session.
            let e = Engine::connect(main.addr(), &self.opts)?;
            // A hung gateway is left whichever connection finds it so.
            e.set_stall(main.stall());
            attach(&e, &ticket)?;
            if e.welcome().boot_id != main.welcome().boot_id {
                return Err(Error::Protocol("another server instance answered".into()));
            }
            st.engines.push(Arc::new(e));
        }
        Ok(())
    }

    /// A connection to the server's Unix socket, if the server is on this
    /// host: it tells its socket and process id, and the socket's peer must
    /// be that process with the same boot id (a socket of that name on
    /// another host, or another server's, is not it). `Ok(None)`: not on
    /// this host, or not offered; `Err`: it is, and setting up failed
    /// (said, and the data goes over TCP).
    fn same_host(&self, main: &Arc<Engine>) -> Result<Option<Engine>> {
        if !self.opts.same_host || main.is_unix() || !main.has_cap(caps::SAME_HOST) {
            return Ok(None);
        }
        let frame = match main.call(&Request::LocalAddr) {
            Ok(f) => f,
            Err(Error::Remote { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let (pid, addr) = match frame.reply()? {
            Reply::LocalAddr { pid, addr } => (pid, String::from_utf8_lossy(addr).into_owned()),
            r => return Err(Error::Protocol(format!("unexpected reply {r:?}"))),
        };
        let e = match Engine::connect(&addr, &self.opts) {
            Ok(e) => e,
            // No such socket here: another host (or network name space).
            Err(Error::Io {
                errno: Some(libc::ECONNREFUSED | libc::ENOENT | libc::ENOTDIR | libc::EACCES), ..
            }) => return Ok(None),
            // Something answered there, and would not serve us.
            Err(err) => return Err(Error::Protocol(format!("same-host socket {addr}: {err}"))),
        };
        if e.peer_pid() != Some(pid) || e.welcome().boot_id != main.welcome().boot_id {
            return Ok(None);
        }
        Ok(Some(e))
    }

    /// Transfers of a channel that failed under them go on the main
    /// connection from now on (they may run twice: positional).
    pub(crate) fn failed(&self, e: &Arc<Engine>, err: &Error) {
        let mut st = lock(&self.st);
        if st.engines.iter().any(|x| Arc::ptr_eq(x, e)) {
            st.engines.retain(|x| !Arc::ptr_eq(x, e));
            self.fall_back(&mut st, &format!("a data channel failed ({err})"));
        }
    }

    fn fall_back(&self, st: &mut State, why: &str) {
        st.off = true;
        st.engines.clear();
        if !self.said.swap(true, Relaxed) {
            let addr = st.main.upgrade().map_or_else(String::new, |m| m.addr().to_string());
            eprintln!("ferry: {addr}: {why}; bulk data goes on the main connection");
        }
    }
}

/// One write sent behind on the main connection and not yet answered, for
/// as long as it lives: while there are any, reads stay on the main
/// connection, behind them (the server answers a connection in order, but
/// nothing orders two connections).
pub(crate) struct Behind(Arc<AtomicUsize>);

impl Behind {
    pub(crate) fn new(count: &Arc<AtomicUsize>) -> Behind {
        count.fetch_add(1, Relaxed);
        Behind(Arc::clone(count))
    }
}

impl Drop for Behind {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Release);
    }
}
