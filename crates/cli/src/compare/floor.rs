//! Experiment 10's floor: what the default mount cannot beat with the
//! requests each program makes of it.
//!
//! Each program runs once more on the default mount under `perf stat -e
//! fuse:fuse_request_send` (the kernel's count of FUSE requests made in
//! the program's processes; requests the kernel makes on its own, such as
//! writeback from a kernel thread, are not counted, so the floor is low if
//! anything), and the mount's metrics count what it asked the server
//! meanwhile. In the same run, one FUSE request to the null file system
//! (`ferry_fuse::NullFs`, nothing behind it) is timed with `stat` of one
//! file many times over, against the same `stat` on the local disk, and a
//! server round trip with `Ping`. A program's floor on this design is its
//! local time plus its FUSE requests at the null file system's extra cost
//! each, plus its `stat` calls (counted with the `syscalls:sys_enter_*stat*`
//! tracepoints) at what a `stat` answered from the kernel's cache of a FUSE
//! file costs beyond a local one (the null file system with a minute's
//! timeouts: no request); plus, for the second figure, its server requests
//! at a round trip each (a floor only for a mount that asks the server
//! that often). Stats of local paths (`/etc/gitconfig`) are counted too, a
//! few per program.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::programs::{run_programs_hooked, Place, Source, PROGRAMS};
use super::report::{median, Results};

const PERF_EVENT: &str = "fuse:fuse_request_send";
/// The system calls that look at a path's attributes.
const STAT_EVENTS: [&str; 4] = [
    "syscalls:sys_enter_newfstatat",
    "syscalls:sys_enter_statx",
    "syscalls:sys_enter_newlstat",
    "syscalls:sys_enter_newstat",
];
/// `stat` calls per timed invocation (the difference with a single one is
/// their cost).
const STATS: usize = 2000;

/// `perf stat`'s count of FUSE requests in the file it wrote.
fn perf_count(out: &Path) -> Result<f64, String> {
    perf_count_of(out, PERF_EVENT)
}

/// `perf stat`'s count of the program's `stat` calls.
fn stat_count(out: &Path) -> Result<f64, String> {
    STAT_EVENTS.iter().map(|e| perf_count_of(out, e)).sum()
}

fn perf_count_of(out: &Path, event: &str) -> Result<f64, String> {
    let text = std::fs::read_to_string(out).map_err(|e| format!("{}: {e}", out.display()))?;
    text.lines()
        .filter(|l| l.split(',').any(|f| f == event))
        .find_map(|l| l.split(',').next()?.trim().parse::<f64>().ok())
        .ok_or_else(|| format!("perf wrote no count of {event}: {}", text.trim()))
}

/// Requests the mount made of its server so far (its metrics).
fn server_requests(metrics: &str) -> Result<f64, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(metrics).map_err(|e| format!("mount metrics {metrics}: {e}"))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").map_err(|e| e.to_string())?;
    let mut body = String::new();
    s.read_to_string(&mut body).map_err(|e| e.to_string())?;
    let n: f64 = body
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("_requests_total{op="))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    Ok(n)
}

fn perf_prefix(out: &Path) -> Vec<String> {
    let events = std::iter::once(PERF_EVENT).chain(STAT_EVENTS).flat_map(|e| ["-e", e]);
    ["perf", "stat", "-x,"]
        .into_iter()
        .chain(events)
        .chain(["-o"])
        .map(|s| s.to_string())
        .chain([out.to_string_lossy().into_owned(), "--".into()])
        .collect()
}

/// FUSE requests of `stat` of `file` `n` times in one process.
fn stat_run(file: &Path, n: usize, out: &Path) -> Result<f64, String> {
    let st = Command::new("perf")
        .args(&perf_prefix(out)[1..])
        .args(["stat", "-c", "%s"])
        .args(std::iter::repeat_n(file, n))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("perf: {e}"))?;
    if !st.success() {
        return Err(format!("stat of {} under perf: {st}", file.display()));
    }
    perf_count(out)
}

/// The cost of one `stat` of `file`, µs, timed in this process (a
/// difference of two process runs was mostly the noise of their starts:
/// a local stat came out negative), and the FUSE requests each made
/// (counted by `perf` over `stat` runs): medians of `reps`.
fn per_stat(file: &Path, out: &Path, reps: usize) -> Result<(f64, f64), String> {
    let (mut cost, mut reqs) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let r1 = stat_run(file, 1, out)?;
        let rn = stat_run(file, 1 + STATS, out)?;
        reqs.push((rn - r1) / STATS as f64);
        let t = Instant::now();
        for _ in 0..STATS * 5 {
            std::fs::symlink_metadata(file).map_err(|e| format!("stat {}: {e}", file.display()))?;
        }
        cost.push(t.elapsed().as_secs_f64() * 1e6 / (STATS * 5) as f64);
    }
    Ok((median(&cost), median(&reqs)))
}

