//! `vmstore`: manage an Ignition snapshot store.

mod du;
mod gc;
mod inspect;
mod list;
#[cfg(feature = "registry")]
mod registry;
mod remove;
mod squash;
mod tree;
mod verify;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use snapshot_store::{Progress, Store, DEFAULT_STORE_DIR};

/// Manage an Ignition snapshot store: one directory per snapshot (layer),
/// full layers holding all of RAM and diff layers holding the pages dirtied
/// since their parent.
///
/// Snapshot specs: NAME is that snapshot with its whole ancestry; NAME+N is
/// the snapshot N layers below NAME along a chain where every layer has a
/// single child (NAME+0 = NAME).
#[derive(Parser, Debug)]
#[command(
    name = "vmstore",
    version,
    after_help = "Exit status: 0 on success; 1 on an error, or when verify finds a problem; 2 on a usage error (bad arguments)."
)]
struct Cli {
    /// Store directory.
    #[arg(long, global = true, value_name = "DIR", default_value = DEFAULT_STORE_DIR)]
    store: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// List snapshots: name, kind, parent, creation time, logical and
    /// physical size (st_blocks*512; blocks shared by clones count in each
    /// layer), pages for diffs.
    List {
        /// One JSON array instead of a table (sizes in bytes).
        #[arg(long)]
        json: bool,
    },
    /// Show the chains as a tree: each layer under its parent, with its kind
    /// (and pages, for diffs) and physical size.
    Tree {
        /// One JSON object instead of text: {"roots": [node], "unreadable":
        /// [{name, error}]}, a node being {name, kind, pages?,
        /// physical_bytes, missing_parent?, children: [node]}.
        #[arg(long)]
        json: bool,
    },
    /// Show the disk space each layer takes: logical bytes (st_size),
    /// physical (allocated blocks) and, where the file system can tell
    /// (Linux FIEMAP), bytes in blocks shared with other files through
    /// clones; with totals.
    Du {
        /// One JSON object instead of a table (sizes in bytes; shared_bytes
        /// null where unknown).
        #[arg(long)]
        json: bool,
    },
    /// Show a snapshot's manifest and derived facts (content hash, chain,
    /// children, file sizes).
    Inspect {
        /// Snapshot name.
        name: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Verify a chain (every file's size and sha256, headers, parent links)
    /// or the whole store. Exits 1 if anything is wrong. Every file is
    /// hashed unless --cached.
    Verify {
        /// Snapshot spec (NAME or NAME+N); its whole chain is verified.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        spec: Option<String>,
        /// Verify every snapshot in the store (each file hashed once).
        #[arg(long)]
        all: bool,
        /// Do not re-hash files that each layer's verified.json vouches for
        /// (unchanged device, inode, size, mtime and ctime since they were
        /// last hashed or written), as a restore does. Detects changes made
        /// through the file system, not media corruption.
        #[arg(long, conflicts_with = "all")]
        cached: bool,
        /// One JSON object instead of text: {"ok": bool, "snapshots":
        /// [{name, ok, files?, bytes_hashed?, error?}]}.
        #[arg(long)]
        json: bool,
    },
    /// Remove a snapshot. Refuses if other snapshots build on it unless
    /// --recursive.
    Remove {
        /// Snapshot name.
        name: String,
        /// Also remove every snapshot built on it.
        #[arg(long)]
        recursive: bool,
        /// One JSON object instead of text: {"removed": [name]}, deepest
        /// first.
        #[arg(long)]
        json: bool,
    },
    /// Remove work directories left by interrupted writes or removals whose
    /// process is gone, and report what was removed or kept.
    Gc {
        /// One JSON object instead of text: {"removed": [{name, bytes}],
        /// "kept": [{name, reason}]}.
        #[arg(long)]
        json: bool,
    },
    /// Materialise a chain into a new full snapshot (memory overlaid, state
    /// and disk from the top layer, no parent). The chain is verified first.
    Squash {
        /// Snapshot spec (NAME or NAME+N).
        spec: String,
        /// Name of the new full snapshot.
        #[arg(long, value_name = "NEW")]
        name: String,
        /// One JSON object instead of text: {name, kind, ram_size,
        /// content_sha256} of the new snapshot (sizes in bytes).
        #[arg(long)]
        json: bool,
    },
    /// Push a chain to an OCI registry: each layer one OCI artifact
    /// (artifactType application/vnd.ignition.layer.v1; the layer's
    /// manifest.json as config, each file a blob, a diff's parent as its
    /// subject), base first, then REF tagged with the top layer. Blobs the
    /// repository already has are not sent. The chain is verified first.
    /// Credentials: the auths map of $REGISTRY_AUTH_FILE, else
    /// $DOCKER_CONFIG/config.json, else ~/.docker/config.json. Progress on
    /// stderr when it is a terminal.
    #[cfg(feature = "registry")]
    Push {
        /// Snapshot spec (NAME or NAME+N): the chain to push.
        spec: String,
        /// Where: REGISTRY/REPOSITORY[:TAG] (tag latest if none), e.g.
        /// localhost:5000/sandboxes/py:v1.
        #[arg(value_name = "REF")]
        reference: String,
        /// Compress each file blob (media type suffix +zstd; level 3).
        #[arg(long, value_name = "ALGO", value_parser = ["zstd", "none"])]
        compress: Option<String>,
        /// Mount missing blobs from this repository of the same registry
        /// (REGISTRY/REPOSITORY) before uploading them.
        #[arg(long, value_name = "REPO")]
        mount_from: Option<String>,
        #[command(flatten)]
        conn: registry::ConnectionArgs,
        /// One JSON object instead of text: {reference, digest,
        /// compression, layers: [{name, manifest_digest, manifest_size,
        /// blobs: [{file, media_type, digest, size, file_size, status:
        /// sent|present|mounted}]}], bytes_sent, bytes_skipped, file_bytes,
        /// blob_bytes, compression_ratio, compress_seconds, upload_seconds,
        /// seconds} (sizes in bytes).
        #[arg(long)]
        json: bool,
    },
    /// Pull a chain from an OCI registry into the store (created if
    /// missing): follows each layer's subject down to its full layer, skips
    /// the layers the store already has (same content hash), downloads the
    /// others into work directories checking every blob's digest, then
    /// verifies and commits each layer as a snapshot, base first. A blob
    /// that fails its digest stops the pull with nothing committed.
    #[cfg(feature = "registry")]
    Pull {
        /// REGISTRY/REPOSITORY:TAG or REGISTRY/REPOSITORY@sha256:DIGEST.
        #[arg(value_name = "REF")]
        reference: String,
        /// Store the top layer under this name (its manifest.json is
        /// rewritten with it, so its content hash changes).
        #[arg(long = "as", value_name = "NAME")]
        rename: Option<String>,
        #[command(flatten)]
        conn: registry::ConnectionArgs,
        /// One JSON object instead of text: {reference, digest, name,
        /// layers: [{name, manifest_digest, content_sha256, status:
        /// pulled|present, bytes_received, file_bytes, compression}],
        /// bytes_received, file_bytes, compression_ratio,
        /// download_seconds, commit_seconds, seconds} (sizes in bytes).
        #[arg(long)]
        json: bool,
    },
    /// Push files (not a snapshot: e.g. a guest's kernel and root file
    /// system) as one OCI artifact (artifactType
    /// application/vnd.ignition.files.v1, one blob per file titled with its
    /// path under DIR) tagged REF; blobs the repository has are not sent.
    /// --store is not used. Credentials as for push.
    #[cfg(feature = "registry")]
    PushFiles {
        /// The directory the files are in.
        dir: std::path::PathBuf,
        /// Where: REGISTRY/REPOSITORY[:TAG] (tag latest if none).
        #[arg(value_name = "REF")]
        reference: String,
        /// The files, as paths relative to DIR (at most 1024).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<String>,
        #[command(flatten)]
        conn: registry::ConnectionArgs,
        /// One JSON object instead of text: {reference, digest, files:
        /// [{name, digest, size, status: sent|present}]} (sizes in bytes).
        #[arg(long)]
        json: bool,
    },
    /// Pull a files artifact (see push-files) into DIR (created if
    /// missing): the manifest is checked first, every blob against its
    /// digest as it arrives, and each file is renamed into place only once
    /// whole, replacing a file of that name. --store is not used.
    #[cfg(feature = "registry")]
    PullFiles {
        /// REGISTRY/REPOSITORY:TAG or REGISTRY/REPOSITORY@sha256:DIGEST.
        #[arg(value_name = "REF")]
        reference: String,
        /// Where the files go.
        dir: std::path::PathBuf,
        #[command(flatten)]
        conn: registry::ConnectionArgs,
        /// One JSON object instead of text: {reference, digest, files:
        /// [{name, digest, size}]} (sizes in bytes).
        #[arg(long)]
        json: bool,
    },
    /// Pull a container image for one platform into an OCI image layout
    /// directory DIR (created if missing; blobs it has already are kept):
    /// an index is resolved to the platform's manifest, which is checked
    /// (media types, at most 256 layers, sizes within --max-bytes) before
    /// any blob is fetched; each blob is checked against its digest as it
    /// arrives. DIR/index.json then names that manifest. Layer contents
    /// are not looked into (python3 -m ignition.image build makes a root
    /// file system of them). --store is not used. Credentials as for pull.
    #[cfg(feature = "registry")]
    ImagePull {
        /// REGISTRY/REPOSITORY:TAG or REGISTRY/REPOSITORY@sha256:DIGEST.
        #[arg(value_name = "REF")]
        reference: String,
        /// The OCI image layout directory.
        dir: std::path::PathBuf,
        /// OS/ARCHITECTURE[/VARIANT] to pick from an index.
        #[arg(long, default_value = "linux/arm64")]
        platform: String,
        /// Most bytes the config and layers may declare, added up (as
        /// stored: compressed).
        #[arg(long, value_name = "BYTES", default_value_t = snapshot_store::oci::DEFAULT_MAX_IMAGE_BYTES)]
        max_bytes: u64,
        #[command(flatten)]
        conn: registry::ConnectionArgs,
        /// One JSON object instead of text: {reference, index_digest (null
        /// without an index), digest, media_type, config: blob, layers:
        /// [blob]}, a blob being {media_type, digest, size, status:
        /// pulled|present} (sizes in bytes).
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("VMSTORE_LOG")
                // The TLS verifier logs the failure the error message
                // already gives.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new("warn,rustls_platform_verifier=off")
                }),
        )
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal, not in logs and pipes.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            let _ = std::io::stdout().flush();
            eprintln!("vmstore: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Human-readable size: B, KiB, MiB or GiB.
fn mib(bytes: u64) -> String {
    const K: f64 = 1024.0;
    let b = bytes as f64;
    if bytes < 1024 {
        format!("{bytes} B")
    } else if b < K * K {
        format!("{:.1} KiB", b / K)
    } else if b < K * K * K {
        format!("{:.1} MiB", b / (K * K))
    } else {
        format!("{:.2} GiB", b / (K * K * K))
    }
}

/// Prints a progress report of a long operation (hashing, squash stages)
/// on stderr.
fn progress(p: Progress<'_>) {
    match p {
        Progress::Hashing { path, done, total } => eprintln!(
            "vmstore: hashing {}: {} of {}",
            path.display(),
            mib(done),
            mib(total)
        ),
        Progress::Stage(s) => eprintln!("vmstore: {s}"),
    }
}

/// Runs the subcommand (each in a module of its own); returns the exit
/// status, 1 when `verify` finds a problem.
fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let open = || Store::open(&cli.store);
    let mut out = std::io::stdout().lock();
    let out: &mut dyn Write = &mut out;
    match cli.cmd {
        Cmd::List { json } => list::run(&open()?, json, out)?,
        Cmd::Tree { json } => tree::run(&open()?, json, out)?,
        Cmd::Du { json } => du::run(&open()?, json, out)?,
        Cmd::Inspect { name, json } => inspect::run(&open()?, &name, json, out)?,
        Cmd::Verify {
            spec,
            all,
            cached,
            json,
        } => return verify::run(&open()?, spec, all, cached, json, out),
        Cmd::Remove {
            name,
            recursive,
            json,
        } => remove::run(&open()?, &name, recursive, json, out)?,
        Cmd::Gc { json } => gc::run(&open()?, json, out)?,
        Cmd::Squash { spec, name, json } => squash::run(&open()?, &spec, &name, json, out)?,
        #[cfg(feature = "registry")]
        Cmd::Push {
            spec,
            reference,
            compress,
            mount_from,
            conn,
            json,
        } => {
            let opts = registry::push_options(compress.as_deref(), mount_from, &conn);
            registry::push(&open()?, &spec, &reference, opts, json, out)?
        }
        #[cfg(feature = "registry")]
        Cmd::Pull {
            reference,
            rename,
            conn,
            json,
        } => {
            // The store is created if missing.
            let store = Store::create(&cli.store)?;
            registry::pull(&store, &reference, rename, conn.connection(), json, out)?
        }
        #[cfg(feature = "registry")]
        Cmd::PushFiles {
            dir,
            reference,
            files,
            conn,
            json,
        } => {
            let conn = conn.connection();
            let r = snapshot_store::oci::push_files(&dir, &files, &reference, &conn)?;
            registry::files_report(&r, "pushed", json, out)?
        }
        #[cfg(feature = "registry")]
        Cmd::PullFiles {
            reference,
            dir,
            conn,
            json,
        } => {
            let conn = conn.connection();
            let r = snapshot_store::oci::pull_files(&reference, &dir, &conn)?;
            registry::files_report(&r, "pulled", json, out)?
        }
        #[cfg(feature = "registry")]
        Cmd::ImagePull {
            reference,
            dir,
            platform,
            max_bytes,
            conn,
            json,
        } => {
            let conn = conn.connection();
            let opts = snapshot_store::oci::ImageOptions {
                platform,
                max_bytes,
            };
            let r = snapshot_store::oci::pull_image(&reference, &dir, &opts, &conn)?;
            registry::image_report(&r, json, out)?
        }
    }
    Ok(ExitCode::SUCCESS)
}
