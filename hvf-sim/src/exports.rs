//! The exported functions: Hypervisor.framework's C entry points the backend
//! calls, with the prototypes of Apple's headers (`hv_vm.h`, `hv_vcpu.h`,
//! `hv_gic.h`, `hv_gic_config.h`, `hv_gic_parameters.h`, `hv_gic_state.h`,
//! `os/object.h`), and the host functions it reads (`mach/mach_time.h`,
//! `sys/sysctl.h`). Each takes the simulator's lock and applies
//! [`crate::sim`]'s rules.

use crate::apple::*;
use crate::sim::{self, fatal, lock, Object};
use std::ffi::{c_char, c_int, c_void, CStr};

/// Runs `f` on the open session.
fn with<R>(call: &str, f: impl FnOnce(&mut sim::Sim) -> R) -> R {
    let mut guard = lock(call);
    f(guard.as_mut().expect("session"))
}

/// Writes an out-parameter; a null pointer is `HV_BAD_ARGUMENT`.
///
/// # Safety
/// `p` is null or valid for a write of `T`.
unsafe fn put<T>(call: &str, p: *mut T, value: T) -> HvReturn {
    if p.is_null() {
        return with(call, |s| {
            s.refuse(HV_BAD_ARGUMENT, format!("{call}: a NULL out-pointer"))
        });
    }
    // SAFETY: non-null and valid for a write (the caller's contract).
    unsafe { p.write_unaligned(value) };
    HV_SUCCESS
}

fn status<T>(r: Result<T, HvReturn>) -> HvReturn {
    match r {
        Ok(_) => HV_SUCCESS,
        Err(e) => e,
    }
}

// ---- VM (hv_vm.h) ----

/// `hv_return_t hv_vm_create(hv_vm_config_t config)`.
#[no_mangle]
pub extern "C" fn hv_vm_create(config: *mut c_void) -> HvReturn {
    with("hv_vm_create", |s| s.vm_create(config as usize))
}

/// `hv_return_t hv_vm_destroy(void)`.
#[no_mangle]
pub extern "C" fn hv_vm_destroy() -> HvReturn {
    with("hv_vm_destroy", |s| s.vm_destroy())
}

/// `hv_return_t hv_vm_get_max_vcpu_count(uint32_t *max_vcpu_count)`.
///
/// # Safety
/// `max` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn hv_vm_get_max_vcpu_count(max: *mut u32) -> HvReturn {
    let n = with("hv_vm_get_max_vcpu_count", |s| s.config.max_vcpus);
    // SAFETY: the caller's contract.
    unsafe { put("hv_vm_get_max_vcpu_count", max, n) }
}

/// `hv_return_t hv_vm_map(void *addr, hv_ipa_t ipa, size_t size,
/// hv_memory_flags_t flags)`. The memory at `addr` stays the caller's;
/// guest accesses of the simulated vCPUs go to it until `hv_vm_unmap`.
#[no_mangle]
pub extern "C" fn hv_vm_map(addr: *mut c_void, ipa: u64, size: usize, flags: u64) -> HvReturn {
    with("hv_vm_map", |s| {
        s.vm_map(addr as usize, ipa, size as u64, flags)
    })
}

/// `hv_return_t hv_vm_unmap(hv_ipa_t ipa, size_t size)`.
#[no_mangle]
pub extern "C" fn hv_vm_unmap(ipa: u64, size: usize) -> HvReturn {
    with("hv_vm_unmap", |s| s.vm_unmap(ipa, size as u64))
}

/// `hv_return_t hv_vm_protect(hv_ipa_t ipa, size_t size, hv_memory_flags_t
/// flags)`.
#[no_mangle]
pub extern "C" fn hv_vm_protect(ipa: u64, size: usize, flags: u64) -> HvReturn {
    with("hv_vm_protect", |s| s.vm_protect(ipa, size as u64, flags))
}

// ---- vCPUs (hv_vcpu.h) ----

