/* Group vtimer: the EL1 virtual timer (Arm ARM, "The Generic Timer in
 * AArch64 state": CNTV_CTL_EL0 ENABLE/IMASK/ISTATUS, CNTV_CVAL_EL0,
 * CNTV_TVAL_EL0 as CVAL - CNTVCT), its level-sensitive output to PPI 27,
 * and WFI waking on a pending interrupt even while PSTATE.I masks it (Arm
 * ARM, "Wait for Interrupt": WFI wake-up events), with the interrupt taken
 * at the ISB (a context synchronization event) after PSTATE.I is cleared. It runs on one CPU, the case where
 * nothing but the interrupt can end a WFI; if it never wakes, the runner's
 * timeout ends the run. */
#include "rt.h"

const char test_group[] = "vtimer";

#define VTIMER  27
#define ENABLE  1ul
#define IMASK   2ul
#define ISTATUS 4ul
#define SAMPLES 50

static volatile u32 fired;
static volatile u64 fired_at, fired_ctl;
static u64 lat[SAMPLES];

static void on_vtimer(u32 intid)
{
    (void)intid;
    fired_at = cnt_now();
    fired_ctl = read_sysreg(cntv_ctl_el0);
    write_sysreg(cntv_ctl_el0, ENABLE | IMASK);     /* output low before the EOI */
    isb();
    fired++;
}

static u32 gic_pending(void)
{
    return (r32(gicr_sgi() + 0x200) >> VTIMER) & 1;    /* GICR_ISPENDR0 */
}

static void arm_at(u64 cval)
{
    write_sysreg(cntv_cval_el0, cval);
    write_sysreg(cntv_ctl_el0, ENABLE);
    isb();
}

void test_main(void)
{
    u64 f = cnt_freq();
    rt_set_irq_handler(VTIMER, on_vtimer);

    t_begin("vtimer-istatus");
    write_sysreg(cntv_ctl_el0, ENABLE | IMASK);
    write_sysreg(cntv_cval_el0, cnt_now() + 100 * f);
    isb();
    if (read_sysreg(cntv_ctl_el0) & ISTATUS)
        t_fail("ISTATUS=1 with CVAL 100 s ahead");
    write_sysreg(cntv_cval_el0, cnt_now());
    isb();
    if (!(read_sysreg(cntv_ctl_el0) & ISTATUS))
        t_fail("ISTATUS=0 with CVAL <= CNTVCT");
    u64 t0 = cnt_now();
    write_sysreg(cntv_tval_el0, f);                 /* 1 s: fits TVAL's 32 bits up to 2 GHz */
    u64 t1 = cnt_now();
    u64 cval = read_sysreg(cntv_cval_el0);
    if (cval < t0 + f || cval > t1 + f)
        t_fail("TVAL=%lu set CVAL=%lu, outside [%lu, %lu]", f, cval, t0 + f, t1 + f);
    t0 = cnt_now();
    s64 tval = (int32_t)read_sysreg(cntv_tval_el0);  /* = CVAL - CNTVCT, signed 32 bits */
    t1 = cnt_now();
    if (tval > (s64)(cval - t0) || tval < (s64)(cval - t1))
        t_fail("TVAL reads %ld; CVAL - CNTVCT was between %ld and %ld", tval, (s64)(cval - t1), (s64)(cval - t0));
    write_sysreg(cntv_ctl_el0, 0);
    isb();
    t_end();

    t_begin("vtimer-gic-pending");  /* PPI 27 pending exactly while ENABLE && ISTATUS && !IMASK */
    gic_enable_private(VTIMER, 0x80);   /* PSTATE.I is set: nothing is taken */
    arm_at(cnt_now());
    if (!WAIT_FOR(gic_pending(), BOUND_S))
        t_fail("timer output high (CTL=0x%lx) but PPI 27 not pending", read_sysreg(cntv_ctl_el0));
    write_sysreg(cntv_ctl_el0, ENABLE | IMASK);
    isb();
    if (!WAIT_FOR(!gic_pending(), BOUND_S))
        t_fail("IMASK=1 but PPI 27 still pending (level-sensitive: it follows the output)");
    arm_at(cnt_now() + 100 * f);
    if (!WAIT_FOR(!gic_pending(), BOUND_S))
        t_fail("CVAL 100 s ahead but PPI 27 pending");
    write_sysreg(cntv_ctl_el0, 0);
    isb();
    t_end();

    t_begin("vtimer-irq");      /* spinning with interrupts enabled */
    fired = 0;
    cval = cnt_now() + cnt_ms(10);
    arm_at(cval);
    irq_enable();
    WAIT_FOR(fired, BOUND_S);
    irq_disable();
    if (!fired)
        rt_lost("vtimer-irq", 27, 0);
    if (!fired)
        t_fail("not taken within %u s (CTL=0x%lx, PPI 27 pending=%u, ISR_EL1=0x%lx)",
               BOUND_S, read_sysreg(cntv_ctl_el0), gic_pending(), read_sysreg(isr_el1));
    else if (!(fired_ctl & ISTATUS) || fired_at < cval)
        t_fail("taken with CTL=0x%lx at CNTVCT=%lu, CVAL=%lu", fired_ctl, fired_at, cval);
    int irq_ok = t_end();

    t_begin("vtimer-wfi-masked");   /* msr daifset,#2; wfi; msr daifclr,#2 in a loop */
    fired = 0;
    u32 wakes = 0, isr_at_wake = 0, taken_late = 0;
    u64 end = cnt_now() + BOUND_S * f;
    arm_at(cnt_now() + cnt_ms(10));
    while (!fired && cnt_now() < end) {
        asm volatile("msr daifset, #2\n wfi" : : : "memory");
        wakes++;
        isr_at_wake = read_sysreg(isr_el1) & (1 << 7);
        asm volatile("msr daifclr, #2\n isb" : : : "memory");
        if (isr_at_wake && !fired)
            taken_late++;   /* pending at the CPU, yet not taken at the unmask */
    }
    irq_disable();
    if (!fired)
        t_fail("not received within %u s: %u WFI wake-ups, CTL=0x%lx, PPI 27 pending=%u",
               BOUND_S, wakes, read_sysreg(cntv_ctl_el0), gic_pending());
    else if (taken_late)
        t_fail("ISR_EL1.I=1 after WFI but the IRQ was not taken at the unmask (%u times)", taken_late);
    t_end();

    if (irq_ok) {
        u32 n = 0;
        irq_enable();
        for (; n < SAMPLES; n++) {
            fired = 0;
            cval = cnt_now() + cnt_ms(1);
            arm_at(cval);
            if (!WAIT_FOR(fired, BOUND_S)) {
                rt_lost("vtimer", 27, 0);
                break;
            }
            lat[n] = fired_at - cval;
        }
        irq_disable();
        print_latency("vtimer", lat, n);
    }
}
