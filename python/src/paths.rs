//! The one place where Python paths become remote paths and remote names
//! become Python strings. Everything else passes `RemotePath` through, so a
//! client API that takes bytes instead of `&str` changes only this file.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// A path inside the export, as the client library takes it: bytes, as
/// Linux names are (a `str` is encoded with `os.fsencode`, so names that are
/// not UTF-8 round-trip through Python's surrogate escapes).
#[derive(Clone, Debug)]
pub struct RemotePath(PathBuf);

impl RemotePath {
    /// Accepts `str`, `bytes` and `os.PathLike`, like the `os` functions.
    pub fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<RemotePath> {
        let encoded = obj.py().import("os")?.getattr("fsencode")?.call1((obj,))?;
        let b = encoded.cast::<PyBytes>()?.as_bytes();
        if b.contains(&0) {
            return Err(PyValueError::new_err("embedded null byte"));
        }
        Ok(RemotePath(PathBuf::from(OsStr::from_bytes(b))))
    }

    /// What the client library takes.
    pub fn api(&self) -> &Path {
        &self.0
    }

    /// The raw bytes (for `Target`s).
    pub fn bytes(&self) -> &[u8] {
        self.0.as_os_str().as_bytes()
    }

    /// For messages (`OSError.filename`).
    pub fn display(&self) -> String {
        self.0.to_string_lossy().into_owned()
    }

    /// `self/name` for an entry `read_dir` returned.
    pub fn join(&self, name: &[u8]) -> RemotePath {
        RemotePath(ferry_client::join(&self.0, OsStr::from_bytes(name)))
    }
}

/// A name or path from the server for Python: `os.fsdecode`, as `os.listdir`
/// of a `str` path gives (undecodable bytes become surrogate escapes).
pub fn name_to_py<'py>(py: Python<'py>, name: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    py.import("os")?.getattr("fsdecode")?.call1((PyBytes::new(py, name),))
}
