//! Record locks taken on the exported file itself, as open file
//! description (OFD) locks: one open file description per lock owner, so
//! the kernel's rules for them are the lock table's (an owner's locks
//! replace, split and merge; two owners conflict). Through them other
//! gateways of a shared file system that supports locks across machines
//! (JuiceFS, CephFS, NFS) exclude ferry's clients and are excluded by them,
//! and so do programs on the server's host using `fcntl` on the files.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use crate::locks::Mode;

/// An owner's open file description of one file.
#[derive(Debug)]
pub struct Ofd(OwnedFd);

impl Ofd {
    /// A new open file description of the regular file `fd` is open on:
    /// read-write where the server may (a shared lock needs read access,
    /// an exclusive one write access), else as the access allows.
    pub fn open(fd: BorrowedFd<'_>) -> io::Result<Ofd> {
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let mut last = None;
        for acc in [libc::O_RDWR, libc::O_RDONLY, libc::O_WRONLY] {
            let flags = acc | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK;
            match rustix::fs::open(&path, rustix::fs::OFlags::from_bits_retain(flags as u32), rustix::fs::Mode::empty())
            {
                Ok(fd) => return Ok(Ofd(fd)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.map_or_else(|| io::Error::from_raw_os_error(libc::EIO), io::Error::from))
    }

    /// Sets this owner's lock over `start..=end` to `mode` (`None`
    /// unlocks), without waiting: `Ok(false)` if another owner — of this
    /// server or not — holds a conflicting lock.
    pub fn set(&self, mode: Option<Mode>, start: u64, end: u64) -> io::Result<bool> {
        let mut fl = flock(mode, start, end);
        match fcntl(self.0.as_fd(), libc::F_OFD_SETLK, &mut fl) {
            Ok(()) => Ok(true),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// A lock of anyone but the owner of `fd`'s open file description that
/// conflicts with `mode` over `start..=end`: its mode and range.
pub fn conflict(fd: BorrowedFd<'_>, mode: Mode, start: u64, end: u64) -> io::Result<Option<(Mode, u64, u64)>> {
    let mut fl = flock(Some(mode), start, end);
    fcntl(fd, libc::F_OFD_GETLK, &mut fl)?;
    if fl.l_type == libc::F_UNLCK as libc::c_short {
        return Ok(None);
    }
    let m = if fl.l_type == libc::F_WRLCK as libc::c_short { Mode::Write } else { Mode::Read };
    let s = fl.l_start as u64;
    let e = if fl.l_len == 0 { u64::MAX } else { s + fl.l_len as u64 - 1 };
    Ok(Some((m, s, e)))
}

fn flock(mode: Option<Mode>, start: u64, end: u64) -> libc::flock {
    let typ = match mode {
        Some(Mode::Read) => libc::F_RDLCK,
        Some(Mode::Write) => libc::F_WRLCK,
        None => libc::F_UNLCK,
    };
    // SAFETY: `flock` is plain data; all zeroes is a valid value (and the
    // `l_pid` OFD locks require).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    // The table's ranges end at most at i64::MAX, or run to the end.
    fl.l_len = if end == u64::MAX { 0 } else { (end - start + 1) as libc::off_t };
    fl
}

fn fcntl(fd: BorrowedFd<'_>, cmd: libc::c_int, fl: &mut libc::flock) -> io::Result<()> {
    // SAFETY: `fd` is a live descriptor for the call, and `fl` a valid
    // `struct flock` the kernel reads and (for F_OFD_GETLK) writes.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), cmd, fl as *mut libc::flock) };
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl AsFd for Ofd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_conflict_through_the_kernel() {
        let dir = std::env::temp_dir().join(format!("ferry-ofd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let (a, b) = (Ofd::open(f.as_fd()).unwrap(), Ofd::open(f.as_fd()).unwrap());
        assert!(a.set(Some(Mode::Write), 0, 4).unwrap());
        assert!(!b.set(Some(Mode::Read), 4, 4).unwrap(), "b locked over a's write lock");
        assert!(b.set(Some(Mode::Write), 5, u64::MAX).unwrap());
        assert_eq!(conflict(f.as_fd(), Mode::Read, 0, 0).unwrap(), Some((Mode::Write, 0, 4)));
        assert_eq!(conflict(a.as_fd(), Mode::Write, 0, 4).unwrap(), None, "a conflicts with itself");
        // Closing an owner's description ends its locks.
        drop(a);
        assert!(b.set(Some(Mode::Read), 0, 4).unwrap());
        assert!(b.set(None, 0, u64::MAX).unwrap());
        assert_eq!(conflict(f.as_fd(), Mode::Write, 0, u64::MAX).unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
