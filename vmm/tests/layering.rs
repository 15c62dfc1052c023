//! The crate's layers import one way only:
//!
//! ```text
//! arch <- memory <- {devices, hv} <- machine <- bin
//! ```
//!
//! This test reads every source file under `vmm/src` and fails on a
//! `crate::` or `super::` path that reaches a layer the file's layer may not
//! use:
//!
//! | layer     | may use                                                      |
//! |-----------|--------------------------------------------------------------|
//! | `arch`    | `arch`                                                       |
//! | `memory`  | `arch`                                                       |
//! | `devices` | `arch`, `memory`                                             |
//! | `hv`      | `arch`, `memory`                                             |
//! | others    | anything (`machine`, `console`, `lib.rs`, `bin/`)            |
//!
//! Inside `machine`, its wings import one way too (`machine/mod.rs`, which
//! runs the VM and serves its verbs, may use them all):
//!
//! ```text
//! {config, ops, device_manager, vcpu}
//!     <- {plan, console_input, control_socket, signals, agent, branch} <- vm <- snapshot <- mod.rs
//! ```
//!
//! | wing              | may use (of `machine`)                                   |
//! |-------------------|----------------------------------------------------------|
//! | `config`, `ops`   | itself                                                   |
//! | `device_manager`  | itself                                                   |
//! | `vcpu`            | itself                                                   |
//! | `console_input`, `control_socket`, `signals` | itself, `ops`                 |
//! | `agent`           | itself, `config`, `ops`                                  |
//! | `branch`          | itself, `config`, `ops`                                  |
//! | `plan`            | itself, `config`, `device_manager`, `vcpu`               |
//! | `vm`              | the above but the front-ends                             |
//! | `snapshot`        | the above, `vm`                                          |
//!
//! The crate-level utilities `sync`, `logging`, `host_socket`, `pipe` and
//! the `warn_ratelimited!` macro may be used from every layer. External crates are not checked.
//!
//! Test code counts like any other code: a `#[cfg(test)]` module that
//! imports from a higher layer makes the lower layer depend on it too. The
//! test-only helpers (`arch::esr_vectors`, `hv::fake`) live in the layer of
//! the tests that use them, so no exception is needed. Comments (doc links
//! included) and string literals are not code and are ignored.

use std::path::{Path, PathBuf};

/// Modules every layer may use.
const UTILITIES: &[&str] = &["sync", "logging", "warn_ratelimited", "host_socket", "pipe"];

/// The top-level modules a file of layer `layer` may reach, or `None` if the
/// layer is unconstrained.
fn allowed(layer: &str) -> Option<&'static [&'static str]> {
    match layer {
        "arch" => Some(&["arch"]),
        "memory" => Some(&["arch", "memory"]),
        "devices" => Some(&["arch", "memory", "devices"]),
        "hv" => Some(&["arch", "memory", "hv"]),
        _ => None,
    }
}

/// The wings of `machine` a file of wing `wing` may reach, or `None` if it
/// is unconstrained (`machine/mod.rs`).
fn machine_allowed(wing: &str) -> Option<&'static [&'static str]> {
    match wing {
        "config" => Some(&["config"]),
        "ops" => Some(&["ops"]),
        "device_manager" => Some(&["device_manager"]),
        "vcpu" => Some(&["vcpu"]),
        "console_input" => Some(&["console_input", "ops"]),
        "control_socket" => Some(&["control_socket", "ops"]),
        "signals" => Some(&["signals", "ops"]),
        "agent" => Some(&["agent", "config", "ops"]),
        "branch" => Some(&["branch", "config", "ops"]),
        "plan" => Some(&["config", "device_manager", "vcpu", "plan"]),
        "vm" => Some(&["config", "ops", "device_manager", "vcpu", "plan", "vm"]),
        "snapshot" => Some(&[
            "config",
            "ops",
            "device_manager",
            "vcpu",
            "plan",
            "vm",
            "snapshot",
        ]),
        _ => None,
    }
}

