/* test_fuse.c - the cpu backend: fused native kernels agree with eager
 * mode, and fusion gives the kernel counts it promises. */
#include "testutil.h"
#include "../bench/workloads.h"

#include "schedule.h"
#include "trace.h"
#include "worker.h"

#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const em_device CPU = {EM_CPU, 0};

typedef em_status (*fn_t)(void *, em_tensor *const *, const double *, em_tensor **);

/* Compiles fn with the cpu backend, calls it twice (trace, then the
 * compiled entry) and checks both calls against fn run eagerly. */
static int check_fn(fn_t fn, int nin, em_tensor **in, double rtol, double atol) {
    em_compile_options o = {.ninputs = nin, .noutputs = 1, .name = "f", .backend = "cpu"};
    em_compiled *f = em_compile(fn, NULL, &o);
    ck_assert_ptr_nonnull(f);
    em_tensor *ref, *y1, *y2;
    ck_assert_int_eq(fn(NULL, in, NULL, &ref), EM_OK);
    ck_assert_msg(em_call(f, in, NULL, &y1) == EM_OK, "%s", em_last_error());
    ck_assert_msg(em_call(f, in, NULL, &y2) == EM_OK, "%s", em_last_error());
    em_compile_stats st;
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.hits, 1);
    double *r = tu_values(ref);
    ck_assert_int_eq(em_dtype_of(y2), em_dtype_of(ref));
    tu_check_close(y2, r, em_ndim(ref), em_sizes(ref), rtol, atol);
    free(r);
    em_compiled_free(f);
    return st.kernels;
}

static em_status log_softmax(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    out[0] = em_log_softmax(in[0], -1);
    return out[0] ? EM_OK : em_last_status();
}

static em_status mlp(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    out[0] = em_gelu_tanh(em_add(em_matmul(in[0], in[1]), in[2]));
    return out[0] ? EM_OK : em_last_status();
}

/* The same with gelu's erf form, which no matmul epilogue applies. */
static em_status mlp_erf(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    out[0] = em_gelu(em_add(em_matmul(in[0], in[1]), in[2]));
    return out[0] ? EM_OK : em_last_status();
}

static em_status reductions(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    int last = -1, first = 0;
    em_tensor *a = em_sum(in[0], 1, &last, false);         /* no keepdim */
    em_tensor *b = em_mean(in[0], 1, &first, false);       /* leading dim: eager */
    em_tensor *v = em_var(in[0], 1, &last, 1, false);
    em_tensor *m = em_amin(in[0], 1, &last, false);
    out[0] = em_add(em_add(a, em_sum(b, 0, NULL, false)), em_sub(v, m));
    return out[0] ? EM_OK : em_last_status();
}

static em_status logic(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    em_tensor *gt = em_gt(in[0], in[1]);
    out[0] = em_where(gt, em_cast(in[0], EM_I64), em_maximum(em_cast(in[1], EM_I64), em_abs(in[2])));
    return out[0] ? EM_OK : em_last_status();
}

static em_tensor *randn(uint64_t seed, int nd, const int64_t *sz) {
    return tu_random(seed, nd, sz, EM_F32, 1.0);
}

START_TEST(pointwise_fuses_into_one_kernel) {
    int64_t sizes[][3] = {{1, 1, 1}, {1, 1, 7}, {1, 3, 1000}, {2, 3, 333}, {1, 1, 100003}};
    for (int i = 0; i < 5; i++) {
        em_tensor *in[3] = {randn(1, 3, sizes[i]), randn(2, 3, sizes[i]), randn(3, 3, sizes[i])};
        ck_assert_int_eq(check_fn(wl_pointwise_fn, 3, in, 1e-5, 1e-6), 1);
    }
    /* broadcast and transposed operands */
    em_tensor *x = randn(4, 2, TU_SIZES(64, 48));
    em_tensor *in[3] = {em_transpose(randn(5, 2, TU_SIZES(48, 64)), 0, 1), randn(6, 1, TU_SIZES(48)),
                        randn(7, 2, TU_SIZES(64, 1))};
    (void)x;
    ck_assert_int_eq(check_fn(wl_pointwise_fn, 3, in, 1e-5, 1e-6), 1);
    /* size 0 */
    em_tensor *z[3] = {randn(8, 2, TU_SIZES(0, 5)), randn(9, 2, TU_SIZES(0, 5)), randn(10, 1, TU_SIZES(5))};
    check_fn(wl_pointwise_fn, 3, z, 0, 0);
}
END_TEST

START_TEST(softmax_is_one_kernel) {
    int64_t sizes[][2] = {{4, 1}, {3, 7}, {64, 1000}, {1, 4099}};
    for (int i = 0; i < 4; i++) {
        em_tensor *x = tu_random(11, 2, sizes[i], EM_F32, 3.0);
        ck_assert_int_eq(check_fn(wl_softmax_fn, 1, &x, 1e-5, 1e-7), 1);
        ck_assert_int_eq(check_fn(log_softmax, 1, &x, 1e-5, 1e-5), 1);
    }
    em_tensor *t = em_transpose(tu_random(12, 2, TU_SIZES(100, 30), EM_F64, 2.0), 0, 1);
    ck_assert_int_eq(check_fn(wl_softmax_fn, 1, &t, 1e-12, 1e-14), 1);
    const double ext[6] = {1000, -1000, NAN, 1, INFINITY, 0};
    em_tensor *e = tu_tensor(ext, 2, TU_SIZES(3, 2), EM_F32);
    check_fn(wl_softmax_fn, 1, &e, 1e-6, 1e-7);
}
END_TEST

