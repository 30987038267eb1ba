//! `ferry run` on the server's host hands a writer the server's own
//! descriptor, lent for writing (`crates/preload/src/lent.rs`): real
//! programs' writes land, appends are atomic, another client sees them at
//! once, the file gets no lease for as long as any process may write
//! through the descriptor (across `fork` and `exec`), a second user gets
//! no descriptor and no more than their rights, and a server restart
//! mid-write loses no byte.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::{random_bytes, Server, TempDir, FERRY};

/// `ferry run --mount /remote=SERVER -- ARGS` (bounded by `timeout 120`).
fn run_cmd(srv_url: &str, token: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("timeout");
    c.args(["120", FERRY, "run", "--mount"])
        .arg(format!("/remote={srv_url}"))
        .arg("--")
        .args(args)
        .env("FERRY_TOKEN_FILE", token)
        .env_remove("FERRY_TOKEN")
        .env_remove("FERRY_MOUNTS")
        .env_remove("FERRY_SAME_HOST");
    c
}

fn ok(o: Output, what: &str) -> String {
    assert!(o.status.success(), "{what}: {}{}", common::stdout(&o), common::stderr(&o));
    common::stdout(&o)
}

fn spawn_piped(mut c: Command) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = c.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

fn line(out: &mut BufReader<std::process::ChildStdout>) -> String {
    let mut l = String::new();
    out.read_line(&mut l).unwrap();
    l.trim().to_string()
}

/// Dd, Python and bash redirections write through the server's own file:
/// each program's descriptor names the export's file (not a placeholder),
/// the bytes land, appends from two processes interleave whole, and a
/// client of the server reads every byte right after the close or the
/// `fsync`. `FERRY_SAME_HOST=0` keeps the placeholder.
#[test]
fn writers_get_the_servers_descriptor_and_their_writes_land() {
    let srv = Server::start(&[]);
    let url = srv.url("/");
    let local = TempDir::new("run-write");
    let src = local.path().join("src");
    let data = random_bytes(24 << 20, 340);
    std::fs::write(&src, &data).unwrap();

    // dd with conv=fsync, as the bench does.
    let o = run_cmd(
        &url,
        &srv.token_file,
        &["dd", &format!("if={}", src.display()), "of=/remote/dd", "bs=1M", "conv=fsync"],
    )
    .output()
    .unwrap();
    ok(o, "dd");
    assert!(srv.tcp_client().read("/dd").unwrap() == data, "dd's file read back through the server differs");

    // Python: the descriptor is the export's file; after fsync (before the
    // close) another client reads every byte; O_APPEND from a parent and
    // a forked child.
    let script = r#"
import os, sys
fd = os.open("/remote/py", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
print(os.readlink(f"/proc/self/fd/{fd}"), flush=True)
data = sys.stdin.buffer.read(int(sys.argv[1]))
for i in range(0, len(data), 1 << 20):
    os.write(fd, data[i:i + (1 << 20)])
os.fsync(fd)
print("synced", flush=True)
sys.stdin.readline()
os.close(fd)
a = os.open("/remote/log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
pid = os.fork()
who = b"C" if pid == 0 else b"P"
for i in range(200):
    os.write(a, who * 1000 + b"\n")
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
os.close(a)
print("appended", flush=True)
"#;
    let py = data[..8 << 20].to_vec();
    let mut c = run_cmd(&url, &srv.token_file, &["python3", "-c", script, &py.len().to_string()]);
    c.current_dir(local.path());
    let (mut child, mut out) = spawn_piped(c);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&py).unwrap();
    assert_eq!(line(&mut out), srv.export.path().join("py").display().to_string(), "not the server's descriptor");
    assert_eq!(line(&mut out), "synced");
    assert!(
        srv.tcp_client().read("/py").unwrap() == py,
        "after fsync, before the close: another client's read differs"
    );
    stdin.write_all(b"go\n").unwrap();
    assert_eq!(line(&mut out), "appended");
    assert!(child.wait().unwrap().success());
    let log = srv.tcp_client().read("/log").unwrap();
    assert_eq!(log.len(), 400 * 1001, "appends lost or overwritten");
    for l in log.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        assert!(l == [b'P'; 1000] || l == [b'C'; 1000], "an append was torn");
    }

    // bash: `>` then `>>`, and a redirection a program inherits.
    let o = run_cmd(
        &url,
        &srv.token_file,
        &[
            "bash",
            "-c",
            "echo one > /remote/sh; echo two >> /remote/sh; readlink /proc/self/fd/1 >> /remote/sh; cat /remote/sh",
        ],
    )
    .output()
    .unwrap();
    let shown = ok(o, "bash");
    let want = format!("one\ntwo\n{}\n", srv.export.path().join("sh").display());
    assert_eq!(std::fs::read_to_string(srv.export.path().join("sh")).unwrap(), want);
    assert_eq!(shown, want, "the program's own read back");

    // Off: a placeholder, and the data lands all the same.
    let o = run_cmd(
        &url,
        &srv.token_file,
        &["python3", "-c", "import os; fd = os.open('/remote/off', os.O_WRONLY | os.O_CREAT, 0o644); os.write(fd, b'off'); print(os.readlink('/proc/self/fd/%d' % fd))"],
    )
    .env("FERRY_SAME_HOST", "0")
    .output()
    .unwrap();
    assert!(ok(o, "FERRY_SAME_HOST=0").starts_with("/memfd:"), "FERRY_SAME_HOST=0 lent a descriptor");
    assert_eq!(srv.tcp_client().read("/off").unwrap(), b"off");
}

