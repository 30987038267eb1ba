//! `ferry serve`.

use std::io::Write;
use std::net::TcpListener;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use ferry_server::{memory::MemoryBackend, posix::PosixBackend, Config};

#[derive(Args)]
pub struct ServeArgs {
    /// Directory to export (default: the current directory).
    dir: Option<PathBuf>,
    /// Several exports, with their clients' tokens and rights, from a
    /// TOML file (docs/security-and-deploying.md); `SIGHUP` reads it again.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["dir", "memory", "no_auth"])]
    config: Option<PathBuf>,
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: String,
    /// Listen also on a Unix socket at this path (clients: `unix:PATH`
    /// addresses, `ferry+unix://` URLs). Without it, a server offering the
    /// same-host path listens on an abstract Unix socket of its own.
    #[arg(long)]
    unix: Option<PathBuf>,
    /// Refuse every change with EROFS.
    #[arg(long)]
    read_only: bool,
    /// Serve an empty in-memory file system instead of a directory.
    #[arg(long, conflicts_with = "dir")]
    memory: bool,
    /// Let clients create character and block device nodes (never opened
    /// for them either way).
    #[arg(long)]
    allow_devices: bool,
    /// Serve without authentication (anyone who can connect has access).
    #[arg(long)]
    no_auth: bool,
    /// Most simultaneous connections.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Seconds a connection may stay silent before it is closed.
    #[arg(long, default_value_t = 3600)]
    idle_timeout: u64,
    /// Seconds a client's session (open files, offsets, locks) outlives its
    /// last connection, so the client can reconnect and go on.
    #[arg(long, default_value_t = 60.0)]
    session_lease: f64,
    /// Seconds a client's cache lease (what it was answered, kept until the
    /// server breaks it) holds without word from the client: the longest a
    /// change waits for a client that does not answer its break.
    #[arg(long, default_value_t = 2.0)]
    lease_time: f64,
    /// Directory where sessions (ids, secrets, reply caches) outlive the
    /// server process, so a request in flight when it was killed runs once
    /// after a restart. Default for a directory export:
    /// $XDG_STATE_HOME/ferry/serve/HASH, HASH of the export path and the
    /// listening address (without XDG_STATE_HOME:
    /// ~/.local/state/ferry/serve/HASH); none for --memory.
    /// It must be this user's, and not writable by others.
    #[arg(long, conflicts_with = "no_state")]
    state_dir: Option<PathBuf>,
    /// Keep sessions in memory only: a restart forgets them.
    #[arg(long)]
    no_state: bool,
    /// Answer `GET /metrics` (Prometheus text format) on this address
    /// (HOST:PORT; port 0 picks one, said on stderr).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// The export is a file system that other machines mount too, each
    /// exported by its own `ferry serve` (gateways, named together in
    /// clients' URLs): clients that move here from another gateway find
    /// their open files again by inode number. On by itself for NFS,
    /// CephFS, JuiceFS, Lustre, GlusterFS and the like.
    #[arg(long, conflicts_with = "memory")]
    shared_volume: bool,
    /// The secret that seals the file ids this server gives clients (made
    /// if missing, mode 0600; default: one in the state directory). Give
    /// every gateway of a shared volume the same file, so that a client
    /// moving between them finds by its id a file renamed meanwhile.
    #[arg(long, value_name = "FILE", conflicts_with = "memory")]
    id_key: Option<PathBuf>,
    /// Where this gateway keeps fence records: a directory on the shared
    /// volume that every gateway of it names (default: `.ferry-fence` in
    /// the export of a shared volume). A client that leaves a gateway that
    /// stopped answering fences its session there, so that the gateway,
    /// if it wakes, applies none of that client's old requests.
    #[arg(long, value_name = "DIR", conflicts_with = "memory")]
    fence_dir: Option<PathBuf>,
    /// Require TLS from TCP clients on any address (the default off
    /// loopback). Without a certificate one is made (self-signed) and its
    /// fingerprint said on stderr; clients trust it on first use.
    #[arg(long, conflicts_with = "no_tls")]
    tls: bool,
    /// Serve TCP clients without TLS even off loopback (on a network you
    /// trust: anyone on the path can read and change what passes).
    #[arg(long)]
    no_tls: bool,
    /// The TLS certificate chain (PEM). Default:
    /// $XDG_CONFIG_HOME/ferry/tls/cert.pem (~/.config/ferry/tls/cert.pem),
    /// made with its key if neither exists.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The TLS private key (PEM), beside --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Clients' root stays root here (NFS's no_root_squash). By default a
    /// server running as root acts for each request as the user who made
    /// it, and for root as the anonymous user.
    #[arg(long, overrides_with = "root_squash")]
    no_root_squash: bool,
    /// Clients' root becomes the anonymous user (the default; overrides an
    /// earlier --no-root-squash).
    #[arg(long, overrides_with = "no_root_squash")]
    root_squash: bool,
    /// The anonymous user that clients' root becomes.
    #[arg(long, default_value_t = 65534, value_name = "UID")]
    anon_uid: u32,
    /// The anonymous group that clients' group 0 becomes.
    #[arg(long, default_value_t = 65534, value_name = "GID")]
    anon_gid: u32,
    /// A client's uid CLIENT acts here as SERVER (for machines whose ids
    /// differ); repeat or separate with commas.
    #[arg(long, value_name = "CLIENT=SERVER", value_delimiter = ',')]
    map_uid: Vec<String>,
    /// As --map-uid, for group ids.
    #[arg(long, value_name = "CLIENT=SERVER", value_delimiter = ',')]
    map_gid: Vec<String>,
    /// Turn capabilities off (readdirplus, xattr, rename-flags, locks,
    /// sessions, file-ids, replay, open-read, list-dir, caching,
    /// data-channels, same-host, identity, leases, fence, watched): to serve as an older server would, and to test how
    /// clients degrade. Without identity a root server acts as the anonymous user for everyone.
    #[arg(long, value_delimiter = ',')]
    disable_caps: Vec<String>,
}

