/* test_matmul.c - em_matmul against a float64 reference computed here
 * (torch.matmul semantics: 1-d operands, broadcast batch dims). */
#include "testutil.h"

#include "cpu.h" /* em_blas_core_warning */
#include "eager.h" /* em_dispatch: the linear op has no public wrapper */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const em_dtype NUM4[] = {EM_F32, EM_F64, EM_I32, EM_I64};
#define NNUM4 4

/* The reference product of a and b (any ranks >= 1); sets the result's
 * shape.  Returns a malloc'd row-major array. */
static double *matmul_ref(const em_tensor *a, const em_tensor *b, int *ondim, int64_t *osz) {
    int an = em_ndim(a), bn = em_ndim(b);
    int64_t as[EM_MAX_DIMS + 1], bs[EM_MAX_DIMS + 1];
    int and_, bnd;
    /* promote 1-d operands */
    if (an == 1) {
        as[0] = 1;
        as[1] = em_size(a, 0);
        and_ = 2;
    } else {
        memcpy(as, em_sizes(a), sizeof(int64_t) * (size_t)an);
        and_ = an;
    }
    if (bn == 1) {
        bs[0] = em_size(b, 0);
        bs[1] = 1;
        bnd = 2;
    } else {
        memcpy(bs, em_sizes(b), sizeof(int64_t) * (size_t)bn);
        bnd = bn;
    }
    int64_t M = as[and_ - 2], K = as[and_ - 1], N = bs[bnd - 1];
    ck_assert_int_eq(K, bs[bnd - 2]);
    int nb = (and_ > bnd ? and_ : bnd) - 2;
    int64_t bsz[EM_MAX_DIMS], nbatch = 1;
    for (int d = 0; d < nb; d++) {
        int ad = d - (nb - (and_ - 2)), bd = d - (nb - (bnd - 2));
        int64_t sa = ad >= 0 ? as[ad] : 1, sb = bd >= 0 ? bs[bd] : 1;
        ck_assert(sa == sb || sa == 1 || sb == 1);
        bsz[d] = sa == 1 ? sb : sa;
        nbatch *= bsz[d];
    }
    double *av = tu_values(a), *bv = tu_values(b);
    double *r = calloc((size_t)(nbatch * M * N > 0 ? nbatch * M * N : 1), sizeof(double));
    int64_t bidx[EM_MAX_DIMS] = {0};
    for (int64_t bi = 0; bi < nbatch; bi++) {
        /* flat batch offsets of a and b */
        int64_t ao = 0, bo = 0;
        for (int d = 0; d < and_ - 2; d++) {
            int od = d + (nb - (and_ - 2));
            ao = ao * as[d] + (as[d] == 1 ? 0 : bidx[od]);
        }
        for (int d = 0; d < bnd - 2; d++) {
            int od = d + (nb - (bnd - 2));
            bo = bo * bs[d] + (bs[d] == 1 ? 0 : bidx[od]);
        }
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++)
                    s += av[(ao * M + i) * K + k] * bv[(bo * K + k) * N + j];
                r[(bi * M + i) * N + j] = s;
            }
        tu_next(nb, bsz, bidx);
    }
    /* the result's shape: batch, then M unless a was 1-d, N unless b was */
    int nd = 0;
    for (int d = 0; d < nb; d++) osz[nd++] = bsz[d];
    if (an != 1) osz[nd++] = M;
    if (bn != 1) osz[nd++] = N;
    *ondim = nd;
    free(av);
    free(bv);
    return r;
}

static void check_matmul_at(int line, const em_tensor *a, const em_tensor *b) {
    ck_assert_msg(a && b, "line %d: NULL input: %s", line, em_last_error());
    int nd;
    int64_t osz[EM_MAX_DIMS];
    double *ref = matmul_ref(a, b, &nd, osz);
    em_tensor *r = em_matmul(a, b);
    ck_assert_msg(r != NULL, "line %d: em_matmul failed: %s", line, em_last_error());
    em_dtype want = em_promote_types(em_dtype_of(a), em_dtype_of(b));
    ck_assert_msg(em_dtype_of(r) == want, "line %d: dtype %s, expected %s", line,
                  em_dtype_name(em_dtype_of(r)), em_dtype_name(want));
    int64_t K = em_size(a, -1);
    double rtol = 0, atol = 0;
    if (want == EM_F32) {
        rtol = 1e-5;
        atol = 1e-5 * (double)(K + 1);
    } else if (want == EM_F64) {
        rtol = 1e-12;
        atol = 1e-12 * (double)(K + 1);
    }
    tu_check_close_at(__FILE__, line, r, ref, nd, osz, rtol, atol);
    free(ref);
}
#define check_matmul(a, b) check_matmul_at(__LINE__, a, b)

#define RND(seed, dt, ...) \
    tu_random(seed, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), TU_SIZES(__VA_ARGS__), dt, 3.0)

