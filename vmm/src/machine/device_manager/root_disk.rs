//! The VM's root disk: the user's image, opened read-write, or for a
//! restored VM an overlay on its snapshot's disk ([`DiskOverlay`]): the
//! guest reads the chain's layers until it first writes a chunk, which is
//! then copied up into a private overlay file. Nothing is copied when the
//! VM starts, on any file system.

use crate::console;
use crate::devices::virtio::block::BlockDisk;
use anyhow::Context;
use snapshot_store::{Chain, ChainDisk, DiskImage, DiskOverlay, DiskSource, Store};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// The VM's disk.
pub enum RootDisk {
    /// The user's image, open read-write (a fresh boot).
    Open {
        /// The open image.
        file: std::fs::File,
        /// Its path, which snapshots read (and clone where they can).
        path: PathBuf,
    },
    /// A restored VM's overlay on its snapshot's disk.
    Overlay(OverlayDisk),
}

/// The directory of a restored VM's overlay file, a `.tmp-run-PID-NONCE`
/// directory of the store (removed on drop; `vmstore gc` removes it if the
/// process died). The store's own files are never opened for writing.
pub struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A restored VM's disk: the chain's disk, and the overlay file
/// (`disk.overlay` in a new [`WorkDir`]) that holds what the guest writes.
pub struct OverlayDisk {
    overlay: Arc<DiskOverlay>,
    dir: WorkDir,
}

/// The overlay file's name in its work directory.
const OVERLAY_FILE: &str = "disk.overlay";

impl OverlayDisk {
    /// Opens the disk of `chain` (its top layer's; errors if it has none)
    /// and creates its overlay in a new work directory of `store`. Logs
    /// `Restore-disk = N us (overlay on K layers)`.
    pub fn create(store: &Store, chain: &Chain) -> anyhow::Result<Self> {
        let t = Instant::now();
        let Some(base) = ChainDisk::open(chain)? else {
            anyhow::bail!("snapshot '{}' has no disk image", chain.top().name);
        };
        let layers = base.layers().len();
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let dir = store
            .root()
            .join(format!(".tmp-run-{}-{nonce:016x}", std::process::id()));
        std::fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let dir = WorkDir(dir);
        let overlay = DiskOverlay::create(base, &dir.0.join(OVERLAY_FILE))?;
        console::message(&format!(
            "Restore-disk = {} us (overlay on {layers} layer{})",
            t.elapsed().as_micros(),
            if layers == 1 { "" } else { "s" }
        ));
        Ok(OverlayDisk {
            overlay: Arc::new(overlay),
            dir,
        })
    }
}

/// The root disk, ready for the block device and for snapshots.
pub struct OpenedRootDisk {
    /// What the block device reads and writes.
    pub disk: BlockDisk,
    /// Its length in bytes.
    pub len: u64,
    /// What snapshots read the disk through: the image (opened again,
    /// read-only) or the overlay.
    pub source: Arc<dyn DiskSource>,
    /// A restored VM's work directory: keep it for as long as the VM runs
    /// (dropping it removes the overlay file).
    pub work: Option<WorkDir>,
}

impl RootDisk {
    /// The disk for the block device, and its source for snapshots.
    pub fn open(self) -> anyhow::Result<OpenedRootDisk> {
        Ok(match self {
            RootDisk::Open { file, path } => {
                let image = DiskImage::open(&path)
                    .with_context(|| format!("cannot use disk image {}", path.display()))?;
                OpenedRootDisk {
                    len: image.size(),
                    disk: BlockDisk::File(Arc::new(file)),
                    source: Arc::new(image),
                    work: None,
                }
            }
            RootDisk::Overlay(o) => OpenedRootDisk {
                len: o.overlay.size(),
                disk: BlockDisk::Overlay(o.overlay.clone()),
                source: o.overlay,
                work: Some(o.dir),
            },
        })
    }
}
