/* The conformance runtime (see rt.h). */
#include "rt.h"

/* Set by start.S. */
u64 rt_dtb;
u64 rt_mmu_on;
u8 rt_stacks[MAX_CPUS + 1][STACK_SIZE] __attribute__((aligned(16)));   /* +1: EL0 */

extern char secondary_entry[], run_at_return[];

static u32 psci_smc;        /* conduit: 0 = HVC, 1 = SMC (DTB /psci method) */
static u64 freq;
static volatile u32 print_lock, finish_lock;

/* ------------------------------------------------------------ locks, output */

static void lock(volatile u32 *l)
{
    u32 v, fail;
    if (!rt_mmu_on)     /* exclusives need Normal memory */
        return;
    asm volatile("1: ldaxr %w0, [%2]\n"
                 "   cbnz %w0, 1b\n"
                 "   stxr %w1, %w3, [%2]\n"
                 "   cbnz %w1, 1b\n"
                 : "=&r"(v), "=&r"(fail) : "r"(l), "r"(1) : "memory");
}

static void unlock(volatile u32 *l)
{
    asm volatile("stlr wzr, [%0]" : : "r"(l) : "memory");
}

/* Returns the old value; sets *l to 1. */
static u32 test_and_set(volatile u32 *l)
{
    u32 old, fail;
    if (!rt_mmu_on) {
        old = *l;
        *l = 1;
        return old;
    }
    asm volatile("1: ldaxr %w0, [%2]\n"
                 "   stxr %w1, %w3, [%2]\n"
                 "   cbnz %w1, 1b\n"
                 : "=&r"(old), "=&r"(fail) : "r"(l), "r"(1) : "memory");
    return old;
}

static void putc_raw(char c)
{
    while (r32(UART_BASE + 0x18) & (1 << 5))   /* FR.TXFF */
        ;
    w32(UART_BASE, (u8)c);
}

static void put_str(const char *s)
{
    while (*s)
        putc_raw(*s++);
}

static void put_num(u64 v, u32 base, int width, char pad, int neg)
{
    char buf[24];
    int i = 0;
    do {
        buf[i++] = "0123456789abcdef"[v % base];
        v /= base;
    } while (v);
    if (neg)
        buf[i++] = '-';
    while (i < width)
        buf[i++] = pad;
    while (i)
        putc_raw(buf[--i]);
}

/* %s %c %d %u %x with optional 0, width and l/ll. */
static void vprint(const char *fmt, va_list ap)
{
    for (; *fmt; fmt++) {
        if (*fmt != '%') {
            putc_raw(*fmt);
            continue;
        }
        fmt++;
        char pad = ' ';
        int width = 0, lng = 0;
        if (*fmt == '0') {
            pad = '0';
            fmt++;
        }
        while (*fmt >= '0' && *fmt <= '9')
            width = width * 10 + (*fmt++ - '0');
        while (*fmt == 'l') {
            lng = 1;
            fmt++;
        }
        switch (*fmt) {
        case 's': put_str(va_arg(ap, const char *)); break;
        case 'c': putc_raw((char)va_arg(ap, int)); break;
        case 'd': {
            s64 v = lng ? va_arg(ap, s64) : va_arg(ap, int);
            put_num(v < 0 ? -(u64)v : (u64)v, 10, width, pad, v < 0);
            break;
        }
        case 'u': put_num(lng ? va_arg(ap, u64) : va_arg(ap, u32), 10, width, pad, 0); break;
        case 'x': put_num(lng ? va_arg(ap, u64) : va_arg(ap, u32), 16, width, pad, 0); break;
        case '%': putc_raw('%'); break;
        default: putc_raw('?'); break;
        }
    }
}

void printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    lock(&print_lock);
    vprint(fmt, ap);
    unlock(&print_lock);
    va_end(ap);
}

/* ------------------------------------------------------------ tests */

static const char *t_name;     /* 0 before the first t_begin: "boot" */
static u32 t_open, t_fails_now, n_pass, n_fail;
static volatile u64 wd_deadline;   /* 0: disarmed */
static u32 wd_running;

static void wd_arm(void)
{
    if (wd_running) {
        wd_deadline = cnt_now() + WATCHDOG_S * freq;
        dsb_sy();
    }
}

void t_begin(const char *name)
{
    printf("# check %s\n", name);
    t_name = name;
    t_open = 1;
    t_fails_now = 0;
    wd_arm();
}

