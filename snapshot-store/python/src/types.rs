//! The value types the module returns: `Layer`, `Usage`, `VerifyReport`,
//! `GcReport`, and the exceptions.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use snapshot_store as ss;

create_exception!(
    vmstore,
    StoreError,
    PyException,
    "A store operation failed: the message names the file or snapshot and the problem."
);
create_exception!(
    vmstore,
    VerifyError,
    StoreError,
    "A verification found a missing, damaged or inconsistent file: `path` names it, `problem` says what is wrong."
);

/// The Python exception for a store error: `VerifyError` (with `path` and
/// `problem`) for a file that is missing, damaged or inconsistent with its
/// manifest, `StoreError` otherwise.
pub fn to_py(py: Python<'_>, e: ss::Error) -> PyErr {
    match &e {
        ss::Error::Corrupt { path, msg } => {
            let err = VerifyError::new_err(e.to_string());
            let v = err.value(py);
            if let Err(set) = v
                .setattr("path", path.to_string_lossy().into_owned())
                .and_then(|()| v.setattr("problem", msg.clone()))
            {
                return set;
            }
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

/// One snapshot layer, as its manifest and directory describe it. Sizes
/// are bytes.
#[pyclass(frozen, get_all, module = "vmstore")]
pub struct Layer {
    /// The snapshot's name.
    name: String,
    /// `"full"` or `"diff"`.
    kind: String,
    /// The parent's name (diffs), else `None`.
    parent: Option<String>,
    /// Creation time, a timezone-aware `datetime` (UTC).
    created: Py<PyAny>,
    /// Guest RAM, bytes.
    ram_size: u64,
    /// Page size, bytes.
    page_size: u64,
    /// Pages a diff holds (`None` for a full layer).
    diff_pages: Option<u64>,
    /// The disk image's size in bytes, if the VM had a disk.
    disk_size: Option<u64>,
    /// Sum of the layer files' sizes (`st_size`), bytes.
    logical_bytes: u64,
    /// Sum of their allocated blocks (`st_blocks * 512`), bytes; blocks
    /// shared with clones count in each layer.
    physical_bytes: u64,
    /// sha256 of `manifest.json` (hex): pins the layer and its ancestry.
    content_sha256: String,
    /// The layer directory.
    path: String,
    /// vCPUs the machine state was taken with.
    vcpus: u32,
    /// Backend that wrote the state (`"emu"`, `"hvf"`).
    backend: String,
    /// GIC mode of the state (`"userspace"`, `"hvf"`).
    gic_mode: String,
    /// Program and version that wrote the layer.
    creator: String,
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

impl Layer {
    /// The Python view of `l`, with the disk use `u` of its directory.
    pub fn new(py: Python<'_>, l: &ss::Layer, u: &ss::LayerUsage) -> PyResult<Layer> {
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
            logical_bytes: u.logical_bytes,
            physical_bytes: u.physical_bytes,
            content_sha256: l.content_sha256.clone(),
            path: l.dir.to_string_lossy().into_owned(),
            vcpus: m.vcpus,
            backend: m.backend.clone(),
            gic_mode: m.gic_mode.clone(),
            creator: m.creator.clone(),
        })
    }
}

/// The disk space one layer takes (`Store.du()`), bytes.
#[pyclass(frozen, get_all, module = "vmstore")]
pub struct Usage {
    /// The layer's name.
    name: String,
    /// Sum of its files' sizes (`st_size`).
    logical_bytes: u64,
    /// Sum of their allocated blocks (`st_blocks * 512`).
    physical_bytes: u64,
    /// Of those, bytes in extents shared with other files through clones
    /// (Linux FIEMAP), counted in every layer sharing them; `None` where
    /// the file system cannot tell (macOS).
    shared_bytes: Option<u64>,
}

#[pymethods]
impl Usage {
    fn __repr__(&self) -> String {
        format!(
            "Usage(name={:?}, logical_bytes={}, physical_bytes={}, shared_bytes={})",
            self.name,
            self.logical_bytes,
            self.physical_bytes,
            self.shared_bytes
                .map_or("None".to_string(), |b| b.to_string())
        )
    }
}

impl Usage {
    /// The Python view of the layer `name`'s usage `u`.
    pub fn new(name: String, u: &ss::LayerUsage) -> Usage {
        Usage {
            name,
            logical_bytes: u.logical_bytes,
            physical_bytes: u.physical_bytes,
            shared_bytes: u.shared_bytes,
        }
    }
}

/// What a verification checked.
#[pyclass(frozen, get_all, module = "vmstore")]
pub struct VerifyReport {
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
            "VerifyReport(layers={}, files={}, bytes_hashed={}, files_cached={})",
            self.layers, self.files, self.bytes_hashed, self.files_cached
        )
    }
}

impl From<&ss::VerifyReport> for VerifyReport {
    fn from(r: &ss::VerifyReport) -> Self {
        VerifyReport {
            layers: r.layers,
            files: r.files,
            bytes_hashed: r.bytes_hashed,
            files_cached: r.files_cached,
            bytes_cached: r.bytes_cached,
        }
    }
}

/// What `Store.gc()` did.
#[pyclass(frozen, get_all, module = "vmstore")]
pub struct GcReport {
    /// Work directories (and temporary cache files, as `LAYER/NAME`)
    /// removed, as `(name, bytes)` (allocated bytes freed).
    removed: Vec<(String, u64)>,
    /// Work directories left alone, as `(name, reason)`.
    kept: Vec<(String, String)>,
}

#[pymethods]
impl GcReport {
    fn __repr__(&self) -> String {
        format!("GcReport(removed={:?}, kept={:?})", self.removed, self.kept)
    }
}

impl From<ss::GcReport> for GcReport {
    fn from(r: ss::GcReport) -> Self {
        GcReport {
            removed: r.removed,
            kept: r.kept,
        }
    }
}
