//! The portable `emu` backend: each vCPU is a stock unicorn-engine (QEMU TCG)
//! aarch64 CPU, with the parts unicorn lacks done in Rust (see
//! `shared/notes/emu.md`; its quirk numbers are cited in comments).
//!
//! - Translation: unicorn's TLB is virtual and filled by [`mmu`], the VMM's
//!   stage-1 walker (quirk 1, page size 4 KiB per quirk 3). Translation,
//!   access-flag and permission faults, and accesses to physical addresses
//!   backed by nothing, are delivered to the guest's EL1 vectors
//!   ([`exception`]).
//! - Devices: the memory map says how each region must be reached
//!   ([`MmioAccess`]). [`MmioAccess::Split`] regions are unicorn MMIO regions
//!   whose callbacks call [`VcpuIo`] (fast, but unicorn splits 8-byte
//!   accesses into two 4-byte ones, and a device error can only read as zero
//!   / be ignored). [`MmioAccess::Exact`] regions (the GIC's, with 64-bit
//!   registers) are trapped precisely instead: the TLB hook refuses them, and
//!   the run loop decodes the load/store ([`insn`]), calls [`VcpuIo`] with
//!   the exact size, and completes the instruction; a device error there
//!   becomes a synchronous external abort.
//! - System registers (quirk 6): ICC_* go to [`VcpuIo`]; the counter and the
//!   EL1 virtual timer are emulated ([`timer`], quirk 7); ID_AA64MMFR0_EL1
//!   advertises the 16 KiB granule (quirk 13).
//! - Interrupts: HCR_EL2.VI follows [`VcpuIo::irq_line`] (quirk 5).
//! - Stops: other threads only set flags; a block hook stops the engine
//!   before a block's first instruction (quirk 9). With several vCPUs it
//!   also notices a guest looping on WFE/YIELD and returns
//!   [`VcpuExit::Wfe`] so the run loop can switch vCPUs ([`spin`]).
//! - Coherence between engines (quirk 11, SMP notes): TLBI and IC
//!   maintenance is applied to every engine before it next runs a block.
//! - Dirty tracking: [`Vm::protect`] write-protects 16 KiB pages in the TLB
//!   fill; the first store marks the page for [`Vm::dirty_pages`].
//!
//! Limits: the CPU model is a Cortex-A72 (ARMv8.0: no LSE, PAN or SVE);
//! LDTR/STTR are checked with the permissions of the current EL (quirk 12);
//! WFE is a plain yield inside unicorn with no hook, so [`VcpuExit::Wfe`] is
//! returned only once a guest has looped on a WFE for a while, and only in
//! VMs with several vCPUs; an undefined instruction is reported with EC 0
//! (quirk 14); asking [`Vcpu::sysreg`] for a register unicorn does not know
//! makes unicorn print a deprecation warning on stderr (the call still
//! fails cleanly).

mod hooks;
pub mod insn;
pub mod mmu;
pub mod spin;
pub mod timer;
mod uc;

#[cfg(test)]
mod tests;

use self::hooks::{HookState, MmioCtx, PendingFault};
use self::uc::Uc;
use crate::arch::esr;
use crate::arch::exception::{CpuFeatures, PSTATE_DAIF, PSTATE_EL1H};
use crate::arch::layout::{self, MmioAccess, MmioRegion, MMIO_REGIONS, PAGE_SIZE, RAM_BASE};
use crate::arch::sysreg::{self as sr, SysReg};
use crate::hv::{
    GicMode, HvError, Hypervisor, KernelGic, Kick, Prot, Reg, Result, Vcpu, VcpuExit, VcpuId,
    VcpuIo, Vm,
};
use crate::memory::{marked_pages, GuestRam};
use crate::sync::Locked;
use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use unicorn_engine::{
    uc_error, uc_hook, uc_hook_add, uc_mmio_map, Arch, Arm64CpuModel, Arm64Insn, HookType, Mode,
    RegisterARM64 as R, TlbType, Unicorn,
};
use vm_memory::bitmap::AtomicBitmap;

// Attention bits of a vCPU: set from any thread, acted on by the vCPU at its
// next block boundary (the block hook stops the engine) or run entry.

/// A [`Kick`]: `run` returns [`VcpuExit::Kicked`].
const ATTN_KICK: u32 = 1 << 0;
/// The virtual timer deadline passed.
const ATTN_TIMER: u32 = 1 << 1;
/// Flush the TLB (remote TLBI, protection change).
const ATTN_TLB: u32 = 1 << 2;
/// Flush all translated blocks (IC IALLU/IALLUIS, or an overflowing IC queue).
const ATTN_TB: u32 = 1 << 3;
/// Drop the translated blocks of the queued code pages (IC IVAU).
const ATTN_IC: u32 = 1 << 4;
/// The IRQ line rose inside a hook; return to unicorn's main loop to take it.
const ATTN_IRQ: u32 = 1 << 5;

