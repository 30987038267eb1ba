//! `ferry bench`: ferry's throughput and latency beside the machine's raw
//! loopback limits, measured in the same run so the ratios mean something.
//!
//! Every figure is the median of `--runs` repetitions; min and max show the
//! spread. The raw figures come from a second process (`ferry bench-peer`)
//! so both sides of every socket are separate processes, as with ferry.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use ferry_client::{Client, OpenOptions, Options};

// A child of this module (not declared in main.rs) so it shares the
// helpers above without widening their visibility.
#[path = "bench_fuse.rs"]
mod bench_fuse;
#[path = "bench_run.rs"]
mod bench_run;
#[path = "bench_samehost.rs"]
mod bench_samehost;

#[derive(Args)]
pub struct BenchArgs {
    /// File size for the throughput runs, in MiB.
    #[arg(long, default_value_t = 1024)]
    size_mib: u64,
    /// Request (and application buffer) size, in KiB.
    #[arg(long, default_value_t = 1024)]
    block_kib: usize,
    /// Repetitions of each measurement (medians are reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Round trips per latency measurement.
    #[arg(long, default_value_t = 20000)]
    rtts: usize,
    /// Directory the benchmark server exports (default: a fresh temporary
    /// directory, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Tiny sizes, for the test suite: checks the benchmark still runs
    /// (the FUSE part too, which prints "skipped: REASON" without FUSE).
    #[arg(long)]
    quick: bool,
    /// Measure the FUSE mount instead: sequential read and write through
    /// `ferry mount`, stat with caching off and a tree scan, beside a null
    /// FUSE file system (the machine's FUSE ceiling) in the same run.
    #[arg(long)]
    fuse: bool,
    /// Measure `ferry run` instead: `dd` reading and writing through the
    /// preload library at 1M, 64k and 4k blocks, against the library itself.
    #[arg(long)]
    run: bool,
    /// Measure the server's own host instead: `dd` reading and writing
    /// (`conv=fsync`) one file through `ferry mount` and under `ferry run`,
    /// on the same-host path and over TCP, against a local `dd`.
    #[arg(long)]
    same_host: bool,
}

struct Series {
    name: &'static str,
    unit: &'static str,
    values: Vec<f64>,
}

impl Series {
    fn new(name: &'static str, unit: &'static str) -> Self {
        Series { name, unit, values: Vec::new() }
    }
    fn median(&self) -> f64 {
        let mut v = self.values.clone();
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }
    fn min(&self) -> f64 {
        self.values.iter().copied().fold(f64::INFINITY, f64::min)
    }
    fn max(&self) -> f64 {
        self.values.iter().copied().fold(f64::NEG_INFINITY, f64::max)
    }
}

/// Kills and reaps a child process we started when the guard goes away.
pub(crate) struct Reap(pub(crate) Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn exe() -> Result<PathBuf, String> {
    std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))
}

fn mbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

/// What `--quick` prints first: its figures come from sizes far too small
/// to mean anything, and must not be quoted.
pub const QUICK_NOTE: &str =
    "--quick: tiny sizes, one run, to check that everything works; these figures are not measurements";

