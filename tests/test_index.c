/* test_index.c - em_cat, em_index_select, em_embedding against references
 * computed here from the inputs' values. */
#include "testutil.h"

#include <string.h>

static const em_dtype ALL7[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_BOOL, EM_F16, EM_BF16};
#define NALL7 7

/* ---- cat ---- */

/* Checks em_cat(n, xs, dim) against a reference built from the inputs. */
static void check_cat_at(int line, int n, em_tensor *const *xs, int dim) {
    int nd = em_ndim(xs[0]);
    int d = dim < 0 ? dim + nd : dim;
    int64_t osz[EM_MAX_DIMS];
    memcpy(osz, em_sizes(xs[0]), sizeof(int64_t) * (size_t)nd);
    osz[d] = 0;
    for (int k = 0; k < n; k++) osz[d] += em_size(xs[k], d);
    int64_t numel = 1;
    for (int i = 0; i < nd; i++) numel *= osz[i];
    double *ref = malloc(sizeof(double) * (size_t)(numel > 0 ? numel : 1));
    int64_t start = 0;
    for (int k = 0; k < n; k++) {
        const int64_t *ks = em_sizes(xs[k]);
        int64_t kn = em_numel(xs[k]);
        double *v = tu_values(xs[k]);
        int64_t idx[EM_MAX_DIMS] = {0};
        if (kn > 0) do {
                int64_t oidx[EM_MAX_DIMS];
                memcpy(oidx, idx, sizeof oidx);
                oidx[d] += start;
                ref[tu_flat(nd, osz, oidx)] = v[tu_flat(nd, ks, idx)];
            } while (tu_next(nd, ks, idx));
        start += ks[d];
        free(v);
    }
    em_tensor *r = em_cat(n, xs, dim);
    ck_assert_msg(r != NULL, "line %d: em_cat failed: %s", line, em_last_error());
    em_dtype want = em_dtype_of(xs[0]);
    for (int k = 1; k < n; k++) want = em_promote_types(want, em_dtype_of(xs[k]));
    ck_assert_msg(em_dtype_of(r) == want, "line %d: dtype %s, expected %s", line,
                  em_dtype_name(em_dtype_of(r)), em_dtype_name(want));
    tu_check_close_at(__FILE__, line, r, ref, nd, osz, 0, 0);
    free(ref);
}
#define check_cat(n, xs, dim) check_cat_at(__LINE__, n, xs, dim)

START_TEST(test_cat_dims_every_dtype) {
    for (int t = 0; t < NALL7; t++) {
        em_dtype dt = ALL7[t];
        /* along each dim, three inputs of different sizes along it */
        for (int d = 0; d < 3; d++) {
            int64_t s0[3] = {2, 3, 4}, s1[3] = {2, 3, 4}, s2[3] = {2, 3, 4};
            s0[d] = 1;
            s1[d] = 3;
            s2[d] = 2;
            em_tensor *xs[3] = {tu_random(10 * t + d, 3, s0, dt, 4.0),
                                tu_random(10 * t + d + 100, 3, s1, dt, 4.0),
                                tu_random(10 * t + d + 200, 3, s2, dt, 4.0)};
            check_cat(3, xs, d);
            check_cat(3, xs, d - 3); /* negative */
            check_cat(2, xs + 1, d);
            check_cat(1, xs, d);
        }
        /* 1-d */
        em_tensor *ys[2] = {tu_random(300 + t, 1, TU_SIZES(5), dt, 4.0),
                            tu_random(400 + t, 1, TU_SIZES(2), dt, 4.0)};
        check_cat(2, ys, 0);
        check_cat(2, ys, -1);
    }
}
END_TEST

