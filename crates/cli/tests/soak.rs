//! `ferry soak`, briefly: 20 clients for a few seconds against a server of
//! its own. The command fails on any byte that differs, any failed call, or
//! a server whose memory or descriptors do not stay flat.

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
