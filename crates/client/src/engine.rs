//! The RPC engine: one connection, many requests in flight, replies matched
//! by id (ATOMIC's single-threaded engine rather than a thread per request).
//!
//! No thread of its own: whichever caller needs a reply reads the socket
//! (the "reader" role, held by one caller at a time). A reply for the reader
//! itself lands straight in its buffer; a reply for another caller is kept
//! until that caller asks for it. The send side is a plain locked socket, so
//! write data goes from the caller's buffer to the kernel with `writev`.

use std::collections::{HashMap, HashSet};
use std::io::{self, BufReader, IoSlice, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferry_sock::{Addr, Socket};

use ferry_proto::handshake::{ClientError, ClientHandshake, ClientOffer};
use ferry_proto::{op, ErrorReply, Header, Nonce, Reply, Request, Welcome, HEADER_LEN, VERSION_MAX, VERSION_MIN};

use crate::error::{Error, Result};

/// Receive buffer: holds many small replies, but only a sliver of a large
/// read reply, whose data goes straight into the caller's buffer.
const RX_BUF: usize = 8 * 1024;

/// Largest reply body this client accepts (announced in `Hello`).
pub const CLIENT_MAX_FRAME: u32 = 64 * 1024 * 1024 + 4096;

/// Data channels a client opens by default (`Options::data_channels`).
pub const DATA_CHANNELS: u32 = 1;
/// Transfer size from which data goes on a data channel.
pub const DATA_THRESHOLD: usize = 256 * 1024;

/// Connection settings.
#[derive(Clone, Debug)]
pub struct Options {
    pub token: Option<Vec<u8>>,
    /// Capabilities to offer; the session uses those both sides have.
    pub caps: u64,
    /// Requests kept in flight at most (the server's grant caps it).
    pub window: u32,
    pub connect_timeout: Duration,
    /// How long the whole handshake (hello, welcome, authentication) may
    /// take: a listener that accepts and never answers is reported, not
    /// waited on for ever.
    pub handshake_timeout: Duration,
    /// Versions to offer (tests use it to play an incompatible peer).
    pub versions: (u16, u16),
    /// Where the connection's descriptor goes, before the handshake: given
    /// the socket, returns the descriptor to use instead (the preload
    /// library moves it to a high, close-on-exec number, out of the
    /// program's way). `None` keeps the number `socket` gave.
    pub place_fd: Option<PlaceFd>,
    /// Reconnect when the connection is lost, for at most this long, then
    /// give up with `EIO`; `None`: a lost connection stays lost (errors).
    /// With it the client keeps its state in a session, so a reconnect to
    /// the same server instance finds its open files again.
    pub reconnect: Option<Duration>,
    /// With `reconnect`: whether the session keeps open files and locks
    /// for its lease when the connection is lost (`true`), or only the
    /// replies of requests that must not run twice (`false`: a killed
    /// process's locks must go with its connection; files are opened again
    /// after every reconnect).
    pub session_keeps_handles: bool,
    /// Longest path a request may carry: `ferry_proto::MAX_PATH` (paths
    /// from the export root may exceed `PATH_MAX`); the preload library
    /// asks `PATH_MAX - 1`, the limit of a program's own path argument.
    pub max_path: usize,
    /// The local data cache (`Cache::from_env` gives the one the mount,
    /// `ferry run` and the CLI use); `None`: nothing is cached, whatever
    /// the server's policy says.
    pub cache: Option<std::sync::Arc<crate::cache::Cache>>,
    /// Further connections joined to the session for bulk positional reads
    /// and writes (0: none, everything on the one connection). Used only
    /// with a server offering `DATA_CHANNELS`.
    pub data_channels: u32,
    /// Transfers of at least this many bytes go on a data channel, and so
    /// do all read-ahead requests.
    pub data_threshold: usize,
    /// With a server on this host that offers `SAME_HOST`: move file data
    /// over its Unix socket and through descriptors it passes, instead of
    /// TCP (`FERRY_SAME_HOST=0` turns it off in the CLI and the mount).
    pub same_host: bool,
    /// Where to count this client's requests (by operation: how many,
    /// failed, bytes, latency), for `ferry mount --metrics`.
    pub metrics: Option<Arc<ferry_metrics::Ops>>,
    /// TLS: `Some(true)` always, `Some(false)` never, `None` off loopback
    /// only (and on loopback when the server requires it). See `tls.rs`.
    pub tls: Option<bool>,
    /// Whom TLS trusts (`tls.rs`); [`Options::tls_from_env`] fills it.
    pub trust: crate::tls::Trust,
    /// Of several gateways (with `reconnect`): how long a request may go
    /// unanswered — no byte of any reply, or no byte of it sent — before
    /// the client takes its gateway for hung and moves to the next, as
    /// when the connection is lost. Only from a gateway that fences
    /// (capability `FENCE`): it refuses the moved session's requests if it
    /// wakes. Zero: wait for it as long as it takes (as for a single
    /// server, always). `FERRY_GATEWAY_TIMEOUT` (seconds) sets it.
    pub gateway_timeout: Duration,
}

/// `Options::gateway_timeout` by default.
pub const GATEWAY_TIMEOUT: Duration = Duration::from_secs(5);

/// Moves a descriptor: given the current one, returns a new descriptor for
/// the same socket (the old one is closed afterwards).
pub type PlaceFd = fn(BorrowedFd<'_>) -> io::Result<OwnedFd>;

impl Options {
    /// These options with the data path's settings from the environment,
    /// as the CLI, the mount and the benchmarks' workers take them:
    /// `FERRY_DATA_CHANNELS` (a count, 0: none), `FERRY_DATA_THRESHOLD`
    /// (bytes) and `FERRY_SAME_HOST` (`0`: off).
    pub fn data_path_from_env(mut self) -> std::result::Result<Options, String> {
        if let Ok(v) = std::env::var("FERRY_DATA_CHANNELS") {
            self.data_channels =
                v.parse().map_err(|_| format!("FERRY_DATA_CHANNELS={v}: expected a count (0: none)"))?;
        }
        self = self.gateways_from_env()?;
        if let Ok(v) = std::env::var("FERRY_DATA_THRESHOLD") {
            self.data_threshold = v.parse().map_err(|_| format!("FERRY_DATA_THRESHOLD={v}: expected bytes"))?;
        }
        match std::env::var("FERRY_SAME_HOST").as_deref() {
            Ok("0") => self.same_host = false,
            Ok("1") | Err(_) => {}
            Ok(v) => return Err(format!("FERRY_SAME_HOST={v}: expected 0 or 1")),
        }
        self.tls_from_env()
    }

    /// These options with `FERRY_GATEWAY_TIMEOUT` (seconds a request may go
    /// unanswered before the client leaves its gateway for another; 0:
    /// never) from the environment.
    pub fn gateways_from_env(mut self) -> std::result::Result<Options, String> {
        if let Ok(v) = std::env::var("FERRY_GATEWAY_TIMEOUT") {
            let secs = v.parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e9);
            let secs = secs.ok_or_else(|| format!("FERRY_GATEWAY_TIMEOUT={v}: expected seconds (0: never)"))?;
            self.gateway_timeout = Duration::from_secs_f64(secs);
        }
        Ok(self)
    }

    /// These options with TLS's settings from the environment: `FERRY_TLS`
    /// (`1`: for every address, `0`: never), `FERRY_TLS_CA`,
    /// `FERRY_TLS_FINGERPRINT`, and where first-seen certificates are kept
    /// (`$XDG_CONFIG_HOME/ferry/known_servers`). Read here, once, and never
    /// while connecting: a process's environment lock may be held by a
    /// thread a `fork` left behind (the preload library connects in forked
    /// children).
    pub fn tls_from_env(mut self) -> std::result::Result<Options, String> {
        match std::env::var("FERRY_TLS").as_deref() {
            Ok("1" | "on" | "yes" | "true") => self.tls = Some(true),
            Ok("0" | "off" | "no" | "false") => self.tls = Some(false),
            Ok("") | Err(_) => {}
            Ok(v) => return Err(format!("FERRY_TLS={v}: expected 1 or 0")),
        }
        self.trust = crate::tls::Trust {
            ca: std::env::var_os("FERRY_TLS_CA").filter(|v| !v.is_empty()).map(Into::into),
            fingerprint: std::env::var("FERRY_TLS_FINGERPRINT").ok().filter(|v| !v.is_empty()),
            known_servers: crate::tls::known_servers_file(),
        };
        Ok(self)
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            token: None,
            caps: ferry_proto::caps::ALL,
            window: 16,
            connect_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            versions: (VERSION_MIN, VERSION_MAX),
            place_fd: None,
            reconnect: None,
            session_keeps_handles: true,
            max_path: ferry_proto::MAX_PATH,
            cache: None,
            data_channels: DATA_CHANNELS,
            data_threshold: DATA_THRESHOLD,
            same_host: true,
            metrics: None,
            tls: None,
            trust: crate::tls::Trust::default(),
            gateway_timeout: GATEWAY_TIMEOUT,
        }
    }
}

