/* test_pointwise.c - pointwise ops: unary math, binary arithmetic with
 * broadcasting and promotion, scalar forms, comparisons, where, cast and
 * contiguous.
 *
 * Results are read back raw (em_copy_to_host, decoded here, so that these
 * tests do not lean on em_cast to check em_cast) and compared with float64
 * references computed here with libm. */
#include "testutil.h"

#include <float.h>
#include <stdio.h>
#include <string.h>

/* ---- Reading values independently of em_cast ---- */

#define decode tu_decode
#define rd tu_raw_values

static int64_t numel_of(int ndim, const int64_t *sizes) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= sizes[i];
    return n;
}

/* Asserts t has dtype dt, sizes (ndim, sizes) and values within
 * atol + rtol*|ref| (NaN meets NaN; inf the same inf). */
static void chk_at(int line, const char *ctx, const em_tensor *t, em_dtype dt, int ndim,
                   const int64_t *sizes, const double *ref, double rtol, double atol) {
    ck_assert_msg(t != NULL, "line %d %s: NULL result: %s", line, ctx, em_last_error());
    ck_assert_msg(em_dtype_of(t) == dt, "line %d %s: dtype %s, expected %s", line, ctx,
                  em_dtype_name(em_dtype_of(t)), em_dtype_name(dt));
    ck_assert_msg(em_ndim(t) == ndim, "line %d %s: ndim %d, expected %d", line, ctx, em_ndim(t),
                  ndim);
    for (int i = 0; i < ndim; i++)
        ck_assert_msg(em_size(t, i) == sizes[i], "line %d %s: size[%d] %lld, expected %lld",
                      line, ctx, i, (long long)em_size(t, i), (long long)sizes[i]);
    int64_t n = numel_of(ndim, sizes);
    double *v = rd(t);
    for (int64_t i = 0; i < n; i++) {
        double a = v[i], r = ref[i];
        int ok;
        if (isnan(r)) ok = isnan(a);
        else if (isinf(r)) ok = a == r;
        else ok = fabs(a - r) <= atol + rtol * fabs(r);
        if (!ok) {
            free(v);
            ck_abort_msg("line %d %s: element %lld is %.17g, expected %.17g", line, ctx,
                         (long long)i, a, r);
        }
    }
    free(v);
}
#define CHK(ctx, t, dt, ndim, sizes, ref, rtol, atol) \
    chk_at(__LINE__, (ctx), (t), (dt), (ndim), (sizes), (ref), (rtol), (atol))

/* A deterministic value stream (independent of Ember). */
static uint64_t rng_state;
static void rng_seed(uint64_t s) { rng_state = s * 0x9E3779B97F4A7C15ull + 12345; }
static double rng_u(void) {
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng_state = x;
    return ((x >> 11) + 0.5) / 9007199254740992.0;
}
/* Uniform in [lo, hi); integral (rounded) for integer dtypes. */
static double *rvals(int64_t n, double lo, double hi, em_dtype dt) {
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        v[i] = lo + (hi - lo) * rng_u();
        if (dt == EM_I32 || dt == EM_I64) v[i] = round(v[i]);
        if (dt == EM_BOOL) v[i] = v[i] > (lo + hi) / 2;
    }
    return v;
}

/* A tensor of v (ints as given; floats rounded to the dtype by em_cast, so
 * tests read back the stored values with rd before computing references). */
static em_tensor *mk(const double *v, int ndim, const int64_t *sizes, em_dtype dt) {
    return tu_tensor(v, ndim, sizes, dt);
}

static double round_to(double v, em_dtype dt) {
    if (dt == EM_F32) return (float)v;
    return v;
}

static const em_dtype num_dtypes[] = {EM_F32, EM_F64, EM_I32, EM_I64};
static const em_dtype float_dtypes[] = {EM_F32, EM_F64};
static const em_dtype all_dtypes[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_BOOL, EM_F16, EM_BF16};

static double tol_r(em_dtype dt) { return dt == EM_F32 ? 1e-5 : dt == EM_F64 ? 1e-12 : 0; }
static double tol_a(em_dtype dt) { return dt == EM_F32 ? 1e-6 : dt == EM_F64 ? 1e-14 : 0; }

/* ---- Unary ---- */

typedef em_tensor *(*unary_fn)(const em_tensor *);
typedef double (*ref1_fn)(double);

static double r_neg(double x) { return -x; }
static double r_relu(double x) { return x < 0 ? 0 : x; }
static double r_rsqrt(double x) { return 1.0 / sqrt(x); }
static double r_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double r_gelu(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
static double r_gelu_tanh(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

typedef struct unary_case {
    const char *name;
    unary_fn fn;
    ref1_fn ref;
    double lo, hi; /* domain for random inputs */
} unary_case;

static const unary_case float_unary[] = {
    {"exp", em_exp, exp, -5, 5},
    {"log", em_log, log, 0.01, 10},
    {"sqrt", em_sqrt, sqrt, 0, 10},
    {"rsqrt", em_rsqrt, r_rsqrt, 0.01, 10},
    {"sin", em_sin, sin, -7, 7},
    {"cos", em_cos, cos, -7, 7},
    {"tanh", em_tanh, tanh, -4, 4},
    {"sigmoid", em_sigmoid, r_sigmoid, -10, 10},
    {"gelu", em_gelu, r_gelu, -5, 5},
    {"gelu_tanh", em_gelu_tanh, r_gelu_tanh, -5, 5},
    {"erf", em_erf, erf, -3, 3},
};
#define N_FLOAT_UNARY ((int)(sizeof float_unary / sizeof float_unary[0]))

static const unary_case num_unary[] = {
    {"neg", em_neg, r_neg, -50, 50},
    {"abs", em_abs, fabs, -50, 50},
    {"relu", em_relu, r_relu, -50, 50},
};
#define N_NUM_UNARY ((int)(sizeof num_unary / sizeof num_unary[0]))

/* Checks op on a [5, 7] tensor of dtype dt (result dtype rdt). */
static void check_unary(const unary_case *uc, em_dtype dt, em_dtype rdt) {
    char ctx[64];
    snprintf(ctx, sizeof ctx, "%s %s", uc->name, em_dtype_name(dt));
    const int64_t *sz = TU_SIZES(5, 7);
    double *v = rvals(35, uc->lo, uc->hi, dt);
    em_tensor *x = mk(v, 2, sz, dt);
    double *xv = rd(x);
    double ref[35];
    for (int i = 0; i < 35; i++) ref[i] = round_to(uc->ref(xv[i]), rdt);
    CHK(ctx, uc->fn(x), rdt, 2, sz, ref, tol_r(rdt), tol_a(rdt));
    free(v);
    free(xv);
}

START_TEST(test_float_unary_values) {
    const unary_case *uc = &float_unary[_i];
    rng_seed(100 + _i);
    for (int d = 0; d < 2; d++) check_unary(uc, float_dtypes[d], float_dtypes[d]);
    /* Integer inputs compute in f32. */
    check_unary(uc, EM_I32, EM_F32);
    check_unary(uc, EM_I64, EM_F32);
}
END_TEST

START_TEST(test_float_unary_special) {
    const unary_case *uc = &float_unary[_i];
    const double sv[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 1e-30, 1e30, -1e30, 100, -100,
                         0.5, -0.5, 20, -20, 90, -90, 1, -1};
    const int n = (int)(sizeof sv / sizeof sv[0]);
    for (int d = 0; d < 2; d++) {
        em_dtype dt = float_dtypes[d];
        char ctx[64];
        snprintf(ctx, sizeof ctx, "%s %s special", uc->name, em_dtype_name(dt));
        em_tensor *x = mk(sv, 1, TU_SIZES(n), dt);
        double *xv = rd(x);
        double ref[32];
        for (int i = 0; i < n; i++) ref[i] = round_to(uc->ref(xv[i]), dt);
        CHK(ctx, uc->fn(x), dt, 1, TU_SIZES(n), ref, tol_r(dt), tol_a(dt));
        free(xv);
    }
}
END_TEST

START_TEST(test_num_unary_values) {
    const unary_case *uc = &num_unary[_i];
    rng_seed(200 + _i);
    for (int d = 0; d < 4; d++) check_unary(uc, num_dtypes[d], num_dtypes[d]);
    /* Special values keep their meaning: relu(NaN) is NaN. */
    const double sv[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, -1e-30, 3.5, -3.5};
    for (int d = 0; d < 2; d++) {
        em_dtype dt = float_dtypes[d];
        em_tensor *x = mk(sv, 1, TU_SIZES(8), dt);
        double *xv = rd(x), ref[8];
        for (int i = 0; i < 8; i++) ref[i] = uc->ref(xv[i]);
        CHK(uc->name, uc->fn(x), dt, 1, TU_SIZES(8), ref, 0, 0);
        free(xv);
    }
    /* Large integers stay exact. */
    const double iv[] = {2147483647.0, -2147483647.0, 123456789, -5, 0};
    em_tensor *x32 = mk(iv, 1, TU_SIZES(5), EM_I32);
    double ref[5];
    for (int i = 0; i < 5; i++) ref[i] = uc->ref(iv[i]);
    CHK(uc->name, uc->fn(x32), EM_I32, 1, TU_SIZES(5), ref, 0, 0);
    const int64_t big[] = {(int64_t)1 << 60, -((int64_t)1 << 60) + 3, 5, -7};
    em_tensor *x64 = em_from_data(big, EM_I64, 1, TU_SIZES(4), em_cpu());
    em_tensor *y64 = uc->fn(x64);
    ck_assert_ptr_nonnull(y64);
    ck_assert_int_eq(em_dtype_of(y64), EM_I64);
    int64_t out[4];
    ck_assert_int_eq(em_copy_to_host(y64, out, sizeof out), EM_OK);
    for (int i = 0; i < 4; i++) {
        int64_t e = _i == 0 ? -big[i] : _i == 1 ? (big[i] < 0 ? -big[i] : big[i])
                                                 : (big[i] < 0 ? 0 : big[i]);
        ck_assert_msg(out[i] == e, "%s i64 element %d: %lld, expected %lld", uc->name, i,
                      (long long)out[i], (long long)e);
    }
}
END_TEST

START_TEST(test_sigmoid_extremes) {
    /* Stable for large |x|: no NaN, saturates to 0 and 1. */
    const double sv[] = {-1000, -200, -80, 80, 200, 1000, -INFINITY, INFINITY};
    for (int d = 0; d < 2; d++) {
        em_tensor *y = em_sigmoid(mk(sv, 1, TU_SIZES(8), float_dtypes[d]));
        double *v = rd(y);
        for (int i = 0; i < 8; i++) {
            ck_assert_msg(!isnan(v[i]) && v[i] >= 0 && v[i] <= 1, "sigmoid(%g) = %g", sv[i], v[i]);
            ck_assert(fabs(v[i] - r_sigmoid(sv[i])) <= 1e-30 + 1e-5 * r_sigmoid(sv[i]));
        }
        ck_assert(v[2] > 0); /* sigmoid(-80) = 1.8e-35 is a normal float */
        free(v);
    }
}
END_TEST

/* Unary ops on views: transposed, stepped slices with offset, expanded,
 * 0-d, and a large transposed input that the iterator splits over threads. */
START_TEST(test_unary_noncontiguous) {
    rng_seed(7);
    for (int d = 0; d < 4; d++) {
        em_dtype dt = num_dtypes[d];
        bool fl = em_dtype_is_float(dt);
        unary_fn fn = fl ? em_exp : em_neg;
        ref1_fn rf = fl ? exp : r_neg;
        double *v = rvals(24, -3, 3, dt);
        em_tensor *x = mk(v, 2, TU_SIZES(4, 6), dt);
        double *xv = rd(x);
        double ref[24];
        /* transpose: [6, 4] */
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 4; j++) ref[i * 4 + j] = round_to(rf(xv[j * 6 + i]), dt);
        em_tensor *t = em_transpose(x, 0, 1);
        ck_assert(!em_is_contiguous(t));
        CHK("transpose", fn(t), dt, 2, TU_SIZES(6, 4), ref, tol_r(dt), tol_a(dt));
        /* slice columns 1, 3, 5 of rows 1..3: [3, 3] with an offset */
        em_tensor *s = em_slice(em_slice(x, 1, 1, 6, 2), 0, 1, 4, 1);
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++) ref[i * 3 + j] = round_to(rf(xv[(i + 1) * 6 + 1 + 2 * j]), dt);
        CHK("slice", fn(s), dt, 2, TU_SIZES(3, 3), ref, tol_r(dt), tol_a(dt));
        /* expand row 2 ([1, 6]) to [3, 6] */
        em_tensor *e = em_expand(em_slice(x, 0, 2, 3, 1), 2, TU_SIZES(3, 6));
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 6; j++) ref[i * 6 + j] = round_to(rf(xv[2 * 6 + j]), dt);
        CHK("expand", fn(e), dt, 2, TU_SIZES(3, 6), ref, tol_r(dt), tol_a(dt));
        /* 0-d */
        em_tensor *z = em_scalar(2, dt, em_cpu());
        ref[0] = round_to(rf(2), dt);
        CHK("0-d", fn(z), dt, 0, NULL, ref, tol_r(dt), tol_a(dt));
        free(v);
        free(xv);
    }
    /* Large: 300 x 211 transposed, split across threads mid-row. */
    const int64_t R = 300, C = 211;
    double *v = rvals(R * C, -2, 2, EM_F32);
    em_tensor *x = mk(v, 2, TU_SIZES(R, C), EM_F32);
    double *xv = rd(x);
    double *ref = malloc(sizeof(double) * (size_t)(R * C));
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = 0; j < R; j++) ref[i * R + j] = (float)tanh(xv[j * C + i]);
    CHK("large transpose", em_tanh(em_transpose(x, 0, 1)), EM_F32, 2, TU_SIZES(C, R), ref, 1e-5,
        1e-6);
    for (int64_t i = 0; i < R * C; i++) ref[i] = (float)tanh(xv[i]);
    CHK("large contiguous", em_tanh(x), EM_F32, 2, TU_SIZES(R, C), ref, 1e-5, 1e-6);
    free(ref);
    free(v);
    free(xv);
}
END_TEST

