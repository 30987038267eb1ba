//! The mount on the server's host backs a file's node with the server's own
//! descriptor (FUSE passthrough): a program's reads and writes are the
//! local kernel's, and none of the file's bytes go through the daemon. The
//! cases the kernel's rules make hard: a writer beside readers, a second
//! mount, an executable, a `create` that opens a backed file behind a
//! negative entry; another client's change seen at once; another mount's
//! leases broken by writes that go past the server.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::fuse::{mount_url, mount_url_env, read_counting, require_fuse, wait_for, Detach, Mounted};
use common::{random_bytes, Server, TempDir};
use ferry_client::OpenOptions;

const LEN: usize = 16 << 20;

/// A server with `/big` (random data) and a mount of it at `tmp/NAME`.
fn mounted(srv: &Server, tmp: &TempDir, name: &str, env: &[(&str, &str)]) -> (Mounted, Detach, std::path::PathBuf) {
    let mp = tmp.path().join(name);
    std::fs::create_dir(&mp).unwrap();
    let detach = Detach(mp.clone());
    let m = mount_url_env(&srv.url("/"), &mp, &srv.token_file, &[], env);
    (m, detach, mp)
}

/// `/proc/PID/io` counter `rchar` of the daemon `pid`.
fn rchar(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    io.lines().find_map(|l| l.strip_prefix("rchar: ")).unwrap().trim().parse().unwrap()
}

/// Runs a Python script with `args`, bounded in time; its stdout.
fn python(script: &str, args: &[&str]) -> String {
    let o = Command::new("timeout").args(["60", "python3", "-c", script]).args(args).output().expect("run python3");
    assert!(o.status.success(), "python: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Writes `data` to `path` in 1 MiB writes (open with `O_TRUNC`, `fsync`).
fn write_file(path: &Path, data: &[u8]) {
    let script = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
data = sys.stdin.buffer.read()
for i in range(0, len(data), 1 << 20):
    os.write(fd, data[i:i + (1 << 20)])
os.fsync(fd)
os.close(fd)
"#;
    let mut child = Command::new("timeout")
        .args(["60", "python3", "-c", script])
        .arg(path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), data).unwrap();
    assert!(child.wait().unwrap().success(), "writing {}", path.display());
}

/// Reads and writes through the mount: the data is right, the daemon
/// moved none of it (on the old code it read the whole file from the
/// server's descriptor and received every write from the kernel), and over
/// TCP it still moves all of it.
#[test]
fn a_mount_on_the_servers_host_reads_and_writes_through_the_servers_file() {
    require_fuse();
    let srv = Server::start(&[]);
    let data = random_bytes(LEN, 34);
    std::fs::write(srv.export.path().join("big"), &data).unwrap();
    let tmp = TempDir::new("passthrough");
    let (m, _d, mp) = mounted(&srv, &tmp, "mp", &[]);

    let (got, moved) = read_counting(&mp.join("big"), m.pid(), "rchar", true);
    assert!(got == data, "read through the mount differs");
    assert!(moved < 1 << 20, "the daemon read {moved} bytes for a passthrough read");

    let before = rchar(m.pid());
    let new = random_bytes(LEN, 35);
    write_file(&mp.join("written"), &new);
    let moved = rchar(m.pid()) - before;
    assert!(moved < 1 << 20, "the daemon read {moved} bytes for a passthrough write");
    assert!(std::fs::read(srv.export.path().join("written")).unwrap() == new, "written data differs on the server");
    assert_eq!(std::fs::metadata(mp.join("written")).unwrap().len(), LEN as u64, "size seen through the mount");
    // And the server's clients read it.
    assert!(srv.tcp_client().read("/written").unwrap() == new);

    // Over TCP the daemon moves every byte, as before.
    let (m2, _d2, mp2) = mounted(&srv, &tmp, "tcp", &[("FERRY_SAME_HOST", "0")]);
    let (got, moved) = read_counting(&mp2.join("big"), m2.pid(), "rchar", true);
    assert!(got == data, "read through the TCP mount differs");
    assert!(moved >= LEN as u64, "over TCP the daemon read only {moved} bytes");
}

/// Readers and writers of one backed file, on one mount and on two, and
/// another client writing through the server: every reader sees every
/// write as soon as it returned (one page cache, the server's).
#[test]
fn writers_join_readers_backings_and_every_change_is_seen_at_once() {
    require_fuse();
    let srv = Server::start(&[]);
    let data = random_bytes(LEN, 36);
    std::fs::write(srv.export.path().join("f"), &data).unwrap();
    let tmp = TempDir::new("passthrough-join");
    let (ma, _da, a) = mounted(&srv, &tmp, "a", &[]);
    let (mb, _db, b) = mounted(&srv, &tmp, "b", &[]);
    // One process holds a reader on each mount (passthrough), then opens a
    // writer on mount A (it must join A's backing: any other open fails in
    // the kernel), writes through it; another client writes through the
    // server; both readers see both writes, and the daemons moved nothing.
    let script = r#"
import os, sys, socket
a, b, token_file, port = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
ra = os.open(a + "/f", os.O_RDONLY)
rb = os.open(b + "/f", os.O_RDONLY)
assert len(os.pread(ra, 1 << 20, 0)) == 1 << 20
assert len(os.pread(rb, 1 << 20, 0)) == 1 << 20
w = os.open(a + "/f", os.O_WRONLY)
os.pwrite(w, b"A" * 4096, 4096)
for r in (ra, rb):
    got = os.pread(r, 4096, 4096)
    assert got == b"A" * 4096, ("reader missed the mount's write", got[:16])
print("ok", flush=True)
# The test writes through the library now and tells us by stdin.
sys.stdin.readline()
for r in (ra, rb):
    got = os.pread(r, 4096, 8192)
    assert got == b"L" * 4096, ("reader missed the library's write", got[:16])
os.close(w); os.close(ra); os.close(rb)
print("done", flush=True)
"#;
    let (pa, pb) = (rchar(ma.pid()), rchar(mb.pid()));
    let mut child = Command::new("timeout")
        .args(["60", "python3", "-c", script])
        .arg(&a)
        .arg(&b)
        .arg(&srv.token_file)
        .arg(srv.port.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "ok", "the readers did not see the mount's write");
    let c = srv.tcp_client();
    let f = c.open("/f", OpenOptions::new().write(true)).unwrap();
    f.write_at(&[b'L'; 4096], 8192).unwrap();
    f.close().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"go\n").unwrap();
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert!(child.wait().unwrap().success(), "a reader missed a write");
    assert_eq!(line.trim(), "done");
    let moved = (rchar(ma.pid()) - pa) + (rchar(mb.pid()) - pb);
    assert!(moved < 1 << 20, "the daemons read {moved} bytes");
    let disk = std::fs::read(srv.export.path().join("f")).unwrap();
    assert!(disk[4096..8192] == [b'A'; 4096] && disk[8192..12288] == [b'L'; 4096], "the server's file");
    assert!(disk[12288..] == data[12288..] && disk[..4096] == data[..4096], "the rest of the file changed");
}

