//! What `ferry compare` measured: the figures of every run, the tables it
//! prints, and the CSV and JSON it writes (`--out`).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;

use super::{size_label, Plan, System, ALL_ERRORS};

/// (experiment, system, parameter, metric).
type Key = (String, String, String, String);

/// Figures: one entry per (experiment, system, parameter, metric).
#[derive(Default)]
pub(super) struct Results {
    pub(super) order: Vec<Key>,
    pub(super) data: HashMap<Key, (String, Vec<f64>)>,
}

impl Results {
    pub(super) fn add(&mut self, exp: &str, sys: &str, param: &str, metric: &str, unit: &str, v: f64) {
        let k = (exp.to_string(), sys.to_string(), param.to_string(), metric.to_string());
        if !self.data.contains_key(&k) {
            self.order.push(k.clone());
        }
        self.data.entry(k).or_insert_with(|| (unit.to_string(), Vec::new())).1.push(v);
    }

    pub(super) fn get(&self, exp: &str, sys: &str, param: &str, metric: &str) -> Option<&[f64]> {
        let k = (exp.to_string(), sys.to_string(), param.to_string(), metric.to_string());
        self.data.get(&k).map(|(_, v)| v.as_slice())
    }
}

pub(super) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub(super) fn spread(v: &[f64]) -> (f64, f64) {
    (v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(f64::NEG_INFINITY, f64::max))
}

fn print_fetch(res: &Results, systems: &[System], plan: &Plan, runs: usize) {
    if !res.order.iter().any(|(e, ..)| e == "7") {
        return;
    }
    println!("\n7. Fetch of a whole file, client cache cold / warm / bypassed (the AFS paper's Tables 3-4;");
    println!("   ms per fetch, median of {runs}; user and system: the reading process; daemon CPU: the mount's)");
    println!(
        "{:<12} {:>6} {:>7} {:>10} {:>10} {:>10} {:>11}",
        "system", "size", "mode", "elapsed", "user", "system", "daemon CPU"
    );
    let med =
        |s: &str, p: &str, m: &str| res.get("7", s, p, m).map_or("-".to_string(), |v| format!("{:.2}", median(v)));
    for s in systems.iter().filter(|s| s.name.starts_with("ferry")) {
        for &size in &plan.fetch_sizes {
            for mode in ["cold", "warm", "bypass"] {
                let p = format!("{} {mode}", size_label(size));
                if res.get("7", &s.name, &p, "elapsed").is_none() {
                    continue;
                }
                println!(
                    "{:<12} {:>6} {:>7} {:>10} {:>10} {:>10} {:>11}",
                    s.name,
                    size_label(size),
                    mode,
                    med(&s.name, &p, "elapsed"),
                    med(&s.name, &p, "user"),
                    med(&s.name, &p, "system"),
                    med(&s.name, &p, "daemon CPU")
                );
            }
        }
    }
    let (Some(m), Some(l)) =
        (res.get("7m", "ferry-fuse", "read", "throughput"), res.get("7m", "cache file", "read", "throughput"))
    else {
        return;
    };
    println!(
        "\n7. Mount read of a cached file (warm): {} MB/s; local read of its cache file: {} MB/s; ratio {:.2}",
        cell(m),
        cell(l),
        median(m) / median(l)
    );
}

fn cell(v: &[f64]) -> String {
    let (lo, hi) = spread(v);
    let f = |x: f64| {
        if x.abs() >= 100.0 {
            format!("{x:.0}")
        } else if x.abs() >= 10.0 {
            format!("{x:.1}")
        } else {
            format!("{x:.2}")
        }
    };
    if v.len() > 1 {
        format!("{} ({}..{})", f(median(v)), f(lo), f(hi))
    } else {
        f(median(v))
    }
}

/// One table: rows are systems, columns parameters.
fn table(res: &Results, exp: &str, metric: &str, title: &str, systems: &[String]) {
    let mut params: Vec<&str> = Vec::new();
    for (e, _, p, m) in &res.order {
        if e == exp && m == metric && !params.contains(&p.as_str()) {
            params.push(p);
        }
    }
    if params.is_empty() {
        return;
    }
    let unit = res
        .order
        .iter()
        .find(|(e, _, _, m)| e == exp && m == metric)
        .map_or(String::new(), |key| res.data.get(key).map_or(String::new(), |(u, _)| u.clone()));
    println!("\n{title} ({metric}, {unit}; median (min..max))");
    let mut line = format!("{:<14}", "system");
    for p in &params {
        let _ = write!(line, " {p:>24}");
    }
    println!("{line}");
    for s in systems {
        if !params.iter().any(|p| res.get(exp, s, p, metric).is_some()) {
            continue;
        }
        let mut line = format!("{s:<14}");
        for p in &params {
            let c = res.get(exp, s, p, metric).map_or("-".to_string(), cell);
            let _ = write!(line, " {c:>24}");
        }
        println!("{line}");
    }
}

