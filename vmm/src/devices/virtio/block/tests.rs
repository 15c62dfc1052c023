use super::*;
use crate::arch::layout::{PAGE_SIZE, RAM_BASE};
use crate::devices::pl011::tests::TestIrq;
use crate::devices::virtio::mmio::tests::{
    add_chain, negotiate, queue, r, ram, setup_queue, used_elem, used_idx, w, RUNNING,
};
use crate::devices::virtio::{VirtioMmio, VirtioMmioState};
use crate::memory::GuestRam;
use std::sync::Arc;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::GuestAddress;

const SECTORS: u64 = 16;
const HDR: u64 = RAM_BASE + 0x1000;
const STATUS: u64 = RAM_BASE + 0x2000;
/// 512 bytes below a page boundary, so a 1 KiB buffer spans pages 4 and 5.
const DATA: u64 = RAM_BASE + 5 * PAGE_SIZE - 512;

fn pattern(i: u64) -> u8 {
    (i * 7 % 251) as u8
}

/// A 16-sector disk filled with `pattern`, and a second handle to it.
fn disk(read_only: bool) -> (Block, File) {
    let f = tempfile::tempfile().unwrap();
    let bytes: Vec<u8> = (0..SECTORS * SECTOR_SIZE).map(pattern).collect();
    f.write_all_at(&bytes, 0).unwrap();
    let blk = Block::new(f.try_clone().unwrap(), read_only, "ignition-vda").unwrap();
    (blk, f)
}

fn header(ram: &GuestRam, req_type: u32, sector: u64) {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&req_type.to_le_bytes());
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    ram.memory().write_slice(&h, GuestAddress(HDR)).unwrap();
}

fn status(ram: &GuestRam) -> u8 {
    ram.memory().read_obj(GuestAddress(STATUS)).unwrap()
}

fn read_guest(ram: &GuestRam, addr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    ram.memory().read_slice(&mut v, GuestAddress(addr)).unwrap();
    v
}

#[test]
fn config_space_and_features() {
    let (blk, _) = disk(false);
    let mut cfg = [0u8; 28];
    blk.read_config(0, &mut cfg);
    assert_eq!(u64::from_le_bytes(cfg[0..8].try_into().unwrap()), SECTORS);
    assert_eq!(u32::from_le_bytes(cfg[12..16].try_into().unwrap()), 254);
    assert_eq!(u32::from_le_bytes(cfg[20..24].try_into().unwrap()), 512);
    assert_eq!(cfg[24..], [0; 4], "past the modelled fields");
    let mut far = [0xffu8; 4];
    blk.read_config(u64::MAX - 1, &mut far);
    assert_eq!(far, [0; 4]);
    assert_eq!(blk.device_type(), 2);
    assert_eq!(blk.features(), (1 << 2) | (1 << 6) | (1 << 9));
    let (ro, _) = disk(true);
    assert_eq!(ro.features() & (1 << 5), 1 << 5);
}

#[test]
fn read_fills_guest_memory_and_marks_pages_dirty() {
    let ram = ram();
    let (mut blk, _f) = disk(false);
    let (vq, mut q) = queue(&ram);
    header(&ram, VIRTIO_BLK_T_IN, 2);
    add_chain(
        &vq,
        0,
        &[(HDR, 16, false), (DATA, 1024, true), (STATUS, 1, true)],
    );
    ram.vmm_dirty().clear_all();
    assert!(blk.process_queue(0, &mut q, ram.memory(), 0).unwrap());
    let expected: Vec<u8> = (1024..2048).map(pattern).collect();
    assert_eq!(read_guest(&ram, DATA, 1024), expected);
    assert_eq!(status(&ram), S_OK);
    assert_eq!(used_elem(&ram, 0), (0, 1025));
    let dirty = ram.vmm_dirty();
    assert!(dirty.is_set(4) && dirty.is_set(5), "data pages");
    assert!(!dirty.is_set(3) && !dirty.is_set(6));
}

/// A read of sector 2 into [`DATA`] (1 KiB), as request `idx`.
fn read_request(ram: &GuestRam, vq: &MockSplitQueue<'_, GuestMemoryMmap>, idx: u16) {
    header(ram, VIRTIO_BLK_T_IN, 2);
    add_chain(
        vq,
        idx,
        &[(HDR, 16, false), (DATA, 1024, true), (STATUS, 1, true)],
    );
}