/// Most code pages queued for one vCPU before a full TB flush is used instead.
const IC_QUEUE_MAX: usize = 64;

/// State of one vCPU shared with other threads and vCPUs.
pub(crate) struct VcpuShared {
    attention: AtomicU32,
    ic_pages: Mutex<Vec<u64>>,
    created: AtomicBool,
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
fn fast_mmio() -> impl Iterator<Item = &'static MmioRegion> {
    MMIO_REGIONS
        .iter()
        .filter(|r| r.access == MmioAccess::Split)
}

/// State of a VM shared by its vCPUs.
pub(crate) struct VmShared {
    /// Keeps the RAM mapping behind `host` alive.
    _ram: Arc<GuestRam>,
    host: usize,
    ram_size: u64,
    /// Write-protected pages (dirty tracking armed).
    pub(crate) wp: AtomicBitmap,
    /// Pages written since they were protected.
    pub(crate) dirty: AtomicBitmap,
    /// Physical count 0.
    pub(crate) epoch: Instant,
    pub(crate) vcpus: Vec<Arc<VcpuShared>>,
    pub(crate) timer: timer::TimerThread,
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

fn uc_err(call: &'static str) -> impl Fn(uc_error) -> HvError {
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
        let timer = timer::TimerThread::start(shared_vcpus.clone()).map_err(|e| HvError::Call {
            call: "spawn vtimer thread",
            detail: e.to_string(),
        })?;
        Ok(EmuVm {
            shared: Arc::new(VmShared {
                host: ram.host_ptr() as usize,
                ram_size: ram.size(),
                wp: ram.page_bitmap(),
                dirty: ram.page_bitmap(),
                _ram: ram,
                epoch: Instant::now(),
                vcpus: shared_vcpus,
                timer,
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
        let (offset, len) = ((gpa - RAM_BASE) as usize, size as usize);
        match prot {
            Prot::ReadExec => {
                vm.wp.set_addr_range(offset, len);
                // Writable TLB entries must go before the guest runs again.
                vm.broadcast(ATTN_TLB, None);
            }
            // Read-only TLB entries refill as writable on the next store.
            Prot::ReadWriteExec => vm.wp.reset_addr_range(offset, len),
        }
        Ok(())
    }

    /// Clears the dirty bitmap and withholds write permission for all of RAM
    /// (a bitmap fill plus a TLB flush request to every vCPU).
    fn rearm_dirty_tracking(&self) -> Result<()> {
        self.shared.dirty.reset();
        self.protect(RAM_BASE, self.shared.ram_size, Prot::ReadExec)
    }

    fn dirty_pages(&self) -> Result<Vec<u64>> {
        Ok(marked_pages(&self.shared.dirty))
    }

    fn counter_frequency(&self) -> u64 {
        timer::COUNTER_HZ
    }

    fn physical_count(&self) -> u64 {
        self.shared.physical_count()
    }

    /// None: the `emu` backend has only the userspace GIC.
    fn kernel_gic(&self) -> Option<Arc<dyn KernelGic>> {
        None
    }
}

/// Makes a vCPU's `run` return [`VcpuExit::Kicked`].
struct EmuKicker(Arc<VcpuShared>);

impl Kick for EmuKicker {
    fn kick(&self) {
        self.0.request(ATTN_KICK);
    }
}

/// A vCPU of the `emu` backend: one unicorn engine, owned by the thread that
/// created it.
pub struct EmuVcpu {
    id: VcpuId,
    engine: ManuallyDrop<Unicorn<'static, ()>>,
    uc: Uc,
    /// Heap state the hooks point at; freed after the engine is closed.
    state: NonNull<HookState>,
    shared: Arc<VcpuShared>,
}

impl Drop for EmuVcpu {
    fn drop(&mut self) {
        // SAFETY: the engine is closed first, so no hook can run afterwards;
        // then the hook state (allocated by Box in `new`) is freed once.
        unsafe {
            ManuallyDrop::drop(&mut self.engine);
            let st = Box::from_raw(self.state.as_ptr());
            st.vm.timer.arm(self.id, None);
        }
        self.shared.created.store(false, Ordering::Release);
    }
}

impl EmuVcpu {
    fn new(vm: Arc<VmShared>, shared: Arc<VcpuShared>, id: VcpuId, mpidr: u64) -> Result<Self> {
        let mut engine = Unicorn::new(Arch::ARM64, Mode::ARM).map_err(uc_err("uc_open"))?;
        // Before the engine initialises: CPU model and page size (quirk 3).
        // Cortex-A72 (ARMv8.0, no PAN/SVE); the 16K granule is advertised by
        // the VMM because translation is the VMM's (quirk 13).
        engine
            .ctl_set_cpu_model(Arm64CpuModel::A72 as i32)
            .map_err(uc_err("set cpu model"))?;
        engine
            .ctl_set_page_size(4096)
            .map_err(uc_err("set page size"))?;
        engine
            .ctl_set_tlb_type(TlbType::VIRTUAL)
            .map_err(uc_err("set tlb type"))?;
        // No exit addresses: emulation never stops at a magic PC.
        engine.ctl_exits_enable().map_err(uc_err("exits"))?;
        let handle = engine.get_handle();
        // SAFETY: `handle` is the live engine owned by `engine`, which this
        // vCPU keeps until `Drop`, and it is used on this thread only.
        let uc = unsafe { Uc::new(handle) };
        let state = Box::new(HookState {
            id,
            uc,
            vm: vm.clone(),
            me: shared.clone(),
            io: None,
            walk: None,
            cntkctl: 0,
            vtimer: timer::VTimer::default(),
            vtimer_offset: 0,
            reported_level: None,
            armed: None,
            hcr: hooks::HCR_RW | hooks::HCR_IMO,
            fault: None,
            exit: None,
            stopped_by_hook: false,
            fills: 0,
            ic_memo: [u64::MAX; hooks::IC_MEMO],
            identity: false,
            panic: None,
            mpidr: mpidr | (1 << 31),
            id_mmfr0: 0,
            id_pfr0: 0,
            features: CpuFeatures {
                pan: false,
                ssbs: false,
            },
            mmio_ctx: Vec::new(),
            spin: spin::SpinDetector::default(),
            spin_enabled: vm.vcpus.len() > 1,
        });
        let vcpu = EmuVcpu {
            id,
            engine: ManuallyDrop::new(engine),
            uc,
            state: NonNull::from(Box::leak(state)),
            shared,
        };
        vcpu.setup(&vm)?;
        Ok(vcpu)
    }

    fn setup(&self, vm: &VmShared) -> Result<()> {
        let uc = self.uc;
        let handle = self.engine.get_handle();
        let ud = self.state.as_ptr().cast::<c_void>();
        // SAFETY: RAM is the VMM's mapping of `ram_size` bytes (4 KiB
        // multiple), kept alive by `vm.ram` for as long as this engine.
        unsafe {
            uc_mem_map_ptr_checked(handle, RAM_BASE, vm.ram_size, vm.host as *mut c_void)?;
        }
        // Fast-path device regions. The contexts live in the hook state,
        // whose vector is filled once here and never reallocated.
        let ctxs = {
            // SAFETY: no hook can run yet, so this is the only reference.
            let st = unsafe { &mut *self.state.as_ptr() };
            st.mmio_ctx = fast_mmio()
                .map(|r| MmioCtx {
                    state: self.state.as_ptr(),
                    base: r.base,
                })
                .collect();
            st.mmio_ctx.as_mut_ptr()
        };
        for (i, r) in fast_mmio().enumerate() {
            // SAFETY: `i` is in bounds of the vector, which stays allocated
            // (and unmoved) until the engine is closed in `Drop`.
            let ctx = unsafe { ctxs.add(i) };
            // SAFETY: the callbacks match unicorn's MMIO callback types and
            // `ctx` outlives the engine.
            let e = unsafe {
                uc_mmio_map(
                    handle,
                    r.base,
                    r.size,
                    Some(hooks::mmio_read_cb),
                    ctx.cast(),
                    Some(hooks::mmio_write_cb),
                    ctx.cast(),
                )
            };
            std::result::Result::<(), uc_error>::from(e).map_err(uc_err("uc_mmio_map"))?;
        }
        // Hooks, all raw (quirk 15).
        let all = (1u64, 0u64); // begin > end: every address
                                // SAFETY: each callback has the C signature unicorn expects for its
                                // hook type, and `ud` outlives the engine.
        unsafe {
            add_hook(
                handle,
                HookType::BLOCK,
                hooks::block_hook as *mut c_void,
                ud,
                all,
                None,
            )?;
            add_hook(
                handle,
                HookType::INTR,
                hooks::intr_hook as *mut c_void,
                ud,
                all,
                None,
            )?;
            // Never fires (the TLB hook sends every unbacked access to the
            // guest), but its presence over an address makes unicorn skip,
            // for blocks translated at that virtual address, a walk of the
            // whole TLB that re-arms its own self-modifying-code detection
            // (about a fifth of boot time). Coherence comes from the guest's
            // IC maintenance instead (quirk 11). The ranges leave out RAM's
            // physical window, where unicorn also consults memory hooks and
            // any hook would slow every store (quirk 10).
            let ram_end = RAM_BASE + vm.ram_size;
            for range in [(0, RAM_BASE - 1), (ram_end, u64::MAX)] {
                add_hook(
                    handle,
                    HookType::MEM_FETCH_UNMAPPED,
                    hooks::unmapped_fetch_hook as *mut c_void,
                    ud,
                    range,
                    None,
                )?;
            }
            add_hook(
                handle,
                HookType::TLB_FILL,
                hooks::tlb_hook as *mut c_void,
                ud,
                all,
                None,
            )?;
            let mrs = hooks::mrs_hook as *mut c_void;
            let msr = hooks::msr_hook as *mut c_void;
            add_hook(
                handle,
                HookType::INSN,
                mrs,
                ud,
                all,
                Some(Arm64Insn::UC_ARM64_INS_MRS),
            )?;
            add_hook(
                handle,
                HookType::INSN,
                msr,
                ud,
                all,
                Some(Arm64Insn::UC_ARM64_INS_MSR),
            )?;
            add_hook(
                handle,
                HookType::INSN,
                msr,
                ud,
                all,
                Some(Arm64Insn::UC_ARM64_INS_SYS),
            )?;
        }

        // Entry state (quirk 2): Non-secure, EL2 present with HVC enabled,
        // EL1 AArch64; IRQs routed as virtual IRQs. Unicorn starts at EL1h
        // with the MMU off; make PSTATE exactly EL1h with DAIF masked (its
        // reset value has Z set). The CP_REG writes below rebuild unicorn's
        // cached flags (quirk 4).
        uc.write(R::PSTATE, PSTATE_DAIF | PSTATE_EL1H)
            .map_err(uc_err("write PSTATE"))?;
        let cp = |reg: SysReg, v: u64| uc.cp_write(reg, v).map_err(uc_err("write system register"));
        cp(sr::SCR_EL3, (1 << 10) | (1 << 8) | 1)?; // RW | HCE | NS
        cp(sr::HCR_EL2, hooks::HCR_RW | hooks::HCR_IMO)?;
        // EL1 physical counter and timer not trapped to EL2.
        cp(sr::CNTHCTL_EL2, 3)?;
        // SAFETY: no hook runs while this setup code does.
        let st = unsafe { &mut *self.state.as_ptr() };
        cp(sr::VMPIDR_EL2, st.mpidr)?;
        let rd = |reg: SysReg| uc.cp_read(reg).map_err(uc_err("read system register"));
        st.id_mmfr0 = (rd(sr::ID_AA64MMFR0_EL1)? & !(0xf << 20)) | (1 << 20); // TGran16
        st.id_pfr0 = (rd(sr::ID_AA64PFR0_EL1)? & !(0xf << 24)) | (1 << 24); // GIC sysregs
        st.features =
            CpuFeatures::from_id_regs(rd(sr::ID_AA64MMFR1_EL1)?, rd(sr::ID_AA64PFR1_EL1)?);
        Ok(())
    }

    /// The hook state, outside `emu_start`.
    fn state(&mut self) -> &mut HookState {
        // SAFETY: the state is valid until `Drop`; hooks only run inside
        // `emu_start`, during which no reference from here is held.
        unsafe { &mut *self.state.as_ptr() }
    }

    /// Applies requests made by other threads, vCPUs or hooks.
    fn apply_attention(&mut self, att: u32) -> Result<()> {
        let uc = self.uc;
        if att & ATTN_TB != 0 {
            uc.flush_tb().map_err(uc_err("flush translated blocks"))?;
            // A full flush covers queued pages.
            self.shared.ic_pages.locked().clear();
        } else if att & ATTN_IC != 0 {
            let pages = std::mem::take(&mut *self.shared.ic_pages.locked());
            if !pages.is_empty() {
                self.invalidate_code(&pages)?;
            }
        }
        if att & ATTN_TLB != 0 {
            uc.flush_tlb().map_err(uc_err("flush TLB"))?;
            self.state().fills = 0;
        }
        if att & ATTN_TIMER != 0 {
            // The timer thread disarmed this deadline when it fired.
            self.state().armed = None;
        }
        Ok(())
    }

    /// Drops the translated blocks of the 16 KiB physical pages `pages`.
    /// `remove_cache` takes a virtual address, so the TLB hook is switched
    /// to an identity mapping around it (and the TLB flushed on both sides).
    fn invalidate_code(&mut self, pages: &[u64]) -> Result<()> {
        let uc = self.uc;
        self.state().identity = true;
        let mut r = uc.flush_tlb();
        for &p in pages {
            if r.is_ok() {
                r = uc.remove_cache(p, p + PAGE_SIZE);
            }
        }
        let st = self.state();
        st.identity = false;
        for (slot, &p) in st.ic_memo.iter_mut().zip(pages.iter().rev()) {
            *slot = p;
        }
        st.fills = 0;
        r.and(uc.flush_tlb()).map_err(uc_err("invalidate code"))
    }

    /// Runs `emu_start` from the current PC with `io` available to hooks.
    fn enter(&mut self, io: &mut dyn VcpuIo) -> std::result::Result<(), uc_error> {
        let pc = self.uc.read(R::PC)?;
        {
            let st = self.state();
            st.fault = None;
            st.exit = None;
            st.stopped_by_hook = false;
            // SAFETY: only the lifetime is erased. The pointer is cleared
            // below, before `io`'s borrow ends, and used only by hooks
            // during `emu_start`.
            st.io = Some(unsafe {
                std::mem::transmute::<NonNull<dyn VcpuIo + '_>, NonNull<dyn VcpuIo + 'static>>(
                    NonNull::from(io),
                )
            });
        }
        let r = self.engine.emu_start(pc, 0, 0, 0);
        self.state().io = None;
        r
    }

    /// Handles a fault the TLB hook recorded; `Some` if `run` must return.
    fn handle_fault(&mut self, f: PendingFault, io: &mut dyn VcpuIo) -> Result<Option<VcpuExit>> {
        let uc = self.uc;
        let pc = uc.read(R::PC).map_err(uc_err("read PC"))?;
        let status = match f.cause {
            hooks::FaultCause::Walk(fault) => fault.code(),
            hooks::FaultCause::External => esr::FSC_SYNC_EXTERNAL,
            hooks::FaultCause::Mmio(pa) => return self.emulate_mmio(f, pa, pc, io),
        };
        let st = self.state();
        let same_el = st.el() == 1;
        let write = f.access == mmu::Access::Write;
        let (esr, far) = if f.access == mmu::Access::Fetch {
            let far = if (pc ^ f.va) & !0xfff == 0 { pc } else { f.va };
            (esr::instr_abort_esr(same_el, status), far)
        } else {
            let (far, _) = st.data_far(pc, f.va);
            (esr::data_abort_esr(same_el, write, status), far)
        };
        if st.deliver_sync(esr, Some(far), pc) {
            Ok(None)
        } else {
            Ok(Some(VcpuExit::Unhandled {
                esr,
                far,
                ipa: 0,
                pc,
            }))
        }
    }

    /// Emulates a load/store to a trapped device region: exact sizes, the
    /// instruction completed (register write-back, base update, PC + 4), or
    /// a synchronous external abort if the device refuses.
    fn emulate_mmio(
        &mut self,
        f: PendingFault,
        pa_page: u64,
        pc: u64,
        io: &mut dyn VcpuIo,
    ) -> Result<Option<VcpuExit>> {
        let uc = self.uc;
        let id = self.id;
        let st = self.state();
        let write = f.access == mmu::Access::Write;
        let same_el = st.el() == 1;
        let unhandled = |far: u64| VcpuExit::Unhandled {
            // As HVF reports an access it cannot decode: a data abort from
            // EL1 with ISV = 0 (stage-2 translation fault, level 3).
            esr: esr::data_abort_esr(false, write, esr::FSC_TRANSLATION + 3),
            far,
            ipa: pa_page | (far & 0xfff),
            pc,
        };
        let d = match st.read_insn(pc).and_then(insn::decode_ldst) {
            Some(d) if d.emulatable() && d.kind != insn::Kind::Prefetch => d,
            _ => return Ok(Some(unhandled(f.va))),
        };
        let (addr, writeback) = d.address(|n| uc.x_or_sp(n), pc);
        let size = u64::from(d.size);
        let count = if d.rt2.is_some() { 2 } else { 1 };
        let off = addr & 0xfff;
        if !hooks::same_page(addr, f.va) || off + size * count > 0x1000 {
            return Ok(Some(unhandled(addr)));
        }
        let gpa = pa_page | off;
        let regs = [Some(d.rt), d.rt2];
        let n = d.size as usize;
        let mut loaded = [0u64; 2];
        for (i, rt) in regs.iter().flatten().enumerate() {
            let a = gpa + i as u64 * size;
            let r = if write {
                let v = if *rt == 31 { 0 } else { uc.x_or_sp(*rt) };
                io.mmio_write(id, a, &v.to_le_bytes()[..n])
            } else {
                let mut buf = [0u8; 8];
                let r = io.mmio_read(id, a, &mut buf[..n]);
                loaded[i] = u64::from_le_bytes(buf);
                r
            };
            if let Err(e) = r {
                crate::warn_ratelimited!(vcpu = id, error = %e, "emu: MMIO fault, external abort to the guest");
                let st = self.state();
                st.update_irq(io, false);
                let far = addr + i as u64 * size;
                let esr = esr::data_abort_esr(same_el, write, esr::FSC_SYNC_EXTERNAL);
                if st.deliver_sync(esr, Some(far), pc) {
                    return Ok(None);
                }
                return Ok(Some(VcpuExit::Unhandled {
                    esr,
                    far,
                    ipa: gpa,
                    pc,
                }));
            }
        }
        let err = uc_err("complete MMIO access");
        if let insn::Kind::Load { signed, dst64 } = d.kind {
            for (i, rt) in regs.iter().flatten().enumerate() {
                let v = esr::extend(loaded[i], d.size, signed, dst64);
                uc.set_x(*rt, v).map_err(&err)?;
            }
        }
        if let Some(wb) = writeback {
            let reg = if d.rn == 31 { R::SP } else { Uc::xreg(d.rn) };
            uc.write(reg, wb).map_err(&err)?;
        }
        uc.write(R::PC, pc + 4).map_err(&err)?;
        self.state().update_irq(io, false);
        Ok(None)
    }

    /// SP bank selected by a PSTATE value: 0 for SP_EL0 (EL0 or EL1t).
    fn sp_bank(pstate: u64) -> u64 {
        if (pstate >> 2) & 3 == 0 || pstate & 1 == 0 {
            0
        } else {
            1
        }
    }

    fn current_sp_bank(&self) -> Result<u64> {
        Ok(Self::sp_bank(
            self.uc.read(R::PSTATE).map_err(uc_err("read PSTATE"))?,
        ))
    }

    /// Rebuilds unicorn's cached CPU flags after a PSTATE write (quirk 4).
    fn rebuild_flags(&self) -> Result<()> {
        let v = self.uc.read(R::VBAR_EL1).map_err(uc_err("read VBAR_EL1"))?;
        self.uc
            .cp_write(sr::VBAR_EL1, v)
            .map_err(uc_err("write VBAR_EL1"))
    }
}

/// `uc_mem_map_ptr` with the error mapped.
///
/// # Safety
/// `ptr` must be valid for reads and writes of `size` bytes for the engine's
/// lifetime.
unsafe fn uc_mem_map_ptr_checked(
    handle: *mut unicorn_engine::uc_engine,
    addr: u64,
    size: u64,
    ptr: *mut c_void,
) -> Result<()> {
    // SAFETY: per the function contract.
    let e = unsafe {
        unicorn_engine::uc_mem_map_ptr(handle, addr, size, unicorn_engine::Prot::ALL.0, ptr)
    };
    std::result::Result::<(), uc_error>::from(e).map_err(uc_err("uc_mem_map_ptr"))
}

/// Registers a raw hook.
///
/// # Safety
/// `cb` must have the C signature unicorn uses for `ty`, and `ud` must stay
/// valid until the engine is closed.
unsafe fn add_hook(
    handle: *mut unicorn_engine::uc_engine,
    ty: HookType,
    cb: *mut c_void,
    ud: *mut c_void,
    (begin, end): (u64, u64),
    insn: Option<Arm64Insn>,
) -> Result<()> {
    let mut hh: uc_hook = 0;
    // SAFETY: per the function contract; INSN hooks take the instruction id
    // as the variadic argument.
    let e = unsafe {
        match insn {
            Some(i) => uc_hook_add(handle, &mut hh, ty.0 as i32, cb, ud, begin, end, i as i32),
            None => uc_hook_add(handle, &mut hh, ty.0 as i32, cb, ud, begin, end),
        }
    };
    std::result::Result::<(), uc_error>::from(e).map_err(uc_err("uc_hook_add"))
}

impl Vcpu for EmuVcpu {
    fn id(&self) -> VcpuId {
        self.id
    }

    fn run(&mut self, io: &mut dyn VcpuIo) -> Result<VcpuExit> {
        let mut first = true;
        loop {
            let att = self.shared.attention.swap(0, Ordering::AcqRel);
            self.apply_attention(att)?;
            if att & ATTN_KICK != 0 {
                return Ok(VcpuExit::Kicked);
            }
            {
                let st = self.state();
                if first || att & ATTN_TIMER != 0 {
                    st.vtimer_update(io, first, false);
                }
                st.update_irq(io, false);
            }
            first = false;

            let r = self.enter(io);
            let st = self.state();
            if let Some(p) = st.panic.take() {
                std::panic::resume_unwind(p);
            }
            if let Some(exit) = st.exit.take() {
                return Ok(exit);
            }
            match r {
                Ok(()) if st.stopped_by_hook => continue,
                Ok(()) => {
                    // Unicorn halts on WFI with PC past it (quirk 8).
                    let pc = self.uc.read(R::PC).map_err(uc_err("read PC"))?;
                    let st = self.state();
                    return Ok(match st.read_insn(pc.wrapping_sub(4)) {
                        Some(insn::WFI) => VcpuExit::Wfi,
                        _ => VcpuExit::Unhandled {
                            esr: 0,
                            far: 0,
                            ipa: 0,
                            pc,
                        },
                    });
                }
                Err(uc_error::EXCEPTION) if st.fault.is_some() => {
                    let f = st.fault.take().expect("checked above");
                    if let Some(exit) = self.handle_fault(f, io)? {
                        return Ok(exit);
                    }
                }
                Err(e) => {
                    return Err(HvError::Call {
                        call: "uc_emu_start",
                        detail: format!("{e:?} at pc {:#x}", self.uc.read(R::PC).unwrap_or(0)),
                    })
                }
            }
        }
    }

    fn reg(&mut self, reg: Reg) -> Result<u64> {
        let r = match reg {
            Reg::X(n) if n <= 30 => Uc::xreg(n),
            Reg::Pc => R::PC,
            Reg::Pstate => R::PSTATE,
            Reg::X(n) => {
                return Err(HvError::Call {
                    call: "reg",
                    detail: format!("no register X{n}"),
                })
            }
        };
        self.uc.read(r).map_err(uc_err("read register"))
    }

    fn set_reg(&mut self, reg: Reg, value: u64) -> Result<()> {
        let uc = self.uc;
        let err = uc_err("write register");
        match reg {
            Reg::X(n) if n <= 30 => uc.write(Uc::xreg(n), value).map_err(err),
            Reg::Pc => uc.write(R::PC, value).map_err(err),
            Reg::Pstate => {
                // Bank SP like an exception entry/return would (quirk 4).
                let old = Self::sp_bank(uc.read(R::PSTATE).map_err(&err)?);
                let new = Self::sp_bank(value);
                if old != new {
                    let bank = |b| if b == 0 { R::SP_EL0 } else { R::SP_EL1 };
                    let sp = uc.read(R::SP).map_err(&err)?;
                    uc.write(bank(old), sp).map_err(&err)?;
                    let sp = uc.read(bank(new)).map_err(&err)?;
                    uc.write(R::SP, sp).map_err(&err)?;
                }
                uc.write(R::PSTATE, value).map_err(&err)?;
                self.rebuild_flags()
            }
            Reg::X(n) => Err(HvError::Call {
                call: "set_reg",
                detail: format!("no register X{n}"),
            }),
        }
    }

    fn vreg(&mut self, n: u8) -> Result<u128> {
        if n >= 32 {
            return Err(HvError::Call {
                call: "vreg",
                detail: format!("no register V{n}"),
            });
        }
        self.uc.read_v(n).map_err(uc_err("read V register"))
    }

    fn set_vreg(&mut self, n: u8, value: u128) -> Result<()> {
        if n >= 32 {
            return Err(HvError::Call {
                call: "set_vreg",
                detail: format!("no register V{n}"),
            });
        }
        self.uc
            .write_v(n, value)
            .map_err(uc_err("write V register"))
    }

    fn sysreg(&mut self, reg: SysReg) -> Result<u64> {
        let uc = self.uc;
        let err = uc_err("read system register");
        let st = self.state();
        Ok(match reg {
            sr::CNTV_CTL_EL0 => st.vtimer.read_ctl(st.vcount()),
            sr::CNTV_CVAL_EL0 => st.vtimer.cval,
            sr::CNTV_TVAL_EL0 => st.vtimer.read_tval(st.vcount()),
            sr::CNTVCT_EL0 => st.vcount(),
            sr::CNTPCT_EL0 => st.vm.physical_count(),
            sr::CNTFRQ_EL0 => timer::COUNTER_HZ,
            sr::CNTVOFF_EL2 => st.vtimer_offset,
            sr::MPIDR_EL1 => st.mpidr,
            sr::ID_AA64MMFR0_EL1 => st.id_mmfr0,
            sr::ID_AA64PFR0_EL1 => st.id_pfr0,
            sr::FPCR => uc.read(R::FPCR).map_err(err)?,
            sr::FPSR => uc.read(R::FPSR).map_err(err)?,
            sr::SP_EL0 | sr::SP_EL1 => {
                let bank = if reg == sr::SP_EL0 { 0 } else { 1 };
                if self.current_sp_bank()? == bank {
                    uc.read(R::SP).map_err(err)?
                } else {
                    uc.read(if bank == 0 { R::SP_EL0 } else { R::SP_EL1 })
                        .map_err(err)?
                }
            }
            r if hooks::is_icc(r) => {
                return Err(HvError::Call {
                    call: "sysreg",
                    detail: format!("{r:?} belongs to the VMM's GIC"),
                })
            }
            r => uc.cp_read(r).map_err(|e| HvError::Call {
                call: "sysreg",
                detail: format!("{r:?}: {e:?}"),
            })?,
        })
    }

    fn set_sysreg(&mut self, reg: SysReg, value: u64) -> Result<()> {
        let uc = self.uc;
        let err = uc_err("write system register");
        match reg {
            sr::CNTV_CTL_EL0 => self.state().vtimer.write_ctl(value),
            sr::CNTV_CVAL_EL0 => self.state().vtimer.cval = value,
            sr::CNTV_TVAL_EL0 => {
                let st = self.state();
                let vcount = st.vcount();
                st.vtimer.write_tval(vcount, value);
            }
            sr::CNTVOFF_EL2 => self.state().vtimer_offset = value,
            sr::MPIDR_EL1 => {
                let v = value | (1 << 31);
                uc.cp_write(sr::VMPIDR_EL2, v).map_err(err)?;
                self.state().mpidr = v;
            }
            sr::FPCR => uc.write(R::FPCR, value).map_err(err)?,
            sr::FPSR => uc.write(R::FPSR, value).map_err(err)?,
            sr::SP_EL0 | sr::SP_EL1 => {
                let bank = if reg == sr::SP_EL0 { 0 } else { 1 };
                let r = if self.current_sp_bank()? == bank {
                    R::SP
                } else if bank == 0 {
                    R::SP_EL0
                } else {
                    R::SP_EL1
                };
                uc.write(r, value).map_err(err)?;
            }
            sr::CNTKCTL_EL1 => {
                uc.cp_write(reg, value).map_err(err)?;
                self.state().cntkctl = value;
            }
            sr::SCTLR_EL1 | sr::TCR_EL1 | sr::TTBR0_EL1 | sr::TTBR1_EL1 => {
                uc.cp_write(reg, value).map_err(err)?;
                self.state().walk = None;
                // Raw writes skip unicorn's own TLB flush.
                uc.flush_tlb().map_err(uc_err("flush TLB"))?;
            }
            r if hooks::is_icc(r) => {
                return Err(HvError::Call {
                    call: "set_sysreg",
                    detail: format!("{r:?} belongs to the VMM's GIC"),
                })
            }
            r => uc
                .cp_read(r)
                .and_then(|_| uc.cp_write(r, value))
                .map_err(|e| HvError::Call {
                    call: "set_sysreg",
                    detail: format!("{r:?}: {e:?}"),
                })?,
        }
        Ok(())
    }

    fn vtimer_offset(&mut self) -> Result<u64> {
        Ok(self.state().vtimer_offset)
    }

    fn set_vtimer_offset(&mut self, offset: u64) -> Result<()> {
        self.state().vtimer_offset = offset;
        Ok(())
    }

    /// The common EL1 set; the CPU model (Cortex-A72) has no pointer
    /// authentication keys.
    fn state_sysregs(&self) -> &'static [SysReg] {
        &sr::EL1_STATE_SYSREGS
    }

    fn kicker(&self) -> Arc<dyn Kick> {
        Arc::new(EmuKicker(self.shared.clone()))
    }

    /// Empty: the `emu` backend has only the userspace GIC.
    fn gic_cpu_state(&mut self) -> Result<Vec<(SysReg, u64)>> {
        Ok(Vec::new())
    }

    /// Accepts only the empty list (no in-kernel GIC).
    fn set_gic_cpu_state(&mut self, regs: &[(SysReg, u64)]) -> Result<()> {
        if regs.is_empty() {
            Ok(())
        } else {
            Err(HvError::Call {
                call: "set_gic_cpu_state",
                detail: "in-kernel GIC registers given to the emu backend".into(),
            })
        }
    }
}
