//! The CLI behaves like the tools users know: ls -l with names, -h sizes,
//! -R, -n; rm -f; du and df as coreutils print them (checked against
//! coreutils on the exported directory itself); errors without internals.

mod common;

use std::process::Command;

use common::{stderr, stdout, Server};

fn ok(o: &std::process::Output) -> String {
    assert!(o.status.success(), "{}", stderr(o));
    stdout(o)
}

/// A tree: a 10,241-byte file, a hard link to it below, a file of nobody's.
fn populate(srv: &Server) {
    let e = srv.export.path();
    std::fs::create_dir_all(e.join("sub/deep")).unwrap();
    std::fs::write(e.join("big"), vec![7u8; 10241]).unwrap();
    std::fs::hard_link(e.join("big"), e.join("sub/hard")).unwrap();
    std::fs::write(e.join("sub/deep/f"), b"x\n").unwrap();
    rustix::fs::chown(
        e.join("sub/deep/f").as_path(),
        Some(rustix::fs::Uid::from_raw(65534)),
        Some(rustix::fs::Gid::from_raw(65534)),
    )
    .unwrap();
}

fn local(args: &[&str]) -> String {
    let o = Command::new(args[0]).args(&args[1..]).output().unwrap();
    ok(&o)
}

#[test]
fn ls_shows_names_human_sizes_and_recurses() {
    let srv = Server::start(&[]);
    populate(&srv);
    // -lh is long with human sizes, not help.
    let out = ok(&srv.ferry(&["ls", "-lh", &srv.url("/")]));
    let big = out.lines().find(|l| l.ends_with(" big")).unwrap_or_else(|| panic!("{out}"));
    let fields: Vec<&str> = big.split_whitespace().collect();
    assert_eq!(&fields[2..5], ["root", "root", "11K"], "{big}");
    // Names as this machine's ls names the same ids.
    let nobody = local(&["ls", "-l", srv.export.path().join("sub/deep/f").to_str().unwrap()]);
    let want: Vec<&str> = nobody.split_whitespace().skip(2).take(2).collect();
    let out = ok(&srv.ferry(&["ls", "-l", &srv.url("/sub/deep")]));
    let got: Vec<&str> = out.split_whitespace().skip(2).take(2).collect();
    assert_eq!(got, want, "{out}");
    // -n: numbers.
    let out = ok(&srv.ferry(&["ls", "-n", &srv.url("/sub/deep")]));
    assert_eq!(out.split_whitespace().skip(2).take(2).collect::<Vec<_>>(), ["65534", "65534"], "{out}");
    // -R: every directory below, with its header, depth first.
    let out = ok(&srv.ferry(&["ls", "-R", &srv.url("/")]));
    let u = srv.url("/");
    assert_eq!(out, format!("{u}:\nbig\nsub\n\n{u}sub:\ndeep\nhard\n\n{u}sub/deep:\nf\n"));
    // --help still helps.
    assert!(ok(&srv.ferry(&["ls", "--help"])).contains("-R, --recursive"));
}

#[test]
fn du_and_df_agree_with_coreutils_on_the_export() {
    let srv = Server::start(&[]);
    populate(&srv);
    let e = srv.export.path().to_str().unwrap().to_string();
    let u = srv.url("/");
    // du: per directory, 1K blocks, each inode once.
    let want: Vec<String> =
        local(&["du", "-k", &e]).lines().map(|l| l.split('\t').next().unwrap().to_string()).collect();
    let got: Vec<String> =
        ok(&srv.ferry(&["du", &u])).lines().map(|l| l.split('\t').next().unwrap().to_string()).collect();
    assert_eq!(got, want);
    let want_s = local(&["du", "-sh", &e]);
    let got_s = ok(&srv.ferry(&["du", "-sh", &u]));
    assert_eq!(got_s.split('\t').next(), want_s.split('\t').next());
    // df: the size of the export's file system, as df gives it.
    let want = local(&["df", "-k", "--output=size", &e]);
    let want = want.lines().nth(1).unwrap().trim();
    let got = ok(&srv.ferry(&["df", &u]));
    let row: Vec<&str> = got.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[1], want, "{got}");
    assert!(ok(&srv.ferry(&["df", "-h", &u])).lines().next().unwrap().contains("Size"));
}