/// `hv_return_t hv_vcpu_create(hv_vcpu_t *vcpu, hv_vcpu_exit_t **exit,
/// hv_vcpu_config_t config)`: the vCPU belongs to the calling thread.
///
/// # Safety
/// `vcpu` and `exit` are null or writable.
#[no_mangle]
pub unsafe extern "C" fn hv_vcpu_create(
    vcpu: *mut u64,
    exit: *mut *const HvVcpuExit,
    config: *mut c_void,
) -> HvReturn {
    let call = "hv_vcpu_create";
    if vcpu.is_null() || exit.is_null() {
        return with(call, |s| {
            s.refuse(HV_BAD_ARGUMENT, format!("{call}: a NULL out-pointer"))
        });
    }
    if !config.is_null() {
        return with(call, |s| {
            s.refuse(
                HV_BAD_ARGUMENT,
                format!(
                    "{call}: a configuration the simulator never made (the backend passes NULL)"
                ),
            )
        });
    }
    match with(call, |s| s.vcpu_create()) {
        Ok((id, record)) => {
            // SAFETY: both non-null and writable (the caller's contract).
            unsafe {
                vcpu.write_unaligned(id);
                exit.write_unaligned(record.cast_const());
            }
            HV_SUCCESS
        }
        Err(e) => e,
    }
}

/// `hv_return_t hv_vcpu_destroy(hv_vcpu_t vcpu)`.
#[no_mangle]
pub extern "C" fn hv_vcpu_destroy(vcpu: u64) -> HvReturn {
    with("hv_vcpu_destroy", |s| s.vcpu_destroy(vcpu))
}

/// `hv_return_t hv_vcpu_run(hv_vcpu_t vcpu)`: carries out the vCPU's
/// script until an exit, which it writes to the vCPU's exit record.
#[no_mangle]
pub extern "C" fn hv_vcpu_run(vcpu: u64) -> HvReturn {
    sim::run(vcpu)
}

/// `hv_return_t hv_vcpus_exit(hv_vcpu_t *vcpus, uint32_t vcpu_count)`,
/// from any thread.
///
/// # Safety
/// `vcpus` is readable for `count` ids.
#[no_mangle]
pub unsafe extern "C" fn hv_vcpus_exit(vcpus: *const u64, count: u32) -> HvReturn {
    let call = "hv_vcpus_exit";
    if vcpus.is_null() || count == 0 {
        return with(call, |s| {
            s.refuse(HV_BAD_ARGUMENT, format!("{call}: no vCPUs given"))
        });
    }
    // SAFETY: readable for `count` ids (the caller's contract).
    let ids = unsafe { std::slice::from_raw_parts(vcpus, count as usize) }.to_vec();
    with(call, |s| {
        ids.iter()
            .map(|&id| s.request_exit(id))
            .find(|&r| r != HV_SUCCESS)
            .unwrap_or(HV_SUCCESS)
    })
}

/// `hv_return_t hv_vcpu_get_reg(hv_vcpu_t vcpu, hv_reg_t reg, uint64_t
/// *value)`.
///
/// # Safety
/// `value` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn hv_vcpu_get_reg(vcpu: u64, reg: u32, value: *mut u64) -> HvReturn {
    match with("hv_vcpu_get_reg", |s| s.get_reg(vcpu, reg)) {
        // SAFETY: the caller's contract.
        Ok(v) => unsafe { put("hv_vcpu_get_reg", value, v) },
        Err(e) => e,
    }
}

/// `hv_return_t hv_vcpu_set_reg(hv_vcpu_t vcpu, hv_reg_t reg, uint64_t
/// value)`.
#[no_mangle]
pub extern "C" fn hv_vcpu_set_reg(vcpu: u64, reg: u32, value: u64) -> HvReturn {
    with("hv_vcpu_set_reg", |s| s.set_reg(vcpu, reg, value))
}

/// `hv_return_t hv_vcpu_get_simd_fp_reg(hv_vcpu_t vcpu, hv_simd_fp_reg_t
/// reg, hv_simd_fp_uchar16_t *value)`: lane 0 first.
///
/// # Safety
/// `value` is null or writable for 16 bytes.
#[no_mangle]
pub unsafe extern "C" fn hv_vcpu_get_simd_fp_reg(
    vcpu: u64,
    reg: u32,
    value: *mut [u8; 16],
) -> HvReturn {
    match with("hv_vcpu_get_simd_fp_reg", |s| s.get_simd(vcpu, reg)) {
        // SAFETY: the caller's contract.
        Ok(q) => unsafe { put("hv_vcpu_get_simd_fp_reg", value, q.to_le_bytes()) },
        Err(e) => e,
    }
}