pub fn run(mut a: BenchArgs) -> Result<(), String> {
    if a.quick {
        println!("{QUICK_NOTE}");
        a.size_mib = a.size_mib.min(8);
        a.runs = a.runs.min(1);
        a.rtts = a.rtts.min(200);
    }
    let bytes = a.size_mib * 1024 * 1024;
    let block = a.block_kib * 1024;
    let (dir, temp) = match &a.dir {
        Some(d) => (d.clone(), false),
        None => {
            let d = std::env::temp_dir().join(format!("ferry-bench-{}", std::process::id()));
            std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
            (d, true)
        }
    };
    let result = if a.same_host {
        bench_samehost::run(a.runs, bytes, a.quick, &dir)
    } else if a.run {
        bench_run::run(a.runs, bytes, a.quick, &dir)
    } else if a.fuse {
        bench_fuse::run(&a, bytes, block, &dir)
    } else if a.quick {
        // FUSE first: it puts back the CPU mask it found, `measure` does not.
        bench_fuse::run(&a, bytes, block, &dir)
            .and_then(|()| measure(&a, bytes, block, &dir))
            .and_then(|()| bench_run::run(a.runs, bytes, true, &dir))
    } else {
        measure(&a, bytes, block, &dir)
    };
    if temp {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

/// Starts the benchmark server and connects to it, this process on CPU 0
/// and the server on CPU 1 when there are two. Returns whether there are.
fn start_pinned(dir: &Path) -> Result<(Reap, u16, Client, bool), String> {
    let cpus = rustix::thread::sched_getaffinity(None).map_err(|e| e.to_string())?;
    let cross = cpus.count() >= 2;
    CROSS.store(cross, std::sync::atomic::Ordering::Relaxed);
    let (server, port) = start_server(dir)?;
    if cross {
        // Throughput runs: client on CPU 0, server and raw peers on CPU 1,
        // as two machines' worth of CPU would be. Unpinned, the kernel
        // sometimes stacks both ends on one core and a figure doubles or
        // halves from run to run.
        pin(None, 0)?;
        pin(Some(server.0.id()), 1)?;
    }
    let client = Client::connect(&format!("127.0.0.1:{port}"), &tcp_options()).map_err(|e| e.to_string())?;
    Ok((server, port, client, cross))
}

fn measure(a: &BenchArgs, bytes: u64, block: usize, dir: &Path) -> Result<(), String> {
    let (server, port, client, cross) = start_pinned(dir)?;
    let mut tcp = Series::new("raw TCP stream, 1 MiB writes", "MB/s");
    let mut read = Series::new("ferry sequential read", "MB/s");
    let mut write = Series::new("ferry sequential write", "MB/s");
    let mut sendfile = Series::new("raw sendfile of the file to TCP", "MB/s");
    let mut recvwrite = Series::new("raw TCP recv + pwrite to a file", "MB/s");
    let mut ping = Series::new("raw TCP ping-pong (64 B), median", "µs");
    let mut null = Series::new("ferry null request (ping), median", "µs");
    let mut stat = Series::new("ferry stat, median", "µs");
    let mut stat99 = Series::new("ferry stat, p99", "µs");
    let mut xping = Series::new("raw TCP ping-pong, cross-core", "µs");
    let mut xnull = Series::new("ferry null request, cross-core", "µs");
    let mut xstat = Series::new("ferry stat, cross-core", "µs");
    // The session machinery's steady-state cost: a client that reconnects
    // keeps its state in a session, a copy of each write until the server
    // commits it (the write verifier), and the server journals its
    // namespace changes (the reply cache in the state directory).
    let mut swrite = Series::new("  same, client in a session", "MB/s");
    let mut sread = Series::new("  same, client in a session", "MB/s");
    let mut fwrite = Series::new("ferry write + fsync", "MB/s");
    let mut sfwrite = Series::new("  same, client in a session", "MB/s");
    let mut ns = Series::new("ferry mkdir + rmdir, per call", "µs");
    let mut sns = Series::new("  same, client in a session", "µs");
    let opts = Options { reconnect: Some(Duration::from_secs(60)), ..tcp_options() };
    let session = Client::connect(&format!("127.0.0.1:{port}"), &opts).map_err(|e| e.to_string())?;
    // The same figures through a second server of the directory that
    // requires TLS: what encryption costs, in this run.
    let (tls_server, tls) = start_tls(dir, cross)?;
    let mut tread = Series::new("  same, TLS", "MB/s");
    let mut twrite = Series::new("  same, TLS", "MB/s");
    // The TLS server sits on CPU 1 as the throughput runs want it: its
    // stat is a cross-core round trip, beside the plaintext cross-core one.
    let mut tstat = Series::new("  same, TLS", "µs");
    let calls = if a.quick { 100 } else { 2000 };
    for run in 0..a.runs {
        progress("throughput: raw TCP, sendfile, ferry read and write, TLS", run, a.runs);
        tcp.values.push(raw_stream(bytes)?);
        write.values.push(ferry_write(&client, bytes, block)?);
        swrite.values.push(ferry_write(&session, bytes, block)?);
        fwrite.values.push(ferry_write_sync(&client, bytes, block, true)?);
        sfwrite.values.push(ferry_write_sync(&session, bytes, block, true)?);
        read.values.push(ferry_read(&client, "/bench.dat", bytes, block)?);
        sread.values.push(ferry_read(&session, "/bench.dat", bytes, block)?);
        tread.values.push(ferry_read(&tls, "/bench.dat", bytes, block)?);
        twrite.values.push(ferry_write(&tls, bytes, block)?);
        ns.values.push(mkdir_rmdir(&client, calls)?);
        sns.values.push(mkdir_rmdir(&session, calls)?);
        sendfile.values.push(raw_sendfile(&dir.join("bench.dat"), bytes)?);
        recvwrite.values.push(raw_recv_write(&dir.join("raw.dat"), bytes)?);
        let addr = format!("127.0.0.1:{port}");
        progress("latency: ping-pong, null request, stat", run, a.runs);
        let lat = latencies(&addr, server.0.id(), a.rtts, 0, cross)?;
        ping.values.push(lat.raw);
        null.values.push(lat.null);
        stat.values.push(lat.stat);
        stat99.values.push(lat.stat99);
        tstat.values.push(latencies_on(&tls, a.rtts, 0)?.stat);
        if cross {
            let lat = latencies(&addr, server.0.id(), a.rtts, 1, cross)?;
            xping.values.push(lat.raw);
            xnull.values.push(lat.null);
            xstat.values.push(lat.stat);
        }
    }
    drop(server);
    drop(tls_server);
    println!(
        "ferry bench: {} MiB file, {} KiB requests, {} runs, {} round trips each; medians (min..max);\n\
         pinned: client CPU 0, server/peer CPU 1; same-core latencies: all on CPU 0",
        a.size_mib, a.block_kib, a.runs, a.rtts
    );
    println!("{:<36} {:>10} {:>22} {:>22}", "figure", "median", "min..max", "ratio");
    let _ = std::fs::remove_file(dir.join("raw.dat"));
    let raw_tcp = tcp.median();
    let raw_rtt = ping.median();
    for (s, ratio) in [
        (&tcp, String::new()),
        (&sendfile, String::new()),
        (&recvwrite, String::new()),
        (
            &read,
            format!(
                "{:.0} % of raw TCP, {:.0} % of raw sendfile",
                100.0 * read.median() / raw_tcp,
                100.0 * read.median() / sendfile.median()
            ),
        ),
        (&sread, format!("{:.2} x without", sread.median() / read.median())),
        (&tread, format!("{:.2} x plaintext", tread.median() / read.median())),
        (
            &write,
            format!(
                "{:.0} % of raw TCP, {:.0} % of raw recv+pwrite",
                100.0 * write.median() / raw_tcp,
                100.0 * write.median() / recvwrite.median()
            ),
        ),
        (&swrite, format!("{:.2} x without", swrite.median() / write.median())),
        (&twrite, format!("{:.2} x plaintext", twrite.median() / write.median())),
        (&fwrite, String::new()),
        (&sfwrite, format!("{:.2} x without", sfwrite.median() / fwrite.median())),
        (&ns, String::new()),
        (&sns, format!("{:.2} x without", sns.median() / ns.median())),
        (&ping, String::new()),
        (&null, format!("{:.2} x raw ping-pong", null.median() / raw_rtt)),
        (&stat, format!("{:.2} x raw ping-pong", stat.median() / raw_rtt)),
        (&stat99, String::new()),
        (&xping, String::new()),
        (&xnull, format!("{:.2} x raw ping-pong", xnull.median() / xping.median())),
        (&xstat, format!("{:.2} x raw ping-pong", xstat.median() / xping.median())),
        (&tstat, format!("{:.2} x plaintext", tstat.median() / if cross { xstat.median() } else { stat.median() })),
    ] {
        if s.values.is_empty() {
            continue;
        }
        println!("{:<36} {:>7.1} {:<4} {:>10.1}..{:<10.1} {ratio}", s.name, s.median(), s.unit, s.min(), s.max());
    }
    Ok(())
}

/// Which measurement of which run is going, on stderr (the table comes on
/// stdout at the end; a full run takes minutes).
pub(crate) fn progress(what: &str, run: usize, runs: usize) {
    eprintln!("ferry bench: run {}/{runs}: {what}", run + 1);
}

pub(crate) fn start_server(dir: &Path) -> Result<(Reap, u16), String> {
    start_server_with(dir, &[])
}

/// A server of `dir` that requires TLS (a certificate made in `dir`, pinned
/// by this client: nothing is added to the user's known servers), pinned as `start_pinned`'s, and a client of it.
fn start_tls(dir: &Path, cross: bool) -> Result<(Reap, Client), String> {
    let (cert, key) = (dir.join("bench-tls-cert.pem"), dir.join("bench-tls-key.pem"));
    let (c, k) = (cert.to_string_lossy().into_owned(), key.to_string_lossy().into_owned());
    let (server, port) = start_server_with(dir, &["--tls", "--tls-cert", &c, "--tls-key", &k, "--no-state"])?;
    if cross {
        pin(Some(server.0.id()), 1)?;
    }
    let id = ferry_server::tls::load_or_make(&cert, &key)?;
    let trust = ferry_client::tls::Trust { fingerprint: Some(id.fingerprint), ..Default::default() };
    let opts = Options { tls: Some(true), trust, ..tcp_options() };
    let client = Client::connect(&format!("127.0.0.1:{port}"), &opts).map_err(|e| format!("TLS client: {e}"))?;
    Ok((server, client))
}

/// `start_server` with more `ferry serve` arguments.
pub(crate) fn start_server_with(dir: &Path, extra: &[&str]) -> Result<(Reap, u16), String> {
    start_server_of(&exe()?, dir, extra)
}

/// `start_server_with`, the server being the ferry binary `bin` (another
/// build, to compare).
pub(crate) fn start_server_of(bin: &Path, dir: &Path, extra: &[&str]) -> Result<(Reap, u16), String> {
    let child = Command::new(bin)
        .args(["serve", "--no-auth", "--no-root-squash", "--listen", "127.0.0.1:0"])
        .args(extra)
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start the server: {e}"))?;
    let mut reap = Reap(child);
    let out = reap.0.stdout.take().ok_or("no server stdout")?;
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).map_err(|e| e.to_string())?;
    let port = line.trim().rsplit(':').next().and_then(|p| p.parse().ok()).ok_or_else(|| match line.trim() {
        "" => "the server it started exited before listening (its message is above)".to_string(),
        l => format!("the server it started said {l:?}, not \"listening on HOST:PORT\""),
    })?;
    Ok((reap, port))
}

fn ferry_write(c: &Client, bytes: u64, block: usize) -> Result<f64, String> {
    ferry_write_sync(c, bytes, block, false)
}

/// Writes `bytes` to a fresh file, `fsync`s it if `sync`, closes: MB/s.
fn ferry_write_sync(c: &Client, bytes: u64, block: usize, sync: bool) -> Result<f64, String> {
    let buf = vec![0x5au8; block];
    let t = Instant::now();
    let mut f =
        c.open("/bench.dat", OpenOptions::new().write(true).create(true).truncate(true)).map_err(|e| e.to_string())?;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(block as u64) as usize;
        f.write_all(&buf[..n]).map_err(|e| e.to_string())?;
        left -= n as u64;
    }
    if sync {
        f.sync_all().map_err(|e| e.to_string())?;
    }
    f.close().map_err(|e| e.to_string())?;
    Ok(mbps(bytes, t.elapsed()))
}

