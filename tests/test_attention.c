/* test_attention.c - em_scaled_dot_product_attention (the decomposition),
 * the fused attention op's CPU kernel, the attention pass
 * (src/trace/attention.c) and compiled attention, each against a float64
 * reference computed here from the inputs' values. */
#include "testutil.h"

#include "cpu.h"

#include "engine.h"
#include "jit.h"
#include "trace.h"

#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- the float64 reference ---- */

typedef struct ref_in {
    const em_tensor *q, *k, *v, *mask; /* mask NULL: none */
    bool causal;
    double scale;                      /* NAN: 1/sqrt(D) */
} ref_in;

/* Broadcast batch sizes of q, k, v into sizes[0..nb); returns nb. */
static int ref_batch(const ref_in *r, int64_t *sizes) {
    const em_tensor *t[3] = {r->q, r->k, r->v};
    int nb = 0;
    for (int i = 0; i < 3; i++) nb = em_ndim(t[i]) - 2 > nb ? em_ndim(t[i]) - 2 : nb;
    for (int d = 0; d < nb; d++) {
        sizes[d] = 1;
        for (int i = 0; i < 3; i++) {
            int td = d - (nb - (em_ndim(t[i]) - 2));
            if (td >= 0 && em_size(t[i], td) != 1) sizes[d] = em_size(t[i], td);
        }
    }
    return nb;
}

/* One query row: out[0..Dv) for batch multi-index idx (rank nb + 2, with
 * idx[nb] the query). */
