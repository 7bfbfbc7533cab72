/* test_gccjit.c - the libgccjit CPU code generator (src/jit/cpu_gccjit.c):
 * hand-built kernels (kir_*) compiled and run, compared against float64
 * references computed here.
 *
 * libgccjit is slow under valgrind (seconds per compile), so the suite
 * compiles few kernels and checks many things with each: one pointwise
 * kernel over several lengths, one kernel per float dtype computing every
 * alu op, one integer kernel, a 2-D strided/broadcast kernel (also run
 * split into 1, 2 and 7 pieces), a row softmax, a row-reduction kernel,
 * and a whole-array sum through write_so + load_so. */
#include "testutil.h"

#include <fcntl.h>
#include <float.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cpu_gccjit.h"

/* ---- helpers ---- */

/* Assertions that reach Check only on failure: every ck_assert call records
 * a mark point (a write to Check's pipe), far too slow in element loops. */
#define EXPECT(c)                                                                                  \
    do {                                                                                           \
        if (!(c)) ck_assert_msg(0, "%s:%d: %s", __FILE__, __LINE__, #c);                           \
    } while (0)
#define EXPECT_MSG(c, ...)                                                                         \
    do {                                                                                           \
        if (!(c)) ck_assert_msg(0, __VA_ARGS__);                                                   \
    } while (0)

static uint64_t rng_state;
static uint64_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
/* uniform in [lo, hi) */
static double unif(double lo, double hi) {
    return lo + (hi - lo) * (double)(rng() >> 11) * 0x1p-53;
}

static jit_cpu_kernel *compile_ok(const k_kernel *k) {
    jit_cpu_kernel *ck = NULL;
    em_status s = jit_cpu_compile(k, &ck);
    ck_assert_msg(s == EM_OK, "compile %s: %s: %s", k->name, em_status_name(s), em_last_error());
    ck_assert_ptr_nonnull(ck);
    return ck;
}

static float f_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Error of float y in ulps of the float32 nearest r (2^-149 for subnormal
 * results); 0 when both are NaN or the same infinity, INFINITY on any other
 * NaN/inf mismatch. */
static double ulp32(float y, double r) {
    if (isnan(r) || isnan(y)) return isnan(r) && isnan(y) ? 0 : INFINITY;
    float rf = (float)r;
    if (isinf(rf) || isinf(y)) return y == rf ? 0 : INFINITY;
    int e;
    frexp(r, &e);
    double ulp = e - 24 < -149 ? ldexp(1, -149) : ldexp(1, e - 24);
    return fabs((double)y - r) / ulp;
}

static double ulp64(double y, double r) {
    if (isnan(r) || isnan(y)) return isnan(r) && isnan(y) ? 0 : INFINITY;
    if (isinf(r) || isinf(y)) return y == r ? 0 : INFINITY;
    int e;
    frexp(r, &e);
    double ulp = e - 53 < -1074 ? ldexp(1, -1074) : ldexp(1, e - 53);
    return fabs(y - r) / ulp;
}

/* bitwise equal, or both NaN */
static bool same32(float a, float b) {
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0;
}
static bool same64(double a, double b) {
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0;
}

static double r_sigmoid(double x) { return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x)); }
static double r_gelu(double x) { return 0.5 * x * erfc(-x * M_SQRT1_2); }
static double r_gelu_tanh(double x) {
    return x * r_sigmoid(2 * sqrt(2 / M_PI) * (x + 0.044715 * x * x * x));
}
static double r_rsqrt(double x) { return 1 / sqrt(x); }
static double r_relu(double x) { return x < 0 ? 0 : x; }
static double r_neg(double x) { return -x; }
/* the eager kernels' NaN-propagating maximum/minimum */
static double r_max(double x, double y) { return (x != x || x > y) ? x : y; }
static double r_min(double x, double y) { return (x != x || x < y) ? x : y; }

/* float -> integer as the eager cast: truncate, saturate, NaN -> 0 */
static int64_t r_f2i(double d, bool i64) {
    double top = i64 ? 9223372036854775808.0 : 2147483647.0,
           bot = i64 ? -9223372036854775808.0 : -2147483648.0;
    if (d != d) return 0;
    if (d >= top) return i64 ? INT64_MAX : INT32_MAX;
    if (d <= bot) return i64 ? INT64_MIN : INT32_MIN;
    return (int64_t)d;
}

/* ---- pointwise: add, mul, where, compare, casts over several lengths ---- */

enum {
    PW_ADD,
    PW_MUL,
    PW_WHERE,
    PW_GE,
    PW_F2I,
    PW_F2D,
    PW_B2F,
    PW_IARITH,
    PW_I2F,
    PW_F2B,
    PW_I2L,
    PW_F2L,
    PW_NOUT
};

static k_kernel *build_pointwise(void) {
    static const em_dtype od[PW_NOUT] = {EM_F32, EM_F32, EM_F32, EM_BOOL, EM_I32, EM_F64,
                                         EM_F32, EM_I32, EM_F32, EM_BOOL, EM_I64, EM_I64};
    k_kernel *k = kir_new("pointwise");
    int a = kir_buf(k, EM_F32), b = kir_buf(k, EM_F32), ia = kir_buf(k, EM_I32), o[PW_NOUT];
    for (int j = 0; j < PW_NOUT; j++) o[j] = kir_buf(k, od[j]);
    int n = kir_size(k);
    int hundred = kir_const_f(k, EM_F32, 100.0), three = kir_const_i(k, EM_I32, 3);
    int three64 = kir_const_i(k, EM_I64, 3);
    int i = kir_range(k, n, K_PARALLEL);
    int x = kir_load(k, a, i), y = kir_load(k, b, i), v = kir_load(k, ia, i);
    kir_store(k, o[PW_ADD], i, kir_alu(k, KA_ADD, x, y, -1));
    kir_store(k, o[PW_MUL], i, kir_alu(k, KA_MUL, x, y, -1));
    int lt = kir_alu(k, KA_LT, x, y, -1);
    kir_store(k, o[PW_WHERE], i, kir_alu(k, KA_WHERE, lt, x, kir_alu(k, KA_MUL, y, hundred, -1)));
    kir_store(k, o[PW_GE], i, kir_alu(k, KA_GE, x, y, -1));
    kir_store(k, o[PW_F2I], i, kir_convert(k, kir_alu(k, KA_MUL, x, hundred, -1), EM_I32));
    kir_store(k, o[PW_F2D], i, kir_cast(k, x, EM_F64));
    kir_store(k, o[PW_B2F], i, kir_cast(k, lt, EM_F32));
    kir_store(k, o[PW_IARITH], i, kir_alu(k, KA_ADD, v, kir_alu(k, KA_MUL, v, three, -1), -1));
    kir_store(k, o[PW_I2F], i, kir_cast(k, v, EM_F32));
    kir_store(k, o[PW_F2B], i, kir_cast(k, x, EM_BOOL));
    kir_store(k, o[PW_I2L], i, kir_alu(k, KA_MUL, kir_cast(k, v, EM_I64), three64, -1));
    int big = kir_const_f(k, EM_F32, 1e18);
    kir_store(k, o[PW_F2L], i, kir_convert(k, kir_alu(k, KA_MUL, x, big, -1), EM_I64));
    kir_end(k);
    ck_assert_int_eq(kir_verify(k), EM_OK);
    return k;
}