/// A reply as it came off the wire, for the caller to decode.
pub struct Frame {
    pub op: u16,
    /// Body bytes, unless the data went straight into the caller's buffer.
    pub body: Vec<u8>,
    /// Length of data placed in the caller's buffer (read replies).
    pub data_len: usize,
}

impl Frame {
    pub fn reply(&self) -> Result<Reply<'_>> {
        Reply::decode(self.op, &self.body).map_err(|e| Error::Protocol(e.to_string()))
    }
}

struct Stored {
    header: Header,
    body: Vec<u8>,
}

struct State {
    next_id: u64,
    /// Ids sent and not yet read off the socket, with the bytes they hold.
    outstanding: HashMap<u64, u64>,
    /// With metrics: when each request in flight left, and its size.
    started: HashMap<u64, (Instant, u64)>,
    bytes_outstanding: u64,
    /// Of `outstanding`, the read-ahead (`try_start`): it has slots of its
    /// own, beside the window, so a caller never waits behind it.
    ahead: HashSet<u64>,
    window: u32,
    window_bytes: u64,
    /// Replies read by one caller for another.
    stored: HashMap<u64, Stored>,
    /// Ids whose reply nobody wants (an abandoned prefetch).
    discard: HashSet<u64>,
    reader_busy: bool,
    /// Callers blocked on `cv`.
    waiters: usize,
    dead: Option<Error>,
}

/// The connection's one socket, shared by the send and receive sides; the
/// receive side keeps descriptors the server passes (a Unix socket).
struct Sock(Arc<Socket>, Arc<Mutex<Passed>>);

/// Descriptors received with replies (`FileFd`), by their number on the
/// connection, until their reply's reader takes them.
#[derive(Default)]
struct Passed {
    count: u64,
    kept: HashMap<u64, OwnedFd>,
}

/// Descriptors kept at most: a server passing ones nobody asked for must
/// not exhaust the client's descriptor table.
const PASSED_MAX: usize = 64;

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // No allocation unless descriptors come (a Unix socket only).
        let mut fds = Vec::new();
        let n = self.0.recv_with_fds(buf, &mut fds)?;
        if !fds.is_empty() {
            let mut p = lock(&self.1);
            for fd in fds {
                let seq = p.count;
                p.count += 1;
                if p.kept.len() < PASSED_MAX {
                    p.kept.insert(seq, fd);
                }
            }
        }
        Ok(n)
    }
}

pub struct Engine {
    /// The socket and a frame buffer reused for every request's header.
    tx: Arc<Mutex<(Arc<Socket>, Vec<u8>)>>,
    rx: Mutex<BufReader<Sock>>,
    passed: Arc<Mutex<Passed>>,
    /// A Unix socket (so the server is on this host).
    unix: bool,
    /// Where requests are counted (`Options::metrics`).
    metrics: Option<Arc<ferry_metrics::Ops>>,
    /// The address connected to (one gateway's, of a list).
    addr: String,
    /// The socket's descriptor number, readable without a lock (the
    /// preload library asks it on every `close` of a high descriptor).
    fd: AtomicI32,
    st: Mutex<State>,
    cv: Condvar,
    welcome: Welcome,
    /// This connection's client nonce (the server's is in `welcome`) and
    /// the token: a session's secret derives from them.
    client_nonce: Nonce,
    token: Option<Vec<u8>>,
    max_frame: u32,
    max_path: usize,
    /// The process that connected: after `fork` the child shares the socket
    /// with the parent and must not read its replies.
    pid: rustix::process::Pid,
    /// Bytes of read replies received aside (by a thread other than their
    /// reader, or before it asked) and copied later: zero for one reader
    /// collecting in order, the case every read path keeps to.
    aside: AtomicU64,
    /// The session's leases, once this connection turned them on
    /// (`leases_on`): its breaks come here.
    leases: std::sync::OnceLock<Arc<crate::leases::Leases>>,
    /// How long a request may go unanswered (or unsent) before the
    /// connection counts as lost, in nanoseconds (0: no bound): see
    /// `Options::gateway_timeout`.
    stall: AtomicU64,
    /// Whether the connection was given up for that.
    stalled: std::sync::atomic::AtomicBool,
}