/// How requests act as their callers: only a server running as root can
/// (as anyone else it serves as itself, for everyone).
fn identity_policy(a: &ServeArgs) -> Result<Option<ferry_server::identity::Policy>, String> {
    use ferry_server::identity::{parse_map, Policy};
    let parse = |v: &[String], what: &str| {
        v.iter().map(|m| parse_map(m).map_err(|e| format!("--map-{what} {e}"))).collect::<Result<Vec<_>, _>>()
    };
    let policy = Policy {
        squash_root: !a.no_root_squash,
        anon_uid: a.anon_uid,
        anon_gid: a.anon_gid,
        uid_map: parse(&a.map_uid, "uid")?,
        gid_map: parse(&a.map_gid, "gid")?,
    };
    policy.check()?;
    if !rustix::process::geteuid().is_root() {
        if policy != Policy::default() {
            tracing::warn!("not running as root: every client acts as this server's user, ids are not mapped");
        }
        return Ok(None);
    }
    Ok(Some(policy))
}

pub fn run(a: ServeArgs, token_file: Option<&Path>) -> Result<(), String> {
    init_log();
    let mut cfg = Config {
        read_only: a.read_only,
        allow_devices: a.allow_devices,
        max_connections: a.max_connections,
        idle_timeout: Duration::from_secs(a.idle_timeout.max(1)),
        session_lease: Duration::try_from_secs_f64(a.session_lease)
            .map_err(|_| format!("--session-lease {}: expected seconds >= 0", a.session_lease))?,
        lease_time: Duration::try_from_secs_f64(a.lease_time)
            .ok()
            .filter(|t| *t >= Duration::from_millis(10) && *t <= Duration::from_secs(600))
            .ok_or_else(|| format!("--lease-time {}: expected seconds from 0.01 to 600", a.lease_time))?,
        ..Config::default()
    };
    for c in &a.disable_caps {
        cfg.caps &= !match c.as_str() {
            "readdirplus" => ferry_proto::caps::READDIRPLUS,
            "xattr" => ferry_proto::caps::XATTR,
            "rename-flags" => ferry_proto::caps::RENAME_FLAGS,
            "locks" => ferry_proto::caps::LOCKS,
            "sessions" => ferry_proto::caps::SESSIONS,
            "file-ids" => ferry_proto::caps::FILE_IDS,
            "replay" => ferry_proto::caps::REPLAY,
            "open-read" => ferry_proto::caps::OPEN_READ,
            "list-dir" => ferry_proto::caps::LIST_DIR,
            "caching" => ferry_proto::caps::CACHING,
            "data-channels" => ferry_proto::caps::DATA_CHANNELS,
            "same-host" => ferry_proto::caps::SAME_HOST,
            "identity" => ferry_proto::caps::IDENTITY,
            "leases" => ferry_proto::caps::LEASES,
            "fence" => ferry_proto::caps::FENCE,
            "watched" => ferry_proto::caps::WATCHED,
            other => return Err(format!("unknown capability '{other}'")),
        };
    }
    raise_fd_limit();
    // Clients send the modes they want; their own umask is already applied.
    rustix::process::umask(rustix::fs::Mode::empty());
    // The export is opened before anything is printed: the first line is
    // for scripts, and must only appear once the server can serve.
    let identity = identity_policy(&a)?;
    // What the default state directory is named after, besides the address.
    let mut state_key = None;
    let export = if let Some(file) = &a.config {
        let exports = Arc::new(ferry_server::exports::Exports::load(file, PosixBackend::new)?);
        tracing::info!("exports from {}: {}", file.display(), exports.names().join(", "));
        cfg.access = Some(Arc::clone(&exports) as Arc<dyn ferry_server::exports::Access>);
        cfg.identity = identity;
        state_key = Some(file.clone());
        reload_on_hangup(Arc::clone(&exports), file.clone())?;
        Export::Several(exports)
    } else if a.memory {
        Export::Memory(MemoryBackend::new())
    } else {
        let dir = a.dir.unwrap_or_else(|| PathBuf::from("."));
        let mut backend = PosixBackend::new(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let fs_type = ferry_server::volume::shared_fs_type(&dir);
        if let Some(t) = &fs_type {
            tracing::info!(
                "{} is on {t}, a shared file system: clients may move here from other gateways",
                dir.display()
            );
        }
        let shared = a.shared_volume || fs_type.is_some();
        backend.set_shared(shared);
        if shared && a.fence_dir.is_none() {
            cfg.fence_dir = Some(dir.join(ferry_server::fence::DIR_NAME));
        }
        // Other gateways' changes to a shared volume are not seen here.
        if shared {
            tracing::info!("a shared volume: clients keep leased answers no longer than their timeouts");
        } else {
            cfg.watch = Some(dir.clone());
        }
        cfg.identity = identity;
        state_key = Some(dir);
        Export::Dir(backend)
    };
    if let Some(d) = &a.fence_dir {
        cfg.fence_dir = Some(d.clone());
    }
    if let Some(d) = &cfg.fence_dir {
        if cfg.caps & ferry_proto::caps::FENCE != 0 {
            tracing::info!("fence records in {}: a client that leaves a gateway fences its session", d.display());
        }
    }
    if let Some(f) = &a.id_key {
        cfg.id_key = Some(id_key(f)?);
    }
    let addr = listen_addr(&a.listen);
    let listener = TcpListener::bind(&addr)
        .map_err(|e| format!("cannot listen on {}: {e} (expected HOST:PORT or PORT, e.g. 127.0.0.1:7070)", a.listen))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    if let Some(key) = &state_key {
        cfg.state_dir = state_dir(&a.state_dir, a.no_state, key, &local)?;
    }
    let tls_said = match a.tls || (!a.no_tls && !local.ip().is_loopback()) {
        true => {
            let id = tls_identity(&a.tls_cert, &a.tls_key)?;
            cfg.tls = Some(id.config);
            cfg.tls_required = true;
            Some(id.fingerprint)
        }
        false => None,
    };
    let unix = unix_listener(a.unix.as_deref(), cfg.caps & ferry_proto::caps::SAME_HOST != 0)?;
    let metrics = match &a.metrics {
        Some(m) => {
            let l = TcpListener::bind(listen_addr(m))
                .map_err(|e| format!("cannot serve metrics on {m}: {e} (expected HOST:PORT or PORT)"))?;
            let at = l.local_addr().map_err(|e| e.to_string())?;
            tracing::info!("metrics at http://{at}/metrics");
            Some(l)
        }
        None => None,
    };
    // The token last: a server that cannot start (a typo in the export's
    // name, an address in use) must not leave a new secret behind.
    if !a.no_auth && a.config.is_none() {
        let path = match token_file {
            Some(p) => p.to_path_buf(),
            None => ferry_client::token::default_token_file()
                .ok_or("no token file: set --token-file, HOME or XDG_CONFIG_HOME, or use --no-auth")?,
        };
        cfg.token = Some(server_token(&path)?);
    }
    // Scripts wait for this exact first line. One write: a script that
    // reads only it and closes the pipe must not fail the second.
    let mut said = format!("listening on {local}\n");
    if let Some(p) = &a.unix {
        said += &format!("listening on unix:{}\n", p.display());
    }
    let mut out = std::io::stdout();
    out.write_all(said.as_bytes()).and_then(|_| out.flush()).map_err(|e| e.to_string())?;
    let listeners = ferry_server::Listeners { tcp: Some(listener), unix, metrics };
    if let Some(fp) = &tls_said {
        tracing::info!("TLS required of TCP clients; certificate {fp} (clients trust it on first use)");
    } else if !local.ip().is_loopback() {
        tracing::warn!("serving {local} without TLS (--no-tls): anyone on the path can read and change what passes");
    }
    let res = match export {
        Export::Memory(b) => ferry_server::serve(listeners, Arc::new(b), cfg),
        Export::Dir(b) => ferry_server::serve(listeners, Arc::new(b), cfg),
        Export::Several(x) => ferry_server::serve(listeners, x, cfg),
    };
    res.map_err(|e| e.to_string())
}

/// The certificate and key TLS is served with: given, or the default
/// pair, made on first use.
fn tls_identity(cert: &Option<PathBuf>, key: &Option<PathBuf>) -> Result<ferry_server::tls::Identity, String> {
    let (cert, key) = match (cert, key) {
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        _ => {
            let dir = ferry_client::token::config_dir()
                .ok_or("no place for a TLS certificate: set --tls-cert and --tls-key, HOME or XDG_CONFIG_HOME")?
                .join("tls");
            (dir.join("cert.pem"), dir.join("key.pem"))
        }
    };
    let id = ferry_server::tls::load_or_make(&cert, &key)?;
    if id.made {
        tracing::info!("made a TLS certificate {} (key {})", cert.display(), key.display());
    }
    Ok(id)
}

/// The Unix listener: at `path` if given (replacing a socket file no server
/// answers on any more), else an abstract one with a random name if the
/// same-host path is offered, else none.
fn unix_listener(path: Option<&Path>, same_host: bool) -> Result<Option<(UnixListener, String)>, String> {
    if let Some(p) = path {
        let stale = std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket())
            && std::os::unix::net::UnixStream::connect(p).is_err();
        if stale {
            let _ = std::fs::remove_file(p);
        }
        let l = UnixListener::bind(p).map_err(|e| format!("--unix {}: {e}", p.display()))?;
        return Ok(Some((l, format!("unix:{}", p.display()))));
    }
    if !same_host {
        return Ok(None);
    }
    let mut r = [0u8; 8];
    getrandom::getrandom(&mut r).map_err(|e| format!("no randomness: {e}"))?;
    let name = format!("ferry-{}-{:016x}", std::process::id(), u64::from_le_bytes(r));
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| e.to_string())?;
    // Another network name space (a container) cannot reach it: its
    // clients stay on TCP.
    match UnixListener::bind_addr(&addr) {
        Ok(l) => Ok(Some((l, format!("unix:@{name}")))),
        Err(e) => {
            tracing::warn!("no same-host socket ({e}); local clients use TCP");
            Ok(None)
        }
    }
}

