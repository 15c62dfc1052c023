//! Fuzz `parse_verified` (the `verified.json` cache reader): never panics,
//! never accepts more entries than there are layer files, and is
//! deterministic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let r = snapshot_store::format::verified::parse_verified(data);
    if let Ok(n) = r {
        assert!(n <= snapshot_store::format::LAYER_FILES.len());
    }
    assert_eq!(snapshot_store::format::verified::parse_verified(data), r);
});