START_TEST(test_2d_every_dtype) {
    for (int t = 0; t < NNUM4; t++) {
        em_dtype dt = NUM4[t];
        check_matmul(RND(1, dt, 3, 4), RND(2, dt, 4, 5));
        check_matmul(RND(3, dt, 1, 1), RND(4, dt, 1, 1));
        check_matmul(RND(5, dt, 1, 7), RND(6, dt, 7, 1));
        check_matmul(RND(7, dt, 5, 1), RND(8, dt, 1, 6)); /* K = 1: outer product */
        check_matmul(RND(9, dt, 64, 33), RND(10, dt, 33, 17));
        check_matmul(RND(11, dt, 2, 100), RND(12, dt, 100, 3));
        em_tensor *r = em_matmul(RND(13, dt, 3, 4), RND(14, dt, 4, 5));
        ck_assert_int_eq(em_ndim(r), 2);
        ck_assert_int_eq(em_size(r, 0), 3);
        ck_assert_int_eq(em_size(r, 1), 5);
    }
    /* exact small case */
    em_tensor *a = tu_tensor((double[]){1, 2, 3, 4, 5, 6}, 2, TU_SIZES(2, 3), EM_F64);
    em_tensor *b = tu_tensor((double[]){7, 8, 9, 10, 11, 12}, 2, TU_SIZES(3, 2), EM_F64);
    tu_check_close(em_matmul(a, b), ((double[]){58, 64, 139, 154}), 2, TU_SIZES(2, 2), 0, 0);
}
END_TEST

START_TEST(test_1d_operands) {
    for (int t = 0; t < NNUM4; t++) {
        em_dtype dt = NUM4[t];
        check_matmul(RND(20, dt, 4), RND(21, dt, 4, 5));     /* [5] */
        check_matmul(RND(22, dt, 3, 4), RND(23, dt, 4));     /* [3] */
        check_matmul(RND(24, dt, 6), RND(25, dt, 6));        /* 0-d */
        check_matmul(RND(26, dt, 4), RND(27, dt, 2, 4, 5));  /* [2, 5] */
        check_matmul(RND(28, dt, 2, 3, 4), RND(29, dt, 4));  /* [2, 3] */
        check_matmul(RND(30, dt, 1), RND(31, dt, 1));
        em_tensor *dot = em_matmul(RND(32, dt, 6), RND(33, dt, 6));
        ck_assert_int_eq(em_ndim(dot), 0);
        em_tensor *v = em_matmul(RND(34, dt, 4), RND(35, dt, 4, 5));
        ck_assert_int_eq(em_ndim(v), 1);
        ck_assert_int_eq(em_size(v, 0), 5);
    }
    double r;
    em_tensor *x = tu_tensor((double[]){1, 2, 3}, 1, TU_SIZES(3), EM_I64);
    em_tensor *y = tu_tensor((double[]){4, -5, 6}, 1, TU_SIZES(3), EM_I64);
    ck_assert_int_eq(em_item(em_matmul(x, y), &r), EM_OK);
    ck_assert(r == 12.0);
}
END_TEST

START_TEST(test_batched_broadcast) {
    for (int t = 0; t < NNUM4; t++) {
        em_dtype dt = NUM4[t];
        check_matmul(RND(40, dt, 2, 3, 4), RND(41, dt, 2, 4, 5));
        check_matmul(RND(42, dt, 2, 3, 4), RND(43, dt, 4, 5));       /* b broadcast */
        check_matmul(RND(44, dt, 3, 4), RND(45, dt, 2, 4, 5));       /* a broadcast */
        check_matmul(RND(46, dt, 2, 1, 3, 4), RND(47, dt, 1, 5, 4, 6)); /* [2, 5, 3, 6] */
        check_matmul(RND(48, dt, 5, 3, 4), RND(49, dt, 1, 4, 2));    /* size-1 batch */
        check_matmul(RND(50, dt, 1, 3, 4), RND(51, dt, 1, 4, 2));
        check_matmul(RND(52, dt, 3, 1, 2, 3, 4), RND(53, dt, 2, 1, 4, 2));
        em_tensor *r = em_matmul(RND(54, dt, 2, 1, 3, 4), RND(55, dt, 1, 5, 4, 6));
        ck_assert_int_eq(em_ndim(r), 4);
        ck_assert_int_eq(em_size(r, 0), 2);
        ck_assert_int_eq(em_size(r, 1), 5);
        ck_assert_int_eq(em_size(r, 2), 3);
        ck_assert_int_eq(em_size(r, 3), 6);
    }
}
END_TEST

/* x[.., M, K] @ w[K, N] whose batches follow one another is one product
 * of all the rows (cpu_matmul.c fold_batches); batches that do not line up
 * (a batch slice with a step, permuted batch dims, an expanded batch, a
 * transposed matrix) or a w with batches of its own are products a batch
 * at a time.  Every case against the float64 product. */
