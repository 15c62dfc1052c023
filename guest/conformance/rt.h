/* The conformance runtime: output, test bookkeeping, exceptions, the GICv3,
 * the generic timer, PSCI and secondary CPUs. See rt.c and
 * book/src/conformance.md. Every test image is one group: it defines
 * `test_group` and `test_main()`, reports PASS/FAIL lines per check, and the
 * runtime prints `RESULT pass=N fail=M` and calls PSCI SYSTEM_OFF. */
#ifndef RT_H
#define RT_H

#include "asm.h"
#include <stdarg.h>
#include <stdint.h>

typedef uint64_t u64;
typedef int64_t s64;
typedef uint32_t u32;
typedef uint8_t u8;

#define NORETURN __attribute__((noreturn))

/* System registers. The GICv3 and newer ID registers are named by encoding
 * (op0_op1_CRn_CRm_op2) so no assembler version matters. */
#define ICC_PMR_EL1         S3_0_C4_C6_0
#define ICC_DIR_EL1         S3_0_C12_C11_1
#define ICC_RPR_EL1         S3_0_C12_C11_3
#define ICC_SGI1R_EL1       S3_0_C12_C11_5
#define ICC_IAR1_EL1        S3_0_C12_C12_0
#define ICC_EOIR1_EL1       S3_0_C12_C12_1
#define ICC_HPPIR1_EL1      S3_0_C12_C12_2
#define ICC_BPR1_EL1        S3_0_C12_C12_3
#define ICC_CTLR_EL1        S3_0_C12_C12_4
#define ICC_SRE_EL1         S3_0_C12_C12_5
#define ICC_IGRPEN1_EL1     S3_0_C12_C12_7

#define STR_(x) #x
#define STR(x) STR_(x)
#define read_sysreg(r) ({ u64 v_; asm volatile("mrs %0, " STR(r) : "=r"(v_)); v_; })
#define write_sysreg(r, v) asm volatile("msr " STR(r) ", %0" : : "r"((u64)(v)) : "memory")
#define isb() asm volatile("isb" : : : "memory")
#define dsb_sy() asm volatile("dsb sy" : : : "memory")
#define barrier() asm volatile("" : : : "memory")
#define irq_enable() asm volatile("msr daifclr, #2\n isb" : : : "memory")
#define irq_disable() asm volatile("msr daifset, #2" : : : "memory")
#define debug_enable() asm volatile("msr daifclr, #8\n isb" : : : "memory")
#define debug_disable() asm volatile("msr daifset, #8\n isb" : : : "memory")

static inline u32 bits(u64 v, int lo, int width) { return (v >> lo) & ((1ull << width) - 1); }

/* MMIO: QEMU virt memory map, which Ignition follows. */
#define UART_BASE   0x09000000ul
#define GICD_BASE   0x08000000ul
#define GICR_BASE   0x080A0000ul
#define GICR_STRIDE 0x20000ul
#define GICR_SGI    0x10000ul        /* SGI_base frame, after RD_base */

static inline void w32(u64 a, u32 v) { *(volatile u32 *)a = v; }
static inline u32 r32(u64 a) { return *(volatile u32 *)a; }
static inline void w64(u64 a, u64 v) { *(volatile u64 *)a = v; }

/* Saved state of an exception (start.S builds it; handlers may change it). */
struct frame {
    u64 x[31];
    u64 elr, spsr, esr, far, sp_el0;
};

/* Vector slots (start.S `kind`): current EL with SP_ELx, lower EL AArch64,
 * lower EL AArch32. */
enum { VEC_SYNC_CUR = 4, VEC_IRQ_CUR = 5, VEC_SYNC_LOW = 8, VEC_IRQ_LOW = 9, VEC_SYNC_LOW32 = 12 };

/* ESR_ELx.EC values (Arm ARM, ESR_EL1). */
enum {
    EC_UNKNOWN = 0x00, EC_SVC32 = 0x11, EC_SVC64 = 0x15, EC_SYSREG = 0x18,
    EC_BKPT_LOW = 0x30, EC_BKPT_CUR = 0x31, EC_SSTEP_LOW = 0x32, EC_SSTEP_CUR = 0x33,
    EC_WPT_LOW = 0x34, EC_WPT_CUR = 0x35, EC_BRK64 = 0x3c,
};

/* SPSR_EL1 fields (Arm ARM, SPSR_EL1). */
#define SPSR_EL0T  0x0ul
#define SPSR_EL1H  0x5ul
#define SPSR_F     (1ul << 6)
#define SPSR_I     (1ul << 7)
#define SPSR_A     (1ul << 8)
#define SPSR_D     (1ul << 9)
#define SPSR_SS    (1ul << 21)
#define SPSR_AARCH32_USR 0x10ul   /* M[4] = 1 (AArch32), M[3:0] = User */

/* Output (PL011; one lock so lines from several CPUs do not mix). */
void printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Tests: t_begin("name") ... t_fail("detail") ... t_end() prints
 * `PASS name` or `FAIL name: detail` (first failure; more as `#` lines). */
extern const char test_group[];
void test_main(void);
void t_begin(const char *name);
void t_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int t_end(void);
int t_failed(void);
NORETURN void rt_finish(void);

