//! Hypervisor.framework's C interface as far as the simulator implements it:
//! types, values and layouts, each from Apple's headers (Xcode SDK,
//! `Hypervisor.framework/Headers/`) or Apple's developer documentation where
//! the header gives no more. Nothing here comes from applevisor-sys; the
//! self-test `tests/applevisor_sys.rs` lists where the two disagree.

/// `hv_return_t` (`hv_error.h`: a `mach_error_t`, i.e. a C `int`).
pub type HvReturn = i32;

// `hv_error.h`: the return codes, `err_sub(0xba5)` in `err_system(0x3e)`.
/// `HV_SUCCESS`.
pub const HV_SUCCESS: HvReturn = 0;
/// `HV_ERROR`: the operation failed.
pub const HV_ERROR: HvReturn = 0xfae9_4001_u32 as i32;
/// `HV_BUSY`: the resource is busy (a second VM in the process).
pub const HV_BUSY: HvReturn = 0xfae9_4002_u32 as i32;
/// `HV_BAD_ARGUMENT`: an argument is invalid.
pub const HV_BAD_ARGUMENT: HvReturn = 0xfae9_4003_u32 as i32;
/// `HV_ILLEGAL_GUEST_STATE`.
pub const HV_ILLEGAL_GUEST_STATE: HvReturn = 0xfae9_4004_u32 as i32;
/// `HV_NO_RESOURCES`.
pub const HV_NO_RESOURCES: HvReturn = 0xfae9_4005_u32 as i32;
/// `HV_NO_DEVICE`: no VM or vCPU.
pub const HV_NO_DEVICE: HvReturn = 0xfae9_4006_u32 as i32;
/// `HV_DENIED`: the process lacks the entitlement.
pub const HV_DENIED: HvReturn = 0xfae9_4007_u32 as i32;
/// `HV_UNSUPPORTED`: the host lacks the feature.
pub const HV_UNSUPPORTED: HvReturn = 0xfae9_400f_u32 as i32;

// `hv_types.h`: `hv_memory_flags_t` (a `uint64_t`) for `hv_vm_map` and
// `hv_vm_protect`.
/// `HV_MEMORY_READ`.
pub const HV_MEMORY_READ: u64 = 1 << 0;
/// `HV_MEMORY_WRITE`.
pub const HV_MEMORY_WRITE: u64 = 1 << 1;
/// `HV_MEMORY_EXEC`.
pub const HV_MEMORY_EXEC: u64 = 1 << 2;

/// The stage-2 granule of Apple Silicon (16 KiB): `hv_vm_map`,
/// `hv_vm_unmap` and `hv_vm_protect` take IPAs and sizes in whole pages of
/// it (`hv_vm.h`: "page aligned", "a multiple of the page size").
pub const STAGE2_PAGE: u64 = 16 * 1024;

// `hv_vcpu_types.h`: `hv_reg_t` (`OS_ENUM(hv_reg, uint32_t, ...)`).
/// `HV_REG_X0`; `HV_REG_X<n>` is `n` for `n` in 0..=30.
pub const HV_REG_X0: u32 = 0;
/// `HV_REG_PC`.
pub const HV_REG_PC: u32 = 31;
/// `HV_REG_FPCR`.
pub const HV_REG_FPCR: u32 = 32;
/// `HV_REG_FPSR`.
pub const HV_REG_FPSR: u32 = 33;
/// `HV_REG_CPSR`.
pub const HV_REG_CPSR: u32 = 34;

/// `hv_simd_fp_reg_t` (`uint32_t`): `HV_SIMD_FP_REG_Q<n>` is `n`, `n` in
/// 0..=31.
pub const HV_SIMD_FP_REG_COUNT: u32 = 32;

// `hv_vcpu_types.h`: `hv_interrupt_type_t` (`uint32_t`), in this order.
/// `HV_INTERRUPT_TYPE_IRQ`.
pub const HV_INTERRUPT_TYPE_IRQ: u32 = 0;
/// `HV_INTERRUPT_TYPE_FIQ`.
pub const HV_INTERRUPT_TYPE_FIQ: u32 = 1;

