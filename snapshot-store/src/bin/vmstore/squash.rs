//! `vmstore squash`: a chain materialised into a new full snapshot.

use std::io::Write;

use snapshot_store::{Progress, Store};

use super::{mib, progress};

/// Squashes the chain `spec` into the new full snapshot `name` and prints
/// it (text, or JSON with `json`).
pub fn run(
    store: &Store,
    spec: &str,
    name: &str,
    json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let p: &(dyn Fn(Progress<'_>) + Sync) = &progress;
    let layer = store.squash(spec, name, Some(p))?;
    if json {
        let doc = serde_json::json!({
            "name": layer.name,
            "kind": layer.manifest.kind.to_string(),
            "ram_size": layer.manifest.ram_size,
            "content_sha256": layer.content_sha256,
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
    }
    writeln!(
        out,
        "squashed {spec} into full snapshot '{}' ({}, {})",
        layer.name,
        layer.manifest.kind,
        mib(layer.manifest.ram_size)
    )?;
    Ok(())
}
