//! Exception syndromes (ESR_EL2 / ESR_EL1): typed decoding, encoders for
//! synthesised guest exceptions, and the register value of an emulated load
//! ([`extend`]).
//!
//! Layout (Arm ARM DDI 0487, D24.2.41 "ESR_EL2"; ESR_EL1 is the same):
//!
//! ```text
//! 63      37 36  32 31   26 25  24                     0
//! | RES0    | ISS2 |  EC   | IL |         ISS          |
//! ```
//!
//! EC is the exception class, IL the instruction length (1 = 32-bit; it is
//! also 1 for every syndrome that is not a trapped instruction) and ISS the
//! class-specific syndrome. ISS2 is ignored.
//!
//! Decoding never fails: every 64-bit value maps to some [`Syndrome`], unknown
//! classes to [`Syndrome::Other`].

use crate::arch::sysreg::SysReg;

/// Bit position of EC in an ESR.
const EC_SHIFT: u32 = 26;
/// IL: the trapped instruction is 32 bits (always set for A64).
const IL_BIT: u64 = 1 << 25;
/// Mask of the 25-bit ISS.
const ISS_MASK: u64 = (1 << 25) - 1;

/// Exception class: ESR bits `[31:26]` (Arm ARM D24.2.41, table "EC").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExceptionClass {
    /// 0x00: unknown reason (e.g. an UNDEFINED instruction).
    Unknown,
    /// 0x01: trapped WFI/WFE (and WFIT/WFET).
    Wfx,
    /// 0x07: trapped access to SVE, Advanced SIMD or floating point.
    FpAccess,
    /// 0x0E: illegal execution state.
    IllegalState,
    /// 0x15: SVC in AArch64 state.
    Svc64,
    /// 0x16: HVC in AArch64 state.
    Hvc64,
    /// 0x17: trapped SMC in AArch64 state.
    Smc64,
    /// 0x18: trapped MSR, MRS or system instruction in AArch64 state.
    SysReg,
    /// 0x20: instruction abort from a lower exception level.
    InstrAbortLower,
    /// 0x21: instruction abort taken without a change of exception level.
    InstrAbortSame,
    /// 0x22: PC alignment fault.
    PcAlign,
    /// 0x24: data abort from a lower exception level.
    DataAbortLower,
    /// 0x25: data abort taken without a change of exception level.
    DataAbortSame,
    /// 0x26: SP alignment fault.
    SpAlign,
    /// 0x2F: SError exception.
    SError,
    /// 0x30: breakpoint exception from a lower exception level.
    BreakpointLower,
    /// 0x31: breakpoint exception without a change of exception level.
    BreakpointSame,
    /// 0x32: software step exception from a lower exception level.
    SoftwareStepLower,
    /// 0x33: software step exception without a change of exception level.
    SoftwareStepSame,
    /// 0x34: watchpoint exception from a lower exception level.
    WatchpointLower,
    /// 0x35: watchpoint exception without a change of exception level.
    WatchpointSame,
    /// 0x3C: BRK instruction in AArch64 state.
    Brk,
    /// Any other 6-bit class.
    Other(u8),
}

impl ExceptionClass {
    /// The class of a 6-bit EC value (higher bits are ignored).
    pub const fn from_code(ec: u8) -> Self {
        match ec & 0x3f {
            0x00 => Self::Unknown,
            0x01 => Self::Wfx,
            0x07 => Self::FpAccess,
            0x0E => Self::IllegalState,
            0x15 => Self::Svc64,
            0x16 => Self::Hvc64,
            0x17 => Self::Smc64,
            0x18 => Self::SysReg,
            0x20 => Self::InstrAbortLower,
            0x21 => Self::InstrAbortSame,
            0x22 => Self::PcAlign,
            0x24 => Self::DataAbortLower,
            0x25 => Self::DataAbortSame,
            0x26 => Self::SpAlign,
            0x2F => Self::SError,
            0x30 => Self::BreakpointLower,
            0x31 => Self::BreakpointSame,
            0x32 => Self::SoftwareStepLower,
            0x33 => Self::SoftwareStepSame,
            0x34 => Self::WatchpointLower,
            0x35 => Self::WatchpointSame,
            0x3C => Self::Brk,
            other => Self::Other(other),
        }
    }

