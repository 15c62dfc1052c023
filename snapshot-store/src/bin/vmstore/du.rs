//! `vmstore du`: the disk space each layer takes.

use std::io::Write;

use snapshot_store::Store;

use super::mib;

/// Prints each layer's logical, allocated and shared bytes and the totals
/// (text, or JSON with `json`).
pub fn run(store: &Store, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let rows = store.du()?;
    let (mut logical, mut physical, mut shared) = (0u64, 0u64, Some(0u64));
    for (_, u) in &rows {
        if let Ok(u) = u {
            logical += u.logical_bytes;
            physical += u.physical_bytes;
            shared = shared.zip(u.shared_bytes).map(|(a, b)| a + b);
        }
    }
    if json {
        let layers: Vec<serde_json::Value> = rows
            .iter()
            .map(|(name, u)| match u {
                Ok(u) => serde_json::json!({
                    "name": name,
                    "logical_bytes": u.logical_bytes,
                    "physical_bytes": u.physical_bytes,
                    "shared_bytes": u.shared_bytes,
                }),
                Err(e) => serde_json::json!({"name": name, "error": e.to_string()}),
            })
            .collect();
        let v = serde_json::json!({
            "layers": layers,
            "total": {
                "logical_bytes": logical,
                "physical_bytes": physical,
                "shared_bytes": shared,
            },
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(());
    }
    let shared_text = |s: Option<u64>| s.map_or("unknown".to_string(), mib);
    writeln!(
        out,
        "{:<20} {:>12} {:>12} {:>12}",
        "NAME", "LOGICAL", "PHYSICAL", "SHARED"
    )?;
    for (name, u) in &rows {
        match u {
            Ok(u) => writeln!(
                out,
                "{name:<20} {:>12} {:>12} {:>12}",
                mib(u.logical_bytes),
                mib(u.physical_bytes),
                shared_text(u.shared_bytes)
            )?,
            Err(e) => writeln!(out, "{name:<20} UNREADABLE: {e}")?,
        }
    }
    writeln!(
        out,
        "{:<20} {:>12} {:>12} {:>12}",
        "total",
        mib(logical),
        mib(physical),
        shared_text(shared)
    )?;
    if let Some(s) = shared.filter(|&s| s > 0) {
        writeln!(
            out,
            "({} of the physical bytes are blocks shared with other files, counted in each; {} are not shared)",
            mib(s),
            mib(physical.saturating_sub(s))
        )?;
    }
    Ok(())
}