/// `calls` directories made and removed again: µs per call.
fn mkdir_rmdir(c: &Client, calls: usize) -> Result<f64, String> {
    let t = Instant::now();
    for i in 0..calls / 2 {
        c.create_dir(format!("/ns-{i}"), 0o755).map_err(|e| e.to_string())?;
    }
    for i in 0..calls / 2 {
        c.remove_dir(format!("/ns-{i}")).map_err(|e| e.to_string())?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / (calls / 2 * 2) as f64)
}

/// Reads `path` through with `block`-sized reads: MB/s.
fn ferry_read(c: &Client, path: &str, bytes: u64, block: usize) -> Result<f64, String> {
    let mut buf = vec![0u8; block];
    let t = Instant::now();
    let mut f = c.open(path, OpenOptions::new().read(true)).map_err(|e| e.to_string())?;
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    f.close().map_err(|e| e.to_string())?;
    if total != bytes {
        return Err(format!("{path}: read {total} bytes, expected {bytes}"));
    }
    Ok(mbps(bytes, t.elapsed()))
}

/// The peer sends `bytes` in 1 MiB writes; we receive them.
pub(crate) fn raw_stream(bytes: u64) -> Result<f64, String> {
    receive_from_peer(&["source"], bytes, None).map(|(mbps, _)| mbps)
}

