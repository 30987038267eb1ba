//! `ferry soak`: many clients at once (200 by default), each on its own
//! connection doing a seeded mix of operations on a directory of its own for
//! a set time, against a server this command starts. Every byte read is
//! checked against what was written; the server's memory and descriptors
//! are sampled and must stay flat; latency percentiles per operation are
//! printed. Fails (exit status 1) on any mismatch, any failed call, or
//! growth.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use ferry_client::{Client, OpenOptions, Options};
use hdrhistogram::Histogram;

#[derive(Args)]
pub struct SoakArgs {
    /// Clients at once, each with its own connection.
    #[arg(long, default_value_t = 200)]
    clients: usize,
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 180)]
    secs: u64,
    /// Largest file a client writes, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max_file: usize,
    /// The seed of every client's choices (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Directory the server exports (default: a fresh temporary directory,
    /// removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Idle clients connected beside the active ones, each with a session
    /// (held by `--idle-procs` processes): the server's memory, threads
    /// and descriptors per connection, and a client's `stat` latency
    /// beside them, are reported.
    #[arg(long, default_value_t = 0)]
    idle: usize,
    /// Processes holding the idle clients.
    #[arg(long, default_value_t = 4)]
    idle_procs: usize,
    /// The ferry binary that serves (default: this one), to compare builds.
    #[arg(long)]
    server: Option<PathBuf>,
    /// Internal: one process of idle clients (ADDR N).
    #[arg(long, hide = true, num_args = 2)]
    idle_child: Vec<String>,
}

const OPS: [&str; 8] = ["write", "write+fsync", "read", "stat", "list", "rename", "remove", "mkdir+rmdir"];

/// The choices: a seeded `fastrand` generator.
struct Rng(fastrand::Rng);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(fastrand::Rng::with_seed(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.u64(..)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0.u64(..n.max(1))
    }
}

/// The content of one version of one file: a function of its tag.
fn content(tag: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fastrand::Rng::with_seed(tag).fill(&mut v);
    v
}

/// What one client's directory holds, as it wrote it: name → (tag, size).
type Model = BTreeMap<String, (u64, usize)>;

struct Shared {
    stop: AtomicBool,
    failures: Mutex<Vec<String>>,
    failed: AtomicU64,
    bytes_checked: AtomicU64,
    hists: Mutex<Vec<Histogram<u64>>>,
}

impl Shared {
    fn fail(&self, msg: String) {
        self.failed.fetch_add(1, Relaxed);
        let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if f.len() < 20 {
            f.push(msg);
        }
    }
}

pub fn run(a: SoakArgs) -> Result<(), String> {
    if let [addr, n] = &a.idle_child[..] {
        return crate::soak_idle::child(addr, n.parse().map_err(|_| format!("not a count: {n}"))?);
    }
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    let (dir, temp) = match &a.dir {
        Some(d) => (d.clone(), false),
        None => {
            let d = std::env::temp_dir().join(format!("ferry-soak-{}", std::process::id()));
            std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
            (d, true)
        }
    };
    let res = soak(&a, seed, &dir);
    if temp {
        let _ = std::fs::remove_dir_all(&dir);
    }
    res
}

