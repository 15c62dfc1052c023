//! The virtio-mmio register map (virtio 1.2 §4.2.2, table 4.1) and the
//! device status bits with their order (§3.1.1).

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FAILED, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
    VIRTIO_F_VERSION_1,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

/// MagicValue: "virt" little-endian.
pub const MAGIC_VALUE: u32 = 0x7472_6976;
/// Transport version (2 = virtio 1.x, non-legacy).
pub const MMIO_VERSION: u32 = 2;
/// VendorID: "IGNT" little-endian.
pub const VENDOR_ID: u32 = u32::from_le_bytes(*b"IGNT");
/// InterruptStatus bit: a buffer was used.
pub const INT_VRING: u32 = 1;
/// InterruptStatus bit: the configuration changed (or DEVICE_NEEDS_RESET).
pub const INT_CONFIG: u32 = 2;
/// Offset of the device configuration space.
pub const CONFIG_OFFSET: u64 = 0x100;

// Register offsets, virtio 1.2 §4.2.2 table 4.1.
pub(super) const MAGIC: u64 = 0x000;
pub(super) const VERSION: u64 = 0x004;
pub(super) const DEVICE_ID: u64 = 0x008;
pub(super) const VENDOR: u64 = 0x00c;
pub(super) const DEVICE_FEATURES: u64 = 0x010;
pub(super) const DEVICE_FEATURES_SEL: u64 = 0x014;
pub(super) const DRIVER_FEATURES: u64 = 0x020;
pub(super) const DRIVER_FEATURES_SEL: u64 = 0x024;
pub(super) const QUEUE_SEL: u64 = 0x030;
pub(super) const QUEUE_NUM_MAX: u64 = 0x034;
pub(super) const QUEUE_NUM: u64 = 0x038;
pub(super) const QUEUE_READY: u64 = 0x044;
pub(super) const QUEUE_NOTIFY: u64 = 0x050;
pub(super) const INTERRUPT_STATUS: u64 = 0x060;
pub(super) const INTERRUPT_ACK: u64 = 0x064;
pub(super) const STATUS: u64 = 0x070;
pub(super) const QUEUE_DESC_LOW: u64 = 0x080;
pub(super) const QUEUE_DESC_HIGH: u64 = 0x084;
pub(super) const QUEUE_DRIVER_LOW: u64 = 0x090;
pub(super) const QUEUE_DRIVER_HIGH: u64 = 0x094;
pub(super) const QUEUE_DEVICE_LOW: u64 = 0x0a0;
pub(super) const QUEUE_DEVICE_HIGH: u64 = 0x0a4;
pub(super) const SHM_SEL: u64 = 0x0ac;
pub(super) const SHM_LEN_LOW: u64 = 0x0b0;
pub(super) const SHM_BASE_HIGH: u64 = 0x0bc;
pub(super) const CONFIG_GENERATION: u64 = 0x0fc;

pub(super) const ACKNOWLEDGE: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE;
pub(super) const DRIVER: u32 = VIRTIO_CONFIG_S_DRIVER;
pub(super) const FEATURES_OK: u32 = VIRTIO_CONFIG_S_FEATURES_OK;
pub(super) const DRIVER_OK: u32 = VIRTIO_CONFIG_S_DRIVER_OK;
pub(super) const NEEDS_RESET: u32 = VIRTIO_CONFIG_S_NEEDS_RESET;
pub(super) const FAILED: u32 = VIRTIO_CONFIG_S_FAILED;
pub(super) const STATUS_BITS: u32 =
    ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK | NEEDS_RESET | FAILED;

pub(super) const VERSION_1: u64 = 1 << VIRTIO_F_VERSION_1;
pub(super) const EVENT_IDX: u64 = 1 << VIRTIO_RING_F_EVENT_IDX;

/// Whether every set status bit has its prerequisites (§3.1.1).
pub(super) fn status_order_ok(s: u32) -> bool {
    let needs = |bit: u32, prereq: u32| s & bit == 0 || s & prereq == prereq;
    needs(DRIVER, ACKNOWLEDGE) && needs(FEATURES_OK, DRIVER) && needs(DRIVER_OK, FEATURES_OK)
}
