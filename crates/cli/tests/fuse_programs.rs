//! Real programs on a real `ferry mount`: git, tar, sqlite3, python3 venv
//! and pip, make + cc. Each test starts its own `ferry serve` and `ferry
//! mount`, checks what the program produced (through the mount and in the
//! server's export), and unmounts on drop even when it fails. A watchdog
//! kills a mount daemon that outlives its test, and every program runs with
//! a time limit, so a hung FUSE request fails the test instead of hanging
//! the suite. Without /dev/fuse or root, or with a program missing (`test.sh`
//! installs them all), a test fails; none skips.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::fuse::{is_live, is_mounted, require_fuse, wait_for};
use common::{random_bytes, Server, TempDir, FERRY};
use rustix::mount::UnmountFlags;
use rustix::process::{Pid, Signal};

/// Longest any one test may keep a mount.
const TEST_LIMIT: Duration = Duration::from_secs(300);
/// Longest one program run may take (a venv with pip writes ~1,000 files).
const CMD_LIMIT: Duration = Duration::from_secs(120);

/// A foreground `ferry mount` daemon on a private mount point, with the
/// server it talks to. Dropping it unmounts (SIGTERM, then a lazy detach if
/// anything is left) and kills the daemon by PID.
struct Mount {
    child: Child,
    dir: TempDir,
    log: PathBuf,
    stop_watchdog: Option<mpsc::Sender<()>>,
    // Dropped after the mount: the daemon's server outlives it.
    server: Server,
}

impl Mount {
    fn start(extra: &[&str]) -> Mount {
        static N: AtomicUsize = AtomicUsize::new(0);
        let server = Server::start(&[]);
        let dir = TempDir::new("mnt");
        let mp = dir.path().to_path_buf();
        let log = server.state.path().join(format!("mount-{}.log", N.fetch_add(1, Ordering::Relaxed)));
        let mut cmd = Command::new(FERRY);
        cmd.arg("mount").arg(server.url("/")).arg(&mp).args(extra);
        cmd.env("FERRY_TOKEN_FILE", &server.token_file).env_remove("FERRY_TOKEN");
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(fs::File::create(&log).expect("log"));
        let child = cmd.spawn().expect("spawn ferry mount");
        let pid = child.id();
        let (tx, rx) = mpsc::channel::<()>();
        let wmp = mp.clone();
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(TEST_LIMIT) {
                eprintln!("watchdog: killing mount daemon {pid} after {TEST_LIMIT:?}");
                let _ = rustix::process::kill_process(Pid::from_raw(pid as i32).expect("pid"), Signal::KILL);
                let _ = rustix::mount::unmount(&wmp, UnmountFlags::DETACH);
            }
        });
        let mut m = Mount { child, dir, log, stop_watchdog: Some(tx), server };
        let ready = wait_for(Duration::from_secs(20), || is_live(&mp) || m.exited());
        assert!(ready && is_live(&mp), "mount did not come up: {}", m.log());
        m
    }

    fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The same path in the server's export, bypassing the mount.
    fn exported(&self, rel: &str) -> PathBuf {
        self.server.export.path().join(rel)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(tx) = self.stop_watchdog.take() {
            let _ = tx.send(());
        }
        if !self.exited() {
            let _ = rustix::process::kill_process(Pid::from_raw(self.child.id() as i32).expect("pid"), Signal::TERM);
            wait_for(Duration::from_secs(5), || self.exited());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if is_mounted(self.dir.path()) {
            let _ = rustix::mount::unmount(self.dir.path(), UnmountFlags::DETACH);
        }
    }
}

