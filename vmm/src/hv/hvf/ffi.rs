//! The vCPU calls of Hypervisor.framework, declared with the C types of
//! Apple's `hv_vcpu.h` and `hv_vcpu_types.h` (macOS 11.0 symbols, linked
//! directly), and the run-time lookup (`dlsym`) of newer symbols.
//!
//! Why not applevisor 1.0's `Vcpu`: it reads the exit reason as a Rust enum
//! (undefined behaviour for a value a newer macOS adds), passes
//! `hv_vcpu_set_simd_fp_reg`'s vector argument in `x2:x3` instead of `v0`,
//! and applevisor-sys numbers `hv_interrupt_type_t` in reverse (its `IRQ`
//! is Apple's FIQ). Here enums are passed as their C integer types
//! (`hv_reg_t`, `hv_simd_fp_reg_t`, `hv_interrupt_type_t`: `uint32_t`;
//! `hv_sys_reg_t`: `uint16_t`) with applevisor-sys's values (equal to
//! Apple's for every enum used here but `hv_interrupt_type_t`, whose value
//! is [`HV_INTERRUPT_TYPE_IRQ`]), and what the framework writes is read
//! through the integer mirrors of [`super::abi`].
//!
//! Every call but `hv_vcpus_exit` must be made on the thread that created
//! the vCPU, which [`RawVcpu`] (not `Send`) guarantees.

use super::abi::{HvReturn, SmeState, VcpuExit, HV_INTERRUPT_TYPE_IRQ, HV_SUCCESS};
use crate::hv::{HvError, Result as HvResult};
use applevisor::error::HypervisorError;
use applevisor_sys::{hv_error_t, hv_reg_t, hv_simd_fp_reg_t, hv_sys_reg_t};
use std::ffi::{c_void, CStr};
use std::marker::PhantomData;
use std::sync::OnceLock;

/// `hv_vcpu_t`.
pub(super) type HvVcpuId = u64;

/// `hv_simd_fp_uchar16_t` as memory: 16 bytes, 16-byte aligned like the C
/// vector type, lane 0 first (so a little-endian `u128`).
#[repr(C, align(16))]
struct SimdFp([u8; 16]);

// Apple's hv_vcpu.h (macOS 11.0), with the C types spelled out. Elsewhere
// (the test-only `hvf-sim` and `hvf-abi-probe` features) the same symbols
// come from the stand-ins, linked as a crate.
#[cfg_attr(target_os = "macos", link(name = "Hypervisor", kind = "framework"))]
extern "C" {
    fn hv_vcpu_create(
        vcpu: *mut HvVcpuId,
        exit: *mut *const VcpuExit,
        config: *mut c_void,
    ) -> HvReturn;
    fn hv_vcpu_destroy(vcpu: HvVcpuId) -> HvReturn;
    fn hv_vcpu_run(vcpu: HvVcpuId) -> HvReturn;
    fn hv_vcpus_exit(vcpus: *const HvVcpuId, vcpu_count: u32) -> HvReturn;
    fn hv_vcpu_get_reg(vcpu: HvVcpuId, reg: u32, value: *mut u64) -> HvReturn;
    fn hv_vcpu_set_reg(vcpu: HvVcpuId, reg: u32, value: u64) -> HvReturn;
    fn hv_vcpu_get_simd_fp_reg(vcpu: HvVcpuId, reg: u32, value: *mut SimdFp) -> HvReturn;
    fn hv_vcpu_get_sys_reg(vcpu: HvVcpuId, reg: u16, value: *mut u64) -> HvReturn;
    fn hv_vcpu_set_sys_reg(vcpu: HvVcpuId, reg: u16, value: u64) -> HvReturn;
    fn hv_vcpu_set_pending_interrupt(vcpu: HvVcpuId, kind: u32, pending: bool) -> HvReturn;
    fn hv_vcpu_set_trap_debug_exceptions(vcpu: HvVcpuId, value: bool) -> HvReturn;
    fn hv_vcpu_set_trap_debug_reg_accesses(vcpu: HvVcpuId, value: bool) -> HvReturn;
    fn hv_vcpu_set_vtimer_mask(vcpu: HvVcpuId, vtimer_is_masked: bool) -> HvReturn;
    fn hv_vcpu_set_vtimer_offset(vcpu: HvVcpuId, vtimer_offset: u64) -> HvReturn;
}

