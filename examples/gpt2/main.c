/* gpt2_decode - token-by-token generation with a GPT-2-shaped decoder on
 * seeded random weights (decoder.h), in each of Ember's modes, with the
 * per-token latency and the tokens they generate.
 *
 *   gpt2_decode [--device cpu|cuda] [--batch B] [--ctx C] [--steps N]
 *               [--modes eager,compiled,graphs,lazy] [--seed S]
 *               [--layers L --dim D --heads H --vocab V]
 *               [--save-weights FILE] [--tokens FILE] [--json FILE]
 *
 * Each mode starts from the same first tokens and generates N tokens
 * (default C - 1, at most C - 1) greedily, one step per token: compiled
 * (em_compile), graphs (em_compile with CUDA graphs), lazy (the eager step
 * under lazy mode, what EMBER_JIT=1 does), eager.  A step's latency is
 * from the call to its token on the host (one 8-byte copy per sequence),
 * as a server streaming tokens sees it; host is the time the call itself
 * took (with CUDA graphs, one replay).  The first WARMUP steps (which
 * compile) are generated but not timed.  --save-weights writes the
 * weights for bench/torch_decode.py, which runs the same model in PyTorch
 * and compares its tokens with --tokens's file. */
#include "decoder.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { WARMUP = 8, MAX_MODES = 4 };

static const char *const mode_names[MAX_MODES] = {"eager", "compiled", "graphs", "lazy"};

typedef struct result {
    bool ran;
    double p50, p90, p99, host, tps; /* ms, ms, ms, us, tokens/s */
    int64_t *tokens;                 /* batch * ctx */
    int64_t replays;
} result;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const double *sorted, int n, double p) {
    int i = (int)ceil(p * n) - 1;
    return sorted[i < 0 ? 0 : i >= n ? n - 1 : i];
}

/* One step in mode k; next's values copied into tok (batch entries). */
static em_status step(int k, em_compiled *f, dec_model *m, int64_t *tok, double *host) {
    em_tensor *in = dec_history(m), *out[2] = {0};
    em_scope_begin();
    double t0 = now();
    em_status s;
    if (k == 3) {
        s = em_lazy_begin();
        if (s == EM_OK) s = dec_step(m, &in, NULL, out);
        em_status e = em_lazy_end();
        if (s == EM_OK) s = e;
    } else {
        s = f ? em_call(f, &in, NULL, out) : dec_step(m, &in, NULL, out);
    }
    *host = now() - t0;
    if (s == EM_OK) s = em_copy_to_host(out[0], tok, sizeof *tok * (size_t)dec_config_of(m)->batch);
    em_scope_end();
    return s;
}

static int run_mode(int k, dec_model *m, const int64_t *first, int steps, result *r) {
    const dec_config *c = dec_config_of(m);
    em_compile_options o = {.ninputs = 1, .noutputs = 2, .name = "decode_step",
                            .input_names = (const char *[]){"history"}, .cuda_graphs = k == 2 ? 1 : -1};
    em_compiled *f = k == 1 || k == 2 ? em_compile(dec_step, m, &o) : NULL;
    dec_error e = {""};
    int n = steps - WARMUP > 0 ? steps - WARMUP : 0, rc = 1;
    double *lat = malloc(sizeof *lat * (size_t)(n + 1)), *host = malloc(sizeof *host * (size_t)(n + 1));
    int64_t *tok = malloc(sizeof *tok * (size_t)c->batch);
    r->tokens = malloc(sizeof *r->tokens * (size_t)c->batch * (size_t)c->ctx);
    if ((k == 1 || k == 2) && !f) goto done;
    if (!lat || !host || !tok || !r->tokens || dec_reset(m, first, &e) != EM_OK) goto done;
    double total = 0;
    for (int i = 0; i < steps; i++) {
        double h, t0 = now();
        if (step(k, f, m, tok, &h) != EM_OK) goto done;
        double dt = now() - t0;
        if (i >= WARMUP) {
            lat[i - WARMUP] = dt;
            host[i - WARMUP] = h;
            total += dt;
        }
    }
    if (dec_tokens(m, r->tokens) != EM_OK) goto done;
    if (n > 0) {
        qsort(lat, (size_t)n, sizeof *lat, cmp_double);
        qsort(host, (size_t)n, sizeof *host, cmp_double);
        r->p50 = pct(lat, n, 0.5) * 1e3, r->p90 = pct(lat, n, 0.9) * 1e3, r->p99 = pct(lat, n, 0.99) * 1e3;
        r->host = pct(host, n, 0.5) * 1e6;
        r->tps = c->batch * n / total;
    }
    if (f) {
        em_compile_stats st;
        em_compiled_stats(f, &st);
        r->replays = st.graph_replays;
    }
    r->ran = true;
    rc = 0;
done:
    if (rc) fprintf(stderr, "gpt2_decode: %s: %s\n", mode_names[k], e.msg[0] ? e.msg : em_last_error());
    em_compiled_free(f);
    free(lat);
    free(host);
    free(tok);
    return rc;
}

