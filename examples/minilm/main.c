/* main.c - sentence embeddings with all-MiniLM-L6-v2 on Ember.
 *
 *   minilm [--model DIR] [--device cpu|cuda[:N]] [--dtype f32|bf16|f16] [--reps N] [--file FILE]
 *          [--json OUT] [SENTENCE...]
 *
 * Embeds the sentences (from the command line, then one a line from FILE)
 * as one padded batch, prints their cosine-similarity matrix, and times
 * the encoder run eagerly and through em_compile (OUT gets the timings as
 * JSON, for bench/report.py).  With --device cuda the weights are copied
 * to the GPU once at load, the ids and mask are made there, both modes run
 * there, and only the embeddings come back to the host.  With --dtype bf16
 * or f16 the weights are converted once and the encoder computes in that
 * type; the demo then also prints how far its embeddings are from the f32
 * model's (cosine distance, per sentence, the largest).
 *
 * The encoder is compiled as eight functions (bert_compile): the
 * embeddings, one per layer, and the pooling.  The kernel cache is keyed by
 * kernel source, so the six layers' identical graphs compile their kernels
 * once and the other five load them: a new batch shape compiles about 10
 * kernels instead of the 41 of one whole-encoder graph (Ember names a
 * kernel by its position in its graph, and the name is part of the key).
 * Nothing fusable is lost at the cuts: each layer begins with a matmul.
 * Eight em_calls cost eight guard checks, tens of nanoseconds each.
 * Lengths are padded to a multiple of 8, so nearby batch shapes share
 * entries. */
#include "minilm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef MINILM_DEFAULT_DIR
#define MINILM_DEFAULT_DIR "models/all-MiniLM-L6-v2"
#endif
#define PAD_TO 8
/* All sentences go in one batch, whose attention scores take
 * 12 * 4 * T^2 bytes a sentence (3 MiB at T = 256): past this many the
 * demo refuses rather than risk exhausting memory. */
#define MAX_SENTENCES 256

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct sentences {
    char **text;
    int n, cap;
    char *owned;        /* FILE's contents, which text[] points into */
} sentences;

static bool add_sentence(sentences *s, char *t) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        char **p = realloc(s->text, sizeof *p * (size_t)cap);
        if (!p) return false;
        s->text = p;
        s->cap = cap;
    }
    s->text[s->n++] = t;
    return true;
}

/* Every non-empty line of path (at most 64 MiB) becomes a sentence. */
static bool read_lines(sentences *s, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "minilm: cannot open %s\n", path);
        return false;
    }
    size_t max = 64u << 20, n = 0;
    char *buf = malloc(max + 1);
    if (buf) n = fread(buf, 1, max + 1, f);
    fclose(f);
    if (!buf || n > max) {
        fprintf(stderr, "minilm: %s: %s\n", path, buf ? "larger than 64 MiB" : "out of memory");
        free(buf);
        return false;
    }
    buf[n] = '\0';
    s->owned = buf;
    for (char *line = strtok(buf, "\r\n"); line; line = strtok(NULL, "\r\n"))
        if (*line && !add_sentence(s, line)) return false;
    return true;
}

typedef struct args {
    const char *model, *file, *json, *device_name, *dtype_name;
    em_device device;
    em_dtype dtype;
    int reps;
} args;

static int usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s [--model DIR] [--device DEV] [--reps N] [--file FILE] [--json OUT] [SENTENCE...]\n"
            "  --model DIR  the model files (default: $EMBER_MODEL_DIR, else %s;\n"
            "               tools/fetch-minilm puts them there)\n"
            "  --device DEV cpu (default), cuda or cuda:N\n"
            "  --dtype T    f32 (default), bf16 or f16: the weights' and the computation's\n"
            "  --reps N     timed runs of each mode (default 5)\n"
            "  --file FILE  more sentences, one a line\n"
            "  --json OUT   write the timings to OUT as JSON\n",
            argv0, MINILM_DEFAULT_DIR);
    return 2;
}