/// Leases refused for `/f` by the server (its metrics) around one `stat`
/// of it by another `ferry run` program (which asks for leases).
fn refusals_of_a_stat(srv: &Server, metrics: &str) -> f64 {
    use common::scrape::{get, sample};
    let before = sample(&get(metrics, "/metrics").1, "ferry_leases_refused_total");
    let o = run_cmd(&srv.url("/"), &srv.token_file, &["stat", "-c", "%s", "/remote/f"]).output().unwrap();
    ok(o, "stat");
    sample(&get(metrics, "/metrics").1, "ferry_leases_refused_total") - before
}

/// The server grants no lease on a file while any process may write
/// through a descriptor lent from it — a program that inherited it across
/// `exec` from a shell that is gone, a `fork` child whose parent closed it
/// and exited — and grants them again once the last such process is gone.
/// (A `--shared-volume` server: no watcher of its disk would notice the
/// writes instead.)
#[test]
fn no_lease_while_any_process_may_write_through_a_lent_descriptor() {
    let srv = Server::start(&["--metrics", "127.0.0.1:0", "--shared-volume"]);
    let metrics = common::scrape::metrics_addr(&srv);
    std::fs::write(srv.export.path().join("f"), b"0").unwrap();
    assert_eq!(refusals_of_a_stat(&srv, &metrics), 0.0, "refused with nothing lent");

    // A shell opens the file, then replaces itself with a program that
    // writes through the inherited descriptor.
    let prog = "import sys, os; os.write(3, b'exec'); print('ready', flush=True); sys.stdin.readline(); os.write(3, b'-more'); os.close(3)";
    let c = run_cmd(
        &srv.url("/"),
        &srv.token_file,
        &["bash", "-c", &format!("exec 3>>/remote/f; exec python3 -c \"{prog}\"")],
    );
    let (mut child, mut out) = spawn_piped(c);
    assert_eq!(line(&mut out), "ready");
    assert!(
        refusals_of_a_stat(&srv, &metrics) > 0.0,
        "a lease was granted while an exec'd program held the descriptor"
    );
    assert_eq!(std::fs::read(srv.export.path().join("f")).unwrap(), b"0exec");
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(child.wait().unwrap().success());
    assert!(
        common::fuse::wait_for(Duration::from_secs(5), || refusals_of_a_stat(&srv, &metrics) == 0.0),
        "leases still refused after the last holder exited"
    );
    assert_eq!(std::fs::read(srv.export.path().join("f")).unwrap(), b"0exec-more");

    // A parent opens, forks, closes its descriptor and exits; the child
    // goes on writing.
    let script = r#"
import os, sys
fd = os.open("/remote/f", os.O_WRONLY | os.O_APPEND)
r, w = os.pipe()
if os.fork() == 0:
    os.close(w)
    os.read(r, 1)
    os.write(fd, b"-child")
    print("child", flush=True)
    sys.stdin.readline()
    os.write(fd, b"-last")
    os._exit(0)
os.close(r)
os.close(fd)
os.write(w, b"x")
os._exit(0)
"#;
    let c = run_cmd(&srv.url("/"), &srv.token_file, &["python3", "-c", script]);
    let (mut child, mut out) = spawn_piped(c);
    let mut stdin = child.stdin.take().unwrap();
    assert_eq!(line(&mut out), "child");
    // The parent is gone (and with it its connection to the server).
    assert!(child.wait().unwrap().success());
    assert!(refusals_of_a_stat(&srv, &metrics) > 0.0, "a lease was granted while a fork child held the descriptor");
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    // The child's end is its stdout's.
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(
        common::fuse::wait_for(Duration::from_secs(5), || refusals_of_a_stat(&srv, &metrics) == 0.0),
        "leases still refused after the fork child exited"
    );
    assert_eq!(std::fs::read(srv.export.path().join("f")).unwrap(), b"0exec-more-child-last");

    // One program, open and closed: granted again at once after the close
    // (the handle closes with the descriptor's last number).
    let script = r#"
import os, sys
fd = os.open("/remote/f", os.O_WRONLY)
d = os.dup(fd)
os.close(fd)
print("open", flush=True)
sys.stdin.readline()
os.close(d)
print("closed", flush=True)
sys.stdin.readline()
"#;
    let c = run_cmd(&srv.url("/"), &srv.token_file, &["python3", "-c", script]);
    let (mut child, mut out) = spawn_piped(c);
    let mut stdin = child.stdin.take().unwrap();
    assert_eq!(line(&mut out), "open");
    assert!(refusals_of_a_stat(&srv, &metrics) > 0.0, "a lease was granted while a dup held the descriptor");
    stdin.write_all(b"go\n").unwrap();
    assert_eq!(line(&mut out), "closed");
    assert_eq!(refusals_of_a_stat(&srv, &metrics), 0.0, "refused after the program closed its descriptor");
    stdin.write_all(b"go\n").unwrap();
    assert!(child.wait().unwrap().success());
}

