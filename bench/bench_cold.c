/* bench_cold.c - issue 22: cold first calls of whole models, and the peak
 * memory of the process and of its compile workers.
 *
 *   bench/bench_cold [--runs N] [--cases gpt2,gpt2_block,gpt2_blocks,minilm,...]
 *                    [--model DIR] [--json OUT]
 *   bench/bench_cold --one CASE [--model DIR]   (one run, in this process)
 *
 * Cases:
 *   gpt2        GPT-2 small's 12 blocks (d 768, 12 heads, MLP 3072, causal
 *               attention, then the final layer norm; no vocabulary: the
 *               input is embeddings [2, 64, 768]) as ONE em_compile'd
 *               function; seeded random weights;
 *   gpt2_block  one of those blocks as its own function;
 *   gpt2_blocks the same forward as 12 em_compile'd block functions, one
 *               per layer (the layers' identical kernels then compile once);
 *   minilm      the MiniLM demo's encoder (examples/minilm: 8 compiled
 *               functions) on its three default sentences;
 *   mixed_1k, mixed_10k, chain_10k, wide_10k  bench/synth.h's synthetic
 *               graphs of 1,000 or 10,000 nodes on x [64, 256] and y [256]
 *               (the mixed chain: a mean subtracted every 50 nodes);
 *   gpt2_async, minilm_async  gpt2 and minilm with EMBER_ASYNC_COMPILE=1:
 *               the first call runs op by op while the kernels compile in
 *               the background; also printed: when the first call served by
 *               compiled kernels ended (the others run with it off).
 *
 * Each run is a new process (fork + exec) with a new, empty kernel cache
 * (EMBER_CACHE_DIR): the model is built, run once eagerly (untimed: the
 * libraries' first-use costs, OpenBLAS's loading among them, as in the
 * demo), then the first compiled call is timed to its values on the host
 * (trace, passes, schedule, lower, compile, load, run).  Peak RSS: the
 * process's (VmHWM) and the largest of its compile workers' (VmHWM of its
 * live children, read before it exits; the workers stay alive between
 * compiles).  Printed: the median, min and max over the runs. */
#include <ember.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../examples/minilm/minilm.h"
#include "bench_stats.h"
#include "gpt2_small.h"
#include "synth.h"

enum { B = G2_B, T = G2_T, C = G2_C, NL = G2_NL };


/* GPT-2 small: bench/gpt2_small.h */

static em_status block_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)s;
    out[0] = g2_block_fwd(ctx, in[0]);
    return out[0] ? EM_OK : em_last_status();
}

static em_status gpt2_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)s;
    out[0] = g2_forward(ctx, in[0]);
    return out[0] ? EM_OK : em_last_status();
}

/* ---- one run ---- */

typedef struct result {
    double first;          /* seconds */
    double compiled_after; /* async cases: from the first call's start to the end
                              of the first call served by compiled kernels */
    long long compiled, loaded;
    double rss_mb, worker_mb; /* peak RSS: the process, its largest worker */
    int workers;           /* its live compile workers at the end */
} result;

/* VmHWM of /proc/PID/status, in MB (0 when unreadable). */
static double peak_mb(const char *pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%s/status", pid);
    FILE *f = fopen(path, "r");
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atof(line + 6);
    if (f) fclose(f);
    return kb / 1024;
}

/* The largest peak RSS among our live children (the compile workers). */
static double workers_peak(int *count) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    double most = 0;
    *count = 0;
    while (d && (e = readdir(d))) {
        char path[300], buf[512];
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        buf[n] = '\0';
        char *close = strrchr(buf, ')');
        int ppid = 0;
        char state = 0;
        if (!close || sscanf(close + 1, " %c %d", &state, &ppid) != 2 || ppid != getpid()) continue;
        (*count)++;
        double mb = peak_mb(e->d_name);
        most = mb > most ? mb : most;
    }
    if (d) closedir(d);
    return most;
}

