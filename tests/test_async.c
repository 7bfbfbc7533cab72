/* test_async.c - async compile in em_compile: calls run op by op while a
 * new entry compiles in a background thread, then switch to the compiled
 * entry; values equal before and after; freeing while compiling. */
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "jit.h"

static void ref_softmax(const double *x, int64_t rows, int64_t cols, double *y) {
    for (int64_t r = 0; r < rows; r++) {
        const double *a = x + r * cols;
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < cols; c++) m = a[c] > m ? a[c] : m;
        for (int64_t c = 0; c < cols; c++) s += exp(a[c] - m);
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = exp(a[c] - m) / s;
    }
}

/* softmax(x * 2 + 1) over the last dim, then tanh: two kernels */
static em_status fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    em_tensor *t = em_softmax(em_add_scalar(em_mul_scalar(in[0], 2), 1), -1);
    out[0] = em_tanh(em_add(t, em_sum(t, 1, (const int[]){0}, true)));
    return out[0] ? EM_OK : em_last_status();
}

static double *reference(const em_tensor *x) {
    int64_t rows = em_size(x, 0), cols = em_size(x, 1);
    double *xv = tu_values(x), *y = malloc(sizeof(double) * (size_t)(rows * cols));
    for (int64_t i = 0; i < rows * cols; i++) xv[i] = 2 * xv[i] + 1;
    ref_softmax(xv, rows, cols, y);
    for (int64_t c = 0; c < cols; c++) {
        double s = 0;
        for (int64_t r = 0; r < rows; r++) s += y[r * cols + c];
        for (int64_t r = 0; r < rows; r++) xv[r * cols + c] = tanh(y[r * cols + c] + s);
    }
    free(y);
    return xv;
}

static void call_and_check(em_compiled *f, em_tensor *x) {
    em_tensor *y;
    ck_assert_msg(em_call(f, &x, NULL, &y) == EM_OK, "%s", em_last_error());
    double *ref = reference(x);
    tu_check_close(y, ref, 2, em_sizes(x), 1e-5, 1e-6);
    free(ref);
    em_release(y);
}

static em_compile_stats stats_of(const em_compiled *f) {
    em_compile_stats st;
    ck_assert_int_eq(em_compiled_stats(f, &st), EM_OK);
    return st;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Calls f on x until a call is served by the compiled entry (hits beyond
 * the pending ones), at most for limit seconds; returns the calls made. */
static int64_t call_until_compiled(em_compiled *f, em_tensor *x, double limit) {
    int64_t calls = 0;
    double end = now() + limit;
    em_compile_stats st = stats_of(f);
    int64_t served = st.hits - st.pending;
    while (stats_of(f).hits - stats_of(f).pending == served && now() < end) {
        call_and_check(f, x);
        calls++;
        usleep(2000);
    }
    st = stats_of(f);
    ck_assert_msg(st.hits - st.pending > served, "no call reached the compiled entry in %.0f s",
                  limit);
    return calls;
}

static em_compile_options options(int async) {
    return (em_compile_options){.ninputs = 1, .noutputs = 1, .name = "f", .async_compile = async};
}

START_TEST(calls_switch_to_the_compiled_entry) {
    em_compile_options o = options(1);
    em_compiled *f = em_compile(fn, NULL, &o);
    em_tensor *x = tu_random(1, 2, TU_SIZES(64, 48), EM_F32, 1);
    call_and_check(f, x); /* traces (eagerly) and starts the compile */
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.traces, 1);
    ck_assert_int_eq(st.entries, 1);
    call_until_compiled(f, x, 60);
    /* from now on the compiled entry serves, with the same values */
    st = stats_of(f);
    int64_t pending = st.pending;
    ck_assert_int_gt(st.kernels, 0);
    ck_assert_int_gt(st.kernels_compiled + st.kernels_loaded, 0);
    for (int i = 0; i < 3; i++) call_and_check(f, x);
    st = stats_of(f);
    ck_assert_int_eq(st.pending, pending);
    ck_assert_int_eq(st.traces, 1);
    ck_assert_int_eq(st.calls, st.hits + 1);
    em_compiled_free(f);
}
END_TEST

START_TEST(compiled_values_equal_the_op_by_op_ones) {
    em_compile_options o = options(1);
    em_compiled *f = em_compile(fn, NULL, &o);
    em_tensor *x = tu_random(2, 2, TU_SIZES(16, 40), EM_F32, 2), *before, *after;
    ck_assert_int_eq(em_call(f, &x, NULL, &before), EM_OK); /* the eager trace */
    call_until_compiled(f, x, 60);
    ck_assert_int_eq(em_call(f, &x, NULL, &after), EM_OK);
    double *a = tu_values(before);
    tu_check_close(after, a, 2, TU_SIZES(16, 40), 1e-6, 1e-7);
    free(a);
    em_compiled_free(f);
}
END_TEST

