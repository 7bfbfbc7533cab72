/* test_reduce.c - em_sum em_mean em_amax em_amin em_var em_argmax against
 * float64 references computed here from the inputs' values. */
#include "testutil.h"

#include <stdio.h>
#include <string.h>

static const em_dtype NUM5[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_BOOL};
#define NNUM5 5

typedef enum { RS_SUM, RS_MEAN, RS_AMAX, RS_AMIN, RS_VAR } rkind;
static const rkind ALL_KINDS[] = {RS_SUM, RS_MEAN, RS_AMAX, RS_AMIN, RS_VAR};
#define NKINDS 5

static em_tensor *call(rkind k, const em_tensor *x, int nd, const int *dims, bool keep,
                       int corr) {
    switch (k) {
    case RS_SUM: return em_sum(x, nd, dims, keep);
    case RS_MEAN: return em_mean(x, nd, dims, keep);
    case RS_AMAX: return em_amax(x, nd, dims, keep);
    case RS_AMIN: return em_amin(x, nd, dims, keep);
    case RS_VAR: return em_var(x, nd, dims, corr, keep);
    }
    return NULL;
}

static em_dtype expected_dtype(rkind k, em_dtype in) {
    switch (k) {
    case RS_SUM: return em_dtype_is_float(in) ? in : EM_I64;
    case RS_MEAN:
    case RS_VAR: return in == EM_F64 ? EM_F64 : EM_F32;
    default: return in;
    }
}

/* The reference: out[o] over the kept dims (row-major), from v. */
static void ref_reduce(rkind k, const double *v, int ndim, const int64_t *sizes,
                       const bool *red, int corr, double *out, int64_t nout) {
    int64_t numel = 1, N = 1;
    for (int d = 0; d < ndim; d++) {
        numel *= sizes[d];
        if (red[d]) N *= sizes[d];
    }
    double *mean = calloc((size_t)(nout > 0 ? nout : 1), sizeof(double));
    for (int64_t o = 0; o < nout; o++)
        out[o] = k == RS_AMAX ? -INFINITY : k == RS_AMIN ? INFINITY : 0.0;
    int64_t idx[EM_MAX_DIMS] = {0};
    for (int pass = 0; pass < (k == RS_VAR ? 2 : 1); pass++) {
        if (numel == 0) break;
        memset(idx, 0, sizeof idx);
        do {
            int64_t o = 0;
            for (int d = 0; d < ndim; d++)
                if (!red[d]) o = o * sizes[d] + idx[d];
            double x = v[tu_flat(ndim, sizes, idx)];
            switch (k) {
            case RS_SUM:
            case RS_MEAN: out[o] += x; break;
            case RS_AMAX:
                if (isnan(x) || x > out[o]) out[o] = isnan(out[o]) ? out[o] : x;
                break;
            case RS_AMIN:
                if (isnan(x) || x < out[o]) out[o] = isnan(out[o]) ? out[o] : x;
                break;
            case RS_VAR:
                if (pass == 0) mean[o] += x;
                else out[o] += (x - mean[o]) * (x - mean[o]);
                break;
            }
        } while (tu_next(ndim, sizes, idx));
        if (k == RS_VAR && pass == 0)
            for (int64_t o = 0; o < nout; o++) mean[o] /= (double)N;
    }
    if (k == RS_VAR && numel == 0)
        for (int64_t o = 0; o < nout; o++) mean[o] = NAN;
    for (int64_t o = 0; o < nout; o++) {
        if (k == RS_MEAN) out[o] /= (double)N;
        if (k == RS_VAR) {
            double den = (double)N - corr;
            out[o] = out[o] / (den > 0 ? den : 0.0);
            if (N == 0) out[o] = NAN;
        }
    }
    free(mean);
}

static void tols(em_dtype d, double *rtol, double *atol) {
    if (d == EM_F32) {
        *rtol = 2e-6;
        *atol = 1e-6;
    } else if (d == EM_F64) {
        *rtol = 1e-12;
        *atol = 1e-12;
    } else {
        *rtol = 0;
        *atol = 0;
    }
}

/* Runs reduction k of x and checks dtype, shape and values. */
static void check_red_at(int line, rkind k, const em_tensor *x, int nd, const int *dims,
                         bool keep, int corr) {
    ck_assert_msg(x != NULL, "line %d: input is NULL: %s", line, em_last_error());
    int n = em_ndim(x);
    const int64_t *sizes = em_sizes(x);
    bool red[EM_MAX_DIMS] = {false};
    if (nd == 0)
        for (int d = 0; d < n; d++) red[d] = true;
    for (int i = 0; i < nd && n > 0; i++) red[dims[i] < 0 ? dims[i] + n : dims[i]] = true;
    int64_t osz[EM_MAX_DIMS], nout = 1;
    int ond = 0;
    for (int d = 0; d < n; d++) {
        if (!red[d]) {
            osz[ond++] = sizes[d];
            nout *= sizes[d];
        } else if (keep) {
            osz[ond++] = 1;
        }
    }
    double *v = tu_values(x);
    double *ref = malloc(sizeof(double) * (size_t)(nout > 0 ? nout : 1));
    ref_reduce(k, v, n, sizes, red, corr, ref, nout);
    em_tensor *r = call(k, x, nd, dims, keep, corr);
    ck_assert_msg(r != NULL, "line %d: kind %d failed: %s", line, (int)k, em_last_error());
    em_dtype ed = expected_dtype(k, em_dtype_of(x));
    ck_assert_msg(em_dtype_of(r) == ed, "line %d: kind %d of %s gave %s, expected %s", line,
                  (int)k, em_dtype_name(em_dtype_of(x)), em_dtype_name(em_dtype_of(r)),
                  em_dtype_name(ed));
    double rtol, atol;
    tols(ed, &rtol, &atol);
    tu_check_close_at(__FILE__, line, r, ref, ond, osz, rtol, atol);
    free(v);
    free(ref);
}
#define check_red(k, x, nd, dims, keep, corr) check_red_at(__LINE__, k, x, nd, dims, keep, corr)

