//! The ferry server: accepts connections, runs one session per connection and
//! executes requests against a [`Backend`].
//!
//! Threading: a connection's handshake runs on a short-lived thread of its
//! own; then the event loop (`evloop.rs`) serves it from a few workers,
//! about one per CPU, each of which reads a request, executes it and writes
//! the reply itself — no request changes threads. A TLS connection keeps a
//! thread of its own (its records are read whole, waiting).

pub mod backend;
mod budget;
mod bufpool;
mod changes;
mod commit;
mod conn;
mod dirpolicy;
mod evloop;
pub mod exports;
pub mod fence;
mod fileid;
mod fileseal;
#[doc(hidden)]
pub mod fuzz;
mod gate;
mod gfid;
pub mod identity;
mod inbox;
mod journal;
mod leases;
mod locks;
pub mod memory;
pub mod metrics;
mod ofd;
mod peer;
pub mod posix;
mod replay;
mod session;
mod sessions;
pub mod tls;
mod touches;
mod turns;
pub mod volume;
mod watch;

use std::net::TcpListener;
use std::os::unix::net::UnixListener;

use ferry_sock::Socket;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

pub use backend::{Backend, Errno, Node, ReadData};
pub use conn::End;
pub use session::{HandleBudget, Policy};

/// Server settings; `Config::default()` is what `ferry serve` uses.
#[derive(Clone, Debug)]
pub struct Config {
    pub read_only: bool,
    /// Let clients create character and block device nodes (they are never
    /// opened for a client either way).
    pub allow_devices: bool,
    /// Shared secret; `None` serves without authentication.
    pub token: Option<Vec<u8>>,
    /// Largest request body accepted.
    pub max_frame: u32,
    pub window_requests: u32,
    pub window_bytes: u64,
    pub max_handles: usize,
    /// Authenticated connections served at once.
    pub max_connections: usize,
    /// Connections still in their handshake (not counted above), in total
    /// and from one peer: past these the oldest waiting is shut down.
    pub max_handshakes: usize,
    pub max_handshakes_per_peer: usize,
    /// Memory all connections together may hold for request frames larger
    /// than 1 MiB (big writes wait their turn beyond it).
    pub frame_pool_bytes: usize,
    pub idle_timeout: Duration,
    /// How long a session outlives its last connection.
    pub session_lease: Duration,
    /// How long a lease holds without word from its holder: the longest a
    /// change waits for a client that does not answer its break.
    pub lease_time: Duration,
    /// Time allowed for the whole handshake, authentication included.
    pub handshake_timeout: Duration,
    /// Capabilities offered (tests turn some off to check degradation).
    pub caps: u64,
    pub boot_id: u64,
    /// The server's Unix socket address, told to clients that ask (set by
    /// [`serve`] from its listeners).
    pub local_addr: Option<String>,
    /// Where sessions (their ids, secrets and reply caches) outlive the
    /// process, so exactly-once holds across a restart; `None`: in memory.
    /// Opened (and locked) before the server says it listens, so that a
    /// second server started after that line finds it taken.
    pub state_dir: Option<Arc<StateDir>>,
    /// Act for each request as its caller (capability `IDENTITY`), by this
    /// policy; `None`: as the server's own user for everyone. Only a
    /// server running as root can.
    pub identity: Option<identity::Policy>,
    /// The secret that seals the file ids this server gives (`None`: one
    /// kept in `state_dir`, or this process's own): gateways of one volume
    /// given the same can each open the files the others' ids name.
    pub id_key: Option<Vec<u8>>,
    /// The export directory to watch for changes made on this host outside
    /// the server (`watch.rs`), so that leases may be promised for long
    /// (capability `WATCHED`); `None`, or a watch that cannot start: not
    /// offered (unless the backend sees every change itself).
    pub watch: Option<std::path::PathBuf>,
    /// Where fence records live, on the shared volume every gateway of it
    /// names the same (capability `FENCE`, see `fence.rs`); `None`: this
    /// server fences no session.
    pub fence_dir: Option<std::path::PathBuf>,
    /// TLS for TCP clients that start with a TLS handshake (`None`: none).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Refuse TCP clients that do not use TLS (`ENOPROTOOPT`).
    pub tls_required: bool,
    /// Several exports (`--config`): their clients' tokens (then `token`
    /// is not used) and what each may use.
    pub access: Option<Arc<dyn exports::Access>>,
}

