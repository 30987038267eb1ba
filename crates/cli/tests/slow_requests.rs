//! A request that waits must not hold up the others of its connection.
//! The export of the server under test holds a directory that is a FUSE
//! mount (of a second ferry server) whose daemon is stopped (SIGSTOP): any
//! request that touches it waits as on a stalled network file system under
//! a gateway. Meanwhile the same client — one connection — goes on with
//! the rest of the export through the library, `ferry run` (two threads of
//! one Python process) and `ferry mount` (two processes on one mount).

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fuse::{mount_url, require_fuse, Detach, Mounted};
use common::{Server, TempDir};

/// Long enough to tell "ran beside the stalled request" from "waited for
/// it" on a slow machine, which would take the whole stall.
const BESIDE: Duration = Duration::from_secs(5);

/// Sends SIGCONT to a stopped process when dropped, so a failing test
/// never leaves a stopped mount daemon (and requests stuck behind it).
struct Resume(u32);

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(self.0 as i32).expect("pid"),
            rustix::process::Signal::CONT,
        );
    }
}

fn stop(pid: u32) -> Resume {
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).expect("pid"),
        rustix::process::Signal::STOP,
    )
    .expect("SIGSTOP");
    Resume(pid)
}

/// The server under test, whose export holds `fast` and `slow/`, a mount
/// of another server holding `f`.
struct Stage {
    // Dropped first (fields drop in order): the daemon killed and its
    // mount gone before the export holding the mount point is removed.
    behind_mount: (Mounted, Detach),
    served: Server,
    _behind: Server,
}

impl Stage {
    fn new() -> Stage {
        require_fuse();
        let behind = Server::start(&[]);
        fs::write(behind.export.path().join("f"), b"behind").unwrap();
        let served = Server::start(&[]);
        fs::write(served.export.path().join("fast"), b"here").unwrap();
        let slow = served.export.path().join("slow");
        fs::create_dir(&slow).unwrap();
        let detach = Detach(slow.clone());
        let m =
            mount_url(&behind.url("/"), &slow, &behind.token_file, &["--attr-timeout", "0", "--entry-timeout", "0"]);
        assert_eq!(fs::read(slow.join("f")).unwrap(), b"behind");
        Stage { behind_mount: (m, detach), served, _behind: behind }
    }

    fn daemon(&self) -> u32 {
        self.behind_mount.0.pid()
    }
}

#[test]
fn a_stalled_request_does_not_hold_up_the_library_s_other_requests() {
    let s = Stage::new();
    let c = Arc::new(s.served.client());
    assert_eq!(c.read("/slow/f").unwrap(), b"behind");
    let resume = stop(s.daemon());
    let c2 = Arc::clone(&c);
    let stalled = std::thread::spawn(move || c2.metadata("/slow/f").map(|a| a.size));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!stalled.is_finished(), "the request behind the stopped mount should wait");
    // On a thread, so a server that makes them wait fails the test in
    // time (the daemon resumed) instead of hanging it.
    let c3 = Arc::clone(&c);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let t = Instant::now();
        assert_eq!(c3.read("/fast").unwrap(), b"here");
        c3.create_dir("/made", 0o755).unwrap();
        assert_eq!(c3.metadata("/made").unwrap().mode & libc::S_IFMT, libc::S_IFDIR);
        assert!(c3.read_dir("/made").unwrap().is_empty());
        let _ = tx.send(t.elapsed());
    });
    let took = rx.recv_timeout(BESIDE);
    if took.is_err() {
        drop(resume);
        panic!("requests behind a stalled one did not finish within {BESIDE:?}");
    }
    assert!(!stalled.is_finished(), "still stalled while the others ran");
    drop(resume);
    assert_eq!(stalled.join().unwrap().unwrap(), 6, "the stalled request ends once its file system answers");
    // And the connection is whole: a request on it after all this.
    assert_eq!(c.read("/slow/f").unwrap(), b"behind");
}

#[test]
fn a_stalled_request_does_not_hold_up_another_thread_under_ferry_run() {
    let s = Stage::new();
    let cwd = TempDir::new("run");
    let script = r#"
import os, sys, threading, time
t = threading.Thread(target=lambda: os.stat("/remote/slow/f"), daemon=True)
t.start()
time.sleep(0.3)
assert t.is_alive(), "the stat behind the stopped mount should wait"
start = time.monotonic()
assert open("/remote/fast").read() == "here"
os.mkdir("/remote/made-by-run")
assert os.listdir("/remote/made-by-run") == []
took = time.monotonic() - start
assert t.is_alive(), "still stalled while the others ran"
print(f"took {took:.3f}")
sys.stdout.flush()
os._exit(0)
"#;
    let resume = stop(s.daemon());
    let o = common::preload::run_cmd(&s.served, cwd.path(), 60, &["python3", "-c", script]);
    drop(resume);
    let out = common::preload::ok(&o);
    let took: f64 = out.trim().strip_prefix("took ").and_then(|t| t.parse().ok()).expect("python's figure");
    assert!(took < BESIDE.as_secs_f64(), "requests behind a stalled one took {took} s");
    assert!(s.served.export.path().join("made-by-run").is_dir());
}

#[test]
fn a_stalled_request_does_not_hold_up_other_users_of_a_mount() {
    let s = Stage::new();
    let mp = TempDir::new("mp");
    let _detach = Detach(mp.path().to_path_buf());
    let _m = mount_url(
        &s.served.url("/"),
        mp.path(),
        &s.served.token_file,
        &["--attr-timeout", "0", "--entry-timeout", "0"],
    );
    assert_eq!(fs::read(mp.path().join("slow/f")).unwrap(), b"behind");
    let resume = stop(s.daemon());
    let mut stalled = Command::new("stat").arg(mp.path().join("slow/f")).spawn().expect("stat");
    std::thread::sleep(Duration::from_millis(300));
    assert!(stalled.try_wait().unwrap().is_none(), "the stat behind the stopped mount should wait");
    let t = Instant::now();
    let o = Command::new("timeout")
        .args([
            "10",
            "sh",
            "-c",
            "cat \"$1/fast\" && mkdir \"$1/made-on-mount\" && ls -la \"$1/made-on-mount\" >/dev/null",
        ])
        .args(["sh", &mp.path().display().to_string()])
        .output()
        .expect("sh");
    let took = t.elapsed();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.stdout, b"here");
    assert!(took < BESIDE, "requests behind a stalled one took {took:?}");
    assert!(stalled.try_wait().unwrap().is_none(), "still stalled while the others ran");
    drop(resume);
    let done = stalled.wait().unwrap();
    assert!(done.success(), "the stalled stat ends once its file system answers");
    assert!(Path::new(&s.served.export.path().join("made-on-mount")).is_dir());
}