/// A token of Rust source with comments, strings and chars removed.
#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
}

/// Splits `src` into tokens with their line numbers, dropping comments
/// (nested block comments included), string, byte-string, raw-string,
/// character and byte literals. Lifetimes become identifiers.
fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let at = |i: usize| c.get(i).copied();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == Some('*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == Some('/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
            }
        } else if ch == '"' {
            // A string (also the body of a `b".."` literal): up to the
            // closing quote, skipping escapes.
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                }
                line += usize::from(at(i) == Some('\n'));
                i += 1;
            }
            i += 1;
        } else if ch == '\'' {
            if at(i + 1) == Some('\\') {
                // An escaped char: up to the closing quote.
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == Some('\'') {
                i += 3;
            } else {
                // A lifetime or label: its name follows as an identifier.
                i += 1;
            }
        } else if ch.is_alphanumeric() || ch == '_' || ch == '$' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_' || c[i] == '$') {
                i += 1;
            }
            let ident: String = c[start..i].iter().collect();
            // A raw string `r".."`, `r#".."#`, `br#".."#`: skip it whole.
            if matches!(ident.as_str(), "r" | "br") {
                let mut j = i;
                while at(j) == Some('#') {
                    j += 1;
                }
                if at(j) == Some('"') {
                    let hashes = j - i;
                    j += 1;
                    while j < c.len()
                        && !(c[j] == '"' && (1..=hashes).all(|k| at(j + k) == Some('#')))
                    {
                        line += usize::from(c[j] == '\n');
                        j += 1;
                    }
                    i = j + 1 + hashes;
                    continue;
                }
            }
            out.push((Tok::Ident(ident), line));
        } else if ch == ':' && at(i + 1) == Some(':') {
            out.push((Tok::Path, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// Parses a path or use tree starting at `toks[*i]` (just after a `::`),
/// appending every complete path (`prefix` + the tree's segments) to `out`.
fn use_tree(toks: &[(Tok, usize)], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    match toks.get(*i).map(|t| &t.0) {
        Some(Tok::Punct('{')) => {
            *i += 1;
            loop {
                match toks.get(*i).map(|t| &t.0) {
                    None => return,
                    Some(Tok::Punct('}')) => {
                        *i += 1;
                        return;
                    }
                    Some(Tok::Punct(',')) => *i += 1,
                    Some(_) => {
                        let before = *i;
                        use_tree(toks, i, prefix, out);
                        if *i == before {
                            *i += 1;
                        }
                    }
                }
            }
        }
        Some(Tok::Ident(name)) => {
            let mut path = prefix.to_vec();
            if name != "self" {
                path.push(name.clone());
            }
            *i += 1;
            if toks.get(*i).map(|t| &t.0) == Some(&Tok::Path) {
                *i += 1;
                use_tree(toks, i, &path, out);
            } else {
                out.push(path);
            }
        }
        // `*`, or `<` of a generic argument list: the path so far.
        _ => out.push(prefix.to_vec()),
    }
}

/// The module path of a file under `src/` (`hv/emu/mod.rs` is `hv::emu`).
fn module_path(rel: &str) -> Vec<String> {
    let rel = rel.strip_suffix(".rs").unwrap_or(rel);
    let mut parts: Vec<String> = rel.split('/').map(str::to_owned).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// Every crate-internal path in `src` (a file at `rel` under `src/`),
/// resolved to an absolute module path, with its line.
fn crate_paths(rel: &str, src: &str) -> Vec<(Vec<String>, usize)> {
    let toks = tokens(src);
    let file_mod = module_path(rel);
    // Inline modules (`mod name { .. }`) and the brace depth they opened at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let (tok, line) = (&toks[i].0, toks[i].1);
        match tok {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|&(_, d)| d == depth) {
                    inline.pop();
                }
            }
            Tok::Ident(kw) if kw == "mod" => {
                if let (Some((Tok::Ident(name), _)), Some((Tok::Punct('{'), _))) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    inline.push((name.clone(), depth));
                }
            }
            Tok::Ident(kw) if kw == "crate" || kw == "super" => {
                let preceded_by_path = i > 0 && toks[i - 1].0 == Tok::Path;
                if !preceded_by_path && toks.get(i + 1).map(|t| &t.0) == Some(&Tok::Path) {
                    let base: Vec<String> = if kw == "crate" {
                        i += 2;
                        Vec::new()
                    } else {
                        let mut here: Vec<String> = file_mod.clone();
                        here.extend(inline.iter().map(|(n, _)| n.clone()));
                        while matches!(&toks.get(i).map(|t| &t.0), Some(Tok::Ident(s)) if s == "super")
                            && toks.get(i + 1).map(|t| &t.0) == Some(&Tok::Path)
                        {
                            assert!(
                                !here.is_empty(),
                                "{rel}:{line}: `super` above the crate root"
                            );
                            here.pop();
                            i += 2;
                        }
                        here
                    };
                    let mut paths = Vec::new();
                    use_tree(&toks, &mut i, &base, &mut paths);
                    out.extend(paths.into_iter().map(|p| (p, line)));
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The layering violations of the file `rel` (relative to `src/`) with
/// source `src`, as messages.
fn violations(rel: &str, src: &str) -> Vec<String> {
    let layer = module_path(rel).first().cloned().unwrap_or_default();
    if layer == "machine" {
        return wing_violations(rel, src);
    }
    let Some(ok) = allowed(&layer) else {
        return Vec::new();
    };
    crate_paths(rel, src)
        .into_iter()
        .filter(|(path, _)| {
            let Some(top) = path.first() else {
                return false; // `crate::{..}` with nothing after it
            };
            !ok.contains(&top.as_str()) && !UTILITIES.contains(&top.as_str())
        })
        .map(|(path, line)| {
            format!(
                "src/{rel}:{line}: `crate::{}`: the `{layer}` layer may use only {ok:?} (and {UTILITIES:?})",
                path.join("::")
            )
        })
        .collect()
}

/// The violations of a file of `machine`: a path into a wing its own wing
/// may not use.
fn wing_violations(rel: &str, src: &str) -> Vec<String> {
    let Some(wing) = module_path(rel).get(1).cloned() else {
        return Vec::new();
    };
    let Some(ok) = machine_allowed(&wing) else {
        return Vec::new();
    };
    crate_paths(rel, src)
        .into_iter()
        .filter(|(path, _)| {
            path.first().map(String::as_str) == Some("machine")
                && path.get(1).is_some_and(|w| {
                    machine_allowed(w).is_some() && !ok.contains(&w.as_str())
                })
        })
        .map(|(path, line)| {
            format!(
                "src/{rel}:{line}: `crate::{}`: the `machine::{wing}` wing may use only {ok:?} of `machine`",
                path.join("::")
            )
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn layers_import_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    assert!(
        files.len() > 20,
        "found only {} files in {src:?}",
        files.len()
    );
    let mut bad = Vec::new();
    for f in &files {
        let rel = f
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        bad.extend(violations(&rel, &std::fs::read_to_string(f).unwrap()));
    }
    assert!(bad.is_empty(), "layering violations:\n{}", bad.join("\n"));
}

#[test]
fn the_checker_sees_what_it_must() {
    fn v(rel: &str, src: &str) -> usize {
        violations(rel, src).len()
    }
    // Plain and grouped imports, expressions and macros.
    assert_eq!(v("arch/esr.rs", "use crate::hv::{self, Vcpu};"), 2);
    assert_eq!(
        v("arch/x.rs", "use crate::{arch::layout, memory::GuestRam};"),
        1
    );
    assert_eq!(v("arch/x.rs", "fn f() { crate::hv::gic::f(); }"), 1);
    assert_eq!(
        v("arch/x.rs", "use crate::arch::{layout::{A, B}, sysreg};"),
        0
    );
    assert_eq!(
        v(
            "devices/x.rs",
            "crate::warn_ratelimited!(\"a\"); use crate::sync::Locked;"
        ),
        0
    );
    assert_eq!(v("devices/x.rs", "use crate::hv::MmioFault;"), 1);
    assert_eq!(v("memory.rs", "use crate::arch::layout::PAGE_SIZE;"), 0);
    assert_eq!(v("memory.rs", "use crate::devices::bus;"), 1);
    // `hv` and `devices` are siblings: neither reaches the other.
    assert_eq!(v("hv/mod.rs", "pub use crate::devices::bus::MmioFault;"), 1);
    assert_eq!(v("hv/emu/vm.rs", "use crate::devices::bus::MmioFault;"), 1);
    assert_eq!(v("hv/mod.rs", "use crate::devices::bus::MmioBus;"), 1);
    // `super` resolves against the file and its inline modules.
    assert_eq!(v("hv/emu/vcpu.rs", "use super::super::machine::X;"), 0);
    assert_eq!(
        v("hv/emu/vcpu.rs", "use super::super::super::machine::X;"),
        1
    );
    let nested = "mod tests { mod inner { use super::super::super::SUPER::hv::X; } }";
    assert_eq!(v("arch/esr.rs", &nested.replace("SUPER::", "")), 0);
    assert_eq!(v("arch/esr.rs", &nested.replace("SUPER", "super")), 1);
    // An inline module ends with its braces.
    let after = "mod tests { fn f() { if true {} } } use super::hv::X;";
    assert_eq!(v("arch/esr.rs", after), 0);
    assert_eq!(
        v("arch/esr.rs", &after.replace("super::", "super::super::")),
        1
    );
    assert_eq!(
        v("arch/esr.rs", "mod tests { use super::super::layout; }"),
        0
    );
    assert_eq!(
        v("arch/esr.rs", "pub(super) fn f() {} pub(crate) fn g() {}"),
        0
    );
    // Test code counts.
    assert_eq!(
        v(
            "arch/x.rs",
            "#[cfg(test)] mod tests { use crate::hv::fake::FakeVcpu; }"
        ),
        1
    );
    // Comments, doc links, strings and chars are not code.
    let quiet = "// crate::hv::X\n/// [`crate::hv::Vcpu`]\n/* /* crate::hv */ crate::hv */\n\
                 const S: &str = \"crate::hv::X\"; const R: &str = r#\"crate::hv\"#;\n\
                 const C: char = '\"'; fn f<'a>(x: &'a u8) {}";
    assert_eq!(v("arch/x.rs", quiet), 0);
    assert_eq!(v("arch/x.rs", &format!("{quiet}\nuse crate::hv::Reg;")), 1);
    // Unconstrained layers.
    assert_eq!(
        v(
            "machine/mod.rs",
            "use crate::hv::Vcpu; use crate::devices::MmioBus;"
        ),
        0
    );
    assert_eq!(v("bin/boot.rs", "use crate::machine;"), 0);
    // The wings of `machine`: downwards only, and `super` counts.
    assert_eq!(v("machine/vm.rs", "use crate::machine::vcpu::Start;"), 0);
    assert_eq!(
        v("machine/vm.rs", "use super::snapshot::save::Snapshots;"),
        1
    );
    assert_eq!(
        v("machine/vcpu/mod.rs", "use super::run_state::RunState;"),
        0
    );
    assert_eq!(v("machine/vcpu/psci.rs", "use super::super::vm::Vmm;"), 1);
    assert_eq!(
        v(
            "machine/device_manager/mod.rs",
            "use crate::machine::vcpu::X;"
        ),
        1
    );
    assert_eq!(
        v("machine/control_socket.rs", "use crate::machine::vm::Vmm;"),
        1
    );
    assert_eq!(
        v("machine/snapshot/save.rs", "use crate::machine::vm::Vmm;"),
        0
    );
    assert_eq!(v("machine/mod.rs", "use snapshot::save::Snapshots;"), 0);
}
