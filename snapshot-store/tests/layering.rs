//! The crate's modules form layers with no import cycle: `src/lib.rs`
//! declares them in groups, bottom first, and a module may import only from
//! modules of the groups above its own, naming the module (an import through
//! the crate root's re-exports would hide the dependency). Also: no file's
//! code outside its tests is longer than [`MAX_LINES`].
//!
//! Read from the source text: each file up to its `#[cfg(test)]` line
//! (tests may build fixtures with any module), comments skipped, every
//! `crate::` path taken by its first segment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Longest file, in lines of code before its tests.
const MAX_LINES: usize = 700;

/// `(module, group)` in declaration order, from the `mod NAME;` lines of
/// `lib.rs`; a blank line after a group's last `mod` starts the next group.
fn declared_layers(lib: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let mut group = 0;
    let mut open = false;
    for line in lib.lines() {
        let t = line.trim();
        let decl = t.strip_prefix("pub ").unwrap_or(t);
        if let Some(name) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
            out.push((name.to_string(), group));
            open = true;
        } else if t.is_empty() && open {
            group += 1;
            open = false;
        }
    }
    out
}

/// The code of a source file: lines before `#[cfg(test)]`, without
/// comments.
fn code(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        let line = match line.find(" //") {
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn ident_prefix(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first segment of every `crate::` path in `code`, with a `use
/// crate::{a::x, b}` group giving each of its items.
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        let after = &rest[i + "crate::".len()..];
        rest = after;
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        if let Some(group) = after.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            let mut items = Vec::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        items.push(std::mem::take(&mut item));
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            items.push(item);
            out.extend(
                items
                    .iter()
                    .map(|s| ident_prefix(s.trim()).to_string())
                    .filter(|s| !s.is_empty()),
            );
        } else {
            out.push(ident_prefix(after).to_string());
        }
    }
    out
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn modules_import_only_from_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let layers: BTreeMap<String, usize> = declared_layers(&lib).into_iter().collect();
    assert!(
        layers.len() > 10,
        "no module declarations found: {layers:?}"
    );
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut problems = Vec::new();
    let mut seen = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap();
        if rel == Path::new("lib.rs") || first == "bin" {
            continue;
        }
        let module = first.strip_suffix(".rs").unwrap_or(first);
        let Some(&group) = layers.get(module) else {
            problems.push(format!(
                "{}: module {module} is not declared in lib.rs",
                rel.display()
            ));
            continue;
        };
        seen.push(module.to_string());
        let code = code(&std::fs::read_to_string(file).unwrap());
        let lines = code.lines().count();
        if lines > MAX_LINES {
            problems.push(format!(
                "{}: {lines} lines of code outside its tests, more than {MAX_LINES}: split it",
                rel.display()
            ));
        }
        for target in crate_paths(&code) {
            if target == module {
                continue;
            }
            match layers.get(&target) {
                None => problems.push(format!(
                    "{}: crate::{target} goes through the crate root; import it from its module",
                    rel.display()
                )),
                Some(&g) if g >= group => problems.push(format!(
                    "{}: {module} (layer {group}) imports {target} (layer {g}), which is not below it",
                    rel.display()
                )),
                Some(_) => {}
            }
        }
    }
    for module in layers.keys() {
        if !seen.contains(module) {
            problems.push(format!("module {module} has no file under src/"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_checker_sees_what_it_checks() {
    let lib = "mod a;\nmod b;\n\n// next\nmod c;\n";
    assert_eq!(
        declared_layers(lib),
        [("a".into(), 0), ("b".into(), 0), ("c".into(), 1)]
    );
    let src = "use crate::x::Y;\nuse crate::{\n    a::{B, C},\n    d,\n};\n// crate::hidden\nlet _ = crate::e::f(); // crate::g\nsnapshot_crate::h;\n#[cfg(test)]\nuse crate::t;\n";
    assert_eq!(crate_paths(&code(src)), ["x", "a", "d", "e"]);
}
