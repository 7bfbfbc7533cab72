/* compile_queue.c - the process's background compile queue
 * (compile_queue.h says what it offers).
 *
 * Why global: a queue per compiled function or per lazy thread is what
 * made 40 new graphs start 42 threads, each with its own worker processes
 * (a mixed program reached 68 threads, ran 55-105x slower than eager, and
 * exited with ~40 workers still compiling).  Bounding threads and workers
 * to the cores is a property of the process, so this queue is the one
 * piece of mutable process-wide state besides the worker slots
 * (worker_pool.c).  Its threads start on demand, never more than the
 * cores, and stay (idle, asleep) until the process exits. */
#include "compile_queue.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eager.h"
#include "engine.h"
#include "worker.h"

#define MAX_THREADS 16

struct jit_job {
    struct jit_job *next;  /* in the queue, queued and running alike */
    kc_key key;
    bool has_key;
    jit_job_fn fn;
    void *ctx;
    bool running;
    bool done;             /* ran or was cancelled (waited-for jobs only) */
    bool waited;           /* jit_queue_wait frees it, not the queue */
    const em_allocator *alloc; /* the submitter's, which frees it */
};

static struct {
    pthread_mutex_t m;
    pthread_cond_t work;   /* a job was queued, or exiting */
    pthread_cond_t done;   /* a job finished */
    jit_job *head, *tail;
    int threads, idle, running;
    pid_t owner;           /* the process whose threads these are */
    bool shutdown;
    bool registered;       /* atexit and atfork handlers are installed */
} q = {.m = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER,
       .done = PTHREAD_COND_INITIALIZER};

/* Whether this thread is one of the queue's.  libgccjit never runs in
 * process on such a thread: exit runs libgccjit's exit-time destructors
 * (registered at its first compile, so before the queue's own exit
 * handler) while the thread may be inside a compile; seen as
 * use-after-free and SIGSEGV at exit.  The compile workers run it. */
bool jit_queue_on_queue_thread(void) { return jit_on_background_thread(); }

static int max_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
}

/* Whether a job with j's key is running (identical work waits for it). */
static bool twin_running(const jit_job *j) {
    for (const jit_job *o = q.head; j->has_key && o; o = o->next)
        if (o != j && o->running && o->has_key && kc_key_equal(&o->key, &j->key)) return true;
    return false;
}

/* The first queued job that may start now (under q.m), or NULL. */
static jit_job *next_job(void) {
    for (jit_job *j = q.head; j; j = j->next)
        if (!j->running && (q.shutdown || !twin_running(j))) return j;
    return NULL;
}

static void unlink_job(jit_job *j) {
    jit_job **p = &q.head, *prev = NULL;
    while (*p != j) prev = *p, p = &(*p)->next;
    *p = j->next;
    if (q.tail == j) q.tail = prev;
}

/* Runs j unlocked, then retires it (called and returns with q.m held). */
static void run_job(jit_job *j) {
    bool run = !q.shutdown;
    j->running = true;
    q.running++;
    pthread_mutex_unlock(&q.m);
    j->fn(j->ctx, run);
    pthread_mutex_lock(&q.m);
    q.running--;
    unlink_job(j);
    if (j->waited) j->done = true;
    else em_free_with(j->alloc, j);
    pthread_cond_broadcast(&q.done);
    pthread_cond_broadcast(&q.work); /* a twin may start now */
}

static void *queue_thread(void *arg) {
    (void)arg;
    jit_set_background_thread();
    pthread_mutex_lock(&q.m);
    for (;;) {
        jit_job *j = next_job();
        if (j) {
            run_job(j);
            continue;
        }
        if (q.shutdown && !q.head) break;
        q.idle++;
        pthread_cond_wait(&q.work, &q.m);
        q.idle--;
    }
    q.threads--;
    pthread_cond_broadcast(&q.done);
    pthread_mutex_unlock(&q.m);
    return NULL;
}

/* A new thread when none is idle and the bound allows (under q.m); false
 * when the queue has no thread at all. */