/// The peer `sendfile`s the benchmark file: the best a server can do
/// moving this file's pages to a socket.
fn raw_sendfile(path: &Path, bytes: u64) -> Result<f64, String> {
    raw_sendfile_cpu(path, bytes).map(|(mbps, _)| mbps)
}

/// As `raw_sendfile`, with the receiving thread's CPU seconds: on
/// loopback what a receiver spends depends on how the sender sent (pages
/// of a file, or a buffer it just wrote), which `raw_stream_cpu` shows.
pub(crate) fn raw_sendfile_cpu(path: &Path, bytes: u64) -> Result<(f64, f64), String> {
    receive_from_peer(&["sendfile", &path.to_string_lossy()], bytes, None)
}

/// As `raw_sendfile_cpu`, this thread on CPU `me` and the peer on CPU
/// `peer` (this thread's mask is put back afterwards). Unpinned, the
/// kernel keeps a single-threaded peer on its receiver's CPU (it wakes
/// it there), where the receive copy costs a half to a third of what it
/// costs with the two on two CPUs; a ferry client and its multi-threaded
/// server are not kept together so, and must be compared placed alike.
pub(crate) fn raw_sendfile_placed(path: &Path, bytes: u64, me: usize, peer: usize) -> Result<(f64, f64), String> {
    receive_from_peer(&["sendfile", &path.to_string_lossy()], bytes, Some((me, peer)))
}

