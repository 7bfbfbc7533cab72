/* bench_cuda.c - the workloads of WORKLOADS.md at their GPU sizes, compiled
 * with em_compile on cuda:0, timed with CUDA events on Ember's stream
 * (median of the repetitions, after warm-up), against the floors measured
 * in the same run: device-to-device copy bandwidth and the f32 GEMM rate.
 *
 * Usage: bench_cuda [--sweep | --graphs] [--only NAME,...] [--reps N] [--json FILE]
 *                   [--dtype f32|f16|bf16]
 * --graphs: host time and latency per call of launch-bound entries with
 * CUDA graphs off and on (em_compile_options.cuda_graphs; issue 20).
 * --sweep: the shape sweep below (issue 14) instead of the workloads, each
 * with Ember's eager time beside its compiled one, per call of 10 queued
 * back to back (and a single call's latency); bench/torch_sweep.py times
 * the same ops with PyTorch eager and torch.compile the same way.
 * The kernel cache is EMBER_CACHE_DIR's: run twice with the same empty
 * directory to see the cold first call (first run) and the warm one (a new
 * process with the cache filled, second run).  Exits 77 without a GPU.
 *
 * --json FILE (make bench-cuda): also times each workload eagerly (Ember's
 * eager CUDA ops, after the compiled first call so that the cold first
 * call finds no eager kernel in the cache either) and in lazy mode (the
 * same eager code under em_lazy_begin, computed with em_realize:
 * EMBER_JIT=1's path), measures the warm first
 * call in a new process (this program again, with --first-call NAME, on
 * the cache this one filled; a fresh temporary cache when EMBER_CACHE_DIR
 * is unset) and writes bench_eager's JSON schema, which bench/report.py
 * reads.  tiny_chain's times there are wall time per call (2000 calls, one
 * synchronize), the other workloads' medians of CUDA-event times. */
#include "bench_stats.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "cuda_jit.h" /* the cuda folder's offer: sync, device copy, event timers */
#include "ember.h"
#include "workloads.h"

#ifdef EMBER_HAVE_CUDA

#define GPU_INDEX 0
#define GPU em_cuda(GPU_INDEX)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}


static void die(const char *what) {
    fprintf(stderr, "bench_cuda: %s: %s\n", what, em_last_error());
    exit(1);
}

/* ---- event timing on Ember's stream ---- */
typedef void (*body_fn)(void *ud);

static void sync_gpu(void) {
    if (cuda_stream_sync(GPU_INDEX) != EM_OK) die("synchronize");
}

/* Median time of one call over reps timings of `queue` calls each, queued
 * back to back between the events (1: a call's latency, the host's time
 * to launch it included; more: the GPU's time per call where the host
 * launches faster than the GPU runs). */
static double time_events_queued(body_fn body, void *ud, int reps, int queue) {
    cuda_timer *t = cuda_timer_new(GPU_INDEX);
    if (!t) die("timer");
    for (int i = 0; i < 3; i++) body(ud);
    sync_gpu();
    double *ts = malloc(sizeof(double) * (size_t)reps);
    for (int i = 0; i < reps; i++) {
        if (cuda_timer_start(t) != EM_OK) die("timer start");
        for (int q = 0; q < queue; q++) body(ud);
        if (cuda_timer_stop(t, &ts[i]) != EM_OK) die("timer stop");
        ts[i] /= queue;
    }
    double m = median(ts, reps);
    free(ts);
    cuda_timer_free(t);
    return m;
}

static double time_events(body_fn body, void *ud, int reps) { return time_events_queued(body, ud, reps, 1); }

/* The sweep's calls queued 10 a timing: its kernels run 10-130 us, near a
 * call's host time; bench/torch_sweep.py times torch the same way. */
enum { SWEEP_QUEUE = 10 };

/* ---- floors ---- */
typedef struct copy_ud {
    em_tensor *dst, *src;
} copy_ud;

static void copy_body(void *ud) {
    copy_ud *c = ud;
    if (cuda_stream_copy(c->dst, c->src) != EM_OK) die("device copy");
}

typedef struct mm_ud {
    em_tensor *a, *b;
} mm_ud;

static void mm_body(void *ud) {
    mm_ud *m = ud;
    em_scope_begin();
    if (!em_matmul(m->a, m->b)) die("matmul");
    em_scope_end();
}

