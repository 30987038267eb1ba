//! Experiment 10 (leases): real programs — `git clone`, `git status`,
//! `find -ls`, `tar c`, `tar x`, `make -j2` — on the default mount, on a
//! mount with its caches on (`--cache` and a policy caching everything),
//! under `ferry run` and on the export itself.
//!
//! Each program is a real process timed from spawn to exit. The tree is a
//! generated repository (text files and a small C project) committed with
//! git on the local disk, so every place clones the same thing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::report::{median, Results};

/// Where the programs run: the directory they see, and the command that
/// runs them there (empty for a mount or a local directory).
pub(super) struct Place {
    pub(super) name: String,
    pub(super) root: PathBuf,
    pub(super) prefix: Vec<String>,
    pub(super) env: Vec<(String, String)>,
    /// The directory on this host `root` stands for, where this process
    /// cannot see `root` itself (a `ferry run` prefix).
    pub(super) local_root: Option<PathBuf>,
    pub(super) note: String,
    /// Where the mount answers `GET /metrics` (the default mount's, for
    /// the floor).
    pub(super) metrics: Option<String>,
}

/// The programs, in the order they run on each place; each uses what the
/// one before left (`git status` the clone, `make again` the build).
pub(super) const PROGRAMS: [&str; 7] =
    ["git clone", "git status", "find -ls", "tar c", "tar x", "make -j2", "make again"];

/// The repository and a tarball of its files, made once on the local disk.
pub(super) struct Source {
    repo: PathBuf,
    tar: PathBuf,
    files: usize,
}

