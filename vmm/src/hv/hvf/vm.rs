//! The HVF VM: Hypervisor.framework availability, VM creation with guest RAM
//! mapped, stage-2 protection for dirty tracking, and the host counter.

use super::gic;
use super::vcpu::HvfVcpu;
use crate::arch::layout::{RamRange, MAX_VCPUS, PAGE_SIZE};
use crate::hv::{GicMode, HvError, Hypervisor, KernelGic, Prot, Result, VcpuId, Vm};
use crate::memory::{GuestRam, PageBitmap};
use applevisor::error::HypervisorError;
use applevisor::vm::{GicDisabled, VirtualMachine, VirtualMachineInstance};
use applevisor_sys::{
    hv_error_t, hv_memory_flags_t, hv_vm_map, hv_vm_protect, hv_vm_unmap, HV_MEMORY_EXEC,
    HV_MEMORY_READ, HV_MEMORY_WRITE,
};
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// What to do when Hypervisor.framework answers `HV_DENIED`.
pub const SIGN_HINT: &str = "Hypervisor.framework denied access (HV_DENIED): the binary needs the \
     com.apple.security.hypervisor entitlement. Sign it with `scripts/sign.sh target/release/boot` \
     (ad-hoc signature, no developer account needed) and run it again";

/// Maps an applevisor error of `call` to [`HvError::Call`].
pub(super) fn call_err(call: &'static str) -> impl Fn(HypervisorError) -> HvError + Copy {
    move |e| HvError::Call {
        call,
        detail: e.to_string(),
    }
}

/// Checks a raw `hv_return_t`.
pub(super) fn check(call: &'static str, ret: i32) -> Result<()> {
    if ret == hv_error_t::HV_SUCCESS as i32 {
        Ok(())
    } else {
        Err(call_err(call)(HypervisorError::from(ret)))
    }
}

