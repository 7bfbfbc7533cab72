/* test_half.c - f16 and bf16 as compute dtypes on the CPU (issue 15):
 * conversions and their corner cases, promotion, every float op in both
 * formats, em_compile and lazy mode against eager.
 *
 * References are computed here in float64 from the inputs' exact values
 * (a half value is exact in a double) and rounded to the format by this
 * file's own round-to-nearest-even (rnd), never by Ember's conversions.
 * Results are read back raw (tu_raw_values decodes the bits itself).
 *
 * Tolerances, in units of the format's ulp at the reference (ulp()):
 *  - exact ops (views, copies, cat, index_select, where, neg, abs, relu,
 *    maximum, minimum, comparisons, amax, amin, argmax, casts): 0;
 *  - every other pointwise op computes in f32 and rounds once: the f32
 *    result is within a few f32 ulp (2^-21 relative, vmath.h) of the exact
 *    one, so rounding it can land on the neighbour of rnd(exact) only when
 *    the exact value is within 2^-21 of a rounding boundary: 1 ulp;
 *  - sum, mean, var accumulate in double and round once: 1 ulp;
 *  - softmax, log_softmax, layer_norm compute in f32 (several f32 ops)
 *    and round once: 1 ulp, plus for log_softmax and layer_norm an
 *    absolute 1e-5 for results near 0 that come from cancellation
 *    (x - mean in f32 is off by 2^-24 |x|, not 2^-24 of the result);
 *  - matmul multiplies exactly in f32 (a product of two halves fits in 24
 *    bits) and accumulates K products in f32: 1 ulp plus K 2^-24 sum|a b|. */
#include "testutil.h"

#include <float.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define CPU em_cpu()

static const em_dtype HALVES[2] = {EM_F16, EM_BF16};

/* ---- the formats, independently of Ember ---- */

typedef struct fmt {
    int mbits;   /* stored mantissa bits */
    int emin;    /* exponent of the smallest normal */
    double max;  /* largest finite */
} fmt;

static fmt fmt_of(em_dtype d) {
    if (d == EM_F16) return (fmt){10, -14, 65504.0};
    return (fmt){7, -126, ldexp(255.0 / 128, 127)};
}

/* The format's spacing at |v| (subnormal spacing below the normals). */
static double ulp(double v, em_dtype d) {
    fmt f = fmt_of(d);
    int e;
    frexp(fabs(v), &e); /* |v| = m 2^e, m in [0.5, 1): floor(log2 |v|) = e - 1 */
    int ex = v == 0 || e - 1 < f.emin ? f.emin : e - 1;
    return ldexp(1.0, ex - f.mbits);
}

/* v rounded to the format, ties to even; overflow to inf past max + ulp/2. */
static double rnd(double v, em_dtype d) {
    if (isnan(v) || isinf(v) || v == 0) return v;
    fmt f = fmt_of(d);
    double a = fabs(v), q = ulp(a, d);
    if (a >= f.max + ulp(f.max, d) / 2) return copysign(INFINITY, v);
    double r = nearbyint(a / q) * q; /* a / q is exact: q is a power of two */
    return copysign(r, v);
}

/* Random values of format d (normal, times scale), as a tensor and as doubles. */
static em_tensor *hrand(uint64_t seed, int ndim, const int64_t *sizes, em_dtype d, double scale) {
    return em_cast(tu_random(seed, ndim, sizes, EM_F32, scale), d);
}

static int64_t numel_of(int ndim, const int64_t *sizes) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= sizes[i];
    return n;
}

/* Asserts t has dtype dt, sizes (ndim, sizes) and every value within
 * nulp ulp (of dt, at the reference) + atol of ref; NaN meets NaN, inf
 * the same inf. */
static void chk_at(int line, const char *ctx, const em_tensor *t, em_dtype dt, int ndim,
                   const int64_t *sizes, const double *ref, double nulp, double atol) {
    ck_assert_msg(t != NULL, "line %d %s: NULL result: %s", line, ctx, em_last_error());
    ck_assert_msg(em_dtype_of(t) == dt, "line %d %s: dtype %s, expected %s", line, ctx,
                  em_dtype_name(em_dtype_of(t)), em_dtype_name(dt));
    ck_assert_msg(em_ndim(t) == ndim, "line %d %s: ndim %d, expected %d", line, ctx, em_ndim(t),
                  ndim);
    for (int i = 0; i < ndim; i++)
        ck_assert_msg(em_size(t, i) == sizes[i], "line %d %s: size[%d] %lld, expected %lld", line,
                      ctx, i, (long long)em_size(t, i), (long long)sizes[i]);
    int64_t n = numel_of(ndim, sizes);
    double *v = tu_raw_values(t);
    for (int64_t i = 0; i < n; i++) {
        double a = v[i], r = ref[i];
        bool ok;
        if (isnan(r)) ok = isnan(a);
        else if (isinf(r)) ok = a == r;
        else ok = fabs(a - r) <= nulp * (dt == EM_F16 || dt == EM_BF16 ? ulp(r, dt) : 0) + atol;
        if (!ok) {
            free(v);
            ck_abort_msg("line %d %s: element %lld is %.9g, expected %.9g", line, ctx,
                         (long long)i, a, r);
        }
    }
    free(v);
}
#define CHK(ctx, t, dt, ndim, sizes, ref, nulp, atol) \
    chk_at(__LINE__, (ctx), (t), (dt), (ndim), (sizes), (ref), (nulp), (atol))

/* The raw bits of t's elements (2 bytes each), malloc'd. */
static uint16_t *bits_of(const em_tensor *t) {
    int64_t n = em_numel(t);
    uint16_t *b = malloc(sizeof(uint16_t) * (size_t)(n > 0 ? n : 1));
    ck_assert_int_eq(em_copy_to_host(t, b, (size_t)n * 2), EM_OK);
    return b;
}

/* ---- conversions ---- */

typedef struct bits_case {
    double v;
    uint16_t want;
} bits_case;

/* f32 -> f16 and bf16 (through em_cast of an f32 tensor): every corner. */
static const bits_case F16_CASES[] = {
    {0.0, 0x0000}, {-0.0, 0x8000}, {1.0, 0x3c00}, {-2.0, 0xc000},
    {INFINITY, 0x7c00}, {-INFINITY, 0xfc00}, {NAN, 0x7e00},
    {65504.0, 0x7bff},                 /* max */
    {65519.0, 0x7bff},                 /* below max + ulp/2: max */
    {65520.0, 0x7c00},                 /* max + ulp/2: ties to even = inf */
    {1e6, 0x7c00}, {-1e6, 0xfc00},     /* overflow */
    {0x1p-24, 0x0001},                 /* smallest subnormal */
    {0x1p-25, 0x0000},                 /* half of it: ties to even (0) */
    {0x1.8p-24, 0x0002},               /* 1.5 units: ties to even (2) */
    {0x1p-26, 0x0000},                 /* below half: 0 */
    {0x3ffp-24, 0x03ff},               /* largest subnormal */
    {0x1p-14, 0x0400},                 /* smallest normal */
    {0x7ffp-25, 0x0400},               /* between the two, halfway: even (normal) */
    {1.0 + 0x1p-11, 0x3c00},           /* halfway 1 and 1 + 2^-10: even (1) */
    {1.0 + 0x3p-11, 0x3c02},           /* halfway, odd below: up */
    {1.0 + 0x1p-11 + 0x1p-20, 0x3c01}, /* above halfway: up */
    {-0x1p-24, 0x8001},
};

static const bits_case BF16_CASES[] = {
    {0.0, 0x0000}, {-0.0, 0x8000}, {1.0, 0x3f80}, {-2.0, 0xc000},
    {INFINITY, 0x7f80}, {-INFINITY, 0xff80}, {NAN, 0x7fc0},
    {0x1.fep127, 0x7f7f},          /* max */
    {FLT_MAX, 0x7f80},             /* past max + ulp/2: inf */
    {0x1.ffp127, 0x7f80},          /* max + ulp/2: ties to even = inf */
    {1.0 + 0x1p-8, 0x3f80},        /* halfway: even (1) */
    {1.0 + 0x3p-8, 0x3f82},        /* halfway, odd below: up */
    {0x1p-133, 0x0001},            /* smallest bf16 subnormal (an f32 subnormal) */
    {0x1p-126, 0x0080},            /* smallest normal */
};