static em_status softmax_of_computed(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    out[0] = em_softmax(em_add(em_mul_scalar(em_tanh(in[0]), 0.5), in[0]), -1);
    return out[0] ? EM_OK : em_last_status();
}

static em_status log_softmax_of_computed(void *c, em_tensor *const *in, const double *s,
                                         em_tensor **out) {
    (void)c, (void)s;
    out[0] = em_log_softmax(em_mul(in[0], in[0]), -1);
    return out[0] ? EM_OK : em_last_status();
}

static em_status layernorm_of_computed(void *c, em_tensor *const *in, const double *s,
                                       em_tensor **out) {
    (void)c, (void)s;
    out[0] = em_layer_norm(em_add_scalar(em_mul_scalar(in[0], 2), 1), 1, NULL, NULL, 1e-5);
    return out[0] ? EM_OK : em_last_status();
}

/* The first reduction's computed input is kept in the output between
 * passes (lower.c's early stash): still one kernel, float64-exact values. */
START_TEST(a_computed_softmax_input_is_kept_between_passes) {
    int64_t sizes[][2] = {{4, 1}, {3, 7}, {64, 1000}, {2, 4099}};
    for (int i = 0; i < 4; i++) {
        em_tensor *x = tu_random(31 + (uint64_t)i, 2, sizes[i], EM_F32, 2.0);
        ck_assert_int_eq(check_fn(softmax_of_computed, 1, &x, 1e-5, 1e-7), 1);
        ck_assert_int_eq(check_fn(log_softmax_of_computed, 1, &x, 1e-5, 1e-5), 1);
        check_fn(layernorm_of_computed, 1, &x, 1e-4, 1e-5);
        /* float64 reference of the first */
        em_tensor *y;
        ck_assert_int_eq(softmax_of_computed(NULL, &x, NULL, &y), EM_OK);
        em_compile_options o = {.ninputs = 1, .noutputs = 1, .name = "sm"};
        em_compiled *f = em_compile(softmax_of_computed, NULL, &o);
        ck_assert_int_eq(em_call(f, &x, NULL, &y), EM_OK);
        double *xv = tu_values(x), *ref = malloc(sizeof(double) * (size_t)(sizes[i][0] * sizes[i][1]));
        for (int64_t r = 0; r < sizes[i][0]; r++) {
            const double *row = xv + r * sizes[i][1];
            double m = -INFINITY, sum = 0;
            for (int64_t c = 0; c < sizes[i][1]; c++) m = fmax(m, tanh(row[c]) * 0.5 + row[c]);
            for (int64_t c = 0; c < sizes[i][1]; c++) sum += exp(tanh(row[c]) * 0.5 + row[c] - m);
            for (int64_t c = 0; c < sizes[i][1]; c++)
                ref[r * sizes[i][1] + c] = exp(tanh(row[c]) * 0.5 + row[c] - m) / sum;
        }
        tu_check_close(y, ref, 2, sizes[i], 1e-5, 1e-8);
        free(xv);
        free(ref);
        em_compiled_free(f);
    }
}
END_TEST

/* ---- the tile hint (lower.c's transposed operands) ---- */

static em_status transpose_add(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    out[0] = em_add(em_transpose(in[0], -2, -1), in[1]);
    return out[0] ? EM_OK : em_last_status();
}

static em_status permute_add(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s; /* in[0]'s dims 1 and 2 swapped: [B, H, T, D] -> [B, T, H, D] */
    out[0] = em_add(em_permute(in[0], 4, (int[]){0, 2, 1, 3}), in[1]);
    return out[0] ? EM_OK : em_last_status();
}

static em_status reverse_add(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    out[0] = em_add(em_permute(in[0], 3, (int[]){2, 1, 0}), in[1]);
    return out[0] ? EM_OK : em_last_status();
}

static em_status strided_transpose_add(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s; /* x[:, ::2].T + y */
    out[0] = em_add(em_transpose(em_slice(in[0], 1, 0, em_sizes(in[0])[1], 2), 0, 1), in[1]);
    return out[0] ? EM_OK : em_last_status();
}

static em_status plain_add(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    out[0] = em_add(in[0], in[1]);
    return out[0] ? EM_OK : em_last_status();
}

/* x + w in float64, w broadcast to x's shape (x read through its strides
 * by tu_values). */
static double *broadcast_add_ref(const em_tensor *x, const em_tensor *w) {
    int nd = em_ndim(x), wd = em_ndim(w);
    const int64_t *xs = em_sizes(x), *ws = em_sizes(w);
    int64_t n = em_numel(x);
    double *xv = tu_values(x), *wv = tu_values(w), *r = malloc(sizeof(double) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, wi = 0, wstride = 1;
        for (int d = nd - 1; d >= 0; d--) {
            int64_t idx = rem % xs[d];
            rem /= xs[d];
            int e = d - (nd - wd);
            if (e < 0) continue;
            if (ws[e] > 1) wi += idx * wstride;
            wstride *= ws[e];
        }
        r[i] = xv[i] + wv[wi];
    }
    free(xv), free(wv);
    return r;
}

/* Whether a kernel of fn's graph carries the tile hint (and then a staged
 * load). */
