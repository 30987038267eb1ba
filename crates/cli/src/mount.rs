//! `ferry mount` and `ferry umount`.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use ferry_client::Url;
use ferry_fuse::{FerryFs, FsOptions, MountConfig};
use rustix::io::Errno;
use rustix::mount::UnmountFlags;

use crate::commands::{Clients, RECONNECT_FOR};

#[derive(Args)]
pub struct MountArgs {
    /// What to mount: ferry://HOST:PORT/path.
    url: String,
    /// An existing directory to mount on.
    mountpoint: PathBuf,
    /// Mount read-only.
    #[arg(long)]
    read_only: bool,
    /// Seconds the kernel trusts file attributes (size, times, mode) before
    /// asking the server again; 0 asks on every stat.
    #[arg(long, default_value_t = 1.0, value_name = "S")]
    attr_timeout: f64,
    /// Seconds the kernel trusts a name lookup (and a "no such file")
    /// before asking the server again; 0 asks every time.
    #[arg(long, default_value_t = 1.0, value_name = "S")]
    entry_timeout: f64,
    /// Seconds the kernel keeps what a server that sees every change
    /// promised (a lease): until the server says it changed, and at most
    /// this. 0: leases never lengthen the two timeouts above.
    #[arg(long, default_value_t = 60.0, value_name = "S")]
    lease_timeout: f64,
    /// Let other users use the mount (allow_other). Against a server that
    /// does not act as each caller, implies -o default_permissions, so the
    /// kernel checks their rights.
    #[arg(long)]
    allow_other: bool,
    /// Cache file data in the kernel page cache (refreshed on open and when
    /// the server's mtime or size changes) instead of direct I/O.
    #[arg(long)]
    cache: bool,
    /// Hand files the client cache holds (see docs/caching.md) to
    /// the kernel with FUSE passthrough (Linux ≥ 6.9, root): a first read
    /// at local-disk speed, but while a program reads a file so, opening it
    /// for writing on this mount fails with ETXTBSY (a kernel rule).
    #[arg(long, conflicts_with = "no_passthrough")]
    passthrough: bool,
    /// The default: cached files use the kernel page cache (kept across
    /// opens while the file is unchanged). Kept for older command lines.
    #[arg(long, hide = true)]
    no_passthrough: bool,
    /// Extra mount options, comma-separated (e.g. -o default_permissions,noexec).
    #[arg(short = 'o', value_delimiter = ',', value_name = "OPT")]
    options: Vec<String>,
    /// Answer `GET /metrics` (Prometheus text format) on this address
    /// (HOST:PORT; port 0 picks one, said on stderr): the mount's requests
    /// to its server by operation, and its reconnects.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// When the server goes away, retry for ever (as an NFS hard mount)
    /// instead of giving up with EIO after 60 s.
    #[arg(long)]
    hard: bool,
    /// Return once the mount is ready, leaving the daemon running.
    #[arg(long)]
    background: bool,
    /// Threads serving kernel requests.
    #[arg(long, default_value_t = 4, hide = true)]
    threads: usize,
    /// Internal: the daemon half of --background; prints "ready" on stdout.
    #[arg(long, hide = true)]
    daemon: bool,
}

fn timeout(name: &str, s: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(s).map_err(|_| format!("--{name}: {s} is not a number of seconds"))
}

fn errno_text(e: Errno) -> String {
    let s = io::Error::from(e).to_string();
    s.split(" (os error").next().unwrap_or(&s).to_string()
}

