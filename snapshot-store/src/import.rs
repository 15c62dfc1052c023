//! Importing a layer whose files were made elsewhere (a registry pull,
//! `crate::oci`): the files land in a work directory inside the store,
//! are checked with the store's own checks (manifest, parent link, sizes,
//! headers, every digest) and are committed exactly as a snapshot is
//! (FORMAT.md, "Writing": read-only files, fsync, no-replace rename, fsync
//! of the store). A crash at any point leaves only a work directory, which
//! `gc` removes.

use std::path::{Path, PathBuf};

use crate::cache::{until_settled, Clock, SystemClock};
use crate::error::{Error, IoContext, Result};
use crate::format::manifest::listed_files;
use crate::format::verified::Stamp;
use crate::format::MANIFEST_FILE;
use crate::fsutil::{set_readonly, sync_file};
use crate::layer::{Chain, Layer, LayerMeta};
use crate::name::validate_name;
use crate::progress::ProgressFn;
use crate::store::Store;
use crate::verify::{verify_top_layer, VerifyReport};
use crate::writer::{create_work_dir, publish};

/// Longest wait, in nanoseconds, for the imported files' change times to
/// settle before they are verified, so that the verification can record
/// them in `verified.json` and the first restore need not hash them again.
/// (On a file system with coarse timestamps the window is longer: the
/// files are then simply hashed again by the first restore.)
const SETTLE_WAIT_MAX_NS: i128 = 100_000_000;

/// A layer being imported into a work directory `.tmp-NAME-PID-NONCE` of
/// the store. The caller writes `manifest.json` and the files it lists
/// into [`LayerImport::work_dir`], then calls [`LayerImport::commit`].
/// Dropping it uncommitted removes the work directory.
#[derive(Debug)]
pub struct LayerImport {
    root: PathBuf,
    name: String,
    tmp: PathBuf,
    finished: bool,
}

impl Store {
    /// Start importing the layer `name`: refuses an invalid name or one
    /// that is taken, and creates the work directory.
    pub fn begin_import(&self, name: &str) -> Result<LayerImport> {
        validate_name(name)?;
        if self.root().join(name).symlink_metadata().is_ok() {
            return Err(Error::Exists {
                name: name.to_string(),
                store: self.root().to_path_buf(),
            });
        }
        let tmp = create_work_dir(self.root(), name)?;
        Ok(LayerImport {
            root: self.root().to_path_buf(),
            name: name.to_string(),
            tmp,
            finished: false,
        })
    }
}

impl LayerImport {
    /// The snapshot name being imported.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The work directory the layer's files go into.
    pub fn work_dir(&self) -> &Path {
        &self.tmp
    }

    /// Check and commit the layer. Its `manifest.json` must pass the
    /// store's checks and have the content hash `expect_content_sha256`
    /// (lower-case hex); the work directory must hold exactly the files it
    /// lists; its parent, if any, must be in the store with the content
    /// hash it records, on the same machine; and every file must pass
    /// [`crate::verify_chain`]'s checks (sizes, headers, every digest).
    /// Then the files are made read-only and fsynced, and the directory is
    /// renamed into place as [`crate::SnapshotWriter::commit`] does. On any
    /// error nothing is committed and the work directory is removed.
    pub fn commit(
        mut self,
        expect_content_sha256: &str,
        progress: Option<ProgressFn<'_>>,
    ) -> Result<(Layer, VerifyReport)> {
        let layer = Layer::load(self.tmp.clone(), &self.name)?;
        let mpath = layer.manifest_path();
        if layer.content_sha256 != expect_content_sha256 {
            return Err(Error::corrupt(
                &mpath,
                format!(
                    "content hash is {}, expected {expect_content_sha256}",
                    layer.content_sha256
                ),
            ));
        }
        let files = listed_files(&layer.manifest);
        for entry in std::fs::read_dir(&self.tmp).ctx(&self.tmp, "read directory")? {
            let entry = entry.ctx(&self.tmp, "read directory")?;
            let n = entry.file_name();
            if !files.iter().any(|f| n == *f) {
                return Err(Error::corrupt(
                    entry.path(),
                    format!(
                        "not a file of layer '{}' ({MANIFEST_FILE} lists {})",
                        self.name,
                        files.join(", ")
                    ),
                ));
            }
        }
        let mut newest: Option<Stamp> = None;
        for f in &files {
            let p = self.tmp.join(f);
            if p.symlink_metadata().is_err() {
                return Err(Error::corrupt(&p, "missing"));
            }
            set_readonly(&p)?;
            sync_file(&p)?;
            let s = Stamp::of(&std::fs::symlink_metadata(&p).ctx(&p, "stat")?);
            if newest.is_none_or(|n| s.ctime_ns > n.ctime_ns) {
                newest = Some(s);
            }
        }
        let store = Store::open(&self.root)?;
        let mut layers = match &layer.manifest.parent {
            None => Vec::new(),
            Some(p) => store.resolve(&p.name)?.layers().to_vec(),
        };
        let meta = LayerMeta::of_manifest(&layer.manifest);
        layers.push(layer);
        let chain = Chain::new(layers)?;
        if let Some(s) = newest {
            let wait = until_settled(&s, SystemClock.now_ns());
            if wait <= SETTLE_WAIT_MAX_NS {
                std::thread::sleep(std::time::Duration::from_nanos(wait as u64));
            }
        }
        let report = verify_top_layer(&chain, progress)?;
        let dir = publish(&self.root, &self.tmp, &self.name, &meta, &mut self.finished)?;
        let mut layer = chain.top().clone();
        layer.dir = dir;
        Ok((layer, report))
    }
}

