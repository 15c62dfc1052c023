//! `vmstore`: Python bindings to Ignition's snapshot store (the
//! `snapshot-store` crate). The Python package `vmstore` re-exports this
//! native module (`vmstore._vmstore`); its documentation and type stubs are
//! in `python/vmstore/__init__.pyi`.
//!
//! Sizes are bytes, times `datetime` (UTC) or seconds as `float`. Errors
//! are `vmstore.StoreError`, or its subclass `vmstore.VerifyError` when a
//! verification finds a damaged or inconsistent file (with `.path`). Every
//! call that reads or hashes files releases the GIL.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Instant;

use pyo3::buffer::PyBuffer;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use snapshot_store as ss;

create_exception!(
    vmstore,
    StoreError,
    PyException,
    "A store operation failed: the message names the file and the problem."
);
create_exception!(
    vmstore,
    VerifyError,
    StoreError,
    "A verification found a damaged or inconsistent file; `path` names it."
);

/// The Python exception for a store error: `VerifyError` (with `path`) for
/// damaged content, `StoreError` otherwise.
fn to_py(py: Python<'_>, e: ss::Error) -> PyErr {
    match &e {
        ss::Error::Corrupt { path, .. } => {
            let err = VerifyError::new_err(e.to_string());
            let _ = err
                .value(py)
                .setattr("path", path.to_string_lossy().into_owned());
            err
        }
        _ => StoreError::new_err(e.to_string()),
    }
}

/// `datetime.datetime` (UTC) of a Unix time in seconds.
fn utc(py: Python<'_>, secs: u64) -> PyResult<Py<PyAny>> {
    let dt = py.import("datetime")?;
    let tz = dt.getattr("timezone")?.getattr("utc")?;
    Ok(dt
        .getattr("datetime")?
        .call_method1("fromtimestamp", (secs, tz))?
        .unbind())
}

/// One snapshot layer, as its manifest and directory describe it.
#[pyclass(frozen, get_all, module = "vmstore")]
struct Layer {
    /// The snapshot's name.
    name: String,
    /// `"full"` or `"diff"`.
    kind: String,
    /// The parent's name (diffs), else `None`.
    parent: Option<String>,
    /// Creation time, a timezone-aware `datetime` (UTC).
    created: Py<PyAny>,
    /// Guest RAM size in bytes.
    ram_size: u64,
    /// Page size in bytes.
    page_size: u64,
    /// Pages a diff holds (`None` for a full layer).
    diff_pages: Option<u64>,
    /// The disk image's size in bytes, if the VM had a disk.
    disk_size: Option<u64>,
    /// sha256 of `manifest.json` (hex): pins the layer and its ancestry.
    content_sha256: String,
    /// The layer directory.
    path: String,
    /// vCPUs, backend and GIC mode the machine state was taken with.
    vcpus: u32,
    backend: String,
    gic_mode: String,
}

#[pymethods]
impl Layer {
    fn __repr__(&self) -> String {
        format!(
            "Layer(name={:?}, kind={:?}, parent={:?})",
            self.name, self.kind, self.parent
        )
    }
}

fn layer(py: Python<'_>, l: &ss::Layer) -> PyResult<Layer> {
    let m = &l.manifest;
    Ok(Layer {
        name: l.name.clone(),
        kind: m.kind.to_string(),
        parent: m.parent.as_ref().map(|p| p.name.clone()),
        created: utc(py, m.created_unix)?,
        ram_size: m.ram_size,
        page_size: m.page_size,
        diff_pages: m.diff_pages,
        disk_size: m.disk.as_ref().map(|d| d.size),
        content_sha256: l.content_sha256.clone(),
        path: l.dir.to_string_lossy().into_owned(),
        vcpus: m.vcpus,
        backend: m.backend.clone(),
        gic_mode: m.gic_mode.clone(),
    })
}

/// What a verification checked.
#[pyclass(frozen, get_all, module = "vmstore")]
struct VerifyReport {
    /// Layers checked.
    layers: usize,
    /// Files checked, manifests included.
    files: usize,
    /// Bytes hashed.
    bytes_hashed: u64,
    /// Files trusted from the verified-file cache (`cached=True`).
    files_cached: usize,
    /// Bytes in those files.
    bytes_cached: u64,
}

