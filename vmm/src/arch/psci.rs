//! PSCI 1.0 over the SMC Calling Convention 1.1, as a pure decision function.
//!
//! References: Arm DEN0022D (PSCI), Arm DEN0028 (SMCCC). The guest calls with
//! `HVC #0` (the FDT says `method = "hvc"`): function ID in W0, arguments in
//! X1..X3, result in X0. [`handle`] decides; the run loop acts on the returned
//! [`PsciAction`] and writes X0.
//!
//! Topology rule: vCPU `n` has MPIDR_EL1 = [`mpidr`]`(n)` (Aff0 = n, bit 31
//! RES1). The GIC, the FDT and vCPU creation all use this function.
//!
//! A core that starts (the boot CPU, and every `CPU_ON`, also of a core that
//! ran before and called `CPU_OFF`) starts in its reset state: the registers
//! and values [`sysreg_reset`] and [`START_ZEROED_X`] describe, at the entry
//! point in [`PSTATE_AT_START`].

use crate::arch::exception::{PSTATE_DAIF, PSTATE_EL1H, SCTLR_C, SCTLR_I, SCTLR_M};
use crate::arch::sysreg::{
    SysReg, CNTV_CTL_EL0, CNTV_CVAL_EL0, ELR_EL1, ESR_EL1, FAR_EL1, SCTLR_EL1, SPSR_EL1, SP_EL0,
    SP_EL1,
};

/// `PSCI_VERSION` (SMC32): returns the PSCI version.
pub const PSCI_VERSION: u32 = 0x8400_0000;
/// `CPU_SUSPEND` (SMC32).
pub const CPU_SUSPEND_32: u32 = 0x8400_0001;
/// `CPU_SUSPEND` (SMC64).
pub const CPU_SUSPEND_64: u32 = 0xC400_0001;
/// `CPU_OFF` (SMC32).
pub const CPU_OFF: u32 = 0x8400_0002;
/// `CPU_ON` (SMC32).
pub const CPU_ON_32: u32 = 0x8400_0003;
/// `CPU_ON` (SMC64).
pub const CPU_ON_64: u32 = 0xC400_0003;
/// `AFFINITY_INFO` (SMC32).
pub const AFFINITY_INFO_32: u32 = 0x8400_0004;
/// `AFFINITY_INFO` (SMC64).
pub const AFFINITY_INFO_64: u32 = 0xC400_0004;
/// `MIGRATE_INFO_TYPE` (SMC32).
pub const MIGRATE_INFO_TYPE: u32 = 0x8400_0006;
/// `SYSTEM_OFF` (SMC32).
pub const SYSTEM_OFF: u32 = 0x8400_0008;
/// `SYSTEM_RESET` (SMC32).
pub const SYSTEM_RESET: u32 = 0x8400_0009;
/// `PSCI_FEATURES` (SMC32).
pub const PSCI_FEATURES: u32 = 0x8400_000A;
/// `SMCCC_VERSION` (SMCCC 1.1, 7.2).
pub const SMCCC_VERSION: u32 = 0x8000_0000;
/// `SMCCC_ARCH_FEATURES` (SMCCC 1.1, 7.3).
pub const SMCCC_ARCH_FEATURES: u32 = 0x8000_0001;

/// The PSCI version reported: 1.0 (major in bits `[31:16]`, minor in `[15:0]`).
pub const PSCI_VERSION_1_0: u64 = 0x0001_0000;
/// The SMCCC version reported: 1.1 (same packing).
pub const SMCCC_VERSION_1_1: u64 = 0x0001_0001;
/// `MIGRATE_INFO_TYPE` result: Trusted OS not present or does not require
/// migration.
pub const MIGRATE_INFO_TYPE_NOT_REQUIRED: u64 = 2;

