/* test_compile.c - em_compile: capture, entries, recompiles, the recompile
 * limit, graph breaks, replay equal to eager, logging, errors. */
#include "testutil.h"

#include <pthread.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

#include "jit.h"
#include "schedule.h"
#include "trace.h"

static const em_device CPU = {EM_CPU, 0};

/* ---- functions under test ---- */

typedef struct layer {
    em_tensor *w, *b;
} layer;

/* relu(x @ w + b), w and b reached through ctx: captured constants */
static em_status mlp_layer(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)s;
    layer *l = ctx;
    out[0] = em_relu(em_add(em_matmul(in[0], l->w), l->b));
    return out[0] ? EM_OK : em_last_status();
}

static em_status softmax_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx;
    (void)s;
    out[0] = em_softmax(in[0], -1);
    return out[0] ? EM_OK : em_last_status();
}

static em_status layer_norm_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx;
    out[0] = em_layer_norm(in[0], 1, in[1], in[2], s[0]);
    return out[0] ? EM_OK : em_last_status();
}

/* x * s0 + tanh(x) twice over (CSE merges the second tanh), plus a dead exp */
static em_tensor *dead;
static em_status cse_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx;
    em_tensor *a = em_tanh(in[0]), *b = em_tanh(in[0]);
    dead = em_exp(in[0]);
    out[0] = em_add(em_mul_scalar(a, s[0]), b);
    return out[0] ? EM_OK : em_last_status();
}

/* reads a value mid-way: a graph break */
static em_status breaking_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx;
    (void)s;
    double m;
    em_tensor *y = em_mul_scalar(in[0], 2);
    if (em_item(em_amax(y, 0, NULL, false), &m) != EM_OK) return em_last_status();
    out[0] = m > 0 ? em_sub_scalar(y, m) : y;
    return EM_OK;
}

/* random noise from the generator in ctx */
static em_status noisy_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)s;
    em_generator *g = ctx;
    out[0] = em_add(in[0], em_randn(g, em_ndim(in[0]), em_sizes(in[0]), EM_F32, CPU));
    out[1] = em_rand(g, 1, TU_SIZES(3), EM_F64, CPU);
    return out[0] && out[1] ? EM_OK : em_last_status();
}

static em_status failing_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx;
    (void)s;
    out[0] = em_add(in[0], em_ones(1, TU_SIZES(7), EM_F32, CPU)); /* shapes do not broadcast */
    return out[0] ? EM_OK : em_last_status();
}

static em_compile_options opts1(const char *name, int nin, int nscalars) {
    static const char *names[] = {"x", "w", "b"};
    em_compile_options o = {.ninputs = nin, .nscalars = nscalars, .noutputs = 1, .name = name,
                            .input_names = names};
    return o;
}

static char *printed(const em_compiled *f, int entry, bool dot) {
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    ck_assert_int_eq(em_compiled_print(f, entry, dot, fp), EM_OK);
    fclose(fp);
    return buf;
}

/* Asserts two tensors hold bitwise-identical values. */
static void check_identical(const em_tensor *a, const em_tensor *b) {
    ck_assert_int_eq(em_numel(a), em_numel(b));
    ck_assert_int_eq(em_dtype_of(a), em_dtype_of(b));
    size_t n = (size_t)em_numel(a) * em_dtype_size(em_dtype_of(a));
    char *x = malloc(n + 1), *y = malloc(n + 1);
    ck_assert_int_eq(em_copy_to_host(a, x, n), EM_OK);
    ck_assert_int_eq(em_copy_to_host(b, y, n), EM_OK);
    ck_assert(memcmp(x, y, n) == 0);
    free(x);
    free(y);
}

/* ---- golden graphs ---- */

START_TEST(golden_mlp_layer) {
    const double wv[6] = {1, -1, 0.5, 2, 0, 1}, bv[3] = {0.25, -0.5, 1};
    layer l = {tu_tensor(wv, 2, TU_SIZES(2, 3), EM_F32), tu_tensor(bv, 1, TU_SIZES(3), EM_F32)};
    em_compile_options o = opts1("mlp", 1, 0);
    em_compiled *f = em_compile(mlp_layer, &l, &o);
    em_tensor *x = tu_random(1, 2, TU_SIZES(4, 2), EM_F32, 1), *y;
    ck_assert_int_eq(em_call(f, &x, NULL, &y), EM_OK);
    char *text = printed(f, 0, false);
    ck_assert_str_eq(text,
                     "graph(%x: f32[4, 2]{2, 1}) {\n"
                     "  %1 = constant #0 : f32[2, 3]{3, 1}\n"
                     "  %2 = matmul(%x, %1) : f32[4, 3]{3, 1}\n"
                     "  %3 = constant #1 : f32[3]{1}\n"
                     "  %4 = add(%2, %3) : f32[4, 3]{3, 1}\n"
                     "  %5 = relu(%4) : f32[4, 3]{3, 1}\n"
                     "  return (%5)\n"
                     "}\n"
                     "guard input 0 (x): dtype=f32 device=cpu sizes=[4, 2] strides=[2, 1]\n");
    free(text);
    /* the values are relu(x @ w + b) */
    double *xv = tu_values(x), ref[12];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++) {
            double a = bv[j];
            for (int k = 0; k < 2; k++) a += xv[i * 2 + k] * wv[k * 3 + j];
            ref[i * 3 + j] = a > 0 ? a : 0;
        }
    tu_check_close(y, ref, 2, TU_SIZES(4, 3), 1e-6, 1e-6);
    free(xv);
    char *dot = printed(f, 0, true);
    ck_assert_msg(strstr(dot, "digraph"), "%s", dot);
    free(dot);
    em_compiled_free(f);
}
END_TEST

START_TEST(golden_softmax) {
    em_compile_options o = opts1("softmax", 1, 0);
    em_compiled *f = em_compile(softmax_fn, NULL, &o);
    em_tensor *x = tu_random(2, 2, TU_SIZES(2, 5), EM_F32, 1), *y;
    ck_assert_int_eq(em_call(f, &x, NULL, &y), EM_OK);
    char *text = printed(f, 0, false);
    ck_assert_str_eq(text,
                     "graph(%x: f32[2, 5]{5, 1}) {\n"
                     "  %1 = amax(%x) [dims=[1], keepdim=true] : f32[2, 1]{1, 1}\n"
                     "  %2 = sub(%x, %1) : f32[2, 5]{5, 1}\n"
                     "  %3 = exp(%2) : f32[2, 5]{5, 1}\n"
                     "  %4 = sum(%3) [dims=[1], keepdim=true] : f32[2, 1]{1, 1}\n"
                     "  %5 = div(%3, %4) : f32[2, 5]{5, 1}\n"
                     "  return (%5)\n"
                     "}\n"
                     "guard input 0 (x): dtype=f32 device=cpu sizes=[2, 5] strides=[5, 1]\n");
    free(text);
    em_compiled_free(f);
}
END_TEST

START_TEST(golden_layer_norm) {
    em_compile_options o = opts1("layer_norm", 3, 1);
    em_compiled *f = em_compile(layer_norm_fn, NULL, &o);
    em_tensor *in[3] = {tu_random(3, 2, TU_SIZES(3, 4), EM_F32, 1),
                        tu_random(4, 1, TU_SIZES(4), EM_F32, 1),
                        tu_random(5, 1, TU_SIZES(4), EM_F32, 1)};
    double eps = 1e-5;
    em_tensor *y;
    ck_assert_int_eq(em_call(f, in, &eps, &y), EM_OK);
    char *text = printed(f, 0, false);
    ck_assert_str_eq(text,
                     "graph(%x: f32[3, 4]{4, 1}, %w: f32[4]{1}, %b: f32[4]{1}) {\n"
                     "  %3 = mean(%x) [dims=[1], keepdim=true] : f32[3, 1]{1, 1}\n"
                     "  %4 = sub(%x, %3) : f32[3, 4]{4, 1}\n"
                     "  %5 = var(%x) [dims=[1], correction=0, keepdim=true] : f32[3, 1]{1, 1}\n"
                     "  %6 = full() [sizes=[], value=1.0000000000000001e-05, dtype=f32, "
                     "device=cpu] : f32[]{}\n"
                     "  %7 = add(%5, %6) : f32[3, 1]{1, 1}\n"
                     "  %8 = rsqrt(%7) : f32[3, 1]{1, 1}\n"
                     "  %9 = mul(%4, %8) : f32[3, 4]{4, 1}\n"
                     "  %10 = mul(%9, %w) : f32[3, 4]{4, 1}\n"
                     "  %11 = add(%10, %b) : f32[3, 4]{4, 1}\n"
                     "  return (%11)\n"
                     "}\n"
                     "guard input 0 (x): dtype=f32 device=cpu sizes=[3, 4] strides=[4, 1]\n"
                     "guard input 1 (w): dtype=f32 device=cpu sizes=[4] strides=[1]\n"
                     "guard input 2 (b): dtype=f32 device=cpu sizes=[4] strides=[1]\n"
                     "guard scalar 0 == 1.0000000000000001e-05\n");
    free(text);
    em_compiled_free(f);
}
END_TEST