static int parse_args(int argc, char **argv, args *a, sentences *s) {
    a->model = getenv("EMBER_MODEL_DIR") ? getenv("EMBER_MODEL_DIR") : MINILM_DEFAULT_DIR;
    a->reps = 5;
    a->device = em_cpu();
    a->device_name = "cpu";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) a->model = argv[++i];
        else if (!strcmp(argv[i], "--file") && i + 1 < argc) a->file = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) a->reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) a->json = argv[++i];
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            const char *d = argv[++i];
            a->dtype_name = d;
            a->dtype = !strcmp(d, "bf16") ? EM_BF16 : !strcmp(d, "f16") ? EM_F16 : EM_F32;
            if (a->dtype == EM_F32 && strcmp(d, "f32")) {
                fprintf(stderr, "minilm: --dtype is f32, bf16 or f16, not '%s'\n", d);
                return usage(argv[0]);
            }
        } else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            a->device_name = argv[++i];
            if (!bert_parse_device(a->device_name, &a->device)) {
                fprintf(stderr, "minilm: unknown device '%s' (cpu, cuda or cuda:N)\n", a->device_name);
                return usage(argv[0]);
            }
        }
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return usage(argv[0]);
        else if (argv[i][0] == '-' && argv[i][1] == '-') {
            fprintf(stderr, "minilm: unknown option %s\n", argv[i]);
            return usage(argv[0]);
        } else if (!add_sentence(s, argv[i])) return 1;
    }
    if (a->file && !read_lines(s, a->file)) return 1;
    if (s->n == 0) {
        fprintf(stderr, "minilm: no sentences given\n");
        return usage(argv[0]);
    }
    if (s->n > MAX_SENTENCES) {
        fprintf(stderr, "minilm: %d sentences; this demo embeds at most %d in its one batch\n", s->n,
                MAX_SENTENCES);
        return 1;
    }
    if (a->reps < 1 || a->reps > 10000) a->reps = 5;
    return 0;
}

/* One run of the encoder (eager, or compiled when f is not NULL); the
 * embeddings are copied into emb [n, hidden]. */
static bool embed(const bert_model *m, bert_compiled *f, em_tensor *ids, em_tensor *mask,
                  float *emb, size_t nbytes) {
    em_scope_begin();
    em_tensor *in[2] = {ids, mask}, *out = NULL;
    em_status s = f ? bert_compiled_call(f, m, in, &out) : bert_forward((void *)m, in, NULL, &out);
    if (s == EM_OK && out && em_dtype_of(out) != EM_F32) out = em_cast(out, EM_F32);
    bool ok = s == EM_OK && out && em_copy_to_host(out, emb, nbytes) == EM_OK;
    em_scope_end();
    if (!ok) fprintf(stderr, "minilm: the encoder failed: %s\n", em_last_error());
    return ok;
}

/* The median of reps timed runs; the first run is warm-up. */
/* Times reps eager and compiled runs of the batch, alternating (this
 * machine's load drifts: alternating gives both the same share of it),
 * into their medians *te and *tc; the last embeddings into eager and
 * comp.  false: a run failed. */
static bool time_alternating(const bert_model *m, bert_compiled *f, em_tensor *ids, em_tensor *mask,
                             float *eager, float *comp, size_t nbytes, int reps, double *te,
                             double *tc) {
    double *t = malloc(sizeof *t * 2 * (size_t)reps);
    bool ok = t != NULL;
    for (int i = 0; ok && i < 2 * reps; i++) {
        bool compiled = i % 2;
        double t0 = now();
        ok = embed(m, compiled ? f : NULL, ids, mask, compiled ? comp : eager, nbytes);
        t[(compiled ? reps : 0) + i / 2] = now() - t0;
    }
    if (ok) *te = median(t, reps), *tc = median(t + reps, reps);
    free(t);
    return ok;
}

