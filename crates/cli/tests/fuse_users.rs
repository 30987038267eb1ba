//! A mount open to other users (`--allow-other`) enforces their
//! permissions: the server acts with its own rights for every request, so
//! the kernel must check the caller's.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::fuse::{is_live, wait_for, Detach};
use common::{Server, FERRY};

fn as_nobody(script: &str) -> (bool, String) {
    let o = Command::new("runuser")
        .args(["-u", "nobody", "--", "sh", "-c", script])
        .stdin(Stdio::null())
        .output()
        .expect("runuser (util-linux) is needed for this test");
    (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned())
}

struct Mounted {
    child: Child,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn mount(server: &Server, mp: &Path, extra: &[&str]) -> Mounted {
    let child = Command::new(FERRY)
        .arg("mount")
        .arg(server.url("/"))
        .arg(mp)
        .args(extra)
        .env("FERRY_TOKEN_FILE", &server.token_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(20), || is_live(mp)), "mount did not come up");
    Mounted { child }
}

#[test]
fn other_users_of_an_allow_other_mount_get_their_own_rights() {
    assert!(
        Path::new("/dev/fuse").exists() && rustix::process::geteuid().is_root(),
        "this test needs /dev/fuse and root (CI has both)"
    );
    let server = Server::start(&[]);
    // The export and the mount point must be reachable by `nobody`.
    fs::set_permissions(server.export.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(server.state.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let secret = server.export.path().join("secret");
    fs::write(&secret, b"root only\n").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    let mp = server.state.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    fs::set_permissions(&mp, fs::Permissions::from_mode(0o755)).unwrap();
    let _m = mount(&server, &mp, &["--allow-other"]);
    let _d = Detach(mp.clone());
    let f = mp.join("secret");
    let f = f.display();
    let (ok, err) = as_nobody(&format!("cat {f}"));
    assert!(!ok && err.contains("Permission denied"), "nobody read a 0600 root file: {err}");
    let (ok, err) = as_nobody(&format!("echo x >> {f}"));
    assert!(!ok && err.contains("Permission denied"), "nobody appended to a 0600 root file: {err}");
    let (ok, err) = as_nobody(&format!("chown nobody {f}"));
    assert!(!ok && err.contains("not permitted"), "nobody took a root file: {err}");
    assert_eq!(fs::read(&secret).unwrap(), b"root only\n");
    // What nobody may do, nobody can do: a world-writable directory.
    let open = server.export.path().join("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    let (ok, err) = as_nobody(&format!("echo hi > {}/open/mine && cat {}/open/mine", mp.display(), mp.display()));
    assert!(ok, "{err}");
}
