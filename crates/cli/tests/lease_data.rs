//! File data under leases (PROTOCOL.md 8.10, issue 30): while the mount
//! holds a lease of a server that sees every change (`WATCHED`), a file's
//! pages stay in the kernel's page cache across opens (`FOPEN_KEEP_CACHE`),
//! so a re-read is a local read; a break drops them before the change is
//! acknowledged, so no reader ever gets old data from them.
//!
//! Writers and readers are coordinated by the test's own order: A changes
//! (through a mount, or on the server's disk), then B reads at once.

mod common;

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Rng, Server, TempDir};

/// How many bytes of `p` the kernel holds in its page cache (`fincore`,
/// which opens the file read-only: on the mount, an open like any other).
fn resident(p: &Path) -> u64 {
    let o =
        Command::new("fincore").args(["--bytes", "--noheadings", "--output", "RES"]).arg(p).output().expect("fincore");
    assert!(o.status.success(), "fincore: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().parse().expect("fincore's RES")
}

fn watching(srv: &Server) {
    let w = common::fuse::wait_for(Duration::from_secs(10), || srv.log().contains("watching"));
    assert!(w, "the server watches its export: {}", srv.log());
}

/// One random change of the file at `p` (a mount's path or the server's
/// disk): overwrites in place that keep the size (the case attributes
/// alone would not reveal), appends, truncates, rewrites.
fn change(p: &Path, rng: &mut Rng, round: usize) -> String {
    let len = std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let tag = format!("<{round}>");
    match rng.below(5) {
        0 | 1 if len > tag.len() as u64 => {
            let at = rng.below(len - tag.len() as u64 + 1);
            let mut f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
            f.seek(SeekFrom::Start(at)).unwrap();
            f.write_all(tag.as_bytes()).unwrap();
            format!("overwrite at {at}")
        }
        2 => {
            let mut f = std::fs::OpenOptions::new().append(true).open(p).unwrap();
            let n = 1 + rng.index(20_000);
            f.write_all(&rng.bytes(n)).unwrap();
            "append".into()
        }
        3 => {
            let to = rng.below(len + 1);
            std::fs::OpenOptions::new().write(true).open(p).unwrap().set_len(to).unwrap();
            format!("truncate to {to}")
        }
        _ => {
            let n = rng.index(300_000);
            std::fs::write(p, rng.bytes(n)).unwrap();
            "rewrite".into()
        }
    }
}

/// A mount of `srv` over TCP: on the server's host a root mount would back
/// large files with the server's own descriptors (passthrough, `samehost`),
/// and these tests are of the page cache a remote client keeps.
fn mount_tcp(srv: &Server, mp: &std::path::Path) -> common::fuse::Mounted {
    common::fuse::mount_url_env(&srv.url("/"), mp, &srv.token_file, &[], &[("FERRY_SAME_HOST", "0")])
}

/// Where two byte strings first differ, for the message.
fn first_difference(a: &[u8], b: &[u8]) -> String {
    let at = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
    format!("{} bytes vs {}, first difference at {at}", a.len(), b.len())
}

/// A file read through the mount is kept in the page cache past its close
/// (the next open finds its pages: with direct I/O it had none), a read
/// again asks the server nothing (not even an open: no lease is granted),
/// and a change another mount makes is never read from them: the change
/// waits for the break, the break drops the pages.
#[test]
fn a_mount_keeps_a_files_pages_across_opens_until_a_break() {
    use common::scrape::{get, metrics_addr, sample};
    common::fuse::require_fuse();
    let srv = Server::start(&["--metrics", "127.0.0.1:0"]);
    let addr = metrics_addr(&srv);
    let granted = || sample(&get(&addr, "/metrics").1, "ferry_leases_granted_total");
    watching(&srv);
    let disk = srv.export.path().join("f");
    let mut rng = Rng::new(30);
    std::fs::write(&disk, rng.bytes(4 << 20)).unwrap();
    let (m1, m2) = (TempDir::new("m1"), TempDir::new("m2"));
    let _g1 = common::fuse::Detach(m1.path().to_path_buf());
    let _g2 = common::fuse::Detach(m2.path().to_path_buf());
    let _a = mount_tcp(&srv, m1.path());
    let _b = mount_tcp(&srv, m2.path());
    let (a, b) = (m1.path().join("f"), m2.path().join("f"));

    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&disk).unwrap());
    let kept = resident(&a);
    assert_eq!(kept, 4 << 20, "the pages read stay in the kernel for the next open");
    // Read again: the same (from the kernel), still whole, and the server
    // heard nothing of it.
    let before = granted();
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&disk).unwrap());
    assert_eq!(granted(), before, "a read again reached the server");

    // Another mount overwrites 5 bytes in place (the size stays): A reads
    // the new bytes at once, and its kept pages went with the break.
    let mut f = std::fs::OpenOptions::new().write(true).open(&b).unwrap();
    f.seek(SeekFrom::Start(1 << 20)).unwrap();
    f.write_all(b"HELLO").unwrap();
    drop(f);
    let now = std::fs::read(&a).unwrap();
    assert_eq!(&now[1 << 20..(1 << 20) + 5], b"HELLO", "a stale page after another mount's write");
    assert_eq!(now, std::fs::read(&disk).unwrap());

    // A program on the server's host writes the file directly: seen soon
    // (the kernel's notice reaches the server after the write), never
    // later than half a second.
    let mut f = std::fs::OpenOptions::new().write(true).open(&disk).unwrap();
    f.seek(SeekFrom::Start(3 << 20)).unwrap();
    f.write_all(b"WORLD").unwrap();
    drop(f);
    let seen = common::fuse::wait_for(Duration::from_millis(500), || {
        std::fs::read(&a).unwrap()[3 << 20..(3 << 20) + 5] == *b"WORLD"
    });
    assert!(seen, "a change on the server's disk never reached the mount's pages");
}

