/* gpt_block.c - one GPT-2 decoder block on seeded random weights, eager
 * and through em_compile: the attention_block workload of the project's
 * benchmarks (B=1, T=128, C=256, 4 heads by default), for trying Ember
 * without any weights file.
 *
 *   gpt_block [--seq T] [--reps N]
 *
 * Prints the median time of each mode, the compiled function's first-call
 * latency and statistics, and the largest difference between the two. */
#include <ember.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { C = 256, NH = 4, HD = C / NH };

/* The block's weights: x @ w layouts ([in, out]), GPT-2's names. */
typedef struct block {
    em_tensor *ln1_w, *ln1_b, *w_qkv, *b_qkv, *w_proj, *b_proj;
    em_tensor *ln2_w, *ln2_b, *w_fc, *b_fc, *w_out, *b_out;
} block;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Normal values times scale, owned by the caller. */
static em_tensor *param(em_generator *g, int64_t rows, int64_t cols, double scale) {
    int64_t sizes[2] = {rows, cols};
    return em_mul_scalar(em_randn(g, cols ? 2 : 1, sizes, EM_F32, em_cpu()), scale);
}

static em_tensor *heads(em_tensor *qkv, int which, int64_t B, int64_t T) {
    em_tensor *t = em_slice(qkv, -1, which * C, (which + 1) * C, 1);
    return em_transpose(em_reshape(t, 4, (int64_t[]){B, T, NH, HD}), 1, 2);
}

/* Causal self-attention: a key after the query gets -inf before the softmax. */
static em_tensor *attention(const block *w, em_tensor *h) {
    int64_t B = em_size(h, 0), T = em_size(h, 1);
    em_tensor *qkv = em_add(em_matmul(h, w->w_qkv), w->b_qkv);
    em_tensor *q = heads(qkv, 0, B, T), *k = heads(qkv, 1, B, T), *v = heads(qkv, 2, B, T);
    em_tensor *pos = em_arange(0, (double)T, 1, EM_I64, em_cpu());
    em_tensor *future = em_gt(em_unsqueeze(pos, 0), em_unsqueeze(pos, 1));
    em_tensor *att = em_mul_scalar(em_matmul(q, em_transpose(k, -2, -1)), 1.0 / sqrt(HD));
    att = em_softmax(em_where(future, em_scalar(-INFINITY, EM_F32, em_cpu()), att), -1);
    em_tensor *y = em_reshape(em_transpose(em_matmul(att, v), 1, 2), 3, (int64_t[]){B, T, C});
    return em_add(em_matmul(y, w->w_proj), w->b_proj);
}

static em_status gpt_block(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)s;
    const block *w = ctx;
    em_tensor *x = in[0];
    x = em_add(x, attention(w, em_layer_norm(x, 1, w->ln1_w, w->ln1_b, 1e-5)));
    em_tensor *h = em_layer_norm(x, 1, w->ln2_w, w->ln2_b, 1e-5);
    h = em_gelu_tanh(em_add(em_matmul(h, w->w_fc), w->b_fc));
    out[0] = em_add(x, em_add(em_matmul(h, w->w_out), w->b_out));
    return out[0] ? EM_OK : em_last_status();
}

/* Runs the block reps times (after one untimed warm-up call if warmup)
 * and returns the median; the last output is copied into y. */
static double time_block(em_compiled *f, block *w, em_tensor *x, float *y, size_t nbytes, int reps,
                         bool warmup) {
    double *t = malloc(sizeof *t * (size_t)reps), med = -1;
    for (int i = warmup ? -1 : 0; t && i < reps; i++) {
        em_scope_begin();
        em_tensor *out = NULL;
        /* timed to the values on the host: the copy is part of both modes,
         * and under EMBER_JIT=1 it is what computes the eager block */
        double t0 = now();
        em_status s = f ? em_call(f, &x, NULL, &out) : gpt_block(w, &x, NULL, &out);
        bool ok = s == EM_OK && em_copy_to_host(out, y, nbytes) == EM_OK;
        double dt = now() - t0;
        em_scope_end();
        if (!ok) {
            fprintf(stderr, "gpt_block: %s\n", em_last_error());
            free(t);
            return -1;
        }
        if (i >= 0) t[i] = dt;
    }
    if (t) {
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        med = t[reps / 2];
    }
    free(t);
    return med;
}

