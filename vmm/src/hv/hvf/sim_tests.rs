//! The backend's FFI layer run against the simulated framework (`hvf-sim`):
//! [`HvfHypervisor`], [`HvfVm`] and [`HvfVcpu::run`] with a test
//! [`VcpuIo`], each vCPU's exits scripted. The simulator checks the
//! framework's rules on every call (owning thread, 16 KiB ranges, GIC
//! order, vtimer masking, releases) and fails the test on a broken one.
//! What it cannot show (Apple's undocumented behaviour, signing, dyld) is
//! in the book's HVF chapter.

use super::{HvfHypervisor, HvfVcpu, HvfVm};
use crate::arch::exception::PSTATE_EL1H;
use crate::arch::layout::{GICD_BASE, GICR_BASE, PAGE_SIZE, RAM_BASE};
use crate::arch::sysreg::{
    SysReg, CNTV_CTL_EL0, CNTV_CVAL_EL0, ELR_EL1, ESR_EL1, ICC_IGRPEN1_EL1, ICC_PMR_EL1, VBAR_EL1,
};
use crate::hv::{GicMode, HvError, Hypervisor, MmioFault, Reg, Vcpu, VcpuExit, VcpuId, VcpuIo, Vm};
use crate::memory::{GuestRam, PageSave, Slots};
use hvf_sim::apple::{
    HvVcpuExit, HV_EXIT_REASON_CANCELED, HV_EXIT_REASON_EXCEPTION, HV_EXIT_REASON_VTIMER_ACTIVATED,
    HV_INTERRUPT_TYPE_IRQ, HV_MEMORY_EXEC, HV_MEMORY_READ, HV_MEMORY_WRITE,
};
use hvf_sim::{arm, Config, Event, FaultIpa, KickBeforeRun, Session, SmeAnswer, Step};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use vm_memory::{Bytes, GuestAddress};

const RAM_PAGES: u64 = 16;
/// Where the scripted guest code runs.
const PC0: u64 = 0xffff_8000_1000_0000;
const VBAR: u64 = 0xffff_8000_0801_0000;
const UART: u64 = 0x0900_0000;
const RWX: u64 = HV_MEMORY_READ | HV_MEMORY_WRITE | HV_MEMORY_EXEC;
const RX: u64 = HV_MEMORY_READ | HV_MEMORY_EXEC;

/// The VMM's side of the exits: MMIO at the GPAs in `mmio` (reads return the
/// value, writes are recorded; any other GPA faults), the IRQ line, and the
/// vtimer levels reported.
#[derive(Default)]
struct TestIo {
    mmio: BTreeMap<u64, u64>,
    reads: Vec<(VcpuId, u64, usize)>,
    writes: Vec<(VcpuId, u64, Vec<u8>)>,
    irq: Arc<AtomicBool>,
    vtimer: Vec<bool>,
}

impl VcpuIo for TestIo {
    fn mmio_read(&mut self, vcpu: VcpuId, gpa: u64, data: &mut [u8]) -> Result<(), MmioFault> {
        self.reads.push((vcpu, gpa, data.len()));
        let value = self.mmio.get(&gpa).ok_or(MmioFault {
            gpa,
            len: data.len(),
            reason: "nothing there",
        })?;
        data.copy_from_slice(&value.to_le_bytes()[..data.len()]);
        Ok(())
    }
    fn mmio_write(&mut self, vcpu: VcpuId, gpa: u64, data: &[u8]) -> Result<(), MmioFault> {
        if !self.mmio.contains_key(&gpa) {
            return Err(MmioFault {
                gpa,
                len: data.len(),
                reason: "nothing there",
            });
        }
        self.writes.push((vcpu, gpa, data.to_vec()));
        Ok(())
    }
    fn sysreg_read(&mut self, _vcpu: VcpuId, _reg: SysReg) -> Option<u64> {
        None
    }
    fn sysreg_write(&mut self, _vcpu: VcpuId, _reg: SysReg, _value: u64) -> bool {
        false
    }
    fn irq_line(&mut self, _vcpu: VcpuId) -> bool {
        self.irq.load(Ordering::SeqCst)
    }
    fn vtimer_level(&mut self, _vcpu: VcpuId, level: bool) {
        self.vtimer.push(level);
    }
}