/* Calls f (or fn eagerly when f is NULL) once, to the values on the host. */
static bool call_once(em_compiled *f, em_fn fn, void *ctx, em_tensor *x, float *y, size_t nbytes) {
    em_scope_begin();
    em_tensor *out = NULL;
    em_status s = f ? em_call(f, &x, NULL, &out) : fn(ctx, &x, NULL, &out);
    bool ok = s == EM_OK && em_copy_to_host(out, y, nbytes) == EM_OK;
    em_scope_end();
    if (!ok) fprintf(stderr, "bench_cold: %s\n", em_last_error());
    return ok;
}

static void take_stats(em_compiled *f, result *r) {
    em_compile_stats st;
    em_compiled_stats(f, &st);
    r->compiled += st.kernels_compiled;
    r->loaded += st.kernels_loaded;
}

/* The 12 per-layer functions, chained. */
static bool call_blocks(em_compiled **f, em_tensor *x, float *y, size_t nbytes) {
    em_scope_begin();
    em_tensor *h = x;
    for (int l = 0; l < NL && h; l++) {
        em_tensor *o = NULL;
        h = em_call(f[l], &h, NULL, &o) == EM_OK ? o : NULL;
    }
    bool ok = h && em_copy_to_host(h, y, nbytes) == EM_OK;
    em_scope_end();
    if (!ok) fprintf(stderr, "bench_cold: %s\n", em_last_error());
    return ok;
}

/* Calls served op by op while their entry compiled (async compile). */
static int64_t pending(em_compiled **f, int n) {
    int64_t p = 0;
    for (int i = 0; i < n; i++) {
        em_compile_stats st;
        em_compiled_stats(f[i], &st);
        p += st.pending;
    }
    return p;
}

static bool async; /* a case named *_async: EMBER_ASYNC_COMPILE=1 */

static int run_gpt2(const char *which, result *r) {
    em_generator *g = em_generator_new(22);
    static g2_model m;
    bool whole = !strncmp(which, "gpt2", 4) && (!which[4] || !strcmp(which + 4, "_async"));
    bool blocks = !strncmp(which, "gpt2_blocks", 11);
    if (!g2_model_init(&m, whole || blocks ? NL : 1, g)) return 1;
    em_tensor *x = em_randn(g, 3, (int64_t[]){B, T, C}, EM_F32, em_cpu());
    size_t nbytes = sizeof(float) * B * T * C;
    float *y = malloc(nbytes);
    em_fn fn = whole ? gpt2_fn : block_fn;
    void *ctx = whole ? (void *)&m : (void *)&m.layer[0];
    if (!x || !y || !call_once(NULL, fn, ctx, x, y, nbytes)) return 1;
    em_compile_options o = {.ninputs = 1, .noutputs = 1, .name = which};
    em_compiled *f[NL] = {0};
    for (int l = 0; l < (blocks ? NL : 1); l++)
        if (!(f[l] = em_compile(blocks ? block_fn : fn, blocks ? (void *)&m.layer[l] : ctx, &o))) return 1;
    double t0 = bench_now();
    bool ok = blocks ? call_blocks(f, x, y, nbytes) : call_once(f[0], fn, ctx, x, y, nbytes);
    r->first = bench_now() - t0;
    /* async compile: call again until a call runs no entry op by op */
    for (int64_t before = pending(f, blocks ? NL : 1); ok && async && bench_now() - t0 < 120;) {
        ok = blocks ? call_blocks(f, x, y, nbytes) : call_once(f[0], fn, ctx, x, y, nbytes);
        int64_t after = pending(f, blocks ? NL : 1);
        if (after == before) {
            r->compiled_after = bench_now() - t0;
            break;
        }
        before = after;
    }
    for (int l = 0; ok && l < (blocks ? NL : 1); l++) take_stats(f[l], r);
    free(y);
    return ok ? 0 : 1;
}