/// The state directory to use: the one asked for, or the default one for
/// this export served on this address — two servers of one directory (on
/// different addresses: gateways tried on one machine) each keep their own,
/// and a restart on the same address finds its own again. Either must
/// work, or the server refuses to start (before `listening on`), saying
/// how to choose: sessions silently kept in memory only would not survive
/// the restart they promise to.
fn state_dir(
    asked: &Option<PathBuf>,
    none: bool,
    export: &Path,
    addr: &std::net::SocketAddr,
) -> Result<Option<Arc<ferry_server::StateDir>>, String> {
    if none {
        return Ok(None);
    }
    if let Some(d) = asked {
        let held = ferry_server::open_state_dir(d).map_err(|e| {
            format!(
                "--state-dir {}: {e} (give each server its own, or use --no-state to keep sessions in memory only)",
                d.display()
            )
        })?;
        return Ok(Some(held));
    }
    let base = match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(v) => PathBuf::from(v),
        None => match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
            Some(h) => PathBuf::from(h).join(".local/state"),
            None => return Ok(None),
        },
    };
    let serve = base.join("ferry/serve");
    let export = std::fs::canonicalize(export).unwrap_or_else(|_| export.to_path_buf());
    sweep(&serve);
    let key = [export.as_os_str().as_bytes(), b"\n", addr.to_string().as_bytes()].concat();
    let hash = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    let dir = serve.join(format!("{hash:016x}"));
    match ferry_server::open_state_dir(&dir) {
        Ok(held) => {
            // Names the export, for `sweep`. The umask is cleared: the
            // mode is said here, or the file would be everyone's to change
            // (and `sweep` removes what it names the state of).
            let _ = write_private(&dir.join("export"), export.as_os_str().as_bytes());
            Ok(Some(held))
        }
        Err(e) => Err(format!(
            "{e}: sessions could not outlive a restart; give this server a state directory of its own \
             with --state-dir DIR, or keep its sessions in memory only with --no-state"
        )),
    }
}

