//! `ferry bench --fuse`: ferry's FUSE mount beside a null FUSE file system
//! measured in the same run.
//!
//! The null file system (`ferry_fuse::NullFs`) serves a file from memory,
//! mounted the way `ferry mount` mounts (direct I/O, 1 MiB requests, the
//! same reader threads): it is the most any FUSE file system reaches on
//! this machine, so ferry's figures are given as a fraction of it. Both
//! are mounted in this process (fuser's background session), so nothing is
//! left mounted when the benchmark ends or fails: each mount is unmounted
//! when its guard drops.
//!
//! Both FUSE transports in one run: the null and ferry mounts are made
//! twice, once while the kernel offers FUSE over io_uring (root switches
//! the `fuse` module's `enable_uring` on for as long as mounting takes,
//! then puts it back) and once on `/dev/fuse` reads; the client's CPU per
//! GiB (this process: application loop and FUSE daemon) beside each.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ferry_client::{Client, Options};
use ferry_fuse::{FerryFs, FsOptions, MountConfig, Mounted as Session};

use super::{mbps, pin, start_server, BenchArgs, Series};

/// Reader threads for every mount, as `ferry mount` uses by default.
const THREADS: usize = 4;

/// Why FUSE cannot be used here, if it cannot.
fn unavailable() -> Option<String> {
    if let Err(e) = OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        return Some(format!("/dev/fuse: {e}"));
    }
    if !rustix::process::geteuid().is_root() {
        return Some("mounting needs root (mount(2) is used directly)".into());
    }
    None
}

