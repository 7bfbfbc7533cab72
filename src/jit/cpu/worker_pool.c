/* worker_pool.c - running ember-jit-worker processes.
 *
 * A worker is spawned with posix_spawn (never fork: the parent may have
 * threads holding locks, libgccjit's among them), fed its kernels on a
 * pipe (stdin) and answers one '+' per shared object written on another
 * (stdout), whose end of file says it exited.  Where the program lives:
 * EMBER_JIT_WORKER, else the installed one (EMBER_WORKER_PATH, set by the
 * build).
 *
 * Nothing here waits without a deadline: a worker that has not answered
 * within EMBER_COMPILE_TIMEOUT seconds is killed, and so is one that
 * answers garbage; its kernels are then reported failed (not to be
 * compiled in process: what hung or crashed a worker would hang or crash
 * the program), and the graph runs op by op.
 *
 * Process-wide state (the one place outside the compile queue): how many
 * workers run (at most one per core, whatever the number of threads that
 * compile), their pids and the private temporary directory, so that exit
 * can kill the first and remove the second. */
#include "worker.h"

#include <stdio.h>

#include "cpu_gccjit.h"
#include "engine.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define MAGIC "EMKIR01"
#define DEFAULT_TIMEOUT 120.0 /* seconds: a kernel compiles in 20-40 ms */
#define MAX_LIVE 256          /* workers tracked for the exit cleanup */

bool jit_worker_write(FILE *f, const k_kernel *k, const char *path) {
    uint32_t hdr[5] = {(uint32_t)sizeof(k_inst), (uint32_t)strlen(k->name), (uint32_t)k->n,
                       (uint32_t)k->nbufs, (uint32_t)k->nsizes};
    uint32_t plen = (uint32_t)strlen(path);
    return fwrite(MAGIC, 1, 8, f) == 8 && fwrite(hdr, sizeof hdr, 1, f) == 1 &&
           fwrite(k->name, 1, hdr[1], f) == hdr[1] &&
           fwrite(k->insts, sizeof(k_inst), (size_t)k->n, f) == (size_t)k->n &&
           fwrite(&plen, sizeof plen, 1, f) == 1 && fwrite(path, 1, plen, f) == plen &&
           fflush(f) == 0;
}

static k_kernel *malformed(k_kernel *k) {
    kir_free(k);
    em_error(EM_ERR_ARG, "malformed kernel on the worker's input");
    return NULL;
}

k_kernel *jit_worker_read(FILE *f, char *path, size_t pathlen) {
    char magic[8];
    uint32_t hdr[5], plen;
    char name[256];
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, MAGIC, 8) || fread(hdr, sizeof hdr, 1, f) != 1 ||
        hdr[0] != sizeof(k_inst) || hdr[1] >= sizeof name || hdr[2] > (1u << 24) ||
        fread(name, 1, hdr[1], f) != hdr[1])
        return malformed(NULL);
    name[hdr[1]] = '\0';
    k_kernel *k = kir_new(name);
    if (!k) return NULL;
    k->insts = em_malloc(sizeof(k_inst) * (hdr[2] ? hdr[2] : 1));
    if (!k->insts) { /* out of memory is not a malformed input: say so */
        kir_free(k);
        return NULL;
    }
    if (fread(k->insts, sizeof(k_inst), hdr[2], f) != hdr[2] ||
        fread(&plen, sizeof plen, 1, f) != 1 || plen >= pathlen || fread(path, 1, plen, f) != plen)
        return malformed(k);
    path[plen] = '\0';
    k->n = k->cap = (int)hdr[2];
    k->nbufs = (int)hdr[3];
    k->nsizes = (int)hdr[4];
    /* the generator verifies the IR before it trusts it */
    return k;
}

/* ---- process-wide state ---- */

static struct {
    pthread_mutex_t m;
    pthread_cond_t freed;  /* a worker slot was given back */
    int busy;              /* workers running now */
    pid_t live[MAX_LIVE];  /* their pids (0: a free slot), for the exit cleanup */
    char dir[EM_ENV_MAX];  /* private temporary directory ("" until made) */
    pid_t owner;           /* the process dir and live belong to: a forked
                              child must not kill its parent's workers */
    bool registered;       /* the exit cleanup is registered */
    bool shutdown;         /* exiting: no new worker, no new temporary file */
} wp = {.m = PTHREAD_MUTEX_INITIALIZER, .freed = PTHREAD_COND_INITIALIZER};

