//! The experiments of `ferry compare`, one function each: which
//! measurements run in which order, and the figures they add.

use std::path::Path;

use super::load;

use super::*;

/// Runs one measurement; a baseline's failure is recorded and the run
/// goes on, ferry's is an error.
fn try_measure(sys: &System, args: &[&str], errors: &mut Vec<String>) -> Option<Measured> {
    match measure(sys, args) {
        Ok(m) => Some(m),
        Err(e) => {
            eprintln!("ferry compare: {e}");
            ALL_ERRORS.lock().unwrap_or_else(|p| p.into_inner()).push(e.clone());
            errors.push(e);
            None
        }
    }
}

fn ferry_errors(errors: Vec<String>) -> Result<(), String> {
    match errors.into_iter().find(|e| e.starts_with("ferry ") || e.starts_with("local ")) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The systems in another order each run: run `r` of `runs` starts a
/// fraction `r / runs` into the list, so the starts spread over all of it
/// (with 3 runs and 12 systems: the 1st, 5th and 9th), and none is always
/// first to meet a cold page cache or a fresh allocation of tmpfs pages,
/// nor always last after the others warmed the machine. (Starting one
/// further each run put only the first three, all ferry's, first: run 6's
/// 1 GiB writes show what that costs the first, ~5 x.)
fn rotated(systems: &[System], run: usize, runs: usize) -> impl Iterator<Item = &System> {
    let n = systems.len().max(1);
    systems.iter().cycle().skip(run * n / runs.max(1) % n).take(systems.len())
}

pub(super) fn exp_read(plan: &Plan, runs: usize, systems: &[System], res: &mut Results) -> Result<(), String> {
    eprintln!("ferry compare: experiment 1, sequential read vs request size");
    let mut errors = Vec::new();
    for run in 0..runs {
        progress("experiment 1", run, runs);
        for &s in &plan.read_sizes {
            let limit = plan.read_limit(s);
            for sys in rotated(systems, run, runs) {
                let Some(m) = try_measure(sys, &["read", "/big.dat", &s.to_string(), &limit.to_string()], &mut errors)
                else {
                    res.add("1", &sys.name, &size_label(s), "failed", "", 1.0);
                    continue;
                };
                let bytes = k(&m.kv, "bytes");
                if bytes as u64 != limit {
                    errors.push(format!("{} read: {bytes} bytes, expected {limit}", sys.name));
                    continue;
                }
                res.add("1", &sys.name, &size_label(s), "throughput", "MB/s", bytes / k(&m.kv, "secs") / 1e6);
                if s == MIB && !sys.local {
                    let gib = bytes / GIB as f64;
                    res.add("8", &sys.name, "read 1M", "client CPU", "s/GiB", m.client_cpu / gib);
                    res.add("8", &sys.name, "read 1M", "server CPU", "s/GiB", m.server_cpu / gib);
                    let args = ["read", "/big.dat", &s.to_string(), &limit.to_string()];
                    match placed(sys, || measure(sys, &args)) {
                        Ok(Some(m)) if k(&m.kv, "bytes") as u64 == limit => {
                            let label = "read 1M, pinned cross core";
                            res.add("8", &sys.name, label, "client CPU", "s/GiB", m.client_cpu / gib);
                            res.add("8", &sys.name, label, "server CPU", "s/GiB", m.server_cpu / gib);
                        }
                        Ok(Some(m)) => errors.push(format!(
                            "{}: pinned, read {} bytes, expected {limit}",
                            sys.name,
                            k(&m.kv, "bytes")
                        )),
                        Ok(None) => {}
                        Err(e) => errors.push(format!("{} pinned 1 MiB read: {e}", sys.name)),
                    }
                }
            }
        }
        // Small reads of the whole file, ferry's library and the local
        // directory placed as experiment 0 places its pairs (the reader on
        // CPU 0, a server on CPU 1): unpinned, ferry's client and server
        // often share a CPU, which two machines never do, and the 4 KiB
        // row above reads only 128 MiB, mostly the read-ahead's ramp.
        let (small, whole) = (4 * KIB, plan.file);
        let label = format!("{} of {}, pinned", size_label(small), size_label(whole));
        for sys in rotated(systems, run, runs).filter(|s| s.local || s.name == "ferry") {
            let args = ["read", "/big.dat", &small.to_string(), &whole.to_string()];
            match placed(sys, || measure(sys, &args)) {
                Ok(Some(m)) if k(&m.kv, "bytes") as u64 == whole => {
                    res.add("1", &sys.name, &label, "throughput", "MB/s", k(&m.kv, "bytes") / k(&m.kv, "secs") / 1e6);
                }
                Ok(Some(m)) => {
                    errors.push(format!("{} {label}: read {} bytes, expected {whole}", sys.name, k(&m.kv, "bytes")))
                }
                Ok(None) => {}
                Err(e) => errors.push(format!("{} {label}: {e}", sys.name)),
            }
        }
    }
    ferry_errors(errors)
}

pub(super) fn exp_write(
    plan: &Plan,
    runs: usize,
    systems: &[System],
    res: &mut Results,
    export: &Path,
) -> Result<(), String> {
    eprintln!("ferry compare: experiment 2, write + fsync vs file size");
    let mut errors = Vec::new();
    let biggest = plan.write_sizes.last().copied().unwrap_or(0);
    for run in 0..runs {
        progress("experiment 2", run, runs);
        for &size in &plan.write_sizes {
            for sys in rotated(systems, run, runs).filter(|s| s.writes) {
                let name = format!("/w-{}.dat", sys.name);
                let args = ["write", name.as_str(), &size.to_string(), &MIB.to_string()];
                let m = try_measure(sys, &args, &mut errors);
                // Keep tmpfs usage down; but Ganesha may hold deleted files
                // open, so its file is kept and truncated by the next run.
                if size == biggest && !sys.name.starts_with("nfs") {
                    let _ = std::fs::remove_file(export.join(&name[1..]));
                }
                let Some(m) = m else { continue };
                let label = size_label(size);
                res.add("2", &sys.name, &label, "throughput", "MB/s", k(&m.kv, "bytes") / k(&m.kv, "secs") / 1e6);
                if size == biggest && !sys.local {
                    let gib = size as f64 / GIB as f64;
                    res.add("8", &sys.name, &format!("write {label}"), "client CPU", "s/GiB", m.client_cpu / gib);
                    res.add("8", &sys.name, &format!("write {label}"), "server CPU", "s/GiB", m.server_cpu / gib);
                }
            }
        }
    }
    for sys in systems {
        let _ = std::fs::remove_file(export.join(format!("w-{}.dat", sys.name)));
    }
    ferry_errors(errors)
}

/// The AFS paper's Tables 3 and 4: fetching a file through each ferry
/// client with the client cache cold, warm, and bypassed; then mount reads
/// of a cached file beside a local read of its cache file.
pub(super) fn exp_fetch(
    plan: &Plan,
    runs: usize,
    systems: &[System],
    res: &mut Results,
    cache: &Path,
) -> Result<(), String> {
    eprintln!("ferry compare: experiment 7, fetch with the client cache cold, warm and bypassed");
    let cold = cache.to_string_lossy().into_owned();
    let mut errors = Vec::new();
    for run in 0..runs {
        progress("experiment 7", run, runs);
        for &size in &plan.fetch_sizes {
            let label = size_label(size);
            let repeat = (plan.fetch_bytes / size).max(1);
            let cached = format!("/++fetch-{label}.dat");
            let bypass = format!("/fetch-{label}.dat");
            for sys in systems.iter().filter(|s| s.name.starts_with("ferry")) {
                for (mode, file, empty) in
                    [("cold", &cached, cold.as_str()), ("warm", &cached, "-"), ("bypass", &bypass, "-")]
                {
                    let args = ["fetch", file.as_str(), &repeat.to_string(), empty];
                    let Some(m) = try_measure(sys, &args, &mut errors) else { continue };
                    if k(&m.kv, "bytes") as u64 != size * repeat {
                        errors.push(format!(
                            "{} fetch {file}: {} bytes, expected {}",
                            sys.name,
                            k(&m.kv, "bytes"),
                            size * repeat
                        ));
                        continue;
                    }
                    let (p, per) = (format!("{label} {mode}"), 1e3 / repeat as f64);
                    res.add("7", &sys.name, &p, "elapsed", "ms", k(&m.kv, "secs") * per);
                    res.add("7", &sys.name, &p, "user", "ms", k(&m.kv, "fuser") * per);
                    res.add("7", &sys.name, &p, "system", "ms", k(&m.kv, "fsys") * per);
                    if !sys.client_side.is_empty() {
                        let own = own_cpu(&m.kv);
                        res.add("7", &sys.name, &p, "daemon CPU", "ms", (m.client_cpu - own).max(0.0) * per);
                    }
                }
            }
        }
        // The largest cached file, warm: through the mount (passthrough to
        // the cache file) and straight from the cache file.
        let (Some(&size), Some(fuse)) = (plan.fetch_sizes.last(), systems.iter().find(|s| s.name == "ferry-fuse"))
        else {
            continue;
        };
        let file = format!("/++fetch-{}.dat", size_label(size));
        let _ = try_measure(fuse, &["fetch", &file, "1", "-"], &mut errors);
        let Some(data) = largest_data_file(cache) else {
            errors.push(format!("ferry-fuse: no cache file for {file} in {}", cache.display()));
            continue;
        };
        let local = System {
            name: "cache file".into(),
            cmd: vec![exe()?, "compare".into(), "--worker".into(), "/".into()],
            env: Vec::new(),
            server: Vec::new(),
            client_side: Vec::new(),
            writes: false,
            note: String::new(),
            local: true,
        };
        for (sys, path) in [(fuse, file.as_str()), (&local, data.as_str())] {
            let Some(m) = try_measure(sys, &["read", path, &MIB.to_string(), &size.to_string()], &mut errors) else {
                continue;
            };
            res.add("7m", &sys.name, "read", "throughput", "MB/s", k(&m.kv, "bytes") / k(&m.kv, "secs") / 1e6);
        }
    }
    ferry_errors(errors)
}

/// The AFS paper's split path (its Table 4): files fetched over the main
/// connection only, with data channels (1, 2, 4; one from a 64 KiB and a
/// 4 MiB threshold), and on the same-host path, beside a local read; the largest written and fsynced the same
/// ways; and a `stat`'s latency while the same client reads in bulk.
pub(super) fn exp_split(
    plan: &Plan,
    runs: usize,
    ferry: &System,
    local: &System,
    res: &mut Results,
) -> Result<(), String> {
    eprintln!("ferry compare: experiment 9, split path: main connection, data channels, same host");
    let variant = |name: &str, env: &[(&str, &str)]| {
        let mut s = System { name: name.into(), note: String::new(), ..ferry.clone() };
        s.env.retain(|(k, _)| !k.starts_with("FERRY_SAME_HOST") && !k.starts_with("FERRY_DATA_"));
        s.env.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        s
    };
    let variants = [
        variant("main only", &[("FERRY_DATA_CHANNELS", "0"), ("FERRY_SAME_HOST", "0")]),
        variant("channels 1", &[("FERRY_DATA_CHANNELS", "1"), ("FERRY_SAME_HOST", "0")]),
        variant("channels 2", &[("FERRY_DATA_CHANNELS", "2"), ("FERRY_SAME_HOST", "0")]),
        variant("channels 4", &[("FERRY_DATA_CHANNELS", "4"), ("FERRY_SAME_HOST", "0")]),
        variant(
            "1 from 64K",
            &[("FERRY_DATA_CHANNELS", "1"), ("FERRY_DATA_THRESHOLD", "65536"), ("FERRY_SAME_HOST", "0")],
        ),
        variant(
            "1 from 4M",
            &[("FERRY_DATA_CHANNELS", "1"), ("FERRY_DATA_THRESHOLD", "4194304"), ("FERRY_SAME_HOST", "0")],
        ),
        variant("same host", &[("FERRY_SAME_HOST", "1")]),
    ];
    let biggest = plan.fetch_sizes.last().copied().unwrap_or(MIB);
    let stats = (plan.stats / 5).max(20).to_string();
    let mut errors = Vec::new();
    for run in 0..runs {
        progress("experiment 9", run, runs);
        for sys in variants.iter().chain([local]) {
            for &size in &plan.fetch_sizes {
                let label = size_label(size);
                let repeat = (plan.fetch_bytes / size).max(1);
                let file = format!("/fetch-{label}.dat");
                let Some(m) = try_measure(sys, &["fetch", &file, &repeat.to_string(), "-"], &mut errors) else {
                    continue;
                };
                if k(&m.kv, "bytes") as u64 != size * repeat {
                    errors.push(format!("{} fetch {file}: {} bytes", sys.name, k(&m.kv, "bytes")));
                    continue;
                }
                res.add(
                    "9",
                    &sys.name,
                    &format!("fetch {label}"),
                    "elapsed",
                    "ms",
                    k(&m.kv, "secs") * 1e3 / repeat as f64,
                );
            }
            let name = format!("/w-split-{}.dat", sys.name.replace(' ', "-"));
            if let Some(m) = try_measure(sys, &["write", &name, &biggest.to_string(), &MIB.to_string()], &mut errors) {
                let label = format!("write+fsync {}", size_label(biggest));
                res.add("9", &sys.name, &label, "throughput", "MB/s", k(&m.kv, "bytes") / k(&m.kv, "secs") / 1e6);
            }
            if sys.local {
                continue;
            }
            if let Some(m) = try_measure(sys, &["statbulk", "/bench.dat", "/big.dat", &stats], &mut errors) {
                res.add("9", &sys.name, "stat beside bulk", "stat p50", "us", k(&m.kv, "stat_p50"));
                res.add("9", &sys.name, "stat beside bulk", "stat p99", "us", k(&m.kv, "stat_p99"));
                res.add("9", &sys.name, "stat beside bulk", "bulk rate", "MB/s", k(&m.kv, "bulk_mbs"));
            }
        }
    }
    ferry_errors(errors)
}

/// The largest data file of a client cache directory (its layout's `v1`).
fn largest_data_file(cache: &Path) -> Option<String> {
    std::fs::read_dir(cache.join("v1"))
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".data"))
        .filter_map(|e| Some((e.metadata().ok()?.len(), e.path())))
        .max()
        .map(|(_, p)| p.to_string_lossy().into_owned())
}