START_TEST(test_unary_sizes) {
    for (int d = 0; d < 4; d++) {
        em_dtype dt = num_dtypes[d];
        /* size 0 */
        em_tensor *x0 = em_zeros(2, TU_SIZES(0, 3), dt, em_cpu());
        CHK("neg size 0", em_neg(x0), dt, 2, TU_SIZES(0, 3), NULL, 0, 0);
        CHK("abs size 0 transposed", em_abs(em_transpose(x0, 0, 1)), dt, 2, TU_SIZES(3, 0), NULL,
            0, 0);
        /* size 1 */
        const double one[] = {-4};
        const double r1[] = {4};
        CHK("abs size 1", em_abs(mk(one, 3, TU_SIZES(1, 1, 1), dt)), dt, 3, TU_SIZES(1, 1, 1), r1, 0,
            0);
    }
    for (int d = 0; d < 2; d++) {
        em_tensor *x0 = em_zeros(3, TU_SIZES(2, 0, 4), float_dtypes[d], em_cpu());
        for (int k = 0; k < N_FLOAT_UNARY; k++)
            CHK(float_unary[k].name, float_unary[k].fn(x0), float_dtypes[d], 3, TU_SIZES(2, 0, 4),
                NULL, 0, 0);
    }
}
END_TEST

START_TEST(test_unary_errors) {
    em_tensor *h = em_zeros(1, TU_SIZES(3), EM_F16, em_cpu());
    em_tensor *b = em_zeros(1, TU_SIZES(3), EM_BF16, em_cpu());
    for (int k = 0; k < N_FLOAT_UNARY; k++) {
        tu_check_fails(float_unary[k].fn(NULL), EM_ERR_NULL);
        /* half types compute (issue 15: tests/test_half.c checks the values) */
        ck_assert_ptr_nonnull(float_unary[k].fn(h));
        ck_assert_ptr_nonnull(float_unary[k].fn(b));
    }
    for (int k = 0; k < N_NUM_UNARY; k++) {
        tu_check_fails(num_unary[k].fn(NULL), EM_ERR_NULL);
        ck_assert_ptr_nonnull(num_unary[k].fn(h));
        ck_assert_ptr_nonnull(num_unary[k].fn(b));
    }
    /* A NULL made by a failed op keeps that op's error. */
    em_tensor *a = em_zeros(2, TU_SIZES(2, 3), EM_F32, em_cpu());
    em_tensor *c = em_zeros(1, TU_SIZES(4), EM_F32, em_cpu());
    tu_check_fails(em_exp(em_neg(em_add(a, c))), EM_ERR_SHAPE);
}
END_TEST

/* ---- Binary ---- */

typedef em_tensor *(*binary_fn)(const em_tensor *, const em_tensor *);
typedef double (*ref2_fn)(double, double);

static double r_add(double a, double b) { return a + b; }
static double r_sub(double a, double b) { return a - b; }
static double r_mul(double a, double b) { return a * b; }
static double r_div(double a, double b) { return a / b; }
static double r_max(double a, double b) { return isnan(a) || isnan(b) ? NAN : a > b ? a : b; }
static double r_min(double a, double b) { return isnan(a) || isnan(b) ? NAN : a < b ? a : b; }

typedef struct binary_case {
    const char *name;
    binary_fn fn;
    em_tensor *(*sfn)(const em_tensor *, double);
    ref2_fn ref;
    bool float_only;
    double alo, ahi, blo, bhi;
} binary_case;

static const binary_case binary_ops[] = {
    {"add", em_add, em_add_scalar, r_add, false, -10, 10, -10, 10},
    {"sub", em_sub, em_sub_scalar, r_sub, false, -10, 10, -10, 10},
    {"mul", em_mul, em_mul_scalar, r_mul, false, -10, 10, -10, 10},
    {"div", em_div, em_div_scalar, r_div, true, -10, 10, 0.5, 5},
    {"pow", em_pow, em_pow_scalar, pow, true, 0.1, 4, -3, 3},
    {"maximum", em_maximum, em_maximum_scalar, r_max, false, -10, 10, -10, 10},
    {"minimum", em_minimum, em_minimum_scalar, r_min, false, -10, 10, -10, 10},
};
#define N_BINARY ((int)(sizeof binary_ops / sizeof binary_ops[0]))

static em_dtype binary_result(const binary_case *bc, em_dtype dt) {
    return bc->float_only && !em_dtype_is_float(dt) ? EM_F32 : dt;
}

static double rtol_bin(const binary_case *bc, em_dtype rdt) {
    if (rdt == EM_F32) return bc->ref == pow ? 1e-6 : 1e-7;
    if (rdt == EM_F64) return 1e-14;
    return 0;
}

/* a of (an, as), b of (bn, bs), result (on, os): random values, reference
 * by broadcast indexing. */
static void check_binary(const binary_case *bc, em_dtype dt, int an, const int64_t *as, int bn,
                         const int64_t *bs, int on, const int64_t *os) {
    char ctx[96];
    snprintf(ctx, sizeof ctx, "%s %s (%dd and %dd)", bc->name, em_dtype_name(dt), an, bn);
    int64_t na = numel_of(an, as), nb = numel_of(bn, bs), no = numel_of(on, os);
    double *va = rvals(na, bc->alo, bc->ahi, dt), *vb = rvals(nb, bc->blo, bc->bhi, dt);
    em_tensor *a = mk(va, an, as, dt), *b = mk(vb, bn, bs, dt);
    double *xa = rd(a), *xb = rd(b);
    em_dtype rdt = binary_result(bc, dt);
    double *ref = malloc(sizeof(double) * (size_t)(no > 0 ? no : 1));
    int64_t idx[EM_MAX_DIMS] = {0};
    for (int64_t i = 0; i < no; i++) {
        ref[i] = round_to(bc->ref(tu_bcast_get(xa, an, as, on, idx), tu_bcast_get(xb, bn, bs, on, idx)),
                          rdt);
        tu_next(on, os, idx);
    }
    CHK(ctx, bc->fn(a, b), rdt, on, os, ref, rtol_bin(bc, rdt), 0);
    free(va);
    free(vb);
    free(xa);
    free(xb);
    free(ref);
}

START_TEST(test_binary_values) {
    const binary_case *bc = &binary_ops[_i];
    rng_seed(300 + _i);
    for (int d = 0; d < 4; d++) {
        em_dtype dt = num_dtypes[d];
        check_binary(bc, dt, 2, TU_SIZES(3, 4), 2, TU_SIZES(3, 4), 2, TU_SIZES(3, 4));
        check_binary(bc, dt, 1, TU_SIZES(37), 1, TU_SIZES(37), 1, TU_SIZES(37));
    }
}
END_TEST

START_TEST(test_binary_broadcast) {
    const binary_case *bc = &binary_ops[_i];
    rng_seed(400 + _i);
    static const struct {
        int an, bn, on;
        int64_t as[4], bs[4], os[4];
    } cases[] = {
        {3, 2, 3, {2, 1, 4}, {3, 1}, {2, 3, 4}},
        {0, 1, 1, {0}, {5}, {5}},
        {1, 0, 1, {5}, {0}, {5}},
        {0, 0, 0, {0}, {0}, {0}},
        {1, 2, 2, {1}, {2, 3}, {2, 3}},
        {2, 2, 2, {4, 1}, {1, 5}, {4, 5}},
        {3, 3, 3, {3, 1, 2}, {3, 4, 1}, {3, 4, 2}},
        {3, 0, 3, {1, 1, 1}, {0}, {1, 1, 1}},
        {2, 2, 2, {0, 3}, {1, 3}, {0, 3}},
        {2, 2, 2, {2, 0}, {2, 1}, {2, 0}},
        {1, 3, 3, {4}, {2, 3, 1}, {2, 3, 4}},
        {4, 1, 4, {2, 1, 3, 1}, {1}, {2, 1, 3, 1}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int d = 0; d < 4; d++)
            check_binary(bc, num_dtypes[d], cases[k].an, cases[k].as, cases[k].bn, cases[k].bs,
                         cases[k].on, cases[k].os);
    /* Large, broadcast along rows and columns (runs on several threads). */
    check_binary(bc, EM_F32, 2, TU_SIZES(257, 300), 1, TU_SIZES(300), 2, TU_SIZES(257, 300));
    check_binary(bc, EM_I64, 2, TU_SIZES(257, 1), 2, TU_SIZES(1, 300), 2, TU_SIZES(257, 300));
}
END_TEST

START_TEST(test_binary_noncontiguous) {
    const binary_case *bc = &binary_ops[_i];
    rng_seed(500 + _i);
    for (int d = 0; d < 4; d++) {
        em_dtype dt = num_dtypes[d];
        em_dtype rdt = binary_result(bc, dt);
        double *va = rvals(20, bc->alo, bc->ahi, dt), *vb = rvals(40, bc->blo, bc->bhi, dt);
        em_tensor *a = mk(va, 2, TU_SIZES(5, 4), dt), *b = mk(vb, 2, TU_SIZES(4, 10), dt);
        double *xa = rd(a), *xb = rd(b);
        em_tensor *at = em_transpose(a, 0, 1);           /* [4, 5] */
        em_tensor *bs = em_slice(b, 1, 1, 10, 2);         /* [4, 5]: columns 1 3 5 7 9 */
        em_tensor *bcol = em_expand(em_slice(b, 1, 0, 1, 1), 2, TU_SIZES(4, 5)); /* column 0 */
        double ref[20];
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 5; j++) ref[i * 5 + j] = round_to(bc->ref(xa[j * 4 + i], xb[i * 10 + 1 + 2 * j]), rdt);
        CHK(bc->name, bc->fn(at, bs), rdt, 2, TU_SIZES(4, 5), ref, rtol_bin(bc, rdt), 0);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 5; j++) ref[i * 5 + j] = round_to(bc->ref(xb[i * 10 + 1 + 2 * j], xa[j * 4 + i]), rdt);
        CHK(bc->name, bc->fn(bs, at), rdt, 2, TU_SIZES(4, 5), ref, rtol_bin(bc, rdt), 0);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 5; j++) ref[i * 5 + j] = round_to(bc->ref(xa[j * 4 + i], xb[i * 10]), rdt);
        CHK(bc->name, bc->fn(at, bcol), rdt, 2, TU_SIZES(4, 5), ref, rtol_bin(bc, rdt), 0);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 5; j++) ref[i * 5 + j] = round_to(bc->ref(xb[i * 10], xa[j * 4 + i]), rdt);
        CHK(bc->name, bc->fn(bcol, at), rdt, 2, TU_SIZES(4, 5), ref, rtol_bin(bc, rdt), 0);
        free(va);
        free(vb);
        free(xa);
        free(xb);
    }
}
END_TEST

