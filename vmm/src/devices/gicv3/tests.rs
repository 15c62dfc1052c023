use super::*;
use crate::arch::layout::{GICD_BASE, GICD_SIZE, GICR_BASE, GICR_SIZE, GICR_STRIDE, VTIMER_INTID};
use crate::arch::sysreg::*;
use crate::devices::MmioBus;

/// Offset of the SGI_base frame within a redistributor.
const SGI: u64 = 0x1_0000;

fn dr(g: &mut Gicv3, off: u64) -> u32 {
    let mut d = [0u8; 4];
    g.dist_read(off, &mut d).unwrap();
    u32::from_le_bytes(d)
}

fn dw(g: &mut Gicv3, off: u64, v: u32) {
    g.dist_write(off, &v.to_le_bytes()).unwrap();
}

fn rr(g: &mut Gicv3, vcpu: usize, off: u64) -> u32 {
    let mut d = [0u8; 4];
    g.redist_read(vcpu as u64 * GICR_STRIDE + off, &mut d)
        .unwrap();
    u32::from_le_bytes(d)
}

fn rw(g: &mut Gicv3, vcpu: usize, off: u64, v: u32) {
    g.redist_write(vcpu as u64 * GICR_STRIDE + off, &v.to_le_bytes())
        .unwrap();
}

fn icc_r(g: &mut Gicv3, vcpu: usize, reg: SysReg) -> u64 {
    g.sysreg_read(vcpu, reg).unwrap()
}

fn icc_w(g: &mut Gicv3, vcpu: usize, reg: SysReg, value: u64) -> VcpuSet {
    g.sysreg_write(vcpu, reg, value).unwrap()
}

fn ack(g: &mut Gicv3, vcpu: usize) -> u32 {
    icc_r(g, vcpu, ICC_IAR1_EL1) as u32
}

fn eoi(g: &mut Gicv3, vcpu: usize, intid: u32) {
    icc_w(g, vcpu, ICC_EOIR1_EL1, intid.into());
}

fn rpr(g: &mut Gicv3, vcpu: usize) -> u64 {
    icc_r(g, vcpu, ICC_RPR_EL1)
}

/// Bit `intid % 32` of the distributor bit-array register at `base`.
fn dist_bit(g: &mut Gicv3, base: u64, intid: u32) -> bool {
    dr(g, base + 4 * u64::from(intid / 32)) >> (intid % 32) & 1 != 0
}

/// The state Linux's GICv3 driver leaves behind at boot: distributor enabled
/// (it writes ARE_NS | EnableGrp1 | EnableGrp0), every redistributor woken
/// through the GICR_WAKER handshake, PMR 0xF0, group 1 enabled.
fn booted(vcpus: usize) -> Gicv3 {
    let mut g = Gicv3::new(vcpus);
    dw(&mut g, 0x0000, 0x13);
    for v in 0..vcpus {
        rw(&mut g, v, 0x0014, 0);
        assert_eq!(rr(&mut g, v, 0x0014) & 0b100, 0, "ChildrenAsleep");
        icc_w(&mut g, v, ICC_PMR_EL1, 0xF0);
        icc_w(&mut g, v, ICC_IGRPEN1_EL1, 1);
    }
    g
}

/// Enables SPI `intid` with priority `prio` (byte write to IPRIORITYR).
fn enable_spi(g: &mut Gicv3, intid: u32, prio: u8) {
    dw(g, 0x0100 + 4 * u64::from(intid / 32), 1 << (intid % 32));
    g.dist_write(0x0400 + u64::from(intid), &[prio]).unwrap();
}

/// Enables SGI/PPI `intid` of `vcpu` with priority `prio`.
fn enable_private(g: &mut Gicv3, vcpu: usize, intid: u32, prio: u8) {
    rw(g, vcpu, SGI + 0x0100, 1 << intid);
    g.redist_write(
        vcpu as u64 * GICR_STRIDE + SGI + 0x0400 + u64::from(intid),
        &[prio],
    )
    .unwrap();
}

fn set_router(g: &mut Gicv3, intid: u32, value: u64) {
    g.dist_write(0x6000 + 8 * u64::from(intid), &value.to_le_bytes())
        .unwrap();
}

fn router(g: &mut Gicv3, intid: u32) -> u64 {
    let mut d = [0u8; 8];
    g.dist_read(0x6000 + 8 * u64::from(intid), &mut d).unwrap();
    u64::from_le_bytes(d)
}

#[test]
fn gicd_typer_iidr_ctlr_and_id_registers() {
    let mut g = Gicv3::new(2);
    let typer = dr(&mut g, 0x0004);
    assert_eq!(typer, 0x0078_0002);
    assert_eq!(((typer & 0x1F) + 1) * 32, 32 + NUM_SPIS, "ITLinesNumber");
    assert_eq!(typer >> 19 & 0x1F, 15, "IDbits: 16-bit INTIDs");
    assert_eq!(typer >> 16 & 0b111, 0, "no MBIS, LPIs or DVIS");
    assert_eq!(dr(&mut g, 0x0008), 0x43B, "GICD_IIDR");
    assert_eq!(dr(&mut g, 0x000C), 0, "GICD_TYPER2");
    let pidr2 = dr(&mut g, 0xFFE8);
    assert_eq!(pidr2, 0x3B);
    assert_eq!(pidr2 >> 4 & 0xF, 3, "ArchRev = GICv3");
    let cidr: Vec<u32> = (0..4).map(|i| dr(&mut g, 0xFFF0 + 4 * i)).collect();
    assert_eq!(cidr, [0x0D, 0xF0, 0x05, 0xB1]);

    // ARE and DS read as one; RWP as zero; only the group enables stick.
    assert_eq!(dr(&mut g, 0x0000), 0x50);
    dw(&mut g, 0x0000, 0xFFFF_FFFF);
    assert_eq!(dr(&mut g, 0x0000), 0x53);
    dw(&mut g, 0x0000, 0);
    assert_eq!(dr(&mut g, 0x0000), 0x50);

    assert_eq!(g.dist_write(0x0004, &[0; 4]), Err(AccessError::ReadOnly));
    assert_eq!(g.dist_write(0xFFE8, &[0; 4]), Err(AccessError::ReadOnly));
    assert_eq!(dr(&mut g, 0x0004), 0x0078_0002);

    for v in 0..2 {
        assert_eq!(rr(&mut g, v, 0x0004), 0x43B, "GICR_IIDR");
        assert_eq!(rr(&mut g, v, 0xFFE8), 0x3B, "GICR_PIDR2");
        assert_eq!(rr(&mut g, v, 0x0000), 0, "GICR_CTLR: RWP = 0, no LPIs");
    }
}

