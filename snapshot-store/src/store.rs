//! The store directory: its layers, chain resolution, listing, removal,
//! gc. Writing a layer is `writer`, verifying `verify`, squash `squash`.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};
use crate::format::manifest::LayerKind;
use crate::format::verified::VERIFIED_TMP_PREFIX;
use crate::fsutil::{file_kind, nonce, open_regular, pid_alive, shared_bytes, sync_dir, Links};
use crate::layer::{Chain, Layer};
use crate::name::{validate_name, Spec};

/// Default store directory, relative to the working directory.
pub const DEFAULT_STORE_DIR: &str = "vmstore";
/// Longest chain (layers, base included) that is resolved.
pub const MAX_CHAIN_DEPTH: usize = 1000;

pub(crate) const TMP_PREFIX: &str = ".tmp-";
pub(crate) const DEL_PREFIX: &str = ".del-";

/// A snapshot store rooted at a directory.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

/// One row of [`Store::list`].
#[derive(Debug)]
pub struct ListEntry {
    /// Directory (snapshot) name.
    pub name: String,
    /// The summary, or why the layer could not be read.
    pub summary: Result<LayerSummary>,
}

/// What `vmstore list` shows for a readable layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerSummary {
    /// Full or diff.
    pub kind: LayerKind,
    /// Parent name, for diffs.
    pub parent: Option<String>,
    /// Creation time, RFC 3339 UTC.
    pub created: String,
    /// Sum of `st_size` of the regular files in the layer directory (bytes).
    pub logical_bytes: u64,
    /// Sum of `st_blocks * 512` of those files (bytes). Blocks shared with
    /// clones are counted in each layer.
    pub physical_bytes: u64,
    /// Pages in a diff layer.
    pub pages: Option<u64>,
    /// Guest RAM size (bytes).
    pub ram_size: u64,
}

/// The disk space one layer takes ([`Store::du`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerUsage {
    /// Sum of `st_size` of the layer's files (bytes).
    pub logical_bytes: u64,
    /// Sum of their allocated blocks, `st_blocks * 512` (bytes).
    pub physical_bytes: u64,
    /// Of those, bytes in extents the file system reports as shared with
    /// another file (clones: a layer's disk image and its parent's, say),
    /// so counted again in every layer that shares them; `None` where the
    /// file system cannot tell (macOS, file systems without FIEMAP).
    pub shared_bytes: Option<u64>,
}

/// What [`Store::gc`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GcReport {
    /// Work directories (and temporary cache files, as `LAYER/NAME`)
    /// removed, with the bytes they occupied (`st_blocks * 512`).
    pub removed: Vec<(String, u64)>,
    /// Work directories (and temporary cache files) left alone, with the
    /// reason.
    pub kept: Vec<(String, String)>,
}

/// [`LayerUsage`] of the regular files directly in the layer directory
/// `dir`.
fn layer_usage(dir: &Path) -> Result<LayerUsage> {
    let mut u = LayerUsage {
        logical_bytes: 0,
        physical_bytes: 0,
        shared_bytes: Some(0),
    };
    for entry in std::fs::read_dir(dir).ctx(dir, "read directory")? {
        let entry = entry.ctx(dir, "read directory")?;
        let path = entry.path();
        let m = std::fs::symlink_metadata(&path).ctx(&path, "stat")?;
        if !m.is_file() {
            continue;
        }
        u.logical_bytes += m.len();
        u.physical_bytes += m.blocks() * 512;
        let f = open_regular(&path, Links::Refuse)?;
        u.shared_bytes = match (u.shared_bytes, shared_bytes(&f, &path)?) {
            (Some(a), Some(b)) => Some(a + b.min(m.blocks() * 512)),
            _ => None,
        };
    }
    Ok(u)
}

/// `(logical, physical)` bytes of the regular files directly in `dir`.
pub(crate) fn dir_usage(dir: &Path) -> Result<(u64, u64)> {
    let mut logical = 0;
    let mut physical = 0;
    for entry in std::fs::read_dir(dir).ctx(dir, "read directory")? {
        let entry = entry.ctx(dir, "read directory")?;
        let m = entry.metadata().ctx(entry.path(), "stat")?;
        if m.is_file() {
            logical += m.len();
            physical += m.blocks() * 512;
        } else if m.is_dir() {
            let (l, p) = dir_usage(&entry.path())?;
            logical += l;
            physical += p;
        }
    }
    Ok((logical, physical))
}

