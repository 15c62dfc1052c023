//! Virtio 1.2 devices: the MMIO transport ([`mmio`]), the device models
//! ([`block`], [`net`], [`vsock`]) and the host I/O thread of the devices
//! whose work also arrives from the host ([`host_io`]). A device implements
//! [`VirtioDevice`]; the transport owns the queues (virtio-queue's split
//! [`Queue`]), the feature negotiation and the negotiated features, the
//! device-status state machine and the interrupt.

pub mod block;
pub mod host_io;
pub mod mmio;
pub mod net;
pub mod vsock;

pub use block::Block;
pub use mmio::{VirtioMmio, VirtioMmioState, VirtqueueState};

use crate::devices::Persist;
use crate::memory::GuestMemoryMmap;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{Queue, QueueT};

/// Feature bits the transport offers for every device (virtio 1.2 §6):
/// VIRTIO_F_VERSION_1 (32, required), VIRTIO_F_RING_EVENT_IDX (29) and
/// VIRTIO_F_RING_INDIRECT_DESC (28), all handled by virtio-queue.
pub const TRANSPORT_FEATURES: u64 =
    (1 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_RING_F_EVENT_IDX) | (1 << VIRTIO_RING_F_INDIRECT_DESC);

/// Errors from a device or the transport.
#[derive(Debug, thiserror::Error)]
pub enum VirtioError {
    /// The virtqueue is unusable (bad ring index, bad address, ...).
    #[error("virtqueue: {0}")]
    Queue(#[source] virtio_queue::Error),
    /// A saved state failed validation.
    #[error("invalid saved state: {0}")]
    InvalidState(String),
    /// The device could not start.
    #[error("activation failed: {0}")]
    Activate(String),
}

impl From<virtio_queue::Error> for VirtioError {
    fn from(e: virtio_queue::Error) -> Self {
        VirtioError::Queue(e)
    }
}

/// A virtio device model behind a transport.
///
/// The transport calls these from the vCPU thread that performed the MMIO
/// access (or from the device's host I/O thread, [`VirtioMmio::kick`]),
/// with the device lock held: queue notifications are processed
/// synchronously inside the guest's QueueNotify write.
///
/// A device states its data (type, name, features, queue sizes,
/// configuration space) and processes its queues; the rest has defaults.
/// The negotiated features are the transport's: it passes them to
/// [`VirtioDevice::process_queue`].
///
/// Its [`Persist`] state is the device-specific part of a snapshot; the
/// transport saves its own beside it ([`VirtioMmioState`], the negotiated
/// features included) and, on restore, does not call
/// [`VirtioDevice::activate`] again.
pub trait VirtioDevice: Persist<Error = VirtioError> + Send {
    /// Maximum size of each queue (powers of two, 1..=32768); the slice
    /// length is the number of queues.
    const QUEUE_MAX_SIZES: &'static [u16];

    /// Virtio device ID (virtio 1.2 §5, e.g. 2 for block).
    fn device_type(&self) -> u32;

    /// The device's name in logs (`virtio-blk`, ...).
    fn name(&self) -> &'static str;

    /// Device-specific feature bits offered; the transport adds
    /// [`TRANSPORT_FEATURES`].
    fn features(&self) -> u64;

    /// The device configuration space (the device type's `struct
    /// virtio_*_config`, little-endian), as the driver reads it.
    fn config_as_bytes(&self) -> &[u8];

    /// Reads `data.len()` bytes of device configuration space at `offset`
    /// (relative to the start of the config space). Bytes past the end of
    /// the device's configuration read as 0.
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(self.config_as_bytes(), offset, data);
    }