static bool ensure_thread(void) {
    if (q.idle > 0 || q.threads >= max_threads()) return q.threads > 0;
    pthread_attr_t attr;
    pthread_t t;
    if (pthread_attr_init(&attr) != 0) return q.threads > 0;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* thread creation fails under memory limits: the queue then runs on
     * the threads it has, or the caller compiles itself */
    if (pthread_create(&t, &attr, queue_thread, NULL) == 0) q.threads++;
    pthread_attr_destroy(&attr);
    return q.threads > 0;
}

/* At exit: cancel what has not started, kill the workers (so what runs
 * ends soon: its kernels fail and its graph runs op by op, which nobody
 * will call again; nothing new compiles in process either), and wait for
 * the running jobs.  Without a deadline: exit goes on to run the other
 * atexit handlers and the libraries' destructors (libgccjit's, the worker
 * pool's removal of the temporary directory), and a job still running
 * then crashed the program (SIGSEGV under load).  What a job still does
 * is bounded: fusion and lowering, or a kernel libgccjit compiles in
 * process when no worker could run. */
static void queue_exit(void) {
    pthread_mutex_lock(&q.m);
    bool mine = q.owner == getpid();
    if (mine) {
        q.shutdown = true;
        pthread_cond_broadcast(&q.work);
    }
    pthread_mutex_unlock(&q.m);
    if (!mine) return;
    jit_workers_shutdown();
    pthread_mutex_lock(&q.m);
    while (q.head && q.threads > 0) pthread_cond_wait(&q.done, &q.m);
    pthread_mutex_unlock(&q.m);
}

/* fork: the child has none of the queue's threads.  Jobs that were
 * running in the parent are dropped (their waiters are told they are
 * done: their entries stay op by op), queued ones wait for a new thread. */
static void before_fork(void) { pthread_mutex_lock(&q.m); }
static void after_fork_parent(void) { pthread_mutex_unlock(&q.m); }
static void after_fork_child(void) {
    q.owner = getpid();
    q.threads = q.idle = q.running = 0;
    for (jit_job *j = q.head, *next; j; j = next) {
        next = j->next;
        if (!j->running) continue;
        unlink_job(j);
        if (j->waited) j->done = true; /* else it leaks: its thread is gone */
    }
    pthread_mutex_unlock(&q.m);
}

static void register_handlers(void) {
    if (q.registered) return;
    q.registered = true;
    q.owner = getpid();
    atexit(queue_exit);
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

bool jit_queue_submit(const kc_key *key, jit_job_fn fn, void *ctx, jit_job **wait) {
    if (wait) *wait = NULL;
    /* without a worker, kernels would compile in process on a queue
     * thread, which is not safe at exit (on_queue_thread): the caller
     * compiles in its own thread instead */
    if (!jit_workers_available()) return false;
    jit_job *j = em_calloc(1, sizeof *j);
    if (!j) {
        em_clear_error();
        return false;
    }
    *j = (jit_job){.fn = fn, .ctx = ctx, .waited = wait != NULL, .alloc = em_get_allocator()};
    if (key) j->key = *key, j->has_key = true;
    pthread_mutex_lock(&q.m);
    register_handlers();
    bool ok = !q.shutdown && ensure_thread();
    if (ok) {
        if (q.tail) q.tail->next = j;
        else q.head = j;
        q.tail = j;
        pthread_cond_signal(&q.work);
    }
    pthread_mutex_unlock(&q.m);
    if (!ok) {
        em_free(j);
        return false;
    }
    if (wait) *wait = j;
    return true;
}

void jit_queue_wait(jit_job *j) {
    if (!j) return;
    pthread_mutex_lock(&q.m);
    /* no thread to run it (a forked child inherits queued jobs, not
     * threads; or none can start): run it here rather than wait forever */
    if (!ensure_thread() && !j->running && !j->done) run_job(j);
    while (!j->done) pthread_cond_wait(&q.done, &q.m);
    pthread_mutex_unlock(&q.m);
    em_free_with(j->alloc, j);
}

int jit_queue_threads(void) {
    pthread_mutex_lock(&q.m);
    int n = q.threads;
    pthread_mutex_unlock(&q.m);
    return n;
}
