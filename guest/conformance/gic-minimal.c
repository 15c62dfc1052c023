/* Group gic-minimal: interrupts reach a CPU whose GIC was set up with only
 * what the architecture needs for delivery (rt.h, GIC_SETUP_MINIMAL), the
 * way bare-metal suites such as kvm-unit-tests do it, not Linux's way,
 * which every other group uses. In particular the redistributors are never
 * woken: GICR_WAKER.ProcessorSleep keeps its reset value 1 (GICv3/v4
 * architecture specification, Arm IHI 0069, GICR_WAKER), and BPR1, ICC_CTLR
 * and the private interrupts' priorities beyond the SGIs keep theirs. A VM
 * has no power controller to act on the redistributor's WakeRequest; KVM
 * and QEMU forward interrupts regardless, and so must Ignition.
 *
 * CPU 0 sends itself an SGI, takes its virtual timer's PPI (enabled, its
 * priority left at reset), and sends an SGI to CPU 1, each taken while the
 * receiver spins with PSTATE.I clear, within BOUND_S seconds. */
#include "rt.h"

const char test_group[] = "gic-minimal";
const enum gic_setup rt_gic_setup = GIC_SETUP_MINIMAL;

#define NCPUS  2
#define VTIMER 27

static volatile u64 got[MAX_CPUS][32];  /* per receiving CPU and INTID */

static void on_irq(u32 intid)
{
    if (intid == VTIMER) {
        write_sysreg(cntv_ctl_el0, 3ul);    /* ENABLE | IMASK: output low before the EOI */
        isb();
    }
    asm volatile("dmb ish" : : : "memory");
    got[cpu_id()][intid]++;
}

static void receiver(u32 cpu)
{
    (void)cpu;
    irq_enable();
    for (;;)            /* busy: no WFI, nothing that traps */
        barrier();
}

static void expect_taken(u32 cpu, u32 intid, u64 before, const char *what)
{
    if (!WAIT_FOR(got[cpu][intid] != before, BOUND_S)) {
        rt_lost(what, intid, cpu);
        t_fail("%s (INTID %u) not taken by cpu%u within %u s (GICR_WAKER 0x%x, GICR_ISPENDR0 0x%x, ISR_EL1 0x%lx)",
               what, intid, cpu, BOUND_S, r32(gicr_rd() + 0x14), r32(gicr_sgi() + 0x200),
               read_sysreg(isr_el1));
    }
}

void test_main(void)
{
    for (u32 i = 0; i < 32; i++)
        rt_set_irq_handler(i, on_irq);
    irq_enable();

    t_begin("minimal-waker-reset");     /* ProcessorSleep and ChildrenAsleep: reset 1 */
    u32 waker = r32(gicr_rd() + 0x14);
    if ((waker & 0x6) != 0x6)
        t_fail("GICR_WAKER = 0x%x, expected ProcessorSleep and ChildrenAsleep set out of reset", waker);
    t_end();

    t_begin("minimal-sgi-self");
    u64 before = got[0][1];
    write_sysreg(ICC_SGI1R_EL1, 1ul << 24 | 1ul);   /* INTID 1, TargetList = {cpu0} */
    isb();
    expect_taken(0, 1, before, "self-SGI");
    t_end();

    t_begin("minimal-ppi");             /* as kvm-unit-tests' timer test enables it */
    w32(gicr_sgi() + 0x100, 1u << VTIMER);          /* GICR_ISENABLER0 */
    before = got[0][VTIMER];
    write_sysreg(cntv_cval_el0, cnt_now() + cnt_freq() / 100);
    write_sysreg(cntv_ctl_el0, 1ul);                /* ENABLE */
    isb();
    expect_taken(0, VTIMER, before, "virtual timer PPI");
    write_sysreg(cntv_ctl_el0, 0ul);
    isb();
    t_end();

    t_begin("minimal-sgi-cpu1");
    u32 up = rt_start_cpus(NCPUS, receiver);
    if (up == NCPUS) {
        before = got[1][2];
        write_sysreg(ICC_SGI1R_EL1, 2ul << 24 | 1ul << 1);  /* INTID 2, TargetList = {cpu1} */
        isb();
        expect_taken(1, 2, before, "SGI to cpu1");
    }
    t_end();
}
