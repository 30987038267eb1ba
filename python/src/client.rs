//! `ferry._ferry.Client`: the path operations of the client library, each
//! run with the GIL released, and a connection that is made again in a
//! forked child (the parent's socket is not the child's to use).

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use ferry_client::{token, Attr, Client, OpenOptions, Options, StatFs, Target, Time, Url};
use pyo3::exceptions::{PyPermissionError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};
use rustix::process::{getpid, Pid};

use crate::errors::{os_error, OrOsError};
use crate::file::RawFile;
use crate::paths::{name_to_py, RemotePath};

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Conn {
    /// The process that connected.
    pid: Pid,
    client: Client,
}

#[pyclass(module = "ferry._ferry", name = "Client", frozen)]
pub struct PyClient {
    addr: String,
    opts: Options,
    conn: Mutex<Conn>,
}

/// `stat` fields for Python: (mode, ino, dev, nlink, uid, gid, size),
/// (atime, mtime, ctime in nanoseconds), (blksize, blocks, rdev).
pub type StatTuple = ((u32, u64, u64, u64, u32, u32, u64), (i64, i64, i64), (u32, u64, u64));

fn ns(t: Time) -> i64 {
    t.sec.saturating_mul(1_000_000_000).saturating_add(i64::from(t.nsec))
}

pub fn stat_tuple(a: &Attr) -> StatTuple {
    (
        (a.mode, a.ino, a.dev, a.nlink, a.uid, a.gid, a.size),
        (ns(a.atime), ns(a.mtime), ns(a.ctime)),
        (a.blksize, a.blocks, a.rdev),
    )
}

fn time_of(ns: i64) -> Time {
    Time { sec: ns.div_euclid(1_000_000_000), nsec: ns.rem_euclid(1_000_000_000) as u32 }
}

/// `host:port` from `ferry://host[:port][/...]` or `host[:port]`.
fn parse_addr(s: &str) -> PyResult<String> {
    let url = if Url::is_url(s.as_bytes()) { s.to_string() } else { format!("ferry://{s}") };
    Ok(Url::parse(&url).map_err(PyValueError::new_err)?.addr)
}

/// A token given as `str` or `bytes`; surrounding whitespace is not part of
/// it (as in token files and `FERRY_TOKEN`).
fn token_bytes(t: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let raw: Vec<u8> = if let Ok(s) = t.cast::<PyString>() {
        s.to_cow()?.as_bytes().to_vec()
    } else {
        t.cast::<PyBytes>()?.as_bytes().to_vec()
    };
    let s = String::from_utf8_lossy(&raw);
    Ok(s.trim().as_bytes().to_vec())
}

impl PyClient {
    /// The connection of this process: made again after `fork`. The
    /// parent's is left untouched (its replies are the parent's to read).
    pub fn client(&self) -> ferry_client::Result<Client> {
        let mut c = lock(&self.conn);
        let me = getpid();
        if c.pid != me {
            c.client = Client::connect(&self.addr, &self.opts)?;
            c.pid = me;
        }
        Ok(c.client.clone())
    }

    fn run<T, F>(&self, py: Python<'_>, path: &RemotePath, f: F) -> PyResult<T>
    where
        F: FnOnce(&Client, &Path) -> ferry_client::Result<T> + Send,
        T: Send,
    {
        py.detach(|| {
            let c = self.client().conn()?;
            f(&c, path.api()).on(path)
        })
    }

    fn target<'a>(path: &'a RemotePath, follow: bool) -> Target<'a> {
        if follow {
            Target::Path(path.bytes())
        } else {
            Target::PathNoFollow(path.bytes())
        }
    }
}

#[pymethods]
impl PyClient {
    #[new]
    #[pyo3(signature = (addr, token=None, token_file=None, window=None))]
    fn new(
        py: Python<'_>,
        addr: &str,
        token: Option<&Bound<'_, PyAny>>,
        token_file: Option<PathBuf>,
        window: Option<u32>,
    ) -> PyResult<Self> {
        let addr = parse_addr(addr)?;
        let token = match token {
            Some(t) => Some(token_bytes(t)?),
            None => token::find_client_token(token_file.as_deref()).map_err(PyPermissionError::new_err)?,
        };
        let mut opts = Options { token, ..Options::default() }.tls_from_env().map_err(PyValueError::new_err)?;
        if let Some(w) = window {
            opts.window = w.max(1);
        }
        let client = py.detach(|| Client::connect(&addr, &opts)).conn()?;
        Ok(PyClient { addr, opts, conn: Mutex::new(Conn { pid: getpid(), client }) })
    }