static void write_tokens(const char *path, const dec_config *c, const int64_t *t, int steps) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "gpt2_decode: cannot write %s\n", path);
        return;
    }
    for (int b = 0; b < c->batch; b++)
        for (int i = 0; i <= steps; i++) fprintf(f, "%lld%c", (long long)t[b * c->ctx + i], i == steps ? '\n' : ' ');
    fclose(f);
}

static void write_json(const char *path, const dec_config *c, const char *dev, int steps, const result *r) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "gpt2_decode: cannot write %s\n", path);
        return;
    }
    fprintf(f, "{\"device\": \"%s\", \"batch\": %d, \"ctx\": %d, \"steps\": %d, \"layers\": %d, \"dim\": %d, "
            "\"modes\": {", dev, c->batch, c->ctx, steps, c->layers, c->dim);
    const char *sep = "";
    for (int k = 0; k < MAX_MODES; k++) {
        if (!r[k].ran) continue;
        fprintf(f, "%s\"%s\": {\"p50_ms\": %.4f, \"p90_ms\": %.4f, \"p99_ms\": %.4f, \"host_us\": %.2f, "
                "\"tokens_per_s\": %.1f, \"replays\": %lld}", sep, mode_names[k], r[k].p50, r[k].p90, r[k].p99,
                r[k].host, r[k].tps, (long long)r[k].replays);
        sep = ", ";
    }
    fprintf(f, "}}\n");
    fclose(f);
}

static int usage(const char *argv0) {
    fprintf(stderr, "usage: %s [--device cpu|cuda] [--batch B] [--ctx C] [--steps N] [--modes LIST] "
            "[--seed S] [--layers L --dim D --heads H --vocab V] [--save-weights FILE] [--tokens FILE] "
            "[--json FILE]\n", argv0);
    return 2;
}

