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
///
/// A device may leave available buffers where they are: a receive frame
/// that needs more buffers than the driver has posted, a transmit that
/// waits for the host end. Processing again makes no progress then, so
/// the loop stops. If the device waits for the driver, the driver is asked
/// to notify when it adds its next buffer ([`notify_on_next_buffer`]), not
/// at the first buffer left: the driver has passed that one, so it would
/// never notify again. If it waits for the host
/// ([`VirtioDevice::waits_for_host`]), notifications stay off until the
/// device runs the queue again itself. When the rounds run out, the driver
/// is asked to notify at its next buffer too.
pub(super) fn run_queue<D: VirtioDevice>(
    device: &mut D,
    index: usize,
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    features: u64,
) -> Result<bool, VirtioError> {
    let before = Wrapping(queue.next_used());
    let mut used = false;
    let mut rounds = 0;
    loop {
        queue.disable_notification(mem)?;
        let next_avail = queue.next_avail();
        let progress = device.process_queue(index, queue, mem, features)?;
        used |= progress;
        rounds += 1;
        let stalled = !progress && queue.next_avail() == next_avail;
        if stalled && device.waits_for_host(index) {
            break;
        }
        let more = if stalled || rounds == MAX_NOTIFY_ROUNDS {
            notify_on_next_buffer(queue, mem)?
        } else {
            queue.enable_notification(mem)?
        };
        if !more || rounds == MAX_NOTIFY_ROUNDS {
            break;
        }
    }
    Ok(used && needs_interrupt(queue, mem, before)?)
}

/// Re-enables driver notifications so that the driver notifies when it
/// makes its next buffer available, whatever the device left in the ring:
/// with VIRTIO_F_RING_EVENT_IDX, `avail_event` is set to the available
/// index the driver has published (virtio 1.2 §2.7.10: it notifies when
/// its new index passes `avail_event`). Returns whether the driver
/// published more buffers meanwhile (then the device must look again).
fn notify_on_next_buffer(queue: &mut Queue, mem: &GuestMemoryMmap) -> Result<bool, VirtioError> {
    let seen = queue.avail_idx(mem, Ordering::Acquire)?;
    if queue.event_idx_enabled() {
        // avail_event follows the used ring's entries (§2.7.8).
        let addr = queue
            .used_ring()
            .checked_add(4 + 8 * u64::from(queue.size()))
            .ok_or(virtio_queue::Error::AddressOverflow)?;
        mem.store(seen.0.to_le(), GuestAddress(addr), Ordering::Relaxed)
            .map_err(virtio_queue::Error::GuestMemory)?;
    } else {
        // Clears VRING_USED_F_NO_NOTIFY; what it says about the ring is
        // answered below.
        queue.enable_notification(mem)?;
    }
    // The driver reads avail_event after publishing its index: either it
    // sees ours, or we see its index.
    fence(Ordering::SeqCst);
    Ok(queue.avail_idx(mem, Ordering::Acquire)? != seen)
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
