//! Hypervisor.framework's in-kernel GICv3 (`hv_gic_*`, macOS 15.0).
//!
//! The symbols are looked up at run time ([`lookup`]), never linked
//! directly: a binary that referenced them would not start on macOS 13 or
//! 14. The signatures are those of Apple's macOS 15 SDK headers
//! (`hv_gic.h`, `hv_gic_config.h`, `hv_gic_parameters.h`, `hv_gic_state.h`),
//! declared here so applevisor-sys's `macos-15-0` feature stays off;
//! `hv_gic_icc_reg_t` is passed as its `uint16_t` value, which is our
//! [`SysReg`] packing (tested in [`crate::hv::gic`]).
//!
//! The decisions (does the GIC fit the memory map, which ICC registers to
//! save) are in [`crate::hv::gic`] and tested on every host; this module
//! only makes the calls.

use super::abi::HvReturn;
use super::ffi::{as_fn, check, lookup, HvVcpuId as HvVcpu};
use crate::arch::layout::{GICD_BASE, GICR_BASE};
use crate::arch::sysreg::SysReg;
use crate::hv::gic::{
    check_kernel_gic_fit, icc_state_to_restore, KernelGicParams, ICC_STATE_REGS,
    KERNEL_GIC_NEEDS_MACOS_15,
};
use crate::hv::{GicMode, HvError, KernelGic, Result};
use std::ffi::{c_void, CStr};
use std::sync::OnceLock;

/// `hv_gic_config_t` / `hv_gic_state_t`: retained OS objects.
type OsObject = *mut c_void;

/// The `hv_gic_*` functions this VMM uses, resolved once.
struct GicFns {
    config_create: unsafe extern "C" fn() -> OsObject,
    config_set_distributor_base: unsafe extern "C" fn(OsObject, u64) -> HvReturn,
    config_set_redistributor_base: unsafe extern "C" fn(OsObject, u64) -> HvReturn,
    create: unsafe extern "C" fn(OsObject) -> HvReturn,
    set_spi: unsafe extern "C" fn(u32, bool) -> HvReturn,
    get_distributor_size: unsafe extern "C" fn(*mut usize) -> HvReturn,
    get_distributor_base_alignment: unsafe extern "C" fn(*mut usize) -> HvReturn,
    get_redistributor_region_size: unsafe extern "C" fn(*mut usize) -> HvReturn,
    get_redistributor_size: unsafe extern "C" fn(*mut usize) -> HvReturn,
    get_redistributor_base_alignment: unsafe extern "C" fn(*mut usize) -> HvReturn,
    get_spi_interrupt_range: unsafe extern "C" fn(*mut u32, *mut u32) -> HvReturn,
    get_icc_reg: unsafe extern "C" fn(HvVcpu, u16, *mut u64) -> HvReturn,
    set_icc_reg: unsafe extern "C" fn(HvVcpu, u16, u64) -> HvReturn,
    state_create: unsafe extern "C" fn() -> OsObject,
    state_get_size: unsafe extern "C" fn(OsObject, *mut usize) -> HvReturn,
    state_get_data: unsafe extern "C" fn(OsObject, *mut c_void) -> HvReturn,
    set_state: unsafe extern "C" fn(*const c_void, usize) -> HvReturn,
}

macro_rules! resolve {
    ($($field:ident = $name:literal),* $(,)?) => {
        GicFns {
            $(
                // SAFETY: `$name` is Hypervisor.framework's function whose C
                // signature (macOS 15 SDK, as bound by applevisor-sys 1.0)
                // is this field's type.
                $field: unsafe { as_fn(lookup($name)?) },
            )*
        }
    };
}

fn resolve() -> std::result::Result<GicFns, &'static CStr> {
    Ok(resolve!(
        config_create = c"hv_gic_config_create",
        config_set_distributor_base = c"hv_gic_config_set_distributor_base",
        config_set_redistributor_base = c"hv_gic_config_set_redistributor_base",
        create = c"hv_gic_create",
        set_spi = c"hv_gic_set_spi",
        get_distributor_size = c"hv_gic_get_distributor_size",
        get_distributor_base_alignment = c"hv_gic_get_distributor_base_alignment",
        get_redistributor_region_size = c"hv_gic_get_redistributor_region_size",
        get_redistributor_size = c"hv_gic_get_redistributor_size",
        get_redistributor_base_alignment = c"hv_gic_get_redistributor_base_alignment",
        get_spi_interrupt_range = c"hv_gic_get_spi_interrupt_range",
        get_icc_reg = c"hv_gic_get_icc_reg",
        set_icc_reg = c"hv_gic_set_icc_reg",
        state_create = c"hv_gic_state_create",
        state_get_size = c"hv_gic_state_get_size",
        state_get_data = c"hv_gic_state_get_data",
        set_state = c"hv_gic_set_state",
    ))
}

