//! A64 instruction decoding the backend needs: the effective address of a
//! load/store (for a precise FAR, quirk 14, and to emulate trapped MMIO), and
//! the immediates of SVC/HVC/SMC/BRK (unicorn reports no syndrome, quirk 2).
//! Encodings from Arm ARM C4.1 ("Loads and Stores") and C6.2.

/// Width and signedness of a load's destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Store.
    Store,
    /// Load, zero-extended into a W (`dst64 = false`) or X register.
    Load {
        /// Sign-extend the loaded value.
        signed: bool,
        /// The destination is an X register (else W: upper 32 bits cleared).
        dst64: bool,
    },
    /// Prefetch (no architectural access).
    Prefetch,
}

/// Addressing mode of a load/store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addr {
    /// `[Xn|SP, #imm]` (also no-offset forms).
    Offset(i64),
    /// `[Xn|SP, #imm]!`: address Xn+imm, Xn updated.
    PreIndex(i64),
    /// `[Xn|SP], #imm`: address Xn, then Xn += imm.
    PostIndex(i64),
    /// `[Xn|SP, Rm{, extend {#amount}}]`.
    Register {
        /// Index register (31 is XZR).
        rm: u8,
        /// The `option` field: 0b010 UXTW, 0b011 LSL/UXTX, 0b110 SXTW, 0b111 SXTX.
        option: u8,
        /// Left shift applied after extension.
        shift: u8,
    },
    /// PC-relative literal: address PC + imm.
    Literal(i64),
}

/// A decoded load or store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LdSt {
    /// Load, store or prefetch.
    pub kind: Kind,
    /// Bytes per register transferred (0 if variable, e.g. SIMD structures).
    pub size: u8,
    /// Transfer register.
    pub rt: u8,
    /// Second transfer register of a pair.
    pub rt2: Option<u8>,
    /// Base register (31 is SP); unused for literals.
    pub rn: u8,
    /// Addressing mode.
    pub addr: Addr,
    /// The transfer registers are SIMD&FP registers.
    pub simd: bool,
    /// Exclusive, acquire/release or atomic access.
    pub special: bool,
}

impl LdSt {
    /// Whether the backend can emulate this access on device memory: a
    /// general-purpose single or pair load/store without exclusivity.
    pub fn emulatable(&self) -> bool {
        !self.simd && !self.special && self.size != 0
    }

    /// Effective address and base write-back, given a reader of X registers
    /// (`x(31)` must return SP for the base; index registers treat 31 as
    /// XZR, which this function handles) and the instruction's PC.
    pub fn address(&self, x: impl Fn(u8) -> u64, pc: u64) -> (u64, Option<u64>) {
        let base = x(self.rn);
        match self.addr {
            Addr::Offset(imm) => (base.wrapping_add_signed(imm), None),
            Addr::PreIndex(imm) => {
                let a = base.wrapping_add_signed(imm);
                (a, Some(a))
            }
            Addr::PostIndex(imm) => (base, Some(base.wrapping_add_signed(imm))),
            Addr::Register { rm, option, shift } => {
                let m = if rm == 31 { 0 } else { x(rm) };
                let ext = match option {
                    0b010 => m & 0xffff_ffff,
                    0b110 => m as u32 as i32 as i64 as u64,
                    _ => m,
                };
                (base.wrapping_add(ext << shift), None)
            }
            Addr::Literal(imm) => (pc.wrapping_add_signed(imm), None),
        }
    }
}

fn bits(insn: u32, lo: u32, len: u32) -> u32 {
    (insn >> lo) & ((1 << len) - 1)
}

fn sext(v: u32, len: u32) -> i64 {
    let shift = 64 - len;
    ((u64::from(v) << shift) as i64) >> shift
}

