//! The same-host path's file data: a descriptor of the server's own open
//! file, passed over its Unix socket (`FileFd`), read and written with
//! plain `pread`/`pwrite` — no request, no copy through a socket. Its page
//! cache is the server's, so what is written is at once what every other
//! client of the server reads.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::error::{Error, Result};

pub(crate) struct Local {
    fd: OwnedFd,
    pub(crate) writable: bool,
}

fn errno(e: rustix::io::Errno) -> Error {
    Error::remote(e.raw_os_error())
}

impl Local {
    pub(crate) fn new(fd: OwnedFd, writable: bool) -> Local {
        Local { fd, writable }
    }

    /// The descriptor itself: the mount hands it to the kernel as a FUSE
    /// passthrough backing.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Fills `buf` from `offset`, short only at the end of the file.
    pub(crate) fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match rustix::io::pread(&self.fd, &mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(errno(e)),
            }
        }
        Ok(done)
    }

    /// Writes all of `buf` at `offset` (at the end, for a file opened to
    /// append); returns the offset just past it.
    pub(crate) fn write_at(&self, buf: &[u8], offset: u64, append: bool) -> Result<u64> {
        let mut done = 0;
        while done < buf.len() {
            let r = match append {
                true => rustix::io::write(&self.fd, &buf[done..]),
                false => rustix::io::pwrite(&self.fd, &buf[done..], offset + done as u64),
            };
            match r {
                Ok(0) => return Err(Error::remote(libc::ENOSPC)),
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(errno(e)),
            }
        }
        match append {
            true => rustix::fs::seek(&self.fd, rustix::fs::SeekFrom::Current(0)).map_err(errno),
            false => Ok(offset + buf.len() as u64),
        }
    }
}
