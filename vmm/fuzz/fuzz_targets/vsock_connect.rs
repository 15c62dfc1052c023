//! Fuzz the vsock host end's `CONNECT <port>` line parser
//! (`parse_connect_line`): never panics; whatever it accepts is `CONNECT `
//! and decimal digits (a `\r` may end it) naming the port it returns.
#![no_main]

use ignition_vmm::devices::virtio::vsock::muxer::parse_connect_line;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(port) = parse_connect_line(data) {
        let line = data.strip_suffix(b"\r").unwrap_or(data);
        let digits = line.strip_prefix(b"CONNECT ").expect("the prefix");
        assert!(!digits.is_empty() && digits.iter().all(u8::is_ascii_digit));
        let canonical = format!("CONNECT {port}");
        assert_eq!(parse_connect_line(canonical.as_bytes()), Some(port));
    }
});
