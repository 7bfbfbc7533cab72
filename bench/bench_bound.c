/* bench_bound.c - issue 22: the cold first call of synthetic graphs
 * (bench/synth.h: chain, wide, mixed) of 1k and 10k nodes, and the peak
 * memory of the process and of its compile workers; and (--passes) each
 * compiler pass's time against the node count.
 *
 *   bench/bench_bound [--nodes 1000,10000] [--kinds chain,wide,mixed]
 *                     [--timeout S] [--rows R --cols C] [--cheap]
 *   bench/bench_bound --one KIND NODES [--cheap]   (one case, in this process)
 *   bench/bench_bound --passes [--nodes 1000,10000,100000] [--kinds ...]
 *                     [--rounds 3] [--no-call]
 *
 * --passes: per case, in a child process, on x [4, 8] and relu graphs (the
 * compiler's work, not the math's): record (the trace), verify, cse, dce,
 * order (inputs first), attention (the pass's scan), text (the graph's
 * text: the plan key hashes it), guards (building them, in us) and check
 * (one call's guard check, in us), sc_build, sc_lower (every kernel), plan (the
 * engine's compile: schedule, lower, key each kernel, the plan) and exec
 * (a run of the plan) on a null device that compiles nothing and launches
 * nothing, and call (a compiled em_call on the cpu backend, its kernels
 * from a warm kernel cache); then kernels, nodes (after the passes) and
 * the child's peak RSS (MB).  Times in ms, medians over --rounds
 * interleaved rounds; then each metric's growth per 10x more nodes
 * ("x10" rows: a linear pass gives ~10x; the machine's caches add some at
 * 100k, where a graph's nodes are 40 MB).  Details at passes_one below.
 *
 * --cheap: relu where the graphs have tanh (synth.h).
 *
 * Each case runs in a new process (cold: a fresh, empty kernel cache, no
 * kernel loaded), killed after --timeout seconds (default 600).  Printed
 * per case: kernels, the first em_call's wall time (trace, passes,
 * schedule, lower, compile, run), the best of 5 later calls, the
 * process's peak RSS and the largest peak RSS of its compile workers
 * (a worker forked from a large process reports at least that process's
 * RSS at the fork: Linux counts the pages it shared before exec).  The
 * process's RSS includes every intermediate of the capture: the trace
 * runs the ops eagerly and holds each traced tensor until it ends
 * (64 KB a node at the default size). */
#include <ember.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_stats.h"
#include "synth.h"

/* --passes reaches the passes themselves, as the tests do */
#include "engine.h"
#include "guards.h"
#include "schedule.h"
#include "trace.h"

static int64_t rows = 64, cols = 256;
static bool cheap; /* --cheap: relu for tanh (synth.h) */

static int parse_kind(const char *s, sy_kind *k) {
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, sy_name((sy_kind)i))) return *k = (sy_kind)i, 0;
    return -1;
}

/* One case in this process: one line of results. */
static int run_one(sy_kind kind, int nodes) {
    sy_graph gr = {kind, nodes, cheap};
    em_generator *gen = em_generator_new(1);
    em_tensor *x = em_randn(gen, 2, (int64_t[]){rows, cols}, EM_F32, em_cpu());
    em_tensor *y = em_randn(gen, 1, (int64_t[]){cols}, EM_F32, em_cpu());
    em_compile_options o = {.ninputs = 2, .noutputs = 1, .name = "synth", .backend = "cpu"};
    em_compiled *f = em_compile(sy_fn, &gr, &o);
    em_tensor *in[2] = {x, y}, *out;
    double t0 = bench_now();
    if (!f || em_call(f, in, NULL, &out) != EM_OK) {
        fprintf(stderr, "bench_bound: %s\n", em_last_error());
        return 1;
    }
    double t1 = bench_now(), steady = 1e30;
    for (int r = 0; r < 5; r++) { /* the compiled entry (or op by op, when compiling failed) */
        double a = bench_now();
        if (em_call(f, in, NULL, &out) != EM_OK) return 1;
        if (bench_now() - a < steady) steady = bench_now() - a;
    }
    em_compile_stats st;
    em_compiled_stats(f, &st);
    struct rusage self, kids;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &kids);
    printf("%-6s %6d nodes  %4d kernels  first call %8.3f s  then %8.3f ms  peak RSS %6.0f MB"
           "  workers %6.0f MB\n",
           sy_name(kind), nodes, st.kernels, t1 - t0, steady * 1e3, self.ru_maxrss / 1024.0,
           kids.ru_maxrss / 1024.0);
    em_compiled_free(f);
    return 0;
}