START_TEST(free_while_compiling_is_safe) {
    for (int i = 0; i < 3; i++) {
        em_compile_options o = options(1);
        em_compiled *f = em_compile(fn, NULL, &o);
        em_tensor *x = tu_random(3 + (uint64_t)i, 2, TU_SIZES(8, 8 + i), EM_F32, 1);
        call_and_check(f, x);
        if (i > 0) call_and_check(f, x); /* a second call, likely still op by op */
        em_compiled_free(f);             /* waits for the compile */
    }
}
END_TEST

START_TEST(async_with_dynamic_sizes) {
    em_compile_options o = options(1);
    em_compiled *f = em_compile(fn, NULL, &o);
    for (int64_t b = 2; b <= 11; b++) call_and_check(f, tu_random((uint64_t)b, 2, TU_SIZES(b, 24), EM_F32, 1));
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.traces, 2);
    call_until_compiled(f, tu_random(99, 2, TU_SIZES(13, 24), EM_F32, 1), 60);
    st = stats_of(f);
    ck_assert_int_eq(st.traces, 2);
    ck_assert_int_eq(st.dynamic_entries, 1);
    em_compiled_free(f);
}
END_TEST

/* softmax over half rows: reshapes to sizes computed from the batch */
static em_status halves_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    int64_t b = em_size(in[0], 0), c = em_size(in[0], 1);
    em_tensor *h = em_softmax(em_reshape(in[0], 2, (const int64_t[]){2 * b, c / 2}), -1);
    out[0] = em_reshape(h, 2, (const int64_t[]){b, c});
    return out[0] ? EM_OK : em_last_status();
}

static void check_halves(em_compiled *f, em_tensor *x) {
    em_tensor *y;
    ck_assert_msg(em_call(f, &x, NULL, &y) == EM_OK, "%s", em_last_error());
    int64_t rows = em_size(x, 0), cols = em_size(x, 1);
    double *xv = tu_values(x), *ref = malloc(sizeof(double) * (size_t)(rows * cols));
    ref_softmax(xv, 2 * rows, cols / 2, ref);
    tu_check_close(y, ref, 2, TU_SIZES(rows, cols), 1e-5, 1e-6);
    free(xv);
    free(ref);
}

START_TEST(async_with_reshapes_that_follow_the_batch) {
    em_compile_options o = options(1);
    em_compiled *f = em_compile(halves_fn, NULL, &o);
    for (int64_t b = 2; b <= 9; b++) check_halves(f, tu_random((uint64_t)b, 2, TU_SIZES(b, 12), EM_F32, 2));
    double end = now() + 60;
    em_compile_stats st = stats_of(f);
    int64_t served = st.hits - st.pending;
    for (int64_t b = 10; stats_of(f).hits - stats_of(f).pending == served && now() < end; b++) {
        check_halves(f, tu_random((uint64_t)b, 2, TU_SIZES(3 + b % 20, 12), EM_F32, 2));
        usleep(2000);
    }
    st = stats_of(f);
    ck_assert_int_gt(st.hits - st.pending, served);
    ck_assert_int_eq(st.traces, 2);
    ck_assert_int_eq(st.dynamic_entries, 1);
    em_compiled_free(f);
}
END_TEST

START_TEST(environment_turns_it_on) {
    setenv("EMBER_ASYNC_COMPILE", "1", 1);
    em_compile_options o = options(0);
    em_compiled *f = em_compile(fn, NULL, &o);
    unsetenv("EMBER_ASYNC_COMPILE");
    em_tensor *x = tu_random(5, 2, TU_SIZES(12, 20), EM_F32, 1);
    call_and_check(f, x);
    call_until_compiled(f, x, 60);
    em_compiled_free(f);
    /* the option overrides the environment */
    setenv("EMBER_ASYNC_COMPILE", "1", 1);
    o = options(-1);
    f = em_compile(fn, NULL, &o);
    unsetenv("EMBER_ASYNC_COMPILE");
    call_and_check(f, x);
    call_and_check(f, x);
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.pending, 0); /* compiled in the first call */
    ck_assert_int_eq(st.hits, 1);
    ck_assert_int_gt(st.kernels, 0);
    em_compiled_free(f);
}
END_TEST

/* four softmaxes split by leading-dim sums (eager steps): several kernels,
 * some compiled by worker processes */
static em_status chain_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    const double *scale = ctx;
    em_tensor *x = in[0];
    for (int i = 0; i < 4; i++)
        x = em_add(em_softmax(em_mul_scalar(x, *scale + i), -1), em_sum(x, 1, (const int[]){0}, true));
    out[0] = x;
    return out[0] ? EM_OK : em_last_status();
}