impl Default for Config {
    fn default() -> Self {
        let mut id = [0u8; 8];
        // A failed entropy read only weakens the reboot detection.
        let _ = getrandom::getrandom(&mut id);
        Config {
            read_only: false,
            allow_devices: false,
            token: None,
            max_frame: 64 * 1024 * 1024 + 4096,
            window_requests: 64,
            window_bytes: 256 * 1024 * 1024,
            max_handles: 4096,
            max_connections: 1024,
            max_handshakes: 64,
            max_handshakes_per_peer: 16,
            frame_pool_bytes: 512 * 1024 * 1024,
            idle_timeout: Duration::from_secs(3600),
            handshake_timeout: Duration::from_secs(5),
            session_lease: Duration::from_secs(60),
            lease_time: leases::DEFAULT_TIME,
            caps: ferry_proto::caps::ALL,
            boot_id: u64::from_le_bytes(id),
            state_dir: None,
            local_addr: None,
            identity: None,
            id_key: None,
            watch: None,
            fence_dir: None,
            tls: None,
            tls_required: false,
            access: None,
        }
    }
}

/// Handles all sessions may hold together: the descriptor limit minus room
/// for every connection (two each: its socket and its session's journal;
/// the event loop dups no socket), four for each handshake, and the few
/// descriptors a request uses while it runs, so accepting and serving
/// never run out. (Four per connection, as when each had a thread and
/// three sockets, left a server of 20,000 descriptors no budget at all
/// past 4,700 connections.)
fn handle_budget(cfg: &Config) -> usize {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(1 << 20) as usize;
    limit.saturating_sub(2 * (cfg.max_connections + 4 * cfg.max_handshakes) + 64).max(64)
}

/// A directory that keeps sessions (`Config::state_dir`), held locked by
/// this process from [`open_state_dir`] until it exits.
pub struct StateDir(std::sync::Mutex<Option<(journal::Journal, Vec<journal::Restored>)>>);

impl std::fmt::Debug for StateDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateDir")
    }
}

/// Opens `dir` to keep sessions (created if need be) and locks it against
/// other servers; fails if another holds it.
pub fn open_state_dir(dir: &std::path::Path) -> std::io::Result<Arc<StateDir>> {
    let j = journal::Journal::open(dir)?;
    Ok(Arc::new(StateDir(std::sync::Mutex::new(Some(j)))))
}

/// Whether `dir` could keep sessions: created if need be, and not in use
/// by another server (the lock is let go again).
pub fn check_state_dir(dir: &std::path::Path) -> std::io::Result<()> {
    journal::Journal::open(dir).map(drop)
}

/// What a server accepts connections on: TCP, a Unix socket for clients on
/// its own host, or both.
pub struct Listeners {
    pub tcp: Option<TcpListener>,
    /// The Unix listener and its address as clients write it (`unix:PATH`
    /// or `unix:@NAME`): the server tells it to TCP clients (`LocalAddr`)
    /// so that one on this host can move its data over it instead.
    pub unix: Option<(UnixListener, String)>,
    /// Where `GET /metrics` is answered (Prometheus text), if anywhere.
    pub metrics: Option<TcpListener>,
}