static void print_similarity(const sentences *s, const float *emb, int h) {
    printf("\ncosine similarity (embeddings are unit vectors: dot products)\n     ");
    for (int j = 0; j < s->n; j++) printf(" %6d", j);
    printf("\n");
    for (int i = 0; i < s->n; i++) {
        printf("%4d ", i);
        for (int j = 0; j < s->n; j++) {
            double dot = 0;
            for (int k = 0; k < h; k++) dot += (double)emb[(size_t)i * h + k] * emb[(size_t)j * h + k];
            printf(" %6.3f", dot);
        }
        /* 60 characters, not bytes: a byte count would cut a multi-byte
         * UTF-8 character in two */
        bool more;
        size_t len = mu_utf8_prefix(s->text[i], 60, &more);
        printf("   %.*s%s\n", (int)len, s->text[i], more ? "..." : "");
    }
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

typedef struct timings {
    double eager, compiled, first; /* seconds per batch; the first compiled call */
    int64_t compiled_kernels, loaded_kernels;
} timings;

static void write_json(const char *path, const args *a, const sentences *s, int64_t T, const timings *t) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "minilm: cannot write %s\n", path);
        return;
    }
    fprintf(f, "{\"device\": \"%s\", \"sentences\": %d, \"padded_tokens\": %lld, \"threads\": %d, \"eager_ms\": %.4f, "
            "\"compiled_ms\": %.4f, \"eager_sps\": %.3f, \"compiled_sps\": %.3f, \"first_call_s\": %.4f, "
            "\"kernels_compiled\": %lld, \"kernels_loaded\": %lld}\n",
            a->device_name, s->n, (long long)T, em_num_threads(), t->eager * 1e3, t->compiled * 1e3, s->n / t->eager,
            s->n / t->compiled, t->first, (long long)t->compiled_kernels, (long long)t->loaded_kernels);
    fclose(f);
}

/* Times eager and compiled runs of the batch and prints the comparison. */
/* The largest cosine distance 1 - a.b / (|a| |b|) between rows of a and b
 * ([n, h] each). */
static double max_cosine_distance(const float *a, const float *b, int n, int h) {
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double ab = 0, aa = 0, bb = 0;
        for (int k = 0; k < h; k++) {
            double x = a[(size_t)i * h + k], y = b[(size_t)i * h + k];
            ab += x * y, aa += x * x, bb += y * y;
        }
        double d = aa > 0 && bb > 0 ? 1 - ab / sqrt(aa * bb) : 1;
        worst = fmax(worst, d);
    }
    return worst;
}

/* Times eager and compiled runs of the batch and prints the comparison;
 * ref: the f32 model's embeddings when the model runs in a half type. */
static int run(const bert_model *m, const sentences *s, const args *a, em_tensor *ids, em_tensor *mask,
               const float *ref) {
    int reps = a->reps;
    int h = m->cfg.hidden;
    size_t nbytes = sizeof(float) * (size_t)s->n * h;
    float *eager = malloc(nbytes), *comp = malloc(nbytes);
    bert_compiled cf, *f = NULL;
    ml_error e = {""};
    int rc = 1;
    if (!eager || !comp || bert_compile(m, &cf, &e) != ML_OK) goto done;
    f = &cf;
    /* one eager run first (its buffers, OpenBLAS's), untimed; then the
     * first compiled call, which traces and compiles: timed alone */
    if (!embed(m, NULL, ids, mask, eager, nbytes)) goto done;
    double t0 = now();
    bool first = embed(m, f, ids, mask, comp, nbytes);
    double tfirst = now() - t0;
    em_compile_stats st0;
    bert_compiled_stats(f, &st0);
    double te, tc;
    if (!first || !time_alternating(m, f, ids, mask, eager, comp, nbytes, reps, &te, &tc)) goto done;
    em_compile_stats st;
    bert_compiled_stats(f, &st);
    print_similarity(s, comp, h);
    printf("\neager:    %8.2f ms per batch, %7.1f sentences/s (median of %d runs)\n", te * 1e3,
           s->n / te, reps);
    printf("compiled: %8.2f ms per batch, %7.1f sentences/s, %.2fx eager (median of %d runs, "
           "alternating with eager's, after the first call, which compiled: below)\n", tc * 1e3,
           s->n / tc, te / tc, reps);
    printf("compile:  first call %.3f s (trace, then %lld kernels compiled and %lld loaded from the "
           "kernel cache)\n", tfirst, (long long)st0.kernels_compiled, (long long)st0.kernels_loaded);
    printf("calls:    %lld to %d compiled functions, hits %lld, traces %lld, eager fallbacks %lld, "
           "%d kernels in their graphs\n",
           (long long)st.calls, f->count + 2, (long long)st.hits, (long long)st.traces, (long long)st.eager, st.kernels);
    printf("eager vs compiled: max abs difference %.2e\n", max_abs_diff(eager, comp, (size_t)s->n * h));
    if (ref)
        printf("%s vs f32: largest cosine distance %.2e eager, %.2e compiled (of %d sentences)\n",
               a->dtype_name, max_cosine_distance(eager, ref, s->n, h),
               max_cosine_distance(comp, ref, s->n, h), s->n);
    timings t = {te, tc, tfirst, st0.kernels_compiled, st0.kernels_loaded};
    if (a->json) write_json(a->json, a, s, em_size(ids, 1), &t);
    rc = 0;
done:
    if (rc && !f) fprintf(stderr, "minilm: %s\n", !eager || !comp ? "out of memory" : e.msg);
    if (f) bert_compiled_free(f);
    free(eager), free(comp);
    return rc;
}