START_TEST(test_folded_batches) {
    for (int t = 0; t < NNUM4; t++) {
        em_dtype dt = NUM4[t];
        check_matmul(RND(300, dt, 4, 7, 5), RND(301, dt, 5, 3));           /* folds */
        check_matmul(RND(302, dt, 2, 3, 4, 5), RND(303, dt, 5, 6));        /* two batch dims */
        check_matmul(RND(304, dt, 6, 1, 4), RND(305, dt, 4, 3));           /* M = 1 */
        check_matmul(RND(306, dt, 8, 37, 64), RND(307, dt, 64, 33));       /* odd, split rows */
        check_matmul(RND(308, dt, 3, 5, 4), RND(309, dt, 1, 4, 2));        /* w's batch of 1 */
        /* rows 10 apart, batches 30 apart: still one run of rows */
        check_matmul(em_slice(RND(310, dt, 2, 3, 10), 2, 0, 4, 1), RND(311, dt, 4, 5));
        /* do not fold */
        check_matmul(em_slice(RND(312, dt, 6, 3, 4), 0, 0, 6, 2), RND(313, dt, 4, 5));
        check_matmul(em_permute(RND(314, dt, 3, 2, 4, 5), 4, (int[]){1, 0, 2, 3}), RND(315, dt, 5, 2));
        check_matmul(em_expand(RND(316, dt, 1, 3, 4), 3, TU_SIZES(5, 3, 4)), RND(317, dt, 4, 2));
        check_matmul(em_transpose(RND(318, dt, 3, 4, 3), 1, 2), RND(319, dt, 4, 6));
        check_matmul(RND(320, dt, 3, 5, 4), RND(321, dt, 3, 4, 2));
        check_matmul(RND(322, dt, 0, 5, 4), RND(323, dt, 4, 2));           /* no batches */
        check_matmul(RND(324, dt, 3, 0, 4), RND(325, dt, 4, 2));           /* no rows */
    }
}
END_TEST

START_TEST(test_noncontiguous) {
    for (int t = 0; t < NNUM4; t++) {
        em_dtype dt = NUM4[t];
        /* transposed operands: BLAS reads them with CblasTrans */
        em_tensor *at = em_transpose(RND(60, dt, 4, 3), 0, 1);  /* [3, 4] */
        em_tensor *bt = em_transpose(RND(61, dt, 5, 4), 0, 1);  /* [4, 5] */
        check_matmul(at, RND(62, dt, 4, 5));
        check_matmul(RND(63, dt, 3, 4), bt);
        check_matmul(at, bt);
        /* batched transposes and permuted batch dims */
        em_tensor *a3 = em_transpose(RND(64, dt, 2, 4, 3), 1, 2); /* [2, 3, 4] */
        em_tensor *b3 = em_permute(RND(65, dt, 4, 2, 5), 3, (int[]){1, 0, 2}); /* [2, 4, 5] */
        check_matmul(a3, b3);
        check_matmul(em_transpose(a3, 0, 1), RND(66, dt, 4, 2)); /* [3, 2, 4] @ [4, 2] */
        /* column slices: a leading dim larger than the row */
        em_tensor *as = em_slice(RND(67, dt, 3, 10), 1, 2, 6, 1); /* [3, 4], rs 10 */
        check_matmul(as, bt);
        /* slices with step: a has no unit stride (copied first); b rows 10 apart */
        em_tensor *ass = em_slice(RND(68, dt, 3, 8), 1, 0, 8, 2); /* [3, 4] stride 2 */
        em_tensor *bss = em_slice(RND(69, dt, 8, 5), 0, 1, 8, 2); /* [4, 5] row stride 10 */
        check_matmul(ass, bss);
        check_matmul(ass, RND(70, dt, 4));
        check_matmul(em_slice(RND(71, dt, 2, 3, 12), 2, 0, 12, 3), b3); /* batched, copied */
        /* expanded: broadcast batch (stride 0) and stride-0 matrix dims */
        em_tensor *ae = em_expand(RND(72, dt, 1, 3, 4), 3, TU_SIZES(6, 3, 4));
        check_matmul(ae, RND(73, dt, 6, 4, 2));
        em_tensor *row = em_expand(RND(74, dt, 1, 4), 2, TU_SIZES(3, 4)); /* rs 0 */
        check_matmul(row, RND(75, dt, 4, 5));
        em_tensor *col = em_expand(RND(76, dt, 4, 1), 2, TU_SIZES(4, 5)); /* cs 0 */
        check_matmul(RND(77, dt, 3, 4), col);
        em_tensor *be = em_expand(em_slice(RND(78, dt, 1, 4, 10), 2, 0, 10, 2), 3,
                                  TU_SIZES(3, 4, 5)); /* batch broadcast + step */
        check_matmul(RND(79, dt, 3, 2, 4), be);
        /* a 1-d operand with a step */
        check_matmul(em_slice(RND(80, dt, 8), 0, 0, 8, 2), RND(81, dt, 4, 3));
    }
}
END_TEST

