//! Error types.

use std::path::{Path, PathBuf};

/// A parser rejected its input. Carries no path: the reader that called the
/// parser wraps it into [`Error::Corrupt`] naming the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub String);

impl ParseError {
    pub(crate) fn new(msg: impl Into<String>) -> Self {
        ParseError(msg.into())
    }
}

/// Everything that can go wrong in the store. Each message is one line and
/// names the file or snapshot concerned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O operation on `path` failed.
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
    #[error("{}: {msg}", path.display())]
    Corrupt {
        /// The offending file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// A snapshot name does not match `[A-Za-z0-9][A-Za-z0-9._-]{0,63}`.
    #[error("invalid snapshot name {name:?}: {why}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        why: &'static str,
    },
    /// A restore spec is not `NAME` or `NAME+N`.
    #[error("invalid snapshot spec {spec:?}: {why}")]
    InvalidSpec {
        /// The rejected spec.
        spec: String,
        /// Why it was rejected.
        why: String,
    },
    /// No snapshot of that name exists.
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
    #[error("snapshot '{name}' already exists in store {}; refusing to overwrite it", store.display())]
    Exists {
        /// The name that is taken.
        name: String,
        /// The store directory.
        store: PathBuf,
    },
    /// Chain resolution failed: a missing or replaced parent, a branch, a
    /// chain too short for `NAME+N`, a cycle, or an inconsistent layer.
    #[error("{0}")]
    Chain(String),
    /// A snapshot cannot be removed because other snapshots build on it.
    #[error("snapshot '{name}' has children ({}); remove them first or remove recursively", children.join(", "))]
    HasChildren {
        /// The snapshot asked for.
        name: String,
        /// Its direct children.
        children: Vec<String>,
    },
    /// The API was used wrongly (writer steps out of order, a buffer of the
    /// wrong size, a name equal to its parent's, ...).
    #[error("{0}")]
    Usage(String),
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
