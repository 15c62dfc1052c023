//! The fuzz targets' checked-in seed corpus (`fuzz/seeds/<target>/`,
//! written by `examples/fuzz_seeds.rs`) still means what its names say
//! ([`seed_corpus::check`]). After a format change, regenerate it with
//! `cargo run -p snapshot-store --example fuzz_seeds`.

#[path = "common/seed_corpus.rs"]
mod seed_corpus;

use std::path::Path;

use snapshot_store::format::chunks::parse_disk_chunks;
use snapshot_store::format::diff::parse_diff_file;
use snapshot_store::format::disk_diff::parse_disk_diff_prefix;
use snapshot_store::format::manifest::parse_manifest;
use snapshot_store::format::state::parse_state;
use snapshot_store::format::verified::parse_verified;

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
    let targets = [
        "manifest",
        "diff",
        "state",
        "disk_chunks",
        "disk_diff",
        "verified",
    ];
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    seed_corpus::check(&root, &targets, accepts, 1 << 20);
}
