/* Group idregs: the ID registers (Arm ARM, ID_AA64*_EL1), printed
 * as `ID name 0x...` lines for the book, and checked for consistency: every
 * ID register in the ID space reads at EL1 (unallocated ones as zero, Arm ARM
 * "op0=3, op1=0, CRn=0" encodings), and each advertised feature checked here
 * works. */
#include "rt.h"

const char test_group[] = "idregs";

u64 feat_fp(void), feat_simd(void), feat_aes(void), feat_sha1(void), feat_sha256(void);
u32 feat_crc32b(u32 acc, u32 byte);
u64 feat_ldadd(volatile u64 *p, u64 add), feat_udot(void), feat_ldapr(volatile u64 *p);
u64 feat_rndr(void), feat_sve_vl(void), at_s1e1r(u64 va);
void dc_zva(volatile void *p);
extern char a32_svc[];

static const char *const id_names[] = {
    "MIDR_EL1", "MPIDR_EL1", "REVIDR_EL1",
    "ID_AA64PFR0_EL1", "ID_AA64PFR1_EL1", "ID_AA64PFR2_EL1", "ID_AA64ZFR0_EL1", "ID_AA64SMFR0_EL1",
    "ID_AA64DFR0_EL1", "ID_AA64DFR1_EL1", "ID_AA64AFR0_EL1", "ID_AA64AFR1_EL1",
    "ID_AA64ISAR0_EL1", "ID_AA64ISAR1_EL1", "ID_AA64ISAR2_EL1",
    "ID_AA64MMFR0_EL1", "ID_AA64MMFR1_EL1", "ID_AA64MMFR2_EL1", "ID_AA64MMFR3_EL1",
    "CTR_EL0", "DCZID_EL0", "CLIDR_EL1",
};
enum { MIDR, MPIDR, REVIDR, PFR0, PFR1, PFR2, ZFR0, SMFR0, DFR0, DFR1, AFR0, AFR1,
       ISAR0, ISAR1, ISAR2, MMFR0, MMFR1, MMFR2, MMFR3, CTR, DCZID, CLIDR, N_IDS };
static u64 id_values[N_IDS];

static u64 read_id(int i)
{
    switch (i) {
    case MIDR: return read_sysreg(midr_el1);
    case MPIDR: return read_sysreg(mpidr_el1);
    case REVIDR: return read_sysreg(revidr_el1);
    case PFR0: return read_sysreg(id_aa64pfr0_el1);
    case PFR1: return read_sysreg(id_aa64pfr1_el1);
    case PFR2: return read_sysreg(S3_0_C0_C4_2);
    case ZFR0: return read_sysreg(S3_0_C0_C4_4);
    case SMFR0: return read_sysreg(S3_0_C0_C4_5);
    case DFR0: return read_sysreg(id_aa64dfr0_el1);
    case DFR1: return read_sysreg(id_aa64dfr1_el1);
    case AFR0: return read_sysreg(id_aa64afr0_el1);
    case AFR1: return read_sysreg(id_aa64afr1_el1);
    case ISAR0: return read_sysreg(id_aa64isar0_el1);
    case ISAR1: return read_sysreg(id_aa64isar1_el1);
    case ISAR2: return read_sysreg(S3_0_C0_C6_2);
    case MMFR0: return read_sysreg(id_aa64mmfr0_el1);
    case MMFR1: return read_sysreg(id_aa64mmfr1_el1);
    case MMFR2: return read_sysreg(S3_0_C0_C7_2);
    case MMFR3: return read_sysreg(S3_0_C0_C7_3);
    case CTR: return read_sysreg(ctr_el0);
    case DCZID: return read_sysreg(dczid_el0);
    case CLIDR: return read_sysreg(clidr_el1);
    }
    return 0;
}

static u64 id(int i) { return id_values[i]; }

/* Runs `expr` with UNDEFINED instructions skipped; fails naming `what` if
 * one was, or if the result differs from `want`. */