START_TEST(concurrent_background_compiles_finish) {
    /* three functions compiling at once, each spawning workers: a worker
     * must not inherit another's pipe (each would wait for the other) */
    static const double scales[3] = {0.5, 1.5, 2.5};
    em_compiled *f[3];
    em_tensor *x = tu_random(8, 2, TU_SIZES(6, 20), EM_F32, 1), *y[3];
    for (int i = 0; i < 3; i++) {
        em_compile_options o = options(1);
        f[i] = em_compile(chain_fn, (void *)&scales[i], &o);
        ck_assert_int_eq(em_call(f[i], &x, NULL, &y[i]), EM_OK);
    }
    for (int i = 0; i < 3; i++) {
        double *before = tu_values(y[i]);
        double end = now() + 120;
        em_compile_stats st = stats_of(f[i]);
        while (st.hits == st.pending && now() < end) {
            em_tensor *z;
            ck_assert_int_eq(em_call(f[i], &x, NULL, &z), EM_OK);
            tu_check_close(z, before, 2, TU_SIZES(6, 20), 1e-5, 1e-6);
            usleep(5000);
            st = stats_of(f[i]);
        }
        ck_assert_msg(st.hits > st.pending, "function %d never switched to its kernels", i);
        ck_assert_int_ge(st.kernels, 4);
        free(before);
    }
    for (int i = 0; i < 3; i++) em_compiled_free(f[i]);
}
END_TEST

typedef struct caller {
    em_compiled *f;
    int ok;
} caller;

static void *call_many(void *p) {
    caller *c = p;
    em_scope_begin();
    for (int i = 0; i < 40; i++) {
        em_scope_begin();
        em_tensor *x = tu_random(7, 2, TU_SIZES(10, 30), EM_F32, 1), *y;
        double *ref = reference(x), *v = NULL;
        if (em_call(c->f, &x, NULL, &y) == EM_OK && (v = tu_values(y))) {
            bool same = true;
            for (int k = 0; k < 300; k++) same &= fabs(v[k] - ref[k]) <= 1e-5 * fabs(ref[k]) + 1e-6;
            c->ok += same;
        }
        free(v);
        free(ref);
        em_scope_end();
        usleep(500);
    }
    em_scope_end();
    return NULL;
}

START_TEST(threads_call_while_it_compiles) {
    em_compile_options o = options(1);
    em_compiled *f = em_compile(fn, NULL, &o);
    pthread_t t[3];
    caller c[3];
    for (int i = 0; i < 3; i++) {
        c[i] = (caller){f, 0};
        ck_assert_int_eq(pthread_create(&t[i], NULL, call_many, &c[i]), 0);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        ck_assert_int_eq(c[i].ok, 40);
    }
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.calls, 120);
    ck_assert_int_eq(st.traces, 1);
    ck_assert_int_eq(st.hits, 119);
    em_compiled_free(f);
}
END_TEST

/* ---- processes: threads, workers and files that outlive them ---- */

static int count_dir(const char *path, const char *prefix) {
    DIR *d = opendir(path);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.' && !strncmp(e->d_name, prefix, strlen(prefix))) n++;
    if (d) closedir(d);
    return n;
}

/* Live processes whose parent is pid (and whose name starts with name, if
 * given). */
static int count_children(pid_t pid, const char *name) {
    DIR *d = opendir("/proc");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[300], buf[512];
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        size_t len = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        buf[len] = '\0';
        char *open = strchr(buf, '('), *close = strrchr(buf, ')');
        if (!open || !close) continue;
        int ppid = 0;
        char state = 0;
        if (sscanf(close + 1, " %c %d", &state, &ppid) != 2 || ppid != pid) continue;
        *close = '\0';
        /* a zombie has ended (reaped by whoever waits for it) */
        if (state != 'Z' && (!name || !strncmp(open + 1, name, strlen(name)))) n++;
    }
    if (d) closedir(d);
    return n;
}

/* Kills the children of pid named name, by their pids. */
static void kill_children(pid_t pid, const char *name) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[300], buf[512];
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        size_t len = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        buf[len] = '\0';
        char *open = strchr(buf, '('), *close = strrchr(buf, ')');
        int ppid = 0;
        if (!open || !close || sscanf(close + 1, " %*c %d", &ppid) != 1 || ppid != pid) continue;
        *close = '\0';
        if (!strcmp(open + 1, name)) kill(atoi(e->d_name), SIGKILL);
    }
    if (d) closedir(d);
}

static int ncores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

static int count_files(const char *path, const struct stat *sb, int flag, struct FTW *ftw);
static int nfiles;
static int count_files(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)path, (void)sb, (void)ftw;
    nfiles += flag == FTW_F;
    return 0;
}

static pid_t last_child;

/* Runs this program as "--child mode" with the environment env (NAME=value
 * strings, NULL-ended) and, when as_limit > 0, RLIMIT_AS of that many
 * bytes; its wait status, or -1 when it ran past timeout (then killed).
 * signal_after > 0: SIGTERM it once it has a child of its own, or after
 * that many seconds. */