    /// The 6-bit EC value.
    pub const fn code(self) -> u8 {
        match self {
            Self::Unknown => 0x00,
            Self::Wfx => 0x01,
            Self::FpAccess => 0x07,
            Self::IllegalState => 0x0E,
            Self::Svc64 => 0x15,
            Self::Hvc64 => 0x16,
            Self::Smc64 => 0x17,
            Self::SysReg => 0x18,
            Self::InstrAbortLower => 0x20,
            Self::InstrAbortSame => 0x21,
            Self::PcAlign => 0x22,
            Self::DataAbortLower => 0x24,
            Self::DataAbortSame => 0x25,
            Self::SpAlign => 0x26,
            Self::SError => 0x2F,
            Self::BreakpointLower => 0x30,
            Self::BreakpointSame => 0x31,
            Self::SoftwareStepLower => 0x32,
            Self::SoftwareStepSame => 0x33,
            Self::WatchpointLower => 0x34,
            Self::WatchpointSame => 0x35,
            Self::Brk => 0x3C,
            Self::Other(ec) => ec & 0x3f,
        }
    }

    /// The class of an ESR value.
    pub const fn of(esr: u64) -> Self {
        Self::from_code(((esr >> EC_SHIFT) & 0x3f) as u8)
    }
}

/// DFSC/IFSC base for an address size fault; OR in the level (0..=3).
pub const FSC_ADDRESS_SIZE: u8 = 0b00_0000;
/// DFSC/IFSC base for a translation fault; OR in the level (0..=3).
pub const FSC_TRANSLATION: u8 = 0b00_0100;
/// DFSC/IFSC base for an access flag fault; OR in the level (0..=3).
pub const FSC_ACCESS_FLAG: u8 = 0b00_1000;
/// DFSC/IFSC base for a permission fault; OR in the level (0..=3).
pub const FSC_PERMISSION: u8 = 0b00_1100;
/// DFSC/IFSC: synchronous external abort, not on a translation table walk.
pub const FSC_SYNC_EXTERNAL: u8 = 0b01_0000;
/// DFSC/IFSC base for a synchronous external abort on a translation table
/// walk; OR in the level (0..=3).
pub const FSC_SYNC_EXTERNAL_ON_WALK: u8 = 0b01_0100;
/// DFSC: alignment fault.
pub const FSC_ALIGNMENT: u8 = 0b10_0001;

/// What a fault status code reports (Arm ARM D24.2.41, ISS "DFSC"/"IFSC").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Address size fault.
    AddressSize,
    /// Translation fault (no valid descriptor).
    Translation,
    /// Access flag fault.
    AccessFlag,
    /// Permission fault.
    Permission,
    /// Synchronous external abort, not on a table walk.
    SyncExternal,
    /// Synchronous external abort on a translation table walk.
    SyncExternalOnWalk,
    /// Synchronous tag check fault (MTE).
    TagCheck,
    /// Synchronous parity or ECC error, not on a table walk.
    Parity,
    /// Synchronous parity or ECC error on a translation table walk.
    ParityOnWalk,
    /// Alignment fault.
    Alignment,
    /// Granule protection fault.
    GranuleProtection,
    /// TLB conflict abort.
    TlbConflict,
    /// Unsupported atomic hardware update.
    UnsupportedAtomicUpdate,
    /// A code this decoder does not name (IMPLEMENTATION DEFINED or reserved).
    Other,
}

/// A 6-bit data or instruction fault status code (DFSC/IFSC, ISS bits `[5:0]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FaultStatus(pub u8);

impl FaultStatus {
    /// A translation fault at `level` (0..=3; higher bits are masked off).
    pub const fn translation(level: u8) -> Self {
        Self(FSC_TRANSLATION | (level & 3))
    }

