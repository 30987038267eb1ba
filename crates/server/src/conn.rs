//! One client connection: handshake (on a thread of its own), then, served
//! by a worker of the event loop (`evloop.rs`), read a frame, execute it,
//! write the reply — all on that worker, so a read request never changes
//! threads between the socket and `sendfile`. A request that runs long
//! gets the rest of the connection served beside it by another worker
//! (`turns`).

use ferry_sock::Socket;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::bufpool::{BufPool, Lent};
use crate::commit::Committer;
use crate::inbox::{Body, Inbox, Partial};
use crate::locks::LockTable;
use crate::session::HandleBudget;
use crate::sessions::{Sessions, Shared};

use ferry_proto::handshake::{Refusal, ServerHandshake, ServerOffer, HANDSHAKE_MAX_FRAME};
use ferry_proto::{
    attach_proof, caps, op, proofs_equal, session_secret, DecodeError, ErrorReply, Header, Nonce, Reply, Request,
    HEADER_LEN,
};

use crate::backend::{Backend, Errno, ReadData};
use crate::session::{Answer, Policy, Session};
use crate::turns::{Kind, Turns};
use crate::Config;

/// Frames up to this size (a 1 MiB write and its fields) are read into the
/// connection's own buffer; larger ones borrow from the shared pool.
const OWN_MAX: usize = 1024 * 1024 + 4096;
/// Small replies are gathered up to this size while more requests wait.
const OUT_FLUSH: usize = 64 * 1024;

/// Requests one worker of the event loop serves on a connection in a row
/// before the others' turn.
const TURN_REQUESTS: usize = 64;

/// What a worker of the event loop leaves a connection as.
#[derive(Debug, PartialEq, Eq)]
pub enum Ready {
    /// Waiting for input: arm it again.
    Idle,
    /// Another worker reads it now (this one ran a slow request).
    Handed,
    /// This worker served it long enough: the others' turn first.
    Yield,
    /// It ended.
    Ended,
}

/// What a serving thread lends the connection it serves: its ids (worn per
/// thread) and buffers, so an idle connection holds none.
pub struct Kit {
    creds: crate::identity::ThreadCreds,
    body: Vec<u8>,
    out: Vec<u8>,
}

impl Kit {
    /// For the calling thread.
    pub fn new() -> Kit {
        Kit { creds: crate::identity::ThreadCreds::new(), body: Vec::new(), out: Vec::with_capacity(OUT_FLUSH) }
    }
}

/// Why a connection ended, for the one log line it gets.
#[derive(Debug)]
pub enum End {
    Closed,
    Io(io::Error),
    Protocol(String),
    AuthFailed,
}

/// A connection, as one of the threads serving it holds it: the socket and
/// what the connection's threads share, and this thread's own buffers.
pub struct Conn<B: Backend> {
    /// Read by one thread at a time, from a request's header to the moment
    /// the request may start (so requests start in the order sent).
    rx: Arc<Mutex<Inbox>>,
    /// Whether more input was buffered after the last frame read.
    more: bool,
    /// The connection's one descriptor, shared by its holds and its input.
    tx: Arc<Socket>,
    /// Held by whoever writes to the socket, so frames never interleave.
    wlock: Arc<Mutex<()>>,
    peer: String,
    common: Common<B>,
    /// This connection's (server, client) nonces, for session proofs.
    nonces: (Nonce, Nonce),
    /// The session this connection belongs to.
    joined: Arc<Mutex<Joined<B>>>,
    /// Counts changes of `joined`'s session, so each thread keeps its own
    /// hold of it (`mine`) and looks again only after one.
    joined_gen: Arc<AtomicU64>,
    mine: Option<(u64, Shared<B>)>,
    /// What the handshake settled, for a session a previous server process
    /// left, made when this connection attaches to it.
    policy: Option<Policy>,
    body: Vec<u8>,
    /// The body of the current frame when it is larger than `OWN_MAX`;
    /// returned to the pool as soon as its request is answered.
    big: Option<Lent>,
    out: Vec<u8>,
    /// `Fsync`s wait for the disk here, beside later requests.
    commits: Arc<Mutex<Committer<B>>>,
    /// Descriptors passed on this connection (`FileFd`'s `seq`).
    fds_sent: Arc<AtomicU64>,
    /// Its requests running, and the threads serving it.
    turns: Arc<Turns>,
    /// Why the connection ended, told by the thread that found out.
    ended: Arc<Mutex<Option<End>>>,
    /// The ids this connection's thread wears (`IDENTITY`).
    creds: crate::identity::ThreadCreds,
    /// The TLS session's channel binding, if the connection is under TLS.
    binding: Option<[u8; 32]>,
    /// The token the client proved (empty without authentication).
    token: Vec<u8>,
    /// What its requests may use, as of a generation of the exports
    /// (`--config`).
    grants: Option<u64>,
    /// Its place among the connections (`gate`), held by the connection's
    /// first thread only.
    pub ticket: Option<crate::gate::Ticket>,
    /// Whom its fair shares count it as.
    from: crate::peer::Peer,
    /// This connection turned leases on (`LeaseOn`): its replies grant
    /// them, and its session's breaks come on it.
    leases_here: Arc<AtomicBool>,
    /// Caller slots that claimed root and were squashed: a refusal to one
    /// says why (the bare EACCES of a root user otherwise baffles).
    squashed: Arc<Mutex<std::collections::HashSet<u16>>>,
}

/// What every connection of a server shares.
pub struct Common<B: Backend> {
    pub cfg: Arc<Config>,
    pub backend: Arc<B>,
    pub budget: Arc<HandleBudget>,
    pub pool: Arc<BufPool>,
    pub locks: Arc<LockTable>,
    pub changes: Arc<crate::changes::Changes>,
    pub leases: Arc<crate::leases::Leases>,
    pub dirs: Arc<crate::dirpolicy::DirPolicies>,
    pub seals: Arc<crate::fileseal::Seals>,
    pub sessions: Arc<Sessions<B>>,
    /// Fence records (`Config::fence_dir`).
    pub fences: Option<Arc<crate::fence::Fences>>,
    pub metrics: Arc<crate::metrics::Metrics>,
}

// Not derived: that would ask `B: Clone`, and only the `Arc`s are cloned.
impl<B: Backend> Clone for Common<B> {
    fn clone(&self) -> Self {
        Common {
            cfg: Arc::clone(&self.cfg),
            backend: Arc::clone(&self.backend),
            budget: Arc::clone(&self.budget),
            pool: Arc::clone(&self.pool),
            locks: Arc::clone(&self.locks),
            changes: Arc::clone(&self.changes),
            leases: Arc::clone(&self.leases),
            metrics: Arc::clone(&self.metrics),
            dirs: Arc::clone(&self.dirs),
            seals: Arc::clone(&self.seals),
            sessions: Arc::clone(&self.sessions),
            fences: self.fences.clone(),
        }
    }
}

