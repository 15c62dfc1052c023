use super::*;
use crate::arch::esr::FaultStatus;
use crate::arch::esr_vectors::*;
use crate::arch::layout::RAM_BASE;
use crate::arch::sysreg::{SysReg, CNTPCT_EL0, ICC_EOIR1_EL1, ICC_IAR1_EL1, ID_AA64MMFR0_EL1};
use crate::hv::fake::{FakeVcpu, PC, PSTATE_EL1H_Z, VBAR};
use crate::hv::{MmioFault, VcpuId};
const RAM: RamRange = RamRange {
    base: RAM_BASE,
    size: 64 * PAGE_SIZE,
};
/// A PL011 register: the MMIO target of the data-abort cases.
const UART: u64 = 0x0900_0018;

fn exception(esr: u64, ipa: u64) -> ExitRecord {
    ExitRecord {
        reason: ExitReason::Exception,
        esr,
        far: 0xffff_0000_0900_0018,
        ipa,
    }
}

fn guest(action: Action) -> GuestAction {
    match action {
        Action::Guest(g) => g,
        other => panic!("not a guest action: {other:?}"),
    }
}

fn mmio(esr: u64) -> (u64, DataAbort) {
    match guest(decide(&exception(esr, UART), RAM, false)) {
        GuestAction::Mmio { gpa, abort } => (gpa, abort),
        other => panic!("{esr:#x}: {other:?}"),
    }
}

fn sysreg(esr: u64) -> GuestAction {
    guest(decide(&exception(esr, 0), RAM, false))
}

fn is_unhandled(action: Action) -> bool {
    matches!(action, Action::Guest(GuestAction::Unhandled { .. }))
}

// ---- decide ----

#[test]
fn mmio_reads_of_every_size_and_extension() {
    // (esr, size, sse, sf, rt)
    for (esr, size, sse, sf, rt) in [
        (LDRB_W1, 1, false, false, 1),
        (LDRH_W2, 2, false, false, 2),
        (LDR_W3, 4, false, false, 3),
        (LDR_X4, 8, false, true, 4),
        (LDRSB_X5, 1, true, true, 5),
        (LDRSB_W8, 1, true, false, 8),
        (LDRSH_W6, 2, true, false, 6),
        (LDRSW_X7, 4, true, true, 7),
    ] {
        let (gpa, da) = mmio(esr);
        assert_eq!(gpa, UART);
        assert!(!da.wnr, "{esr:#x}");
        assert_eq!(
            (da.size, da.sse, da.sf, da.srt),
            (size, sse, sf, rt),
            "{esr:#x}"
        );
    }
}

#[test]
fn mmio_writes_of_every_size() {
    for (esr, size, rt) in [
        (STRB_W1, 1, 1),
        (STRH_W2, 2, 2),
        (STR_W3, 4, 3),
        (STR_X4, 8, 4),
        (STR_XZR, 8, 31),
    ] {
        let (_, da) = mmio(esr);
        assert!(da.wnr);
        assert_eq!((da.size, da.srt), (size, rt), "{esr:#x}");
    }
}

#[test]
fn write_protect_fault_marks_the_16k_page() {
    let ipa = RAM_BASE + 5 * PAGE_SIZE + 0x1234;
    for esr in [STR_X1_PERM, STP_PERM, S1PTW_PERM] {
        assert_eq!(
            decide(&exception(esr, ipa), RAM, true),
            Action::WriteProtectFault {
                page: RAM_BASE + 5 * PAGE_SIZE
            },
            "{esr:#x}"
        );
        // Without write protection the same fault is a bug, not a retry.
        assert!(is_unhandled(decide(&exception(esr, ipa), RAM, false)));
    }
    // The last byte of RAM is in the last page; one past it is MMIO space.
    let last = RAM_BASE + RAM.size - 1;
    assert_eq!(
        decide(&exception(STR_X1_PERM, last), RAM, true),
        Action::WriteProtectFault {
            page: RAM_BASE + RAM.size - PAGE_SIZE
        }
    );
    assert!(is_unhandled(decide(
        &exception(STR_X1_PERM, RAM_BASE + RAM.size),
        RAM,
        true
    )));
}

