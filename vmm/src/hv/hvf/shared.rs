//! The state a VM shares with its vCPUs: the dirty bitmap, the counter
//! offset, the in-kernel GIC, and guest RAM with its stage-2 mapping.

use super::ffi::check;
use super::gic;
use crate::arch::layout::{RamRange, PAGE_SIZE};
use crate::hv::{HvError, Prot, Result};
use crate::memory::{GuestRam, PageBitmap};
use applevisor::vm::{GicDisabled, VirtualMachineInstance};
use applevisor_sys::{
    hv_memory_flags_t, hv_vm_protect, hv_vm_unmap, HV_MEMORY_EXEC, HV_MEMORY_READ, HV_MEMORY_WRITE,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// State shared by the VM and its vCPUs. Dropped when the last of them is:
/// RAM is unmapped from the guest before the VM handle and the RAM go.
pub(super) struct VmShared {
    /// Pages the guest wrote since the last [`crate::hv::Vm::dirty_pages`].
    pub(super) dirty: PageBitmap,
    /// Sticky: RAM has been write-protected at least once, so permission
    /// faults in RAM are dirty-page faults (also those that arrive after
    /// tracking stopped).
    pub(super) write_protect_armed: AtomicBool,
    /// The VM's counter offset ([`crate::hv::Vm::counter_offset`]), which every vCPU
    /// sets as its vtimer offset before it enters the guest: the host count
    /// at VM creation (the guest's count starts near 0), until a restore or
    /// a snapshot's resume moves it.
    pub(super) counter_offset: AtomicU64,
    pub(super) freq: u64,
    /// The in-kernel GIC, if the VM has one.
    pub(super) kgic: Option<Arc<gic::HvfGic>>,
    pub(super) ram: Arc<GuestRam>,
    /// Held for its drop, which destroys the VM (`hv_vm_destroy`) after
    /// every vCPU (each holds this struct) and after RAM is unmapped.
    pub(super) _vm: VirtualMachineInstance<GicDisabled>,
}

impl VmShared {
    /// Guest RAM's guest-physical range.
    pub(super) fn ram_range(&self) -> RamRange {
        RamRange {
            base: self.ram.base(),
            size: self.ram.size(),
        }
    }

    /// `hv_vm_protect` on a page range of RAM.
    pub(super) fn protect(&self, gpa: u64, size: u64, flags: hv_memory_flags_t) -> Result<()> {
        let r = self.ram_range();
        let inside = gpa >= r.base && size <= r.size && gpa - r.base <= r.size - size;
        if gpa % PAGE_SIZE != 0 || size % PAGE_SIZE != 0 || size == 0 || !inside {
            return Err(HvError::Call {
                call: "hv_vm_protect",
                detail: format!(
                    "range {gpa:#x}+{size:#x} is not a {PAGE_SIZE}-byte aligned part of RAM"
                ),
            });
        }
        let len = usize::try_from(size).map_err(|_| HvError::Call {
            call: "hv_vm_protect",
            detail: "size does not fit the host address space".into(),
        })?;
        // SAFETY: changes stage-2 permissions of guest RAM that this VM mapped;
        // no host memory is touched.
        let ret = unsafe { hv_vm_protect(gpa, len, flags) };
        check("hv_vm_protect", ret)
    }

    /// Write-protects all of RAM (read/execute).
    pub(super) fn protect_all(&self, prot: Prot) -> Result<()> {
        let r = self.ram_range();
        self.protect(r.base, r.size, flags(prot))
    }

    /// Handles a guest write to write-protected page `page` (its GPA): marks
    /// it dirty, then makes it writable. In that order, so a concurrent
    /// [`crate::hv::Vm::dirty_pages`] either sees the mark or re-protects the
    /// page after it. A background snapshot saves the page first; if
    /// another thread is saving it and `kicked` is set meanwhile, nothing
    /// is done and the answer is `false` (the write faults again when the
    /// vCPU next runs).
    pub(super) fn write_fault(&self, page: u64, kicked: &AtomicBool) -> Result<bool> {
        // `page` is in RAM (decided so); `set` ignores anything else.
        let index = page.wrapping_sub(self.ram.base()) / PAGE_SIZE;
        if !self
            .ram
            .before_guest_write_unless_kicked(index, &|| kicked.load(Ordering::Acquire))
        {
            return Ok(false);
        }
        self.dirty.set(usize::try_from(index).unwrap_or(usize::MAX));
        self.protect(page, PAGE_SIZE, flags(Prot::ReadWriteExec))?;
        Ok(true)
    }
}

impl Drop for VmShared {
    fn drop(&mut self) {
        let Ok(size) = usize::try_from(self.ram.size()) else {
            return;
        };
        // SAFETY: removes the stage-2 mapping made in create_vm; no vCPU runs
        // (each holds a reference to this struct).
        let ret = unsafe { hv_vm_unmap(self.ram.base(), size) };
        if let Err(e) = check("hv_vm_unmap", ret) {
            tracing::warn!("{e}");
        }
    }
}

/// Stage-2 permissions for `prot`.
pub(super) fn flags(prot: Prot) -> hv_memory_flags_t {
    match prot {
        Prot::ReadWriteExec => HV_MEMORY_READ | HV_MEMORY_WRITE | HV_MEMORY_EXEC,
        Prot::ReadExec => HV_MEMORY_READ | HV_MEMORY_EXEC,
    }
}