/* --dtype: the workloads' inputs (and so their math) in f32, f16 or bf16 */
static em_dtype bench_dtype = EM_F32;

/* Bytes of n elements of the benchmark's dtype. */
static double nbytes(double n) { return n * (double)em_dtype_size(bench_dtype); }

static em_tensor *randn(em_generator *g, int nd, const int64_t *sz, double scale) {
    em_tensor *t = em_randn(g, nd, sz, EM_F32, GPU);
    if (!t) die("randn");
    if (scale != 1) {
        em_tensor *s = em_mul_scalar(t, scale);
        em_release(t);
        t = s;
    }
    if (bench_dtype != EM_F32) {
        em_tensor *h = em_cast(t, bench_dtype);
        em_release(t);
        if (!(t = h)) die("cast");
    }
    return t;
}

/* ---- workloads ---- */
/* The GPU sizes of WORKLOADS.md's attention_block (the other workloads'
 * sizes are in setup) */
enum { B_ = 16, T_ = 1024, E_ = 768, NH_ = 12 };

static em_status block(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    out[0] = wl_attention_block(in, NH_);
    return out[0] ? EM_OK : em_last_status();
}

/* Not a WORKLOADS.md workload: a full sum, which the split scheme spreads
 * over the GPU (a rows kernel alone would run it on one block). */
static em_status sum_all(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    out[0] = em_sum(in[0], 0, NULL, false);
    return out[0] ? EM_OK : em_last_status();
}

/* ---- the shape sweep (--sweep, issue 14): ordinary shapes from real
 * models that the workloads above do not use, each of at least 64 MB of
 * traffic; bench/torch_sweep.py times the same ops with PyTorch ---- */

#define SWEEP_FN(name, expr)                                                                \
    static em_status name(void *c, em_tensor *const *in, const double *s, em_tensor **out) { \
        (void)c, (void)s;                                                                    \
        out[0] = (expr);                                                                     \
        return out[0] ? EM_OK : em_last_status();                                            \
    }

SWEEP_FN(sw_softmax, em_softmax(in[0], -1))
SWEEP_FN(sw_scaled_softmax, em_softmax(em_mul_scalar(in[0], 0.125), -1))
SWEEP_FN(sw_logsoftmax_slice_mean, em_mean(em_slice(em_log_softmax(in[0], -1), 1, 0, 1000, 1), 0, NULL, false))
SWEEP_FN(sw_rmsnorm, em_mul(em_mul(in[0], em_rsqrt(em_add_scalar(em_mean(em_mul(in[0], in[0]), 1, (int[]){-1}, true), 1e-6))), in[1]))
SWEEP_FN(sw_rowsum, em_sum(in[0], 1, (int[]){-1}, false))
SWEEP_FN(sw_layernorm, em_layer_norm(in[0], 1, in[1], in[2], 1e-5))
SWEEP_FN(sw_colsum, em_sum(in[0], 1, (int[]){0}, false))
SWEEP_FN(sw_transpose_add, em_add(em_transpose(in[0], 0, 1), in[1]))
SWEEP_FN(sw_bias_gelu, em_gelu_tanh(em_add(in[0], in[1])))
SWEEP_FN(sw_mse, em_mean(em_mul(em_sub(in[0], in[1]), em_sub(in[0], in[1])), 0, NULL, false))

typedef struct sweep_case {
    const char *name;
    em_fn fn;
    int64_t rows, cols;  /* the input x [rows, cols] (scores: [rows / 1024, 1024, cols]) */
    int extra;           /* 0: x only; 1: a [cols] weight; 2: weight and bias; 3: y like x;
                            4: y like x's transpose */
    double passes;       /* bytes moved, in units of x's size (read x once = 1) */
} sweep_case;

