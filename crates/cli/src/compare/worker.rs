//! The measurement client for ferry (and for a local directory: the page
//! cache limit and `ferry mount`), run as its own process by
//! `ferry compare --worker TARGET OP ARGS...`. Same operations and same
//! output as the C clients in `bench/clients/` (see `bench.h` there):
//! one line `ok key=value ...` with the process's CPU time and context
//! switches.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferry_client::{Client, OpenOptions, Options};

/// Where the operations go: a ferry server, or a local directory.
enum Fs {
    Ferry(Client),
    Local(String),
}

/// CPU seconds (user, system) and context switches (voluntary,
/// involuntary) of this process so far, from /proc (no extra threads: the
/// ferry client library has none, so the main thread's counts are the
/// process's).
#[derive(Clone, Copy)]
struct Usage {
    utime: f64,
    stime: f64,
    /// Their sum to the nanosecond (the split above is in clock ticks:
    /// a short measurement's would round to 0).
    cpu: f64,
    nvcsw: u64,
    nivcsw: u64,
}

fn usage() -> Usage {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) / 100.0;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0)
    };
    Usage {
        utime: tick(11),
        stime: tick(12),
        cpu: {
            let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
            t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
        },
        nvcsw: field("voluntary_ctxt_switches:"),
        nivcsw: field("nonvoluntary_ctxt_switches:"),
    }
}

fn report(extra: &str, u0: Usage) {
    let u = usage();
    println!(
        "ok {extra} utime={:.6} stime={:.6} cpu={:.6} nvcsw={} nivcsw={}",
        u.utime - u0.utime,
        u.stime - u0.stime,
        u.cpu - u0.cpu,
        u.nvcsw - u0.nvcsw,
        u.nivcsw - u0.nivcsw
    );
    let _ = std::io::stdout().flush();
}

fn num<T: std::str::FromStr>(args: &[String], i: usize) -> Result<T, String> {
    args.get(i).and_then(|v| v.parse().ok()).ok_or_else(|| format!("worker: bad or missing argument {i}"))
}

fn wall() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// `ferry compare --worker ...`: runs one operation and prints its figures.
pub fn main(args: &[String]) -> Result<(), String> {
    let target = args.first().ok_or("worker: no target")?;
    if target == "unix-source" {
        return unix_source(&args[1..]);
    }
    let op = args.get(1).map(String::as_str).unwrap_or("");
    let fs = if ferry_client::Url::is_url(target.as_bytes()) {
        let url = ferry_client::Url::parse(target)?;
        // Fetches go through the client cache as the CLI's would (its
        // directory and rules from the environment); nothing else does.
        let cache = if op == "fetch" { ferry_client::cache::Cache::from_env()? } else { None };
        let opts = Options { cache, ..Options::default() }.data_path_from_env()?;
        let c = Client::connect(&url.addr, &opts).map_err(|e| format!("connect {target}: {e}"))?;
        Fs::Ferry(c)
    } else {
        Fs::Local(target.trim_end_matches('/').to_string())
    };
    let path = args.get(2).ok_or("worker: no path")?.as_str();
    let r = match op {
        "read" => read(&fs, path, num(args, 3)?, num(args, 4)?, None, 0),
        "readw" => read(&fs, path, num(args, 3)?, num(args, 4)?, Some(num(args, 5)?), 0),
        // Into a buffer `skew` bytes past a page, as a program's own
        // `malloc`ed buffer would be (16 for a fresh glibc block).
        "reads" => read(&fs, path, num(args, 3)?, num(args, 4)?, None, num(args, 5)?),
        "write" => write(&fs, path, num(args, 3)?, num(args, 4)?),
        "fetch" => fetch(&fs, path, num(args, 3)?, args.get(4).map_or("-", String::as_str)),
        "stat" => stat(&fs, path, num(args, 3)?),
        "statbulk" => stat_beside_bulk(&fs, path, args.get(3).ok_or("worker: no bulk file")?, num(args, 4)?),
        "scan" => scan(&fs, path, num::<u32>(args, 3)? == 1),
        "chunks" => {
            chunks(&fs, path, num(args, 3)?, num(args, 4)?, num(args, 5)?, num(args, 6)?, num::<u32>(args, 7)? == 1)
        }
        _ => Err(format!("worker: unknown operation {op:?}")),
    };
    if let Err(e) = &r {
        println!("err {e}");
    }
    r
}

fn local(root: &str, path: &str) -> String {
    format!("{root}{path}")
}

fn ioe<'a, E: std::fmt::Display>(what: &'a str, path: &'a str) -> impl Fn(E) -> String + 'a {
    move |e| format!("{what} {path}: {e}")
}