static bool lowered_tiled(fn_t fn, int nin, em_tensor **in) {
    em_tensor *out[1] = {0};
    tr_recorder *r = tr_record_begin(nin, in, NULL);
    ck_assert_int_eq(fn(NULL, in, NULL, out), EM_OK);
    char why[256] = "";
    tr_graph *g = tr_record_end(r, 1, out, why, sizeof why);
    ck_assert_msg(g != NULL, "%s", why);
    sc_schedule *s = sc_build(g);
    int *bufs = malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    bool tiled = false;
    for (int gi = 0; gi < s->ngroups; gi++) {
        int nbufs, nouts;
        k_kernel *k = sc_lower(s, gi, bufs, &nbufs, &nouts);
        if (!k) continue; /* a dead group */
        char *text = kir_to_text(k);
        bool t = strstr(text, " tile %") != NULL;
        ck_assert_msg(t == (strstr(text, " staged") != NULL), "%s", text);
        tiled |= t;
        em_free(text);
        kir_free(k);
    }
    free(bufs);
    sc_free(s);
    tr_graph_free(g);
    return tiled;
}

/* The hint goes where an operand is contiguous along the dim outside the
 * stores' innermost one, and nowhere else; the CPU ignores it: values
 * against float64. */
START_TEST(transposed_operands_get_the_tile_hint) {
    em_tensor *tin[2] = {randn(1, 2, TU_SIZES(45, 37)), randn(2, 2, TU_SIZES(37, 45))};
    ck_assert(lowered_tiled(transpose_add, 2, tin));
    em_tensor *bin[2] = {randn(3, 3, TU_SIZES(3, 33, 70)), randn(4, 2, TU_SIZES(70, 1))};
    ck_assert(lowered_tiled(transpose_add, 2, bin)); /* a batch, a broadcast operand */
    em_tensor *sin[2] = {randn(5, 2, TU_SIZES(20, 66)), randn(6, 2, TU_SIZES(33, 20))};
    ck_assert(lowered_tiled(strided_transpose_add, 2, sin));
    em_tensor *plain[2] = {randn(7, 2, TU_SIZES(37, 45)), randn(8, 1, TU_SIZES(45))};
    ck_assert(!lowered_tiled(plain_add, 2, plain));
    em_tensor *heads[2] = {randn(9, 4, TU_SIZES(2, 3, 5, 8)), randn(10, 4, TU_SIZES(2, 5, 3, 8))};
    ck_assert(!lowered_tiled(permute_add, 2, heads)); /* rows of D contiguous already */
    em_tensor *rev[2] = {randn(11, 3, TU_SIZES(5, 6, 7)), randn(12, 3, TU_SIZES(7, 6, 5))};
    ck_assert(!lowered_tiled(reverse_add, 2, rev)); /* the dim outside is strided too */
    fn_t fns[] = {transpose_add, transpose_add, strided_transpose_add};
    em_tensor *views[] = {em_transpose(tin[0], -2, -1), em_transpose(bin[0], -2, -1),
                          em_transpose(em_slice(sin[0], 1, 0, 66, 2), 0, 1)};
    em_tensor **ins[] = {tin, bin, sin};
    for (int c = 0; c < 3; c++) {
        em_tensor *y;
        em_compile_options o = {.ninputs = 2, .noutputs = 1, .name = "t", .backend = "cpu"};
        em_compiled *f = em_compile(fns[c], NULL, &o);
        ck_assert_int_eq(em_call(f, ins[c], NULL, &y), EM_OK);
        ck_assert_int_eq(em_call(f, ins[c], NULL, &y), EM_OK);
        double *ref = broadcast_add_ref(views[c], ins[c][1]);
        tu_check_close(y, ref, em_ndim(views[c]), em_sizes(views[c]), 1e-6, 1e-7);
        free(ref);
        em_compiled_free(f);
    }
}
END_TEST

START_TEST(layernorm_is_one_kernel) {
    em_tensor *in[3] = {tu_random(13, 3, TU_SIZES(2, 5, 256), EM_F32, 2.0),
                        randn(14, 1, TU_SIZES(256)), randn(15, 1, TU_SIZES(256))};
    ck_assert_int_eq(check_fn(wl_layernorm_fn, 3, in, 1e-4, 1e-5), 1);
    em_tensor *one[3] = {randn(16, 2, TU_SIZES(3, 1)), randn(17, 1, TU_SIZES(1)), randn(18, 1, TU_SIZES(1))};
    check_fn(wl_layernorm_fn, 3, one, 1e-5, 1e-5);
}
END_TEST

/* layer_norm's var reuses the mean its centering took (lower.c's
 * same_mean): the kernel makes two passes over each row, then the store
 * pass, not three (the mean twice) and the store. */
START_TEST(layernorm_kernel_takes_the_mean_once) {
    em_tensor *in[3] = {tu_random(13, 2, TU_SIZES(8, 256), EM_F32, 2.0), randn(14, 1, TU_SIZES(256)),
                        randn(15, 1, TU_SIZES(256))}, *out = NULL;
    char why[256] = "";
    tr_recorder *r = tr_record_begin(3, in, NULL);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(wl_layernorm_fn(NULL, in, NULL, &out), EM_OK);
    tr_graph *g = tr_record_end(r, 1, &out, why, sizeof why);
    ck_assert_msg(g != NULL, "record: %s %s", why, em_last_error());
    ck_assert_int_eq(tr_optimize(g, true), EM_OK);
    sc_schedule *s = sc_build(g);
    ck_assert_ptr_nonnull(s);
    int *bufs = malloc(sizeof(int) * ((size_t)g->nnodes + 1)), kernels = 0;
    for (int i = 0; i < s->nsteps; i++) {
        if (s->steps[i].kind != SC_KERNEL) continue;
        int nbufs, nouts, accs = 0, loops = 0;
        k_kernel *k = sc_lower(s, s->steps[i].group, bufs, &nbufs, &nouts);
        ck_assert_msg(k != NULL, "sc_lower: %s", em_last_error());
        for (int j = 0; j < k->n; j++) {
            accs += k->insts[j].op == K_ACC;
            loops += k->insts[j].op == K_RANGE;
        }
        ck_assert_int_eq(accs, 2);      /* sum x, then sum (x - mean)^2 */
        ck_assert_int_eq(loops, 1 + 3); /* the rows, two reduction passes, the store */
        kir_free(k);
        kernels++;
    }
    ck_assert_int_eq(kernels, 1);
    free(bufs);
    sc_free(s);
    tr_graph_free(g);
}
END_TEST

