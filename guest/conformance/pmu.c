/* Group pmu: a PMU the ID registers advertise must work (Arm ARM, "The
 * Performance Monitors Extension"). ID_AA64DFR0_EL1.PMUVer [11:8]:
 * 0 = none, 0xf = IMPLEMENTATION DEFINED (both: nothing to check). Else the
 * cycle counter PMCCNTR_EL0 counts while PMCR_EL0.E and PMCNTENSET_EL0.C
 * are set and stops when disabled, and every common event that PMCEID0_EL0
 * lists as implemented among SW_INCR (0x00), INST_RETIRED (0x08) and
 * CPU_CYCLES (0x11) counts on event counter 0. */
#include "rt.h"

const char test_group[] = "pmu";

#define PMCR_E  (1ul << 0)
#define PMCR_P  (1ul << 1)
#define PMCR_C  (1ul << 2)
#define PMCR_LC (1ul << 6)
#define LOOPS   100000

static void spin(u32 n)
{
    for (volatile u32 i = 0; i < n; i++)
        ;
}

static void cycle_counter(void)
{
    rt_probe_begin();
    write_sysreg(pmccfiltr_el0, 0);                 /* count at EL0 and EL1 */
    write_sysreg(pmcr_el0, read_sysreg(pmcr_el0) | PMCR_E | PMCR_C | PMCR_LC);
    write_sysreg(pmcntenset_el0, 1ul << 31);
    isb();
    u64 c0 = read_sysreg(pmccntr_el0);
    spin(LOOPS);
    u64 c1 = read_sysreg(pmccntr_el0);
    write_sysreg(pmcntenclr_el0, 1ul << 31);
    isb();
    u64 s0 = read_sysreg(pmccntr_el0);
    spin(LOOPS);
    u64 s1 = read_sysreg(pmccntr_el0);
    if (rt_probe_end()) {
        t_fail("PMU registers UNDEFINED although PMUVer advertises a PMU");
        return;
    }
    printf("# PMCCNTR_EL0 counted %lu over %u loop iterations\n", c1 - c0, LOOPS);
    if (c1 <= c0)
        t_fail("PMCCNTR_EL0 did not count: 0x%lx before and 0x%lx after %u loop iterations", c0, c1, LOOPS);
    if (s1 != s0)
        t_fail("PMCCNTR_EL0 counted while disabled: 0x%lx -> 0x%lx", s0, s1);
}

/* Event counter 0 counting `event`; returns its value after `work`. */
static u64 count_event(u32 event, void (*work)(void))
{
    write_sysreg(pmcntenclr_el0, 1);
    write_sysreg(pmevtyper0_el0, event);            /* filter bits 0: EL0 and EL1 */
    write_sysreg(pmcr_el0, read_sysreg(pmcr_el0) | PMCR_E | PMCR_P);
    write_sysreg(pmcntenset_el0, 1);
    isb();
    work();
    isb();
    write_sysreg(pmcntenclr_el0, 1);
    isb();
    return read_sysreg(pmevcntr0_el0);
}

static void sw_incr3(void)
{
    for (int i = 0; i < 3; i++)
        write_sysreg(pmswinc_el0, 1);
}

static void loops(void)
{
    spin(LOOPS);
}

static void events(void)
{
    u64 pmcr = read_sysreg(pmcr_el0), ceid0 = read_sysreg(pmceid0_el0);
    printf("# PMCR_EL0 0x%lx (N=%u event counters), PMCEID0_EL0 0x%lx\n", pmcr, bits(pmcr, 11, 5), ceid0);
    if (bits(pmcr, 11, 5) == 0)
        return;
    if (ceid0 & (1 << 0)) {
        u64 n = count_event(0x00, sw_incr3);
        if (n != 3)
            t_fail("SW_INCR (advertised): 3 writes to PMSWINC_EL0 counted %lu", n);
    }
    if (ceid0 & (1 << 8)) {
        u64 n = count_event(0x08, loops);
        if (n < LOOPS)
            t_fail("INST_RETIRED (advertised) counted %lu over %u loop iterations", n, LOOPS);
    }
    if (ceid0 & (1 << 17)) {
        u64 n = count_event(0x11, loops);
        if (n == 0)
            t_fail("CPU_CYCLES (advertised) counted 0 over %u loop iterations", LOOPS);
    }
}

void test_main(void)
{
    u64 dfr0 = read_sysreg(id_aa64dfr0_el1);
    u32 pmuver = bits(dfr0, 8, 4);
    printf("# ID_AA64DFR0_EL1.PMUVer = 0x%x\n", pmuver);
    if (pmuver == 0 || pmuver == 0xf) {
        t_begin("pmu-not-advertised");
        t_end();
        return;
    }
    t_begin("pmu-cycle-counter");
    cycle_counter();
    t_end();
    t_begin("pmu-events");
    events();
    t_end();
}