/* ---- passes through em_compile ---- */

START_TEST(cse_and_dce_in_captured_graph) {
    em_compile_options o = opts1("cse", 1, 1);
    em_compiled *f = em_compile(cse_fn, NULL, &o);
    em_tensor *x = tu_random(6, 1, TU_SIZES(5), EM_F32, 1), *y;
    double s = 3;
    ck_assert_int_eq(em_call(f, &x, &s, &y), EM_OK);
    char *text = printed(f, 0, false);
    /* one tanh (CSE), no exp (DCE) */
    ck_assert_msg(strstr(text, "tanh") && !strstr(strstr(text, "tanh") + 1, "tanh("), "%s", text);
    ck_assert_msg(!strstr(text, "exp("), "%s", text);
    free(text);
    /* replay gives the same values as the eager trace */
    em_tensor *y2;
    ck_assert_int_eq(em_call(f, &x, &s, &y2), EM_OK);
    check_identical(y, y2);
    em_compile_stats st;
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.hits, 1);
    em_compiled_free(f);
}
END_TEST

/* ---- entries, recompiles, limit ---- */

START_TEST(recompiles_on_shape_dtype_stride) {
    layer l = {tu_random(7, 2, TU_SIZES(4, 4), EM_F32, 1), tu_random(8, 1, TU_SIZES(4), EM_F32, 1)};
    em_compile_options o = opts1("mlp", 1, 0);
    em_compiled *f = em_compile(mlp_layer, &l, &o);
    em_compile_stats st;
    em_tensor *y;
    em_tensor *a = tu_random(9, 2, TU_SIZES(4, 4), EM_F32, 1);
    ck_assert_int_eq(em_call(f, &a, NULL, &y), EM_OK);
    ck_assert_int_eq(em_call(f, &a, NULL, &y), EM_OK);
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.traces, 1);
    ck_assert_int_eq(st.hits, 1);
    /* shape */
    em_tensor *b = tu_random(10, 2, TU_SIZES(6, 4), EM_F32, 1);
    ck_assert_int_eq(em_call(f, &b, NULL, &y), EM_OK);
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.traces, 2);
    ck_assert_str_eq(st.last_failure, "input 0 (x): size mismatch at dim 0: expected 4, got 6");
    /* dtype: f64 x with f32 weights promotes inside; still a new entry */
    em_tensor *c = tu_random(11, 2, TU_SIZES(4, 4), EM_F64, 1);
    ck_assert_int_eq(em_call(f, &c, NULL, &y), EM_OK);
    ck_assert_int_eq(em_dtype_of(y), EM_F64);
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.traces, 3);
    ck_assert_str_eq(st.last_failure, "input 0 (x): dtype mismatch: expected f32, got f64");
    /* stride: the transpose of a 4x4 */
    em_tensor *d = em_transpose(a, 0, 1);
    ck_assert_int_eq(em_call(f, &d, NULL, &y), EM_OK);
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.traces, 4);
    ck_assert_str_eq(st.last_failure, "input 0 (x): stride mismatch at dim 0: expected 4, got 1");
    /* every earlier shape is still served by its entry */
    em_tensor *all[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++) ck_assert_int_eq(em_call(f, &all[i], NULL, &y), EM_OK);
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.traces, 4);
    ck_assert_int_eq(st.hits, 5);
    ck_assert_int_eq(st.entries, 4);
    ck_assert_int_eq(st.calls, 9);
    ck_assert_int_eq(st.eager, 0);
    em_compiled_free(f);
}
END_TEST

START_TEST(recompile_limit_falls_back_to_eager) {
    em_compile_options o = opts1("softmax", 1, 0);
    o.recompile_limit = 2;
    o.dynamic = -1; /* every size its own entry (dynamic shapes: test_dynamic) */
    em_compiled *f = em_compile(softmax_fn, NULL, &o);
    em_compile_stats st;
    em_tensor *y;
    for (int n = 1; n <= 5; n++) {
        em_tensor *x = tu_random((uint64_t)n, 2, TU_SIZES(n, 3), EM_F32, 1);
        ck_assert_int_eq(em_call(f, &x, NULL, &y), EM_OK);
        /* eager or not, the values are softmax */
        double *xv = tu_values(x), ref[15];
        for (int i = 0; i < n; i++) {
            double m = fmax(fmax(xv[3 * i], xv[3 * i + 1]), xv[3 * i + 2]), s = 0;
            for (int j = 0; j < 3; j++) s += exp(xv[3 * i + j] - m);
            for (int j = 0; j < 3; j++) ref[3 * i + j] = exp(xv[3 * i + j] - m) / s;
        }
        tu_check_close(y, ref, 2, TU_SIZES(n, 3), 1e-6, 1e-7);
        free(xv);
    }
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.calls, 5);
    ck_assert_int_eq(st.traces, 2);
    ck_assert_int_eq(st.entries, 2);
    ck_assert_int_eq(st.eager, 3);
    ck_assert_int_eq(st.hits, 0);
    ck_assert_str_eq(st.last_failure, "input 0 (x): size mismatch at dim 0: expected 2, got 5");
    /* a call matching an entry is still served by it */
    em_tensor *x1 = tu_random(99, 2, TU_SIZES(1, 3), EM_F32, 1);
    ck_assert_int_eq(em_call(f, &x1, NULL, &y), EM_OK);
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.hits, 1);
    ck_assert_int_eq(st.eager, 3);
    em_compiled_free(f);
}
END_TEST

START_TEST(recompile_limit_from_environment) {
    setenv("EMBER_RECOMPILE_LIMIT", "1", 1);
    em_compile_options o = opts1("softmax", 1, 0);
    em_compiled *f = em_compile(softmax_fn, NULL, &o);
    unsetenv("EMBER_RECOMPILE_LIMIT");
    em_tensor *y, *a = em_ones(1, TU_SIZES(2), EM_F32, CPU), *b = em_ones(1, TU_SIZES(3), EM_F32, CPU);
    ck_assert_int_eq(em_call(f, &a, NULL, &y), EM_OK);
    ck_assert_int_eq(em_call(f, &b, NULL, &y), EM_OK);
    em_compile_stats st;
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.entries, 1);
    ck_assert_int_eq(st.eager, 1);
    em_compiled_free(f);
}
END_TEST

START_TEST(scalar_arguments_are_guarded) {
    em_compile_options o = opts1("cse", 1, 1);
    em_compiled *f = em_compile(cse_fn, NULL, &o);
    em_tensor *x = tu_random(12, 1, TU_SIZES(4), EM_F32, 1), *y;
    double s = 2;
    ck_assert_int_eq(em_call(f, &x, &s, &y), EM_OK);
    s = 5;
    ck_assert_int_eq(em_call(f, &x, &s, &y), EM_OK);
    em_compile_stats st;
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.traces, 2);
    ck_assert_str_eq(st.last_failure, "scalar 0: value mismatch: expected 2, got 5");
    /* the value is baked into the graph: the result uses 5 */
    double *xv = tu_values(x), ref[4];
    for (int i = 0; i < 4; i++) ref[i] = tanh(xv[i]) * 5 + tanh(xv[i]);
    tu_check_close(y, ref, 1, TU_SIZES(4), 1e-5, 1e-6);
    free(xv);
    em_compiled_free(f);
}
END_TEST

/* ---- replay equals eager ---- */

START_TEST(replay_matches_eager_bitwise) {
    layer l = {tu_random(13, 2, TU_SIZES(16, 8), EM_F32, 1), tu_random(14, 1, TU_SIZES(8), EM_F32, 1)};
    em_compile_options o = opts1("mlp", 1, 0);
    o.backend = "replay"; /* the reference backend: bit for bit eager */
    em_compiled *f = em_compile(mlp_layer, &l, &o);
    em_tensor *x = tu_random(15, 2, TU_SIZES(5, 16), EM_F32, 1), *y0, *y1, *y2;
    ck_assert_int_eq(mlp_layer(&l, &x, NULL, &y0), EM_OK); /* plain eager */
    ck_assert_int_eq(em_call(f, &x, NULL, &y1), EM_OK);     /* trace */
    ck_assert_int_eq(em_call(f, &x, NULL, &y2), EM_OK);     /* replay */
    check_identical(y0, y1);
    check_identical(y0, y2);
    em_compiled_free(f);
}
END_TEST

