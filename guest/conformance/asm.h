/* Shared by the assembly files and rt.h: sizes and an address macro. */
#ifndef ASM_H
#define ASM_H

#define MAX_CPUS        4
#define STACK_SIZE      0x4000          /* per CPU */
#define FRAME_SIZE      288             /* struct frame in rt.h */

#ifdef __ASSEMBLER__
/* PC-relative address of a symbol anywhere within +-4 GiB. */
        .macro  adr_l, reg, sym
        adrp    \reg, \sym
        add     \reg, \reg, :lo12:\sym
        .endm
#endif

#endif