/// `hv_return_t hv_vcpu_set_simd_fp_reg(hv_vcpu_t vcpu, hv_simd_fp_reg_t
/// reg, hv_simd_fp_uchar16_t value)`: the 16-byte vector by value, in `v0`
/// (AArch64 procedure call standard), as the C prototype makes it.
#[cfg(target_arch = "aarch64")]
#[no_mangle]
// A short vector is what the C prototype passes; Rust may define (not
// declare) such a function on stable.
#[allow(improper_ctypes_definitions)]
pub extern "C" fn hv_vcpu_set_simd_fp_reg(
    vcpu: u64,
    reg: u32,
    value: std::arch::aarch64::uint8x16_t,
) -> HvReturn {
    let mut bytes = [0u8; 16];
    // SAFETY: NEON is part of every AArch64 target; `bytes` has 16 bytes.
    unsafe { std::arch::aarch64::vst1q_u8(bytes.as_mut_ptr(), value) };
    with("hv_vcpu_set_simd_fp_reg", |s| {
        s.set_simd(vcpu, reg, u128::from_le_bytes(bytes))
    })
}

/// Test-only entry for `hv_vcpu_set_simd_fp_reg` on hosts that are not
/// AArch64, where the backend cannot make the real call (its vector
/// argument travels in AArch64's `v0`, set by the backend's inline
/// assembly): the same operation with the value by pointer (16 bytes, lane
/// 0 first). It tests what the backend does with the value, not the
/// calling convention; the aarch64 ABI probe tests that.
///
/// # Safety
/// `value` is readable for 16 bytes.
#[cfg(not(target_arch = "aarch64"))]
#[no_mangle]
pub unsafe extern "C" fn hvf_sim_vcpu_set_simd_fp_reg(
    vcpu: u64,
    reg: u32,
    value: *const [u8; 16],
) -> HvReturn {
    if value.is_null() {
        fatal("hvf_sim_vcpu_set_simd_fp_reg: NULL value");
    }
    // SAFETY: readable for 16 bytes (the caller's contract).
    let bytes = unsafe { value.read_unaligned() };
    with("hv_vcpu_set_simd_fp_reg", |s| {
        s.set_simd(vcpu, reg, u128::from_le_bytes(bytes))
    })
}

/// `hv_return_t hv_vcpu_get_sys_reg(hv_vcpu_t vcpu, hv_sys_reg_t reg,
/// uint64_t *value)`.
///
/// # Safety
/// `value` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn hv_vcpu_get_sys_reg(vcpu: u64, reg: u16, value: *mut u64) -> HvReturn {
    match with("hv_vcpu_get_sys_reg", |s| s.get_sys_reg(vcpu, reg)) {
        // SAFETY: the caller's contract.
        Ok(v) => unsafe { put("hv_vcpu_get_sys_reg", value, v) },
        Err(e) => e,
    }
}

/// `hv_return_t hv_vcpu_set_sys_reg(hv_vcpu_t vcpu, hv_sys_reg_t reg,
/// uint64_t value)`.
#[no_mangle]
pub extern "C" fn hv_vcpu_set_sys_reg(vcpu: u64, reg: u16, value: u64) -> HvReturn {
    with("hv_vcpu_set_sys_reg", |s| s.set_sys_reg(vcpu, reg, value))
}

/// `hv_return_t hv_vcpu_set_pending_interrupt(hv_vcpu_t vcpu,
/// hv_interrupt_type_t type, bool pending)`: for the next `hv_vcpu_run`,
/// cleared when it returns.
#[no_mangle]
pub extern "C" fn hv_vcpu_set_pending_interrupt(vcpu: u64, kind: u32, pending: bool) -> HvReturn {
    with("hv_vcpu_set_pending_interrupt", |s| {
        s.set_pending_interrupt(vcpu, kind, pending)
    })
}

/// `hv_return_t hv_vcpu_set_trap_debug_exceptions(hv_vcpu_t vcpu, bool
/// value)`.
#[no_mangle]
pub extern "C" fn hv_vcpu_set_trap_debug_exceptions(vcpu: u64, value: bool) -> HvReturn {
    with("hv_vcpu_set_trap_debug_exceptions", |s| {
        s.set_trap_debug(vcpu, true, value)
    })
}

