//! The fuzz targets' checked-in seed corpus (`fuzz/seeds/<target>/`,
//! written by `examples/fuzz_seeds.rs`) still means what its names say:
//! every `valid-*` seed is accepted by its target's parser and every
//! `edge-*` seed is rejected, every target has both, and the whole corpus
//! stays small. After a format change, regenerate it with
//! `cargo run -p snapshot-store --example fuzz_seeds`.

use std::path::Path;

use snapshot_store::format::chunks::parse_disk_chunks;
use snapshot_store::format::diff::parse_diff_file;
use snapshot_store::format::disk_diff::parse_disk_diff_prefix;
use snapshot_store::format::manifest::parse_manifest;
use snapshot_store::format::state::parse_state;
use snapshot_store::format::verified::parse_verified;

/// Largest total size of the seed corpus, in bytes.
const MAX_CORPUS_BYTES: u64 = 1 << 20;

/// Whether the parser that fuzz target `target` exercises accepts `bytes`
/// as a whole file.
fn accepts(target: &str, bytes: &[u8]) -> bool {
    match target {
        "manifest" => parse_manifest(bytes).is_ok(),
        "diff" => parse_diff_file(bytes).is_ok(),
        "state" => parse_state(bytes).is_ok(),
        "disk_chunks" => parse_disk_chunks(bytes).is_ok(),
        "disk_diff" => parse_disk_diff_prefix(bytes).is_ok(),
        "verified" => parse_verified(bytes).is_ok(),
        other => panic!("unknown fuzz target {other}"),
    }
}

#[test]
fn seeds_are_valid_or_edge_cases_as_named() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let mut total = 0;
    for target in [
        "manifest",
        "diff",
        "state",
        "disk_chunks",
        "disk_diff",
        "verified",
    ] {
        let (mut valid, mut edge) = (0, 0);
        for e in std::fs::read_dir(root.join(target)).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_str().unwrap().to_string();
            let bytes = std::fs::read(&p).unwrap();
            total += bytes.len() as u64;
            if name.starts_with("valid-") {
                assert!(accepts(target, &bytes), "{target}/{name} is refused");
                valid += 1;
            } else if name.starts_with("edge-") {
                assert!(!accepts(target, &bytes), "{target}/{name} is accepted");
                edge += 1;
            } else {
                panic!("{target}/{name}: a seed is named valid-* or edge-*");
            }
        }
        assert!(
            valid > 0 && edge > 0,
            "{target}: {valid} valid, {edge} edge seeds"
        );
    }
    assert!(total <= MAX_CORPUS_BYTES, "seed corpus is {total} bytes");
}
