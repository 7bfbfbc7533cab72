/* test_cuda.c - the CUDA device: every op on cuda:0 against the CPU eager
 * result on the same values, compiled graphs against eager, the kernel
 * cache across processes, and the error paths.  Needs a GPU: without one
 * (no driver, no device) it prints why and exits 77 (automake's SKIP).
 *
 * CUDA must not be initialized in a process that forks afterwards (the
 * child cannot use it), and Check forks a process per test: main probes
 * the device in a child of its own, and the cross-process cache test runs
 * this program again (--cache-child) for each "process". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "../bench/workloads.h"
#include "cache.h"
#include "config.h"
#ifdef EMBER_HAVE_CUDA
#include "cuda_eager.h"
#include "eager.h" /* em_dispatch: linear has no public wrapper */
#include "cuda_kernel.h"
#include "schedule.h"
#endif

#define GPU em_cuda(0)
static const em_device CPU = {EM_CPU, 0};

/* t's values copied to cuda:0 (same sizes, contiguous). */
static em_tensor *to_gpu(const em_tensor *t) {
    size_t n = (size_t)em_numel(t) * em_dtype_size(em_dtype_of(t));
    void *buf = malloc(n ? n : 1);
    ck_assert_int_eq(em_copy_to_host(t, buf, n), EM_OK);
    em_tensor *g = em_from_data(buf, em_dtype_of(t), em_ndim(t), em_sizes(t), GPU);
    free(buf);
    ck_assert_msg(g != NULL, "to_gpu: %s", em_last_error());
    return g;
}

/* Asserts that the GPU result g matches the CPU result c. */
#define same(g, c, rtol, atol) same_at(__FILE__, __LINE__, g, c, rtol, atol)
static void same_at(const char *file, int line, const em_tensor *g, const em_tensor *c,
                    double rtol, double atol) {
    ck_assert_msg(g != NULL, "%s:%d: GPU op failed: %s", file, line, em_last_error());
    ck_assert_msg(c != NULL, "%s:%d: CPU op failed: %s", file, line, em_last_error());
    ck_assert_msg(em_device_of(g).type == EM_CUDA, "%s:%d: result not on CUDA", file, line);
    ck_assert_int_eq(em_dtype_of(g), em_dtype_of(c));
    double *ref = tu_values(c);
    tu_check_close_at(file, line, g, ref, em_ndim(c), em_sizes(c), rtol, atol);
    free(ref);
}

static double tol_of(em_dtype d) { return d == EM_F64 ? 1e-12 : d == EM_F32 ? 2e-6 : 0; }

/* ---- errors ---- */

START_TEST(bad_device) {
    tu_check_fails(em_zeros(1, TU_SIZES(2), EM_F32, em_cuda(99)), EM_ERR_DEVICE);
    ck_assert(strstr(em_last_error(), "cuda:99") != NULL);
    tu_check_fails(em_zeros(1, TU_SIZES(2), EM_F32, em_cuda(-1)), EM_ERR_DEVICE);
    ck_assert(!em_device_available(em_cuda(99)));
    ck_assert(em_device_available(GPU));
    em_tensor *a = em_zeros(1, TU_SIZES(2), EM_F32, GPU), *b = em_zeros(1, TU_SIZES(2), EM_F32, CPU);
    tu_check_fails(em_add(a, b), EM_ERR_DEVICE); /* mixed devices */
}
END_TEST

/* ---- data movement ---- */

START_TEST(round_trip_and_views) {
    em_dtype dts[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_BOOL};
    for (int i = 0; i < 5; i++) {
        em_tensor *c = tu_random(i + 1, 3, TU_SIZES(3, 4, 5), dts[i], 3);
        em_tensor *g = to_gpu(c);
        same(g, c, 0, 0);
        same(em_permute(g, 3, (int[]){2, 0, 1}), em_permute(c, 3, (int[]){2, 0, 1}), 0, 0);
        same(em_contiguous(em_slice(g, 1, 1, 4, 2)), em_contiguous(em_slice(c, 1, 1, 4, 2)), 0, 0);
        same(em_expand(em_slice(g, 2, 0, 1, 1), 3, TU_SIZES(3, 4, 7)),
             em_expand(em_slice(c, 2, 0, 1, 1), 3, TU_SIZES(3, 4, 7)), 0, 0);
    }
    em_tensor *e = em_empty(1, TU_SIZES(0), EM_F32, GPU);
    ck_assert_int_eq(em_numel(e), 0);
    double v;
    ck_assert_int_eq(em_item(em_full(0, NULL, 2.5, EM_F64, GPU), &v), EM_OK);
    ck_assert(v == 2.5);
}
END_TEST

START_TEST(creation) {
    int64_t sz[2] = {5, 7};
    em_dtype dts[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_BOOL};
    for (int i = 0; i < 5; i++) {
        same(em_full(2, sz, 3.0, dts[i], GPU), em_full(2, sz, 3.0, dts[i], CPU), 0, 0);
        same(em_zeros(2, sz, dts[i], GPU), em_zeros(2, sz, dts[i], CPU), 0, 0);
        same(em_ones(2, sz, dts[i], GPU), em_ones(2, sz, dts[i], CPU), 0, 0);
    }
    same(em_arange(0, 10, 0.5, EM_F32, GPU), em_arange(0, 10, 0.5, EM_F32, CPU), 0, 0);
    em_generator *g1 = em_generator_new(7), *g2 = em_generator_new(7);
    /* CUDA's logf/cosf, not the CPU's libm: a few ulp (native_rand) */
    same(em_randn(g1, 2, sz, EM_F32, GPU), em_randn(g2, 2, sz, EM_F32, CPU), 4e-6, 1e-6);
    same(em_rand(g1, 2, sz, EM_F64, GPU), em_rand(g2, 2, sz, EM_F64, CPU), 0, 0);
    em_generator_free(g1);
    em_generator_free(g2);
}
END_TEST

/* ---- pointwise ---- */

typedef em_tensor *(*unary_fn)(const em_tensor *);
typedef em_tensor *(*binary_fn)(const em_tensor *, const em_tensor *);

START_TEST(unary_ops) {
    unary_fn fs[] = {em_neg, em_abs, em_exp, em_log, em_sqrt, em_rsqrt, em_sin, em_cos,
                     em_tanh, em_sigmoid, em_relu, em_gelu, em_gelu_tanh, em_erf};
    const char *names[] = {"neg", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos",
                           "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "erf"};
    em_dtype dts[] = {EM_F32, EM_F64};
    for (int d = 0; d < 2; d++) {
        em_tensor *c = tu_random(3, 2, TU_SIZES(33, 65), dts[d], 3);
        em_tensor *pos = em_add_scalar(em_abs(c), 0.1); /* log, sqrt, rsqrt */
        em_tensor *g = to_gpu(c), *gpos = to_gpu(pos);
        for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) {
            bool p = i >= 3 && i <= 5;
            em_tensor *r = fs[i](p ? gpos : g), *ref = fs[i](p ? pos : c);
            ck_assert_msg(r != NULL, "%s: %s", names[i], em_last_error());
            /* the CPU's f32 transcendentals are vmath approximations */
            same(r, ref, dts[d] == EM_F32 ? 1e-5 : 1e-12, dts[d] == EM_F32 ? 1e-6 : 1e-14);
        }
    }
    em_dtype ints[] = {EM_I32, EM_I64};
    for (int d = 0; d < 2; d++) {
        em_tensor *c = tu_random(4, 1, TU_SIZES(100), ints[d], 50);
        em_tensor *g = to_gpu(c);
        same(em_neg(g), em_neg(c), 0, 0);
        same(em_abs(g), em_abs(c), 0, 0);
        same(em_relu(g), em_relu(c), 0, 0);
        same(em_exp(em_mul_scalar(g, 0.01)), em_exp(em_mul_scalar(c, 0.01)), 1e-5, 1e-6);
    }
}
END_TEST

START_TEST(binary_ops_broadcast) {
    binary_fn fs[] = {em_add, em_sub, em_mul, em_div, em_pow, em_maximum, em_minimum,
                      em_eq, em_ne, em_lt, em_le, em_gt, em_ge};
    em_dtype dts[] = {EM_F32, EM_F64, EM_I32, EM_I64};
    for (int d = 0; d < 4; d++) {
        em_tensor *a = tu_random(5, 3, TU_SIZES(4, 1, 5), dts[d], 4);
        em_tensor *b = tu_random(6, 2, TU_SIZES(3, 5), dts[d], 4);
        if (dts[d] == EM_F32 || dts[d] == EM_F64) a = em_add_scalar(em_abs(a), 0.5); /* pow */
        em_tensor *ga = to_gpu(a), *gb = to_gpu(b);
        for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) {
            if ((fs[i] == em_div || fs[i] == em_pow) && !em_dtype_is_float(dts[d])) continue;
            same(fs[i](ga, gb), fs[i](a, b), tol_of(dts[d]) * 10, tol_of(dts[d]));
        }
        same(em_add_scalar(ga, 2), em_add_scalar(a, 2), tol_of(dts[d]), 0);
    }
    /* bool logic and where */
    em_tensor *x = tu_random(7, 2, TU_SIZES(6, 7), EM_F32, 1), *y = tu_random(8, 1, TU_SIZES(7), EM_F32, 1);
    em_tensor *gx = to_gpu(x), *gy = to_gpu(y);
    em_tensor *cm = em_gt(x, y), *gm = em_gt(gx, gy);
    same(em_where(gm, gx, gy), em_where(cm, x, y), 0, 0);
    same(em_add(gm, em_lt(gx, gy)), em_add(cm, em_lt(x, y)), 0, 0);
    same(em_mul(gm, gm), em_mul(cm, cm), 0, 0);
    /* NaN propagates through maximum, as on the CPU */
    double nan[3] = {0.0 / 0.0, 1, 2};
    em_tensor *n = em_from_data(nan, EM_F64, 1, TU_SIZES(3), CPU);
    same(em_maximum(to_gpu(n), em_full(1, TU_SIZES(3), 1.5, EM_F64, GPU)),
         em_maximum(n, em_full(1, TU_SIZES(3), 1.5, EM_F64, CPU)), 0, 0);
}
END_TEST

START_TEST(casts) {
    em_dtype dts[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_BOOL};
    for (int i = 0; i < 5; i++) {
        em_tensor *c = em_mul_scalar(tu_random(9, 2, TU_SIZES(5, 11), EM_F64, 1), 1e10);
        c = em_cast(c, dts[i]);
        em_tensor *g = to_gpu(c);
        for (int j = 0; j < 5; j++) same(em_cast(g, dts[j]), em_cast(c, dts[j]), 0, 0);
    }
}
END_TEST

START_TEST(non_contiguous_inputs) {
    em_tensor *c = tu_random(10, 3, TU_SIZES(6, 5, 4), EM_F32, 1);
    em_tensor *g = to_gpu(c);
    em_tensor *cp = em_permute(c, 3, (int[]){2, 0, 1}), *gp = em_permute(g, 3, (int[]){2, 0, 1});
    same(em_tanh(gp), em_tanh(cp), 1e-5, 1e-6);
    same(em_add(gp, em_slice(gp, 2, 0, 1, 1)), em_add(cp, em_slice(cp, 2, 0, 1, 1)), 0, 0);
}
END_TEST

/* ---- reductions ---- */

START_TEST(reductions) {
    em_dtype dts[] = {EM_F32, EM_F64, EM_I32, EM_I64};
    int dimsets[][3] = {{-1}, {0}, {0, 2}, {1}};
    int ndims[] = {1, 1, 2, 1};
    for (int d = 0; d < 4; d++) {
        em_tensor *c = tu_random(11, 3, TU_SIZES(7, 33, 129), dts[d], 5);
        em_tensor *g = to_gpu(c);
        double rt = dts[d] == EM_F32 ? 1e-5 : 1e-11;
        for (int s = 0; s < 4; s++) {
            for (int keep = 0; keep < 2; keep++) {
                const int *dm = dimsets[s];
                same(em_sum(g, ndims[s], dm, keep), em_sum(c, ndims[s], dm, keep), rt, rt);
                same(em_amax(g, ndims[s], dm, keep), em_amax(c, ndims[s], dm, keep), 0, 0);
                same(em_amin(g, ndims[s], dm, keep), em_amin(c, ndims[s], dm, keep), 0, 0);
                if (!em_dtype_is_float(dts[d])) continue;
                same(em_mean(g, ndims[s], dm, keep), em_mean(c, ndims[s], dm, keep), rt, rt);
                same(em_var(g, ndims[s], dm, 1, keep), em_var(c, ndims[s], dm, 1, keep), rt, rt);
            }
        }
        same(em_sum(g, 0, NULL, false), em_sum(c, 0, NULL, false), rt, rt);
        same(em_argmax(g, 1, false), em_argmax(c, 1, false), 0, 0);
    }
    /* few, long rows: the split scheme (two launches) */
    em_dtype sdt[] = {EM_F32, EM_F64, EM_I32};
    for (int d = 0; d < 3; d++) {
        double rt = sdt[d] == EM_F32 ? 1e-5 : sdt[d] == EM_F64 ? 1e-11 : 0;
        /* sums of ~1e6 values ~3 reach ~3000: f32 rounding in another order */
        double at = sdt[d] == EM_F32 ? 0.05 : sdt[d] == EM_F64 ? 1e-8 : 0;
        em_tensor *c1 = tu_random(40 + d, 1, TU_SIZES(1 << 20), sdt[d], 3);
        em_tensor *c2 = tu_random(50 + d, 3, TU_SIZES(3, 500, 400), sdt[d], 3); /* 200000: S = 64 */
        em_tensor *g1 = to_gpu(c1), *g2 = to_gpu(c2);
        same(em_sum(g1, 0, NULL, false), em_sum(c1, 0, NULL, false), rt, at);
        same(em_amax(g1, 0, NULL, false), em_amax(c1, 0, NULL, false), 0, 0);
        same(em_amin(g2, 2, (int[]){1, 2}, true), em_amin(c2, 2, (int[]){1, 2}, true), 0, 0);
        same(em_sum(g2, 2, (int[]){1, 2}, false), em_sum(c2, 2, (int[]){1, 2}, false), rt, at);
        if (em_dtype_is_float(sdt[d])) {
            same(em_mean(g1, 0, NULL, false), em_mean(c1, 0, NULL, false), rt, rt);
            same(em_mean(g2, 2, (int[]){1, 2}, true), em_mean(c2, 2, (int[]){1, 2}, true), rt, rt);
        }
        /* of a slice (not contiguous): reduced on a contiguous copy, split */
        em_tensor *c3 = tu_random(60 + d, 2, TU_SIZES(64, 4099), sdt[d], 3);
        em_tensor *s3 = em_slice(c3, 1, 1, 1501, 1), *g3 = em_slice(to_gpu(c3), 1, 1, 1501, 1);
        same(em_sum(g3, 0, NULL, false), em_sum(s3, 0, NULL, false), rt, at);
        same(em_amax(g3, 0, NULL, false), em_amax(s3, 0, NULL, false), 0, 0);
        if (em_dtype_is_float(sdt[d]))
            same(em_mean(g3, 0, NULL, false), em_mean(s3, 0, NULL, false), rt, rt);
    }
    /* over leading and middle dims of contiguous tensors: the column
     * kernel, its rows split in chunks when the columns are few (two
     * passes), NaN winning max and min; halves accumulate in double */
    em_dtype cdt[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_BF16, EM_F16};
    for (int d = 0; d < 6; d++) {
        bool fl = cdt[d] != EM_I32 && cdt[d] != EM_I64, half = cdt[d] == EM_BF16 || cdt[d] == EM_F16;
        double rt = cdt[d] == EM_F64 ? 1e-11 : half ? 1e-2 : fl ? 1e-5 : 0, at = half ? 1e-2 : rt;
        em_tensor *c1 = tu_random(70 + d, 2, TU_SIZES(5000, 37), cdt[d], 3);  /* S > 1 */
        em_tensor *c2 = tu_random(80 + d, 3, TU_SIZES(3, 301, 70), cdt[d], 3); /* middle dim */
        em_tensor *g1 = to_gpu(c1), *g2 = to_gpu(c2);
        for (int keep = 0; keep < 2; keep++) {
            same(em_sum(g1, 1, (int[]){0}, keep), em_sum(c1, 1, (int[]){0}, keep), rt, at * 30);
            same(em_amax(g1, 1, (int[]){0}, keep), em_amax(c1, 1, (int[]){0}, keep), 0, 0);
            same(em_amin(g2, 1, (int[]){1}, keep), em_amin(c2, 1, (int[]){1}, keep), 0, 0);
            same(em_sum(g2, 1, (int[]){1}, keep), em_sum(c2, 1, (int[]){1}, keep), rt, at * 10);
            same(em_sum(g2, 2, (int[]){0, 1}, keep), em_sum(c2, 2, (int[]){0, 1}, keep), rt, at * 30);
            if (!fl) continue;
            same(em_mean(g1, 1, (int[]){0}, keep), em_mean(c1, 1, (int[]){0}, keep), rt, at);
            same(em_mean(g2, 1, (int[]){1}, keep), em_mean(c2, 1, (int[]){1}, keep), rt, at);
        }
        if (!fl || half) continue;
        em_tensor *n = em_where(em_gt(c1, em_scalar(2.9, cdt[d], CPU)), em_full(0, NULL, NAN, cdt[d], CPU), c1);
        same(em_amax(to_gpu(n), 1, (int[]){0}, false), em_amax(n, 1, (int[]){0}, false), 0, 0);
        same(em_amin(to_gpu(n), 1, (int[]){0}, false), em_amin(n, 1, (int[]){0}, false), 0, 0);
    }
    /* bool: any/all-like max and min, integer sum */
    em_tensor *b = em_gt(tu_random(12, 2, TU_SIZES(9, 40), EM_F32, 1), em_scalar(0.5, EM_F32, CPU));
    em_tensor *gb = to_gpu(b);
    same(em_amax(gb, 1, (int[]){1}, false), em_amax(b, 1, (int[]){1}, false), 0, 0);
    same(em_sum(gb, 1, (int[]){1}, false), em_sum(b, 1, (int[]){1}, false), 0, 0);
}
END_TEST