pub(super) fn exp_window(plan: &Plan, runs: usize, ferry: &System, res: &mut Results) -> Result<(), String> {
    eprintln!("ferry compare: experiment 3, window sweep");
    let limit = plan.read_limit(64 * KIB);
    for run in 0..runs {
        progress("experiment 3", run, runs);
        for &w in &plan.windows {
            let m =
                measure(ferry, &["readw", "/big.dat", &(64 * KIB).to_string(), &limit.to_string(), &w.to_string()])?;
            let bytes = k(&m.kv, "bytes");
            let p = w.to_string();
            res.add("3", "ferry", &p, "throughput", "MB/s", bytes / k(&m.kv, "secs") / 1e6);
            let cs = k(&m.kv, "nvcsw") + k(&m.kv, "nivcsw");
            res.add("3", "ferry", &p, "client context switches", "per GiB", cs / (bytes / GIB as f64));
            res.add("3", "ferry", &p, "client CPU", "s/GiB", m.client_cpu / (bytes / GIB as f64));
        }
    }
    Ok(())
}

pub(super) fn exp_stat(plan: &Plan, runs: usize, systems: &[System], res: &mut Results) -> Result<(), String> {
    eprintln!("ferry compare: experiment 4, stat latency");
    let mut errors = Vec::new();
    for run in 0..runs {
        progress("experiment 4", run, runs);
        for sys in rotated(systems, run, runs) {
            let Some(m) = try_measure(sys, &["stat", "/big.dat", &plan.stats.to_string()], &mut errors) else {
                continue;
            };
            for (key, param) in [
                ("stat_p50", "stat by path, median"),
                ("stat_p99", "stat by path, p99"),
                ("fstat_p50", "getattr on open file, median"),
                ("fstat_p99", "getattr on open file, p99"),
            ] {
                res.add("4", &sys.name, param, "latency", "µs", k(&m.kv, key));
            }
        }
    }
    ferry_errors(errors)
}

