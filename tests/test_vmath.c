/* test_vmath.c - accuracy of the float32 exp, log, tanh, sigmoid, erf, gelu
 * and gelu_tanh kernels (the approximations of src/eager/vmath.h), through
 * the public ops, against double libm computed here.
 *
 * Each function is swept densely: every 97th float32 bit pattern over its
 * relevant range (both signs where they matter, subnormal inputs included),
 * in chunks that go through em_exp etc. as f32 tensors; then special values.
 * The error of y against the double reference r is counted in ulps of the
 * float32 nearest r (2^-149 for subnormal results), which is a relative
 * error for normal results, so tiny results near 0 (tanh, erf of tiny x)
 * are held to relative accuracy too.
 *
 * Max errors measured on these sweeps (x86-64, gcc 12 -O2; the library's
 * SSE2, AVX2 and AVX-512 clones give bitwise identical results), and over
 * every float32 input (exhaustive, outside this test; also with FMA
 * contraction, -march=native -ffp-contract=fast, in brackets):
 *   exp        0.975 ulp   exhaustive 0.990 (1.010)   asserted <= 1.5
 *   log        0.794 ulp   exhaustive 0.835 (0.756)   asserted <= 1.5
 *   tanh       1.498 ulp   exhaustive 1.509 (1.509)   asserted <= 2.5
 *   sigmoid    2.353 ulp   exhaustive 2.402 (2.402)   asserted <= 3
 *   erf        1.036 ulp   exhaustive 1.075 (1.047)   asserted <= 2
 *   gelu       x >= -1: 2.449 ulp (asserted <= 3.5); -5.5 <= x < -1:
 *              relative error <= 1.6e-5 (asserted <= 4e-5: the rounding of
 *              x/sqrt 2 and of the erfc polynomial is amplified by exp,
 *              ~x^2 ulp); x < -5.5: |error| <= 7.9e-8 (asserted <= 1.2e-7;
 *              -0 is returned below x = -5.55, where |gelu| < 8.1e-8)
 *   gelu_tanh  x >= -10: 3.069 ulp (asserted <= 4); below, where exp(-|2u|)
 *              is subnormal: relative error <= 4e-7 while the result is
 *              normal, and within |x| subnormal ulps beyond (asserted:
 *              <= 1e-6 |r| + 2^-145)
 * EMBER_VMATH_REPORT=1 ./tests/test_vmath prints the measured figures. */
#include "testutil.h"

#include <float.h>
#include <stdio.h>
#include <string.h>

static float f_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The ulp of the float32 nearest to r (r finite). */
static double ulp_of(double r) {
    int e;
    frexp(r, &e);
    return e - 24 < -149 ? ldexp(1, -149) : ldexp(1, e - 24);
}

/* Error of y in ulps of r; INFINITY when y is NaN and r is not (or the
 * reverse), or when either is infinite and they differ. */
static double ulp_err(float y, double r) {
    if (isnan(r) || isnan(y)) return isnan(r) && isnan(y) ? 0 : INFINITY;
    float rf = (float)r;
    if (isinf(rf) || isinf(y)) return y == rf ? 0 : INFINITY;
    return fabs((double)y - r) / ulp_of(r);
}

/* ---- References (double) ---- */

static double r_sigmoid(double x) { return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x)); }
static double r_gelu(double x) { return 0.5 * x * erfc(-x * M_SQRT1_2); }
static double r_gelu_tanh(double x) {
    return x * r_sigmoid(2 * sqrt(2 / M_PI) * (x + 0.044715 * x * x * x));
}

typedef em_tensor *(*unary_fn)(const em_tensor *);
typedef double (*ref1_fn)(double);

/* A range of float32 bit patterns [lo, hi], swept with step (97 if 0). */
typedef struct bits_range {
    uint32_t lo, hi, step;
} bits_range;

#define NEG 0x80000000u
#define STEP 97u
#define SPARSE 9973u

typedef struct vcase {
    const char *name;
    unary_fn fn;
    ref1_fn ref;
    bits_range r[4];
    double max_ulp; /* asserted, for x >= tail_x */
    /* below tail_x: |y - r| <= tail_rel |r| + 2^-145 instead, and below
     * zero_x |y - r| <= ZERO_ABS (gelu returns -0 there) */
    double tail_x, tail_rel, zero_x;
} vcase;

/* Bit patterns of some bounds: 2^-12 = 0x39800000, 0.5 = 0x3f000000, 2 =
 * 0x40000000, 4 = 0x40800000, 9.1 = 0x4111999a, 14 = 0x41600000, 17 =
 * 0x41880000, 104 = 0x42d00000, FLT_MAX = 0x7f7fffff; the smallest
 * subnormal is 0x00000001.  Each function is swept densely (step 97) where
 * it is not trivially 1, x, 0 or +-1 in float32, and sparsely (step 9973)
 * from the smallest subnormal up to there, so that tiny inputs are held to
 * relative accuracy too. */