/* argmax reference: first max, first NaN wins. */
static void check_argmax_at(int line, const em_tensor *x, int dim, bool keep) {
    int n = em_ndim(x);
    const int64_t *sizes = em_sizes(x);
    int d = n == 0 ? 0 : (dim < 0 ? dim + n : dim);
    double *v = tu_values(x);
    int64_t osz[EM_MAX_DIMS], nout = 1;
    int ond = 0;
    for (int i = 0; i < n; i++) {
        if (i != d) {
            osz[ond++] = sizes[i];
            nout *= sizes[i];
        } else if (keep) {
            osz[ond++] = 1;
        }
    }
    double *ref = malloc(sizeof(double) * (size_t)(nout > 0 ? nout : 1));
    double *best = malloc(sizeof(double) * (size_t)(nout > 0 ? nout : 1));
    for (int64_t o = 0; o < nout; o++) ref[o] = -1;
    int64_t idx[EM_MAX_DIMS] = {0}, numel = 1;
    for (int i = 0; i < n; i++) numel *= sizes[i];
    if (numel > 0) do {
            int64_t o = 0, j = n ? idx[d] : 0;
            for (int i = 0; i < n; i++)
                if (i != d) o = o * sizes[i] + idx[i];
            double val = v[tu_flat(n, sizes, idx)];
            if (ref[o] < 0) {
                ref[o] = (double)j;
                best[o] = val;
            } else if (!isnan(best[o]) && (isnan(val) || val > best[o])) {
                ref[o] = (double)j;
                best[o] = val;
            }
        } while (tu_next(n, sizes, idx));
    em_tensor *r = em_argmax(x, dim, keep);
    ck_assert_msg(r != NULL, "line %d: argmax failed: %s", line, em_last_error());
    ck_assert_int_eq(em_dtype_of(r), EM_I64);
    tu_check_close_at(__FILE__, line, r, ref, ond, osz, 0, 0);
    free(v);
    free(ref);
    free(best);
}
#define check_argmax(x, dim, keep) check_argmax_at(__LINE__, x, dim, keep)

/* Every kind over a set of dims, with keepdim off and on (var: correction 0 and 1). */
static void check_all_kinds_at(int line, const em_tensor *x, int nd, const int *dims) {
    for (int ki = 0; ki < NKINDS; ki++)
        for (int keep = 0; keep < 2; keep++) {
            check_red_at(line, ALL_KINDS[ki], x, nd, dims, keep, 1);
            if (ALL_KINDS[ki] == RS_VAR) check_red_at(line, RS_VAR, x, nd, dims, keep, 0);
        }
}
#define check_all_kinds(x, nd, dims) check_all_kinds_at(__LINE__, x, nd, dims)

/* ---- single, several and all dims, every dtype ---- */

START_TEST(test_dims_every_dtype) {
    static const int sets[][3] = {{0}, {1}, {2}, {-1}, {-3}, {0, 2}, {2, 0}, {1, 2},
                                  {-1, 0}, {0, 1, 2}, {-2, 0, -1}};
    static const int nsets[] = {1, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3};
    for (int t = 0; t < NNUM5; t++) {
        em_tensor *x = tu_random(10 + t, 3, TU_SIZES(2, 3, 4), NUM5[t], 2.0);
        for (size_t s = 0; s < sizeof nsets / sizeof nsets[0]; s++)
            check_all_kinds(x, nsets[s], sets[s]);
        check_all_kinds(x, 0, NULL); /* all dims */
    }
}
END_TEST

START_TEST(test_1d_and_4d) {
    for (int t = 0; t < NNUM5; t++) {
        em_tensor *x = tu_random(20 + t, 1, TU_SIZES(17), NUM5[t], 3.0);
        check_all_kinds(x, 1, (int[]){0});
        check_all_kinds(x, 1, (int[]){-1});
        check_all_kinds(x, 0, NULL);
        em_tensor *y = tu_random(30 + t, 4, TU_SIZES(2, 3, 2, 5), NUM5[t], 3.0);
        check_all_kinds(y, 2, ((int[]){1, 3}));
        check_all_kinds(y, 2, ((int[]){0, 2}));
        check_all_kinds(y, 3, ((int[]){3, 0, 1}));
        check_all_kinds(y, 1, (int[]){-2});
    }
}
END_TEST