int main(int argc, char **argv) {
    int64_t T = 128;
    int reps = 21;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seq") && i + 1 < argc) T = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--seq T] [--reps N]\n", argv[0]);
            return 2;
        }
    }
    if (T < 1 || T > 4096 || reps < 1 || reps > 10000) {
        fprintf(stderr, "gpt_block: --seq must be in [1, 4096] and --reps in [1, 10000]\n");
        return 2;
    }
    em_generator *g = em_generator_new(0);
    block w = {
        param(g, C, 0, 0.1), param(g, C, 0, 0.1), param(g, C, 3 * C, 1 / sqrt(C)), param(g, 3 * C, 0, 0.1),
        param(g, C, C, 1 / sqrt(C)), param(g, C, 0, 0.1), param(g, C, 0, 0.1), param(g, C, 0, 0.1),
        param(g, C, 4 * C, 1 / sqrt(C)), param(g, 4 * C, 0, 0.1), param(g, 4 * C, C, 1 / sqrt(4 * C)),
        param(g, C, 0, 0.1),
    };
    em_tensor *x = em_randn(g, 3, (int64_t[]){1, T, C}, EM_F32, em_cpu());
    em_tensor **all[] = {&w.ln1_w, &w.ln1_b, &w.w_qkv, &w.b_qkv, &w.w_proj, &w.b_proj,
                         &w.ln2_w, &w.ln2_b, &w.w_fc, &w.b_fc, &w.w_out, &w.b_out};
    int rc = 1;
    for (int i = 0; i < 12; i++)
        if (!*all[i]) goto done;
    if (!x) goto done;
    size_t nbytes = sizeof(float) * (size_t)T * C;
    float *ye = malloc(nbytes), *yc = malloc(nbytes);
    em_compile_options o = {.ninputs = 1, .noutputs = 1, .name = "gpt_block",
                            .input_names = (const char *[]){"x"}};
    em_compiled *f = em_compile(gpt_block, &w, &o);
    double te = ye && yc && f ? time_block(NULL, &w, x, ye, nbytes, reps, true) : -1;
    double tfirst = te >= 0 ? time_block(f, &w, x, yc, nbytes, 1, false) : -1;
    double tc = tfirst >= 0 ? time_block(f, &w, x, yc, nbytes, reps, true) : -1;
    if (tc >= 0) {
        em_compile_stats st;
        em_compiled_stats(f, &st);
        double d = 0;
        for (size_t i = 0; i < (size_t)T * C; i++) d = fmax(d, fabs((double)ye[i] - yc[i]));
        printf("GPT-2 block, B=1 T=%lld C=%d heads=%d, seeded random weights, %d threads\n",
               (long long)T, C, NH, em_num_threads());
        printf("eager:    %8.3f ms (median of %d)\n", te * 1e3, reps);
        printf("compiled: %8.3f ms (median of %d), %.2fx eager\n", tc * 1e3, reps, te / tc);
        printf("first compiled call: %.3f s (trace, %lld kernels compiled, %lld loaded from the cache)\n",
               tfirst, (long long)st.kernels_compiled, (long long)st.kernels_loaded);
        printf("max abs difference eager vs compiled: %.2e\n", d);
        rc = 0;
    }
    em_compiled_free(f);
    free(ye), free(yc);
done:
    if (rc) fprintf(stderr, "gpt_block: %s\n", em_last_error());
    em_release(x);
    for (int i = 0; i < 12; i++) em_release(*all[i]);
    em_generator_free(g);
    return rc;
}