/// A store in `dir` with one full layer `g` whose disk is `bytes`.
fn layer_with_disk(dir: &std::path::Path, bytes: &[u8]) -> snapshot_store::Store {
    let img = dir.join("disk.img");
    std::fs::write(&img, bytes).unwrap();
    let s = snapshot_store::Store::create(dir.join("store")).unwrap();
    let meta = snapshot_store::LayerMeta {
        parent: None,
        page_size: 4096,
        ram_base_gpa: RAM_BASE,
        ram_size: 4096,
        vcpus: 1,
        backend: "emu".into(),
        gic_mode: "userspace".into(),
        creator: "test".into(),
    };
    let mut w = s.begin("g", meta).unwrap();
    w.write_full_memory(&[0; 4096]).unwrap();
    w.write_state(b"s").unwrap();
    w.clone_disk(&img, None).unwrap();
    w.commit().unwrap();
    s
}

#[test]
fn an_overlay_disk_reads_the_layer_and_keeps_the_guest_s_writes() {
    let ram = ram();
    let dir = tempfile::tempdir().unwrap();
    let bytes: Vec<u8> = (0..SECTORS * SECTOR_SIZE).map(pattern).collect();
    let store = layer_with_disk(dir.path(), &bytes);
    let chain = store.resolve("g").unwrap();
    let base = snapshot_store::ChainDisk::open(&chain).unwrap().unwrap();
    let overlay = Arc::new(DiskOverlay::create(base, &dir.path().join("o")).unwrap());
    let disk = BlockDisk::Overlay(overlay.clone());
    let mut blk = Block::with_disk(disk, SECTORS * SECTOR_SIZE, false, "x");
    let (vq, mut q) = queue(&ram);
    // A write of sectors 3 and 4, then a read of sectors 2 and 3.
    header(&ram, VIRTIO_BLK_T_OUT, 3);
    ram.memory()
        .write_slice(&[0xab; 1024], GuestAddress(DATA))
        .unwrap();
    add_chain(
        &vq,
        0,
        &[(HDR, 16, false), (DATA, 1024, false), (STATUS, 1, true)],
    );
    blk.process_queue(0, &mut q, ram.memory(), 0).unwrap();
    assert_eq!(status(&ram), S_OK);
    assert_eq!(blk.written_chunks(), [0]);
    read_request(&ram, &vq, 3);
    blk.process_queue(0, &mut q, ram.memory(), 0).unwrap();
    assert_eq!(status(&ram), S_OK);
    let mut want: Vec<u8> = (1024..1536).map(pattern).collect();
    want.extend([0xab; 512]);
    assert_eq!(read_guest(&ram, DATA, 1024), want);
    assert_eq!(overlay.overlay_chunks(), 1);
    // The layer's image is unchanged.
    let img = store.root().join("g/disk.img");
    assert_eq!(std::fs::read(img).unwrap(), bytes);
}

#[test]
fn write_reaches_the_file() {
    let ram = ram();
    let (mut blk, f) = disk(false);
    let (vq, mut q) = queue(&ram);
    header(&ram, VIRTIO_BLK_T_OUT, 3);
    ram.memory()
        .write_slice(&[0xab; 1024], GuestAddress(DATA))
        .unwrap();
    add_chain(
        &vq,
        0,
        &[(HDR, 16, false), (DATA, 1024, false), (STATUS, 1, true)],
    );
    assert!(blk.written_chunks().is_empty());
    blk.process_queue(0, &mut q, ram.memory(), 0).unwrap();
    assert_eq!(status(&ram), S_OK);
    assert_eq!(
        blk.written_chunks(),
        [0],
        "remembered for the next snapshot"
    );
    blk.clear_written_chunks();
    assert!(blk.written_chunks().is_empty());
    assert_eq!(used_elem(&ram, 0), (0, 1));
    let mut back = vec![0u8; 1536];
    f.read_exact_at(&mut back, 3 * 512 - 256).unwrap();
    assert_eq!(
        back[..256],
        (1280..1536).map(pattern).collect::<Vec<_>>()[..]
    );
    assert_eq!(back[256..1280], [0xab; 1024]);
    assert_eq!(
        back[1280..],
        (2560..2816).map(pattern).collect::<Vec<_>>()[..]
    );
}