fn soak(a: &SoakArgs, seed: u64, dir: &Path) -> Result<(), String> {
    // Sessions end a second after their last connection, so that the
    // descriptors they hold (journal files, handles) must be back soon
    // after the clients leave: the leases' end is soaked too.
    let most = (a.clients + a.idle + 64).max(1024).to_string();
    let args = ["--session-lease", "1", "--max-connections", &most];
    let (server, port) = match &a.server {
        Some(bin) => crate::bench::start_server_of(bin, dir, &args)?,
        None => crate::bench::start_server_with(dir, &args)?,
    };
    let pid = server.0.id();
    let addr = format!("127.0.0.1:{port}");
    println!(
        "ferry soak: {} clients for {} s, files up to {} bytes, seed {seed} (--seed {seed} runs the same choices)",
        a.clients, a.secs, a.max_file
    );
    let before = sample(pid);
    let idle = match a.idle {
        0 => None,
        n => Some(idle_clients(&addr, pid, n, a.idle_procs)?),
    };
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        failures: Mutex::default(),
        failed: AtomicU64::new(0),
        bytes_checked: AtomicU64::new(0),
        hists: Mutex::new(OPS.iter().map(|_| Histogram::new(3).expect("3 significant digits")).collect()),
    });
    let mut threads = Vec::new();
    for i in 0..a.clients {
        let (shared, addr, max) = (Arc::clone(&shared), addr.clone(), a.max_file);
        let t = std::thread::Builder::new()
            .name(format!("soak-{i}"))
            .stack_size(256 * 1024)
            .spawn(move || client(i, seed, &addr, max, &shared))
            .map_err(|e| format!("cannot start client thread {i}: {e}"))?;
        threads.push(t);
    }
    // Memory and descriptors under load: a sample a quarter of the way in,
    // one at the end, the largest seen.
    let start = Instant::now();
    let run = Duration::from_secs(a.secs);
    let mut under_load = None;
    let mut peak = before;
    while start.elapsed() < run {
        std::thread::sleep(Duration::from_millis(250).min(run.saturating_sub(start.elapsed())));
        let s = sample(pid);
        peak = (peak.0.max(s.0), peak.1.max(s.1));
        if under_load.is_none() && start.elapsed() >= run / 4 {
            under_load = Some(s);
        }
    }
    let at_end = sample(pid);
    shared.stop.store(true, Relaxed);
    for t in threads {
        let _ = t.join();
    }
    drop(idle);
    // Everything closed: the server's descriptors come back down.
    let settle = Instant::now();
    let mut after = sample(pid);
    while after.1 > before.1 + 8 && settle.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
        after = sample(pid);
    }
    let held = if after.1 > before.1 + 8 { fd_targets(pid) } else { String::new() };
    drop(server);
    let under_load = under_load.unwrap_or(at_end);
    let hists = shared.hists.lock().unwrap_or_else(|e| e.into_inner());
    println!(
        "{:<12} {:>9} {:>10} {:>10} {:>10} {:>10}",
        "operation", "count", "p50 µs", "p99 µs", "p99.9 µs", "max µs"
    );
    for (name, h) in OPS.iter().zip(hists.iter()) {
        let q = |q: f64| h.value_at_quantile(q);
        println!("{name:<12} {:>9} {:>10} {:>10} {:>10} {:>10}", h.len(), q(0.5), q(0.99), q(0.999), h.max());
    }
    let calls: u64 = hists.iter().map(Histogram::len).sum();
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!(
        "{calls} operations, {:.1} MiB read back and checked; server memory {:.1} MiB before, {:.1} at a quarter, {:.1} at the end, {:.1} at most; descriptors {} before, {} at a quarter, {} at the end, {} at most, {} after the clients left",
        shared.bytes_checked.load(Relaxed) as f64 / (1 << 20) as f64,
        mib(before.0),
        mib(under_load.0),
        mib(at_end.0),
        mib(peak.0),
        before.1,
        under_load.1,
        at_end.1,
        peak.1,
        after.1
    );
    let mut problems: Vec<String> = shared.failures.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let failed = shared.failed.load(Relaxed);
    if failed > problems.len() as u64 {
        problems.push(format!("… {failed} failures in all"));
    }
    // Flat: what the server holds at the end of the load is what it held a
    // quarter in (the clients' files and connections were there by then),
    // give or take allocator slack; and every descriptor comes back.
    if at_end.0 > under_load.0 + under_load.0 / 4 + 32 * 1024 {
        problems.push(format!(
            "server memory grew under steady load: {:.1} → {:.1} MiB",
            mib(under_load.0),
            mib(at_end.0)
        ));
    }
    if after.1 > before.1 + 8 {
        problems.push(format!(
            "server descriptors not given back: {} before the clients, {} after ({held})",
            before.1, after.1
        ));
    }
    if calls == 0 {
        problems.push("no operation completed".into());
    }
    if problems.is_empty() {
        println!("ferry soak: passed: every byte verified, server memory and descriptors flat");
        Ok(())
    } else {
        Err(format!("soak failed:\n  {}", problems.join("\n  ")))
    }
}

