/* env.c - reading the environment while other threads may change it.
 *
 * getenv walks the environ array, and setenv/putenv may move that array
 * (realloc) when they add a name.  libgccjit's embedded gcc driver calls
 * putenv during every compile to a shared object, and Ember compiles in
 * background threads (async compile, lazy mode) while other threads read
 * EMBER_* settings or copy environ for a worker process: ThreadSanitizer
 * reported exactly that race.  One process-wide read-write lock orders
 * them: Ember's own reads copy the value under the read lock, and calls
 * into a library that changes the environment hold the write lock.  A
 * program's own getenv/setenv calls are outside this lock (docs/env.md). */
#include "eager.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* A lock, not state: it guards the process's one environment. */
static pthread_rwlock_t env_lock = PTHREAD_RWLOCK_INITIALIZER;

void em_env_lock(bool write) {
    if (write)
        pthread_rwlock_wrlock(&env_lock);
    else
        pthread_rwlock_rdlock(&env_lock);
}

void em_env_unlock(void) { pthread_rwlock_unlock(&env_lock); }

const char *em_getenv(const char *name, char *buf, size_t n) {
    if (!name || !buf || n == 0) return NULL;
    em_env_lock(false);
    const char *v = getenv(name);
    size_t len = v ? strlen(v) : 0;
    bool fits = v && len < n;
    if (fits) memcpy(buf, v, len + 1);
    em_env_unlock();
    return fits ? buf : NULL;
}