static const sweep_case sweep[] = {
    {"sw_softmax_vocab", sw_softmax, 256, 50257, 0, 2},
    {"sw_softmax_37", sw_softmax, 1 << 20, 37, 0, 2},
    {"sw_scaled_softmax", sw_scaled_softmax, 192 * 1024, 1024, 0, 2},
    {"sw_logsoftmax_slice_mean", sw_logsoftmax_slice_mean, 2048, 50257, 0, 1},
    {"sw_rmsnorm", sw_rmsnorm, 8192, 4096, 1, 2},
    {"sw_rowsum_37", sw_rowsum, 1 << 20, 37, 0, 1},
    {"sw_layernorm_1000", sw_layernorm, 16384, 1000, 2, 2},
    {"sw_colsum", sw_colsum, 16384, 4096, 0, 1},
    {"sw_transpose_add", sw_transpose_add, 8192, 8192, 3, 3},
    {"sw_transpose_add_odd", sw_transpose_add, 4099, 3001, 4, 3},
    {"sw_bias_gelu", sw_bias_gelu, 8192, 3072, 1, 2},
    /* odd shapes: row lengths and counts that are multiples of nothing */
    {"sw_softmax_4099", sw_softmax, 8191, 4099, 0, 2},
    {"sw_rmsnorm_37", sw_rmsnorm, 1048573, 37, 1, 2},
    {"sw_layernorm_4099", sw_layernorm, 8191, 4099, 2, 2},
    {"sw_bias_gelu_1001", sw_bias_gelu, 16381, 1001, 1, 2},
    /* a loss over a whole tensor: a reduction to one value */
    {"sw_mse_loss", sw_mse, 8192, 4096, 3, 2},
};
enum { NSWEEP = sizeof sweep / sizeof sweep[0] };

typedef struct workload {
    const char *name;
    em_fn fn;
    int nin;
    em_tensor *in[20];
    double bytes, flops;
} workload;

/* w as sweep case name; false: not one. */
static bool sweep_setup(workload *w, em_generator *g) {
    for (int i = 0; i < NSWEEP; i++) {
        const sweep_case *c = &sweep[i];
        if (strcmp(w->name, c->name)) continue;
        bool scores = c->fn == sw_scaled_softmax;
        int64_t sz[3] = {c->rows, c->cols}, s3[3] = {c->rows / 1024, 1024, c->cols};
        w->fn = c->fn;
        w->nin = 1 + (c->extra == 2 ? 2 : c->extra ? 1 : 0);
        w->in[0] = scores ? randn(g, 3, s3, 1) : randn(g, 2, sz, 1);
        if (c->extra == 1 || c->extra == 2) w->in[1] = randn(g, 1, &sz[1], 1);
        if (c->extra == 2) w->in[2] = randn(g, 1, &sz[1], 1);
        if (c->extra == 3) w->in[1] = randn(g, 2, sz, 1);
        if (c->extra == 4) w->in[1] = randn(g, 2, (int64_t[]){c->cols, c->rows}, 1);
        w->bytes = c->passes * nbytes((double)c->rows * (double)c->cols);
        return true;
    }
    return false;
}

typedef struct call_ud {
    em_compiled *f;
    em_tensor **in;
} call_ud;

static void call_body(void *ud) {
    call_ud *c = ud;
    em_tensor *out[1];
    em_scope_begin();
    if (em_call(c->f, c->in, NULL, out) != EM_OK) die("em_call");
    em_scope_end();
}

