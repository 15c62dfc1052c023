//! An `emu` vCPU: one unicorn engine and the per-vCPU state its hooks work
//! on ([`HookState`]), the run loop around `emu_start`, and the [`Vcpu`]
//! trait (system registers in [`super::sysregs`], faults and device accesses
//! in [`super::faults`]).

use super::faults::PendingFault;
use super::hooks::{self, MmioCtx};
use super::mmu::{self, Fault};
use super::sysregs::{HCR_IMO, HCR_RW, HCR_VI};
use super::timer;
use super::uc::Uc;
use super::vm::{
    uc_err, VcpuShared, VmShared, ATTN_IC, ATTN_IRQ, ATTN_KICK, ATTN_TB, ATTN_TIMER, ATTN_TLB,
    ATTN_WATCH,
};
use super::{insn, spin};
use crate::arch::debug;
use crate::arch::exception::{CpuFeatures, PSTATE_DAIF, PSTATE_EL1H};
use crate::arch::idregs::{BREAKPOINTS, WATCHPOINTS};
use crate::arch::layout::{PAGE_SIZE, RAM_BASE};
use crate::arch::sysreg::{self as sr, SysReg};
use crate::arch::timer::GenericTimer;
use crate::hv::{HvError, Kick, Reg, Result, Vcpu, VcpuExit, VcpuId, VcpuIo};
use crate::sync::Locked;
use std::any::Any;
use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use unicorn_engine::{uc_error, Arch, Arm64CpuModel, Mode, RegisterARM64 as R, TlbType, Unicorn};

/// Physical address of the page where [`EmuVcpu::write_by_msr`] runs its
/// instructions: below every device region and RAM (the memory map has
/// nothing under the GIC's distributor), so guest translations, which the
/// TLB hook checks against the memory map, never reach it.
pub(super) const SCRATCH_PA: u64 = 0;

/// The registers [`EmuVcpu::write_by_msr`] writes: the breakpoints'.
/// Slot `n` of the scratch page, at `SCRATCH_PA + 8 * n`, holds
/// `MSR reg, X0; HVC #0`; the code never changes, so no translated block of
/// it goes stale.
pub(super) const MSR_SLOTS: [SysReg; 2 * BREAKPOINTS] = {
    let mut out = [SysReg(0); 2 * BREAKPOINTS];
    let mut n = 0;
    while n < BREAKPOINTS {
        out[2 * n] = SysReg::new(2, 0, 0, n as u8, 4);
        out[2 * n + 1] = SysReg::new(2, 0, 0, n as u8, 5);
        n += 1;
    }
    out
};

// The slots are the breakpoint registers a snapshot saves.
const _: () = {
    let mut n = 0;
    while n < BREAKPOINTS {
        assert!(MSR_SLOTS[2 * n].0 == sr::DEBUG_SYSREGS[1 + n].0);
        assert!(MSR_SLOTS[2 * n + 1].0 == sr::DEBUG_SYSREGS[11 + n].0);
        n += 1;
    }
};

/// The scratch page's code: per slot of [`MSR_SLOTS`], `MSR reg, X0` and
/// `HVC #0`.
fn scratch_code() -> Vec<u8> {
    MSR_SLOTS
        .iter()
        .flat_map(|r| {
            let (op0, op1, crn, crm, op2) = r.fields();
            let msr = 0xd510_0000
                | u32::from(op0 - 2) << 19
                | u32::from(op1) << 16
                | u32::from(crn) << 12
                | u32::from(crm) << 8
                | u32::from(op2) << 5;
            [msr, 0xd400_0002]
        })
        .flat_map(u32::to_le_bytes)
        .collect()
}

/// Makes a vCPU's `run` return [`VcpuExit::Kicked`].
struct EmuKicker(Arc<VcpuShared>);

impl Kick for EmuKicker {
    fn kick(&self) {
        self.0.request(ATTN_KICK);
    }

    /// `run` re-evaluates the line at its next block boundary and goes on.
    fn irq_line_changed(&self) {
        self.0.request(ATTN_IRQ);
    }
}

