/* bench_attention.c - issue 16's attention-only sweep, Ember's side
 * (bench/torch_attention.py is PyTorch's): for T = 128 ... max-t, head
 * dims 64 and 128, causal or a padding mask, the median time of
 *  eager     em_scaled_dot_product_attention run eagerly: its
 *            decomposition, the T x T scores materialized;
 *  compiled  the same function under em_compile: the attention pass makes
 *            it one fused step (tiled, online softmax: the CPU kernel, or
 *            on CUDA the generated flash kernel).
 *
 *   bench_attention [--device cpu|cuda] [--reps N] [--max-t T] [--batch B]
 *                   [--heads H] [--json FILE] [--no-eager] [--dtype f32|bf16|f16]
 *   bench_attention --memory       peak RSS of compiled causal attention
 *                                  at T = 1024 ... 8192 (CPU, fused only;
 *                                  the tracing call records lazily)
 *
 * The padding mask is bool [B, 1, 1, T], keeping the first 3T/4 keys.  On
 * CUDA a sample is a run of calls ended by a wait for the device (a host
 * read), divided by their number: the kernels queue back to back, as in
 * a model; torch_attention.py --device cuda times torch the same way. */
#include <ember.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench_stats.h"

typedef struct point {
    int64_t B, T, D;
    bool causal;
    em_device dev;
    em_dtype dtype; /* of q, k and v: f32, bf16 or f16 */
    double host; /* on a GPU: the last run's host seconds per call, before its wait */
} point;

static em_status attn_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)s;
    const point *p = ctx;
    out[0] = em_scaled_dot_product_attention(in[0], in[1], in[2], p->causal ? NULL : in[3], p->causal,
                                             EM_SCALE_DEFAULT);
    return out[0] ? EM_OK : em_last_status();
}

/* The bool padding mask [B, 1, 1, T]: true for the first 3T/4 keys. */
static em_tensor *padding_mask(const point *p) {
    em_tensor *keep = em_lt(em_arange(0, (double)p->T, 1, EM_I64, p->dev),
                            em_scalar((double)(3 * p->T / 4), EM_I64, p->dev));
    keep = em_expand(em_reshape(keep, 4, (int64_t[]){1, 1, 1, p->T}), 4,
                     (int64_t[]){p->B, 1, 1, p->T});
    return em_contiguous(keep);
}

/* Runs n calls of f (the eager function when NULL), then waits for the
 * device when it is a GPU (a host read of the last result); seconds per
 * call, or -1 on failure. */
static double run_calls(em_compiled *f, point *p, em_tensor *const *in, int n) {
    double t0 = bench_now(), v;
    em_status s = EM_OK;
    for (int i = 0; i < n && s == EM_OK; i++) {
        em_scope_begin();
        em_tensor *out = NULL;
        s = f ? em_call(f, in, NULL, &out) : attn_fn(p, in, NULL, &out);
        if (s == EM_OK && i == n - 1 && p->dev.type == EM_CUDA) {
            p->host = (bench_now() - t0) / n;
            s = em_item(em_slice(em_reshape(out, 1, (int64_t[]){em_numel(out)}), 0, 0, 1, 1), &v);
        }
        em_scope_end();
    }
    if (s != EM_OK) {
        fprintf(stderr, "bench_attention: %s\n", em_last_error());
        return -1;
    }
    return (bench_now() - t0) / n;
}

/* Median seconds per call of reps samples (after one untimed call) of f,
 * or of the eager function when f is NULL; -1 on failure.  On a GPU a
 * sample is as many calls as fill about 5 ms. */
static double time_calls(em_compiled *f, point *p, em_tensor *const *in, int reps) {
    double first = run_calls(f, p, in, 1);
    int n = 1;
    if (first >= 0 && p->dev.type == EM_CUDA) {
        double one = run_calls(f, p, in, 1);
        n = one <= 0 ? 1 : one > 5e-3 ? 1 : (int)(5e-3 / one) + 1;
        if (n > 200) n = 200;
    }
    double *t = first >= 0 ? malloc(sizeof *t * (size_t)reps * 2) : NULL, med = -1;
    for (int i = 0; t && i < reps; i++) {
        if ((t[i] = run_calls(f, p, in, n)) < 0) {
            free(t);
            return -1;
        }
        t[reps + i] = p->host;
    }
    if (t) {
        med = median(t, reps);
        p->host = median(t + reps, reps);
    }
    free(t);
    return med;
}

/* q, k, v [B, H, T, D] and the mask into in. */
static bool make_inputs(em_generator *g, const point *p, int64_t H, em_tensor **in) {
    int64_t sz[4] = {p->B, H, p->T, p->D};
    for (int i = 0; i < 3; i++) {
        in[i] = em_randn(g, 4, sz, EM_F32, p->dev);
        if (p->dtype != EM_F32) in[i] = em_contiguous(em_cast(in[i], p->dtype));
    }
    in[3] = padding_mask(p);
    return in[0] && in[1] && in[2] && in[3];
}

/* lazy: the tracing call records without computing (lazy_trace 1), so
 * that the decomposition's eager run does not materialize the scores. */