/* An MLP's bias add and gelu_tanh, or gelu's erf form, run in the
 * matmul's epilogue (the linear pass: no kernel), in f32 and in the half
 * types (applied as the product is rounded into the output: the same
 * bits as eager). */
START_TEST(mlp_epilogue_fuses_after_matmul) {
    em_tensor *in[3] = {randn(19, 2, TU_SIZES(16, 32)), tu_random(20, 2, TU_SIZES(32, 24), EM_F32, 0.2),
                        randn(21, 1, TU_SIZES(24))};
    ck_assert_int_eq(check_fn(mlp, 3, in, 1e-5, 1e-5), 0);
    ck_assert_int_eq(check_fn(mlp_erf, 3, in, 1e-5, 1e-5), 0);
    for (int h = 0; h < 2; h++) {
        em_dtype dt = h ? EM_BF16 : EM_F16;
        em_tensor *hin[3] = {em_cast(in[0], dt), em_cast(in[1], dt), em_cast(in[2], dt)};
        ck_assert_int_eq(check_fn(mlp, 3, hin, 0, 0), 0);
        ck_assert_int_eq(check_fn(mlp_erf, 3, hin, 0, 0), 0);
    }
}
END_TEST

START_TEST(reductions_and_leading_dims) {
    em_tensor *x = tu_random(22, 2, TU_SIZES(6, 50), EM_F32, 1.0);
    check_fn(reductions, 1, &x, 1e-5, 1e-5);
    em_tensor *xd = tu_random(23, 2, TU_SIZES(6, 1), EM_F64, 1.0);
    check_fn(reductions, 1, &xd, 1e-12, 1e-12);
}
END_TEST

START_TEST(integers_bools_and_where) {
    em_tensor *in[3] = {tu_random(24, 2, TU_SIZES(5, 9), EM_I32, 10), tu_random(25, 1, TU_SIZES(9), EM_I32, 10),
                        tu_random(26, 2, TU_SIZES(5, 1), EM_I64, 10)};
    ck_assert_int_eq(check_fn(logic, 3, in, 0, 0), 1);
}
END_TEST

/* Every pointwise op against eager: all unary ops of an input in one
 * function (one fused kernel with an output per op, so the suite stays
 * quick under valgrind), and likewise all binary ops. */
typedef em_tensor *(*unary_fn)(const em_tensor *);
typedef em_tensor *(*binary_fn)(const em_tensor *, const em_tensor *);
static const unary_fn unary[] = {em_neg, em_abs, em_exp, em_log, em_sqrt, em_rsqrt, em_sin,
                                 em_cos, em_tanh, em_sigmoid, em_relu, em_gelu, em_gelu_tanh,
                                 em_erf};
static const binary_fn binary[] = {em_add, em_sub, em_mul, em_div, em_pow, em_maximum,
                                   em_minimum, em_eq, em_ne, em_lt, em_le, em_gt, em_ge};
#define NUNARY ((int)(sizeof unary / sizeof unary[0]))
#define NBINARY ((int)(sizeof binary / sizeof binary[0]))
static int nbinary_used = NBINARY;

static em_status all_unary(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    for (int i = 0; i < NUNARY; i++)
        if (!(out[i] = unary[i](in[0]))) return em_last_status();
    return EM_OK;
}

static em_status all_binary(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    for (int i = 0; i < nbinary_used; i++)
        if (!(out[i] = binary[i](in[0], in[1]))) return em_last_status();
    return EM_OK;
}

/* check_fn for functions of n outputs; returns the kernel count. */
static int check_multi(fn_t fn, int nin, em_tensor **in, int nout, double rtol, double atol) {
    em_compile_options o = {.ninputs = nin, .noutputs = nout, .name = "multi", .backend = "cpu"};
    em_compiled *f = em_compile(fn, NULL, &o);
    em_tensor *ref[16], *y[16];
    ck_assert_int_eq(fn(NULL, in, NULL, ref), EM_OK);
    ck_assert_msg(em_call(f, in, NULL, y) == EM_OK, "%s", em_last_error());
    ck_assert_msg(em_call(f, in, NULL, y) == EM_OK, "%s", em_last_error());
    for (int i = 0; i < nout; i++) {
        double *r = tu_values(ref[i]);
        ck_assert_int_eq(em_dtype_of(y[i]), em_dtype_of(ref[i]));
        tu_check_close(y[i], r, em_ndim(ref[i]), em_sizes(ref[i]), rtol, atol);
        free(r);
    }
    em_compile_stats st;
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.hits, 1);
    em_compiled_free(f);
    return st.kernels;
}