#[test]
fn gicr_typer_affinity_processor_number_and_last() {
    let mut g = Gicv3::new(3);
    for v in 0..3usize {
        let mut d = [0u8; 8];
        g.redist_read(v as u64 * GICR_STRIDE + 8, &mut d).unwrap();
        let typer = u64::from_le_bytes(d);
        let last = u64::from(v == 2) << 4;
        assert_eq!(typer, (v as u64) << 32 | (v as u64) << 8 | last, "vCPU {v}");
        // Linux matches Affinity_Value against Aff3.Aff2.Aff1.Aff0 of MPIDR.
        let m = mpidr(v);
        assert_eq!(m, 0x8000_0000 | v as u64);
        let aff = (m >> 32 & 0xFF) << 24 | (m & 0xFF_FFFF);
        assert_eq!(typer >> 32, aff);
        // The two 32-bit halves.
        assert_eq!(u64::from(rr(&mut g, v, 8)), typer & 0xFFFF_FFFF);
        assert_eq!(u64::from(rr(&mut g, v, 12)), typer >> 32);
        assert_eq!(
            g.redist_write(v as u64 * GICR_STRIDE + 8, &[0; 8]),
            Err(AccessError::ReadOnly)
        );
    }
    // No redistributor beyond the last vCPU.
    let mut d = [0xAAu8; 4];
    assert_eq!(
        g.redist_read(3 * GICR_STRIDE + 0xFFE8, &mut d),
        Err(AccessError::NoRegister)
    );
    assert_eq!(d, [0; 4]);

    assert_eq!(Gicv3::dist_register_name(0x6108), Some("GICD_IROUTER"));
    assert_eq!(Gicv3::dist_register_name(0x0020), None);
    assert_eq!(
        Gicv3::redist_register_name(GICR_STRIDE + 0x14),
        Some("GICR_WAKER")
    );
    assert_eq!(
        Gicv3::redist_register_name(SGI + 0x0C04),
        Some("GICR_ICFGR")
    );

    let mut one = Gicv3::new(1);
    assert_eq!(rr(&mut one, 0, 8) & 1 << 4, 1 << 4, "single vCPU is Last");
}

/// kvm-unit-tests' GIC setup (`gicv3_enable_defaults`): distributor
/// enabled, everything group 1, SGI priorities 0xA0, SGIs enabled, PMR 0xF0,
/// group 1 enabled. It never touches GICR_WAKER.
fn minimal(vcpus: usize) -> Gicv3 {
    let mut g = Gicv3::new(vcpus);
    dw(&mut g, 0x0000, 0);
    dw(&mut g, 0x0000, 0x13);
    for off in (0..(32 + NUM_SPIS) / 8).step_by(4) {
        dw(&mut g, 0x0080 + u64::from(off), !0);
    }
    for v in 0..vcpus {
        rw(&mut g, v, SGI + 0x0080, !0);
        for off in (0..16).step_by(4) {
            rw(&mut g, v, SGI + 0x0400 + off, 0xA0A0_A0A0);
        }
        rw(&mut g, v, SGI + 0x0100, 0xFFFF);
        icc_w(&mut g, v, ICC_PMR_EL1, 0xF0);
        icc_w(&mut g, v, ICC_IGRPEN1_EL1, 1);
    }
    g
}

#[test]
fn waker_handshake_reads_back() {
    let mut g = Gicv3::new(1);
    assert_eq!(rr(&mut g, 0, 0x14), 0b110, "reset: asleep");
    // Linux: clear ProcessorSleep, poll until ChildrenAsleep reads 0.
    rw(&mut g, 0, 0x14, 0);
    assert_eq!(rr(&mut g, 0, 0x14), 0);
    rw(&mut g, 0, 0x14, 0b010);
    assert_eq!(rr(&mut g, 0, 0x14), 0b110);
}

/// A guest that never clears GICR_WAKER.ProcessorSleep (kvm-unit-tests)
/// still takes its SGIs, PPIs and SPIs: a VM has no power controller to
/// wake the PE, and KVM and QEMU forward regardless.
#[test]
fn interrupts_reach_a_vcpu_that_never_woke_its_redistributor() {
    let mut g = minimal(2);
    assert_eq!(rr(&mut g, 0, 0x14), 0b110, "still asleep");
    // A self-SGI and a target-list SGI.
    assert_eq!(icc_w(&mut g, 0, ICC_SGI1R_EL1, 1), VcpuSet(0b01));
    assert!(g.irq_pending(0), "self-SGI");
    assert_eq!(ack(&mut g, 0), 0);
    eoi(&mut g, 0, 0);
    assert_eq!(
        icc_w(&mut g, 0, ICC_SGI1R_EL1, 1 << 40 | 2 << 24),
        VcpuSet(0b10)
    );
    assert!(g.irq_pending(1), "broadcast SGI");
    assert_eq!(ack(&mut g, 1), 2);
    eoi(&mut g, 1, 2);
    // The virtual timer's PPI, enabled as kvm-unit-tests' timer test does.
    rw(&mut g, 0, SGI + 0x0100, 1 << VTIMER_INTID);
    g.set_ppi_level(0, VTIMER_INTID, true);
    assert!(g.irq_pending(0), "PPI");
    assert_eq!(ack(&mut g, 0), VTIMER_INTID);
    eoi(&mut g, 0, VTIMER_INTID);
    g.set_ppi_level(0, VTIMER_INTID, false);
    // An SPI routed to vCPU 1, and a 1-of-N one.
    enable_spi(&mut g, 35, 0xA0);
    set_router(&mut g, 35, 1);
    g.set_spi_level(35, true);
    assert_eq!(g.pending_vcpus(), VcpuSet(0b10));
    set_router(&mut g, 35, 1 << 31);
    assert_eq!(
        g.pending_vcpus(),
        VcpuSet(0b01),
        "1-of-N: all asleep, the lowest"
    );
    // An awake vCPU is preferred for 1-of-N.
    rw(&mut g, 1, 0x14, 0);
    assert_eq!(g.pending_vcpus(), VcpuSet(0b10), "1-of-N: the awake one");
}

