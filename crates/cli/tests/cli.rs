//! End-to-end tests of the `ferry` command against a real `ferry serve`:
//! every file command, its output, and the one-line errors it prints.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use common::{random_bytes, stderr, stdout, Server, TempDir, FERRY};
use ferry_client::{OpenOptions, Target, Time};

/// Asserts success and returns stdout.
#[track_caller]
fn ok(o: &Output) -> String {
    assert!(o.status.success(), "ferry failed ({:?}); stderr: {}", o.status, stderr(o));
    stdout(o)
}

/// Asserts a non-zero exit with exactly one line on stderr, and returns it.
#[track_caller]
fn fails(o: &Output) -> String {
    assert!(!o.status.success(), "ferry unexpectedly succeeded; stdout: {}", stdout(o));
    assert_ne!(o.status.code(), Some(0));
    let e = stderr(o);
    let lines: Vec<&str> = e.lines().collect();
    assert_eq!(lines.len(), 1, "expected exactly one line on stderr, got {e:?}");
    assert!(e.ends_with('\n'), "stderr line not terminated: {e:?}");
    lines[0].to_string()
}

/// Asserts a failure whose single stderr line is exactly `line`.
#[track_caller]
fn fails_with(o: &Output, line: &str) {
    assert_eq!(fails(o), line);
}

fn enoent(server: &Server, path: &str) -> String {
    format!("ferry: {}: No such file or directory", server.url(path))
}

/// Writes a file in the server's export directly.
fn put(server: &Server, rel: &str, data: &[u8]) {
    let p = server.export.path().join(rel.trim_start_matches('/'));
    std::fs::write(&p, data).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
}

fn exported(server: &Server, rel: &str) -> std::path::PathBuf {
    server.export.path().join(rel.trim_start_matches('/'))
}

/// Compares two trees: same names, same kinds, same bytes.
fn assert_same_tree(a: &Path, b: &Path) {
    let ma = std::fs::metadata(a).unwrap_or_else(|e| panic!("{}: {e}", a.display()));
    let mb = std::fs::metadata(b).unwrap_or_else(|e| panic!("{}: {e}", b.display()));
    assert_eq!(ma.is_dir(), mb.is_dir(), "{} vs {}", a.display(), b.display());
    if ma.is_dir() {
        // Names compared as the bytes they are, not always UTF-8.
        let names = |p: &Path| {
            let mut v: Vec<std::ffi::OsString> =
                std::fs::read_dir(p).unwrap().map(|e| e.unwrap().file_name()).collect();
            v.sort();
            v
        };
        let (na, nb) = (names(a), names(b));
        assert_eq!(na, nb, "entries of {} vs {}", a.display(), b.display());
        for n in na {
            assert_same_tree(&a.join(&n), &b.join(&n));
        }
    } else {
        assert!(ma.is_file() && mb.is_file());
        assert_eq!(ma.len(), mb.len(), "size of {} vs {}", a.display(), b.display());
        let (da, db) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
        assert!(da == db, "contents of {} and {} differ", a.display(), b.display());
    }
}

/// Kills (by PID) and reaps a child this test started.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `ferry serve EXPORT --listen 127.0.0.1:0 --token-file TF`; returns
/// the child (killed on drop) and the exact first line of its stdout.
fn spawn_serve(export: &Path, token_file: &Path) -> (Reap, String) {
    let mut child = Command::new(FERRY)
        .arg("serve")
        .arg(export)
        .args(["--listen", "127.0.0.1:0", "--no-root-squash", "--token-file"])
        .arg(token_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ferry serve");
    let out = child.stdout.take().expect("stdout");
    let child = Reap(child);
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).expect("read first line");
    (child, line)
}

/// The port from a `listening on 127.0.0.1:PORT` line.
fn port_of(line: &str) -> u16 {
    line.trim()
        .strip_prefix("listening on 127.0.0.1:")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
}

/// A port on 127.0.0.1 nobody listens on (bound then released).
fn dead_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Runs `ferry ARGS` with no token anywhere but `token` in FERRY_TOKEN.
fn ferry_with_token(home: &Path, token: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(FERRY);
    // A server not there is waited for (`FERRY_RECONNECT`, a minute by
    // default): these tests want the answer a moment later.
    cmd.args(args)
        .env("FERRY_RECONNECT", "0.3")
        .env_remove("FERRY_TOKEN_FILE")
        .env_remove("FERRY_TOKEN")
        .env_remove("XDG_CONFIG_HOME")
        .env("HOME", home);
    if let Some(t) = token {
        cmd.env("FERRY_TOKEN", t);
    }
    cmd.output().expect("run ferry")
}

// ---------------------------------------------------------------- serve