#[test]
fn aborts_that_cannot_be_emulated_are_unhandled_not_panics() {
    for esr in [LDP_NO_ISV, S1PTW_TRANSLATION, SEA_MMIO, IABT_L3, BRK_BUG] {
        assert!(
            is_unhandled(decide(&exception(esr, UART), RAM, true)),
            "{esr:#x}"
        );
    }
    // A translation fault inside RAM means RAM was not mapped.
    assert!(is_unhandled(decide(
        &exception(LDR_W3, RAM_BASE),
        RAM,
        true
    )));
    // Cache maintenance on device memory is a no-op.
    assert_eq!(
        decide(&exception(DC_CIVAC_MMIO, UART), RAM, false),
        Action::Guest(GuestAction::SkipInstruction)
    );
    // Every ESR decodes to some action.
    for ec in 0..64u64 {
        let _ = decide(&exception(ec << 26 | 0x3ff_ffff, UART), RAM, true);
    }
}

#[test]
fn sysreg_traps_go_to_the_vmm() {
    assert_eq!(
        sysreg(MRS_X5_IAR1),
        GuestAction::SysReg(SysRegAccess {
            reg: ICC_IAR1_EL1,
            rt: 5,
            read: true
        })
    );
    assert_eq!(
        sysreg(MSR_EOIR1_X3),
        GuestAction::SysReg(SysRegAccess {
            reg: ICC_EOIR1_EL1,
            rt: 3,
            read: false
        })
    );
}

#[test]
fn physical_timer_accesses_go_to_the_vmm() {
    use crate::arch::esr::{encode, ExceptionClass};
    use crate::arch::sysreg::{CNTP_CTL_EL0, CNTP_CVAL_EL0, CNTP_TVAL_EL0};
    for reg in [CNTP_CTL_EL0, CNTP_CVAL_EL0, CNTP_TVAL_EL0] {
        for read in [true, false] {
            let access = SysRegAccess { reg, rt: 4, read };
            let esr = encode(ExceptionClass::SysReg, true, access.to_iss());
            assert_eq!(sysreg(esr), GuestAction::SysReg(access), "{reg:?}");
        }
    }
}

#[test]
fn hypervisor_artifact_sysregs_are_completed_locally() {
    let op = |esr| match sysreg(esr) {
        GuestAction::LocalSysReg { op, .. } => Some(op),
        GuestAction::InjectUndef => None,
        other => panic!("{esr:#x}: {other:?}"),
    };
    assert_eq!(op(MSR_PMUSERENR_XZR), Some(LocalSysReg::IgnoreWrite));
    assert_eq!(op(MRS_X2_PMCR), Some(LocalSysReg::ReadZero));
    assert_eq!(op(MSR_OSLAR_X0), Some(LocalSysReg::WriteOsLock));
    assert_eq!(op(MRS_X1_OSLAR), None);
    assert_eq!(op(MRS_X1_OSLSR), Some(LocalSysReg::ReadOsLockStatus));
    assert_eq!(op(MSR_OSDLR_X0), Some(LocalSysReg::IgnoreWrite));
    assert_eq!(op(MRS_X0_CNTPCT), Some(LocalSysReg::ReadVirtualCount));
    assert_eq!(op(MRS_X2_ISAR2), Some(LocalSysReg::ReadZero));
    assert_eq!(op(MSR_MMFR0_X2), None);
    assert_eq!(
        SysRegAccess::from_iss((MSR_MMFR0_X2 & 0x1ff_ffff) as u32).reg,
        ID_AA64MMFR0_EL1
    );
    assert_eq!(
        SysRegAccess::from_iss((MRS_X0_CNTPCT & 0x1ff_ffff) as u32).reg,
        CNTPCT_EL0
    );
    // PMCCFILTR_EL0 and PMEVTYPER0_EL0 are PMU registers; CNTV_CTL is not.
    assert!(is_pmu(SysReg::new(3, 3, 14, 15, 7)));
    assert!(is_pmu(SysReg::new(3, 3, 14, 12, 0)));
    assert!(is_pmu(SysReg::new(3, 0, 9, 14, 2)));
    assert!(!is_pmu(crate::arch::sysreg::CNTV_CTL_EL0));
    assert!(!is_pmu(crate::arch::sysreg::ICC_PMR_EL1));
}

