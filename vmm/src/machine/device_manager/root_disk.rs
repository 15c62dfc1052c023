//! The VM's root disk file: the user's image, opened read-write, or for a
//! restored VM a private copy of the snapshot's image, made on a thread
//! while the VM starts (the block device waits for it on first use).

use crate::console;
use crate::devices::virtio::block::BackingFile;
use anyhow::Context;
use snapshot_store::{clone_file, Store};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The VM's disk image.
pub enum RootDisk {
    /// The user's image, open read-write (a fresh boot).
    Open {
        /// The open image.
        file: std::fs::File,
        /// Its path, which snapshots clone.
        path: PathBuf,
    },
    /// A restored VM's private copy of the snapshot's image, still being made.
    Copying(CopyingDisk),
}

/// The directory of a restored VM's working copy of its disk, a
/// `.tmp-run-PID-NONCE` directory of the store (removed on drop; `vmstore
/// gc` removes it if the process died). The store's own files are never
/// opened for writing.
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How long a failed restore waits for its working-disk copy to end.
const COPY_WAIT_ON_ERROR: Duration = Duration::from_secs(2);

/// A restored VM's working disk, `disk.img` in a new [`WorkDir`], being
/// copied from the snapshot on a background thread: the guest starts without
/// waiting for it, and its first disk request (or a snapshot) waits for the
/// copy ([`crate::devices::virtio::block::BackingFile::pending`]).
pub struct CopyingDisk {
    /// The working disk's path.
    pub path: PathBuf,
    /// Its length in bytes (the snapshot image's).
    pub len: u64,
    /// The work directory, removed when this is dropped.
    _dir: WorkDir,
    copy: Option<std::thread::JoinHandle<std::io::Result<std::fs::File>>>,
}

impl CopyingDisk {
    /// Starts copying the snapshot disk `src` (`len` bytes, as its manifest
    /// says; verification checks the file against that) into a new work
    /// directory of `store`. When done, the thread logs `Restore-disk-copy
    /// = N us (METHOD); ready M us after restore start` (from `t0`).
    pub fn start(store: &Store, src: PathBuf, len: u64, t0: Instant) -> anyhow::Result<Self> {
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let dir = store
            .root()
            .join(format!(".tmp-run-{}-{nonce:016x}", std::process::id()));
        std::fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let dir = WorkDir(dir);
        let path = dir.0.join("disk.img");
        let dst = path.clone();
        let copy = std::thread::Builder::new()
            .name("restore-disk".into())
            .spawn(move || {
                let t = Instant::now();
                let method = clone_file(&src, &dst).map_err(std::io::Error::other)?;
                let mut perms = std::fs::metadata(&dst)?.permissions();
                #[allow(clippy::permissions_set_readonly_false)]
                perms.set_readonly(false);
                std::fs::set_permissions(&dst, perms)?;
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&dst)?;
                console::message(&format!(
                    "Restore-disk-copy = {} us ({method}); ready {} us after restore start",
                    t.elapsed().as_micros(),
                    t0.elapsed().as_micros()
                ));
                Ok(file)
            })
            .context("cannot spawn the disk copy thread")?;
        Ok(Self {
            path,
            len,
            _dir: dir,
            copy: Some(copy),
        })
    }

    /// The copy's result, for the block device: a closure that waits for
    /// the thread.
    fn take_wait(&mut self) -> impl FnOnce() -> std::io::Result<std::fs::File> + Send + 'static {
        let copy = self.copy.take();
        move || match copy {
            Some(h) => h
                .join()
                .map_err(|_| std::io::Error::other("the disk copy thread panicked"))?,
            None => Err(std::io::Error::other("the disk copy was already taken")),
        }
    }
}

impl Drop for CopyingDisk {
    /// Only reached with the copy still owned, on an error path (the
    /// restore failed): waits up to [`COPY_WAIT_ON_ERROR`] for the copy to
    /// end, so that its directory is removed whole; a copy of a large image
    /// that is still running then is left to the exiting process, so the
    /// error is not delayed by it (its file is unlinked with the directory;
    /// `vmstore gc` removes anything left once this process has exited).
    fn drop(&mut self) {
        if let Some(h) = self.copy.take() {
            let t = Instant::now();
            while !h.is_finished() && t.elapsed() < COPY_WAIT_ON_ERROR {
                std::thread::sleep(Duration::from_millis(1));
            }
            if h.is_finished() {
                let _ = h.join();
            }
        }
    }
}

/// The root disk, ready for the block device.
pub struct OpenedRootDisk {
    /// The file (a restore's may still be being copied).
    pub file: BackingFile,
    /// Its length in bytes.
    pub len: u64,
    /// Its path, which snapshots clone.
    pub path: PathBuf,
    /// A restored VM's working copy: keep it for as long as the VM runs
    /// (dropping it removes its work directory).
    pub work: Option<CopyingDisk>,
}

impl RootDisk {
    /// The disk for the block device: its length read from the open image,
    /// or the working copy's, whose file the device waits for on first use.
    pub fn open(self) -> anyhow::Result<OpenedRootDisk> {
        Ok(match self {
            RootDisk::Open { file, path } => {
                let len = file
                    .metadata()
                    .with_context(|| format!("cannot use disk image {}", path.display()))?
                    .len();
                OpenedRootDisk {
                    file: BackingFile::ready(file),
                    len,
                    path,
                    work: None,
                }
            }
            RootDisk::Copying(mut copy) => OpenedRootDisk {
                file: BackingFile::pending(copy.take_wait()),
                len: copy.len,
                path: copy.path.clone(),
                work: Some(copy),
            },
        })
    }
}