/// Output of a finished program.
struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs a program with a time limit; output goes through files so a full
/// pipe can never block it. Git gets a fixed identity and no user or
/// system configuration; pip never looks for an index.
fn run(cmd: &mut Command) -> Out {
    let dir = TempDir::new("cmd");
    let (o, e) = (dir.path().join("out"), dir.path().join("err"));
    cmd.stdin(Stdio::null()).stdout(fs::File::create(&o).unwrap()).stderr(fs::File::create(&e).unwrap());
    cmd.env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "Ferry Test")
        .env("GIT_AUTHOR_EMAIL", "test@ferry.invalid")
        .env("GIT_COMMITTER_NAME", "Ferry Test")
        .env("GIT_COMMITTER_EMAIL", "test@ferry.invalid")
        .env("PIP_NO_INDEX", "1")
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .env_remove("MAKEFLAGS");
    let mut child =
        cmd.spawn().unwrap_or_else(|err| panic!("spawn {cmd:?}: {err} (is it installed? test.sh installs it)"));
    let end = Instant::now() + CMD_LIMIT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} took longer than {CMD_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Out {
        ok: status.success(),
        stdout: fs::read_to_string(o).unwrap_or_default(),
        stderr: fs::read_to_string(e).unwrap_or_default(),
    }
}

/// `sh -c SCRIPT` in `dir`; panics with the output unless it succeeds.
fn sh(script: &str, dir: &Path) -> String {
    let o = run(Command::new("sh").arg("-c").arg(script).current_dir(dir));
    assert!(o.ok, "`{script}` in {} failed:\n{}{}", dir.display(), o.stdout, o.stderr);
    o.stdout
}

#[test]
fn git_init_add_commit_status_log() {
    require_fuse();
    git_on(&Mount::start(&[]));
}

fn git_on(m: &Mount) {
    let repo = m.p("repo");
    fs::create_dir(&repo).unwrap();
    sh("git init -q -b main .", &repo);
    fs::write(repo.join("README"), "hello from the mount\n").unwrap();
    fs::create_dir_all(repo.join("src/deep")).unwrap();
    for i in 0..40 {
        fs::write(repo.join(format!("src/deep/f{i}.txt")), format!("file {i}\n").repeat(i + 1)).unwrap();
    }
    fs::write(repo.join("blob.bin"), random_bytes(300_000, 5)).unwrap();
    sh("git add -A && git commit -q -m 'first commit'", &repo);
    assert_eq!(sh("git status --porcelain", &repo), "", "clean after commit");

    // A change, a new file and a removal show in status, then commit.
    fs::write(repo.join("README"), "changed\n").unwrap();
    fs::write(repo.join("new.txt"), "new\n").unwrap();
    fs::remove_file(repo.join("src/deep/f3.txt")).unwrap();
    let status = sh("git status --porcelain", &repo);
    let mut lines: Vec<&str> = status.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, [" D src/deep/f3.txt", " M README", "?? new.txt"], "{status}");
    sh("git add -A && git commit -q -m 'second commit'", &repo);
    assert_eq!(sh("git status --porcelain", &repo), "");

    // Branch, commit on it, merge back (git renames lock files into place).
    sh("git checkout -q -b side && echo side > side.txt && git add side.txt && git commit -q -m 'side'", &repo);
    sh("git checkout -q main && git merge -q --no-edit side", &repo);
    let log = sh("git log --format=%s", &repo);
    assert_eq!(log.lines().collect::<Vec<_>>(), ["side", "second commit", "first commit"], "{log}");
    assert_eq!(sh("git show HEAD~2:README", &repo), "hello from the mount\n");

    // The object store is sound, and a git on the server side sees the same
    // history in the export.
    sh("git fsck --strict --no-progress", &repo);
    sh("git gc -q", &repo);
    let exported = m.exported("repo");
    let o = run(Command::new("git").args(["-c", "safe.directory=*", "log", "--format=%s"]).current_dir(&exported));
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(o.stdout, log);
    let o = run(Command::new("git").args(["-c", "safe.directory=*", "status", "--porcelain"]).current_dir(&exported));
    assert!(o.ok && o.stdout.is_empty(), "{}{}", o.stdout, o.stderr);

    // Clone off the mount, and back onto it.
    let local = TempDir::new("clone");
    let o = run(Command::new("git").arg("clone").arg("-q").arg(&repo).arg(local.path().join("c")));
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(fs::read(local.path().join("c/blob.bin")).unwrap(), random_bytes(300_000, 5));
    let o = run(Command::new("git").arg("clone").arg("-q").arg(local.path().join("c")).arg(m.p("clone2")));
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(sh("git log --format=%s", &m.p("clone2")), log);
    assert_eq!(fs::read_to_string(m.p("clone2/side.txt")).unwrap(), "side\n");
}