/// A random first request id in [2^32, 2^62): far from the handshake's ids
/// and from every other connection's.
fn id_base() -> u64 {
    let mut b = [0u8; 8];
    // Weak randomness only makes a coincidence of ids likelier.
    let _ = getrandom::getrandom(&mut b);
    (u64::from_le_bytes(b) >> 2) | (1 << 32)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere cannot leave these structures half-updated in a way
    // that matters more than losing the connection, so poison is ignored.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Engine {
    /// Connects, negotiates and authenticates.
    pub fn connect(addr: &str, opts: &Options) -> Result<Engine> {
        let (tls, asked) = crate::tls::wanted(addr, opts.tls);
        match Engine::connect_with(addr, opts, tls) {
            // A server that requires TLS, met without it: again with it,
            // unless TLS was turned off on purpose (never a downgrade: the
            // other way round is refused).
            Err(e) if !tls && e.errno() == libc::ENOPROTOOPT => match asked {
                false => Engine::connect_with(addr, opts, true),
                true => Err(Error::Protocol(format!("{addr} requires TLS, and FERRY_TLS=0 turns it off"))),
            },
            r => r,
        }
    }

    fn connect_with(addr: &str, opts: &Options, tls: bool) -> Result<Engine> {
        let mut stream = Socket::connect(&Addr::parse(addr), opts.connect_timeout).map_err(Error::from_io)?;
        if let Some(place) = opts.place_fd {
            let unix = stream.is_unix();
            stream = Socket::from_fd(place(stream.as_fd()).map_err(Error::from_io)?, unix);
        }
        stream.set_nodelay().map_err(Error::from_io)?;
        // Bounded while we wait for the server's first words; cleared once
        // the handshake is done (requests then wait as long as they need).
        let limit = Some(opts.handshake_timeout.max(Duration::from_millis(1)));
        stream.set_read_timeout(limit).map_err(Error::from_io)?;
        stream.set_write_timeout(limit).map_err(Error::from_io)?;
        let secs = opts.handshake_timeout.as_secs_f64();
        let binding = match tls {
            true => {
                let config = crate::tls::config(addr, &opts.trust)?;
                let est = ferry_sock::tls::client(&stream, config, crate::tls::host_of(addr))
                    .map_err(|e| tls_error(addr, e, secs))?;
                stream.start_tls(est.records);
                Some(est.binding)
            }
            false => None,
        };
        let fd = stream.as_fd().as_raw_fd();
        let unix = stream.is_unix();
        let tx = Arc::new(stream);
        let passed = Arc::default();
        let mut rx = BufReader::with_capacity(RX_BUF, Sock(tx.clone(), Arc::clone(&passed)));
        let mut nonce: Nonce = [0; 32];
        getrandom::getrandom(&mut nonce).map_err(|e| Error::Auth(format!("no randomness: {e}")))?;
        let offer = ClientOffer {
            min_version: opts.versions.0,
            max_version: opts.versions.1,
            caps: opts.caps,
            max_frame: CLIENT_MAX_FRAME,
            token: opts.token.clone(),
            binding,
        };
        let mut out = Vec::new();
        let mut hs = ClientHandshake::start(offer, nonce, &mut out);
        let welcome = loop {
            write_all_vectored(&tx, &out, &[]).map_err(|e| handshake_io(e, secs))?;
            out.clear();
            let mut hb = [0u8; HEADER_LEN];
            let got = read_full(&mut rx, &mut hb).map_err(|e| handshake_io(e, secs))?;
            let h = hs.header(&hb[..got]).map_err(handshake_error)?;
            let mut body = vec![0u8; h.len as usize];
            rx.read_exact(&mut body).map_err(|e| handshake_io(e, secs))?;
            if let Some(w) = hs.receive(&h, &body, &mut out).map_err(handshake_error)? {
                break w;
            }
        };
        // A wait for a reply wakes up after a long silence to say so (see
        // `read_reply`), then goes on waiting.
        tx.set_read_timeout(Some(REPLY_NOTICE)).map_err(Error::from_io)?;
        // A send that cannot go on wakes up now and then to see whether the
        // server hung up meanwhile (see `send_request`).
        tx.set_write_timeout(Some(SEND_CHECK)).map_err(Error::from_io)?;
        let window = opts.window.min(welcome.window_requests).max(1);
        Ok(Engine {
            tx: Arc::new(Mutex::new((tx, Vec::with_capacity(4096)))),
            rx: Mutex::new(rx),
            passed,
            unix,
            metrics: opts.metrics.clone(),
            addr: addr.to_string(),
            fd: AtomicI32::new(fd),
            st: Mutex::new(State {
                // Ids of a client's successive connections never meet: a
                // reply still awaited from a lost connection cannot be
                // taken for a request of the new one.
                next_id: id_base(),
                outstanding: HashMap::new(),
                started: HashMap::new(),
                bytes_outstanding: 0,
                ahead: HashSet::new(),
                window,
                window_bytes: welcome.window_bytes,
                stored: HashMap::new(),
                discard: HashSet::new(),
                reader_busy: false,
                waiters: 0,
                dead: None,
            }),
            cv: Condvar::new(),
            max_frame: welcome.max_frame.min(CLIENT_MAX_FRAME),
            max_path: opts.max_path,
            welcome,
            client_nonce: nonce,
            token: opts.token.clone(),
            pid: rustix::process::getpid(),
            aside: AtomicU64::new(0),
            leases: std::sync::OnceLock::new(),
            stall: AtomicU64::new(0),
            stalled: Default::default(),
        })
    }

    /// Gives up the connection (as lost) when a request goes unanswered or
    /// unsent for `bound` (`None`: waits as long as it takes).
    pub(crate) fn set_stall(&self, bound: Option<Duration>) {
        let nanos = bound.map_or(0, |b| u64::try_from(b.as_nanos()).unwrap_or(u64::MAX).max(1));
        self.stall.store(nanos, Relaxed);
        // A receive wakes up at the bound to give up, or at the notice.
        let wake = bound.map_or(REPLY_NOTICE, |b| b.clamp(Duration::from_millis(10), REPLY_NOTICE));
        let tx = lock(&self.tx);
        let _ = tx.0.set_read_timeout(Some(wake));
        let _ = tx.0.set_write_timeout(Some(bound.map_or(SEND_CHECK, |b| wake.min(SEND_CHECK).min(b))));
    }

    pub(crate) fn stall(&self) -> Option<Duration> {
        let n = self.stall.load(Relaxed);
        (n != 0).then(|| Duration::from_nanos(n))
    }

    /// Whether the connection was given up because its server did not
    /// answer within the bound (`set_stall`).
    pub(crate) fn stalled(&self) -> bool {
        self.stalled.load(Relaxed)
    }

    /// Bytes of read replies received aside and copied (see `aside`).
    pub fn bytes_read_aside(&self) -> u64 {
        self.aside.load(Relaxed)
    }

    /// The connection's descriptor number.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.load(Relaxed)
    }

    /// Moves the connection to the descriptor `place` makes from the current
    /// one, then closes the old number: a program that wants that number
    /// (`dup2` onto it) gets it, and the connection goes on. Waits for a
    /// caller in the middle of a send or a receive. Returns the new number.
    pub fn move_fd(&self, place: impl FnOnce(BorrowedFd<'_>) -> io::Result<OwnedFd>) -> io::Result<RawFd> {
        let mut tx = lock(&self.tx);
        let mut rx = lock(&self.rx);
        let new = Arc::new(tx.0.with_fd(place(tx.0.as_fd())?));
        let fd = new.as_fd().as_raw_fd();
        self.fd.store(fd, Relaxed);
        rx.get_mut().0 = new.clone();
        // The old stream, now unreferenced, closes the old number here.
        tx.0 = new;
        Ok(fd)
    }

    /// Why the connection is gone, if it is: already known failed, or —
    /// looked at without waiting, with one non-blocking `recv(MSG_PEEK)` —
    /// closed by the server (a restarted server did). Then the engine is
    /// dead, and a request not yet sent on it is known never to have reached
    /// anyone.
    /// Whether the connection is known dead (no system call: `gone` looks).
    pub fn is_dead(&self) -> bool {
        lock(&self.st).dead.is_some()
    }

    pub fn gone(&self) -> Option<Error> {
        if let Some(e) = &lock(&self.st).dead {
            return Some(e.clone());
        }
        let closed = {
            let tx = lock(&self.tx);
            let mut b = [0u8; 1];
            let flags = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT;
            match rustix::net::recv(&*tx.0, &mut b, flags) {
                Ok((0, _)) => true,
                Ok(_) => false,
                Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => false,
                Err(_) => true,
            }
        };
        if !closed {
            return None;
        }
        let e = Error::Io {
            kind: io::ErrorKind::ConnectionReset,
            errno: Some(libc::ECONNRESET),
            message: "server closed the connection".into(),
        };
        self.kill(e.clone());
        Some(e)
    }

    /// Whether the connection is a Unix socket (the server is on this host).
    /// The server address this connection went to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn is_unix(&self) -> bool {
        self.unix
    }

    /// The server process at the other end of a Unix socket.
    pub fn peer_pid(&self) -> Option<u32> {
        lock(&self.tx).0.peer_cred().map(|(pid, _)| pid)
    }

    /// The descriptor that came with a `FileFd` reply numbered `seq`.
    pub fn take_passed_fd(&self, seq: u64) -> Option<OwnedFd> {
        lock(&self.passed).kept.remove(&seq)
    }

    pub fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    /// The secret of a session this connection creates (never sent).
    pub fn session_secret(&self) -> [u8; 32] {
        // A server that asks no token derives it from none, whatever the
        // client holds.
        let token = self.token.as_deref().filter(|_| self.welcome.auth_required).unwrap_or_default();
        ferry_proto::session_secret(token, &self.welcome.nonce, &self.client_nonce)
    }

    /// The proof that joins session `id` from this connection.
    pub fn attach_proof(&self, secret: &[u8; 32], id: u64) -> [u8; 32] {
        ferry_proto::attach_proof(secret, id, &self.welcome.nonce, &self.client_nonce)
    }

    pub fn has_cap(&self, bit: u64) -> bool {
        self.welcome.caps & bit != 0
    }

    /// Largest data payload of one read or write request.
    pub fn max_io(&self) -> usize {
        (self.max_frame - 4096) as usize
    }

    /// Changes the number of requests kept in flight (bounded by the grant).
    pub fn set_window(&self, n: u32) {
        let mut st = lock(&self.st);
        st.window = n.clamp(1, self.welcome.window_requests);
        self.cv.notify_all();
    }

    pub fn window(&self) -> u32 {
        lock(&self.st).window
    }

    /// Sends a request once the window has room; returns its id. `reply_bytes`
    /// is what the reply will carry (the read size), for the byte window.
    pub fn start(&self, req: &Request<'_>, reply_bytes: u64) -> Result<u64> {
        self.start_as(req, reply_bytes, None)
    }

    /// `start` for a request no one waits for yet (read-ahead): sent only if
    /// it fits now, in slots of its own (half the server's grant, half the
    /// byte window), so it never waits and never makes a caller wait.
    /// `None`: it did not fit.
    pub fn try_start(&self, req: &Request<'_>, reply_bytes: u64) -> Result<Option<u64>> {
        self.start_with(req, reply_bytes, None, true)
    }

    /// `try_start` for several requests with no bulk data (read-ahead's
    /// `Pread`s): those that fit now, a prefix, go out in one `sendmsg`, so
    /// the server gets them in one segment and one wake-up, not one each.
    /// Returns their ids (empty: none fitted).
    pub fn try_start_many(&self, reqs: &[(Request<'_>, u64)]) -> Result<Vec<u64>> {
        self.same_process()?;
        let mut ids = Vec::with_capacity(reqs.len());
        let mut st = lock(&self.st);
        if let Some(e) = &st.dead {
            return Err(e.clone());
        }
        for (req, reply_bytes) in reqs {
            if !req.bulk().is_empty() || req.check_limits_with(self.max_path).is_err() {
                break;
            }
            if !self.fits_ahead(&st, *reply_bytes) {
                break;
            }
            let id = st.next_id;
            st.next_id += 1;
            self.claim(&mut st, id, *reply_bytes, 0, true);
            ids.push(id);
        }
        drop(st);
        if ids.is_empty() {
            return Ok(ids);
        }
        let sent = {
            let mut tx = lock(&self.tx);
            let (sock, head) = &mut *tx;
            head.clear();
            let slot = crate::caller::slot();
            let slotted = slot != 0 && self.has_cap(ferry_proto::caps::IDENTITY);
            for ((req, _), id) in reqs.iter().zip(&ids) {
                let at = head.len();
                req.encode(*id, head);
                if slotted {
                    ferry_proto::set_caller_slot(&mut head[at..], slot);
                }
            }
            send_request(sock, head, &[], self.stall())
        };
        if let Err(e) = sent {
            return Err(self.send_failed(e, &ids));
        }
        Ok(ids)
    }

    /// `start`, with the id `again` if given: a request sent once more after
    /// a lost connection, which a `REPLAY` server recognises by its id.
    fn start_as(&self, req: &Request<'_>, reply_bytes: u64, again: Option<u64>) -> Result<u64> {
        // Without `spare` it waits for room, so there is always an id.
        Ok(self.start_with(req, reply_bytes, again, false)?.unwrap_or_default())
    }

    fn start_with(&self, req: &Request<'_>, reply_bytes: u64, again: Option<u64>, spare: bool) -> Result<Option<u64>> {
        self.same_process()?;
        // Before taking a window slot: a request Linux would refuse never
        // reaches the encoder, and never holds a slot.
        req.check_limits_with(self.max_path).map_err(|l| Error::remote(l.errno()))?;
        let cost = req.bulk().len() as u64 + reply_bytes;
        let id = {
            let mut st = lock(&self.st);
            loop {
                if let Some(e) = &st.dead {
                    return Err(e.clone());
                }
                if spare {
                    if !self.fits_ahead(&st, cost) {
                        return Ok(None);
                    }
                    break;
                }
                if self.fits(&st, cost) {
                    break;
                }
                st = self.make_progress(st, None, None)?.0;
            }
            let id = again.unwrap_or_else(|| {
                st.next_id += 1;
                st.next_id - 1
            });
            self.claim(&mut st, id, cost, req.bulk().len() as u64, spare);
            id
        };
        let sent = {
            let mut tx = lock(&self.tx);
            let (sock, head) = &mut *tx;
            head.clear();
            req.encode(id, head);
            let slot = crate::caller::slot();
            if slot != 0 && self.has_cap(ferry_proto::caps::IDENTITY) {
                ferry_proto::set_caller_slot(head, slot);
            }
            send_request(sock, head, req.bulk(), self.stall())
        };
        if let Err(e) = sent {
            return Err(self.send_failed(e, &[id]));
        }
        Ok(Some(id))
    }

    /// Waits for the reply to `id`. A data reply goes into `dest` if given
    /// (its length is in `Frame::data_len`); an error reply becomes `Err`.
    pub fn finish(&self, id: u64, mut dest: Option<&mut [u8]>) -> Result<Frame> {
        // No fork check here: `start` has made it for this id already.
        let mut st = lock(&self.st);
        loop {
            if let Some(s) = st.stored.remove(&id) {
                drop(st);
                return deliver(s, dest);
            }
            if let Some(e) = &st.dead {
                return Err(e.clone());
            }
            if !st.outstanding.contains_key(&id) {
                return Err(Error::Protocol(format!("no request {id} in flight")));
            }
            let (g, mine) = self.make_progress(st, Some(id), dest.as_deref_mut())?;
            st = g;
            if let Some(f) = mine {
                return f;
            }
        }
    }

    /// Refuses use from a forked child: its requests would interleave with
    /// the parent's on one socket and either could read the other's replies.
    fn same_process(&self) -> Result<()> {
        if rustix::process::getpid() == self.pid {
            return Ok(());
        }
        Err(Error::Io {
            kind: io::ErrorKind::NotConnected,
            errno: Some(libc::ENOTCONN),
            message: "this connection belongs to the parent process (used after fork); connect again".into(),
        })
    }

    /// Whether a request costing `reply_bytes` would start now without
    /// waiting for a reply. A caller that collects its replies in order
    /// asks first and collects its oldest when there is no room: waiting
    /// inside `start` reads that reply aside, and its data is then copied.
    pub fn has_room(&self, reply_bytes: u64) -> bool {
        self.fits(&lock(&self.st), reply_bytes)
    }

    /// Whether a caller's request costing `cost` may leave now (read-ahead
    /// in flight does not count against the caller's window).
    /// Whether a read-ahead request fits now: the server holds at most
    /// `grant` requests of a connection, and read-ahead takes up to half
    /// of them (and half the byte window), never the last.
    fn fits_ahead(&self, st: &State, cost: u64) -> bool {
        let grant = self.welcome.window_requests as usize;
        st.ahead.len() < grant / 2
            && st.outstanding.len() + 1 < grant
            && st.bytes_outstanding + cost <= st.window_bytes / 2
    }

    /// Counts request `id` outstanding: `cost` bytes of the window, `sent`
    /// of them its bulk data, in read-ahead's slots if `ahead`.
    fn claim(&self, st: &mut State, id: u64, cost: u64, sent: u64, ahead: bool) {
        st.outstanding.insert(id, cost);
        if self.metrics.is_some() || self.leases.get().is_some() {
            st.started.insert(id, (Instant::now(), sent));
        }
        st.bytes_outstanding += cost;
        if ahead {
            st.ahead.insert(id);
        }
    }

    /// The requests `ids` could not be sent: none of them is outstanding,
    /// and the connection is dead with the error returned.
    fn send_failed(&self, e: io::Error, ids: &[u64]) -> Error {
        if e.kind() == io::ErrorKind::TimedOut {
            self.stalled.store(true, Relaxed);
        }
        let err = Error::from_io(e);
        for id in ids {
            self.unsent(*id);
        }
        self.kill(err.clone());
        err
    }

    fn fits(&self, st: &State, cost: u64) -> bool {
        st.outstanding.len() - st.ahead.len() < st.window as usize
            && st.outstanding.len() < self.welcome.window_requests as usize
            && (st.bytes_outstanding + cost <= st.window_bytes || st.outstanding.is_empty())
    }

    /// Sends and waits.
    pub fn call(&self, req: &Request<'_>) -> Result<Frame> {
        let id = self.start(req, 0)?;
        self.finish(id, None)
    }

    /// `call` under the id in `id`, or a new one, which is left there: sent
    /// again after a lost connection, the request keeps its id.
    pub fn call_as(&self, req: &Request<'_>, id: &mut Option<u64>) -> Result<Frame> {
        let n = self.start_as(req, 0, *id)?;
        *id = Some(n);
        self.finish(n, None)
    }

    /// Drops interest in a reply (e.g. a prefetch no one will read).
    pub fn forget(&self, id: u64) {
        let mut st = lock(&self.st);
        if st.stored.remove(&id).is_none() && st.outstanding.contains_key(&id) {
            st.discard.insert(id);
        }
    }

    /// Gives back the window slot of a request that never left.
    fn unsent(&self, id: u64) {
        let mut st = lock(&self.st);
        if let Some(cost) = st.outstanding.remove(&id) {
            st.ahead.remove(&id);
            st.started.remove(&id);
            st.bytes_outstanding -= cost;
        }
    }

    fn kill(&self, e: Error) {
        let mut st = lock(&self.st);
        if st.dead.is_none() {
            st.dead = Some(e);
        }
        self.cv.notify_all();
    }

    /// Either reads one reply off the socket (if no one else is) or waits
    /// for whoever is reading. Returns the reply if it was `want`'s.
    fn make_progress<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        want: Option<u64>,
        dest: Option<&mut [u8]>,
    ) -> Result<(MutexGuard<'a, State>, Option<Result<Frame>>)> {
        if st.reader_busy {
            st.waiters += 1;
            let mut st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            st.waiters -= 1;
            return Ok((st, None));
        }
        if st.outstanding.is_empty() {
            // Nothing in flight can answer: a caller waited for an id it
            // never started or already collected.
            return Err(Error::Protocol("waiting for a reply that is not in flight".into()));
        }
        st.reader_busy = true;
        drop(st);
        let got = self.read_one(want, dest);
        let mut st = lock(&self.st);
        st.reader_busy = false;
        // A wake-up is a system call: skip it when no one waits (the
        // single-threaded case, where it would double a small request's cost).
        if st.waiters > 0 {
            self.cv.notify_all();
        }
        match got {
            Err(e) => {
                if st.dead.is_none() {
                    st.dead = Some(e.clone());
                }
                Err(e)
            }
            Ok((_, _, Got::Notice)) => Ok((st, None)),
            Ok((h, cost, what)) => {
                let id = h.id;
                self.answered(&mut st, &h, cost);
                match what {
                    Got::Notice => Ok((st, None)),
                    Got::Mine(f) => Ok((st, Some(f))),
                    Got::Other(s) => {
                        if !st.discard.remove(&id) {
                            st.stored.insert(id, s);
                        }
                        Ok((st, None))
                    }
                }
            }
        }
    }

    /// Turns on leases for the session (capability `LEASES`): breaks come
    /// on this connection, to `leases`, and a thread reads them while no
    /// caller waits for a reply. Returns the lease time; `ENOSYS` from a
    /// server without leases.
    pub fn leases_on(self: &Arc<Self>, leases: Arc<crate::leases::Leases>) -> Result<Duration> {
        if !self.has_cap(ferry_proto::caps::LEASES) {
            return Err(Error::remote(libc::ENOSYS));
        }
        if self.leases.set(Arc::clone(&leases)).is_err() {
            return Err(Error::remote(libc::EALREADY));
        }
        let asked = Instant::now();
        let time = match self.call(&Request::LeaseOn)?.reply()? {
            Reply::LeaseTime { ms } => Duration::from_millis(ms.into()),
            r => return Err(Error::Protocol(format!("unexpected reply {r:?}"))),
        };
        crate::leases::watch(self).map_err(Error::from_io)?;
        leases.start(time, asked, self.conn_id());
        Ok(time)
    }

    /// A number no other live connection of this process has.
    fn conn_id(&self) -> u64 {
        self as *const Engine as u64
    }

    /// This connection's leases, if it turned them on.
    pub fn leases(&self) -> Option<&Arc<crate::leases::Leases>> {
        self.leases.get()
    }

    /// The connection is gone: its leases with it.
    pub(crate) fn leases_lost(&self) {
        if let Some(l) = self.leases.get() {
            l.lost(self.conn_id());
        }
    }

    /// Input already read off the socket waits in a buffer (a poll on the
    /// descriptor would not see it).
    pub(crate) fn buffered(&self) -> bool {
        let Ok(rx) = self.rx.try_lock() else { return false };
        !rx.buffer().is_empty() || rx.get_ref().0.tls().is_some_and(|t| t.pending())
    }

    /// For the lease watcher, woken by input: reads what is there if no
    /// caller is reading (a caller reads breaks in order with its replies;
    /// nobody reads while no caller waits: a break, or the reply to a
    /// request nobody waits for, such as a `Close` sent behind). Replies
    /// go to their callers as a reader's do. Returns false if it left the
    /// socket to a caller.
    pub(crate) fn watch_once(&self) -> bool {
        let mut st = lock(&self.st);
        if st.dead.is_some() {
            return true;
        }
        if st.reader_busy {
            return false;
        }
        st.reader_busy = true;
        drop(st);
        let mut failed = None;
        loop {
            let got = self.read_one(None, None);
            let mut st = lock(&self.st);
            match got {
                Ok((_, _, Got::Notice)) => {}
                Ok((h, cost, Got::Other(s))) => {
                    self.answered(&mut st, &h, cost);
                    if !st.discard.remove(&h.id) {
                        st.stored.insert(h.id, s);
                    }
                    if st.waiters > 0 {
                        self.cv.notify_all();
                    }
                }
                Ok((_, _, Got::Mine(_))) => {}
                Err(e) => {
                    if st.dead.is_none() {
                        st.dead = Some(e.clone());
                    }
                    failed = Some(e);
                }
            }
            drop(st);
            if failed.is_some() || !(self.buffered() || self.readable_now()) {
                break;
            }
        }
        let mut st = lock(&self.st);
        st.reader_busy = false;
        if st.waiters > 0 || failed.is_some() {
            self.cv.notify_all();
        }
        drop(st);
        if failed.is_some() {
            self.leases_lost();
        }
        true
    }

    /// Request `id` is still waiting for its answer.
    pub(crate) fn is_outstanding(&self, id: u64) -> bool {
        lock(&self.st).outstanding.contains_key(&id)
    }

    /// A caller holds the reader's role now.
    pub(crate) fn reader_busy(&self) -> bool {
        lock(&self.st).reader_busy
    }

    /// Input waits on the socket now (one poll that does not wait).
    fn readable_now(&self) -> bool {
        use rustix::event::{poll, PollFd, PollFlags};
        // SAFETY: the descriptor is this engine's own, open while it lives.
        let fd = unsafe { BorrowedFd::borrow_raw(self.raw_fd()) };
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        let zero = rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 };
        matches!(poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
    }

    /// A notice from the server: a lease break is handed to the leases,
    /// then returned. Anything else is a protocol error.
    fn notice(&self, op: u16, body: &[u8]) -> Result<()> {
        let (op::LEASE_BREAK, Some(leases)) = (op, self.leases.get()) else {
            return Err(Error::Protocol(format!("unexpected notice {}", op::name(op))));
        };
        let b = ferry_proto::LeaseBreak::decode(body).map_err(|e| Error::Protocol(e.to_string()))?;
        // Returned when the handler is done with it, now or later (the
        // mount's, once the kernel has taken the invalidations).
        let tx = Arc::clone(&self.tx);
        let seq = b.seq;
        let ret = crate::leases::Return::new(Box::new(move || {
            let mut tx = lock(&tx);
            let (sock, head) = &mut *tx;
            head.clear();
            Request::LeaseReturn { seq }.encode(0, head);
            // A connection gone meanwhile: its leases are gone with it.
            let _ = send_request(sock, head, &[], None);
        }));
        leases.handle(&b, ret);
        Ok(())
    }

    /// The reply `h` was read off the socket (by a caller or the watcher):
    /// its window slot is free, its send time renews the leases, and the
    /// metrics count it.
    fn answered(&self, st: &mut State, h: &Header, cost: u64) {
        st.outstanding.remove(&h.id);
        st.ahead.remove(&h.id);
        st.bytes_outstanding -= cost;
        if let Some((t0, sent)) = st.started.remove(&h.id) {
            if let Some(l) = self.leases.get() {
                l.renew(t0);
            }
            if let Some(m) = &self.metrics {
                let data = if !h.is_error() && matches!(h.op, op::READ | op::PREAD) { h.len } else { 0 };
                m.request(h.op, t0.elapsed(), h.is_error(), sent, u64::from(data));
            }
        }
    }

    /// Reads exactly one reply frame. Called only by the reader.
    fn read_one(&self, want: Option<u64>, dest: Option<&mut [u8]>) -> Result<(Header, u64, Got)> {
        let mut rx = lock(&self.rx);
        let stall = self.stall();
        let lost = |e: io::Error, what: &str| {
            if e.kind() == io::ErrorKind::TimedOut {
                self.stalled.store(true, Relaxed);
            }
            lost(e, what)
        };
        let mut hb = [0u8; HEADER_LEN];
        read_reply(&mut rx, &mut hb, stall).map_err(|e| lost(e, "server closed the connection"))?;
        let h = Header::decode(&hb);
        h.check_len(self.max_frame).map_err(|e| Error::Protocol(e.to_string()))?;
        if h.is_notice() {
            let mut body = vec![0u8; h.len as usize];
            read_reply(&mut rx, &mut body, stall).map_err(|e| lost(e, MID_REPLY))?;
            drop(rx);
            self.notice(h.op, &body)?;
            return Ok((h, 0, Got::Notice));
        }
        let cost = lock(&self.st)
            .outstanding
            .get(&h.id)
            .copied()
            .ok_or_else(|| Error::Protocol(format!("reply to unknown request id {}", h.id)))?;
        let len = h.len as usize;
        let is_data = !h.is_error() && matches!(h.op, op::READ | op::PREAD);
        if want == Some(h.id) && is_data {
            if let Some(d) = dest {
                if len > d.len() {
                    return Err(Error::Protocol(format!("read reply of {len} bytes for a {}-byte buffer", d.len())));
                }
                read_reply(&mut rx, &mut d[..len], stall).map_err(|e| lost(e, MID_REPLY))?;
                return Ok((h, cost, Got::Mine(Ok(Frame { op: h.op, body: Vec::new(), data_len: len }))));
            }
        }
        if is_data && want != Some(h.id) {
            self.aside.fetch_add(len as u64, Relaxed);
        }
        let mut body = vec![0u8; len];
        read_reply(&mut rx, &mut body, stall).map_err(|e| lost(e, MID_REPLY))?;
        let s = Stored { header: h, body };
        if want == Some(h.id) {
            return Ok((h, cost, Got::Mine(deliver(s, None))));
        }
        Ok((h, cost, Got::Other(s)))
    }
}

