/* Entry, MMU, exception vectors and EL changes of every conformance image.
 *
 * The image is a Linux arm64 Image (Documentation/arch/arm64/booting.rst):
 * the boot CPU enters _start at EL1 with the MMU off and x0 = DTB address;
 * secondary CPUs enter secondary_entry through PSCI CPU_ON with
 * x0 = context_id = their CPU index. Each CPU maps memory 1:1 with a 4 KiB
 * granule (Arm ARM, "The AArch64 Virtual Memory System Architecture")
 * before touching the stack, then calls into C. */

#include "asm.h"

        .section .head, "ax"
        .global _start
_start:
        b       primary_entry           // code0
        .long   0                       // code1
        .quad   0x80000                 // text_offset
        .quad   _end - _start           // image_size, BSS included
        .quad   0                       // flags: LE, page size unspecified, 2 MiB base near DRAM start
        .quad   0, 0, 0                 // res2..res4
        .ascii  "ARM\x64"               // magic
        .long   0                       // res5 (no PE header)

        .text
primary_entry:
        msr     daifset, #0xf
        mov     x21, x0                 // DTB
        bl      build_page_tables       // x0 = 1 if the MMU can be used
        mov     x22, x0
        cbz     x22, 1f
        bl      mmu_on
1:      adr_l   x0, vectors
        msr     vbar_el1, x0
        // BSS (after the MMU: it is written through the cache).
        adr_l   x0, _bss_start
        adr_l   x1, _bss_end
2:      cmp     x0, x1
        b.hs    3f
        stp     xzr, xzr, [x0], #16
        b       2b
3:      adr_l   x0, rt_stacks
        add     sp, x0, #STACK_SIZE
        msr     tpidr_el1, xzr
        adr_l   x0, rt_dtb
        str     x21, [x0]
        adr_l   x0, rt_mmu_on
        str     x22, [x0]
        dc      cvac, x0                // secondaries read it with the MMU off
        dsb     sy
        bl      rt_primary              // never returns
        b       .

        .global secondary_entry
secondary_entry:
        msr     daifset, #0xf
        mov     x19, x0                 // CPU index
        adr_l   x0, rt_mmu_on
        ldr     x0, [x0]                // read with the MMU off: written back by the boot CPU
        cbz     x0, 1f
        bl      mmu_on
1:      adr_l   x0, vectors
        msr     vbar_el1, x0
        adr_l   x0, rt_stacks
        add     x1, x19, #1
        mov     x2, #STACK_SIZE
        madd    x0, x1, x2, x0
        mov     sp, x0
        msr     tpidr_el1, x19
        mov     x0, x19
        bl      rt_secondary            // never returns
        b       .

/* Identity map, 4 KiB granule, 32-bit VA (TCR_EL1.T0SZ = 32: the walk starts
 * at level 1): 0-1 GiB Device-nGnRnE (the GIC, PL011, ...),
 * 1-2 GiB through a level-2 table of 2 MiB blocks: the first (code) read-only
 * at EL1 and EL0 and executable, the next 255 (to 512 MiB of RAM) read-write
 * at EL1 and EL0 and execute-never. (Memory writable at EL0 is never
 * executable at EL1, so code and data need separate blocks for the EL0
 * tests.) Without the 4 KiB granule (ID_AA64MMFR0_EL1.TGran4 = 0xf) the MMU
 * stays off and x0 = 0. */
#define BLOCK           1
#define TABLE           3
#define ATTR_DEVICE     (0 << 2)
#define ATTR_NORMAL     (1 << 2)
#define AP_RW_ALL       (1 << 6)
#define AP_RO_ALL       (3 << 6)
#define SH_INNER        (3 << 8)
#define AF              (1 << 10)
#define XN              (3 << 53)       // PXN | UXN

build_page_tables:
        mrs     x0, id_aa64mmfr0_el1
        ubfx    x0, x0, #28, #4
        cmp     x0, #0xf
        b.ne    1f
        mov     x0, #0
        ret
