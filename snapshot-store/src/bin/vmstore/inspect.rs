//! `vmstore inspect`: a snapshot's manifest and what follows from it.

use std::io::Write;
use std::os::unix::fs::MetadataExt;

use snapshot_store::format::chunks::disk_chunk_count;
use snapshot_store::format::LAYER_FILES;
use snapshot_store::{Layer, Store};

use super::mib;

/// What `inspect` shows besides the manifest.
struct Facts {
    /// The chain's layer names, base first, or why it cannot be resolved.
    chain: Vec<String>,
    /// Direct children.
    children: Vec<String>,
    /// `(file, logical bytes, physical bytes)` of each file present.
    files: Vec<(&'static str, u64, u64)>,
}

/// Prints the snapshot `name` (text, or JSON with `json`).
pub fn run(store: &Store, name: &str, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let layer = store.layer(name)?;
    let chain: Vec<String> = match store.resolve(name) {
        Ok(c) => c.layers().iter().map(|l| l.name.clone()).collect(),
        Err(e) => vec![format!("(unresolvable: {e})")],
    };
    let children = store.children(name).unwrap_or_default();
    let mut files = Vec::new();
    for f in LAYER_FILES {
        if let Ok(m) = std::fs::symlink_metadata(layer.dir.join(f)) {
            files.push((f, m.len(), m.blocks() * 512));
        }
    }
    let facts = Facts {
        chain,
        children,
        files,
    };
    if json {
        print_json(&layer, &facts, out)
    } else {
        print_text(&layer, &facts, out)
    }
}

fn print_json(layer: &Layer, facts: &Facts, out: &mut dyn Write) -> anyhow::Result<()> {
    let m = &layer.manifest;
    let v = serde_json::json!({
        "manifest": m,
        "content_sha256": layer.content_sha256,
        "dir": layer.dir,
        "chain": facts.chain,
        "children": facts.children,
        "disk_chunks": m.disk.as_ref().map(|d| disk_chunk_count(d.size, d.chunk_size)),
        "files": facts.files.iter().map(|(f, l, p)| serde_json::json!({
            "name": f, "logical_bytes": l, "physical_bytes": p
        })).collect::<Vec<_>>(),
    });
    writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    Ok(())
}

fn print_text(layer: &Layer, facts: &Facts, out: &mut dyn Write) -> anyhow::Result<()> {
    let m = &layer.manifest;
    writeln!(out, "snapshot:       {}", layer.name)?;
    writeln!(out, "directory:      {}", layer.dir.display())?;
    writeln!(out, "content hash:   {}", layer.content_sha256)?;
    writeln!(out, "kind:           {}", m.kind)?;
    if let Some(p) = &m.parent {
        writeln!(out, "parent:         {} ({})", p.name, p.sha256)?;
    }
    writeln!(out, "chain:          {}", facts.chain.join(" -> "))?;
    writeln!(
        out,
        "children:       {}",
        if facts.children.is_empty() {
            "-".to_string()
        } else {
            facts.children.join(", ")
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
        if let Some(n) = d.diff_chunks {
            writeln!(
                out,
                "disk diff:      {n} chunks written since the parent ({}; the others are the parent's)",
                mib(n * d.chunk_size)
            )?;
        }
    }
    for (f, l, p) in &facts.files {
        writeln!(
            out,
            "file:           {f:<14} {:>12} logical {:>12} physical",
            mib(*l),
            mib(*p)
        )?;
    }
    Ok(())
}