static int run_child_signal(const char *mode, const char *const *env, long as_limit, double timeout,
                            double signal_after) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    ck_assert(n > 0);
    self[n] = '\0';
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        for (int i = 0; env[i]; i++) /* "-NAME" unsets NAME */
            env[i][0] == '-' ? unsetenv(env[i] + 1) : putenv((char *)env[i]);
        struct rlimit r = {(rlim_t)as_limit, (rlim_t)as_limit};
        if (as_limit > 0) setrlimit(RLIMIT_AS, &r);
        execl(self, self, "--child", mode, (char *)NULL);
        _exit(127);
    }
    last_child = pid;
    double end = now() + timeout, sig_at = now() + signal_after;
    int st;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (signal_after > 0 && (now() > sig_at || count_children(pid, NULL) > 0)) {
            usleep(300000); /* let it start writing */
            kill(pid, SIGTERM);
            signal_after = 0;
        }
        if (now() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        usleep(20000);
    }
    return st;
}

static int run_child(const char *mode, const char *const *env, long as_limit, double timeout) {
    return run_child_signal(mode, env, as_limit, timeout, 0);
}

/* ---- the child programs ---- */

#define CHILD_CHECK(c, ...)                                      \
    do {                                                          \
        if (!(c)) {                                               \
            fprintf(stderr, "child: " __VA_ARGS__);               \
            fprintf(stderr, " (%s:%d)\n", __FILE__, __LINE__);     \
            exit(1);                                              \
        }                                                         \
    } while (0)

static bool close_to(const double *v, const double *ref, int64_t n, double rtol, double atol) {
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(v[i] - ref[i]) <= atol + rtol * fabs(ref[i]))) return false;
    return true;
}

static int max_threads_seen, max_workers_seen;

static void sample(void) {
    int t = count_dir("/proc/self/task", "");
    int w = count_children(getpid(), "ember-jit-work");
    if (t > max_threads_seen) max_threads_seen = t;
    if (w > max_workers_seen) max_workers_seen = w;
}

/* One call of the em_compile'd fn with new values, checked in float64. */
static void child_call(em_compiled *f, uint64_t seed, int64_t rows) {
    em_scope_begin();
    em_tensor *x = tu_random(seed, 2, TU_SIZES(rows, 24), EM_F32, 1), *y;
    CHILD_CHECK(em_call(f, &x, NULL, &y) == EM_OK, "em_call: %s", em_last_error());
    double *ref = reference(x), *v = tu_values(y);
    CHILD_CHECK(close_to(v, ref, rows * 24, 1e-5, 1e-6), "em_call %d: wrong values", (int)seed);
    free(ref);
    free(v);
    em_release(y);
    em_scope_end();
}

/* Graph g of the lazy program: tanh(x * (1 + g / 20) + g / 10), a new
 * graph for each g (its scalars are part of it). */
static void child_lazy(int g, uint64_t seed) {
    em_scope_begin();
    em_tensor *x = tu_random(seed, 2, TU_SIZES(6, 32), EM_F32, 1);
    double a = 1 + g / 20.0, b = g / 10.0;
    em_tensor *y = em_tanh(em_add_scalar(em_mul_scalar(x, a), b));
    CHILD_CHECK(y != NULL, "lazy op: %s", em_last_error());
    double *xv = tu_values(x), *v = tu_values(y);
    for (int i = 0; i < 6 * 32; i++) xv[i] = tanh(xv[i] * (float)a + (float)b);
    CHILD_CHECK(close_to(v, xv, 6 * 32, 2e-5, 2e-6), "lazy graph %d: wrong values", g);
    free(xv);
    free(v);
    em_scope_end();
}

static bool all_compiled(const em_compiled *f) {
    em_compile_stats cs;
    em_lazy_stats ls;
    em_compiled_stats(f, &cs);
    em_lazy_get_stats(&ls);
    return cs.hits > cs.pending && ls.graphs_compiled >= 40;
}

/* EMBER_JIT=1 (and EMBER_ASYNC_COMPILE as the parent set it): an
 * em_compile'd function and 40 lazy graphs, called with new values for a
 * few rounds and until every compile is done; threads and workers are
 * sampled on the way. */
static int child_jit(void) {
    em_compile_options o = options(0);
    em_compiled *f = em_compile(fn, NULL, &o);
    CHILD_CHECK(f != NULL, "em_compile: %s", em_last_error());
    double end = now() + 90;
    for (int round = 0; round < 3 || (!all_compiled(f) && now() < end); round++) {
        for (int i = 0; i < 10; i++) child_call(f, (uint64_t)(100 * round + i), 8 + i % 3);
        for (int g = 0; g < 40; g++) {
            child_lazy(g, (uint64_t)(1000 * round + g));
            sample();
        }
        sample();
    }
    CHILD_CHECK(all_compiled(f), "the compiles did not finish in 90 s");
    em_compiled_free(f);
    /* main, the eager pool's 1 (EMBER_NUM_THREADS=2), the queue's, one spare */
    int tmax = 2 + ncores() + 1;
#ifdef __SANITIZE_THREAD__
    tmax++; /* ThreadSanitizer's own background thread */
#endif
    fprintf(stderr, "child: at most %d threads, %d workers\n", max_threads_seen, max_workers_seen);
    CHILD_CHECK(max_threads_seen <= tmax, "%d threads (at most %d)", max_threads_seen, tmax);
    CHILD_CHECK(max_workers_seen <= ncores(), "%d workers (at most %d)", max_workers_seen, ncores());
    return 0;
}