/// A raw `hv_return_t` as applevisor's error type.
fn result(ret: HvReturn) -> Result<(), HypervisorError> {
    if ret == HV_SUCCESS {
        Ok(())
    } else {
        Err(HypervisorError::from(ret))
    }
}

/// Calls `hv_vcpu_set_simd_fp_reg(vcpu, reg, value)` as its C declaration
/// requires: `value` is an `hv_simd_fp_uchar16_t`, a 16-byte short vector,
/// which the AArch64 procedure call standard passes in `v0` (`q0`), with
/// `vcpu` (`uint64_t`) in `x0` and `reg` (`uint32_t`) in `w1`; the
/// `hv_return_t` comes back in `w0`. Rust cannot declare a vector argument
/// on stable (applevisor-sys's `u128` goes in `x2:x3`), hence the call in
/// assembly.
#[cfg(target_arch = "aarch64")]
fn set_simd_fp_reg_raw(vcpu: HvVcpuId, reg: u32, value: u128) -> HvReturn {
    let value = SimdFp(value.to_le_bytes());
    let ret: u64;
    // SAFETY: a call with the C calling convention to the framework's
    // function (only its symbol is taken from applevisor-sys, not its
    // prototype): x0, w1 and q0 hold the three arguments as above,
    // `value` is a live 16-byte buffer the `ldr` reads, and
    // `clobber_abi("C")` tells the compiler that every caller-saved
    // register (x0-x17, x30, v0-v31, flags) is lost. The stack is
    // unchanged around the call and stays 16-byte aligned (no `nostack`).
    // The function only reads its arguments and the vCPU, which belongs to
    // the calling thread (the caller's contract).
    unsafe {
        std::arch::asm!(
            "ldr q0, [{value}]",
            "bl {f}",
            value = in(reg) &value,
            f = sym applevisor_sys::hv_vcpu_set_simd_fp_reg,
            inlateout("x0") vcpu => ret,
            in("x1") u64::from(reg),
            clobber_abi("C"),
        );
    }
    // hv_return_t is 32 bits (w0); the upper half of x0 is undefined.
    ret as u32 as HvReturn
}

/// Test-only (the `hvf-sim` feature on a host that is not AArch64, where
/// the vector call above cannot be made): `hv_vcpu_set_simd_fp_reg` through
/// the simulator's entry that takes the value by pointer. It tests what
/// the backend does with the value; only AArch64 code tests the calling
/// convention (the aarch64 ABI probe runs the assembly above).
#[cfg(not(target_arch = "aarch64"))]
fn set_simd_fp_reg_raw(vcpu: HvVcpuId, reg: u32, value: u128) -> HvReturn {
    extern "C" {
        fn hvf_sim_vcpu_set_simd_fp_reg(vcpu: HvVcpuId, reg: u32, value: *const SimdFp)
            -> HvReturn;
    }
    let value = SimdFp(value.to_le_bytes());
    // SAFETY: the simulator's function reads 16 bytes at `value`, a live
    // buffer; the vCPU belongs to the calling thread (the caller's
    // contract).
    unsafe { hvf_sim_vcpu_set_simd_fp_reg(vcpu, reg, &value) }
}

/// A Hypervisor.framework vCPU: created on, bound to and destroyed on the
/// calling thread (not `Send`). Every method passes this vCPU's id, so the
/// "owning thread" rule of `hv_vcpu.h` holds by construction.
pub(super) struct RawVcpu {
    id: HvVcpuId,
    /// Written by `hv_vcpu_run` on this thread; valid until
    /// `hv_vcpu_destroy`.
    exit: *const VcpuExit,
    _not_send: PhantomData<*const ()>,
}

impl RawVcpu {
    /// `hv_vcpu_create` with the default configuration.
    pub(super) fn create() -> Result<RawVcpu, HypervisorError> {
        let mut id: HvVcpuId = 0;
        let mut exit: *const VcpuExit = std::ptr::null();
        // SAFETY: both pointers are valid and writable for the call; a null
        // configuration selects the default.
        result(unsafe { hv_vcpu_create(&mut id, &mut exit, std::ptr::null_mut()) })?;
        if exit.is_null() {
            // SAFETY: destroys the vCPU just created on this thread.
            let _ = unsafe { hv_vcpu_destroy(id) };
            return Err(HypervisorError::Error);
        }
        Ok(RawVcpu {
            id,
            exit,
            _not_send: PhantomData,
        })
    }

