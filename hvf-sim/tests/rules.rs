//! The simulator's rules, driven through its exported C functions the way a
//! VMM calls them: each rule a correct caller keeps passes, each broken one
//! is refused with the framework's error and recorded (or aborts the
//! process, checked in a child process).
#![cfg(not(target_os = "macos"))]

use hvf_sim::apple::*;
use hvf_sim::arm;
use hvf_sim::*;
use std::ffi::c_void;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;

const RAM_IPA: u64 = 0x4000_0000;
const PAGES: usize = 8;

/// 16 KiB-aligned host memory for a mapping.
struct Ram(Vec<u8>, usize);

impl Ram {
    fn new() -> Ram {
        let mut v = vec![0u8; (PAGES + 1) * STAGE2_PAGE as usize];
        let off = v.as_mut_ptr().align_offset(STAGE2_PAGE as usize);
        Ram(v, off)
    }
    fn ptr(&mut self) -> *mut c_void {
        self.0[self.1..].as_mut_ptr().cast()
    }
    fn byte(&self, at: usize) -> u8 {
        self.0[self.1 + at]
    }
}

fn vm_with_ram(ram: &mut Ram) {
    assert_eq!(hv_vm_create(std::ptr::null_mut()), HV_SUCCESS);
    let flags = HV_MEMORY_READ | HV_MEMORY_WRITE | HV_MEMORY_EXEC;
    let size = PAGES * STAGE2_PAGE as usize;
    assert_eq!(hv_vm_map(ram.ptr(), RAM_IPA, size, flags), HV_SUCCESS);
}

fn teardown() {
    assert_eq!(
        hv_vm_unmap(RAM_IPA, PAGES * STAGE2_PAGE as usize),
        HV_SUCCESS
    );
    assert_eq!(hv_vm_destroy(), HV_SUCCESS);
}

/// A vCPU on this thread and its exit record.
fn vcpu() -> (u64, *const HvVcpuExit) {
    let mut id = u64::MAX;
    let mut exit = std::ptr::null();
    // SAFETY: both out-pointers are valid.
    let r = unsafe { hv_vcpu_create(&mut id, &mut exit, std::ptr::null_mut()) };
    assert_eq!(r, HV_SUCCESS);
    (id, exit)
}

fn run(id: u64, exit: *const HvVcpuExit) -> HvVcpuExit {
    assert_eq!(hv_vcpu_run(id), HV_SUCCESS);
    // SAFETY: the exit record of a live vCPU of this thread.
    unsafe { exit.read() }
}

fn get_reg(id: u64, reg: u32) -> u64 {
    let mut v = 0;
    // SAFETY: `v` is writable.
    assert_eq!(unsafe { hv_vcpu_get_reg(id, reg, &mut v) }, HV_SUCCESS);
    v
}

fn sys_reg(id: u64, reg: u16) -> u64 {
    let mut v = 0;
    // SAFETY: `v` is writable.
    assert_eq!(unsafe { hv_vcpu_get_sys_reg(id, reg, &mut v) }, HV_SUCCESS);
    v
}

fn contains(violations: &[String], what: &str) -> bool {
    violations.iter().any(|v| v.contains(what))
}

#[test]
fn stage2_calls_need_whole_16k_pages_inside_mappings() {
    let s = Session::start(Config::default());
    let mut ram = Ram::new();
    vm_with_ram(&mut ram);
    let p = STAGE2_PAGE as usize;
    assert_eq!(hv_vm_protect(RAM_IPA, p, HV_MEMORY_READ), HV_SUCCESS);
    assert_eq!(s.page_flags(RAM_IPA), Some(HV_MEMORY_READ));
    for (ipa, size) in [
        (RAM_IPA + 4096, p),                            // misaligned IPA
        (RAM_IPA, 4096),                                // part of a page
        (RAM_IPA, 0),                                   // empty
        (RAM_IPA + (PAGES as u64 - 1) * 0x4000, 2 * p), // leaves the mapping
        (0x1000_0000, p),                               // not mapped
    ] {
        assert_eq!(hv_vm_protect(ipa, size, HV_MEMORY_READ), HV_BAD_ARGUMENT);
    }
    assert_eq!(s.take_violations().len(), 5);
    // A second mapping over the first, and a misaligned one.
    assert_eq!(
        hv_vm_map(ram.ptr(), RAM_IPA, p, HV_MEMORY_READ),
        HV_BAD_ARGUMENT
    );
    assert_eq!(
        hv_vm_map(ram.ptr(), 0x2000, p, HV_MEMORY_READ),
        HV_BAD_ARGUMENT
    );
    let v = s.take_violations();
    assert!(contains(&v, "overlaps") && contains(&v, "16 KiB"), "{v:?}");
    // Only a whole mapping unmaps.
    assert_eq!(hv_vm_unmap(RAM_IPA, p), HV_BAD_ARGUMENT);
    assert_eq!(s.take_violations().len(), 1);
    teardown();
}