/* Under a memory limit: a matmul, an em_compile'd function and a lazy
 * graph each give correct values or an error with a message. */
static void mem_result(em_tensor *y, const double *ref, int64_t n) {
    if (!y) {
        CHILD_CHECK(em_last_error()[0], "an error without a message");
        em_clear_error();
        return;
    }
    double *v = malloc(sizeof(double) * (size_t)n);
    CHILD_CHECK(v, "no memory for the values");
    em_tensor *d = em_cast(y, EM_F64);
    if (!d || em_copy_to_host(d, v, sizeof(double) * (size_t)n) != EM_OK) {
        CHILD_CHECK(em_last_error()[0], "an error without a message");
        em_clear_error();
    } else {
        CHILD_CHECK(close_to(v, ref, n, 1e-4, 1e-5), "wrong values under the memory limit");
    }
    free(v);
}

static int child_mem(void) {
    for (int rep = 0; rep < 3; rep++) {
        em_scope_begin();
        em_tensor *x = tu_random(7, 2, TU_SIZES(48, 48), EM_F32, 1);
        double *xv = tu_values(x), *ref = calloc(48 * 48, sizeof(double));
        for (int i = 0; i < 48; i++)
            for (int j = 0; j < 48; j++)
                for (int k = 0; k < 48; k++) ref[i * 48 + j] += xv[i * 48 + k] * xv[k * 48 + j];
        mem_result(em_matmul(x, x), ref, 48 * 48);
        free(ref);
        em_compile_options o = options(rep == 2 ? 1 : -1);
        em_compiled *f = em_compile(fn, NULL, &o);
        em_tensor *y = NULL;
        for (int c = 0; f && c < 3; c++) {
            em_tensor *xs = tu_random((uint64_t)c, 2, TU_SIZES(8, 24), EM_F32, 1);
            double *r = reference(xs);
            mem_result(em_call(f, &xs, NULL, &y) == EM_OK ? y : NULL, r, 8 * 24);
            free(r);
        }
        em_compiled_free(f);
        if (em_lazy_begin() == EM_OK) {
            for (int i = 0; i < 48 * 48; i++) xv[i] = tanh(xv[i] * 1.5f + 0.25f);
            mem_result(em_tanh(em_add_scalar(em_mul_scalar(x, 1.5), 0.25)), xv, 48 * 48);
            em_lazy_end();
        }
        free(xv);
        em_scope_end();
    }
    return 0;
}

/* Compiles with the worker the parent set (one that hangs) until killed. */
static int child_signal(void) {
    em_compile_options o = options(-1);
    em_compiled *f = em_compile(chain_fn, (void *)&(const double){0.5}, &o);
    em_tensor *x = em_full(2, TU_SIZES(6, 20), 0.5, EM_F32, em_cpu()), *y;
    em_call(f, &x, NULL, &y);
    return 0;
}

/* A function of 24 kernels (matmuls, eager steps, between pointwise
 * chains whose scalars differ, so no two kernels are the same). */
static em_status many_kernels_fn(void *ctx, em_tensor *const *in, const double *s,
                                 em_tensor **out) {
    em_tensor *x = in[0];
    for (int i = 0; i < 24; i++)
        x = em_matmul(em_tanh(em_add_scalar(em_mul_scalar(x, 0.5 + i / 64.0), i / 32.0)), in[0]);
    out[0] = x;
    return out[0] ? EM_OK : em_last_status();
}

/* Exits while its background compile runs in process (EMBER_JIT_WORKER=0,
 * set by the parent): exit must wait for it, not tear the process down
 * around it, and start no new compile. */
static em_compiled *exit_child_f; /* reachable: not a leak to LeakSanitizer */

static int child_exit(void) {
    em_compile_options o = options(1);
    exit_child_f = em_compile(many_kernels_fn, NULL, &o);
    em_tensor *x = em_full(2, TU_SIZES(16, 16), 0.01, EM_F32, em_cpu()), *y;
    CHILD_CHECK(em_call(exit_child_f, &x, NULL, &y) == EM_OK, "em_call: %s", em_last_error());
    em_release(x);
    em_release(y);
    usleep(300000); /* the queue's thread is compiling its 24 kernels now */
    return 0; /* f is left to the exit (freeing it would wait for the compile) */
}

static const char *child_mode;

START_TEST(child_program) {
    if (!strcmp(child_mode, "jit")) child_jit();
    else if (!strcmp(child_mode, "mem")) child_mem();
    else ck_abort_msg("unknown child mode %s", child_mode);
}
END_TEST