START_TEST(test_cat_noncontiguous) {
    for (int t = 0; t < NALL7; t++) {
        em_dtype dt = ALL7[t];
        em_tensor *a = tu_random(500 + t, 2, TU_SIZES(4, 3), dt, 4.0);
        em_tensor *at = em_transpose(a, 0, 1); /* [3, 4] */
        em_tensor *b = tu_random(510 + t, 2, TU_SIZES(3, 9), dt, 4.0);
        em_tensor *bs = em_slice(b, 1, 1, 9, 3); /* [3, 3], stride 3 */
        em_tensor *c = tu_random(520 + t, 2, TU_SIZES(3, 1), dt, 4.0);
        em_tensor *ce = em_expand(c, 2, TU_SIZES(3, 5)); /* stride 0 */
        em_tensor *xs[3] = {at, bs, ce};
        check_cat(3, xs, 1);
        check_cat(3, xs, -1);
        em_tensor *ys[3] = {em_transpose(at, 0, 1), em_transpose(bs, 0, 1),
                            em_transpose(ce, 0, 1)}; /* [4,3] [3,3] [5,3] */
        check_cat(3, ys, 0);
        /* 3-d with a transposed inner block */
        em_tensor *p = tu_random(530 + t, 3, TU_SIZES(2, 4, 3), dt, 4.0);
        em_tensor *q = em_transpose(tu_random(540 + t, 3, TU_SIZES(2, 3, 4), dt, 4.0), 1, 2);
        em_tensor *zs[2] = {p, q};
        check_cat(2, zs, 0);
        check_cat(2, zs, 1);
        check_cat(2, zs, 2);
    }
}
END_TEST

START_TEST(test_cat_empty) {
    for (int t = 0; t < NALL7; t++) {
        em_dtype dt = ALL7[t];
        em_tensor *a = tu_random(600 + t, 2, TU_SIZES(2, 3), dt, 4.0);
        em_tensor *z = em_zeros(2, TU_SIZES(2, 0), dt, em_cpu());
        em_tensor *b = tu_random(610 + t, 2, TU_SIZES(2, 2), dt, 4.0);
        em_tensor *xs[3] = {z, a, b};
        check_cat(3, xs, 1);
        em_tensor *xs2[3] = {a, z, b};
        check_cat(3, xs2, 1);
        em_tensor *zz[2] = {z, z};
        check_cat(2, zz, 1); /* all empty */
        /* an empty dim other than the cat dim: an empty result */
        em_tensor *e1 = em_zeros(2, TU_SIZES(0, 3), dt, em_cpu());
        em_tensor *e2 = em_zeros(2, TU_SIZES(0, 5), dt, em_cpu());
        em_tensor *es[2] = {e1, e2};
        check_cat(2, es, 1);
        /* size-1 dims */
        em_tensor *o1 = tu_random(620 + t, 2, TU_SIZES(1, 1), dt, 4.0);
        em_tensor *os[3] = {o1, o1, o1};
        check_cat(3, os, 0);
        check_cat(3, os, 1);
    }
}
END_TEST

START_TEST(test_cat_promotes) {
    em_tensor *a = tu_random(700, 2, TU_SIZES(2, 3), EM_I32, 4.0);
    em_tensor *b = tu_random(701, 2, TU_SIZES(1, 3), EM_F32, 4.0);
    em_tensor *c = tu_random(702, 2, TU_SIZES(2, 3), EM_BOOL, 4.0);
    em_tensor *d = tu_random(703, 2, TU_SIZES(2, 3), EM_I64, 4.0);
    em_tensor *ab[2] = {a, b};
    check_cat(2, ab, 0); /* f32 */
    em_tensor *cd[2] = {c, d};
    check_cat(2, cd, 1); /* i64 */
    em_tensor *ca[2] = {c, a};
    check_cat(2, ca, 0); /* i32 */
}
END_TEST

START_TEST(test_cat_large) {
    const em_dtype dts[] = {EM_F32, EM_F64, EM_I64, EM_BOOL, EM_F16};
    for (int t = 0; t < 5; t++) {
        em_tensor *a = tu_random(800 + t, 2, TU_SIZES(300, 200), dts[t], 4.0);
        em_tensor *b = tu_random(810 + t, 2, TU_SIZES(300, 100), dts[t], 4.0);
        em_tensor *xs[3] = {a, b, a};
        check_cat(3, xs, 1);
        em_tensor *ys[2] = {em_transpose(a, 0, 1), em_transpose(b, 0, 1)};
        check_cat(2, ys, 0);
        check_cat(2, ys, -2);
    }
}
END_TEST

