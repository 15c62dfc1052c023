/*
 * hv_vcpu_set_simd_fp_reg(hv_vcpu_t, hv_simd_fp_reg_t, hv_simd_fp_uchar16_t):
 * calls the C stand-in probe_set_simd_fp_reg (same prototype) with the
 * arguments untouched, then leaves every register AAPCS64 lets a callee
 * change holding garbage: x1-x17, the upper half of x0 (hv_return_t is w0),
 * v0-v7 and v16-v31, and the upper halves of v8-v15. A caller that declares
 * too few clobbers, or reads x0 for the result, then computes wrong values.
 */
    .text
    .globl hv_vcpu_set_simd_fp_reg
    .type hv_vcpu_set_simd_fp_reg, %function
hv_vcpu_set_simd_fp_reg:
    stp x29, x30, [sp, #-16]!
    mov x29, sp
    bl probe_set_simd_fp_reg
    mov w10, w0
    movz x0, #0xbad1, lsl #32
    orr x0, x0, x10
    movz x9, #0xdead, lsl #48
    movk x9, #0xbeef, lsl #16
    mov x1, x9
    mov x2, x9
    mov x3, x9
    mov x4, x9
    mov x5, x9
    mov x6, x9
    mov x7, x9
    mov x8, x9
    mov x10, x9
    mov x11, x9
    mov x12, x9
    mov x13, x9
    mov x14, x9
    mov x15, x9
    mov x16, x9
    mov x17, x9
    dup v0.2d, x9
    dup v1.2d, x9
    dup v2.2d, x9
    dup v3.2d, x9
    dup v4.2d, x9
    dup v5.2d, x9
    dup v6.2d, x9
    dup v7.2d, x9
    mov v8.d[1], x9
    mov v9.d[1], x9
    mov v10.d[1], x9
    mov v11.d[1], x9
    mov v12.d[1], x9
    mov v13.d[1], x9
    mov v14.d[1], x9
    mov v15.d[1], x9
    dup v16.2d, x9
    dup v17.2d, x9
    dup v18.2d, x9
    dup v19.2d, x9
    dup v20.2d, x9
    dup v21.2d, x9
    dup v22.2d, x9
    dup v23.2d, x9
    dup v24.2d, x9
    dup v25.2d, x9
    dup v26.2d, x9
    dup v27.2d, x9
    dup v28.2d, x9
    dup v29.2d, x9
    dup v30.2d, x9
    dup v31.2d, x9
    ldp x29, x30, [sp], #16
    ret
    .size hv_vcpu_set_simd_fp_reg, .-hv_vcpu_set_simd_fp_reg
    .section .note.GNU-stack, "", %progbits
