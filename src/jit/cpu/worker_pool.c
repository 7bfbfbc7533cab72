/* worker_pool.c - ember-jit-worker processes, kept alive between compiles.
 *
 * A worker is spawned with posix_spawn (never fork: the parent may have
 * threads holding locks, libgccjit's among them) and then serves the
 * process until it exits: a compile takes idle workers from the pool
 * (spawning one only when none is idle, so that a process pays a worker's
 * start and libgccjit's loading once per core, not once per compile) and
 * feeds each one compile unit at a time on its stdin (several kernels
 * compiled in one libgccjit context: its ~30 ms of assembler and linker
 * paid once), the largest first, as soon as it has answered the previous
 * one on its stdout: '+' when the shared object is written, '-' when the
 * compiler reported an error (a unit of several is then sent again kernel
 * by kernel; a kernel alone then compiles in process).  A worker's stderr
 * is an anonymous file read after each answer: its last line goes to
 * EMBER_LOG=code (and into the line that reports a dead worker), never to
 * the program's stderr, where libgccjit's internal errors would dump RTL.
 * Where the program lives: EMBER_JIT_WORKER, else the installed one
 * (EMBER_WORKER_PATH, set by the build), else the build tree's.
 *
 * Nothing here waits without a deadline: a unit not answered within
 * EMBER_COMPILE_TIMEOUT seconds a kernel of being sent kills its worker,
 * and so does any other answer; its kernels, and with them those not yet sent,
 * are reported failed (not to be compiled in process: what hung or
 * crashed a worker would hang or crash the program; its graph runs op by
 * op), and the next compile starts a fresh worker in its place.  An idle
 * worker that died meanwhile is found dead when taken, and replaced; one
 * that dies before its first answer of a compile (it was dying as it was
 * taken) hands its kernel to a new worker, once.  An
 * idle worker is kept EMBER_WORKER_IDLE seconds (default 30), then the
 * reaper thread (alive only while workers are idle) ends it.
 *
 * Workers die with the process: exit (atexit) and the fatal signals kill
 * them, and a worker exits by itself once nothing holds the write end of
 * its stdin (its parent died, even of SIGKILL: worker.c).  Not
 * PR_SET_PDEATHSIG: it fires when the *thread* that spawned the worker
 * exits, which would kill a pooled worker that another thread now uses.
 *
 * Process-wide state (the one place outside the compile queue): how many
 * workers compiles use (at most one per core, whatever the number of
 * threads that compile), the idle ones, every live pid and the private
 * temporary directory, so that exit can kill the first and remove the
 * second.  A forked child forgets it all at the fork (pthread_atfork): it
 * starts workers of its own and never feeds, waits for or kills its
 * parent's. */
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
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define MAGIC "EMKIR02"
#define MAX_LIVE 256          /* workers tracked for the exit cleanup */
#define DEFAULT_KEEP 30.0     /* seconds an idle worker is kept: a program's
                                 compiles come in bursts (its first calls, a
                                 recompile); each idle worker holds ~40 MB */

/* One kernel of a record: its header, name, instructions and path. */
static bool write_kernel(FILE *f, const k_kernel *k, const char *path) {
    uint32_t hdr[5] = {(uint32_t)sizeof(k_inst), (uint32_t)strlen(k->name), (uint32_t)k->n,
                       (uint32_t)k->nbufs, (uint32_t)k->nsizes};
    uint32_t plen = (uint32_t)strlen(path);
    return fwrite(hdr, sizeof hdr, 1, f) == 1 && fwrite(k->name, 1, hdr[1], f) == hdr[1] &&
           fwrite(k->insts, sizeof(k_inst), (size_t)k->n, f) == (size_t)k->n &&
           fwrite(&plen, sizeof plen, 1, f) == 1 && fwrite(path, 1, plen, f) == plen;
}

bool jit_worker_write(FILE *f, k_kernel *const *ks, const char *const *paths, int n) {
    if (!f || !ks || !paths || n < 1 || n > JIT_CPU_UNIT_MAX) return false;
    uint32_t count = (uint32_t)n;
    bool ok = fwrite(MAGIC, 1, 8, f) == 8 && fwrite(&count, sizeof count, 1, f) == 1;
    for (int i = 0; ok && i < n; i++) ok = ks[i] && paths[i] && write_kernel(f, ks[i], paths[i]);
    return ok && fflush(f) == 0;
}

/* One kernel of a record into u's next slot; false on a short or bad
 * record (malformed: u->ks[u->n] then holds what was read, to be freed),
 * or out of memory (error set). */
static bool read_kernel(FILE *f, jit_worker_unit *u, bool *malformed) {
    uint32_t hdr[5], plen;
    char name[256];
    *malformed = true;
    if (fread(hdr, sizeof hdr, 1, f) != 1 || hdr[0] != sizeof(k_inst) || hdr[1] >= sizeof name ||
        hdr[2] > (1u << 24) || fread(name, 1, hdr[1], f) != hdr[1])
        return false;
    name[hdr[1]] = '\0';
    *malformed = false; /* out of memory is not a malformed input: say so */
    k_kernel *k = u->ks[u->n] = kir_new(name);
    if (!k || !(k->insts = em_malloc(sizeof(k_inst) * (hdr[2] ? hdr[2] : 1)))) return false;
    *malformed = true;
    if (fread(k->insts, sizeof(k_inst), hdr[2], f) != hdr[2] ||
        fread(&plen, sizeof plen, 1, f) != 1 || plen >= 4096)
        return false;
    *malformed = false;
    if (!(u->paths[u->n] = em_malloc(plen + 1))) return false;
    *malformed = true;
    if (fread(u->paths[u->n], 1, plen, f) != plen) return false;
    u->paths[u->n][plen] = '\0';
    k->n = k->cap = (int)hdr[2];
    k->nbufs = (int)hdr[3];
    k->nsizes = (int)hdr[4];
    u->n++; /* the generator verifies the IR before it trusts it */
    return true;
}