START_TEST(pointwise_lengths) {
    k_kernel *k = build_pointwise();
    jit_cpu_kernel *ck = compile_ok(k);
    static const int64_t lens[] = {0, 1, 7, 1000, 100003};
    rng_state = 42;
    for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++) {
        int64_t n = lens[t];
        size_t m = (size_t)(n ? n : 1);
        float *a = malloc(m * 4), *b = malloc(m * 4);
        int32_t *ia = malloc(m * 4);
        for (int64_t j = 0; j < n; j++) {
            a[j] = (float)unif(-10, 10);
            b[j] = j % 5 == 0 ? a[j] : (float)unif(-10, 10);
            ia[j] = (int32_t)(rng() & 0xffffffffu);
        }
        /* specials: NaN, infinities, +-0, out-of-range casts, overflow */
        if (n > 7) {
            a[1] = NAN, b[2] = NAN, a[3] = INFINITY, b[3] = -INFINITY, a[4] = -0.0f, b[4] = 0.0f;
            a[5] = 3e9f, a[6] = -3e9f, ia[1] = INT32_MAX, ia[2] = INT32_MIN;
        }
        void *bufs[3 + PW_NOUT] = {a, b, ia};
        for (int j = 0; j < PW_NOUT; j++) bufs[3 + j] = calloc(m, 8);
        ck_assert_int_eq(jit_cpu_run(ck, bufs, &n), EM_OK);
        float *add = bufs[3 + PW_ADD], *mul = bufs[3 + PW_MUL], *wh = bufs[3 + PW_WHERE];
        float *b2f = bufs[3 + PW_B2F], *i2f = bufs[3 + PW_I2F];
        uint8_t *ge = bufs[3 + PW_GE], *f2b = bufs[3 + PW_F2B];
        int32_t *f2i = bufs[3 + PW_F2I], *iar = bufs[3 + PW_IARITH];
        double *f2d = bufs[3 + PW_F2D];
        int64_t *i2l = bufs[3 + PW_I2L], *f2l = bufs[3 + PW_F2L];
        for (int64_t j = 0; j < n; j++) {
            double x = a[j], y = b[j];
            EXPECT_MSG(same32(add[j], (float)(x + y)), "n=%lld add[%lld]", (long long)n,
                       (long long)j);
            EXPECT_MSG(same32(mul[j], (float)(x * y)), "mul[%lld]", (long long)j);
            EXPECT_MSG(same32(wh[j], x < y ? (float)x : (float)(y * 100.0f)), "where[%lld]",
                       (long long)j);
            EXPECT(ge[j] == (x >= y));
            EXPECT_MSG(f2i[j] == r_f2i((double)(a[j] * 100.0f), false), "f2i[%lld] = %d for %g",
                       (long long)j, f2i[j], x);
            EXPECT_MSG(same64(f2d[j], x), "f2d[%lld]", (long long)j);
            EXPECT(b2f[j] == (x < y ? 1.0f : 0.0f));
            EXPECT(iar[j] == (int32_t)((uint32_t)ia[j] + (uint32_t)ia[j] * 3u));
            EXPECT(i2f[j] == (float)ia[j]);
            EXPECT(f2b[j] == (x != 0));
            EXPECT(i2l[j] == (int64_t)ia[j] * 3);
            EXPECT_MSG(f2l[j] == r_f2i((double)(a[j] * 1e18f), true), "f2l[%lld] = %lld for %g",
                       (long long)j, (long long)f2l[j], x);
        }
        for (int j = 0; j < 3 + PW_NOUT; j++) free(bufs[j]);
    }
    jit_cpu_free(ck);
    kir_free(k);
}
END_TEST

/* ---- every alu op on f32 and f64 ---- */

static const k_alu UN[] = {KA_NEG, KA_ABS,  KA_EXP,     KA_LOG,  KA_SQRT, KA_RSQRT,     KA_SIN,
                           KA_COS, KA_TANH, KA_SIGMOID, KA_RELU, KA_GELU, KA_GELU_TANH, KA_ERF};
static const k_alu BIN[] = {KA_ADD, KA_SUB, KA_MUL, KA_DIV, KA_POW, KA_MAX, KA_MIN};
enum {
    NU = sizeof UN / sizeof UN[0],
    NB = sizeof BIN / sizeof BIN[0],
    NC = 6,
    NOUT = NU + NB + NC + 1
};
static double (*const UREF[NU])(double) = {r_neg,   fabs,   exp,         log,  sqrt,
                                           r_rsqrt, sin,    cos,         tanh, r_sigmoid,
                                           r_relu,  r_gelu, r_gelu_tanh, erf};

static int uidx(k_alu a) {
    for (int i = 0; i < NU; i++)
        if (UN[i] == a) return i;
    return -1;
}

/* out[u] = UN[u](x); out[NU + b] = BIN[b](x, y); out[NU + NB + c] = (x cmp_c y);
 * out[NOUT - 1] = where(x > y, 2x, y) */
static k_kernel *build_alu(const char *name, em_dtype d) {
    k_kernel *k = kir_new(name);
    int x = kir_buf(k, d), y = kir_buf(k, d), out[NOUT];
    for (int o = 0; o < NOUT; o++)
        out[o] = kir_buf(k, o >= NU + NB && o < NU + NB + NC ? EM_BOOL : d);
    int n = kir_size(k), two = kir_const_f(k, d, 2.0);
    int i = kir_range(k, n, K_PARALLEL);
    int vx = kir_load(k, x, i), vy = kir_load(k, y, i);
    for (int u = 0; u < NU; u++) kir_store(k, out[u], i, kir_alu(k, UN[u], vx, -1, -1));
    for (int b = 0; b < NB; b++) kir_store(k, out[NU + b], i, kir_alu(k, BIN[b], vx, vy, -1));
    for (int c = 0; c < NC; c++)
        kir_store(k, out[NU + NB + c], i, kir_alu(k, (k_alu)(KA_EQ + c), vx, vy, -1));
    int w =
        kir_alu(k, KA_WHERE, kir_alu(k, KA_GT, vx, vy, -1), kir_alu(k, KA_MUL, vx, two, -1), vy);
    kir_store(k, out[NOUT - 1], i, w);
    kir_end(k);
    ck_assert_int_eq(kir_verify(k), EM_OK);
    return k;
}

/* Runs an alu kernel on x, y[0..n); returns the NOUT outputs (malloc'd). */
static void run_alu(jit_cpu_kernel *ck, size_t es, const void *x, const void *y, int64_t n,
                    void **out) {
    void *bufs[2 + NOUT] = {(void *)x, (void *)y};
    for (int o = 0; o < NOUT; o++) bufs[2 + o] = out[o] = malloc((size_t)(n ? n : 1) * es);
    ck_assert_int_eq(jit_cpu_run(ck, bufs, &n), EM_OK);
}

static void free_outs(void **out) {
    for (int o = 0; o < NOUT; o++) free(out[o]);
}

/* Checks the non-transcendental ops on (x, y) pairs. */
#define CHECK_BASIC(T, SAME, ULP, x, y, n, out)                                                    \
    do {                                                                                           \
        for (int64_t j = 0; j < (n); j++) {                                                        \
            double X = (x)[j], Y = (y)[j];                                                         \
            T *o;                                                                                  \
            o = out[uidx(KA_NEG)];                                                                 \
            EXPECT(SAME(o[j], (T)-X));                                                             \
            o = out[uidx(KA_ABS)];                                                                 \
            EXPECT(SAME(o[j], (T)fabs(X)));                                                        \
            o = out[uidx(KA_RELU)];                                                                \
            EXPECT(SAME(o[j], (T)r_relu(X)));                                                      \
            o = out[uidx(KA_SQRT)];                                                                \
            EXPECT_MSG(SAME(o[j], (T)sqrt(X)), "sqrt(%a)", X);                                     \
            o = out[uidx(KA_RSQRT)];                                                               \
            EXPECT_MSG(ULP(o[j], 1 / sqrt(X)) <= 1.5, "rsqrt(%a)", X);                             \
            o = out[NU + 0];                                                                       \
            EXPECT(SAME(o[j], (T)(X + Y)));                                                        \
            o = out[NU + 1];                                                                       \
            EXPECT(SAME(o[j], (T)(X - Y)));                                                        \
            o = out[NU + 2];                                                                       \
            EXPECT(SAME(o[j], (T)(X * Y)));                                                        \
            o = out[NU + 3];                                                                       \
            EXPECT_MSG(SAME(o[j], (T)((T)X / (T)Y)), "div(%a, %a)", X, Y);                         \
            o = out[NU + 4];                                                                       \
            EXPECT_MSG(ULP(o[j], pow(X, Y)) <= 2, "pow(%a, %a) = %a", X, Y, (double)o[j]);         \
            o = out[NU + 5];                                                                       \
            EXPECT_MSG(SAME(o[j], (T)r_max(X, Y)), "max(%a, %a)", X, Y);                           \
            o = out[NU + 6];                                                                       \
            EXPECT_MSG(SAME(o[j], (T)r_min(X, Y)), "min(%a, %a)", X, Y);                           \
            uint8_t *c = out[NU + NB];                                                             \
            EXPECT(c[j] == (X == Y));                                                              \
            c = out[NU + NB + 1];                                                                  \
            EXPECT(c[j] == (X != Y));                                                              \
            c = out[NU + NB + 2];                                                                  \
            EXPECT(c[j] == (X < Y));                                                               \
            c = out[NU + NB + 3];                                                                  \
            EXPECT(c[j] == (X <= Y));                                                              \
            c = out[NU + NB + 4];                                                                  \
            EXPECT(c[j] == (X > Y));                                                               \
            c = out[NU + NB + 5];                                                                  \
            EXPECT(c[j] == (X >= Y));                                                              \
            o = out[NOUT - 1];                                                                     \
            EXPECT(SAME(o[j], X > Y ? (T)(2 * X) : (T)Y));                                         \
        }                                                                                          \
    } while (0)

/* f32 transcendental sweeps: float32 bit patterns [lo, hi] every step.  The
 * ranges and bounds are test_vmath's (which sweeps the C originals
 * exhaustively); here every 4999th pattern checks the gccjit port. */