static void ref_row(const ref_in *r, const double *qv, const double *kv, const double *vv,
                    const double *mv, int nb, int64_t *idx, double scale, double *out) {
    int64_t Tk = em_size(r->k, -2), D = em_size(r->q, -1), Dv = em_size(r->v, -1), i = idx[nb];
    double *s = malloc(sizeof(double) * (size_t)(Tk + 1)), mx = -INFINITY;
    for (int64_t j = 0; j < Tk; j++) {
        double acc = 0;
        for (int64_t d = 0; d < D; d++) {
            idx[nb] = i, idx[nb + 1] = d;
            double a = tu_bcast_get(qv, em_ndim(r->q), em_sizes(r->q), nb + 2, idx);
            idx[nb] = j;
            acc += a * tu_bcast_get(kv, em_ndim(r->k), em_sizes(r->k), nb + 2, idx);
        }
        s[j] = acc * scale;
        if (mv) {
            idx[nb] = i, idx[nb + 1] = j;
            double m = tu_bcast_get(mv, em_ndim(r->mask), em_sizes(r->mask), nb + 2, idx);
            s[j] = em_dtype_of(r->mask) == EM_BOOL ? (m != 0 ? s[j] : -INFINITY) : s[j] + m;
        }
        if (r->causal && j > i) s[j] = -INFINITY;
        mx = fmax(mx, s[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < Tk; j++) sum += s[j] = exp(s[j] - mx); /* all -inf: NaN, as torch */
    for (int64_t e = 0; e < Dv; e++) {
        double acc = 0;
        for (int64_t j = 0; j < Tk; j++) {
            idx[nb] = j, idx[nb + 1] = e;
            acc += s[j] / sum * tu_bcast_get(vv, em_ndim(r->v), em_sizes(r->v), nb + 2, idx);
        }
        out[e] = acc;
    }
    idx[nb] = i;
    free(s);
}

/* The reference result (malloc'd) and its sizes. */
static double *ref_attention(const ref_in *r, int *ndim, int64_t *sizes) {
    int nb = ref_batch(r, sizes);
    int64_t Tq = em_size(r->q, -2), Dv = em_size(r->v, -1), D = em_size(r->q, -1);
    sizes[nb] = Tq;
    sizes[nb + 1] = Dv;
    *ndim = nb + 2;
    double scale = isnan(r->scale) ? (D > 0 ? 1 / sqrt((double)D) : 1) : r->scale;
    int64_t rows = Tq;
    for (int d = 0; d < nb; d++) rows *= sizes[d];
    double *out = malloc(sizeof(double) * (size_t)(rows * Dv + 1));
    double *qv = tu_values(r->q), *kv = tu_values(r->k), *vv = tu_values(r->v);
    double *mv = r->mask ? tu_values(r->mask) : NULL;
    int64_t idx[EM_MAX_DIMS + 2] = {0}, rowsz[EM_MAX_DIMS + 1];
    memcpy(rowsz, sizes, sizeof(int64_t) * (size_t)(nb + 1));
    for (int64_t row = 0; row < rows; row++) {
        ref_row(r, qv, kv, vv, mv, nb, idx, scale, out + row * Dv);
        tu_next(nb + 1, rowsz, idx);
    }
    free(qv), free(kv), free(vv), free(mv);
    return out;
}

static void check_against_ref(const em_tensor *y, const ref_in *r, double tol) {
    int nd;
    int64_t sizes[EM_MAX_DIMS + 2];
    double *ref = ref_attention(r, &nd, sizes);
    ck_assert_msg(y != NULL, "attention failed: %s", em_last_error());
    tu_check_close(y, ref, nd, sizes, tol, tol);
    free(ref);
}

/* em_scaled_dot_product_attention against the reference. */
static void check_sdpa(const ref_in *r, double tol) {
    em_tensor *y = em_scaled_dot_product_attention(r->q, r->k, r->v, r->mask, r->causal, r->scale);
    check_against_ref(y, r, tol);
}

static em_tensor *rnd(uint64_t seed, int ndim, const int64_t *sizes) {
    return tu_random(seed, ndim, sizes, EM_F32, 1.0);
}

/* A bool tensor from 0/1 values. */
static em_tensor *bools(const double *v, int ndim, const int64_t *sizes) {
    return tu_tensor(v, ndim, sizes, EM_BOOL);
}

/* ---- 1. the op, by decomposition ---- */

START_TEST(sdpa_plain_and_scaled) {
    em_tensor *q = rnd(1, 4, TU_SIZES(2, 3, 5, 8)), *k = rnd(2, 4, TU_SIZES(2, 3, 5, 8));
    em_tensor *v = rnd(3, 4, TU_SIZES(2, 3, 5, 6));
    check_sdpa(&(ref_in){q, k, v, NULL, false, EM_SCALE_DEFAULT}, 2e-5);
    check_sdpa(&(ref_in){q, k, v, NULL, false, 0.3}, 2e-5);
    check_sdpa(&(ref_in){q, k, v, NULL, false, -1.5}, 2e-5);
    check_sdpa(&(ref_in){q, k, v, NULL, false, 0}, 2e-5); /* uniform weights */
    /* f64 computes in f64 */
    em_tensor *qd = tu_random(4, 3, TU_SIZES(2, 7, 4), EM_F64, 1);
    em_tensor *kd = tu_random(5, 3, TU_SIZES(2, 9, 4), EM_F64, 1);
    em_tensor *vd = tu_random(6, 3, TU_SIZES(2, 9, 3), EM_F64, 1);
    em_tensor *y = em_scaled_dot_product_attention(qd, kd, vd, NULL, true, EM_SCALE_DEFAULT);
    ck_assert_int_eq(em_dtype_of(y), EM_F64);
    check_against_ref(y, &(ref_in){qd, kd, vd, NULL, true, EM_SCALE_DEFAULT}, 1e-12);
}
END_TEST

START_TEST(sdpa_masks) {
    em_tensor *q = rnd(1, 4, TU_SIZES(2, 3, 5, 8)), *k = rnd(2, 4, TU_SIZES(2, 3, 7, 8));
    em_tensor *v = rnd(3, 4, TU_SIZES(2, 3, 7, 4));
    /* additive, broadcast over batch and heads; and per batch, padding style */
    em_tensor *add = tu_random(4, 2, TU_SIZES(5, 7), EM_F32, 3.0);
    check_sdpa(&(ref_in){q, k, v, add, false, EM_SCALE_DEFAULT}, 2e-5);
    double pad[14] = {0, 0, 0, 0, 0, -1e9, -1e9, 0, 0, 0, -1e9, -1e9, -1e9, -1e9};
    em_tensor *padm = tu_tensor(pad, 4, TU_SIZES(2, 1, 1, 7), EM_F32);
    check_sdpa(&(ref_in){q, k, v, padm, false, EM_SCALE_DEFAULT}, 2e-5);
    /* bool: true keeps; per key, and a full [Tq, Tk] pattern */
    double keep[7] = {1, 0, 1, 1, 0, 1, 1};
    check_sdpa(&(ref_in){q, k, v, bools(keep, 1, TU_SIZES(7)), false, EM_SCALE_DEFAULT}, 2e-5);
    double full[35];
    for (int i = 0; i < 35; i++) full[i] = (i * 7 + 3) % 5 != 0 || i % 7 == 0;
    em_tensor *fm = bools(full, 3, TU_SIZES(1, 5, 7));
    check_sdpa(&(ref_in){q, k, v, fm, false, 0.5}, 2e-5);
    /* a query with every key dropped is NaN, as in torch */
    double none[35];
    for (int i = 0; i < 35; i++) none[i] = i >= 7;
    check_sdpa(&(ref_in){q, k, v, bools(none, 2, TU_SIZES(5, 7)), false, EM_SCALE_DEFAULT}, 2e-5);
}
END_TEST

START_TEST(sdpa_causal_shapes) {
    /* odd T, Tq != Tk both ways (upper-left aligned), T = 1 */
    int64_t shapes[][2] = {{9, 9}, {3, 7}, {7, 3}, {1, 1}, {1, 5}, {130, 130}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t Tq = shapes[s][0], Tk = shapes[s][1];
        em_tensor *q = rnd(10 + s, 3, TU_SIZES(2, Tq, 16)), *k = rnd(20 + s, 3, TU_SIZES(2, Tk, 16));
        em_tensor *v = rnd(30 + s, 3, TU_SIZES(2, Tk, 5));
        check_sdpa(&(ref_in){q, k, v, NULL, true, EM_SCALE_DEFAULT}, 2e-5);
        check_sdpa(&(ref_in){q, k, v, NULL, false, EM_SCALE_DEFAULT}, 2e-5);
    }
}
END_TEST

START_TEST(sdpa_edge_sizes) {
    /* size-0 batch, no keys (an empty sum: 0), D = 0, Dv = 0 */
    em_tensor *q0 = rnd(1, 4, TU_SIZES(0, 2, 4, 8)), *k0 = rnd(2, 4, TU_SIZES(0, 2, 4, 8));
    em_tensor *v0 = rnd(3, 4, TU_SIZES(0, 2, 4, 8));
    check_sdpa(&(ref_in){q0, k0, v0, NULL, true, EM_SCALE_DEFAULT}, 0);
    em_tensor *q = rnd(4, 3, TU_SIZES(1, 3, 8)), *ke = rnd(5, 3, TU_SIZES(1, 0, 8));
    em_tensor *ve = rnd(6, 3, TU_SIZES(1, 0, 4));
    check_sdpa(&(ref_in){q, ke, ve, NULL, false, EM_SCALE_DEFAULT}, 0);
    em_tensor *qz = rnd(7, 2, TU_SIZES(3, 0)), *kz = rnd(8, 2, TU_SIZES(4, 0));
    check_sdpa(&(ref_in){qz, kz, rnd(9, 2, TU_SIZES(4, 2)), NULL, false, EM_SCALE_DEFAULT}, 1e-6);
    check_sdpa(&(ref_in){q, rnd(10, 2, TU_SIZES(4, 8)), rnd(11, 2, TU_SIZES(4, 0)), NULL, false,
                         EM_SCALE_DEFAULT}, 0);
}
END_TEST

/* q, k, v as GPT-2 code makes them: one [B, T, 3C] projection, sliced,
 * split into heads and permuted (strides of the fused tensor). */
static void qkv_split(uint64_t seed, int64_t B, int64_t T, int64_t H, int64_t D, em_tensor **out) {
    em_tensor *qkv = rnd(seed, 3, TU_SIZES(B, T, 3 * H * D));
    for (int w = 0; w < 3; w++) {
        em_tensor *t = em_slice(qkv, -1, w * H * D, (w + 1) * H * D, 1);
        out[w] = em_transpose(em_reshape(t, 4, TU_SIZES(B, T, H, D)), 1, 2);
    }
}

START_TEST(sdpa_non_contiguous_and_broadcast) {
    em_tensor *qkv[3];
    qkv_split(1, 2, 11, 3, 8, qkv);
    ck_assert(!em_is_contiguous(qkv[0]));
    check_sdpa(&(ref_in){qkv[0], qkv[1], qkv[2], NULL, true, EM_SCALE_DEFAULT}, 2e-5);
    /* k given as the transpose of a [.., D, T] tensor; v permuted */
    em_tensor *q = rnd(2, 3, TU_SIZES(3, 6, 8));
    em_tensor *k = em_transpose(rnd(3, 3, TU_SIZES(3, 8, 9)), 1, 2);
    em_tensor *v = em_permute(rnd(4, 3, TU_SIZES(9, 3, 5)), 3, (int[]){1, 0, 2});
    check_sdpa(&(ref_in){q, k, v, NULL, false, EM_SCALE_DEFAULT}, 2e-5);
    /* batch dims broadcast: k without the batch dim, v of batch 1 */
    em_tensor *qb = rnd(5, 4, TU_SIZES(2, 4, 5, 8)), *kb = rnd(6, 3, TU_SIZES(4, 7, 8));
    em_tensor *vb = rnd(7, 4, TU_SIZES(1, 4, 7, 3));
    check_sdpa(&(ref_in){qb, kb, vb, NULL, false, EM_SCALE_DEFAULT}, 2e-5);
    /* an expanded (stride-0) mask */
    em_tensor *m = em_expand(tu_random(8, 2, TU_SIZES(1, 7), EM_F32, 2), 2, TU_SIZES(5, 7));
    check_sdpa(&(ref_in){qb, kb, vb, m, false, EM_SCALE_DEFAULT}, 2e-5);
}
END_TEST

START_TEST(sdpa_errors) {
    em_tensor *q = rnd(1, 3, TU_SIZES(2, 5, 8)), *k = rnd(2, 3, TU_SIZES(2, 7, 8));
    em_tensor *v = rnd(3, 3, TU_SIZES(2, 7, 4));
    double d = EM_SCALE_DEFAULT;
    tu_check_fails(em_scaled_dot_product_attention(NULL, k, v, NULL, false, d), EM_ERR_NULL);
    tu_check_fails(em_scaled_dot_product_attention(q, NULL, v, NULL, false, d), EM_ERR_NULL);
    tu_check_fails(em_scaled_dot_product_attention(q, k, NULL, NULL, false, d), EM_ERR_NULL);
    em_tensor *r1 = rnd(4, 1, TU_SIZES(8));
    tu_check_fails(em_scaled_dot_product_attention(r1, k, v, NULL, false, d), EM_ERR_DIM);
    tu_check_fails(em_scaled_dot_product_attention(q, rnd(5, 3, TU_SIZES(2, 7, 6)), v, NULL, false, d),
                   EM_ERR_SHAPE); /* head sizes */
    tu_check_fails(em_scaled_dot_product_attention(q, k, rnd(6, 3, TU_SIZES(2, 6, 4)), NULL, false, d),
                   EM_ERR_SHAPE); /* key lengths */
    tu_check_fails(em_scaled_dot_product_attention(q, rnd(7, 3, TU_SIZES(3, 7, 8)), v, NULL, false, d),
                   EM_ERR_SHAPE); /* batch dims */
    tu_check_fails(em_scaled_dot_product_attention(q, k, v, rnd(8, 2, TU_SIZES(5, 6)), false, d),
                   EM_ERR_SHAPE); /* mask does not broadcast */
    tu_check_fails(em_scaled_dot_product_attention(q, k, v, rnd(9, 4, TU_SIZES(3, 2, 5, 7)), false, d),
                   EM_ERR_SHAPE); /* mask would widen the scores */
    em_tensor *m = rnd(10, 2, TU_SIZES(5, 7));
    tu_check_fails(em_scaled_dot_product_attention(q, k, v, m, true, d), EM_ERR_ARG);
    tu_check_fails(em_scaled_dot_product_attention(q, k, v, NULL, false, INFINITY), EM_ERR_ARG);
    em_tensor *qi = tu_random(11, 3, TU_SIZES(2, 5, 8), EM_I32, 1);
    tu_check_fails(em_scaled_dot_product_attention(qi, k, v, NULL, false, d), EM_ERR_DTYPE);
    em_tensor *kd = tu_random(12, 3, TU_SIZES(2, 7, 8), EM_F64, 1);
    tu_check_fails(em_scaled_dot_product_attention(q, kd, v, NULL, false, d), EM_ERR_DTYPE);
    em_tensor *mi = tu_random(13, 2, TU_SIZES(5, 7), EM_I64, 1);
    tu_check_fails(em_scaled_dot_product_attention(q, k, v, mi, false, d), EM_ERR_DTYPE);
    /* a failed input keeps its error */
    em_clear_error();
    em_tensor *bad = em_reshape(q, 1, TU_SIZES(7));
    ck_assert_ptr_null(bad);
    em_status s = em_last_status();
    ck_assert_ptr_null(em_scaled_dot_product_attention(bad, k, v, NULL, false, d));
    ck_assert_int_eq(em_last_status(), s);
}
END_TEST

/* ---- 3. the fused op's CPU kernel (src/eager/cpu_attention.c) ---- */

/* The fused op, dispatched as a compiled plan's step dispatches it. */
static em_tensor *fused(const ref_in *r) {
    double D = (double)em_size(r->q, -1);
    em_op_attrs a = {0};
    a.value = isnan(r->scale) ? (D > 0 ? 1 / sqrt(D) : 1) : r->scale;
    a.causal = r->causal;
    em_tensor *in[4] = {(em_tensor *)r->q, (em_tensor *)r->k, (em_tensor *)r->v, (em_tensor *)r->mask};
    return em_dispatch(EM_OP_ATTENTION, r->mask ? 4 : 3, in, &a);
}

/* The fused kernel against the reference and against the decomposition
 * (the unfused graph's ops). */
static void check_fused(const ref_in *r, double tol) {
    em_tensor *y = fused(r);
    check_against_ref(y, r, tol);
    const em_tensor *mask = r->mask;
    em_tensor *u = em_scaled_dot_product_attention(r->q, r->k, r->v, mask, mask ? false : r->causal,
                                                   r->scale);
    if (mask && r->causal) return; /* the op refuses both; the reference covered it */
    double *uv = tu_values(u);
    tu_check_close(y, uv, em_ndim(u), em_sizes(u), tol, tol);
    free(uv);
}

START_TEST(fused_shapes_and_head_dims) {
    /* head dims 64 and 128, odd T, T = 1, several tiles of queries and
     * keys (BQ 128, BK 256), Tq != Tk */
    int64_t shapes[][3] = {{1, 1, 64}, {7, 7, 64}, {129, 129, 64}, {130, 600, 128}, {600, 130, 128},
                           {257, 257, 64}, {3, 520, 32}, {33, 5, 17}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t Tq = shapes[s][0], Tk = shapes[s][1], D = shapes[s][2];
        em_tensor *q = rnd(40 + s, 4, TU_SIZES(1, 2, Tq, D)), *k = rnd(50 + s, 4, TU_SIZES(1, 2, Tk, D));
        em_tensor *v = rnd(60 + s, 4, TU_SIZES(1, 2, Tk, D));
        for (int causal = 0; causal < 2; causal++)
            check_fused(&(ref_in){q, k, v, NULL, causal, EM_SCALE_DEFAULT}, 3e-5);
    }
}
END_TEST

START_TEST(fused_masks) {
    /* 2 query tiles of 128, 2 key tiles of 256 */
    em_tensor *q = rnd(1, 4, TU_SIZES(2, 3, 140, 64)), *k = rnd(2, 4, TU_SIZES(2, 3, 300, 64));
    em_tensor *v = rnd(3, 4, TU_SIZES(2, 3, 300, 64));
    /* padding style [B, 1, 1, Tk]: the last keys of batch 1 get -1e9 */
    double *pad = calloc(600, sizeof(double));
    for (int j = 200; j < 300; j++) pad[300 + j] = -1e9;
    em_tensor *pm = tu_tensor(pad, 4, TU_SIZES(2, 1, 1, 300), EM_F32);
    free(pad);
    check_fused(&(ref_in){q, k, v, pm, false, EM_SCALE_DEFAULT}, 3e-5);
    /* a full [Tq, Tk] mask, a per-key row, an expanded one, and a -inf
     * mask that drops every key of some queries (NaN rows) */
    em_tensor *full = tu_random(4, 2, TU_SIZES(140, 300), EM_F32, 2);
    check_fused(&(ref_in){q, k, v, full, false, 0.2}, 3e-5);
    check_fused(&(ref_in){q, k, v, full, true, 0.2}, 3e-5); /* the fused op takes both */
    em_tensor *row = tu_random(5, 1, TU_SIZES(300), EM_F32, 2);
    check_fused(&(ref_in){q, k, v, row, false, EM_SCALE_DEFAULT}, 3e-5);
    em_tensor *ex = em_expand(tu_random(6, 2, TU_SIZES(140, 1), EM_F32, 2), 2, TU_SIZES(140, 300));
    check_fused(&(ref_in){q, k, v, ex, false, EM_SCALE_DEFAULT}, 3e-5);
    double *drop = calloc(140 * 300, sizeof(double));
    for (int j = 0; j < 300; j++) drop[3 * 300 + j] = drop[139 * 300 + j] = -INFINITY;
    /* and a row whose first key tile is all dropped: the running max starts later */
    for (int j = 0; j < 256; j++) drop[70 * 300 + j] = -INFINITY;
    em_tensor *dm = tu_tensor(drop, 2, TU_SIZES(140, 300), EM_F32);
    free(drop);
    check_fused(&(ref_in){q, k, v, dm, false, EM_SCALE_DEFAULT}, 3e-5);
    /* -inf padding over whole key tiles (skipped): per key [B, 1, 1, Tk] with
     * batch 1 keeping only its first 20 keys, and the same as a full
     * [Tq, Tk] mask (checked row by row) */
    em_tensor *k6 = rnd(7, 4, TU_SIZES(2, 3, 600, 64)), *v6 = rnd(8, 4, TU_SIZES(2, 3, 600, 64));
    double *pinf = calloc(1200, sizeof(double));
    for (int j = 256; j < 512; j++) pinf[j] = -INFINITY;
    for (int j = 20; j < 600; j++) pinf[600 + j] = -INFINITY;
    em_tensor *pk = tu_tensor(pinf, 4, TU_SIZES(2, 1, 1, 600), EM_F32);
    check_fused(&(ref_in){q, k6, v6, pk, false, EM_SCALE_DEFAULT}, 3e-5);
    check_fused(&(ref_in){q, k6, v6, pk, true, EM_SCALE_DEFAULT}, 3e-5);
    em_tensor *pfull = em_contiguous(em_expand(pk, 4, TU_SIZES(2, 1, 140, 600)));
    check_fused(&(ref_in){q, k6, v6, pfull, false, 0.3}, 3e-5);
    free(pinf);
}
END_TEST

START_TEST(fused_non_contiguous_and_edges) {
    em_tensor *qkv[3];
    qkv_split(7, 2, 277, 2, 64, qkv); /* rows in place, row stride 3C; 3 query, 2 key tiles */
    check_fused(&(ref_in){qkv[0], qkv[1], qkv[2], NULL, true, EM_SCALE_DEFAULT}, 3e-5);
    /* columns strided (copied per tile): a transposed k and v */
    em_tensor *q = rnd(8, 3, TU_SIZES(2, 9, 16));
    em_tensor *k = em_transpose(rnd(9, 3, TU_SIZES(2, 16, 300)), 1, 2);
    em_tensor *v = em_transpose(rnd(10, 3, TU_SIZES(2, 8, 300)), 1, 2);
    check_fused(&(ref_in){q, k, v, NULL, false, EM_SCALE_DEFAULT}, 3e-5);
    /* broadcast batch (stride 0), an expanded k (row stride 0) */
    em_tensor *kb = em_expand(rnd(11, 3, TU_SIZES(1, 1, 16)), 3, TU_SIZES(3, 20, 16));
    check_fused(&(ref_in){rnd(12, 4, TU_SIZES(2, 3, 9, 16)), kb, rnd(13, 2, TU_SIZES(20, 4)), NULL,
                          false, EM_SCALE_DEFAULT}, 3e-5);
    /* size 0 batch, no keys, D = 0, Dv = 0 */
    check_fused(&(ref_in){rnd(14, 3, TU_SIZES(0, 4, 8)), rnd(15, 3, TU_SIZES(0, 4, 8)),
                          rnd(16, 3, TU_SIZES(0, 4, 8)), NULL, true, EM_SCALE_DEFAULT}, 0);
    check_fused(&(ref_in){rnd(17, 2, TU_SIZES(3, 8)), rnd(18, 2, TU_SIZES(0, 8)),
                          rnd(19, 2, TU_SIZES(0, 4)), NULL, false, EM_SCALE_DEFAULT}, 0);
    check_fused(&(ref_in){rnd(20, 2, TU_SIZES(3, 0)), rnd(21, 2, TU_SIZES(4, 0)),
                          rnd(22, 2, TU_SIZES(4, 2)), NULL, false, EM_SCALE_DEFAULT}, 1e-6);
    check_fused(&(ref_in){rnd(23, 2, TU_SIZES(3, 8)), rnd(24, 2, TU_SIZES(4, 8)),
                          rnd(25, 2, TU_SIZES(4, 0)), NULL, false, EM_SCALE_DEFAULT}, 0);
}
END_TEST

START_TEST(fused_op_errors) {
    em_tensor *q = rnd(1, 3, TU_SIZES(2, 5, 8)), *k = rnd(2, 3, TU_SIZES(2, 7, 8));
    em_tensor *v = rnd(3, 3, TU_SIZES(2, 7, 4));
    em_op_attrs a = {0};
    a.value = 0.5;
    tu_check_fails(em_dispatch(EM_OP_ATTENTION, 2, (em_tensor *[]){q, k}, &a), EM_ERR_ARG);
    em_tensor *qd = tu_random(4, 3, TU_SIZES(2, 5, 8), EM_F64, 1);
    tu_check_fails(em_dispatch(EM_OP_ATTENTION, 3, (em_tensor *[]){qd, k, v}, &a), EM_ERR_DTYPE);
    em_tensor *bm = tu_random(5, 2, TU_SIZES(5, 7), EM_BOOL, 1);
    tu_check_fails(em_dispatch(EM_OP_ATTENTION, 4, (em_tensor *[]){q, k, v, bm}, &a), EM_ERR_DTYPE);
    em_tensor *m6 = rnd(6, 2, TU_SIZES(5, 6));
    tu_check_fails(em_dispatch(EM_OP_ATTENTION, 4, (em_tensor *[]){q, k, v, m6}, &a), EM_ERR_SHAPE);
    a.value = INFINITY;
    tu_check_fails(em_dispatch(EM_OP_ATTENTION, 3, (em_tensor *[]){q, k, v}, &a), EM_ERR_ARG);
    /* half: one dtype for all (a bf16 q with f32 k, a f32 mask), and the
     * CPU kernel takes f32 only (the pass leaves half attention unfused
     * on the CPU) */
    a.value = 0.5;
    em_tensor *qh = em_cast(q, EM_BF16), *kh = em_cast(k, EM_BF16), *vh = em_cast(v, EM_BF16);
    tu_check_fails(em_dispatch(EM_OP_ATTENTION, 3, (em_tensor *[]){qh, k, vh}, &a), EM_ERR_DTYPE);
    em_tensor *m5 = rnd(7, 2, TU_SIZES(5, 7));
    tu_check_fails(em_dispatch(EM_OP_ATTENTION, 4, (em_tensor *[]){qh, kh, vh, m5}, &a), EM_ERR_DTYPE);
    tu_check_fails(em_dispatch(EM_OP_ATTENTION, 3, (em_tensor *[]){em_cast(q, EM_F16), kh, vh}, &a),
                   EM_ERR_DTYPE);
    tu_check_fails(em_dispatch(EM_OP_ATTENTION, 3, (em_tensor *[]){qh, kh, vh}, &a), EM_ERR_UNSUPPORTED);
}
END_TEST

/* ---- 2. the attention pass (src/trace/attention.c) ---- */

typedef void (*attn_fn)(em_tensor *const *in, em_tensor **out);

/* fn's graph, recorded and optimized as em_compile does. */
static tr_graph *record(attn_fn fn, int nin, em_tensor *const *in, int nout) {
    tr_recorder *r = tr_record_begin(nin, in, NULL);
    ck_assert_ptr_nonnull(r);
    em_tensor *out[4] = {0};
    fn(in, out);
    char why[256] = "";
    tr_graph *g = tr_record_end(r, nout, out, why, sizeof why);
    ck_assert_msg(g != NULL, "recording failed: %s %s", why, em_last_error());
    ck_assert_int_eq(tr_optimize(g, true), EM_OK);
    return g;
}

static int count_op(const tr_graph *g, em_op op) {
    int n = 0;
    for (int i = 0; i < g->nnodes; i++) n += g->nodes[i].kind == TR_CALL && g->nodes[i].op == op;
    return n;
}

/* Runs the pass on fn's graph: expects `want` fused nodes; for a rewrite,
 * checks the graph verifies, keeps no softmax (exp) and gives the unfused
 * graph's values; returns the text of the rewritten graph (em_free), or
 * NULL when nothing was fused. */
static char *check_pass(attn_fn fn, int nin, em_tensor *const *in, int nout, int want) {
    tr_graph *g = record(fn, nin, in, nout);
    int n = -2;
    tr_graph *f = tr_fuse_attention(g, &n);
    ck_assert_int_eq(n, want);
    char *text = NULL;
    if (want == 0) {
        ck_assert_ptr_null(f);
    } else {
        ck_assert_ptr_nonnull(f);
        ck_assert_int_eq(tr_verify(f), EM_OK);
        ck_assert_int_eq(count_op(f, EM_OP_ATTENTION), want);
        ck_assert_int_eq(count_op(f, EM_OP_EXP), 0);
        ck_assert_int_eq(count_op(g, EM_OP_ATTENTION), 0); /* g itself is untouched */
        em_tensor *yu[4] = {0}, *yf[4] = {0};
        ck_assert_int_eq(jit_exec_op_by_op(g, in, yu), EM_OK);
        ck_assert_int_eq(jit_exec_op_by_op(f, in, yf), EM_OK);
        for (int o = 0; o < nout; o++) {
            double *uv = tu_values(yu[o]);
            tu_check_close(yf[o], uv, em_ndim(yu[o]), em_sizes(yu[o]), 3e-5, 3e-5);
            free(uv);
        }
        text = tr_to_text(f);
        tr_graph_free(f);
    }
    tr_graph_free(g);
    return text;
}

enum { PB = 2, PT = 9, PH = 2, PD = 8, PC = PH * PD };

/* q, k, v of the [B, T, 3C] projection in[0], as gpt_block.c splits it. */
static void heads_of(em_tensor *qkv, em_tensor **h) {
    for (int w = 0; w < 3; w++) {
        em_tensor *t = em_slice(qkv, -1, w * PC, (w + 1) * PC, 1);
        h[w] = em_transpose(em_reshape(t, 4, TU_SIZES(PB, PT, PH, PD)), 1, 2);
    }
}

/* The causal mask as GPT-2 code builds it: future[i][j] = j > i, over t
 * positions on dev. */
static em_tensor *future_mask(int64_t t, em_device dev) {
    em_tensor *pos = em_arange(0, (double)t, 1, EM_I64, dev);
    return em_gt(em_unsqueeze(pos, 0), em_unsqueeze(pos, 1));
}

/* GPT-2 (examples/gpt_block.c): causal by arange/gt and where(-inf). */
static em_tensor *gpt_attention(em_tensor *qkv) {
    em_tensor *h[3];
    heads_of(qkv, h);
    em_tensor *future = future_mask(PT, em_cpu());
    em_tensor *att = em_mul_scalar(em_matmul(h[0], em_transpose(h[1], -2, -1)), 1.0 / sqrt(PD));
    att = em_softmax(em_where(future, em_scalar(-INFINITY, em_dtype_of(qkv), em_cpu()), att), -1);
    return em_matmul(att, h[2]);
}
static void gpt_fn(em_tensor *const *in, em_tensor **out) { out[0] = gpt_attention(in[0]); }

/* Two layers, the second merging heads back first. */
static void gpt2_fn(em_tensor *const *in, em_tensor **out) {
    em_tensor *y = em_reshape(em_contiguous(em_transpose(gpt_attention(in[0]), 1, 2)), 3,
                              TU_SIZES(PB, PT, PC));
    out[0] = gpt_attention(em_add(in[0], em_cat(3, (em_tensor *[]){y, y, y}, -1)));
}

/* MiniLM (examples/minilm/bert.c): an additive padding bias [B, 1, 1, T]. */
static void bert_fn(em_tensor *const *in, em_tensor **out) {
    em_tensor *h[3];
    heads_of(in[0], h);
    em_tensor *s = em_mul_scalar(em_matmul(h[0], em_transpose(h[1], -2, -1)), 1.0 / sqrt(PD));
    out[0] = em_matmul(em_softmax(em_add(s, in[1]), -1), h[2]);
}

/* The op itself, every mask form (queries of their own: attentions
 * sharing q and k would share their scores, which nothing may fuse). */
static void sdpa_fn(em_tensor *const *in, em_tensor **out) {
    em_tensor *h[3];
    heads_of(in[0], h);
    double d = EM_SCALE_DEFAULT;
    out[0] = em_scaled_dot_product_attention(h[0], h[1], h[2], NULL, true, d);
    out[1] = em_scaled_dot_product_attention(em_neg(h[0]), h[1], h[2], in[1], false, 0.25);
    out[2] = em_scaled_dot_product_attention(em_sin(h[0]), h[1], h[2], in[2], false, d);
    out[3] = em_scaled_dot_product_attention(em_cos(h[0]), h[1], h[2], NULL, false, d);
}

/* Two attentions over the same q and k: one score matrix (after CSE). */
static void shared_scores_fn(em_tensor *const *in, em_tensor **out) {
    em_tensor *h[3];
    heads_of(in[0], h);
    out[0] = em_scaled_dot_product_attention(h[0], h[1], h[2], NULL, false, EM_SCALE_DEFAULT);
    out[1] = em_scaled_dot_product_attention(h[0], h[1], h[1], NULL, false, EM_SCALE_DEFAULT);
}

/* Scales before the product (on q, and on k before its transpose), a
 * division after, the mask first: add(mask, S); keep-form causal:
 * where(j <= i, S, -inf) written as ge(i, j). */
static void scaled_early_fn(em_tensor *const *in, em_tensor **out) {
    em_tensor *h[3];
    heads_of(in[0], h);
    em_tensor *q = em_mul_scalar(h[0], 0.5), *kt = em_transpose(em_mul_scalar(h[1], 0.5), -2, -1);
    em_tensor *s = em_div_scalar(em_matmul(q, kt), 2.0);
    em_tensor *pos = em_arange(0, PT, 1, EM_I32, em_cpu());
    em_tensor *keep = em_ge(em_unsqueeze(pos, 1), em_unsqueeze(pos, 0));
    s = em_where(keep, em_add(in[1], s), em_scalar(-INFINITY, EM_F32, em_cpu()));
    out[0] = em_matmul(em_softmax(s, -1), h[2]);
}

static em_tensor *pass_qkv(void) { return rnd(77, 3, TU_SIZES(PB, PT, 3 * PC)); }

START_TEST(pass_rewrites_gpt_bert_and_the_op) {
    em_tensor *x = pass_qkv();
    char *t = check_pass(gpt_fn, 1, &x, 1, 1);
    ck_assert_msg(strstr(t, "= attention(") && strstr(t, "causal=true") &&
                  strstr(t, "value=0.35355339059327373"), "%s", t);
    ck_assert_ptr_null(strstr(t, "where(")); /* the causal mask is gone */
    em_free(t);
    /* the rewritten graph's values are the reference's */
    tr_graph *g = record(gpt_fn, 1, &x, 1);
    int n;
    tr_graph *f = tr_fuse_attention(g, &n);
    em_tensor *y = NULL, *h[3];
    ck_assert_int_eq(jit_exec_op_by_op(f, &x, &y), EM_OK);
    heads_of(x, h);
    check_against_ref(y, &(ref_in){h[0], h[1], h[2], NULL, true, EM_SCALE_DEFAULT}, 3e-5);
    tr_graph_free(f);
    tr_graph_free(g);
    em_free(check_pass(gpt2_fn, 1, &x, 1, 2));
    /* BERT: the padding bias is the fused node's mask */
    double pad[PB * PT] = {0};
    for (int j = 6; j < PT; j++) pad[PT + j] = -1e9;
    em_tensor *bias = tu_tensor(pad, 4, TU_SIZES(PB, 1, 1, PT), EM_F32);
    t = check_pass(bert_fn, 2, (em_tensor *[]){x, bias}, 1, 1);
    ck_assert_msg(strstr(t, "= attention(%4, %7, %10, %in1)") && strstr(t, "causal=false"), "%s", t);
    em_free(t);
    /* the op: causal, additive, bool (where(mask, 0, -inf) added), none */
    em_tensor *bm = tu_random(78, 2, TU_SIZES(PT, PT), EM_BOOL, 1);
    em_free(check_pass(sdpa_fn, 3, (em_tensor *[]){x, bias, bm}, 4, 4));
    em_free(check_pass(scaled_early_fn, 2, (em_tensor *[]){x, bias}, 1, 1));
}
END_TEST

/* fn run under autocast to dt. */
static void autocast_run(attn_fn fn, em_dtype dt, em_tensor *const *in, em_tensor **out) {
    ck_assert_int_eq(em_autocast_begin(dt), EM_OK);
    fn(in, out);
    em_autocast_end();
}

static void causal_sdpa_fn(em_tensor *const *in, em_tensor **out) {
    em_tensor *h[3];
    heads_of(in[0], h);
    out[0] = em_scaled_dot_product_attention(h[0], h[1], h[2], NULL, true, EM_SCALE_DEFAULT);
}
static void autocast_bf16_gpt_fn(em_tensor *const *in, em_tensor **out) { autocast_run(gpt_fn, EM_BF16, in, out); }
static void autocast_f16_gpt_fn(em_tensor *const *in, em_tensor **out) { autocast_run(gpt_fn, EM_F16, in, out); }
static void autocast_bf16_sdpa_fn(em_tensor *const *in, em_tensor **out) {
    autocast_run(causal_sdpa_fn, EM_BF16, in, out);
}
static void autocast_f16_sdpa_fn(em_tensor *const *in, em_tensor **out) {
    autocast_run(causal_sdpa_fn, EM_F16, in, out);
}

/* What a device's fused_attention_takes saw, and what it answers. */
typedef struct takes_log {
    bool answer;
    int calls;
    em_dtype dt;
    int64_t D, Dv;
} takes_log;

static bool takes_logged(void *ctx, em_dtype dt, int64_t D, int64_t Dv) {
    takes_log *t = ctx;
    t->calls++, t->dt = dt, t->D = D, t->Dv = Dv;
    return t->answer;
}

/* fn's graph in half dtype dt through the pass with takes answering yes:
 * want fused nodes of dtype dt (no exp left, and of the casts only
 * `casts`: none of the softmax's), each asked about once with head sizes
 * PD. */
static void check_half_pass(attn_fn fn, int nin, em_tensor *const *in, int nout, em_dtype dt, int want,
                            int casts) {
    tr_graph *g = record(fn, nin, in, nout);
    takes_log tl = {.answer = true};
    int n = -2;
    tr_graph *f = tr_fuse_attention_for(g, takes_logged, &tl, &n, NULL);
    ck_assert_int_eq(n, want);
    ck_assert_int_eq(tl.calls, want);
    if (want) {
        ck_assert_ptr_nonnull(f);
        ck_assert_int_eq(tr_verify(f), EM_OK);
        ck_assert_int_eq(count_op(f, EM_OP_ATTENTION), want);
        ck_assert_int_eq(count_op(f, EM_OP_EXP), 0);
        ck_assert_int_eq(count_op(f, EM_OP_CAST), casts);
        ck_assert(tl.dt == dt && tl.D == PD && tl.Dv == PD);
        for (int i = 0; i < f->nnodes; i++)
            if (f->nodes[i].kind == TR_CALL && f->nodes[i].op == EM_OP_ATTENTION)
                for (int j = 0; j < f->nodes[i].nin; j++)
                    ck_assert_int_eq(f->nodes[f->nodes[i].in[j]].meta.dtype, dt);
    }
    tr_graph_free(f);
    tr_graph_free(g);
}

/* Half graphs: the pass's decision.  The CPU's (tr_fuse_attention, f32
 * only: its kernel takes f32) leaves bf16 and f16 attention alone; a
 * device that takes half operands (tr_fuse_attention_for, as CUDA on
 * sm_80) gets them fused, the f32 softmax's two casts included, unless it
 * says no for their dtype and head sizes; so does an f32 program under
 * autocast (k^T cast after its transpose, the -inf fill cast).  A mask of
 * another dtype (an f32 bias on bf16 scores promotes the softmax's input
 * to f32) is left alone.  The values are checked on a GPU
 * (fused_on_cuda_half_*, compiled_half_on_cuda_fuses_each_layer). */
START_TEST(pass_half_graphs) {
    for (int d = 0; d < 2; d++) {
        em_dtype dt = d ? EM_F16 : EM_BF16;
        em_tensor *x = em_cast(pass_qkv(), dt);
        tr_graph *g = record(gpt_fn, 1, &x, 1);
        int n = -2;
        ck_assert_ptr_null(tr_fuse_attention(g, &n));
        ck_assert_int_eq(n, 0);
        takes_log no = {.answer = false};
        ck_assert_ptr_null(tr_fuse_attention_for(g, takes_logged, &no, &n, NULL));
        ck_assert(n == 0 && no.calls == 1 && no.dt == dt);
        tr_graph_free(g);
        check_half_pass(gpt_fn, 1, &x, 1, dt, 1, 0);
        check_half_pass(gpt2_fn, 1, &x, 1, dt, 2, 0);
        double pad[PB * PT] = {0};
        for (int j = 6; j < PT; j++) pad[PT + j] = -1e9;
        em_tensor *bias = tu_tensor(pad, 4, TU_SIZES(PB, 1, 1, PT), dt);
        check_half_pass(bert_fn, 2, (em_tensor *[]){x, bias}, 1, dt, 1, 0);
        em_tensor *bm = tu_random(78, 2, TU_SIZES(PT, PT), EM_BOOL, 1);
        check_half_pass(sdpa_fn, 3, (em_tensor *[]){x, bias, bm}, 4, dt, 4, 0);
        em_tensor *fbias = tu_tensor(pad, 4, TU_SIZES(PB, 1, 1, PT), EM_F32);
        check_half_pass(bert_fn, 2, (em_tensor *[]){x, fbias}, 1, dt, 0, 0);
        /* f32 attention is fused whatever takes says (it is not asked) */
        em_tensor *xf = pass_qkv();
        /* under autocast: an f32 program whose matmuls cast q, k^T, p and
         * v to dt (k^T's cast becomes k's: the casts of q, k and v stay) */
        check_half_pass(dt == EM_BF16 ? autocast_bf16_gpt_fn : autocast_f16_gpt_fn, 1, &xf, 1, dt, 1, 3);
        check_half_pass(dt == EM_BF16 ? autocast_bf16_sdpa_fn : autocast_f16_sdpa_fn, 1, &xf, 1, dt, 1, 3);
        g = record(gpt_fn, 1, &xf, 1);
        no.calls = 0;
        tr_graph *f = tr_fuse_attention_for(g, takes_logged, &no, &n, NULL);
        ck_assert(f && n == 1 && no.calls == 0);
        tr_graph_free(f);
        tr_graph_free(g);
    }
}
END_TEST

/* Near-misses, each left alone. */
static void other_dim_fn(em_tensor *const *in, em_tensor **out) {
    em_tensor *h[3];
    heads_of(in[0], h);
    out[0] = em_matmul(em_softmax(em_matmul(h[0], em_transpose(h[1], -2, -1)), -2), h[2]);
}
static void tensor_scale_fn(em_tensor *const *in, em_tensor **out) {
    em_tensor *h[3];
    heads_of(in[0], h);
    em_tensor *s = em_mul(em_matmul(h[0], em_transpose(h[1], -2, -1)), in[1]); /* [T] scale */
    out[0] = em_matmul(em_softmax(s, -1), h[2]);
}
static void finite_fill_fn(em_tensor *const *in, em_tensor **out) {
    em_tensor *h[3];
    heads_of(in[0], h);
    em_tensor *future = future_mask(PT, em_cpu());
    em_tensor *s = em_matmul(h[0], em_transpose(h[1], -2, -1));
    s = em_where(future, em_scalar(-1e9, EM_F32, em_cpu()), s);
    out[0] = em_matmul(em_softmax(s, -1), h[2]);
}
static void bool_where_fn(em_tensor *const *in, em_tensor **out) { /* not causal: any bool */
    em_tensor *h[3];
    heads_of(in[0], h);
    em_tensor *s = em_matmul(h[0], em_transpose(h[1], -2, -1));
    s = em_where(in[1], s, em_scalar(-INFINITY, EM_F32, em_cpu()));
    out[0] = em_matmul(em_softmax(s, -1), h[2]);
}
static void anti_causal_fn(em_tensor *const *in, em_tensor **out) { /* j < i: not torch's */
    em_tensor *h[3];
    heads_of(in[0], h);
    em_tensor *pos = em_arange(0, PT, 1, EM_I64, em_cpu());
    em_tensor *past = em_lt(em_unsqueeze(pos, 0), em_unsqueeze(pos, 1));
    em_tensor *s = em_matmul(h[0], em_transpose(h[1], -2, -1));
    s = em_where(past, em_scalar(-INFINITY, EM_F32, em_cpu()), s);
    out[0] = em_matmul(em_softmax(s, -1), h[2]);
}
static void probs_out_fn(em_tensor *const *in, em_tensor **out) {
    em_tensor *h[3];
    heads_of(in[0], h);
    out[1] = em_softmax(em_matmul(h[0], em_transpose(h[1], -2, -1)), -1);
    out[0] = em_matmul(out[1], h[2]);
}
static void scores_reused_fn(em_tensor *const *in, em_tensor **out) {
    em_tensor *h[3];
    heads_of(in[0], h);
    em_tensor *s = em_matmul(h[0], em_transpose(h[1], -2, -1));
    out[0] = em_add(em_matmul(em_softmax(s, -1), h[2]), em_sum(s, 1, (int[]){-1}, true));
}
static void scaled_mask_fn(em_tensor *const *in, em_tensor **out) { /* (S + m) * c */
    em_tensor *h[3];
    heads_of(in[0], h);
    em_tensor *s = em_mul_scalar(em_add(em_matmul(h[0], em_transpose(h[1], -2, -1)), in[1]), 0.3);
    out[0] = em_matmul(em_softmax(s, -1), h[2]);
}
static void negative_after_causal_fn(em_tensor *const *in, em_tensor **out) {
    em_tensor *h[3];
    heads_of(in[0], h);
    em_tensor *future = future_mask(PT, em_cpu());
    em_tensor *s = em_matmul(h[0], em_transpose(h[1], -2, -1));
    s = em_mul_scalar(em_where(future, em_scalar(-INFINITY, EM_F32, em_cpu()), s), -0.5);
    out[0] = em_matmul(em_softmax(s, -1), h[2]);
}
static void untransposed_key_fn(em_tensor *const *in, em_tensor **out) { /* k^T is an input */
    em_tensor *h[3];
    heads_of(in[0], h);
    out[0] = em_matmul(em_softmax(em_matmul(h[0], in[1]), -1), h[2]);
}
/* Scores scaled 5 times (fused, the scales multiplied) or 100 times
 * (past the walk's bound: left alone, and no deep recursion). */
static void scale_chain(em_tensor *const *in, em_tensor **out, int n) {
    em_tensor *h[3];
    heads_of(in[0], h);
    em_tensor *s = em_matmul(h[0], em_transpose(h[1], -2, -1));
    for (int i = 0; i < n; i++) s = em_mul_scalar(s, i % 2 ? 1.25 : 0.8);
    out[0] = em_matmul(em_softmax(s, -1), h[2]);
}
static void scale5_fn(em_tensor *const *in, em_tensor **out) { scale_chain(in, out, 5); }
static void scale100_fn(em_tensor *const *in, em_tensor **out) { scale_chain(in, out, 100); }

static void f64_fn(em_tensor *const *in, em_tensor **out) {
    em_tensor *h[3];
    heads_of(em_cast(in[0], EM_F64), h);
    out[0] = em_scaled_dot_product_attention(h[0], h[1], h[2], NULL, true, EM_SCALE_DEFAULT);
}

START_TEST(pass_leaves_near_misses) {
    em_tensor *x = pass_qkv();
    ck_assert_ptr_null(check_pass(other_dim_fn, 1, &x, 1, 0));
    em_tensor *ts = rnd(3, 1, TU_SIZES(PT));
    ck_assert_ptr_null(check_pass(tensor_scale_fn, 2, (em_tensor *[]){x, ts}, 1, 0));
    ck_assert_ptr_null(check_pass(finite_fill_fn, 1, &x, 1, 0));
    em_tensor *bm = tu_random(4, 2, TU_SIZES(PT, PT), EM_BOOL, 1);
    ck_assert_ptr_null(check_pass(bool_where_fn, 2, (em_tensor *[]){x, bm}, 1, 0));
    ck_assert_ptr_null(check_pass(anti_causal_fn, 1, &x, 1, 0));
    ck_assert_ptr_null(check_pass(probs_out_fn, 1, &x, 2, 0));
    ck_assert_ptr_null(check_pass(scores_reused_fn, 1, &x, 1, 0));
    em_tensor *m = rnd(5, 2, TU_SIZES(PT, PT));
    ck_assert_ptr_null(check_pass(scaled_mask_fn, 2, (em_tensor *[]){x, m}, 1, 0));
    ck_assert_ptr_null(check_pass(negative_after_causal_fn, 1, &x, 1, 0));
    em_tensor *kt = rnd(6, 4, TU_SIZES(PB, PH, PD, PT));
    ck_assert_ptr_null(check_pass(untransposed_key_fn, 2, (em_tensor *[]){x, kt}, 1, 0));
    ck_assert_ptr_null(check_pass(f64_fn, 1, &x, 1, 0));
    ck_assert_ptr_null(check_pass(shared_scores_fn, 1, &x, 2, 0));
    ck_assert_ptr_null(check_pass(scale100_fn, 1, &x, 1, 0));
    em_free(check_pass(scale5_fn, 1, &x, 1, 1));
}
END_TEST

static void sdpa_causal_fn(em_tensor *const *in, em_tensor **out) {
    out[0] = em_scaled_dot_product_attention(in[0], in[1], in[2], NULL, true, EM_SCALE_DEFAULT);
}

/* Golden text: the op's causal decomposition becomes one node; the
 * arange, comparison, where and softmax are gone. */
START_TEST(pass_golden_text) {
    em_tensor *q = rnd(1, 4, TU_SIZES(1, 2, 3, 4)), *k = rnd(2, 4, TU_SIZES(1, 2, 5, 4));
    em_tensor *v = rnd(3, 4, TU_SIZES(1, 2, 5, 6));
    char *t = check_pass(sdpa_causal_fn, 3, (em_tensor *[]){q, k, v}, 1, 1);
    ck_assert_str_eq(t, "graph(%in0: f32[1, 2, 3, 4]{24, 12, 4, 1}, %in1: f32[1, 2, 5, 4]{40, 20, 4, 1}, "
                        "%in2: f32[1, 2, 5, 6]{60, 30, 6, 1}) {\n"
                        "  %3 = attention(%in0, %in1, %in2) [value=0.5, causal=true] : "
                        "f32[1, 2, 3, 6]{36, 18, 6, 1}\n"
                        "  return (%3)\n"
                        "}\n");
    em_free(t);
}
END_TEST

/* The rewritten graph prints and parses back to the same text. */
START_TEST(pass_text_round_trip) {
    em_tensor *x = pass_qkv();
    char *t = check_pass(gpt_fn, 1, &x, 1, 1);
    tr_graph *p = tr_parse_placeholders(t);
    ck_assert_msg(p != NULL, "%s", em_last_error());
    char *t2 = tr_to_text(p);
    ck_assert_str_eq(t, t2);
    em_free(t2);
    tr_graph_free(p);
    em_free(t);
}
END_TEST

/* ---- compiled: one fused attention step per layer ---- */

/* A transformer's weights for the compiled tests: per layer the qkv and
 * output projections. */
enum { CL = 2 };
typedef struct model {
    int64_t C, NH;
    bool causal_gpt;          /* GPT-2 blocks; else MiniLM encoder layers (padding bias) */
    em_dtype autocast;        /* EM_F32: none; else compiled and run under autocast to it */
    em_tensor *w_qkv[CL], *b_qkv[CL], *w_o[CL], *ln_w, *ln_b;
} model;

static em_tensor *split_heads(const model *m, em_tensor *qkv, int w, int64_t B, int64_t T) {
    em_tensor *t = em_slice(qkv, -1, w * m->C, (w + 1) * m->C, 1);
    return em_transpose(em_reshape(t, 4, (int64_t[]){B, T, m->NH, m->C / m->NH}), 1, 2);
}

/* One layer, written as examples/gpt_block.c (causal, arange/gt/where) or
 * examples/minilm/bert.c (an additive bias [B, 1, 1, T]) write it. */
static em_tensor *layer(const model *m, int l, em_tensor *x, em_tensor *bias) {
    int64_t B = em_size(x, 0), T = em_size(x, 1), HD = m->C / m->NH;
    em_tensor *h = em_layer_norm(x, 1, m->ln_w, m->ln_b, 1e-5);
    em_tensor *qkv = em_add(em_matmul(h, m->w_qkv[l]), m->b_qkv[l]);
    em_tensor *q = split_heads(m, qkv, 0, B, T), *k = split_heads(m, qkv, 1, B, T);
    em_tensor *v = split_heads(m, qkv, 2, B, T);
    em_tensor *s = em_mul_scalar(em_matmul(q, em_transpose(k, -2, -1)), 1.0 / sqrt((double)HD));
    if (m->causal_gpt) {
        em_tensor *future = future_mask(T, em_device_of(x));
        s = em_where(future, em_scalar(-INFINITY, em_dtype_of(x), em_device_of(x)), s);
    } else {
        s = em_add(s, bias);
    }
    em_tensor *y = em_matmul(em_softmax(s, -1), v);
    y = em_reshape(em_transpose(y, 1, 2), 3, (int64_t[]){B, T, m->C});
    return em_add(x, em_matmul(y, m->w_o[l]));
}

static em_status model_fn(void *ctx, em_tensor *const *in, const double *sc, em_tensor **out) {
    const model *m = ctx;
    em_tensor *x = in[0];
    for (int l = 0; l < CL; l++) x = layer(m, l, x, m->causal_gpt ? NULL : in[1]);
    out[0] = x;
    return x ? EM_OK : em_last_status();
}

static void model_init(model *m, int64_t C, int64_t NH, bool gpt) {
    *m = (model){.C = C, .NH = NH, .causal_gpt = gpt};
    for (int l = 0; l < CL; l++) {
        m->w_qkv[l] = tu_random(100 + l, 2, TU_SIZES(C, 3 * C), EM_F32, 1 / sqrt((double)C));
        m->b_qkv[l] = tu_random(110 + l, 1, TU_SIZES(3 * C), EM_F32, 0.1);
        m->w_o[l] = tu_random(120 + l, 2, TU_SIZES(C, C), EM_F32, 1 / sqrt((double)C));
    }
    m->ln_w = tu_random(130, 1, TU_SIZES(C), EM_F32, 1);
    m->ln_b = tu_random(131, 1, TU_SIZES(C), EM_F32, 0.1);
}

/* m's weights as dtype dt (on the device they are on). */
static void model_cast(model *m, em_dtype dt) {
    for (int l = 0; l < CL; l++) {
        m->w_qkv[l] = em_cast(m->w_qkv[l], dt);
        m->b_qkv[l] = em_cast(m->b_qkv[l], dt);
        m->w_o[l] = em_cast(m->w_o[l], dt);
    }
    m->ln_w = em_cast(m->ln_w, dt);
    m->ln_b = em_cast(m->ln_b, dt);
}

static int count_str(const char *s, const char *w) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, w)); p += strlen(w)) n++;
    return n;
}