#[test]
fn calls_waits_and_reasons() {
    let d = |esr| guest(decide(&exception(esr, 0), RAM, false));
    assert_eq!(d(HVC_0), GuestAction::Hvc { imm: 0 });
    assert_eq!(d(0x5A00_1234), GuestAction::Hvc { imm: 0x1234 });
    assert_eq!(d(SMC_0), GuestAction::Smc { imm: 0 });
    assert_eq!(d(WFI), GuestAction::Wfi);
    assert_eq!(d(WFE), GuestAction::Wfe);
    assert_eq!(d(WFIT_X7), GuestAction::Wfe);
    let other = |reason| ExitRecord {
        reason,
        esr: 0,
        far: 0,
        ipa: 0,
    };
    assert_eq!(
        decide(&other(ExitReason::Canceled), RAM, true),
        Action::Kicked
    );
    assert_eq!(
        decide(&other(ExitReason::VtimerActivated), RAM, true),
        Action::VtimerActivated
    );
    assert!(is_unhandled(decide(&other(ExitReason::Unknown), RAM, true)));
}

// ---- complete, against a fake vCPU and device bus ----

/// A device bus that records every call.
#[derive(Default)]
struct FakeIo {
    read_data: Vec<u8>,
    fail: bool,
    sysreg_value: Option<u64>,
    accept_sysreg_write: bool,
    calls: Vec<String>,
}

impl VcpuIo for FakeIo {
    fn mmio_read(&mut self, vcpu: VcpuId, gpa: u64, data: &mut [u8]) -> Result<(), MmioFault> {
        self.calls
            .push(format!("read {vcpu} {gpa:#x} {}", data.len()));
        if self.fail {
            return Err(MmioFault {
                gpa,
                len: data.len(),
                reason: "test",
            });
        }
        data.copy_from_slice(&self.read_data[..data.len()]);
        Ok(())
    }
    fn mmio_write(&mut self, vcpu: VcpuId, gpa: u64, data: &[u8]) -> Result<(), MmioFault> {
        self.calls.push(format!("write {vcpu} {gpa:#x} {data:x?}"));
        if self.fail {
            return Err(MmioFault {
                gpa,
                len: data.len(),
                reason: "test",
            });
        }
        Ok(())
    }
    fn sysreg_read(&mut self, vcpu: VcpuId, reg: SysReg) -> Option<u64> {
        self.calls.push(format!("mrs {vcpu} {reg:?}"));
        self.sysreg_value
    }
    fn sysreg_write(&mut self, vcpu: VcpuId, reg: SysReg, value: u64) -> bool {
        self.calls.push(format!("msr {vcpu} {reg:?} {value:#x}"));
        self.accept_sysreg_write
    }
    fn irq_line(&mut self, _vcpu: VcpuId) -> bool {
        false
    }
    fn vtimer_level(&mut self, _vcpu: VcpuId, _level: bool) {}
}

fn virtual_count() -> u64 {
    50_000
}

/// Decides and completes `esr` at `ipa` on `v` with `io`.
fn run(v: &mut FakeVcpu, io: &mut FakeIo, esr: u64, ipa: u64) -> Step {
    let exit = exception(esr, ipa);
    let action = guest(decide(&exit, RAM, true));
    complete(
        v,
        io,
        &exit,
        action,
        &mut LocalState::default(),
        &virtual_count,
    )
    .unwrap()
}

