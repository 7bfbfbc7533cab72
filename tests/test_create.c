/* test_create.c - creation: empty, zeros/ones/full, scalar, arange,
 * from_data, and the Philox generator behind rand/randn.
 *
 * Values are read back raw with em_copy_to_host and decoded here, so these
 * tests do not depend on em_cast. */
#include "testutil.h"

#include <stdio.h>
#include <string.h>

#define decode tu_decode
#define rd tu_raw_values

static const em_dtype all_dtypes[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_BOOL, EM_F16, EM_BF16};

/* t's raw bytes (malloc'd). */
static unsigned char *raw(const em_tensor *t) {
    ck_assert_msg(t != NULL, "NULL tensor: %s", em_last_error());
    int64_t n = em_numel(t);
    size_t nb = (size_t)n * em_dtype_size(em_dtype_of(t));
    unsigned char *b = malloc(nb > 0 ? nb : 1);
    ck_assert_int_eq(em_copy_to_host(t, b, nb), EM_OK);
    return b;
}

static int same(double a, double b) { return (isnan(a) && isnan(b)) || a == b; }

/* Asserts t's dtype, sizes and exact values. */
static void chk_at(int line, const char *ctx, const em_tensor *t, em_dtype dt, int ndim,
                   const int64_t *sizes, const double *ref) {
    ck_assert_msg(t != NULL, "line %d %s: NULL: %s", line, ctx, em_last_error());
    ck_assert_msg(em_dtype_of(t) == dt, "line %d %s: dtype %s", line, ctx,
                  em_dtype_name(em_dtype_of(t)));
    ck_assert_msg(em_ndim(t) == ndim, "line %d %s: ndim %d", line, ctx, em_ndim(t));
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        ck_assert_msg(em_size(t, i) == sizes[i], "line %d %s: size[%d] = %lld", line, ctx, i,
                      (long long)em_size(t, i));
        n *= sizes[i];
    }
    ck_assert_msg(em_numel(t) == n, "line %d %s: numel %lld", line, ctx, (long long)em_numel(t));
    double *v = rd(t);
    for (int64_t i = 0; i < n; i++)
        if (!same(v[i], ref[i])) {
            double a = v[i];
            free(v);
            ck_abort_msg("line %d %s: element %lld is %.17g, expected %.17g", line, ctx,
                         (long long)i, a, ref[i]);
        }
    free(v);
}
#define CHK(ctx, t, dt, ndim, sizes, ref) chk_at(__LINE__, (ctx), (t), (dt), (ndim), (sizes), (ref))

/* ---- empty, full, zeros, ones, scalar ---- */

START_TEST(test_empty) {
    for (int d = 0; d < 7; d++) {
        em_dtype dt = all_dtypes[d];
        em_tensor *t = em_empty(3, TU_SIZES(2, 3, 4), dt, em_cpu());
        ck_assert_msg(t != NULL, "%s", em_last_error());
        ck_assert_int_eq(em_dtype_of(t), dt);
        ck_assert_int_eq(em_ndim(t), 3);
        ck_assert_int_eq(em_numel(t), 24);
        ck_assert(em_is_contiguous(t));
        ck_assert_int_eq(em_stride(t, 0), 12);
        ck_assert_int_eq(em_stride(t, 1), 4);
        ck_assert_int_eq(em_stride(t, 2), 1);
        ck_assert_int_eq(em_offset(t), 0);
        ck_assert_int_eq(em_device_of(t).type, EM_CPU);
        /* Writable and readable in full (valgrind sees any overrun). */
        size_t nb = 24 * em_dtype_size(dt);
        unsigned char *b = malloc(nb);
        ck_assert_int_eq(em_copy_to_host(t, b, nb), EM_OK);
        free(b);
        em_tensor *z = em_empty(2, TU_SIZES(0, 5), dt, em_cpu());
        ck_assert(z && em_numel(z) == 0 && em_size(z, 1) == 5);
        em_tensor *s = em_empty(0, NULL, dt, em_cpu());
        ck_assert(s && em_ndim(s) == 0 && em_numel(s) == 1);
    }
}
END_TEST

/* v as stored in dt: values chosen exact in f16/bf16 except where noted. */
static double conv_ref(double v, em_dtype dt) {
    switch (dt) {
    case EM_F32: return (float)v;
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
    default: return v;
    }
}