/// `hv_return_t hv_vcpu_set_trap_debug_reg_accesses(hv_vcpu_t vcpu, bool
/// value)`.
#[no_mangle]
pub extern "C" fn hv_vcpu_set_trap_debug_reg_accesses(vcpu: u64, value: bool) -> HvReturn {
    with("hv_vcpu_set_trap_debug_reg_accesses", |s| {
        s.set_trap_debug(vcpu, false, value)
    })
}

/// `hv_return_t hv_vcpu_set_vtimer_mask(hv_vcpu_t vcpu, bool
/// vtimer_is_masked)`.
#[no_mangle]
pub extern "C" fn hv_vcpu_set_vtimer_mask(vcpu: u64, masked: bool) -> HvReturn {
    with("hv_vcpu_set_vtimer_mask", |s| {
        s.set_vtimer_mask(vcpu, masked)
    })
}

/// `hv_return_t hv_vcpu_set_vtimer_offset(hv_vcpu_t vcpu, uint64_t
/// vtimer_offset)`: CNTVOFF_EL2.
#[no_mangle]
pub extern "C" fn hv_vcpu_set_vtimer_offset(vcpu: u64, offset: u64) -> HvReturn {
    with("hv_vcpu_set_vtimer_offset", |s| {
        s.set_vtimer_offset(vcpu, offset)
    })
}

/// `hv_return_t hv_vcpu_get_sme_state(hv_vcpu_t vcpu, hv_vcpu_sme_state_t
/// *sme_state)` (macOS 15.2).
///
/// # Safety
/// `state` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn hv_vcpu_get_sme_state(vcpu: u64, state: *mut HvVcpuSmeState) -> HvReturn {
    match with("hv_vcpu_get_sme_state", |s| s.sme_state(vcpu)) {
        // SAFETY: the caller's contract.
        Ok(v) => unsafe { put("hv_vcpu_get_sme_state", state, v) },
        Err(e) => e,
    }
}

// ---- the in-kernel GIC (hv_gic*.h, macOS 15.0) ----

/// `hv_gic_config_t hv_gic_config_create(void)`: a retained object.
#[no_mangle]
pub extern "C" fn hv_gic_config_create() -> *mut c_void {
    with("hv_gic_config_create", |s| {
        s.new_object(Object::GicConfig {
            distributor: None,
            redistributor: None,
        })
    }) as *mut c_void
}

/// `hv_return_t hv_gic_config_set_distributor_base(hv_gic_config_t config,
/// hv_ipa_t distributor_base_address)`.
#[no_mangle]
pub extern "C" fn hv_gic_config_set_distributor_base(config: *mut c_void, base: u64) -> HvReturn {
    with("hv_gic_config_set_distributor_base", |s| {
        s.gic_config_base(config as usize, true, base)
    })
}

/// `hv_return_t hv_gic_config_set_redistributor_base(hv_gic_config_t
/// config, hv_ipa_t redistributor_base_address)`.
#[no_mangle]
pub extern "C" fn hv_gic_config_set_redistributor_base(config: *mut c_void, base: u64) -> HvReturn {
    with("hv_gic_config_set_redistributor_base", |s| {
        s.gic_config_base(config as usize, false, base)
    })
}

/// `hv_return_t hv_gic_create(hv_gic_config_t gic_config)`: after
/// `hv_vm_create`, before any vCPU.
#[no_mangle]
pub extern "C" fn hv_gic_create(config: *mut c_void) -> HvReturn {
    with("hv_gic_create", |s| s.gic_create(config as usize))
}

/// `hv_return_t hv_gic_set_spi(uint32_t intid, bool level)`.
#[no_mangle]
pub extern "C" fn hv_gic_set_spi(intid: u32, level: bool) -> HvReturn {
    with("hv_gic_set_spi", |s| s.gic_set_spi(intid, level))
}

macro_rules! gic_getter {
    ($(#[$doc:meta] $name:ident => $field:ident),* $(,)?) => {$(
        #[$doc]
        ///
        /// # Safety
        /// The pointer is null or writable.
        #[no_mangle]
        pub unsafe extern "C" fn $name(out: *mut usize) -> HvReturn {
            let v = with(stringify!($name), |s| s.config.gic.$field);
            // SAFETY: the caller's contract.
            unsafe { put(stringify!($name), out, v) }
        }
    )*};
}