fn read(fs: &Fs, path: &str, bs: usize, limit: u64, window: Option<u32>, skew: usize) -> Result<(), String> {
    // Page-aligned, as experiment 0's raw receivers' buffers are (unless
    // skewed on purpose).
    let (mut buf, at) = crate::bench::placed_buf(bs, skew);
    let buf = &mut buf[at..at + bs];
    let u0 = usage();
    let t = Instant::now();
    let mut total = 0u64;
    let mut step = |r: &mut dyn Read| -> Result<(), String> {
        while total < limit {
            let want = (limit - total).min(bs as u64) as usize;
            let n = r.read(&mut buf[..want]).map_err(ioe("read", path))?;
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        Ok(())
    };
    match fs {
        Fs::Ferry(c) => {
            if let Some(w) = window {
                c.engine().set_window(w);
            }
            let mut f = c.open(path, OpenOptions::new().read(true)).map_err(ioe("open", path))?;
            step(&mut f)?;
            f.close().map_err(ioe("close", path))?;
        }
        Fs::Local(root) => {
            let mut f = std::fs::File::open(local(root, path)).map_err(ioe("open", path))?;
            step(&mut f)?;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    report(&format!("bytes={total} secs={secs:.6}"), u0);
    Ok(())
}

/// Reads the whole file `repeat` times in 1 MiB reads, each time from a new
/// open, after emptying the client cache directory `cold` (unless "-"):
/// the AFS paper's fetch. Prints the time and CPU of the fetches alone.
fn fetch(fs: &Fs, path: &str, repeat: usize, cold: &str) -> Result<(), String> {
    let mut buf = vec![0u8; 1 << 20];
    let u0 = usage();
    let (mut secs, mut user, mut sys, mut bytes) = (0.0, 0.0, 0.0, 0u64);
    for _ in 0..repeat {
        if cold != "-" {
            empty_cache(cold)?;
        }
        let (a, t) = (usage(), Instant::now());
        let mut step = |r: &mut dyn Read| -> Result<(), String> {
            loop {
                let n = r.read(&mut buf).map_err(ioe("read", path))?;
                if n == 0 {
                    return Ok(());
                }
                bytes += n as u64;
            }
        };
        match fs {
            Fs::Ferry(c) => {
                let mut f = c.open(path, OpenOptions::new().read(true)).map_err(ioe("open", path))?;
                step(&mut f)?;
                f.close().map_err(ioe("close", path))?;
            }
            Fs::Local(root) => step(&mut std::fs::File::open(local(root, path)).map_err(ioe("open", path))?)?,
        }
        secs += t.elapsed().as_secs_f64();
        let b = usage();
        user += b.utime - a.utime;
        sys += b.stime - a.stime;
    }
    report(&format!("bytes={bytes} secs={secs:.6} fuser={user:.6} fsys={sys:.6}"), u0);
    Ok(())
}

/// Removes the files of a client cache directory (its layout's `v1`),
/// leaving the directories, so the next fetch finds nothing cached.
fn empty_cache(dir: &str) -> Result<(), String> {
    let v1 = std::path::Path::new(dir).join("v1");
    let Ok(entries) = std::fs::read_dir(&v1) else { return Ok(()) };
    for e in entries.flatten() {
        std::fs::remove_file(e.path()).map_err(ioe("remove", &e.path().to_string_lossy()))?;
    }
    Ok(())
}

fn write(fs: &Fs, path: &str, size: u64, bs: usize) -> Result<(), String> {
    let buf = vec![0x5au8; bs];
    let u0 = usage();
    let t = Instant::now();
    let fill = |w: &mut dyn Write| -> Result<(), String> {
        let mut left = size;
        while left > 0 {
            let n = left.min(bs as u64) as usize;
            w.write_all(&buf[..n]).map_err(ioe("write", path))?;
            left -= n as u64;
        }
        Ok(())
    };
    match fs {
        Fs::Ferry(c) => {
            let mut f = c
                .open(path, OpenOptions::new().write(true).create(true).truncate(true))
                .map_err(ioe("create", path))?;
            fill(&mut f)?;
            f.sync_all().map_err(ioe("fsync", path))?;
            f.close().map_err(ioe("close", path))?;
        }
        Fs::Local(root) => {
            let mut f = std::fs::File::create(local(root, path)).map_err(ioe("create", path))?;
            fill(&mut f)?;
            f.sync_all().map_err(ioe("fsync", path))?;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    report(&format!("bytes={size} secs={secs:.6} fsync=1"), u0);
    Ok(())
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = (q * (v.len() - 1) as f64).round() as usize;
    v.get(i.min(v.len().saturating_sub(1))).copied().unwrap_or(f64::NAN)
}

fn stat(fs: &Fs, path: &str, n: usize) -> Result<(), String> {
    let (mut a, mut b) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let u0 = usage();
    match fs {
        Fs::Ferry(c) => {
            for _ in 0..n {
                let t = Instant::now();
                c.metadata(path).map_err(ioe("stat", path))?;
                a.push(t.elapsed().as_secs_f64() * 1e6);
            }
            let mut f = c.open(path, OpenOptions::new().read(true)).map_err(ioe("open", path))?;
            for _ in 0..n {
                let t = Instant::now();
                f.metadata().map_err(ioe("fstat", path))?;
                b.push(t.elapsed().as_secs_f64() * 1e6);
            }
            f.close().map_err(ioe("close", path))?;
        }
        Fs::Local(root) => {
            let p = local(root, path);
            for _ in 0..n {
                let t = Instant::now();
                std::fs::symlink_metadata(&p).map_err(ioe("stat", path))?;
                a.push(t.elapsed().as_secs_f64() * 1e6);
            }
            let f = std::fs::File::open(&p).map_err(ioe("open", path))?;
            for _ in 0..n {
                let t = Instant::now();
                f.metadata().map_err(ioe("fstat", path))?;
                b.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    let line = format!(
        "stat_p50={:.3} stat_p99={:.3} fstat_p50={:.3} fstat_p99={:.3} n={n}",
        quantile(&mut a, 0.5),
        quantile(&mut a, 0.99),
        quantile(&mut b, 0.5),
        quantile(&mut b, 0.99)
    );
    report(&line, u0);
    Ok(())
}

/// `n` stats of `path`, one every millisecond, while another thread of the
/// same client reads `bulk` over and over in 1 MiB reads (the split path's
/// point: on one connection each stat queues behind the reads in flight).
/// Prints the stat latency quantiles and the bulk read rate.
fn stat_beside_bulk(fs: &Fs, path: &str, bulk: &str, n: usize) -> Result<(), String> {
    let Fs::Ferry(c) = fs else { return Err("worker: statbulk needs a ferry:// target".into()) };
    let stop = std::sync::atomic::AtomicBool::new(false);
    let u0 = usage();
    let t0 = Instant::now();
    let (mut lat, bytes) = std::thread::scope(|s| {
        let reader = s.spawn(|| -> Result<u64, String> {
            let mut buf = vec![0u8; 1 << 20];
            let mut total = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut f = c.open(bulk, OpenOptions::new().read(true)).map_err(ioe("open", bulk))?;
                loop {
                    let k = f.read(&mut buf).map_err(ioe("read", bulk))?;
                    if k == 0 || stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    total += k as u64;
                }
                f.close().map_err(ioe("close", bulk))?;
            }
            Ok(total)
        });
        // Let the reader get going first.
        std::thread::sleep(Duration::from_millis(100));
        let mut lat = Vec::with_capacity(n);
        let mut err = None;
        for _ in 0..n {
            let t = Instant::now();
            if let Err(e) = c.metadata(path) {
                err = Some(format!("stat {path}: {e}"));
                break;
            }
            lat.push(t.elapsed().as_secs_f64() * 1e6);
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let bytes = reader.join().map_err(|_| "reader panicked".to_string()).and_then(|r| r);
        match err {
            Some(e) => Err(e),
            None => bytes.map(|b| (lat, b)),
        }
    })?;
    let secs = t0.elapsed().as_secs_f64();
    let line = format!(
        "stat_p50={:.3} stat_p99={:.3} n={n} bulk_mbs={:.1} channels={}",
        quantile(&mut lat, 0.5),
        quantile(&mut lat, 0.99),
        bytes as f64 / secs / 1e6,
        c.data_channels()
    );
    report(&line, u0);
    Ok(())
}

#[derive(Default)]
struct Scan {
    files: u64,
    dirs: u64,
    bytes: u64,
}

/// Lists every directory under `dir` with each entry's attributes (ferry:
/// readdirplus, one request per batch of entries; local: `stat` per entry,
/// as `ls -l` does), and with `read` reads every file.
fn scan(fs: &Fs, dir: &str, read: bool) -> Result<(), String> {
    let u0 = usage();
    let t = Instant::now();
    let mut s = Scan::default();
    let mut todo = vec![dir.to_string()];
    while let Some(d) = todo.pop() {
        match fs {
            Fs::Ferry(c) => {
                for e in c.read_dir(&d).map_err(ioe("readdir", &d))? {
                    // The measured trees have ASCII names; the local side
                    // below builds its paths the same way.
                    let p = ferry_client::join(&d, e.file_name()).to_string_lossy().into_owned();
                    let attr = match e.attr {
                        Some(a) => a,
                        None => c.symlink_metadata(&p).map_err(ioe("stat", &p))?,
                    };
                    if attr.mode & libc::S_IFMT == libc::S_IFDIR {
                        s.dirs += 1;
                        todo.push(p);
                    } else {
                        s.files += 1;
                        if read {
                            s.bytes += c.read(&p).map_err(ioe("read", &p))?.len() as u64;
                        }
                    }
                }
            }
            Fs::Local(root) => {
                let ld = local(root, &d);
                for e in std::fs::read_dir(&ld).map_err(ioe("readdir", &d))? {
                    let e = e.map_err(ioe("readdir", &d))?;
                    let p = format!("{}/{}", d.trim_end_matches('/'), e.file_name().to_string_lossy());
                    let m = std::fs::symlink_metadata(local(root, &p)).map_err(ioe("stat", &p))?;
                    if m.is_dir() {
                        s.dirs += 1;
                        todo.push(p);
                    } else {
                        s.files += 1;
                        if read {
                            s.bytes += std::fs::read(local(root, &p)).map_err(ioe("read", &p))?.len() as u64;
                        }
                    }
                }
            }
        }
    }
    let secs = t.elapsed().as_secs_f64();
    report(&format!("files={} dirs={} bytes={} secs={secs:.6}", s.files, s.dirs, s.bytes), u0);
    Ok(())
}

/// From wall-clock `t0` to `t1`, reads `chunk`-sized pieces of `path`
/// sequentially from a per-worker starting point, wrapping at the end (or,
/// for odd workers with `mix`, writes them to `PATH.wIDX`, within 16 MiB).
fn chunks(fs: &Fs, path: &str, chunk: usize, t0: f64, t1: f64, idx: u64, mix: bool) -> Result<(), String> {
    let writer = mix && idx % 2 == 1;
    let wpath = format!("{path}.w{idx}");
    let mut buf = vec![0x5au8; chunk];
    let size = match fs {
        Fs::Ferry(c) => c.metadata(path).map_err(ioe("stat", path))?.size,
        Fs::Local(root) => std::fs::metadata(local(root, path)).map_err(ioe("stat", path))?.len(),
    } / chunk as u64
        * chunk as u64;
    if size == 0 {
        return Err(format!("{path} is smaller than one chunk"));
    }
    const WSIZE: u64 = 16 << 20;
    let start = idx * 7919 * chunk as u64 % size;
    let (mut ops, mut bytes, mut errors) = (0u64, 0u64, 0u64);
    enum H {
        Ferry(Box<ferry_client::File>),
        Local(std::fs::File),
    }
    let mut h = match fs {
        Fs::Ferry(c) => {
            let o = if writer {
                OpenOptions::new().write(true).create(true).truncate(true).clone()
            } else {
                OpenOptions::new().read(true).clone()
            };
            let mut f = c.open(if writer { &wpath } else { path }, &o).map_err(ioe("open", path))?;
            f.seek(SeekFrom::Start(start)).map_err(ioe("seek", path))?;
            H::Ferry(Box::new(f))
        }
        Fs::Local(root) => {
            let p = local(root, if writer { &wpath } else { path });
            let f = if writer { std::fs::File::create(&p) } else { std::fs::File::open(&p) };
            H::Local(f.map_err(ioe("open", path))?)
        }
    };
    let now = wall();
    if now < t0 {
        std::thread::sleep(std::time::Duration::from_secs_f64(t0 - now));
    }
    let u0 = usage();
    let mut off = start;
    while wall() < t1 {
        let ok = match (&mut h, writer) {
            (H::Ferry(f), false) => {
                if off == 0 {
                    let _ = f.seek(SeekFrom::Start(0));
                }
                f.read_exact(&mut buf).is_ok()
            }
            (H::Ferry(f), true) => f.write_at(&buf, off % WSIZE).is_ok(),
            (H::Local(f), false) => f.read_exact_at(&mut buf, off).is_ok(),
            (H::Local(f), true) => f.write_all_at(&buf, off % WSIZE).is_ok(),
        };
        if ok {
            ops += 1;
            bytes += chunk as u64;
        } else {
            errors += 1;
            if errors > 1000 {
                break;
            }
        }
        off += chunk as u64;
        if !writer && off >= size {
            off = 0;
        }
    }
    if let H::Ferry(f) = h {
        if f.close().is_err() {
            errors += 1;
        }
    }
    report(&format!("ops={ops} bytes={bytes} errors={errors} writer={}", u8::from(writer)), u0);
    Ok(())
}

/// The sending end of the raw Unix-socket stream: `unix-source PATH BYTES`.
fn unix_source(args: &[String]) -> Result<(), String> {
    let path = args.first().ok_or("unix-source: no path")?;
    let n: u64 = num(args, 1)?;
    let mut s = std::os::unix::net::UnixStream::connect(path).map_err(|e| format!("{path}: {e}"))?;
    let buf = vec![0x5au8; 1 << 20];
    let mut left = n;
    while left > 0 {
        let k = left.min(buf.len() as u64) as usize;
        s.write_all(&buf[..k]).map_err(|e| e.to_string())?;
        left -= k as u64;
    }
    Ok(())
}