/// As `raw_sendfile_placed`, the receive buffer 16 bytes past a page
/// boundary, where glibc's `malloc` puts a 1 MiB block of a fresh `mmap`.
pub(crate) fn raw_sendfile_placed_skewed(
    path: &Path,
    bytes: u64,
    me: usize,
    peer: usize,
) -> Result<(f64, f64), String> {
    receive_into(&["sendfile", &path.to_string_lossy()], bytes, Some((me, peer)), Sink::Buffer(16))
}

/// As `raw_sendfile_placed`, the receiver taking none of the bytes into
/// its memory: spliced from the socket into a pipe and on to /dev/null.
/// What TCP's receive costs without its copy: a FUSE daemon that spliced
/// its socket into `/dev/fuse` would pay this, and the kernel's FUSE copy
/// into the reader's pages (which a null FUSE read pays too) on top.
pub(crate) fn raw_sendfile_spliced_placed(
    path: &Path,
    bytes: u64,
    me: usize,
    peer: usize,
) -> Result<(f64, f64), String> {
    receive_into(&["sendfile", &path.to_string_lossy()], bytes, Some((me, peer)), Sink::Spliced)
}

/// As `raw_stream`, with the receiving thread's CPU seconds.
pub(crate) fn raw_stream_cpu(bytes: u64) -> Result<(f64, f64), String> {
    receive_from_peer(&["source"], bytes, None)
}

/// CPU seconds this thread has run, to the nanosecond (not clock ticks:
/// a 1 GiB receive takes a few of those). The clock brings the count up
/// to date first; `/proc/thread-self/schedstat` may not have counted the
/// time since the thread's last tick or switch.
fn thread_cpu() -> Result<f64, String> {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Ok(t.tv_sec as f64 + t.tv_nsec as f64 / 1e9)
}