START_TEST(test_cat_errors) {
    em_tensor *a = tu_random(900, 2, TU_SIZES(2, 3), EM_F32, 1.0);
    em_tensor *b = tu_random(901, 2, TU_SIZES(3, 3), EM_F32, 1.0);
    em_tensor *c = tu_random(902, 3, TU_SIZES(2, 3, 1), EM_F32, 1.0);
    em_tensor *ab[2] = {a, b};
    tu_check_fails(em_cat(2, ab, 1), EM_ERR_SHAPE); /* 2 vs 3 outside dim 1 */
    tu_check_fails(em_cat(2, ab, -1), EM_ERR_SHAPE);
    em_tensor *ac[2] = {a, c};
    tu_check_fails(em_cat(2, ac, 0), EM_ERR_SHAPE); /* ranks differ */
    tu_check_fails(em_cat(2, ab, 2), EM_ERR_DIM);
    tu_check_fails(em_cat(2, ab, -3), EM_ERR_DIM);
    tu_check_fails(em_cat(0, ab, 0), EM_ERR_ARG);
    tu_check_fails(em_cat(-1, ab, 0), EM_ERR_ARG);
    tu_check_fails(em_cat(2, NULL, 0), EM_ERR_NULL);
    em_tensor *an[2] = {a, NULL};
    tu_check_fails(em_cat(2, an, 0), EM_ERR_NULL);
    em_tensor *s[2] = {em_scalar(1, EM_F32, em_cpu()), em_scalar(2, EM_F32, em_cpu())};
    tu_check_fails(em_cat(2, s, 0), EM_ERR_DIM); /* 0-d tensors */
}
END_TEST

/* ---- index_select ---- */

static void check_index_select_at(int line, const em_tensor *x, int dim, const em_tensor *idx) {
    int nd = em_ndim(x);
    int d = dim < 0 ? dim + nd : dim;
    const int64_t *xs = em_sizes(x);
    double *iv = tu_values(idx);
    int64_t n = em_numel(idx);
    int64_t osz[EM_MAX_DIMS];
    memcpy(osz, xs, sizeof(int64_t) * (size_t)nd);
    osz[d] = n;
    int64_t numel = 1;
    for (int i = 0; i < nd; i++) numel *= osz[i];
    double *v = tu_values(x);
    double *ref = malloc(sizeof(double) * (size_t)(numel > 0 ? numel : 1));
    int64_t idx2[EM_MAX_DIMS] = {0};
    if (numel > 0) do {
            int64_t sidx[EM_MAX_DIMS];
            memcpy(sidx, idx2, sizeof sidx);
            sidx[d] = (int64_t)iv[idx2[d]];
            ref[tu_flat(nd, osz, idx2)] = v[tu_flat(nd, xs, sidx)];
        } while (tu_next(nd, osz, idx2));
    em_tensor *r = em_index_select(x, dim, idx);
    ck_assert_msg(r != NULL, "line %d: index_select failed: %s", line, em_last_error());
    ck_assert_int_eq(em_dtype_of(r), em_dtype_of(x));
    tu_check_close_at(__FILE__, line, r, ref, nd, osz, 0, 0);
    free(iv);
    free(v);
    free(ref);
}
#define check_index_select(x, dim, idx) check_index_select_at(__LINE__, x, dim, idx)

START_TEST(test_index_select_every_dtype) {
    for (int t = 0; t < NALL7; t++) {
        em_dtype dt = ALL7[t];
        em_tensor *x = tu_random(1000 + t, 3, TU_SIZES(3, 4, 5), dt, 4.0);
        for (int it = 0; it < 2; it++) {
            em_dtype idt = it ? EM_I64 : EM_I32;
            em_tensor *i0 = tu_tensor((double[]){2, 0, 2, 1}, 1, TU_SIZES(4), idt);
            em_tensor *i1 = tu_tensor((double[]){3, 3, 0}, 1, TU_SIZES(3), idt);
            em_tensor *i2 = tu_tensor((double[]){4, 1, 0, 3, 2, 4}, 1, TU_SIZES(6), idt);
            check_index_select(x, 0, i0);
            check_index_select(x, -3, i0);
            check_index_select(x, 1, i1);
            check_index_select(x, 2, i2);
            check_index_select(x, -1, i2);
            /* a single index, and a 0-d index (one slice) */
            em_tensor *one = tu_tensor((double[]){1}, 1, TU_SIZES(1), idt);
            check_index_select(x, 1, one);
            em_tensor *sc = em_scalar(2, idt, em_cpu());
            em_tensor *r = em_index_select(x, 2, sc);
            ck_assert_msg(r != NULL, "%s", em_last_error());
            ck_assert_int_eq(em_ndim(r), 3);
            ck_assert_int_eq(em_size(r, 2), 1);
            check_index_select(x, 2, sc);
        }
    }
}
END_TEST