    /// A driver write to configuration space at `offset`. By default the
    /// space is read-only: the write is ignored, with a warning.
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        crate::warn_ratelimited!(
            "{}: {}-byte write to read-only config offset {offset:#x} ignored",
            self.name(),
            data.len()
        );
    }

    /// The driver set DRIVER_OK with the negotiated `features` (all 64 bits,
    /// transport bits included), for a device that must act on it; an error
    /// makes the transport set DEVICE_NEEDS_RESET. By default nothing.
    fn activate(&mut self, _features: u64) -> Result<(), VirtioError> {
        Ok(())
    }

    /// Processes the available buffers of queue `queue_index` (a ready,
    /// validated queue), adding each to the used ring; `features` are the
    /// negotiated ones (all 64 bits). Returns whether any buffer was used
    /// (the transport then decides on an interrupt, honouring
    /// VIRTIO_F_RING_EVENT_IDX). An error means the queue itself is broken;
    /// per-request problems are reported to the driver in the request.
    fn process_queue(
        &mut self,
        queue_index: usize,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
        features: u64,
    ) -> Result<bool, VirtioError>;

    /// Whether queue `queue_index`, which the device just left with
    /// nothing it could take, waits for the host rather than the driver:
    /// the device runs it again itself once the host has work or room for
    /// it ([`VirtioMmio::kick`], [`VirtioMmio::after_save`]), so a driver
    /// notification would find nothing to do and the transport leaves them
    /// off. By default `false`: the driver's next buffer is awaited.
    fn waits_for_host(&self, _queue_index: usize) -> bool {
        false
    }

    /// Device reset (status 0 written): drop what the driver set up. By
    /// default nothing.
    fn reset(&mut self) {}

    /// Before a snapshot: from now until [`VirtioDevice::after_save`] the
    /// device writes nothing into guest RAM (no buffer, no used-ring
    /// entry); what is in flight completes first. Work arriving from the
    /// host meanwhile waits within the device's usual bounds. By default
    /// nothing (every request completes inside `process_queue`).
    fn prepare_save(&mut self) -> std::io::Result<()> {
        Ok(())
    }

    /// After a snapshot: ends what [`VirtioDevice::prepare_save`] began.
    /// The transport then runs every queue ([`VirtioMmio::after_save`]).
    fn after_save(&mut self) {}
}

/// Copies device configuration bytes `config[offset..]` into `data` for a
/// driver read; bytes past the end of `config` read as 0 (virtio 1.2 §4.2.2:
/// the driver reads the configuration space in any width).
pub fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    for (i, byte) in data.iter_mut().enumerate() {
        *byte = offset
            .checked_add(i as u64)
            .and_then(|o| usize::try_from(o).ok())
            .and_then(|o| config.get(o))
            .copied()
            .unwrap_or(0);
    }
}

/// Publishes used entries `(head, len)` for `queue` at once: writes them at
/// the next used positions, then moves the used index past all of them
/// (one release store), so the driver never sees part of the batch (virtio
/// 1.2 §2.7.8; a mergeable receive frame's buffers, §5.1.6.4, must appear
/// together). Errors: a head out of range, or a used ring outside RAM.
pub fn publish_used(
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    used: &[(u16, u32)],
) -> Result<(), VirtioError> {
    use std::sync::atomic::Ordering;
    use vm_memory::{Bytes, GuestAddress};
    let size = queue.size();
    let next = queue.next_used();
    let ring = queue.used_ring();
    for (i, &(head, len)) in used.iter().enumerate() {
        if head >= size {
            return Err(virtio_queue::Error::InvalidDescriptorIndex.into());
        }
        // struct virtq_used_elem { le32 id; le32 len; } after flags and idx.
        let slot = u64::from(next.wrapping_add(i as u16) % size);
        let addr = ring
            .checked_add(4 + 8 * slot)
            .ok_or(virtio_queue::Error::AddressOverflow)?;
        let mut elem = [0u8; 8];
        elem[..4].copy_from_slice(&u32::from(head).to_le_bytes());
        elem[4..].copy_from_slice(&len.to_le_bytes());
        mem.write_slice(&elem, GuestAddress(addr))
            .map_err(virtio_queue::Error::GuestMemory)?;
    }
    let idx = next.wrapping_add(used.len() as u16);
    let at = ring
        .checked_add(2)
        .ok_or(virtio_queue::Error::AddressOverflow)?;
    mem.store(idx.to_le(), GuestAddress(at), Ordering::Release)
        .map_err(virtio_queue::Error::GuestMemory)?;
    queue.set_next_used(idx);
    Ok(())
}