/* 3-d: a permuted view against a stepped, unsqueezed (broadcast) view. */
START_TEST(test_binary_permute) {
    const binary_case *bc = &binary_ops[_i];
    rng_seed(900 + _i);
    for (int d = 0; d < 4; d++) {
        em_dtype dt = num_dtypes[d];
        em_dtype rdt = binary_result(bc, dt);
        double *va = rvals(24, bc->alo, bc->ahi, dt), *vb = rvals(24, bc->blo, bc->bhi, dt);
        em_tensor *a = mk(va, 3, TU_SIZES(2, 3, 4), dt), *b = mk(vb, 2, TU_SIZES(4, 6), dt);
        double *xa = rd(a), *xb = rd(b);
        em_tensor *ap = em_permute(a, 3, (const int[]){2, 0, 1});              /* [4, 2, 3] */
        em_tensor *bp = em_unsqueeze(em_slice(b, -1, 0, 6, 2), -2);             /* [4, 1, 3] */
        ck_assert(ap && bp && em_size(bp, 1) == 1);
        double ref[24];
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 2; j++)
                for (int k = 0; k < 3; k++)
                    ref[(i * 2 + j) * 3 + k] =
                        round_to(bc->ref(xa[(j * 3 + k) * 4 + i], xb[i * 6 + 2 * k]), rdt);
        CHK(bc->name, bc->fn(ap, bp), rdt, 3, TU_SIZES(4, 2, 3), ref, rtol_bin(bc, rdt), 0);
        /* negative dims: transpose(-1, -3) of ap is [3, 2, 4] */
        em_tensor *at = em_transpose(ap, -1, -3);
        em_tensor *bt = em_transpose(bp, -3, -1); /* [3, 1, 4] */
        for (int k = 0; k < 3; k++)
            for (int j = 0; j < 2; j++)
                for (int i = 0; i < 4; i++)
                    ref[(k * 2 + j) * 4 + i] =
                        round_to(bc->ref(xa[(j * 3 + k) * 4 + i], xb[i * 6 + 2 * k]), rdt);
        CHK(bc->name, bc->fn(at, bt), rdt, 3, TU_SIZES(3, 2, 4), ref, rtol_bin(bc, rdt), 0);
        free(va);
        free(vb);
        free(xa);
        free(xb);
    }
}
END_TEST

START_TEST(test_binary_special) {
    const binary_case *bc = &binary_ops[_i];
    const double a[] = {NAN, 1, NAN, INFINITY, -INFINITY, 0, 1, -1, 2, INFINITY, -0.0, 3};
    const double b[] = {1, NAN, NAN, INFINITY, INFINITY, 0, 0, 0, -INFINITY, 2, 0.0, -0.5};
    for (int d = 0; d < 2; d++) {
        em_dtype dt = float_dtypes[d];
        double ref[12];
        for (int i = 0; i < 12; i++) ref[i] = round_to(bc->ref(a[i], b[i]), dt);
        CHK(bc->name, bc->fn(mk(a, 1, TU_SIZES(12), dt), mk(b, 1, TU_SIZES(12), dt)), dt, 1,
            TU_SIZES(12), ref, rtol_bin(bc, dt), 0);
    }
}
END_TEST

START_TEST(test_binary_int_edge) {
    /* Integer arithmetic wraps instead of trapping. */
    const int32_t a[] = {INT32_MAX, INT32_MIN, 65536, -3};
    const int32_t b[] = {1, 1, 65536, 7};
    em_tensor *ta = em_from_data(a, EM_I32, 1, TU_SIZES(4), em_cpu());
    em_tensor *tb = em_from_data(b, EM_I32, 1, TU_SIZES(4), em_cpu());
    int32_t out[4];
    ck_assert_int_eq(em_copy_to_host(em_add(ta, tb), out, sizeof out), EM_OK);
    ck_assert_int_eq(out[0], INT32_MIN);
    ck_assert_int_eq(out[3], 4);
    ck_assert_int_eq(em_copy_to_host(em_sub(ta, tb), out, sizeof out), EM_OK);
    ck_assert_int_eq(out[1], INT32_MAX);
    ck_assert_int_eq(em_copy_to_host(em_mul(ta, tb), out, sizeof out), EM_OK);
    ck_assert_int_eq(out[2], 0);
    ck_assert_int_eq(out[3], -21);
    ck_assert_int_eq(em_copy_to_host(em_maximum(ta, tb), out, sizeof out), EM_OK);
    ck_assert_int_eq(out[0], INT32_MAX);
    ck_assert_int_eq(out[1], 1);
    ck_assert_int_eq(em_copy_to_host(em_minimum(ta, tb), out, sizeof out), EM_OK);
    ck_assert_int_eq(out[1], INT32_MIN);
    /* i64 values past 2^53 stay exact. */
    const int64_t c[] = {((int64_t)1 << 62) + 1, -((int64_t)1 << 62) - 3};
    const int64_t e[] = {2, 5};
    em_tensor *tc = em_from_data(c, EM_I64, 1, TU_SIZES(2), em_cpu());
    em_tensor *te = em_from_data(e, EM_I64, 1, TU_SIZES(2), em_cpu());
    int64_t o64[2];
    ck_assert_int_eq(em_copy_to_host(em_add(tc, te), o64, sizeof o64), EM_OK);
    ck_assert(o64[0] == ((int64_t)1 << 62) + 3 && o64[1] == -((int64_t)1 << 62) + 2);
    ck_assert_int_eq(em_copy_to_host(em_sub(tc, te), o64, sizeof o64), EM_OK);
    ck_assert(o64[0] == ((int64_t)1 << 62) - 1 && o64[1] == -((int64_t)1 << 62) - 8);
    /* Integer division computes in f32: 7 / 2 = 3.5, 1 / 0 = inf. */
    const double n[] = {7, -7, 1, 0}, m[] = {2, 2, 0, 0};
    const double r[] = {3.5, -3.5, INFINITY, NAN};
    CHK("i32 div", em_div(mk(n, 1, TU_SIZES(4), EM_I32), mk(m, 1, TU_SIZES(4), EM_I32)), EM_F32,
        1, TU_SIZES(4), r, 0, 0);
}
END_TEST

START_TEST(test_binary_scalar) {
    const binary_case *bc = &binary_ops[_i];
    rng_seed(600 + _i);
    const double scalars[] = {2.0, 2.5, -1.0, 0.25};
    for (int d = 0; d < 4; d++) {
        em_dtype dt = num_dtypes[d];
        double lo = bc->ref == pow ? 0.1 : -10;
        double *v = rvals(12, lo, 10, dt);
        em_tensor *x = mk(v, 2, TU_SIZES(3, 4), dt);
        double *xv = rd(x);
        for (int k = 0; k < 4; k++) {
            double s = scalars[k];
            bool integral = s == floor(s);
            em_dtype rdt = em_dtype_is_float(dt) ? dt
                           : (bc->float_only || !integral) ? EM_F32 : dt;
            double sv = round_to(s, rdt), ref[12];
            for (int i = 0; i < 12; i++) ref[i] = round_to(bc->ref(xv[i], sv), rdt);
            char ctx[64];
            snprintf(ctx, sizeof ctx, "%s_scalar %s by %g", bc->name, em_dtype_name(dt), s);
            CHK(ctx, bc->sfn(x, s), rdt, 2, TU_SIZES(3, 4), ref, rtol_bin(bc, rdt), 0);
        }
        /* On a 0-d and on a size-0 tensor. */
        em_tensor *z = em_scalar(3, dt, em_cpu());
        double r0 = round_to(bc->ref(3, 2), binary_result(bc, dt));
        CHK(bc->name, bc->sfn(z, 2), binary_result(bc, dt), 0, NULL, &r0, 1e-6, 0);
        em_tensor *e = em_zeros(2, TU_SIZES(3, 0), dt, em_cpu());
        CHK(bc->name, bc->sfn(e, 2), binary_result(bc, dt), 2, TU_SIZES(3, 0), NULL, 0, 0);
        free(v);
        free(xv);
    }
    tu_check_fails(bc->sfn(NULL, 1), EM_ERR_NULL);
}
END_TEST

START_TEST(test_binary_errors) {
    const binary_case *bc = &binary_ops[_i];
    em_tensor *a = em_zeros(2, TU_SIZES(2, 3), EM_F32, em_cpu());
    em_tensor *b = em_zeros(1, TU_SIZES(4), EM_F32, em_cpu());
    tu_check_fails(bc->fn(a, b), EM_ERR_SHAPE);
    tu_check_fails(bc->fn(b, a), EM_ERR_SHAPE);
    tu_check_fails(bc->fn(a, em_zeros(3, TU_SIZES(2, 2, 4), EM_F32, em_cpu())), EM_ERR_SHAPE);
    tu_check_fails(bc->fn(em_zeros(1, TU_SIZES(0), EM_F32, em_cpu()), b), EM_ERR_SHAPE);
    tu_check_fails(bc->fn(NULL, a), EM_ERR_NULL);
    tu_check_fails(bc->fn(a, NULL), EM_ERR_NULL);
    tu_check_fails(bc->fn(NULL, NULL), EM_ERR_NULL);
    /* half types compute (tests/test_half.c checks the values); their
     * shapes are checked as any dtype's */
    em_tensor *h = em_zeros(2, TU_SIZES(2, 3), EM_F16, em_cpu());
    ck_assert_ptr_nonnull(bc->fn(h, h));
    tu_check_fails(bc->fn(h, em_zeros(1, TU_SIZES(4), EM_BF16, em_cpu())), EM_ERR_SHAPE);
    /* The error that made a NULL input is kept. */
    tu_check_fails(bc->fn(bc->fn(a, b), a), EM_ERR_SHAPE);
}
END_TEST

