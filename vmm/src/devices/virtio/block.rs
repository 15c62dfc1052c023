//! virtio-blk (virtio 1.2 §5.2) backed by a regular host file.
//!
//! One request queue. Requests run synchronously in
//! [`VirtioDevice::process_queue`] with positioned I/O (`pread`/`pwrite`)
//! through a bounce buffer; guest memory is only touched through vm-memory
//! (virtio-queue's `Reader`/`Writer` and `write_obj`), so every byte the
//! device writes is recorded in the dirty bitmap. Writes to the disk file
//! mark the `DISK_CHUNK_SIZE` chunks they touch, for the next snapshot.
//!
//! Request checks (§5.2.6): readable descriptors come before writable ones;
//! the last descriptor is writable and its last byte is the status; the
//! readable part starts with the 16-byte header; IN/GET_ID carry no readable
//! data and OUT no writable data; FLUSH carries none; IN/OUT lengths are
//! whole sectors, at most [`MAX_REQUEST_BYTES`], inside the capacity. A
//! request failing a check gets VIRTIO_BLK_S_IOERR (UNSUPP for an unknown
//! type); one without a usable status byte is returned with length 0.

use super::{VirtioDevice, VirtioError, TRANSPORT_FEATURES};
use crate::devices::Persist;
use crate::memory::GuestMemory;
use serde::{Deserialize, Serialize};
use snapshot_store::DISK_CHUNK_SIZE;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX,
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH,
    VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT, Reader, Writer};
use vm_memory::bitmap::BitmapSlice;
use vm_memory::{Address, Bytes};

/// Sector size in bytes; capacity and request offsets count these.
pub const SECTOR_SIZE: u64 = 512;
/// Size of the request queue (QueueNumMax).
pub const QUEUE_SIZE: u16 = 256;
/// Data segments per request advertised in `seg_max` (queue size minus the
/// header and status descriptors).
pub const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;
/// Largest IN/OUT data length accepted, in bytes (Linux sends at most
/// `max_sectors_kb`, 1280 KiB by default).
pub const MAX_REQUEST_BYTES: u64 = 256 << 20;
/// Length of the GET_ID serial string in bytes (VIRTIO_BLK_ID_BYTES).
pub const ID_BYTES: usize = 20;

const HEADER_LEN: u64 = 16;
const BOUNCE_LEN: usize = 128 * 1024;
/// `struct virtio_blk_config` up to and including `blk_size` (§5.2.4).
const CONFIG_LEN: usize = 24;
const QUEUE_SIZES: [u16; 1] = [QUEUE_SIZE];

const S_OK: u8 = VIRTIO_BLK_S_OK as u8;
const S_IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
const S_UNSUPP: u8 = VIRTIO_BLK_S_UNSUPP as u8;

/// The host file behind a [`Block`]: open, or still being made on another
/// thread (a restored VM's private copy of its snapshot's disk, so the guest
/// need not wait for the copy before it runs). The first access waits for
/// it; if making it failed, every access fails with that error.
pub struct BackingFile {
    /// The file, or why it is unusable.
    file: Result<File, String>,
    /// Makes the file, on first use.
    pending: Option<Box<dyn FnOnce() -> io::Result<File> + Send>>,
}

impl BackingFile {
    /// An open file.
    pub fn ready(file: File) -> Self {
        Self {
            file: Ok(file),
            pending: None,
        }
    }

    /// A file that `wait` produces (blocking until it is ready).
    pub fn pending(wait: impl FnOnce() -> io::Result<File> + Send + 'static) -> Self {
        Self {
            file: Err("not made yet".into()),
            pending: Some(Box::new(wait)),
        }
    }

    /// The file, waiting for it if it is still being made.
    pub fn get(&mut self) -> io::Result<&File> {
        if let Some(wait) = self.pending.take() {
            self.file = wait().map_err(|e| e.to_string());
        }
        self.file
            .as_ref()
            .map_err(|e| io::Error::other(format!("the disk image is unusable: {e}")))
    }
}

