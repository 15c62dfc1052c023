use super::*;
use crate::arch::esr_vectors::*;
use crate::arch::sysreg::{ICC_EOIR1_EL1, ICC_IAR1_EL1};
fn da(esr: u64) -> DataAbort {
    match decode(esr) {
        Syndrome::DataAbort(d) => d,
        other => panic!("{esr:#x} decoded as {other:?}"),
    }
}

#[test]
fn decodes_ldr_w1() {
    let d = da(LDR_W1);
    assert!(d.isv && !d.wnr && !d.sse && !d.sf && !d.same_el && d.il);
    assert_eq!((d.size, d.srt), (4, 1));
    assert!(d.dfsc.is_translation_fault());
    assert_eq!(d.dfsc.level(), Some(2));
    assert_eq!(d.to_esr(), LDR_W1);
}

#[test]
fn decodes_strb_w3() {
    let d = da(STRB_W3);
    assert!(d.isv && d.wnr && !d.sf);
    assert_eq!((d.size, d.srt), (1, 3));
    assert_eq!(d.dfsc, FaultStatus::translation(3));
    assert_eq!(d.to_esr(), STRB_W3);
}

#[test]
fn decodes_ldrsh_x2() {
    let d = da(LDRSH_X2);
    assert!(d.isv && !d.wnr && d.sse && d.sf);
    assert_eq!((d.size, d.srt), (2, 2));
    assert_eq!(d.to_esr(), LDRSH_X2);
}

#[test]
fn decodes_isv_zero() {
    let d = da(LDP_NO_ISV);
    assert!(!d.isv);
    assert!(d.dfsc.is_translation_fault());
    assert_eq!(
        ExceptionClass::of(LDP_NO_ISV),
        ExceptionClass::DataAbortLower
    );
}

#[test]
fn decodes_permission_faults_with_wnr() {
    let d = da(STR_X1_PERM);
    assert!(d.isv && d.wnr && d.sf);
    assert_eq!((d.size, d.srt), (8, 1));
    assert!(d.dfsc.is_permission_fault() && !d.dfsc.is_translation_fault());
    assert_eq!(d.dfsc.level(), Some(3));

    let d = da(EL1_PERM_WRITE);
    assert!(d.same_el && !d.isv && d.wnr && d.dfsc.is_permission_fault());
    assert_eq!(
        data_abort_esr(true, true, FSC_PERMISSION | 3),
        EL1_PERM_WRITE
    );
}

#[test]
fn decodes_sysreg_traps() {
    let Syndrome::SysReg(w) = decode(MSR_EOIR1_X3) else {
        panic!("not a sysreg trap");
    };
    assert_eq!(
        w,
        SysRegAccess {
            reg: ICC_EOIR1_EL1,
            rt: 3,
            read: false
        }
    );
    assert_eq!(sysreg_esr(w), MSR_EOIR1_X3);

    let Syndrome::SysReg(r) = decode(MRS_X5_IAR1) else {
        panic!("not a sysreg trap");
    };
    assert_eq!(
        r,
        SysRegAccess {
            reg: ICC_IAR1_EL1,
            rt: 5,
            read: true
        }
    );
    assert_eq!(sysreg_esr(r), MRS_X5_IAR1);
}

#[test]
fn decodes_calls_and_wfx() {
    assert_eq!(decode(HVC_0), Syndrome::Hvc { imm: 0 });
    assert_eq!(decode(0x5A00_1234), Syndrome::Hvc { imm: 0x1234 });
    assert_eq!(decode(SVC_0), Syndrome::Svc { imm: 0 });
    assert_eq!(decode(0x5E00_0000), Syndrome::Smc { imm: 0 });
    assert_eq!(decode(BRK_BUG), Syndrome::Brk { imm: 0x800 });
    assert_eq!(
        decode(WFI),
        Syndrome::Wfx {
            wfe: false,
            timeout: false,
            rn: None
        }
    );
    assert_eq!(
        decode(WFE),
        Syndrome::Wfx {
            wfe: true,
            timeout: false,
            rn: None
        }
    );
    // WFIT x7: TI=0b10, RV=1, Rn=7.
    assert_eq!(
        decode(0x0600_0000 | 7 << 5 | 0b110),
        Syndrome::Wfx {
            wfe: false,
            timeout: true,
            rn: Some(7)
        }
    );
}

#[test]
fn decodes_other_classes() {
    assert_eq!(
        decode(UNDEF),
        Syndrome::Other {
            ec: ExceptionClass::Unknown,
            iss: 0,
            il: true
        }
    );
    let Syndrome::InstrAbort(i) = decode(IABT_EL1_L3) else {
        panic!("not an instruction abort");
    };
    assert!(i.same_el && i.ifsc.is_translation_fault());
    assert_eq!(i.ifsc.level(), Some(3));
    assert_eq!(ExceptionClass::of(0xBE00_0000), ExceptionClass::SError);
    // EC 0x3F is reserved; bits above 31 (ISS2) do not disturb decoding.
    assert_eq!(
        decode(0xFFFF_FFFF_FE00_0001),
        Syndrome::Other {
            ec: ExceptionClass::Other(0x3f),
            iss: 1,
            il: true
        }
    );
    for ec in 0..64u8 {
        assert_eq!(ExceptionClass::from_code(ec).code(), ec);
    }
}

