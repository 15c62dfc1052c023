//! The check every crate's fuzz seed corpus gets (included by path from the
//! crates' `tests/fuzz_seeds.rs`): in `fuzz/seeds/<target>/`, every
//! `valid-*` seed is accepted by the target's parser and every `edge-*` seed
//! is refused, every target has both, and the corpus stays small.

use std::path::Path;

/// Checks the corpus under `root` (`fuzz/seeds`) for `targets`, with
/// `accepts(target, bytes)` the parser each target exercises; the corpus
/// holds at most `max_bytes` bytes in all.
pub fn check(root: &Path, targets: &[&str], accepts: fn(&str, &[u8]) -> bool, max_bytes: u64) {
    let mut total = 0;
    for &target in targets {
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
    assert!(total <= max_bytes, "seed corpus is {total} bytes");
}
