//! What a notification does: the device processes the queue until the
//! driver has nothing more for it, and the transport decides whether the
//! driver wants an interrupt (virtio 1.2 §2.7.10).

use crate::devices::virtio::{VirtioDevice, VirtioError};
use crate::memory::GuestMemoryMmap;
use std::num::Wrapping;
use std::sync::atomic::{fence, Ordering};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

/// Rounds of "process, re-enable notifications, re-check" per QueueNotify
/// before giving the vCPU back (bounds the time a busy driver can hold it).
const MAX_NOTIFY_ROUNDS: usize = 64;

/// Processes `queue` until the driver has nothing more for it, with driver
/// notifications suppressed meanwhile; returns whether to interrupt.
pub(super) fn run_queue<D: VirtioDevice>(
    device: &mut D,
    index: usize,
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    features: u64,
) -> Result<bool, VirtioError> {
    let before = Wrapping(queue.next_used());
    let mut used = false;
    for _ in 0..MAX_NOTIFY_ROUNDS {
        queue.disable_notification(mem)?;
        used |= device.process_queue(index, queue, mem, features)?;
        if !queue.enable_notification(mem)? {
            break;
        }
    }
    Ok(used && needs_interrupt(queue, mem, before)?)
}

/// Whether the driver wants an interrupt for the used entries added since
/// the used index was `before`: always without VIRTIO_F_RING_EVENT_IDX;
/// with it, when `used_event` lies in `[before, next_used)` (virtio 1.2
/// §2.7.10). Counted from the index, so entries a device published itself
/// ([`crate::devices::virtio::publish_used`]) count too.
fn needs_interrupt(
    queue: &Queue,
    mem: &GuestMemoryMmap,
    before: Wrapping<u16>,
) -> Result<bool, VirtioError> {
    if !queue.event_idx_enabled() {
        return Ok(true);
    }
    // The used entries are visible before the driver's event is read.
    fence(Ordering::SeqCst);
    // used_event follows the avail ring's entries (§2.7.6).
    let addr = queue
        .avail_ring()
        .checked_add(4 + 2 * u64::from(queue.size()))
        .ok_or(virtio_queue::Error::AddressOverflow)?;
    let event = mem
        .load::<u16>(GuestAddress(addr), Ordering::Acquire)
        .map(u16::from_le)
        .map_err(virtio_queue::Error::GuestMemory)?;
    let now = Wrapping(queue.next_used());
    Ok(now - Wrapping(event) - Wrapping(1) < now - before)
}