/// Starts what lets the server promise leases for long, if it can: the
/// capability bits to take away if not.
fn watched<B: Backend>(cfg: &Config, backend: &B, leases: &Arc<leases::Leases>) -> u64 {
    use ferry_proto::caps::{LEASES, WATCHED};
    if cfg.caps & LEASES == 0 || cfg.caps & WATCHED == 0 {
        return WATCHED;
    }
    if backend.sees_every_change() {
        return 0;
    }
    let Some(dir) = &cfg.watch else { return WATCHED };
    match watch::start(dir, Arc::clone(leases)) {
        Ok(()) => {
            tracing::info!("watching {} for changes outside ferry: leases hold until broken", dir.display());
            0
        }
        Err(e) => {
            tracing::info!(
                "changes to {} outside ferry cannot be watched ({e}): clients keep leased answers no longer than their timeouts",
                dir.display()
            );
            WATCHED
        }
    }
}

/// Accepts connections forever, one thread each.
pub fn serve<B: Backend>(listeners: Listeners, backend: Arc<B>, mut cfg: Config) -> std::io::Result<()> {
    cfg.local_addr = listeners.unix.as_ref().map(|(_, a)| a.clone());
    let opened = cfg.state_dir.as_ref().and_then(|s| s.0.lock().unwrap_or_else(|p| p.into_inner()).take());
    let sessions = Arc::new(match opened {
        Some((journal, restored)) => sessions::Sessions::with_journal(cfg.session_lease, journal, restored),
        None if cfg.state_dir.is_some() => {
            return Err(std::io::Error::other("a state directory serves one server, once"));
        }
        None => sessions::Sessions::new(cfg.session_lease),
    });
    {
        let sessions = Arc::clone(&sessions);
        let tick = (cfg.session_lease / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        std::thread::Builder::new().name("ferry-lease".into()).spawn(move || loop {
            std::thread::sleep(tick);
            sessions.reap(std::time::Instant::now());
        })?;
    }
    let leases = Arc::new(leases::Leases::new(cfg.lease_time));
    cfg.caps &= !watched(&cfg, &*backend, &leases);
    let common = conn::Common {
        budget: Arc::new(HandleBudget::new(handle_budget(&cfg))),
        pool: Arc::new(bufpool::BufPool::new(cfg.frame_pool_bytes)),
        locks: Arc::new(locks::LockTable::default()),
        changes: Arc::default(),
        leases,
        dirs: Arc::default(),
        seals: Arc::new(match &cfg.id_key {
            Some(k) => fileseal::Seals::with_key(k),
            None => sessions.seals(),
        }),
        fences: cfg.fence_dir.as_ref().map(|d| Arc::new(fence::Fences::new(d))),
        sessions,
        backend,
        cfg: Arc::new(cfg),
        metrics: Arc::default(),
    };
    let deadline = common.cfg.handshake_timeout.min(common.cfg.idle_timeout);
    let grace = Duration::from_secs(1).min(deadline);
    let gate = gate::Gate::new(common.cfg.max_handshakes, common.cfg.max_handshakes_per_peer, grace, deadline);
    if let Some(l) = listeners.metrics {
        let (c, gate) = (common.clone(), Arc::clone(&gate));
        metrics::serve_http(l, move || {
            let g = metrics::Gauges {
                connections: gate.live() as u64,
                handshakes: gate.waiting() as u64,
                handshakes_evicted: gate.evicted(),
                sessions: c.sessions.count() as u64,
                handles: c.budget.open() as u64,
                handle_budget: c.budget.max() as u64,
                handles_refused: c.budget.refused(),
                locked_files: c.locks.files_locked() as u64,
                leased_objects: c.leases.objects() as u64,
                leases_granted: c.leases.counts.granted.load(Ordering::Relaxed),
                leases_refused: c.leases.counts.refused.load(Ordering::Relaxed),
                lease_breaks: c.leases.counts.breaks.load(Ordering::Relaxed),
                lease_waits: c.leases.counts.waits.load(Ordering::Relaxed),
                lease_wait_seconds: c.leases.counts.waited_us.load(Ordering::Relaxed) as f64 / 1e6,
                lease_timeouts: c.leases.counts.timeouts.load(Ordering::Relaxed),
                outside_notices: c.leases.counts.outside_notices.load(Ordering::Relaxed),
                outside_opened: c.leases.counts.outside_opened.load(Ordering::Relaxed),
                lease_last_break: {
                    let l = &c.leases.counts.last;
                    [&l.start, &l.wrote, &l.returned, &l.resumed].map(|a| a.load(Ordering::Relaxed))
                },
            };
            c.metrics.render(&g)
        })?;
    }
    let ev = evloop::EvLoop::start(common.cfg.idle_timeout, Arc::clone(&common.metrics))?;
    let unix = match listeners.unix {
        Some((l, _)) => {
            let (common, gate, ev) = (common.clone(), Arc::clone(&gate), Arc::clone(&ev));
            let accept = move || l.accept().map(|(s, _)| Socket::from(s));
            Some(
                std::thread::Builder::new()
                    .name("ferry-accept".into())
                    .spawn(move || accept_loop(accept, &common, &gate, &ev))?,
            )
        }
        None => None,
    };
    match (listeners.tcp, unix) {
        (Some(l), _) => accept_loop(move || l.accept().map(|(s, _)| Socket::from(s)), &common, &gate, &ev),
        (None, Some(t)) => t.join().unwrap_or(Ok(())),
        (None, None) => Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "nothing to listen on")),
    }
}

