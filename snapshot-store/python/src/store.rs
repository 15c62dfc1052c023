//! `vmstore.Store`: a store directory and what can be done with it.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Instant;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use snapshot_store as ss;

use crate::buf::{with_bytes, with_bytes_mut};
use crate::types::{to_py, GcReport, Layer, StoreError, Usage, VerifyReport};

/// What this module records as a layer's creator.
const CREATOR: &str = concat!("vmstore-python ", env!("CARGO_PKG_VERSION"));

/// A snapshot store directory.
#[pyclass(frozen, module = "vmstore")]
pub struct Store {
    inner: ss::Store,
}

impl Store {
    /// The Python view of the store's layer `l`, with its disk use.
    fn view(&self, py: Python<'_>, l: &ss::Layer) -> PyResult<Layer> {
        let u = py
            .detach(|| self.inner.usage(&l.name))
            .map_err(|e| to_py(py, e))?;
        Layer::new(py, l, &u)
    }

    /// Writes a layer from `meta` with `ram` (whole RAM) and, for a diff,
    /// `pages`; commits it and returns it.
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        py: Python<'_>,
        name: &str,
        meta: ss::LayerMeta,
        ram: &PyBuffer<u8>,
        pages: Option<Vec<u64>>,
        state: &PyBuffer<u8>,
        disk: Option<PathBuf>,
    ) -> PyResult<Layer> {
        let state = state.to_vec(py)?;
        let l = with_bytes(py, ram, |ram| {
            let mut w = self.inner.begin(name, meta)?;
            match pages {
                None => w.write_full_memory(ram)?,
                Some(p) => {
                    w.write_diff_from_ram(ram, p)?;
                }
            }
            w.write_state(&state)?;
            if let Some(d) = &disk {
                w.clone_disk(d, None)?;
            }
            w.commit()
        })?
        .map_err(|e| to_py(py, e))?;
        self.view(py, &l)
    }
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

    /// Creates the store directory at `path` (and its parents) if needed
    /// and opens it.
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

    /// Every readable layer, in name order (unreadable ones are left out;
    /// `vmstore list` shows them with their errors).
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
        self.view(py, &l)
    }

    /// The chain `spec` (`NAME` or `NAME+N`) names, base first.
    fn resolve(&self, py: Python<'_>, spec: &str) -> PyResult<Vec<Layer>> {
        let c = py
            .detach(|| self.inner.resolve(spec))
            .map_err(|e| to_py(py, e))?;
        c.layers().iter().map(|l| self.view(py, l)).collect()
    }

    /// Verifies the chain `spec`: every file's size and digest, headers
    /// and parent links. With `cached`, files the layers' verified-file
    /// caches vouch for are not hashed again. Raises `VerifyError` naming
    /// the file and the problem on damage.
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
        .map(|r| VerifyReport::from(&r))
        .map_err(|e| to_py(py, e))
    }

    /// Verifies every layer (each file hashed once): a dict from name to
    /// its `VerifyReport`, or to the `VerifyError`/`StoreError` it failed
    /// with (returned, not raised).
    fn verify_all(&self, py: Python<'_>) -> PyResult<BTreeMap<String, Py<PyAny>>> {
        let all = py
            .detach(|| self.inner.verify_all(None))
            .map_err(|e| to_py(py, e))?;
        all.into_iter()
            .map(|(name, r)| {
                let v = match r {
                    Ok(rep) => Py::new(py, VerifyReport::from(&rep))?.into_any(),
                    Err(e) => to_py(py, e).into_value(py).into_any(),
                };
                Ok((name, v))
            })
            .collect()
    }

    /// Removes the layer `name` (with every layer built on it if
    /// `recursive`); returns the names removed, deepest first.
    #[pyo3(signature = (name, recursive = false))]
    fn remove(&self, py: Python<'_>, name: &str, recursive: bool) -> PyResult<Vec<String>> {
        py.detach(|| self.inner.remove(name, recursive))
            .map_err(|e| to_py(py, e))
    }

    /// Removes work directories whose process is gone.
    fn gc(&self, py: Python<'_>) -> PyResult<GcReport> {
        py.detach(|| self.inner.gc())
            .map(GcReport::from)
            .map_err(|e| to_py(py, e))
    }

    /// Materialises the chain `spec` into the new full layer `name`
    /// (verified first).
    fn squash(&self, py: Python<'_>, spec: &str, name: &str) -> PyResult<Layer> {
        let l = py
            .detach(|| self.inner.squash(spec, name, None))
            .map_err(|e| to_py(py, e))?;
        self.view(py, &l)
    }

    /// Disk use of every readable layer, in name order.
    fn du(&self, py: Python<'_>) -> PyResult<Vec<Usage>> {
        let rows = py.detach(|| self.inner.du()).map_err(|e| to_py(py, e))?;
        Ok(rows
            .into_iter()
            .filter_map(|(n, u)| u.ok().map(|u| Usage::new(n, &u)))
            .collect())
    }

    /// Writes the full layer `name`: `ram` (all of guest RAM, a whole
    /// number of `page_size`-byte pages), the machine state `state` (opaque
    /// to the store, at most `MAX_STATE_BYTES`; `boot` restores only its
    /// own) and, if given, a copy of the disk image at `disk`.
    /// `ram_base_gpa`, `vcpus`, `backend` and `gic_mode` are recorded in
    /// the manifest.
    #[pyo3(signature = (name, ram, state, *, disk = None, page_size = 16384,
                        ram_base_gpa = 0, vcpus = 1, backend = "emu",
                        gic_mode = "userspace"))]
    #[allow(clippy::too_many_arguments)]
    fn write_full(
        &self,
        py: Python<'_>,
        name: &str,
        ram: PyBuffer<u8>,
        state: PyBuffer<u8>,
        disk: Option<PathBuf>,
        page_size: u64,
        ram_base_gpa: u64,
        vcpus: u32,
        backend: &str,
        gic_mode: &str,
    ) -> PyResult<Layer> {
        let meta = ss::LayerMeta {
            parent: None,
            page_size,
            ram_base_gpa,
            ram_size: ram.len_bytes() as u64,
            vcpus,
            backend: backend.to_string(),
            gic_mode: gic_mode.to_string(),
            creator: CREATOR.to_string(),
        };
        self.write(py, name, meta, &ram, None, &state, disk)
    }

    /// Writes the diff layer `name` on top of the layer `parent`: the
    /// pages numbered `pages` (strictly increasing) of `ram` (all of guest
    /// RAM, the parent's RAM size), the machine state `state` and, if
    /// given, a copy of the disk image at `disk`. Geometry, vCPUs, backend
    /// and GIC mode are the parent's.
    #[pyo3(signature = (name, parent, ram, pages, state, *, disk = None))]
    #[allow(clippy::too_many_arguments)]
    fn write_diff(
        &self,
        py: Python<'_>,
        name: &str,
        parent: &str,
        ram: PyBuffer<u8>,
        pages: Vec<u64>,
        state: PyBuffer<u8>,
        disk: Option<PathBuf>,
    ) -> PyResult<Layer> {
        let meta = py
            .detach(|| self.inner.layer(parent))
            .map_err(|e| to_py(py, e))?
            .child_meta(CREATOR);
        self.write(py, name, meta, &ram, Some(pages), &state, disk)
    }

    /// Micro-benchmark of a restore's memory path: reads the chain
    /// `spec`'s base memory into `ram` (a writable buffer of exactly the
    /// layers' RAM size) and overlays its diffs. Returns `(seconds, pages
    /// overlaid)`. Verifies nothing: call `verify` first.
    fn overlay_into(&self, py: Python<'_>, spec: &str, ram: PyBuffer<u8>) -> PyResult<(f64, u64)> {
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
        let r = with_bytes_mut(py, &ram, |mem| {
            let t = Instant::now();
            let base = chain.base();
            let path = base.memory_path();
            base.open_file(ss::format::MEMORY_FILE)
                .map_err(Ok)?
                .read_exact_at(mem, 0)
                .map_err(|e| Err(format!("{}: read: {e}", path.display())))?;
            let pages = ss::overlay_diffs(mem, &chain.layers()[1..]).map_err(Ok)?;
            Ok((t.elapsed().as_secs_f64(), pages))
        })?;
        // The error: the store's (Ok) or reading the base's (Err).
        r.map_err(|e: Result<ss::Error, String>| match e {
            Ok(e) => to_py(py, e),
            Err(msg) => StoreError::new_err(msg),
        })
    }
}