void t_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    lock(&print_lock);
    put_str(t_fails_now++ ? "#   also: " : "FAIL ");
    if (t_fails_now == 1) {
        put_str(t_name ? t_name : "boot");
        put_str(": ");
    }
    vprint(fmt, ap);
    putc_raw('\n');
    unlock(&print_lock);
    va_end(ap);
}

int t_failed(void)
{
    return t_fails_now != 0;
}

int t_end(void)
{
    wd_deadline = 0;
    t_open = 0;
    if (t_fails_now) {
        n_fail++;
        return 0;
    }
    printf("PASS %s\n", t_name);
    n_pass++;
    return 1;
}

NORETURN void rt_finish(void)
{
    if (test_and_set(&finish_lock))
        for (;;)
            asm volatile("wfi");
    if (t_fails_now && (t_open || !t_name))   /* cut short (exception, hang) or failed at boot */
        n_fail++;
    printf("RESULT pass=%u fail=%u\n", n_pass, n_fail);
    psci_call(PSCI_SYSTEM_OFF, 0, 0, 0);
    printf("# PSCI SYSTEM_OFF returned\n");
    for (;;)
        asm volatile("wfi");
}

void print_latency(const char *name, const u64 *ticks, u32 n)
{
    lock(&print_lock);
    put_str("LAT ");
    put_str(name);
    put_str(" hz=");
    put_num(freq, 10, 0, ' ', 0);
    put_str(" ticks=");
    for (u32 i = 0; i < n; i++) {
        if (i)
            putc_raw(',');
        put_num(ticks[i], 10, 0, ' ', 0);
    }
    putc_raw('\n');
    unlock(&print_lock);
}

void rt_lost(const char *what, u32 intid, u32 cpu)
{
    printf("LOST %s intid=%u cpu=%u\n", what, intid, cpu);
}

/* ------------------------------------------------------------ exceptions */

static irq_fn irq_handlers[1020];
static sync_fn sync_handler;
static volatile u32 probe_active, probe_faults, in_run_at;

void rt_set_irq_handler(u32 intid, irq_fn fn) { irq_handlers[intid] = fn; }
void rt_set_sync_handler(sync_fn fn) { sync_handler = fn; }

void rt_probe_begin(void)
{
    probe_faults = 0;
    probe_active = 1;
    barrier();
}

u32 rt_probe_end(void)
{
    barrier();
    probe_active = 0;
    return probe_faults;
}

static void irq(void)
{
    u32 intid = gic_ack();
    if (intid >= 1020)          /* spurious */
        return;
    if (irq_handlers[intid])
        irq_handlers[intid](intid);
    else
        printf("# cpu%u: unexpected IRQ %u\n", cpu_id(), intid);
    gic_eoi(intid);
}

static void leave_run_at(struct frame *f)
{
    in_run_at = 0;
    f->elr = (u64)run_at_return;
    f->spsr = SPSR_EL1H | SPSR_D | SPSR_A | SPSR_I | SPSR_F;
}

void rt_exception(struct frame *f, u64 kind)
{
    if (kind == VEC_IRQ_CUR || kind == VEC_IRQ_LOW) {
        irq();
        return;
    }
    if (kind == VEC_SYNC_CUR || kind == VEC_SYNC_LOW || kind == VEC_SYNC_LOW32) {
        u32 ec = f->esr >> 26;
        if (ec == EC_SVC64 || ec == EC_SVC32) {   /* end of run_at(): back to its caller at EL1 */
            leave_run_at(f);
            return;
        }
        if (probe_active && (ec == EC_UNKNOWN || ec == EC_SYSREG)) {
            probe_faults++;
            f->elr += 4;
            return;
        }
        if (sync_handler && sync_handler(f, ec))
            return;
    }
    t_fail("unexpected exception on cpu%u: vector slot %u, ESR 0x%lx (EC 0x%x), ELR 0x%lx, FAR 0x%lx, SPSR 0x%lx",
           cpu_id(), (u32)kind, f->esr, (u32)(f->esr >> 26), f->elr, f->far, f->spsr);
    if (in_run_at) {            /* abandon the code run_at runs; the next test goes on */
        f->x[0] = ~0ul;
        leave_run_at(f);
        return;
    }
    rt_finish();
}