#[test]
fn one_vm_per_process_and_one_vcpu_per_thread() {
    let s = Session::start(Config::default());
    let mut ram = Ram::new();
    vm_with_ram(&mut ram);
    // The documented answer to a second VM, not a violation.
    assert_eq!(hv_vm_create(std::ptr::null_mut()), HV_BUSY);
    let (id, _) = vcpu();
    let mut other = 0;
    let mut exit = std::ptr::null();
    // SAFETY: valid out-pointers.
    let r = unsafe { hv_vcpu_create(&mut other, &mut exit, std::ptr::null_mut()) };
    assert_eq!(r, HV_BUSY);
    // The VM cannot go while a vCPU exists.
    assert_eq!(hv_vm_destroy(), HV_BUSY);
    let v = s.take_violations();
    assert!(
        contains(&v, "one vCPU per thread") && contains(&v, "still exist"),
        "{v:?}"
    );
    assert_eq!(hv_vcpu_destroy(id), HV_SUCCESS);
    teardown();
    assert!(!s.vm_exists());
}

/// Runs this test's body in a child process when `HVF_SIM_DEATH` names it,
/// and otherwise checks that the child aborted with `message` on stderr.
fn expect_abort(name: &str, message: &str, body: impl FnOnce()) {
    if std::env::var("HVF_SIM_DEATH").as_deref() == Ok(name) {
        body();
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("HVF_SIM_DEATH", name)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(6), "not SIGABRT: {stderr}");
    assert!(stderr.contains(message), "{stderr}");
}

#[test]
fn a_vcpu_call_from_another_thread_aborts() {
    expect_abort(
        "a_vcpu_call_from_another_thread_aborts",
        "hv_vcpu_set_reg(vCPU 0) called on thread",
        || {
            let _s = Session::start(Config::default());
            let mut ram = Ram::new();
            vm_with_ram(&mut ram);
            let (id, _) = vcpu();
            std::thread::spawn(move || hv_vcpu_set_reg(id, HV_REG_PC, 0))
                .join()
                .unwrap();
        },
    );
}

#[test]
fn a_double_release_aborts() {
    expect_abort(
        "a_double_release_aborts",
        "released twice (from hv_gic_config_create)",
        || {
            let _s = Session::start(Config::default());
            let c = hv_gic_config_create();
            os_release(c);
            os_release(c);
        },
    );
}

#[test]
fn a_leaked_object_fails_the_session() {
    let r = std::panic::catch_unwind(|| {
        let _s = Session::start(Config::default());
        let _leak = hv_gic_config_create();
    });
    let msg = *r.unwrap_err().downcast::<String>().unwrap();
    assert!(
        msg.contains("from hv_gic_config_create was never released"),
        "{msg}"
    );
}

/// The GIC's state as `hv_gic_state_*` returns it.
fn save_gic() -> Vec<u8> {
    let st = hv_gic_state_create();
    assert!(!st.is_null());
    let mut size = 0;
    // SAFETY: a live state object; `size` is writable.
    let r = unsafe { hv_gic_state_get_size(st, &mut size) };
    assert_eq!(r, HV_SUCCESS);
    let mut blob = vec![0u8; size];
    // SAFETY: `blob` has the size the state reported.
    let r = unsafe { hv_gic_state_get_data(st, blob.as_mut_ptr().cast()) };
    assert_eq!(r, HV_SUCCESS);
    os_release(st);
    blob
}

