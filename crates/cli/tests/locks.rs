//! Record locks end to end: sqlite3 and python programs under `ferry run`
//! and on two `ferry mount`s of one server, a killed holder, and the
//! degradation to `ENOLCK` against a server without the capability.

mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::fuse::{require_fuse, Detach};
use common::{stderr, stdout, Server, TempDir, FERRY};

/// `ferry run --mount /remote=URL -- PROGRAM ARGS` (under `timeout 120`
/// if `bounded`; unbounded, the child's pid is the program's, as `ferry
/// run` execs it).
fn run_cmd(srv: &Server, bounded: bool, args: &[&str]) -> Command {
    let lib = Path::new(FERRY).with_file_name("libferry_preload.so");
    assert!(lib.is_file(), "{} missing: build the workspace first", lib.display());
    let mut c = if bounded {
        let mut c = Command::new("timeout");
        c.args(["120", FERRY]);
        c
    } else {
        Command::new(FERRY)
    };
    c.args(["run", "--mount"])
        .arg(format!("/remote={}", srv.url("/")))
        .arg("--")
        .args(args)
        .env("FERRY_TOKEN_FILE", &srv.token_file)
        .env_remove("FERRY_TOKEN")
        .env_remove("FERRY_MOUNTS");
    c
}

fn run(srv: &Server, args: &[&str]) -> Output {
    run_cmd(srv, true, args).output().expect("run ferry run")
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "failed: {:?}\nstdout:\n{}\nstderr:\n{}", o.status, stdout(o), stderr(o));
    stdout(o)
}

/// Increments the number in a file `n` times, each under a lock taken the
/// way `mode` says; a lost update shows as a short final count.
const COUNTER: &str = r#"
import fcntl, sys
path, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for _ in range(n):
    with open(path, "r+") as f:
        if mode == "flock":
            fcntl.flock(f, fcntl.LOCK_EX)
        else:
            fcntl.lockf(f, fcntl.LOCK_EX)
        v = int(f.read() or "0")
        f.seek(0)
        f.write(str(v + 1))
        f.flush()
        if mode == "flock":
            fcntl.flock(f, fcntl.LOCK_UN)
        else:
            fcntl.lockf(f, fcntl.LOCK_UN)
"#;

fn sqlite_inserts(n: usize, tag: &str) -> String {
    (0..n).map(|i| format!("INSERT INTO t VALUES('{tag}', {i});\n")).collect()
}

fn sqlite_with_input(args: &[&str], input: &str, cmd: Command) -> Child {
    let mut cmd = cmd;
    let mut child = cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    child
}

fn wait_ok(c: Child) -> String {
    ok(&c.wait_with_output().unwrap())
}

#[test]
fn sqlite_rollback_mode_under_ferry_run() {
    let s = Server::start(&[]);
    let db = "/remote/t.db";
    let out = ok(&run(
        &s,
        &[
            "sqlite3",
            db,
            "PRAGMA journal_mode=DELETE; CREATE TABLE t(tag, i); INSERT INTO t VALUES('x', 1); SELECT count(*) FROM t;",
        ],
    ));
    assert_eq!(out, "delete\n1\n");
    // Two writers at once, each committing 40 transactions: the locks
    // serialise them (sqlite's busy timeout retries a refused lock).
    let writers: Vec<Child> = ["a", "b"]
        .iter()
        .map(|tag| {
            let c = run_cmd(&s, true, &["sqlite3", "-cmd", ".timeout 30000", db]);
            sqlite_with_input(&[], &sqlite_inserts(40, tag), c)
        })
        .collect();
    for w in writers {
        wait_ok(w);
    }
    let out = ok(&run(&s, &["sqlite3", db, "SELECT count(*) FROM t; PRAGMA integrity_check;"]));
    assert_eq!(out, "81\nok\n");
    // The server's own view of the file agrees.
    let o = Command::new("sqlite3").arg(s.export.path().join("t.db")).arg("PRAGMA integrity_check;").output().unwrap();
    assert_eq!(ok(&o), "ok\n");
}