u64 run_el0(void *entry, u64 arg, u64 extra_spsr)
{
    u64 sp = (u64)rt_stacks[MAX_CPUS] + STACK_SIZE;
    in_run_at = 1;
    return run_at(entry, sp, SPSR_EL0T | SPSR_A | SPSR_I | SPSR_F | extra_spsr, arg);
}

u64 run_el1(void *entry, u64 arg, u64 extra_spsr)
{
    in_run_at = 1;
    return run_at(entry, 0, SPSR_EL1H | SPSR_A | SPSR_I | SPSR_F | extra_spsr, arg);
}

/* ------------------------------------------------------------ timer, PSCI */

u64 cnt_freq(void)
{
    return freq;
}

s64 psci_call(u64 fn, u64 a1, u64 a2, u64 a3)
{
    register u64 x0 asm("x0") = fn;
    register u64 x1 asm("x1") = a1;
    register u64 x2 asm("x2") = a2;
    register u64 x3 asm("x3") = a3;
    if (psci_smc)
        asm volatile("smc #0" : "+r"(x0), "+r"(x1), "+r"(x2), "+r"(x3) : :
                     "x4", "x5", "x6", "x7", "x8", "x9", "x10", "x11", "x12", "x13", "x14", "x15",
                     "x16", "x17", "memory");
    else
        asm volatile("hvc #0" : "+r"(x0), "+r"(x1), "+r"(x2), "+r"(x3) : :
                     "x4", "x5", "x6", "x7", "x8", "x9", "x10", "x11", "x12", "x13", "x14", "x15",
                     "x16", "x17", "memory");
    return (s64)x0;
}

/* ------------------------------------------------------------ device tree */

static u32 be32(const u8 *p)
{
    return (u32)p[0] << 24 | (u32)p[1] << 16 | (u32)p[2] << 8 | p[3];
}

static int str_eq(const char *a, const char *b)
{
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}

static int starts_with(const char *s, const char *prefix)
{
    while (*prefix)
        if (*s++ != *prefix++)
            return 0;
    return 1;
}

/* The `method` property of the /psci node (devicetree specification 0.4,
 * 5.4: the structure block), or 0. */
static const char *fdt_psci_method(const u8 *fdt)
{
    if (!fdt || be32(fdt) != 0xd00dfeed)
        return 0;
    const u8 *p = fdt + be32(fdt + 8);
    const char *strings = (const char *)fdt + be32(fdt + 12);
    int depth = 0, in_psci = 0;
    for (;;) {
        u32 tok = be32(p);
        p += 4;
        if (tok == 1) {                             /* FDT_BEGIN_NODE */
            const char *name = (const char *)p;
            u32 len = 0;
            while (name[len])
                len++;
            depth++;
            if (depth == 2 && starts_with(name, "psci"))
                in_psci = 1;
            p += (len + 4) & ~3u;
        } else if (tok == 2) {                      /* FDT_END_NODE */
            if (depth == 2)
                in_psci = 0;
            depth--;
        } else if (tok == 3) {                      /* FDT_PROP */
            u32 len = be32(p), nameoff = be32(p + 4);
            if (in_psci && str_eq(strings + nameoff, "method"))
                return (const char *)p + 8;
            p += 8 + ((len + 3) & ~3u);
        } else if (tok == 4) {                      /* FDT_NOP */
        } else {                                    /* FDT_END or garbage */
            return 0;
        }
    }
}

/* ------------------------------------------------------------ GICv3 */

static u64 rd_base[MAX_CPUS];

/* A weak reference: 0 unless the group defines rt_gic_setup (rt.h). */
extern const enum gic_setup rt_gic_setup __attribute__((weak));

static enum gic_setup gic_setup(void)
{
    return &rt_gic_setup ? rt_gic_setup : GIC_SETUP_LINUX;
}

u64 gicr_rd(void)
{
    return rd_base[cpu_id()];
}

static int wait_clear(u64 reg, u32 mask)
{
    return WAIT_FOR(!(r32(reg) & mask), BOUND_S);
}

void gic_wait_rwp(void)
{
    if (!wait_clear(GICD_BASE + 0x0, 1u << 31))
        t_fail("GICD_CTLR.RWP stuck at 1");
}

/* Distributor (GICD_CTLR): affinity routing, group 1 on; every
 * SPI group 1, disabled, priority 0x80, routed to CPU 0 (GIC_SETUP_MINIMAL:
 * only group 1, then enabled). */