START_TEST(test_index_select_noncontiguous) {
    for (int t = 0; t < NALL7; t++) {
        em_dtype dt = ALL7[t];
        em_tensor *x = tu_random(1100 + t, 3, TU_SIZES(3, 4, 5), dt, 4.0);
        em_tensor *xt = em_transpose(x, 0, 2);    /* [5, 4, 3] */
        em_tensor *xs = em_slice(x, 2, 0, 5, 2);  /* [3, 4, 3] */
        em_tensor *xe = em_expand(tu_random(1110 + t, 2, TU_SIZES(1, 5), dt, 4.0), 2,
                                  TU_SIZES(6, 5)); /* stride 0 rows */
        em_tensor *ib = tu_tensor((double[]){0, 9, 2, 9, 1, 9, 2, 9}, 1, TU_SIZES(8), EM_I64);
        em_tensor *is = em_slice(ib, 0, 0, 8, 2); /* 0 2 1 2, stride 2 */
        ck_assert(!em_is_contiguous(is));
        em_tensor *ie = em_expand(tu_tensor((double[]){1}, 1, TU_SIZES(1), EM_I32), 1,
                                  TU_SIZES(5)); /* 1 1 1 1 1, stride 0 */
        for (int d = 0; d < 3; d++) {
            check_index_select(xt, d, is);
            check_index_select(xs, d, is);
            check_index_select(xt, d, ie);
        }
        check_index_select(xe, 0, ie);
        check_index_select(xe, 1, is);
    }
}
END_TEST

START_TEST(test_index_select_empty) {
    for (int t = 0; t < NALL7; t++) {
        em_dtype dt = ALL7[t];
        em_tensor *x = tu_random(1200 + t, 2, TU_SIZES(3, 4), dt, 4.0);
        em_tensor *none = em_zeros(1, TU_SIZES(0), EM_I64, em_cpu());
        check_index_select(x, 0, none);
        check_index_select(x, 1, none);
        em_tensor *r = em_index_select(x, 1, none);
        ck_assert_int_eq(em_size(r, 1), 0);
        ck_assert_int_eq(em_size(r, 0), 3);
        /* x with an empty dim other than the selected one */
        em_tensor *e = em_zeros(2, TU_SIZES(0, 4), dt, em_cpu());
        em_tensor *i = tu_tensor((double[]){3, 0}, 1, TU_SIZES(2), EM_I32);
        check_index_select(e, 1, i);
        /* selecting nothing from an empty dim is fine */
        check_index_select(e, 0, none);
    }
}
END_TEST

START_TEST(test_index_select_large) {
    const em_dtype dts[] = {EM_F32, EM_F64, EM_I32, EM_BOOL, EM_BF16};
    int64_t n = 5000;
    double *iv = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) iv[i] = (double)((i * 7919) % 1000);
    for (int t = 0; t < 5; t++) {
        em_tensor *x = tu_random(1300 + t, 2, TU_SIZES(1000, 64), dts[t], 4.0);
        em_tensor *idx = tu_tensor(iv, 1, TU_SIZES(n), t % 2 ? EM_I32 : EM_I64);
        check_index_select(x, 0, idx);
        check_index_select(em_transpose(x, 0, 1), 1, idx);
        em_tensor *small = tu_tensor((double[]){63, 0, 31}, 1, TU_SIZES(3), EM_I64);
        check_index_select(x, 1, small);
    }
    free(iv);
}
END_TEST