/* pending() over the demo's compiled functions (bert_compiled_stats does
 * not sum it). */
static int64_t bert_pending(const bert_compiled *c) {
    em_compiled *f[64];
    int n = 0;
    f[n++] = c->embed, f[n++] = c->pool;
    for (int i = 0; i < c->count && n < 64; i++) f[n++] = c->layer[i];
    return pending(f, n);
}

static int run_minilm(const char *dir, result *r) {
    static const char *const text[] = {"A man is eating food.", "A man eats something.",
                                       "The sky is blue."};
    bert_model m;
    ml_error e = {""};
    bert_compiled cf;
    em_tensor *ids = NULL, *mask = NULL;
    if (bert_load_on(&m, dir, em_cpu(), &e) != ML_OK ||
        bert_tokenize(&m, 3, text, 8, &ids, &mask, NULL, &e) != ML_OK || bert_compile(&m, &cf, &e) != ML_OK) {
        fprintf(stderr, "bench_cold: minilm: %s\n", e.msg);
        return 1;
    }
    em_tensor *in[2] = {ids, mask}, *out = NULL;
    em_scope_begin();
    bool ok = bert_forward(&m, in, NULL, &out) == EM_OK; /* eager, untimed */
    em_scope_end();
    float emb[3 * 384];
    double t0 = bench_now();
    em_scope_begin();
    ok = ok && bert_compiled_call(&cf, &m, in, &out) == EM_OK &&
         em_copy_to_host(out, emb, sizeof emb) == EM_OK;
    em_scope_end();
    r->first = bench_now() - t0;
    for (int64_t before = bert_pending(&cf); ok && async && bench_now() - t0 < 120;) { /* until compiled */
        em_scope_begin();
        ok = bert_compiled_call(&cf, &m, in, &out) == EM_OK && em_copy_to_host(out, emb, sizeof emb) == EM_OK;
        em_scope_end();
        int64_t after = bert_pending(&cf);
        if (after == before) {
            r->compiled_after = bench_now() - t0;
            break;
        }
        before = after;
    }
    em_compile_stats st;
    bert_compiled_stats(&cf, &st);
    r->compiled = st.kernels_compiled, r->loaded = st.kernels_loaded;
    if (!ok) fprintf(stderr, "bench_cold: minilm: %s\n", em_last_error());
    return ok ? 0 : 1;
}

/* A synthetic graph, "KIND_1k" or "KIND_10k" (synth.h): the first call of
 * its em_compile'd function, checked to be finite. */
static int run_synth(const char *which, result *r) {
    sy_graph gr = {SY_CHAIN, strstr(which, "_10k") ? 10000 : 1000, false};
    gr.kind = !strncmp(which, "mixed", 5) ? SY_MIXED : !strncmp(which, "wide", 4) ? SY_WIDE : SY_CHAIN;
    em_generator *g = em_generator_new(5);
    em_tensor *in[2] = {em_randn(g, 2, (int64_t[]){64, 256}, EM_F32, em_cpu()),
                        em_randn(g, 1, (int64_t[]){256}, EM_F32, em_cpu())};
    em_compile_options o = {.ninputs = 2, .noutputs = 1, .name = which};
    em_compiled *f = in[0] && in[1] ? em_compile(sy_fn, &gr, &o) : NULL;
    static float y[64 * 256];
    em_tensor *out = NULL;
    double t0 = bench_now();
    em_scope_begin();
    bool ok = f && em_call(f, in, NULL, &out) == EM_OK && em_copy_to_host(out, y, sizeof y) == EM_OK;
    em_scope_end();
    r->first = bench_now() - t0;
    for (int i = 0; ok && i < 64 * 256; i++) ok = isfinite(y[i]);
    if (ok) take_stats(f, r);
    else fprintf(stderr, "bench_cold: %s: %s\n", which, em_last_error());
    em_compiled_free(f);
    em_generator_free(g);
    return ok ? 0 : 1;
}