static void gic_init_dist(void)
{
    w32(GICD_BASE + 0x0, 0);
    gic_wait_rwp();
    u32 lines = (bits(r32(GICD_BASE + 0x4), 0, 5) + 1) * 32;
    if (gic_setup() == GIC_SETUP_MINIMAL) {
        w32(GICD_BASE + 0x0, (1 << 4) | (1 << 1) | 1);  /* ARE_NS, EnableGrp1(A|NS) */
        gic_wait_rwp();
        for (u32 i = 0; i < lines; i += 32)
            w32(GICD_BASE + 0x080 + i / 8, ~0u);    /* IGROUPR */
        return;
    }
    for (u32 i = 32; i < lines; i += 32) {
        w32(GICD_BASE + 0x080 + i / 8, ~0u);        /* IGROUPR */
        w32(GICD_BASE + 0x180 + i / 8, ~0u);        /* ICENABLER */
        w32(GICD_BASE + 0x280 + i / 8, ~0u);        /* ICPENDR */
        w32(GICD_BASE + 0x380 + i / 8, ~0u);        /* ICACTIVER */
    }
    for (u32 i = 32; i < lines; i += 4)
        w32(GICD_BASE + 0x400 + i, 0x80808080);     /* IPRIORITYR */
    for (u32 i = 32; i < lines; i++)
        w64(GICD_BASE + 0x6000 + 8 * i, 0);         /* IROUTER: CPU 0 */
    gic_wait_rwp();
    w32(GICD_BASE + 0x0, (1 << 4) | (1 << 1) | 1);  /* ARE_NS, EnableGrp1(A|NS) */
    gic_wait_rwp();
}

static u32 mpidr_aff(u64 mpidr)
{
    return bits(mpidr, 0, 24) | bits(mpidr, 32, 8) << 24;
}

/* GIC_SETUP_MINIMAL for this CPU's redistributor at `rd`: its SGIs and
 * PPIs group 1, SGIs at priority 0xA0 and enabled, PMR 0xF0, group 1
 * enabled; nothing else written. */
static void gic_init_cpu_minimal(u64 rd)
{
    u64 sgi = rd + GICR_SGI;
    w32(sgi + 0x080, ~0u);                          /* IGROUPR0 */
    for (u32 i = 0; i < 16; i += 4)
        w32(sgi + 0x400 + i, 0xa0a0a0a0);           /* IPRIORITYR: SGIs */
    w32(sgi + 0x100, 0xffff);                       /* ISENABLER0: SGIs */
    write_sysreg(ICC_PMR_EL1, 0xf0);
    write_sysreg(ICC_IGRPEN1_EL1, 1);
    isb();
}

/* This CPU's redistributor (GICv3 9.x: GICR_TYPER.Affinity_Value, Last)
 * woken (GICR_WAKER), its SGIs and PPIs group 1, priority 0x80, SGIs
 * enabled; the CPU interface through system registers (ICC_SRE_EL1.SRE),
 * PMR open, group 1 enabled. GIC_SETUP_MINIMAL: gic_init_cpu_minimal. */
static void gic_init_cpu(void)
{
    u32 me = mpidr_aff(read_sysreg(mpidr_el1));
    u64 rd = GICR_BASE;
    for (int i = 0;; i++, rd += GICR_STRIDE) {
        u32 typer_lo = r32(rd + 0x8), aff = r32(rd + 0xc);
        if (aff == me)
            break;
        if ((typer_lo & (1 << 4)) || i > 64) {
            t_fail("no redistributor for MPIDR affinity 0x%x", me);
            rt_finish();
        }
    }
    rd_base[cpu_id()] = rd;
    if (gic_setup() == GIC_SETUP_MINIMAL) {
        gic_init_cpu_minimal(rd);
        return;
    }
    w32(rd + 0x14, r32(rd + 0x14) & ~(1u << 1));    /* WAKER.ProcessorSleep */
    if (!wait_clear(rd + 0x14, 1u << 2))
        t_fail("GICR_WAKER.ChildrenAsleep stuck at 1");
    u64 sgi = rd + GICR_SGI;
    w32(sgi + 0x080, ~0u);                          /* IGROUPR0 */
    w32(sgi + 0x180, ~0u);                          /* ICENABLER0 */
    w32(sgi + 0x280, ~0u);                          /* ICPENDR0 */
    w32(sgi + 0x380, ~0u);                          /* ICACTIVER0 */
    for (u32 i = 0; i < 32; i += 4)
        w32(sgi + 0x400 + i, 0x80808080);           /* IPRIORITYR */
    if (!wait_clear(rd + 0x0, 1u << 3))             /* GICR_CTLR.RWP */
        t_fail("GICR_CTLR.RWP stuck at 1");
    w32(sgi + 0x100, 0xffff);                       /* ISENABLER0: SGIs */

    write_sysreg(ICC_SRE_EL1, read_sysreg(ICC_SRE_EL1) | 7);
    isb();
    if (!(read_sysreg(ICC_SRE_EL1) & 1))
        t_fail("ICC_SRE_EL1.SRE reads 0: no system-register GIC CPU interface");
    write_sysreg(ICC_PMR_EL1, 0xff);
    write_sysreg(ICC_BPR1_EL1, 0);
    write_sysreg(ICC_CTLR_EL1, 0);                  /* EOImode 0 */
    write_sysreg(ICC_IGRPEN1_EL1, 1);
    isb();
}