/// The session a connection belongs to, shared by its threads.
struct Joined<B: Backend> {
    session: Option<Shared<B>>,
    /// Its id, once registered (`SessionNew`, `SessionAttach`).
    id: Option<u64>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<B: Backend> Conn<B> {
    pub fn new(stream: Socket, common: &Common<B>) -> io::Result<Self> {
        let peer = stream.peer_name();
        stream.set_nodelay()?;
        stream.set_read_timeout(Some(common.cfg.idle_timeout))?;
        let tx = Arc::new(stream);
        let from = crate::peer::Peer::of(&tx);
        let wlock = Arc::new(Mutex::new(()));
        let window = common.cfg.window_requests as usize;
        Ok(Conn {
            rx: Arc::new(Mutex::new(Inbox::new(Arc::clone(&tx)))),
            more: false,
            tx,
            commits: Arc::new(Mutex::new(Committer::new(Arc::clone(&common.backend), window, Arc::clone(&wlock)))),
            wlock,
            peer,
            common: common.clone(),
            nonces: ([0; 32], [0; 32]),
            joined: Arc::new(Mutex::new(Joined { session: None, id: None })),
            joined_gen: Arc::default(),
            mine: None,
            policy: None,
            body: Vec::new(),
            big: None,
            out: Vec::new(),
            fds_sent: Arc::default(),
            turns: Turns::new(),
            ended: Arc::default(),
            creds: crate::identity::ThreadCreds::new(),
            binding: None,
            token: Vec::new(),
            grants: None,
            ticket: None,
            from,
            leases_here: Arc::default(),
            squashed: Arc::default(),
        })
    }

    pub fn peer(&self) -> String {
        self.peer.clone()
    }

    /// Another thread's hold of this connection: what they share, and
    /// buffers and ids of its own. Made on the thread that will use it.
    fn sibling(&self) -> io::Result<Self> {
        Ok(Conn {
            rx: Arc::clone(&self.rx),
            more: false,
            tx: Arc::clone(&self.tx),
            wlock: Arc::clone(&self.wlock),
            peer: self.peer.clone(),
            common: self.common.clone(),
            nonces: self.nonces,
            joined: Arc::clone(&self.joined),
            joined_gen: Arc::clone(&self.joined_gen),
            mine: None,
            policy: self.policy.clone(),
            body: Vec::new(),
            big: None,
            out: Vec::new(),
            commits: Arc::clone(&self.commits),
            fds_sent: Arc::clone(&self.fds_sent),
            turns: Arc::clone(&self.turns),
            ended: Arc::clone(&self.ended),
            creds: crate::identity::ThreadCreds::new(),
            binding: self.binding,
            token: self.token.clone(),
            // Told on its first request.
            grants: None,
            ticket: None,
            from: self.from,
            leases_here: Arc::clone(&self.leases_here),
            squashed: Arc::clone(&self.squashed),
        })
    }

    /// The handshake, and the session the connection starts with: the
    /// capabilities agreed.
    pub fn start(&mut self) -> Result<u64, End> {
        let policy = self.handshake()?;
        let caps = policy.caps;
        self.policy = Some(policy.clone());
        lock(&self.joined).session = Some(Arc::new(Session::new(Arc::clone(&self.common.backend), policy)));
        Ok(caps)
    }

    /// What the connection leaves behind once no thread serves it: its
    /// lease line, and its session (detached).
    pub fn finish(&self) -> End {
        let end = lock(&self.ended).take().unwrap_or(End::Closed);
        if self.leases_here.load(Relaxed) {
            let holder = lock(&self.joined).session.as_ref().and_then(|s| s.lease.get().cloned());
            if let Some(h) = holder {
                // A reset is the client's end closing with replies it
                // never read (a process that exits with a close or a
                // keep-alive's answer still on its way): its socket is
                // gone, and the leases with it, as after a clean close.
                // Anything else (a timeout: the client may be cut off and
                // still caching) is waited for up to the lease time.
                let by_client = match &end {
                    End::Closed => true,
                    End::Io(e) => e.kind() == io::ErrorKind::ConnectionReset,
                    _ => false,
                };
                h.line_ended(&self.tx, by_client);
            }
        }
        // A registered session lives on for its lease; an unregistered one
        // ends here with the connection (its handles close, locks go).
        if let Some(id) = lock(&self.joined).id {
            self.common.sessions.detach(id);
        }
        end
    }

    /// Shuts the socket: the peer learns at once, and a thread still
    /// running a request finds no one to answer.
    pub fn shut(&self) {
        let _ = self.tx.shutdown_both();
    }

    /// The connection's input (the event loop arms its socket).
    pub fn inbox(&self) -> &Arc<Mutex<Inbox>> {
        &self.rx
    }

    pub fn turns(&self) -> &Arc<Turns> {
        &self.turns
    }

    /// Another hold of the connection, for a second worker of the event
    /// loop (beside a slow request).
    pub fn another(&self) -> io::Result<Self> {
        self.sibling()
    }

    /// Lends this connection the serving thread's buffers and ids.
    pub fn enter(&mut self, kit: &mut Kit) {
        std::mem::swap(&mut self.creds, &mut kit.creds);
        std::mem::swap(&mut self.body, &mut kit.body);
        std::mem::swap(&mut self.out, &mut kit.out);
        // The grants are the thread's (a thread-local): told again.
        self.grants = None;
    }

    /// Gives the thread its buffers and ids back. Replies a failed write
    /// left are dropped: they must never reach the next connection.
    pub fn leave(&mut self, kit: &mut Kit) {
        self.enter(kit);
        kit.out.clear();
    }

    /// Serves the requests that have come, without waiting for more, as
    /// the holder of the socket's reading turn `rights` (see
    /// `Turns::resume`).
    pub fn serve_ready(&mut self, caps: u64, rights: u64) -> Ready {
        let mut served = 0;
        loop {
            let r = self.serve_one(caps);
            self.big = None;
            let more = match r {
                Err(e) => {
                    lock(&self.ended).get_or_insert(e);
                    self.turns.over();
                    self.turns.reading(false);
                    return Ready::Ended;
                }
                Ok(more) => more,
            };
            if !more {
                return Ready::Idle;
            }
            crate::evloop::progress();
            served += 1;
            let handed = !self.turns.resume(rights);
            // A long stream of requests on one connection lets the others
            // go first now and then.
            let turn_over = served >= TURN_REQUESTS;
            if handed || turn_over {
                if let Err(e) = self.flush() {
                    lock(&self.ended).get_or_insert(e);
                    self.turns.over();
                    return Ready::Ended;
                }
                return if handed { Ready::Handed } else { Ready::Yield };
            }
        }
    }

    /// Reads one frame header and body into `self.body` (the handshake's,
    /// whose reads wait).
    fn read_frame(&mut self, max: u32) -> Result<Header, End> {
        let rx = Arc::clone(&self.rx);
        let mut rx = lock(&rx);
        self.read_frame_from(&mut rx, max)?.ok_or_else(|| End::Protocol("idle timeout".into()))
    }

    /// Reads one frame header and body from `rx` into `self.body` (or a
    /// buffer of the pool): `None` if the rest has not come yet (on a
    /// connection whose reads do not wait), kept in `rx` meanwhile.
    fn read_frame_from(&mut self, rx: &mut Inbox, max: u32) -> Result<Option<Header>, End> {
        let mut p = match rx.partial.take() {
            Some(p) => p,
            None => {
                let h = match rx.header() {
                    Ok(Some(h)) => h,
                    Ok(None) => return Ok(None),
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(End::Closed),
                    Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                        return Err(End::Protocol("idle timeout".into()))
                    }
                    Err(e) => return Err(End::Io(e)),
                };
                if let Err(e) = h.check_len(max) {
                    let why = e.to_string();
                    if self.policy.is_some() {
                        self.refuse_frame(h, &why);
                    }
                    return Err(End::Protocol(why));
                }
                let len = h.len as usize;
                let body = if len > OWN_MAX {
                    Body::Big(self.common.pool.take(self.from, len))
                } else {
                    // Grow only (up to OWN_MAX): zero-filling per frame
                    // would cost more than the copy it prepares.
                    let mut own = std::mem::take(&mut self.body);
                    if own.len() < len {
                        own.resize(len, 0);
                    }
                    Body::Own(own)
                };
                Partial { header: h, body, got: 0 }
            }
        };
        let len = p.header.len as usize;
        let dest = match &mut p.body {
            Body::Own(v) => &mut v[..len],
            Body::Big(b) => &mut b.as_mut_slice()[..len],
        };
        match rx.body(dest, &mut p.got) {
            Ok(true) => {}
            Ok(false) => {
                rx.partial = Some(p);
                return Ok(None);
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(End::Protocol("truncated frame".into())),
            Err(e) => return Err(End::Io(e)),
        }
        match p.body {
            Body::Own(v) => self.body = v,
            Body::Big(b) => self.big = Some(b),
        }
        self.more = rx.buffered() > 0;
        Ok(Some(p.header))
    }

    /// Tells an authenticated peer why its frame ends the connection (an
    /// error reply to it, `EMSGSIZE`), then lets it read that: our side is
    /// shut for writing and what it still sends is read and dropped for a
    /// moment, since closing with unread input would reset the connection
    /// and could discard the reply before the peer reads it.
    fn refuse_frame(&mut self, h: Header, why: &str) {
        let mut out = Vec::new();
        ErrorReply { errno: libc::EMSGSIZE as u32, message: why }.encode(h.op, h.id, &mut out);
        self.out.extend_from_slice(&out);
        if self.flush().is_err() {
            return;
        }
        let _ = self.tx.shutdown_write();
        let until = Instant::now() + std::time::Duration::from_secs(2);
        let _ = self.tx.set_read_timeout(Some(std::time::Duration::from_millis(200)));
        let mut sink = [0u8; 64 * 1024];
        let mut left: usize = 64 << 20;
        while left > 0 && Instant::now() < until {
            match (&*self.tx).read(&mut sink) {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    }

    /// The handshake has one deadline for all of it, so a peer that never
    /// authenticates (or sends a byte now and then) cannot hold a
    /// connection slot for the whole idle timeout.
    fn handshake(&mut self) -> Result<Policy, End> {
        lock(&self.rx).timed.deadline =
            Some(Instant::now() + self.common.cfg.handshake_timeout.min(self.common.cfg.idle_timeout));
        let policy = self.start_tls().and_then(|()| self.handshake_steps());
        let mut rx = lock(&self.rx);
        let t = &mut rx.timed;
        t.deadline = None;
        t.stream.set_read_timeout(Some(self.common.cfg.idle_timeout)).map_err(End::Io)?;
        policy
    }

    /// A TCP connection whose first byte starts a TLS handshake, to a
    /// server with TLS: the handshake, within the handshake's time; from
    /// then on the connection's records are sealed (`ferry_sock::tls`).
    fn start_tls(&mut self) -> Result<(), End> {
        let Some(config) = self.common.cfg.tls.clone() else { return Ok(()) };
        if self.tx.is_unix() {
            return Ok(());
        }
        let t = self.common.cfg.handshake_timeout.min(self.common.cfg.idle_timeout);
        self.tx.set_read_timeout(Some(t)).map_err(End::Io)?;
        self.tx.set_write_timeout(Some(t)).map_err(End::Io)?;
        let first = self.tx.peek_first().map_err(End::Io)?;
        if first.is_some_and(ferry_sock::tls::is_client_hello) {
            let est = ferry_sock::tls::server(&self.tx, config)
                .map_err(|e| End::Protocol(format!("TLS handshake failed: {e}")))?;
            self.tx.start_tls(est.records);
            self.binding = Some(est.binding);
        }
        self.tx.set_write_timeout(None).map_err(End::Io)?;
        match first {
            None => Err(End::Closed),
            Some(_) => Ok(()),
        }
    }

    /// Feeds frames to the protocol's handshake machine until it is done.
    fn handshake_steps(&mut self) -> Result<Policy, End> {
        let mut nonce: Nonce = [0; 32];
        getrandom::getrandom(&mut nonce).map_err(|e| End::Io(io::Error::other(e.to_string())))?;
        let mut caps = self.common.cfg.caps;
        if self.common.cfg.identity.is_none() {
            caps &= !caps::IDENTITY;
        }
        // A read-only gateway applies nothing a fence would keep out, and
        // must not write records to the volume for its clients.
        if self.common.fences.is_none() || self.common.cfg.read_only {
            caps &= !caps::FENCE;
        }
        let offer = ServerOffer {
            caps,
            max_frame: self.common.cfg.max_frame,
            window_requests: self.common.cfg.window_requests,
            window_bytes: self.common.cfg.window_bytes,
            boot_id: self.common.cfg.boot_id,
            tokens: match &self.common.cfg.access {
                Some(a) => a.tokens(),
                None => self.common.cfg.token.clone().into_iter().collect(),
            },
            binding: self.binding,
        };
        let mut hs = ServerHandshake::new(offer, nonce);
        let plain_refused = self.common.cfg.tls_required && self.binding.is_none() && !self.tx.is_unix();
        let accepted = loop {
            let h = self.read_frame(HANDSHAKE_MAX_FRAME)?;
            if plain_refused {
                // Said in the protocol, so a client that did not ask for
                // TLS learns to (PROTOCOL.md 3.1).
                let msg = "this server requires TLS";
                ErrorReply { errno: libc::ENOPROTOOPT as u32, message: msg }.encode(h.op, h.id, &mut self.out);
                let _ = self.flush();
                return Err(End::Protocol(msg.into()));
            }
            let mut out = std::mem::take(&mut self.out);
            let step = hs.receive(&h, &self.body[..h.len as usize], &mut out);
            self.out = out;
            match step {
                Ok(None) => self.flush()?,
                Ok(Some(a)) => {
                    if let Some(t) = &mut self.ticket {
                        t.authenticated();
                    }
                    self.flush()?;
                    self.nonces = (a.server_nonce, a.client_nonce);
                    self.token = a.token.clone().unwrap_or_default();
                    break a;
                }
                Err(refusal) => {
                    // Counted before the client can learn of it: a scrape
                    // right after a refused client must see it.
                    if matches!(refusal, Refusal::AuthFailed) {
                        self.common.metrics.auth_failures.fetch_add(1, Relaxed);
                    }
                    // Best effort: the client learns why before the close.
                    let _ = self.flush();
                    return Err(match refusal {
                        Refusal::AuthFailed => End::AuthFailed,
                        Refusal::Protocol(m) => End::Protocol(m),
                    });
                }
            }
        };
        Ok(Policy {
            budget: self.common.budget.for_peer(crate::peer::Peer::of(&self.tx)),
            read_only: self.common.cfg.read_only,
            allow_devices: self.common.cfg.allow_devices,
            max_handles: self.common.cfg.max_handles,
            caps: accepted.caps,
            max_read: accepted.client_max_frame.min(self.common.cfg.max_frame).saturating_sub(4096),
            locks: Arc::clone(&self.common.locks),
            changes: Arc::clone(&self.common.changes),
            dirs: Arc::clone(&self.common.dirs),
            seals: Arc::clone(&self.common.seals),
        })
    }

    /// `SessionNew`: registers this connection's session (or names the one
    /// it already belongs to).
    fn session_new(&self, caps: u64, keeps_handles: bool) -> Result<u64, Errno> {
        if caps & caps::SESSIONS == 0 || (!keeps_handles && caps & caps::REPLAY == 0) {
            return Err(Errno::NOSYS);
        }
        let mut j = lock(&self.joined);
        if let Some(id) = j.id {
            return Ok(id);
        }
        let (sn, cn) = &self.nonces;
        let secret = session_secret(&self.token, sn, cn);
        let session = Arc::clone(j.session.as_ref().ok_or(Errno::INVAL)?);
        let id = self.common.sessions.create(session, secret, caps, keeps_handles);
        j.id = Some(id);
        Ok(id)
    }

    /// `SessionAttach`: this connection joins session `id`; whatever it had
    /// of its own is dropped.
    fn session_attach(&self, caps: u64, id: u64, proof: &[u8; 32]) -> Result<u64, Errno> {
        if caps & caps::SESSIONS == 0 {
            return Err(Errno::NOSYS);
        }
        let mut j = lock(&self.joined);
        if j.id == Some(id) {
            return Ok(id);
        }
        let (sn, cn) = &self.nonces;
        let make = || Session::new(Arc::clone(&self.common.backend), self.policy.clone().expect("after the handshake"));
        let joined = self.common.sessions.attach(
            id,
            caps,
            |secret| proofs_equal(proof, &attach_proof(secret, id, sn, cn)),
            make,
        )?;
        if let Some(old) = j.id {
            self.common.sessions.detach(old);
        }
        j.session = Some(joined);
        j.id = Some(id);
        self.joined_gen.fetch_add(1, std::sync::atomic::Ordering::Release);
        self.common.metrics.session_attaches.fetch_add(1, Relaxed);
        Ok(id)
    }

    /// `SessionFence`: this connection's session is its client's `epoch`-th;
    /// the client's earlier ones, on any gateway of the volume, are fenced.
    fn session_fence(&self, caps: u64, owner: &[u8; 32], epoch: u64) -> Result<(), Errno> {
        let fences = self.common.fences.as_ref().filter(|_| caps & caps::FENCE != 0).ok_or(Errno::NOSYS)?;
        let j = lock(&self.joined);
        // Only a registered session can be left, and so fenced.
        let (Some(_), Some(session)) = (j.id, &j.session) else { return Err(Errno::INVAL) };
        session.set_fence(fences.raise(owner, epoch)?);
        Ok(())
    }

    /// A request of a fenced session: refused, and the session dropped and
    /// the connection ended (its client went on elsewhere).
    fn fenced_out(&mut self, h: Header) -> Result<(), End> {
        let id = lock(&self.joined).id;
        tracing::warn!(peer = %self.peer, "session fenced: its client moved to another gateway; its requests here are refused");
        let message = "this session was fenced: its client moved to another gateway";
        ErrorReply { errno: libc::ESTALE as u32, message }.encode(h.op, h.id, &mut self.out);
        let _ = self.flush();
        if let Some(id) = id {
            self.common.sessions.drop_fenced(id);
        }
        Err(End::Protocol("session fenced: its client moved to another gateway".into()))
    }

    /// Tells this thread what the client may use of the exports
    /// (`--config`), again whenever they were reloaded.
    fn grant(&mut self) {
        let Some(a) = &self.common.cfg.access else { return };
        let generation = a.generation();
        if self.grants != Some(generation) {
            let peer = self.peer.parse::<std::net::SocketAddr>().ok().map(|s| s.ip());
            crate::exports::set_grants(a.grants(&self.token, peer));
            self.grants = Some(generation);
        }
    }

    /// Reads and serves one request: `false` if none has come whole yet
    /// (on a connection whose reads do not wait), its replies sent.
    fn serve_one(&mut self, caps: u64) -> Result<bool, End> {
        let rx = Arc::clone(&self.rx);
        // Replies gathered while more requests were buffered go out before
        // this thread waits: for input, or for the socket another thread
        // of the connection holds.
        let mut reader = match rx.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                self.flush()?;
                lock(&rx)
            }
        };
        if reader.buffered() == 0 {
            self.flush()?;
        }
        if self.turns.is_over() {
            // Another thread of the connection found its end.
            return Err(End::Closed);
        }
        self.turns.reading(true);
        let Some(h) = self.read_frame_from(&mut reader, self.common.cfg.max_frame)? else {
            // Back to the event loop, which counts as reading: nothing is
            // owed to the client while it waits.
            drop(reader);
            self.flush()?;
            return Ok(false);
        };
        self.run_frame(caps, h, reader).map(|()| true)
    }

    /// Runs the request whose frame was just read, with the socket's
    /// reader held until it may start.
    fn run_frame(&mut self, caps: u64, h: Header, reader: MutexGuard<'_, Inbox>) -> Result<(), End> {
        self.grant();
        let _counted = Counted::start(&self.common.metrics, h.op, HEADER_LEN as u64 + u64::from(h.len));
        let body = match &self.big {
            Some(b) => b.as_slice(),
            None => &self.body[..h.len as usize],
        };
        let req = match Request::decode(h.op, body) {
            Ok(r) => r,
            Err(DecodeError::UnknownOp(op)) => {
                self.turns.reading(false);
                drop(reader);
                return self.queue_error(h, Errno::NOSYS, &format!("unknown operation {op}"));
            }
            Err(e) => {
                self.turns.reading(false);
                drop(reader);
                return self.queue_error(h, Errno::BADMSG, &e.to_string());
            }
        };
        if let Request::LeaseReturn { seq } = req {
            // Answered at once, beside anything running: a change of
            // another session waits for it.
            self.turns.reading(false);
            drop(reader);
            if let Some(h) = lock(&self.joined).session.as_ref().and_then(|s| s.lease.get().cloned()) {
                h.returned(seq);
            }
            return Ok(());
        }
        // Started in the order sent, once nothing it must follow runs; the
        // socket is free for the next request from then on.
        let kind = Kind::of(&req);
        if !self.out.is_empty() && !self.turns.free_for(kind) {
            // It will wait: what this thread owes the client goes first.
            send_out(&self.tx, &self.wlock, &mut self.out)?;
        }
        let _turn = Turn::start(&self.turns, kind);
        self.turns.reading(false);
        drop(reader);
        if matches!(req, Request::Hello { .. } | Request::Auth { .. }) {
            return self.queue_error(h, Errno::INVAL, "handshake already done");
        }
        if matches!(
            req,
            Request::SessionNew
                | Request::SessionNewVolatile
                | Request::SessionAttach { .. }
                | Request::SessionFence { .. }
        ) {
            // The session's journal is the server's own: its files are made
            // with the server's ids, not a caller's the thread last wore
            // (a squashed root could not write the state directory).
            self.creds.wear_own().map_err(End::Io)?;
        }
        let control = match req {
            Request::SessionNew => Some(self.session_new(caps, true)),
            Request::SessionNewVolatile => Some(self.session_new(caps, false)),
            Request::SessionAttach { id, proof } => Some(self.session_attach(caps, id, &proof)),
            _ => None,
        };
        if let Request::SessionFence { owner, epoch } = req {
            match self.session_fence(caps, &owner, epoch) {
                Ok(()) => Reply::Empty.encode(h.op, h.id, &mut self.out),
                Err(e) => encode_errno(e, h.op, h.id, &mut self.out),
            }
            return self.maybe_flush();
        }
        if let Some(r) = control {
            match r {
                Ok(id) => {
                    let lease_ms = u32::try_from(self.common.sessions.lease().as_millis()).unwrap_or(u32::MAX);
                    Reply::Session { id, lease_ms }.encode(h.op, h.id, &mut self.out);
                }
                Err(e) => encode_errno(e, h.op, h.id, &mut self.out),
            }
            return self.maybe_flush();
        }
        // The request borrows `self.body`. Requests of a session run side
        // by side (its connections, and the threads of one); positional
        // data moves without looking at anything but the handle.
        let now = self.joined_gen.load(std::sync::atomic::Ordering::Acquire);
        let session = match &self.mine {
            Some((at, s)) if *at == now => Arc::clone(s),
            _ => {
                let Some(s) = lock(&self.joined).session.clone() else {
                    return self.queue_error(h, Errno::INVAL, "no session yet");
                };
                self.mine = Some((now, Arc::clone(&s)));
                s
            }
        };
        if let Some(f) = session.fence() {
            match fenced(&f, &mut self.creds, self.common.fences.as_deref()) {
                Ok(false) => {}
                Ok(true) => return self.fenced_out(h),
                Err(e) => return self.queue_error(h, e, "the session's fence record cannot be read"),
            }
        }
        let holder = session.lease.get().cloned();
        if let Some(l) = &holder {
            l.heard(&self.common.leases);
        }
        if let Request::LeaseOn = req {
            return self.lease_on(h, caps, &session);
        }
        match req {
            Request::LocalAddr => return self.local_addr(h, caps),
            Request::FileFd { handle } => return self.lend_fd(h, caps, &session, handle),
            _ => {}
        }
        let leases = Arc::clone(&self.common.leases);
        if let Some(got) = session.bulk_file(&req) {
            let touched = match req {
                Request::Pwrite { .. } if leases.active() => crate::touches::before(&session, &req),
                _ => Vec::new(),
            };
            let early_ok = crate::touches::may_break_early(&session, &req, None);
            let early = leases.begin_change(holder.as_ref(), if early_ok { &touched } else { &[] });
            // A write is its caller's (or the anonymous user's): the kernel
            // clears set-id bits for anyone but root. A read checks nothing.
            if let Ok(Some(c)) = self.creds_for(&session, caps, h.flags, &req) {
                self.creds.wear(&c).map_err(End::Io)?;
            }
            let file;
            let answer = match (got, req) {
                (Err(e), _) => Err(e),
                (Ok((f, n)), Request::Pread { offset, .. }) => {
                    file = f;
                    self.common.backend.read(&file, offset, n).map(Some)
                }
                (Ok((f, n)), Request::Pwrite { offset, data, .. }) => {
                    self.common.backend.write(&f, offset, data).map(|_| None).inspect(|_| {
                        Reply::Written { count: n as u32 }.encode(h.op, h.id, &mut self.out);
                    })
                }
                _ => Err(Errno::INVAL),
            };
            return match answer {
                Ok(Some(data)) => {
                    encode_data_header(h.op, h.id, data.len(), &mut self.out);
                    self.send_data(data)
                }
                Ok(None) => {
                    early.finish(holder.as_ref(), &touched);
                    self.maybe_flush()
                }
                Err(e) => {
                    early.finish(holder.as_ref(), &[]);
                    encode_errno(e, h.op, h.id, &mut self.out);
                    self.maybe_flush()
                }
            };
        }
        if let Request::Fsync { handle, datasync } = req {
            // Every write the session sent before has run: the commit
            // covers them, and waits for the disk beside what follows.
            if let Ok(file) = session.file_of(handle) {
                if lock(&self.commits).start(&self.tx, h.op, h.id, file, datasync).is_ok() {
                    return self.maybe_flush();
                }
            }
        }
        if let Request::Caller { slot, uid, gid, groups } = req {
            let named = match &self.common.cfg.identity {
                Some(p) if caps & caps::IDENTITY != 0 => {
                    if uid == 0 && p.squash_root {
                        lock(&self.squashed).insert(slot);
                    } else {
                        lock(&self.squashed).remove(&slot);
                    }
                    p.resolve(uid, gid, ferry_proto::caller_groups(groups)).and_then(|c| {
                        // Ids the kernel will not give a thread (outside
                        // this user namespace's map) are refused here, not
                        // at the request that would wear them.
                        self.creds.wear(&c).map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EINVAL)))?;
                        session.name_caller(slot, c)
                    })
                }
                _ => Err(Errno::NOSYS),
            };
            match named {
                Ok(()) => Reply::Empty.encode(h.op, h.id, &mut self.out),
                Err(e) => encode_errno(e, h.op, h.id, &mut self.out),
            }
            return self.maybe_flush();
        }
        // An append is a change that must not run twice too: where it
        // lands depends on what ran before it.
        let once = caps & ferry_proto::caps::REPLAY != 0 && (req.once_only() || session.appends(&req));
        let digest = if once { crate::replay::digest_of(&req, body) } else { 0 };
        // Held from the look into the reply cache to the reply kept.
        let mut guard = once.then(|| session.once());
        let mut run = None;
        if let Some(g) = &guard {
            match g.replies.get(h.id, h.op, digest) {
                // Kept by a previous server process: the file it created
                // is opened again (its handle died with that process).
                Some((_, true)) if crate::replay::without_create(&req).is_some() => {
                    run = crate::replay::without_create(&req);
                }
                Some((frame, _)) => {
                    // Sent again after a lost connection: done already.
                    self.out.extend_from_slice(frame);
                    drop(guard);
                    return self.maybe_flush();
                }
                None => {}
            }
        }
        // Who the request is for, before anything runs (a reply kept for a
        // request sent again is given whoever asks: it ran already): an
        // unknown slot is named again by the client, and the request sent
        // again.
        let creds = match self.creds_for(&session, caps, h.flags, &req) {
            Ok(c) => c,
            Err(e) => {
                drop(guard);
                let slot = h.flags;
                return self.queue_error(h, e, &format!("caller slot {slot} is not named in this session"));
            }
        };
        let unknown = match guard.as_mut() {
            Some(g) if run.is_none() => g.replies.take_unknown(h.id, h.op, digest),
            _ => None,
        };
        let settled = unknown.is_some();
        if !settled && run.is_none() {
            if let Some(log) = guard.as_mut().and_then(|g| g.log.as_mut()) {
                self.creds.wear_own().map_err(End::Io)?;
                // An append notes where the file ended: after a restart,
                // its data found from there on means it ran.
                let note = match &req {
                    Request::Write { handle, .. } => session.end_of(*handle).map(u64::to_le_bytes),
                    _ => None,
                };
                log.intent(h.id, h.op, digest, note.as_ref().map_or(&[][..], |n| &n[..]));
            }
        }
        // An append a dead server process started: done if its data is in
        // the file past where the file ended before it.
        let appended = match (&req, unknown.as_deref().map(<[u8; 8]>::try_from)) {
            (Request::Write { handle, data }, Some(Ok(end))) => {
                self.creds.wear_own().map_err(End::Io)?;
                session.appended_since(*handle, u64::from_le_bytes(end), data).then_some(data.len())
            }
            _ => None,
        };
        // A file opened again by the id the server gave this session is
        // found first, as the server (a kernel file handle needs it); it is
        // opened with the caller's ids below.
        let found = match &req {
            Request::Reopen { .. } => {
                self.creds.wear_own().map_err(End::Io)?;
                session.locate(&req)
            }
            _ => None,
        };
        if let Some(c) = &creds {
            self.creds.wear(c).map_err(End::Io)?;
        }
        // Leases: the sequence before it runs (a grant for something
        // changed meanwhile is refused), and what it will change, looked
        // up as its caller before it does.
        let seen = holder.as_ref().filter(|_| self.leases_here.load(Relaxed)).map(|_| leases.seq());
        let mut touched = if leases.active() { crate::touches::before(&session, &req) } else { Vec::new() };
        // Their holders' breaks go out now: the break's round trip runs
        // beside the change, which is acknowledged once both are done.
        let early_ok =
            !touched.is_empty() && crate::touches::may_break_early(&session, &req, creds.as_ref().map(|c| c.uid));
        let early = leases.begin_change(holder.as_ref(), if early_ok { &touched } else { &[] });
        let first = match &req {
            _ if appended.is_some() => Ok(Answer::Written(appended.unwrap_or(0) as u32)),
            Request::Reopen { .. } => session.reopen(&req, found),
            _ => session.execute(run.as_ref().unwrap_or(&req)),
        };
        let refused = matches!(first, Err(Errno(libc::EPERM)));
        let mut answer = match (&creds, &req) {
            // Refused to a caller who may clear set-id bits all the same:
            // the file is opened for writing as the caller (the proof),
            // and only that descriptor is changed, as the server.
            (Some(_), Request::Chmod { target, mode }) if refused => {
                drop(first);
                match session.setid_file(target, *mode) {
                    Some(file) => {
                        self.creds.wear_own().map_err(End::Io)?;
                        self.common.backend.chmod(crate::backend::Node::File(&file), *mode).map(Answer::Attr)
                    }
                    None => Err(Errno::PERM),
                }
            }
            _ => first,
        };
        if settled {
            // Started by a server process that died before answering: if
            // it finished, this second run says so, and the state found
            // answers for the first.
            if let (Err(e), Some((done, instead))) = (&answer, crate::replay::settled(&req)) {
                if e.0 == done {
                    answer = session.execute(&instead);
                }
            }
        }
        let mut out = std::mem::take(&mut self.out);
        if let (Err(Errno::NOENT), Some(seen), Some(l)) = (&answer, seen, &holder) {
            if let Some(k) = crate::touches::granted_on_miss(&session, &req) {
                leases.grant_into(l, &[k], seen, 0, &mut out);
            }
        }
        let own = match &answer {
            Ok(a) => {
                if leases.active() {
                    let more = crate::touches::changed_in(&req, a).map(crate::leases::Touched::Object);
                    if let Some(t) = more.filter(|t| !touched.contains(t)) {
                        touched.push(t);
                    }
                }
                early.finish(holder.as_ref(), &touched)
            }
            // Nothing changed; the early breaks are waited for all the same.
            Err(_) => early.finish(holder.as_ref(), &[]),
        };
        if let Ok(a) = &answer {
            if let (Some(seen), Some(l)) = (seen, &holder) {
                leases.grant_into(l, &crate::touches::granted(a), seen, own, &mut out);
            }
        }
        let start = out.len();
        match answer {
            Ok(Answer::Read(cursor, n)) => match self.common.backend.read(cursor.file(), cursor.offset(), n) {
                Ok(data) => {
                    cursor.advance(data.len());
                    encode_data_header(h.op, h.id, data.len(), &mut out);
                    self.out = out;
                    return self.send_data(data);
                }
                Err(e) => encode_errno(e, h.op, h.id, &mut out),
            },
            Ok(a) => encode_answer(a, h.op, h.id, &mut out),
            Err(e) if creds.is_some() && is_denial(e) && lock(&self.squashed).contains(&h.flags) => {
                self.squashed_refusal(e, h.op, h.id, &mut out)
            }
            Err(e) => encode_errno(e, h.op, h.id, &mut out),
        }
        if let Some(g) = guard.as_mut() {
            let frame = out[start..].to_vec();
            if g.log.is_some() {
                self.creds.wear_own().map_err(End::Io)?;
            }
            let g = &mut **g;
            if let Some(log) = g.log.as_mut() {
                log.reply(h.id, h.op, digest, &frame, g.replies.iter(), crate::replay::KEPT);
            }
            g.replies.keep(h.id, h.op, digest, frame);
        }
        drop(guard);
        self.out = out;
        self.maybe_flush()
    }

    /// Whom a request acts for on a server that acts as callers (`None`:
    /// the server acts as itself for everyone, or the request checks
    /// nothing). Never the server's own ids, and never the client's choice
    /// whether to say: a session without `IDENTITY` and a request naming no
    /// slot act as the anonymous user (PROTOCOL.md 8.8).
    fn creds_for(
        &self,
        session: &Session<B>,
        caps: u64,
        slot: u16,
        req: &Request<'_>,
    ) -> Result<Option<crate::identity::Creds>, Errno> {
        use crate::identity::ActsAs;
        let Some(p) = &self.common.cfg.identity else { return Ok(None) };
        let kind = crate::identity::acts_as(req);
        if kind == ActsAs::Any {
            return Ok(None);
        }
        if caps & caps::IDENTITY == 0 || slot == 0 {
            return Ok(Some(p.nobody_named()));
        }
        match session.caller(slot) {
            Ok(c) => Ok(Some(c)),
            // Named again by the client, and the request sent again.
            Err(e) if kind == ActsAs::Caller => Err(e),
            // A handle's request goes on as whoever may use it.
            Err(_) => Ok(Some(p.nobody_named())),
        }
    }

    /// `LeaseOn`: leases for the session, their breaks on this connection.
    fn lease_on(&mut self, h: Header, caps: u64, session: &Shared<B>) -> Result<(), End> {
        if caps & caps::LEASES == 0 {
            return self.queue_error(h, Errno::NOSYS, "leases are not offered");
        }
        let tx = self.tx.try_clone().map_err(End::Io)?;
        let leases = &self.common.leases;
        leases.turn_on(&session.lease, tx, Arc::clone(&self.wlock));
        self.leases_here.store(true, Relaxed);
        let ms = u32::try_from(leases.time().as_millis()).unwrap_or(u32::MAX);
        Reply::LeaseTime { ms }.encode(h.op, h.id, &mut self.out);
        self.maybe_flush()
    }

    /// `LocalAddr`: where a client on this host finds the server without
    /// the network, and the process id it will see there.
    fn local_addr(&mut self, h: Header, caps: u64) -> Result<(), End> {
        match &self.common.cfg.local_addr {
            Some(a) if caps & caps::SAME_HOST != 0 => {
                Reply::LocalAddr { pid: std::process::id(), addr: a.as_bytes() }.encode(h.op, h.id, &mut self.out);
                self.maybe_flush()
            }
            _ => self.queue_refusal(h, Errno::NOSYS, "this server listens on no Unix socket"),
        }
    }

    /// `FileFd`: passes the descriptor of a regular file's handle to a
    /// client on this host that could open the file itself anyway — a
    /// process of the server's own user, or root — so handing it over
    /// grants nothing the peer's credentials do not: not the export's
    /// confinement (the file is one the session opened inside it), nor the
    /// read-only policy (the descriptor is opened as the handle was).
    fn lend_fd(&mut self, h: Header, caps: u64, session: &Shared<B>, handle: u64) -> Result<(), End> {
        if caps & caps::SAME_HOST == 0 {
            return self.queue_refusal(h, Errno::NOSYS, "same-host data path not offered");
        }
        // The real uid: a root server's thread wears the caller's effective
        // uid while it runs a request (`identity.rs`), and judged by that,
        // every user was "the server's own" — another user got descriptors
        // (found with issue 34's writers). The real uid stays the server's.
        let own = rustix::process::getuid().as_raw();
        match self.tx.peer_cred() {
            Some((_, uid)) if uid == 0 || uid == own => {}
            Some(_) => {
                self.common.metrics.descriptors_refused.fetch_add(1, Relaxed);
                return self.queue_refusal(h, Errno::PERM, "descriptors go only to the server's own user or root");
            }
            None => return self.queue_refusal(h, Errno::OPNOTSUPP, "descriptors are passed on a Unix socket only"),
        }
        let lent = session.lend(handle, &self.common.leases);
        let (file, writable) = match lent {
            Ok((file, writable, key)) => {
                if writable {
                    // What it is written through from now on is not seen.
                    let holder = session.lease.get().cloned();
                    self.common.leases.changed(holder.as_ref(), &[crate::leases::Touched::Object(key)]);
                }
                (file, writable)
            }
            Err(e) => {
                encode_errno(e, h.op, h.id, &mut self.out);
                return self.maybe_flush();
            }
        };
        let Some(fd) = self.common.backend.fd_of(&file) else {
            return self.queue_refusal(h, Errno::OPNOTSUPP, "no descriptor for this file (not a regular file on disk)");
        };
        self.flush()?;
        let mut frame = Vec::new();
        let _g = lock(&self.wlock);
        Reply::FileFd { seq: self.fds_sent.load(Relaxed), writable }.encode(h.op, h.id, &mut frame);
        let sent = self.tx.send_with_fd(&frame, fd).map_err(End::Io)?;
        self.fds_sent.fetch_add(1, Relaxed);
        self.common.metrics.descriptors_lent.fetch_add(1, Relaxed);
        (&*self.tx).write_all(&frame[sent..]).map_err(End::Io)
    }

    /// An error reply to a well-formed request the server will not run.
    /// A refusal to a client's root acting as the anonymous user: the
    /// reply says why (the CLI shows it), and the log says so once a
    /// minute at most.
    fn squashed_refusal(&self, e: Errno, op: u16, id: u64, out: &mut Vec<u8>) {
        FAILED.with(|f| f.set(true));
        let anon = self.common.cfg.identity.as_ref().map_or(65534, |p| p.anon_uid);
        static LAST: AtomicU64 = AtomicU64::new(0);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let last = LAST.load(Relaxed);
        if now.saturating_sub(last) >= 60 && LAST.compare_exchange(last, now, Relaxed, Relaxed).is_ok() {
            tracing::warn!(
                peer = %self.peer,
                "refused a client's root, which acts here as uid {anon} (root squash): serve with \
                 --no-root-squash on a machine of your own, or run ferry serve as your own user \
                 (said once a minute at most)"
            );
        }
        let msg = format!(
            "{} (the server squashes root: this client's root acts there as uid {anon}; start ferry serve \
             with --no-root-squash on a machine of your own, or run it as your own user)",
            io::Error::from_raw_os_error(e.0).to_string().split(" (os error").next().unwrap_or_default()
        );
        ErrorReply { errno: e.0 as u32, message: &msg }.encode(op, id, out);
    }

    fn queue_refusal(&mut self, h: Header, e: Errno, msg: &str) -> Result<(), End> {
        ErrorReply { errno: e.0 as u32, message: msg }.encode(h.op, h.id, &mut self.out);
        self.maybe_flush()
    }

    fn queue_error(&mut self, h: Header, e: Errno, msg: &str) -> Result<(), End> {
        FAILED.with(|f| f.set(true));
        tracing::warn!(peer = %self.peer, "bad request (op {}): {msg}", h.op);
        ErrorReply { errno: e.0 as u32, message: msg }.encode(h.op, h.id, &mut self.out);
        self.maybe_flush()
    }

    /// Replies wait while more requests are already buffered, so a burst of
    /// small requests gets one `write` back.
    fn maybe_flush(&mut self) -> Result<(), End> {
        if !self.more || self.out.len() >= OUT_FLUSH {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), End> {
        send_out(&self.tx, &self.wlock, &mut self.out)
    }

    /// Sends queued replies plus the header already appended, then the data.
    fn send_data(&mut self, data: ReadData<'_>) -> Result<(), End> {
        count_sent(data.len());
        match data {
            ReadData::Bytes(b) => {
                self.out.extend_from_slice(&b);
                self.flush()
            }
            // Nothing to send after the header: MSG_MORE would hold it back
            // until the kernel's cork timer (200 ms) fires.
            ReadData::Fd { len: 0, .. } => self.flush(),
            ReadData::Fd { fd, offset, len } if self.tx.tls().is_some() => {
                // Under TLS the data is sealed on its way: read, then sent.
                let _g = lock(&self.wlock);
                seal_file(&self.tx, &mut self.out, fd, offset, len).map_err(End::Io)
            }
            ReadData::Fd { fd, offset, len } => {
                let _g = lock(&self.wlock);
                send_more(&self.tx, &self.out).map_err(End::Io)?;
                self.out.clear();
                sendfile_all(&self.tx, fd, offset, len).map_err(End::Io)
            }
        }
    }
}