#[test]
fn ack_eoi_flow() {
    let mut g = booted(1);
    enable_spi(&mut g, 33, 0xA0);
    assert!(!g.irq_pending(0));
    assert_eq!(icc_r(&mut g, 0, ICC_HPPIR1_EL1), 1023);

    g.set_spi_level(33, true);
    assert!(g.irq_pending(0));
    assert_eq!(g.pending_vcpus(), VcpuSet(1));
    assert!(dist_bit(&mut g, 0x0200, 33), "ISPENDR");
    assert_eq!(icc_r(&mut g, 0, ICC_HPPIR1_EL1), 33);
    assert_eq!(rpr(&mut g, 0), 0xFF, "idle");

    assert_eq!(ack(&mut g, 0), 33);
    assert_eq!(rpr(&mut g, 0), 0xA0);
    assert_eq!(icc_r(&mut g, 0, ICC_AP1R0_EL1), 1 << (0xA0 >> 3));
    assert!(dist_bit(&mut g, 0x0300, 33), "ISACTIVER");
    assert!(!g.irq_pending(0), "active, not signalled again");
    assert_eq!(ack(&mut g, 0), INTID_SPURIOUS);

    g.set_spi_level(33, false);
    eoi(&mut g, 0, 33);
    assert_eq!(rpr(&mut g, 0), 0xFF);
    assert_eq!(icc_r(&mut g, 0, ICC_AP1R0_EL1), 0);
    assert!(!dist_bit(&mut g, 0x0300, 33));
    assert!(!dist_bit(&mut g, 0x0200, 33));
    assert!(!g.irq_pending(0));
    assert_eq!(ack(&mut g, 0), INTID_SPURIOUS);

    // EOIs of special INTIDs, or with nothing active, are ignored.
    eoi(&mut g, 0, 1023);
    eoi(&mut g, 0, 33);
    assert_eq!(rpr(&mut g, 0), 0xFF);
}

#[test]
fn priority_mask_and_implemented_priority_bits() {
    let mut g = booted(1);
    // Five priority bits: the low three read as zero, byte and word access.
    g.dist_write(0x0400 + 40, &[0xFF]).unwrap();
    let mut b = [0u8; 1];
    g.dist_read(0x0400 + 40, &mut b).unwrap();
    assert_eq!(b[0], 0xF8);
    dw(&mut g, 0x0420, 0x1234_5678);
    assert_eq!(dr(&mut g, 0x0420), 0x1030_5078);
    icc_w(&mut g, 0, ICC_PMR_EL1, 0xFF);
    assert_eq!(icc_r(&mut g, 0, ICC_PMR_EL1), 0xF8);

    enable_spi(&mut g, 33, 0xA0);
    g.set_spi_level(33, true);
    // Signalled only if the priority is strictly below the mask.
    icc_w(&mut g, 0, ICC_PMR_EL1, 0xA0);
    assert!(!g.irq_pending(0));
    assert_eq!(icc_r(&mut g, 0, ICC_HPPIR1_EL1), 33, "HPPIR ignores PMR");
    assert_eq!(ack(&mut g, 0), INTID_SPURIOUS);
    icc_w(&mut g, 0, ICC_PMR_EL1, 0xA8);
    assert!(g.irq_pending(0));
    icc_w(&mut g, 0, ICC_PMR_EL1, 0);
    assert!(!g.irq_pending(0));
    icc_w(&mut g, 0, ICC_PMR_EL1, 0xF0);

    // The highest priority (lowest value) wins; ties go to the lowest INTID.
    enable_spi(&mut g, 50, 0x40);
    g.set_spi_level(50, true);
    enable_spi(&mut g, 45, 0x40);
    g.set_spi_level(45, true);
    assert_eq!(icc_r(&mut g, 0, ICC_HPPIR1_EL1), 45);
    assert_eq!(ack(&mut g, 0), 45);
}

#[test]
fn nested_preemption_uses_running_priority() {
    let mut g = booted(1);
    enable_spi(&mut g, 33, 0xA0);
    enable_spi(&mut g, 34, 0x80);
    enable_spi(&mut g, 35, 0x90);

    g.set_spi_level(33, true);
    assert_eq!(ack(&mut g, 0), 33);
    assert_eq!(rpr(&mut g, 0), 0xA0);

    // Higher priority preempts the running 0xA0.
    g.set_spi_level(34, true);
    assert!(g.irq_pending(0));
    assert_eq!(ack(&mut g, 0), 34);
    assert_eq!(rpr(&mut g, 0), 0x80);
    assert_eq!(
        icc_r(&mut g, 0, ICC_AP1R0_EL1),
        1 << (0xA0 >> 3) | 1 << (0x80 >> 3)
    );

    // 0x90 cannot preempt 0x80, but can preempt 0xA0 once 34 drops.
    g.set_spi_level(35, true);
    assert!(!g.irq_pending(0));
    assert_eq!(icc_r(&mut g, 0, ICC_HPPIR1_EL1), 35);
    assert_eq!(ack(&mut g, 0), INTID_SPURIOUS);
    g.set_spi_level(34, false);
    eoi(&mut g, 0, 34);
    assert_eq!(rpr(&mut g, 0), 0xA0);
    assert!(g.irq_pending(0));
    assert_eq!(ack(&mut g, 0), 35);
    assert_eq!(rpr(&mut g, 0), 0x90);

    g.set_spi_level(35, false);
    eoi(&mut g, 0, 35);
    assert_eq!(rpr(&mut g, 0), 0xA0);
    g.set_spi_level(33, false);
    eoi(&mut g, 0, 33);
    assert_eq!(rpr(&mut g, 0), 0xFF);
    assert!(!g.irq_pending(0));
}

#[test]
fn binary_point_limits_preemption_to_group_priority() {
    let mut g = booted(1);
    assert_eq!(icc_r(&mut g, 0, ICC_BPR1_EL1), 3, "reset: minimum");
    icc_w(&mut g, 0, ICC_BPR1_EL1, 0);
    assert_eq!(icc_r(&mut g, 0, ICC_BPR1_EL1), 3, "clamped to minimum");
    // BPR1 = 6: group priority is bits [7:6].
    icc_w(&mut g, 0, ICC_BPR1_EL1, 6);
    assert_eq!(icc_r(&mut g, 0, ICC_BPR1_EL1), 6);
    enable_spi(&mut g, 33, 0xA0);
    enable_spi(&mut g, 34, 0x80);
    g.set_spi_level(33, true);
    assert_eq!(ack(&mut g, 0), 33);
    assert_eq!(rpr(&mut g, 0), 0x80, "group priority of 0xA0");
    g.set_spi_level(34, true);
    assert!(!g.irq_pending(0), "same group priority: no preemption");
    assert_eq!(ack(&mut g, 0), INTID_SPURIOUS);
    g.set_spi_level(33, false);
    eoi(&mut g, 0, 33);
    assert_eq!(ack(&mut g, 0), 34);

    // With the minimum binary point, 0x80 preempts 0xA0.
    let mut g = booted(1);
    enable_spi(&mut g, 33, 0xA0);
    enable_spi(&mut g, 34, 0x80);
    g.set_spi_level(33, true);
    assert_eq!(ack(&mut g, 0), 33);
    g.set_spi_level(34, true);
    assert_eq!(ack(&mut g, 0), 34);
}