START_TEST(test_keepdim_shapes) {
    em_tensor *x = tu_random(1, 3, TU_SIZES(2, 3, 4), EM_F32, 1.0);
    em_tensor *r = em_sum(x, 1, (int[]){1}, true);
    ck_assert_int_eq(em_ndim(r), 3);
    ck_assert_int_eq(em_size(r, 0), 2);
    ck_assert_int_eq(em_size(r, 1), 1);
    ck_assert_int_eq(em_size(r, 2), 4);
    r = em_sum(x, 0, NULL, true);
    ck_assert_int_eq(em_ndim(r), 3);
    ck_assert_int_eq(em_numel(r), 1);
    r = em_sum(x, 0, NULL, false);
    ck_assert_int_eq(em_ndim(r), 0);
    r = em_amax(x, 2, (int[]){0, 2}, false);
    ck_assert_int_eq(em_ndim(r), 1);
    ck_assert_int_eq(em_size(r, 0), 3);
    r = em_argmax(x, 1, true);
    ck_assert_int_eq(em_ndim(r), 3);
    ck_assert_int_eq(em_size(r, 1), 1);
    r = em_argmax(x, -1, false);
    ck_assert_int_eq(em_ndim(r), 2);
    ck_assert_int_eq(em_size(r, 1), 3);
}
END_TEST

/* ---- non-contiguous inputs ---- */

START_TEST(test_transposed) {
    for (int t = 0; t < NNUM5; t++) {
        em_tensor *x = tu_random(40 + t, 3, TU_SIZES(3, 4, 5), NUM5[t], 2.0);
        em_tensor *xt = em_transpose(x, 0, 2); /* [5, 4, 3] */
        ck_assert(!em_is_contiguous(xt));
        check_all_kinds(xt, 1, (int[]){0});
        check_all_kinds(xt, 1, (int[]){2});
        check_all_kinds(xt, 2, ((int[]){0, 1}));
        check_all_kinds(xt, 0, NULL);
        em_tensor *xp = em_permute(x, 3, (int[]){1, 2, 0}); /* [4, 5, 3] */
        check_all_kinds(xp, 1, (int[]){1});
        check_all_kinds(xp, 2, ((int[]){0, 2}));
        for (int d = -3; d < 3; d++) check_argmax(xt, d, false);
    }
}
END_TEST

START_TEST(test_sliced_with_step) {
    for (int t = 0; t < NNUM5; t++) {
        em_tensor *x = tu_random(50 + t, 3, TU_SIZES(4, 7, 6), NUM5[t], 2.0);
        em_tensor *s = em_slice(x, 1, 0, 7, 2);  /* [4, 4, 6] */
        em_tensor *s2 = em_slice(s, 2, 1, 6, 3); /* [4, 4, 2] */
        ck_assert_int_eq(em_size(s2, 1), 4);
        ck_assert_int_eq(em_size(s2, 2), 2);
        check_all_kinds(s, 1, (int[]){1});
        check_all_kinds(s, 1, (int[]){2});
        check_all_kinds(s2, 2, ((int[]){0, 2}));
        check_all_kinds(s2, 0, NULL);
        check_argmax(s2, 1, true);
        check_argmax(s2, 2, false);
    }
}
END_TEST

START_TEST(test_expanded) {
    for (int t = 0; t < NNUM5; t++) {
        em_tensor *x = tu_random(60 + t, 3, TU_SIZES(3, 1, 5), NUM5[t], 2.0);
        em_tensor *e = em_expand(x, 3, TU_SIZES(3, 4, 5)); /* stride 0 on dim 1 */
        ck_assert_int_eq(em_stride(e, 1), 0);
        check_all_kinds(e, 1, (int[]){1});
        check_all_kinds(e, 1, (int[]){0});
        check_all_kinds(e, 2, ((int[]){1, 2}));
        check_all_kinds(e, 0, NULL);
        em_tensor *e2 = em_expand(x, 4, TU_SIZES(2, 3, 6, 5)); /* new leading dim */
        check_all_kinds(e2, 1, (int[]){0});
        check_all_kinds(e2, 2, ((int[]){0, 2}));
        check_argmax(e, 1, false); /* ties everywhere: index 0 */
        check_argmax(e2, 0, false);
    }
    /* a scalar expanded to a big shape */
    em_tensor *s = em_expand(em_scalar(1.5, EM_F64, em_cpu()), 2, TU_SIZES(300, 400));
    check_red(RS_SUM, s, 0, NULL, false, 0);
    check_red(RS_VAR, s, 1, (int[]){0}, false, 1);
}
END_TEST

/* ---- size 0 and size 1 ---- */

