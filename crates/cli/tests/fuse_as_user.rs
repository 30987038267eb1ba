//! `ferry mount` by an ordinary user, as sshfs users mount: the user
//! serves a directory of their own and mounts it, with the distribution's
//! `/etc/fuse.conf` (no `user_allow_other`). The mount must come up
//! without `allow_other`/`allow_root` (which `fusermount3` refuses to
//! users), still be removed when its daemon is killed (auto-unmount), and
//! `ferry umount` must remove it.

mod common;

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::fuse::wait_for;
use common::{TempDir, FERRY};

/// The `tests` user test.sh creates (uid, gid).
fn test_user() -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let o = Command::new("id").args([flag, "tests"]).output().expect("id");
        assert!(o.status.success(), "the user `tests` is missing: ./test.sh creates it (useradd -M tests)");
        String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
    };
    (id("-u"), id("-g"))
}

/// What an ordinary user needs that the machine must provide: FUSE, and
/// `/dev/fuse` open to all (Debian's udev makes it 0666; test.sh too).
fn require_user_fuse() {
    assert!(rustix::process::geteuid().is_root(), "this test switches to the user `tests`: run it as root (./test.sh)");
    let m = fs::metadata("/dev/fuse").expect("/dev/fuse is missing");
    assert!(
        m.mode() & 0o006 == 0o006,
        "/dev/fuse is mode {:o}: users cannot mount (Debian makes it 0666; ./test.sh does so)",
        m.mode() & 0o777
    );
    assert!(Path::new("/usr/bin/fusermount3").exists() || Path::new("/bin/fusermount3").exists(), "install fuse3");
}

/// A command run as `tests`, with HOME in its own directory.
fn as_user(home: &Path, program: &str) -> Command {
    let (uid, gid) = test_user();
    let mut c = Command::new(program);
    c.uid(uid).gid(gid).env("HOME", home).env_remove("FERRY_TOKEN").env_remove("FERRY_TOKEN_FILE");
    c.stdin(Stdio::null());
    c
}

/// The mount at `mp` as /proc/self/mountinfo shows it: (options, source).
fn mount_entry(mp: &Path) -> Option<String> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = mp.to_str().unwrap();
    info.lines().find(|l| l.split(' ').nth(4) == Some(want)).map(str::to_string)
}

/// Kills what it started (by PID) and detaches the mount, even on failure.
struct Guard {
    children: Vec<Child>,
    mp: PathBuf,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if mount_entry(&self.mp).is_some() {
            let _ = rustix::mount::unmount(&self.mp, rustix::mount::UnmountFlags::DETACH);
        }
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn ok(o: &Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{what}: {}\n{err}", o.status);
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn an_ordinary_user_mounts_their_own_export_with_debians_fuse_conf() {
    require_user_fuse();
    let (uid, gid) = test_user();
    let base = TempDir::new("user-mount");
    fs::set_permissions(base.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let (home, data, mp) = (base.path().join("home"), base.path().join("data"), base.path().join("mnt"));
    for d in [&home, &data, &mp] {
        fs::create_dir(d).unwrap();
        rustix::fs::chown(d.as_path(), Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(gid)))
            .unwrap();
    }
    let mut guard = Guard { children: Vec::new(), mp: mp.clone() };

    // The README's way: `ferry serve DIR` as oneself (token and state under HOME).
    let mut serve = as_user(&home, FERRY)
        .arg("serve")
        .arg(&data)
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(serve.stdout.take().unwrap()).read_line(&mut line).unwrap();
    guard.children.push(serve);
    let addr = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("first line {line:?}")).to_string();
    let url = format!("ferry://{addr}/");

    // A foreground mount, as the user.
    let mount = as_user(&home, FERRY)
        .arg("mount")
        .arg(&url)
        .arg(&mp)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    guard.children.push(mount);
    if !wait_for(Duration::from_secs(20), || mount_entry(&mp).is_some()) {
        let c = guard.children.pop().unwrap();
        let o = c.wait_with_output().unwrap();
        panic!("the user's mount did not come up: {}", String::from_utf8_lossy(&o.stderr));
    }
    // A foreground mount says when it is ready.
    let mut said = String::new();
    let err = guard.children.last_mut().unwrap().stderr.take().unwrap();
    BufReader::new(err).read_line(&mut said).unwrap();
    assert!(said.contains("mounted on") && said.contains(mp.to_str().unwrap()), "{said:?}");
    let entry = mount_entry(&mp).unwrap();
    assert!(entry.contains("fuse.ferry"), "{entry}");
    assert!(!entry.contains("allow_other"), "a private mount shown as allow_other: {entry}");

    // The user writes through the mount; the file lands in the export, theirs.
    let script = format!("echo hello > {m}/new && cat {m}/new && ls {m}", m = mp.display());
    let out = ok(&as_user(&home, "sh").args(["-c", &script]).output().unwrap(), "writing through the mount");
    assert_eq!(out, "hello\nnew\n");
    assert_eq!(fs::read(data.join("new")).unwrap(), b"hello\n");
    assert_eq!(fs::metadata(data.join("new")).unwrap().uid(), uid);

    // Killing the daemon leaves no dead mount: fusermount3 removes it.
    let mut daemon = guard.children.pop().unwrap();
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || mount_entry(&mp).is_none()),
        "a killed daemon's mount stayed: {:?}",
        mount_entry(&mp)
    );

    // --background and `ferry umount`, as the user.
    ok(&as_user(&home, FERRY).arg("mount").arg("--background").arg(&url).arg(&mp).output().unwrap(), "mount");
    assert!(mount_entry(&mp).is_some());
    let out = ok(&as_user(&home, "cat").arg(mp.join("new")).output().unwrap(), "cat");
    assert_eq!(out, "hello\n");
    ok(&as_user(&home, FERRY).arg("umount").arg(&mp).output().unwrap(), "ferry umount");
    assert!(mount_entry(&mp).is_none(), "still mounted after ferry umount");
}
