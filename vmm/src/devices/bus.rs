//! The MMIO bus: guest-physical address ranges to devices.

use super::{AccessError, MmioDevice};
use crate::sync::Locked;
use std::sync::{Arc, Mutex};

/// An MMIO access that no device can complete (unmapped address, bad size or
/// alignment, device error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MMIO fault at GPA {gpa:#x} ({len} bytes): {reason}")]
pub struct MmioFault {
    /// Guest-physical address of the access.
    pub gpa: u64,
    /// Access size in bytes.
    pub len: usize,
    /// What went wrong.
    pub reason: &'static str,
}

/// A registered range.
struct Entry {
    base: u64,
    size: u64,
    name: &'static str,
    device: Arc<Mutex<dyn MmioDevice>>,
}

/// Errors registering a device.
#[derive(Debug, thiserror::Error)]
#[error("MMIO range {base:#x}+{size:#x} for {name} overlaps {other}")]
pub struct OverlapError {
    base: u64,
    size: u64,
    name: &'static str,
    other: &'static str,
}

/// A device's place on the bus, as [`MmioBus::insert`] takes it: its name
/// (in the bus's warnings), base GPA, size in bytes, and the device.
pub type BusRegion = (&'static str, u64, u64, Arc<Mutex<dyn MmioDevice>>);

/// Guest-physical ranges mapped to devices; lookups by binary search.
#[derive(Default)]
pub struct MmioBus {
    entries: Vec<Entry>,
}

impl MmioBus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps `[base, base+size)` to `device`; ranges must not overlap.
    pub fn insert(
        &mut self,
        name: &'static str,
        base: u64,
        size: u64,
        device: Arc<Mutex<dyn MmioDevice>>,
    ) -> Result<(), OverlapError> {
        if let Some(e) = self
            .entries
            .iter()
            .find(|e| base < e.base + e.size && e.base < base + size)
        {
            return Err(OverlapError {
                base,
                size,
                name,
                other: e.name,
            });
        }
        let pos = self.entries.partition_point(|e| e.base < base);
        self.entries.insert(
            pos,
            Entry {
                base,
                size,
                name,
                device,
            },
        );
        Ok(())
    }

    fn find(&self, gpa: u64) -> Option<&Entry> {
        let i = self.entries.partition_point(|e| e.base <= gpa);
        let e = self.entries.get(i.checked_sub(1)?)?;
        (gpa - e.base < e.size).then_some(e)
    }

    /// Dispatches a load. Unmapped addresses, bad sizes and misalignment are
    /// faults; other device refusals read as zero and are logged.
    pub fn read(&self, vcpu: usize, gpa: u64, data: &mut [u8]) -> Result<(), MmioFault> {
        let e = self.lookup(gpa, data.len())?;
        let result = e.device.locked().read(vcpu, gpa - e.base, data);
        if let Err(err) = result {
            data.fill(0);
            return self.refused(e, gpa, data.len(), err);
        }
        Ok(())
    }

    /// Dispatches a store, as for [`MmioBus::read`].
    pub fn write(&self, vcpu: usize, gpa: u64, data: &[u8]) -> Result<(), MmioFault> {
        let e = self.lookup(gpa, data.len())?;
        let result = e.device.locked().write(vcpu, gpa - e.base, data);
        match result {
            Err(err) => self.refused(e, gpa, data.len(), err),
            Ok(()) => Ok(()),
        }
    }

    fn lookup(&self, gpa: u64, len: usize) -> Result<&Entry, MmioFault> {
        if !matches!(len, 1 | 2 | 4 | 8) {
            return Err(MmioFault {
                gpa,
                len,
                reason: "unsupported access size",
            });
        }
        let e = self.find(gpa).ok_or(MmioFault {
            gpa,
            len,
            reason: "no device at this address",
        })?;
        if gpa - e.base + len as u64 > e.size {
            return Err(MmioFault {
                gpa,
                len,
                reason: "access crosses the end of the device",
            });
        }
        Ok(e)
    }

    fn refused(&self, e: &Entry, gpa: u64, len: usize, err: AccessError) -> Result<(), MmioFault> {
        crate::warn_ratelimited!(
            "{}: guest {}-byte access at GPA {:#x} (offset {:#x}): {}",
            e.name,
            len,
            gpa,
            gpa - e.base,
            err
        );
        if err.is_fault() {
            Err(MmioFault {
                gpa,
                len,
                reason: "device refused the access",
            })
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Reg(u64);
    impl MmioDevice for Reg {
        fn read(&mut self, _: usize, offset: u64, data: &mut [u8]) -> Result<(), AccessError> {
            match offset {
                0 => {
                    super::super::set_le_value(data, self.0);
                    Ok(())
                }
                8 => Err(AccessError::Alignment),
                _ => Err(AccessError::NoRegister),
            }
        }
        fn write(&mut self, _: usize, offset: u64, data: &[u8]) -> Result<(), AccessError> {
            match offset {
                0 => {
                    self.0 = super::super::le_value(data);
                    Ok(())
                }
                _ => Err(AccessError::ReadOnly),
            }
        }
    }

    #[test]
    fn dispatch_faults_and_overlaps() {
        let mut bus = MmioBus::new();
        bus.insert("a", 0x1000, 0x100, Arc::new(Mutex::new(Reg(7))))
            .unwrap();
        bus.insert("b", 0x2000, 0x10, Arc::new(Mutex::new(Reg(9))))
            .unwrap();
        assert!(bus
            .insert("c", 0x10f0, 0x20, Arc::new(Mutex::new(Reg(0))))
            .is_err());
        let mut d = [0u8; 4];
        bus.read(0, 0x2000, &mut d).unwrap();
        assert_eq!(d, [9, 0, 0, 0]);
        bus.write(0, 0x1000, &[5, 0]).unwrap();
        let mut d = [0u8; 8];
        bus.read(0, 0x1000, &mut d).unwrap();
        assert_eq!(d[0], 5);
        // Unmapped, bad size, crossing the end, device fault.
        assert!(bus.read(0, 0x3000, &mut [0u8; 4]).is_err());
        assert!(bus.read(0, 0x0fff, &mut [0u8; 1]).is_err());
        assert!(bus.read(0, 0x1000, &mut [0u8; 3]).is_err());
        assert!(bus.read(0, 0x200c, &mut [0u8; 8]).is_err());
        assert!(bus.read(0, 0x1008, &mut [0u8; 4]).is_err());
        // RAZ/WI refusals are not faults.
        let mut d = [0xffu8; 4];
        bus.read(0, 0x1010, &mut d).unwrap();
        assert_eq!(d, [0; 4]);
        bus.write(0, 0x1010, &[1]).unwrap();
    }
}