/// Answers a connection the server will not serve (over the connection
/// limit): reads its `Hello` (briefly), replies with an error saying why,
/// and closes after the client had time to read it. Runs on a thread of its
/// own so a flood of such connections never delays `accept`.
pub fn refuse(mut stream: Socket, errno: i32, msg: &str) {
    let wait = Some(std::time::Duration::from_secs(2));
    if stream.set_read_timeout(wait).is_err() || stream.set_write_timeout(wait).is_err() {
        return;
    }
    let mut hb = [0u8; HEADER_LEN];
    if stream.read_exact(&mut hb).is_err() {
        return;
    }
    let h = Header::decode(&hb);
    let mut sink = [0u8; 1024];
    let mut left = (h.len as usize).min(HANDSHAKE_MAX_FRAME as usize);
    while left > 0 {
        match stream.read(&mut sink[..left.min(1024)]) {
            Ok(0) | Err(_) => return,
            Ok(n) => left -= n,
        }
    }
    let mut out = Vec::new();
    ErrorReply { errno: errno as u32, message: msg }.encode(op::HELLO, h.id, &mut out);
    if stream.write_all(&out).is_err() {
        return;
    }
    // Closing with unread input would reset the connection and could
    // discard the reply before the client reads it: half-close, drain.
    let _ = stream.shutdown_write();
    while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
}

