//! Several exports from one server (`ferry serve --config FILE`): each
//! client (token) gets the exports the file gives it, read-only where it
//! says, from the networks it names; `SIGHUP` reads the file again without
//! dropping sessions, and a client taken out of it is refused from its next
//! request on.

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{TempDir, FERRY};
use ferry_client::{Client, OpenOptions, Options};

const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdef00";

struct Served {
    child: Child,
    port: u16,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(config: &Path, state: &Path) -> Served {
    let mut child = Command::new(FERRY)
        .arg("serve")
        .arg("--config")
        .arg(config)
        .args(["--listen", "127.0.0.1:0", "--no-root-squash", "--no-state"])
        .env("XDG_CONFIG_HOME", state)
        .stdout(Stdio::piped())
        .stderr(fs::File::create(state.join("server.log")).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let port =
        line.trim().rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| {
            panic!("{line:?}: {}", fs::read_to_string(state.join("server.log")).unwrap_or_default())
        });
    Served { child, port }
}

fn client(port: u16, token: &str) -> ferry_client::Result<Client> {
    let opts = Options { token: Some(token.as_bytes().to_vec()), ..Options::default() };
    Client::connect(&format!("127.0.0.1:{port}"), &opts)
}

fn errno<T>(r: ferry_client::Result<T>) -> i32 {
    r.err().map_or(0, |e| e.errno())
}

fn names(c: &Client, dir: &str) -> Vec<String> {
    let mut n: Vec<String> = c
        .read_dir(dir)
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .filter(|n| n != "." && n != "..")
        .collect();
    n.sort();
    n
}

/// The configuration: `data` for everyone, `archive` read-only and for
/// Alice only, `lan` only from 10.0.0.0/8 (never from this loopback
/// client); `bob` listed or not.
fn config(dir: &Path, with_bob: bool, extra: &str) -> PathBuf {
    let bob = if with_bob { format!("[client.bob]\ntoken = \"{BOB}\"\n") } else { String::new() };
    let text = format!(
        r#"
[[export]]
name = "data"
path = "{d}/data"

[[export]]
name = "archive"
path = "{d}/archive"
read_only = true
clients = ["alice"]

[[export]]
name = "lan"
path = "{d}/lan"
networks = ["10.0.0.0/8"]

{extra}

[client.alice]
token_file = "{d}/alice.token"

{bob}
"#,
        d = dir.display()
    );
    let f = dir.join("exports.toml");
    fs::write(&f, text).unwrap();
    f
}

#[test]
fn each_client_gets_the_exports_the_file_gives_it_and_a_reload_changes_that() {
    let dir = TempDir::new("exports");
    let d = dir.path();
    for e in ["data", "archive", "lan", "more"] {
        fs::create_dir(d.join(e)).unwrap();
    }
    fs::write(d.join("archive/old"), b"kept").unwrap();
    fs::write(d.join("alice.token"), format!("{ALICE}\n")).unwrap();
    let cfg = config(d, true, "");
    let server = serve(&cfg, d);

    let alice = client(server.port, ALICE).unwrap();
    let bob = client(server.port, BOB).unwrap();
    assert_eq!(names(&alice, "/"), ["archive", "data"], "lan is not for this network");
    assert_eq!(names(&bob, "/"), ["data"]);
    alice.write("/data/a", b"from alice").unwrap();
    assert_eq!(fs::read(d.join("data/a")).unwrap(), b"from alice", "/data/a is data/a in the export");
    assert_eq!(bob.read("/data/a").unwrap(), b"from alice");
    assert_eq!(alice.read("/archive/old").unwrap(), b"kept");
    assert_eq!(errno(alice.write("/archive/new", b"x")), libc::EROFS, "archive is read-only");
    assert_eq!(errno(bob.read("/archive/old")), libc::EACCES, "archive is Alice's");
    assert_eq!(errno(alice.read_dir("/lan")), libc::EACCES, "lan is not for this network");
    assert_eq!(errno(alice.rename("/data/a", "/archive/a")), libc::EROFS);
    alice.create_dir("/data/sub", 0o755).unwrap();
    assert_eq!(errno(alice.hard_link("/data/a", "/archive/a")), libc::EROFS);
    assert_eq!(errno(alice.create_dir("/newtop", 0o755)), libc::EROFS, "the top holds exports only");
    assert_eq!(errno(alice.remove_dir("/data")), libc::EBUSY, "an export's top is not removed");
    assert_eq!(errno(client(server.port, "a-wrong-token-0123456789")), libc::EACCES);
    let log = fs::read_to_string(d.join("server.log")).unwrap();
    assert!(
        log.lines().any(|l| l.contains("refused") && l.contains("archive") && l.contains("peer=127.0.0.1")),
        "a refused request is logged with its export and peer:\n{log}"
    );

    // A file Alice keeps open across the reload goes on.
    let mut f = alice.open("/data/open", OpenOptions::new().write(true).create(true).truncate(true)).unwrap();
    f.write_all(b"before ").unwrap();

    // Bob taken out, an export added: SIGHUP.
    config(d, false, &format!("[[export]]\nname = \"more\"\npath = \"{}/more\"\n", d.display()));
    let pid = rustix::process::Pid::from_raw(server.child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    let log = d.join("server.log");
    assert!(
        common::fuse::wait_for(Duration::from_secs(10), || fs::read_to_string(&log).unwrap().contains("reloaded")),
        "{}",
        fs::read_to_string(&log).unwrap()
    );
    assert_eq!(errno(bob.read("/data/a")), libc::EACCES, "Bob's session is refused from now on");
    assert_eq!(errno(client(server.port, BOB)), libc::EACCES, "and Bob cannot connect again");
    f.write_all(b"and after").unwrap();
    f.flush().unwrap();
    drop(f);
    assert_eq!(fs::read(d.join("data/open")).unwrap(), b"before and after");
    assert_eq!(names(&alice, "/"), ["archive", "data", "more"]);
    alice.write("/more/x", b"x").unwrap();

    // A file with a mistake is not put in force: everything stays.
    fs::write(&cfg, "this is not toml [").unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    assert!(common::fuse::wait_for(Duration::from_secs(10), || fs::read_to_string(&log)
        .unwrap()
        .contains("not reloaded")));
    assert_eq!(alice.read("/more/x").unwrap(), b"x");
}

/// The top of the name space answers as a read-only directory of mount
/// points (PROTOCOL.md 8.9): an export's name exists (`EEXIST` to make it
/// again), any other name cannot be made there (`EROFS`), an export is not
/// renamed nor renamed onto (`EBUSY`), and an export a client may not use
/// is `EACCES` to it, as looking it up is. Never `ENOENT`, and nothing is
/// made.
#[test]
fn the_top_answers_as_a_read_only_directory_of_mount_points() {
    let dir = TempDir::new("exports-top");
    let d = dir.path();
    for e in ["data", "archive", "lan"] {
        fs::create_dir(d.join(e)).unwrap();
    }
    fs::write(d.join("alice.token"), format!("{ALICE}\n")).unwrap();
    let server = serve(&config(d, true, ""), d);
    let alice = client(server.port, ALICE).unwrap();
    let bob = client(server.port, BOB).unwrap();
    alice.write("/data/f", b"x").unwrap();
    let fifo = libc::S_IFIFO | 0o644;
    let create =
        |c: &Client, p: &str, new: bool| errno(c.open(p, OpenOptions::new().write(true).create(true).create_new(new)));

    // Names of exports: there already (a read-only export's too).
    for top in ["/data", "/archive", "/"] {
        assert_eq!(errno(alice.create_dir(top, 0o755)), libc::EEXIST, "mkdir {top}");
        assert_eq!(errno(alice.mknod(top, fifo, 0)), libc::EEXIST, "mknod {top}");
        assert_eq!(errno(alice.symlink("/data/f", top)), libc::EEXIST, "symlink {top}");
        assert_eq!(errno(alice.hard_link("/data/f", top)), libc::EEXIST, "link {top}");
        assert_eq!(create(&alice, top, true), libc::EEXIST, "exclusive create {top}");
        assert_eq!(errno(alice.rename("/data/f", top)), libc::EBUSY, "rename onto {top}");
    }
    // Opening an export's top for writing is opening a directory so.
    assert_eq!(create(&alice, "/data", false), libc::EISDIR);
    // Any other name: the top is read-only.
    assert_eq!(errno(alice.create_dir("/new", 0o755)), libc::EROFS);
    assert_eq!(errno(alice.mknod("/new", fifo, 0)), libc::EROFS);
    assert_eq!(errno(alice.symlink("/data/f", "/new")), libc::EROFS);
    assert_eq!(errno(alice.hard_link("/data/f", "/new")), libc::EROFS);
    assert_eq!(create(&alice, "/new", false), libc::EROFS);
    assert_eq!(create(&alice, "/new", true), libc::EROFS);
    assert_eq!(errno(alice.rename("/data/f", "/new")), libc::EROFS);
    // Exports themselves do not move.
    assert_eq!(errno(alice.rename("/data", "/moved")), libc::EBUSY);
    assert_eq!(errno(alice.rename("/data", "/archive")), libc::EBUSY);
    assert_eq!(errno(alice.rename("/data", "/data/inside")), libc::EBUSY);
    // Not Bob's: hidden from him as it is when he looks it up.
    assert_eq!(errno(bob.metadata("/archive")), libc::EACCES);
    assert_eq!(errno(bob.create_dir("/archive", 0o755)), libc::EACCES);
    assert_eq!(errno(bob.rename("/data/f", "/archive")), libc::EACCES);
    // Not this network's, for either.
    assert_eq!(errno(alice.create_dir("/lan", 0o755)), libc::EACCES);

    assert_eq!(names(&alice, "/"), ["archive", "data"]);
    assert_eq!(alice.read("/data/f").unwrap(), b"x");
    assert_eq!(fs::read_dir(d.join("data")).unwrap().count(), 1, "nothing made inside an export instead");
}

#[test]
fn a_file_that_would_serve_everyone_by_mistake_is_refused() {
    let dir = TempDir::new("exports-bad");
    let d = dir.path();
    fs::create_dir(d.join("data")).unwrap();
    let cases = [
        (format!("[[export]]\nname = \"data\"\npath = \"{}/data\"\n", d.display()), "no_auth"),
        (
            format!("[[export]]\nname = \"a/b\"\npath = \"{}/data\"\n[client.x]\ntoken = \"{ALICE}\"\n", d.display()),
            "one path component",
        ),
        (
            format!(
                "[[export]]\nname = \"data\"\npath = \"{}/data\"\nclients = [\"nobody\"]\n[client.x]\ntoken = \"{ALICE}\"\n",
                d.display()
            ),
            "no [client.nobody]",
        ),
        (format!("[[export]]\nname = \"data\"\npath = \"{}/data\"\n[client.x]\ntoken = \"short\"\n", d.display()), "16"),
    ];
    for (text, why) in cases {
        let f = d.join("bad.toml");
        fs::write(&f, &text).unwrap();
        let o = Command::new(FERRY)
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&f)
            .env("XDG_CONFIG_HOME", d)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && o.stdout.is_empty() && err.contains(why), "{why}: {err}");
    }
}
