//! Python buffers (`bytes`, `bytearray`, `memoryview`, ...) used without
//! copying while the GIL is released.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Runs `f` on the bytes of `buf` with the GIL released. Errors:
/// `ValueError` if the buffer is not C-contiguous.
pub fn with_bytes<R, F>(py: Python<'_>, buf: &PyBuffer<u8>, f: F) -> PyResult<R>
where
    R: Send,
    F: Send + FnOnce(&[u8]) -> R,
{
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err("the buffer must be contiguous"));
    }
    let (ptr, len) = (buf.buf_ptr() as usize, buf.len_bytes());
    Ok(py.detach(move || {
        // SAFETY: `buf` is C-contiguous and `len` bytes long, and it is
        // borrowed for this whole call, so its export keeps the memory
        // alive and in place (a bytearray cannot resize while exported).
        // Only a Python thread that writes the same object meanwhile, on
        // purpose, could change bytes under `f`.
        f(unsafe { std::slice::from_raw_parts(ptr as *const u8, len) })
    }))
}

/// Runs `f` on the bytes of the writable `buf` with the GIL released.
/// Errors: `ValueError` if the buffer is read-only or not C-contiguous.
pub fn with_bytes_mut<R, F>(py: Python<'_>, buf: &PyBuffer<u8>, f: F) -> PyResult<R>
where
    R: Send,
    F: Send + FnOnce(&mut [u8]) -> R,
{
    if buf.readonly() || !buf.is_c_contiguous() {
        return Err(PyValueError::new_err(
            "the buffer must be writable and contiguous (a bytearray, say)",
        ));
    }
    let (ptr, len) = (buf.buf_ptr() as usize, buf.len_bytes());
    Ok(py.detach(move || {
        // SAFETY: as in `with_bytes`; the buffer is also writable, and no
        // other Rust reference to it exists during this call.
        f(unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) })
    }))
}
