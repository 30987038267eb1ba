//! Client errors as Python `OSError`s. `OSError(errno, strerror, filename)`
//! picks the subclass from the errno itself (`FileNotFoundError` for
//! `ENOENT`, `ConnectionResetError` for `ECONNRESET`...), so one mapping
//! covers them all and `errno` is always set.

use pyo3::exceptions::PyOSError;
use pyo3::PyErr;

use crate::paths::RemotePath;

/// The error of an operation on `path` (named in the message, like a local
/// failure), or on the connection when `path` is `None`.
pub fn os_error(e: ferry_client::Error, path: Option<&RemotePath>) -> PyErr {
    let errno = e.errno();
    let message = e.to_string();
    match path {
        Some(p) => PyOSError::new_err((errno, message, p.display())),
        None => PyOSError::new_err((errno, message)),
    }
}

/// A plain errno, for checks made on this side (a closed file...).
pub fn errno_error(errno: i32, message: &str) -> PyErr {
    PyOSError::new_err((errno, message.to_string()))
}

/// `Result` of the client with the path the error is about.
pub trait OrOsError<T> {
    fn on(self, path: &RemotePath) -> pyo3::PyResult<T>;
    fn conn(self) -> pyo3::PyResult<T>;
}

impl<T> OrOsError<T> for ferry_client::Result<T> {
    fn on(self, path: &RemotePath) -> pyo3::PyResult<T> {
        self.map_err(|e| os_error(e, Some(path)))
    }
    fn conn(self) -> pyo3::PyResult<T> {
        self.map_err(|e| os_error(e, None))
    }
}