START_TEST(decompositions) {
    int64_t sz[2] = {37, 1000};
    em_tensor *x = tu_random(13, 2, sz, EM_F32, 2), *w = tu_random(14, 1, sz + 1, EM_F32, 1),
              *b = tu_random(15, 1, sz + 1, EM_F32, 1);
    em_tensor *gx = to_gpu(x), *gw = to_gpu(w), *gbias = to_gpu(b);
    same(em_softmax(gx, -1), em_softmax(x, -1), 1e-5, 1e-7);
    same(em_softmax(gx, 0), em_softmax(x, 0), 1e-5, 1e-7);
    same(em_log_softmax(gx, -1), em_log_softmax(x, -1), 1e-5, 1e-5);
    same(em_layer_norm(gx, 1, gw, gbias, 1e-5), em_layer_norm(x, 1, w, b, 1e-5), 1e-4, 1e-5);
    /* rows longer than 16 elements per thread: no register cache */
    em_tensor *l = tu_random(33, 2, TU_SIZES(3, 40000), EM_F32, 2);
    same(em_softmax(to_gpu(l), -1), em_softmax(l, -1), 1e-5, 1e-8);
    same(em_var(to_gpu(l), 1, (int[]){1}, 0, true), em_var(l, 1, (int[]){1}, 0, true), 1e-4, 1e-6);
}
END_TEST

/* ---- joining, indexing ---- */

/* r, an index_select whose indices are out of range, was queued (the
 * kernel finds them): the next synchronization, here a copy to the host,
 * fails with EM_ERR_INDEX and a message holding want; the one after it is
 * clean. */
#define expect_index_error(r, want) expect_index_error_at(__FILE__, __LINE__, (r), (want))
static void expect_index_error_at(const char *file, int line, em_tensor *r, const char *want) {
    ck_assert_msg(r != NULL, "%s:%d: the op itself failed: %s", file, line, em_last_error());
    size_t n = (size_t)em_numel(r) * em_dtype_size(em_dtype_of(r));
    void *buf = malloc(n ? n : 1);
    em_clear_error();
    em_status s = em_copy_to_host(r, buf, n);
    ck_assert_msg(s == EM_ERR_INDEX, "%s:%d: status %s (%s), expected EM_ERR_INDEX", file, line,
                  em_status_name(s), em_last_error());
    ck_assert_msg(strstr(em_last_error(), want), "%s:%d: message %s", file, line, em_last_error());
    ck_assert_msg(em_copy_to_host(r, buf, n) == EM_OK, "%s:%d: the error surfaced twice: %s", file,
                  line, em_last_error());
    free(buf);
}

START_TEST(cat_and_index) {
    em_tensor *a = tu_random(16, 2, TU_SIZES(3, 4), EM_F32, 1), *b = tu_random(17, 2, TU_SIZES(2, 4), EM_F32, 1);
    em_tensor *ga = to_gpu(a), *gb = to_gpu(b);
    same(em_cat(2, (em_tensor *[]){ga, gb}, 0), em_cat(2, (em_tensor *[]){a, b}, 0), 0, 0);
    int64_t idx[4] = {2, 0, 1, 2};
    em_tensor *i = em_from_data(idx, EM_I64, 1, TU_SIZES(4), CPU);
    same(em_index_select(ga, 0, to_gpu(i)), em_index_select(a, 0, i), 0, 0);
    same(em_embedding(ga, to_gpu(i)), em_embedding(a, i), 0, 0);
    /* the gather kernel: a permuted x, the middle dim, strided i32 indices */
    em_tensor *x = tu_random(18, 3, TU_SIZES(6, 5, 3), EM_F64, 1), *gx = em_permute(to_gpu(x), 3, (int[]){2, 1, 0});
    x = em_permute(x, 3, (int[]){2, 1, 0});
    int32_t iv[10] = {4, 9, 0, 9, 2, 9, 3, 9, 1, 9};
    em_tensor *i32 = em_slice(em_from_data(iv, EM_I32, 1, TU_SIZES(10), CPU), 0, 0, 10, 2);
    em_tensor *gi32 = em_slice(to_gpu(em_from_data(iv, EM_I32, 1, TU_SIZES(10), CPU)), 0, 0, 10, 2);
    same(em_index_select(gx, 1, gi32), em_index_select(x, 1, i32), 0, 0);
    same(em_index_select(gx, 2, to_gpu(em_scalar(5, EM_I64, CPU))), em_index_select(x, 2, em_scalar(5, EM_I64, CPU)), 0, 0);
    /* MiniLM's lookup: [B, T] ids into a [V, D] table; integer values too */
    em_tensor *table = tu_random(19, 2, TU_SIZES(3000, 96), EM_F32, 1);
    int64_t idv[8 * 24];
    for (int k = 0; k < 8 * 24; k++) idv[k] = (int64_t)(((uint64_t)k * 2654435761u + 7) % 3000);
    em_tensor *ids = em_from_data(idv, EM_I64, 2, TU_SIZES(8, 24), CPU);
    same(em_embedding(to_gpu(table), to_gpu(ids)), em_embedding(table, ids), 0, 0);
    em_tensor *it = tu_random(22, 2, TU_SIZES(40, 7), EM_I64, 1000);
    same(em_index_select(to_gpu(it), 0, to_gpu(i)), em_index_select(it, 0, i), 0, 0);
    /* out-of-range indices: the CPU's error, at the next synchronization
     * (native_index_select_errors has the details) */
    int64_t badv[3] = {1, 2, -1};
    em_tensor *gbad = to_gpu(em_from_data(badv, EM_I64, 1, TU_SIZES(3), CPU));
    expect_index_error(em_index_select(ga, 0, gbad), "index -1 is out of range");
    badv[2] = 3; /* a has 3 rows */
    gbad = to_gpu(em_from_data(badv, EM_I64, 1, TU_SIZES(3), CPU));
    expect_index_error(em_embedding(ga, gbad), "index 3 is out of range for dim 0 of size 3");
}
END_TEST

/* ---- matmul (cuBLAS) ---- */

START_TEST(matmul) {
    em_dtype dts[] = {EM_F32, EM_F64};
    for (int d = 0; d < 2; d++) {
        double rt = dts[d] == EM_F32 ? 1e-4 : 1e-11;
        em_tensor *a = tu_random(18, 2, TU_SIZES(33, 70), dts[d], 1);
        em_tensor *b = tu_random(19, 2, TU_SIZES(70, 45), dts[d], 1);
        em_tensor *ga = to_gpu(a), *gb = to_gpu(b);
        same(em_matmul(ga, gb), em_matmul(a, b), rt, rt);
        /* transposed views, used in place */
        em_tensor *at = em_transpose(to_gpu(em_contiguous(em_transpose(a, 0, 1))), 0, 1);
        em_tensor *bt = em_transpose(to_gpu(em_contiguous(em_transpose(b, 0, 1))), 0, 1);
        same(em_matmul(at, bt), em_matmul(a, b), rt, rt);
        /* batched, and batch broadcast */
        em_tensor *x = tu_random(20, 3, TU_SIZES(5, 9, 70), dts[d], 1);
        em_tensor *y = tu_random(21, 3, TU_SIZES(5, 70, 8), dts[d], 1);
        same(em_matmul(to_gpu(x), to_gpu(y)), em_matmul(x, y), rt, rt);
        same(em_matmul(to_gpu(x), gb), em_matmul(x, b), rt, rt);
        /* a view whose batch dims do not collapse: copied first */
        em_tensor *p = tu_random(22, 4, TU_SIZES(2, 9, 3, 70), dts[d], 1);
        em_tensor *pp = em_permute(p, 4, (int[]){0, 2, 1, 3});
        em_tensor *gpp = em_permute(to_gpu(p), 4, (int[]){0, 2, 1, 3});
        same(em_matmul(gpp, gb), em_matmul(pp, b), rt, rt);
    }
    /* TF32 on request: still close, at TF32's precision */
    em_tensor *a = tu_random(34, 2, TU_SIZES(128, 256), EM_F32, 1), *b = tu_random(35, 2, TU_SIZES(256, 64), EM_F32, 1);
    setenv("EMBER_CUDA_TF32", "1", 1);
    em_tensor *t = em_matmul(to_gpu(a), to_gpu(b));
    unsetenv("EMBER_CUDA_TF32");
    same(t, em_matmul(a, b), 2e-2, 2e-2);
    same(em_matmul(to_gpu(a), to_gpu(b)), em_matmul(a, b), 1e-4, 1e-4); /* and off again */
    /* integers: on the host */
    em_tensor *i = tu_random(23, 2, TU_SIZES(4, 6), EM_I64, 3), *j = tu_random(24, 2, TU_SIZES(6, 3), EM_I64, 3);
    same(em_matmul(to_gpu(i), to_gpu(j)), em_matmul(i, j), 0, 0);
}
END_TEST

/* The skinny kernels (1 to 8 rows against a row-major weight, what a
 * decoder's steps are): odd K, N a multiple of 4 but not of 128, batch
 * dims folded into the rows, strided rows of A, B a row slice of a wider
 * matrix; against a float64 matmul of the same values.  Past 8 rows, odd
 * N, or a transposed B, cuBLAS runs (the same check). */
static void check_skinny(uint64_t seed, int nd, const int64_t *as, int64_t K, int64_t N, int64_t ldb) {
    em_tensor *a = tu_random(seed, nd, as, EM_F32, 1);
    em_tensor *bw = tu_random(seed + 1, 2, TU_SIZES(K, ldb), EM_F32, 1), *b = em_slice(bw, 1, 0, N, 1);
    em_tensor *gb = em_slice(to_gpu(bw), 1, 0, N, 1);
    em_tensor *ref = em_cast(em_matmul(em_cast(a, EM_F64), em_cast(b, EM_F64)), EM_F32);
    /* f32 sums of K products of values below 1: within K ulps of their scale */
    double atol = 1.2e-7 * (double)K;
    same(em_matmul(to_gpu(a), gb), ref, 1e-5, atol);
    /* A's rows strided: every other row of a taller A */
    int64_t tall[8];
    memcpy(tall, as, sizeof(int64_t) * (size_t)nd);
    tall[nd - 2] *= 2;
    em_tensor *at = tu_random(seed + 2, nd, tall, EM_F32, 1);
    em_tensor *ats = em_slice(at, nd - 2, 0, tall[nd - 2], 2);
    em_tensor *gats = em_slice(to_gpu(at), nd - 2, 0, tall[nd - 2], 2);
    same(em_matmul(gats, gb), em_cast(em_matmul(em_cast(ats, EM_F64), em_cast(b, EM_F64)), EM_F32), 1e-5, atol);
}

/* Whether cuBLASLt runs linears here (loaded, not off). */
static bool lt_there(void) {
    bool ok = cuda_lt_enabled() && cuda_cublaslt() != NULL;
    em_clear_error();
    return ok;
}

/* linear (a @ w + bias, what the linear pass makes of a matmul and its
 * bias add): the skinny kernel adds the bias; a bias it cannot read (not
 * 16-byte aligned) and more than 8 rows run the matmul and the add. */
static void check_linear_gpu(uint64_t seed, int64_t M, int64_t K, int64_t N, int64_t boff) {
    em_tensor *a = tu_random(seed, 2, TU_SIZES(M, K), EM_F32, 1), *w = tu_random(seed + 1, 2, TU_SIZES(K, N), EM_F32, 1);
    em_tensor *bw = tu_random(seed + 2, 1, TU_SIZES(N + boff), EM_F32, 1), *b = em_slice(bw, 0, boff, N + boff, 1);
    em_tensor *ref = em_cast(em_add(em_matmul(em_cast(a, EM_F64), em_cast(w, EM_F64)), em_cast(b, EM_F64)), EM_F32);
    em_tensor *in[3] = {to_gpu(a), to_gpu(w), em_slice(to_gpu(bw), 0, boff, N + boff, 1)};
    em_tensor *r = em_dispatch(EM_OP_LINEAR, 3, in, NULL);
    ck_assert_msg(r != NULL, "%s", em_last_error());
    same(r, ref, 1e-5, 1.2e-7 * (double)K + 1e-6);
}