pub(super) fn exp_scan(plan: &Plan, runs: usize, systems: &[System], res: &mut Results) -> Result<(), String> {
    eprintln!("ferry compare: experiment 5, tree scan");
    let mut errors = Vec::new();
    let files = (plan.tree.0 * plan.tree.1) as f64;
    for run in 0..runs {
        progress("experiment 5", run, runs);
        for sys in rotated(systems, run, runs) {
            for (read, param) in [("0", "readdir+stat"), ("1", "readdir+stat+read")] {
                let Some(m) = try_measure(sys, &["scan", "/tree", read], &mut errors) else { continue };
                if k(&m.kv, "files") != files {
                    errors.push(format!("{} scan: saw {} files, expected {files}", sys.name, k(&m.kv, "files")));
                    continue;
                }
                res.add("5", &sys.name, param, "rate", "files/s", files / k(&m.kv, "secs"));
            }
        }
    }
    ferry_errors(errors)
}

pub(super) fn exp_clients(
    plan: &Plan,
    runs: usize,
    systems: &[System],
    res: &mut Results,
    export: &Path,
) -> Result<(), String> {
    eprintln!("ferry compare: experiment 6, many clients");
    let mut errors = Vec::new();
    let mut points: Vec<(usize, bool)> = plan.clients.iter().map(|&n| (n, false)).collect();
    points.push((plan.mix_clients, true));
    for run in 0..runs {
        progress("experiment 6", run, runs);
        for &(n, mix) in &points {
            for sys in systems.iter().filter(|s| !s.local && (s.writes || !mix)) {
                match parallel(sys, n, mix, plan.duration) {
                    Ok(got) => {
                        let p = if mix { format!("{n} mixed") } else { n.to_string() };
                        add_clients(res, &sys.name, &p, got);
                    }
                    Err(e) => errors.push(format!("{} {n} clients: {e}", sys.name)),
                }
            }
        }
        if plan.idle > 0 {
            if let Err(e) = beside_idle(plan, &systems[0], res) {
                errors.push(format!("ferry beside {} idle clients: {e}", plan.idle));
            }
        }
    }
    if let Ok(rd) = std::fs::read_dir(export) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with("big.dat.w") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    for e in &errors {
        eprintln!("ferry compare: {e}");
    }
    ferry_errors(errors)
}

