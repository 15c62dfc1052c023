//! Distributor and redistributor MMIO, decoded through the tables in
//! [`super::regs`].

use super::regs::{self, waker, BitOp, Kind, Reg, DIST_REGS, ID_REGS, RD_REGS, SGI_REGS};
use super::{mpidr, Gicv3, IrqState, INTID_END, PRIORITY_MASK, PRIVATE_IRQS, SGIS, SPI_BASE_INTID};
use crate::arch::layout::GICR_STRIDE;
use crate::devices::{le_value, set_le_value, AccessError};

/// Size of one redistributor frame (RD_base, then SGI_base).
const GICR_FRAME: u64 = 0x1_0000;

/// The frame an access falls in, with its redistributor's vCPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Frame {
    /// GICD: per-INTID registers address SPIs.
    Dist,
    /// A redistributor's RD_base frame.
    Rd(usize),
    /// A redistributor's SGI_base frame: per-INTID registers address that
    /// vCPU's SGIs and PPIs.
    Sgi(usize),
}

impl Gicv3 {
    /// A guest load of `data.len()` bytes (little-endian) at `offset` in the
    /// distributor frame. Reserved offsets answer [`AccessError::NoRegister`]
    /// with `data` zeroed; widths a register does not allow answer
    /// [`AccessError::Size`], misaligned accesses [`AccessError::Alignment`].
    pub fn dist_read(&mut self, offset: u64, data: &mut [u8]) -> Result<(), AccessError> {
        self.read(Frame::Dist, DIST_REGS, offset, data)
    }

    /// A guest store at `offset` in the distributor frame; errors as for
    /// [`Gicv3::dist_read`], plus [`AccessError::ReadOnly`] for read-only
    /// registers (the write is ignored).
    pub fn dist_write(&mut self, offset: u64, data: &[u8]) -> Result<(), AccessError> {
        self.write(Frame::Dist, DIST_REGS, offset, data)
    }

    /// A guest load at `offset` in the redistributor region: vCPU
    /// `offset / GICR_STRIDE`, RD_base frame in its first 64 KiB, SGI_base
    /// frame in the second. Frames of absent vCPUs answer
    /// [`AccessError::NoRegister`]. Errors as for [`Gicv3::dist_read`].
    pub fn redist_read(&mut self, offset: u64, data: &mut [u8]) -> Result<(), AccessError> {
        data.fill(0);
        let (frame, table, offset) = self.redist_frame(offset)?;
        self.read(frame, table, offset, data)
    }

    /// A guest store in the redistributor region, as for
    /// [`Gicv3::redist_read`] and [`Gicv3::dist_write`].
    pub fn redist_write(&mut self, offset: u64, data: &[u8]) -> Result<(), AccessError> {
        let (frame, table, offset) = self.redist_frame(offset)?;
        self.write(frame, table, offset, data)
    }