#[test]
fn writes_mark_exactly_the_chunks_they_touch() {
    let ram = ram();
    // Three whole chunks and a 1 KiB partial one; sparse.
    let f = tempfile::tempfile().unwrap();
    f.set_len(3 * DISK_CHUNK_SIZE + 1024).unwrap();
    let mut blk = Block::new(f, false, "x").unwrap();
    let (vq, mut q) = queue(&ram);
    let per_chunk = DISK_CHUNK_SIZE / SECTOR_SIZE;
    let mut next = 0u16;
    let mut request = |blk: &mut Block, req_type: u32, sector: u64, len: u32| {
        header(&ram, req_type, sector);
        let writable = req_type == VIRTIO_BLK_T_IN;
        add_chain(
            &vq,
            next,
            &[(HDR, 16, false), (DATA, len, writable), (STATUS, 1, true)],
        );
        next += 3;
        blk.process_queue(0, &mut q, ram.memory(), 0).unwrap();
        status(&ram)
    };
    // Reads mark nothing.
    assert_eq!(
        request(&mut blk, VIRTIO_BLK_T_IN, per_chunk - 1, 1024),
        S_OK
    );
    assert!(blk.written_chunks().is_empty());
    // The last sector of chunk 0 and the first of chunk 1: both.
    assert_eq!(
        request(&mut blk, VIRTIO_BLK_T_OUT, per_chunk - 1, 1024),
        S_OK
    );
    assert_eq!(blk.written_chunks(), [0, 1]);
    // The last sectors of the disk: the short last chunk.
    assert_eq!(
        request(&mut blk, VIRTIO_BLK_T_OUT, 3 * per_chunk, 1024),
        S_OK
    );
    assert_eq!(blk.written_chunks(), [0, 1, 3]);
    // A refused write (past the end) marks nothing.
    assert_eq!(
        request(&mut blk, VIRTIO_BLK_T_OUT, 3 * per_chunk + 1, 1024),
        S_IOERR
    );
    assert_eq!(blk.written_chunks(), [0, 1, 3]);
    blk.clear_written_chunks();
    assert!(blk.written_chunks().is_empty());
    // One sector inside chunk 2.
    assert_eq!(
        request(&mut blk, VIRTIO_BLK_T_OUT, 2 * per_chunk + 5, 512),
        S_OK
    );
    assert_eq!(blk.written_chunks(), [2]);
}

#[test]
fn chunk_marks_stay_in_bounds() {
    let mut w = WrittenChunks::new(2 * DISK_CHUNK_SIZE + 1);
    w.mark(0, 0);
    assert!(w.list().is_empty());
    w.mark(u64::MAX - 10, u64::MAX);
    w.mark(10 * DISK_CHUNK_SIZE, 1);
    assert!(w.list().is_empty(), "bytes beyond the file are ignored");
    w.mark(2 * DISK_CHUNK_SIZE, DISK_CHUNK_SIZE);
    assert_eq!(w.list(), [2]);
    w.mark(DISK_CHUNK_SIZE - 1, 2);
    assert_eq!(w.list(), [0, 1, 2]);
    let mut many = WrittenChunks::new(130 * DISK_CHUNK_SIZE);
    many.mark(63 * DISK_CHUNK_SIZE, 3 * DISK_CHUNK_SIZE);
    many.mark(129 * DISK_CHUNK_SIZE, 1);
    assert_eq!(many.list(), [63, 64, 65, 129]);
    let mut empty = WrittenChunks::new(0);
    empty.mark(0, 512);
    assert!(empty.list().is_empty());
}

#[test]
fn flush_and_get_id() {
    let ram = ram();
    let (mut blk, _f) = disk(false);
    let (vq, mut q) = queue(&ram);
    header(&ram, VIRTIO_BLK_T_FLUSH, 0);
    add_chain(&vq, 0, &[(HDR, 16, false), (STATUS, 1, true)]);
    blk.process_queue(0, &mut q, ram.memory(), 0).unwrap();
    assert_eq!((status(&ram), used_elem(&ram, 0)), (S_OK, (0, 1)));

    header(&ram, VIRTIO_BLK_T_GET_ID, 0);
    ram.memory()
        .write_slice(&[0xee; 32], GuestAddress(DATA))
        .unwrap();
    add_chain(
        &vq,
        2,
        &[(HDR, 16, false), (DATA, 20, true), (STATUS, 1, true)],
    );
    blk.process_queue(0, &mut q, ram.memory(), 0).unwrap();
    assert_eq!((status(&ram), used_elem(&ram, 1)), (S_OK, (2, 21)));
    let mut id = b"ignition-vda".to_vec();
    id.resize(20, 0);
    assert_eq!(read_guest(&ram, DATA, 20), id);
    assert_eq!(read_guest(&ram, DATA + 20, 1), [0xee]);

    // A short ID buffer gets what fits.
    add_chain(
        &vq,
        5,
        &[(HDR, 16, false), (DATA + 64, 8, true), (STATUS, 1, true)],
    );
    blk.process_queue(0, &mut q, ram.memory(), 0).unwrap();
    assert_eq!(used_elem(&ram, 2), (5, 9));
    assert_eq!(read_guest(&ram, DATA + 64, 8), b"ignition");
}