static void check_bits(em_dtype src, em_dtype d, const bits_case *cs, size_t n) {
    double v[32];
    for (size_t i = 0; i < n; i++) v[i] = cs[i].v;
    em_tensor *x = tu_tensor(v, 1, (int64_t[]){(int64_t)n}, src);
    uint16_t *b = bits_of(em_cast(x, d));
    for (size_t i = 0; i < n; i++) {
        uint16_t got = b[i], want = cs[i].want;
        bool nan_ok = isnan(cs[i].v) && (got & 0x7fff) > (d == EM_F16 ? 0x7c00 : 0x7f80) &&
                      (got & (d == EM_F16 ? 0x0200 : 0x0040)); /* any quiet NaN */
        ck_assert_msg(got == want || nan_ok, "%s -> %s of %a: 0x%04x, expected 0x%04x",
                      em_dtype_name(src), em_dtype_name(d), cs[i].v, got, want);
    }
    free(b);
}

START_TEST(f32_and_f64_to_half_round_to_nearest_even) {
    check_bits(EM_F32, EM_F16, F16_CASES, sizeof F16_CASES / sizeof F16_CASES[0]);
    check_bits(EM_F64, EM_F16, F16_CASES, sizeof F16_CASES / sizeof F16_CASES[0]);
    check_bits(EM_F32, EM_BF16, BF16_CASES, sizeof BF16_CASES / sizeof BF16_CASES[0]);
    check_bits(EM_F64, EM_BF16, BF16_CASES, sizeof BF16_CASES / sizeof BF16_CASES[0]);
}
END_TEST

/* f64 -> half rounds once: through a float rounded first these would tie
 * and round to even, the wrong way. */
START_TEST(f64_to_half_rounds_once) {
    const bits_case f16[] = {{1.0 + 0x1p-11 + 0x1p-40, 0x3c01}, {1.0 + 0x1p-11 - 0x1p-40, 0x3c00},
                             {0x1p-25 + 0x1p-60, 0x0001}};
    const bits_case bf16[] = {{1.0 + 0x1p-8 + 0x1p-40, 0x3f81}, {1.0 + 0x1p-8 - 0x1p-40, 0x3f80}};
    check_bits(EM_F64, EM_F16, f16, 3);
    check_bits(EM_F64, EM_BF16, bf16, 2);
    uint16_t *b = bits_of(em_full(1, TU_SIZES(1), 1.0 + 0x1p-11 + 0x1p-40, EM_F16, CPU));
    ck_assert_uint_eq(b[0], 0x3c01); /* em_full's conversion too */
    free(b);
}
END_TEST

/* Every f16 bit pattern to f32 and f64 and back: exact, NaN stays NaN. */
START_TEST(every_half_pattern_round_trips) {
    for (int k = 0; k < 2; k++) {
        em_dtype d = HALVES[k];
        uint16_t *pat = malloc(65536 * 2);
        for (int i = 0; i < 65536; i++) pat[i] = (uint16_t)i;
        em_tensor *h = em_from_data(pat, d, 1, TU_SIZES(65536), CPU);
        double *ref = tu_raw_values(h); /* decoded by testutil */
        em_dtype wide[2] = {EM_F32, EM_F64};
        for (int w = 0; w < 2; w++) {
            em_tensor *f = em_cast(h, wide[w]);
            CHK("half -> wide", f, wide[w], 1, TU_SIZES(65536), ref, 0, 0);
            uint16_t *back = bits_of(em_cast(f, d));
            for (int i = 0; i < 65536; i++) {
                if (isnan(ref[i])) continue;
                ck_assert_msg(back[i] == pat[i], "%s 0x%04x -> %s -> 0x%04x", em_dtype_name(d),
                              i, em_dtype_name(wide[w]), back[i]);
            }
            free(back);
        }
        /* f16 <-> bf16 rounds once (through f32, exact for both) */
        em_dtype other = d == EM_F16 ? EM_BF16 : EM_F16;
        double *oref = malloc(sizeof(double) * 65536);
        for (int i = 0; i < 65536; i++) oref[i] = rnd(ref[i], other);
        CHK("half -> other half", em_cast(h, other), other, 1, TU_SIZES(65536), oref, 0, 0);
        free(oref);
        free(ref);
        free(pat);
    }
}
END_TEST

/* f32 -> half at every midpoint between neighbouring positive values of
 * the format (ties: to even), one f32 ulp either side of it (to the
 * nearer), and at the values themselves, against rnd(). */
START_TEST(f32_to_half_at_every_midpoint) {
    for (int k = 0; k < 2; k++) {
        em_dtype d = HALVES[k];
        int top = d == EM_F16 ? 0x7bff : 0x7f7f; /* the largest finite */
        int64_t n = 4 * (int64_t)(top + 1);
        float *v = malloc(sizeof(float) * (size_t)n);
        for (int i = 0; i <= top; i++) {
            uint16_t lo = (uint16_t)i, up = (uint16_t)(i + 1);
            double x = tu_decode((const unsigned char *)&lo, d);
            /* past top: inf, whose "midpoint" is max + ulp/2 */
            double hi = i == top ? fmt_of(d).max + ulp(fmt_of(d).max, d)
                                 : tu_decode((const unsigned char *)&up, d);
            float mid = (float)((x + hi) / 2); /* exact: one bit past the format */
            v[4 * i] = (float)x;
            v[4 * i + 1] = mid;
            v[4 * i + 2] = nextafterf(mid, 0);
            v[4 * i + 3] = nextafterf(mid, INFINITY);
        }
        double *ref = malloc(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++) ref[i] = rnd(v[i], d);
        em_tensor *f = em_from_data(v, EM_F32, 1, &n, CPU);
        CHK("f32 -> half midpoints", em_cast(f, d), d, 1, &n, ref, 0, 0);
        for (int64_t i = 0; i < n; i++) ref[i] = -ref[i];
        CHK("f32 -> half negative", em_cast(em_neg(f), d), d, 1, &n, ref, 0, 0);
        free(ref);
        free(v);
    }
}
END_TEST

/* Integers and bool to and from the halves. */
START_TEST(casts_with_integers_and_bool) {
    const double iv[] = {0, 1, -3, 2049, 65505, 100000, -70000, 257};
    for (int k = 0; k < 2; k++) {
        em_dtype d = HALVES[k];
        double ref[8], tr[8], bref[8];
        for (int i = 0; i < 8; i++) ref[i] = rnd(iv[i], d);
        CHK("i32 -> half", em_cast(tu_tensor(iv, 1, TU_SIZES(8), EM_I32), d), d, 1, TU_SIZES(8), ref, 0, 0);
        CHK("i64 -> half", em_cast(tu_tensor(iv, 1, TU_SIZES(8), EM_I64), d), d, 1, TU_SIZES(8), ref, 0, 0);
        const double hv[] = {1.75, -2.5, 0.0, NAN, INFINITY, -0.25, 1e4, -1e4};
        em_tensor *h = tu_tensor(hv, 1, TU_SIZES(8), d);
        double *x = tu_raw_values(h);
        for (int i = 0; i < 8; i++) {
            tr[i] = isnan(x[i]) ? 0 : isinf(x[i]) ? 2147483647.0 : trunc(x[i]);
            bref[i] = x[i] != 0;
        }
        CHK("half -> i32", em_cast(h, EM_I32), EM_I32, 1, TU_SIZES(8), tr, 0, 0);
        CHK("half -> bool", em_cast(h, EM_BOOL), EM_BOOL, 1, TU_SIZES(8), bref, 0, 0);
        CHK("bool -> half", em_cast(em_cast(h, EM_BOOL), d), d, 1, TU_SIZES(8), bref, 0, 0);
        free(x);
    }
}
END_TEST