/* One case in a child with a fresh cache directory, killed at timeout. */
static void run_child(const char *self, sy_kind kind, int nodes, int timeout) {
    char dir[] = "/tmp/ember-bench-bound-XXXXXX", n[16], cmd[256];
    if (!mkdtemp(dir)) return;
    snprintf(n, sizeof n, "%d", nodes);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("EMBER_CACHE_DIR", dir, 1);
        char r[32], c[32];
        snprintf(r, sizeof r, "%lld", (long long)rows);
        snprintf(c, sizeof c, "%lld", (long long)cols);
        alarm((unsigned)timeout);
        char *args[] = {(char *)self, "--rows", r, "--cols", c, "--one", (char *)sy_name(kind), n,
                        cheap ? "--cheap" : NULL, NULL};
        execv(self, args);
        _exit(127);
    }
    int status = 0;
    if (pid > 0) waitpid(pid, &status, 0);
    if (pid < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
        printf("%-6s %6d nodes  did not finish (%s, timeout %d s)\n", sy_name(kind), nodes,
               WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "failed", timeout);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "bench_bound: could not remove %s\n", dir);
}

/* ---- --passes: each pass's time against the node count ----
 *
 * Each case (kind, nodes) runs in a child process (--passes-one), which
 * times every pass on the same graph, x [4, 8] f32 and y [8], relu for
 * tanh: the compiler's work, not the math's.  In-process timings are
 * medians of PASS_REPS runs (each on a fresh copy of the graph where the
 * pass changes it).  The engine's plan building and a compiled graph's run
 * use a null device (below): kernels are lowered and keyed as for the CPU
 * but not compiled, and their launches do nothing, so "plan" and "exec"
 * are the engine's own costs.  "call" is a real em_call of a compiled entry
 * on the cpu backend (guards, entry lookup, the plan's steps and the real
 * kernels).  exec and call: the best of PASS_CALLS calls after the first
 * (on the shared 2-core machine a call's median follows the other
 * tenants: a call of 2 ms took 2-18 ms at load 3.5), with kernels from
 * the kernel cache in EMBER_CACHE_DIR (the parent keeps one directory
 * for all rounds: from the second round on, nothing is compiled). */

#define PASS_REPS 3
#define PASS_CALLS 15

static double best(const double *t, int n) {
    double b = t[0];
    for (int i = 1; i < n; i++) b = t[i] < b ? t[i] : b;
    return b;
}

/* The null device: a kernel is a tag, its launch a no-op. */
static char null_tag;

static bool null_target(int index, const jit_env *env, char *buf, size_t n) {
    (void)index, (void)env;
    snprintf(buf, n, "bench-null");
    return true;
}

static bool null_key(const k_kernel *k, const char *target, kc_key *key, kc_manifest *m) {
    return jit_kernel_key("null", target, k, key, m);
}

static em_status null_compile(int index, const char *target, k_kernel *const *ks, const kc_key *keys,
                              int n, jit_env *env, jit_artifact *out) {
    (void)index, (void)target, (void)ks, (void)keys, (void)env;
    for (int i = 0; i < n; i++) out[i].loaded = (jit_kernel *)(void *)&null_tag;
    return EM_OK;
}

static em_status null_load(int index, const jit_blob *b, const kc_key *key, jit_kernel **out) {
    (void)index, (void)b, (void)key, (void)out;
    return em_error(EM_ERR_STATE, "bench-null: nothing to load");
}