/// Another user under `ferry run` gets no descriptor (the server lends
/// only to its own user or root): a file they may write is written by
/// requests, and one they may not write stays refused.
#[test]
fn another_user_gets_no_writable_descriptor_and_no_more_rights() {
    let srv = Server::start(&["--no-auth"]);
    let export = srv.export.path();
    std::fs::write(export.join("roots"), b"root's").unwrap();
    std::fs::write(export.join("theirs"), b"").unwrap();
    let nobody = 65534;
    std::os::unix::fs::chown(export.join("theirs"), Some(nobody), Some(nobody)).unwrap();
    let home = TempDir::new("run-write-nobody");
    std::fs::set_permissions(home.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let script = r#"
import os
fd = os.open("/remote/theirs", os.O_WRONLY | os.O_TRUNC)
print(os.readlink(f"/proc/self/fd/{fd}"))
os.write(fd, b"mine" * 100000)
os.close(fd)
try:
    os.open("/remote/roots", os.O_WRONLY)
    print("opened root's file")
except PermissionError:
    print("refused")
"#;
    let o = Command::new("runuser")
        .args(["-u", "nobody", "--", "timeout", "60", FERRY, "run", "--mount"])
        .arg(format!("/remote={}", srv.url("/")))
        .args(["--", "python3", "-c", script])
        .current_dir(home.path())
        .env("HOME", home.path())
        .env_remove("FERRY_TOKEN")
        .env_remove("FERRY_TOKEN_FILE")
        .env_remove("FERRY_MOUNTS")
        .env_remove("FERRY_SAME_HOST")
        .output()
        .expect("runuser");
    let out = ok(o, "ferry run as nobody");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("/memfd:"), "another user got a descriptor: {out}");
    assert_eq!(lines[1], "refused", "{out}");
    assert_eq!(std::fs::read(export.join("theirs")).unwrap(), b"mine".repeat(100000));
    assert_eq!(std::fs::read(export.join("roots")).unwrap(), b"root's");
}

/// The server is killed and started again while a program writes through
/// a lent descriptor: the descriptor is the file itself, so every byte
/// written before and after lands, and the program's close succeeds.
#[test]
fn a_server_restart_mid_write_loses_nothing() {
    use common::restart::Serve;
    let export = TempDir::new("run-write-restart-export");
    let state = TempDir::new("run-write-restart-state");
    let token = state.path().join("token");
    let mut server = Serve::start(export.path(), 0, &token);
    let port = server.port;
    let script = r#"
import os, sys
fd = os.open("/remote/f", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for i in range(8):
    os.write(fd, bytes([65 + i]) * (1 << 20))
os.fsync(fd)
print("half", flush=True)
sys.stdin.readline()
for i in range(8, 16):
    os.write(fd, bytes([65 + i]) * (1 << 20))
os.fsync(fd)
os.close(fd)
print("done", flush=True)
"#;
    let c = run_cmd(&format!("ferry://127.0.0.1:{port}/"), &token, &["python3", "-c", script]);
    let (mut child, mut out) = spawn_piped(c);
    assert_eq!(line(&mut out), "half");
    server.kill();
    let _server = Serve::start(export.path(), port, &token);
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert_eq!(line(&mut out), "done");
    assert!(child.wait().unwrap().success());
    let want: Vec<u8> = (0..16u8).flat_map(|i| std::iter::repeat_n(65 + i, 1 << 20)).collect();
    assert!(std::fs::read(export.path().join("f")).unwrap() == want, "bytes lost across the restart");
}