const MID_REPLY: &str = "server closed the connection in the middle of a reply";

/// A connection that ends where a frame must go on is a lost server, said
/// in words (`read_exact`'s own text is "failed to fill whole buffer").
fn lost(e: io::Error, what: &str) -> Error {
    match e.kind() {
        io::ErrorKind::UnexpectedEof => {
            Error::Io { kind: e.kind(), errno: Some(libc::ECONNRESET), message: what.into() }
        }
        _ => Error::from_io(e),
    }
}

enum Got {
    Mine(Result<Frame>),
    Other(Stored),
    /// A notice the server sent unasked (a lease break), dealt with.
    Notice,
}

/// Turns a stored reply into the caller's result, copying data into `dest`.
fn deliver(s: Stored, dest: Option<&mut [u8]>) -> Result<Frame> {
    if s.header.is_error() {
        let e = ErrorReply::decode(&s.body).map_err(|e| Error::Protocol(e.to_string()))?;
        return Err(Error::Remote { errno: e.errno as i32, message: e.message.to_string() });
    }
    let is_data = matches!(s.header.op, op::READ | op::PREAD);
    match dest {
        Some(d) if is_data => {
            if s.body.len() > d.len() {
                return Err(Error::Protocol("read reply larger than the buffer".into()));
            }
            d[..s.body.len()].copy_from_slice(&s.body);
            Ok(Frame { op: s.header.op, body: Vec::new(), data_len: s.body.len() })
        }
        _ => Ok(Frame { op: s.header.op, data_len: 0, body: s.body }),
    }
}