/// A VM with 16 pages of RAM, and its RAM.
fn machine(vcpus: usize, gic: GicMode) -> (HvfVm, Arc<GuestRam>) {
    let ram = Arc::new(GuestRam::new_anonymous(RAM_PAGES * PAGE_SIZE).unwrap());
    let hv = HvfHypervisor::new().unwrap();
    (hv.create_vm(ram.clone(), vcpus, gic).unwrap(), ram)
}

/// vCPU 0 of `vm` on this thread, at [`PC0`] in EL1h.
fn vcpu0(vm: &HvfVm) -> HvfVcpu {
    let mut v = vm.create_vcpu(0, 0x8000_0000).unwrap();
    v.set_reg(Reg::Pc, PC0).unwrap();
    v
}

fn hvc(imm: u16) -> Step {
    Step::Exception {
        esr: arm::hvc(imm),
        far: 0,
        ipa: 0,
    }
}

fn exits(events: &[Event]) -> Vec<HvVcpuExit> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Exit { exit, .. } => Some(*exit),
            _ => None,
        })
        .collect()
}

#[test]
fn mmio_data_aborts_reach_the_bus_and_complete() {
    let s = Session::start(Config::default());
    let (vm, _ram) = machine(1, GicMode::Userspace);
    let mut v = vcpu0(&vm);
    let mut io = TestIo {
        mmio: [(UART + 0x18, 0x8765_4321), (UART, 0)].into(),
        ..TestIo::default()
    };
    s.script(
        0,
        [
            Step::Load {
                va: 0xffff_0000_0900_0018,
                ipa: UART + 0x18,
                size: 4,
                rt: 5,
            },
            Step::Store {
                va: 0xffff_0000_0900_0000,
                ipa: UART,
                size: 1,
                rt: 7,
                value: 0x1234_5641,
            },
            hvc(7),
        ],
    );
    assert_eq!(v.run(&mut io).unwrap(), VcpuExit::Hvc { imm: 7 });
    assert_eq!(io.reads, [(0, UART + 0x18, 4)]);
    assert_eq!(io.writes, [(0, UART, vec![0x41])]);
    let g = s.vcpu(0).unwrap();
    assert_eq!(g.x[5], 0x8765_4321, "the load's register written");
    assert_eq!(g.pc, PC0 + 12, "load, store and HVC each advanced PC once");

    // An access nothing answers becomes a synchronous external abort,
    // taken to EL1 at VBAR_EL1 + 0x200 (current EL, SP_ELx).
    v.set_sysreg(VBAR_EL1, VBAR).unwrap();
    s.script(
        0,
        [
            Step::Load {
                va: 0xffff_0000_0a00_0000,
                ipa: 0x0a00_0000,
                size: 8,
                rt: 1,
            },
            hvc(0),
        ],
    );
    assert_eq!(v.run(&mut io).unwrap(), VcpuExit::Hvc { imm: 0 });
    let g = s.vcpu(0).unwrap();
    assert_eq!(g.sys[&ELR_EL1.0], PC0 + 12);
    assert_eq!(g.sys[&ESR_EL1.0] >> 26, 0x25, "data abort, same EL");
    assert_eq!(g.pc, VBAR + 0x200 + 4, "the vector, then the HVC");
    assert_eq!(g.cpsr & 0xf, PSTATE_EL1H & 0xf);
}