/* Compiles m's two layers (backend auto: the inputs' device), runs them
 * twice, and checks the log shows one fused attention node per layer,
 * rewritten for device dev ("cpu", "cuda"), and the values match eager
 * mode within tol. */
static void check_compiled_on(const model *m, int nin, em_tensor *const *in, const char *dev,
                              double tol, int want) {
    char path[64];
    tu_log_begin("graph", path, sizeof path);
    em_compile_options o = {.ninputs = nin, .noutputs = 1, .name = "layers", .dynamic = -1,
                            .autocast = m->autocast};
    em_compiled *f = em_compile(model_fn, (void *)m, &o);
    tu_log_end();
    ck_assert_ptr_nonnull(f);
    em_tensor *ye = NULL, *yc = NULL;
    if (m->autocast != EM_F32) ck_assert_int_eq(em_autocast_begin(m->autocast), EM_OK);
    ck_assert_int_eq(model_fn((void *)m, in, NULL, &ye), EM_OK);
    if (m->autocast != EM_F32) em_autocast_end();
    for (int r = 0; r < 2; r++) /* the trace, then the compiled plan */
        ck_assert_msg(em_call(f, in, NULL, &yc) == EM_OK, "%s", em_last_error());
    em_compile_stats st;
    ck_assert_int_eq(em_compiled_stats(f, &st), EM_OK);
    ck_assert_int_eq(st.hits, 1);
    em_compiled_free(f);
    char *log = tu_log_take(path);
    ck_assert_msg(strstr(log, "captured graph of layers"), "%s", log);
    char line[64];
    snprintf(line, sizeof line, "%s: %d attention patterns fused:", dev, want);
    ck_assert_msg(!want || strstr(log, line), "%s", log);
    ck_assert_msg(count_str(log, " = attention(") == want, "%s", log);
    ck_assert_msg(count_str(log, m->causal_gpt ? "causal=true" : "causal=false") == want, "%s", log);
    free(log);
    double *ev = tu_values(ye);
    tu_check_close(yc, ev, em_ndim(ye), em_sizes(ye), tol, tol);
    free(ev);
}

