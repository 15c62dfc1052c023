//! The `emu` VM: guest RAM and the state its vCPUs share (attention
//! requests between threads, write protection and dirty pages, the counter
//! epoch and offset, the vtimer thread), and the [`Vm`] and [`Hypervisor`]
//! traits.

use super::vcpu::EmuVcpu;
use super::{mmu, timer};
use crate::arch::layout::{self, MmioAccess, MmioRegion, MMIO_REGIONS, PAGE_SIZE, RAM_BASE};
use crate::hv::{GicMode, HvError, Hypervisor, KernelGic, Prot, Result, RunRequest, VcpuId, Vm};
use crate::memory::{GuestRam, PageBitmap};
use crate::sync::Locked;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;
use unicorn_engine::uc_error;

// Attention bits of a vCPU: set from any thread, acted on by the vCPU at its
// next block boundary (the block hook stops the engine) or run entry.

/// A [`Kick`](crate::hv::Kick): `run` returns
/// [`VcpuExit::Kicked`](crate::hv::VcpuExit::Kicked).
pub(super) const ATTN_KICK: u32 = 1 << 0;
/// The virtual timer deadline passed.
pub(super) const ATTN_TIMER: u32 = 1 << 1;
/// Flush the TLB (remote TLBI, protection change).
pub(super) const ATTN_TLB: u32 = 1 << 2;
/// Flush all translated blocks (IC IALLU/IALLUIS, or an overflowing IC queue).
pub(super) const ATTN_TB: u32 = 1 << 3;
/// Drop the translated blocks of the queued code pages (IC IVAU).
pub(super) const ATTN_IC: u32 = 1 << 4;
/// Read the watchpoint registers again and re-protect their pages (quirk
/// 16).
pub(super) const ATTN_WATCH: u32 = 1 << 6;
/// Re-evaluate the IRQ line (it may have risen, in a hook of this vCPU or
/// on another thread) and return to unicorn's main loop to take it.
pub(super) const ATTN_IRQ: u32 = 1 << 5;

/// Most code pages queued for one vCPU before a full TB flush is used instead.
const IC_QUEUE_MAX: usize = 64;

/// State of one vCPU shared with other threads and vCPUs.
pub(crate) struct VcpuShared {
    pub(super) attention: AtomicU32,
    pub(super) ic_pages: Mutex<Vec<u64>>,
    pub(super) created: AtomicBool,
}

impl VcpuShared {
    fn new() -> Self {
        VcpuShared {
            attention: AtomicU32::new(0),
            ic_pages: Mutex::new(Vec::new()),
            created: AtomicBool::new(false),
        }
    }

    /// Sets attention bits.
    pub(crate) fn request(&self, bits: u32) {
        self.attention.fetch_or(bits, Ordering::Release);
    }

    /// Whether anything is requested (checked in the block hook).
    pub(crate) fn pending(&self) -> bool {
        self.attention.load(Ordering::Relaxed) != 0
    }

    pub(crate) fn is_created(&self) -> bool {
        self.created.load(Ordering::Acquire)
    }

    /// Queues a 16 KiB code page (physical address) for invalidation.
    pub(crate) fn queue_ic(&self, page: u64) {
        let mut q = self.ic_pages.locked();
        if q.last() == Some(&page) {
            return;
        }
        if q.len() >= IC_QUEUE_MAX {
            q.clear();
            drop(q);
            self.request(ATTN_TB);
            return;
        }
        q.push(page);
        drop(q);
        self.request(ATTN_IC);
    }
}

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
    run_request: Arc<OnceLock<RunRequest>>,
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

pub(super) fn uc_err(call: &'static str) -> impl Fn(uc_error) -> HvError {
    move |e| HvError::Call {
        call,
        detail: format!("{e:?}"),
    }
}

/// The `emu` hypervisor.
#[derive(Clone, Copy, Debug, Default)]
pub struct EmuHypervisor;

impl EmuHypervisor {
    /// The backend; always available.
    pub fn new() -> Self {
        EmuHypervisor
    }
}

impl Hypervisor for EmuHypervisor {
    type Vm = EmuVm;
    const NAME: &'static str = "emu";
    /// Unicorn engines are driven from one thread, round-robin; another
    /// thread may only kick them (quirk 9).
    const ROUND_ROBIN: bool = true;

    /// Only [`GicMode::Userspace`]: the in-kernel GIC is Hypervisor.framework's.
    fn check_gic_mode(&self, mode: GicMode) -> Result<()> {
        match mode {
            GicMode::Userspace => Ok(()),
            GicMode::Hvf => Err(HvError::GicModeUnavailable {
                mode,
                reason: crate::hv::gic::NO_KERNEL_GIC_ON_EMU.into(),
            }),
        }
    }