typedef struct bits_range {
    uint32_t lo, hi, step;
} bits_range;
#define NEG 0x80000000u
#define STEP 4999u
#define SPARSE 99991u
#define TINY(sign)                                                                                 \
    { (sign) | 0x00000001u, (sign) | 0x39800000u, SPARSE }
typedef struct vcase {
    k_alu op;
    bits_range r[4];
    double max_ulp;
    double tail_x, tail_rel; /* below tail_x: relative error tail_rel */
} vcase;
static const vcase VCASES[] = {
    {KA_EXP,
     {{0x39800000u, 0x42d00000u, STEP}, {NEG | 0x39800000u, NEG | 0x42d00000u, STEP}},
     1.5,
     -INFINITY,
     0},
    {KA_LOG,
     {{0x3f000000u, 0x40000000u, STEP},
      {0x00000001u, 0x00800000u, STEP},
      {0x00800000u, 0x7f7fffffu, SPARSE}},
     1.5,
     -INFINITY,
     0},
    {KA_TANH,
     {{0x39800000u, 0x4111999au, STEP},
      {NEG | 0x39800000u, NEG | 0x4111999au, STEP},
      TINY(0),
      TINY(NEG)},
     2.5,
     -INFINITY,
     0},
    {KA_SIGMOID,
     {{0x39800000u, 0x41880000u, STEP}, {NEG | 0x39800000u, NEG | 0x42d00000u, STEP}},
     3,
     -INFINITY,
     0},
    {KA_ERF,
     {{0x39800000u, 0x40800000u, STEP},
      {NEG | 0x39800000u, NEG | 0x40800000u, STEP},
      TINY(0),
      TINY(NEG)},
     2,
     -INFINITY,
     0},
    {KA_GELU,
     {{0x39800000u, 0x41600000u, STEP},
      {NEG | 0x39800000u, NEG | 0x41600000u, STEP},
      TINY(0),
      TINY(NEG)},
     3.5,
     -1,
     4e-5},
    {KA_GELU_TANH,
     {{0x39800000u, 0x41600000u, STEP},
      {NEG | 0x39800000u, NEG | 0x41600000u, STEP},
      TINY(0),
      TINY(NEG)},
     4,
     -10,
     1e-6},
};
#define GELU_ZERO_X (-5.5)
#define GELU_ZERO_ABS 1.2e-7

static void sweep_f32(jit_cpu_kernel *ck, const vcase *vc) {
    int64_t n = 0;
    for (int r = 0; r < 4; r++)
        if (vc->r[r].step) n += (int64_t)((vc->r[r].hi - vc->r[r].lo) / vc->r[r].step) + 1;
    float *x = malloc(sizeof(float) * (size_t)n), *y = calloc((size_t)n, sizeof(float));
    int64_t m = 0;
    for (int r = 0; r < 4; r++)
        if (vc->r[r].step)
            for (uint64_t u = vc->r[r].lo; u <= vc->r[r].hi; u += vc->r[r].step)
                x[m++] = f_of((uint32_t)u);
    EXPECT(m == n);
    void *out[NOUT];
    run_alu(ck, sizeof(float), x, y, n, out);
    const float *o = out[uidx(vc->op)];
    double ref_err = 0, tail_err = 0;
    float worst_x = 0, worst_y = 0;
    for (int64_t j = 0; j < n; j++) {
        double r = UREF[uidx(vc->op)](x[j]), e;
        if (x[j] >= vc->tail_x) {
            e = ulp32(o[j], r);
            if (e > ref_err) ref_err = e, worst_x = x[j], worst_y = o[j];
        } else {
            double allow = x[j] < GELU_ZERO_X ? GELU_ZERO_ABS : vc->tail_rel * fabs(r);
            e = fabs((double)o[j] - r) / allow;
            if (!(e <= tail_err))
                tail_err = isnan(e) ? INFINITY : e, worst_x = x[j], worst_y = o[j];
        }
    }
    if (getenv("EMBER_GCCJIT_REPORT"))
        printf("%-10s %6lld inputs: max %.3f ulp, tail %.3f of its bound\n", kir_alu_name(vc->op),
               (long long)n, ref_err, tail_err);
    EXPECT_MSG(ref_err <= vc->max_ulp, "%s: %.3f ulp at x = %a (got %a)", kir_alu_name(vc->op),
               ref_err, (double)worst_x, (double)worst_y);
    EXPECT_MSG(tail_err <= 1.0, "%s tail: %.3f of bound at x = %a (got %a)", kir_alu_name(vc->op),
               tail_err, (double)worst_x, (double)worst_y);
    free_outs(out);
    free(x), free(y);
}

/* special values: every unary op against its double reference (exact for
 * non-finite results and zeros, within bounds otherwise) */
static const double SPECIAL[] = {INFINITY, -INFINITY, NAN,   0.0,    -0.0, 1.0,
                                 -1.0,     0.5,       100.0, -100.0, 1e30, -1e30,
                                 89.0,     -104.0,    1e-30, -1e-30, 20.0, -20.0};
#define NSPECIAL ((int)(sizeof SPECIAL / sizeof SPECIAL[0]))

