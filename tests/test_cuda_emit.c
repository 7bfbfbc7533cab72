/* test_cuda_emit.c - the CUDA C printer (cuda_emit.c) without a GPU: real
 * graphs are recorded on the CPU, fused and lowered as the "cuda" backend
 * does, printed, and compiled by NVRTC to PTX and to an sm_90 cubin.  Only
 * libnvrtc is needed; without it the program skips (exit 77). */
#include <string.h>
#include <sys/wait.h>

#include "config.h"
#ifdef HAVE_VALGRIND_VALGRIND_H
#include <valgrind/valgrind.h> /* RUNNING_ON_VALGRIND */
#else
#define RUNNING_ON_VALGRIND 0
#endif
#include "cpu_gccjit.h"
#include "cuda_eager.h"
#include "cuda_emit.h"
#include "cuda_kernel.h"
#include "schedule.h"
#include "testutil.h"
#include "trace.h"

#include "../bench/workloads.h"

typedef em_status (*fn_t)(void *, em_tensor *const *, const double *, em_tensor **);

/* Every unary op, then every binary op and comparison, in one graph. */
static em_status everything(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    em_tensor *(*un[])(const em_tensor *) = {em_neg, em_abs, em_exp, em_log, em_sqrt, em_rsqrt,
                                             em_sin, em_cos, em_tanh, em_sigmoid, em_relu,
                                             em_gelu, em_gelu_tanh, em_erf};
    em_tensor *(*bin[])(const em_tensor *, const em_tensor *) = {
        em_add, em_sub, em_mul, em_div, em_pow, em_maximum, em_minimum};
    em_tensor *x = in[0];
    for (size_t i = 0; i < sizeof un / sizeof un[0]; i++) x = em_add(x, un[i](in[0]));
    for (size_t i = 0; i < sizeof bin / sizeof bin[0]; i++) x = em_add(x, bin[i](in[0], in[1]));
    em_tensor *m = em_where(em_lt(in[0], in[1]), x, em_cast(em_ge(x, in[1]), em_dtype_of(x)));
    out[0] = em_add(m, em_cast(em_eq(in[0], in[1]), em_dtype_of(x)));
    return out[0] ? EM_OK : em_last_status();
}

/* Integer arithmetic, casts to and from every dtype, reductions of each. */
static em_status integers(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    em_tensor *i = em_cast(in[0], EM_I32), *l = em_cast(in[0], EM_I64), *b = em_cast(in[0], EM_BOOL);
    em_tensor *x = em_add(em_mul(em_abs(i), em_neg(i)), em_relu(i));
    em_tensor *y = em_sub(em_maximum(l, em_cast(x, EM_I64)), em_minimum(l, l));
    em_tensor *z = em_add(em_cast(y, EM_F64), em_cast(em_mul(b, b), EM_F64));
    out[0] = em_add(em_cast(z, EM_F32), em_cast(em_amax(b, 1, (int[]){-1}, true), EM_F32));
    out[1] = em_sum(i, 1, (int[]){-1}, false);
    out[2] = em_amin(l, 1, (int[]){-1}, false);
    return out[0] && out[1] && out[2] ? EM_OK : em_last_status();
}

/* Records fn on the CPU and returns its graph. */
static tr_graph *record(fn_t fn, int nin, em_tensor **in, int nout) {
    em_tensor *out[4] = {0};
    tr_recorder *r = tr_record_begin(nin, in, NULL);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(fn(NULL, in, NULL, out), EM_OK);
    char why[256] = "";
    tr_graph *g = tr_record_end(r, nout, out, why, sizeof why);
    ck_assert_msg(g != NULL, "no graph: %s %s", why, em_last_error());
    return g;
}

/* Under valgrind an NVRTC compile takes about a minute (NVRTC's own code
 * on valgrind's CPU) and check-valgrind runs in CI's time: the tests that
 * compile many texts of one kind then compile a sample of them (every text
 * is still printed and checked as text; the host code valgrind watches is
 * the same for each compile). */
static bool sample_nvrtc(void) { return RUNNING_ON_VALGRIND != 0; }

static bool have_nvrtc(void) {
#ifdef EMBER_HAVE_CUDA
    return cuda_nvrtc_version() != NULL;
#else
    return false;
#endif
}

#ifdef EMBER_HAVE_CUDA
/* NVRTC on text as the device compiles it: behind cuda_text_with_key's
 * EM_AFTER_PRIOR definition and checks (a zero key). */
static em_status nvrtc(const char *text, const char *name, int arch, bool ptx, void **bin, size_t *n) {
    static const uint8_t key[16];
    cuda_src src = {.text = (char *)text, .shape = CU_SERIAL, .threads = 1, .unroll = 1, .extent_size = -1};
    char *keyed = cuda_text_with_key(&src, name, key);
    em_status s = keyed ? cuda_nvrtc_compile(keyed, name, arch, ptx, bin, n) : em_last_status();
    em_free(keyed);
    return s;
}
#endif

/* Prints and compiles every kernel of fn's graph; returns the shapes seen
 * (bit CU_* set) and checks the text holds `want` when given. */
static unsigned compile_all(fn_t fn, int nin, em_tensor **in, int nout, const char *want) {
    tr_graph *g = record(fn, nin, in, nout);
    sc_schedule *s = sc_build_for(g, true); /* the CUDA device fuses half values */
    ck_assert_ptr_nonnull(s);
    unsigned shapes = 0;
    int *bufs = malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    for (int gi = 0; gi < s->ngroups; gi++) {
        int nbufs, nouts;
        k_kernel *k = sc_lower(s, gi, bufs, &nbufs, &nouts);
        ck_assert_msg(k != NULL, "%s", em_last_error());
        cuda_src src;
        ck_assert_msg(cuda_emit(k, &src) == EM_OK, "%s", em_last_error());
        shapes |= 1u << src.shape;
        if (want) ck_assert_msg(strstr(src.text, want), "no '%s' in:\n%s", want, src.text);
        ck_assert(strstr(src.text, "INFINITY") == NULL);
#ifdef EMBER_HAVE_CUDA
        for (int ptx = 0; ptx < 2; ptx++) {
            void *bin = NULL;
            size_t n = 0;
            em_status st = nvrtc(src.text, k->name, 90, ptx, &bin, &n);
            ck_assert_msg(st == EM_OK, "%s\n%s", em_last_error(), src.text);
            ck_assert(n > 100);
            if (ptx) ck_assert(strstr(bin, ".entry k") != NULL);
            em_free(bin);
        }
#endif
        cuda_src_free(&src);
        kir_free(k);
    }
    free(bufs);
    sc_free(s);
    tr_graph_free(g);
    return shapes;
}

