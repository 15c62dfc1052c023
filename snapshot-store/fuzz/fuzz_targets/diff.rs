//! Fuzz the diff memory parsers (header, header + index + padding, whole
//! file): never panic, never allocate beyond the input, and agree with
//! each other and with the encoder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use snapshot_store::format::diff::{
    encode_diff_prefix, parse_diff_file, parse_diff_header, parse_diff_prefix,
};

fuzz_target!(|data: &[u8]| {
    let header = parse_diff_header(data);
    if let Ok((h, index)) = parse_diff_prefix(data) {
        assert_eq!(header.as_ref().ok(), Some(&h));
        assert_eq!(index.len() as u64, h.page_count);
        assert!(index.windows(2).all(|w| w[0] < w[1]));
        assert!(index.iter().all(|&p| p < h.ram_size / h.page_size));
        // The encoder reproduces the prefix byte for byte (in the current
        // version; an older minor reads too).
        let enc = encode_diff_prefix(h.page_size, h.ram_size, &index).unwrap();
        if h.version == snapshot_store::format::FORMAT_VERSION {
            assert_eq!(&enc[..], &data[..h.data_offset as usize]);
        }
    }
    if let Ok(v) = parse_diff_file(data) {
        assert_eq!(data.len() as u64, v.header.file_size());
        for i in 0..v.index.len() {
            assert_eq!(v.page(i).len() as u64, v.header.page_size);
        }
    }
});
