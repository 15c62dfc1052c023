/* Group sgi: software-generated interrupts reach a vCPU that spins with
 * interrupts enabled (GICv3/v4 architecture specification, Arm IHI 0069,
 * ICC_SGI1R_EL1; Arm ARM, "Asynchronous exception types": an unmasked
 * pending IRQ is taken in finite time, here within BOUND_S seconds).
 *
 * CPU 0 sends: first to itself while it runs alone, then to CPUs 1-3,
 * which spin with PSTATE.I clear. ICC_SGI1R_EL1: TargetList
 * [15:0] (Aff0 bits within Aff3.Aff2.Aff1 = 0), INTID [27:24], IRM [40]
 * (1: every PE but the sender). Also measures raise-to-handler latency. */
#include "rt.h"

const char test_group[] = "sgi";

#define NCPUS   4
#define SAMPLES 100

static volatile u64 got[MAX_CPUS][16];  /* per receiving CPU and INTID; written by that CPU */
static volatile u64 taken_at[MAX_CPUS]; /* CNTVCT at the latest handler entry */
static u64 lat[SAMPLES];

static void on_sgi(u32 intid)
{
    u32 me = cpu_id();
    taken_at[me] = cnt_now();
    asm volatile("dmb ish" : : : "memory");
    got[me][intid]++;
}

static void receiver(u32 cpu)
{
    (void)cpu;
    irq_enable();
    for (;;)            /* busy: no WFI, nothing that traps */
        barrier();
}

static void send_sgi(u32 intid, u32 targets, int irm)
{
    write_sysreg(ICC_SGI1R_EL1, (u64)targets | (u64)intid << 24 | (irm ? 1ul << 40 : 0));
    isb();
}

static u32 pending0(void)
{
    return r32(gicr_sgi() + 0x200);     /* GICR_ISPENDR0 of this CPU */
}

/* Sends SGI `intid` and waits for every CPU in `expect` (a CPU bit mask) to
 * take it once; then checks the others did not. */
static void check_delivery(u32 intid, u32 targets, int irm, u32 expect)
{
    u64 before[MAX_CPUS];
    for (u32 c = 0; c < NCPUS; c++)
        before[c] = got[c][intid];
    send_sgi(intid, targets, irm);
    u32 missing = 0;
    for (u32 c = 0; c < NCPUS; c++) {
        if (!(expect & (1u << c)))
            continue;
        if (!WAIT_FOR(got[c][intid] != before[c], BOUND_S)) {
            missing++;
            rt_lost(irm ? "sgi-broadcast" : "sgi", intid, c);
            t_fail("missing=%u: SGI %u not taken by cpu%u within %u s (cpu0 GICR_ISPENDR0=0x%x, ISR_EL1=0x%lx)",
                   missing, intid, c, BOUND_S, pending0(), read_sysreg(isr_el1));
        }
    }
    for (u32 c = 0; c < NCPUS; c++)
        if (!(expect & (1u << c)) && got[c][intid] != before[c])
            t_fail("SGI %u also taken by cpu%u, which it does not target", intid, c);
}

/* Raise-to-handler ticks of SGI `intid` from CPU 0 to CPU `dst`. */
static void latency(const char *name, u32 intid, u32 dst)
{
    u32 n = 0;
    for (; n < SAMPLES; n++) {
        u64 before = got[dst][intid];
        u64 t0 = cnt_now();
        send_sgi(intid, 1u << dst, 0);
        if (!WAIT_FOR(got[dst][intid] != before, BOUND_S)) {
            rt_lost(name, intid, dst);
            break;
        }
        lat[n] = taken_at[dst] - t0;
    }
    print_latency(name, lat, n);
}

void test_main(void)
{
    for (u32 i = 0; i < 16; i++)
        rt_set_irq_handler(i, on_sgi);
    irq_enable();

    t_begin("sgi-self");        /* TargetList = {cpu0}, the sender, alone */
    check_delivery(1, 1u << 0, 0, 1u << 0);
    if (t_end())
        latency("sgi-self", 4, 0);

    t_begin("sgi-cpus-online");
    u32 up = rt_start_cpus(NCPUS, receiver);
    if (!t_end() || up != NCPUS)
        return;

    t_begin("sgi-target-list"); /* TargetList = {cpu1, cpu3} */
    check_delivery(2, (1u << 1) | (1u << 3), 0, (1u << 1) | (1u << 3));
    int list_ok = t_end();

    t_begin("sgi-broadcast");   /* IRM = 1: cpu1-3, not the sender */
    check_delivery(3, 0, 1, (1u << 1) | (1u << 2) | (1u << 3));
    t_end();

    if (list_ok) {
        latency("sgi-cross-cpu", 5, 1);
        latency("sgi-self-busy", 6, 0);  /* to itself again, the others spinning */
    }
}