/// The backing file, or `None` (logged) if it is unusable: the request
/// then fails with IOERR.
fn usable(file: &mut BackingFile) -> Option<&File> {
    match file.get() {
        Ok(f) => Some(f),
        Err(e) => {
            crate::warn_ratelimited!("virtio-blk: {e}");
            None
        }
    }
}

/// A virtio block device over a host file.
pub struct Block {
    file: BackingFile,
    read_only: bool,
    capacity: u64,
    serial: [u8; ID_BYTES],
    acked_features: u64,
    config: [u8; CONFIG_LEN],
    bounce: Vec<u8>,
    /// Chunks a write reached since [`Block::clear_written_chunks`].
    written: WrittenChunks,
}

/// One bit per [`DISK_CHUNK_SIZE`]-byte chunk of the disk file: set when a
/// write request touched any byte of the chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
struct WrittenChunks {
    bits: Vec<u64>,
    /// Number of chunks (`ceil(file length / DISK_CHUNK_SIZE)`).
    chunks: u64,
}

impl WrittenChunks {
    /// No chunk written, for a disk file of `len` bytes.
    fn new(len: u64) -> Self {
        let chunks = len.div_ceil(DISK_CHUNK_SIZE);
        WrittenChunks {
            bits: vec![0; chunks.div_ceil(64) as usize],
            chunks,
        }
    }

    /// Marks every chunk overlapping bytes `[offset, offset + len)`. Bytes
    /// beyond the file are ignored (the device never writes there).
    fn mark(&mut self, offset: u64, len: u64) {
        if len == 0 || self.chunks == 0 {
            return;
        }
        let first = offset / DISK_CHUNK_SIZE;
        let last = ((offset.saturating_add(len) - 1) / DISK_CHUNK_SIZE).min(self.chunks - 1);
        for c in first..=last {
            if let Some(word) = self.bits.get_mut((c / 64) as usize) {
                *word |= 1 << (c % 64);
            }
        }
    }

    /// The marked chunk indices, increasing.
    fn list(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for (w, &word) in self.bits.iter().enumerate() {
            let mut rest = word;
            while rest != 0 {
                out.push(w as u64 * 64 + u64::from(rest.trailing_zeros()));
                rest &= rest - 1;
            }
        }
        out
    }

    fn clear(&mut self) {
        self.bits.fill(0);
    }
}

/// Saved virtio-blk state. The disk contents are not part of it; restore
/// checks the disk still has the same shape.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockState {
    /// Capacity in 512-byte sectors.
    pub capacity: u64,
    /// Whether the device was offered as read-only.
    pub read_only: bool,
    /// Features the driver negotiated (0 before DRIVER_OK).
    pub acked_features: u64,
}

/// What a [`Block`] is made from besides its saved state, as for
/// [`Block::with_backing`].
pub struct BlockArgs {
    /// The disk file.
    pub file: BackingFile,
    /// Its length in bytes.
    pub len: u64,
    /// Whether the guest may not write it.
    pub read_only: bool,
    /// The serial GET_ID returns.
    pub serial: String,
}

/// How a request ended: the status byte and the data bytes written into
/// guest memory.
type Outcome = (u8, usize);

impl Block {
    /// A block device over `file`, a regular file opened for reading, and for
    /// writing unless `read_only` (then VIRTIO_BLK_F_RO is offered and writes
    /// fail). The capacity is the file length in whole sectors; a trailing
    /// partial sector is not visible to the guest. `serial` is returned by
    /// GET_ID, truncated to 20 bytes.
    pub fn new(file: File, read_only: bool, serial: &str) -> io::Result<Self> {
        let len = file.metadata()?.len();
        Ok(Self::with_backing(
            BackingFile::ready(file),
            len,
            read_only,
            serial,
        ))
    }