START_TEST(test_index_select_errors) {
    em_tensor *x = tu_random(1400, 2, TU_SIZES(3, 4), EM_F32, 1.0);
    em_tensor *ok = tu_tensor((double[]){0, 2}, 1, TU_SIZES(2), EM_I64);
    /* float and bool indices */
    tu_check_fails(em_index_select(x, 0, tu_tensor((double[]){0, 1}, 1, TU_SIZES(2), EM_F32)),
                   EM_ERR_DTYPE);
    tu_check_fails(em_index_select(x, 0, tu_tensor((double[]){0, 1}, 1, TU_SIZES(2), EM_BOOL)),
                   EM_ERR_DTYPE);
    /* 2-d indices */
    tu_check_fails(
        em_index_select(x, 0, tu_tensor((double[]){0, 1, 2, 0}, 2, TU_SIZES(2, 2), EM_I64)),
        EM_ERR_SHAPE);
    /* out of range: == size, > size, negative; for i32 and i64 */
    for (int it = 0; it < 2; it++) {
        em_dtype idt = it ? EM_I64 : EM_I32;
        tu_check_fails(em_index_select(x, 0, tu_tensor((double[]){0, 3}, 1, TU_SIZES(2), idt)),
                       EM_ERR_INDEX);
        tu_check_fails(em_index_select(x, 1, tu_tensor((double[]){4}, 1, TU_SIZES(1), idt)),
                       EM_ERR_INDEX);
        tu_check_fails(
            em_index_select(x, 1, tu_tensor((double[]){1, 2, -1}, 1, TU_SIZES(3), idt)),
            EM_ERR_INDEX);
        tu_check_fails(
            em_index_select(x, -1, tu_tensor((double[]){1000000}, 1, TU_SIZES(1), idt)),
            EM_ERR_INDEX);
        tu_check_fails(em_index_select(x, 0, em_scalar(-3, idt, em_cpu())), EM_ERR_INDEX);
    }
    /* i64 indices beyond the i32 range */
    int64_t huge[2] = {1, (int64_t)1 << 40};
    tu_check_fails(
        em_index_select(x, 0, em_from_data(huge, EM_I64, 1, TU_SIZES(2), em_cpu())),
        EM_ERR_INDEX);
    /* any index into an empty dim */
    em_tensor *e = em_zeros(2, TU_SIZES(0, 4), EM_F32, em_cpu());
    tu_check_fails(em_index_select(e, 0, ok), EM_ERR_INDEX);
    /* the message names the index */
    em_clear_error();
    ck_assert_ptr_null(
        em_index_select(x, 0, tu_tensor((double[]){0, 7}, 1, TU_SIZES(2), EM_I64)));
    ck_assert_msg(strstr(em_last_error(), "7") != NULL, "message: %s", em_last_error());
    /* dims */
    tu_check_fails(em_index_select(x, 2, ok), EM_ERR_DIM);
    tu_check_fails(em_index_select(x, -3, ok), EM_ERR_DIM);
    tu_check_fails(em_index_select(em_scalar(1, EM_F32, em_cpu()), 0, ok), EM_ERR_DIM);
    /* NULL */
    tu_check_fails(em_index_select(NULL, 0, ok), EM_ERR_NULL);
    tu_check_fails(em_index_select(x, 0, NULL), EM_ERR_NULL);
}
END_TEST

/* ---- embedding ---- */

static void check_embedding_at(int line, const em_tensor *w, const em_tensor *ids) {
    int in = em_ndim(ids);
    int64_t D = em_size(w, 1), n = em_numel(ids);
    int64_t osz[EM_MAX_DIMS];
    memcpy(osz, em_sizes(ids), sizeof(int64_t) * (size_t)in);
    osz[in] = D;
    double *wv = tu_values(w), *iv = tu_values(ids);
    double *ref = malloc(sizeof(double) * (size_t)(n * D > 0 ? n * D : 1));
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < D; j++) ref[i * D + j] = wv[(int64_t)iv[i] * D + j];
    em_tensor *r = em_embedding(w, ids);
    ck_assert_msg(r != NULL, "line %d: embedding failed: %s", line, em_last_error());
    ck_assert_int_eq(em_dtype_of(r), em_dtype_of(w));
    tu_check_close_at(__FILE__, line, r, ref, in + 1, osz, 0, 0);
    free(wv);
    free(iv);
    free(ref);
}
#define check_embedding(w, ids) check_embedding_at(__LINE__, w, ids)