/* Every call draws what eager code draws (lazy_trace 1: the draws are made
 * once, while recording, and the first call's outputs come from lazy mode,
 * since the entry would draw again). */
static void check_random_like_eager(int lazy_trace, uint64_t seed) {
    em_generator *ge = em_generator_new(seed), *gc = em_generator_new(seed);
    em_compile_options o = {.ninputs = 1, .noutputs = 2, .name = "noisy", .lazy_trace = lazy_trace};
    em_compiled *f = em_compile(noisy_fn, gc, &o);
    em_tensor *x = tu_random(16, 2, TU_SIZES(3, 4), EM_F32, 1);
    for (int call = 0; call < 3; call++) {
        em_tensor *e[2], *c[2];
        ck_assert_int_eq(noisy_fn(ge, &x, NULL, e), EM_OK);
        ck_assert_int_eq(em_call(f, &x, NULL, c), EM_OK);
        check_identical(e[0], c[0]);
        check_identical(e[1], c[1]);
        ck_assert_int_eq(em_generator_offset(ge), em_generator_offset(gc));
    }
    em_compile_stats st;
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.hits, 2);
    em_compiled_free(f);
    em_generator_free(ge);
    em_generator_free(gc);
}

START_TEST(random_ops_advance_the_generator_like_eager) {
    check_random_like_eager(-1, 77);
    check_random_like_eager(1, 78);
}
END_TEST

/* ---- graph breaks ---- */

/* With an eager trace the first call runs fn eagerly; with a lazy one the
 * read computes what it reads (lazy mode).  Either way the outputs are
 * computed before em_call returns, and later calls run as segments. */
static void check_graph_break(int lazy_trace) {
    em_compile_options o = opts1("breaking", 1, 0);
    o.lazy_trace = lazy_trace;
    em_compiled *f = em_compile(breaking_fn, NULL, &o);
    const double v[3] = {1, -2, 3};
    em_tensor *x = tu_tensor(v, 1, TU_SIZES(3), EM_F32), *y;
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(em_call(f, &x, NULL, &y), EM_OK);
        ck_assert_ptr_nonnull(y->storage);
        double ref[3] = {2 - 6, -4 - 6, 6 - 6};
        tu_check_close(y, ref, 1, TU_SIZES(3), 0, 0);
    }
    em_compile_stats st;
    em_compiled_stats(f, &st);
    ck_assert(st.broken);
    ck_assert_int_eq(st.entries, 0);
    ck_assert_int_eq(st.eager, 1);     /* the call that found the break */
    ck_assert_int_eq(st.segmented, 2); /* the others: segments around the read */
    ck_assert_int_eq(st.traces, 0);
    ck_assert(!em_lazy_active());
    em_compiled_free(f);
}

START_TEST(graph_break_runs_as_segments_from_then_on) {
    check_graph_break(-1);
    check_graph_break(0); /* a dry trace finds the read and is done again eagerly */
    check_graph_break(1);
}
END_TEST

/* ---- dry traces (lazy_trace = 0, the default on CPU inputs) ---- */

/* An allocator that counts the bytes it holds and their peak (blocks carry
 * their size in a 64-byte header). */
typedef struct peak_alloc {
    long live, peak;
} peak_alloc;

static void *peak_alloc_fn(void *ud, size_t size, size_t align) {
    peak_alloc *pa = ud;
    if (align > 64) return NULL;
    unsigned char *p = aligned_alloc(64, (size + 64 + 63) / 64 * 64);
    if (!p) return NULL;
    memcpy(p, &size, sizeof size);
    pa->live += (long)size;
    if (pa->live > pa->peak) pa->peak = pa->live;
    return p + 64;
}

static void peak_free_fn(void *ud, void *q) {
    if (!q) return;
    unsigned char *p = (unsigned char *)q - 64;
    size_t size;
    memcpy(&size, p, sizeof size);
    ((peak_alloc *)ud)->live -= (long)size;
    free(p);
}

#define DRY_LINKS 120

/* h = (h * 0.5 + 0.25) repeated: DRY_LINKS * 2 intermediates of x's size. */
static em_status long_chain_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx, (void)s;
    em_tensor *h = in[0];
    for (int i = 0; i < DRY_LINKS && h; i++) h = em_add_scalar(em_mul_scalar(h, 0.5), 0.25);
    out[0] = h;
    return h ? EM_OK : em_last_status();
}

/* The first call of a CPU entry computes nothing while it records: its
 * peak memory is the compiled run's, not one buffer per op as an eager
 * trace's (lazy_trace -1), and its values are the compiled entry's. */
START_TEST(a_dry_first_trace_holds_no_intermediates) {
    enum { R = 64, C = 257 }; /* 66 KB a tensor */
    em_tensor *x = tu_random(31, 2, TU_SIZES(R, C), EM_F32, 2), *y;
    double *ref = tu_values(x);
    for (int i = 0; i < R * C; i++)
        for (int l = 0; l < DRY_LINKS; l++) ref[i] = ref[i] * 0.5 + 0.25;
    long bytes = (long)sizeof(float) * R * C, peak[2];
    for (int mode = 0; mode >= -1; mode--) {
        em_compile_options o = opts1("chain", 1, 0);
        o.lazy_trace = mode;
        em_compiled *f = em_compile(long_chain_fn, NULL, &o);
        ck_assert_ptr_nonnull(f);
        peak_alloc pa = {0, 0};
        em_allocator a = {peak_alloc_fn, peak_free_fn, &pa};
        const em_allocator *saved = em_get_allocator();
        em_set_allocator(&a);
        em_scope_begin();
        em_status st = em_call(f, &x, NULL, &y);
        if (st == EM_OK) tu_check_close(y, ref, 2, TU_SIZES(R, C), 1e-6, 1e-6);
        em_scope_end();
        em_set_allocator(saved);
        ck_assert_int_eq(st, EM_OK);
        ck_assert_int_eq(pa.live, 0);
        peak[-mode] = pa.peak;
        em_compile_stats cs;
        em_compiled_stats(f, &cs);
        ck_assert_int_eq(cs.traces, 1);
        ck_assert_int_eq(cs.eager, 0);
        em_compiled_free(f);
    }
    /* dry: the output and a few buffers; eager: every one of the 240 ops' */
    ck_assert_msg(peak[0] < 16 * bytes, "dry trace peaked at %ld bytes (%ld a tensor)", peak[0], bytes);
    ck_assert_msg(peak[1] > 2 * DRY_LINKS * bytes / 2, "eager trace peaked at only %ld bytes", peak[1]);
    free(ref);
}
END_TEST

/* ---- lazy traces (lazy_trace = 1; the default on CUDA inputs) ---- */

static int64_t deferred_ops(void) {
    em_lazy_stats ls;
    ck_assert_int_eq(em_lazy_get_stats(&ls), EM_OK);
    return ls.ops_deferred;
}

/* The first call records softmax's ops without computing them, compiles,
 * and gives the compiled entry's values; lazy_trace = -1 runs fn eagerly. */
START_TEST(lazy_trace_records_then_runs_the_entry) {
    em_tensor *x = tu_random(21, 2, TU_SIZES(5, 33), EM_F32, 3), *y, *ref;
    ck_assert_int_eq(softmax_fn(NULL, &x, NULL, &ref), EM_OK);
    double *r = tu_values(ref);
    for (int mode = -1; mode <= 1; mode += 2) {
        em_compile_options o = opts1("softmax", 1, 0);
        o.lazy_trace = mode;
        em_compiled *f = em_compile(softmax_fn, NULL, &o);
        int64_t before = deferred_ops();
        em_lazy_stats l0, l1;
        ck_assert_int_eq(em_lazy_get_stats(&l0), EM_OK);
        for (int call = 0; call < 2; call++) {
            ck_assert_int_eq(em_call(f, &x, NULL, &y), EM_OK);
            ck_assert_ptr_nonnull(y->storage); /* computed before em_call returns */
            tu_check_close(y, r, 2, TU_SIZES(5, 33), 1e-6, 1e-7);
        }
        ck_assert_int_eq(em_lazy_get_stats(&l1), EM_OK);
        if (mode > 0) {
            ck_assert_int_ge(deferred_ops() - before, 4); /* amax, sub, exp, sum, div */
            ck_assert_int_eq(l1.flushes, l0.flushes);     /* the entry computed them */
        } else {
            ck_assert_int_eq(deferred_ops(), before);
        }
        em_compile_stats st;
        em_compiled_stats(f, &st);
        ck_assert_int_eq(st.traces, 1);
        ck_assert_int_eq(st.hits, 1);
        ck_assert_int_gt(st.kernels, 0);
        em_compiled_free(f);
    }
    free(r);
}
END_TEST