/* ---- promotion ---- */

static void dtype_is(const em_tensor *t, em_dtype want, const char *what) {
    ck_assert_msg(t != NULL, "%s: %s", what, em_last_error());
    ck_assert_msg(em_dtype_of(t) == want, "%s: %s, expected %s", what,
                  em_dtype_name(em_dtype_of(t)), em_dtype_name(want));
}

START_TEST(promotion_follows_torch) {
    em_tensor *h = hrand(1, 1, TU_SIZES(3), EM_F16, 1), *b = hrand(2, 1, TU_SIZES(3), EM_BF16, 1);
    em_tensor *f = tu_random(3, 1, TU_SIZES(3), EM_F32, 1), *g = tu_random(3, 1, TU_SIZES(3), EM_F64, 1);
    em_tensor *i = tu_random(4, 1, TU_SIZES(3), EM_I32, 4), *l = tu_random(4, 1, TU_SIZES(3), EM_I64, 4);
    em_tensor *c = em_gt(f, em_scalar(0, EM_F32, CPU));
    dtype_is(em_add(h, b), EM_F32, "f16 + bf16");
    dtype_is(em_mul(b, h), EM_F32, "bf16 * f16");
    dtype_is(em_add(h, f), EM_F32, "f16 + f32");
    dtype_is(em_add(b, g), EM_F64, "bf16 + f64");
    dtype_is(em_add(h, i), EM_F16, "f16 + i32");
    dtype_is(em_sub(l, b), EM_BF16, "i64 - bf16");
    dtype_is(em_add(h, c), EM_F16, "f16 + bool");
    dtype_is(em_div(i, h), EM_F16, "i32 / f16");
    /* Python-style scalars and 0-d tensors do not widen a half tensor */
    dtype_is(em_add_scalar(h, 2.5), EM_F16, "f16 + 2.5");
    dtype_is(em_mul_scalar(b, 1e30), EM_BF16, "bf16 * 1e30");
    dtype_is(em_add(h, em_scalar(2, EM_F32, CPU)), EM_F16, "f16 + 0-d f32");
    dtype_is(em_add(em_scalar(2, EM_F64, CPU), b), EM_BF16, "0-d f64 + bf16");
    dtype_is(em_add(h, em_scalar(2, EM_BF16, CPU)), EM_F16, "f16 + 0-d bf16");
    /* ...unless of a higher category, or both 0-d */
    dtype_is(em_add(i, em_scalar(2, EM_F16, CPU)), EM_F16, "i32 + 0-d f16");
    dtype_is(em_add(em_scalar(1, EM_F16, CPU), em_scalar(2, EM_F32, CPU)), EM_F32, "0-d + 0-d");
    dtype_is(em_lt(h, b), EM_BOOL, "f16 < bf16");
    dtype_is(em_where(c, h, b), EM_F32, "where(f16, bf16)");
    dtype_is(em_where(c, h, em_scalar(0, EM_F32, CPU)), EM_F16, "where(f16, 0-d f32)");
    dtype_is(em_cat(2, (em_tensor *[]){h, b}, 0), EM_F32, "cat(f16, bf16)");
    dtype_is(em_cat(2, (em_tensor *[]){h, i}, 0), EM_F16, "cat(f16, i32)");
    em_tensor *m = em_reshape(h, 2, TU_SIZES(1, 3));
    dtype_is(em_matmul(m, em_reshape(f, 2, TU_SIZES(3, 1))), EM_F32, "f16 @ f32");
    dtype_is(em_matmul(m, em_reshape(b, 2, TU_SIZES(3, 1))), EM_F32, "f16 @ bf16");
    dtype_is(em_exp(h), EM_F16, "exp(f16)");
    dtype_is(em_sum(b, 0, NULL, false), EM_BF16, "sum(bf16)");
    dtype_is(em_argmax(h, 0, false), EM_I64, "argmax(f16)");
    /* the f32 rule did not change: f32 with a 0-d f64 stays f32 */
    dtype_is(em_add(f, em_scalar(1, EM_F64, CPU)), EM_F32, "f32 + 0-d f64");
    dtype_is(em_add(f, g), EM_F64, "f32 + f64");
}
END_TEST

/* ---- pointwise ---- */

static double gelu(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }
static double gelu_tanh(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
static double sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double rsqrt_(double x) { return 1 / sqrt(x); }
static double neg_(double x) { return -x; }
static double relu_(double x) { return x < 0 ? 0 : x; }

typedef struct unary_case {
    const char *name;
    em_tensor *(*op)(const em_tensor *);
    double (*ref)(double);
    double nulp, atol;
} unary_case;

/* gelu and gelu_tanh: the f32 kernels (vmath.h) return -0 far left,
 * where |gelu| < 1e-7, a value bf16 could hold: 1e-7 absolute. */
static const unary_case UNARY[] = {
    {"neg", em_neg, neg_, 0, 0},       {"abs", em_abs, fabs, 0, 0},     {"relu", em_relu, relu_, 0, 0},
    {"exp", em_exp, exp, 1, 0},        {"log", em_log, log, 1, 0},      {"sqrt", em_sqrt, sqrt, 1, 0},
    {"rsqrt", em_rsqrt, rsqrt_, 1, 0}, {"sin", em_sin, sin, 1, 0},      {"cos", em_cos, cos, 1, 0},
    {"tanh", em_tanh, tanh, 1, 0},     {"sigmoid", em_sigmoid, sigmoid, 1, 0},
    {"gelu", em_gelu, gelu, 1, 1e-7},  {"gelu_tanh", em_gelu_tanh, gelu_tanh, 1, 1e-7},
    {"erf", em_erf, erf, 1, 0},
};

/* Each unary op on a contiguous input of odd size (past one conversion
 * block), a transposed view, and a size-0 and a 0-d input. */
START_TEST(unary_ops_in_both_formats) {
    for (int k = 0; k < 2; k++) {
        em_dtype d = HALVES[k];
        em_tensor *x = hrand(10, 2, TU_SIZES(37, 29), d, 3); /* 1073 elements */
        em_tensor *xt = em_transpose(x, 0, 1);
        double *xv = tu_raw_values(x), *tv = tu_raw_values(xt);
        double *ref = malloc(sizeof(double) * 1073);
        for (size_t u = 0; u < sizeof UNARY / sizeof UNARY[0]; u++) {
            const unary_case *c = &UNARY[u];
            char ctx[64];
            snprintf(ctx, sizeof ctx, "%s %s", c->name, em_dtype_name(d));
            for (int i = 0; i < 1073; i++) ref[i] = rnd(c->ref(xv[i]), d);
            CHK(ctx, c->op(x), d, 2, TU_SIZES(37, 29), ref, c->nulp, c->atol);
            for (int i = 0; i < 1073; i++) ref[i] = rnd(c->ref(tv[i]), d);
            CHK(ctx, c->op(xt), d, 2, TU_SIZES(29, 37), ref, c->nulp, c->atol);
            CHK(ctx, c->op(em_empty(2, TU_SIZES(0, 3), d, CPU)), d, 2, TU_SIZES(0, 3), ref, 0, 0);
            double r0 = rnd(c->ref(xv[0]), d);
            CHK(ctx, c->op(em_scalar(xv[0], d, CPU)), d, 0, NULL, &r0, c->nulp, c->atol);
        }
        free(ref);
        free(xv);
        free(tv);
    }
}
END_TEST

/* Special values through the math: NaN, +-inf, overflow of exp. */
START_TEST(unary_special_values) {
    const double v[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 20.0, -20.0, 100.0};
    for (int k = 0; k < 2; k++) {
        em_dtype d = HALVES[k];
        em_tensor *x = tu_tensor(v, 1, TU_SIZES(8), d);
        double *xv = tu_raw_values(x), ref[8];
        for (size_t u = 0; u < sizeof UNARY / sizeof UNARY[0]; u++) {
            for (int i = 0; i < 8; i++) ref[i] = rnd(UNARY[u].ref(xv[i]), d);
            CHK(UNARY[u].name, UNARY[u].op(x), d, 1, TU_SIZES(8), ref, UNARY[u].nulp, UNARY[u].atol);
        }
        free(xv);
    }
}
END_TEST

typedef struct binary_case {
    const char *name;
    em_tensor *(*op)(const em_tensor *, const em_tensor *);
    em_tensor *(*op_s)(const em_tensor *, double);
    double (*ref)(double, double);
    double nulp;
} binary_case;

static double add_(double a, double b) { return a + b; }
static double sub_(double a, double b) { return a - b; }
static double mul_(double a, double b) { return a * b; }
static double div_(double a, double b) { return a / b; }
static double max_(double a, double b) { return isnan(a) || isnan(b) ? NAN : a > b ? a : b; }
static double min_(double a, double b) { return isnan(a) || isnan(b) ? NAN : a < b ? a : b; }

/* add, sub, mul, div: the f32 result of two halves is the exact one
 * rounded once to f32, then rounded to the half: 1 ulp (double rounding). */
static const binary_case BINARY[] = {
    {"add", em_add, em_add_scalar, add_, 1},
    {"sub", em_sub, em_sub_scalar, sub_, 1},
    {"mul", em_mul, em_mul_scalar, mul_, 1},
    {"div", em_div, em_div_scalar, div_, 1},
    {"pow", em_pow, em_pow_scalar, pow, 1},
    {"maximum", em_maximum, em_maximum_scalar, max_, 0},
    {"minimum", em_minimum, em_minimum_scalar, min_, 0},
};

/* [3, 1, 5] with [4, 5] (broadcast both ways), with a non-contiguous
 * right operand, and with a scalar (rounded to the half type first). */
START_TEST(binary_ops_broadcast_and_scalars) {
    for (int k = 0; k < 2; k++) {
        em_dtype d = HALVES[k];
        em_tensor *a = hrand(20, 3, TU_SIZES(3, 1, 5), d, 2);
        em_tensor *b = em_transpose(hrand(21, 2, TU_SIZES(5, 4), d, 2), 0, 1); /* [4, 5] */
        double *av = tu_raw_values(a), *bv = tu_raw_values(b), ref[60], sref[15];
        double s = 1.3, sh = rnd(s, d); /* the scalar computes as a half */
        for (size_t u = 0; u < sizeof BINARY / sizeof BINARY[0]; u++) {
            const binary_case *c = &BINARY[u];
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 4; j++)
                    for (int l = 0; l < 5; l++)
                        ref[(i * 4 + j) * 5 + l] = rnd(c->ref(av[i * 5 + l], bv[j * 5 + l]), d);
            CHK(c->name, c->op(a, b), d, 3, TU_SIZES(3, 4, 5), ref, c->nulp, 0);
            for (int i = 0; i < 15; i++) sref[i] = rnd(c->ref(av[i], sh), d);
            CHK(c->name, c->op_s(a, s), d, 3, TU_SIZES(3, 1, 5), sref, c->nulp, 0);
        }
        free(av);
        free(bv);
    }
}
END_TEST

