//! The fuzz targets' checked-in seed corpus (`fuzz/seeds/<target>/`) still
//! means what its names say (`seed_corpus::check`).

#[path = "../../snapshot-store/tests/common/seed_corpus.rs"]
mod seed_corpus;

use ignition_vmm::devices::virtio::vsock::muxer::parse_connect_line;
use ignition_vmm::machine::control_socket::parse_request;
use std::path::Path;

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
    seed_corpus::check(
        &root,
        &["control_request", "vsock_connect"],
        accepts,
        64 << 10,
    );
}
