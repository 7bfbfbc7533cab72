/* vmath.h - branch-free float32 approximations of exp, log, tanh, sigmoid,
 * erf, gelu and gelu_tanh, written so that gcc vectorizes them inside
 * `#pragma omp simd` loops (and plain -O3 loops).
 *
 * Self-contained (only <stdint.h> and <string.h>), every function static
 * inline with its constants beside it, so that code generators can copy
 * them as they are.  Each function uses only IEEE float add/sub/mul/div,
 * float<->int32 conversions, integer and bit operations on the float's bits,
 * and selects through bit masks (em_vm_sel): no table lookups, no branches,
 * no libm.
 * The error bounds below hold with or without FMA contraction of a*b + c
 * (results may then differ in the last bit); without it (gcc's default in
 * ISO C mode) every build computes the same IEEE operations in the same
 * order, so scalar, SSE2, AVX2 and AVX-512 code give bitwise identical
 * results.  They DO need IEEE semantics: never compile these with
 * -ffast-math, -ffinite-math-only or -fassociative-math (the NaN/inf
 * handling and the Cody-Waite and rounding tricks rely on them).
 * em_vgelu_tanhf also uses double arithmetic (a few operations).
 *
 * Measured accuracy, max error against double libm in ulps of the float32
 * result, every float32 input (exhaustive), built for SSE2 / with FMA
 * contraction (-march=native -ffp-contract=fast):
 *   em_vexpf      0.990 / 1.010  (subnormal results included)
 *   em_vlogf      0.835 / 0.756  (subnormal inputs included)
 *   em_vtanhf     1.509 / 1.509
 *   em_vsigmoidf  2.402 / 2.402
 *   em_verff      1.075 / 1.047
 * and on samples (every 7th to 31st float32):
 *   em_vgeluf       2.64 ulp for x >= -1; relative error <= 1.6e-5 for
 *                   -5.5 <= x < -1 (the rounding of x/sqrt 2 and of the
 *                   erfc polynomial is amplified by exp, ~x^2 ulp); -0
 *                   below x = -5.55, where |gelu| < 8.1e-8.
 *   em_vgelu_tanhf  3.1 ulp for x >= -10; below, where exp(-|2u|) is
 *                   subnormal, relative error <= 4e-7 while the result is
 *                   normal, and |x| subnormal ulps once it is subnormal.
 * Errors are in ulps of the result, which is a relative error for every
 * normal result: near 0, tanh and erf use an odd polynomial x + x P(x^2),
 * which keeps tiny results exact (tanh(x) = x; erf(x) = x + 0.128x).
 * tests/test_vmath.c sweeps them through em_exp etc. and asserts bounds.
 *
 * Special values: exp(-inf) = 0, exp(+inf) = +inf, exp(NaN) = NaN; exp
 * overflows to +inf for x > 88.7228 and underflows gradually: subnormal
 * results are computed (scaled by two exact powers of two, rounded once),
 * and are exactly 0 below about -103.97.  log(+-0) = -inf, log(x < 0) = NaN
 * (-inf included), log(+inf) = +inf, log(NaN) = NaN, subnormal inputs exact
 * to the bound above.  tanh(+-inf) = +-1, erf(+-inf) = +-1, sigmoid(+inf) =
 * 1, sigmoid(-inf) = 0, and NaN in gives NaN out for every function.
 * gelu(-inf) and gelu_tanh(-inf) are NaN (-inf * 0, as the formulas
 * x/2 (1 + erf(..)) give in any precision); gelu(+inf) = +inf.
 *
 * Methods:
 *  exp:  Cephes expf (S. L. Moshier): x = n ln2 + r with n = round(x/ln2)
 *        (by the 1.5*2^23 rounding trick), r by a two-constant Cody-Waite
 *        reduction, exp(r) = 1 + r + r^2 P(r) with P of degree 5, then 2^n
 *        built from exponent bits as 2^(n/2) * 2^(n - n/2) so that results
 *        near overflow and in the subnormal range are scaled exactly.
 *  log:  FreeBSD/fdlibm logf (Sun Microsystems): x = 2^k (1 + f) with
 *        sqrt(2)/2 <= 1 + f < sqrt(2) from the exponent bits (subnormals
 *        scaled by 2^23 first), s = f/(2+f), log(1+f) = f - f^2/2 + s(f^2/2
 *        + R(s^2)) with fdlibm's degree-4 R, plus k*ln2 in two parts.
 *  tanh: |x| < 0.625: x + x^3 P(x^2), P of degree 5, a minimax fit (Remez,
 *        relative error 2^-27.8 with the float coefficients);
 *        |x| >= 0.625: (1 - e)/(1 + e) with e = exp(-2|x|), sign copied.
 *  sigmoid: e = exp(-|x|); 1/(1 + e) for x >= 0, e/(1 + e) for x < 0: no
 *        overflow, no cancellation, and small results keep full precision.
 *  erf:  |x| < 0.921875: x + x P(x^2), P of degree 6 (minimax, relative
 *        error 2^-28.4); 0.921875 <= |x| < 3.925: erf = 1 - exp(Q(|x| -
 *        0.921875)) with Q a degree-8 minimax fit of log(erfc(x)), weighted
 *        by erfc/erf so that the error is minimax in erf (2^-26.1); beyond,
 *        +-1 (erf rounds to +-1 in float32 from 3.9192 on).
 *  gelu: x/2 (1 + erf(x/sqrt 2)), where 1 + erf(z) is taken as exp(Q) =
 *        erfc(|z|) itself for z <= -0.921875 (no cancellation: small
 *        negative outputs keep their relative precision down to z = -3.925,
 *        below which the result is -0; |gelu| < 1e-7 there).
 *  gelu_tanh: x/2 (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi) (x +
 *        0.044715 x^3): one exp, no cancellation for negative x; 2u is
 *        computed in double and enters exp as a float pair (hi + lo).
 * The polynomial fits of tanh and erf were computed for this file with a
 * Remez exchange in 50-digit arithmetic (mpmath), coefficients then
 * rounded to float32 and the results verified exhaustively. */