#[test]
fn out_of_range_and_malformed_lengths_fail() {
    let ram = ram();
    let (mut blk, f) = disk(false);
    let (vq, mut q) = queue(&ram);
    ram.memory()
        .write_slice(&[0xee; 1024], GuestAddress(DATA))
        .unwrap();
    for (sector, len) in [
        (SECTORS - 1, 1024),    // crosses the end
        (SECTORS, 512),         // starts at the end
        (u64::MAX / 256, 1024), // offset overflows
        (u64::MAX, 512),        // offset overflows
        (0, 100),               // not whole sectors
    ] {
        header(&ram, VIRTIO_BLK_T_IN, sector);
        ram.memory()
            .write_obj(0xffu8, GuestAddress(STATUS))
            .unwrap();
        let n = used_idx(&ram);
        add_chain(
            &vq,
            0,
            &[(HDR, 16, false), (DATA, len, true), (STATUS, 1, true)],
        );
        blk.process_queue(0, &mut q, ram.memory(), 0).unwrap();
        assert_eq!(status(&ram), S_IOERR, "sector {sector} len {len}");
        assert_eq!(used_elem(&ram, n), (0, 1));
    }
    assert_eq!(
        read_guest(&ram, DATA, 1024),
        [0xee; 1024],
        "no data written"
    );
    // A write past the end must not grow the file.
    header(&ram, VIRTIO_BLK_T_OUT, SECTORS);
    add_chain(
        &vq,
        0,
        &[(HDR, 16, false), (DATA, 512, false), (STATUS, 1, true)],
    );
    blk.process_queue(0, &mut q, ram.memory(), 0).unwrap();
    assert_eq!(status(&ram), S_IOERR);
    assert_eq!(f.metadata().unwrap().len(), SECTORS * SECTOR_SIZE);
    // The last sector itself is fine.
    header(&ram, VIRTIO_BLK_T_IN, SECTORS - 1);
    add_chain(
        &vq,
        0,
        &[(HDR, 16, false), (DATA, 512, true), (STATUS, 1, true)],
    );
    blk.process_queue(0, &mut q, ram.memory(), 0).unwrap();
    assert_eq!(status(&ram), S_OK);
}

#[test]
fn read_only_disk_refuses_writes() {
    let ram = ram();
    let (mut blk, f) = disk(true);
    let (vq, mut q) = queue(&ram);
    header(&ram, VIRTIO_BLK_T_OUT, 0);
    add_chain(
        &vq,
        0,
        &[(HDR, 16, false), (DATA, 512, false), (STATUS, 1, true)],
    );
    blk.process_queue(0, &mut q, ram.memory(), 0).unwrap();
    assert_eq!(status(&ram), S_IOERR);
    let mut first = [0u8; 4];
    f.read_exact_at(&mut first, 0).unwrap();
    assert_eq!(first, [pattern(0), pattern(1), pattern(2), pattern(3)]);
}