/// The connection failed during the handshake: a timeout is the server not
/// answering, an early close is the server hanging up on us.
fn handshake_io(e: io::Error, timeout_secs: f64) -> Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Io {
            kind: io::ErrorKind::TimedOut,
            errno: Some(libc::ETIMEDOUT),
            message: format!("the server did not answer the handshake within {timeout_secs} s"),
        },
        io::ErrorKind::UnexpectedEof => Error::Protocol("server closed the connection during the handshake".into()),
        _ => Error::from_io(e),
    }
}

/// Why a TLS handshake failed, in words.
fn tls_error(addr: &str, e: io::Error, secs: f64) -> Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Io {
            kind: io::ErrorKind::TimedOut,
            errno: Some(libc::ETIMEDOUT),
            message: format!("the server did not finish the TLS handshake within {secs} s"),
        },
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => Error::Protocol(format!(
            "{addr} closed the connection during the TLS handshake (a server without TLS? FERRY_TLS=0 connects              without it)"
        )),
        _ => match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            // Our verifier's own words (a changed certificate, say).
            Some(rustls::Error::General(m)) => Error::Auth(m.clone()),
            _ => Error::Protocol(format!("TLS: {e}")),
        },
    }
}

fn handshake_error(e: ClientError) -> Error {
    match e {
        ClientError::NotFerry { said } if said.is_empty() => {
            Error::Protocol("not a ferry server (its answer is not a ferry handshake)".into())
        }
        ClientError::NotFerry { said } => Error::Protocol(format!("not a ferry server (it answered \"{said}…\")")),
        ClientError::Refused { errno, message } if errno as i32 == libc::EACCES => Error::Auth(message),
        // The server's own words: why it will not serve us (busy, no common
        // version...) is not an errno a user could read anything into.
        ClientError::Refused { errno, message } => Error::Io {
            kind: io::ErrorKind::ConnectionRefused,
            errno: Some(errno as i32),
            message: format!("the server refused the connection: {message}"),
        },
        ClientError::NoToken => Error::Auth(
            "authentication failed: the server wants a token and none was found \
             (use --token-file, FERRY_TOKEN_FILE or FERRY_TOKEN)"
                .into(),
        ),
        ClientError::BadServerProof => Error::Auth("authentication failed: the server did not prove the token".into()),
        ClientError::Protocol(m) => Error::Protocol(m),
    }
}