/// A vCPU of the `emu` backend: one unicorn engine, owned by the thread that
/// created it.
pub struct EmuVcpu {
    pub(super) id: VcpuId,
    engine: ManuallyDrop<Unicorn<'static, ()>>,
    pub(super) uc: Uc,
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
    pub(super) fn new(
        vm: Arc<VmShared>,
        shared: Arc<VcpuShared>,
        id: VcpuId,
        mpidr: u64,
    ) -> Result<Self> {
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
            vtimer: GenericTimer::default(),
            reported_level: None,
            armed: None,
            hcr: HCR_RW | HCR_IMO,
            fault: None,
            exit: None,
            stopped_by_hook: false,
            fills: 0,
            ic_memo: [u64::MAX; IC_MEMO],
            identity: false,
            panic: None,
            mpidr: mpidr | (1 << 31),
            features: CpuFeatures {
                pan: false,
                ssbs: false,
            },
            mmio_ctx: Vec::new(),
            spin: spin::SpinDetector::default(),
            spin_enabled: vm.vcpus.len() > 1,
            watch: Vec::new(),
            watch_bypass: None,
            step_armed: false,
            stepped_block: false,
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
        let handle = self.engine.get_handle();
        // SAFETY: RAM is the VMM's mapping of `ram_size` bytes (4 KiB
        // multiple), kept alive by `vm.ram` for as long as this engine.
        unsafe {
            uc_mem_map_ptr_checked(handle, RAM_BASE, vm.ram_size, vm.host as *mut c_void)?;
        }
        // SAFETY: `handle` is this vCPU's live engine; the page is the
        // engine's own (unicorn allocates it).
        let mapped = unsafe {
            unicorn_engine::uc_mem_map(handle, SCRATCH_PA, 4096, unicorn_engine::Prot::ALL.0)
        };
        std::result::Result::<(), uc_error>::from(mapped).map_err(uc_err("map scratch page"))?;
        let code = scratch_code();
        // SAFETY: as above; `code` is a live buffer of `code.len()` bytes,
        // which fit in the page.
        let written = unsafe {
            unicorn_engine::uc_mem_write(handle, SCRATCH_PA, code.as_ptr().cast(), code.len() as _)
        };
        std::result::Result::<(), uc_error>::from(written).map_err(uc_err("write scratch page"))?;
        // SAFETY: the state was allocated in `new` for this engine and is
        // freed only after the engine is closed; no hook can run yet.
        unsafe { hooks::register(handle, self.state.as_ptr(), vm.ram_size)? };
        // SAFETY: no hook runs while this setup code does.
        let st = unsafe { &mut *self.state.as_ptr() };
        st.init_sysregs()
    }

    /// The hook state, outside `emu_start`.
    pub(super) fn state(&mut self) -> &mut HookState {
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
        if att & ATTN_WATCH != 0 {
            self.update_watchpoints()?;
        }
        Ok(())
    }

    /// Reads the watchpoint registers back (after the guest or the VMM
    /// changed one, or an access was let through) and makes the TLB hook
    /// check their pages again; notes whether software step is enabled
    /// (MDSCR_EL1.SS, quirk 17).
    pub(super) fn update_watchpoints(&mut self) -> Result<()> {
        let uc = self.uc;
        let mdscr = uc.cp_read(sr::MDSCR_EL1).unwrap_or(0);
        let mut watch = Vec::new();
        if mdscr & debug::MDSCR_MDE != 0 {
            for n in 0..WATCHPOINTS {
                let (v, c) = debug::watchpoint_regs(n);
                let read = |i: usize| uc.cp_read(sr::DEBUG_SYSREGS[i]).unwrap_or(0);
                watch.extend(debug::watch_range(read(c), read(v)));
            }
        }
        let st = self.state();
        st.watch = watch;
        st.watch_bypass = None;
        st.step_armed = mdscr & debug::MDSCR_SS != 0;
        st.stepped_block = false;
        uc.flush_tlb().map_err(uc_err("flush TLB"))
    }