// `hv_vcpu_types.h`: `hv_exit_reason_t` (`uint32_t`).
/// `HV_EXIT_REASON_CANCELED`: `hv_vcpus_exit`.
pub const HV_EXIT_REASON_CANCELED: u32 = 0;
/// `HV_EXIT_REASON_EXCEPTION`: a synchronous exception to EL2.
pub const HV_EXIT_REASON_EXCEPTION: u32 = 1;
/// `HV_EXIT_REASON_VTIMER_ACTIVATED`: the virtual timer fired; the
/// framework masks it (`hv_vcpu_set_vtimer_mask`).
pub const HV_EXIT_REASON_VTIMER_ACTIVATED: u32 = 2;
/// `HV_EXIT_REASON_UNKNOWN`.
pub const HV_EXIT_REASON_UNKNOWN: u32 = 3;

/// `hv_vcpu_exit_t` (`hv_vcpu_types.h`): the reason, then
/// `hv_vcpu_exit_exception_t` (three `uint64_t`, so 4 bytes of padding
/// after the reason).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HvVcpuExit {
    /// `reason` (`hv_exit_reason_t`).
    pub reason: u32,
    /// `exception.syndrome` (`hv_exception_syndrome_t`: ESR_EL2).
    pub syndrome: u64,
    /// `exception.virtual_address` (`hv_exception_address_t`: FAR_EL2).
    pub virtual_address: u64,
    /// `exception.physical_address` (`hv_ipa_t`).
    pub physical_address: u64,
}

const _: () = {
    assert!(std::mem::size_of::<HvVcpuExit>() == 32);
    assert!(std::mem::offset_of!(HvVcpuExit, syndrome) == 8);
    assert!(std::mem::offset_of!(HvVcpuExit, virtual_address) == 16);
    assert!(std::mem::offset_of!(HvVcpuExit, physical_address) == 24);
};

/// `hv_vcpu_sme_state_t` (`hv_vcpu_types.h`, macOS 15.2): two C `bool`s.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HvVcpuSmeState {
    /// `streaming_sve_mode_enabled` (PSTATE.SM).
    pub streaming_sve_mode_enabled: bool,
    /// `za_storage_enabled` (PSTATE.ZA).
    pub za_storage_enabled: bool,
}

