//! What the long-running commands say while they work, on stderr: the
//! summary line `ferry cp` ends with, and which measurement `ferry bench` is
//! at (`ferry compare`'s is checked in compare.rs).

mod common;

use std::process::Command;

use common::{stderr, stdout, Server, TempDir, FERRY};

/// `copied N files, X MB in S s, R MB/s`: (files, MB).
fn summary(line: &str) -> Option<(u64, f64)> {
    let rest = line.strip_prefix("copied ")?;
    let (files, rest) = rest.split_once(' ')?;
    let rest = rest.strip_prefix("files, ").or_else(|| rest.strip_prefix("file, "))?;
    let (mb, rest) = rest.split_once(" MB in ")?;
    let (secs, rate) = rest.split_once(" s, ")?;
    secs.parse::<f64>().ok()?;
    rate.strip_suffix(" MB/s")?.parse::<f64>().ok()?;
    Some((files.parse().ok()?, mb.parse().ok()?))
}

#[test]
fn cp_ends_with_a_summary_with_v_or_on_a_terminal_and_is_quiet_otherwise() {
    let srv = Server::start(&[]);
    let tmp = TempDir::new("cp-summary");
    let src = tmp.path().join("tree");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("a"), vec![1u8; 1_000_000]).unwrap();
    std::fs::write(src.join("b"), vec![2u8; 200_000]).unwrap();
    std::fs::write(src.join("sub/c"), vec![3u8; 300_000]).unwrap();
    let s = src.to_str().unwrap();

    let o = srv.ferry(&["cp", "-r", "-v", s, &srv.url("/up")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert_eq!(summary(lines[0]), Some((3, 1.5)), "{err}");
    assert!(stdout(&o).is_empty());
    assert_eq!(std::fs::read(srv.export.path().join("up/sub/c")).unwrap().len(), 300_000);

    // Downloads too, and one file is "1 file".
    let o = srv.ferry(&["cp", "--verbose", &srv.url("/up/b"), tmp.path().join("b").to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(summary(stderr(&o).trim_end()), Some((1, 0.2)), "{}", stderr(&o));

    // Into a pipe, without -v: nothing (scripts read stderr for errors).
    let o = srv.ferry(&["cp", "-r", s, &srv.url("/quiet")]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o), "");

    // On a terminal (script(1) gives it one): the line without -v.
    let cmd = format!("'{FERRY}' cp '{}' '{}'", src.join("a").display(), srv.url("/tty-a"));
    let o = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("FERRY_TOKEN_FILE", &srv.token_file)
        .output()
        .expect("script (util-linux) is needed");
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    // After the progress bar, which the line clears ("\x1b[2K") first.
    let last = out.rsplit("\x1b[2K").next().unwrap_or("").trim_end();
    assert_eq!(summary(last), Some((1, 1.0)), "{out:?}");
}

#[test]
fn bench_says_which_measurement_is_going_on_stderr() {
    let o = Command::new(FERRY).args(["bench", "--quick"]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    for what in [
        "ferry bench: run 1/1: throughput",
        "ferry bench: run 1/1: latency",
        "ferry bench: run 1/1: FUSE",
        "ferry bench: run 1/1: ferry run",
    ] {
        assert!(err.contains(what), "no {what:?} on stderr:\n{err}");
    }
    // The results alone on stdout.
    assert!(!stdout(&o).contains("ferry bench: run"), "{}", stdout(&o));
}
