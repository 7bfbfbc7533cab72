/* worker.h - compiling kernels in worker processes (worker_pool.c), and
 * the kernel serialization they read (the ember-jit-worker program). */
#ifndef EMBER_WORKER_H
#define EMBER_WORKER_H

#include <stdio.h>

#include "kir.h"

/* Writes k and the output path for a worker. */
bool jit_worker_write(FILE *f, const k_kernel *k, const char *path);
/* Reads what jit_worker_write wrote; NULL (error set) on anything else. */
k_kernel *jit_worker_read(FILE *f, char *path, size_t pathlen);

/* Compiles kernels[i] into shared objects at paths[i] in nworkers worker
 * processes, which share the items round robin (the caller compiles its
 * own share meanwhile).  start returns NULL when no worker can run
 * (EMBER_JIT_WORKER=0, or no worker program): the caller then compiles
 * everything itself.  finish waits for them; ok[i] tells which items were
 * written. */
typedef struct jit_workers jit_workers;
jit_workers *jit_workers_start(k_kernel *const *kernels, const char *const *paths, int n,
                               int nworkers);
void jit_workers_finish(jit_workers *w, bool *ok);

#endif