/// Writes the replies gathered in `out`, under the socket's write lock, and
/// empties it. (A free function: a caller may hold the request, which
/// borrows another field of its `Conn`.)
fn send_out(tx: &Socket, wlock: &Mutex<()>, out: &mut Vec<u8>) -> Result<(), End> {
    if !out.is_empty() {
        let _g = lock(wlock);
        (&*tx).write_all(out).map_err(End::Io)?;
        out.clear();
    }
    Ok(())
}

/// A request counted running while this lives.
struct Turn {
    turns: Arc<Turns>,
    ticket: u64,
}

impl Turn {
    fn start(turns: &Arc<Turns>, kind: Kind) -> Turn {
        Turn { turns: Arc::clone(turns), ticket: turns.start(kind) }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.turns.end(self.ticket);
    }
}

/// The header of a `Data` reply whose `len` bytes the caller sends next.
fn encode_data_header(op: u16, id: u64, len: usize, out: &mut Vec<u8>) {
    Reply::Data(&[]).encode(op, id, out);
    let at = out.len() - HEADER_LEN;
    out[at..at + 4].copy_from_slice(&(len as u32).to_le_bytes());
}

thread_local! {
    /// Set when this thread encodes an error reply; read and cleared by the
    /// request's `Counted`. Thread-local: one request at a time per
    /// connection thread.
    static FAILED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// File data sent for the request being served.
    static SENT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts one request in the metrics when dropped, whichever way its
/// serving ends.
struct Counted {
    metrics: Arc<crate::metrics::Metrics>,
    op: u16,
    bytes_in: u64,
    start: Instant,
}

impl Counted {
    fn start(metrics: &Arc<crate::metrics::Metrics>, op: u16, bytes_in: u64) -> Self {
        FAILED.with(|f| f.set(false));
        SENT.with(|s| s.set(0));
        Counted { metrics: Arc::clone(metrics), op, bytes_in, start: Instant::now() }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let (failed, sent) = (FAILED.with(|f| f.get()), SENT.with(|s| s.get()));
        self.metrics.ops.request(self.op, self.start.elapsed(), failed, self.bytes_in, sent);
    }
}

/// Counts file data sent for the request being served.
fn count_sent(n: usize) {
    SENT.with(|s| s.set(s.get() + n as u64));
}

/// An error reply saying `e` in words.
/// A refusal for want of rights.
fn is_denial(e: Errno) -> bool {
    e.0 == libc::EACCES || e.0 == libc::EPERM
}

fn encode_errno(e: Errno, op: u16, id: u64, out: &mut Vec<u8>) {
    FAILED.with(|f| f.set(true));
    let msg = io::Error::from_raw_os_error(e.0).to_string();
    ErrorReply { errno: e.0 as u32, message: &msg }.encode(op, id, out);
}

fn encode_answer<F>(a: Answer<F>, op: u16, id: u64, out: &mut Vec<u8>) {
    match a {
        Answer::Empty => Reply::Empty.encode(op, id, out),
        Answer::Opened { handle, attr } => Reply::Opened { handle, attr }.encode(op, id, out),
        Answer::OpenedId { handle, attr, id: file } => Reply::OpenedId { handle, attr, id: &file }.encode(op, id, out),
        Answer::OpenedData { handle, attr, id: file, data } => {
            Reply::OpenedData { handle, attr, id: &file, data: &data }.encode(op, id, out)
        }
        Answer::OpenedCached { handle, attr, id: file, change, policy, from, data } => {
            Reply::OpenedCached { handle, attr, id: &file, change, policy, from: &from, data: &data }
                .encode(op, id, out)
        }
        Answer::CachePolicy { policy, from } => Reply::CachePolicy { policy, from: &from }.encode(op, id, out),
        Answer::Read(..) => unreachable!("reads are sent by send_data"),
        Answer::Written(count) => Reply::Written { count }.encode(op, id, out),
        Answer::Offset(offset) => Reply::Offset { offset }.encode(op, id, out),
        Answer::Attr(a) => Reply::Attr(a).encode(op, id, out),
        Answer::Name(n) => Reply::Name(&n).encode(op, id, out),
        Answer::StatFs(s) => Reply::StatFs(s).encode(op, id, out),
        Answer::Xattr { size, value } => Reply::Xattr { size, value: &value }.encode(op, id, out),
        Answer::Dir { eof, entries } => Reply::Dir { eof, entries }.encode(op, id, out),
        Answer::Lock { typ, start, len, pid } => Reply::Lock { typ, start, len, pid }.encode(op, id, out),
    }
}

/// Writes `buf` with `MSG_MORE`, so the header leaves in the same segment
/// as the data `sendfile` sends next.
fn send_more(sock: &Socket, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        let n = rustix::net::send(sock, buf, rustix::net::SendFlags::MORE)?;
        buf = &buf[n..];
    }
    Ok(())
}

