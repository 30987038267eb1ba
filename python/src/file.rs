//! `ferry._ferry.RawFile`: an open remote file for `io.RawIOBase`. Reads go
//! through the library's read-ahead and small-read buffer, writes through
//! its write-behind; the GIL is released for every call that may wait.
//!
//! After `fork` the child reopens the file on its own connection at the
//! same position; the parent's handle (and its writes in flight) stay the
//! parent's.

use std::io::{Read, Seek, SeekFrom, Write};
use std::sync::Mutex;

use ferry_client::{File, OpenOptions};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use rustix::process::{getpid, Pid};

use crate::client::{lock, stat_tuple, PyClient, StatTuple};
use crate::errors::{errno_error, OrOsError};
use crate::paths::RemotePath;

struct FileState {
    /// The process `file` belongs to.
    pid: Pid,
    file: Option<File>,
    /// The position as far as this side knows, to reopen after `fork`.
    pos: u64,
    /// After an append the position is the end, wherever that is.
    at_end: bool,
}

impl Drop for FileState {
    fn drop(&mut self) {
        // A child must not close the parent's handle, nor wait for the
        // parent's writes (it would read replies off the parent's socket).
        if self.pid != getpid() {
            std::mem::forget(self.file.take());
        }
    }
}

#[pyclass(module = "ferry._ferry", name = "RawFile", frozen)]
pub struct RawFile {
    owner: Py<PyClient>,
    path: RemotePath,
    flags: u32,
    size: u64,
    st: Mutex<FileState>,
}

fn closed() -> PyErr {
    PyValueError::new_err("I/O operation on closed file")
}

impl RawFile {
    pub fn new(owner: Py<PyClient>, path: RemotePath, flags: u32, file: File) -> RawFile {
        let size = file.attr().size;
        let at_end = flags & libc::O_APPEND as u32 != 0;
        RawFile {
            owner,
            path,
            flags,
            size,
            st: Mutex::new(FileState { pid: getpid(), file: Some(file), pos: 0, at_end }),
        }
    }

    /// Runs `f` on this process's handle, GIL released.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut File, &mut FileState) -> PyResult<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| {
            let mut st = lock(&self.st);
            self.reopen_after_fork(&mut st)?;
            let mut file = st.file.take().ok_or_else(closed)?;
            let r = f(&mut file, &mut st);
            st.file = Some(file);
            r
        })
    }

    fn reopen_after_fork(&self, st: &mut FileState) -> PyResult<()> {
        let me = getpid();
        if st.pid == me || st.file.is_none() {
            st.pid = me;
            return Ok(());
        }
        std::mem::forget(st.file.take());
        st.pid = me;
        let client = self.owner.get().client().on(&self.path)?;
        let flags = self.flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC) as u32;
        let mut f = client.open(self.path.api(), OpenOptions::new().custom_flags(flags)).on(&self.path)?;
        let to = if st.at_end { SeekFrom::End(0) } else { SeekFrom::Start(st.pos) };
        st.pos = f.seek(to).map_err(ferry_io).on(&self.path)?;
        st.file = Some(f);
        Ok(())
    }
}

/// `io::Error` from the library's `Read`/`Write`/`Seek` back to its error.
fn ferry_io(e: std::io::Error) -> ferry_client::Error {
    let errno = e.raw_os_error().unwrap_or(libc::EIO);
    ferry_client::Error::Remote { errno, message: e.to_string() }
}

/// Reads until `buf` is full or the file ends.
fn read_full(f: &mut File, buf: &mut [u8]) -> ferry_client::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]).map_err(ferry_io)? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[pymethods]
impl RawFile {
    #[getter]
    fn name(&self) -> String {
        self.path.display()
    }

    /// `open(2)` flags the file was opened with.
    #[getter]
    fn flags(&self) -> u32 {
        self.flags
    }

    /// Size as of `open`.
    #[getter]
    fn size(&self) -> u64 {
        self.size
    }

    #[getter]
    fn closed(&self) -> bool {
        lock(&self.st).file.is_none()
    }

    /// Fills the `len` bytes at `addr` (a buffer the caller keeps exported
    /// for the call) as far as the file goes; returns the count.
    fn readinto_addr(&self, py: Python<'_>, addr: usize, len: usize) -> PyResult<usize> {
        if addr == 0 && len != 0 {
            return Err(PyValueError::new_err("null buffer"));
        }
        let path = &self.path;
        self.with(py, |f, st| {
            if len == 0 {
                return Ok(0);
            }
            // SAFETY: the Python wrapper passes the address and length of a
            // writable buffer it holds exported (a ctypes array made with
            // `from_buffer`) until this call returns, so the memory stays
            // valid and cannot be resized or freed meanwhile.
            let buf = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
            let n = read_full(f, buf).on(path)?;
            st.pos += n as u64;
            Ok(n)
        })
    }

