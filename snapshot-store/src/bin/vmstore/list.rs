//! `vmstore list`: every snapshot with its kind, parent, creation time and
//! sizes.

use std::io::Write;

use snapshot_store::Store;

use super::mib;

/// Prints the list (a table, or JSON with `json`).
pub fn run(store: &Store, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
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
    Ok(())
}
