//! Programs that make many small files (`tar x`, `git clone`, `cp -r`) on
//! the default mount: what each file costs in requests to the server, and
//! that what the mount answers itself is what the server holds.
//!
//! The mount answers a lookup of a missing name itself in a directory it
//! made under a lease (it knows every name there: another client's would
//! have broken the lease), and a `getattr` of a file it backs with the
//! server's descriptor (on the server's host) from that descriptor.

mod common;

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::scrape::get;
use common::{Server, TempDir};
use ferry_client::Target;

/// A free port on 127.0.0.1 for the mount's `--metrics` (the mount's
/// stderr, which says the port it picked, is not kept by the helper).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The mount's requests to its server so far, by operation.
fn requests(addr: &str) -> Vec<(String, f64)> {
    let text = get(addr, "/metrics").1;
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("ferry_client_requests_total{op=\"")?;
            let (op, n) = rest.split_once("\"} ")?;
            Some((op.to_string(), n.parse().ok()?))
        })
        .collect()
}

fn count(reqs: &[(String, f64)], op: &str) -> f64 {
    reqs.iter().find(|(o, _)| o == op).map_or(0.0, |(_, n)| *n)
}

fn total(reqs: &[(String, f64)]) -> f64 {
    reqs.iter().map(|(_, n)| n).sum()
}

/// A mount of `srv` with its metrics on a port of its own; the address.
fn mount_with_metrics(srv: &Server, mp: &Path) -> (common::fuse::Mounted, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let m = common::fuse::mount_url(&srv.url("/"), mp, &srv.token_file, &["--metrics", &addr]);
    let up = common::fuse::wait_for(Duration::from_secs(10), || std::net::TcpStream::connect(&addr).is_ok());
    assert!(up, "the mount's metrics did not come up at {addr}");
    (m, addr)
}

fn watching(srv: &Server) {
    let w = common::fuse::wait_for(Duration::from_secs(10), || srv.log().contains("watching"));
    assert!(w, "the server watches its export (leases kept long): {}", srv.log());
}

/// `dirs` directories of `files` files each, modes and mtimes of their
/// own, on the local disk; the tarball of them.
fn source(at: &Path, dirs: usize, files: usize) -> std::path::PathBuf {
    let src = at.join("src");
    for d in 0..dirs {
        let dir = src.join(format!("d{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..files {
            let p = dir.join(format!("f{i:03}"));
            std::fs::write(&p, format!("file {i} of {d}\n").repeat(1 + i % 40)).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode([0o644, 0o600, 0o755, 0o640][i % 4])).unwrap();
            let t = libc::timespec { tv_sec: 1_600_000_000 + (d * 1000 + i) as i64, tv_nsec: 0 };
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a valid NUL-terminated path and two valid timespecs.
            assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), [t, t].as_ptr(), 0) }, 0);
        }
    }
    let tar = at.join("src.tar");
    let st = Command::new("tar").arg("cf").arg(&tar).arg("-C").arg(&src).arg(".").status().expect("tar");
    assert!(st.success());
    tar
}

/// What `tar x` made, as the server's disk holds it: each file's
/// contents, mode, owner and mtime, against the source.
fn same_tree(src: &Path, made: &Path) -> Vec<String> {
    let mut bad = Vec::new();
    for d in std::fs::read_dir(src).unwrap() {
        let d = d.unwrap();
        for f in std::fs::read_dir(d.path()).unwrap() {
            let f = f.unwrap();
            let rel = f.path().strip_prefix(src).unwrap().to_path_buf();
            let (want, got) = (f.metadata().unwrap(), std::fs::symlink_metadata(made.join(&rel)));
            let Ok(got) = got else {
                bad.push(format!("{}: missing", rel.display()));
                continue;
            };
            let w = (want.mode(), want.uid(), want.gid(), want.mtime(), want.len());
            let g = (got.mode(), got.uid(), got.gid(), got.mtime(), got.len());
            if w != g || std::fs::read(f.path()).unwrap() != std::fs::read(made.join(&rel)).unwrap() {
                bad.push(format!("{}: {w:?} made as {g:?}", rel.display()));
            }
        }
    }
    bad
}