#[test]
fn mmio_read_writes_back_extends_and_advances_pc() {
    // (esr, device bytes, register, expected value)
    for (esr, bytes, rt, expected) in [
        (LDRB_W1, &[0x80u8][..], 1, 0x80),
        (LDRH_W2, &[0x34, 0x82], 2, 0x8234),
        (LDR_W3, &[0x78, 0x56, 0x34, 0x92], 3, 0x9234_5678),
        (
            LDR_X4,
            &[1, 2, 3, 4, 5, 6, 7, 0x88],
            4,
            0x8807_0605_0403_0201,
        ),
        (LDRSB_X5, &[0x80], 5, 0xffff_ffff_ffff_ff80),
        (LDRSB_W8, &[0x80], 8, 0xffff_ff80),
        (LDRSH_W6, &[0x00, 0x80], 6, 0xffff_8000),
        (LDRSW_X7, &[0, 0, 0, 0x80], 7, 0xffff_ffff_8000_0000),
        (LDRSW_X7, &[0, 0, 0, 0x7f], 7, 0x7f00_0000),
    ] {
        let mut v = FakeVcpu::new();
        let mut io = FakeIo {
            read_data: bytes.to_vec(),
            ..Default::default()
        };
        let mut expected_x = v.x;
        expected_x[rt] = expected;
        assert_eq!(run(&mut v, &mut io, esr, UART), Step::Resume);
        assert_eq!(io.calls, [format!("read 2 {UART:#x} {}", bytes.len())]);
        assert_eq!(v.x, expected_x, "{esr:#x}");
        assert_eq!(v.pc, PC + 4, "PC advanced before the guest runs again");
    }
}

#[test]
fn mmio_write_sends_truncated_register_and_advances_pc() {
    for (esr, expected) in [
        (STRB_W1, "[1]"),
        (STRH_W2, "[2, 0]"),
        (STR_W3, "[3, 0, 0, 0]"),
        (STR_X4, "[4, 0, 0, 0, ef, be, ad, de]"),
        (STR_XZR, "[0, 0, 0, 0, 0, 0, 0, 0]"),
    ] {
        let mut v = FakeVcpu::new();
        let before = v.x;
        let mut io = FakeIo::default();
        assert_eq!(run(&mut v, &mut io, esr, UART), Step::Resume);
        assert_eq!(io.calls, [format!("write 2 {UART:#x} {expected}")]);
        assert_eq!(v.x, before);
        assert_eq!(v.pc, PC + 4);
    }
}

#[test]
fn mmio_fault_injects_a_synchronous_external_abort() {
    for (esr, wnr) in [(LDR_W3, false), (STR_W3, true)] {
        let mut v = FakeVcpu::new();
        let before = v.x;
        let mut io = FakeIo {
            fail: true,
            ..Default::default()
        };
        assert_eq!(run(&mut v, &mut io, esr, UART), Step::Resume);
        assert_eq!(v.x, before, "no write-back on a fault");
        assert_eq!(v.pc, VBAR + 0x200, "current EL with SP_EL1");
        assert_eq!(v.sys[&ELR_EL1], PC, "return to the faulting access");
        assert_eq!(v.sys[&SPSR_EL1], PSTATE_EL1H_Z);
        assert_eq!(v.sys[&FAR_EL1], 0xffff_0000_0900_0018);
        // EC 0x25 (0x9400_0000) | IL | WnR? | DFSC 0b010000.
        let expected = 0x9600_0010 | if wnr { 0x40 } else { 0 };
        assert_eq!(v.sys[&ESR_EL1], expected);
        assert_eq!(v.pstate, 0x4000_03c5, "EL1h, DAIF masked, Z kept");
    }
}

#[test]
fn sysreg_read_write_and_refusal() {
    let mut v = FakeVcpu::new();
    let mut io = FakeIo {
        sysreg_value: Some(27),
        accept_sysreg_write: true,
        ..Default::default()
    };
    run(&mut v, &mut io, MRS_X5_IAR1, 0);
    assert_eq!((v.x[5], v.pc), (27, PC + 4));
    v.x[3] = 27;
    run(&mut v, &mut io, MSR_EOIR1_X3, 0);
    assert_eq!(v.pc, PC + 8);
    assert_eq!(io.calls, ["mrs 2 ICC_IAR1_EL1", "msr 2 ICC_EOIR1_EL1 0x1b"]);

    // Refused: UNDEFINED at the MRS/MSR itself, Rt untouched.
    for esr in [MRS_X5_IAR1, MSR_EOIR1_X3] {
        let mut v = FakeVcpu::new();
        let before = v.x;
        let mut io = FakeIo::default();
        run(&mut v, &mut io, esr, 0);
        assert_eq!(v.x, before);
        assert_eq!(v.sys[&ESR_EL1], 0x0200_0000, "EC 0, IL 1");
        assert_eq!(v.sys[&ELR_EL1], PC);
        assert_eq!(v.pc, VBAR + 0x200);
        assert!(!v.sys.contains_key(&FAR_EL1));
    }
}