START_TEST(linear_on_cuda) {
    check_linear_gpu(440, 1, 768, 2304, 0); /* GPT-2's qkv at batch 1 */
    check_linear_gpu(443, 5, 999, 388, 0);  /* odd K, 5 rows */
    check_linear_gpu(446, 3, 64, 128, 1);   /* a bias 4 bytes off 16: matmul, then add */
    check_linear_gpu(449, 12, 64, 128, 0);  /* 12 rows: cuBLAS, then add */
    /* compiled at 3 rows: both bias adds go into the skinny matmuls, and
     * one kernel (the gelu) is left; at 16 rows they fuse with the gelu
     * and the output instead (two kernels) */
    for (int rows = 3; rows <= 16; rows += 13) {
        em_tensor *cin[5] = {tu_random(452, 2, TU_SIZES(rows, 32), EM_F32, 1),
                             tu_random(453, 2, TU_SIZES(32, 64), EM_F32, 0.2),
                             tu_random(454, 1, TU_SIZES(64), EM_F32, 1),
                             tu_random(455, 2, TU_SIZES(64, 32), EM_F32, 0.2),
                             tu_random(456, 1, TU_SIZES(32), EM_F32, 1)}, *gin[5], *gout, *cout;
        for (int i = 0; i < 5; i++) gin[i] = to_gpu(cin[i]);
        em_compile_options o = {.ninputs = 5, .noutputs = 1, .backend = "cuda", .name = "mlp"};
        em_compiled *f = em_compile(wl_mlp_fn, NULL, &o);
        ck_assert_int_eq(wl_mlp_fn(NULL, cin, NULL, &cout), EM_OK);
        for (int rep = 0; rep < 3; rep++) {
            ck_assert_msg(em_call(f, gin, NULL, &gout) == EM_OK, "%s", em_last_error());
            /* at 16 rows cuBLASLt's gelu epilogue may use the hardware
             * tanh (2^-11 relative): up to 6e-4 in a hidden value */
            double tol = rows == 3 || !lt_there() ? 1e-4 : 2e-3;
            same(gout, cout, tol, tol);
        }
        em_compile_stats st;
        em_compiled_stats(f, &st);
        /* with cuBLASLt, the 16-row linears run in its epilogues, the
         * gelu_tanh folded into the first: no kernel left */
        ck_assert_int_eq(st.kernels, rows == 3 ? 1 : lt_there() ? 0 : 2);
        em_compiled_free(f);
    }
}
END_TEST

/* ---- linear with an activation through cuBLASLt ---- */

/* How many linears cuBLASLt ran on cuda:0. */
static int64_t lt_calls(void) {
    cuda_device *d = cuda_device_get(0);
    ck_assert_msg(d != NULL, "%s", em_last_error());
    pthread_mutex_lock(&d->lt_lock);
    int64_t n = d->lt_calls;
    pthread_mutex_unlock(&d->lt_lock);
    return n;
}

static const char *const act_names[] = {"none", "relu", "gelu_tanh", "gelu"};

/* linear(a, w, bias) [act] on cuda:0 (a, w, b: CPU tensors of dt; wg: w
 * on the GPU, a view when w is) against float64 act(a @ w + b) of the same
 * values.  Tolerances, relative + absolute: through cuBLASLt the epilogue
 * rounds once (f32 accumulation): bf16 2^-8, f16 2^-11 (twice the
 * rounding), f32 1e-5 with K * 1.2e-7 for the sum's order; the unfused
 * path (no cuBLASLt, or its fallback) rounds the product, the sum and the
 * act: bf16 1.6e-2 + 3e-2, f16 2e-3 + 4e-3.  gelu_tanh: the epilogue may
 * use the hardware tanh (tanh.approx.f32, relative error 2^-11), whose
 * error 0.5 |x| 2^-11 reaches 3e-3 at the |x| ~ 12 these sums reach:
 * rtol at least 1e-3, and 4e-3 more absolute.  Returns whether cuBLASLt
 * ran it. */
static bool check_lt_at(int line, em_act act, em_tensor *a, em_tensor *w, em_tensor *wg, em_tensor *b) {
    em_dtype dt = em_dtype_of(a);
    int64_t K = em_size(a, -1);
    em_tensor *prod = em_matmul(em_cast(a, EM_F64), em_cast(w, EM_F64));
    em_tensor *ref = em_add(prod, em_cast(b, EM_F64));
    ref = act == EM_ACT_RELU        ? em_relu(ref)
          : act == EM_ACT_GELU_TANH ? em_gelu_tanh(ref)
          : act == EM_ACT_GELU      ? em_gelu(ref)
                                    : ref;
    em_tensor *in[3] = {to_gpu(a), wg, to_gpu(b)};
    em_op_attrs at = {.act = act};
    int64_t before = lt_calls();
    em_tensor *r = em_dispatch(EM_OP_LINEAR, 3, in, &at);
    ck_assert_msg(r != NULL, "line %d [%s %s]: %s", line, em_dtype_name(dt), act_names[act], em_last_error());
    ck_assert_int_eq(em_dtype_of(r), dt);
    ck_assert_int_eq(em_device_of(r).type, EM_CUDA);
    bool lt = lt_calls() > before;
    double rt, atl;
    if (dt == EM_F32) {
        rt = 1e-5, atl = 1.2e-7 * (double)K + 1e-6;
    } else if (dt == EM_BF16) {
        /* one ulp (2^-7 relative), not half: on the H200 cuBLASLt's bf16
         * result was 18 where the exact value was 17.909 (0.73 ulp, as if
         * the product were rounded to bf16 before the epilogue's bias add
         * and rounded again) */
        rt = lt ? 0x1p-7 : 1.6e-2, atl = lt ? 1e-3 : 3e-2;
    } else {
        rt = lt ? 0x1p-10 : 2e-3, atl = lt ? 2e-4 : 4e-3; /* one f16 ulp, likewise */
    }
    if (act == EM_ACT_GELU_TANH) rt = rt > 1e-3 ? rt : 1e-3, atl += 4e-3;
    /* cuBLASLt's half gelu epilogue rounds once more (the product, then
     * the act): two ulps there.  (Results 0.03 off at K = 1000, seen on
     * the H200, were split-K partials summed in bf16: cuda_matmul.c now
     * asks for reductions in f32.) */
    if (act == EM_ACT_GELU_TANH && lt && dt != EM_F32) rt *= 2;
    /* cuBLASLt's half epilogue rounds the product to the half type before
     * it adds the bias (above), so its error scales with the product, not
     * with a sum that cancels: on the H200 a bf16 value of -0.4297 where
     * the exact one was -0.4366 (3.5 ulps of the result, from a bias that
     * cancels most of the product).  The bound is rt (|ref| + |product|)
     * + atl. */
    double *rv = tu_values(ref), *pv = tu_values(prod), *got = tu_values(r);
    ck_assert_int_eq(em_numel(r), em_numel(ref));
    for (int64_t i = 0; i < em_numel(ref); i++) {
        double tol = rt * (fabs(rv[i]) + (lt && dt != EM_F32 ? fabs(pv[i]) : 0)) + atl;
        ck_assert_msg(fabs(got[i] - rv[i]) <= tol, "line %d [%s %s] element %lld: %.9g, expected %.9g (product %.9g)",
                      line, em_dtype_name(dt), act_names[act], (long long)i, got[i], rv[i], pv[i]);
    }
    free(pv), free(got);
    free(rv);
    return lt;
}

/* One case on each dtype and activation: a [as], w [K, N] (transposed:
 * the view of a [N, K] matrix), bias [N] (or [1, 1, N] when wide_bias);
 * must_lt: cuBLASLt must run it where it is present. */
static void check_lt_case(int line, uint64_t seed, int nd, const int64_t *as, int wnd, const int64_t *ws,
                          bool transposed, bool must_lt) {
    static const em_dtype dts[] = {EM_F32, EM_BF16, EM_F16};
    int64_t N = transposed ? ws[wnd - 2] : ws[wnd - 1];
    for (int t = 0; t < 3; t++) {
        for (em_act act = EM_ACT_NONE; act < EM_ACT_COUNT; act++) {
            em_dtype dt = dts[t];
            em_tensor *a = tu_random(seed, nd, as, dt, 1), *wst = tu_random(seed + 1, wnd, ws, dt, 1);
            em_tensor *b = tu_random(seed + 2, 1, TU_SIZES(N), dt, 1);
            em_tensor *w = transposed ? em_transpose(wst, -2, -1) : wst;
            em_tensor *wg = transposed ? em_transpose(to_gpu(wst), -2, -1) : to_gpu(wst);
            bool lt = check_lt_at(line, act, a, w, wg, b);
            /* gelu's erf form is not among cuBLASLt's epilogues: unfused */
            ck_assert_msg(act != EM_ACT_GELU || !lt, "line %d [%s gelu]: cuBLASLt ran it", line,
                          em_dtype_name(dt));
            ck_assert_msg(lt || !must_lt || act == EM_ACT_GELU || !lt_there(),
                          "line %d [%s %s]: cuBLASLt did not run it", line, em_dtype_name(dt), act_names[act]);
        }
    }
}
#define check_lt(seed, nd, as, wnd, ws, transposed, must_lt) \
    check_lt_case(__LINE__, seed, nd, as, wnd, ws, transposed, must_lt)

START_TEST(linear_act_on_cuda) {
    printf("cuBLASLt: %s\n", lt_there() ? "present" : "absent or off");
    check_lt(600, 2, TU_SIZES(64, 96), 2, TU_SIZES(96, 80), false, true);       /* 2-D */
    check_lt(610, 2, TU_SIZES(37, 131), 2, TU_SIZES(131, 75), false, false);    /* odd K, odd N */
    check_lt(620, 3, TU_SIZES(3, 17, 40), 2, TU_SIZES(40, 24), false, true);    /* batches folded into M */
    check_lt(630, 3, TU_SIZES(2, 9, 40), 3, TU_SIZES(2, 40, 24), false, true);  /* a strided batch */
    check_lt(640, 2, TU_SIZES(20, 64), 2, TU_SIZES(48, 64), true, true);        /* w a transposed view */
    check_lt(650, 3, TU_SIZES(2, 5, 64), 2, TU_SIZES(48, 64), true, true);      /* both */
    check_lt(660, 2, TU_SIZES(1, 256), 2, TU_SIZES(256, 128), false, false);    /* M = 1 (f32: skinny) */
    check_lt(670, 2, TU_SIZES(3, 1000), 2, TU_SIZES(1000, 516), false, false);  /* skinny rows, act */
    /* a bias of sizes [1, 1, N] over a batch */
    em_tensor *a = tu_random(680, 3, TU_SIZES(2, 8, 32), EM_BF16, 1), *w = tu_random(681, 2, TU_SIZES(32, 16), EM_BF16, 1);
    em_tensor *b = tu_random(682, 3, TU_SIZES(1, 1, 16), EM_BF16, 1);
    check_lt_at(__LINE__, EM_ACT_GELU_TANH, a, w, to_gpu(w), b);
    /* EMBER_CUDA_LT=0: the unfused path, the same values within its
     * tolerance, and cuBLASLt not called */
    setenv("EMBER_CUDA_LT", "0", 1);
    int64_t before = lt_calls();
    em_tensor *a2 = tu_random(690, 2, TU_SIZES(64, 96), EM_BF16, 1), *w2 = tu_random(691, 2, TU_SIZES(96, 80), EM_BF16, 1);
    ck_assert(!check_lt_at(__LINE__, EM_ACT_RELU, a2, w2, to_gpu(w2), tu_random(692, 1, TU_SIZES(80), EM_BF16, 1)));
    ck_assert_int_eq(lt_calls(), before);
    unsetenv("EMBER_CUDA_LT");
    /* size 0: no rows */
    em_tensor *z[3] = {to_gpu(tu_random(693, 2, TU_SIZES(0, 8), EM_BF16, 1)), to_gpu(tu_random(694, 2, TU_SIZES(8, 16), EM_BF16, 1)),
                       to_gpu(tu_random(695, 1, TU_SIZES(16), EM_BF16, 1))};
    em_tensor *r = em_dispatch(EM_OP_LINEAR, 3, z, &(em_op_attrs){.act = EM_ACT_RELU});
    ck_assert_msg(r != NULL && em_numel(r) == 0, "%s", em_last_error());
}
END_TEST

/* A compiled GPT-2 MLP (x @ W1 + b1 -> gelu_tanh -> @ W2 + b2) in f32 and
 * bf16 at 64 rows: with cuBLASLt both linears are fused (no kernel left,
 * two cuBLASLt calls a call), and the result matches eager on the GPU and
 * the float64 reference.  bf16: eager rounds the product, the sum and the
 * gelu, the fused epilogue once, and the second product sums 512 such
 * values: 4e-2 relative and absolute; f32 2e-3 (the epilogue's tanh may
 * be the hardware's, 2^-11 relative: up to 5e-4 in a hidden value, summed
 * over 512 of them at weights of 0.05). */
START_TEST(compiled_mlp_fuses_linears) {
    static const em_dtype dts[] = {EM_F32, EM_BF16};
    for (int t = 0; t < 2; t++) {
        em_dtype dt = dts[t];
        em_tensor *cin[5] = {tu_random(700, 2, TU_SIZES(64, 128), dt, 1), tu_random(701, 2, TU_SIZES(128, 512), dt, 0.1),
                             tu_random(702, 1, TU_SIZES(512), dt, 1), tu_random(703, 2, TU_SIZES(512, 128), dt, 0.05),
                             tu_random(704, 1, TU_SIZES(128), dt, 1)}, *gin[5], *c64[5], *gout, *eout, *ref;
        for (int i = 0; i < 5; i++) gin[i] = to_gpu(cin[i]), c64[i] = em_cast(cin[i], EM_F64);
        ck_assert_int_eq(wl_mlp_fn(NULL, c64, NULL, &ref), EM_OK);
        ck_assert_int_eq(wl_mlp_fn(NULL, gin, NULL, &eout), EM_OK);
        em_compile_options o = {.ninputs = 5, .noutputs = 1, .backend = "cuda", .name = "gpt2_mlp"};
        em_compiled *f = em_compile(wl_mlp_fn, NULL, &o);
        ck_assert_ptr_nonnull(f);
        double tol = dt == EM_F32 ? 2e-3 : 4e-2;
        double *rv = tu_values(ref), *ev = tu_values(eout);
        for (int rep = 0; rep < 3; rep++) {
            int64_t before = lt_calls();
            ck_assert_msg(em_call(f, gin, NULL, &gout) == EM_OK, "%s", em_last_error());
            ck_assert_int_eq(em_dtype_of(gout), dt);
            tu_check_close(gout, rv, 2, TU_SIZES(64, 128), tol, tol);
            tu_check_close(gout, ev, 2, TU_SIZES(64, 128), tol, tol);
            if (lt_there()) ck_assert_int_eq(lt_calls() - before, 2);
        }
        free(rv), free(ev);
        em_compile_stats st;
        em_compiled_stats(f, &st);
        printf("compiled %s mlp: %d kernel(s)\n", em_dtype_name(dt), st.kernels);
        if (lt_there()) ck_assert_int_eq(st.kernels, 0);
        em_compiled_free(f);
    }
}
END_TEST

