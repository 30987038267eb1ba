//! `ferry soak`, briefly: 20 clients for a few seconds against a server of
//! its own. The command fails on any byte that differs, any failed call, or
//! a server whose memory or descriptors do not stay flat. With `--idle`
//! it reports what idle clients cost the server.

mod common;

use std::process::Command;

use common::{stderr, stdout, FERRY};

#[test]
fn a_short_soak_passes() {
    let o = Command::new("timeout")
        .args(["120", FERRY, "soak", "--clients", "20", "--secs", "4", "--max-file", "262144", "--seed", "7"])
        .output()
        .unwrap();
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    assert!(out.contains("ferry soak: passed"), "{out}");
    for op in ["write+fsync", "read", "rename", "mkdir+rmdir"] {
        let line = out.lines().find(|l| l.starts_with(op)).unwrap_or_else(|| panic!("no {op} line: {out}"));
        let count: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(count > 0, "no {op} ran: {out}");
    }
}

/// 400 idle clients beside 10 active ones: the report's line, with the
/// server's threads staying few (an event loop, not a thread each).
#[test]
fn a_soak_beside_idle_clients_reports_their_cost() {
    let o = Command::new("timeout")
        .args(["180", FERRY, "soak", "--clients", "10", "--secs", "3", "--max-file", "65536", "--seed", "8"])
        .args(["--idle", "400", "--idle-procs", "2"])
        .output()
        .unwrap();
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    assert!(out.contains("ferry soak: passed"), "{out}");
    let line =
        out.lines().find(|l| l.starts_with("idle: 400 clients")).unwrap_or_else(|| panic!("no idle line: {out}"));
    let threads = line.split("threads ").nth(1).and_then(|t| t.split(',').next()).unwrap_or_else(|| panic!("{line}"));
    let after: u64 =
        threads.split(" → ").nth(1).and_then(|n| n.trim().parse().ok()).unwrap_or_else(|| panic!("{line}"));
    assert!(after < 64, "{after} server threads beside 400 idle clients: {line}");
}
