//! `vmstore remove`: a snapshot, and with `--recursive` its descendants.

use std::io::Write;

use snapshot_store::Store;

/// Removes `name` (with its descendants if `recursive`) and prints what
/// was removed (text, or JSON with `json`).
pub fn run(
    store: &Store,
    name: &str,
    recursive: bool,
    json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let removed = match store.remove(name, recursive) {
        Err(e @ snapshot_store::Error::HasChildren { .. }) => {
            anyhow::bail!("{e} (vmstore remove --recursive {name})")
        }
        r => r?,
    };
    if json {
        let doc = serde_json::json!({ "removed": removed });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
    }
    for n in removed {
        writeln!(out, "removed {n}")?;
    }
    Ok(())
}