    /// Writes `reg`, one of [`MSR_SLOTS`], by executing `MSR reg, X0` at
    /// EL1h with interrupts and debug exceptions masked, then puts back X0,
    /// PSTATE and PC. For registers whose write matters to unicorn beyond
    /// the stored value, which a raw register write skips (quirk 16: a
    /// DBGBVR/DBGBCR write updates QEMU's breakpoint list). The instruction
    /// runs from its slot of the scratch page ([`SCRATCH_PA`]) through the
    /// identity TLB, followed by an `HVC` that ends the run.
    pub(super) fn write_by_msr(&mut self, reg: SysReg, value: u64) -> Result<()> {
        let Some(slot) = MSR_SLOTS.iter().position(|&r| r == reg) else {
            return Err(HvError::Call {
                call: "write_by_msr",
                detail: format!("{reg:?} has no MSR slot"),
            });
        };
        let at = SCRATCH_PA + 8 * slot as u64;
        let err = uc_err("write by MSR");
        let uc = self.uc;
        let saved = (
            uc.read(R::X0).map_err(&err)?,
            uc.read(R::PSTATE).map_err(&err)?,
            uc.read(R::PC).map_err(&err)?,
        );
        // Requests for the guest wait: the block hook would stop the engine
        // for them before the MSR.
        let mut att = self.shared.attention.swap(0, Ordering::AcqRel);
        self.state().identity = true;
        let mut r = uc
            .flush_tlb()
            .and_then(|()| uc.write(R::PSTATE, PSTATE_EL1H | PSTATE_DAIF))
            .and_then(|()| uc.write(R::X0, value))
            .map_err(&err)
            .and_then(|()| self.rebuild_flags());
        // A request from another thread in the meantime stops the engine
        // before the MSR: run again until the HVC is reached. (The HVC's
        // immediate is not decoded: the scratch page is outside the guest's
        // translations; it leaves PC past itself.)
        let mut done = false;
        for _ in 0..16 {
            if r.is_err() {
                break;
            }
            self.state().exit = None;
            att |= self.shared.attention.swap(0, Ordering::AcqRel);
            r = self.engine.emu_start(at, 0, 0, 0).map_err(&err);
            let exit = self.state().exit.take();
            if matches!(exit, Some(VcpuExit::Hvc { .. })) && uc.read(R::PC).map_err(&err)? == at + 8
            {
                done = true;
                break;
            }
        }
        self.state().identity = false;
        self.shared.request(att);
        let restored = uc
            .flush_tlb()
            .and_then(|()| uc.write(R::X0, saved.0))
            .and_then(|()| uc.write(R::PSTATE, saved.1))
            .map_err(&err)
            .and_then(|()| self.rebuild_flags())
            .and_then(|()| uc.write(R::PC, saved.2).map_err(&err));
        r.and(restored)?;
        if !done {
            return Err(HvError::Call {
                call: "write_by_msr",
                detail: format!("MSR {reg:?} did not complete"),
            });
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

    /// SP bank selected by a PSTATE value: 0 for SP_EL0 (EL0 or EL1t).
    pub(super) fn sp_bank(pstate: u64) -> u64 {
        if (pstate >> 2) & 3 == 0 || pstate & 1 == 0 {
            0
        } else {
            1
        }
    }

    pub(super) fn current_sp_bank(&self) -> Result<u64> {
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
        self.read_sysreg(reg)
    }

    fn set_sysreg(&mut self, reg: SysReg, value: u64) -> Result<()> {
        self.write_sysreg(reg, value)
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

/// Recently invalidated code pages of this engine (see [`HookState::ivau`]).
pub(super) const IC_MEMO: usize = 4;

/// The per-vCPU state the hooks work on.
pub(crate) struct HookState {
    pub id: VcpuId,
    pub uc: Uc,
    pub vm: Arc<VmShared>,
    pub me: Arc<VcpuShared>,
    /// The run loop's I/O handler while `emu_start` runs, else `None`.
    pub io: Option<NonNull<dyn VcpuIo>>,
    /// Cached SCTLR/TCR/TTBR0/TTBR1; `None` after the guest writes one.
    pub walk: Option<mmu::Regs>,
    /// Cached CNTKCTL_EL1 (EL0 access to the counter and timer).
    pub cntkctl: u64,
    /// The EL1 virtual timer (compared with [`HookState::vcount`]).
    pub vtimer: GenericTimer,
    /// The timer output last reported through `VcpuIo::vtimer_level`.
    pub reported_level: Option<bool>,
    /// The wake-up currently armed with the timer thread.
    pub armed: Option<Instant>,
    /// Current HCR_EL2 (VI reflects the IRQ line).
    pub hcr: u64,
    /// A fault the TLB hook refused, for `run` to handle.
    pub fault: Option<PendingFault>,
    /// An exit a hook decided on; `run` returns it after `emu_start`.
    pub exit: Option<VcpuExit>,
    /// The block hook stopped the engine for an attention request.
    pub stopped_by_hook: bool,
    /// Successful TLB fills since the last full flush (TLBI coalescing).
    pub fills: u64,
    /// 16 KiB pages whose code this engine invalidated and has not fetched
    /// from since (`u64::MAX` = empty slot).
    pub ic_memo: [u64; IC_MEMO],
    /// Translate VA = PA with all permissions (used for `remove_cache`).
    pub identity: bool,
    /// A panic caught in a hook, resumed by `run`.
    pub panic: Option<Box<dyn Any + Send>>,
    /// MPIDR_EL1 as the guest reads it.
    pub mpidr: u64,
    /// PSTATE features of the emulated CPU, for exception entry.
    pub features: CpuFeatures,
    /// `user_data` of the fast-path MMIO regions (filled once, never moved).
    pub mmio_ctx: Vec<MmioCtx>,
    /// Detects a guest looping on WFE or YIELD.
    pub spin: spin::SpinDetector,
    /// Spin detection is on (only with more than one vCPU: with one, there
    /// is nobody to yield to).
    pub spin_enabled: bool,
    /// The virtual address ranges of the enabled watchpoints (quirk 16):
    /// the TLB hook refuses their 4 KiB pages so that every data access
    /// there is checked. Empty without MDSCR_EL1.MDE.
    pub watch: Vec<(u64, u64)>,
    /// A watched 4 KiB page let through for an access that hit no
    /// watchpoint, and the blocks run since; the next block re-protects it.
    pub watch_bypass: Option<(u64, u8)>,
    /// MDSCR_EL1.SS is set: the block hook checks the step state (quirk 17).
    pub step_armed: bool,
    /// The current block started with software step active-not-pending
    /// (its instruction is stepped); kept only while `step_armed`.
    pub stepped_block: bool,
}

impl HookState {
    /// The I/O handler of the current `run`.
    ///
    /// # Safety
    /// Only valid while `emu_start` runs: `run` sets `io` from a live
    /// `&mut dyn VcpuIo` just before and clears it right after.
    pub(super) unsafe fn io<'a>(&self) -> Option<&'a mut dyn VcpuIo> {
        // SAFETY: per the function contract the pointer refers to the
        // handler `run` borrowed mutably for the whole of `emu_start`, and
        // hooks (the only callers) do not overlap.
        self.io.map(|mut p| unsafe { p.as_mut() })
    }

    /// Current exception level (0 or 1).
    pub fn el(&self) -> u8 {
        let pstate = self.uc.read(R::PSTATE).unwrap_or(0x5);
        (((pstate >> 2) & 3) as u8).min(1)
    }

    /// The translation registers, cached until the guest writes one.
    pub fn walk_regs(&mut self) -> mmu::Regs {
        if let Some(r) = self.walk {
            return r;
        }
        let uc = self.uc;
        let r = mmu::Regs {
            sctlr: uc.cp_read(sr::SCTLR_EL1).unwrap_or(0),
            tcr: uc.cp_read(sr::TCR_EL1).unwrap_or(0),
            ttbr0: uc.read(R::TTBR0_EL1).unwrap_or(0),
            ttbr1: uc.read(R::TTBR1_EL1).unwrap_or(0),
        };
        self.walk = Some(r);
        r
    }

    /// Translates `va` at the current EL without a permission check.
    pub fn translate(&mut self, va: u64) -> std::result::Result<mmu::Translation, Fault> {
        let regs = self.walk_regs();
        let el = self.el();
        mmu::translate(&regs, va, el, &*self.vm)
    }

    /// The instruction word at `va`, if it is mapped to RAM.
    pub fn read_insn(&mut self, va: u64) -> Option<u32> {
        let t = self.translate(va).ok()?;
        self.vm.ram_u32(t.pa)
    }

    /// The virtual count now: the VM's count, the same on every vCPU (also
    /// what CNTPCT_EL0 reads, see [`crate::arch::timer`]).
    pub fn vcount(&self) -> u64 {
        self.vm
            .physical_count()
            .wrapping_sub(self.vm.counter_offset())
    }

    /// Re-evaluates the IRQ line and updates HCR_EL2.VI (quirk 5). When the
    /// line rises and `kick` is set, the block hook stops the engine so that
    /// unicorn's main loop notices the interrupt (unicorn's `cpu_interrupt`
    /// does not end the running chain of translated blocks).
    pub fn update_irq(&mut self, io: &mut dyn VcpuIo, kick: bool) {
        let line = io.irq_line(self.id);
        let vi = self.hcr & HCR_VI != 0;
        if line != vi {
            self.hcr ^= HCR_VI;
            if self.uc.cp_write(sr::HCR_EL2, self.hcr).is_err() {
                crate::warn_ratelimited!(vcpu = self.id, "emu: cannot update HCR_EL2.VI");
            }
            if line && kick {
                self.me.request(ATTN_IRQ);
            }
        }
    }

    /// Reports the virtual timer output if it changed (or `force`), and
    /// re-arms the wake-up at the next deadline (quirk 7).
    pub fn vtimer_update(&mut self, io: &mut dyn VcpuIo, force: bool, kick: bool) {
        let phys = self.vm.physical_count();
        let vcount = phys.wrapping_sub(self.vm.counter_offset());
        let level = self.vtimer.level(vcount);
        if force || self.reported_level != Some(level) {
            self.reported_level = Some(level);
            io.vtimer_level(self.id, level);
            self.update_irq(io, kick);
        }
        // The physical count at the deadline is `offset + CVAL`, the same
        // however often this runs, so an unchanged deadline is not re-armed;
        // computed from `phys`, it is right whether or not the offset wraps
        // (a restored VM's offset usually does: its count is ahead of the
        // new VM's physical count).
        let at = self
            .vtimer
            .ticks_until_rise(vcount)
            .and_then(|ticks| phys.checked_add(ticks))
            .and_then(|deadline| self.vm.epoch.checked_add(timer::duration_of(deadline)));
        if at != self.armed {
            self.armed = at;
            self.vm.timer.arm(self.id, at);
        }
    }

    /// Records an exit for `run` and stops the engine.
    pub(super) fn exit_with(&mut self, exit: VcpuExit) {
        self.exit = Some(exit);
        self.uc.stop();
    }

    /// The guest has been cycling through a few blocks for a while: if one
    /// of them contains a WFE or YIELD, it is waiting for another vCPU, so
    /// return [`VcpuExit::Wfe`] and let the run loop switch (see
    /// [`super::spin`]).
    pub(super) fn check_spin(&mut self) {
        let blocks: Vec<(u64, u32)> = self.spin.blocks().collect();
        let waits = blocks.iter().any(|&(addr, size)| {
            (0..u64::from(size) / 4).any(|i| {
                matches!(
                    self.read_insn(addr.wrapping_add(4 * i)),
                    Some(insn::WFE | insn::YIELD)
                )
            })
        });
        if waits {
            self.spin.reset();
            self.exit_with(VcpuExit::Wfe);
        }
    }
}