#[test]
fn dirty_tracking_rearms_with_one_protect_and_a_fault_saves_marks_unprotects_and_retries() {
    use std::os::unix::fs::FileExt;
    let s = Session::start(Config::default());
    let (vm, ram) = machine(1, GicMode::Userspace);
    let mut v = vcpu0(&vm);
    let mut io = TestIo::default();
    let page = RAM_BASE + 3 * PAGE_SIZE;
    ram.memory()
        .write_slice(&[0xaa; PAGE_SIZE as usize], GuestAddress(page))
        .unwrap();
    // A background snapshot saving pages 3 and 5.
    let file = tempfile::tempfile().unwrap();
    file.set_len(RAM_PAGES * PAGE_SIZE).unwrap();
    let save = PageSave::start(&ram, vec![3, 5], file.try_clone().unwrap(), Slots::Image).unwrap();

    s.take_events();
    vm.rearm_dirty_tracking().unwrap();
    assert_eq!(
        s.take_events(),
        [Event::Protect {
            ipa: RAM_BASE,
            size: RAM_PAGES * PAGE_SIZE,
            flags: RX
        }],
        "one hv_vm_protect over all of RAM"
    );
    assert_eq!(s.page_flags(page), Some(RX));
    s.script(
        0,
        [
            Step::Store {
                va: 0xffff_8000_0000_c010,
                ipa: page + 0x10,
                size: 8,
                rt: 2,
                value: 0x1122_3344_5566_7788,
            },
            hvc(0),
        ],
    );
    assert_eq!(v.run(&mut io).unwrap(), VcpuExit::Hvc { imm: 0 });
    let events = s.events();
    let fault = exits(&events)[0];
    assert_eq!(
        fault.syndrome,
        arm::data_abort(8, 2, true, arm::DFSC_PERMISSION_L3)
    );
    let protects: Vec<_> = events
        .iter()
        .filter(|e| matches!(e, Event::Protect { .. }))
        .collect();
    assert_eq!(
        protects,
        [&Event::Protect {
            ipa: page,
            size: PAGE_SIZE,
            flags: RWX
        }],
        "exactly the faulting 16 KiB page made writable"
    );
    assert_eq!(vm.dirty_pages().unwrap(), [3]);
    assert_eq!(
        ram.memory()
            .read_obj::<u64>(GuestAddress(page + 0x10))
            .unwrap(),
        0x1122_3344_5566_7788,
        "the store was retried and completed"
    );
    assert_eq!(
        s.vcpu(0).unwrap().pc,
        PC0 + 8,
        "PC advanced once, by the store itself"
    );
    // The page was saved before the guest changed it.
    assert_eq!(save.counts().guest, 1);
    let mut saved = [0u8; 32];
    file.read_exact_at(&mut saved, 3 * PAGE_SIZE).unwrap();
    assert_eq!(saved, [0xaa; 32]);
    save.run().unwrap();
}

#[test]
fn a_kick_ends_a_write_faults_wait_for_the_snapshot_writer_and_the_store_is_retried() {
    use crate::memory::HeldWriter;
    use std::os::unix::fs::FileExt;
    let s = Session::start(Config::default());
    let (vm, ram) = machine(1, GicMode::Userspace);
    let mut v = vcpu0(&vm);
    let mut io = TestIo::default();
    let page = RAM_BASE + 3 * PAGE_SIZE;
    ram.memory()
        .write_slice(&[0xaa; PAGE_SIZE as usize], GuestAddress(page))
        .unwrap();
    vm.rearm_dirty_tracking().unwrap();
    // A background snapshot's writer saving pages 2-4 in one batch, held
    // inside its write of page 3 (index 1) until released.
    let file = tempfile::tempfile().unwrap();
    file.set_len(RAM_PAGES * PAGE_SIZE).unwrap();
    let save =
        PageSave::start(&ram, vec![2, 3, 4], file.try_clone().unwrap(), Slots::Image).unwrap();
    save.protect();
    let HeldWriter { writing, release } = save.hold_writer_at(1);
    let store = Step::Store {
        va: 0xffff_8000_0000_c010,
        ipa: page + 0x10,
        size: 8,
        rt: 2,
        value: 0x1122_3344_5566_7788,
    };
    s.script(0, [store, hvc(0)]);
    s.take_events();
    let kicker = v.kicker();
    std::thread::scope(|t| {
        let writer = t.spawn(|| save.run());
        writing.recv().unwrap();
        // The vCPU's store faults on page 3 and waits for the writer; the
        // kick (a pause or a quit) comes once the fault has exited. The
        // writer cannot finish page 3 before the run returns: it is held
        // until after.
        t.spawn(|| {
            while exits(&s.events()).is_empty() {
                std::thread::yield_now();
            }
            kicker.kick();
        });
        assert_eq!(v.run(&mut io).unwrap(), VcpuExit::Kicked);
        assert_eq!(s.vcpu(0).unwrap().pc, PC0, "the store did not complete");
        assert_eq!(s.page_flags(page), Some(RX), "still protected");
        assert!(vm.dirty_pages().unwrap().is_empty());
        release.send(()).unwrap();
        writer.join().unwrap().unwrap();
    });
    // The next run retries the store, which faults again (no repeat for
    // the progress guard), finds the page saved and completes.
    assert_eq!(v.run(&mut io).unwrap(), VcpuExit::Hvc { imm: 0 });
    assert_eq!(s.vcpu(0).unwrap().pc, PC0 + 8);
    assert_eq!(vm.dirty_pages().unwrap(), [3]);
    assert_eq!(
        ram.memory()
            .read_obj::<u64>(GuestAddress(page + 0x10))
            .unwrap(),
        0x1122_3344_5566_7788
    );
    let mut saved = [0u8; 32];
    file.read_exact_at(&mut saved, 3 * PAGE_SIZE + 0x10)
        .unwrap();
    assert_eq!(saved, [0xaa; 32], "the file holds the page as it was");
    assert_eq!(save.counts().writer, 3);
}

