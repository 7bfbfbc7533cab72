/* bench_shapes.c - issue 18's call sequence: a GPT-style attention block
 * whose causal mask is built inside from em_arange(T), compiled once and
 * called for T in {7, 8, 9, 16, 31, 64} x B in 1..8 (48 calls, T outer or
 * B outer), on the CPU or a GPU.  Prints how many entries were traced,
 * how many calls ran eagerly, the kernels compiled and loaded, and the
 * largest difference from the eager block.
 *
 *   bench_shapes [--device cpu|cuda] [--order t|b] [--seq T,T,...] [--batch N]
 *
 * (--seq and --batch replace the lengths and the largest batch: sizes a
 * staging run never saw.)
 * Under EMBER_JIT=1 the eager block it compares with runs in lazy mode, and
 * lazy mode's counters are printed too.  With EMBER_RECORD=list it records the entries; run it again after
 * `ember-cache warmup list` on an empty cache to see what a warmed
 * process compiles. */
#include <ember.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { C = 48, NH = 4, HD = C / NH };

typedef struct block {
    em_tensor *w_qkv, *w_proj, *ln_w, *ln_b;
    em_device dev;
} block;

static em_tensor *heads(em_tensor *qkv, int which, int64_t B, int64_t T) {
    em_tensor *t = em_slice(qkv, -1, which * C, (which + 1) * C, 1);
    return em_transpose(em_reshape(t, 4, (int64_t[]){B, T, NH, HD}), 1, 2);
}

static em_status attention(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)s;
    const block *w = ctx;
    em_tensor *x = in[0];
    int64_t B = em_size(x, 0), T = em_size(x, 1);
    em_tensor *h = em_layer_norm(x, 1, w->ln_w, w->ln_b, 1e-5);
    em_tensor *qkv = em_matmul(h, w->w_qkv);
    em_tensor *q = heads(qkv, 0, B, T), *k = heads(qkv, 1, B, T), *v = heads(qkv, 2, B, T);
    em_tensor *pos = em_arange(0, (double)T, 1, EM_I64, w->dev);
    em_tensor *future = em_gt(em_unsqueeze(pos, 0), em_unsqueeze(pos, 1));
    em_tensor *att = em_mul_scalar(em_matmul(q, em_transpose(k, -2, -1)), 1.0 / sqrt(HD));
    att = em_softmax(em_where(future, em_scalar(-INFINITY, EM_F32, w->dev), att), -1);
    em_tensor *y = em_reshape(em_transpose(em_matmul(att, v), 1, 2), 3, (int64_t[]){B, T, C});
    out[0] = em_add(x, em_matmul(y, w->w_proj));
    return out[0] ? EM_OK : em_last_status();
}

/* max |eager - compiled| of one call, or -1 on an error.  Compared on the
 * host, so that under EMBER_JIT=1 the eager block is the only lazy graph. */
static double one_call(em_compiled *f, block *w, em_generator *g, int64_t B, int64_t T) {
    static float ye_h[64 * 4096 * C], yc_h[64 * 4096 * C];
    size_t n = (size_t)(B * T * C);
    if (n > sizeof ye_h / sizeof *ye_h) return -1;
    em_scope_begin();
    em_tensor *x = em_randn(g, 3, (int64_t[]){B, T, C}, EM_F32, w->dev), *ye = NULL, *yc = NULL;
    double d = -1;
    if (x && attention(w, &x, NULL, &ye) == EM_OK && em_copy_to_host(ye, ye_h, n * sizeof(float)) == EM_OK &&
        em_call(f, &x, NULL, &yc) == EM_OK && em_copy_to_host(yc, yc_h, n * sizeof(float)) == EM_OK) {
        d = 0;
        for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)ye_h[i] - yc_h[i]));
    }
    em_scope_end();
    return d;
}