#define CHECK_FEATURE(what, expr, want) do {                                   \
    rt_probe_begin();                                                          \
    u64 got_ = (expr);                                                         \
    if (rt_probe_end())                                                        \
        t_fail("%s advertised, but its instruction is UNDEFINED", what);       \
    else if (got_ != (u64)(want))                                              \
        t_fail("%s advertised, but it gave 0x%lx (expected 0x%lx)", what,      \
               got_, (u64)(want));                                             \
} while (0)

static u32 crc32b_ref(u32 crc, u8 byte)    /* CRC-32 (0x04C11DB7, reflected), one byte */
{
    crc ^= byte;
    for (int i = 0; i < 8; i++)
        crc = (crc >> 1) ^ (0xEDB88320u & -(crc & 1));
    return crc;
}

static volatile u64 scratch;

static void isa(void)
{
    u64 pfr0 = id(PFR0), isar0 = id(ISAR0), isar1 = id(ISAR1);
    u32 fp = bits(pfr0, 16, 4), simd = bits(pfr0, 20, 4);
    if (fp != simd)
        t_fail("ID_AA64PFR0_EL1.FP=0x%x but AdvSIMD=0x%x: they must be equal", fp, simd);
    write_sysreg(cpacr_el1, read_sysreg(cpacr_el1) | 3 << 20 | 3 << 16);   /* FPEN, ZEN: no traps */
    isb();
    if (fp != 0xf)
        CHECK_FEATURE("FP", feat_fp(), 0x4000000000000000ul);
    if (simd != 0xf)
        CHECK_FEATURE("AdvSIMD", feat_simd(), 16);
    if (bits(isar0, 4, 4))
        CHECK_FEATURE("AES (ID_AA64ISAR0_EL1.AES)", feat_aes(), 0x6363636363636363ul);
    if (bits(isar0, 8, 4))
        CHECK_FEATURE("SHA1", feat_sha1(), 0x40000000);
    if (bits(isar0, 12, 4))
        CHECK_FEATURE("SHA2", feat_sha256(), 0);
    if (bits(isar0, 16, 4))
        CHECK_FEATURE("CRC32", feat_crc32b(0x12345678, 0x61), crc32b_ref(0x12345678, 0x61));
    if (bits(isar0, 20, 4) >= 2) {
        scratch = 5;
        CHECK_FEATURE("LSE atomics (ID_AA64ISAR0_EL1.Atomic)", feat_ldadd(&scratch, 3) << 8 | scratch, 5 << 8 | 8);
    }
    if (bits(isar0, 44, 4))
        CHECK_FEATURE("DotProd", feat_udot(), 24);
    if (bits(isar0, 60, 4)) {
        rt_probe_begin();
        feat_rndr();
        if (rt_probe_end())
            t_fail("RNDR advertised, but reading it is UNDEFINED");
    }
    if (bits(isar1, 20, 4)) {
        scratch = 0x5a;
        CHECK_FEATURE("LRCPC (LDAPR)", feat_ldapr(&scratch), 0x5a);
    }
    if (bits(pfr0, 32, 4)) {
        rt_probe_begin();
        u64 vl = feat_sve_vl();
        if (rt_probe_end())
            t_fail("SVE advertised, but RDVL is UNDEFINED");
        else if (vl < 16 || vl % 16)
            t_fail("SVE vector length %lu bytes", vl);
    } else if (id(ZFR0)) {
        t_fail("ID_AA64ZFR0_EL1 = 0x%lx without SVE", id(ZFR0));
    }
}

/* The breakpoint and watchpoint counts (ID_AA64DFR0_EL1.BRPs/WRPs, + 1)
 * are exact: the last advertised DBGBVR/DBGWVR holds a value, the next one
 * is UNDEFINED. */
