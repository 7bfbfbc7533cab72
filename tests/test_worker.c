/* test_worker.c - the pool of compile workers (src/jit/cpu/worker_pool.c):
 * workers are started once and reused by later compiles, a dead or hung
 * worker is replaced (its kernels failed, its graph op by op), a forked
 * child never uses or kills its parent's workers, and workers die with
 * their process, even one killed by SIGKILL, and idle ones after
 * EMBER_WORKER_IDLE seconds.
 *
 * Counts are deltas of jit_workers_count: under CK_FORK=no (valgrind)
 * every test runs in one process. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "engine.h"
#include "worker.h"

#define ROWS 6
#define COLS 20

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* softmax(x c), summed over rows (an eager step between two kernels),
 * then softmax((a + sum) c): two fused kernels whose constants are c's,
 * so every c compiles kernels of its own. */
static em_status fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)s;
    double c = *(const double *)ctx;
    em_tensor *a = em_softmax(em_mul_scalar(in[0], c), -1);
    em_tensor *b = em_sum(a, 1, (const int[]){0}, true);
    out[0] = em_softmax(em_mul_scalar(em_add(a, b), c), -1);
    return out[0] ? EM_OK : em_last_status();
}

static void softmax_rows(double *v, double c) {
    for (int r = 0; r < ROWS; r++) {
        double *row = v + r * COLS, m = -INFINITY, sum = 0;
        for (int j = 0; j < COLS; j++) m = fmax(m, row[j] * c);
        for (int j = 0; j < COLS; j++) sum += row[j] = exp(row[j] * c - m);
        for (int j = 0; j < COLS; j++) row[j] /= sum;
    }
}

/* fn in float64, from x's values. */
static double *reference(const em_tensor *x, double c) {
    double *v = tu_values(x), b[COLS] = {0};
    softmax_rows(v, c);
    for (int r = 0; r < ROWS; r++)
        for (int j = 0; j < COLS; j++) b[j] += v[r * COLS + j];
    for (int r = 0; r < ROWS; r++)
        for (int j = 0; j < COLS; j++) v[r * COLS + j] += b[j];
    softmax_rows(v, c);
    return v;
}

/* Compiles fn for c, calls it once (checked against float64) and returns
 * its statistics. */
static em_compile_stats compile_and_check(double c) {
    em_compile_options o = {.ninputs = 1, .noutputs = 1, .name = "worker_fn", .async_compile = -1};
    em_compiled *f = em_compile(fn, &c, &o);
    ck_assert_ptr_nonnull(f);
    em_tensor *x = tu_random(7, 2, TU_SIZES(ROWS, COLS), EM_F32, 1), *y;
    ck_assert_msg(em_call(f, &x, NULL, &y) == EM_OK, "%s", em_last_error());
    double *ref = reference(x, c);
    tu_check_close(y, ref, 2, TU_SIZES(ROWS, COLS), 1e-5, 1e-6);
    free(ref);
    em_compile_stats st;
    ck_assert_int_eq(em_compiled_stats(f, &st), EM_OK);
    em_compiled_free(f);
    return st;
}

static long started(void) {
    long n = -1;
    jit_workers_count(&n, NULL);
    return n;
}

static int idle(void) {
    int n = -1;
    jit_workers_count(NULL, &n);
    return n;
}