START_TEST(test_full) {
    const double vals[] = {0, 1, -2.5, 7.75, -0.0, 96, NAN, INFINITY, -INFINITY, 0.5};
    for (int d = 0; d < 7; d++) {
        em_dtype dt = all_dtypes[d];
        for (int k = 0; k < 10; k++) {
            char ctx[64];
            snprintf(ctx, sizeof ctx, "full %s %g", em_dtype_name(dt), vals[k]);
            double ref[12];
            for (int i = 0; i < 12; i++) ref[i] = conv_ref(vals[k], dt);
            CHK(ctx, em_full(2, TU_SIZES(3, 4), vals[k], dt, em_cpu()), dt, 2, TU_SIZES(3, 4), ref);
            CHK(ctx, em_scalar(vals[k], dt, em_cpu()), dt, 0, NULL, ref);
        }
        double z[6] = {0}, o[6] = {1, 1, 1, 1, 1, 1};
        CHK("zeros", em_zeros(2, TU_SIZES(2, 3), dt, em_cpu()), dt, 2, TU_SIZES(2, 3), z);
        CHK("ones", em_ones(2, TU_SIZES(3, 2), dt, em_cpu()), dt, 2, TU_SIZES(3, 2), o);
        CHK("ones 0-d", em_ones(0, NULL, dt, em_cpu()), dt, 0, NULL, o);
        CHK("zeros size 0", em_zeros(3, TU_SIZES(4, 0, 2), dt, em_cpu()), dt, 3, TU_SIZES(4, 0, 2), z);
        CHK("full size 0", em_full(1, TU_SIZES(0), 5, dt, em_cpu()), dt, 1, TU_SIZES(0), z);
        CHK("full size 1", em_full(4, TU_SIZES(1, 1, 1, 1), 1, dt, em_cpu()), dt, 4, TU_SIZES(1, 1, 1, 1), o);
    }
}
END_TEST

START_TEST(test_full_conversions) {
    /* Integers truncate toward zero and clamp; NaN -> 0; bool is v != 0. */
    const struct { em_dtype dt; double v, want; } cases[] = {
        {EM_I32, 2.9, 2}, {EM_I32, -2.9, -2}, {EM_I32, 1e10, 2147483647.0},
        {EM_I32, -1e10, -2147483648.0}, {EM_I32, NAN, 0}, {EM_I32, INFINITY, 2147483647.0},
        {EM_I64, -1e30, -0x1p63}, {EM_I64, 1e30, 0x1p63}, {EM_I64, NAN, 0}, {EM_I64, 0x1p62, 0x1p62},
        {EM_BOOL, NAN, 1}, {EM_BOOL, 0.0, 0}, {EM_BOOL, -0.0, 0}, {EM_BOOL, 1e-300, 1},
        {EM_BOOL, -7, 1}, {EM_F32, 1e39, INFINITY}, {EM_F32, 0.1, (float)0.1},
        {EM_F16, 1e5, INFINITY}, {EM_F16, 1.0 / 3, 0.333251953125}, {EM_F16, 65504, 65504},
        {EM_F16, 0x1p-24, 0x1p-24}, {EM_BF16, 1.0 / 3, 0.333984375}, {EM_BF16, 1e39, INFINITY},
        {EM_BF16, NAN, NAN}, {EM_F16, NAN, NAN},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char ctx[64];
        snprintf(ctx, sizeof ctx, "full %s %g", em_dtype_name(cases[k].dt), cases[k].v);
        double ref[3] = {cases[k].want, cases[k].want, cases[k].want};
        CHK(ctx, em_full(1, TU_SIZES(3), cases[k].v, cases[k].dt, em_cpu()), cases[k].dt, 1,
            TU_SIZES(3), ref);
    }
    /* Exact bits of i64 and half fills. */
    int64_t i64[2];
    ck_assert_int_eq(em_copy_to_host(em_full(1, TU_SIZES(2), 0x1p62 + 0x1p40, EM_I64, em_cpu()),
                                     i64, sizeof i64), EM_OK);
    ck_assert(i64[0] == ((int64_t)1 << 62) + ((int64_t)1 << 40) && i64[1] == i64[0]);
    uint16_t h[2];
    ck_assert_int_eq(em_copy_to_host(em_full(1, TU_SIZES(2), 1.0 / 3, EM_F16, em_cpu()), h, 4), EM_OK);
    ck_assert_uint_eq(h[0], 0x3555);
    ck_assert_uint_eq(h[1], 0x3555);
    ck_assert_int_eq(em_copy_to_host(em_full(1, TU_SIZES(2), 1.0 / 3, EM_BF16, em_cpu()), h, 4), EM_OK);
    ck_assert_uint_eq(h[0], 0x3eab);
    uint8_t b[2];
    ck_assert_int_eq(em_copy_to_host(em_full(1, TU_SIZES(2), 42, EM_BOOL, em_cpu()), b, 2), EM_OK);
    ck_assert(b[0] == 1 && b[1] == 1); /* stored as 0/1, not 42 */
    double item;
    ck_assert_int_eq(em_item(em_scalar(-3.25, EM_F64, em_cpu()), &item), EM_OK);
    ck_assert(item == -3.25);
    int64_t ii;
    ck_assert_int_eq(em_item_i64(em_scalar(-7, EM_I64, em_cpu()), &ii), EM_OK);
    ck_assert(ii == -7);
}
END_TEST