START_TEST(pointwise_is_flat) {
    int64_t n = 1000;
    em_tensor *in[3] = {tu_random(1, 1, &n, EM_F32, 1), tu_random(2, 1, &n, EM_F32, 1),
                        tu_random(3, 1, &n, EM_F32, 1)};
    ck_assert_uint_eq(compile_all(wl_pointwise_fn, 3, in, 1, "__restrict__"), 1u << CU_FLAT);
    ck_assert_uint_eq(compile_all(wl_pointwise_fn, 3, in, 1, "tanhf("), 1u << CU_FLAT);
}
END_TEST

static em_status row_sum(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    out[0] = em_sum(em_exp(in[0]), 1, (int[]){-1}, false); /* a row-scope store */
    return out[0] ? EM_OK : em_last_status();
}

static em_status log_softmax_rows(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    out[0] = em_log_softmax(in[0], -1);
    return out[0] ? EM_OK : em_last_status();
}

/* A cluster kernel's text with its launch descriptor (whose last word is
 * the cluster size) compiles to an sm_90 cubin and to PTX that syncs the
 * cluster and, where it combines partials, reads other blocks' shared
 * memory (mapa). */
static void compile_cluster_kernel(const cuda_src *src, const char *name) {
#ifdef EMBER_HAVE_CUDA
    static const uint8_t key[16];
    char *keyed = cuda_text_with_key(src, name, key), launch[64];
    snprintf(launch, sizeof launch, "%d, %d};", src->nsizes, src->cluster);
    ck_assert_msg(keyed && strstr(keyed, launch), "%.300s", keyed ? launch : em_last_error());
    for (int ptx = 0; ptx < 2; ptx++) {
        void *bin = NULL;
        size_t n = 0;
        ck_assert_msg(cuda_nvrtc_compile(keyed, name, 90, ptx, &bin, &n) == EM_OK, "%.3000s", em_last_error());
        if (ptx)
            ck_assert(strstr(bin, "barrier.cluster") &&
                      (!strstr(src->text, "em_cluster_reduce(a") || strstr(bin, "mapa.u64")));
        em_free(bin);
    }
    em_free(keyed);
#else
    (void)src, (void)name;
#endif
}

/* Prints every kernel of fn's graph for sm_90 (cuda_emit_for) and checks
 * it against cuda_emit's text: a kernel of clusters (the most blocks of
 * any kernel, returned) uses them and, when compile is set (NVRTC takes
 * seconds on these texts, minutes under valgrind), compiles with its
 * launch descriptor to an sm_90 cubin and to PTX (*reduced counts those that
 * combine partials over the cluster); every other kernel's text is
 * cuda_emit's, as is every kernel's for sm_80. */
static int cluster_blocks(fn_t fn, int nin, em_tensor **in, int *reduced, bool compile) {
    tr_graph *g = record(fn, nin, in, 1);
    sc_schedule *s = sc_build_for(g, true);
    ck_assert_ptr_nonnull(s);
    int most = 0;
    for (int gi = 0; gi < s->ngroups; gi++) {
        int nbufs, nouts;
        int *bufs = malloc(sizeof(int) * ((size_t)g->nnodes + 1));
        k_kernel *k = sc_lower(s, gi, bufs, &nbufs, &nouts);
        ck_assert_msg(k != NULL, "%s", em_last_error());
        cuda_src plain, sm80, sm90;
        ck_assert_int_eq(cuda_emit(k, &plain), EM_OK);
        ck_assert_int_eq(cuda_emit_for(k, 80, &sm80), EM_OK);
        ck_assert_int_eq(cuda_emit_for(k, 90, &sm90), EM_OK);
        ck_assert_str_eq(sm80.text, plain.text);
        ck_assert_int_eq(sm80.cluster, 1);
        if (sm90.cluster > 1) {
            ck_assert_int_eq(sm90.shape, CU_ROWS);
            ck_assert_msg(strstr(sm90.text, "__clusterRelativeBlockRank()"), "%.3000s", sm90.text);
            if (strstr(sm90.text, "em_cluster_reduce(a")) ++*reduced;
            ck_assert_int_le(sm90.threads, 1024);
            if (compile) compile_cluster_kernel(&sm90, k->name);
        } else {
            ck_assert_int_eq(sm90.cluster, 1);
            ck_assert_str_eq(sm90.text, plain.text);
        }
        if (sm90.cluster > most) most = sm90.cluster;
        cuda_src_free(&plain), cuda_src_free(&sm80), cuda_src_free(&sm90);
        kir_free(k);
        free(bufs);
    }
    sc_free(s);
    tr_graph_free(g);
    return most;
}

/* Rows longer than a block holds in registers (more than 1024 threads at
 * 32 elements, or in a bf16 kernel's vector variant 64) split over a
 * cluster for sm_90: blocks of 256 threads, doubled until at most 8 blocks
 * hold the row (f32 50257: 7 x 256, 100003: 7 x 512), past 1024 threads
 * more than 8 (262147: 9 x 1024, not portable); bf16 50257 still fits one
 * block.  softmax, log_softmax, layer_norm, a row sum; shorter rows (4099,
 * 32768) keep one block and cuda_emit's text. */
START_TEST(long_rows_use_clusters) {
    static const struct { int64_t n; int blocks[2]; } cases[] = {
        {50257, {7, 1}}, {100003, {7, 7}}, {262147, {9, 5}}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        for (int h = 0; h < 2; h++) {
            em_dtype dt = h ? EM_BF16 : EM_F32;
            /* 64 rows: fewer, on so long a row, reduce eagerly (schedule.c) */
            em_tensor *x[1] = {tu_random(1, 2, TU_SIZES(64, cases[i].n), dt, 1)};
            int reduced = 0;
            bool compile = !sample_nvrtc() || (i == 0 && h == 0);
            ck_assert_int_eq(cluster_blocks(wl_softmax_fn, 1, x, &reduced, compile), cases[i].blocks[h]);
            ck_assert_int_eq(cluster_blocks(log_softmax_rows, 1, x, &reduced, false), cases[i].blocks[h]);
            ck_assert_int_ge(reduced, cases[i].blocks[h] > 1 ? 2 : 0);
            if (i != (size_t)h) continue; /* f32 50257 and bf16 100003 for the rest */
            ck_assert_int_gt(cluster_blocks(row_sum, 1, x, &reduced, false), 1);
            em_tensor *ln[3] = {x[0], tu_random(2, 1, TU_SIZES(cases[i].n), dt, 1),
                                tu_random(3, 1, TU_SIZES(cases[i].n), dt, 1)};
            ck_assert_int_gt(cluster_blocks(wl_layernorm_fn, 3, ln, &reduced, !sample_nvrtc()), 1);
            ck_assert_int_ge(reduced, 4);
        }
    }
    int reduced = 0;
    em_tensor *fits[1] = {tu_random(1, 2, TU_SIZES(2, 32768), EM_F32, 1)};
    ck_assert_int_eq(cluster_blocks(wl_softmax_fn, 1, fits, &reduced, false), 1);
    em_tensor *few[1] = {tu_random(1, 2, TU_SIZES(3, 50257), EM_F32, 1)}; /* eager max and sum */
    ck_assert_int_eq(cluster_blocks(wl_softmax_fn, 1, few, &reduced, !sample_nvrtc()), 7);
    em_tensor *short_rows[1] = {tu_random(1, 2, TU_SIZES(5, 4099), EM_BF16, 1)};
    ck_assert_int_eq(cluster_blocks(wl_softmax_fn, 1, short_rows, &reduced, false), 1);
    em_tensor *narrow[1] = {tu_random(1, 2, TU_SIZES(9, 37), EM_F32, 1)};
    ck_assert_int_eq(cluster_blocks(row_sum, 1, narrow, &reduced, false), 1);
    ck_assert_int_eq(reduced, 0);
}
END_TEST