#[test]
fn a_write_fault_reported_at_another_page_stops_the_vcpu_with_an_error() {
    let wrong = RAM_BASE + 9 * PAGE_SIZE;
    let s = Session::start(Config {
        permission_fault_ipa: FaultIpa::Fixed(wrong),
        ..Config::default()
    });
    let (vm, _ram) = machine(1, GicMode::Userspace);
    let mut v = vcpu0(&vm);
    vm.rearm_dirty_tracking().unwrap();
    s.take_events();
    s.script(
        0,
        [Step::Store {
            va: 0xffff_8000_0000_c000,
            ipa: RAM_BASE + 3 * PAGE_SIZE,
            size: 4,
            rt: 0,
            value: 1,
        }],
    );
    let e = v.run(&mut TestIo::default()).unwrap_err().to_string();
    assert!(e.contains("FAR 0xffff80000000c000"), "{e}");
    assert!(e.contains(&format!("IPA page {wrong:#x} again")), "{e}");
    let events = s.events();
    assert_eq!(exits(&events).len(), 2, "stopped at the first repeat");
    assert_eq!(s.page_flags(RAM_BASE + 3 * PAGE_SIZE), Some(RX));
    assert_eq!(vm.dirty_pages().unwrap(), [9]);
}

#[test]
fn vtimer_exits_raise_the_ppi_and_unmask_only_once_the_guest_handled_the_timer() {
    let s = Session::start(Config::default());
    let (vm, _ram) = machine(1, GicMode::Userspace);
    let mut v = vcpu0(&vm);
    let mut io = TestIo::default();
    // The guest's count starts at 0 (the VM's offset is the host count at
    // creation); its timer fires at 1000.
    v.set_sysreg(CNTV_CVAL_EL0, 1000).unwrap();
    v.set_sysreg(CNTV_CTL_EL0, arm::CNTV_CTL_ENABLE).unwrap();
    s.take_events();
    s.script(
        0,
        [
            Step::AdvanceClock(1000),
            // Interrupt handler: masks the timer in CNTV_CTL_EL0.
            Step::SetSysReg {
                reg: CNTV_CTL_EL0.0,
                value: arm::CNTV_CTL_ENABLE | arm::CNTV_CTL_IMASK,
            },
            hvc(0),
        ],
    );
    assert_eq!(v.run(&mut io).unwrap(), VcpuExit::Hvc { imm: 0 });
    assert_eq!(
        io.vtimer,
        [false, true, false],
        "low at the start, raised by the exit, low once handled"
    );
    let events = s.events();
    let reasons: Vec<u32> = exits(&events).iter().map(|e| e.reason).collect();
    assert_eq!(
        reasons,
        [HV_EXIT_REASON_VTIMER_ACTIVATED, HV_EXIT_REASON_EXCEPTION]
    );
    let masks: Vec<&Event> = events
        .iter()
        .filter(|e| matches!(e, Event::SetVtimerMask { .. } | Event::Exit { .. }))
        .collect();
    assert!(
        matches!(
            masks[..],
            [
                Event::SetVtimerMask { masked: false, .. },
                Event::Exit { .. },
                Event::Exit { .. },
                Event::SetVtimerMask { masked: false, .. }
            ]
        ),
        "unmasked at the start, kept masked across the run after the exit, \
         unmasked after the guest's write: {masks:?}"
    );
    assert!(!s.vcpu(0).unwrap().vtimer_masked);
}