START_TEST(test_full_large) {
    /* 120001 elements: split across threads; every element size. */
    const int64_t n = 120001;
    for (int d = 0; d < 7; d++) {
        em_dtype dt = all_dtypes[d];
        em_tensor *t = em_full(2, TU_SIZES(1, n), -1.5, dt, em_cpu());
        double *v = rd(t);
        double want = conv_ref(-1.5, dt);
        for (int64_t i = 0; i < n; i++)
            if (v[i] != want) {
                free(v);
                ck_abort_msg("full large %s: element %lld", em_dtype_name(dt), (long long)i);
            }
        free(v);
    }
}
END_TEST

/* ---- arange ---- */

START_TEST(test_arange_values) {
    for (int d = 0; d < 7; d++) {
        em_dtype dt = all_dtypes[d];
        double ref[8];
        for (int i = 0; i < 5; i++) ref[i] = dt == EM_BOOL ? i != 0 : i;
        CHK(em_dtype_name(dt), em_arange(0, 5, 1, dt, em_cpu()), dt, 1, TU_SIZES(5), ref);
        for (int i = 0; i < 4; i++) ref[i] = conv_ref(5 - 2 * i, dt);
        CHK(em_dtype_name(dt), em_arange(5, -3, -2, dt, em_cpu()), dt, 1, TU_SIZES(4), ref);
        CHK("empty", em_arange(0, 0, 1, dt, em_cpu()), dt, 1, TU_SIZES(0), ref);
        CHK("wrong direction", em_arange(5, 0, 1, dt, em_cpu()), dt, 1, TU_SIZES(0), ref);
        ref[0] = conv_ref(3, dt);
        CHK("one", em_arange(3, 3.5, 1, dt, em_cpu()), dt, 1, TU_SIZES(1), ref);
    }
    /* ceil((end - start) / step) elements. */
    double ref[16];
    for (int i = 0; i < 4; i++) ref[i] = 3 * i;
    CHK("0:10:3", em_arange(0, 10, 3, EM_I64, em_cpu()), EM_I64, 1, TU_SIZES(4), ref);
    for (int i = 0; i < 10; i++) ref[i] = 0 + i * 0.1;
    CHK("0:1:0.1 f64", em_arange(0, 1, 0.1, EM_F64, em_cpu()), EM_F64, 1, TU_SIZES(10), ref);
    for (int i = 0; i < 10; i++) ref[i] = (float)(0 + i * 0.1);
    CHK("0:1:0.1 f32", em_arange(0, 1, 0.1, EM_F32, em_cpu()), EM_F32, 1, TU_SIZES(10), ref);
    for (int i = 0; i < 5; i++) ref[i] = 1.5 + 0.5 * i;
    CHK("1.5:4:0.5 f32", em_arange(1.5, 4, 0.5, EM_F32, em_cpu()), EM_F32, 1, TU_SIZES(5), ref);
    for (int i = 0; i < 8; i++) ref[i] = 0.5 * i;
    CHK("0:4:0.5 f16", em_arange(0, 4, 0.5, EM_F16, em_cpu()), EM_F16, 1, TU_SIZES(8), ref);
    CHK("0:4:0.5 bf16", em_arange(0, 4, 0.5, EM_BF16, em_cpu()), EM_BF16, 1, TU_SIZES(8), ref);
    /* Non-integral steps into integers: computed in double, truncated. */
    const double r1[] = {-3, -1, 0, 1};
    CHK("-3:3:1.5 i32", em_arange(-3, 3, 1.5, EM_I32, em_cpu()), EM_I32, 1, TU_SIZES(4), r1);
    const double r2[] = {0, 0, 1, 1, 2};
    CHK("0:2.5:0.5 i64", em_arange(0, 2.5, 0.5, EM_I64, em_cpu()), EM_I64, 1, TU_SIZES(5), r2);
    const double r3[] = {1, 0, 1}; /* -0.5, 0, 0.5 */
    CHK("-0.5:1:0.5 bool", em_arange(-0.5, 1, 0.5, EM_BOOL, em_cpu()), EM_BOOL, 1, TU_SIZES(3), r3);
}
END_TEST

/* arange into i32 past its range: the values, exact in i64, convert by
 * the one rule (saturated), as em_cast of the i64 arange does (issue 21,
 * item 2: they wrapped). */
