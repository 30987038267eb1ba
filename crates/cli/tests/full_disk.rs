//! A full disk: a small tmpfs inside the export, filled through the
//! library, `ferry mount` and `ferry run`. `ENOSPC` must reach the program
//! (at `write`, `fsync` or `close`), what was stored before stays intact,
//! and the same session and mount go on working once space is freed.

mod common;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::fuse::{mount_url, require_fuse, Detach};
use common::preload::bash;
use common::{random_bytes, stderr, Server};
use ferry_client::OpenOptions;
use rustix::mount::UnmountFlags;

/// A tmpfs of `size` mounted at a directory, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        fs::create_dir_all(at).unwrap();
        let o = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(at).output();
        let o = o.expect("mount(8)");
        assert!(o.status.success(), "mounting a tmpfs (needs root): {}", stderr(&o));
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.0, UnmountFlags::DETACH);
    }
}

fn errno_of(e: &std::io::Error) -> Option<i32> {
    e.raw_os_error()
}

/// The server with a 4 MiB disk at `/disk` holding a 1 MiB file `keep`.
fn full_disk_server() -> (Server, Tmpfs, Vec<u8>) {
    let server = Server::start(&[]);
    let disk = Tmpfs::mount(&server.export.path().join("disk"), "4m");
    let keep = random_bytes(1 << 20, 7);
    fs::write(disk.0.join("keep"), &keep).unwrap();
    (server, disk, keep)
}

#[test]
fn the_library_reports_enospc_and_the_session_goes_on() {
    let (server, disk, keep) = full_disk_server();
    let c = server.client();
    let chunk = vec![0x5au8; 1 << 20];
    let mut f = c.open("/disk/big", OpenOptions::new().write(true).create(true).truncate(true)).unwrap();
    // Write-behind: the error may come with a later write, the flush or
    // the close, never not at all.
    let mut failure = None;
    for _ in 0..8 {
        if let Err(e) = f.write_all(&chunk) {
            failure = Some(e);
            break;
        }
    }
    let failure = failure.or_else(|| f.flush().err()).or_else(|| f.sync_all().err().map(std::io::Error::other));
    let failure = failure.expect("8 MiB fitted on a 4 MiB disk");
    let text = format!("{failure} {failure:?}");
    assert!(errno_of(&failure) == Some(libc::ENOSPC) || text.contains("No space left"), "not ENOSPC: {text}");
    drop(f);
    assert_eq!(c.read("/disk/keep").unwrap(), keep, "a file stored before the disk filled changed");
    c.remove_file("/disk/big").unwrap();
    c.write("/disk/after", b"space again").unwrap();
    assert_eq!(fs::read(disk.0.join("after")).unwrap(), b"space again");
    c.ping().unwrap();
}

#[test]
fn the_mount_reports_enospc_and_goes_on() {
    require_fuse();
    let (server, disk, keep) = full_disk_server();
    let mp = server.state.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    let _m = mount_url(&server.url("/"), &mp, &server.token_file, &[]);
    let _d = Detach(mp.clone());
    let o = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", mp.join("disk/big").display()))
        .args(["bs=1M", "count=8", "conv=fsync"])
        .output()
        .unwrap();
    assert!(!o.status.success(), "dd of 8 MiB onto a 4 MiB disk succeeded");
    assert!(stderr(&o).contains("No space left on device"), "dd said: {}", stderr(&o));
    assert_eq!(fs::read(mp.join("disk/keep")).unwrap(), keep);
    assert_eq!(fs::read(disk.0.join("keep")).unwrap(), keep);
    fs::remove_file(mp.join("disk/big")).unwrap();
    fs::write(mp.join("disk/after"), b"space again").unwrap();
    assert_eq!(fs::read(disk.0.join("after")).unwrap(), b"space again");
}

#[test]
fn ferry_run_reports_enospc_and_goes_on() {
    let (server, disk, keep) = full_disk_server();
    let cwd = server.state.path();
    let o = bash(
        &server,
        cwd,
        "dd if=/dev/zero of=/remote/disk/big bs=1M count=8 conv=fsync 2>&1; echo \"dd: $?\"; \
         rm /remote/disk/big && echo 'space again' > /remote/disk/after && echo done",
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(out.contains("No space left on device"), "{out}{}", stderr(&o));
    assert!(out.contains("dd: 1"), "{out}");
    assert!(out.ends_with("done\n"), "{out}{}", stderr(&o));
    assert_eq!(fs::read(disk.0.join("keep")).unwrap(), keep);
    assert_eq!(fs::read(disk.0.join("after")).unwrap(), b"space again\n");
}

#[test]
fn ferry_cp_reports_enospc_and_leaves_no_partial_file() {
    let (server, disk, keep) = full_disk_server();
    let src = server.state.path().join("big");
    fs::write(&src, random_bytes(8 << 20, 9)).unwrap();
    let o = server.ferry(&["cp", src.to_str().unwrap(), &server.url("/disk/big")]);
    assert!(!o.status.success(), "an 8 MiB copy onto a 4 MiB disk succeeded");
    assert!(stderr(&o).contains("No space left on device"), "ferry cp said: {}", stderr(&o));
    let left: Vec<_> = fs::read_dir(&disk.0).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["keep"], "the failed copy left something behind");
    assert_eq!(fs::read(disk.0.join("keep")).unwrap(), keep);
}
