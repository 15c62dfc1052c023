//! Fuzz the host's decoding of what a guest agent sends: a stream of
//! frames (`check_responses`) and each payload decoder on raw bytes. Never
//! panics; a payload is never longer than a frame may be; a decoded Info
//! keeps to its bound on addresses.
#![no_main]

use agent_client::frame::{
    check_responses, decode_header, AgentErrorPayload, Entry, Exit, Info, Stat, HEADER_LEN,
    MAX_ADDRESSES, MAX_PAYLOAD,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = check_responses(data);
    if let Some(h) = data.first_chunk::<HEADER_LEN>() {
        if let Ok(h) = decode_header(h) {
            assert!(h.len <= MAX_PAYLOAD);
        }
    }
    let _ = Exit::decode(data);
    let _ = Entry::decode(data);
    let _ = Stat::decode(data);
    let _ = AgentErrorPayload::decode(data);
    if let Ok(info) = Info::decode(data) {
        assert!(info.addresses.len() <= MAX_ADDRESSES as usize);
    }
});