#[test]
fn level_sensitive_repends_while_asserted() {
    let mut g = booted(1);
    enable_spi(&mut g, 40, 0xA0);
    assert_eq!(dr(&mut g, 0x0C08) >> 16 & 0b11, 0, "ICFGR: level");
    g.set_spi_level(40, true);

    // ICPENDR cannot clear an asserted level input.
    dw(&mut g, 0x0284, 1 << 8);
    assert!(dist_bit(&mut g, 0x0200, 40));

    assert_eq!(ack(&mut g, 0), 40);
    assert!(dist_bit(&mut g, 0x0300, 40), "active");
    assert!(dist_bit(&mut g, 0x0200, 40), "and still pending");
    assert!(!g.irq_pending(0));
    eoi(&mut g, 0, 40);
    assert!(g.irq_pending(0), "re-pends after deactivation");
    assert_eq!(ack(&mut g, 0), 40);

    g.set_spi_level(40, false);
    assert!(!dist_bit(&mut g, 0x0200, 40));
    eoi(&mut g, 0, 40);
    assert!(!g.irq_pending(0));

    // A software-set pending latch on a level interrupt is consumed by ack.
    dw(&mut g, 0x0204, 1 << 8);
    assert_eq!(ack(&mut g, 0), 40);
    eoi(&mut g, 0, 40);
    assert!(!g.irq_pending(0));
    assert!(!dist_bit(&mut g, 0x0200, 40));

    // The virtual timer PPI, per vCPU.
    let mut g = booted(2);
    enable_private(&mut g, 0, VTIMER_INTID, 0xA0);
    enable_private(&mut g, 1, VTIMER_INTID, 0xA0);
    g.set_ppi_level(1, VTIMER_INTID, true);
    assert!(!g.irq_pending(0));
    assert!(g.irq_pending(1));
    assert_eq!(ack(&mut g, 1), VTIMER_INTID);
    eoi(&mut g, 1, VTIMER_INTID);
    assert!(g.irq_pending(1), "timer still asserted");
    g.set_ppi_level(1, VTIMER_INTID, false);
    assert!(!g.irq_pending(1));
    assert_eq!(rr(&mut g, 1, SGI + 0x0200) >> VTIMER_INTID & 1, 0);
    // Out-of-range lines are ignored.
    g.set_ppi_level(0, 5, true);
    g.set_ppi_level(0, 32, true);
    g.set_ppi_level(7, VTIMER_INTID, true);
    g.set_spi_level(31, true);
    g.set_spi_level(32 + NUM_SPIS, true);
    g.set_spi_level(u32::MAX, true);
    assert_eq!(g.pending_vcpus(), VcpuSet::EMPTY);
}

#[test]
fn edge_triggered_latches_rising_edges_only() {
    let mut g = booted(1);
    enable_spi(&mut g, 41, 0xA0);
    // ICFGR2 covers INTIDs 32..47; INTID 41 is field 9.
    dw(&mut g, 0x0C08, 0b10 << 18);
    assert_eq!(dr(&mut g, 0x0C08), 0b10 << 18);

    g.set_spi_level(41, true);
    assert!(g.irq_pending(0));
    assert_eq!(ack(&mut g, 0), 41);
    assert!(!dist_bit(&mut g, 0x0200, 41), "ack consumes the edge");
    eoi(&mut g, 0, 41);
    assert!(!g.irq_pending(0), "line still high, but no new edge");

    // A new edge while active leaves it active and pending.
    g.set_spi_level(41, false);
    assert_eq!(ack(&mut g, 0), INTID_SPURIOUS);
    g.set_spi_level(41, true);
    assert_eq!(ack(&mut g, 0), 41);
    g.set_spi_level(41, false);
    g.set_spi_level(41, true);
    assert!(dist_bit(&mut g, 0x0300, 41) && dist_bit(&mut g, 0x0200, 41));
    assert!(!g.irq_pending(0));
    eoi(&mut g, 0, 41);
    assert_eq!(ack(&mut g, 0), 41);
    eoi(&mut g, 0, 41);

    // ICPENDR clears an edge latch.
    g.set_spi_level(41, false);
    g.set_spi_level(41, true);
    dw(&mut g, 0x0284, 1 << 9);
    assert!(!g.irq_pending(0));

    // SGIs are always edge: ICFGR0 is read-only.
    assert_eq!(rr(&mut g, 0, SGI + 0x0C00), 0xAAAA_AAAA);
    rw(&mut g, 0, SGI + 0x0C00, 0);
    assert_eq!(rr(&mut g, 0, SGI + 0x0C00), 0xAAAA_AAAA);
    // PPIs are configurable.
    rw(&mut g, 0, SGI + 0x0C04, 0b10 << 22);
    assert_eq!(rr(&mut g, 0, SGI + 0x0C04), 0b10 << 22);
}

#[test]
fn eoimode1_splits_priority_drop_and_deactivation() {
    let mut g = booted(1);
    assert_eq!(icc_r(&mut g, 0, ICC_CTLR_EL1), 0x400, "PRIbits = 4");
    icc_w(&mut g, 0, ICC_CTLR_EL1, 0b10);
    assert_eq!(icc_r(&mut g, 0, ICC_CTLR_EL1), 0x402);

    enable_spi(&mut g, 33, 0xA0);
    dw(&mut g, 0x0204, 1 << 1);
    assert_eq!(ack(&mut g, 0), 33);
    eoi(&mut g, 0, 33);
    assert_eq!(rpr(&mut g, 0), 0xFF, "priority dropped");
    assert!(dist_bit(&mut g, 0x0300, 33), "still active");

    dw(&mut g, 0x0204, 1 << 1);
    assert!(!g.irq_pending(0), "active: not forwarded");
    icc_w(&mut g, 0, ICC_DIR_EL1, 33);
    assert!(!dist_bit(&mut g, 0x0300, 33));
    assert!(g.irq_pending(0));
    assert_eq!(ack(&mut g, 0), 33);

    // With EOImode = 0, DIR is ignored and EOIR deactivates.
    icc_w(&mut g, 0, ICC_CTLR_EL1, 0);
    icc_w(&mut g, 0, ICC_DIR_EL1, 33);
    assert!(dist_bit(&mut g, 0x0300, 33));
    eoi(&mut g, 0, 33);
    assert!(!dist_bit(&mut g, 0x0300, 33));
    // Out-of-range INTIDs are ignored.
    icc_w(&mut g, 0, ICC_CTLR_EL1, 0b10);
    icc_w(&mut g, 0, ICC_DIR_EL1, 0xFFFF_FFFF);
    icc_w(&mut g, 0, ICC_DIR_EL1, 5000);
}

