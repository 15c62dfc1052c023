//! An `emu` vCPU: one unicorn engine and the per-vCPU state its hooks work
//! on ([`HookState`]), the run loop around `emu_start`, and the [`Vcpu`]
//! trait (system registers in [`super::sysregs`], faults and device accesses
//! in [`super::faults`]).

use super::attn::{
    VcpuShared, ATTN_IC, ATTN_IRQ, ATTN_KICK, ATTN_STEP, ATTN_TB, ATTN_TIMER, ATTN_TLB, ATTN_WATCH,
    ATTN_WATCH_BYPASS,
};
use super::hooks;
use super::insn;
use super::mmu;
use super::shared::VmShared;
use super::spin;
use super::state::{HookState, HCR_IMO, HCR_RW, IC_MEMO};
use super::uc::{uc_err, Uc};
use crate::arch::debug;
use crate::arch::exception::CpuFeatures;
use crate::arch::idregs::WATCHPOINTS;
use crate::arch::layout::{PAGE_SIZE, RAM_BASE};
use crate::arch::sysreg::{self as sr, SysReg};
use crate::arch::timer::GenericTimer;
use crate::hv::{HvError, Kick, Reg, Result, Vcpu, VcpuExit, VcpuId, VcpuIo};
use crate::sync::Locked;
use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use unicorn_engine::{
    uc_error, Arch, Arm64CpuModel, ControlType, Mode, RegisterARM64 as R, TlbType, Unicorn,
};

/// The size, in bytes, of each engine's translation buffer: the host code
/// TCG generates for the guest's, which stays resident once written
/// (unicorn's default is 1 GiB, touched as code is translated, in 2 MiB
/// transparent huge pages where the host allows them). When it is full, TCG
/// drops every translated block and starts again. The project's guest has
/// translated about 31 MiB when a fresh boot's agent answers. A branch's
/// forked child (`machine::fork`) goes on in its source's buffer and adds
/// the code the source never ran (about 4 MiB on its way to ready): the
/// buffer must have that room, or the child's first translation drops all
/// it inherited and it translates everything again (a 32 MiB buffer did
/// that; book: Benchmarks, "Branch"). A long-running VM holds at most this
/// much instead of up to 1 GiB.
pub const TCG_BUFFER_BYTES: u32 = 128 << 20;

/// Sets the engine's translation buffer to [`TCG_BUFFER_BYTES`]. Only
/// before the engine initialises, which any control but the CPU model's
/// and the page size's makes it do.
fn set_translation_buffer(engine: &Unicorn<'static, ()>) -> Result<()> {
    // SAFETY: a live engine, owned by the caller; UC_CTL_TCG_BUFFER_SIZE's
    // write takes one uint32_t argument.
    let e = unsafe {
        unicorn_engine::uc_ctl(
            engine.get_handle(),
            ControlType(ControlType::TCG_BUFFER_SIZE.0 | ControlType::IO_WRITE.0),
            TCG_BUFFER_BYTES,
        )
    };
    std::result::Result::<(), uc_error>::from(e).map_err(uc_err("set translation buffer size"))
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
    pub(super) engine: ManuallyDrop<Unicorn<'static, ()>>,
    pub(super) uc: Uc,
    /// Heap state the hooks point at; freed after the engine is closed.
    state: NonNull<HookState>,
    pub(super) shared: Arc<VcpuShared>,
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
        // Before the engine initialises (setting the TLB type does): the
        // translation buffer's size.
        set_translation_buffer(&engine)?;
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
            filled: mmu::FillLog::default(),
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

    /// This vCPU, of a VM of the process this one was forked from, made
    /// vCPU `shared` of `vm` ([`crate::hv::Vm::adopt_vcpu`]): the engine, its
    /// registers, RAM mapping, hooks and translated code stay; what the hooks
    /// reach of the VM is `vm`'s from now on, and the TLB is flushed (`vm`'s
    /// dirty tracking decides which pages are writable). The old VM's objects
    /// are never touched again, not even dropped: their locks and threads
    /// were the parent process's. Errors if `vm`'s RAM is at another host
    /// address or of another size.
    pub(super) fn rebind(mut self, vm: Arc<VmShared>, shared: Arc<VcpuShared>) -> Result<Self> {
        let (host, size) = {
            let st = self.state();
            (st.vm.host, st.vm.ram_size)
        };
        if (host, size) != (vm.host, vm.ram_size) {
            let detail = format!(
                "vCPU {}: its engine maps {size:#x} bytes of RAM at host {host:#x}, the VM {:#x} at {:#x}",
                self.id, vm.ram_size, vm.host
            );
            // Not dropped: dropping reaches the old VM's timer.
            std::mem::forget(self);
            return Err(HvError::Call {
                call: "adopt_vcpu",
                detail,
            });
        }
        let spin_enabled = vm.vcpus.len() > 1;
        let st = self.state();
        std::mem::forget(std::mem::replace(&mut st.vm, vm));
        std::mem::forget(std::mem::replace(&mut st.me, shared.clone()));
        st.io = None;
        st.armed = None;
        st.reported_level = None;
        st.fault = None;
        st.exit = None;
        st.stopped_by_hook = false;
        st.panic = None;
        st.spin = spin::SpinDetector::default();
        st.spin_enabled = spin_enabled;
        std::mem::forget(std::mem::replace(&mut self.shared, shared));
        self.uc.flush_tlb().map_err(uc_err("flush TLB"))?;
        self.state().filled.clear();
        Ok(self)
    }

    fn setup(&self, vm: &VmShared) -> Result<()> {
        let handle = self.engine.get_handle();
        // SAFETY: RAM is the VMM's mapping of `ram_size` bytes (4 KiB
        // multiple), kept alive by `vm.ram` for as long as this engine.
        unsafe {
            uc_mem_map_ptr_checked(handle, RAM_BASE, vm.ram_size, vm.host as *mut c_void)?;
        }
        self.map_scratch_page()?;
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
            self.state().filled.clear();
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
        st.stepped_block = false;
        self.shared.clear(ATTN_WATCH_BYPASS);
        self.shared
            .set_work(ATTN_STEP, mdscr & debug::MDSCR_SS != 0);
        uc.flush_tlb().map_err(uc_err("flush TLB"))
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
        st.filled.clear();
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
    pub(super) fn rebuild_flags(&self) -> Result<()> {
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
            let att = self.shared.take_requests();
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
