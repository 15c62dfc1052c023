//! Error types.

use std::path::{Path, PathBuf};

/// A parser rejected its input. Carries no path: the reader that called the
/// parser wraps it into [`Error::Corrupt`] naming the file.
///
/// Message: what is wrong, e.g. `bad magic: not a state file`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub String);

impl ParseError {
    pub(crate) fn new(msg: impl Into<String>) -> Self {
        ParseError(msg.into())
    }
}

/// Everything that can go wrong in the store, one variant per kind of
/// failure so that callers can tell them apart without reading messages.
/// Each message is one line and names the file or snapshot concerned; each
/// variant's documentation gives its message, in capitals the fields.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O operation on `path` failed; [`Error::io_error`] gives the OS
    /// error (a store directory that does not exist is one of kind
    /// `NotFound`).
    ///
    /// Message: `PATH: OP: ERR`, e.g. `vmstore/d1/memory.bin: read: Input/output error (os error 5)`.
    #[error("{}: {op}: {err}", path.display())]
    Io {
        /// File or directory the operation was about.
        path: PathBuf,
        /// What was being done ("open", "read", "fsync", ...).
        op: &'static str,
        /// The OS error.
        err: std::io::Error,
    },
    /// A file in the store is missing, malformed, truncated, corrupted or
    /// inconsistent with its manifest.
    ///
    /// Message: `PATH: MSG`, e.g. `vmstore/d1/memory.bin: sha256 mismatch: content is corrupted (...)`.
    #[error("{}: {msg}", path.display())]
    Corrupt {
        /// The offending file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// A snapshot name does not match `[A-Za-z0-9][A-Za-z0-9._-]{0,63}`.
    ///
    /// Message: `invalid snapshot name "NAME": WHY`.
    #[error("invalid snapshot name {name:?}: {why}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        why: &'static str,
    },
    /// A restore spec is not `NAME` or `NAME+N`.
    ///
    /// Message: `invalid snapshot spec "SPEC": WHY`.
    #[error("invalid snapshot spec {spec:?}: {why}")]
    InvalidSpec {
        /// The rejected spec.
        spec: String,
        /// Why it was rejected.
        why: String,
    },
    /// No snapshot of that name exists.
    ///
    /// Message: `snapshot 'NAME' not found in store STORE; existing: A, B`
    /// (or `; the store is empty`).
    #[error("snapshot '{name}' not found in store {}; {}", store.display(), existing_list(existing))]
    NotFound {
        /// The name looked up.
        name: String,
        /// The store directory.
        store: PathBuf,
        /// Names of the snapshots that do exist.
        existing: Vec<String>,
    },
    /// A snapshot of that name already exists; nothing is overwritten.
    ///
    /// Message: `snapshot 'NAME' already exists in store STORE; refusing to overwrite it`.
    #[error("snapshot '{name}' already exists in store {}; refusing to overwrite it", store.display())]
    Exists {
        /// The name that is taken.
        name: String,
        /// The store directory.
        store: PathBuf,
    },
    /// A layer's parent (or the parent a new layer names) is not in the
    /// store.
    ///
    /// Message: `'LAYER' needs its parent 'PARENT', which is not in store STORE`.
    #[error("'{layer}' needs its parent '{parent}', which is not in store {}", store.display())]
    MissingParent {
        /// The child layer (or the snapshot being written).
        layer: String,
        /// The parent it names.
        parent: String,
        /// The store directory.
        store: PathBuf,
    },
    /// A layer's parent is in the store with another content hash than the
    /// one the layer (or the snapshot being written) was made on: it was
    /// replaced.
    ///
    /// Message: `parent 'PARENT' of 'LAYER' has changed since 'LAYER' was
    /// taken: expected content hash EXPECTED, found FOUND (MANIFEST)`.
    #[error("parent '{parent}' of '{layer}' has changed since '{layer}' was taken: expected content hash {expected}, found {found} ({})", manifest.display())]
    ParentChanged {
        /// The child layer (or the snapshot being written).
        layer: String,
        /// The parent.
        parent: String,
        /// The content hash the child records (lower-case hex).
        expected: String,
        /// The parent's content hash in the store.
        found: String,
        /// The parent's `manifest.json`.
        manifest: PathBuf,
    },
    /// `NAME+N` names no single layer: a layer on the way has several
    /// children, or the chain ends before `N` steps.
    ///
    /// Message: `'SPEC' is ambiguous: 'LAYER' has N children (A, B); restore
    /// one of them by name (path so far: ...)` or `'SPEC' is too short:
    /// only K layer(s) below 'NAME': PATH`.
    #[error("'{spec}' is {why}")]
    Descent {
        /// The spec.
        spec: String,
        /// `ambiguous: ...` or `too short: ...`.
        why: String,
    },
    /// Which layers build on which had to be known (removal, children,
    /// `NAME+N`), and a layer of the store cannot be read, so it might be
    /// a child.
    ///
    /// Message: `cannot tell which snapshots build on which: layer 'LAYER'
    /// is unreadable: CAUSE`.
    #[error("cannot tell which snapshots build on which: layer '{layer}' is unreadable: {cause}")]
    UnreadableLayer {
        /// The layer that cannot be read.
        layer: String,
        /// Why (in the message, so not also the error's `source()`).
        cause: Box<Error>,
    },
    /// Layers do not form a chain: a diff as the base, a full layer above
    /// it, a parent name or machine (geometry, vCPUs, backend, GIC mode)
    /// that does not match, a cycle, or a chain deeper than
    /// [`crate::MAX_CHAIN_DEPTH`].
    ///
    /// Message: what is wrong, naming the layers, e.g. `'d2' does not
    /// match its parent 'd1': vcpus is 4 in 'd2' but 2 in 'd1'`.
    #[error("{0}")]
    Chain(String),
    /// A snapshot cannot be removed because other snapshots build on it.
    ///
    /// Message: `snapshot 'NAME' has children (A, B); remove them first or
    /// remove recursively`.
    #[error("snapshot '{name}' has children ({}); remove them first or remove recursively", children.join(", "))]
    HasChildren {
        /// The snapshot asked for.
        name: String,
        /// Its direct children.
        children: Vec<String>,
    },
    /// The API was used wrongly (writer steps out of order, a buffer of the
    /// wrong size, a name equal to its parent's, metadata or a disk image
    /// the store cannot hold, ...).
    ///
    /// Message: what was wrong, naming the snapshot, e.g. `snapshot 'd1':
    /// no state written`.
    #[error("{0}")]
    Usage(String),
    /// A thread of the store's own panicked (a bug).
    ///
    /// Message: `WHAT panicked`, e.g. `disk hashing thread panicked`.
    #[error("{0} panicked")]
    Panicked(&'static str),
}

fn existing_list(existing: &[String]) -> String {
    if existing.is_empty() {
        "the store is empty".to_string()
    } else {
        format!("existing: {}", existing.join(", "))
    }
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(path: impl AsRef<Path>, op: &'static str, err: std::io::Error) -> Self {
        Error::Io {
            path: path.as_ref().to_path_buf(),
            op,
            err,
        }
    }

    pub(crate) fn corrupt(path: impl AsRef<Path>, msg: impl Into<String>) -> Self {
        Error::Corrupt {
            path: path.as_ref().to_path_buf(),
            msg: msg.into(),
        }
    }

    /// The OS error behind an [`Error::Io`], if that is what this is.
    pub fn io_error(&self) -> Option<&std::io::Error> {
        match self {
            Error::Io { err, .. } => Some(err),
            _ => None,
        }
    }
}

/// Attach a path and an operation name to an `io::Result`.
pub(crate) trait IoContext<T> {
    fn ctx(self, path: impl AsRef<Path>, op: &'static str) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, path: impl AsRef<Path>, op: &'static str) -> Result<T> {
        self.map_err(|e| Error::io(path, op, e))
    }
}
