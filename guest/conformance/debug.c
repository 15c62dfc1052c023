/* Group debug: self-hosted debug exceptions taken to EL1 from EL1 and EL0
 * (Arm ARM, DDI 0487, "AArch64 Self-hosted Debug"): Breakpoint Instruction
 * (BRK), Breakpoint (DBGBVR0_EL1/DBGBCR0_EL1), Watchpoint
 * (DBGWVR0_EL1/DBGWCR0_EL1) and Software Step (MDSCR_EL1.SS with
 * SPSR_EL1.SS) exceptions. They are enabled by clearing the OS Lock
 * (OSLAR_EL1), MDSCR_EL1.MDE (breakpoints and watchpoints) and, for
 * exceptions from EL1 to EL1, MDSCR_EL1.KDE with PSTATE.D clear. */
#include "rt.h"

const char test_group[] = "debug";

extern char dbg_brk_fn[], dbg_bp_fn[], dbg_bp_at[], dbg_wp_fn[], dbg_wp_at[], dbg_step_fn[], dbg_step_end[];

#define MDSCR_SS  (1ul << 0)
#define MDSCR_KDE (1ul << 13)
#define MDSCR_MDE (1ul << 15)

static volatile u32 hits;
static volatile u64 hit_esr, hit_elr, hit_far;
static volatile u64 step_elr[8];
static volatile u32 steps, step_ec;
static volatile u64 watched __attribute__((aligned(8)));

static void record(struct frame *f)
{
    hits++;
    hit_esr = f->esr;
    hit_elr = f->elr;
    hit_far = f->far;
}

static int on_debug(struct frame *f, u32 ec)
{
    switch (ec) {
    case EC_BRK64:
        record(f);
        f->elr += 4;            /* BRK's preferred return is itself */
        return 1;
    case EC_BKPT_CUR: case EC_BKPT_LOW:
        record(f);
        write_sysreg(dbgbcr0_el1, 0);   /* else it hits again on return */
        isb();
        return 1;
    case EC_WPT_CUR: case EC_WPT_LOW:
        record(f);
        write_sysreg(dbgwcr0_el1, 0);
        isb();
        return 1;
    case EC_SSTEP_CUR: case EC_SSTEP_LOW:
        step_ec = ec;
        if (steps < 8)
            step_elr[steps] = f->elr;
        steps++;
        if (f->elr == (u64)dbg_step_end || steps >= 8) {
            write_sysreg(mdscr_el1, read_sysreg(mdscr_el1) & ~MDSCR_SS);
            isb();
        } else {
            f->spsr |= SPSR_SS;     /* step the next instruction too */
        }
        return 1;
    default:
        return 0;
    }
}

static u64 run(int el0, void *fn, u64 arg, u64 extra_spsr)
{
    hits = 0;
    hit_esr = hit_elr = hit_far = 0;
    return el0 ? run_el0(fn, arg, extra_spsr) : run_el1(fn, arg, extra_spsr);
}

static void expect_hit(u32 ec, u64 elr)
{
    u32 got = hit_esr >> 26;
    if (hits != 1)
        t_fail("%u debug exceptions, expected 1 (EC 0x%x at 0x%lx)", hits, ec, elr);
    else if (got != ec || hit_elr != elr)
        t_fail("EC 0x%x at ELR 0x%lx, expected EC 0x%x at 0x%lx", got, hit_elr, ec, elr);
}

static void brk(void)
{
    u64 r = run(0, dbg_brk_fn, 0, 0);
    expect_hit(EC_BRK64, (u64)dbg_brk_fn);
    if ((hit_esr & 0xffff) != 0x42 || r != 3)
        t_fail("ESR.ISS comment 0x%lx (expected 0x42), result %lu", hit_esr & 0xffff, r);
}

/* DBGBCR: E, PMC=0b11 (EL1 and EL0), BAS=0b1111, unlinked address match. */
static void breakpoint(int el0)
{
    write_sysreg(dbgbvr0_el1, (u64)dbg_bp_at);
    write_sysreg(dbgbcr0_el1, 1 | 3 << 1 | 0xf << 5);
    isb();
    u64 r = run(el0, dbg_bp_fn, 0, 0);
    write_sysreg(dbgbcr0_el1, 0);
    isb();
    expect_hit(el0 ? EC_BKPT_LOW : EC_BKPT_CUR, (u64)dbg_bp_at);
    if (r != 1)
        t_fail("the code did not finish after the breakpoint (result %lu)", r);
}

