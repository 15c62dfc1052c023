//! The fuzz target's checked-in seed corpus (`fuzz/seeds/agent_responses/`)
//! still means what its names say (`seed_corpus::check`): a `valid-*` seed
//! is a response stream the client takes, an `edge-*` seed is refused.

#[path = "../../snapshot-store/tests/common/seed_corpus.rs"]
mod seed_corpus;

use agent_client::frame::check_responses;
use std::path::Path;

fn accepts(_: &str, bytes: &[u8]) -> bool {
    check_responses(bytes).is_ok()
}

#[test]
fn seeds_are_valid_or_edge_cases_as_named() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    seed_corpus::check(&root, &["agent_responses"], accepts, 16 << 10);
}