/* One run in this process; prints one machine-readable line. */
static int run_one(const char *which, const char *model) {
    result r = {0};
    async = strstr(which, "_async") != NULL;
    int rc = !strncmp(which, "minilm", 6) ? run_minilm(model, &r)
             : !strncmp(which, "gpt2", 4) ? run_gpt2(which, &r)
                                          : run_synth(which, &r);
    if (rc) return rc;
    r.rss_mb = peak_mb("self");
    r.worker_mb = workers_peak(&r.workers);
    printf("RESULT %s %.4f %lld %lld %.1f %.1f %d %.4f\n", which, r.first, r.compiled, r.loaded, r.rss_mb,
           r.worker_mb, r.workers, r.compiled_after);
    return 0;
}

/* ---- the runner ---- */

/* One run of case which in a new process with a new cache; false on failure. */
static bool run_child(const char *which, const char *model, result *r) {
    char dir[] = "/tmp/ember-bench-cold-XXXXXX", cmd[128];
    if (!mkdtemp(dir)) return false;
    int fds[2];
    if (pipe(fds) != 0) return false;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("EMBER_CACHE_DIR", dir, 1);
        setenv("EMBER_ASYNC_COMPILE", strstr(which, "_async") ? "1" : "0", 1);
        dup2(fds[1], 1);
        close(fds[0]);
        char *args[] = {"/proc/self/exe", "--one", (char *)which, "--model", (char *)model, NULL};
        execv(args[0], args);
        _exit(127);
    }
    close(fds[1]);
    char buf[512] = "", name[32];
    FILE *f = fdopen(fds[0], "r");
    bool ok = false;
    while (f && fgets(buf, sizeof buf, f))
        if (!strncmp(buf, "RESULT ", 7))
            ok = sscanf(buf + 7, "%31s %lf %lld %lld %lf %lf %d %lf", name, &r->first, &r->compiled, &r->loaded,
                        &r->rss_mb, &r->worker_mb, &r->workers, &r->compiled_after) == 8;
    if (f) fclose(f);
    int st = 0;
    if (pid > 0) waitpid(pid, &st, 0);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "bench_cold: could not remove %s\n", dir);
    return pid > 0 && ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static const char *const CASES[][2] = {
    {"gpt2", "GPT-2 small, 12 layers, one function"},
    {"gpt2_block", "GPT-2 small, one block"},
    {"gpt2_blocks", "GPT-2 small, 12 block functions"},
    {"minilm", "MiniLM-L6 encoder (demo, 3 sentences)"},
    {"mixed_1k", "synthetic mixed chain, 1,000 nodes"},
    {"mixed_10k", "synthetic mixed chain, 10,000 nodes"},
    {"chain_10k", "synthetic pointwise chain, 10,000 nodes"},
    {"wide_10k", "synthetic wide graph, 10,000 nodes"},
    {"gpt2_async", "GPT-2 small, one function, async compile"},
    {"minilm_async", "MiniLM-L6 encoder, async compile"},
};

/* The description of case which, or NULL when there is no such case. */
static const char *describe(const char *which) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++)
        if (!strcmp(which, CASES[i][0])) return CASES[i][1];
    return NULL;
}