/// A local tree with files of awkward sizes, a symlink, an empty directory
/// and an executable.
fn make_tree(root: &Path) {
    for (i, size) in [0usize, 1, 511, 512, 4096, 65_537, 1 << 20, (3 << 20) + 7].iter().enumerate() {
        let dir = root.join(format!("d{}", i % 3)).join("sub");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(format!("f{i}")), random_bytes(*size, i as u64 + 11)).unwrap();
    }
    fs::create_dir(root.join("empty")).unwrap();
    std::os::unix::fs::symlink("d0/sub/f0", root.join("link")).unwrap();
    fs::write(root.join("run.sh"), "#!/bin/sh\necho ran\n").unwrap();
    fs::set_permissions(root.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
}

fn diff(a: &Path, b: &Path) {
    let o = run(Command::new("diff").arg("-r").arg("--no-dereference").arg(a).arg(b));
    assert!(o.ok, "{} and {} differ:\n{}{}", a.display(), b.display(), o.stdout, o.stderr);
}

#[test]
fn tar_create_and_extract() {
    require_fuse();
    tar_on(&Mount::start(&[]));
}

fn tar_on(m: &Mount) {
    let local = TempDir::new("tar");
    let src = local.path().join("src");
    make_tree(&src);

    // Archive written onto the mount (gzip through a pipe, then plain),
    // extracted off it.
    sh(&format!("tar czf {} -C {} .", m.p("a.tgz").display(), src.display()), local.path());
    sh(&format!("tar cf {} -C {} .", m.p("a.tar").display(), src.display()), local.path());
    assert_eq!(fs::read(m.p("a.tar")).unwrap(), fs::read(m.exported("a.tar")).unwrap());
    fs::create_dir(local.path().join("out")).unwrap();
    sh(&format!("tar xzf {} -C out", m.p("a.tgz").display()), local.path());
    diff(&src, &local.path().join("out"));

    // A local archive extracted onto the mount, with modes and times kept.
    sh("tar cf local.tar -C src .", local.path());
    fs::create_dir(m.p("x")).unwrap();
    sh(&format!("tar xpf {} -C {}", local.path().join("local.tar").display(), m.p("x").display()), local.path());
    diff(&src, &m.p("x"));
    diff(&src, &m.exported("x"));
    let (a, b) = (fs::metadata(src.join("d1/sub/f7")).unwrap(), fs::metadata(m.p("x/d1/sub/f7")).unwrap());
    assert_eq!(a.mtime(), b.mtime(), "tar restores mtimes");
    assert_eq!(fs::metadata(m.p("x/run.sh")).unwrap().permissions().mode() & 0o777, 0o755);
    assert_eq!(sh("./run.sh", &m.p("x")), "ran\n");

    // An archive of a tree on the mount, written on the mount, listed and
    // compared with tar's own --compare.
    sh("tar cf again.tar x && tar tf again.tar | sort > list && tar df again.tar", m.root());
    let list = fs::read_to_string(m.p("list")).unwrap();
    assert!(list.lines().any(|l| l == "x/d2/sub/f5"), "{list}");
    assert!(list.lines().any(|l| l == "x/link"), "{list}");
    fs::create_dir(m.p("y")).unwrap();
    sh("tar xf again.tar -C y", m.root());
    diff(&src, &m.p("y/x"));
}

/// Goes 40 directories of 200-byte names down (8 KiB from the export root,
/// twice `PATH_MAX`) one `chdir` at a time, as a program may, and works there.
const DEEP: &str = r#"
import os, sys
name = "d" * 200
for i in range(40):
    os.mkdir(name)
    os.chdir(name)
with open("leaf.txt", "w") as f:
    f.write("deep\n")
os.rename("leaf.txt", "leaf2.txt")
os.symlink("leaf2.txt", "ln")
print(open("ln").read(), end="")
print(sorted(os.listdir(".")))
os.chmod("leaf2.txt", 0o600)
os.chdir("..")
os.rename(name, "e" * 200)
print(open(os.path.join("e" * 200, "leaf2.txt")).read(), end="")
"#;