/* The child runs in a Check runner of its own (the helpers assert), in
 * this process: its threads and workers are what is counted. */
static int child_main(const char *mode) {
    /* not under Check: its runner handles SIGTERM itself */
    if (!strcmp(mode, "signal")) return child_signal();
    if (!strcmp(mode, "exit")) return child_exit();
    child_mode = mode;
    Suite *s = suite_create("child");
    TCase *tc = tcase_create(mode);
    tcase_add_test(tc, child_program);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_SILENT);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

/* ---- the tests that run them ---- */

typedef struct sandbox {
    char tmp[64], cache[64];
    char env_tmp[96], env_cache[96];
} sandbox;

static void sandbox_make(sandbox *b) {
    strcpy(b->tmp, "/tmp/ember-async-tmp-XXXXXX");
    strcpy(b->cache, "/tmp/ember-async-cache-XXXXXX");
    ck_assert(mkdtemp(b->tmp) && mkdtemp(b->cache));
    snprintf(b->env_tmp, sizeof b->env_tmp, "TMPDIR=%s", b->tmp);
    snprintf(b->env_cache, sizeof b->env_cache, "EMBER_CACHE_DIR=%s", b->cache);
}

static void sandbox_free(sandbox *b) {
    nftw(b->tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    nftw(b->cache, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Nothing of the child outlives it: no worker (orphans come to us, a
 * subreaper), no ember-kernel-* file in its TMPDIR; its kernels are in
 * its cache. */
static void check_nothing_left(const sandbox *b) {
    usleep(200000);
    int orphans = count_children(getpid(), "ember-jit-work");
    while (waitpid(-1, NULL, WNOHANG) > 0) {}
    ck_assert_msg(orphans == 0, "%d compile workers outlived their process", orphans);
    ck_assert_msg(count_dir(b->tmp, "ember-kernel-") == 0, "ember-kernel-* files left in TMPDIR");
    nfiles = 0;
    nftw(b->cache, count_files, 16, FTW_PHYS);
    ck_assert_msg(nfiles > 0, "the cache holds nothing: the next run pays again");
}

static void run_jit_child(bool async) {
    sandbox b;
    sandbox_make(&b);
    const char *env[] = {"EMBER_JIT=1", async ? "EMBER_ASYNC_COMPILE=1" : "EMBER_ASYNC_COMPILE=0",
                         b.env_tmp, b.env_cache, "EMBER_CACHE=1", "EMBER_NUM_THREADS=2",
                         "OPENBLAS_NUM_THREADS=1", "EMBER_WORKER_IDLE=30", NULL};
    int st = run_child("jit", env, 0, 150);
    ck_assert_msg(st != -1, "the EMBER_JIT=1 program (async %d) did not finish in 150 s", async);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the EMBER_JIT=1 program (async %d) failed "
                  "(status %#x)", async, st);
    check_nothing_left(&b);
    sandbox_free(&b);
}

START_TEST(jit_programs_are_bounded_and_leave_nothing_behind) {
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    run_jit_child(false);
    run_jit_child(true);
}
END_TEST

/* A fake worker: a shell script body (it gets the records on stdin). */
static void fake_worker_case(const char *body, const char *expect) {
    sandbox b;
    sandbox_make(&b);
    char script[128], log[128];
    snprintf(script, sizeof script, "%s/worker.sh", b.tmp);
    snprintf(log, sizeof log, "%s/log", b.tmp);
    FILE *f = fopen(script, "w");
    ck_assert(f);
    fprintf(f, "#!/bin/sh\n%s\n", body);
    fclose(f);
    chmod(script, 0755);
    setenv("EMBER_JIT_WORKER", script, 1);
    setenv("EMBER_COMPILE_TIMEOUT", "2", 1);
    setenv("EMBER_LOG_FILE", log, 1);
    em_compile_options o = options(-1);
    em_compiled *fc = em_compile(chain_fn, (void *)&(const double){1.5}, &o);
    unsetenv("EMBER_LOG_FILE");
    double t0 = now();
    em_tensor *x = tu_random(4, 2, TU_SIZES(6, 20), EM_F32, 1), *y1, *y2;
    ck_assert_msg(em_call(fc, &x, NULL, &y1) == EM_OK, "%s", em_last_error());
    ck_assert_msg(now() - t0 < 20, "the first call took %.1f s (deadline 2 s)", now() - t0);
    ck_assert_msg(em_call(fc, &x, NULL, &y2) == EM_OK, "%s", em_last_error());
    /* the reference: the same function, eagerly */
    em_tensor *ref;
    ck_assert_int_eq(chain_fn((void *)&(const double){1.5}, &x, NULL, &ref), EM_OK);
    double *r = tu_values(ref);
    tu_check_close(y1, r, 2, TU_SIZES(6, 20), 1e-5, 1e-6);
    tu_check_close(y2, r, 2, TU_SIZES(6, 20), 1e-5, 1e-6);
    free(r);
    em_compiled_free(fc);
    unsetenv("EMBER_COMPILE_TIMEOUT");
    if (getenv("EMBER_TEST_REAL_WORKER")) setenv("EMBER_JIT_WORKER", getenv("EMBER_TEST_REAL_WORKER"), 1);
    else unsetenv("EMBER_JIT_WORKER");
    ck_assert_msg(count_children(getpid(), NULL) == 0, "the fake worker is still running");
    char text[4096] = "";
    f = fopen(log, "r");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    text[n] = '\0';
    ck_assert_msg(strstr(text, expect), "the log does not say '%s': '%s'", expect, text);
    sandbox_free(&b);
}

START_TEST(a_hanging_worker_is_killed_at_its_deadline) {
    fake_worker_case("exec sleep 1000", "did not finish in time");
}
END_TEST

START_TEST(a_worker_that_dies_is_reported) {
    fake_worker_case("kill -9 $$", "was killed by a signal");
}
END_TEST

START_TEST(a_worker_that_answers_garbage_is_reported) {
    /* a worker's input stays open between compiles: it answers after the
     * first record's first bytes, not at end of input */
    fake_worker_case("head -c 8 >/dev/null; echo garbage", "answered garbage");
}
END_TEST

/* A program killed by SIGTERM while its worker hangs: the worker dies
 * with it, and its temporary files go. */
START_TEST(a_killed_program_leaves_no_worker_or_file) {
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    sandbox b;
    sandbox_make(&b);
    char script[128], env_worker[160];
    snprintf(script, sizeof script, "%s/worker.sh", b.cache);
    FILE *f = fopen(script, "w");
    ck_assert(f);
    fprintf(f, "#!/bin/sh\nexec sleep 1000\n");
    fclose(f);
    chmod(script, 0755);
    snprintf(env_worker, sizeof env_worker, "EMBER_JIT_WORKER=%s", script);
    const char *env[] = {b.env_tmp, b.env_cache, env_worker, "EMBER_COMPILE_TIMEOUT=100",
                         "EMBER_NUM_THREADS=2", "OPENBLAS_NUM_THREADS=1", NULL};
    int st = run_child_signal("signal", env, 0, 60, 20);
    unlink(script);
    ck_assert_msg(st != -1, "the program did not die of SIGTERM");
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM, "status %#x", st);
    usleep(300000);
    int left = count_children(getpid(), "sleep");
    if (left) kill_children(getpid(), "sleep"); /* the orphans came to us: ours to end */
    while (waitpid(-1, NULL, WNOHANG) > 0) {}
    ck_assert_msg(left == 0, "%d workers outlived the killed program", left);
    ck_assert_msg(count_dir(b.tmp, "ember-kernel-") == 0, "ember-kernel-* files left in TMPDIR");
    sandbox_free(&b);
}
END_TEST

/* A program under RLIMIT_AS (ulimit -v) finishes, with values or errors,
 * cold and warm (the same cache), at 150, 200 and 250 MB. */
START_TEST(memory_limits_give_errors_not_hangs) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
    return; /* a sanitizer's shadow memory does not fit under RLIMIT_AS */
#endif
    sandbox b;
    sandbox_make(&b);
    const char *env[] = {b.env_tmp, b.env_cache, "EMBER_CACHE=1", "EMBER_NUM_THREADS=2",
                         "OPENBLAS_NUM_THREADS=1", NULL};
    for (long mb = 150; mb <= 250; mb += 50) {
        for (int warm = 0; warm < 2; warm++) {
            int st = run_child("mem", env, mb << 20, 60);
            ck_assert_msg(st != -1, "under a %ld MB limit (%s) the program hung", mb, warm ? "warm" : "cold");
            /* exit 1: wrong values; killed by a signal: it crashed; exit 127: could not start */
            ck_assert_msg(WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 127),
                          "under a %ld MB limit (%s): status %#x", mb, warm ? "warm" : "cold", st);
        }
    }
    sandbox_free(&b);
}
END_TEST