/// `tar x` of 120 files into the mount: each file costs at most the
/// create, its backing descriptor, the three attribute changes tar makes
/// (mode, owner, times) and the close — no lookup of the name before its
/// create, no `stat` before the `chown` (the old mount sent 2 `Stat`s per
/// file). What it made is what a second mount and the server's disk see,
/// at once.
#[test]
fn tar_x_sends_no_lookup_or_stat_per_file() {
    common::fuse::require_fuse();
    let srv = Server::start(&[]);
    watching(&srv);
    let work = TempDir::new("tarsrc");
    let (dirs, files) = (3, 40);
    let tar = source(work.path(), dirs, files);
    let (m1, m2) = (TempDir::new("m1"), TempDir::new("m2"));
    let _g1 = common::fuse::Detach(m1.path().to_path_buf());
    let _g2 = common::fuse::Detach(m2.path().to_path_buf());
    let (_a, addr) = mount_with_metrics(&srv, m1.path());
    let _b = common::fuse::mount_url(&srv.url("/"), m2.path(), &srv.token_file, &[]);
    // The second mount looks first, so it holds what it saw.
    assert!(std::fs::symlink_metadata(m2.path().join("x")).is_err());

    let before = requests(&addr);
    let o = Command::new("timeout")
        .args(["120", "sh", "-c", "mkdir \"$1\" && tar xf \"$2\" -C \"$1\"", "sh"])
        .arg(m1.path().join("x"))
        .arg(&tar)
        .output()
        .expect("tar");
    assert!(o.status.success(), "tar x: {}", String::from_utf8_lossy(&o.stderr));
    let after = requests(&addr);
    let diff: Vec<(String, f64)> = after.iter().map(|(op, n)| (op.clone(), n - count(&before, op))).collect();
    let n = (dirs * files) as f64;
    let shown: Vec<String> = diff.iter().filter(|(_, d)| *d > 0.0).map(|(op, d)| format!("{op}={d}")).collect();
    let (stats, all) = (count(&diff, "stat"), total(&diff));
    // The old mount: 2 per file (the lookup before the create, the
    // getattr before the chown). A file with an execute bit (a quarter
    // here) is written through the daemon, not backed: its getattr still
    // asks the server; and a `chmod`, `chown` or `utimens` whose reply
    // came behind a break (a grant refused while the file's descriptor is
    // lent for writing) is not kept by the kernel at all, so the next
    // look at that file asks again (about 75 of 120 then, against 245).
    assert!(stats <= n * 0.75, "{stats} stats for {n} files (lookups or getattrs asked of the server): {shown:?}");
    // Create, descriptor (not for a new executable), chmod, chown,
    // utimens, close, and what the kernel asks of a capability now and
    // then; the old mount sent 8.4 per file.
    assert!(all <= 7.0 * n, "{all} requests for {n} files: {shown:?}");

    let disk = srv.export.path().join("x");
    let src = work.path().join("src");
    let bad = same_tree(&src, &disk);
    assert!(bad.is_empty(), "the server's disk:\n{}", bad.join("\n"));
    let bad = same_tree(&src, &m1.path().join("x"));
    assert!(bad.is_empty(), "the mount that made them:\n{}", bad.join("\n"));
    let bad = same_tree(&src, &m2.path().join("x"));
    assert!(bad.is_empty(), "another mount:\n{}", bad.join("\n"));
}