int main(int argc, char **argv) {
    bool cuda = false, b_outer = false;
    int64_t ts[16] = {7, 8, 9, 16, 31, 64};
    int nt = 6, nb = 8;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) cuda = !strcmp(argv[++i], "cuda");
        else if (!strcmp(argv[i], "--order") && i + 1 < argc) b_outer = !strcmp(argv[++i], "b");
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) nb = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seq") && i + 1 < argc) {
            nt = 0;
            for (char *p = argv[++i]; *p && nt < 16; p += *p == ',') ts[nt++] = strtoll(p, &p, 10);
        } else {
            nt = 0;
        }
        if (nt < 1 || nb < 1 || nb > 64) {
            fprintf(stderr, "usage: %s [--device cpu|cuda] [--order t|b] [--seq T,T,...] [--batch N]\n",
                    argv[0]);
            return 2;
        }
    }
    for (int i = 0; i < nt; i++)
        if (ts[i] < 1 || ts[i] > 4096) {
            fprintf(stderr, "bench_shapes: sequence lengths must be in [1, 4096]\n");
            return 2;
        }
    block w = {.dev = cuda ? em_cuda(0) : em_cpu()};
    em_generator *g = em_generator_new(1);
    w.w_qkv = em_mul_scalar(em_randn(g, 2, (int64_t[]){C, 3 * C}, EM_F32, w.dev), 1 / sqrt(C));
    w.w_proj = em_mul_scalar(em_randn(g, 2, (int64_t[]){C, C}, EM_F32, w.dev), 1 / sqrt(C));
    w.ln_w = em_randn(g, 1, (int64_t[]){C}, EM_F32, w.dev);
    w.ln_b = em_randn(g, 1, (int64_t[]){C}, EM_F32, w.dev);
    em_compile_options o = {.ninputs = 1, .noutputs = 1, .name = "attention",
                            .input_names = (const char *[]){"x"}};
    em_compiled *f = w.w_qkv && w.w_proj && w.ln_w && w.ln_b ? em_compile(attention, &w, &o) : NULL;
    double worst = 0;
    for (int a = 0; f && a < (b_outer ? nb : nt); a++)
        for (int b = 0; b < (b_outer ? nt : nb); b++) {
            int64_t B = b_outer ? a + 1 : b + 1, T = b_outer ? ts[b] : ts[a];
            double d = one_call(f, &w, g, B, T);
            if (d < 0) {
                fprintf(stderr, "bench_shapes: B=%lld T=%lld: %s\n", (long long)B, (long long)T,
                        em_last_error());
                return 1;
            }
            worst = fmax(worst, d);
        }
    if (!f) {
        fprintf(stderr, "bench_shapes: %s\n", em_last_error());
        return 1;
    }
    em_compile_stats st;
    em_compiled_stats(f, &st);
    printf("device=%s order=%s calls=%lld traces=%lld eager=%lld entries=%d dynamic=%d "
           "kernels_compiled=%lld kernels_loaded=%lld max_abs_diff=%.3g\n",
           cuda ? "cuda" : "cpu", b_outer ? "b" : "t", (long long)st.calls, (long long)st.traces,
           (long long)st.eager, st.entries, st.dynamic_entries, (long long)st.kernels_compiled,
           (long long)st.kernels_loaded, worst);
    em_lazy_stats lz;
    const char *jit = getenv("EMBER_JIT"); /* (a CUDA trace records lazily too: not counted) */
    if (jit && !strcmp(jit, "1") && em_lazy_get_stats(&lz) == EM_OK && lz.flushes > 0)
        printf("lazy mode (the eager block): flushes=%lld graphs_compiled=%lld dynamic_graphs=%lld "
               "eager_graphs=%lld kernels_compiled=%lld kernels_loaded=%lld\n",
               (long long)lz.flushes, (long long)lz.graphs_compiled, (long long)lz.dynamic_graphs,
               (long long)lz.eager_graphs, (long long)lz.kernels_compiled, (long long)lz.kernels_loaded);
    em_compiled_free(f);
    em_release(w.w_qkv), em_release(w.w_proj), em_release(w.ln_w), em_release(w.ln_b);
    em_generator_free(g);
    return 0;
}