START_TEST(softmax_is_rows) {
    em_tensor *in[1] = {tu_random(1, 2, TU_SIZES(8, 300), EM_F32, 1)};
    /* rows a warp covers: a warp a row, 8 rows a block, shuffles only */
    ck_assert_uint_eq(compile_all(wl_softmax_fn, 1, in, 1, "em_warp_reduce(a"), 1u << CU_ROWS);
    ck_assert_uint_eq(compile_all(wl_softmax_fn, 1, in, 1, "(threadIdx.x >> 5)"), 1u << CU_ROWS);
    em_tensor *wide[1] = {tu_random(1, 2, TU_SIZES(4, 4099), EM_F32, 1)};
    ck_assert_uint_eq(compile_all(wl_softmax_fn, 1, wide, 1, "em_block_reduce(a"), 1u << CU_ROWS);
    em_tensor *narrow[1] = {tu_random(1, 2, TU_SIZES(9, 37), EM_F32, 1)};
    ck_assert_uint_eq(compile_all(row_sum, 1, narrow, 1, "if (em_live && em_t == 0)"), 1u << CU_ROWS);
    /* the second read of x comes from registers, the stash stays in them */
    ck_assert_uint_eq(compile_all(wl_softmax_fn, 1, in, 1, "= rc0[it"), 1u << CU_ROWS);
    /* 16-byte steps: a row of 4099 starts off a vector boundary in most
     * rows (a head and a tail); short rows share a warp (4 lanes a 37-wide
     * f32 row, shuffles over 4 lanes); bf16 rows move 8 halves a step */
    ck_assert_uint_eq(compile_all(wl_softmax_fn, 1, wide, 1, "k_v4("), 1u << CU_ROWS);
    ck_assert_uint_eq(compile_all(wl_softmax_fn, 1, wide, 1, "v11 < em_h &&"), 1u << CU_ROWS);
    ck_assert_uint_eq(compile_all(wl_softmax_fn, 1, wide, 1, "reinterpret_cast<const float4 *>(p0 + (v5 + em_h))"),
                      1u << CU_ROWS);
    ck_assert_uint_eq(compile_all(row_sum, 1, narrow, 1, "em_warp_reduce(a7, em_add(), 4)"), 1u << CU_ROWS);
    em_tensor *half[1] = {tu_random(1, 2, TU_SIZES(70, 1000), EM_BF16, 1)};
    ck_assert_uint_eq(compile_all(wl_softmax_fn, 1, half, 1, "const uint4 L"), 1u << CU_ROWS);
    em_tensor *in64[1] = {tu_random(1, 3, TU_SIZES(2, 3, 5), EM_F64, 1)};
    ck_assert_uint_eq(compile_all(wl_softmax_fn, 1, in64, 1, "double"), 1u << CU_ROWS);
}
END_TEST

static em_status transpose_add(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    out[0] = em_add(em_transpose(in[0], -2, -1), in[1]);
    return out[0] ? EM_OK : em_last_status();
}

/* A transposed operand goes through shared-memory tiles (odd sizes, a
 * batch dim, a broadcast operand, bf16); a plain add of two contiguous
 * tensors is not tiled. */
START_TEST(transpose_is_tiled) {
    em_tensor *in[2] = {tu_random(1, 2, TU_SIZES(45, 37), EM_F32, 1),
                        tu_random(2, 2, TU_SIZES(37, 45), EM_F32, 1)};
    ck_assert_uint_eq(compile_all(transpose_add, 2, in, 1, "em_tl"), 1u << CU_ROWS);
    em_tensor *half[2] = {tu_random(3, 3, TU_SIZES(3, 33, 70), EM_BF16, 1),
                          tu_random(4, 2, TU_SIZES(1, 33), EM_BF16, 1)};
    ck_assert_uint_eq(compile_all(transpose_add, 2, half, 1, "__shared__ unsigned short em_tl"),
                      1u << CU_ROWS);
}
END_TEST

START_TEST(layernorm_compiles) {
    em_tensor *in[3] = {tu_random(1, 2, TU_SIZES(4, 64), EM_F32, 1),
                        tu_random(2, 1, TU_SIZES(64), EM_F32, 1),
                        tu_random(3, 1, TU_SIZES(64), EM_F32, 1)};
    ck_assert(compile_all(wl_layernorm_fn, 3, in, 1, NULL) & (1u << CU_ROWS));
}
END_TEST

/* Views of fused values and rows of reductions without keepdim
 * (schedule.c's choose_views and lead values): kernels that index their
 * loads by positions of their own (a slice's start and step, a
 * transpose, a reshape's divisions) print and compile like the others. */
static em_status views_and_lead_rows(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    int last = -1;
    em_tensor *l = em_slice(em_log_softmax(in[0], -1), 1, 3, 203, 2); /* [R, 100] */
    em_tensor *m = em_mean(in[0], 1, &last, false);
    em_tensor *centered = em_sub(in[0], em_unsqueeze(m, -1)); /* [R, C] */
    em_tensor *rows = em_add(m, em_var(in[0], 1, &last, 1, false)); /* [R] */
    em_tensor *t = em_reshape(em_transpose(em_exp(centered), 0, 1), 2,
                              TU_SIZES(em_size(in[0], 0), em_size(in[0], 1)));
    out[0] = em_mul_scalar(l, 2);
    out[1] = em_add(t, em_unsqueeze(rows, -1));
    return out[0] && out[1] ? EM_OK : em_last_status();
}

START_TEST(views_and_lead_rows_compile) {
    em_tensor *in[1] = {tu_random(1, 2, TU_SIZES(37, 301), EM_F32, 1)};
    ck_assert(compile_all(views_and_lead_rows, 1, in, 2, NULL) & (1u << CU_ROWS));
}
END_TEST

