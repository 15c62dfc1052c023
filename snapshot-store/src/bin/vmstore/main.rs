//! `vmstore`: manage an Ignition snapshot store.

mod du;
#[cfg(feature = "registry")]
mod registry;
mod tree;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use snapshot_store::format::chunks::disk_chunk_count;
use snapshot_store::format::manifest::LayerKind;
use snapshot_store::format::LAYER_FILES;
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
        /// Plain HTTP instead of HTTPS (a local registry).
        #[arg(long)]
        plain_http: bool,
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
        /// Plain HTTP instead of HTTPS (a local registry).
        #[arg(long)]
        plain_http: bool,
        /// One JSON object instead of text: {reference, digest, name,
        /// layers: [{name, manifest_digest, content_sha256, status:
        /// pulled|present, bytes_received, file_bytes, compression}],
        /// bytes_received, file_bytes, compression_ratio,
        /// download_seconds, commit_seconds, seconds} (sizes in bytes).
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

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    #[cfg(feature = "registry")]
    if let Cmd::Pull {
        reference,
        rename,
        plain_http,
        json,
    } = &cli.cmd
    {
        let store = Store::create(&cli.store)?;
        let conn = snapshot_store::oci::Connection {
            plain_http: *plain_http,
            credential: None,
        };
        let mut out = std::io::stdout().lock();
        registry::pull(&store, reference, rename.clone(), conn, *json, &mut out)?;
        return Ok(ExitCode::SUCCESS);
    }
    let store = Store::open(&cli.store)?;
    let mut out = std::io::stdout().lock();
    match cli.cmd {
        Cmd::List { json } => {
            let entries = store.list()?;
            if json {
                let v: Vec<serde_json::Value> = entries
                    .iter()
                    .map(|e| match &e.summary {
                        Ok(s) => serde_json::json!({
                            "name": e.name,
                            "kind": s.kind.to_string(),
                            "parent": s.parent,
                            "created": s.created,
                            "logical_bytes": s.logical_bytes,
                            "physical_bytes": s.physical_bytes,
                            "pages": s.pages,
                            "ram_size": s.ram_size,
                        }),
                        Err(err) => serde_json::json!({"name": e.name, "error": err.to_string()}),
                    })
                    .collect();
                writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
            } else if entries.is_empty() {
                writeln!(out, "store {} is empty", store.root().display())?;
            } else {
                writeln!(
                    out,
                    "{:<20} {:<5} {:<20} {:<21} {:>12} {:>12} {:>7}",
                    "NAME", "KIND", "PARENT", "CREATED", "LOGICAL", "PHYSICAL", "PAGES"
                )?;
                for e in &entries {
                    match &e.summary {
                        Ok(s) => writeln!(
                            out,
                            "{:<20} {:<5} {:<20} {:<21} {:>12} {:>12} {:>7}",
                            e.name,
                            s.kind.to_string(),
                            s.parent.as_deref().unwrap_or("-"),
                            s.created,
                            mib(s.logical_bytes),
                            mib(s.physical_bytes),
                            s.pages.map_or("-".to_string(), |p| p.to_string())
                        )?,
                        Err(err) => writeln!(out, "{:<20} BROKEN: {err}", e.name)?,
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Tree { json } => {
            tree::run(&store, json, &mut out)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Du { json } => {
            du::run(&store, json, &mut out)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Inspect { name, json } => {
            let layer = store.layer(&name)?;
            let chain: Vec<String> = match store.resolve(&name) {
                Ok(c) => c.layers().iter().map(|l| l.name.clone()).collect(),
                Err(e) => vec![format!("(unresolvable: {e})")],
            };
            let children = store.children(&name).unwrap_or_default();
            let mut files = Vec::new();
            for f in LAYER_FILES {
                if let Ok(m) = std::fs::symlink_metadata(layer.dir.join(f)) {
                    use std::os::unix::fs::MetadataExt;
                    files.push((f, m.len(), m.blocks() * 512));
                }
            }
            let m = &layer.manifest;
            if json {
                let v = serde_json::json!({
                    "manifest": m,
                    "content_sha256": layer.content_sha256,
                    "dir": layer.dir,
                    "chain": chain,
                    "children": children,
                    "disk_chunks": m.disk.as_ref().map(|d| disk_chunk_count(d.size, d.chunk_size)),
                    "files": files.iter().map(|(f, l, p)| serde_json::json!({
                        "name": f, "logical_bytes": l, "physical_bytes": p
                    })).collect::<Vec<_>>(),
                });
                writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
            } else {
                writeln!(out, "snapshot:       {}", layer.name)?;
                writeln!(out, "directory:      {}", layer.dir.display())?;
                writeln!(out, "content hash:   {}", layer.content_sha256)?;
                writeln!(out, "kind:           {}", m.kind)?;
                if let Some(p) = &m.parent {
                    writeln!(out, "parent:         {} ({})", p.name, p.sha256)?;
                }
                writeln!(out, "chain:          {}", chain.join(" -> "))?;
                writeln!(
                    out,
                    "children:       {}",
                    if children.is_empty() {
                        "-".to_string()
                    } else {
                        children.join(", ")
                    }
                )?;
                writeln!(out, "format:         {}", m.format)?;
                writeln!(out, "created:        {} ({})", m.created, m.created_unix)?;
                writeln!(out, "creator:        {}", m.creator)?;
                writeln!(out, "backend:        {}", m.backend)?;
                writeln!(out, "gic mode:       {}", m.gic_mode)?;
                writeln!(out, "vcpus:          {}", m.vcpus)?;
                writeln!(
                    out,
                    "ram:            {} at {:#x} ({} pages of {} bytes)",
                    mib(m.ram_size),
                    m.ram_base_gpa,
                    m.ram_pages(),
                    m.page_size
                )?;
                if let Some(p) = m.diff_pages {
                    writeln!(
                        out,
                        "diff pages:     {p} ({} of RAM, {:.2}%)",
                        mib(p * m.page_size),
                        100.0 * p as f64 / m.ram_pages() as f64
                    )?;
                }
                if let Some(d) = &m.disk {
                    writeln!(
                        out,
                        "disk:           {} in {} chunks of {} KiB (sha256 of the chunk digests {})",
                        mib(d.size),
                        disk_chunk_count(d.size, d.chunk_size),
                        d.chunk_size >> 10,
                        d.sha256
                    )?;
                }
                for (f, l, p) in &files {
                    writeln!(
                        out,
                        "file:           {f:<14} {:>12} logical {:>12} physical",
                        mib(*l),
                        mib(*p)
                    )?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Verify {
            spec,
            all,
            cached,
            json,
        } => {
            let p: &(dyn Fn(Progress<'_>) + Sync) = &progress;
            if all {
                let results = store.verify_all(Some(p))?;
                let bad = results.iter().filter(|(_, r)| r.is_err()).count();
                for n in results
                    .iter()
                    .flat_map(|(_, r)| r.iter().flat_map(|rep| &rep.cache_notes))
                {
                    eprintln!("vmstore: {n}");
                }
                if json {
                    let v: Vec<serde_json::Value> = results
                        .iter()
                        .map(|(name, r)| match r {
                            Ok(rep) => serde_json::json!({
                                "name": name, "ok": true, "files": rep.files,
                                "bytes_hashed": rep.bytes_hashed,
                            }),
                            Err(e) => serde_json::json!({
                                "name": name, "ok": false, "error": e.to_string(),
                            }),
                        })
                        .collect();
                    let doc = serde_json::json!({"ok": bad == 0, "snapshots": v});
                    writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
                } else {
                    for (name, r) in &results {
                        match r {
                            Ok(rep) => writeln!(
                                out,
                                "ok   {name} ({} files, {})",
                                rep.files,
                                mib(rep.bytes_hashed)
                            )?,
                            Err(e) => writeln!(out, "FAIL {name}: {e}")?,
                        }
                    }
                    if bad > 0 {
                        writeln!(
                            out,
                            "{bad} of {} snapshot(s) failed verification",
                            results.len()
                        )?;
                    } else {
                        writeln!(out, "all {} snapshot(s) verified", results.len())?;
                    }
                }
                return Ok(if bad > 0 {
                    ExitCode::FAILURE
                } else {
                    ExitCode::SUCCESS
                });
            }
            let spec = spec.context("a snapshot spec or --all is required")?;
            let verified = store.resolve(&spec).and_then(|chain| {
                if cached {
                    snapshot_store::verify_chain_cached_with_progress(&chain, Some(p))
                } else {
                    snapshot_store::verify_chain_with_progress(&chain, Some(p))
                }
                .map(|rep| (chain, rep))
            });
            let (chain, rep) = match verified {
                Ok(v) => v,
                Err(e) if json => {
                    let doc = serde_json::json!({"ok": false, "snapshots": [
                        {"name": spec, "ok": false, "error": e.to_string()}
                    ]});
                    writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
                    return Ok(ExitCode::FAILURE);
                }
                Err(e) => return Err(anyhow::Error::new(e).context(format!("verifying '{spec}'"))),
            };
            for n in &rep.cache_notes {
                eprintln!("vmstore: {n}");
            }
            if json {
                let doc = serde_json::json!({"ok": true, "snapshots": [{
                    "name": spec, "ok": true, "chain": chain.describe(),
                    "layers": rep.layers, "files": rep.files,
                    "bytes_hashed": rep.bytes_hashed, "files_cached": rep.files_cached,
                    "bytes_cached": rep.bytes_cached,
                }]});
                writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
                return Ok(ExitCode::SUCCESS);
            }
            let from_cache = if cached {
                format!(
                    " hashed, {} files ({}) unchanged since verified",
                    rep.files_cached,
                    mib(rep.bytes_cached)
                )
            } else {
                String::new()
            };
            writeln!(
                out,
                "ok {spec}: {} ({} layers, {} files, {}{from_cache})",
                chain.describe(),
                rep.layers,
                rep.files,
                mib(rep.bytes_hashed)
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Remove {
            name,
            recursive,
            json,
        } => {
            let removed = match store.remove(&name, recursive) {
                Err(e @ snapshot_store::Error::HasChildren { .. }) => {
                    anyhow::bail!("{e} (vmstore remove --recursive {name})")
                }
                r => r?,
            };
            if json {
                let doc = serde_json::json!({ "removed": removed });
                writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
                return Ok(ExitCode::SUCCESS);
            }
            for n in removed {
                writeln!(out, "removed {n}")?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Gc { json } => {
            let r = store.gc()?;
            if json {
                let doc = serde_json::json!({
                    "removed": r.removed.iter().map(|(n, b)| serde_json::json!({"name": n, "bytes": b})).collect::<Vec<_>>(),
                    "kept": r.kept.iter().map(|(n, why)| serde_json::json!({"name": n, "reason": why})).collect::<Vec<_>>(),
                });
                writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
                return Ok(ExitCode::SUCCESS);
            }
            for (n, bytes) in &r.removed {
                writeln!(out, "removed {n} ({})", mib(*bytes))?;
            }
            for (n, why) in &r.kept {
                writeln!(out, "kept {n}: {why}")?;
            }
            writeln!(
                out,
                "gc: removed {} work director{}, kept {}",
                r.removed.len(),
                if r.removed.len() == 1 { "y" } else { "ies" },
                r.kept.len()
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Squash { spec, name, json } => {
            let p: &(dyn Fn(Progress<'_>) + Sync) = &progress;
            let layer = store.squash(&spec, &name, Some(p))?;
            if json {
                let doc = serde_json::json!({
                    "name": layer.name,
                    "kind": layer.manifest.kind.to_string(),
                    "ram_size": layer.manifest.ram_size,
                    "content_sha256": layer.content_sha256,
                });
                writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
                return Ok(ExitCode::SUCCESS);
            }
            writeln!(
                out,
                "squashed {spec} into full snapshot '{}' ({}, {})",
                layer.name,
                match layer.manifest.kind {
                    LayerKind::Full => "full",
                    LayerKind::Diff => "diff",
                },
                mib(layer.manifest.ram_size)
            )?;
            Ok(ExitCode::SUCCESS)
        }
        #[cfg(feature = "registry")]
        Cmd::Push {
            spec,
            reference,
            compress,
            mount_from,
            plain_http,
            json,
        } => {
            let conn = snapshot_store::oci::Connection {
                plain_http,
                credential: None,
            };
            let opts = snapshot_store::oci::PushOptions {
                connection: conn,
                compression: match compress.as_deref() {
                    Some("zstd") => snapshot_store::oci::Compression::Zstd,
                    _ => snapshot_store::oci::Compression::None,
                },
                mount_from,
                progress: None,
            };
            registry::push(&store, &spec, &reference, opts, json, &mut out)?;
            Ok(ExitCode::SUCCESS)
        }
        #[cfg(feature = "registry")]
        Cmd::Pull { .. } => unreachable!("pull is handled before the store is opened"),
    }
}