/// One point of experiment 6: its throughput, and beside it what the
/// server held meanwhile.
fn add_clients(res: &mut Results, sys: &str, p: &str, got: Parallel) {
    res.add("6", sys, p, "aggregate throughput", "MB/s", got.mbps);
    res.add("6", sys, p, "operations", "ops/s", got.ops);
    res.add("6", sys, p, "failed requests", "count", got.failed);
    if let Some(l) = got.load {
        res.add("6", sys, p, "server RSS", "MiB", l.rss_kib as f64 / 1024.0);
        res.add("6", sys, p, "server threads", "count", l.threads as f64);
        res.add("6", sys, p, "server descriptors", "count", l.fds as f64);
    }
}

/// Ferry's server holding `plan.idle` idle clients, each with a session:
/// its memory per idle client, a client's `stat` beside them against
/// alone, and the largest client count of experiment 6 run beside them.
fn beside_idle(plan: &Plan, ferry: &System, res: &mut Results) -> Result<(), String> {
    use crate::soak_idle::{hold, stat_latency};
    let (n, active) = (plan.idle, plan.clients.iter().copied().max().unwrap_or(1));
    let addr = plan.addr.as_str();
    let p = format!("{n} idle");
    let alone = stat_latency(addr, plan.stats.min(5000))?;
    let before = load::sample(&ferry.server);
    let idle = hold(addr, n, 4)?;
    std::thread::sleep(Duration::from_secs(1));
    let held = load::sample(&ferry.server);
    let beside = stat_latency(addr, plan.stats.min(5000))?;
    let per = held.rss_kib.saturating_sub(before.rss_kib) as f64 / n as f64;
    // Per idle client: a lower bound after the runs before grew the
    // server's heap (what they freed is reused); `ferry soak --idle` has
    // the figure of a fresh server.
    res.add("6", &ferry.name, &p, "memory per idle client", "KiB", per);
    res.add("6", &ferry.name, &p, "server RSS with them", "MiB", held.rss_kib as f64 / 1024.0);
    res.add("6", &ferry.name, &p, "server threads with them", "count", held.threads as f64);
    res.add("6", &ferry.name, &p, "stat p50 alone", "µs", alone.0 as f64);
    res.add("6", &ferry.name, &p, "stat p99 alone", "µs", alone.1 as f64);
    res.add("6", &ferry.name, &p, "stat p50 beside idle", "µs", beside.0 as f64);
    res.add("6", &ferry.name, &p, "stat p99 beside idle", "µs", beside.1 as f64);
    let got = parallel(ferry, active, false, plan.duration)?;
    add_clients(res, &ferry.name, &format!("{active} + {n} idle"), got);
    drop(idle);
    // Their sessions end a second after (`--session-lease 1`).
    std::thread::sleep(Duration::from_secs(3));
    Ok(())
}

