//! `vmstore`: Python bindings to Ignition's snapshot store (the
//! `snapshot-store` crate). The Python package `vmstore` re-exports this
//! native module (`vmstore._vmstore`); its documentation and type stubs are
//! in `python/vmstore/__init__.pyi`.
//!
//! Sizes are bytes, times `datetime` (UTC) or seconds as `float`. Errors
//! are `vmstore.StoreError`, or its subclass `vmstore.VerifyError` when a
//! file is missing, damaged or inconsistent (with `.path` and `.problem`).
//! Every call that reads, writes or hashes files releases the GIL.

mod buf;
mod store;
mod types;

use std::time::Instant;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use snapshot_store as ss;

/// Micro-benchmark of a diff's packing: the packed diff file (header,
/// index, pages) of the pages numbered `pages` (strictly increasing) of
/// `ram` (RAM as bytes, a whole number of `page_size`-byte pages). Returns
/// `(file bytes, seconds)`; no file is written.
#[pyfunction]
#[pyo3(signature = (ram, pages, page_size = 16384))]
fn pack_diff<'py>(
    py: Python<'py>,
    ram: PyBuffer<u8>,
    pages: Vec<u64>,
    page_size: u64,
) -> PyResult<(Bound<'py, PyBytes>, f64)> {
    let (packed, secs) = buf::with_bytes(py, &ram, |bytes| {
        let t = Instant::now();
        // Checks the geometry and that every page is inside `ram`.
        let prefix = ss::format::diff::encode_diff_prefix(page_size, bytes.len() as u64, &pages)
            .map_err(|e| e.to_string())?;
        let mut out = Vec::with_capacity(prefix.len() + pages.len() * page_size as usize);
        out.extend_from_slice(&prefix);
        for &p in &pages {
            let at = (p * page_size) as usize;
            out.extend_from_slice(&bytes[at..at + page_size as usize]);
        }
        Ok::<_, String>((out, t.elapsed().as_secs_f64()))
    })?
    .map_err(PyValueError::new_err)?;
    Ok((PyBytes::new(py, &packed), secs))
}

/// The native part of the `vmstore` package.
#[pymodule]
fn _vmstore(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<store::Store>()?;
    m.add_class::<types::Layer>()?;
    m.add_class::<types::Usage>()?;
    m.add_class::<types::VerifyReport>()?;
    m.add_class::<types::GcReport>()?;
    m.add_function(wrap_pyfunction!(pack_diff, m)?)?;
    m.add("StoreError", m.py().get_type::<types::StoreError>())?;
    m.add("VerifyError", m.py().get_type::<types::VerifyError>())?;
    m.add("MEMORY_CHUNK_SIZE", ss::format::memory::MEMORY_CHUNK_SIZE)?;
    m.add("MAX_STATE_BYTES", ss::format::state::MAX_STATE_BYTES)?;
    Ok(())
}