#[test]
fn the_gic_comes_before_vcpus_and_its_state_before_the_first_run() {
    let s = Session::start(Config::default());
    let mut ram = Ram::new();
    vm_with_ram(&mut ram);
    let c = hv_gic_config_create();
    assert_eq!(
        hv_gic_config_set_distributor_base(c, 0x0800_1000),
        HV_BAD_ARGUMENT
    );
    assert_eq!(
        hv_gic_config_set_distributor_base(c, 0x0800_0000),
        HV_SUCCESS
    );
    assert_eq!(
        hv_gic_config_set_redistributor_base(c, 0x080a_0000),
        HV_SUCCESS
    );
    assert_eq!(hv_gic_create(c), HV_SUCCESS);
    assert_eq!(hv_gic_create(c), HV_BUSY);
    os_release(c);
    assert_eq!(hv_gic_set_spi(33, true), HV_SUCCESS);
    assert_eq!(hv_gic_set_spi(31, true), HV_BAD_ARGUMENT);
    let v = s.take_violations();
    assert_eq!(v.len(), 3, "{v:?}");
    assert!(contains(&v, "is not aligned to 0x10000"), "{v:?}");
    assert!(contains(&v, "already has a GIC"), "{v:?}");
    assert!(
        contains(&v, "INTID 31 is not one of the SPIs 32..288"),
        "{v:?}"
    );

    // Before any vCPU exists the state cannot be loaded.
    let blob = save_gic();
    // SAFETY: `blob` is readable.
    let set = |b: &[u8]| unsafe { hv_gic_set_state(b.as_ptr().cast(), b.len()) };
    assert_eq!(set(&blob), HV_BAD_ARGUMENT);
    assert!(contains(&s.take_violations(), "before the vCPUs exist"));

    let (id, exit) = vcpu();
    // The blob was taken with no vCPU: refused (an answer, not a rule).
    assert_eq!(set(&blob), HV_BAD_ARGUMENT);
    assert!(s.take_violations().is_empty());
    let blob = save_gic();
    assert_eq!(hv_gic_set_spi(33, false), HV_SUCCESS);
    assert_eq!(set(&blob), HV_SUCCESS);
    assert_eq!(s.spi_level(33), Some(true));
    // ICC registers after the state: fine; the state after them: not.
    assert_eq!(hv_gic_set_icc_reg(id, 0xc230, 0xf0), HV_SUCCESS);
    assert_eq!(set(&blob), HV_SUCCESS);
    assert!(contains(&s.take_violations(), "ICC registers were written"));
    // A GIC created after a vCPU, and a state loaded after a run.
    s.script(
        id,
        [Step::Exception {
            esr: arm::hvc(0),
            far: 0,
            ipa: 0,
        }],
    );
    assert_eq!(run(id, exit).reason, HV_EXIT_REASON_EXCEPTION);
    assert_eq!(set(&blob), HV_BAD_ARGUMENT);
    assert!(contains(&s.take_violations(), "after a vCPU ran"));
    assert_eq!(hv_vcpu_destroy(id), HV_SUCCESS);
    teardown();
}

#[test]
fn a_gic_after_a_vcpu_is_refused() {
    let s = Session::start(Config::default());
    let mut ram = Ram::new();
    vm_with_ram(&mut ram);
    let (id, _) = vcpu();
    let c = hv_gic_config_create();
    hv_gic_config_set_distributor_base(c, 0x0800_0000);
    hv_gic_config_set_redistributor_base(c, 0x080a_0000);
    assert_eq!(hv_gic_create(c), HV_BAD_ARGUMENT);
    os_release(c);
    assert!(contains(&s.take_violations(), "before any vCPU"));
    hv_vcpu_destroy(id);
    teardown();
}

