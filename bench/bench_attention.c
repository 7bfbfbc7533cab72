/* bench_attention.c - issue 16's attention-only sweep on the CPU, Ember's
 * side (bench/torch_attention.py is PyTorch's): for T = 128 ... 4096,
 * head dims 64 and 128, causal or a padding mask, the median time of
 *  eager     em_scaled_dot_product_attention run eagerly: its
 *            decomposition, the T x T scores materialized;
 *  compiled  the same function under em_compile (cpu backend): the
 *            attention pass makes it one fused step (tiled, online softmax).
 *
 *   bench_attention [--reps N] [--max-t T] [--heads H] [--json FILE]
 *   bench_attention --memory       peak RSS of compiled causal attention
 *                                  at T = 1024 ... 8192 (fused only; the
 *                                  tracing call records lazily)
 *
 * The padding mask is bool [B, 1, 1, T], keeping the first 3T/4 keys. */
#include <ember.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench_stats.h"

enum { B = 1 };

typedef struct point {
    int64_t T, D;
    bool causal;
} point;

static em_status attn_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)s;
    const point *p = ctx;
    out[0] = em_scaled_dot_product_attention(in[0], in[1], in[2], p->causal ? NULL : in[3], p->causal,
                                             EM_SCALE_DEFAULT);
    return out[0] ? EM_OK : em_last_status();
}

/* The bool padding mask [B, 1, 1, T]: true for the first 3T/4 keys. */
static em_tensor *padding_mask(int64_t T) {
    em_tensor *keep = em_lt(em_arange(0, (double)T, 1, EM_I64, em_cpu()),
                            em_scalar((double)(3 * T / 4), EM_I64, em_cpu()));
    return em_contiguous(em_reshape(keep, 4, (int64_t[]){B, 1, 1, T}));
}

/* Median seconds of reps calls (after one untimed call) of f, or of the
 * eager function when f is NULL; -1 on failure. */
static double time_calls(em_compiled *f, point *p, em_tensor *const *in, int reps) {
    double *t = malloc(sizeof *t * (size_t)reps), med = -1;
    for (int i = -1; t && i < reps; i++) {
        em_scope_begin();
        em_tensor *out = NULL;
        double t0 = bench_now();
        em_status s = f ? em_call(f, in, NULL, &out) : attn_fn(p, in, NULL, &out);
        double dt = bench_now() - t0;
        em_scope_end();
        if (s != EM_OK) {
            fprintf(stderr, "bench_attention: %s\n", em_last_error());
            free(t);
            return -1;
        }
        if (i >= 0) t[i] = dt;
    }
    if (t) med = median(t, reps);
    free(t);
    return med;
}

/* q, k, v [B, H, T, D] and the mask into in. */
static bool make_inputs(em_generator *g, const point *p, int64_t H, em_tensor **in) {
    int64_t sz[4] = {B, H, p->T, p->D};
    for (int i = 0; i < 3; i++) in[i] = em_randn(g, 4, sz, EM_F32, em_cpu());
    in[3] = padding_mask(p->T);
    return in[0] && in[1] && in[2] && in[3];
}

/* lazy: the tracing call records without computing (lazy_trace 1), so
 * that the decomposition's eager run does not materialize the scores. */
static em_compiled *compile_point(point *p, bool lazy) {
    em_compile_options o = {.ninputs = 4, .noutputs = 1, .name = "attention", .backend = "cpu",
                            .dynamic = -1, .lazy_trace = lazy ? 1 : -1};
    return em_compile(attn_fn, p, &o);
}

static long peak_rss_mb(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss / 1024;
}

/* Compiled causal attention only, growing T, traced lazily: the peak RSS
 * follows q, k, v and the output (linear in T), not the scores. */
static int memory_sweep(int64_t H) {
    em_generator *g = em_generator_new(0);
    printf("peak RSS of compiled (fused) causal attention, B=%d H=%lld D=64\n", B, (long long)H);
    for (int64_t T = 1024; T <= 8192; T *= 2) {
        point p = {T, 64, true};
        em_scope_begin();
        em_tensor *in[4];
        em_compiled *f = make_inputs(g, &p, H, in) ? compile_point(&p, true) : NULL;
        double t = f ? time_calls(f, &p, in, 1) : -1;
        em_compiled_free(f);
        em_scope_end();
        if (t < 0) return 1;
        printf("T=%-5lld %8.1f ms   peak RSS %ld MB (q, k, v, out: %lld MB; scores would be %lld MB)\n",
               (long long)T, t * 1e3, peak_rss_mb(), (long long)(4 * B * H * T * 64 * 4 >> 20),
               (long long)(B * H * T * T * 4 >> 20));
    }
    em_generator_free(g);
    return 0;
}

int main(int argc, char **argv) {
    int reps = 5;
    int64_t max_t = 4096, H = 8;
    const char *json = NULL;
    bool memory = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--max-t") && i + 1 < argc) max_t = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--heads") && i + 1 < argc) H = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--memory")) memory = true;
        else {
            fprintf(stderr, "usage: %s [--reps N] [--max-t T] [--heads H] [--json FILE] [--memory]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > 1000 || max_t < 1 || H < 1 || H > 64) {
        fprintf(stderr, "bench_attention: bad --reps, --max-t or --heads\n");
        return 2;
    }
    if (memory) return memory_sweep(H);
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (json && !jf) {
        fprintf(stderr, "bench_attention: cannot write %s\n", json);
        return 1;
    }
    if (jf) fprintf(jf, "[\n");
    em_generator *g = em_generator_new(0);
    printf("attention sweep, B=%d H=%lld, f32, %d threads, median of %d (ms)\n", B, (long long)H,
           em_num_threads(), reps);
    printf("%-6s %-4s %-8s %10s %10s %8s\n", "T", "D", "mask", "eager", "compiled", "speedup");
    int rc = 0, first = 1;
    for (int64_t T = 128; T <= max_t && rc == 0; T = T == 128 ? 512 : T * 2) {
        for (int64_t D = 64; D <= 128 && rc == 0; D *= 2) {
            for (int causal = 1; causal >= 0 && rc == 0; causal--) {
                point p = {T, D, causal};
                em_scope_begin();
                em_tensor *in[4];
                em_compiled *f = make_inputs(g, &p, H, in) ? compile_point(&p, false) : NULL;
                double te = f ? time_calls(NULL, &p, in, reps) : -1;
                double tc = te >= 0 ? time_calls(f, &p, in, reps) : -1;
                em_compiled_free(f);
                em_scope_end();
                if (tc < 0) {
                    rc = 1;
                    break;
                }
                const char *mask = causal ? "causal" : "padding";
                printf("%-6lld %-4lld %-8s %10.3f %10.3f %7.2fx\n", (long long)T, (long long)D, mask,
                       te * 1e3, tc * 1e3, te / tc);
                if (jf)
                    fprintf(jf, "%s  {\"T\": %lld, \"D\": %lld, \"mask\": \"%s\", \"eager_ms\": %.4f, "
                            "\"compiled_ms\": %.4f}", first ? "" : ",\n", (long long)T, (long long)D,
                            mask, te * 1e3, tc * 1e3);
                first = 0;
                fflush(stdout);
            }
        }
    }
    if (jf) {
        fprintf(jf, "\n]\n");
        fclose(jf);
    }
    em_generator_free(g);
    return rc;
}