/* Exceptions. An IRQ is acknowledged through ICC_IAR1_EL1, given to the
 * handler registered for its INTID, then EOI'd. A synchronous exception
 * other than the runtime's own goes to the sync handler (returns 1 if it
 * handled it); otherwise it fails the current test and ends the run
 * (inside run_el0/run_el1: returns from there). */
typedef void (*irq_fn)(u32 intid);
typedef int (*sync_fn)(struct frame *f, u32 ec);
void rt_set_irq_handler(u32 intid, irq_fn fn);
void rt_set_sync_handler(sync_fn fn);

/* Probing: with rt_probe_begin() active, an UNDEFINED instruction or a
 * trapped system register access is skipped; rt_probe_end() returns how
 * many were. */
void rt_probe_begin(void);
u32 rt_probe_end(void);

/* Runs `entry(arg)` at EL0 (with its own stack) or at EL1 (sharing this
 * stack) with extra SPSR bits (e.g. SPSR_SS); the code ends with `svc #0`
 * (A64 or A32);
 * returns its x0. Interrupts stay masked; at EL1 PSTATE.D is clear. An
 * unexpected exception there fails the current test and returns ~0. */
u64 run_at(void *entry, u64 sp_el0, u64 spsr, u64 arg);
u64 run_el0(void *entry, u64 arg, u64 extra_spsr);
u64 run_el1(void *entry, u64 arg, u64 extra_spsr);

/* Generic timer (Arm ARM, "The Generic Timer in AArch64 state"). */
static inline u64 cnt_now(void) { isb(); return read_sysreg(cntvct_el0); }
u64 cnt_freq(void);
static inline u64 cnt_ms(u64 ms) { return cnt_freq() * ms / 1000; }

/* Polls `cond` until it holds or `secs` seconds of guest time pass;
 * the result is the final value of `cond`. */
#define WAIT_FOR(cond, secs) ({                                     \
    u64 end_ = cnt_now() + (u64)(secs) * cnt_freq();                \
    while (!(cond) && cnt_now() < end_)                             \
        barrier();                                                  \
    !!(cond);                                                       \
})
#define BOUND_S 5   /* the bounded wait for any event, guest seconds */

/* GICv3 (GICv3/v4 architecture specification, Arm IHI 0069). */
/* How the runtime sets up the GIC before test_main and on each secondary
 * CPU. Without a definition in the group, GIC_SETUP_LINUX: what
 * Linux's GICv3 driver does (every redistributor woken through GICR_WAKER,
 * private interrupts swept inactive and disabled, BPR1 and ICC_CTLR
 * written). A group that defines it GIC_SETUP_MINIMAL gets only what the
 * architecture needs for delivery, as bare-metal suites such as
 * kvm-unit-tests do it: distributor enabled, everything group 1, SGIs at
 * priority 0xA0 and enabled, PMR 0xF0, group 1 enabled; GICR_WAKER, BPR1,
 * ICC_CTLR and IROUTER stay at their reset values. */
enum gic_setup { GIC_SETUP_LINUX, GIC_SETUP_MINIMAL };
extern const enum gic_setup rt_gic_setup;
u64 gicr_rd(void);                  /* this CPU's RD_base */
static inline u64 gicr_sgi(void) { return gicr_rd() + GICR_SGI; }
void gic_enable_private(u32 intid, u8 prio);  /* SGI/PPI on this CPU */
void gic_enable_spi(u32 intid, u8 prio, u32 target_cpu);
void gic_wait_rwp(void);
static inline u32 gic_ack(void) { return read_sysreg(ICC_IAR1_EL1) & 0xffffff; }
static inline void gic_eoi(u32 intid) { write_sysreg(ICC_EOIR1_EL1, intid); isb(); }

/* PSCI 1.0 (Arm DEN 0022) through the conduit the DTB names. */
s64 psci_call(u64 fn, u64 a1, u64 a2, u64 a3);
#define PSCI_CPU_ON     0xC4000003ul
#define PSCI_SYSTEM_OFF 0x84000008ul

/* CPUs. */
static inline u32 cpu_id(void) { return read_sysreg(tpidr_el1); }
typedef void (*cpu_fn)(u32 cpu);
/* Starts CPUs 1..n-1 running fn (after their GIC setup); returns how many
 * came online within the bounded wait. */
u32 rt_start_cpus(u32 n, cpu_fn fn);
/* Starts CPU `cpu` as a watchdog: a test still running WATCHDOG_S seconds
 * after its t_begin fails ("hang") and the run ends. Without one a hang
 * ends only by the runner's timeout. */
#define WATCHDOG_S 10
void rt_start_watchdog(u32 cpu);

/* Latency samples: `LAT name hz=F ticks=a,b,...` for scripts/ignition/conformance/. */
void print_latency(const char *name, const u64 *ticks, u32 n);
/* An interrupt raised for `cpu` and not taken within BOUND_S of guest time:
 * `LOST what intid=N cpu=C`, a lost wake-up (scripts/ignition/conformance/
 * reports every one, in a check or a latency run alike). */
void rt_lost(const char *what, u32 intid, u32 cpu);

#endif