START_TEST(alu_f32) {
    k_kernel *k = build_alu("alu_f32", EM_F32);
    jit_cpu_kernel *ck = compile_ok(k);
    /* transcendentals: dense sweeps */
    for (size_t c = 0; c < sizeof VCASES / sizeof VCASES[0]; c++) sweep_f32(ck, &VCASES[c]);
    /* everything else on random pairs (with specials mixed in) */
    enum { N = 20011 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    rng_state = 7;
    for (int j = 0; j < N; j++) {
        x[j] = (float)(j < NSPECIAL ? SPECIAL[j] : unif(-12, 12));
        y[j] = (float)(j % 7 == 0    ? x[j]
                       : j % 11 == 0 ? SPECIAL[(j / 11) % NSPECIAL]
                                     : unif(-12, 12));
    }
    void *out[NOUT];
    run_alu(ck, sizeof(float), x, y, N, out);
    CHECK_BASIC(float, same32, ulp32, x, y, N, out);
    /* sin, cos (libm sinf, cosf) */
    for (int j = 0; j < N; j++) {
        EXPECT_MSG(ulp32(((float *)out[uidx(KA_SIN)])[j], sin(x[j])) <= 1.5, "sin(%a)",
                   (double)x[j]);
        EXPECT_MSG(ulp32(((float *)out[uidx(KA_COS)])[j], cos(x[j])) <= 1.5, "cos(%a)",
                   (double)x[j]);
    }
    free_outs(out);
    /* special values through the transcendentals */
    float sx[NSPECIAL], sy[NSPECIAL] = {0};
    for (int j = 0; j < NSPECIAL; j++) sx[j] = (float)SPECIAL[j];
    run_alu(ck, sizeof(float), sx, sy, NSPECIAL, out);
    static const k_alu tr[] = {KA_EXP, KA_LOG, KA_TANH, KA_SIGMOID, KA_ERF, KA_GELU, KA_GELU_TANH};
    for (size_t t = 0; t < sizeof tr / sizeof tr[0]; t++) {
        int u = uidx(tr[t]);
        for (int j = 0; j < NSPECIAL; j++) {
            float got = ((float *)out[u])[j];
            double r = UREF[u](sx[j]);
            if (isnan(r) || isinf((float)r) || r == 0 || (tr[t] == KA_GELU && sx[j] < GELU_ZERO_X))
                EXPECT_MSG(
                    isnan(r) ? isnan(got) : (r == 0 ? fabsf(got) <= 1.2e-7f : got == (float)r),
                    "%s(%a) = %a, want %a", kir_alu_name(tr[t]), (double)sx[j], (double)got, r);
            else
                EXPECT_MSG(ulp32(got, r) <= 4, "%s(%a) = %a, want %a", kir_alu_name(tr[t]),
                           (double)sx[j], (double)got, r);
        }
    }
    /* signs kept: tanh(-0) = -0, erf(-0) = -0, exp(-inf) = +0 */
    EXPECT(signbit(((float *)out[uidx(KA_TANH)])[4]) && signbit(((float *)out[uidx(KA_ERF)])[4]));
    EXPECT(((float *)out[uidx(KA_EXP)])[1] == 0.0f && !signbit(((float *)out[uidx(KA_EXP)])[1]));
    free_outs(out);
    free(x), free(y);
    jit_cpu_free(ck);
    kir_free(k);
}
END_TEST

START_TEST(alu_f64) {
    k_kernel *k = build_alu("alu_f64", EM_F64);
    jit_cpu_kernel *ck = compile_ok(k);
    enum { N = 40009 };
    double *x = malloc(N * sizeof(double)), *y = malloc(N * sizeof(double));
    rng_state = 9;
    for (int j = 0; j < N; j++) {
        /* a dense grid over [-40, 40] for the unary ops, random y */
        x[j] = j < NSPECIAL ? SPECIAL[j] : -40.0 + 80.0 * j / N;
        y[j] = j % 7 == 0 ? x[j] : j % 11 == 0 ? SPECIAL[(j / 11) % NSPECIAL] : unif(-12, 12);
    }
    void *out[NOUT];
    run_alu(ck, sizeof(double), x, y, N, out);
    CHECK_BASIC(double, same64, ulp64, x, y, N, out);
    static const k_alu libm_ops[] = {KA_EXP,  KA_LOG, KA_SIN,     KA_COS,
                                     KA_TANH, KA_ERF, KA_SIGMOID, KA_GELU};
    for (size_t t = 0; t < sizeof libm_ops / sizeof libm_ops[0]; t++) {
        int u = uidx(libm_ops[t]);
        const double *o = out[u];
        for (int j = 0; j < N; j++)
            EXPECT_MSG(ulp64(o[j], UREF[u](x[j])) <= 1, "%s(%a) = %a, want %a",
                       kir_alu_name(libm_ops[t]), x[j], o[j], UREF[u](x[j]));
    }
    /* gelu_tanh: the same function through another formula: relative error
     * from exp's argument being rounded (amplified by |y| up to ~5000) */
    const double *o = out[uidx(KA_GELU_TANH)];
    for (int j = 0; j < N; j++) {
        double r = r_gelu_tanh(x[j]);
        bool ok = isnan(r)   ? isnan(o[j])
                  : isinf(r) ? o[j] == r
                             : fabs(o[j] - r) <= 1e-12 * fabs(r) + 1e-300;
        EXPECT_MSG(ok, "gelu_tanh(%a) = %a, want %a", x[j], o[j], r);
    }
    free_outs(out);
    free(x), free(y);
    jit_cpu_free(ck);
    kir_free(k);
}
END_TEST

/* ---- integer ops (i32 and i64 in one kernel) ---- */

static const k_alu IUN[] = {KA_NEG, KA_ABS, KA_RELU};
static const k_alu IBIN[] = {KA_ADD, KA_SUB, KA_MUL, KA_MAX, KA_MIN, KA_IDIV, KA_MOD};
enum { NIU = 3, NIB = 7, NIOUT = NIU + NIB + NC + 1 };

static int64_t r_int(k_alu op, int64_t a, int64_t b, bool i64) {
    uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
    int64_t r;
    switch (op) {
    case KA_NEG: r = (int64_t)(0 - ua); break;
    case KA_ABS: r = a < 0 ? (int64_t)(0 - ua) : a; break;
    case KA_RELU: r = a < 0 ? 0 : a; break;
    case KA_ADD: r = (int64_t)(ua + ub); break;
    case KA_SUB: r = (int64_t)(ua - ub); break;
    case KA_MUL: r = (int64_t)(ua * ub); break;
    case KA_MAX: r = a > b ? a : b; break;
    case KA_MIN: r = a < b ? a : b; break;
    case KA_IDIV: r = b == 0 ? a : a / b; break;
    case KA_MOD: r = b == 0 ? 0 : a % b; break;
    default: r = 0;
    }
    return i64 ? r : (int64_t)(int32_t)(uint32_t)(uint64_t)r;
}

static k_kernel *build_int(void) {
    k_kernel *k = kir_new("intops");
    int bx[2], by[2], out[2][NIOUT];
    for (int t = 0; t < 2; t++) {
        em_dtype d = t ? EM_I64 : EM_I32;
        bx[t] = kir_buf(k, d), by[t] = kir_buf(k, d);
        for (int o = 0; o < NIOUT; o++)
            out[t][o] = kir_buf(k, o >= NIU + NIB && o < NIU + NIB + NC ? EM_BOOL : d);
    }
    int n = kir_size(k);
    int i = kir_range(k, n, K_PARALLEL);
    for (int t = 0; t < 2; t++) {
        int x = kir_load(k, bx[t], i), y = kir_load(k, by[t], i);
        for (int u = 0; u < NIU; u++) kir_store(k, out[t][u], i, kir_alu(k, IUN[u], x, -1, -1));
        for (int b = 0; b < NIB; b++)
            kir_store(k, out[t][NIU + b], i, kir_alu(k, IBIN[b], x, y, -1));
        for (int c = 0; c < NC; c++)
            kir_store(k, out[t][NIU + NIB + c], i, kir_alu(k, (k_alu)(KA_EQ + c), x, y, -1));
        kir_store(k, out[t][NIOUT - 1], i, kir_alu(k, KA_WHERE, kir_alu(k, KA_LT, x, y, -1), y, x));
    }
    kir_end(k);
    ck_assert_int_eq(kir_verify(k), EM_OK);
    return k;
}

START_TEST(int_ops) {
    k_kernel *k = build_int();
    jit_cpu_kernel *ck = compile_ok(k);
    enum { N = 5003 };
    int32_t *x32 = malloc(N * 4), *y32 = malloc(N * 4);
    int64_t *x64 = malloc(N * 8), *y64 = malloc(N * 8);
    void *bufs[2 * (2 + NIOUT)];
    rng_state = 11;
    for (int j = 0; j < N; j++) {
        int64_t a = (int64_t)rng(), b = (int64_t)rng();
        if (j % 3 == 0) a = a % 1000, b = b % 50; /* small, signed */
        if (j % 3 == 1)
            a = (int64_t)((uint64_t)a >> 2), b = (int64_t)((uint64_t)b >> 40); /* non-negative */
        if (j % 13 == 0) b = 0;
        if (j == 1) a = INT64_MIN, b = -1;
        if (j == 2) a = INT64_MAX, b = 1;
        x64[j] = a, y64[j] = b;
        x32[j] = (int32_t)(uint32_t)(uint64_t)a, y32[j] = (int32_t)(uint32_t)(uint64_t)b;
        if (j == 4) x32[j] = INT32_MAX, y32[j] = 1;
        if (j == 5) x32[j] = INT32_MIN, y32[j] = -1;
    }
    int p = 0;
    for (int t = 0; t < 2; t++) {
        bufs[p++] = t ? (void *)x64 : (void *)x32;
        bufs[p++] = t ? (void *)y64 : (void *)y32;
        for (int o = 0; o < NIOUT; o++) bufs[p++] = calloc(N, 8);
    }
    int64_t n = N;
    ck_assert_int_eq(jit_cpu_run(ck, bufs, &n), EM_OK);
    for (int t = 0; t < 2; t++) {
        void **out = &bufs[t * (2 + NIOUT) + 2];
        for (int j = 0; j < N; j++) {
            int64_t a = t ? x64[j] : x32[j], b = t ? y64[j] : y32[j];
#define GET(o) (t ? ((int64_t *)out[o])[j] : (int64_t)((int32_t *)out[o])[j])
            for (int u = 0; u < NIU; u++)
                EXPECT_MSG(GET(u) == r_int(IUN[u], a, 0, t), "%s %s(%lld)", t ? "i64" : "i32",
                           kir_alu_name(IUN[u]), (long long)a);
            for (int b2 = 0; b2 < NIB; b2++) {
                bool nonneg = a >= 0 && b >= 0;
                if ((IBIN[b2] == KA_IDIV || IBIN[b2] == KA_MOD) && !nonneg)
                    continue; /* defined for indices */
                EXPECT_MSG(GET(NIU + b2) == r_int(IBIN[b2], a, b, t), "%s %s(%lld, %lld) = %lld",
                           t ? "i64" : "i32", kir_alu_name(IBIN[b2]), (long long)a, (long long)b,
                           (long long)GET(NIU + b2));
            }
            const uint8_t *c = out[NIU + NIB];
            EXPECT(c[j] == (a == b));
            EXPECT(((uint8_t *)out[NIU + NIB + 2])[j] == (a < b));
            EXPECT(((uint8_t *)out[NIU + NIB + 5])[j] == (a >= b));
            EXPECT(GET(NIOUT - 1) == (a < b ? b : a));
#undef GET
        }
    }
    for (int t = 0; t < 2; t++)
        for (int o = 0; o < NIOUT; o++) free(bufs[t * (2 + NIOUT) + 2 + o]);
    free(x32), free(y32), free(x64), free(y64);
    jit_cpu_free(ck);
    kir_free(k);
}
END_TEST

/* ---- 2-D index arithmetic: strided rows, broadcast, a transposed read ----
 * out[i*C + j] = a[i*lda + j] * b[j] + c[i];  outT[i*C + j] = t[j*R + i] */

static k_kernel *build_2d(void) {
    k_kernel *k = kir_new("strided2d");
    int a = kir_buf(k, EM_F32), b = kir_buf(k, EM_F32), c = kir_buf(k, EM_F32),
        t = kir_buf(k, EM_F32);
    int out = kir_buf(k, EM_F32), outT = kir_buf(k, EM_F32);
    int R = kir_size(k), C = kir_size(k), lda = kir_size(k);
    int i = kir_range(k, R, K_PARALLEL);
    int arow = kir_alu(k, KA_MUL, i, lda, -1), orow = kir_alu(k, KA_MUL, i, C, -1);
    int ci = kir_load(k, c, i);
    int j = kir_range(k, C, 0);
    int av = kir_load(k, a, kir_alu(k, KA_ADD, arow, j, -1));
    int v = kir_alu(k, KA_ADD, kir_alu(k, KA_MUL, av, kir_load(k, b, j), -1), ci, -1);
    int oi = kir_alu(k, KA_ADD, orow, j, -1);
    kir_store(k, out, oi, v);
    kir_store(k, outT, oi, kir_load(k, t, kir_alu(k, KA_ADD, kir_alu(k, KA_MUL, j, R, -1), i, -1)));
    kir_end(k);
    kir_end(k);
    ck_assert_int_eq(kir_verify(k), EM_OK);
    return k;
}

START_TEST(strided_2d_and_threads) {
    k_kernel *k = build_2d();
    jit_cpu_kernel *ck = compile_ok(k);
    static const int64_t shapes[][2] = {{1, 1}, {3, 7}, {5, 1000}, {1000, 3}, {2000, 130}};
    rng_state = 5;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t R = shapes[s][0], C = shapes[s][1], lda = C + 3;
        size_t na = (size_t)(R * lda), nrc = (size_t)(R * C);
        float *a = malloc(na * 4), *b = malloc((size_t)C * 4), *c = malloc((size_t)R * 4),
              *t = malloc(nrc * 4);
        for (size_t q = 0; q < na; q++) a[q] = (float)unif(-4, 4);
        for (int64_t q = 0; q < C; q++) b[q] = (float)unif(-4, 4);
        for (int64_t q = 0; q < R; q++) c[q] = (float)unif(-4, 4);
        for (size_t q = 0; q < nrc; q++) t[q] = (float)unif(-4, 4);
        int64_t sizes[3] = {R, C, lda};
        float *res[4][2];
        for (int run = 0; run < 4; run++) {
            res[run][0] = malloc(nrc * 4), res[run][1] = malloc(nrc * 4);
            void *bufs[6] = {a, b, c, t, res[run][0], res[run][1]};
            /* jit_cpu_run, then the parallel range cut into 1, 2 and 7 pieces */
            static const int pieces[4] = {0, 1, 2, 7};
            em_status st = run == 0 ? jit_cpu_run(ck, bufs, sizes)
                                    : jit_cpu_run_chunks(ck, bufs, sizes, pieces[run]);
            ck_assert_int_eq(st, EM_OK);
        }
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < C; j++) {
                int64_t q = i * C + j;
                /* the kernel may contract a*b + c into an fma */
                double exact = (double)a[i * lda + j] * b[j] + c[i];
                EXPECT_MSG(fabs(res[0][0][q] - exact) <= 2 * FLT_EPSILON * (fabs(exact) + 16),
                           "out[%lld][%lld]", (long long)i, (long long)j);
                EXPECT(res[0][1][q] == t[j * R + i]);
            }
        for (int run = 1; run < 4; run++) {
            EXPECT(memcmp(res[run][0], res[0][0], nrc * 4) == 0);
            EXPECT(memcmp(res[run][1], res[0][1], nrc * 4) == 0);
        }
        for (int run = 0; run < 4; run++) free(res[run][0]), free(res[run][1]);
        free(a), free(b), free(c), free(t);
    }
    jit_cpu_free(ck);
    kir_free(k);
}
END_TEST