/// Decodes a load/store instruction; `None` for anything else.
pub fn decode_ldst(insn: u32) -> Option<LdSt> {
    // Loads and stores: op0 bits x1x0 at [28:25].
    if insn & 0x0a00_0000 != 0x0800_0000 {
        return None;
    }
    let rt = bits(insn, 0, 5) as u8;
    let rn = bits(insn, 5, 5) as u8;
    let v = insn & (1 << 26) != 0;
    let size_field = bits(insn, 30, 2);

    match bits(insn, 27, 3) {
        // [29:27] = 0b001: exclusive / ordered (bit 24 = 0), or LDAPR etc.
        0b001 if bits(insn, 24, 2) == 0 && !v => {
            let load = insn & (1 << 22) != 0;
            let pair = insn & (1 << 21) != 0 && insn & (1 << 23) == 0;
            Some(LdSt {
                kind: if load {
                    Kind::Load {
                        signed: false,
                        dst64: size_field == 3,
                    }
                } else {
                    Kind::Store
                },
                size: 1 << size_field,
                rt,
                rt2: pair.then(|| bits(insn, 10, 5) as u8),
                rn,
                addr: Addr::Offset(0),
                simd: false,
                special: true,
            })
        }
        // SIMD load/store multiple / single structure: [31] = 0, [29:24] = 0b001100/0b001101.
        0b001 if v && insn & (1 << 31) == 0 && bits(insn, 24, 2) == 0 => Some(LdSt {
            kind: if insn & (1 << 22) != 0 {
                Kind::Load {
                    signed: false,
                    dst64: true,
                }
            } else {
                Kind::Store
            },
            size: 0,
            rt,
            rt2: None,
            rn,
            addr: Addr::Offset(0),
            simd: true,
            special: false,
        }),
        // Load register (literal): [29:27] = 0b011, [25:24] = 0b00.
        0b011 if bits(insn, 24, 2) == 0 => {
            let opc = size_field;
            let imm = sext(bits(insn, 5, 19), 19) * 4;
            let (kind, size) = if v {
                match opc {
                    0 => (load(false, true), 4),
                    1 => (load(false, true), 8),
                    2 => (load(false, true), 16),
                    _ => return None,
                }
            } else {
                match opc {
                    0 => (load(false, false), 4),
                    1 => (load(false, true), 8),
                    2 => (load(true, true), 4),
                    _ => (Kind::Prefetch, 0),
                }
            };
            Some(LdSt {
                kind,
                size,
                rt,
                rt2: None,
                rn: 31,
                addr: Addr::Literal(imm),
                simd: v,
                special: false,
            })
        }
        // Load/store pair: [29:27] = 0b101.
        0b101 => {
            let opc = size_field;
            let is_load = insn & (1 << 22) != 0;
            let (size, signed) = if v {
                match opc {
                    0 => (4, false),
                    1 => (8, false),
                    2 => (16, false),
                    _ => return None,
                }
            } else {
                match opc {
                    0 => (4, false),
                    1 if is_load => (4, true), // LDPSW
                    2 => (8, false),
                    _ => return None, // STGP and reserved
                }
            };
            let imm = sext(bits(insn, 15, 7), 7) * i64::from(size);
            let addr = match bits(insn, 23, 2) {
                0b01 => Addr::PostIndex(imm),
                0b11 => Addr::PreIndex(imm),
                _ => Addr::Offset(imm),
            };
            Some(LdSt {
                kind: if is_load {
                    load(signed, v || signed || size == 8)
                } else {
                    Kind::Store
                },
                size,
                rt,
                rt2: Some(bits(insn, 10, 5) as u8),
                rn,
                addr,
                simd: v,
                special: false,
            })
        }
        // Load/store register: [29:27] = 0b111.
        0b111 => {
            let opc = bits(insn, 22, 2);
            let (kind, size) = reg_kind(size_field, opc, v)?;
            let scale = size.trailing_zeros();
            let addr = if insn & (1 << 24) != 0 {
                Addr::Offset(i64::from(bits(insn, 10, 12)) << scale)
            } else if insn & (1 << 21) == 0 {
                let imm = sext(bits(insn, 12, 9), 9);
                match bits(insn, 10, 2) {
                    0b01 => Addr::PostIndex(imm),
                    0b11 => Addr::PreIndex(imm),
                    _ => Addr::Offset(imm), // unscaled or unprivileged
                }
            } else {
                match bits(insn, 10, 2) {
                    0b10 => {
                        let option = bits(insn, 13, 3) as u8;
                        if option & 0b010 == 0 {
                            return None;
                        }
                        let s = insn & (1 << 12) != 0;
                        Addr::Register {
                            rm: bits(insn, 16, 5) as u8,
                            option,
                            shift: if s { scale as u8 } else { 0 },
                        }
                    }
                    0b00 => {
                        // Atomic memory operations (FEAT_LSE): address Xn.
                        return Some(LdSt {
                            kind: Kind::Load {
                                signed: false,
                                dst64: size_field == 3,
                            },
                            size: 1 << size_field,
                            rt,
                            rt2: None,
                            rn,
                            addr: Addr::Offset(0),
                            simd: v,
                            special: true,
                        });
                    }
                    _ => return None, // pointer authentication loads
                }
            };
            Some(LdSt {
                kind,
                size,
                rt,
                rt2: None,
                rn,
                addr,
                simd: v,
                special: false,
            })
        }
        _ => None,
    }
}

