//! Ignition's layered snapshot store.
//!
//! A store is a directory with one subdirectory per snapshot ("layer"):
//!
//! ```text
//! vmstore/
//!   golden/   manifest.json  memory.bin (full RAM)   state.bin  disk.img  disk.chunks  verified.json
//!   d1/       manifest.json  memory.bin (packed diff) state.bin  disk.img  disk.chunks  verified.json
//!   .tmp-d2-4242-1f0c.../    (a snapshot being written; never a layer)
//! ```
//!
//! A full layer holds all of guest RAM; a diff layer holds only the pages
//! dirtied since its parent, which it names and pins by content hash (the
//! sha256 of the parent's `manifest.json`, which in turn pins every file
//! of the parent, and so on down the chain). The byte-level format is in
//! `FORMAT.md`.
//!
//! At snapshot time the VMM calls [`Store::begin`], writes memory
//! ([`SnapshotWriter::write_full_memory`] or
//! [`SnapshotWriter::write_diff_memory`]), state
//! ([`SnapshotWriter::write_state`]) and the disk
//! ([`SnapshotWriter::clone_disk`], which re-hashes only the
//! [`DISK_CHUNK_SIZE`] chunks the guest wrote since the parent, or
//! [`SnapshotWriter::reuse_parent_disk`]), then [`SnapshotWriter::commit`], which
//! makes the layer durable and visible atomically. At restore time it calls
//! [`Store::resolve`], [`verify_chain_cached`], [`map_chain_memory`] (or
//! [`map_base_memory`] and [`overlay_diffs_mapped`] to time the stages) and
//! [`Layer::read_state`].
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
//! except the registry transfers of [`oci`], whose reports give durations.

// The modules in layers, bottom first, one group per layer. A module
// imports only from modules of the groups above its own, and names the
// module it imports from (never these re-exports); `tests/layering.rs`
// checks both and the size of each file.

// Leaves: errors, progress reports, time.
mod error;
mod progress;
mod time;

// File-system helpers (durability, holes).
mod fsutil;

// Hashing, snapshot names.
mod hash;
mod name;

// The layer files' codecs: what every file shares (names, format version,
// prelude), the packed diff, `state.bin`, `disk.chunks`, and
// `manifest.json`, which pins every other file of a layer.
mod format;

// Hashing files read from disk, the verified-file cache, file cloning.
mod cache;
mod clone;
mod file_hash;

// Bounded reads of a layer's files, checked against its manifest.
mod readers;

// A layer as read from the store, and a chain of layers.
mod layer;

// The store directory; a chain's memory mapped for restore.
mod restore;
mod store;

// Verifying and writing layers.
mod verify;
mod writer;

// Squash: verify, map and write.
mod squash;

// Importing a layer made elsewhere: verify, then commit as a snapshot.
mod import;

// Layers as OCI artifacts in a registry: push and pull.
#[cfg(feature = "registry")]
pub mod oci;

pub use clone::{clone_file, sparse_copy, CloneMethod};
pub use error::{Error, ParseError, Result};
pub use format::chunks::{
    check_chunk_geometry, disk_chunk_count, disk_chunks_file_size, disk_digest, encode_disk_chunks,
    parse_disk_chunks, parse_disk_chunks_header, DiskChunks, DiskChunksHeader,
    DISK_CHUNKS_HEADER_LEN, DISK_CHUNKS_MAGIC, DISK_CHUNK_SIZE, MAX_DISK_CHUNKS,
    MAX_DISK_CHUNK_SIZE, MIN_DISK_CHUNK_SIZE,
};
pub use format::diff::{
    diff_data_offset, diff_file_size, encode_diff_prefix, parse_diff_file, parse_diff_header,
    parse_diff_prefix, DiffHeader, DiffView, DIFF_HEADER_LEN, DIFF_MAGIC,
};
pub use format::manifest::{
    parse_manifest, DiskEntry, FileEntry, LayerKind, Manifest, ParentRef, MAX_CREATOR_LEN,
    MAX_MANIFEST_BYTES, MAX_TAG_LEN, MAX_VCPUS,
};
pub use format::memory::{memory_digest, MemoryDigest, MEMORY_CHUNK_SIZE};
pub use format::state::{
    encode_state_header, parse_state, parse_state_header, StateHeader, MAX_STATE_BYTES,
    STATE_HEADER_LEN, STATE_MAGIC,
};
pub use format::verified::{parse_verified, MAX_VERIFIED_BYTES, VERIFIED_FILE, VERIFIED_FORMAT};
pub use format::{
    FormatVersion, DISK_CHUNKS_FILE, DISK_FILE, FORMAT_VERSION, LAYER_FILES, MANIFEST_FILE,
    MAX_PAGE_SIZE, MAX_RAM_SIZE, MEMORY_FILE, MIN_PAGE_SIZE, STATE_FILE,
};
pub use hash::{hex, sha256, Sha256Digest};
pub use import::{listed_files, LayerImport};
pub use layer::{Chain, Layer, LayerMeta};
pub use name::{validate_name, Spec, MAX_NAME_LEN};
pub use progress::{Progress, ProgressFn, PROGRESS_MIN_BYTES, PROGRESS_STEP_BYTES};
pub use restore::{
    map_base_memory, map_chain_memory, overlay_diffs, overlay_diffs_mapped, MAX_LAZY_RUNS,
};
pub use store::{
    GcReport, LayerSummary, LayerUsage, ListEntry, Store, DEFAULT_STORE_DIR, MAX_CHAIN_DEPTH,
};
pub use time::rfc3339;
pub use verify::{
    verify_chain, verify_chain_cached, verify_chain_cached_with_progress,
    verify_chain_with_progress, FileCheck, HashSource, VerifyReport,
};
pub use writer::{CopyCounts, DiskClone, DiskCopy, MemoryFile, SnapshotWriter};