#[test]
fn local_sysregs() {
    let exit = |esr| exception(esr, 0);
    let mut v = FakeVcpu::new();
    let mut io = FakeIo::default();
    let mut local = LocalState::default();
    let mut go = |v: &mut FakeVcpu, esr| {
        let e = exit(esr);
        let a = guest(decide(&e, RAM, false));
        complete(v, &mut io, &e, a, &mut local, &virtual_count).unwrap()
    };
    v.x[1] = 5;
    go(&mut v, MRS_X1_OSLSR);
    assert_eq!(v.x[1], 0b1010, "OSLM=0b10, locked at reset");
    v.x[0] = 0;
    go(&mut v, MSR_OSLAR_X0);
    go(&mut v, MRS_X1_OSLSR);
    assert_eq!(v.x[1], 0b1000, "unlocked");
    go(&mut v, MRS_X0_CNTPCT);
    assert_eq!(v.x[0], 50_000, "CNTPCT_EL0 reads the virtual count");
    v.x[2] = 7;
    go(&mut v, MRS_X2_PMCR);
    assert_eq!(v.x[2], 0);
    go(&mut v, MSR_PMUSERENR_XZR);
    assert_eq!(v.pc, PC + 24, "six instructions completed");
    go(&mut v, MRS_X1_OSLAR);
    assert_eq!(
        v.pc,
        VBAR + 0x200,
        "reading a write-only register is UNDEFINED"
    );
    assert!(io.calls.is_empty(), "none of these reach the VMM");
}

#[test]
fn the_vmm_reads_and_resets_the_os_lock() {
    let mut local = LocalState::default();
    assert_eq!(local.oslsr(), 0b1010, "locked at reset");
    local.set_oslsr(0b1000);
    assert_eq!((local.os_lock, local.oslsr()), (false, 0b1000));
    local.set_oslsr(0b1010);
    assert_eq!(local, LocalState::default());
}

#[test]
fn calls_and_waits_leave_pc_past_the_instruction() {
    for (esr, exit, advance) in [
        (HVC_0, VcpuExit::Hvc { imm: 0 }, 0),
        (SMC_0, VcpuExit::Smc { imm: 0 }, 4),
        (WFI, VcpuExit::Wfi, 4),
        (WFE, VcpuExit::Wfe, 4),
        (WFIT_X7, VcpuExit::Wfe, 4),
    ] {
        let mut v = FakeVcpu::new();
        // HVF reports HVC with PC already past it (preferred return
        // address of HVC is the next instruction), SMC and WFx at them.
        let mut io = FakeIo::default();
        assert_eq!(run(&mut v, &mut io, esr, 0), Step::Exit(exit));
        assert_eq!(v.pc, PC + advance, "{esr:#x}");
    }
    let mut v = FakeVcpu::new();
    let mut io = FakeIo::default();
    assert_eq!(run(&mut v, &mut io, DC_CIVAC_MMIO, UART), Step::Resume);
    assert_eq!(v.pc, PC + 4);
    assert_eq!(
        run(&mut v, &mut io, LDP_NO_ISV, UART),
        Step::Exit(VcpuExit::Unhandled {
            esr: LDP_NO_ISV,
            far: 0xffff_0000_0900_0018,
            ipa: UART,
            pc: PC + 4,
        })
    );
    assert!(io.calls.is_empty());
}

// ---- injected exceptions ----