/// PSCI return code: success (DEN0022D 5.2.2).
pub const SUCCESS: i32 = 0;
/// PSCI return code: not supported.
pub const NOT_SUPPORTED: i32 = -1;
/// PSCI return code: invalid parameters.
pub const INVALID_PARAMETERS: i32 = -2;
/// PSCI return code: denied.
pub const DENIED: i32 = -3;
/// PSCI return code: the target is already on.
pub const ALREADY_ON: i32 = -4;
/// PSCI return code: the target is being turned on.
pub const ON_PENDING: i32 = -5;
/// PSCI return code: internal failure.
pub const INTERNAL_FAILURE: i32 = -6;
/// PSCI return code: not present.
pub const NOT_PRESENT: i32 = -7;
/// PSCI return code: disabled.
pub const DISABLED: i32 = -8;
/// PSCI return code: invalid address.
pub const INVALID_ADDRESS: i32 = -9;

/// A PSCI return code as the 64-bit X0 value (sign-extended two's complement).
pub const fn ret(code: i32) -> u64 {
    code as i64 as u64
}

/// MPIDR_EL1 bit 31, RES1.
const MPIDR_RES1: u64 = 1 << 31;
/// The affinity fields of MPIDR_EL1: Aff3 `[39:32]`, Aff2 `[23:16]`, Aff1 `[15:8]`,
/// Aff0 `[7:0]` (Linux's `MPIDR_HWID_BITMASK`).
pub const MPIDR_AFFINITY_MASK: u64 = 0xff_00ff_ffff;

/// MPIDR_EL1 of vCPU `vcpu`: Aff0 = `vcpu` and bit 31 (RES1) set; U = 0, MT =
/// 0. Indices of 256 and above continue into Aff1 and Aff2 (never reached:
/// at most [`crate::arch::layout::MAX_VCPUS`] vCPUs).
pub const fn mpidr(vcpu: usize) -> u64 {
    MPIDR_RES1 | mpidr_affinity(vcpu)
}

/// The affinity part of [`mpidr`] (what the FDT `cpu@N` `reg` holds and what
/// the guest passes to `CPU_ON`).
pub const fn mpidr_affinity(vcpu: usize) -> u64 {
    let v = vcpu as u64;
    (v & 0xff) | ((v >> 8) & 0xff) << 8 | ((v >> 16) & 0xff) << 16
}

/// The vCPU index whose affinity is `mpidr`'s (only the affinity fields are
/// compared), if it is below `vcpus`.
pub fn vcpu_for_mpidr(mpidr: u64, vcpus: usize) -> Option<usize> {
    let aff = mpidr & MPIDR_AFFINITY_MASK;
    if aff >> 32 != 0 {
        return None;
    }
    let n = usize::try_from((aff & 0xff) | ((aff >> 8) & 0xff) << 8 | ((aff >> 16) & 0xff) << 16)
        .ok()?;
    (n < vcpus && mpidr_affinity(n) == aff).then_some(n)
}

/// Power state of a vCPU as `AFFINITY_INFO` reports it (DEN0022D 5.1.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerState {
    /// Running (AFFINITY_INFO returns 0).
    On,
    /// Off (returns 1).
    Off,
    /// A `CPU_ON` was accepted but the vCPU has not started yet (returns 2).
    OnPending,
}

impl PowerState {
    /// The AFFINITY_INFO return value.
    pub const fn affinity_info(self) -> u64 {
        match self {
            PowerState::On => 0,
            PowerState::Off => 1,
            PowerState::OnPending => 2,
        }
    }
}

/// The run loop's view of the vCPUs, for [`handle`].
pub trait PsciCpus {
    /// Number of vCPUs in the VM (their MPIDRs are [`mpidr`]`(0..n)`).
    fn vcpu_count(&self) -> usize;
    /// Power state of vCPU `vcpu` (`vcpu < vcpu_count()`).
    fn power_state(&self, vcpu: usize) -> PowerState;
}

/// A PSCI/SMCCC call as the guest made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PsciCall {
    /// Function ID, W0 (the upper half of X0 is ignored, SMCCC 2.5).
    pub function_id: u32,
    /// X1, X2, X3. SMC32 functions use only the low 32 bits of each.
    pub args: [u64; 3],
}