/* ---- softmax over rows: max and sum accumulators, then normalization ---- */

static k_kernel *build_softmax(void) {
    k_kernel *k = kir_new("softmax_rows");
    int in = kir_buf(k, EM_F32), out = kir_buf(k, EM_F32), rmax = kir_buf(k, EM_F32),
        rsum = kir_buf(k, EM_F32);
    int R = kir_size(k), C = kir_size(k);
    int ninf = kir_const_f(k, EM_F32, -INFINITY), zero = kir_const_f(k, EM_F32, 0.0);
    int i = kir_range(k, R, K_PARALLEL);
    int base = kir_alu(k, KA_MUL, i, C, -1);
    int m = kir_acc(k, KA_MAX, ninf);
    int j = kir_range(k, C, 0);
    kir_acc_update(k, m, kir_load(k, in, kir_alu(k, KA_ADD, base, j, -1)));
    kir_end(k);
    int s = kir_acc(k, KA_ADD, zero);
    j = kir_range(k, C, 0);
    int idx = kir_alu(k, KA_ADD, base, j, -1);
    int e = kir_alu(k, KA_EXP, kir_alu(k, KA_SUB, kir_load(k, in, idx), m, -1), -1, -1);
    kir_store(k, out, idx, e);
    kir_acc_update(k, s, e);
    kir_end(k);
    j = kir_range(k, C, 0);
    idx = kir_alu(k, KA_ADD, base, j, -1);
    kir_store(k, out, idx, kir_alu(k, KA_DIV, kir_load(k, out, idx), s, -1));
    kir_end(k);
    kir_store(k, rmax, i, m);
    kir_store(k, rsum, i, s);
    kir_end(k);
    ck_assert_int_eq(kir_verify(k), EM_OK);
    return k;
}

START_TEST(softmax_rows) {
    k_kernel *k = build_softmax();
    jit_cpu_kernel *ck = compile_ok(k);
    static const int64_t cols[] = {1, 3, 15, 16, 17, 33, 1000};
    static const int64_t rows[] = {1, 6};
    rng_state = 3;
    for (size_t ci = 0; ci < sizeof cols / sizeof cols[0]; ci++)
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
            int64_t R = rows[ri], C = cols[ci];
            size_t n = (size_t)(R * C);
            float *x = malloc(n * 4), *y = malloc(n * 4), *mx = malloc((size_t)R * 4),
                  *sm = malloc((size_t)R * 4);
            for (size_t q = 0; q < n; q++) x[q] = (float)unif(-20, 20);
            if (R > 1) {
                x[1 * C + C / 2] = NAN; /* row 1: NaN propagates */
                for (int64_t j = 0; j < C; j++) x[2 * C + j] = -INFINITY; /* row 2: all -inf */
                x[3 * C + C - 1] = INFINITY; /* row 3: +inf in the last column */
                x[4 * C] = 80.0f;            /* row 4: a large value first */
            }
            void *bufs[4] = {x, y, mx, sm};
            int64_t sizes[2] = {R, C};
            ck_assert_int_eq(jit_cpu_run(ck, bufs, sizes), EM_OK);
            for (int64_t i = 0; i < R; i++) {
                double m = -INFINITY, s = 0;
                for (int64_t j = 0; j < C; j++) m = r_max(m, x[i * C + j]);
                EXPECT_MSG(same32(mx[i], (float)m), "C=%lld row %lld: max %a, want %a",
                           (long long)C, (long long)i, (double)mx[i], m);
                for (int64_t j = 0; j < C; j++) s += exp((double)x[i * C + j] - m);
                EXPECT_MSG(isnan(s) ? isnan(sm[i]) : fabs(sm[i] - s) <= 1e-5 * s,
                           "C=%lld row %lld: sum %a, want %a", (long long)C, (long long)i,
                           (double)sm[i], s);
                for (int64_t j = 0; j < C; j++) {
                    double r = exp((double)x[i * C + j] - m) / s;
                    float got = y[i * C + j];
                    EXPECT_MSG(isnan(r) ? isnan(got) : fabs(got - r) <= 1e-5 * r + 1e-37,
                               "C=%lld softmax[%lld][%lld] = %a, want %a", (long long)C,
                               (long long)i, (long long)j, (double)got, r);
                }
            }
            free(x), free(y), free(mx), free(sm);
        }
    jit_cpu_free(ck);
    kir_free(k);
}
END_TEST

/* ---- row reductions of every accumulator kind ----
 * per row: sum f64, max f64, min f32, sum i32 (wraps), max i64, min i32,
 * any (bool max), all (bool min), and a float sum read inside its loop
 * (a running prefix sum stored per element: in-order accumulation) */

enum { RD_SUM64, RD_MAX64, RD_MIN32, RD_SUMI32, RD_MAXI64, RD_MINI32, RD_ANY, RD_ALL, RD_N };