#[test]
fn external_abort_syndrome() {
    // External abort from EL0 uses EC 0x24 and keeps FAR.
    let da = match esr::decode(STR_W3) {
        Syndrome::DataAbort(d) => d,
        _ => unreachable!(),
    };
    let sea = external_abort(&da, 0x1234, 0);
    assert_eq!(sea.esr, 0x9200_0050);
    assert_eq!(sea.far, Some(0x1234));
    assert_eq!(
        FaultStatus((sea.esr & 0x3f) as u8).kind(),
        FaultKind::SyncExternal
    );
    assert_eq!(current_el(0x3c5), 1);
    assert_eq!(current_el(0x10), 0);
}

// ---- completion helpers ----

fn da(esr: u64) -> DataAbort {
    match esr::decode(esr) {
        Syndrome::DataAbort(d) => d,
        other => panic!("{esr:#x} decoded as {other:?}"),
    }
}

/// A fake vCPU at a low PC (the MMU-off kernel entry).
fn fake() -> FakeVcpu {
    FakeVcpu {
        pc: 0x4008_0000,
        ..FakeVcpu::new()
    }
}

fn load(size: u8, sse: bool, sf: bool, srt: u8) -> DataAbort {
    let mut d = da(LDR_W1);
    d.size = size;
    d.sse = sse;
    d.sf = sf;
    d.srt = srt;
    d
}

/// The architectural result, computed with Rust's integer casts.
fn reference(bytes: &[u8], sse: bool, sf: bool) -> u64 {
    let mut b = [0u8; 8];
    b[..bytes.len()].copy_from_slice(bytes);
    let raw = u64::from_le_bytes(b);
    let v = match (bytes.len(), sse) {
        (1, true) => raw as u8 as i8 as i64 as u64,
        (2, true) => raw as u16 as i16 as i64 as u64,
        (4, true) => raw as u32 as i32 as i64 as u64,
        _ => raw,
    };
    if sf {
        v
    } else {
        v as u32 as u64
    }
}

#[test]
fn mmio_read_every_size_sign_and_width() {
    let patterns: [&[u8]; 8] = [
        &[0x7f],
        &[0x80],
        &[0xff, 0x7f],
        &[0x00, 0x80],
        &[0x78, 0x56, 0x34, 0x12],
        &[0x00, 0x00, 0x00, 0x80],
        &[1, 2, 3, 4, 5, 6, 7, 8],
        &[0xf0, 0xde, 0xbc, 0x9a, 0x78, 0x56, 0x34, 0xf2],
    ];
    for data in patterns {
        let size = data.len() as u8;
        for sse in [false, true] {
            for sf in [false, true] {
                for rt in [0u8, 7, 30, 31] {
                    let mut v = fake();
                    let before = v.x;
                    complete_mmio_read(&mut v, &load(size, sse, sf, rt), data).unwrap();
                    assert_eq!(v.pc, 0x4008_0004);
                    let mut expected = before;
                    if rt < 31 {
                        expected[usize::from(rt)] = reference(data, sse, sf);
                    }
                    assert_eq!(v.x, expected, "{data:x?} sse={sse} sf={sf} rt={rt}");
                }
            }
        }
    }
}

#[test]
fn mmio_read_rejects_bad_completions() {
    let mut v = fake();
    let before = (v.x, v.pc);
    let mut no_isv = load(4, false, false, 1);
    no_isv.isv = false;
    assert!(complete_mmio_read(&mut v, &no_isv, &[0; 4]).is_err());
    assert!(complete_mmio_read(&mut v, &load(4, false, false, 1), &[0; 2]).is_err());
    assert!(complete_mmio_read(&mut v, &load(16, false, true, 1), &[0; 16]).is_err());
    assert!(complete_mmio_read(&mut v, &load(3, false, true, 1), &[0; 3]).is_err());
    assert!(complete_mmio_read(&mut v, &da(STRB_W3), &[0; 1]).is_err());
    assert_eq!((v.x, v.pc), before);
    v.fail_writes = true;
    assert!(complete_mmio_read(&mut v, &load(4, false, false, 1), &[0; 4]).is_err());
}

