//! `vmstore gc`: work directories and temporary files left by processes
//! that are gone.

use std::io::Write;

use snapshot_store::Store;

use super::mib;

/// Removes what is stale and prints what was removed or kept (text, or
/// JSON with `json`).
pub fn run(store: &Store, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let r = store.gc()?;
    if json {
        let doc = serde_json::json!({
            "removed": r.removed.iter().map(|(n, b)| serde_json::json!({"name": n, "bytes": b})).collect::<Vec<_>>(),
            "kept": r.kept.iter().map(|(n, why)| serde_json::json!({"name": n, "reason": why})).collect::<Vec<_>>(),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
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
    Ok(())
}
