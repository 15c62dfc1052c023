//! The transport's saved state: its registers, each virtqueue's, and the
//! device's beside them.

use serde::{Deserialize, Serialize};
use virtio_queue::QueueState;

/// Saved state of one split virtqueue: a serializable mirror of
/// virtio-queue's [`QueueState`]. Untrusted; validated on restore.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VirtqueueState {
    /// Maximum size offered by the device (QueueNumMax).
    pub max_size: u16,
    /// Next available-ring entry the device will read.
    pub next_avail: u16,
    /// Next used-ring entry the device will write.
    pub next_used: u16,
    /// Whether VIRTIO_F_RING_EVENT_IDX is in effect.
    pub event_idx_enabled: bool,
    /// Queue size chosen by the driver (QueueNum).
    pub size: u16,
    /// QueueReady.
    pub ready: bool,
    /// Guest-physical address of the descriptor table.
    pub desc_table: u64,
    /// Guest-physical address of the driver (available) ring.
    pub avail_ring: u64,
    /// Guest-physical address of the device (used) ring.
    pub used_ring: u64,
}

impl From<QueueState> for VirtqueueState {
    fn from(s: QueueState) -> Self {
        VirtqueueState {
            max_size: s.max_size,
            next_avail: s.next_avail,
            next_used: s.next_used,
            event_idx_enabled: s.event_idx_enabled,
            size: s.size,
            ready: s.ready,
            desc_table: s.desc_table,
            avail_ring: s.avail_ring,
            used_ring: s.used_ring,
        }
    }
}

impl From<VirtqueueState> for QueueState {
    fn from(s: VirtqueueState) -> Self {
        QueueState {
            max_size: s.max_size,
            next_avail: s.next_avail,
            next_used: s.next_used,
            event_idx_enabled: s.event_idx_enabled,
            size: s.size,
            ready: s.ready,
            desc_table: s.desc_table,
            avail_ring: s.avail_ring,
            used_ring: s.used_ring,
        }
    }
}

/// Saved transport state plus the device's own. Untrusted: validated by the
/// transport's [`crate::devices::Persist::restore`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VirtioMmioState<S> {
    /// Device status register.
    pub status: u32,
    /// Features the driver accepted (64 bits).
    pub driver_features: u64,
    /// DeviceFeaturesSel.
    pub device_features_sel: u32,
    /// DriverFeaturesSel.
    pub driver_features_sel: u32,
    /// QueueSel.
    pub queue_sel: u32,
    /// InterruptStatus.
    pub interrupt_status: u32,
    /// ConfigGeneration.
    pub config_generation: u32,
    /// One entry per device queue.
    pub queues: Vec<VirtqueueState>,
    /// The device's state.
    pub device: S,
}
