/* worker.c - ember-jit-worker: compiles one kernel to a shared object in
 * its own process (several, one after the other).
 *
 * libgccjit serializes compiles within a process (a global lock), so the
 * cpu backend compiles a graph's kernels in parallel by handing them to
 * these workers (worker_pool.c).  Protocol (from the same build of Ember):
 * on stdin, records written by jit_worker_write (a kernel in binary kir,
 * then its output path), until end of input; on stdout, one '+' after
 * each shared object written.  Exit status 0 when every shared object is
 * written; otherwise the first error on stderr. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "cpu_gccjit.h"
#include "worker.h"

/* Dies with the process that spawned us (EMBER_JIT_PARENT): a worker must
 * not outlive a program that exited or was killed mid-compile. */
static void die_with_parent(void) {
    const char *p = getenv("EMBER_JIT_PARENT");
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (p && atoi(p) != (int)getppid()) exit(3); /* it died before the prctl */
}

static bool answer(void) {
    for (;;) {
        ssize_t r = write(1, "+", 1);
        if (r == 1) return true;
        if (r < 0 && errno == EINTR) continue;
        return false;
    }
}

int main(void) {
    die_with_parent();
    /* the compiler's own children (as, collect2) must not hold our answer
     * pipe open after we exit */
    fcntl(1, F_SETFD, FD_CLOEXEC);
    char path[4096];
    int c;
    while ((c = getc(stdin)) != EOF) {
        ungetc(c, stdin);
        k_kernel *k = jit_worker_read(stdin, path, sizeof path);
        if (!k) {
            fprintf(stderr, "ember-jit-worker: %s\n", em_last_error());
            return 2;
        }
        em_status s = jit_cpu_write_so(k, path);
        kir_free(k);
        if (s != EM_OK) {
            fprintf(stderr, "ember-jit-worker: %s\n", em_last_error());
            return 1;
        }
        if (!answer()) return 1;
    }
    /* no destructors: the libraries' (OpenBLAS's joins its threads) have
     * nothing to save, and one can hang under a memory limit */
    fflush(stderr);
    _exit(0);
}