fn load(signed: bool, dst64: bool) -> Kind {
    Kind::Load { signed, dst64 }
}

/// Kind and size of "load/store register" from size, opc and V.
fn reg_kind(size: u32, opc: u32, v: bool) -> Option<(Kind, u8)> {
    let bytes = 1u8 << size;
    if v {
        return match (size, opc) {
            (_, 0) => Some((Kind::Store, bytes)),
            (_, 1) => Some((load(false, true), bytes)),
            (0, 2) => Some((Kind::Store, 16)),
            (0, 3) => Some((load(false, true), 16)),
            _ => None,
        };
    }
    match (size, opc) {
        (_, 0) => Some((Kind::Store, bytes)),
        (_, 1) => Some((load(false, size == 3), bytes)),
        (3, 2) => Some((Kind::Prefetch, 8)),
        (2, 2) => Some((load(true, true), 4)), // LDRSW
        (0 | 1, 2) => Some((load(true, true), bytes)),
        (0 | 1, 3) => Some((load(true, false), bytes)),
        _ => None,
    }
}

/// Exception-generating instructions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exc {
    /// `SVC #imm`.
    Svc(u16),
    /// `HVC #imm`.
    Hvc(u16),
    /// `SMC #imm`.
    Smc(u16),
    /// `BRK #imm`.
    Brk(u16),
}

/// Decodes SVC/HVC/SMC/BRK (C6.2: `11010100 opc:3 imm16 op2:3 LL:2`).
pub fn decode_exc(insn: u32) -> Option<Exc> {
    if insn & 0xff00_0000 != 0xd400_0000 || bits(insn, 2, 3) != 0 {
        return None;
    }
    let imm = bits(insn, 5, 16) as u16;
    match (bits(insn, 21, 3), bits(insn, 0, 2)) {
        (0, 1) => Some(Exc::Svc(imm)),
        (0, 2) => Some(Exc::Hvc(imm)),
        (0, 3) => Some(Exc::Smc(imm)),
        (1, 0) => Some(Exc::Brk(imm)),
        _ => None,
    }
}

/// `WFI`.
pub const WFI: u32 = 0xd503_207f;
/// `WFE`.
pub const WFE: u32 = 0xd503_205f;
/// `YIELD`.
pub const YIELD: u32 = 0xd503_203f;

#[cfg(test)]
mod tests {
    use super::*;

    fn regs(n: u8) -> u64 {
        match n {
            31 => 0x8000, // SP
            r => 0x1000 * u64::from(r),
        }
    }

    fn addr(insn: u32) -> (u64, Option<u64>) {
        decode_ldst(insn).unwrap().address(regs, 0x4000_0000)
    }