#[test]
fn serve_prints_listening_line_and_creates_private_token() {
    let export = TempDir::new("serve-export");
    let state = TempDir::new("serve-state");
    let tf = state.path().join("sub/dir/token");
    let (child, line) = spawn_serve(export.path(), &tf);
    let port = line
        .strip_prefix("listening on 127.0.0.1:")
        .and_then(|r| r.strip_suffix('\n'))
        .unwrap_or_else(|| panic!("first line {line:?} is not `listening on 127.0.0.1:PORT`"));
    assert!(port.bytes().all(|b| b.is_ascii_digit()), "port {port:?}");
    let port: u16 = port.parse().unwrap();
    assert_ne!(port, 0);

    let meta = std::fs::metadata(&tf).expect("token file created");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "token file mode");
    let token = std::fs::read_to_string(&tf).unwrap();
    let t = token.trim();
    assert!(t.len() >= 32 && t.bytes().all(|b| b.is_ascii_hexdigit()), "token {token:?}");

    // And it serves with that token.
    std::fs::write(export.path().join("x"), b"hi").unwrap();
    let home = TempDir::new("serve-home");
    let o = ferry_with_token(home.path(), Some(t), &["cat", &format!("ferry://127.0.0.1:{port}/x")]);
    assert_eq!(ok(&o), "hi");
    drop(child);
}

#[test]
fn serve_uses_an_existing_token_file() {
    let export = TempDir::new("serve-export");
    let state = TempDir::new("serve-state");
    let tf = state.path().join("token");
    std::fs::write(&tf, "  my-own-secret\n").unwrap();
    let (_child, line) = spawn_serve(export.path(), &tf);
    let port = port_of(&line);
    assert_eq!(std::fs::read_to_string(&tf).unwrap(), "  my-own-secret\n", "token file must not be rewritten");
    std::fs::write(export.path().join("x"), b"hello").unwrap();
    let home = TempDir::new("serve-home");
    let url = format!("ferry://127.0.0.1:{port}/x");
    assert_eq!(ok(&ferry_with_token(home.path(), Some("my-own-secret"), &["cat", &url])), "hello");
    let o = ferry_with_token(home.path(), Some("other"), &["cat", &url]);
    assert!(fails(&o).contains("authentication failed"));
}