/* f16 with bf16 computes in f32: no rounding to either. */
START_TEST(mixed_halves_compute_in_f32) {
    em_tensor *a = hrand(30, 1, TU_SIZES(9), EM_F16, 1), *b = hrand(31, 1, TU_SIZES(9), EM_BF16, 1);
    double *av = tu_raw_values(a), *bv = tu_raw_values(b), ref[9];
    for (int i = 0; i < 9; i++) ref[i] = (double)(float)(av[i] * bv[i]);
    CHK("f16 * bf16", em_mul(a, b), EM_F32, 1, TU_SIZES(9), ref, 0, 0);
    free(av);
    free(bv);
}
END_TEST

START_TEST(comparisons_and_where) {
    for (int k = 0; k < 2; k++) {
        em_dtype d = HALVES[k];
        const double av[] = {1, 2, NAN, -0.0, 3, INFINITY, 5, -1};
        const double bv[] = {1, 3, NAN, 0.0, 2, INFINITY, NAN, -2};
        em_tensor *a = tu_tensor(av, 1, TU_SIZES(8), d), *b = tu_tensor(bv, 1, TU_SIZES(8), d);
        em_tensor *(*ops[6])(const em_tensor *, const em_tensor *) = {em_eq, em_ne, em_lt,
                                                                     em_le, em_gt, em_ge};
        double ref[8];
        for (int o = 0; o < 6; o++) {
            for (int i = 0; i < 8; i++) {
                double x = av[i], y = bv[i];
                bool r[6] = {x == y, x != y, x < y, x <= y, x > y, x >= y};
                ref[i] = r[o];
            }
            CHK("compare", ops[o](a, b), EM_BOOL, 1, TU_SIZES(8), ref, 0, 0);
        }
        em_tensor *c = em_gt(a, b);
        for (int i = 0; i < 8; i++) ref[i] = av[i] > bv[i] ? av[i] : bv[i];
        CHK("where", em_where(c, a, b), d, 1, TU_SIZES(8), ref, 0, 0);
        for (int i = 0; i < 8; i++) ref[i] = av[i] > bv[i] ? av[i] : 0.5;
        CHK("where scalar", em_where(c, a, em_scalar(0.5, EM_F32, CPU)), d, 1, TU_SIZES(8), ref, 0, 0);
    }
}
END_TEST

/* ---- reductions ---- */

/* Sum, mean, var (correction 1), amax, amin over dims of [7, 33, 5],
 * reducing the innermost dim, the outermost (the vertical path) and all. */
START_TEST(reductions_in_both_formats) {
    for (int k = 0; k < 2; k++) {
        em_dtype d = HALVES[k];
        em_tensor *x = hrand(40, 3, TU_SIZES(7, 33, 5), d, 4);
        double *xv = tu_raw_values(x);
        const int dimsets[3][2] = {{2, -1}, {0, -1}, {0, 1}};
        for (int ds = 0; ds < 3; ds++) {
            int nd = dimsets[ds][1] < 0 ? 1 : 2;
            bool red[3] = {false};
            for (int i = 0; i < nd; i++) red[dimsets[ds][i]] = true;
            int64_t osz[3];
            int ond = 0;
            for (int i = 0; i < 3; i++)
                if (!red[i]) osz[ond++] = TU_SIZES(7, 33, 5)[i];
            int64_t on = numel_of(ond, osz);
            double sum[231], sq[231], mx[231], mn[231], cnt[231];
            for (int o = 0; o < on; o++) sum[o] = sq[o] = cnt[o] = 0, mx[o] = -INFINITY, mn[o] = INFINITY;
            int64_t idx[3] = {0};
            do {
                int64_t oi = 0;
                for (int i = 0; i < 3; i++)
                    if (!red[i]) oi = oi * TU_SIZES(7, 33, 5)[i] + idx[i];
                double v = xv[tu_flat(3, TU_SIZES(7, 33, 5), idx)];
                sum[oi] += v, cnt[oi]++;
                mx[oi] = fmax(mx[oi], v), mn[oi] = fmin(mn[oi], v);
            } while (tu_next(3, TU_SIZES(7, 33, 5), idx));
            memset(idx, 0, sizeof idx);
            do {
                int64_t oi = 0;
                for (int i = 0; i < 3; i++)
                    if (!red[i]) oi = oi * TU_SIZES(7, 33, 5)[i] + idx[i];
                double dv = xv[tu_flat(3, TU_SIZES(7, 33, 5), idx)] - sum[oi] / cnt[oi];
                sq[oi] += dv * dv;
            } while (tu_next(3, TU_SIZES(7, 33, 5), idx));
            double rs[231], rm[231], rv[231];
            for (int o = 0; o < on; o++) {
                rs[o] = rnd(sum[o], d);
                rm[o] = rnd(sum[o] / cnt[o], d);
                rv[o] = rnd(sq[o] / (cnt[o] - 1), d);
                mx[o] = rnd(mx[o], d), mn[o] = rnd(mn[o], d);
            }
            const int *dims = dimsets[ds];
            CHK("sum", em_sum(x, nd, dims, false), d, ond, osz, rs, 1, 0);
            CHK("mean", em_mean(x, nd, dims, false), d, ond, osz, rm, 1, 0);
            CHK("var", em_var(x, nd, dims, 1, false), d, ond, osz, rv, 1, 0);
            CHK("amax", em_amax(x, nd, dims, false), d, ond, osz, mx, 0, 0);
            CHK("amin", em_amin(x, nd, dims, false), d, ond, osz, mn, 0, 0);
        }
        free(xv);
    }
}
END_TEST