/// Connects `n` idle clients and reports what they cost the server; they
/// stay connected until the result is dropped.
fn idle_clients(addr: &str, pid: u32, n: usize, procs: usize) -> Result<crate::soak_idle::Idle, String> {
    use crate::soak_idle::{hold, server_sample, stat_latency};
    let alone = stat_latency(addr, 3000)?;
    let (rss0, threads0, fds0) = server_sample(pid);
    let t = Instant::now();
    let idle = hold(addr, n, procs)?;
    let took = t.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    let (rss1, threads1, fds1) = server_sample(pid);
    let beside = stat_latency(addr, 3000)?;
    let per = rss1.saturating_sub(rss0) as f64 / n as f64;
    println!(
        "idle: {n} clients, each with a session, connected in {:.1} s by {procs} processes: server memory {:.1} → {:.1} MiB \
         ({per:.1} KiB per connection), threads {threads0} → {threads1}, descriptors {fds0} → {fds1}; a client's stat \
         p50/p99 {}/{} µs alone, {}/{} µs beside them (p99 {:.2} × alone)",
        took.as_secs_f64(),
        rss0 as f64 / 1024.0,
        rss1 as f64 / 1024.0,
        alone.0,
        alone.1,
        beside.0,
        beside.1,
        beside.1 as f64 / alone.1.max(1) as f64
    );
    Ok(idle)
}

/// What the server's descriptors are, counted by kind (for a report).
fn fd_targets(pid: u32) -> String {
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).into_iter().flatten().flatten() {
        let t = std::fs::read_link(e.path()).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        let kind = match t.split_once(':') {
            Some((k, _)) if !t.starts_with('/') => k.to_string(),
            _ => t,
        };
        *kinds.entry(kind).or_default() += 1;
    }
    kinds.iter().map(|(k, n)| format!("{n} × {k}")).collect::<Vec<_>>().join(", ")
}

/// The server's resident memory (KiB) and open descriptors.
fn sample(pid: u32) -> (u64, u64) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmRSS:")?.split_whitespace().next()?.parse().ok()))
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    (rss, fds)
}