#define TINY(sign) {(sign) | 0x00000001u, (sign) | 0x39800000u, SPARSE}
static const vcase cases[] = {
    {"exp", em_exp, exp,
     {{0x39800000u, 0x42d00000u, STEP}, {NEG | 0x39800000u, NEG | 0x42d00000u, STEP}},
     1.5, -INFINITY, 0, -INFINITY},
    /* log: every positive float matters: [0.5, 2] and the subnormals
     * densely, everything up to FLT_MAX sparsely. */
    {"log", em_log, log,
     {{0x3f000000u, 0x40000000u, STEP}, {0x00000001u, 0x00800000u, STEP},
      {0x00800000u, 0x7f7fffffu, SPARSE}},
     1.5, -INFINITY, 0, -INFINITY},
    {"tanh", em_tanh, tanh,
     {{0x39800000u, 0x4111999au, STEP}, {NEG | 0x39800000u, NEG | 0x4111999au, STEP}, TINY(0),
      TINY(NEG)},
     2.5, -INFINITY, 0, -INFINITY},
    {"sigmoid", em_sigmoid, r_sigmoid,
     {{0x39800000u, 0x41880000u, STEP}, {NEG | 0x39800000u, NEG | 0x42d00000u, STEP}},
     3, -INFINITY, 0, -INFINITY},
    {"erf", em_erf, erf,
     {{0x39800000u, 0x40800000u, STEP}, {NEG | 0x39800000u, NEG | 0x40800000u, STEP}, TINY(0),
      TINY(NEG)},
     2, -INFINITY, 0, -INFINITY},
    {"gelu", em_gelu, r_gelu,
     {{0x39800000u, 0x41600000u, STEP}, {NEG | 0x39800000u, NEG | 0x41600000u, STEP}, TINY(0),
      TINY(NEG)},
     3.5, -1, 4e-5, -5.5},
    {"gelu_tanh", em_gelu_tanh, r_gelu_tanh,
     {{0x39800000u, 0x41600000u, STEP}, {NEG | 0x39800000u, NEG | 0x41600000u, STEP}, TINY(0),
      TINY(NEG)},
     4, -10, 1e-6, -INFINITY},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

/* The absolute bound below zero_x (gelu's result is -0 there, see vmath.h). */
#define ZERO_ABS 1.2e-7

enum { CHUNK = 1 << 18 };

typedef struct worst {
    double err; /* ulps, or the tail's error / its allowance */
    float x, y;
    double r;
} worst;

/* Runs fn over x[0..n) as one f32 tensor and folds the errors into w
 * (w[0]: the ulp part, w[1]: the tail part, as a fraction of its bound). */
static void check_chunk(const vcase *vc, const float *x, int64_t n, worst *w) {
    em_scope_begin();
    em_tensor *t = em_from_data(x, EM_F32, 1, TU_SIZES(n), em_cpu());
    ck_assert_msg(t != NULL, "%s: %s", vc->name, em_last_error());
    em_tensor *yt = vc->fn(t);
    ck_assert_msg(yt != NULL, "%s: %s", vc->name, em_last_error());
    ck_assert_int_eq(em_dtype_of(yt), EM_F32);
    float *y = malloc(sizeof(float) * (size_t)n);
    ck_assert_int_eq(em_copy_to_host(yt, y, sizeof(float) * (size_t)n), EM_OK);
    for (int64_t i = 0; i < n; i++) {
        double r = vc->ref(x[i]);
        int tail = x[i] < vc->tail_x;
        double e;
        if (!tail) {
            e = ulp_err(y[i], r);
        } else {
            /* + 16 subnormal ulps: gelu_tanh's exp underflows below x = -10 */
            double allow = x[i] < vc->zero_x ? ZERO_ABS : vc->tail_rel * fabs(r) + 0x1p-145;
            e = fabs((double)y[i] - r) / allow;
            if (isnan(e)) e = INFINITY;
        }
        if (e > w[tail].err || (isinf(e) && w[tail].err != INFINITY)) {
            w[tail].err = e;
            w[tail].x = x[i];
            w[tail].y = y[i];
            w[tail].r = r;
        }
    }
    free(y);
    ck_assert_int_eq(em_scope_end(), EM_OK);
}

START_TEST(test_sweep) {
    const vcase *vc = &cases[_i];
    float *x = malloc(sizeof(float) * CHUNK);
    worst w[2] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    int64_t total = 0;
    for (int k = 0; k < 4; k++) {
        const bits_range *br = &vc->r[k];
        if (br->step == 0) continue;
        int64_t n = 0;
        for (uint64_t u = br->lo; u <= br->hi; u += br->step) {
            x[n++] = f_of((uint32_t)u);
            if (n == CHUNK) {
                check_chunk(vc, x, n, w);
                total += n;
                n = 0;
            }
        }
        if (n > 0) check_chunk(vc, x, n, w);
        total += n;
    }
    free(x);
    if (getenv("EMBER_VMATH_REPORT"))
        printf("%-10s %lld inputs: max %.3f ulp at x = %a (got %.9g, want %.12g); tail %.3f of "
               "its bound at x = %a\n",
               vc->name, (long long)total, w[0].err, (double)w[0].x, (double)w[0].y, w[0].r,
               w[1].err, (double)w[1].x);
    ck_assert_msg(w[0].err <= vc->max_ulp,
                  "%s: %.3f ulp at x = %a (%.9g): got %.9g, want %.12g (bound %.1f ulp)", vc->name,
                  w[0].err, (double)w[0].x, (double)w[0].x, (double)w[0].y, w[0].r, vc->max_ulp);
    ck_assert_msg(w[1].err <= 1.0,
                  "%s tail: error %.3f x its bound at x = %a: got %.9g, want %.12g", vc->name,
                  w[1].err, (double)w[1].x, (double)w[1].y, w[1].r);
}
END_TEST

/* ---- Special values ---- */

/* Runs fn on n values and returns the results (malloc'd). */
static float *run(unary_fn fn, const float *x, int n) {
    em_tensor *t = em_from_data(x, EM_F32, 1, TU_SIZES(n), em_cpu());
    ck_assert_ptr_nonnull(t);
    em_tensor *y = fn(t);
    ck_assert_msg(y != NULL, "%s", em_last_error());
    float *v = malloc(sizeof(float) * (size_t)n);
    ck_assert_int_eq(em_copy_to_host(y, v, sizeof(float) * (size_t)n), EM_OK);
    return v;
}

/* Asserts fn(x[i]) is bitwise want[i] (any NaN for a NaN). */
static void check_exact(const char *name, unary_fn fn, const float *x, const float *want, int n) {
    float *y = run(fn, x, n);
    for (int i = 0; i < n; i++) {
        int ok = isnan(want[i]) ? isnan(y[i]) : memcmp(&y[i], &want[i], sizeof(float)) == 0;
        ck_assert_msg(ok, "%s(%a) = %a, expected %a", name, (double)x[i], (double)y[i],
                      (double)want[i]);
    }
    free(y);
}

#define CHECK_EXACT(name, fn, X, W)                                                    \
    do {                                                                               \
        const float x_[] = X, w_[] = W;                                                \
        ck_assert_int_eq(sizeof x_, sizeof w_);                                        \
        check_exact(name, fn, x_, w_, (int)(sizeof x_ / sizeof x_[0]));                \
    } while (0)
#define L(...) {__VA_ARGS__}

START_TEST(test_special) {
    const float inf = INFINITY, nan = NAN;
    /* exp: the last finite result and the first overflow, 0 and 1. */
    float xmax = f_of(0x42b17217u), xover = f_of(0x42b17218u);
    CHECK_EXACT("exp", em_exp, L(-inf, inf, nan, 0.0f, -0.0f, 100.0f, 89.0f, -104.0f, -1000.0f),
                L(0.0f, inf, nan, 1.0f, 1.0f, inf, inf, 0.0f, 0.0f));
    const float ex[] = {xmax, xover, -87.0f, -100.0f, -103.9f};
    float *y = run(em_exp, ex, 5);
    ck_assert_msg(isfinite(y[0]) && ulp_err(y[0], exp(xmax)) <= 1.5, "exp(%a) = %a", (double)xmax,
                  (double)y[0]);
    ck_assert_msg(isinf(y[1]) && y[1] > 0, "exp(%a) = %a", (double)xover, (double)y[1]);
    /* gradual underflow: subnormal results are computed, not flushed */
    for (int i = 2; i < 5; i++) {
        double r = exp((double)ex[i]);
        ck_assert_msg(ulp_err(y[i], r) <= 1.0 && y[i] > 0, "exp(%a) = %a, want %a", (double)ex[i],
                      (double)y[i], r);
    }
    free(y);
    /* log */
    CHECK_EXACT("log", em_log, L(0.0f, -0.0f, -1.0f, -inf, -FLT_MIN, inf, nan, 1.0f),
                L(-inf, -inf, nan, nan, nan, inf, nan, 0.0f));
    y = run(em_log, (const float[]){f_of(1), FLT_MIN, FLT_MAX, f_of(0x007fffffu)}, 4);
    ck_assert_msg(ulp_err(y[0], log(0x1p-149)) <= 1.0, "log(2^-149) = %a", (double)y[0]);
    ck_assert_msg(ulp_err(y[1], log(FLT_MIN)) <= 1.0, "log(FLT_MIN) = %a", (double)y[1]);
    ck_assert_msg(ulp_err(y[2], log(FLT_MAX)) <= 1.0, "log(FLT_MAX) = %a", (double)y[2]);
    ck_assert_msg(ulp_err(y[3], log((double)f_of(0x007fffffu))) <= 1.0, "log(max subnormal) = %a",
                  (double)y[3]);
    free(y);
    /* tanh: odd, exact for tiny x, +-1 at the ends */
    CHECK_EXACT("tanh", em_tanh,
                L(-inf, inf, nan, 0.0f, -0.0f, 1e-30f, -1e-30f, f_of(1), 20.0f, -20.0f),
                L(-1.0f, 1.0f, nan, 0.0f, -0.0f, 1e-30f, -1e-30f, f_of(1), 1.0f, -1.0f));
    /* sigmoid */
    CHECK_EXACT("sigmoid", em_sigmoid, L(-inf, inf, nan, 0.0f, -0.0f, 200.0f, -200.0f),
                L(0.0f, 1.0f, nan, 0.5f, 0.5f, 1.0f, 0.0f));
    y = run(em_sigmoid, (const float[]){-80.0f, -100.0f}, 2);
    ck_assert_msg(ulp_err(y[0], r_sigmoid(-80)) <= 2.0, "sigmoid(-80) = %a", (double)y[0]);
    ck_assert_msg(ulp_err(y[1], r_sigmoid(-100)) <= 1.0 && y[1] > 0, "sigmoid(-100) = %a",
                  (double)y[1]);
    free(y);
    /* erf */
    CHECK_EXACT("erf", em_erf, L(-inf, inf, nan, 0.0f, -0.0f, 4.0f, -4.0f, 100.0f),
                L(-1.0f, 1.0f, nan, 0.0f, -0.0f, 1.0f, -1.0f, 1.0f));
    y = run(em_erf, (const float[]){1e-30f, f_of(1), -f_of(0x00400000u)}, 3);
    ck_assert_msg(ulp_err(y[0], erf(1e-30)) <= 1.0, "erf(1e-30) = %a", (double)y[0]);
    ck_assert_msg(ulp_err(y[1], erf(0x1p-149)) <= 1.0, "erf(2^-149) = %a", (double)y[1]);
    ck_assert_msg(ulp_err(y[2], erf(-0x1p-127)) <= 1.0, "erf(-2^-127) = %a", (double)y[2]);
    free(y);
    /* gelu, gelu_tanh: -inf gives NaN (-inf * 0), like the formula in any precision */
    CHECK_EXACT("gelu", em_gelu, L(-inf, inf, nan, 0.0f, 1e30f, -1e30f, -10.0f),
                L(nan, inf, nan, 0.0f, 1e30f, -0.0f, -0.0f));
    CHECK_EXACT("gelu_tanh", em_gelu_tanh, L(-inf, inf, nan, 0.0f, 1e30f, -1e30f),
                L(nan, inf, nan, 0.0f, 1e30f, -0.0f));
}
END_TEST

/* Strided and transposed inputs go through the same functions (scalar
 * path): bitwise the same results as the contiguous (vectorized) path. */
START_TEST(test_strided_same) {
    const int64_t R = 67, C = 129;
    float *v = malloc(sizeof(float) * (size_t)(R * C));
    for (int64_t i = 0; i < R * C; i++) v[i] = (float)((double)(i % 997) / 997.0 * 24.0 - 12.0);
    em_tensor *x = em_from_data(v, EM_F32, 2, TU_SIZES(R, C), em_cpu());
    em_tensor *xt = em_contiguous(em_transpose(x, 0, 1)); /* [C, R] contiguous */
    for (int k = 0; k < N_CASES; k++) {
        em_tensor *a = cases[k].fn(em_transpose(xt, 0, 1)); /* strided input */
        em_tensor *b = cases[k].fn(x);                       /* contiguous */
        ck_assert_ptr_nonnull(a);
        ck_assert_ptr_nonnull(b);
        size_t nb = sizeof(float) * (size_t)(R * C);
        float *ya = malloc(nb), *yb = malloc(nb);
        ck_assert_int_eq(em_copy_to_host(a, ya, nb), EM_OK);
        ck_assert_int_eq(em_copy_to_host(b, yb, nb), EM_OK);
        ck_assert_msg(memcmp(ya, yb, nb) == 0, "%s: strided != contiguous", cases[k].name);
        free(ya);
        free(yb);
    }
    free(v);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("vmath");
    TCase *tc = tcase_create("vmath");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_sweep, 0, N_CASES);
    tcase_add_test(tc, test_special);
    tcase_add_test(tc, test_strided_same);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run(suite()); }