    #[test]
    fn single_register_forms() {
        // ldr x0, [x1, #8]
        let d = decode_ldst(0xf940_0420).unwrap();
        assert_eq!(d.kind, load(false, true));
        assert_eq!((d.size, d.rt, d.rn), (8, 0, 1));
        assert_eq!(addr(0xf940_0420), (0x1008, None));
        // strb w2, [x3]
        let d = decode_ldst(0x3900_0062).unwrap();
        assert_eq!((d.kind, d.size, d.rt), (Kind::Store, 1, 2));
        // ldrsh w4, [x5, #2]  (dst W, signed)
        let d = decode_ldst(0x79c0_04a4).unwrap();
        assert_eq!((d.kind, d.size), (load(true, false), 2));
        assert_eq!(addr(0x79c0_04a4).0, 0x5002);
        // ldrsb x6, [x7]
        let d = decode_ldst(0x3980_00e6).unwrap();
        assert_eq!((d.kind, d.size), (load(true, true), 1));
        // ldrsw x8, [x9, #4]
        let d = decode_ldst(0xb980_0528).unwrap();
        assert_eq!((d.kind, d.size), (load(true, true), 4));
        // ldr w10, [x11, #-4]!
        let d = decode_ldst(0xb85f_cd6a).unwrap();
        assert_eq!(d.addr, Addr::PreIndex(-4));
        assert_eq!(addr(0xb85f_cd6a), (0xb000 - 4, Some(0xb000 - 4)));
        // str x12, [sp], #16
        assert_eq!(addr(0xf801_07ec), (0x8000, Some(0x8010)));
        // ldur w13, [x14, #-3]
        assert_eq!(addr(0xb85f_d1cd), (0xe000 - 3, None));
        // ldtr x15, [x16, #8]
        assert_eq!(addr(0xf840_8a0f), (0x10008, None));
        // ldrh w0, [x1, x2, lsl #1]
        let d = decode_ldst(0x7862_7820).unwrap();
        assert_eq!((d.kind, d.size), (load(false, false), 2));
        assert_eq!(addr(0x7862_7820).0, 0x1000 + 0x4000);
        // ldr x0, [x1, w2, sxtw]  (w2 = 0x2000 here)
        assert_eq!(addr(0xf862_c820).0, 0x3000);
        // ldr x0, [x1, xzr]
        assert_eq!(addr(0xf87f_6820).0, 0x1000);
        // prfm pldl1keep, [x0]
        assert_eq!(decode_ldst(0xf980_0000).unwrap().kind, Kind::Prefetch);
    }

    #[test]
    fn literal_pair_simd_and_exclusive() {
        // ldr x1, .+8
        let d = decode_ldst(0x5800_0041).unwrap();
        assert_eq!(d.addr, Addr::Literal(8));
        assert_eq!(addr(0x5800_0041).0, 0x4000_0008);
        // ldp x1, x2, [x3, #16]
        let d = decode_ldst(0xa941_0861).unwrap();
        assert_eq!((d.size, d.rt, d.rt2), (8, 1, Some(2)));
        assert_eq!(addr(0xa941_0861), (0x3010, None));
        // stp w4, w5, [sp, #-8]!
        let d = decode_ldst(0x29bf_17e4).unwrap();
        assert_eq!((d.kind, d.size), (Kind::Store, 4));
        assert_eq!(addr(0x29bf_17e4), (0x7ff8, Some(0x7ff8)));
        // ldpsw x0, x1, [x2], #8
        let d = decode_ldst(0x68c1_0440).unwrap();
        assert_eq!((d.kind, d.size), (load(true, true), 4));
        assert_eq!(addr(0x68c1_0440), (0x2000, Some(0x2008)));
        // ldr q0, [x1, #32]
        let d = decode_ldst(0x3dc0_0820).unwrap();
        assert!(d.simd && !d.emulatable());
        assert_eq!((d.size, addr(0x3dc0_0820).0), (16, 0x1020));
        // ld1 {v0.16b}, [x1]
        let d = decode_ldst(0x4c40_7020).unwrap();
        assert!(d.simd);
        assert_eq!(addr(0x4c40_7020).0, 0x1000);
        // ldxr x0, [x1]
        let d = decode_ldst(0xc85f_7c20).unwrap();
        assert!(d.special && !d.emulatable());
        assert_eq!(addr(0xc85f_7c20).0, 0x1000);
        // stlr w0, [x1]
        assert!(decode_ldst(0x889f_fc20).unwrap().special);
        // Not a load/store: add x0, x0, #1; mrs x0, tpidr_el1
        assert!(decode_ldst(0x9100_0400).is_none());
        assert!(decode_ldst(0xd538_d080).is_none());
    }

    #[test]
    fn exception_generating() {
        assert_eq!(decode_exc(0xd400_00e1), Some(Exc::Svc(7)));
        assert_eq!(decode_exc(0xd400_00a2), Some(Exc::Hvc(5)));
        assert_eq!(decode_exc(0xd400_0003), Some(Exc::Smc(0)));
        assert_eq!(
            decode_exc(0xd420_0000 | (0x800 << 5)),
            Some(Exc::Brk(0x800))
        );
        assert_eq!(decode_exc(WFI), None);
    }
}