/* Whether pid is running (not gone, not a zombie). */
static bool running(pid_t pid) {
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return n > 0 && p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

static bool contains(const int *v, int n, int x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return true;
    return false;
}

/* ---- a fresh kernel cache per test, and the worker make check built ---- */

static char cache_dir[64];
static char *real_worker;

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

static void setup(void) {
    tu_setup();
    strcpy(cache_dir, "/tmp/ember-worker-test-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(cache_dir));
    setenv("EMBER_CACHE_DIR", cache_dir, 1);
    setenv("EMBER_CACHE", "1", 1);
    const char *w = getenv("EMBER_JIT_WORKER");
    real_worker = w && *w && strcmp(w, "0") ? strdup(w) : NULL;
}

static void teardown(void) {
    if (real_worker) setenv("EMBER_JIT_WORKER", real_worker, 1);
    free(real_worker);
    real_worker = NULL;
    unsetenv("EMBER_COMPILE_TIMEOUT");
    unsetenv("EMBER_LOG_FILE");
    unsetenv("EMBER_WORKER_IDLE");
    nftw(cache_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    tu_teardown();
}

#define NEED_WORKER()                                                                  \
    do {                                                                               \
        if (!real_worker) {                                                            \
            fprintf(stderr, "SKIP %s: no EMBER_JIT_WORKER (run under make check)\n", __func__); \
            return;                                                                    \
        }                                                                              \
    } while (0)

/* ---- the tests ---- */

/* Two cold compiles in one process: the second starts no worker, and its
 * kernels compile in the very processes the first started. */
START_TEST(a_second_compile_reuses_the_workers) {
    NEED_WORKER();
    long s0 = started();
    em_compile_stats a = compile_and_check(1.5);
    ck_assert_int_eq(a.kernels_compiled, 2);
    long s1 = started();
    int want = em_num_threads() < 2 ? 1 : 2; /* one per kernel, at most one per thread */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < want) want = (int)cores;
    ck_assert_int_eq(s1 - s0, want);
    int before[64], nb = jit_workers_idle_pids(before, 64);
    ck_assert_int_ge(nb, want);
    em_compile_stats b = compile_and_check(2.5);
    ck_assert_int_eq(b.kernels_compiled, 2);
    ck_assert_int_eq(started(), s1); /* no new process */
    int after[64], na = jit_workers_idle_pids(after, 64);
    ck_assert_int_eq(na, nb);
    for (int i = 0; i < na; i++) {
        ck_assert_msg(contains(before, nb, after[i]), "worker %d is new", after[i]);
        ck_assert(running(after[i]));
    }
}
END_TEST

/* Idle workers killed behind the pool's back: the next compile notices,
 * reaps them and starts as many new ones; its kernels still compile.
 * Compiling at once after the kill (wait false) races with the deaths: a
 * worker still dying when taken gets its kernel and dies before
 * answering, and that kernel must go to a new worker, not fail. */
static void dead_idle_workers_are_replaced(bool wait, double c) {
    compile_and_check(c);
    int pids[64], n = jit_workers_idle_pids(pids, 64);
    ck_assert_int_ge(n, 1);
    long s1 = started();
    for (int i = 0; i < n; i++) ck_assert_int_eq(kill(pids[i], SIGKILL), 0);
    for (int i = 0; wait && i < n; i++) /* zombies until the pool reaps them */
        for (double end = now() + 5; running(pids[i]) && now() < end;) usleep(1000);
    em_compile_stats st = compile_and_check(c + 1);
    ck_assert_int_eq(st.kernels_compiled, 2);
    ck_assert_int_eq(started() - s1, n);
    int after[64], na = jit_workers_idle_pids(after, 64);
    ck_assert_int_eq(na, n);
    for (int i = 0; i < n; i++) {
        ck_assert_msg(!contains(after, na, pids[i]), "dead worker %d is still in the pool", pids[i]);
        errno = 0;
        ck_assert_msg(kill(pids[i], 0) != 0 && errno == ESRCH, "dead worker %d was not reaped", pids[i]);
    }
}

START_TEST(a_dead_idle_worker_is_replaced) {
    NEED_WORKER();
    dead_idle_workers_are_replaced(true, 3.5);
    for (int r = 0; r < 5; r++) dead_idle_workers_are_replaced(false, 20.5 + 2 * r);
}
END_TEST

/* A worker that never answers: killed at its deadline, its kernels
 * failed (the graph runs op by op: right values, nothing compiled), the
 * failure logged; it is not kept, and the next compile (the real worker
 * again) starts a fresh process and compiles. */
START_TEST(a_hung_worker_is_killed_and_replaced) {
    NEED_WORKER();
    char dir[] = "/tmp/ember-worker-hang-XXXXXX", script[128], log[128];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(script, sizeof script, "%s/worker.sh", dir);
    snprintf(log, sizeof log, "%s/log", dir);
    FILE *f = fopen(script, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "#!/bin/sh\nexec sleep 1000\n");
    fclose(f);
    chmod(script, 0755);
    setenv("EMBER_JIT_WORKER", script, 1);
    setenv("EMBER_COMPILE_TIMEOUT", "1", 1);
    setenv("EMBER_LOG_FILE", log, 1);
    long s0 = started();
    double t0 = now();
    em_compile_stats st = compile_and_check(5.5);
    double took = now() - t0;
    ck_assert_int_eq(st.kernels_compiled, 0);
    ck_assert_msg(took > 0.9 && took < 10, "the first call took %.1f s (deadline 1 s)", took);
    long hung = started() - s0;
    ck_assert_int_ge(hung, 1);
    ck_assert_int_eq(idle(), 0); /* the real workers were of another kind, the fake ones killed */
    char text[4096] = "";
    f = fopen(log, "r");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    text[n] = '\0';
    ck_assert_msg(strstr(text, "did not finish in time"), "the log says: '%s'", text);
    unsetenv("EMBER_LOG_FILE");
    unsetenv("EMBER_COMPILE_TIMEOUT");
    setenv("EMBER_JIT_WORKER", real_worker, 1);
    st = compile_and_check(6.5);
    ck_assert_int_eq(st.kernels_compiled, 2);
    ck_assert_int_ge(started() - s0, hung + 1);
    ck_assert_int_ge(idle(), 1);
    unlink(script);
    unlink(log);
    rmdir(dir);
}
END_TEST

/* A child forked while the parent has idle workers: it sees none of
 * them, compiles in workers of its own, and its exit kills only those;
 * the parent's are still there, and its next compile reuses them. */
START_TEST(a_forked_child_uses_workers_of_its_own) {
    NEED_WORKER();
    compile_and_check(7.5);
    int mine[64], nm = jit_workers_idle_pids(mine, 64);
    ck_assert_int_ge(nm, 1);
    long s1 = started();
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        int code = 0;
        long s;
        int nidle = -1;
        jit_workers_count(&s, &nidle);
        if (s != 0 || nidle != 0) code = 10; /* the parent's workers are not the child's */
        if (!code && compile_and_check(8.5).kernels_compiled != 2) code = 11;
        int theirs[64], nt = jit_workers_idle_pids(theirs, 64);
        jit_workers_count(&s, NULL);
        if (!code && (nt < 1 || s != nt)) code = 12;
        for (int i = 0; !code && i < nt; i++)
            if (contains(mine, nm, theirs[i])) code = 13;
        if (write(fds[1], &nt, sizeof nt) != sizeof nt || write(fds[1], theirs, sizeof(int) * (size_t)nt) < 0)
            code = 14;
        exit(code); /* atexit: kills the child's workers */
    }
    close(fds[1]);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %#x", st);
    int nt = 0, theirs[64];
    ck_assert_int_eq(read(fds[0], &nt, sizeof nt), sizeof nt);
    ck_assert_int_eq(read(fds[0], theirs, sizeof(int) * (size_t)nt), (ssize_t)(sizeof(int) * (size_t)nt));
    close(fds[0]);
    for (int i = 0; i < nt; i++) /* its workers were its children: gone with it */
        for (double end = now() + 5; running(theirs[i]) && now() < end;) usleep(1000);
    for (int i = 0; i < nt; i++) ck_assert_msg(!running(theirs[i]), "the child's worker %d outlived it", theirs[i]);
    for (int i = 0; i < nm; i++) ck_assert_msg(running(mine[i]), "the child killed the parent's worker %d", mine[i]);
    ck_assert_int_eq(idle(), nm);
    ck_assert_int_eq(compile_and_check(9.5).kernels_compiled, 2);
    ck_assert_int_eq(started(), s1);
}
END_TEST

/* A process that compiled, then exits (exit) or is killed (SIGKILL):
 * either way its idle workers end within seconds (on SIGKILL the workers
 * see their input's writer gone).  We are the subreaper: the orphans
 * come to us. */
static void workers_die_with(bool killed) {
    ck_assert_int_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        int code = compile_and_check(killed ? 10.5 : 11.5).kernels_compiled == 2 ? 0 : 20;
        int pids[64], n = jit_workers_idle_pids(pids, 64);
        if (write(fds[1], &n, sizeof n) != sizeof n || write(fds[1], pids, sizeof(int) * (size_t)n) < 0)
            code = 21;
        if (killed) raise(SIGKILL);
        exit(code);
    }
    close(fds[1]);
    int n = 0, pids[64];
    ck_assert_int_eq(read(fds[0], &n, sizeof n), sizeof n);
    ck_assert_int_ge(n, 1);
    ck_assert_int_eq(read(fds[0], pids, sizeof(int) * (size_t)n), (ssize_t)(sizeof(int) * (size_t)n));
    close(fds[0]);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    if (killed) ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    else ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %#x", st);
    for (int i = 0; i < n; i++) {
        double end = now() + 5;
        while (running(pids[i]) && now() < end) usleep(1000);
        ck_assert_msg(!running(pids[i]), "worker %d outlived its process (%s)", pids[i],
                      killed ? "SIGKILL" : "exit");
        waitpid(pids[i], NULL, WNOHANG); /* an orphan of ours now */
    }
    prctl(PR_SET_CHILD_SUBREAPER, 0);
}

