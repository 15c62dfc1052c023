//! `vmstore tree`: the store's chains as a tree.

use std::collections::BTreeMap;
use std::io::Write;

use snapshot_store::{ListEntry, Store};

use super::mib;

/// A layer with its descendants.
#[derive(serde::Serialize)]
struct Node {
    name: String,
    kind: String,
    /// Pages of a diff.
    #[serde(skip_serializing_if = "Option::is_none")]
    pages: Option<u64>,
    physical_bytes: u64,
    /// A diff whose parent is not in the store.
    #[serde(skip_serializing_if = "Option::is_none")]
    missing_parent: Option<String>,
    children: Vec<Node>,
}

/// The tree: roots are full layers and diffs whose parent is missing;
/// unreadable layers are listed apart with their errors.
#[derive(serde::Serialize)]
struct Forest {
    roots: Vec<Node>,
    unreadable: Vec<BTreeMap<&'static str, String>>,
}

fn forest(entries: &[ListEntry]) -> Forest {
    let mut children: BTreeMap<&str, Vec<&ListEntry>> = BTreeMap::new();
    let mut roots = Vec::new();
    let mut unreadable = Vec::new();
    let present: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    for e in entries {
        match &e.summary {
            Ok(s) => match &s.parent {
                Some(p) if present.contains(&p.as_str()) => {
                    children.entry(p.as_str()).or_default().push(e)
                }
                _ => roots.push(e),
            },
            Err(err) => unreadable.push(BTreeMap::from([
                ("name", e.name.clone()),
                ("error", err.to_string()),
            ])),
        }
    }
    fn node(e: &ListEntry, children: &BTreeMap<&str, Vec<&ListEntry>>, depth: usize) -> Node {
        let s = e.summary.as_ref().expect("only readable layers are nodes");
        let kids = children.get(e.name.as_str()).map_or(&[][..], |v| &v[..]);
        Node {
            name: e.name.clone(),
            kind: s.kind.to_string(),
            pages: s.pages,
            physical_bytes: s.physical_bytes,
            missing_parent: s.parent.clone().filter(|_| depth == 0),
            // Chains are bounded (MAX_CHAIN_DEPTH) and parent links cannot
            // form a cycle (a parent is pinned by its content hash).
            children: kids.iter().map(|k| node(k, children, depth + 1)).collect(),
        }
    }
    Forest {
        roots: roots.iter().map(|e| node(e, &children, 0)).collect(),
        unreadable,
    }
}

fn print(
    out: &mut dyn Write,
    n: &Node,
    prefix: &str,
    last: bool,
    top: bool,
) -> std::io::Result<()> {
    let (branch, next) = match (top, last) {
        (true, _) => ("", String::new()),
        (false, true) => ("└── ", format!("{prefix}    ")),
        (false, false) => ("├── ", format!("{prefix}│   ")),
    };
    let what = match n.pages {
        Some(p) => format!("{} {p} pages", n.kind),
        None => n.kind.clone(),
    };
    let orphan = n
        .missing_parent
        .as_ref()
        .map_or(String::new(), |p| format!("  (parent '{p}' is missing)"));
    writeln!(
        out,
        "{prefix}{branch}{}  {what}  {}{orphan}",
        n.name,
        mib(n.physical_bytes)
    )?;
    for (i, c) in n.children.iter().enumerate() {
        print(out, c, &next, i + 1 == n.children.len(), false)?;
    }
    Ok(())
}

/// Prints the tree (text, or JSON with `json`).
pub fn run(store: &Store, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let f = forest(&store.list()?);
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&f)?)?;
        return Ok(());
    }
    if f.roots.is_empty() && f.unreadable.is_empty() {
        writeln!(out, "store {} is empty", store.root().display())?;
    }
    for r in &f.roots {
        print(out, r, "", true, true)?;
    }
    for u in &f.unreadable {
        writeln!(out, "{}  UNREADABLE: {}", u["name"], u["error"])?;
    }
    Ok(())
}