impl PsciCall {
    /// The call in registers X0..X3.
    pub const fn from_regs(x: [u64; 4]) -> Self {
        PsciCall {
            function_id: x[0] as u32,
            args: [x[1], x[2], x[3]],
        }
    }
}

/// What the run loop must do for a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PsciAction {
    /// Write this value to X0 and resume the caller.
    Return(u64),
    /// Start vCPU `target` (validated: it exists and was [`PowerState::Off`]
    /// when asked). The loop must atomically move it from off to on-pending or
    /// on and return [`SUCCESS`] in the caller's X0, or return
    /// [`ALREADY_ON`]/[`ON_PENDING`] if it lost a race, or
    /// [`INVALID_ADDRESS`] if `entry` is not in RAM. The target starts in
    /// its reset state ([`sysreg_reset`]: MMU and caches off) at `entry` in
    /// [`PSTATE_AT_START`], X0 = `context_id` (DEN0022D 6.4.3).
    CpuOn {
        /// Index of the vCPU to start.
        target: usize,
        /// Entry point (guest-physical).
        entry: u64,
        /// Value for the target's X0.
        context_id: u64,
    },
    /// Power the calling vCPU off; it does not return (a later `CPU_ON`
    /// restarts it from its reset state).
    CpuOff,
    /// `CPU_SUSPEND`: treat as WFI (wait for an interrupt), then return
    /// [`SUCCESS`] in X0. Power-down requests are treated as standby, which
    /// preserves all state (DEN0022D 5.4.2; KVM does the same).
    CpuSuspend,
    /// Power the VM off.
    SystemOff,
    /// Reset the VM.
    SystemReset,
}

/// PSTATE of a core at its entry point: EL1h with D, A, I and F masked
/// (PSCI `CPU_ON`, DEN0022D 6.4.3; the Linux arm64 boot protocol: "all forms
/// of interrupts must be masked").
pub const PSTATE_AT_START: u64 = PSTATE_EL1H | PSTATE_DAIF;

/// SCTLR_EL1 bits clear at a core's start: M, C and I, "MMU and caches off"
/// (DEN0022D 6.4.3; the Linux arm64 boot protocol asks the same of every
/// CPU).
pub const SCTLR_CLEAR_AT_START: u64 = SCTLR_M | SCTLR_C | SCTLR_I;

/// The general registers zeroed at a core's start, X1..X3 (the Linux arm64
/// boot protocol's rule for the boot CPU; PSCI leaves them UNKNOWN, so one
/// rule serves both). X0 holds the context ID (the DTB address for the boot
/// CPU); X4..X30 and V0..V31 reset as created ([`ResetValue::AsCreated`]).
pub const START_ZEROED_X: std::ops::RangeInclusive<u8> = 1..=3;

/// The system registers a core's reset sets besides the EL1 registers a
/// snapshot holds for the backend (which include the OS lock): the virtual
/// timer, compare value before control, as a restore writes them.
pub const RESET_TIMER: [SysReg; 2] = [CNTV_CVAL_EL0, CNTV_CTL_EL0];

/// How a core's reset sets a register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetValue {
    /// To this value, on every backend.
    Fixed(u64),
    /// To the value the backend's freshly created vCPU has, with the bits of
    /// `clear` cleared. For registers whose reset value the architecture
    /// leaves UNKNOWN or IMPLEMENTATION DEFINED (whole, or outside `clear`):
    /// the backend's own value makes a core that `CPU_ON` starts equal to
    /// one that never ran.
    AsCreated {
        /// Bits that are 0 whatever the backend has.
        clear: u64,
    },
}

impl ResetValue {
    /// The value for a register that has `created` on a fresh vCPU.
    pub const fn resolve(self, created: u64) -> u64 {
        match self {
            ResetValue::Fixed(v) => v,
            ResetValue::AsCreated { clear } => created & !clear,
        }
    }
}

