//! The `vmstore` binary on a store built with the library.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use common::*;
use snapshot_store::Store;

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn vmstore(store: &Path, args: &[&str]) -> Out {
    let o = Command::new(env!("CARGO_BIN_EXE_vmstore"))
        .arg("--store")
        .arg(store)
        .args(args)
        .output()
        .unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8(o.stdout).unwrap(),
        stderr: String::from_utf8(o.stderr).unwrap(),
    }
}

fn ok(store: &Path, args: &[&str]) -> String {
    let o = vmstore(store, args);
    assert_eq!(
        o.code, 0,
        "{args:?}: stdout {} stderr {}",
        o.stdout, o.stderr
    );
    o.stdout
}

/// Runs `args`, expects exit 1 and a one-line error containing `needle`.
fn fails(store: &Path, args: &[&str], needle: &str) -> Out {
    let o = vmstore(store, args);
    assert_eq!(
        o.code, 1,
        "{args:?}: stdout {} stderr {}",
        o.stdout, o.stderr
    );
    assert!(
        o.stderr.contains(needle) || o.stdout.contains(needle),
        "{args:?}: expected {needle:?} in stdout {} stderr {}",
        o.stdout,
        o.stderr
    );
    o
}

fn fixture() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::create(dir.path().join("vmstore")).unwrap();
    let disk = dir.path().join("disk.img");
    disk_image(&disk, 9);
    let mut ram = vec![0u8; 16 * PS as usize];
    Rng(3).fill(&mut ram);
    let g = full(&s, "golden", &ram, b"g", Some(&disk));
    ram[5] = 1;
    let d1 = diff(&s, "d1", &g, &ram, &[0, 7], b"d1", Some(&disk));
    ram[PS as usize * 15] = 2;
    diff(&s, "d2", &d1, &ram, &[15], b"d2", Some(&disk));
    (dir, s)
}

#[test]
fn help_everywhere() {
    let d = tempfile::tempdir().unwrap();
    let top = ok(d.path(), &["--help"]);
    assert!(top.contains("NAME+N") && top.contains("squash"), "{top}");
    assert!(top.contains("Exit status: 0 on success; 1"), "{top}");
    for sub in [
        "list", "tree", "du", "inspect", "verify", "remove", "gc", "squash",
    ] {
        let h = ok(d.path(), &[sub, "--help"]);
        assert!(h.contains("Usage: vmstore"), "{sub}: {h}");
    }
}