static k_kernel *build_reduce(void) {
    static const em_dtype od[RD_N] = {EM_F64, EM_F64, EM_F32,  EM_I32,
                                      EM_I64, EM_I32, EM_BOOL, EM_BOOL};
    static const k_alu op[RD_N] = {KA_ADD, KA_MAX, KA_MIN, KA_ADD, KA_MAX, KA_MIN, KA_MAX, KA_MIN};
    k_kernel *k = kir_new("reduce_rows");
    int xd = kir_buf(k, EM_F64), xf = kir_buf(k, EM_F32), xi = kir_buf(k, EM_I32),
        xl = kir_buf(k, EM_I64);
    int xb = kir_buf(k, EM_BOOL), pre = kir_buf(k, EM_F32), out[RD_N];
    for (int o = 0; o < RD_N; o++) out[o] = kir_buf(k, od[o]);
    int R = kir_size(k), C = kir_size(k);
    int init[RD_N] = {kir_const_f(k, EM_F64, 0.0),       kir_const_f(k, EM_F64, -INFINITY),
                      kir_const_f(k, EM_F32, INFINITY),  kir_const_i(k, EM_I32, 0),
                      kir_const_i(k, EM_I64, INT64_MIN), kir_const_i(k, EM_I32, INT32_MAX),
                      kir_const_i(k, EM_BOOL, 0),        kir_const_i(k, EM_BOOL, 1)};
    int fz = kir_const_f(k, EM_F32, 0.0);
    int i = kir_range(k, R, K_PARALLEL);
    int base = kir_alu(k, KA_MUL, i, C, -1);
    int acc[RD_N];
    for (int o = 0; o < RD_N; o++) acc[o] = kir_acc(k, op[o], init[o]);
    int run = kir_acc(k, KA_ADD, fz);
    int j = kir_range(k, C, 0);
    int idx = kir_alu(k, KA_ADD, base, j, -1);
    int vd = kir_load(k, xd, idx), vf = kir_load(k, xf, idx), vi = kir_load(k, xi, idx);
    int vl = kir_load(k, xl, idx), vb = kir_load(k, xb, idx);
    int src[RD_N] = {vd, vd, vf, vi, vl, vi, vb, vb};
    for (int o = 0; o < RD_N; o++) kir_acc_update(k, acc[o], src[o]);
    kir_acc_update(k, run, vf);
    kir_store(k, pre, idx, run);
    kir_end(k);
    for (int o = 0; o < RD_N; o++) kir_store(k, out[o], i, acc[o]);
    kir_end(k);
    ck_assert_int_eq(kir_verify(k), EM_OK);
    return k;
}

START_TEST(row_reductions) {
    k_kernel *k = build_reduce();
    jit_cpu_kernel *ck = compile_ok(k);
    static const int64_t cols[] = {1, 3, 17, 1000};
    enum { R = 5 };
    rng_state = 13;
    for (size_t ci = 0; ci < sizeof cols / sizeof cols[0]; ci++) {
        int64_t C = cols[ci];
        size_t n = (size_t)(R * C);
        double *xd = malloc(n * 8);
        float *xf = malloc(n * 4), *pre = malloc(n * 4);
        int32_t *xi = malloc(n * 4);
        int64_t *xl = malloc(n * 8);
        uint8_t *xb = malloc(n);
        for (size_t q = 0; q < n; q++) {
            xd[q] = unif(-100, 100), xf[q] = (float)unif(-100, 100);
            xi[q] = (int32_t)(uint32_t)rng(), xl[q] = (int64_t)rng(), xb[q] = (rng() & 7) == 0;
        }
        xd[1 * C] = NAN, xf[2 * C + C - 1] = NAN;                             /* NaN rows */
        for (int64_t j = 0; j < C; j++) xb[3 * C + j] = 0, xb[4 * C + j] = 1; /* none, all */
        void *bufs[6 + RD_N] = {xd, xf, xi, xl, xb, pre};
        for (int o = 0; o < RD_N; o++) bufs[6 + o] = calloc(R, 8);
        int64_t sizes[2] = {R, C};
        ck_assert_int_eq(jit_cpu_run(ck, bufs, sizes), EM_OK);
        for (int64_t i = 0; i < R; i++) {
            double sd = 0, md = -INFINITY, mf = INFINITY;
            uint32_t si = 0;
            int64_t ml = INT64_MIN;
            int32_t mi = INT32_MAX;
            int any = 0, all = 1;
            float run = 0;
            for (int64_t j = 0; j < C; j++) {
                size_t q = (size_t)(i * C + j);
                sd += xd[q], md = r_max(md, xd[q]), mf = r_min(mf, xf[q]);
                si += (uint32_t)xi[q], ml = xl[q] > ml ? xl[q] : ml, mi = xi[q] < mi ? xi[q] : mi;
                any |= xb[q], all &= xb[q];
                run += xf[q];
                EXPECT_MSG(same32(pre[q], run), "C=%lld running sum [%lld][%lld]", (long long)C,
                           (long long)i, (long long)j);
            }
            double gsd = ((double *)bufs[6 + RD_SUM64])[i];
            EXPECT_MSG(isnan(sd) ? isnan(gsd) : fabs(gsd - sd) <= 1e-13 * C * 100,
                       "sum f64 row %lld", (long long)i);
            EXPECT(same64(((double *)bufs[6 + RD_MAX64])[i], md));
            EXPECT_MSG(same32(((float *)bufs[6 + RD_MIN32])[i], (float)mf),
                       "min f32 row %lld: %a want %a", (long long)i,
                       (double)((float *)bufs[6 + RD_MIN32])[i], mf);
            EXPECT(((int32_t *)bufs[6 + RD_SUMI32])[i] == (int32_t)si);
            EXPECT(((int64_t *)bufs[6 + RD_MAXI64])[i] == ml);
            EXPECT(((int32_t *)bufs[6 + RD_MINI32])[i] == mi);
            EXPECT(((uint8_t *)bufs[6 + RD_ANY])[i] == any);
            EXPECT(((uint8_t *)bufs[6 + RD_ALL])[i] == all);
        }
        for (int o = 0; o < RD_N; o++) free(bufs[6 + o]);
        free(xd), free(xf), free(pre), free(xi), free(xl), free(xb);
    }
    jit_cpu_free(ck);
    kir_free(k);
}
END_TEST

/* ---- a whole-array sum (accumulator outside the parallel range: the
 * kernel runs as one call) through write_so + load_so ---- */

/* y[i] = tanh(x[i] c) (+ exp(x[i]) with plus_exp) over a size parameter:
 * kernels that call vmath's functions, which a compile unit makes once. */
static k_kernel *unit_pointwise(double c, bool plus_exp) {
    k_kernel *k = kir_new("k");
    int x = kir_buf(k, EM_F32), y = kir_buf(k, EM_F32), n = kir_size(k);
    int i = kir_range(k, n, K_PARALLEL);
    int v = kir_load(k, x, i);
    int t = kir_alu(k, KA_TANH, kir_alu(k, KA_MUL, v, kir_const_f(k, EM_F32, c), -1), -1, -1);
    if (plus_exp) t = kir_alu(k, KA_ADD, t, kir_alu(k, KA_EXP, v, -1, -1), -1);
    kir_store(k, y, i, t);
    kir_end(k);
    return k;
}

/* Runs the kernel filed under key in the object at path on x[0..n) and
 * checks y against want(x) in float64. */
static void unit_run(const char *path, const k_kernel *k, double c, bool plus_exp) {
    kc_key key;
    ck_assert(jit_cpu_kernel_key(k, &key, NULL));
    int fd = open(path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    jit_cpu_kernel *ck = NULL;
    ck_assert_msg(jit_cpu_load_fd(fd, &key, &ck) == EM_OK, "%s", em_last_error());
    close(fd);
    static const int64_t sizes[] = {0, 1, 37, 1000};
    for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
        int64_t n = sizes[t];
        float x[1000], y[1000];
        for (int64_t j = 0; j < n; j++) x[j] = (float)unif(-3, 3), y[j] = NAN;
        void *bufs[2] = {x, y};
        ck_assert_int_eq(jit_cpu_run(ck, bufs, &n), EM_OK);
        for (int64_t j = 0; j < n; j++) {
            double want = tanh((double)x[j] * (double)(float)c) + (plus_exp ? exp((double)x[j]) : 0);
            EXPECT_MSG(fabs(y[j] - want) <= 1e-5 * fabs(want) + 1e-6, "n=%lld [%lld]: %a, want %a",
                       (long long)n, (long long)j, (double)y[j], want);
        }
    }
    jit_cpu_free(ck);
}

