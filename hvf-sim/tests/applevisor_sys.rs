//! Where applevisor-sys 1.0 (the binding the backend's VM and stage-2 calls
//! use) disagrees with Apple's headers as the simulator transcribes them
//! (`hvf_sim::apple`). The test prints the list and fails if it changes, so
//! a new applevisor-sys (or a transcription error here) is looked at.
#![cfg(not(target_os = "macos"))]

use applevisor_sys as sys;
use hvf_sim::apple;

macro_rules! sys_regs {
    ($($name:ident),* $(,)?) => {
        [$((stringify!($name), sys::hv_sys_reg_t::$name as u16)),*]
    };
}

/// Every disagreement found, one line each.
fn disagreements() -> Vec<String> {
    let mut out = Vec::new();
    let mut cmp = |what: &str, theirs: u64, apples: u64| {
        if theirs != apples {
            out.push(format!(
                "{what}: applevisor-sys {theirs:#x}, Apple {apples:#x}"
            ));
        }
    };

    // hv_error.h
    for (name, theirs, apples) in [
        (
            "HV_SUCCESS",
            sys::hv_error_t::HV_SUCCESS as u32,
            apple::HV_SUCCESS,
        ),
        (
            "HV_ERROR",
            sys::hv_error_t::HV_ERROR as u32,
            apple::HV_ERROR,
        ),
        ("HV_BUSY", sys::hv_error_t::HV_BUSY as u32, apple::HV_BUSY),
        (
            "HV_BAD_ARGUMENT",
            sys::hv_error_t::HV_BAD_ARGUMENT as u32,
            apple::HV_BAD_ARGUMENT,
        ),
        (
            "HV_ILLEGAL_GUEST_STATE",
            sys::hv_error_t::HV_ILLEGAL_GUEST_STATE as u32,
            apple::HV_ILLEGAL_GUEST_STATE,
        ),
        (
            "HV_NO_RESOURCES",
            sys::hv_error_t::HV_NO_RESOURCES as u32,
            apple::HV_NO_RESOURCES,
        ),
        (
            "HV_NO_DEVICE",
            sys::hv_error_t::HV_NO_DEVICE as u32,
            apple::HV_NO_DEVICE,
        ),
        (
            "HV_DENIED",
            sys::hv_error_t::HV_DENIED as u32,
            apple::HV_DENIED,
        ),
        (
            "HV_UNSUPPORTED",
            sys::hv_error_t::HV_UNSUPPORTED as u32,
            apple::HV_UNSUPPORTED,
        ),
    ] {
        cmp(name, u64::from(theirs), u64::from(apples as u32));
    }

    // hv_types.h
    cmp("HV_MEMORY_READ", sys::HV_MEMORY_READ, apple::HV_MEMORY_READ);
    cmp(
        "HV_MEMORY_WRITE",
        sys::HV_MEMORY_WRITE,
        apple::HV_MEMORY_WRITE,
    );
    cmp("HV_MEMORY_EXEC", sys::HV_MEMORY_EXEC, apple::HV_MEMORY_EXEC);
    cmp(
        "stage-2 page size",
        sys::PAGE_SIZE as u64,
        apple::STAGE2_PAGE,
    );

    // hv_vcpu_types.h
    let xs = [
        sys::hv_reg_t::X0,
        sys::hv_reg_t::X1,
        sys::hv_reg_t::X2,
        sys::hv_reg_t::X3,
        sys::hv_reg_t::X4,
        sys::hv_reg_t::X5,
        sys::hv_reg_t::X6,
        sys::hv_reg_t::X7,
        sys::hv_reg_t::X8,
        sys::hv_reg_t::X9,
        sys::hv_reg_t::X10,
        sys::hv_reg_t::X11,
        sys::hv_reg_t::X12,
        sys::hv_reg_t::X13,
        sys::hv_reg_t::X14,
        sys::hv_reg_t::X15,
        sys::hv_reg_t::X16,
        sys::hv_reg_t::X17,
        sys::hv_reg_t::X18,
        sys::hv_reg_t::X19,
        sys::hv_reg_t::X20,
        sys::hv_reg_t::X21,
        sys::hv_reg_t::X22,
        sys::hv_reg_t::X23,
        sys::hv_reg_t::X24,
        sys::hv_reg_t::X25,
        sys::hv_reg_t::X26,
        sys::hv_reg_t::X27,
        sys::hv_reg_t::X28,
        sys::hv_reg_t::X29,
        sys::hv_reg_t::X30,
    ];
    for (n, r) in xs.into_iter().enumerate() {
        cmp(
            &format!("HV_REG_X{n}"),
            r as u64,
            u64::from(apple::HV_REG_X0) + n as u64,
        );
    }
    cmp(
        "HV_REG_PC",
        sys::hv_reg_t::PC as u64,
        apple::HV_REG_PC.into(),
    );
    cmp(
        "HV_REG_FPCR",
        sys::hv_reg_t::FPCR as u64,
        apple::HV_REG_FPCR.into(),
    );
    cmp(
        "HV_REG_FPSR",
        sys::hv_reg_t::FPSR as u64,
        apple::HV_REG_FPSR.into(),
    );
    cmp(
        "HV_REG_CPSR",
        sys::hv_reg_t::CPSR as u64,
        apple::HV_REG_CPSR.into(),
    );
    let qs = [
        sys::hv_simd_fp_reg_t::Q0,
        sys::hv_simd_fp_reg_t::Q1,
        sys::hv_simd_fp_reg_t::Q2,
        sys::hv_simd_fp_reg_t::Q3,
        sys::hv_simd_fp_reg_t::Q4,
        sys::hv_simd_fp_reg_t::Q5,
        sys::hv_simd_fp_reg_t::Q6,
        sys::hv_simd_fp_reg_t::Q7,
        sys::hv_simd_fp_reg_t::Q8,
        sys::hv_simd_fp_reg_t::Q9,
        sys::hv_simd_fp_reg_t::Q10,
        sys::hv_simd_fp_reg_t::Q11,
        sys::hv_simd_fp_reg_t::Q12,
        sys::hv_simd_fp_reg_t::Q13,
        sys::hv_simd_fp_reg_t::Q14,
        sys::hv_simd_fp_reg_t::Q15,
        sys::hv_simd_fp_reg_t::Q16,
        sys::hv_simd_fp_reg_t::Q17,
        sys::hv_simd_fp_reg_t::Q18,
        sys::hv_simd_fp_reg_t::Q19,
        sys::hv_simd_fp_reg_t::Q20,
        sys::hv_simd_fp_reg_t::Q21,
        sys::hv_simd_fp_reg_t::Q22,
        sys::hv_simd_fp_reg_t::Q23,
        sys::hv_simd_fp_reg_t::Q24,
        sys::hv_simd_fp_reg_t::Q25,
        sys::hv_simd_fp_reg_t::Q26,
        sys::hv_simd_fp_reg_t::Q27,
        sys::hv_simd_fp_reg_t::Q28,
        sys::hv_simd_fp_reg_t::Q29,
        sys::hv_simd_fp_reg_t::Q30,
        sys::hv_simd_fp_reg_t::Q31,
    ];
    assert_eq!(qs.len() as u32, apple::HV_SIMD_FP_REG_COUNT);
    for (n, q) in qs.into_iter().enumerate() {
        cmp(&format!("HV_SIMD_FP_REG_Q{n}"), q as u64, n as u64);
    }
    cmp(
        "HV_INTERRUPT_TYPE_IRQ",
        sys::hv_interrupt_type_t::IRQ as u64,
        apple::HV_INTERRUPT_TYPE_IRQ.into(),
    );
    cmp(
        "HV_INTERRUPT_TYPE_FIQ",
        sys::hv_interrupt_type_t::FIQ as u64,
        apple::HV_INTERRUPT_TYPE_FIQ.into(),
    );
    for (name, theirs, apples) in [
        (
            "HV_EXIT_REASON_CANCELED",
            sys::hv_exit_reason_t::CANCELED,
            apple::HV_EXIT_REASON_CANCELED,
        ),
        (
            "HV_EXIT_REASON_EXCEPTION",
            sys::hv_exit_reason_t::EXCEPTION,
            apple::HV_EXIT_REASON_EXCEPTION,
        ),
        (
            "HV_EXIT_REASON_VTIMER_ACTIVATED",
            sys::hv_exit_reason_t::VTIMER_ACTIVATED,
            apple::HV_EXIT_REASON_VTIMER_ACTIVATED,
        ),
        (
            "HV_EXIT_REASON_UNKNOWN",
            sys::hv_exit_reason_t::UNKNOWN,
            apple::HV_EXIT_REASON_UNKNOWN,
        ),
    ] {
        cmp(name, theirs as u64, apples.into());
    }
    let theirs = sys_regs!(
        DBGBVR0_EL1,
        DBGBCR0_EL1,
        DBGWVR0_EL1,
        DBGWCR0_EL1,
        DBGBVR1_EL1,
        DBGBCR1_EL1,
        DBGWVR1_EL1,
        DBGWCR1_EL1,
        MDCCINT_EL1,
        MDSCR_EL1,
        DBGBVR2_EL1,
        DBGBCR2_EL1,
        DBGWVR2_EL1,
        DBGWCR2_EL1,
        DBGBVR3_EL1,
        DBGBCR3_EL1,
        DBGWVR3_EL1,
        DBGWCR3_EL1,
        DBGBVR4_EL1,
        DBGBCR4_EL1,
        DBGWVR4_EL1,
        DBGWCR4_EL1,
        DBGBVR5_EL1,
        DBGBCR5_EL1,
        DBGWVR5_EL1,
        DBGWCR5_EL1,
        DBGBVR6_EL1,
        DBGBCR6_EL1,
        DBGWVR6_EL1,
        DBGWCR6_EL1,
        DBGBVR7_EL1,
        DBGBCR7_EL1,
        DBGWVR7_EL1,
        DBGWCR7_EL1,
        DBGBVR8_EL1,
        DBGBCR8_EL1,
        DBGWVR8_EL1,
        DBGWCR8_EL1,
        DBGBVR9_EL1,
        DBGBCR9_EL1,
        DBGWVR9_EL1,
        DBGWCR9_EL1,
        DBGBVR10_EL1,
        DBGBCR10_EL1,
        DBGWVR10_EL1,
        DBGWCR10_EL1,
        DBGBVR11_EL1,
        DBGBCR11_EL1,
        DBGWVR11_EL1,
        DBGWCR11_EL1,
        DBGBVR12_EL1,
        DBGBCR12_EL1,
        DBGWVR12_EL1,
        DBGWCR12_EL1,
        DBGBVR13_EL1,
        DBGBCR13_EL1,
        DBGWVR13_EL1,
        DBGWCR13_EL1,
        DBGBVR14_EL1,
        DBGBCR14_EL1,
        DBGWVR14_EL1,
        DBGWCR14_EL1,
        DBGBVR15_EL1,
        DBGBCR15_EL1,
        DBGWVR15_EL1,
        DBGWCR15_EL1,
        MIDR_EL1,
        MPIDR_EL1,
        ID_AA64PFR0_EL1,
        ID_AA64PFR1_EL1,
        ID_AA64DFR0_EL1,
        ID_AA64DFR1_EL1,
        ID_AA64ISAR0_EL1,
        ID_AA64ISAR1_EL1,
        ID_AA64MMFR0_EL1,
        ID_AA64MMFR1_EL1,
        ID_AA64MMFR2_EL1,
        SCTLR_EL1,
        CPACR_EL1,
        TTBR0_EL1,
        TTBR1_EL1,
        TCR_EL1,
        APIAKEYLO_EL1,
        APIAKEYHI_EL1,
        APIBKEYLO_EL1,
        APIBKEYHI_EL1,
        APDAKEYLO_EL1,
        APDAKEYHI_EL1,
        APDBKEYLO_EL1,
        APDBKEYHI_EL1,
        APGAKEYLO_EL1,
        APGAKEYHI_EL1,
        SPSR_EL1,
        ELR_EL1,
        SP_EL0,
        AFSR0_EL1,
        AFSR1_EL1,
        ESR_EL1,
        FAR_EL1,
        PAR_EL1,
        MAIR_EL1,
        AMAIR_EL1,
        VBAR_EL1,
        CONTEXTIDR_EL1,
        TPIDR_EL1,
        CNTKCTL_EL1,
        CSSELR_EL1,
        TPIDR_EL0,
        TPIDRRO_EL0,
        CNTV_CTL_EL0,
        CNTV_CVAL_EL0,
        SP_EL1,
    );
    assert_eq!(theirs.len(), apple::HV_SYS_REGS.len());
    for ((name, theirs), &(apple_name, apples)) in theirs.into_iter().zip(apple::HV_SYS_REGS) {
        assert_eq!(name, apple_name);
        cmp(&format!("HV_SYS_REG_{name}"), theirs.into(), apples.into());
    }

    // hv_vcpu_exit_t: same layout; what the framework writes must be read
    // as integers.
    cmp(
        "sizeof(hv_vcpu_exit_t)",
        std::mem::size_of::<sys::hv_vcpu_exit_t>() as u64,
        std::mem::size_of::<apple::HvVcpuExit>() as u64,
    );
    cmp(
        "offsetof(hv_vcpu_exit_t, exception)",
        std::mem::offset_of!(sys::hv_vcpu_exit_t, exception) as u64,
        std::mem::offset_of!(apple::HvVcpuExit, syndrome) as u64,
    );
    let mut types = |what: &str, theirs: &str, apples: &str| {
        if theirs != apples {
            out.push(format!("{what}: applevisor-sys `{theirs}`, Apple {apples}"));
        }
    };
    let short = |name: &'static str| name.rsplit("::").next().unwrap_or(name);
    types(
        "hv_vcpu_exit_t.reason",
        short(std::any::type_name::<sys::hv_exit_reason_t>()),
        "u32",
    );
    // The vector argument of hv_vcpu_set_simd_fp_reg: an integer goes in
    // x2:x3, a short vector in v0 (AAPCS64).
    types(
        "hv_simd_fp_uchar16_t (by value: hv_vcpu_set_simd_fp_reg's argument)",
        short(std::any::type_name::<sys::hv_simd_fp_uchar16_t>()),
        "a 16-byte vector",
    );
    out
}

#[test]
fn applevisor_sys_disagrees_with_apple_only_where_known() {
    let found = disagreements();
    println!("applevisor-sys 1.0 vs Apple's headers:");
    for d in &found {
        println!("  {d}");
    }
    assert_eq!(
        found,
        [
            "HV_INTERRUPT_TYPE_IRQ: applevisor-sys 0x1, Apple 0x0",
            "HV_INTERRUPT_TYPE_FIQ: applevisor-sys 0x0, Apple 0x1",
            "hv_vcpu_exit_t.reason: applevisor-sys `hv_exit_reason_t`, Apple u32",
            "hv_simd_fp_uchar16_t (by value: hv_vcpu_set_simd_fp_reg's argument): \
             applevisor-sys `u128`, Apple a 16-byte vector",
        ]
    );
}
