//! The state of a VM that its vCPUs share: guest RAM and what lies at a
//! physical address, write protection and dirty pages, the counter epoch
//! and offset, and the vtimer thread.

use super::attn::VcpuShared;
use super::{mmu, timer};
use crate::arch::layout::{MmioAccess, MmioRegion, MMIO_REGIONS, PAGE_SIZE, RAM_BASE};
use crate::hv::RunRequest;
use crate::memory::{GuestRam, PageBitmap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// What lies at a physical address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PaKind {
    /// RAM, with the 16 KiB page index.
    Ram(u64),
    /// A device region mapped as a unicorn MMIO region.
    FastMmio,
    /// A device region emulated by decoding the faulting instruction.
    TrappedMmio,
    /// Nothing.
    Unmapped,
}

/// Device regions served through unicorn MMIO callbacks (the memory map's
/// [`MmioAccess::Split`] regions); the [`MmioAccess::Exact`] ones are
/// trapped precisely (exact access sizes, aborts on error).
pub(super) fn fast_mmio() -> impl Iterator<Item = &'static MmioRegion> {
    MMIO_REGIONS
        .iter()
        .filter(|r| r.access == MmioAccess::Split)
}

/// State of a VM shared by its vCPUs.
pub(crate) struct VmShared {
    /// The RAM mapping behind `host`.
    pub(super) ram: Arc<GuestRam>,
    pub(super) host: usize,
    pub(super) ram_size: u64,
    /// Write-protected pages (dirty tracking armed).
    pub(crate) wp: PageBitmap,
    /// Pages written since they were protected.
    pub(crate) dirty: PageBitmap,
    /// Physical count 0.
    pub(crate) epoch: Instant,
    /// The VM's counter offset ([`Vm::counter_offset`]).
    pub(crate) counter_offset: AtomicU64,
    pub(crate) vcpus: Vec<Arc<VcpuShared>>,
    pub(crate) timer: timer::TimerThread,
    /// The VMM's run request ([`Vm::set_run_request`]).
    pub(super) run_request: Arc<OnceLock<RunRequest>>,
}

// SAFETY: `host` is the address of the mapping owned by `ram` (kept alive by
// the Arc); it is only read through bounds-checked volatile loads.
unsafe impl Send for VmShared {}
// SAFETY: as above; all other fields are Sync.
unsafe impl Sync for VmShared {}

impl VmShared {
    pub(crate) fn classify(&self, pa: u64) -> PaKind {
        if let Some(off) = pa.checked_sub(RAM_BASE) {
            if off < self.ram_size {
                return PaKind::Ram(off / PAGE_SIZE);
            }
        }
        match MMIO_REGIONS.iter().find(|r| r.contains(pa)) {
            Some(r) if r.access == MmioAccess::Split => PaKind::FastMmio,
            Some(_) => PaKind::TrappedMmio,
            None => PaKind::Unmapped,
        }
    }

    /// Host address of `len` bytes of RAM at `pa`, aligned to `len`.
    fn ram_ptr(&self, pa: u64, len: u64) -> Option<*const u8> {
        let off = pa.checked_sub(RAM_BASE)?;
        if off % len != 0 || off.checked_add(len)? > self.ram_size {
            return None;
        }
        Some((self.host + off as usize) as *const u8)
    }

    /// A little-endian u32 of RAM (instruction fetch for decoding).
    pub(crate) fn ram_u32(&self, pa: u64) -> Option<u32> {
        let p = self.ram_ptr(pa, 4)?;
        // SAFETY: `p` is an aligned, in-bounds address of the live RAM
        // mapping; guest memory is only ever read volatilely here.
        Some(u32::from_le(unsafe { p.cast::<u32>().read_volatile() }))
    }

    /// The physical count now, in guest ticks.
    pub(crate) fn physical_count(&self) -> u64 {
        timer::ticks(self.epoch.elapsed())
    }

    /// The VM's counter offset, in guest ticks.
    pub(crate) fn counter_offset(&self) -> u64 {
        self.counter_offset.load(Ordering::Acquire)
    }

    /// Requests `bits` from every created vCPU except `except`.
    pub(crate) fn broadcast(&self, bits: u32, except: Option<&Arc<VcpuShared>>) {
        for v in &self.vcpus {
            if v.is_created() && !except.is_some_and(|e| Arc::ptr_eq(e, v)) {
                v.request(bits);
            }
        }
    }
}

impl mmu::TableMemory for VmShared {
    fn read_desc(&self, pa: u64) -> Option<u64> {
        let p = self.ram_ptr(pa, 8)?;
        // SAFETY: as in `ram_u32`.
        Some(u64::from_le(unsafe { p.cast::<u64>().read_volatile() }))
    }
}