    /// A permission fault at `level` (0..=3; higher bits are masked off).
    pub const fn permission(level: u8) -> Self {
        Self(FSC_PERMISSION | (level & 3))
    }

    /// An access flag fault at `level` (0..=3; higher bits are masked off).
    pub const fn access_flag(level: u8) -> Self {
        Self(FSC_ACCESS_FLAG | (level & 3))
    }

    /// An address size fault at `level` (0..=3; higher bits are masked off).
    pub const fn address_size(level: u8) -> Self {
        Self(FSC_ADDRESS_SIZE | (level & 3))
    }

    /// A synchronous external abort on the translation table walk at `level`
    /// (0..=3; higher bits are masked off).
    pub const fn external_abort_on_walk(level: u8) -> Self {
        Self(FSC_SYNC_EXTERNAL_ON_WALK | (level & 3))
    }

    /// The raw 6-bit code.
    pub const fn code(self) -> u8 {
        self.0 & 0x3f
    }

    /// The kind of fault. Codes with a level: `0b0000LL` address size,
    /// `0b0001LL` translation, `0b0010LL` access flag, `0b0011LL` permission,
    /// `0b0101LL` external abort on walk, `0b0111LL` ECC on walk, `0b1001LL`
    /// granule protection on walk, plus the FEAT_LPA2 level -1 forms.
    pub const fn kind(self) -> FaultKind {
        match self.code() {
            0b00_0000..=0b00_0011 | 0b10_1001 => FaultKind::AddressSize,
            0b00_0100..=0b00_0111 | 0b10_1011 => FaultKind::Translation,
            0b00_1000..=0b00_1011 => FaultKind::AccessFlag,
            0b00_1100..=0b00_1111 => FaultKind::Permission,
            0b01_0000 => FaultKind::SyncExternal,
            0b01_0001 => FaultKind::TagCheck,
            // Level -1 (0b010011) then levels 0-3.
            0b01_0011..=0b01_0111 => FaultKind::SyncExternalOnWalk,
            0b01_1000 => FaultKind::Parity,
            0b01_1011..=0b01_1111 => FaultKind::ParityOnWalk,
            0b10_0001 => FaultKind::Alignment,
            // On walk at level -1, levels 0-3, then not on a walk.
            0b10_0011..=0b10_1000 => FaultKind::GranuleProtection,
            0b11_0000 => FaultKind::TlbConflict,
            0b11_0001 => FaultKind::UnsupportedAtomicUpdate,
            _ => FaultKind::Other,
        }
    }

    /// The translation table level the fault is reported at (-1..=3), for the
    /// kinds that carry one.
    pub const fn level(self) -> Option<i8> {
        match self.code() {
            // FEAT_LPA2 level -1 encodings.
            0b10_1001 | 0b10_1011 | 0b01_0011 | 0b01_1011 | 0b10_0011 => Some(-1),
            c @ (0b00_0000..=0b00_1111
            | 0b01_0100..=0b01_0111
            | 0b01_1100..=0b01_1111
            | 0b10_0100..=0b10_0111) => Some((c & 3) as i8),
            _ => None,
        }
    }

    /// Whether this is a permission fault (any level).
    pub const fn is_permission_fault(self) -> bool {
        matches!(self.kind(), FaultKind::Permission)
    }

    /// Whether this is a translation fault (any level).
    pub const fn is_translation_fault(self) -> bool {
        matches!(self.kind(), FaultKind::Translation)
    }

    /// Whether this is an access flag fault (any level).
    pub const fn is_access_flag_fault(self) -> bool {
        matches!(self.kind(), FaultKind::AccessFlag)
    }
}