START_TEST(test_size_zero) {
    for (int t = 0; t < NNUM5; t++) {
        em_tensor *x = em_zeros(2, TU_SIZES(0, 3), NUM5[t], em_cpu());
        /* reducing the empty dim: sum 0, mean and var NaN */
        check_red(RS_SUM, x, 1, (int[]){0}, false, 0);
        check_red(RS_SUM, x, 1, (int[]){0}, true, 0);
        check_red(RS_MEAN, x, 1, (int[]){0}, false, 0);
        check_red(RS_VAR, x, 1, (int[]){0}, false, 1);
        check_red(RS_VAR, x, 1, (int[]){0}, false, 0);
        check_red(RS_SUM, x, 0, NULL, false, 0);
        check_red(RS_MEAN, x, 0, NULL, true, 0);
        /* reducing the other dim: an empty result */
        for (int ki = 0; ki < NKINDS; ki++) check_red(ALL_KINDS[ki], x, 1, (int[]){1}, false, 1);
        check_argmax(x, 1, false);
        check_argmax(x, 1, true);
        tu_check_fails(em_amax(x, 1, (int[]){0}, false), EM_ERR_SHAPE);
        tu_check_fails(em_amin(x, 0, NULL, false), EM_ERR_SHAPE);
        tu_check_fails(em_argmax(x, 0, false), EM_ERR_SHAPE);
    }
    /* explicit values: empty sum is 0, empty mean is NaN */
    em_tensor *e = em_zeros(1, TU_SIZES(0), EM_F32, em_cpu());
    double v;
    ck_assert_int_eq(em_item(em_sum(e, 0, NULL, false), &v), EM_OK);
    ck_assert(v == 0.0);
    ck_assert_int_eq(em_item(em_mean(e, 0, NULL, false), &v), EM_OK);
    ck_assert(isnan(v));
    int64_t iv = -1;
    ck_assert_int_eq(em_item_i64(em_sum(em_zeros(1, TU_SIZES(0), EM_I32, em_cpu()), 0, NULL,
                                        false),
                                 &iv),
                     EM_OK);
    ck_assert_int_eq(iv, 0);
    /* empty along a middle dim of a 3-d tensor */
    em_tensor *m = em_ones(3, TU_SIZES(2, 0, 3), EM_F64, em_cpu());
    check_red(RS_SUM, m, 1, (int[]){1}, true, 0);
    check_red(RS_MEAN, m, 2, ((int[]){0, 1}), false, 0);
    check_red(RS_SUM, m, 1, (int[]){2}, false, 0);
}
END_TEST

START_TEST(test_size_one) {
    for (int t = 0; t < NNUM5; t++) {
        em_tensor *x = tu_random(70 + t, 3, TU_SIZES(5, 1, 3), NUM5[t], 2.0);
        check_all_kinds(x, 1, (int[]){1});
        check_all_kinds(x, 2, ((int[]){0, 1}));
        check_all_kinds(x, 2, ((int[]){1, 2}));
        check_argmax(x, 1, false);
        em_tensor *o = tu_random(80 + t, 2, TU_SIZES(1, 1), NUM5[t], 2.0);
        check_all_kinds(o, 0, NULL);
        check_all_kinds(o, 1, (int[]){0});
        check_argmax(o, 0, true);
    }
}
END_TEST

START_TEST(test_zero_dim) {
    for (int t = 0; t < NNUM5; t++) {
        em_tensor *x = em_scalar(t == 4 ? 1 : -2.5 + t, NUM5[t], em_cpu());
        check_all_kinds(x, 0, NULL);
        check_all_kinds(x, 1, (int[]){0});
        check_all_kinds(x, 1, (int[]){-1});
        check_argmax(x, 0, false);
        check_argmax(x, -1, true);
        em_tensor *r = em_sum(x, 1, (int[]){0}, true);
        ck_assert_int_eq(em_ndim(r), 0);
        tu_check_fails(em_sum(x, 1, (int[]){1}, false), EM_ERR_DIM);
        tu_check_fails(em_argmax(x, 1, false), EM_ERR_DIM);
    }
    /* var of one element: correction 1 gives NaN, 0 gives 0 */
    double v;
    em_tensor *s = em_scalar(3.0, EM_F64, em_cpu());
    ck_assert_int_eq(em_item(em_var(s, 0, NULL, 1, false), &v), EM_OK);
    ck_assert(isnan(v));
    ck_assert_int_eq(em_item(em_var(s, 0, NULL, 0, false), &v), EM_OK);
    ck_assert(v == 0.0);
}
END_TEST

/* ---- NaN and inf ---- */