static em_status null_launch(const jit_kernel *k, void *const *bufs, const int64_t *sizes) {
    (void)k, (void)bufs, (void)sizes;
    return EM_OK;
}

static const jit_device null_device = {
    .name = "bench-null", .type = EM_CPU, .kind = "null", .target = null_target, .key = null_key,
    .compile = null_compile, .load = null_load, .launch = null_launch,
    .fused_attention = true, .half_kernels = true, /* as the cpu device: the same passes */
};

/* The metrics a case reports, in this order (seconds, or a count where
 * noted); the parent's table prints them in ms. */
static const char *const metric_names[] = {
    "record", "verify", "cse", "dce", "order", "attention", "text", "guards", "check",
    "sc_build", "sc_lower", "plan", "exec", "call", "kernels", "nodes", "rss"};
enum { M_RECORD, M_VERIFY, M_CSE, M_DCE, M_ORDER, M_ATTN, M_TEXT, M_GUARDS, M_CHECK, M_SCHED,
       M_LOWER, M_PLAN, M_EXEC, M_CALL, M_KERNELS, M_NODES, M_RSS, NMETRICS };

/* The median time of PASS_REPS runs of body, each after setup (untimed). */
#define TIME_MEDIAN(out, setup, body, teardown)                                                   \
    do {                                                                                          \
        double t_[PASS_REPS];                                                                     \
        for (int r_ = 0; r_ < PASS_REPS; r_++) {                                                  \
            setup;                                                                                \
            double a_ = bench_now();                                                              \
            body;                                                                                 \
            t_[r_] = bench_now() - a_;                                                            \
            teardown;                                                                             \
        }                                                                                         \
        (out) = median(t_, PASS_REPS);                                                            \
    } while (0)

/* The graph of gr on in, as em_compile records it (its intermediates
 * freed with the scope). */
static tr_graph *record_graph(const sy_graph *gr, em_tensor *const *in) {
    em_tensor *out = NULL;
    char why[256];
    em_scope_begin();
    tr_recorder *r = tr_record_begin(2, in, NULL);
    tr_graph *g = NULL;
    if (r && sy_fn((void *)gr, in, NULL, &out) == EM_OK) g = tr_record_end(r, 1, &out, why, sizeof why);
    else tr_record_abort(r);
    em_scope_end();
    return g;
}

/* The trace passes, one by one, on copies of g0; *opt gets the optimized
 * graph (as tr_optimize leaves it). */
static void time_trace_passes(const tr_graph *g0, double *m, tr_graph **opt) {
    tr_graph *c = NULL;
    TIME_MEDIAN(m[M_VERIFY], , tr_verify(g0), );
    TIME_MEDIAN(m[M_CSE], c = tr_graph_copy(g0), tr_cse(c), if (r_ < PASS_REPS - 1) tr_graph_free(c));
    tr_graph *d = NULL;
    TIME_MEDIAN(m[M_DCE], d = tr_graph_copy(c), tr_dce(d), if (r_ < PASS_REPS - 1) tr_graph_free(d));
    tr_graph_free(c);
    TIME_MEDIAN(m[M_ORDER], c = tr_graph_copy(d), tr_inputs_first(c),
                if (r_ < PASS_REPS - 1) tr_graph_free(c));
    tr_graph_free(d);
    int nf;
    tr_graph *f = NULL;
    TIME_MEDIAN(m[M_ATTN], , f = tr_fuse_attention(c, &nf), tr_graph_free(f));
    char *text = NULL;
    TIME_MEDIAN(m[M_TEXT], , text = tr_to_text(c), em_free(text));
    *opt = c;
}

/* Schedules g and lowers every kernel; the kernel count. */
static int lower_all(const tr_graph *g, int *bufs) {
    sc_schedule *s = sc_build_for(g, true);
    int n = 0;
    for (int i = 0; s && i < s->nsteps; i++) {
        if (s->steps[i].kind != SC_KERNEL) continue;
        int nbufs, nouts;
        kir_free(sc_lower(s, s->steps[i].group, bufs, &nbufs, &nouts));
        n++;
    }
    sc_free(s);
    return n;
}