void jit_worker_unit_free(jit_worker_unit *u) {
    if (!u) return;
    for (int i = 0; u->ks && i <= u->n && i < JIT_CPU_UNIT_MAX; i++) kir_free(u->ks[i]);
    for (int i = 0; u->paths && i <= u->n && i < JIT_CPU_UNIT_MAX; i++) em_free(u->paths[i]);
    em_free(u->ks);
    em_free(u->paths);
    *u = (jit_worker_unit){0};
}

bool jit_worker_read(FILE *f, jit_worker_unit *u) {
    char magic[8];
    uint32_t count;
    *u = (jit_worker_unit){0};
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, MAGIC, 8) || fread(&count, sizeof count, 1, f) != 1 ||
        count < 1 || count > JIT_CPU_UNIT_MAX) {
        em_error(EM_ERR_ARG, "malformed kernel unit on the worker's input");
        return false;
    }
    u->ks = em_calloc(JIT_CPU_UNIT_MAX, sizeof *u->ks);
    u->paths = em_calloc(JIT_CPU_UNIT_MAX, sizeof *u->paths);
    bool malformed = false, ok = u->ks && u->paths;
    while (ok && u->n < (int)count) ok = read_kernel(f, u, &malformed);
    if (ok) return true;
    jit_worker_unit_free(u);
    if (malformed) em_error(EM_ERR_ARG, "malformed kernel on the worker's input");
    return false;
}

/* ---- process-wide state ---- */

/* A live worker process. */
typedef struct proc {
    pid_t pid;     /* -1: none */
    int in, out;   /* our ends of its stdin and stdout */
    int err;       /* its stderr: an anonymous file (memfd) we read, -1: none */
    uint64_t kind; /* its program and CPU level (proc_kind): an idle worker
                      serves only compiles that would start the same one */
    double idle_since; /* when it was last given back (now()) */
} proc;

static struct {
    pthread_mutex_t m;
    pthread_cond_t freed;  /* a worker slot was given back */
    pthread_cond_t wake;   /* the reaper's: exiting, or wp.keep changed */
    int busy;              /* worker slots compiles hold now */
    proc idle[MAX_LIVE];   /* workers between compiles, the longest idle first */
    int nidle;
    double keep;           /* seconds an idle worker is kept (EMBER_WORKER_IDLE) */
    bool reaper;           /* the reaper thread runs (it ends the expired ones) */
    long started;          /* workers this process started (jit_workers_count) */
    pid_t live[MAX_LIVE];  /* every worker's pid, idle or busy (0: a free slot),
                              for the exit cleanup */
    char dir[EM_ENV_MAX];  /* private temporary directory ("" until made) */
    pid_t owner;           /* the process all of this belongs to: a forked
                              child must not use or kill its parent's workers */
    bool registered;       /* the exit cleanup is registered */
    bool shutdown;         /* exiting: no new worker, no new temporary file */
} wp = {.m = PTHREAD_MUTEX_INITIALIZER, .freed = PTHREAD_COND_INITIALIZER,
        .wake = PTHREAD_COND_INITIALIZER};

static int dir_fd = -1; /* the private directory, open for the signal handler */

static void exit_cleanup(void) { jit_workers_shutdown(); }

/* Forgets a parent's state in a forked child (under wp.m).  The idle
 * workers' pipes are closed, not written: a worker exits once its
 * parent's copy closes too. */
static void adopt_process(void) {
    if (wp.owner == getpid()) return;
    wp.owner = getpid();
    wp.busy = 0;
    for (int i = 0; i < wp.nidle; i++) {
        close(wp.idle[i].in);
        close(wp.idle[i].out);
    }
    wp.nidle = 0;
    wp.reaper = false; /* the parent's thread is not in the child */
    /* nor are the threads that waited on these conditions: glibc's
     * broadcast would wait for those phantom waiters forever */
    wp.wake = (pthread_cond_t)PTHREAD_COND_INITIALIZER;
    wp.freed = (pthread_cond_t)PTHREAD_COND_INITIALIZER;
    wp.started = 0;
    memset(wp.live, 0, sizeof wp.live);
    wp.dir[0] = '\0';
    if (dir_fd >= 0) close(dir_fd); /* the parent's directory */
    dir_fd = -1;
}

/* fork while another thread holds wp.m: the child's copy must be free,
 * and the child drops the parent's workers at once (a child that never
 * compiles must not hold their pipes open either). */
static void before_fork(void) { pthread_mutex_lock(&wp.m); }
static void after_fork_parent(void) { pthread_mutex_unlock(&wp.m); }
static void after_fork_child(void) {
    adopt_process();
    pthread_mutex_unlock(&wp.m);
}

/* Takes this process's state (under wp.m): registers the exit cleanup and
 * the fork handlers once per process image (a forked child inherits them). */