/// A `create` that opens an existing file the kernel thought absent (a
/// name another client linked to a file this mount holds backed) joins the
/// backing, and what it writes is the file's.
#[test]
fn a_create_behind_a_negative_entry_joins_the_files_backing() {
    require_fuse();
    let srv = Server::start(&[]);
    let data = random_bytes(LEN, 37);
    std::fs::write(srv.export.path().join("f"), &data).unwrap();
    let tmp = TempDir::new("passthrough-create");
    let mp = tmp.path().join("mp");
    std::fs::create_dir(&mp).unwrap();
    let _d = Detach(mp.clone());
    // A long entry timeout: the kernel keeps "no such file" for `g`.
    let _m = mount_url(&srv.url("/"), &mp, &srv.token_file, &["--entry-timeout", "60", "--lease-timeout", "0"]);
    let script = r#"
import os, sys, subprocess
mp, export = sys.argv[1], sys.argv[2]
r = os.open(mp + "/f", os.O_RDONLY)
assert len(os.pread(r, 1 << 20, 0)) == 1 << 20
assert not os.path.exists(mp + "/g")
os.link(export + "/f", export + "/g")
w = os.open(mp + "/g", os.O_WRONLY | os.O_CREAT, 0o644)
os.pwrite(w, b"C" * 4096, 0)
assert os.pread(r, 4096, 0) == b"C" * 4096, "the reader missed the write"
os.close(w); os.close(r)
print("ok")
"#;
    let out = python(script, &[mp.to_str().unwrap(), srv.export.path().to_str().unwrap()]);
    assert_eq!(out.trim(), "ok");
    assert!(std::fs::read(srv.export.path().join("f")).unwrap()[..4096] == [b'C'; 4096]);
}