#[pymethods]
impl VerifyReport {
    fn __repr__(&self) -> String {
        format!(
            "VerifyReport(layers={}, files={}, bytes_hashed={})",
            self.layers, self.files, self.bytes_hashed
        )
    }
}

fn report(r: &ss::VerifyReport) -> VerifyReport {
    VerifyReport {
        layers: r.layers,
        files: r.files,
        bytes_hashed: r.bytes_hashed,
        files_cached: r.files_cached,
        bytes_cached: r.bytes_cached,
    }
}

/// A snapshot store directory.
#[pyclass(frozen, module = "vmstore")]
struct Store {
    inner: ss::Store,
}

#[pymethods]
impl Store {
    /// Opens the existing store at `path`.
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        ss::Store::open(path)
            .map(|inner| Store { inner })
            .map_err(|e| to_py(py, e))
    }

    /// Creates the store directory at `path` if needed and opens it.
    #[staticmethod]
    fn create(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        ss::Store::create(path)
            .map(|inner| Store { inner })
            .map_err(|e| to_py(py, e))
    }

    /// The store directory.
    #[getter]
    fn root(&self) -> String {
        self.inner.root().to_string_lossy().into_owned()
    }

    /// Every readable layer, in name order.
    fn list(&self, py: Python<'_>) -> PyResult<Vec<Layer>> {
        let names: Vec<String> = py
            .detach(|| self.inner.list())
            .map_err(|e| to_py(py, e))?
            .into_iter()
            .filter(|e| e.summary.is_ok())
            .map(|e| e.name)
            .collect();
        names.iter().map(|n| self.layer(py, n)).collect()
    }

    /// The layer `name`.
    fn layer(&self, py: Python<'_>, name: &str) -> PyResult<Layer> {
        let l = py
            .detach(|| self.inner.layer(name))
            .map_err(|e| to_py(py, e))?;
        layer(py, &l)
    }

    /// The chain `spec` (`NAME` or `NAME+N`) names, base first.
    fn resolve(&self, py: Python<'_>, spec: &str) -> PyResult<Vec<Layer>> {
        let c = py
            .detach(|| self.inner.resolve(spec))
            .map_err(|e| to_py(py, e))?;
        c.layers().iter().map(|l| layer(py, l)).collect()
    }

    /// Verifies the chain `spec`: every file's size and digest, headers
    /// and parent links. With `cached`, files the layers' verified-file
    /// caches vouch for are not hashed again. Raises `VerifyError` naming
    /// the file on damage.
    #[pyo3(signature = (spec, cached = false))]
    fn verify(&self, py: Python<'_>, spec: &str, cached: bool) -> PyResult<VerifyReport> {
        py.detach(|| {
            let chain = self.inner.resolve(spec)?;
            if cached {
                ss::verify_chain_cached(&chain)
            } else {
                ss::verify_chain(&chain)
            }
        })
        .map(|r| report(&r))
        .map_err(|e| to_py(py, e))
    }

    /// Verifies every layer (each file hashed once): a dict from name to
    /// `VerifyReport`, or to the `VerifyError`/`StoreError` it failed with.
    fn verify_all(&self, py: Python<'_>) -> PyResult<Vec<(String, Py<PyAny>)>> {
        let all = py
            .detach(|| self.inner.verify_all(None))
            .map_err(|e| to_py(py, e))?;
        all.into_iter()
            .map(|(name, r)| {
                let v = match r {
                    Ok(rep) => Py::new(py, report(&rep))?.into_any(),
                    Err(e) => to_py(py, e).into_value(py).into_any(),
                };
                Ok((name, v))
            })
            .collect()
    }

    /// Removes the layer `name` (with every layer built on it if
    /// `recursive`); returns the names removed.
    #[pyo3(signature = (name, recursive = false))]
    fn remove(&self, py: Python<'_>, name: &str, recursive: bool) -> PyResult<Vec<String>> {
        py.detach(|| self.inner.remove(name, recursive))
            .map_err(|e| to_py(py, e))
    }

    /// Removes work directories whose process is gone: returns
    /// `(removed, kept)`, lists of `(name, bytes)` and `(name, reason)`.
    #[allow(clippy::type_complexity)]
    fn gc(&self, py: Python<'_>) -> PyResult<(Vec<(String, u64)>, Vec<(String, String)>)> {
        let r = py.detach(|| self.inner.gc()).map_err(|e| to_py(py, e))?;
        Ok((r.removed, r.kept))
    }

    /// Materialises the chain `spec` into the new full layer `name`.
    fn squash(&self, py: Python<'_>, spec: &str, name: &str) -> PyResult<Layer> {
        let l = py
            .detach(|| self.inner.squash(spec, name, None))
            .map_err(|e| to_py(py, e))?;
        layer(py, &l)
    }

    /// Disk use per layer: a list of `(name, logical_bytes,
    /// physical_bytes, shared_bytes or None)` for the readable layers.
    #[allow(clippy::type_complexity)]
    fn du(&self, py: Python<'_>) -> PyResult<Vec<(String, u64, u64, Option<u64>)>> {
        let rows = py.detach(|| self.inner.du()).map_err(|e| to_py(py, e))?;
        Ok(rows
            .into_iter()
            .filter_map(|(n, u)| {
                u.ok()
                    .map(|u| (n, u.logical_bytes, u.physical_bytes, u.shared_bytes))
            })
            .collect())
    }

    /// Micro-benchmark of a restore's memory path: reads the chain
    /// `spec`'s base memory into `ram` (a writable buffer of exactly the
    /// layers' RAM size) and overlays its diffs. Returns `(seconds, pages
    /// overlaid)`. Verifies nothing: call `verify` first.
    fn overlay_into(&self, py: Python<'_>, spec: &str, ram: PyBuffer<u8>) -> PyResult<(f64, u64)> {
        if ram.readonly() || !ram.is_c_contiguous() {
            return Err(PyValueError::new_err(
                "ram must be a writable, contiguous buffer (a bytearray, say)",
            ));
        }
        let chain = py
            .detach(|| self.inner.resolve(spec))
            .map_err(|e| to_py(py, e))?;
        let size = chain.base().manifest.ram_size;
        if ram.len_bytes() as u64 != size {
            return Err(PyValueError::new_err(format!(
                "ram is {} bytes, the chain's RAM is {size}",
                ram.len_bytes()
            )));
        }
        let (ptr, len) = (ram.buf_ptr() as usize, ram.len_bytes());
        let r = py.detach(|| {
            // SAFETY: the buffer is writable, contiguous and `len` bytes
            // long, and `ram` (the PyBuffer) keeps it alive and its
            // address fixed until it is released after this call; nothing
            // else in this process writes it while the GIL is released
            // unless the caller shares it with another thread on purpose.
            let mem = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
            let t = Instant::now();
            let base = chain.base().memory_path();
            std::fs::File::open(&base)
                .and_then(|f| f.read_exact_at(mem, 0))
                .map_err(|e| Err(format!("{}: read: {e}", base.display())))?;
            let pages = ss::overlay_diffs(mem, &chain.layers()[1..]).map_err(Ok)?;
            Ok((t.elapsed().as_secs_f64(), pages))
        });
        // The error: the store's (Ok) or reading the base's (Err).
        r.map_err(|e: Result<ss::Error, String>| match e {
            Ok(e) => to_py(py, e),
            Err(msg) => StoreError::new_err(msg),
        })
    }
}

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
    let bytes = ram.to_vec(py)?;
    let (packed, secs) = py
        .detach(|| {
            let t = Instant::now();
            let prefix = ss::encode_diff_prefix(page_size, bytes.len() as u64, &pages)
                .map_err(|e| e.to_string())?;
            let mut out = Vec::with_capacity(prefix.len() + pages.len() * page_size as usize);
            out.extend_from_slice(&prefix);
            for &p in &pages {
                let at = (p * page_size) as usize;
                out.extend_from_slice(&bytes[at..at + page_size as usize]);
            }
            Ok::<_, String>((out, t.elapsed().as_secs_f64()))
        })
        .map_err(PyValueError::new_err)?;
    Ok((PyBytes::new(py, &packed), secs))
}

/// The native part of the `vmstore` package.
#[pymodule]
fn _vmstore(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Store>()?;
    m.add_class::<Layer>()?;
    m.add_class::<VerifyReport>()?;
    m.add_function(wrap_pyfunction!(pack_diff, m)?)?;
    m.add("StoreError", m.py().get_type::<StoreError>())?;
    m.add("VerifyError", m.py().get_type::<VerifyError>())?;
    m.add("MEMORY_CHUNK_SIZE", ss::MEMORY_CHUNK_SIZE)?;
    Ok(())
}