impl Store {
    /// Open an existing store directory.
    pub fn open(root: impl Into<PathBuf>) -> Result<Store> {
        let root = root.into();
        match std::fs::metadata(&root) {
            Ok(m) if m.is_dir() => Ok(Store { root }),
            Ok(m) => Err(Error::corrupt(
                &root,
                format!(
                    "not a directory (it is {}): a store is a directory",
                    file_kind(m.file_type())
                ),
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::io(
                &root,
                "open store",
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no such store directory (it is created by the first snapshot)",
                ),
            )),
            Err(e) => Err(Error::io(&root, "open store", e)),
        }
    }

    /// Open a store, creating the directory (and its parents) if needed.
    pub fn create(root: impl Into<PathBuf>) -> Result<Store> {
        let root = root.into();
        if let Err(e) = std::fs::create_dir_all(&root) {
            // Something that is not a directory is there: say what.
            return Err(match Store::open(&root) {
                Err(Error::Corrupt { path, msg }) => Error::Corrupt { path, msg },
                _ => Error::io(&root, "create store", e),
            });
        }
        Store::open(root)
    }

    /// The store directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Names of the layer directories, sorted. Entries that are not
    /// directories or whose names are not valid snapshot names (work
    /// directories `.tmp-*`, `.del-*`, stray files) are skipped.
    pub fn layer_names(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.root).ctx(&self.root, "read store")? {
            let entry = entry.ctx(&self.root, "read store")?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if validate_name(&name).is_err() {
                continue;
            }
            let ft = entry.file_type().ctx(entry.path(), "stat")?;
            if ft.is_dir() {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    /// `true` if a layer directory called `name` exists.
    pub fn contains(&self, name: &str) -> bool {
        validate_name(name).is_ok()
            && self
                .root
                .join(name)
                .symlink_metadata()
                .is_ok_and(|m| m.is_dir())
    }

    fn not_found(&self, name: &str) -> Error {
        Error::NotFound {
            name: name.to_string(),
            store: self.root.clone(),
            existing: self.layer_names().unwrap_or_default(),
        }
    }

    /// Load one layer's manifest (checked); not its parents or files.
    pub fn layer(&self, name: &str) -> Result<Layer> {
        validate_name(name)?;
        if !self.contains(name) {
            return Err(self.not_found(name));
        }
        Layer::load(self.root.join(name), name)
    }

    /// Every layer but `skip`, loaded. Fails if any layer's manifest cannot
    /// be read, because that layer might be a child of the one asked about.
    fn load_all(&self, skip: Option<&str>) -> Result<BTreeMap<String, Layer>> {
        let mut out = BTreeMap::new();
        for name in self.layer_names()? {
            if Some(name.as_str()) == skip {
                continue;
            }
            let layer = self.layer(&name).map_err(|e| Error::UnreadableLayer {
                layer: name.clone(),
                cause: Box::new(e),
            })?;
            out.insert(name, layer);
        }
        Ok(out)
    }

    /// Direct children of every layer in `layers` (`parent name -> child
    /// names`, sorted).
    fn children_map(layers: &BTreeMap<String, Layer>) -> BTreeMap<String, Vec<String>> {
        let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, layer) in layers {
            if let Some(p) = &layer.manifest.parent {
                map.entry(p.name.clone()).or_default().push(name.clone());
            }
        }
        map
    }

    /// Direct children of `name`, sorted.
    pub fn children(&self, name: &str) -> Result<Vec<String>> {
        Ok(Self::children_map(&self.load_all(Some(name))?)
            .remove(name)
            .unwrap_or_default())
    }

    /// Resolve a restore spec to a chain, base first.
    ///
    /// `NAME` is that layer with its whole ancestry; `NAME+N` is the layer
    /// `N` generations below `NAME`, following the only child at each step
    /// (`NAME+0` is `NAME`). If a layer on the way has several children or
    /// the chain ends early, the error lists what exists. Parent links are
    /// checked by name and content hash, and geometry, backend and GIC mode
    /// must agree along the chain; file contents are not read (call
    /// [`crate::verify_chain`] before running a guest).
    pub fn resolve(&self, spec: &str) -> Result<Chain> {
        let spec = Spec::parse(spec)?;
        let start = self.layer(&spec.name)?;
        // Layers already read while descending, reused for the ancestry.
        let mut loaded = BTreeMap::new();
        let target = if spec.descend == 0 {
            loaded.insert(start.name.clone(), start);
            spec.name.clone()
        } else {
            loaded = self.load_all(None)?;
            let children = Self::children_map(&loaded);
            let mut path = vec![start.name];
            for step in 0..spec.descend {
                let cur = &path[path.len() - 1];
                let kids = children.get(cur).map(Vec::as_slice).unwrap_or(&[]);
                match kids {
                    [] => {
                        return Err(Error::Descent {
                            spec: spec.to_string(),
                            why: format!(
                                "too short: only {step} layer(s) below '{}': {}",
                                spec.name,
                                path.join(" -> ")
                            ),
                        })
                    }
                    [only] => path.push(only.clone()),
                    many => {
                        return Err(Error::Descent {
                            spec: spec.to_string(),
                            why: format!(
                                "ambiguous: '{cur}' has {} children ({}); restore one of them by name{}",
                                many.len(),
                                many.join(", "),
                                if step == 0 {
                                    String::new()
                                } else {
                                    format!(" (path so far: {})", path.join(" -> "))
                                }
                            ),
                        })
                    }
                }
            }
            path.pop().unwrap_or_default()
        };
        self.ancestry(&target, loaded)
    }

    /// The chain ending at `name`, base first; layers in `loaded` are taken
    /// from there instead of being read again.
    fn ancestry(&self, name: &str, mut loaded: BTreeMap<String, Layer>) -> Result<Chain> {
        let top = match loaded.remove(name) {
            Some(l) => l,
            None => self.layer(name)?,
        };
        let mut layers = vec![top];
        loop {
            let cur = &layers[layers.len() - 1];
            let Some(link) = cur.manifest.parent.clone() else {
                break;
            };
            if layers.len() >= MAX_CHAIN_DEPTH {
                return Err(Error::Chain(format!(
                    "chain below '{name}' is deeper than {MAX_CHAIN_DEPTH} layers; squash it"
                )));
            }
            if layers.iter().any(|l| l.name == link.name) {
                return Err(Error::Chain(format!(
                    "parent links of '{name}' form a cycle through '{}'",
                    link.name
                )));
            }
            if !self.contains(&link.name) {
                return Err(Error::MissingParent {
                    layer: cur.name.clone(),
                    parent: link.name,
                    store: self.root.clone(),
                });
            }
            let parent = match loaded.remove(&link.name) {
                Some(l) => l,
                None => Layer::load(self.root.join(&link.name), &link.name)?,
            };
            layers.push(parent);
        }
        layers.reverse();
        Chain::new(layers)
    }

    /// Every layer with a summary or the error that prevents reading it.
    pub fn list(&self) -> Result<Vec<ListEntry>> {
        let mut out = Vec::new();
        for name in self.layer_names()? {
            let summary = self.layer(&name).and_then(|l| {
                let (logical_bytes, physical_bytes) = dir_usage(&l.dir)?;
                let m = l.manifest;
                Ok(LayerSummary {
                    kind: m.kind,
                    parent: m.parent.map(|p| p.name),
                    created: m.created,
                    logical_bytes,
                    physical_bytes,
                    pages: m.diff_pages,
                    ram_size: m.ram_size,
                })
            });
            out.push(ListEntry { name, summary });
        }
        Ok(out)
    }

    /// The disk space each layer takes, in name order: logical, allocated,
    /// and shared with other files where the file system can tell. A layer
    /// that cannot be read gives its error.
    pub fn du(&self) -> Result<Vec<(String, Result<LayerUsage>)>> {
        let mut out = Vec::new();
        for name in self.layer_names()? {
            let usage = self.usage(&name);
            out.push((name, usage));
        }
        Ok(out)
    }

    /// The disk space the layer `name` takes (one row of [`Store::du`]).
    /// Errors: the name is invalid or not in the store, its manifest is
    /// unreadable, or a file cannot be examined.
    pub fn usage(&self, name: &str) -> Result<LayerUsage> {
        self.layer(name).and_then(|l| layer_usage(&l.dir))
    }

    /// Remove the layer `name`. Refuses if other layers build on it, unless
    /// `recursive`, in which case its descendants go too (deepest first, so
    /// no layer is ever left without its parent). Each layer leaves the
    /// namespace atomically (renamed to a `.del-*` work directory, then
    /// deleted). Returns the names removed, in order. Works on layers whose
    /// own files are damaged; fails if another layer is unreadable, since
    /// that layer might be a child.
    pub fn remove(&self, name: &str, recursive: bool) -> Result<Vec<String>> {
        validate_name(name)?;
        if !self.contains(name) {
            return Err(self.not_found(name));
        }
        let children = Self::children_map(&self.load_all(Some(name))?);
        let direct = children.get(name).cloned().unwrap_or_default();
        if !direct.is_empty() && !recursive {
            return Err(Error::HasChildren {
                name: name.to_string(),
                children: direct,
            });
        }
        // Post-order walk: descendants before ancestors.
        let mut order = Vec::new();
        let mut stack = vec![(name.to_string(), false)];
        while let Some((n, expanded)) = stack.pop() {
            if expanded {
                order.push(n);
                continue;
            }
            if order.len() + stack.len() > MAX_CHAIN_DEPTH * 16 {
                return Err(Error::Chain(format!(
                    "too many descendants below '{name}' (or a cycle)"
                )));
            }
            stack.push((n.clone(), true));
            for c in children.get(&n).into_iter().flatten() {
                if !order.contains(c) {
                    stack.push((c.clone(), false));
                }
            }
        }
        for n in &order {
            self.remove_one(n)?;
        }
        Ok(order)
    }

    fn remove_one(&self, name: &str) -> Result<()> {
        let dir = self.root.join(name);
        let doomed = self.root.join(format!(
            "{DEL_PREFIX}{name}-{}-{:016x}",
            std::process::id(),
            nonce()
        ));
        std::fs::rename(&dir, &doomed).ctx(&dir, "rename for removal")?;
        sync_dir(&self.root)?;
        std::fs::remove_dir_all(&doomed).ctx(&doomed, "remove")?;
        Ok(())
    }

    /// Remove stale work directories (`.tmp-*` from interrupted snapshot
    /// writes, `.del-*` from interrupted removals) and, inside layers,
    /// temporary `.verified.json.tmp-*` files from interrupted cache
    /// updates, whose owning process is gone. Those of live processes,
    /// including this one, are kept.
    pub fn gc(&self) -> Result<GcReport> {
        let mut report = GcReport::default();
        let mut entries = Vec::new();
        for entry in std::fs::read_dir(&self.root).ctx(&self.root, "read store")? {
            let entry = entry.ctx(&self.root, "read store")?;
            if let Ok(n) = entry.file_name().into_string() {
                if n.starts_with(TMP_PREFIX) || n.starts_with(DEL_PREFIX) {
                    entries.push(n);
                }
            }
        }
        entries.sort();
        for n in entries {
            let path = self.root.join(&n);
            let pid = n
                .rsplit('-')
                .nth(1)
                .and_then(|p| p.parse::<i32>().ok())
                .filter(|&p| p > 0);
            let Some(pid) = pid else {
                report.kept.push((
                    n,
                    "name not in the .tmp-NAME-PID-NONCE form; left alone".into(),
                ));
                continue;
            };
            if pid_alive(pid) {
                report
                    .kept
                    .push((n, format!("process {pid} is still running")));
                continue;
            }
            let (_, bytes) = if path.is_dir() {
                dir_usage(&path).unwrap_or((0, 0))
            } else {
                (0, 0)
            };
            let r = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            r.ctx(&path, "remove")?;
            report.removed.push((n, bytes));
        }
        if !report.removed.is_empty() {
            sync_dir(&self.root)?;
        }
        for layer in self.layer_names()? {
            let dir = self.root.join(&layer);
            let mut stale = Vec::new();
            for entry in std::fs::read_dir(&dir).ctx(&dir, "read directory")? {
                let entry = entry.ctx(&dir, "read directory")?;
                let Ok(n) = entry.file_name().into_string() else {
                    continue;
                };
                let Some(rest) = n.strip_prefix(VERIFIED_TMP_PREFIX) else {
                    continue;
                };
                let pid = rest
                    .split('-')
                    .next()
                    .and_then(|p| p.parse::<i32>().ok())
                    .filter(|&p| p > 0);
                let shown = format!("{layer}/{n}");
                match pid {
                    Some(pid) if !pid_alive(pid) => stale.push((n, shown)),
                    Some(pid) => report
                        .kept
                        .push((shown, format!("process {pid} is still running"))),
                    None => report.kept.push((
                        shown,
                        "name not in the .verified.json.tmp-PID-NONCE form; left alone".into(),
                    )),
                }
            }
            if stale.is_empty() {
                continue;
            }
            for (n, shown) in stale {
                let path = dir.join(&n);
                let bytes = path.symlink_metadata().map_or(0, |m| m.blocks() * 512);
                std::fs::remove_file(&path).ctx(&path, "remove")?;
                report.removed.push((shown, bytes));
            }
            sync_dir(&dir)?;
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_missing_store_is_clear() {
        let d = tempfile::tempdir().unwrap();
        let e = Store::open(d.path().join("nope")).unwrap_err().to_string();
        assert!(e.contains("nope") && e.contains("no such store"), "{e}");
        let f = d.path().join("file");
        std::fs::write(&f, b"").unwrap();
        for e in [Store::open(&f).unwrap_err(), Store::create(&f).unwrap_err()] {
            let e = e.to_string();
            assert!(
                e.ends_with("file: not a directory (it is a regular file): a store is a directory"),
                "{e}"
            );
        }
        let s = Store::create(d.path().join("a/b")).unwrap();
        assert!(s.layer_names().unwrap().is_empty());
        let e = s.layer("x").unwrap_err().to_string();
        assert!(e.contains("'x' not found") && e.contains("empty"), "{e}");
    }
}