fn accept_loop<B: Backend>(
    mut accept: impl FnMut() -> std::io::Result<Socket>,
    common: &conn::Common<B>,
    gate: &Arc<gate::Gate>,
    ev: &Arc<evloop::EvLoop<B>>,
) -> std::io::Result<()> {
    let cfg = Arc::clone(&common.cfg);
    loop {
        let stream = match accept() {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: wait for connections to end instead of spinning.
                tracing::error!("accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        common.metrics.connections.fetch_add(1, Ordering::Relaxed);
        // Every connection waits in the gate until it authenticates, a
        // refused one too: it holds a thread while it is told why.
        let ticket = match gate.admit(&stream) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("connection not set up: {e}");
                continue;
            }
        };
        if gate.live() >= cfg.max_connections {
            common.metrics.refused_busy.fetch_add(1, Ordering::Relaxed);
            let peer = stream.peer_name();
            tracing::warn!(peer = %peer, "refused: {} connections already", cfg.max_connections);
            let msg =
                format!("server busy: it serves {} connections already (its --max-connections)", cfg.max_connections);
            // Best effort: without a thread the peer gets a plain close.
            let _ = std::thread::Builder::new().name("ferry-refuse".into()).stack_size(64 * 1024).spawn(move || {
                conn::refuse(stream, libc::EBUSY, &msg);
                drop(ticket);
            });
            continue;
        }
        let conn = match conn::Conn::new(stream, common) {
            Ok(mut c) => {
                c.ticket = Some(ticket);
                c
            }
            Err(e) => {
                tracing::warn!("connection not set up: {e}");
                continue;
            }
        };
        tracing::debug!(peer = %conn.peer(), "connection accepted");
        let metrics = Arc::clone(&common.metrics);
        let ev = Arc::clone(ev);
        // The handshake's own thread (TLS's included); then the event
        // loop serves the connection.
        let spawned = std::thread::Builder::new().name("ferry-conn".into()).stack_size(256 * 1024).spawn(move || {
            let mut conn = conn;
            let peer = conn.peer();
            // What is said while serving (a refused export) names the peer.
            let span = tracing::info_span!("conn", peer = %peer);
            let started = span.in_scope(|| conn.start());
            let end = match started {
                Ok(caps) => return ev.adopt(conn, caps),
                Err(e) => e,
            };
            evloop::log_end(&peer, end, &metrics);
        });
        if let Err(e) = spawned {
            tracing::error!("cannot start a thread: {e}");
        }
    }
}
