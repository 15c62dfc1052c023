//! A layer as read from the store ([`Layer`]: its directory and checked
//! manifest), a resolved chain of layers ([`Chain`]) with the checks that
//! link a child to its parent, and the metadata of a layer about to be
//! written ([`LayerMeta`]).

use std::fs::File;
use std::io::Read;
use std::path::PathBuf;

use crate::error::{Error, IoContext, Result};
use crate::format::diff::diff_file_size;
use crate::format::manifest::{
    parse_manifest, DiskEntry, FileEntry, LayerKind, Manifest, ParentRef, MAX_MANIFEST_BYTES,
    ZERO_HASH,
};
use crate::format::state::STATE_HEADER_LEN;
use crate::format::{DISK_FILE, FORMAT_VERSION, MANIFEST_FILE, MEMORY_FILE, STATE_FILE};
use crate::fsutil::{is_not_found, open_regular, Links};
use crate::hash::{hex, sha256};
use crate::readers::read_state_file;
use crate::time::rfc3339;

/// One layer whose manifest has been read and checked (its other files have
/// not; see [`crate::verify_chain`]).
#[derive(Debug, Clone)]
pub struct Layer {
    /// Snapshot name (= directory name = `manifest.name`).
    pub name: String,
    /// The layer directory.
    pub dir: PathBuf,
    /// The parsed manifest.
    pub manifest: Manifest,
    /// Content hash: sha256 of the `manifest.json` bytes, lower-case hex.
    pub content_sha256: String,
}

impl Layer {
    /// Read and check `dir/manifest.json` of the layer `name` (bounded read).
    pub(crate) fn load(dir: PathBuf, name: &str) -> Result<Layer> {
        let path = dir.join(MANIFEST_FILE);
        let mut f = match open_regular(&path, Links::Refuse) {
            Ok(f) => f,
            Err(e) if is_not_found(&e) => return Err(Error::corrupt(&path, "missing")),
            Err(e) => return Err(e),
        };
        // Room for a typical manifest (about 1 KiB) up front: one read.
        let mut bytes = Vec::with_capacity(8192);
        (&mut f)
            .take(MAX_MANIFEST_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .ctx(&path, "read")?;
        let manifest = parse_manifest(&bytes).map_err(|e| Error::corrupt(&path, e.0))?;
        if manifest.name != name {
            return Err(Error::corrupt(
                &path,
                format!(
                    "describes snapshot '{}' but lives in directory '{name}'",
                    manifest.name
                ),
            ));
        }
        Ok(Layer {
            name: name.to_string(),
            dir,
            manifest,
            content_sha256: hex(&sha256(&bytes)),
        })
    }

    /// Opens the layer's file `file` (a name of
    /// [`crate::format::LAYER_FILES`]) for reading, checking through the
    /// descriptor that it is a regular file; never through a symbolic
    /// link, never waiting on a FIFO or a device. Errors:
    /// [`Error::Corrupt`] `PATH: not a regular file (a FIFO)` and the
    /// like, or the open's [`Error::Io`].
    pub fn open_file(&self, file: &str) -> Result<File> {
        open_regular(&self.dir.join(file), Links::Refuse)
    }

    /// Path of `manifest.json`.
    pub fn manifest_path(&self) -> PathBuf {
        self.dir.join(MANIFEST_FILE)
    }

    /// Path of `memory.bin`.
    pub fn memory_path(&self) -> PathBuf {
        self.dir.join(MEMORY_FILE)
    }

    /// Path of `state.bin`.
    pub fn state_path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// Path of `disk.img`, if the layer holds its whole disk image (not if
    /// it has no disk, nor if it stores a `disk.diff`: the disk of a chain
    /// is [`crate::ChainDisk`]). The store's copy is immutable: clone it
    /// ([`crate::clone_file`]) to get a writable disk.
    pub fn disk_path(&self) -> Option<PathBuf> {
        self.manifest
            .disk
            .as_ref()
            .filter(|d| d.diff_chunks.is_none())
            .map(|_| self.dir.join(DISK_FILE))
    }

    /// Full or diff.
    pub fn kind(&self) -> LayerKind {
        self.manifest.kind
    }

    /// The link a child of this layer records.
    pub fn parent_ref(&self) -> ParentRef {
        ParentRef {
            name: self.name.clone(),
            sha256: self.content_sha256.clone(),
        }
    }

    /// Metadata for a diff layer on top of this one: same geometry,
    /// backend and GIC mode, this layer as parent, and `creator`.
    pub fn child_meta(&self, creator: &str) -> LayerMeta {
        LayerMeta {
            parent: Some(self.parent_ref()),
            creator: creator.to_string(),
            ..LayerMeta::of_manifest(&self.manifest)
        }
    }

    /// The machine state payload written by the VMM, read with bounded
    /// reads and checked (envelope, length, payload digest, size in the
    /// manifest).
    pub fn read_state(&self) -> Result<Vec<u8>> {
        let path = self.state_path();
        let payload = read_state_file(&path)?;
        let size = (STATE_HEADER_LEN + payload.len()) as u64;
        if size != self.manifest.state.size {
            return Err(Error::corrupt(
                &path,
                format!(
                    "is {size} bytes, {} says {}",
                    MANIFEST_FILE, self.manifest.state.size
                ),
            ));
        }
        Ok(payload)
    }
}

/// A resolved chain of layers, base (full) first, each layer's parent
/// immediately before it. Links (names, content hashes) and geometry are
/// checked on construction; file contents are not (see
/// [`crate::verify_chain`]).
#[derive(Debug, Clone)]
pub struct Chain {
    layers: Vec<Layer>,
}

impl Chain {
    /// Build a chain from layers ordered base first, checking that the base
    /// is full, each other layer is a diff whose parent (name and content
    /// hash) is the layer before it, and that page size, RAM base and size,
    /// vCPU count, backend and GIC mode agree along the chain.
    pub fn new(layers: Vec<Layer>) -> Result<Chain> {
        let Some(base) = layers.first() else {
            return Err(Error::Usage("a chain needs at least one layer".into()));
        };
        if base.manifest.kind != LayerKind::Full {
            let p = base.manifest.parent.as_ref().map(|p| p.name.as_str());
            return Err(Error::Chain(format!(
                "'{}' is a diff layer, so it cannot be the base of a chain (its parent is '{}')",
                base.name,
                p.unwrap_or("?")
            )));
        }
        for w in layers.windows(2) {
            check_link(&w[0], &w[1])?;
        }
        Ok(Chain { layers })
    }