/// Two mounts of one server, default options: thousands of rounds of
/// changes (overwrites in place, appends, truncates, rewrites) through
/// one, each followed at once by a read of the whole file through the
/// other — which keeps its pages across opens. The roles swap every
/// round, so both mounts hold pages and both write. Zero stale reads.
#[test]
fn two_mounts_never_read_stale_data_from_kept_pages() {
    common::fuse::require_fuse();
    let srv = Server::start(&[]);
    watching(&srv);
    let disk = srv.export.path().join("f");
    let mut rng = Rng::new(31);
    std::fs::write(&disk, rng.bytes(100_000)).unwrap();
    let (m1, m2) = (TempDir::new("m1"), TempDir::new("m2"));
    let _g1 = common::fuse::Detach(m1.path().to_path_buf());
    let _g2 = common::fuse::Detach(m2.path().to_path_buf());
    let _a = mount_tcp(&srv, m1.path());
    let _b = mount_tcp(&srv, m2.path());
    let sides = [m1.path().join("f"), m2.path().join("f")];
    let mut stale = Vec::new();
    let t0 = Instant::now();
    let rounds = 2000;
    for round in 0..rounds {
        let (w, r) = (&sides[round % 2], &sides[1 - round % 2]);
        // Both read first, so both hold the file's pages.
        let _ = std::fs::read(w).unwrap();
        let _ = std::fs::read(r).unwrap();
        let what = change(w, &mut rng, round);
        let (seen, want) = (std::fs::read(r).unwrap(), std::fs::read(&disk).unwrap());
        if seen != want {
            stale.push(format!("round {round} after {what}: {}", first_difference(&seen, &want)));
        }
        // The writer's own mount reads its write too.
        let seen = std::fs::read(w).unwrap();
        if seen != want {
            stale.push(format!("round {round}, the writer after {what}: {}", first_difference(&seen, &want)));
        }
    }
    eprintln!("{rounds} rounds in {:?}", t0.elapsed());
    assert!(stale.is_empty(), "{} stale reads:\n{}", stale.len(), stale[..stale.len().min(20)].join("\n"));
}

