//! The fuzz target's checked-in seed corpus (`fuzz/seeds/agent_responses/`)
//! still means what its names say: every `valid-*` seed is a response
//! stream the client takes, every `edge-*` seed is refused, there are
//! both, and the corpus stays small.

use agent_client::frame::check_responses;
use std::path::Path;

/// Largest total size of the seed corpus, in bytes.
const MAX_CORPUS_BYTES: u64 = 16 << 10;

#[test]
fn seeds_are_valid_or_edge_cases_as_named() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/agent_responses");
    let (mut valid, mut edge, mut total) = (0, 0, 0);
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        let bytes = std::fs::read(&p).unwrap();
        total += bytes.len() as u64;
        if name.starts_with("valid-") {
            assert!(check_responses(&bytes).is_ok(), "{name} is refused");
            valid += 1;
        } else if name.starts_with("edge-") {
            assert!(check_responses(&bytes).is_err(), "{name} is accepted");
            edge += 1;
        } else {
            panic!("{name}: a seed is named valid-* or edge-*");
        }
    }
    assert!(valid > 0 && edge > 0, "{valid} valid, {edge} edge seeds");
    assert!(total <= MAX_CORPUS_BYTES, "seed corpus is {total} bytes");
}
