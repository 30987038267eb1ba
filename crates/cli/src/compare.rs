//! `ferry compare`: the papers' experiments, run against ferry and, with
//! `--baselines`, against NFS-Ganesha (libnfs), diod (9P2000.L), Samba
//! (libsmbclient) and sshfs in the same run, beside the machine's raw
//! limits.
//!
//! Every measurement is a separate client process printing one line of
//! figures (`ok key=value ...`): the C clients of `bench/clients/` for the
//! baselines, `ferry compare --worker` for ferry and local directories (see
//! `compare/worker.rs`). Servers' CPU time is read from /proc for their
//! whole process tree. Each figure is the median of `--runs` repetitions,
//! with min and max; the tables are printed and written as CSV and JSON.

mod breaks;
mod experiments;
mod floor;
mod load;
mod programs;
mod report;
mod worker;

use experiments::{exp_clients, exp_fetch, exp_read, exp_scan, exp_split, exp_stat, exp_window, exp_write, raw_limits};

use report::{median, print_tables, write_files, Results};

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::bench;

#[derive(clap::Args)]
pub struct CompareArgs {
    /// Tiny sizes, for the test suite.
    #[arg(long)]
    pub quick: bool,
    /// Repetitions of each measurement (medians are reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Directory for results.csv and results.json (default: none written).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also install (if missing), start and measure the baselines with
    /// bench/baselines.sh (also when FERRY_COMPARE_BASELINES=1).
    #[arg(long)]
    pub baselines: bool,
    /// The repository's bench/ directory (baselines.sh, clients/).
    #[arg(long)]
    pub bench_dir: Option<PathBuf>,
    /// Where to create the export directory (default /dev/shm: tmpfs).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Only these experiments, e.g. `--only 1,4` (0 = raw limits).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<u32>,
    /// Only these systems, e.g. `--systems nfs3-ra,ferry-run` (ferry's
    /// library and the local directory are always measured).
    #[arg(long, value_delimiter = ',')]
    pub systems: Vec<String>,
    /// Experiment 6: also hold this many idle clients on ferry's server,
    /// each with a session, and run its largest client count beside them
    /// (the server's memory per idle client, a client's `stat` beside them
    /// against alone).
    #[arg(long, default_value_t = 0)]
    pub idle: usize,
    /// Experiment 6: only these client counts, e.g. `--clients 1,50,200`
    /// (default 1, 10, 50, 100, 200; the mixed point is always run).
    #[arg(long, value_delimiter = ',')]
    pub clients: Vec<usize>,
    /// Internal: one measurement client (see compare/worker.rs).
    #[arg(long, hide = true, num_args = 1.., allow_hyphen_values = true)]
    pub worker: Vec<String>,
}

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

/// Sizes of everything, full or `--quick`.
struct Plan {
    file: u64,
    read_sizes: Vec<u64>,
    write_sizes: Vec<u64>,
    windows: Vec<u32>,
    stats: usize,
    tree: (usize, usize),
    clients: Vec<usize>,
    mix_clients: usize,
    duration: f64,
    raw_bytes: u64,
    rtts: usize,
    /// Experiment 7: file sizes fetched, and bytes fetched per measurement
    /// (small files are fetched several times and the figures divided).
    fetch_sizes: Vec<u64>,
    fetch_bytes: u64,
    /// Experiment 6: idle clients held beside the largest client count.
    idle: usize,
    /// Ferry's server (`host:port`), once started.
    addr: String,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                file: 4 * MIB,
                read_sizes: vec![4 * KIB, 64 * KIB, MIB],
                write_sizes: vec![64 * KIB, MIB],
                windows: vec![1, 4],
                stats: 50,
                tree: (3, 10),
                clients: vec![1, 3],
                mix_clients: 2,
                duration: 0.3,
                raw_bytes: 8 * MIB,
                rtts: 200,
                fetch_sizes: vec![MIB, 4 * MIB],
                fetch_bytes: 8 * MIB,
                idle: 0,
                addr: String::new(),
            }
        } else {
            Plan {
                file: GIB,
                read_sizes: vec![4 * KIB, 8 * KIB, 64 * KIB, MIB, 16 * MIB],
                write_sizes: vec![64 * KIB, MIB, 16 * MIB, 256 * MIB, GIB],
                windows: vec![1, 2, 4, 8, 16],
                stats: 10_000,
                tree: (100, 100),
                clients: vec![1, 10, 50, 100, 200],
                mix_clients: 10,
                duration: 2.0,
                raw_bytes: GIB,
                rtts: 20_000,
                fetch_sizes: vec![MIB, 10 * MIB, 100 * MIB],
                fetch_bytes: 200 * MIB,
                idle: 0,
                addr: String::new(),
            }
        }
    }

    /// Bytes read per measurement at request size `s`: the whole file,
    /// except at small sizes where one-request-at-a-time clients would take
    /// minutes (the rate is steady long before).
    fn read_limit(&self, s: u64) -> u64 {
        match s {
            s if s <= 8 * KIB => self.file.min(128 * MIB),
            s if s <= 64 * KIB => self.file.min(512 * MIB),
            _ => self.file,
        }
    }
}