#[test]
fn kicks_from_another_thread_end_a_blocking_run() {
    let s = Session::start(Config::default());
    let (vm, _ram) = machine(1, GicMode::Userspace);
    let mut v = vcpu0(&vm);
    let mut io = TestIo::default();
    let kicker = v.kicker();
    s.script(0, [Step::BlockUntilExit]);
    std::thread::scope(|t| {
        t.spawn(|| {
            s.wait_blocked(0);
            kicker.kick();
        });
        assert_eq!(v.run(&mut io).unwrap(), VcpuExit::Kicked);
    });

    // The IRQ line raised from another thread: the vCPU leaves the guest
    // once, sets the line and goes on, without returning.
    let irq = io.irq.clone();
    s.script(0, [Step::BlockUntilExit, hvc(1)]);
    s.take_events();
    std::thread::scope(|t| {
        t.spawn(|| {
            s.wait_blocked(0);
            irq.store(true, Ordering::SeqCst);
            kicker.irq_line_changed();
        });
        assert_eq!(v.run(&mut io).unwrap(), VcpuExit::Hvc { imm: 1 });
    });
    let runs: Vec<(bool, bool)> = s
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::Run { irq, fiq, .. } => Some((*irq, *fiq)),
            _ => None,
        })
        .collect();
    assert_eq!(runs, [(false, false), (true, false)]);
}

#[test]
fn a_kick_before_the_run_is_reported_whether_or_not_the_framework_latches_it() {
    for mode in [KickBeforeRun::Latched, KickBeforeRun::Dropped] {
        let s = Session::start(Config {
            kick_before_run: mode,
            ..Config::default()
        });
        let (vm, _ram) = machine(1, GicMode::Userspace);
        let mut v = vcpu0(&vm);
        let mut io = TestIo::default();
        let kicker = v.kicker();
        kicker.kick();
        assert_eq!(v.run(&mut io).unwrap(), VcpuExit::Kicked, "{mode:?}");
        s.script(0, [hvc(2)]);
        assert_eq!(v.run(&mut io).unwrap(), VcpuExit::Hvc { imm: 2 });
        // A latched kick leaves a CANCELED exit behind, which resumes.
        let cancels = exits(&s.events())
            .iter()
            .filter(|e| e.reason == HV_EXIT_REASON_CANCELED)
            .count();
        assert_eq!(cancels, usize::from(mode == KickBeforeRun::Latched));

        // A kick landing between the run loop's check and hv_vcpu_run: a
        // latching framework ends that run; otherwise the kick waits for
        // the guest's next exit (here an HVC) and is reported by the next
        // run. The header documents latching; a Mac confirms it.
        let k = kicker.clone();
        s.script(0, [Step::BeforeEntry(Box::new(move || k.kick())), hvc(3)]);
        let first = v.run(&mut io).unwrap();
        match mode {
            KickBeforeRun::Latched => {
                assert_eq!(first, VcpuExit::Kicked);
                assert_eq!(v.run(&mut io).unwrap(), VcpuExit::Hvc { imm: 3 });
            }
            KickBeforeRun::Dropped => {
                assert_eq!(first, VcpuExit::Hvc { imm: 3 });
                assert_eq!(v.run(&mut io).unwrap(), VcpuExit::Kicked);
            }
        }
    }
}

#[test]
fn the_irq_line_reaches_the_framework_as_apples_irq_before_every_run() {
    let s = Session::start(Config::default());
    let (vm, _ram) = machine(1, GicMode::Userspace);
    let mut v = vcpu0(&vm);
    let mut io = TestIo::default();
    io.irq.store(true, Ordering::SeqCst);
    s.script(
        0,
        [Step::Exception {
            esr: arm::wfi(),
            far: 0,
            ipa: 0,
        }],
    );
    s.take_events();
    assert_eq!(v.run(&mut io).unwrap(), VcpuExit::Wfi);
    io.irq.store(false, Ordering::SeqCst);
    s.script(0, [hvc(0)]);
    assert_eq!(v.run(&mut io).unwrap(), VcpuExit::Hvc { imm: 0 });
    let calls: Vec<Event> = s
        .events()
        .into_iter()
        .filter(|e| matches!(e, Event::SetPendingInterrupt { .. } | Event::Run { .. }))
        .collect();
    let line = |pending| Event::SetPendingInterrupt {
        vcpu: 0,
        kind: HV_INTERRUPT_TYPE_IRQ,
        pending,
    };
    let run = |irq| Event::Run {
        vcpu: 0,
        irq,
        fiq: false,
        vtimer_masked: false,
    };
    assert_eq!(
        calls,
        [line(true), run(true), line(false), run(false)],
        "the line set as Apple's IRQ (0) before each run, never FIQ"
    );
}