static void check_compiled(const model *m, int nin, em_tensor *const *in) {
    check_compiled_on(m, nin, in, "cpu", 1e-4, CL);
}

/* Dynamic shapes: compiled with every dim dynamic from the first call
 * (T = 67), the one entry serves T = 45 and 90 with its fused steps (the
 * attention node's shape and causal flag follow T; the arange the causal
 * mask was built from is gone) and matches eager at each. */
static void check_dynamic(const model *m, bool bias) {
    char path[64];
    tu_log_begin("graph", path, sizeof path);
    em_compile_options o = {.ninputs = bias ? 2 : 1, .noutputs = 1, .name = "layers", .dynamic = 1};
    em_compiled *f = em_compile(model_fn, (void *)m, &o);
    tu_log_end();
    const int64_t Ts[] = {67, 45, 90};
    for (int i = 0; i < 3; i++) {
        int64_t T = Ts[i];
        double *pad = calloc((size_t)(2 * T), sizeof(double));
        for (int64_t j = T - 5; j < T; j++) pad[T + j] = -1e9;
        em_tensor *in[2] = {tu_random(150 + i, 3, TU_SIZES(2, T, m->C), EM_F32, 1),
                            tu_tensor(pad, 4, TU_SIZES(2, 1, 1, T), EM_F32)};
        free(pad);
        em_tensor *ye = NULL, *yc = NULL;
        ck_assert_int_eq(model_fn((void *)m, in, NULL, &ye), EM_OK);
        ck_assert_msg(em_call(f, in, NULL, &yc) == EM_OK, "%s", em_last_error());
        double *ev = tu_values(ye);
        tu_check_close(yc, ev, em_ndim(ye), em_sizes(ye), 1e-4, 1e-4);
        free(ev);
    }
    em_compile_stats st;
    ck_assert_int_eq(em_compiled_stats(f, &st), EM_OK);
    ck_assert_msg(st.traces == 1 && st.dynamic_entries == 1, "traces %lld, dynamic entries %d: %s",
                  (long long)st.traces, st.dynamic_entries, st.last_failure);
    em_compiled_free(f);
    char *log = tu_log_take(path);
    ck_assert_msg(strstr(log, "cpu: 2 attention patterns fused:"), "%s", log);
    ck_assert_msg(count_str(log, " = attention(") == CL, "%s", log);
    free(log);
}