/// A file system under test and how to run its measurement client.
#[derive(Clone)]
struct System {
    /// Short id used in the CSV.
    name: String,
    /// Program and target; the operation's arguments follow.
    cmd: Vec<String>,
    env: Vec<(String, String)>,
    /// Roots of the server's process tree (CPU accounting).
    server: Vec<u32>,
    /// Client-side daemons (FUSE), counted as client CPU.
    client_side: Vec<u32>,
    writes: bool,
    note: String,
    /// A local directory, not a remote file system: a limit, not a contender.
    local: bool,
}

fn exe() -> Result<String, String> {
    std::env::current_exe()
        .map(|p| p.to_string_lossy().into_owned())
        .map_err(|e| format!("cannot find own executable: {e}"))
}

fn wall() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// CPU seconds of the process trees rooted at `roots` (live processes,
/// plus the children they have reaped), from /proc.
fn tree_cpu(roots: &[u32]) -> f64 {
    if roots.is_empty() {
        return 0.0;
    }
    let mut procs: HashMap<u32, (u32, f64)> = HashMap::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
            let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
            let Some((_, rest)) = s.rsplit_once(')') else { continue };
            let f: Vec<&str> = rest.split_whitespace().collect();
            let n = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            let ppid = f.get(1).and_then(|v| v.parse().ok()).unwrap_or(0);
            procs.insert(pid, (ppid, (n(11) + n(12) + n(13) + n(14)) / 100.0));
        }
    }
    let mut total = 0.0;
    let mut todo: Vec<u32> = roots.to_vec();
    let mut seen = std::collections::HashSet::new();
    while let Some(p) = todo.pop() {
        if !seen.insert(p) {
            continue;
        }
        if let Some((_, cpu)) = procs.get(&p) {
            total += cpu;
        }
        todo.extend(procs.iter().filter(|(_, (pp, _))| *pp == p).map(|(c, _)| *c));
    }
    total
}

/// One measurement's output: `key=value` figures.
type Kv = HashMap<String, f64>;

fn parse_ok(out: &str) -> Result<Kv, String> {
    let line = out.lines().rev().find(|l| l.starts_with("ok ") || l.starts_with("err ")).unwrap_or("");
    if let Some(rest) = line.strip_prefix("ok ") {
        Ok(rest
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .filter_map(|(k, v)| v.parse().ok().map(|v| (k.to_string(), v)))
            .collect())
    } else if let Some(e) = line.strip_prefix("err ") {
        Err(e.to_string())
    } else {
        Err(format!("no result from client (output: {:?})", out.trim()))
    }
}

