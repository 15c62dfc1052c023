//! virtio-blk (virtio 1.2 §5.2) backed by a regular host file, or by a
//! restored VM's overlay on its snapshot's disk.
//!
//! One request queue. Requests run synchronously in
//! [`VirtioDevice::process_queue`] with positioned I/O (`pread`/`pwrite`)
//! through a bounce buffer, so none is ever in flight: before a snapshot,
//! [`VirtioDevice::prepare_save`] (the default) has nothing to wait for,
//! and does not fsync the disk. Guest memory is only touched through vm-memory
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

use super::{VirtioDevice, VirtioError};
use crate::devices::Persist;
use crate::memory::GuestMemoryMmap;
use serde::{Deserialize, Serialize};
use snapshot_store::{DiskOverlay, DiskSource, DISK_CHUNK_SIZE};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
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

const S_OK: u8 = VIRTIO_BLK_S_OK as u8;
const S_IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
const S_UNSUPP: u8 = VIRTIO_BLK_S_UNSUPP as u8;

/// The disk behind a [`Block`]: a host file (the user's image), or a
/// restored VM's overlay on its snapshot's disk ([`DiskOverlay`]: a chunk
/// is read from the snapshot's layers until the guest first writes to it,
/// so the VM starts without copying its disk).
#[derive(Debug, Clone)]
pub enum BlockDisk {
    /// A regular file, read and written in place.
    File(Arc<File>),
    /// A snapshot's disk with the guest's writes in a private overlay.
    Overlay(Arc<DiskOverlay>),
}

impl BlockDisk {
    /// Fills `buf` from byte `offset` of the disk.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match self {
            BlockDisk::File(f) => f.read_exact_at(buf, offset),
            BlockDisk::Overlay(o) => o.read_exact_at(buf, offset).map_err(io::Error::other),
        }
    }

    /// Writes `buf` at byte `offset` of the disk.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        match self {
            BlockDisk::File(f) => f.write_all_at(buf, offset),
            BlockDisk::Overlay(o) => o.write_all_at(buf, offset).map_err(io::Error::other),
        }
    }

    /// Makes the writes durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()> {
        match self {
            BlockDisk::File(f) => f.sync_data(),
            BlockDisk::Overlay(o) => o.sync_data().map_err(io::Error::other),
        }
    }
}

/// Told before a write request changes bytes of the disk file: a snapshot
/// copying the image while the VM runs copies those bytes first.
pub trait BeforeDiskWrite: Send + Sync {
    /// Bytes `offset..offset + len` of the disk file are about to change.
    fn before_write(&self, offset: u64, len: u64);
}

impl BeforeDiskWrite for snapshot_store::DiskCopy {
    fn before_write(&self, offset: u64, len: u64) {
        snapshot_store::DiskCopy::before_write(self, offset, len);
    }
}

/// A virtio block device over a host file or an overlay.
pub struct Block {
    disk: BlockDisk,
    read_only: bool,
    capacity: u64,
    serial: [u8; ID_BYTES],
    config: [u8; CONFIG_LEN],
    bounce: Vec<u8>,
    /// Chunks a write reached since [`Block::clear_written_chunks`].
    written: WrittenChunks,
    /// Told before every write to the file ([`Block::set_before_write`]).
    before_write: Option<Arc<dyn BeforeDiskWrite>>,
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
/// checks the disk still has the same shape. (The negotiated features are
/// the transport's; a state from before that, which also holds them as
/// `acked_features`, reads the same.)
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockState {
    /// Capacity in 512-byte sectors.
    pub capacity: u64,
    /// Whether the device was offered as read-only.
    pub read_only: bool,
}

/// What a [`Block`] is made from besides its saved state, as for
/// [`Block::with_disk`].
pub struct BlockArgs {
    /// The disk.
    pub disk: BlockDisk,
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
        Ok(Self::with_disk(
            BlockDisk::File(Arc::new(file)),
            len,
            read_only,
            serial,
        ))
    }

    /// As [`Block::new`], over `disk`, `len` bytes long.
    pub fn with_disk(disk: BlockDisk, len: u64, read_only: bool, serial: &str) -> Self {
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
            disk,
            read_only,
            capacity,
            serial: id,
            config,
            bounce: vec![0; BOUNCE_LEN],
            written: WrittenChunks::new(len),
            before_write: None,
        }
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

    /// Sets (or with `None` clears) what is told before each write to the
    /// disk file.
    pub fn set_before_write(&mut self, hook: Option<Arc<dyn BeforeDiskWrite>>) {
        self.before_write = hook;
    }

    /// Whether the disk is read-only to the guest.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Handles one request chain; returns the used length (bytes written
    /// into guest memory, status byte included).
    fn handle(&mut self, chain: DescriptorChain<&GuestMemoryMmap>, mem: &GuestMemoryMmap) -> u32 {
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
        chain: DescriptorChain<&GuestMemoryMmap>,
        mem: &GuestMemoryMmap,
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
            VIRTIO_BLK_T_FLUSH => match self.disk.sync_data() {
                Ok(()) => (S_OK, 0),
                Err(e) => {
                    crate::warn_ratelimited!("virtio-blk: flush: {e}");
                    (S_IOERR, 0)
                }
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
        chain: DescriptorChain<&GuestMemoryMmap>,
        mem: &GuestMemoryMmap,
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
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(BOUNCE_LEN as u64) as usize;
            let buf = &mut self.bounce[..n];
            if let Err(e) = self.disk.read_exact_at(buf, offset + done) {
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
            if let Some(hook) = &self.before_write {
                hook.before_write(offset + done, n as u64);
            }
            if let Err(e) = self.disk.write_all_at(buf, offset + done) {
                crate::warn_ratelimited!("virtio-blk: write at {}: {e}", offset + done);
                return (S_IOERR, 0);
            }
            done += n as u64;
        }
        (S_OK, 0)
    }

    fn get_id(
        &mut self,
        chain: DescriptorChain<&GuestMemoryMmap>,
        mem: &GuestMemoryMmap,
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
    const QUEUE_MAX_SIZES: &'static [u16] = &[QUEUE_SIZE];

    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn name(&self) -> &'static str {
        "virtio-blk"
    }

    fn features(&self) -> u64 {
        let mut f =
            (1 << VIRTIO_BLK_F_SEG_MAX) | (1 << VIRTIO_BLK_F_BLK_SIZE) | (1 << VIRTIO_BLK_F_FLUSH);
        if self.read_only {
            f |= 1 << VIRTIO_BLK_F_RO;
        }
        f
    }

    fn config_as_bytes(&self) -> &[u8] {
        &self.config
    }

    fn process_queue(
        &mut self,
        _queue_index: usize,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
        _features: u64,
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
}

impl Persist for Block {
    type State = BlockState;
    type Args = BlockArgs;
    type Error = VirtioError;

    fn save(&self) -> BlockState {
        BlockState {
            capacity: self.capacity,
            read_only: self.read_only,
        }
    }

    /// The device over `args`' disk, which must still have the saved shape
    /// (capacity, read-only).
    fn restore(args: BlockArgs, state: &BlockState) -> Result<Self, VirtioError> {
        let blk = Block::with_disk(args.disk, args.len, args.read_only, &args.serial);
        if state.capacity != blk.capacity || state.read_only != blk.read_only {
            return Err(VirtioError::InvalidState(format!(
                "disk was {} sectors{}, now {} sectors{}",
                state.capacity,
                if state.read_only { " read-only" } else { "" },
                blk.capacity,
                if blk.read_only { " read-only" } else { "" },
            )));
        }
        Ok(blk)
    }
}

#[cfg(test)]
mod tests;