#[test]
fn stores_fault_on_protected_ram_until_retried_and_spin_is_stopped() {
    let s = Session::start(Config::default());
    let mut ram = Ram::new();
    vm_with_ram(&mut ram);
    let (id, exit) = vcpu();
    let page = RAM_IPA + 2 * STAGE2_PAGE;
    assert_eq!(
        hv_vm_protect(RAM_IPA, PAGES * STAGE2_PAGE as usize, HV_MEMORY_READ),
        HV_SUCCESS
    );
    let store = || Step::Store {
        va: 0xffff_0000_0000_8000,
        ipa: page + 8,
        size: 4,
        rt: 1,
        value: 0xaabb_ccdd,
    };
    s.script(
        id,
        [
            store(),
            Step::Exception {
                esr: arm::hvc(0),
                far: 0,
                ipa: 0,
            },
        ],
    );
    let e = run(id, exit);
    assert_eq!(
        e.syndrome,
        arm::data_abort(4, 1, true, arm::DFSC_PERMISSION_L3)
    );
    assert_eq!(
        (e.virtual_address, e.physical_address),
        (0xffff_0000_0000_8000, page + 8)
    );
    assert_eq!(get_reg(id, HV_REG_PC), 0, "the store is not complete");
    assert_eq!(
        hv_vm_protect(page, STAGE2_PAGE as usize, HV_MEMORY_READ | HV_MEMORY_WRITE),
        HV_SUCCESS
    );
    let e = run(id, exit);
    assert_eq!(arm::ec(e.syndrome), arm::EC_HVC64);
    assert_eq!(ram.byte(2 * STAGE2_PAGE as usize + 8), 0xdd);
    assert_eq!(
        get_reg(id, HV_REG_PC),
        8,
        "store, then HVC's return address"
    );

    // A VMM that moves PC past the faulting store loses it.
    s.script(
        id,
        [
            Step::Store {
                va: 0,
                ipa: RAM_IPA,
                size: 1,
                rt: 2,
                value: 7,
            },
            Step::Exception {
                esr: arm::hvc(1),
                far: 0,
                ipa: 0,
            },
        ],
    );
    run(id, exit);
    hv_vcpu_set_reg(id, HV_REG_PC, 12);
    run(id, exit);
    assert!(contains(&s.take_violations(), "was not retried"));
    assert_eq!(ram.byte(0), 0);

    // One that never unprotects the page is stopped after REFAULT_LIMIT.
    s.script(id, [store()]);
    assert_eq!(
        hv_vm_protect(page, STAGE2_PAGE as usize, HV_MEMORY_READ),
        HV_SUCCESS
    );
    let mut faults = 0;
    while hv_vcpu_run(id) == HV_SUCCESS {
        faults += 1;
    }
    assert_eq!(faults, REFAULT_LIMIT);
    assert!(contains(
        &s.take_violations(),
        "faulted 1000 times in a row"
    ));
    hv_vcpu_destroy(id);
    teardown();
}

#[test]
fn a_wrong_ipa_mode_reports_another_page() {
    let other = RAM_IPA + 5 * STAGE2_PAGE;
    let s = Session::start(Config {
        permission_fault_ipa: FaultIpa::Fixed(other),
        ..Config::default()
    });
    let mut ram = Ram::new();
    vm_with_ram(&mut ram);
    let (id, exit) = vcpu();
    hv_vm_protect(RAM_IPA, PAGES * STAGE2_PAGE as usize, HV_MEMORY_READ);
    s.script(
        id,
        [Step::Store {
            va: 0x1000,
            ipa: RAM_IPA,
            size: 8,
            rt: 0,
            value: 1,
        }],
    );
    assert_eq!(run(id, exit).physical_address, other);
    hv_vcpu_destroy(id);
    teardown();
}