#[test]
fn sqlite_wal_mode_with_concurrent_writers_under_ferry_run() {
    // WAL mode shares its index (the -shm file) between processes through
    // `mmap(MAP_SHARED)`: each process seeing its own copy loses commits
    // without an error.
    let s = Server::start(&[]);
    let db = "/remote/w.db";
    assert_eq!(ok(&run(&s, &["sqlite3", db, "PRAGMA journal_mode=WAL; CREATE TABLE t(tag, i);"])), "wal\n");
    let writers: Vec<Child> = ["a", "b", "c"]
        .iter()
        .map(|tag| {
            let c = run_cmd(&s, true, &["sqlite3", "-cmd", ".timeout 30000", db]);
            sqlite_with_input(&[], &sqlite_inserts(50, tag), c)
        })
        .collect();
    for w in writers {
        wait_ok(w);
    }
    let out = ok(&run(&s, &["sqlite3", db, "SELECT tag, count(*) FROM t GROUP BY tag; PRAGMA integrity_check;"]));
    assert_eq!(out, "a|50\nb|50\nc|50\nok\n");
    let o = Command::new("sqlite3").arg(s.export.path().join("w.db")).arg("SELECT count(*) FROM t;").output().unwrap();
    assert_eq!(ok(&o), "150\n");
}

#[test]
fn lockf_and_flock_exclude_each_other_under_ferry_run() {
    let s = Server::start(&[]);
    let dir = TempDir::new("prog");
    let prog = dir.path().join("counter.py");
    std::fs::write(&prog, COUNTER).unwrap();
    std::fs::write(s.export.path().join("n"), "0").unwrap();
    let prog = prog.to_str().unwrap();
    let procs: Vec<Child> = ["lockf", "flock", "lockf"]
        .iter()
        .map(|mode| {
            let mut c = run_cmd(&s, true, &["python3", prog, "/remote/n", "150", mode]);
            c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
        })
        .collect();
    for p in procs {
        wait_ok(p);
    }
    assert_eq!(std::fs::read_to_string(s.export.path().join("n")).unwrap(), "450");
}

/// F_GETLK names the holder; a conflicting F_SETLK fails with EAGAIN; OFD
/// locks conflict with POSIX ones; the POSIX close rule releases a
/// process's locks when it closes *another* fd of the file; flock and
/// lockf(3) work on remote fds.
#[test]
fn posix_semantics_under_ferry_run() {
    let s = Server::start(&[]);
    std::fs::write(s.export.path().join("f"), "0123456789").unwrap();
    let script = r#"
import fcntl, os, struct, errno, ctypes
P = '/remote/f'
def getlk(fd, typ, start, ln):
    r = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack('hhqqi', typ, 0, start, ln, 0))
    return struct.unpack('hhqqi', r)
def try_lockf(f, start, ln):
    try:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, ln, start)
        return True
    except OSError as e:
        assert e.errno in (errno.EAGAIN, errno.EACCES), e
        return False
f = open(P, 'r+')
fcntl.lockf(f, fcntl.LOCK_EX, 5, 2)          # bytes 2..6
r, w = os.pipe()      # child -> parent
r2, w2 = os.pipe()    # parent -> child
pid = os.fork()
if pid == 0:
    g = open(P, 'r+')
    t = getlk(g.fileno(), fcntl.F_WRLCK, 0, 0)
    ok = t[0] == fcntl.F_WRLCK and t[2] == 2 and t[3] == 5 and t[4] == os.getppid()
    ok = ok and not try_lockf(g, 4, 1) and try_lockf(g, 7, 3)
    # An OFD lock conflicts with the parent's POSIX lock.
    F_OFD_SETLK = 37
    try:
        fcntl.fcntl(g.fileno(), F_OFD_SETLK, struct.pack('hhqqi', fcntl.F_RDLCK, 0, 3, 1, 0))
        ok = False
    except OSError as e:
        ok = ok and e.errno == errno.EAGAIN
    os.write(w, b'1' if ok else b'0')
    os.read(r2, 1)                             # parent closed its other fd
    ok = try_lockf(g, 2, 5)
    # lockf(3) through libc, and flock, on a remote fd.
    libc = ctypes.CDLL(None, use_errno=True)
    g.seek(0)
    ok = ok and libc.lockf(g.fileno(), 2, 0) == 0        # F_TLOCK to the end
    ok = ok and libc.lockf(g.fileno(), 0, 0) == 0        # F_ULOCK
    # flock belongs to the open file description: two opens conflict.
    h1, h2 = open(P, 'r'), open(P, 'r')
    fcntl.flock(h1, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        fcntl.flock(h2, fcntl.LOCK_SH | fcntl.LOCK_NB)
        ok = False
    except BlockingIOError:
        pass
    fcntl.flock(h1, fcntl.LOCK_UN)
    fcntl.flock(h2, fcntl.LOCK_SH | fcntl.LOCK_NB)
    os.write(w, b'1' if ok else b'0')
    os._exit(0)
assert os.read(r, 1) == b'1', 'child saw wrong lock state'
other = open(P, 'r')
other.close()                                  # POSIX: releases the lock taken through f
os.write(w2, b'x')
assert os.read(r, 1) == b'1', 'lock survived the close of another fd'
os.waitpid(pid, 0)
print('ok')
"#;
    assert_eq!(ok(&run(&s, &["python3", "-c", script])), "ok\n");
}

