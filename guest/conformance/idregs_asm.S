/* One instruction (or a few) per feature that idregs.c checks; each returns
 * a value with a known answer. Assembled for Armv8.5-A with the optional
 * extensions, but only called when the ID registers advertise them. */

        .text
        .macro  fn name
        .global \name
        .type   \name, %function
\name:
        .endm

fn feat_fp                      // 1.0 + 1.0 as a double: 0x4000000000000000
        fmov    d0, #1.0
        fadd    d0, d0, d0
        fmov    x0, d0
        ret
fn feat_simd                    // sum of sixteen byte lanes of 1: 16
        movi    v0.16b, #1
        addv    b0, v0.16b
        umov    w0, v0.b[0]
        ret
fn feat_aes                     // AESE of a zero state with a zero key: SubBytes(0) = 0x63 per byte
        movi    v0.16b, #0
        movi    v1.16b, #0
        aese    v0.16b, v1.16b
        umov    x0, v0.d[0]
        ret
fn feat_sha1                    // SHA1H(1) = ROL(1, 30) = 0x40000000
        mov     w1, #1
        fmov    s1, w1
        sha1h   s0, s1
        fmov    w0, s0
        ret
fn feat_sha256                  // executes; returns 0
        movi    v0.16b, #0
        movi    v1.16b, #0
        movi    v2.16b, #0
        sha256h q0, q1, v2.4s
        mov     x0, #0
        ret
fn feat_crc32b                  // crc32b(w0, w1)
        crc32b  w0, w0, w1
        ret
fn feat_ldadd                   // *x0 += x1; returns the old value
        ldadd   x1, x2, [x0]
        mov     x0, x2
        ret
fn feat_udot                    // UDOT of 4 lanes of 2 and 3: 24
        movi    v0.4s, #0
        movi    v1.16b, #2
        movi    v2.16b, #3
        udot    v0.4s, v1.16b, v2.16b
        umov    w0, v0.s[0]
        ret
fn feat_ldapr                   // load-acquire RCpc of *x0
        ldapr   x0, [x0]
        ret
fn feat_rndr                    // RNDR; returns NZCV (Z=1: no entropy, still defined)
        mrs     x1, s3_3_c2_c4_0
        mrs     x0, nzcv
        ret
fn feat_sve_vl                  // RDVL: vector length in bytes
        rdvl    x0, #1
        ret
fn dc_zva                       // DC ZVA of x0's block
        dc      zva, x0
        ret
fn at_s1e1r                     // AT S1E1R x0; returns PAR_EL1
        at      s1e1r, x0
        isb
        mrs     x0, par_el1
        ret

        .balign 4
        .global a32_svc                 // A32 code for EL0: r0 = 42, SVC #0
a32_svc:
        .inst   0xe3a0002a              // mov r0, #42
        .inst   0xef000000              // svc #0