    /// The `hv_vcpu_t` id (for `hv_vcpus_exit` and the `hv_gic_*` calls).
    pub(super) fn id(&self) -> HvVcpuId {
        self.id
    }

    /// `hv_vcpu_run`.
    pub(super) fn run(&self) -> Result<(), HypervisorError> {
        // SAFETY: this thread's vCPU.
        result(unsafe { hv_vcpu_run(self.id) })
    }

    /// The exit `hv_vcpu_run` last reported.
    pub(super) fn exit(&self) -> VcpuExit {
        // SAFETY: `exit` is the framework's exit record of this vCPU, valid
        // until it is destroyed (not before `self` drops) and written only
        // by `hv_vcpu_run` on this thread, which has returned; `VcpuExit`
        // is plain integers, valid for every bit pattern.
        unsafe { self.exit.read() }
    }

    /// `hv_vcpu_get_reg`.
    pub(super) fn get_reg(&self, reg: hv_reg_t) -> Result<u64, HypervisorError> {
        let mut v = 0;
        // SAFETY: this thread's vCPU; `v` is writable for the call.
        result(unsafe { hv_vcpu_get_reg(self.id, reg as u32, &mut v) })?;
        Ok(v)
    }

    /// `hv_vcpu_set_reg`.
    pub(super) fn set_reg(&self, reg: hv_reg_t, value: u64) -> Result<(), HypervisorError> {
        // SAFETY: this thread's vCPU; plain values.
        result(unsafe { hv_vcpu_set_reg(self.id, reg as u32, value) })
    }

    /// `hv_vcpu_get_sys_reg`.
    pub(super) fn get_sys_reg(&self, reg: hv_sys_reg_t) -> Result<u64, HypervisorError> {
        let mut v = 0;
        // SAFETY: this thread's vCPU; `v` is writable for the call.
        result(unsafe { hv_vcpu_get_sys_reg(self.id, reg as u16, &mut v) })?;
        Ok(v)
    }

    /// `hv_vcpu_set_sys_reg`.
    pub(super) fn set_sys_reg(&self, reg: hv_sys_reg_t, value: u64) -> Result<(), HypervisorError> {
        // SAFETY: this thread's vCPU; plain values.
        result(unsafe { hv_vcpu_set_sys_reg(self.id, reg as u16, value) })
    }

    /// `hv_vcpu_get_simd_fp_reg`, lane 0 in the low byte.
    pub(super) fn get_simd_fp_reg(&self, reg: hv_simd_fp_reg_t) -> Result<u128, HypervisorError> {
        let mut v = SimdFp([0; 16]);
        // SAFETY: this thread's vCPU; `v` is a writable, 16-byte aligned
        // hv_simd_fp_uchar16_t for the call.
        result(unsafe { hv_vcpu_get_simd_fp_reg(self.id, reg as u32, &mut v) })?;
        Ok(u128::from_le_bytes(v.0))
    }

    /// `hv_vcpu_set_simd_fp_reg`, lane 0 from the low byte (see
    /// [`set_simd_fp_reg_raw`]).
    pub(super) fn set_simd_fp_reg(
        &self,
        reg: hv_simd_fp_reg_t,
        value: u128,
    ) -> Result<(), HypervisorError> {
        result(set_simd_fp_reg_raw(self.id, reg as u32, value))
    }

    /// `hv_vcpu_set_pending_interrupt(vcpu, HV_INTERRUPT_TYPE_IRQ, pending)`:
    /// the IRQ line for the next `hv_vcpu_run` (cleared when it returns).
    pub(super) fn set_pending_irq(&self, pending: bool) -> Result<(), HypervisorError> {
        // SAFETY: this thread's vCPU; plain values.
        result(unsafe { hv_vcpu_set_pending_interrupt(self.id, HV_INTERRUPT_TYPE_IRQ, pending) })
    }

    /// `hv_vcpu_set_trap_debug_exceptions`.
    pub(super) fn set_trap_debug_exceptions(&self, trap: bool) -> Result<(), HypervisorError> {
        // SAFETY: this thread's vCPU; plain values.
        result(unsafe { hv_vcpu_set_trap_debug_exceptions(self.id, trap) })
    }

    /// `hv_vcpu_set_trap_debug_reg_accesses`.
    pub(super) fn set_trap_debug_reg_accesses(&self, trap: bool) -> Result<(), HypervisorError> {
        // SAFETY: this thread's vCPU; plain values.
        result(unsafe { hv_vcpu_set_trap_debug_reg_accesses(self.id, trap) })
    }