/* Promotion through the public API. */
START_TEST(test_promotion) {
    const double va[] = {1, -2, 3}, vb[] = {0.5, 4, -1.5};
    em_tensor *i32 = mk(va, 1, TU_SIZES(3), EM_I32);
    em_tensor *i64 = mk(va, 1, TU_SIZES(3), EM_I64);
    em_tensor *f32 = mk(vb, 1, TU_SIZES(3), EM_F32);
    em_tensor *f64 = mk(vb, 1, TU_SIZES(3), EM_F64);
    em_tensor *bl = mk(va, 1, TU_SIZES(3), EM_BOOL); /* all true */
    double r[3];
    for (int i = 0; i < 3; i++) r[i] = va[i] + vb[i];
    CHK("i32 + f32", em_add(i32, f32), EM_F32, 1, TU_SIZES(3), r, 0, 0);
    CHK("f32 + i32", em_add(f32, i32), EM_F32, 1, TU_SIZES(3), r, 0, 0);
    CHK("i64 + f64", em_add(i64, f64), EM_F64, 1, TU_SIZES(3), r, 0, 0);
    for (int i = 0; i < 3; i++) r[i] = vb[i] * vb[i];
    CHK("f32 * f64", em_mul(f32, f64), EM_F64, 1, TU_SIZES(3), r, 0, 0);
    for (int i = 0; i < 3; i++) r[i] = 2 * va[i];
    CHK("i32 + i64", em_add(i32, i64), EM_I64, 1, TU_SIZES(3), r, 0, 0);
    for (int i = 0; i < 3; i++) r[i] = va[i] + 1;
    CHK("i32 + bool", em_add(i32, bl), EM_I32, 1, TU_SIZES(3), r, 0, 0);
    for (int i = 0; i < 3; i++) r[i] = va[i] / vb[i];
    CHK("i32 / f32", em_div(i32, f32), EM_F32, 1, TU_SIZES(3), r, 1e-7, 0);
    for (int i = 0; i < 3; i++) r[i] = (float)(va[i] / 2);
    CHK("i64 / i64", em_div(i64, mk((double[]){2, 2, 2}, 1, TU_SIZES(3), EM_I64)), EM_F32, 1,
        TU_SIZES(3), r, 0, 0);
    /* Float-only unary ops compute integers in f32. */
    for (int i = 0; i < 3; i++) r[i] = (float)exp(va[i]);
    CHK("exp i32", em_exp(i32), EM_F32, 1, TU_SIZES(3), r, 1e-6, 0);
    CHK("exp i64", em_exp(i64), EM_F32, 1, TU_SIZES(3), r, 1e-6, 0);
    /* Scalars take the tensor's dtype unless non-integral with an integer tensor. */
    for (int i = 0; i < 3; i++) r[i] = 2 * va[i];
    CHK("i32 * 2.0", em_mul_scalar(i32, 2.0), EM_I32, 1, TU_SIZES(3), r, 0, 0);
    CHK("i64 * 2.0", em_mul_scalar(i64, 2.0), EM_I64, 1, TU_SIZES(3), r, 0, 0);
    for (int i = 0; i < 3; i++) r[i] = 2.5 * va[i];
    CHK("i32 * 2.5", em_mul_scalar(i32, 2.5), EM_F32, 1, TU_SIZES(3), r, 0, 0);
    for (int i = 0; i < 3; i++) r[i] = (float)(vb[i] * 0.1f);
    CHK("f32 * 0.1", em_mul_scalar(f32, 0.1), EM_F32, 1, TU_SIZES(3), r, 1e-7, 0);
    for (int i = 0; i < 3; i++) r[i] = vb[i] * 0.1;
    CHK("f64 * 0.1", em_mul_scalar(f64, 0.1), EM_F64, 1, TU_SIZES(3), r, 1e-15, 0);
    /* Comparisons give bool, promoting their inputs first. */
    for (int i = 0; i < 3; i++) r[i] = va[i] < vb[i];
    CHK("i32 < f32", em_lt(i32, f32), EM_BOOL, 1, TU_SIZES(3), r, 0, 0);
    for (int i = 0; i < 3; i++) r[i] = va[i] == 1;
    CHK("i64 == bool", em_eq(i64, bl), EM_BOOL, 1, TU_SIZES(3), r, 0, 0);
    /* where promotes its two value operands. */
    em_tensor *cnd = mk((double[3]){1, 0, 1}, 1, TU_SIZES(3), EM_BOOL);
    for (int i = 0; i < 3; i++) r[i] = i != 1 ? va[i] : vb[i];
    CHK("where i32 f32", em_where(cnd, i32, f32), EM_F32, 1, TU_SIZES(3), r, 0, 0);
    CHK("where i64 f64", em_where(cnd, i64, f64), EM_F64, 1, TU_SIZES(3), r, 0, 0);
    for (int i = 0; i < 3; i++) r[i] = i != 1 ? va[i] : 1;
    CHK("where i32 bool", em_where(cnd, i32, bl), EM_I32, 1, TU_SIZES(3), r, 0, 0);
    /* Broadcast with promotion: [3, 1] i32 and [3] f64. */
    double r9[9];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) r9[i * 3 + j] = va[i] - vb[j];
    CHK("bcast promote", em_sub(em_reshape(i32, 2, TU_SIZES(3, 1)), f64), EM_F64, 2,
        TU_SIZES(3, 3), r9, 0, 0);
}
END_TEST

/* ---- Comparisons ---- */

typedef struct compare_case {
    const char *name;
    binary_fn fn;
    int op; /* 0 eq 1 ne 2 lt 3 le 4 gt 5 ge */
} compare_case;

static const compare_case compare_ops[] = {
    {"eq", em_eq, 0}, {"ne", em_ne, 1}, {"lt", em_lt, 2},
    {"le", em_le, 3}, {"gt", em_gt, 4}, {"ge", em_ge, 5},
};

static double r_cmp(int op, double a, double b) {
    switch (op) {
    case 0: return a == b;
    case 1: return a != b;
    case 2: return a < b;
    case 3: return a <= b;
    case 4: return a > b;
    default: return a >= b;
    }
}

START_TEST(test_compare) {
    const compare_case *cc = &compare_ops[_i];
    rng_seed(700 + _i);
    const em_dtype dts[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_BOOL};
    for (int d = 0; d < 5; d++) {
        em_dtype dt = dts[d];
        char ctx[64];
        snprintf(ctx, sizeof ctx, "%s %s", cc->name, em_dtype_name(dt));
        /* Small integers: many ties. */
        double *va = rvals(24, -2, 2, dt), *vb = rvals(24, -2, 2, dt);
        if (em_dtype_is_float(dt))
            for (int i = 0; i < 24; i++) va[i] = round(va[i]), vb[i] = round(vb[i]);
        em_tensor *a = mk(va, 2, TU_SIZES(4, 6), dt), *b = mk(vb, 2, TU_SIZES(4, 6), dt);
        double ref[24];
        for (int i = 0; i < 24; i++) ref[i] = r_cmp(cc->op, va[i], vb[i]);
        CHK(ctx, cc->fn(a, b), EM_BOOL, 2, TU_SIZES(4, 6), ref, 0, 0);
        /* Broadcast: a's row 1 against every row of b, and a transposed view. */
        em_tensor *row = em_slice(a, 0, 1, 2, 1);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 6; j++) ref[i * 6 + j] = r_cmp(cc->op, va[6 + j], vb[i * 6 + j]);
        CHK(ctx, cc->fn(row, b), EM_BOOL, 2, TU_SIZES(4, 6), ref, 0, 0);
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 4; j++) ref[i * 4 + j] = r_cmp(cc->op, va[j * 6 + i], vb[j * 6 + i]);
        CHK(ctx, cc->fn(em_transpose(a, 0, 1), em_transpose(b, 0, 1)), EM_BOOL, 2,
            TU_SIZES(6, 4), ref, 0, 0);
        /* 0-d against [4, 6]; size 0. */
        em_tensor *z = em_scalar(1, dt, em_cpu());
        for (int i = 0; i < 24; i++) ref[i] = r_cmp(cc->op, 1, vb[i]);
        CHK(ctx, cc->fn(z, b), EM_BOOL, 2, TU_SIZES(4, 6), ref, 0, 0);
        CHK(ctx, cc->fn(em_zeros(2, TU_SIZES(0, 6), dt, em_cpu()), row), EM_BOOL, 2, TU_SIZES(0, 6),
            NULL, 0, 0);
        free(va);
        free(vb);
    }
    /* NaN compares unequal to everything, itself included. */
    const double a[] = {NAN, 1, NAN, INFINITY, -INFINITY, 0.0, INFINITY};
    const double b[] = {NAN, NAN, 1, INFINITY, INFINITY, -0.0, 1e308};
    for (int d = 0; d < 2; d++) {
        /* in f32, 1e308 becomes inf and equals inf */
        em_tensor *ta = mk(a, 1, TU_SIZES(7), float_dtypes[d]), *tb = mk(b, 1, TU_SIZES(7), float_dtypes[d]);
        double *xa = rd(ta), *xb = rd(tb), ref[7];
        for (int i = 0; i < 7; i++) ref[i] = r_cmp(cc->op, xa[i], xb[i]);
        CHK(cc->name, cc->fn(ta, tb), EM_BOOL, 1, TU_SIZES(7), ref, 0, 0);
        free(xa);
        free(xb);
    }
    /* i64 beyond 2^53 compares exactly. */
    const int64_t c1[] = {((int64_t)1 << 60) + 1}, c2[] = {(int64_t)1 << 60};
    em_tensor *t1 = em_from_data(c1, EM_I64, 1, TU_SIZES(1), em_cpu());
    em_tensor *t2 = em_from_data(c2, EM_I64, 1, TU_SIZES(1), em_cpu());
    double r1 = r_cmp(cc->op, 1, 0);
    CHK("i64 exact", cc->fn(t1, t2), EM_BOOL, 1, TU_SIZES(1), &r1, 0, 0);
    /* Errors. */
    em_tensor *x = em_zeros(2, TU_SIZES(2, 3), EM_F32, em_cpu());
    tu_check_fails(cc->fn(x, em_zeros(1, TU_SIZES(2), EM_F32, em_cpu())), EM_ERR_SHAPE);
    tu_check_fails(cc->fn(NULL, x), EM_ERR_NULL);
    tu_check_fails(cc->fn(x, NULL), EM_ERR_NULL);
}
END_TEST

/* ---- where ---- */