/// Sends the replies in `out`, then `len` bytes of `fd` from `offset`,
/// through the TLS records of `sock`: no `sendfile`, the data must pass
/// through the sealing. Zeros for what a shrunk file no longer has.
fn seal_file(
    sock: &Socket,
    out: &mut Vec<u8>,
    fd: std::os::fd::BorrowedFd<'_>,
    mut offset: u64,
    len: usize,
) -> io::Result<()> {
    const CHUNK: usize = 256 * 1024;
    let mut left = len;
    let mut buf = vec![0u8; CHUNK.min(len)];
    // The queued replies and the header go with the first chunk.
    let mut head = std::mem::take(out);
    while left > 0 {
        let want = left.min(CHUNK);
        let mut got = 0;
        while got < want {
            match rustix::io::pread(fd, &mut buf[got..want], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        buf[got..want].fill(0);
        sock.write_parts(&[&head, &buf[..want]])?;
        head.clear();
        offset += want as u64;
        left -= want;
    }
    *out = head;
    Ok(())
}

/// `sendfile`s exactly `len` bytes. If the file shrank since the length was
/// announced, the rest is zeros: the frame must stay whole.
fn sendfile_all(sock: &Socket, fd: std::os::fd::BorrowedFd<'_>, mut offset: u64, len: usize) -> io::Result<()> {
    let mut left = len;
    while left > 0 {
        let n = rustix::fs::sendfile(sock.as_fd(), fd, Some(&mut offset), left)?;
        if n == 0 {
            let zeros = vec![0u8; left.min(1 << 20)];
            while left > 0 {
                let k = left.min(zeros.len());
                (&*sock).write_all(&zeros[..k])?;
                left -= k;
            }
            break;
        }
        left -= n;
    }
    Ok(())
}

/// Whether a session (fence `f`) is fenced: known so, or its record read
/// again when its last read began `RECHECK` ago or more (a gateway stopped
/// or stuck while its client moved always did).
fn fenced(
    f: &crate::fence::Fence,
    creds: &mut crate::identity::ThreadCreds,
    fences: Option<&crate::fence::Fences>,
) -> Result<bool, Errno> {
    if f.known_fenced() {
        return Ok(true);
    }
    if let Some(known) = f.recent() {
        return Ok(known);
    }
    let Some(fences) = fences else { return Ok(false) };
    // The records are the server's own, whoever the thread acted for.
    creds.wear_own().map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EIO)))?;
    fences.is_fenced(f)
}