START_TEST(skinny_matmul) {
    check_skinny(400, 2, TU_SIZES(1, 768), 768, 2304, 2304);     /* GPT-2's qkv at batch 1 */
    check_skinny(402, 3, TU_SIZES(8, 1, 3072), 3072, 768, 768);  /* its MLP's down, batch 8 */
    check_skinny(404, 2, TU_SIZES(3, 37), 37, 132, 140);         /* odd K, N past a tile, ldb > N */
    check_skinny(406, 3, TU_SIZES(2, 2, 5), 5, 4, 4);            /* tiny */
    check_skinny(408, 2, TU_SIZES(7, 4099), 4099, 260, 260);     /* long K: many chunks */
    check_skinny(410, 2, TU_SIZES(9, 64), 64, 256, 256);         /* 9 rows: cuBLAS */
    check_skinny(412, 2, TU_SIZES(2, 64), 64, 130, 130);         /* N % 4 != 0: cuBLAS */
    check_skinny(416, 2, TU_SIZES(3, 1000), 1000, 516, 516);     /* 3 and 5 rows: uneven groups */
    check_skinny(418, 3, TU_SIZES(5, 1, 999), 999, 388, 388);
    /* many calls, the counters reused: each the same bits as the first
     * (a counter left non-zero would leave a tile unwritten) */
    em_tensor *a = to_gpu(tu_random(420, 2, TU_SIZES(1, 768), EM_F32, 1));
    em_tensor *b = to_gpu(tu_random(421, 2, TU_SIZES(768, 3072), EM_F32, 1));
    static float first[3072], again[3072];
    ck_assert(em_copy_to_host(em_matmul(a, b), first, sizeof first) == EM_OK);
    for (int i = 0; i < 50; i++) {
        em_scope_begin();
        ck_assert_msg(em_copy_to_host(em_matmul(a, b), again, sizeof again) == EM_OK, "%s", em_last_error());
        ck_assert_int_eq(memcmp(again, first, sizeof first), 0);
        em_scope_end();
    }
    /* off: cuBLAS gives the same */
    setenv("EMBER_CUDA_GEMV", "0", 1);
    check_skinny(400, 2, TU_SIZES(1, 768), 768, 2304, 2304);
    unsetenv("EMBER_CUDA_GEMV");
    /* size 0 rows */
    em_tensor *z = em_zeros(2, TU_SIZES(0, 16), EM_F32, GPU), *w = tu_random(414, 2, TU_SIZES(16, 8), EM_F32, 1);
    em_tensor *r = em_matmul(z, to_gpu(w));
    ck_assert_msg(r && em_size(r, 0) == 0 && em_size(r, 1) == 8, "%s", em_last_error());
}
END_TEST

/* ---- compiled functions ---- */

static em_status block_fn(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    em_tensor *h = em_layer_norm(in[0], 1, in[1], in[2], 1e-5);
    em_tensor *att = em_softmax(em_mul_scalar(em_matmul(h, em_transpose(h, 0, 1)), 0.125), -1);
    out[0] = em_add(in[0], em_matmul(att, h));
    out[1] = em_sum(em_relu(h), 1, (int[]){0}, false);
    return out[0] && out[1] ? EM_OK : em_last_status();
}

static em_status sum_all_fn(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    out[0] = em_sum(in[0], 0, NULL, false);
    out[1] = em_amax(em_relu(in[1]), 1, (int[]){1}, false); /* fused: not split */
    return out[0] && out[1] ? EM_OK : em_last_status();
}

/* want_kernels: the fused kernels the entry must have (-1: at least one). */
static void check_compiled_k(em_fn fn, int nin, em_tensor **cin, int nout, const char *backend,
                             double rtol, int want_kernels) {
    em_tensor *gin[8], *gout[4] = {0}, *cout[4] = {0};
    for (int i = 0; i < nin; i++) gin[i] = to_gpu(cin[i]);
    em_compile_options o = {.ninputs = nin, .noutputs = nout, .backend = backend, .name = "t"};
    em_compiled *f = em_compile(fn, NULL, &o);
    ck_assert_msg(f != NULL, "%s", em_last_error());
    ck_assert_int_eq(fn(NULL, cin, NULL, cout), EM_OK); /* CPU eager reference */
    for (int rep = 0; rep < 3; rep++) {
        ck_assert_msg(em_call(f, gin, NULL, gout) == EM_OK, "%s", em_last_error());
        for (int i = 0; i < nout; i++) same(gout[i], cout[i], rtol, rtol);
    }
    em_compile_stats st;
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.traces, 1);
    ck_assert_int_eq(st.hits, 2);
    if (want_kernels < 0) ck_assert_msg(st.kernels > 0, "no fused kernels");
    else ck_assert_int_eq(st.kernels, want_kernels);
    em_compiled_free(f);
}

static void check_compiled(em_fn fn, int nin, em_tensor **cin, int nout, const char *backend,
                           double rtol) {
    check_compiled_k(fn, nin, cin, nout, backend, rtol, -1);
}

START_TEST(compiled_graphs) {
    em_tensor *in[5] = {tu_random(25, 2, TU_SIZES(16, 32), EM_F32, 1),
                        tu_random(26, 2, TU_SIZES(32, 64), EM_F32, 0.2),
                        tu_random(27, 1, TU_SIZES(64), EM_F32, 1),
                        tu_random(28, 2, TU_SIZES(64, 32), EM_F32, 0.2),
                        tu_random(29, 1, TU_SIZES(32), EM_F32, 1)};
    /* 16 rows: both linears on cuBLASLt with the bias and gelu_tanh in
     * its epilogue (no kernel), else a kernel for each bias add */
    int mlp_kernels = lt_there() ? 0 : -1;
    check_compiled_k(wl_mlp_fn, 5, in, 1, NULL, 1e-4, mlp_kernels); /* auto: CUDA inputs -> cuda */
    check_compiled_k(wl_mlp_fn, 5, in, 1, "cuda", 1e-4, mlp_kernels);
    em_tensor *bin[3] = {tu_random(30, 2, TU_SIZES(24, 48), EM_F32, 1),
                         tu_random(31, 1, TU_SIZES(48), EM_F32, 1),
                         tu_random(32, 1, TU_SIZES(48), EM_F32, 1)};
    check_compiled(block_fn, 3, bin, 2, NULL, 1e-4);
    /* a lone long-row reduction runs as the split eager op */
    em_tensor *sin[2] = {tu_random(36, 1, TU_SIZES(1 << 20), EM_F32, 1),
                         tu_random(37, 2, TU_SIZES(2, 1 << 17), EM_F32, 1)};
    check_compiled(sum_all_fn, 2, sin, 2, NULL, 2e-5);
}
END_TEST

/* The "cuda" backend given a CPU graph runs it op by op on the CPU. */
START_TEST(cuda_backend_on_cpu_inputs) {
    em_tensor *in[5] = {tu_random(25, 2, TU_SIZES(4, 8), EM_F32, 1), tu_random(26, 2, TU_SIZES(8, 8), EM_F32, 1),
                        tu_random(27, 1, TU_SIZES(8), EM_F32, 1), tu_random(28, 2, TU_SIZES(8, 8), EM_F32, 1),
                        tu_random(29, 1, TU_SIZES(8), EM_F32, 1)};
    em_tensor *out[1];
    em_compile_options o = {.ninputs = 5, .noutputs = 1, .backend = "cuda"};
    em_compiled *f = em_compile(wl_mlp_fn, NULL, &o);
    em_tensor *ref[1];
    ck_assert_int_eq(wl_mlp_fn(NULL, in, NULL, ref), EM_OK);
    for (int rep = 0; rep < 2; rep++) {
        ck_assert_msg(em_call(f, in, NULL, out) == EM_OK, "%s", em_last_error());
        ck_assert_int_eq(em_device_of(out[0]).type, EM_CPU);
        double *r = tu_values(ref[0]);
        tu_check_close(out[0], r, 2, TU_SIZES(4, 8), 1e-6, 1e-6);
        free(r);
    }
    em_compile_stats st;
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.kernels, 0);
    ck_assert_int_eq(st.hits, 1);
    em_compiled_free(f);
}
END_TEST

/* ---- lazy mode ---- */

/* Lazy mode on cuda:0: the block's ops are recorded, cut into graphs the
 * cuda backend compiles, and give the CPU eager values; a second run of
 * the same program finds its graphs compiled; a read mid-way computes
 * what it needs; a tensor never read is computable after lazy mode ends. */
START_TEST(lazy_mode_on_the_gpu) {
    em_tensor *cin[3] = {tu_random(40, 2, TU_SIZES(24, 48), EM_F32, 1),
                         tu_random(41, 1, TU_SIZES(48), EM_F32, 1),
                         tu_random(42, 1, TU_SIZES(48), EM_F32, 1)};
    em_tensor *ref[2], *gin[3], *out[2];
    ck_assert_int_eq(block_fn(NULL, cin, NULL, ref), EM_OK);
    for (int i = 0; i < 3; i++) gin[i] = to_gpu(cin[i]);
    ck_assert_int_eq(em_lazy_begin(), EM_OK);
    em_lazy_stats st[3];
    for (int rep = 0; rep < 2; rep++) {
        ck_assert_int_eq(block_fn(NULL, gin, NULL, out), EM_OK);
        ck_assert_int_eq(em_sync(), EM_OK);
        same(out[0], ref[0], 1e-4, 1e-4);
        same(out[1], ref[1], 1e-4, 1e-4);
        ck_assert_int_eq(em_lazy_get_stats(&st[rep]), EM_OK);
    }
    ck_assert_int_gt(st[0].ops_deferred, 5);
    ck_assert_int_ge(st[0].graphs_compiled, 1);
    ck_assert_int_gt(st[0].kernels_compiled + st[0].kernels_loaded, 0);
    ck_assert_int_eq(st[1].graphs_compiled, st[0].graphs_compiled); /* all hits */
    ck_assert_int_gt(st[1].graph_hits, st[0].graph_hits);
    /* a read mid-way, then more ops on its input */
    em_tensor *h = em_gelu_tanh(em_add_scalar(gin[0], 0.5));
    ck_assert_ptr_nonnull(h);
    em_tensor *hc = em_gelu_tanh(em_add_scalar(cin[0], 0.5));
    same(h, hc, 1e-5, 1e-6); /* reads h's values: computes its graph */
    em_tensor *late = em_mul(h, em_sigmoid(h));
    ck_assert_int_eq(em_lazy_end(), EM_OK);
    same(late, em_mul(hc, em_sigmoid(hc)), 1e-5, 1e-6); /* after lazy mode ended */
    ck_assert_int_eq(em_lazy_get_stats(&st[2]), EM_OK);
    ck_assert_int_gt(st[2].flushes, st[1].flushes);
}
END_TEST

/* ---- the kernel cache across processes ---- */

static const char *self_path;

/* The child: compiles and runs the mlp once; prints its counters.  It
 * runs outside Check's runner, so it reports failures itself. */
static int cache_child(void) {
    em_scope_begin();
    const int64_t sizes[5][2] = {{8, 16}, {16, 24}, {24, 0}, {24, 16}, {16, 0}};
    em_tensor *in[5];
    for (int i = 0; i < 5; i++) {
        int nd = sizes[i][1] ? 2 : 1;
        int64_t n = sizes[i][0] * (nd == 2 ? sizes[i][1] : 1);
        float *v = malloc(sizeof(float) * (size_t)n);
        for (int64_t j = 0; j < n; j++) v[j] = (float)((j * 7 + i) % 13) / 13.0f - 0.5f;
        in[i] = em_from_data(v, EM_F32, nd, sizes[i], GPU);
        free(v);
        if (!in[i]) {
            printf("error %s\n", em_last_error());
            return 1;
        }
    }
    em_tensor *out[1];
    em_compile_options o = {.ninputs = 5, .noutputs = 1};
    em_compiled *f = em_compile(wl_mlp_fn, NULL, &o);
    if (!f || em_call(f, in, NULL, out) != EM_OK) {
        printf("error %s\n", em_last_error());
        return 1;
    }
    em_compile_stats st;
    em_compiled_stats(f, &st);
    printf("compiled %lld loaded %lld kernels %d\n", (long long)st.kernels_compiled,
           (long long)st.kernels_loaded, st.kernels);
    em_compiled_free(f);
    em_scope_end();
    return 0;
}

static void run_child(long long *compiled, long long *loaded) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "'%s' --cache-child 2>&1", self_path);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    char all[2048] = "";
    size_t n = fread(all, 1, sizeof all - 1, p);
    all[n] = '\0';
    int status = pclose(p);
    int kernels = 0;
    const char *line = strstr(all, "compiled ");
    ck_assert_msg(status == 0 && line &&
                      sscanf(line, "compiled %lld loaded %lld kernels %d", compiled, loaded, &kernels) == 3,
                  "child (status %d) said: %s", status, all);
    ck_assert_int_gt(kernels, 0);
}

START_TEST(second_process_compiles_nothing) {
    char dir[] = "/tmp/ember-cuda-cache-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    setenv("EMBER_CACHE_DIR", dir, 1);
    long long c1, l1, c2, l2;
    run_child(&c1, &l1);
    run_child(&c2, &l2);
    ck_assert_msg(c1 > 0, "first process compiled %lld", c1);
    ck_assert_msg(c2 == 0 && l2 == c1 + l1, "second process: compiled %lld loaded %lld", c2, l2);
    char rm[200];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(rm), 0);
}
END_TEST


/* ---- a cubin filed under another kernel's key (issue 21, item 3) ---- */

/* The child: exp and tanh of the same tensor on cuda:0 (two eager
 * kernels of one signature), checked against float64; prints "ok". */
static int swap_child(void) {
    em_scope_begin();
    enum { N = 1000 };
    float v[N], ha[N], hb[N];
    for (int i = 0; i < N; i++) v[i] = (float)(i % 41) / 20.0f - 1.0f;
    em_tensor *x = em_from_data(v, EM_F32, 1, (const int64_t[]){N}, GPU);
    em_tensor *a = em_exp(x), *b = em_tanh(x);
    if (!a || !b || em_copy_to_host(a, ha, sizeof ha) != EM_OK ||
        em_copy_to_host(b, hb, sizeof hb) != EM_OK) {
        printf("error %s\n", em_last_error());
        return 1;
    }
    for (int i = 0; i < N; i++) {
        double ea = exp((double)v[i]), eb = tanh((double)v[i]);
        if (fabs(ha[i] - ea) > 1e-5 * (1 + fabs(ea)) || fabs(hb[i] - eb) > 1e-5) {
            printf("wrong values at %d: exp %g (want %g), tanh %g (want %g)\n", i, ha[i], ea, hb[i], eb);
            return 1;
        }
    }
    printf("ok\n");
    em_scope_end();
    return 0;
}

static void run_swap_child(void) {
    char cmd[4200], all[2048] = "";
    snprintf(cmd, sizeof cmd, "'%s' --swap-child 2>&1", self_path);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(all, 1, sizeof all - 1, p);
    all[n] = '\0';
    int status = pclose(p);
    ck_assert_msg(status == 0 && strstr(all, "ok\n"), "child (status %d) said: %s", status, all);
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    char *buf = malloc(1 << 22);
    *n = fread(buf, 1, 1 << 22, f);
    fclose(f);
    return buf;
}

/* Writes path's payload and a header that fits it (re-forged). */
static void put_forged(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    fclose(f);
    const char *base = strrchr(path, '/') + 1, *dot = strchr(base, '.');
    char hex[KC_KEY_HEX_SIZE], meta[4200], text[KC_META_MAX];
    snprintf(hex, sizeof hex, "%.32s", base);
    kc_meta m = {.version = KC_FORMAT_VERSION, .size = n, .created = 1764547200};
    ck_assert(kc_key_from_hex(hex, &m.key));
    snprintf(m.kind, sizeof m.kind, "%s", dot + 1);
    m.sum = kc_checksum(data, n);
    snprintf(meta, sizeof meta, "%s.meta", path);
    f = fopen(meta, "wb");
    ck_assert_ptr_nonnull(f);
    size_t tn = kc_meta_format(&m, text);
    ck_assert_uint_eq(fwrite(text, 1, tn, f), tn);
    fclose(f);
    chmod(path, 0600);
    chmod(meta, 0600);
}

/* Every pair of cached cubins swapped under re-forged headers: each image
 * carries its own key (a __constant__ read back with cuModuleGetGlobal),
 * so a swapped one is a miss, compiled again, and the values stay right. */