/// `hv_sys_reg_t` (`hv_vcpu_types.h`, `OS_ENUM(hv_sys_reg, uint16_t, ...)`):
/// the registers `hv_vcpu_get_sys_reg`/`hv_vcpu_set_sys_reg` take as of
/// macOS 11, with their values (the architectural op0:op1:CRn:CRm:op2
/// packing).
pub const HV_SYS_REGS: &[(&str, u16)] = &[
    ("DBGBVR0_EL1", 0x8004),
    ("DBGBCR0_EL1", 0x8005),
    ("DBGWVR0_EL1", 0x8006),
    ("DBGWCR0_EL1", 0x8007),
    ("DBGBVR1_EL1", 0x800c),
    ("DBGBCR1_EL1", 0x800d),
    ("DBGWVR1_EL1", 0x800e),
    ("DBGWCR1_EL1", 0x800f),
    ("MDCCINT_EL1", 0x8010),
    ("MDSCR_EL1", 0x8012),
    ("DBGBVR2_EL1", 0x8014),
    ("DBGBCR2_EL1", 0x8015),
    ("DBGWVR2_EL1", 0x8016),
    ("DBGWCR2_EL1", 0x8017),
    ("DBGBVR3_EL1", 0x801c),
    ("DBGBCR3_EL1", 0x801d),
    ("DBGWVR3_EL1", 0x801e),
    ("DBGWCR3_EL1", 0x801f),
    ("DBGBVR4_EL1", 0x8024),
    ("DBGBCR4_EL1", 0x8025),
    ("DBGWVR4_EL1", 0x8026),
    ("DBGWCR4_EL1", 0x8027),
    ("DBGBVR5_EL1", 0x802c),
    ("DBGBCR5_EL1", 0x802d),
    ("DBGWVR5_EL1", 0x802e),
    ("DBGWCR5_EL1", 0x802f),
    ("DBGBVR6_EL1", 0x8034),
    ("DBGBCR6_EL1", 0x8035),
    ("DBGWVR6_EL1", 0x8036),
    ("DBGWCR6_EL1", 0x8037),
    ("DBGBVR7_EL1", 0x803c),
    ("DBGBCR7_EL1", 0x803d),
    ("DBGWVR7_EL1", 0x803e),
    ("DBGWCR7_EL1", 0x803f),
    ("DBGBVR8_EL1", 0x8044),
    ("DBGBCR8_EL1", 0x8045),
    ("DBGWVR8_EL1", 0x8046),
    ("DBGWCR8_EL1", 0x8047),
    ("DBGBVR9_EL1", 0x804c),
    ("DBGBCR9_EL1", 0x804d),
    ("DBGWVR9_EL1", 0x804e),
    ("DBGWCR9_EL1", 0x804f),
    ("DBGBVR10_EL1", 0x8054),
    ("DBGBCR10_EL1", 0x8055),
    ("DBGWVR10_EL1", 0x8056),
    ("DBGWCR10_EL1", 0x8057),
    ("DBGBVR11_EL1", 0x805c),
    ("DBGBCR11_EL1", 0x805d),
    ("DBGWVR11_EL1", 0x805e),
    ("DBGWCR11_EL1", 0x805f),
    ("DBGBVR12_EL1", 0x8064),
    ("DBGBCR12_EL1", 0x8065),
    ("DBGWVR12_EL1", 0x8066),
    ("DBGWCR12_EL1", 0x8067),
    ("DBGBVR13_EL1", 0x806c),
    ("DBGBCR13_EL1", 0x806d),
    ("DBGWVR13_EL1", 0x806e),
    ("DBGWCR13_EL1", 0x806f),
    ("DBGBVR14_EL1", 0x8074),
    ("DBGBCR14_EL1", 0x8075),
    ("DBGWVR14_EL1", 0x8076),
    ("DBGWCR14_EL1", 0x8077),
    ("DBGBVR15_EL1", 0x807c),
    ("DBGBCR15_EL1", 0x807d),
    ("DBGWVR15_EL1", 0x807e),
    ("DBGWCR15_EL1", 0x807f),
    ("MIDR_EL1", 0xc000),
    ("MPIDR_EL1", 0xc005),
    ("ID_AA64PFR0_EL1", 0xc020),
    ("ID_AA64PFR1_EL1", 0xc021),
    ("ID_AA64DFR0_EL1", 0xc028),
    ("ID_AA64DFR1_EL1", 0xc029),
    ("ID_AA64ISAR0_EL1", 0xc030),
    ("ID_AA64ISAR1_EL1", 0xc031),
    ("ID_AA64MMFR0_EL1", 0xc038),
    ("ID_AA64MMFR1_EL1", 0xc039),
    ("ID_AA64MMFR2_EL1", 0xc03a),
    ("SCTLR_EL1", 0xc080),
    ("CPACR_EL1", 0xc082),
    ("TTBR0_EL1", 0xc100),
    ("TTBR1_EL1", 0xc101),
    ("TCR_EL1", 0xc102),
    ("APIAKEYLO_EL1", 0xc108),
    ("APIAKEYHI_EL1", 0xc109),
    ("APIBKEYLO_EL1", 0xc10a),
    ("APIBKEYHI_EL1", 0xc10b),
    ("APDAKEYLO_EL1", 0xc110),
    ("APDAKEYHI_EL1", 0xc111),
    ("APDBKEYLO_EL1", 0xc112),
    ("APDBKEYHI_EL1", 0xc113),
    ("APGAKEYLO_EL1", 0xc118),
    ("APGAKEYHI_EL1", 0xc119),
    ("SPSR_EL1", 0xc200),
    ("ELR_EL1", 0xc201),
    ("SP_EL0", 0xc208),
    ("AFSR0_EL1", 0xc288),
    ("AFSR1_EL1", 0xc289),
    ("ESR_EL1", 0xc290),
    ("FAR_EL1", 0xc300),
    ("PAR_EL1", 0xc3a0),
    ("MAIR_EL1", 0xc510),
    ("AMAIR_EL1", 0xc518),
    ("VBAR_EL1", 0xc600),
    ("CONTEXTIDR_EL1", 0xc681),
    ("TPIDR_EL1", 0xc684),
    ("CNTKCTL_EL1", 0xc708),
    ("CSSELR_EL1", 0xd000),
    ("TPIDR_EL0", 0xde82),
    ("TPIDRRO_EL0", 0xde83),
    ("CNTV_CTL_EL0", 0xdf19),
    ("CNTV_CVAL_EL0", 0xdf1a),
    ("SP_EL1", 0xe208),
];