#[test]
fn encoders_match_linux_reported_values() {
    assert_eq!(svc_esr(0), SVC_0);
    assert_eq!(hvc_esr(0), HVC_0);
    assert_eq!(smc_esr(0), 0x5E00_0000);
    assert_eq!(brk_esr(0x800), BRK_BUG);
    assert_eq!(unknown_esr(), UNDEF);
    assert_eq!(wfx_esr(false), WFI);
    assert_eq!(wfx_esr(true), WFE);
    assert_eq!(instr_abort_esr(true, FSC_TRANSLATION | 3), IABT_EL1_L3);
    // EL0 read of an unmapped page, as in Linux "esr 0x92000007".
    assert_eq!(
        data_abort_esr(false, false, FSC_TRANSLATION | 3),
        0x9200_0007
    );
    assert_eq!(data_abort_esr(true, false, FSC_SYNC_EXTERNAL), 0x9600_0010);
    assert_eq!(pc_align_esr(), 0x8A00_0000);
    assert_eq!(sp_align_esr(), 0x9A00_0000);
    // As the `emu` backend synthesises them.
    assert_eq!(unknown_esr(), 0x0200_0000);
    assert_eq!(svc_esr(0x1234), 0x5600_1234);
    assert_eq!(hvc_esr(5), 0x5a00_0005);
    assert_eq!(brk_esr(0x800), 0xf200_0800);
    // Data abort, same EL, translation fault level 3, write.
    assert_eq!(data_abort_esr(true, true, FSC_TRANSLATION + 3), 0x9600_0047);
    // Data abort from EL0, permission fault level 2, read.
    assert_eq!(
        data_abort_esr(false, false, FSC_PERMISSION + 2),
        0x9200_000e
    );
    // Instruction abort from EL0, access flag level 3.
    assert_eq!(instr_abort_esr(false, FSC_ACCESS_FLAG + 3), 0x8200_000b);
}

#[test]
fn fault_status_kinds_and_levels() {
    assert!(FaultStatus::access_flag(1).is_access_flag_fault());
    assert_eq!(FaultStatus::access_flag(1).level(), Some(1));
    assert_eq!(
        FaultStatus(FSC_SYNC_EXTERNAL).kind(),
        FaultKind::SyncExternal
    );
    assert_eq!(FaultStatus(FSC_SYNC_EXTERNAL).level(), None);
    assert_eq!(FaultStatus(0b01_0101).kind(), FaultKind::SyncExternalOnWalk);
    assert_eq!(FaultStatus(0b01_0101).level(), Some(1));
    assert_eq!(FaultStatus(0b10_1011).kind(), FaultKind::Translation);
    assert_eq!(FaultStatus(0b10_1011).level(), Some(-1));
    assert_eq!(FaultStatus(FSC_ALIGNMENT).kind(), FaultKind::Alignment);
    assert_eq!(FaultStatus(0b11_0000).kind(), FaultKind::TlbConflict);
    assert_eq!(FaultStatus(0b11_1111).kind(), FaultKind::Other);
    assert_eq!(
        FaultStatus::external_abort_on_walk(1),
        FaultStatus(0b01_0101)
    );
    assert_eq!(FaultStatus::address_size(2).kind(), FaultKind::AddressSize);
    assert_eq!(FaultStatus::address_size(2).level(), Some(2));
    // Masking, no panic.
    assert_eq!(FaultStatus::permission(7), FaultStatus::permission(3));
}

#[test]
fn extend_known_values() {
    // ldrsb w0 / ldrsb x0 / ldrb w0 of 0x80.
    assert_eq!(extend(0x80, 1, true, false), 0xffff_ff80);
    assert_eq!(extend(0x80, 1, true, true), 0xffff_ffff_ffff_ff80);
    assert_eq!(extend(0x80, 1, false, false), 0x80);
    // ldrh w0 ignores garbage above the access size.
    assert_eq!(extend(0xffff_8000, 2, false, false), 0x8000);
    // ldrsw x0.
    assert_eq!(extend(0x8000_0000, 4, true, true), 0xffff_ffff_8000_0000);
    // ldr w0 drops the upper half; ldr x0 keeps everything.
    assert_eq!(extend(u64::MAX, 4, false, false), 0xffff_ffff);
    assert_eq!(extend(u64::MAX, 8, true, true), u64::MAX);
    // Out-of-range sizes do not panic.
    assert_eq!(extend(u64::MAX, 0, true, true), 0);
    assert_eq!(extend(u64::MAX, 200, false, true), u64::MAX);
}