/// What `parallel` measured.
struct Parallel {
    mbps: f64,
    ops: f64,
    failed: f64,
    load: Option<load::Load>,
}

/// `n` client processes reading (or, mixed, half writing) 64 KiB chunks
/// for `duration` seconds from a common start time: aggregate MB/s,
/// operations/s, failed requests (plus clients that failed outright), and
/// the server's peak load meanwhile.
fn parallel(sys: &System, n: usize, mix: bool, duration: f64) -> Result<Parallel, String> {
    let t0 = wall() + 0.5 + 0.02 * n as f64;
    let t1 = t0 + duration;
    let sampler = load::Sampler::start(&sys.server, t0, t1);
    let mut children = Vec::with_capacity(n);
    for i in 0..n {
        let args: Vec<String> = [
            "chunks".to_string(),
            "/big.dat".into(),
            (64 * KIB).to_string(),
            format!("{t0:.3}"),
            format!("{t1:.3}"),
            i.to_string(),
            u8::from(mix).to_string(),
        ]
        .into();
        match spawn_client(sys, &args) {
            Ok(c) => children.push(c),
            Err(e) => {
                for c in children {
                    let _ = finish(c, Duration::from_secs(1));
                }
                return Err(e);
            }
        }
    }
    let (mut bytes, mut ops, mut failed) = (0.0, 0.0, 0.0);
    let limit = Duration::from_secs_f64(duration + 120.0 + 0.1 * n as f64);
    let mut first_err = None;
    for c in children {
        match finish(c, limit).and_then(|o| parse_ok(&o)) {
            Ok(kv) => {
                bytes += k(&kv, "bytes");
                ops += k(&kv, "ops");
                failed += k(&kv, "errors");
            }
            Err(e) => {
                failed += 1.0;
                first_err.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_err {
        eprintln!("ferry compare: {} with {n} clients: a client failed: {e}", sys.name);
    }
    Ok(Parallel { mbps: bytes / duration / 1e6, ops: ops / duration, failed, load: sampler.join() })
}

pub(super) fn raw_limits(
    plan: &Plan,
    runs: usize,
    res: &mut Results,
    ferry: &System,
    port: u16,
    server: u32,
    big: &Path,
) -> Result<(), String> {
    eprintln!("ferry compare: raw limits");
    let sent = plan.raw_bytes.min(std::fs::metadata(big).map_err(|e| format!("{}: {e}", big.display()))?.len());
    let cross = rustix::thread::sched_getaffinity(None).map_err(|e| e.to_string())?.count() >= 2;
    let per = |cpu: f64, bytes: u64| cpu / (bytes as f64 / GIB as f64);
    for run in 0..runs {
        progress("raw limits", run, runs);
        let (mbps, cpu) = bench::raw_stream_cpu(plan.raw_bytes)?;
        // The sender writes one 1 MiB buffer again and again: the receiver
        // copies bytes the sender's copy has just put in the cache.
        res.add("0", "raw", "TCP stream, 1 MiB writes", "throughput", "MB/s", mbps);
        // What receiving costs a raw receiver, by how the sender sent: the
        // yardstick for experiment 8's client CPU (ferry's server uses
        // `sendfile`; the baselines' servers copy from a buffer).
        res.add("0", "raw", "TCP receive, sender writes a buffer", "receiver CPU", "s/GiB", per(cpu, plan.raw_bytes));
        // The bytes ferry serves in experiment 1: the test file's pages,
        // `sendfile`d, each once (in memory, not in the CPU's cache).
        let (mbps, cpu) = bench::raw_sendfile_cpu(big, sent)?;
        res.add("0", "raw", "TCP stream, sender sendfiles the file", "throughput", "MB/s", mbps);
        res.add("0", "raw", "TCP receive, sender sendfiles the file", "receiver CPU", "s/GiB", per(cpu, sent));
        if cross {
            placed_pairs(res, ferry, server, big, sent)?;
        }
        res.add("0", "raw", "Unix stream, 1 MiB writes", "throughput", "MB/s", unix_stream(plan.raw_bytes)?);
        res.add("0", "raw", "memcpy 64 MiB", "throughput", "MB/s", memcpy());
        res.add("0", "raw", "TCP ping-pong 64 B, unpinned", "latency", "µs", ping_pong(plan.rtts)?);
    }
    // Pinned latencies, as `ferry bench` measures them; bench pins this
    // process and the server, so their masks are restored afterwards.
    let mine = rustix::thread::sched_getaffinity(None).map_err(|e| e.to_string())?;
    let cross = mine.count() >= 2;
    let addr = format!("127.0.0.1:{port}");
    let mut r = Ok(());
    for run in 0..runs {
        progress("raw limits, pinned latencies", run, runs);
        for (cpu, label) in [(0usize, "same core"), (1, "cross core")] {
            if cpu == 1 && !cross {
                continue;
            }
            match bench::latencies(&addr, server, plan.rtts, cpu, cross) {
                Ok(l) => {
                    res.add("0", "raw", &format!("TCP ping-pong 64 B, pinned {label}"), "latency", "µs", l.raw);
                    res.add("0", "ferry", &format!("null request, pinned {label}"), "latency", "µs", l.null);
                    res.add("0", "ferry", &format!("stat, pinned {label}"), "latency", "µs", l.stat);
                    res.add("0", "ferry", &format!("stat p99, pinned {label}"), "latency", "µs", l.stat99);
                }
                Err(e) => r = Err(e),
            }
        }
    }
    rustix::thread::sched_setaffinity(None, &mine).map_err(|e| e.to_string())?;
    let _ = bench::set_mask(Some(server), &mine);
    r
}

/// The raw receiver of the test file's `sendfile`d stream and ferry's
/// 1 MiB reads of the same file, one after the other, placed alike: the
/// receiver (the worker) on CPU 0 and the sender (ferry's server) on CPU
/// 1, then both on CPU 0. Unpinned, the raw pair shares a CPU most of
/// the time and ferry's client and server do not, and the receive copy
/// costs 2-3 x more across CPUs here: ratios of unpinned figures compare
/// placements, not receivers (docs/benchmarks.md, issue 34).
fn placed_pairs(res: &mut Results, ferry: &System, server: u32, big: &Path, bytes: u64) -> Result<(), String> {
    let per = |cpu: f64| cpu / (bytes as f64 / GIB as f64);
    let server_mask = rustix::thread::sched_getaffinity(rustix::process::Pid::from_raw(server as i32))
        .map_err(|e| format!("the server's CPU mask: {e}"))?;
    let mine = rustix::thread::sched_getaffinity(None).map_err(|e| e.to_string())?;
    let mut r = Ok(());
    for (label, peer_cpu) in [("cross core", 1usize), ("same core", 0)] {
        let (raw_mbps, raw_cpu) = match bench::raw_sendfile_placed(big, bytes, 0, peer_cpu) {
            Ok(m) => m,
            Err(e) => {
                r = Err(e);
                break;
            }
        };
        res.add("0", "raw", &format!("TCP stream of the file, pinned {label}"), "throughput", "MB/s", raw_mbps);
        res.add("0", "raw", &format!("TCP receive of the file, pinned {label}"), "receiver CPU", "s/GiB", per(raw_cpu));
        if peer_cpu == 1 {
            // The receive buffers here are page-aligned; this one is where
            // `malloc` puts a fresh 1 MiB block, to show what that costs.
            match bench::raw_sendfile_placed_skewed(big, bytes, 0, peer_cpu) {
                Ok((_, cpu)) => res.add(
                    "0",
                    "raw",
                    "  same, buffer 16 B past a page, pinned cross core",
                    "receiver CPU",
                    "s/GiB",
                    per(cpu),
                ),
                Err(e) => {
                    r = Err(e);
                    break;
                }
            }
        }
        // The worker inherits this thread's mask; the server's connection
        // threads, its accepting thread's.
        let m = bench::pin(None, 0)
            .and_then(|()| bench::pin(Some(server), peer_cpu))
            .and_then(|()| read_big(ferry, bytes, 0));
        let m = match m {
            Ok(m) => m,
            Err(e) => {
                r = Err(e);
                break;
            }
        };
        let mbps = k(&m.kv, "bytes") / k(&m.kv, "secs") / 1e6;
        res.add("0", "ferry", &format!("1 MiB reads of the file, pinned {label}"), "throughput", "MB/s", mbps);
        res.add("0", "ferry", &format!("1 MiB reads / raw stream, pinned {label}"), "ratio", "x", mbps / raw_mbps);
        res.add(
            "0",
            "ferry",
            &format!("1 MiB reads, client CPU, pinned {label}"),
            "client CPU",
            "s/GiB",
            per(m.client_cpu),
        );
        res.add(
            "0",
            "ferry",
            &format!("client CPU / raw receiver, pinned {label}"),
            "CPU ratio",
            "x",
            m.client_cpu / raw_cpu,
        );
        if peer_cpu == 1 {
            // A program's own buffer, where `malloc` puts it: the library
            // receives into an aligned buffer of its own and copies over.
            match read_big(ferry, bytes, 16) {
                Ok(m) => res.add(
                    "0",
                    "ferry",
                    "  same, buffer 16 B past a page, pinned cross core",
                    "client CPU",
                    "s/GiB",
                    per(m.client_cpu),
                ),
                Err(e) => {
                    r = Err(e);
                    break;
                }
            }
        }
    }
    rustix::thread::sched_setaffinity(None, &mine).map_err(|e| e.to_string())?;
    bench::set_mask(Some(server), &server_mask)?;
    r
}

/// Runs `f` with the system's client (this thread, which the worker
/// inherits, and any client-side daemon) on CPU 0 and every thread of its
/// server on CPU 1, as experiment 0 places the raw receiver and ferry;
/// then puts every mask back. Client CPU per byte differs 2-3 x between
/// placements here (the receive copy across CPUs costs more), so unpinned
/// figures of two systems compare where the scheduler put them, not the
/// clients. `None` on a machine with one CPU.
fn placed<T>(sys: &System, f: impl FnOnce() -> Result<T, String>) -> Result<Option<T>, String> {
    let mine = rustix::thread::sched_getaffinity(None).map_err(|e| e.to_string())?;
    if mine.count() < 2 {
        return Ok(None);
    }
    let mask_of = |pid: u32| {
        rustix::thread::sched_getaffinity(rustix::process::Pid::from_raw(pid as i32))
            .map_err(|e| format!("the CPU mask of {pid}: {e}"))
    };
    let mut saved = Vec::new();
    for &p in sys.server.iter().chain(&sys.client_side) {
        saved.push((p, mask_of(p)?));
    }
    let pin_all = || -> Result<(), String> {
        bench::pin(None, 0)?;
        for &p in &sys.client_side {
            bench::pin(Some(p), 0)?;
        }
        for &p in &sys.server {
            bench::pin(Some(p), 1)?;
        }
        Ok(())
    };
    let r = pin_all().and_then(|()| f());
    rustix::thread::sched_setaffinity(None, &mine).map_err(|e| e.to_string())?;
    for (p, m) in &saved {
        bench::set_mask(Some(*p), m)?;
    }
    r.map(Some)
}

/// Ferry's worker reading `bytes` of the test file in 1 MiB reads into a
/// buffer `skew` bytes past a page; an error unless it read them all.
fn read_big(ferry: &System, bytes: u64, skew: usize) -> Result<Measured, String> {
    let m = measure(ferry, &["reads", "/big.dat", &MIB.to_string(), &bytes.to_string(), &skew.to_string()])?;
    match k(&m.kv, "bytes") as u64 {
        b if b == bytes => Ok(m),
        b => Err(format!("ferry read {b} bytes of /big.dat (buffer {skew} B past a page), expected {bytes}")),
    }
}

fn unix_stream(bytes: u64) -> Result<f64, String> {
    let dir = std::env::temp_dir().join(format!("ferry-compare-unix-{}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    let l = std::os::unix::net::UnixListener::bind(&dir).map_err(|e| e.to_string())?;
    let child = Command::new(exe()?)
        .args(["compare", "--worker", "unix-source", &dir.to_string_lossy(), &bytes.to_string()])
        .spawn()
        .map_err(|e| e.to_string())?;
    let _peer = bench::Reap(child);
    let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&dir);
    let mut buf = vec![0u8; MIB as usize];
    let t = Instant::now();
    let mut got = 0u64;
    while got < bytes {
        let n = s.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("raw Unix stream ended early".into());
        }
        got += n as u64;
    }
    Ok(bytes as f64 / t.elapsed().as_secs_f64() / 1e6)
}

fn memcpy() -> f64 {
    let src = vec![0x5au8; 64 * MIB as usize];
    let mut dst = vec![0u8; 64 * MIB as usize];
    dst.copy_from_slice(&src);
    let reps = 8;
    let t = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(&mut dst).copy_from_slice(std::hint::black_box(&src));
    }
    (reps as u64 * 64 * MIB) as f64 / t.elapsed().as_secs_f64() / 1e6
}

/// Which run of which experiment is going, on stderr: a full comparison
/// takes many minutes, its tables come only at the end.
fn progress(what: &str, run: usize, runs: usize) {
    eprintln!("ferry compare: {what}, run {}/{runs}", run + 1);
}