    /// As [`Block::new`], over a backing file of `len` bytes that may still
    /// be being made ([`BackingFile::pending`]).
    pub fn with_backing(file: BackingFile, len: u64, read_only: bool, serial: &str) -> Self {
        if len % SECTOR_SIZE != 0 {
            tracing::warn!(
                "virtio-blk: disk length {len} is not a multiple of {SECTOR_SIZE}; the last {} bytes are hidden",
                len % SECTOR_SIZE
            );
        }
        let capacity = len / SECTOR_SIZE;
        let mut id = [0u8; ID_BYTES];
        let n = serial.len().min(ID_BYTES);
        id[..n].copy_from_slice(&serial.as_bytes()[..n]);
        let mut config = [0u8; CONFIG_LEN];
        config[0..8].copy_from_slice(&capacity.to_le_bytes());
        config[12..16].copy_from_slice(&SEG_MAX.to_le_bytes());
        config[20..24].copy_from_slice(&(SECTOR_SIZE as u32).to_le_bytes());
        Block {
            file,
            read_only,
            capacity,
            serial: id,
            acked_features: 0,
            config,
            bounce: vec![0; BOUNCE_LEN],
            written: WrittenChunks::new(len),
        }
    }

    /// Waits until the backing file is ready (a snapshot clones it).
    pub fn wait_ready(&mut self) -> io::Result<()> {
        self.file.get().map(|_| ())
    }

    /// Capacity in 512-byte sectors.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The chunks (`byte offset / DISK_CHUNK_SIZE`, increasing) that guest
    /// writes reached since the device was created or
    /// [`Block::clear_written_chunks`] was last called: a snapshot re-hashes
    /// only these, and reuses its parent's disk image if there are none.
    pub fn written_chunks(&self) -> Vec<u64> {
        self.written.list()
    }

    /// Forgets earlier writes (after a snapshot captured the disk durably).
    pub fn clear_written_chunks(&mut self) {
        self.written.clear();
    }

    /// Whether the disk is read-only to the guest.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Handles one request chain; returns the used length (bytes written
    /// into guest memory, status byte included).
    fn handle(&mut self, chain: DescriptorChain<&GuestMemory>, mem: &GuestMemory) -> u32 {
        let mut readable = 0u64;
        let mut writable = 0u64;
        let mut seen_writable = false;
        let mut misordered = false;
        let mut last = None;
        for desc in chain.clone() {
            if desc.is_write_only() {
                seen_writable = true;
                writable += u64::from(desc.len());
            } else {
                misordered |= seen_writable;
                readable += u64::from(desc.len());
            }
            last = Some(desc);
        }
        let status_addr = last
            .filter(|d| d.is_write_only() && d.len() > 0)
            .and_then(|d| d.addr().checked_add(u64::from(d.len()) - 1));
        let Some(status_addr) = status_addr else {
            crate::warn_ratelimited!(
                "virtio-blk: request without a writable status byte; returned unprocessed"
            );
            return 0;
        };
        let (status, written) = if misordered {
            crate::warn_ratelimited!("virtio-blk: readable descriptor after a writable one");
            (S_IOERR, 0)
        } else {
            self.execute(chain, mem, readable, writable - 1)
        };
        let written = u32::try_from(written).unwrap_or(u32::MAX);
        match mem.write_obj(status, status_addr) {
            Ok(()) => written.saturating_add(1),
            Err(e) => {
                crate::warn_ratelimited!("virtio-blk: status byte at {:#x}: {e}", status_addr.0);
                written
            }
        }
    }