/// Counts, per program, the default mount's FUSE and server requests, and
/// measures what one of each costs; figures in `res` under experiment 10.
pub(super) fn exp_floor(
    src: &Source,
    fuse: &Place,
    metrics: &str,
    state: &Path,
    addr: &str,
    res: &mut Results,
) -> Result<(), String> {
    eprintln!("ferry compare: experiment 10, FUSE requests per program and the cost of one");
    let out = state.join("floor-perf.csv");
    let probe = Command::new("perf").args(&perf_prefix(&out)[1..]).arg("true").stderr(Stdio::piped()).output();
    match probe {
        Ok(o) if o.status.success() && perf_count(&out).is_ok() && stat_count(&out).is_ok() => {}
        Ok(o) => return Err(format!("floor: perf cannot count {PERF_EVENT}: {}", String::from_utf8_lossy(&o.stderr))),
        Err(e) => return Err(format!("floor: perf: {e} (the floor needs perf and the fuse tracepoints)")),
    }
    let counting = Place {
        name: fuse.name.clone(),
        root: fuse.root.clone(),
        prefix: perf_prefix(&out),
        env: fuse.env.clone(),
        local_root: fuse.local_root.clone(),
        note: fuse.note.clone(),
        metrics: None,
    };
    let mut before = 0.0;
    let mut failed = None;
    let mut hook = |prog: &str, done: bool| {
        let r = (|| -> Result<(), String> {
            if !done {
                before = server_requests(metrics)?;
                return Ok(());
            }
            let server = server_requests(metrics)? - before;
            res.add("10", "floor", prog, "FUSE requests", "n", perf_count(&out)?);
            res.add("10", "floor", prog, "stat calls", "n", stat_count(&out)?);
            res.add("10", "floor", prog, "server requests", "n", server);
            Ok(())
        })();
        if let Err(e) = r {
            failed.get_or_insert(e);
        }
    };
    run_programs_hooked(&counting, src, 1000, &mut hook)?;
    if let Some(e) = failed {
        return Err(format!("floor: {e}"));
    }
    // One FUSE request with nothing behind it, and the same call local.
    let mp = state.join("floor-null");
    std::fs::create_dir_all(&mp).map_err(|e| e.to_string())?;
    let null = ferry_fuse::spawn_null(&mp, 4096, Duration::ZERO, 4, false, true)
        .map_err(|e| format!("floor: null FUSE mount on {}: {e}", mp.display()))?;
    let (null_stat, null_reqs) = per_stat(&mp.join(ferry_fuse::NULL_FILE), &out, 3)?;
    drop(null);
    // The same `stat` answered from the kernel's cache: no request.
    let null = ferry_fuse::spawn_null(&mp, 4096, Duration::from_secs(60), 4, false, true)
        .map_err(|e| format!("floor: null FUSE mount on {}: {e}", mp.display()))?;
    let (cached_stat, cached_reqs) = per_stat(&mp.join(ferry_fuse::NULL_FILE), &out, 3)?;
    drop(null);
    let local_file = state.join("floor-local");
    std::fs::write(&local_file, b"x").map_err(|e| e.to_string())?;
    let (local_stat, _) = per_stat(&local_file, &out, 3)?;
    if null_reqs < 0.5 {
        return Err(format!("floor: a stat on the null FUSE mount made {null_reqs:.2} FUSE requests"));
    }
    if cached_reqs > 0.01 {
        return Err(format!("floor: a stat on the null FUSE mount kept a minute made {cached_reqs:.2} FUSE requests"));
    }
    let per_request = ((null_stat - local_stat) / null_reqs).max(0.0);
    let c = ferry_client::Client::connect(addr, &ferry_client::Options::default()).map_err(|e| e.to_string())?;
    let mut rtt = Vec::new();
    for _ in 0..2000 {
        let t = Instant::now();
        c.ping().map_err(|e| e.to_string())?;
        rtt.push(t.elapsed().as_secs_f64() * 1e6);
    }
    res.add("10", "floor", "one FUSE request, null file system", "latency", "µs", per_request);
    res.add("10", "floor", "FUSE requests per stat, null", "n", "n", null_reqs);
    res.add("10", "floor", "stat, local", "latency", "µs", local_stat);
    res.add("10", "floor", "stat from the kernel's cache, null", "latency", "µs", (cached_stat - local_stat).max(0.0));
    res.add("10", "floor", "server round trip (Ping)", "latency", "µs", median(&rtt));
    Ok(())
}

pub(super) fn print_floor(res: &Results) {
    let one = |p: &str, m: &str| res.get("10", "floor", p, m).map(median);
    let (Some(req), Some(rtt)) =
        (one("one FUSE request, null file system", "latency"), one("server round trip (Ping)", "latency"))
    else {
        return;
    };
    let cached = one("stat from the kernel's cache, null", "latency").unwrap_or(0.0);
    println!(
        "floor of the default mount: one FUSE request {req:.1} µs beyond a local call (null FUSE file system, {:.1} \
         requests per stat; a local stat {:.1} µs), a stat from the kernel's cache {cached:.2} µs beyond a local \
         one, a server round trip {rtt:.1} µs",
        one("FUSE requests per stat, null", "n").unwrap_or(f64::NAN),
        one("stat, local", "latency").unwrap_or(f64::NAN),
    );
    println!(
        "{:<12} {:>9} {:>9} {:>9} {:>10} {:>20} {:>20} {:>16}",
        "program", "FUSE req", "stats", "server rq", "local ms", "floor, FUSE (x)", "+ round trips (x)", "measured (x)"
    );
    for prog in PROGRAMS {
        let med = |sys: &str| res.get("10", sys, prog, "elapsed").map(median);
        let (Some(n), Some(s), Some(local)) = (one(prog, "FUSE requests"), one(prog, "server requests"), med("local"))
        else {
            continue;
        };
        let stats = one(prog, "stat calls").unwrap_or(0.0);
        let fuse = local + n * req / 1e3 + stats * cached / 1e3;
        let server = fuse + s * rtt / 1e3;
        let measured = med("ferry-fuse").map_or("-".to_string(), |m| format!("{m:.1} ({:.2} x)", m / local));
        println!(
            "{prog:<12} {n:>9.0} {stats:>9.0} {s:>9.0} {local:>10.1} {:>20} {:>20} {measured:>16}",
            format!("{fuse:.1} ({:.2} x)", fuse / local),
            format!("{server:.1} ({:.2} x)", server / local),
        );
    }
}