START_TEST(test_nan_inf) {
    const double nan = NAN, inf = INFINITY;
    /* rows: clean, NaN first, NaN last, NaN middle, +inf, -inf, inf - inf */
    const double v[] = {1, 5, 2, 5,  nan, 3, 9, 1,  4, 2, 8, nan, 1, nan, 7, nan,
                        1, inf, 3, 0, -inf, 2, 0, 1, inf, 1, -inf, 2};
    for (int t = 0; t < 2; t++) {
        em_dtype dt = t ? EM_F64 : EM_F32;
        em_tensor *x = tu_tensor(v, 2, TU_SIZES(7, 4), dt);
        check_all_kinds(x, 1, (int[]){1});
        check_all_kinds(x, 1, (int[]){0});
        check_all_kinds(x, 0, NULL);
        check_argmax(x, 1, false);
        check_argmax(x, 0, false);
        em_tensor *xt = em_transpose(x, 0, 1);
        check_all_kinds(xt, 1, (int[]){0});
        check_argmax(xt, 0, true);
        /* spot values */
        double r;
        ck_assert_int_eq(em_item(em_sum(x, 0, NULL, false), &r), EM_OK);
        ck_assert(isnan(r));
        ck_assert_int_eq(em_item(em_amax(x, 0, NULL, false), &r), EM_OK);
        ck_assert(isnan(r));
        ck_assert_int_eq(em_item(em_amin(x, 0, NULL, false), &r), EM_OK);
        ck_assert(isnan(r));
        em_tensor *am = em_argmax(x, 1, false);
        int64_t ids[7];
        ck_assert_int_eq(em_copy_to_host(am, ids, sizeof ids), EM_OK);
        ck_assert_int_eq(ids[0], 1); /* first of the tied 5s */
        ck_assert_int_eq(ids[1], 0); /* first NaN */
        ck_assert_int_eq(ids[2], 3);
        ck_assert_int_eq(ids[3], 1); /* first NaN, not the later one */
        ck_assert_int_eq(ids[4], 1); /* inf */
        ck_assert_int_eq(ids[6], 0); /* inf before -inf */
        em_tensor *mx = em_amax(x, 1, (int[]){1}, false);
        double m[7];
        em_tensor *mx64 = em_cast(mx, EM_F64);
        ck_assert_int_eq(em_copy_to_host(mx64, m, sizeof m), EM_OK);
        ck_assert(m[0] == 5 && isnan(m[1]) && isnan(m[2]) && isnan(m[3]) && m[4] == inf &&
                  m[5] == 2 && m[6] == inf);
    }
    /* outputs contiguous in the input (vertical path) with NaN and inf */
    for (int t = 0; t < 2; t++) {
        em_dtype dt = t ? EM_F64 : EM_F32;
        double w[40 * 16];
        for (int i = 0; i < 40 * 16; i++) w[i] = (double)((i * 37) % 101) - 50;
        w[5 * 16 + 3] = nan;
        w[0 * 16 + 4] = nan;
        w[39 * 16 + 5] = nan;
        w[7 * 16 + 6] = inf;
        w[9 * 16 + 7] = -inf;
        w[10 * 16 + 7] = inf;
        for (int i = 0; i < 40; i++) w[i * 16 + 8] = -inf; /* a column of -inf */
        for (int i = 0; i < 40; i++) w[i * 16 + 9] = 3;    /* a column of ties */
        em_tensor *x = tu_tensor(w, 2, TU_SIZES(40, 16), dt);
        check_all_kinds(x, 1, (int[]){0});
        check_argmax(x, 0, false);
        check_argmax(x, 0, true);
        check_argmax(em_transpose(x, 0, 1), 1, false);
        check_all_kinds(em_transpose(x, 0, 1), 1, (int[]){1});
    }
    /* all -inf / all +inf: the extremes themselves */
    for (int t = 0; t < 2; t++) {
        em_dtype dt = t ? EM_F64 : EM_F32;
        em_tensor *ni = em_full(1, TU_SIZES(50), -inf, dt, em_cpu());
        em_tensor *pi = em_full(1, TU_SIZES(50), inf, dt, em_cpu());
        check_red(RS_AMAX, ni, 0, NULL, false, 0);
        check_red(RS_AMIN, pi, 0, NULL, false, 0);
        check_red(RS_SUM, ni, 0, NULL, false, 0);
        check_argmax(ni, 0, false);
        check_argmax(pi, 0, false);
        em_tensor *big = em_full(1, TU_SIZES(40000), -inf, dt, em_cpu());
        check_red(RS_AMAX, big, 0, NULL, false, 0);
        check_argmax(big, 0, false);
    }
    /* a NaN in the middle of a large reduction (the chunked paths) */
    for (int t = 0; t < 2; t++) {
        em_dtype dt = t ? EM_F64 : EM_F32;
        int64_t n = 100003;
        double *big = malloc(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++) big[i] = (double)(i % 1000) - 500;
        big[77777] = NAN;
        em_tensor *x = tu_tensor(big, 1, TU_SIZES(n), dt);
        free(big);
        check_red(RS_SUM, x, 0, NULL, false, 0);
        check_red(RS_AMAX, x, 0, NULL, false, 0);
        check_red(RS_AMIN, x, 0, NULL, false, 0);
        check_red(RS_VAR, x, 0, NULL, false, 1);
        check_argmax(x, 0, false);
        em_tensor *x2 = em_reshape(x, 2, TU_SIZES(1, n));
        em_tensor *xt = em_transpose(em_expand(x2, 2, TU_SIZES(3, n)), 0, 1); /* [n, 3] */
        check_red(RS_AMAX, xt, 1, (int[]){0}, false, 0);
        check_red(RS_AMIN, xt, 1, (int[]){0}, false, 0);
    }
}
END_TEST