START_TEST(test_where) {
    rng_seed(800);
    for (int d = 0; d < 7; d++) {
        em_dtype dt = all_dtypes[d];
        char ctx[64];
        snprintf(ctx, sizeof ctx, "where %s", em_dtype_name(dt));
        /* Values every dtype holds exactly. */
        double va[12], vb[12], vc[12];
        for (int i = 0; i < 12; i++) {
            va[i] = dt == EM_BOOL ? (i % 3 == 0) : (double)(i - 5) * 0.5;
            vb[i] = dt == EM_BOOL ? (i % 2) : (double)(i + 1) * -0.25;
            vc[i] = rng_u() < 0.5;
            if (dt == EM_I32 || dt == EM_I64) va[i] = i - 5, vb[i] = 100 + i;
        }
        em_tensor *c = mk(vc, 2, TU_SIZES(3, 4), EM_BOOL);
        em_tensor *a = mk(va, 2, TU_SIZES(3, 4), dt), *b = mk(vb, 2, TU_SIZES(3, 4), dt);
        double ref[12];
        for (int i = 0; i < 12; i++) ref[i] = vc[i] ? va[i] : vb[i];
        CHK(ctx, em_where(c, a, b), dt, 2, TU_SIZES(3, 4), ref, 0, 0);
        /* Broadcast: cond [3, 1], a [1, 4] (row 0 of a), b 0-d. */
        em_tensor *c31 = em_slice(c, 1, 2, 3, 1);
        em_tensor *a14 = em_slice(a, 0, 0, 1, 1);
        em_tensor *b0 = em_squeeze(em_squeeze(em_slice(em_slice(b, 0, 2, 3, 1), 1, 3, 4, 1), 0), 0);
        ck_assert_int_eq(em_ndim(b0), 0);
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 4; j++) ref[i * 4 + j] = vc[i * 4 + 2] ? va[j] : vb[11];
        CHK(ctx, em_where(c31, a14, b0), dt, 2, TU_SIZES(3, 4), ref, 0, 0);
        /* Transposed operands. */
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 3; j++) ref[i * 3 + j] = vc[j * 4 + i] ? va[j * 4 + i] : vb[j * 4 + i];
        CHK(ctx, em_where(em_transpose(c, 0, 1), em_transpose(a, 0, 1), em_transpose(b, 0, 1)),
            dt, 2, TU_SIZES(4, 3), ref, 0, 0);
        /* Rank mismatch: cond [2, 3, 4] from expanding c. */
        em_tensor *c3 = em_expand(c, 3, TU_SIZES(2, 3, 4));
        double r24[24];
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < 12; i++) r24[k * 12 + i] = vc[i] ? va[i] : vb[i];
        CHK(ctx, em_where(c3, a, b), dt, 3, TU_SIZES(2, 3, 4), r24, 0, 0);
        /* Size 0. */
        CHK(ctx, em_where(em_zeros(2, TU_SIZES(0, 4), EM_BOOL, em_cpu()), a14, b0), dt, 2,
            TU_SIZES(0, 4), NULL, 0, 0);
    }
    /* NaN and inf pass through untouched. */
    const double a[] = {NAN, INFINITY, -INFINITY, 1}, b[] = {2, NAN, 3, -INFINITY};
    const double c[] = {1, 1, 0, 0}, r[] = {NAN, INFINITY, 3, -INFINITY};
    CHK("where NaN", em_where(mk(c, 1, TU_SIZES(4), EM_BOOL), mk(a, 1, TU_SIZES(4), EM_F32),
                              mk(b, 1, TU_SIZES(4), EM_F32)),
        EM_F32, 1, TU_SIZES(4), r, 0, 0);
    /* Large (threads). */
    const int64_t N = 70001;
    double *va = rvals(N, -1, 1, EM_F64), *vb = rvals(N, -1, 1, EM_F64);
    em_tensor *ta = mk(va, 1, TU_SIZES(N), EM_F64), *tb = mk(vb, 1, TU_SIZES(N), EM_F64);
    em_tensor *tc = em_gt(ta, tb);
    double *ref = malloc(sizeof(double) * (size_t)N);
    for (int64_t i = 0; i < N; i++) ref[i] = va[i] > vb[i] ? va[i] : vb[i];
    CHK("where large", em_where(tc, ta, tb), EM_F64, 1, TU_SIZES(N), ref, 0, 0);
    free(ref);
    free(va);
    free(vb);
}
END_TEST

START_TEST(test_where_errors) {
    em_tensor *a = em_zeros(2, TU_SIZES(2, 3), EM_F32, em_cpu());
    em_tensor *cb = em_zeros(2, TU_SIZES(2, 3), EM_BOOL, em_cpu());
    const em_dtype bad[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_F16};
    for (int i = 0; i < 5; i++)
        tu_check_fails(em_where(em_zeros(2, TU_SIZES(2, 3), bad[i], em_cpu()), a, a), EM_ERR_DTYPE);
    tu_check_fails(em_where(cb, a, em_zeros(1, TU_SIZES(4), EM_F32, em_cpu())), EM_ERR_SHAPE);
    tu_check_fails(em_where(em_zeros(1, TU_SIZES(5), EM_BOOL, em_cpu()), a, a), EM_ERR_SHAPE);
    tu_check_fails(em_where(NULL, a, a), EM_ERR_NULL);
    tu_check_fails(em_where(cb, NULL, a), EM_ERR_NULL);
    tu_check_fails(em_where(cb, a, NULL), EM_ERR_NULL);
}
END_TEST

/* ---- cast ---- */

/* v converted to dt, for values dt holds exactly or that truncate. */
static double conv_ref(double v, em_dtype dt) {
    switch (dt) {
    case EM_F32: return (float)v;
    case EM_F64:
    case EM_F16:
    case EM_BF16: return v;
    case EM_I32:
        if (isnan(v)) return 0;
        if (v >= 2147483647.0) return 2147483647.0;
        if (v <= -2147483648.0) return -2147483648.0;
        return trunc(v);
    case EM_I64:
        if (isnan(v)) return 0;
        if (v >= 0x1p63) return 0x1p63;
        if (v <= -0x1p63) return -0x1p63;
        return trunc(v);
    case EM_BOOL: return v != 0;
    default: return NAN;
    }
}

START_TEST(test_cast_all_pairs) {
    /* Every value exact in f16 and bf16; the fractional ones truncate. */
    const double v[] = {0, 1, -2, 3.5, -3.75, 100, 0.5, -0.5, 96, -0.0};
    const int n = 10;
    for (int s = 0; s < 7; s++) {
        em_dtype sd = all_dtypes[s];
        /* Source built from raw bytes of sd (not through em_cast). */
        unsigned char raw[10 * 8];
        double sv[10];
        for (int i = 0; i < n; i++) {
            sv[i] = conv_ref(v[i], sd);
            unsigned char *p = raw + (size_t)i * em_dtype_size(sd);
            switch (sd) {
            case EM_F32: { float x = (float)sv[i]; memcpy(p, &x, 4); break; }
            case EM_F64: memcpy(p, &sv[i], 8); break;
            case EM_I32: { int32_t x = (int32_t)sv[i]; memcpy(p, &x, 4); break; }
            case EM_I64: { int64_t x = (int64_t)sv[i]; memcpy(p, &x, 8); break; }
            case EM_BOOL: p[0] = (unsigned char)sv[i]; break;
            case EM_F16: case EM_BF16: {
                /* exact: encode through float bits for bf16, by hand for f16 */
                float f = (float)sv[i];
                uint32_t b;
                memcpy(&b, &f, 4);
                uint16_t h;
                if (sd == EM_BF16) h = (uint16_t)(b >> 16);
                else if (f == 0) h = (uint16_t)((b >> 16) & 0x8000);
                else h = (uint16_t)(((b >> 16) & 0x8000) | ((((b >> 23) & 0xff) - 112) << 10) |
                                    ((b >> 13) & 0x3ff));
                memcpy(p, &h, 2);
                break;
            }
            default: break;
            }
        }
        em_tensor *x = em_from_data(raw, sd, 1, TU_SIZES(n), em_cpu());
        ck_assert_ptr_nonnull(x);
        double *xv = rd(x);
        for (int i = 0; i < n; i++) ck_assert_msg(xv[i] == sv[i], "source %s %d", em_dtype_name(sd), i);
        free(xv);
        for (int d = 0; d < 7; d++) {
            em_dtype dd = all_dtypes[d];
            char ctx[64];
            snprintf(ctx, sizeof ctx, "cast %s -> %s", em_dtype_name(sd), em_dtype_name(dd));
            double ref[10];
            for (int i = 0; i < n; i++) ref[i] = conv_ref(sv[i], dd);
            CHK(ctx, em_cast(x, dd), dd, 1, TU_SIZES(n), ref, 0, 0);
            /* Strided: every other element, reversed roles via a [5, 2] transpose. */
            em_tensor *xt = em_transpose(em_reshape(x, 2, TU_SIZES(5, 2)), 0, 1);
            double rt[10];
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 5; j++) rt[i * 5 + j] = conv_ref(sv[j * 2 + i], dd);
            CHK(ctx, em_cast(xt, dd), dd, 2, TU_SIZES(2, 5), rt, 0, 0);
            /* 0-d and size 0. */
            double r0 = conv_ref(sv[3], dd);
            CHK(ctx, em_cast(em_squeeze(em_slice(x, 0, 3, 4, 1), 0), dd), dd, 0, NULL, &r0, 0, 0);
            CHK(ctx, em_cast(em_slice(x, 0, 4, 4, 1), dd), dd, 1, TU_SIZES(0), NULL, 0, 0);
        }
    }
}
END_TEST

START_TEST(test_cast_rounding) {
    /* 1/3: f16 0x3555 = 0.333251953125, bf16 0x3eab = 0.333984375. */
    const double third[] = {1.0 / 3};
    for (int s = 0; s < 2; s++) {
        em_tensor *x = mk(third, 1, TU_SIZES(1), float_dtypes[s]);
        em_tensor *h = em_cast(x, EM_F16), *b = em_cast(x, EM_BF16);
        uint16_t hb, bb;
        ck_assert_int_eq(em_copy_to_host(h, &hb, 2), EM_OK);
        ck_assert_int_eq(em_copy_to_host(b, &bb, 2), EM_OK);
        ck_assert_uint_eq(hb, 0x3555);
        ck_assert_uint_eq(bb, 0x3eab);
        double r1 = 0.333251953125, r2 = 0.333984375;
        CHK("f16 -> back", em_cast(h, float_dtypes[s]), float_dtypes[s], 1, TU_SIZES(1), &r1, 0, 0);
        CHK("bf16 -> back", em_cast(b, float_dtypes[s]), float_dtypes[s], 1, TU_SIZES(1), &r2, 0, 0);
    }
    /* Round trips of exactly representable values, and range ends. */
    const double hv[] = {65504, -65504, 0x1p-14, 0x1p-24, -0x1p-20, 1.5, 2048, -0.0, 1000.5};
    em_tensor *hx = mk(hv, 1, TU_SIZES(9), EM_F64);
    CHK("f16 round trip", em_cast(em_cast(hx, EM_F16), EM_F64), EM_F64, 1, TU_SIZES(9), hv, 0, 0);
    const double bv[] = {0x1p100, -0x1p-100, 1.5, 256,
                         -0.0, 0.0078125, 65280, -1.0};
    em_tensor *bx = mk(bv, 1, TU_SIZES(8), EM_F32);
    CHK("bf16 round trip", em_cast(em_cast(bx, EM_BF16), EM_F32), EM_F32, 1, TU_SIZES(8), bv, 0, 0);
    /* Overflow and underflow, ties to even. */
    const double ov[] = {65520, 1e6, -1e6, 1e-9, 2049, 2051, 1 + 0x1p-11, NAN, INFINITY};
    const double oh[] = {INFINITY, INFINITY, -INFINITY, 0, 2048, 2052, 1, NAN, INFINITY};
    CHK("f16 rounding", em_cast(em_cast(mk(ov, 1, TU_SIZES(9), EM_F64), EM_F16), EM_F64), EM_F64,
        1, TU_SIZES(9), oh, 0, 0);
    const double bo[] = {1 + 0x1p-8, 1 + 0x1p-8 + 0x1p-20, 3 * 0x1p-8 + 1, NAN, -INFINITY, 1e38};
    const double bh[] = {1, 1 + 0x1p-7, 1 + 0x1p-6, NAN, -INFINITY, 0.99999994e38};
    em_tensor *bt = em_cast(em_cast(mk(bo, 1, TU_SIZES(6), EM_F32), EM_BF16), EM_F64);
    double *btv = rd(bt);
    for (int i = 0; i < 5; i++)
        ck_assert_msg(isnan(bh[i]) ? isnan(btv[i]) : btv[i] == bh[i], "bf16 %d: %.17g", i, btv[i]);
    ck_assert(fabs(btv[5] - 1e38) < 1e38 * 0x1p-8);
    free(btv);
    /* f16/bf16 to integers and bool. */
    const double q[] = {-2.5, 7.75, 0, NAN};
    const double qi[] = {-2, 7, 0, 0}, qb[] = {1, 1, 0, 1};
    const double qf[] = {-2.5, 7.75, 0, NAN};
    for (int k = 0; k < 2; k++) {
        em_tensor *x = em_cast(mk(q, 1, TU_SIZES(4), EM_F32), k ? EM_BF16 : EM_F16);
        CHK("half -> i32", em_cast(x, EM_I32), EM_I32, 1, TU_SIZES(4), qi, 0, 0);
        CHK("half -> i64", em_cast(x, EM_I64), EM_I64, 1, TU_SIZES(4), qi, 0, 0);
        CHK("half -> bool", em_cast(x, EM_BOOL), EM_BOOL, 1, TU_SIZES(4), qb, 0, 0);
        CHK("half -> other half", em_cast(em_cast(x, k ? EM_F16 : EM_BF16), EM_F32), EM_F32, 1,
            TU_SIZES(4), qf, 0, 0);
    }
}
END_TEST