/// The function table, or the first symbol this macOS lacks.
fn fns() -> std::result::Result<&'static GicFns, &'static CStr> {
    static FNS: OnceLock<std::result::Result<GicFns, &'static CStr>> = OnceLock::new();
    FNS.get_or_init(resolve).as_ref().map_err(|&name| name)
}

/// Whether this system has the in-kernel GIC API (macOS 15 or later).
pub(super) fn available() -> Result<()> {
    fns().map(|_| ()).map_err(unavailable)
}

fn unavailable(missing: &CStr) -> HvError {
    HvError::GicModeUnavailable {
        mode: GicMode::Hvf,
        reason: format!(
            "{KERNEL_GIC_NEEDS_MACOS_15} [{} not found]",
            missing.to_string_lossy()
        ),
    }
}

/// Releases a retained OS object (`os_release`) when dropped.
struct Retained(OsObject);

impl Drop for Retained {
    fn drop(&mut self) {
        // SAFETY: the object was returned retained by a `*_create` call and
        // is released exactly once, here.
        unsafe { applevisor_sys::os_release(self.0) }
    }
}

/// Calls a `hv_gic_get_*` size or alignment getter.
fn get_usize(call: &'static str, f: unsafe extern "C" fn(*mut usize) -> HvReturn) -> Result<u64> {
    let mut v = 0usize;
    // SAFETY: `v` is a valid, writable usize for the duration of the call.
    check(call, unsafe { f(&mut v) })?;
    Ok(v as u64)
}

/// The in-kernel GIC of this process's VM.
pub struct HvfGic {
    fns: &'static GicFns,
    /// INTIDs `hv_gic_set_spi` accepts.
    spis: std::ops::Range<u32>,
}

impl HvfGic {
    /// Creates the GIC with its distributor at [`GICD_BASE`] and its
    /// redistributor region at [`GICR_BASE`] (the addresses the FDT gives
    /// the guest), after checking with Hypervisor.framework's size,
    /// alignment and SPI-range getters that this fits the memory map for
    /// `vcpus` vCPUs. Call after `hv_vm_create` and the RAM mapping, before
    /// any vCPU is created (`hv_gic_create`'s contract).
    pub(super) fn create(vcpus: usize) -> Result<HvfGic> {
        let fns = fns().map_err(unavailable)?;
        let mut spi_base = 0u32;
        let mut spi_count = 0u32;
        // SAFETY: both pointers are valid, writable u32s for the call.
        let ret = unsafe { (fns.get_spi_interrupt_range)(&mut spi_base, &mut spi_count) };
        check("hv_gic_get_spi_interrupt_range", ret)?;
        let params = KernelGicParams {
            dist_size: get_usize("hv_gic_get_distributor_size", fns.get_distributor_size)?,
            dist_align: get_usize(
                "hv_gic_get_distributor_base_alignment",
                fns.get_distributor_base_alignment,
            )?,
            redist_region_size: get_usize(
                "hv_gic_get_redistributor_region_size",
                fns.get_redistributor_region_size,
            )?,
            redist_size: get_usize("hv_gic_get_redistributor_size", fns.get_redistributor_size)?,
            redist_align: get_usize(
                "hv_gic_get_redistributor_base_alignment",
                fns.get_redistributor_base_alignment,
            )?,
            spi_base,
            spi_count,
        };
        check_kernel_gic_fit(&params, vcpus).map_err(|e| HvError::Call {
            call: "hv_gic_create",
            detail: format!("the in-kernel GIC does not fit this VMM's memory map: {e}"),
        })?;
        // SAFETY: no arguments; returns a retained object or null.
        let config = unsafe { (fns.config_create)() };
        if config.is_null() {
            return Err(HvError::Call {
                call: "hv_gic_config_create",
                detail: "returned no configuration object".into(),
            });
        }
        let config = Retained(config);
        // SAFETY: `config` is a live GIC configuration object.
        let ret = unsafe { (fns.config_set_distributor_base)(config.0, GICD_BASE) };
        check("hv_gic_config_set_distributor_base", ret)?;
        // SAFETY: as above.
        let ret = unsafe { (fns.config_set_redistributor_base)(config.0, GICR_BASE) };
        check("hv_gic_config_set_redistributor_base", ret)?;
        // SAFETY: as above; the VM exists and has no vCPU yet (see the
        // function documentation).
        let ret = unsafe { (fns.create)(config.0) };
        check("hv_gic_create", ret)?;
        let end = spi_base.saturating_add(spi_count);
        Ok(HvfGic {
            fns,
            spis: spi_base..end,
        })
    }