void gic_enable_private(u32 intid, u8 prio)
{
    u64 sgi = gicr_sgi();
    *(volatile u8 *)(sgi + 0x400 + intid) = prio;
    w32(sgi + 0x100, 1u << intid);
}

void gic_enable_spi(u32 intid, u8 prio, u32 target_cpu)
{
    *(volatile u8 *)(GICD_BASE + 0x400 + intid) = prio;
    w64(GICD_BASE + 0x6000 + 8 * intid, target_cpu);   /* Aff0 = CPU index on both machines */
    w32(GICD_BASE + 0x100 + (intid / 32) * 4, 1u << (intid % 32));
    gic_wait_rwp();
}

/* ------------------------------------------------------------ CPUs */

static volatile u32 online[MAX_CPUS];
static cpu_fn secondary_fn;

void rt_secondary(u32 cpu)
{
    gic_init_cpu();
    online[cpu] = 1;
    dsb_sy();
    secondary_fn(cpu);
    for (;;)
        asm volatile("wfi");
}

u32 rt_start_cpus(u32 n, cpu_fn fn)
{
    u32 up = 0;
    secondary_fn = fn;
    dsb_sy();
    for (u32 cpu = 1; cpu < n && cpu < MAX_CPUS; cpu++) {
        s64 r = psci_call(PSCI_CPU_ON, cpu, (u64)secondary_entry, cpu);
        if (r != 0) {
            t_fail("PSCI CPU_ON(cpu %u) returned %ld", cpu, r);
            continue;
        }
        if (WAIT_FOR(online[cpu], BOUND_S))
            up++;
        else
            t_fail("cpu%u did not come online within %u s", cpu, BOUND_S);
    }
    return up + 1;
}

static void watchdog(u32 cpu)
{
    for (;;) {
        u64 d = wd_deadline;
        if (d && cnt_now() > d) {
            t_fail("hang: still running after %u s (watchdog on cpu%u)", WATCHDOG_S, cpu);
            rt_finish();
        }
    }
}

void rt_start_watchdog(u32 cpu)
{
    secondary_fn = watchdog;
    dsb_sy();
    if (psci_call(PSCI_CPU_ON, cpu, (u64)secondary_entry, cpu) == 0 && WAIT_FOR(online[cpu], BOUND_S))
        wd_running = 1;
    else
        printf("# no watchdog CPU: a hang ends only by the runner's timeout\n");
}

/* ------------------------------------------------------------ boot CPU */

void rt_primary(void)
{
    freq = read_sysreg(cntfrq_el0);
    const char *method = fdt_psci_method((const u8 *)rt_dtb);
    psci_smc = method && str_eq(method, "smc");
    u32 el = bits(read_sysreg(CurrentEL), 2, 2);
    printf("# conformance group %s: EL%u, MMU %s, PSCI conduit %s (DTB method %s), CNTFRQ %lu Hz, MIDR 0x%lx\n",
           test_group, el, rt_mmu_on ? "on (4K identity map)" : "off", psci_smc ? "smc" : "hvc",
           method ? method : "not found", freq, read_sysreg(midr_el1));
    if (el != 1) {
        t_fail("entered at EL%u; the suite expects EL1", el);
        rt_finish();
    }
    if (!freq) {
        t_fail("CNTFRQ_EL0 is 0");
        rt_finish();
    }
    gic_init_dist();
    gic_init_cpu();
    if (t_failed())
        rt_finish();
    test_main();
    rt_finish();
}