/// After this long without a byte of an awaited reply, the client says so
/// on stderr, once per silence, and goes on waiting: a server may be slow
/// (a long `fsync`) or stopped, and neither is a reason to give up, but a
/// user must not face a silent hang.
const REPLY_NOTICE: Duration = Duration::from_secs(15);

/// `read_exact` for replies, on a socket whose receive timeout is
/// `REPLY_NOTICE`: a timeout loses nothing read so far and is reported. With
/// a `stall` bound (shorter receive timeout), a silence that long is a
/// `TimedOut` error: the connection is given up.
fn read_reply(r: &mut BufReader<Sock>, buf: &mut [u8], stall: Option<Duration>) -> io::Result<()> {
    let mut n = 0;
    let mut said = false;
    let mut heard = Instant::now();
    let peer = |r: &BufReader<Sock>| r.get_ref().0.peer_name();
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(k) => {
                n += k;
                heard = Instant::now();
                if said {
                    eprintln!("ferry: {}: answering again", peer(r));
                    said = false;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                if let Some(bound) = stall.filter(|b| heard.elapsed() >= *b) {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no reply for {} s (gateway hung or stopped)", bound.as_secs_f64()),
                    ));
                }
                if heard.elapsed() < REPLY_NOTICE {
                    continue;
                }
                if !said {
                    let secs = REPLY_NOTICE.as_secs();
                    eprintln!("ferry: {}: no reply for {secs} s (server busy or stopped); still waiting", peer(r));
                    said = true;
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads until `buf` is full or the peer closes; returns how much arrived.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) if n == 0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Sends head and bulk with `sendmsg(MSG_NOSIGNAL)`: a server that went
/// away must give the caller an error, not kill it with SIGPIPE (the
/// client runs inside other people's programs, via the preload library).
fn write_all_vectored(w: &Socket, head: &[u8], bulk: &[u8]) -> io::Result<()> {
    send(w, head, bulk, None)
}

/// How often a blocked send looks whether the server hung up.
const SEND_CHECK: Duration = Duration::from_secs(1);
/// After this long blocked, a send says so on stderr (once).
const SEND_NOTICE: Duration = Duration::from_secs(15);

/// Sends a request, waiting as long as the server takes to read it (a slow
/// `fsync` stalls its connection), but not on a server that hung up: a peer
/// that shut its side down without reading (a half-closed connection)
/// would otherwise leave the send blocked for ever.
/// With a `stall` bound, a send blocked that long is a `TimedOut` error.
fn send_request(w: &Socket, head: &[u8], bulk: &[u8], stall: Option<Duration>) -> io::Result<()> {
    send(w, head, bulk, Some(stall))
}

/// Whether the peer has closed or shut down its side of `w`.
fn hung_up(w: &Socket) -> bool {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut fds = [PollFd::new(w, PollFlags::RDHUP)];
    let zero = rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 };
    match poll(&mut fds, Some(&zero)) {
        Ok(_) => fds[0].revents().intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR),
        Err(_) => false,
    }
}