/// A holder killed with SIGKILL: its connection closes and the server
/// releases the lock, so a waiting process gets it.
#[test]
fn a_killed_holder_releases_its_lock() {
    let s = Server::start(&[]);
    std::fs::write(s.export.path().join("f"), "x").unwrap();
    let hold = "import fcntl, sys, time\nf = open('/remote/f', 'r+')\nfcntl.lockf(f, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(120)\n";
    let mut holder = run_cmd(&s, false, &["python3", "-c", hold]).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(holder.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line, "held\n");
    let probe = "import fcntl\nf = open('/remote/f', 'r+')\ntry:\n    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    print('free')\nexcept OSError:\n    print('held')\n";
    assert_eq!(ok(&run(&s, &["python3", "-c", probe])), "held\n");
    // `ferry run` execs the program: this pid is python's.
    holder.kill().unwrap();
    holder.wait().unwrap();
    // A blocking lock now returns once the server saw the connection end.
    let t = Instant::now();
    let wait = "import fcntl\nf = open('/remote/f', 'r+')\nfcntl.lockf(f, fcntl.LOCK_EX)\nprint('got')\n";
    assert_eq!(ok(&run(&s, &["python3", "-c", wait])), "got\n");
    assert!(t.elapsed() < Duration::from_secs(30));
}

#[test]
fn without_the_capability_locks_fail_with_enolck() {
    let s = Server::start(&["--disable-caps", "locks"]);
    std::fs::write(s.export.path().join("f"), "x").unwrap();
    let script = "import fcntl, errno\nf = open('/remote/f', 'r+')\ntry:\n    fcntl.lockf(f, fcntl.LOCK_EX)\n    print('locked')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n";
    assert_eq!(ok(&run(&s, &["python3", "-c", script])), "ENOLCK\n");
}

/// Mounts `srv` at a fresh directory (names re-checked on every lookup, so
/// one mount sees the files the other creates at once).
fn mount(srv: &Server) -> (TempDir, Detach) {
    let mpd = TempDir::new("mnt");
    let o = srv.ferry(&[
        "mount",
        &srv.url("/"),
        mpd.path().to_str().unwrap(),
        "--background",
        "--entry-timeout",
        "0",
        "--attr-timeout",
        "0",
    ]);
    assert!(o.status.success(), "mount failed: {}", stderr(&o));
    let guard = Detach(mpd.path().to_path_buf());
    (mpd, guard)
}

