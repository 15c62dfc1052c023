//! Moving chains between machines: a chain's layers as OCI artifacts in a
//! registry (`vmstore push` / `vmstore pull`); also a directory's files
//! (`vmstore push-files` / `pull-files`) and container images
//! (`vmstore image-pull`).
//!
//! Each layer is one OCI image manifest (image-spec v1.1) with
//! `artifactType` [`ARTIFACT_TYPE`]: its `manifest.json` as the config
//! blob, each other file a blob of its own media type, and for a diff a
//! `subject` naming the parent's OCI manifest, so the tag of the top layer
//! reaches the whole chain. The byte layout is in FORMAT.md ("Registry
//! artifacts") and [`layout`]. The wire protocol is the OCI
//! distribution-spec v1.1, spoken over `reqwest` by `client` under the
//! transfer limits of `transport` ([`Limits`]: every answer's size capped
//! while it streams, connection and idle timeouts, a deadline per request
//! that grows with its bytes, retries of idempotent requests); this module
//! runs it on a tokio current-thread runtime of its own, so its entry
//! points ([`push()`], [`pull()`]) are blocking.
//!
//! Pushing sends only the blobs the registry does not have (a `HEAD` per
//! blob, then a cross-repository mount if a source repository is given);
//! pulling skips the layers the store already has (same content hash),
//! checks every blob's digest as it arrives and the store's own checks on
//! each layer, and commits each layer atomically, base first
//! ([`crate::LayerImport`]).

// The submodules in layers, bottom first, as in `lib.rs`
// (`tests/layering.rs` checks it).

// The artifacts' layout, registry credentials, HTTP under limits.
mod auth;
pub mod layout;
mod transport;

// Blobs to and from files, the registry client, the cache of pushed
// blobs' digests.
mod blobio;
mod client;
mod digests;

// Push and pull: chains of layers, and a directory's files.
mod files;
mod pull;
mod push;

// Container images (not snapshot layers) into an OCI image layout.
mod image;

use std::path::PathBuf;
use std::sync::Arc;

pub use auth::{auth_file_path, normalize_registry, AuthFile, Credential, MAX_AUTH_FILE_BYTES};
pub use digests::OCI_BLOBS_FILE;
pub use files::{
    pull_files, push_files, FileEntry, FilesReport, EMPTY_CONFIG_MEDIA_TYPE, FILES_ARTIFACT_TYPE,
    FILE_MEDIA_TYPE, MAX_FILES,
};
pub use image::{
    pull_image, ImageBlob, ImageOptions, ImageReport, DEFAULT_MAX_IMAGE_BYTES,
    DOCKER_LIST_MEDIA_TYPE, DOCKER_MANIFEST_MEDIA_TYPE, IMAGE_CONFIG_MEDIA_TYPES,
    IMAGE_LAYER_MEDIA_TYPES, MAX_IMAGE_CONFIG_BYTES, MAX_IMAGE_LAYERS, OCI_INDEX_MEDIA_TYPE,
};
pub use layout::{
    digest_hex, digest_of, file_media_type, parse_file_media_type, ArtifactManifest, Compression,
    Descriptor, FileBlob, ARTIFACT_TYPE, CONFIG_MEDIA_TYPE, MAX_OCI_MANIFEST_BYTES,
};
pub use pull::{pull, PullOptions, PullReport, PulledLayer};
pub use push::{push, BlobStatus, PushOptions, PushReport, PushedBlob, PushedLayer};
pub use transport::{
    Limits, TransferProblem, MAX_DEADLINE, MAX_ERROR_BODY_BYTES, MAX_REDIRECTS, MAX_TOKEN_BYTES,
};