/// ISS of a data abort (EC 0x24/0x25; Arm ARM D24.2.41, "ISS encoding for an
/// exception from a Data Abort"). `size`, `sse`, `srt`, `sf` and `ar` are
/// meaningful only when `isv` is set (they are RES0 otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataAbort {
    /// Taken without a change of exception level (EC 0x25) rather than from a
    /// lower one (EC 0x24).
    pub same_el: bool,
    /// IL: the faulting instruction is 32 bits (always for A64).
    pub il: bool,
    /// ISV, bit 24: bits `[23:14]` hold a valid instruction syndrome.
    pub isv: bool,
    /// Access size in bytes (1, 2, 4 or 8), from SAS, bits `[23:22]`.
    pub size: u8,
    /// SSE, bit 21: the load sign-extends.
    pub sse: bool,
    /// SRT, bits `[20:16]`: the transfer register Rt (0..=31; 31 is XZR/WZR).
    pub srt: u8,
    /// SF, bit 15: Rt is a 64-bit (X) register rather than a W register.
    pub sf: bool,
    /// AR, bit 14: acquire/release semantics.
    pub ar: bool,
    /// VNCR, bit 13: the fault came from a VNCR_EL2 access.
    pub vncr: bool,
    /// FnV, bit 10: FAR is not valid.
    pub fnv: bool,
    /// EA, bit 9: external abort type (IMPLEMENTATION DEFINED).
    pub ea: bool,
    /// CM, bit 8: caused by a cache maintenance or address translation
    /// instruction.
    pub cm: bool,
    /// S1PTW, bit 7: stage-2 fault on a stage-1 translation table walk.
    pub s1ptw: bool,
    /// WnR, bit 6: the access was a write.
    pub wnr: bool,
    /// DFSC, bits `[5:0]`.
    pub dfsc: FaultStatus,
}

impl DataAbort {
    /// Decodes the ISS of a data abort.
    pub const fn from_iss(iss: u32, same_el: bool, il: bool) -> Self {
        DataAbort {
            same_el,
            il,
            isv: iss & (1 << 24) != 0,
            size: 1 << ((iss >> 22) & 3),
            sse: iss & (1 << 21) != 0,
            srt: ((iss >> 16) & 0x1f) as u8,
            sf: iss & (1 << 15) != 0,
            ar: iss & (1 << 14) != 0,
            vncr: iss & (1 << 13) != 0,
            fnv: iss & (1 << 10) != 0,
            ea: iss & (1 << 9) != 0,
            cm: iss & (1 << 8) != 0,
            s1ptw: iss & (1 << 7) != 0,
            wnr: iss & (1 << 6) != 0,
            dfsc: FaultStatus((iss & 0x3f) as u8),
        }
    }

    /// Encodes this abort as an ESR value (inverse of [`decode`]). A `size`
    /// that is not 1, 2, 4 or 8 is encoded as the next smaller power of two
    /// (at most 8; 0 as 1).
    pub const fn to_esr(&self) -> u64 {
        let sas = match self.size {
            0..=1 => 0,
            2..=3 => 1,
            4..=7 => 2,
            _ => 3,
        };
        let iss = (self.isv as u32) << 24
            | sas << 22
            | (self.sse as u32) << 21
            | ((self.srt as u32) & 0x1f) << 16
            | (self.sf as u32) << 15
            | (self.ar as u32) << 14
            | (self.vncr as u32) << 13
            | (self.fnv as u32) << 10
            | (self.ea as u32) << 9
            | (self.cm as u32) << 8
            | (self.s1ptw as u32) << 7
            | (self.wnr as u32) << 6
            | self.dfsc.code() as u32;
        let ec = if self.same_el {
            ExceptionClass::DataAbortSame
        } else {
            ExceptionClass::DataAbortLower
        };
        encode(ec, self.il, iss)
    }
}

/// ISS of an instruction abort (EC 0x20/0x21; Arm ARM D24.2.41, "ISS encoding
/// for an exception from an Instruction Abort").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstrAbort {
    /// Taken without a change of exception level (EC 0x21).
    pub same_el: bool,
    /// FnV, bit 10: FAR is not valid.
    pub fnv: bool,
    /// EA, bit 9: external abort type.
    pub ea: bool,
    /// S1PTW, bit 7: stage-2 fault on a stage-1 translation table walk.
    pub s1ptw: bool,
    /// IFSC, bits `[5:0]`.
    pub ifsc: FaultStatus,
}