#[test]
fn harness_token_file_is_created_0600() {
    let server = Server::start(&[]);
    let mode = std::fs::metadata(&server.token_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

// ---------------------------------------------------------------- cp

#[test]
fn cp_local_to_remote_and_back() {
    let server = Server::start(&[]);
    let local = TempDir::new("cp-local");
    let data = random_bytes(3 * 1024 * 1024 + 17, 1);
    let src = local.path().join("src.bin");
    std::fs::write(&src, &data).unwrap();

    ok(&server.ferry(&["cp", src.to_str().unwrap(), &server.url("/up.bin")]));
    assert!(std::fs::read(exported(&server, "/up.bin")).unwrap() == data, "uploaded bytes differ");

    let back = local.path().join("back.bin");
    ok(&server.ferry(&["cp", &server.url("/up.bin"), back.to_str().unwrap()]));
    assert!(std::fs::read(&back).unwrap() == data, "downloaded bytes differ");

    // Overwriting an existing, longer file truncates it.
    let small = local.path().join("small");
    std::fs::write(&small, b"tiny").unwrap();
    ok(&server.ferry(&["cp", small.to_str().unwrap(), &server.url("/up.bin")]));
    assert_eq!(std::fs::read(exported(&server, "/up.bin")).unwrap(), b"tiny");
    ok(&server.ferry(&["cp", &server.url("/up.bin"), back.to_str().unwrap()]));
    assert_eq!(std::fs::read(&back).unwrap(), b"tiny");
}

#[test]
fn cp_empty_file() {
    let server = Server::start(&[]);
    let local = TempDir::new("cp-empty");
    let src = local.path().join("empty");
    std::fs::write(&src, b"").unwrap();
    ok(&server.ferry(&["cp", src.to_str().unwrap(), &server.url("/empty")]));
    let m = std::fs::metadata(exported(&server, "/empty")).unwrap();
    assert!(m.is_file());
    assert_eq!(m.len(), 0);
    let back = local.path().join("back");
    ok(&server.ferry(&["cp", &server.url("/empty"), back.to_str().unwrap()]));
    assert_eq!(std::fs::metadata(&back).unwrap().len(), 0);
}

/// A destination that is not a plain file is written into, never
/// replaced, as cp(1) does: a character device (a copy of /dev/null made
/// here: `ferry cp URL /dev/null` once turned the real one into a regular
/// file), a symbolic link (its target gets the bytes), a file with another
/// hard link (both names see them); on the server too.
#[test]
fn cp_writes_into_devices_links_and_hard_links_instead_of_replacing_them() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let server = Server::start(&[]);
    put(&server, "/src", b"copied");
    let local = TempDir::new("cp-into");
    let null = local.path().join("null");
    let st = Command::new("mknod").arg(&null).args(["c", "1", "3"]).status().unwrap();
    assert!(st.success(), "mknod");
    ok(&server.ferry(&["cp", &server.url("/src"), null.to_str().unwrap()]));
    assert!(std::fs::symlink_metadata(&null).unwrap().file_type().is_char_device(), "the device was replaced");
    let target = local.path().join("target");
    std::fs::write(&target, b"old").unwrap();
    std::os::unix::fs::symlink(&target, local.path().join("link")).unwrap();
    ok(&server.ferry(&["cp", &server.url("/src"), local.path().join("link").to_str().unwrap()]));
    assert!(std::fs::symlink_metadata(local.path().join("link")).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read(&target).unwrap(), b"copied");
    std::fs::hard_link(&target, local.path().join("other")).unwrap();
    std::fs::write(local.path().join("up"), b"uploaded").unwrap();
    ok(&server.ferry(&["cp", &server.url("/src"), local.path().join("other").to_str().unwrap()]));
    assert_eq!(std::fs::metadata(&target).unwrap().nlink(), 2);
    // The server side: a symbolic link and a hard link there.
    std::os::unix::fs::symlink("src", exported(&server, "/rlink")).unwrap();
    std::fs::hard_link(exported(&server, "/src"), exported(&server, "/rhard")).unwrap();
    ok(&server.ferry(&["cp", local.path().join("up").to_str().unwrap(), &server.url("/rlink")]));
    assert!(std::fs::symlink_metadata(exported(&server, "/rlink")).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read(exported(&server, "/rhard")).unwrap(), b"uploaded");
}

#[test]
fn cp_remote_to_remote_same_and_other_server() {
    let a = Server::start(&[]);
    let data = random_bytes(1024 * 1024 + 3, 2);
    put(&a, "/orig", &data);
    ok(&a.ferry(&["cp", &a.url("/orig"), &a.url("/copy")]));
    assert!(std::fs::read(exported(&a, "/copy")).unwrap() == data);
    assert!(std::fs::read(exported(&a, "/orig")).unwrap() == data, "source must be intact");

    // Across two servers sharing one token file.
    let bexport = TempDir::new("r2r-export");
    let (_b, line) = spawn_serve(bexport.path(), &a.token_file);
    let burl = format!("ferry://127.0.0.1:{}/moved", port_of(&line));
    ok(&a.ferry(&["cp", &a.url("/orig"), &burl]));
    assert!(std::fs::read(bexport.path().join("moved")).unwrap() == data, "cross-server copy differs");
}

#[test]
fn cp_into_existing_remote_directory() {
    let server = Server::start(&[]);
    std::fs::create_dir(exported(&server, "/dir")).unwrap();
    let local = TempDir::new("cp-into");
    let src = local.path().join("file.txt");
    std::fs::write(&src, b"inside").unwrap();
    ok(&server.ferry(&["cp", src.to_str().unwrap(), &server.url("/dir")]));
    assert_eq!(std::fs::read(exported(&server, "/dir/file.txt")).unwrap(), b"inside");
    // With a trailing slash too.
    std::fs::write(&src, b"again").unwrap();
    ok(&server.ferry(&["cp", src.to_str().unwrap(), &server.url("/dir/")]));
    assert_eq!(std::fs::read(exported(&server, "/dir/file.txt")).unwrap(), b"again");
    // Remote to remote into a directory.
    ok(&server.ferry(&["cp", &server.url("/dir/file.txt"), &server.url("/")]));
    assert_eq!(std::fs::read(exported(&server, "/file.txt")).unwrap(), b"again");
    // Remote into an existing local directory.
    let ldir = local.path().join("ldir");
    std::fs::create_dir(&ldir).unwrap();
    ok(&server.ferry(&["cp", &server.url("/dir/file.txt"), ldir.to_str().unwrap()]));
    assert_eq!(std::fs::read(ldir.join("file.txt")).unwrap(), b"again");
}

#[test]
fn cp_recursive_tree_round_trip() {
    let server = Server::start(&[]);
    let local = TempDir::new("cp-tree");
    let tree = local.path().join("tree");
    std::fs::create_dir_all(tree.join("a/b/c")).unwrap();
    std::fs::create_dir_all(tree.join("empty_dir")).unwrap();
    std::fs::write(tree.join("empty_file"), b"").unwrap();
    std::fs::write(tree.join("a/small.txt"), b"small\n").unwrap();
    std::fs::write(tree.join("a/b/c/deep.bin"), random_bytes(70_001, 3)).unwrap();
    std::fs::write(tree.join("big.bin"), random_bytes(5 * 1024 * 1024, 4)).unwrap();
    for i in 0..20 {
        std::fs::write(tree.join(format!("a/b/n{i:02}")), random_bytes(i * 513, 100 + i as u64)).unwrap();
    }
    // A symlink to a file: cp follows it and copies the bytes.
    std::os::unix::fs::symlink("a/small.txt", tree.join("link")).unwrap();

    ok(&server.ferry(&["cp", "-r", tree.to_str().unwrap(), &server.url("/tree")]));
    let remote = exported(&server, "/tree");
    assert!(std::fs::symlink_metadata(remote.join("link")).unwrap().is_file(), "symlink copied as its target");
    assert_eq!(std::fs::read(remote.join("link")).unwrap(), b"small\n");
    assert!(std::fs::metadata(remote.join("empty_dir")).unwrap().is_dir());
    assert_same_tree(&tree, &remote);

    // Back down to a new local directory.
    let back = local.path().join("back");
    ok(&server.ferry(&["cp", "-r", &server.url("/tree"), back.to_str().unwrap()]));
    assert_same_tree(&tree, &back);

    // Remote to remote, recursively.
    ok(&server.ferry(&["cp", "-r", &server.url("/tree"), &server.url("/tree2")]));
    assert_same_tree(&tree, &exported(&server, "/tree2"));

    // Into an existing directory: lands inside it under its own name.
    std::fs::create_dir(exported(&server, "/into")).unwrap();
    ok(&server.ferry(&["cp", "-R", tree.to_str().unwrap(), &server.url("/into")]));
    assert_same_tree(&tree, &exported(&server, "/into/tree"));
}

/// `ferry` with arguments that need not be UTF-8 (local paths are bytes).
fn ferry_os(server: &Server, args: &[&std::ffi::OsStr]) -> Output {
    Command::new(FERRY)
        .args(args)
        .env("FERRY_TOKEN_FILE", &server.token_file)
        .env_remove("FERRY_TOKEN")
        .output()
        .expect("run ferry")
}

/// Names that are not UTF-8 (Latin-1 from an old archive, stray bytes) are
/// copied byte for byte both ways, also as the top directory given on the
/// command line; `ls` shows them lossily but lists them.
#[test]
fn cp_r_copies_non_utf8_names_faithfully() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let server = Server::start(&[]);
    let local = TempDir::new("cp-bytes");
    let tree = local.path().join(OsStr::from_bytes(b"arch\xefve"));
    let sub = tree.join(OsStr::from_bytes(b"r\xe9pertoire"));
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(tree.join(OsStr::from_bytes(b"caf\xe9.txt")), b"latin-1\n").unwrap();
    std::fs::write(tree.join(OsStr::from_bytes(b"\xff\xfe")), random_bytes(70_001, 7)).unwrap();
    std::fs::write(sub.join(OsStr::from_bytes(b"na\xefve\x80")), b"deep").unwrap();
    // The UTF-8 spelling of the same word, a different name beside it.
    std::fs::write(tree.join("café.txt"), b"utf-8\n").unwrap();

    let up = server.url("/up");
    ok(&ferry_os(&server, &[OsStr::new("cp"), OsStr::new("-r"), tree.as_os_str(), OsStr::new(&up)]));
    assert_same_tree(&tree, &exported(&server, "/up"));

    let back = local.path().join(OsStr::from_bytes(b"retour-\xe0"));
    ok(&ferry_os(&server, &[OsStr::new("cp"), OsStr::new("-r"), OsStr::new(&up), back.as_os_str()]));
    assert_same_tree(&tree, &back);

    // Into an existing remote directory: the non-UTF-8 base name is kept.
    std::fs::create_dir(exported(&server, "/into")).unwrap();
    ok(&ferry_os(&server, &[OsStr::new("cp"), OsStr::new("-R"), tree.as_os_str(), OsStr::new(&server.url("/into"))]));
    assert_same_tree(&tree, &exported(&server, "/into").join(OsStr::from_bytes(b"arch\xefve")));

    let listed = ok(&server.ferry(&["ls", &up]));
    let mut lines: Vec<&str> = listed.lines().collect();
    lines.sort();
    assert_eq!(lines, ["café.txt", "caf\u{fffd}.txt", "r\u{fffd}pertoire", "\u{fffd}\u{fffd}"]);
}

