//! Ignition's layered snapshot store.
//!
//! A store is a directory with one subdirectory per snapshot ("layer"):
//!
//! ```text
//! vmstore/
//!   golden/   manifest.json  memory.bin (full RAM)   state.bin  disk.img  disk.chunks  verified.json
//!   d1/       manifest.json  memory.bin (packed diff) state.bin  disk.diff disk.chunks  verified.json
//!   .tmp-d2-4242-1f0c.../    (a snapshot being written; never a layer)
//! ```
//!
//! A full layer holds all of guest RAM and the whole disk image; a diff
//! layer holds only the pages dirtied and the disk chunks written since its
//! parent, which it names and pins by content hash (the
//! sha256 of the parent's `manifest.json`, which in turn pins every file
//! of the parent, and so on down the chain). The byte-level format is in
//! `FORMAT.md`.
//!
//! # The crate
//!
//! The top level is the store as its users (the VMM, `vmstore`, the Python
//! module) see it: [`Store`] and its reports, [`Layer`] and [`Chain`],
//! [`SnapshotWriter`] and [`LayerImport`], verification, restore mapping,
//! [`clone_file`], [`Error`]. [`format`](mod@format) has the codec of each
//! layer file with its constants, one module per file (`format::diff`,
//! `format::state`, `format::chunks`, `format::manifest`,
//! `format::verified`, and `format::memory`, the memory digest), for
//! tools and fuzzing; a user of the store needs them only to read a
//! [`Layer`]'s manifest. `oci` moves chains to and from OCI registries
//! (the `registry` feature).
//!
//! # Writing a layer
//!
//! [`Store::begin`] checks the name and the parent and returns a
//! [`SnapshotWriter`] on a work directory inside the store. Memory, state
//! and disk are each written once, in any order; then a commit makes the
//! layer durable and visible atomically, or dropping the writer removes
//! the work directory. The VMM, with every vCPU parked:
//!
//! 1. begins the disk, for a diff [`SnapshotWriter::begin_disk_diff`] (the
//!    chunks written since the parent), for a full layer
//!    [`SnapshotWriter::begin_disk_from`] (a clone of the VM's image where
//!    the file system makes one); what is not cloned is a [`DiskCopy`] made
//!    while the guest runs, the block device calling
//!    [`DiskCopy::before_write`] before each write; a diff whose disk the
//!    guest has not written since its parent skips this;
//! 2. writes memory: [`SnapshotWriter::write_diff_from_ram`] (the pages
//!    dirtied since the parent) or [`SnapshotWriter::write_full_memory`];
//!    or, for a background snapshot that lets the guest run on, creates
//!    the file with [`SnapshotWriter::memory_file`], fills it out of order
//!    (each page saved before the guest may change it) and hands it back
//!    to [`SnapshotWriter::finish_memory_file`];
//! 3. writes its machine state, [`SnapshotWriter::write_state`];
//! 4. completes the disk, [`SnapshotWriter::complete_disk`] (the copy
//!    finished, and on a background thread the [`DISK_CHUNK_SIZE`] chunks
//!    written since the parent hashed, the others' digests taken from the
//!    parent's `disk.chunks`), or [`SnapshotWriter::reuse_parent_disk`]
//!    (an empty disk diff and the parent's digests, nothing hashed);
//! 5. commits with [`SnapshotWriter::commit_cache_later`]: the layer is
//!    durable and visible on return, and the returned thread records the
//!    files in `verified.json` once their timestamps have settled.
//!
//! [`SnapshotWriter::commit`] waits for the timestamps instead (up to
//! 50 ms), and [`SnapshotWriter::clone_disk`] is `begin_disk` and
//! `complete_disk` in one call (squash and the Python module use both);
//! [`SnapshotWriter::write_diff_memory`] takes a diff's pages from
//! anywhere rather than from a RAM image.
//!
//! # Restoring
//!
//! The VMM calls [`Store::resolve`] (a `NAME` or `NAME+N` spec to a
//! [`Chain`], parent links and geometry checked), [`verify_chain_cached`]
//! (sizes, headers and digests of every file), [`map_base_memory`] and
//! [`overlay_diffs_mapped`] (or [`map_chain_memory`], both at once),
//! [`Layer::read_state`], and [`ChainDisk::open`] for the chain's disk
//! (the newest whole image and the disk diffs above it), under a
//! [`DiskOverlay`]: the VM's writes go to a private overlay file, a chunk
//! copied up on its first write, so nothing is copied to start it. Both,
//! and a plain image ([`DiskImage`]), are [`DiskSource`]s a snapshot
//! reads.
//!
//! [`verify_chain_cached`] re-hashes only files that changed since they
//! were last verified or written, per each layer's `verified.json` (file
//! identity and change times; see `FORMAT.md`), so that restore-time
//! verification does not grow with guest RAM; [`verify_chain`] always
//! hashes everything.
//!
//! Everything read from a store is untrusted: reads are bounded, lengths and
//! offsets checked, versions compared, and every error names the file.
//! Nothing here measures time (callers time the stages they care about),
//! except the registry transfers of `oci`, whose reports give durations.