    /// The layers, base first.
    pub fn layers(&self) -> &[Layer] {
        &self.layers
    }

    /// The full layer at the bottom.
    pub fn base(&self) -> &Layer {
        &self.layers[0]
    }

    /// The layer that was asked for (the top of the chain).
    pub fn top(&self) -> &Layer {
        &self.layers[self.layers.len() - 1]
    }

    /// Number of layers (at least 1).
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Always `false`: a chain has a base.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// `golden -> d1 -> d2`.
    pub fn describe(&self) -> String {
        let names: Vec<&str> = self.layers.iter().map(|l| l.name.as_str()).collect();
        names.join(" -> ")
    }
}

/// Check that `child` is a diff on top of `parent`: name and content hash
/// link, same geometry, backend and GIC mode, and a disk stored as a diff
/// only over a parent's disk of the same size and chunk size.
pub(crate) fn check_link(parent: &Layer, child: &Layer) -> Result<()> {
    let Some(link) = &child.manifest.parent else {
        return Err(Error::Chain(format!(
            "'{}' is a full layer and cannot sit on top of '{}'",
            child.name, parent.name
        )));
    };
    if link.name != parent.name {
        return Err(Error::Chain(format!(
            "'{}' has parent '{}', not '{}'",
            child.name, link.name, parent.name
        )));
    }
    if link.sha256 != parent.content_sha256 {
        return Err(Error::ParentChanged {
            layer: child.name.clone(),
            parent: parent.name.clone(),
            expected: link.sha256.clone(),
            found: parent.content_sha256.clone(),
            manifest: parent.manifest_path(),
        });
    }
    check_same_machine(&parent.manifest, &child.manifest, &parent.name, &child.name)?;
    if let Some(d) = child
        .manifest
        .disk
        .as_ref()
        .filter(|d| d.diff_chunks.is_some())
    {
        let same = parent
            .manifest
            .disk
            .as_ref()
            .is_some_and(|p| p.size == d.size && p.chunk_size == d.chunk_size);
        if !same {
            return Err(Error::Chain(format!(
                "'{}' stores its disk as a diff of '{}', which has no disk of {} bytes in {}-byte chunks",
                child.name, parent.name, d.size, d.chunk_size
            )));
        }
    }
    Ok(())
}

/// Geometry, backend and GIC mode of `b` must equal those of `a`.
pub(crate) fn check_same_machine(a: &Manifest, b: &Manifest, an: &str, bn: &str) -> Result<()> {
    let fields: [(&str, String, String); 6] = [
        (
            "page_size",
            a.page_size.to_string(),
            b.page_size.to_string(),
        ),
        (
            "ram_base_gpa",
            format!("{:#x}", a.ram_base_gpa),
            format!("{:#x}", b.ram_base_gpa),
        ),
        ("ram_size", a.ram_size.to_string(), b.ram_size.to_string()),
        ("vcpus", a.vcpus.to_string(), b.vcpus.to_string()),
        ("backend", a.backend.clone(), b.backend.clone()),
        ("gic_mode", a.gic_mode.clone(), b.gic_mode.clone()),
    ];
    for (field, va, vb) in fields {
        if va != vb {
            return Err(Error::Chain(format!(
                "'{bn}' does not match its parent '{an}': {field} is {vb} in '{bn}' but {va} in '{an}'"
            )));
        }
    }
    Ok(())
}

/// What the VMM knows about the layer it is about to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerMeta {
    /// The parent layer ([`Layer::parent_ref`]): `Some` writes a diff
    /// layer, `None` a full one.
    pub parent: Option<ParentRef>,
    /// Page size in bytes (Ignition: 16384).
    pub page_size: u64,
    /// Guest-physical address of the start of RAM.
    pub ram_base_gpa: u64,
    /// Guest RAM size in bytes.
    pub ram_size: u64,
    /// Number of vCPUs.
    pub vcpus: u32,
    /// Backend name, e.g. `emu` or `hvf`.
    pub backend: String,
    /// GIC mode, e.g. `userspace` or `hvf`.
    pub gic_mode: String,
    /// Program and version writing the state, e.g. `ignition-vmm 0.1.0`.
    pub creator: String,
}

