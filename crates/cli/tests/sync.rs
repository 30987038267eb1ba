//! `ferry sync SRC DST` against real servers on 127.0.0.1: local to remote,
//! remote to local and remote to remote; a second run copies nothing (the
//! summary's counts, and the destination's inodes and times untouched); a
//! change is copied; `--delete`, `--dry-run`, `--checksum`; errors.

mod common;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

use common::{stderr, stdout, Server, TempDir};

/// (kind and mode, size, mtime s, mtime ns, symlink target or content) of
/// everything under `root`, by relative path as bytes.
type Tree = BTreeMap<Vec<u8>, (u32, u64, i64, i64, Vec<u8>)>;

fn tree(root: &Path) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        let rel = p.strip_prefix(root).unwrap().as_os_str().as_bytes().to_vec();
        let link = m.file_type().is_symlink();
        let body = if link {
            std::fs::read_link(&p).unwrap().into_os_string().into_vec()
        } else if m.is_file() {
            std::fs::read(&p).unwrap()
        } else {
            Vec::new()
        };
        // A link's own time is not kept (as rsync -a without --times on links).
        let (s, ns) = if link { (0, 0) } else { (m.mtime(), m.mtime_nsec()) };
        let size = if m.is_dir() { 0 } else { m.len() };
        out.insert(rel, (m.mode(), size, s, ns, body));
        if m.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
    out
}

/// (inode, mtime s, mtime ns, ctime s, ctime ns) by path: what a sync that
/// copies nothing must not change.
fn stamps(root: &Path) -> BTreeMap<Vec<u8>, (u64, i64, i64, i64, i64)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        let rel = p.strip_prefix(root).unwrap().as_os_str().as_bytes().to_vec();
        out.insert(rel, (m.ino(), m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()));
        if m.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
    out
}