START_TEST(test_empty) {
    for (int t = 0; t < NNUM4; t++) {
        em_dtype dt = NUM4[t];
        /* K == 0: zeros */
        em_tensor *a = em_zeros(2, TU_SIZES(3, 0), dt, em_cpu());
        em_tensor *b = em_zeros(2, TU_SIZES(0, 4), dt, em_cpu());
        check_matmul(a, b);
        em_tensor *z = em_matmul(a, b);
        ck_assert_int_eq(em_numel(z), 12);
        double zv[12];
        ck_assert_int_eq(em_copy_to_host(em_cast(z, EM_F64), zv, sizeof zv), EM_OK);
        for (int i = 0; i < 12; i++) ck_assert(zv[i] == 0.0);
        check_matmul(em_zeros(3, TU_SIZES(2, 3, 0), dt, em_cpu()),
                     em_zeros(2, TU_SIZES(0, 5), dt, em_cpu()));
        check_matmul(em_zeros(1, TU_SIZES(0), dt, em_cpu()),
                     em_zeros(1, TU_SIZES(0), dt, em_cpu())); /* empty dot: 0 */
        /* M == 0, N == 0, batch == 0 */
        check_matmul(em_zeros(2, TU_SIZES(0, 4), dt, em_cpu()), RND(90, dt, 4, 5));
        check_matmul(RND(91, dt, 3, 4), em_zeros(2, TU_SIZES(4, 0), dt, em_cpu()));
        check_matmul(em_zeros(3, TU_SIZES(0, 3, 4), dt, em_cpu()), RND(92, dt, 4, 5));
        check_matmul(RND(93, dt, 2, 3, 4), em_zeros(3, TU_SIZES(1, 4, 0), dt, em_cpu()));
    }
}
END_TEST

START_TEST(test_mixed_dtypes) {
    check_matmul(RND(100, EM_I32, 3, 4), RND(101, EM_F32, 4, 5));  /* f32 */
    check_matmul(RND(102, EM_F32, 3, 4), RND(103, EM_I32, 4, 5));  /* f32 */
    check_matmul(RND(104, EM_I64, 3, 4), RND(105, EM_F64, 4, 2));  /* f64 */
    check_matmul(RND(106, EM_I32, 3, 4), RND(107, EM_I64, 4, 2));  /* i64 */
    check_matmul(RND(108, EM_F32, 2, 4), RND(109, EM_F64, 4, 2));  /* f64 */
    check_matmul(RND(110, EM_BOOL, 2, 4), RND(111, EM_F32, 4, 2)); /* f32 */
    check_matmul(RND(112, EM_I32, 4), RND(113, EM_F32, 2, 4, 3));
    em_tensor *r = em_matmul(RND(114, EM_I32, 2, 2), RND(115, EM_F32, 2, 2));
    ck_assert_int_eq(em_dtype_of(r), EM_F32);
}
END_TEST

START_TEST(test_large) {
    for (int t = 0; t < NNUM4; t++) {
        em_dtype dt = NUM4[t];
        /* many small products: run in parallel across the batch */
        check_matmul(RND(120, dt, 64, 8, 8), RND(121, dt, 64, 8, 8));
        check_matmul(em_transpose(RND(122, dt, 48, 9, 7), 1, 2), RND(123, dt, 9, 5));
        /* one big product */
        check_matmul(RND(124, dt, 120, 150), RND(125, dt, 150, 90));
        check_matmul(em_transpose(RND(126, dt, 150, 120), 0, 1),
                     em_transpose(RND(127, dt, 90, 150), 0, 1));
    }
    /* exact integer values that need more than 32 bits in the sum */
    em_tensor *a = em_full(2, TU_SIZES(2, 3), 2000000000.0, EM_I64, em_cpu());
    em_tensor *b = em_full(2, TU_SIZES(3, 2), 3.0, EM_I64, em_cpu());
    int64_t out[4];
    ck_assert_int_eq(em_copy_to_host(em_matmul(a, b), out, sizeof out), EM_OK);
    for (int i = 0; i < 4; i++) ck_assert_int_eq(out[i], 18000000000LL);
}
END_TEST

/* ---- linear: a @ w + bias (the op the linear pass makes) ---- */

/* linear(a, w, bias) against the float64 product plus the bias. */
static void check_linear_at(int line, em_tensor *a, em_tensor *w, em_tensor *bias) {
    int nd;
    int64_t osz[EM_MAX_DIMS];
    double *ref = matmul_ref(a, w, &nd, osz), *bv = tu_values(bias);
    int64_t n = 1, N = osz[nd - 1];
    for (int d = 0; d < nd; d++) n *= osz[d];
    for (int64_t i = 0; i < n; i++) ref[i] += bv[i % N];
    em_tensor *in[3] = {a, w, bias};
    em_tensor *r = em_dispatch(EM_OP_LINEAR, 3, in, NULL);
    ck_assert_msg(r != NULL, "line %d: linear failed: %s", line, em_last_error());
    em_dtype dt = em_dtype_of(a);
    double tol = dt == EM_F64 ? 1e-12 : dt == EM_F32 ? 1e-5 : dt == EM_BF16 ? 2e-2 : 0;
    tu_check_close_at(__FILE__, line, r, ref, nd, osz, tol, tol * (double)(em_size(a, -1) + 1));
    /* the same bits as the matmul and the add it stands for */
    double *rv = tu_values(r), *uv = tu_values(em_add(em_matmul(a, w), bias));
    for (int64_t i = 0; i < n; i++) ck_assert_msg(rv[i] == uv[i] || (rv[i] != rv[i] && uv[i] != uv[i]), "line %d", line);
    free(rv), free(uv), free(ref), free(bv);
}
#define check_linear(a, w, bias) check_linear_at(__LINE__, a, w, bias)

