//! The one place where Python paths become remote paths and remote names
//! become Python strings. Everything else passes `RemotePath` through, so a
//! client API that takes bytes instead of `&str` changes only this file.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

/// A path inside the export, as the client library takes it.
#[derive(Clone, Debug)]
pub struct RemotePath(String);

impl RemotePath {
    /// Accepts `str`, `bytes` and `os.PathLike`, like the `os` functions.
    pub fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<RemotePath> {
        let obj = if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
            obj.clone()
        } else {
            obj.py().import("os")?.getattr("fspath")?.call1((obj,))?
        };
        let s = if let Ok(b) = obj.cast::<PyBytes>() {
            std::str::from_utf8(b.as_bytes())
                .map_err(|_| PyValueError::new_err("ferry paths must be UTF-8 for now"))?
                .to_string()
        } else {
            obj.cast::<PyString>()?.to_cow()?.into_owned()
        };
        if s.as_bytes().contains(&0) {
            return Err(PyValueError::new_err("embedded null byte"));
        }
        Ok(RemotePath(s))
    }

    /// What the client library takes.
    pub fn api(&self) -> &str {
        &self.0
    }

    /// For messages (`OSError.filename`).
    pub fn display(&self) -> String {
        self.0.clone()
    }

    /// `self/name` for an entry `read_dir` returned.
    pub fn join(&self, name: &str) -> RemotePath {
        RemotePath(ferry_client::join(&self.0, name))
    }
}

/// A directory entry's name for Python.
pub fn name_to_py<'py>(py: Python<'py>, name: &str) -> Bound<'py, PyAny> {
    PyString::new(py, name).into_any()
}