/* ---- var ---- */

START_TEST(test_var_corrections) {
    const double v[] = {1, 2, 3, 4, 6, 10};
    for (int t = 0; t < 2; t++) {
        em_dtype dt = t ? EM_F64 : EM_F32;
        em_tensor *x = tu_tensor(v, 2, TU_SIZES(2, 3), dt);
        for (int corr = 0; corr <= 4; corr++) {
            check_red(RS_VAR, x, 1, (int[]){1}, false, corr);
            check_red(RS_VAR, x, 1, (int[]){0}, true, corr);
            check_red(RS_VAR, x, 0, NULL, false, corr);
        }
        double r;
        ck_assert_int_eq(em_item(em_var(x, 0, NULL, 1, false), &r), EM_OK);
        ck_assert(fabs(r - 32.0 / 3) < 1e-5);
        ck_assert_int_eq(em_item(em_var(x, 0, NULL, 0, false), &r), EM_OK);
        ck_assert(fabs(r - 80.0 / 9) < 1e-5);
        /* N = 1: correction 1 -> NaN (0/0), correction 0 -> 0 */
        em_tensor *one = tu_tensor(v, 2, TU_SIZES(6, 1), dt);
        em_tensor *r1 = em_var(one, 1, (int[]){1}, 1, false);
        double out[6];
        ck_assert_int_eq(em_copy_to_host(em_cast(r1, EM_F64), out, sizeof out), EM_OK);
        for (int i = 0; i < 6; i++) ck_assert(isnan(out[i]));
        em_tensor *r0 = em_var(one, 1, (int[]){1}, 0, false);
        ck_assert_int_eq(em_copy_to_host(em_cast(r0, EM_F64), out, sizeof out), EM_OK);
        for (int i = 0; i < 6; i++) ck_assert(out[i] == 0.0);
        /* a big offset: two-pass var stays accurate */
        double w[1000];
        for (int i = 0; i < 1000; i++) w[i] = 1e6 + (i % 7) * 0.25;
        em_tensor *y = tu_tensor(w, 1, TU_SIZES(1000), dt);
        check_red(RS_VAR, y, 0, NULL, false, 1);
    }
    tu_check_fails(em_var(tu_tensor(v, 1, TU_SIZES(6), EM_F32), 0, NULL, -1, false), EM_ERR_ARG);
}
END_TEST

/* ---- integers ---- */

START_TEST(test_int_sums) {
    /* i32 values whose sum leaves the i32 range: the i64 result is exact */
    double v[8];
    for (int i = 0; i < 8; i++) v[i] = 2147483647.0 - i;
    em_tensor *x = tu_tensor(v, 1, TU_SIZES(8), EM_I32);
    em_tensor *s = em_sum(x, 0, NULL, false);
    ck_assert_int_eq(em_dtype_of(s), EM_I64);
    int64_t r;
    ck_assert_int_eq(em_item_i64(s, &r), EM_OK);
    ck_assert_int_eq(r, 8 * 2147483647LL - 28);
    /* i64 values near 2^52, exact */
    int64_t big[4] = {(1LL << 52) + 1, (1LL << 52) + 3, -(1LL << 50), 7};
    em_tensor *y = em_from_data(big, EM_I64, 1, TU_SIZES(4), em_cpu());
    ck_assert_int_eq(em_item_i64(em_sum(y, 0, NULL, false), &r), EM_OK);
    ck_assert_int_eq(r, big[0] + big[1] + big[2] + big[3]);
    ck_assert_int_eq(em_item_i64(em_amax(y, 0, NULL, false), &r), EM_OK);
    ck_assert_int_eq(r, big[1]);
    ck_assert_int_eq(em_item_i64(em_amin(y, 0, NULL, false), &r), EM_OK);
    ck_assert_int_eq(r, big[2]);
    /* bool sum counts the trues; amax/amin of bool stay bool */
    uint8_t b[6] = {1, 0, 1, 1, 1, 0};
    em_tensor *bt = em_from_data(b, EM_BOOL, 2, TU_SIZES(2, 3), em_cpu());
    em_tensor *bs = em_sum(bt, 1, (int[]){1}, false);
    ck_assert_int_eq(em_dtype_of(bs), EM_I64);
    int64_t cnt[2];
    ck_assert_int_eq(em_copy_to_host(bs, cnt, sizeof cnt), EM_OK);
    ck_assert_int_eq(cnt[0], 2);
    ck_assert_int_eq(cnt[1], 2);
    em_tensor *bm = em_amax(bt, 1, (int[]){0}, false);
    ck_assert_int_eq(em_dtype_of(bm), EM_BOOL);
    uint8_t mm[3];
    ck_assert_int_eq(em_copy_to_host(bm, mm, sizeof mm), EM_OK);
    ck_assert(mm[0] == 1 && mm[1] == 1 && mm[2] == 1);
    ck_assert_int_eq(em_copy_to_host(em_amin(bt, 1, (int[]){0}, false), mm, sizeof mm), EM_OK);
    ck_assert(mm[0] == 1 && mm[1] == 0 && mm[2] == 0);
    /* mean of integers computes in f32 */
    em_tensor *mi = em_mean(tu_tensor((double[]){1, 2, 4}, 1, TU_SIZES(3), EM_I64), 0, NULL,
                            false);
    ck_assert_int_eq(em_dtype_of(mi), EM_F32);
    double d;
    ck_assert_int_eq(em_item(mi, &d), EM_OK);
    ck_assert(fabs(d - 7.0 / 3) < 1e-6);
    /* min/max of extreme i64 */
    int64_t ext[3] = {INT64_MIN, INT64_MAX, 0};
    em_tensor *et = em_from_data(ext, EM_I64, 1, TU_SIZES(3), em_cpu());
    ck_assert_int_eq(em_item_i64(em_amax(et, 0, NULL, false), &r), EM_OK);
    ck_assert(r == INT64_MAX);
    ck_assert_int_eq(em_item_i64(em_amin(et, 0, NULL, false), &r), EM_OK);
    ck_assert(r == INT64_MIN);
    ck_assert_int_eq(em_item_i64(em_argmax(et, 0, false), &r), EM_OK);
    ck_assert_int_eq(r, 1);
}
END_TEST

