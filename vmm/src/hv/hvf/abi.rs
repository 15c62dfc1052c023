//! Hypervisor.framework's C interface as far as raw values and layouts go,
//! and the decisions taken on them, compiled and unit-tested on every host
//! (the calls themselves are in the macOS-only `ffi` module).
//!
//! Values and layouts are those of Apple's headers (`hv_vcpu_types.h`,
//! `hv_vcpu.h`, `hv_error.h`; macOS 15.2 for the SME ones). Everything the
//! framework writes is read as integers, never as a Rust `enum` or `bool`:
//! a value a newer macOS adds is then an error that names it, not undefined
//! behaviour.

use super::exits::{ExitReason, ExitRecord};
use crate::hv::HvError;

/// `hv_return_t` (`kern_return_t`, a C `int`).
pub type HvReturn = i32;
/// `HV_SUCCESS`.
pub const HV_SUCCESS: HvReturn = 0;
/// `HV_UNSUPPORTED` (0xfae9400f): the host lacks the feature.
pub const HV_UNSUPPORTED: HvReturn = 0xfae9_400f_u32 as i32;

/// `HV_INTERRUPT_TYPE_IRQ` of `hv_interrupt_type_t` (a `uint32_t` enum).
///
/// applevisor-sys 1.0 declares that enum `{ FIQ, IRQ }`, the reverse of
/// Apple's `{ HV_INTERRUPT_TYPE_IRQ, HV_INTERRUPT_TYPE_FIQ }`: its `IRQ` is
/// Apple's FIQ. This VMM passes Apple's value.
pub const HV_INTERRUPT_TYPE_IRQ: u32 = 0;

/// `hv_exit_reason_t` values (a `uint32_t` enum).
pub const HV_EXIT_REASON_CANCELED: u32 = 0;
/// See [`HV_EXIT_REASON_CANCELED`].
pub const HV_EXIT_REASON_EXCEPTION: u32 = 1;
/// See [`HV_EXIT_REASON_CANCELED`].
pub const HV_EXIT_REASON_VTIMER_ACTIVATED: u32 = 2;
/// See [`HV_EXIT_REASON_CANCELED`].
pub const HV_EXIT_REASON_UNKNOWN: u32 = 3;

/// `hv_vcpu_exit_t` as Hypervisor.framework lays it out (the reason, 4
/// bytes of padding, then `hv_vcpu_exit_exception_t`), with the reason kept
/// as the raw `uint32_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VcpuExit {
    /// `hv_exit_reason_t`.
    pub reason: u32,
    /// `exception.syndrome`: ESR_EL2.
    pub syndrome: u64,
    /// `exception.virtual_address`: FAR_EL2.
    pub virtual_address: u64,
    /// `exception.physical_address`: the faulting IPA.
    pub physical_address: u64,
}

const _: () = {
    assert!(std::mem::size_of::<VcpuExit>() == 32);
    assert!(std::mem::align_of::<VcpuExit>() == 8);
    assert!(std::mem::offset_of!(VcpuExit, syndrome) == 8);
    assert!(std::mem::offset_of!(VcpuExit, virtual_address) == 16);
    assert!(std::mem::offset_of!(VcpuExit, physical_address) == 24);
};

impl VcpuExit {
    /// The exit as a record for [`super::exits::decide`]; a reason this
    /// VMM does not know (one a newer macOS added) is an error naming it.
    pub fn record(&self) -> Result<ExitRecord, HvError> {
        let reason = match self.reason {
            HV_EXIT_REASON_CANCELED => ExitReason::Canceled,
            HV_EXIT_REASON_EXCEPTION => ExitReason::Exception,
            HV_EXIT_REASON_VTIMER_ACTIVATED => ExitReason::VtimerActivated,
            HV_EXIT_REASON_UNKNOWN => ExitReason::Unknown,
            other => {
                return Err(HvError::Call {
                    call: "hv_vcpu_run",
                    detail: format!(
                        "exit reason {other} is not one of hv_exit_reason_t's values this VMM \
                         knows (0 CANCELED, 1 EXCEPTION, 2 VTIMER_ACTIVATED, 3 UNKNOWN)"
                    ),
                })
            }
        };
        Ok(ExitRecord {
            reason,
            esr: self.syndrome,
            far: self.virtual_address,
            ipa: self.physical_address,
        })
    }
}