/// Everything that can go wrong moving layers to or from a registry, one
/// variant per kind of failure. Each message is one line naming the
/// reference, layer, file or digest concerned; each variant's
/// documentation gives its message, in capitals the fields.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// A reference is not `REGISTRY/REPOSITORY[:TAG][@DIGEST]`.
    ///
    /// Message: `invalid reference "REFERENCE": MSG`.
    #[error("invalid reference {reference:?}: {msg}")]
    Reference {
        /// The reference as given.
        reference: String,
        /// Why it was refused.
        msg: String,
    },
    /// The auth file could not be read or parsed.
    ///
    /// Message: `auth file PATH: MSG`.
    #[error("auth file {path}: {msg}")]
    AuthFile {
        /// The file.
        path: String,
        /// What is wrong.
        msg: String,
    },
    /// The registry refused the credentials (HTTP 401/403).
    ///
    /// Message: `OP: the registry refused access with CREDENTIAL
    /// credentials[ from FILE]: MSG`.
    #[error("{op}: the registry refused access with {credential} credentials{from}: {msg}")]
    Auth {
        /// What was being done, naming the reference.
        op: String,
        /// `anonymous`, `basic` or `bearer`.
        credential: &'static str,
        /// ` from FILE` when the credentials came from an auth file.
        from: String,
        /// The registry's answer.
        msg: String,
    },
    /// A request to the registry failed: the registry answered with an
    /// error status (its body's start in the message, printable), or its
    /// answer was unusable.
    ///
    /// Message: `OP: METHOD URL answered HTTP STATUS: BODY[; gave up after
    /// N attempts]`, or `OP: MSG`.
    #[error("{op}: {msg}")]
    Registry {
        /// What was being done, naming the reference or digest.
        op: String,
        /// The registry's answer, or what is wrong with it.
        msg: String,
    },
    /// A request did not get through the transfer limits ([`Limits`]):
    /// no connection, an answer larger than its cap, no byte for the idle
    /// timeout, not complete by its deadline, too many redirects, or a
    /// broken connection; after the retries an idempotent request gets.
    ///
    /// Message: `METHOD URL: PROBLEM[; gave up after N attempts]`, e.g.
    /// `GET http://127.0.0.1:5000/v2/sandboxes/py/manifests/v1: manifest
    /// from 127.0.0.1:5000/sandboxes/py:v1 exceeds 4 MiB` (PROBLEM is the
    /// [`TransferProblem`]'s message).
    #[error("{request}: {problem}{}", if *attempts > 1 { format!("; gave up after {attempts} attempts") } else { String::new() })]
    Transfer {
        /// `METHOD URL` (the URL without its query).
        request: String,
        /// What went wrong.
        problem: TransferProblem,
        /// Attempts made.
        attempts: u32,
    },
    /// An OCI manifest is not an Ignition layer artifact.
    ///
    /// Message: `WHAT: MSG`.
    #[error("{what}: {msg}")]
    Artifact {
        /// Which manifest (reference or digest).
        what: String,
        /// What is wrong with it.
        msg: String,
    },
    /// A blob's bytes do not have the digest or size its descriptor gives:
    /// it was corrupted or truncated in the registry or on the way.
    ///
    /// Message: `layer 'LAYER': blob DIGEST (FILE) is corrupted or
    /// truncated: received RECEIVED bytes (descriptor: SIZE) with
    /// sha256:FOUND; the pull stopped with nothing committed`.
    #[error("layer '{layer}': blob {digest} ({file}) is corrupted or truncated: received {received} bytes (descriptor: {size}) with sha256:{found}; the pull stopped with nothing committed")]
    BlobDigest {
        /// The layer's snapshot name.
        layer: String,
        /// The layer file the blob holds.
        file: String,
        /// The descriptor's digest.
        digest: String,
        /// The descriptor's size, in bytes.
        size: u64,
        /// Bytes received.
        received: u64,
        /// The sha256 of what was received, hex.
        found: String,
    },
    /// A blob could not be turned back into its file (bad zstd frame, or
    /// more or fewer bytes than the layer's manifest gives).
    ///
    /// Message: `layer 'LAYER': blob DIGEST (FILE): MSG; the pull stopped
    /// with nothing committed`.
    #[error(
        "layer '{layer}': blob {digest} ({file}): {msg}; the pull stopped with nothing committed"
    )]
    Blob {
        /// The layer's snapshot name.
        layer: String,
        /// The layer file.
        file: String,
        /// The blob's digest.
        digest: String,
        /// What is wrong.
        msg: String,
    },
    /// The chain in the registry does not fit together or does not fit the
    /// local store (a layer of the same name with other content, a missing
    /// parent link).
    ///
    /// Message: what does not fit, naming the layers.
    #[error("{0}")]
    Chain(String),
    /// The store refused (reading the chain to push, verifying or
    /// committing a pulled layer).
    ///
    /// Message: the store's ([`crate::Error`]).
    #[error(transparent)]
    Store(#[from] crate::error::Error),
    /// A local file operation failed.
    ///
    /// Message: `PATH: OP: ERR`.
    #[error("{}: {op}: {err}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        err: std::io::Error,
    },
}

/// A progress event of a push or pull, for progress lines.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// A stage begins, e.g. `compressing d1/memory.bin`.
    Stage(&'a str),
    /// `done` of `total` bytes of a blob have been sent or received.
    Bytes {
        /// The layer's snapshot name.
        layer: &'a str,
        /// The layer file the blob holds.
        file: &'a str,
        /// Bytes transferred so far.
        done: u64,
        /// The blob's size in bytes.
        total: u64,
    },
}

/// A progress callback; called from the transferring thread.
pub type EventFn = Arc<dyn Fn(Event<'_>) + Send + Sync>;

/// Where and how to reach the registry.
#[derive(Debug, Clone, Default)]
pub struct Connection {
    /// Plain HTTP instead of HTTPS (a local registry).
    pub plain_http: bool,
    /// Credentials; `None` reads them from [`AuthFile::from_environment`].
    pub credential: Option<Credential>,
    /// Timeouts, deadlines and retries of every request.
    pub limits: Limits,
}

/// `io::Error` with a path, as [`RegistryError::Io`].
pub(crate) fn io_err(
    path: impl Into<PathBuf>,
    op: &'static str,
    err: std::io::Error,
) -> RegistryError {
    RegistryError::Io {
        path: path.into(),
        op,
        err,
    }
}

/// Run `fut` to completion on a new tokio current-thread runtime, with
/// ring as the process's TLS crypto provider (unless one is installed).
/// The runtime is then shut down without waiting for its blocking threads
/// (a name lookup the connection timeout gave up on may still be running).
pub(crate) fn block_on<T>(
    fut: impl std::future::Future<Output = Result<T, RegistryError>>,
) -> Result<T, RegistryError> {
    // Fails only if a provider is already installed, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| io_err("tokio runtime", "start", e))?;
    let r = rt.block_on(fut);
    rt.shutdown_background();
    r
}