/* A long sum (split in chunks) would lose everything in a half
 * accumulator: 40000 ones sum to 40000 (f16 stops counting at 2048). */
START_TEST(reductions_accumulate_wider_than_half) {
    for (int k = 0; k < 2; k++) {
        em_dtype d = HALVES[k];
        em_tensor *x = em_full(1, TU_SIZES(40000), 1.0, d, CPU);
        double r = rnd(40000, d), m = 1;
        CHK("sum", em_sum(x, 0, NULL, false), d, 0, NULL, &r, 0, 0);
        CHK("mean", em_mean(x, 0, NULL, false), d, 0, NULL, &m, 0, 0);
        /* size-0 and size-1 dims */
        double z = 0;
        CHK("sum of none", em_sum(em_empty(1, TU_SIZES(0), d, CPU), 0, NULL, false), d, 0, NULL, &z, 0, 0);
        em_tensor *one = hrand(41, 2, TU_SIZES(1, 3), d, 1);
        double *ov = tu_raw_values(one);
        CHK("sum over size 1", em_sum(one, 1, (int[]){0}, false), d, 1, TU_SIZES(3), ov, 0, 0);
        CHK("amax over size 1", em_amax(one, 1, (int[]){0}, true), d, 2, TU_SIZES(1, 3), ov, 0, 0);
        free(ov);
        tu_check_fails(em_amax(em_empty(1, TU_SIZES(0), d, CPU), 0, NULL, false), EM_ERR_SHAPE);
    }
}
END_TEST

START_TEST(argmax_in_both_formats) {
    for (int k = 0; k < 2; k++) {
        em_dtype d = HALVES[k];
        const double v[] = {1, 5, 5, -2, 0, NAN, 3, 7, 7, 6, -1, 2};
        em_tensor *x = tu_tensor(v, 2, TU_SIZES(3, 4), d);
        double r1[3] = {1, 1, 0}, r0[4] = {2, 1, 0, 1}; /* a NaN is the maximum */
        CHK("argmax dim 1", em_argmax(x, 1, false), EM_I64, 1, TU_SIZES(3), r1, 0, 0);
        CHK("argmax dim 0", em_argmax(x, 0, false), EM_I64, 1, TU_SIZES(4), r0, 0, 0);
        em_tensor *w = hrand(42, 2, TU_SIZES(16, 50), d, 1); /* vertical path */
        double *wv = tu_raw_values(w), ref[50];
        for (int j = 0; j < 50; j++) {
            int b = 0;
            for (int i = 1; i < 16; i++)
                if (wv[i * 50 + j] > wv[b * 50 + j]) b = i;
            ref[j] = b;
        }
        CHK("argmax vertical", em_argmax(w, 0, false), EM_I64, 1, TU_SIZES(50), ref, 0, 0);
        free(wv);
    }
}
END_TEST

/* ---- softmax, log_softmax, layer_norm: statistics in f32 ---- */

START_TEST(softmax_family_and_layer_norm) {
    for (int k = 0; k < 2; k++) {
        em_dtype d = HALVES[k];
        em_tensor *x = hrand(50, 2, TU_SIZES(6, 17), d, 3);
        double *xv = tu_raw_values(x), sm[102], ls[102], ln[102];
        em_tensor *w = hrand(51, 1, TU_SIZES(17), d, 1), *b = hrand(52, 1, TU_SIZES(17), d, 1);
        double *wv = tu_raw_values(w), *bv = tu_raw_values(b);
        for (int r = 0; r < 6; r++) {
            const double *row = xv + r * 17;
            double m = -INFINITY, s = 0, mean = 0, var = 0;
            for (int j = 0; j < 17; j++) m = fmax(m, row[j]), mean += row[j] / 17;
            for (int j = 0; j < 17; j++) s += exp(row[j] - m), var += (row[j] - mean) * (row[j] - mean) / 17;
            for (int j = 0; j < 17; j++) {
                sm[r * 17 + j] = rnd(exp(row[j] - m) / s, d);
                ls[r * 17 + j] = rnd(row[j] - m - log(s), d);
                ln[r * 17 + j] = rnd((row[j] - mean) / sqrt(var + 1e-5) * wv[j] + bv[j], d);
            }
        }
        CHK("softmax", em_softmax(x, -1), d, 2, TU_SIZES(6, 17), sm, 1, 0);
        CHK("log_softmax", em_log_softmax(x, 1), d, 2, TU_SIZES(6, 17), ls, 1, 1e-5);
        CHK("layer_norm", em_layer_norm(x, 1, w, b, 1e-5), d, 2, TU_SIZES(6, 17), ln, 1, 1e-5);
        /* large inputs: shifted by the max, nothing overflows */
        const double big[] = {60000, 60000 - ulp(60000, d), -60000}; /* the max, 1 ulp below */
        em_tensor *bt = tu_tensor(big, 1, TU_SIZES(3), d);
        double *gv = tu_raw_values(bt), gap = gv[0] - gv[1];
        double rb[3] = {rnd(1 / (1 + exp(-gap)), d), rnd(exp(-gap) / (1 + exp(-gap)), d), 0};
        CHK("softmax big", em_softmax(bt, 0), d, 1, TU_SIZES(3), rb, 1, 0);
        free(gv);
        free(xv);
        free(wv);
        free(bv);
    }
}
END_TEST

/* ---- data movement and views: exact ---- */

START_TEST(index_cat_and_views_are_exact) {
    for (int k = 0; k < 2; k++) {
        em_dtype d = HALVES[k];
        em_tensor *w = hrand(60, 2, TU_SIZES(5, 3), d, 2);
        double *wv = tu_raw_values(w);
        const double iv[] = {4, 0, 4, 2};
        em_tensor *idx = tu_tensor(iv, 2, TU_SIZES(2, 2), EM_I64);
        double ref[30];
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 3; j++) ref[i * 3 + j] = wv[(int)iv[i] * 3 + j];
        CHK("embedding", em_embedding(w, idx), d, 3, TU_SIZES(2, 2, 3), ref, 0, 0);
        CHK("index_select", em_index_select(w, 0, em_reshape(idx, 1, TU_SIZES(4))), d, 2,
            TU_SIZES(4, 3), ref, 0, 0);
        for (int i = 0; i < 15; i++) ref[i] = wv[i], ref[15 + i] = wv[i];
        CHK("cat", em_cat(2, (em_tensor *[]){w, w}, 0), d, 2, TU_SIZES(10, 3), ref, 0, 0);
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 5; j++) ref[i * 5 + j] = wv[j * 3 + i];
        CHK("transpose", em_contiguous(em_transpose(w, 0, 1)), d, 2, TU_SIZES(3, 5), ref, 0, 0);
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++) ref[i * 3 + j] = wv[(1 + 2 * i) * 3 + j];
        CHK("slice", em_slice(w, 0, 1, 5, 2), d, 2, TU_SIZES(2, 3), ref, 0, 0);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 3; j++) ref[i * 3 + j] = wv[3 + j];
        CHK("expand", em_contiguous(em_expand(em_slice(w, 0, 1, 2, 1), 2, TU_SIZES(4, 3))), d, 2,
            TU_SIZES(4, 3), ref, 0, 0);
        free(wv);
    }
}
END_TEST

/* ---- matmul ---- */