// The modules in layers, bottom first, one group per layer. A module
// imports only from modules of the groups above its own, and names the
// module it imports from (never these re-exports); `format`, `writer` and
// `oci` declare their submodules the same way. `tests/layering.rs` checks
// all of it, and the sizes of files and functions.

// Leaves: errors, progress reports, time.
mod error;
mod progress;
mod time;

// File-system helpers (durability, holes).
mod fsutil;

// Hashing, snapshot names.
mod hash;
mod name;

// The layer files' codecs, one module per file, each beside its constants.
pub mod format;

// Hashing files read from disk, the verified-file cache, file cloning.
mod cache;
mod clone;
mod file_hash;

// Bounded reads of a layer's binary files, checked against its manifest; a
// disk as a snapshot reads it.
mod disk_source;
mod readers;

// A layer as read from the store, and a chain of layers.
mod layer;

// The store directory; a chain's memory mapped and its disk opened for
// restore.
mod chain_disk;
mod restore;
mod store;

// Verifying and writing layers; a restored VM's disk overlay.
mod overlay;
mod verify;
mod writer;

// Squash: verify, map and write.
mod squash;

// Importing a layer made elsewhere: verify, then commit as a snapshot.
mod import;

// Layers as OCI artifacts in a registry: push and pull.
#[cfg(feature = "registry")]
pub mod oci;

pub use chain_disk::ChainDisk;
pub use clone::{clone_file, CloneMethod};
pub use disk_source::{DiskImage, DiskSource};
pub use error::{Error, Result};
pub use format::chunks::DISK_CHUNK_SIZE;
pub use fsutil::file_kind;
pub use hash::{hex, sha256, Sha256Digest};
pub use import::LayerImport;
pub use layer::{Chain, Layer, LayerMeta};
pub use name::{validate_name, Spec, MAX_NAME_LEN};
pub use overlay::DiskOverlay;
pub use progress::{Progress, ProgressFn};
pub use restore::{
    map_base_memory, map_chain_memory, overlay_diffs, overlay_diffs_mapped, MAX_LAZY_RUNS,
};
#[cfg(target_os = "linux")]
pub use restore::{map_chain_memory_at, FixedMapping};
pub use store::{
    GcReport, LayerSummary, LayerUsage, ListEntry, Store, DEFAULT_STORE_DIR, MAX_CHAIN_DEPTH,
};
pub use verify::{
    verify_chain, verify_chain_cached, verify_chain_cached_with_progress,
    verify_chain_with_progress, FileCheck, HashSource, VerifyReport,
};
pub use writer::{DiskClone, DiskCopy, DiskMethod, MemoryFile, SnapshotWriter};