fn sh(what: &str, cmd: &mut Command) -> Result<(), String> {
    let o = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).output();
    match o {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!("{what}: {} ({})", o.status, String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

/// `dirs` directories of `files` text files (1–4 KiB, deterministic), a C
/// project of `units` files sharing one header, committed with git.
pub(super) fn make_source(state: &Path, quick: bool) -> Result<Source, String> {
    let (dirs, files, units) = if quick { (2, 10, 3) } else { (17, 100, 16) };
    let repo = state.join("programs-src");
    let e = |e: std::io::Error| e.to_string();
    let mut x: u32 = 12345;
    for d in 0..dirs {
        let dir = repo.join(format!("doc{d:02}"));
        std::fs::create_dir_all(&dir).map_err(e)?;
        for i in 0..files {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            let lines = 16 + (x >> 16) % 48;
            let text: String = (0..lines).map(|l| format!("line {l} of file {i} in {d}: {x:08x}\n")).collect();
            std::fs::write(dir.join(format!("f{i:03}.txt")), text).map_err(e)?;
        }
    }
    let proj = repo.join("proj");
    std::fs::create_dir_all(&proj).map_err(e)?;
    std::fs::write(proj.join("common.h"), "#define SCALE 1\nint unit(int);\n").map_err(e)?;
    let mut calls = String::new();
    for u in 0..units {
        let body = format!(
            "#include \"common.h\"\nstatic int table[64];\nint unit{u}(int x) {{ for (int i = 0; i < 64; i++) \
             table[i] = i * x * SCALE; return table[{u} % 64]; }}\n"
        );
        std::fs::write(proj.join(format!("u{u:02}.c")), body).map_err(e)?;
        calls.push_str(&format!("int unit{u}(int); s += unit{u}(2);\n"));
    }
    let main = format!("#include <stdio.h>\n#include \"common.h\"\nint main(void) {{ int s = 0;\n{calls}printf(\"%d\\n\", s); return 0; }}\n");
    std::fs::write(proj.join("main.c"), main).map_err(e)?;
    std::fs::write(
        proj.join("Makefile"),
        "SRCS := $(wildcard *.c)\nprog: $(SRCS:.c=.o)\n\tcc -o $@ $^\n%.o: %.c common.h\n\tcc -O0 -c -o $@ $<\n",
    )
    .map_err(e)?;
    let git = |args: &[&str]| {
        sh(
            &format!("git {}", args.join(" ")),
            Command::new("git")
                .arg("-C")
                .arg(&repo)
                .args(["-c", "user.name=ferry", "-c", "user.email=ferry@localhost"])
                .args(args),
        )
    };
    git(&["init", "-q"])?;
    git(&["add", "-A"])?;
    git(&["commit", "-q", "-m", "the tree ferry compare clones"])?;
    let tar = state.join("programs-src.tar");
    sh(
        "tar c",
        Command::new("tar").arg("cf").arg(&tar).arg("--exclude=.git").arg("-C").arg(state).arg("programs-src"),
    )?;
    Ok(Source { repo, tar, files: dirs * files + units + 3 })
}

/// Warm `git status` runs timed per place and run (their median counts).
const WARM_STATUSES: usize = 9;

/// Runs `argv` in `place` (through its prefix), timed; fails on a non-zero
/// exit or past `limit`.
fn timed(place: &Place, argv: &[String], limit: Duration) -> Result<f64, String> {
    let (prog, args) = match place.prefix.split_first() {
        Some((p, rest)) => (p.clone(), rest.iter().chain(argv).cloned().collect::<Vec<_>>()),
        None => (argv[0].clone(), argv[1..].to_vec()),
    };
    let t = Instant::now();
    let mut child = Command::new(&prog)
        .args(&args)
        .envs(place.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{prog}: {e}"))?;
    // Waited for, not polled: a poll each millisecond put up to a
    // millisecond on a 10 ms `git status`. A watchdog ends a program that
    // runs past the limit (before it is reaped, so its pid is still its).
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let pid = child.id() as i32;
    let watchdog = std::thread::spawn(move || {
        let late = matches!(finished.recv_timeout(limit), Err(std::sync::mpsc::RecvTimeoutError::Timeout));
        if late {
            // A pid this process spawned and has not reaped yet (the
            // waiter tells this thread once it has).
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        late
    });
    let st = child.wait().map_err(|e| e.to_string());
    let secs = t.elapsed().as_secs_f64();
    let _ = done.send(());
    let late = watchdog.join().unwrap_or(false);
    let st = st?;
    if late {
        return Err(format!("{}: {} ran past {} s", place.name, argv.join(" "), limit.as_secs()));
    }
    if !st.success() {
        // Read only on failure, as before: read first, a success would wait
        // for anything the program left running with its stderr open.
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        return Err(format!("{}: {} ({st}): {}", place.name, argv.join(" "), err.trim()));
    }
    Ok(secs * 1000.0)
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// One run of every program in one place; figures in ms, by program.
fn run_programs(place: &Place, src: &Source, run: usize) -> Result<Vec<(&'static str, f64)>, String> {
    run_programs_hooked(place, src, run, &mut |_, _| {})
}

/// `run_programs`, calling `hook(program, false)` just before each measured
/// program starts and `hook(program, true)` once it ended.
pub(super) fn run_programs_hooked(
    place: &Place,
    src: &Source,
    run: usize,
    hook: &mut dyn FnMut(&str, bool),
) -> Result<Vec<(&'static str, f64)>, String> {
    let limit = Duration::from_secs(600);
    let clone = place.root.join(format!("clone{run}"));
    let xdir = place.root.join(format!("x{run}"));
    let proj = clone.join("proj");
    let argv = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let mut out = Vec::new();
    for prog in PROGRAMS {
        let cmd = match prog {
            "git clone" => argv(&["git", "clone", "-q", "--no-hardlinks", &s(&src.repo), &s(&clone)]),
            "git status" => {
                // Warm: the clone's first status refreshes the index. A
                // second after the clone, so the index it writes is newer
                // than every file: else files as new as the index stay
                // "racily clean" and git reads each one again at every
                // status, in some runs and places and not others (local
                // 9 or 43 ms, the mount 19 or 96, in one run).
                std::thread::sleep(Duration::from_millis(1100));
                timed(place, &argv(&["git", "-C", &s(&clone), "status", "--porcelain"]), limit)?;
                argv(&["git", "-C", &s(&clone), "status", "--porcelain"])
            }
            "find -ls" => argv(&["find", &s(&clone), "-ls"]),
            // Through a pipe: GNU tar writing to /dev/null reads no data.
            "tar c" => argv(&["sh", "-c", &format!("tar cf - -C '{}' clone{run} | cat >/dev/null", s(&place.root))]),
            "tar x" => {
                argv(&["sh", "-c", &format!("mkdir '{}' && tar xf '{}' -C '{}'", s(&xdir), s(&src.tar), s(&xdir))])
            }
            "make -j2" => argv(&["make", "-s", "-j2", "-C", &s(&proj)]),
            "make again" => {
                let h = "#define SCALE 2\nint unit(int);\n";
                timed(place, &argv(&["sh", "-c", &format!("printf '{h}' > '{}/common.h'", s(&proj))]), limit)?;
                argv(&["make", "-s", "-j2", "-C", &s(&proj)])
            }
            _ => unreachable!("every program has its command"),
        };
        // A warm status takes ~10 ms, where this machine's noise is a few:
        // the median of several (each timed alone; the hook sees the last).
        let times = if prog == "git status" { WARM_STATUSES } else { 1 };
        let mut ms = Vec::new();
        for i in 0..times {
            if i + 1 == times {
                hook(prog, false);
            }
            ms.push(timed(place, &cmd, limit)?);
        }
        hook(prog, true);
        out.push((prog, super::report::median(&ms)));
    }
    // What the programs made is what they should have made.
    let count =
        Command::new("find").arg(place.local_view(&xdir)).args(["-type", "f"]).output().map_err(|e| e.to_string())?;
    let n = String::from_utf8_lossy(&count.stdout).lines().count();
    if n != src.files {
        return Err(format!("{}: tar x made {n} files, expected {}", place.name, src.files));
    }
    for p in [&clone, &xdir] {
        let _ = std::fs::remove_dir_all(place.local_view(p));
    }
    Ok(out)
}

impl Place {
    /// The path this process uses for a path the programs see (under
    /// `ferry run` the prefix exists only for them: go through the local
    /// directory it stands for).
    fn local_view(&self, p: &Path) -> PathBuf {
        match &self.local_root {
            Some(local) => local.join(p.strip_prefix(&self.root).unwrap_or(p)),
            None => p.to_path_buf(),
        }
    }
}

pub(super) fn exp_programs(
    src: &Source,
    places: &[Place],
    runs: usize,
    res: &mut Results,
    state: &Path,
    addr: &str,
) -> Result<(), String> {
    eprintln!("ferry compare: experiment 10, real programs");
    let mut errors = Vec::new();
    for run in 0..runs {
        eprintln!("ferry compare: experiment 10, run {}/{runs}", run + 1);
        let n = places.len();
        let mut this_run: Vec<(&str, Vec<(&'static str, f64)>)> = Vec::new();
        for i in 0..n {
            let place = &places[(i + run) % n];
            match run_programs(place, src, run) {
                Ok(figs) => {
                    for &(prog, ms) in &figs {
                        res.add("10", &place.name, prog, "elapsed", "ms", ms);
                    }
                    this_run.push((&place.name, figs));
                }
                Err(e) => errors.push(e),
            }
        }
        add_pairs(res, &this_run);
    }
    if let Some((fuse, metrics)) = places.iter().find_map(|p| Some((p, p.metrics.as_deref()?))) {
        if let Err(e) = super::floor::exp_floor(src, fuse, metrics, state, addr, res) {
            errors.push(e);
        }
    }
    match errors.first() {
        None => Ok(()),
        Some(e) => Err(format!("experiment 10: {} failed; first: {e}", errors.len())),
    }
}

/// The two targets' ratios taken within one run, where both places ran
/// minutes apart rather than a run apart: a difference that is the
/// machine's drift moves the ratios of medians from run to run, and shows
/// here as a spread across 1.
const PAIRS: [(&str, &str); 2] = [("ferry-fuse-cache", "ferry-fuse"), ("ferry-fuse", "local")];

fn pair_name(a: &str, b: &str) -> String {
    format!("{a} / {b}")
}

fn add_pairs(res: &mut Results, run: &[(&str, Vec<(&'static str, f64)>)]) {
    let figs = |name: &str| run.iter().find(|(n, _)| *n == name).map(|(_, f)| f);
    for (a, b) in PAIRS {
        let (Some(fa), Some(fb)) = (figs(a), figs(b)) else { continue };
        for (&(prog, x), &(_, y)) in fa.iter().zip(fb) {
            res.add("10", &pair_name(a, b), prog, "ratio in one run", "x", x / y);
        }
    }
}

/// The median of the ratios within a run, with their spread.
fn paired(res: &Results, a: &str, b: &str, prog: &str) -> Option<(f64, f64, f64)> {
    let v = res.get("10", &pair_name(a, b), prog, "ratio in one run")?;
    let (lo, hi) = super::report::spread(v);
    Some((median(v), lo, hi))
}

pub(super) fn print_programs(res: &Results, places: &[Place], runs: usize) {
    if !res.order.iter().any(|(e, ..)| e == "10") {
        return;
    }
    println!(
        "\n10. Real programs (git, find, tar, make), ms, median of {runs} (git status: each the median of \
         {WARM_STATUSES} warm runs); ratio to local in ()"
    );
    for p in places {
        println!("    {:<16} {}", p.name, p.note);
    }
    print!("{:<12}", "program");
    for p in places {
        print!(" {:>22}", p.name);
    }
    println!();
    let med = |sys: &str, prog: &str| res.get("10", sys, prog, "elapsed").map(median);
    let mut worst: Vec<(String, f64)> = Vec::new();
    for prog in PROGRAMS {
        print!("{prog:<12}");
        let local = med("local", prog);
        for p in places {
            match (med(&p.name, prog), local) {
                (Some(v), Some(l)) if p.name != "local" => {
                    print!(" {:>13.1} ({:>5.2} x)", v, v / l);
                    match worst.iter_mut().find(|(n, _)| *n == p.name) {
                        Some(w) => w.1 = w.1.max(v / l),
                        None => worst.push((p.name.clone(), v / l)),
                    }
                }
                (Some(v), _) => print!(" {v:>22.1}"),
                (None, _) => print!(" {:>22}", "-"),
            }
        }
        println!();
    }
    let ratio = |a: &str, b: &str, prog: &str| Some(med(a, prog)? / med(b, prog)?);
    if let Some(r) = ratio("ferry-fuse", "local", "git status") {
        println!("target: git status on the default mount <= 1.5 x local: {r:.2} x");
    }
    if let Some((_, w)) = worst.iter().find(|(n, _)| n == "ferry-fuse") {
        println!("target: every program on the default mount <= 1.5 x local: worst {w:.2} x");
    }
    let cached: Vec<f64> = PROGRAMS.iter().filter_map(|p| ratio("ferry-fuse-cache", "ferry-fuse", p)).collect();
    if let Some(w) = cached.iter().copied().reduce(f64::max) {
        println!("target: caches on <= 1.0 x caches off, every program: worst {w:.2} x");
    }
    if runs > 1 {
        println!("ratios within each run, median (min..max) of {runs}: a spread across 1 is this machine's noise");
        for (a, b) in PAIRS {
            let cells: Vec<String> = PROGRAMS
                .iter()
                .filter_map(|p| paired(res, a, b, p).map(|(m, lo, hi)| format!("{p} {m:.2} ({lo:.2}..{hi:.2})")))
                .collect();
            if !cells.is_empty() {
                println!("  {}: {}", pair_name(a, b), cells.join(", "));
            }
        }
    }
    super::floor::print_floor(res);
}