/* ---- in-place writes (index_copy_): a KV cache in a graph (issue 20) ---- */

/* A decoder step's cache traffic: reads the cache (ctx) before writing row
 * pos of it and of the input cache cin, then reads both after.  out0
 * (computed before the writes, returned after them) must hold the old
 * values, out1 the new ones. */
static em_status cache_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)s;
    em_tensor *cache = ctx, *x = in[0], *pos = in[1], *cin = in[2];
    em_tensor *before = em_mul_scalar(cache, 2);
    em_status st = em_index_copy_(cache, 0, pos, em_add_scalar(x, 1));
    if (st == EM_OK) st = em_index_copy_(cin, 0, pos, em_exp(x));
    if (st != EM_OK) return st;
    out[0] = em_add_scalar(before, 1);
    out[1] = em_add(em_sum(cache, 1, (int[]){0}, false), em_sum(cin, 1, (int[]){0}, false));
    return out[0] && out[1] ? EM_OK : em_last_status();
}

/* Writes into a tensor the function computed: a graph break, eager values. */
static em_status write_computed_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx, (void)s;
    em_tensor *t = em_mul_scalar(in[0], 2);
    em_status st = em_index_copy_(t, 0, in[1], em_exp(em_slice(in[0], 0, 0, 1, 1)));
    out[0] = st == EM_OK ? em_add_scalar(t, 1) : NULL;
    return out[0] ? EM_OK : em_last_status();
}

enum { CR = 4, CC = 6 };

/* A fill read before and after a write (as layer norm's epsilon is in
 * every layer of a decoder): out0 = x + 0.5, then cache row pos = x, then
 * out1 = column sums of the cache * 0.5. */
static em_status fill_across_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)s;
    em_tensor *cache = ctx, *x = in[0], *half = em_scalar(0.5, EM_F32, CPU);
    out[0] = em_add(x, half);
    em_status st = em_index_copy_(cache, 0, in[1], x);
    out[1] = st == EM_OK ? em_mul(em_sum(cache, 1, (int[]){0}, false), em_scalar(0.5, EM_F32, CPU)) : NULL;
    return st != EM_OK ? st : out[0] && out[1] ? EM_OK : em_last_status();
}

/* Four calls (pos 0..3, then 1 again) of cache_fn as mode runs it
 * (0 em_compile, 1 em_compile with lazy_trace 1, 2 the replay backend,
 * 3 lazy mode on the eager function), against float64. */
static void check_cache_calls(int mode) {
    em_tensor *cache = tu_random(900, 2, TU_SIZES(CR, CC), EM_F32, 1);
    em_tensor *cin = tu_random(901, 2, TU_SIZES(CR, CC), EM_F32, 1);
    double *cr = tu_values(cache), *ci = tu_values(cin);
    em_compile_options o = {.ninputs = 3, .noutputs = 2, .name = "cache",
                            .lazy_trace = mode == 1 ? 1 : 0, .backend = mode == 2 ? "replay" : NULL};
    em_compiled *f = mode < 3 ? em_compile(cache_fn, cache, &o) : NULL;
    const int poss[] = {0, 1, 2, 3, 1};
    for (int call = 0; call < 5; call++) {
        em_scope_begin();
        em_tensor *x = tu_random(910 + call, 2, TU_SIZES(1, CC), EM_F32, 1);
        em_tensor *in[3] = {x, em_scalar(poss[call], EM_I64, CPU), cin}, *out[2];
        double *xv = tu_values(x), want0[CR * CC], want1[CC] = {0};
        for (int i = 0; i < CR * CC; i++) want0[i] = 2 * cr[i] + 1;
        for (int j = 0; j < CC; j++) {
            cr[poss[call] * CC + j] = xv[j] + 1;
            ci[poss[call] * CC + j] = exp(xv[j]);
        }
        for (int r = 0; r < CR; r++)
            for (int j = 0; j < CC; j++) want1[j] += cr[r * CC + j] + ci[r * CC + j];
        if (mode < 3) {
            ck_assert_msg(em_call(f, in, NULL, out) == EM_OK, "mode %d call %d: %s", mode, call, em_last_error());
        } else {
            ck_assert_int_eq(em_lazy_begin(), EM_OK);
            ck_assert_int_eq(cache_fn(cache, in, NULL, out), EM_OK);
            ck_assert_int_eq(em_lazy_end(), EM_OK);
        }
        tu_check_close(out[0], want0, 2, TU_SIZES(CR, CC), 1e-6, 1e-6);
        tu_check_close(out[1], want1, 1, TU_SIZES(CC), 1e-5, 1e-6);
        tu_check_close(cache, cr, 2, TU_SIZES(CR, CC), 1e-6, 1e-7);
        tu_check_close(cin, ci, 2, TU_SIZES(CR, CC), 1e-6, 1e-7);
        free(xv);
        em_scope_end();
    }
    if (f) {
        em_compile_stats st;
        em_compiled_stats(f, &st);
        ck_assert_msg(st.traces == 1 && st.hits == 4 && !st.broken, "mode %d: traces %lld hits %lld",
                      mode, (long long)st.traces, (long long)st.hits);
        if (mode < 2) ck_assert_int_gt(st.kernels, 0);
        char *text = printed(f, 0, false);
        ck_assert_msg(strstr(text, "index_copy_(%") != NULL, "%s", text);
        free(text);
        em_compiled_free(f);
    }
    free(cr);
    free(ci);
    em_release(cache);
    em_release(cin);
}

/* A value that reads no memory (a fill) is recomputed on both sides of a
 * write, not stored by a kernel of its own. */
START_TEST(fills_are_not_stored_across_writes) {
    em_tensor *cache = tu_random(930, 2, TU_SIZES(CR, CC), EM_F32, 1);
    double *cr = tu_values(cache);
    em_compile_options o = {.ninputs = 2, .noutputs = 2, .name = "fill_across", .backend = "cpu"};
    em_compiled *f = em_compile(fill_across_fn, cache, &o);
    for (int call = 0; call < 2; call++) {
        em_scope_begin();
        em_tensor *x = tu_random(931 + call, 2, TU_SIZES(1, CC), EM_F32, 1), *out[2];
        em_tensor *in[2] = {x, em_scalar(call + 1, EM_I64, CPU)};
        double *xv = tu_values(x), want0[CC], want1[CC] = {0};
        for (int j = 0; j < CC; j++) want0[j] = xv[j] + 0.5, cr[(call + 1) * CC + j] = xv[j];
        for (int r = 0; r < CR; r++)
            for (int j = 0; j < CC; j++) want1[j] += 0.5 * cr[r * CC + j];
        ck_assert_msg(em_call(f, in, NULL, out) == EM_OK, "call %d: %s", call, em_last_error());
        tu_check_close(out[0], want0, 2, TU_SIZES(1, CC), 1e-6, 1e-7);
        tu_check_close(out[1], want1, 1, TU_SIZES(CC), 1e-5, 1e-6);
        free(xv);
        em_scope_end();
    }
    em_compile_stats st;
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.hits, 1);
    em_compiled_free(f);
    /* the schedule: the fill (one node after cse) is not stored */
    em_tensor *in[2] = {tu_random(933, 2, TU_SIZES(1, CC), EM_F32, 1), em_scalar(0, EM_I64, CPU)}, *out[2];
    tr_recorder *r = tr_record_begin(2, in, NULL);
    ck_assert_int_eq(fill_across_fn(cache, in, NULL, out), EM_OK);
    char why[128] = "";
    tr_graph *g = tr_record_end(r, 2, out, why, sizeof why);
    ck_assert_msg(g && tr_optimize(g, true) == EM_OK, "%s %s", why, em_last_error());
    sc_schedule *s = sc_build(g);
    ck_assert_ptr_nonnull(s);
    int fills = 0;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].kind == TR_CALL && g->nodes[i].op == EM_OP_FULL) {
            fills++;
            ck_assert_msg(!s->materialized[i], "the fill %%%d is stored", i);
        }
    ck_assert_int_eq(fills, 1);
    sc_free(s);
    tr_graph_free(g);
    free(cr);
    em_release(cache);
}
END_TEST