/* c = a @ b against the f64 reference, within 1 ulp + K 2^-24 sum|a b|. */
static void check_matmul(const em_tensor *a, const em_tensor *b, em_dtype d) {
    em_tensor *c = em_matmul(a, b);
    ck_assert_msg(c != NULL, "matmul: %s", em_last_error());
    em_tensor *ac = em_contiguous(a), *bc = em_contiguous(b);
    double *av = tu_raw_values(ac), *bv = tu_raw_values(bc), *cv = tu_raw_values(c);
    int na = em_ndim(a), nb = em_ndim(b);
    int64_t M = em_size(a, na - 2), K = em_size(a, na - 1), N = em_size(b, nb - 1);
    int64_t batch = M * N > 0 ? em_numel(c) / (M * N) : 0;
    int64_t abatch = M * K > 0 ? em_numel(a) / (M * K) : 1, bbatch = K * N > 0 ? em_numel(b) / (K * N) : 1;
    ck_assert_int_eq(em_dtype_of(c), d);
    for (int64_t t = 0; t < batch; t++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                /* the batch dims broadcast as a leading 1 or a full dim */
                const double *A = av + (abatch == 1 ? 0 : t % abatch) * M * K;
                const double *B = bv + (bbatch == 1 ? 0 : t % bbatch) * K * N;
                double s = 0, sa = 0;
                for (int64_t l = 0; l < K; l++) s += A[i * K + l] * B[l * N + j], sa += fabs(A[i * K + l] * B[l * N + j]);
                double r = rnd(s, d), got = cv[(t * M + i) * N + j];
                double tol = ulp(r, d) + (double)K * 0x1p-24 * sa;
                ck_assert_msg(fabs(got - r) <= tol, "matmul %s [%lld, %lld, %lld]: %.9g, expected %.9g",
                              em_dtype_name(d), (long long)t, (long long)i, (long long)j, got, r);
            }
    free(av);
    free(bv);
    free(cv);
}

START_TEST(matmul_in_both_formats) {
    for (int k = 0; k < 2; k++) {
        em_dtype d = HALVES[k];
        check_matmul(hrand(70, 2, TU_SIZES(5, 7), d, 1), hrand(71, 2, TU_SIZES(7, 3), d, 1), d);
        check_matmul(hrand(72, 2, TU_SIZES(33, 65), d, 1), hrand(73, 2, TU_SIZES(65, 17), d, 1), d);
        /* transposed operand, and batch dims broadcast */
        check_matmul(em_transpose(hrand(74, 2, TU_SIZES(7, 5), d, 1), 0, 1),
                     hrand(75, 2, TU_SIZES(7, 4), d, 1), d);
        check_matmul(hrand(76, 3, TU_SIZES(3, 4, 6), d, 1), hrand(77, 2, TU_SIZES(6, 5), d, 1), d);
        /* split over the threads (by rows, then by columns), a batch of
         * both operands, and a view no BLAS reads in place (steps of 2 in
         * both dims: converted, where bf16 otherwise runs in place on a
         * bf16 gemm where the CPU has one) */
        check_matmul(hrand(80, 2, TU_SIZES(131, 70), d, 1), hrand(81, 2, TU_SIZES(70, 151), d, 1), d);
        check_matmul(hrand(82, 2, TU_SIZES(9, 300), d, 1), hrand(83, 2, TU_SIZES(300, 517), d, 1), d);
        check_matmul(hrand(84, 3, TU_SIZES(2, 5, 9), d, 1), hrand(85, 3, TU_SIZES(2, 9, 4), d, 1), d);
        em_tensor *big = hrand(86, 2, TU_SIZES(14, 22), d, 1);
        em_tensor *strided = em_slice(em_slice(big, 0, 0, 14, 2), 1, 0, 22, 2);
        check_matmul(strided, hrand(87, 2, TU_SIZES(11, 6), d, 1), d);
        /* 1-d operands, size-0 and K = 0 */
        em_tensor *v = hrand(78, 1, TU_SIZES(6), d, 1), *m = hrand(79, 2, TU_SIZES(6, 2), d, 1);
        em_tensor *r = em_matmul(v, m);
        ck_assert_ptr_nonnull(r);
        ck_assert_int_eq(em_ndim(r), 1);
        check_matmul(em_unsqueeze(v, 0), m, d);
        double zeros[6] = {0};
        CHK("K = 0", em_matmul(em_empty(2, TU_SIZES(3, 0), d, CPU), em_empty(2, TU_SIZES(0, 2), d, CPU)),
            d, 2, TU_SIZES(3, 2), zeros, 0, 0);
        CHK("M = 0", em_matmul(em_empty(2, TU_SIZES(0, 4), d, CPU), em_empty(2, TU_SIZES(4, 2), d, CPU)),
            d, 2, TU_SIZES(0, 2), zeros, 0, 0);
    }
}
END_TEST

/* ---- em_compile and lazy mode ---- */

/* The small half graph: softmax(exp(x) + x) @ w, and sum(x * 2) */
static em_status half_graph(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx;
    (void)s;
    em_tensor *x = in[0], *w = in[1];
    out[0] = em_matmul(em_softmax(em_add(em_exp(x), x), -1), w);
    out[1] = em_sum(em_mul_scalar(x, 2), 1, (int[]){1}, false);
    return out[0] && out[1] ? EM_OK : em_last_status();
}

/* half_graph's outputs in float64 from the inputs' values, rounded to d
 * only where a compiled graph stores a half tensor: softmax's result
 * (the matmul's input) and the outputs; exp + add and the scaled sum stay
 * unrounded, as a fused kernel computes them (in f32), where eager mode
 * rounds after every op. */
static void half_graph_ref(const em_tensor *x, const em_tensor *w, em_dtype d, double *o0,
                           double *o1, double *mag) {
    int64_t R = em_size(x, 0), C = em_size(x, 1), N = em_size(w, 1);
    double *xv = tu_raw_values(x), *wv = tu_raw_values(w), *p = malloc(sizeof(double) * (size_t)C);
    for (int64_t r = 0; r < R; r++) {
        double mx = -INFINITY, sum = 0, s2 = 0;
        for (int64_t c = 0; c < C; c++) {
            p[c] = exp(xv[r * C + c]) + xv[r * C + c];
            mx = fmax(mx, p[c]);
            s2 += 2 * xv[r * C + c];
        }
        for (int64_t c = 0; c < C; c++) sum += p[c] = exp(p[c] - mx);
        for (int64_t c = 0; c < C; c++) p[c] = rnd(p[c] / sum, d);
        for (int64_t n = 0; n < N; n++) {
            double acc = 0, m = 0;
            for (int64_t c = 0; c < C; c++) {
                acc += p[c] * wv[c * N + n];
                m += p[c] * fabs(wv[c * N + n]);
            }
            o0[r * N + n] = acc;
            mag[r * N + n] = m; /* sum |p w|: what rounding errors of p scale by */
        }
        o1[r] = s2;
    }
    free(xv), free(wv), free(p);
}

/* out against half_graph_ref: within 1 ulp of the format, plus k u sum |p w|
 * for the matmul output (u the format's unit roundoff).
 *  - Compiled or lazy (k = 1): the f32 computation is a few f32 ulps from
 *    the float64 one, which may move a rounding to the half type by one
 *    ulp, the final one or one of the stored p's.
 *  - Eager (k = 16): eager rounds each op's result: exp(x) (|error| <= e u),
 *    then + x (<= 4 u: |exp(x) + x| < 4 here), so softmax's input is off by
 *    <= 7 u, which its exp turns into a relative error of each p of <= 14 u,
 *    plus p's rounding (which may go the other way than the reference's):
 *    <= 16 u sum |p w| on an output.  Near-zero outputs of larger terms
 *    (cancellation) are not held to ulps of their own size. */