/// `hv_vcpu_sme_state_t` (macOS 15.2): two C `bool`s, read as bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SmeState {
    /// `streaming_sve_mode_enabled`: PSTATE.SM.
    pub streaming_sve_mode_enabled: u8,
    /// `za_storage_enabled`: PSTATE.ZA.
    pub za_storage_enabled: u8,
}

const _: () = assert!(std::mem::size_of::<SmeState>() == 2);

/// Whether a vCPU's SME state lets a snapshot be taken, from what
/// `hv_vcpu_get_sme_state` answered: `None` when this macOS lacks the call
/// (before 15.2, which is also when guests got SME), else its return code
/// and the state it wrote.
///
/// A snapshot saves V0-V31 but none of SME's own state (Z0-Z31 beyond their
/// low 128 bits, P0-P15, ZA, ZT0), so it is refused while PSTATE.SM or
/// PSTATE.ZA is set; the guest's SME state is dead otherwise. No call, or
/// `HV_UNSUPPORTED` (a Mac without SME), means there is no SME state. Any
/// other failure refuses too, since the state is then unknown.
pub fn sme_snapshot_check(answer: Option<(HvReturn, SmeState)>) -> Result<(), String> {
    let state = match answer {
        None => return Ok(()),
        Some((HV_UNSUPPORTED, _)) => return Ok(()),
        Some((HV_SUCCESS, state)) => state,
        Some((ret, _)) => {
            return Err(format!(
                "hv_vcpu_get_sme_state failed ({:#x}), so whether the vCPU has live SME state \
                 (which snapshots do not save) is unknown",
                ret as u32
            ))
        }
    };
    let live = match (
        state.streaming_sve_mode_enabled != 0,
        state.za_storage_enabled != 0,
    ) {
        (false, false) => return Ok(()),
        (true, false) => "PSTATE.SM is set (streaming SVE mode: Z0-Z31 and P0-P15 are live)",
        (false, true) => "PSTATE.ZA is set (the ZA array and ZT0 are live)",
        (true, true) => {
            "PSTATE.SM and PSTATE.ZA are set (streaming SVE mode and ZA: Z0-Z31, P0-P15, ZA \
             and ZT0 are live)"
        }
    };
    Err(format!(
        "{live}; snapshots save V0-V31 but not SME state, so this one is refused. Try again \
         once the guest has left streaming mode and released ZA (SMSTOP)"
    ))
}