/// A directory the mount made: names it did not make are answered missing
/// without the server, until another client makes one — which the mount
/// then sees at once (the directory's lease broke before that create was
/// acknowledged), by lookup and in a listing; names the mount made itself
/// are there. Also after a rename into it and a removal from it.
#[test]
fn a_directory_the_mount_made_knows_its_names_until_another_client_adds_one() {
    common::fuse::require_fuse();
    let srv = Server::start(&[]);
    watching(&srv);
    let m1 = TempDir::new("m1");
    let _g1 = common::fuse::Detach(m1.path().to_path_buf());
    let (_a, addr) = mount_with_metrics(&srv, m1.path());
    let c = srv.client();
    let mut stale = Vec::new();
    let mut asked_rounds = 0;
    for round in 0..60 {
        let dir = m1.path().join(format!("d{round}"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("mine"), b"m").unwrap();
        std::fs::create_dir(dir.join("sub")).unwrap();
        let stats = count(&requests(&addr), "stat");
        for name in ["theirs", "other", "more"] {
            if std::fs::symlink_metadata(dir.join(name)).is_ok() {
                stale.push(format!("round {round}: {name} seen before anyone made it"));
            }
        }
        // A lease that lapsed on a loaded machine (or a break while the
        // directory was made) sends the mount to the server again: safe,
        // and rare. The old mount asked in every round.
        if count(&requests(&addr), "stat") > stats {
            asked_rounds += 1;
        }
        // Another client makes a name there; the mount looks at once.
        let p = format!("/d{round}/theirs");
        match round % 3 {
            0 => c.write(&p, b"theirs").unwrap(),
            1 => {
                c.create_dir(&p, 0o755).unwrap();
            }
            _ => {
                c.write(format!("/d{round}/sub/moved"), b"t").unwrap();
                c.rename(format!("/d{round}/sub/moved"), &p).unwrap();
            }
        }
        if std::fs::symlink_metadata(dir.join("theirs")).is_err() {
            stale.push(format!("round {round}: another client's name not seen"));
        }
        let listed: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        if !listed.iter().any(|n| n == "theirs") || !listed.iter().any(|n| n == "mine") {
            stale.push(format!("round {round}: listed {listed:?}"));
        }
        if std::fs::read(dir.join("mine")).ok().as_deref() != Some(&b"m"[..]) {
            stale.push(format!("round {round}: the mount's own file not read back"));
        }
        // The mount's own changes in a directory it made: a rename in, a
        // removal, a hard link; each name as the server has it.
        let fresh = m1.path().join(format!("d{round}b"));
        std::fs::create_dir(&fresh).unwrap();
        std::fs::rename(dir.join("mine"), fresh.join("in")).unwrap();
        std::fs::hard_link(fresh.join("in"), fresh.join("link")).unwrap();
        std::fs::remove_file(fresh.join("in")).unwrap();
        for (name, want) in [("in", false), ("link", true), ("mine", false)] {
            if std::fs::symlink_metadata(fresh.join(name)).is_ok() != want {
                stale.push(format!("round {round}: {name} in a made directory: want present={want}"));
            }
        }
        if std::fs::symlink_metadata(dir.join("mine")).is_ok() {
            stale.push(format!("round {round}: a name renamed away still seen"));
        }
        // Another client removes what the mount made there.
        c.remove_file(format!("/d{round}b/link")).unwrap();
        if std::fs::symlink_metadata(fresh.join("link")).is_ok() {
            stale.push(format!("round {round}: a name another client removed still seen"));
        }
    }
    assert!(stale.is_empty(), "{} stale answers:\n{}", stale.len(), stale[..stale.len().min(20)].join("\n"));
    assert!(asked_rounds <= 15, "misses in directories the mount made asked the server in {asked_rounds} of 60 rounds");
}

/// A file the mount writes through the server's descriptor (on the
/// server's host): `fstat` while it is open answers what the server's file
/// holds — its size after the writes, and a mode another client set — with
/// no `Stat` sent, as `chown` makes the kernel ask.
#[test]
fn a_backed_file_answers_its_attributes_from_the_servers_file() {
    common::fuse::require_fuse();
    let srv = Server::start(&[]);
    watching(&srv);
    let m1 = TempDir::new("m1");
    let _g1 = common::fuse::Detach(m1.path().to_path_buf());
    let (_a, addr) = mount_with_metrics(&srv, m1.path());
    let c = srv.client();
    for round in 0..20 {
        let p = m1.path().join(format!("f{round}"));
        let mut f = std::fs::File::create(&p).unwrap();
        let data = vec![b'x'; 1000 + round * 100];
        f.write_all(&data).unwrap();
        let before = count(&requests(&addr), "stat");
        // chown makes the kernel refresh the attributes first.
        std::os::unix::fs::fchown(&f, Some(0), Some(0)).unwrap();
        let m = f.metadata().unwrap();
        assert_eq!(m.len(), data.len() as u64, "round {round}: size while written");
        assert_eq!(count(&requests(&addr), "stat") - before, 0.0, "round {round}: a stat asked of the server");
        // Another client changes its mode: the open file sees it.
        c.set_permissions(Target::Path(format!("/f{round}").as_bytes()), 0o600).unwrap();
        assert_eq!(f.metadata().unwrap().mode() & 0o7777, 0o600, "round {round}: another client's chmod");
        f.write_all(b"more").unwrap();
        assert_eq!(f.metadata().unwrap().len(), data.len() as u64 + 4, "round {round}: size after more");
        drop(f);
        let disk = std::fs::metadata(srv.export.path().join(format!("f{round}"))).unwrap();
        assert_eq!((disk.len(), disk.mode() & 0o7777), (data.len() as u64 + 4, 0o600));
    }
}

/// The mount renames a directory (the server then breaks every other
/// session's leases, not the mount's own): what the mount keeps under its
/// leases must still be broken by the next change another client makes —
/// a name in a directory the mount made, and a miss it keeps in a
/// directory it did not make. (The server used to forget the changer's
/// own leases with everyone else's, so those changes broke nothing.)
#[test]
fn after_the_mount_renames_a_directory_another_clients_change_still_breaks_its_leases() {
    common::fuse::require_fuse();
    let srv = Server::start(&[]);
    watching(&srv);
    let m1 = TempDir::new("m1");
    let _g1 = common::fuse::Detach(m1.path().to_path_buf());
    let _a = common::fuse::mount_url(&srv.url("/"), m1.path(), &srv.token_file, &[]);
    let c = srv.client();
    let mut stale = Vec::new();
    for round in 0..20 {
        let made = m1.path().join(format!("made{round}"));
        std::fs::create_dir(&made).unwrap();
        std::fs::create_dir(made.join("sub")).unwrap();
        c.create_dir(format!("/theirs{round}"), 0o755).unwrap();
        let theirs = m1.path().join(format!("theirs{round}"));
        for p in [made.join("x"), theirs.join("x")] {
            assert!(std::fs::symlink_metadata(&p).is_err(), "round {round}: {} before it was made", p.display());
        }
        std::fs::rename(made.join("sub"), made.join("sub2")).unwrap();
        c.write(format!("/made{round}/x"), b"x").unwrap();
        c.write(format!("/theirs{round}/x"), b"x").unwrap();
        for p in [made.join("x"), theirs.join("x")] {
            if std::fs::symlink_metadata(&p).is_err() {
                stale.push(format!("round {round}: {} not seen", p.display()));
            }
        }
    }
    assert!(stale.is_empty(), "{} stale answers:\n{}", stale.len(), stale.join("\n"));
}

/// Files and directories the mount made are found and `stat`ed again
/// without the server once the plain 1 s timeouts have passed (the kernel
/// keeps the names and attributes a `create` or `mkdir` made for the
/// lease's time, as it keeps a lookup's answer): `stat` and a read of each
/// ask the server to open, not to `stat` each name (`git clone` reads back
/// every object it wrote). And another client's `chmod` of one of them, a
/// rename over one, or a removal is seen at once.
#[test]
fn names_the_mount_made_are_kept_past_the_plain_timeout_and_still_follow_other_clients() {
    common::fuse::require_fuse();
    let srv = Server::start(&[]);
    watching(&srv);
    let m1 = TempDir::new("m1");
    let _g1 = common::fuse::Detach(m1.path().to_path_buf());
    let (_a, addr) = mount_with_metrics(&srv, m1.path());
    let n = 40;
    let top = m1.path().join("made");
    std::fs::create_dir(&top).unwrap();
    for i in 0..n {
        let d = top.join(format!("d{i}"));
        std::fs::create_dir(&d).unwrap();
        // Empty (a write makes the kernel ask for the size and times
        // again, as it would after any write), and executable: a file made
        // so is never backed by the server's descriptor on its host, whose
        // attributes the mount does not keep (it is written past the
        // server), so the test is the same on the server's host and off it.
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o755).open(d.join("f")).unwrap();
    }
    // Past the plain entry timeout (1 s).
    std::thread::sleep(Duration::from_millis(1500));
    let before = requests(&addr);
    for i in 0..n {
        let md = std::fs::metadata(top.join(format!("d{i}/f"))).unwrap();
        assert!(md.is_file() && md.len() == 0 && md.mode() & 0o777 == 0o755, "d{i}/f: {md:?}");
    }
    let after = requests(&addr);
    let stats = count(&after, "stat") - count(&before, "stat");
    // Before: a lookup of each directory and each file, each a `Stat` (80
    // here). A lease that lapsed on a loaded machine sends some to the
    // server: allowed, a few.
    assert!(stats <= n as f64 / 4.0, "{stats} stats to stat {n} files the mount made 1.5 s before");

    // Another client changes a file's mode, renames a file over a name
    // or removes one: the mount sees each at once.
    let c = srv.client();
    let mut stale = Vec::new();
    for i in 0..n {
        let (d, f) = (top.join(format!("d{i}")), top.join(format!("d{i}/f")));
        if i % 3 == 0 {
            c.set_permissions(Target::Path(format!("/made/d{i}/f").as_bytes()), 0o600).unwrap();
            let mode = std::fs::metadata(&f).map(|m| m.mode() & 0o7777);
            if mode.as_ref().ok() != Some(&0o600) {
                stale.push(format!("d{i}/f chmodded 600 by another client: mode {mode:?}"));
            }
        } else if i % 3 == 1 {
            c.write(format!("/made/d{i}/new"), format!("theirs {i}").as_bytes()).unwrap();
            c.rename(format!("/made/d{i}/new"), format!("/made/d{i}/f")).unwrap();
            match std::fs::read(&f) {
                Ok(b) if b == format!("theirs {i}").as_bytes() => {}
                other => stale.push(format!("d{i}/f renamed over: read {other:?}")),
            }
        } else {
            c.remove_file(format!("/made/d{i}/f")).unwrap();
            c.remove_dir(format!("/made/d{i}")).unwrap();
            if std::fs::symlink_metadata(&f).is_ok() || std::fs::symlink_metadata(&d).is_ok() {
                stale.push(format!("d{i} removed by another client still seen"));
            }
        }
    }
    assert!(stale.is_empty(), "{} stale answers:\n{}", stale.len(), stale.join("\n"));
}