/* Runs the "exit" child three times, cold, with worker setting `worker`;
 * with files_checked, no ember-kernel-* file may be left.  (With workers
 * that exit kills mid-compile, a worker's libgccjit can still create a
 * directory there between the kill and the removal: not checked.) */
static void exit_child_runs(const char *worker, bool files_checked) {
    sandbox b;
    sandbox_make(&b);
    const char *env[] = {b.env_tmp, b.env_cache, "EMBER_CACHE=1", worker, "EMBER_NUM_THREADS=2",
                         "OPENBLAS_NUM_THREADS=1", NULL};
    for (int rep = 0; rep < 3; rep++) {
        int st = run_child("exit", env, 0, 120);
        ck_assert_msg(st != -1, "exit during a compile (%s, run %d) did not finish in 120 s", worker, rep);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                      "exit during a compile (%s, run %d): status %#x", worker, rep, st);
        ck_assert_msg(!files_checked || count_dir(b.tmp, "ember-kernel-") == 0,
                      "ember-kernel-* files left in TMPDIR");
        nftw(b.cache, rm_entry, 16, FTW_DEPTH | FTW_PHYS); /* cold again */
        ck_assert(mkdir(b.cache, 0700) == 0);
    }
    sandbox_free(&b);
}

START_TEST(exit_during_a_background_compile_is_clean) {
    /* Seen: a background job compiling in process (no worker) while exit
     * ran libgccjit's exit-time destructors: use-after-free, SIGSEGV.
     * Without a worker the compile now runs in the calling thread; with
     * workers, exit kills them and waits for the job. */
    exit_child_runs("EMBER_JIT_WORKER=0", true);
    const char *w = getenv("EMBER_TEST_REAL_WORKER");
    if (!w) return; /* no worker built: the first case is the whole test */
    char env[4200];
    ck_assert(snprintf(env, sizeof env, "EMBER_JIT_WORKER=%s", w) < (int)sizeof env);
    exit_child_runs(env, false);
}
END_TEST

