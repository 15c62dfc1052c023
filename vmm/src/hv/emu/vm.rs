//! The `emu` VM and hypervisor: the [`Vm`] and [`Hypervisor`] traits over
//! the state the vCPUs share ([`VmShared`]).

use super::attn::{VcpuShared, ATTN_TLB};
use super::shared::VmShared;
use super::timer;
use super::vcpu::EmuVcpu;
use crate::arch::layout::{self, PAGE_SIZE, RAM_BASE};
use crate::hv::{GicMode, HvError, Hypervisor, KernelGic, Prot, Result, RunRequest, VcpuId, Vm};
use crate::memory::GuestRam;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// The `emu` hypervisor.
#[derive(Clone, Copy, Debug, Default)]
pub struct EmuHypervisor;

impl EmuHypervisor {
    /// The backend; always available.
    pub fn new() -> Self {
        EmuHypervisor
    }
}

impl Hypervisor for EmuHypervisor {
    type Vm = EmuVm;
    const NAME: &'static str = "emu";
    /// Unicorn engines are driven from one thread, round-robin; another
    /// thread may only kick them (quirk 9).
    const ROUND_ROBIN: bool = true;
    const FORKS_VCPUS: bool = true;

    /// Only [`GicMode::Userspace`]: the in-kernel GIC is Hypervisor.framework's.
    fn check_gic_mode(&self, mode: GicMode) -> Result<()> {
        match mode {
            GicMode::Userspace => Ok(()),
            GicMode::Hvf => Err(HvError::GicModeUnavailable {
                mode,
                reason: crate::hv::gic::NO_KERNEL_GIC_ON_EMU.into(),
            }),
        }
    }

    fn create_vm(&self, ram: Arc<GuestRam>, vcpus: usize, gic: GicMode) -> Result<EmuVm> {
        self.check_gic_mode(gic)?;
        EmuVm::new(ram, vcpus)
    }
}

/// A VM of the `emu` backend. Dirty pages are read with
/// [`Vm::dirty_pages`].
pub struct EmuVm {
    shared: Arc<VmShared>,
}

impl EmuVm {
    /// Marks vCPU `id` created for `call`; errors if it is out of range or
    /// exists already.
    fn claim(&self, id: VcpuId, call: &'static str) -> Result<Arc<VcpuShared>> {
        let Some(shared) = self.shared.vcpus.get(id).cloned() else {
            return Err(HvError::Call {
                call,
                detail: format!("vCPU {id} out of range"),
            });
        };
        if shared.created.swap(true, Ordering::AcqRel) {
            return Err(HvError::Call {
                call,
                detail: format!("vCPU {id} already exists"),
            });
        }
        Ok(shared)
    }

    /// Creates a VM for up to `vcpus` vCPUs over `ram`.
    pub fn new(ram: Arc<GuestRam>, vcpus: usize) -> Result<Self> {
        if vcpus == 0 || vcpus > layout::MAX_VCPUS {
            return Err(HvError::Call {
                call: "create_vm",
                detail: format!("{vcpus} vCPUs (1..={} supported)", layout::MAX_VCPUS),
            });
        }
        let shared_vcpus: Vec<_> = (0..vcpus).map(|_| Arc::new(VcpuShared::new())).collect();
        let run_request = Arc::new(OnceLock::new());
        let timer =
            timer::TimerThread::start(shared_vcpus.clone(), run_request.clone()).map_err(|e| {
                HvError::Call {
                    call: "spawn vtimer thread",
                    detail: e.to_string(),
                }
            })?;
        Ok(EmuVm {
            shared: Arc::new(VmShared {
                host: ram.host_ptr() as usize,
                ram_size: ram.size(),
                wp: ram.page_bitmap(),
                dirty: ram.page_bitmap(),
                ram,
                epoch: Instant::now(),
                counter_offset: AtomicU64::new(0),
                vcpus: shared_vcpus,
                timer,
                run_request,
            }),
        })
    }
}

impl Vm for EmuVm {
    type Vcpu = EmuVcpu;

    fn create_vcpu(&self, id: VcpuId, mpidr: u64) -> Result<EmuVcpu> {
        let shared = self.claim(id, "create_vcpu")?;
        EmuVcpu::new(self.shared.clone(), shared.clone(), id, mpidr).inspect_err(|_| {
            shared.created.store(false, Ordering::Release);
        })
    }

    fn adopt_vcpu(&self, vcpu: EmuVcpu) -> Result<EmuVcpu> {
        let shared = match self.claim(vcpu.id, "adopt_vcpu") {
            Ok(s) => s,
            Err(e) => {
                // Not dropped: dropping reaches the old VM's timer.
                std::mem::forget(vcpu);
                return Err(e);
            }
        };
        vcpu.rebind(self.shared.clone(), shared.clone())
            .inspect_err(|_| shared.created.store(false, Ordering::Release))
    }

    fn protect(&self, gpa: u64, size: u64, prot: Prot) -> Result<()> {
        let vm = &self.shared;
        let bad = gpa % PAGE_SIZE != 0
            || size % PAGE_SIZE != 0
            || gpa < RAM_BASE
            || gpa
                .checked_add(size)
                .is_none_or(|end| end > RAM_BASE + vm.ram_size);
        if bad {
            return Err(HvError::Call {
                call: "protect",
                detail: format!("range {gpa:#x}+{size:#x} is not page-aligned RAM"),
            });
        }
        let first = ((gpa - RAM_BASE) / PAGE_SIZE) as usize;
        let count = (size / PAGE_SIZE) as usize;
        match prot {
            Prot::ReadExec => {
                vm.wp.set_range(first, count);
                // Writable TLB entries must go before the guest runs again.
                vm.broadcast(ATTN_TLB, None);
            }
            // Read-only TLB entries refill as writable on the next store.
            Prot::ReadWriteExec => vm.wp.clear_range(first, count),
        }
        Ok(())
    }

    /// Clears the dirty bitmap and withholds write permission for all of RAM
    /// (a bitmap fill plus a TLB flush request to every vCPU).
    fn rearm_dirty_tracking(&self) -> Result<()> {
        self.shared.dirty.clear_all();
        self.protect(RAM_BASE, self.shared.ram_size, Prot::ReadExec)
    }

    fn dirty_pages(&self) -> Result<Vec<u64>> {
        Ok(self.shared.dirty.marked())
    }

    fn counter_frequency(&self) -> u64 {
        timer::COUNTER_HZ
    }

    fn physical_count(&self) -> u64 {
        self.shared.physical_count()
    }

    fn counter_offset(&self) -> u64 {
        self.shared.counter_offset()
    }

    /// Takes effect at once: every vCPU's count reads the shared offset.
    fn set_counter_offset(&self, offset: u64) {
        self.shared.counter_offset.store(offset, Ordering::Release);
    }

    /// None: the `emu` backend has only the userspace GIC.
    fn kernel_gic(&self) -> Option<Arc<dyn KernelGic>> {
        None
    }

    /// The vtimer thread calls it when a vCPU's deadline passes. Only the
    /// first registration counts.
    fn set_run_request(&self, request: RunRequest) {
        let _ = self.shared.run_request.set(request);
    }
}