/// A tree with nested directories, modes, a symbolic link, a name that is
/// not UTF-8 and old times with nanoseconds.
fn populate(src: &Path) {
    std::fs::create_dir_all(src.join("a/b")).unwrap();
    std::fs::create_dir_all(src.join("empty")).unwrap();
    std::fs::write(src.join("a/b/deep.txt"), b"deep\n").unwrap();
    std::fs::write(src.join("top.txt"), b"top file\n").unwrap();
    std::fs::write(src.join("tool"), b"#!/bin/sh\necho hi\n").unwrap();
    std::fs::write(src.join(OsStr::from_bytes(b"caf\xe9.bin")), common::random_bytes(300_000, 7)).unwrap();
    std::os::unix::fs::symlink("a/b/deep.txt", src.join("link")).unwrap();
    for (p, mode) in [("top.txt", 0o640), ("tool", 0o755), ("a", 0o750), ("a/b/deep.txt", 0o600)] {
        std::fs::set_permissions(src.join(p), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    for (p, t) in [
        ("a/b/deep.txt", "2001-01-01 12:00:00.123456789"),
        ("tool", "1999-12-31 23:59:59.5"),
        ("a/b", "2010-05-05 05:05:05.25"),
        ("a", "2010-05-05 05:05:05"),
    ] {
        assert!(Command::new("touch").args(["-h", "-d", t]).arg(src.join(p)).status().unwrap().success());
    }
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "ferry failed: {}\n{}", stderr(o), stdout(o));
    stdout(o)
}

/// (copied, up to date, deleted) from the summary line of `-v`.
fn counts(o: &Output) -> (u64, u64, u64) {
    let err = stderr(o);
    let line = err.lines().find(|l| l.contains(" up to date, ")).unwrap_or_else(|| panic!("no summary: {err}"));
    let num = |after: &str| -> u64 {
        let i = line.find(after).unwrap_or_else(|| panic!("{line}")) + after.len();
        line[i..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
    };
    let copied = num(if line.starts_with("would") { "would copy " } else { "copied " });
    let up = line.split("; ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    let deleted = line.rsplit(", ").next().unwrap().split(' ').next().unwrap().parse().unwrap();
    (copied, up, deleted)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Sets `p`'s mtime to `t` (it changed, but keeps its size).
fn touch(p: &Path, t: &str) {
    assert!(Command::new("touch").args(["-d", t]).arg(p).status().unwrap().success());
}

#[test]
fn local_to_remote_copies_what_differs_and_nothing_else() {
    let srv = Server::start(&[]);
    let tmp = TempDir::new("sync-up");
    let src = tmp.path().join("src");
    populate(&src);
    let dst = srv.export.path().join("backup");
    let url = srv.url("/backup");

    let o = srv.ferry(&["sync", "-v", s(&src), &url]);
    ok(&o);
    assert_eq!(counts(&o), (5, 0, 0), "{}", stderr(&o));
    assert_eq!(tree(&dst), tree(&src), "the copy differs from its source");
    // Nothing left under a temporary name.
    assert!(!stamps(&dst).keys().any(|k| k.ends_with(b".part")));

    // A second run: nothing copied, nothing on the server touched.
    let before = stamps(&dst);
    let o = srv.ferry(&["sync", "-v", s(&src), &url]);
    ok(&o);
    assert_eq!(counts(&o), (0, 5, 0), "{}", stderr(&o));
    assert_eq!(stamps(&dst), before, "a sync with nothing to do changed the destination");

    // Changed content of the same size with a new time; a new mode alone.
    std::fs::write(src.join("top.txt"), b"TOP FILE\n").unwrap();
    touch(&src.join("top.txt"), "2020-02-02 02:02:02.5");
    std::fs::set_permissions(src.join("tool"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let tool_ino = std::fs::metadata(dst.join("tool")).unwrap().ino();
    let o = srv.ferry(&["sync", "-v", s(&src), &url]);
    let out = ok(&o);
    assert_eq!(counts(&o), (1, 4, 0), "{}", stderr(&o));
    assert!(out.lines().any(|l| l == "copy top.txt"), "{out}");
    assert_eq!(tree(&dst), tree(&src));
    assert_eq!(std::fs::metadata(dst.join("tool")).unwrap().ino(), tool_ino, "a mode change copied the file");

    // A change of time only (same size): copied again, as rsync does.
    touch(&src.join("a/b/deep.txt"), "2021-01-01 00:00:00.75");
    let o = srv.ferry(&["sync", "-v", s(&src), &url]);
    ok(&o);
    assert_eq!(counts(&o), (1, 4, 0), "{}", stderr(&o));
    assert_eq!(tree(&dst), tree(&src));

    // --dry-run: says what it would do, changes nothing.
    std::fs::write(src.join("a/new.txt"), b"new\n").unwrap();
    std::fs::remove_file(src.join("top.txt")).unwrap();
    std::fs::write(dst.join("a/b/extra"), b"only on the server\n").unwrap();
    let before = stamps(&dst);
    let o = srv.ferry(&["sync", "-n", "--delete", "-v", s(&src), &url]);
    let out = ok(&o);
    assert_eq!(counts(&o), (1, 4, 2), "{}", stderr(&o));
    for line in ["would copy a/new.txt", "would delete top.txt", "would delete a/b/extra"] {
        assert!(out.lines().any(|l| l == line), "no {line:?} in:\n{out}");
    }
    assert_eq!(stamps(&dst), before, "a dry run changed the destination");

    // Without --delete nothing goes; with it, what the source lacks goes.
    let o = srv.ferry(&["sync", "-v", s(&src), &url]);
    ok(&o);
    assert_eq!(counts(&o), (1, 4, 0), "{}", stderr(&o));
    assert!(dst.join("top.txt").exists() && dst.join("a/b/extra").exists());
    let o = srv.ferry(&["sync", "--delete", "-v", s(&src), &url]);
    ok(&o);
    assert_eq!(counts(&o), (0, 5, 2), "{}", stderr(&o));
    assert_eq!(tree(&dst), tree(&src));
}

#[test]
fn remote_to_local_and_remote_to_remote() {
    let srv = Server::start(&[]);
    let other = Server::start(&["--no-auth"]);
    let tmp = TempDir::new("sync-down");
    let served = srv.export.path().join("data");
    populate(&served);
    let local = tmp.path().join("copy");

    let o = srv.ferry(&["sync", "-v", &srv.url("/data"), s(&local)]);
    ok(&o);
    assert_eq!(counts(&o), (5, 0, 0), "{}", stderr(&o));
    assert_eq!(tree(&local), tree(&served));
    let before = stamps(&local);
    let o = srv.ferry(&["sync", "-v", &srv.url("/data"), s(&local)]);
    ok(&o);
    assert_eq!(counts(&o), (0, 5, 0), "{}", stderr(&o));
    assert_eq!(stamps(&local), before, "a sync with nothing to do changed the destination");

    // A change on the server, a file only here, a new link target.
    std::fs::write(served.join("a/b/deep.txt"), b"deeper\n").unwrap();
    std::fs::remove_file(served.join("link")).unwrap();
    std::os::unix::fs::symlink("top.txt", served.join("link")).unwrap();
    std::fs::write(local.join("stray"), b"x").unwrap();
    std::fs::create_dir(local.join("a/straydir")).unwrap();
    std::fs::write(local.join("a/straydir/f"), b"x").unwrap();
    let o = srv.ferry(&["sync", "--delete", "-v", &srv.url("/data"), s(&local)]);
    ok(&o);
    assert_eq!(counts(&o), (2, 3, 2), "{}", stderr(&o));
    assert_eq!(tree(&local), tree(&served));

    // Between two servers, the data passing through this client (one
    // token for both: the second server asks for none).
    let o = srv.ferry(&["sync", "-v", &srv.url("/data"), &other.url("/mirror")]);
    ok(&o);
    assert_eq!(counts(&o), (5, 0, 0), "{}", stderr(&o));
    assert_eq!(tree(&other.export.path().join("mirror")), tree(&served));
    let o = srv.ferry(&["sync", "-v", &srv.url("/data"), &other.url("/mirror")]);
    ok(&o);
    assert_eq!(counts(&o), (0, 5, 0), "{}", stderr(&o));
}

#[test]
fn checksum_finds_what_times_hide() {
    let srv = Server::start(&[]);
    let tmp = TempDir::new("sync-sum");
    let src = tmp.path().join("src");
    populate(&src);
    let dst = srv.export.path().join("d");
    ok(&srv.ferry(&["sync", s(&src), &srv.url("/d")]));
    // Same size, same time, other bytes: only --checksum sees it.
    let m = std::fs::metadata(dst.join("top.txt")).unwrap();
    std::fs::write(dst.join("top.txt"), b"TOP file\n").unwrap();
    let ts = rustix::fs::Timespec { tv_sec: m.mtime(), tv_nsec: m.mtime_nsec() as _ };
    let times = rustix::fs::Timestamps { last_access: ts, last_modification: ts };
    rustix::fs::utimensat(rustix::fs::CWD, dst.join("top.txt"), &times, rustix::fs::AtFlags::empty()).unwrap();
    let o = srv.ferry(&["sync", "-v", s(&src), &srv.url("/d")]);
    ok(&o);
    assert_eq!(counts(&o), (0, 5, 0));
    let o = srv.ferry(&["sync", "-c", "-v", s(&src), &srv.url("/d")]);
    ok(&o);
    assert_eq!(counts(&o), (1, 4, 0), "{}", stderr(&o));
    assert_eq!(tree(&dst), tree(&src));
}

#[test]
fn errors_are_clear_and_lose_nothing() {
    let srv = Server::start(&[]);
    let tmp = TempDir::new("sync-err");
    let src = tmp.path().join("src");
    populate(&src);

    let o = srv.ferry(&["sync", "/nonexistent/src", &srv.url("/x")]);
    let err = stderr(&o);
    assert!(!o.status.success() && err.contains("/nonexistent/src: No such file or directory"), "{err}");
    assert!(!err.contains("os error"), "{err}");

    // A directory on the destination where the source has a file: kept
    // (without --delete), said, the rest still synced, exit non-zero.
    let dst = srv.export.path().join("d");
    std::fs::create_dir_all(dst.join("top.txt")).unwrap();
    std::fs::write(dst.join("top.txt/keep"), b"precious\n").unwrap();
    let o = srv.ferry(&["sync", "-v", s(&src), &srv.url("/d")]);
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("top.txt: is a directory on the destination (use --delete to replace it)"), "{err}");
    assert_eq!(std::fs::read(dst.join("top.txt/keep")).unwrap(), b"precious\n");
    assert_eq!(std::fs::read(dst.join("a/b/deep.txt")).unwrap(), b"deep\n");
    assert_eq!(counts(&o), (4, 0, 0), "{err}");
    // With --delete it is replaced, as rsync does.
    let o = srv.ferry(&["sync", "--delete", "-v", s(&src), &srv.url("/d")]);
    ok(&o);
    assert_eq!(counts(&o), (1, 4, 1), "{}", stderr(&o));
    assert_eq!(tree(&dst), tree(&src));

    // After an error, --delete deletes nothing: a file that failed to
    // copy is no reason to remove anything.
    let ro = Server::start(&["--read-only"]);
    std::fs::create_dir(ro.export.path().join("d")).unwrap();
    std::fs::write(ro.export.path().join("d/extra"), b"extra\n").unwrap();
    let o = ro.ferry(&["sync", "--delete", s(&src), &ro.url("/d")]);
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("nothing deleted here, after the errors above"), "{err}");
    assert!(!err.contains("extra"), "{err}");
    assert!(ro.export.path().join("d/extra").exists());

    // Into itself: refused before anything is copied.
    let o = srv.ferry(&["sync", s(&src), s(&src.join("a/inner"))]);
    assert!(!o.status.success() && stderr(&o).contains("is inside the source"), "{}", stderr(&o));
    assert!(!src.join("a/inner").exists());

    // A server that is not there.
    let o = srv.ferry_env(&["sync", s(&src), "ferry://127.0.0.1:1/x"], &[("FERRY_RECONNECT", "0")]);
    let err = stderr(&o);
    assert!(!o.status.success() && err.starts_with("ferry: ferry://127.0.0.1:1") && err.lines().count() == 1, "{err}");
}

/// A sync cut off in the middle of a file, either way, leaves the older
/// copy under the real name intact (the new one goes under a temporary
/// name, renamed only once whole) and says so with a non-zero exit.
#[test]
fn an_interrupted_sync_keeps_the_older_file() {
    let srv = Server::start(&[]);
    let tmp = TempDir::new("sync-cut");
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("big"), common::random_bytes(32 << 20, 3)).unwrap();
    std::fs::create_dir(srv.export.path().join("d")).unwrap();
    std::fs::write(srv.export.path().join("d/big"), b"old contents").unwrap();
    let run = |port: u16, args: [&str; 2]| {
        Command::new(common::FERRY)
            .arg("sync")
            .args(args.map(|a| a.replace("PORT", &port.to_string())))
            .env("FERRY_TOKEN_FILE", &srv.token_file)
            // No reconnecting, and over TCP: the first cut ends the sync.
            .env("FERRY_RECONNECT", "0")
            .env("FERRY_SAME_HOST", "0")
            .output()
            .unwrap()
    };
    // Upload: the proxy cuts after 8 MiB went to the server.
    let up = common::proxy::Proxy::cutting(srv.addr(), 8 << 20, usize::MAX);
    let o = run(up.port, [s(&src), "ferry://127.0.0.1:PORT/d"]);
    assert!(!o.status.success(), "the sync cannot have succeeded through the cut");
    assert!(stderr(&o).contains("d/big"), "{}", stderr(&o));
    assert_eq!(std::fs::read(srv.export.path().join("d/big")).unwrap(), b"old contents");

    // Download: cut after 8 MiB came back; nothing left but the old file.
    let local = tmp.path().join("local");
    std::fs::create_dir(&local).unwrap();
    std::fs::write(local.join("big"), b"older here").unwrap();
    std::fs::write(srv.export.path().join("d/big"), common::random_bytes(32 << 20, 4)).unwrap();
    let down = common::proxy::Proxy::cutting(srv.addr(), usize::MAX, 8 << 20);
    let o = run(down.port, ["ferry://127.0.0.1:PORT/d", s(&local)]);
    assert!(!o.status.success(), "the sync cannot have succeeded through the cut");
    let names: Vec<_> = std::fs::read_dir(&local).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["big"], "a temporary file was left behind: {}", stderr(&o));
    assert_eq!(std::fs::read(local.join("big")).unwrap(), b"older here");

    // The temporary file the cut upload may have left on the server is
    // neither copied (above) nor kept by a --delete sync run whole.
    ok(&srv.ferry(&["sync", "--delete", s(&src), &srv.url("/d")]));
    let names: Vec<_> =
        std::fs::read_dir(srv.export.path().join("d")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["big"]);
    assert!(std::fs::read(srv.export.path().join("d/big")).unwrap() == std::fs::read(src.join("big")).unwrap());
}
