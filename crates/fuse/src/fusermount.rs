//! A private mount with auto-unmount through `fusermount3`, as libfuse
//! does it. fuser 0.18 asks for `allow_root` (sent as `allow_other`)
//! whenever auto-unmount is wanted, and `fusermount3` refuses that to an
//! ordinary user unless `/etc/fuse.conf` has `user_allow_other` — which
//! Debian does not ship. So we run `fusermount3` ourselves and hand fuser
//! the descriptor.
//!
//! Its own `auto_unmount` only works for root here: once the daemon is
//! gone it checks the mount is dead by opening it, which the kernel
//! refuses (EACCES, not ENOTCONN) to a set-user-ID process on another
//! user's private mount. For a user, a watcher of our own does it: a
//! shell in its own process group that waits for our end of a pipe to
//! close (we exited or died), and then, if the mount is dead, detaches it
//! with `fusermount3 -u -z`, which users may do to their own mounts.

use std::io::{self, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdin, Command, Stdio};

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};

/// What removes the mount once we are gone: the running `fusermount3`
/// (root: it unmounts once our end of its socket closes) or the watcher
/// (users: once our end of its stdin closes). Either is let go on drop.
pub struct Helper {
    socket: Option<UnixStream>,
    watcher_stdin: Option<ChildStdin>,
    child: Child,
    // Kept open so a late message from it cannot end it with SIGPIPE
    // before it has unmounted.
    _stderr: Option<ChildStderr>,
}

impl Drop for Helper {
    fn drop(&mut self) {
        drop(self.socket.take());
        drop(self.watcher_stdin.take());
        let _ = self.child.wait();
    }
}

/// Where `fusermount3` is, if installed.
pub fn find() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    dirs.extend(["/usr/bin", "/bin", "/usr/sbin", "/sbin"].map(PathBuf::from));
    dirs.into_iter().map(|d| d.join("fusermount3")).find(|p| p.is_file())
}

/// Mounts on `mountpoint` with `options` (as `mount.fuse` spells them)
/// and returns the `/dev/fuse` descriptor for the session; with
/// `auto_unmount`, the mount goes away when this process does.
pub fn mount(mountpoint: &Path, options: &[String], auto_unmount: bool) -> io::Result<(OwnedFd, Helper)> {
    let bin = find().ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "fusermount3 not found (install fuse3)"))?;
    let mountpoint = std::fs::canonicalize(mountpoint)?;
    let root = rustix::process::geteuid().is_root();
    let mut options = options.to_vec();
    if auto_unmount && root {
        options.push("auto_unmount".into());
    }
    let (ours, theirs) = UnixStream::pair()?;
    // A dup has no close-on-exec flag, so the helper inherits it; our own
    // end stays close-on-exec. Another child spawned meanwhile may inherit
    // `theirs` too, which is harmless: the helper waits for `ours` to close.
    let inherited = rustix::io::dup(&theirs)?;
    drop(theirs);
    let mut cmd = Command::new(&bin);
    cmd.arg("-o").arg(options.join(",")).arg("--").arg(&mountpoint);
    cmd.env("_FUSE_COMMFD", inherited.as_raw_fd().to_string());
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    let child = cmd.spawn();
    drop(inherited);
    let mut child = child.map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", bin.display())))?;
    let fd = match receive_fd(&ours) {
        Ok(fd) => fd,
        Err(e) => {
            drop(ours);
            let mut msg = String::new();
            if let Some(mut s) = child.stderr.take() {
                let _ = s.read_to_string(&mut msg);
            }
            let _ = child.wait();
            let msg = msg.trim();
            return Err(if msg.is_empty() {
                e
            } else {
                io::Error::new(io::ErrorKind::PermissionDenied, msg.to_string())
            });
        }
    };
    if root || !auto_unmount {
        let stderr = child.stderr.take();
        let socket = auto_unmount.then_some(ours);
        return Ok((fd, Helper { socket, watcher_stdin: None, child, _stderr: stderr }));
    }
    let _ = child.wait();
    let watcher = watch(&bin, &mountpoint);
    match watcher {
        Ok(mut w) => {
            let stdin = w.stdin.take();
            Ok((fd, Helper { socket: None, watcher_stdin: stdin, child: w, _stderr: None }))
        }
        Err(e) => {
            let _ = Command::new(&bin).args(["-u", "-z", "--"]).arg(&mountpoint).status();
            Err(io::Error::new(e.kind(), format!("starting the auto-unmount watcher (sh): {e}")))
        }
    }
}

/// The user's auto-unmount: waits for its stdin to close, then detaches
/// the mount if it is dead (a `stat` fails: ENOTCONN); a mount unmounted
/// cleanly first is a plain directory again and left alone.
fn watch(fusermount: &Path, mountpoint: &Path) -> io::Result<Child> {
    const SCRIPT: &str = r#"cat >/dev/null; stat -- "$2" >/dev/null 2>&1 || exec "$1" -u -z -q -- "$2""#;
    Command::new("sh")
        .args(["-c", SCRIPT, "ferry-auto-unmount"])
        .arg(fusermount)
        .arg(mountpoint)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own process group: a Ctrl-C meant for the mount must not end it.
        .process_group(0)
        .spawn()
}

/// The descriptor `fusermount3` sends once the mount is made.
fn receive_fd(socket: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = loop {
        let mut iov = [IoSliceMut::new(&mut byte)];
        match rustix::net::recvmsg(socket, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
            Err(rustix::io::Errno::INTR) => continue,
            r => break r?,
        }
    };
    if msg.bytes == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "fusermount3 exited without mounting"));
    }
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(mut fds) = m {
            if let Some(fd) = fds.next() {
                return Ok(fd);
            }
        }
    }
    Err(io::Error::new(io::ErrorKind::InvalidData, "fusermount3 sent no descriptor"))
}