START_TEST(in_place_writes_keep_their_order_in_graphs) {
    for (int mode = 0; mode <= 3; mode++) check_cache_calls(mode);
    /* a write into a computed tensor breaks the graph; values stay eager's */
    em_compile_options o = {.ninputs = 2, .noutputs = 1, .name = "write_computed"};
    em_compiled *f = em_compile(write_computed_fn, NULL, &o);
    em_tensor *x = tu_random(920, 2, TU_SIZES(3, 2), EM_F32, 1);
    em_tensor *in[2] = {x, em_scalar(1, EM_I64, CPU)}, *y;
    double *xv = tu_values(x), want[6];
    for (int i = 0; i < 6; i++) want[i] = (i / 2 == 1 ? exp(xv[i % 2]) : 2 * xv[i]) + 1;
    for (int call = 0; call < 2; call++) {
        ck_assert_msg(em_call(f, in, NULL, &y) == EM_OK, "call %d: %s", call, em_last_error());
        tu_check_close(y, want, 2, TU_SIZES(3, 2), 1e-6, 1e-7);
    }
    em_compile_stats st;
    em_compiled_stats(f, &st);
    ck_assert(st.broken);
    em_compiled_free(f);
    free(xv);
}
END_TEST

/* ---- em_compile under EMBER_JIT=1 (issue 21, item 1) ----
 *
 * Each case runs on a fresh thread, so that the function's first op is the
 * thread's first dispatch: under EMBER_JIT=1 that used to start lazy mode
 * inside the trace, whose recorder then missed every op and captured the
 * first call's pending result as a constant (later calls returned it). */

/* a copy: the function's only op is applied to its input */
static em_status copy_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx;
    (void)s;
    out[0] = em_contiguous(in[0]);
    return out[0] ? EM_OK : em_last_status();
}

/* softmax(x * w) with w reached through ctx: in lazy mode a pending tensor */
static em_status weighted_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)s;
    out[0] = em_softmax(em_mul(in[0], *(em_tensor **)ctx), -1);
    return out[0] ? EM_OK : em_last_status();
}

typedef struct jit_case {
    em_fn fn;
    bool softmax;       /* the reference: softmax of x * w (w: 1 unless weighted) */
    bool weighted;
    int async, lazy_trace;
    int failures;
    char first[512];    /* the first failure */
} jit_case;

static void case_fail(jit_case *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void case_fail(jit_case *c, const char *fmt, ...) {
    if (c->failures++) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->first, sizeof c->first, fmt, ap);
    va_end(ap);
}

enum { JIT_R = 4, JIT_C = 6, JIT_LAYOUTS = 5 };

/* Call `call`'s input, made without any op before the first call (the
 * values change every call): contiguous [4, 6], a transpose (not
 * contiguous), a broadcast row expanded to [4, 6], and size-1 dims
 * [1, 6] and [4, 1].  x gets the values row-major, *r x *c. */
static em_tensor *jit_input(int call, double *x, int *r, int *c) {
    int layout = call % JIT_LAYOUTS;
    *r = layout == 3 ? 1 : JIT_R;
    *c = layout == 4 ? 1 : JIT_C;
    float buf[JIT_R * JIT_C];
    for (int i = 0; i < *r; i++)
        for (int j = 0; j < *c; j++) {
            int k = layout == 2 ? j : i * *c + j; /* a broadcast row repeats */
            x[i * *c + j] = 3 * sin(0.37 * k + 1.3 * call);
        }
    if (layout == 1) { /* stored [c, r], read through a transpose */
        for (int i = 0; i < *r; i++)
            for (int j = 0; j < *c; j++) buf[j * *r + i] = (float)x[i * *c + j];
        return em_transpose(em_from_data(buf, EM_F32, 2, TU_SIZES(*c, *r), CPU), 0, 1);
    }
    int rows = layout == 2 ? 1 : *r;
    for (int i = 0; i < rows * *c; i++) buf[i] = (float)x[i];
    em_tensor *t = em_from_data(buf, EM_F32, 2, TU_SIZES(rows, *c), CPU);
    return layout == 2 ? em_expand(t, 2, TU_SIZES(*r, *c)) : t;
}

/* The reference in float64 (r x *m): softmax over the last dim of x * w
 * (a [4, 1] x broadcasts against w to [4, 6]), or x. */
static void jit_reference(const jit_case *c, const double *x, const double *w, int r, int n,
                          int *m, double *ref) {
    *m = c->weighted ? JIT_C : n;
    for (int i = 0; i < r; i++) {
        double *row = &ref[i * *m], mx = -INFINITY, sum = 0;
        for (int j = 0; j < *m; j++) row[j] = c->weighted ? x[i * n + (n == 1 ? 0 : j)] * w[j] : x[i * n + j];
        if (!c->softmax) continue;
        for (int j = 0; j < *m; j++) mx = fmax(mx, row[j]);
        for (int j = 0; j < *m; j++) sum += exp(row[j] - mx);
        for (int j = 0; j < *m; j++) row[j] = exp(row[j] - mx) / sum;
    }
}

static void jit_check(jit_case *c, int call, const em_tensor *y, const double *ref, int r, int n) {
    float v[JIT_R * JIT_C];
    if (!y->storage) case_fail(c, "call %d: the output is not computed", call);
    if (em_copy_to_host(y, v, sizeof(float) * (size_t)(r * n)) != EM_OK) {
        case_fail(c, "call %d: read: %s", call, em_last_error());
        return;
    }
    for (int i = 0; i < r * n; i++)
        if (fabs(v[i] - ref[i]) > 1e-6 + 1e-5 * fabs(ref[i]))
            case_fail(c, "call %d (layout %d), element %d: got %.6g, want %.6g", call,
                      call % JIT_LAYOUTS, i, v[i], ref[i]);
}

static void *jit_case_body(void *arg) {
    jit_case *c = arg;
    em_scope_begin();
    double wv[JIT_C];
    em_tensor *w = NULL;
    if (c->weighted) { /* pending in lazy mode: half of w0 */
        float w0[JIT_C];
        for (int j = 0; j < JIT_C; j++) w0[j] = (float)(j + 1), wv[j] = 0.5 * (j + 1);
        w = em_mul_scalar(em_from_data(w0, EM_F32, 1, TU_SIZES(JIT_C), CPU), 0.5);
        if (w && w->storage) case_fail(c, "the weight is not pending: lazy mode is off");
    }
    em_compile_options o = opts1("under_jit", 1, 0);
    o.async_compile = c->async ? 1 : -1;
    o.lazy_trace = c->lazy_trace;
    em_compiled *f = em_compile(c->fn, &w, &o);
    for (int call = 0; f && call < 40; call++) {
        em_scope_begin();
        double x[JIT_R * JIT_C], ref[JIT_R * JIT_C];
        int r, n, m;
        em_tensor *in = jit_input(call, x, &r, &n), *y = NULL;
        /* every other round of layouts passes a pending input */
        if ((call / JIT_LAYOUTS) % 2) in = em_add_scalar(in, 0);
        jit_reference(c, x, wv, r, n, &m, ref);
        if (em_call(f, &in, NULL, &y) != EM_OK)
            case_fail(c, "call %d: %s", call, em_last_error());
        else
            jit_check(c, call, y, ref, r, m);
        em_scope_end();
    }
    char *text = f ? printed(f, 0, false) : NULL;
    if (!c->weighted && text && strstr(text, "constant"))
        case_fail(c, "the input's result became a constant:\n%s", text);
    free(text);
    em_compiled_free(f);
    em_scope_end();
    return NULL;
}

static double *softmax_reference(const em_tensor *x);

/* softmax of its input with lazy mode begun inside: over the recorder,
 * lazy mode would take the ops the trace must see */
static em_status lazy_inside_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx;
    (void)s;
    bool lazy = em_lazy_begin() == EM_OK;
    out[0] = em_softmax(in[0], -1);
    if (lazy) em_lazy_end();
    return out[0] ? EM_OK : em_last_status();
}

/* em_lazy_begin inside a traced function is refused; the trace records
 * the function's ops, and every call gets its own values. */
START_TEST(lazy_mode_cannot_start_inside_a_trace) {
    em_compile_options o = opts1("lazy_inside", 1, 0);
    em_compiled *f = em_compile(lazy_inside_fn, NULL, &o);
    for (int call = 0; call < 4; call++) {
        em_tensor *x = tu_random(90 + (uint64_t)call, 2, TU_SIZES(3, 5), EM_F32, 2), *y;
        ck_assert_int_eq(em_call(f, &x, NULL, &y), EM_OK);
        double *ref = softmax_reference(x);
        tu_check_close(y, ref, 2, TU_SIZES(3, 5), 1e-5, 1e-6);
        free(ref);
    }
    char *text = printed(f, 0, false);
    ck_assert_msg(!strstr(text, "constant") && strstr(text, "exp("), "%s", text);
    free(text);
    ck_assert(!em_lazy_active());
    em_compiled_free(f);
}
END_TEST