    /// Runs a well-ordered request with `readable` device-readable bytes
    /// (header + OUT data) and `data_in` writable bytes before the status.
    fn execute(
        &mut self,
        chain: DescriptorChain<&GuestMemory>,
        mem: &GuestMemory,
        readable: u64,
        data_in: u64,
    ) -> Outcome {
        if readable < HEADER_LEN {
            crate::warn_ratelimited!("virtio-blk: request header is {readable} bytes, need 16");
            return (S_IOERR, 0);
        }
        let mut reader = match Reader::new(mem, chain.clone()) {
            Ok(r) => r,
            Err(e) => {
                crate::warn_ratelimited!("virtio-blk: readable buffers: {e}");
                return (S_IOERR, 0);
            }
        };
        let mut header = [0u8; HEADER_LEN as usize];
        if let Err(e) = reader.read_exact(&mut header) {
            crate::warn_ratelimited!("virtio-blk: request header: {e}");
            return (S_IOERR, 0);
        }
        let [t0, t1, t2, t3, _, _, _, _, s0, s1, s2, s3, s4, s5, s6, s7] = header;
        let req_type = u32::from_le_bytes([t0, t1, t2, t3]);
        let sector = u64::from_le_bytes([s0, s1, s2, s3, s4, s5, s6, s7]);
        let data_out = readable - HEADER_LEN;
        let shape_ok = match req_type {
            VIRTIO_BLK_T_IN | VIRTIO_BLK_T_GET_ID => data_out == 0,
            VIRTIO_BLK_T_OUT => data_in == 0,
            VIRTIO_BLK_T_FLUSH => data_in == 0 && data_out == 0,
            _ => true,
        };
        if !shape_ok {
            crate::warn_ratelimited!(
                "virtio-blk: type {req_type} request with {data_out} readable and {data_in} writable data bytes"
            );
            return (S_IOERR, 0);
        }
        match req_type {
            VIRTIO_BLK_T_IN => self.read_disk(chain, mem, sector, data_in),
            VIRTIO_BLK_T_OUT if self.read_only => {
                crate::warn_ratelimited!("virtio-blk: write to a read-only disk");
                (S_IOERR, 0)
            }
            VIRTIO_BLK_T_OUT => self.write_disk(&mut reader, sector, data_out),
            VIRTIO_BLK_T_FLUSH => match usable(&mut self.file).map(File::sync_data) {
                Some(Ok(())) => (S_OK, 0),
                Some(Err(e)) => {
                    crate::warn_ratelimited!("virtio-blk: flush: {e}");
                    (S_IOERR, 0)
                }
                None => (S_IOERR, 0),
            },
            VIRTIO_BLK_T_GET_ID => self.get_id(chain, mem, data_in),
            other => {
                crate::warn_ratelimited!("virtio-blk: unsupported request type {other}");
                (S_UNSUPP, 0)
            }
        }
    }

    /// The byte offset of `len` bytes at `sector`, if they are whole sectors
    /// within the size limit and the capacity.
    fn disk_offset(&self, sector: u64, len: u64) -> Option<u64> {
        let offset = sector.checked_mul(SECTOR_SIZE);
        let end = offset.and_then(|o| o.checked_add(len));
        let ok = len % SECTOR_SIZE == 0
            && len <= MAX_REQUEST_BYTES
            && end.is_some_and(|e| e <= self.capacity * SECTOR_SIZE);
        if !ok {
            crate::warn_ratelimited!(
                "virtio-blk: {len} bytes at sector {sector} outside the {}-sector disk or malformed",
                self.capacity
            );
        }
        offset.filter(|_| ok)
    }

