/* bench_bound.c - issue 22: the cold first call of synthetic graphs
 * (bench/synth.h: chain, wide, mixed) of 1k and 10k nodes, and the peak
 * memory of the process and of its compile workers.
 *
 *   bench/bench_bound [--nodes 1000,10000] [--kinds chain,wide,mixed]
 *                     [--timeout S] [--rows R --cols C] [--cheap]
 *   bench/bench_bound --one KIND NODES [--cheap]   (one case, in this process)
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

int main(int argc, char **argv) {
    const char *nodes = "1000,10000", *kinds = "chain,wide,mixed";
    int timeout = 600;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--one") && i + 2 < argc) {
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
                            "[--rows R --cols C] [--cheap] | --one KIND NODES [--cheap]\n", argv[0]);
            return 2;
        }
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