START_TEST(test_linear) {
    for (int t = 0; t < NNUM4; t++) {
        em_dtype dt = NUM4[t];
        check_linear(RND(1, dt, 5, 7), RND(2, dt, 7, 9), RND(3, dt, 9));
        check_linear(RND(4, dt, 2, 1, 3), RND(5, dt, 3, 4), RND(6, dt, 1, 1, 4)); /* batched, [1, 1, N] */
    }
    check_linear(RND(7, EM_BF16, 3, 16), RND(8, EM_BF16, 16, 8), RND(9, EM_BF16, 8));
    /* non-contiguous operands and a strided bias (a column of a matrix) */
    em_tensor *at = em_transpose(RND(10, EM_F32, 6, 4), 0, 1);
    em_tensor *bias = em_transpose(em_slice(RND(11, EM_F32, 5, 3), 1, 2, 3, 1), 0, 1); /* [1, 5], stride 3 */
    check_linear(at, RND(12, EM_F32, 6, 5), bias);
    /* size 0 and 1: no rows, an empty inner dim (the bias alone), one column */
    check_linear(RND(13, EM_F32, 0, 3), RND(14, EM_F32, 3, 4), RND(15, EM_F32, 4));
    check_linear(RND(16, EM_F32, 2, 0), RND(17, EM_F32, 0, 4), RND(18, EM_F32, 4));
    check_linear(RND(19, EM_F32, 1, 3), RND(20, EM_F32, 3, 1), RND(21, EM_F32, 1));
}
END_TEST

/* ---- linear with an activation: act(a @ w + bias) ---- */

static double act_ref(em_act act, double x) {
    if (act == EM_ACT_RELU) return x > 0 ? x : 0;
    if (act == EM_ACT_GELU_TANH) return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    if (act == EM_ACT_GELU) return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    return x;
}

/* linear(a, w, bias) [act] against float64 act(product + bias), and bit
 * for bit against the matmul, add and act it stands for.  Tolerances:
 * f64 1e-12, f32 1e-5, bf16 2e-2 (the product, the sum and the act each
 * rounded to 8 bits), relative, with an absolute term growing with K
 * (cancellation in the sum of K products of values up to 3). */
static void check_linear_act_at(int line, em_tensor *a, em_tensor *w, em_tensor *bias, em_act act) {
    int nd;
    int64_t osz[EM_MAX_DIMS];
    double *ref = matmul_ref(a, w, &nd, osz), *bv = tu_values(bias);
    int64_t n = 1, N = osz[nd - 1];
    for (int d = 0; d < nd; d++) n *= osz[d];
    for (int64_t i = 0; i < n; i++) ref[i] = act_ref(act, ref[i] + bv[i % N]);
    em_tensor *in[3] = {a, w, bias};
    em_op_attrs at = {.act = act};
    em_tensor *r = em_dispatch(EM_OP_LINEAR, 3, in, &at);
    ck_assert_msg(r != NULL, "line %d: linear [act=%d] failed: %s", line, (int)act, em_last_error());
    em_dtype dt = em_dtype_of(a);
    double tol = dt == EM_F64 ? 1e-12 : dt == EM_F32 ? 1e-5 : 2e-2;
    tu_check_close_at(__FILE__, line, r, ref, nd, osz, tol, tol * (double)(em_size(a, -1) + 1));
    em_tensor *u = em_add(em_matmul(a, w), bias);
    u = act == EM_ACT_RELU        ? em_relu(u)
        : act == EM_ACT_GELU_TANH ? em_gelu_tanh(u)
        : act == EM_ACT_GELU      ? em_gelu(u)
                                  : u;
    double *rv = tu_values(r), *uv = tu_values(u);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(rv[i] == uv[i] || (rv[i] != rv[i] && uv[i] != uv[i]), "line %d: %lld", line, (long long)i);
    free(rv), free(uv), free(ref), free(bv);
}
#define check_linear_act(a, w, bias, act) check_linear_act_at(__LINE__, a, w, bias, act)