#[test]
fn malformed_chains_are_refused_safely() {
    let ram = ram();
    let (mut blk, f) = disk(false);
    let (vq, mut q) = queue(&ram);
    let mem = ram.memory();
    let run = |blk: &mut Block, q: &mut Queue, req_type: u32, parts: &[(u64, u32, bool)]| {
        header(&ram, req_type, 0);
        mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
        let n = used_idx(&ram);
        add_chain(&vq, 0, parts);
        assert!(blk.process_queue(0, q, mem, 0).unwrap());
        assert_eq!(used_idx(&ram), n.wrapping_add(1), "chain consumed");
        (status(&ram), used_elem(&ram, n).1)
    };
    let (hdr, data_r, data_w, st) = (
        (HDR, 16, false),
        (DATA, 512, false),
        (DATA, 512, true),
        (STATUS, 1, true),
    );
    // No status byte: last descriptor readable, or writable but empty.
    assert_eq!(
        run(&mut blk, &mut q, VIRTIO_BLK_T_OUT, &[hdr, data_r]),
        (0xff, 0)
    );
    assert_eq!(
        run(&mut blk, &mut q, VIRTIO_BLK_T_IN, &[hdr, (STATUS, 0, true)]),
        (0xff, 0)
    );
    // Header too short.
    assert_eq!(
        run(
            &mut blk,
            &mut q,
            VIRTIO_BLK_T_IN,
            &[(HDR, 8, false), data_w, st]
        ),
        (S_IOERR, 1)
    );
    // IN whose data descriptor is device-readable.
    assert_eq!(
        run(&mut blk, &mut q, VIRTIO_BLK_T_IN, &[hdr, data_r, st]),
        (S_IOERR, 1)
    );
    // OUT whose data descriptor is device-writable.
    assert_eq!(
        run(&mut blk, &mut q, VIRTIO_BLK_T_OUT, &[hdr, data_w, st]),
        (S_IOERR, 1)
    );
    // FLUSH with data.
    assert_eq!(
        run(&mut blk, &mut q, VIRTIO_BLK_T_FLUSH, &[hdr, data_r, st]),
        (S_IOERR, 1)
    );
    // Readable after writable.
    assert_eq!(
        run(
            &mut blk,
            &mut q,
            VIRTIO_BLK_T_IN,
            &[hdr, data_w, (HDR, 16, false), st]
        ),
        (S_IOERR, 1)
    );
    // Data buffer outside guest RAM.
    assert_eq!(
        run(
            &mut blk,
            &mut q,
            VIRTIO_BLK_T_IN,
            &[hdr, (0x1000, 512, true), st]
        ),
        (S_IOERR, 1)
    );
    assert_eq!(
        run(
            &mut blk,
            &mut q,
            VIRTIO_BLK_T_OUT,
            &[hdr, (u64::MAX - 100, 512, false), st]
        ),
        (S_IOERR, 1)
    );
    // Status byte outside guest RAM: consumed with length 0.
    assert_eq!(
        run(
            &mut blk,
            &mut q,
            VIRTIO_BLK_T_FLUSH,
            &[hdr, (0x10, 1, true)]
        ),
        (0xff, 0)
    );
    // Unknown request type.
    assert_eq!(run(&mut blk, &mut q, 0x99, &[hdr, st]), (S_UNSUPP, 1));
    // The disk is untouched and a good request still works.
    let mut first = [0u8; 2];
    f.read_exact_at(&mut first, 0).unwrap();
    assert_eq!(first, [pattern(0), pattern(1)]);
    assert_eq!(
        run(&mut blk, &mut q, VIRTIO_BLK_T_IN, &[hdr, data_w, st]),
        (S_OK, 513)
    );
}

#[test]
fn request_through_the_mmio_transport() {
    let ram = ram();
    let (blk, _f) = disk(false);
    let irq = Arc::new(TestIrq::default());
    let mut dev = VirtioMmio::new(blk, ram.clone(), irq.clone()).unwrap();
    assert_eq!(r(&mut dev, 0x008), 2);
    assert_eq!(r(&mut dev, 0x034), 256);
    let mut cap = [0u8; 8];
    crate::devices::MmioDevice::read(&mut dev, 0, 0x100, &mut cap).unwrap();
    assert_eq!(u64::from_le_bytes(cap), SECTORS);
    let vq = MockSplitQueue::create(ram.memory(), GuestAddress(RAM_BASE), 64);
    negotiate(
        &mut dev,
        (1 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_BLK_F_FLUSH),
    );
    setup_queue(&mut dev, &vq, 64);
    w(&mut dev, 0x070, RUNNING);
    assert_eq!(r(&mut dev, 0x070), RUNNING);
    header(&ram, VIRTIO_BLK_T_IN, 0);
    add_chain(
        &vq,
        0,
        &[(HDR, 16, false), (DATA, 512, true), (STATUS, 1, true)],
    );
    w(&mut dev, 0x050, 0);
    assert_eq!(status(&ram), S_OK);
    assert_eq!(
        read_guest(&ram, DATA, 4),
        (0..4).map(pattern).collect::<Vec<_>>()
    );
    assert!(irq.level());
    assert_eq!(r(&mut dev, 0x060), 1);
    let state = dev.save();
    assert_eq!(state.driver_features, (1 << 32) | (1 << 9));
    // The transport keeps the negotiated features: features the device did
    // not offer are refused, and a reset forgets them.
    let restore = |s: &VirtioMmioState<BlockState>| {
        let (_, f) = disk(false);
        let args = args(&f, SECTORS * SECTOR_SIZE, false);
        VirtioMmio::<Block>::restore((args, ram.clone(), irq.clone()), s)
    };
    assert!(restore(&state).is_ok());
    let mut bad = state.clone();
    bad.driver_features |= 1 << 13;
    assert!(restore(&bad).is_err());
    w(&mut dev, 0x070, 0);
    assert_eq!(dev.save().driver_features, 0);
}