static void check_graph(em_tensor *const *out, em_tensor *const *in, em_dtype d, double k,
                        const char *what) {
    int64_t R = em_size(in[0], 0), N = em_size(in[1], 1);
    double *o0 = malloc(sizeof(double) * (size_t)(R * N)), *o1 = malloc(sizeof(double) * (size_t)R);
    double *mag = malloc(sizeof(double) * (size_t)(R * N));
    half_graph_ref(in[0], in[1], d, o0, o1, mag);
    double u = d == EM_F16 ? 0x1p-11 : 0x1p-8, *v = tu_raw_values(out[0]);
    for (int64_t i = 0; i < R * N; i++)
        ck_assert_msg(fabs(v[i] - o0[i]) <= ulp(o0[i], d) + k * u * mag[i],
                      "%s vs float64: element %lld is %.9g, expected %.9g", what, (long long)i, v[i],
                      o0[i]);
    CHK(what, out[1], d, 1, TU_SIZES(R), o1, 1, 0);
    free(v), free(o0), free(o1), free(mag);
}

START_TEST(compile_and_lazy_match_eager) {
    for (int k = 0; k < 2; k++) {
        em_dtype d = HALVES[k];
        em_tensor *in[2] = {hrand(80, 2, TU_SIZES(4, 9), d, 1), hrand(81, 2, TU_SIZES(9, 3), d, 1)};
        em_tensor *eager[2], *comp[2], *lazy[2];
        ck_assert_int_eq(half_graph(NULL, in, NULL, eager), EM_OK);
        check_graph(eager, in, d, 16, "eager");
        em_compile_options o = {.ninputs = 2, .noutputs = 2, .name = "half_graph"};
        em_compiled *f = em_compile(half_graph, NULL, &o);
        ck_assert_ptr_nonnull(f);
        for (int rep = 0; rep < 2; rep++) { /* record, then replay */
            ck_assert_int_eq(em_call(f, in, NULL, comp), EM_OK);
            if (rep == 1) check_graph(comp, in, d, 1, "compiled"); /* the trace ran eagerly */
        }
        /* the half values are fused: exp + add + softmax's passes, and the
         * scaled sum, are generated kernels around the matmul */
        em_compile_stats st;
        ck_assert_int_eq(em_compiled_stats(f, &st), EM_OK);
        ck_assert_msg(st.kernels >= 2, "%d kernels", st.kernels);
        em_compiled_free(f);
        ck_assert_int_eq(em_lazy_begin(), EM_OK);
        ck_assert_int_eq(half_graph(NULL, in, NULL, lazy), EM_OK);
        lazy[0] = em_keep(lazy[0]);
        lazy[1] = em_keep(lazy[1]);
        ck_assert_int_eq(em_lazy_end(), EM_OK);
        check_graph(lazy, in, d, 1, "lazy");
        em_release(lazy[0]);
        em_release(lazy[1]);
    }
}
END_TEST

/* EMBER_JIT=1: lazy mode starts at a fresh thread's first op. */
typedef struct jit_run {
    em_tensor *in[2], *out[2];
    bool lazy;
} jit_run;

static void *jit_body(void *arg) {
    jit_run *r = arg;
    em_scope_begin();
    em_tensor *o[2] = {NULL, NULL};
    bool ok = half_graph(NULL, r->in, NULL, o) == EM_OK;
    r->lazy = em_lazy_active();
    r->out[0] = ok ? em_keep(o[0]) : NULL;
    r->out[1] = ok ? em_keep(o[1]) : NULL;
    em_scope_end();
    em_lazy_end(); /* computes what is pending */
    return NULL;
}

START_TEST(ember_jit_lazy_mode_matches_eager) {
    for (int k = 0; k < 2; k++) {
        em_dtype d = HALVES[k];
        jit_run r = {{hrand(82, 2, TU_SIZES(5, 8), d, 1), hrand(83, 2, TU_SIZES(8, 2), d, 1)}, {0}, false};
        em_tensor *eager[2];
        ck_assert_int_eq(half_graph(NULL, r.in, NULL, eager), EM_OK);
        setenv("EMBER_JIT", "1", 1);
        pthread_t th;
        ck_assert_int_eq(pthread_create(&th, NULL, jit_body, &r), 0);
        ck_assert_int_eq(pthread_join(th, NULL), 0);
        unsetenv("EMBER_JIT");
        ck_assert_msg(r.lazy, "EMBER_JIT=1 did not start lazy mode");
        check_graph(eager, r.in, d, 16, "eager");
        check_graph(r.out, r.in, d, 1, "EMBER_JIT=1");
        em_release(r.out[0]);
        em_release(r.out[1]);
    }
}
END_TEST

/* ---- errors that stay ---- */

START_TEST(unsupported_dtypes_still_fail) {
    em_generator *g = em_generator_new(1);
    tu_check_fails(em_rand(g, 1, TU_SIZES(3), EM_F16, CPU), EM_ERR_DTYPE);
    tu_check_fails(em_randn(g, 1, TU_SIZES(3), EM_BF16, CPU), EM_ERR_DTYPE);
    em_generator_free(g);
    em_tensor *h = hrand(90, 1, TU_SIZES(3), EM_F16, 1);
    tu_check_fails(em_index_select(h, 0, h), EM_ERR_DTYPE); /* half indices */
    tu_check_fails(em_where(h, h, h), EM_ERR_DTYPE);        /* half condition */
}
END_TEST

/* ---- autocast ---- */

/* Under a half scope a matmul of f32 operands computes in the half type:
 * the operands rounded, products summed in f32, the result rounded once;
 * f64 operands stay f64. */
START_TEST(autocast_matmul_runs_in_the_half_type) {
    for (int k = 0; k < 2; k++) {
        em_dtype d = HALVES[k];
        em_tensor *a = tu_random(90, 2, TU_SIZES(5, 33), EM_F32, 1);
        em_tensor *b = tu_random(91, 2, TU_SIZES(33, 4), EM_F32, 1);
        ck_assert_int_eq(em_autocast_begin(d), EM_OK);
        ck_assert_int_eq(em_autocast_dtype(), d);
        em_tensor *r = em_matmul(a, b);
        em_tensor *r64 = em_matmul(em_cast(a, EM_F64), em_cast(b, EM_F64));
        ck_assert_int_eq(em_autocast_end(), EM_OK);
        double *av = tu_raw_values(a), *bv = tu_raw_values(b), ref[20], mag = 0;
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < 4; j++) {
                double acc = 0;
                for (int c = 0; c < 33; c++) {
                    double p = rnd(av[i * 33 + c], d) * rnd(bv[c * 4 + j], d);
                    acc += p;
                    mag = fmax(mag, fabs(p) * 33);
                }
                ref[i * 4 + j] = acc;
            }
        /* the f32 sum of 33 exact half products: 33 f32 roundings at most */
        CHK("autocast matmul", r, d, 2, TU_SIZES(5, 4), ref, 1, 33 * 0x1p-24 * mag);
        ck_assert_int_eq(em_dtype_of(r64), EM_F64);
        free(av), free(bv);
    }
}
END_TEST

/* The ops torch keeps in f32 under autocast take half inputs in f32 and
 * return f32, with the values of the same ops on the input cast to f32;
 * the others keep the half type. */