START_TEST(compiled_dynamic_sizes_stay_fused) {
    model m;
    model_init(&m, 128, 2, true);
    check_dynamic(&m, false);
    model_init(&m, 128, 2, false);
    check_dynamic(&m, true);
}
END_TEST

/* t's values in a new tensor on dev. */
static em_tensor *on_device(const em_tensor *t, em_device dev) {
    size_t n = em_dtype_size(em_dtype_of(t)) * (size_t)em_numel(t);
    void *buf = malloc(n + 1);
    ck_assert_int_eq(em_copy_to_host(t, buf, n), EM_OK);
    em_tensor *r = em_from_data(buf, em_dtype_of(t), em_ndim(t), em_sizes(t), dev);
    free(buf);
    ck_assert_ptr_nonnull(r);
    return r;
}

START_TEST(compiled_gpt_block_fuses_each_layer) {
    model m;
    model_init(&m, 128, 2, true); /* head dim 64, odd T over two query tiles */
    em_tensor *x = tu_random(140, 3, TU_SIZES(2, 67, 128), EM_F32, 1);
    check_compiled(&m, 1, &x);
}
END_TEST

START_TEST(compiled_minilm_layers_fuse_each_layer) {
    model m;
    model_init(&m, 256, 2, false); /* head dim 128 */
    int64_t B = 2, T = 21;
    double *pad = calloc((size_t)(B * T), sizeof(double));
    for (int64_t j = 15; j < T; j++) pad[T + j] = -1e9; /* the second sentence is shorter */
    em_tensor *bias = tu_tensor(pad, 4, TU_SIZES(B, 1, 1, T), EM_F32);
    free(pad);
    em_tensor *in[2] = {tu_random(141, 3, TU_SIZES(B, T, 256), EM_F32, 1), bias};
    check_compiled(&m, 2, in);
}
END_TEST

/* A bf16 GPT-2 block and an f16 MiniLM layer compiled on the CPU keep
 * their attention unfused (the CPU's fused kernel takes f32 only) and
 * match eager mode.  Tolerance: compiled kernels compute chains of
 * pointwise ops in f32 and round once where eager rounds after each op:
 * a few roundings (2^-8 relative for bf16) of values up to ~4 in the
 * residual stream, over two layers. */
