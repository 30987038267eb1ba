//! The native part of the `ferry` Python package (`ferry._ferry`): the
//! client library's path operations and open files. The Python modules
//! beside it (`python/ferry/`) make them `io` objects and an fsspec file
//! system.

mod client;
mod errors;
mod file;
mod paths;
mod ranges;

use pyo3::prelude::*;

#[pymodule]
fn _ferry(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<client::PyClient>()?;
    m.add_class::<file::RawFile>()?;
    Ok(())
}