START_TEST(test_cast_special) {
    /* NaN -> int is 0; out of range clamps; truncation toward zero. */
    const double v[] = {NAN, INFINITY, -INFINITY, 3e9, -3e9, 1e20, -1e20, 2.9, -2.9, -0.5};
    const double r32[] = {0, 2147483647.0, -2147483648.0, 2147483647.0, -2147483648.0,
                          2147483647.0, -2147483648.0, 2, -2, 0};
    const double rb[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    for (int s = 0; s < 2; s++) {
        em_tensor *x = mk(v, 1, TU_SIZES(10), float_dtypes[s]);
        CHK("-> i32", em_cast(x, EM_I32), EM_I32, 1, TU_SIZES(10), r32, 0, 0);
        CHK("-> bool", em_cast(x, EM_BOOL), EM_BOOL, 1, TU_SIZES(10), rb, 0, 0);
        em_tensor *y = em_cast(x, EM_I64);
        ck_assert_ptr_nonnull(y);
        int64_t o[10];
        ck_assert_int_eq(em_copy_to_host(y, o, sizeof o), EM_OK);
        ck_assert(o[0] == 0 && o[1] == INT64_MAX && o[2] == INT64_MIN && o[5] == INT64_MAX &&
                  o[6] == INT64_MIN && o[7] == 2 && o[8] == -2 && o[9] == 0);
        ck_assert(o[3] == 3000000000LL && o[4] == -3000000000LL);
    }
    /* bool: x != 0, NaN -> true, -0 -> false. */
    const double bv[] = {0, -0.0, 0.1, -3, NAN, 1e-300};
    const double br[] = {0, 0, 1, 1, 1, 1};
    CHK("f64 -> bool", em_cast(mk(bv, 1, TU_SIZES(6), EM_F64), EM_BOOL), EM_BOOL, 1, TU_SIZES(6),
        br, 0, 0);
    const double iv[] = {0, 5, -1, 0};
    const double ir[] = {0, 1, 1, 0};
    for (int d = 2; d < 4; d++) {
        em_tensor *b = em_cast(mk(iv, 1, TU_SIZES(4), num_dtypes[d]), EM_BOOL);
        CHK("int -> bool", b, EM_BOOL, 1, TU_SIZES(4), ir, 0, 0);
        for (int e = 0; e < 4; e++)
            CHK("bool -> num", em_cast(b, num_dtypes[e]), num_dtypes[e], 1, TU_SIZES(4), ir, 0, 0);
    }
    /* i64 exactness: through i64 and i32 unchanged, to f64 rounded to even. */
    const int64_t big[] = {((int64_t)1 << 53) + 1, INT64_MIN, INT64_MAX, -1};
    em_tensor *x = em_from_data(big, EM_I64, 1, TU_SIZES(4), em_cpu());
    int64_t o[4];
    ck_assert_int_eq(em_copy_to_host(em_cast(x, EM_I64), o, sizeof o), EM_OK);
    ck_assert(memcmp(o, big, sizeof o) == 0);
    double of[4];
    ck_assert_int_eq(em_copy_to_host(em_cast(x, EM_F64), of, sizeof of), EM_OK);
    ck_assert(of[0] == 0x1p53 && of[1] == -0x1p63 && of[2] == 0x1p63 && of[3] == -1);
    const int32_t small[] = {INT32_MIN, INT32_MAX, 0, -7};
    em_tensor *x32 = em_from_data(small, EM_I32, 1, TU_SIZES(4), em_cpu());
    ck_assert_int_eq(em_copy_to_host(em_cast(x32, EM_I64), o, sizeof o), EM_OK);
    for (int i = 0; i < 4; i++) ck_assert(o[i] == small[i]);
    int32_t o32[4];
    ck_assert_int_eq(em_copy_to_host(em_cast(em_cast(x32, EM_I64), EM_I32), o32, sizeof o32), EM_OK);
    ck_assert(memcmp(o32, small, sizeof o32) == 0);
    ck_assert_int_eq(em_copy_to_host(em_cast(em_cast(x32, EM_F64), EM_I32), o32, sizeof o32), EM_OK);
    ck_assert(memcmp(o32, small, sizeof o32) == 0);
    /* f32 keeps 2^24 + 1 as 2^24 (ties to even). */
    const int32_t i24[] = {(1 << 24) + 1, (1 << 24) + 3};
    const double f24[] = {0x1p24, 0x1p24 + 4};
    CHK("i32 -> f32", em_cast(em_from_data(i24, EM_I32, 1, TU_SIZES(2), em_cpu()), EM_F32), EM_F32,
        1, TU_SIZES(2), f24, 0, 0);
    /* Large and non-contiguous (threads). */
    const int64_t R = 250, C = 301;
    double *lv = rvals(R * C, -1000, 1000, EM_F64);
    em_tensor *lx = mk(lv, 2, TU_SIZES(R, C), EM_F64);
    double *ref = malloc(sizeof(double) * (size_t)(R * C));
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = 0; j < R; j++) ref[i * R + j] = trunc(lv[j * C + i]);
    CHK("large cast", em_cast(em_transpose(lx, 0, 1), EM_I32), EM_I32, 2, TU_SIZES(C, R), ref, 0, 0);
    free(ref);
    free(lv);
    /* Errors. */
    tu_check_fails(em_cast(NULL, EM_F32), EM_ERR_NULL);
    tu_check_fails(em_cast(x, EM_DTYPE_COUNT), EM_ERR_DTYPE);
    tu_check_fails(em_cast(x, (em_dtype)-1), EM_ERR_DTYPE);
}
END_TEST

/* ---- contiguous ---- */

START_TEST(test_contiguous) {
    for (int d = 0; d < 7; d++) {
        em_dtype dt = all_dtypes[d];
        size_t es = em_dtype_size(dt);
        /* Distinct byte patterns; a copy moves bits, whatever they mean. */
        unsigned char raw[4 * 6 * 8], out[4 * 6 * 8], exp_[4 * 6 * 8];
        for (size_t i = 0; i < sizeof raw; i++) raw[i] = (unsigned char)(i * 7 + 3);
        if (dt == EM_BOOL)
            for (size_t i = 0; i < sizeof raw; i++) raw[i] &= 1;
        em_tensor *x = em_from_data(raw, dt, 2, TU_SIZES(4, 6), em_cpu());
        ck_assert_ptr_nonnull(x);
        /* Already contiguous: x itself. */
        em_tensor *same = em_contiguous(x);
        ck_assert(em_shares_storage(same, x));
        /* Transposed. */
        em_tensor *c = em_contiguous(em_transpose(x, 0, 1));
        ck_assert_ptr_nonnull(c);
        ck_assert(em_is_contiguous(c) && !em_shares_storage(c, x));
        ck_assert_int_eq(em_dtype_of(c), dt);
        ck_assert(em_size(c, 0) == 6 && em_size(c, 1) == 4);
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 4; j++) memcpy(exp_ + (i * 4 + j) * es, raw + (j * 6 + i) * es, es);
        ck_assert_int_eq(em_copy_to_host(c, out, 24 * es), EM_OK);
        ck_assert_msg(memcmp(out, exp_, 24 * es) == 0, "transpose %s", em_dtype_name(dt));
        /* Stepped slice with an offset: rows 1..3, columns 1, 4. */
        c = em_contiguous(em_slice(em_slice(x, 0, 1, 4, 1), 1, 1, 6, 3));
        ck_assert(em_is_contiguous(c) && em_size(c, 0) == 3 && em_size(c, 1) == 2);
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 2; j++)
                memcpy(exp_ + (i * 2 + j) * es, raw + ((i + 1) * 6 + 1 + 3 * j) * es, es);
        ck_assert_int_eq(em_copy_to_host(c, out, 6 * es), EM_OK);
        ck_assert_msg(memcmp(out, exp_, 6 * es) == 0, "slice %s", em_dtype_name(dt));
        /* Expanded (stride 0): [4, 1, 6] -> [4, 3, 6]. */
        c = em_contiguous(em_expand(em_unsqueeze(x, 1), 3, TU_SIZES(4, 3, 6)));
        ck_assert(em_is_contiguous(c) && em_numel(c) == 72);
        unsigned char *big = malloc(72 * es), *bexp = malloc(72 * es);
        for (int i = 0; i < 4; i++)
            for (int k = 0; k < 3; k++) memcpy(bexp + (i * 18 + k * 6) * es, raw + i * 6 * es, 6 * es);
        ck_assert_int_eq(em_copy_to_host(c, big, 72 * es), EM_OK);
        ck_assert_msg(memcmp(big, bexp, 72 * es) == 0, "expand %s", em_dtype_name(dt));
        free(big);
        free(bexp);
        /* 0-d view of element (2, 5); size 0. */
        c = em_contiguous(em_squeeze(em_squeeze(em_slice(em_slice(x, 0, 2, 3, 1), 1, 5, 6, 1), 0), 0));
        ck_assert(c && em_ndim(c) == 0);
        ck_assert_int_eq(em_copy_to_host(c, out, es), EM_OK);
        ck_assert(memcmp(out, raw + 17 * es, es) == 0);
        c = em_contiguous(em_transpose(em_slice(x, 1, 2, 2, 1), 0, 1));
        ck_assert(c && em_size(c, 0) == 0 && em_size(c, 1) == 4);
    }
    /* Large transposed: threads split rows. */
    const int64_t R = 301, C = 250;
    double *v = rvals(R * C, -1, 1, EM_F64);
    em_tensor *x = mk(v, 2, TU_SIZES(R, C), EM_F64);
    double *ref = malloc(sizeof(double) * (size_t)(R * C));
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = 0; j < R; j++) ref[i * R + j] = v[j * C + i];
    em_tensor *c = em_contiguous(em_transpose(x, 0, 1));
    ck_assert(em_is_contiguous(c));
    CHK("large contiguous", c, EM_F64, 2, TU_SIZES(C, R), ref, 0, 0);
    free(ref);
    free(v);
    tu_check_fails(em_contiguous(NULL), EM_ERR_NULL);
}
END_TEST