START_TEST(test_arange_saturates_i32) {
    em_tensor *t = em_arange(0, 5e9, 1e9, EM_I32, em_cpu());
    ck_assert_msg(t != NULL, "%s", em_last_error());
    int32_t v[5];
    ck_assert_int_eq(em_copy_to_host(t, v, sizeof v), EM_OK);
    const int32_t want[5] = {0, 1000000000, 2000000000, INT32_MAX, INT32_MAX};
    for (int i = 0; i < 5; i++) ck_assert_int_eq(v[i], want[i]);
    t = em_arange(-1e9, -5e9, -1e9, EM_I32, em_cpu());
    ck_assert_int_eq(em_copy_to_host(t, v, 4 * sizeof *v), EM_OK);
    ck_assert_int_eq(v[1], -2000000000);
    ck_assert_int_eq(v[2], INT32_MIN);
    ck_assert_int_eq(v[3], INT32_MIN);
    /* and i64 past its range */
    int64_t w[4];
    t = em_arange(0, 2e19, 5e18, EM_I64, em_cpu());
    ck_assert_int_eq(em_copy_to_host(t, w, sizeof w), EM_OK);
    ck_assert(w[0] == 0 && w[1] == 5000000000000000000 && w[2] == INT64_MAX && w[3] == INT64_MAX);
    t = em_arange(-5e18, -2.5e19, -5e18, EM_I64, em_cpu());
    ck_assert_int_eq(em_copy_to_host(t, w, sizeof w), EM_OK);
    ck_assert(w[0] == -5000000000000000000 && w[1] == INT64_MIN && w[2] == INT64_MIN &&
              w[3] == INT64_MIN);
}
END_TEST

START_TEST(test_arange_exact_int) {
    /* Integral start and step compute in int64: exact past 2^53. */
    em_tensor *t = em_arange(0x1p53, 0x1p53 + 4, 1, EM_I64, em_cpu());
    ck_assert_msg(t != NULL, "%s", em_last_error());
    ck_assert_int_eq(em_numel(t), 4);
    int64_t v[4];
    ck_assert_int_eq(em_copy_to_host(t, v, sizeof v), EM_OK);
    for (int i = 0; i < 4; i++) ck_assert(v[i] == ((int64_t)1 << 53) + i);
    t = em_arange(-0x1p60, -0x1p60 + 512, 7, EM_I64, em_cpu()); /* 74 values */
    ck_assert(t && em_numel(t) == 74);
    int64_t w[74];
    ck_assert_int_eq(em_copy_to_host(t, w, sizeof w), EM_OK);
    for (int i = 0; i < 74; i++) ck_assert(w[i] == -((int64_t)1 << 60) + 7 * i);
    t = em_arange(10, -10, -3, EM_I32, em_cpu()); /* 10 7 4 1 -2 -5 -8 */
    ck_assert(t && em_numel(t) == 7);
    int32_t u[7];
    ck_assert_int_eq(em_copy_to_host(t, u, sizeof u), EM_OK);
    for (int i = 0; i < 7; i++) ck_assert_int_eq(u[i], 10 - 3 * i);
    /* Large: threads; i32 and f32 hold these exactly. */
    const int64_t n = 100003;
    const em_dtype dts[] = {EM_I32, EM_I64, EM_F32, EM_F64};
    for (int d = 0; d < 4; d++) {
        em_tensor *a = em_arange(-50000, 50003, 1, dts[d], em_cpu());
        ck_assert(a && em_numel(a) == n);
        double *x = rd(a);
        for (int64_t i = 0; i < n; i++)
            if (x[i] != (double)(i - 50000)) {
                free(x);
                ck_abort_msg("arange large %s: element %lld", em_dtype_name(dts[d]), (long long)i);
            }
        free(x);
    }
    em_tensor *q = em_arange(0, n * 0.25, 0.25, EM_F64, em_cpu());
    ck_assert(q && em_numel(q) == n);
    double *x = rd(q);
    for (int64_t i = 0; i < n; i++) ck_assert(x[i] == 0 + (double)i * 0.25);
    free(x);
}
END_TEST

START_TEST(test_arange_errors) {
    tu_check_fails(em_arange(0, 5, 0, EM_F32, em_cpu()), EM_ERR_ARG);
    tu_check_fails(em_arange(0, 5, -0.0, EM_I32, em_cpu()), EM_ERR_ARG);
    tu_check_fails(em_arange(NAN, 5, 1, EM_F32, em_cpu()), EM_ERR_ARG);
    tu_check_fails(em_arange(0, INFINITY, 1, EM_F32, em_cpu()), EM_ERR_ARG);
    tu_check_fails(em_arange(0, 5, NAN, EM_F64, em_cpu()), EM_ERR_ARG);
    tu_check_fails(em_arange(0, 1e300, 1, EM_F64, em_cpu()), EM_ERR_OVERFLOW);
    tu_check_fails(em_arange(0, 5, 1, EM_DTYPE_COUNT, em_cpu()), EM_ERR_DTYPE);
}
END_TEST