/// A mount made by this process; unmounted (lazily if it must be) on drop.
struct Mounted {
    session: Option<Session>,
    mp: PathBuf,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        // Dropping the session unmounts and stops its threads.
        drop(self.session.take());
        if is_mount(&self.mp) {
            let _ = rustix::mount::unmount(&self.mp, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

fn is_mount(mp: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::metadata(mp), mp.parent().map(fs::metadata)) {
        (Ok(m), Some(Ok(p))) => m.dev() != p.dev(),
        (Err(e), _) => e.raw_os_error() == Some(libc::ENOTCONN),
        _ => false,
    }
}

/// With fusermount3 installed, a benchmark killed mid-run leaves no dead
/// mount behind.
fn auto_unmount() -> bool {
    ["/usr/bin/fusermount3", "/bin/fusermount3"].iter().any(|p| Path::new(p).is_file())
}

fn mount_ferry(addr: &str, mp: &Path, opts: FsOptions, dev_fuse_only: bool) -> Result<Mounted, String> {
    let client = Client::connect(addr, &client_options()?).map_err(|e| e.to_string())?;
    let cfg = MountConfig {
        fs: opts.clone(),
        fsname: format!("ferry://{addr}/"),
        threads: THREADS,
        auto_unmount: auto_unmount(),
        dev_fuse_only,
        ..MountConfig::default()
    };
    let fs = FerryFs::new(client, "/", opts);
    let session = ferry_fuse::spawn(fs, mp, &cfg).map_err(|e| format!("{}: mount failed: {e}", mp.display()))?;
    Ok(Mounted { session: Some(session), mp: mp.to_path_buf() })
}

/// The mounts' and the library's client options: the data path's settings
/// from the environment, as `ferry mount` takes them (`FERRY_SAME_HOST=0`
/// measures both over TCP instead of the server's descriptors).
fn client_options() -> Result<Options, String> {
    Options::default().data_path_from_env()
}

/// Throughput, latency and scan sizes for one invocation.
struct Sizes {
    bytes: u64,
    block: usize,
    stats: usize,
    dirs: usize,
    files_per_dir: usize,
}

pub fn run(a: &BenchArgs, bytes: u64, block: usize, dir: &Path) -> Result<(), String> {
    if let Some(why) = unavailable() {
        println!("ferry bench --fuse: skipped: {why}");
        return Ok(());
    }
    let sizes = if a.quick {
        Sizes { bytes, block, stats: a.rtts, dirs: 10, files_per_dir: 20 }
    } else {
        Sizes { bytes, block, stats: a.rtts, dirs: 100, files_per_dir: 100 }
    };
    let mnt = std::env::temp_dir().join(format!("ferry-bench-fuse-{}", std::process::id()));
    let mask = rustix::thread::sched_getaffinity(None).map_err(|e| e.to_string())?;
    let result = measure(a, &sizes, dir, &mnt);
    // Whatever runs next starts from the placement we found.
    let _ = rustix::thread::sched_setaffinity(None, &mask);
    let _ = fs::remove_dir_all(&mnt);
    let _ = fs::remove_file(dir.join("bench-fuse.dat"));
    let _ = fs::remove_file(dir.join("bench-fuse-small.dat"));
    let _ = fs::remove_dir_all(dir.join("tree"));
    result
}

fn measure(a: &BenchArgs, s: &Sizes, dir: &Path, mnt: &Path) -> Result<(), String> {
    let (mp_null, mp_ferry, mp_ferry0) = (mnt.join("null"), mnt.join("ferry"), mnt.join("ferry-nocache"));
    let (mp_null_dev, mp_ferry_dev) = (mnt.join("null-dev"), mnt.join("ferry-dev"));
    for d in [&mp_null, &mp_ferry, &mp_ferry0, &mp_null_dev, &mp_ferry_dev] {
        fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    // Both FUSE transports in one run: the kernel offers io_uring to the
    // mounts made while `enable_uring` is on, which is put back as found
    // once they are up (a mount keeps the transport it started with).
    let uring = ferry_fuse::EnableUring::set(true).map_err(|e| format!("{}: {e}", ferry_fuse::ENABLE_URING));
    let cpus = rustix::thread::sched_getaffinity(None).map_err(|e| e.to_string())?;
    let two = cpus.count() >= 2;
    // The null mount first: if mounting is refused here, say so and stop.
    let null = match ferry_fuse::spawn_null(&mp_null, s.bytes, Duration::ZERO, THREADS, auto_unmount(), true) {
        Ok(session) => Mounted { session: Some(session), mp: mp_null.clone() },
        Err(e) => {
            println!("ferry bench --fuse: skipped: mounting a FUSE file system failed: {e}");
            return Ok(());
        }
    };
    let null_dev = ferry_fuse::spawn_null(&mp_null_dev, s.bytes, Duration::ZERO, THREADS, auto_unmount(), false)
        .map_err(|e| format!("{}: mount failed: {e}", mp_null_dev.display()))?;
    let null_dev = Mounted { session: Some(null_dev), mp: mp_null_dev.clone() };
    make_tree(&dir.join("tree"), s.dirs, s.files_per_dir)?;
    let (server, port) = start_server(dir)?;
    if two {
        // The server where a remote server's CPU would be; the application
        // and the FUSE daemons (ferry's and the null one) share CPU 0, as
        // they share a client machine.
        pin(Some(server.0.id()), 1)?;
        pin(None, 0)?;
    }
    let addr = format!("127.0.0.1:{port}");
    // Mount threads inherit this thread's CPU mask as they start.
    // The FUSE transport, not the same-host passthrough (`--same-host`
    // measures that): the daemon reads and writes the server's files.
    let transport = FsOptions { same_host_passthrough: false, ..FsOptions::default() };
    let ferry = mount_ferry(&addr, &mp_ferry, transport.clone(), false)?;
    let ferry_dev = mount_ferry(&addr, &mp_ferry_dev, transport.clone(), true)?;
    let nocache = FsOptions {
        attr_timeout: Duration::ZERO,
        entry_timeout: Duration::ZERO,
        lease_timeout: Duration::ZERO,
        ..transport
    };
    let ferry0 = mount_ferry(&addr, &mp_ferry0, nocache, false)?;
    let ring_said = match (&uring, &ferry.session) {
        (Err(e), _) => format!("io_uring not available here ({e})"),
        (Ok(_), Some(s)) => s.transport().to_string(),
        (Ok(_), None) => String::new(),
    };
    drop(uring);
    let client = Client::connect(&addr, &client_options()?).map_err(|e| e.to_string())?;

    let mut nread = Series::new("null FUSE sequential read", "MB/s");
    let mut fread = Series::new("ferry mount sequential read", "MB/s");
    let mut lread = Series::new("ferry library read (no FUSE)", "MB/s");
    // The same over /dev/fuse reads (the mounts above use io_uring where
    // the kernel offered it), and the client's CPU per GiB moved.
    let mut nread_dev = Series::new("null FUSE read, /dev/fuse", "MB/s");
    let mut nwrite_dev = Series::new("null FUSE write, /dev/fuse", "MB/s");
    let mut fread_dev = Series::new("ferry mount read, /dev/fuse", "MB/s");
    let mut fwrite_dev = Series::new("ferry mount write, /dev/fuse", "MB/s");
    let mut lwrite = Series::new("ferry library write (no FUSE)", "MB/s");
    let mut fread_cpu = Series::new("client CPU, mount read", "s/GiB");
    let mut fread_dev_cpu = Series::new("client CPU, mount read, /dev/fuse", "s/GiB");
    let mut lread_cpu = Series::new("client CPU, library read", "s/GiB");
    let mut fwrite_cpu = Series::new("client CPU, mount write", "s/GiB");
    let mut fwrite_dev_cpu = Series::new("client CPU, mount write, /dev/fuse", "s/GiB");
    // What bounds a mount's read here: the FUSE work alone (a null file
    // system's read, which includes the kernel's copy into the reader's
    // buffer), TCP's receive without a copy, and the server's part.
    let mut nread_cpu = Series::new("client CPU, null FUSE read", "s/GiB");
    let mut nread_dev_cpu = Series::new("client CPU, null FUSE read, /dev/fuse", "s/GiB");
    let mut spliced_cpu = Series::new("TCP receive, spliced (no copy)", "s/GiB");
    let mut lread_server_cpu = Series::new("server CPU, library read", "s/GiB");
    // Under a lease the file's pages stay in the kernel past its close: a
    // read again is a read of the local page cache (`FOPEN_KEEP_CACHE`).
    let mut fread1 = Series::new("ferry mount read, small file, first", "MB/s");
    let mut fread2 = Series::new("ferry mount read, small file, again", "MB/s");
    let mut fread0 = Series::new("ferry mount read, no cache (direct)", "MB/s");
    let mut native_read = Series::new("read of the small file (local)", "MB/s");
    // Files up to 16 MiB are kept (`ferry_fuse`): one of 8 MiB at most,
    // made on the export directly, so the mount has none of its pages.
    let small_bytes = s.bytes.min(8 << 20);
    let small = dir.join("bench-fuse-small.dat");
    let mut nwrite = Series::new("null FUSE sequential write", "MB/s");
    let mut fwrite = Series::new("ferry mount sequential write", "MB/s");
    let mut nstat = Series::new("null FUSE stat, TTL 0, median", "µs");
    let mut fstat = Series::new("ferry mount stat, no cache, median", "µs");
    let mut fstat99 = Series::new("ferry mount stat, no cache, p99", "µs");
    let mut native = Series::new("tree scan, export dir (native)", "ms");
    let mut scan = Series::new("tree scan, ferry mount (default)", "ms");
    let mut warm = Series::new("tree scan again, ferry mount (warm)", "ms");
    let mut scan0 = Series::new("tree scan, ferry mount, no cache", "ms");
    let data = mp_ferry.join("bench-fuse.dat");
    let data_dev = mp_ferry_dev.join("bench-fuse.dat");
    let null_file = mp_null.join(ferry_fuse::NULL_FILE);
    let null_dev_file = mp_null_dev.join(ferry_fuse::NULL_FILE);
    let files = s.dirs * s.files_per_dir;
    for run in 0..a.runs {
        crate::bench::progress("FUSE: read, write, stat and tree scan, ferry mount and null", run, a.runs);
        // Alternating ferry and null, so a noisy moment hits both.
        let (w, cpu) = cpu_per_gib(s.bytes, || write_file(&data, s.bytes, s.block, true))?;
        fwrite.values.push(w);
        fwrite_cpu.values.push(cpu);
        let (w, cpu) = cpu_per_gib(s.bytes, || write_file(&data_dev, s.bytes, s.block, true))?;
        fwrite_dev.values.push(w);
        fwrite_dev_cpu.values.push(cpu);
        nwrite.values.push(write_file(&null_file, s.bytes, s.block, false)?);
        nwrite_dev.values.push(write_file(&null_dev_file, s.bytes, s.block, false)?);
        let (r, cpu) = cpu_per_gib(s.bytes, || read_file(&data, s.bytes, s.block))?;
        fread.values.push(r);
        fread_cpu.values.push(cpu);
        let (r, cpu) = cpu_per_gib(s.bytes, || read_file(&data_dev, s.bytes, s.block))?;
        fread_dev.values.push(r);
        fread_dev_cpu.values.push(cpu);
        fs::write(&small, vec![0x33u8; small_bytes as usize]).map_err(|e| format!("{}: {e}", small.display()))?;
        let small_on_mount = mp_ferry.join("bench-fuse-small.dat");
        fread1.values.push(read_file(&small_on_mount, small_bytes, s.block)?);
        fread2.values.push(read_file(&small_on_mount, small_bytes, s.block)?);
        let (r, cpu) = cpu_per_gib(s.bytes, || read_file(&null_file, s.bytes, s.block))?;
        nread.values.push(r);
        nread_cpu.values.push(cpu);
        let (r, cpu) = cpu_per_gib(s.bytes, || read_file(&null_dev_file, s.bytes, s.block))?;
        nread_dev.values.push(r);
        nread_dev_cpu.values.push(cpu);
        if two {
            // The receiver on CPU 0 (where the daemons are), the sender
            // where the server is; this thread's mask is put back after.
            let (_, cpu) = crate::bench::raw_sendfile_spliced_placed(&dir.join("bench-fuse.dat"), s.bytes, 0, 1)?;
            spliced_cpu.values.push(cpu / gib(s.bytes));
        }
        fread0.values.push(read_file(&mp_ferry0.join("bench-fuse.dat"), s.bytes, s.block)?);
        native_read.values.push(read_file(&small, small_bytes, s.block)?);
        // The same file read with the library, no FUSE: what the mount adds.
        let server_cpu = proc_cpu(server.0.id());
        let (r, cpu) = cpu_per_gib(s.bytes, || super::ferry_read(&client, "/bench-fuse.dat", s.bytes, s.block))?;
        lread.values.push(r);
        lread_cpu.values.push(cpu);
        lread_server_cpu.values.push((proc_cpu(server.0.id()) - server_cpu) / gib(s.bytes));
        lwrite.values.push(super::ferry_write(&client, s.bytes, s.block)?);
        let (n, f, f99) = stats(&mp_null.join(ferry_fuse::NULL_FILE), &mp_ferry0.join("bench-fuse.dat"), s.stats)?;
        nstat.values.push(n);
        fstat.values.push(f);
        fstat99.values.push(f99);
        native.values.push(tree_scan(&dir.join("tree"), files)?);
        scan.values.push(tree_scan(&mp_ferry.join("tree"), files)?);
        // At once again: what the kernel kept (under leases, all of it).
        warm.values.push(tree_scan(&mp_ferry.join("tree"), files)?);
        scan0.values.push(tree_scan(&mp_ferry0.join("tree"), files)?);
    }
    drop(client);
    let _ = fs::remove_file(dir.join("bench.dat"));
    drop((ferry, ferry0, null, ferry_dev, null_dev));
    drop(server);
    println!(
        "ferry bench --fuse: {} MiB file, {} KiB requests (direct I/O), {} runs, {} stats each, \
         tree of {} files in {} directories; medians (min..max);\n\
         {}",
        s.bytes >> 20,
        s.block >> 10,
        a.runs,
        s.stats,
        files,
        s.dirs,
        if two { "pinned: application and FUSE daemons CPU 0, ferry server CPU 1" } else { "one CPU: not pinned" }
    );
    println!("FUSE transport of the mounts not marked /dev/fuse: {ring_said}");
    println!("{:<36} {:>10} {:>22} {:>22}", "figure", "median", "min..max", "ratio");
    let pct = |x: &Series, of: &Series| format!("{:.0} % of null FUSE", 100.0 * x.median() / of.median());
    for (series, ratio) in [
        (&nread, String::new()),
        (&fread, pct(&fread, &nread)),
        (&lread, format!("mount is {:.0} % of it", 100.0 * fread.median() / lread.median())),
        (&fread0, format!("first read is {:.2} x it", fread.median() / fread0.median())),
        (&native_read, String::new()),
        (&fread1, String::new()),
        (
            &fread2,
            format!(
                "{:.2} x local, {:.1} x first",
                fread2.median() / native_read.median(),
                fread2.median() / fread1.median()
            ),
        ),
        (&nwrite, String::new()),
        (&fwrite, pct(&fwrite, &nwrite)),
        (&lwrite, format!("mount is {:.0} % of it", 100.0 * fwrite.median() / lwrite.median())),
        (&nread_dev, format!("io_uring is {:.2} x it", nread.median() / nread_dev.median())),
        (&nwrite_dev, format!("io_uring is {:.2} x it", nwrite.median() / nwrite_dev.median())),
        (&fread_dev, format!("io_uring is {:.2} x it", fread.median() / fread_dev.median())),
        (&fwrite_dev, format!("io_uring is {:.2} x it", fwrite.median() / fwrite_dev.median())),
        (&fread_cpu, String::new()),
        (&fread_dev_cpu, String::new()),
        (&lread_cpu, format!("mount read is {:.2} x it", fread_cpu.median() / lread_cpu.median())),
        (&fwrite_cpu, String::new()),
        (&fwrite_dev_cpu, String::new()),
        (&nread_cpu, String::new()),
        (&nread_dev_cpu, String::new()),
        (&spliced_cpu, String::new()),
        (&lread_server_cpu, String::new()),
        (&nstat, String::new()),
        (&fstat, format!("{:.2} x null FUSE", fstat.median() / nstat.median())),
        (&fstat99, String::new()),
        (&native, String::new()),
        (&scan, format!("{:.1} x native", scan.median() / native.median())),
        (&warm, format!("{:.1} x native", warm.median() / native.median())),
        (&scan0, format!("{:.1} x native", scan0.median() / native.median())),
    ] {
        println!(
            "{:<36} {:>7.2} {:<5} {:>10.2}..{:<10.2} {ratio}",
            series.name,
            series.median(),
            series.unit,
            series.min(),
            series.max()
        );
    }
    // The most any mount could read at here, whatever its daemon did: the
    // FUSE work of the cheaper transport plus a receive with no copy, on
    // the reader's CPU; with the server's work too, on both CPUs.
    let fuse_least = nread_cpu.median().min(nread_dev_cpu.median());
    let bound = if two && !spliced_cpu.values.is_empty() {
        let one = gib_mbps(fuse_least + spliced_cpu.median());
        let both = gib_mbps((fuse_least + spliced_cpu.median() + lread_server_cpu.median()) / 2.0);
        println!(
            "bound: a mount read costs the reader's CPU at least {:.2} (null FUSE) + {:.2} (receive, no copy) s/GiB: \
             at most {one:.0} MB/s = {:.2} x the library's read; with the server's {:.2} s/GiB on two CPUs, {both:.0} \
             MB/s = {:.2} x",
            fuse_least,
            spliced_cpu.median(),
            one / lread.median(),
            lread_server_cpu.median(),
            both / lread.median(),
        );
        // The mount measured here has its daemon on the reader's CPU, as
        // on a client machine with no CPU to spare: the first bound is its.
        Some(one / lread.median())
    } else {
        None
    };
    for (what, ratio, target, bound) in [
        ("mount read", fread.median() / lread.median(), 0.8, bound),
        ("mount write", fwrite.median() / lwrite.median(), 0.6, None),
    ] {
        let why = match bound {
            Some(b) if ratio < target && b < target => {
                format!("; out of reach with the daemon on the reader's CPU: the bound above is {b:.2} x")
            }
            _ => String::new(),
        };
        println!(
            "target: ferry {what} >= {target} x the library's (issue 34): {} ({ratio:.2} x){why}",
            if ratio >= target { "met" } else { "NOT met" }
        );
    }
    let ratio = fread.median() / nread.median();
    println!(
        "target: ferry mount read >= 80 % of null FUSE read: {} ({:.0} %)",
        if ratio >= 0.8 { "met" } else { "NOT met" },
        100.0 * ratio
    );
    // Speeds, so higher is better: native time over the mount's.
    let warm_speed = native.median() / warm.median();
    println!(
        "target: warm tree scan on the mount >= 0.8 x native speed: {} ({warm_speed:.2} x)",
        if warm_speed >= 0.8 { "met" } else { "NOT met" }
    );
    Ok(())
}

/// Runs `f` (which moves `bytes`): its result, and this process's CPU
/// seconds (user and system, every thread: the application's loop and, for
/// a mount, its FUSE daemon) per GiB moved.
fn cpu_per_gib(bytes: u64, f: impl FnOnce() -> Result<f64, String>) -> Result<(f64, f64), String> {
    let t0 = cpu_secs();
    let r = f()?;
    Ok((r, (cpu_secs() - t0) * (1u64 << 30) as f64 / bytes as f64))
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// MB/s of a CPU that spends `secs_per_gib` on each GiB.
fn gib_mbps(secs_per_gib: f64) -> f64 {
    (1u64 << 30) as f64 / secs_per_gib / 1e6
}

/// CPU seconds this process used so far, every thread (the application's
/// loop and the in-process FUSE daemons), to the nanosecond: `--quick`
/// moves too few bytes for clock ticks.
fn cpu_secs() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// CPU seconds the live threads of process `pid` ran so far, to the
/// nanosecond (`schedstat`'s first field): the server's, whose threads
/// outlive a read.
fn proc_cpu(pid: u32) -> f64 {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else { return 0.0 };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()))
        .sum();
    ns as f64 / 1e9
}

/// `dirs` directories of `per_dir` small files, made directly in the
/// export (the mount is what is measured, not the making).
fn make_tree(root: &Path, dirs: usize, per_dir: usize) -> Result<(), String> {
    let e = |p: &Path, e: io::Error| format!("{}: {e}", p.display());
    for d in 0..dirs {
        let dp = root.join(format!("d{d:03}"));
        fs::create_dir_all(&dp).map_err(|x| e(&dp, x))?;
        for f in 0..per_dir {
            let fp = dp.join(format!("f{f:04}"));
            fs::write(&fp, b"ferry\n").map_err(|x| e(&fp, x))?;
        }
    }
    Ok(())
}

fn write_file(path: &Path, bytes: u64, block: usize, create: bool) -> Result<f64, String> {
    let e = |x: io::Error| format!("{}: {x}", path.display());
    let buf = vec![0x5au8; block];
    let t = Instant::now();
    let mut f = OpenOptions::new().write(true).create(create).truncate(create).open(path).map_err(e)?;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(block as u64) as usize;
        f.write_all(&buf[..n]).map_err(e)?;
        left -= n as u64;
    }
    // close(2) reports a failed flush; with direct I/O every write above
    // already reached the server.
    drop(f);
    Ok(mbps(bytes, t.elapsed()))
}

fn read_file(path: &Path, bytes: u64, block: usize) -> Result<f64, String> {
    let e = |x: io::Error| format!("{}: {x}", path.display());
    let mut buf = vec![0u8; block];
    let t = Instant::now();
    let mut f = File::open(path).map_err(e)?;
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(e)?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    let elapsed = t.elapsed();
    if total != bytes {
        return Err(format!("{}: read {total} bytes, expected {bytes}", path.display()));
    }
    Ok(mbps(bytes, elapsed))
}

/// `stat(2)` of a file on the null mount and on ferry's uncached mount, in
/// interleaved batches: median of each, and ferry's p99, in µs.
fn stats(null: &Path, ferry: &Path, n: usize) -> Result<(f64, f64, f64), String> {
    const BATCHES: usize = 20;
    let per = n.div_ceil(BATCHES);
    let hist = || hdrhistogram::Histogram::<u64>::new(3).map_err(|e| e.to_string());
    let (mut hn, mut hf) = (hist()?, hist()?);
    for _ in 0..BATCHES {
        for (p, h) in [(null, &mut hn), (ferry, &mut hf)] {
            for _ in 0..per {
                let t = Instant::now();
                fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
                h.record(t.elapsed().as_nanos() as u64).map_err(|e| e.to_string())?;
            }
        }
    }
    let us = |h: &hdrhistogram::Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1e3;
    Ok((us(&hn, 0.5), us(&hf, 0.5), us(&hf, 0.99)))
}

/// Lists every directory under `root` and `lstat`s every entry, as
/// `ls -lR` or `find -ls` would; milliseconds for the whole tree.
fn tree_scan(root: &Path, expect: usize) -> Result<f64, String> {
    let e = |p: &Path, x: io::Error| format!("{}: {x}", p.display());
    let t = Instant::now();
    let mut files = 0;
    for d in fs::read_dir(root).map_err(|x| e(root, x))? {
        let dp = d.map_err(|x| e(root, x))?.path();
        fs::symlink_metadata(&dp).map_err(|x| e(&dp, x))?;
        for f in fs::read_dir(&dp).map_err(|x| e(&dp, x))? {
            let fp = f.map_err(|x| e(&dp, x))?.path();
            fs::symlink_metadata(&fp).map_err(|x| e(&fp, x))?;
            files += 1;
        }
    }
    let elapsed = t.elapsed();
    if files != expect {
        return Err(format!("{}: scanned {files} files, expected {expect}", root.display()));
    }
    Ok(elapsed.as_secs_f64() * 1e3)
}
