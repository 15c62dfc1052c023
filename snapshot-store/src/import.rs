//! Importing a layer whose files were made elsewhere (a registry pull,
//! `crate::oci`): the files land in a work directory inside the store,
//! are checked with the store's own checks (manifest, parent link, sizes,
//! headers, every digest) and are committed exactly as a snapshot is
//! (FORMAT.md, "Writing": read-only files, fsync, no-replace rename, fsync
//! of the store). A crash at any point leaves only a work directory, which
//! `gc` removes.

use std::path::{Path, PathBuf};

use crate::cache::{until_settled, Clock, Stamp, SystemClock};
use crate::error::{Error, IoContext, Result};
use crate::format::{DISK_CHUNKS_FILE, DISK_FILE, MANIFEST_FILE, MEMORY_FILE, STATE_FILE};
use crate::fsutil::{set_readonly, sync_file};
use crate::layer::{Chain, Layer, LayerMeta};
use crate::manifest::Manifest;
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

/// The files a layer with manifest `m` holds, `manifest.json` first.
pub fn listed_files(m: &Manifest) -> Vec<&'static str> {
    let mut files = vec![MANIFEST_FILE, MEMORY_FILE, STATE_FILE];
    if m.disk.is_some() {
        files.extend([DISK_FILE, DISK_CHUNKS_FILE]);
    }
    files
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
                    format!("not a file of layer '{}' ({MANIFEST_FILE} lists {})", self.name, files.join(", ")),
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
