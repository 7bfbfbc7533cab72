/* parallel.c - the runtime's thread pool: splitting CPU work over threads.
 *
 * Not OpenMP: libgomp's idle workers spin for milliseconds after each
 * parallel region, and on a small machine that spinning stole the cores
 * OpenBLAS's own threads needed (a 256x512x2048 matmul ran 2.5x slower
 * right after a pointwise op).  Here idle workers poll for 100 us, then
 * sleep on a condition variable.
 *
 * The pool is created on first use with EMBER_NUM_THREADS - 1 workers (the
 * caller is the last one) and lives until the process exits.  One job runs
 * at a time: a call made while another thread's job runs, or from inside a
 * job, runs serially on its own thread. */
#include "eager.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int num_threads;
static pthread_once_t threads_once = PTHREAD_ONCE_INIT;

/* EMBER_NUM_THREADS is read once: the thread count is configuration fixed
 * at start-up, not state that changes under running kernels. */
static void read_num_threads(void) {
    long n = 0;
    char buf[32];
    const char *e = em_getenv("EMBER_NUM_THREADS", buf, sizeof buf);
    if (e && *e) {
        char *end;
        n = strtol(e, &end, 10);
        if (*end || n < 1 || n > 1024) n = 0;
    }
    if (n == 0) n = sysconf(_SC_NPROCESSORS_ONLN);
    num_threads = n > 0 ? (int)n : 1;
}

int em_num_threads(void) {
    pthread_once(&threads_once, read_num_threads);
    return num_threads;
}

/* ---- the pool ---- */

/* How long an idle worker polls for the next job before it sleeps, and a
 * submitter for its workers' chunks before it waits on a condition.  A
 * sleeping worker costs the next job a futex wake and a context switch,
 * 10-20 us on the 2-core VM: with 20,000 polls (a few tens of us) the
 * compiled MiniLM encoder of the README's demo switched context 54 times
 * a call and took 5.1 ms; polling for 100 us took it to 3.0 ms and the
 * GPT-2 block at 128 tokens from 1.42 to 1.10 ms.  A core polls at most
 * this long after each job, then sleeps until the next. */
#ifndef SPIN_NS
#define SPIN_NS 100000
#endif

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One poll of a spin loop; true once the loop has polled for SPIN_NS (the
 * clock is read every 64 polls; *deadline starts at 0). */
static bool spun_out(int poll, int64_t *deadline) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause(); /* lets a sibling hyperthread run meanwhile */
#endif
    if (poll % 64) return false;
    int64_t t = mono_ns();
    if (*deadline == 0) *deadline = t + SPIN_NS;
    return t > *deadline;
}

/* The current job's claim word: generation (high 32 bits), next chunk
 * (16 bits) and chunk count (low 16 bits).  A thread claims a chunk with
 * one compare-and-swap that also checks the job is the one it joined: a
 * worker that wakes late, or loops once more after the last chunk, can
 * never take a chunk of the next job while its submitter is still
 * writing fn, ctx and n. */
#define TICKET(gen, next, nchunks) ((uint64_t)(gen) << 32 | (uint64_t)(next) << 16 | (uint64_t)(nchunks))
#define TICKET_GEN(t) ((uint32_t)((t) >> 32))
#define TICKET_NEXT(t) ((int)((t) >> 16 & 0xffff))
#define TICKET_CHUNKS(t) ((int)((t) & 0xffff))
#define MAX_CHUNKS 0xffff

typedef struct pool {
    int nworkers;
    pthread_mutex_t job_lock;  /* held by the thread whose job runs */
    pthread_mutex_t m;
    pthread_cond_t wake;       /* a new job (the ticket's generation changed) */
    pthread_cond_t done;       /* the last chunk finished */
    atomic_uint_fast64_t ticket;
    /* the current job: written before its ticket is published, read only
     * by a thread holding one of its chunks (the submitter waits for all
     * chunks before it writes the next job) */
    em_range_fn fn;
    void *ctx;
    int64_t n;
    atomic_int remaining;      /* chunks not finished */
} pool;

static pool the_pool;
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static bool pool_ok;
static _Thread_local bool in_job; /* this thread runs a chunk: nested calls are serial */

