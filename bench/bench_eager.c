/* bench_eager.c - the workloads of WORKLOADS.md on the CPU: Ember eager
 * and em_compile (fused libgccjit kernels), with the machine's floors
 * measured in the same run.
 *
 *   bench/bench_eager [--reps N] [--only NAME] [--json FILE] [--async] [--dtype f32|bf16|f16]
 *
 * Beside them, gpt2_small: GPT-2 small's forward (bench/gpt2_small.h; 12
 * layers, batch 2 x 64 tokens, seeded random weights), issue 17's model.
 * The sgemm floor is the faster of OpenBLAS and oneDNN on every thread.
 * For each workload: eager, compiled and lazy-mode (EMBER_JIT's path: the
 * eager code recorded, then computed with em_realize) medians, the speedups, the
 * fraction of the floor (bytes at the measured triad bandwidth, or FLOP at
 * the measured sgemm rate) the compiled version reaches, and the latency of
 * the first compiled call: cold (empty kernel cache, this process) and
 * warm (a new process, the cache filled by this one).  The kernel cache
 * is a fresh temporary directory.  --async compiles with async_compile
 * (docs/compile.md); with --first-call I it also prints, on a second line,
 * how long until a call is served by the compiled entry. */
#include "bench_stats.h"
#include <ember.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>
#include <dlfcn.h>

#include "gpt2_small.h"
#include "workloads.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}


/* t seconds as "12.345 ms", or "0.390 us" below 0.1 ms. */
static const char *fmt_time(double t, char *buf) {
    if (t < 1e-4) sprintf(buf, "%7.3f us", t * 1e6);
    else sprintf(buf, "%7.3f ms", t * 1e3);
    return buf;
}

static em_generator *gen;
/* --dtype: the workloads' inputs (and so their math) in f32, f16 or bf16;
 * gpt2_small's weights stay f32, so it runs in f32 only */
static em_dtype bench_dtype = EM_F32;

static em_tensor *rnd(int ndim, const int64_t *sizes, double scale) {
    em_tensor *t = em_randn(gen, ndim, sizes, EM_F32, em_cpu());
    if (scale != 1.0) t = em_mul_scalar(t, scale);
    return bench_dtype == EM_F32 ? t : em_cast(t, bench_dtype);
}
#define RND(scale, ...) rnd(sizeof((int64_t[]){__VA_ARGS__}) / 8, (int64_t[]){__VA_ARGS__}, scale)

/* ---- workloads: each runs once, in its own scope ---- */

typedef struct workload {
    const char *name;
    em_tensor *in[14];
    double bytes, flops;
    em_tensor *(*run)(em_tensor *const *in); /* workloads.h */
} workload;

enum { B = 1, T = 128, E = 256, NH = 4, HD = E / NH };

static em_tensor *attention_block(em_tensor *const *in) { return wl_attention_block(in, NH); }

/* GPT-2 small's forward (bench/gpt2_small.h) on in[0]: its weights are
 * constants of the compiled function, as a model's are. */
static g2_model gpt2;
static em_tensor *gpt2_small(em_tensor *const *in) { return g2_forward(&gpt2, in[0]); }

/* em_compile's view of a workload: its tensors are the inputs */
static em_status run_workload(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)s;
    const workload *w = ctx;
    out[0] = w->run(in);
    return out[0] ? EM_OK : em_last_status();
}

static int ninputs(const workload *w) {
    int n = 0;
    while (n < 14 && w->in[n]) n++;
    return n;
}

static int async_compile = -1; /* --async: 1 */

static em_compiled *compile_workload(workload *w) {
    em_compile_options o = {.ninputs = ninputs(w), .noutputs = 1, .name = w->name,
                            .async_compile = async_compile};
    return em_compile(run_workload, w, &o);
}

/* Async: seconds from the first call's start until a call is served by
 * the compiled entry (calls repeated meanwhile), or -1. */