static void setup(workload *w, em_generator *g) {
    const char *n = w->name;
    if (!strcmp(n, "pointwise")) {
        int64_t N = (int64_t)1 << 26;
        w->fn = wl_pointwise_fn;
        w->nin = 3;
        for (int i = 0; i < 3; i++) w->in[i] = randn(g, 1, &N, 1);
        w->bytes = 4 * nbytes((double)N);
    } else if (!strcmp(n, "softmax") || !strcmp(n, "layernorm")) {
        int64_t sz[2] = {32768, 4096};
        bool ln = n[0] == 'l';
        w->fn = ln ? wl_layernorm_fn : wl_softmax_fn;
        w->nin = ln ? 3 : 1;
        w->in[0] = randn(g, 2, sz, 1);
        if (ln) w->in[1] = randn(g, 1, sz + 1, 1), w->in[2] = randn(g, 1, sz + 1, 1);
        w->bytes = 2 * nbytes((double)sz[0] * (double)sz[1]);
    } else if (!strcmp(n, "mlp")) {
        int64_t M = 8192, K = 2048, H = 8192;
        w->fn = wl_mlp_fn;
        w->nin = 5;
        w->in[0] = randn(g, 2, (int64_t[]){M, K}, 1);
        w->in[1] = randn(g, 2, (int64_t[]){K, H}, 1 / sqrt((double)K));
        w->in[2] = randn(g, 1, &H, 1);
        w->in[3] = randn(g, 2, (int64_t[]){H, K}, 1 / sqrt((double)H));
        w->in[4] = randn(g, 1, &K, 1);
        w->flops = 2.0 * M * K * H * 2;
    } else if (!strcmp(n, "attention_block")) {
        int64_t E = E_, E3 = 3 * E_, E4 = 4 * E_;
        double s = 1 / sqrt((double)E);
        w->fn = block;
        w->nin = 14;
        em_tensor **in = w->in;
        in[0] = randn(g, 3, (int64_t[]){B_, T_, E_}, 1);
        in[1] = randn(g, 1, &E, 1), in[2] = randn(g, 1, &E, 1);
        in[3] = randn(g, 2, (int64_t[]){E, E3}, s), in[4] = randn(g, 1, &E3, 1);
        in[5] = randn(g, 2, (int64_t[]){E, E}, s), in[6] = randn(g, 1, &E, 1);
        in[7] = randn(g, 1, &E, 1), in[8] = randn(g, 1, &E, 1);
        in[9] = randn(g, 2, (int64_t[]){E, E4}, s), in[10] = randn(g, 1, &E4, 1);
        in[11] = randn(g, 2, (int64_t[]){E4, E}, 1 / sqrt((double)E4)), in[12] = randn(g, 1, &E, 1);
        /* causal mask: -inf above the diagonal */
        float *m = malloc(sizeof(float) * (size_t)(T_ * T_));
        for (int64_t i = 0; i < T_; i++)
            for (int64_t j = 0; j < T_; j++) m[i * T_ + j] = j > i ? -INFINITY : 0.0f;
        in[13] = em_from_data(m, EM_F32, 2, (int64_t[]){T_, T_}, GPU);
        free(m);
        if (bench_dtype != EM_F32 && !(in[13] = em_cast(in[13], bench_dtype))) die("cast");
        double hd = (double)E_ / NH_;
        w->flops = 2.0 * B_ * T_ * (E * 3 * E + E * E + 8.0 * E * E) + 2.0 * 2 * B_ * NH_ * T_ * T_ * hd;
    } else if (sweep_setup(w, g)) {
    } else if (!strcmp(n, "sum_all")) {
        int64_t N = (int64_t)1 << 26;
        w->fn = sum_all;
        w->nin = 1;
        w->in[0] = randn(g, 1, &N, 1);
        w->bytes = nbytes((double)N);
    } else {
        int64_t n16 = 16;
        w->fn = wl_tiny_chain_fn;
        w->nin = 2;
        w->in[0] = randn(g, 1, &n16, 1), w->in[1] = randn(g, 1, &n16, 1);
    }
}

typedef struct eager_ud {
    workload *w;
} eager_ud;

static void eager_body(void *ud) {
    workload *w = ((eager_ud *)ud)->w;
    em_tensor *out[1];
    em_scope_begin();
    if (w->fn(NULL, w->in, NULL, out) != EM_OK) die("eager run");
    em_scope_end();
}

/* Lazy mode: the eager code recorded, then computed as fused graphs. */
static void lazy_body(void *ud) {
    workload *w = ((eager_ud *)ud)->w;
    em_tensor *out[1];
    em_scope_begin();
    em_lazy_begin();
    if (w->fn(NULL, w->in, NULL, out) != EM_OK || em_realize(out[0]) != EM_OK) die("lazy run");
    em_lazy_end();
    em_scope_end();
}

/* Wall time per call of body over n calls, one synchronize at the end. */
static double wall_per_call(body_fn body, void *ud, int n) {
    for (int i = 0; i < 10; i++) body(ud);
    sync_gpu();
    double a = now();
    for (int i = 0; i < n; i++) body(ud);
    sync_gpu();
    return (now() - a) / n;
}

/* The first em_call of a new compiled function of w, to the GPU's end. */
static double first_call(workload *w, em_compiled **fp) {
    em_compile_options o = {.ninputs = w->nin, .noutputs = 1, .name = w->name};
    em_compiled *f = em_compile(w->fn, NULL, &o);
    if (!f) die("em_compile");
    call_ud ud = {f, w->in};
    double t0 = now();
    call_body(&ud);
    sync_gpu();
    double t = now() - t0;
    if (fp) *fp = f;
    else em_compiled_free(f);
    return t;
}

/* ---- --graphs: host time and latency per call, CUDA graphs off and on ----
 * Launch-bound entries: tiny_chain (one fused kernel), mlp8 (8 layers of
 * [8, 256] @ [256, 256] + bias, relu: 8 cuBLAS gemms and 8 kernels) and a
 * GPT-2 block at batch 1, 16 tokens (the decoder step's shape class). */