static int dir_fd = -1; /* the private directory, open for the signal handler */

static void exit_cleanup(void) { jit_workers_shutdown(); }

/* fork while another thread holds wp.m: the child's copy must be free */
static void before_fork(void) { pthread_mutex_lock(&wp.m); }
static void after_fork(void) { pthread_mutex_unlock(&wp.m); }

/* Forgets a parent's state in a forked child (under wp.m). */
static void adopt_process(void) {
    if (wp.owner == getpid()) return;
    wp.owner = getpid();
    wp.busy = 0;
    memset(wp.live, 0, sizeof wp.live);
    wp.dir[0] = '\0';
    if (dir_fd >= 0) close(dir_fd); /* the parent's directory */
    dir_fd = -1;
    if (!wp.registered) { /* once per process image (a forked child inherits them) */
        wp.registered = true;
        atexit(exit_cleanup);
        pthread_atfork(before_fork, after_fork, after_fork);
    }
}

/* At most one worker per core: the processes of every thread that
 * compiles (the compile queue's, the program's own) share them. */
static int max_workers(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MAX_LIVE ? MAX_LIVE : (int)n;
}

/* Takes up to want worker slots, waiting for one when all are busy (they
 * are given back within the deadline); 0 when exiting. */
static int slots_take(int want) {
    pthread_mutex_lock(&wp.m);
    adopt_process();
    int max = max_workers();
    while (!wp.shutdown && wp.busy >= max) pthread_cond_wait(&wp.freed, &wp.m);
    int got = wp.shutdown ? 0 : max - wp.busy < want ? max - wp.busy : want;
    wp.busy += got;
    pthread_mutex_unlock(&wp.m);
    return got;
}

static void slots_give(int n) {
    pthread_mutex_lock(&wp.m);
    wp.busy -= n;
    pthread_cond_broadcast(&wp.freed);
    pthread_mutex_unlock(&wp.m);
}

/* Records (pid > 0) or forgets (-pid) a live worker. */
static void live_set(pid_t pid, bool add) {
    pthread_mutex_lock(&wp.m);
    for (int i = 0; i < MAX_LIVE; i++)
        if (wp.live[i] == (add ? 0 : pid)) {
            wp.live[i] = add ? pid : 0;
            break;
        }
    pthread_mutex_unlock(&wp.m);
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)ftw;
    if (flag == FTW_DP) rmdir(path);
    else unlink(path);
    return 0;
}

/* Whether process pid is gone or a zombie (it can write no more files). */
static bool is_dead(pid_t pid) {
    if (kill(pid, 0) != 0) return true;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0) close(fd);
    if (n <= 0) return true;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold spaces */
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