    fn create_vm(&self, ram: Arc<GuestRam>, vcpus: usize, gic: GicMode) -> Result<EmuVm> {
        self.check_gic_mode(gic)?;
        EmuVm::new(ram, vcpus)
    }
}

/// A VM of the `emu` backend. Dirty pages are read with
/// [`Vm::dirty_pages`].
pub struct EmuVm {
    shared: Arc<VmShared>,
}

impl EmuVm {
    /// Creates a VM for up to `vcpus` vCPUs over `ram`.
    pub fn new(ram: Arc<GuestRam>, vcpus: usize) -> Result<Self> {
        if vcpus == 0 || vcpus > layout::MAX_VCPUS {
            return Err(HvError::Call {
                call: "create_vm",
                detail: format!("{vcpus} vCPUs (1..={} supported)", layout::MAX_VCPUS),
            });
        }
        let shared_vcpus: Vec<_> = (0..vcpus).map(|_| Arc::new(VcpuShared::new())).collect();
        let run_request = Arc::new(OnceLock::new());
        let timer =
            timer::TimerThread::start(shared_vcpus.clone(), run_request.clone()).map_err(|e| {
                HvError::Call {
                    call: "spawn vtimer thread",
                    detail: e.to_string(),
                }
            })?;
        Ok(EmuVm {
            shared: Arc::new(VmShared {
                host: ram.host_ptr() as usize,
                ram_size: ram.size(),
                wp: ram.page_bitmap(),
                dirty: ram.page_bitmap(),
                ram,
                epoch: Instant::now(),
                counter_offset: AtomicU64::new(0),
                vcpus: shared_vcpus,
                timer,
                run_request,
            }),
        })
    }
}

impl Vm for EmuVm {
    type Vcpu = EmuVcpu;

    fn create_vcpu(&self, id: VcpuId, mpidr: u64) -> Result<EmuVcpu> {
        let Some(shared) = self.shared.vcpus.get(id).cloned() else {
            return Err(HvError::Call {
                call: "create_vcpu",
                detail: format!("vCPU {id} out of range"),
            });
        };
        if shared.created.swap(true, Ordering::AcqRel) {
            return Err(HvError::Call {
                call: "create_vcpu",
                detail: format!("vCPU {id} already exists"),
            });
        }
        EmuVcpu::new(self.shared.clone(), shared.clone(), id, mpidr).inspect_err(|_| {
            shared.created.store(false, Ordering::Release);
        })
    }

    fn protect(&self, gpa: u64, size: u64, prot: Prot) -> Result<()> {
        let vm = &self.shared;
        let bad = gpa % PAGE_SIZE != 0
            || size % PAGE_SIZE != 0
            || gpa < RAM_BASE
            || gpa
                .checked_add(size)
                .is_none_or(|end| end > RAM_BASE + vm.ram_size);
        if bad {
            return Err(HvError::Call {
                call: "protect",
                detail: format!("range {gpa:#x}+{size:#x} is not page-aligned RAM"),
            });
        }
        let first = ((gpa - RAM_BASE) / PAGE_SIZE) as usize;
        let count = (size / PAGE_SIZE) as usize;
        match prot {
            Prot::ReadExec => {
                vm.wp.set_range(first, count);
                // Writable TLB entries must go before the guest runs again.
                vm.broadcast(ATTN_TLB, None);
            }
            // Read-only TLB entries refill as writable on the next store.
            Prot::ReadWriteExec => vm.wp.clear_range(first, count),
        }
        Ok(())
    }

    /// Clears the dirty bitmap and withholds write permission for all of RAM
    /// (a bitmap fill plus a TLB flush request to every vCPU).
    fn rearm_dirty_tracking(&self) -> Result<()> {
        self.shared.dirty.clear_all();
        self.protect(RAM_BASE, self.shared.ram_size, Prot::ReadExec)
    }

    fn dirty_pages(&self) -> Result<Vec<u64>> {
        Ok(self.shared.dirty.marked())
    }

    fn counter_frequency(&self) -> u64 {
        timer::COUNTER_HZ
    }

    fn physical_count(&self) -> u64 {
        self.shared.physical_count()
    }

    fn counter_offset(&self) -> u64 {
        self.shared.counter_offset()
    }

    /// Takes effect at once: every vCPU's count reads the shared offset.
    fn set_counter_offset(&self, offset: u64) {
        self.shared.counter_offset.store(offset, Ordering::Release);
    }

    /// None: the `emu` backend has only the userspace GIC.
    fn kernel_gic(&self) -> Option<Arc<dyn KernelGic>> {
        None
    }

    /// The vtimer thread calls it when a vCPU's deadline passes. Only the
    /// first registration counts.
    fn set_run_request(&self, request: RunRequest) {
        let _ = self.shared.run_request.set(request);
    }
}
