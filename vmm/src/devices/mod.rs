//! Device models. Each is a pure state machine: no threads, no file
//! descriptors of its own beyond what it is given, so each is unit-tested
//! without a VM. Devices reach the interrupt controller through [`IrqLine`]
//! and guest memory through vm-memory, and save and restore their state in
//! one shape ([`Persist`]).

pub mod boot_timer;
pub mod bus;
pub mod gicv3;
#[cfg(test)]
mod hostile_guest;
mod persist;
pub mod pl011;
pub mod pl031;
pub mod virtio;
pub mod vmgenid;

pub use bus::MmioBus;
pub use persist::Persist;

/// Why a device refused an MMIO access. The bus decides what the guest sees:
/// size and alignment errors become a synchronous external abort; the others
/// read as zero / ignore the write, and are logged (rate-limited).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// The access width is not supported by this register.
    #[error("unsupported access size")]
    Size,
    /// The address is not aligned to the access size.
    #[error("unaligned access")]
    Alignment,
    /// A write to a read-only register.
    #[error("write to a read-only register")]
    ReadOnly,
    /// A read of a write-only register.
    #[error("read of a write-only register")]
    WriteOnly,
    /// No register at this offset.
    #[error("no register at this offset")]
    NoRegister,
}

impl AccessError {
    /// Whether the guest gets an abort (`true`) or RAZ/WI (`false`).
    pub fn is_fault(self) -> bool {
        matches!(self, AccessError::Size | AccessError::Alignment)
    }
}

/// A device on the MMIO bus. `offset` is relative to the device's region base;
/// `data` is 1, 2, 4 or 8 bytes, little-endian.
pub trait MmioDevice: Send {
    /// A guest load.
    fn read(&mut self, vcpu: usize, offset: u64, data: &mut [u8]) -> Result<(), AccessError>;
    /// A guest store.
    fn write(&mut self, vcpu: usize, offset: u64, data: &[u8]) -> Result<(), AccessError>;
}

/// An interrupt line from a device to the interrupt controller
/// (level-triggered: the device holds it high while it has a reason).
pub trait IrqLine: Send + Sync {
    /// Drives the line to `level`.
    fn set_level(&self, level: bool);
}

/// Reads a little-endian value of `data.len()` bytes (1..=8).
pub fn le_value(data: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    let n = data.len().min(8);
    buf[..n].copy_from_slice(&data[..n]);
    u64::from_le_bytes(buf)
}

/// For a device of 32-bit registers that also takes 8- and 16-bit accesses
/// (the PrimeCell PL011 and PL031): checks the width (1, 2 or 4 bytes) and
/// natural alignment, and returns the aligned register offset and the bit
/// shift of the access within the register.
pub(crate) fn decode_word_access(offset: u64, len: usize) -> Result<(u64, u32), AccessError> {
    if !matches!(len, 1 | 2 | 4) {
        return Err(AccessError::Size);
    }
    if offset % len as u64 != 0 {
        return Err(AccessError::Alignment);
    }
    Ok((offset & !3, ((offset & 3) * 8) as u32))
}

/// `old` with the bits under `mask` replaced by `value`'s.
pub(crate) fn merge_bits(old: u32, value: u32, mask: u32) -> u32 {
    (old & !mask) | (value & mask)
}

/// Writes the low `data.len()` bytes (1..=8) of `value` little-endian.
pub fn set_le_value(data: &mut [u8], value: u64) {
    let n = data.len().min(8);
    data[..n].copy_from_slice(&value.to_le_bytes()[..n]);
}