START_TEST(every_alu_op) {
    em_dtype dts[] = {EM_F32, EM_F64};
    for (int i = 0; i < 2; i++) {
        em_tensor *in[2] = {tu_random(1, 2, TU_SIZES(3, 7), dts[i], 1),
                            tu_random(2, 2, TU_SIZES(3, 7), dts[i], 1)};
        ck_assert(compile_all(everything, 2, in, 1, NULL) != 0);
    }
    em_tensor *x[1] = {tu_random(3, 2, TU_SIZES(5, 9), EM_F32, 10)};
    ck_assert(compile_all(integers, 1, x, 3, "= (int)v") != 0);
}
END_TEST

/* Half buffers: every op fused and computed in f32 between a converting
 * load and store, casts between half and every dtype, softmax's rows. */
static em_status half_casts(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    em_dtype other = em_dtype_of(in[0]) == EM_F16 ? EM_BF16 : EM_F16;
    em_tensor *x = em_add(em_cast(in[0], EM_F64), em_cast(em_cast(in[0], EM_I32), EM_F64));
    em_tensor *b = em_cast(em_gt(in[0], in[1]), em_dtype_of(in[0]));
    out[0] = em_add(em_cast(em_cast(x, other), em_dtype_of(in[0])), b);
    out[1] = em_cast(em_sum(in[0], 1, (int[]){-1}, false), EM_BOOL);
    return out[0] && out[1] ? EM_OK : em_last_status();
}

START_TEST(half_kernels_compile) {
    em_dtype dts[] = {EM_F16, EM_BF16};
    const char *to[] = {"em_to_f16(", "em_to_bf16("};
    for (int i = 0; i < 2; i++) {
        em_tensor *in[2] = {tu_random(1, 2, TU_SIZES(3, 7), dts[i], 1),
                            tu_random(2, 2, TU_SIZES(3, 7), dts[i], 1)};
        ck_assert(compile_all(everything, 2, in, 1, to[i]) & (1u << CU_FLAT));
        ck_assert(compile_all(half_casts, 2, in, 2, "em_f64_to_f32_odd(") != 0);
        /* a flat kernel of half buffers steps by 4 halves (8 bytes) */
        int64_t n = 1000;
        em_tensor *p[3] = {tu_random(1, 1, &n, dts[i], 1), tu_random(2, 1, &n, dts[i], 1),
                           tu_random(3, 1, &n, dts[i], 1)};
        ck_assert_uint_eq(compile_all(wl_pointwise_fn, 3, p, 1, "const uint2 L"), 1u << CU_FLAT);
        ck_assert_uint_eq(compile_all(wl_pointwise_fn, 3, p, 1, "|= (unsigned)v"), 1u << CU_FLAT);
        em_tensor *rows[1] = {tu_random(1, 2, TU_SIZES(8, 300), dts[i], 1)};
        ck_assert_uint_eq(compile_all(wl_softmax_fn, 1, rows, 1, to[i]), 1u << CU_ROWS);
    }
}
END_TEST

/* A thread of a half-typed row longer than a warp's aims for twice the
 * elements of an f32 one (the same bytes: a bf16 row of 4096 takes 64
 * threads, an f32 one 128; of 8192, 128 and 256), never fewer than 64
 * threads; rows a warp covers keep the lanes the row's bytes give (64
 * bytes a lane: a 37-wide f16 row 2 lanes, an f32 one 4; a bf16 row of
 * 2048 a warp, as an f32 row of 1024). */
