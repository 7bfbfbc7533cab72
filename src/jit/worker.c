/* worker.c - ember-jit-worker: compiles one kernel to a shared object in
 * its own process (several, one after the other).
 *
 * libgccjit serializes compiles within a process (a global lock), so the
 * cpu backend compiles a graph's kernels in parallel by handing all but
 * share to these workers.  Protocol (stdin, from the same build of Ember):
 * records written by jit_worker_write (a kernel in binary kir, then its
 * output path), until end of input.  Exit status 0 when every shared
 * object is written; otherwise the first error on stderr. */
#include <stdio.h>
#include <stdlib.h>

#include "cpu_gccjit.h"
#include "worker.h"

int main(void) {
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
    }
    return 0;
}
