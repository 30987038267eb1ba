//! Experiment 11 (leases): what a lease break costs the client whose
//! change causes it, in round trips, and where that time goes.
//!
//! A client changes a file another client holds a lease on (the server
//! breaks it and waits for the holder's return) and a file nobody holds,
//! in turn, with a `Ping` each round for the round trip. The experiment
//! runs a server of its own with `--metrics`: after each round it reads
//! the server's stamps of that break (`ferry_lease_last_break_ns`, on
//! `CLOCK_MONOTONIC`) and lays them beside its own — the changer's send
//! and reply, the holder's receipt of the break and its return — all on
//! one clock, since every process is on this host.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ferry_client::{Client, Leases, Options, Target};

use super::report::{median, Results};

/// The steps of one break, in the order they happen: what each phase is
/// called, from the stamp before it.
const PHASES: [&str; 7] = [
    "changer's request to its breaks sent",
    "server sends the break",
    "break reaches the holder",
    "holder handles it, sends return",
    "return read by a server worker",
    "changer's worker wakes",
    "reply reaches the changer",
];

fn mono_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The server's four stamps of its last waited break.
fn server_steps(metrics: &str) -> Result<[u64; 4], String> {
    let mut s = std::net::TcpStream::connect(metrics).map_err(|e| format!("metrics {metrics}: {e}"))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").map_err(|e| e.to_string())?;
    let mut body = String::new();
    s.read_to_string(&mut body).map_err(|e| e.to_string())?;
    let mut out = [0u64; 4];
    for (i, step) in ["start", "wrote", "returned", "resumed"].iter().enumerate() {
        let key = format!("ferry_lease_last_break_ns{{step=\"{step}\"}} ");
        let v = body.lines().find_map(|l| l.strip_prefix(key.as_str()));
        out[i] = v.and_then(|v| v.trim().parse().ok()).ok_or_else(|| format!("metrics: no {key}"))?;
    }
    Ok(out)
}

pub(super) fn exp_breaks(dir: &Path, rounds: usize, runs: usize, res: &mut Results) -> Result<(), String> {
    eprintln!("ferry compare: experiment 11, lease break cost");
    let e = |e: std::io::Error| format!("experiment 11: {e}");
    std::fs::create_dir_all(dir).map_err(e)?;
    let metrics = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(e)?;
        l.local_addr().map_err(e)?.to_string()
    };
    let (_server, port) = crate::bench::start_server_with(dir, &["--metrics", &metrics])?;
    let addr = format!("127.0.0.1:{port}");
    let opts = Options { same_host: false, ..Options::default() };
    let err = |e: ferry_client::Error| format!("experiment 11: {e}");
    let changer = Client::connect(&addr, &opts).map_err(err)?;
    let holder = Client::connect(&addr, &opts).map_err(err)?;
    // The holder's client: when it got the break, when it began to send
    // its return (once written, a server worker may read it before this
    // thread looks at the clock again).
    let seen = Arc::new(Mutex::new((0u64, 0u64)));
    let stamps = Arc::clone(&seen);
    let leases = Leases::new(Box::new(move |_, ret| {
        let got = mono_ns();
        *stamps.lock().unwrap_or_else(|e| e.into_inner()) = (got, mono_ns());
        drop(ret);
    }));
    holder.leases_on(Arc::clone(&leases)).map_err(err)?;
    for f in ["/lease-held", "/lease-free"] {
        changer.write(f, b"x").map_err(err)?;
    }
    for run in 0..runs {
        eprintln!("ferry compare: experiment 11, run {}/{runs}", run + 1);
        let (mut held, mut free, mut ping) = (Vec::new(), Vec::new(), Vec::new());
        let mut phases: Vec<Vec<f64>> = vec![Vec::new(); PHASES.len()];
        let mut disorder = [0usize; PHASES.len()];
        let before = leases.breaks();
        for i in 0..rounds {
            holder.metadata("/lease-held").map_err(err)?;
            let mode = if i % 2 == 0 { 0o600 } else { 0o644 };
            let (t, sent) = (Instant::now(), mono_ns());
            changer.set_permissions(Target::Path(b"/lease-held"), mode).map_err(err)?;
            let replied = mono_ns();
            held.push(t.elapsed().as_secs_f64() * 1e6);
            let t = Instant::now();
            changer.set_permissions(Target::Path(b"/lease-free"), mode).map_err(err)?;
            free.push(t.elapsed().as_secs_f64() * 1e6);
            let t = Instant::now();
            changer.ping().map_err(err)?;
            ping.push(t.elapsed().as_secs_f64() * 1e6);
            let [start, wrote, returned, resumed] = server_steps(&metrics)?;
            let (got, answered) = *seen.lock().unwrap_or_else(|e| e.into_inner());
            let steps = [sent, start, wrote, got, answered, returned, resumed, replied];
            // Only a round whose stamps are all its own and in order (one
            // whose server stamps are an earlier round's is left out).
            match steps.windows(2).position(|w| w[0] > w[1]) {
                None => {
                    for (k, w) in steps.windows(2).enumerate() {
                        phases[k].push((w[1] - w[0]) as f64 / 1e3);
                    }
                }
                Some(k) => disorder[k] += 1,
            }
        }
        let broke = leases.breaks() - before;
        if broke < rounds as u64 {
            return Err(format!("experiment 11: {broke} breaks in {rounds} rounds: the holder's lease was not broken"));
        }
        if phases[0].len() < rounds / 2 {
            let out: Vec<String> = PHASES.iter().zip(disorder).map(|(p, n)| format!("{p}: {n}")).collect();
            return Err(format!(
                "experiment 11: only {} of {rounds} rounds had a whole timeline (out of order before: {})",
                phases[0].len(),
                out.join(", ")
            ));
        }
        let (h, f, p) = (median(&held), median(&free), median(&ping));
        let mut sorted = held.clone();
        sorted.sort_by(f64::total_cmp);
        let p99 = sorted[(sorted.len() - 1) * 99 / 100];
        res.add("11", "ferry", "chmod, another client holds a lease", "latency", "µs", h);
        res.add("11", "ferry", "chmod, another client holds a lease, p99", "latency", "µs", p99);
        res.add("11", "ferry", "chmod, nobody holds a lease", "latency", "µs", f);
        res.add("11", "ferry", "round trip (Ping)", "latency", "µs", p);
        res.add("11", "ferry", "break cost", "round trips", "RTT", (h - f) / p);
        for (name, v) in PHASES.iter().zip(&phases) {
            res.add("11", "ferry", name, "timeline", "µs", median(v));
        }
    }
    Ok(())
}

pub(super) fn print_breaks(res: &Results, runs: usize) {
    let Some(cost) = res.get("11", "ferry", "break cost", "round trips") else { return };
    println!("\n11. Lease break cost to the changing client (µs, median of {runs} runs of per-round medians)");
    for p in [
        "chmod, another client holds a lease",
        "chmod, another client holds a lease, p99",
        "chmod, nobody holds a lease",
        "round trip (Ping)",
    ] {
        if let Some(v) = res.get("11", "ferry", p, "latency") {
            println!("{p:<40} {:>10.1}", median(v));
        }
    }
    println!("the break's timeline (µs, medians; one clock for all processes):");
    for p in PHASES {
        if let Some(v) = res.get("11", "ferry", p, "timeline") {
            println!("    {p:<40} {:>8.1}", median(v));
        }
    }
    println!("target: a break costs the changing client <= 1 extra round trip: {:.2}", median(cost));
}
