//! The server killed with SIGKILL at random moments, and started again on
//! the same address and directory, while a mixed workload runs through the
//! library, `ferry mount` and `ferry run`: creates, writes with `fsync`,
//! renames, removes, mkdirs and reads. A reference model of what the
//! workload did is checked against the export at the end: every byte is
//! there (a killed process keeps its acknowledged writes in the page cache,
//! and the client resends what it was not told), each name-space change
//! happened exactly once (a second run would fail the workload with
//! `EEXIST`/`ENOENT`), and no call failed.
//!
//! The seed is printed; `FERRY_KILL_SEED=N` runs the same operations and
//! kill delays again (the moments a kill lands are up to the scheduler).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::fuse::{is_live, require_fuse, wait_for, Detach};
use common::restart::Serve;
use common::{random_bytes, Rng, TempDir, FERRY};
use ferry_client::{Client, OpenOptions, Options};

/// Kills per run, and the longest time between two.
const KILLS: usize = 8;
const MAX_GAP_MS: u64 = 50;

fn seed() -> u64 {
    let seed = match std::env::var("FERRY_KILL_SEED") {
        Ok(s) => s.parse().expect("FERRY_KILL_SEED: a number"),
        Err(_) => {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
            t.as_nanos() as u64 ^ u64::from(std::process::id())
        }
    };
    eprintln!("kill_model: seed {seed} (replay with FERRY_KILL_SEED={seed})");
    seed
}

/// What the workload did, as the export must show it.
#[derive(Default, Debug)]
struct Model {
    files: BTreeMap<String, Vec<u8>>,
    dirs: BTreeSet<String>,
}

/// The operations a workload needs, on the library or on a mounted path.
trait Fs {
    fn create(&self, name: &str, data: &[u8], fsync: bool) -> io::Result<()>;
    fn write_at(&self, name: &str, offset: u64, data: &[u8]) -> io::Result<()>;
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    fn remove(&self, name: &str) -> io::Result<()>;
    fn mkdir(&self, name: &str) -> io::Result<()>;
    fn read(&self, name: &str) -> io::Result<Vec<u8>>;
}

struct Library(Client);

fn abs(name: &str) -> String {
    format!("/{name}")
}

impl Fs for Library {
    fn create(&self, name: &str, data: &[u8], fsync: bool) -> io::Result<()> {
        let mut f = self.0.open(abs(name), OpenOptions::new().write(true).create_new(true))?;
        // In a program's pieces: each is sent behind the caller's back,
        // and a kill may land between any two.
        for piece in data.chunks(16 << 10) {
            f.write_all(piece)?;
        }
        if fsync {
            f.sync_all()?;
        }
        Ok(f.close()?)
    }

    fn write_at(&self, name: &str, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut f = self.0.open(abs(name), OpenOptions::new().write(true))?;
        f.write_at(data, offset)?;
        f.sync_data()?;
        Ok(f.close()?)
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        Ok(self.0.rename(abs(from), abs(to))?)
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        Ok(self.0.remove_file(abs(name))?)
    }

    fn mkdir(&self, name: &str) -> io::Result<()> {
        self.0.create_dir(abs(name), 0o755).map(drop).map_err(Into::into)
    }

    fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        Ok(self.0.read(abs(name))?)
    }
}

/// Runs operations until `done` is set and at least `min_ops` ran; panics
/// (with the seed in the message) on the first failure or wrong read.
fn workload(fs: &dyn Fs, seed: u64, min_ops: usize, done: &AtomicBool, ops: &AtomicUsize) -> Model {
    let mut rng = Rng::new(seed);
    let mut m = Model::default();
    let mut i = 0usize;
    while i < min_ops || !done.load(Ordering::Relaxed) {
        assert!(i < 100_000, "seed {seed}: the kills never ended");
        let names: Vec<String> = m.files.keys().cloned().collect();
        let pick = |rng: &mut Rng| names.get(rng.below(names.len() as u64) as usize).cloned();
        let what = rng.below(10);
        let fail = |op: &str, e: io::Error| -> ! { panic!("seed {seed}, op {i} ({op}): {e}") };
        match (what, pick(&mut rng)) {
            (0..=2, _) | (_, None) => {
                let name = format!("f{i}");
                let data = random_bytes(1 + rng.below(300 << 10) as usize, rng.next());
                let fsync = rng.below(2) == 0;
                fs.create(&name, &data, fsync).unwrap_or_else(|e| fail("create", e));
                m.files.insert(name, data);
            }
            (3 | 4, Some(name)) => {
                let data = m.files.get_mut(&name).unwrap();
                let offset = rng.below(data.len() as u64 + 1);
                let new = random_bytes(1 + rng.below(64 << 10) as usize, rng.next());
                fs.write_at(&name, offset, &new).unwrap_or_else(|e| fail("write", e));
                let end = offset as usize + new.len();
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[offset as usize..end].copy_from_slice(&new);
            }
            (5, Some(name)) => {
                let to = format!("r{i}");
                fs.rename(&name, &to).unwrap_or_else(|e| fail("rename", e));
                let data = m.files.remove(&name).unwrap();
                m.files.insert(to, data);
            }
            (6, Some(name)) => {
                fs.remove(&name).unwrap_or_else(|e| fail("remove", e));
                m.files.remove(&name);
            }
            (7, _) => {
                let name = format!("d{i}");
                fs.mkdir(&name).unwrap_or_else(|e| fail("mkdir", e));
                m.dirs.insert(name);
            }
            (_, Some(name)) => {
                let got = fs.read(&name).unwrap_or_else(|e| fail("read", e));
                assert!(got == m.files[&name], "seed {seed}, op {i}: {name} reads back wrong");
            }
        }
        i += 1;
        ops.store(i, Ordering::Relaxed);
    }
    m
}