static void time_sched_and_engine(const tr_graph *g, em_tensor *const *in, double *m) {
    sc_schedule *s = NULL;
    TIME_MEDIAN(m[M_SCHED], , s = sc_build_for(g, true), sc_free(s));
    int *bufs = malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    double a = bench_now(), b;
    m[M_KERNELS] = lower_all(g, bufs); /* includes one sc_build: subtracted */
    b = bench_now();
    m[M_LOWER] = b - a - m[M_SCHED];
    free(bufs);
    jit_compiled *st = NULL;
    TIME_MEDIAN(m[M_PLAN], jit_env env = {0}, jit_engine_compile(&null_device, g, &env, &st),
                if (r_ < PASS_REPS - 1) jit_engine_free(st));
    double t[PASS_CALLS];
    for (int r = 0; r < PASS_CALLS; r++) {
        em_tensor *out = NULL;
        em_scope_begin();
        double c = bench_now();
        em_status sx = jit_engine_run(st, NULL, g, in, &out);
        t[r] = bench_now() - c;
        em_scope_end();
        if (sx != EM_OK) fprintf(stderr, "bench_bound: exec: %s\n", em_last_error());
        em_release(out);
    }
    m[M_EXEC] = best(t, PASS_CALLS);
    jit_engine_free(st);
}

/* Guards: building them at the end of a trace, and the check of a call
 * (the mean of many: one check is tens of nanoseconds). */
static void time_guards(const tr_graph *g, em_tensor *const *in, double *m) {
    gd_guards *gs = NULL;
    TIME_MEDIAN(m[M_GUARDS], , gs = gd_build(g, in, NULL, 0, NULL, 0), if (r_ < PASS_REPS - 1) gd_free(gs));
    int n = 100000, ok = 0;
    double a = bench_now();
    for (int i = 0; i < n; i++) ok += gd_check(gs, in, NULL);
    m[M_CHECK] = (bench_now() - a) / n;
    if (ok != n) fprintf(stderr, "bench_bound: a guard check failed\n");
    gd_free(gs);
}

/* A real compiled entry on the cpu backend: the median later call. */
static void time_call(const sy_graph *gr, em_tensor *const *in, double *m) {
    em_compile_options o = {.ninputs = 2, .noutputs = 1, .name = "synth", .backend = "cpu"};
    em_compiled *f = em_compile(sy_fn, (void *)gr, &o);
    em_tensor *out;
    if (!f || em_call(f, in, NULL, &out) != EM_OK) {
        fprintf(stderr, "bench_bound: %s\n", em_last_error());
        m[M_CALL] = -1;
        return;
    }
    double t[PASS_CALLS];
    for (int r = 0; r < PASS_CALLS; r++) {
        double a = bench_now();
        em_call(f, in, NULL, &out);
        t[r] = bench_now() - a;
    }
    m[M_CALL] = best(t, PASS_CALLS);
    struct rusage self;
    getrusage(RUSAGE_SELF, &self);
    m[M_RSS] = self.ru_maxrss / 1024.0; /* MB: the process's peak, after the compiled calls */
    em_compiled_free(f);
}

