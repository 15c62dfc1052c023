//! The HVF VM: Hypervisor.framework availability, VM creation with guest RAM
//! mapped, stage-2 protection for dirty tracking, and the guest's counter.

use super::ffi::{call_err, check};
use super::gic;
use super::host::{host_count, sysctl_u64, timebase_frequency};
use super::shared::{flags, VmShared};
use super::vcpu::HvfVcpu;
use crate::arch::layout::MAX_VCPUS;
use crate::hv::{GicMode, HvError, Hypervisor, KernelGic, Prot, Result, VcpuId, Vm};
use crate::memory::GuestRam;
use applevisor::error::HypervisorError;
use applevisor::vm::VirtualMachine;
use applevisor_sys::{hv_vm_map, HV_MEMORY_EXEC, HV_MEMORY_READ, HV_MEMORY_WRITE};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// What to do when Hypervisor.framework answers `HV_DENIED`.
pub const SIGN_HINT: &str = "Hypervisor.framework denied access (HV_DENIED): the binary needs the \
     com.apple.security.hypervisor entitlement. Sign it with `scripts/sign.sh target/release/boot` \
     (ad-hoc signature, no developer account needed) and run it again";

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