/* ---- argmax ---- */

START_TEST(test_argmax) {
    for (int t = 0; t < NNUM5; t++) {
        em_tensor *x = tu_random(90 + t, 3, TU_SIZES(3, 4, 5), NUM5[t], 1.0); /* many ties */
        for (int d = -3; d < 3; d++) {
            check_argmax(x, d, false);
            check_argmax(x, d, true);
        }
        em_tensor *y = tu_random(95 + t, 1, TU_SIZES(9), NUM5[t], 5.0);
        check_argmax(y, 0, false);
        check_argmax(y, -1, true);
    }
    /* ties: the first occurrence */
    em_tensor *z = tu_tensor((double[]){3, 7, 7, 1, 7}, 1, TU_SIZES(5), EM_I32);
    int64_t r;
    ck_assert_int_eq(em_item_i64(em_argmax(z, 0, false), &r), EM_OK);
    ck_assert_int_eq(r, 1);
    tu_check_fails(em_argmax(z, 1, false), EM_ERR_DIM);
    tu_check_fails(em_argmax(z, -2, false), EM_ERR_DIM);
    tu_check_fails(em_argmax(NULL, 0, false), EM_ERR_NULL);
}
END_TEST

/* ---- large: threads, chunked and vertical paths ---- */

START_TEST(test_large) {
    const em_dtype dts[] = {EM_F32, EM_F64, EM_I64, EM_I32};
    for (int t = 0; t < 4; t++) {
        em_dtype dt = dts[t];
        double sc = em_dtype_is_float(dt) ? 1.0 : 100.0;
        /* full reduction of a big tensor: few outputs, blocks in chunks */
        em_tensor *x = tu_random(100 + t, 2, TU_SIZES(1000, 300), dt, sc);
        check_red(RS_SUM, x, 0, NULL, false, 0);
        check_red(RS_AMAX, x, 0, NULL, false, 0);
        check_red(RS_AMIN, x, 0, NULL, false, 0);
        if (em_dtype_is_float(dt)) {
            check_red(RS_MEAN, x, 0, NULL, false, 0);
            check_red(RS_VAR, x, 0, NULL, false, 1);
        }
        /* down the columns (vertical path, tiles of outputs) */
        check_red(RS_SUM, x, 1, (int[]){0}, false, 0);
        check_red(RS_AMAX, x, 1, (int[]){0}, true, 0);
        check_red(RS_AMIN, x, 1, (int[]){0}, false, 0);
        check_argmax(x, 0, false);
        /* along the rows (many outputs, contiguous blocks) */
        check_red(RS_SUM, x, 1, (int[]){1}, false, 0);
        check_red(RS_AMAX, x, 1, (int[]){-1}, false, 0);
        check_argmax(x, 1, false);
        /* the transpose of both */
        em_tensor *xt = em_transpose(x, 0, 1);
        check_red(RS_SUM, xt, 1, (int[]){0}, false, 0);
        check_red(RS_SUM, xt, 1, (int[]){1}, false, 0);
        check_red(RS_AMIN, xt, 0, NULL, false, 0);
        if (em_dtype_is_float(dt)) {
            check_red(RS_VAR, x, 1, (int[]){0}, false, 1);
            check_red(RS_VAR, xt, 1, (int[]){1}, false, 0);
            check_red(RS_MEAN, xt, 1, (int[]){1}, true, 0);
        }
        /* few outputs with long contiguous blocks */
        em_tensor *w = tu_random(110 + t, 2, TU_SIZES(10, 40000), dt, sc);
        check_red(RS_SUM, w, 1, (int[]){1}, false, 0);
        check_red(RS_AMAX, w, 1, (int[]){1}, false, 0);
        if (em_dtype_is_float(dt)) check_red(RS_VAR, w, 1, (int[]){1}, false, 1);
        /* a long thin column block: chunked vertical */
        em_tensor *h = tu_random(120 + t, 2, TU_SIZES(40000, 10), dt, sc);
        check_red(RS_SUM, h, 1, (int[]){0}, false, 0);
        check_red(RS_AMIN, h, 1, (int[]){0}, false, 0);
        if (em_dtype_is_float(dt)) {
            check_red(RS_VAR, h, 1, (int[]){0}, false, 1);
            check_red(RS_MEAN, h, 1, (int[]){0}, false, 0);
        }
        /* wide rows: several tiles of outputs, chunked down the columns */
        em_tensor *wide = tu_random(125 + t, 2, TU_SIZES(203, 2500), dt, sc);
        check_red(RS_SUM, wide, 1, (int[]){0}, false, 0);
        check_red(RS_AMAX, wide, 1, (int[]){0}, false, 0);
        check_red(RS_AMIN, wide, 1, (int[]){-2}, true, 0);
        check_argmax(wide, 0, false);
        if (em_dtype_is_float(dt)) check_red(RS_VAR, wide, 1, (int[]){0}, false, 1);
        /* a middle dim of a 3-d tensor */
        em_tensor *m = tu_random(130 + t, 3, TU_SIZES(4, 5000, 12), dt, sc);
        check_red(RS_SUM, m, 1, (int[]){1}, false, 0);
        check_red(RS_AMAX, m, 2, ((int[]){0, 1}), false, 0);
        check_argmax(m, 1, false);
    }
    /* the same call twice gives the same bits */
    em_tensor *x = tu_random(140, 1, TU_SIZES(300001), EM_F32, 1.0);
    double a, b;
    ck_assert_int_eq(em_item(em_sum(x, 0, NULL, false), &a), EM_OK);
    ck_assert_int_eq(em_item(em_sum(x, 0, NULL, false), &b), EM_OK);
    ck_assert(a == b);
}
END_TEST

