//! `hvf-abi-probe`: C stand-ins for the Hypervisor.framework functions (and
//! host functions) the `hvf` backend calls, compiled by the C compiler from
//! Apple's prototypes (`c/apple_hv.h`) for `aarch64-unknown-linux-gnu`,
//! where the calling convention is the AArch64 procedure call standard as
//! on macOS for every argument the backend passes. Each stand-in records
//! the arguments where the C compiler found them; the backend's tests under
//! its `hvf-abi-probe` feature (`vmm/src/hv/hvf/abi_probe.rs`, run under
//! `qemu-aarch64`) call the real FFI layer and compare. `hv_vcpu_set_simd_fp_reg`
//! also leaves every caller-saved register holding garbage
//! (`c/simd_setter.S`), so an incomplete clobber list shows.
//!
//! On any other target the crate is empty. The stand-ins' state is global:
//! callers serialise their tests.

#[cfg(all(target_arch = "aarch64", target_os = "linux"))]
mod probe {
    /// The vCPU id `hv_vcpu_create` hands out (every bit significant).
    pub const VCPU: u64 = 0x0123_4567_89ab_cdef;
    /// What `mach_absolute_time` returns.
    pub const TIME: u64 = 0x00fe_dcba_9876_5432;
    /// The GIC state `hv_gic_state_get_data` writes: byte `i` is `7i + 1`.
    pub const GIC_STATE_SIZE: usize = 24;

    /// One recorded call: the function, its arguments as the C stand-in
    /// received them (integers and pointers widened to 64 bits, `bool` as 0
    /// or 1), and 16 bytes of data (the vector of
    /// `hv_vcpu_set_simd_fp_reg`, the start of `hv_gic_set_state`'s buffer,
    /// `sysctlbyname`'s name).
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct Call {
        name: [u8; 48],
        /// The arguments.
        pub args: [u64; 5],
        /// The data.
        pub vec: [u8; 16],
        /// How many of `args` the function has.
        pub nargs: u32,
        _pad: u32,
    }

    const _: () = assert!(std::mem::size_of::<Call>() == 112);

    impl std::fmt::Debug for Call {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(
                f,
                "{}({:#x?}, vec {:02x?})",
                self.name(),
                self.args(),
                self.vec
            )
        }
    }

    impl Call {
        /// The function's name.
        pub fn name(&self) -> &str {
            let end = self.name.iter().position(|&b| b == 0).unwrap_or(48);
            std::str::from_utf8(&self.name[..end]).unwrap_or("?")
        }

        /// Its arguments.
        pub fn args(&self) -> &[u64] {
            &self.args[..self.nargs.min(5) as usize]
        }
    }

    extern "C" {
        fn hvf_probe_take(out: *mut Call, max: u32) -> u32;
        fn hvf_probe_fail_next(ret: i32);
        fn hvf_probe_set_sme(ret: i32, streaming: bool, za: bool);
        fn hvf_probe_set_exit(reason: u32, esr: u64, far: u64, ipa: u64);
    }

    /// The calls since the last `take`, oldest first (up to 1024).
    pub fn take() -> Vec<Call> {
        let mut out = Vec::with_capacity(1024);
        // SAFETY: `out` has room for 1024 calls; the C side writes at most
        // that many and returns how many.
        unsafe {
            let n = hvf_probe_take(out.as_mut_ptr(), 1024);
            out.set_len(n as usize);
        }
        out
    }

    /// The next stand-in that returns an `hv_return_t` returns `ret`.
    pub fn fail_next(ret: i32) {
        // SAFETY: plain value.
        unsafe { hvf_probe_fail_next(ret) }
    }

    /// What `hv_vcpu_get_sme_state` answers (initially `HV_UNSUPPORTED`).
    pub fn set_sme(ret: i32, streaming: bool, za: bool) {
        // SAFETY: plain values.
        unsafe { hvf_probe_set_sme(ret, streaming, za) }
    }

    /// The exit the next `hv_vcpu_run` writes.
    pub fn set_exit(reason: u32, esr: u64, far: u64, ipa: u64) {
        // SAFETY: plain values.
        unsafe { hvf_probe_set_exit(reason, esr, far, ipa) }
    }
}

#[cfg(all(target_arch = "aarch64", target_os = "linux"))]
pub use probe::*;
