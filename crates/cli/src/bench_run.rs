//! `ferry bench --run`: unmodified `dd` under `ferry run` against the
//! client library's own throughput, in the same run; context switches per
//! GiB beside each figure; and the start-up cost `ferry run` adds.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use super::{ferry_read, ferry_write, mbps, start_pinned, Series};

/// One `dd` under `ferry run`: MB/s and context switches per GiB (from the
/// child's rusage, voluntary + involuntary).
fn dd(port: u16, args: &[String], bytes: u64) -> Result<(f64, f64), String> {
    let t = Instant::now();
    let child = Command::new(super::exe()?)
        .args(["run", "--mount", &format!("/remote=ferry://127.0.0.1:{port}/"), "--", "dd"])
        .args(args)
        .env("FERRY_TOKEN", "unused")
        // Beside the library over TCP: the preload library's own path, not
        // the server's descriptors (`--same-host` measures those).
        .env("FERRY_SAME_HOST", "0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start dd: {e}"))?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 fills it for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for the child we just spawned, with valid out-pointers.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let elapsed = t.elapsed();
    if r != pid || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        let mut err = String::new();
        if let Some(mut e) = child.stderr {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        return Err(format!("dd {} failed: {}", args.join(" "), err.trim()));
    }
    let switches = (ru.ru_nvcsw + ru.ru_nivcsw) as f64;
    Ok((mbps(bytes, elapsed), switches * (1u64 << 30) as f64 / bytes as f64))
}

/// Median over runs of `a[i] / b[i]`.
fn paired(a: &Series, b: &Series) -> f64 {
    let mut r = Series::new("ratio", "");
    r.values = a.values.iter().zip(&b.values).map(|(x, y)| x / y).collect();
    r.median()
}

/// Median milliseconds of `n` runs of a command.
fn startup(cmd: &mut dyn FnMut() -> Command, n: usize) -> Result<f64, String> {
    let mut s = Series::new("startup", "ms");
    for _ in 0..n {
        let t = Instant::now();
        let st = cmd().status().map_err(|e| e.to_string())?;
        if !st.success() {
            return Err(format!("start-up probe failed: {st}"));
        }
        s.values.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(s.median())
}

pub fn run(runs: usize, bytes: u64, quick: bool, dir: &Path) -> Result<(), String> {
    let lib = Path::new(&super::exe()?).with_file_name("libferry_preload.so");
    if !lib.is_file() {
        println!("ferry bench --run: skipped: {} not found (`cargo build --release` builds it)", lib.display());
        return Ok(());
    }
    let (server, port, client, _) = start_pinned(dir)?;
    let mut lib_read = Series::new("library read, 1 MiB requests", "MB/s");
    let mut lib_write = Series::new("library write, 1 MiB requests", "MB/s");
    let sizes: [(usize, &str); 3] = [(1 << 20, "1M"), (64 << 10, "64k"), (4 << 10, "4k")];
    let mut reads: Vec<(Series, Series)> = Vec::new();
    let mut writes: Vec<(Series, Series)> = Vec::new();
    for (_, name) in sizes {
        let label =
            |what: &str| -> &'static str { Box::leak(format!("ferry run dd {what} bs={name}").into_boxed_str()) };
        reads.push((Series::new(label("read"), "MB/s"), Series::new("  context switches per GiB", "")));
        writes.push((Series::new(label("write"), "MB/s"), Series::new("  context switches per GiB", "")));
    }
    for run in 0..runs {
        crate::bench::progress("ferry run: dd at 1M, 64k, 4k, and the library", run, runs);
        lib_write.values.push(ferry_write(&client, bytes, 1 << 20)?);
        lib_read.values.push(ferry_read(&client, "/bench.dat", bytes, 1 << 20)?);
        for (i, (bs, name)) in sizes.iter().enumerate() {
            let count = (bytes / *bs as u64).to_string();
            let (r, c) =
                dd(port, &["if=/remote/bench.dat".into(), "of=/dev/null".into(), format!("bs={name}")], bytes)?;
            reads[i].0.values.push(r);
            reads[i].1.values.push(c);
            let (w, c) = dd(
                port,
                &[
                    "if=/dev/zero".into(),
                    "of=/remote/bench-dd.dat".into(),
                    format!("bs={name}"),
                    format!("count={count}"),
                ],
                bytes,
            )?;
            writes[i].0.values.push(w);
            writes[i].1.values.push(c);
        }
    }
    let n = if quick { 3 } else { 30 };
    let plain = startup(&mut || Command::new("true"), n)?;
    let preloaded = startup(
        &mut || {
            let mut c = Command::new("true");
            c.env("LD_PRELOAD", &lib).env("FERRY_MOUNTS", format!("/remote=ferry://127.0.0.1:{port}/"));
            c
        },
        n,
    )?;
    let via_run = startup(
        &mut || {
            let mut c = Command::new(super::exe().unwrap_or_default());
            c.args(["run", "--mount", &format!("/remote=ferry://127.0.0.1:{port}/"), "--", "true"]);
            c
        },
        n,
    )?;
    drop(server);
    let _ = std::fs::remove_file(dir.join("bench-dd.dat"));
    println!(
        "ferry bench --run: {} MiB, {} runs, medians (min..max); dd under `ferry run` on CPU 0, server on CPU 1",
        bytes >> 20,
        runs
    );
    println!("{:<36} {:>10} {:>22} {:>22}", "figure", "median", "min..max", "ratio");
    let line = |s: &Series, ratio: String| {
        println!("{:<36} {:>7.1} {:<4} {:>10.1}..{:<10.1} {ratio}", s.name, s.median(), s.unit, s.min(), s.max());
    };
    line(&lib_read, String::new());
    line(&lib_write, String::new());
    // Ratios are medians of per-run ratios: each dd ran right after its
    // library run, so the pair saw the same state of this noisy VM.
    for (set, lib) in [(&reads, &lib_read), (&writes, &lib_write)] {
        for (i, (tp, cs)) in set.iter().enumerate() {
            let mut ratio = format!("{:.0} % of library", 100.0 * paired(tp, lib));
            if i > 0 {
                ratio += &format!(", {:.0} % of bs=1M", 100.0 * paired(tp, &set[0].0));
            }
            line(tp, ratio);
            line(cs, String::new());
        }
    }
    println!("{:<36} {:>7.2} ms", "start-up: true", plain);
    println!("{:<36} {:>7.2} ms  (+{:.2} ms)", "start-up: true with the library", preloaded, preloaded - plain);
    println!("{:<36} {:>7.2} ms  (+{:.2} ms)", "start-up: ferry run -- true", via_run, via_run - plain);
    Ok(())
}
