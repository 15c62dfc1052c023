//! Fuzz the `state.bin` envelope parsers: never panic, bounds respected,
//! accepted files round-trip through the encoder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use snapshot_store::format::FORMAT_VERSION;
use snapshot_store::format::state::{
    encode_state_header, parse_state, parse_state_header, MAX_STATE_BYTES, STATE_HEADER_LEN,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = parse_state_header(data) {
        assert!(h.payload_len <= MAX_STATE_BYTES);
    }
    if let Ok(payload) = parse_state(data) {
        assert_eq!(payload.len() + STATE_HEADER_LEN, data.len());
        // The encoder writes the current version; an older minor reads too.
        let current = parse_state_header(data).map(|h| h.version) == Ok(FORMAT_VERSION);
        let header = encode_state_header(payload).unwrap();
        if current {
            assert_eq!(&header[..], &data[..STATE_HEADER_LEN]);
        }
    }
});