/* ---- errors ---- */

START_TEST(test_errors) {
    em_tensor *x = tu_random(150, 3, TU_SIZES(2, 3, 4), EM_F32, 1.0);
    for (int ki = 0; ki < NKINDS; ki++) {
        rkind k = ALL_KINDS[ki];
        tu_check_fails(call(k, NULL, 0, NULL, false, 1), EM_ERR_NULL);
        tu_check_fails(call(k, x, 1, (int[]){3}, false, 1), EM_ERR_DIM);
        tu_check_fails(call(k, x, 1, (int[]){-4}, false, 1), EM_ERR_DIM);
        tu_check_fails(call(k, x, 2, ((int[]){1, 1}), false, 1), EM_ERR_DIM);
        tu_check_fails(call(k, x, 2, ((int[]){2, -1}), false, 1), EM_ERR_DIM);
        tu_check_fails(call(k, x, 4, ((int[]){0, 1, 2, 0}), false, 1), EM_ERR_DIM);
        tu_check_fails(call(k, x, 1, NULL, false, 1), EM_ERR_NULL);
        /* half types compute (tests/test_half.c checks the values) */
        ck_assert_ptr_nonnull(call(k, em_cast(x, EM_F16), 0, NULL, false, 1));
        tu_check_fails(call(k, em_cast(x, EM_BF16), 1, (int[]){3}, false, 1), EM_ERR_DIM);
    }
    ck_assert_ptr_nonnull(em_argmax(em_cast(x, EM_BF16), 0, false));
    tu_check_fails(em_argmax(x, 3, false), EM_ERR_DIM);
    /* amax/amin over an empty dim */
    em_tensor *e = em_zeros(2, TU_SIZES(3, 0), EM_F32, em_cpu());
    tu_check_fails(em_amax(e, 1, (int[]){1}, false), EM_ERR_SHAPE);
    tu_check_fails(em_amin(e, 1, (int[]){-1}, true), EM_ERR_SHAPE);
    tu_check_fails(em_amax(e, 0, NULL, false), EM_ERR_SHAPE);
    tu_check_fails(em_argmax(e, 1, false), EM_ERR_SHAPE);
    /* an error propagates through a NULL input */
    em_clear_error();
    ck_assert_ptr_null(em_sum(em_amax(e, 0, NULL, false), 0, NULL, false));
    ck_assert_int_eq(em_last_status(), EM_ERR_SHAPE);
}
END_TEST

static Suite *suite(void) {
    const tu_test tests[] = {
        {"dims_every_dtype", test_dims_every_dtype},
        {"1d_and_4d", test_1d_and_4d},
        {"keepdim_shapes", test_keepdim_shapes},
        {"transposed", test_transposed},
        {"sliced_with_step", test_sliced_with_step},
        {"expanded", test_expanded},
        {"size_zero", test_size_zero},
        {"size_one", test_size_one},
        {"zero_dim", test_zero_dim},
        {"nan_inf", test_nan_inf},
        {"var_corrections", test_var_corrections},
        {"int_sums", test_int_sums},
        {"argmax", test_argmax},
        {"large", test_large},
        {"errors", test_errors},
    };
    return tu_suite("reduce", tests, sizeof tests / sizeof tests[0], 120);
}

int main(void) { return tu_run(suite()); }
