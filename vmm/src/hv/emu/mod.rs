//! The portable `emu` backend: each vCPU is a stock unicorn-engine (QEMU TCG)
//! aarch64 CPU, with the parts unicorn lacks done in Rust. Comments cite
//! unicorn's gaps as "quirk N", numbered as in the book's page on them,
//! `book/src/emu-quirks.md`.
//!
//! - Translation: unicorn's TLB is virtual and filled by [`mmu`], the VMM's
//!   stage-1 walker (quirk 1, page size 4 KiB per quirk 3). Translation,
//!   access-flag and permission faults, and accesses to physical addresses
//!   backed by nothing, are delivered to the guest's EL1 vectors
//!   ([`crate::arch::exception`]).
//! - Devices: the memory map says how each region must be reached
//!   ([`MmioAccess`]). [`MmioAccess::Split`] regions are unicorn MMIO regions
//!   whose callbacks call [`VcpuIo`] (fast, but unicorn splits 8-byte
//!   accesses into two 4-byte ones, and a device error can only read as zero
//!   / be ignored). [`MmioAccess::Exact`] regions (the GIC's, with 64-bit
//!   registers) are trapped precisely instead: the TLB hook refuses them, and
//!   the run loop decodes the load/store ([`insn`]), calls [`VcpuIo`] with
//!   the exact size, and completes the instruction; a device error there
//!   becomes a synchronous external abort.
//! - System registers (quirk 6): ICC_* and the EL1 physical timer's CNTP_*
//!   go to [`VcpuIo`]; the counter (CNTPCT_EL0 reads CNTVCT_EL0) and the
//!   EL1 virtual timer are emulated ([`timer`], quirk 7); the ID registers
//!   read as [`crate::arch::idregs`] says (including the 16 KiB granule,
//!   quirk 13) and the PMU registers RAZ/WI (no PMU advertised).
//! - Interrupts: HCR_EL2.VI follows [`VcpuIo::irq_line`] (quirk 5).
//! - Stops: other threads only set flags; a block hook stops the engine
//!   before a block's first instruction (quirk 9). With several vCPUs it
//!   also notices a guest looping on WFE/YIELD and returns
//!   [`VcpuExit::Wfe`] so the run loop can switch vCPUs ([`spin`]).
//! - Coherence between engines (quirk 11 and the several-engines section
//!   of the quirks page): TLBI and IC maintenance is applied to every engine
//!   before it next runs a block.
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
//!
//! Modules, each importing only those listed after it: `vm` (the [`Vm`] and
//! the hypervisor), `faults` (TLB fills, exception delivery, MMIO), `regs`
//! (the VMM's access to system registers), `vcpu` (the engine and its run
//! loop), `hooks` (the raw `extern "C"` shims unicorn calls), `sysregs`
//! (system-register emulation in the hooks), `state` (the per-vCPU state
//! the hooks work on), `shared` (the state a VM's vCPUs share), [`timer`]
//! (the vtimer thread), `attn` (attention requests between threads), `uc`
//! (a thin handle over the raw engine), and the pure parts [`mmu`],
//! [`insn`] and [`spin`].

#[cfg(doc)]
use crate::{
    arch::layout::MmioAccess,
    hv::{Vcpu, VcpuExit, VcpuIo, Vm},
};

mod attn;
mod faults;
mod hooks;
pub mod insn;
pub mod mmu;
mod regs;
mod shared;
pub mod spin;
mod state;
mod sysregs;
pub mod timer;
mod uc;
mod vcpu;
mod vm;

#[cfg(test)]
mod tests;

pub use vcpu::EmuVcpu;
pub use vm::{EmuHypervisor, EmuVm};