/// How a core's reset sets system register `reg` (any register of a
/// snapshot's vCPU state, or of [`RESET_TIMER`]; MPIDR_EL1 is the
/// core's identity, which no reset changes, and is not reset):
/// - SCTLR_EL1: as created, with [`SCTLR_CLEAR_AT_START`] clear (its RES1
///   bits and IMPLEMENTATION DEFINED fields as the backend has them).
/// - SP_EL0, SP_EL1, ELR_EL1, SPSR_EL1, ESR_EL1, FAR_EL1: zero (UNKNOWN in
///   the architecture; a stack pointer or exception record from before
///   `CPU_OFF` must not survive).
/// - Every other register as created: translation (TCR, TTBR0/1, MAIR,
///   AMAIR), VBAR, CPACR, the thread IDs, CONTEXTIDR, PAR, AFSR0/1, CSSELR,
///   FPCR/FPSR, the pointer-authentication keys, and debug and timer state
///   as at power-on (MDSCR, the OS lock, CNTKCTL, CNTV_CTL, CNTV_CVAL).
pub const fn sysreg_reset(reg: SysReg) -> ResetValue {
    match reg {
        SCTLR_EL1 => ResetValue::AsCreated {
            clear: SCTLR_CLEAR_AT_START,
        },
        SP_EL0 | SP_EL1 | ELR_EL1 | SPSR_EL1 | ESR_EL1 | FAR_EL1 => ResetValue::Fixed(0),
        _ => ResetValue::AsCreated { clear: 0 },
    }
}

/// Whether `PSCI_FEATURES` reports `function_id` as implemented.
fn implemented(function_id: u32) -> bool {
    matches!(
        function_id,
        PSCI_VERSION
            | CPU_SUSPEND_32
            | CPU_SUSPEND_64
            | CPU_OFF
            | CPU_ON_32
            | CPU_ON_64
            | AFFINITY_INFO_32
            | AFFINITY_INFO_64
            | MIGRATE_INFO_TYPE
            | SYSTEM_OFF
            | SYSTEM_RESET
            | PSCI_FEATURES
            | SMCCC_VERSION
    )
}