/// The export holds exactly what the model says.
fn check(export: &Path, m: &Model, seed: u64) {
    let mut files = BTreeMap::new();
    let mut dirs = BTreeSet::new();
    for e in std::fs::read_dir(export).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        if e.file_type().unwrap().is_dir() {
            dirs.insert(name);
        } else {
            files.insert(name, std::fs::read(e.path()).unwrap());
        }
    }
    assert_eq!(dirs, m.dirs, "seed {seed}: directories");
    assert_eq!(files.keys().collect::<Vec<_>>(), m.files.keys().collect::<Vec<_>>(), "seed {seed}: file names");
    for (name, data) in &m.files {
        assert!(
            files[name] == *data,
            "seed {seed}: {name} differs from what was written ({} vs {} bytes)",
            files[name].len(),
            data.len()
        );
    }
}

/// Kills and restarts the server `KILLS` times at random moments once the
/// workload has begun, then says so in `done`.
fn killer(s: &Setup, seed: u64, ops: Arc<AtomicUsize>, done: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    let (server, export, token) = (Arc::clone(&s.server), s.export.path().to_path_buf(), s.token.clone());
    let stop = Arc::clone(&s.stop);
    std::thread::spawn(move || {
        let mut rng = Rng::new(seed.rotate_left(17));
        let deadline = Instant::now() + Duration::from_secs(60);
        while ops.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        for _ in 0..KILLS {
            std::thread::sleep(Duration::from_micros(rng.below(MAX_GAP_MS * 1000)));
            let mut s = server.lock().unwrap_or_else(|e| e.into_inner());
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let port = s.port;
            s.kill();
            let t = Instant::now();
            *s = Serve::start(&export, port, &token);
            eprintln!("kill_model: killed and restarted at op {} ({:?})", ops.load(Ordering::Relaxed), t.elapsed());
        }
        done.store(true, Ordering::Relaxed);
    })
}

struct Setup {
    export: TempDir,
    _state: TempDir,
    token: PathBuf,
    server: Arc<Mutex<Serve>>,
    port: u16,
    /// Set when the test ends (also by a failure): no more restarts.
    stop: Arc<AtomicBool>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.server.lock().unwrap_or_else(|e| e.into_inner()).kill();
    }
}

fn setup(tag: &str) -> Setup {
    let export = TempDir::new(&format!("{tag}-export"));
    let state = TempDir::new(&format!("{tag}-state"));
    let token = state.path().join("token");
    let server = Serve::start(export.path(), 0, &token);
    let port = server.port;
    let stop = Arc::new(AtomicBool::new(false));
    Setup { export, _state: state, token, server: Arc::new(Mutex::new(server)), port, stop }
}

fn run_with_kills(s: &Setup, seed: u64, fs: &dyn Fs) -> Model {
    let (ops, done) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    let k = killer(s, seed, Arc::clone(&ops), Arc::clone(&done));
    let m = workload(fs, seed, 300, &done, &ops);
    k.join().unwrap();
    eprintln!("kill_model: {} operations, {KILLS} kills", ops.load(Ordering::Relaxed));
    m
}

/// A library client of `s`'s server that reconnects for longer than the kills last.
fn reconnecting_client(s: &Setup) -> Client {
    let token = std::fs::read_to_string(&s.token).unwrap().trim().as_bytes().to_vec();
    let opts = Options { token: Some(token), reconnect: Some(Duration::from_secs(30)), ..Options::default() };
    Client::connect(&format!("127.0.0.1:{}", s.port), &opts).unwrap()
}

#[test]
fn the_library_loses_nothing_and_repeats_nothing_across_kills() {
    let seed = seed();
    let s = setup("kl");
    let c = reconnecting_client(&s);
    let m = run_with_kills(&s, seed, &Library(c));
    check(s.export.path(), &m, seed);
}