/// A zeroed buffer of `len` bytes starting `skew` bytes past a 4 KiB
/// boundary: the buffer and where in it the `len` bytes start. The
/// kernel's receive copy from a file's pages costs about twice as much on
/// this machine's CPUs when the destination is not cache-line aligned the
/// way the source is (`rep movsb`), and where the allocator puts a 1 MiB
/// `Vec` (a fresh `mmap`: 16 bytes past a page; or reused heap: anywhere)
/// would decide a figure; receivers that are compared get the same skew.
pub(crate) fn placed_buf(len: usize, skew: usize) -> (Vec<u8>, usize) {
    let v = vec![0u8; len + 4096 + skew];
    let start = v.as_ptr().align_offset(4096) + skew;
    (v, start)
}

/// Starts `ferry bench-peer MODE ADDR BYTES [PATH]` and times receiving
/// `bytes` from it into a 1 MiB buffer: MB/s, and the CPU seconds the
/// receiving thread spent. `place`: this thread's CPU and the peer's
/// (else the peer goes where `pin_peer` puts it).
fn receive_from_peer(mode_and_path: &[&str], bytes: u64, place: Option<(usize, usize)>) -> Result<(f64, f64), String> {
    receive_into(mode_and_path, bytes, place, Sink::Buffer(0))
}

/// Where a raw receiver puts what it receives.
enum Sink {
    /// A 1 MiB buffer this many bytes past a page.
    Buffer(usize),
    /// Nowhere: spliced through a pipe to /dev/null, never copied.
    Spliced,
}

/// `receive_from_peer` into `sink`; this thread's mask is put back after.
fn receive_into(
    mode_and_path: &[&str],
    bytes: u64,
    place: Option<(usize, usize)>,
    sink: Sink,
) -> Result<(f64, f64), String> {
    let Some((me, peer_cpu)) = place else { return receive_from_peer_with(mode_and_path, bytes, None, sink) };
    let mask = rustix::thread::sched_getaffinity(None).map_err(|e| e.to_string())?;
    pin(None, me)?;
    let r = receive_from_peer_with(mode_and_path, bytes, Some(peer_cpu), sink);
    rustix::thread::sched_setaffinity(None, &mask).map_err(|e| format!("cannot unpin: {e}"))?;
    r
}

fn receive_from_peer_with(
    mode_and_path: &[&str],
    bytes: u64,
    peer_cpu: Option<usize>,
    sink: Sink,
) -> Result<(f64, f64), String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = l.local_addr().map_err(|e| e.to_string())?.to_string();
    let c = Command::new(exe()?)
        .args(["bench-peer", mode_and_path[0], &addr, &bytes.to_string()])
        .args(&mode_and_path[1..])
        .spawn()
        .map_err(|e| format!("cannot start bench peer: {e}"))?;
    let peer = Reap(c);
    match peer_cpu {
        Some(cpu) => pin(Some(peer.0.id()), cpu)?,
        None => pin_peer(&peer)?,
    }
    let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
    let mut buf = match sink {
        Sink::Buffer(skew) => Some(placed_buf(1024 * 1024, skew)),
        Sink::Spliced => None,
    };
    let (t, cpu) = (Instant::now(), thread_cpu()?);
    match &mut buf {
        Some((v, at)) => {
            let buf = &mut v[*at..*at + 1024 * 1024];
            let mut got = 0u64;
            while got < bytes {
                let n = s.read(buf).map_err(|e| e.to_string())?;
                if n == 0 {
                    return Err(format!("raw {} stream ended early", mode_and_path[0]));
                }
                got += n as u64;
            }
        }
        None => splice_away(&s, bytes).map_err(|e| format!("raw {} stream, spliced: {e}", mode_and_path[0]))?,
    }
    let (elapsed, cpu) = (t.elapsed(), thread_cpu()? - cpu);
    drop(peer);
    Ok((mbps(bytes, elapsed), cpu))
}