#[test]
fn trees_deeper_than_path_max_work_on_the_mount() {
    require_fuse();
    let m = Mount::start(&[]);
    let o = run(Command::new("python3").arg("-c").arg(DEEP).current_dir(m.root()));
    assert!(o.ok, "{}\n{}", o.stdout, o.stderr);
    assert_eq!(o.stdout, "deep\n['leaf2.txt', 'ln']\ndeep\n");
    // The server's own view (find walks with openat, no PATH_MAX).
    let found = run(Command::new("find").arg(".").arg("-name").arg("leaf2.txt").current_dir(m.exported("")));
    let path = found.stdout.trim_end();
    assert_eq!(path.len(), 1 + 39 * 201 + 201 + "/leaf2.txt".len(), "{path}");
    assert!(path.ends_with(&format!("/{}/leaf2.txt", "e".repeat(200))), "{path}");
}

#[test]
fn sqlite3_creates_and_queries_a_database() {
    require_fuse();
    sqlite_on(&Mount::start(&[]));
}

fn sqlite_on(m: &Mount) {
    let dir = m.p("db");
    fs::create_dir(&dir).unwrap();
    let sql = |db: &str, script: &str| -> String {
        let o = run(Command::new("sqlite3").arg("-batch").arg("-bail").arg(db).arg(script).current_dir(&dir));
        assert!(o.ok, "sqlite3 {db} `{script}` failed:\n{}{}", o.stdout, o.stderr);
        o.stdout
    };
    // Rollback journal (the default): created, filled in one transaction,
    // queried by a second process.
    sql(
        "t.db",
        "CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, v REAL);
         CREATE INDEX t_name ON t(name);
         BEGIN;
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000)
           INSERT INTO t(id, name, v) SELECT i, 'name' || (i % 100), i * 0.5 FROM n;
         COMMIT;",
    );
    assert_eq!(sql("t.db", "SELECT count(*), sum(id), max(v) FROM t;"), "5000|12502500|2500.0\n");
    assert_eq!(sql("t.db", "SELECT count(*) FROM t WHERE name = 'name7';"), "50\n");
    sql("t.db", "UPDATE t SET v = -1 WHERE id % 2 = 0; DELETE FROM t WHERE id > 4000;");
    assert_eq!(sql("t.db", "SELECT count(*), sum(v < 0) FROM t;"), "4000|2000\n");
    assert_eq!(sql("t.db", "PRAGMA integrity_check;"), "ok\n");
    // A rolled-back transaction leaves no trace (the journal is replayed
    // from the mount).
    sql("t.db", "BEGIN; DELETE FROM t; ROLLBACK;");
    assert_eq!(sql("t.db", "SELECT count(*) FROM t;"), "4000\n");
    assert!(!dir.join("t.db-journal").exists(), "journal left behind");

    // WAL mode: the -wal and -shm files, the latter shared through mmap.
    assert_eq!(sql("w.db", "PRAGMA journal_mode=WAL;"), "wal\n");
    sql("w.db", "CREATE TABLE kv(k TEXT PRIMARY KEY, v BLOB); INSERT INTO kv VALUES ('a', randomblob(100000));");
    sql("w.db", "INSERT INTO kv SELECT 'k' || value, zeroblob(1000) FROM generate_series(1, 300);");
    assert_eq!(sql("w.db", "SELECT count(*), sum(length(v)) FROM kv;"), "301|400000\n");
    sql("w.db", "PRAGMA wal_checkpoint(TRUNCATE);");
    assert_eq!(sql("w.db", "PRAGMA integrity_check;"), "ok\n");

    // The export holds a valid database the server side can read directly.
    let o = run(Command::new("sqlite3").arg(m.exported("db/t.db")).arg("SELECT count(*) FROM t;"));
    assert!(o.ok && o.stdout == "4000\n", "{}{}", o.stdout, o.stderr);
}