START_TEST(swapped_cubins_are_misses) {
    char dir[] = "/tmp/ember-cuda-swap-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    setenv("EMBER_CACHE_DIR", dir, 1);
    run_swap_child();
    char cmd[300], paths[16][300];
    snprintf(cmd, sizeof cmd, "ls %s/v1/*/*.cubin %s/v1/*/*.ptx 2>/dev/null", dir, dir);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    int n = 0;
    while (n < 16 && fgets(paths[n], 300, p)) paths[n][strcspn(paths[n], "\n")] = '\0', n++;
    pclose(p);
    ck_assert_int_ge(n, 2);
    for (int i = 0; i < n; i++) {
        for (int j = i + 1; j < n; j++) {
            size_t na, nb;
            char *a = slurp(paths[i], &na), *b = slurp(paths[j], &nb);
            put_forged(paths[i], b, nb);
            put_forged(paths[j], a, na);
            free(a);
            free(b);
            run_swap_child();
        }
    }
    char rm[200];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(rm), 0);
}
END_TEST


/* ---- one engine: the GPU gets the CPU's plan cache, warmup and dynamic
 * shapes (issue 13) ---- */

/* The child: the mlp workload on cuda:0, checked against the CPU eager
 * result on the same values; prints its counters.  With EMBER_RECORD set
 * (em_compile reads it), its entry is recorded. */
/* Deterministic values in [-0.5, 0.5) on dev, without Check (whose
 * asserts cannot run outside its runner, even when they pass). */
static em_tensor *child_tensor(int seed, int nd, const int64_t *sizes, em_device dev) {
    int64_t n = nd == 2 ? sizes[0] * sizes[1] : sizes[0];
    float *v = malloc(sizeof(float) * (size_t)n);
    for (int64_t j = 0; j < n; j++) v[j] = (float)((j * 7 + seed * 3) % 17) / 17.0f - 0.5f;
    em_tensor *t = v ? em_from_data(v, EM_F32, nd, sizes, dev) : NULL;
    free(v);
    return t;
}

static int warm_child(void) {
    em_scope_begin();
    const int64_t x[] = {8, 16}, w1[] = {16, 24}, b1[] = {24}, w2[] = {24, 16}, b2[] = {16};
    const int64_t *sizes[5] = {x, w1, b1, w2, b2};
    const int nd[5] = {2, 2, 1, 2, 1};
    em_tensor *cpu[5], *gpu[5];
    for (int i = 0; i < 5; i++) {
        cpu[i] = child_tensor(i, nd[i], sizes[i], CPU);
        gpu[i] = child_tensor(i, nd[i], sizes[i], GPU);
        if (!cpu[i] || !gpu[i]) {
            printf("error %s\n", em_last_error());
            return 1;
        }
    }
    em_tensor *out[1];
    em_compile_options o = {.ninputs = 5, .noutputs = 1, .name = "mlp"};
    em_compiled *f = em_compile(wl_mlp_fn, NULL, &o);
    if (!f || em_call(f, gpu, NULL, out) != EM_OK) {
        printf("error %s\n", em_last_error());
        return 1;
    }
    em_tensor *ref = wl_mlp(cpu);
    double worst = 0;
    float rv[8 * 16], gv[8 * 16];
    if (!ref || em_copy_to_host(ref, rv, sizeof rv) != EM_OK ||
        em_copy_to_host(out[0], gv, sizeof gv) != EM_OK) {
        printf("error %s\n", em_last_error());
        return 1;
    }
    for (int i = 0; i < 8 * 16; i++) {
        double e = fabs((double)gv[i] - rv[i]) / (1e-4 + fabs((double)rv[i]));
        if (e > worst) worst = e;
    }
    em_compile_stats st;
    em_compiled_stats(f, &st);
    printf("compiled %lld loaded %lld lowered %lld plans %lld values %s\n",
           (long long)st.kernels_compiled, (long long)st.kernels_loaded,
           (long long)st.graphs_lowered, (long long)st.graphs_loaded, worst < 1e-3 ? "ok" : "bad");
    em_compiled_free(f);
    em_scope_end();
    return 0;
}

typedef struct warm_counts {
    long long compiled, loaded, lowered, plans;
    bool values_ok;
} warm_counts;

static warm_counts run_warm_child(const char *cache, const char *record) {
    char cmd[4200], all[2048] = "", ok[8] = "";
    snprintf(cmd, sizeof cmd, "EMBER_CACHE_DIR='%s' %s%s%s '%s' --warm-child 2>&1", cache,
             record ? "EMBER_RECORD='" : "", record ? record : "", record ? "'" : "", self_path);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(all, 1, sizeof all - 1, p);
    all[n] = '\0';
    int status = pclose(p);
    warm_counts c = {0};
    const char *line = strstr(all, "compiled ");
    ck_assert_msg(status == 0 && line &&
                      sscanf(line, "compiled %lld loaded %lld lowered %lld plans %lld values %7s",
                             &c.compiled, &c.loaded, &c.lowered, &c.plans, ok) == 5,
                  "child (status %d) said: %s", status, all);
    c.values_ok = !strcmp(ok, "ok");
    return c;
}


static void temp_dir(char *buf, size_t n, const char *what) {
    snprintf(buf, n, "/tmp/ember-cuda-%s-XXXXXX", what);
    ck_assert_ptr_nonnull(mkdtemp(buf));
}

static void remove_dir(const char *dir) {
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(rm), 0);
}

/* record -> ember-cache warmup into a fresh directory -> export -> import
 * into another -> a new process there: nothing compiled, nothing lowered,
 * the plan from the cache, values right. */
START_TEST(warmup_round_trip_on_the_gpu) {
    char a[64], b[64], c[64], rec[128], args[600], text[4096];
    temp_dir(a, sizeof a, "rec");
    temp_dir(b, sizeof b, "warm");
    temp_dir(c, sizeof c, "fleet");
    snprintf(rec, sizeof rec, "%s/warm.list", a);
    warm_counts first = run_warm_child(a, rec);
    ck_assert(first.values_ok);
    ck_assert_int_gt(first.compiled, 0);
    ck_assert_int_gt(first.lowered, 0);
    snprintf(args, sizeof args, "--dir '%s' warmup '%s'", b, rec);
    ck_assert_msg(tu_tool(text, sizeof text, "%s", args) == 0, "warmup: %s", text);
    ck_assert_msg(strstr(text, "1 compiled"), "warmup: %s", text);
    snprintf(args, sizeof args, "--dir '%s' export '%s/b.bundle'", b, a);
    ck_assert_msg(tu_tool(text, sizeof text, "%s", args) == 0, "export: %s", text);
    snprintf(args, sizeof args, "--dir '%s' import '%s/b.bundle'", c, a);
    ck_assert_msg(tu_tool(text, sizeof text, "%s", args) == 0, "import: %s", text);
    warm_counts fleet = run_warm_child(c, NULL);
    ck_assert(fleet.values_ok);
    ck_assert_int_eq(fleet.compiled, 0);
    ck_assert_int_eq(fleet.lowered, 0);
    ck_assert_int_eq(fleet.plans, 1);
    ck_assert_int_eq(fleet.loaded, first.compiled + first.loaded);
    remove_dir(a), remove_dir(b), remove_dir(c);
}
END_TEST

/* ember-cache --target sm_80 compiles CUDA records with NVRTC alone (no
 * use of this GPU), and its bundle is refused here, by a message naming
 * both GPUs' targets; this GPU's own import of it is refused too. */
START_TEST(a_bundle_for_another_gpu_is_refused) {
    char a[64], b[64], c[64], rec[128], args[600], text[4096];
    temp_dir(a, sizeof a, "rec");
    temp_dir(b, sizeof b, "sm80");
    temp_dir(c, sizeof c, "here");
    snprintf(rec, sizeof rec, "%s/warm.list", a);
    ck_assert(run_warm_child(a, rec).values_ok);
    snprintf(args, sizeof args, "--dir '%s' --target sm_80 warmup '%s'", b, rec);
    ck_assert_msg(tu_tool(text, sizeof text, "%s", args) == 0, "warmup --target: %s", text);
    ck_assert_msg(strstr(text, "1 compiled"), "warmup --target: %s", text);
    snprintf(args, sizeof args, "--dir '%s' --target sm_80 export '%s/b.bundle'", b, a);
    ck_assert_msg(tu_tool(text, sizeof text, "%s", args) == 0, "export: %s", text);
    snprintf(args, sizeof args, "--dir '%s' import '%s/b.bundle'", c, a);
    ck_assert_int_eq(tu_tool(text, sizeof text, "%s", args), 1);
    ck_assert_msg(strstr(text, "cuda=sm_80") && strstr(text, "this machine has cuda=sm_"),
                  "import: %s", text);
    /* named explicitly, the same target is accepted */
    snprintf(args, sizeof args, "--dir '%s' --target sm_80 import '%s/b.bundle'", c, a);
    ck_assert_msg(tu_tool(text, sizeof text, "%s", args) == 0, "import --target: %s", text);
    remove_dir(a), remove_dir(b), remove_dir(c);
}
END_TEST

typedef struct gpu_mlp {
    em_tensor *w1, *b1, *w2, *b2;
} gpu_mlp;

/* relu(x @ w1 + b1) @ w2 + b2, weights captured through ctx */
static em_status gpu_mlp_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)s;
    const gpu_mlp *m = ctx;
    out[0] = em_add(em_matmul(em_relu(em_add(em_matmul(in[0], m->w1), m->b1)), m->w2), m->b2);
    return out[0] ? EM_OK : em_last_status();
}

/* Ten batch sizes of a GPU MLP: two compiles (the first static, the
 * second dynamic in the batch), eight calls served by the dynamic entry
 * with its kernels' size arguments; values against the CPU eager MLP. */
START_TEST(ten_batch_sizes_on_the_gpu_compile_twice) {
    gpu_mlp cm = {tu_random(1, 2, (int64_t[]){16, 24}, EM_F32, 1), tu_random(2, 1, (int64_t[]){24}, EM_F32, 1),
                  tu_random(3, 2, (int64_t[]){24, 16}, EM_F32, 1), tu_random(4, 1, (int64_t[]){16}, EM_F32, 1)};
    gpu_mlp gm = {to_gpu(cm.w1), to_gpu(cm.b1), to_gpu(cm.w2), to_gpu(cm.b2)};
    em_compile_options o = {.ninputs = 1, .noutputs = 1, .name = "gpu_mlp"};
    em_compiled *f = em_compile(gpu_mlp_fn, &gm, &o);
    ck_assert_ptr_nonnull(f);
    long long after_second = -1;
    for (int64_t b = 2; b <= 11; b++) {
        em_tensor *x = tu_random((uint64_t)(10 + b), 2, (int64_t[]){b, 16}, EM_F32, 1), *gx = to_gpu(x), *y;
        ck_assert_msg(em_call(f, &gx, NULL, &y) == EM_OK, "%s", em_last_error());
        em_tensor *ref;
        ck_assert_int_eq(gpu_mlp_fn(&cm, &x, NULL, &ref), EM_OK);
        same(y, ref, 1e-4, 1e-5);
        em_compile_stats st;
        em_compiled_stats(f, &st);
        if (b == 3) after_second = st.kernels_compiled + st.kernels_loaded;
    }
    em_compile_stats st;
    ck_assert_int_eq(em_compiled_stats(f, &st), EM_OK);
    ck_assert_int_eq(st.traces, 2);
    ck_assert_int_eq(st.entries, 2);
    ck_assert_int_eq(st.dynamic_entries, 1);
    ck_assert_int_eq(st.hits, 8);
    ck_assert_int_eq(st.eager, 0);
    ck_assert_int_gt(st.kernels, 0); /* the dynamic entry runs GPU kernels */
    ck_assert_int_eq(st.kernels_compiled + st.kernels_loaded, after_second);
    em_compiled_free(f);
}
END_TEST

/* ---- native kernels (cuda_native.c): cat, index_select, arange, rand,
 * randn, argmax as generated CUDA C, against the CPU's results ---- */

static const em_dtype all_dtypes[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_BOOL, EM_F16, EM_BF16};
#define NDTYPES (int)(sizeof all_dtypes / sizeof all_dtypes[0])

/* Asserts that the GPU result g has the CPU result c's dtype, sizes and
 * bytes (both read densely). */
#define same_bits(g, c) same_bits_at(__FILE__, __LINE__, (g), (c))
static void same_bits_at(const char *file, int line, const em_tensor *g, const em_tensor *c) {
    ck_assert_msg(g != NULL, "%s:%d: GPU op failed: %s", file, line, em_last_error());
    ck_assert_msg(c != NULL, "%s:%d: CPU op failed: %s", file, line, em_last_error());
    ck_assert_msg(em_device_of(g).type == EM_CUDA, "%s:%d: result not on CUDA", file, line);
    ck_assert_msg(em_dtype_of(g) == em_dtype_of(c), "%s:%d: dtype %s, expected %s", file, line,
                  em_dtype_name(em_dtype_of(g)), em_dtype_name(em_dtype_of(c)));
    ck_assert_int_eq(em_ndim(g), em_ndim(c));
    for (int i = 0; i < em_ndim(c); i++) ck_assert_int_eq(em_size(g, i), em_size(c, i));
    size_t es = em_dtype_size(em_dtype_of(c)), n = (size_t)em_numel(c) * es;
    unsigned char *a = malloc(n + 1), *b = malloc(n + 1);
    ck_assert_msg(em_copy_to_host(g, a, n) == EM_OK, "%s:%d: %s", file, line, em_last_error());
    ck_assert_msg(em_copy_to_host(c, b, n) == EM_OK, "%s:%d: %s", file, line, em_last_error());
    for (size_t i = 0; i < n; i += es)
        if (memcmp(a + i, b + i, es)) {
            double x = tu_decode(a + i, em_dtype_of(c)), y = tu_decode(b + i, em_dtype_of(c));
            free(a), free(b);
            ck_abort_msg("%s:%d: element %zu is %.17g, expected %.17g (bits differ)", file, line,
                         i / es, x, y);
        }
    free(a), free(b);
}

/* ---- f16 and bf16 on the GPU (issue 15): computed in f32, rounded to
 * nearest even on store as on the CPU; results within a rounding of the
 * CPU's (the two libm's transcendentals differ by a few f32 ulp, which a
 * half rounding hides but at a tie), conversions bit for bit ---- */

/* f32 values every conversion corner needs: NaN, infinities, the half
 * types' max and overflow, their subnormals and below, ties to even. */
static em_tensor *conversion_corners(void) {
    const float v[] = {NAN, -NAN, INFINITY, -INFINITY, 65504.0f, 65520.0f, 65519.0f, -70000.0f,
                       0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-14f, 0x1.ffcp-15f, 3e-39f, -0.0f,
                       1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 1.0f + 0x1p-8f, 1.0f + 0x3p-8f,
                       3.4028235e38f, 1.17549435e-38f, 0.1f, -2.5f, 1e-3f};
    return em_from_data(v, EM_F32, 1, TU_SIZES((int64_t)(sizeof v / sizeof v[0])), CPU);
}