/// Moves `bytes` from the socket through a pipe to /dev/null with
/// `splice`: the pipe takes references to the received pages, /dev/null
/// drops them.
fn splice_away(s: &std::net::TcpStream, bytes: u64) -> Result<(), String> {
    use rustix::pipe::{splice, SpliceFlags};
    const PIPE: usize = 1 << 20;
    let (rd, wr) = rustix::pipe::pipe().map_err(|e| format!("pipe: {e}"))?;
    // The default 64 KiB pipe would make it 16 splices per MiB; root may
    // go past the 1 MiB `pipe-max-size`, others get what they may.
    let _ = rustix::pipe::fcntl_setpipe_size(&wr, PIPE);
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
    let mut got = 0u64;
    while got < bytes {
        let want = (bytes - got).min(PIPE as u64) as usize;
        let n =
            splice(s, None, &wr, None, want, SpliceFlags::MOVE).map_err(|e| format!("splice from the socket: {e}"))?;
        if n == 0 {
            return Err("the stream ended early".into());
        }
        let mut left = n;
        while left > 0 {
            let m = splice(&rd, None, &null, None, left, SpliceFlags::MOVE)
                .map_err(|e| format!("splice to /dev/null: {e}"))?;
            left -= m;
        }
        got += n as u64;
    }
    Ok(())
}

/// Receives a raw stream and writes it into a file: the best a server can
/// do taking data from a socket into this directory's page cache.
fn raw_recv_write(path: &Path, bytes: u64) -> Result<f64, String> {
    use std::os::unix::fs::FileExt;
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = l.local_addr().map_err(|e| e.to_string())?.to_string();
    let _peer = spawn_peer("source", &addr, bytes)?;
    let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 1024 * 1024];
    let t = Instant::now();
    let f = std::fs::File::create(path).map_err(|e| e.to_string())?;
    let mut got = 0u64;
    while got < bytes {
        let want = (bytes - got).min(buf.len() as u64) as usize;
        s.read_exact(&mut buf[..want]).map_err(|e| e.to_string())?;
        f.write_all_at(&buf[..want], got).map_err(|e| e.to_string())?;
        got += want as u64;
    }
    drop(f);
    Ok(mbps(bytes, t.elapsed()))
}

/// Medians (µs) of the three round trips, and the p99 of `stat`.
pub(crate) struct Latencies {
    pub(crate) raw: f64,
    pub(crate) null: f64,
    pub(crate) stat: f64,
    pub(crate) stat99: f64,
}

/// Raw peers run where the server runs: CPU 1 when there are two.
fn pin_peer(peer: &Reap) -> Result<(), String> {
    if CROSS.load(std::sync::atomic::Ordering::Relaxed) {
        pin(Some(peer.0.id()), 1)?;
    }
    Ok(())
}

/// Whether there are two CPUs to place the two ends on (decided before this
/// process pins itself, after which its own mask shows one CPU).
static CROSS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Pins every thread of a process (`None`: this thread) to one CPU;
/// threads they start afterwards inherit the mask. (Every thread: a
/// server's workers start before it is pinned.)
pub(crate) fn pin(pid: Option<u32>, cpu: usize) -> Result<(), String> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    set_mask(pid, &set)
}

/// Gives every thread of a process (`None`: this thread) the CPU mask
/// `set`: `pin`, or putting back a mask `pin` replaced (on every thread,
/// or the threads alive while pinned would stay on one CPU).
pub(crate) fn set_mask(pid: Option<u32>, set: &rustix::thread::CpuSet) -> Result<(), String> {
    let set_one = |tid: Option<rustix::process::Pid>| {
        rustix::thread::sched_setaffinity(tid, set).map_err(|e| format!("cannot set the CPU mask: {e}"))
    };
    let Some(pid) = pid else { return set_one(None) };
    set_one(rustix::process::Pid::from_raw(pid as i32))?;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| format!("threads of {pid}: {e}"))?;
    for t in tasks.flatten() {
        let tid = t.file_name().to_str().and_then(|n| n.parse().ok()).and_then(rustix::process::Pid::from_raw);
        // A thread that ended meanwhile is no matter.
        let _ = set_one(tid);
    }
    Ok(())
}

/// Client options for figures compared with raw TCP: the data stays on
/// TCP although the server is on this host (`ferry compare` experiment 9
/// measures the same-host path).
fn tcp_options() -> Options {
    Options { same_host: false, ..Options::default() }
}

