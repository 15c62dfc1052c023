//! Progress reports of long operations (hashing, squash), for progress
//! lines.

/// Files at least this large (bytes) report hashing progress.
pub(crate) const PROGRESS_MIN_BYTES: u64 = 64 << 20;
/// Interval between hashing progress reports (bytes).
pub(crate) const PROGRESS_STEP_BYTES: u64 = 256 << 20;

/// Progress of a long operation, for progress lines. Delivered to a
/// callback that may be called from several threads at once.
#[derive(Debug, Clone, Copy)]
pub enum Progress<'a> {
    /// `done` of `total` bytes of `path` have been hashed. Reported only for
    /// files of at least 64 MiB, every 256 MiB and at the end.
    Hashing {
        /// File being hashed.
        path: &'a std::path::Path,
        /// Bytes hashed so far.
        done: u64,
        /// File size in bytes.
        total: u64,
    },
    /// A stage of a multi-stage operation (squash) begins.
    Stage(&'a str),
}

/// A progress callback: `&|p: Progress| eprintln!(...)`.
pub type ProgressFn<'a> = &'a (dyn Fn(Progress<'_>) + Sync);
