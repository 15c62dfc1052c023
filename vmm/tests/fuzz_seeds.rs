//! The fuzz targets' checked-in seed corpus (`fuzz/seeds/<target>/`) still
//! means what its names say: every `valid-*` seed is accepted by its
//! target's parser and every `edge-*` seed is refused, every target has
//! both, and the whole corpus stays small.

use ignition_vmm::devices::virtio::vsock::muxer::parse_connect_line;
use ignition_vmm::machine::control_socket::parse_request;
use std::path::Path;

/// Largest total size of the seed corpus, in bytes.
const MAX_CORPUS_BYTES: u64 = 64 << 10;

/// Whether the parser that fuzz target `target` exercises accepts `bytes`.
fn accepts(target: &str, bytes: &[u8]) -> bool {
    match target {
        "control_request" => parse_request(bytes).is_ok(),
        "vsock_connect" => parse_connect_line(bytes).is_some(),
        other => panic!("unknown fuzz target {other}"),
    }
}

#[test]
fn seeds_are_valid_or_edge_cases_as_named() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let mut total = 0;
    for target in ["control_request", "vsock_connect"] {
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