#[test]
fn cp_directory_without_r_fails() {
    let server = Server::start(&[]);
    let local = TempDir::new("cp-nor");
    let d = local.path().join("d");
    std::fs::create_dir(&d).unwrap();
    let o = server.ferry(&["cp", d.to_str().unwrap(), &server.url("/d")]);
    let line = fails(&o);
    assert!(line.starts_with("ferry: ") && line.contains("Is a directory"), "{line}");
    assert!(!exported(&server, "/d").exists());
}

#[test]
fn cp_from_missing_fails() {
    let server = Server::start(&[]);
    let local = TempDir::new("cp-missing");
    let dst = local.path().join("out");
    let o = server.ferry(&["cp", &server.url("/missing"), dst.to_str().unwrap()]);
    fails_with(&o, &enoent(&server, "/missing"));
    assert!(!dst.exists(), "nothing created on failure");
    let o = server.ferry(&["cp", &server.url("/nope/deeper"), &server.url("/x")]);
    fails_with(&o, &enoent(&server, "/nope/deeper"));
    // A missing local source names the local path.
    let missing = local.path().join("not-here");
    let o = server.ferry(&["cp", missing.to_str().unwrap(), &server.url("/x")]);
    fails_with(&o, &format!("ferry: {}: No such file or directory", missing.display()));
    assert!(!exported(&server, "/x").exists());
}

#[test]
fn cp_into_missing_remote_parent_fails() {
    let server = Server::start(&[]);
    let local = TempDir::new("cp-noparent");
    let src = local.path().join("f");
    std::fs::write(&src, b"x").unwrap();
    let o = server.ferry(&["cp", src.to_str().unwrap(), &server.url("/no/such/dir/f")]);
    fails_with(&o, &enoent(&server, "/no/such/dir/f"));
}

// ---------------------------------------------------------------- cat

#[test]
fn cat_prints_file_bytes() {
    let server = Server::start(&[]);
    put(&server, "/hello.txt", b"hello, world\n");
    let o = server.ferry(&["cat", &server.url("/hello.txt")]);
    assert_eq!(ok(&o), "hello, world\n");
    assert!(o.stderr.is_empty(), "cat wrote to stderr: {}", stderr(&o));

    let data = random_bytes(2 * 1024 * 1024 + 5, 5);
    put(&server, "/bin", &data);
    let o = server.ferry(&["cat", &server.url("/bin")]);
    assert!(o.status.success());
    assert!(o.stdout == data, "cat of binary file differs");

    put(&server, "/empty", b"");
    let o = server.ferry(&["cat", &server.url("/empty")]);
    assert_eq!(ok(&o), "");
}