enum { MLP_LAYERS = 8, MLP_B = 8, MLP_C = 256 };

static em_status mlp8(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    em_tensor *x = in[0];
    for (int i = 0; i < MLP_LAYERS; i++) x = em_relu(em_add(em_matmul(x, in[1 + 2 * i]), in[2 + 2 * i]));
    out[0] = x;
    return x ? EM_OK : em_last_status();
}

static em_status small_block(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    out[0] = wl_attention_block(in, NH_);
    return out[0] ? EM_OK : em_last_status();
}

static void graphs_setup(workload *w, em_generator *g) {
    if (!strcmp(w->name, "mlp8")) {
        w->fn = mlp8;
        w->nin = 1 + 2 * MLP_LAYERS;
        w->in[0] = randn(g, 2, (int64_t[]){MLP_B, MLP_C}, 1);
        for (int i = 0; i < MLP_LAYERS; i++) {
            w->in[1 + 2 * i] = randn(g, 2, (int64_t[]){MLP_C, MLP_C}, 0.06);
            w->in[2 + 2 * i] = randn(g, 1, (int64_t[]){MLP_C}, 0.1);
        }
    } else if (!strcmp(w->name, "block_b1_t16")) {
        int64_t T = 16, E = E_;
        w->fn = small_block;
        w->nin = 14;
        w->in[0] = randn(g, 3, (int64_t[]){1, T, E}, 1);
        const int64_t sz[13][2] = {{E, 0}, {E, 0}, {E, 3 * E}, {3 * E, 0}, {E, E}, {E, 0}, {E, 0},
                                   {E, 0}, {E, 4 * E}, {4 * E, 0}, {4 * E, E}, {E, 0}, {T, T}};
        for (int i = 0; i < 13; i++)
            w->in[1 + i] = randn(g, sz[i][1] ? 2 : 1, (int64_t[]){sz[i][0], sz[i][1]}, 0.02);
    } else {
        setup(w, g); /* tiny_chain */
    }
}

/* Medians over n calls of f on in, in seconds: host time (until em_call
 * returns, the GPU idle before it: what the CPU spends, which calls queued
 * back to back would hide behind the GPU's time) and latency (until the
 * GPU has finished it too); queued: wall time per call of n calls queued
 * back to back (the GPU's time when it is the bound). */
static void host_and_latency(em_compiled *f, em_tensor **in, int n, double *host, double *lat,
                             double *queued) {
    call_ud ud = {f, in};
    for (int i = 0; i < 50; i++) call_body(&ud);
    sync_gpu();
    double *h = malloc(sizeof(double) * (size_t)n), *t = malloc(sizeof(double) * (size_t)n);
    for (int i = 0; i < n; i++) {
        double b = now();
        call_body(&ud);
        double e = now();
        sync_gpu();
        h[i] = e - b;
        t[i] = now() - b;
    }
    *host = median(h, n);
    *lat = median(t, n);
    *queued = wall_per_call(call_body, &ud, n);
    free(h), free(t);
}

/* A call whose caller keeps each output until the next call returns (the
 * replay then copies its outputs out). */
typedef struct keep_ud {
    em_compiled *f;
    em_tensor **in;
    em_tensor *prev;
} keep_ud;

static void keep_body(void *ud) {
    keep_ud *k = ud;
    em_tensor *out[1];
    if (em_call(k->f, k->in, NULL, out) != EM_OK) die("em_call");
    em_release(k->prev); /* no scope is open: the caller's */
    k->prev = out[0];
}

/* Median host time of a call that keeps its outputs (as host_and_latency). */
static double host_kept(em_compiled *f, em_tensor **in, int n) {
    keep_ud k = {f, in, NULL};
    for (int i = 0; i < 50; i++) keep_body(&k);
    double *h = malloc(sizeof(double) * (size_t)n);
    for (int i = 0; i < n; i++) {
        sync_gpu();
        double b = now();
        keep_body(&k);
        h[i] = now() - b;
    }
    double r = median(h, n);
    free(h);
    em_release(k.prev);
    return r;
}