START_TEST(compiled_half_on_cpu_stays_unfused) {
    for (int gpt = 1; gpt >= 0; gpt--) {
        em_dtype dt = gpt ? EM_BF16 : EM_F16;
        model m;
        model_init(&m, 128, 2, gpt);
        model_cast(&m, dt);
        int64_t B = 2, T = gpt ? 67 : 21;
        double *pad = calloc((size_t)(B * T), sizeof(double));
        for (int64_t j = T - 6; j < T; j++) pad[T + j] = -1e4;
        em_tensor *in[2] = {tu_random(142, 3, TU_SIZES(B, T, 128), dt, 1),
                            tu_tensor(pad, 4, TU_SIZES(B, 1, 1, T), dt)};
        free(pad);
        check_compiled_on(&m, gpt ? 1 : 2, in, "cpu", 6e-2, 0);
    }
}
END_TEST

/* ---- the kernel without OpenBLAS (its plain tile loops) ---- */

/* Largest difference of the fused op (f32, its loops) from the
 * decomposition computed in f64 on the same values.  Child code: no
 * Check macro may run outside a test (each one reports to the runner). */
static double loops_error(const ref_in *r) {
    em_tensor *y = fused(r);
    em_tensor *u = em_scaled_dot_product_attention(em_cast(r->q, EM_F64), em_cast(r->k, EM_F64),
                                                   em_cast(r->v, EM_F64),
                                                   r->mask ? em_cast(r->mask, EM_F64) : NULL,
                                                   r->causal, r->scale);
    double err = INFINITY;
    if (y && u && em_item(em_amax(em_abs(em_sub(em_cast(y, EM_F64), u)), 0, NULL, false), &err) != EM_OK)
        err = INFINITY;
    return err == err ? err : INFINITY;
}

/* The child of fused_without_blas_uses_its_loops, under an address-space
 * limit that leaves OpenBLAS no room (cpu_matmul.c): exit 2 if BLAS is
 * in use anyway, 1 on a wrong value, 0 when every case matches. */
static int loops_child(void) {
    if (em_blas_ready(EM_F32)) return 2;
    em_scope_begin();
    em_generator *g = em_generator_new(5);
    em_tensor *q = em_randn(g, 3, TU_SIZES(2, 130, 24), EM_F32, em_cpu());
    em_tensor *k = em_randn(g, 3, TU_SIZES(2, 300, 24), EM_F32, em_cpu());
    em_tensor *v = em_transpose(em_randn(g, 3, TU_SIZES(2, 5, 300), EM_F32, em_cpu()), 1, 2);
    em_tensor *m = em_randn(g, 2, TU_SIZES(130, 300), EM_F32, em_cpu()); /* columns strided: v */
    const ref_in cases[] = {{q, k, v, NULL, true, EM_SCALE_DEFAULT}, {q, k, v, m, false, 0.3},
                            {q, k, v, NULL, false, EM_SCALE_DEFAULT}};
    double err = 0;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        double e = loops_error(&cases[c]);
        err = e > err ? e : err;
    }
    em_generator_free(g);
    em_scope_end();
    return err <= 3e-5 ? 0 : 1;
}

START_TEST(fused_without_blas_uses_its_loops) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
    return; /* a sanitizer's shadow memory does not fit under RLIMIT_AS */
#endif
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    ck_assert(n > 0);
    self[n] = '\0';
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        /* two threads need 2 x ~128 MiB of OpenBLAS buffers: 160 MB is too little */
        setenv("EMBER_NUM_THREADS", "2", 1);
        struct rlimit r = {160l << 20, 160l << 20};
        setrlimit(RLIMIT_AS, &r);
        execl(self, self, "--loops-child", (char *)NULL);
        _exit(127);
    }
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child's status %#x (exit 1: wrong "
                  "values, 2: OpenBLAS was usable)", st);
}
END_TEST

/* ---- the fused op's CUDA kernel (src/jit/cuda/cuda_attention.c) ---- */

static bool gpu_or_skip(const char *test) {
    char why[256];
    if (tu_probe_gpu(why, sizeof why)) return true;
    printf("%s: skipped, no CUDA device: %s\n", test, why);
    return false;
}

static em_tensor *gpu(const em_tensor *t) { return on_device(t, em_cuda(0)); }

/* A random f32 tensor made on the GPU (the CPU's values, copied). */
static em_tensor *grnd(uint64_t seed, int ndim, const int64_t *sizes) {
    return gpu(rnd(seed, ndim, sizes));
}

/* The kernel's tiles are 64 queries x 64 keys: shapes around and across
 * them, head dims 64 and 128 and odd ones, T = 1, Tq != Tk, each against
 * the float64 reference and the decomposition run on the GPU. */
START_TEST(fused_on_cuda_shapes_and_head_dims) {
    if (!gpu_or_skip("fused_on_cuda_shapes_and_head_dims")) return;
    int64_t shapes[][3] = {{1, 1, 64},    {7, 7, 64},     {63, 65, 64},  {129, 129, 64},
                           {130, 600, 128}, {600, 130, 128}, {257, 257, 64}, {3, 520, 32},
                           {33, 5, 17},   {1, 300, 128},  {100, 1, 80},  {65, 64, 256}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t Tq = shapes[s][0], Tk = shapes[s][1], D = shapes[s][2];
        em_tensor *q = grnd(40 + s, 4, TU_SIZES(1, 2, Tq, D)), *k = grnd(50 + s, 4, TU_SIZES(1, 2, Tk, D));
        em_tensor *v = grnd(60 + s, 4, TU_SIZES(1, 2, Tk, D));
        for (int causal = 0; causal < 2; causal++)
            check_fused(&(ref_in){q, k, v, NULL, causal, EM_SCALE_DEFAULT}, 3e-5);
    }
}
END_TEST

START_TEST(fused_on_cuda_masks) {
    if (!gpu_or_skip("fused_on_cuda_masks")) return;
    em_tensor *q = grnd(1, 4, TU_SIZES(2, 3, 140, 64)), *k = grnd(2, 4, TU_SIZES(2, 3, 300, 64));
    em_tensor *v = grnd(3, 4, TU_SIZES(2, 3, 300, 64));
    double *pad = calloc(600, sizeof(double)); /* [B, 1, 1, Tk] padding, -1e9 */
    for (int j = 200; j < 300; j++) pad[300 + j] = -1e9;
    em_tensor *pm = gpu(tu_tensor(pad, 4, TU_SIZES(2, 1, 1, 300), EM_F32));
    free(pad);
    check_fused(&(ref_in){q, k, v, pm, false, EM_SCALE_DEFAULT}, 3e-5);
    em_tensor *full = gpu(tu_random(4, 2, TU_SIZES(140, 300), EM_F32, 2));
    check_fused(&(ref_in){q, k, v, full, false, 0.2}, 3e-5);
    check_fused(&(ref_in){q, k, v, full, true, 0.2}, 3e-5);
    check_fused(&(ref_in){q, k, v, gpu(tu_random(5, 1, TU_SIZES(300), EM_F32, 2)), false,
                          EM_SCALE_DEFAULT}, 3e-5);
    em_tensor *ex = em_expand(grnd(6, 2, TU_SIZES(140, 1)), 2, TU_SIZES(140, 300));
    check_fused(&(ref_in){q, k, v, ex, false, EM_SCALE_DEFAULT}, 3e-5);
    /* -inf over every key of some queries (NaN rows, as the decomposition
     * gives), and over the first key tiles of another (its running max
     * starts late) */
    double *drop = calloc(140 * 300, sizeof(double));
    for (int j = 0; j < 300; j++) drop[3 * 300 + j] = drop[139 * 300 + j] = -INFINITY;
    for (int j = 0; j < 256; j++) drop[70 * 300 + j] = -INFINITY;
    em_tensor *dm = gpu(tu_tensor(drop, 2, TU_SIZES(140, 300), EM_F32));
    free(drop);
    check_fused(&(ref_in){q, k, v, dm, false, EM_SCALE_DEFAULT}, 3e-5);
    check_fused(&(ref_in){q, k, v, dm, true, EM_SCALE_DEFAULT}, 3e-5);
}
END_TEST

START_TEST(fused_on_cuda_layouts_and_edges) {
    if (!gpu_or_skip("fused_on_cuda_layouts_and_edges")) return;
    /* a qkv split made on the GPU: rows strided by 3C, heads permuted */
    int64_t B = 2, T = 277, H = 2, D = 64;
    em_tensor *all = grnd(7, 3, TU_SIZES(B, T, 3 * H * D)), *qkv[3];
    for (int w = 0; w < 3; w++) {
        em_tensor *t = em_slice(all, -1, w * H * D, (w + 1) * H * D, 1);
        qkv[w] = em_transpose(em_reshape(t, 4, TU_SIZES(B, T, H, D)), 1, 2);
    }
    ck_assert(!em_is_contiguous(qkv[0]));
    check_fused(&(ref_in){qkv[0], qkv[1], qkv[2], NULL, true, EM_SCALE_DEFAULT}, 3e-5);
    /* columns strided: a transposed k and v */
    em_tensor *q = grnd(8, 3, TU_SIZES(2, 9, 16));
    em_tensor *k = em_transpose(grnd(9, 3, TU_SIZES(2, 16, 300)), 1, 2);
    em_tensor *v = em_transpose(grnd(10, 3, TU_SIZES(2, 8, 300)), 1, 2);
    check_fused(&(ref_in){q, k, v, NULL, false, EM_SCALE_DEFAULT}, 3e-5);
    /* broadcast batch (stride 0), an expanded k (row stride 0) */
    em_tensor *kb = em_expand(grnd(11, 3, TU_SIZES(1, 1, 16)), 3, TU_SIZES(3, 20, 16));
    check_fused(&(ref_in){grnd(12, 4, TU_SIZES(2, 3, 9, 16)), kb, grnd(13, 2, TU_SIZES(20, 4)), NULL,
                          false, EM_SCALE_DEFAULT}, 3e-5);
    /* size 0 batch, no keys (zeros), D = 0 and Dv = 200 (past the kernel:
     * the host path) */
    check_fused(&(ref_in){grnd(14, 3, TU_SIZES(0, 4, 8)), grnd(15, 3, TU_SIZES(0, 4, 8)),
                          grnd(16, 3, TU_SIZES(0, 4, 8)), NULL, true, EM_SCALE_DEFAULT}, 0);
    check_fused(&(ref_in){grnd(17, 2, TU_SIZES(3, 8)), grnd(18, 2, TU_SIZES(0, 8)),
                          grnd(19, 2, TU_SIZES(0, 4)), NULL, false, EM_SCALE_DEFAULT}, 0);
    check_fused(&(ref_in){grnd(20, 2, TU_SIZES(3, 0)), grnd(21, 2, TU_SIZES(4, 0)),
                          grnd(22, 2, TU_SIZES(4, 2)), NULL, false, EM_SCALE_DEFAULT}, 1e-6);
    check_fused(&(ref_in){grnd(23, 2, TU_SIZES(70, 8)), grnd(24, 2, TU_SIZES(90, 8)),
                          grnd(25, 2, TU_SIZES(90, 200)), NULL, true, EM_SCALE_DEFAULT}, 3e-5);
}
END_TEST

/* At most 8 queries, the decode kernel (keys split over blocks, the
 * chunks merged by each row's last block): key counts around its 32-key
 * chunks and 128-key sub-tiles, head dims 64, 128 and odd ones, causal,
 * a decoder's mask over a static cache (-inf past the position, and a
 * whole row -inf: NaN), a qkv split, more rows than the device's
 * counters (one chunk a row); each against the float64 reference and the
 * decomposition, and again through the tiled kernels
 * (EMBER_CUDA_ATTENTION=tiled).  A repeated call gives the same bits (the
 * counters are left at 0). */