START_TEST(units_hold_several_kernels) {
    rng_state = 11;
    k_kernel *ks[4] = {unit_pointwise(0.5, false), unit_pointwise(2.0, false), unit_pointwise(0.5, true),
                       unit_pointwise(3.0, true)};
    char dir[] = "/tmp/ember_gccjit_XXXXXX", path[64], one[64];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/unit.so", dir);
    snprintf(one, sizeof one, "%s/one.so", dir);
    /* three kernels in one object, each found by its key */
    ck_assert_msg(jit_cpu_write_unit(ks, 3, path) == EM_OK, "%s", em_last_error());
    unit_run(path, ks[0], 0.5, false);
    unit_run(path, ks[1], 2.0, false);
    unit_run(path, ks[2], 0.5, true);
    /* a key the unit does not hold is refused, not another kernel run */
    kc_key other;
    ck_assert(jit_cpu_kernel_key(ks[3], &other, NULL));
    int fd = open(path, O_RDONLY);
    jit_cpu_kernel *ck = NULL;
    ck_assert_int_ne(jit_cpu_load_fd(fd, &other, &ck), EM_OK);
    ck_assert_ptr_null(ck);
    em_clear_error();
    close(fd);
    /* a unit of one */
    ck_assert_int_eq(jit_cpu_write_unit(ks + 3, 1, one), EM_OK);
    unit_run(one, ks[3], 3.0, true);
    /* bad arguments, and a bad kernel fails the whole unit */
    ck_assert_int_eq(jit_cpu_write_unit(ks, 0, path), EM_ERR_ARG);
    em_clear_error();
    ck_assert_int_eq(jit_cpu_write_unit(ks, JIT_CPU_UNIT_MAX + 1, path), EM_ERR_ARG);
    em_clear_error();
    ck_assert_int_eq(jit_cpu_write_unit(ks, 2, NULL), EM_ERR_NULL);
    em_clear_error();
    ck_assert_int_eq(jit_cpu_write_unit(NULL, 2, path), EM_ERR_NULL);
    em_clear_error();
    k_kernel *broken = kir_new("k");
    kir_range(broken, kir_const_i(broken, EM_I64, 4), 0); /* never ended */
    k_kernel *mixed[2] = {ks[0], broken};
    ck_assert_int_eq(jit_cpu_write_unit(mixed, 2, one), EM_ERR_ARG);
    em_clear_error();
    kir_free(broken);
    unlink(path);
    unlink(one);
    rmdir(dir);
    for (int i = 0; i < 4; i++) kir_free(ks[i]);
}
END_TEST

START_TEST(so_round_trip) {
    k_kernel *k = kir_new("total_sum");
    int x = kir_buf(k, EM_F32), out = kir_buf(k, EM_F32), n = kir_size(k);
    int s = kir_acc(k, KA_ADD, kir_const_f(k, EM_F32, 0.0));
    int i = kir_range(k, n, K_PARALLEL);
    kir_acc_update(k, s, kir_load(k, x, i));
    kir_end(k);
    kir_store(k, out, kir_const_i(k, EM_I64, 0), s);
    ck_assert_int_eq(kir_verify(k), EM_OK);
    char dir[] = "/tmp/ember_gccjit_XXXXXX", path[64];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/k.so", dir);
    ck_assert_int_eq(jit_cpu_write_so(k, path), EM_OK);
    jit_cpu_kernel *ck = NULL;
    ck_assert_int_eq(jit_cpu_load_so(path, "total_sum", &ck), EM_OK);
    /* a wrong name is an error, not a crash */
    jit_cpu_kernel *bad = NULL;
    ck_assert_int_eq(jit_cpu_load_so(path, "no_such_kernel", &bad), EM_ERR_ARG);
    ck_assert_ptr_null(bad);
    unlink(path);
    rmdir(dir);
    static const int64_t lens[] = {0, 1, 7, 100003};
    for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++) {
        int64_t N = lens[t];
        float *v = malloc((size_t)(N ? N : 1) * 4), r[3] = {-1, -1, -1};
        double ref = 0;
        for (int64_t q = 0; q < N; q++) v[q] = (float)(q % 17) * 0.25f, ref += v[q];
        void *bufs[2] = {v, &r[0]};
        ck_assert_int_eq(jit_cpu_run(ck, bufs, &N), EM_OK);
        bufs[1] = &r[1];
        ck_assert_int_eq(jit_cpu_run_chunks(ck, bufs, &N, 7), EM_OK); /* still one call */
        EXPECT_MSG(fabs(r[0] - ref) <= 1e-6 * ref, "sum of %lld: %g, want %g", (long long)N, r[0],
                   ref);
        EXPECT(r[1] == r[0]);
        free(v);
    }
    jit_cpu_free(ck);
    kir_free(k);
}
END_TEST

/* ---- invalid input: errors, no crash ---- */

static void expect_compile_fails(k_kernel *k, em_status want) {
    jit_cpu_kernel *ck = (jit_cpu_kernel *)&ck; /* must be reset to NULL */
    em_clear_error();
    em_status s = jit_cpu_compile(k, &ck);
    EXPECT_MSG(s == want, "%s: %s (%s), want %s", k ? k->name : "NULL", em_status_name(s),
               em_last_error(), em_status_name(want));
    ck_assert_ptr_null(ck);
    EXPECT(em_last_error()[0] != '\0');
}

START_TEST(invalid_ir) {
    /* unclosed range */
    k_kernel *k = kir_new("unclosed");
    int n = kir_size(k);
    kir_range(k, n, 0);
    expect_compile_fails(k, EM_ERR_ARG);
    ck_assert_int_eq(jit_cpu_write_so(k, "/tmp/never.so"), EM_ERR_ARG);
    kir_free(k);
    /* a value used after its loop ended */
    k = kir_new("dead_value");
    int b = kir_buf(k, EM_F32);
    n = kir_size(k);
    int i = kir_range(k, n, 0);
    int v = kir_load(k, b, i);
    kir_end(k);
    kir_store(k, b, kir_const_i(k, EM_I64, 0), v);
    expect_compile_fails(k, EM_ERR_ARG);
    /* hand-corrupted instructions */
    k->insts[v].nsrc = 7;
    expect_compile_fails(k, EM_ERR_ARG);
    k->insts[v].nsrc = 2;
    k->insts[v].src[1] = 1000;
    expect_compile_fails(k, EM_ERR_ARG);
    k->insts[v].src[1] = i;
    k->insts[v].op = (k_opcode)99;
    expect_compile_fails(k, EM_ERR_ARG);
    kir_free(k);
    /* store of a mismatched dtype; buffer number out of range; bad name */
    k = kir_new("bad_store");
    b = kir_buf(k, EM_F32);
    kir_store(k, b, kir_const_i(k, EM_I64, 0), kir_const_f(k, EM_F64, 1.0));
    expect_compile_fails(k, EM_ERR_ARG);
    kir_free(k);
    k = kir_new("bad_buf");
    b = kir_buf(k, EM_F32);
    kir_store(k, b, kir_const_i(k, EM_I64, 0), kir_const_f(k, EM_F32, 1.0));
    k->insts[b].ival = 3;
    expect_compile_fails(k, EM_ERR_ARG);
    k->insts[b].ival = 0;
    k->name[3] = '-'; /* "bad-buf" */
    expect_compile_fails(k, EM_ERR_ARG);
    kir_free(k);
    /* an op on a dtype the IR does not give it (kir_verify's rule, the
     * same for every backend) */
    k = kir_new("float_mod");
    b = kir_buf(k, EM_F32);
    int c = kir_const_f(k, EM_F32, 2.0);
    kir_store(k, b, kir_const_i(k, EM_I64, 0), kir_alu(k, KA_MOD, c, c, -1));
    expect_compile_fails(k, EM_ERR_ARG);
    EXPECT(strstr(em_last_error(), "instruction %2 (mod)") != NULL);
    kir_free(k);
    /* valid IR the generator does not support: arithmetic in f16 (the
     * lowering computes half values in f32) */
    k = kir_new("half");
    b = kir_buf(k, EM_F16);
    int h = kir_load(k, b, kir_const_i(k, EM_I64, 0));
    kir_store(k, b, kir_const_i(k, EM_I64, 0), kir_alu(k, KA_MUL, h, h, -1));
    expect_compile_fails(k, EM_ERR_UNSUPPORTED);
    EXPECT_MSG(strstr(em_last_error(), "instruction %3 computes in f16") != NULL, "%s", em_last_error());
    kir_free(k);
    /* NULL arguments */
    expect_compile_fails(NULL, EM_ERR_NULL);
    ck_assert_int_eq(jit_cpu_compile(NULL, NULL), EM_ERR_NULL);
    ck_assert_int_eq(jit_cpu_run(NULL, NULL, NULL), EM_ERR_NULL);
    jit_cpu_kernel *ck = NULL;
    ck_assert_int_eq(jit_cpu_load_so("/nonexistent/k.so", "k", &ck), EM_ERR_ARG);
    ck_assert_ptr_null(ck);
    em_clear_error(); /* a NULL argument keeps a pending error */
    ck_assert_int_eq(jit_cpu_load_so(NULL, "k", &ck), EM_ERR_NULL);
    jit_cpu_free(NULL);
}
END_TEST