#define BVR(n) case n: write_sysreg(dbgbvr##n##_el1, v); return read_sysreg(dbgbvr##n##_el1);
#define WVR(n) case n: write_sysreg(dbgwvr##n##_el1, v); return read_sysreg(dbgwvr##n##_el1);
static u64 bvr_rw(u32 n, u64 v)
{
    switch (n) { BVR(0) BVR(1) BVR(2) BVR(3) BVR(4) BVR(5) BVR(6) BVR(7) BVR(8) BVR(9) BVR(10) BVR(11)
                 BVR(12) BVR(13) BVR(14) BVR(15) }
    return 0;
}
static u64 wvr_rw(u32 n, u64 v)
{
    switch (n) { WVR(0) WVR(1) WVR(2) WVR(3) WVR(4) WVR(5) WVR(6) WVR(7) WVR(8) WVR(9) WVR(10) WVR(11)
                 WVR(12) WVR(13) WVR(14) WVR(15) }
    return 0;
}

static void debug_counts(void)
{
    u64 dfr0 = id(DFR0);
    u32 brps = bits(dfr0, 12, 4) + 1, wrps = bits(dfr0, 20, 4) + 1;
    if (bits(dfr0, 0, 4) < 6)
        t_fail("DebugVer 0x%x < 6 (Armv8.0 debug)", bits(dfr0, 0, 4));
    for (int w = 0; w < 2; w++) {
        u32 n = w ? wrps : brps;
        u64 (*rw)(u32, u64) = w ? wvr_rw : bvr_rw;
        const char *name = w ? "DBGWVR" : "DBGBVR";
        rt_probe_begin();
        u64 got = rw(n - 1, 0x40080000);
        u32 f1 = rt_probe_end();
        if (f1 || got != 0x40080000)
            t_fail("%s%u_EL1 (the last of %u advertised) %s", name, n - 1, n,
                   f1 ? "is UNDEFINED" : "does not hold a value");
        rw(n - 1, 0);
        if (n < 16) {
            rt_probe_begin();
            rw(n, 0x40080000);
            if (!rt_probe_end())
                t_fail("%s%u_EL1 exists, but only %u are advertised", name, n, n);
        }
    }
}

/* Each translation granule ID_AA64MMFR0_EL1 advertises translates: a
 * two-level table through TTBR1_EL1 (TCR_EL1.TG1, T1SZ chosen so the walk
 * starts at level 2) maps one page; AT S1E1R and a load through it agree. */
static u64 gr_l2[8192] __attribute__((aligned(65536)));
static u64 gr_l3[8192] __attribute__((aligned(65536)));
static u64 gr_page[8192] __attribute__((aligned(65536)));

static void granule(const char *name, u32 shift, u32 t1sz, u64 tg1)
{
    u64 entries = 1ul << (shift - 3);
    for (u64 i = 0; i < entries; i++)
        gr_l2[i] = gr_l3[i] = 0;
    gr_page[0] = 0x6772616e756c6500ul | shift;
    gr_l2[0] = (u64)gr_l3 | 3;                                              /* table */
    gr_l3[0] = (u64)gr_page | 3 | 1 << 2 | 3 << 8 | 1 << 10 | 3ul << 53;    /* page, Normal, AF, XN */
    dsb_sy();
    u64 tcr = read_sysreg(tcr_el1);
    u64 t = (tcr & ~(0x3ful << 16 | 0xfful << 23 | 3ul << 30)) |
            (u64)t1sz << 16 | 1 << 24 | 1 << 26 | 3 << 28 | tg1 << 30;     /* WB walks, inner shareable */
    write_sysreg(ttbr1_el1, (u64)gr_l2);
    write_sysreg(tcr_el1, t);
    asm volatile("isb\n tlbi vmalle1\n dsb nsh\n isb" : : : "memory");
    u64 va = ~0ul << (64 - t1sz);
    rt_probe_begin();
    u64 par = at_s1e1r(va + 0x128);
    u32 f1 = rt_probe_end();
    u64 data = 0;
    if (!f1 && !(par & 1))
        data = *(volatile u64 *)va;
    write_sysreg(tcr_el1, tcr);
    write_sysreg(ttbr1_el1, 0);
    asm volatile("isb\n tlbi vmalle1\n dsb nsh\n isb" : : : "memory");
    if (f1)
        t_fail("%s granule: AT S1E1R is UNDEFINED", name);
    else if (par & 1)
        t_fail("%s granule advertised, but the walk faults: PAR_EL1 0x%lx (FST 0x%lx)", name, par, (par >> 1) & 0x3f);
    else if ((par & 0xfffffffff000ul) != (u64)gr_page || data != gr_page[0])
        t_fail("%s granule: PAR_EL1 0x%lx for page 0x%lx, load gave 0x%lx", name, par, (u64)gr_page, data);
}