/* DBGWCR: E, PAC=0b11 (EL1 and EL0), LSC=0b10 (stores), BAS=0xff (8 bytes). */
static void watchpoint(int el0)
{
    watched = 0;
    write_sysreg(dbgwvr0_el1, (u64)&watched);
    write_sysreg(dbgwcr0_el1, 1 | 3 << 1 | 2 << 3 | 0xff << 5);
    isb();
    u64 r = run(el0, dbg_wp_fn, (u64)&watched, 0);
    write_sysreg(dbgwcr0_el1, 0);
    isb();
    expect_hit(el0 ? EC_WPT_LOW : EC_WPT_CUR, (u64)dbg_wp_at);
    if (hits == 1 && (hit_far < (u64)&watched || hit_far >= (u64)&watched + 8 || !(hit_esr & (1 << 6))))
        t_fail("FAR 0x%lx (watched 0x%lx), ESR.WnR %lu (store: 1)", hit_far, (u64)&watched, (hit_esr >> 6) & 1);
    if (watched != 0x5a || r != 2)
        t_fail("after the watchpoint the store wrote 0x%lx (expected 0x5a), result %lu", watched, r);
}

/* MDSCR_EL1.SS = 1 and SPSR_EL1.SS = 1 on the exception return: one
 * instruction, then a Software Step exception at the next one. */
static void step(int el0)
{
    steps = 0;
    step_ec = 0;
    write_sysreg(mdscr_el1, read_sysreg(mdscr_el1) | MDSCR_SS);
    isb();
    u64 r = run(el0, dbg_step_fn, 10, SPSR_SS);
    write_sysreg(mdscr_el1, read_sysreg(mdscr_el1) & ~MDSCR_SS);
    isb();
    u32 ec = el0 ? EC_SSTEP_LOW : EC_SSTEP_CUR;
    if (steps != 3 || step_ec != ec)
        t_fail("%u step exceptions (last EC 0x%x), expected 3 with EC 0x%x", steps, step_ec, ec);
    for (u32 i = 0; i < steps && i < 3; i++)
        if (step_elr[i] != (u64)dbg_step_fn + 4 * (i + 1))
            t_fail("step %u stopped at 0x%lx, expected 0x%lx", i + 1, step_elr[i], (u64)dbg_step_fn + 4 * (i + 1));
    if (r != 13)
        t_fail("the stepped code returned %lu, expected 13", r);
}

void test_main(void)
{
    rt_start_watchdog(1);
    rt_set_sync_handler(on_debug);
    u64 dfr0 = read_sysreg(id_aa64dfr0_el1);
    printf("# ID_AA64DFR0_EL1 0x%lx: DebugVer %u, BRPs %u, WRPs %u\n", dfr0, bits(dfr0, 0, 4),
           bits(dfr0, 12, 4) + 1, bits(dfr0, 20, 4) + 1);

    t_begin("debug-brk-el1");
    brk();
    t_end();

    write_sysreg(oslar_el1, 0);     /* OS Lock off */
    write_sysreg(mdscr_el1, (read_sysreg(mdscr_el1) | MDSCR_MDE | MDSCR_KDE) & ~MDSCR_SS);
    isb();
    if (read_sysreg(oslsr_el1) & 2) {
        t_begin("debug-os-lock");
        t_fail("OSLSR_EL1.OSLK still 1 after OSLAR_EL1 = 0");
        t_end();
    }

    t_begin("debug-breakpoint-el1");
    breakpoint(0);
    t_end();
    t_begin("debug-breakpoint-el0");
    breakpoint(1);
    t_end();
    t_begin("debug-watchpoint-el1");
    watchpoint(0);
    t_end();
    t_begin("debug-watchpoint-el0");
    watchpoint(1);
    t_end();
    t_begin("debug-step-el1");
    step(0);
    t_end();
    t_begin("debug-step-el0");
    step(1);
    t_end();
}
