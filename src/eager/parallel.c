/* parallel.c - splitting CPU work over threads.
 *
 * OpenMP's runtime is the thread pool: it keeps its threads between
 * regions, so a parallel loop costs a few microseconds, and it is absent
 * (everything runs serially) when the compiler has no OpenMP. */
#include "eager.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static int num_threads;
static pthread_once_t threads_once = PTHREAD_ONCE_INIT;

/* EMBER_NUM_THREADS is read once: the thread count is configuration fixed
 * at start-up, not state that changes under running kernels. */
static void read_num_threads(void) {
    long n = 0;
    const char *e = getenv("EMBER_NUM_THREADS");
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

void em_parallel_for(int64_t n, int64_t grain, em_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int64_t chunks = (n + grain - 1) / grain;
    int nt = em_num_threads();
    if (nt > chunks) nt = (int)chunks;
#ifdef _OPENMP
    if (nt > 1 && !omp_in_parallel()) {
        /* One contiguous range per thread: each chunk is a block of memory,
         * and the split depends only on n and the thread count. */
#pragma omp parallel num_threads(nt)
        {
            int t = omp_get_thread_num(), k = omp_get_num_threads();
            int64_t lo = n * t / k, hi = n * (t + 1) / k;
            if (lo < hi) fn(ctx, lo, hi);
        }
        return;
    }
#endif
    fn(ctx, 0, n);
}
