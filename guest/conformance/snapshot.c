/* Group snapshot: debug and interrupt state that must survive a snapshot
 * Before a pause point the image programs a hardware breakpoint
 * (DBGBVR0/DBGBCR0), a watchpoint (DBGWVR0/DBGWCR0), the virtual timer 300
 * ms ahead, and a self-SGI made pending while PSTATE.I masks it; it prints
 * `# ready` and waits for a byte on the PL011. The runner either sends the
 * byte at once (straight through, as on QEMU), or snapshots the VM there,
 * restores it and sends the byte to the restored VM. Either way each must
 * then fire exactly once, as if nothing had happened: the SGI when PSTATE.I
 * is cleared, the timer not before its CVAL and with ISTATUS, the breakpoint
 * and the watchpoint with their exception classes and addresses (Arm ARM,
 * AArch64 self-hosted debug; the Generic Timer; GICv3 SGIs). */
#include "rt.h"

const char test_group[] = "snapshot";

extern char snap_bp_fn[], snap_bp_at[], snap_wp_fn[], snap_wp_at[];

#define SGI     5
#define VTIMER  27
#define ENABLE  1ul
#define IMASK   2ul
#define ISTATUS 4ul
#define MDSCR_KDE (1ul << 13)
#define MDSCR_MDE (1ul << 15)
#define UART_FR   0x18
#define UART_CR   0x30
#define FR_RXFE   (1u << 4)
#define CR_UARTEN (1u << 0)
#define CR_RXE    (1u << 9)

static volatile u32 sgi_hits, timer_hits, bp_hits, wp_hits;
static volatile u64 timer_at, timer_ctl, bp_elr, bp_esr, wp_elr, wp_esr, wp_far;
static volatile u64 watched __attribute__((aligned(8)));

static void on_sgi(u32 intid)
{
    (void)intid;
    sgi_hits++;
}

static void on_timer(u32 intid)
{
    (void)intid;
    timer_at = cnt_now();
    timer_ctl = read_sysreg(cntv_ctl_el0);
    write_sysreg(cntv_ctl_el0, ENABLE | IMASK);     /* output low before the EOI */
    isb();
    timer_hits++;
}

static int on_debug(struct frame *f, u32 ec)
{
    switch (ec) {
    case EC_BKPT_CUR: case EC_BKPT_LOW:
        bp_hits++;
        bp_elr = f->elr;
        bp_esr = f->esr;
        write_sysreg(dbgbcr0_el1, 0);   /* else it hits again on return */
        isb();
        return 1;
    case EC_WPT_CUR: case EC_WPT_LOW:
        wp_hits++;
        wp_elr = f->elr;
        wp_esr = f->esr;
        wp_far = f->far;
        write_sysreg(dbgwcr0_el1, 0);
        isb();
        return 1;
    default:
        return 0;
    }
}

/* Prints `# ready` and waits for one byte of console input. */
static void pause_point(void)
{
    w32(UART_BASE + UART_CR, r32(UART_BASE + UART_CR) | CR_UARTEN | CR_RXE);
    printf("# ready\n");
    while (r32(UART_BASE + UART_FR) & FR_RXFE)
        barrier();
    (void)r32(UART_BASE);
}

void test_main(void)
{
    rt_set_sync_handler(on_debug);
    rt_set_irq_handler(SGI, on_sgi);
    rt_set_irq_handler(VTIMER, on_timer);
    irq_disable();
    write_sysreg(oslar_el1, 0);     /* OS Lock off */
    write_sysreg(mdscr_el1, MDSCR_MDE | MDSCR_KDE);
    /* Breakpoint: E, PMC = EL1 and EL0, BAS = 0b1111. Watchpoint: E, PAC =
     * EL1 and EL0, LSC = stores, BAS = 8 bytes. */
    write_sysreg(dbgbvr0_el1, (u64)snap_bp_at);
    write_sysreg(dbgbcr0_el1, 1 | 3 << 1 | 0xf << 5);
    write_sysreg(dbgwvr0_el1, (u64)&watched);
    write_sysreg(dbgwcr0_el1, 1 | 3 << 1 | 2 << 3 | 0xff << 5);
    gic_enable_private(SGI, 0x80);
    gic_enable_private(VTIMER, 0x80);
    u64 cval = cnt_now() + cnt_ms(300);
    write_sysreg(cntv_cval_el0, cval);
    write_sysreg(cntv_ctl_el0, ENABLE);
    write_sysreg(ICC_SGI1R_EL1, (u64)SGI << 24 | 1);    /* to this CPU (Aff0 0) */
    isb();

    pause_point();

    t_begin("snapshot-sgi");
    irq_enable();
    if (!WAIT_FOR(sgi_hits, BOUND_S))
        rt_lost("snapshot-sgi", SGI, 0);
    if (sgi_hits != 1)
        t_fail("the pending SGI was taken %u times, expected once", sgi_hits);
    t_end();

    t_begin("snapshot-timer");
    if (!WAIT_FOR(timer_hits, BOUND_S))
        rt_lost("snapshot-timer", VTIMER, 0);
    if (timer_hits != 1)
        t_fail("the timer interrupt was taken %u times, expected once", timer_hits);
    else if (timer_at < cval || !(timer_ctl & ISTATUS))
        t_fail("taken at count %lu (CVAL %lu), CTL 0x%lx", timer_at, cval, timer_ctl);
    irq_disable();
    t_end();

    t_begin("snapshot-breakpoint");
    u64 r = run_el1(snap_bp_fn, 0, 0);
    if (bp_hits != 1 || bits(bp_esr, 26, 6) != EC_BKPT_CUR || bp_elr != (u64)snap_bp_at || r != 1)
        t_fail("%u breakpoint exceptions (ESR 0x%lx, ELR 0x%lx, expected EC 0x%x at 0x%lx), result %lu",
               bp_hits, bp_esr, bp_elr, EC_BKPT_CUR, (u64)snap_bp_at, r);
    t_end();

    t_begin("snapshot-watchpoint");
    r = run_el1(snap_wp_fn, (u64)&watched, 0);
    if (wp_hits != 1 || bits(wp_esr, 26, 6) != EC_WPT_CUR || wp_elr != (u64)snap_wp_at)
        t_fail("%u watchpoint exceptions (ESR 0x%lx, ELR 0x%lx, expected EC 0x%x at 0x%lx)",
               wp_hits, wp_esr, wp_elr, EC_WPT_CUR, (u64)snap_wp_at);
    else if (wp_far < (u64)&watched || wp_far >= (u64)&watched + 8 || watched != 0x5a || r != 2)
        t_fail("FAR 0x%lx (watched 0x%lx), stored 0x%lx, result %lu", wp_far, (u64)&watched, watched, r);
    t_end();
}