pub(super) fn print_tables(
    res: &Results,
    systems: &[System],
    plan: &Plan,
    runs: usize,
    machine: &BTreeMap<&str, String>,
) {
    let names: Vec<String> = ["raw".to_string()].into_iter().chain(systems.iter().map(|s| s.name.clone())).collect();
    println!(
        "\nferry compare: {} runs; file {}, tree {}x{} files of 1 KiB; {} on {} CPUs, kernel {}",
        runs,
        size_label(plan.file),
        plan.tree.0,
        plan.tree.1,
        machine.get("cpu").map_or("", |s| s.as_str()),
        machine.get("cpus").map_or("", |s| s.as_str()),
        machine.get("kernel").map_or("", |s| s.as_str())
    );
    println!("\nRaw limits and pinned latencies:");
    for (e, s, p, m) in &res.order {
        if e == "0" {
            if let Some((unit, v)) = res.data.get(&(e.clone(), s.clone(), p.clone(), m.clone())) {
                println!("  {:<6} {:<38} {:>28} {unit}", s, p, cell(v));
            }
        }
    }
    table(res, "1", "throughput", "1. Sequential read vs request size", &names);
    table(res, "2", "throughput", "2. Write + fsync vs file size (1 MiB writes)", &names);
    table(res, "3", "throughput", "3. Window sweep, ferry, 64 KiB reads", &names);
    table(res, "3", "client context switches", "3. Window sweep, ferry, 64 KiB reads", &names);
    table(res, "4", "latency", "4. stat latency", &names);
    table(res, "5", "rate", "5. Tree scan", &names);
    table(res, "6", "aggregate throughput", "6. Concurrent clients reading 64 KiB chunks", &names);
    table(res, "6", "failed requests", "6. Concurrent clients", &names);
    table(res, "6", "server RSS", "6. The server meanwhile (peak of 3 samples)", &names);
    table(res, "6", "server threads", "6. The server meanwhile (peak of 3 samples)", &names);
    table(res, "6", "server descriptors", "6. The server meanwhile (peak of 3 samples)", &names);
    for m in [
        "memory per idle client",
        "server RSS with them",
        "server threads with them",
        "stat p50 alone",
        "stat p50 beside idle",
        "stat p99 alone",
        "stat p99 beside idle",
    ] {
        table(res, "6", m, "6. Idle clients on ferry's server", &names);
    }
    print_fetch(res, systems, plan, runs);
    let split: Vec<String> =
        ["main only", "channels 1", "channels 2", "channels 4", "1 from 64K", "1 from 4M", "same host", "local"]
            .into_iter()
            .map(String::from)
            .collect();
    table(res, "9", "elapsed", "9. Split path: fetch (AFS Table 4)", &split);
    table(res, "9", "throughput", "9. Split path: write", &split);
    table(res, "9", "stat p50", "9. Split path: stat while the same client reads in bulk", &split);
    table(res, "9", "stat p99", "9. Split path: stat while the same client reads in bulk", &split);
    table(res, "9", "bulk rate", "9. Split path: the bulk read meanwhile", &split);
    table(res, "8", "client CPU", "8. CPU per GiB moved", &names);
    table(res, "8", "server CPU", "8. CPU per GiB moved", &names);
    for s in systems.iter().filter(|s| !s.note.is_empty()) {
        println!("note: {}: {}", s.name, s.note);
    }
}

/// One figure as results.csv and results.json have it.
#[derive(serde::Serialize)]
struct Record<'a> {
    experiment: &'a str,
    system: &'a str,
    param: &'a str,
    metric: &'a str,
    unit: &'a str,
    median: Option<f64>,
    min: Option<f64>,
    max: Option<f64>,
    runs: usize,
}

/// NaN and infinities (a figure that could not be computed) as JSON's null.
fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

#[derive(serde::Serialize)]
struct Everything<'a> {
    runs: usize,
    quick: bool,
    machine: &'a BTreeMap<&'a str, String>,
    status: &'a [String],
    notes: BTreeMap<&'a str, &'a str>,
    failures: &'a [String],
    measurement_errors: Vec<String>,
    records: Vec<serde_json::Value>,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn write_files(
    out: &Path,
    res: &Results,
    status: &[String],
    systems: &[System],
    machine: &BTreeMap<&str, String>,
    failures: &[String],
    runs: usize,
    quick: bool,
) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut csv = csv::Writer::from_path(out.join("results.csv")).map_err(|e| e.to_string())?;
    csv.write_record(["experiment", "system", "param", "metric", "unit", "median", "min", "max", "runs", "values"])
        .map_err(|e| e.to_string())?;
    let mut records = Vec::new();
    for key in &res.order {
        let (unit, v) = &res.data[key];
        let (lo, hi) = spread(v);
        let r = Record {
            experiment: &key.0,
            system: &key.1,
            param: &key.2,
            metric: &key.3,
            unit,
            median: finite(median(v)),
            min: finite(lo),
            max: finite(hi),
            runs: v.len(),
        };
        let values: Vec<String> = v.iter().map(|x| x.to_string()).collect();
        let show = |x: Option<f64>| x.map_or(String::new(), |x| x.to_string());
        csv.write_record([
            r.experiment,
            r.system,
            r.param,
            r.metric,
            r.unit,
            &show(r.median),
            &show(r.min),
            &show(r.max),
            &r.runs.to_string(),
            &values.join(";"),
        ])
        .map_err(|e| e.to_string())?;
        let mut json = serde_json::to_value(&r).map_err(|e| e.to_string())?;
        json["values"] = v.iter().map(|x| serde_json::json!(finite(*x))).collect();
        records.push(json);
    }
    csv.flush().map_err(|e| e.to_string())?;
    let everything = Everything {
        runs,
        quick,
        machine,
        status,
        notes: systems.iter().filter(|s| !s.note.is_empty()).map(|s| (s.name.as_str(), s.note.as_str())).collect(),
        failures,
        measurement_errors: ALL_ERRORS.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        records,
    };
    let json = serde_json::to_string_pretty(&everything).map_err(|e| e.to_string())?;
    std::fs::write(out.join("results.json"), json + "\n").map_err(|e| e.to_string())?;
    Ok(())
}