START_TEST(workers_end_when_their_process_exits) {
    NEED_WORKER();
    workers_die_with(false);
}
END_TEST

START_TEST(workers_end_when_their_process_is_killed) {
    NEED_WORKER();
    workers_die_with(true);
}
END_TEST

/* EMBER_WORKER_IDLE: idle workers are ended (and reaped) once kept that
 * long, so a program that compiled once does not hold them; the next
 * compile starts new ones.  0 keeps none. */
START_TEST(idle_workers_end_after_their_keep_time) {
    NEED_WORKER();
    setenv("EMBER_WORKER_IDLE", "0.5", 1);
    compile_and_check(12.5);
    int pids[64], n = jit_workers_idle_pids(pids, 64);
    ck_assert_int_ge(n, 1);
    long s1 = started();
    for (double end = now() + 10; idle() > 0 && now() < end;) usleep(10000);
    ck_assert_int_eq(idle(), 0);
    for (int i = 0; i < n; i++) { /* popped, then killed and reaped */
        for (double end = now() + 5; kill(pids[i], 0) == 0 && now() < end;) usleep(1000);
        errno = 0;
        ck_assert_msg(kill(pids[i], 0) != 0 && errno == ESRCH, "expired worker %d was not reaped", pids[i]);
    }
    ck_assert_int_eq(compile_and_check(13.5).kernels_compiled, 2);
    ck_assert_int_eq(started() - s1, idle()); /* all new */
    ck_assert_int_ge(idle(), 1);
    setenv("EMBER_WORKER_IDLE", "0", 1);
    ck_assert_int_eq(compile_and_check(14.5).kernels_compiled, 2);
    ck_assert_int_eq(idle(), 0);
}
END_TEST