/* Claims the next chunk of job gen; -1 when it has none left (or another
 * job is current). */
static int claim(pool *p, uint32_t gen, int *nchunks) {
    uint64_t t = atomic_load(&p->ticket);
    for (;;) {
        if (TICKET_GEN(t) != gen || TICKET_NEXT(t) >= TICKET_CHUNKS(t)) return -1;
        if (atomic_compare_exchange_weak(&p->ticket, &t, t + ((uint64_t)1 << 16))) {
            *nchunks = TICKET_CHUNKS(t);
            return TICKET_NEXT(t);
        }
    }
}

/* Takes and runs chunks of job gen until none are left. */
static void run_chunks(pool *p, uint32_t gen) {
    in_job = true;
    int c, nchunks;
    while ((c = claim(p, gen, &nchunks)) >= 0) {
        int64_t lo = p->n * c / nchunks, hi = p->n * (c + 1) / nchunks;
        if (lo < hi) p->fn(p->ctx, lo, hi);
        if (atomic_fetch_sub(&p->remaining, 1) == 1) {
            pthread_mutex_lock(&p->m);
            pthread_cond_broadcast(&p->done);
            pthread_mutex_unlock(&p->m);
        }
    }
    in_job = false;
}

static void *worker(void *arg) {
    pool *p = arg;
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        int64_t deadline = 0;
        for (int i = 0; (g = TICKET_GEN(atomic_load(&p->ticket))) == seen && !spun_out(i, &deadline); i++) {
        }
        if (g == seen) {
            pthread_mutex_lock(&p->m);
            while ((g = TICKET_GEN(atomic_load(&p->ticket))) == seen) pthread_cond_wait(&p->wake, &p->m);
            pthread_mutex_unlock(&p->m);
        }
        seen = g;
        run_chunks(p, g);
    }
    return NULL;
}

static void pool_start(void) {
    pool *p = &the_pool;
    p->nworkers = em_num_threads() - 1;
    if (pthread_mutex_init(&p->job_lock, NULL) || pthread_mutex_init(&p->m, NULL) ||
        pthread_cond_init(&p->wake, NULL) || pthread_cond_init(&p->done, NULL))
        return;
    atomic_init(&p->ticket, TICKET(0, 0, 0));
    atomic_init(&p->remaining, 0);
    int started = 0;
    for (int i = 0; i < p->nworkers; i++) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, worker, p) == 0) started++;
        pthread_attr_destroy(&attr);
    }
    p->nworkers = started;
    pool_ok = true;
}

void em_parallel_for(int64_t n, int64_t grain, em_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int64_t chunks = (n + grain - 1) / grain;
    int nt = em_num_threads();
    if (nt > chunks) nt = (int)chunks;
    if (nt <= 1 || in_job) {
        fn(ctx, 0, n);
        return;
    }
    pthread_once(&pool_once, pool_start);
    pool *p = &the_pool;
    if (!pool_ok || p->nworkers == 0 || pthread_mutex_trylock(&p->job_lock) != 0) {
        fn(ctx, 0, n); /* no pool, or another thread's job is running */
        return;
    }
    /* One contiguous range per thread: each chunk is a block of memory, and
     * the split depends only on n and the thread count. */
    if (nt > MAX_CHUNKS) nt = MAX_CHUNKS;
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    atomic_store(&p->remaining, nt);
    uint32_t gen = TICKET_GEN(atomic_load(&p->ticket)) + 1;
    pthread_mutex_lock(&p->m);
    atomic_store(&p->ticket, TICKET(gen, 0, nt)); /* publishes the job */
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->m);
    run_chunks(p, gen);
    int64_t deadline = 0;
    for (int i = 0; atomic_load(&p->remaining) > 0 && !spun_out(i, &deadline); i++) {
    }
    if (atomic_load(&p->remaining) > 0) {
        pthread_mutex_lock(&p->m);
        while (atomic_load(&p->remaining) > 0) pthread_cond_wait(&p->done, &p->m);
        pthread_mutex_unlock(&p->m);
    }
    pthread_mutex_unlock(&p->job_lock);
}