/* Large transposed and permuted copies (the tiled path of contiguous), every
 * element size, sizes that are not multiples of the tile, checked bitwise
 * against references built here from the raw bytes. */
static void check_bytes(const char *ctx, em_dtype dt, const em_tensor *c, const unsigned char *exp_,
                        int64_t n) {
    size_t es = em_dtype_size(dt);
    ck_assert_msg(c != NULL, "%s %s: %s", ctx, em_dtype_name(dt), em_last_error());
    ck_assert_msg(em_is_contiguous(c), "%s %s: not contiguous", ctx, em_dtype_name(dt));
    ck_assert_int_eq(em_numel(c), n);
    unsigned char *out = malloc((size_t)n * es);
    ck_assert_int_eq(em_copy_to_host(c, out, (size_t)n * es), EM_OK);
    for (int64_t i = 0; i < n; i++)
        if (memcmp(out + i * es, exp_ + i * es, es) != 0) {
            free(out);
            ck_abort_msg("%s %s: element %lld differs", ctx, em_dtype_name(dt), (long long)i);
        }
    free(out);
}

START_TEST(test_contiguous_tiled) {
    const int64_t R = 300, C = 517;          /* 2-D */
    const int64_t A = 7, B = 65, D = 130;    /* 3-D */
    for (int d = 0; d < 7; d++) {
        em_dtype dt = all_dtypes[d];
        size_t es = em_dtype_size(dt);
        int64_t n2 = R * C, n3 = A * B * D;
        unsigned char *raw = malloc((size_t)(n2 > n3 ? n2 : n3) * es);
        unsigned char *exp_ = malloc((size_t)(3 * n2 > n3 ? 3 * n2 : n3) * es);
        for (int64_t i = 0; i < (n2 > n3 ? n2 : n3) * (int64_t)es; i++)
            raw[i] = (unsigned char)((i * 2654435761u) >> 13);
        if (dt == EM_BOOL)
            for (int64_t i = 0; i < (n2 > n3 ? n2 : n3); i++) raw[i] &= 1;
#define CP(dst, src) memcpy(exp_ + (size_t)(dst) * es, raw + (size_t)(src) * es, es)
        /* [R, C] transposed: out[i][j] = x[j][i] */
        em_tensor *x = em_from_data(raw, dt, 2, TU_SIZES(R, C), em_cpu());
        ck_assert_ptr_nonnull(x);
        for (int64_t i = 0; i < C; i++)
            for (int64_t j = 0; j < R; j++) CP(i * R + j, j * C + i);
        check_bytes("transpose", dt, em_contiguous(em_transpose(x, 0, 1)), exp_, n2);
        /* every other column, transposed: the small stride is 2 elements */
        int64_t C2 = (C + 1) / 2;
        for (int64_t i = 0; i < C2; i++)
            for (int64_t j = 0; j < R; j++) CP(i * R + j, j * C + 2 * i);
        check_bytes("slice transpose", dt,
                    em_contiguous(em_transpose(em_slice(x, 1, 0, C, 2), 0, 1)), exp_, C2 * R);
        /* rows 5..250 and columns 3..400 transposed: an offset, partial tiles */
        for (int64_t i = 0; i < 397; i++)
            for (int64_t j = 0; j < 245; j++) CP(i * 245 + j, (j + 5) * C + i + 3);
        em_tensor *win = em_slice(em_slice(x, 0, 5, 250, 1), 1, 3, 400, 1);
        check_bytes("window transpose", dt, em_contiguous(em_transpose(win, 0, 1)), exp_, 397 * 245);
        /* [A, B, D]: transpose(0, 2) -> [D, B, A], transpose(1, 2) -> [A, D, B],
         * permute (1, 2, 0) -> [B, D, A] */
        em_tensor *y = em_from_data(raw, dt, 3, TU_SIZES(A, B, D), em_cpu());
        ck_assert_ptr_nonnull(y);
        for (int64_t i = 0; i < D; i++)
            for (int64_t j = 0; j < B; j++)
                for (int64_t k = 0; k < A; k++) CP((i * B + j) * A + k, (k * B + j) * D + i);
        check_bytes("transpose(0, 2)", dt, em_contiguous(em_transpose(y, 0, 2)), exp_, n3);
        for (int64_t i = 0; i < A; i++)
            for (int64_t j = 0; j < D; j++)
                for (int64_t k = 0; k < B; k++) CP((i * D + j) * B + k, (i * B + k) * D + j);
        check_bytes("transpose(1, 2)", dt, em_contiguous(em_transpose(y, 1, 2)), exp_, n3);
        for (int64_t i = 0; i < B; i++)
            for (int64_t j = 0; j < D; j++)
                for (int64_t k = 0; k < A; k++) CP((i * D + j) * A + k, (k * B + i) * D + j);
        check_bytes("permute", dt, em_contiguous(em_permute(y, 3, (const int[]){1, 2, 0})), exp_, n3);
        /* a broadcast (stride 0) dim beside the transposed plane: [3, C, R] */
        for (int64_t b = 0; b < 3; b++)
            for (int64_t i = 0; i < C; i++)
                for (int64_t j = 0; j < R; j++) CP((b * C + i) * R + j, j * C + i);
        check_bytes("expand transpose", dt,
                    em_contiguous(em_expand(em_unsqueeze(em_transpose(x, 0, 1), 0), 3,
                                            TU_SIZES(3, C, R))),
                    exp_, 3 * n2);
#undef CP
        free(raw);
        free(exp_);
    }
}
END_TEST

/* ---- Conversions to integers: one rule in every mode (issue 21, item 2) ----
 * A float becomes an integer truncated, saturated, NaN -> 0 (bool: v != 0);
 * an integer tensor's scalar operand that its dtype does not hold exactly
 * (fractional, NaN, inf, out of range) computes in f32.  Eager, em_compile
 * (fused kernels from libgccjit) and lazy mode must agree with the
 * reference below, computed independently of Ember. */

enum { MODE_EAGER, MODE_COMPILED, MODE_LAZY, N_MODES };
static const char *const mode_names[N_MODES] = {"eager", "compiled", "lazy"};

/* Values that probe the rule: specials, both sides of each boundary. */
static const double conv_values[] = {
    NAN, INFINITY, -INFINITY, 1e20, -1e20, 0.0, -0.0, 0.75, -0.75, 1.5, -2.5,
    2147483647.0, 2147483647.5, 2147483648.0, 2147483649.0, 3e9, 4294967296.0,
    -2147483648.0, -2147483648.5, -2147483649.0, -3e9,
    9223372036854774784.0, 9223372036854775808.0, -9223372036854775808.0, -9223372036854777856.0,
};
#define N_CONV (int)(sizeof conv_values / sizeof conv_values[0])

/* Plain double arithmetic (valgrind runs long double as double): the
 * integer bounds compared as the doubles next to them. */
static int64_t ref_to_int(double v, em_dtype d) {
    if (d == EM_BOOL) return v != 0; /* NaN != 0 */
    if (v != v) return 0;
    double t = trunc(v);
    if (d == EM_I32) return t > 2147483647.0 ? INT32_MAX : t < -2147483648.0 ? INT32_MIN : (int64_t)t;
    /* 2^63 is the first double above INT64_MAX */
    return t >= 9223372036854775808.0 ? INT64_MAX : t < -9223372036854775808.0 ? INT64_MIN : (int64_t)t;
}

/* Element i of t (any strides) as int64 (integer dtypes) or double. */
typedef struct conv_val {
    int64_t i;
    double f;
} conv_val;
static conv_val *read_vals(const em_tensor *t) {
    int64_t n = em_numel(t);
    size_t es = em_dtype_size(em_dtype_of(t));
    unsigned char *raw = malloc((size_t)(n ? n : 1) * es);
    conv_val *v = calloc((size_t)(n ? n : 1), sizeof *v);
    ck_assert_int_eq(em_copy_to_host(t, raw, (size_t)n * es), EM_OK);
    for (int64_t k = 0; k < n; k++) {
        const unsigned char *p = raw + (size_t)k * es;
        switch (em_dtype_of(t)) {
        case EM_I32: { int32_t x; memcpy(&x, p, 4); v[k].i = x; break; }
        case EM_I64: memcpy(&v[k].i, p, 8); break;
        case EM_BOOL: v[k].i = p[0]; break;
        default: v[k].f = decode(p, em_dtype_of(t)); break;
        }
    }
    free(raw);
    return v;
}

/* The layouts every check runs on: x is [n] (contiguous) and its values
 * seen through a transpose, a step-2 slice, a broadcast, size 0, size 1.
 * vals[k] gets the index (into x's values) of element k of the layout. */
enum { LAY_CONTIG, LAY_TRANSPOSED, LAY_STRIDED, LAY_BROADCAST, LAY_EMPTY, LAY_ONE, N_LAYOUTS };
static em_tensor *layout(em_tensor *x, int lay, int *idx) {
    int64_t n = em_size(x, 0);
    switch (lay) {
    case LAY_CONTIG:
        for (int64_t k = 0; k < n; k++) idx[k] = (int)k;
        return x;
    case LAY_TRANSPOSED: { /* [n, 2] view of a [2, n] tensor: x and x again */
        em_tensor *two = em_cat(2, (em_tensor *[]){em_unsqueeze(x, 0), em_unsqueeze(x, 0)}, 0);
        for (int64_t k = 0; k < 2 * n; k++) idx[k] = (int)(k / 2);
        return em_transpose(two, 0, 1);
    }
    case LAY_STRIDED: { /* every other element of [x, x] interleaved */
        em_tensor *two = em_reshape(em_cat(2, (em_tensor *[]){em_unsqueeze(x, 1), em_unsqueeze(x, 1)}, 1),
                                    1, TU_SIZES(2 * n));
        for (int64_t k = 0; k < n; k++) idx[k] = (int)k;
        return em_slice(two, 0, 0, 2 * n, 2);
    }
    case LAY_BROADCAST:
        for (int64_t k = 0; k < 3 * n; k++) idx[k] = (int)(k % n);
        return em_expand(em_unsqueeze(x, 0), 2, TU_SIZES(3, n));
    case LAY_EMPTY: return em_slice(x, 0, 0, 0, 1);
    default: idx[0] = 0; return em_slice(x, 0, 0, 1, 1);
    }
}

/* Runs fn in a mode; compiled mode checks that a native kernel ran. */
static void run_in_mode(int mode, em_fn fn, void *ctx, int nin, em_tensor **in, int nsc,
                        const double *sc, int nout, em_tensor **out) {
    if (mode == MODE_EAGER) {
        ck_assert_msg(fn(ctx, in, sc, out) == EM_OK, "%s", em_last_error());
    } else if (mode == MODE_LAZY) {
        ck_assert_int_eq(em_lazy_begin(), EM_OK);
        em_status s = fn(ctx, in, sc, out);
        ck_assert_int_eq(em_lazy_end(), EM_OK);
        ck_assert_msg(s == EM_OK, "%s", em_last_error());
        ck_assert_int_eq(em_sync(), EM_OK);
    } else {
        em_compile_options o = {.ninputs = nin, .nscalars = nsc, .noutputs = nout,
                                .name = "conv", .backend = "cpu", .recompile_limit = 64};
        em_compiled *f = em_compile(fn, ctx, &o);
        ck_assert_ptr_nonnull(f);
        ck_assert_msg(em_call(f, in, sc, out) == EM_OK, "%s", em_last_error());
        em_compile_stats st;
        ck_assert_int_eq(em_compiled_stats(f, &st), EM_OK);
        ck_assert_msg(st.kernels > 0 && st.eager == 0, "no native kernel ran (%d kernels)", st.kernels);
        em_compiled_free(f);
    }
}