/* Runs a case runs times; prints its line, and its JSON entry to js. */
static bool run_case(const char *which, const char *model, int runs, FILE *js, bool *first_js) {
    double first[64], rss[64], wrk[64], after[64];
    result r = {0};
    int n = 0;
    for (int i = 0; i < runs && i < 64; i++) {
        result one = {0};
        if (!run_child(which, model, &one)) continue;
        first[n] = one.first, rss[n] = one.rss_mb, wrk[n] = one.worker_mb, after[n] = one.compiled_after;
        r = one;
        n++;
    }
    if (n == 0) {
        printf("%-12s failed (see above)\n", which);
        return false;
    }
    double lo = first[0], hi = first[0];
    for (int i = 1; i < n; i++) lo = fmin(lo, first[i]), hi = fmax(hi, first[i]);
    double med = median(first, n), mrss = median(rss, n), mwrk = median(wrk, n), maft = median(after, n);
    printf("%-12s %-40s %8.3f s  (%.3f-%.3f, %d runs)  %4lld compiled %4lld loaded  peak RSS %5.0f MB"
           "  workers %d x %4.0f MB",
           which, describe(which), med, lo, hi, n, r.compiled, r.loaded, mrss, r.workers, mwrk);
    if (maft > 0) printf("  compiled kernels in use after %.3f s", maft);
    printf("\n");
    if (js)
        fprintf(js, "%s\n  \"%s\": {\"first_call_s\": %.4f, \"min_s\": %.4f, \"max_s\": %.4f, \"runs\": %d, "
                    "\"kernels_compiled\": %lld, \"kernels_loaded\": %lld, \"peak_rss_mb\": %.1f, "
                    "\"workers\": %d, \"worker_peak_rss_mb\": %.1f, \"compiled_after_s\": %.4f}",
                *first_js ? "" : ",", which, med, lo, hi, n, r.compiled, r.loaded, mrss, r.workers, mwrk, maft);
    *first_js = false;
    return true;
}

int main(int argc, char **argv) {
    const char *cases = "gpt2,gpt2_block,gpt2_blocks,minilm,mixed_1k,mixed_10k,chain_10k,wide_10k,gpt2_async,"
                        "minilm_async",
               *json = NULL, *one = NULL;
    char mbuf[4096];
    const char *model = getenv("EMBER_MODEL_DIR");
#ifdef MINILM_DEFAULT_DIR
    if (!model) model = MINILM_DEFAULT_DIR;
#endif
    int runs = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--one") && i + 1 < argc) one = argv[++i];
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cases") && i + 1 < argc) cases = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--runs N] [--cases gpt2,gpt2_block,gpt2_blocks,minilm,mixed_1k,mixed_10k,chain_10k,wide_10k,gpt2_async,minilm_async] "
                            "[--model DIR] [--json OUT] | --one CASE [--model DIR]\n", argv[0]);
            return 2;
        }
    }
    if (!model) model = "models/all-MiniLM-L6-v2";
    snprintf(mbuf, sizeof mbuf, "%s", model);
    if (one) {
        if (!describe(one)) {
            fprintf(stderr, "bench_cold: unknown case '%s'\n", one);
            return 2;
        }
        return run_one(one, mbuf);
    }
    if (runs < 1 || runs > 64) {
        fprintf(stderr, "bench_cold: --runs must be in [1, 64]\n");
        return 2;
    }
    printf("bench_cold: cold first calls (new process, empty kernel cache each run), %ld CPUs, "
           "%d threads; medians of %d runs\n", sysconf(_SC_NPROCESSORS_ONLN), em_num_threads(), runs);
    FILE *js = json ? fopen(json, "w") : NULL;
    if (json && !js) perror(json);
    if (js) fprintf(js, "{");
    bool first_js = true, ok = true;
    char cbuf[256];
    snprintf(cbuf, sizeof cbuf, "%s", cases);
    for (char *c = strtok(cbuf, ","); c; c = strtok(NULL, ",")) {
        if (!describe(c)) {
            fprintf(stderr, "bench_cold: unknown case '%s'\n", c);
            return 2;
        }
        if (!strncmp(c, "minilm", 6) && access(model, R_OK) != 0) {
            printf("%-12s skipped: no model files in %s (tools/fetch-minilm, or --model DIR)\n", c, model);
            continue;
        }
        ok &= run_case(c, mbuf, runs, js, &first_js);
    }
    if (js) {
        fprintf(js, "\n}\n");
        fclose(js);
    }
    return ok ? 0 : 1;
}