/// A trapped `MRS`/`MSR` (EC 0x18; Arm ARM D24.2.41, "ISS encoding for an
/// exception from MSR, MRS, or System instruction execution in AArch64
/// state"): Op0 `[21:20]`, Op2 `[19:17]`, Op1 `[16:14]`, CRn `[13:10]`, Rt `[9:5]`,
/// CRm `[4:1]`, Direction (bit 0; 1 = read, i.e. `MRS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SysRegAccess {
    /// The register, from (op0, op1, CRn, CRm, op2).
    pub reg: SysReg,
    /// The general-purpose register Rt (0..=31; 31 is XZR).
    pub rt: u8,
    /// `MRS` (read into Rt) rather than `MSR` (write from Rt).
    pub read: bool,
}

impl SysRegAccess {
    /// Decodes the ISS of a trapped system-register access.
    pub const fn from_iss(iss: u32) -> Self {
        let op0 = ((iss >> 20) & 3) as u8;
        let op2 = ((iss >> 17) & 7) as u8;
        let op1 = ((iss >> 14) & 7) as u8;
        let crn = ((iss >> 10) & 0xf) as u8;
        let crm = ((iss >> 1) & 0xf) as u8;
        SysRegAccess {
            reg: SysReg::new(op0, op1, crn, crm, op2),
            rt: ((iss >> 5) & 0x1f) as u8,
            read: iss & 1 != 0,
        }
    }

    /// The ISS encoding of this access.
    pub const fn to_iss(&self) -> u32 {
        let (op0, op1, crn, crm, op2) = self.reg.fields();
        (op0 as u32) << 20
            | (op2 as u32) << 17
            | (op1 as u32) << 14
            | (crn as u32) << 10
            | ((self.rt as u32) & 0x1f) << 5
            | (crm as u32) << 1
            | self.read as u32
    }
}

/// A decoded exception syndrome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syndrome {
    /// Data abort (EC 0x24/0x25).
    DataAbort(DataAbort),
    /// Instruction abort (EC 0x20/0x21).
    InstrAbort(InstrAbort),
    /// Trapped `MRS`/`MSR` (EC 0x18).
    SysReg(SysRegAccess),
    /// `HVC #imm` (EC 0x16). The preferred return address is the next
    /// instruction: PC needs no adjustment.
    Hvc {
        /// ISS bits `[15:0]`.
        imm: u16,
    },
    /// Trapped `SMC #imm` (EC 0x17). Unlike HVC, ELR points at the SMC
    /// itself: the handler must advance PC by 4.
    Smc {
        /// ISS bits `[15:0]`.
        imm: u16,
    },
    /// `SVC #imm` (EC 0x15); the return address is the next instruction.
    Svc {
        /// ISS bits `[15:0]`.
        imm: u16,
    },
    /// `BRK #imm` (EC 0x3C); ELR points at the BRK.
    Brk {
        /// ISS bits `[15:0]` (the comment field).
        imm: u16,
    },
    /// Trapped WFI/WFE/WFIT/WFET (EC 0x01; ISS: TI `[1:0]`, RV (bit 2), Rn `[9:5]`).
    Wfx {
        /// TI bit 0: WFE(T) rather than WFI(T).
        wfe: bool,
        /// TI bit 1: the timeout form (WFIT/WFET, FEAT_WFxT).
        timeout: bool,
        /// Rn holding the timeout, when RV (bit 2) is set.
        rn: Option<u8>,
    },
    /// Any other class, undecoded.
    Other {
        /// The exception class.
        ec: ExceptionClass,
        /// The 25-bit ISS.
        iss: u32,
        /// IL, bit 25.
        il: bool,
    },
}