START_TEST(half_ops_on_the_gpu) {
    em_dtype hs[] = {EM_F16, EM_BF16};
    unary_fn fs[] = {em_neg, em_abs, em_exp, em_log, em_sqrt, em_tanh, em_sigmoid, em_relu, em_gelu};
    for (int h = 0; h < 2; h++) {
        double rt = hs[h] == EM_F16 ? 2e-3 : 1.6e-2; /* two ulp of the format */
        em_tensor *corner = conversion_corners();
        same_bits_at(__FILE__, __LINE__, em_cast(to_gpu(corner), hs[h]), em_cast(corner, hs[h]));
        em_tensor *ch = em_cast(corner, hs[h]);
        same_bits_at(__FILE__, __LINE__, em_cast(to_gpu(ch), EM_F32), em_cast(ch, EM_F32));
        em_tensor *f64 = em_mul_scalar(tu_random(40, 1, TU_SIZES(301), EM_F64, 1), 3e4);
        same_bits_at(__FILE__, __LINE__, em_cast(to_gpu(f64), hs[h]), em_cast(f64, hs[h]));
        em_tensor *x = em_cast(em_add_scalar(tu_random(41, 2, TU_SIZES(7, 129), EM_F32, 2), 2.5), hs[h]);
        em_tensor *y = em_cast(tu_random(42, 1, TU_SIZES(129), EM_F32, 2), hs[h]);
        em_tensor *gx = to_gpu(x), *gy = to_gpu(y);
        for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) same(fs[i](gx), fs[i](x), rt, 1e-3);
        same(em_add(gx, gy), em_add(x, y), 0, 0); /* one rounding of an exact f32 sum */
        same(em_mul(gx, gy), em_mul(x, y), 0, 0);
        same(em_div(gx, gy), em_div(x, y), 0, 0);
        same(em_maximum(em_transpose(gx, 0, 1), em_slice(em_transpose(gx, 0, 1), 1, 0, 1, 1)),
             em_maximum(em_transpose(x, 0, 1), em_slice(em_transpose(x, 0, 1), 1, 0, 1, 1)), 0, 0);
        same(em_sum(gx, 1, (int[]){-1}, false), em_sum(x, 1, (int[]){-1}, false), rt, 1e-2);
        same(em_mean(gx, 1, (int[]){0}, true), em_mean(x, 1, (int[]){0}, true), rt, 1e-3);
        same(em_amax(gx, 1, (int[]){-1}, false), em_amax(x, 1, (int[]){-1}, false), 0, 0);
        same(em_softmax(gx, -1), em_softmax(x, -1), rt, 1e-4);
        em_tensor *w = em_cast(tu_random(43, 1, TU_SIZES(129), EM_F32, 1), hs[h]);
        same(em_layer_norm(gx, 1, to_gpu(w), to_gpu(w), 1e-5), em_layer_norm(x, 1, w, w, 1e-5), 2 * rt, 2e-2);
        /* matmul on tensor cores, f32 accumulation: within K roundings of
         * the inputs' products, like the CPU's f32 path */
        em_tensor *a = em_cast(tu_random(44, 3, TU_SIZES(2, 33, 70), EM_F32, 1), hs[h]);
        em_tensor *b = em_cast(tu_random(45, 2, TU_SIZES(70, 45), EM_F32, 1), hs[h]);
        same(em_matmul(to_gpu(a), to_gpu(b)), em_matmul(a, b), rt, 2e-2);
        same(em_matmul(to_gpu(a), em_transpose(to_gpu(em_contiguous(em_transpose(b, 0, 1))), 0, 1)),
             em_matmul(a, b), rt, 2e-2);
        em_tensor *z = em_cast(em_full(1, TU_SIZES(0), 1.0, EM_F32, CPU), hs[h]);
        same(em_exp(to_gpu(z)), em_exp(z), 0, 0); /* size 0 */
    }
}
END_TEST

/* A compiled bf16 block on the GPU: fused half kernels and bf16 matmuls,
 * against the CPU's eager bf16 run. */
START_TEST(compiled_half_graphs) {
    em_dtype hs[] = {EM_F16, EM_BF16};
    for (int h = 0; h < 2; h++) {
        em_tensor *bin[3] = {em_cast(tu_random(30, 2, TU_SIZES(24, 48), EM_F32, 1), hs[h]),
                             em_cast(tu_random(31, 1, TU_SIZES(48), EM_F32, 1), hs[h]),
                             em_cast(tu_random(32, 1, TU_SIZES(48), EM_F32, 1), hs[h])};
        check_compiled(block_fn, 3, bin, 2, NULL, hs[h] == EM_F16 ? 1e-2 : 5e-2);
    }
}
END_TEST

/* ---- tiled transposes (cuda_emit.c's tiled kernels) ---- */

static em_status transpose_add_fn(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    out[0] = em_add(em_transpose(in[0], -2, -1), in[1]);
    return out[0] ? EM_OK : em_last_status();
}

/* transpose(x, -2, -1) + y in float64, for x [N, B, A] (or [B, A]) and y
 * broadcasting to [N, A, B] from [.., A or 1, B or 1]. */
static double *transpose_add_ref(const em_tensor *x, const em_tensor *y, int64_t *n_out) {
    int xd = em_ndim(x), yd = em_ndim(y);
    const int64_t *xs = em_sizes(x), *ys = em_sizes(y);
    int64_t N = xd == 3 ? xs[0] : 1, B = xs[xd - 2], A = xs[xd - 1];
    int64_t yN = yd == 3 ? ys[0] : 1, yA = yd >= 2 ? ys[yd - 2] : 1, yB = ys[yd - 1];
    double *xv = tu_values(x), *yv = tu_values(y), *r = malloc(sizeof(double) * (size_t)(N * A * B + 1));
    for (int64_t n = 0; n < N; n++)
        for (int64_t a = 0; a < A; a++)
            for (int64_t b = 0; b < B; b++)
                r[(n * A + a) * B + b] = xv[(n * B + b) * A + a] +
                    yv[((yN > 1 ? n : 0) * yA + (yA > 1 ? a : 0)) * yB + (yB > 1 ? b : 0)];
    free(xv), free(yv);
    *n_out = N * A * B;
    return r;
}

/* em_compile'd transpose_add on cuda:0, called 3 times, against float64. */
static void check_transpose_add(em_tensor *x, em_tensor *y, double tol) {
    em_tensor *in[2] = {to_gpu(x), to_gpu(y)}, *out = NULL;
    em_compile_options o = {.ninputs = 2, .noutputs = 1, .name = "tadd"};
    em_compiled *f = em_compile(transpose_add_fn, NULL, &o);
    ck_assert_ptr_nonnull(f);
    int64_t n;
    double *ref = transpose_add_ref(x, y, &n);
    for (int rep = 0; rep < 3; rep++) {
        ck_assert_msg(em_call(f, in, NULL, &out) == EM_OK, "%s", em_last_error());
        ck_assert_int_eq(em_numel(out), n);
        tu_check_close_at(__FILE__, __LINE__, out, ref, em_ndim(out), em_sizes(out), tol, tol);
    }
    free(ref);
    em_compiled_free(f);
}

/* Sizes that are and are not multiples of the 32 x 32 tile, a size-1 and
 * a size-0 dim, a batch dim, operands broadcast along either dim, f64 and
 * bf16; then one function over five sizes (a dynamic entry: the tile
 * counts from size arguments). */
START_TEST(transposed_operands_on_the_gpu) {
    static const int64_t sz[][2] = {{64, 96}, {45, 37}, {1, 77}, {77, 1}, {0, 5}, {129, 33}};
    for (size_t i = 0; i < sizeof sz / sizeof sz[0]; i++) {
        int64_t B = sz[i][0], A = sz[i][1];
        check_transpose_add(tu_random(40 + i, 2, (int64_t[]){B, A}, EM_F32, 1),
                            tu_random(50 + i, 2, (int64_t[]){A, B}, EM_F32, 1), 2e-6);
    }
    check_transpose_add(tu_random(60, 3, TU_SIZES(3, 70, 33), EM_F32, 1),
                        tu_random(61, 1, TU_SIZES(70), EM_F32, 1), 2e-6);
    check_transpose_add(tu_random(62, 3, TU_SIZES(2, 40, 65), EM_F32, 1),
                        tu_random(63, 2, TU_SIZES(65, 1), EM_F32, 1), 2e-6);
    check_transpose_add(tu_random(64, 3, TU_SIZES(2, 50, 35), EM_F64, 1),
                        tu_random(65, 3, TU_SIZES(2, 35, 50), EM_F64, 1), 1e-12);
    check_transpose_add(em_cast(tu_random(66, 3, TU_SIZES(3, 33, 70), EM_F32, 1), EM_BF16),
                        em_cast(tu_random(67, 2, TU_SIZES(1, 33), EM_F32, 1), EM_BF16), 1e-2);
    em_compile_options o = {.ninputs = 2, .noutputs = 1, .name = "tadd_dyn"};
    em_compiled *f = em_compile(transpose_add_fn, NULL, &o);
    for (int64_t n = 30; n <= 130; n += 25) {
        em_tensor *x = tu_random((uint64_t)n, 2, (int64_t[]){n, 2 * n + 1}, EM_F32, 1);
        em_tensor *y = tu_random((uint64_t)n + 1, 2, (int64_t[]){2 * n + 1, n}, EM_F32, 1);
        em_tensor *in[2] = {to_gpu(x), to_gpu(y)}, *out = NULL;
        ck_assert_msg(em_call(f, in, NULL, &out) == EM_OK, "%s", em_last_error());
        int64_t cnt;
        double *ref = transpose_add_ref(x, y, &cnt);
        tu_check_close_at(__FILE__, __LINE__, out, ref, em_ndim(out), em_sizes(out), 2e-6, 2e-6);
        free(ref);
    }
    em_compile_stats st;
    ck_assert_int_eq(em_compiled_stats(f, &st), EM_OK);
    ck_assert_int_eq(st.dynamic_entries, 1);
    ck_assert_int_gt(st.kernels, 0);
    em_compiled_free(f);
}
END_TEST

/* ---- rows kernels of every length (issues 14 and 15): short rows a
 * part of a warp each, 16-byte steps with a head and a tail for rows that
 * start off a vector boundary, long rows; checked against float64 ---- */

enum { ROW_SOFTMAX, ROW_RMS, ROW_SUM, ROW_LN, ROW_BIAS_GELU, ROW_LOGSM, ROW_KINDS };

static em_status rows_fn(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)s;
    em_tensor *x = in[0];
    switch (*(const int *)c) {
    case ROW_SOFTMAX: out[0] = em_softmax(x, -1); break;
    case ROW_RMS:
        out[0] = em_mul(em_mul(x, em_rsqrt(em_add_scalar(em_mean(em_mul(x, x), 1, (int[]){-1}, true), 1e-6))),
                        in[1]);
        break;
    case ROW_SUM: out[0] = em_sum(x, 1, (int[]){-1}, false); break;
    case ROW_LN: out[0] = em_layer_norm(x, 1, in[1], in[2], 1e-5); break;
    case ROW_LOGSM: out[0] = em_log_softmax(x, -1); break;
    default: out[0] = em_gelu_tanh(em_add(x, in[1])); break;
    }
    return out[0] ? EM_OK : em_last_status();
}

/* kind of x [R, C] (and w, b [C]) in float64, from the inputs' values. */
static double *rows_ref(int kind, const em_tensor *x, const em_tensor *w, const em_tensor *b) {
    int64_t R = em_size(x, 0), C = em_size(x, 1);
    double *xv = tu_values(x), *wv = tu_values(w), *bv = tu_values(b);
    double *r = malloc(sizeof(double) * (size_t)(R * C + R + 1)); /* rows, or a sum each */
    for (int64_t i = 0; i < R; i++) {
        const double *row = xv + i * C;
        double *o = r + i * C, m = -INFINITY, acc = 0, acc2 = 0;
        for (int64_t j = 0; j < C; j++) m = fmax(m, row[j]), acc += row[j], acc2 += row[j] * row[j];
        double mean = C ? acc / C : 0, var = 0;
        for (int64_t j = 0; j < C; j++) var += (row[j] - mean) * (row[j] - mean);
        var = C ? var / C : 0;
        double se = 0;
        for (int64_t j = 0; j < C; j++) se += exp(row[j] - m);
        for (int64_t j = 0; j < C; j++) {
            double v = row[j], u = v + wv[j];
            if (kind == ROW_SOFTMAX) o[j] = exp(v - m) / se;
            if (kind == ROW_LOGSM) o[j] = v - m - log(se);
            if (kind == ROW_RMS) o[j] = v / sqrt(acc2 / C + 1e-6) * wv[j];
            if (kind == ROW_LN) o[j] = (v - mean) / sqrt(var + 1e-5) * wv[j] + bv[j];
            if (kind == ROW_BIAS_GELU) o[j] = 0.5 * u * (1 + tanh(sqrt(2 / M_PI) * (u + 0.044715 * u * u * u)));
        }
        if (kind == ROW_SUM) r[i] = acc;
    }
    free(xv), free(wv), free(bv);
    return r;
}

/* kind compiled on cuda:0 for x (a GPU tensor, any layout) against
 * float64 on x's values; x also as the view x_cpu on the CPU side. */
static void check_rows(int kind, em_tensor *xg, em_tensor *xc, em_dtype d, double tol) {
    int64_t C = em_size(xc, 1);
    em_tensor *wc = em_cast(tu_random(71, 1, &C, EM_F32, 1), d), *bc = em_cast(tu_random(72, 1, &C, EM_F32, 1), d);
    em_tensor *in[3] = {xg, to_gpu(wc), to_gpu(bc)}, *out = NULL;
    int nin = kind == ROW_LN ? 3 : kind == ROW_RMS || kind == ROW_BIAS_GELU ? 2 : 1;
    em_compile_options o = {.ninputs = nin, .noutputs = 1, .name = "rows"};
    em_compiled *f = em_compile(rows_fn, &kind, &o);
    ck_assert_ptr_nonnull(f);
    double *ref = rows_ref(kind, xc, wc, bc);
    int64_t osz[2] = {em_size(xc, 0), C};
    for (int rep = 0; rep < 2; rep++) {
        ck_assert_msg(em_call(f, in, NULL, &out) == EM_OK, "%s", em_last_error());
        ck_assert_msg(em_device_of(out).type == EM_CUDA, "result not on the GPU");
        tu_check_close_at(__FILE__, __LINE__, out, ref, kind == ROW_SUM ? 1 : 2, osz,
                          tol, kind == ROW_SUM ? tol * sqrt((double)C + 1) : tol);
    }
    free(ref);
    em_compiled_free(f);
}

/* Every kind on rows starting off 16-byte boundaries (a column slice of
 * x [sliced]: a view the kernel reads at an offset, or a copy), a
 * transposed (non-contiguous) x [transposed], a broadcast x ([1, C]
 * expanded to [expanded]). */
static void check_row_views(uint64_t seed, const int64_t *sliced, const int64_t *transposed,
                            const int64_t *expanded) {
    em_tensor *x = tu_random(seed, 2, sliced, EM_F32, 1);
    em_tensor *xs = em_slice(x, 1, 1, sliced[1], 1), *xgs = em_slice(to_gpu(x), 1, 1, sliced[1], 1);
    em_tensor *xt = tu_random(seed + 1, 2, transposed, EM_F32, 1);
    em_tensor *xe = em_expand(tu_random(seed + 2, 2, TU_SIZES(1, expanded[1]), EM_F32, 1), 2, expanded);
    for (int kind = 0; kind < ROW_KINDS; kind++) {
        check_rows(kind, xgs, xs, EM_F32, 2e-5);
        check_rows(kind, em_transpose(to_gpu(xt), 0, 1), em_transpose(xt, 0, 1), EM_F32, 2e-5);
        check_rows(kind, em_expand(to_gpu(em_slice(xe, 0, 0, 1, 1)), 2, expanded), xe, EM_F32, 2e-5);
    }
}