/// Writes `bytes` to `path`, readable and writable by this user alone,
/// also when an older file was there with another mode.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(bytes)
}

/// The secret in `path`, made there if missing; refused if others may
/// read it (whoever knows it can forge the ids that reach files without
/// walking their paths).
fn id_key(path: &Path) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::PermissionsExt;
    let bad = |e: std::io::Error| format!("--id-key {}: {e}", path.display());
    if !path.exists() {
        let mut k = [0u8; 32];
        getrandom::getrandom(&mut k).map_err(|e| format!("--id-key: no random numbers: {e}"))?;
        let hex: String = k.iter().map(|b| format!("{b:02x}")).collect();
        write_private(path, format!("{hex}\n").as_bytes()).map_err(bad)?;
    }
    let meta = std::fs::metadata(path).map_err(bad)?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!("--id-key {}: others may read it (chmod 600 it)", path.display()));
    }
    let k = std::fs::read(path).map_err(bad)?;
    if k.len() < 16 {
        return Err(format!("--id-key {}: {} bytes; a secret needs at least 16", path.display(), k.len()));
    }
    Ok(k)
}

/// Removes the default state of exports that no longer exist (temporary
/// directories served once), unless a server still holds it.
fn sweep(serve: &Path) {
    let Ok(entries) = std::fs::read_dir(serve) else { return };
    for e in entries.flatten() {
        let Ok(export) = std::fs::read(e.path().join("export")) else { continue };
        if Path::new(std::ffi::OsStr::from_bytes(&export)).exists() {
            continue;
        }
        if ferry_server::check_state_dir(&e.path()).is_ok() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

enum Export {
    Memory(MemoryBackend),
    Dir(PosixBackend),
    Several(Arc<ferry_server::exports::Exports<PosixBackend>>),
}

/// Reads the exports' file again at each `SIGHUP`; a file with an error
/// leaves the exports as they were (said in the log).
fn reload_on_hangup(exports: Arc<ferry_server::exports::Exports<PosixBackend>>, file: PathBuf) -> Result<(), String> {
    let mut signals =
        signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP]).map_err(|e| format!("SIGHUP: {e}"))?;
    std::thread::Builder::new()
        .name("ferry-reload".into())
        .spawn(move || {
            for _ in signals.forever() {
                match exports.reload(&file, PosixBackend::new) {
                    Ok(()) => tracing::info!("reloaded {}: {}", file.display(), exports.names().join(", ")),
                    Err(e) => tracing::warn!("not reloaded, the exports stay as they were: {e}"),
                }
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// `--listen`: `HOST:PORT`, or a bare port meaning that port on 127.0.0.1
/// (loopback: serving beyond this machine is a choice to spell out).
fn listen_addr(s: &str) -> String {
    match s.parse::<u16>() {
        Ok(port) => format!("127.0.0.1:{port}"),
        Err(_) => s.to_string(),
    }
}

/// Log lines on stderr, one per event (`tracing`): `FERRY_LOG` filters
/// them (`warn`, `debug` for every connection, `ferry_server=debug,info`…;
/// default `info`). Each has the time, the level, the message and its
/// fields (the peer's address); never a token.
fn init_log() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("FERRY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Open files on behalf of clients are descriptors: take all the kernel allows.
fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let l = getrlimit(Resource::Nofile);
    if l.current != l.maximum {
        // Keeping the lower limit only makes the server refuse opens sooner.
        let _ = setrlimit(Resource::Nofile, Rlimit { current: l.maximum, maximum: l.maximum });
    }
}

/// Reads the token, or creates the file with a fresh random one (0600).
fn server_token(path: &Path) -> Result<Vec<u8>, String> {
    if path.exists() {
        return ferry_client::token::read_token_file(path).map_err(|e| format!("token file {}: {e}", path.display()));
    }
    if let Some(parent) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let mut raw = [0u8; 32];
    getrandom::getrandom(&mut raw).map_err(|e| format!("no randomness: {e}"))?;
    let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("token file {}: {e}", path.display()))?;
    writeln!(f, "{token}").map_err(|e| format!("token file {}: {e}", path.display()))?;
    tracing::info!("created token file {}", path.display());
    Ok(token.into_bytes())
}