START_TEST(test_linear_act) {
    static const em_dtype dts[] = {EM_F32, EM_F64, EM_BF16, EM_F16};
    for (int t = 0; t < 4; t++) {
        em_dtype dt = dts[t];
        for (em_act act = EM_ACT_RELU; act < EM_ACT_COUNT; act++) {
            check_linear_act(RND(40, dt, 5, 7), RND(41, dt, 7, 9), RND(42, dt, 9), act); /* odd sizes */
            check_linear_act(RND(43, dt, 1, 13), RND(44, dt, 13, 3), RND(45, dt, 3), act); /* M = 1 */
            /* batched with a broadcast [1, 1, N] bias, and a w broadcast over a batch */
            check_linear_act(RND(46, dt, 2, 3, 5), RND(47, dt, 5, 4), RND(48, dt, 1, 1, 4), act);
            check_linear_act(RND(49, dt, 3, 1, 2, 5), RND(50, dt, 2, 5, 6), RND(51, dt, 6), act);
            /* rows over the threads, and K = 0 (the act of the bias alone) */
            check_linear_act(RND(61, dt, 131, 67), RND(62, dt, 67, 45), RND(63, dt, 45), act);
            check_linear_act(RND(55, dt, 2, 0), RND(56, dt, 0, 4), RND(57, dt, 4), act);
        }
    }
    for (em_act act = EM_ACT_NONE; act < EM_ACT_COUNT; act++) {
        /* size 0 (no rows; an empty inner dim: act of the bias alone) */
        check_linear_act(RND(52, EM_F32, 0, 3), RND(53, EM_F32, 3, 4), RND(54, EM_F32, 4), act);
        check_linear_act(RND(55, EM_F32, 2, 0), RND(56, EM_F32, 0, 4), RND(57, EM_F32, 4), act);
        /* a transposed weight view and a strided bias */
        em_tensor *wt = em_transpose(RND(58, EM_F32, 5, 6), 0, 1);
        em_tensor *bias = em_transpose(em_slice(RND(59, EM_F32, 5, 3), 1, 2, 3, 1), 0, 1);
        check_linear_act(RND(60, EM_F32, 3, 6), wt, bias, act);
        /* f32 applies the bias and act to each piece of the product as the
         * BLAS writes it: pieces of rows (M >= N), of columns (M < N), and
         * a batch of products that does not fold into one (w per batch) */
        check_linear_act(RND(64, EM_F32, 131, 67), RND(65, EM_F32, 67, 45), RND(66, EM_F32, 45), act);
        check_linear_act(RND(67, EM_F32, 17, 70), RND(68, EM_F32, 70, 301), RND(69, EM_F32, 301), act);
        check_linear_act(RND(70, EM_F32, 3, 33, 20), RND(71, EM_F32, 3, 20, 29), RND(72, EM_F32, 29), act);
    }
}
END_TEST

START_TEST(test_linear_act_errors) {
    em_tensor *in[3] = {RND(61, EM_F32, 2, 3), RND(62, EM_F32, 3, 4), RND(63, EM_F32, 4)};
    em_op_attrs bad = {.act = EM_ACT_COUNT};
    ck_assert_ptr_null(em_dispatch(EM_OP_LINEAR, 3, in, &bad));
    ck_assert_int_eq(em_last_status(), EM_ERR_ARG);
    ck_assert(strstr(em_last_error(), "activation") != NULL);
    em_clear_error();
    bad.act = (em_act)-1;
    ck_assert_ptr_null(em_dispatch(EM_OP_LINEAR, 3, in, &bad));
    ck_assert_int_eq(em_last_status(), EM_ERR_ARG);
    em_clear_error();
}
END_TEST

START_TEST(test_linear_errors) {
    em_tensor *a = RND(30, EM_F32, 2, 3), *w = RND(31, EM_F32, 3, 4);
    em_tensor *bad[][3] = {{a, w, RND(32, EM_F32, 2, 4)},  /* a full-size addend */
                           {a, w, RND(33, EM_F32, 2, 1)},  /* along the columns */
                           {a, w, RND(34, EM_F32, 5)},     /* the wrong width */
                           {a, w, RND(35, EM_F32, 1, 1, 4)}}; /* more dims than the product */
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ck_assert_ptr_null(em_dispatch(EM_OP_LINEAR, 3, bad[i], NULL));
        ck_assert_int_eq(em_last_status(), EM_ERR_SHAPE);
        ck_assert_msg(strstr(em_last_error(), "does not add along the rows"), "%s", em_last_error());
    }
    em_tensor *f64[3] = {a, w, RND(36, EM_F64, 4)};
    ck_assert_ptr_null(em_dispatch(EM_OP_LINEAR, 3, f64, NULL));
    ck_assert_int_eq(em_last_status(), EM_ERR_DTYPE);
    em_tensor *inner[3] = {a, RND(37, EM_F32, 2, 4), RND(38, EM_F32, 4)};
    ck_assert_ptr_null(em_dispatch(EM_OP_LINEAR, 3, inner, NULL));
    ck_assert_int_eq(em_last_status(), EM_ERR_SHAPE);
    em_tensor *null[3] = {a, w, NULL};
    ck_assert_ptr_null(em_dispatch(EM_OP_LINEAR, 3, null, NULL));
}
END_TEST

START_TEST(test_errors) {
    em_tensor *a = RND(130, EM_F32, 2, 3);
    tu_check_fails(em_matmul(a, RND(131, EM_F32, 4, 5)), EM_ERR_SHAPE);      /* inner */
    tu_check_fails(em_matmul(RND(132, EM_F32, 3), RND(133, EM_F32, 4)), EM_ERR_SHAPE);
    tu_check_fails(em_matmul(RND(134, EM_F32, 3), RND(135, EM_F32, 2, 3)), EM_ERR_SHAPE);
    tu_check_fails(em_matmul(a, RND(136, EM_F32, 2)), EM_ERR_SHAPE);
    tu_check_fails(em_matmul(RND(137, EM_F32, 2, 3, 4), RND(138, EM_F32, 3, 4, 5)),
                   EM_ERR_SHAPE); /* batch 2 vs 3 */
    tu_check_fails(em_matmul(RND(139, EM_F32, 2, 2, 3, 4), RND(140, EM_F32, 3, 4, 5)),
                   EM_ERR_SHAPE);
    em_tensor *s = em_scalar(2, EM_F32, em_cpu());
    tu_check_fails(em_matmul(s, a), EM_ERR_SHAPE);
    tu_check_fails(em_matmul(a, s), EM_ERR_SHAPE);
    tu_check_fails(em_matmul(s, s), EM_ERR_SHAPE);
    tu_check_fails(em_matmul(NULL, a), EM_ERR_NULL);
    tu_check_fails(em_matmul(a, NULL), EM_ERR_NULL);
    /* half types compute (tests/test_half.c checks the values) */
    ck_assert_ptr_nonnull(em_matmul(em_cast(a, EM_F16), em_cast(RND(141, EM_F32, 3, 2), EM_F16)));
    tu_check_fails(em_matmul(em_cast(a, EM_F16), em_cast(a, EM_F16)), EM_ERR_SHAPE);
}
END_TEST