START_TEST(rows_kernels_on_the_gpu) {
    /* lengths under, at and over a vector, a warp's share and a block's;
     * row counts that fill no block evenly; size 0 and 1 */
    static const int64_t sz[][2] = {{1, 1},   {0, 7},   {5, 0},    {3, 2},    {130, 37}, {67, 8},
                                    {65, 64}, {9, 300}, {70, 1000}, {66, 1001}, {64, 4099},
                                    {65, 4096}, {64, 50257}};
    for (size_t i = 0; i < sizeof sz / sizeof sz[0]; i++)
        for (int kind = 0; kind < ROW_KINDS; kind++) {
            em_tensor *x = tu_random(80 + i, 2, sz[i], EM_F32, 1);
            check_rows(kind, to_gpu(x), x, EM_F32, 2e-5);
        }
    check_row_views(90, TU_SIZES(70, 1003), TU_SIZES(517, 66), TU_SIZES(65, 300));
    /* bf16: 8 halves a step; against float64 on the bf16 inputs (results
     * rounded to bf16, statistics in f32: 2^-8 relative) */
    static const int64_t hz[][2] = {{1, 1}, {130, 37}, {65, 64}, {70, 1000}, {64, 4099}, {65, 4096}};
    for (size_t i = 0; i < sizeof hz / sizeof hz[0]; i++)
        for (int kind = 0; kind < ROW_KINDS; kind++) {
            em_tensor *xh = em_cast(tu_random(100 + i, 2, hz[i], EM_F32, 1), EM_BF16);
            check_rows(kind, to_gpu(xh), xh, EM_BF16, 1.6e-2);
        }
}
END_TEST

/* Rows longer than one block keeps in registers run over thread-block
 * clusters on sm_90 (5 to 9 blocks a row: cuda_emit.c), every kind of rows
 * kernel against float64: odd lengths, 1 and 3 rows (whose reductions run
 * eagerly: the cluster kernel only broadcasts), 64 and more rows (one
 * fused kernel), a sliced (off a 16-byte boundary), a transposed and a
 * broadcast x, bf16 (50257: one block still; 100003, 262147: clusters). */
START_TEST(long_rows_over_clusters) {
    static const int64_t sz[][2] = {{1, 50257}, {3, 100003}, {256, 50257}, {65, 100003}, {64, 262147}};
    for (size_t i = 0; i < sizeof sz / sizeof sz[0]; i++)
        for (int kind = 0; kind < ROW_KINDS; kind++) {
            em_tensor *x = tu_random(110 + i, 2, sz[i], EM_F32, 1);
            check_rows(kind, to_gpu(x), x, EM_F32, 2e-5);
        }
}
END_TEST

START_TEST(long_row_views_and_bf16_over_clusters) {
    check_row_views(120, TU_SIZES(66, 50258), TU_SIZES(40000, 64), TU_SIZES(65, 100003));
    static const int64_t hz[][2] = {{64, 100003}, {3, 100003}, {65, 262147}, {64, 50257}};
    for (size_t i = 0; i < sizeof hz / sizeof hz[0]; i++)
        for (int kind = 0; kind < ROW_KINDS; kind++) {
            em_tensor *xh = em_cast(tu_random(130 + i, 2, hz[i], EM_F32, 1), EM_BF16);
            check_rows(kind, to_gpu(xh), xh, EM_BF16, 1.6e-2);
        }
}
END_TEST

/* Half kernels by bytes (cuda_emit.c): a thread of a half-typed row
 * longer than a warp's aims for 64 halves (8200: 128 threads of 8
 * vectors, a head and a tail in most rows); short rows; flat kernels at
 * lengths around their 4-element steps.  Both half formats against
 * float64 (rows) or the CPU (flat), and off 16-byte boundaries (a slice
 * from element 1: the one-element-a-thread kernel, its row re-read each
 * pass past 32 elements a thread). */
START_TEST(half_kernels_step_by_bytes) {
    static const em_dtype hs[] = {EM_BF16, EM_F16};
    static const int64_t rz[][2] = {{9, 37}, {33, 8200}};
    static const int64_t fz[] = {7, 1001};
    for (int h = 0; h < 2; h++) {
        double tol = hs[h] == EM_BF16 ? 1.6e-2 : 4e-3; /* two ulp, statistics in f32 */
        /* the fused flat kernel rounds once, the CPU's eager ops at each of
         * their 5 ops: compiled_half_graphs' tolerances */
        double ftol = hs[h] == EM_BF16 ? 5e-2 : 1e-2;
        for (size_t i = 0; i < sizeof rz / sizeof rz[0]; i++)
            for (int kind = 0; kind < ROW_KINDS; kind++) {
                em_tensor *xh = em_cast(tu_random(150 + i, 2, rz[i], EM_F32, 1), hs[h]);
                check_rows(kind, to_gpu(xh), xh, hs[h], tol);
                if (i == 0) continue;
                em_tensor *xs = em_slice(xh, 1, 1, rz[i][1], 1);
                check_rows(kind, em_slice(to_gpu(xh), 1, 1, rz[i][1], 1), xs, hs[h], tol);
            }
        for (size_t i = 0; i < sizeof fz / sizeof fz[0]; i++) {
            em_tensor *in[3];
            for (int k = 0; k < 3; k++) in[k] = em_cast(tu_random(160 + 3 * i + k, 1, &fz[i], EM_F32, 1), hs[h]);
            check_compiled(wl_pointwise_fn, 3, in, 1, NULL, ftol);
            int64_t n1 = fz[i] + 1; /* off a 16-byte boundary: a slice from element 1 */
            em_tensor *g[3], *c[3], *out = NULL;
            for (int k = 0; k < 3; k++) {
                em_tensor *x = em_cast(tu_random(170 + 3 * i + k, 1, &n1, EM_F32, 1), hs[h]);
                c[k] = em_slice(x, 0, 1, n1, 1);
                g[k] = em_slice(to_gpu(x), 0, 1, n1, 1);
            }
            em_compile_options o = {.ninputs = 3, .noutputs = 1, .name = "pw"};
            em_compiled *f = em_compile(wl_pointwise_fn, NULL, &o);
            ck_assert_ptr_nonnull(f);
            ck_assert_msg(em_call(f, g, NULL, &out) == EM_OK, "%s", em_last_error());
            same(out, wl_pointwise(c), ftol, ftol);
            em_compiled_free(f);
        }
    }
}
END_TEST

/* x on the GPU and on the CPU, permuted by perm (non-contiguous on both). */
static void permuted_pair(em_tensor *x, int nd, const int *perm, em_tensor **g, em_tensor **c) {
    *g = em_permute(to_gpu(x), nd, perm);
    *c = em_permute(x, nd, perm);
}

START_TEST(native_cat) {
    for (int t = 0; t < NDTYPES; t++) {
        em_dtype dt = all_dtypes[t];
        em_tensor *a = tu_random(40 + t, 3, TU_SIZES(3, 5, 7), dt, 3);
        em_tensor *b = tu_random(50 + t, 3, TU_SIZES(3, 5, 7), dt, 3);
        em_tensor *ga = to_gpu(a), *gb = to_gpu(b);
        for (int dim = 0; dim < 3; dim++) /* every dim, contiguous inputs */
            same_bits(em_cat(2, (em_tensor *[]){ga, gb}, dim), em_cat(2, (em_tensor *[]){a, b}, dim));
        /* non-contiguous inputs: a permuted [7, 5, 3], a stepped slice, an expand */
        em_tensor *gp, *cp;
        permuted_pair(tu_random(60 + t, 3, TU_SIZES(7, 5, 3), dt, 3), 3, (int[]){2, 1, 0}, &gp, &cp);
        em_tensor *gs = em_slice(ga, 2, 1, 7, 2), *cs = em_slice(a, 2, 1, 7, 2); /* [3, 5, 3] */
        em_tensor *ge = em_expand(em_slice(gb, 2, 0, 1, 1), 3, TU_SIZES(3, 5, 4));
        em_tensor *ce = em_expand(em_slice(b, 2, 0, 1, 1), 3, TU_SIZES(3, 5, 4));
        same_bits(em_cat(4, (em_tensor *[]){gp, gs, ge, ga}, 2), em_cat(4, (em_tensor *[]){cp, cs, ce, a}, 2));
        /* size-0 and size-1 inputs, a single input, a 1-d cat */
        em_tensor *z = em_slice(a, 1, 0, 0, 1), *gz = em_slice(ga, 1, 0, 0, 1);
        em_tensor *o = em_slice(a, 1, 2, 3, 1), *go = em_slice(ga, 1, 2, 3, 1);
        same_bits(em_cat(4, (em_tensor *[]){gz, go, ga, gz}, 1), em_cat(4, (em_tensor *[]){z, o, a, z}, 1));
        same_bits(em_cat(1, (em_tensor *[]){gs}, 0), em_cat(1, (em_tensor *[]){cs}, 0));
        em_tensor *v = tu_random(70 + t, 1, TU_SIZES(1001), dt, 3);
        same_bits(em_cat(3, (em_tensor *[]){to_gpu(v), to_gpu(v), to_gpu(v)}, 0),
                  em_cat(3, (em_tensor *[]){v, v, v}, 0));
    }
    /* an all-empty result: nothing to do */
    em_tensor *e = em_zeros(2, TU_SIZES(0, 4), EM_F32, GPU);
    em_tensor *r = em_cat(2, (em_tensor *[]){e, e}, 0);
    ck_assert_msg(r && em_numel(r) == 0, "%s", em_last_error());
}
END_TEST

START_TEST(native_index_select) {
    int64_t iv[7] = {4, 0, 4, 1, 3, 2, 0};
    int32_t iv32[14] = {2, 9, 0, 9, 1, 9, 3, 9, 3, 9, 0, 9, 4, 9};
    em_tensor *i64 = em_from_data(iv, EM_I64, 1, TU_SIZES(7), CPU);
    em_tensor *i32 = em_slice(em_from_data(iv32, EM_I32, 1, TU_SIZES(14), CPU), 0, 0, 14, 2);
    em_tensor *gi64 = to_gpu(i64);
    em_tensor *gi32 = em_slice(to_gpu(em_from_data(iv32, EM_I32, 1, TU_SIZES(14), CPU)), 0, 0, 14, 2);
    em_tensor *none = em_from_data(iv, EM_I64, 1, TU_SIZES(0), CPU), *gnone = to_gpu(none);
    em_tensor *one = em_scalar(3, EM_I32, CPU), *gone = to_gpu(one);
    for (int t = 0; t < NDTYPES; t++) {
        em_dtype dt = all_dtypes[t];
        em_tensor *x = tu_random(80 + t, 3, TU_SIZES(5, 5, 5), dt, 3), *gx = to_gpu(x);
        em_tensor *gp, *cp; /* non-contiguous x */
        permuted_pair(x, 3, (int[]){1, 2, 0}, &gp, &cp);
        for (int dim = 0; dim < 3; dim++) {
            same_bits(em_index_select(gx, dim, gi64), em_index_select(x, dim, i64));
            same_bits(em_index_select(gp, dim, gi32), em_index_select(cp, dim, i32));
            same_bits(em_index_select(gx, dim, gone), em_index_select(x, dim, one)); /* 0-d */
            same_bits(em_index_select(gp, dim, gnone), em_index_select(cp, dim, none)); /* size 0 */
        }
        em_tensor *table = tu_random(90 + t, 2, TU_SIZES(37, 3), dt, 3); /* odd sizes */
        int64_t ids[2 * 9];
        for (int k = 0; k < 18; k++) ids[k] = (k * 7 + 3) % 37;
        em_tensor *cid = em_from_data(ids, EM_I64, 2, TU_SIZES(2, 9), CPU);
        same_bits(em_embedding(to_gpu(table), to_gpu(cid)), em_embedding(table, cid));
    }
}
END_TEST

START_TEST(native_index_select_errors) {
    em_tensor *x = tu_random(100, 2, TU_SIZES(4, 6), EM_F32, 1), *gx = to_gpu(x);
    int64_t good[3] = {3, 0, 2}, bad[3] = {3, 4, 0}, neg[3] = {0, -2, 1};
    em_tensor *g_good = to_gpu(em_from_data(good, EM_I64, 1, TU_SIZES(3), CPU));
    em_tensor *g_bad = to_gpu(em_from_data(bad, EM_I64, 1, TU_SIZES(3), CPU));
    em_tensor *g_neg = to_gpu(em_from_data(neg, EM_I64, 1, TU_SIZES(3), CPU));
    int32_t bad32[2] = {1, 6};
    em_tensor *g_bad32 = to_gpu(em_from_data(bad32, EM_I32, 1, TU_SIZES(2), CPU));
    /* the CPU's message; the call after it is fine */
    expect_index_error(em_index_select(gx, 0, g_bad), "index 4 is out of range for dim 0 of size 4");
    same_bits(em_index_select(gx, 0, g_good), em_index_select(x, 0, em_from_data(good, EM_I64, 1, TU_SIZES(3), CPU)));
    expect_index_error(em_index_select(gx, 0, g_neg), "index -2 is out of range");
    expect_index_error(em_index_select(gx, 1, g_bad32), "index 6 is out of range for dim 1 of size 6");
    expect_index_error(em_embedding(gx, g_bad), "index 4 is out of range");
    /* several ops after the bad one: the error waits for the first
     * synchronization, which reports the first bad call's index */
    em_tensor *r1 = em_index_select(gx, 0, g_neg);
    em_tensor *r2 = em_index_select(gx, 0, g_bad);
    em_tensor *r3 = em_exp(r2);
    ck_assert_msg(r1 && r2 && r3, "%s", em_last_error());
    expect_index_error(r3, "index -2 is out of range");
    /* no read out of bounds: a table of 0 rows */
    em_tensor *empty = em_zeros(2, TU_SIZES(0, 6), EM_F32, GPU);
    expect_index_error(em_index_select(empty, 0, g_good), "out of range for dim 0 of size 0");
    /* em_item reports it too */
    double v;
    em_tensor *r = em_sum(em_index_select(gx, 0, g_bad), 0, NULL, false);
    ck_assert_msg(r != NULL, "%s", em_last_error());
    ck_assert_int_eq(em_item(r, &v), EM_ERR_INDEX);
    ck_assert_int_eq(em_item(r, &v), EM_OK);
}
END_TEST

/* index_copy_ on the GPU writes what the CPU's writes, bit for bit, into
 * a base and through a permuted view; a bad index writes nothing and is
 * reported at the next wait (issue 20: a KV cache written in place). */
