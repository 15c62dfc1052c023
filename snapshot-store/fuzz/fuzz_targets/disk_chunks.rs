//! Fuzz the `disk.chunks` parsers (header, whole file): never panic, never
//! allocate beyond the input, agree with each other, and accepted files
//! round-trip through the encoder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use snapshot_store::format::chunks::{
    disk_chunk_count, encode_disk_chunks, parse_disk_chunks, parse_disk_chunks_header,
    MAX_DISK_CHUNKS,
};

fuzz_target!(|data: &[u8]| {
    let header = parse_disk_chunks_header(data);
    if let Ok(h) = &header {
        assert!(h.chunk_count <= MAX_DISK_CHUNKS);
        assert_eq!(h.chunk_count, disk_chunk_count(h.disk_size, h.chunk_size));
    }
    if let Ok(c) = parse_disk_chunks(data) {
        let h = header.expect("a parsed file has a valid header");
        assert_eq!(data.len() as u64, h.file_size());
        assert_eq!(c.digests.len() as u64, h.chunk_count);
        // The encoder writes the current version; an older minor reads too.
        let enc = encode_disk_chunks(c.chunk_size, c.disk_size, &c.digests).unwrap();
        if h.version == snapshot_store::format::FORMAT_VERSION {
            assert_eq!(&enc[..], data);
        }
    }
});