START_TEST(test_embedding) {
    const em_dtype wdts[] = {EM_F32, EM_F64, EM_I32, EM_BF16};
    for (int t = 0; t < 4; t++) {
        em_tensor *w = tu_random(1500 + t, 2, TU_SIZES(5, 4), wdts[t], 3.0);
        for (int it = 0; it < 2; it++) {
            em_dtype idt = it ? EM_I64 : EM_I32;
            em_tensor *ids = tu_tensor((double[]){4, 0, 2, 2, 1, 3}, 2, TU_SIZES(2, 3), idt);
            em_tensor *r = em_embedding(w, ids);
            ck_assert_msg(r != NULL, "%s", em_last_error());
            ck_assert_int_eq(em_ndim(r), 3);
            ck_assert_int_eq(em_size(r, 0), 2);
            ck_assert_int_eq(em_size(r, 1), 3);
            ck_assert_int_eq(em_size(r, 2), 4);
            check_embedding(w, ids);
            check_embedding(w, tu_tensor((double[]){3, 3, 0}, 1, TU_SIZES(3), idt));
            check_embedding(w, em_scalar(1, idt, em_cpu()));
            check_embedding(w, em_transpose(ids, 0, 1)); /* non-contiguous ids */
            check_embedding(w, em_zeros(2, TU_SIZES(0, 3), idt, em_cpu()));
            /* a transposed weight */
            em_tensor *wt = em_transpose(tu_random(1600 + t, 2, TU_SIZES(4, 5), wdts[t], 3.0),
                                         0, 1);
            check_embedding(wt, ids);
        }
    }
    em_tensor *w = tu_random(1700, 2, TU_SIZES(5, 4), EM_F32, 1.0);
    tu_check_fails(em_embedding(w, tu_tensor((double[]){0, 5}, 1, TU_SIZES(2), EM_I64)),
                   EM_ERR_INDEX);
    tu_check_fails(em_embedding(w, tu_tensor((double[]){-1, 0}, 2, TU_SIZES(1, 2), EM_I32)),
                   EM_ERR_INDEX);
    tu_check_fails(em_embedding(w, tu_tensor((double[]){0, 1}, 1, TU_SIZES(2), EM_F32)),
                   EM_ERR_DTYPE);
    tu_check_fails(em_embedding(tu_random(1, 1, TU_SIZES(5), EM_F32, 1.0),
                                tu_tensor((double[]){0}, 1, TU_SIZES(1), EM_I64)),
                   EM_ERR_SHAPE);
    tu_check_fails(em_embedding(NULL, tu_tensor((double[]){0}, 1, TU_SIZES(1), EM_I64)),
                   EM_ERR_NULL);
    tu_check_fails(em_embedding(w, NULL), EM_ERR_NULL);
}
END_TEST

/* ---- index_copy_ ---- */

/* dst's values after index_copy_(dst, dim, idx, src), in float64: every
 * element of src lands at its index along dim; then the call, checked
 * against them (dst is read back whole, so a write outside is caught). */
static void check_index_copy_at(int line, em_tensor *dst, int dim, const em_tensor *idx,
                                const em_tensor *src) {
    int nd = em_ndim(dst), d = dim < 0 ? dim + nd : dim;
    const int64_t *ds = em_sizes(dst), *ss = em_sizes(src);
    double *ref = tu_values(dst), *sv = tu_values(src), *iv = tu_values(idx);
    int64_t pos[EM_MAX_DIMS] = {0};
    if (em_numel(src) > 0) do {
            int64_t at[EM_MAX_DIMS];
            memcpy(at, pos, sizeof at);
            at[d] = (int64_t)iv[pos[d]];
            ref[tu_flat(nd, ds, at)] = sv[tu_flat(nd, ss, pos)];
        } while (tu_next(nd, ss, pos));
    em_status st = em_index_copy_(dst, dim, idx, src);
    ck_assert_msg(st == EM_OK, "line %d: index_copy_ failed: %s", line, em_last_error());
    tu_check_close_at(__FILE__, line, dst, ref, nd, ds, 0, 0);
    free(ref);
    free(sv);
    free(iv);
}
#define check_index_copy(dst, dim, idx, src) check_index_copy_at(__LINE__, dst, dim, idx, src)