START_TEST(every_pointwise_op_matches_eager) {
    const em_dtype dts[] = {EM_F32, EM_F64};
    for (int d = 0; d < 2; d++) {
        /* positive inputs for log, sqrt, pow; then NaN, infinities, zeros */
        em_tensor *x = em_add_scalar(em_abs(tu_random(40, 2, TU_SIZES(7, 33), dts[d], 2)), 0.1);
        em_tensor *y = tu_random(41, 1, TU_SIZES(33), dts[d], 2);
        const double sp[8] = {NAN, INFINITY, -INFINITY, 0, -0.0, 1e-30, -50, 50};
        em_tensor *z = tu_tensor(sp, 1, TU_SIZES(8), dts[d]);
        em_tensor *ins[3] = {x, y, z};
        for (int k = 0; k < 3; k++) ck_assert_int_eq(check_multi(all_unary, 1, &ins[k], NUNARY, 4e-6, 1e-6), 1);
        em_tensor *xy[2] = {x, y};
        nbinary_used = NBINARY;
        ck_assert_int_eq(check_multi(all_binary, 2, xy, NBINARY, 4e-6, 1e-6), 1);
    }
    /* integers: exact ops stay integer, div and pow compute in f32 */
    em_tensor *a = em_add_scalar(em_abs(tu_random(42, 2, TU_SIZES(3, 5), EM_I64, 5)), 1);
    em_tensor *b = em_add_scalar(em_abs(tu_random(43, 1, TU_SIZES(5), EM_I64, 2)), 1);
    em_tensor *ab[2] = {a, b};
    check_multi(all_binary, 2, ab, NBINARY, 1e-6, 0);
    em_tensor *neg = em_neg(a);
    check_multi(all_unary, 1, &neg, NUNARY, 4e-6, 1e-6);
}
END_TEST

/* Compiles softmax for x and returns its stats. */
static em_compile_stats softmax_stats(em_tensor *x) {
    em_compile_options o = {.ninputs = 1, .noutputs = 1, .name = "softmax"};
    em_compiled *f = em_compile(wl_softmax_fn, NULL, &o);
    em_tensor *y;
    ck_assert_int_eq(em_call(f, &x, NULL, &y), EM_OK);
    em_compile_stats st;
    em_compiled_stats(f, &st);
    em_compiled_free(f);
    return st;
}

START_TEST(second_process_loads_kernels_from_the_cache) {
    char dir[] = "/tmp/ember-fuse-cache-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char *saved = getenv("EMBER_CACHE_DIR") ? strdup(getenv("EMBER_CACHE_DIR")) : NULL;
    setenv("EMBER_CACHE_DIR", dir, 1);
    em_tensor *x = tu_random(30, 2, TU_SIZES(5, 77), EM_F32, 1);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) { /* the first process compiles and stores */
        em_compile_stats st = softmax_stats(x);
        free(saved); /* valgrind follows the child too: its exit must leak nothing */
        _exit(st.kernels_compiled == 1 && st.kernels_loaded == 0 ? 0 : 1);
    }
    int status;
    waitpid(pid, &status, 0);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    em_compile_stats st = softmax_stats(x); /* a new cache object: the disk tier */
    ck_assert_int_eq(st.kernels_compiled, 0);
    ck_assert_int_eq(st.kernels_loaded, 1);
    /* a corrupted shared object is a miss: compiled again, right result */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "for f in %s/v1/*/*.so; do printf garbage > \"$f\"; done", dir);
    ck_assert_int_eq(system(cmd), 0);
    em_compile_options o = {.ninputs = 1, .noutputs = 1, .name = "softmax"};
    em_compiled *f = em_compile(wl_softmax_fn, NULL, &o);
    em_tensor *y, *ref = em_softmax(x, -1);
    ck_assert_int_eq(em_call(f, &x, NULL, &y), EM_OK);
    ck_assert_int_eq(em_call(f, &x, NULL, &y), EM_OK);
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.kernels_compiled, 1);
    double *r = tu_values(ref);
    tu_check_close(y, r, 2, TU_SIZES(5, 77), 1e-5, 1e-7);
    free(r);
    em_compiled_free(f);
    if (saved) setenv("EMBER_CACHE_DIR", saved, 1);
    free(saved);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* Several kernels per graph: softmax and layer_norm side by side, with a
 * matmul between them (three groups). */
static em_status three_kernels(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    em_tensor *a = em_softmax(in[0], -1);
    em_tensor *m = em_matmul(a, em_transpose(in[0], 0, 1));
    out[0] = em_layer_norm(em_tanh(m), 1, NULL, NULL, 1e-5);
    return out[0] ? EM_OK : em_last_status();
}

START_TEST(kernels_compile_in_workers_or_in_process) {
    em_tensor *x = tu_random(50, 2, TU_SIZES(9, 9), EM_F32, 1);
    const char *saved = getenv("EMBER_JIT_WORKER");
    char *keep = saved ? strdup(saved) : NULL;
    /* the build's worker (as make check sets it), with and without the
     * disk cache; a failing one; none */
    const char *workers[4] = {keep ? keep : "0", keep ? keep : "0", "/bin/false", "0"};
    for (int w = 0; w < 4; w++) {
        char dir[] = "/tmp/ember-worker-cache-XXXXXX";
        ck_assert_ptr_nonnull(mkdtemp(dir));
        setenv("EMBER_CACHE_DIR", dir, 1);
        setenv("EMBER_CACHE", w == 1 ? "0" : "1", 1);
        setenv("EMBER_JIT_WORKER", workers[w], 1);
        char **env_before = environ;
        int k = check_fn(three_kernels, 1, &x, 1e-5, 1e-5);
        ck_assert_int_ge(k, 2);
        /* with a worker, libgccjit's driver (which calls putenv) ran in the
         * worker: this process's environment array did not move */
        if (keep && w < 2) ck_assert_ptr_eq(environ, env_before);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        ck_assert_int_eq(system(cmd), 0);
    }
    if (keep) setenv("EMBER_JIT_WORKER", keep, 1);
    else unsetenv("EMBER_JIT_WORKER");
    unsetenv("EMBER_CACHE");
    free(keep);
}
END_TEST