#[test]
fn sgi1r_target_list_and_broadcast() {
    let mut g = booted(4);
    for v in 0..4 {
        enable_private(&mut g, v, 3, 0x80);
        enable_private(&mut g, v, 5, 0x80);
    }
    // TargetList {1, 2}, INTID 3, from vCPU 0.
    let t = icc_w(&mut g, 0, ICC_SGI1R_EL1, 3 << 24 | 0b0110);
    assert_eq!(t, VcpuSet(0b0110));
    assert_eq!(t.iter().collect::<Vec<_>>(), [1, 2]);
    assert_eq!(g.pending_vcpus(), VcpuSet(0b0110));
    assert_eq!(ack(&mut g, 1), 3);
    assert_eq!(ack(&mut g, 2), 3);
    assert_eq!(ack(&mut g, 0), INTID_SPURIOUS);
    eoi(&mut g, 1, 3);
    eoi(&mut g, 2, 3);
    assert!(rr(&mut g, 1, SGI + 0x0300) & 1 << 3 == 0, "deactivated");

    // IRM = 1: everyone but the sender.
    let t = icc_w(&mut g, 2, ICC_SGI1R_EL1, 1 << 40 | 5 << 24);
    assert_eq!(t, VcpuSet(0b1011));
    assert_eq!(g.pending_vcpus(), VcpuSet(0b1011));
    for v in [0, 1, 3] {
        assert_eq!(ack(&mut g, v), 5);
        eoi(&mut g, v, 5);
    }

    // Affinities no vCPU has: Aff1 = 1, or RS = 1 (Aff0 16..31), or Aff3.
    assert!(icc_w(&mut g, 0, ICC_SGI1R_EL1, 3 << 24 | 1 << 16 | 0xF).is_empty());
    assert!(icc_w(&mut g, 0, ICC_SGI1R_EL1, 3 << 24 | 1 << 44 | 0xF).is_empty());
    assert!(icc_w(&mut g, 0, ICC_SGI1R_EL1, 3 << 24 | 1 << 48 | 0xF).is_empty());
    assert_eq!(g.pending_vcpus(), VcpuSet::EMPTY);

    // Self-targeted, and a target where the SGI is group 0 is skipped.
    rw(&mut g, 3, SGI + 0x0080, !(1 << 3));
    let t = icc_w(&mut g, 0, ICC_SGI1R_EL1, 3 << 24 | 0b1001);
    assert_eq!(t, VcpuSet(0b0001));
    assert_eq!(ack(&mut g, 0), 3);
    assert_eq!(g.sysreg_read(0, ICC_SGI1R_EL1), None, "write-only");
}

#[test]
fn spi_routing_via_irouter() {
    let mut g = booted(2);
    enable_spi(&mut g, 40, 0xA0);
    assert_eq!(router(&mut g, 40), 0, "reset: vCPU 0");
    set_router(&mut g, 40, 1);
    g.set_spi_level(40, true);
    assert_eq!(g.pending_vcpus(), VcpuSet(0b10));
    assert_eq!(ack(&mut g, 0), INTID_SPURIOUS);
    assert_eq!(ack(&mut g, 1), 40);
    g.set_spi_level(40, false);
    eoi(&mut g, 1, 40);

    // RES0 bits are dropped; 32-bit halves work.
    set_router(&mut g, 40, u64::MAX);
    assert_eq!(router(&mut g, 40), 0x80FF_FFFF);
    dw(&mut g, 0x6000 + 8 * 40, 1);
    dw(&mut g, 0x6000 + 8 * 40 + 4, 0xFFFF_FFFF);
    assert_eq!(router(&mut g, 40), 1);
    assert_eq!(dr(&mut g, 0x6000 + 8 * 40), 1);

    // An affinity no vCPU has: nobody gets it.
    for aff in [5, 1 << 8, 1 << 16] {
        set_router(&mut g, 40, aff);
        g.set_spi_level(40, true);
        assert_eq!(g.pending_vcpus(), VcpuSet::EMPTY, "{aff:#x}");
        g.set_spi_level(40, false);
    }

    // 1-of-N: the lowest-numbered vCPU that can take it.
    set_router(&mut g, 40, 1 << 31);
    g.set_spi_level(40, true);
    assert_eq!(g.pending_vcpus(), VcpuSet(0b01));
    // vCPU 0 running something of higher priority: vCPU 1 takes it.
    enable_private(&mut g, 0, 1, 0x10);
    icc_w(&mut g, 0, ICC_SGI1R_EL1, 1 << 24 | 1);
    assert_eq!(ack(&mut g, 0), 1);
    assert_eq!(g.pending_vcpus(), VcpuSet(0b10));
    eoi(&mut g, 0, 1);
    // vCPU 0 with group 1 disabled does not participate.
    icc_w(&mut g, 0, ICC_IGRPEN1_EL1, 0);
    assert_eq!(g.pending_vcpus(), VcpuSet(0b10));
    assert_eq!(ack(&mut g, 1), 40);
    assert!(!g.irq_pending(0) && !g.irq_pending(1), "taken once");
}