/* ---- from_data and creation errors ---- */

START_TEST(test_from_data) {
    unsigned char bytes[6 * 8];
    for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = (unsigned char)(i * 37 + 1);
    for (int d = 0; d < 7; d++) {
        em_dtype dt = all_dtypes[d];
        size_t es = em_dtype_size(dt);
        unsigned char src[6 * 8];
        memcpy(src, bytes, sizeof src);
        if (dt == EM_BOOL)
            for (size_t i = 0; i < sizeof src; i++) src[i] &= 1;
        em_tensor *t = em_from_data(src, dt, 2, TU_SIZES(2, 3), em_cpu());
        ck_assert_msg(t != NULL, "%s", em_last_error());
        ck_assert(em_is_contiguous(t) && em_numel(t) == 6 && em_dtype_of(t) == dt);
        unsigned char *b = raw(t);
        ck_assert(memcmp(b, src, 6 * es) == 0);
        free(b);
        /* The tensor owns a copy. */
        src[0] ^= 1;
        b = raw(t);
        ck_assert(b[0] != src[0]);
        free(b);
        em_tensor *z = em_from_data(src, dt, 1, TU_SIZES(0), em_cpu());
        ck_assert(z && em_numel(z) == 0);
    }
}
END_TEST

START_TEST(test_creation_errors) {
    const double v[4] = {1, 2, 3, 4};
    em_device cpu = em_cpu();
    tu_check_fails(em_from_data(NULL, EM_F64, 1, TU_SIZES(4), cpu), EM_ERR_NULL);
    tu_check_fails(em_from_data(v, EM_F64, 2, NULL, cpu), EM_ERR_NULL);
    tu_check_fails(em_from_data(v, EM_F64, 1, TU_SIZES(-1), cpu), EM_ERR_ARG);
    tu_check_fails(em_from_data(v, EM_DTYPE_COUNT, 1, TU_SIZES(4), cpu), EM_ERR_DTYPE);
    tu_check_fails(em_from_data(v, EM_F64, -1, TU_SIZES(4), cpu), EM_ERR_DIM);
    tu_check_fails(em_from_data(v, EM_F64, EM_MAX_DIMS + 1,
                                TU_SIZES(1, 1, 1, 1, 1, 1, 1, 1, 1), cpu), EM_ERR_DIM);
    /* Sizes whose product, or byte count, overflows. */
    const int64_t big2[] = {(int64_t)1 << 40, (int64_t)1 << 40};
    const int64_t bytes[] = {(int64_t)1 << 62};
    const int64_t max2[] = {INT64_MAX, 2};
    tu_check_fails(em_empty(2, big2, EM_F32, cpu), EM_ERR_OVERFLOW);
    tu_check_fails(em_zeros(1, bytes, EM_F64, cpu), EM_ERR_OVERFLOW);
    tu_check_fails(em_ones(2, max2, EM_BOOL, cpu), EM_ERR_OVERFLOW);
    tu_check_fails(em_from_data(v, EM_F32, 2, big2, cpu), EM_ERR_OVERFLOW);
    tu_check_fails(em_full(2, big2, 1, EM_I32, cpu), EM_ERR_OVERFLOW);
    /* A size-0 dim does not make other sizes harmless: the contiguous
     * strides of [0, 2^40, 2^40] overflow int64 (issue 21, item 17); the
     * largest shapes whose strides fit still work. */
    tu_check_fails(em_empty(3, TU_SIZES(0, (int64_t)1 << 40, (int64_t)1 << 40), EM_F32, cpu),
                   EM_ERR_OVERFLOW);
    em_tensor *z = em_empty(3, TU_SIZES(0, (int64_t)1 << 40, (int64_t)1 << 22), EM_F32, cpu);
    ck_assert_msg(z && em_numel(z) == 0, "%s", em_last_error());
    for (int d = 0; d < 7; d++) {
        tu_check_fails(em_empty(2, TU_SIZES(3, -2), all_dtypes[d], cpu), EM_ERR_ARG);
        tu_check_fails(em_zeros(1, TU_SIZES(-1), all_dtypes[d], cpu), EM_ERR_ARG);
        tu_check_fails(em_full(2, NULL, 1, all_dtypes[d], cpu), EM_ERR_NULL);
        tu_check_fails(em_ones(EM_MAX_DIMS + 1, TU_SIZES(1, 1, 1, 1, 1, 1, 1, 1, 1), all_dtypes[d], cpu),
                       EM_ERR_DIM);
    }
    tu_check_fails(em_empty(1, TU_SIZES(2), (em_dtype)-1, cpu), EM_ERR_DTYPE);
    tu_check_fails(em_full(1, TU_SIZES(2), 0, EM_DTYPE_COUNT, cpu), EM_ERR_DTYPE);
    tu_check_fails(em_scalar(0, EM_DTYPE_COUNT, cpu), EM_ERR_DTYPE);
    if (!em_device_available(em_cuda(0))) {
        tu_check_fails(em_zeros(1, TU_SIZES(2), EM_F32, em_cuda(0)), EM_ERR_DEVICE);
        tu_check_fails(em_from_data(v, EM_F64, 1, TU_SIZES(4), em_cuda(0)), EM_ERR_DEVICE);
    }
}
END_TEST