START_TEST(worker_protocol_round_trip) {
    k_kernel *k = kir_new("k7");
    int b = kir_buf(k, EM_F32), n = kir_const_i(k, EM_I64, 5);
    int i = kir_range(k, n, K_PARALLEL);
    kir_store(k, b, i, kir_alu(k, KA_EXP, kir_load(k, b, i), -1, -1));
    kir_end(k);
    k_kernel *k2 = kir_new("k8");
    b = kir_buf(k2, EM_I32);
    i = kir_range(k2, kir_const_i(k2, EM_I64, 3), 0);
    kir_store(k2, b, i, kir_load(k2, b, i));
    kir_end(k2);
    k_kernel *const unit[2] = {k, k2};
    const char *const paths[2] = {"/tmp/x.so", "/tmp/y.so"};
    FILE *f = tmpfile();
    ck_assert(jit_worker_write(f, unit, paths, 2));
    ck_assert(jit_worker_write(f, unit + 1, paths + 1, 1));
    ck_assert(!jit_worker_write(f, unit, paths, 0));
    ck_assert(!jit_worker_write(f, unit, paths, JIT_CPU_UNIT_MAX + 1));
    rewind(f);
    for (int r = 0; r < 2; r++) {
        jit_worker_unit u;
        ck_assert(jit_worker_read(f, &u));
        ck_assert_int_eq(u.n, r ? 1 : 2);
        for (int j = 0; j < u.n; j++) {
            const k_kernel *want = unit[r + j];
            ck_assert_str_eq(u.paths[j], paths[r + j]);
            ck_assert_str_eq(u.ks[j]->name, want->name);
            ck_assert_int_eq(u.ks[j]->n, want->n);
            ck_assert_int_eq(u.ks[j]->nbufs, want->nbufs);
            ck_assert(memcmp(u.ks[j]->insts, want->insts, sizeof(k_inst) * (size_t)want->n) == 0);
            ck_assert_int_eq(kir_verify(u.ks[j]), EM_OK);
        }
        jit_worker_unit_free(&u);
    }
    fclose(f);
    /* truncated or foreign input is an error, not a crash: the old
     * format, a count of 0 or past the bound, a unit cut short */
    const char *bad[] = {"EMKIR02", "EMKIR01\0\x01\0\0\0\x40\0\0\0\x02", "not a kernel at all",
                         "EMKIR02\0\0\0\0\0", "EMKIR02\0\x11\0\0\0", "EMKIR02\0\x02\0\0\0\x40\0\0\0\x02"};
    const size_t badlen[] = {7, 18, 19, 12, 12, 18};
    for (int t = 0; t < 6; t++) {
        FILE *g = tmpfile();
        ck_assert_int_eq(fwrite(bad[t], 1, badlen[t], g), badlen[t]);
        rewind(g);
        jit_worker_unit u;
        ck_assert(!jit_worker_read(g, &u));
        ck_assert_int_eq(em_last_status(), EM_ERR_ARG);
        ck_assert_int_eq(u.n, 0);
        em_clear_error();
        fclose(g);
    }
    kir_free(k2);
    kir_free(k);
}
END_TEST

/* ---- reductions with few result rows, split in two (trace/split.c) ---- */

enum { SP_MSE, SP_ROWS, SP_PERMUTED, SP_BCAST, SP_INT, SP_PRIME, SP_MIDDLE, SP_HALF, SP_COUNT };

static em_status split_fn(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)s;
    em_tensor *x = in[0], *d;
    switch (*(const int *)c) {
    case SP_MSE: d = em_sub(x, in[1]), out[0] = em_mean(em_mul(d, d), 0, NULL, false); break;
    case SP_ROWS: out[0] = em_sum(em_tanh(x), 1, (int[]){1}, true); break;
    case SP_PERMUTED: out[0] = em_amax(em_transpose(x, 0, 1), 0, NULL, false); break;
    case SP_BCAST: out[0] = em_amin(em_add(x, in[1]), 0, NULL, false); break;
    case SP_INT: out[0] = em_sum(x, 0, NULL, false); break;
    case SP_PRIME: out[0] = em_sum(em_exp(em_mul_scalar(x, 0.1)), 1, (int[]){1}, false); break;
    case SP_HALF: out[0] = em_mean(em_mul(x, x), 0, NULL, false); break; /* bf16 */
    default: out[0] = em_mean(em_abs(x), 2, (int[]){1, 2}, true); break;
    }
    return out[0] ? EM_OK : em_last_status();
}