    /// Up to `n` bytes (`n < 0`: to the end of the file).
    #[pyo3(signature = (n=-1))]
    fn read<'py>(&self, py: Python<'py>, n: i64) -> PyResult<Bound<'py, PyBytes>> {
        let path = &self.path;
        let v = self.with(py, |f, st| {
            let v = if n >= 0 {
                let mut v = vec![0u8; n as usize];
                let got = read_full(f, &mut v).on(path)?;
                v.truncate(got);
                v
            } else {
                let mut v = Vec::new();
                f.read_to_end(&mut v).map_err(ferry_io).on(path)?;
                v
            };
            st.pos += v.len() as u64;
            Ok(v)
        })?;
        Ok(PyBytes::new(py, &v))
    }

    /// Writes all of `data` (behind: a failure is reported by a later call,
    /// `flush` or `close`).
    fn write(&self, py: Python<'_>, data: &[u8]) -> PyResult<usize> {
        self.write_slice(py, data)
    }

    /// `write` from the `len` bytes at `addr`, exported by the caller.
    fn write_addr(&self, py: Python<'_>, addr: usize, len: usize) -> PyResult<usize> {
        if len == 0 {
            return Ok(0);
        }
        if addr == 0 {
            return Err(PyValueError::new_err("null buffer"));
        }
        // SAFETY: as in `readinto_addr`; the bytes are only read, and the
        // library has sent them to the socket before `write` returns.
        let data = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        self.write_slice(py, data)
    }

    #[pyo3(signature = (offset, whence=0))]
    fn seek(&self, py: Python<'_>, offset: i64, whence: i32) -> PyResult<u64> {
        let path = &self.path;
        self.with(py, |f, st| {
            let to = match whence {
                0 if offset < 0 => return Err(errno_error(libc::EINVAL, "negative seek position")),
                0 => SeekFrom::Start(offset as u64),
                1 => SeekFrom::Current(offset),
                2 => SeekFrom::End(offset),
                _ => return Err(PyValueError::new_err(format!("invalid whence ({whence})"))),
            };
            let pos = f.seek(to).map_err(ferry_io).on(path)?;
            st.pos = pos;
            st.at_end = false;
            Ok(pos)
        })
    }

    fn tell(&self, py: Python<'_>) -> PyResult<u64> {
        self.seek(py, 0, 1)
    }

    /// Waits for the writes in flight; reports the first failure.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        // A forked child has nothing in flight on the parent's handle (and
        // `io` flushes on close and collection: no reason to reconnect).
        if lock(&self.st).pid != getpid() {
            return Ok(());
        }
        let path = &self.path;
        self.with(py, |f, _| f.flush().map_err(ferry_io).on(path))
    }

    /// `fsync` (`fdatasync` with `datasync`).
    #[pyo3(signature = (datasync=false))]
    fn fsync(&self, py: Python<'_>, datasync: bool) -> PyResult<()> {
        let path = &self.path;
        self.with(py, |f, _| if datasync { f.sync_data() } else { f.sync_all() }.on(path))
    }

    fn truncate(&self, py: Python<'_>, size: u64) -> PyResult<()> {
        let path = &self.path;
        self.with(py, |f, _| f.set_len(size).on(path))
    }

    /// `fstat` tuple (see `Client.stat`).
    fn fstat(&self, py: Python<'_>) -> PyResult<StatTuple> {
        let path = &self.path;
        self.with(py, |f, _| f.metadata().map(|a| stat_tuple(&a)).on(path))
    }

    /// Waits for pending writes and closes; reports any failure. Closing
    /// twice is allowed.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let path = &self.path;
        py.detach(|| {
            let mut st = lock(&self.st);
            let file = st.file.take();
            match file {
                // The parent's handle: not the child's to close.
                Some(f) if st.pid != getpid() => {
                    std::mem::forget(f);
                    Ok(())
                }
                Some(f) => f.close().on(path),
                None => Ok(()),
            }
        })
    }
}

impl RawFile {
    fn write_slice(&self, py: Python<'_>, data: &[u8]) -> PyResult<usize> {
        let path = &self.path;
        self.with(py, |f, st| {
            f.write_all(data).map_err(ferry_io).on(path)?;
            st.pos += data.len() as u64;
            Ok(data.len())
        })
    }
}