static void granules(void)
{
    u64 m = id(MMFR0);
    if (bits(m, 28, 4) != 0xf)
        granule("4K", 12, 34, 2);
    if (bits(m, 20, 4) != 0)
        granule("16K", 14, 28, 1);
    if (bits(m, 24, 4) != 0xf)
        granule("64K", 16, 22, 3);
}

/* DCZID_EL0.DZP = 0: DC ZVA zeroes exactly one block of 4 << BS bytes. */
static u8 zbuf[8192] __attribute__((aligned(4096)));

static void dczva(void)
{
    u64 d = id(DCZID);
    if (d & 16)
        return;
    u32 block = 4u << bits(d, 0, 4);
    for (u32 i = 0; i < 3 * block; i++)
        zbuf[i] = 0xff;
    rt_probe_begin();
    dc_zva(zbuf + block);
    if (rt_probe_end()) {
        t_fail("DC ZVA permitted (DCZID_EL0.DZP=0) but UNDEFINED");
        return;
    }
    for (u32 i = 0; i < 3 * block; i++) {
        u8 want = i >= block && i < 2 * block ? 0 : 0xff;
        if (zbuf[i] != want) {
            t_fail("DC ZVA (block %u bytes): byte %u is 0x%x", block, i, zbuf[i]);
            break;
        }
    }
}

/* ID_AA64PFR0_EL1.EL0 = 2: EL0 can run AArch32. An exception return to
 * User mode (SPSR_EL1.M = 0b10000) runs A32 code whose SVC is
 * taken from a lower EL in AArch32 (vector offset 0x600, EC 0x11). */
static void aarch32_el0(void)
{
    if (bits(id(PFR0), 0, 4) != 2)
        return;
    u64 r = run_el0(a32_svc, 0, SPSR_AARCH32_USR);
    if (r != 42)
        t_fail("AArch32 EL0 advertised (ID_AA64PFR0_EL1.EL0=2), but A32 code at EL0 returned 0x%lx", r);
}

void test_main(void)
{
    rt_start_watchdog(1);
    t_begin("idregs-readable");
    for (int i = 0; i < N_IDS; i++) {
        rt_probe_begin();
        id_values[i] = read_id(i);
        if (rt_probe_end())
            t_fail("%s is UNDEFINED at EL1", id_names[i]);
        printf("ID %s 0x%016lx\n", id_names[i], id_values[i]);
    }
    t_end();

    t_begin("idregs-el2-el3");  /* the guest runs at EL1; HVC and SMC reach the VMM */
    if (bits(id(PFR0), 8, 4) || bits(id(PFR0), 12, 4))
        t_fail("ID_AA64PFR0_EL1 advertises EL2=%u EL3=%u to a guest entered at EL1 that cannot use them",
               bits(id(PFR0), 8, 4), bits(id(PFR0), 12, 4));
    t_end();

    t_begin("idregs-gic");      /* the runtime uses the GICv3 system-register interface */
    if (!bits(id(PFR0), 24, 4))
        t_fail("ID_AA64PFR0_EL1.GIC = 0, but the GICv3 CPU interface system registers work");
    t_end();

    t_begin("idregs-isa");
    isa();
    t_end();

    t_begin("idregs-debug");
    debug_counts();
    t_end();

    t_begin("idregs-granules");
    granules();
    t_end();

    t_begin("idregs-dc-zva");
    dczva();
    t_end();

    t_begin("idregs-aarch32-el0");  /* last: a backend may hang here */
    aarch32_el0();
    t_end();
}