static void own_process(void) {
    adopt_process();
    if (!wp.registered) {
        wp.registered = true;
        atexit(exit_cleanup);
        pthread_atfork(before_fork, after_fork_parent, after_fork_child);
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
    own_process();
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

/* Records (add) or forgets a live worker (under wp.m). */
static void live_set_locked(pid_t pid, bool add) {
    for (int i = 0; i < MAX_LIVE; i++)
        if (wp.live[i] == (add ? 0 : pid)) {
            wp.live[i] = add ? pid : 0;
            break;
        }
}

static void live_set(pid_t pid, bool add) {
    pthread_mutex_lock(&wp.m);
    live_set_locked(pid, add);
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

/* Reaps the idle workers (killed by the caller) and closes their pipes
 * (under wp.m, exiting): nobody else waits for them. */
static void reap_idle(void) {
    for (int i = 0; i < wp.nidle; i++) {
        while (waitpid(wp.idle[i].pid, NULL, 0) < 0 && errno == EINTR) {}
        live_set_locked(wp.idle[i].pid, false);
        close(wp.idle[i].in);
        close(wp.idle[i].out);
    }
    wp.nidle = 0;
}

void jit_workers_shutdown(void) {
    pthread_mutex_lock(&wp.m);
    if (wp.owner == getpid()) {
        wp.shutdown = true;
        for (int i = 0; i < MAX_LIVE; i++)
            if (wp.live[i] > 0) kill(wp.live[i], SIGKILL); /* busy ones: their compiles reap them */
        /* SIGKILL is delivered asynchronously: a worker in the middle of a
         * write could still create a file in the directory after it is
         * emptied, and it would stay behind.  Wait (a bounded 2 s) until
         * every killed worker is dead. */
        for (int i = 0; i < MAX_LIVE; i++)
            for (int t = 0; wp.live[i] > 0 && t < 2000 && !is_dead(wp.live[i]); t++) usleep(1000);
        reap_idle();
        pthread_cond_broadcast(&wp.wake); /* the reaper ends */
        if (wp.dir[0]) nftw(wp.dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
        wp.dir[0] = '\0';
        if (dir_fd >= 0) close(dir_fd);
        dir_fd = -1;
        pthread_cond_broadcast(&wp.freed);
    }
    pthread_mutex_unlock(&wp.m);
}

void jit_workers_count(long *started, int *idle) {
    pthread_mutex_lock(&wp.m);
    own_process();
    if (started) *started = wp.started;
    if (idle) *idle = wp.nidle;
    pthread_mutex_unlock(&wp.m);
}

int jit_workers_idle_pids(int *pids, int max) {
    pthread_mutex_lock(&wp.m);
    own_process();
    int n = 0;
    for (int i = 0; i < wp.nidle && n < max; i++) pids[n++] = (int)wp.idle[i].pid;
    pthread_mutex_unlock(&wp.m);
    return n;
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
    own_process();
    bool ok = !wp.shutdown && private_dir() &&
              (size_t)snprintf(buf, n, "%s/k-XXXXXX", wp.dir) < n;
    pthread_mutex_unlock(&wp.m);
    int fd = ok ? mkostemp(buf, O_CLOEXEC) : -1;
    if (fd < 0) return false;
    close(fd);
    return true;
}

/* ---- settings ---- */

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

/* ---- one worker process ---- */

/* What a worker started now would be: its program and the CPU level it
 * generates for (FNV-1a).  A worker started otherwise (EMBER_JIT_WORKER
 * or EMBER_JIT_MARCH changed since) would write objects for another key. */
static uint64_t proc_kind(const char *prog) {
    uint64_t h = 1469598103934665603ull;
    for (const char *s = prog; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
    for (const char *s = jit_cpu_march(); *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The environment of a worker: ours, with the CPU level it must generate
 * for, its parent, and TMPDIR our private directory. */
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

/* posix_spawn of prog with stdin from in_r, stdout to out_w, stderr to
 * err. */
static pid_t spawn_process(const char *prog, int in_r, int out_w, int err) {
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
        posix_spawn_file_actions_adddup2(&fa, out_w, 1) == 0 &&
        posix_spawn_file_actions_adddup2(&fa, err, 2) == 0) {
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

/* Starts a worker of prog into *p; false (p->pid -1, errno set) when it
 * could not (no memory, no pipes, no process). */
static bool proc_start(proc *p, const char *prog, uint64_t kind) {
    int in[2] = {-1, -1}, out[2] = {-1, -1};
    *p = (proc){.pid = -1, .in = -1, .out = -1, .err = -1, .kind = kind};
    /* close-on-exec: a worker spawned meanwhile by another thread must not
     * inherit these pipes, or it would hold this one's input open */
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) goto fail;
    for (int i = 0; i < 2; i++)
        if ((in[i] = high_fd(in[i])) < 0 || (out[i] = high_fd(out[i])) < 0) goto fail;
    /* its stderr: what the compiler says (an internal error dumps pages
     * of RTL) goes to EMBER_LOG=code, not to the program's terminal */
    if ((p->err = memfd_create("ember-jit-worker-stderr", MFD_CLOEXEC)) < 0 || (p->err = high_fd(p->err)) < 0)
        goto fail;
    p->pid = spawn_process(prog, in[0], out[1], p->err);
    if (p->pid < 0) goto fail;
    pthread_mutex_lock(&wp.m);
    live_set_locked(p->pid, true);
    wp.started++;
    pthread_mutex_unlock(&wp.m);
    close(in[0]);
    close(out[1]);
    p->in = in[1];
    p->out = out[0];
    fcntl(p->in, F_SETFL, O_NONBLOCK); /* written only when poll says it takes bytes */
    return true;
fail:;
    int err = errno ? errno : ENOMEM;
    for (int i = 0; i < 2; i++) {
        if (in[i] >= 0) close(in[i]);
        if (out[i] >= 0) close(out[i]);
    }
    if (p->err >= 0) close(p->err);
    p->pid = p->err = -1;
    errno = err;
    return false;
}

/* Forgets p, already reaped (or not ours to reap: a program that waits
 * for any child took it), without signalling its pid, which may be
 * another process's by now. */
static void proc_forget(proc *p) {
    live_set(p->pid, false);
    if (p->in >= 0) close(p->in);
    if (p->out >= 0) close(p->out);
    if (p->err >= 0) close(p->err);
    *p = (proc){.pid = -1, .in = -1, .out = -1, .err = -1};
}

/* The last line p wrote on its stderr since the last call ("" if none),
 * into buf; what it wrote is then dropped.  Called when p is between
 * units (it answered, or it is gone), so nothing writes meanwhile; the
 * file's offset is shared with p's descriptor, hence the lseek. */
static void proc_said(proc *p, char *buf, size_t n) {
    buf[0] = '\0';
    if (p->err < 0) return;
    struct stat st;
    if (fstat(p->err, &st) != 0 || st.st_size == 0) return;
    off_t from = st.st_size > (off_t)(n - 1) ? st.st_size - (off_t)(n - 1) : 0;
    ssize_t r = pread(p->err, buf, n - 1, from);
    buf[r > 0 ? r : 0] = '\0';
    for (size_t len = strlen(buf); len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r');) buf[--len] = '\0';
    char *last = strrchr(buf, '\n');
    if (last) memmove(buf, last + 1, strlen(last + 1) + 1);
    if (ftruncate(p->err, 0) == 0) lseek(p->err, 0, SEEK_SET);
}

/* Ends p: killed first (kill_first), else given 200 ms to exit by itself
 * (it closed its answers: it is leaving, or it is broken and is killed
 * then); reaped, forgotten, its pipes closed.  Its wait status (0 when it
 * was not ours to reap). */
static int proc_end(proc *p, bool kill_first) {
    int st = 0;
    pid_t r = 0;
    for (int t = 0; !kill_first && t < 200 && r == 0; t++) {
        while ((r = waitpid(p->pid, &st, WNOHANG)) < 0 && errno == EINTR) {}
        if (r == 0) usleep(1000);
    }
    if (r == 0) {
        kill(p->pid, SIGKILL);
        /* our own child only: a waitpid(-1) could reap a process of the
         * program that hosts us */
        while ((r = waitpid(p->pid, &st, 0)) < 0 && errno == EINTR) {}
    }
    proc_forget(p);
    return r > 0 ? st : 0;
}

/* Whether idle worker p can take a kernel: alive, and silent (an idle
 * worker has nothing to say; end of file says it died).  One that is not
 * is ended. */
static bool proc_sound(proc *p) {
    pid_t r;
    while ((r = waitpid(p->pid, NULL, WNOHANG)) < 0 && errno == EINTR) {}
    struct pollfd pf = {p->out, POLLIN, 0};
    if (r == 0 && poll(&pf, 1, 0) == 0) return true;
    if (r == 0) proc_end(p, true);
    else proc_forget(p); /* reaped now, or by someone else */
    return false;
}

/* An idle worker of kind into *p, if one is sound; those that are not (or
 * of another kind) are ended on the way. */
static bool idle_take(uint64_t kind, proc *p) {
    for (;;) {
        pthread_mutex_lock(&wp.m);
        bool any = !wp.shutdown && wp.nidle > 0;
        if (any) *p = wp.idle[--wp.nidle];
        pthread_mutex_unlock(&wp.m);
        if (!any) return false;
        if (p->kind == kind && proc_sound(p)) return true;
        if (p->pid >= 0) proc_end(p, true);
    }
}

/* EMBER_WORKER_IDLE: the seconds an idle worker is kept; 0: none is (each
 * compile starts its workers, as when they exited after their kernels). */
static double keep_seconds(void) {
    char buf[64];
    const char *e = em_getenv("EMBER_WORKER_IDLE", buf, sizeof buf);
    char *end;
    double v = e && *e ? strtod(e, &end) : DEFAULT_KEEP;
    return e && *e && (*end || !(v >= 0) || v > 1e6) ? DEFAULT_KEEP : v;
}

/* Ends the idle workers kept longer than wp.keep (under wp.m, released
 * while one is ended); when the next one expires, or 0 when none is idle. */
static double reap_expired(void) {
    while (wp.nidle > 0 && !wp.shutdown) {
        double expires = wp.idle[0].idle_since + wp.keep;
        if (expires > now()) return expires;
        proc p = wp.idle[0];
        memmove(wp.idle, wp.idle + 1, sizeof *wp.idle * (size_t)--wp.nidle);
        pthread_mutex_unlock(&wp.m);
        proc_end(&p, true);
        pthread_mutex_lock(&wp.m);
    }
    return 0;
}

/* The reaper: a thread that lives while workers are idle, so that a
 * program that compiled once does not hold them (and their memory) for
 * the rest of its life. */
static void *reaper(void *arg) {
    (void)arg;
    pthread_mutex_lock(&wp.m);
    for (double next; !wp.shutdown && (next = reap_expired()) > 0;) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts); /* the condition's clock */
        double at = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + (next - now()) + 0.001;
        ts.tv_sec = (time_t)at;
        ts.tv_nsec = (long)((at - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&wp.wake, &wp.m, &ts);
    }
    wp.reaper = false;
    pthread_mutex_unlock(&wp.m);
    return NULL;
}

/* Starts the reaper (under wp.m) unless it runs; false when it cannot
 * (no thread under a limit): then no worker is kept. */
static bool reaper_running(void) {
    if (wp.reaper) return true;
    pthread_attr_t attr;
    pthread_t t;
    if (pthread_attr_init(&attr) != 0) return false;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigset_t all, old;
    sigfillset(&all); /* it takes none of the program's signals */
    pthread_sigmask(SIG_BLOCK, &all, &old);
    wp.reaper = pthread_create(&t, &attr, reaper, NULL) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    return wp.reaper;
}

/* Puts sound worker p back among the idle ones, for EMBER_WORKER_IDLE
 * seconds; while exiting (or with nothing to keep it) it is ended. */
static void idle_give(proc *p) {
    double keep = keep_seconds();
    pthread_mutex_lock(&wp.m);
    bool kept = keep > 0 && !wp.shutdown && wp.owner == getpid() && wp.nidle < MAX_LIVE && reaper_running();
    if (kept) {
        p->idle_since = now();
        wp.keep = keep;
        wp.idle[wp.nidle++] = *p;
        pthread_cond_broadcast(&wp.wake); /* keep may be shorter now */
    }
    pthread_mutex_unlock(&wp.m);
    if (!kept) proc_end(p, true);
}

/* ---- the workers of one compile ---- */

typedef struct slot {
    proc p;          /* its worker (p.pid -1: none, or gone) */
    int unit;        /* the unit in flight, -1: none */
    char *buf;       /* that unit's record, serialized */
    size_t len, sent;
    double deadline; /* when the unit in flight is late */
    bool started;    /* it had a worker */
    bool unproven;   /* its worker was idle and has not answered in this compile:
                        a death before that answer is the idle worker's (killed
                        from outside, or as it was taken), not the unit's */
    int err;         /* why none could start (errno) */
} slot;

/* Units: unit u is items[first[u] .. first[u] + count[u]).  The planned
 * ones come first; a rejected unit of several kernels adds one unit per
 * kernel (each item is split off at most once: room for 2n of each). */
struct jit_workers {
    k_kernel *const *ks;     /* the items: kernels (the caller's) */
    const char *const *paths; /* and where their shared objects go */
    int n;
    int *items, *first, *count, nunits;
    int *order;              /* the planned units, costliest first (they bound the compile's length) */
    int nplanned, next;      /* order[next] is the next one to send */
    bool stop;               /* a worker failed: nothing more is sent */
    jit_worker_result *res;  /* per item (jit_workers_finish's) */
    slot *s;                 /* one per worker slot taken */
    int nslots;
    const jit_log *log;
    double timeout;          /* seconds per kernel (EMBER_COMPILE_TIMEOUT) */
    int *again;              /* units to send first: a dead idle worker's (one per
                                slot) and the kernels of rejected units */
    int nagain;
    char prog[EM_ENV_MAX];   /* the worker program, for a replacement */
    uint64_t kind;
};

/* An estimate of k's compile time, in the scheduler's units (schedule.c):
 * each instruction 1, each inlined transcendental (ALU cost 10 or more:
 * exp, erf, tanh...) 24; libgccjit spends ~1.5 ms a unit, plus ~30 ms a
 * context.  (A gelu kernel of 22 instructions took as long as a
 * 59-instruction one.) */
static long compile_cost(const k_kernel *k) {
    long c = 0;
    for (int i = 0; i < k->n; i++) {
        k_alu a = k->insts[i].alu;
        bool alu = k->insts[i].op == K_ALU || k->insts[i].op == K_ACC;
        c += alu && a != KA_NONE && a < KA_COUNT && kir_alu_info(a)->cost >= 10 ? 24 : 1;
    }
    return c;
}

/* Indices 0..n) by decreasing key (stable: insertion sort, n is a
 * graph's misses). */
static void sort_by_cost(int *o, const long *cost, int n) {
    for (int i = 0; i < n; i++) {
        int j = i;
        for (; j > 0 && cost[o[j - 1]] < cost[i]; j--) o[j] = o[j - 1];
        o[j] = i;
    }
}

/* How many units: at least one per worker (the kernels compile in
 * parallel), enough that none holds more than JIT_UNIT_KERNELS kernels or
 * (but for a kernel alone) JIT_UNIT_COST of cost, so that a unit stays
 * short next to the whole compile and its object small; a multiple of the
 * workers, so that each gets as many (3 units on 2 workers left one
 * worker twice the other's share); never more than the kernels. */
static int unit_count(const long *cost, int n, int nslots) {
    long total = 0;
    for (int i = 0; i < n; i++) total += cost[i];
    long u = nslots;
    if (u < (n + JIT_UNIT_KERNELS - 1) / JIT_UNIT_KERNELS) u = (n + JIT_UNIT_KERNELS - 1) / JIT_UNIT_KERNELS;
    if (u < (total + JIT_UNIT_COST - 1) / JIT_UNIT_COST) u = (total + JIT_UNIT_COST - 1) / JIT_UNIT_COST;
    u = (u + nslots - 1) / nslots * nslots;
    return u > n ? n : (int)u;
}

/* Groups the items into units balanced by cost: the costliest item first,
 * each into the cheapest unit that has room (longest processing time
 * first), then orders the units costliest first. */
static bool plan_units(jit_workers *ws) {
    int n = ws->n;
    long *cost = em_malloc(sizeof(long) * (size_t)n), *ucost = em_calloc((size_t)n, sizeof(long));
    int *o = em_malloc(sizeof(int) * (size_t)n);
    int *of = em_malloc(sizeof(int) * (size_t)n); /* each item's unit */
    bool ok = cost && ucost && o && of;
    if (ok) {
        for (int i = 0; i < n; i++) cost[i] = compile_cost(ws->ks[i]);
        sort_by_cost(o, cost, n);
        int nu = unit_count(cost, n, ws->nslots);
        int *cnt = ws->count;
        for (int u = 0; u < nu; u++) cnt[u] = 0;
        for (int t = 0; t < n; t++) {
            int best = -1;
            for (int u = 0; u < nu; u++)
                if (cnt[u] < JIT_UNIT_KERNELS && (best < 0 || ucost[u] < ucost[best])) best = u;
            of[o[t]] = best;
            ucost[best] += cost[o[t]];
            cnt[best]++;
        }
        for (int u = 0, at = 0; u < nu; u++) { /* the items of each unit, costliest first */
            ws->first[u] = at;
            for (int t = 0; t < n; t++)
                if (of[o[t]] == u) ws->items[at++] = o[t];
        }
        ws->nunits = ws->nplanned = nu;
        sort_by_cost(ws->order, ucost, nu);
    }
    em_free(cost), em_free(ucost), em_free(o), em_free(of);
    return ok;
}

/* The record of unit u in s->buf: written with write(2) and a deadline
 * (a FILE retries nothing: a write interrupted by a signal of the
 * program's, or a worker that stops reading, was a truncated record). */
static bool serialize(jit_workers *ws, slot *s, int u) {
    k_kernel *ks[JIT_UNIT_KERNELS];
    const char *paths[JIT_UNIT_KERNELS];
    for (int j = 0; j < ws->count[u]; j++) {
        ks[j] = ws->ks[ws->items[ws->first[u] + j]];
        paths[j] = ws->paths[ws->items[ws->first[u] + j]];
    }
    s->buf = NULL;
    s->len = s->sent = 0;
    FILE *f = open_memstream(&s->buf, &s->len);
    if (!f) return false;
    bool ok = jit_worker_write(f, ks, paths, ws->count[u]);
    ok = fclose(f) == 0 && ok;
    if (!ok) {
        free(s->buf);
        s->buf = NULL;
    }
    return ok;
}

/* Every item of unit u gets r. */
static void unit_result(jit_workers *ws, int u, jit_worker_result r) {
    for (int j = 0; j < ws->count[u]; j++) ws->res[ws->items[ws->first[u] + j]] = r;
}

/* Unit u was rejected by the compiler: its kernels go again, one unit
 * each, so that the one at fault fails alone. */
static void split_unit(jit_workers *ws, int u) {
    for (int j = ws->count[u] - 1; j >= 0; j--) {
        int v = ws->nunits++, at = ws->n + (ws->first[u] + j); /* the second half of items */
        ws->items[at] = ws->items[ws->first[u] + j];
        ws->first[v] = at;
        ws->count[v] = 1;
        ws->again[ws->nagain++] = v;
    }
}

/* Gives s's idle worker the next unit, if there is one to send. */
static void dispatch(jit_workers *ws, slot *s) {
    if (ws->stop || (ws->nagain == 0 && ws->next >= ws->nplanned)) return;
    int u = ws->nagain > 0 ? ws->again[--ws->nagain] : ws->order[ws->next++];
    if (!serialize(ws, s, u)) { /* out of memory: so would libgccjit be, in process */
        unit_result(ws, u, JIT_WORKER_FAILED);
        ws->stop = true;
        jit_logf(ws->log, 0, "out of memory feeding a compile worker; the graph runs op by op");
        return;
    }
    s->unit = u;
    s->deadline = now() + ws->timeout * ws->count[u];
}

static void slot_clear_unit(slot *s) {
    free(s->buf);
    s->buf = NULL;
    s->unit = -1;
}

/* s's worker is gone: late or answered garbage (killed), or dead by
 * itself.  Its unit in flight fails (and so do those not sent yet)
 * unless it exited with a status: then it reported an error, and those
 * compile in process.  While exiting nothing is logged. */
static void slot_fail(jit_workers *ws, slot *s, const char *killed_why) {
    if (!killed_why && s->unproven && s->unit >= 0 && !jit_workers_exiting()) {
        proc_end(&s->p, false); /* its unit goes to a new worker, once */
        ws->again[ws->nagain++] = s->unit;
        slot_clear_unit(s);
        s->unproven = false;
        if (!proc_start(&s->p, ws->prog, ws->kind)) s->err = errno;
        return;
    }
    pid_t pid = s->p.pid;
    char said[512];
    proc_said(&s->p, said, sizeof said); /* a dead worker wrote all it will */
    int st = proc_end(&s->p, killed_why != NULL);
    const char *why = killed_why ? killed_why : WIFSIGNALED(st) ? "was killed by a signal" : NULL;
    bool ending = jit_workers_exiting();
    if (s->unit >= 0) {
        unit_result(ws, s->unit, why || ending ? JIT_WORKER_FAILED : JIT_WORKER_RETRY);
        if (why && !ending)
            jit_logf(ws->log, 0, "compile worker %d %s on a unit of %d kernel%s; its graph runs op by op%s%s",
                     (int)pid, why, ws->count[s->unit], ws->count[s->unit] == 1 ? "" : "s",
                     *said ? "; it said: " : "", said);
        else if (*said && !ending)
            jit_logf(ws->log, JIT_LOG_CODE, "compile worker %d: %s", (int)pid, said);
    }
    if (why || ending) ws->stop = true;
    slot_clear_unit(s);
}

/* Writes what s's record still has to go; a worker that stopped reading
 * (EPIPE) is left to its answer, end of file. */
static void slot_send(slot *s) {
    while (s->sent < s->len) {
        ssize_t r = write(s->p.in, s->buf + s->sent, s->len - s->sent);
        if (r > 0) s->sent += (size_t)r;
        else if (r < 0 && errno == EINTR) continue;
        else if (r < 0 && errno == EAGAIN) return;
        else s->sent = s->len; /* it died: its end of file says so */
    }
}

/* Reads s's answer: one byte for its unit in flight. */
static void slot_receive(jit_workers *ws, slot *s) {
    char buf[64];
    ssize_t r;
    while ((r = read(s->p.out, buf, sizeof buf)) < 0 && errno == EINTR) {}
    if (r <= 0) {
        slot_fail(ws, s, NULL);
        return;
    }
    if (r != 1 || s->unit < 0 || (buf[0] != '+' && buf[0] != '-')) {
        slot_fail(ws, s, "answered garbage");
        return;
    }
    char said[512];
    proc_said(&s->p, said, sizeof said);
    if (buf[0] == '+' && *said) jit_logf(ws->log, JIT_LOG_CODE, "compile worker %d: %s", (int)s->p.pid, said);
    if (buf[0] == '-') {
        jit_logf(ws->log, JIT_LOG_CODE, "compile worker %d failed a unit of %d kernel%s (%s); %s", (int)s->p.pid,
                 ws->count[s->unit], ws->count[s->unit] == 1 ? "" : "s", *said ? said : "it said nothing",
                 ws->count[s->unit] > 1 ? "its kernels go again one by one" : "the kernel compiles in process");
    }
    if (buf[0] == '-' && ws->count[s->unit] > 1)
        split_unit(ws, s->unit);
    else
        unit_result(ws, s->unit, buf[0] == '+' ? JIT_WORKER_DONE : JIT_WORKER_RETRY);
    s->unproven = false;
    slot_clear_unit(s);
}

/* The earliest deadline of a unit in flight, after ending the workers
 * that are past theirs; 0 when none is in flight. */
static double next_deadline(jit_workers *ws) {
    double t = now(), first = 0;
    for (int k = 0; k < ws->nslots; k++) {
        slot *s = &ws->s[k];
        if (s->unit < 0) continue;
        if (s->deadline <= t) slot_fail(ws, s, "did not finish in time (EMBER_COMPILE_TIMEOUT)");
        else if (first == 0 || s->deadline < first) first = s->deadline;
    }
    return first;
}

/* Whether a unit is left that a live worker can take. */
static bool work_left(const jit_workers *ws) {
    bool live = false;
    for (int k = 0; k < ws->nslots; k++) live |= ws->s[k].p.pid >= 0;
    return live && !ws->stop && (ws->next < ws->nplanned || ws->nagain > 0);
}

/* The pipes to wait on, with the slot of each: a record still to write,
 * and every answer awaited. */
static int poll_set(jit_workers *ws, struct pollfd *pf, slot **who) {
    int np = 0;
    for (int k = 0; k < ws->nslots; k++) {
        slot *s = &ws->s[k];
        if (s->unit < 0) continue;
        if (s->sent < s->len) who[np] = s, pf[np++] = (struct pollfd){s->p.in, POLLOUT, 0};
        who[np] = s, pf[np++] = (struct pollfd){s->p.out, POLLIN, 0};
    }
    return np;
}

/* Feeds the workers until every unit is answered, failed or unsendable. */
static void pump(jit_workers *ws) {
    for (;;) {
        for (int k = 0; k < ws->nslots; k++)
            if (ws->s[k].p.pid >= 0 && ws->s[k].unit < 0) dispatch(ws, &ws->s[k]);
        double deadline = next_deadline(ws);
        if (deadline == 0) {
            if (!work_left(ws)) return;
            continue;
        }
        struct pollfd pf[2 * 64];
        slot *who[2 * 64];
        int np = poll_set(ws, pf, who);
        double left = deadline - now();
        int r = poll(pf, (nfds_t)np, left <= 0 ? 0 : left > 1e6 ? 1000000000 : (int)(left * 1000) + 1);
        if (r < 0 && errno != EINTR) { /* cannot wait (no memory): end what is in flight */
            for (int k = 0; k < ws->nslots; k++)
                if (ws->s[k].unit >= 0) slot_fail(ws, &ws->s[k], "could not be waited for (poll failed)");
            continue;
        }
        for (int i = 0; r > 0 && i < np; i++) {
            slot *s = who[i];
            if (!pf[i].revents || s->unit < 0 || s->p.pid < 0) continue;
            if (pf[i].fd == s->p.in && pf[i].events == POLLOUT) slot_send(s);
            else slot_receive(ws, s);
        }
    }
}

bool jit_workers_exiting(void) {
    pthread_mutex_lock(&wp.m);
    bool e = wp.shutdown && wp.owner == getpid();
    pthread_mutex_unlock(&wp.m);
    return e;
}

static void workers_free(jit_workers *ws) {
    em_free(ws->again);
    em_free(ws->order);
    em_free(ws->items), em_free(ws->first), em_free(ws->count);
    em_free(ws->s);
    em_free(ws);
}

/* Gives every slot a worker: an idle one, else a new one. */
static void slots_fill(jit_workers *ws) {
    for (int k = 0; k < ws->nslots; k++) {
        slot *s = &ws->s[k];
        *s = (slot){.unit = -1, .p = {.pid = -1, .in = -1, .out = -1}};
        s->unproven = idle_take(ws->kind, &s->p);
        if (!s->unproven && !proc_start(&s->p, ws->prog, ws->kind)) s->err = errno;
        s->started = s->p.pid >= 0;
    }
}

jit_workers *jit_workers_start(k_kernel *const *kernels, const char *const *paths, int n,
                               int nworkers, const jit_log *log) {
    char buf[EM_ENV_MAX];
    const char *prog = worker_program(buf, sizeof buf);
    if (!prog || !kernels || !paths || n <= 0 || nworkers <= 0) return NULL;
    if (nworkers > n) nworkers = n;
    if (nworkers > 64) nworkers = 64;
    jit_workers *ws = em_calloc(1, sizeof *ws);
    size_t two_n = 2 * (size_t)n;
    if (ws) {
        ws->s = em_calloc((size_t)nworkers, sizeof *ws->s);
        ws->items = em_malloc(sizeof(int) * two_n);
        ws->first = em_malloc(sizeof(int) * two_n);
        ws->count = em_malloc(sizeof(int) * two_n);
        ws->order = em_malloc(sizeof(int) * (size_t)n);
        ws->again = em_malloc(sizeof(int) * ((size_t)nworkers + (size_t)n));
    }
    bool ok = ws && ws->s && ws->items && ws->first && ws->count && ws->order && ws->again;
    if (ok) ws->nslots = slots_take(nworkers);
    if (ok && ws->nslots > 0) {
        ws->ks = kernels, ws->paths = paths, ws->n = n;
        ok = plan_units(ws);
        if (!ok) slots_give(ws->nslots);
    }
    if (!ok || ws->nslots == 0) {
        if (ws) workers_free(ws);
        em_clear_error(); /* the caller compiles in process */
        return NULL;
    }
    ws->log = log;
    jit_logf(log, JIT_LOG_CACHE, "cpu: %d kernel%s in %d compile unit%s on %d worker%s", n, n == 1 ? "" : "s",
             ws->nunits, ws->nunits == 1 ? "" : "s", ws->nslots, ws->nslots == 1 ? "" : "s");
    ws->timeout = jit_compile_timeout(log);
    snprintf(ws->prog, sizeof ws->prog, "%s", prog);
    ws->kind = proc_kind(prog);
    slots_fill(ws);
    return ws;
}

/* The results of the items never sent: failed after a failure (or when
 * no worker could start: libgccjit in process would fail the same way,
 * and it aborts on an allocation failure), else compiled in process (the
 * workers exited, reporting errors). */
static void settle_unsent(jit_workers *ws) {
    bool any = false;
    int err = 0;
    for (int k = 0; k < ws->nslots; k++) {
        any |= ws->s[k].started;
        if (!ws->s[k].started) err = ws->s[k].err;
    }
    bool ending = jit_workers_exiting();
    jit_worker_result r = ws->stop || !any || ending ? JIT_WORKER_FAILED : JIT_WORKER_RETRY;
    int left = 0;
    for (int t = ws->next; t < ws->nplanned; t++) left += ws->count[ws->order[t]];
    for (int t = 0; t < ws->nagain; t++) left += ws->count[ws->again[t]];
    if (!any && !ending)
        jit_logf(ws->log, 0, "no compile worker could start (%s); %d kernels run op by op",
                 strerror(err ? err : ENOMEM), left);
    for (; ws->next < ws->nplanned; ws->next++) unit_result(ws, ws->order[ws->next], r);
    while (ws->nagain > 0) unit_result(ws, ws->again[--ws->nagain], r);
}

void jit_workers_finish(jit_workers *ws, jit_worker_result *res) {
    for (int i = 0; i < ws->n; i++) res[i] = JIT_WORKER_RETRY;
    ws->res = res;
    /* a worker that dies early must not kill us with SIGPIPE: write with
     * the signal blocked for this thread, and drop a pending one */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    pump(ws);
    struct timespec zero = {0, 0};
    while (sigtimedwait(&block, NULL, &zero) > 0) {}
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    settle_unsent(ws);
    for (int k = 0; k < ws->nslots; k++)
        if (ws->s[k].p.pid >= 0) idle_give(&ws->s[k].p); /* it answered all it was sent */
    slots_give(ws->nslots);
    workers_free(ws);
}