/// As above, with a second thread on the same client asking the server
/// something all the time, so that the reconnects after the kills are
/// often made by that thread while the workload's thread is between
/// making sure its file is open on the server and sending with its handle
/// (the mount's kernel requests arrive on several threads so; a close
/// once failed there with `EBADF`: a write went to the restarted server
/// with the handle the killed one gave).
#[test]
fn the_library_shared_by_threads_loses_nothing_across_kills() {
    let seed = seed();
    let s = setup("kt");
    let c = reconnecting_client(&s);
    let (ops, done) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    let k = killer(&s, seed, Arc::clone(&ops), Arc::clone(&done));
    let asker = {
        let (c, done) = (c.clone(), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut asked = 0u64;
            while !done.load(Ordering::Relaxed) {
                c.metadata("/").unwrap_or_else(|e| panic!("seed {seed}: stat of / failed: {e}"));
                asked += 1;
            }
            asked
        })
    };
    let m = workload(&Library(c), seed, 300, &done, &ops);
    k.join().unwrap();
    let asked = asker.join().unwrap();
    assert!(asked > 0, "seed {seed}: the second thread never asked");
    check(s.export.path(), &m, seed);
}

/// The workload in Python, in its own process (a test process that both
/// works on a FUSE mount and spawns the server it depends on can stall
/// itself: starting a program needs the spawner's memory map, which a
/// thread faulting on the mount may hold); its model is printed as name
/// and the bytes' hash, and compared with the export.
const PY_WORKLOAD: &str = r#"
import hashlib, os, random, sys
rng = random.Random(int(sys.argv[1]))
done, started, root = sys.argv[2], sys.argv[3], sys.argv[4]
files, dirs, i = {}, set(), 0
while i < 300 or not os.path.exists(done):
    assert i < 100000, "the kills never ended"
    names = sorted(files)
    what = rng.randrange(10)
    if what <= 2 or not names:
        name, data = "f%d" % i, rng.randbytes(1 + rng.randrange(300 << 10))
        with open(os.path.join(root, name), "xb") as f:
            f.write(data)
            if rng.randrange(2) == 0:
                f.flush(); os.fsync(f.fileno())
        files[name] = bytearray(data)
    elif what <= 4:
        name = rng.choice(names); data = files[name]
        off, new = rng.randrange(len(data) + 1), rng.randbytes(1 + rng.randrange(64 << 10))
        fd = os.open(os.path.join(root, name), os.O_WRONLY)
        os.pwrite(fd, new, off); os.fdatasync(fd); os.close(fd)
        if len(data) < off + len(new):
            data.extend(bytes(off + len(new) - len(data)))
        data[off:off + len(new)] = new
    elif what == 5:
        name = rng.choice(names)
        os.rename(os.path.join(root, name), os.path.join(root, "r%d" % i))
        files["r%d" % i] = files.pop(name)
    elif what == 6:
        name = rng.choice(names); os.unlink(os.path.join(root, name)); del files[name]
    elif what == 7:
        os.mkdir(os.path.join(root, "d%d" % i)); dirs.add("d%d" % i)
    else:
        name = rng.choice(names)
        with open(os.path.join(root, name), "rb") as f:
            assert f.read() == files[name], "%s reads back wrong at op %d" % (name, i)
    i += 1
    if i == 1:
        open(started, "w").close()
for name in sorted(files):
    print("file", name, hashlib.sha256(files[name]).hexdigest())
for name in sorted(dirs):
    print("dir", name)
print("ops", i)
"#;

/// Runs `PY_WORKLOAD` as `prefix... python3 -c ... ROOT` while the server
/// is killed, and checks the export against the model it prints.
fn python_with_kills(s: &Setup, seed: u64, prefix: &[&str], root: &Path, env: &[(&str, &Path)]) {
    let state = s._state.path();
    let (done, started) = (state.join("done"), state.join("started"));
    let mut cmd = Command::new("timeout");
    cmd.arg("300").args(prefix).args(["python3", "-c", PY_WORKLOAD, &seed.to_string()]);
    cmd.arg(&done).arg(&started).arg(root);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd
        .env_remove("FERRY_TOKEN")
        .env_remove("FERRY_MOUNTS")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (ops, flag) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    let k = killer(s, seed, Arc::clone(&ops), flag);
    assert!(wait_for(Duration::from_secs(60), || started.exists()), "seed {seed}: the program did not start");
    ops.store(1, Ordering::Relaxed);
    k.join().unwrap();
    std::fs::write(&done, b"").unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "seed {seed}: the program failed ({:?}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // The export, described as the program describes its model.
    let mut entries: Vec<_> = std::fs::read_dir(s.export.path()).unwrap().map(|e| e.unwrap()).collect();
    entries.sort_by_key(|e| e.file_name());
    let (mut files, mut dirs) = (String::new(), String::new());
    for e in entries {
        let name = e.file_name().into_string().unwrap();
        if e.file_type().unwrap().is_dir() {
            dirs += &format!("dir {name}\n");
        } else {
            let out = Command::new("sha256sum").arg(e.path()).output().unwrap();
            let hash = String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or("").to_string();
            files += &format!("file {name} {hash}\n");
        }
    }
    let got: String = stdout.lines().filter(|l| !l.starts_with("ops ")).map(|l| format!("{l}\n")).collect();
    assert_eq!(got, files + &dirs, "seed {seed}: the export differs from the program's model");
    eprintln!("kill_model: {}, {KILLS} kills", stdout.lines().last().unwrap_or(""));
}

