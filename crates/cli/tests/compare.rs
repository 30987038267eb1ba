//! `ferry compare --quick`: every experiment at tiny sizes, so the
//! benchmarks cannot rot. Ferry and the raw limits only: the baselines
//! (NFS-Ganesha, diod, Samba, sshfs) are measured too when
//! FERRY_COMPARE_BASELINES=1, which installs their Debian packages on first
//! use (slow, and needs root and apt), so CI leaves it off.

use std::process::Command;

const FERRY: &str = env!("CARGO_BIN_EXE_ferry");

#[test]
fn compare_quick_runs_every_experiment() {
    let out = std::env::temp_dir().join(format!("ferry-compare-test-{}", std::process::id()));
    let o = Command::new(FERRY)
        .args(["compare", "--quick", "--out"])
        .arg(&out)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .expect("run ferry compare");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "ferry compare failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    // Which experiment and run is going, on stderr, as it goes.
    for what in [
        "raw limits, run 1/1",
        "experiment 1, run 1/1",
        "experiment 6, run 1/1",
        "experiment 9, run 1/1",
        "experiment 10, run 1/1",
        "experiment 11, run 1/1",
    ] {
        assert!(stderr.contains(&format!("ferry compare: {what}\n")), "no progress {what:?} on stderr:\n{stderr}");
    }
    assert!(!stdout.contains(", run 1/1"), "progress on stdout:\n{stdout}");
    // Its figures are for checking, and it says so first.
    assert!(stdout.lines().next().unwrap_or("").contains("not measurements"), "{stdout}");
    for title in [
        "Raw limits",
        "1. Sequential read vs request size",
        "2. Write + fsync vs file size",
        "3. Window sweep",
        "4. stat latency",
        "5. Tree scan",
        "6. Concurrent clients",
        "7. Fetch of a whole file, client cache cold / warm / bypassed",
        "7. Mount read of a cached file (warm)",
        "8. CPU per GiB moved",
        "10. Real programs (git, find, tar, make)",
        "target: git status on the default mount <= 1.5 x local",
        "11. Lease break cost to the changing client",
        "target: a break costs the changing client <= 1 extra round trip",
    ] {
        assert!(stdout.contains(title), "no {title:?} in\n{stdout}");
    }
    let csv = std::fs::read_to_string(out.join("results.csv")).expect("results.csv");
    let json = std::fs::read_to_string(out.join("results.json")).expect("results.json");
    let _ = std::fs::remove_dir_all(&out);
    for exp in ["0", "1", "2", "3", "4", "5", "6", "7", "8"] {
        assert!(
            csv.lines().any(|l| l.starts_with(&format!("{exp},ferry,"))),
            "no ferry row for experiment {exp}:\n{csv}"
        );
    }
    assert!(csv.lines().any(|l| l.starts_with("0,raw,\"TCP stream")), "no raw TCP figure:\n{csv}");
    // Issue 34's yardsticks placed alike: the raw receiver of the test
    // file's `sendfile`d stream and ferry's 1 MiB reads of the file, both
    // pinned, with their ratios (two CPUs are needed to place them apart).
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    for row in [
        "0,raw,\"TCP stream of the file, pinned cross core\",throughput,",
        "0,raw,\"TCP receive of the file, pinned same core\",receiver CPU,",
        "0,ferry,\"1 MiB reads / raw stream, pinned cross core\",ratio,",
        "0,ferry,\"client CPU / raw receiver, pinned same core\",CPU ratio,",
    ] {
        let found = csv.lines().find(|l| l.starts_with(row));
        if cpus < 2 {
            assert!(found.is_none(), "{row:?} on one CPU:\n{csv}");
            continue;
        }
        let median: f64 = found
            .and_then(|l| l[row.len()..].split(',').nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {row:?} figure:\n{csv}"));
        assert!(median.is_finite() && median > 0.0, "{row:?}: {median}");
    }
    assert!(csv.lines().any(|l| l.starts_with("1,local,")), "no local page-cache figure:\n{csv}");
    // Issue 34's 4 KiB and libnfs comparisons, placed alike: the whole file
    // in 4 KiB reads by ferry and the local reader, and 1 MiB reads' client
    // CPU with the server on the other CPU.
    for (start, metric) in [
        ("1,ferry,\"4K of ", "\",throughput,MB/s,"),
        ("1,local,\"4K of ", "\",throughput,MB/s,"),
        ("8,ferry,\"read 1M, pinned cross core", "\",client CPU,s/GiB,"),
    ] {
        let found = csv.lines().find(|l| l.starts_with(start) && l.contains(metric));
        if cpus < 2 {
            assert!(found.is_none(), "{start:?} on one CPU:\n{csv}");
            continue;
        }
        let median: f64 = found
            .and_then(|l| l.split_once(metric))
            .and_then(|(_, rest)| rest.split(',').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {start:?} figure:\n{csv}"));
        assert!(median.is_finite() && median > 0.0, "{start:?}: {median}");
    }
    // No failed request with many clients.
    for l in csv.lines().filter(|l| l.starts_with("6,ferry,") && l.contains("failed requests")) {
        let median: f64 = l.split(',').nth(5).and_then(|v| v.parse().ok()).expect("median");
        assert_eq!(median, 0.0, "failed requests: {l}");
    }
    let json: serde_json::Value = serde_json::from_str(&json).expect("results.json is JSON");
    let records = json["records"].as_array().expect("records");
    assert!(
        records.iter().any(|r| r["experiment"] == "1" && r["system"] == "ferry" && r["median"].as_f64().is_some()),
        "no ferry read figure in results.json: {json}"
    );
    // Experiment 7 through every ferry client, each mode.
    for sys in ["ferry", "ferry-fuse", "ferry-run"] {
        for mode in ["cold", "warm", "bypass"] {
            let row = format!("7,{sys},1M {mode},elapsed,");
            assert!(csv.lines().any(|l| l.starts_with(&row)), "no {row:?} row:\n{csv}");
        }
    }
    assert!(csv.lines().any(|l| l.starts_with("7m,cache file,")), "no local cache file figure:\n{csv}");
    // Experiment 10: every program in every place; 11: the break's cost.
    for place in ["local", "ferry-fuse", "ferry-fuse-cache", "ferry-run"] {
        for prog in ["git clone", "git status", "find -ls", "tar c", "tar x", "make -j2", "make again"] {
            let row = format!("10,{place},{prog},elapsed,");
            assert!(csv.lines().any(|l| l.starts_with(&row)), "no {row:?} row:\n{csv}");
        }
    }
    // And the targets' ratios taken within the run, each a positive number.
    for pair in ["ferry-fuse-cache / ferry-fuse", "ferry-fuse / local"] {
        for prog in ["git clone", "git status", "make -j2"] {
            let row = format!("10,{pair},{prog},ratio in one run,x,");
            let line = csv.lines().find(|l| l.starts_with(&row)).unwrap_or_else(|| panic!("no {row:?} row:\n{csv}"));
            let median: f64 = line[row.len()..].split(',').next().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
            assert!(median > 0.0 && median.is_finite(), "{row:?}: median {median}:\n{line}");
        }
    }
    assert!(csv.lines().any(|l| l.starts_with("11,ferry,break cost,round trips,")), "no break cost:\n{csv}");
    if std::env::var("FERRY_COMPARE_BASELINES").is_ok_and(|v| v == "1") {
        for sys in ["nfs3", "9p", "smb", "sshfs"] {
            assert!(csv.lines().any(|l| l.starts_with(&format!("1,{sys},"))), "no {sys} figures:\n{stdout}");
        }
    }
}

/// Experiment 6 with idle clients beside it, for ferry and `ferry run`
/// only: the server's memory, threads and descriptors beside each client
/// count, and what the idle clients cost it and a client's `stat`.
#[test]
fn compare_reports_the_server_beside_its_clients_and_idle_ones() {
    let out = std::env::temp_dir().join(format!("ferry-compare-idle-{}", std::process::id()));
    let o = Command::new(FERRY)
        .args(["compare", "--quick", "--only", "6", "--idle", "60", "--systems", "ferry-run", "--out"])
        .arg(&out)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .expect("run ferry compare");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "ferry compare failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    let csv = std::fs::read_to_string(out.join("results.csv")).expect("results.csv");
    let _ = std::fs::remove_dir_all(&out);
    let figure = |row: &str| -> f64 {
        let l = csv.lines().find(|l| l.starts_with(row)).unwrap_or_else(|| panic!("no {row:?} row:\n{csv}"));
        l.split(',').nth(5).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no median in {l}"))
    };
    for sys in ["ferry", "ferry-run"] {
        assert!(figure(&format!("6,{sys},3,server RSS,")) > 1.0, "{sys}: the server's memory");
        assert!(figure(&format!("6,{sys},3,server threads,")) >= 2.0, "{sys}: the server's threads");
        assert!(figure(&format!("6,{sys},3,server descriptors,")) >= 3.0, "{sys}: the server's descriptors");
    }
    assert!(!csv.lines().any(|l| l.starts_with("6,ferry-fuse,")), "--systems left ferry-fuse out:\n{csv}");
    assert!(figure("6,ferry,3 + 60 idle,aggregate throughput,") > 0.0, "the readers beside the idle clients");
    assert!(figure("6,ferry,60 idle,server RSS with them,") > 1.0);
    assert!(figure("6,ferry,60 idle,stat p99 beside idle,") > 0.0);
    for title in ["6. The server meanwhile", "6. Idle clients on ferry's server"] {
        assert!(stdout.contains(title), "no {title:?} in\n{stdout}");
    }
}