START_TEST(test_index_copy_every_dtype) {
    for (int t = 0; t < NALL7; t++) {
        em_dtype dt = ALL7[t];
        for (int it = 0; it < 2; it++) {
            em_dtype idt = it ? EM_I64 : EM_I32;
            em_tensor *x = tu_random(1500 + t, 3, TU_SIZES(3, 4, 5), dt, 4.0);
            em_tensor *i0 = tu_tensor((double[]){2, 0}, 1, TU_SIZES(2), idt);
            em_tensor *i2 = tu_tensor((double[]){4, 1, 0}, 1, TU_SIZES(3), idt);
            check_index_copy(x, 0, i0, tu_random(1510 + t, 3, TU_SIZES(2, 4, 5), dt, 4.0));
            check_index_copy(x, 1, i0, tu_random(1520 + t, 3, TU_SIZES(3, 2, 5), dt, 4.0));
            check_index_copy(x, -1, i2, tu_random(1530 + t, 3, TU_SIZES(3, 4, 3), dt, 4.0));
            /* a 0-d index: one slice, as a KV cache's position */
            check_index_copy(x, 1, em_scalar(3, idt, em_cpu()),
                             tu_random(1540 + t, 3, TU_SIZES(3, 1, 5), dt, 4.0));
        }
    }
}
END_TEST

START_TEST(test_index_copy_noncontiguous) {
    for (int t = 0; t < NALL7; t++) {
        em_dtype dt = ALL7[t];
        em_tensor *base = tu_random(1600 + t, 3, TU_SIZES(3, 4, 5), dt, 4.0);
        double *before = tu_values(base);
        em_tensor *xt = em_transpose(base, 0, 2); /* [5, 4, 3]: writes reach base */
        em_tensor *idx = tu_tensor((double[]){9, 1, 9, 4}, 1, TU_SIZES(4), EM_I64);
        em_tensor *is = em_slice(idx, 0, 1, 4, 2); /* 1 4, stride 2 */
        em_tensor *src = em_transpose(tu_random(1610 + t, 3, TU_SIZES(3, 4, 2), dt, 4.0), 0, 2);
        ck_assert(!em_is_contiguous(src) && !em_is_contiguous(is));
        check_index_copy(xt, 0, is, src);
        /* base changed exactly where xt's rows 1 and 4 lie: its dim 2 */
        double *after = tu_values(base), *sv = tu_values(src);
        for (int64_t a = 0; a < 3; a++)
            for (int64_t b = 0; b < 4; b++)
                for (int64_t c = 0; c < 5; c++) {
                    int64_t k = (a * 4 + b) * 5 + c;
                    double want = c == 1 ? sv[(0 * 4 + b) * 3 + a] : c == 4 ? sv[(1 * 4 + b) * 3 + a]
                                                                           : before[k];
                    ck_assert_msg(after[k] == want || (want != want && after[k] != after[k]),
                                  "base[%lld][%lld][%lld]", (long long)a, (long long)b, (long long)c);
                }
        free(before);
        free(after);
        free(sv);
        /* a broadcast source (stride 0) and a sliced destination */
        em_tensor *y = tu_random(1620 + t, 2, TU_SIZES(6, 8), dt, 4.0);
        em_tensor *ys = em_slice(y, 1, 1, 8, 2); /* [6, 4] */
        em_tensor *row = em_expand(tu_random(1630 + t, 2, TU_SIZES(1, 4), dt, 4.0), 2, TU_SIZES(2, 4));
        check_index_copy(ys, 0, tu_tensor((double[]){5, 0}, 1, TU_SIZES(2), EM_I32), row);
    }
}
END_TEST

START_TEST(test_index_copy_empty) {
    em_tensor *x = tu_random(1700, 2, TU_SIZES(3, 4), EM_F32, 1.0);
    em_tensor *none = em_zeros(1, TU_SIZES(0), EM_I64, em_cpu());
    check_index_copy(x, 0, none, em_zeros(2, TU_SIZES(0, 4), EM_F32, em_cpu()));
    /* an empty other dim: nothing to write, the indices not read */
    em_tensor *e = em_zeros(2, TU_SIZES(0, 4), EM_F32, em_cpu());
    ck_assert_int_eq(em_index_copy_(e, 1, tu_tensor((double[]){7}, 1, TU_SIZES(1), EM_I64),
                                    em_zeros(2, TU_SIZES(0, 1), EM_F32, em_cpu())),
                     EM_OK);
    /* size-1 dims */
    em_tensor *one = tu_random(1710, 3, TU_SIZES(1, 1, 1), EM_F64, 1.0);
    check_index_copy(one, 2, em_scalar(0, EM_I32, em_cpu()), tu_random(1711, 3, TU_SIZES(1, 1, 1), EM_F64, 1.0));
}
END_TEST