/* Two processes compiling the same graph at the same moment on one cache
 * directory: each kernel is compiled once between them (the second waits
 * for the first's claim and loads its kernels), and both get the values. */
START_TEST(two_processes_compile_each_kernel_once) {
    NEED_WORKER();
    int go[2], res[2];
    ck_assert_int_eq(pipe(go), 0);
    ck_assert_int_eq(pipe(res), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        char b;
        if (read(go[0], &b, 1) != 1) _exit(2);
        int64_t n = compile_and_check(3.5).kernels_compiled;
        _exit(write(res[1], &n, sizeof n) == (ssize_t)sizeof n ? 0 : 2);
    }
    ck_assert_int_eq(write(go[1], "x", 1), 1);
    int64_t here = compile_and_check(3.5).kernels_compiled, there = -1;
    ck_assert_int_eq(read(res[0], &there, sizeof there), (ssize_t)sizeof there);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ck_assert_msg(here + there == 2, "compiled %lld here and %lld in the other process",
                  (long long)here, (long long)there);
    for (int i = 0; i < 2; i++) close(go[i]), close(res[i]);
}
END_TEST

/* y = x * c + c over a size parameter: a kernel of its own for each c. */
static k_kernel *affine_kernel(double c) {
    k_kernel *k = kir_new("k");
    int x = kir_buf(k, EM_F32), y = kir_buf(k, EM_F32), n = kir_size(k);
    int i = kir_range(k, n, K_PARALLEL);
    int cc = kir_const_f(k, EM_F32, c);
    kir_store(k, y, i, kir_alu(k, KA_ADD, kir_alu(k, KA_MUL, kir_load(k, x, i), cc, -1), cc, -1));
    kir_end(k);
    return k;
}

/* Nine kernels on two workers go in compile units (several kernels a
 * worker's record); one of them the compiler rejects: its unit is sent
 * again kernel by kernel, so only that one is left to the caller
 * (JIT_WORKER_RETRY) and every other is written, loadable by its key from
 * its own path, and computes its own function. */