/* The generic-core check: a core below AVX2 on an AVX2 or AVX-512 CPU is
 * reported with the OPENBLAS_CORETYPE that fixes it; a core that fits the
 * CPU, or a CPU without AVX2, is not. */
START_TEST(test_blas_core_warning) {
    static const struct {
        const char *core;
        em_isa cpu;
        const char *want; /* NULL: no warning */
    } cases[] = {
        {"Prescott", EM_ISA_AVX512, "OPENBLAS_CORETYPE=SkylakeX"},
        {"Core2", EM_ISA_AVX2, "OPENBLAS_CORETYPE=Haswell"},
        {"Sandybridge", EM_ISA_AVX2, "its 'Sandybridge' kernels (AVX) on a CPU with AVX2"},
        {"Nehalem", EM_ISA_AVX512, "(SSE) on a CPU with AVX-512"},
        {"", EM_ISA_AVX512, "its 'unknown' kernels"},
        {NULL, EM_ISA_AVX2, "its 'unknown' kernels"},
        {"Haswell", EM_ISA_AVX512, NULL}, /* AVX2 kernels on Zen 4 or a Xeon: OpenBLAS's choice */
        {"Zen", EM_ISA_AVX512, NULL},
        {"zen", EM_ISA_AVX2, NULL},
        {"SkylakeX", EM_ISA_AVX512, NULL},
        {"SapphireRapids", EM_ISA_AVX512, NULL},
        {"Prescott", EM_ISA_AVX, NULL}, /* the CPU has nothing better for it */
        {"Prescott", EM_ISA_SSE, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char msg[512] = "";
        bool warned = em_blas_core_warning(cases[i].core, cases[i].cpu, msg, sizeof msg);
        ck_assert_msg(warned == (cases[i].want != NULL), "case %zu: %s", i, msg);
        if (cases[i].want) ck_assert_msg(strstr(msg, cases[i].want), "case %zu: %s", i, msg);
    }
    ck_assert_int_eq(em_blas_core_isa("SkylakeX"), EM_ISA_AVX512);
    ck_assert_int_eq(em_blas_core_isa("Piledriver"), EM_ISA_AVX);
    ck_assert_int_eq(em_blas_core_isa("Katmai"), EM_ISA_SSE);
    em_isa here = em_cpu_isa();
    ck_assert(here >= EM_ISA_SSE && here <= EM_ISA_AVX512);
}
END_TEST

/* Which BLAS runs the matmuls: OpenBLAS unless it would run a generic
 * core below the CPU that nobody chose, then BLIS when it loads;
 * EMBER_BLAS overrides; every case that changes something says why. */
START_TEST(test_blas_choice) {
    static const struct {
        const char *want, *core;
        bool coretype, blis;
        em_isa cpu;
        em_blas_lib lib;
        const char *msg; /* NULL: says nothing */
    } cases[] = {
        {NULL, "Zen", false, true, EM_ISA_AVX2, EM_BLAS_OPENBLAS, NULL},
        {"auto", "SkylakeX", false, true, EM_ISA_AVX512, EM_BLAS_OPENBLAS, NULL},
        {NULL, "Prescott", false, true, EM_ISA_AVX512, EM_BLAS_BLIS, "using BLIS instead"},
        {NULL, "Prescott", false, false, EM_ISA_AVX512, EM_BLAS_OPENBLAS, "install BLIS"},
        {NULL, "Prescott", true, true, EM_ISA_AVX512, EM_BLAS_OPENBLAS, NULL}, /* the user chose */
        {NULL, "Prescott", false, true, EM_ISA_AVX, EM_BLAS_OPENBLAS, NULL},   /* nothing better */
        {"openblas", "Prescott", false, true, EM_ISA_AVX512, EM_BLAS_OPENBLAS, NULL},
        {"blis", "Zen", false, true, EM_ISA_AVX2, EM_BLAS_BLIS, NULL},
        {"blis", "Zen", false, false, EM_ISA_AVX2, EM_BLAS_OPENBLAS, "does not load: using OpenBLAS"},
        {"blis", NULL, false, false, EM_ISA_AVX2, EM_BLAS_NONE, "does not load: using plain loops"},
        {NULL, NULL, false, true, EM_ISA_AVX2, EM_BLAS_BLIS, NULL},  /* no OpenBLAS */
        {NULL, NULL, false, false, EM_ISA_AVX2, EM_BLAS_NONE, NULL},
        {"mkl", "Zen", false, true, EM_ISA_AVX2, EM_BLAS_OPENBLAS, "EMBER_BLAS=mkl is not auto"},
        {"onednn", "Zen", false, true, EM_ISA_AVX2, EM_BLAS_OPENBLAS, NULL}, /* the cblas side */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char msg[512];
        em_blas_lib lib = em_blas_choose(cases[i].want, cases[i].core, cases[i].coretype, cases[i].cpu,
                                         cases[i].blis, msg, sizeof msg);
        ck_assert_msg(lib == cases[i].lib, "case %zu: %d", i, (int)lib);
        if (cases[i].msg) ck_assert_msg(strstr(msg, cases[i].msg), "case %zu: %s", i, msg);
        else ck_assert_msg(!msg[0], "case %zu: %s", i, msg);
    }
    /* oneDNN for f32: auto on AVX-512, or on AVX2 without a native cblas library */
    static const struct {
        const char *want;
        em_isa cpu;
        bool native, have, use;
        const char *msg;
    } dn[] = {
        {NULL, EM_ISA_AVX512, true, true, true, NULL},
        {"auto", EM_ISA_AVX512, false, true, true, NULL},
        {NULL, EM_ISA_AVX2, true, true, false, NULL},  /* a native OpenBLAS or BLIS stays */
        {NULL, EM_ISA_AVX2, false, true, true, NULL},  /* generic OpenBLAS, or none */
        {NULL, EM_ISA_AVX, false, true, false, NULL},  /* its JIT kernels start at AVX2 */
        {NULL, EM_ISA_AVX512, true, false, false, NULL}, /* not installed: nothing to say */
        {"onednn", EM_ISA_AVX, true, true, true, NULL},  /* asked for */
        {"onednn", EM_ISA_AVX2, true, true, true, NULL},
        {"onednn", EM_ISA_AVX2, false, false, false, "does not load"},
        {"openblas", EM_ISA_AVX512, true, true, false, NULL},
        {"blis", EM_ISA_AVX512, true, true, false, NULL},
    };
    for (size_t i = 0; i < sizeof dn / sizeof dn[0]; i++) {
        char msg[256] = "";
        bool use = em_blas_choose_onednn(dn[i].want, dn[i].cpu, dn[i].native, dn[i].have, msg,
                                         sizeof msg);
        ck_assert_msg(use == dn[i].use, "onednn case %zu", i);
        if (dn[i].msg) ck_assert_msg(strstr(msg, dn[i].msg), "onednn case %zu: %s", i, msg);
        else ck_assert_msg(!msg[0], "onednn case %zu: %s", i, msg);
    }
    /* this process's: whichever it is, it names its kernels */
    char kernels[64];
    em_blas_lib here = em_blas_in_use(kernels, sizeof kernels);
    ck_assert(here == EM_BLAS_NONE || kernels[0]);
}
END_TEST

static Suite *suite(void) {
    const tu_test tests[] = {
        {"2d_every_dtype", test_2d_every_dtype},
        {"1d_operands", test_1d_operands},
        {"batched_broadcast", test_batched_broadcast},
        {"folded_batches", test_folded_batches},
        {"noncontiguous", test_noncontiguous},
        {"empty", test_empty},
        {"mixed_dtypes", test_mixed_dtypes},
        {"large", test_large},
        {"errors", test_errors},
        {"linear", test_linear},
        {"linear_errors", test_linear_errors},
        {"linear_act", test_linear_act},
        {"linear_act_errors", test_linear_act_errors},
        {"blas_core_warning", test_blas_core_warning},
        {"blas_choice", test_blas_choice},
    };
    return tu_suite("matmul", tests, sizeof tests / sizeof tests[0], 120);
}

int main(void) {
#ifdef TEST_BLAS /* test_matmul_blis: every product above on that BLAS */
#if defined(__SANITIZE_ADDRESS__)
    /* LeakSanitizer's tracer dies (SIGSEGV) scanning Ember's pool threads
     * once they have run the dlopen'ed BLIS (its thread-local storage,
     * allocated late), whatever was leaked; valgrind checks these runs */
    if (!strcmp(TEST_BLAS, "blis")) {
        printf("SKIP: BLIS under AddressSanitizer: LeakSanitizer's tracer crashes on BLIS's "
               "thread-local storage in Ember's pool threads (make check-valgrind covers it)\n");
        return 77;
    }
#endif
    setenv("EMBER_BLAS", TEST_BLAS, 1);
    char kernels[128];
    bool blis = !strcmp(TEST_BLAS, "blis");
    if (em_blas_in_use(kernels, sizeof kernels) != (blis ? EM_BLAS_BLIS : EM_BLAS_OPENBLAS)) {
        printf("SKIP: %s does not load here\n",
               blis ? "BLIS (libblis.so.4, Debian's libblis4-serial)" : "OpenBLAS");
        return 77;
    }
    printf("matmuls on %s, kernels %s\n", TEST_BLAS, kernels);
#else
    char kernels[128];
    em_blas_in_use(kernels, sizeof kernels);
    printf("matmuls on %s\n", kernels);
#endif
    return tu_run(suite());
}