/* v (finite, exact in f32) rounded to bf16, to nearest even. */
static double round_bf16(double v) {
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Case c's result in float64, from its inputs' values, as a flat array
 * (malloc'd). */
static double *split_ref(int c, em_tensor *const *in) {
    double *x = tu_values(in[0]), *y = in[1] ? tu_values(in[1]) : NULL, *r = calloc(8, sizeof(double));
    int64_t n = em_numel(in[0]), cols = em_size(in[0], -1);
    if (c == SP_ROWS || c == SP_PRIME || c == SP_MIDDLE) {
        int64_t rows = em_size(in[0], 0), per = n / rows;
        for (int64_t i = 0; i < n; i++) {
            double v = c == SP_ROWS ? tanh(x[i]) : c == SP_PRIME ? exp(0.1 * x[i]) : fabs(x[i]) / (double)per;
            r[i / per] += v;
        }
    } else {
        r[0] = c == SP_PERMUTED ? -INFINITY : c == SP_BCAST ? INFINITY : 0;
        for (int64_t i = 0; i < n; i++) {
            if (c == SP_MSE) r[0] += (x[i] - y[i]) * (x[i] - y[i]) / (double)n;
            if (c == SP_PERMUTED) r[0] = fmax(r[0], x[i]);
            if (c == SP_BCAST) r[0] = fmin(r[0], x[i] + y[i % cols]);
            if (c == SP_INT) r[0] += x[i];
            /* bf16: the square (exact in f32) rounded to bf16, as eager's mul */
            if (c == SP_HALF) r[0] += round_bf16(x[i] * x[i]) / (double)n;
        }
    }
    free(x), free(y);
    return r;
}

/* Compiles case c, calls it twice and checks the second call against the
 * float64 reference; whether the compile split a reduction (its
 * EMBER_LOG=graph line). */
static bool check_split_case_at(int c, em_tensor **in, int nin, int dynamic) {
    char log[64];
    tu_log_begin("graph", log, sizeof log);
    em_compile_options o = {.ninputs = nin, .noutputs = 1, .name = "split", .backend = "cpu",
                            .eager_check = -1, .dynamic = dynamic};
    em_compiled *f = em_compile(split_fn, &c, &o);
    em_tensor *y;
    ck_assert_msg(em_call(f, in, NULL, &y) == EM_OK, "case %d: %s", c, em_last_error());
    ck_assert_msg(em_call(f, in, NULL, &y) == EM_OK, "case %d: %s", c, em_last_error());
    em_tensor *want;
    ck_assert_int_eq(split_fn(&c, in, NULL, &want), EM_OK);
    ck_assert_int_eq(em_dtype_of(y), em_dtype_of(want));
    double *r = split_ref(c, in);
    double rt = c == SP_HALF ? 0x1p-7 : 1e-4; /* bf16: the result's one rounding */
    tu_check_close(y, r, em_ndim(want), em_sizes(want), rt, 1e-5);
    free(r);
    em_compiled_free(f);
    tu_log_end();
    char *text = tu_log_take(log);
    bool split = strstr(text, "reduction split in two") != NULL;
    free(text);
    return split;
}

static bool check_split_case(int c, em_tensor **in, int nin) { return check_split_case_at(c, in, nin, 0); }

START_TEST(few_row_reductions_are_split) {
    for (int c = 0; c < SP_COUNT; c++) {
        em_tensor *in[2] = {NULL, NULL};
        int nin = 1;
        if (c == SP_MSE) in[0] = randn(900, 2, TU_SIZES(1001, 999)), in[1] = randn(901, 2, TU_SIZES(1001, 999)), nin = 2;
        if (c == SP_ROWS) in[0] = randn(902, 2, TU_SIZES(3, 65540));     /* cut into 29 of 2260 */
        if (c == SP_PERMUTED) in[0] = randn(903, 2, TU_SIZES(40000, 7)); /* viewed [7, 40000] */
        if (c == SP_BCAST) in[0] = randn(904, 2, TU_SIZES(8, 70000)), in[1] = randn(905, 1, TU_SIZES(70000)), nin = 2;
        if (c == SP_INT) in[0] = tu_random(906, 1, TU_SIZES(131072), EM_I32, 1000);
        if (c == SP_PRIME) in[0] = randn(907, 2, TU_SIZES(1, 65537)); /* not split */
        if (c == SP_MIDDLE) in[0] = randn(908, 3, TU_SIZES(2, 300, 401));
        if (c == SP_HALF) in[0] = tu_random(909, 2, TU_SIZES(1001, 999), EM_BF16, 1);
        ck_assert_msg(check_split_case(c, in, nin) == (c != SP_PRIME), "case %d: split or not", c);
    }
    /* dynamic sizes from the first call (a dynamic entry, at two sizes):
     * split over the inner dim */
    for (int i = 0; i < 2; i++) {
        int64_t r = i ? 777 : 1001, k = i ? 1003 : 999;
        em_tensor *in[2] = {randn(910 + i, 2, TU_SIZES(r, k)), randn(920 + i, 2, TU_SIZES(r, k))};
        ck_assert(check_split_case_at(SP_MSE, in, 2, 1));
    }
    /* EMBER_SPLIT_REDUCTIONS=0: not split, the same values */
    setenv("EMBER_SPLIT_REDUCTIONS", "0", 1);
    em_tensor *in[2] = {randn(900, 2, TU_SIZES(1001, 999)), randn(901, 2, TU_SIZES(1001, 999))};
    bool split = check_split_case(SP_MSE, in, 2);
    unsetenv("EMBER_SPLIT_REDUCTIONS");
    ck_assert(!split);
}
END_TEST

/* ---- long rows split whatever their number (EMBER_SPLIT_LONG) ---- */

static em_status long_fn(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)s;
    if (*(const int *)c == 0) out[0] = em_softmax(in[0], 1);
    else out[0] = em_mean(em_slice(em_log_softmax(in[0], -1), 1, 2, 1001, 3), 0, NULL, false);
    return out[0] ? EM_OK : em_last_status();
}

/* Case c's float64 reference over x [rows, n] (malloc'd): softmax's
 * rows, or the mean of log_softmax[:, 2:1001:3]. */
static double *long_ref(int c, const double *x, int64_t rows, int64_t n) {
    double *r = calloc((size_t)(rows * n), sizeof(double)), total = 0;
    for (int64_t i = 0; i < rows; i++) {
        const double *row = x + i * n;
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j < n; j++) m = isnan(row[j]) || isnan(m) ? NAN : fmax(m, row[j]);
        for (int64_t j = 0; j < n; j++) sum += exp(row[j] - m);
        for (int64_t j = 0; j < n; j++) r[i * n + j] = exp(row[j] - m) / sum;
        for (int64_t j = 2; j < 1001; j += 3) total += row[j] - m - log(sum);
    }
    if (c == 1) r[0] = total / (double)(rows * 333);
    return r;
}