fn client(i: usize, seed: u64, addr: &str, max: usize, shared: &Shared) {
    let c = match Client::connect(addr, &Options::default()) {
        Ok(c) => c,
        Err(e) => return shared.fail(format!("client {i}: connect: {e}")),
    };
    let mut rng = Rng::new(seed ^ (i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let home = format!("/c{i}");
    if let Err(e) = c.create_dir(&home, 0o755) {
        return shared.fail(format!("client {i}: mkdir {home}: {e}"));
    }
    let mut model = Model::new();
    let mut hists: Vec<Histogram<u64>> = OPS.iter().map(|_| Histogram::new(3).expect("3 significant digits")).collect();
    let mut next_name = 0u64;
    while !shared.stop.load(Relaxed) {
        let op = match rng.below(100) {
            0..=19 => 0,
            20..=29 => 1,
            30..=59 => 2,
            60..=74 => 3,
            75..=82 => 4,
            83..=90 => 5,
            91..=96 => 6,
            _ => 7,
        };
        let t = Instant::now();
        let r = step(&c, op, &home, &mut model, &mut rng, &mut next_name, max, shared);
        let _ = hists[op].record(t.elapsed().as_micros() as u64);
        if let Err(e) = r {
            shared.fail(format!("client {i}: {}: {e}", OPS[op]));
            if shared.failed.load(Relaxed) > 1000 {
                break;
            }
        }
    }
    let mut all = shared.hists.lock().unwrap_or_else(|e| e.into_inner());
    for (a, h) in all.iter_mut().zip(&hists) {
        let _ = a.add(h);
    }
}

/// One operation, checked against the model.
#[allow(clippy::too_many_arguments)]
fn step(
    c: &Client,
    op: usize,
    home: &str,
    model: &mut Model,
    rng: &mut Rng,
    next_name: &mut u64,
    max: usize,
    shared: &Shared,
) -> Result<(), String> {
    let pick = |model: &Model, rng: &mut Rng| {
        let n = model.len() as u64;
        (n > 0).then(|| model.keys().nth(rng.below(n) as usize).cloned()).flatten()
    };
    match op {
        0 | 1 => {
            // A new file, or a new version of one (truncated and rewritten).
            let name = match pick(model, rng).filter(|_| rng.below(2) == 0) {
                Some(n) => n,
                None => {
                    *next_name += 1;
                    format!("f{next_name}")
                }
            };
            let len = rng.below(max as u64 + 1) as usize;
            let tag = rng.next();
            let data = content(tag, len);
            let path = format!("{home}/{name}");
            let mut f = c
                .open(&path, OpenOptions::new().write(true).create(true).truncate(true))
                .map_err(|e| format!("{path}: {e}"))?;
            let mut at = 0;
            while at < len {
                let n = (rng.below(256 * 1024) as usize + 1).min(len - at);
                f.write_at(&data[at..at + n], at as u64).map_err(|e| format!("{path}: {e}"))?;
                at += n;
            }
            if op == 1 {
                f.sync_all().map_err(|e| format!("{path}: fsync: {e}"))?;
            }
            f.close().map_err(|e| format!("{path}: close: {e}"))?;
            model.insert(name, (tag, len));
        }
        2 => {
            let Some(name) = pick(model, rng) else { return Ok(()) };
            let (tag, len) = model[&name];
            let path = format!("{home}/{name}");
            let f = c.open(&path, OpenOptions::new().read(true)).map_err(|e| format!("{path}: {e}"))?;
            let mut got = vec![0u8; len + 1];
            let mut at = 0;
            loop {
                let n = f.read_at(&mut got[at..], at as u64).map_err(|e| format!("{path}: {e}"))?;
                if n == 0 {
                    break;
                }
                at += n;
                if at == got.len() {
                    break;
                }
            }
            if at != len || got[..len] != content(tag, len)[..] {
                return Err(format!("{path}: read {at} bytes that differ from the {len} written"));
            }
            shared.bytes_checked.fetch_add(len as u64, Relaxed);
        }
        3 => {
            let Some(name) = pick(model, rng) else { return Ok(()) };
            let path = format!("{home}/{name}");
            let a = c.metadata(&path).map_err(|e| format!("{path}: {e}"))?;
            if a.size != model[&name].1 as u64 {
                return Err(format!("{path}: size {} where {} was written", a.size, model[&name].1));
            }
        }
        4 => {
            let mut names: Vec<String> = c
                .read_dir(home)
                .map_err(|e| format!("{home}: {e}"))?
                .iter()
                .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                .filter(|n| n != "." && n != ".." && n != "d")
                .collect();
            names.sort();
            let want: Vec<String> = model.keys().cloned().collect();
            if names != want {
                return Err(format!("{home}: lists {names:?}, the model has {want:?}"));
            }
        }
        5 => {
            let Some(name) = pick(model, rng) else { return Ok(()) };
            *next_name += 1;
            let to = format!("f{next_name}");
            c.rename(format!("{home}/{name}"), format!("{home}/{to}")).map_err(|e| format!("{name} → {to}: {e}"))?;
            let v = model.remove(&name).expect("picked from the model");
            model.insert(to, v);
        }
        6 => {
            let Some(name) = pick(model, rng) else { return Ok(()) };
            c.remove_file(format!("{home}/{name}")).map_err(|e| format!("{name}: {e}"))?;
            model.remove(&name);
        }
        _ => {
            let d = format!("{home}/d");
            c.create_dir(&d, 0o755).map_err(|e| format!("{d}: {e}"))?;
            c.remove_dir(&d).map_err(|e| format!("{d}: rmdir: {e}"))?;
        }
    }
    Ok(())
}