gic_getter!(
    /// `hv_return_t hv_gic_get_distributor_size(size_t *distributor_size)`.
    hv_gic_get_distributor_size => dist_size,
    /// `hv_return_t hv_gic_get_distributor_base_alignment(size_t *alignment)`.
    hv_gic_get_distributor_base_alignment => dist_align,
    /// `hv_return_t hv_gic_get_redistributor_region_size(size_t *size)`.
    hv_gic_get_redistributor_region_size => redist_region_size,
    /// `hv_return_t hv_gic_get_redistributor_size(size_t *size)`.
    hv_gic_get_redistributor_size => redist_size,
    /// `hv_return_t hv_gic_get_redistributor_base_alignment(size_t *alignment)`.
    hv_gic_get_redistributor_base_alignment => redist_align,
);

/// `hv_return_t hv_gic_get_spi_interrupt_range(uint32_t *spi_intid_base,
/// uint32_t *spi_intid_count)`.
///
/// # Safety
/// Both pointers are null or writable.
#[no_mangle]
pub unsafe extern "C" fn hv_gic_get_spi_interrupt_range(
    base: *mut u32,
    count: *mut u32,
) -> HvReturn {
    let call = "hv_gic_get_spi_interrupt_range";
    let p = with(call, |s| s.config.gic);
    // SAFETY: the caller's contract.
    match unsafe { put(call, base, p.spi_base) } {
        // SAFETY: the caller's contract.
        HV_SUCCESS => unsafe { put(call, count, p.spi_count) },
        e => e,
    }
}

/// `hv_return_t hv_gic_get_icc_reg(hv_vcpu_t vcpu, hv_gic_icc_reg_t reg,
/// uint64_t *value)`, on the vCPU's thread.
///
/// # Safety
/// `value` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn hv_gic_get_icc_reg(vcpu: u64, reg: u16, value: *mut u64) -> HvReturn {
    match with("hv_gic_get_icc_reg", |s| s.gic_icc(vcpu, reg, None)) {
        // SAFETY: the caller's contract.
        Ok(v) => unsafe { put("hv_gic_get_icc_reg", value, v) },
        Err(e) => e,
    }
}

/// `hv_return_t hv_gic_set_icc_reg(hv_vcpu_t vcpu, hv_gic_icc_reg_t reg,
/// uint64_t value)`, on the vCPU's thread.
#[no_mangle]
pub extern "C" fn hv_gic_set_icc_reg(vcpu: u64, reg: u16, value: u64) -> HvReturn {
    status(with("hv_gic_set_icc_reg", |s| {
        s.gic_icc(vcpu, reg, Some(value))
    }))
}

/// `hv_gic_state_t hv_gic_state_create(void)`: a retained object holding
/// the GIC's state (not its CPU registers); NULL while a vCPU runs.
#[no_mangle]
pub extern "C" fn hv_gic_state_create() -> *mut c_void {
    with("hv_gic_state_create", |s| s.gic_state_create()) as *mut c_void
}

/// `hv_return_t hv_gic_state_get_size(hv_gic_state_t state, size_t
/// *gic_state_size)`.
///
/// # Safety
/// `size` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn hv_gic_state_get_size(state: *mut c_void, size: *mut usize) -> HvReturn {
    let call = "hv_gic_state_get_size";
    let len = with(call, |s| match s.object(call, state as usize) {
        Object::GicState { data } => data.len(),
        Object::GicConfig { .. } => fatal(&format!("{call}: a GIC config is not a state")),
    });
    // SAFETY: the caller's contract.
    unsafe { put(call, size, len) }
}

/// `hv_return_t hv_gic_state_get_data(hv_gic_state_t state, void
/// *gic_state_data)`: writes as many bytes as `hv_gic_state_get_size`
/// said.
///
/// # Safety
/// `data` is writable for that many bytes.
#[no_mangle]
pub unsafe extern "C" fn hv_gic_state_get_data(state: *mut c_void, data: *mut c_void) -> HvReturn {
    let call = "hv_gic_state_get_data";
    let blob = with(call, |s| match s.object(call, state as usize) {
        Object::GicState { data } => data.clone(),
        Object::GicConfig { .. } => fatal(&format!("{call}: a GIC config is not a state")),
    });
    if data.is_null() {
        return with(call, |s| {
            s.refuse(HV_BAD_ARGUMENT, format!("{call}: a NULL buffer"))
        });
    }
    // SAFETY: writable for the size the state reported (the caller's
    // contract).
    unsafe { std::ptr::copy_nonoverlapping(blob.as_ptr(), data.cast::<u8>(), blob.len()) };
    HV_SUCCESS
}