/* ---- rand, randn ---- */

#define NS 100000

static void moments(const double *v, int64_t n, double *mean, double *var) {
    double s = 0, ss = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    *mean = s / n;
    for (int64_t i = 0; i < n; i++) ss += (v[i] - *mean) * (v[i] - *mean);
    *var = ss / (n - 1);
}

START_TEST(test_rand_stats) {
    em_dtype dt = _i ? EM_F64 : EM_F32;
    em_generator *g = em_generator_new(20240601);
    ck_assert_ptr_nonnull(g);
    em_tensor *t = em_rand(g, 2, TU_SIZES(100, NS / 100), dt, em_cpu());
    ck_assert_msg(t != NULL, "%s", em_last_error());
    ck_assert_int_eq(em_dtype_of(t), dt);
    ck_assert(em_size(t, 0) == 100 && em_size(t, 1) == NS / 100);
    double *v = rd(t);
    int hist[10] = {0};
    int64_t fine = 0, finer = 0; /* values finer than 2^-24, than 2^-32 */
    for (int64_t i = 0; i < NS; i++) {
        ck_assert_msg(v[i] >= 0 && v[i] < 1, "rand %s element %lld = %.17g", em_dtype_name(dt),
                      (long long)i, v[i]);
        hist[(int)(v[i] * 10)]++;
        if (v[i] * 0x1p24 != floor(v[i] * 0x1p24)) fine++;
        if (v[i] * 0x1p32 != floor(v[i] * 0x1p32)) finer++;
    }
    double mean, var;
    moments(v, NS, &mean, &var);
    ck_assert_msg(fabs(mean - 0.5) < 0.005, "rand mean %g", mean);
    ck_assert_msg(fabs(var - 1.0 / 12) < 0.003, "rand var %g", var);
    for (int b = 0; b < 10; b++)
        ck_assert_msg(abs(hist[b] - NS / 10) < 600, "rand bin %d: %d", b, hist[b]);
    /* f32 draws 24 bits, f64 53: nearly every f64 value is finer than 2^-32. */
    if (dt == EM_F32) ck_assert_int_eq(fine, 0);
    else ck_assert_msg(fine > NS * 0.99 && finer > NS * 0.99,
                       "f64 rand: only %lld/%lld values use more than 24/32 bits",
                       (long long)fine, (long long)finer);
    /* Adjacent values are not correlated. */
    double c = 0;
    for (int64_t i = 0; i + 1 < NS; i++) c += (v[i] - mean) * (v[i + 1] - mean);
    c /= (NS - 1) * var;
    ck_assert_msg(fabs(c) < 0.02, "rand lag-1 correlation %g", c);
    free(v);
    em_generator_free(g);
}
END_TEST

START_TEST(test_randn_stats) {
    em_dtype dt = _i ? EM_F64 : EM_F32;
    em_generator *g = em_generator_new(99);
    em_tensor *t = em_randn(g, 1, TU_SIZES(NS), dt, em_cpu());
    ck_assert_msg(t != NULL, "%s", em_last_error());
    ck_assert_int_eq(em_dtype_of(t), dt);
    double *v = rd(t);
    int64_t in1 = 0, in2 = 0;
    double m3 = 0, m4 = 0, mean, var;
    for (int64_t i = 0; i < NS; i++) {
        ck_assert_msg(isfinite(v[i]) && fabs(v[i]) < 7, "randn element %lld = %g", (long long)i, v[i]);
        in1 += fabs(v[i]) < 1;
        in2 += fabs(v[i]) < 2;
    }
    moments(v, NS, &mean, &var);
    for (int64_t i = 0; i < NS; i++) {
        double z = (v[i] - mean) / sqrt(var);
        m3 += z * z * z;
        m4 += z * z * z * z;
    }
    m3 /= NS;
    m4 /= NS;
    ck_assert_msg(fabs(mean) < 0.02, "randn mean %g", mean);
    ck_assert_msg(fabs(var - 1) < 0.03, "randn var %g", var);
    ck_assert_msg(fabs(m3) < 0.05, "randn skewness %g", m3);
    ck_assert_msg(fabs(m4 - 3) < 0.1, "randn kurtosis %g", m4);
    ck_assert_msg(fabs((double)in1 / NS - 0.682689) < 0.01, "randn P(|z|<1) %g", (double)in1 / NS);
    ck_assert_msg(fabs((double)in2 / NS - 0.954500) < 0.005, "randn P(|z|<2) %g", (double)in2 / NS);
    free(v);
    em_generator_free(g);
}
END_TEST