    fn read_disk(
        &mut self,
        chain: DescriptorChain<&GuestMemory>,
        mem: &GuestMemory,
        sector: u64,
        len: u64,
    ) -> Outcome {
        let Some(offset) = self.disk_offset(sector, len) else {
            return (S_IOERR, 0);
        };
        let mut writer = match Writer::new(mem, chain) {
            Ok(w) => w,
            Err(e) => {
                crate::warn_ratelimited!("virtio-blk: writable buffers: {e}");
                return (S_IOERR, 0);
            }
        };
        // Keep the data part; the status byte is written separately. `len`
        // is at most MAX_REQUEST_BYTES, so it fits a usize.
        if let Err(e) = writer.split_at(len as usize) {
            crate::warn_ratelimited!("virtio-blk: writable buffers: {e}");
            return (S_IOERR, 0);
        }
        let Some(file) = usable(&mut self.file) else {
            return (S_IOERR, 0);
        };
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(BOUNCE_LEN as u64) as usize;
            let buf = &mut self.bounce[..n];
            if let Err(e) = file.read_exact_at(buf, offset + done) {
                crate::warn_ratelimited!("virtio-blk: read at {}: {e}", offset + done);
                return (S_IOERR, writer.bytes_written());
            }
            if let Err(e) = writer.write_all(buf) {
                crate::warn_ratelimited!("virtio-blk: copy to guest: {e}");
                return (S_IOERR, writer.bytes_written());
            }
            done += n as u64;
        }
        (S_OK, writer.bytes_written())
    }

    fn write_disk<B: BitmapSlice>(
        &mut self,
        reader: &mut Reader<'_, B>,
        sector: u64,
        len: u64,
    ) -> Outcome {
        let Some(offset) = self.disk_offset(sector, len) else {
            return (S_IOERR, 0);
        };
        let Some(file) = usable(&mut self.file) else {
            return (S_IOERR, 0);
        };
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(BOUNCE_LEN as u64) as usize;
            let buf = &mut self.bounce[..n];
            if let Err(e) = reader.read_exact(buf) {
                crate::warn_ratelimited!("virtio-blk: copy from guest: {e}");
                return (S_IOERR, 0);
            }
            // Marked before the write: a failed write may still have changed
            // bytes. disk_offset checked the range against the capacity.
            self.written.mark(offset + done, n as u64);
            if let Err(e) = file.write_all_at(buf, offset + done) {
                crate::warn_ratelimited!("virtio-blk: write at {}: {e}", offset + done);
                return (S_IOERR, 0);
            }
            done += n as u64;
        }
        (S_OK, 0)
    }

    fn get_id(
        &mut self,
        chain: DescriptorChain<&GuestMemory>,
        mem: &GuestMemory,
        len: u64,
    ) -> Outcome {
        let n = usize::try_from(len).map_or(ID_BYTES, |l| l.min(ID_BYTES));
        let mut writer = match Writer::new(mem, chain) {
            Ok(w) => w,
            Err(e) => {
                crate::warn_ratelimited!("virtio-blk: writable buffers: {e}");
                return (S_IOERR, 0);
            }
        };
        match writer.write_all(&self.serial[..n]) {
            Ok(()) => (S_OK, n),
            Err(e) => {
                crate::warn_ratelimited!("virtio-blk: copy to guest: {e}");
                (S_IOERR, writer.bytes_written())
            }
        }
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn features(&self) -> u64 {
        let mut f =
            (1 << VIRTIO_BLK_F_SEG_MAX) | (1 << VIRTIO_BLK_F_BLK_SIZE) | (1 << VIRTIO_BLK_F_FLUSH);
        if self.read_only {
            f |= 1 << VIRTIO_BLK_F_RO;
        }
        f
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = offset
                .checked_add(i as u64)
                .and_then(|o| usize::try_from(o).ok())
                .and_then(|o| self.config.get(o))
                .copied()
                .unwrap_or(0);
        }
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        crate::warn_ratelimited!(
            "virtio-blk: {}-byte write to read-only config offset {offset:#x} ignored",
            data.len()
        );
    }

    fn activate(&mut self, features: u64) -> Result<(), VirtioError> {
        self.acked_features = features;
        Ok(())
    }

    fn process_queue(
        &mut self,
        _queue_index: usize,
        queue: &mut Queue,
        mem: &GuestMemory,
    ) -> Result<bool, VirtioError> {
        let mut used = false;
        loop {
            let chain = queue.iter(mem)?.next();
            let Some(chain) = chain else {
                break;
            };
            let head = chain.head_index();
            let len = self.handle(chain, mem);
            queue.add_used(mem, head, len)?;
            used = true;
        }
        Ok(used)
    }

    fn reset(&mut self) {
        self.acked_features = 0;
    }

    /// Requests complete inside `process_queue`, so nothing is ever in
    /// flight. Does not fsync the disk.
    fn quiesce(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Persist for Block {
    type State = BlockState;
    type Args = BlockArgs;
    type Error = VirtioError;

    fn save(&self) -> BlockState {
        BlockState {
            capacity: self.capacity,
            read_only: self.read_only,
            acked_features: self.acked_features,
        }
    }

    /// The device over `args`' disk, which must still have the saved shape
    /// (capacity, read-only), with the saved features (which it must offer).
    fn restore(args: BlockArgs, state: &BlockState) -> Result<Self, VirtioError> {
        let mut blk = Block::with_backing(args.file, args.len, args.read_only, &args.serial);
        if state.capacity != blk.capacity || state.read_only != blk.read_only {
            return Err(VirtioError::InvalidState(format!(
                "disk was {} sectors{}, now {} sectors{}",
                state.capacity,
                if state.read_only { " read-only" } else { "" },
                blk.capacity,
                if blk.read_only { " read-only" } else { "" },
            )));
        }
        let offered = blk.features() | TRANSPORT_FEATURES;
        if state.acked_features & !offered != 0 {
            return Err(VirtioError::InvalidState(format!(
                "block features {:#x} were not offered",
                state.acked_features
            )));
        }
        blk.acked_features = state.acked_features;
        Ok(blk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::layout::{PAGE_SIZE, RAM_BASE};
    use crate::devices::pl011::tests::TestIrq;
    use crate::devices::virtio::mmio::tests::{
        negotiate, r, ram, setup_queue, used_elem, used_idx, w, RUNNING, USED_RING,
    };
    use crate::devices::virtio::VirtioMmio;
    use crate::memory::GuestRam;
    use std::sync::Arc;
    use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
    use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
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

    /// Adds a chain of `(address, length, device-writable)` buffers whose
    /// descriptors start at index `first`.
    fn add_chain(vq: &MockSplitQueue<'_, GuestMemory>, first: u16, parts: &[(u64, u32, bool)]) {
        let descs: Vec<RawDescriptor> = parts
            .iter()
            .enumerate()
            .map(|(i, &(addr, len, writable))| {
                let mut flags = if writable { VRING_DESC_F_WRITE } else { 0 };
                if i + 1 < parts.len() {
                    flags |= VRING_DESC_F_NEXT;
                }
                let next = first + i as u16 + 1;
                RawDescriptor::from(SplitDescriptor::new(addr, len, flags as u16, next))
            })
            .collect();
        vq.add_desc_chains(&descs, first).unwrap();
    }

    /// A mock driver queue of 16 entries with its used ring at [`USED_RING`],
    /// and the device's view of it.
    fn queue(ram: &GuestRam) -> (MockSplitQueue<'_, GuestMemory>, Queue) {
        let vq = MockSplitQueue::create(ram.memory(), GuestAddress(RAM_BASE), 16);
        let mut q: Queue = vq.create_queue().unwrap();
        q.try_set_used_ring_address(GuestAddress(USED_RING))
            .unwrap();
        (vq, q)
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
        ram.vmm_dirty().reset();
        assert!(blk.process_queue(0, &mut q, ram.memory()).unwrap());
        let expected: Vec<u8> = (1024..2048).map(pattern).collect();
        assert_eq!(read_guest(&ram, DATA, 1024), expected);
        assert_eq!(status(&ram), S_OK);
        assert_eq!(used_elem(&ram, 0), (0, 1025));
        let dirty = ram.vmm_dirty();
        assert!(dirty.is_bit_set(4) && dirty.is_bit_set(5), "data pages");
        assert!(!dirty.is_bit_set(3) && !dirty.is_bit_set(6));
    }

    /// A read of sector 2 into [`DATA`] (1 KiB), as request `idx`.
    fn read_request(ram: &GuestRam, vq: &MockSplitQueue<'_, GuestMemory>, idx: u16) {
        header(ram, VIRTIO_BLK_T_IN, 2);
        add_chain(
            vq,
            idx,
            &[(HDR, 16, false), (DATA, 1024, true), (STATUS, 1, true)],
        );
    }

    #[test]
    fn a_pending_backing_file_is_waited_for_on_first_use() {
        let ram = ram();
        let (_, f) = disk(false);
        let (tx, rx) = std::sync::mpsc::channel::<File>();
        let waited = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let w = waited.clone();
        let backing = BackingFile::pending(move || {
            w.store(true, std::sync::atomic::Ordering::SeqCst);
            rx.recv().map_err(io::Error::other)
        });
        let mut blk = Block::with_backing(backing, SECTORS * SECTOR_SIZE, false, "x");
        assert_eq!(blk.capacity(), SECTORS);
        assert!(
            !waited.load(std::sync::atomic::Ordering::SeqCst),
            "not before use"
        );
        tx.send(f.try_clone().unwrap()).unwrap();
        let (vq, mut q) = queue(&ram);
        read_request(&ram, &vq, 0);
        blk.process_queue(0, &mut q, ram.memory()).unwrap();
        assert!(waited.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(status(&ram), S_OK);
        let expected: Vec<u8> = (1024..2048).map(pattern).collect();
        assert_eq!(read_guest(&ram, DATA, 1024), expected);
        blk.wait_ready().unwrap();
    }

    #[test]
    fn a_failed_backing_file_fails_every_request() {
        let ram = ram();
        let backing = BackingFile::pending(|| Err(io::Error::other("copy failed")));
        let mut blk = Block::with_backing(backing, SECTORS * SECTOR_SIZE, false, "x");
        let (vq, mut q) = queue(&ram);
        read_request(&ram, &vq, 0);
        blk.process_queue(0, &mut q, ram.memory()).unwrap();
        assert_eq!(status(&ram), S_IOERR);
        let e = blk.wait_ready().unwrap_err();
        assert!(e.to_string().contains("copy failed"), "{e}");
        // Still failing, without calling the closure again.
        read_request(&ram, &vq, 3);
        ram.memory().write_obj(0u8, GuestAddress(STATUS)).unwrap();
        blk.process_queue(0, &mut q, ram.memory()).unwrap();
        assert_eq!(status(&ram), S_IOERR);
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
        blk.process_queue(0, &mut q, ram.memory()).unwrap();
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
            blk.process_queue(0, &mut q, ram.memory()).unwrap();
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
        blk.process_queue(0, &mut q, ram.memory()).unwrap();
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
        blk.process_queue(0, &mut q, ram.memory()).unwrap();
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
        blk.process_queue(0, &mut q, ram.memory()).unwrap();
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
            blk.process_queue(0, &mut q, ram.memory()).unwrap();
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
        blk.process_queue(0, &mut q, ram.memory()).unwrap();
        assert_eq!(status(&ram), S_IOERR);
        assert_eq!(f.metadata().unwrap().len(), SECTORS * SECTOR_SIZE);
        // The last sector itself is fine.
        header(&ram, VIRTIO_BLK_T_IN, SECTORS - 1);
        add_chain(
            &vq,
            0,
            &[(HDR, 16, false), (DATA, 512, true), (STATUS, 1, true)],
        );
        blk.process_queue(0, &mut q, ram.memory()).unwrap();
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
        blk.process_queue(0, &mut q, ram.memory()).unwrap();
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
            assert!(blk.process_queue(0, q, mem).unwrap());
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
        assert_eq!(state.device.acked_features, (1 << 32) | (1 << 9));
    }

    /// [`BlockArgs`] over a copy of `f` of `len` bytes.
    fn args(f: &File, len: u64, read_only: bool) -> BlockArgs {
        BlockArgs {
            file: BackingFile::ready(f.try_clone().unwrap()),
            len,
            read_only,
            serial: "ignition-vda".into(),
        }
    }

    #[test]
    fn restore_checks_the_disk() {
        let (mut blk, f) = disk(false);
        blk.activate((1 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_BLK_F_FLUSH))
            .unwrap();
        let state = blk.save();
        let len = SECTORS * SECTOR_SIZE;
        let same = Block::restore(args(&f, len, false), &state).unwrap();
        assert_eq!(same.save(), state);
        assert!(Block::restore(args(&f, len, true), &state).is_err());
        let small = tempfile::tempfile().unwrap();
        small.set_len(8 * 512).unwrap();
        assert!(Block::restore(args(&small, 8 * 512, false), &state).is_err());
        let mut bad = state;
        bad.acked_features |= 1 << 13;
        assert!(Block::restore(args(&f, len, false), &bad).is_err());
        blk.reset();
        assert_eq!(blk.save().acked_features, 0);
    }
}