#[test]
fn cat_missing_fails() {
    let server = Server::start(&[]);
    fails_with(&server.ferry(&["cat", &server.url("/missing")]), &enoent(&server, "/missing"));
    fails_with(&server.ferry(&["cat", &server.url("/a/b/c")]), &enoent(&server, "/a/b/c"));
}

// ---------------------------------------------------------------- ls

#[test]
fn ls_lists_sorted_names() {
    let server = Server::start(&[]);
    for n in ["zeta", "alpha", "Mid", "beta.txt"] {
        put(&server, n, n.as_bytes());
    }
    std::fs::create_dir(exported(&server, "/dir")).unwrap();
    let out = ok(&server.ferry(&["ls", &server.url("/")]));
    assert_eq!(out, "Mid\nalpha\nbeta.txt\ndir\nzeta\n");
    // An empty directory lists nothing.
    assert_eq!(ok(&server.ferry(&["ls", &server.url("/dir")])), "");
    // A file lists itself.
    assert_eq!(ok(&server.ferry(&["ls", &server.url("/alpha")])), "alpha\n");
}

#[test]
fn ls_long_shows_mode_and_size() {
    let server = Server::start(&[]);
    put(&server, "/file.txt", b"12345");
    std::fs::create_dir(exported(&server, "/sub")).unwrap();
    std::fs::set_permissions(exported(&server, "/sub"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(exported(&server, "/exec"), b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(exported(&server, "/exec"), std::fs::Permissions::from_mode(0o750)).unwrap();
    std::os::unix::fs::symlink("file.txt", exported(&server, "/ln")).unwrap();
    let out = ok(&server.ferry(&["ls", "-l", &server.url("/")]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    let names: Vec<&str> = lines.iter().map(|l| l.split_whitespace().last().unwrap()).collect();
    // The symlink line ends with `-> target`; its name comes before.
    assert!(lines[0].starts_with("-rwxr-x--- "), "{}", lines[0]);
    assert!(lines[0].ends_with(" exec"));
    assert!(lines[1].starts_with("-rw-r--r-- "), "{}", lines[1]);
    assert!(lines[1].ends_with(" file.txt"));
    let fields: Vec<&str> = lines[1].split_whitespace().collect();
    // mode, links, uid, gid, size, date, time, name
    assert_eq!(fields.len(), 8, "{}", lines[1]);
    assert_eq!(fields[1], "1", "link count");
    assert_eq!(fields[4], "5", "size");
    assert!(lines[2].starts_with("lrwxrwxrwx "), "{}", lines[2]);
    assert!(lines[2].ends_with(" ln -> file.txt"), "{}", lines[2]);
    assert!(lines[3].starts_with("drwxr-xr-x "), "{}", lines[3]);
    assert_eq!(names[3], "sub");
    // A date like 2024-05-01 12:34:56.
    let date = fields[5];
    assert!(date.len() == 10 && date.as_bytes()[4] == b'-' && date.as_bytes()[7] == b'-', "{date}");
    assert!(fields[6].len() == 8 && fields[6].as_bytes()[2] == b':', "{}", fields[6]);
}

#[test]
fn ls_hides_dot_files_unless_a_and_takes_several_urls() {
    let server = Server::start(&[]);
    put(&server, "/.hidden", b"h");
    put(&server, "/seen", b"s");
    std::fs::create_dir(exported(&server, "/d")).unwrap();
    put(&server, "/d/inner", b"i");
    assert_eq!(ok(&server.ferry(&["ls", &server.url("/")])), "d\nseen\n");
    assert_eq!(ok(&server.ferry(&["ls", "-a", &server.url("/")])), ".\n..\n.hidden\nd\nseen\n");
    // Several operands: files first, then each directory under a header.
    let out = ok(&server.ferry(&["ls", &server.url("/d"), &server.url("/seen"), &server.url("/")]));
    let (d, root) = (server.url("/d"), server.url("/"));
    assert_eq!(out, format!("seen\n\n{d}:\ninner\n\n{root}:\nd\nseen\n"));
    // One missing operand: the others are listed, the command fails.
    let o = server.ferry(&["ls", &server.url("/d"), &server.url("/missing")]);
    assert!(!o.status.success());
    assert!(stdout(&o).contains("inner"), "{}", stdout(&o));
    assert!(stderr(&o).contains("/missing: No such file or directory"), "{}", stderr(&o));
}

#[test]
fn ls_missing_fails() {
    let server = Server::start(&[]);
    fails_with(&server.ferry(&["ls", &server.url("/missing")]), &enoent(&server, "/missing"));
    fails_with(&server.ferry(&["ls", "-l", &server.url("/missing/x")]), &enoent(&server, "/missing/x"));
}

// ---------------------------------------------------------------- stat

#[test]
fn stat_shows_size_and_kind() {
    let server = Server::start(&[]);
    put(&server, "/f", b"123456789");
    let out = ok(&server.ferry(&["stat", &server.url("/f")]));
    assert!(out.contains(&format!("File: {}", server.url("/f"))), "{out}");
    assert!(out.contains("Size: 9 "), "{out}");
    assert!(out.contains("regular file"), "{out}");
    assert!(out.contains("(0644/-rw-r--r--)"), "{out}");

    put(&server, "/e", b"");
    let out = ok(&server.ferry(&["stat", &server.url("/e")]));
    assert!(out.contains("Size: 0 ") && out.contains("regular empty file"), "{out}");

    std::fs::create_dir(exported(&server, "/d")).unwrap();
    let out = ok(&server.ferry(&["stat", &server.url("/d")]));
    assert!(out.contains("directory"), "{out}");

    std::os::unix::fs::symlink("f", exported(&server, "/l")).unwrap();
    let out = ok(&server.ferry(&["stat", &server.url("/l")]));
    assert!(out.contains("symbolic link"), "{out}");
}

#[test]
fn stat_missing_fails() {
    let server = Server::start(&[]);
    fails_with(&server.ferry(&["stat", &server.url("/missing")]), &enoent(&server, "/missing"));
}

// ---------------------------------------------------------------- mkdir

#[test]
fn mkdir_and_mkdir_p() {
    let server = Server::start(&[]);
    assert_eq!(ok(&server.ferry(&["mkdir", &server.url("/d1")])), "");
    assert!(exported(&server, "/d1").is_dir());
    ok(&server.ferry(&["mkdir", "-p", &server.url("/x/y/z")]));
    assert!(exported(&server, "/x/y/z").is_dir());
    // -p on an existing path is fine.
    ok(&server.ferry(&["mkdir", "-p", &server.url("/x/y")]));
    ok(&server.ferry(&["mkdir", "-p", &server.url("/d1")]));
}

#[test]
fn mkdir_errors() {
    let server = Server::start(&[]);
    std::fs::create_dir(exported(&server, "/d")).unwrap();
    fails_with(&server.ferry(&["mkdir", &server.url("/d")]), &format!("ferry: {}: File exists", server.url("/d")));
    fails_with(&server.ferry(&["mkdir", &server.url("/no/parent")]), &enoent(&server, "/no/parent"));
    put(&server, "/f", b"x");
    fails_with(&server.ferry(&["mkdir", &server.url("/f")]), &format!("ferry: {}: File exists", server.url("/f")));
    let o = server.ferry(&["mkdir", "-p", &server.url("/f/sub")]);
    fails_with(&o, &format!("ferry: {}: Not a directory", server.url("/f/sub")));
}

// ---------------------------------------------------------------- rm

#[test]
fn rm_file_dir_and_tree() {
    let server = Server::start(&[]);
    put(&server, "/f", b"x");
    ok(&server.ferry(&["rm", &server.url("/f")]));
    assert!(!exported(&server, "/f").exists());

    std::fs::create_dir_all(exported(&server, "/t/a/b")).unwrap();
    std::fs::create_dir(exported(&server, "/t/empty")).unwrap();
    put(&server, "/t/a/b/f1", b"1");
    put(&server, "/t/a/f2", b"2");
    put(&server, "/t/f3", b"");
    std::os::unix::fs::symlink("/etc/passwd", exported(&server, "/t/a/ln")).unwrap();
    // A symlink to a directory outside the tree must not be followed.
    std::fs::create_dir(exported(&server, "/keep")).unwrap();
    put(&server, "/keep/precious", b"p");
    std::os::unix::fs::symlink("../keep", exported(&server, "/t/dirlink")).unwrap();

    let o = server.ferry(&["rm", &server.url("/t")]);
    fails_with(&o, &format!("ferry: {}: Is a directory (use -r)", server.url("/t")));
    assert!(exported(&server, "/t/a/b/f1").exists(), "nothing removed without -r");

    ok(&server.ferry(&["rm", "-r", &server.url("/t")]));
    assert!(!exported(&server, "/t").exists());
    assert_eq!(std::fs::read(exported(&server, "/keep/precious")).unwrap(), b"p");

    // An empty directory still needs -r.
    std::fs::create_dir(exported(&server, "/e")).unwrap();
    fails(&server.ferry(&["rm", &server.url("/e")]));
    ok(&server.ferry(&["rm", "-R", &server.url("/e")]));
    assert!(!exported(&server, "/e").exists());
}

#[test]
fn rm_missing_fails() {
    let server = Server::start(&[]);
    fails_with(&server.ferry(&["rm", &server.url("/missing")]), &enoent(&server, "/missing"));
    fails_with(&server.ferry(&["rm", "-r", &server.url("/missing")]), &enoent(&server, "/missing"));
}

// ---------------------------------------------------------------- mv

#[test]
fn mv_renames_and_moves_into_dir() {
    let server = Server::start(&[]);
    put(&server, "/a", b"contents");
    ok(&server.ferry(&["mv", &server.url("/a"), &server.url("/b")]));
    assert!(!exported(&server, "/a").exists());
    assert_eq!(std::fs::read(exported(&server, "/b")).unwrap(), b"contents");

    std::fs::create_dir(exported(&server, "/dir")).unwrap();
    ok(&server.ferry(&["mv", &server.url("/b"), &server.url("/dir")]));
    assert!(!exported(&server, "/b").exists());
    assert_eq!(std::fs::read(exported(&server, "/dir/b")).unwrap(), b"contents");

    // Renaming a directory, and replacing an existing file.
    ok(&server.ferry(&["mv", &server.url("/dir"), &server.url("/dir2")]));
    assert_eq!(std::fs::read(exported(&server, "/dir2/b")).unwrap(), b"contents");
    put(&server, "/other", b"other");
    ok(&server.ferry(&["mv", &server.url("/other"), &server.url("/dir2/b")]));
    assert_eq!(std::fs::read(exported(&server, "/dir2/b")).unwrap(), b"other");
}

#[test]
fn mv_missing_fails() {
    let server = Server::start(&[]);
    fails_with(&server.ferry(&["mv", &server.url("/missing"), &server.url("/b")]), &enoent(&server, "/missing"));
    assert!(!exported(&server, "/b").exists());
}

// ---------------------------------------------------------------- URL, connection, auth

#[test]
fn bad_urls_fail() {
    let server = Server::start(&[]);
    let line = fails(&server.ferry(&["cat", "nfs://127.0.0.1/x"]));
    assert_eq!(line, "ferry: nfs://127.0.0.1/x: not a ferry:// URL");
    let u = format!("ferry://127.0.0.1:{}x/f", server.port);
    let line = fails(&server.ferry(&["ls", &u]));
    assert!(line.starts_with(&format!("ferry: {u}: bad port")), "{line}");
    let line = fails(&server.ferry(&["stat", "ferry:///f"]));
    assert_eq!(line, "ferry: ferry:///f: no host");
    let line = fails(&server.ferry(&["mkdir", "ferry://127.0.0.1:99999/d"]));
    assert!(line.contains("bad port"), "{line}");
    let line = fails(&server.ferry(&["mv", "/local/path", &server.url("/x")]));
    assert!(line.contains("not a ferry:// URL"), "{line}");
}

#[test]
fn server_not_running() {
    let port = dead_port();
    let home = TempDir::new("dead-home");
    for args in [
        vec!["cat".to_string(), format!("ferry://127.0.0.1:{port}/x")],
        vec!["ls".to_string(), format!("ferry://127.0.0.1:{port}/")],
        vec!["cp".to_string(), "/etc/hostname".to_string(), format!("ferry://127.0.0.1:{port}/x")],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = ferry_with_token(home.path(), Some("whatever"), &args);
        let line = fails(&o);
        assert!(line.starts_with("ferry: "), "{line}");
        assert!(line.contains(&format!("127.0.0.1:{port}")), "message must name the address: {line}");
        assert!(line.contains("Connection refused"), "{line}");
        assert!(line.contains("waited 0.3 s for it"), "{line}");
    }
}

#[test]
fn wrong_token_refused() {
    let server = Server::start(&[]);
    put(&server, "/f", b"secret");
    let home = TempDir::new("wrong-home");
    let o = ferry_with_token(home.path(), Some("wrong"), &["cat", &server.url("/f")]);
    let line = fails(&o);
    assert!(line.contains("authentication failed"), "{line}");
    assert!(line.contains(&server.addr()), "{line}");
    assert!(o.stdout.is_empty(), "no data leaked");

    // A wrong token file behaves the same.
    let tf = home.path().join("tok");
    std::fs::write(&tf, "not-the-token\n").unwrap();
    let o = Command::new(FERRY)
        .args(["--token-file", tf.to_str().unwrap(), "ls", &server.url("/")])
        .env_remove("FERRY_TOKEN_FILE")
        .env_remove("FERRY_TOKEN")
        .env("HOME", home.path())
        .output()
        .unwrap();
    assert!(fails(&o).contains("authentication failed"));

    // The right token still works afterwards.
    assert_eq!(ok(&server.ferry(&["cat", &server.url("/f")])), "secret");
}

#[test]
fn missing_token_refused() {
    let server = Server::start(&[]);
    put(&server, "/f", b"secret");
    let home = TempDir::new("notoken-home");
    let o = ferry_with_token(home.path(), None, &["cat", &server.url("/f")]);
    let line = fails(&o);
    assert!(line.contains("authentication failed"), "{line}");
    assert!(o.stdout.is_empty());
    let o = ferry_with_token(home.path(), None, &["mkdir", &server.url("/d")]);
    assert!(fails(&o).contains("authentication failed"));
    assert!(!exported(&server, "/d").exists());
}

#[test]
fn unreadable_token_file_is_reported() {
    let server = Server::start(&[]);
    let home = TempDir::new("badtf-home");
    let missing = home.path().join("nope");
    let o = Command::new(FERRY)
        .args(["--token-file", missing.to_str().unwrap(), "ls", &server.url("/")])
        .env("HOME", home.path())
        .output()
        .unwrap();
    let line = fails(&o);
    assert!(line.contains(missing.to_str().unwrap()), "{line}");
}

// ---------------------------------------------------------------- read-only

#[test]
fn read_only_server_cli() {
    let server = Server::start(&["--read-only"]);
    put(&server, "/f", b"readable");
    std::fs::create_dir(exported(&server, "/d")).unwrap();
    assert_eq!(ok(&server.ferry(&["cat", &server.url("/f")])), "readable");
    assert_eq!(ok(&server.ferry(&["ls", &server.url("/")])), "d\nf\n");
    ok(&server.ferry(&["stat", &server.url("/f")]));
    // Copy out works.
    let local = TempDir::new("ro-local");
    let dst = local.path().join("out");
    ok(&server.ferry(&["cp", &server.url("/f"), dst.to_str().unwrap()]));
    assert_eq!(std::fs::read(&dst).unwrap(), b"readable");

    let erofs = |o: &Output| {
        let line = fails(o);
        assert!(line.starts_with("ferry: ferry://") && line.ends_with(": Read-only file system"), "{line}");
    };
    erofs(&server.ferry(&["cp", dst.to_str().unwrap(), &server.url("/new")]));
    erofs(&server.ferry(&["cp", dst.to_str().unwrap(), &server.url("/f")]));
    erofs(&server.ferry(&["cp", &server.url("/f"), &server.url("/f2")]));
    erofs(&server.ferry(&["mkdir", &server.url("/nd")]));
    erofs(&server.ferry(&["mkdir", "-p", &server.url("/nd/x")]));
    erofs(&server.ferry(&["rm", &server.url("/f")]));
    erofs(&server.ferry(&["rm", "-r", &server.url("/d")]));
    erofs(&server.ferry(&["mv", &server.url("/f"), &server.url("/g")]));
    // Nothing changed.
    assert_eq!(std::fs::read(exported(&server, "/f")).unwrap(), b"readable");
    assert!(exported(&server, "/d").is_dir());
    assert!(!exported(&server, "/new").exists());
    assert!(!exported(&server, "/nd").exists());
    assert!(!exported(&server, "/g").exists());
}

#[test]
fn read_only_server_library_erofs() {
    let server = Server::start(&["--read-only"]);
    put(&server, "/f", b"data");
    std::fs::create_dir(exported(&server, "/d")).unwrap();
    std::fs::create_dir(exported(&server, "/empty")).unwrap();
    let c = server.client();
    let erofs = |what: &str, r: Result<(), ferry_client::Error>| match r {
        Ok(()) => panic!("{what}: succeeded on a read-only server"),
        Err(e) => assert_eq!(e.errno(), libc::EROFS, "{what}: {e}"),
    };
    let f = Target::Path(b"/f");
    erofs("open write", c.open("/f", OpenOptions::new().write(true)).map(drop));
    erofs("open rdwr", c.open("/f", OpenOptions::new().read(true).write(true)).map(drop));
    erofs("open append", c.open("/f", OpenOptions::new().append(true)).map(drop));
    erofs("open trunc", c.open("/f", OpenOptions::new().read(true).truncate(true)).map(drop));
    erofs("create", c.open("/new", OpenOptions::new().write(true).create(true)).map(drop));
    erofs("create_new", c.open("/new", OpenOptions::new().write(true).create_new(true)).map(drop));
    erofs("write()", c.write("/new", b"x"));
    erofs("truncate", c.truncate(f, 0).map(drop));
    erofs("chmod", c.set_permissions(f, 0o600).map(drop));
    erofs("chown", c.chown(f, 1234, 5678).map(drop));
    erofs("utimens", c.set_times(f, Time::NOW, Time::NOW).map(drop));
    erofs("setxattr", c.set_xattr(f, "user.k", b"v", 0));
    erofs("removexattr", c.remove_xattr(f, "user.k"));
    erofs("mkdir", c.create_dir("/nd", 0o755).map(drop));
    erofs("create_dir_all", c.create_dir_all("/nd/x", 0o755));
    erofs("rmdir", c.remove_dir("/empty"));
    erofs("unlink", c.remove_file("/f"));
    erofs("rename", c.rename("/f", "/g"));
    erofs("rename flags", c.rename_with_flags("/f", "/g", 1));
    erofs("link", c.hard_link("/f", "/h").map(drop));
    erofs("symlink", c.symlink("f", "/s").map(drop));

    // Through an open (read-only) handle too.
    let mut file = c.open("/f", OpenOptions::new().read(true)).unwrap();
    erofs("write_at", file.write_at(b"zz", 0));
    erofs("set_len", file.set_len(0));
    let h = Target::Handle(file.handle());
    erofs("fchmod", c.set_permissions(h, 0o600).map(drop));
    erofs("fchown", c.chown(h, 1, 1).map(drop));
    erofs("futimens", c.set_times(h, Time::NOW, Time::OMIT).map(drop));
    erofs("ftruncate", c.truncate(h, 1).map(drop));
    {
        use std::io::Write;
        let w = file.write(b"abc").and_then(|_| file.flush());
        let e = w.expect_err("buffered write on a read-only server");
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    }
    file.close().unwrap();

    // Reads still work, and nothing changed.
    assert_eq!(c.read("/f").unwrap(), b"data");
    assert_ne!(c.statfs("/").unwrap().flags & libc::ST_RDONLY, 0, "statfs reports read-only");
    assert_eq!(std::fs::read(exported(&server, "/f")).unwrap(), b"data");
    assert!(!exported(&server, "/new").exists());
    assert!(exported(&server, "/empty").is_dir());
    assert!(!exported(&server, "/g").exists() && !exported(&server, "/h").exists());
    assert!(std::fs::symlink_metadata(exported(&server, "/s")).is_err());
    // The connection is still healthy after all those errors.
    c.ping().unwrap();
}

#[test]
fn read_only_server_access() {
    let server = Server::start(&["--read-only"]);
    put(&server, "/f", b"data");
    let c = server.client();
    c.access("/f", libc::F_OK as u32).expect("F_OK on a read-only server");
    c.access("/f", libc::R_OK as u32).expect("R_OK on a read-only server");
    let e = c.access("/f", libc::W_OK as u32).expect_err("W_OK on a read-only server");
    assert_eq!(e.errno(), libc::EROFS, "{e}");
    let e = c.access("/missing", libc::W_OK as u32).expect_err("W_OK of a missing file");
    assert_eq!(e.errno(), libc::ENOENT, "{e}");
}