typedef em_tensor *(*rand_fn)(em_generator *, int, const int64_t *, em_dtype, em_device);

static int bytes_equal(const em_tensor *a, const em_tensor *b) {
    ck_assert(em_numel(a) == em_numel(b) && em_dtype_of(a) == em_dtype_of(b));
    unsigned char *x = raw(a), *y = raw(b);
    int eq = memcmp(x, y, (size_t)em_numel(a) * em_dtype_size(em_dtype_of(a))) == 0;
    free(x);
    free(y);
    return eq;
}

/* _i: bit 0 picks f32/f64, bit 1 rand/randn. */
START_TEST(test_rand_determinism) {
    em_dtype dt = (_i & 1) ? EM_F64 : EM_F32;
    rand_fn fn = (_i & 2) ? em_randn : em_rand;
    size_t es = em_dtype_size(dt);
    em_generator *g1 = em_generator_new(42), *g2 = em_generator_new(42), *g3 = em_generator_new(43);
    ck_assert(em_generator_seed(g1) == 42 && em_generator_offset(g1) == 0);
    /* Same seed, same values; another seed, others. */
    em_tensor *a = fn(g1, 2, TU_SIZES(10, 100), dt, em_cpu());
    em_tensor *b = fn(g2, 2, TU_SIZES(10, 100), dt, em_cpu());
    em_tensor *c = fn(g3, 2, TU_SIZES(10, 100), dt, em_cpu());
    ck_assert(bytes_equal(a, b));
    ck_assert(!bytes_equal(a, c));
    /* The offset advances by numel; the next draw differs. */
    ck_assert(em_generator_offset(g1) == 1000);
    em_tensor *a2 = fn(g1, 2, TU_SIZES(10, 100), dt, em_cpu());
    ck_assert(em_generator_offset(g1) == 2000);
    ck_assert(!bytes_equal(a, a2));
    /* Chunking does not matter: [1000] from a fresh generator equals
     * [400] then [2, 300] from another. */
    em_generator *h1 = em_generator_new(7), *h2 = em_generator_new(7);
    em_tensor *whole = fn(h1, 1, TU_SIZES(1000), dt, em_cpu());
    em_tensor *p1 = fn(h2, 1, TU_SIZES(400), dt, em_cpu());
    em_tensor *p2 = fn(h2, 2, TU_SIZES(2, 300), dt, em_cpu());
    ck_assert(em_generator_offset(h1) == 1000 && em_generator_offset(h2) == 1000);
    unsigned char *w = raw(whole), *x1 = raw(p1), *x2 = raw(p2);
    ck_assert(memcmp(w, x1, 400 * es) == 0);
    ck_assert(memcmp(w + 400 * es, x2, 600 * es) == 0);
    free(w);
    free(x1);
    free(x2);
    /* Independent of threads: one large draw (split across threads) equals
     * 40 small ones (each on one thread). */
    em_generator *k1 = em_generator_new(123), *k2 = em_generator_new(123);
    const int64_t N = 40000;
    em_tensor *big = fn(k1, 1, TU_SIZES(N), dt, em_cpu());
    unsigned char *bb = raw(big);
    for (int i = 0; i < 40; i++) {
        em_tensor *s = fn(k2, 2, TU_SIZES(10, 100), dt, em_cpu());
        unsigned char *sb = raw(s);
        int eq = memcmp(bb + (size_t)i * 1000 * es, sb, 1000 * es) == 0;
        free(sb);
        if (!eq) {
            free(bb);
            ck_abort_msg("chunk %d of a large draw differs from the small draw", i);
        }
    }
    free(bb);
    ck_assert(em_generator_offset(k1) == (uint64_t)N && em_generator_offset(k2) == (uint64_t)N);
    /* Size 0 draws nothing; 0-d draws one value. */
    em_tensor *z = fn(k1, 2, TU_SIZES(0, 5), dt, em_cpu());
    ck_assert(z && em_numel(z) == 0 && em_size(z, 1) == 5);
    ck_assert(em_generator_offset(k1) == (uint64_t)N);
    em_tensor *s0 = fn(k1, 0, NULL, dt, em_cpu());
    ck_assert(s0 && em_ndim(s0) == 0);
    ck_assert(em_generator_offset(k1) == (uint64_t)N + 1);
    em_generator_free(g1);
    em_generator_free(g2);
    em_generator_free(g3);
    em_generator_free(h1);
    em_generator_free(h2);
    em_generator_free(k1);
    em_generator_free(k2);
}
END_TEST