/* Compiled with EMBER_SPLIT_LONG = limit (1000: rows of 1000 f32 bytes'
 * worth and more split, cut into parts of 250: an online softmax's
 * statistics), against float64 and eager within rtol (f32: 1e-5); whether
 * the compile split (EMBER_LOG=graph); the log must hold say when given. */
static bool check_long_case_with(int c, em_tensor *x, const char *limit, double rtol, const char *say) {
    char log[64];
    tu_log_begin("graph", log, sizeof log);
    setenv("EMBER_SPLIT_LONG", limit, 1);
    em_compile_options o = {.ninputs = 1, .noutputs = 1, .name = "long", .backend = "cpu", .eager_check = -1};
    em_compiled *f = em_compile(long_fn, &c, &o);
    em_tensor *y, *want;
    ck_assert_msg(em_call(f, &x, NULL, &y) == EM_OK, "case %d: %s", c, em_last_error());
    unsetenv("EMBER_SPLIT_LONG");
    tu_log_end();
    ck_assert_int_eq(long_fn(&c, &x, NULL, &want), EM_OK);
    double *v = tu_values(x), *r = long_ref(c, v, em_size(x, 0), em_size(x, 1));
    tu_check_close(y, r, em_ndim(want), em_sizes(want), rtol, rtol * 1e-2);
    double *e = tu_values(want);
    tu_check_close(y, e, em_ndim(want), em_sizes(want), rtol, rtol * 1e-2);
    free(v), free(r), free(e);
    em_compiled_free(f);
    char *text = tu_log_take(log);
    bool split = strstr(text, "reductions split in two") != NULL;
    ck_assert_msg(!say || strstr(text, say), "no '%s' in the log: %s", say, text);
    free(text);
    return split;
}

static bool check_long_case(int c, em_tensor *x) { return check_long_case_with(c, x, "1000", 1e-5, NULL); }

START_TEST(long_rows_split_as_an_online_softmax) {
    /* rows 0-3: a part of -inf (a masked span), a NaN, all -inf, plain;
     * rows 4-6 plain (7 rows, odd); 4000 = 16 parts of 250 */
    int64_t rows = 7, n = 4000;
    double *v = malloc(sizeof(double) * (size_t)(rows * n));
    em_tensor *r = randn(930, 2, TU_SIZES(rows, n));
    double *rv = tu_values(r);
    for (int64_t i = 0; i < rows * n; i++) v[i] = 4 * rv[i];
    for (int64_t j = 0; j < 750; j++) v[j] = -INFINITY;
    v[n + 1234] = NAN;
    for (int64_t j = 0; j < n; j++) v[2 * n + j] = -INFINITY;
    em_tensor *x = tu_tensor(v, 2, TU_SIZES(rows, n), EM_F32);
    ck_assert(check_long_case(0, x));
    /* the cross-entropy's shape, on the plain rows (a transposed input) */
    em_tensor *t = em_transpose(em_contiguous(em_transpose(em_slice(x, 0, 3, 7, 1), 0, 1)), 0, 1);
    ck_assert(check_long_case(1, t));
    /* a prime row length: no parts, not split */
    em_tensor *p = randn(931, 2, TU_SIZES(3, 4001));
    ck_assert(!check_long_case(0, p));
    /* a bf16 row loads 2 bytes an element: 4000 of them are 2000 f32
     * elements' worth, past 1000 (split), not past 3000; the result is
     * bf16, within its rounding (2^-8) of the f64 reference */
    em_tensor *h = em_cast(em_slice(x, 0, 3, 7, 1), EM_BF16);
    ck_assert(check_long_case_with(0, h, "1000", 1e-2, NULL));
    ck_assert(!check_long_case_with(0, h, "3000", 1e-2, NULL));
    /* a limit that is not a number: said, and the device's (never) used */
    ck_assert(!check_long_case_with(0, p, "many", 1e-5, "EMBER_SPLIT_LONG=many is not a number"));
    free(v), free(rv);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("fuse");
    TCase *tc = tcase_create("fuse");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, pointwise_fuses_into_one_kernel);
    tcase_add_test(tc, softmax_is_one_kernel);
    tcase_add_test(tc, a_computed_softmax_input_is_kept_between_passes);
    tcase_add_test(tc, layernorm_is_one_kernel);
    tcase_add_test(tc, transposed_operands_get_the_tile_hint);
    tcase_add_test(tc, layernorm_kernel_takes_the_mean_once);
    tcase_add_test(tc, mlp_epilogue_fuses_after_matmul);
    tcase_add_test(tc, reductions_and_leading_dims);
    tcase_add_test(tc, integers_bools_and_where);
    tcase_add_test(tc, every_pointwise_op_matches_eager);
    tcase_add_test(tc, few_row_reductions_are_split);
    tcase_add_test(tc, long_rows_split_as_an_online_softmax);
    tcase_add_test(tc, kernels_compile_in_workers_or_in_process);
    tcase_add_test(tc, worker_protocol_round_trip);
    tcase_add_test(tc, second_process_loads_kernels_from_the_cache);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    (void)CPU;
    return tu_run(suite());
}