static double until_compiled(em_compiled *f, workload *w, double t0) {
    em_compile_stats st;
    for (int i = 0; i < 100000; i++) {
        em_compiled_stats(f, &st);
        if (st.hits > st.pending) return now() - t0;
        em_tensor *y;
        em_scope_begin();
        em_status s = em_call(f, w->in, NULL, &y);
        em_scope_end();
        if (s != EM_OK) return -1;
    }
    return -1;
}

/* The first call of a fresh compiled function, in seconds; async: *ready
 * gets the time until the compiled entry serves (else -1). */
static double first_call(workload *w, double *ready) {
    em_compiled *f = compile_workload(w);
    em_tensor *y;
    em_scope_begin();
    double t0 = now();
    em_status s = em_call(f, w->in, NULL, &y);
    double dt = now() - t0;
    em_scope_end();
    *ready = async_compile > 0 && s == EM_OK ? until_compiled(f, w, t0) : -1;
    em_compiled_free(f);
    return s == EM_OK ? dt : -1;
}

/* ---- floors ---- */

typedef struct triad_part {
    float *a, *b, *c;
    int64_t lo, hi;
} triad_part;

static void *triad_run(void *arg) {
    triad_part *t = arg;
    for (int64_t i = t->lo; i < t->hi; i++) t->c[i] = t->a[i] * 1.5f + t->b[i];
    return NULL;
}

/* c = a*1.5 + b over 3 x 128 MiB, on as many threads as Ember uses. */
static double triad_bandwidth(void) {
    int64_t n = 1 << 25;
    float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n),
          *c = malloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) a[i] = 1, b[i] = 2, c[i] = 0;
    int nt = em_num_threads() < 64 ? em_num_threads() : 64;
    pthread_t th[64];
    triad_part parts[64];
    double best[7];
    for (int r = 0; r < 7; r++) {
        double t0 = now();
        for (int k = 0; k < nt; k++) {
            parts[k] = (triad_part){a, b, c, n * k / nt, n * (k + 1) / nt};
            pthread_create(&th[k], NULL, triad_run, &parts[k]);
        }
        for (int k = 0; k < nt; k++) pthread_join(th[k], NULL);
        best[r] = 3.0 * 4 * n / (now() - t0);
    }
    free(a), free(b), free(c);
    return median(best, 7);
}

typedef int dnnl_sgemm_fn(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t,
                          const float *, int64_t, float, float *, int64_t);

/* The sgemm floor: a 1024^3 product on every thread, on OpenBLAS (linked,
 * its own threads) and on oneDNN where it is installed (its OpenMP
 * threads, as many as Ember's); the faster is the floor.  *blas and
 * *onednn get each rate (0: not there). */