/* The same function called 40 times with changing values under
 * EMBER_JIT=1, with and without async compile, traced eagerly and
 * lazily: every call gives float64's values. */
START_TEST(compiled_functions_under_ember_jit_give_each_calls_values) {
    setenv("EMBER_JIT", "1", 1);
    const struct { em_fn fn; bool softmax, weighted; } fns[] = {
        {softmax_fn, true, false}, {copy_fn, false, false}, {weighted_fn, true, true}};
    for (int async = 0; async <= 1; async++) {
        if (async) setenv("EMBER_ASYNC_COMPILE", "1", 1); /* lazy mode's too */
        for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
            for (int lt = -1; lt <= 1; lt += 2) {
                jit_case c = {fns[i].fn, fns[i].softmax, fns[i].weighted, async, lt, 0, ""};
                pthread_t th;
                ck_assert_int_eq(pthread_create(&th, NULL, jit_case_body, &c), 0);
                pthread_join(th, NULL);
                ck_assert_msg(c.failures == 0, "function %zu, async %d, lazy_trace %d: %d failures; "
                              "first: %s", i, async, lt, c.failures, c.first);
            }
        }
    }
    unsetenv("EMBER_ASYNC_COMPILE");
    unsetenv("EMBER_JIT");
}
END_TEST

/* ---- the allocator travels with the object (issue 21, item 12) ---- */


/* softmax over the last dim of x's values, in float64 */
static double *softmax_reference(const em_tensor *x) {
    double *v = tu_values(x);
    int64_t n = em_size(x, -1), rows = em_numel(x) / n;
    for (int64_t r = 0; r < rows; r++) {
        double *row = &v[r * n], mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < n; j++) mx = fmax(mx, row[j]);
        for (int64_t j = 0; j < n; j++) sum += exp(row[j] - mx);
        for (int64_t j = 0; j < n; j++) row[j] = exp(row[j] - mx) / sum;
    }
    return v;
}

/* Calls f under allocator `calls` with 24 batch sizes (a dynamic entry,
 * its memo of sizes full, then sizes it computes for one call only) and
 * a transposed input (another entry), checking values. */
static void calls_under(em_compiled *f, const em_allocator *calls) {
    const em_allocator *saved = em_get_allocator();
    em_set_allocator(calls);
    for (int call = 0; call < 26; call++) {
        em_scope_begin();
        em_tensor *x = call < 24 ? tu_random(40 + call, 2, TU_SIZES(2 + call, 9), EM_F32, 2)
                                 : em_transpose(tu_random(80 + call, 2, TU_SIZES(9, 5), EM_F32, 2), 0, 1);
        em_tensor *y;
        ck_assert_msg(em_call(f, &x, NULL, &y) == EM_OK, "call %d: %s", call, em_last_error());
        double *ref = softmax_reference(x);
        tu_check_close(y, ref, 2, em_sizes(x), 1e-5, 1e-6);
        free(ref);
        em_scope_end();
    }
    em_set_allocator(saved);
}

static void check_clean(const char *what, tu_tagged *t) {
    ck_assert_msg(atomic_load(&t->foreign) == 0, "%s: %ld frees of another allocator's blocks",
                  what, atomic_load(&t->foreign));
    ck_assert_msg(atomic_load(&t->live) == 0, "%s: %ld blocks never freed", what,
                  atomic_load(&t->live));
}

/* A compiled function made under one allocator, called under another and
 * freed under a third (the default) frees everything it owns with the
 * one that made it: no block goes to the wrong allocator, in any order,
 * with and without async compile. */
START_TEST(a_compiled_function_frees_with_the_allocator_that_made_it) {
    for (int order = 0; order < 3; order++) {
        tu_tagged ta = {0xA110CA7A, 0, 0}, tb = {0xA110CA7B, 0, 0};
        em_allocator a = {tu_tagged_alloc, tu_tagged_free, &ta},
                     b = {tu_tagged_alloc, tu_tagged_free, &tb};
        /* 0: made under a, called under b; 1: made under the default,
         * called under a; 2: 0 with async compile */
        const em_allocator *made = order == 1 ? NULL : &a, *calls = order == 1 ? &a : &b;
        em_set_allocator(made);
        em_compile_options o = opts1("softmax", 1, 0);
        o.async_compile = order == 2 ? 1 : -1;
        o.recompile_limit = 4;
        em_compiled *f = em_compile(softmax_fn, NULL, &o);
        em_set_allocator(NULL);
        ck_assert_ptr_nonnull(f);
        calls_under(f, calls);
        em_compile_stats st;
        em_compiled_stats(f, &st);
        if (order != 2) ck_assert_int_ge(st.dynamic_entries, 1); /* async: maybe still compiling */
        em_set_allocator(order == 1 ? &b : NULL); /* freed under yet another */
        em_compiled_free(f);
        em_set_allocator(NULL);
        check_clean("the allocator that made it", order == 1 ? &tb : &ta);
        check_clean("the allocator of the calls", order == 1 ? &ta : &tb);
    }
}
END_TEST

/* ---- every error return sets the message (issue 21, item 14) ---- */

/* fails without setting an error: em_call must still report one */
static em_status silent_fail_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx;
    (void)in;
    (void)s;
    out[0] = NULL;
    return EM_ERR_ARG;
}

/* a shape error half way through, after a value was read */
static em_status late_fail_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx;
    (void)s;
    double v;
    if (em_item(em_sum(in[0], 0, NULL, false), &v) != EM_OK) return em_last_status();
    out[0] = em_add(in[0], em_ones(1, TU_SIZES(7), EM_F32, CPU));
    return out[0] ? EM_OK : em_last_status();
}