impl LayerMeta {
    /// The metadata a layer with manifest `m` was written with.
    pub(crate) fn of_manifest(m: &Manifest) -> LayerMeta {
        LayerMeta {
            parent: m.parent.clone(),
            page_size: m.page_size,
            ram_base_gpa: m.ram_base_gpa,
            ram_size: m.ram_size,
            vcpus: m.vcpus,
            backend: m.backend.clone(),
            gic_mode: m.gic_mode.clone(),
            creator: m.creator.clone(),
        }
    }

    /// Diff if there is a parent, full otherwise.
    fn kind(&self) -> LayerKind {
        if self.parent.is_some() {
            LayerKind::Diff
        } else {
            LayerKind::Full
        }
    }

    /// A manifest with this metadata and the given files; not sealed.
    pub(crate) fn manifest(
        &self,
        name: &str,
        memory: FileEntry,
        diff_pages: Option<u64>,
        state: FileEntry,
        disk: Option<DiskEntry>,
        created_unix: u64,
    ) -> Manifest {
        Manifest {
            format: FORMAT_VERSION,
            kind: self.kind(),
            name: name.to_string(),
            parent: self.parent.clone(),
            page_size: self.page_size,
            ram_base_gpa: self.ram_base_gpa,
            ram_size: self.ram_size,
            vcpus: self.vcpus,
            backend: self.backend.clone(),
            gic_mode: self.gic_mode.clone(),
            creator: self.creator.clone(),
            created_unix,
            created: rfc3339(created_unix),
            memory,
            diff_pages,
            state,
            disk,
            manifest_sha256: String::new(),
        }
    }

    /// Check the values by validating a manifest with placeholder files.
    pub(crate) fn validate(&self, name: &str) -> Result<()> {
        let zero = ZERO_HASH.to_string();
        let entry = |size| FileEntry {
            size,
            sha256: zero.clone(),
        };
        let (memory, pages) = match self.kind() {
            LayerKind::Full => (entry(self.ram_size), None),
            LayerKind::Diff => (
                entry(diff_file_size(self.page_size, 0).unwrap_or(0)),
                Some(0),
            ),
        };
        let mut m = self.manifest(name, memory, pages, entry(STATE_HEADER_LEN as u64), None, 0);
        m.manifest_sha256 = zero.clone();
        m.validate()
            .map_err(|e| Error::Usage(format!("invalid metadata for snapshot '{name}': {e}")))
    }
}