/* One case, in this process: one line "P kind nodes v0 v1 ...". */
static int passes_one(sy_kind kind, int nodes, bool call) {
    sy_graph gr = {kind, nodes, true};
    em_generator *gen = em_generator_new(1);
    em_tensor *x = em_randn(gen, 2, (int64_t[]){4, 8}, EM_F32, em_cpu());
    em_tensor *y = em_randn(gen, 1, (int64_t[]){8}, EM_F32, em_cpu());
    em_tensor *in[2] = {x, y};
    double m[NMETRICS] = {0};
    if (call) time_call(&gr, in, m);
    tr_graph *g0 = NULL;
    TIME_MEDIAN(m[M_RECORD], , g0 = record_graph(&gr, in), if (r_ < PASS_REPS - 1) tr_graph_free(g0));
    if (!g0) {
        fprintf(stderr, "bench_bound: record: %s\n", em_last_error());
        return 1;
    }
    tr_graph *g = NULL;
    time_trace_passes(g0, m, &g);
    m[M_NODES] = g->nnodes;
    time_guards(g, in, m);
    time_sched_and_engine(g, in, m);
    printf("P %s %d", sy_name(kind), nodes);
    for (int i = 0; i < NMETRICS; i++) printf(" %.9g", m[i]);
    printf("\n");
    tr_graph_free(g);
    tr_graph_free(g0);
    return 0;
}

/* Runs one case in a child; its metrics into m (false: it failed). */
static bool passes_child(const char *self, sy_kind kind, int nodes, bool call, const char *cache,
                         double *m) {
    char cmd[4096 + 256];
    snprintf(cmd, sizeof cmd, "EMBER_CACHE_DIR='%s' '%s' --passes-one %s %d%s", cache, self,
             sy_name(kind), nodes, call ? "" : " --no-call");
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p) return false;
    char line[2048];
    bool ok = false;
    while (fgets(line, sizeof line, p)) {
        char k[16];
        int n, used = 0;
        if (sscanf(line, "P %15s %d%n", k, &n, &used) != 2) continue;
        char *s = line + used;
        ok = true;
        for (int i = 0; i < NMETRICS && ok; i++) m[i] = strtod(s, &s);
    }
    return pclose(p) == 0 && ok;
}

/* A metric as printed: ms (check: us; counts and MB as they are). */
static double shown(int i, double v) {
    if (i == M_CHECK || i == M_GUARDS) return v * 1e6;
    if (i >= M_KERNELS) return v;
    return v * 1e3;
}

static void print_row(const char *kind, const char *nodes, const double *m, bool ratio) {
    printf("%-6s %-9s", kind, nodes);
    for (int i = 0; i < NMETRICS; i++) {
        if (ratio) printf(" %8.1fx", m[i]);
        else if (i >= M_KERNELS) printf(" %9.0f", m[i]);
        else printf(" %9.3f", shown(i, m[i]));
    }
    printf("\n");
}

/* The medians of rounds interleaved over every case, then the growth of
 * each metric per 10x more nodes (a linear pass: ~10x). */