/// `HV_SYS_REG_CNTV_CTL_EL0`.
pub const HV_SYS_REG_CNTV_CTL_EL0: u16 = 0xdf19;
/// `HV_SYS_REG_CNTV_CVAL_EL0`.
pub const HV_SYS_REG_CNTV_CVAL_EL0: u16 = 0xdf1a;

/// Whether `reg` is an `hv_sys_reg_t` value of [`HV_SYS_REGS`].
pub fn is_hv_sys_reg(reg: u16) -> bool {
    HV_SYS_REGS.iter().any(|&(_, v)| v == reg)
}

/// `hv_gic_icc_reg_t` (`hv_gic_types.h`, macOS 15.0, `uint16_t`): the GIC
/// CPU-interface registers `hv_gic_get_icc_reg`/`hv_gic_set_icc_reg` take
/// (Apple's developer documentation lists exactly these; the values are
/// the registers' op0:op1:CRn:CRm:op2 packing, as for `hv_sys_reg_t`).
pub const HV_GIC_ICC_REGS: &[(&str, u16)] = &[
    ("PMR_EL1", 0xc230),
    ("BPR0_EL1", 0xc643),
    ("AP0R0_EL1", 0xc644),
    ("AP1R0_EL1", 0xc648),
    ("RPR_EL1", 0xc65b),
    ("BPR1_EL1", 0xc663),
    ("CTLR_EL1", 0xc664),
    ("SRE_EL1", 0xc665),
    ("IGRPEN0_EL1", 0xc666),
    ("IGRPEN1_EL1", 0xc667),
    ("SRE_EL2", 0xe64d),
];

/// `HV_GIC_ICC_REG_RPR_EL1`: read-only (the running priority).
pub const HV_GIC_ICC_REG_RPR_EL1: u16 = 0xc65b;
/// `HV_GIC_ICC_REG_SRE_EL2`: an EL2 register, which needs a VM with EL2
/// enabled (`hv_vm_config_set_el2_enabled`, which the backend never sets).
pub const HV_GIC_ICC_REG_SRE_EL2: u16 = 0xe64d;

/// The `sysctl` names the backend reads and what the simulator answers
/// (macOS `sysctlbyname`; `kern.hv_support` is a 32-bit integer,
/// `hw.tbfrequency` a 64-bit one).
pub const SYSCTL_HV_SUPPORT: &str = "kern.hv_support";
/// See [`SYSCTL_HV_SUPPORT`].
pub const SYSCTL_TBFREQUENCY: &str = "hw.tbfrequency";

/// `struct mach_timebase_info` (`mach/mach_time.h`): nanoseconds per tick
/// = `numer / denom`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MachTimebaseInfo {
    /// Numerator.
    pub numer: u32,
    /// Denominator.
    pub denom: u32,
}