static uint64_t fuzz_next(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Whatever a call returns, a failure is em_last_status() with a message. */
#define FUZZ_CHECK(step, what, s)                                                          \
    ck_assert_msg((s) == EM_OK || (em_last_status() == (s) && em_last_error()[0]),         \
                  "step %d, %s returned %s, but em_last_status() is %s and the message '%s'", \
                  step, what, em_status_name(s), em_status_name(em_last_status()), em_last_error())

/* One random input: a good one, NULL, another dtype or rank, a pending
 * one (in lazy mode), a non-contiguous or a broadcast one. */
static em_tensor *fuzz_input(uint64_t *x) {
    switch (fuzz_next(x) % 7) {
    case 0: return NULL;
    case 1: return tu_random(fuzz_next(x), 1, TU_SIZES(5), EM_F64, 1);
    case 2: return tu_random(fuzz_next(x), 2, TU_SIZES(1 + (int64_t)(fuzz_next(x) % 3), 7), EM_F32, 1);
    case 3: return em_add_scalar(tu_random(fuzz_next(x), 2, TU_SIZES(3, 7), EM_F32, 1), 1);
    case 4: return em_transpose(tu_random(fuzz_next(x), 2, TU_SIZES(7, 3), EM_F32, 1), 0, 1);
    case 5: return em_expand(tu_random(fuzz_next(x), 2, TU_SIZES(1, 7), EM_F32, 1), 2, TU_SIZES(4, 7));
    default: return tu_random(fuzz_next(x), 2, TU_SIZES(3, 7), EM_F32, 1);
    }
}

/* A random sequence of compiles (good and bad options), calls (good,
 * failing and silent functions; bad arguments), statistics, prints,
 * saves, frees and lazy-mode switches: every non-OK return comes with
 * em_last_status() equal to it and a message. */
START_TEST(random_api_sequences_set_a_message_with_every_error) {
    em_fn fns[] = {softmax_fn, failing_fn, silent_fail_fn, late_fail_fn, breaking_fn, copy_fn};
    em_compiled *fs[4] = {0};
    uint64_t x = 0x9E3779B97F4A7C15ull;
    int lazy = 0;
    for (int step = 0; step < 1500; step++) {
        em_scope_begin();
        em_clear_error();
        int k = (int)(fuzz_next(&x) % 4), what = (int)(fuzz_next(&x) % 10);
        em_status s = EM_OK;
        if (what == 0 || !fs[k]) {
            em_compiled_free(fs[k]);
            em_compile_options o = opts1("fz", 1, 0);
            o.recompile_limit = (int)(fuzz_next(&x) % 4) - (fuzz_next(&x) % 8 == 0);
            o.async_compile = (int)(fuzz_next(&x) % 3) - 1;
            o.lazy_trace = (int)(fuzz_next(&x) % 3) - 1;
            o.dynamic = (int)(fuzz_next(&x) % 3) - 1;
            if (fuzz_next(&x) % 8 == 0) o.backend = fuzz_next(&x) % 2 ? "replay" : "nope";
            if (fuzz_next(&x) % 10 == 0) o.noutputs = 0;
            fs[k] = em_compile(fns[fuzz_next(&x) % (sizeof fns / sizeof fns[0])], NULL, &o);
            if (!fs[k]) FUZZ_CHECK(step, "em_compile", em_last_status() ? em_last_status() : EM_ERR_STATE);
        } else if (what <= 5) {
            em_tensor *in = fuzz_input(&x), *y = NULL;
            em_clear_error(); /* an input that failed to build is not the call's error */
            s = em_call(fs[k], fuzz_next(&x) % 20 ? &in : NULL, NULL, fuzz_next(&x) % 20 ? &y : NULL);
            FUZZ_CHECK(step, "em_call", s);
        } else if (what == 6) {
            em_compile_stats st;
            s = em_compiled_stats(fuzz_next(&x) % 10 ? fs[k] : NULL, fuzz_next(&x) % 10 ? &st : NULL);
            FUZZ_CHECK(step, "em_compiled_stats", s);
            FILE *null = fopen("/dev/null", "w");
            s = em_compiled_print(fs[k], (int)(fuzz_next(&x) % 4) - 1, fuzz_next(&x) % 2, null);
            fclose(null);
            FUZZ_CHECK(step, "em_compiled_print", s);
        } else if (what == 7) {
            s = em_compiled_save(fs[k], fuzz_next(&x) % 2 ? "" : "/nonexistent/dir/list.txt");
            FUZZ_CHECK(step, "em_compiled_save", s);
        } else if (what == 8) {
            bool begin = fuzz_next(&x) % 2;
            s = begin ? em_lazy_begin() : em_lazy_end();
            FUZZ_CHECK(step, begin ? "em_lazy_begin" : "em_lazy_end", s);
            if (s == EM_OK) lazy += begin ? 1 : -1;
        } else {
            s = fuzz_next(&x) % 2 ? em_sync() : em_realize(NULL);
            FUZZ_CHECK(step, "em_sync/em_realize", s);
            em_lazy_stats ls;
            s = em_lazy_get_stats(fuzz_next(&x) % 2 ? &ls : NULL);
            FUZZ_CHECK(step, "em_lazy_get_stats", s);
        }
        em_scope_end();
    }
    while (lazy-- > 0) em_lazy_end();
    for (int k = 0; k < 4; k++) em_compiled_free(fs[k]);
}
END_TEST

/* ---- logging ---- */


START_TEST(ember_log_reports_graph_recompiles_breaks_and_limit) {
    char path[64];
    tu_log_begin("graph,guards,recompiles,breaks,bogus", path, sizeof path);
    em_compile_options o = opts1("softmax", 1, 0);
    o.recompile_limit = 1;
    em_compiled *f = em_compile(softmax_fn, NULL, &o);
    em_compile_options ob = opts1("breaking", 1, 0);
    em_compiled *fb = em_compile(breaking_fn, NULL, &ob);
    tu_log_end();
    em_tensor *y, *a = em_ones(1, TU_SIZES(2), EM_F32, CPU), *b = em_ones(1, TU_SIZES(3), EM_F32, CPU);
    ck_assert_int_eq(em_call(f, &a, NULL, &y), EM_OK);
    ck_assert_int_eq(em_call(f, &b, NULL, &y), EM_OK);
    ck_assert_int_eq(em_call(f, &b, NULL, &y), EM_OK);
    ck_assert_int_eq(em_call(fb, &a, NULL, &y), EM_OK);
    em_compiled_free(f);
    em_compiled_free(fb);
    char *log = tu_log_take(path);
    ck_assert_msg(strstr(log, "[ember] EMBER_LOG: unknown option 'bogus'"), "%s", log);
    ck_assert_msg(strstr(log, "[ember] captured graph of softmax (entry 1):\ngraph(%x: f32[2]{1}) {"),
                  "%s", log);
    ck_assert_msg(strstr(log, "[ember] guards of softmax (entry 1):\nguard input 0 (x)"), "%s", log);
    const char *lim = "[ember] softmax hit the recompile limit (1 entries); calls that match no "
                      "entry run eagerly. Last failure: input 0 (x): size mismatch at dim 0: "
                      "expected 2, got 3\n";
    ck_assert_msg(strstr(log, lim), "%s", log);
    ck_assert_msg(strstr(strstr(log, lim) + strlen(lim), "recompile limit") == NULL, "logged twice: %s", log);
    ck_assert_msg(strstr(log, "[ember] graph break in breaking: em_item reads the values of %"),
                  "%s", log);
    ck_assert_msg(strstr(log, "(amax) while tracing; breaking runs as compiled segments around its "
                              "reads from now on (lazy mode)"), "%s", log);
    free(log);
}
END_TEST

START_TEST(recompile_is_logged_with_reason) {
    char path[64];
    tu_log_begin("recompiles", path, sizeof path);
    em_compile_options o = opts1("softmax", 1, 0);
    em_compiled *f = em_compile(softmax_fn, NULL, &o);
    tu_log_end();
    em_tensor *y, *a = em_ones(1, TU_SIZES(2), EM_F32, CPU), *b = em_ones(1, TU_SIZES(2), EM_F64, CPU);
    ck_assert_int_eq(em_call(f, &a, NULL, &y), EM_OK);
    ck_assert_int_eq(em_call(f, &b, NULL, &y), EM_OK);
    em_compiled_free(f);
    char *log = tu_log_take(path);
    ck_assert_str_eq(log, "[ember] recompiling softmax (entry 2 of at most 8): input 0 (x): "
                          "dtype mismatch: expected f32, got f64\n");
    free(log);
}
END_TEST

/* ---- errors ---- */

START_TEST(bad_options_and_calls) {
    em_compile_options o = opts1("f", 1, 0);
    em_clear_error();
    ck_assert_ptr_null(em_compile(NULL, NULL, &o));
    ck_assert_int_eq(em_last_status(), EM_ERR_NULL);
    ck_assert_ptr_null(em_compile(softmax_fn, NULL, NULL));
    ck_assert_int_eq(em_last_status(), EM_ERR_NULL);
    em_compile_options bad = o;
    bad.noutputs = 0;
    ck_assert_ptr_null(em_compile(softmax_fn, NULL, &bad));
    ck_assert_int_eq(em_last_status(), EM_ERR_ARG);
    bad = o;
    bad.ninputs = 65;
    ck_assert_ptr_null(em_compile(softmax_fn, NULL, &bad));
    bad = o;
    bad.backend = "triton";
    ck_assert_ptr_null(em_compile(softmax_fn, NULL, &bad));
    ck_assert_msg(strstr(em_last_error(), "unknown backend 'triton' (available: auto, cpu, cuda, replay)"), "%s",
                  em_last_error());
    bad = o;
    bad.lazy_trace = 2;
    ck_assert_ptr_null(em_compile(softmax_fn, NULL, &bad));
    ck_assert_msg(strstr(em_last_error(), "lazy_trace (2)"), "%s", em_last_error());
    bad = o;
    bad.recompile_limit = -1;
    ck_assert_ptr_null(em_compile(softmax_fn, NULL, &bad));
    const char *dup[2] = {"x", "x"};
    bad = opts1("f", 2, 0);
    bad.input_names = dup;
    ck_assert_ptr_null(em_compile(softmax_fn, NULL, &bad));
    ck_assert_msg(strstr(em_last_error(), "repeated"), "%s", em_last_error());
    const char *nonid[1] = {"my x"};
    bad = opts1("f", 1, 0);
    bad.input_names = nonid;
    ck_assert_ptr_null(em_compile(softmax_fn, NULL, &bad));

    em_compiled *f = em_compile(softmax_fn, NULL, &o);
    em_tensor *y = (em_tensor *)1, *nul = NULL;
    ck_assert_int_eq(em_call(NULL, &nul, NULL, &y), EM_ERR_NULL);
    ck_assert_int_eq(em_call(f, NULL, NULL, &y), EM_ERR_NULL);
    ck_assert_ptr_null(y);
    em_clear_error();
    ck_assert_int_eq(em_call(f, &nul, NULL, &y), EM_ERR_NULL);
    ck_assert_msg(strstr(em_last_error(), "softmax") || strstr(em_last_error(), "x"), "%s",
                  em_last_error());
    em_tensor *x = em_ones(1, TU_SIZES(2), EM_F32, CPU);
    ck_assert_int_eq(em_call(f, &x, NULL, NULL), EM_ERR_NULL);
    em_compile_stats st;
    ck_assert_int_eq(em_compiled_stats(f, NULL), EM_ERR_NULL);
    ck_assert_int_eq(em_compiled_stats(NULL, &st), EM_ERR_NULL);
    ck_assert_int_eq(em_compiled_print(f, 0, false, stdout), EM_ERR_INDEX); /* no entry yet */
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.calls, 0);
    em_compiled_free(f);
    em_compiled_free(NULL);
}
END_TEST