/* The same program with OpenBLAS's default thread count (the variables
 * unset, as most users run): each thread of OpenBLAS's pool retries its
 * ~128 MiB buffer allocation forever and OpenBLAS's destructor joins them,
 * so while libember linked OpenBLAS the child hung in its exit (first seen
 * at 150 MB, cold).  A sound child takes 0.3 s cold and 0.03 s warm here;
 * 30 s is the bound of a hang. */
START_TEST(default_openblas_threads_under_memory_limits_do_not_hang) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
    return; /* a sanitizer's shadow memory does not fit under RLIMIT_AS */
#endif
    sandbox b;
    sandbox_make(&b);
    const char *env[] = {b.env_tmp, b.env_cache, "EMBER_CACHE=1", "-OPENBLAS_NUM_THREADS",
                         "-GOTO_NUM_THREADS", "-OMP_NUM_THREADS", NULL};
    for (long mb = 150; mb <= 250; mb += 50) {
        for (int warm = 0; warm < 2; warm++) {
            double t0 = now();
            int st = run_child("mem", env, mb << 20, 30);
            ck_assert_msg(st != -1, "under a %ld MB limit (%s, OpenBLAS's default threads) the program hung",
                          mb, warm ? "warm" : "cold");
            ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                          "under a %ld MB limit (%s): status %#x after %.1f s", mb, warm ? "warm" : "cold",
                          st, now() - t0);
        }
    }
    sandbox_free(&b);
}
END_TEST

static Suite *suite(void) {
    const tu_test tests[] = {
        {"calls_switch_to_the_compiled_entry", calls_switch_to_the_compiled_entry},
        {"compiled_values_equal_the_op_by_op_ones", compiled_values_equal_the_op_by_op_ones},
        {"free_while_compiling_is_safe", free_while_compiling_is_safe},
        {"async_with_dynamic_sizes", async_with_dynamic_sizes},
        {"async_with_reshapes_that_follow_the_batch", async_with_reshapes_that_follow_the_batch},
        {"environment_turns_it_on", environment_turns_it_on},
        {"threads_call_while_it_compiles", threads_call_while_it_compiles},
        {"concurrent_background_compiles_finish", concurrent_background_compiles_finish},
        {"jit_programs_are_bounded_and_leave_nothing_behind", jit_programs_are_bounded_and_leave_nothing_behind},
        {"a_hanging_worker_is_killed_at_its_deadline", a_hanging_worker_is_killed_at_its_deadline},
        {"a_worker_that_dies_is_reported", a_worker_that_dies_is_reported},
        {"a_worker_that_answers_garbage_is_reported", a_worker_that_answers_garbage_is_reported},
        {"memory_limits_give_errors_not_hangs", memory_limits_give_errors_not_hangs},
        {"default_openblas_threads_under_memory_limits_do_not_hang",
         default_openblas_threads_under_memory_limits_do_not_hang},
        {"a_killed_program_leaves_no_worker_or_file", a_killed_program_leaves_no_worker_or_file},
        {"exit_during_a_background_compile_is_clean", exit_during_a_background_compile_is_clean},
    };
    return tu_suite("async", tests, sizeof tests / sizeof tests[0], 180);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--child")) return child_main(argv[2]);
    const char *w = getenv("EMBER_JIT_WORKER");
    if (w) setenv("EMBER_TEST_REAL_WORKER", w, 1);
    setenv("EMBER_CACHE", "0", 1); /* memory only: every kernel really compiles */
    /* the tests count the compile workers a child program leaves behind
     * among this process's children: this process keeps none of its own
     * idle (under CK_FORK=no, as valgrind runs it, every test is in it) */
    setenv("EMBER_WORKER_IDLE", "0", 1);
    return tu_run(suite());
}