/// A program on the mount runs (an executable never starts a backing),
/// and while it runs it cannot be opened for writing (`ETXTBSY`), as on a
/// local file system.
#[test]
fn an_executable_runs_from_the_mount_and_is_busy_while_it_runs() {
    require_fuse();
    let srv = Server::start(&[]);
    let tmp = TempDir::new("passthrough-exec");
    let (_m, _d, mp) = mounted(&srv, &tmp, "mp", &[]);
    let prog = mp.join("sleep");
    std::fs::copy("/bin/sleep", &prog).unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut child = Command::new(&prog).arg("5").spawn().expect("run the program from the mount");
    std::thread::sleep(Duration::from_millis(300));
    let e = std::fs::OpenOptions::new().write(true).open(&prog).expect_err("opened a running program for writing");
    assert_eq!(e.raw_os_error(), Some(libc::ETXTBSY), "{e}");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(Command::new(&prog).arg("0").status().unwrap().success());
    assert!(std::fs::read(&prog).unwrap() == std::fs::read("/bin/sleep").unwrap());
}

/// Writes through one mount's backing go past the server: another mount
/// holding a lease on the file (and keeping its attributes for the lease
/// timeout) sees the new size at once, because the descriptor lent for
/// writing broke its lease.
#[test]
fn a_write_past_the_server_breaks_another_mounts_lease() {
    require_fuse();
    let srv = Server::start(&[]);
    std::fs::write(srv.export.path().join("f"), random_bytes(1 << 20, 38)).unwrap();
    let tmp = TempDir::new("passthrough-lease");
    let (_ma, _da, a) = mounted(&srv, &tmp, "a", &[]);
    let (_mb, _db, b) = mounted(&srv, &tmp, "b", &[]);
    assert_eq!(std::fs::metadata(b.join("f")).unwrap().len(), 1 << 20);
    write_file(&a.join("f"), &random_bytes(3 << 20, 39));
    assert!(
        wait_for(Duration::from_secs(1), || std::fs::metadata(b.join("f")).unwrap().len() == 3 << 20),
        "the other mount still sees {} bytes",
        std::fs::metadata(b.join("f")).unwrap().len()
    );
}

/// `ferry run` on the server's host: a program's read-only open of a large
/// file gets the server's own descriptor (the old code gave a placeholder,
/// a memfd), reads the right data through it, `mmap`s it, and sees another
/// client's change at once; a small file and `FERRY_SAME_HOST=0` keep the
/// placeholder, and a writer gets the descriptor too (lent for writing:
/// `tests/run_write.rs`).
#[test]
fn ferry_run_hands_a_reader_the_servers_descriptor() {
    let srv = Server::start(&[]);
    std::fs::write(srv.export.path().join("big"), random_bytes(LEN, 40)).unwrap();
    std::fs::write(srv.export.path().join("small"), b"small file").unwrap();
    let cwd = TempDir::new("passthrough-run");
    let script = r#"
import hashlib, mmap, os, sys
def target(path, flags=os.O_RDONLY):
    fd = os.open(path, flags)
    t = os.readlink(f"/proc/self/fd/{fd}")
    return fd, t
fd, t = target("/remote/big")
print("big", t)
h = hashlib.sha256()
while True:
    b = os.read(fd, 1 << 20)
    if not b:
        break
    h.update(b)
print("sha", h.hexdigest())
m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
print("mmap", hashlib.sha256(m[:]).hexdigest())
sys.stdout.flush()
sys.stdin.readline()
print("changed", os.pread(fd, 8, 4096))
print("small", target("/remote/small")[1].startswith("/memfd:"))
print("writer", target("/remote/big", os.O_RDWR)[1].startswith("/memfd:"))
"#;
    let mut child = Command::new("timeout")
        .args(["60", common::FERRY, "run", "--mount"])
        .arg(format!("/remote={}", srv.url("/")))
        .args(["--", "python3", "-c", script])
        .current_dir(cwd.path())
        .env("FERRY_TOKEN_FILE", &srv.token_file)
        .env_remove("FERRY_TOKEN")
        .env_remove("FERRY_MOUNTS")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    for _ in 0..3 {
        let mut l = String::new();
        std::io::BufRead::read_line(&mut out, &mut l).unwrap();
        lines.push(l.trim().to_string());
    }
    let big = srv.export.path().join("big");
    let sum = Command::new("sha256sum").arg(&big).output().unwrap();
    let sum = common::stdout(&sum).split_whitespace().next().unwrap().to_string();
    assert_eq!(lines[0], format!("big {}", big.display()), "not the server's descriptor");
    assert_eq!(lines[1], format!("sha {sum}"), "read through the descriptor");
    assert_eq!(lines[2], format!("mmap {sum}"), "mapped through the descriptor");
    let f = srv.tcp_client().open("/big", OpenOptions::new().write(true)).unwrap();
    f.write_at(b"CHANGED!", 4096).unwrap();
    f.close().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"go\n").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(child.wait().unwrap().success(), "the program failed: {rest}");
    assert_eq!(rest.lines().collect::<Vec<_>>(), ["changed b'CHANGED!'", "small True", "writer False"]);

    // Without the same-host path: a placeholder.
    let o = Command::new("timeout")
        .args(["60", common::FERRY, "run", "--mount"])
        .arg(format!("/remote={}", srv.url("/")))
        .args(["--", "python3", "-c", "import os; print(os.readlink('/proc/self/fd/%d' % os.open('/remote/big', 0)))"])
        .current_dir(cwd.path())
        .env("FERRY_TOKEN_FILE", &srv.token_file)
        .env("FERRY_SAME_HOST", "0")
        .env_remove("FERRY_TOKEN")
        .env_remove("FERRY_MOUNTS")
        .output()
        .unwrap();
    assert!(common::stdout(&o).trim().starts_with("/memfd:"), "FERRY_SAME_HOST=0: {}", common::stdout(&o));
}