int main(int argc, char **argv) {
    dec_config c = dec_gpt2_small(128, 1);
    const char *devname = em_device_available(em_cuda(0)) ? "cuda" : "cpu", *modes = "compiled,graphs";
    const char *weights = NULL, *tokens = NULL, *json = NULL;
    long long seed = 0, steps = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage(argv[0]);
        if (!strcmp(a, "--device")) devname = v;
        else if (!strcmp(a, "--batch")) c.batch = atoi(v);
        else if (!strcmp(a, "--ctx")) c.ctx = atoi(v);
        else if (!strcmp(a, "--steps")) steps = atoll(v);
        else if (!strcmp(a, "--modes")) modes = v;
        else if (!strcmp(a, "--seed")) seed = atoll(v);
        else if (!strcmp(a, "--layers")) c.layers = atoi(v);
        else if (!strcmp(a, "--dim")) c.dim = atoi(v);
        else if (!strcmp(a, "--heads")) c.heads = atoi(v);
        else if (!strcmp(a, "--vocab")) c.vocab = atoi(v);
        else if (!strcmp(a, "--save-weights")) weights = v;
        else if (!strcmp(a, "--tokens")) tokens = v;
        else if (!strcmp(a, "--json")) json = v;
        else return usage(argv[0]);
        i++;
    }
    if (strcmp(devname, "cpu") && strcmp(devname, "cuda")) return usage(argv[0]);
    em_device dev = strcmp(devname, "cuda") ? em_cpu() : em_cuda(0);
    if (steps < 0) steps = c.ctx - 1;
    if (steps < 1 || steps > c.ctx - 1 || c.batch > 4096 || c.ctx > 65536) {
        fprintf(stderr, "gpt2_decode: --steps must be in [1, ctx - 1], --batch <= 4096, --ctx <= 65536\n");
        return 2;
    }
    bool want[MAX_MODES] = {false};
    for (int k = 0; k < MAX_MODES; k++) {
        const char *p = strstr(modes, mode_names[k]);
        size_t n = strlen(mode_names[k]);
        want[k] = p && (p == modes || p[-1] == ',') && (p[n] == ',' || p[n] == 0);
    }
    dec_error e = {""};
    dec_model *m = dec_new(&c, (uint64_t)seed, dev, &e);
    if (!m) {
        fprintf(stderr, "gpt2_decode: %s\n", e.msg);
        return 1;
    }
    if (weights && dec_save_weights(m, weights, &e) != EM_OK) {
        fprintf(stderr, "gpt2_decode: %s\n", e.msg);
        dec_free(m);
        return 1;
    }
    int64_t *first = malloc(sizeof *first * (size_t)c.batch);
    for (int b = 0; first && b < c.batch; b++) first[b] = (int64_t)((b * 7919 + 1) % c.vocab);
    printf("GPT-2-shaped decoder: %d layers, d %d, %d heads, vocab %d; batch %d, context %d, %lld tokens "
           "on %s, seed %lld\n", c.layers, c.dim, c.heads, c.vocab, c.batch, c.ctx, steps, devname, seed);
    result r[MAX_MODES] = {{0}};
    int rc = first ? 0 : 1, ref = -1;
    for (int k = 0; k < MAX_MODES && !rc; k++) {
        if (!want[k]) continue;
        rc = run_mode(k, m, first, (int)steps, &r[k]);
        if (rc) break;
        printf("%-9s per token p50 %8.3f ms  p90 %8.3f ms  p99 %8.3f ms  host %8.1f us  %9.1f tokens/s",
               mode_names[k], r[k].p50, r[k].p90, r[k].p99, r[k].host, r[k].tps);
        if (k == 2) printf("  (%lld replays)", (long long)r[k].replays);
        printf("\n");
        if (ref < 0) {
            ref = k;
            continue;
        }
        for (int b = 0; b < c.batch; b++)
            for (int i = 0; i <= steps; i++)
                if (r[k].tokens[b * c.ctx + i] != r[ref].tokens[b * c.ctx + i]) {
                    printf("tokens: %s differs from %s at sequence %d, token %d\n", mode_names[k],
                           mode_names[ref], b, i);
                    rc = 3;
                    b = c.batch;
                    break;
                }
    }
    if (!rc && ref >= 0) {
        printf("tokens: the same in every mode; sequence 0 begins");
        for (int i = 0; i <= steps && i < 12; i++) printf(" %lld", (long long)r[ref].tokens[i]);
        printf("\n");
        if (tokens) write_tokens(tokens, &c, r[ref].tokens, (int)steps);
        if (json) write_json(json, &c, devname, (int)steps, r);
    }
    for (int k = 0; k < MAX_MODES; k++) free(r[k].tokens);
    free(first);
    dec_free(m);
    return rc;
}