/// Reads an integer sysctl (4 or 8 bytes).
fn sysctl_u64(name: &CStr) -> Option<u64> {
    let mut buf = [0u8; 8];
    let mut len = buf.len();
    // SAFETY: `name` is NUL-terminated; `buf` is writable for `len` bytes and
    // `len` is updated with the size written; no new value is set.
    let ret = unsafe {
        libc::sysctlbyname(
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
fn timebase_frequency() -> Option<u64> {
    if let Some(hz) = sysctl_u64(c"hw.tbfrequency").filter(|&hz| hz != 0) {
        return Some(hz);
    }
    let mut info = libc::mach_timebase_info { numer: 0, denom: 0 };
    // SAFETY: `info` is a valid, writable mach_timebase_info.
    let ret = unsafe { libc::mach_timebase_info(&mut info) };
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
    unsafe { libc::mach_absolute_time() }
}

/// Hypervisor.framework.
#[derive(Debug, Clone)]
pub struct HvfHypervisor {
    freq: u64,
}

impl HvfHypervisor {
    /// Checks that this Mac supports Hypervisor.framework (`kern.hv_support`)
    /// and reads the counter frequency. Whether this process may use it (the
    /// entitlement) shows at [`Hypervisor::create_vm`], whose `HV_DENIED`
    /// error says how to sign the binary ([`SIGN_HINT`]).
    pub fn new() -> Result<Self> {
        if sysctl_u64(c"kern.hv_support") != Some(1) {
            return Err(HvError::Unavailable {
                backend: "hvf",
                reason: "this Mac does not support Hypervisor.framework (kern.hv_support is not 1)"
                    .into(),
            });
        }
        let freq = timebase_frequency().ok_or_else(|| HvError::Unavailable {
            backend: "hvf",
            reason: "cannot read the host timebase frequency (hw.tbfrequency)".into(),
        })?;
        Ok(HvfHypervisor { freq })
    }
}

impl Hypervisor for HvfHypervisor {
    type Vm = HvfVm;
    const NAME: &'static str = "hvf";

    /// The userspace GIC always; the in-kernel GIC if this macOS has the
    /// `hv_gic_*` API (15.0 and later).
    fn check_gic_mode(&self, mode: GicMode) -> Result<()> {
        match mode {
            GicMode::Userspace => Ok(()),
            GicMode::Hvf => gic::available(),
        }
    }

    /// Creates the process's VM (`hv_vm_create`), maps `ram` at its base
    /// read/write/execute (`hv_vm_map`) and, for [`GicMode::Hvf`], creates
    /// the in-kernel GIC ([`gic::HvfGic::create`]) before any vCPU.
    fn create_vm(&self, ram: Arc<GuestRam>, vcpus: usize, gic_mode: GicMode) -> Result<HvfVm> {
        self.check_gic_mode(gic_mode)?;
        if vcpus == 0 || vcpus > MAX_VCPUS {
            return Err(HvError::Call {
                call: "create_vm",
                detail: format!("{vcpus} vCPUs requested; 1 to {MAX_VCPUS} are supported"),
            });
        }
        let vm = VirtualMachine::new().map_err(|e| match e {
            HypervisorError::Denied => HvError::Unavailable {
                backend: "hvf",
                reason: SIGN_HINT.into(),
            },
            HypervisorError::Busy => HvError::Call {
                call: "hv_vm_create",
                detail: "this process already has a VM (Hypervisor.framework allows one per \
                         process)"
                    .into(),
            },
            HypervisorError::Unsupported | HypervisorError::NoDevice => HvError::Unavailable {
                backend: "hvf",
                reason: format!("Hypervisor.framework cannot create a VM: {e}"),
            },
            other => call_err("hv_vm_create")(other),
        })?;
        let max = applevisor::vcpu::Vcpu::get_max_count()
            .map_err(call_err("hv_vm_get_max_vcpu_count"))?;
        if u32::try_from(vcpus).map_or(true, |n| n > max) {
            return Err(HvError::Call {
                call: "create_vm",
                detail: format!("{vcpus} vCPUs requested; Hypervisor.framework allows {max}"),
            });
        }
        let size = usize::try_from(ram.size()).map_err(|_| HvError::Call {
            call: "hv_vm_map",
            detail: "RAM size does not fit the host address space".into(),
        })?;
        // SAFETY: `ram` is a live, page-aligned mapping of `size` bytes owned
        // by the GuestRam that `VmShared` keeps alive (Arc) until its Drop has
        // unmapped it from the guest. Guest and VMM then share it as
        // `GuestRam` documents (VMM access is volatile, through vm-memory).
        let ret = unsafe {
            hv_vm_map(
                ram.host_ptr().cast_const().cast::<c_void>(),
                ram.base(),
                size,
                HV_MEMORY_READ | HV_MEMORY_WRITE | HV_MEMORY_EXEC,
            )
        };
        check("hv_vm_map", ret)?;
        let mut shared = VmShared {
            dirty: ram.page_bitmap(),
            write_protect_armed: AtomicBool::new(false),
            counter_offset: AtomicU64::new(host_count()),
            freq: self.freq,
            kgic: None,
            ram,
            _vm: vm,
        };
        // After the RAM mapping, before any vCPU. On failure `shared`'s Drop
        // unmaps RAM.
        if gic_mode == GicMode::Hvf {
            shared.kgic = Some(Arc::new(gic::HvfGic::create(vcpus)?));
        }
        let shared = Arc::new(shared);
        Ok(HvfVm { shared, vcpus })
    }
}

/// State shared by the VM and its vCPUs. Dropped when the last of them is:
/// RAM is unmapped from the guest before the VM handle and the RAM go.
pub(super) struct VmShared {
    /// Pages the guest wrote since the last [`Vm::dirty_pages`].
    pub(super) dirty: PageBitmap,
    /// Sticky: RAM has been write-protected at least once, so permission
    /// faults in RAM are dirty-page faults (also those that arrive after
    /// tracking stopped).
    pub(super) write_protect_armed: AtomicBool,
    /// The VM's counter offset ([`Vm::counter_offset`]), which every vCPU
    /// sets as its vtimer offset before it enters the guest: the host count
    /// at VM creation (the guest's count starts near 0), until a restore or
    /// a snapshot's resume moves it.
    pub(super) counter_offset: AtomicU64,
    pub(super) freq: u64,
    /// The in-kernel GIC, if the VM has one.
    pub(super) kgic: Option<Arc<gic::HvfGic>>,
    pub(super) ram: Arc<GuestRam>,
    /// Held for its drop, which destroys the VM (`hv_vm_destroy`) after
    /// every vCPU (each holds this struct) and after RAM is unmapped.
    _vm: VirtualMachineInstance<GicDisabled>,
}

impl VmShared {
    /// Guest RAM's guest-physical range.
    pub(super) fn ram_range(&self) -> RamRange {
        RamRange {
            base: self.ram.base(),
            size: self.ram.size(),
        }
    }

    /// `hv_vm_protect` on a page range of RAM.
    fn protect(&self, gpa: u64, size: u64, flags: hv_memory_flags_t) -> Result<()> {
        let r = self.ram_range();
        let inside = gpa >= r.base && size <= r.size && gpa - r.base <= r.size - size;
        if gpa % PAGE_SIZE != 0 || size % PAGE_SIZE != 0 || size == 0 || !inside {
            return Err(HvError::Call {
                call: "hv_vm_protect",
                detail: format!(
                    "range {gpa:#x}+{size:#x} is not a {PAGE_SIZE}-byte aligned part of RAM"
                ),
            });
        }
        let len = usize::try_from(size).map_err(|_| HvError::Call {
            call: "hv_vm_protect",
            detail: "size does not fit the host address space".into(),
        })?;
        // SAFETY: changes stage-2 permissions of guest RAM that this VM mapped;
        // no host memory is touched.
        let ret = unsafe { hv_vm_protect(gpa, len, flags) };
        check("hv_vm_protect", ret)
    }

    /// Write-protects all of RAM (read/execute).
    fn protect_all(&self, prot: Prot) -> Result<()> {
        let r = self.ram_range();
        self.protect(r.base, r.size, flags(prot))
    }

    /// Handles a guest write to write-protected page `page` (its GPA): marks
    /// it dirty, then makes it writable. In that order, so a concurrent
    /// [`Vm::dirty_pages`] either sees the mark or re-protects the
    /// page after it.
    pub(super) fn write_fault(&self, page: u64) -> Result<()> {
        // `page` is in RAM (decided so); `set` ignores anything else.
        let index = page.wrapping_sub(self.ram.base()) / PAGE_SIZE;
        // A background snapshot saves the page before the guest changes it.
        self.ram.before_guest_write(index);
        self.dirty.set(usize::try_from(index).unwrap_or(usize::MAX));
        self.protect(page, PAGE_SIZE, flags(Prot::ReadWriteExec))
    }
}

impl Drop for VmShared {
    fn drop(&mut self) {
        let Ok(size) = usize::try_from(self.ram.size()) else {
            return;
        };
        // SAFETY: removes the stage-2 mapping made in create_vm; no vCPU runs
        // (each holds a reference to this struct).
        let ret = unsafe { hv_vm_unmap(self.ram.base(), size) };
        if let Err(e) = check("hv_vm_unmap", ret) {
            tracing::warn!("{e}");
        }
    }
}

/// Stage-2 permissions for `prot`.
fn flags(prot: Prot) -> hv_memory_flags_t {
    match prot {
        Prot::ReadWriteExec => HV_MEMORY_READ | HV_MEMORY_WRITE | HV_MEMORY_EXEC,
        Prot::ReadExec => HV_MEMORY_READ | HV_MEMORY_EXEC,
    }
}

/// The process's Hypervisor.framework VM with guest RAM mapped.
pub struct HvfVm {
    shared: Arc<VmShared>,
    vcpus: usize,
}

impl Vm for HvfVm {
    type Vcpu = HvfVcpu;

    /// Creates vCPU `id` on the calling thread (`hv_vcpu_create`), with
    /// MPIDR_EL1 = `mpidr`, PSTATE = EL1h with D/A/I/F masked, the VM's
    /// counter offset, and debug exceptions and debug-register
    /// accesses left to the guest (not trapped).
    fn create_vcpu(&self, id: VcpuId, mpidr: u64) -> Result<HvfVcpu> {
        if id >= self.vcpus {
            return Err(HvError::Call {
                call: "hv_vcpu_create",
                detail: format!("vCPU {id} out of range (VM has {})", self.vcpus),
            });
        }
        HvfVcpu::create(self.shared.clone(), id, mpidr)
    }

    /// `hv_vm_protect` on `[gpa, gpa + size)`, which must be a 16 KiB-aligned
    /// part of RAM. [`Prot::ReadExec`] also arms the write-fault path, so
    /// the first write to each page is recorded for [`Vm::dirty_pages`].
    fn protect(&self, gpa: u64, size: u64, prot: Prot) -> Result<()> {
        if prot == Prot::ReadExec {
            self.shared
                .write_protect_armed
                .store(true, Ordering::Release);
        }
        self.shared.protect(gpa, size, flags(prot))
    }

    /// Clears the bitmap and write-protects all RAM with one `hv_vm_protect`.
    fn rearm_dirty_tracking(&self) -> Result<()> {
        self.shared
            .write_protect_armed
            .store(true, Ordering::Release);
        self.shared.dirty.clear_all();
        self.shared.protect_all(Prot::ReadExec)
    }

    fn dirty_pages(&self) -> Result<Vec<u64>> {
        Ok(self.shared.dirty.marked())
    }

    /// The host timebase frequency (CNTFRQ_EL0 as the guest reads it).
    fn counter_frequency(&self) -> u64 {
        self.shared.freq
    }

    /// `mach_absolute_time()`, the host counter.
    fn physical_count(&self) -> u64 {
        host_count()
    }

    fn counter_offset(&self) -> u64 {
        self.shared.counter_offset.load(Ordering::Acquire)
    }

    /// Stores the offset; each vCPU passes it to `hv_vcpu_set_vtimer_offset`
    /// on its own thread before its next `hv_vcpu_run`.
    fn set_counter_offset(&self, offset: u64) {
        self.shared.counter_offset.store(offset, Ordering::Release);
    }

    fn kernel_gic(&self) -> Option<Arc<dyn KernelGic>> {
        self.shared.kgic.clone().map(|k| k as Arc<dyn KernelGic>)
    }
}
