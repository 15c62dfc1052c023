//! What the backend reads of the host: sysctls (`kern.hv_support`, the
//! timebase frequency) and the host counter, which is the guest's physical
//! count (see the module documentation of [`super`]).

use std::ffi::{c_void, CStr};

#[cfg(target_os = "macos")]
use libc as sys;

/// Elsewhere (the test-only `hvf-sim` and `hvf-abi-probe` features) the
/// stand-ins provide the macOS host functions, with their macOS prototypes
/// (`mach/mach_time.h`, `sys/sysctl.h`): the simulated host clock and
/// sysctls.
#[cfg(not(target_os = "macos"))]
mod sys {
    #![allow(non_camel_case_types)]
    use std::ffi::{c_char, c_int, c_void};

    /// `struct mach_timebase_info`.
    #[repr(C)]
    pub struct mach_timebase_info {
        pub numer: u32,
        pub denom: u32,
    }

    extern "C" {
        pub fn mach_absolute_time() -> u64;
        pub fn mach_timebase_info(info: *mut mach_timebase_info) -> c_int;
        pub fn sysctlbyname(
            name: *const c_char,
            oldp: *mut c_void,
            oldlenp: *mut usize,
            newp: *mut c_void,
            newlen: usize,
        ) -> c_int;
    }
}

/// Reads an integer sysctl (4 or 8 bytes).
pub(super) fn sysctl_u64(name: &CStr) -> Option<u64> {
    let mut buf = [0u8; 8];
    let mut len = buf.len();
    // SAFETY: `name` is NUL-terminated; `buf` is writable for `len` bytes and
    // `len` is updated with the size written; no new value is set.
    let ret = unsafe {
        sys::sysctlbyname(
            name.as_ptr(),
            buf.as_mut_ptr().cast::<c_void>(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    match (ret, len) {
        (0, 4) => Some(u64::from(u32::from_ne_bytes([
            buf[0], buf[1], buf[2], buf[3],
        ]))),
        (0, 8) => Some(u64::from_ne_bytes(buf)),
        _ => None,
    }
}

/// The host timebase frequency in Hz: `hw.tbfrequency`, or else derived from
/// `mach_timebase_info` (ns per tick = numer / denom).
// libc deprecates its mach bindings in favour of the mach2 crate; the
// symbols themselves are stable.
#[allow(deprecated)]
pub(super) fn timebase_frequency() -> Option<u64> {
    if let Some(hz) = sysctl_u64(c"hw.tbfrequency").filter(|&hz| hz != 0) {
        return Some(hz);
    }
    let mut info = sys::mach_timebase_info { numer: 0, denom: 0 };
    // SAFETY: `info` is a valid, writable mach_timebase_info.
    let ret = unsafe { sys::mach_timebase_info(&mut info) };
    if ret != 0 || info.numer == 0 {
        return None;
    }
    Some(1_000_000_000 * u64::from(info.denom) / u64::from(info.numer))
}

/// The host counter, which is the guest's physical count (see the module
/// documentation).
#[allow(deprecated)] // As in `timebase_frequency`.
pub fn host_count() -> u64 {
    // SAFETY: mach_absolute_time has no preconditions.
    unsafe { sys::mach_absolute_time() }
}