static int passes_main(const char *self, const char *nodes, const char *kinds, int rounds, bool call) {
    int ns[8], nn = 0;
    sy_kind ks[3];
    int nk = 0;
    for (const char *p = nodes; *p && nn < 8;) {
        ns[nn++] = atoi(p);
        p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p);
    }
    char kbuf[128];
    snprintf(kbuf, sizeof kbuf, "%s", kinds);
    for (char *s = strtok(kbuf, ","); s && nk < 3; s = strtok(NULL, ","))
        if (parse_kind(s, &ks[nk])) return 2;
        else nk++;
    char cache[] = "/tmp/ember-bench-passes-XXXXXX";
    if (!mkdtemp(cache)) return 1;
    static double all[3][8][16][NMETRICS];
    bool okc[3][8] = {{0}};
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < nk; k++)
            for (int i = 0; i < nn; i++) {
                okc[k][i] = passes_child(self, ks[k], ns[i], call, cache, all[k][i][r]);
                if (!okc[k][i]) fprintf(stderr, "bench_bound: %s %d failed\n", sy_name(ks[k]), ns[i]);
            }
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
    if (system(cmd) != 0) fprintf(stderr, "bench_bound: could not remove %s\n", cache);
    printf("bench_bound --passes: x [4, 8] f32, y [8], relu for tanh; medians of %d rounds "
           "(each pass: median of %d in the round; exec and call: best of %d calls)\n",
           rounds, PASS_REPS, PASS_CALLS);
    printf("times in ms (guards, check: us); exec: null device; call: cpu backend, warm kernel cache; "
           "rss: peak MB after the calls\n");
    printf("%-6s %-9s", "kind", "nodes");
    for (int i = 0; i < NMETRICS; i++) printf(" %9s", metric_names[i]);
    printf("\n");
    for (int k = 0; k < nk; k++) {
        double med[8][NMETRICS];
        for (int i = 0; i < nn; i++) {
            for (int j = 0; j < NMETRICS; j++) {
                double v[16];
                for (int r = 0; r < rounds; r++) v[r] = all[k][i][r][j];
                med[i][j] = median(v, rounds);
            }
            char nb[16];
            snprintf(nb, sizeof nb, "%d", ns[i]);
            if (okc[k][i]) print_row(sy_name(ks[k]), nb, med[i], false);
        }
        for (int i = 1; i < nn; i++) { /* growth per 10x of nodes, normalized */
            if (!okc[k][i] || !okc[k][i - 1]) continue;
            double g[NMETRICS], e = log10((double)ns[i] / ns[i - 1]);
            for (int j = 0; j < NMETRICS; j++)
                g[j] = med[i - 1][j] > 0 && e > 0 ? pow(med[i][j] / med[i - 1][j], 1 / e) : 0;
            char nb[32];
            snprintf(nb, sizeof nb, "%dk>%dk", ns[i - 1] / 1000, ns[i] / 1000);
            print_row("x10", nb, g, true);
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *nodes = "1000,10000", *kinds = "chain,wide,mixed";
    int timeout = 600, rounds = 3;
    bool passes = false, call = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--passes-one") && i + 2 < argc) {
            sy_kind k;
            if (parse_kind(argv[i + 1], &k)) return 2;
            return passes_one(k, atoi(argv[i + 2]), !(i + 3 < argc && !strcmp(argv[i + 3], "--no-call")));
        } else if (!strcmp(argv[i], "--passes")) passes = true;
        else if (!strcmp(argv[i], "--no-call")) call = false;
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--one") && i + 2 < argc) {
            sy_kind k;
            if (parse_kind(argv[i + 1], &k)) return 2;
            cheap = i + 3 < argc && !strcmp(argv[i + 3], "--cheap");
            return run_one(k, atoi(argv[i + 2]));
        } else if (!strcmp(argv[i], "--cheap")) cheap = true;
        else if (!strcmp(argv[i], "--nodes") && i + 1 < argc) nodes = argv[++i];
        else if (!strcmp(argv[i], "--kinds") && i + 1 < argc) kinds = argv[++i];
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) timeout = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--cols") && i + 1 < argc) cols = atoll(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--nodes N,...] [--kinds chain,wide,mixed] [--timeout S] "
                            "[--rows R --cols C] [--cheap] | --one KIND NODES [--cheap] | --passes [--nodes N,...] "
                            "[--kinds K,...] [--rounds R] [--no-call]\n", argv[0]);
            return 2;
        }
    }
    if (passes) {
        if (rounds < 1 || rounds > 16) rounds = 3;
        bool given = false;
        for (int i = 1; i < argc; i++) given |= !strcmp(argv[i], "--nodes");
        char self[4096]; /* popen runs a shell: /proc/self/exe would be the shell's */
        ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
        if (len <= 0) return 1;
        self[len] = '\0';
        return passes_main(self, given ? nodes : "1000,10000,100000", kinds, rounds, call);
    }
    printf("bench_bound: x [%lld, %lld] f32, y [%lld]%s; cold first calls (fresh cache each)\n",
           (long long)rows, (long long)cols, (long long)cols, cheap ? ", relu for tanh" : "");
    char kbuf[128];
    snprintf(kbuf, sizeof kbuf, "%s", kinds);
    for (char *ks = strtok(kbuf, ","); ks; ks = strtok(NULL, ",")) {
        sy_kind k;
        if (parse_kind(ks, &k)) return 2;
        for (const char *p = nodes; *p;) {
            run_child("/proc/self/exe", k, atoi(p), timeout);
            p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p);
        }
    }
    return 0;
}
