//! The `hvf` backend: macOS Hypervisor.framework on Apple Silicon, through
//! the `applevisor` crate for the VM, `applevisor-sys` for RAM mapping and
//! stage-2 protection and the register enums, and its own declarations of
//! the vCPU calls (`ffi`: applevisor 1.0's vCPU binding gets three of them
//! wrong, see there).
//!
//! The exit handling ([`exits`]: decide, complete, inject) and the raw
//! values and layouts of the C interface with the decisions on them
//! ([`abi`]: exit reasons, SME snapshot safety, SIMD read-back) are compiled
//! and unit-tested on every host. The rest is the thin FFI layer, built on
//! macOS on Apple Silicon: `vm` (the VM, RAM mapping), `shared` (what the
//! VM shares with its vCPUs, stage-2 protection), `vcpu` (the
//! `hv_vcpu_run` loop, registers, kicks), `ffi` (the vCPU calls, `dlsym`
//! lookups, return codes as errors), `host` (sysctls and the host counter),
//! `regs` (register identifiers) and `gic` (the in-kernel GIC).
//!
//! For tests the FFI layer is also built on Linux, unchanged but for its
//! edges (the framework's link attribute, the host clock and sysctls, and
//! off AArch64 the SIMD setter's entry): with the `hvf-sim` feature against
//! the simulated framework (`sim_tests`), and with `hvf-abi-probe` for
//! `aarch64-unknown-linux-gnu` against C stand-ins that check every
//! declaration's argument placement (`abi_probe`, under `qemu-aarch64`).
//!
//! # Processes and threads
//! One VM per process (`hv_vm_create` answers `HV_BUSY` otherwise). A vCPU
//! belongs to the thread that created it, so `HvfVcpu` is not `Send`: the
//! run loop creates each vCPU on its own thread (one thread per vCPU) and
//! only the [`Kick`](crate::hv::Kick) handle (`hv_vcpus_exit`) crosses threads.
//!
//! # macOS versions
//! Every Hypervisor.framework symbol this backend calls exists since macOS
//! 11.0, so the binary starts on every supported macOS (13 and later):
//! `hv_vm_create`/`destroy`, `hv_vm_map`/`unmap`/`protect`, the vCPU calls
//! (`create`, `run`, registers, pending interrupts, vtimer mask and offset,
//! debug traps) and `hv_vcpus_exit`. The in-kernel GICv3 (`hv_gic_*`,
//! macOS 15.0, `boot --gic hvf`) is looked up at run time with `dlsym`
//! (`gic`), so the binary still starts on macOS 13 and 14, where
//! `--gic hvf` is refused; so is `hv_vcpu_get_sme_state` (macOS 15.2,
//! `ffi`), with which a snapshot is refused while a vCPU has live SME state
//! ([`abi::sme_snapshot_check`]). Not used yet, with the release that
//! introduced them: the IPA-size configuration (`hv_vm_config_*`, macOS
//! 13), nested EL2 (15.0), saving SME state (15.2) and a 4 KiB stage-2
//! granule (`hv_vm_config_set_ipa_granule`, macOS 26). Whoever adds one must
//! look it up at run time (`dlsym`) or gate it on the matching applevisor
//! feature.
//!
//! # GIC
//! With the userspace GIC (the default) the ICC system registers trap to
//! the VMM, the IRQ line is set with `hv_vcpu_set_pending_interrupt` before
//! every run, and `VTIMER_ACTIVATED` exits feed the timer PPI. With the
//! in-kernel GIC (`gic::HvfGic`) Hypervisor.framework owns the
//! distributor and redistributor frames, the CPU interface and the virtual
//! timer's PPI: the VMM only sets device SPI levels (`hv_gic_set_spi`),
//! never touches the IRQ line or the vtimer mask, and treats a
//! `VTIMER_ACTIVATED` exit as an error (QEMU's `target/arm/hvf/hvf.c`
//! documents it as occurring only with a userspace irqchip).
//!
//! # Time
//! The guest's counter runs on the host timebase: its count is
//! `mach_absolute_time()` minus the VM's counter offset, which every vCPU
//! sets as its vtimer offset (CNTVOFF_EL2) before it enters the guest. The
//! frequency is the host's timebase frequency (`hw.tbfrequency`, 24 MHz on
//! M1 to M3), which is the CNTFRQ_EL0 the guest reads. Without EL2, HVF traps
//! EL1's accesses to the physical counter and timer: CNTPCT_EL0 reads the
//! virtual count (`exits`), and the physical timer's CNTP_* registers go to
//! the VMM, which emulates that timer for both backends.
//!
//! # Dirty tracking
//! Guest RAM is mapped read/write/execute. Arming write protection maps it
//! read/execute at stage 2 (one `hv_vm_protect` over all RAM); the first
//! guest write to each 16 KiB page faults, the vCPU marks the page in a
//! bitmap, makes it writable and retries the store. VMM writes (virtio DMA)
//! do not fault: they are in [`crate::memory::GuestRam::vmm_dirty`].

pub mod abi;
pub mod exits;

/// The FFI layer's items: compiled on macOS on Apple Silicon against
/// Hypervisor.framework, and, for tests only, on other hosts against the
/// simulated framework (the `hvf-sim` feature and crate) or the ABI
/// probe's C stand-ins (the `hvf-abi-probe` feature and crate).
macro_rules! ffi_layer {
    ($($item:item)*) => {$(
        #[cfg(any(
            all(target_os = "macos", target_arch = "aarch64"),
            all(not(target_os = "macos"), feature = "hvf-sim"),
            all(not(target_os = "macos"), feature = "hvf-abi-probe"),
        ))]
        $item
    )*};
}

ffi_layer! {
    mod ffi;
    pub mod gic;
    mod host;
    mod regs;
    mod shared;
    mod vcpu;
    mod vm;

    pub use host::host_count;
    pub use regs::{HVF_SYSREGS, SNAPSHOT_SYSREGS};
    pub use vcpu::{HvfKicker, HvfVcpu};
    pub use vm::{HvfHypervisor, HvfVm, SIGN_HINT};
}

// The stand-ins are found by the linker through the symbols the FFI layer
// references; these make their crates part of the link.
#[cfg(all(not(target_os = "macos"), feature = "hvf-abi-probe"))]
use hvf_abi_probe as _;
#[cfg(all(not(target_os = "macos"), feature = "hvf-sim"))]
use hvf_sim as _;
#[cfg(all(feature = "hvf-sim", feature = "hvf-abi-probe"))]
compile_error!("the `hvf-sim` and `hvf-abi-probe` features both define the framework's symbols");

#[cfg(all(
    test,
    target_arch = "aarch64",
    target_os = "linux",
    feature = "hvf-abi-probe"
))]
mod abi_probe;
#[cfg(all(test, not(target_os = "macos"), feature = "hvf-sim"))]
mod sim_tests;
