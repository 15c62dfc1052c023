//! The crate's modules form layers with no import cycle: `src/lib.rs`
//! declares them in groups, bottom first, and a module may import only from
//! modules of the groups above its own, naming the module (an import through
//! the crate root's re-exports would hide the dependency). A module with
//! submodules (`src/format/`, `src/writer/`, `src/oci/`) declares them the
//! same way in its own root file, and a submodule imports a sibling only
//! from a group above its own. Also, sizes: no file's code outside its
//! tests is longer than [`MAX_LINES`], and no function of the crate (its
//! library, `vmstore`, tests and examples) is longer than [`MAX_FN_LINES`].
//!
//! Read from the source text: each file up to its `#[cfg(test)]` line
//! (tests may build fixtures with any module), comments skipped, every
//! `crate::` path taken by its first segment, and every `crate::M::` or
//! `super::` path inside module `M` by the segment after it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Longest file, in lines of code before its tests.
const MAX_LINES: usize = 700;

/// Longest function, in lines from its signature to its closing brace.
const MAX_FN_LINES: usize = 100;

/// `(module, group)` in declaration order, from the `mod NAME;` lines of a
/// module's root file (`lib.rs`, `M.rs` or `M/mod.rs`); a blank line after
/// a group's last `mod` starts the next group.
fn declared_layers(root: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let mut group = 0;
    let mut open = false;
    for line in root.lines() {
        let t = line.trim();
        let decl = ["pub(crate) ", "pub(super) ", "pub "]
            .iter()
            .find_map(|p| t.strip_prefix(p))
            .unwrap_or(t);
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

/// The segment after `prefix` (e.g. `crate::`) in every path of `code`
/// that starts with it, with a `use crate::{a::x, b}` group giving each
/// of its items.
fn paths_after(code: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = code[from..].find(prefix).map(|i| from + i) {
        let before = code[..i].chars().next_back();
        let after = &code[i + prefix.len()..];
        from = i + prefix.len();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$' || c == ':') {
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
            out.extend(items.iter().map(|s| ident_prefix(s.trim()).to_string()));
        } else {
            out.push(ident_prefix(after).to_string());
        }
    }
    // `*`, and the `super` of `super::super::`, name no module.
    out.retain(|s| !s.is_empty() && s != "super" && s != "self");
    out
}

/// Every `.rs` file under `dir`, recursively, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The first component of `rel` (a path under a module directory) as a
/// module name: `format/diff.rs` -> `format`, `store.rs` -> `store`.
fn first_module(rel: &Path) -> String {
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_str()
        .unwrap();
    first.strip_suffix(".rs").unwrap_or(first).to_string()
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn modules_import_only_from_lower_layers() {
    let src = src();
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let layers: BTreeMap<String, usize> = declared_layers(&lib).into_iter().collect();
    assert!(
        layers.len() > 10,
        "no module declarations found: {layers:?}"
    );
    let mut problems = Vec::new();
    let mut seen = Vec::new();
    for file in rust_files(&src) {
        let rel = file.strip_prefix(&src).unwrap();
        let module = first_module(rel);
        if rel == Path::new("lib.rs") || module == "bin" {
            continue;
        }
        let Some(&group) = layers.get(&module) else {
            problems.push(format!(
                "{}: module {module} is not declared in lib.rs",
                rel.display()
            ));
            continue;
        };
        seen.push(module.clone());
        let code = code(&std::fs::read_to_string(&file).unwrap());
        let lines = code.lines().count();
        if lines > MAX_LINES {
            problems.push(format!(
                "{}: {lines} lines of code outside its tests, more than {MAX_LINES}: split it",
                rel.display()
            ));
        }
        for target in paths_after(&code, "crate::") {
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

/// The root file of module `m`, if `m` has submodules: `src/m.rs` or
/// `src/m/mod.rs` beside a directory `src/m/`.
fn module_root(src: &Path, m: &str) -> Option<PathBuf> {
    if !src.join(m).is_dir() {
        return None;
    }
    [src.join(format!("{m}.rs")), src.join(m).join("mod.rs")]
        .into_iter()
        .find(|p| p.is_file())
}

#[test]
fn submodules_import_only_from_lower_layers() {
    let src = src();
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let mut problems = Vec::new();
    let mut checked = Vec::new();
    for (m, _) in declared_layers(&lib) {
        let Some(root) = module_root(&src, &m) else {
            continue;
        };
        checked.push(m.clone());
        let layers: BTreeMap<String, usize> =
            declared_layers(&std::fs::read_to_string(&root).unwrap())
                .into_iter()
                .collect();
        let dir = src.join(&m);
        let mut seen = Vec::new();
        for file in rust_files(&dir) {
            if file == root {
                continue;
            }
            let rel = file.strip_prefix(&src).unwrap();
            let sub = first_module(file.strip_prefix(&dir).unwrap());
            let Some(&group) = layers.get(&sub) else {
                problems.push(format!(
                    "{}: module {m}::{sub} is not declared in {}",
                    rel.display(),
                    root.strip_prefix(&src).unwrap().display()
                ));
                continue;
            };
            seen.push(sub.clone());
            let code = code(&std::fs::read_to_string(&file).unwrap());
            let mut targets = paths_after(&code, &format!("crate::{m}::"));
            targets.extend(paths_after(&code, "super::"));
            for target in targets {
                match layers.get(&target) {
                    // An item of the module's root file, below every
                    // submodule.
                    None => {}
                    Some(_) if target == sub => {}
                    Some(&g) if g >= group => problems.push(format!(
                        "{}: {m}::{sub} (layer {group}) imports {m}::{target} (layer {g}), which is not below it",
                        rel.display()
                    )),
                    Some(_) => {}
                }
            }
        }
        for sub in layers.keys() {
            if !seen.contains(sub) {
                problems.push(format!("module {m}::{sub} has no file under src/{m}/"));
            }
        }
    }
    assert!(
        checked.iter().any(|m| m == "format"),
        "no module with submodules found: {checked:?}"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// `(name, first line (1-based), length in lines)` of every function in
/// `text` with a body, as rustfmt lays it out: from the `fn` line to the
/// first line that is its indentation followed by `}`.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let indent = &line[..line.len() - t.len()];
        let mut rest = t;
        for q in [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "const ",
            "async ",
            "unsafe ",
        ] {
            rest = rest.strip_prefix(q).unwrap_or(rest);
        }
        let Some(sig) = rest.strip_prefix("fn ") else {
            continue;
        };
        // The line that opens the body, or a declaration without one.
        let Some(open) = (i..lines.len()).find(|&j| {
            let l = lines[j].trim_end();
            l.ends_with('{') || l.ends_with(';') || l.ends_with('}')
        }) else {
            continue;
        };
        if !lines[open].trim_end().ends_with('{') {
            continue;
        }
        let close = format!("{indent}}}");
        if let Some(end) = (open + 1..lines.len()).find(|&j| lines[j] == close) {
            out.push((ident_prefix(sig).to_string(), i + 1, end - i + 1));
        }
    }
    out
}

#[test]
fn no_function_is_too_long() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut problems = Vec::new();
    let mut count = 0;
    for dir in ["src", "tests", "examples"] {
        for file in rust_files(&root.join(dir)) {
            let text = std::fs::read_to_string(&file).unwrap();
            for (name, line, len) in functions(&text) {
                count += 1;
                if len > MAX_FN_LINES {
                    problems.push(format!(
                        "{}:{line}: fn {name} is {len} lines, more than {MAX_FN_LINES}: split it",
                        file.strip_prefix(root).unwrap().display()
                    ));
                }
            }
        }
    }
    assert!(count > 100, "only {count} functions found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_checker_sees_what_it_checks() {
    let lib = "mod a;\npub(crate) mod b;\n\n// next\n#[cfg(feature = \"x\")]\npub mod c;\n";
    assert_eq!(
        declared_layers(lib),
        [("a".into(), 0), ("b".into(), 0), ("c".into(), 1)]
    );
    let src = "use crate::x::Y;\nuse crate::{\n    a::{B, C},\n    d,\n};\n// crate::hidden\nlet _ = crate::e::f(); // crate::g\nsnapshot_crate::h;\n#[cfg(test)]\nuse crate::t;\n";
    assert_eq!(paths_after(&code(src), "crate::"), ["x", "a", "d", "e"]);
    let sub =
        "use super::{a::X, b};\nuse crate::m::c::Y;\nuse crate::other::Z;\nsuper::super::d();\n";
    assert_eq!(paths_after(sub, "super::"), ["a", "b"]);
    assert_eq!(paths_after(sub, "crate::m::"), ["c"]);
    let f = "fn a() {\n    x();\n}\n\nimpl T {\n    pub(crate) fn b(\n        y: u8,\n    ) -> u8 {\n        y\n    }\n    fn c(&self);\n    fn d() -> u8 { 1 }\n}\n";
    assert_eq!(
        functions(f),
        [("a".to_string(), 1, 3), ("b".to_string(), 6, 5)]
    );
}