    /// `hv_vcpu_set_vtimer_mask`.
    pub(super) fn set_vtimer_mask(&self, masked: bool) -> Result<(), HypervisorError> {
        // SAFETY: this thread's vCPU; plain values.
        result(unsafe { hv_vcpu_set_vtimer_mask(self.id, masked) })
    }

    /// `hv_vcpu_set_vtimer_offset`.
    pub(super) fn set_vtimer_offset(&self, offset: u64) -> Result<(), HypervisorError> {
        // SAFETY: this thread's vCPU; plain values.
        result(unsafe { hv_vcpu_set_vtimer_offset(self.id, offset) })
    }

    /// What `hv_vcpu_get_sme_state` (macOS 15.2, looked up at run time)
    /// answers for this vCPU: `None` if this macOS lacks it, else its
    /// return code and the state it wrote (for
    /// [`super::abi::sme_snapshot_check`]).
    pub(super) fn sme_state(&self) -> Option<(HvReturn, SmeState)> {
        type GetSmeState = unsafe extern "C" fn(HvVcpuId, *mut SmeState) -> HvReturn;
        static GET: OnceLock<Option<GetSmeState>> = OnceLock::new();
        let get = GET.get_or_init(|| {
            // SAFETY: hv_vcpu_get_sme_state's C signature (hv_vcpu.h, macOS
            // 15.2) is `hv_return_t (hv_vcpu_t, hv_vcpu_sme_state_t *)`.
            lookup(c"hv_vcpu_get_sme_state")
                .ok()
                .map(|p| unsafe { as_fn(p) })
        });
        let get = (*get)?;
        let mut state = SmeState::default();
        // SAFETY: this thread's vCPU; `state` is a writable
        // hv_vcpu_sme_state_t (two C bools, read as bytes) for the call.
        let ret = unsafe { get(self.id, &mut state) };
        Some((ret, state))
    }
}

impl Drop for RawVcpu {
    fn drop(&mut self) {
        // SAFETY: destroys this thread's vCPU once; `exit` is not read
        // afterwards.
        let ret = unsafe { hv_vcpu_destroy(self.id) };
        if let Err(e) = result(ret) {
            tracing::warn!("hv_vcpu_destroy failed: {e}");
        }
    }
}

/// `hv_vcpus_exit` for one vCPU, from any thread.
///
/// # Safety
/// `vcpu` must be a vCPU that is not destroyed before this returns.
pub(super) unsafe fn vcpus_exit(vcpu: HvVcpuId) -> Result<(), HypervisorError> {
    // SAFETY: one id, by pointer, valid for the call; alive (the caller's
    // contract). hv_vcpus_exit may be called from any thread.
    result(unsafe { hv_vcpus_exit(&vcpu, 1) })
}

/// Looks `name` up in the process's default symbol scope
/// (`dlsym(RTLD_DEFAULT, ...)`; Hypervisor.framework is linked, so its
/// exports are there): the way to call a symbol newer than macOS 13 without
/// linking it, which would stop dyld from starting the binary on older
/// releases.
pub(super) fn lookup(name: &'static CStr) -> Result<*mut c_void, &'static CStr> {
    // SAFETY: `name` is NUL-terminated; dlsym only reads it. RTLD_DEFAULT
    // searches every image loaded in the process.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if p.is_null() {
        Err(name)
    } else {
        Ok(p)
    }
}

/// Reinterprets a function address as the function pointer type `F`.
///
/// # Safety
/// `F` must be an `unsafe extern "C" fn` type matching the C signature of
/// the function at `p`.
pub(super) unsafe fn as_fn<F: Copy>(p: *mut c_void) -> F {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    // SAFETY: same size (checked above); the caller guarantees the type.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

/// Maps an applevisor error of `call` to [`HvError::Call`].
pub(super) fn call_err(call: &'static str) -> impl Fn(HypervisorError) -> HvError + Copy {
    move |e| HvError::Call {
        call,
        detail: e.to_string(),
    }
}

/// Checks a raw `hv_return_t`.
pub(super) fn check(call: &'static str, ret: i32) -> HvResult<()> {
    if ret == hv_error_t::HV_SUCCESS as i32 {
        Ok(())
    } else {
        Err(call_err(call)(HypervisorError::from(ret)))
    }
}