#[test]
fn irq_pending_requires_every_enable() {
    let mut g = booted(1);
    enable_spi(&mut g, 33, 0xA0);
    g.set_spi_level(33, true);
    assert!(g.irq_pending(0));

    dw(&mut g, 0x0000, 0x01);
    assert!(!g.irq_pending(0), "GICD_CTLR.EnableGrp1 clear");
    assert_eq!(icc_r(&mut g, 0, ICC_HPPIR1_EL1), 1023);
    dw(&mut g, 0x0000, 0x02);
    assert!(g.irq_pending(0));

    icc_w(&mut g, 0, ICC_IGRPEN1_EL1, 0);
    assert!(!g.irq_pending(0), "ICC_IGRPEN1_EL1 clear");
    assert_eq!(ack(&mut g, 0), INTID_SPURIOUS);
    icc_w(&mut g, 0, ICC_IGRPEN1_EL1, 1);
    assert!(g.irq_pending(0));

    dw(&mut g, 0x0184, 1 << 1);
    assert!(!g.irq_pending(0), "disabled");
    assert!(!dist_bit(&mut g, 0x0100, 33));
    dw(&mut g, 0x0104, 1 << 1);
    assert!(g.irq_pending(0));

    dw(&mut g, 0x0084, !(1 << 1));
    assert!(!g.irq_pending(0), "group 0 is never signalled");
    assert_eq!(icc_r(&mut g, 0, ICC_IAR0_EL1), 1023);
    dw(&mut g, 0x0084, !0);
    assert!(g.irq_pending(0));
    assert!(!g.irq_pending(1), "no such vCPU");
}

#[test]
fn icc_register_directions_and_constants() {
    let mut g = booted(2);
    assert_eq!(icc_r(&mut g, 0, ICC_SRE_EL1), 0b111);
    icc_w(&mut g, 0, ICC_SRE_EL1, 0);
    assert_eq!(icc_r(&mut g, 0, ICC_SRE_EL1), 0b111, "RAO/WI");
    assert_eq!(icc_r(&mut g, 0, ICC_IGRPEN1_EL1), 1);

    // Write-only registers cannot be read, read-only ones not written.
    for reg in [
        ICC_EOIR1_EL1,
        ICC_DIR_EL1,
        ICC_SGI1R_EL1,
        ICC_EOIR0_EL1,
        ICC_SGI0R_EL1,
    ] {
        assert_eq!(g.sysreg_read(0, reg), None, "{reg:?}");
    }
    for reg in [
        ICC_IAR1_EL1,
        ICC_HPPIR1_EL1,
        ICC_RPR_EL1,
        ICC_IAR0_EL1,
        ICC_HPPIR0_EL1,
    ] {
        assert_eq!(g.sysreg_write(0, reg, 0), None, "{reg:?}");
    }
    // Not ours, or no such vCPU.
    assert_eq!(g.sysreg_read(0, SCTLR_EL1), None);
    assert_eq!(g.sysreg_write(0, CNTV_CTL_EL0, 1), None);
    assert_eq!(g.sysreg_read(2, ICC_PMR_EL1), None);
    assert_eq!(g.sysreg_write(usize::MAX, ICC_SGI1R_EL1, !0), None);

    // Group 0 is RAZ/WI; Linux writes ICC_AP0R0 at boot.
    assert_eq!(icc_r(&mut g, 0, ICC_IAR0_EL1), 1023);
    assert_eq!(icc_r(&mut g, 0, ICC_HPPIR0_EL1), 1023);
    for n in 4..8 {
        let ap0r = SysReg::new(3, 0, 12, 8, n);
        assert_eq!(icc_w(&mut g, 0, ap0r, !0), VcpuSet::EMPTY);
        assert_eq!(icc_r(&mut g, 0, ap0r), 0);
    }
    icc_w(&mut g, 0, ICC_IGRPEN0_EL1, 1);
    assert_eq!(icc_r(&mut g, 0, ICC_IGRPEN0_EL1), 0);
    icc_w(&mut g, 0, ICC_SGI0R_EL1, 1 << 40);
    icc_w(&mut g, 0, ICC_ASGI1R_EL1, 1 << 40);
    assert_eq!(g.pending_vcpus(), VcpuSet::EMPTY);
    assert_eq!(icc_r(&mut g, 0, ICC_BPR0_EL1), 2);
    icc_w(&mut g, 0, ICC_BPR0_EL1, 5);
    assert_eq!(icc_r(&mut g, 0, ICC_BPR0_EL1), 5);

    // Active priorities: AP1R0 is read/write state, AP1R1..3 RAZ/WI.
    icc_w(&mut g, 1, ICC_AP1R0_EL1, 1 << 4);
    assert_eq!(icc_r(&mut g, 1, ICC_AP1R0_EL1), 1 << 4);
    assert_eq!(rpr(&mut g, 1), 4 << 3);
    for reg in [ICC_AP1R1_EL1, ICC_AP1R2_EL1, ICC_AP1R3_EL1] {
        icc_w(&mut g, 1, reg, !0);
        assert_eq!(icc_r(&mut g, 1, reg), 0);
    }
}

#[test]
fn mmio_sizes_alignment_and_reserved_offsets() {
    let mut g = booted(2);
    let mut d1 = [0u8; 1];
    let mut d2 = [0u8; 2];
    let mut d4 = [0u8; 4];
    let mut d8 = [0u8; 8];
    // 32-bit registers.
    assert_eq!(g.dist_read(0x0000, &mut d1), Err(AccessError::Size));
    assert_eq!(g.dist_read(0x0000, &mut d2), Err(AccessError::Size));
    assert_eq!(g.dist_read(0x0000, &mut d8), Err(AccessError::Size));
    assert_eq!(g.dist_write(0x0100, &[1]), Err(AccessError::Size));
    assert_eq!(g.dist_read(0x0102, &mut d4), Err(AccessError::Alignment));
    // Byte-accessible priorities, but not halfwords.
    g.dist_read(0x0421, &mut d1).unwrap();
    assert_eq!(g.dist_read(0x0420, &mut d2), Err(AccessError::Size));
    assert_eq!(g.dist_read(0x0422, &mut d4), Err(AccessError::Alignment));
    // IROUTER: 64-bit or 32-bit halves.
    g.dist_read(0x6104, &mut d4).unwrap();
    assert_eq!(g.dist_read(0x6104, &mut d8), Err(AccessError::Alignment));
    assert_eq!(g.dist_read(0x6100, &mut d2), Err(AccessError::Size));
    // Bad lengths never reach a register.
    assert_eq!(g.dist_read(0x0000, &mut [0u8; 3]), Err(AccessError::Size));
    assert_eq!(g.dist_read(0x0000, &mut [0u8; 16]), Err(AccessError::Size));
    assert_eq!(g.dist_write(0x0000, &[]), Err(AccessError::Size));

    // Reserved offsets: NoRegister and zeroed data.
    for off in [
        0x0020,
        0x0040,
        0x6000,
        0x60F8,
        0x7FE0,
        0xFFCC,
        0x1_0000,
        u64::MAX - 3,
    ] {
        let mut d = [0xAAu8; 4];
        assert_eq!(
            g.dist_read(off, &mut d),
            Err(AccessError::NoRegister),
            "{off:#x}"
        );
        assert_eq!(d, [0; 4]);
        assert_eq!(g.dist_write(off, &[1; 4]), Err(AccessError::NoRegister));
    }
    assert_eq!(
        g.redist_read(u64::MAX - 7, &mut d8),
        Err(AccessError::NoRegister)
    );
    assert_eq!(g.redist_read(0x0070, &mut d8), Err(AccessError::NoRegister));
    assert_eq!(
        g.redist_read(SGI + 0x0084, &mut d4),
        Err(AccessError::NoRegister)
    );

    // Distributor registers of INTIDs 0-31 are RAZ/WI with ARE = 1, as are
    // those of unimplemented SPIs; DS = 1 makes IGRPMODR/NSACR RAZ/WI.
    for off in [
        0x0100, 0x010C, 0x0200, 0x0400, 0x0C00, 0x0D04, 0x0E08, 0x0800,
    ] {
        dw(&mut g, off, !0);
        assert_eq!(dr(&mut g, off), 0, "{off:#x}");
    }
    assert_eq!(rr(&mut g, 0, SGI + 0x0100), 0, "SGIs untouched");
    assert_eq!(rr(&mut g, 0, SGI + 0x0D00), 0, "GICR_IGRPMODR0");

    // Private registers reach only their own vCPU.
    rw(&mut g, 1, SGI + 0x0100, 1 << 20);
    assert_eq!(rr(&mut g, 1, SGI + 0x0100), 1 << 20);
    assert_eq!(rr(&mut g, 0, SGI + 0x0100), 0);
    assert_eq!(
        g.redist_write(GICR_STRIDE + SGI + 0x0100, &[1, 0]),
        Err(AccessError::Size)
    );
}