#[test]
fn a_state_from_before_the_transport_kept_the_features_restores() {
    let old = r#"{"status":15,"driver_features":4294967808,"device_features_sel":0,
        "driver_features_sel":0,"queue_sel":0,"interrupt_status":0,"config_generation":0,
        "queues":[{"max_size":256,"next_avail":0,"next_used":0,"event_idx_enabled":false,
        "size":256,"ready":false,"desc_table":0,"avail_ring":0,"used_ring":0}],
        "device":{"capacity":16,"read_only":false,"acked_features":4294967808}}"#;
    let state: VirtioMmioState<BlockState> = serde_json::from_str(old).unwrap();
    assert_eq!(
        state.device,
        BlockState {
            capacity: SECTORS,
            read_only: false
        }
    );
    let (_, f) = disk(false);
    let args = args(&f, SECTORS * SECTOR_SIZE, false);
    let irq = Arc::new(TestIrq::default());
    let dev = VirtioMmio::<Block>::restore((args, ram(), irq), &state).unwrap();
    assert_eq!(dev.save(), state);
}

/// [`BlockArgs`] over a copy of `f` of `len` bytes.
fn args(f: &File, len: u64, read_only: bool) -> BlockArgs {
    BlockArgs {
        disk: BlockDisk::File(Arc::new(f.try_clone().unwrap())),
        len,
        read_only,
        serial: "ignition-vda".into(),
    }
}

#[test]
fn restore_checks_the_disk() {
    let (blk, f) = disk(false);
    let state = blk.save();
    let len = SECTORS * SECTOR_SIZE;
    let same = Block::restore(args(&f, len, false), &state).unwrap();
    assert_eq!(same.save(), state);
    assert!(Block::restore(args(&f, len, true), &state).is_err());
    let small = tempfile::tempfile().unwrap();
    small.set_len(8 * 512).unwrap();
    assert!(Block::restore(args(&small, 8 * 512, false), &state).is_err());
}

/// Records what it is told and the file's bytes at that moment.
struct Recorder {
    file: File,
    seen: std::sync::Mutex<Vec<(u64, u64, Vec<u8>)>>,
}

impl BeforeDiskWrite for Recorder {
    fn before_write(&self, offset: u64, len: u64) {
        let mut now = vec![0u8; len as usize];
        self.file.read_exact_at(&mut now, offset).unwrap();
        self.seen.lock().unwrap().push((offset, len, now));
    }
}

#[test]
fn the_before_write_hook_sees_each_range_before_it_changes() {
    let ram = ram();
    let (mut blk, f) = disk(false);
    let hook = Arc::new(Recorder {
        file: f.try_clone().unwrap(),
        seen: Default::default(),
    });
    blk.set_before_write(Some(hook.clone()));
    let (vq, mut q) = queue(&ram);
    header(&ram, VIRTIO_BLK_T_OUT, 3);
    ram.memory()
        .write_slice(&[0xab; 1024], GuestAddress(DATA))
        .unwrap();
    add_chain(
        &vq,
        0,
        &[(HDR, 16, false), (DATA, 1024, false), (STATUS, 1, true)],
    );
    blk.process_queue(0, &mut q, ram.memory(), 0).unwrap();
    assert_eq!(status(&ram), S_OK);
    let seen = hook.seen.lock().unwrap().clone();
    let old: Vec<u8> = (3 * 512..3 * 512 + 1024).map(pattern).collect();
    assert_eq!(seen, [(3 * 512, 1024, old)]);
    // Cleared: the next write is not reported.
    blk.set_before_write(None);
    add_chain(
        &vq,
        3,
        &[(HDR, 16, false), (DATA, 1024, false), (STATUS, 1, true)],
    );
    blk.process_queue(0, &mut q, ram.memory(), 0).unwrap();
    assert_eq!(used_idx(&ram), 2, "the second write was processed");
    assert_eq!(hook.seen.lock().unwrap().len(), 1);
}