#[test]
fn two_mounts_serialise_flock_counters_and_sqlite() {
    require_fuse();
    let s = Server::start(&[]);
    let (m1, _g1) = mount(&s);
    let (m2, _g2) = mount(&s);
    let dir = TempDir::new("prog");
    let prog = dir.path().join("counter.py");
    std::fs::write(&prog, COUNTER).unwrap();
    std::fs::write(s.export.path().join("n"), "0").unwrap();
    let procs: Vec<Child> = [(&m1, "flock"), (&m2, "flock"), (&m2, "lockf")]
        .iter()
        .map(|(m, mode)| {
            Command::new("timeout")
                .arg("120")
                .arg("python3")
                .arg(&prog)
                .arg(m.path().join("n"))
                .args(["150", mode])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for p in procs {
        wait_ok(p);
    }
    assert_eq!(std::fs::read_to_string(s.export.path().join("n")).unwrap(), "450");

    // sqlite3 in rollback mode, one writer on each mount.
    let db1 = m1.path().join("r.db");
    let o = Command::new("sqlite3").arg(&db1).arg("PRAGMA journal_mode=DELETE; CREATE TABLE t(tag, i);").output();
    assert_eq!(ok(&o.unwrap()), "delete\n");
    let writers: Vec<Child> = [(&m1, "a"), (&m2, "b")]
        .iter()
        .map(|(m, tag)| {
            let mut c = Command::new("timeout");
            c.args(["120", "sqlite3", "-cmd", ".timeout 30000"]).arg(m.path().join("r.db"));
            sqlite_with_input(&[], &sqlite_inserts(40, tag), c)
        })
        .collect();
    for w in writers {
        wait_ok(w);
    }
    let o = Command::new("sqlite3")
        .arg(m2.path().join("r.db"))
        .arg("SELECT count(*) FROM t; PRAGMA integrity_check;")
        .output();
    assert_eq!(ok(&o.unwrap()), "80\nok\n");

    // WAL mode needs the -shm file shared through mmap: two processes on
    // one mount (WAL never works across machines, by sqlite's design).
    let db = m1.path().join("w.db");
    let o = Command::new("sqlite3").arg(&db).arg("PRAGMA journal_mode=WAL; CREATE TABLE t(tag, i);").output();
    assert_eq!(ok(&o.unwrap()), "wal\n");
    let writers: Vec<Child> = ["a", "b"]
        .iter()
        .map(|tag| {
            let mut c = Command::new("timeout");
            c.args(["120", "sqlite3", "-cmd", ".timeout 30000"]).arg(&db);
            sqlite_with_input(&[], &sqlite_inserts(40, tag), c)
        })
        .collect();
    for w in writers {
        wait_ok(w);
    }
    let o = Command::new("sqlite3").arg(&db).arg("SELECT count(*) FROM t; PRAGMA integrity_check;").output();
    assert_eq!(ok(&o.unwrap()), "80\nok\n");
    for m in [&m1, &m2] {
        let o = Command::new(FERRY).args(["umount"]).arg(m.path()).output().unwrap();
        assert!(o.status.success(), "umount: {}", stderr(&o));
    }
}

/// A closed file's `release` reaches the mount in the background, after the
/// kernel may have reused its `struct file` (the flock owner id) for the
/// next open: that late release must not drop the newer file's flock. The
/// race is timing-dependent; many rounds give it a chance to show.
#[test]
fn a_late_release_leaves_a_newer_flock_alone() {
    use std::os::fd::AsRawFd;
    require_fuse();
    let s = Server::start(&[]);
    let (m1, _g1) = mount(&s);
    let (m2, _g2) = mount(&s);
    std::fs::write(s.export.path().join("f"), "").unwrap();
    let rw = |m: &TempDir| std::fs::OpenOptions::new().read(true).write(true).open(m.path().join("f")).unwrap();
    let flock = |f: &std::fs::File, op: i32| {
        // SAFETY: flock on a descriptor that `f` keeps open.
        if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    let other = rw(&m2);
    let mut stolen = 0;
    for _ in 0..400 {
        let f = rw(&m1);
        flock(&f, libc::LOCK_EX).unwrap();
        flock(&f, libc::LOCK_UN).unwrap();
        drop(f);
        let g = rw(&m1);
        flock(&g, libc::LOCK_EX).unwrap();
        for _ in 0..3 {
            match flock(&other, libc::LOCK_EX | libc::LOCK_NB) {
                Ok(()) => {
                    stolen += 1;
                    flock(&other, libc::LOCK_UN).unwrap();
                    break;
                }
                Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EWOULDBLOCK)),
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    assert_eq!(stolen, 0, "a flock held on one mount was taken on the other");
}

/// `flock(1)` opens its lock file read-only and takes `LOCK_EX`, which
/// Linux allows: on two mounts it serialises, and a read-only descriptor's
/// exclusive flock excludes the other mount until `LOCK_UN`. (It failed with
/// `EBADF`: the kernel's flock flag does not reach the daemon, and a POSIX
/// write lock needs a writable handle.)
#[test]
fn flock_exclusive_on_a_read_only_descriptor_works_on_the_mount() {
    require_fuse();
    let s = Server::start(&[]);
    let (m1, _g1) = mount(&s);
    let (m2, _g2) = mount(&s);
    std::fs::write(s.export.path().join("lockfile"), b"").unwrap();
    let script = r#"
import fcntl, os, sys, time
a = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(a, fcntl.LOCK_EX | fcntl.LOCK_NB)
b = os.open(sys.argv[2], os.O_RDONLY)
try:
    fcntl.flock(b, fcntl.LOCK_SH | fcntl.LOCK_NB)
    print("not excluded")
    sys.exit(1)
except BlockingIOError:
    pass
fcntl.flock(a, fcntl.LOCK_UN)
fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)
fcntl.flock(b, fcntl.LOCK_UN)
# fcntl locks on a writable descriptor are unaffected.
w = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(w, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)
print("ok")
"#;
    let o = Command::new("timeout")
        .args(["60", "python3", "-c", script])
        .arg(m1.path().join("lockfile"))
        .arg(m2.path().join("lockfile"))
        .output()
        .unwrap();
    assert!(o.status.success() && stdout(&o).trim() == "ok", "{}{}", stdout(&o), stderr(&o));
    // flock(1), twice at once on the two mounts: the second waits for the first.
    let start = Instant::now();
    let hold = |m: &TempDir| {
        Command::new("timeout")
            .args(["60", "flock"])
            .arg(m.path().join("lockfile"))
            .args(["-c", "sleep 1"])
            .spawn()
            .unwrap()
    };
    let (mut x, mut y) = (hold(&m1), hold(&m2));
    assert!(x.wait().unwrap().success() && y.wait().unwrap().success());
    assert!(start.elapsed() >= Duration::from_millis(1900), "flock(1) on two mounts overlapped: {:?}", start.elapsed());
}

/// A program on the server's host locking `path` itself (`lockf`, a POSIX
/// lock: it meets the OFD locks the server takes for its clients): `sh`
/// a shared lock through a read-only descriptor, `ex` an exclusive one
/// through a writable one. "locked" or "refused".
fn host_lock(path: &Path, how: &str) -> String {
    let script = r#"
import fcntl, sys
f = open(sys.argv[1], "rb" if sys.argv[2] == "sh" else "r+b")
try:
    fcntl.lockf(f, (fcntl.LOCK_SH if sys.argv[2] == "sh" else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    print("locked")
except OSError:
    print("refused")
"#;
    let o = Command::new("python3").args(["-c", script]).arg(path).arg(how).output().unwrap();
    ok(&o).trim().to_string()
}

/// A client that may only read a file takes an exclusive `flock` through
/// ferry (Linux lets a read-only descriptor do that): the server's other
/// clients and the host's writers are kept out, but the host's readers
/// still get their shared locks, since the lock taken on the file itself
/// is never stronger than the client's handle could take with `fcntl`
/// (PROTOCOL.md, `Lock`). Through a handle open for writing it is
/// exclusive there too.
#[test]
fn a_readers_exclusive_flock_leaves_the_hosts_readers_their_shared_locks() {
    use ferry_client::{LockKind, LockSpec, LockType, OpenOptions};
    let s = Server::start(&[]);
    let path = s.export.path().join("shared");
    std::fs::write(&path, b"data").unwrap();
    let flock = |typ| LockSpec { kind: LockKind::Flock, typ, start: 0, len: 0, pid: u32::MAX };
    let (c, d) = (s.client(), s.client());
    let reader = c.open("/shared", OpenOptions::new().read(true)).unwrap();
    reader.try_lock(&flock(LockType::Write)).unwrap();
    let other = d.open("/shared", OpenOptions::new().read(true)).unwrap();
    assert_eq!(other.try_lock(&flock(LockType::Read)).unwrap_err().errno(), libc::EAGAIN, "not exclusive in ferry");
    assert_eq!(host_lock(&path, "sh"), "locked", "a reader's flock kept the host's readers out");
    assert_eq!(host_lock(&path, "ex"), "refused", "a host writer locked over a ferry client's flock");

    reader.unlock(LockKind::Flock, 0, 0).unwrap();
    let writer = c.open("/shared", OpenOptions::new().read(true).write(true)).unwrap();
    writer.try_lock(&flock(LockType::Write)).unwrap();
    assert_eq!(host_lock(&path, "sh"), "refused", "a writer's exclusive flock let a host reader in");
    writer.unlock(LockKind::Flock, 0, 0).unwrap();
    assert_eq!(host_lock(&path, "ex"), "locked");
}