/// A minimal wheel (a zip with the package and its .dist-info), built here:
/// there is no network, so nothing can come from PyPI.
const MAKE_WHEEL: &str = r#"
import base64, hashlib, sys, zipfile
out = sys.argv[1]
files = {
    "ferrydemo/__init__.py": "def greet(who):\n    return 'hello ' + who + ' from ferrydemo'\n",
    "ferrydemo-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: ferrydemo\nVersion: 1.0\n",
    "ferrydemo-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: ferry-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
with zipfile.ZipFile(out, "w") as z:
    for name, text in files.items():
        data = text.encode()
        z.writestr(name, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("ferrydemo-1.0.dist-info/RECORD,,")
    z.writestr("ferrydemo-1.0.dist-info/RECORD", "\n".join(record) + "\n")
"#;

#[test]
fn python_venv_and_pip_install() {
    require_fuse();
    python_on(&Mount::start(&[]));
}

fn python_on(m: &Mount) {
    let local = TempDir::new("py");
    let wheel = local.path().join("ferrydemo-1.0-py3-none-any.whl");
    let o = run(Command::new("python3").arg("-c").arg(MAKE_WHEEL).arg(&wheel));
    assert!(o.ok, "building the wheel: {}", o.stderr);

    // A venv with pip (ensurepip installs pip from the wheel bundled with
    // Python: no network).
    // `python3 -m venv` runs ensurepip from the new venv and keeps its
    // output to itself; run as two steps, the same commands, so a failure
    // says what pip met.
    let o = run(Command::new("python3").args(["-m", "venv", "--without-pip"]).arg(m.p("venv")));
    assert!(o.ok, "python3 -m venv --without-pip: {}", o.stderr);
    let o = run(Command::new(m.p("venv/bin/python3")).args(["-m", "ensurepip", "--upgrade", "--default-pip", "-v"]));
    assert!(
        o.ok,
        "ensurepip in the venv failed; without ensurepip install python3-venv (test.sh does):\n{}{}\nmount log:\n{}\nserver \
         log:\n{}",
        o.stdout,
        o.stderr,
        m.log(),
        m.server.log()
    );
    let py = m.p("venv/bin/python");
    let o = run(Command::new(&py).arg("-c").arg("import sys; print(sys.prefix); print(sys.prefix != sys.base_prefix)"));
    assert!(o.ok, "venv python: {}", o.stderr);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines, [m.p("venv").to_str().unwrap(), "True"], "{}", o.stdout);
    assert!(m.exported("venv/pyvenv.cfg").exists());

    // pip inside the venv on the mount, installing the local wheel.
    let o = run(Command::new(&py).args(["-m", "pip", "install", "--no-index", "-q"]).arg(&wheel));
    assert!(o.ok, "pip install into the venv: {}{}", o.stdout, o.stderr);
    let o = run(Command::new(&py).args(["-c", "import ferrydemo; print(ferrydemo.greet('venv'))"]));
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(o.stdout, "hello venv from ferrydemo\n");
    let o = run(Command::new(&py).args(["-m", "pip", "list", "--format=freeze"]));
    assert!(o.ok && o.stdout.lines().any(|l| l == "ferrydemo==1.0"), "{}{}", o.stdout, o.stderr);
    let o = run(Command::new(&py).args(["-m", "pip", "uninstall", "-y", "-q", "ferrydemo"]));
    assert!(o.ok, "pip uninstall: {}{}", o.stdout, o.stderr);
    let o = run(Command::new(&py).args(["-c", "import ferrydemo"]));
    assert!(!o.ok, "still importable after uninstall");

    // pip install --target onto the mount, by the system python.
    let o = run(Command::new("python3")
        .args(["-m", "pip", "install", "--no-index", "-q", "--target"])
        .arg(m.p("site"))
        .arg(&wheel));
    assert!(o.ok, "pip install --target: {}{}", o.stdout, o.stderr);
    let o = run(Command::new("python3")
        .args(["-c", "import ferrydemo, sys; print(ferrydemo.greet('target')); print(ferrydemo.__file__)"])
        .env("PYTHONPATH", m.p("site")));
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(o.stdout.lines().next(), Some("hello target from ferrydemo"));
    assert!(o.stdout.contains(m.p("site").to_str().unwrap()), "{}", o.stdout);
    assert!(m.exported("site/ferrydemo-1.0.dist-info/RECORD").exists());
}

#[test]
fn make_builds_and_runs_a_c_program() {
    require_fuse();
    make_on(&Mount::start(&[]));
}

fn make_on(m: &Mount) {
    let dir = m.p("proj");
    fs::create_dir(&dir).unwrap();
    fs::write(
        dir.join("Makefile"),
        "CFLAGS = -O2 -Wall -Werror\n\
         hello: main.o util.o\n\t$(CC) $(CFLAGS) -o $@ main.o util.o\n\
         main.o: main.c util.h\n\
         util.o: util.c util.h\n\
         clean:\n\trm -f hello *.o\n\
         .PHONY: clean\n",
    )
    .unwrap();
    fs::write(dir.join("util.h"), "int sum_to(int n);\n").unwrap();
    fs::write(
        dir.join("util.c"),
        "#include \"util.h\"\nint sum_to(int n) { int s = 0; for (int i = 1; i <= n; i++) s += i; return s; }\n",
    )
    .unwrap();
    fs::write(
        dir.join("main.c"),
        "#include <stdio.h>\n#include <stdlib.h>\n#include \"util.h\"\n\
         int main(int argc, char **argv) { int n = argc > 1 ? atoi(argv[1]) : 10; printf(\"sum %d = %d\\n\", n, sum_to(n)); return 0; }\n",
    )
    .unwrap();
    let out = sh("make", &dir);
    assert!(out.contains("-o hello"), "{out}");
    assert_eq!(sh("./hello 100", &dir), "sum 100 = 5050\n");
    assert!(m.exported("proj/hello").exists() && m.exported("proj/util.o").exists());
    // The binary the server holds is the one that ran.
    let o = run(Command::new(m.exported("proj/hello")).arg("4"));
    assert!(o.ok && o.stdout == "sum 4 = 10\n", "{}{}", o.stdout, o.stderr);

    // Nothing to do when nothing changed; a changed source rebuilds only
    // what depends on it (make compares mtimes through the mount).
    let out = sh("make", &dir);
    assert!(out.contains("is up to date"), "{out}");
    std::thread::sleep(Duration::from_millis(1100));
    fs::write(dir.join("util.c"), "#include \"util.h\"\nint sum_to(int n) { return n * (n + 1) / 2 + 1; }\n").unwrap();
    let out = sh("make", &dir);
    assert!(out.contains("util.c") && !out.contains("main.c"), "only util.o should be rebuilt:\n{out}");
    assert_eq!(sh("./hello 100", &dir), "sum 100 = 5051\n");

    // Parallel make from scratch.
    sh("make clean && make -j4", &dir);
    assert!(!dir.join("nothing.o").exists());
    assert_eq!(sh("./hello 3", &dir), "sum 3 = 7\n");
    sh("make clean", &dir);
    assert!(!dir.join("hello").exists() && !m.exported("proj/main.o").exists());
}

/// The other data and attribute paths: the kernel page cache for file data
/// (sqlite's -shm then is a cached shared mapping) and no attribute or name
/// caching, so every stat and lookup goes to the server.
#[test]
fn git_sqlite_and_make_with_page_cache_and_no_attr_cache() {
    require_fuse();
    let m = Mount::start(&["--cache", "--attr-timeout", "0", "--entry-timeout", "0"]);
    git_on(&m);
    sqlite_on(&m);
    make_on(&m);
}

/// A local tree whose names are not UTF-8: Latin-1 as an old archive holds
/// it, stray bytes, a directory of them, a symlink whose name and target
/// are neither, and the UTF-8 spelling of one name as another file.
fn make_byte_tree(root: &Path) {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let b = |n: &[u8]| OsStr::from_bytes(n).to_owned();
    let dir = root.join(b(b"r\xe9pertoire"));
    fs::create_dir_all(&dir).unwrap();
    fs::write(root.join(b(b"caf\xe9.txt")), "latin-1\n").unwrap();
    fs::write(root.join("café.txt"), "utf-8\n").unwrap();
    fs::write(root.join(b(b"\xff\xfe.bin")), random_bytes(70_001, 21)).unwrap();
    fs::write(dir.join(b(b"na\xefve\x80")), "deep\n").unwrap();
    std::os::unix::fs::symlink(b(b"r\xe9pertoire/na\xefve\x80"), root.join(b(b"lien-\xe9"))).unwrap();
}

/// Same names (as bytes), kinds, contents and symlink targets.
fn same_bytes_tree(a: &Path, b: &Path) {
    let ma = fs::symlink_metadata(a).unwrap_or_else(|e| panic!("{}: {e}", a.display()));
    let mb = fs::symlink_metadata(b).unwrap_or_else(|e| panic!("{}: {e}", b.display()));
    assert_eq!(ma.file_type(), mb.file_type(), "{} vs {}", a.display(), b.display());
    if ma.is_symlink() {
        assert_eq!(fs::read_link(a).unwrap(), fs::read_link(b).unwrap(), "target of {}", b.display());
    } else if ma.is_dir() {
        let names = |p: &Path| {
            let mut v: Vec<std::ffi::OsString> = fs::read_dir(p).unwrap().map(|e| e.unwrap().file_name()).collect();
            v.sort();
            v
        };
        let (na, nb) = (names(a), names(b));
        assert_eq!(na, nb, "entries of {} vs {}", a.display(), b.display());
        for n in na {
            same_bytes_tree(&a.join(&n), &b.join(&n));
        }
    } else {
        assert!(fs::read(a).unwrap() == fs::read(b).unwrap(), "contents of {} and {} differ", a.display(), b.display());
    }
}

#[test]
fn non_utf8_names_with_cp_tar_and_git() {
    require_fuse();
    non_utf8_on(&Mount::start(&[]));
}

fn non_utf8_on(m: &Mount) {
    let local = TempDir::new("bytes");
    let src = local.path().join("src");
    make_byte_tree(&src);
    let l = local.path().display();

    // cp -a onto the mount and back off it; the export holds the same bytes.
    sh(&format!("cp -a {l}/src {}", m.p("cp").display()), local.path());
    same_bytes_tree(&src, &m.p("cp"));
    same_bytes_tree(&src, &m.exported("cp"));
    sh(&format!("cp -a {} {l}/cp-back", m.p("cp").display()), local.path());
    same_bytes_tree(&src, &local.path().join("cp-back"));

    // tar through a pipe onto the mount, and off it again.
    fs::create_dir(m.p("tar")).unwrap();
    sh(&format!("tar cf - -C {l}/src . | tar xf - -C {}", m.p("tar").display()), local.path());
    same_bytes_tree(&src, &m.p("tar"));
    fs::create_dir(local.path().join("tar-back")).unwrap();
    sh(&format!("tar cf - -C {} . | tar xf - -C {l}/tar-back", m.p("tar").display()), local.path());
    same_bytes_tree(&src, &local.path().join("tar-back"));

    // git stores the names faithfully (it only quotes them for display):
    // committed on the mount, cloned off it, cloned back onto it.
    let repo = m.p("repo");
    sh(&format!("cp -a {l}/src {}", repo.display()), local.path());
    sh("git init -q -b main . && git add -A && git commit -q -m bytes", &repo);
    assert_eq!(sh("git status --porcelain", &repo), "", "clean after commit");
    let files = sh(
        "git ls-files -z | python3 -c 'import sys; print(sorted(sys.stdin.buffer.read().split(b\"\\0\")[:-1]))'",
        &repo,
    );
    assert_eq!(
        files.trim(),
        r"[b'caf\xc3\xa9.txt', b'caf\xe9.txt', b'lien-\xe9', b'r\xe9pertoire/na\xefve\x80', b'\xff\xfe.bin']",
        "the index holds the names' bytes"
    );
    sh("git fsck --strict --no-progress", &repo);
    let o = run(Command::new("git").arg("clone").arg("-q").arg(&repo).arg(local.path().join("clone")));
    assert!(o.ok, "{}", o.stderr);
    fs::remove_dir_all(local.path().join("clone/.git")).unwrap();
    same_bytes_tree(&src, &local.path().join("clone"));
    let o = run(Command::new("git").arg("clone").arg("-q").arg(&repo).arg(m.p("clone2")));
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(sh("git status --porcelain", &m.p("clone2")), "");
    fs::remove_dir_all(m.p("clone2/.git")).unwrap();
    same_bytes_tree(&src, &m.p("clone2"));
}