START_TEST(function_errors_propagate_and_add_no_entry) {
    em_compile_options o = opts1("failing", 1, 0);
    em_compiled *f = em_compile(failing_fn, NULL, &o);
    em_tensor *x = em_ones(1, TU_SIZES(3), EM_F32, CPU), *y = (em_tensor *)1;
    em_clear_error();
    ck_assert_int_eq(em_call(f, &x, NULL, &y), EM_ERR_SHAPE);
    ck_assert_ptr_null(y);
    ck_assert_msg(strstr(em_last_error(), "do not broadcast"), "%s", em_last_error());
    em_compile_stats st;
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.entries, 0);
    em_compiled_free(f);
}
END_TEST

/* ---- ownership and threads ---- */

START_TEST(outputs_belong_to_the_callers_scope) {
    em_compile_options o = opts1("softmax", 1, 0);
    em_compiled *f = em_compile(softmax_fn, NULL, &o);
    ck_assert_int_eq(em_scope_end(), EM_OK); /* no scope: the caller owns outputs */
    em_tensor *x = em_arange(0, 4, 1, EM_F32, CPU), *y;
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(em_call(f, &x, NULL, &y), EM_OK);
        double s;
        em_scope_begin();
        ck_assert_int_eq(em_item(em_sum(y, 0, NULL, false), &s), EM_OK);
        em_scope_end();
        ck_assert(fabs(s - 1) < 1e-6);
        em_release(y);
    }
    em_release(x);
    em_scope_begin();
    em_compiled_free(f);
}
END_TEST

typedef struct worker {
    em_compiled *f;
    int n;
    int ok;
} worker;

static void *work(void *p) {
    worker *w = p;
    em_scope_begin();
    for (int i = 0; i < 50; i++) {
        em_scope_begin();
        int64_t n = 2 + (i + w->n) % 3;
        em_tensor *x = em_arange(0, (double)n, 1, EM_F32, em_cpu()), *y;
        double s;
        if (em_call(w->f, &x, NULL, &y) == EM_OK && em_item(em_sum(y, 0, NULL, false), &s) == EM_OK &&
            fabs(s - 1) < 1e-6)
            w->ok++;
        em_scope_end();
    }
    em_scope_end();
    return NULL;
}

START_TEST(concurrent_calls) {
    em_compile_options o = opts1("softmax", 1, 0);
    em_compiled *f = em_compile(softmax_fn, NULL, &o);
    pthread_t t[4];
    worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (worker){f, i, 0};
        pthread_create(&t[i], NULL, work, &w[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        ck_assert_int_eq(w[i].ok, 50);
    }
    em_compile_stats st;
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.calls, 200);
    /* three sizes: a static entry for the first, a dynamic one for the rest */
    ck_assert_int_eq(st.traces, 2);
    ck_assert_int_eq(st.hits, 198);
    em_compiled_free(f);
}
END_TEST

static em_compiled *inner_f;
static em_status outer_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx;
    (void)s;
    em_tensor *t;
    em_status st = em_call(inner_f, in, NULL, &t);
    if (st != EM_OK) return st;
    out[0] = em_mul_scalar(t, 2);
    return EM_OK;
}

START_TEST(nested_compiled_call_is_inlined) {
    em_compile_options oi = opts1("inner", 1, 0), oo = opts1("outer", 1, 0);
    inner_f = em_compile(softmax_fn, NULL, &oi);
    em_compiled *outer = em_compile(outer_fn, NULL, &oo);
    em_tensor *x = tu_random(18, 1, TU_SIZES(3), EM_F32, 1), *y;
    ck_assert_int_eq(em_call(outer, &x, NULL, &y), EM_OK);
    char *text = printed(outer, 0, false);
    ck_assert_msg(strstr(text, "amax(%x)") && strstr(text, "mul("), "%s", text);
    ck_assert_msg(!strstr(text, "constant"), "the inner result leaked in as a constant: %s", text);
    free(text);
    em_compiled_free(outer);
    em_compiled_free(inner_f);
}
END_TEST


/* relu(x) @ w, relu'd again: two fused groups with the same kernel (same
 * IR, buffers of one layout), as a model's repeated layers give. */
static em_status twice_relu_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx, (void)s;
    out[0] = em_relu(em_matmul(em_relu(in[0]), in[1]));
    return out[0] ? EM_OK : em_last_status();
}

/* Identical kernels of one graph compile once (issue 22, item 4): the
 * second is loaded from the cache the first was stored in; the values are
 * right; a second compiled function finds the plan and both kernels. */
START_TEST(identical_kernels_of_a_graph_compile_once) {
    char dir[] = "/tmp/ember-dedupe-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    setenv("EMBER_CACHE_DIR", dir, 1); /* a fresh cache: this test's counts only */
    em_tensor *in[2] = {tu_random(5, 2, TU_SIZES(8, 8), EM_F32, 1), tu_random(6, 2, TU_SIZES(8, 8), EM_F32, 1)};
    em_compile_options o = {.ninputs = 2, .noutputs = 1, .name = "twice_relu"};
    for (int process = 0; process < 2; process++) {
        em_compiled *f = em_compile(twice_relu_fn, NULL, &o);
        em_tensor *y;
        ck_assert_msg(em_call(f, in, NULL, &y) == EM_OK, "%s", em_last_error());
        double *x = tu_values(in[0]), *w = tu_values(in[1]), ref[64];
        for (int i = 0; i < 8; i++) {
            for (int j = 0; j < 8; j++) {
                double acc = 0;
                for (int k = 0; k < 8; k++) acc += fmax(x[i * 8 + k], 0) * w[k * 8 + j];
                ref[i * 8 + j] = fmax(acc, 0);
            }
        }
        tu_check_close(y, ref, 2, TU_SIZES(8, 8), 1e-5, 1e-6);
        free(x), free(w);
        em_compile_stats st;
        ck_assert_int_eq(em_compiled_stats(f, &st), EM_OK);
        ck_assert_int_eq(st.kernels, 2);
        /* first: one compile, the twin loaded; later: the plan and both kernels */
        ck_assert_int_eq(st.kernels_compiled, process == 0 ? 1 : 0);
        ck_assert_int_eq(st.kernels_loaded, process == 0 ? 1 : 2);
        em_compiled_free(f);
    }
    char rm[100];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(rm), 0);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("compile");
    TCase *tc = tcase_create("capture");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_add_test(tc, golden_mlp_layer);
    tcase_add_test(tc, golden_softmax);
    tcase_add_test(tc, golden_layer_norm);
    tcase_add_test(tc, cse_and_dce_in_captured_graph);
    tcase_add_test(tc, nested_compiled_call_is_inlined);
    suite_add_tcase(s, tc);
    tc = tcase_create("entries");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_add_test(tc, recompiles_on_shape_dtype_stride);
    tcase_add_test(tc, recompile_limit_falls_back_to_eager);
    tcase_add_test(tc, recompile_limit_from_environment);
    tcase_add_test(tc, scalar_arguments_are_guarded);
    tcase_add_test(tc, replay_matches_eager_bitwise);
    tcase_add_test(tc, random_ops_advance_the_generator_like_eager);
    tcase_add_test(tc, graph_break_runs_as_segments_from_then_on);
    tcase_add_test(tc, lazy_trace_records_then_runs_the_entry);
    tcase_add_test(tc, a_dry_first_trace_holds_no_intermediates);
    tcase_add_test(tc, compiled_functions_under_ember_jit_give_each_calls_values);
    tcase_add_test(tc, lazy_mode_cannot_start_inside_a_trace);
    tcase_add_test(tc, a_compiled_function_frees_with_the_allocator_that_made_it);
    suite_add_tcase(s, tc);
    tc = tcase_create("runtime");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_add_test(tc, ember_log_reports_graph_recompiles_breaks_and_limit);
    tcase_add_test(tc, recompile_is_logged_with_reason);
    tcase_add_test(tc, bad_options_and_calls);
    tcase_add_test(tc, random_api_sequences_set_a_message_with_every_error);
    tcase_add_test(tc, function_errors_propagate_and_add_no_entry);
    tcase_add_test(tc, outputs_belong_to_the_callers_scope);
    tcase_add_test(tc, concurrent_calls);
    tcase_add_test(tc, identical_kernels_of_a_graph_compile_once);
    tcase_add_test(tc, in_place_writes_keep_their_order_in_graphs);
    tcase_add_test(tc, fills_are_not_stored_across_writes);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run(suite()); }