static double sgemm_rate(double *blas, double *onednn) {
    int n = 1024;
    float *a = calloc((size_t)n * n, 4), *b = calloc((size_t)n * n, 4), *c = calloc((size_t)n * n, 4);
    void *h = dlopen("libdnnl.so.3", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    dnnl_sgemm_fn *dn = h ? (dnnl_sgemm_fn *)dlsym(h, "dnnl_sgemm") : NULL;
    void (*omp_threads)(int) = h ? (void (*)(int))dlsym(h, "omp_set_num_threads") : NULL;
    if (dn && omp_threads) omp_threads(em_num_threads());
    /* one library after the other (the first run of each warms it up):
     * each one's threads spin a while after a call, slowing the other's */
    double r[5], d[5] = {0};
    for (int i = 0; dn && i < 6; i++) {
        double t0 = now();
        dn('N', 'N', n, n, n, 1, a, n, b, n, 0, c, n);
        if (i) d[i - 1] = 2.0 * n * n * n / (now() - t0);
    }
    for (int i = 0; i < 6; i++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        if (i) r[i - 1] = 2.0 * n * n * n / (now() - t0);
    }
    free(a), free(b), free(c);
    *blas = median(r, 5), *onednn = median(d, 5);
    return *blas > *onednn ? *blas : *onednn;
}

int main(int argc, char **argv) {
    int reps = 21, first = -1;
    const char *json = NULL, *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--first-call") && i + 1 < argc) first = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--async")) async_compile = 1;
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc &&
                 (!strcmp(argv[i + 1], "f32") || !strcmp(argv[i + 1], "bf16") ||
                  !strcmp(argv[i + 1], "f16"))) {
            const char *d = argv[++i];
            bench_dtype = !strcmp(d, "bf16") ? EM_BF16 : !strcmp(d, "f16") ? EM_F16 : EM_F32;
        } else {
            fprintf(stderr, "usage: %s [--reps N] [--only NAME] [--json FILE] [--async] "
                    "[--dtype f32|bf16|f16]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > 1000) reps = 21;
    gen = em_generator_new(0);
    em_scope_begin();
    em_generator *g2 = em_generator_new(22);
    if (!g2_model_init(&gpt2, G2_NL, g2)) {
        fprintf(stderr, "gpt2_small: %s\n", em_last_error());
        return 1;
    }
    em_generator_free(g2);
    const int64_t N = 1 << 22, R = 8192, C = 1024, M = 256, K = 512, H = 2048;
    em_tensor *mask = em_where(em_gt(em_unsqueeze(em_arange(0, T, 1, EM_I64, em_cpu()), 0),
                                     em_unsqueeze(em_arange(0, T, 1, EM_I64, em_cpu()), 1)),
                               em_scalar(-INFINITY, EM_F32, em_cpu()),
                               em_scalar(0, EM_F32, em_cpu()));
    if (bench_dtype != EM_F32) mask = em_cast(mask, bench_dtype);
    double esz = (double)em_dtype_size(bench_dtype);
    double blk_flops = 2.0 * B * T * (E * 3.0 * E + E * E + 8.0 * E * E) + 4.0 * B * NH * T * T * HD;
    workload w[] = {
        {"pointwise", {RND(1, N), RND(1, N), RND(1, N)}, 4.0 * esz * N, 0, wl_pointwise},
        {"softmax", {RND(1, R, C)}, 2.0 * esz * R * C, 0, wl_softmax},
        {"layernorm", {RND(1, R, C), RND(1, C), RND(1, C)}, 2.0 * esz * R * C, 0, wl_layernorm},
        {"mlp", {RND(1, M, K), RND(1 / sqrt(K), K, H), RND(1, H), RND(1 / sqrt(H), H, K), RND(1, K)},
         0, 2.0 * M * K * H * 2, wl_mlp},
        {"attention_block",
         {RND(1, B, T, E), RND(1, E), RND(1, E), RND(1 / sqrt(E), E, 3 * E), RND(1, 3 * E),
          RND(1 / sqrt(E), E, E), RND(1, E), RND(1, E), RND(1, E), RND(1 / sqrt(E), E, 4 * E),
          RND(1, 4 * E), RND(1 / sqrt(4 * E), 4 * E, E), RND(1, E), mask},
         0, blk_flops, attention_block},
        {"tiny_chain", {RND(1, 16), RND(1, 16)}, 0, 0, wl_tiny_chain},
        {"gpt2_small", {RND(1, G2_B, G2_T, G2_C)}, 0, g2_flops(G2_B, G2_T), gpt2_small},
    };
    int nw = sizeof w / sizeof w[0];
    if (first >= 0 && first < nw) { /* the child of a warm first-call measurement */
        double ready, t = first_call(&w[first], &ready);
        printf("%.6f\n", t);
        if (async_compile > 0) printf("%.6f\n", ready);
        return 0;
    }
    char cache[] = "/tmp/ember-bench-cache-XXXXXX";
    if (!mkdtemp(cache)) return 1;
    setenv("EMBER_CACHE_DIR", cache, 1);
    double mm_blas, mm_onednn, bw = triad_bandwidth(), mm = sgemm_rate(&mm_blas, &mm_onednn);
    printf("Ember on the CPU, %d threads; floors measured now: triad %.1f GB/s, sgemm %.1f GFLOP/s "
           "(the faster of OpenBLAS %.1f and oneDNN %.1f)\n", em_num_threads(), bw / 1e9, mm / 1e9,
           mm_blas / 1e9, mm_onednn / 1e9);
    printf("%-16s %10s %10s %8s %9s %11s %11s %8s %10s %8s\n", "workload", "eager", "compiled",
           "speedup", "of floor", "cold first", "warm first", "kernels", "lazy", "speedup");
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (jf) fprintf(jf, "{\"threads\": %d, \"triad_gbs\": %.3f, \"sgemm_gflops\": %.3f, \"workloads\": [",
                    em_num_threads(), bw / 1e9, mm / 1e9);
    int printed = 0;
    for (int i = 0; i < nw; i++) {
        if (only && strcmp(only, w[i].name)) continue;
        if (bench_dtype != EM_F32 && w[i].run == gpt2_small) continue; /* f32 weights */
        int r = w[i].flops == 0 && w[i].bytes == 0 ? reps * 50 : reps;
        double *te = malloc(sizeof(double) * r), *tc = malloc(sizeof(double) * r),
               *tl = malloc(sizeof(double) * r);
        double ready, cold = first_call(&w[i], &ready);
        char cmd[512];
        snprintf(cmd, sizeof cmd, "'%s' --dtype %s --first-call %d%s", argv[0],
                 em_dtype_name(bench_dtype), i, async_compile > 0 ? " --async" : "");
        FILE *p = popen(cmd, "r");
        double warm = -1;
        if (!p || fscanf(p, "%lf", &warm) != 1) warm = -1;
        if (p) pclose(p);
        em_compiled *f = compile_workload(&w[i]);
        em_compile_stats st = {0};
        for (int k = -3; k < r; k++) {
            em_scope_begin();
            double t0 = now();
            em_tensor *y = w[i].run(w[i].in);
            double t1 = now();
            em_status s = em_call(f, w[i].in, NULL, &y);
            double t2 = now();
            /* lazy mode: the same eager code, recorded, then computed */
            em_lazy_begin();
            em_tensor *z = w[i].run(w[i].in);
            em_status sz = em_realize(z);
            em_lazy_end();
            double t3 = now();
            if (!y || s != EM_OK || !z || sz != EM_OK) {
                fprintf(stderr, "%s failed: %s\n", w[i].name, em_last_error());
                return 1;
            }
            em_scope_end();
            if (k >= 0) te[k] = t1 - t0, tc[k] = t2 - t1, tl[k] = t3 - t2;
        }
        em_compiled_stats(f, &st);
        em_compiled_free(f);
        double me = median(te, r), mc = median(tc, r), ml = median(tl, r);
        free(te), free(tc), free(tl);
        double floor = w[i].flops ? w[i].flops / mm : w[i].bytes / bw;
        char fl[32] = "-";
        if (floor > 0) snprintf(fl, sizeof fl, "%.1f%%", 100 * floor / mc);
        char b1[32], b2[32];
        char b3[32];
        printf("%-16s %10s %10s %7.2fx %9s %8.1f ms %8.1f ms %8d %10s %7.2fx\n", w[i].name,
               fmt_time(me, b1), fmt_time(mc, b2), me / mc, fl, cold * 1e3, warm * 1e3, st.kernels,
               fmt_time(ml, b3), me / ml);
        if (jf) fprintf(jf, "%s{\"name\": \"%s\", \"eager_ms\": %.6f, \"compiled_ms\": %.6f, "
                        "\"lazy_ms\": %.6f, \"floor_ms\": %.6f, \"cold_first_ms\": %.3f, "
                        "\"warm_first_ms\": %.3f, \"kernels\": %d}", printed++ ? ", " : "",
                        w[i].name, me * 1e3, mc * 1e3, ml * 1e3, floor * 1e3, cold * 1e3,
                        warm * 1e3, st.kernels);
    }
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf '%s'", cache);
    if (system(rm) != 0) fprintf(stderr, "could not remove %s\n", cache);
    if (jf) {
        fprintf(jf, "]}\n");
        fclose(jf);
    }
    em_scope_end();
    em_generator_free(gen);
    return 0;
}