fn spawn_client(sys: &System, args: &[String]) -> Result<Child, String> {
    Command::new(&sys.cmd[0])
        .args(&sys.cmd[1..])
        .args(args)
        .envs(sys.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: cannot start {}: {e}", sys.name, sys.cmd[0]))
}

/// Waits for a client, killing it after `limit`.
fn finish(mut c: Child, limit: Duration) -> Result<String, String> {
    let t = Instant::now();
    loop {
        match c.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if t.elapsed() > limit => {
                let _ = c.kill();
                let _ = c.wait();
                return Err(format!("client timed out after {} s", limit.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(e.to_string()),
        }
    }
    let mut out = String::new();
    if let Some(mut o) = c.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if !out.contains("ok ") {
        if let Some(mut e) = c.stderr.take() {
            let mut err = String::new();
            let _ = e.read_to_string(&mut err);
            out.push_str(&err);
        }
    }
    Ok(out)
}

/// A measurement with the CPU seconds the server and the client-side
/// daemons spent meanwhile.
struct Measured {
    kv: Kv,
    server_cpu: f64,
    client_cpu: f64,
}

fn measure(sys: &System, args: &[&str]) -> Result<Measured, String> {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let (s0, c0) = (tree_cpu(&sys.server), tree_cpu(&sys.client_side));
    let child = spawn_client(sys, &args)?;
    let out = finish(child, Duration::from_secs(900))?;
    // Let servers reap per-connection children so their CPU is counted.
    std::thread::sleep(Duration::from_millis(30));
    let (s1, c1) = (tree_cpu(&sys.server), tree_cpu(&sys.client_side));
    let kv = parse_ok(&out).map_err(|e| format!("{} {}: {e}", sys.name, args.join(" ")))?;
    let own = own_cpu(&kv);
    Ok(Measured { kv, server_cpu: s1 - s0, client_cpu: c1 - c0 + own })
}

/// The CPU seconds a measurement client reported for itself: `cpu`, to the
/// nanosecond, or (an older worker) its user and system ticks.
fn own_cpu(kv: &Kv) -> f64 {
    kv.get("cpu")
        .copied()
        .unwrap_or_else(|| kv.get("utime").copied().unwrap_or(0.0) + kv.get("stime").copied().unwrap_or(0.0))
}

fn k(kv: &Kv, key: &str) -> f64 {
    kv.get(key).copied().unwrap_or(f64::NAN)
}

fn size_label(s: u64) -> String {
    match s {
        s if s >= GIB && s % GIB == 0 => format!("{}G", s / GIB),
        s if s >= MIB && s % MIB == 0 => format!("{}M", s / MIB),
        s if s >= KIB && s % KIB == 0 => format!("{}K", s / KIB),
        s => s.to_string(),
    }
}

/// Owns everything the run created, and removes it at the end.
struct Run {
    export: PathBuf,
    state: PathBuf,
    script: Option<PathBuf>,
    baselines_started: bool,
    /// Mounts made, unmounted at the end.
    mounts: Vec<(bench::Reap, PathBuf)>,
}

impl Drop for Run {
    fn drop(&mut self) {
        for (mut daemon, mnt) in self.mounts.drain(..) {
            if let Ok(e) = exe() {
                let _ = Command::new(e).arg("umount").arg(&mnt).stderr(Stdio::null()).status();
            }
            // The daemon exits once the kernel has let go of the mount.
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(5) && matches!(daemon.0.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            drop(daemon);
            // A daemon that had to be killed leaves the unmount to
            // fusermount3, a moment later: retry the removal briefly.
            let t = Instant::now();
            while std::fs::remove_dir(&mnt).is_err() && mnt.exists() && t.elapsed() < Duration::from_secs(3) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        if self.baselines_started {
            if let Some(s) = &self.script {
                let _ = Command::new("sh").arg(s).arg("stop").arg(&self.state).stdout(Stdio::null()).status();
            }
        }
        let _ = std::fs::remove_dir_all(&self.export);
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

fn unique(parent: &Path, prefix: &str) -> Result<PathBuf, String> {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let d = parent.join(format!("{prefix}-{}-{nanos}", std::process::id()));
    std::fs::create_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
    Ok(d)
}

/// The test data: a large file of non-repeating bytes, and the tree.
fn make_data(export: &Path, plan: &Plan) -> Result<(), String> {
    use std::io::Write;
    let e = |e: std::io::Error| e.to_string();
    let mut f =
        std::io::BufWriter::with_capacity(MIB as usize, std::fs::File::create(export.join("big.dat")).map_err(e)?);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut block = vec![0u8; MIB as usize];
    for _ in 0..plan.file / MIB {
        for c in block.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&x.to_le_bytes());
        }
        f.write_all(&block).map_err(e)?;
    }
    f.flush().map_err(e)?;
    // Experiment 7: the same data cached (`++`, the AFS naming) and not.
    for &size in &plan.fetch_sizes {
        let label = size_label(size);
        for name in [format!("++fetch-{label}.dat"), format!("fetch-{label}.dat")] {
            let mut f = std::io::BufWriter::new(std::fs::File::create(export.join(name)).map_err(e)?);
            for i in 0..size / MIB {
                block[..8].copy_from_slice(&i.to_le_bytes());
                f.write_all(&block).map_err(e)?;
            }
            f.flush().map_err(e)?;
        }
    }
    // `ferry bench`'s latency loop stats this file.
    std::fs::write(export.join("bench.dat"), b"x").map_err(e)?;
    let (dirs, files) = plan.tree;
    let one_k = vec![b'x'; 1024];
    for d in 0..dirs {
        let dir = export.join("tree").join(format!("d{d:03}"));
        std::fs::create_dir_all(&dir).map_err(e)?;
        for i in 0..files {
            std::fs::write(dir.join(format!("f{i:04}")), &one_k).map_err(e)?;
        }
    }
    Ok(())
}

fn find_bench_dir(a: &CompareArgs) -> PathBuf {
    if let Some(d) = &a.bench_dir {
        return d.clone();
    }
    let here = PathBuf::from("bench");
    if here.join("baselines.sh").exists() {
        return here;
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench")
}

/// Installs (if needed), builds the clients, starts the baselines, and
/// returns the systems that came up plus one status line per baseline.
fn start_baselines(run: &mut Run, bench_dir: &Path) -> (Vec<System>, Vec<String>) {
    let script = bench_dir.join("baselines.sh");
    run.script = Some(script.clone());
    let mut status = Vec::new();
    let sh = |args: &[&str]| -> Result<String, String> {
        let o = Command::new("sh")
            .arg(&script)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        if o.status.success() {
            Ok(out)
        } else {
            Err(format!("{} {}: {}", script.display(), args[0], String::from_utf8_lossy(&o.stderr).trim()))
        }
    };
    if let Err(e) = sh(&["install"]) {
        return (Vec::new(), vec![format!("down all baselines: {e}")]);
    }
    let clients = run.state.join("clients");
    let clients_s = clients.to_string_lossy().into_owned();
    if let Err(e) = sh(&["clients", &clients_s]) {
        status.push(format!("note: some clients did not build: {e}"));
    }
    let export = run.export.to_string_lossy().into_owned();
    let state = run.state.to_string_lossy().into_owned();
    run.baselines_started = true;
    let out = match sh(&["start", &export, &state]) {
        Ok(o) => o,
        Err(e) => return (Vec::new(), vec![format!("down all baselines: {e}")]),
    };
    let pid = |name: &str| -> Vec<u32> {
        std::fs::read_to_string(run.state.join(format!("{name}.pid")))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .into_iter()
            .collect()
    };
    let client = |prog: &str| clients.join(prog).to_string_lossy().into_owned();
    let mut systems = Vec::new();
    for line in out.lines() {
        status.push(line.to_string());
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.first() != Some(&"up") || w.len() < 3 {
            continue;
        }
        let sys = |name: &str, prog: &str, target: &str, server: Vec<u32>, client_side: Vec<u32>| System {
            name: name.to_string(),
            cmd: vec![client(prog), target.to_string()],
            env: Vec::new(),
            server,
            client_side,
            writes: true,
            note: String::new(),
            local: false,
        };
        match w[1] {
            "nfs" => {
                systems.push(sys("nfs3", "nfsbench", w[2], pid("ganesha"), vec![]));
                // The same client with libnfs's own read-ahead (its URL
                // option), beside ferry's read-ahead: a fair small-read
                // comparison needs both.
                let sep = if w[2].contains('?') { '&' } else { '?' };
                let mut ra =
                    sys("nfs3-ra", "nfsbench", &format!("{}{sep}readahead=1048576", w[2]), pid("ganesha"), vec![]);
                ra.writes = false;
                ra.note = "libnfs NFSv3 with readahead=1048576 (libnfs's read-ahead, 1 MiB); reads only".into();
                systems.push(ra);
                if let Some(v4) = w.get(3) {
                    let mut s = sys("nfs4", "nfsbench", v4, pid("ganesha"), vec![]);
                    s.writes = false;
                    s.note = "libnfs 4.0 NFSv4 writes of 4000 B or more fail: writes not measured".into();
                    systems.push(s);
                }
            }
            "9p" => {
                let target = format!("{}:{}", w[2], w.get(3).unwrap_or(&""));
                systems.push(sys("9p", "p9bench", &target, pid("diod"), vec![]));
            }
            "smb" => {
                let mut s = sys("smb", "smbbench", w[2], pid("smbd"), vec![]);
                s.env = vec![
                    ("FERRY_SMB_USER".into(), w.get(3).unwrap_or(&"root").to_string()),
                    ("FERRY_SMB_PASSWORD".into(), w.get(4).unwrap_or(&"").to_string()),
                ];
                s.note = "libsmbclient has no fsync: writes are timed to close".into();
                systems.push(s);
            }
            "sshfs" => systems.push(sys("sshfs", "fsbench", w[2], pid("sshd"), pid("sshfs"))),
            "sshfs-direct" => systems.push(sys("sshfs-direct", "fsbench", w[2], pid("socat"), pid("sshfs-direct"))),
            _ => {}
        }
    }
    (systems, status)
}

/// `ferry mount` of the server, measured with plain file I/O.
fn start_fuse(run: &mut Run, port: u16, env: &[(String, String)]) -> Result<System, String> {
    let (mnt, pid) = start_mount(run, port, &["--attr-timeout", "0", "--entry-timeout", "0"], env)?;
    Ok(System {
        name: "ferry-fuse".into(),
        cmd: vec![exe()?, "compare".into(), "--worker".into(), mnt.to_string_lossy().into_owned()],
        env: Vec::new(),
        server: Vec::new(),
        client_side: vec![pid],
        writes: true,
        note: "ferry mount --attr-timeout 0 --entry-timeout 0 (direct I/O)".into(),
        local: false,
    })
}

/// A `ferry mount` of the server with `args`, kept in `run` (unmounted at
/// its end): its mount point and daemon's pid once the kernel shows it.
fn start_mount(run: &mut Run, port: u16, args: &[&str], env: &[(String, String)]) -> Result<(PathBuf, u32), String> {
    let mnt = unique(&run.state, "mnt-ferry")?;
    let child = Command::new(exe()?)
        .args(["mount", &format!("ferry://127.0.0.1:{port}/"), &mnt.to_string_lossy()])
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start ferry mount: {e}"))?;
    let pid = child.id();
    run.mounts.push((bench::Reap(child), mnt.clone()));
    let t = Instant::now();
    let key = format!(" {} ", mnt.to_string_lossy());
    while t.elapsed() < Duration::from_secs(10) {
        let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        if mi.lines().any(|l| l.contains(&key)) {
            return Ok((mnt, pid));
        }
        if let Some((r, _)) = run.mounts.last_mut() {
            if let Ok(Some(st)) = r.0.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = r.0.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                return Err(format!("ferry mount exited ({st}): {}", err.trim()));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err("ferry mount did not appear within 10 s".into())
}

/// Experiment 10's places: the export itself, the default mount, a mount
/// with its caches on, and `ferry run`; each programs in a directory of
/// its own.
fn program_places(run: &mut Run, port: u16, env: &[(String, String)]) -> Result<Vec<programs::Place>, String> {
    let export = run.export.clone();
    let dir = |name: &str| -> Result<PathBuf, String> {
        let d = export.join(format!("programs-{name}"));
        std::fs::create_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        Ok(d)
    };
    let place = |name: &str, root: PathBuf, note: &str| programs::Place {
        name: name.into(),
        root,
        prefix: Vec::new(),
        env: Vec::new(),
        local_root: None,
        note: note.into(),
        metrics: None,
    };
    let mut places = vec![place("local", dir("local")?, "the export directory itself")];
    dir("fuse")?;
    // Its metrics count what it asks the server (the floor).
    let metrics = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        l.local_addr().map_err(|e| e.to_string())?.to_string()
    };
    let (mnt, _) = start_mount(run, port, &["--metrics", &metrics], env)?;
    places.push(programs::Place {
        metrics: Some(metrics),
        ..place("ferry-fuse", mnt.join("programs-fuse"), "ferry mount with its defaults")
    });
    // Every file cached: the client's disk cache by a rule, and the
    // kernel's page cache (--cache).
    dir("fuse-cache")?;
    let conf = run.state.join("cache-all.conf");
    std::fs::write(&conf, "cache /**\n").map_err(|e| e.to_string())?;
    let mut cached = env.to_vec();
    cached.retain(|(k, _)| k != "FERRY_CACHE_CONFIG" && k != "FERRY_CACHE_DIR");
    cached.push(("FERRY_CACHE_CONFIG".into(), conf.to_string_lossy().into_owned()));
    cached.push(("FERRY_CACHE_DIR".into(), run.state.join("cache-programs").to_string_lossy().into_owned()));
    let (mnt, _) = start_mount(run, port, &["--cache"], &cached)?;
    places.push(place(
        "ferry-fuse-cache",
        mnt.join("programs-fuse-cache"),
        "ferry mount --cache, and a rule 'cache /**' (client disk cache)",
    ));
    let local = dir("run")?;
    let prefix = "/ferry-compare-programs";
    places.push(programs::Place {
        prefix: vec![
            exe()?,
            "run".into(),
            "--mount".into(),
            format!("{prefix}=ferry://127.0.0.1:{port}/programs-run"),
            "--".into(),
        ],
        env: [("FERRY_TOKEN".to_string(), "unused".to_string())].into_iter().chain(env.iter().cloned()).collect(),
        local_root: Some(local),
        ..place("ferry-run", PathBuf::from(prefix), "ferry run (preload library) with its defaults")
    });
    Ok(places)
}

pub fn run(a: CompareArgs) -> Result<(), String> {
    if !a.worker.is_empty() {
        return worker::main(&a.worker);
    }
    let mut plan = Plan::new(a.quick);
    plan.idle = a.idle;
    if a.clients.contains(&0) {
        return Err("--clients: each count must be at least 1".into());
    }
    if !a.clients.is_empty() {
        plan.clients = a.clients.clone();
    }
    if a.quick {
        println!("{}", crate::bench::QUICK_NOTE);
    }
    let runs = if a.quick { a.runs.clamp(1, 1) } else { a.runs.max(1) };
    let want_baselines = a.baselines || std::env::var("FERRY_COMPARE_BASELINES").is_ok_and(|v| v == "1");
    let parent = a.dir.clone().unwrap_or_else(|| {
        let shm = PathBuf::from("/dev/shm");
        if shm.is_dir() {
            shm
        } else {
            std::env::temp_dir()
        }
    });
    let export = unique(&parent, "ferry-compare-export")?;
    let state = match unique(&std::env::temp_dir(), "ferry-compare-state") {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&export);
            return Err(e);
        }
    };
    let mut run = Run { export, state, script: None, baselines_started: false, mounts: Vec::new() };
    let t0 = Instant::now();
    eprintln!("ferry compare: writing test data in {}", run.export.display());
    make_data(&run.export, &plan)?;
    // Idle clients beside the busiest point need room past the default
    // connection limit, descriptors for it (the server keeps its handle
    // budget clear of 2 per connection it may accept), and their sessions
    // gone a second after they leave, not still holding their journals
    // through the next run.
    let most = plan.idle + 2 * plan.clients.iter().max().unwrap_or(&1) + 64;
    let mut args = vec!["--max-connections".to_string(), most.max(1024).to_string()];
    if plan.idle > 0 {
        crate::soak_idle::raise_fd_limit();
        args.extend(["--session-lease".into(), "1".into()]);
    }
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let (server, port) = bench::start_server_with(&run.export, &args)?;
    let server_pid = server.0.id();
    plan.addr = format!("127.0.0.1:{port}");
    let exe = exe()?;
    // The client cache of every ferry client here: its own directory, no
    // rules but the `++` naming (never the user's cache or configuration).
    let cache_dir = run.state.join("cache");
    // And on TCP, as the baselines are: the same-host path (which takes
    // the data off the network) has experiment 9 to itself.
    let cache_env = vec![
        ("FERRY_CACHE_DIR".to_string(), cache_dir.to_string_lossy().into_owned()),
        ("FERRY_CACHE_CONFIG".to_string(), run.state.join("no-cache.conf").to_string_lossy().into_owned()),
        ("FERRY_SAME_HOST".to_string(), "0".to_string()),
    ];
    let mut systems = vec![System {
        name: "ferry".into(),
        cmd: vec![exe.clone(), "compare".into(), "--worker".into(), format!("ferry://127.0.0.1:{port}/")],
        env: cache_env.clone(),
        server: vec![server_pid],
        client_side: Vec::new(),
        writes: true,
        note: "library (ferry-client), default window 16".into(),
        local: false,
    }];
    let mut status = vec![format!("up ferry 127.0.0.1:{port} (ferry serve --no-auth)")];
    match start_fuse(&mut run, port, &cache_env) {
        Ok(mut s) => {
            s.server = vec![server_pid];
            systems.push(s);
            status.push("up ferry-fuse (ferry mount)".into());
        }
        Err(e) => status.push(format!("down ferry-fuse: {e}")),
    }
    // `ferry run`: the same worker, an unmodified program doing plain file
    // I/O on a path the preload library makes remote.
    let lib = Path::new(&exe).with_file_name("libferry_preload.so");
    if lib.is_file() {
        let mut cmd = vec![exe.clone(), "run".into(), "--mount".into()];
        cmd.push(format!("/ferry-compare-remote=ferry://127.0.0.1:{port}/"));
        cmd.extend(["--".into(), exe.clone(), "compare".into(), "--worker".into(), "/ferry-compare-remote".into()]);
        systems.push(System {
            name: "ferry-run".into(),
            cmd,
            env: [("FERRY_TOKEN".to_string(), "unused".to_string())].into_iter().chain(cache_env.clone()).collect(),
            server: vec![server_pid],
            client_side: Vec::new(),
            writes: true,
            note: "ferry run (LD_PRELOAD): plain file I/O through the preload library".into(),
            local: false,
        });
        status.push("up ferry-run (preload library)".into());
    } else {
        status.push(format!("down ferry-run: {} not found (cargo build --release builds it)", lib.display()));
    }
    if want_baselines {
        eprintln!("ferry compare: starting baselines");
        let (b, st) = start_baselines(&mut run, &find_bench_dir(&a));
        systems.extend(b);
        status.extend(st);
    } else {
        status.push("baselines not measured (pass --baselines or set FERRY_COMPARE_BASELINES=1)".into());
    }
    systems.push(System {
        name: "local".into(),
        cmd: vec![exe.clone(), "compare".into(), "--worker".into(), run.export.to_string_lossy().into_owned()],
        env: Vec::new(),
        server: Vec::new(),
        client_side: Vec::new(),
        writes: true,
        note: "the export directory itself, no network (page cache)".into(),
        local: true,
    });
    if !a.systems.is_empty() {
        // Ferry's library stays: other experiments and the idle clients
        // are measured on it alone.
        systems.retain(|s| s.name == "ferry" || s.local || a.systems.contains(&s.name));
        status.push(format!("systems measured: {}", a.systems.join(", ")));
    }
    for s in &status {
        println!("{s}");
    }
    let only = |n: u32| a.only.is_empty() || a.only.contains(&n);
    let mut res = Results::default();
    let mut failures: Vec<String> = Vec::new();
    let mut note = |r: Result<(), String>| {
        if let Err(e) = r {
            eprintln!("ferry compare: {e}");
            failures.push(e);
        }
    };
    if only(0) {
        note(raw_limits(&plan, runs, &mut res, &systems[0], port, server_pid, &run.export.join("big.dat")));
    }
    if only(1) {
        note(exp_read(&plan, runs, &systems, &mut res));
    }
    if only(2) {
        note(exp_write(&plan, runs, &systems, &mut res, &run.export));
    }
    if only(3) {
        note(exp_window(&plan, runs, &systems[0], &mut res));
    }
    if only(4) {
        note(exp_stat(&plan, runs, &systems, &mut res));
    }
    if only(5) {
        note(exp_scan(&plan, runs, &systems, &mut res));
    }
    if only(6) {
        note(exp_clients(&plan, runs, &systems, &mut res, &run.export));
    }
    if only(7) {
        note(exp_fetch(&plan, runs, &systems, &mut res, &cache_dir));
    }
    if only(9) {
        let local = systems.iter().find(|s| s.local).expect("the local system is always there");
        note(exp_split(&plan, runs, &systems[0], local, &mut res));
    }
    let mut places = Vec::new();
    if only(10) {
        let made = programs::make_source(&run.state, a.quick)
            .and_then(|src| Ok((src, program_places(&mut run, port, &cache_env)?)));
        match made {
            Ok((src, p)) => {
                places = p;
                note(programs::exp_programs(&src, &places, runs, &mut res, &run.state, &format!("127.0.0.1:{port}")));
            }
            Err(e) => note(Err(format!("experiment 10: {e}"))),
        }
    }
    if only(11) {
        note(breaks::exp_breaks(&run.state.join("breaks"), if a.quick { 50 } else { 2000 }, runs, &mut res));
    }
    drop(server);
    let machine = machine();
    print_tables(&res, &systems, &plan, runs, &machine);
    programs::print_programs(&res, &places, runs);
    breaks::print_breaks(&res, runs);
    if let Some(out) = &a.out {
        write_files(out, &res, &status, &systems, &machine, &failures, runs, a.quick)?;
        println!("results written to {}/results.csv and results.json", out.display());
    }
    eprintln!("ferry compare: done in {:.0} s", t0.elapsed().as_secs_f64());
    drop(run);
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("{} measurement(s) failed; first: {}", failures.len(), failures[0]))
    }
}

/// Every failed measurement, baselines' included, for results.json.
static ALL_ERRORS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Raw TCP round trips of 64 bytes with `ferry bench-peer echo`, both
/// processes left where the scheduler puts them (as the file systems are).
fn ping_pong(n: usize) -> Result<f64, String> {
    use std::io::Write;
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = l.local_addr().map_err(|e| e.to_string())?.to_string();
    let child =
        Command::new(exe()?).args(["bench-peer", "echo", &addr, &n.to_string()]).spawn().map_err(|e| e.to_string())?;
    let _peer = bench::Reap(child);
    let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut msg = [7u8; 64];
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        s.write_all(&msg).map_err(|e| e.to_string())?;
        s.read_exact(&mut msg).map_err(|e| e.to_string())?;
        v.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(median(&v))
}

fn machine() -> BTreeMap<&'static str, String> {
    let mut m = BTreeMap::new();
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model =
        cpuinfo.lines().find_map(|l| l.strip_prefix("model name")).map(|v| v.trim_start_matches([' ', '\t', ':']));
    m.insert("cpu", model.unwrap_or("unknown").to_string());
    m.insert("cpus", rustix::thread::sched_getaffinity(None).map_or(0, |s| s.count()).to_string());
    m.insert("kernel", std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string());
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    m.insert("memory", mem.lines().next().unwrap_or("").trim_start_matches("MemTotal:").trim().to_string());
    m.insert("date (unix)", format!("{:.0}", wall()));
    m
}