/// `hv_return_t hv_gic_set_state(const void *gic_state_data, size_t
/// gic_state_size)`: after the vCPUs exist, before any runs.
///
/// # Safety
/// `data` is readable for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn hv_gic_set_state(data: *const c_void, size: usize) -> HvReturn {
    let call = "hv_gic_set_state";
    if data.is_null() || size == 0 {
        return with(call, |s| {
            s.refuse(HV_BAD_ARGUMENT, format!("{call}: no data"))
        });
    }
    // SAFETY: readable for `size` bytes (the caller's contract).
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), size) }.to_vec();
    with(call, |s| s.gic_set_state(&bytes))
}

/// `void os_release(void *object)` (`os/object.h`): releases an object the
/// framework returned retained.
#[no_mangle]
pub extern "C" fn os_release(object: *mut c_void) {
    with("os_release", |s| s.release(object as usize));
}

// ---- the host (mach/mach_time.h, sys/sysctl.h) ----

/// `uint64_t mach_absolute_time(void)`: the session's host count.
#[no_mangle]
pub extern "C" fn mach_absolute_time() -> u64 {
    with("mach_absolute_time", |s| s.clock)
}

/// `kern_return_t mach_timebase_info(mach_timebase_info_t info)`:
/// nanoseconds per tick of the session's timebase, as a reduced fraction.
///
/// # Safety
/// `info` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn mach_timebase_info(info: *mut MachTimebaseInfo) -> c_int {
    let hz = with("mach_timebase_info", |s| s.config.timebase_hz);
    let (mut a, mut b) = (1_000_000_000u64, hz.max(1));
    let (n, d) = (a, b);
    while b != 0 {
        (a, b) = (b, a % b);
    }
    let value = MachTimebaseInfo {
        numer: u32::try_from(n / a).unwrap_or(u32::MAX),
        denom: u32::try_from(d / a).unwrap_or(u32::MAX),
    };
    // SAFETY: the caller's contract.
    match unsafe { put("mach_timebase_info", info, value) } {
        HV_SUCCESS => 0,
        _ => 4, // KERN_INVALID_ARGUMENT
    }
}

/// `int sysctlbyname(const char *name, void *oldp, size_t *oldlenp, void
/// *newp, size_t newlen)`, read-only: `kern.hv_support` (1, a 32-bit
/// integer) and `hw.tbfrequency` (the timebase, 64 bits); any other name
/// fails (-1).
///
/// # Safety
/// `name` is a C string; `oldp` is writable for `*oldlenp` bytes.
#[no_mangle]
pub unsafe extern "C" fn sysctlbyname(
    name: *const c_char,
    oldp: *mut c_void,
    oldlenp: *mut usize,
    newp: *mut c_void,
    _newlen: usize,
) -> c_int {
    if name.is_null() || oldp.is_null() || oldlenp.is_null() || !newp.is_null() {
        with("sysctlbyname", |s| {
            s.violation("sysctlbyname: the backend only reads, into a buffer".into())
        });
        return -1;
    }
    // SAFETY: a C string (the caller's contract).
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    let hz = with("sysctlbyname", |s| s.config.timebase_hz);
    let bytes: Vec<u8> = match &*name {
        SYSCTL_HV_SUPPORT => 1u32.to_ne_bytes().to_vec(),
        SYSCTL_TBFREQUENCY => hz.to_ne_bytes().to_vec(),
        _ => return -1,
    };
    // SAFETY: readable and writable (the caller's contract).
    let room = unsafe { oldlenp.read_unaligned() };
    if room < bytes.len() {
        return -1;
    }
    // SAFETY: `oldp` has `room` >= bytes.len() writable bytes; `oldlenp` is
    // writable.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), oldp.cast::<u8>(), bytes.len());
        oldlenp.write_unaligned(bytes.len());
    }
    0
}