void jit_workers_shutdown(void) {
    pthread_mutex_lock(&wp.m);
    if (wp.owner == getpid()) {
        wp.shutdown = true;
        for (int i = 0; i < MAX_LIVE; i++)
            if (wp.live[i] > 0) kill(wp.live[i], SIGKILL); /* their waiters reap them */
        /* SIGKILL is delivered asynchronously: a worker in the middle of a
         * write could still create a file in the directory after it is
         * emptied, and it would stay behind.  Wait (a bounded 2 s) until
         * every killed worker is dead. */
        for (int i = 0; i < MAX_LIVE; i++)
            for (int t = 0; wp.live[i] > 0 && t < 2000 && !is_dead(wp.live[i]); t++) usleep(1000);
        if (wp.dir[0]) nftw(wp.dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
        wp.dir[0] = '\0';
        if (dir_fd >= 0) close(dir_fd);
        dir_fd = -1;
        pthread_cond_broadcast(&wp.freed);
    }
    pthread_mutex_unlock(&wp.m);
}

/* ---- fatal signals ---- */

static const int fatal_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

/* Removes the entries of the directory open as fd, and their entries one
 * level down (a worker's libgccjit-* directories), with async-signal-safe
 * calls only. */
static void remove_under(int fd, int depth) {
    char buf[4096];
    long n;
    lseek(fd, 0, SEEK_SET);
    /* bounded: an entry that cannot be removed is met again on every pass */
    for (int pass = 0; pass < 64 && (n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0; pass++) {
        for (long off = 0; off < n;) {
            struct dirent64 *d = (struct dirent64 *)(buf + off);
            off += d->d_reclen;
            if (d->d_name[0] == '.' && (!d->d_name[1] || (d->d_name[1] == '.' && !d->d_name[2])))
                continue;
            if (unlinkat(fd, d->d_name, 0) == 0 || depth == 0) continue;
            int sub = openat(fd, d->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0) {
                remove_under(sub, depth - 1);
                close(sub);
                unlinkat(fd, d->d_name, AT_REMOVEDIR);
            }
        }
        lseek(fd, 0, SEEK_SET); /* entries were removed: read again from the start */
        if (n < (long)sizeof buf / 2) break;
    }
}

/* A fatal signal the program does not handle itself: kill the workers,
 * remove the private directory, then die of the signal as before. */
static void on_fatal_signal(int sig) {
    if (wp.owner == getpid()) {
        for (int i = 0; i < MAX_LIVE; i++)
            if (wp.live[i] > 0) kill(wp.live[i], SIGKILL);
        if (dir_fd >= 0) {
            remove_under(dir_fd, 2);
            rmdir(wp.dir);
        }
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Only where the disposition is the default: a program's own handler (or
 * SIG_IGN) is left alone. */
static void catch_fatal_signals(void) {
    for (size_t i = 0; i < sizeof fatal_signals / sizeof *fatal_signals; i++) {
        struct sigaction old, sa = {.sa_handler = on_fatal_signal, .sa_flags = SA_RESETHAND};
        sigemptyset(&sa.sa_mask);
        if (sigaction(fatal_signals[i], NULL, &old) == 0 && old.sa_handler == SIG_DFL &&
            !(old.sa_flags & SA_SIGINFO))
            sigaction(fatal_signals[i], &sa, NULL);
    }
}

/* The private directory, made on first use (under wp.m): every kernel
 * file and every worker's own temporary files (libgccjit's) go there, so
 * that one removal at exit leaves nothing behind, whoever died how. */
static bool private_dir(void) {
    if (wp.dir[0]) return true;
    char buf[EM_ENV_MAX];
    const char *tmp = em_getenv("TMPDIR", buf, sizeof buf);
    int n = snprintf(wp.dir, sizeof wp.dir, "%s/ember-kernel-%d-XXXXXX", tmp && *tmp ? tmp : "/tmp",
                     (int)getpid());
    if (n < 0 || (size_t)n >= sizeof wp.dir || !mkdtemp(wp.dir)) {
        wp.dir[0] = '\0';
        return false;
    }
    dir_fd = open(wp.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    catch_fatal_signals();
    return true;
}

bool jit_worker_temp_path(char *buf, size_t n) {
    pthread_mutex_lock(&wp.m);
    adopt_process();
    bool ok = !wp.shutdown && private_dir() &&
              (size_t)snprintf(buf, n, "%s/k-XXXXXX", wp.dir) < n;
    pthread_mutex_unlock(&wp.m);
    int fd = ok ? mkostemp(buf, O_CLOEXEC) : -1;
    if (fd < 0) return false;
    close(fd);
    return true;
}

/* ---- settings ---- */

/* EMBER_COMPILE_TIMEOUT: the seconds a worker may take for its kernels. */
static double worker_timeout(const jit_log *log) {
    char buf[64];
    const char *e = em_getenv("EMBER_COMPILE_TIMEOUT", buf, sizeof buf);
    if (!e || !*e) return DEFAULT_TIMEOUT;
    char *end;
    double v = strtod(e, &end);
    if (*end || !(v > 0) || v > 1e6) {
        if (log) jit_logf(log, 0, "EMBER_COMPILE_TIMEOUT=%s is not a number of seconds: using %g", e,
                          DEFAULT_TIMEOUT);
        return DEFAULT_TIMEOUT;
    }
    return v;
}

/* EMBER_JIT_WORKER, else the installed worker, else the one in the build
 * tree (programs run uninstalled, such as the demo, compile in workers
 * too: docs/env.md says why that matters). */
static const char *worker_program(char *buf, size_t n) {
    const char *e = em_getenv("EMBER_JIT_WORKER", buf, n);
    if (e) return *e && strcmp(e, "0") ? e : NULL;
#ifdef EMBER_WORKER_PATH
    if (access(EMBER_WORKER_PATH, X_OK) == 0) return EMBER_WORKER_PATH;
#endif
#ifdef EMBER_BUILD_WORKER_PATH
    if (access(EMBER_BUILD_WORKER_PATH, X_OK) == 0) return EMBER_BUILD_WORKER_PATH;
#endif
    return NULL;
}

bool jit_workers_available(void) {
    char buf[EM_ENV_MAX];
    return worker_program(buf, sizeof buf) != NULL;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- one worker ---- */

typedef struct worker {
    pid_t pid;          /* -1: not started */
    int in, out;        /* our ends of its stdin and stdout, or -1 */
    char *buf;          /* its records, serialized */
    size_t len, sent;
    int first, count;   /* its items: first, first + step, ... (count of them) */
    int answered;       /* '+' read so far */
    bool garbage;       /* it wrote something else */
    int err;            /* why it could not start (errno) */
} worker;

/* The worker's records in memory, so that they can be written with
 * write(2) and a deadline (a FILE retries nothing: a write interrupted by
 * a signal of the program's, or a worker that stops reading, was a
 * truncated record, "malformed kernel on the worker's input"). */
static bool serialize(worker *w, k_kernel *const *ks, const char *const *paths, int n, int step) {
    FILE *f = open_memstream(&w->buf, &w->len);
    if (!f) return false;
    bool ok = true;
    for (int i = w->first; ok && i < n; i += step) {
        ok = jit_worker_write(f, ks[i], paths[i]);
        w->count++;
    }
    ok = fclose(f) == 0 && ok;
    return ok;
}

/* The environment of a worker: ours, with the CPU level it must generate
 * for, its parent (it dies with us), and TMPDIR our private directory. */
static char **worker_env(char *march, char *parent, char *tmpdir) {
    int nenv = 0;
    while (environ[nenv]) nenv++;
    char **env = em_malloc(sizeof(char *) * (size_t)(nenv + 5));
    if (!env) return NULL;
    int k = 0;
    for (int i = 0; i < nenv; i++)
        if (strncmp(environ[i], "EMBER_JIT_MARCH=", 16) && strncmp(environ[i], "EMBER_JIT_PARENT=", 17) &&
            strncmp(environ[i], "TMPDIR=", 7) && strncmp(environ[i], "OPENBLAS_NUM_THREADS=", 21))
            env[k++] = environ[i];
    env[k++] = (char *)"OPENBLAS_NUM_THREADS=1"; /* it never multiplies: no BLAS threads */
    env[k++] = march;
    env[k++] = parent;
    if (tmpdir[7]) env[k++] = tmpdir;
    env[k] = NULL;
    return env;
}

/* posix_spawn of prog with stdin from in_r, stdout to out_w. */
static pid_t spawn_process(const char *prog, int in_r, int out_w) {
    char march[64], parent[64], tmpdir[EM_ENV_MAX + 8];
    snprintf(march, sizeof march, "EMBER_JIT_MARCH=%s", jit_cpu_march());
    snprintf(parent, sizeof parent, "EMBER_JIT_PARENT=%d", (int)getpid());
    pthread_mutex_lock(&wp.m);
    snprintf(tmpdir, sizeof tmpdir, "TMPDIR=%s", wp.dir);
    pthread_mutex_unlock(&wp.m);
    posix_spawn_file_actions_t fa;
    if (posix_spawn_file_actions_init(&fa) != 0) return -1;
    pid_t pid = -1;
    int rc = ENOMEM;
    char *argv[] = {(char *)prog, NULL};
    if (posix_spawn_file_actions_adddup2(&fa, in_r, 0) == 0 &&
        posix_spawn_file_actions_adddup2(&fa, out_w, 1) == 0) {
        em_env_lock(false); /* environ must not move while it is copied (env.c) */
        char **env = worker_env(march, parent, tmpdir);
        rc = env ? posix_spawn(&pid, prog, &fa, NULL, argv, env) : ENOMEM;
        em_env_unlock();
        em_free(env);
    }
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) pid = -1;
    errno = rc;
    return pid;
}

/* Moves fd to 3 or above, keeping close-on-exec: a pipe end that landed on
 * 0 or 1 (the program closed them) would be clobbered by the other dup2. */
static int high_fd(int fd) {
    if (fd > 2) return fd;
    int h = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    close(fd);
    return h;
}

/* Starts worker w; false (w->pid -1) when it could not (no memory, no
 * pipes, no process): its items then compile in process. */
static bool worker_start(worker *w, const char *prog) {
    int in[2] = {-1, -1}, out[2] = {-1, -1};
    /* close-on-exec: a worker spawned meanwhile by another thread must not
     * inherit these pipes, or it would hold this one's input open */
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) goto fail;
    for (int i = 0; i < 2; i++)
        if ((in[i] = high_fd(in[i])) < 0 || (out[i] = high_fd(out[i])) < 0) goto fail;
    w->pid = spawn_process(prog, in[0], out[1]);
    if (w->pid < 0) goto fail;
    live_set(w->pid, true);
    close(in[0]);
    close(out[1]);
    w->in = in[1];
    w->out = out[0];
    fcntl(w->in, F_SETFL, O_NONBLOCK); /* written only when poll says it takes bytes */
    return true;
fail:
    w->err = errno ? errno : ENOMEM;
    for (int i = 0; i < 2; i++) {
        if (in[i] >= 0) close(in[i]);
        if (out[i] >= 0) close(out[i]);
    }
    w->pid = -1;
    return false;
}

/* Writes what w still has to write; closes its input when done or when
 * the worker no longer reads. */
static void worker_send(worker *w) {
    while (w->sent < w->len) {
        ssize_t r = write(w->in, w->buf + w->sent, w->len - w->sent);
        if (r > 0) w->sent += (size_t)r;
        else if (r < 0 && errno == EINTR) continue;
        else if (r < 0 && errno == EAGAIN) return;
        else break; /* EPIPE: it died; its answers will say so */
    }
    close(w->in);
    w->in = -1;
}

/* Reads w's answers; closes its output at end of file. */
static void worker_receive(worker *w) {
    char buf[64];
    ssize_t r;
    while ((r = read(w->out, buf, sizeof buf)) < 0 && errno == EINTR) {}
    for (ssize_t i = 0; i < r; i++) {
        if (buf[i] == '+' && w->answered < w->count) w->answered++;
        else w->garbage = true;
    }
    if (r <= 0 || w->garbage) {
        close(w->out);
        w->out = -1;
    }
}

/* ---- the workers of one compile ---- */

struct jit_workers {
    int n, nworkers;
    worker *w;
    const jit_log *log;
    double timeout;
};

/* One poll over every worker's pipes, until the deadline; false when it
 * passed with some worker unfinished. */
static bool pump(jit_workers *ws, double deadline) {
    for (;;) {
        struct pollfd pf[2 * 64];
        worker *who[2 * 64];
        int np = 0;
        for (int k = 0; k < ws->nworkers && np < 2 * 64 - 1; k++) {
            worker *w = &ws->w[k];
            if (w->in >= 0) who[np] = w, pf[np++] = (struct pollfd){w->in, POLLOUT, 0};
            if (w->out >= 0) who[np] = w, pf[np++] = (struct pollfd){w->out, POLLIN, 0};
        }
        if (np == 0) return true;
        double left = deadline - now();
        if (left <= 0) return false;
        int r = poll(pf, (nfds_t)np, left > 1e6 ? 1000000000 : (int)(left * 1000) + 1);
        if (r < 0 && errno != EINTR) return false;
        for (int i = 0; r > 0 && i < np; i++) {
            if (!pf[i].revents) continue;
            if (pf[i].fd == who[i]->in) worker_send(who[i]);
            else worker_receive(who[i]);
        }
    }
}

bool jit_workers_exiting(void) {
    pthread_mutex_lock(&wp.m);
    bool e = wp.shutdown && wp.owner == getpid();
    pthread_mutex_unlock(&wp.m);
    return e;
}

/* Reaps w (killed first when it is late or answered garbage); its exit
 * decides its items' results.  While exiting nothing is logged and
 * nothing compiles in process. */
static void worker_end(jit_workers *ws, worker *w, bool late, jit_worker_result *res) {
    bool ending = jit_workers_exiting();
    if (w->pid < 0) { /* no memory, pipes or process for it: libgccjit in
                         process would fail the same way, and it aborts on
                         an allocation failure (std::bad_alloc) */
        for (int i = 0, t = w->first; i < w->count; i++, t += ws->nworkers) res[t] = JIT_WORKER_FAILED;
        if (!ending)
            jit_logf(ws->log, 0, "no compile worker could start (%s); %d kernels run op by op",
                     strerror(w->err), w->count);
        free(w->buf);
        return;
    }
    int st = 0;
    pid_t r = 0;
    /* one that answered every item has nothing left to do: if it is not
     * gone yet it may hang in its exit (OpenBLAS's destructor joins a
     * thread stuck retrying an allocation under ulimit -v) */
    if (!late && !w->garbage && w->answered == w->count)
        while ((r = waitpid(w->pid, &st, WNOHANG)) < 0 && errno == EINTR) {}
    if (r == 0 && (late || w->garbage || w->answered == w->count)) kill(w->pid, SIGKILL);
    if (r == 0)
        while ((r = waitpid(w->pid, &st, 0)) < 0 && errno == EINTR) {}
    bool finished = w->answered == w->count && !w->garbage;
    live_set(w->pid, false);
    ending = jit_workers_exiting(); /* the exit cleanup may have killed it meanwhile */
    bool exited = r == w->pid && WIFEXITED(st);
    const char *why = finished ? NULL : late ? "did not finish in time (EMBER_COMPILE_TIMEOUT)"
                      : w->garbage ? "answered garbage" : !exited ? "was killed by a signal" : NULL;
    if (ending) why = why ? why : "exiting";
    else if (why)
        jit_logf(ws->log, 0, "compile worker %d %s; %d of its %d kernels run op by op", (int)w->pid,
                 why, w->count - w->answered, w->count);
    for (int i = 0, t = w->first; i < w->count; i++, t += ws->nworkers)
        res[t] = i < w->answered ? JIT_WORKER_DONE
                 : why ? JIT_WORKER_FAILED
                 : JIT_WORKER_RETRY; /* it reported an error: compile that one here */
    if (w->in >= 0) close(w->in);
    if (w->out >= 0) close(w->out);
    free(w->buf);
}

jit_workers *jit_workers_start(k_kernel *const *kernels, const char *const *paths, int n,
                               int nworkers, const jit_log *log) {
    char buf[EM_ENV_MAX];
    const char *prog = worker_program(buf, sizeof buf);
    if (!prog || n <= 0 || nworkers <= 0) return NULL;
    if (nworkers > n) nworkers = n;
    if (nworkers > 64) nworkers = 64;
    jit_workers *ws = em_calloc(1, sizeof *ws);
    if (ws) ws->w = em_calloc((size_t)nworkers, sizeof *ws->w);
    if (ws && ws->w) ws->nworkers = slots_take(nworkers);
    if (!ws || !ws->w || ws->nworkers == 0) {
        if (ws) em_free(ws->w);
        em_free(ws);
        em_clear_error(); /* the caller compiles in process */
        return NULL;
    }
    ws->n = n;
    ws->log = log;
    ws->timeout = worker_timeout(log);
    /* worker k compiles items k, k + nworkers, ...: one process each, so
     * that libgccjit and the process start are paid once per worker */
    for (int k = 0; k < ws->nworkers; k++) {
        worker *w = &ws->w[k];
        *w = (worker){.pid = -1, .in = -1, .out = -1, .first = k};
        if (!serialize(w, kernels, paths, n, ws->nworkers) || !worker_start(w, prog)) w->pid = -1;
    }
    return ws;
}

void jit_workers_finish(jit_workers *ws, jit_worker_result *res) {
    /* a worker that dies early must not kill us with SIGPIPE: write with
     * the signal blocked for this thread, and drop a pending one */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    bool late = !pump(ws, now() + ws->timeout);
    struct timespec zero = {0, 0};
    while (sigtimedwait(&block, NULL, &zero) > 0) {}
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    /* wait for our own children only: a waitpid(-1) could reap a process
     * of the program that hosts us */
    for (int k = 0; k < ws->nworkers; k++)
        worker_end(ws, &ws->w[k], late && (ws->w[k].in >= 0 || ws->w[k].out >= 0), res);
    slots_give(ws->nworkers);
    em_free(ws->w);
    em_free(ws);
}
