/* Code that snapshot.c runs at EL1 through run_el1(): each piece ends with
 * `svc #0`, which returns to the caller of run_at. */

        .text
        .global snap_bp_fn, snap_bp_at
snap_bp_fn:                     // a breakpoint on snap_bp_at; x0 = 1
        nop
snap_bp_at:
        nop
        mov     x0, #1
        svc     #0

        .global snap_wp_fn, snap_wp_at
snap_wp_fn:                     // x0 = address: stores 0x5a there; x0 = 2
        mov     x1, #0x5a
snap_wp_at:
        str     x1, [x0]
        mov     x0, #2
        svc     #0