#[test]
fn kernel_gic_state_round_trips_in_the_documented_order() {
    let s = Session::start(Config::default());
    let (blob, icc) = {
        let (vm, _ram) = machine(1, GicMode::Hvf);
        assert!(s.events().contains(&Event::GicCreate {
            distributor: GICD_BASE,
            redistributor: GICR_BASE
        }));
        let mut v = vcpu0(&vm);
        let mut io = TestIo::default();
        // The guest programs its CPU interface (no trap: the GIC is the
        // framework's), a device raises SPIs.
        s.script(
            0,
            [
                Step::Msr {
                    reg: ICC_PMR_EL1.0,
                    rt: 1,
                    value: 0xf0,
                },
                Step::Msr {
                    reg: ICC_IGRPEN1_EL1.0,
                    rt: 1,
                    value: 1,
                },
                hvc(0),
            ],
        );
        assert_eq!(v.run(&mut io).unwrap(), VcpuExit::Hvc { imm: 0 });
        assert!(io.vtimer.is_empty(), "the GIC owns the vtimer");
        let gic = vm.kernel_gic().unwrap();
        gic.set_spi(33, true).unwrap();
        gic.set_spi(35, true).unwrap();
        gic.set_spi(35, false).unwrap();
        let icc = v.gic_cpu_state().unwrap();
        assert!(icc.contains(&(ICC_PMR_EL1, 0xf0)) && icc.contains(&(ICC_IGRPEN1_EL1, 1)));
        (gic.save().unwrap(), icc)
    };
    assert!(!s.vm_exists());

    // Restore: VM, RAM, GIC, every vCPU, then the GIC's state, then each
    // vCPU's CPU interface, then run.
    let (vm, _ram) = machine(1, GicMode::Hvf);
    assert_eq!(s.spi_level(33), Some(false));
    let mut v = vcpu0(&vm);
    vm.kernel_gic().unwrap().restore(&blob).unwrap();
    v.set_gic_cpu_state(&icc).unwrap();
    assert_eq!(
        (s.spi_level(33), s.spi_level(35)),
        (Some(true), Some(false))
    );
    s.script(
        1,
        [
            Step::Mrs {
                reg: ICC_PMR_EL1.0,
                rt: 4,
            },
            hvc(0),
        ],
    );
    assert_eq!(
        v.run(&mut TestIo::default()).unwrap(),
        VcpuExit::Hvc { imm: 0 }
    );
    assert_eq!(s.vcpu(1).unwrap().x[4], 0xf0);

    // Loading the state again now, after a run, is refused.
    let e = vm.kernel_gic().unwrap().restore(&blob).unwrap_err();
    assert!(
        matches!(
            e,
            HvError::Call {
                call: "hv_gic_set_state",
                ..
            }
        ),
        "{e}"
    );
    let violations = s.take_violations();
    assert!(
        violations.iter().any(|v| v.contains("after a vCPU ran")),
        "{violations:?}"
    );
}

#[test]
fn the_cpu_interface_restored_before_the_gic_state_breaks_the_order() {
    let s = Session::start(Config::default());
    let (vm, _ram) = machine(1, GicMode::Hvf);
    let mut v = vcpu0(&vm);
    let blob = vm.kernel_gic().unwrap().save().unwrap();
    let icc = v.gic_cpu_state().unwrap();
    v.set_gic_cpu_state(&icc).unwrap();
    vm.kernel_gic().unwrap().restore(&blob).unwrap();
    let violations = s.take_violations();
    assert!(
        violations
            .iter()
            .any(|v| v.contains("after vCPU 0's ICC registers were written")),
        "{violations:?}"
    );
}