static void copy_body_host(void *ud) {
    copy_ud *c = ud;
    em_scope_begin();
    em_tensor *t = em_empty(em_ndim(c->src), em_sizes(c->src), em_dtype_of(c->src), GPU);
    if (!t || cuda_stream_copy(t, c->src) != EM_OK) die("copy");
    em_scope_end();
}

static int graphs_bench(void) {
    const char *wl[] = {"tiny_chain", "mlp8", "block_b1_t16"};
    em_generator *g = em_generator_new(0);
    printf("%-13s %7s %7s | %11s %11s %11s | %11s %11s | %11s %11s | %8s\n", "workload", "kernels",
           "replays", "host us off", "host us on", "on, kept", "lat us off", "lat us on", "queued off",
           "queued on", "max diff");
    for (size_t k = 0; k < sizeof wl / sizeof wl[0]; k++) {
        workload w = {.name = wl[k]};
        graphs_setup(&w, g);
        double host[2], lat[2], queued[2], kept = 0;
        em_compile_stats st[2];
        em_tensor *res[2];
        for (int on = 0; on < 2; on++) {
            em_compile_options o = {.ninputs = w.nin, .noutputs = 1, .name = w.name,
                                    .cuda_graphs = on ? 1 : -1};
            em_compiled *f = em_compile(w.fn, NULL, &o);
            if (!f) die("em_compile");
            host_and_latency(f, w.in, 2000, &host[on], &lat[on], &queued[on]);
            if (on) kept = host_kept(f, w.in, 1000);
            if (em_call(f, w.in, NULL, &res[on]) != EM_OK) die("em_call");
            em_compiled_stats(f, &st[on]);
            em_compiled_free(f);
        }
        float *va = malloc((size_t)em_numel(res[0]) * 4), *vb = malloc((size_t)em_numel(res[0]) * 4);
        em_copy_to_host(res[0], va, (size_t)em_numel(res[0]) * 4);
        em_copy_to_host(res[1], vb, (size_t)em_numel(res[0]) * 4);
        double md = 0;
        for (int64_t i = 0; i < em_numel(res[0]); i++) md = fmax(md, fabs((double)va[i] - vb[i]));
        free(va), free(vb);
        em_release(res[0]), em_release(res[1]);
        printf("%-13s %7d %7lld | %11.2f %11.2f %11.2f | %11.2f %11.2f | %11.2f %11.2f | %8.2g\n",
               w.name, st[1].kernels, (long long)st[1].graph_replays, host[0] * 1e6, host[1] * 1e6,
               kept * 1e6, lat[0] * 1e6, lat[1] * 1e6, queued[0] * 1e6, queued[1] * 1e6, md);
        if (k == 0) { /* what the copy-out of one small output costs the host */
            copy_ud cu = {NULL, w.in[0]};
            double t = wall_per_call(copy_body_host, &cu, 2000);
            printf("%-13s host time of one output's copy (alloc + device copy): %.2f us\n", "",
                   t * 1e6);
        }
        for (int i = 0; i < w.nin; i++) em_release(w.in[i]);
    }
    em_generator_free(g);
    return 0;
}

/* The first call in a new process (this program, --first-call), which finds
 * the kernel cache this one filled; -1 when it fails. */
static double warm_first_call(const char *self, const char *name) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' --dtype %s --first-call %s", self, em_dtype_name(bench_dtype), name);
    FILE *p = popen(cmd, "r");
    double t = -1, v;
    char line[256];
    while (p && fgets(line, sizeof line, p))
        if (sscanf(line, "%lf", &v) == 1) t = v;
    if (p && pclose(p) != 0) t = -1;
    return t;
}

typedef struct result {
    double eager, compiled, lazy, floor, cold, warm;
    int kernels;
} result;