#[test]
fn mmio_accesses_and_traps_exit_with_arm_syndromes() {
    let s = Session::start(Config::default());
    let mut ram = Ram::new();
    vm_with_ram(&mut ram);
    let (id, exit) = vcpu();
    s.script(
        id,
        [
            Step::Load {
                va: 0xffff_0000_0900_0018,
                ipa: 0x0900_0018,
                size: 4,
                rt: 3,
            },
            Step::Mrs {
                reg: arm::CNTPCT_EL0,
                rt: 4,
            },
            Step::Mrs {
                reg: arm::CNTVCT_EL0,
                rt: 5,
            },
            Step::Msr {
                reg: arm::ICC_SGI1R_EL1,
                rt: 6,
                value: 0x1_0001,
            },
            Step::Exception {
                esr: arm::hvc(0),
                far: 0,
                ipa: 0,
            },
        ],
    );
    let e = run(id, exit);
    assert_eq!(
        e.syndrome,
        arm::data_abort(4, 3, false, arm::DFSC_TRANSLATION_L3)
    );
    assert_eq!(e.physical_address, 0x0900_0018);
    hv_vcpu_set_reg(id, HV_REG_PC, 4);
    let e = run(id, exit);
    assert_eq!(e.syndrome, arm::sysreg_access(arm::CNTPCT_EL0, 4, true));
    hv_vcpu_set_reg(id, HV_REG_PC, 8);
    // CNTVCT does not trap: read as the host count minus CNTVOFF.
    hv_vcpu_set_vtimer_offset(id, 1000);
    let e = run(id, exit);
    assert_eq!(get_reg(id, 5), s.host_count() - 1000);
    // Without an in-kernel GIC the ICC registers trap.
    assert_eq!(e.syndrome, arm::sysreg_access(arm::ICC_SGI1R_EL1, 6, false));
    assert_eq!(get_reg(id, 6), 0x1_0001);
    hv_vcpu_destroy(id);
    teardown();
}

#[test]
fn the_vtimer_exits_once_and_masking_is_checked() {
    let s = Session::start(Config::default());
    let mut ram = Ram::new();
    vm_with_ram(&mut ram);
    let (id, exit) = vcpu();
    let now = s.host_count();
    hv_vcpu_set_sys_reg(id, HV_SYS_REG_CNTV_CVAL_EL0, now + 100);
    hv_vcpu_set_sys_reg(id, HV_SYS_REG_CNTV_CTL_EL0, arm::CNTV_CTL_ENABLE);
    assert_eq!(sys_reg(id, HV_SYS_REG_CNTV_CTL_EL0), arm::CNTV_CTL_ENABLE);
    s.script(
        id,
        [
            Step::AdvanceClock(100),
            Step::SetSysReg {
                reg: HV_SYS_REG_CNTV_CTL_EL0,
                value: arm::CNTV_CTL_ENABLE | arm::CNTV_CTL_IMASK,
            },
            Step::Exception {
                esr: arm::hvc(0),
                far: 0,
                ipa: 0,
            },
            Step::Exception {
                esr: arm::hvc(0),
                far: 0,
                ipa: 0,
            },
        ],
    );
    assert_eq!(run(id, exit).reason, HV_EXIT_REASON_VTIMER_ACTIVATED);
    let v = s.vcpu(id).unwrap();
    assert!(v.vtimer_masked && v.vtimer_asserted);
    assert_eq!(
        sys_reg(id, HV_SYS_REG_CNTV_CTL_EL0),
        arm::CNTV_CTL_ENABLE | arm::CNTV_CTL_ISTATUS
    );
    // Kept masked while asserted: fine.
    assert_eq!(run(id, exit).reason, HV_EXIT_REASON_EXCEPTION);
    assert!(s.take_violations().is_empty());
    // The guest masked it in CNTV_CTL: running on with the framework's mask
    // still set loses the next expiry.
    run(id, exit);
    let v = s.take_violations();
    assert!(
        contains(&v, "masked although its output is not asserted"),
        "{v:?}"
    );
    // Unmasked while asserted: an exit storm.
    s.script(
        id,
        [
            Step::SetSysReg {
                reg: HV_SYS_REG_CNTV_CTL_EL0,
                value: arm::CNTV_CTL_ENABLE,
            },
            Step::Exception {
                esr: arm::hvc(0),
                far: 0,
                ipa: 0,
            },
            Step::Exception {
                esr: arm::hvc(0),
                far: 0,
                ipa: 0,
            },
        ],
    );
    hv_vcpu_set_vtimer_mask(id, false);
    assert_eq!(run(id, exit).reason, HV_EXIT_REASON_VTIMER_ACTIVATED);
    assert!(s.take_violations().is_empty());
    hv_vcpu_set_vtimer_mask(id, false);
    assert_eq!(run(id, exit).reason, HV_EXIT_REASON_VTIMER_ACTIVATED);
    let v = s.take_violations();
    assert!(
        contains(&v, "unmasked while its output is still asserted"),
        "{v:?}"
    );
    hv_vcpu_destroy(id);
    teardown();
}