START_TEST(test_rand_mixed) {
    /* rand and randn share the counter: randn after 500 rand values is the
     * same as randn on a generator that skipped those 500. */
    em_generator *g1 = em_generator_new(5), *g2 = em_generator_new(5);
    em_tensor *u = em_rand(g1, 1, TU_SIZES(500), EM_F64, em_cpu());
    ck_assert_ptr_nonnull(u);
    em_tensor *n1 = em_randn(g1, 1, TU_SIZES(300), EM_F32, em_cpu());
    em_tensor *skip = em_randn(g2, 1, TU_SIZES(500), EM_F32, em_cpu());
    ck_assert_ptr_nonnull(skip);
    em_tensor *n2 = em_randn(g2, 1, TU_SIZES(300), EM_F32, em_cpu());
    ck_assert(bytes_equal(n1, n2));
    ck_assert(em_generator_offset(g1) == 800);
    /* f32 and f64 draws from the same counters differ only in precision
     * for rand: the f32 value is the f64 one's top 24 bits. */
    em_generator *a = em_generator_new(77), *b = em_generator_new(77);
    em_tensor *f = em_rand(a, 1, TU_SIZES(1000), EM_F32, em_cpu());
    em_tensor *d = em_rand(b, 1, TU_SIZES(1000), EM_F64, em_cpu());
    double *fv = rd(f), *dv = rd(d);
    for (int i = 0; i < 1000; i++)
        ck_assert_msg(fv[i] == floor(dv[i] * 0x1p24) * 0x1p-24, "element %d: %.17g vs %.17g", i,
                      fv[i], dv[i]);
    free(fv);
    free(dv);
    em_generator_free(a);
    em_generator_free(b);
    em_generator_free(g1);
    em_generator_free(g2);
}
END_TEST

START_TEST(test_rand_errors) {
    em_generator *g = em_generator_new(1);
    const em_dtype bad[] = {EM_I32, EM_I64, EM_BOOL, EM_F16, EM_BF16};
    for (int i = 0; i < 5; i++) {
        tu_check_fails(em_rand(g, 1, TU_SIZES(4), bad[i], em_cpu()), EM_ERR_DTYPE);
        tu_check_fails(em_randn(g, 1, TU_SIZES(4), bad[i], em_cpu()), EM_ERR_DTYPE);
    }
    tu_check_fails(em_rand(NULL, 1, TU_SIZES(4), EM_F32, em_cpu()), EM_ERR_NULL);
    tu_check_fails(em_randn(NULL, 1, TU_SIZES(4), EM_F32, em_cpu()), EM_ERR_NULL);
    tu_check_fails(em_rand(g, 1, TU_SIZES(-4), EM_F32, em_cpu()), EM_ERR_ARG);
    tu_check_fails(em_randn(g, 2, NULL, EM_F64, em_cpu()), EM_ERR_NULL);
    const int64_t big2[] = {(int64_t)1 << 40, (int64_t)1 << 40};
    tu_check_fails(em_rand(g, 2, big2, EM_F32, em_cpu()), EM_ERR_OVERFLOW);
    tu_check_fails(em_randn(g, EM_MAX_DIMS + 1, TU_SIZES(1, 1, 1, 1, 1, 1, 1, 1, 1), EM_F32, em_cpu()),
                   EM_ERR_DIM);
    /* Failed draws consume nothing. */
    ck_assert(em_generator_offset(g) == 0);
    ck_assert(em_generator_offset(NULL) == 0);
    em_generator_free(g);
    em_generator_free(NULL);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("create");
    TCase *tc = tcase_create("fill");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_add_test(tc, test_empty);
    tcase_add_test(tc, test_full);
    tcase_add_test(tc, test_full_conversions);
    tcase_add_test(tc, test_full_large);
    tcase_add_test(tc, test_from_data);
    tcase_add_test(tc, test_creation_errors);
    suite_add_tcase(s, tc);

    tc = tcase_create("arange");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_add_test(tc, test_arange_values);
    tcase_add_test(tc, test_arange_exact_int);
    tcase_add_test(tc, test_arange_saturates_i32);
    tcase_add_test(tc, test_arange_errors);
    suite_add_tcase(s, tc);

    tc = tcase_create("random");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_add_loop_test(tc, test_rand_stats, 0, 2);
    tcase_add_loop_test(tc, test_randn_stats, 0, 2);
    tcase_add_loop_test(tc, test_rand_determinism, 0, 4);
    tcase_add_test(tc, test_rand_mixed);
    tcase_add_test(tc, test_rand_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run(suite()); }