pub fn mount(a: MountArgs, tf: Option<&Path>) -> Result<(), String> {
    let opts = FsOptions {
        attr_timeout: timeout("attr-timeout", a.attr_timeout)?,
        entry_timeout: timeout("entry-timeout", a.entry_timeout)?,
        lease_timeout: timeout("lease-timeout", a.lease_timeout)?,
        cache: a.cache,
        passthrough: a.passthrough,
        same_host_passthrough: true,
    };
    let url = Url::parse(&a.url)?;
    let mp = a.mountpoint.clone();
    if a.background {
        return background(&a, tf);
    }
    if a.daemon {
        // Leave the caller's session: a Ctrl-C or hang-up meant for the
        // shell that ran `ferry mount --background` must not reach us.
        let _ = rustix::process::setsid();
    }
    clean_dead_mount(&mp)?;
    match std::fs::metadata(&mp) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("{}: Not a directory", mp.display())),
        Err(e) => return Err(format!("{}: {}", mp.display(), strip(&e))),
    }
    let metrics = match &a.metrics {
        Some(m) => {
            let l = std::net::TcpListener::bind(m)
                .map_err(|e| format!("cannot serve metrics on {m}: {e} (expected HOST:PORT)"))?;
            Some((l, Arc::new(ferry_metrics::Ops::default())))
        }
        None => None,
    };
    let client = Clients::new(tf)
        .reconnecting_for(if a.hard { Duration::MAX } else { RECONNECT_FOR })
        .counting(metrics.as_ref().map(|(_, ops)| Arc::clone(ops)))
        .get(&url)?;
    // The FUSE transport's counters, known once the mount is up.
    let transport: Arc<std::sync::OnceLock<ferry_fuse::TransportHandle>> = Arc::default();
    if let Some((l, ops)) = metrics {
        let at = l.local_addr().map_err(|e| e.to_string())?;
        let c = client.clone();
        let tr = Arc::clone(&transport);
        ferry_metrics::serve_http(l, move || {
            let t = tr.get().map(|h| h.get());
            let (ring, dev, on) = t.as_ref().map_or((0, 0, 0), |t| (t.ring_requests, t.dev_requests, u64::from(t.ring_on())));
            let lent = t.map_or(0, |t| t.lent_replies);
            ops.render(
                "ferry_client",
                &[
                    (
                        "ferry_client_reconnects_total",
                        "Connections to the server made again.",
                        "counter",
                        c.reconnect_count(),
                    ),
                    (
                        "ferry_client_sessions_lost_total",
                        "Reconnects that found the session gone (server restarted, another gateway).",
                        "counter",
                        c.sessions_lost(),
                    ),
                    (
                        "ferry_fuse_ring_requests_total",
                        "Kernel requests served from FUSE-over-io_uring ring entries.",
                        "counter",
                        ring,
                    ),
                    (
                        "ferry_fuse_dev_requests_total",
                        "Kernel requests read from /dev/fuse after INIT (FORGET and INTERRUPT, which only it carries, not counted).",
                        "counter",
                        dev,
                    ),
                    (
                        "ferry_fuse_ring_lent_replies_total",
                        "Replies whose data went straight into the ring entry's buffer (reads), not copied there.",
                        "counter",
                        lent,
                    ),
                    ("ferry_fuse_ring_on", "1 when the mount serves FUSE over io_uring.", "gauge", on),
                ],
            )
        })
        .map_err(|e| format!("metrics: {e}"))?;
        eprintln!("ferry mount: metrics at http://{at}/metrics");
    }
    match client.metadata(&url.path) {
        Ok(attr) if attr.is_dir() => {}
        Ok(_) => return Err(format!("{url}: Not a directory")),
        Err(e) => return Err(format!("{url}: {e}")),
    }
    let cfg = MountConfig {
        fs: opts.clone(),
        read_only: a.read_only,
        allow_other: a.allow_other,
        auto_unmount: fusermount3().is_some(),
        fsname: url.to_string(),
        options: a.options.clone(),
        threads: a.threads,
        dev_fuse_only: false,
    };
    let fs = FerryFs::new(client, &url.path, opts);
    let session =
        ferry_fuse::spawn(fs, &mp, &cfg).map_err(|e| format!("{}: mount failed: {}", mp.display(), strip(&e)))?;
    let _ = transport.set(session.transport_handle());
    let transport = session.transport();
    // Said once: where the kernel offers no rings, /dev/fuse serves.
    let fallback = (!transport.ring_on() && transport.ring != ferry_fuse::RingState::Off)
        .then(|| format!("ferry: {}: {transport}", mp.display()));
    if a.daemon {
        if let Some(f) = &fallback {
            eprintln!("{f}");
        }
        tell_parent_ready()?;
    } else {
        // In the foreground nothing else says the mount is up.
        eprintln!("ferry: {url} mounted on {}; Ctrl-C or `ferry umount` unmounts", mp.display());
        if let Some(f) = &fallback {
            eprintln!("{f}");
        }
    }
    serve_until_unmounted(session, &mp)
}

/// Writes "ready" to the parent's pipe, then points stdout and stderr at
/// /dev/null: the parent exits, and a later write to its pipes would fail.
fn tell_parent_ready() -> Result<(), String> {
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
    let mut out = io::stdout().lock();
    out.write_all(b"ready\n").and_then(|()| out.flush()).map_err(|e| format!("notifying the parent: {e}"))?;
    drop(out);
    let _ = rustix::stdio::dup2_stdout(&null);
    let _ = rustix::stdio::dup2_stderr(&null);
    Ok(())
}

/// Serves until the mount goes away (`ferry umount`, `umount`) or a signal
/// asks us to unmount.
fn serve_until_unmounted(session: ferry_fuse::Mounted, mp: &Path) -> Result<(), String> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .map_err(|e| format!("installing signal handlers: {e}"))?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for s in signals.forever() {
            if tx.send(s).is_err() {
                break;
            }
        }
    });
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(_) => break,
            Err(mpsc::RecvTimeoutError::Timeout) if session.is_finished() => {
                // Unmounted from outside; the session has ended.
                return session.join().map_err(|e| format!("{}: {e}", mp.display()));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    match unmount(mp) {
        Ok(()) => session.join().map_err(|e| format!("{}: {e}", mp.display())),
        Err(Errno::BUSY) => {
            // Asked to stop while something still uses the mount: detach it
            // so new users cannot enter, and exit; the remaining users see
            // ENOTCONN once we are gone.
            let _ = detach(mp);
            Err(format!("{}: mount was busy; detached it lazily", mp.display()))
        }
        Err(e) => Err(format!("{}: unmount failed: {}", mp.display(), errno_text(e))),
    }
}