/// Decodes an ESR_EL2 or ESR_EL1 value. Never fails; classes this module does
/// not decode become [`Syndrome::Other`].
pub fn decode(esr: u64) -> Syndrome {
    let ec = ExceptionClass::of(esr);
    let il = esr & IL_BIT != 0;
    let iss = (esr & ISS_MASK) as u32;
    let imm = (iss & 0xffff) as u16;
    match ec {
        ExceptionClass::DataAbortLower | ExceptionClass::DataAbortSame => Syndrome::DataAbort(
            DataAbort::from_iss(iss, ec == ExceptionClass::DataAbortSame, il),
        ),
        ExceptionClass::InstrAbortLower | ExceptionClass::InstrAbortSame => {
            Syndrome::InstrAbort(InstrAbort {
                same_el: ec == ExceptionClass::InstrAbortSame,
                fnv: iss & (1 << 10) != 0,
                ea: iss & (1 << 9) != 0,
                s1ptw: iss & (1 << 7) != 0,
                ifsc: FaultStatus((iss & 0x3f) as u8),
            })
        }
        ExceptionClass::SysReg => Syndrome::SysReg(SysRegAccess::from_iss(iss)),
        ExceptionClass::Hvc64 => Syndrome::Hvc { imm },
        ExceptionClass::Smc64 => Syndrome::Smc { imm },
        ExceptionClass::Svc64 => Syndrome::Svc { imm },
        ExceptionClass::Brk => Syndrome::Brk { imm },
        ExceptionClass::Wfx => Syndrome::Wfx {
            wfe: iss & 1 != 0,
            timeout: iss & 2 != 0,
            rn: if iss & 4 != 0 {
                Some(((iss >> 5) & 0x1f) as u8)
            } else {
                None
            },
        },
        _ => Syndrome::Other { ec, iss, il },
    }
}

/// Builds an ESR value from its class, IL and ISS (ISS is masked to 25 bits).
pub const fn encode(ec: ExceptionClass, il: bool, iss: u32) -> u64 {
    ((ec.code() as u64) << EC_SHIFT) | if il { IL_BIT } else { 0 } | (iss as u64 & ISS_MASK)
}

/// ESR of a data abort to inject into an A64 guest: ISV = 0 (no instruction
/// syndrome), IL = 1 (as the Arm ARM requires when ISV is 0), WnR and DFSC
/// (6 bits, e.g. [`FSC_TRANSLATION`]` | level`) as given. `same_el` selects EC
/// 0x25 (fault at EL1) over 0x24 (fault at EL0).
pub const fn data_abort_esr(same_el: bool, wnr: bool, dfsc: u8) -> u64 {
    let ec = if same_el {
        ExceptionClass::DataAbortSame
    } else {
        ExceptionClass::DataAbortLower
    };
    encode(ec, true, (wnr as u32) << 6 | (dfsc as u32 & 0x3f))
}

/// ESR of an instruction abort to inject: IL = 1, IFSC (6 bits) as given;
/// `same_el` selects EC 0x21 over 0x20.
pub const fn instr_abort_esr(same_el: bool, ifsc: u8) -> u64 {
    let ec = if same_el {
        ExceptionClass::InstrAbortSame
    } else {
        ExceptionClass::InstrAbortLower
    };
    encode(ec, true, ifsc as u32 & 0x3f)
}

/// ESR of `SVC #imm` from AArch64 state.
pub const fn svc_esr(imm: u16) -> u64 {
    encode(ExceptionClass::Svc64, true, imm as u32)
}

/// ESR of `HVC #imm` from AArch64 state.
pub const fn hvc_esr(imm: u16) -> u64 {
    encode(ExceptionClass::Hvc64, true, imm as u32)
}

/// ESR of a trapped `SMC #imm` from AArch64 state.
pub const fn smc_esr(imm: u16) -> u64 {
    encode(ExceptionClass::Smc64, true, imm as u32)
}

/// IFSC/DFSC of a debug exception.
pub const FSC_DEBUG: u8 = 0b10_0010;

/// ESR of a breakpoint exception (Arm ARM D2.9): IL 1, IFSC = debug;
/// `same_el` selects EC 0x31 over 0x30.
pub const fn breakpoint_esr(same_el: bool) -> u64 {
    let ec = if same_el {
        ExceptionClass::BreakpointSame
    } else {
        ExceptionClass::BreakpointLower
    };
    encode(ec, true, FSC_DEBUG as u32)
}