#[test]
fn list_and_inspect() {
    let (_d, s) = fixture();
    let root = s.root();
    let out = ok(root, &["list"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert!(lines[0].starts_with("NAME"));
    assert!(lines[1].starts_with("d1") && lines[1].contains("diff") && lines[1].contains("golden"));
    assert!(lines[1].trim_end().ends_with(" 2"), "{out}");
    assert!(lines[3].starts_with("golden") && lines[3].contains("full"));
    let v: serde_json::Value = serde_json::from_str(&ok(root, &["list", "--json"])).unwrap();
    assert_eq!(v[0]["name"], "d1");
    assert_eq!(v[0]["pages"], 2);
    assert_eq!(v[2]["kind"], "full");
    assert!(v[2]["logical_bytes"].as_u64().unwrap() >= 16 * PS);
    assert!(v[2]["physical_bytes"].as_u64().unwrap() > 0);

    let out = ok(root, &["inspect", "d1"]);
    assert!(out.contains("kind:           diff"), "{out}");
    assert!(out.contains("chain:          golden -> d1"), "{out}");
    assert!(out.contains("children:       d2"), "{out}");
    assert!(out.contains("diff pages:     2"), "{out}");
    // The 64 KiB test disk is one (short) chunk.
    assert!(
        out.contains("disk:           64.0 KiB in 1 chunks of 256 KiB"),
        "{out}"
    );
    assert!(out.contains("file:           disk.chunks"), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&ok(root, &["inspect", "d2", "--json"])).unwrap();
    assert_eq!(v["manifest"]["name"], "d2");
    assert_eq!(v["manifest"]["parent"]["name"], "d1");
    assert_eq!(v["chain"], serde_json::json!(["golden", "d1", "d2"]));
    assert_eq!(v["content_sha256"], s.layer("d2").unwrap().content_sha256);
    assert_eq!(v["disk_chunks"], 1);
    assert_eq!(v["manifest"]["disk"]["chunk_size"], 256 * 1024);

    let o = fails(
        root,
        &["inspect", "nope"],
        "vmstore: error: snapshot 'nope' not found",
    );
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    let empty = tempfile::tempdir().unwrap();
    assert!(ok(empty.path(), &["list"]).contains("is empty"));
    fails(
        &empty.path().join("none"),
        &["list"],
        "no such store directory",
    );
}

#[test]
fn verify_detects_corruption() {
    let (_d, s) = fixture();
    let root = s.root();
    let out = ok(root, &["verify", "d2"]);
    assert!(
        out.starts_with("ok d2: golden -> d1 -> d2 (3 layers, 15 files"),
        "{out}"
    );
    assert!(ok(root, &["verify", "golden+1"]).starts_with("ok golden+1: golden -> d1"));
    let out = ok(root, &["verify", "--all"]);
    assert!(out.contains("all 3 snapshot(s) verified"), "{out}");

    make_writable(root);
    let p = root.join("golden/memory.bin");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, 100).unwrap();
    f.write_all_at(&[b[0] ^ 4], 100).unwrap();
    let o = fails(
        root,
        &["verify", "d2"],
        "golden/memory.bin: sha256 mismatch",
    );
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    let o = fails(root, &["verify", "--all"], "FAIL golden");
    assert!(
        o.stdout.contains("ok   d1") && o.stdout.contains("1 of 3"),
        "{}",
        o.stdout
    );
    fails(root, &["squash", "d2", "--name", "flat"], "sha256 mismatch");
    assert!(!s.contains("flat"));
    f.write_all_at(&b, 100).unwrap();
    ok(root, &["verify", "d2"]);

    fails(root, &["verify", "golden+3"], "too short");
    fails(root, &["verify", "a+b"], "invalid snapshot spec");
    let o = vmstore(root, &["verify"]);
    assert_eq!(o.code, 2, "usage error: {}", o.stderr);
}

#[test]
fn remove_gc_squash() {
    let (_d, s) = fixture();
    let root = s.root();
    fails(root, &["remove", "d1"], "has children (d2)");

    let stale = root.join(format!(".tmp-x-{}-0000000000000001", dead_pid()));
    std::fs::create_dir(&stale).unwrap();
    let out = ok(root, &["gc"]);
    assert!(
        out.contains("removed .tmp-x-") && out.contains("gc: removed 1 work directory"),
        "{out}"
    );
    assert!(!stale.exists());

    let o = vmstore(root, &["squash", "d2", "--name", "flat"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("squashed d2 into full snapshot 'flat'"),
        "{}",
        o.stdout
    );
    assert!(
        o.stderr.contains("vmstore: resolving and verifying 'd2'"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("vmstore: committing"), "{}", o.stderr);
    assert!(ok(root, &["verify", "flat"]).starts_with("ok flat: flat (1 layers"));
    let chain = s.resolve("d2").unwrap();
    let want = snapshot_store::map_chain_memory(&chain).unwrap();
    assert_eq!(
        std::fs::read(root.join("flat/memory.bin")).unwrap(),
        &want[..]
    );
    assert_eq!(
        std::fs::read(root.join("flat/disk.img")).unwrap(),
        std::fs::read(root.join("d2/disk.img")).unwrap()
    );
    // The squashed layer's chunk list is the top layer's.
    assert_eq!(
        std::fs::read(root.join("flat/disk.chunks")).unwrap(),
        std::fs::read(root.join("d2/disk.chunks")).unwrap()
    );
    assert_eq!(
        s.layer("flat").unwrap().manifest.disk,
        s.layer("d2").unwrap().manifest.disk
    );
    fails(root, &["squash", "d2", "--name", "flat"], "already exists");
    fails(
        root,
        &["squash", "d2", "--name", "bad+name"],
        "invalid snapshot name",
    );

    let out = ok(root, &["remove", "d1", "--recursive"]);
    assert_eq!(out, "removed d2\nremoved d1\n");
    assert_eq!(s.layer_names().unwrap(), vec!["flat", "golden"]);
    ok(root, &["remove", "flat"]);
    fails(root, &["remove", "flat"], "not found");
}

#[test]
fn verify_cached() {
    let (_d, s) = fixture();
    let root = s.root();
    make_writable(root);
    settle();
    // A full verification hashes everything and records it.
    let out = ok(root, &["verify", "d2"]);
    assert!(
        out.starts_with("ok d2: golden -> d1 -> d2 (3 layers, 15 files, ")
            && !out.contains("unchanged"),
        "{out}"
    );
    let out = ok(root, &["verify", "--cached", "d2"]);
    assert!(
        out.starts_with("ok d2: golden -> d1 -> d2 (3 layers, 15 files, 0 B hashed, 15 files (")
            && out.contains("unchanged since verified"),
        "{out}"
    );
    // A change with the mtime put back is still found.
    let p = root.join("golden/memory.bin");
    flip_keep_times(&p, 100, 4);
    let o = fails(
        root,
        &["verify", "--cached", "d2"],
        "golden/memory.bin: sha256 mismatch",
    );
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    flip_keep_times(&p, 100, 4);
    let out = ok(root, &["verify", "--cached", "d2"]);
    assert!(out.contains(", 14 files ("), "{out}");
    // A bad cache is reported on stderr, not fatal.
    std::fs::write(
        root.join("d1")
            .join(snapshot_store::format::verified::VERIFIED_FILE),
        b"[",
    )
    .unwrap();
    let o = vmstore(root, &["verify", "--cached", "d2"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stderr.contains("d1/verified.json: ignored (malformed"),
        "{}",
        o.stderr
    );
    let o = vmstore(root, &["verify", "--cached", "--all"]);
    assert_eq!(o.code, 2, "usage error: {}", o.stderr);
}

#[test]
fn tree_shows_chains_and_orphans() {
    let (d, s) = fixture();
    let root = s.root();
    // A second child of golden and a second root.
    let mut ram = vec![0u8; 16 * PS as usize];
    Rng(3).fill(&mut ram);
    let g = s.layer("golden").unwrap();
    diff(&s, "e1", &g, &ram, &[3], b"e1", None);
    full(&s, "other", &ram, b"o", None);
    let out = ok(root, &["tree"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 5, "{out}");
    assert!(lines[0].starts_with("golden  full  "), "{out}");
    assert!(lines[1].starts_with("├── d1  diff 2 pages  "), "{out}");
    assert!(lines[2].starts_with("│   └── d2  diff 1 pages  "), "{out}");
    assert!(lines[3].starts_with("└── e1  diff 1 pages  "), "{out}");
    assert!(lines[4].starts_with("other  full  "), "{out}");
    let v: serde_json::Value = serde_json::from_str(&ok(root, &["tree", "--json"])).unwrap();
    assert_eq!(v["roots"][0]["name"], "golden");
    assert_eq!(v["roots"][0]["children"][0]["children"][0]["name"], "d2");
    assert_eq!(v["roots"][0]["children"][1]["pages"], 1);
    assert!(v["roots"][0]["physical_bytes"].as_u64().unwrap() > 0);
    assert_eq!(v["unreadable"], serde_json::json!([]));
    // A layer whose parent is gone is a root that says so; an unreadable
    // layer is listed apart.
    make_writable(root);
    std::fs::rename(root.join("golden"), d.path().join("golden-away")).unwrap();
    std::fs::write(root.join("d2").join("manifest.json"), b"{").unwrap();
    let out = ok(root, &["tree"]);
    assert!(
        out.contains("d1  diff 2 pages") && out.contains("(parent 'golden' is missing)"),
        "{out}"
    );
    assert!(out.contains("d2  UNREADABLE: "), "{out}");
}

#[test]
fn du_reports_every_layer_and_the_total() {
    let (_d, s) = fixture();
    let root = s.root();
    let out = ok(root, &["du"]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("SHARED"),
        "{out}"
    );
    assert!(
        lines[1].starts_with("d1 ") && lines[3].starts_with("golden "),
        "{out}"
    );
    assert!(lines[4].starts_with("total "), "{out}");
    let v: serde_json::Value = serde_json::from_str(&ok(root, &["du", "--json"])).unwrap();
    let layers = v["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 3);
    let sum = |k: &str| -> u64 { layers.iter().map(|l| l[k].as_u64().unwrap()).sum() };
    assert_eq!(
        v["total"]["logical_bytes"].as_u64().unwrap(),
        sum("logical_bytes")
    );
    assert_eq!(
        v["total"]["physical_bytes"].as_u64().unwrap(),
        sum("physical_bytes")
    );
    assert!(layers[2]["logical_bytes"].as_u64().unwrap() >= 16 * PS);
    // Linux answers FIEMAP on the file systems tests run on; shared bytes
    // never exceed the allocated ones.
    for l in layers {
        match l["shared_bytes"].as_u64() {
            Some(sh) => assert!(sh <= l["physical_bytes"].as_u64().unwrap(), "{l}"),
            None => assert!(l["shared_bytes"].is_null(), "{l}"),
        }
    }
}

#[test]
fn verify_and_gc_speak_json_and_exit_codes_follow_the_outcome() {
    let (_d, s) = fixture();
    let root = s.root();
    let v: serde_json::Value =
        serde_json::from_str(&ok(root, &["verify", "d2", "--json"])).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["snapshots"][0]["layers"], 3);
    let v: serde_json::Value =
        serde_json::from_str(&ok(root, &["verify", "--all", "--json"])).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["snapshots"].as_array().unwrap().len(), 3);
    let v: serde_json::Value = serde_json::from_str(&ok(root, &["gc", "--json"])).unwrap();
    assert_eq!(v, serde_json::json!({"removed": [], "kept": []}));
    // One corrupted byte: exit 1, the JSON names the file.
    make_writable(root);
    flip_keep_times(&root.join("d1").join("state.bin"), 57, 1);
    let o = vmstore(root, &["verify", "d2", "--json"]);
    assert_eq!(o.code, 1, "{}", o.stdout);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert!(
        v["snapshots"][0]["error"]
            .as_str()
            .unwrap()
            .contains("state.bin"),
        "{v}"
    );
    let o = vmstore(root, &["verify", "--all", "--json"]);
    assert_eq!(o.code, 1, "{}", o.stdout);
    // A usage error: exit 2.
    assert_eq!(vmstore(root, &["verify"]).code, 2);
    assert_eq!(vmstore(root, &["tree", "--bogus"]).code, 2);
}

#[test]
fn squash_and_remove_speak_json() {
    let (_d, s) = fixture();
    let root = s.root();
    let v: serde_json::Value =
        serde_json::from_str(&ok(root, &["squash", "d2", "--name", "flat", "--json"])).unwrap();
    let flat = s.layer("flat").unwrap();
    assert_eq!(
        v,
        serde_json::json!({
            "name": "flat", "kind": "full", "ram_size": 16 * PS,
            "content_sha256": flat.content_sha256,
        })
    );
    let v: serde_json::Value =
        serde_json::from_str(&ok(root, &["remove", "d1", "--recursive", "--json"])).unwrap();
    assert_eq!(v, serde_json::json!({"removed": ["d2", "d1"]}));
    assert_eq!(s.layer_names().unwrap(), vec!["flat", "golden"]);
}
