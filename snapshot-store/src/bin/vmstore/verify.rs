//! `vmstore verify`: a chain, or every layer of the store.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use snapshot_store::{Progress, Store};

use super::{mib, progress};

/// Verifies the chain `spec` (only its changed files with `cached`), or
/// every layer with `all`, and prints the outcome (text, or JSON with
/// `json`). Exits 1 if anything is wrong.
pub fn run(
    store: &Store,
    spec: Option<String>,
    all: bool,
    cached: bool,
    json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    if all {
        return verify_all(store, json, out);
    }
    let spec = spec.context("a snapshot spec or --all is required")?;
    verify_spec(store, &spec, cached, json, out)
}

fn verify_all(store: &Store, json: bool, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    let p: &(dyn Fn(Progress<'_>) + Sync) = &progress;
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
    Ok(if bad > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn verify_spec(
    store: &Store,
    spec: &str,
    cached: bool,
    json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let p: &(dyn Fn(Progress<'_>) + Sync) = &progress;
    let verified = store.resolve(spec).and_then(|chain| {
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