/* out[k] = cast(in[k], dtypes[k % 3]) for every layout k / 3. */
static const em_dtype int_dtypes[3] = {EM_I32, EM_I64, EM_BOOL};
static em_status cast_fn(void *ctx, em_tensor *const *in, const double *sc, em_tensor **out) {
    (void)ctx, (void)sc;
    for (int k = 0; k < 3 * N_LAYOUTS; k++)
        if (!(out[k] = em_cast(in[k / 3], int_dtypes[k % 3]))) return em_last_status();
    return EM_OK;
}

START_TEST(test_int_conversion_cast) {
    int mode = _i % N_MODES;
    em_dtype src = _i / N_MODES ? EM_F64 : EM_F32;
    em_tensor *x = em_from_data(conv_values, EM_F64, 1, TU_SIZES(N_CONV), em_cpu());
    x = em_cast(x, src); /* f32: the test reads back what was stored */
    conv_val *xv = read_vals(x);
    em_tensor *in[N_LAYOUTS], *out[3 * N_LAYOUTS];
    int idx[N_LAYOUTS][3 * N_CONV];
    for (int l = 0; l < N_LAYOUTS; l++) in[l] = layout(x, l, idx[l]);
    run_in_mode(mode, cast_fn, NULL, N_LAYOUTS, in, 0, NULL, 3 * N_LAYOUTS, out);
    for (int k = 0; k < 3 * N_LAYOUTS; k++) {
        int l = k / 3;
        em_dtype d = int_dtypes[k % 3];
        ck_assert_int_eq(em_dtype_of(out[k]), d);
        ck_assert_int_eq(em_numel(out[k]), em_numel(in[l]));
        conv_val *v = read_vals(out[k]);
        for (int64_t e = 0; e < em_numel(out[k]); e++) {
            double s = xv[idx[l][e]].f;
            int64_t want = ref_to_int(s, d);
            ck_assert_msg(v[e].i == want, "%s: cast %s %.17g to %s (layout %d, element %lld): %lld, want %lld",
                          mode_names[mode], em_dtype_name(src), s, em_dtype_name(d), l, (long long)e,
                          (long long)v[e].i, (long long)want);
        }
        free(v);
    }
    free(xv);
}
END_TEST

/* out[k] = where(c, full(value k), in[0]) for each dtype: the fill value
 * reaches the kernel as a constant (lower.c). */
static em_status full_fn(void *ctx, em_tensor *const *in, const double *sc, em_tensor **out) {
    (void)sc;
    em_dtype d = *(const em_dtype *)ctx;
    for (int k = 0; k < N_CONV; k++)
        if (!(out[k] = em_where(in[0], em_full(1, TU_SIZES(4), conv_values[k], d, em_cpu()), in[1])))
            return em_last_status();
    return EM_OK;
}

START_TEST(test_int_conversion_full) {
    int mode = _i % N_MODES;
    em_dtype d = int_dtypes[_i / N_MODES];
    em_tensor *in[2] = {em_full(1, TU_SIZES(4), 1, EM_BOOL, em_cpu()), em_zeros(1, TU_SIZES(4), d, em_cpu())};
    em_tensor *out[N_CONV];
    run_in_mode(mode, full_fn, &d, 2, in, 0, NULL, N_CONV, out);
    for (int k = 0; k < N_CONV; k++) {
        ck_assert_int_eq(em_dtype_of(out[k]), d);
        conv_val *v = read_vals(out[k]);
        int64_t want = ref_to_int(conv_values[k], d);
        for (int e = 0; e < 4; e++)
            ck_assert_msg(v[e].i == want, "%s: full(%.17g, %s): %lld, want %lld", mode_names[mode],
                          conv_values[k], em_dtype_name(d), (long long)v[e].i, (long long)want);
        free(v);
    }
}
END_TEST

/* Scalars for the scalar forms: in range, fractional, both sides of the
 * i32 and i64 boundaries, NaN (5 ops x 12 scalars: one compiled function
 * of at most 64 outputs). */
static const double op_scalars[] = {5, 2.5, 3e9, 4294967296.0, 2147483647.0, 2147483648.0,
                                    -2147483648.0, -2147483649.0, 9223372036854775808.0,
                                    -9223372036854775808.0, 1e20, NAN};
#define N_OPS_SC (int)(sizeof op_scalars / sizeof op_scalars[0])
typedef em_tensor *(*scalar_op_fn)(const em_tensor *, double);
static const scalar_op_fn scalar_ops[] = {em_add_scalar, em_sub_scalar, em_mul_scalar,
                                          em_maximum_scalar, em_minimum_scalar};
#define N_SOPS 5

/* out[o * N + j] = op o (in[0], scalars[j]); the scalars are em_call's. */
static em_status scalar_fn(void *ctx, em_tensor *const *in, const double *sc, em_tensor **out) {
    (void)ctx;
    for (int o = 0; o < N_SOPS; o++)
        for (int j = 0; j < N_OPS_SC; j++)
            if (!(out[o * N_OPS_SC + j] = scalar_ops[o](in[0], sc[j]))) return em_last_status();
    return EM_OK;
}

/* x OP s by the rule: wrapping arithmetic in x's integer dtype when it
 * holds s, else f32 arithmetic (the dtype is returned in *dt). */
static conv_val ref_scalar_op(int op, int64_t x, em_dtype xd, double s, em_dtype *dt) {
    em_dtype cd = xd == EM_BOOL ? EM_I64 : xd;
    double lim = cd == EM_I32 ? 2147483648.0 : 9223372036854775808.0;
    bool holds = isfinite(s) && s == floor(s) && s >= -lim && s < lim;
    conv_val r = {0, 0};
    if (!holds) {
        float a = (float)x, b = (float)s, v;
        switch (op) {
        case 0: v = a + b; break;
        case 1: v = a - b; break;
        case 2: v = a * b; break;
        case 3: v = isnan(b) ? b : a > b ? a : b; break;
        default: v = isnan(b) ? b : a < b ? a : b; break;
        }
        *dt = EM_F32;
        r.f = v;
        return r;
    }
    uint64_t a = (uint64_t)x, b = (uint64_t)(int64_t)s, v;
    switch (op) {
    case 0: v = a + b; break;
    case 1: v = a - b; break;
    case 2: v = a * b; break;
    case 3: v = x > (int64_t)s ? a : b; break;
    default: v = x < (int64_t)s ? a : b; break;
    }
    *dt = cd;
    r.i = cd == EM_I32 ? (int64_t)(int32_t)(uint32_t)v : (int64_t)v;
    return r;
}

START_TEST(test_int_conversion_scalar_ops) {
    /* contiguous, transposed and broadcast inputs (size 0 and 1: the cast test) */
    static const int lays[3] = {LAY_CONTIG, LAY_TRANSPOSED, LAY_BROADCAST};
    int mode = _i % N_MODES, lay = lays[(_i / N_MODES) % 3];
    em_dtype xd = int_dtypes[_i / (N_MODES * 3)];
    static const double xs[] = {1, -1, 0, 2147483647.0, -2147483648.0, 123456789, -98765};
    em_tensor *x = em_cast(em_from_data(xs, EM_F64, 1, TU_SIZES(7), em_cpu()), xd);
    conv_val *xv = read_vals(x);
    int idx[3 * 7];
    em_tensor *in[1] = {layout(x, lay, idx)};
    em_tensor *out[N_SOPS * N_OPS_SC];
    run_in_mode(mode, scalar_fn, NULL, 1, in, N_OPS_SC, op_scalars, N_SOPS * N_OPS_SC, out);
    for (int o = 0; o < N_SOPS; o++) {
        for (int j = 0; j < N_OPS_SC; j++) {
            em_tensor *r = out[o * N_OPS_SC + j];
            ck_assert_int_eq(em_numel(r), em_numel(in[0]));
            conv_val *v = read_vals(r);
            for (int64_t e = 0; e < em_numel(r); e++) {
                em_dtype dt;
                conv_val want = ref_scalar_op(o, xv[idx[e]].i, xd, op_scalars[j], &dt);
                ck_assert_msg(em_dtype_of(r) == dt, "%s: op %d of %s and %.17g: dtype %s, want %s",
                              mode_names[mode], o, em_dtype_name(xd), op_scalars[j],
                              em_dtype_name(em_dtype_of(r)), em_dtype_name(dt));
                bool same = dt == EM_F32 ? (isnan(want.f) ? isnan(v[e].f) : v[e].f == want.f)
                                         : v[e].i == want.i;
                ck_assert_msg(same, "%s: op %d of %s %lld and %.17g (layout %d): %lld / %.9g, want %lld / %.9g",
                              mode_names[mode], o, em_dtype_name(xd), (long long)xv[idx[e]].i,
                              op_scalars[j], lay, (long long)v[e].i, v[e].f, (long long)want.i, want.f);
            }
            free(v);
        }
    }
    free(xv);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("pointwise");
    TCase *tc = tcase_create("unary");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_add_loop_test(tc, test_float_unary_values, 0, N_FLOAT_UNARY);
    tcase_add_loop_test(tc, test_float_unary_special, 0, N_FLOAT_UNARY);
    tcase_add_loop_test(tc, test_num_unary_values, 0, N_NUM_UNARY);
    tcase_add_test(tc, test_sigmoid_extremes);
    tcase_add_test(tc, test_unary_noncontiguous);
    tcase_add_test(tc, test_unary_sizes);
    tcase_add_test(tc, test_unary_errors);
    suite_add_tcase(s, tc);

    tc = tcase_create("binary");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_add_loop_test(tc, test_binary_values, 0, N_BINARY);
    tcase_add_loop_test(tc, test_binary_broadcast, 0, N_BINARY);
    tcase_add_loop_test(tc, test_binary_noncontiguous, 0, N_BINARY);
    tcase_add_loop_test(tc, test_binary_permute, 0, N_BINARY);
    tcase_add_loop_test(tc, test_binary_special, 0, N_BINARY);
    tcase_add_loop_test(tc, test_binary_scalar, 0, N_BINARY);
    tcase_add_loop_test(tc, test_binary_errors, 0, N_BINARY);
    tcase_add_test(tc, test_binary_int_edge);
    tcase_add_test(tc, test_promotion);
    suite_add_tcase(s, tc);

    tc = tcase_create("compare_where");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_add_loop_test(tc, test_compare, 0, 6);
    tcase_add_test(tc, test_where);
    tcase_add_test(tc, test_where_errors);
    suite_add_tcase(s, tc);

    tc = tcase_create("cast_contiguous");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_add_test(tc, test_cast_all_pairs);
    tcase_add_test(tc, test_cast_rounding);
    tcase_add_test(tc, test_cast_special);
    tcase_add_test(tc, test_contiguous);
    tcase_add_test(tc, test_contiguous_tiled);
    suite_add_tcase(s, tc);

    tc = tcase_create("int_conversion");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_int_conversion_cast, 0, 2 * N_MODES);
    tcase_add_loop_test(tc, test_int_conversion_full, 0, 3 * N_MODES);
    tcase_add_loop_test(tc, test_int_conversion_scalar_ops, 0, 3 * 3 * N_MODES);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run(suite()); }
