/* compile_queue.h - the process's background compile queue
 * (compile_queue.c), used by em_compile's and lazy mode's async compiles.
 *
 * One bounded pool of threads (at most one per core) takes jobs in order;
 * their kernels compile in the process's shared worker processes
 * (worker_pool.c, also at most one per core).  Jobs with the same key
 * (the same graph) never run at once: the later one runs after the first
 * and finds its kernels in the cache instead of compiling them again.  At
 * exit, jobs not started are cancelled, the workers are killed and the
 * temporary files removed. */
#ifndef EMBER_COMPILE_QUEUE_H
#define EMBER_COMPILE_QUEUE_H

#include <stdbool.h>

#include "cache.h"

/* A job: run true, do the work; false, the process is exiting and the job
 * is cancelled: release what ctx holds (and tell whoever waits for the
 * result that none comes).  Called once, on a queue thread. */
typedef void (*jit_job_fn)(void *ctx, bool run);

typedef struct jit_job jit_job;

/* Queues fn(ctx) under key (NULL: no deduplication).  With wait non-NULL,
 * *wait gets a handle for jit_queue_wait (which the caller must call);
 * else the job frees itself when done.  false (nothing queued, fn not
 * called) when it cannot be queued: no memory, no thread could be
 * started, no compile worker can run (jit_workers_available), or the
 * process is exiting: the caller then compiles in its own thread. */
bool jit_queue_submit(const kc_key *key, jit_job_fn fn, void *ctx, jit_job **wait);
/* Waits until job j has run (or was cancelled) and frees the handle. */
void jit_queue_wait(jit_job *j);

/* Whether the calling thread is one of the queue's (which never run
 * libgccjit in process: see compile_queue.c). */
bool jit_queue_on_queue_thread(void);

/* For tests: the queue's threads now (started, not yet exited). */
int jit_queue_threads(void);

#endif