    /// `host:port` of the server.
    #[getter]
    fn addr(&self) -> &str {
        &self.addr
    }

    /// Largest payload of one read or write request.
    #[getter]
    fn max_io(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(py.detach(|| self.client()).conn()?.engine().max_io())
    }

    /// Requests kept in flight.
    #[getter]
    fn window(&self, py: Python<'_>) -> PyResult<u32> {
        Ok(py.detach(|| self.client()).conn()?.engine().window())
    }

    fn ping(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.client().and_then(|c| c.ping())).conn()
    }

    #[pyo3(signature = (path, follow_symlinks=true))]
    fn stat(&self, py: Python<'_>, path: &Bound<'_, PyAny>, follow_symlinks: bool) -> PyResult<StatTuple> {
        let p = RemotePath::from_py(path)?;
        let t = Self::target(&p, follow_symlinks);
        self.run(py, &p, |c, _| c.stat(t).map(|a| stat_tuple(&a)))
    }

    /// Entries except `.` and `..`: `(name, d_type, stat tuple or None)`,
    /// attributes of the entry itself (not following symlinks).
    fn scandir<'py>(&self, py: Python<'py>, path: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        let p = RemotePath::from_py(path)?;
        let entries = self.run(py, &p, |c, p| c.read_dir(p))?;
        let out = PyList::empty(py);
        for e in entries {
            let attr = e.attr.as_ref().map(stat_tuple);
            out.append((name_to_py(py, &e.name)?, e.kind, attr))?;
        }
        Ok(out)
    }

    #[pyo3(signature = (path, mode=0o777))]
    fn mkdir(&self, py: Python<'_>, path: &Bound<'_, PyAny>, mode: u32) -> PyResult<()> {
        let p = RemotePath::from_py(path)?;
        self.run(py, &p, |c, p| c.create_dir(p, mode).map(|_| ()))
    }

    /// `mkdir -p`; an existing directory is fine unless `exist_ok` is false.
    #[pyo3(signature = (path, mode=0o777, exist_ok=false))]
    fn makedirs(&self, py: Python<'_>, path: &Bound<'_, PyAny>, mode: u32, exist_ok: bool) -> PyResult<()> {
        let p = RemotePath::from_py(path)?;
        self.run(py, &p, |c, p| {
            if !exist_ok && c.symlink_metadata(p).is_ok() {
                return Err(ferry_client::Error::remote(libc::EEXIST));
            }
            c.create_dir_all(p, mode)
        })
    }

    fn remove(&self, py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<()> {
        let p = RemotePath::from_py(path)?;
        self.run(py, &p, |c, p| c.remove_file(p))
    }

    fn rmdir(&self, py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<()> {
        let p = RemotePath::from_py(path)?;
        self.run(py, &p, |c, p| c.remove_dir(p))
    }

    /// `rm -r` of a directory (symlinks removed, never followed).
    fn rmtree(&self, py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<()> {
        let p = RemotePath::from_py(path)?;
        self.run(py, &p, |c, p| c.remove_dir_all(p))
    }

    /// `renameat2`: replaces `dst` unless `noreplace`.
    #[pyo3(signature = (src, dst, noreplace=false))]
    fn rename(&self, py: Python<'_>, src: &Bound<'_, PyAny>, dst: &Bound<'_, PyAny>, noreplace: bool) -> PyResult<()> {
        let (s, d) = (RemotePath::from_py(src)?, RemotePath::from_py(dst)?);
        let flags = if noreplace { 1 } else { 0 };
        self.run(py, &s, |c, s| c.rename_with_flags(s, d.api(), flags))
    }

    fn link(&self, py: Python<'_>, src: &Bound<'_, PyAny>, dst: &Bound<'_, PyAny>) -> PyResult<()> {
        let (s, d) = (RemotePath::from_py(src)?, RemotePath::from_py(dst)?);
        self.run(py, &d, |c, d| c.hard_link(s.api(), d).map(|_| ()))
    }

    /// Creates `path` as a symlink to `target` (the order of `os.symlink`).
    fn symlink(&self, py: Python<'_>, target: &Bound<'_, PyAny>, path: &Bound<'_, PyAny>) -> PyResult<()> {
        let (t, p) = (RemotePath::from_py(target)?, RemotePath::from_py(path)?);
        self.run(py, &p, |c, p| c.symlink(t.api(), p).map(|_| ()))
    }

    fn readlink(&self, py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<std::ffi::OsString> {
        let p = RemotePath::from_py(path)?;
        self.run(py, &p, |c, p| c.read_link(p).map(std::path::PathBuf::into_os_string))
    }

    #[pyo3(signature = (path, mode, follow_symlinks=true))]
    fn chmod(&self, py: Python<'_>, path: &Bound<'_, PyAny>, mode: u32, follow_symlinks: bool) -> PyResult<()> {
        let p = RemotePath::from_py(path)?;
        let t = Self::target(&p, follow_symlinks);
        self.run(py, &p, |c, _| c.set_permissions(t, mode).map(|_| ()))
    }

    /// `-1` leaves an id unchanged, as in `os.chown`.
    #[pyo3(signature = (path, uid, gid, follow_symlinks=true))]
    fn chown(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        uid: i64,
        gid: i64,
        follow_symlinks: bool,
    ) -> PyResult<()> {
        let p = RemotePath::from_py(path)?;
        let t = Self::target(&p, follow_symlinks);
        let id = |v: i64| if v < 0 { u32::MAX } else { v as u32 };
        self.run(py, &p, |c, _| c.chown(t, id(uid), id(gid)).map(|_| ()))
    }

    /// Sets access and modification times in nanoseconds; `None` sets both
    /// to the server's current time.
    #[pyo3(signature = (path, ns=None, follow_symlinks=true))]
    fn utime(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        ns: Option<(i64, i64)>,
        follow_symlinks: bool,
    ) -> PyResult<()> {
        let p = RemotePath::from_py(path)?;
        let t = Self::target(&p, follow_symlinks);
        let now = Time { sec: 0, nsec: ferry_proto::UTIME_NOW };
        let (a, m) = match ns {
            Some((a, m)) => (time_of(a), time_of(m)),
            None => (now, now),
        };
        self.run(py, &p, |c, _| c.set_times(t, a, m).map(|_| ()))
    }

    fn truncate(&self, py: Python<'_>, path: &Bound<'_, PyAny>, length: u64) -> PyResult<()> {
        let p = RemotePath::from_py(path)?;
        self.run(py, &p, |c, p| c.truncate(Target::Path(p.as_os_str().as_bytes()), length).map(|_| ()))
    }

    /// bsize, frsize, blocks, bfree, bavail, files, ffree, favail, flags,
    /// namemax (the order of `os.statvfs_result`), fsid.
    #[allow(clippy::type_complexity)]
    fn statvfs(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
    ) -> PyResult<(u64, u64, u64, u64, u64, u64, u64, u64, u64, u64, u64)> {
        let p = RemotePath::from_py(path)?;
        let s: StatFs = self.run(py, &p, |c, p| c.statfs(p))?;
        Ok((s.bsize, s.frsize, s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.favail, s.flags, s.namemax, s.fsid))
    }

    /// `os.access`: true if allowed; false for a denial or a missing file.
    fn access(&self, py: Python<'_>, path: &Bound<'_, PyAny>, mode: u32) -> PyResult<bool> {
        let p = RemotePath::from_py(path)?;
        match self.run(py, &p, |c, p| c.access(p, mode)) {
            Ok(()) => Ok(true),
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyOSError>(py) => {
                let errno: i32 = e.value(py).getattr("errno")?.extract()?;
                if errno == libc::ENOENT || errno == libc::EACCES || errno == libc::EROFS || errno == libc::ENOTDIR {
                    Ok(false)
                } else {
                    Err(e)
                }
            }
            Err(e) => Err(e),
        }
    }

    #[pyo3(signature = (path, name, follow_symlinks=true))]
    fn getxattr<'py>(
        &self,
        py: Python<'py>,
        path: &Bound<'py, PyAny>,
        name: &str,
        follow_symlinks: bool,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let p = RemotePath::from_py(path)?;
        let t = Self::target(&p, follow_symlinks);
        let v = self.run(py, &p, |c, _| c.get_xattr(t, name))?;
        Ok(PyBytes::new(py, &v))
    }

    #[pyo3(signature = (path, name, value, flags=0, follow_symlinks=true))]
    fn setxattr(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        name: &str,
        value: &[u8],
        flags: u32,
        follow_symlinks: bool,
    ) -> PyResult<()> {
        let p = RemotePath::from_py(path)?;
        let t = Self::target(&p, follow_symlinks);
        self.run(py, &p, |c, _| c.set_xattr(t, name, value, flags))
    }

    #[pyo3(signature = (path, follow_symlinks=true))]
    fn listxattr(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        follow_symlinks: bool,
    ) -> PyResult<Vec<std::ffi::OsString>> {
        let p = RemotePath::from_py(path)?;
        let t = Self::target(&p, follow_symlinks);
        self.run(py, &p, |c, _| c.list_xattr(t))
    }

    #[pyo3(signature = (path, name, follow_symlinks=true))]
    fn removexattr(&self, py: Python<'_>, path: &Bound<'_, PyAny>, name: &str, follow_symlinks: bool) -> PyResult<()> {
        let p = RemotePath::from_py(path)?;
        let t = Self::target(&p, follow_symlinks);
        self.run(py, &p, |c, _| c.remove_xattr(t, name))
    }

    /// The whole file.
    fn read_bytes<'py>(&self, py: Python<'py>, path: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
        let p = RemotePath::from_py(path)?;
        let v = self.run(py, &p, |c, p| c.read(p))?;
        Ok(PyBytes::new(py, &v))
    }

    /// Creates or truncates `path` and writes `data`.
    fn write_bytes(&self, py: Python<'_>, path: &Bound<'_, PyAny>, data: &[u8]) -> PyResult<()> {
        let p = RemotePath::from_py(path)?;
        self.run(py, &p, |c, p| c.write(p, data))
    }

    /// Opens with Linux `open(2)` flags (`os.O_*`).
    #[pyo3(signature = (path, flags, mode=0o666))]
    fn open(slf: &Bound<'_, Self>, path: &Bound<'_, PyAny>, flags: u32, mode: u32) -> PyResult<RawFile> {
        let p = RemotePath::from_py(path)?;
        let me = slf.get();
        let file = me.run(slf.py(), &p, |c, p| c.open(p, OpenOptions::new().custom_flags(flags).mode(mode)))?;
        Ok(RawFile::new(slf.clone().unbind(), p, flags, file))
    }

    /// Byte ranges of files in one round of pipelined requests:
    /// `paths[i]` from `starts[i]` to `ends[i]` (Python slice rules: `None`
    /// is the end, negative counts from the end). Each item is `bytes`, or
    /// the `OSError` of that range.
    fn read_ranges<'py>(
        &self,
        py: Python<'py>,
        paths: Vec<Bound<'py, PyAny>>,
        starts: Vec<Option<i64>>,
        ends: Vec<Option<i64>>,
    ) -> PyResult<Bound<'py, PyList>> {
        if paths.len() != starts.len() || paths.len() != ends.len() {
            return Err(PyValueError::new_err("paths, starts and ends must have the same length"));
        }
        let paths: Vec<RemotePath> = paths.iter().map(RemotePath::from_py).collect::<PyResult<_>>()?;
        let client = py.detach(|| self.client()).conn()?;
        let results = py.detach(|| crate::ranges::read_ranges(&client, &paths, &starts, &ends));
        let out = PyList::empty(py);
        for (r, p) in results.into_iter().zip(&paths) {
            match r {
                Ok(v) => out.append(PyBytes::new(py, &v))?,
                Err(e) => out.append(os_error(e, Some(p)).into_value(py))?,
            }
        }
        Ok(out)
    }
}