#[test]
fn simd_registers_round_trip_and_live_sme_state_refuses_a_snapshot() {
    let s = Session::start(Config::default());
    let (vm, _ram) = machine(1, GicMode::Userspace);
    let mut v = vcpu0(&vm);
    for n in 0..32u8 {
        let value = 0x0f0e_0d0c_0b0a_0908_0706_0504_0302_0100_u128
            .wrapping_mul(u128::from(n) + 1)
            .rotate_left(u32::from(n) * 4);
        v.set_vreg(n, value).unwrap();
        assert_eq!(s.vcpu(0).unwrap().v[usize::from(n)], value, "V{n}");
        assert_eq!(v.vreg(n).unwrap(), value, "V{n}");
    }
    drop(v);
    drop(vm);
    drop(s);

    let _s = Session::start(Config {
        sme: SmeAnswer::State {
            streaming: true,
            za: false,
        },
        ..Config::default()
    });
    let (vm, _ram) = machine(1, GicMode::Userspace);
    let mut v = vcpu0(&vm);
    let e = v.vreg(0).unwrap_err().to_string();
    assert!(e.contains("PSTATE.SM is set"), "{e}");
}

#[test]
fn the_counter_offset_reaches_the_vcpu_before_it_runs_and_cntpct_reads_the_virtual_count() {
    let s = Session::start(Config::default());
    let (vm, _ram) = machine(1, GicMode::Userspace);
    let mut v = vcpu0(&vm);
    let offset = s.host_count() - 5_000;
    vm.set_counter_offset(offset);
    s.take_events();
    s.script(
        0,
        [
            Step::Mrs {
                reg: arm::CNTPCT_EL0,
                rt: 3,
            },
            Step::Mrs {
                reg: arm::CNTVCT_EL0,
                rt: 4,
            },
            hvc(0),
        ],
    );
    v.run(&mut TestIo::default()).unwrap();
    let events = s.events();
    let set = events
        .iter()
        .position(|e| matches!(e, Event::SetVtimerOffset { offset: o, .. } if *o == offset));
    let run = events.iter().position(|e| matches!(e, Event::Run { .. }));
    assert!(set.unwrap() < run.unwrap(), "{events:?}");
    let g = s.vcpu(0).unwrap();
    assert_eq!(g.x[4], 5_000, "CNTVCT_EL0 in hardware");
    assert_eq!(
        g.x[3], 5_000,
        "CNTPCT_EL0 trapped, answered with the same count"
    );
}

#[test]
fn cntpct_reads_the_virtual_count_only_where_it_traps() {
    // The backend relies on HVF trapping CNTPCT_EL0 (undocumented): were it
    // not trapped, the guest would read the host's count.
    let mut traps = Config::default().traps;
    traps.remove(&arm::CNTPCT_EL0);
    let s = Session::start(Config {
        traps,
        ..Config::default()
    });
    let (vm, _ram) = machine(1, GicMode::Userspace);
    let mut v = vcpu0(&vm);
    s.script(
        0,
        [
            Step::Mrs {
                reg: arm::CNTPCT_EL0,
                rt: 3,
            },
            hvc(0),
        ],
    );
    v.run(&mut TestIo::default()).unwrap();
    assert_eq!(s.vcpu(0).unwrap().x[3], s.host_count());
    assert_ne!(s.host_count(), vm.virtual_count());
}

#[test]
fn one_vm_per_process_and_an_unknown_exit_stops_the_vcpu() {
    let s = Session::start(Config::default());
    let (vm, _ram) = machine(1, GicMode::Userspace);
    let ram = Arc::new(GuestRam::new_anonymous(PAGE_SIZE).unwrap());
    let e = HvfHypervisor::new()
        .unwrap()
        .create_vm(ram, 1, GicMode::Userspace)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("already has a VM"), "{e}");
    let mut v = vcpu0(&vm);
    s.script(0, [Step::Unknown]);
    assert!(matches!(
        v.run(&mut TestIo::default()).unwrap(),
        VcpuExit::Unhandled { pc: PC0, .. }
    ));
}
