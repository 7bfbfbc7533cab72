/* worker.h - compiling kernels in worker processes (worker_pool.c), and
 * the kernel serialization they read (the ember-jit-worker program). */
#ifndef EMBER_WORKER_H
#define EMBER_WORKER_H

#include <stdio.h>

#include "cpu_gccjit.h"
#include "kir.h"

/* The bounds of a compile unit the pool forms: kernels, and estimated
 * compile cost (worker_pool.c's units: ~1.5 ms of libgccjit each). */
#define JIT_UNIT_KERNELS 4
#define JIT_UNIT_COST 400

/* A worker's record: a compile unit (jit_cpu_write_unit) of n kernels,
 * each with the path its shared object goes to (the worker writes the
 * unit's object to paths[0] and copies it to the others). */
typedef struct jit_worker_unit {
    int n;
    k_kernel **ks;
    char **paths;
} jit_worker_unit;
/* Writes the record of ks[0..n) and paths[0..n) (1 <= n <= JIT_CPU_UNIT_MAX). */
bool jit_worker_write(FILE *f, k_kernel *const *ks, const char *const *paths, int n);
/* Reads what jit_worker_write wrote into *u (the caller frees it with
 * jit_worker_unit_free); false (error set, *u empty) on anything else. */
bool jit_worker_read(FILE *f, jit_worker_unit *u);
void jit_worker_unit_free(jit_worker_unit *u);

/* Compiles kernels[i] into shared objects at paths[i] in up to nworkers
 * worker processes (one per core at most in the whole process: the
 * threads that compile share them), kept alive between compiles
 * (worker_pool.c): idle ones are reused, new ones started only when none
 * is idle.  The kernels are grouped into compile units balanced by
 * estimated cost (at least one per worker, at most JIT_UNIT_KERNELS
 * kernels and about JIT_UNIT_COST of cost each); each worker is fed one
 * unit at a time, the costliest first, and a unit the compiler rejects is
 * sent again kernel by kernel, so that one bad kernel fails alone.  start
 * returns NULL when no worker can run (EMBER_JIT_WORKER=0, no worker
 * program, no memory, exiting): the caller then compiles everything
 * itself, unless the process is exiting (jit_workers_exiting).  finish
 * waits for the answers, each unit at most EMBER_COMPILE_TIMEOUT seconds
 * (default 120) a kernel from when it was sent, and says per item: */
typedef enum jit_worker_result {
    JIT_WORKER_DONE,   /* the shared object is at its path */
    JIT_WORKER_RETRY,  /* not written (no worker started, or the compiler
                          reported an error): compile it in process */
    JIT_WORKER_FAILED  /* its worker hung, crashed or answered garbage
                          (logged): compiling it in process could do the
                          same to the program, so run its group op by op */
} jit_worker_result;
struct jit_log;
typedef struct jit_workers jit_workers;
jit_workers *jit_workers_start(k_kernel *const *kernels, const char *const *paths, int n,
                               int nworkers, const struct jit_log *log);
void jit_workers_finish(jit_workers *w, jit_worker_result *res);

/* A new empty file for a compiler's output (the caller unlinks it), in
 * the process's private temporary directory; false when none can be made
 * (or the process is exiting). */
bool jit_worker_temp_path(char *buf, size_t n);
/* Kills the workers (idle and busy) and removes the private directory;
 * later compiles run without workers.  Registered with atexit; idempotent. */
void jit_workers_shutdown(void);
/* Whether this process is exiting (jit_workers_shutdown ran in it): then
 * nothing compiles, in a worker or in process, and graphs run op by op. */
bool jit_workers_exiting(void);
/* Whether a compile worker program can be run (EMBER_JIT_WORKER, the
 * installed one, the build tree's). */
bool jit_workers_available(void);

/* For tests and benchmarks: the workers this process started so far, and
 * how many are idle now (either may be NULL). */
void jit_workers_count(long *started, int *idle);
/* The pids of the idle workers, at most max of them; how many. */
int jit_workers_idle_pids(int *pids, int max);

#endif
