//! Helpers for the tests that mount: whether FUSE can be used here, whether
//! a mount is up, and a guard that detaches a mount when a test ends.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::mount::UnmountFlags;

/// The FUSE tests need `/dev/fuse` and root, which CI has: without them a
/// test fails with this message rather than passing without running.
pub fn require_fuse() {
    assert!(
        Path::new("/dev/fuse").exists() && rustix::process::geteuid().is_root(),
        "FUSE tests need /dev/fuse and root (CI has both; run ./test.sh as root)"
    );
}

/// Mounted and answering.
pub fn is_live(mp: &Path) -> bool {
    match (fs::metadata(mp), mp.parent().map(fs::metadata)) {
        (Ok(m), Some(Ok(p))) => m.dev() != p.dev(),
        _ => false,
    }
}

pub fn is_mounted(mp: &Path) -> bool {
    match fs::metadata(mp) {
        // A dead FUSE mount answers ENOTCONN: still mounted.
        Err(e) => e.raw_os_error() == Some(libc::ENOTCONN),
        Ok(_) => is_live(mp),
    }
}

pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// Detaches the mount at its path on drop, so a mount goes away even when
/// the test fails.
pub struct Detach(pub PathBuf);

impl Drop for Detach {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let _ = rustix::mount::unmount(&self.0, UnmountFlags::DETACH);
        }
    }
}

/// A foreground `ferry mount` daemon, killed (by PID) on drop.
pub struct Mounted {
    child: Child,
}

impl Mounted {
    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// Reads `path` whole (1 MiB reads, in a Python process of its own; its
/// pages dropped first when `cold`) and returns the data with how much the
/// `/proc/PID/io` `counter` (`rchar`, `wchar`) of process `pid` grew
/// meanwhile: which process moved a read's bytes, told apart by their own
/// counts.
pub fn read_counting(path: &Path, pid: u32, counter: &str, cold: bool) -> (Vec<u8>, u64) {
    let script = r#"
import os, sys
path, pid, counter, cold = sys.argv[1], sys.argv[2], sys.argv[3] + ":", sys.argv[4] == "cold"
def count():
    for l in open(f"/proc/{pid}/io"):
        if l.startswith(counter):
            return int(l.split()[1])
fd = os.open(path, os.O_RDONLY)
if cold:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
before = count()
out = bytearray()
while True:
    b = os.read(fd, 1 << 20)
    if not b:
        break
    out += b
after = count()
os.close(fd)
sys.stdout.buffer.write(out)
print(after - before, file=sys.stderr)
"#;
    let o = Command::new("timeout")
        .args(["60", "python3", "-c", script])
        .arg(path)
        .args([pid.to_string(), counter.to_string()])
        .arg(if cold { "cold" } else { "warm" })
        .output()
        .expect("run python3");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "reading {}: {err}", path.display());
    (o.stdout, err.trim().parse().unwrap_or_else(|_| panic!("count: {err}")))
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `ferry mount URL MP EXTRA...` with `token_file`, once it answers.
pub fn mount_url(url: &str, mp: &Path, token_file: &Path, extra: &[&str]) -> Mounted {
    mount_url_env(url, mp, token_file, extra, &[])
}

/// `mount_url` with more environment (e.g. `FERRY_SAME_HOST=0`).
pub fn mount_url_env(url: &str, mp: &Path, token_file: &Path, extra: &[&str], env: &[(&str, &str)]) -> Mounted {
    let child = Command::new(super::FERRY)
        .arg("mount")
        .arg(url)
        .arg(mp)
        .args(extra)
        .envs(env.iter().copied())
        .env("FERRY_TOKEN_FILE", token_file)
        .env_remove("FERRY_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ferry mount");
    let m = Mounted { child };
    assert!(wait_for(Duration::from_secs(20), || is_live(mp)), "mount did not come up");
    m
}