/// A GIC with state in every corner: priorities, routes, active and pending
/// interrupts, nested active priorities, CPU interface settings.
fn busy_gic() -> Gicv3 {
    let mut g = booted(3);
    for (i, intid) in (32..32 + NUM_SPIS).step_by(3).enumerate() {
        enable_spi(&mut g, intid, (i as u8).wrapping_mul(24));
        set_router(
            &mut g,
            intid,
            (i % 3) as u64 | if i % 4 == 0 { 1 << 31 } else { 0 },
        );
    }
    dw(&mut g, 0x0C08, 0xAAAA_0000);
    for intid in [32, 35, 38, 41, 89] {
        g.set_spi_level(intid, true);
    }
    for v in 0..3 {
        enable_private(&mut g, v, 2, 0x50);
        enable_private(&mut g, v, VTIMER_INTID, 0x30);
    }
    g.set_ppi_level(2, VTIMER_INTID, true);
    icc_w(&mut g, 0, ICC_SGI1R_EL1, 1 << 40 | 2 << 24);
    icc_w(&mut g, 1, ICC_BPR1_EL1, 5);
    icc_w(&mut g, 2, ICC_CTLR_EL1, 2);
    icc_w(&mut g, 2, ICC_PMR_EL1, 0xF8);
    for v in 0..3 {
        let _ = ack(&mut g, v);
    }
    let _ = ack(&mut g, 2);
    rw(&mut g, 1, 0x0014, 0b10);
    g
}

#[test]
fn save_restore_save_round_trip() {
    let g = busy_gic();
    let s1 = g.save();
    assert_ne!(s1, Gicv3::new(3).save(), "the state is not trivial");
    assert!(s1.redists[2].cpuif.ap1r0.count_ones() >= 1);

    let mut restored = Gicv3::restore(3, &s1).unwrap();
    assert_eq!(restored.save(), s1);

    // Through serde too.
    let json = serde_json::to_string(&s1).unwrap();
    let from_json: GicState = serde_json::from_str(&json).unwrap();
    assert_eq!(from_json, s1);
    assert_eq!(Gicv3::restore(3, &from_json).unwrap().save(), s1);

    // The restored GIC behaves like the original.
    let mut original = Gicv3::restore(3, &s1).unwrap();
    for v in 0..3 {
        assert_eq!(restored.irq_pending(v), original.irq_pending(v));
        assert_eq!(ack(&mut restored, v), ack(&mut original, v));
        assert_eq!(rpr(&mut restored, v), rpr(&mut original, v));
    }
    assert_eq!(restored.save(), original.save());
}

#[test]
fn restore_rejects_corrupted_state() {
    let good = busy_gic().save();
    assert!(Gicv3::restore(3, &good).is_ok());

    assert_eq!(
        Gicv3::restore(2, &good).unwrap_err(),
        GicStateError::VcpuMismatch {
            expected: 2,
            found: 3
        }
    );
    assert_eq!(
        Gicv3::restore(0, &good).unwrap_err(),
        GicStateError::VcpuCount(0)
    );
    assert_eq!(
        Gicv3::restore(MAX_VCPUS + 1, &good).unwrap_err(),
        GicStateError::VcpuCount(MAX_VCPUS + 1)
    );

    let corrupt = |f: &dyn Fn(&mut GicState)| {
        let mut s = good.clone();
        f(&mut s);
        Gicv3::restore(3, &s).unwrap_err()
    };
    assert!(matches!(
        corrupt(&|s| {
            s.spis.pop();
        }),
        GicStateError::Length { what: "spis", .. }
    ));
    assert!(matches!(
        corrupt(&|s| s.spis.push(SpiState::default())),
        GicStateError::Length { .. }
    ));
    assert!(matches!(
        corrupt(&|s| s.redists[1].private.truncate(31)),
        GicStateError::Length { found: 31, .. }
    ));
    assert!(matches!(
        corrupt(&|s| s.redists[2].private.clear()),
        GicStateError::Length { found: 0, .. }
    ));
    let field = |e: GicStateError| match e {
        GicStateError::Field { what, value } => (what, value),
        other => panic!("expected a field error, got {other:?}"),
    };
    assert_eq!(
        field(corrupt(&|s| s.spis[3].irq.priority = 0x81)),
        ("SPI 35 priority".to_string(), 0x81)
    );
    assert_eq!(field(corrupt(&|s| s.spis[0].router = 1 << 32)).1, 1 << 32);
    assert_eq!(
        field(corrupt(&|s| s.redists[1].private[20].priority = 7)).0,
        "vCPU 1 INTID 20 priority"
    );
    assert_eq!(
        field(corrupt(&|s| s.redists[0].private[4].edge = false)).0,
        "vCPU 0 SGI 4 edge/level"
    );
    assert_eq!(
        field(corrupt(&|s| s.redists[0].private[4].level = true)).0,
        "vCPU 0 SGI 4 edge/level"
    );
    assert_eq!(
        field(corrupt(&|s| s.redists[2].cpuif.pmr = 0xF7)).0,
        "vCPU 2 ICC_PMR_EL1"
    );
    assert_eq!(field(corrupt(&|s| s.redists[0].cpuif.bpr1 = 2)).1, 2);
    assert_eq!(field(corrupt(&|s| s.redists[0].cpuif.bpr1 = 8)).1, 8);
    assert_eq!(field(corrupt(&|s| s.redists[0].cpuif.bpr0 = 1)).1, 1);

    // Garbage that deserialises is refused, never a panic.
    let mut json: serde_json::Value = serde_json::to_value(&good).unwrap();
    json["spis"] = serde_json::json!([]);
    let s: GicState = serde_json::from_value(json).unwrap();
    assert!(Gicv3::restore(3, &s).is_err());
}