#[test]
fn mmio_write_truncates_and_reads_xzr_as_zero() {
    let mut v = fake();
    v.x[3] = 0x1122_3344_5566_7788;
    let mut st = da(STRB_W3);
    for (size, expected) in [
        (1u8, &[0x88u8][..]),
        (2, &[0x88, 0x77]),
        (4, &[0x88, 0x77, 0x66, 0x55]),
        (8, &[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]),
    ] {
        st.size = size;
        let w = mmio_write_value(&mut v, &st).unwrap();
        assert_eq!(w.bytes(), expected);
        assert_eq!(w.value().to_le_bytes()[..usize::from(size)], *expected);
    }
    st.srt = 31;
    let w = mmio_write_value(&mut v, &st).unwrap();
    assert_eq!(w.bytes(), &[0u8; 8]);
    assert_eq!(v.pc, 0x4008_0000, "reading the value must not move PC");
    complete_mmio_write(&mut v, &st).unwrap();
    assert_eq!(v.pc, 0x4008_0004);
    // A 16-bit T32 instruction (IL=0) advances by 2.
    st.il = false;
    complete_mmio_write(&mut v, &st).unwrap();
    assert_eq!(v.pc, 0x4008_0006);

    assert!(mmio_write_value(&mut v, &da(LDR_W1)).is_err());
    assert!(complete_mmio_write(&mut v, &da(LDR_W1)).is_err());
    st.size = 9;
    assert!(mmio_write_value(&mut v, &st).is_err());
    st.size = 4;
    st.isv = false;
    assert!(mmio_write_value(&mut v, &st).is_err());
}

#[test]
fn sysreg_completion() {
    let Syndrome::SysReg(mrs) = esr::decode(MRS_X5_IAR1) else {
        unreachable!()
    };
    let Syndrome::SysReg(msr) = esr::decode(MSR_EOIR1_X3) else {
        unreachable!()
    };
    let mut v = fake();
    v.x[3] = 27;
    assert_eq!(sysreg_write_value(&mut v, &msr).unwrap(), 27);
    assert!(sysreg_write_value(&mut v, &mrs).is_err());
    complete_sysreg_read(&mut v, &mrs, 0x1b).unwrap();
    assert_eq!((v.x[5], v.pc), (0x1b, 0x4008_0004));
    assert!(complete_sysreg_read(&mut v, &msr, 0).is_err());
    let xzr = SysRegAccess { rt: 31, ..mrs };
    let before = v.x;
    complete_sysreg_read(&mut v, &xzr, 5).unwrap();
    assert_eq!(v.x, before);
    assert_eq!(read_xt(&mut v, 31).unwrap(), 0);
    assert!(read_xt(&mut v, 32).is_err());
    assert!(write_xt(&mut v, 255, 0).is_err());
}

#[test]
fn a_write_fault_repeating_on_the_same_page_stops_the_vcpu() {
    let page = RAM_BASE + 3 * PAGE_SIZE;
    let far = 0xffff_8000_0123_4008;
    let mut g = WriteFaultGuard::default();
    assert!(g.write_fault(far, page).is_ok());
    // The same access on the page just made writable: no progress.
    let e = g.write_fault(far, page).unwrap_err().to_string();
    assert!(e.contains("FAR 0xffff800001234008"), "{e}");
    assert!(e.contains(&format!("IPA page {page:#x}")), "{e}");
    assert!(e.contains("HPFAR_EL2 UNKNOWN"), "{e}");

    // Progress in between (another exit), another page or another access:
    // each fault is handled.
    let mut g = WriteFaultGuard::default();
    g.write_fault(far, page).unwrap();
    g.progress();
    g.write_fault(far, page).unwrap();
    g.write_fault(far, page + PAGE_SIZE).unwrap();
    g.write_fault(far + 8, page + PAGE_SIZE).unwrap();
    // A store whose stage-1 walk faults first (the table's page), then the
    // data page: same FAR, two pages.
    let mut g = WriteFaultGuard::default();
    g.write_fault(far, RAM_BASE).unwrap();
    g.write_fault(far, page).unwrap();
}
