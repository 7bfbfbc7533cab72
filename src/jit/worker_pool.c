/* worker_pool.c - running ember-jit-worker processes.
 *
 * A worker is spawned with posix_spawn (never fork: the parent may have
 * threads holding locks, libgccjit's among them), fed its kernel on a pipe
 * and waited for.  Where the program lives: EMBER_JIT_WORKER, else the
 * installed one (EMBER_WORKER_PATH, set by the build). */
#include "worker.h"

#include <stdio.h>

#include "cpu_gccjit.h"

#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>


extern char **environ;

#define MAGIC "EMKIR01"

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

k_kernel *jit_worker_read(FILE *f, char *path, size_t pathlen) {
    char magic[8];
    uint32_t hdr[5], plen;
    char name[256];
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, MAGIC, 8) || fread(hdr, sizeof hdr, 1, f) != 1 ||
        hdr[0] != sizeof(k_inst) || hdr[1] >= sizeof name || hdr[2] > (1u << 24) ||
        fread(name, 1, hdr[1], f) != hdr[1]) {
        em_error(EM_ERR_ARG, "malformed kernel on the worker's input");
        return NULL;
    }
    name[hdr[1]] = '\0';
    k_kernel *k = kir_new(name);
    if (!k) return NULL;
    k->insts = em_malloc(sizeof(k_inst) * (hdr[2] ? hdr[2] : 1));
    if (!k->insts || fread(k->insts, sizeof(k_inst), hdr[2], f) != hdr[2] ||
        fread(&plen, sizeof plen, 1, f) != 1 || plen >= pathlen || fread(path, 1, plen, f) != plen) {
        kir_free(k);
        em_error(EM_ERR_ARG, "malformed kernel on the worker's input");
        return NULL;
    }
    path[plen] = '\0';
    k->n = k->cap = (int)hdr[2];
    k->nbufs = (int)hdr[3];
    k->nsizes = (int)hdr[4];
    /* the generator verifies the IR before it trusts it */
    return k;
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

/* Starts a worker compiling items first, first + step, ... < n; its pid,
 * or -1. */
static pid_t spawn(const char *prog, k_kernel *const *ks, const char *const *paths, int n,
                   int first, int step) {
    int fds[2];
    /* close-on-exec: a worker spawned meanwhile by another thread (async
     * compiles) must not inherit this pipe, or this worker would wait for
     * that one's exit to see the end of its input (and it for this one's) */
    if (pipe2(fds, O_CLOEXEC) != 0) return -1;
    if (fds[0] == 0) fcntl(0, F_SETFD, 0); /* stdin was closed: dup2 to itself keeps the flag */
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[0], 0);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    pid_t pid;
    char *argv[] = {(char *)prog, NULL};
    /* the worker generates for this process's CPU level, not its own */
    char march[64];
    snprintf(march, sizeof march, "EMBER_JIT_MARCH=%s", jit_cpu_march());
    em_env_lock(false); /* environ must not move while it is copied (env.c) */
    int nenv = 0;
    while (environ[nenv]) nenv++;
    char **env = em_malloc(sizeof(char *) * (size_t)(nenv + 2));
    if (!env) {
        em_env_unlock();
        posix_spawn_file_actions_destroy(&fa);
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    int k = 0;
    for (int i = 0; i < nenv; i++)
        if (strncmp(environ[i], "EMBER_JIT_MARCH=", 16)) env[k++] = environ[i];
    env[k++] = march;
    env[k] = NULL;
    int rc = posix_spawn(&pid, prog, &fa, NULL, argv, env);
    em_env_unlock();
    em_free(env);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[0]);
    if (rc != 0) {
        close(fds[1]);
        return -1;
    }
    /* a worker that dies early must not kill us with SIGPIPE: write with
     * the signal blocked for this thread, and drop a pending one */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    FILE *f = fdopen(fds[1], "w");
    bool ok = f != NULL;
    for (int i = first; ok && i < n; i += step) ok = jit_worker_write(f, ks[i], paths[i]);
    if (f) fclose(f);
    else close(fds[1]);
    struct timespec zero = {0, 0};
    while (sigtimedwait(&block, NULL, &zero) > 0) {}
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!ok) {
        int st;
        waitpid(pid, &st, 0);
        return -1;
    }
    return pid;
}

struct jit_workers {
    int n, nworkers;
    pid_t *pids;
};

jit_workers *jit_workers_start(k_kernel *const *kernels, const char *const *paths, int n,
                               int nworkers) {
    char buf[EM_ENV_MAX];
    const char *prog = worker_program(buf, sizeof buf);
    if (!prog || n <= 0 || nworkers <= 0) return NULL;
    if (nworkers > n) nworkers = n;
    jit_workers *w = em_calloc(1, sizeof *w);
    if (!w) return NULL;
    w->pids = em_calloc((size_t)nworkers, sizeof *w->pids);
    if (!w->pids) {
        em_free(w);
        return NULL;
    }
    w->n = n;
    w->nworkers = nworkers;
    /* worker k compiles items k, k + nworkers, ...: one process each, so
     * that libgccjit and the process start are paid once per worker */
    for (int k = 0; k < nworkers; k++) w->pids[k] = spawn(prog, kernels, paths, n, k, nworkers);
    return w;
}

void jit_workers_finish(jit_workers *w, bool *ok) {
    /* wait for our own children only: a waitpid(-1) could reap a process
     * of the program that hosts us */
    for (int k = 0; k < w->nworkers; k++) {
        bool good = false;
        if (w->pids[k] > 0) {
            int st = 0;
            pid_t r;
            while ((r = waitpid(w->pids[k], &st, 0)) < 0 && errno == EINTR) {}
            good = r > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
        }
        for (int i = k; i < w->n; i += w->nworkers) ok[i] = good;
    }
    em_free(w->pids);
    em_free(w);
}