START_TEST(units_split_when_a_kernel_fails) {
    NEED_WORKER();
    enum { N = 9, BAD = 4 };
    k_kernel *ks[N];
    char *paths[N];
    for (int i = 0; i < N; i++) {
        if (i == BAD) {
            ks[i] = kir_new("k");
            kir_range(ks[i], kir_const_i(ks[i], EM_I64, 4), 0); /* never ended: the worker's verify fails */
        } else {
            ks[i] = affine_kernel(0.5 + i);
        }
        paths[i] = malloc(4096);
        ck_assert(jit_worker_temp_path(paths[i], 4096));
    }
    /* the worker's message about the bad kernel goes to EMBER_LOG=code,
     * not to the program's stderr (here a file, to be read after) */
    char *logtext = NULL;
    size_t loglen = 0;
    jit_log lg = {.flags = JIT_LOG_CODE, .f = open_memstream(&logtext, &loglen)};
    ck_assert_ptr_nonnull(lg.f);
    char errpath[] = "/tmp/ember-worker-stderr-XXXXXX";
    int errfd = mkstemp(errpath), saved = dup(2);
    ck_assert(errfd >= 0 && saved >= 0);
    fflush(stderr);
    dup2(errfd, 2);
    jit_workers *w = jit_workers_start(ks, (const char *const *)paths, N, 2, &lg);
    ck_assert_ptr_nonnull(w);
    jit_worker_result res[N];
    jit_workers_finish(w, res);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char said[4096];
    ssize_t got = pread(errfd, said, sizeof said - 1, 0);
    said[got > 0 ? got : 0] = '\0';
    close(errfd);
    unlink(errpath);
    fclose(lg.f);
    ck_assert_msg(strstr(said, "ember-jit-worker") == NULL, "the worker wrote on our stderr: %s", said);
    ck_assert_msg(strstr(logtext, "failed a unit of") && strstr(logtext, "ember-jit-worker:"),
                  "the log says: %s", logtext);
    free(logtext);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(res[i], i == BAD ? JIT_WORKER_RETRY : JIT_WORKER_DONE);
        if (i == BAD) continue;
        kc_key key;
        ck_assert(jit_cpu_kernel_key(ks[i], &key, NULL));
        int fd = open(paths[i], O_RDONLY);
        ck_assert_int_ge(fd, 0);
        jit_cpu_kernel *ck = NULL;
        ck_assert_msg(jit_cpu_load_fd(fd, &key, &ck) == EM_OK, "kernel %d: %s", i, em_last_error());
        close(fd);
        float x[13], y[13];
        for (int j = 0; j < 13; j++) x[j] = (float)(j - 6) * 0.25f;
        void *bufs[2] = {x, y};
        int64_t n = 13;
        ck_assert_int_eq(jit_cpu_run(ck, bufs, &n), EM_OK);
        for (int j = 0; j < 13; j++) {
            double c = (float)(0.5 + i);
            ck_assert_msg(fabs(y[j] - ((double)x[j] * c + c)) <= 1e-6 * (1 + fabs(c)), "kernel %d [%d]", i, j);
        }
        jit_cpu_free(ck);
    }
    /* the units held several kernels: some kernel's object also holds
     * another kernel, found there by that one's key */
    int shared = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            if (i == j || i == BAD || j == BAD) continue;
            kc_key key;
            ck_assert(jit_cpu_kernel_key(ks[j], &key, NULL));
            int fd = open(paths[i], O_RDONLY);
            jit_cpu_kernel *ck = NULL;
            if (jit_cpu_load_fd(fd, &key, &ck) == EM_OK) shared++;
            em_clear_error();
            jit_cpu_free(ck);
            close(fd);
        }
    ck_assert_msg(shared >= 2, "no object held two kernels (%d pairs)", shared);
    for (int i = 0; i < N; i++) {
        unlink(paths[i]);
        free(paths[i]);
        kir_free(ks[i]);
    }
}
END_TEST

int main(void) {
    const tu_test tests[] = {
        {"a_second_compile_reuses_the_workers", a_second_compile_reuses_the_workers},
        {"a_dead_idle_worker_is_replaced", a_dead_idle_worker_is_replaced},
        {"a_hung_worker_is_killed_and_replaced", a_hung_worker_is_killed_and_replaced},
        {"a_forked_child_uses_workers_of_its_own", a_forked_child_uses_workers_of_its_own},
        {"workers_end_when_their_process_exits", workers_end_when_their_process_exits},
        {"workers_end_when_their_process_is_killed", workers_end_when_their_process_is_killed},
        {"idle_workers_end_after_their_keep_time", idle_workers_end_after_their_keep_time},
        {"two_processes_compile_each_kernel_once", two_processes_compile_each_kernel_once},
        {"units_split_when_a_kernel_fails", units_split_when_a_kernel_fails},
    };
    /* tu_suite's cases, each with a fresh kernel cache around testutil's scope */
    Suite *s = suite_create("worker");
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        TCase *tc = tcase_create(tests[i].name);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, tests[i].test);
        suite_add_tcase(s, tc);
    }
    return tu_run(s);
}