static em_compiled *compile_point(point *p, bool lazy) {
    em_compile_options o = {.ninputs = 4, .noutputs = 1, .name = "attention",
                            .backend = p->dev.type == EM_CUDA ? "cuda" : "cpu",
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
    printf("peak RSS of compiled (fused) causal attention, B=1 H=%lld D=64\n", (long long)H);
    for (int64_t T = 1024; T <= 8192; T *= 2) {
        point p = {1, T, 64, true, em_cpu(), EM_F32, 0};
        em_scope_begin();
        em_tensor *in[4];
        em_compiled *f = make_inputs(g, &p, H, in) ? compile_point(&p, true) : NULL;
        double t = f ? time_calls(f, &p, in, 1) : -1;
        em_compiled_free(f);
        em_scope_end();
        if (t < 0) return 1;
        printf("T=%-5lld %8.1f ms   peak RSS %ld MB (q, k, v, out: %lld MB; scores would be %lld MB)\n",
               (long long)T, t * 1e3, peak_rss_mb(), (long long)(4 * H * T * 64 * 4 >> 20),
               (long long)(H * T * T * 4 >> 20));
    }
    em_generator_free(g);
    return 0;
}

int main(int argc, char **argv) {
    int reps = 5;
    int64_t max_t = -1, H = -1, batch = -1;
    const char *json = NULL, *device = "cpu", *dtype_name = "f32";
    bool memory = false, no_eager = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) batch = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--max-t") && i + 1 < argc) max_t = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--heads") && i + 1 < argc) H = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--memory")) memory = true;
        else if (!strcmp(argv[i], "--no-eager")) no_eager = true;
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) dtype_name = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--device cpu|cuda] [--reps N] [--max-t T] [--batch B] "
                    "[--heads H] [--json FILE] [--no-eager] [--dtype f32|bf16|f16] [--memory]\n", argv[0]);
            return 2;
        }
    }
    bool gpu = !strcmp(device, "cuda");
    if (!gpu && strcmp(device, "cpu")) {
        fprintf(stderr, "bench_attention: --device is cpu or cuda, not '%s'\n", device);
        return 2;
    }
    em_dtype dtype = !strcmp(dtype_name, "f32") ? EM_F32 : !strcmp(dtype_name, "bf16") ? EM_BF16
                   : !strcmp(dtype_name, "f16") ? EM_F16 : EM_DTYPE_COUNT;
    if (dtype == EM_DTYPE_COUNT) {
        fprintf(stderr, "bench_attention: --dtype is f32, bf16 or f16, not '%s'\n", dtype_name);
        return 2;
    }
    /* the GPU's defaults give 64 heads: a T = 128 sweep point fills it */
    if (max_t < 0) max_t = gpu ? 8192 : 4096;
    if (H < 0) H = gpu ? 16 : 8;
    if (batch < 0) batch = gpu ? 4 : 1;
    if (reps < 1 || reps > 1000 || max_t < 1 || H < 1 || H > 64 || batch < 1 || batch > 64) {
        fprintf(stderr, "bench_attention: bad --reps, --max-t, --batch or --heads\n");
        return 2;
    }
    em_device dev = gpu ? em_cuda(0) : em_cpu();
    if (!em_device_available(dev)) {
        fprintf(stderr, "bench_attention: %s\n", em_last_error());
        return 1;
    }
    if (memory) return memory_sweep(H);
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (json && !jf) {
        fprintf(stderr, "bench_attention: cannot write %s\n", json);
        return 1;
    }
    if (jf) fprintf(jf, "[\n");
    em_generator *g = em_generator_new(0);
    printf("attention sweep on %s, B=%lld H=%lld, %s, %d threads, median of %d (ms)\n", device,
           (long long)batch, (long long)H, dtype_name, em_num_threads(), reps);
    printf("%-6s %-4s %-8s %10s %10s %8s%s\n", "T", "D", "mask", "eager", "compiled", "speedup",
           gpu ? "   host/call (us)" : "");
    int rc = 0, first = 1;
    for (int64_t T = 128; T <= max_t && rc == 0; T = T == 128 ? 512 : T * 2) {
        for (int64_t D = 64; D <= 128 && rc == 0; D *= 2) {
            for (int causal = 1; causal >= 0 && rc == 0; causal--) {
                point p = {batch, T, D, causal, dev, dtype, 0};
                em_scope_begin();
                em_tensor *in[4];
                em_compiled *f = make_inputs(g, &p, H, in) ? compile_point(&p, false) : NULL;
                double te = !f ? -1 : no_eager ? NAN : time_calls(NULL, &p, in, reps);
                double tc = !(te < 0) ? time_calls(f, &p, in, reps) : -1;
                em_compiled_free(f);
                em_scope_end();
                if (tc < 0) {
                    rc = 1;
                    break;
                }
                const char *mask = causal ? "causal" : "padding";
                printf("%-6lld %-4lld %-8s %10.3f %10.3f %7.2fx", (long long)T, (long long)D, mask,
                       te * 1e3, tc * 1e3, te / tc);
                if (gpu) printf(" %10.1f", p.host * 1e6); /* compiled's, timed last */
                printf("\n");
                char eager[32] = "NaN"; /* Python's json reads NaN */
                if (!isnan(te)) snprintf(eager, sizeof eager, "%.4f", te * 1e3);
                if (jf)
                    fprintf(jf, "%s  {\"T\": %lld, \"D\": %lld, \"mask\": \"%s\", \"eager_ms\": %s, "
                            "\"compiled_ms\": %.4f}", first ? "" : ",\n", (long long)T, (long long)D,
                            mask, eager, tc * 1e3);
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
