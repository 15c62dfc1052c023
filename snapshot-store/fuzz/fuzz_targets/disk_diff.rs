//! Fuzz the disk diff parsers (header, header + index + padding): never
//! panic, never allocate beyond the input, and agree with each other and
//! with the encoder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use snapshot_store::format::disk_diff::{
    encode_disk_diff_prefix, parse_disk_diff_header, parse_disk_diff_prefix,
};

fuzz_target!(|data: &[u8]| {
    let header = parse_disk_diff_header(data);
    if let Ok((h, index)) = parse_disk_diff_prefix(data) {
        assert_eq!(header.as_ref().ok(), Some(&h));
        assert_eq!(index.len() as u64, h.chunk_count);
        assert!(index.windows(2).all(|w| w[0] < w[1]));
        assert!(index.iter().all(|&c| c < h.disk_size.div_ceil(h.chunk_size)));
        // The encoder reproduces the prefix byte for byte (a reader of an
        // older minor version aside: the encoder writes the current one).
        let enc = encode_disk_diff_prefix(h.chunk_size, h.disk_size, &index).unwrap();
        if h.version == snapshot_store::format::FORMAT_VERSION {
            assert_eq!(&enc[..], &data[..h.data_offset as usize]);
        }
    }
});