/// `patient`: `None` gives up at the socket's send timeout; `Some(stall)`
/// waits for the server to read, up to `stall` if given.
fn send(w: &Socket, head: &[u8], bulk: &[u8], patient: Option<Option<Duration>>) -> io::Result<()> {
    match w.tls() {
        // Sealed into records first; what goes on the wire goes as below.
        Some(t) => t.send(&[head, bulk], |sealed| send_raw(w, sealed, &[], patient)),
        None => send_raw(w, head, bulk, patient),
    }
}

fn send_raw(w: &Socket, head: &[u8], bulk: &[u8], patient: Option<Option<Duration>>) -> io::Result<()> {
    let mut bufs = [IoSlice::new(head), IoSlice::new(bulk)];
    let mut slices: &mut [IoSlice<'_>] = if bulk.is_empty() { &mut bufs[..1] } else { &mut bufs[..] };
    let mut blocked: Option<(std::time::Instant, bool)> = None;
    while !slices.is_empty() {
        let sent = rustix::net::sendmsg(
            w,
            slices,
            &mut rustix::net::SendAncillaryBuffer::default(),
            rustix::net::SendFlags::NOSIGNAL,
        );
        let n = match sent {
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::AGAIN) if patient.is_some() => {
                if hung_up(w) {
                    return Err(io::Error::new(io::ErrorKind::ConnectionReset, "server closed the connection"));
                }
                let (since, said) = blocked.get_or_insert_with(|| (std::time::Instant::now(), false));
                if let Some(bound) = patient.flatten().filter(|b| since.elapsed() >= *b) {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("not reading requests for {} s (gateway hung or stopped)", bound.as_secs_f64()),
                    ));
                }
                if !*said && since.elapsed() >= SEND_NOTICE {
                    let peer = w.peer_name();
                    eprintln!("ferry: {peer}: not reading requests for {} s; still waiting", SEND_NOTICE.as_secs());
                    *said = true;
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if let Some((_, true)) = blocked.take() {
            eprintln!("ferry: {}: reading requests again", w.peer_name());
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}
