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
    // A missing local source: no "(os error 2)".
    let o = srv.ferry(&["cp", "/nonexistent/file", &srv.url("/x")]);
    let err = stderr(&o);
    assert!(!o.status.success() && err.contains("No such file or directory") && !err.contains("os error"), "{err}");
}