/// ESR of a software step exception taken after stepping an instruction
/// (Arm ARM D2.12): IL 1, ISV 1, EX as given (the stepped instruction was a
/// load-exclusive), IFSC = debug; `same_el` selects EC 0x33 over 0x32.
pub const fn software_step_esr(same_el: bool, ex: bool) -> u64 {
    let ec = if same_el {
        ExceptionClass::SoftwareStepSame
    } else {
        ExceptionClass::SoftwareStepLower
    };
    encode(ec, true, 1 << 24 | (ex as u32) << 6 | FSC_DEBUG as u32)
}

/// ESR of a software step exception taken before any instruction was
/// stepped (Arm ARM D2.12: active-pending on unmasking debug exceptions or
/// on entering an exception handler): IL 1, ISV 0 (EX not valid), IFSC =
/// debug; `same_el` selects EC 0x33 over 0x32.
pub const fn software_step_pending_esr(same_el: bool) -> u64 {
    let ec = if same_el {
        ExceptionClass::SoftwareStepSame
    } else {
        ExceptionClass::SoftwareStepLower
    };
    encode(ec, true, FSC_DEBUG as u32)
}

/// ESR of a watchpoint exception (Arm ARM D2.10): IL 1, WnR (bit 6) set
/// for a store, DFSC = debug; `same_el` selects EC 0x35 over 0x34.
pub const fn watchpoint_esr(same_el: bool, wnr: bool) -> u64 {
    let ec = if same_el {
        ExceptionClass::WatchpointSame
    } else {
        ExceptionClass::WatchpointLower
    };
    encode(ec, true, (wnr as u32) << 6 | FSC_DEBUG as u32)
}

/// ESR of `BRK #imm`.
pub const fn brk_esr(imm: u16) -> u64 {
    encode(ExceptionClass::Brk, true, imm as u32)
}

/// ESR of an exception with an unknown reason (an UNDEFINED instruction):
/// EC 0, IL 1, ISS 0.
pub const fn unknown_esr() -> u64 {
    encode(ExceptionClass::Unknown, true, 0)
}

/// ESR of a PC alignment fault (EC 0x22, IL 1).
pub const fn pc_align_esr() -> u64 {
    encode(ExceptionClass::PcAlign, true, 0)
}

/// ESR of an SP alignment fault (EC 0x26, IL 1).
pub const fn sp_align_esr() -> u64 {
    encode(ExceptionClass::SpAlign, true, 0)
}

/// ESR of a trapped `MRS`/`MSR` (EC 0x18, IL 1).
pub const fn sysreg_esr(access: SysRegAccess) -> u64 {
    encode(ExceptionClass::SysReg, true, access.to_iss())
}

/// ESR of a trapped WFI (`wfe` false) or WFE (EC 0x01, IL 1, TI as given).
pub const fn wfx_esr(wfe: bool) -> u64 {
    encode(ExceptionClass::Wfx, true, wfe as u32)
}

/// Sign- or zero-extends a `size_bytes`-byte little-endian load result as the
/// load instruction would write it to Rt: sign-extended from the access size
/// when `sse`, then truncated to 32 bits (upper half zero) unless `sf`.
/// `value`'s bits above the access size are ignored. Sizes of 8 or more are
/// treated as 8; size 0 yields 0.
pub const fn extend(value: u64, size_bytes: u8, sse: bool, sf: bool) -> u64 {
    let v = if size_bytes >= 8 {
        value
    } else if size_bytes == 0 {
        0
    } else {
        let bits = size_bytes as u32 * 8;
        let v = value & ((1u64 << bits) - 1);
        if sse {
            let shift = 64 - bits;
            (((v << shift) as i64) >> shift) as u64
        } else {
            v
        }
    };
    if sf {
        v
    } else {
        v & 0xffff_ffff
    }
}

#[cfg(test)]
mod tests;
