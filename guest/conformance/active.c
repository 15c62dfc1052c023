/* Group active: the GICv3 interrupt life cycle pending -> active ->
 * inactive as software sees it (GICv3/v4 architecture specification, Arm
 * IHI 0069, "Interrupt lifecycle", and the register descriptions of
 * ICC_IAR1_EL1, ICC_EOIR1_EL1, ICC_DIR_EL1 with ICC_CTLR_EL1.EOImode,
 * ICC_RPR_EL1, GICR_ISACTIVER0/ICACTIVER0 and GICD_ISACTIVER<n>).
 *
 * Interrupts are made pending by writing GICR_ISPENDR0 / GICD_ISPENDR<n>
 * (or ICC_SGI1R_EL1) and, except in the last check, acknowledged by reading ICC_IAR1_EL1 with
 * PSTATE.I set, so these checks do not depend on interrupt delivery. */
#include "rt.h"

const char test_group[] = "active";

#define IDLE_PRIO 0xff  /* ICC_RPR_EL1 with no active priority */

static u64 reg_private(u32 off) { return gicr_sgi() + off; }
static u64 reg_spi(u32 off, u32 intid) { return GICD_BASE + off + (intid / 32) * 4; }

/* ISPENDR 0x200, ISACTIVER 0x300 in both the SGI frame and the GICD. */
static u32 state_bit(u32 off, u32 intid)
{
    u64 reg = intid < 32 ? reg_private(off) : reg_spi(off, intid);
    return (r32(reg) >> (intid % 32)) & 1;
}
static u32 is_pending(u32 intid) { return state_bit(0x200, intid); }
static u32 is_active(u32 intid) { return state_bit(0x300, intid); }

static void set_pending(u32 intid)
{
    if (intid < 32)
        w32(reg_private(0x200), 1u << intid);
    else
        w32(reg_spi(0x200, intid), 1u << (intid % 32));
    dsb_sy();
}

static u32 rpr(void) { return read_sysreg(ICC_RPR_EL1) & 0xff; }

static void expect_state(const char *when, u32 intid, u32 pending, u32 active)
{
    u32 p = is_pending(intid), a = is_active(intid);
    if (p != pending || a != active)
        t_fail("%s: INTID %u reads pending=%u active=%u, expected pending=%u active=%u",
               when, intid, p, a, pending, active);
}

/* Makes `intid` pending and acknowledges it by polling ICC_IAR1_EL1. */
static int pend_and_ack(u32 intid)
{
    set_pending(intid);
    if (!WAIT_FOR((read_sysreg(ICC_HPPIR1_EL1) & 0xffffff) == intid, BOUND_S)) {
        t_fail("INTID %u made pending, but ICC_HPPIR1_EL1 reads %lu (pending=%u)",
               intid, read_sysreg(ICC_HPPIR1_EL1) & 0xffffff, is_pending(intid));
        return 0;
    }
    u32 got = gic_ack();
    if (got != intid) {
        t_fail("ICC_IAR1_EL1 returned %u, expected %u", got, intid);
        return 0;
    }
    return 1;
}

/* Acknowledge -> active (not pending), running priority = its priority;
 * EOI (EOImode 0: priority drop and deactivation) -> inactive, idle. */
static void ack_eoi_cycle(u32 intid)
{
    if (!pend_and_ack(intid))
        return;
    expect_state("after ICC_IAR1_EL1", intid, 0, 1);
    if (rpr() != 0x80)
        t_fail("ICC_RPR_EL1 = 0x%x while INTID %u (priority 0x80) is active", rpr(), intid);
    gic_eoi(intid);
    expect_state("after ICC_EOIR1_EL1", intid, 0, 0);
    if (rpr() != IDLE_PRIO)
        t_fail("ICC_RPR_EL1 = 0x%x after EOI, expected idle 0x%x", rpr(), IDLE_PRIO);
}

static volatile u32 in_handler_active, in_handler_pending, handled;

static void on_irq(u32 intid)
{
    in_handler_active = is_active(intid);
    in_handler_pending = is_pending(intid);
    handled = intid;
}

