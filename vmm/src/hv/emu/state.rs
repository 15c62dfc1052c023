//! The per-vCPU state the hooks work on ([`HookState`]): what the TLB hook
//! recorded, the cached translation and timer registers, HCR_EL2, the
//! pointer to the run loop's [`VcpuIo`], and the methods every handler
//! shares (translation, the IRQ line, the virtual timer, exits). The
//! handlers themselves are in [`super::faults`] and [`super::sysregs`].

use super::attn::{VcpuShared, ATTN_IRQ};
#[cfg(doc)]
use super::attn::{ATTN_STEP, ATTN_WATCH_BYPASS};
use super::mmu::{self, Access, Fault};
use super::shared::VmShared;
use super::uc::Uc;
use super::{insn, spin, timer};
use crate::arch::exception::CpuFeatures;
use crate::arch::sysreg as sr;
use crate::arch::timer::GenericTimer;
use crate::hv::{VcpuExit, VcpuId, VcpuIo};
use std::any::Any;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Instant;
use unicorn_engine::RegisterARM64 as R;

/// HCR_EL2.RW: EL1 is AArch64.
pub(super) const HCR_RW: u64 = 1 << 31;
/// HCR_EL2.IMO: route IRQs to EL2, which makes HCR_EL2.VI a virtual IRQ.
pub(super) const HCR_IMO: u64 = 1 << 4;
/// HCR_EL2.VI: virtual IRQ pending (quirk 5).
pub(super) const HCR_VI: u64 = 1 << 7;

/// Why the TLB hook refused a translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FaultCause {
    /// The guest's page tables fault.
    Walk(Fault),
    /// The physical address is backed by nothing (or is device memory
    /// fetched as code): synchronous external abort.
    External,
    /// A device region the backend emulates by decoding the instruction, at
    /// this (4 KiB-aligned) physical address.
    Mmio(u64),
    /// A data access to a page with a watchpoint (quirk 16).
    Watch,
    /// A store to a page a background snapshot is saving on another
    /// thread, and the vCPU was kicked while it waited: the store runs
    /// again when the vCPU next runs.
    Kicked,
}

/// A fault recorded by the TLB hook; unicorn then stops with the PC of the
/// faulting instruction (quirk 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PendingFault {
    /// The 4 KiB-aligned virtual address unicorn asked for (quirk 14).
    pub va: u64,
    /// Kind of access.
    pub access: Access,
    /// What went wrong.
    pub cause: FaultCause,
}

/// `user_data` of one MMIO region: the state and the region's base address.
pub(super) struct MmioCtx {
    pub state: *mut HookState,
    pub base: u64,
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
    /// The leaves filled since the TLB was last flushed whole: a TLBI by VA
    /// flushes only if it may hold that VA, a TLBI with nothing filled not
    /// at all (quirk 13).
    pub filled: mmu::FillLog,
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
    /// watchpoint, and the blocks run since; the next block re-protects it
    /// (the block hook's work while [`ATTN_WATCH_BYPASS`] is set).
    pub watch_bypass: Option<(u64, u8)>,
    /// The current block started with software step active-not-pending
    /// (its instruction is stepped); kept only while MDSCR_EL1.SS is set
    /// ([`ATTN_STEP`], quirk 17).
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