/// Decides a PSCI or SMCCC architecture call. Pure: reads `vcpus`, changes
/// nothing. Unknown function IDs (including all vendor and SiP services and
/// the Spectre workaround calls) return [`NOT_SUPPORTED`].
///
/// - `PSCI_VERSION` → 1.0; `SMCCC_VERSION` → 1.1; `SMCCC_ARCH_FEATURES` →
///   NOT_SUPPORTED for every query (no `ARCH_WORKAROUND_*`).
/// - `PSCI_FEATURES(fid)` → SUCCESS (0) for the functions listed here (for
///   CPU_SUSPEND: original power_state format, no OS-initiated mode), else
///   NOT_SUPPORTED.
/// - `CPU_ON(mpidr, entry, ctx)` → [`PsciAction::CpuOn`], or INVALID_PARAMETERS
///   (unknown MPIDR or non-affinity bits set), ALREADY_ON, ON_PENDING.
/// - `AFFINITY_INFO(mpidr, level)` → 0 on, 1 off, 2 on-pending;
///   INVALID_PARAMETERS for an unknown MPIDR or a level other than 0.
/// - `MIGRATE_INFO_TYPE` → 2 (no Trusted OS migration needed).
pub fn handle(call: PsciCall, vcpus: &dyn PsciCpus) -> PsciAction {
    let fid = call.function_id;
    // SMCCC: bit 30 set selects the SMC64 convention; SMC32 uses W registers.
    let args = if fid & (1 << 30) != 0 {
        call.args
    } else {
        call.args.map(|a| a & 0xffff_ffff)
    };
    let r = |code| PsciAction::Return(ret(code));
    match fid {
        PSCI_VERSION => PsciAction::Return(PSCI_VERSION_1_0),
        SMCCC_VERSION => PsciAction::Return(SMCCC_VERSION_1_1),
        SMCCC_ARCH_FEATURES => r(NOT_SUPPORTED),
        PSCI_FEATURES => {
            // The queried ID is a 32-bit value (args already truncated).
            if implemented(args[0] as u32) {
                r(SUCCESS)
            } else {
                r(NOT_SUPPORTED)
            }
        }
        CPU_SUSPEND_32 | CPU_SUSPEND_64 => PsciAction::CpuSuspend,
        CPU_OFF => PsciAction::CpuOff,
        CPU_ON_32 | CPU_ON_64 => {
            let [target_mpidr, entry, context_id] = args;
            if target_mpidr & !MPIDR_AFFINITY_MASK != 0 {
                return r(INVALID_PARAMETERS);
            }
            let Some(target) = vcpu_for_mpidr(target_mpidr, vcpus.vcpu_count()) else {
                return r(INVALID_PARAMETERS);
            };
            match vcpus.power_state(target) {
                PowerState::On => r(ALREADY_ON),
                PowerState::OnPending => r(ON_PENDING),
                PowerState::Off => PsciAction::CpuOn {
                    target,
                    entry,
                    context_id,
                },
            }
        }
        AFFINITY_INFO_32 | AFFINITY_INFO_64 => {
            let [target_mpidr, level, _] = args;
            // PSCI 1.0 makes levels above 0 optional; only 0 is supported.
            if level != 0 || target_mpidr & !MPIDR_AFFINITY_MASK != 0 {
                return r(INVALID_PARAMETERS);
            }
            match vcpu_for_mpidr(target_mpidr, vcpus.vcpu_count()) {
                Some(n) => PsciAction::Return(vcpus.power_state(n).affinity_info()),
                None => r(INVALID_PARAMETERS),
            }
        }
        MIGRATE_INFO_TYPE => PsciAction::Return(MIGRATE_INFO_TYPE_NOT_REQUIRED),
        SYSTEM_OFF => PsciAction::SystemOff,
        SYSTEM_RESET => PsciAction::SystemReset,
        _ => r(NOT_SUPPORTED),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Cpus(Vec<PowerState>);
    impl PsciCpus for Cpus {
        fn vcpu_count(&self) -> usize {
            self.0.len()
        }
        fn power_state(&self, vcpu: usize) -> PowerState {
            self.0[vcpu]
        }
    }

    fn four() -> Cpus {
        Cpus(vec![
            PowerState::On,
            PowerState::Off,
            PowerState::OnPending,
            PowerState::Off,
        ])
    }

    fn call(function_id: u32, a: u64, b: u64, c: u64) -> PsciAction {
        handle(
            PsciCall {
                function_id,
                args: [a, b, c],
            },
            &four(),
        )
    }

    const NS: PsciAction = PsciAction::Return(ret(NOT_SUPPORTED));
    const INVAL: PsciAction = PsciAction::Return(ret(INVALID_PARAMETERS));

    #[test]
    fn return_codes_are_sign_extended() {
        assert_eq!(ret(NOT_SUPPORTED), u64::MAX);
        assert_eq!(ret(INVALID_ADDRESS), 0xffff_ffff_ffff_fff7);
        assert_eq!(ret(SUCCESS), 0);
        assert_eq!(
            [
                DENIED,
                ALREADY_ON,
                ON_PENDING,
                INTERNAL_FAILURE,
                NOT_PRESENT,
                DISABLED
            ],
            [-3, -4, -5, -6, -7, -8]
        );
    }

    #[test]
    fn mpidr_rule() {
        assert_eq!(mpidr(0), 0x8000_0000);
        assert_eq!(mpidr(3), 0x8000_0003);
        assert_eq!(mpidr_affinity(7), 7);
        assert_eq!(mpidr(0x1_0203), 0x8001_0203);
        assert_eq!(vcpu_for_mpidr(mpidr(3), 4), Some(3));
        assert_eq!(vcpu_for_mpidr(3, 4), Some(3));
        assert_eq!(vcpu_for_mpidr(4, 4), None);
        assert_eq!(vcpu_for_mpidr(0x100, 4), None);
        assert_eq!(vcpu_for_mpidr(1 << 32, 4), None);
        assert_eq!(vcpu_for_mpidr(mpidr(300), 301), Some(300));
    }

    #[test]
    fn versions() {
        assert_eq!(call(PSCI_VERSION, 0, 0, 0), PsciAction::Return(0x1_0000));
        assert_eq!(call(SMCCC_VERSION, 0, 0, 0), PsciAction::Return(0x1_0001));
        // ARCH_WORKAROUND_1/2/3 are not offered.
        for w in [
            0x8000_8000,
            0x8000_7FFF,
            0x8000_3FFF,
            u64::from(SMCCC_VERSION),
        ] {
            assert_eq!(call(SMCCC_ARCH_FEATURES, w, 0, 0), NS);
        }
        // Upper half of X0 is ignored.
        assert_eq!(
            handle(
                PsciCall::from_regs([0xffff_ffff_8400_0000, 0, 0, 0]),
                &four()
            ),
            PsciAction::Return(PSCI_VERSION_1_0)
        );
    }

    #[test]
    fn features() {
        for fid in [
            PSCI_VERSION,
            CPU_SUSPEND_32,
            CPU_SUSPEND_64,
            CPU_OFF,
            CPU_ON_32,
            CPU_ON_64,
            AFFINITY_INFO_32,
            AFFINITY_INFO_64,
            MIGRATE_INFO_TYPE,
            SYSTEM_OFF,
            SYSTEM_RESET,
            PSCI_FEATURES,
            SMCCC_VERSION,
        ] {
            assert_eq!(
                call(PSCI_FEATURES, fid.into(), 0, 0),
                PsciAction::Return(0),
                "{fid:#x}"
            );
            // The query is 32-bit: garbage in the upper half is dropped.
            assert_eq!(
                call(PSCI_FEATURES, u64::from(fid) | 0xdead_0000_0000_0000, 0, 0),
                PsciAction::Return(0)
            );
        }
        // MIGRATE, MIGRATE_INFO_UP_CPU, SYSTEM_SUSPEND, SMCCC_ARCH_FEATURES.
        for fid in [0x8400_0005u64, 0x8400_0007, 0xC400_000E, 0x8000_0001, 0] {
            assert_eq!(call(PSCI_FEATURES, fid, 0, 0), NS, "{fid:#x}");
        }
    }

    #[test]
    fn cpu_on() {
        assert_eq!(
            call(CPU_ON_64, 1, 0x4020_0000, 0x00c0_ffee_0000_0001),
            PsciAction::CpuOn {
                target: 1,
                entry: 0x4020_0000,
                context_id: 0x00c0_ffee_0000_0001
            }
        );
        // The RES1 bit 31 in the MPIDR is not an affinity bit.
        assert_eq!(call(CPU_ON_64, mpidr(3), 0x4000_0000, 0), INVAL);
        assert_eq!(
            call(CPU_ON_64, 0, 0x4000_0000, 0),
            PsciAction::Return(ret(ALREADY_ON))
        );
        assert_eq!(
            call(CPU_ON_64, 2, 0x4000_0000, 0),
            PsciAction::Return(ret(ON_PENDING))
        );
        assert_eq!(call(CPU_ON_64, 4, 0x4000_0000, 0), INVAL);
        assert_eq!(call(CPU_ON_64, 0x100, 0x4000_0000, 0), INVAL);
        // SMC32: every argument is truncated to 32 bits.
        assert_eq!(
            call(
                CPU_ON_32,
                0xffff_ffff_0000_0003,
                0x1_4020_0000,
                0xffff_ffff_0000_0007
            ),
            PsciAction::CpuOn {
                target: 3,
                entry: 0x4020_0000,
                context_id: 7
            }
        );
    }

    #[test]
    fn affinity_info() {
        for (n, expected) in [(0u64, 0u64), (1, 1), (2, 2), (3, 1)] {
            assert_eq!(
                call(AFFINITY_INFO_64, n, 0, 0),
                PsciAction::Return(expected)
            );
            assert_eq!(
                call(AFFINITY_INFO_32, n, 0, 0),
                PsciAction::Return(expected)
            );
        }
        assert_eq!(call(AFFINITY_INFO_64, 0, 1, 0), INVAL);
        assert_eq!(call(AFFINITY_INFO_64, 9, 0, 0), INVAL);
        assert_eq!(call(AFFINITY_INFO_64, 1 << 40, 0, 0), INVAL);
        // SMC32 drops the upper halves, so this is (1, level 0).
        assert_eq!(
            call(AFFINITY_INFO_32, 0x7_0000_0001, 0x1_0000_0000, 0),
            PsciAction::Return(1)
        );
    }

    #[test]
    fn power_management_calls() {
        assert_eq!(call(CPU_OFF, 0, 0, 0), PsciAction::CpuOff);
        assert_eq!(call(CPU_SUSPEND_32, 0, 0, 0), PsciAction::CpuSuspend);
        assert_eq!(
            call(CPU_SUSPEND_64, 0x1_0000, 0x4000_0000, 0),
            PsciAction::CpuSuspend
        );
        assert_eq!(call(SYSTEM_OFF, 0, 0, 0), PsciAction::SystemOff);
        assert_eq!(call(SYSTEM_RESET, 0, 0, 0), PsciAction::SystemReset);
        assert_eq!(call(MIGRATE_INFO_TYPE, 0, 0, 0), PsciAction::Return(2));
    }

    #[test]
    fn unknown_functions_are_not_supported() {
        // MIGRATE, SYSTEM_SUSPEND64, PSCI 1.1 SYSTEM_RESET2, TRNG_VERSION,
        // KVM vendor UID query, ARCH_WORKAROUND_1, a 64-bit PSCI_VERSION.
        for fid in [
            0x8400_0005,
            0xC400_000E,
            0x8400_0012,
            0x8400_0050,
            0x8600_FF01,
            0x8000_8000,
            0xC400_0000,
            0,
            u32::MAX,
        ] {
            assert_eq!(call(fid, 0, 0, 0), NS, "{fid:#x}");
        }
    }
    #[test]
    fn reset_state_description() {
        use crate::arch::sysreg::{
            EL1_STATE_SYSREGS, MPIDR_EL1, OSLSR_EL1, TCR_EL1, TTBR1_EL1, VBAR_EL1,
        };
        // SCTLR_EL1: the backend's bits, MMU and caches off.
        let sctlr = sysreg_reset(SCTLR_EL1);
        assert_eq!(sctlr.resolve(0x30d0_1805), 0x30d0_0800);
        assert_eq!(sctlr.resolve(0x00c5_0838), 0x00c5_0838);
        // A stale stack pointer or exception record is zeroed, whatever the
        // backend had.
        for r in [SP_EL0, SP_EL1, ELR_EL1, SPSR_EL1, ESR_EL1, FAR_EL1] {
            assert_eq!(sysreg_reset(r).resolve(0x1234), 0, "{r:?}");
        }
        // UNKNOWN at reset: as a fresh vCPU has them.
        for r in [TCR_EL1, TTBR1_EL1, VBAR_EL1, CNTV_CTL_EL0, OSLSR_EL1] {
            assert_eq!(sysreg_reset(r), ResetValue::AsCreated { clear: 0 }, "{r:?}");
        }
        // Every register a reset may set is named once; MPIDR is not among
        // the extras (callers leave the snapshot set's MPIDR out).
        for (i, r) in RESET_TIMER.iter().enumerate() {
            assert!(!EL1_STATE_SYSREGS.contains(r), "{r:?}");
            assert!(!RESET_TIMER[i + 1..].contains(r), "{r:?}");
            assert_ne!(*r, MPIDR_EL1);
        }
        assert_eq!(PSTATE_AT_START, 0x3c5);
        assert_eq!(START_ZEROED_X, 1..=3);
    }
}