/// `ferry bench --same-host --quick` runs every way (the figures it prints
/// from tiny sizes mean nothing; the series exist).
#[test]
fn the_same_host_bench_prints_its_series() {
    require_fuse();
    let o = Command::new("timeout").args(["300", common::FERRY, "bench", "--same-host", "--quick"]).output().unwrap();
    let out = common::stdout(&o);
    assert!(o.status.success(), "{out}{}", common::stderr(&o));
    for row in [
        "local dd of the export's file",
        "ferry mount, same host (passthrough)",
        "ferry mount over TCP",
        "ferry run, same host (descriptor)",
        "ferry run over TCP",
    ] {
        assert_eq!(out.matches(row).count(), 2, "no read and write row {row:?}:\n{out}");
    }
}

/// A server restart under a backed file: a reader and a writer open on
/// the mount go on (the backing is the file itself, as a handle re-opened
/// by identity would be), their data right; after it new opens take new
/// backings through the new server, and the mount's writes land.
#[test]
fn a_server_restart_leaves_backed_files_working() {
    use common::restart::Serve;
    require_fuse();
    let export = TempDir::new("pt-restart-export");
    let state = TempDir::new("pt-restart-state");
    let token = state.path().join("token");
    let mut server = Serve::start(export.path(), 0, &token);
    let port = server.port;
    let data = random_bytes(LEN, 41);
    std::fs::write(export.path().join("f"), &data).unwrap();
    let mp = state.path().join("mp");
    std::fs::create_dir(&mp).unwrap();
    let _d = Detach(mp.clone());
    let _m = mount_url(&format!("ferry://127.0.0.1:{port}/"), &mp, &token, &[]);
    let script = r#"
import os, sys, hashlib
mp = sys.argv[1]
r = os.open(mp + "/f", os.O_RDONLY)
w = os.open(mp + "/f", os.O_WRONLY)
assert len(os.pread(r, 1 << 20, 0)) == 1 << 20
print("open", flush=True)
sys.stdin.readline()
os.pwrite(w, b"R" * 4096, 0)
assert os.pread(r, 4096, 0) == b"R" * 4096, "the reader missed the write"
out = bytearray()
while True:
    b = os.pread(r, 1 << 20, len(out))
    if not b:
        break
    out += b
print(hashlib.sha256(bytes(out)).hexdigest(), flush=True)
os.close(r); os.close(w)
n = os.open(mp + "/f", os.O_RDWR)
os.pwrite(n, b"N" * 4096, 8192)
os.close(n)
print("done", flush=True)
"#;
    let mut child = Command::new("timeout")
        .args(["90", "python3", "-c", script])
        .arg(&mp)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "open");
    server.kill();
    let _server = Serve::start(export.path(), port, &token);
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"go\n").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(child.wait().unwrap().success(), "the program failed: {rest}");
    let mut want = data.clone();
    want[..4096].copy_from_slice(&[b'R'; 4096]);
    let sum = {
        let p = state.path().join("want");
        std::fs::write(&p, &want).unwrap();
        let o = Command::new("sha256sum").arg(&p).output().unwrap();
        common::stdout(&o).split_whitespace().next().unwrap().to_string()
    };
    assert_eq!(rest.lines().collect::<Vec<_>>(), [sum.as_str(), "done"]);
    let disk = std::fs::read(export.path().join("f")).unwrap();
    assert!(disk[..4096] == [b'R'; 4096] && disk[8192..12288] == [b'N'; 4096], "the server's file");
}