START_TEST(native_index_copy) {
    int64_t iv[3] = {4, 0, 2};
    em_tensor *i64 = em_from_data(iv, EM_I64, 1, TU_SIZES(3), CPU), *gi64 = to_gpu(i64);
    em_tensor *one = em_scalar(1, EM_I32, CPU), *gone = to_gpu(one);
    for (int t = 0; t < NDTYPES; t++) {
        em_dtype dt = all_dtypes[t];
        for (int dim = 0; dim < 3; dim++) {
            em_tensor *x = tu_random(110 + t, 3, TU_SIZES(5, 5, 5), dt, 3), *gx = to_gpu(x);
            int64_t ss[3] = {5, 5, 5};
            ss[dim] = 3;
            em_tensor *src = tu_random(120 + t, 3, ss, dt, 3);
            ck_assert_int_eq(em_index_copy_(gx, dim, gi64, to_gpu(src)), EM_OK);
            ck_assert_int_eq(em_index_copy_(x, dim, i64, src), EM_OK);
            same_bits(gx, x);
            /* through a permuted view, from a transposed source, one slice */
            em_tensor *gp, *cp;
            permuted_pair(x, 3, (int[]){2, 0, 1}, &gp, &cp);
            ss[dim] = 1;
            em_tensor *s1 = em_transpose(tu_random(130 + t, 3, ss, dt, 3), 0, 2);
            int64_t ps[3];
            for (int d = 0; d < 3; d++) ps[d] = em_size(s1, d);
            int pd = -1; /* the permuted dim of size 1 */
            for (int d = 0; d < 3; d++)
                if (ps[d] == 1) pd = d;
            em_tensor *gs1 = em_transpose(to_gpu(em_transpose(s1, 0, 2)), 0, 2);
            ck_assert_int_eq(em_index_copy_(gp, pd, gone, gs1), EM_OK);
            ck_assert_int_eq(em_index_copy_(cp, pd, one, s1), EM_OK);
            same_bits(gp, cp);
        }
    }
    /* a bad index: reported, nothing of it written */
    em_tensor *x = tu_random(140, 2, TU_SIZES(4, 6), EM_F32, 1), *gx = to_gpu(x);
    int64_t bad[2] = {1, 4};
    em_tensor *src = tu_random(141, 2, TU_SIZES(2, 6), EM_F32, 1);
    ck_assert_int_eq(em_index_copy_(gx, 0, to_gpu(em_from_data(bad, EM_I64, 1, TU_SIZES(2), CPU)),
                                    to_gpu(src)), EM_OK);
    expect_index_error(gx, "index 4 is out of range for dim 0 of size 4");
    ck_assert_int_eq(em_index_copy_(x, 0, em_from_data((int64_t[]){1}, EM_I64, 1, TU_SIZES(1), CPU),
                                    em_slice(src, 0, 0, 1, 1)), EM_OK);
    same_bits(gx, x);
}
END_TEST

START_TEST(native_arange) {
    const double cases[][3] = {
        {0, 10, 0.1},     {-3.5, 7.25, 0.37}, {5, -5, -0.3},   {0, 1000003, 1}, {1, 2, 5},
        {0, 0, 1},        {-7, 9, 2},         {0.5, 100, 1.5}, {1e15, 1e15 + 40, 3}, {-2, 2, 0.25},
        {0, 4e9, 1e9},    {-5e9, 5e9, 2.5e9}, /* saturated on i32 */
        {0, 1.3e19, 4e18},                    /* 1.2e19 saturates i64 (the product overflows) */
        {-9e18, -1.9e19, -4e18},              /* and the sum */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int t = 0; t < NDTYPES; t++) {
            em_dtype dt = all_dtypes[t];
            const double *c = cases[k];
            same_bits(em_arange(c[0], c[1], c[2], dt, GPU), em_arange(c[0], c[1], c[2], dt, CPU));
        }
}
END_TEST

START_TEST(native_rand) {
    int64_t sizes[][2] = {{3, 1365}, {1, 1}, {0, 5}, {7, 0}, {1, 4099}};
    for (int k = 0; k < 5; k++)
        for (int d = 0; d < 2; d++) {
            em_dtype dt = d ? EM_F64 : EM_F32;
            em_generator *g1 = em_generator_new(1234 + k), *g2 = em_generator_new(1234 + k);
            for (int draw = 0; draw < 2; draw++) { /* the second from a nonzero offset */
                same_bits(em_rand(g1, 2, sizes[k], dt, GPU), em_rand(g2, 2, sizes[k], dt, CPU));
                /* Box-Muller through CUDA's logf/cosf (log/cos): a few ulp */
                same(em_randn(g1, 2, sizes[k], dt, GPU), em_randn(g2, 2, sizes[k], dt, CPU),
                     d ? 1e-14 : 4e-6, d ? 1e-15 : 1e-6);
            }
            ck_assert(em_generator_offset(g1) == em_generator_offset(g2));
            em_generator_free(g1);
            em_generator_free(g2);
        }
    em_generator *g = em_generator_new(5);
    tu_check_fails(em_rand(g, 1, TU_SIZES(4), EM_I32, GPU), EM_ERR_DTYPE);
    tu_check_fails(em_randn(g, 1, TU_SIZES(4), EM_F16, GPU), EM_ERR_DTYPE);
    em_generator_free(g);
}
END_TEST

/* x with NaNs written at a few places (floats; the first NaN of a row is
 * the answer). */
static em_tensor *with_nans(em_tensor *x) {
    int64_t n = em_numel(x);
    double *v = tu_values(x);
    for (int64_t i = 3; i < n; i += 29) v[i] = NAN;
    for (int64_t i = 4; i < n; i += 57) v[i] = NAN;
    em_tensor *r = tu_tensor(v, em_ndim(x), em_sizes(x), em_dtype_of(x));
    free(v);
    return r;
}

START_TEST(native_argmax) {
    const em_dtype dts[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_BOOL};
    for (int t = 0; t < 5; t++) {
        em_dtype dt = dts[t];
        bool fl = dt == EM_F32 || dt == EM_F64;
        /* small integer values: many ties, the first one must win */
        em_tensor *x = tu_random(110 + t, 3, TU_SIZES(7, 33, 5), dt, fl ? 3 : 1.5);
        em_tensor *sets[3] = {x, fl ? with_nans(x) : x, tu_random(120 + t, 3, TU_SIZES(1, 1, 5), dt, 2)};
        for (int s = 0; s < 3; s++) {
            em_tensor *c = sets[s], *g = to_gpu(c), *gp, *cp;
            permuted_pair(c, 3, (int[]){2, 0, 1}, &gp, &cp);
            for (int dim = 0; dim < 3; dim++)
                for (int keep = 0; keep < 2; keep++) {
                    same_bits(em_argmax(g, dim, keep), em_argmax(c, dim, keep));
                    same_bits(em_argmax(gp, dim, keep), em_argmax(cp, dim, keep));
                }
        }
        /* long rows, few of them (lanes stride 32 apart) and a 0-d input */
        em_tensor *l = tu_random(130 + t, 2, TU_SIZES(3, 5001), dt, fl ? 3 : 1.5);
        same_bits(em_argmax(to_gpu(l), 1, false), em_argmax(l, 1, false));
        same_bits(em_argmax(em_slice(to_gpu(l), 1, 7, 5001, 3), 1, true), em_argmax(em_slice(l, 1, 7, 5001, 3), 1, true));
        /* a vocabulary's row, split in chunks across blocks: ties across
         * chunks (the first wins), NaNs, one row and two */
        em_tensor *v = tu_random(135 + t, 2, TU_SIZES(2, 50257), dt, fl ? 3 : 1.5);
        double *late = tu_values(v);
        late[50257 + 40000] = fl ? NAN : late[50257 + 40000]; /* one NaN, in a late chunk of row 1 */
        em_tensor *vs[3] = {v, fl ? with_nans(v) : v, tu_tensor(late, 2, TU_SIZES(2, 50257), dt)};
        free(late);
        for (int k = 0; k < 3; k++) {
            same_bits(em_argmax(to_gpu(vs[k]), 1, false), em_argmax(vs[k], 1, false));
            same_bits(em_argmax(to_gpu(em_slice(vs[k], 0, 1, 2, 1)), -1, true),
                      em_argmax(em_slice(vs[k], 0, 1, 2, 1), -1, true));
        }
        em_tensor *z = em_scalar(1, dt, CPU);
        same_bits(em_argmax(to_gpu(z), 0, false), em_argmax(z, 0, false));
    }
    em_tensor *h = to_gpu(tu_random(140, 1, TU_SIZES(9), EM_F16, 1));
    tu_check_fails(em_argmax(h, 0, false), EM_ERR_DTYPE);
}
END_TEST

/* ---- the generated texts, compiled by NVRTC alone (no GPU needed) ---- */
#ifdef EMBER_HAVE_CUDA

static void compiles(char *text, const char *what) {
    ck_assert_msg(text != NULL, "%s: %s", what, em_last_error());
    void *bin = NULL;
    size_t n = 0;
    static const uint8_t key[16];
    cuda_src src = {.text = text, .shape = CU_SERIAL, .threads = 1, .unroll = 1, .extent_size = -1};
    char *keyed = cuda_text_with_key(&src, JIT_KERNEL_NAME, key); /* as the device compiles it */
    em_status s = keyed ? cuda_nvrtc_compile(keyed, JIT_KERNEL_NAME, 90, false, &bin, &n) : em_last_status();
    em_free(keyed);
    ck_assert_msg(s == EM_OK, "%s does not compile: %s\n%s", what, em_last_error(), text);
    ck_assert(n > 0);
    em_free(bin);
    em_free(text);
}

START_TEST(native_texts_compile) {
    const em_dtype idx[] = {EM_DTYPE_COUNT, EM_I32, EM_I64};
    int nd = 1; /* every element size and index type, the ranks 1..8 among them */
    for (size_t es = 1; es <= 8; es *= 2)
        for (int i = 0; i < 3; i++, nd = nd % EM_MAX_DIMS + 1)
            compiles(cuda_native_copy_text(es, nd, idx[i], false), "copy");
    compiles(cuda_native_copy_text(4, 3, EM_I64, true), "scatter");
    compiles(cuda_native_copy_text(2, 4, EM_I32, true), "scatter");
    for (int t = 0; t < NDTYPES; t++) {
        compiles(cuda_native_arange_text(all_dtypes[t], false), "arange");
        if (all_dtypes[t] == EM_I32 || all_dtypes[t] == EM_I64)
            compiles(cuda_native_arange_text(all_dtypes[t], true), "exact arange");
    }
    for (int d = 0; d < 2; d++)
        for (int normal = 0; normal < 2; normal++)
            compiles(cuda_native_rand_text(d ? EM_F64 : EM_F32, normal), normal ? "randn" : "rand");
    for (int t = 0; t < 5; t++)
        for (int pass = 0; pass < 3; pass++) compiles(cuda_native_argmax_text(all_dtypes[t], t + 1, pass), "argmax");
    /* column reductions: each op, accumulator kind and pass once (every
     * combination is 66 compiles: too long under valgrind; test_cuda's
     * reductions run them all on a GPU) */
    const struct { em_op op; em_dtype in, acc, out; } col[] = {
        {EM_OP_SUM, EM_F32, EM_F64, EM_F32},   {EM_OP_MEAN, EM_F16, EM_F64, EM_F16},
        {EM_OP_AMAX, EM_BF16, EM_F32, EM_BF16}, {EM_OP_AMIN, EM_F64, EM_F64, EM_F64},
        {EM_OP_SUM, EM_I32, EM_I64, EM_I64},   {EM_OP_AMAX, EM_I64, EM_I64, EM_I64}};
    for (size_t c = 0; c < sizeof col / sizeof col[0]; c++)
        compiles(cuda_native_colreduce_text(col[c].op, col[c].in, col[c].acc, col[c].out, true),
                 "column reduction");
    compiles(cuda_native_colreduce_text(EM_OP_MEAN, EM_BF16, EM_F64, EM_F64, false), "column partials");
    compiles(cuda_native_colreduce_text(EM_OP_MEAN, EM_F64, EM_F64, EM_BF16, true), "column result");
    /* dtypes the ops refuse, with the CPU's errors */
    ck_assert_ptr_null(cuda_native_rand_text(EM_I32, false));
    ck_assert_int_eq(em_last_status(), EM_ERR_DTYPE);
    ck_assert_ptr_null(cuda_native_argmax_text(EM_F16, 1, 0));
    ck_assert_int_eq(em_last_status(), EM_ERR_DTYPE);
    ck_assert_ptr_null(cuda_native_argmax_text(EM_F32, 1, 3));
    ck_assert_int_eq(em_last_status(), EM_ERR_ARG);
    for (int m = 1; m <= 8; m++) compiles(cuda_native_skinny_text(m), "skinny matmul");
    ck_assert_ptr_null(cuda_native_skinny_text(9));
    ck_assert_int_eq(em_last_status(), EM_ERR_ARG);
}
END_TEST

#endif /* EMBER_HAVE_CUDA */

/* Without a GPU: the NVRTC-only tests when NVRTC loads (exit 77 else). */
static int run_without_gpu(const char *why) {
    printf("SKIP: the GPU tests: no CUDA device: %s\n", why[0] ? why : "(unknown)");
#ifndef EMBER_HAVE_CUDA
    return 77;
#else
    if (!cuda_nvrtc()) {
        printf("SKIP: the NVRTC tests too: %s\n", em_last_error());
        return 77;
    }
    const tu_test tests[] = {{"native_texts_compile", native_texts_compile}};
    return tu_run(tu_suite("cuda_nvrtc", tests, 1, 120));
#endif
}

int main(int argc, char **argv) {
    self_path = argv[0];
    if (argc > 1 && !strcmp(argv[1], "--cache-child")) return cache_child();
    if (argc > 1 && !strcmp(argv[1], "--swap-child")) return swap_child();
    if (argc > 1 && !strcmp(argv[1], "--warm-child")) return warm_child();
    char why[512];
    if (!tu_probe_gpu(why, sizeof why)) return run_without_gpu(why);
    const tu_test tests[] = {
        {"bad_device", bad_device},
        {"warmup_round_trip_on_the_gpu", warmup_round_trip_on_the_gpu},
        {"a_bundle_for_another_gpu_is_refused", a_bundle_for_another_gpu_is_refused},
        {"ten_batch_sizes_on_the_gpu_compile_twice", ten_batch_sizes_on_the_gpu_compile_twice},
        {"round_trip_and_views", round_trip_and_views},
        {"creation", creation},
        {"unary_ops", unary_ops},
        {"binary_ops_broadcast", binary_ops_broadcast},
        {"casts", casts},
        {"non_contiguous_inputs", non_contiguous_inputs},
        {"reductions", reductions},
        {"decompositions", decompositions},
        {"cat_and_index", cat_and_index},
        {"matmul", matmul},
        {"compiled_graphs", compiled_graphs},
        {"cuda_backend_on_cpu_inputs", cuda_backend_on_cpu_inputs},
        {"lazy_mode_on_the_gpu", lazy_mode_on_the_gpu},
        {"second_process_compiles_nothing", second_process_compiles_nothing},
        {"swapped_cubins_are_misses", swapped_cubins_are_misses},
        {"native_cat", native_cat},
        {"native_index_select", native_index_select},
        {"native_index_select_errors", native_index_select_errors},
        {"native_index_copy", native_index_copy},
        {"skinny_matmul", skinny_matmul},
        {"linear_on_cuda", linear_on_cuda},
        {"linear_act_on_cuda", linear_act_on_cuda},
        {"compiled_mlp_fuses_linears", compiled_mlp_fuses_linears},
        {"native_arange", native_arange},
        {"native_rand", native_rand},
        {"native_argmax", native_argmax},
        {"half_ops_on_the_gpu", half_ops_on_the_gpu},
        {"compiled_half_graphs", compiled_half_graphs},
        {"transposed_operands_on_the_gpu", transposed_operands_on_the_gpu},
        {"rows_kernels_on_the_gpu", rows_kernels_on_the_gpu},
        {"long_rows_over_clusters", long_rows_over_clusters},
        {"long_row_views_and_bf16_over_clusters", long_row_views_and_bf16_over_clusters},
        {"half_kernels_step_by_bytes", half_kernels_step_by_bytes},
#ifdef EMBER_HAVE_CUDA
        {"native_texts_compile", native_texts_compile},
#endif
    };
    return tu_run(tu_suite("cuda", tests, sizeof tests / sizeof tests[0], 120));
}