    /// Reads the CPU-interface registers of `vcpu` (the calling thread's
    /// own vCPU) in [`ICC_STATE_REGS`] order.
    pub(super) fn cpu_state(&self, vcpu: HvVcpu) -> Result<Vec<(SysReg, u64)>> {
        ICC_STATE_REGS
            .iter()
            .map(|&reg| {
                let mut v = 0u64;
                // SAFETY: `v` is writable for the call; `vcpu` is the
                // calling thread's own vCPU (the caller's contract) and
                // `reg` an hv_gic_icc_reg_t value.
                let ret = unsafe { (self.fns.get_icc_reg)(vcpu, reg.0, &mut v) };
                check("hv_gic_get_icc_reg", ret).map(|()| (reg, v))
            })
            .collect()
    }

    /// Writes saved CPU-interface registers of `vcpu` (the calling thread's
    /// own vCPU) in [`ICC_STATE_REGS`] order, after checking them
    /// ([`icc_state_to_restore`], which also reads lists of an earlier
    /// version).
    pub(super) fn set_cpu_state(&self, vcpu: HvVcpu, regs: &[(SysReg, u64)]) -> Result<()> {
        for (reg, value) in icc_state_to_restore(regs).map_err(HvError::Guest)? {
            // SAFETY: `vcpu` is the calling thread's vCPU; `reg` was checked
            // to be one of ICC_STATE_REGS, all hv_gic_icc_reg_t values.
            let ret = unsafe { (self.fns.set_icc_reg)(vcpu, reg.0, value) };
            check("hv_gic_set_icc_reg", ret)?;
        }
        Ok(())
    }
}

impl KernelGic for HvfGic {
    /// `hv_gic_set_spi`, for INTIDs in the range Hypervisor.framework
    /// reported at creation.
    fn set_spi(&self, intid: u32, level: bool) -> Result<()> {
        if !self.spis.contains(&intid) {
            return Err(HvError::Call {
                call: "hv_gic_set_spi",
                detail: format!("INTID {intid} is not an SPI of this GIC ({:?})", self.spis),
            });
        }
        // SAFETY: plain values; the GIC exists for the VM's lifetime.
        let ret = unsafe { (self.fns.set_spi)(intid, level) };
        check("hv_gic_set_spi", ret)
    }

    /// `hv_gic_state_create`, `hv_gic_state_get_size`,
    /// `hv_gic_state_get_data`, then `os_release`. Every vCPU must be
    /// stopped (outside `hv_vcpu_run`).
    fn save(&self) -> Result<Vec<u8>> {
        // SAFETY: no arguments; returns a retained object or null.
        let state = unsafe { (self.fns.state_create)() };
        if state.is_null() {
            return Err(HvError::Call {
                call: "hv_gic_state_create",
                detail: "returned no state (is every vCPU stopped?)".into(),
            });
        }
        let state = Retained(state);
        let mut size = 0usize;
        // SAFETY: `state` is a live GIC state object; `size` is writable.
        let ret = unsafe { (self.fns.state_get_size)(state.0, &mut size) };
        check("hv_gic_state_get_size", ret)?;
        if size == 0 {
            return Err(HvError::Call {
                call: "hv_gic_state_get_size",
                detail: "the GIC state is empty".into(),
            });
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` has the `size` bytes the state reported it needs.
        let ret = unsafe { (self.fns.state_get_data)(state.0, buf.as_mut_ptr().cast()) };
        check("hv_gic_state_get_data", ret)?;
        Ok(buf)
    }

    /// `hv_gic_set_state`: after every vCPU is created, before any runs.
    fn restore(&self, blob: &[u8]) -> Result<()> {
        if blob.is_empty() {
            return Err(HvError::Call {
                call: "hv_gic_set_state",
                detail: "empty GIC state".into(),
            });
        }
        // SAFETY: `blob` is readable for `blob.len()` bytes for the call;
        // Hypervisor.framework validates its contents (versioned format).
        let ret = unsafe { (self.fns.set_state)(blob.as_ptr().cast(), blob.len()) };
        check("hv_gic_set_state", ret)
    }
}