int main(int argc, char **argv) {
    args a = {.dtype_name = "f32"};
    sentences s = {0};
    int rc = parse_args(argc, argv, &a, &s);
    bert_model m;
    ml_error e = {""};
    double t0 = now();
    ml_status ls = rc == 0 ? bert_load_on(&m, a.model, a.device, &e) : ML_OK;
    if (ls == ML_ERR_ARG) {
        fprintf(stderr, "minilm: --device %s: %s\n", a.device_name, e.msg);
        rc = 1;
    } else if (ls != ML_OK) {
        fprintf(stderr, "minilm: %s\n(run tools/fetch-minilm to get the model files, or give --model DIR)\n", e.msg);
        rc = 1;
    }
    if (rc == 0) {
        double tload = now() - t0;
        em_tensor *ids = NULL, *mask = NULL;
        int *ntok = calloc((size_t)s.n, sizeof *ntok);
        em_scope_begin();
        double t1 = now();
        if (!ntok || bert_tokenize(&m, s.n, (const char *const *)s.text, PAD_TO, &ids, &mask, ntok, &e) != ML_OK) {
            fprintf(stderr, "minilm: %s\n", ntok ? e.msg : "out of memory");
            rc = 1;
        } else {
            int most = 0;
            for (int i = 0; i < s.n; i++) most = ntok[i] > most ? ntok[i] : most;
            printf("all-MiniLM-L6-v2 (%s): %d layers, hidden %d, loaded in %.2f s; on %s, %s", a.model,
                   m.cfg.layers, m.cfg.hidden, tload, a.device_name, a.dtype_name);
            if (a.device.type == EM_CPU) printf(", %d threads", em_num_threads());
            printf("\n");
            printf("%d sentences, up to %d tokens each (batch padded to %lld), tokenized in %.2f ms\n", s.n,
                   most, (long long)em_size(ids, 1), (now() - t1) * 1e3);
            float *ref = NULL;
            if (a.dtype != EM_F32) { /* the f32 model's embeddings, then the model converted */
                size_t nb = sizeof(float) * (size_t)s.n * m.cfg.hidden;
                ref = malloc(nb);
                bool ok = ref && embed(&m, NULL, ids, mask, ref, nb) && bert_to_dtype(&m, a.dtype, &e) == ML_OK;
                if (ok && !(mask = em_cast(mask, a.dtype))) e = (ml_error){""}, ok = false;
                if (!ok) fprintf(stderr, "minilm: --dtype %s: %s\n", a.dtype_name, e.msg[0] ? e.msg : em_last_error());
                rc = ok ? 0 : 1;
            }
            if (rc == 0) rc = run(&m, &s, &a, ids, mask, ref);
            free(ref);
        }
        em_scope_end();
        free(ntok);
        bert_free(&m);
    }
    free(s.text);
    free(s.owned);
    return rc == 2 ? 2 : rc ? 1 : 0;
}
