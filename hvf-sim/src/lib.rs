//! `hvf-sim`: a stand-in for the parts of macOS Hypervisor.framework that
//! Ignition's `hvf` backend calls, so that the backend's FFI layer
//! (`vmm/src/hv/hvf/`) compiles, links and runs in Linux tests.
//!
//! It exports, with `#[no_mangle]` and the C signatures of Apple's headers,
//! exactly the functions the backend calls (39 `hv_*` functions and
//! `os_release`, plus `mach_absolute_time`, `mach_timebase_info` and
//! `sysctlbyname`, the host clock and sysctls the backend reads). Off
//! AArch64, `hv_vcpu_set_simd_fp_reg`, whose vector argument only AArch64
//! code can pass as the C prototype does, is replaced by a test-only entry
//! taking the value by pointer (`hvf_sim_vcpu_set_simd_fp_reg`). The
//! values and layouts are Apple's ([`apple`], each cited); applevisor-sys is
//! used only by a self-test that lists where it disagrees with them.
//!
//! There is no CPU. A test opens a [`Session`], which is the process's one
//! framework instance, and gives each vCPU a script of [`Step`]s; each
//! `hv_vcpu_run` carries out steps until one ends the run with an exit
//! (an exception with its ESR, FAR and IPA, a virtual-timer exit, a
//! cancel, or a block until `hv_vcpus_exit`). Steps that model guest
//! accesses (loads, stores, `MRS`/`MSR`) are performed on the simulated
//! state when the access is allowed and exit when it would trap, so a
//! write to write-protected RAM faults until the VMM unprotects the page,
//! and the store is retried at the same PC.
//!
//! # Rules it enforces
//!
//! What Apple documents, checked on every call. A call the framework would
//! refuse gets the documented error code *and* is recorded as a violation,
//! which fails the session when it ends unless the test takes it
//! ([`Session::take_violations`]):
//!
//! * per-vCPU calls on the vCPU's owning thread: any other thread
//!   **aborts** the process, naming the call and both threads;
//! * one VM per process (`HV_BUSY`, an answer rather than a violation), one
//!   vCPU per thread, vCPUs destroyed before the VM;
//! * `hv_vm_map`/`hv_vm_unmap`/`hv_vm_protect`: IPAs and sizes in whole
//!   16 KiB pages, host addresses page aligned, ranges inside (or, for a
//!   map, not overlapping) the mappings;
//! * the in-kernel GIC: created after the VM and before any vCPU, with both
//!   bases aligned as its getters say; `hv_gic_set_state` after the vCPUs
//!   exist, before any has run, and before their ICC registers are
//!   written; `hv_gic_state_create` only while no vCPU runs;
//! * every object from `hv_gic_config_create`/`hv_gic_state_create`
//!   released exactly once (`os_release`): a double or foreign release
//!   aborts, a leak is a violation;
//! * the virtual timer (userspace GIC): the framework masks it when it
//!   reports `VTIMER_ACTIVATED`; entering `hv_vcpu_run` with it unmasked
//!   while its output is asserted (an exit storm), or still masked after its
//!   output dropped (the next expiry is lost), is a violation;
//! * `hv_vcpus_exit` only on live vCPUs (a kick that outlives its vCPU);
//! * a store that faulted on write-protected RAM must be retried (PC
//!   unchanged) — a skipped one is a violation — and one that faults
//!   [`REFAULT_LIMIT`] times in a row stops the vCPU (`HV_ERROR`) instead of
//!   spinning.
//!
//! # What it cannot tell
//!
//! Behaviour Apple does not document is a switchable mode of [`Config`]:
//! which system registers trap ([`Config::traps`]), which IPA a stage-2
//! permission fault reports ([`FaultIpa`]), whether a kick before
//! `hv_vcpu_run` is latched ([`KickBeforeRun`]), the in-kernel GIC's sizes
//! and SPI range ([`GicParams`]) and the SME answer ([`SmeAnswer`]). The
//! simulator's choices are not evidence of what a Mac does; neither is
//! anything about code signing, entitlements or dyld, which only a Mac
//! shows (`scripts/mac-check.sh`).
//!
//! On macOS the crate is empty: the real framework is there.

#[cfg(not(target_os = "macos"))]
pub mod apple;
#[cfg(not(target_os = "macos"))]
pub mod arm;
#[cfg(not(target_os = "macos"))]
mod exports;
#[cfg(not(target_os = "macos"))]
mod session;
#[cfg(not(target_os = "macos"))]
mod sim;

#[cfg(not(target_os = "macos"))]
pub use exports::*;
#[cfg(not(target_os = "macos"))]
pub use session::*;
#[cfg(not(target_os = "macos"))]
pub use sim::REFAULT_LIMIT;