/* A compile that libgccjit itself fails (the output file cannot be written)
 * reports libgccjit's message. */
START_TEST(compile_error_message) {
    k_kernel *k = kir_new("tiny");
    int b = kir_buf(k, EM_I32);
    kir_store(k, b, kir_const_i(k, EM_I64, 0), kir_const_i(k, EM_I32, 5));
    em_clear_error();
    ck_assert_int_eq(jit_cpu_write_so(k, "/nonexistent_dir_for_ember/k.so"), EM_ERR_STATE);
    EXPECT_MSG(strstr(em_last_error(), "tiny") != NULL, "%s", em_last_error());
    EXPECT_MSG(strlen(em_last_error()) > 40, "%s", em_last_error());
    kir_free(k);
}
END_TEST

/* ---- the half types: conversions (loads, stores and casts only) ---- */

/* x rounded to a format with p significant bits, least normal 2^emin and
 * largest finite max, to nearest even (exact in double): the reference. */
static double r_round(double x, int p, int emin, double max) {
    if (x != x || isinf(x) || x == 0) return x;
    int e;
    frexp(fabs(x), &e); /* |x| in [2^(e-1), 2^e) */
    int q = (e - 1 < emin ? emin : e - 1) - (p - 1); /* the ulp's exponent */
    double r = ldexp(rint(ldexp(x, -q)), q);
    return fabs(r) > max ? copysign(INFINITY, x) : r;
}

static k_kernel *build_half(void) {
    k_kernel *k = kir_new("half");
    int x = kir_buf(k, EM_F32), h = kir_buf(k, EM_F16), b = kir_buf(k, EM_BF16), d = kir_buf(k, EM_F64);
    int oh = kir_buf(k, EM_F16), ob = kir_buf(k, EM_BF16), hf = kir_buf(k, EM_F32), bf = kir_buf(k, EM_F32);
    int sum = kir_buf(k, EM_F16), db = kir_buf(k, EM_BF16), bi = kir_buf(k, EM_I32);
    int i = kir_range(k, kir_size(k), K_PARALLEL);
    int xv = kir_load(k, x, i);
    kir_store(k, oh, i, kir_cast(k, xv, EM_F16));
    kir_store(k, ob, i, kir_cast(k, xv, EM_BF16));
    int hv = kir_cast(k, kir_load(k, h, i), EM_F32), bv = kir_cast(k, kir_load(k, b, i), EM_F32);
    kir_store(k, hf, i, hv);
    kir_store(k, bf, i, bv);
    /* f16 + f16 as the lowering computes it: in f32, rounded once */
    kir_store(k, sum, i, kir_cast(k, kir_alu(k, KA_ADD, hv, hv, -1), EM_F16));
    kir_store(k, db, i, kir_cast(k, kir_load(k, d, i), EM_BF16)); /* through f32 */
    kir_store(k, bi, i, kir_convert(k, bv, EM_I32));
    kir_end(k);
    ck_assert_int_eq(kir_verify(k), EM_OK);
    return k;
}

/* decoded half bits h (dtype d) equal the reference r: the same value and
 * sign, or both NaN */
static bool half_is(uint16_t h, em_dtype d, double r) {
    double v = tu_decode((const unsigned char *)&h, d);
    return (v != v && r != r) || (v == r && signbit(v) == signbit(r));
}

START_TEST(half_conversions) {
    enum { N = 4096 };
    static const float special[] = {
        0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f,
        -65520.0f, 0x1p-14f, 0x1p-24f, 0x1p-25f, 3 * 0x1p-25f, 0x1.8p-24f, 0x1p-26f,
        1 + 0x1p-11f, 1 + 3 * 0x1p-11f,  /* f16 ties: to 1, to 1 + 2^-9 */
        1 + 0x1p-8f, 1 + 3 * 0x1p-8f,    /* bf16 ties: to 1, to 1 + 2^-6 */
        0x1.fffffep127f, 0x1.fep127f, 0x1.ffp127f, 0x1p-126f, 0x1p-133f, 0x1p-149f, 0x1.8p-133f};
    int ns = (int)(sizeof special / sizeof *special);
    float *x = malloc(N * sizeof *x), *hf = malloc(N * sizeof *hf), *bf = malloc(N * sizeof *bf);
    double *d = malloc(N * sizeof *d);
    uint16_t *h = malloc(N * 2), *b = malloc(N * 2), *oh = malloc(N * 2), *ob = malloc(N * 2);
    uint16_t *sum = malloc(N * 2), *db = malloc(N * 2);
    int32_t *bi = malloc(N * sizeof *bi);
    rng_state = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < N; i++) {
        x[i] = i < ns ? special[i] : (float)ldexp(unif(-1, 1), (int)(rng() % 80) - 40);
        h[i] = (uint16_t)(i < 65536 ? rng() : 0); /* every kind of f16: NaNs, subnormals */
        b[i] = (uint16_t)rng();
        d[i] = i < ns ? (double)special[i] : ldexp(unif(-1, 1), (int)(rng() % 300) - 150);
    }
    h[0] = 0x0001, h[1] = 0x03ff, h[2] = 0x7c00, h[3] = 0xfc00, h[4] = 0x7e01, h[5] = 0x8000;
    k_kernel *k = build_half();
    jit_cpu_kernel *ck = compile_ok(k);
    void *bufs[] = {x, h, b, d, oh, ob, hf, bf, sum, db, bi};
    int64_t n = N;
    ck_assert_int_eq(jit_cpu_run(ck, bufs, &n), EM_OK);
    for (int i = 0; i < N; i++) {
        EXPECT_MSG(half_is(oh[i], EM_F16, r_round(x[i], 11, -14, 65504)), "f32 %a -> f16 %#x", x[i], oh[i]);
        EXPECT_MSG(half_is(ob[i], EM_BF16, r_round(x[i], 8, -126, 0x1.fep127)), "f32 %a -> bf16 %#x",
                   x[i], ob[i]);
        double hv = tu_decode((const unsigned char *)&h[i], EM_F16);
        double bv = tu_decode((const unsigned char *)&b[i], EM_BF16);
        EXPECT_MSG((hv != hv && hf[i] != hf[i]) || hf[i] == hv, "f16 %#x -> %a", h[i], hf[i]);
        EXPECT_MSG((bv != bv && bf[i] != bf[i]) || bf[i] == bv, "bf16 %#x -> %a", b[i], bf[i]);
        EXPECT_MSG(half_is(sum[i], EM_F16, r_round(2 * hv, 11, -14, 65504)), "f16 %#x x 2 -> %#x",
                   h[i], sum[i]);
        EXPECT_MSG(half_is(db[i], EM_BF16, r_round((float)d[i], 8, -126, 0x1.fep127)), "f64 %a -> bf16 %#x",
                   d[i], db[i]);
        EXPECT_MSG(bi[i] == (int32_t)r_f2i(bv, false), "bf16 %#x -> i32 %d", b[i], bi[i]);
    }
    /* a NaN converts to a quiet NaN of the format, never to an infinity */
    EXPECT((oh[4] & 0x7c00) == 0x7c00 && (oh[4] & 0x0200) && (ob[4] & 0x7f80) == 0x7f80 && (ob[4] & 0x40));
    jit_cpu_free(ck);
    kir_free(k);
    free(x), free(hf), free(bf), free(d), free(h), free(b), free(oh), free(ob), free(sum), free(db), free(bi);
}
END_TEST

/* libgccjit compiles take seconds under valgrind: long timeouts. */
static TCase *tcase(Suite *s, const char *name) {
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, 600);
    suite_add_tcase(s, tc);
    return tc;
}

static Suite *suite(void) {
    Suite *s = suite_create("gccjit");
    TCase *tc = tcase(s, "pointwise");
    tcase_add_test(tc, pointwise_lengths);
    tc = tcase(s, "alu");
    tcase_add_test(tc, alu_f32);
    tcase_add_test(tc, alu_f64);
    tcase_add_test(tc, int_ops);
    tcase_add_test(tc, half_conversions);
    tc = tcase(s, "loops");
    tcase_add_test(tc, strided_2d_and_threads);
    tcase_add_test(tc, softmax_rows);
    tcase_add_test(tc, row_reductions);
    tc = tcase(s, "shared_object");
    tcase_add_test(tc, so_round_trip);
    tcase_add_test(tc, units_hold_several_kernels);
    tc = tcase(s, "errors");
    tcase_add_test(tc, invalid_ir);
    tcase_add_test(tc, compile_error_message);
    return s;
}

int main(void) { return tu_run(suite()); }
