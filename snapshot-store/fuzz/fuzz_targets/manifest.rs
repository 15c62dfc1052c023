//! Fuzz `parse_manifest`: never panics; whatever it accepts is canonical
//! (re-serializes to the same bytes) and self-consistent.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = snapshot_store::format::manifest::parse_manifest(data) {
        assert_eq!(m.to_bytes(), data);
        assert_eq!(m.compute_self_hash(), m.manifest_sha256);
        assert!(m.validate().is_ok());
    }
});