START_TEST(autocast_keeps_f32_ops_in_f32) {
    em_tensor *x = hrand(92, 2, TU_SIZES(3, 17), EM_BF16, 1);
    em_tensor *w = hrand(93, 1, TU_SIZES(17), EM_BF16, 1);
    em_tensor *xf = em_cast(x, EM_F32), *wf = em_cast(w, EM_F32);
    em_tensor *want[] = {em_softmax(xf, -1), em_log_softmax(xf, -1), em_layer_norm(xf, 1, wf, NULL, 1e-5),
                         em_exp(xf), em_log(em_abs(xf)), em_rsqrt(em_abs(xf)), em_pow_scalar(xf, 2),
                         em_sum(xf, 1, (int[]){1}, false), em_mean(xf, 0, NULL, false),
                         em_var(xf, 1, (int[]){0}, 1, false)};
    ck_assert_int_eq(em_autocast_begin(EM_BF16), EM_OK);
    em_tensor *got[] = {em_softmax(x, -1), em_log_softmax(x, -1), em_layer_norm(x, 1, w, NULL, 1e-5),
                        em_exp(x), em_log(em_abs(x)), em_rsqrt(em_abs(x)), em_pow_scalar(x, 2),
                        em_sum(x, 1, (int[]){1}, false), em_mean(x, 0, NULL, false),
                        em_var(x, 1, (int[]){0}, 1, false)};
    em_tensor *relu = em_relu(x), *amax = em_amax(x, 0, NULL, false), *sum_i = em_sum(em_cast(x, EM_I32), 0, NULL, false);
    ck_assert_int_eq(em_autocast_end(), EM_OK);
    for (size_t i = 0; i < sizeof got / sizeof *got; i++) {
        ck_assert_msg(got[i] && em_dtype_of(got[i]) == EM_F32, "op %zu: %s", i,
                      got[i] ? em_dtype_name(em_dtype_of(got[i])) : em_last_error());
        double *wv = tu_raw_values(want[i]);
        tu_check_close(got[i], wv, em_ndim(want[i]), em_sizes(want[i]), 0, 0);
        free(wv);
    }
    ck_assert_int_eq(em_dtype_of(relu), EM_BF16);
    ck_assert_int_eq(em_dtype_of(amax), EM_BF16);
    ck_assert_int_eq(em_dtype_of(sum_i), EM_I64);
}
END_TEST

START_TEST(autocast_scopes_nest_and_errors) {
    ck_assert_int_eq(em_autocast_dtype(), EM_F32);
    ck_assert_int_eq(em_autocast_end(), EM_ERR_STATE);
    ck_assert_int_eq(em_autocast_begin(EM_I32), EM_ERR_DTYPE);
    ck_assert_int_eq(em_autocast_begin((em_dtype)99), EM_ERR_DTYPE);
    em_tensor *a = tu_random(94, 2, TU_SIZES(2, 3), EM_F32, 1);
    ck_assert_int_eq(em_autocast_begin(EM_F16), EM_OK);
    ck_assert_int_eq(em_autocast_begin(EM_F32), EM_OK); /* off inside */
    ck_assert_int_eq(em_dtype_of(em_matmul(a, em_transpose(a, 0, 1))), EM_F32);
    ck_assert_int_eq(em_autocast_end(), EM_OK);
    ck_assert_int_eq(em_dtype_of(em_matmul(a, em_transpose(a, 0, 1))), EM_F16);
    ck_assert_int_eq(em_autocast_end(), EM_OK);
    int depth = 0;
    while (em_autocast_begin(EM_BF16) == EM_OK) depth++;
    ck_assert_int_eq(em_last_status(), EM_ERR_STATE);
    ck_assert_int_eq(depth, 16);
    while (depth--) ck_assert_int_eq(em_autocast_end(), EM_OK);
    ck_assert_int_eq(em_autocast_dtype(), EM_F32);
}
END_TEST

/* softmax(x @ w) */
static em_status ac_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx, (void)s;
    out[0] = em_softmax(em_matmul(in[0], in[1]), -1);
    return out[0] ? EM_OK : em_last_status();
}

/* em_compile's autocast option runs every call under the scope; without
 * it, an entry is guarded on the caller's autocast state. */
START_TEST(autocast_in_compiled_functions) {
    em_tensor *in[2] = {tu_random(95, 2, TU_SIZES(6, 40), EM_F32, 1), tu_random(96, 2, TU_SIZES(40, 9), EM_F32, 1)};
    ck_assert_int_eq(em_autocast_begin(EM_BF16), EM_OK);
    em_tensor *want = NULL;
    ck_assert_int_eq(ac_fn(NULL, in, NULL, &want), EM_OK); /* eager under the scope */
    ck_assert_int_eq(em_autocast_end(), EM_OK);
    double *wv = tu_raw_values(want);
    em_compile_options o = {.ninputs = 2, .noutputs = 1, .name = "ac", .autocast = EM_BF16};
    em_compiled *f = em_compile(ac_fn, NULL, &o);
    ck_assert_ptr_nonnull(f);
    for (int rep = 0; rep < 2; rep++) {
        em_tensor *y = NULL;
        ck_assert_int_eq(em_call(f, in, NULL, &y), EM_OK);
        ck_assert_int_eq(em_dtype_of(y), EM_F32);
        /* the same bf16 product, then softmax in f32 (fused or not) */
        tu_check_close(y, wv, 2, TU_SIZES(6, 9), 1e-6, 1e-7);
    }
    ck_assert_int_eq(em_autocast_dtype(), EM_F32); /* the call's scope ended */
    em_compiled_free(f);
    /* no option: the caller's state picks the entry */
    o.autocast = EM_F32;
    f = em_compile(ac_fn, NULL, &o);
    em_tensor *plain = NULL, *cast = NULL;
    ck_assert_int_eq(em_call(f, in, NULL, &plain), EM_OK);
    ck_assert_int_eq(em_autocast_begin(EM_BF16), EM_OK);
    ck_assert_int_eq(em_call(f, in, NULL, &cast), EM_OK);
    ck_assert_int_eq(em_autocast_end(), EM_OK);
    em_compile_stats st;
    ck_assert_int_eq(em_compiled_stats(f, &st), EM_OK);
    ck_assert_int_eq(st.traces, 2);
    ck_assert_msg(strstr(st.last_failure, "autocast"), "%s", st.last_failure);
    tu_check_close(cast, wv, 2, TU_SIZES(6, 9), 1e-6, 1e-7);
    em_tensor *pw = NULL;
    ck_assert_int_eq(ac_fn(NULL, in, NULL, &pw), EM_OK);
    double *pv = tu_raw_values(pw);
    tu_check_close(plain, pv, 2, TU_SIZES(6, 9), 1e-5, 1e-7); /* f32 throughout */
    em_compiled_free(f);
    o.autocast = EM_I32;
    ck_assert_ptr_null(em_compile(ac_fn, NULL, &o));
    ck_assert_int_eq(em_last_status(), EM_ERR_ARG);
    free(wv), free(pv);
}
END_TEST

static Suite *suite(void) {
    const tu_test tests[] = {
        {"f32_and_f64_to_half_round_to_nearest_even", f32_and_f64_to_half_round_to_nearest_even},
        {"f64_to_half_rounds_once", f64_to_half_rounds_once},
        {"every_half_pattern_round_trips", every_half_pattern_round_trips},
        {"f32_to_half_at_every_midpoint", f32_to_half_at_every_midpoint},
        {"casts_with_integers_and_bool", casts_with_integers_and_bool},
        {"promotion_follows_torch", promotion_follows_torch},
        {"unary_ops_in_both_formats", unary_ops_in_both_formats},
        {"unary_special_values", unary_special_values},
        {"binary_ops_broadcast_and_scalars", binary_ops_broadcast_and_scalars},
        {"mixed_halves_compute_in_f32", mixed_halves_compute_in_f32},
        {"comparisons_and_where", comparisons_and_where},
        {"reductions_in_both_formats", reductions_in_both_formats},
        {"reductions_accumulate_wider_than_half", reductions_accumulate_wider_than_half},
        {"argmax_in_both_formats", argmax_in_both_formats},
        {"softmax_family_and_layer_norm", softmax_family_and_layer_norm},
        {"index_cat_and_views_are_exact", index_cat_and_views_are_exact},
        {"matmul_in_both_formats", matmul_in_both_formats},
        {"compile_and_lazy_match_eager", compile_and_lazy_match_eager},
        {"ember_jit_lazy_mode_matches_eager", ember_jit_lazy_mode_matches_eager},
        {"autocast_matmul_runs_in_the_half_type", autocast_matmul_runs_in_the_half_type},
        {"autocast_keeps_f32_ops_in_f32", autocast_keeps_f32_ops_in_f32},
        {"autocast_scopes_nest_and_errors", autocast_scopes_nest_and_errors},
        {"autocast_in_compiled_functions", autocast_in_compiled_functions},
        {"unsupported_dtypes_still_fail", unsupported_dtypes_still_fail},
    };
    return tu_suite("half", tests, sizeof tests / sizeof tests[0], 120);
}

int main(void) { return tu_run(suite()); }