/// Unmounts directly (we are usually root), else through fusermount3.
fn unmount(mp: &Path) -> Result<(), Errno> {
    match rustix::mount::unmount(mp, UnmountFlags::empty()) {
        Err(Errno::PERM) => {
            let Some(fm) = fusermount3() else { return Err(Errno::PERM) };
            let out = Command::new(fm).arg("-u").arg("--").arg(mp).stdin(Stdio::null()).output();
            match out {
                Ok(o) if o.status.success() => Ok(()),
                Ok(o) if String::from_utf8_lossy(&o.stderr).contains("busy") => Err(Errno::BUSY),
                _ => Err(Errno::PERM),
            }
        }
        r => r,
    }
}

/// A FUSE mount whose daemon died answers every access with ENOTCONN and
/// blocks a new mount there; detach it.
fn clean_dead_mount(mp: &Path) -> Result<(), String> {
    match std::fs::metadata(mp) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            detach(mp)
                .map_err(|e| format!("{}: dead mount, and detaching it failed: {}", mp.display(), errno_text(e)))?;
            eprintln!("ferry: {}: removed a dead mount left by a daemon that died", mp.display());
            Ok(())
        }
        _ => Ok(()),
    }
}

fn fusermount3() -> Option<PathBuf> {
    ferry_fuse::fusermount3()
}

/// Detaches a mount lazily: directly as root, else through fusermount3
/// (a user may detach their own mounts).
fn detach(mp: &Path) -> Result<(), Errno> {
    match rustix::mount::unmount(mp, UnmountFlags::DETACH) {
        Err(Errno::PERM) => {
            let Some(fm) = fusermount3() else { return Err(Errno::PERM) };
            let st = Command::new(fm).args(["-u", "-z", "--"]).arg(mp).stdin(Stdio::null()).output();
            if st.is_ok_and(|o| o.status.success()) {
                Ok(())
            } else {
                Err(Errno::PERM)
            }
        }
        r => r,
    }
}

/// Starts this program again as the daemon and waits for it to say the
/// mount is ready, or to fail.
fn background(a: &MountArgs, tf: Option<&Path>) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding the ferry binary: {e}"))?;
    let mut cmd = Command::new(exe);
    if let Some(t) = tf {
        cmd.arg("--token-file").arg(t);
    }
    cmd.arg("mount").arg(&a.url).arg(&a.mountpoint).arg("--daemon");
    cmd.arg("--attr-timeout").arg(a.attr_timeout.to_string());
    cmd.arg("--entry-timeout").arg(a.entry_timeout.to_string());
    cmd.arg("--lease-timeout").arg(a.lease_timeout.to_string());
    cmd.arg("--threads").arg(a.threads.to_string());
    for (on, flag) in [
        (a.read_only, "--read-only"),
        (a.allow_other, "--allow-other"),
        (a.cache, "--cache"),
        (a.hard, "--hard"),
        (a.passthrough, "--passthrough"),
    ] {
        if on {
            cmd.arg(flag);
        }
    }
    if let Some(m) = &a.metrics {
        cmd.args(["--metrics", m]);
    }
    if !a.options.is_empty() {
        cmd.arg("-o").arg(a.options.join(","));
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("starting the mount daemon: {e}"))?;
    let mut line = String::new();
    let out = child.stdout.take().expect("piped stdout");
    let _ = BufReader::new(out).read_line(&mut line);
    let mut err = String::new();
    if line.trim() == "ready" {
        // Pass on what the daemon said before it was ready (e.g. a dead
        // mount it cleaned up); it closes stderr once ready.
        let _ = child.stderr.take().expect("piped stderr").read_to_string(&mut err);
        eprint!("{err}");
        return Ok(());
    }
    let _ = child.stderr.take().expect("piped stderr").read_to_string(&mut err);
    let status = child.wait().map_err(|e| format!("waiting for the mount daemon: {e}"))?;
    let err = err.trim().strip_prefix("ferry: ").unwrap_or(err.trim()).to_string();
    if err.is_empty() {
        Err(format!("{}: the mount daemon exited ({status}) before the mount was ready", a.mountpoint.display()))
    } else {
        Err(err)
    }
}

fn strip(e: &io::Error) -> String {
    let s = e.to_string();
    s.split(" (os error").next().unwrap_or(&s).to_string()
}

pub fn umount(mp: &Path) -> Result<(), String> {
    // Unmount first, look later: a `stat` through the mount would go to
    // the daemon, and with its server gone that fails (EIO) for a mount
    // that can be unmounted perfectly well.
    match unmount(mp) {
        Ok(()) => Ok(()),
        Err(Errno::BUSY) => match std::fs::metadata(mp) {
            // Its daemon is gone: nothing can be flushed; detach it.
            Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
                detach(mp).map_err(|e| format!("{}: {}", mp.display(), errno_text(e)))
            }
            _ => Err(format!(
                "{}: mount is busy (a process has a file open or its working directory there); \
                 close those, or detach lazily with umount -l",
                mp.display()
            )),
        },
        Err(Errno::INVAL) => Err(format!("{}: not a mount point", mp.display())),
        Err(e) => Err(format!("{}: {}", mp.display(), errno_text(e))),
    }
}