START_TEST(test_index_copy_errors) {
    em_tensor *x = tu_random(1800, 2, TU_SIZES(3, 4), EM_F32, 1.0);
    em_tensor *src = tu_random(1801, 2, TU_SIZES(2, 4), EM_F32, 1.0);
    em_tensor *idx = tu_tensor((double[]){0, 2}, 1, TU_SIZES(2), EM_I64);
    double *before = tu_values(x);
    ck_assert_int_eq(em_index_copy_(NULL, 0, idx, src), EM_ERR_NULL);
    ck_assert_int_eq(em_index_copy_(x, 0, NULL, src), EM_ERR_NULL);
    ck_assert_int_eq(em_index_copy_(x, 0, idx, NULL), EM_ERR_NULL);
    ck_assert_int_eq(em_index_copy_(x, 2, idx, src), EM_ERR_DIM);
    ck_assert_int_eq(em_index_copy_(x, -3, idx, src), EM_ERR_DIM);
    ck_assert_int_eq(em_index_copy_(x, 1, idx, src), EM_ERR_SHAPE); /* src is [2, 4], not [3, 2] */
    ck_assert_int_eq(em_index_copy_(x, 0, em_cast(idx, EM_F32), src), EM_ERR_DTYPE);
    ck_assert_int_eq(em_index_copy_(x, 0, em_reshape(idx, 2, TU_SIZES(1, 2)), src), EM_ERR_SHAPE);
    ck_assert_int_eq(em_index_copy_(x, 0, idx, em_cast(src, EM_F64)), EM_ERR_DTYPE);
    ck_assert_int_eq(em_index_copy_(em_scalar(1, EM_F32, em_cpu()), 0, idx, src), EM_ERR_DIM);
    /* out of range, either way: nothing written */
    ck_assert_int_eq(em_index_copy_(x, 0, tu_tensor((double[]){0, 3}, 1, TU_SIZES(2), EM_I64), src),
                     EM_ERR_INDEX);
    ck_assert_int_eq(em_index_copy_(x, 0, tu_tensor((double[]){-1, 0}, 1, TU_SIZES(2), EM_I32), src),
                     EM_ERR_INDEX);
    /* a broadcast destination, and a source or indices inside the destination */
    em_tensor *bx = em_expand(tu_random(1802, 2, TU_SIZES(1, 4), EM_F32, 1.0), 2, TU_SIZES(3, 4));
    ck_assert_int_eq(em_index_copy_(bx, 0, idx, src), EM_ERR_ARG);
    ck_assert_int_eq(em_index_copy_(x, 0, idx, em_slice(x, 0, 0, 2, 1)), EM_ERR_ARG);
    em_tensor *ix = em_zeros(2, TU_SIZES(3, 4), EM_I64, em_cpu());
    ck_assert_int_eq(em_index_copy_(ix, 1, em_squeeze(em_slice(ix, 0, 0, 1, 1), 0), em_zeros(2, TU_SIZES(3, 4), EM_I64, em_cpu())),
                     EM_ERR_ARG);
    double *after = tu_values(x);
    for (int i = 0; i < 12; i++) ck_assert(before[i] == after[i]);
    free(before);
    free(after);
}
END_TEST

static Suite *suite(void) {
    const tu_test tests[] = {
        {"cat_dims_every_dtype", test_cat_dims_every_dtype},
        {"cat_noncontiguous", test_cat_noncontiguous},
        {"cat_empty", test_cat_empty},
        {"cat_promotes", test_cat_promotes},
        {"cat_large", test_cat_large},
        {"cat_errors", test_cat_errors},
        {"index_select_every_dtype", test_index_select_every_dtype},
        {"index_select_noncontiguous", test_index_select_noncontiguous},
        {"index_select_empty", test_index_select_empty},
        {"index_select_large", test_index_select_large},
        {"index_select_errors", test_index_select_errors},
        {"embedding", test_embedding},
        {"index_copy_every_dtype", test_index_copy_every_dtype},
        {"index_copy_noncontiguous", test_index_copy_noncontiguous},
        {"index_copy_empty", test_index_copy_empty},
        {"index_copy_errors", test_index_copy_errors},
    };
    return tu_suite("index", tests, sizeof tests / sizeof tests[0], 120);
}

int main(void) { return tu_run(suite()); }