1:      adr_l   x0, pg_l1
        adr_l   x1, pg_l2
        ldr     x2, =(BLOCK | ATTR_DEVICE | AF | XN)          // 0-1 GiB
        str     x2, [x0]
        orr     x2, x1, #TABLE                                 // 1-2 GiB
        str     x2, [x0, #8]
        stp     xzr, xzr, [x0, #16]
        ldr     x2, =(0x40000000 | BLOCK | ATTR_NORMAL | AP_RO_ALL | SH_INNER | AF)
        str     x2, [x1]
        ldr     x2, =(0x40200000 | BLOCK | ATTR_NORMAL | AP_RW_ALL | SH_INNER | AF | XN)
        mov     x3, #1
2:      str     x2, [x1, x3, lsl #3]
        add     x2, x2, #0x200000
        add     x3, x3, #1
        cmp     x3, #256
        b.lo    2b
3:      str     xzr, [x1, x3, lsl #3]
        add     x3, x3, #1
        cmp     x3, #512
        b.lo    3b
        // Written with the MMU off: drop any stale cached copy before the
        // walker reads the tables through the cache.
        dsb     sy
        mrs     x3, ctr_el0
        ubfx    x3, x3, #16, #4
        mov     x4, #4
        lsl     x3, x4, x3              // D-cache line, bytes
        add     x2, x1, #4096
4:      dc      ivac, x0
        add     x0, x0, x3
        cmp     x0, x2
        b.lo    4b
        dsb     sy
        mov     x0, #1
        ret

/* Turns the MMU and caches on with the tables above (clobbers x0-x2). */
mmu_on:
        ldr     x0, =0xff00             // MAIR: attr0 Device-nGnRnE, attr1 Normal WB
        msr     mair_el1, x0
        // T0SZ=32, IRGN0=ORGN0=WB, SH0=inner, TG0=4K, EPD1, TG1=4K, IPS=32 bits
        ldr     x0, =(32 | (1 << 8) | (1 << 10) | (3 << 12) | (1 << 23) | (2 << 30))
        msr     tcr_el1, x0
        adr_l   x0, pg_l1
        msr     ttbr0_el1, x0
        isb
        tlbi    vmalle1
        dsb     nsh
        isb
        mrs     x0, sctlr_el1
        ldr     x1, =((1 << 1) | (1 << 19) | (1 << 24) | (1 << 25))    // A, WXN, E0E, EE
        bic     x0, x0, x1
        // M, C, I, and SPAN: PSTATE.PAN stays 0 on exception entry, so EL1
        // handlers may touch the data EL0 shares.
        ldr     x1, =((1 << 0) | (1 << 2) | (1 << 12) | (1 << 23))
        orr     x0, x0, x1
        msr     sctlr_el1, x0
        isb
        ic      iallu
        dsb     nsh
        isb
        ret
        .ltorg

/* Exception vectors (VBAR_EL1; 16 entries of 0x80 bytes): every entry saves a struct frame
 * (rt.h) and calls rt_exception(frame, kind), kind = vector slot 0-15. */
        .balign 2048
vectors:
        .irp    kind, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        .balign 0x80
        sub     sp, sp, #FRAME_SIZE
        stp     x0, x1, [sp]
        mov     x1, #\kind
        b       exc_common
        .endr

exc_common:
        stp     x2, x3, [sp, #16]
        stp     x4, x5, [sp, #32]
        stp     x6, x7, [sp, #48]
        stp     x8, x9, [sp, #64]
        stp     x10, x11, [sp, #80]
        stp     x12, x13, [sp, #96]
        stp     x14, x15, [sp, #112]
        stp     x16, x17, [sp, #128]
        stp     x18, x19, [sp, #144]
        stp     x20, x21, [sp, #160]
        stp     x22, x23, [sp, #176]
        stp     x24, x25, [sp, #192]
        stp     x26, x27, [sp, #208]
        stp     x28, x29, [sp, #224]
        str     x30, [sp, #240]
        mrs     x2, elr_el1
        mrs     x3, spsr_el1
        stp     x2, x3, [sp, #248]
        mrs     x2, esr_el1
        mrs     x3, far_el1
        stp     x2, x3, [sp, #264]
        mrs     x2, sp_el0
        str     x2, [sp, #280]
        mov     x0, sp
        bl      rt_exception
        ldp     x2, x3, [sp, #248]
        msr     elr_el1, x2
        msr     spsr_el1, x3
        ldr     x2, [sp, #280]
        msr     sp_el0, x2
        ldp     x0, x1, [sp]
        ldp     x2, x3, [sp, #16]
        ldp     x4, x5, [sp, #32]
        ldp     x6, x7, [sp, #48]
        ldp     x8, x9, [sp, #64]
        ldp     x10, x11, [sp, #80]
        ldp     x12, x13, [sp, #96]
        ldp     x14, x15, [sp, #112]
        ldp     x16, x17, [sp, #128]
        ldp     x18, x19, [sp, #144]
        ldp     x20, x21, [sp, #160]
        ldp     x22, x23, [sp, #176]
        ldp     x24, x25, [sp, #192]
        ldp     x26, x27, [sp, #208]
        ldp     x28, x29, [sp, #224]
        ldr     x30, [sp, #240]
        add     sp, sp, #FRAME_SIZE
        eret

/* u64 run_at(entry, sp_el0, spsr, arg): exception-returns to `entry` with
 * PSTATE = spsr (EL0t, or EL1h sharing this stack) and x0 = arg. The code
 * there ends with `svc #0`; the SVC handler (rt.c) resumes at run_at_return
 * and run_at returns that code's x0. */
        .global run_at
run_at:
        sub     sp, sp, #112
        stp     x19, x20, [sp, #0]
        stp     x21, x22, [sp, #16]
        stp     x23, x24, [sp, #32]
        stp     x25, x26, [sp, #48]
        stp     x27, x28, [sp, #64]
        stp     x29, x30, [sp, #80]
        mrs     x4, daif
        str     x4, [sp, #96]
        msr     daifset, #0xf
        msr     sp_el0, x1
        msr     elr_el1, x0
        msr     spsr_el1, x2
        mov     x0, x3
        isb
        eret

        .global run_at_return
run_at_return:
        ldr     x4, [sp, #96]
        ldp     x19, x20, [sp, #0]
        ldp     x21, x22, [sp, #16]
        ldp     x23, x24, [sp, #32]
        ldp     x25, x26, [sp, #48]
        ldp     x27, x28, [sp, #64]
        ldp     x29, x30, [sp, #80]
        add     sp, sp, #112
        msr     daif, x4
        ret

        .section .pgtables, "aw", %nobits
        .balign 4096
pg_l1:  .skip   4096
pg_l2:  .skip   4096