void test_main(void)
{
    t_begin("active-private");  /* SGI 8 in the redistributor */
    ack_eoi_cycle(8);
    t_end();

    t_begin("active-spi");      /* SPI 45 in the distributor (free on both machines) */
    gic_enable_spi(45, 0x80, 0);
    ack_eoi_cycle(45);
    t_end();

    t_begin("active-eoimode1"); /* EOImode 1: EOIR drops priority, DIR deactivates */
    write_sysreg(ICC_CTLR_EL1, read_sysreg(ICC_CTLR_EL1) | (1 << 1));
    isb();
    if (pend_and_ack(9)) {
        gic_eoi(9);
        if (rpr() != IDLE_PRIO)
            t_fail("ICC_RPR_EL1 = 0x%x after EOIR with EOImode 1, expected idle", rpr());
        expect_state("after ICC_EOIR1_EL1 with EOImode 1", 9, 0, 1);
        write_sysreg(ICC_DIR_EL1, 9);
        isb();
        expect_state("after ICC_DIR_EL1", 9, 0, 0);
    }
    write_sysreg(ICC_CTLR_EL1, read_sysreg(ICC_CTLR_EL1) & ~(1ul << 1));
    isb();
    t_end();

    t_begin("active-and-pending");  /* pending again while active: not re-acknowledged until EOI */
    if (pend_and_ack(10)) {
        set_pending(10);
        expect_state("pending again while active", 10, 1, 1);
        u32 spurious = gic_ack();
        if (spurious != 1023)
            t_fail("ICC_IAR1_EL1 returned %u while INTID 10 is active and pending, expected 1023", spurious);
        gic_eoi(10);
        expect_state("after EOI of the active instance", 10, 1, 0);
        if (WAIT_FOR((read_sysreg(ICC_HPPIR1_EL1) & 0xffffff) == 10, BOUND_S) && gic_ack() == 10)
            gic_eoi(10);
        else
            t_fail("the second instance of INTID 10 could not be acknowledged");
        expect_state("after the second EOI", 10, 0, 0);
    }
    t_end();

    t_begin("active-clear");    /* SGI 12 to self; GICR_ICACTIVER0 deactivates it */
    write_sysreg(ICC_SGI1R_EL1, 1ul | 12ul << 24);   /* TargetList = {cpu0} */
    isb();
    if (WAIT_FOR((read_sysreg(ICC_HPPIR1_EL1) & 0xffffff) == 12, BOUND_S) && gic_ack() == 12) {
        expect_state("SGI acknowledged", 12, 0, 1);
        w32(reg_private(0x380), 1u << 12);          /* GICR_ICACTIVER0 */
        dsb_sy();
        expect_state("after GICR_ICACTIVER0", 12, 0, 0);
        if (rpr() != 0x80)
            t_fail("ICC_RPR_EL1 = 0x%x after GICR_ICACTIVER0; only EOI drops the priority", rpr());
        gic_eoi(12);
        if (rpr() != IDLE_PRIO)
            t_fail("ICC_RPR_EL1 = 0x%x after EOI, expected idle", rpr());
    } else {
        t_fail("SGI 12 sent to self through ICC_SGI1R_EL1 did not become pending (GICR_ISPENDR0=0x%x)",
               r32(reg_private(0x200)));
    }
    t_end();

    t_begin("active-in-handler");   /* taken as an IRQ: active inside the handler */
    rt_set_irq_handler(46, on_irq);
    rt_set_irq_handler(11, on_irq);
    gic_enable_spi(46, 0x80, 0);
    irq_enable();
    for (u32 i = 0; i < 2; i++) {
        u32 intid = i ? 11 : 46;
        handled = 0;
        set_pending(intid);
        if (!WAIT_FOR(handled == intid, BOUND_S)) {
            rt_lost("active-in-handler", intid, 0);
            t_fail("INTID %u (pending=%u) not taken within %u s", intid, is_pending(intid), BOUND_S);
            continue;
        }
        if (!in_handler_active || in_handler_pending)
            t_fail("in the handler INTID %u read active=%u pending=%u, expected active=1 pending=0",
                   intid, in_handler_active, in_handler_pending);
        expect_state("after the handler's EOI", intid, 0, 0);
    }
    irq_disable();
    t_end();
}