impl Drop for LayerImport {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if let Err(e) = std::fs::remove_dir_all(&self.tmp) {
            tracing::warn!(
                "import of '{}': could not remove work directory {}: {e} (vmstore gc removes it later)",
                self.name,
                self.tmp.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::MEMORY_FILE;
    use crate::hash::{hex, sha256};

    fn meta(parent: Option<&Layer>) -> LayerMeta {
        match parent {
            Some(p) => p.child_meta("test"),
            None => LayerMeta {
                parent: None,
                page_size: 4096,
                ram_base_gpa: 0x4000_0000,
                ram_size: 8 * 4096,
                vcpus: 1,
                backend: "emu".into(),
                gic_mode: "userspace".into(),
                creator: "test".into(),
            },
        }
    }

    /// A source store with `g` (full) and `d` (diff on g).
    fn source() -> (tempfile::TempDir, Store) {
        let d = tempfile::tempdir().unwrap();
        let s = Store::create(d.path().join("src")).unwrap();
        let mut w = s.begin("g", meta(None)).unwrap();
        let mut ram = vec![0u8; 8 * 4096];
        ram[4096..8192].fill(7);
        w.write_full_memory(&ram).unwrap();
        w.write_state(b"state g").unwrap();
        let g = w.commit().unwrap();
        let mut w = s.begin("d", meta(Some(&g))).unwrap();
        w.write_diff_memory([(3u64, &[9u8; 4096][..])]).unwrap();
        w.write_state(b"state d").unwrap();
        w.commit().unwrap();
        (d, s)
    }

    /// Copy layer `name` of `src` into an import into `dst`.
    fn copy_in(src: &Store, dst: &Store, name: &str) -> (LayerImport, String) {
        let layer = src.layer(name).unwrap();
        let imp = dst.begin_import(name).unwrap();
        for f in listed_files(&layer.manifest) {
            std::fs::copy(layer.dir.join(f), imp.work_dir().join(f)).unwrap();
            let p = imp.work_dir().join(f);
            let mut perm = std::fs::metadata(&p).unwrap().permissions();
            #[allow(clippy::permissions_set_readonly_false)]
            perm.set_readonly(false);
            std::fs::set_permissions(&p, perm).unwrap();
        }
        (imp, layer.content_sha256)
    }

    fn work_dirs(s: &Store) -> Vec<String> {
        std::fs::read_dir(s.root())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(".tmp-"))
            .collect()
    }

    #[test]
    fn an_imported_chain_is_committed_and_verifies() {
        let (d, src) = source();
        let dst = Store::create(d.path().join("dst")).unwrap();
        let (imp, h) = copy_in(&src, &dst, "g");
        let (g, rep) = imp.commit(&h, None).unwrap();
        assert_eq!(
            (g.name.as_str(), g.dir.clone()),
            ("g", dst.root().join("g"))
        );
        assert_eq!(rep.layers, 1);
        let (imp, h) = copy_in(&src, &dst, "d");
        imp.commit(&h, None).unwrap();
        let chain = dst.resolve("d").unwrap();
        crate::verify::verify_chain(&chain).unwrap();
        assert!(work_dirs(&dst).is_empty());
        // Committed files are read-only, as a snapshot's.
        let m = std::fs::metadata(dst.root().join("d/memory.bin")).unwrap();
        assert!(m.permissions().readonly());
        // The same name again is refused up front.
        assert!(matches!(dst.begin_import("g"), Err(Error::Exists { .. })));
    }

    #[test]
    fn a_damaged_import_is_refused_and_nothing_is_committed() {
        let (d, src) = source();
        let dst = Store::create(d.path().join("dst")).unwrap();
        let (imp, h) = copy_in(&src, &dst, "g");
        let mem = imp.work_dir().join(MEMORY_FILE);
        let mut b = std::fs::read(&mem).unwrap();
        b[4096] ^= 1;
        std::fs::write(&mem, b).unwrap();
        let e = imp.commit(&h, None).unwrap_err().to_string();
        assert!(
            e.contains("memory.bin") && e.contains("sha256 mismatch"),
            "{e}"
        );
        assert!(!dst.contains("g") && work_dirs(&dst).is_empty());

        // Another content hash than expected.
        let (imp, _) = copy_in(&src, &dst, "g");
        let e = imp
            .commit(&hex(&sha256(b"other")), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("content hash"), "{e}");
        assert!(!dst.contains("g"));

        // A file the manifest does not list.
        let (imp, h) = copy_in(&src, &dst, "g");
        std::fs::write(imp.work_dir().join("extra"), b"x").unwrap();
        let e = imp.commit(&h, None).unwrap_err().to_string();
        assert!(
            e.contains("extra") && e.contains("not a file of layer"),
            "{e}"
        );

        // A diff whose parent is not in the store.
        let (imp, h) = copy_in(&src, &dst, "d");
        let e = imp.commit(&h, None).unwrap_err().to_string();
        assert!(e.contains("'g' not found"), "{e}");
        assert!(dst.layer_names().unwrap().is_empty() && work_dirs(&dst).is_empty());
    }
}