/// A program on the server's host changes the file directly; the mount,
/// which keeps the file's pages, reads it at once and until it sees the
/// change. The server learns of such a change after it happened (its
/// `fanotify` notice), so the first read may be old by those moments;
/// every round must converge well within a plain attribute timeout.
/// The figures are printed.
#[test]
fn a_mount_reads_a_change_on_the_servers_disk_soon() {
    common::fuse::require_fuse();
    let srv = Server::start(&[]);
    watching(&srv);
    let disk = srv.export.path().join("f");
    let mut rng = Rng::new(32);
    std::fs::write(&disk, rng.bytes(100_000)).unwrap();
    let m = TempDir::new("m");
    let _g = common::fuse::Detach(m.path().to_path_buf());
    let _mounted = mount_tcp(&srv, m.path());
    let on_mount = m.path().join("f");
    let (mut late, mut delays, mut first_old) = (Vec::new(), Vec::new(), 0);
    for round in 0..1000 {
        let _ = std::fs::read(&on_mount).unwrap();
        let what = change(&disk, &mut rng, round);
        let want = std::fs::read(&disk).unwrap();
        let t0 = Instant::now();
        let mut first = true;
        loop {
            if std::fs::read(&on_mount).unwrap() == want {
                delays.push(t0.elapsed());
                break;
            }
            first_old += first as usize;
            first = false;
            if t0.elapsed() > Duration::from_millis(500) {
                late.push(format!("round {round} after {what}: not read in 0.5 s"));
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    delays.sort();
    let at = |q: f64| delays.get(((delays.len() as f64 - 1.0) * q) as usize).copied().unwrap_or_default();
    eprintln!(
        "a change on the server's disk read through the mount after: median {:?}, p99 {:?}, max {:?}; \
         old at the first read in {first_old} of {} rounds",
        at(0.5),
        at(0.99),
        at(1.0),
        delays.len()
    );
    assert!(late.is_empty(), "{} late:\n{}", late.len(), late[..late.len().min(20)].join("\n"));
}

/// A file opened from kept pages (no request: the mount opens it on the
/// server only when a read reaches it) and then removed through the
/// mount stays readable to the end, as locally — also once its pages are
/// dropped (`POSIX_FADV_DONTNEED`), so the reads reach the server.
#[test]
fn a_file_opened_without_a_request_and_removed_stays_readable() {
    common::fuse::require_fuse();
    let srv = Server::start(&[]);
    watching(&srv);
    let mut rng = Rng::new(33);
    std::fs::write(srv.export.path().join("f"), rng.bytes(3 << 20)).unwrap();
    std::fs::write(srv.export.path().join("g"), b"new").unwrap();
    let m = TempDir::new("m");
    let _g = common::fuse::Detach(m.path().to_path_buf());
    let _mounted = mount_tcp(&srv, m.path());
    let script = r#"
import os, sys
d = sys.argv[1]
for how in ("unlink", "rename"):
    p = os.path.join(d, "f")
    want = open(p, "rb").read()
    fd = os.open(p, os.O_RDONLY)
    if how == "unlink":
        os.unlink(p)
    else:
        os.rename(os.path.join(d, "g"), p)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    got = b""
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            break
        got += b
    os.close(fd)
    assert got == want, (how, len(got), len(want))
    if how == "unlink":
        with open(p, "wb") as f:
            f.write(want)
        # Past the time a file written through the mount keeps no pages.
        import time
        time.sleep(3.5)
        open(p, "rb").read()
print("ok")
"#;
    let o = Command::new("timeout").args(["60", "python3", "-c", script]).arg(m.path()).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "ok");
}