/// Raw ping-pong, ferry's null request and `stat`, with this process on
/// CPU 0 and the server and the echo peer on `peer_cpu`: a round trip on
/// this VM costs ~4 µs within a core and ~15 µs across cores, and an
/// unpinned run flips between the two, so ratios only hold for one
/// placement at a time. Batches interleave the three for the same reason.
pub(crate) fn latencies(addr: &str, server: u32, n: usize, peer_cpu: usize, cross: bool) -> Result<Latencies, String> {
    pin(None, 0)?;
    pin(Some(server), peer_cpu)?;
    // A fresh connection: its server thread starts with the pinned mask.
    let c = Client::connect(addr, &tcp_options()).map_err(|e| e.to_string());
    let r = c.and_then(|c| latencies_on(&c, n, peer_cpu));
    // Back to the throughput placement.
    pin(Some(server), if cross { 1 } else { 0 })?;
    r
}

fn latencies_on(c: &Client, n: usize, peer_cpu: usize) -> Result<Latencies, String> {
    const BATCHES: usize = 20;
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = l.local_addr().map_err(|e| e.to_string())?.to_string();
    let per = n.div_ceil(BATCHES);
    let peer = spawn_peer("echo", &addr, (per * BATCHES) as u64)?;
    pin(Some(peer.0.id()), peer_cpu)?;
    let _peer = peer;
    let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    let hist = || hdrhistogram::Histogram::<u64>::new(3).map_err(|e| e.to_string());
    let (mut raw, mut null, mut stat) = (hist()?, hist()?, hist()?);
    let mut msg = [7u8; 64];
    let e = |e: std::io::Error| e.to_string();
    for _ in 0..BATCHES {
        for _ in 0..per {
            let t = Instant::now();
            s.write_all(&msg).map_err(e)?;
            s.read_exact(&mut msg).map_err(e)?;
            raw.record(t.elapsed().as_nanos() as u64).map_err(|e| e.to_string())?;
        }
        for _ in 0..per {
            let t = Instant::now();
            c.ping().map_err(|e| e.to_string())?;
            null.record(t.elapsed().as_nanos() as u64).map_err(|e| e.to_string())?;
        }
        for _ in 0..per {
            let t = Instant::now();
            c.metadata("/bench.dat").map_err(|e| e.to_string())?;
            stat.record(t.elapsed().as_nanos() as u64).map_err(|e| e.to_string())?;
        }
    }
    let us = |h: &hdrhistogram::Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1e3;
    Ok(Latencies { raw: us(&raw, 0.5), null: us(&null, 0.5), stat: us(&stat, 0.5), stat99: us(&stat, 0.99) })
}

fn spawn_peer(mode: &str, addr: &str, n: u64) -> Result<Reap, String> {
    let c = Command::new(exe()?)
        .args(["bench-peer", mode, addr, &n.to_string()])
        .spawn()
        .map_err(|e| format!("cannot start bench peer: {e}"))?;
    let peer = Reap(c);
    pin_peer(&peer)?;
    Ok(peer)
}

/// The other process of a raw measurement.
pub fn peer(mode: &str, addr: &str, n: u64, path: Option<&Path>) -> Result<(), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    match mode {
        "sendfile" => {
            let f = std::fs::File::open(path.ok_or("sendfile needs a path")?).map_err(|e| e.to_string())?;
            let mut off = 0u64;
            while off < n {
                let want = (n - off).min(1 << 20) as usize;
                let k = rustix::fs::sendfile(&s, &f, Some(&mut off), want).map_err(|e| e.to_string())?;
                if k == 0 {
                    return Err("file shorter than expected".into());
                }
            }
        }
        "source" => {
            let buf = vec![0x5au8; 1024 * 1024];
            let mut left = n;
            while left > 0 {
                let k = left.min(buf.len() as u64) as usize;
                s.write_all(&buf[..k]).map_err(|e| e.to_string())?;
                left -= k as u64;
            }
        }
        "echo" => {
            let mut msg = [0u8; 64];
            for _ in 0..n {
                s.read_exact(&mut msg).map_err(|e| e.to_string())?;
                s.write_all(&msg).map_err(|e| e.to_string())?;
            }
        }
        other => return Err(format!("unknown peer mode {other}")),
    }
    Ok(())
}