#ifndef EMBER_VMATH_H
#define EMBER_VMATH_H

#include <stdint.h>
#include <string.h>

/* Always inlined: the callers are loops gcc vectorizes only when the whole
 * function is in them, and gcc's size limits dropped em_vgeluf to a scalar
 * call (a third of eager MiniLM's time) when exp grew by one select. */
#define EM_VM_INLINE static inline __attribute__((always_inline))

/* Bit casts (memcpy compiles to a register move and vectorizes). */
EM_VM_INLINE uint32_t em_vm_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
EM_VM_INLINE float em_vm_float(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
EM_VM_INLINE float em_vm_abs(float x) { return em_vm_float(em_vm_bits(x) & 0x7fffffffu); }
/* c ? a : b, for c 0 or 1, through a bit mask.  Not a C ternary: gcc
 * lowers ternaries to branches, and jump threading then duplicates the code
 * after a select whose arm is a constant (x > 88.8 ? 88.8 : x) and folds
 * it, leaving float operations that "could trap" in conditional blocks,
 * which the vectorizer's if-conversion refuses.  Masks keep the code
 * straight-line; the vectorizer turns them into and/andnot/or or blends. */
EM_VM_INLINE float em_vm_sel(int c, float a, float b) {
    uint32_t m = 0u - (uint32_t)c;
    return em_vm_float((em_vm_bits(a) & m) | (em_vm_bits(b) & ~m));
}
EM_VM_INLINE int32_t em_vm_seli(int c, int32_t a, int32_t b) {
    uint32_t m = 0u - (uint32_t)c;
    return (int32_t)(((uint32_t)a & m) | ((uint32_t)b & ~m));
}
/* |m| with the sign of s. */
EM_VM_INLINE float em_vm_copysign(float m, float s) {
    return em_vm_float((em_vm_bits(m) & 0x7fffffffu) | (em_vm_bits(s) & 0x80000000u));
}

/* exp(x + lo) for a small correction lo (|lo| <= ulp(x), 0 when x is not
 * finite), added to the reduced argument; em_vexpf passes -0, which gcc
 * folds away (r + -0 == r for every r). */
EM_VM_INLINE float em_vm_exp_lo(float x, float lo) {
    /* Clamp so that n stays in [-150, 128] (NaN passes through: every
     * comparison with NaN is false, and NaN propagates to the result).
     * Below -104 the result is 0 (exp(-104) < 2^-150 rounds to it): such
     * lanes compute exp(0) and are set to 0 at the end, so that a masked
     * score (-inf) never runs the multiply into the subnormal range, which
     * costs a microcode assist on Intel cores (about 100 cycles a vector:
     * most of fused attention's softmax time under a causal mask). */
    int under = x < -104.0f;
    float xc = em_vm_sel(x > 88.8f, 88.8f, x);
    xc = em_vm_sel(under, 0.0f, xc);
    /* n = round(x / ln2): adding 1.5*2^23 rounds to an integer, which then
     * sits in the low bits of kf. */
    float kf = xc * 0x1.715476p+0f + 0x1.8p23f;
    float n = kf - 0x1.8p23f;
    int32_t ni = (int32_t)(em_vm_bits(kf) - 0x4b400000u);
    /* r = x - n ln2, ln2 = 0.693359375 - 2.12194440e-4 (the first part has
     * 9 significant bits: n * it is exact). */
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    r = r + lo;
    float r2 = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r2 + r + 1.0f;
    /* 2^n = 2^n1 * 2^n2, both normal for n in [-150, 128]. */
    int32_t n1 = ni >> 1, n2 = ni - n1;
    float s1 = em_vm_float((uint32_t)(n1 + 127) << 23);
    float s2 = em_vm_float((uint32_t)(n2 + 127) << 23);
    return em_vm_sel(under, 0.0f, p * s1 * s2);
}

/* exp(x): Cephes expf's reduction and polynomial. */
EM_VM_INLINE float em_vexpf(float x) { return em_vm_exp_lo(x, -0.0f); }

/* log(x): fdlibm's logf. */
EM_VM_INLINE float em_vlogf(float x) {
    /* Positive subnormals (and +0, handled below): scale by 2^23. */
    int sub = em_vm_bits(x) < 0x00800000u;
    float xs = em_vm_sel(sub, x * 0x1p23f, x);
    int32_t k0 = em_vm_seli(sub, -23, 0);
    uint32_t ix = em_vm_bits(xs) + (0x3f800000u - 0x3f3504f3u);
    int32_t k = k0 + (int32_t)(ix >> 23) - 127;
    float f = em_vm_float((ix & 0x007fffffu) + 0x3f3504f3u) - 1.0f;
    float s = f / (2.0f + f);
    float z = s * s, w = z * z;
    float t1 = w * (0.40000972152f + w * 0.24279078841f); /* Lg2, Lg4 */
    float t2 = z * (0.66666662693f + w * 0.28498786688f); /* Lg1, Lg3 */
    float R = t2 + t1;
    float hfsq = 0.5f * f * f;
    float dk = (float)k;
    /* ln2 = 6.9313812256e-01 (0x3f317180: k * it is exact) + 9.0580006145e-06 */
    float y = s * (hfsq + R) + dk * 9.0580006145e-06f - hfsq + f + dk * 6.9313812256e-01f;
    /* 0 < x < inf: y; +-0: -inf; x < 0: NaN; +inf and NaN: x itself. */
    float inf = em_vm_float(0x7f800000u);
    float special = em_vm_sel(x == 0, -inf, em_vm_sel(x < 0, em_vm_float(0x7fc00000u), x));
    return em_vm_sel((x > 0) & (x < inf), y, special);
}

/* tanh(x). */
EM_VM_INLINE float em_vtanhf(float x) {
    float ax = em_vm_abs(x);
    float x2 = x * x;
    float p = 0x1.3837c4p-9f;    /*  2.382033039e-03 */
    p = p * x2 - 0x1.14726ep-7f; /* -8.436492644e-03 */
    p = p * x2 + 0x1.6534a2p-6f; /*  2.180209942e-02 */
    p = p * x2 - 0x1.ba12b2p-5f; /* -5.396399274e-02 */
    p = p * x2 + 0x1.111108p-3f; /*  1.333332658e-01 */
    p = p * x2 - 0x1.555556p-2f; /* -3.333333433e-01 */
    float small = x + x * x2 * p;
    float e = em_vexpf(-2.0f * ax);
    float big = (1.0f - e) / (1.0f + e);
    /* the sign of x on both (tanh(-0) = -0; x + x^3 p rounds it away) */
    return em_vm_copysign(em_vm_sel(ax < 0.625f, small, big), x);
}

/* 1 / (1 + exp(-x)). */
EM_VM_INLINE float em_vsigmoidf(float x) {
    float e = em_vexpf(-em_vm_abs(x));
    float num = em_vm_sel(x >= 0, 1.0f, e); /* NaN: e, a NaN */
    return num / (1.0f + e);
}

/* erf's two pieces: *small = erf(x) for |x| < 0.921875, and the return
 * value erfc(|x|) for 0.921875 <= |x| <= 3.925 (meaningless outside). */
EM_VM_INLINE float em_vm_erf_parts(float x, float *small) {
    float x2 = x * x;
    float p = 0x1.6e4ee2p-14f;   /*  8.733466530e-05 */
    p = p * x2 - 0x1.afd1ccp-11f; /* -8.236303693e-04 */
    p = p * x2 + 0x1.557092p-8f;  /*  5.209956784e-03 */
    p = p * x2 - 0x1.b82096p-6f;  /* -2.686323784e-02 */
    p = p * x2 + 0x1.ce2ee0p-4f;  /*  1.128376722e-01 */
    p = p * x2 - 0x1.812746p-2f;  /* -3.761263788e-01 */
    p = p * x2 + 0x1.06eba8p-3f;  /*  1.283791661e-01 (2/sqrt(pi) - 1) */
    *small = x + x * p;
    float t = em_vm_abs(x) - 0.921875f;
    float q = 0x1.5a0d04p-20f;  /*  1.289139846e-06 */
    q = q * t - 0x1.028b54p-15f; /* -3.082087642e-05 */
    q = q * t + 0x1.56c316p-12f; /*  3.268833680e-04 */
    q = q * t - 0x1.1e8b38p-9f;  /* -2.186155878e-03 */
    q = q * t + 0x1.64b292p-7f;  /*  1.088554505e-02 */
    q = q * t - 0x1.6f50aap-5f;  /* -4.483826831e-02 */
    q = q * t - 0x1.aa7d36p-1f;  /* -8.329865336e-01 */
    q = q * t - 0x1.410690p+1f;  /* -2.508012772e+00 */
    q = q * t - 0x1.a60826p+0f;  /* -1.648561835e+00 */
    return em_vexpf(q);
}

/* erf(x). */
EM_VM_INLINE float em_verff(float x) {
    float small;
    float ec = em_vm_erf_parts(x, &small);
    float ax = em_vm_abs(x);
    float big = em_vm_sel(ax > 3.925f, 1.0f, 1.0f - ec); /* NaN: 1 - NaN */
    big = em_vm_copysign(big, x);
    return em_vm_sel(ax < 0.921875f, small, big);
}

/* gelu, erf form: x/2 (1 + erf(x / sqrt 2)). */
EM_VM_INLINE float em_vgeluf(float x) {
    float z = x * 0x1.6a09e6p-1f; /* x / sqrt(2) */
    float small;
    float ec = em_vm_erf_parts(z, &small);
    float az = em_vm_abs(z);
    /* 1 + erf(z) = erfc(-z) */
    float pos = em_vm_sel(az > 3.925f, 2.0f, 2.0f - ec);
    float neg = em_vm_sel(az > 3.925f, 0.0f, ec);
    float c = em_vm_sel(z > 0, pos, neg);
    c = em_vm_sel(az < 0.921875f, 1.0f + small, c);
    return 0.5f * x * c;
}

/* gelu, tanh approximation: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 * = x * sigmoid(y), y = 2 sqrt(2/pi) x (1 + 0.044715 x^2).  y is formed in
 * double and passed to exp as hi + lo floats: rounded to float, its error
 * would be amplified |y| times by exp (tens of ulp for x around -3). */
EM_VM_INLINE float em_vgelu_tanhf(float x) {
    double xd = x;
    double yd = xd * (1.5957691216057308 + 0.07135481627260025 * (xd * xd));
    float hi = (float)yd;
    float lo = (float)(yd - (double)hi);
    float ahi = em_vm_abs(hi);
    lo = em_vm_sel(ahi < 128.0f, lo, 0.0f); /* hi = +-inf or NaN: no correction */
    /* e = exp(-|y|): lo's sign flips with hi's when hi >= 0 */
    float e = em_vm_exp_lo(-ahi, em_vm_float(em_vm_bits(lo) ^ (~em_vm_bits(hi) & 0x80000000u)));
    float num = em_vm_sel(hi >= 0, 1.0f, e);
    return x * (num / (1.0f + e));
}

#endif