#[test]
fn rm_f_and_errors_say_what_users_need() {
    let srv = Server::start(&[]);
    let gone = srv.url("/not-here");
    // rm -f: nothing there is no error; without -f it is.
    assert!(srv.ferry(&["rm", "-f", &gone]).status.success());
    let o = srv.ferry(&["rm", &gone]);
    assert!(!o.status.success());
    assert_eq!(stderr(&o), format!("ferry: {gone}: No such file or directory\n"));
    // cache set without a policy: says what to give, no Rust debug output.
    let o = srv.ferry(&["cache", "set", &srv.url("/")]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(!err.contains("None") && err.contains("POLICY"), "{err}");
    // No "(os error 2)" anywhere: a missing export, a missing token file.
    for args in [
        vec!["serve", "/nonexistent-export", "--no-auth", "--no-state"],
        vec!["--token-file", "/nonexistent-token", "ls", &gone],
    ] {
        let o = srv.ferry(&args);
        let err = stderr(&o);
        assert!(!o.status.success() && err.contains("No such file or directory") && !err.contains("os error"), "{err}");
    }
    // A missing local source: no "(os error 2)".
    let o = srv.ferry(&["cp", "/nonexistent/file", &srv.url("/x")]);
    let err = stderr(&o);
    assert!(!o.status.success() && err.contains("No such file or directory") && !err.contains("os error"), "{err}");
}

/// (mode, mtime seconds, uid, symlink target) of everything under `root`,
/// by relative path.
fn tree(root: &std::path::Path) -> Vec<(String, u32, i64, u32, Option<String>)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        let rel = p.strip_prefix(root).unwrap().display().to_string();
        let link = m.file_type().is_symlink().then(|| std::fs::read_link(&p).unwrap().display().to_string());
        let mtime = if m.file_type().is_symlink() { 0 } else { m.mtime() };
        out.push((rel, m.mode(), mtime, m.uid(), link));
        if m.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn cp_a_keeps_modes_times_owners_and_links_both_ways() {
    use std::os::unix::fs::PermissionsExt;
    let srv = Server::start(&[]);
    let tmp = common::TempDir::new("cpa");
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("private")).unwrap();
    std::fs::write(src.join("private/f"), b"secret\n").unwrap();
    std::fs::write(src.join("tool"), b"#!/bin/sh\n").unwrap();
    std::os::unix::fs::symlink("private/f", src.join("link")).unwrap();
    std::os::unix::fs::symlink("/nowhere", src.join("dangling")).unwrap();
    std::fs::set_permissions(src.join("private/f"), std::fs::Permissions::from_mode(0o640)).unwrap();
    std::fs::set_permissions(src.join("tool"), std::fs::Permissions::from_mode(0o4750)).unwrap();
    rustix::fs::chown(src.join("tool").as_path(), Some(rustix::fs::Uid::from_raw(65534)), None).unwrap();
    std::fs::set_permissions(src.join("tool"), std::fs::Permissions::from_mode(0o4750)).unwrap();
    std::fs::set_permissions(src.join("private"), std::fs::Permissions::from_mode(0o700)).unwrap();
    for (p, t) in
        [("private/f", "200101011200"), ("tool", "199912312359"), ("private", "201005050505"), ("", "201111111111")]
    {
        assert!(Command::new("touch").args(["-h", "-t", t]).arg(src.join(p)).status().unwrap().success());
    }
    let want = tree(&src);
    ok(&srv.ferry(&["cp", "-a", src.to_str().unwrap(), &srv.url("/copy")]));
    assert_eq!(tree(&srv.export.path().join("copy")), want, "local -> remote");
    let back = tmp.path().join("back");
    ok(&srv.ferry(&["cp", "-a", &srv.url("/copy"), back.to_str().unwrap()]));
    assert_eq!(tree(&back), want, "remote -> local");
    // -p on one file: mode and time, the link followed (it is not -a).
    ok(&srv.ferry(&["cp", "-p", src.join("link").to_str().unwrap(), &srv.url("/one")]));
    let (m1, m2) =
        (std::fs::metadata(src.join("private/f")).unwrap(), std::fs::metadata(srv.export.path().join("one")).unwrap());
    use std::os::unix::fs::MetadataExt;
    assert_eq!((m2.mode(), m2.mtime()), (m1.mode(), m1.mtime()));
    // Without -p a copy is new: its time is now.
    ok(&srv.ferry(&["cp", src.join("tool").to_str().unwrap(), &srv.url("/plain")]));
    assert!(std::fs::metadata(srv.export.path().join("plain")).unwrap().mtime() > 1_700_000_000);
}
