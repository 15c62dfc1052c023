/* Code that debug.c runs at EL0 and EL1 through run_el0()/run_el1(): each
 * piece ends with `svc #0`, which returns to the caller of run_at. It sits
 * in .text, which the identity map makes executable at both levels. */

        .text
        .global dbg_brk_fn
dbg_brk_fn:                     // BRK #0x42, then x0 = 3
        brk     #0x42
        mov     x0, #3
        svc     #0

        .global dbg_bp_fn, dbg_bp_at
dbg_bp_fn:                      // a breakpoint on dbg_bp_at; x0 = 1
        nop
dbg_bp_at:
        nop
        mov     x0, #1
        svc     #0

        .global dbg_wp_fn, dbg_wp_at
dbg_wp_fn:                      // x0 = address: stores 0x5a there; x0 = 2
        mov     x1, #0x5a
dbg_wp_at:
        str     x1, [x0]
        mov     x0, #2
        svc     #0

        .global dbg_step_fn, dbg_step_end
dbg_step_fn:                    // three steps, then x0 = arg + 3
        add     x0, x0, #1
        add     x0, x0, #1
        add     x0, x0, #1
dbg_step_end:
        svc     #0