/// Checks that SIMD/FP register `V<n>` reads back as `written` after a
/// restore wrote it; `read` is what `hv_vcpu_get_simd_fp_reg` returned.
pub fn check_vreg_readback(n: u8, written: u128, read: u128) -> Result<(), HvError> {
    if written == read {
        return Ok(());
    }
    Err(HvError::Call {
        call: "hv_vcpu_set_simd_fp_reg",
        detail: format!(
            "V{n} reads back as {read:#034x} after {written:#034x} was written; the vCPU's \
             SIMD/FP state was not restored"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_reasons_map_by_value() {
        let exit = |reason| VcpuExit {
            reason,
            syndrome: 0x9200_0046,
            virtual_address: 0xffff_0000_0900_0018,
            physical_address: 0x0900_0018,
        };
        for (raw, want) in [
            (0, ExitReason::Canceled),
            (1, ExitReason::Exception),
            (2, ExitReason::VtimerActivated),
            (3, ExitReason::Unknown),
        ] {
            let rec = exit(raw).record().unwrap();
            assert_eq!(rec.reason, want);
            assert_eq!(
                (rec.esr, rec.far, rec.ipa),
                (0x9200_0046, 0xffff_0000_0900_0018, 0x0900_0018)
            );
        }
        for raw in [4, 0x7fff_ffff, u32::MAX] {
            let e = exit(raw).record().unwrap_err().to_string();
            assert!(e.contains(&format!("exit reason {raw} ")), "{e}");
            assert!(e.starts_with("hv_vcpu_run failed"), "{e}");
        }
    }

    #[test]
    fn exit_mirror_reads_apples_layout() {
        // hv_vcpu_exit_t as the framework writes it: uint32_t reason,
        // padding, then three uint64_t.
        let mut bytes = [0u8; 32];
        bytes[0..4].copy_from_slice(&2u32.to_ne_bytes());
        bytes[4..8].copy_from_slice(&[0xa5; 4]);
        bytes[8..16].copy_from_slice(&0x1111u64.to_ne_bytes());
        bytes[16..24].copy_from_slice(&0x2222u64.to_ne_bytes());
        bytes[24..32].copy_from_slice(&0x3333u64.to_ne_bytes());
        // SAFETY: `bytes` is 32 initialised bytes and `VcpuExit` (size 32,
        // checked at compile time) is valid for every bit pattern; the read
        // is unaligned-safe.
        let exit = unsafe { bytes.as_ptr().cast::<VcpuExit>().read_unaligned() };
        assert_eq!(
            exit,
            VcpuExit {
                reason: 2,
                syndrome: 0x1111,
                virtual_address: 0x2222,
                physical_address: 0x3333,
            }
        );
    }

    #[test]
    fn apples_constants() {
        assert_eq!(HV_UNSUPPORTED as u32, 0xfae9_400f);
        assert_eq!(HV_INTERRUPT_TYPE_IRQ, 0);
    }

    #[test]
    fn sme_state_decides_whether_a_snapshot_may_be_taken() {
        let state = |sm, za| SmeState {
            streaming_sve_mode_enabled: sm,
            za_storage_enabled: za,
        };
        // No SME: the call is missing (macOS < 15.2) or the Mac has none.
        assert_eq!(sme_snapshot_check(None), Ok(()));
        assert_eq!(
            sme_snapshot_check(Some((HV_UNSUPPORTED, state(1, 1)))),
            Ok(())
        );
        // SME present but off.
        assert_eq!(sme_snapshot_check(Some((HV_SUCCESS, state(0, 0)))), Ok(()));
        // Live SME state is named.
        let e = sme_snapshot_check(Some((HV_SUCCESS, state(1, 0)))).unwrap_err();
        assert!(e.starts_with("PSTATE.SM is set"), "{e}");
        let e = sme_snapshot_check(Some((HV_SUCCESS, state(0, 1)))).unwrap_err();
        assert!(e.starts_with("PSTATE.ZA is set"), "{e}");
        let e = sme_snapshot_check(Some((HV_SUCCESS, state(1, 1)))).unwrap_err();
        assert!(e.starts_with("PSTATE.SM and PSTATE.ZA are set"), "{e}");
        // Any non-zero byte is true (C bool written by the framework).
        assert!(sme_snapshot_check(Some((HV_SUCCESS, state(0, 0xff)))).is_err());
        // Other failures: unknown state, refused.
        let e = sme_snapshot_check(Some((0xfae9_4001_u32 as i32, state(0, 0)))).unwrap_err();
        assert!(e.contains("0xfae94001"), "{e}");
    }

    #[test]
    fn vreg_readback_names_the_register() {
        let v = 0x0011_2233_4455_6677_8899_aabb_ccdd_eeff_u128;
        assert!(check_vreg_readback(5, v, v).is_ok());
        let e = check_vreg_readback(17, v, 0).unwrap_err().to_string();
        assert!(e.contains("V17 reads back as 0x0000"), "{e}");
        assert!(
            e.contains("after 0x00112233445566778899aabbccddeeff"),
            "{e}"
        );
        // A value that lost its high half (what passing it in x2:x3 instead
        // of v0 can leave) is caught.
        assert!(check_vreg_readback(0, v, v & u128::from(u64::MAX)).is_err());
    }
}