/// xorshift64: a deterministic pseudo-random sequence.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn random_traffic_never_panics() {
    let icc: Vec<SysReg> = (0..=7)
        .map(|op2| SysReg::new(3, 0, 12, 8, op2))
        .chain((0..=3).map(|op2| SysReg::new(3, 0, 12, 9, op2)))
        .chain((0..=7).map(|op2| SysReg::new(3, 0, 12, 11, op2)))
        .chain((0..=7).map(|op2| SysReg::new(3, 0, 12, 12, op2)))
        .chain([ICC_PMR_EL1, SCTLR_EL1])
        .collect();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for round in 0..4 {
        let vcpus = [1, 2, 5, MAX_VCPUS][round];
        let mut g = booted(vcpus);
        for intid in 32..32 + NUM_SPIS {
            enable_spi(&mut g, intid, (intid as u8) << 3);
        }
        for _ in 0..25_000 {
            let len = [1, 2, 4, 8, 4, 4, 3, 0, 16][rng.below(9) as usize];
            let mut data = vec![0u8; len];
            let value = rng.next();
            data.iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b = (value >> (8 * (i % 8))) as u8);
            let vcpu = rng.below(vcpus as u64 + 1) as usize;
            let intid = rng.below(1100) as u32;
            match rng.below(12) {
                0 => {
                    let off = rng.below(0x1_0000) & !3;
                    let _ = g.dist_read(off, &mut data);
                }
                1 => {
                    let off = [
                        rng.below(0x1_0000),
                        rng.below(0x1000) & !3,
                        0x6000 + rng.below(0x2000),
                    ][rng.below(3) as usize];
                    let _ = g.dist_write(off, &data);
                }
                2 => {
                    let off = rng.below(GICR_SIZE + 0x4_0000) & !3;
                    let _ = g.redist_read(off, &mut data);
                }
                3 => {
                    let off = vcpu as u64 * GICR_STRIDE
                        + [rng.below(0x2_0000), SGI + (rng.below(0x1000) & !3), 0x14]
                            [rng.below(3) as usize];
                    let _ = g.redist_write(off, &data);
                }
                4 => {
                    let reg = icc[rng.below(icc.len() as u64) as usize];
                    let _ = g.sysreg_read(vcpu, reg);
                }
                5 => {
                    let reg = icc[rng.below(icc.len() as u64) as usize];
                    let v = if rng.below(2) == 0 {
                        u64::from(intid)
                    } else {
                        value
                    };
                    if let Some(t) = g.sysreg_write(vcpu, reg, v) {
                        assert!(t.0 >> vcpus == 0, "targets only real vCPUs");
                    }
                }
                6 => {
                    let _ = g.sysreg_read(vcpu, SysReg(value as u16));
                    let _ = g.sysreg_write(vcpu, SysReg(value as u16), value);
                }
                7 => g.set_spi_level(intid, value & 1 != 0),
                8 => g.set_ppi_level(vcpu, intid % 40, value & 1 != 0),
                9 => {
                    let got = ack(&mut g, vcpu % vcpus);
                    if got != INTID_SPURIOUS && value & 1 != 0 {
                        eoi(&mut g, vcpu % vcpus, got);
                    }
                }
                10 => {
                    let _ = g.dist_read(value, &mut data);
                    let _ = g.redist_write(value, &data);
                }
                _ => {
                    let pending = g.pending_vcpus();
                    assert!(pending.0 >> vcpus == 0);
                    for v in 0..=vcpus {
                        assert_eq!(g.irq_pending(v), pending.contains(v));
                    }
                }
            }
        }
        // Every state the guest can reach is one restore accepts.
        let s = g.save();
        assert_eq!(Gicv3::restore(vcpus, &s).unwrap().save(), s);
    }
}

#[test]
fn mmio_adapters_on_the_bus() {
    let gic = Arc::new(Mutex::new(Gicv3::new(2)));
    let mut bus = MmioBus::new();
    bus.insert(
        "gicd",
        GICD_BASE,
        GICD_SIZE,
        Arc::new(Mutex::new(GicDistMmio(gic.clone()))),
    )
    .unwrap();
    bus.insert(
        "gicr",
        GICR_BASE,
        GICR_SIZE,
        Arc::new(Mutex::new(GicRedistMmio(gic.clone()))),
    )
    .unwrap();

    let mut d = [0u8; 4];
    bus.read(0, GICD_BASE + 0xFFE8, &mut d).unwrap();
    assert_eq!(u32::from_le_bytes(d), 0x3B);
    let mut d8 = [0u8; 8];
    bus.read(0, GICR_BASE + GICR_STRIDE + 8, &mut d8).unwrap();
    assert_eq!(u64::from_le_bytes(d8), 1 << 32 | 1 << 8 | 1 << 4);
    // A frame past the last vCPU reads as zero; bad sizes fault.
    let mut d = [0xFFu8; 4];
    bus.read(0, GICR_BASE + 2 * GICR_STRIDE + 0xFFE8, &mut d)
        .unwrap();
    assert_eq!(d, [0; 4]);
    assert!(bus.read(0, GICD_BASE, &mut [0u8; 2]).is_err());

    bus.write(1, GICR_BASE + GICR_STRIDE + 0x14, &0u32.to_le_bytes())
        .unwrap();
    assert!(!gic.lock().unwrap().save().redists[1].processor_sleep);
}