START_TEST(fused_on_cuda_decode_queries) {
    if (!gpu_or_skip("fused_on_cuda_decode_queries")) return;
    for (int tiled = 0; tiled < 2; tiled++) {
        if (tiled) setenv("EMBER_CUDA_ATTENTION", "tiled", 1);
        int64_t shapes[][4] = {{1, 1, 64, 64}, {1, 31, 64, 64}, {1, 128, 64, 64}, {2, 129, 128, 128},
                               {8, 1000, 64, 64}, {3, 4097, 17, 100}, {5, 33, 256, 1}};
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            int64_t Tq = shapes[s][0], Tk = shapes[s][1], D = shapes[s][2], Dv = shapes[s][3];
            em_scope_begin();
            em_tensor *q = grnd(300 + s, 4, TU_SIZES(2, 3, Tq, D)), *k = grnd(310 + s, 4, TU_SIZES(2, 3, Tk, D));
            em_tensor *v = grnd(320 + s, 4, TU_SIZES(2, 3, Tk, Dv));
            for (int causal = 0; causal < 2; causal++)
                check_fused(&(ref_in){q, k, v, NULL, causal, EM_SCALE_DEFAULT}, 3e-5);
            em_scope_end();
        }
        /* a decoder's step: 12 heads, a cache of 300, positions 0..pos */
        int64_t B = 2, H = 12, T = 300, pos = 170;
        double *m = malloc(sizeof(double) * (size_t)T);
        for (int64_t j = 0; j < T; j++) m[j] = j <= pos ? 0 : -INFINITY;
        em_tensor *mask = gpu(tu_tensor(m, 2, TU_SIZES(1, T), EM_F32));
        for (int64_t j = 0; j < T; j++) m[j] = -INFINITY;
        em_tensor *none = gpu(tu_tensor(m, 2, TU_SIZES(1, T), EM_F32));
        free(m);
        em_tensor *q = grnd(330, 4, TU_SIZES(B, H, 1, 64)), *k = grnd(331, 4, TU_SIZES(B, H, T, 64));
        em_tensor *v = grnd(332, 4, TU_SIZES(B, H, T, 64));
        check_fused(&(ref_in){q, k, v, mask, false, EM_SCALE_DEFAULT}, 3e-5);
        check_fused(&(ref_in){q, k, v, none, false, 0.3}, 3e-5);
        /* q, k and v from one qkv row a token, heads permuted */
        em_tensor *all = grnd(333, 3, TU_SIZES(B, 1, 3 * H * 64)), *qkv[3];
        for (int w = 0; w < 3; w++) {
            em_tensor *t = em_slice(all, -1, w * H * 64, (w + 1) * H * 64, 1);
            qkv[w] = em_transpose(em_reshape(t, 4, TU_SIZES(B, 1, H, 64)), 1, 2);
        }
        check_fused(&(ref_in){qkv[0], k, v, mask, false, EM_SCALE_DEFAULT}, 3e-5);
        check_fused(&(ref_in){qkv[0], qkv[1], qkv[2], NULL, true, EM_SCALE_DEFAULT}, 3e-5);
        /* 4160 query rows: more than the counters */
        check_fused(&(ref_in){grnd(334, 3, TU_SIZES(520 * 8, 1, 8)), grnd(335, 3, TU_SIZES(520 * 8, 40, 8)),
                              grnd(336, 3, TU_SIZES(520 * 8, 40, 8)), NULL, false, EM_SCALE_DEFAULT}, 3e-5);
        /* the same call again: the same bits */
        float first[2 * 12 * 64], again[2 * 12 * 64];
        ck_assert(em_copy_to_host(fused(&(ref_in){q, k, v, mask, false, EM_SCALE_DEFAULT}), first, sizeof first) ==
                  EM_OK);
        for (int r = 0; r < 20; r++) {
            em_scope_begin();
            ck_assert(em_copy_to_host(fused(&(ref_in){q, k, v, mask, false, EM_SCALE_DEFAULT}), again,
                                      sizeof again) == EM_OK);
            ck_assert_int_eq(memcmp(first, again, sizeof first), 0);
            em_scope_end();
        }
    }
    unsetenv("EMBER_CUDA_ATTENTION");
}
END_TEST

/* m's weights copied to the GPU. */
static void model_to_gpu(model *m) {
    for (int l = 0; l < CL; l++) {
        m->w_qkv[l] = gpu(m->w_qkv[l]);
        m->b_qkv[l] = gpu(m->b_qkv[l]);
        m->w_o[l] = gpu(m->w_o[l]);
    }
    m->ln_w = gpu(m->ln_w);
    m->ln_b = gpu(m->ln_b);
}

/* ---- half operands on CUDA (f16, bf16: m16n8k16 tensor cores) ---- */

/* A random tensor of dtype dt made on the GPU (the CPU's f32 values,
 * rounded to dt). */
static em_tensor *hrnd(em_dtype dt, uint64_t seed, int ndim, const int64_t *sizes, double scale) {
    return gpu(tu_random(seed, ndim, sizes, dt, scale));
}

/* The unit roundoff (half an ulp of 1, the largest relative error of a
 * rounding to nearest) of half dtype dt: 2^-8 for bf16 (8 significant
 * bits), 2^-11 for f16 (11). */
static double unit_roundoff(em_dtype dt) { return dt == EM_BF16 ? 0x1p-8 : 0x1p-11; }

static double max_abs_of(const em_tensor *t) {
    double *v = tu_values(t), mx = 0;
    for (int64_t i = 0; i < em_numel(t); i++) mx = fabs(v[i]) > mx ? fabs(v[i]) : mx;
    free(v);
    return mx;
}

/* The largest absolute and relative (to max(|want|, 1e-3)) differences
 * of got from want over n values, and whether every one is within atol +
 * rtol |want| (NaN must meet NaN); *at: the worst place by the bound. */
static bool compare(const double *got, const double *want, int64_t n, double atol, double rtol, double *abs_err,
                    double *rel_err, int64_t *at) {
    bool ok = true;
    double worst = -1;
    *abs_err = *rel_err = 0, *at = -1;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(want[i]) || isnan(got[i])) {
            if (isnan(want[i]) != isnan(got[i])) ok = false, *at = i, worst = INFINITY;
            continue;
        }
        double e = fabs(got[i] - want[i]), over = e - (atol + rtol * fabs(want[i]));
        *abs_err = e > *abs_err ? e : *abs_err;
        *rel_err = e / fmax(fabs(want[i]), 1e-3) > *rel_err ? e / fmax(fabs(want[i]), 1e-3) : *rel_err;
        if (over > worst) worst = over, *at = i;
        ok = ok && over <= 0;
    }
    return ok;
}

/* The fused op on r's half operands (dtype dt) against the float64
 * reference computed from their rounded values, and against the unfused
 * decomposition on the GPU; prints label's errors, and fails with them.
 *
 * Tolerance against the reference, with u the unit roundoff: the
 * products accumulate in f32 and the softmax runs in f32 (errors ~1e-6,
 * negligible); the probabilities are rounded to the half type for p v,
 * each by at most u relative, which moves out = sum p_j v_j / l by at
 * most u max|v| (l sums the unrounded p, as FlashAttention's does); the
 * result is rounded once, u |out|.  So atol = 1.5 u max|v|, rtol = 1.5 u
 * (the half for exp2f and the scale's rounding to f32).  The unfused
 * graph rounds the scores, their scaling and masking to the half type too
 * (logits off by a few u times their size, ~1-4 here): 10 u both. */
static void check_half(const char *label, const ref_in *r) {
    em_dtype dt = em_dtype_of(r->q);
    double u = unit_roundoff(dt), vmax = max_abs_of(r->v);
    em_tensor *y = fused(r);
    ck_assert_msg(y != NULL, "%s: %s", label, em_last_error());
    ck_assert_int_eq(em_dtype_of(y), dt);
    int nd;
    int64_t sizes[EM_MAX_DIMS + 2];
    double *ref = ref_attention(r, &nd, sizes), *got = tu_values(y);
    ck_assert_int_eq(nd, em_ndim(y));
    ck_assert_int_eq(memcmp(sizes, em_sizes(y), sizeof(int64_t) * (size_t)nd), 0);
    double ae, re;
    int64_t at, n = em_numel(y);
    bool ok = compare(got, ref, n, 1.5 * u * vmax + 1e-6, 1.5 * u, &ae, &re, &at);
    printf("%s (%s): max abs error %.3g, max rel error %.3g (atol %.3g, rtol %.3g)\n", label,
           em_dtype_name(dt), ae, re, 1.5 * u * vmax + 1e-6, 1.5 * u);
    ck_assert_msg(ok, "%s (%s): max abs error %.3g, max rel error %.3g; worst at %lld: %g, want %g", label,
                  em_dtype_name(dt), ae, re, (long long)at, at >= 0 ? got[at] : 0, at >= 0 ? ref[at] : 0);
    free(ref);
    if (!(r->mask && r->causal)) { /* the op refuses both; the reference covered it */
        em_tensor *un = em_scaled_dot_product_attention(r->q, r->k, r->v, r->mask, r->causal, r->scale);
        ck_assert_msg(un != NULL, "%s: %s", label, em_last_error());
        double *uv = tu_values(un);
        ok = compare(got, uv, n, 10 * u * fmax(vmax, 1), 10 * u, &ae, &re, &at);
        ck_assert_msg(ok, "%s (%s) against the unfused graph: max abs error %.3g, max rel error %.3g; worst at "
                      "%lld: %g, unfused %g", label, em_dtype_name(dt), ae, re, (long long)at,
                      at >= 0 ? got[at] : 0, at >= 0 ? uv[at] : 0);
        free(uv);
    }
    free(got);
}

/* Runs test(dt) for bf16 and f16 when there is a GPU. */
static void on_gpu_in_half(const char *name, void (*test)(em_dtype dt)) {
    if (!gpu_or_skip(name)) return;
    test(EM_BF16);
    test(EM_F16);
}

/* Shapes around and across the tiles of each tiling (128 queries x 32
 * keys for small heads, 128 x 64 up to 128, 64 x 32 past), head dims 64
 * and 128, odd ones (padded to 16), 144 and 256, T = 1, odd T, Tq != Tk
 * both ways, causal or not (causal blocks skipped, warps before the
 * diagonal idle), many key tiles through the two-stage ring, in bf16 and
 * f16. */
static void half_shapes(em_dtype dt) {
    int64_t shapes[][4] = {{1, 1, 64, 64},      {7, 7, 64, 64},     {63, 65, 64, 64},  {129, 129, 64, 64},
                           {130, 600, 128, 128}, {600, 130, 128, 128}, {257, 257, 64, 64}, {3, 520, 32, 32},
                           {33, 5, 17, 17},      {1, 300, 128, 128}, {100, 1, 80, 80},  {65, 64, 256, 128},
                           {70, 90, 64, 8},      {1000, 1000, 64, 64}, {200, 333, 64, 64}, {127, 97, 128, 128},
                           {300, 300, 64, 32},   {129, 40, 144, 64}, {33, 33, 128, 64}, {385, 1100, 128, 128}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t Tq = shapes[s][0], Tk = shapes[s][1], D = shapes[s][2], Dv = shapes[s][3];
        em_scope_begin();
        em_tensor *q = hrnd(dt, 40 + s, 4, TU_SIZES(1, 2, Tq, D), 1);
        em_tensor *k = hrnd(dt, 50 + s, 4, TU_SIZES(1, 2, Tk, D), 1);
        em_tensor *v = hrnd(dt, 60 + s, 4, TU_SIZES(1, 2, Tk, Dv), 1);
        for (int causal = 0; causal < 2; causal++) {
            char label[96];
            snprintf(label, sizeof label, "Tq %lld Tk %lld D %lld Dv %lld%s", (long long)Tq, (long long)Tk,
                     (long long)D, (long long)Dv, causal ? " causal" : "");
            check_half(label, &(ref_in){q, k, v, NULL, causal, EM_SCALE_DEFAULT});
        }
        em_scope_end();
    }
}

START_TEST(fused_on_cuda_half_shapes) { on_gpu_in_half("fused_on_cuda_half_shapes", half_shapes); }
END_TEST

/* Additive masks in the half type: padding [B, 1, 1, Tk] (-1e4: finite in
 * f16), a full [Tq, Tk] one with and without causal, a per-key row, an
 * expanded column (stride 0), -inf over whole key tiles (skipped) and
 * over every key of some queries (NaN rows), with head dims 64 and 128;
 * an odd number of keys, and mask rows not 4-byte aligned. */