static result run(workload *w, int reps, double copy_bw, double mm_rate, const char *self) {
    result r = {-1, -1, -1, 0, -1, -1, 0};
    em_compiled *f;
    r.cold = first_call(w, &f);
    call_ud ud = {f, w->in};
    bool sweep_case = !strncmp(w->name, "sw_", 3);
    double single = sweep_case ? time_events(call_body, &ud, reps) : 0;
    double t = sweep_case ? time_events_queued(call_body, &ud, reps, SWEEP_QUEUE) : time_events(call_body, &ud, reps);
    em_compile_stats st;
    em_compiled_stats(f, &st);
    r.compiled = t, r.kernels = st.kernels;
    printf("%-16s %9.3f ms", w->name, t * 1e3);
    if (w->bytes > 0)
        printf("  %6.2f TB/s %5.1f%% of copy", w->bytes / t / 1e12, 100 * w->bytes / t / copy_bw);
    if (w->flops > 0)
        printf("  %6.2f TFLOP/s %5.1f%% of gemm", w->flops / t / 1e12, 100 * w->flops / t / mm_rate);
    r.floor = w->bytes > 0 ? w->bytes / copy_bw : w->flops > 0 ? w->flops / mm_rate : 0;
    bool tiny = !strcmp(w->name, "tiny_chain");
    if (tiny) {
        r.compiled = wall_per_call(call_body, &ud, 2000);
        printf("  wall %.2f us/call", r.compiled * 1e6);
    }
    /* the first call runs the workload once too: what it costs beyond
     * that run (tracing, plan and kernel loading) is the overhead */
    printf("  first-call %.3f s (+%.1f ms over a call)  kernels %d (compiled %lld, from cache %lld, "
           "graphs lowered %lld)", r.cold, (r.cold - t) * 1e3, st.kernels,
           (long long)st.kernels_compiled, (long long)st.kernels_loaded,
           (long long)st.graphs_lowered);
    if (!strncmp(w->name, "sw_", 3)) { /* the sweep: Ember's eager ops beside it */
        eager_ud eu = {w};
        r.eager = time_events_queued(eager_body, &eu, reps, SWEEP_QUEUE);
        printf("  eager %.3f ms  single call %.3f ms", r.eager * 1e3, single * 1e3);
    }
    if (self) { /* --json: eager times and the warm first call too */
        eager_ud eu = {w};
        r.eager = tiny ? wall_per_call(eager_body, &eu, 2000) : time_events(eager_body, &eu, reps);
        r.lazy = tiny ? wall_per_call(lazy_body, &eu, 2000) : time_events(lazy_body, &eu, reps);
        r.warm = warm_first_call(self, w->name);
        printf("  eager %.3f ms  lazy %.3f ms  warm first-call %.3f s", r.eager * 1e3, r.lazy * 1e3,
               r.warm);
    }
    printf("\n");
    fflush(stdout);
    em_compiled_free(f);
    return r;
}

static const char *const names[] = {"pointwise", "softmax", "layernorm", "mlp", "attention_block",
                                    "tiny_chain", "sum_all"};
enum { NWORKLOADS = sizeof names / sizeof names[0] };

/* --first-call NAME: the child of a warm first-call measurement. */
static int first_call_child(const char *name) {
    if (!em_device_available(GPU)) return 1;
    em_generator *g = em_generator_new(0);
    workload w = {.name = name};
    setup(&w, g);
    sync_gpu();
    printf("%.6f\n", first_call(&w, NULL));
    for (int k = 0; k < w.nin; k++) em_release(w.in[k]);
    em_generator_free(g);
    return 0;
}

static void json_begin(FILE *jf, const char *dev, double copy_bw, double mm_rate) {
    fprintf(jf, "{\"device_type\": \"cuda\", \"device\": \"%s\", \"threads\": 0, \"copy_tbs\": %.4f, "
            "\"sgemm_tflops\": %.3f, \"triad_gbs\": %.3f, \"sgemm_gflops\": %.3f, \"workloads\": [",
            dev, copy_bw / 1e12, mm_rate / 1e12, copy_bw / 1e9, mm_rate / 1e9);
}

static void json_row(FILE *jf, int k, const char *name, const result *r) {
    fprintf(jf, "%s{\"name\": \"%s\", \"eager_ms\": %.6f, \"compiled_ms\": %.6f, \"lazy_ms\": %.6f, "
            "\"floor_ms\": %.6f, \"cold_first_ms\": %.3f, \"warm_first_ms\": %.3f, \"kernels\": %d}",
            k ? ", " : "", name, r->eager * 1e3, r->compiled * 1e3, r->lazy * 1e3, r->floor * 1e3,
            r->cold * 1e3,
            r->warm < 0 ? -1.0 : r->warm * 1e3, r->kernels);
}

