/* bench_blas - single-threaded sgemm rates of the BLAS libraries Ember can
 * load, on the shapes of the models it runs (issue 17: choose the CPU GEMM
 * path from measurements, on every CPU).
 *
 *   bench_blas [LIBRARY ...]
 *
 * Each LIBRARY is a shared object exporting cblas_sgemm (or oneDNN's
 * dnnl_sgemm), loaded on its own (RTLD_LOCAL); without arguments,
 * OpenBLAS, BLIS and oneDNN at their Debian paths.
 * For each it prints the kernel set it chose (openblas_get_corename,
 * bli_arch_string) and, per shape, the median GFLOP/s of one thread.  Ember
 * runs the BLAS single-threaded inside its own pool (src/eager/cpu_matmul.c),
 * so one thread is the rate that matters.  OPENBLAS_CORETYPE, read when
 * OpenBLAS loads, applies as usual: run it again with it set to compare. */
#include "bench_stats.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111 };

typedef void sgemm_fn(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                      int lda, const float *b, int ldb, float beta, float *c, int ldc);

typedef struct shape {
    const char *what;
    int m, k, n;
} shape;

static const shape shapes[] = {
    {"minilm b32 qkv/out 384x384", 384, 384, 384},
    {"minilm b32 ffn up", 384, 384, 1536},
    {"minilm b32 ffn down", 384, 1536, 384},
    {"gpt2 b2t64 qkv", 128, 768, 2304},
    {"gpt2 b2t64 proj", 128, 768, 768},
    {"gpt2 b2t64 fc", 128, 768, 3072},
    {"gpt2 b2t64 fc proj", 128, 3072, 768},
    {"attention head t64 d64", 64, 64, 64},
    {"attention head t128 d64 (pv)", 128, 128, 64},
    {"mlp (bench) up", 256, 512, 2048},
    {"square 1024", 1024, 1024, 1024},
};

static const char *const default_libs[] = {
    "libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/blis-serial/libblis.so.4",
    "libdnnl.so.2",
};

/* oneDNN has no cblas_sgemm: dnnl_sgemm (row-major, 64-bit sizes) on one
 * OpenMP thread, behind the cblas signature. */
typedef int dnnl_sgemm_fn(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t,
                          const float *, int64_t, float, float *, int64_t);
static dnnl_sgemm_fn *dnnl_sgemm;

static void dnnl_as_cblas(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                          int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    (void)order, (void)ta, (void)tb; /* row-major, no transposes: all this bench asks */
    dnnl_sgemm('N', 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* The kernel set lib chose, as it names it. */
static const char *core_of(void *h, char *buf, size_t n) {
    char *(*corename)(void) = (char *(*)(void))dlsym(h, "openblas_get_corename");
    int (*arch_id)(void) = (int (*)(void))dlsym(h, "bli_arch_query_id");
    const char *(*arch_str)(int) = (const char *(*)(int))dlsym(h, "bli_arch_string");
    if (dlsym(h, "dnnl_sgemm")) snprintf(buf, n, "oneDNN (JIT kernels for this CPU's ISA)");
    else if (corename) snprintf(buf, n, "OpenBLAS core %s", corename());
    else if (arch_id && arch_str) snprintf(buf, n, "BLIS arch %s", arch_str(arch_id()));
    else snprintf(buf, n, "unknown");
    return buf;
}

/* The median single-thread GFLOP/s of sgemm on s. */
static double rate(sgemm_fn *sgemm, const shape *s) {
    size_t na = (size_t)s->m * s->k, nb = (size_t)s->k * s->n, nc = (size_t)s->m * s->n;
    float *a = malloc(sizeof(float) * na), *b = malloc(sizeof(float) * nb), *c = malloc(sizeof(float) * nc);
    if (!a || !b || !c) {
        free(a), free(b), free(c);
        return 0;
    }
    for (size_t i = 0; i < na; i++) a[i] = (float)(i % 7) * 0.25f;
    for (size_t i = 0; i < nb; i++) b[i] = (float)(i % 5) * 0.5f;
    double flop = 2.0 * s->m * s->k * s->n, t[9];
    int reps = (int)(2e8 / flop) + 1; /* about 0.2 GFLOP per sample */
    sgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, s->m, s->n, s->k, 1, a, s->k, b, s->n, 0, c, s->n);
    for (int r = 0; r < 9; r++) {
        double t0 = bench_now();
        for (int i = 0; i < reps; i++)
            sgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, s->m, s->n, s->k, 1, a, s->k, b, s->n, 0, c, s->n);
        t[r] = (bench_now() - t0) / reps;
    }
    free(a), free(b), free(c);
    return flop / median(t, 9) / 1e9;
}

int main(int argc, char **argv) {
    int nlibs = argc > 1 ? argc - 1 : (int)(sizeof default_libs / sizeof *default_libs);
    const char *const *libs = argc > 1 ? (const char *const *)argv + 1 : default_libs;
    const char *ct = getenv("OPENBLAS_CORETYPE");
    printf("single-thread sgemm, GFLOP/s (median of 9)%s%s\n", ct ? ", OPENBLAS_CORETYPE=" : "",
           ct ? ct : "");
    int status = 0;
    for (int l = 0; l < nlibs; l++) {
        void *h = dlopen(libs[l], RTLD_NOW | RTLD_LOCAL);
        sgemm_fn *sgemm = h ? (sgemm_fn *)dlsym(h, "cblas_sgemm") : NULL;
        if (h && !sgemm && (dnnl_sgemm = (dnnl_sgemm_fn *)dlsym(h, "dnnl_sgemm"))) sgemm = dnnl_as_cblas;
        if (!sgemm) {
            printf("%s: not loaded (%s)\n", libs[l], h ? "no cblas_sgemm" : dlerror());
            status = 1;
            continue;
        }
        void (*threads)(int) = (void (*)(int))dlsym(h, "openblas_set_num_threads");
        if (!threads) threads = (void (*)(int))dlsym(h, "omp_set_num_threads"); /* oneDNN's */
        if (threads) threads(1);
        char core[128];
        printf("%s: %s\n", libs[l], core_of(h, core, sizeof core));
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
            printf("  %-30s %5dx%5dx%5d  %7.1f\n", shapes[i].what, shapes[i].m, shapes[i].k,
                   shapes[i].n, rate(sgemm, &shapes[i]));
    }
    return status;
}