    /// The name of the distributor register at `offset` (e.g. for logging a
    /// refused access), if there is one.
    pub fn dist_register_name(offset: u64) -> Option<&'static str> {
        regs::lookup(DIST_REGS, offset).map(|r| r.name)
    }

    /// The name of the register at `offset` in a redistributor's 128 KiB
    /// (RD_base + SGI_base) frame pair, if there is one.
    pub fn redist_register_name(offset: u64) -> Option<&'static str> {
        let at = offset % GICR_STRIDE;
        if at < GICR_FRAME {
            regs::lookup(RD_REGS, at)
        } else {
            regs::lookup(SGI_REGS, at - GICR_FRAME)
        }
        .map(|r| r.name)
    }

    /// Splits a redistributor-region offset into frame, table and offset
    /// within the frame.
    fn redist_frame(&self, offset: u64) -> Result<(Frame, &'static [Reg], u64), AccessError> {
        let vcpu = offset / GICR_STRIDE;
        if vcpu >= self.vcpus() as u64 {
            return Err(AccessError::NoRegister);
        }
        let (v, at) = (vcpu as usize, offset % GICR_STRIDE);
        Ok(if at < GICR_FRAME {
            (Frame::Rd(v), RD_REGS, at)
        } else {
            (Frame::Sgi(v), SGI_REGS, at - GICR_FRAME)
        })
    }

    fn read(
        &mut self,
        frame: Frame,
        table: &'static [Reg],
        offset: u64,
        data: &mut [u8],
    ) -> Result<(), AccessError> {
        data.fill(0);
        let reg = decode(table, offset, data.len())?;
        let value = self.reg_read(frame, reg.kind, offset - reg.offset, data.len());
        set_le_value(data, value);
        Ok(())
    }

    fn write(
        &mut self,
        frame: Frame,
        table: &'static [Reg],
        offset: u64,
        data: &[u8],
    ) -> Result<(), AccessError> {
        let reg = decode(table, offset, data.len())?;
        self.reg_write(
            frame,
            reg.kind,
            offset - reg.offset,
            data.len(),
            le_value(data),
        )
    }

    /// Value of the register `kind`, `at` bytes into its array, for an
    /// access of `len` bytes (the caller truncates to `len`).
    fn reg_read(&self, frame: Frame, kind: Kind, at: u64, len: usize) -> u64 {
        match kind {
            Kind::Const(v) => v.into(),
            Kind::Id => ID_REGS.get((at / 4) as usize).copied().unwrap_or(0).into(),
            Kind::RazWi => 0,
            Kind::DistCtlr => {
                let mut v = regs::ctlr::ARE | regs::ctlr::DS;
                if self.s.enable_grp0 {
                    v |= regs::ctlr::ENABLE_GRP0;
                }
                if self.s.enable_grp1 {
                    v |= regs::ctlr::ENABLE_GRP1;
                }
                v.into()
            }
            Kind::Bits(op) => {
                let first = (at / 4 * 32) as u32;
                (0..32)
                    .filter(|&bit| {
                        self.bank_irq(frame, first + bit)
                            .is_some_and(|irq| match op {
                                BitOp::Group => irq.group1,
                                BitOp::SetEnable | BitOp::ClearEnable => irq.enabled,
                                BitOp::SetPending | BitOp::ClearPending => irq.is_pending(),
                                BitOp::SetActive | BitOp::ClearActive => irq.active,
                            })
                    })
                    .fold(0, |v, bit| v | 1 << bit)
            }
            Kind::Priority => (0..len as u32).fold(0, |v, i| {
                let prio = self
                    .bank_irq(frame, at as u32 + i)
                    .map_or(0, |irq| irq.priority);
                v | u64::from(prio) << (8 * i)
            }),
            Kind::Config => {
                let first = (at / 4 * 16) as u32;
                (0..16)
                    .filter(|&k| self.bank_irq(frame, first + k).is_some_and(|irq| irq.edge))
                    .fold(0, |v, k| v | 2 << (2 * k))
            }
            Kind::Router => self.router(at).map_or(0, |r| r >> (8 * (at % 8))),
            Kind::RedistTyper => match frame {
                Frame::Rd(v) => self.gicr_typer(v) >> (8 * (at % 8)),
                _ => 0,
            },
            Kind::Waker => match frame {
                Frame::Rd(v) if self.s.redists[v].processor_sleep => {
                    (waker::PROCESSOR_SLEEP | waker::CHILDREN_ASLEEP).into()
                }
                _ => 0,
            },
        }
    }

    /// Writes `value` (`len` bytes) to the register `kind`, `at` bytes into
    /// its array.
    fn reg_write(
        &mut self,
        frame: Frame,
        kind: Kind,
        at: u64,
        len: usize,
        value: u64,
    ) -> Result<(), AccessError> {
        match kind {
            Kind::Const(_) | Kind::Id | Kind::RedistTyper => return Err(AccessError::ReadOnly),
            Kind::RazWi => {}
            Kind::DistCtlr => {
                self.s.enable_grp0 = value & u64::from(regs::ctlr::ENABLE_GRP0) != 0;
                self.s.enable_grp1 = value & u64::from(regs::ctlr::ENABLE_GRP1) != 0;
            }
            Kind::Bits(op) => {
                let first = (at / 4 * 32) as u32;
                for bit in 0..32 {
                    let one = value >> bit & 1 != 0;
                    if let Some(irq) = self.bank_irq_mut(frame, first + bit) {
                        match op {
                            BitOp::Group => irq.group1 = one,
                            BitOp::SetEnable if one => irq.enabled = true,
                            BitOp::ClearEnable if one => irq.enabled = false,
                            BitOp::SetPending if one => irq.pending = true,
                            // A level-sensitive input still high keeps it pending.
                            BitOp::ClearPending if one => irq.pending = false,
                            BitOp::SetActive if one => irq.active = true,
                            BitOp::ClearActive if one => irq.active = false,
                            _ => {}
                        }
                    }
                }
            }
            Kind::Priority => {
                for i in 0..len as u32 {
                    if let Some(irq) = self.bank_irq_mut(frame, at as u32 + i) {
                        irq.priority = (value >> (8 * i)) as u8 & PRIORITY_MASK;
                    }
                }
            }
            Kind::Config => {
                let first = (at / 4 * 16) as u32;
                for k in 0..16 {
                    let intid = first + k;
                    // SGIs are always edge-triggered (ICFGR0 is read-only).
                    if intid < SGIS as u32 {
                        continue;
                    }
                    if let Some(irq) = self.bank_irq_mut(frame, intid) {
                        irq.edge = value >> (2 * k + 1) & 1 != 0;
                    }
                }
            }
            Kind::Router => {
                let intid = SPI_BASE_INTID as u64 + at / 8;
                if intid < u64::from(INTID_END) {
                    let spi = &mut self.s.spis[(intid - u64::from(SPI_BASE_INTID)) as usize];
                    let new = match (len, at % 8) {
                        (8, _) => value,
                        (_, 0) => spi.router & !0xFFFF_FFFF | value,
                        _ => spi.router & 0xFFFF_FFFF | value << 32,
                    };
                    spi.router = new & regs::irouter::MASK;
                }
            }
            Kind::Waker => {
                if let Frame::Rd(v) = frame {
                    self.s.redists[v].processor_sleep =
                        value & u64::from(waker::PROCESSOR_SLEEP) != 0;
                }
            }
        }
        Ok(())
    }

    /// The interrupt a per-INTID register of `frame` addresses as `intid`,
    /// if implemented there: SPIs in the distributor, SGIs and PPIs in an
    /// SGI_base frame.
    fn bank_irq(&self, frame: Frame, intid: u32) -> Option<&IrqState> {
        match frame {
            Frame::Dist if intid >= PRIVATE_IRQS as u32 => self.irq(0, intid),
            Frame::Sgi(v) if intid < PRIVATE_IRQS as u32 => self.irq(v, intid),
            _ => None,
        }
    }

    /// Mutable [`Gicv3::bank_irq`].
    fn bank_irq_mut(&mut self, frame: Frame, intid: u32) -> Option<&mut IrqState> {
        match frame {
            Frame::Dist if intid >= PRIVATE_IRQS as u32 => self.irq_mut(0, intid),
            Frame::Sgi(v) if intid < PRIVATE_IRQS as u32 => self.irq_mut(v, intid),
            _ => None,
        }
    }

    /// GICD_IROUTER of the SPI `at` bytes into the IROUTER array, if
    /// implemented.
    fn router(&self, at: u64) -> Option<u64> {
        let index = usize::try_from(at / 8).ok()?;
        self.s.spis.get(index).map(|spi| spi.router)
    }

    /// GICR_TYPER of vCPU `v`: Affinity_Value `[63:32]` from [`mpidr`],
    /// Processor_Number `[23:8]` = `v`, Last `[4]` on the last redistributor; no
    /// LPIs, no VLPIs, PPInum = 0 (16 PPIs).
    fn gicr_typer(&self, v: usize) -> u64 {
        let m = mpidr(v);
        // Aff2.Aff1.Aff0 are MPIDR bits [23:0]; Aff3 is MPIDR bits [39:32].
        let affinity = (m & 0xFF_FFFF) | (m >> 32 & 0xFF) << 24;
        let last = if v + 1 == self.vcpus() { 1 << 4 } else { 0 };
        affinity << 32 | (v as u64 & 0xFFFF) << 8 | last
    }
}

/// Finds the register at `offset` and checks the access width and alignment.
fn decode(table: &'static [Reg], offset: u64, len: usize) -> Result<&'static Reg, AccessError> {
    if !matches!(len, 1 | 2 | 4 | 8) {
        return Err(AccessError::Size);
    }
    let reg = regs::lookup(table, offset).ok_or(AccessError::NoRegister)?;
    if !reg.width.allows(len) {
        return Err(AccessError::Size);
    }
    if offset % len as u64 != 0 {
        return Err(AccessError::Alignment);
    }
    Ok(reg)
}