#[test]
fn the_mount_loses_nothing_and_repeats_nothing_across_kills() {
    require_fuse();
    let seed = seed();
    let s = setup("km");
    let mp_dir = TempDir::new("km-mnt");
    let mp = mp_dir.path().to_path_buf();
    let log = s._state.path().join("mount.log");
    let mut daemon = Command::new(FERRY)
        .arg("mount")
        .arg(format!("ferry://127.0.0.1:{}/", s.port))
        .arg(&mp)
        .env("FERRY_TOKEN_FILE", &s.token)
        .env_remove("FERRY_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _detach = Detach(mp.clone());
    assert!(wait_for(Duration::from_secs(20), || is_live(&mp)), "mount did not come up");
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| python_with_kills(&s, seed, &[], &mp, &[])));
    let _ = Command::new(FERRY).arg("umount").arg(&mp).status();
    let _ = daemon.kill();
    let _ = daemon.wait();
    if let Err(e) = r {
        eprintln!("mount log:\n{}", std::fs::read_to_string(&log).unwrap_or_default());
        std::panic::resume_unwind(e);
    }
}

#[test]
fn ferry_run_loses_nothing_and_repeats_nothing_across_kills() {
    let seed = seed();
    let s = setup("kr");
    let mount = format!("/remote=ferry://127.0.0.1:{}/", s.port);
    python_with_kills(
        &s,
        seed,
        &[FERRY, "run", "--mount", &mount, "--"],
        Path::new("/remote"),
        &[("FERRY_TOKEN_FILE", &s.token)],
    );
}

/// A Python appender under `ferry run` (`O_APPEND`, `fsync` after each
/// numbered line) while the server is killed ten times: an append is a
/// change that must not run twice, so each line is in the file exactly
/// once, in order, and the writer saw no error (it stops at the first).
const PY_APPENDER: &str = r#"
import os, sys
done, started, path = sys.argv[1], sys.argv[2], sys.argv[3]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
i = 0
while not os.path.exists(done) or i < 200:
    os.write(fd, b"line %06d\n" % i)
    os.fsync(fd)
    i += 1
    if i == 1:
        open(started, "w").close()
os.close(fd)
print(i)
"#;

#[test]
fn ferry_run_appends_land_exactly_once_across_kills() {
    let seed = seed();
    let s = setup("ka");
    let state = s._state.path();
    let (done, started) = (state.join("done"), state.join("started"));
    let mount = format!("/remote=ferry://127.0.0.1:{}/", s.port);
    let child = Command::new("timeout")
        .args(["300", FERRY, "run", "--mount", &mount, "--", "python3", "-c", PY_APPENDER])
        .arg(&done)
        .arg(&started)
        .arg("/remote/log")
        .env("FERRY_TOKEN_FILE", &s.token)
        .env_remove("FERRY_TOKEN")
        .env_remove("FERRY_MOUNTS")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(60), || started.exists()), "seed {seed}: the appender did not start");
    // Ten kills, each after a few appends have gone by.
    let mut rng = Rng::new(seed);
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(20 + rng.below(150)));
        let mut srv = s.server.lock().unwrap_or_else(|e| e.into_inner());
        let port = srv.port;
        srv.kill();
        *srv = Serve::start(s.export.path(), port, &s.token);
    }
    std::fs::write(&done, b"").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "seed {seed}: the appender saw an error ({:?}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let n: usize = String::from_utf8_lossy(&out.stdout).trim().parse().expect("the appender's count");
    let text = std::fs::read_to_string(s.export.path().join("log")).unwrap();
    let want: String = (0..n).map(|i| format!("line {i:06}\n")).collect();
    if text != want {
        let lines: Vec<&str> = text.lines().collect();
        let mut seen = BTreeMap::new();
        for l in &lines {
            *seen.entry(*l).or_insert(0) += 1;
        }
        let twice: Vec<_> = seen.iter().filter(|(_, c)| **c > 1).map(|(l, _)| *l).collect();
        panic!("seed {seed}: {} lines for {n} appends; twice: {twice:?}", lines.len());
    }
    eprintln!("kill_model: {n} appends, 10 kills, each line once");
}