int main(int argc, char **argv) {
    const char *only = "", *json = NULL;
    int reps = 20;
    bool sweeping = false, graphs = false;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--sweep") || !strcmp(argv[i], "--graphs")) { /* flags */
            if (!strcmp(argv[i], "--graphs")) graphs = true;
            else sweeping = true;
            memmove(&argv[i], &argv[i + 1], sizeof *argv * (size_t)(argc - i));
            argc--, i--;
        }
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--only")) only = argv[i + 1];
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--json")) json = argv[i + 1];
        else if (!strcmp(argv[i], "--dtype")) {
            const char *d = argv[i + 1];
            bench_dtype = !strcmp(d, "bf16") ? EM_BF16 : !strcmp(d, "f16") ? EM_F16 : EM_F32;
            if (bench_dtype == EM_F32 && strcmp(d, "f32")) {
                fprintf(stderr, "bench_cuda: --dtype is f32, f16 or bf16, not '%s'\n", d);
                return 2;
            }
        } else if (!strcmp(argv[i], "--first-call")) return first_call_child(argv[i + 1]);
    }
    if (reps < 1 || reps > 10000) reps = 20;
    if (!em_device_available(GPU)) {
        printf("SKIP: no CUDA device: %s\n", em_last_error());
        return 77;
    }
    /* before the first op, which opens the kernel cache */
    char cache[] = "/tmp/ember-bench-cuda-cache-XXXXXX";
    bool own_cache = json && !getenv("EMBER_CACHE_DIR");
    if (own_cache && (!mkdtemp(cache) || setenv("EMBER_CACHE_DIR", cache, 1) != 0)) {
        fprintf(stderr, "bench_cuda: cannot make a cache folder in /tmp\n");
        return 1;
    }
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (json && !jf) {
        fprintf(stderr, "bench_cuda: cannot write %s\n", json);
        return 1;
    }
    if (graphs) return graphs_bench();
    cuda_device_info info;
    if (cuda_device_info_get(GPU_INDEX, &info) != EM_OK) die("device info");
    char *name = info.name;
    for (char *c = name; *c; c++)
        if (*c == '"' || *c == '\\') *c = ' ';
    printf("device %s, sm_%d%d, %d SMs, tf32 %s, dtype %s\n", name, info.major, info.minor,
           info.sm_count, info.tf32 ? "on" : "off", em_dtype_name(bench_dtype));
    /* floors: 1 GiB device copy (read + write), f32 GEMM 8192^3 */
    int64_t n = (int64_t)1 << 28;
    em_tensor *a = em_empty(1, &n, EM_F32, GPU), *b = em_empty(1, &n, EM_F32, GPU);
    if (!a || !b) die("alloc");
    copy_ud cu = {b, a};
    double tc = time_events(copy_body, &cu, 20), copy_bw = 2.0 * n * 4 / tc;
    em_release(a);
    em_release(b);
    em_generator *g = em_generator_new(0);
    int64_t m = 8192;
    mm_ud mm = {randn(g, 2, (int64_t[]){m, m}, 1), randn(g, 2, (int64_t[]){m, m}, 1)};
    double tm = time_events(mm_body, &mm, 10), mm_rate = 2.0 * m * m * m / tm;
    em_release(mm.a);
    em_release(mm.b);
    printf("floor: d2d copy %.2f TB/s (read+write), sgemm 8192^3 %.1f TFLOP/s\n", copy_bw / 1e12,
           mm_rate / 1e12);
    if (jf) json_begin(jf, name, copy_bw, mm_rate);
    int rows = 0;
    int nrows = sweeping ? NSWEEP : NWORKLOADS;
    for (int i = 0; i < nrows; i++) {
        const char *wn = sweeping ? sweep[i].name : names[i];
        if (*only && !strstr(only, wn)) continue;
        workload w = {.name = wn};
        setup(&w, g);
        result r = run(&w, reps, copy_bw, mm_rate, jf ? argv[0] : NULL);
        /* sum_all is not a WORKLOADS.md workload: printed, not in the JSON */
        if (jf && strcmp(wn, "sum_all")) json_row(jf, rows++, wn, &r);
        for (int k = 0; k < w.nin; k++) em_release(w.in[k]);
    }
    em_generator_free(g);
    if (jf) {
        fprintf(jf, "]}\n");
        fclose(jf);
    }
    if (own_cache) {
        char rm[128];
        snprintf(rm, sizeof rm, "rm -rf '%s'", cache);
        if (system(rm) != 0) fprintf(stderr, "bench_cuda: could not remove %s\n", cache);
    }
    return 0;
}

#else
int main(void) {
    printf("SKIP: built without the CUDA headers\n");
    return 77;
}
#endif