#[test]
fn kicks_are_latched_or_dropped_by_mode_and_end_a_blocked_run() {
    for mode in [KickBeforeRun::Latched, KickBeforeRun::Dropped] {
        let s = Session::start(Config {
            kick_before_run: mode,
            ..Config::default()
        });
        let mut ram = Ram::new();
        vm_with_ram(&mut ram);
        let (id, exit) = vcpu();
        s.script(
            id,
            [
                Step::Exception {
                    esr: arm::hvc(0),
                    far: 0,
                    ipa: 0,
                },
                Step::BlockUntilExit,
            ],
        );
        // SAFETY: one valid id.
        assert_eq!(unsafe { hv_vcpus_exit(&id, 1) }, HV_SUCCESS);
        let first = run(id, exit).reason;
        match mode {
            KickBeforeRun::Latched => assert_eq!(first, HV_EXIT_REASON_CANCELED),
            KickBeforeRun::Dropped => assert_eq!(first, HV_EXIT_REASON_EXCEPTION),
        }
        if mode == KickBeforeRun::Latched {
            assert_eq!(run(id, exit).reason, HV_EXIT_REASON_EXCEPTION);
        }
        std::thread::scope(|t| {
            t.spawn(|| {
                s.wait_blocked(id);
                // SAFETY: one valid id.
                assert_eq!(unsafe { hv_vcpus_exit(&id, 1) }, HV_SUCCESS);
            });
            assert_eq!(run(id, exit).reason, HV_EXIT_REASON_CANCELED);
        });
        hv_vcpu_destroy(id);
        // A kick that outlives its vCPU.
        // SAFETY: one id.
        assert_eq!(unsafe { hv_vcpus_exit(&id, 1) }, HV_BAD_ARGUMENT);
        assert!(contains(&s.take_violations(), "must not outlive"));
        teardown();
    }
}

#[test]
fn pending_interrupts_are_cleared_when_the_run_returns() {
    let s = Session::start(Config::default());
    let mut ram = Ram::new();
    vm_with_ram(&mut ram);
    let (id, exit) = vcpu();
    s.script(
        id,
        [Step::Exception {
            esr: arm::wfi(),
            far: 0,
            ipa: 0,
        }],
    );
    assert_eq!(
        hv_vcpu_set_pending_interrupt(id, HV_INTERRUPT_TYPE_IRQ, true),
        HV_SUCCESS
    );
    assert_eq!(hv_vcpu_set_pending_interrupt(id, 2, true), HV_BAD_ARGUMENT);
    s.take_violations();
    run(id, exit);
    assert!(s.events().contains(&Event::Run {
        vcpu: id,
        irq: true,
        fiq: false,
        vtimer_masked: false
    }));
    assert!(!s.vcpu(id).unwrap().pending_irq);
    hv_vcpu_destroy(id);
    teardown();
}

#[test]
fn the_host_answers_the_backends_sysctls_and_clock() {
    let s = Session::start(Config::default());
    let mut buf = [0u8; 8];
    let mut len = buf.len();
    // SAFETY: a C string; `buf` has `len` bytes.
    let r = unsafe {
        sysctlbyname(
            c"hw.tbfrequency".as_ptr(),
            buf.as_mut_ptr().cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    assert_eq!((r, len, u64::from_ne_bytes(buf)), (0, 8, 24_000_000));
    let mut len = 8;
    // SAFETY: as above.
    let r = unsafe {
        sysctlbyname(
            c"kern.hv_support".as_ptr(),
            buf.as_mut_ptr().cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    assert_eq!((r, len, buf[0]), (0, 4, 1));
    let mut info = MachTimebaseInfo::default();
    // SAFETY: `info` is writable.
    assert_eq!(unsafe { mach_timebase_info(&mut info) }, 0);
    assert_eq!((info.numer, info.denom), (125, 3));
    s.set_host_count(42);
    assert_eq!(mach_absolute_time(), 42);
}