START_TEST(half_rows_step_by_bytes) {
    static const struct { int64_t len; em_dtype d; const char *want; } c[] = {
        {4096, EM_BF16, "__launch_bounds__(64) k_v4("},  {4096, EM_F32, "__launch_bounds__(128) k_v4("},
        {8192, EM_F16, "__launch_bounds__(128) k_v4("},  {8192, EM_F32, "__launch_bounds__(256) k_v4("},
        {2048, EM_BF16, "__launch_bounds__(64) k_v4("},  {1024, EM_F32, "const int em_t = threadIdx.x & 31;\n"},
        {37, EM_F16, "em_t = threadIdx.x & 1, em_s = (threadIdx.x & 31) / 2;"},
        {37, EM_F32, "em_t = threadIdx.x & 3, em_s = (threadIdx.x & 31) / 4;"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        em_tensor *x[1] = {tu_random(1, 2, TU_SIZES(4, c[i].len), c[i].d, 1)};
        ck_assert_uint_eq(compile_all(wl_softmax_fn, 1, x, 1, c[i].want), 1u << CU_ROWS);
    }
}
END_TEST

/* Float-to-integer casts (issue 21, item 2): the kernel IR carries the
 * saturation (kir_convert), so the CUDA text holds the same compares and
 * selects as the CPU's code, around a plain in-range conversion: no
 * __double2int_rz of its own. */
static em_status to_i64(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    out[0] = em_cast(in[0], EM_I64);
    return out[0] ? EM_OK : em_last_status();
}

START_TEST(float_to_int_saturates_in_the_ir) {
    em_tensor *x[1] = {tu_random(3, 2, TU_SIZES(5, 9), EM_F32, 10)};
    ck_assert(compile_all(integers, 1, x, 3, "__int_as_float(0x4f000000)") != 0);  /* 2^31 */
    ck_assert(compile_all(integers, 1, x, 3, "__int_as_float(0xcf000000)") != 0);  /* -2^31 */
    ck_assert(compile_all(integers, 1, x, 3, "((int)0x7fffffffu)") != 0);          /* INT32_MAX */
    em_tensor *d[1] = {tu_random(4, 1, TU_SIZES(37), EM_F64, 1e19)};
    ck_assert(compile_all(to_i64, 1, d, 1, "__longlong_as_double(0x43e0000000000000ll)") != 0);
    ck_assert(compile_all(to_i64, 1, d, 1, "((long long)0x7fffffffffffffffull)") != 0);
    ck_assert(compile_all(to_i64, 1, d, 1, "= (long long)v") != 0);
    /* the same steps in the kernel IR itself */
    k_kernel *k = kir_new("k0");
    int in = kir_buf(k, EM_F32), out = kir_buf(k, EM_I32);
    int r = kir_range(k, kir_const_i(k, EM_I64, 5), K_PARALLEL);
    kir_store(k, out, r, kir_convert(k, kir_load(k, in, r), EM_I32));
    kir_end(k);
    ck_assert_int_eq(kir_verify(k), EM_OK);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ck_assert_int_eq(kir_print(k, f), EM_OK);
    fclose(f);
    ck_assert_msg(strstr(text, "const f32 2147483648") && strstr(text, "lt bool") &&
                      strstr(text, "max f32") && strstr(text, "cast i32") && strstr(text, "ge bool") &&
                      strstr(text, "const i32 2147483647"),
                  "%s", text);
    free(text);
    cuda_src src;
    ck_assert_int_eq(cuda_emit(k, &src), EM_OK);
    ck_assert(strstr(src.text, "__double2int") == NULL);
    cuda_src_free(&src);
    kir_free(k);
}
END_TEST

/* The n bytes at p as a string (in a static buffer: one at a time). */
static const char *strndup_ck(const char *p, size_t n) {
    static char buf[8192];
    ck_assert(n < sizeof buf);
    memcpy(buf, p, n);
    buf[n] = '\0';
    return buf;
}

/* A hand-built kernel whose text is known exactly: the printer's shape. */
START_TEST(golden_text) {
    k_kernel *k = kir_new("k0");
    int in = kir_buf(k, EM_F32), out = kir_buf(k, EM_F32);
    int r = kir_range(k, kir_const_i(k, EM_I64, 5), K_PARALLEL);
    kir_store(k, out, r, kir_alu(k, KA_RELU, kir_load(k, in, r), -1, -1));
    kir_end(k);
    cuda_src src;
    ck_assert_int_eq(cuda_emit(k, &src), EM_OK);
    ck_assert(src.vec4); /* element v of 4-byte buffers: a 16-byte variant too */
    const char *v4 = strstr(src.text, "k0_v4(");
    ck_assert_ptr_nonnull(v4);
    const char *v4end = strstr(v4, "\n}\n");
    ck_assert_ptr_nonnull(v4end);
    ck_assert_str_eq(strndup_ck(v4, (size_t)(v4end + 3 - v4)),
                     "k0_v4(const float *__restrict__ p0, float *__restrict__ p1) {\n"
                     "  EM_AFTER_PRIOR();\n"
                     "  const long long v2 = ((long long)0x0000000000000005ull);\n"
                     "  const long long n = 5ll, nv = n / 4;\n"
                     "  const long long step = (long long)gridDim.x * 256;\n"
                     "  for (long long q = (long long)blockIdx.x * 256 + threadIdx.x; q < nv; q += step) {\n"
                     "    const float4 L4 = reinterpret_cast<const float4 *>(p0)[q];\n"
                     "    float4 S6;\n"
                     "    {\n"
                     "      const long long v3 = q * 4 + 0;\n"
                     "      const float v4 = L4.x;\n"
                     "      const float v5 = (v4 < 0 ? (float)0 : v4);\n"
                     "      S6.x = v5;\n"
                     "    }\n"
                     "    {\n"
                     "      const long long v3 = q * 4 + 1;\n"
                     "      const float v4 = L4.y;\n"
                     "      const float v5 = (v4 < 0 ? (float)0 : v4);\n"
                     "      S6.y = v5;\n"
                     "    }\n"
                     "    {\n"
                     "      const long long v3 = q * 4 + 2;\n"
                     "      const float v4 = L4.z;\n"
                     "      const float v5 = (v4 < 0 ? (float)0 : v4);\n"
                     "      S6.z = v5;\n"
                     "    }\n"
                     "    {\n"
                     "      const long long v3 = q * 4 + 3;\n"
                     "      const float v4 = L4.w;\n"
                     "      const float v5 = (v4 < 0 ? (float)0 : v4);\n"
                     "      S6.w = v5;\n"
                     "    }\n"
                     "    reinterpret_cast<float4 *>(p1)[q] = S6;\n"
                     "  }\n"
                     "  for (long long v3 = nv * 4 + (long long)blockIdx.x * 256 + threadIdx.x; v3 < n; v3 += step) {\n"
                     "    const float v4 = p0[v3];\n"
                     "    const float v5 = (v4 < 0 ? (float)0 : v4);\n"
                     "    p1[v3] = v5;\n"
                     "  }\n"
                     "}\n");
    const char *body = strstr(v4end, "extern \"C\"");
    ck_assert_ptr_nonnull(body);
    ck_assert_str_eq(body,
                     "extern \"C\" __global__ void __launch_bounds__(256) k0(const float *__restrict__ p0, float *__restrict__ p1) {\n"
                     "  EM_AFTER_PRIOR();\n"
                     "  const long long v2 = ((long long)0x0000000000000005ull);\n"
                     "  const long long n = 5ll;\n"
                     "  const long long step = (long long)gridDim.x * 1024;\n"
                     "  long long base = (long long)blockIdx.x * 1024 + threadIdx.x;\n"
                     "  for (; base + 768 < n; base += step) {\n"
                     "#pragma unroll\n"
                     "    for (int u = 0; u < 4; u++) {\n"
                     "      const long long v3 = base + (long long)u * 256;\n"
                     "      const float v4 = p0[v3];\n"
                     "      const float v5 = (v4 < 0 ? (float)0 : v4);\n"
                     "      p1[v3] = v5;\n"
                     "    }\n"
                     "  }\n"
                     "  for (long long v3 = base; v3 < n; v3 += 256) {\n"
                     "    const float v4 = p0[v3];\n"
                     "    const float v5 = (v4 < 0 ? (float)0 : v4);\n"
                     "    p1[v3] = v5;\n"
                     "  }\n"
                     "}\n");
    ck_assert_int_eq(src.shape, CU_FLAT);
    ck_assert_int_eq(src.extent, 5);
    cuda_src_free(&src);
    kir_free(k);
}
END_TEST

START_TEST(errors) {
    /* arithmetic on f16 values: they are only moved and converted */
    k_kernel *k = kir_new("k0");
    int b = kir_buf(k, EM_F16);
    int r = kir_range(k, kir_const_i(k, EM_I64, 4), K_PARALLEL);
    kir_store(k, b, r, kir_alu(k, KA_NEG, kir_load(k, b, r), -1, -1));
    kir_end(k);
    cuda_src src;
    ck_assert_int_eq(cuda_emit(k, &src), EM_ERR_UNSUPPORTED);
    ck_assert_ptr_null(src.text);
    ck_assert_msg(strstr(em_last_error(), "instruction %4 computes in f16"), "%s", em_last_error());
    kir_free(k);
    /* IR that fails the verifier: unbalanced ranges; an op on a dtype the
     * IR does not give it (the rule every backend gets from kir_verify) */
    k = kir_new("k1");
    kir_range(k, kir_const_i(k, EM_I64, 4), K_PARALLEL);
    ck_assert_int_eq(cuda_emit(k, &src), EM_ERR_ARG);
    kir_free(k);
    k = kir_new("k2");
    b = kir_buf(k, EM_BOOL);
    r = kir_range(k, kir_const_i(k, EM_I64, 4), K_PARALLEL);
    kir_store(k, b, r, kir_alu(k, KA_NEG, kir_load(k, b, r), -1, -1));
    kir_end(k);
    ck_assert_int_eq(cuda_emit(k, &src), EM_ERR_ARG);
    ck_assert_msg(strstr(em_last_error(), "cuda_emit: kernel IR verifier: k2: instruction %4 (neg): "
                                          "bool operands"), "%s", em_last_error());
    ck_assert_ptr_null(src.text);
    kir_free(k);
    /* every kernel of a text must begin by waiting for the one before it
     * (programmatic dependent launch): one that does not is refused */
    static const uint8_t zero[16];
    cuda_src bad = {.text = (char *)"extern \"C\" __global__ void a() {\n  EM_AFTER_PRIOR();\n}\n"
                                     "extern \"C\" __global__ void b() { int x = 0; (void)x; }\n",
                    .shape = CU_SERIAL, .threads = 1, .unroll = 1, .extent_size = -1};
    ck_assert_ptr_null(cuda_text_with_key(&bad, "k", zero));
    ck_assert_int_eq(em_last_status(), EM_ERR_STATE);
    ck_assert_msg(strstr(em_last_error(), "does not begin with EM_AFTER_PRIOR()"), "%s", em_last_error());
    bad.text = (char *)"extern \"C\" __global__ void a()";
    ck_assert_ptr_null(cuda_text_with_key(&bad, "k", zero));
    cuda_src good = bad;
    good.text = (char *)"extern \"C\" __global__ void a() {\n  EM_AFTER_PRIOR();\n}\n";
    char *t = cuda_text_with_key(&good, "k", zero);
    ck_assert_ptr_nonnull(t);
    ck_assert(strstr(t, "#define EM_AFTER_PRIOR()") < strstr(t, "void a()"));
    em_free(t);
#ifdef EMBER_HAVE_CUDA
    /* NVRTC's own error comes back with its log */
    void *bin;
    size_t n;
    ck_assert_int_eq(cuda_nvrtc_compile("extern \"C\" __global__ void k(){ nope; }", "k", 90, false,
                                        &bin, &n),
                     EM_ERR_STATE);
    ck_assert_ptr_null(bin);
    ck_assert(strstr(em_last_error(), "nope") != NULL);
#endif
}
END_TEST

#ifdef EMBER_HAVE_CUDA
/* Autotuning's candidates (cuda_kernel_variants) of fn's one kernel: each
 * a distinct text, the default first, each compiled by NVRTC to an sm_90
 * cubin with its parameters; their count. */
static int compile_candidates(fn_t fn, int nin, em_tensor **in) {
    tr_graph *g = record(fn, nin, in, 1);
    sc_schedule *s = sc_build_for(g, true);
    ck_assert_ptr_nonnull(s);
    int *bufs = malloc(sizeof(int) * ((size_t)g->nnodes + 1)), nbufs, nouts, nc = 0;
    for (int gi = 0; gi < s->ngroups; gi++) {
        k_kernel *k = sc_lower(s, gi, bufs, &nbufs, &nouts);
        if (!k) continue; /* a dead group */
        ck_assert_int_eq(nc, 0); /* one kernel */
        jit_params cands[JIT_TUNE_MAX_CANDIDATES];
        nc = cuda_kernel_variants(k, cands, JIT_TUNE_MAX_CANDIDATES);
        ck_assert(nc >= 1 && nc <= JIT_TUNE_MAX_CANDIDATES);
        ck_assert(jit_params_default(&cands[0]));
        char *texts[JIT_TUNE_MAX_CANDIDATES];
        for (int c = 0; c < nc; c++) {
            cuda_row_params rp = cuda_row_params_of(&cands[c]);
            cuda_src src;
            ck_assert_msg(cuda_emit_with(k, 0, &rp, &src) == EM_OK, "%s", em_last_error());
            texts[c] = src.text;
            for (int o = 0; o < c; o++) ck_assert_str_ne(texts[o], texts[c]);
            if (sample_nvrtc() && c != nc - 1) continue; /* one candidate a kernel */
            kc_key key = {{(uint8_t)c}};
            void *bin = NULL;
            size_t n = 0;
            ck_assert_msg(cuda_kernel_compile(k, &rp, &key, 90, &bin, &n) == EM_OK, "%s\n%s",
                          em_last_error(), src.text);
            ck_assert(n > 100);
            em_free(bin);
        }
        for (int c = 0; c < nc; c++) em_free(texts[c]);
        kir_free(k);
    }
    free(bufs);
    sc_free(s);
    tr_graph_free(g);
    return nc;
}

/* Every rows candidate compiles; long rows vary elements per thread,
 * short rows lanes per row; other kernels, and parameters the
 * environment forces, give the default alone. */
START_TEST(rows_candidates_compile) {
    em_tensor *wide[1] = {tu_random(1, 2, TU_SIZES(4, 4099), EM_F32, 1)};
    em_tensor *narrow[1] = {tu_random(2, 2, TU_SIZES(9, 37), EM_F32, 1)};
    em_tensor *one[1] = {tu_random(3, 2, TU_SIZES(1, 1), EM_F32, 1)};
    int64_t n = 1000;
    em_tensor *flat[3] = {tu_random(4, 1, &n, EM_F32, 1), tu_random(5, 1, &n, EM_F32, 1),
                          tu_random(6, 1, &n, EM_F32, 1)};
    unsetenv("EMBER_CUDA_ROW_ELEMS");
    unsetenv("EMBER_CUDA_ROW_LANE_BYTES");
    ck_assert_int_eq(compile_candidates(wl_softmax_fn, 1, wide), 3);  /* 32, 16, 64 a thread */
    ck_assert_int_eq(compile_candidates(row_sum, 1, narrow), 3);      /* 4, 8, 2 lanes a row */
    ck_assert_int_eq(compile_candidates(wl_pointwise_fn, 3, flat), 1); /* not a rows kernel */
    ck_assert_int_ge(compile_candidates(row_sum, 1, one), 1);
    setenv("EMBER_CUDA_ROW_ELEMS", "32", 1); /* forced: no candidate differs in it */
    ck_assert_int_eq(compile_candidates(wl_softmax_fn, 1, wide), 1);
    ck_assert_int_eq(compile_candidates(row_sum, 1, narrow), 3);
    setenv("EMBER_CUDA_ROW_LANE_BYTES", "64", 1);
    ck_assert_int_eq(compile_candidates(row_sum, 1, narrow), 1);
    unsetenv("EMBER_CUDA_ROW_ELEMS");
    unsetenv("EMBER_CUDA_ROW_LANE_BYTES");
}
END_TEST
#endif

#ifdef EMBER_HAVE_CUDA
/* The device's kernel table (no GPU needed: only its table fields). */
START_TEST(kernel_table) {
    cuda_device *d = calloc(1, sizeof *d);
    static cuda_kernel ks[1000];
    kc_key keys[1000];
    for (int i = 0; i < 1000; i++) {
        kc_hasher h;
        kc_hasher_reset(&h);
        kc_hasher_update_u64(&h, (uint64_t)i);
        keys[i] = kc_hasher_digest(&h);
        if (i % 7 == 3) memcpy(keys[i].bytes, keys[i - 1].bytes, 8); /* same slot: probing */
        ck_assert_ptr_null(cuda_kernel_table_find(d, &keys[i]));
        ck_assert(cuda_kernel_table_add(d, &keys[i], &ks[i]));
        for (int j = 0; j <= i; j += 1 + i / 10)
            ck_assert_ptr_eq(cuda_kernel_table_find(d, &keys[j]), &ks[j]);
    }
    for (int i = 0; i < 1000; i++) ck_assert_ptr_eq(cuda_kernel_table_find(d, &keys[i]), &ks[i]);
    ck_assert_int_eq(d->nkernels, 1000);
    free(d->kernels);
    free(d->kindex);
    free(d);
}
END_TEST
#endif

#ifdef EMBER_HAVE_CUDA
/* The fused attention kernel's text (cuda_attention.c) compiles for the
 * specializations that differ: either kernel (tensor cores for sm_90, CUDA
 * cores for sm_75) with each mask kind (none, strided, unit-stride
 * columns), causal or not, head dims 64 and 128, odd ones and the largest
 * taken, 0 to 8 batch dims.  Six texts: under valgrind each NVRTC compile
 * of these kernels takes about a minute. */
START_TEST(attention_kernel_compiles) {
    static const struct { int64_t D, Dv; int causal, mask, nb, mma; } cases[] = {
        {64, 64, 1, 0, 2, 1}, {128, 128, 0, 2, 1, 1}, {17, 100, 1, 1, 8, 1},
        {256, 128, 0, 1, 0, 0}, {64, 64, 0, 2, 3, 0}, {1, 1, 1, 0, 2, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *text = cuda_attention_text(cases[i].D, cases[i].Dv, cases[i].causal, cases[i].mask,
                                         cases[i].nb, cases[i].mma);
        ck_assert_ptr_nonnull(text);
        char want[32];
        snprintf(want, sizeof want, "#define D %lld\n", (long long)cases[i].D);
        ck_assert_msg(strstr(text, want), "%s", text);
        ck_assert_msg(!strstr(text, "mma.sync") == !cases[i].mma, "%s", text);
        void *bin = NULL;
        size_t n = 0;
        ck_assert_msg(nvrtc(text, "k", cases[i].mma ? 90 : 75, false, &bin, &n) == EM_OK,
                      "%s", em_last_error());
        ck_assert(n > 100);
        em_free(bin);
        em_free(text);
    }
    /* the decode kernel (few queries, keys split over blocks): a masked
     * GPT-2 head, and odd head sizes with causal and the most batch dims */
    static const struct { int64_t D, Dv; int causal, mask, nb; } dec[] = {{64, 64, 0, 1, 2}, {17, 100, 1, 0, 8}};
    for (size_t i = 0; i < sizeof dec / sizeof *dec; i++) {
        char *text = cuda_attention_decode_text(dec[i].D, dec[i].Dv, dec[i].causal, dec[i].mask, dec[i].nb);
        ck_assert_ptr_nonnull(text);
        void *bin = NULL;
        size_t n = 0;
        ck_assert_msg(nvrtc(text, "k", 90, false, &bin, &n) == EM_OK, "%s", em_last_error());
        ck_assert(n > 100);
        em_free(bin);
        em_free(text);
    }
    ck_assert_ptr_null(cuda_attention_decode_text(257, 64, 0, 0, 2));
    ck_assert_int_eq(em_last_status(), EM_ERR_ARG);
    ck_assert_ptr_null(cuda_attention_decode_text(64, 129, 0, 0, 2));
}
END_TEST

/* The fused attention kernel for f16 and bf16 operands (m16n8k16 tensor
 * cores, sm_80 on; FlashAttention-2's schedule: cp.async ring, ldmatrix)
 * compiles for sm_90 in each specialization: both dtypes with each mask
 * kind (none, strided, unit-stride columns), causal or not, head dims 64,
 * 128, 256 (the largest taken) and odd ones (padded to 16), Dv from 8 to
 * 128, 0 to 8 batch dims, and each of the plan's three tilings (128
 * queries x 32 keys for small heads, 128 x 64 up to 128, 64 x 32 past:
 * cuda_attention.c's plan_half); seven texts, one a dtype under valgrind
 * (about a minute each there); other dtypes and head sizes past the
 * kernel's are EM_ERR_ARG. */
START_TEST(attention_half_kernels_compile) {
    static const struct { em_dtype dt; int64_t D, Dv; int causal, mask, nb, bq, bk; } cases[] = {
        {EM_BF16, 64, 64, 1, 0, 2, 128, 32}, {EM_BF16, 128, 128, 0, 2, 1, 128, 64},
        {EM_BF16, 256, 128, 0, 1, 0, 64, 32}, {EM_F16, 64, 64, 0, 2, 2, 128, 32},
        {EM_F16, 17, 100, 1, 1, 8, 128, 64}, {EM_F16, 80, 8, 1, 0, 3, 128, 32},
        {EM_BF16, 144, 64, 1, 2, 2, 64, 32}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *text = cuda_attention_half_text(cases[i].dt, cases[i].D, cases[i].Dv, cases[i].causal,
                                              cases[i].mask, cases[i].nb);
        ck_assert_ptr_nonnull(text);
        char want[32], tiles[48];
        snprintf(want, sizeof want, "#define HALF %d\n", cases[i].dt == EM_BF16 ? 2 : 1);
        snprintf(tiles, sizeof tiles, "#define BQ %d\n#define BK %d\n", cases[i].bq, cases[i].bk);
        ck_assert_msg(strstr(text, want) && strstr(text, "m16n8k16") && strstr(text, "em_to_bf16"), "%s", text);
        ck_assert_msg(strstr(text, tiles) && strstr(text, "cp.async.cg.shared.global") &&
                      strstr(text, "ldmatrix.sync.aligned.m8n8.x4.shared.b16"), "case %zu: %s", i, text);
        if (sample_nvrtc() && i != 0 && i != 4) { /* one text a dtype */
            em_free(text);
            continue;
        }
        void *bin = NULL;
        size_t n = 0;
        ck_assert_msg(nvrtc(text, "k", 90, false, &bin, &n) == EM_OK, "case %zu: %s", i, em_last_error());
        ck_assert(n > 100);
        em_free(bin);
        em_free(text);
    }
    /* the f32 text differs (another cache key): its own operand part */
    char *f32 = cuda_attention_text(64, 64, 1, 0, 2, true), *bf = cuda_attention_half_text(EM_BF16, 64, 64, 1, 0, 2);
    ck_assert(f32 && bf && strcmp(f32, bf) && strstr(f32, "#define HALF 0\n") && !strstr(f32, "m16n8k16"));
    em_free(f32);
    em_free(bf);
    ck_assert_ptr_null(cuda_attention_half_text(EM_F32, 64, 64, 0, 0, 2));
    ck_assert_int_eq(em_last_status(), EM_ERR_ARG);
    ck_assert_ptr_null(cuda_attention_half_text(EM_F64, 64, 64, 0, 0, 2));
    ck_assert_ptr_null(cuda_attention_half_text(EM_BF16, 257, 64, 0, 0, 2));
    ck_assert_ptr_null(cuda_attention_half_text(EM_BF16, 0, 64, 0, 0, 2));
    ck_assert_ptr_null(cuda_attention_half_text(EM_F16, 64, 129, 0, 0, 2));
    ck_assert_ptr_null(cuda_attention_half_text(EM_F16, 64, 64, 0, 0, EM_MAX_DIMS + 1));
    ck_assert_int_eq(em_last_status(), EM_ERR_ARG);
}
END_TEST
#endif

/* Without a GPU (CI), asking for one fails with a reason, never aborts. */
START_TEST(no_gpu_is_an_error) {
    if (em_device_available(em_cuda(0))) return; /* a GPU machine: test_cuda covers it */
    em_clear_error();
    tu_check_fails(em_zeros(1, TU_SIZES(4), EM_F32, em_cuda(0)), EM_ERR_DEVICE);
    const char *e = em_last_error();
    ck_assert_msg(strstr(e, "libcuda.so.1") || strstr(e, "no such device") || strstr(e, "CUDA driver"),
                  "unclear error: %s", e);
    em_compile_options o = {.ninputs = 3, .noutputs = 1, .backend = "cuda"};
    em_compiled *f = em_compile(wl_pointwise_fn, NULL, &o);
    ck_assert_ptr_nonnull(f); /* the backend exists in every build */
    em_compiled_free(f);
}
END_TEST


/* ---- warmup for a named GPU, without one (issue 13) ---- */


/* Entries of kind under the cache directory dir. */
static int count_kind(const char *dir, const char *kind) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls %s/v1/*/*.%s 2>/dev/null | wc -l", dir, kind);
    FILE *p = popen(cmd, "r");
    int n = -1;
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(fscanf(p, "%d", &n), 1);
    pclose(p);
    return n;
}

/* A recorded CUDA graph (written as EMBER_RECORD writes one: this machine
 * may have no GPU to trace on) warmed with --target sm_90: NVRTC alone
 * compiles its kernel and stores the cubin and the plan; a second warmup
 * finds them; the bundle is tagged for sm_90, refused for another GPU
 * (naming both) and imported for that one. */
START_TEST(warmup_for_a_named_gpu_needs_no_gpu) {
    char dir[] = "/tmp/ember-emit-warm-XXXXXX", list[128], args[800], text[4096];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(list, sizeof list, "%s/warm.list", dir);
    FILE *f = fopen(list, "w");
    ck_assert_ptr_nonnull(f);
    fputs("ember-record 1 backend=cuda name=gelu_bias\n"
          "graph(%x: f32[64, 256]{256, 1}@cuda:0, %b: f32[256]{1}@cuda:0) {\n"
          "  %2 = add(%x, %b) : f32[64, 256]{256, 1}@cuda:0\n"
          "  %3 = gelu_tanh(%2) : f32[64, 256]{256, 1}@cuda:0\n"
          "  return (%3)\n"
          "}\n", f);
    fclose(f);
    snprintf(args, sizeof args, "--dir '%s/c' --target sm_90 warmup '%s'", dir, list);
    ck_assert_msg(tu_tool(text, sizeof text, "%s", args) == 0, "%s", text);
    ck_assert_msg(strstr(text, "1 compiled, 0 already present, 0 failed"), "%s", text);
    snprintf(args, sizeof args, "%s/c", dir);
    ck_assert_int_eq(count_kind(args, "cubin"), 1);
    ck_assert_int_eq(count_kind(args, "plan"), 1);
    snprintf(args, sizeof args, "--dir '%s/c' --target sm_90 warmup '%s'", dir, list);
    ck_assert_msg(tu_tool(text, sizeof text, "%s", args) == 0, "%s", text);
    ck_assert_msg(strstr(text, "0 compiled, 1 already present"), "%s", text);
    snprintf(args, sizeof args, "--dir '%s/c' --target sm_90 export '%s/b.ember'", dir, dir);
    ck_assert_msg(tu_tool(text, sizeof text, "%s", args) == 0, "%s", text);
    snprintf(args, sizeof args, "--dir '%s/d' --target sm_80 import '%s/b.ember'", dir, dir);
    ck_assert_int_eq(tu_tool(text, sizeof text, "%s", args), 1);
    ck_assert_msg(strstr(text, "made for cuda=sm_90") && strstr(text, "this machine has cuda=sm_80"),
                  "%s", text);
    snprintf(args, sizeof args, "--dir '%s/d' --target sm_90 import '%s/b.ember'", dir, dir);
    ck_assert_msg(tu_tool(text, sizeof text, "%s", args) == 0, "%s", text);
    snprintf(args, sizeof args, "%s/d", dir);
    ck_assert_int_eq(count_kind(args, "cubin"), 1);
    /* a bad target is a usage error */
    snprintf(args, sizeof args, "--dir '%s/c' --target gfx90a warmup '%s'", dir, list);
    ck_assert_int_eq(tu_tool(text, sizeof text, "%s", args), 2);
    ck_assert_msg(strstr(text, "sm_90"), "%s", text);
    snprintf(args, sizeof args, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(args), 0);
}
END_TEST

int main(void) {
    if (!have_nvrtc()) {
        printf("SKIP: no NVRTC: %s\n", em_last_error());
        return 77;
    }
    const tu_test tests[] = {
        {"pointwise_is_flat", pointwise_is_flat}, {"softmax_is_rows", softmax_is_rows},
        {"layernorm_compiles", layernorm_compiles}, {"every_alu_op", every_alu_op},
        {"views_and_lead_rows_compile", views_and_lead_rows_compile},
        {"transpose_is_tiled", transpose_is_tiled}, {"long_rows_use_clusters", long_rows_use_clusters},
        {"half_kernels_compile", half_kernels_compile},
        {"half_rows_step_by_bytes", half_rows_step_by_bytes},
        {"golden_text", golden_text}, {"errors", errors},
        {"float_to_int_saturates_in_the_ir", float_to_int_saturates_in_the_ir},
        {"no_gpu_is_an_error", no_gpu_is_an_error},
        {"warmup_for_a_named_gpu_needs_no_gpu", warmup_for_a_named_gpu_needs_no_gpu},
#ifdef EMBER_HAVE_CUDA
        {"kernel_table", kernel_table}, {"attention_kernel_compiles", attention_kernel_compiles},
        {"attention_half_kernels_compile", attention_half_kernels_compile},
        {"rows_candidates_compile", rows_candidates_compile},
#endif
    };
    return tu_run(tu_suite("cuda_emit", tests, sizeof tests / sizeof tests[0], 120));
}