static void half_masks(em_dtype dt) {
    for (int64_t D = 64; D <= 128; D *= 2) {
        em_scope_begin();
        em_tensor *q = hrnd(dt, 1, 4, TU_SIZES(2, 3, 140, D), 1), *k = hrnd(dt, 2, 4, TU_SIZES(2, 3, 300, D), 1);
        em_tensor *v = hrnd(dt, 3, 4, TU_SIZES(2, 3, 300, D), 1);
        double *pad = calloc(600, sizeof(double));
        for (int j = 200; j < 300; j++) pad[300 + j] = -1e4;
        check_half("padding mask", &(ref_in){q, k, v, gpu(tu_tensor(pad, 4, TU_SIZES(2, 1, 1, 300), dt)), false,
                                             EM_SCALE_DEFAULT});
        free(pad);
        em_tensor *full = hrnd(dt, 4, 2, TU_SIZES(140, 300), 2);
        check_half("full mask", &(ref_in){q, k, v, full, false, 0.2});
        check_half("full mask, causal", &(ref_in){q, k, v, full, true, 0.2});
        check_half("row mask", &(ref_in){q, k, v, hrnd(dt, 5, 1, TU_SIZES(300), 2), false, EM_SCALE_DEFAULT});
        em_tensor *ex = em_expand(hrnd(dt, 6, 2, TU_SIZES(140, 1), 2), 2, TU_SIZES(140, 300));
        check_half("expanded mask", &(ref_in){q, k, v, ex, false, EM_SCALE_DEFAULT});
        double *drop = calloc(140 * 300, sizeof(double));
        for (int j = 0; j < 300; j++) drop[3 * 300 + j] = drop[139 * 300 + j] = -INFINITY;
        for (int j = 0; j < 256; j++) drop[70 * 300 + j] = -INFINITY;
        for (int i = 0; i < 140; i++)
            for (int j = 64; j < 192; j++) drop[i * 300 + j] = -INFINITY; /* two whole key tiles */
        em_tensor *dm = gpu(tu_tensor(drop, 2, TU_SIZES(140, 300), dt));
        free(drop);
        check_half("-inf mask", &(ref_in){q, k, v, dm, false, EM_SCALE_DEFAULT});
        check_half("-inf mask, causal", &(ref_in){q, k, v, dm, true, EM_SCALE_DEFAULT});
        em_scope_end();
    }
    /* an odd number of keys: the mask read two keys a load up to the last
     * (rows of 78, 4-byte aligned), and one whose rows start at odd
     * elements (a slice from column 1: one key a load) */
    em_scope_begin();
    em_tensor *q = hrnd(dt, 32, 4, TU_SIZES(2, 2, 50, 64), 1), *k = hrnd(dt, 33, 4, TU_SIZES(2, 2, 77, 64), 1);
    em_tensor *v = hrnd(dt, 34, 4, TU_SIZES(2, 2, 77, 64), 1), *m78 = hrnd(dt, 35, 2, TU_SIZES(50, 78), 2);
    check_half("mask, odd keys", &(ref_in){q, k, v, em_slice(m78, -1, 0, 77, 1), false, EM_SCALE_DEFAULT});
    check_half("mask, odd keys, causal", &(ref_in){q, k, v, em_slice(m78, -1, 0, 77, 1), true, 0.3});
    check_half("mask rows unaligned", &(ref_in){q, k, v, em_slice(m78, -1, 1, 78, 1), false, EM_SCALE_DEFAULT});
    em_scope_end();
}

START_TEST(fused_on_cuda_half_masks) { on_gpu_in_half("fused_on_cuda_half_masks", half_masks); }
END_TEST

/* Layouts: a qkv split read in place (rows strided by 3C, heads
 * permuted: 16-byte vector loads), one whose rows are not 16-byte
 * aligned (D 20: element loads), k alone unaligned, columns strided (a transposed k and v),
 * broadcast batch and an expanded k; EMBER_CUDA_ATTENTION=simt (which
 * half operands ignore); the edges: no keys (zeros), an
 * empty batch; and head sizes past the kernel's (Dv 200), which the host
 * cannot run in half: EM_ERR_UNSUPPORTED, never a wrong value. */
static void half_layouts_and_edges(em_dtype dt) {
    const int64_t heads[][2] = {{2, 64}, {3, 128}, {1, 20}};
    for (int c = 0; c < 3; c++) {
        int64_t B = 2, T = 277, H = heads[c][0], D = heads[c][1];
        em_tensor *all = hrnd(dt, 7 + c, 3, TU_SIZES(B, T, 3 * H * D), 1), *qkv[3];
        for (int w = 0; w < 3; w++) {
            em_tensor *t = em_slice(all, -1, w * H * D, (w + 1) * H * D, 1);
            qkv[w] = em_transpose(em_reshape(t, 4, TU_SIZES(B, T, H, D)), 1, 2);
        }
        ck_assert(!em_is_contiguous(qkv[0]));
        char label[64];
        snprintf(label, sizeof label, "qkv split, D %lld", (long long)D);
        check_half(label, &(ref_in){qkv[0], qkv[1], qkv[2], NULL, true, EM_SCALE_DEFAULT});
        check_half(label, &(ref_in){qkv[0], qkv[1], qkv[2], NULL, false, 0.3});
    }
    /* k's rows 16-byte aligned in no batch (a slice from column 1 of rows
     * of 65: element loads, not cp.async) beside q and v that are: each
     * operand takes its own path in one kernel */
    em_tensor *k65 = hrnd(dt, 29, 4, TU_SIZES(2, 2, 150, 65), 1);
    check_half("k rows unaligned", &(ref_in){hrnd(dt, 30, 4, TU_SIZES(2, 2, 150, 64), 1),
                                             em_slice(k65, -1, 1, 65, 1),
                                             hrnd(dt, 31, 4, TU_SIZES(2, 2, 150, 64), 1), NULL, true,
                                             EM_SCALE_DEFAULT});
    /* EMBER_CUDA_ATTENTION does not apply to half operands (tensor cores only) */
    setenv("EMBER_CUDA_ATTENTION", "simt", 1);
    check_half("EMBER_CUDA_ATTENTION=simt", &(ref_in){hrnd(dt, 26, 3, TU_SIZES(2, 1, 64), 1),
                                                       hrnd(dt, 27, 3, TU_SIZES(2, 77, 64), 1),
                                                       hrnd(dt, 28, 3, TU_SIZES(2, 77, 64), 1), NULL, true,
                                                       EM_SCALE_DEFAULT});
    unsetenv("EMBER_CUDA_ATTENTION");
    em_tensor *q = hrnd(dt, 8, 3, TU_SIZES(2, 9, 16), 1);
    em_tensor *k = em_transpose(hrnd(dt, 9, 3, TU_SIZES(2, 16, 300), 1), 1, 2);
    em_tensor *v = em_transpose(hrnd(dt, 10, 3, TU_SIZES(2, 8, 300), 1), 1, 2);
    check_half("columns strided", &(ref_in){q, k, v, NULL, false, EM_SCALE_DEFAULT});
    em_tensor *kb = em_expand(hrnd(dt, 11, 3, TU_SIZES(1, 1, 16), 1), 3, TU_SIZES(3, 20, 16));
    check_half("broadcast", &(ref_in){hrnd(dt, 12, 4, TU_SIZES(2, 3, 9, 16), 1), kb,
                                      hrnd(dt, 13, 2, TU_SIZES(20, 4), 1), NULL, false, EM_SCALE_DEFAULT});
    /* no keys: zeros, as the f32 kernel; an empty batch: nothing */
    em_tensor *y = fused(&(ref_in){hrnd(dt, 17, 2, TU_SIZES(3, 8), 1), hrnd(dt, 18, 2, TU_SIZES(0, 8), 1),
                                   hrnd(dt, 19, 2, TU_SIZES(0, 4), 1), NULL, false, EM_SCALE_DEFAULT});
    ck_assert_msg(y != NULL, "%s", em_last_error());
    ck_assert_double_eq(max_abs_of(y), 0);
    y = fused(&(ref_in){hrnd(dt, 14, 3, TU_SIZES(0, 4, 8), 1), hrnd(dt, 15, 3, TU_SIZES(0, 4, 8), 1),
                        hrnd(dt, 16, 3, TU_SIZES(0, 4, 8), 1), NULL, true, EM_SCALE_DEFAULT});
    ck_assert_msg(y != NULL && em_numel(y) == 0, "%s", em_last_error());
    tu_check_fails(fused(&(ref_in){hrnd(dt, 23, 2, TU_SIZES(70, 8), 1), hrnd(dt, 24, 2, TU_SIZES(90, 8), 1),
                                   hrnd(dt, 25, 2, TU_SIZES(90, 200), 1), NULL, true, EM_SCALE_DEFAULT}),
                   EM_ERR_UNSUPPORTED);
}

START_TEST(fused_on_cuda_half_layouts_and_edges) {
    on_gpu_in_half("fused_on_cuda_half_layouts_and_edges", half_layouts_and_edges);
}
END_TEST

/* Compiled on CUDA: a bf16 GPT-2 block, an f16 MiniLM layer (its
 * padding bias in f16) and an f32 GPT-2 block under autocast to bf16 run
 * with one fused node per layer and match eager mode on the GPU
 * (tolerance as compiled_half_on_cpu_stays_unfused's, and the fused
 * scores stay f32 where eager rounds them to half). */
START_TEST(compiled_half_on_cuda_fuses_each_layer) {
    if (!gpu_or_skip("compiled_half_on_cuda_fuses_each_layer")) return;
    for (int c = 0; c < 3; c++) {
        bool gpt = c != 1;
        em_dtype dt = c == 1 ? EM_F16 : EM_BF16;
        model m;
        model_init(&m, gpt ? 128 : 256, 2, gpt);
        model_to_gpu(&m);
        if (c == 2) m.autocast = dt; /* the weights and input stay f32 */
        else model_cast(&m, dt);
        int64_t Bn = 2, T = gpt ? 67 : 21;
        double *pad = calloc((size_t)(Bn * T), sizeof(double));
        for (int64_t j = T - 6; j < T; j++) pad[T + j] = -1e4;
        em_dtype in_dt = c == 2 ? EM_F32 : dt;
        em_tensor *in[2] = {hrnd(in_dt, 140, 3, TU_SIZES(Bn, T, m.C), 1),
                            gpu(tu_tensor(pad, 4, TU_SIZES(Bn, 1, 1, T), in_dt))};
        free(pad);
        check_compiled_on(&m, gpt ? 1 : 2, in, "cuda", 6e-2, CL);
    }
}
END_TEST

/* Compiled on CUDA, the same GPT-2 and MiniLM-style layers run with one
 * fused node per layer and match eager mode on the GPU. */
START_TEST(compiled_on_cuda_fuses_each_layer) {
    if (!gpu_or_skip("compiled_on_cuda_fuses_each_layer")) return;
    for (int gpt = 1; gpt >= 0; gpt--) {
        model m;
        model_init(&m, gpt ? 128 : 256, 2, gpt);
        model_to_gpu(&m);
        int64_t Bn = 2, T = gpt ? 67 : 21;
        double *pad = calloc((size_t)(Bn * T), sizeof(double));
        for (int64_t j = T - 6; j < T; j++) pad[T + j] = -1e9;
        em_tensor *in[2] = {grnd(140, 3, TU_SIZES(Bn, T, m.C)),
                            gpu(tu_tensor(pad, 4, TU_SIZES(Bn, 1, 1, T), EM_F32))};
        free(pad);
        check_compiled_on(&m, gpt ? 1 : 2, in, "cuda", 1e-4, CL);
    }
}
END_TEST

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--loops-child")) return loops_child();
    const tu_test tests[] = {
        {"sdpa_plain_and_scaled", sdpa_plain_and_scaled},
        {"sdpa_masks", sdpa_masks},
        {"sdpa_causal_shapes", sdpa_causal_shapes},
        {"sdpa_edge_sizes", sdpa_edge_sizes},
        {"sdpa_non_contiguous_and_broadcast", sdpa_non_contiguous_and_broadcast},
        {"sdpa_errors", sdpa_errors},
        {"fused_shapes_and_head_dims", fused_shapes_and_head_dims},
        {"fused_masks", fused_masks},
        {"fused_non_contiguous_and_edges", fused_non_contiguous_and_edges},
        {"fused_op_errors", fused_op_errors},
        {"fused_without_blas_uses_its_loops", fused_without_blas_uses_its_loops},
        {"pass_rewrites_gpt_bert_and_the_op", pass_rewrites_gpt_bert_and_the_op},
        {"pass_half_graphs", pass_half_graphs},
        {"pass_leaves_near_misses", pass_leaves_near_misses},
        {"pass_text_round_trip", pass_text_round_trip},
        {"pass_golden_text", pass_golden_text},
        {"compiled_gpt_block_fuses_each_layer", compiled_gpt_block_fuses_each_layer},
        {"compiled_minilm_layers_fuse_each_layer", compiled_minilm_layers_fuse_each_layer},
        {"compiled_dynamic_sizes_stay_fused", compiled_dynamic_sizes_stay_fused},
        {"compiled_half_on_cpu_stays_unfused", compiled_half_on_cpu_stays_unfused},
        {"fused_on_cuda_shapes_and_head_dims", fused_on_cuda_shapes_and_head_dims},
        {"fused_on_cuda_masks", fused_on_cuda_masks},
        {"fused_on_cuda_layouts_and_edges", fused_on_cuda_layouts_and_edges},
        {"fused_on_cuda_decode_queries", fused_on_cuda_decode_queries},
        {"compiled_on_cuda_fuses_each_layer", compiled_on_cuda_fuses_each_layer},
        {"fused_on_cuda_half_shapes", fused_on_cuda_half_shapes},
        {"fused_on_cuda_half_masks", fused_on_cuda_half_masks},
        {"fused_on_cuda_half_layouts_and_edges", fused_on_cuda_half_layouts_and_edges},
        {"compiled_half_on_cuda_fuses_each_layer", compiled_half_on_cuda_fuses_each_layer},
    };
    return tu_run(tu_suite("attention", tests, sizeof tests / sizeof tests[0], 120));
}
